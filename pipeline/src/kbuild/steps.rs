//! Build steps: each job of a build run in the sandbox (or on the host),
//! its command and output logged, and stopped at its wall-clock or disk
//! budget with the limit named.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::progress::{self, info};
use crate::sandbox::runtime::{shell_quote, Job, Runtime};
use crate::sandbox::Sandbox;

/// Runs jobs of one build, logging each command and its output. Podman
/// jobs run in the build sandbox (crate::sandbox); every job is watched
/// for its wall-clock and disk budget.
pub(crate) struct Run<'a> {
    pub runtime: Runtime,
    pub env: Vec<(String, String)>,
    pub log: &'a mut File,
    pub label: String,
    /// Why phyfarm stopped the last job (a limit it enforces), if it did.
    pub stopped: Option<String>,
}

/// Stops a job at its wall-clock or disk budget, naming the limit.
struct StepWatch {
    timeout: Duration,
    disk: u64,
    /// The job's writable tree, the free bytes of its disk and its own
    /// size at start.
    disk_at: Option<(PathBuf, u64, u64)>,
    container: Option<(String, Vec<(String, String)>)>,
}

impl crate::progress::Watch for StepWatch {
    fn check(&mut self, elapsed: Duration) -> Option<String> {
        if elapsed >= self.timeout {
            return Some(format!(
                "timed out after {}s (PHYFARM_BUILD_TIMEOUT)",
                self.timeout.as_secs()
            ));
        }
        if let Some((dir, free0, tree0)) = &mut self.disk_at {
            // Cheap first (free space), exact second (the tree's own
            // growth), so other writers on the disk never stop a build.
            if free0.saturating_sub(free_space(dir)) > self.disk {
                let grown = tree_bytes(dir).saturating_sub(*tree0);
                if grown > self.disk {
                    return Some(format!(
                        "wrote more than {} MB into {} (PHYFARM_BUILD_DISK)",
                        self.disk / 1_000_000,
                        dir.display()
                    ));
                }
                *free0 = free_space(dir).saturating_add(grown);
            }
        }
        None
    }

    fn stop(&mut self) {
        if let Some((name, env)) = &self.container {
            for args in [&["kill", name.as_str()][..], &["rm", "-f", "-t", "0", name]] {
                let mut argv = vec!["podman".to_string()];
                argv.extend(args.iter().map(|s| s.to_string()));
                let _ = progress::capture(&argv, env);
            }
        }
    }
}

/// Bytes a tree takes on disk (allocated blocks), links not followed.
pub fn tree_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        total += m.blocks() * 512;
        if m.file_type().is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.filter_map(|e| e.ok().map(|e| e.path())));
            }
        }
    }
    total
}

fn container_name() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "phyfarm-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl Run<'_> {
    pub fn new<'a>(
        runtime: Runtime,
        env: Vec<(String, String)>,
        log: &'a mut File,
        label: &str,
    ) -> Run<'a> {
        Run {
            runtime,
            env,
            log,
            label: label.to_string(),
            stopped: None,
        }
    }

    /// The argv of `j` in the sandbox this host supports, with its writable
    /// trees handed to the sandbox's user.
    fn sandboxed(
        &mut self,
        j: &Job,
        name: Option<&str>,
    ) -> Result<(Vec<String>, Option<PathBuf>, Sandbox)> {
        let sb = match self.runtime {
            Runtime::Podman => Sandbox::probed(&self.env, &j.image)?,
            Runtime::Host => Sandbox::declared(crate::sandbox::Limits::from_env()?),
        };
        if self.runtime == Runtime::Podman {
            writeln!(self.log, "# {}", sb.describe())?;
            if sb.userns && !sb.rootless {
                for m in j.mounts.iter().filter(|m| !m.read_only) {
                    crate::sandbox::own_tree(&m.host)?;
                }
            }
        } else {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                progress::warn(
                    "--runtime host: builds run on the host without the sandbox; use it only for series you trust",
                )
            });
            writeln!(
                self.log,
                "# runtime host: no sandbox (timeout {}s, disk {} MB only)",
                sb.limits.timeout.as_secs(),
                sb.limits.disk / 1_000_000
            )?;
        }
        let (argv, cwd) = self.runtime.argv_in(j, &sb, name);
        Ok((argv, cwd, sb))
    }

    /// Run a short job and return its exit (None = success) and its output,
    /// which is also logged.
    pub fn capture(&mut self, j: &Job) -> Result<(Option<i32>, String)> {
        let (argv, cwd, _) = self.sandboxed(j, None)?;
        writeln!(self.log, "$ {}", shell_quote(&argv))?;
        let out = progress::command(&argv, cwd.as_deref(), &self.env)
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("cannot start {}", argv[0]))?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        self.log.write_all(text.as_bytes())?;
        let code = (!out.status.success()).then(|| out.status.code().unwrap_or(-1));
        if let Some(c) = code {
            if infra_exit(self.runtime, c) {
                bail!(
                    "podman could not run `{}`: {}",
                    j.argv.join(" "),
                    progress::printable(text.trim())
                );
            }
        }
        Ok((code, text))
    }

    /// Run a job; `Ok(None)` when it succeeded, `Ok(Some(code))` when it
    /// exited non-zero or was stopped at a limit (then `self.stopped` says
    /// which).
    pub fn job(&mut self, j: &Job, what: &str) -> Result<Option<i32>> {
        let name = (self.runtime == Runtime::Podman).then(container_name);
        let (argv, cwd, sb) = self.sandboxed(j, name.as_deref())?;
        writeln!(self.log, "$ {}", shell_quote(&argv))?;
        info(&format!("{}: {what}", self.label));
        let disk_dir = j
            .mounts
            .iter()
            .find(|m| !m.read_only)
            .map(|m| m.host.clone());
        let mut watch = StepWatch {
            timeout: sb.limits.timeout,
            disk: sb.limits.disk,
            disk_at: disk_dir.map(|d| {
                let free = free_space(&d);
                let size = tree_bytes(&d);
                (d, free, size)
            }),
            container: name.map(|n| (n, self.env.clone())),
        };
        let cmd = progress::command(&argv, cwd.as_deref(), &self.env);
        let done = progress::run_watched(
            cmd,
            self.log,
            &self.label,
            Duration::from_secs(30),
            &mut watch,
        )
        .with_context(|| format!("cannot start {}", argv[0]))?;
        self.stopped = done.stopped.clone();
        if let Some(why) = &done.stopped {
            eprintln!("E: {}: {what}: {why}", self.label);
            return Ok(Some(done.status.code().unwrap_or(137)));
        }
        Ok(if done.status.success() {
            None
        } else {
            Some(done.status.code().unwrap_or(-1))
        })
    }
}

/// Podman reports its own failures (not the command's) with 125..=127.
pub(crate) fn infra_exit(runtime: Runtime, code: i32) -> bool {
    runtime == Runtime::Podman && (125..=127).contains(&code)
}

/// Free bytes on the file system holding `path` (or its nearest ancestor).
pub fn free_space(path: &Path) -> u64 {
    let mut p = path.to_path_buf();
    while !p.exists() {
        if !p.pop() {
            return u64::MAX;
        }
    }
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return u64::MAX;
    };
    // SAFETY: statvfs writes into the zeroed struct we own; c is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return u64::MAX;
    }
    st.f_bavail as u64 * st.f_frsize as u64
}
