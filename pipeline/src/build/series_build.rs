//! `phyfarm build --series DIR`: apply a revision patch by patch onto the
//! distro tree, build after every patch in each variant (incrementally, from
//! the base build trees), count new warnings against the base, and run the
//! Rust gates on the result. Everything lands in one output folder with a
//! `series-build.json` summary.
//!
//! One file over 500 lines: `build_series_summary` walks the steps in the
//! order they run (base, tree, apply and build per patch, gates, KUnit,
//! artifacts), read top to bottom; the gates are in `series_build/gates.rs`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::build::apply::{self, ApplyReport, ApplyState, Trees, BASE_TAG};
use crate::build::kernel::{self, BuildOptions, Layout, Toolchain};
use crate::build::metadata::{self, BuildMetadata, Status};
use crate::build::steps::Run;
use crate::build::warnings::{self, Warning};
use crate::config::{Paths, Variant};
use crate::ingest::series::{self, Series};
use crate::progress::{info, warn};
use crate::sandbox::runtime::{Job, Runtime};
use crate::Outcome;

mod gates;
pub use gates::{gate_scopes, gate_target, ENUM_CHECK_OUTPUT, GATES};

#[derive(Debug, Clone)]
pub struct SeriesBuildOptions {
    pub dir: PathBuf,
    pub variants: Vec<Variant>,
    pub out: PathBuf,
    pub runtime: Runtime,
    pub jobs: usize,
    pub gates: bool,
    /// Also build the KUnit configuration of the patched tree (rust variant):
    /// `<out>/rust-kunit/bzImage`, and the base's in `<out>/base/rust-kunit`.
    pub kunit: bool,
    pub reproducer: String,
}

/// The options of the KUnit configuration, on top of the farm's kernel
/// (`pipeline/kconfig/phyfarm.config` has KUnit built in and off): the Rust
/// doctests, and the KUnit suites run at boot. `make test` builds the base
/// with the same options (so both share one build tree).
pub const KUNIT_OPTIONS: [&str; 2] = [
    "CONFIG_RUST_KERNEL_DOCTESTS=y",
    "CONFIG_KUNIT_DEFAULT_ENABLED=y",
];

use crate::run_folder::RunFolder;
pub use crate::run_folder::KUNIT_DIR;

/// The KUnit build's entry among the gates (`gate.kunit_build`).
pub const KUNIT_GATE: &str = "kunit-build";

/// One build after one patch.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PatchBuild {
    pub index: u32,
    pub variant: Variant,
    pub status: Status,
    pub seconds: f64,
    pub new_warnings: Vec<Warning>,
    /// New warnings the series' `accepted-warnings` let pass, with why.
    #[serde(default)]
    pub accepted_warnings: Vec<(Warning, String)>,
    pub log: String,
    pub log_excerpt: Vec<String>,
}

/// A Rust gate on the patched tree.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Gate {
    pub name: String,
    /// PASS, FAIL, ERROR or SKIP.
    pub status: String,
    pub seconds: f64,
    pub message: String,
    pub log: String,
    pub log_excerpt: Vec<String>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SeriesBuild {
    pub reproducer: String,
    pub series: Series,
    pub kernel_version: String,
    pub image: Option<metadata::ImageRef>,
    pub base: BTreeMap<String, Status>,
    pub apply: Vec<ApplyReport>,
    pub builds: Vec<PatchBuild>,
    pub gates: Vec<Gate>,
    /// PASS, FAIL (apply, build or gate failed) or ERROR.
    pub status: Status,
    pub started: String,
    pub finished: String,
}

pub use crate::progress::printable;

/// Write each patch of the series as `NNNN.patch` into `dir` (mbox messages
/// are cut at their start lines), so git never sees a user-chosen file name.
pub fn stage_patches(s: &Series, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    for (i, p) in s.patches.iter().enumerate() {
        let mut text = Vec::new();
        crate::sandbox::safe_fs::open_file(&p.file)?
            .take(series::MAX_MBOX_BYTES + 1)
            .read_to_end(&mut text)
            .with_context(|| format!("{}", p.file.display()))?;
        let same_file_next = s.patches[i + 1..].iter().find(|q| q.file == p.file);
        let bytes = if p.line > 1 || same_file_next.is_some() {
            let lines: Vec<&[u8]> = text.split_inclusive(|b| *b == b'\n').collect();
            let end = same_file_next.map(|q| q.line - 1).unwrap_or(lines.len());
            lines[p.line - 1..end.max(p.line - 1)].concat()
        } else {
            text
        };
        let dest = dir.join(format!("{:04}.patch", p.index));
        std::fs::write(&dest, bytes)?;
        out.push(dest);
    }
    Ok(out)
}

