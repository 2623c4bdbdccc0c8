//! The machine every phyfarm guest is: QEMU's command line with the slots
//! the farm fills per guest, the firmware, the kernel command line every
//! guest starts with, and the confinement of a guest running an untrusted
//! kernel (`-sandbox`, and as root the drop to `phyfarm-qemu`), spelled for
//! the installed QEMU. `phyfarm boot` boots it (`guest/boot.rs`); `phyfarm
//! guest machine` and the guest plan hand it to the farm.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::guest::accel::{self, Accel};
use crate::progress;

/// The user QEMU drops to when phyfarm runs as root (created by
/// containers/host-setup.sh; `PHYFARM_QEMU_USER` overrides it).
pub const QEMU_USER: &str = "phyfarm-qemu";

/// QEMU's seccomp sandbox: no obsolete system calls, no spawning, no
/// scheduler or resource changes. set*id stays allowed only when QEMU must
/// drop root itself (`-runas`): after the drop it has no capabilities and
/// no_new_privs, so it cannot climb back.
pub fn sandbox_option(drops_root: bool) -> String {
    format!(
        "on,obsolete=deny,elevateprivileges={},spawn=deny,resourcecontrol=deny",
        if drops_root { "allow" } else { "deny" }
    )
}

/// The user QEMU drops to: its name and ids.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QemuUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// The user QEMU should run as: Some(user) when phyfarm is root and the
/// user exists; None when phyfarm is not root (QEMU already unprivileged)
/// or, with a warning, when the user is missing. Looked up once per process.
pub fn qemu_user() -> Option<QemuUser> {
    static USER: std::sync::OnceLock<Option<QemuUser>> = std::sync::OnceLock::new();
    USER.get_or_init(lookup_qemu_user).clone()
}

fn lookup_qemu_user() -> Option<QemuUser> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let user = std::env::var("PHYFARM_QEMU_USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| QEMU_USER.to_string());
    let c = std::ffi::CString::new(user.clone()).ok()?;
    // SAFETY: c is NUL-terminated; getpwnam returns a static record or NULL,
    // read at once before any other passwd call.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        progress::warn(&format!(
            "user {user} does not exist: QEMU runs the kernel as root (run containers/host-setup.sh)"
        ));
        return None;
    }
    // SAFETY: pw is a valid passwd record (checked non-null above).
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Some(QemuUser {
        name: user,
        uid,
        gid,
    })
}

/// The name of the user QEMU should run as (see [`qemu_user`]).
pub fn qemu_runas() -> Option<String> {
    qemu_user().map(|u| u.name)
}

/// `-sandbox` and, as root, the drop to `runas` for a guest running an
/// untrusted kernel: `-runas USER` before QEMU 9.1, `-run-with user=USER`
/// from 9.1 on (where `-runas` is deprecated).
pub fn confinement_args(runas: Option<&str>, version: QemuVersion) -> Vec<String> {
    let mut v = vec!["-sandbox".to_string(), sandbox_option(runas.is_some())];
    if let Some(u) = runas {
        if version >= QemuVersion(9, 1) {
            v.extend(["-run-with".to_string(), format!("user={u}")]);
        } else {
            v.extend(["-runas".to_string(), u.to_string()]);
        }
    }
    v
}

/// QEMU's version, major and minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct QemuVersion(pub u32, pub u32);

impl QemuVersion {
    /// From `qemu-system-x86_64 --version`'s first line ("QEMU emulator
    /// version 7.2.19 (Debian …)").
    pub fn parse(text: &str) -> Option<QemuVersion> {
        let rest = text.split("version ").nth(1)?;
        let mut it = rest.split(|c: char| !c.is_ascii_digit());
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        Some(QemuVersion(major, minor))
    }

    /// The installed QEMU's; 0.0 when it cannot be run (the boot itself then
    /// says why).
    pub fn installed() -> QemuVersion {
        QemuVersion::parse(&qemu_version()).unwrap_or(QemuVersion(0, 0))
    }

    /// How a `-chardev socket` client asks to reconnect: QEMU before 9.2
    /// spells it `reconnect=SECS`.
    pub fn chardev_reconnect(self) -> &'static str {
        if self >= QemuVersion(9, 2) {
            "reconnect-ms=1000"
        } else {
            "reconnect=1"
        }
    }
}

/// Guest memory, for `phyfarm boot`, its KVM probe and the farm's guests.
pub const DEFAULT_MEMORY_MB: u32 = 256;

/// The slots of [`machine_argv`] that `phyfarm guest machine` leaves for the
/// farm to fill per guest.
pub const MACHINE_SLOTS: [&str; 5] = ["{kernel}", "{initrd}", "{memory}", "{append}", "{console}"];

/// [`machine_argv`] with its [`MACHINE_SLOTS`] left unfilled.
pub fn machine_template(accel: Accel) -> Vec<String> {
    let [kernel, initrd, memory, append, console] = MACHINE_SLOTS;
    machine_argv(kernel, initrd, accel, memory, append, console)
}

