//! The farm inside `phyfarm run`: run it on a set of kernels, retry the
//! checks that failed once (recorded as their retry, so a check that passes
//! the second time is flaky rather than a failure of the series), and turn
//! its results.json into the store's tests and measurements.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::config::Paths;
use crate::farm::TestOptions;
use crate::progress::{info, warn};
use crate::results::{Measurement, Status, TestResult};
use crate::Outcome;

/// Farm tests and measurements of one set of kernels.
pub type FarmResults = (Vec<TestResult>, Vec<Measurement>);

/// Run the farm on the kernels under `artifacts` (`<variant>/bzImage`) into
/// `out`; a failed check runs once more into [`retry_dir`].
pub fn farm(paths: &Paths, base: &TestOptions, artifacts: &Path, out: &Path) -> Outcome {
    let first = farm_once(paths, base, artifacts, out, None);
    let Some(failed) = failed_selection(out).filter(|_| first == Outcome::Fail) else {
        return first;
    };
    info(&format!("retrying the failed farm checks once: {failed}"));
    farm_once(paths, base, artifacts, &retry_dir(out), Some(failed))
}

/// Where the retry of a farm run writes its results.
pub fn retry_dir(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push("-retry");
    out.with_file_name(name)
}

fn farm_once(
    paths: &Paths,
    base: &TestOptions,
    artifacts: &Path,
    out: &Path,
    keyword: Option<String>,
) -> Outcome {
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
        Ok(x) => x,
        Err(e) => {
            warn(&format!(
                "the farm could not run on {}: {e:#}",
                artifacts.display()
            ));
            Outcome::Error
        }
    }
}

fn is_word(w: &str) -> bool {
    !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A pytest `-k` expression selecting the tests that failed in `out`, e.g.
/// `(test_speed_duplex and rust)`; None when none failed.
pub fn failed_selection(out: &Path) -> Option<String> {
    let v: serde_json::Value = crate::metadata::read_json(&out.join("results.json")).ok()??;
    let mut parts: Vec<String> = Vec::new();
    for t in v["tests"].as_array()? {
        if !matches!(t["status"].as_str(), Some("FAIL") | Some("ERROR")) {
            continue;
        }
        let Some(node) = t["nodeid"].as_str().filter(|n| !n.is_empty()) else {
            continue;
        };
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

/// The farm's results.json in `dir` (and its retry, if there is one) as the
/// store's tests and measurements.
pub fn farm_results(dir: &Path) -> Result<FarmResults> {
    let (mut tests, ms) = farm_results_one(dir)?;
    let retry = retry_dir(dir);
    if retry.join("results.json").is_file() {
        let (again, _) = farm_results_one(&retry)?;
        for mut t in again {
            // Only checks of the first run get a retry; the retry's own
            // differential results compare a subset and are left out.
            let known = tests
                .iter()
                .any(|x| x.path == t.path && x.variant == t.variant);
            if t.path.starts_with("farm.differential.") || !known {
                continue;
            }
            t.attempt = 1;
            tests.push(t);
        }
    }
    Ok((tests, ms))
}

fn farm_results_one(dir: &Path) -> Result<FarmResults> {
    let r: crate::farm::Results = crate::metadata::read_json(&dir.join("results.json"))?
        .ok_or_else(|| anyhow::anyhow!("{} is missing", dir.join("results.json").display()))?;
    let mut tests: Vec<TestResult> = Vec::new();
    let mut ms = Vec::new();
    for t in &r.tests {
        // A check with subtests may repeat its path; the first one counts.
        let seen = tests
            .iter()
            .any(|x| x.path == t.id && x.variant == t.variant);
        if seen || !crate::results::valid_path(&t.id) {
            continue;
        }
        tests.push(TestResult {
            path: t.id.clone(),
            variant: t.variant.clone(),
            status: Status::parse(&t.status).unwrap_or(Status::Error),
            duration_s: Some(t.duration),
            log_path: None,
            log_excerpt: t.message.clone(),
            attempt: 0,
        });
        for m in &t.measurements {
            let name = format!("{}.{}", t.id, m.name);
            if !crate::results::valid_path(&name) || !m.value.is_finite() {
                continue;
            }
            ms.push(Measurement {
                name,
                variant: t.variant.clone(),
                value: m.value,
                unit: m.unit.clone(),
                samples: vec![m.value],
                lower_is_better: m.unit == "s" || m.unit == "%",
            });
        }
    }
    Ok((tests, ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, tests: serde_json::Value) {
        std::fs::create_dir_all(dir).unwrap();
        let doc = serde_json::json!({"tests": tests, "environment": {}});
        std::fs::write(dir.join("results.json"), doc.to_string()).unwrap();
    }

    #[test]
    fn failed_checks_become_a_keyword_selection() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            serde_json::json!([
                {"id": "farm.speed_duplex.speed_duplex", "nodeid": "pytest-tests/farm/test_speed_duplex.py::test_speed_duplex[rust]", "variant": "rust", "status": "FAIL"},
                {"id": "farm.probe.probe", "nodeid": "pytest-tests/farm/test_probe.py::test_probe[c]", "variant": "c", "status": "PASS"},
                {"id": "farm.x.y", "nodeid": "pytest-tests/farm/test_x.py::test_y[a;b]", "variant": null, "status": "ERROR"},
                {"id": "farm.differential.speed_duplex", "nodeid": "", "variant": null, "status": "FAIL"}
            ]),
        );
        assert_eq!(
            failed_selection(d.path()).unwrap(),
            "(test_speed_duplex and rust) or test_y"
        );
        write(
            d.path(),
            serde_json::json!([{"id": "farm.a", "nodeid": "t.py::test_a", "status": "PASS"}]),
        );
        assert!(failed_selection(d.path()).is_none());
    }

    #[test]
    fn a_retry_is_recorded_as_attempt_one() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("farm");
        write(
            &out,
            serde_json::json!([
                {"id": "farm.speed_duplex.speed_duplex", "variant": "rust", "status": "FAIL", "duration": 20.0,
                 "measurements": [{"name": "settle_autoneg", "value": 0.1, "unit": "s"}]},
                {"id": "farm.probe.probe", "variant": "rust", "status": "PASS", "duration": 9.0}
            ]),
        );
        write(
            &retry_dir(&out),
            serde_json::json!([
                {"id": "farm.speed_duplex.speed_duplex", "variant": "rust", "status": "PASS", "duration": 21.0},
                {"id": "farm.differential.speed_duplex.speed_duplex", "variant": null, "status": "PASS"}
            ]),
        );
        let (tests, ms) = farm_results(&out).unwrap();
        let sd: Vec<(u32, Status)> = tests
            .iter()
            .filter(|t| t.path == "farm.speed_duplex.speed_duplex")
            .map(|t| (t.attempt, t.status))
            .collect();
        assert_eq!(sd, [(0, Status::Fail), (1, Status::Pass)]);
        assert!(!tests
            .iter()
            .any(|t| t.path.starts_with("farm.differential")));
        assert_eq!(ms.len(), 1);
        assert!(ms[0].lower_is_better);
        assert_eq!(retry_dir(&out), d.path().join("farm-retry"));
    }
}
