//! The sandbox of every podman step a pull request controls (git on its
//! patches, the kernel builds and gates of its series): no network, no
//! capabilities, no privilege gain, a read-only root file system with a
//! small /tmp, its own user namespace (container root is an unprivileged
//! host uid), memory, pids and CPU limits, and a wall-clock and disk budget
//! that phyfarm enforces and names when it fires.
//!
//! What the host supports is probed once per process with a tiny container;
//! a limit the host cannot apply (a cgroup controller missing, no user
//! namespaces) is dropped with a warning that also goes into the build log,
//! so a log always says which sandbox ran.

pub mod runtime;
pub mod safe_fs;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::progress::warn;

/// The first host uid (and gid) of the build containers' user namespace:
/// container root is this uid on the host, owning nothing else there.
pub const UID_BASE: u32 = 524_288;
/// How many uids the namespace maps.
pub const UID_COUNT: u32 = 65_536;

/// Limits of one sandboxed step, from `PHYFARM_BUILD_*` or the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// `--memory` (and `--memory-swap`, so no swap on top).
    pub memory: String,
    /// `--pids-limit`.
    pub pids: u32,
    /// `--cpus`.
    pub cpus: u32,
    /// Wall-clock limit of one step.
    pub timeout: Duration,
    /// Most bytes a step may take from the disk its build tree is on.
    pub disk: u64,
    /// Size of the container's /tmp (tmpfs, counted against memory).
    pub tmp: String,
}

/// The defaults, mirrored in the README's settings table.
pub const DEFAULT_MEMORY: &str = "8g";
pub const DEFAULT_PIDS: u32 = 4096;
pub const DEFAULT_TIMEOUT_SECS: u64 = 3600;
pub const DEFAULT_DISK: u64 = 10_000_000_000;
/// The default size of a container's /tmp.
pub const DEFAULT_TMP: &str = "1g";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

/// `8g`, `512m`, `2000000` -> bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mul) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1u64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

impl Limits {
    /// The defaults alone, whatever the environment says.
    pub fn from_env_defaults() -> Limits {
        Limits {
            memory: DEFAULT_MEMORY.into(),
            pids: DEFAULT_PIDS,
            cpus: std::thread::available_parallelism().map_or(2, |n| n.get() as u32),
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            disk: DEFAULT_DISK,
            tmp: DEFAULT_TMP.into(),
        }
    }

    /// The defaults, overridden by `PHYFARM_BUILD_*`; a malformed value is
    /// an error naming the variable.
    pub fn from_env() -> Result<Limits> {
        let mut l = Limits::from_env_defaults();
        if let Some(m) = env("PHYFARM_BUILD_MEMORY") {
            parse_size(&m).with_context(|| format!("PHYFARM_BUILD_MEMORY={m}: not a size"))?;
            l.memory = m.trim().into();
        }
        if let Some(p) = env("PHYFARM_BUILD_PIDS") {
            l.pids = p
                .trim()
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("PHYFARM_BUILD_PIDS={p}: not a positive number"))?;
        }
        if let Some(c) = env("PHYFARM_BUILD_CPUS") {
            l.cpus = c
                .trim()
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("PHYFARM_BUILD_CPUS={c}: not a positive number"))?;
        }
        if let Some(t) = env("PHYFARM_BUILD_TIMEOUT") {
            let secs: u64 =
                t.trim().parse().ok().filter(|n| *n > 0).with_context(|| {
                    format!("PHYFARM_BUILD_TIMEOUT={t}: not a number of seconds")
                })?;
            l.timeout = Duration::from_secs(secs);
        }
        if let Some(d) = env("PHYFARM_BUILD_DISK") {
            l.disk = parse_size(&d)
                .filter(|n| *n > 0)
                .with_context(|| format!("PHYFARM_BUILD_DISK={d}: not a size"))?;
        }
        Ok(l)
    }
}