/// The slots the roles' [`device_templates`] leave to fill: sockets and
/// addresses only the harness knows when it starts a guest.
pub const DEVICE_SLOTS: [&str; 8] = [
    "{agent_sock}",
    "{usb_path}",
    "{usb_host}",
    "{usb_port}",
    "{wire_local}",
    "{wire_remote}",
    "{model_sock}",
    "{redir_sock}",
];

/// The devices the farm's roles add to the machine, by name, each with its
/// [`DEVICE_SLOTS`] left to fill; the harness starts the ones its role
/// needs and spells none itself. The farm guest: `agent` (the virtio-serial
/// port its agent answers on), `xhci` (the USB host controller the adapter
/// hangs off), `usb_redir_unix` / `usb_redir_tcp` (the adapter over
/// usbredir, from the emulator's socket or a usbredirect on a runner),
/// `usb_net_pair` (QEMU's usb-net with a partner NIC on a hub, the
/// benchmarks' reference) and `partner_nic` (a partner NIC on the
/// emulator's datagram wire). The exporter guest: `exporter` (the model's
/// stream in, the gadget's usbredir out). The boot check's are in
/// `guest/boot.rs`.
pub fn device_templates(version: QemuVersion) -> BTreeMap<String, Vec<String>> {
    let rc = version.chardev_reconnect();
    let usb_unix = format!("socket,id=ur0,path={{usb_path}},{rc}");
    let usb_tcp = format!("socket,id=ur0,host={{usb_host}},port={{usb_port}},{rc}");
    let model = format!("socket,id=model,path={{model_sock}},{rc}");
    let groups: [(&str, &[&str]); 7] = [
        (
            "agent",
            &[
                "-device",
                "virtio-serial-pci",
                "-chardev",
                "socket,id=agent,path={agent_sock},server=on,wait=off",
                "-device",
                "virtserialport,chardev=agent,name=org.phyfarm.agent",
            ],
        ),
        ("xhci", &["-device", "qemu-xhci,id=xhci"]),
        (
            "usb_redir_unix",
            &[
                "-chardev",
                &usb_unix,
                "-device",
                "usb-redir,chardev=ur0,bus=xhci.0",
            ],
        ),
        (
            "usb_redir_tcp",
            &[
                "-chardev",
                &usb_tcp,
                "-device",
                "usb-redir,chardev=ur0,bus=xhci.0",
            ],
        ),
        (
            "usb_net_pair",
            &[
                "-netdev",
                "hubport,id=u0,hubid=0",
                "-device",
                "usb-net,netdev=u0,bus=xhci.0",
                "-netdev",
                "hubport,id=n0,hubid=0",
                "-device",
                "virtio-net-pci,netdev=n0",
            ],
        ),
        (
            "partner_nic",
            &[
                "-netdev",
                "dgram,id=n0,local.type=unix,local.path={wire_local},\
                 remote.type=unix,remote.path={wire_remote}",
                "-device",
                "virtio-net-pci,netdev=n0",
            ],
        ),
        (
            "exporter",
            &[
                "-device",
                "virtio-serial-pci",
                "-chardev",
                &model,
                "-device",
                "virtserialport,chardev=model,name=org.phyfarm.model",
                "-chardev",
                "socket,id=redir,path={redir_sock},server=on,wait=off",
                "-device",
                "virtserialport,chardev=redir,name=org.phyfarm.usbredir",
            ],
        ),
    ];
    groups
        .into_iter()
        .map(|(name, argv)| {
            (
                name.to_string(),
                argv.iter().map(|a| a.to_string()).collect(),
            )
        })
        .collect()
}

/// Where QEMU's packages put its firmware files.
const FIRMWARE_DIRS: [&str; 2] = ["/usr/share/qemu", "/usr/local/share/qemu"];

/// The firmware of every phyfarm guest: qboot (QEMU ships it as qboot.rom),
/// which loads the `-kernel` and jumps to it, where SeaBIOS, QEMU's default,
/// first initialises and scans the machine's devices (the USB adapter
/// among them) for about 0.2 s under TCG, before every check. The guest
/// kernel has no ACPI and qboot's MP table routes no PCI interrupt lines:
/// every device of the farm's machines interrupts through MSI-X instead.
/// None (SeaBIOS) when this QEMU has no qboot.rom.
pub fn firmware() -> Option<PathBuf> {
    FIRMWARE_DIRS
        .iter()
        .map(|d| Path::new(d).join("qboot.rom"))
        .find(|p| p.is_file())
}

