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
    let first = farm_once(paths, base, artifacts, out, None);
    let Some(failed) = failed_selection(out).filter(|_| first.0 == Outcome::Fail) else {
        return first;
    };
    info(&format!("retrying the failed farm checks once: {failed}"));
    farm_once(paths, base, artifacts, &retry_dir(out), Some(failed))
}

fn farm_once(
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
}
