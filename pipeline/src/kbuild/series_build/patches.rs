//! Step 3 of a series build: each patch applied onto the series tree with
//! `git am` (or found already applied, or its rejected hunks collected),
//! then built in every variant, its new warnings counted against the base's.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;

use super::tree::SeriesTree;
use super::{printable, Ctx, PatchBuild};
use crate::config::Variant;
use crate::ingest::series::{self, Series};
use crate::kbuild::apply::{self, ApplyReport, ApplyState};
use crate::kbuild::kernel::{self, Layout};
use crate::kbuild::metadata::{self, Status};
use crate::kbuild::warnings::{self, Warning};
use crate::progress::{info, warn};
use crate::run_folder::RunFolder;

/// The per-patch records of a series build: how each patch applied, each
/// build after one, and whether a patch failed to apply (nothing is built
/// from there on).
pub(super) struct Patched {
    pub reports: Vec<ApplyReport>,
    pub builds: Vec<PatchBuild>,
    pub broken: bool,
    /// Artifacts refused when copied out, each starting with its variant's
    /// label (`[rust]`).
    pub refused: Vec<String>,
}

/// Step 3: apply and build, patch by patch.
pub(super) fn apply_and_build(ctx: &Ctx, s: &Series, tree: &mut SeriesTree) -> Result<Patched> {
    let mut rec = Patched {
        reports: Vec::new(),
        builds: Vec::new(),
        broken: false,
        refused: Vec::new(),
    };
    for p in &s.patches {
        let name = format!("/patches/{:04}.patch", p.index);
        let label = format!("[{}/{}]", p.index, p.total);
        info(&format!("{label} applying: {}", printable(&p.subject)));
        let report = apply_one(ctx, &mut tree.log, &name, p.index as usize)?;
        let state = report.state;
        say_applied(&label, &report);
        rec.reports.push(report);
        if state == ApplyState::Failed {
            rec.broken = true;
        }
        if rec.broken {
            continue;
        }
        for v in &ctx.opts.variants {
            rec.builds.push(build_after(ctx, p.index, p.total, *v)?);
        }
    }
    Ok(rec)
}

/// How a patch applied, on the terminal (a failure with its rejected hunks).
fn say_applied(label: &str, report: &ApplyReport) {
    match report.state {
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
    let argv = kernel::bzimage_argv(ctx.opts.jobs);
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
pub(super) fn accepted(dir: &Path) -> Result<Vec<series::AcceptedWarning>> {
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
pub(super) fn accept_warnings(
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
