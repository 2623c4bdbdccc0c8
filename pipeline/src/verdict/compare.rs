//! Comparing a revision's checks with the base and with the previous
//! revision, flake accounting, and the noise band for measurements.
//!
//! Retries and flakes: a farm check that fails is retried once and the retry
//! is stored as `attempt: 1`. The retry's status is the check's status in that
//! run; a FAIL or ERROR followed by a PASS (within a run, or between runs of the
//! same revision) marks the check **flaky**: it is listed in every report and
//! does not count as a new failure.
//!
//! Measurements: a regression or an improvement against the base is called
//! as everywhere in the verdict ([`crate::verdict::stats`]: a one-sided
//! Mann–Whitney test on the pooled samples and a minimum effect of
//! [`REGRESSION_MIN_EFFECT`]); fewer than 3 samples a side give no call. The
//! base's band, `[min(μ − 3s, min), max(μ + 3s, max)]` of its pooled samples,
//! is shown beside the value for the reader; it decides nothing.
//!
//! One file over 500 lines: every comparison rule (retry, flake, noise band,
//! previous revision) in one place, so the rules are read and changed together.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::results::{Measurement, Run, Status};

/// How many standard deviations the displayed base band spans either side
/// of the mean.
pub const NOISE_K: f64 = 3.0;

/// A check's identity across runs: its path and, for farm checks, the variant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct CheckKey {
    pub path: String,
    pub variant: Option<String>,
}

impl fmt::Display for CheckKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.variant {
            Some(v) => write!(f, "{} ({v})", self.path),
            None => f.write_str(&self.path),
        }
    }
}

impl CheckKey {
    /// The check family for patchwork contexts: `apply`, `build`, `gate`, `farm`.
    pub fn family(&self) -> &str {
        self.path.split('.').next().unwrap_or("")
    }

    /// For `build.<variant>.patchN`, the patch number.
    pub fn patch(&self) -> Option<u32> {
        let last = self.path.rsplit('.').next()?;
        last.strip_prefix("patch")?.parse().ok()
    }
}

/// A check's state over the runs of one revision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckState {
    /// After retries; PASS for a flaky check.
    pub status: Status,
    /// Why the check is flaky, if it is.
    pub flaky: Option<String>,
    pub log_excerpt: String,
    /// How many runs saw it.
    pub runs: usize,
}

pub type Checks = BTreeMap<CheckKey, CheckState>;

fn fails(s: Status) -> bool {
    matches!(s, Status::Fail | Status::Error)
}

/// The checks of one run, retries folded in: (status, flaky reason, excerpt).
fn run_checks(run: &Run) -> BTreeMap<CheckKey, (Status, Option<String>, String)> {
    let mut out = BTreeMap::new();
    for b in &run.builds {
        let key = CheckKey {
            path: b.path(),
            variant: None,
        };
        out.insert(key, (b.status, None, b.log_excerpt.clone()));
    }
    let mut attempts: BTreeMap<CheckKey, [Option<(Status, String)>; 2]> = BTreeMap::new();
    for t in &run.tests {
        let key = CheckKey {
            path: t.path.clone(),
            variant: t.variant.clone(),
        };
        let slot = attempts.entry(key).or_default();
        slot[usize::from(t.attempt >= 1)] = Some((t.status, t.log_excerpt.clone()));
    }
    for (key, [first, retry]) in attempts {
        let v = match (first, retry) {
            (Some((s0, x0)), Some((s1, x1))) => {
                let flaky = (fails(s0) && s1 == Status::Pass)
                    .then(|| format!("{s0} then PASS on retry in run {}", run.id));
                let excerpt = if s1 == Status::Pass { x0 } else { x1 };
                (s1, flaky, excerpt)
            }
            (Some((s, x)), None) | (None, Some((s, x))) => (s, None, x),
            (None, None) => continue,
        };
        out.insert(key, v);
    }
    out
}