/// The kernel command line every phyfarm guest starts with (its role adds
/// its own options after it): the console on the serial port, a panic (and
/// with `-no-reboot` QEMU's exit) on any oops, and what shortens the boot
/// the farm pays before every check:
/// - `retain_initrd`: the initramfs's pages stay after unpacking, where
///   freeing them would first overwrite (poison) the whole image, 0.15 s for
///   the farm's 26 MB under TCG;
/// - `no_timer_check`: no 10 ms test of the timer interrupt (KVM guests
///   skip it by themselves);
/// - `usbcore.old_scheme_first=1`: a new USB device gets its address before
///   its first descriptor read, one port reset (0.12 s) fewer per
///   enumeration; the adapter's drivers bind as before;
/// - under TCG, `noapictimer`: TCG has no TSC-deadline timer, so the local
///   APIC timer would be calibrated against the tick for over 100 ms; the
///   PIT keeps the tick instead.
pub fn kernel_args(accel: Accel) -> String {
    let mut v = vec![
        "console=ttyS0",
        "panic=-1",
        "oops=panic",
        "loglevel=7",
        "tsc=reliable",
        "retain_initrd",
        "no_timer_check",
        "usbcore.old_scheme_first=1",
    ];
    if accel == Accel::Tcg {
        v.push("noapictimer");
    }
    v.join(" ")
}

/// What `phyfarm guest machine --json` and `phyfarm guest plan --json` say
/// of the machine, so the farm asks instead of deciding again: the template
/// and its slots, the kernel command line to start {append} with, the
/// firmware, the confinement inside it, the user QEMU drops to (the farm
/// hands that user's group the sockets QEMU connects to), QEMU's version
/// and its spelling of a reconnecting chardev.
pub fn machine_description(accel: Accel) -> Machine {
    let version = QemuVersion::installed();
    let user = qemu_user();
    Machine {
        argv: machine_template(accel),
        slots: MACHINE_SLOTS.iter().map(|s| s.to_string()).collect(),
        kernel_args: kernel_args(accel),
        firmware: firmware().map_or_else(|| "seabios".to_string(), |p| p.display().to_string()),
        confinement: confinement_args(user.as_ref().map(|u| u.name.as_str()), version),
        qemu_user: user,
        qemu_version: [version.0, version.1],
        chardev_reconnect: version.chardev_reconnect().to_string(),
        devices: device_templates(version),
        device_slots: DEVICE_SLOTS.iter().map(|s| s.to_string()).collect(),
    }
}

/// The machine as [`machine_description`] gives it (`phyfarm guest machine
/// --json`, and the guest plan's `machine`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// The QEMU command line with its [`MACHINE_SLOTS`] left to fill.
    pub argv: Vec<String>,
    pub slots: Vec<String>,
    /// The kernel command line every guest starts {append} with.
    pub kernel_args: String,
    /// The firmware's path, or "seabios" (QEMU's default).
    pub firmware: String,
    /// The confinement options at the end of `argv`.
    pub confinement: Vec<String>,
    /// The user QEMU drops to, or None.
    pub qemu_user: Option<QemuUser>,
    /// QEMU's version, major and minor.
    pub qemu_version: [u32; 2],
    /// This QEMU's spelling of a reconnecting chardev client.
    pub chardev_reconnect: String,
    /// The devices each role adds, by name ([`device_templates`]). A plan
    /// written before they were part of it has none: the harness then
    /// asks today's `phyfarm guest machine` for them.
    #[serde(default)]
    pub devices: BTreeMap<String, Vec<String>>,
    /// The slots `devices` leave to fill ([`DEVICE_SLOTS`]).
    #[serde(default)]
    pub device_slots: Vec<String>,
}

/// The machine every phyfarm guest is, for `phyfarm boot` and (through
/// `phyfarm guest machine`) for the farm's guests and its exporter guest:
/// one vCPU, no default devices, the [`firmware`], the kernel and initramfs
/// given, the serial console to a file, confined (`-sandbox`, and as root
/// the drop to [`qemu_user`]; see [`confinement_args`]).
pub fn machine_argv(
    kernel: &str,
    initrd: &str,
    accel: Accel,
    memory: &str,
    append: &str,
    console: &str,
) -> Vec<String> {
    let mut v: Vec<String> = vec!["qemu-system-x86_64".into()];
    v.extend(accel::qemu_args(accel));
    if let Some(f) = firmware() {
        v.push("-bios".into());
        v.push(f.display().to_string());
    }
    for a in [
        "-M",
        "pc",
        "-m",
        memory,
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        kernel,
        "-initrd",
        initrd,
        "-append",
        append,
        "-chardev",
        &format!("file,id=con,path={console}"),
        "-serial",
        "chardev:con",
    ] {
        v.push(a.to_string());
    }
    v.extend(confinement_args(
        qemu_runas().as_deref(),
        QemuVersion::installed(),
    ));
    v
}

/// The first line of `qemu-system-x86_64 --version`, asked once per process.
pub(crate) fn qemu_version() -> String {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        progress::capture(&["qemu-system-x86_64".into(), "--version".into()], &[])
            .map(|s| s.lines().next().unwrap_or("").to_string())
            .unwrap_or_default()
    })
    .clone()
}

#[cfg(test)]
mod tests;
