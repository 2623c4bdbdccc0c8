//! `phyfarm boot`: boot a kernel in a QEMU guest with the project's busybox
//! initramfs and prove, from inside the guest, that the asix USB driver and the
//! AX88772A PHY driver are registered, and which implementation (Rust or C) it
//! is. Results come back on a virtio port, never from the console, which is
//! kept as a log.
//!
//! One file over 500 lines: `phyfarm boot` from QEMU's command line to the parsed
//! report, in the order a boot happens; its tests are in `boot/tests.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::build::images::{self, hex, ImageKind};
use crate::build::metadata::{self, BuildMetadata};
use crate::config::{Paths, Variant};
use crate::guest::accel::{self, Accel};
use crate::guest::cpio::{self, Entry};
use crate::jsonfile::{read_json, write_json_atomic};
use crate::progress::{self, info};
use crate::sandbox::runtime::{podman_env, Runtime};
use crate::Outcome;

/// The guest's /init for boot checks.
pub const BOOT_INIT: &str = include_str!("../../../qemu-farm/guest/boot-check.sh");
/// The name of the virtio port results come back on.
pub const RESULT_PORT: &str = "org.phyfarm.result";
/// The PHY driver name both the C and the Rust driver register.
pub const PHY_DRIVER: &str = "Asix Electronics AX88772A";

#[derive(Debug, Clone)]
pub struct BootOptions {
    pub kernel: PathBuf,
    pub accel: Accel,
    pub timeout: Duration,
    pub out: Option<PathBuf>,
    pub expect: Option<Variant>,
    pub runtime: Runtime,
    pub memory_mb: u32,
}

/// A statically linked busybox for the guest: from the farm image, or the
/// host's busybox-static with `--runtime host`.
pub fn busybox(paths: &Paths, runtime: Runtime) -> Result<Vec<u8>> {
    match runtime {
        Runtime::Host => {
            let p = Path::new("/bin/busybox");
            let data = std::fs::read(p).context(
                "--runtime host needs a static /bin/busybox: apt-get install busybox-static",
            )?;
            Ok(data)
        }
        Runtime::Podman => {
            let img = images::ensure(paths, ImageKind::Farm)?;
            let cached = paths
                .guest_dir()
                .join(format!("busybox-{}", img.id.get(..12).unwrap_or(&img.id)));
            if let Ok(data) = std::fs::read(&cached) {
                return Ok(data);
            }
            let out = progress::command(
                &[
                    "podman".into(),
                    "run".into(),
                    "--rm".into(),
                    "--network=none".into(),
                    img.tag.clone(),
                    "cat".into(),
                    "/bin/busybox".into(),
                ],
                None,
                &[podman_env(&paths.repo)],
            )
            .stdin(Stdio::null())
            .output()?;
            if !out.status.success() || out.stdout.len() < 100_000 {
                bail!("cannot copy /bin/busybox out of {}", img.tag);
            }
            std::fs::create_dir_all(paths.guest_dir())?;
            std::fs::write(&cached, &out.stdout)?;
            Ok(out.stdout)
        }
    }
}

/// The entries of the boot-check initramfs.
pub fn boot_entries(busybox: Vec<u8>) -> Vec<Entry> {
    let mut e = Vec::new();
    for d in [
        "bin", "sbin", "dev", "proc", "sys", "tmp", "usr", "usr/bin", "usr/sbin",
    ] {
        e.push(Entry::Dir {
            path: d.into(),
            mode: 0o755,
        });
    }
    e.push(Entry::CharDev {
        path: "dev/console".into(),
        mode: 0o600,
        major: 5,
        minor: 1,
    });
    e.push(Entry::File {
        path: "bin/busybox".into(),
        mode: 0o755,
        data: busybox,
    });
    e.push(Entry::Symlink {
        path: "bin/sh".into(),
        target: "busybox".into(),
    });
    e.push(Entry::File {
        path: "init".into(),
        mode: 0o755,
        data: BOOT_INIT.as_bytes().to_vec(),
    });
    e
}

/// Build (or reuse) the boot-check initramfs; returns its path.
pub fn boot_initramfs(paths: &Paths, runtime: Runtime) -> Result<PathBuf> {
    let bb = busybox(paths, runtime)?;
    let mut buf = Vec::new();
    cpio::write(&mut buf, &boot_entries(bb))?;
    let name = format!("boot-{}.cpio", &hex(&Sha256::digest(&buf))[..12]);
    let path = paths.guest_dir().join(name);
    if !path.is_file() {
        std::fs::create_dir_all(paths.guest_dir())?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &buf)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(path)
}

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

/// The QEMU command line of a boot-check guest.
pub fn qemu_argv(
    kernel: &Path,
    initrd: &Path,
    accel: Accel,
    memory_mb: u32,
    console: &Path,
    result: &Path,
    probe: bool,
) -> Vec<String> {
    let mut append = kernel_args(accel);
    if probe {
        append.push_str(" phyfarm.mode=probe");
    }
    let mut v = machine_argv(
        &kernel.display().to_string(),
        &initrd.display().to_string(),
        accel,
        &memory_mb.to_string(),
        &append,
        &console.display().to_string(),
    );
    for a in [
        "-device",
        "virtio-serial-pci",
        "-chardev",
        &format!("file,id=result,path={}", result.display()),
        "-device",
        &format!("virtserialport,chardev=result,name={RESULT_PORT}"),
        "-device",
        "qemu-xhci",
    ] {
        v.push(a.to_string());
    }
    v
}