struct Ctx<'a> {
    paths: &'a Paths,
    opts: &'a SeriesBuildOptions,
    tc: Toolchain,
    trees: Trees,
    env: Vec<(String, String)>,
}

impl Ctx<'_> {
    fn image(&self) -> &str {
        self.tc
            .image
            .as_ref()
            .map(|i| i.name.as_str())
            .unwrap_or("")
    }

    fn git(&self, args: &[&str]) -> Job {
        apply::git_job(
            self.image(),
            &self.trees.work,
            &self.trees.git,
            &RunFolder::new(&self.opts.out).patches(),
            args,
        )
    }

    fn series_build_dir(&self, v: Variant) -> PathBuf {
        self.paths
            .build_root()
            .join(&self.tc.kernel_version)
            .join(format!("series-{}", v.name()))
    }

    /// `make bzImage` of the mounted tree, as every series build step runs it.
    fn bzimage_argv(&self) -> Vec<String> {
        let j = format!("-j{}", self.opts.jobs);
        [
            "make",
            "-C",
            "/src",
            "O=/build",
            "ARCH=x86_64",
            &j,
            "bzImage",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn kunit_build_dir(&self) -> PathBuf {
        self.paths
            .build_root()
            .join(&self.tc.kernel_version)
            .join(format!("series-{KUNIT_DIR}"))
    }

    fn make_job(&self, v: Variant, argv: &[String]) -> Job {
        self.make_job_in(&self.series_build_dir(v), argv)
    }

    fn make_job_in(&self, build: &Path, argv: &[String]) -> Job {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        Job::new(self.image(), "/build", &argv)
            .mount(&self.trees.work, "/src", true)
            .mount(build, "/build", false)
            .env("ARCH", "x86_64")
    }

    fn run<'l>(&self, log: &'l mut File, label: &str) -> Run<'l> {
        Run::new(self.opts.runtime, self.env.clone(), log, label)
    }
}

/// Build a series revision. Pass: every patch applied (or was already
/// applied), built in every variant, and the gates passed.
pub fn build_series(paths: &Paths, opts: &SeriesBuildOptions) -> Result<Outcome> {
    build_series_summary(paths, opts).map(|b| outcome(&b))
}

/// The exit outcome of a series build.
pub fn outcome(b: &SeriesBuild) -> Outcome {
    match b.status {
        Status::Pass => Outcome::Pass,
        Status::Fail => Outcome::Fail,
        Status::Error | Status::Miss => Outcome::Error,
        Status::Done | Status::Skip => Outcome::Pass,
    }
}

