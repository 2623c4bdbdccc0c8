//! The revision page: per-patch apply and build in each variant, the Rust
//! gates, the farm matrix, each against the base and the previous revision;
//! measurements with the base's samples (median, span); the warnings diff; the runs.

use std::collections::{BTreeMap, BTreeSet};

use phyfarm::results::{RevisionRef, Run, Status, Timestamp};
use phyfarm::store::{self, RevisionRecord, RunRecord, Store};
use phyfarm::verdict::{
    compare, Band, CheckKey, Checks, Finding, FindingKind, Movement, Report, Review, Transition,
};
use serde::Serialize;

use super::{
    clean, clean_reviews, clean_transitions, complete_runs, report, PageError, RevisionSummary,
};

/// One check of the revision with what it was in the base and in the
/// previous revision.
#[derive(Debug, Clone, Serialize)]
pub struct CheckCell {
    pub path: String,
    pub variant: Option<String>,
    pub status: Status,
    pub base: Option<Status>,
    pub previous: Option<Status>,
    /// new-failure, fixed, still-failing, incomplete (None: nothing to say).
    pub vs_base: Option<FindingKind>,
    pub vs_previous: Option<FindingKind>,
    pub flaky: Option<String>,
    pub excerpt: String,
    /// How many runs saw it.
    pub runs: usize,
    /// The latest run that has it (its logs are on that run's page).
    pub run: Option<String>,
    /// `phyfarm repro …` for a farm check that did not pass or is flaky.
    pub reproduce: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PatchRow {
    pub position: u32,
    pub subject: String,
    pub author: String,
    pub author_email: String,
    pub file: String,
    pub message_id: Option<String>,
    pub patch_id: String,
    pub apply: Option<CheckCell>,
    /// One per variant of [`RevisionPage::variants`].
    pub builds: Vec<Option<CheckCell>>,
}

/// A farm check across variants.
#[derive(Debug, Clone, Serialize)]
pub struct MatrixRow {
    pub check: String,
    /// One per variant of [`RevisionPage::variants`].
    pub cells: Vec<Option<CheckCell>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MeasurementRow {
    pub name: String,
    pub variant: Option<String>,
    pub unit: String,
    pub value: f64,
    pub samples: usize,
    /// The base's samples: median and span.
    pub band: Option<Band>,
    pub delta_pct: Option<f64>,
    pub movement: Movement,
    /// One-sided Mann–Whitney p-value of the call, when computed.
    pub p: Option<f64>,
    /// The call as the verdict decided it, in words (test, effect, p,
    /// samples, power for a 5 % loss).
    pub call: String,
    /// The share of 5 % losses the base's noise lets the call catch.
    pub power: Option<f64>,
    /// The revision's samples.
    pub values: Vec<f64>,
    /// The previous revision's value.
    pub previous: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WarningRow {
    pub build: String,
    pub detail: String,
    /// The warning lines this build added.
    pub lines: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunLink {
    pub id: String,
    pub started: Timestamp,
    pub finished: Option<Timestamp>,
    pub accelerator: String,
    pub state: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RevisionPage {
    pub generated: Timestamp,
    pub summary: RevisionSummary,
    pub tree: Option<String>,
    pub message_id: Option<String>,
    pub patchset_hash: String,
    /// The kernel base of the latest run.
    pub base: Option<String>,
    pub base_run: Option<String>,
    pub previous: Option<String>,
    pub next: Option<String>,
    pub variants: Vec<String>,
    pub patches: Vec<PatchRow>,
    pub gates: Vec<CheckCell>,
    pub farm: Vec<MatrixRow>,
    /// Checks of no other family (harness records, ...).
    pub other: Vec<CheckCell>,
    pub measurements: Vec<MeasurementRow>,
    pub warnings: Vec<WarningRow>,
    pub runs: Vec<RunLink>,
    pub transitions: Vec<Transition>,
    pub reviews: Vec<Review>,
    /// "2/5 subject (check (variant); how)", for each check that fails now.
    pub first_bad: Vec<String>,
}

fn finding_map(findings: &[Finding]) -> BTreeMap<CheckKey, FindingKind> {
    let mut m = BTreeMap::new();
    for f in findings
        .iter()
        .filter(|f| f.kind != FindingKind::NewWarning)
    {
        m.entry(f.check.clone()).or_insert(f.kind);
    }
    m
}

/// The base's check a per-patch build compares with.
fn base_key(key: &CheckKey) -> CheckKey {
    if key.family() == "build" && key.patch().is_some() {
        let variant = key.path.split('.').nth(1).unwrap_or("");
        return CheckKey {
            path: format!("build.{variant}.base"),
            variant: None,
        };
    }
    key.clone()
}

struct Cells<'a> {
    checks: &'a Checks,
    base: Checks,
    previous: Checks,
    vs_base: BTreeMap<CheckKey, FindingKind>,
    vs_previous: BTreeMap<CheckKey, FindingKind>,
    last_run: BTreeMap<CheckKey, String>,
    reproducers: BTreeMap<CheckKey, String>,
}

impl Cells<'_> {
    fn cell(&self, key: &CheckKey) -> Option<CheckCell> {
        let st = self.checks.get(key)?;
        let bk = base_key(key);
        Some(CheckCell {
            path: key.path.clone(),
            variant: key.variant.clone(),
            status: st.status,
            base: self
                .base
                .get(&bk)
                .or_else(|| (bk != *key).then(|| self.checks.get(&bk)).flatten())
                .map(|c| c.status),
            previous: self.previous.get(key).map(|c| c.status),
            vs_base: self.vs_base.get(key).copied(),
            vs_previous: self.vs_previous.get(key).copied(),
            flaky: st.flaky.as_deref().map(clean),
            excerpt: clean(&st.log_excerpt),
            runs: st.runs,
            run: self.last_run.get(key).cloned(),
            reproduce: self.reproducers.get(key).map(|c| clean(c)),
        })
    }
}

fn check_keys(run: &Run) -> Vec<CheckKey> {
    let builds = run.builds.iter().map(|b| CheckKey {
        path: b.path(),
        variant: None,
    });
    let tests = run.tests.iter().map(|t| CheckKey {
        path: t.path.clone(),
        variant: t.variant.clone(),
    });
    builds.chain(tests).collect()
}

/// What the revision page reads from the store, each once: the revision,
/// its report, its runs (the complete ones and all), the base run, every
/// revision (for the next one) and the previous revision's complete runs.
/// The sections below share them.
struct Read {
    rec: RevisionRecord,
    rep: Report,
    runs: Vec<Run>,
    all_runs: Vec<RunRecord>,
    base_run: Option<Run>,
    all: Vec<RevisionRecord>,
    prev_runs: Vec<Run>,
}

fn read(store: &dyn Store, r: &RevisionRef, now: Timestamp) -> Result<Read, PageError> {
    let rec = store.revision(r)?;
    let r = rec.reference();
    let rep = report(store, &r, now)?;
    let runs = complete_runs(store, &r)?;
    let all_runs = store.runs(&r)?;
    let base_run = match &rep.base_run {
        Some(id) => store.run(id)?.map(|x| x.run),
        None => None,
    };
    let all = store.revisions()?;
    let prev_runs = match store::previous_revision(&all, &rec) {
        Some(p) => complete_runs(store, &p.reference())?,
        None => vec![],
    };
    Ok(Read {
        rec,
        rep,
        runs,
        all_runs,
        base_run,
        all,
        prev_runs,
    })
}

/// Each check against the base, the previous revision and the latest run
/// that has it.
fn cells(read: &Read) -> Cells<'_> {
    let mut last_run = BTreeMap::new();
    for run in &read.runs {
        for k in check_keys(run) {
            last_run.insert(k, run.id.clone());
        }
    }
    let rep = &read.rep;
    Cells {
        checks: &rep.checks,
        base: compare::aggregate(&read.base_run.iter().collect::<Vec<_>>()),
        previous: compare::aggregate(&read.prev_runs.iter().collect::<Vec<_>>()),
        vs_base: finding_map(&rep.vs_base),
        vs_previous: finding_map(&rep.vs_previous),
        last_run,
        reproducers: rep
            .reproducers
            .iter()
            .map(|r| (r.check.clone(), r.command.clone()))
            .collect(),
    }
}

/// The variants the checks name: rust first, then c, then anything else.
fn variants(checks: &Checks) -> Vec<String> {
    let mut variants = BTreeSet::new();
    for k in checks.keys() {
        if let Some(v) = &k.variant {
            variants.insert(v.clone());
        }
        if k.family() == "build" {
            if let Some(v) = k.path.split('.').nth(1) {
                variants.insert(v.to_string());
            }
        }
    }
    let mut variants: Vec<String> = variants.into_iter().collect();
    variants.sort_by_key(|v| (v != "rust", v != "c", v.clone()));
    variants
}

/// Per patch: its apply and its build in each variant.
fn patch_rows(rec: &RevisionRecord, cells: &Cells, variants: &[String]) -> Vec<PatchRow> {
    let key = |path: String, variant: Option<String>| CheckKey { path, variant };
    let mut patches: Vec<PatchRow> = rec
        .info
        .patches
        .iter()
        .map(|p| PatchRow {
            position: p.position,
            subject: clean(&p.subject),
            author: clean(&p.author),
            author_email: clean(&p.author_email),
            file: clean(&p.file),
            message_id: p.message_id.as_deref().map(clean),
            patch_id: clean(&p.patch_id),
            apply: cells.cell(&key(format!("apply.patch{}", p.position), None)),
            builds: variants
                .iter()
                .map(|v| cells.cell(&key(format!("build.{v}.patch{}", p.position), None)))
                .collect(),
        })
        .collect();
    patches.sort_by_key(|p| p.position);
    patches
}

/// The checks not shown per patch: the Rust gates, the farm matrix, and
/// the rest.
struct CheckSections {
    gates: Vec<CheckCell>,
    farm: Vec<MatrixRow>,
    other: Vec<CheckCell>,
}

fn check_sections(rec: &RevisionRecord, cells: &Cells, variants: &[String]) -> CheckSections {
    let mut gates = Vec::new();
    let mut other = Vec::new();
    let mut farm: BTreeMap<String, Vec<Option<CheckCell>>> = BTreeMap::new();
    for k in cells.checks.keys() {
        match k.family() {
            "apply" | "build" => {
                // Shown per patch; base builds and stray ones too.
                let shown = k
                    .patch()
                    .is_some_and(|n| n as usize <= rec.info.patches.len());
                if !shown && !k.path.ends_with(".base") {
                    other.extend(cells.cell(k));
                }
            }
            "gate" => gates.extend(cells.cell(k)),
            "farm" => {
                let row = farm
                    .entry(k.path.clone())
                    .or_insert_with(|| vec![None; variants.len()]);
                let col = k
                    .variant
                    .as_ref()
                    .and_then(|v| variants.iter().position(|x| x == v));
                match col {
                    Some(i) => row[i] = cells.cell(k),
                    None => other.extend(cells.cell(k)),
                }
            }
            _ => other.extend(cells.cell(k)),
        }
    }
    let farm = farm
        .into_iter()
        .filter(|(_, c)| c.iter().any(Option::is_some))
        .map(|(check, cells)| MatrixRow { check, cells })
        .collect();
    CheckSections { gates, farm, other }
}

/// The measurements with the base's median and span and the previous revision's
/// value: throughput first, then link-flap timings, then the rest; rust
/// before c.
fn measurement_rows(rep: &Report, prev_runs: &[Run]) -> Vec<MeasurementRow> {
    let prev_values: BTreeMap<(String, Option<String>), f64> = {
        let refs: Vec<&Run> = prev_runs.iter().collect();
        compare::measurements(&refs, &[])
            .into_iter()
            .map(|m| ((m.name, m.variant), m.value))
            .collect()
    };
    let mut ordered: Vec<&compare::MeasurementDelta> = rep.measurements.iter().collect();
    ordered.sort_by_key(|m| {
        let family = if m.name.contains("throughput") {
            0
        } else if m.name.contains("flap") {
            1
        } else {
            2
        };
        let variant = m.variant.as_deref().map(|v| (v != "rust", v != "c"));
        (family, m.name.clone(), variant)
    });
    ordered
        .into_iter()
        .map(|m| MeasurementRow {
            name: m.name.clone(),
            variant: m.variant.clone(),
            unit: m.unit.clone(),
            value: m.value,
            samples: m.samples,
            band: m.base,
            delta_pct: m.delta_pct,
            movement: m.movement,
            p: m.p,
            call: m.call_text(),
            power: m.power,
            values: m.values.clone(),
            previous: prev_values
                .get(&(m.name.clone(), m.variant.clone()))
                .copied(),
        })
        .collect()
}

/// The warnings each build added against the base, with their lines from
/// the latest complete run.
fn warning_rows(rep: &Report, runs: &[Run]) -> Vec<WarningRow> {
    let last = runs.last();
    rep.vs_base
        .iter()
        .filter(|f| f.kind == FindingKind::NewWarning)
        .map(|f| WarningRow {
            build: f.check.path.clone(),
            detail: clean(&f.detail),
            lines: last
                .and_then(|run| run.builds.iter().find(|b| b.path() == f.check.path))
                .map(|b| b.new_warnings.iter().map(|w| clean(w)).collect())
                .unwrap_or_default(),
        })
        .collect()
}

/// Every run of the revision, complete or not.
fn run_links(all_runs: &[RunRecord]) -> Vec<RunLink> {
    all_runs
        .iter()
        .map(|x| RunLink {
            id: x.run.id.clone(),
            started: x.run.started,
            finished: x.run.finished,
            accelerator: clean(&x.run.environment.accelerator),
            state: x.state.name().to_string(),
        })
        .collect()
}

pub fn revision(
    store: &dyn Store,
    r: &RevisionRef,
    now: Timestamp,
) -> Result<RevisionPage, PageError> {
    let read = read(store, r, now)?;
    let (rec, rep) = (&read.rec, &read.rep);
    let cells = cells(&read);
    let variants = variants(&rep.checks);
    let patches = patch_rows(rec, &cells, &variants);
    let CheckSections { gates, farm, other } = check_sections(rec, &cells, &variants);
    let next = store::newer_revisions(&read.all, rec)
        .first()
        .map(|n| n.reference().to_string());
    Ok(RevisionPage {
        generated: now,
        summary: RevisionSummary::new(rec, rep, now),
        tree: rec.info.tree.as_deref().map(clean),
        message_id: rec.info.message_id.as_deref().map(clean),
        patchset_hash: rec.info.patchset_hash.clone(),
        base: read.all_runs.last().map(|x| clean(&x.run.base)),
        base_run: rep.base_run.clone(),
        previous: rep.previous.as_ref().map(|p| p.to_string()),
        next,
        variants,
        patches,
        gates,
        farm,
        other,
        measurements: measurement_rows(rep, &read.prev_runs),
        warnings: warning_rows(rep, &read.runs),
        runs: run_links(&read.all_runs),
        transitions: clean_transitions(&rep.transitions),
        reviews: clean_reviews(&rep.reviews),
        first_bad: rep
            .first_bad
            .iter()
            .map(|f| clean(&format!("{} ({})", f.name(), f.check)))
            .collect(),
    })
}
