//! `phyfarm run [DIR]`: the main job end to end on one series revision:
//! ingest, per-patch apply and build in both variants with the Rust gates,
//! a boot check of each resulting kernel, the farm's checks on the patched
//! kernels and on the unpatched base in the same environment, and the
//! verdict. Defaults to the shipped series' newest revision.

pub mod selftest;
pub mod store_runs;
pub mod trust;

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::config::{Paths, Variant};
use crate::guest::boot::{self, BootOptions};
use crate::kbuild::series_build::{self, SeriesBuildOptions};
use crate::progress::info;
use crate::run_folder::RunFolder;
use crate::Outcome;

/// The series the product ships with.
pub const SHIPPED_SERIES: &str = "patches/rust-phy-enum-check";

/// The newest `v<N>` folder of a series folder.
pub fn newest_revision(series: &Path) -> Option<PathBuf> {
    std::fs::read_dir(series)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u32 = name.strip_prefix('v')?.parse().ok()?;
            e.path().is_dir().then_some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub dir: Option<PathBuf>,
    /// The results store the run is recorded in.
    pub store: PathBuf,
    pub out: Option<PathBuf>,
    pub build: SeriesBuildOptions,
    pub boot: BootOptions,
    /// Run the farm (None: skip it).
    pub farm: Option<crate::farm::TestOptions>,
    /// Plan only these farm check families (empty: all).
    pub checks: Vec<String>,
    /// Run the base's checks even when an earlier run's results have the
    /// same key (see [`crate::farm::in_run::base_key`]).
    pub fresh_base: bool,
    /// The default branch's `patches/` and the pull request's author: see
    /// [`trust::admit`].
    pub owners: Option<(PathBuf, String)>,
}

/// The revision to run (the shipped series' newest by default), admitted
/// (with `owners`: see [`trust::admit`]), and its output folder.
fn revision_and_out(paths: &Paths, opts: &mut RunOptions) -> Result<(PathBuf, PathBuf)> {
    let dir = match opts.dir.take() {
        Some(d) => d,
        None => newest_revision(&paths.repo.join(SHIPPED_SERIES)).ok_or_else(|| {
            anyhow::anyhow!(
                "no revision folders in {}",
                paths.repo.join(SHIPPED_SERIES).display()
            )
        })?,
    };
    let s = crate::ingest::series::load(&dir)?;
    // On the trusted runner: refused before anything is built.
    if let Some(owners) = &opts.owners {
        trust::admit(&opts.store, &dir, &s, Some(owners))?;
    }
    let out = opts.out.clone().unwrap_or_else(|| {
        let name = dir
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "series".into());
        paths.runs_dir().join(format!("{name}-v{}", s.version))
    });
    Ok((dir, out))
}