/// The most telling line of a log excerpt: the first compiler error
/// (`error:`, `error[E0004]:`), the first kernel splat (a Rust panic with
/// its message, which the kernel prints on the next line), the first
/// FAIL/ERROR/MISS reason, else the first non-empty line. Never make's
/// closing "Error 2".
pub fn telling_line(excerpt: &str) -> String {
    let lines: Vec<&str> = excerpt
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let is = |l: &str, pats: &[&str]| pats.iter().any(|p| l.contains(p));
    let not_make = |l: &str| !l.starts_with("make");
    let compiler = ["error:", "error[E"];
    let splat = [
        "Kernel panic",
        "BUG:",
        "Oops",
        "WARNING:",
        "panicked at",
        "rust_panic",
    ];
    let reason = [
        "FAIL",
        "ERROR",
        "MISS",
        "rejected",
        "does not apply",
        "AssertionError",
        "CheckFailed",
    ];
    if let Some(l) = lines.iter().find(|l| is(l, &compiler) && not_make(l)) {
        return l.to_string();
    }
    // A line that announces what follows ("panicked at ...:", "patch 3
    // does not apply:") is told with the line after it.
    let with_next = |i: usize| match lines.get(i + 1) {
        Some(next) if lines[i].ends_with(':') => format!("{} {next}", lines[i]),
        _ => lines[i].to_string(),
    };
    if let Some(i) = lines.iter().position(|l| is(l, &splat)) {
        return with_next(i);
    }
    lines
        .iter()
        .position(|l| is(l, &reason) && not_make(l))
        .or_else(|| lines.iter().position(|l| not_make(l)))
        .map(with_next)
        .or_else(|| lines.first().map(|l| l.to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
mod telling_tests {
    use super::telling_line;

    #[test]
    fn the_first_compiler_error_not_makes_last_line() {
        let log = "  RUSTC L rust/kernel.o\nerror[E0308]: mismatched types\n --> drivers/net/phy/ax88796b_rust.rs:35:29\nmake[2]: *** [scripts/Makefile.build:290] Error 1\nmake: *** [Makefile:236: __sub-make] Error 2\n";
        assert_eq!(telling_line(log), "error[E0308]: mismatched types");
    }

    #[test]
    fn a_rust_panic_comes_with_its_message() {
        let log = "CheckFailed: flap 1: carrier still on\n[   12.1] rust_kernel: panicked at drivers/net/phy/ax88796b_rust.rs:96:13:\n[   12.1] ax88796b_rust: selftest: link lost\n[   12.2] ------------[ cut here ]------------\n";
        let t = telling_line(log);
        assert!(
            t.contains("panicked at drivers/net/phy/ax88796b_rust.rs:96:13:")
                && t.ends_with("selftest: link lost"),
            "{t}"
        );
    }

    #[test]
    fn a_heading_line_is_told_with_the_line_after_it() {
        let log = "patch 3 does not apply:\n  rust/Makefile hunk #1 @@ -15,6 +15,7 @@\nmore";
        assert_eq!(
            telling_line(log),
            "patch 3 does not apply: rust/Makefile hunk #1 @@ -15,6 +15,7 @@"
        );
    }

    #[test]
    fn otherwise_the_first_reason_line() {
        assert_eq!(
            telling_line("\n\nMISS: planned but not reported\nmore"),
            "MISS: planned but not reported"
        );
        assert_eq!(telling_line("just text\nmake: *** Error 2"), "just text");
        assert_eq!(telling_line(""), "");
    }
}

/// Fold the runs of one revision (oldest first) into one state per check.
pub fn aggregate(runs: &[&Run]) -> Checks {
    /// Per run: run id, status, flaky reason, log excerpt.
    type History = Vec<(String, Status, Option<String>, String)>;
    let mut seen: BTreeMap<CheckKey, History> = BTreeMap::new();
    for run in runs {
        for (key, (s, flaky, x)) in run_checks(run) {
            seen.entry(key)
                .or_default()
                .push((run.id.clone(), s, flaky, x));
        }
    }
    seen.into_iter()
        .map(|(key, hist)| {
            let mut flaky = hist.iter().find_map(|h| h.2.clone());
            let passed = hist.iter().find(|h| h.1 == Status::Pass);
            let failed = hist.iter().find(|h| fails(h.1));
            if flaky.is_none() {
                if let (Some(p), Some(f)) = (passed, failed) {
                    flaky = Some(format!("{} in run {}, PASS in run {}", f.1, f.0, p.0));
                }
            }
            let last = hist.last().map(|h| (h.1, h.3.clone()));
            let (status, log_excerpt) = last.unwrap_or((Status::Miss, String::new()));
            let excerpt = failed.map_or(log_excerpt, |f| f.3.clone());
            let state = CheckState {
                status: if flaky.is_some() {
                    Status::Pass
                } else {
                    status
                },
                flaky,
                log_excerpt: excerpt,
                runs: hist.len(),
            };
            (key, state)
        })
        .collect()
}

/// What a comparison found about one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// Fails here, not in the reference: counts against the series.
    NewFailure,
    /// Could not complete (ERROR/MISS): the outcome is unknown.
    Incomplete,
    /// More warnings than the build before the patch.
    NewWarning,
    /// Fails here and in the reference: not the series' fault.
    StillFailing,
    /// Passes here, failed in the reference.
    Fixed,
}

impl FindingKind {
    pub fn label(self) -> &'static str {
        match self {
            FindingKind::NewFailure => "new failure",
            FindingKind::Incomplete => "incomplete",
            FindingKind::NewWarning => "new warning",
            FindingKind::StillFailing => "still failing",
            FindingKind::Fixed => "fixed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub check: CheckKey,
    pub status: Status,
    /// The same check in the reference (base or previous revision).
    pub reference: Option<Status>,
    pub detail: String,
}

/// The reference check for `key`: a per-patch build is compared with the
/// base build of its variant.
fn reference_key(key: &CheckKey, against_base: bool) -> CheckKey {
    if against_base && key.family() == "build" && key.patch().is_some() {
        let variant = key.path.split('.').nth(1).unwrap_or("");
        return CheckKey {
            path: format!("build.{variant}.base"),
            variant: None,
        };
    }
    key.clone()
}

/// Classify every check of `this` against `reference`. With `against_base`,
/// per-patch builds compare with the base build (from `reference`, else from
/// `this` run's own base build).
pub fn compare(this: &Checks, reference: &Checks, against_base: bool) -> Vec<Finding> {
    let mut out = Vec::new();
    for (key, st) in this {
        let rk = reference_key(key, against_base);
        let r = reference
            .get(&rk)
            .or_else(|| this.get(&rk).filter(|_| rk != *key));
        let reference = r.map(|r| r.status);
        let excerpt = || telling_line(&st.log_excerpt);
        let kind = match (st.status, reference) {
            (Status::Fail, Some(Status::Fail)) => Some(FindingKind::StillFailing),
            (Status::Fail, _) => Some(FindingKind::NewFailure),
            // Incomplete here is incomplete, whatever the reference did: the
            // verdict waits for the evidence.
            (s, _) if s.incomplete() => Some(FindingKind::Incomplete),
            (Status::Pass, Some(Status::Fail)) => Some(FindingKind::Fixed),
            _ => None,
        };
        if let Some(kind) = kind {
            out.push(Finding {
                kind,
                check: key.clone(),
                status: st.status,
                reference,
                detail: excerpt(),
            });
        }
    }
    out.sort_by(|a, b| (a.kind, &a.check).cmp(&(b.kind, &b.check)));
    out
}

/// New warnings of the per-patch builds of `run`, against the base build of
/// the same variant (the run's own, else `base`'s).
pub fn new_warnings(run: &Run, base: Option<&Run>) -> Vec<Finding> {
    let base_warnings = |variant: &str| {
        let pick = |r: &Run| {
            r.builds
                .iter()
                .find(|b| b.patch.is_none() && b.variant == variant)
                .map(|b| b.warnings)
        };
        pick(run).or_else(|| base.and_then(pick))
    };
    let mut out = Vec::new();
    for b in run.builds.iter().filter(|b| b.patch.is_some()) {
        let before = base_warnings(&b.variant);
        let more = before.is_some_and(|w| b.warnings > w);
        if b.new_warnings.is_empty() && !more {
            continue;
        }
        let mut detail = match before {
            Some(w) => format!("warnings before: {w} this patch: {}", b.warnings),
            None => format!("warnings this patch: {}", b.warnings),
        };
        if let Some(first) = b.new_warnings.first() {
            detail.push_str(&format!("; new: {first}"));
        }
        out.push(Finding {
            kind: FindingKind::NewWarning,
            check: CheckKey {
                path: b.path(),
                variant: None,
            },
            status: b.status,
            reference: None,
            detail,
        });
    }
    out
}

/// The noise band of a set of base samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Band {
    pub mean: f64,
    pub stddev: f64,
    pub low: f64,
    pub high: f64,
    pub samples: usize,
}

/// `[min(μ − kσ, min), max(μ + kσ, max)]`; None below two samples.
pub fn band(samples: &[f64]) -> Option<Band> {
    let n = samples.len();
    if n < 2 {
        return None;
    }
    let mean = samples.iter().sum::<f64>() / n as f64;
    let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let stddev = var.sqrt();
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Band {
        mean,
        stddev,
        low: (mean - NOISE_K * stddev).min(min),
        high: (mean + NOISE_K * stddev).max(max),
        samples: n,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Movement {
    /// Outside the band on the worse side.
    Regression,
    /// Outside the band on the better side.
    Improvement,
    WithinNoise,
    /// Fewer than two base samples: no call.
    NoBand,
    /// The base never measured it.
    NoBase,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasurementDelta {
    pub name: String,
    pub variant: Option<String>,
    pub unit: String,
    /// Mean of the revision's samples.
    pub value: f64,
    pub samples: usize,
    /// The revision's samples themselves (pooled over its runs).
    pub values: Vec<f64>,
    pub base: Option<Band>,
    /// (median − base median) / base median, in percent.
    pub delta_pct: Option<f64>,
    /// One-sided p-value of the movement (Mann–Whitney), when computed.
    pub p: Option<f64>,
    pub movement: Movement,
}

fn samples_of(m: &Measurement) -> Vec<f64> {
    if m.samples.is_empty() {
        vec![m.value]
    } else {
        m.samples.clone()
    }
}

type MKey = (String, Option<String>);

fn pool(runs: &[&Run]) -> BTreeMap<MKey, (Vec<f64>, String, bool)> {
    let mut out: BTreeMap<MKey, (Vec<f64>, String, bool)> = BTreeMap::new();
    for r in runs {
        for m in &r.measurements {
            let e = out
                .entry((m.name.clone(), m.variant.clone()))
                .or_insert_with(|| (vec![], m.unit.clone(), m.lower_is_better));
            e.0.extend(samples_of(m));
        }
    }
    out
}

/// Below this share slower than the base, a throughput difference is not
/// called a regression: on a 2-core TCG host with other work running, two
/// guests of one farm run measured 83.6 and 94.9 Mbit/s (12 % apart) with
/// kernels whose data path is the same.
pub const REGRESSION_MIN_EFFECT: f64 = 0.15;

/// Every measurement of `this` against `base`: the band for display, and
/// the movement from a one-sided Mann–Whitney test on the samples with a
/// minimum effect of [`REGRESSION_MIN_EFFECT`] (see [`crate::verdict::stats`]).
pub fn measurements(this: &[&Run], base: &[&Run]) -> Vec<MeasurementDelta> {
    let base = pool(base);
    pool(this)
        .into_iter()
        .map(|((name, variant), (samples, unit, lower_is_better))| {
            let value = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
            let b = base.get(&(name.clone(), variant.clone()));
            let band = b.and_then(|b| band(&b.0));
            let mut p = None;
            let movement = match b {
                None => Movement::NoBase,
                Some(b) if b.0.len() < 3 || samples.len() < 3 => Movement::NoBand,
                Some(b) => {
                    // For times, "worse" is higher: the base is then the
                    // lower one.
                    let (bs, ts) = (&b.0[..], &samples[..]);
                    let (worse, better) = if lower_is_better {
                        (
                            crate::verdict::stats::lower(ts, bs, REGRESSION_MIN_EFFECT),
                            crate::verdict::stats::lower(bs, ts, REGRESSION_MIN_EFFECT),
                        )
                    } else {
                        (
                            crate::verdict::stats::lower(bs, ts, REGRESSION_MIN_EFFECT),
                            crate::verdict::stats::lower(ts, bs, REGRESSION_MIN_EFFECT),
                        )
                    };
                    if let Some(w) = worse {
                        p = Some(w.p);
                        Movement::Regression
                    } else if let Some(x) = better {
                        p = Some(x.p);
                        Movement::Improvement
                    } else {
                        p = crate::verdict::stats::p_smaller(ts, bs);
                        Movement::WithinNoise
                    }
                }
            };
            let base_median = b.map(|b| crate::verdict::stats::median(&b.0));
            MeasurementDelta {
                name,
                variant,
                unit,
                value,
                samples: samples.len(),
                values: samples.clone(),
                base: band,
                delta_pct: base_median
                    .filter(|m| *m != 0.0 && m.is_finite())
                    .map(|m| (crate::verdict::stats::median(&samples) - m) / m * 100.0),
                p,
                movement,
            }
        })
        .collect()
}

/// Throughput regressions against the base, as failures of the check that
/// measured them: "throughput regression vs base: tcp_tx −30.2 % (p = 0.004)".
pub fn regressions(deltas: &[MeasurementDelta]) -> Vec<Finding> {
    deltas
        .iter()
        .filter(|m| m.movement == Movement::Regression && m.unit.ends_with("bit/s"))
        .map(|m| {
            let (check, what) = m.name.rsplit_once('.').unwrap_or((&m.name, ""));
            Finding {
                kind: FindingKind::NewFailure,
                check: CheckKey {
                    path: check.to_string(),
                    variant: m.variant.clone(),
                },
                status: Status::Fail,
                reference: Some(Status::Pass),
                detail: format!(
                    "throughput regression vs base: {what} {:+.1} % ({})",
                    m.delta_pct.unwrap_or(0.0),
                    p_text(m.p.unwrap_or(1.0))
                ),
            }
        })
        .collect()
}

/// A p-value as a reader wants it: four decimals, or a bound when smaller.
pub fn p_text(p: f64) -> String {
    if p < 0.0001 {
        "p < 0.0001".into()
    } else {
        format!("p = {p:.4}")
    }
}
