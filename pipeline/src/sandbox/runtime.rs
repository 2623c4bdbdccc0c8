//! Where build steps run: in a podman container (the default) or directly on
//! the host (`--runtime host`, for people who have the toolchain but no
//! podman). A step is described once, with container paths; the runtime turns
//! it into the exact argv, which `--dry-run` prints.

use std::path::{Path, PathBuf};

/// `--runtime`: podman containers or the host itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// Run every step in the phyfarm container images (rootful podman).
    Podman,
    /// Run the same steps on the host with its own toolchain.
    Host,
}

/// A host directory made visible to a step at a fixed container path.
#[derive(Debug, Clone)]
pub struct Mount {
    pub host: PathBuf,
    pub guest: &'static str,
    pub read_only: bool,
}

/// One step: a program with arguments, run in an image.
#[derive(Debug, Clone)]
pub struct Job {
    pub image: String,
    pub mounts: Vec<Mount>,
    pub workdir: &'static str,
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
    /// Whether the step needs the network (image builds do; kernel builds do not).
    pub network: bool,
}

impl Job {
    pub fn new(image: &str, workdir: &'static str, argv: &[&str]) -> Job {
        Job {
            image: image.to_string(),
            mounts: Vec::new(),
            workdir,
            env: Vec::new(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            network: false,
        }
    }

    pub fn mount(mut self, host: &Path, guest: &'static str, read_only: bool) -> Job {
        self.mounts.push(Mount {
            host: host.to_path_buf(),
            guest,
            read_only,
        });
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Job {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Rewrite a container path (`/build/x`, or `O=/build`) to the host path.
    fn to_host(&self, arg: &str) -> String {
        let (prefix, path) = match arg.split_once('=') {
            Some((k, v)) if v.starts_with('/') && !k.contains('/') => (format!("{k}="), v),
            _ => (String::new(), arg),
        };
        for m in &self.mounts {
            if let Some(rest) = path.strip_prefix(m.guest) {
                if rest.is_empty() || rest.starts_with('/') {
                    return format!("{prefix}{}{rest}", m.host.display());
                }
            }
        }
        arg.to_string()
    }
}

fn hard_limit(resource: libc::__rlimit_resource_t, cap: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let ok = unsafe { libc::getrlimit(resource, &mut lim) } == 0;
    if ok {
        lim.rlim_max.min(cap)
    } else {
        1024
    }
}

/// The nofile limit passed to containers: podman's default is above what root
/// may set on some hosts, so it follows the host's hard limit.
pub fn nofile_limit() -> u64 {
    hard_limit(libc::RLIMIT_NOFILE, 20000)
}

/// `--ulimit` options for podman run and build. Given on the command line they
/// replace containers.conf's defaults, so both limits are always passed.
pub fn ulimit_args() -> Vec<String> {
    let n = nofile_limit();
    let p = hard_limit(libc::RLIMIT_NPROC, 32768);
    vec![
        format!("--ulimit=nofile={n}:{n}"),
        format!("--ulimit=nproc={p}:{p}"),
    ]
}

/// The host name every container sees (`uname -n`), so kernels built in
/// them do not differ by the container they were built in.
pub const CONTAINER_HOSTNAME: &str = "phyfarm";

impl Runtime {
    /// The environment the runtime's commands need (podman: its settings file).
    pub fn env(self, repo: &Path) -> Vec<(String, String)> {
        match self {
            Runtime::Podman => vec![podman_env(repo)],
            Runtime::Host => vec![],
        }
    }

    /// The exact argv that runs `job` in the sandbox with every limit on
    /// (what `--dry-run` prints), plus the working directory to spawn it in
    /// (host runtime only).
    pub fn argv(self, job: &Job) -> (Vec<String>, Option<PathBuf>) {
        let limits = crate::sandbox::Limits::from_env()
            .unwrap_or_else(|_| crate::sandbox::Limits::from_env_defaults());
        self.argv_in(job, &crate::sandbox::Sandbox::declared(limits), None)
    }

    /// The exact argv that runs `job` in `sandbox` (podman), as container
    /// `name` when given (so a timeout can remove it).
    pub fn argv_in(
        self,
        job: &Job,
        sandbox: &crate::sandbox::Sandbox,
        name: Option<&str>,
    ) -> (Vec<String>, Option<PathBuf>) {
        match self {
            Runtime::Podman => {
                let mut v: Vec<String> = vec!["podman".into(), "run".into(), "--rm".into()];
                if let Some(n) = name {
                    v.push(format!("--name={n}"));
                }
                v.extend(ulimit_args());
                // One host name for every container: kbuild writes it into
                // include/generated/compile.h, and podman's default (the
                // container's id) would change it on every run, relinking a
                // kernel that did not change.
                v.push(format!("--hostname={CONTAINER_HOSTNAME}"));
                if !job.network {
                    v.push("--network=none".into());
                }
                v.extend(sandbox.podman_args());
                for m in &job.mounts {
                    let ro = if m.read_only { ",ro" } else { "" };
                    v.push(format!(
                        "--mount=type=bind,src={},dst={}{ro}",
                        m.host.display(),
                        m.guest
                    ));
                }
                v.push(format!("--workdir={}", job.workdir));
                for (k, val) in &job.env {
                    v.push(format!("--env={k}={val}"));
                }
                v.push(job.image.clone());
                v.extend(job.argv.iter().cloned());
                (v, None)
            }
            Runtime::Host => {
                let mut v = Vec::new();
                if !job.env.is_empty() {
                    v.push("env".to_string());
                    for (k, val) in &job.env {
                        v.push(format!("{k}={}", job.to_host(val)));
                    }
                }
                v.extend(job.argv.iter().map(|a| job.to_host(a)));
                (v, Some(PathBuf::from(job.to_host(job.workdir))))
            }
        }
    }
}

/// Quote an argv for display, so `--dry-run` output can be pasted into a shell.
pub fn shell_quote(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let safe = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%^".contains(c));
            if safe {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a copy-out gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum CopyOutError {
    /// podman could not be started.
    #[error(transparent)]
    Start(#[from] std::io::Error),
    /// The command (or podman) failed: its stderr, trimmed.
    #[error("{0}")]
    Failed(String),
}

/// The argv of a copy-out: `argv` run in `image` with the sandbox's
/// hardening that needs no probe of the host (no network, no capabilities,
/// no privilege gain, a read-only root with a small /tmp).
pub fn copy_out_argv(image: &str, argv: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec!["podman".into(), "run".into(), "--rm".into()];
    v.extend(ulimit_args());
    v.push("--network=none".into());
    v.extend(crate::sandbox::hardening(crate::sandbox::DEFAULT_TMP));
    v.push(image.to_string());
    v.extend(argv.iter().map(|a| a.to_string()));
    v
}

/// Run `argv` in `image`, one of phyfarm's own images that is only read
/// (the guest's busybox and programs are copied out of the farm image),
/// and return its stdout. Every such podman run of phyfarm's goes through
/// here, so that none spells its own.
pub fn copy_out(repo: &Path, image: &str, argv: &[&str]) -> Result<Vec<u8>, CopyOutError> {
    let out = crate::progress::command(&copy_out_argv(image, argv), None, &[podman_env(repo)])
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(CopyOutError::Failed(err));
    }
    Ok(out.stdout)
}

/// The environment every podman invocation gets: phyfarm's containers.conf,
/// unless the user points PHYFARM_CONTAINERS_CONF elsewhere.
pub fn podman_env(repo: &Path) -> (String, String) {
    let conf = std::env::var("PHYFARM_CONTAINERS_CONF")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            repo.join("containers/containers.conf")
                .display()
                .to_string()
        });
    ("CONTAINERS_CONF".to_string(), conf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job::new(
            "img:1",
            "/build",
            &["make", "-C", "/src", "O=/build", "bzImage"],
        )
        .mount(Path::new("/cache/src/linux"), "/src", true)
        .mount(Path::new("/cache/build/rust"), "/build", false)
        .env("ARCH", "x86_64")
    }

    #[test]
    fn podman_argv_mounts_and_isolates() {
        let (v, cwd) = Runtime::Podman.argv(&job());
        assert!(cwd.is_none());
        assert_eq!(&v[..3], &["podman", "run", "--rm"]);
        assert!(v.contains(&"--network=none".to_string()));
        assert!(v.contains(&"--hostname=phyfarm".to_string()), "{v:?}");
        for flag in [
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            "--read-only",
        ] {
            assert!(v.contains(&flag.to_string()), "{flag} missing: {v:?}");
        }
        assert!(v.iter().any(|a| a.starts_with("--uidmap=0:")), "{v:?}");
        assert!(v.iter().any(|a| a.starts_with("--pids-limit=")), "{v:?}");
        assert!(v.contains(&"--mount=type=bind,src=/cache/src/linux,dst=/src,ro".to_string()));
        assert!(v.contains(&"--mount=type=bind,src=/cache/build/rust,dst=/build".to_string()));
        let img = v.iter().position(|a| a == "img:1").unwrap();
        assert_eq!(
            &v[img + 1..],
            &["make", "-C", "/src", "O=/build", "bzImage"]
        );
    }

    #[test]
    fn a_copy_out_is_hardened() {
        let v = copy_out_argv("img:1", &["cat", "/bin/busybox"]);
        assert_eq!(&v[..3], &["podman", "run", "--rm"]);
        for flag in [
            "--network=none",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            "--read-only",
        ] {
            assert!(v.contains(&flag.to_string()), "{flag} missing: {v:?}");
        }
        assert!(v.iter().any(|a| a.starts_with("--tmpfs=/tmp:")), "{v:?}");
        assert!(!v.iter().any(|a| a.starts_with("--mount")), "{v:?}");
        assert_eq!(&v[v.len() - 3..], &["img:1", "cat", "/bin/busybox"]);
    }

    #[test]
    fn host_argv_rewrites_container_paths() {
        let (v, cwd) = Runtime::Host.argv(&job());
        assert_eq!(
            v,
            [
                "env",
                "ARCH=x86_64",
                "make",
                "-C",
                "/cache/src/linux",
                "O=/cache/build/rust",
                "bzImage"
            ]
        );
        assert_eq!(cwd.unwrap(), PathBuf::from("/cache/build/rust"));
    }

    #[test]
    fn prefix_match_respects_path_boundaries() {
        let j = job();
        assert_eq!(j.to_host("/srcfoo"), "/srcfoo");
        assert_eq!(
            j.to_host("/src/scripts/x.sh"),
            "/cache/src/linux/scripts/x.sh"
        );
    }

    #[test]
    fn only_podman_needs_its_settings_file() {
        let e = Runtime::Podman.env(Path::new("/repo"));
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, "CONTAINERS_CONF");
        assert!(Runtime::Host.env(Path::new("/repo")).is_empty());
    }

    #[test]
    fn quoting_is_shell_safe() {
        let q = shell_quote(&["echo".into(), "a b".into(), "it's".into(), "$(x)".into()]);
        assert_eq!(q, "echo 'a b' 'it'\\''s' '$(x)'");
    }
}