pub fn run(paths: &Paths, mut opts: RunOptions) -> Result<Outcome> {
    let (dir, out) = revision_and_out(paths, &mut opts)?;
    let mut b = opts.build.clone();
    b.dir = dir.clone();
    b.out = out.clone();
    info(&format!("run: {} -> {}", dir.display(), out.display()));
    let started = crate::results::Timestamp::now();
    let summary = series_build::build_series_summary(paths, &b)?;
    let built = series_build::outcome(&summary);
    let mut boots = Vec::new();
    let mut base_boots = Vec::new();
    let mut lines = vec![format!(
        "build: {} (series-build.json in {})",
        outcome_name(built),
        out.display()
    )];
    let folder = RunFolder::new(&out);
    for v in &b.variants {
        // The unpatched base boots too: the verdict compares like with like.
        let base_kernel = folder.base().kernel(v.name());
        if base_kernel.is_file() {
            let mut bo = opts.boot.clone();
            bo.kernel = base_kernel.clone();
            bo.out = Some(folder.base().boot(v.name()));
            bo.expect = Some(*v);
            let repro = format!("phyfarm boot --kernel {}", base_kernel.display());
            base_boots.push(boot_in_memory(paths, &bo, &repro, *v));
        }
        let kernel = folder.kernel(v.name());
        if !kernel.is_file() {
            lines.push(format!("{v}: no kernel to boot (the series did not build)"));
            continue;
        }
        let mut bo = opts.boot.clone();
        bo.kernel = kernel.clone();
        bo.out = Some(folder.boot(v.name()));
        bo.expect = Some(*v);
        let repro = format!("phyfarm boot --kernel {}", kernel.display());
        let b = boot_in_memory(paths, &bo, &repro, *v);
        let booted = match b.status {
            crate::results::Status::Pass => Outcome::Pass,
            crate::results::Status::Fail => Outcome::Fail,
            _ => Outcome::Error,
        };
        boots.push(b);
        lines.push(format!(
            "{v}: boot {}, kernel {}, console {}",
            if booted == Outcome::Pass {
                "PASS"
            } else {
                "FAIL"
            },
            kernel.display(),
            folder.boot(v.name()).join("console.log").display()
        ));
    }
    // The farm, on the patched kernels and on the base in the same
    // environment, each against its plan: what it did not report is MISS.
    let mut farm_rev = crate::farm::contract::FarmImport::default();
    let mut farm_base = crate::farm::contract::FarmImport::default();
    let mut base_note = None;
    let names: Vec<&str> = b.variants.iter().map(|v| v.name()).collect();
    let built_any = b.variants.iter().any(|v| folder.kernel(v.name()).is_file());
    if let (Some(f), true) = (&opts.farm, built_any) {
        let plan = crate::farm::contract::Plan::new(&names, b.kunit).only(&opts.checks);
        // One variant asked for: the farm runs that variant's kernels only,
        // even when an earlier run left the other one in the output folder.
        let mut f = f.clone();
        if let [only] = b.variants.as_slice() {
            f.variant = Some(*only);
        }
        let (farm_base_imp, farm_rev_imp, note) =
            farm_both(paths, &f, &out, &plan, opts.fresh_base, &mut lines)?;
        farm_base = farm_base_imp;
        farm_rev = farm_rev_imp;
        base_note = note;
    }
    for l in lines {
        println!("{l}");
    }
    let state = record(
        &opts.store,
        &store_runs::series_name(&dir)?,
        &out,
        &out,
        &summary,
        &boots,
        &base_boots,
        farm_base,
        farm_rev,
        started,
        base_note,
    )?;
    println!("{}", out.display());
    // The verdict decides the exit code, as for `record` and `verdict`:
    // a FAIL then PASS on retry (a flake) awaits review and exits 0, a
    // throughput regression judged against the base exits 1, evidence
    // still missing exits 2.
    Ok(crate::verdict::outcome(state))
}

/// What `phyfarm record` assembles: a revision built and tested in parts.
#[derive(Debug, Clone, Default)]
pub struct RecordParts {
    /// The revision, parsed by phyfarm: the only source of its identity.
    pub series: PathBuf,
    /// `phyfarm build --series` output folders (one per variant).
    pub builds: Vec<PathBuf>,
    /// `phyfarm test` output folders (one per matrix job).
    pub farms: Vec<PathBuf>,
    /// The same for the base's kernels: what the farm is compared with.
    pub base_farms: Vec<PathBuf>,
    /// Check families planned [empty: the whole plan].
    pub checks: Vec<String>,
    /// The default branch's `patches/` and the pull request's author
    /// (`github:<login>`): a series held there gets revisions only from its
    /// owners.
    pub owners: Option<(PathBuf, String)>,
}

/// `phyfarm record`: a revision built and tested in parts (a CI matrix of
/// variant builds and variant x check-group farm runs), assembled into one
/// revision run against the plan and recorded with its verdict. The
/// artifacts are evidence: each series-build.json must describe the series
/// parsed from `--series` (else refused, naming the file and field), and
/// the revision's identity is taken from that parse alone.
pub fn record_parts(out: &Path, store: &Path, parts: &RecordParts) -> Result<Outcome> {
    let dir = &parts.series;
    let parsed = crate::ingest::series::load(dir)?;
    let name = trust::admit(store, dir, &parsed, parts.owners.as_ref())?;
    let mut merged: Option<series_build::SeriesBuild> = None;
    for b in &parts.builds {
        let file = RunFolder::new(b).series_build();
        let mut part = trust::load_build(&file)?;
        trust::check_build(&file, &part, &parsed, dir)?;
        part.series = parsed.clone();
        merged = Some(match merged.take() {
            None => part,
            Some(mut m) => {
                if m.kernel_version != part.kernel_version {
                    return Err(trust::TrustError::Inconsistent {
                        file,
                        field: "kernel_version".into(),
                        reason: format!(
                            "{:?}, but another build of this revision has {:?}",
                            part.kernel_version, m.kernel_version
                        ),
                    }
                    .into());
                }
                m.base.extend(part.base);
                m.builds.extend(part.builds);
                m.gates.extend(part.gates);
                m.status = m.status.min(part.status);
                m
            }
        });
    }
    let Some(summary) = merged else {
        anyhow::bail!("give at least one --build folder (a `phyfarm build --series` output)");
    };
    let variants: Vec<&str> = ["rust", "c"]
        .into_iter()
        .filter(|v| summary.base.contains_key(*v))
        .collect();
    for f in parts.farms.iter().chain(&parts.base_farms) {
        trust::check_farm(f, &variants)?;
    }
    // KUnit is planned when the build made the KUnit kernel of the series.
    let kunit = summary
        .gates
        .iter()
        .any(|g| g.name == series_build::KUNIT_GATE);
    let plan = crate::farm::contract::Plan::new(&variants, kunit).only(&parts.checks);
    let import = |dirs: &[PathBuf]| -> Result<Farm> {
        Ok(if dirs.is_empty() {
            Farm::default()
        } else {
            crate::farm::contract::import_all(dirs, &plan, None)?
        })
    };
    let farm = import(&parts.farms)?;
    let farm_base = import(&parts.base_farms)?;
    let started = crate::results::Timestamp::now();
    std::fs::create_dir_all(out)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", out.display()))?;
    let state = record(
        store,
        &name,
        &parts.builds[0],
        out,
        &summary,
        &[],
        &[],
        farm_base,
        farm,
        started,
        None,
    )?;
    Ok(crate::verdict::outcome(state))
}