/// How a guest run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestEnd {
    Exited(i32),
    TimedOut,
}

/// Run QEMU until it exits or `timeout` passes (then kill it).
pub fn run_guest(argv: &[String], timeout: Duration) -> Result<(GuestEnd, Duration)> {
    let start = Instant::now();
    let mut child: Child = progress::command(argv, None, &[])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {} (apt-get install qemu-system-x86)", argv[0]))?;
    loop {
        if let Some(st) = child.try_wait()? {
            let code = st.code().unwrap_or(-1);
            if code != 0 {
                let mut err = String::new();
                use std::io::Read;
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                let msg = err.lines().next().unwrap_or("").trim().to_string();
                if !msg.is_empty() {
                    bail!("QEMU exited with {code}: {msg}");
                }
            }
            return Ok((GuestEnd::Exited(code), start.elapsed()));
        }
        if start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok((GuestEnd::TimedOut, start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Parse the guest's key=value report.
pub fn parse_report(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// One check of the boot report.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// Judge a report: asix registered, the AX88772A PHY driver registered, and
/// the implementation the build asked for.
pub fn judge(report: &BTreeMap<String, String>, expect: Option<Variant>) -> Vec<Check> {
    let get = |k: &str| report.get(k).map(String::as_str).unwrap_or("");
    let num = |k: &str| get(k).parse::<u64>().unwrap_or(0);
    let mut checks = vec![
        Check {
            name: "usb driver asix registered".into(),
            ok: get("usb_driver_asix") == "1",
            detail: "/sys/bus/usb/drivers/asix".into(),
        },
        Check {
            name: format!("phy driver \"{PHY_DRIVER}\" registered"),
            ok: get("phy_driver_ax88772a") == "1",
            detail: format!("mdio drivers: {}", get("phy_drivers").trim_end_matches('|')),
        },
    ];
    let found = match (num("rust_phy_symbols") > 0, num("c_phy_symbols") > 0) {
        (true, false) => Some(Variant::Rust),
        (false, true) => Some(Variant::C),
        _ => None,
    };
    let detail = format!(
        "kallsyms: {} ax88796b_rust symbols, {} C driver symbols",
        num("rust_phy_symbols"),
        num("c_phy_symbols")
    );
    checks.push(match expect {
        Some(v) => Check {
            name: format!(
                "phy driver is the {} one",
                if v == Variant::Rust { "Rust" } else { "C" }
            ),
            ok: found == Some(v),
            detail,
        },
        None => Check {
            name: "phy driver implementation identified".into(),
            ok: found.is_some(),
            detail,
        },
    });
    checks
}

/// A boot check's record: `boot.json` in its folder, and what
/// [`boot_check`] returns to the run in memory. An old run folder's file is
/// read back into the same type.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BootRecord {
    pub reproducer: String,
    pub kernel: String,
    pub kernel_release: String,
    pub accel: String,
    pub accel_reason: String,
    pub qemu: String,
    pub seconds: f64,
    pub status: metadata::Status,
    pub checks: Vec<Check>,
    pub console: String,
    pub message: String,
}

/// The first line of `qemu-system-x86_64 --version`, asked once per process.
fn qemu_version() -> String {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        progress::capture(&["qemu-system-x86_64".into(), "--version".into()], &[])
            .map(|s| s.lines().next().unwrap_or("").to_string())
            .unwrap_or_default()
    })
    .clone()
}

/// Resolve the accelerator for guests of `kernel`: `auto` becomes KVM only
/// when a short probe boot of `kernel` (with the boot-check `initrd`) under
/// KVM finishes; the answer is kept for this host boot (see [`accel`]). The
/// probe's console and result files go to `scratch` and are removed.
pub fn resolve_accel(
    paths: &Paths,
    want: Accel,
    kernel: &Path,
    initrd: &Path,
    memory_mb: u32,
    scratch: &Path,
) -> (Accel, String) {
    let probe = |timeout: Duration| -> Result<bool, String> {
        let pc = scratch.join("probe-console.log");
        let pr = scratch.join("probe-result.txt");
        let argv = qemu_argv(kernel, initrd, Accel::Kvm, memory_mb, &pc, &pr, true);
        let r = run_guest(&argv, timeout).map_err(|e| e.to_string())?;
        let ok = std::fs::read_to_string(&pr)
            .unwrap_or_default()
            .contains("probe=ok");
        let _ = std::fs::remove_file(&pc);
        let _ = std::fs::remove_file(&pr);
        Ok(matches!(r.0, GuestEnd::Exited(_)) && ok)
    };
    accel::resolve(paths, want, &probe)
}

/// Boot `opts.kernel` and check the drivers from inside the guest (`phyfarm
/// boot`): the record's folder on stdout, its status as the outcome.
pub fn boot(paths: &Paths, opts: &BootOptions, reproducer: &str) -> Result<Outcome> {
    let (record, out) = boot_check(paths, opts, reproducer)?;
    match record.status {
        metadata::Status::Pass => {
            println!("{}", out.display());
            Ok(Outcome::Pass)
        }
        metadata::Status::Fail => {
            if !record.message.is_empty() {
                eprintln!("E: {}", record.message);
            }
            println!("{}", out.display());
            Ok(Outcome::Fail)
        }
        _ => bail!("{}", record.message),
    }
}

// Long: the boot check's steps in order (kernel, initramfs, accelerator, QEMU, judging the report); splitting them is open work.
/// The boot check: boot `opts.kernel`, judge what the guest reported, write
/// `boot.json` into the returned folder and return the same record.
pub fn boot_check(
    paths: &Paths,
    opts: &BootOptions,
    reproducer: &str,
) -> Result<(BootRecord, PathBuf)> {
    if !opts.kernel.is_file() {
        bail!(
            "kernel {} does not exist: build one with `phyfarm build --variant rust` and pass OUT/bzImage",
            opts.kernel.display()
        );
    }
    if !images::have("qemu-system-x86_64") {
        bail!("qemu-system-x86_64 is not installed: run `bash containers/host-setup.sh` (or apt-get install qemu-system-x86)");
    }
    let kernel = crate::config::absolute(&opts.kernel);
    let build_meta: Option<BuildMetadata> = kernel
        .parent()
        .and_then(|d| read_json(&d.join("metadata.json")).ok().flatten());
    let expect = opts.expect.or_else(|| {
        build_meta
            .as_ref()
            .and_then(|m| <Variant as clap::ValueEnum>::from_str(&m.variant, true).ok())
    });
    let initrd = boot_initramfs(paths, opts.runtime)?;
    let out = match &opts.out {
        Some(o) => o.clone(),
        None => paths.runs_dir().join(format!(
            "boot-{}-{}",
            expect.map(|v| v.name()).unwrap_or("kernel"),
            metadata::now_rfc3339().replace(':', "")
        )),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let console = out.join("console.log");
    let result = out.join("result.txt");

    let (accel, accel_reason) =
        resolve_accel(paths, opts.accel, &kernel, &initrd, opts.memory_mb, &out);
    info(&format!("accelerator: {} ({accel_reason})", accel.name()));

    let argv = qemu_argv(
        &kernel,
        &initrd,
        accel,
        opts.memory_mb,
        &console,
        &result,
        false,
    );
    std::fs::write(
        out.join("qemu.cmd"),
        crate::sandbox::runtime::shell_quote(&argv) + "\n",
    )?;
    info(&format!(
        "booting {} under {}",
        kernel.display(),
        accel.name()
    ));
    let (end, took) = run_guest(&argv, opts.timeout)?;
    let report = parse_report(&std::fs::read_to_string(&result).unwrap_or_default());
    let console_text = std::fs::read_to_string(&console).unwrap_or_default();

    let (status, checks, message) = match end {
        GuestEnd::TimedOut => (
            metadata::Status::Error,
            vec![],
            format!(
                "the guest did not finish within {}s (--timeout); console: {}",
                opts.timeout.as_secs(),
                console.display()
            ),
        ),
        GuestEnd::Exited(_) if report.get("done").map(String::as_str) != Some("1") => {
            let panic = console_text
                .lines()
                .find(|l| l.contains("Kernel panic") || l.contains("BUG:") || l.contains("Oops"))
                .map(progress::printable)
                .unwrap_or_default()
                .trim()
                .to_string();
            let status = if panic.is_empty() {
                metadata::Status::Error
            } else {
                metadata::Status::Fail
            };
            let msg = if panic.is_empty() {
                format!(
                    "the guest ended without reporting; console: {}",
                    console.display()
                )
            } else {
                format!(
                    "the guest kernel failed: {panic}; console: {}",
                    console.display()
                )
            };
            (status, vec![], msg)
        }
        GuestEnd::Exited(_) => {
            let checks = judge(&report, expect);
            let ok = checks.iter().all(|c| c.ok);
            (
                if ok {
                    metadata::Status::Pass
                } else {
                    metadata::Status::Fail
                },
                checks,
                String::new(),
            )
        }
    };
    for c in &checks {
        eprintln!(
            "{}: {} ({})",
            if c.ok { "I: PASS" } else { "E: FAIL" },
            c.name,
            progress::printable(&c.detail)
        );
    }
    let record = BootRecord {
        reproducer: reproducer.to_string(),
        kernel: kernel.display().to_string(),
        kernel_release: report.get("kernel").cloned().unwrap_or_default(),
        accel: accel.name().into(),
        accel_reason,
        qemu: qemu_version(),
        seconds: took.as_secs_f64(),
        status,
        checks,
        console: console.display().to_string(),
        message: message.clone(),
    };
    write_json_atomic(&out.join("boot.json"), &record)?;
    info(&format!(
        "boot {} in {:.1} s under {}",
        status,
        took.as_secs_f64(),
        accel.name()
    ));
    Ok((record, out))
}

#[cfg(test)]
mod tests;
