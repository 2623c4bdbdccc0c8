//! `phyfarm doctor`: every host prerequisite, each problem with its fix.

use std::process::Stdio;

use crate::config::Paths;
use crate::guest::accel;
use crate::kbuild::images::have;
use crate::kbuild::steps::free_space;
use crate::progress;
use crate::sandbox::runtime::{nofile_limit, podman_env};

/// Free space the cache should have for a source tree and two build trees.
pub const DISK_NEEDED: u64 = 6_000_000_000;

/// One line of the doctor's report.
#[derive(Debug, Clone)]
pub struct Finding {
    pub what: &'static str,
    pub ok: bool,
    pub detail: String,
    /// How to fix it, when not ok.
    pub fix: String,
}

fn finding(what: &'static str, ok: bool, detail: String, fix: &str) -> Finding {
    Finding {
        what,
        ok,
        detail,
        fix: if ok { String::new() } else { fix.to_string() },
    }
}

fn first_line(argv: &[&str]) -> Option<String> {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    progress::capture(&argv, &[])
        .ok()
        .map(|s| s.lines().next().unwrap_or("").trim().to_string())
}

// Long: one host prerequisite after another, each with its fix.
/// Run every check. Nothing here changes the machine.
pub fn check(paths: &Paths) -> Vec<Finding> {
    const SETUP: &str = "run `bash containers/host-setup.sh` as root";
    let mut f = Vec::new();

    let podman = first_line(&["podman", "--version"]);
    f.push(finding(
        "podman",
        podman.is_some(),
        podman.clone().unwrap_or_else(|| "not installed".into()),
        &format!("{SETUP} (apt-get install podman runc), or use --runtime host"),
    ));
    if podman.is_some() {
        f.push(finding(
            "runc",
            have("runc"),
            if have("runc") {
                "installed".into()
            } else {
                "not installed".into()
            },
            "apt-get install runc (crun refuses the hybrid cgroup layout of these hosts)",
        ));
        let env = [podman_env(&paths.repo)];
        let info = progress::capture(
            &[
                "podman".into(),
                "info".into(),
                "--format".into(),
                "{{.Host.OCIRuntime.Name}}".into(),
            ],
            &env,
        );
        let (ok, detail) = match info {
            Ok(s) if s.trim() == "runc" => (true, format!("runtime runc with {}", env[0].1)),
            Ok(s) => (false, format!("runtime is {} with {}", s.trim(), env[0].1)),
            Err(e) => (false, e.to_string()),
        };
        f.push(finding(
            "podman settings",
            ok,
            detail,
            "phyfarm passes containers/containers.conf via CONTAINERS_CONF; check that file sets runtime = \"runc\" and that `podman info` works as root",
        ));
    }
    let n = nofile_limit();
    f.push(finding(
        "open-files limit",
        n >= 4096,
        format!("containers get nofile={n}"),
        "raise the hard limit (ulimit -Hn) to at least 4096",
    ));
    f.push(finding(
        "mmdebstrap",
        have("mmdebstrap"),
        first_line(&["mmdebstrap", "--version"]).unwrap_or_else(|| "not installed".into()),
        &format!("{SETUP} (apt-get install mmdebstrap)"),
    ));
    let qemu = first_line(&["qemu-system-x86_64", "--version"]);
    f.push(finding(
        "qemu-system-x86_64",
        qemu.is_some(),
        qemu.clone().unwrap_or_else(|| "not installed".into()),
        &format!("{SETUP} (apt-get install qemu-system-x86)"),
    ));
    if qemu.is_some() {
        let devs = progress::command(
            &["qemu-system-x86_64".into(), "-device".into(), "help".into()],
            None,
            &[],
        )
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
        let missing: Vec<&str> = ["usb-redir", "qemu-xhci", "virtserialport"]
            .into_iter()
            .filter(|d| !devs.contains(&format!("\"{d}\"")))
            .collect();
        f.push(finding(
            "qemu devices",
            missing.is_empty(),
            if missing.is_empty() {
                "usb-redir, qemu-xhci, virtserialport".into()
            } else {
                format!("missing: {}", missing.join(", "))
            },
            "install Debian's qemu-system-x86 (it has usb-redir)",
        ));
    }
    if qemu.is_some() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let user = crate::guest::machine::qemu_runas();
        f.push(finding(
            "QEMU user",
            !root || user.is_some(),
            match (&user, root) {
                (Some(u), _) => {
                    use crate::guest::machine::{confinement_args, QemuVersion};
                    let drop = confinement_args(Some(u), QemuVersion::installed())[2..].join(" ");
                    format!("QEMU drops to {u} ({drop}) and runs with -sandbox on")
                }
                (None, false) => {
                    "phyfarm is not root: QEMU runs unprivileged, with -sandbox on".into()
                }
                (None, true) => format!(
                    "user {} missing: QEMU would run guests as root",
                    crate::guest::machine::QEMU_USER
                ),
            },
            &format!(
                "{SETUP} (it creates the system user {})",
                crate::guest::machine::QEMU_USER
            ),
        ));
    }
    f.push(finding("accelerator", true, accel::describe(paths), ""));
    let venv_py = paths.cache.join("venv/bin/python");
    let pytest = if venv_py.is_file() {
        first_line(&[&venv_py.display().to_string(), "-m", "pytest", "--version"])
    } else {
        first_line(&["python3", "-m", "pytest", "--version"])
    };
    f.push(finding(
        "python and pytest",
        pytest.is_some(),
        pytest.unwrap_or_else(|| "pytest not found".into()),
        &format!(
            "{SETUP} (creates {}/venv with pytest)",
            paths.cache.display()
        ),
    ));
    let free = free_space(&paths.cache);
    f.push(finding(
        "free disk",
        free >= DISK_NEEDED,
        format!(
            "{:.1} GB free for {}",
            free as f64 / 1e9,
            paths.cache.display()
        ),
        &format!(
            "free space or set PHYFARM_CACHE to a disk with {:.0} GB free",
            DISK_NEEDED as f64 / 1e9
        ),
    ));
    f
}

/// Print the findings; true when all are ok.
pub fn report(findings: &[Finding]) -> bool {
    let width = findings.iter().map(|f| f.what.len()).max().unwrap_or(0);
    for x in findings {
        println!(
            "{} {:width$}  {}",
            if x.ok { "ok  " } else { "FAIL" },
            x.what,
            x.detail
        );
        if !x.ok {
            println!("     {:width$}  fix: {}", "", x.fix);
        }
    }
    findings.iter().all(|f| f.ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_carry_a_fix_and_oks_do_not() {
        let a = finding("x", false, "broken".into(), "do y");
        let b = finding("z", true, "fine".into(), "never shown");
        assert_eq!(a.fix, "do y");
        assert!(b.fix.is_empty());
        assert!(!report(&[a, b.clone()]));
        assert!(report(&[b]));
    }
}