// Long: the four numbered steps share the series tree's lock, the log and the per-patch records; splitting them into functions is open work.
/// [`build_series`], returning the summary it wrote to `series-build.json`.
pub fn build_series_summary(paths: &Paths, opts: &SeriesBuildOptions) -> Result<SeriesBuild> {
    let s = series::load(&opts.dir)?;
    let started = metadata::now_rfc3339();
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    info(&format!(
        "series v{} {} ({} patches) from {}",
        s.version,
        s.tree.as_deref().unwrap_or("-"),
        s.patches.len(),
        opts.dir.display()
    ));
    let folder = RunFolder::new(&opts.out);
    stage_patches(&s, &folder.patches())?;
    // A kernel an earlier run left in this folder must not be taken for this
    // run's: the farm tests whatever kernel it finds there.
    for dir in Variant::ALL
        .iter()
        .map(|v| v.name())
        .chain([KUNIT_DIR])
        .map(|d| folder.variant(d))
    {
        for f in ["bzImage", "metadata.json"] {
            match std::fs::remove_file(dir.join(f)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    anyhow::bail!("cannot clear {}: {e}", dir.join(f).display())
                }
                _ => {}
            }
        }
    }

    // 1. The unpatched base, per variant: builds the trees the series starts from.
    let mut base = BTreeMap::new();
    for v in &opts.variants {
        let out = folder.base().variant(v.name());
        let o = BuildOptions {
            variant: *v,
            out: out.clone(),
            runtime: opts.runtime,
            jobs: opts.jobs,
            dry_run: false,
            extra: vec![],
            reproducer: format!("phyfarm build --variant {v} -o {}", out.display()),
        };
        let r = kernel::build(paths, &o)?;
        base.insert(
            v.name().to_string(),
            if r == Outcome::Pass {
                Status::Pass
            } else {
                Status::Fail
            },
        );
        if r != Outcome::Pass {
            anyhow::bail!(
                "the unpatched base does not build in variant {v}: see {}",
                out.join("build.log").display()
            );
        }
    }
    let kunit = opts.kunit && opts.variants.contains(&Variant::Rust);
    if kunit {
        let out = folder.base().kunit();
        let o = BuildOptions {
            variant: Variant::Rust,
            out: out.clone(),
            runtime: opts.runtime,
            jobs: opts.jobs,
            dry_run: false,
            extra: KUNIT_OPTIONS.map(String::from).to_vec(),
            reproducer: format!(
                "phyfarm build --variant rust -K {} -o {}",
                KUNIT_OPTIONS.join(" -K "),
                out.display()
            ),
        };
        info("[rust-kunit] the base's KUnit configuration");
        if kernel::build(paths, &o)? != Outcome::Pass {
            anyhow::bail!(
                "the unpatched base does not build with KUnit: see {}",
                out.join("build.log").display()
            );
        }
    }
    let tc = kernel::toolchain(paths, opts.runtime, false)?;
    let root = paths.cache.join("trees").join(&tc.kernel_version);
    let ctx = Ctx {
        paths,
        opts,
        trees: Trees::new(&root),
        env: opts.runtime.env(&paths.repo),
        tc,
    };
    std::fs::create_dir_all(&root)?;
    let _lock = kernel::lock(&root.join(".lock"), "[series]")?;
    let log_path = opts.out.join("apply.log");
    let mut log = File::create(&log_path)?;
    writeln!(log, "# reproduce: {}", opts.reproducer)?;

    // 2. The git scratch tree, made once per kernel version.
    let pristine = Layout::new(paths, &ctx.tc.kernel_version, Variant::Rust).src;
    let t = Instant::now();
    if apply::copy_pristine(&pristine, &ctx.trees)? {
        info("preparing the git tree of the distro source (once per version)");
        let mut run = ctx.run(&mut log, "[series]");
        for args in [
            vec!["init", "-q"],
            vec!["add", "-f", "-A"],
            vec!["commit", "-q", "--no-verify", "-m", "distro source"],
            vec!["tag", "-f", BASE_TAG],
        ] {
            if let Some(code) = run.job(&ctx.git(&args), &format!("git {}", args[0]))? {
                let _ = std::fs::remove_dir_all(&ctx.trees.git);
                anyhow::bail!(
                    "`git {}` on the scratch tree failed (exit {code}); see {}",
                    args[0],
                    log_path.display()
                );
            }
        }
        info(&format!(
            "[series] the git tree is ready in {:.0} s",
            t.elapsed().as_secs_f64()
        ));
    }
    {
        let mut run = ctx.run(&mut log, "[series]");
        // Git must judge files by content and mtime only: the sandbox hands
        // the tree to another uid (ctime, owner), and a checkout that
        // rewrote every file would give them new mtimes and turn each
        // per-patch build into a full kernel build.
        for args in [
            vec!["config", "core.checkStat", "minimal"],
            vec!["config", "core.trustctime", "false"],
            vec!["checkout", "-q", "-f", BASE_TAG],
            vec!["clean", "-q", "-f", "-d", "-x"],
        ] {
            if let Some(code) = run.job(&ctx.git(&args), "resetting the tree to the base")? {
                anyhow::bail!(
                    "resetting the scratch tree failed (exit {code}); see {}",
                    log_path.display()
                );
            }
        }
    }
    // Every series build starts from a fresh copy of the base tree: the
    // previous series' build could write anything into its own tree, and
    // none of it may reach this one.
    for v in &opts.variants {
        let base_tree = Layout::new(paths, &ctx.tc.kernel_version, *v).build;
        let dir = ctx.series_build_dir(*v);
        let label = format!("[{v}]");
        info(&format!("{label} a fresh series build tree from the base"));
        kernel::copy_built_tree(&base_tree, &dir, &label)?;
    }
    if kunit {
        let extra = kernel::extra_fragment(&KUNIT_OPTIONS.map(String::from))?;
        let base_tree =
            Layout::with_extra(paths, &ctx.tc.kernel_version, Variant::Rust, &extra).build;
        info("[rust-kunit] a fresh series build tree from the base");
        kernel::copy_built_tree(&base_tree, &ctx.kunit_build_dir(), "[rust-kunit]")?;
    }

    // 3. Apply and build, patch by patch.
    let mut reports = Vec::new();
    let mut builds = Vec::new();
    let mut broken = false;
    for (p, file) in s.patches.iter().zip(1..) {
        let _ = file;
        let name = format!("/patches/{:04}.patch", p.index);
        let label = format!("[{}/{}]", p.index, p.total);
        info(&format!("{label} applying: {}", printable(&p.subject)));
        let report = apply_one(&ctx, &mut log, &name, p.index as usize)?;
        let state = report.state;
        match state {
            ApplyState::Applied => info(&format!("{label} applied")),
            ApplyState::AlreadyApplied => warn(&format!(
                "{label} already applied: {}",
                printable(
                    report
                        .message
                        .strip_prefix("already applied: ")
                        .unwrap_or(&report.message)
                )
            )),
            _ => {
                for line in report.message.lines() {
                    eprintln!("E: {label} {}", printable(line));
                }
                for h in &report.rejected {
                    for l in h.text.lines().take(12) {
                        eprintln!("E:     {}", printable(l));
                    }
                }
            }
        }
        reports.push(report);
        if state == ApplyState::Failed {
            broken = true;
        }
        if broken {
            continue;
        }
        for v in &opts.variants {
            builds.push(build_after(&ctx, p.index, p.total, *v)?);
        }
    }

    // 4. Rust gates on the fully patched tree (rust variant), and beside
    // them the KUnit configuration of that tree: the doctests are compiled
    // only there, so a broken doctest fails here, with its error. The gates
    // mostly compile one crate at a time; the KUnit build, in its own build
    // tree and log, takes the cores they leave.
    let rust_built = !broken
        && builds
            .iter()
            .rev()
            .find(|b| b.variant == Variant::Rust)
            .is_some_and(|b| b.status == Status::Pass);
    let run_gates = opts.gates && opts.variants.contains(&Variant::Rust);
    let (gates, kunit_gate) = std::thread::scope(|scope| {
        let kunit_job = kunit.then(|| scope.spawn(|| gates::kunit_build(&ctx, rust_built)));
        let gates = if run_gates {
            gates::rust_gates(&ctx, &s, &builds, broken)
        } else {
            Ok(Vec::new())
        };
        let kunit_gate = kunit_job
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("the KUnit build panicked"))?
            })
            .transpose();
        (gates, kunit_gate)
    });
    let mut gates = gates?;

    let mut refused: Vec<String> = Vec::new();
    if let Some(gate) = kunit_gate? {
        if gate.status == "PASS" {
            let dir = folder.kunit();
            std::fs::create_dir_all(&dir)?;
            let tree = ctx.kunit_build_dir();
            if let Err(e) = crate::sandbox::safe_fs::copy_out(
                &tree,
                Path::new("arch/x86/boot/bzImage"),
                &dir.join("bzImage"),
            ) {
                if !e.is_refusal() {
                    return Err(e.into());
                }
                eprintln!("E: [rust-kunit] refused to copy an artifact: {e}");
                refused.push(format!("[rust] refused to copy the KUnit kernel: {e}"));
            }
        }
        gates.push(gate);
    }

    // 5. Artifacts per variant, for the farm.
    for v in &opts.variants {
        let last = builds.iter().rev().find(|b| b.variant == *v);
        if let Some(b) = last.filter(|b| b.status == Status::Pass && !broken) {
            let dir = folder.variant(v.name());
            std::fs::create_dir_all(&dir)?;
            let tree = ctx.series_build_dir(*v);
            // The series' own build wrote this tree: nothing is followed.
            for (from, to) in [("arch/x86/boot/bzImage", "bzImage"), (".config", ".config")] {
                if let Err(e) =
                    crate::sandbox::safe_fs::copy_out(&tree, Path::new(from), &dir.join(to))
                {
                    if !e.is_refusal() {
                        return Err(e.into());
                    }
                    eprintln!("E: [{v}] refused to copy an artifact: {e}");
                    refused.push(format!("[{v}] refused to copy an artifact: {e}"));
                }
            }
            if refused.iter().any(|r| r.starts_with(&format!("[{v}]"))) {
                let _ = std::fs::remove_file(dir.join("bzImage"));
                continue;
            }
            let mut meta: BuildMetadata = metadata::read_json(&folder.base().metadata(v.name()))?
                .context("base metadata missing")?;
            meta.reproducer = opts.reproducer.clone();
            meta.status = b.status;
            meta.artifacts = BTreeMap::from([(
                "bzImage".to_string(),
                dir.join("bzImage").display().to_string(),
            )]);
            meta.finished = metadata::now_rfc3339();
            metadata::write_json_atomic(&dir.join("metadata.json"), &meta)?;
        }
    }

    for r in &refused {
        if let Some(b) = builds
            .iter_mut()
            .rev()
            .find(|b| r.starts_with(&format!("[{}]", b.variant)))
        {
            b.status = Status::Fail;
            b.log_excerpt.insert(0, r.clone());
        }
    }
    let failed = broken
        || !refused.is_empty()
        || builds.iter().any(|b| b.status != Status::Pass)
        || gates.iter().any(|g| g.status == "FAIL");
    let errored = gates.iter().any(|g| g.status == "ERROR");
    let summary = SeriesBuild {
        reproducer: opts.reproducer.clone(),
        series: s,
        kernel_version: ctx.tc.kernel_version.clone(),
        image: ctx.tc.image.clone(),
        base,
        apply: reports,
        builds,
        gates,
        status: if failed {
            Status::Fail
        } else if errored {
            Status::Error
        } else {
            Status::Pass
        },
        started,
        finished: metadata::now_rfc3339(),
    };
    metadata::write_json_atomic(&folder.series_build(), &summary)?;
    print!("{}", render(&summary));
    println!("{}", opts.out.display());
    Ok(summary)
}

