//! `phyfarm build`: the distro kernel source, extracted once into the cache,
//! configured from the repository's fragments (tinyconfig + kvm_guest.config +
//! phyfarm.config + the variant), verified, and built into bzImage, in the
//! kbuild container or on the host.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::config::{Paths, Variant};
use crate::images::{self, hex, ImageKind, LINUX_SOURCE_PACKAGE};
use crate::kconfig::{self, SourceTree};
use crate::metadata::{self, BuildMetadata, ImageRef, Status, Versions};
use crate::progress::{self, info};
use crate::runtime::{shell_quote, Job, Runtime};
use crate::sandbox::Sandbox;
use crate::Outcome;

/// Free space needed in the cache before extracting a source tree (bytes).
pub const SOURCE_SPACE: u64 = 2_500_000_000;
/// Free space needed before creating a build tree (bytes).
pub const BUILD_SPACE: u64 = 1_500_000_000;

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub variant: Variant,
    pub out: PathBuf,
    pub runtime: Runtime,
    pub jobs: usize,
    pub dry_run: bool,
    /// Extra options from `-K CONFIG_X=y`.
    pub extra: Vec<String>,
    /// The phyfarm command line, for the reproducer.
    pub reproducer: String,
}

/// What the build runs with: image (podman) or host tools, and the kernel
/// source package version.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub image: Option<ImageRef>,
    pub kernel_version: String,
    pub tools: Versions,
}

impl Toolchain {
    fn image_name(&self) -> &str {
        self.image.as_ref().map(|i| i.name.as_str()).unwrap_or("")
    }
}

/// Where one build's inputs and outputs live.
#[derive(Debug, Clone)]
pub struct Layout {
    pub src_parent: PathBuf,
    pub src: PathBuf,
    pub build: PathBuf,
    pub kconfig: PathBuf,
}

impl Layout {
    /// The layout of a variant's build; extra `-K` options get a build tree
    /// of their own (named by their hash), so they never disturb the plain one.
    pub fn with_extra(paths: &Paths, version: &str, variant: Variant, extra: &str) -> Layout {
        let mut l = Layout::new(paths, version, variant);
        if !extra.is_empty() {
            let h = hex(&Sha256::digest(extra.as_bytes()));
            l.build = l
                .build
                .with_file_name(format!("{}-{}", variant.name(), &h[..8]));
        }
        l
    }

    pub fn new(paths: &Paths, version: &str, variant: Variant) -> Layout {
        let src_parent = paths
            .src_root()
            .join(format!("{LINUX_SOURCE_PACKAGE}_{version}"));
        Layout {
            src: src_parent.join(LINUX_SOURCE_PACKAGE),
            src_parent,
            build: paths.build_root().join(version).join(variant.name()),
            kconfig: paths.kconfig_dir(),
        }
    }
}

/// The fragments merged for `variant`, in order (later ones win).
pub fn fragments(paths: &Paths, variant: Variant) -> Vec<PathBuf> {
    vec![
        paths.kconfig_dir().join("phyfarm.config"),
        paths
            .kconfig_dir()
            .join(format!("variant-{}.config", variant.name())),
    ]
}

fn job(tc: &Toolchain, l: &Layout, argv: &[&str]) -> Job {
    Job::new(tc.image_name(), "/build", argv)
        .mount(&l.src, "/src", true)
        .mount(&l.build, "/build", false)
        .mount(&l.kconfig, "/phyfarm", true)
        .env("ARCH", "x86_64")
}

