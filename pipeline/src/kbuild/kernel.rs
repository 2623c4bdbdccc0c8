//! `phyfarm build`: the distro kernel source, extracted once into the cache,
//! configured from the repository's fragments (tinyconfig + kvm_guest.config +
//! phyfarm.config + the variant), verified, and built into bzImage, in the
//! kbuild container or on the host.
//!
//! One file over 500 lines: the base build from extraction to bzImage, in
//! the order it runs; the step runner is `steps.rs`, the tests `kernel/tests.rs`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::config::{Paths, Variant};
use crate::kbuild::images::{self, hex, ImageKind, LINUX_SOURCE_PACKAGE};
use crate::kbuild::kconfig::{self, SourceTree};
use crate::kbuild::metadata::{self, BuildMetadata, ImageRef, Status, Versions};
use crate::kbuild::steps::{free_space, infra_exit, Run};
use crate::progress::{self, info};
use crate::sandbox::runtime::{shell_quote, Job, Runtime};
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
    // `make -s … tinyconfig`, then the fragments merged, then olddefconfig.
    let quiet = |target: &'static str| -> Vec<&'static str> {
        let (make, rest) = KBUILD_MAKE.split_first().expect("KBUILD_MAKE names make");
        [*make, "-s"]
            .into_iter()
            .chain(rest.iter().copied())
            .chain([target])
            .collect()
    };
    vec![
        job(tc, l, &quiet("tinyconfig")),
        job(tc, l, &merge),
        job(tc, l, &quiet("olddefconfig")),
    ]
}

/// The kernel's make command line up to its options and targets: the
/// source mounted at `/src`, the build tree at `/build`, 64-bit.
pub const KBUILD_MAKE: [&str; 5] = ["make", "-C", "/src", "O=/build", "ARCH=x86_64"];

/// `make … -jN bzImage`: the kernel build, as a base build and every series
/// build step (after each patch, and its KUnit build) run it.
pub fn bzimage_argv(jobs: usize) -> Vec<String> {
    KBUILD_MAKE
        .iter()
        .map(|s| s.to_string())
        .chain([format!("-j{jobs}"), "bzImage".to_string()])
        .collect()
}

pub fn make_job(tc: &Toolchain, l: &Layout, jobs: usize) -> Job {
    let argv = bzimage_argv(jobs);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    job(tc, l, &argv)
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

/// What the four steps of one build share: its inputs, the toolchain and
/// layout they resolve to, the build's label and log, and the time each
/// step took.
struct KernelBuild<'a> {
    paths: &'a Paths,
    opts: &'a BuildOptions,
    tc: Toolchain,
    l: Layout,
    /// The `-K` options, as a fragment.
    extra: String,
    frags: Vec<PathBuf>,
    label: String,
    log_path: PathBuf,
    started: String,
    durations: Vec<(String, f64)>,
}

/// Build one variant. Returns Pass, or Fail when the kernel did not build.
pub fn build(paths: &Paths, opts: &BuildOptions) -> Result<Outcome> {
    let variant = opts.variant;
    let extra = extra_fragment(&opts.extra)?;
    let frags = fragments(paths, variant);
    for f in &frags {
        kconfig::parse_fragment(f)?;
    }
    let t0 = Instant::now();
    let tc = toolchain(paths, opts.runtime, opts.dry_run)?;
    let durations = vec![("images".to_string(), t0.elapsed().as_secs_f64())];
    let l = Layout::with_extra(paths, &tc.kernel_version, variant, &extra);
    let env = opts.runtime.env(&paths.repo);

    if opts.dry_run {
        print_dry_run(opts, &tc, &l, !extra.is_empty());
        return Ok(Outcome::Pass);
    }

    let (log_path, mut log) = open_build_log(opts, &tc)?;
    let mut b = KernelBuild {
        paths,
        opts,
        tc,
        l,
        extra,
        frags,
        label: format!("[{variant}]"),
        log_path,
        started: metadata::now_rfc3339(),
        durations,
    };
    let mut run = Run::new(opts.runtime, env, &mut log, &b.label);
    b.extract_source(&mut run)?;
    // Held until the build's outputs are written.
    let _lock = b.prepare_build_tree()?;
    let dotconfig = b.configure(&mut run)?;
    let (failed, stopped) = b.make_bzimage(&mut run)?;
    drop(run);
    log.flush()?;
    let (status, log_excerpt) = b.write_outputs(failed, stopped.as_deref(), &dotconfig)?;
    b.report(status, &log_excerpt)
}

