//! `phyfarm build --series DIR`: apply a revision patch by patch onto the
//! distro tree, build after every patch in each variant (incrementally, from
//! the base build trees), count new warnings against the base, and run the
//! Rust gates on the result. Everything lands in one output folder with a
//! `series-build.json` summary.
//!
//! One file over 500 lines: the series build's records, its summary and the
//! table printed from it, and `build_series_summary` calling its steps in
//! the order they run, read top to bottom: the base builds and the series
//! tree (`series_build/tree.rs`), apply and build per patch
//! (`series_build/patches.rs`), the gates and KUnit (here, each gate in
//! `series_build/gates.rs`), the artifacts.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::config::{Paths, Variant};
use crate::ingest::series::{self, Series};
use crate::kbuild::apply::{self, ApplyReport, ApplyState, Trees};
use crate::kbuild::kernel::{self, Toolchain};
use crate::kbuild::metadata::{self, BuildMetadata, Status};
use crate::kbuild::steps::Run;
use crate::kbuild::warnings::Warning;
use crate::progress::info;
use crate::sandbox::runtime::{Job, Runtime};
use crate::Outcome;

mod gates;
mod patches;
mod tree;
pub use gates::{gate_scopes, gate_target, ENUM_CHECK_OUTPUT, GATES};
use patches::Patched;
use tree::SeriesTree;

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

/// [`build_series`], returning the summary it wrote to `series-build.json`.
pub fn build_series_summary(paths: &Paths, opts: &SeriesBuildOptions) -> Result<SeriesBuild> {
    let s = series::load(&opts.dir)?;
    let started = metadata::now_rfc3339();
    prepare_folder(opts, &s)?;

    // 1. The unpatched base, per variant: builds the trees the series starts from.
    let base = tree::build_base(paths, opts)?;
    let kunit = opts.kunit && opts.variants.contains(&Variant::Rust);
    if kunit {
        tree::build_base_kunit(paths, opts)?;
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
    // Held to the end: the series tree is this build's until its summary is written.
    let mut series_tree = SeriesTree::lock(&ctx, &root)?;

    // 2. The git scratch tree, made once per kernel version, and the build trees.
    tree::prepare(&ctx, &mut series_tree, kunit)?;

    // 3. Apply and build, patch by patch.
    let mut rec = patches::apply_and_build(&ctx, &s, &mut series_tree)?;

    // 4. Rust gates and the KUnit build on the fully patched tree.
    let gates = gates_and_kunit(&ctx, &s, &mut rec, kunit)?;

    // 5. Artifacts per variant, for the farm.
    copy_out_kernels(&ctx, &mut rec)?;

    let summary = summarize(&ctx, s, base, rec, gates, started);
    metadata::write_json_atomic(&RunFolder::new(&opts.out).series_build(), &summary)?;
    print!("{}", render(&summary));
    println!("{}", opts.out.display());
    Ok(summary)
}

/// The output folder, with the series' patches staged in it and no kernel
/// an earlier run left there.
fn prepare_folder(opts: &SeriesBuildOptions, s: &Series) -> Result<()> {
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
    stage_patches(s, &folder.patches())?;
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
    Ok(())
}

/// Step 4: the Rust gates on the fully patched tree (rust variant), and beside
/// them the KUnit configuration of that tree: the doctests are compiled
/// only there, so a broken doctest fails here, with its error. The gates
/// mostly compile one crate at a time; the KUnit build, in its own build
/// tree and log, takes the cores they leave. A KUnit kernel that built is
/// copied out.
fn gates_and_kunit(ctx: &Ctx, s: &Series, rec: &mut Patched, kunit: bool) -> Result<Vec<Gate>> {
    let (builds, broken) = (&rec.builds, rec.broken);
    let rust_built = !broken
        && builds
            .iter()
            .rev()
            .find(|b| b.variant == Variant::Rust)
            .is_some_and(|b| b.status == Status::Pass);
    let run_gates = ctx.opts.gates && ctx.opts.variants.contains(&Variant::Rust);
    let (gates, kunit_gate) = std::thread::scope(|scope| {
        let kunit_job = kunit.then(|| scope.spawn(|| gates::kunit_build(ctx, rust_built)));
        let gates = if run_gates {
            gates::rust_gates(ctx, s, builds, broken)
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

    if let Some(gate) = kunit_gate? {
        if gate.status == "PASS" {
            let dir = RunFolder::new(&ctx.opts.out).kunit();
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
                rec.refused
                    .push(format!("[rust] refused to copy the KUnit kernel: {e}"));
            }
        }
        gates.push(gate);
    }
    Ok(gates)
}

/// Step 5: artifacts per variant, for the farm: the kernel and `.config` of each
/// variant whose last build passed, with its `metadata.json`.
fn copy_out_kernels(ctx: &Ctx, rec: &mut Patched) -> Result<()> {
    let (opts, folder) = (ctx.opts, RunFolder::new(&ctx.opts.out));
    for v in &opts.variants {
        let last = rec.builds.iter().rev().find(|b| b.variant == *v);
        if let Some(b) = last.filter(|b| b.status == Status::Pass && !rec.broken) {
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
                    rec.refused
                        .push(format!("[{v}] refused to copy an artifact: {e}"));
                }
            }
            if rec.refused.iter().any(|r| r.starts_with(&format!("[{v}]"))) {
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
    Ok(())
}

/// The series build's summary: a refused artifact fails its variant's last
/// build; any failure fails the series.
fn summarize(
    ctx: &Ctx,
    s: Series,
    base: BTreeMap<String, Status>,
    rec: Patched,
    gates: Vec<Gate>,
    started: String,
) -> SeriesBuild {
    let Patched {
        reports,
        mut builds,
        broken,
        refused,
    } = rec;
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
    SeriesBuild {
        reproducer: ctx.opts.reproducer.clone(),
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
    }
}

/// The summary table printed at the end.
pub fn render(b: &SeriesBuild) -> String {
    let mut s = format!(
        "series v{} {} ({} patches), {} {}\n",
        b.series.version,
        b.series.tree.as_deref().unwrap_or("-"),
        b.series.patches.len(),
        crate::kbuild::images::LINUX_SOURCE_PACKAGE,
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