/// The configure steps, in order.
pub fn configure_jobs(tc: &Toolchain, l: &Layout, variant: Variant, extra: bool) -> Vec<Job> {
    let mut merge = vec![
        "/src/scripts/kconfig/merge_config.sh".to_string(),
        "-m".into(),
        "-O".into(),
        "/build".into(),
        "/build/.config".into(),
        "/src/kernel/configs/kvm_guest.config".into(),
        "/phyfarm/phyfarm.config".into(),
        format!("/phyfarm/variant-{}.config", variant.name()),
    ];
    if extra {
        merge.push("/build/.phyfarm-extra.config".into());
    }
    let merge: Vec<&str> = merge.iter().map(String::as_str).collect();
    vec![
        job(
            tc,
            l,
            &[
                "make",
                "-s",
                "-C",
                "/src",
                "O=/build",
                "ARCH=x86_64",
                "tinyconfig",
            ],
        ),
        job(tc, l, &merge),
        job(
            tc,
            l,
            &[
                "make",
                "-s",
                "-C",
                "/src",
                "O=/build",
                "ARCH=x86_64",
                "olddefconfig",
            ],
        ),
    ]
}

pub fn make_job(tc: &Toolchain, l: &Layout, jobs: usize) -> Job {
    let j = format!("-j{jobs}");
    job(
        tc,
        l,
        &[
            "make",
            "-C",
            "/src",
            "O=/build",
            "ARCH=x86_64",
            &j,
            "bzImage",
        ],
    )
}