/// One boot check of the run, its record kept in memory (the folder's
/// `boot.json` is the same record, for readers of the folder).
fn boot_in_memory(
    paths: &Paths,
    opts: &boot::BootOptions,
    repro: &str,
    v: crate::config::Variant,
) -> crate::run::store_runs::Boot {
    use crate::run::store_runs::Boot;
    match boot::boot_check(paths, opts, repro) {
        Ok((record, _)) => Boot::from_record(v, &record),
        Err(e) => {
            let dir = opts.out.clone().unwrap_or_default();
            crate::progress::warn(&format!("{v}: boot check: {e:#}"));
            Boot::unfinished(v, &dir, &format!("{e:#}"))
        }
    }
}

type Farm = crate::farm::contract::FarmImport;

/// The farm on the base and on the revision, each against `plan`. The
/// checks run on the base, then on the revision; throughput runs apart,
/// after them, base then revision back to back (and both again, alternately,
/// when the revision looks slower), so machine noise hits both alike and
/// no other check's guest competes with the measurement.
///
/// The base's checks (not its throughput, which is measured every time) are
/// reused from an earlier run whose key is the same, unless `fresh_base`;
/// the note says which, for the run's environment.
fn farm_both(
    paths: &Paths,
    f: &crate::farm::TestOptions,
    out: &Path,
    plan: &crate::farm::contract::Plan,
    fresh_base: bool,
    lines: &mut Vec<String>,
) -> Result<(Farm, Farm, Option<String>)> {
    use crate::farm::contract::{keyword_for, THROUGHPUT_FAMILY};
    let families = plan.families();
    let rest: Vec<String> = families
        .iter()
        .filter(|x| *x != THROUGHPUT_FAMILY)
        .cloned()
        .collect();
    // (the block's folder, whether it holds throughput, its selection)
    type Block = (fn(&RunFolder) -> PathBuf, bool, Option<String>);
    let mut blocks: Vec<Block> = Vec::new();
    if !rest.is_empty() {
        blocks.push((RunFolder::farm, false, keyword_for(&rest)?));
    }
    if rest.len() < families.len() {
        blocks.push((
            RunFolder::farm_throughput,
            true,
            keyword_for(&[THROUGHPUT_FAMILY.into()])?,
        ));
    }
    let run = RunFolder::new(out);
    let sides = [("farm on the base", run.base()), ("farm", run.clone())];
    let mut dirs: [Vec<PathBuf>; 2] = Default::default();
    let mut whys: [Vec<String>; 2] = Default::default();
    let mut note = None;
    for (folder, throughput, keyword) in &blocks {
        for (side, (label, root)) in sides.iter().enumerate() {
            let mut o = f.clone();
            o.keyword = keyword.clone();
            let dir = folder(root);
            let root = root.root();
            // The base's checks (never its throughput): reused when nothing
            // that decides them changed.
            let key = (side == 0 && !throughput)
                .then(|| crate::farm::in_run::base_key(paths, &o, root, plan).ok())
                .flatten();
            if let Some(k) = &key {
                if !fresh_base && crate::farm::in_run::reuse_base(paths, k, &dir) {
                    info(&format!(
                        "{label}: the results of an earlier run with the same kernels, farm and plan (key {k}); --fresh-base runs them again"
                    ));
                    lines.push(format!("{label}: reused (key {k}), {}", dir.display()));
                    note = Some(format!("{k} (reused from an earlier run)"));
                    dirs[side].push(dir);
                    continue;
                }
            }
            let (oc, why) = crate::farm::in_run::farm(paths, &o, root, &dir);
            if let Some(k) = &key {
                crate::farm::in_run::keep_base(paths, k, &dir);
                note = Some(format!("{k} (measured in this run)"));
            }
            lines.push(format!("{label}: {}, {}", outcome_name(oc), dir.display()));
            whys[side].extend(why);
            dirs[side].push(dir);
        }
    }
    let why = |w: &Vec<String>| (!w.is_empty()).then(|| w.join("; "));
    let mut base = crate::farm::contract::import_all(&dirs[0], plan, why(&whys[0]).as_deref())?;
    let mut rev = crate::farm::contract::import_all(&dirs[1], plan, why(&whys[1]).as_deref())?;
    crate::farm::in_run::confirm_throughput(
        paths,
        f,
        (run.base().root(), out),
        &run.confirm(),
        &mut base,
        &mut rev,
    );
    Ok((base, rev, note))
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Pass => "PASS",
        Outcome::Fail => "FAIL",
        Outcome::Error => "ERROR",
    }
}