/// The `podman run` options every sandboxed container gets whatever the
/// host supports: no capabilities, no privilege gain, a read-only root with
/// a /tmp of `tmp` bytes at most.
pub fn hardening(tmp: &str) -> Vec<String> {
    vec![
        "--cap-drop=all".to_string(),
        "--security-opt=no-new-privileges".into(),
        "--read-only".into(),
        format!("--tmpfs=/tmp:rw,nosuid,nodev,size={tmp},mode=1777"),
        "--env=HOME=/tmp".into(),
    ]
}

/// What the host supports, and so what a step runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    pub limits: Limits,
    /// phyfarm is not root: podman is rootless, so container root is the
    /// invoking (unprivileged) user already and no uid map is needed.
    pub rootless: bool,
    pub userns: bool,
    pub memory: bool,
    pub pids: bool,
    pub cpus: bool,
    /// Why a feature is off, one line each (logged with every step).
    pub degraded: Vec<String>,
}

impl Sandbox {
    /// Every feature on, without probing: what `--dry-run` and tests show.
    pub fn declared(limits: Limits) -> Sandbox {
        Sandbox {
            limits,
            rootless: false,
            userns: true,
            memory: true,
            pids: true,
            cpus: true,
            degraded: vec![],
        }
    }

    /// The `podman run` options of the sandbox.
    pub fn podman_args(&self) -> Vec<String> {
        let l = &self.limits;
        let mut v = hardening(&l.tmp);
        if self.userns && !self.rootless {
            v.push(format!("--uidmap=0:{UID_BASE}:{UID_COUNT}"));
            v.push(format!("--gidmap=0:{UID_BASE}:{UID_COUNT}"));
        }
        if self.memory {
            v.push(format!("--memory={}", l.memory));
            v.push(format!("--memory-swap={}", l.memory));
        }
        if self.pids {
            v.push(format!("--pids-limit={}", l.pids));
        }
        if self.cpus {
            v.push(format!("--cpus={}", l.cpus));
        }
        v
    }

    /// One line for a log: what ran, and what could not.
    pub fn describe(&self) -> String {
        let l = &self.limits;
        let on = |b: bool, s: String| if b { s } else { format!("no {s}") };
        let mut s = format!(
            "sandbox: {}, cap-drop=all, no-new-privileges, read-only root, network none, {}, {}, {}, timeout {}s, disk {} MB",
            if self.rootless {
                "rootless podman (container root = the invoking user)".to_string()
            } else {
                on(self.userns, format!("user namespace (root = host uid {UID_BASE})"))
            },
            on(self.memory, format!("memory {}", l.memory)),
            on(self.pids, format!("pids {}", l.pids)),
            on(self.cpus, format!("cpus {}", l.cpus)),
            l.timeout.as_secs(),
            l.disk / 1_000_000
        );
        for d in &self.degraded {
            s.push_str("; ");
            s.push_str(d);
        }
        s
    }

    /// The sandbox this host supports for `image` (probed once per process).
    pub fn probed(env: &[(String, String)], image: &str) -> Result<Sandbox> {
        static PROBED: OnceLock<Sandbox> = OnceLock::new();
        if let Some(s) = PROBED.get() {
            return Ok(s.clone());
        }
        let limits = Limits::from_env()?;
        let s = probe(env, image, limits);
        for d in &s.degraded {
            warn(d);
        }
        Ok(PROBED.get_or_init(|| s).clone())
    }
}

