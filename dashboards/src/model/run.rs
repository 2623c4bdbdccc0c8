//! The run page (environment, logs, reproducer) and the farm page (recent
//! runs, durations, flaky checks).

use std::collections::{BTreeMap, BTreeSet};

use phyfarm::results::{Environment, Measurement, Run, Status, Timestamp};
use phyfarm::store::{RunRecord, Store};
use serde::Serialize;

use super::{clean, report, PageError};
use crate::text::{log_lines, LineKind, LogLine};

/// How many checks ended in each status.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StatusCounts(pub BTreeMap<Status, usize>);

impl StatusCounts {
    fn of(run: &Run) -> StatusCounts {
        let mut m = BTreeMap::new();
        let statuses = run
            .builds
            .iter()
            .map(|b| b.status)
            .chain(run.tests.iter().map(|t| t.status));
        for s in statuses {
            *m.entry(s).or_insert(0) += 1;
        }
        StatusCounts(m)
    }

    pub fn worst(&self) -> Option<Status> {
        self.0.keys().next().copied()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildRow {
    pub path: String,
    pub variant: String,
    pub patch: Option<u32>,
    pub status: Status,
    pub duration_s: f64,
    pub warnings: u32,
    pub new_warnings: Vec<String>,
    pub log_path: Option<String>,
    pub log: Vec<LogLine>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TestRow {
    pub path: String,
    pub variant: Option<String>,
    pub status: Status,
    pub attempt: u32,
    pub duration_s: Option<f64>,
    pub log_path: Option<String>,
    pub log: Vec<LogLine>,
    /// The log has an oops, BUG, WARN or panic line.
    pub oops: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunPage {
    pub generated: Timestamp,
    pub id: String,
    pub state: String,
    /// `<series>/v<N>`, or None for a run of the unpatched base.
    pub revision: Option<String>,
    pub base: String,
    pub environment: Environment,
    pub started: Timestamp,
    pub finished: Option<Timestamp>,
    pub duration_s: Option<f64>,
    pub reproducer: String,
    pub counts: StatusCounts,
    pub builds: Vec<BuildRow>,
    pub tests: Vec<TestRow>,
    pub measurements: Vec<Measurement>,
}

fn duration(run: &Run) -> Option<f64> {
    run.finished.map(|f| (f.0 - run.started.0) as f64)
}

pub fn run(store: &dyn Store, id: &str, now: Timestamp) -> Result<RunPage, PageError> {
    let rec = store
        .run(id)?
        .ok_or_else(|| PageError::NotFound(format!("no run {id:?} in the store")))?;
    let run = rec.run;
    let builds = run
        .builds
        .iter()
        .map(|b| BuildRow {
            path: b.path(),
            variant: b.variant.clone(),
            patch: b.patch,
            status: b.status,
            duration_s: b.duration_s,
            warnings: b.warnings,
            new_warnings: b.new_warnings.iter().map(|w| clean(w)).collect(),
            log_path: b.log_path.as_deref().map(clean),
            log: log_lines(&b.log_excerpt),
        })
        .collect();
    let tests = run
        .tests
        .iter()
        .map(|t| {
            let log = log_lines(&t.log_excerpt);
            TestRow {
                path: t.path.clone(),
                variant: t.variant.clone(),
                status: t.status,
                attempt: t.attempt,
                duration_s: t.duration_s,
                log_path: t.log_path.as_deref().map(clean),
                oops: log.iter().any(|l| l.kind == LineKind::Oops),
                log,
            }
        })
        .collect();
    Ok(RunPage {
        generated: now,
        id: run.id.clone(),
        state: rec.state.name().to_string(),
        revision: run.reference().map(|r| r.to_string()),
        base: clean(&run.base),
        environment: Environment {
            accelerator: clean(&run.environment.accelerator),
            host: clean(&run.environment.host),
            arch: clean(&run.environment.arch),
            images: run
                .environment
                .images
                .iter()
                .map(|(k, v)| (clean(k), clean(v)))
                .collect(),
            tools: run
                .environment
                .tools
                .iter()
                .map(|(k, v)| (clean(k), clean(v)))
                .collect(),
        },
        started: run.started,
        finished: run.finished,
        duration_s: duration(&run),
        reproducer: clean(&run.reproducer),
        counts: StatusCounts::of(&run),
        builds,
        tests,
        measurements: run.measurements.clone(),
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub id: String,
    pub revision: Option<String>,
    pub base: String,
    pub accelerator: String,
    pub host: String,
    pub state: String,
    pub started: Timestamp,
    pub finished: Option<Timestamp>,
    pub duration_s: Option<f64>,
    pub counts: StatusCounts,
    pub worst: Option<Status>,
}

impl RunSummary {
    fn of(rec: &RunRecord) -> RunSummary {
        let counts = StatusCounts::of(&rec.run);
        RunSummary {
            id: rec.run.id.clone(),
            revision: rec.run.reference().map(|r| r.to_string()),
            base: clean(&rec.run.base),
            accelerator: clean(&rec.run.environment.accelerator),
            host: clean(&rec.run.environment.host),
            state: rec.state.name().to_string(),
            started: rec.run.started,
            finished: rec.run.finished,
            duration_s: duration(&rec.run),
            worst: counts.worst(),
            counts,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FlakyRow {
    pub revision: String,
    pub check: String,
    pub variant: Option<String>,
    pub reason: String,
}

/// How long a farm check takes, over every stored run.
#[derive(Debug, Clone, Serialize)]
pub struct CheckDuration {
    pub path: String,
    pub variant: Option<String>,
    pub runs: usize,
    pub mean_s: f64,
    pub max_s: f64,
    /// Attempts that did not pass.
    pub not_passed: usize,
}

/// How often a farm check flipped (failed, then passed on its retry) over
/// the recent runs of the unpatched base: the farm's own noise per check.
#[derive(Debug, Clone, Serialize)]
pub struct FlakeRate {
    pub path: String,
    pub variant: Option<String>,
    /// Base runs that ran the check (the newest [`FLAKE_WINDOW`]).
    pub runs: usize,
    /// Of those, runs where it failed and passed on its retry.
    pub flaky: usize,
    pub rate: f64,
}

/// Base runs the flake rate looks back over.
pub const FLAKE_WINDOW: usize = 20;

#[derive(Debug, Clone, Serialize)]
pub struct FarmPage {
    pub generated: Timestamp,
    /// Newest first, at most [`RECENT`].
    pub runs: Vec<RunSummary>,
    pub total_runs: usize,
    pub accelerators: BTreeMap<String, usize>,
    pub flaky: Vec<FlakyRow>,
    /// Per farm check over recent base runs; highest rate first.
    pub base_flake_rates: Vec<FlakeRate>,
    /// Slowest first.
    pub durations: Vec<CheckDuration>,
}

/// Flake rate per farm check over the newest [`FLAKE_WINDOW`] base runs
/// (`runs` newest first).
pub fn base_flake_rates(runs: &[RunRecord]) -> Vec<FlakeRate> {
    let mut per: BTreeMap<(String, Option<String>), (usize, usize)> = BTreeMap::new();
    for r in runs
        .iter()
        .filter(|r| r.run.revision.is_none())
        .take(FLAKE_WINDOW)
    {
        let mut attempts: BTreeMap<(String, Option<String>), [Option<Status>; 2]> = BTreeMap::new();
        for t in r.run.tests.iter().filter(|t| t.path.starts_with("farm.")) {
            let slot = attempts
                .entry((t.path.clone(), t.variant.clone()))
                .or_default();
            slot[usize::from(t.attempt >= 1)] = Some(t.status);
        }
        for (k, [first, retry]) in attempts {
            let e = per.entry(k).or_default();
            e.0 += 1;
            let failed = matches!(first, Some(Status::Fail | Status::Error));
            if failed && retry == Some(Status::Pass) {
                e.1 += 1;
            }
        }
    }
    let mut out: Vec<FlakeRate> = per
        .into_iter()
        .map(|((path, variant), (runs, flaky))| FlakeRate {
            path,
            variant,
            runs,
            flaky,
            rate: flaky as f64 / runs.max(1) as f64,
        })
        .collect();
    out.sort_by(|a, b| b.rate.total_cmp(&a.rate).then(a.path.cmp(&b.path)));
    out
}

/// Runs listed on the farm page.
pub const RECENT: usize = 50;

/// Every stored run: of every revision and of every base they used.
pub fn all_runs(store: &dyn Store) -> Result<Vec<RunRecord>, PageError> {
    let mut out: Vec<RunRecord> = Vec::new();
    let mut bases = BTreeSet::new();
    for rec in store.revisions()? {
        for r in store.runs(&rec.reference())? {
            bases.insert(r.run.base.clone());
            out.push(r);
        }
    }
    for b in bases {
        out.extend(store.base_runs(&b)?);
    }
    let mut seen = BTreeSet::new();
    out.retain(|r| seen.insert(r.run.id.clone()));
    out.sort_by(|a, b| (b.run.started, &b.run.id).cmp(&(a.run.started, &a.run.id)));
    Ok(out)
}

pub fn farm(store: &dyn Store, now: Timestamp) -> Result<FarmPage, PageError> {
    let runs = all_runs(store)?;
    let mut accelerators = BTreeMap::new();
    let mut durations: BTreeMap<(String, Option<String>), (Vec<f64>, usize)> = BTreeMap::new();
    for r in &runs {
        *accelerators
            .entry(clean(&r.run.environment.accelerator))
            .or_insert(0) += 1;
        for t in r.run.tests.iter().filter(|t| t.path.starts_with("farm.")) {
            let e = durations
                .entry((t.path.clone(), t.variant.clone()))
                .or_default();
            if let Some(d) = t.duration_s.filter(|d| d.is_finite()) {
                e.0.push(d);
            }
            if t.status != Status::Pass {
                e.1 += 1;
            }
        }
    }
    let mut durations: Vec<CheckDuration> = durations
        .into_iter()
        .filter(|(_, (d, _))| !d.is_empty())
        .map(|((path, variant), (d, not_passed))| CheckDuration {
            path,
            variant,
            runs: d.len(),
            mean_s: d.iter().sum::<f64>() / d.len() as f64,
            max_s: d.iter().copied().fold(0.0, f64::max),
            not_passed,
        })
        .collect();
    durations.sort_by(|a, b| b.mean_s.total_cmp(&a.mean_s));
    let mut flaky = Vec::new();
    for rec in store.revisions()? {
        let rep = report(store, &rec.reference(), now)?;
        for (k, c) in rep.flaky() {
            flaky.push(FlakyRow {
                revision: rep.revision.to_string(),
                check: k.path.clone(),
                variant: k.variant.clone(),
                reason: clean(c.flaky.as_deref().unwrap_or_default()),
            });
        }
    }
    Ok(FarmPage {
        generated: now,
        total_runs: runs.len(),
        runs: runs.iter().take(RECENT).map(RunSummary::of).collect(),
        accelerators,
        flaky,
        base_flake_rates: base_flake_rates(&runs),
        durations,
    })
}

#[cfg(test)]
mod flake_tests {
    use super::*;
    use phyfarm::results::{Environment, Run, TestResult, Timestamp};
    use phyfarm::store::RunState;

    fn base_run(id: &str, flap: &[Status]) -> RunRecord {
        let test = |attempt: u32, status: Status| TestResult {
            path: "farm.link_flap[plain]".into(),
            variant: Some("rust".into()),
            status,
            duration_s: Some(40.0),
            log_path: None,
            log_excerpt: String::new(),
            attempt,
        };
        RunRecord {
            state: RunState::Complete,
            run: Run {
                schema: phyfarm::results::RESULTS_SCHEMA,
                id: id.into(),
                revision: None,
                base: "linux-source-6.12 6.12.118-1".into(),
                environment: Environment::default(),
                started: Timestamp(0),
                finished: None,
                reproducer: String::new(),
                builds: vec![],
                tests: flap
                    .iter()
                    .enumerate()
                    .map(|(i, s)| test(i as u32, *s))
                    .collect(),
                measurements: vec![],
            },
        }
    }

    #[test]
    fn the_flake_rate_counts_fail_then_pass_over_recent_base_runs() {
        let runs = vec![
            base_run("a", &[Status::Fail, Status::Pass]),
            base_run("b", &[Status::Pass]),
            base_run("c", &[Status::Fail, Status::Fail]),
            base_run("d", &[Status::Error, Status::Pass]),
        ];
        let r = base_flake_rates(&runs);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].runs, r[0].flaky), (4, 2));
        assert!((r[0].rate - 0.5).abs() < 1e-9);
        let many: Vec<RunRecord> = (0..30)
            .map(|i| base_run(&i.to_string(), &[Status::Pass]))
            .collect();
        assert_eq!(base_flake_rates(&many)[0].runs, FLAKE_WINDOW);
    }
}
