//! `phyfarm boot`: boot a kernel in a QEMU guest with the project's busybox
//! initramfs and prove, from inside the guest, that the asix USB driver and the
//! AX88772A PHY driver are registered, and which implementation (Rust or C) it
//! is. Results come back on a virtio port, never from the console, which is
//! kept as a log.
//!
//! One file over 500 lines: `phyfarm boot` from the initramfs and the boot
//! guest's QEMU command line to the parsed report, in the order a boot
//! happens; the machine every guest is lives in `machine.rs`, the tests in
//! `boot/tests.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::{Paths, Variant};
use crate::guest::accel::{self, Accel};
use crate::guest::cpio::{self, Entry};
use crate::guest::machine::{kernel_args, machine_argv, qemu_version};
use crate::jsonfile::{read_json, write_json_atomic};
use crate::kbuild::images::{self, hex, ImageKind};
use crate::kbuild::metadata::{self, BuildMetadata};
use crate::progress::{self, info};
use crate::sandbox::runtime::{copy_out, CopyOutError, Runtime};
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
            let data = match copy_out(&paths.repo, &img.tag, &["cat", "/bin/busybox"]) {
                Ok(data) if data.len() >= 100_000 => data,
                Err(CopyOutError::Start(e)) => return Err(e.into()),
                _ => bail!("cannot copy /bin/busybox out of {}", img.tag),
            };
            std::fs::create_dir_all(paths.guest_dir())?;
            std::fs::write(&cached, &data)?;
            Ok(data)
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

/// The boot check: boot `opts.kernel`, judge what the guest reported, write
/// `boot.json` into the returned folder and return the same record.
pub fn boot_check(
    paths: &Paths,
    opts: &BootOptions,
    reproducer: &str,
) -> Result<(BootRecord, PathBuf)> {
    let (kernel, expect) = boot_kernel(opts)?;
    let initrd = boot_initramfs(paths, opts.runtime)?;
    let out = boot_folder(paths, opts, expect)?;
    let check = BootCheck {
        opts,
        kernel,
        expect,
        initrd,
        console: out.join("console.log"),
        result: out.join("result.txt"),
        out,
    };
    let (accel, accel_reason) = check.accelerator(paths);
    let (end, took) = check.run_qemu(accel)?;
    let report = parse_report(&std::fs::read_to_string(&check.result).unwrap_or_default());
    let judged = check.judge_report(&end, &report);
    for c in &judged.checks {
        eprintln!(
            "{}: {} ({})",
            if c.ok { "I: PASS" } else { "E: FAIL" },
            c.name,
            progress::printable(&c.detail)
        );
    }
    let record = BootRecord {
        reproducer: reproducer.to_string(),
        kernel: check.kernel.display().to_string(),
        kernel_release: report.get("kernel").cloned().unwrap_or_default(),
        accel: accel.name().into(),
        accel_reason,
        qemu: qemu_version(),
        seconds: took.as_secs_f64(),
        status: judged.status,
        checks: judged.checks,
        console: check.console.display().to_string(),
        message: judged.message,
    };
    write_json_atomic(&check.out.join("boot.json"), &record)?;
    info(&format!(
        "boot {} in {:.1} s under {}",
        record.status,
        took.as_secs_f64(),
        accel.name()
    ));
    Ok((record, check.out))
}

/// The boot check's kernel, made absolute, and the implementation it should
/// have: `--expect`, or else the variant its build recorded beside it.
fn boot_kernel(opts: &BootOptions) -> Result<(PathBuf, Option<Variant>)> {
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
    Ok((kernel, expect))
}

/// The boot check's folder (`-o`, or a new one under the runs folder),
/// created.
fn boot_folder(paths: &Paths, opts: &BootOptions, expect: Option<Variant>) -> Result<PathBuf> {
    let out = match &opts.out {
        Some(o) => o.clone(),
        None => paths.runs_dir().join(format!(
            "boot-{}-{}",
            expect.map(|v| v.name()).unwrap_or("kernel"),
            metadata::now_rfc3339().replace(':', "")
        )),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    Ok(out)
}

/// A boot check under way: its kernel and the implementation expected of
/// it, its initramfs, and its folder with the guest's console and report.
struct BootCheck<'a> {
    opts: &'a BootOptions,
    kernel: PathBuf,
    expect: Option<Variant>,
    initrd: PathBuf,
    out: PathBuf,
    console: PathBuf,
    result: PathBuf,
}

/// A boot check's status, its checks and, when it did not get that far, why.
struct Judged {
    status: metadata::Status,
    checks: Vec<Check>,
    message: String,
}

impl BootCheck<'_> {
    /// The accelerator and why (see [`resolve_accel`]), said on stderr.
    fn accelerator(&self, paths: &Paths) -> (Accel, String) {
        let o = self.opts;
        let (accel, accel_reason) = resolve_accel(
            paths,
            o.accel,
            &self.kernel,
            &self.initrd,
            o.memory_mb,
            &self.out,
        );
        info(&format!("accelerator: {} ({accel_reason})", accel.name()));
        (accel, accel_reason)
    }

    /// Boot the guest under `accel` (its command line kept in `qemu.cmd`)
    /// until it ends or the timeout passes.
    fn run_qemu(&self, accel: Accel) -> Result<(GuestEnd, Duration)> {
        let argv = qemu_argv(
            &self.kernel,
            &self.initrd,
            accel,
            self.opts.memory_mb,
            &self.console,
            &self.result,
            false,
        );
        std::fs::write(
            self.out.join("qemu.cmd"),
            crate::sandbox::runtime::shell_quote(&argv) + "\n",
        )?;
        info(&format!(
            "booting {} under {}",
            self.kernel.display(),
            accel.name()
        ));
        run_guest(&argv, self.opts.timeout)
    }

    /// Judge how the guest ended and what it reported: a timeout or no
    /// report is an error (a failure when the console shows the kernel
    /// failed); a report is judged check by check ([`judge`]).
    fn judge_report(&self, end: &GuestEnd, report: &BTreeMap<String, String>) -> Judged {
        let console = &self.console;
        let (status, checks, message) = match end {
            GuestEnd::TimedOut => (
                metadata::Status::Error,
                vec![],
                format!(
                    "the guest did not finish within {}s (--timeout); console: {}",
                    self.opts.timeout.as_secs(),
                    console.display()
                ),
            ),
            GuestEnd::Exited(_) if report.get("done").map(String::as_str) != Some("1") => {
                let console_text = std::fs::read_to_string(console).unwrap_or_default();
                let panic = console_text
                    .lines()
                    .find(|l| {
                        l.contains("Kernel panic") || l.contains("BUG:") || l.contains("Oops")
                    })
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
                let checks = judge(report, self.expect);
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
        Judged {
            status,
            checks,
            message,
        }
    }
}

#[cfg(test)]
mod tests;
