//! Measurements of a revision against the base: the one idea of noise of
//! the verdict. A regression or an improvement is called as everywhere in
//! the verdict ([`crate::verdict::stats`]: a one-sided Mann–Whitney test on
//! the pooled samples at p < 0.01 and a minimum effect of
//! [`REGRESSION_MIN_EFFECT`], half the [`TARGET_LOSS`] of 5 % that must be
//! caught). A judged throughput ([`JUDGED`]) with fewer than [`MIN_SAMPLES`]
//! samples on either side is MISS, never a pass. What is shown is what is
//! decided on: a revision's median against the base's median, and the span
//! of the base's pooled samples (its [`Band`]: median, lowest, highest).

use std::collections::BTreeMap;

use serde::Serialize;

use super::compare::{CheckKey, Finding, FindingKind};
use crate::results::{Measurement, Run, Status};

/// The base's samples as the call sees them: their median (what a
/// revision's median is compared with) and their span.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Band {
    pub median: f64,
    /// The lowest and the highest base sample.
    pub low: f64,
    pub high: f64,
    pub samples: usize,
}

/// The base's median and span; None below two samples.
pub fn band(samples: &[f64]) -> Option<Band> {
    let n = samples.len();
    if n < 2 {
        return None;
    }
    Some(Band {
        median: crate::verdict::stats::median(samples),
        low: samples.iter().copied().fold(f64::INFINITY, f64::min),
        high: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        samples: n,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Movement {
    /// Called worse: Mann–Whitney at p < ALPHA and the median at least
    /// [`REGRESSION_MIN_EFFECT`] worse.
    Regression,
    /// Called better, by the same rule the other way.
    Improvement,
    WithinNoise,
    /// Fewer than [`MIN_SAMPLES`] samples on a side: no call.
    NoBand,
    /// The base never measured it.
    NoBase,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasurementDelta {
    pub name: String,
    pub variant: Option<String>,
    pub unit: String,
    /// Median of the revision's samples (what the call compares).
    pub value: f64,
    pub samples: usize,
    /// The revision's samples themselves (pooled over its runs).
    pub values: Vec<f64>,
    pub base: Option<Band>,
    /// How many base samples the call had.
    pub base_samples: usize,
    /// (median − base median) / base median, in percent.
    pub delta_pct: Option<f64>,
    /// One-sided p-value of the movement (Mann–Whitney), when computed.
    pub p: Option<f64>,
    pub movement: Movement,
    /// For a [`JUDGED`] throughput with a base to compare with: the share of
    /// [`TARGET_LOSS`] losses the base's own noise lets the call catch with
    /// this many samples ([`crate::verdict::stats::power`]).
    pub power: Option<f64>,
}

impl MeasurementDelta {
    /// The call as it was decided, in words: the movement, the effect, the
    /// test and its p, the samples, and the power for a 5 % loss.
    pub fn call_text(&self) -> String {
        let label = match self.movement {
            Movement::Regression => "regression",
            Movement::Improvement => "improvement",
            Movement::WithinNoise => "within noise",
            Movement::NoBand => "no call",
            Movement::NoBase => "no call",
        };
        let mut s = label.to_string();
        match self.movement {
            Movement::NoBase => s.push_str(": the base never measured it"),
            Movement::NoBand => s.push_str(&format!(
                ": {} vs {} samples, {MIN_SAMPLES} a side needed",
                self.samples, self.base_samples
            )),
            _ => {
                if let Some(d) = self.delta_pct {
                    s.push_str(&format!(": median {d:+.1} %"));
                }
                if let Some(p) = self.p {
                    s.push_str(&format!(", Mann–Whitney one-sided {}", p_text(p)));
                }
                s.push_str(&format!(
                    ", {} vs {} samples (called at p < {} and {:.1} %)",
                    self.samples,
                    self.base_samples,
                    crate::verdict::stats::ALPHA,
                    REGRESSION_MIN_EFFECT * 100.0
                ));
            }
        }
        if let Some(pw) = self.power {
            s.push_str(&format!(
                "; power for a {:.0} % loss: {:.0} %",
                TARGET_LOSS * 100.0,
                pw * 100.0
            ));
        }
        s
    }
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

/// The throughput loss the farm must catch: 5 % (a driver that drops
/// frames, renegotiates or mis-programs pause costs more).
pub const TARGET_LOSS: f64 = 0.05;

/// Below this share slower than the base, a significant throughput
/// difference is not called a regression. It is half of [`TARGET_LOSS`]:
/// on a forwarded adapter the samples are the receiver's iperf3 intervals,
/// whose 1.5–7 % spread makes a true 5 % loss read from about 3 to 7 %, so
/// a threshold at 5 % itself would miss half of them; on the emulated one
/// they are the emulator's count of new TCP payload on the wire, which
/// agrees with itself to about 0.01 %. `bench/throughput-power.py` measures the spread, the
/// detected share of a 5 % slower wire and the false alarms of base against
/// base.
pub const REGRESSION_MIN_EFFECT: f64 = 0.025;

/// Fewest samples a side for a call: with five a side Mann–Whitney's
/// smallest one-sided p is 1/252 = 0.004, below [`stats::ALPHA`]; with four
/// it is 1/70 = 0.014, and no separation however clear could be called.
pub const MIN_SAMPLES: usize = 5;

/// Bootstrap trials behind a measurement's power.
const POWER_TRIALS: usize = 200;

/// The measurements the verdict must be able to judge: the throughput
/// check's rates. Too few samples of one of these, or none on the base, is
/// MISS: a regression that cannot be seen is not a pass.
pub const JUDGED: &[&str] = &[
    "farm.throughput.tcp_tx",
    "farm.throughput.tcp_rx",
    "farm.throughput.udp",
];

/// Every measurement of `this` against `base`: the base's median and span,
/// and the movement from a one-sided Mann–Whitney test on the samples with a
/// minimum effect of [`REGRESSION_MIN_EFFECT`] (see [`crate::verdict::stats`]),
/// given [`MIN_SAMPLES`] a side.
pub fn measurements(this: &[&Run], base: &[&Run]) -> Vec<MeasurementDelta> {
    let base = pool(base);
    pool(this)
        .into_iter()
        .map(|((name, variant), (samples, unit, lower_is_better))| {
            let value = crate::verdict::stats::median(&samples);
            let b = base.get(&(name.clone(), variant.clone()));
            let band = b.and_then(|b| band(&b.0));
            let mut p = None;
            let movement = match b {
                None => Movement::NoBase,
                Some(b) if b.0.len() < MIN_SAMPLES || samples.len() < MIN_SAMPLES => {
                    Movement::NoBand
                }
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
            let power = b
                .filter(|_| JUDGED.contains(&name.as_str()) && samples.len() >= MIN_SAMPLES)
                .and_then(|b| {
                    crate::verdict::stats::power(
                        &b.0,
                        samples.len().min(b.0.len()),
                        TARGET_LOSS,
                        REGRESSION_MIN_EFFECT,
                        POWER_TRIALS,
                    )
                });
            MeasurementDelta {
                name,
                variant,
                unit,
                value,
                samples: samples.len(),
                values: samples.clone(),
                base: band,
                base_samples: b.map_or(0, |b| b.0.len()),
                delta_pct: base_median
                    .filter(|m| *m != 0.0 && m.is_finite())
                    .map(|m| (crate::verdict::stats::median(&samples) - m) / m * 100.0),
                p,
                movement,
                power,
            }
        })
        .collect()
}

/// Throughput regressions against the base, as failures of the check that
/// measured them: "throughput regression vs base: tcp_tx −30.2 % (p = 0.004)";
/// and, as MISS of that check, a [`JUDGED`] rate with too few samples to
/// call: "too few samples: tcp_tx 2 < 5 (base 5)".
pub fn regressions(deltas: &[MeasurementDelta]) -> Vec<Finding> {
    let finding = |m: &MeasurementDelta, status: Status, detail: String| {
        let (check, _) = m.name.rsplit_once('.').unwrap_or((&m.name, ""));
        Finding {
            kind: if status == Status::Fail {
                FindingKind::NewFailure
            } else {
                FindingKind::Incomplete
            },
            check: CheckKey {
                path: check.to_string(),
                variant: m.variant.clone(),
            },
            status,
            reference: Some(Status::Pass),
            detail,
        }
    };
    let mut out = Vec::new();
    for m in deltas {
        let what = m.name.rsplit_once('.').map_or("", |x| x.1);
        if m.movement == Movement::Regression && m.unit.ends_with("bit/s") {
            out.push(finding(
                m,
                Status::Fail,
                format!(
                    "throughput regression vs base: {what} {:+.1} % ({}, {} vs {} samples)",
                    m.delta_pct.unwrap_or(0.0),
                    p_text(m.p.unwrap_or(1.0)),
                    m.samples,
                    m.base_samples
                ),
            ));
        } else if JUDGED.contains(&m.name.as_str())
            && matches!(m.movement, Movement::NoBand | Movement::NoBase)
        {
            let detail = if m.movement == Movement::NoBase || m.base_samples == 0 {
                format!("MISS: {what}: the base has no samples to compare with")
            } else if m.samples < MIN_SAMPLES {
                format!(
                    "MISS: too few samples: {what} {} < {MIN_SAMPLES} on the revision",
                    m.samples
                )
            } else {
                format!(
                    "MISS: too few samples: {what} {} < {MIN_SAMPLES} on the base",
                    m.base_samples
                )
            };
            out.push(finding(m, Status::Miss, detail));
        }
    }
    out
}

/// A p-value as a reader wants it: four decimals, or a bound when smaller.
pub fn p_text(p: f64) -> String {
    if p < 0.0001 {
        "p < 0.0001".into()
    } else {
        format!("p = {p:.4}")
    }
}