/// Record the base and the revision in the store and print the verdict.
#[allow(clippy::too_many_arguments)]
fn record(
    store: &Path,
    // The series name (`series.toml`'s, checked).
    name: &str,
    out: &Path,
    // Where results.json and results-base.json are written.
    write_to: &Path,
    b: &series_build::SeriesBuild,
    boots: &[crate::run::store_runs::Boot],
    base_boots: &[crate::run::store_runs::Boot],
    farm_base: Farm,
    farm_rev: Farm,
    started: crate::results::Timestamp,
    // The key of the base's farm results, and whether they were reused.
    base_note: Option<String>,
) -> Result<Option<crate::verdict::State>> {
    use crate::run::store_runs;
    // The accelerator the kernels ran under: the boots', else the farm's.
    let accel = boots
        .iter()
        .chain(base_boots)
        .map(|b| b.accel.clone())
        .chain([farm_rev.accel.clone(), farm_base.accel.clone()])
        .find(|a| !a.is_empty())
        .unwrap_or_else(|| "none".into());
    let meta: Option<crate::kbuild::metadata::BuildMetadata> = b.base.keys().next().and_then(|v| {
        crate::kbuild::metadata::read_json(&RunFolder::new(out).base().metadata(v))
            .ok()
            .flatten()
    });
    let tools = meta.map(|m| m.tools).unwrap_or_default();
    let mut env = store_runs::environment(b, &accel, &tools);
    if let Some(n) = base_note {
        env.tools.insert("base farm results".into(), n);
    }
    let mut base = store_runs::base_run(b, out, base_boots, &env, started);
    let mut rev = store_runs::revision_run(name, b, boots, &env, started);
    base.tests.extend(farm_base.tests);
    base.measurements.extend(farm_base.measurements);
    rev.tests.extend(farm_rev.tests);
    rev.measurements.extend(farm_rev.measurements);
    let written = RunFolder::new(write_to);
    base.write(&written.results_base())?;
    rev.write(&written.results())?;
    let mut st = crate::store::open(store, crate::store::OpenMode::Create)?;
    // One transaction: a refused revision leaves no base run behind.
    st.record_runs(&[base.clone(), rev.clone()])?;
    let reference = rev.reference().expect("a revision run has a revision");
    let report =
        crate::verdict::advance(st.as_mut(), &reference, crate::results::Timestamp::now())?;
    info(&format!(
        "recorded runs {} and {} in {}",
        base.id,
        rev.id,
        crate::store::display_location(store)
    ));
    print!("{}", crate::verdict::render_text(&report));
    Ok(report.state)
}

/// Variants for a run, in build order (rust first: c reuses its tree).
pub fn ordered(mut v: Vec<Variant>) -> Vec<Variant> {
    v.sort_by_key(|x| *x != Variant::Rust);
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_revision_is_numeric_not_lexical() {
        let d = tempfile::tempdir().unwrap();
        for v in ["v7", "v8", "v10", "notes"] {
            std::fs::create_dir(d.path().join(v)).unwrap();
        }
        assert_eq!(newest_revision(d.path()).unwrap(), d.path().join("v10"));
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(SHIPPED_SERIES);
        assert!(newest_revision(&shipped).unwrap().ends_with("v8"));
    }

    #[test]
    fn rust_builds_first() {
        assert_eq!(
            ordered(vec![Variant::C, Variant::Rust, Variant::C]),
            [Variant::Rust, Variant::C]
        );
    }
}