pub fn extract_job(tc: &Toolchain, tmp: &Path) -> Job {
    let tarball = format!("/usr/src/{LINUX_SOURCE_PACKAGE}.tar.xz");
    Job::new(
        tc.image_name(),
        "/out",
        &["tar", "-C", "/out", "-xf", &tarball],
    )
    .mount(tmp, "/out", false)
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

fn need_space(dir: &Path, need: u64, what: &str) -> Result<()> {
    let free = free_space(dir);
    if free < need {
        bail!(
            "not enough disk space for {what}: {} has {:.1} GB free, {:.1} GB needed; free some space or set PHYFARM_CACHE to a larger disk",
            dir.display(),
            free as f64 / 1e9,
            need as f64 / 1e9
        );
    }
    Ok(())
}

/// Resolve the toolchain: the kbuild image (built if needed) or the host.
pub fn toolchain(paths: &Paths, runtime: Runtime, dry_run: bool) -> Result<Toolchain> {
    match runtime {
        Runtime::Podman => {
            if dry_run {
                let tag = images::tag(paths, ImageKind::Kbuild)?;
                return Ok(Toolchain {
                    image: Some(ImageRef {
                        name: tag,
                        id: String::new(),
                    }),
                    kernel_version: "VERSION".into(),
                    tools: Versions::new(),
                });
            }
            let img = images::ensure(paths, ImageKind::Kbuild)?;
            let kernel_version = img
                .packages
                .get(LINUX_SOURCE_PACKAGE)
                .cloned()
                .with_context(|| format!("image {} has no {LINUX_SOURCE_PACKAGE}", img.tag))?;
            let mut tools = img.tools.clone();
            for p in ["rustc", "bindgen", "clang", "gcc", "rust-src"] {
                if let Some(v) = img.packages.get(p) {
                    tools.insert(format!("{p} (deb)"), v.clone());
                }
            }
            Ok(Toolchain {
                image: Some(ImageRef {
                    name: img.tag,
                    id: img.id,
                }),
                kernel_version,
                tools,
            })
        }
        Runtime::Host => {
            let q = progress::capture(
                &[
                    "dpkg-query".into(),
                    "-W".into(),
                    "-f".into(),
                    "${Version}".into(),
                    LINUX_SOURCE_PACKAGE.into(),
                ],
                &[],
            )
            .map_err(|_| {
                anyhow::anyhow!(
                    "--runtime host needs {LINUX_SOURCE_PACKAGE} installed on the host (apt-get install {LINUX_SOURCE_PACKAGE} rustc rust-src bindgen clang lld)"
                )
            })?;
            let mut tools = Versions::new();
            for t in ["rustc", "bindgen", "clang", "gcc", "make"] {
                if let Ok(out) = progress::capture(&[t.into(), "--version".into()], &[]) {
                    tools.insert(
                        t.into(),
                        out.lines().next().unwrap_or("").trim().to_string(),
                    );
                }
            }
            Ok(Toolchain {
                image: None,
                kernel_version: q.trim().to_string(),
                tools,
            })
        }
    }
}

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

fn config_inputs_hash(l: &Layout, frags: &[PathBuf], extra: &str, version: &str) -> String {
    let mut h = Sha256::new();
    h.update(version.as_bytes());
    for f in frags {
        h.update(std::fs::read(f).unwrap_or_default());
        h.update([0]);
    }
    h.update(std::fs::read(l.src.join("kernel/configs/kvm_guest.config")).unwrap_or_default());
    h.update(extra.as_bytes());
    hex(&h.finalize())
}

/// Turn `-K` options into a fragment text, validating their shape.
pub fn extra_fragment(extra: &[String]) -> Result<String> {
    let mut text = String::new();
    for (i, e) in extra.iter().enumerate() {
        let line = if let Some(name) = e.strip_suffix("=n") {
            format!("# {name} is not set")
        } else {
            e.clone()
        };
        kconfig::parse_fragment_text(Path::new("-K"), &line)
            .ok()
            .filter(|r| r.len() == 1)
            .with_context(|| format!("-K option {} (`{e}`) is not CONFIG_NAME=value", i + 1))?;
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

/// Build one variant. Returns Pass, or Fail when the kernel did not build.
pub fn build(paths: &Paths, opts: &BuildOptions) -> Result<Outcome> {
    let variant = opts.variant;
    let extra = extra_fragment(&opts.extra)?;
    for f in fragments(paths, variant) {
        kconfig::parse_fragment(&f)?;
    }
    let mut durations: Vec<(String, f64)> = Vec::new();
    let t0 = Instant::now();
    let tc = toolchain(paths, opts.runtime, opts.dry_run)?;
    durations.push(("images".into(), t0.elapsed().as_secs_f64()));
    let l = Layout::with_extra(paths, &tc.kernel_version, variant, &extra);
    let env = opts.runtime.env(&paths.repo);

    if opts.dry_run {
        let tmp = l.src_parent.with_extension("tmp");
        let mut all = vec![extract_job(&tc, &tmp)];
        all.extend(configure_jobs(&tc, &l, variant, !extra.is_empty()));
        all.push(make_job(&tc, &l, opts.jobs));
        for j in &all {
            let (argv, cwd) = opts.runtime.argv(j);
            match cwd {
                Some(d) => println!(
                    "(cd {} && {})",
                    shell_quote(&[d.display().to_string()]),
                    shell_quote(&argv)
                ),
                None => println!("{}", shell_quote(&argv)),
            }
        }
        return Ok(Outcome::Pass);
    }

    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create output directory {}", opts.out.display()))?;
    let log_path = opts.out.join("build.log");
    let mut log =
        File::create(&log_path).with_context(|| format!("cannot write {}", log_path.display()))?;
    writeln!(log, "# reproduce: {}", opts.reproducer)?;
    writeln!(
        log,
        "# kernel: {LINUX_SOURCE_PACKAGE} {}",
        tc.kernel_version
    )?;
    if let Some(i) = &tc.image {
        writeln!(log, "# image: {} {}", i.name, i.id)?;
    }
    for (k, v) in &tc.tools {
        writeln!(log, "# {k}: {v}")?;
    }
    let started = metadata::now_rfc3339();
    let label = format!("[{variant}]");
    let mut run = Run::new(opts.runtime, env, &mut log, &label);

    // 1. Source, extracted once per package version.
    let t = Instant::now();
    if !l.src.join("Makefile").is_file() {
        need_space(
            &paths.cache,
            SOURCE_SPACE + BUILD_SPACE,
            "the kernel source",
        )?;
        let tmp = l.src_parent.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        if let Some(code) = run.job(&extract_job(&tc, &tmp), "extracting kernel source")? {
            bail!(
                "extracting {LINUX_SOURCE_PACKAGE} failed (exit {code}); see {}",
                log_path.display()
            );
        }
        let _ = std::fs::remove_dir_all(&l.src_parent);
        std::fs::rename(&tmp, &l.src_parent)?;
    }
    durations.push(("source".into(), t.elapsed().as_secs_f64()));

    // 2. Build tree: start from the plain tree of this variant (for -K
    // builds) or from the other variant's, if one has been built.
    if !l.build.join(".config").is_file() {
        need_space(&paths.cache, BUILD_SPACE, "the build tree")?;
        let plain = Layout::new(paths, &tc.kernel_version, variant).build;
        let other = Layout::new(paths, &tc.kernel_version, variant.other()).build;
        let seed = [plain, other]
            .into_iter()
            .find(|t| *t != l.build && t.join(".phyfarm-built").is_file());
        if let Some(other) = seed {
            info(&format!(
                "{label}: starting from the build tree {}",
                other.display()
            ));
            copy_tree(&other, &l.build)?;
            let _ = std::fs::remove_file(l.build.join(".phyfarm-built"));
        }
    }
    std::fs::create_dir_all(&l.build)?;
    let _lock = lock(&l.build.with_extension("lock"), &label)?;

    // 3. Configure, unless the inputs are unchanged.
    let t = Instant::now();
    let frags = fragments(paths, variant);
    let stamp = l.build.join(".phyfarm-config-inputs");
    let want = config_inputs_hash(&l, &frags, &extra, &tc.kernel_version);
    let fresh = std::fs::read_to_string(&stamp)
        .map(|s| s.trim() == want)
        .unwrap_or(false)
        && l.build.join(".config").is_file();
    if !fresh {
        std::fs::write(l.build.join(".phyfarm-extra.config"), &extra)?;
        let steps = ["tinyconfig", "merge_config.sh", "olddefconfig"];
        for (j, step) in configure_jobs(&tc, &l, variant, !extra.is_empty())
            .iter()
            .zip(steps)
        {
            if let Some(code) = run.job(j, &format!("configure: {step}"))? {
                bail!(
                    "configuring the kernel failed (exit {code}); see {}",
                    log_path.display()
                );
            }
        }
    } else {
        info(&format!("{label}: configuration unchanged"));
    }
    // Verify every requested option, every time.
    let mut requests = Vec::new();
    for f in &frags {
        requests.extend(kconfig::parse_fragment(f)?);
    }
    requests.extend(kconfig::parse_fragment_text(Path::new("-K"), &extra)?);
    let requests = kconfig::last_wins(requests);
    let dotconfig = String::from_utf8_lossy(&crate::safe_fs::read_in(
        &l.build,
        Path::new(".config"),
        64 << 20,
    )?)
    .into_owned();
    let cfg = kconfig::parse_dotconfig(&dotconfig);
    if let Err(e) = kconfig::verify(&requests, &cfg, &SourceTree::new(&l.src)) {
        let _ = std::fs::remove_file(&stamp);
        return Err(e.into());
    }
    std::fs::write(&stamp, &want)?;
    durations.push(("configure".into(), t.elapsed().as_secs_f64()));

    // 4. Build.
    let t = Instant::now();
    let failed = run.job(&make_job(&tc, &l, opts.jobs), "make bzImage")?;
    let stopped = run.stopped.take();
    durations.push(("build".into(), t.elapsed().as_secs_f64()));
    drop(run);
    log.flush()?;

    let status = match failed {
        None => Status::Pass,
        Some(code) if infra_exit(opts.runtime, code) => Status::Error,
        Some(_) => Status::Fail,
    };
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    record_base_warnings(&l.build, &crate::warnings::parse(&log_text))?;
    let mut artifacts = BTreeMap::new();
    let mut log_excerpt = Vec::new();
    let mut status = status;
    if status == Status::Pass {
        match copy_artifacts(&l.build, &opts.out) {
            Ok(copied) => {
                std::fs::write(l.build.join(".phyfarm-built"), "")?;
                artifacts.extend(copied);
            }
            Err(e) if e.is_refusal() => {
                // The build left a link (or a non-file) where an artifact
                // belongs: the code under test did that.
                status = Status::Fail;
                log_excerpt = vec![format!("refused to copy an artifact: {e}")];
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        log_excerpt = metadata::error_excerpt(&log_text, 20);
        if let Some(why) = &stopped {
            log_excerpt.insert(0, format!("phyfarm stopped the build: {why}"));
        }
    }
    artifacts.insert("build.log".into(), log_path.display().to_string());
    let meta = BuildMetadata {
        schema: 1,
        reproducer: opts.reproducer.clone(),
        variant: variant.name().into(),
        runtime: format!("{:?}", opts.runtime).to_lowercase(),
        kernel_package: LINUX_SOURCE_PACKAGE.into(),
        kernel_version: tc.kernel_version.clone(),
        image: tc.image.clone(),
        tools: tc.tools.clone(),
        config_hash: Some(hex(&Sha256::digest(dotconfig.as_bytes()))),
        fragments: frags.iter().map(|f| f.display().to_string()).collect(),
        durations: durations.clone(),
        status,
        log_excerpt: log_excerpt.clone(),
        started,
        finished: metadata::now_rfc3339(),
        artifacts,
    };
    metadata::write_json_atomic(&opts.out.join("metadata.json"), &meta)?;
    let timing: Vec<String> = durations
        .iter()
        .map(|(k, v)| format!("{k} {v:.0}s"))
        .collect();
    info(&format!("{label}: {}", timing.join(", ")));
    match status {
        Status::Pass => {
            info(&format!("{label}: build PASS"));
            println!("{}", opts.out.display());
            Ok(Outcome::Pass)
        }
        Status::Fail => {
            eprintln!("E: {label}: build FAIL; first errors:");
            for l in log_excerpt.iter().take(10) {
                eprintln!("E:   {}", progress::printable(l));
            }
            eprintln!("E: full log: {}", log_path.display());
            println!("{}", opts.out.display());
            Ok(Outcome::Fail)
        }
        _ => bail!(
            "the build could not run (podman failed); see {}",
            log_path.display()
        ),
    }
}

/// `phyfarm sandbox-make`: `make -C /build TARGETS` in `tree`, in the
/// kbuild image and the build sandbox, then the artifacts copied out as a
/// build does. Pass, Fail (make failed, a limit stopped it, or an
/// artifact was refused), or an error when it could not run.
pub fn sandbox_make(
    paths: &Paths,
    runtime: Runtime,
    tree: &Path,
    out: &Path,
    targets: &[String],
    reproducer: &str,
) -> Result<Outcome> {
    if !tree.is_dir() || crate::safe_fs::is_symlink(tree) {
        bail!("{}: not a directory", tree.display());
    }
    let tc = toolchain(paths, runtime, false)?;
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create output directory {}", out.display()))?;
    let log_path = out.join("build.log");
    let mut log = File::create(&log_path)?;
    writeln!(log, "# reproduce: {reproducer}")?;
    let mut argv = vec!["make", "-C", "/build"];
    argv.extend(targets.iter().map(String::as_str));
    let job = Job::new(tc.image_name(), "/build", &argv)
        .mount(tree, "/build", false)
        .env("ARCH", "x86_64");
    let mut run = Run::new(runtime, runtime.env(&paths.repo), &mut log, "[sandbox]");
    let failed = run.job(&job, &format!("make {}", targets.join(" ")))?;
    let stopped = run.stopped.take();
    drop(run);
    let outcome = match (failed, stopped) {
        (_, Some(why)) => {
            eprintln!("E: [sandbox] FAIL: phyfarm stopped make: {why}");
            Outcome::Fail
        }
        (Some(code), None) if infra_exit(runtime, code) => {
            bail!("podman could not run make; see {}", log_path.display())
        }
        (Some(code), None) => {
            eprintln!(
                "E: [sandbox] FAIL: make exited {code}; see {}",
                log_path.display()
            );
            Outcome::Fail
        }
        (None, None) => match copy_artifacts(tree, out) {
            Ok(_) => {
                info("[sandbox] PASS: make succeeded and its artifacts were copied");
                Outcome::Pass
            }
            Err(e) if e.is_refusal() => {
                eprintln!("E: [sandbox] FAIL: refused to copy an artifact: {e}");
                Outcome::Fail
            }
            Err(e) => return Err(e.into()),
        },
    };
    println!("{}", out.display());
    Ok(outcome)
}

/// The files a kernel build hands on, as (artifact name, path in the tree,
/// file name in the output folder).
pub const ARTIFACTS: [(&str, &str, &str); 3] = [
    ("bzImage", "arch/x86/boot/bzImage", "bzImage"),
    ("config", ".config", ".config"),
    ("System.map", "System.map", "System.map"),
];

/// Copy the build's artifacts out of `tree` into `out`, opening each
/// without following links (crate::safe_fs): a build that turned one into
/// a link to a runner file is refused, naming the artifact.
pub fn copy_artifacts(
    tree: &Path,
    out: &Path,
) -> Result<BTreeMap<String, String>, crate::safe_fs::SafeFsError> {
    let mut done = BTreeMap::new();
    for (name, from, to) in ARTIFACTS {
        let dest = out.join(to);
        crate::safe_fs::copy_out(tree, Path::new(from), &dest)?;
        done.insert(name.to_string(), dest.display().to_string());
    }
    Ok(done)
}

/// Copy a tree with `cp -a` (mtimes kept, so kbuild sees nothing changed;
/// reflinks where the file system has them) into a temporary sibling, then
/// rename it over `to`: a copy cut short never looks like a tree.
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let tmp = to.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let st = std::process::Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(from)
        .arg(&tmp)
        .status()
        .context("cannot run cp")?;
    if !st.success() {
        bail!("copying {} to {} failed", from.display(), tmp.display());
    }
    let _ = std::fs::remove_dir_all(to);
    std::fs::rename(&tmp, to)?;
    Ok(())
}

/// The warning keys every base build of a tree has shown (incremental builds
/// only show the warnings of what they recompiled, so the set accumulates).
pub fn base_warning_keys(build: &Path) -> std::collections::BTreeSet<String> {
    metadata::read_json(&build.join(".phyfarm-warnings.json"))
        .ok()
        .flatten()
        .unwrap_or_default()
}

fn record_base_warnings(build: &Path, found: &[crate::warnings::Warning]) -> Result<()> {
    let mut keys = base_warning_keys(build);
    let before = keys.len();
    keys.extend(found.iter().map(|w| w.key.clone()));
    if keys.len() != before || !build.join(".phyfarm-warnings.json").exists() {
        metadata::write_json_atomic(&build.join(".phyfarm-warnings.json"), &keys)?;
    }
    Ok(())
}

/// An exclusive lock on a build tree, held for the guard's life.
pub struct Lock(#[allow(dead_code)] File);

pub(crate) fn lock(path: &Path, label: &str) -> Result<Lock> {
    use std::os::fd::AsRawFd;
    let f = File::create(path)?;
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        info(&format!("{label}: waiting for another build of this tree"));
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!("cannot lock {}", path.display());
        }
    }
    Ok(Lock(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tc() -> Toolchain {
        Toolchain {
            image: Some(ImageRef {
                name: "localhost/phyfarm-kbuild:x".into(),
                id: "id".into(),
            }),
            kernel_version: "6.12.1-1".into(),
            tools: Versions::new(),
        }
    }

    fn paths() -> Paths {
        Paths {
            repo: "/repo".into(),
            cache: "/cache".into(),
        }
    }

    #[test]
    fn layout_is_keyed_by_version_and_variant() {
        let l = Layout::new(&paths(), "6.12.1-1", Variant::C);
        assert_eq!(
            l.src,
            Path::new("/cache/src/linux-source-6.12_6.12.1-1/linux-source-6.12")
        );
        assert_eq!(l.build, Path::new("/cache/build/6.12.1-1/c"));
    }

    #[test]
    fn copy_tree_keeps_mtimes_and_replaces_the_destination() {
        let d = tempfile::tempdir().unwrap();
        let (from, to) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir_all(from.join("sub")).unwrap();
        std::fs::write(from.join("sub/x.o"), "obj").unwrap();
        std::fs::create_dir_all(&to).unwrap();
        std::fs::write(to.join("stale"), "old").unwrap();
        copy_tree(&from, &to).unwrap();
        assert_eq!(std::fs::read_to_string(to.join("sub/x.o")).unwrap(), "obj");
        assert!(!to.join("stale").exists());
        assert!(!to.with_extension("tmp").exists());
        let m = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        assert_eq!(m(&from.join("sub/x.o")), m(&to.join("sub/x.o")));
    }

    #[test]
    fn extra_options_get_their_own_tree() {
        let plain = Layout::with_extra(&paths(), "v", Variant::Rust, "");
        let k = Layout::with_extra(&paths(), "v", Variant::Rust, "CONFIG_KUNIT=y\n");
        assert_eq!(plain.build, Path::new("/cache/build/v/rust"));
        assert_ne!(k.build, plain.build);
        assert!(k
            .build
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("rust-"));
        assert_eq!(k.src, plain.src);
    }

    #[test]
    fn configure_merges_the_variant_fragment() {
        let l = Layout::new(&paths(), "v", Variant::Rust);
        let jobs = configure_jobs(&tc(), &l, Variant::Rust, false);
        assert_eq!(jobs[0].argv.last().unwrap(), "tinyconfig");
        assert!(jobs[1]
            .argv
            .contains(&"/phyfarm/variant-rust.config".to_string()));
        assert!(jobs[1]
            .argv
            .contains(&"/src/kernel/configs/kvm_guest.config".to_string()));
        assert_eq!(jobs[2].argv.last().unwrap(), "olddefconfig");
        let c = configure_jobs(&tc(), &l, Variant::C, true);
        assert!(c[1].argv.contains(&"/phyfarm/variant-c.config".to_string()));
        assert!(c[1]
            .argv
            .contains(&"/build/.phyfarm-extra.config".to_string()));
    }

    #[test]
    fn make_job_is_64_bit_and_out_of_tree() {
        let l = Layout::new(&paths(), "v", Variant::Rust);
        let (argv, _) = Runtime::Podman.argv(&make_job(&tc(), &l, 2));
        let s = argv.join(" ");
        assert!(s.contains("--network=none"), "{s}");
        assert!(
            s.ends_with("make -C /src O=/build ARCH=x86_64 -j2 bzImage"),
            "{s}"
        );
        assert!(
            s.contains("src=/cache/src/linux-source-6.12_v/linux-source-6.12,dst=/src,ro"),
            "{s}"
        );
    }

    #[test]
    fn extra_options_become_a_fragment() {
        let f = extra_fragment(&["CONFIG_KUNIT=y".into(), "CONFIG_X=n".into()]).unwrap();
        assert_eq!(f, "CONFIG_KUNIT=y\n# CONFIG_X is not set\n");
        let err = extra_fragment(&["KUNIT=y".into()]).unwrap_err().to_string();
        assert!(err.contains("-K option 1 (`KUNIT=y`)"), "{err}");
    }

    #[test]
    fn free_space_walks_up_to_an_existing_dir() {
        assert!(free_space(Path::new("/tmp/does/not/exist/yet")) > 0);
        let err = need_space(Path::new("/tmp"), u64::MAX - 1, "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not enough disk space"), "{err}");
    }
}