/// `phyfarm build --dry-run`: print every command the build would run.
fn print_dry_run(opts: &BuildOptions, tc: &Toolchain, l: &Layout, extra: bool) {
    let tmp = l.src_parent.with_extension("tmp");
    let mut all = vec![extract_job(tc, &tmp)];
    all.extend(configure_jobs(tc, l, opts.variant, extra));
    all.push(make_job(tc, l, opts.jobs));
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
}

/// The build's `build.log` in its output folder, opened with its header
/// (reproducer, kernel, image and tools).
fn open_build_log(opts: &BuildOptions, tc: &Toolchain) -> Result<(PathBuf, File)> {
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
    Ok((log_path, log))
}

impl KernelBuild<'_> {
    /// Step 1: source, extracted once per package version.
    fn extract_source(&mut self, run: &mut Run) -> Result<()> {
        let (tc, l) = (&self.tc, &self.l);
        let t = Instant::now();
        if !l.src.join("Makefile").is_file() {
            need_space(
                &self.paths.cache,
                SOURCE_SPACE + BUILD_SPACE,
                "the kernel source",
            )?;
            let tmp = l.src_parent.with_extension("tmp");
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp)?;
            if let Some(code) = run.job(&extract_job(tc, &tmp), "extracting kernel source")? {
                bail!(
                    "extracting {LINUX_SOURCE_PACKAGE} failed (exit {code}); see {}",
                    self.log_path.display()
                );
            }
            let _ = std::fs::remove_dir_all(&l.src_parent);
            std::fs::rename(&tmp, &l.src_parent)?;
        }
        self.durations
            .push(("source".into(), t.elapsed().as_secs_f64()));
        Ok(())
    }

    /// Step 2, the build tree: start from the plain tree of this variant (for -K
    /// builds) or from the other variant's, if one has been built. Locked
    /// first: a concurrent build of this tree waits instead of copying into
    /// it at the same time. Returns the tree's lock.
    fn prepare_build_tree(&self) -> Result<Lock> {
        let (l, label, variant) = (&self.l, &self.label, self.opts.variant);
        if let Some(parent) = l.build.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let lock = lock(&l.build.with_extension("lock"), label)?;
        if !l.build.join(".config").is_file() {
            need_space(&self.paths.cache, BUILD_SPACE, "the build tree")?;
            let plain = Layout::new(self.paths, &self.tc.kernel_version, variant).build;
            let other = Layout::new(self.paths, &self.tc.kernel_version, variant.other()).build;
            let seed = [plain, other]
                .into_iter()
                .find(|t| *t != l.build && t.join(".phyfarm-built").is_file());
            if let Some(other) = seed {
                info(&format!(
                    "{label}: starting from the build tree {}",
                    other.display()
                ));
                copy_built_tree(&other, &l.build, label)?;
                let _ = std::fs::remove_file(l.build.join(".phyfarm-built"));
            }
        }
        std::fs::create_dir_all(&l.build)?;
        Ok(lock)
    }

    /// Step 3: configure, unless the inputs are unchanged; then verify every
    /// requested option, every time. Returns the `.config`.
    fn configure(&mut self, run: &mut Run) -> Result<String> {
        let (tc, l, extra) = (&self.tc, &self.l, &self.extra);
        let t = Instant::now();
        let stamp = l.build.join(".phyfarm-config-inputs");
        let want = config_inputs_hash(l, &self.frags, extra, &tc.kernel_version);
        let fresh = std::fs::read_to_string(&stamp)
            .map(|s| s.trim() == want)
            .unwrap_or(false)
            && l.build.join(".config").is_file();
        if !fresh {
            std::fs::write(l.build.join(".phyfarm-extra.config"), extra)?;
            let steps = ["tinyconfig", "merge_config.sh", "olddefconfig"];
            for (j, step) in configure_jobs(tc, l, self.opts.variant, !extra.is_empty())
                .iter()
                .zip(steps)
            {
                if let Some(code) = run.job(j, &format!("configure: {step}"))? {
                    bail!(
                        "configuring the kernel failed (exit {code}); see {}",
                        self.log_path.display()
                    );
                }
            }
        } else {
            info(&format!("{}: configuration unchanged", self.label));
        }
        let mut requests = Vec::new();
        for f in &self.frags {
            requests.extend(kconfig::parse_fragment(f)?);
        }
        requests.extend(kconfig::parse_fragment_text(Path::new("-K"), extra)?);
        let requests = kconfig::last_wins(requests);
        let dotconfig = String::from_utf8_lossy(&crate::sandbox::safe_fs::read_in(
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
        self.durations
            .push(("configure".into(), t.elapsed().as_secs_f64()));
        Ok(dotconfig)
    }

    /// Step 4: `make bzImage`. Returns make's exit code if it failed, and
    /// why phyfarm stopped it if it did.
    fn make_bzimage(&mut self, run: &mut Run) -> Result<(Option<i32>, Option<String>)> {
        let t = Instant::now();
        let failed = run.job(&make_job(&self.tc, &self.l, self.opts.jobs), "make bzImage")?;
        let stopped = run.stopped.take();
        self.durations
            .push(("build".into(), t.elapsed().as_secs_f64()));
        Ok((failed, stopped))
    }

    /// After `make bzImage`: the tree's base warnings, the artifacts copied
    /// out and `metadata.json` written. Returns the build's status and the
    /// excerpt of its log.
    fn write_outputs(
        &self,
        failed: Option<i32>,
        stopped: Option<&str>,
        dotconfig: &str,
    ) -> Result<(Status, Vec<String>)> {
        let (opts, l) = (self.opts, &self.l);
        let status = match failed {
            None => Status::Pass,
            Some(code) if infra_exit(opts.runtime, code) => Status::Error,
            Some(_) => Status::Fail,
        };
        let log_text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        write_base_warnings(&l.build, &crate::kbuild::warnings::parse(&log_text))?;
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
            if let Some(why) = stopped {
                log_excerpt.insert(0, format!("phyfarm stopped the build: {why}"));
            }
        }
        artifacts.insert("build.log".into(), self.log_path.display().to_string());
        let meta = BuildMetadata {
            schema: 1,
            reproducer: opts.reproducer.clone(),
            variant: opts.variant.name().into(),
            runtime: format!("{:?}", opts.runtime).to_lowercase(),
            kernel_package: LINUX_SOURCE_PACKAGE.into(),
            kernel_version: self.tc.kernel_version.clone(),
            image: self.tc.image.clone(),
            tools: self.tc.tools.clone(),
            config_hash: Some(hex(&Sha256::digest(dotconfig.as_bytes()))),
            fragments: self.frags.iter().map(|f| f.display().to_string()).collect(),
            durations: self.durations.clone(),
            status,
            log_excerpt: log_excerpt.clone(),
            started: self.started.clone(),
            finished: metadata::now_rfc3339(),
            artifacts,
        };
        metadata::write_json_atomic(&opts.out.join("metadata.json"), &meta)?;
        Ok((status, log_excerpt))
    }

    /// The build's timing and verdict, on the terminal.
    fn report(&self, status: Status, log_excerpt: &[String]) -> Result<Outcome> {
        let label = &self.label;
        let timing: Vec<String> = self
            .durations
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}s"))
            .collect();
        info(&format!("{label}: {}", timing.join(", ")));
        match status {
            Status::Pass => {
                info(&format!("{label}: build PASS"));
                Ok(Outcome::Pass)
            }
            Status::Fail => {
                eprintln!("E: {label}: build FAIL; first errors:");
                for l in log_excerpt.iter().take(10) {
                    eprintln!("E:   {}", progress::printable(l));
                }
                eprintln!("E: full log: {}", self.log_path.display());
                Ok(Outcome::Fail)
            }
            _ => bail!(
                "the build could not run (podman failed); see {}",
                self.log_path.display()
            ),
        }
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
    if !tree.is_dir() || crate::sandbox::safe_fs::is_symlink(tree) {
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
/// without following links (crate::sandbox::safe_fs): a build that turned one into
/// a link to a runner file is refused, naming the artifact.
pub fn copy_artifacts(
    tree: &Path,
    out: &Path,
) -> Result<BTreeMap<String, String>, crate::sandbox::safe_fs::SafeFsError> {
    let mut done = BTreeMap::new();
    for (name, from, to) in ARTIFACTS {
        let dest = out.join(to);
        crate::sandbox::safe_fs::copy_out(tree, Path::new(from), &dest)?;
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

/// Copy a build tree that another build may be writing, under that tree's
/// lock: the copy is of a finished tree (a concurrent build of it, from
/// another `phyfarm build` or `phyfarm run`, is waited for).
pub fn copy_built_tree(from: &Path, to: &Path, label: &str) -> Result<()> {
    let _lock = lock(&from.with_extension("lock"), label)?;
    copy_tree(from, to)
}

/// The warning keys every base build of a tree has shown (incremental builds
/// only show the warnings of what they recompiled, so the set accumulates).
pub fn base_warning_keys(build: &Path) -> std::collections::BTreeSet<String> {
    metadata::read_json(&build.join(".phyfarm-warnings.json"))
        .ok()
        .flatten()
        .unwrap_or_default()
}

fn write_base_warnings(build: &Path, found: &[crate::kbuild::warnings::Warning]) -> Result<()> {
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
mod tests;
