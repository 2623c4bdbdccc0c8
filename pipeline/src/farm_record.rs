//! The farm inside `phyfarm run`: run it on a set of kernels, retry the
//! checks that failed once (recorded as their retry, so a check that passes
//! the second time is flaky rather than a failure of the series), and turn
//! its results.json into the store's tests and measurements.

use std::path::Path;

use crate::config::Paths;
use crate::farm::TestOptions;
use crate::progress::{info, warn};
use crate::results::Status;
use crate::Outcome;

pub use crate::contract::retry_dir;

/// Run the farm on the kernels under `artifacts` (`<variant>/bzImage`) into
/// `out`; a failed check runs once more into [`retry_dir`]. Returns the
/// outcome and, when the farm itself could not run, why.
pub fn farm(
    paths: &Paths,
    base: &TestOptions,
    artifacts: &Path,
    out: &Path,
) -> (Outcome, Option<String>) {
    // What an earlier run left in this run folder (its results were recorded
    // then) must not be read as this run's: a stale retry would pass for
    // this run's second attempt.
    if let Err(e) = clear(out) {
        let why = format!("cannot clear {} for this run: {e}", out.display());
        warn(&why);
        return (Outcome::Error, Some(why));
    }
    let first = farm_once(paths, base, artifacts, out, None);
    let Some(failed) = failed_selection(out).filter(|_| first.0 == Outcome::Fail) else {
        return first;
    };
    info(&format!("retrying the failed farm checks once: {failed}"));
    farm_once(paths, base, artifacts, &retry_dir(out), Some(failed))
}

pub(crate) fn farm_once(
    paths: &Paths,
    base: &TestOptions,
    artifacts: &Path,
    out: &Path,
    keyword: Option<String>,
) -> (Outcome, Option<String>) {
    let mut o = base.clone();
    o.artifacts = Some(artifacts.to_path_buf());
    o.out = Some(out.to_path_buf());
    if keyword.is_some() {
        o.keyword = keyword;
    }
    let repro = format!(
        "phyfarm test --artifacts {} -o {}",
        artifacts.display(),
        out.display()
    );
    match crate::farm::test(paths, &o, &repro) {
        Ok(x) => (x, None),
        Err(e) => {
            let why = format!("the farm could not run on {}: {e:#}", artifacts.display());
            warn(&why);
            (Outcome::Error, Some(why))
        }
    }
}