fn apply_one(ctx: &Ctx, log: &mut File, name: &str, index: usize) -> Result<ApplyReport> {
    let mut run = ctx.run(log, "[apply]");
    let file = name.trim_start_matches("/patches/").to_string();
    let mut report = ApplyReport {
        index,
        file,
        state: ApplyState::Applied,
        message: String::new(),
        rejected: vec![],
        clean_files: vec![],
    };
    if run
        .capture(&ctx.git(&["apply", "--check", name]))?
        .0
        .is_none()
    {
        let (code, out) = run.capture(&ctx.git(&["am", "-3", "--keep-non-patch", name]))?;
        if code.is_some() {
            run.capture(&ctx.git(&["am", "--abort"]))?;
            report.state = ApplyState::Failed;
            report.message = format!("git am failed: {}", out.lines().last().unwrap_or("").trim());
        }
        return Ok(report);
    }
    if run
        .capture(&ctx.git(&["apply", "-R", "--check", name]))?
        .0
        .is_none()
    {
        report.state = ApplyState::AlreadyApplied;
        report.message = "its change is already in the tree (it reverse-applies)".into();
        return Ok(report);
    }
    let (_, out) = run.capture(&ctx.git(&["apply", "--reject", "--verbose", name]))?;
    let (clean, rejects) = apply::parse_reject_output(&out);
    report.rejected = apply::collect_rejects(&ctx.trees.work, &rejects)?;
    report.clean_files = clean;
    for args in [
        vec!["checkout", "-q", "-f", "HEAD"],
        vec!["clean", "-q", "-f", "-d", "-x"],
    ] {
        run.capture(&ctx.git(&args))?;
    }
    if report.clean_files.is_empty()
        && !report.rejected.is_empty()
        && report.rejected.iter().all(|h| h.already_present)
    {
        report.state = ApplyState::AlreadyApplied;
        report.message =
            "already applied: every line it adds is in the tree, with different context".into();
    } else {
        report.state = ApplyState::Failed;
        report.message = if report.rejected.is_empty() {
            format!(
                "does not apply: {}",
                out.lines()
                    .find(|l| l.starts_with("error:"))
                    .unwrap_or("")
                    .trim()
            )
        } else {
            apply::describe_failure(index, &report.rejected)
        };
    }
    Ok(report)
}

