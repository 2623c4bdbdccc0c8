//! Patchwork checks, one set per patch, ready for
//! `POST /api/patches/{id}/checks/` (find the patch by its Message-ID).
//!
//! Contexts: `phyfarm-apply` and `phyfarm-build-<variant>` are per patch;
//! `phyfarm-gates`, `phyfarm-farm` and `phyfarm-perf` are series results
//! copied onto every patch, as netdev's CI does (patchwork has no series
//! checks). States: a new failure against the base is `fail`; ERROR, MISS or
//! no result yet is `pending`; new warnings, flaky checks, failures the base
//! has too, skips and measurements called regressions are `warning`;
//! otherwise `success`.

use serde::Serialize;
use serde_json::{json, Value};

use super::Bundle;
use crate::results::Status;
use crate::verdict::{CheckKey, CheckState, FindingKind, Movement};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckState4 {
    Success,
    Warning,
    Pending,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub context: String,
    pub state: CheckState4,
    pub description: String,
    pub target_url: String,
}

/// The checks of a family (`keys` selects them) summarised as one check.
fn family(b: &Bundle, context: String, select: &dyn Fn(&CheckKey) -> bool) -> Check {
    let checks: Vec<(&CheckKey, &CheckState)> =
        b.report.checks.iter().filter(|(k, _)| select(k)).collect();
    let findings: Vec<_> = b
        .report
        .vs_base
        .iter()
        .filter(|f| select(&f.check))
        .collect();
    let count = |k: FindingKind| findings.iter().filter(|f| f.kind == k).count();
    let (new, incomplete, warn, still) = (
        count(FindingKind::NewFailure),
        count(FindingKind::Incomplete),
        count(FindingKind::NewWarning),
        count(FindingKind::StillFailing),
    );
    let flaky = checks.iter().filter(|(_, c)| c.flaky.is_some()).count();
    let pass = checks
        .iter()
        .filter(|(_, c)| c.status == Status::Pass)
        .count();
    let skip = checks
        .iter()
        .filter(|(_, c)| c.status == Status::Skip)
        .count();
    let state = if checks.is_empty() || incomplete > 0 {
        CheckState4::Pending
    } else if new > 0 {
        CheckState4::Fail
    } else if warn + still + flaky + skip > 0 {
        CheckState4::Warning
    } else {
        CheckState4::Success
    };
    let mut description = if checks.is_empty() {
        "no result yet".to_string()
    } else {
        format!("{pass}/{} pass", checks.len())
    };
    for (n, what) in [
        (new, "new failures"),
        (incomplete, "could not complete"),
        (still, "failing on the base too"),
        (warn, "with new warnings"),
        (flaky, "flaky"),
        (skip, "skipped"),
    ] {
        if n > 0 {
            description.push_str(&format!(", {n} {what}"));
        }
    }
    // netdev's build checks say "Errors and warnings before: X this patch: Y".
    if let Some(f) = findings.iter().find(|f| f.kind == FindingKind::NewWarning) {
        description.push_str(&format!("; {}", f.detail));
    }
    if let Some(f) = findings.iter().find(|f| f.kind == FindingKind::NewFailure) {
        description.push_str(&format!("; {} {}", f.check, f.status));
        if !f.detail.is_empty() {
            description.push_str(&format!(": {}", f.detail));
        }
    }
    Check {
        context,
        state,
        description: description.chars().take(250).collect(),
        target_url: b.target_url(),
    }
}

fn perf(b: &Bundle) -> Option<Check> {
    let ms = &b.report.measurements;
    if ms.is_empty() {
        return None;
    }
    let worse: Vec<String> = ms
        .iter()
        .filter(|m| m.movement == Movement::Regression)
        .map(|m| format!("{}: {}", m.name, m.call_text()))
        .collect();
    let (state, description) = if worse.is_empty() {
        (
            CheckState4::Success,
            format!(
                "{} measurements, none significantly worse than the base",
                ms.len()
            ),
        )
    } else {
        (CheckState4::Warning, worse.join("; "))
    };
    Some(Check {
        context: "phyfarm-perf".into(),
        state,
        description: description.chars().take(250).collect(),
        target_url: b.target_url(),
    })
}

/// The checks of patch `position` (1-based).
pub fn patch_checks(b: &Bundle, position: u32) -> Vec<Check> {
    let mut out = vec![family(b, "phyfarm-apply".into(), &|k| {
        k.path == format!("apply.patch{position}")
    })];
    let mut variants: Vec<String> = b
        .report
        .checks
        .keys()
        .filter(|k| k.family() == "build")
        .filter_map(|k| k.path.split('.').nth(1).map(str::to_string))
        .collect();
    variants.dedup();
    for v in variants {
        let path = format!("build.{v}.patch{position}");
        out.push(family(b, format!("phyfarm-build-{v}"), &|k| k.path == path));
    }
    out.push(family(b, "phyfarm-gates".into(), &|k| k.family() == "gate"));
    out.push(family(b, "phyfarm-farm".into(), &|k| k.family() == "farm"));
    out.extend(perf(b));
    out
}

/// The document: every patch with its Message-ID, patch-id and checks.
pub fn export(b: &Bundle) -> Value {
    let patches: Vec<Value> = b
        .revision
        .info
        .patches
        .iter()
        .map(|p| {
            json!({
                "position": p.position,
                "subject": p.subject,
                "message_id": p.message_id,
                "patch_id": p.patch_id,
                "checks": patch_checks(b, p.position),
            })
        })
        .collect();
    json!({
        "revision": b.report.revision.to_string(),
        "state": b.report.state,
        "target_url": b.target_url(),
        "patches": patches,
    })
}