fn is_word(w: &str) -> bool {
    !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A pytest `-k` expression selecting the tests that failed in `out`, e.g.
/// `(test_speed_duplex and rust)`; None when none failed.
pub fn failed_selection(out: &Path) -> Option<String> {
    let r = crate::contract::FarmResults::load(&out.join("results.json")).ok()??;
    let mut parts: Vec<String> = Vec::new();
    for t in &r.tests {
        if !matches!(t.status, Status::Fail | Status::Error) {
            continue;
        }
        let node = t.nodeid.as_str();
        if node.is_empty() {
            continue;
        }
        let name = node.rsplit("::").next().unwrap_or(node);
        let (func, param) = match name.split_once('[') {
            Some((f, p)) => (f, Some(p.trim_end_matches(']'))),
            None => (name, None),
        };
        if !is_word(func) {
            continue;
        }
        let expr = match param.filter(|p| is_word(p)) {
            Some(p) => format!("({func} and {p})"),
            None => func.to_string(),
        };
        if !parts.contains(&expr) {
            parts.push(expr);
        }
    }
    (!parts.is_empty()).then(|| parts.join(" or "))
}

/// Remove a farm output folder and its retry folder, if there.
fn clear(out: &Path) -> std::io::Result<()> {
    remove_stale(out)?;
    remove_stale(&retry_dir(out))
}

fn remove_stale(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Throughput measurements of `rev` that look like a regression against
/// `base` (the verdict's rule), by measurement name and variant.
pub fn suspected_regressions(
    base: &crate::contract::FarmImport,
    rev: &crate::contract::FarmImport,
) -> Vec<(String, Option<String>)> {
    rev.measurements
        .iter()
        .filter(|m| m.unit.ends_with("bit/s"))
        .filter(|m| {
            base.measurements
                .iter()
                .find(|b| b.name == m.name && b.variant == m.variant)
                .is_some_and(|b| {
                    crate::stats::lower(
                        &b.samples,
                        &m.samples,
                        crate::verdict::compare::REGRESSION_MIN_EFFECT,
                    )
                    .is_some()
                })
        })
        .map(|m| (m.name.clone(), m.variant.clone()))
        .collect()
}

/// Rounds of the interleaved re-measurement.
pub const CONFIRM_ROUNDS: usize = 2;

/// A throughput regression is only called on samples that machine noise hit
/// alike: base and revision measured again, alternately, [`CONFIRM_ROUNDS`]
/// times each, in this invocation. Their samples replace the first ones of
/// both sides (which were taken minutes apart); a round that fails leaves
/// the first samples in place.
pub fn confirm_throughput(
    paths: &Paths,
    opts: &TestOptions,
    (base_art, rev_art): (&Path, &Path),
    out: &Path,
    base: &mut crate::contract::FarmImport,
    rev: &mut crate::contract::FarmImport,
) {
    let suspects = suspected_regressions(base, rev);
    if suspects.is_empty() {
        return;
    }
    let names: Vec<String> = suspects
        .iter()
        .map(|(n, v)| format!("{n} ({})", v.as_deref().unwrap_or("-")))
        .collect();
    info(&format!(
        "throughput lower than the base ({}): measuring base and revision again, interleaved",
        names.join(", ")
    ));
    let mut fresh: [Vec<crate::contract::FarmResults>; 2] = [vec![], vec![]];
    for round in 0..CONFIRM_ROUNDS {
        for (side, art) in [(0, base_art), (1, rev_art)] {
            let dir = out.join(format!(
                "throughput-{}-{round}",
                if side == 0 { "base" } else { "revision" }
            ));
            if remove_stale(&dir).is_err() {
                warn(&format!(
                    "cannot clear {}; keeping the first samples",
                    dir.display()
                ));
                return;
            }
            let (o, _) = farm_once(paths, opts, art, &dir, Some("throughput".into()));
            match crate::contract::FarmResults::load(&dir.join("results.json")) {
                Ok(Some(r)) if o != Outcome::Error => fresh[side].push(r),
                _ => {
                    warn(&format!(
                        "the interleaved throughput round {} failed; keeping the first samples",
                        dir.display()
                    ));
                    return;
                }
            }
        }
    }
    for (side, imp) in [(0, base), (1, rev)] {
        for m in imp
            .measurements
            .iter_mut()
            .filter(|m| m.unit.ends_with("bit/s"))
        {
            let mut samples = Vec::new();
            for r in &fresh[side] {
                for t in r.tests.iter().filter(|t| t.variant == m.variant) {
                    for x in &t.measurements {
                        if format!("{}.{}", t.id, x.name) == m.name {
                            samples.extend(if x.samples.is_empty() {
                                vec![x.value]
                            } else {
                                x.samples.clone()
                            });
                        }
                    }
                }
            }
            if !samples.is_empty() {
                m.value = samples.iter().sum::<f64>() / samples.len() as f64;
                m.samples = samples;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::tests::write_results;

    #[test]
    fn failed_checks_become_a_keyword_selection() {
        let d = tempfile::tempdir().unwrap();
        write_results(
            d.path(),
            serde_json::json!([
                {"id": "farm.speed_duplex", "nodeid": "pytest-tests/farm/test_speed_duplex.py::test_speed_duplex[rust]", "variant": "rust", "status": "FAIL"},
                {"id": "farm.probe", "nodeid": "pytest-tests/farm/test_probe.py::test_probe[c]", "variant": "c", "status": "PASS"},
                {"id": "farm.link_flap[plain]", "nodeid": "pytest-tests/farm/test_link_flap.py::test_link_flap[rust-plain]", "variant": "rust", "status": "ERROR"},
                {"id": "farm.dmesg", "nodeid": "pytest-tests/farm/test_x.py::test_y[a;b]", "variant": null, "status": "ERROR"}
            ]),
        );
        assert_eq!(
            failed_selection(d.path()).unwrap(),
            "(test_speed_duplex and rust) or test_link_flap or test_y"
        );
        write_results(
            d.path(),
            serde_json::json!([{"id": "farm.probe", "nodeid": "t.py::test_a", "variant": "rust", "status": "PASS"}]),
        );
        assert!(failed_selection(d.path()).is_none());
    }

    #[test]
    fn a_new_farm_run_starts_without_the_last_runs_results() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("farm");
        write_results(
            &out,
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
        );
        write_results(
            &retry_dir(&out),
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "FAIL"}]),
        );
        clear(&out).unwrap();
        assert!(!out.exists() && !retry_dir(&out).exists());
        clear(&out).unwrap();
    }

    #[test]
    fn only_a_clear_throughput_drop_is_suspected() {
        let m = |name: &str, samples: &[f64]| crate::results::Measurement {
            name: name.into(),
            variant: Some("rust".into()),
            value: samples.iter().sum::<f64>() / samples.len() as f64,
            unit: "Mbit/s".into(),
            samples: samples.to_vec(),
            lower_is_better: false,
        };
        let base = crate::contract::FarmImport {
            tests: vec![],
            measurements: vec![
                m("farm.throughput.tcp_tx", &[93.0, 93.5, 92.8, 93.2, 93.1]),
                m("farm.throughput.tcp_rx", &[93.0, 93.5, 92.8, 93.2, 93.1]),
            ],
        };
        let rev = crate::contract::FarmImport {
            tests: vec![],
            measurements: vec![
                m("farm.throughput.tcp_tx", &[60.0, 61.0, 59.5, 60.5, 60.2]),
                m("farm.throughput.tcp_rx", &[90.0, 95.0, 91.0, 94.0, 92.0]),
            ],
        };
        assert_eq!(
            suspected_regressions(&base, &rev),
            [(
                "farm.throughput.tcp_tx".to_string(),
                Some("rust".to_string())
            )]
        );
    }
}