fn try_run(env: &[(String, String)], image: &str, opts: &[String]) -> Result<(), String> {
    let mut argv: Vec<String> = vec!["podman".into(), "run".into(), "--rm".into()];
    argv.extend(crate::sandbox::runtime::ulimit_args());
    argv.push("--network=none".into());
    argv.extend(opts.iter().cloned());
    argv.extend([image.to_string(), "true".into()]);
    crate::progress::capture(&argv, env)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn probe(env: &[(String, String)], image: &str, limits: Limits) -> Sandbox {
    let mut s = Sandbox::declared(limits);
    // SAFETY: geteuid has no preconditions.
    s.rootless = unsafe { libc::geteuid() } != 0;
    if try_run(env, image, &s.podman_args()).is_ok() {
        return s;
    }
    // Something is not supported: find out what, one feature at a time.
    let base = Sandbox {
        userns: s.rootless,
        memory: false,
        pids: false,
        cpus: false,
        ..s.clone()
    };
    if let Err(e) = try_run(env, image, &base.podman_args()) {
        s.degraded
            .push(format!("the basic sandbox does not start here: {e}"));
        s.userns = false;
        s.memory = false;
        s.pids = false;
        s.cpus = false;
        return s;
    }
    let check = |f: &dyn Fn(&mut Sandbox)| {
        let mut one = base.clone();
        f(&mut one);
        try_run(env, image, &one.podman_args())
    };
    if s.rootless {
        // Nothing to probe: rootless podman is its own user namespace.
    } else if let Err(e) = check(&|x| x.userns = true) {
        s.userns = false;
        s.degraded.push(format!(
            "no user namespace (builds run as container root, all capabilities dropped): {e}"
        ));
    }
    if let Err(e) = check(&|x| x.memory = true) {
        s.memory = false;
        s.degraded
            .push(format!("no memory limit (cgroup memory controller): {e}"));
    }
    if let Err(e) = check(&|x| x.pids = true) {
        s.pids = false;
        s.degraded
            .push(format!("no pids limit (cgroup pids controller): {e}"));
    }
    if let Err(e) = check(&|x| x.cpus = true) {
        s.cpus = false;
        s.degraded
            .push(format!("no CPU limit (cgroup cpu controller): {e}"));
    }
    s
}

/// Make `dir` (a tree a sandboxed step may write) owned by the namespace's
/// root, so that an unprivileged container root can write it. Links are
/// changed themselves, never followed. Only walks when the top is not
/// owned yet.
pub fn own_tree(dir: &Path) -> Result<()> {
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    if m.uid() == UID_BASE && m.gid() == UID_BASE {
        return Ok(());
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p)?;
        if m.uid() != UID_BASE || m.gid() != UID_BASE {
            std::os::unix::fs::lchown(&p, Some(UID_BASE), Some(UID_BASE))
                .with_context(|| format!("cannot hand {} to the build sandbox", p.display()))?;
        }
        if m.file_type().is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            memory: "8g".into(),
            pids: 4096,
            cpus: 2,
            timeout: Duration::from_secs(60),
            disk: 1_000_000_000,
            tmp: "1g".into(),
        }
    }

    #[test]
    fn the_declared_sandbox_has_every_limit() {
        let a = Sandbox::declared(limits()).podman_args().join(" ");
        for want in [
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            "--read-only",
            "--uidmap=0:524288:65536",
            "--gidmap=0:524288:65536",
            "--memory=8g",
            "--memory-swap=8g",
            "--pids-limit=4096",
            "--cpus=2",
            "--tmpfs=/tmp:",
        ] {
            assert!(a.contains(want), "{want} missing from {a}");
        }
    }

    #[test]
    fn a_degraded_sandbox_says_so() {
        let mut s = Sandbox::declared(limits());
        s.rootless = true;
        assert!(!s.podman_args().join(" ").contains("--uidmap"));
        assert!(s.describe().contains("rootless podman"));
        s.rootless = false;
        s.memory = false;
        s.degraded
            .push("no memory limit (cgroup memory controller): x".into());
        let a = s.podman_args().join(" ");
        assert!(!a.contains("--memory"), "{a}");
        assert!(a.contains("--cap-drop=all"), "{a}");
        let d = s.describe();
        assert!(
            d.contains("no memory 8g") && d.contains("cgroup memory"),
            "{d}"
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8g"), Some(8 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1000"), Some(1000));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn trees_are_handed_over_without_following_links() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: handing a tree to another uid needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let tree = d.path().join("t");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/f"), "x").unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("link")).unwrap();
        own_tree(&tree).unwrap();
        let uid = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        assert_eq!(uid(&tree.join("sub/f")), UID_BASE);
        assert_eq!(uid(&tree.join("link")), UID_BASE);
        assert_eq!(uid(&outside), 0);
    }
}
