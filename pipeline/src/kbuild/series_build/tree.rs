//! The first two steps of a series build: the unpatched base it starts
//! from, built per variant (and in its KUnit configuration), and the series
//! tree: the git scratch copy of the distro source, locked for the whole
//! series build, reset to the base, with fresh build trees beside it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;

use super::{Ctx, SeriesBuildOptions, KUNIT_OPTIONS};
use crate::config::{Paths, Variant};
use crate::kbuild::apply::{self, BASE_TAG};
use crate::kbuild::kernel::{self, BuildOptions, Layout};
use crate::kbuild::metadata::Status;
use crate::progress::info;
use crate::run_folder::RunFolder;
use crate::Outcome;

/// Step 1: the unpatched base, per variant: builds the trees the series starts
/// from. Returns each variant's status.
pub(super) fn build_base(
    paths: &Paths,
    opts: &SeriesBuildOptions,
) -> Result<BTreeMap<String, Status>> {
    let folder = RunFolder::new(&opts.out);
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
    Ok(base)
}

/// Step 1, KUnit: the base's KUnit configuration, which the series' KUnit
/// build starts from.
pub(super) fn build_base_kunit(paths: &Paths, opts: &SeriesBuildOptions) -> Result<()> {
    let out = RunFolder::new(&opts.out).base().kunit();
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
    Ok(())
}

/// The series tree, locked for as long as this lives, and the log of what
/// is done to it (`apply.log`).
pub(super) struct SeriesTree {
    _lock: kernel::Lock,
    pub log: File,
    pub log_path: PathBuf,
}

impl SeriesTree {
    /// Lock the series tree under `root` (waiting for another series build
    /// of this kernel version) and start its log.
    pub fn lock(ctx: &Ctx, root: &Path) -> Result<SeriesTree> {
        std::fs::create_dir_all(root)?;
        let lock = kernel::lock(&root.join(".lock"), "[series]")?;
        let log_path = ctx.opts.out.join("apply.log");
        let mut log = File::create(&log_path)?;
        writeln!(log, "# reproduce: {}", ctx.opts.reproducer)?;
        Ok(SeriesTree {
            _lock: lock,
            log,
            log_path,
        })
    }
}

/// Step 2: the git scratch tree (made once per kernel version), reset to the
/// base, and fresh series build trees copied from the base's.
pub(super) fn prepare(ctx: &Ctx, tree: &mut SeriesTree, kunit: bool) -> Result<()> {
    make_git_tree(ctx, tree)?;
    reset_to_base(ctx, tree)?;
    fresh_build_trees(ctx, kunit)
}

/// The git scratch tree, made once per kernel version.
fn make_git_tree(ctx: &Ctx, tree: &mut SeriesTree) -> Result<()> {
    let pristine = Layout::new(ctx.paths, &ctx.tc.kernel_version, Variant::Rust).src;
    let t = Instant::now();
    if apply::copy_pristine(&pristine, &ctx.trees)? {
        info("preparing the git tree of the distro source (once per version)");
        let mut run = ctx.run(&mut tree.log, "[series]");
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
                    tree.log_path.display()
                );
            }
        }
        info(&format!(
            "[series] the git tree is ready in {:.0} s",
            t.elapsed().as_secs_f64()
        ));
    }
    Ok(())
}

/// Check out the base, with nothing a previous series left.
fn reset_to_base(ctx: &Ctx, tree: &mut SeriesTree) -> Result<()> {
    let mut run = ctx.run(&mut tree.log, "[series]");
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
                tree.log_path.display()
            );
        }
    }
    Ok(())
}

/// Every series build starts from a fresh copy of the base tree: the
/// previous series' build could write anything into its own tree, and
/// none of it may reach this one.
fn fresh_build_trees(ctx: &Ctx, kunit: bool) -> Result<()> {
    for v in &ctx.opts.variants {
        let base_tree = Layout::new(ctx.paths, &ctx.tc.kernel_version, *v).build;
        let dir = ctx.series_build_dir(*v);
        let label = format!("[{v}]");
        info(&format!("{label} a fresh series build tree from the base"));
        kernel::copy_built_tree(&base_tree, &dir, &label)?;
    }
    if kunit {
        let extra = kernel::extra_fragment(&KUNIT_OPTIONS.map(String::from))?;
        let base_tree =
            Layout::with_extra(ctx.paths, &ctx.tc.kernel_version, Variant::Rust, &extra).build;
        info("[rust-kunit] a fresh series build tree from the base");
        kernel::copy_built_tree(&base_tree, &ctx.kunit_build_dir(), "[rust-kunit]")?;
    }
    Ok(())
}