fn build_after(ctx: &Ctx, index: u32, total: u32, v: Variant) -> Result<PatchBuild> {
    let log_path = RunFolder::new(&ctx.opts.out)
        .logs()
        .join(format!("patch{index}-{}.log", v.name()));
    std::fs::create_dir_all(log_path.parent().unwrap())?;
    let mut log = File::create(&log_path)?;
    writeln!(log, "# reproduce: {}", ctx.opts.reproducer)?;
    writeln!(log, "# build after patch {index}/{total}, variant {v}")?;
    let label = format!("[{index}/{total} {v}]");
    let t = Instant::now();
    let argv = ctx.bzimage_argv();
    let mut run = ctx.run(&mut log, &label);
    let failed = run.job(&ctx.make_job(v, &argv), "make bzImage")?;
    let stopped = run.stopped.take();
    drop(run);
    let seconds = t.elapsed().as_secs_f64();
    drop(log);
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let base_keys =
        kernel::base_warning_keys(&Layout::new(ctx.paths, &ctx.tc.kernel_version, v).build);
    let found = warnings::new_warnings(&warnings::parse(&text), &base_keys);
    let (new_warnings, accepted_warnings) = accept_warnings(found, &accepted(&ctx.opts.dir)?);
    for (w, why) in &accepted_warnings {
        info(&format!(
            "{label} new warning accepted by series.toml ({why}): {}",
            w.text
        ));
    }
    let status = if failed.is_none() {
        Status::Pass
    } else {
        Status::Fail
    };
    info(&format!(
        "{label} build {} in {seconds:.0} s{}",
        status,
        if new_warnings.is_empty() {
            String::new()
        } else {
            format!(", {} new warnings", new_warnings.len())
        }
    ));
    Ok(PatchBuild {
        index,
        variant: v,
        status,
        seconds,
        new_warnings,
        accepted_warnings,
        log: log_path.display().to_string(),
        log_excerpt: match (&failed, stopped) {
            (Some(_), Some(why)) => {
                let mut e = vec![format!("phyfarm stopped the build: {why}")];
                e.extend(metadata::error_excerpt(&text, 19));
                e
            }
            (Some(_), None) => metadata::error_excerpt(&text, 20),
            (None, _) => vec![],
        },
    })
}

/// The `accepted-warnings` of the series.toml beside revision folder `dir`
/// (none without one).
fn accepted(dir: &Path) -> Result<Vec<series::AcceptedWarning>> {
    let Some(m) = dir
        .parent()
        .map(|p| p.join(series::MANIFEST_FILE))
        .filter(|m| m.is_file())
    else {
        return Ok(vec![]);
    };
    Ok(series::load_manifest(&m)?.accepted_warnings)
}

/// Split new warnings into those that count and those a series accepted.
fn accept_warnings(
    found: Vec<Warning>,
    accepted: &[series::AcceptedWarning],
) -> (Vec<Warning>, Vec<(Warning, String)>) {
    let mut counted = Vec::new();
    let mut let_pass = Vec::new();
    for w in found {
        match accepted
            .iter()
            .find(|a| w.text.contains(a.warning.as_str()))
        {
            Some(a) => let_pass.push((w, a.reason.clone())),
            None => counted.push(w),
        }
    }
    (counted, let_pass)
}

/// The summary table printed at the end.
pub fn render(b: &SeriesBuild) -> String {
    let mut s = format!(
        "series v{} {} ({} patches), {} {}\n",
        b.series.version,
        b.series.tree.as_deref().unwrap_or("-"),
        b.series.patches.len(),
        crate::build::images::LINUX_SOURCE_PACKAGE,
        b.kernel_version
    );
    for (p, a) in b.series.patches.iter().zip(&b.apply) {
        let state = match a.state {
            ApplyState::Applied => "applied",
            ApplyState::AlreadyApplied => "already applied",
            ApplyState::Failed => "DOES NOT APPLY",
            ApplyState::Skipped => "skipped",
        };
        let mut builds: Vec<String> = b
            .builds
            .iter()
            .filter(|x| x.index == p.index)
            .map(|x| {
                let w = if x.new_warnings.is_empty() {
                    String::new()
                } else {
                    format!(" +{}W", x.new_warnings.len())
                };
                format!("{} {} {:.0} s{w}", x.variant, x.status, x.seconds)
            })
            .collect();
        if builds.is_empty() {
            builds.push("not built".into());
        }
        s.push_str(&format!(
            "  {}/{} {:60.60}  {:16} {}\n",
            p.index,
            p.total,
            printable(&p.subject),
            state,
            builds.join(", ")
        ));
        for h in &a.rejected {
            s.push_str(&format!(
                "        {} hunk #{} {}{}\n",
                printable(&h.file),
                h.hunk,
                h.header,
                if h.already_present {
                    " (already present)"
                } else {
                    ""
                }
            ));
        }
    }
    if !b.gates.is_empty() {
        let g: Vec<String> = b
            .gates
            .iter()
            .map(|g| format!("{} {}", g.name, g.status))
            .collect();
        s.push_str(&format!("  gates: {}\n", g.join(", ")));
        for g in b.gates.iter().filter(|g| g.status == "FAIL") {
            s.push_str(&format!("    {}: {}\n", g.name, printable(&g.message)));
        }
    }
    s.push_str(&format!("  status: {}\n", b.status));
    s
}

#[cfg(test)]
mod tests;
