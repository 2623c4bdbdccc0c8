//! Comparing a revision's checks with the base and with the previous
//! revision: retries, flakes, the hang rule, evidence lines.
//!
//! Retries and flakes: a farm check that fails or errors is retried once and
//! the retry is stored as `attempt: 1`. Within a run the retry decides,
//! except FAIL then PASS, which is a **flake** (PASS in that run, reported
//! with the failing attempt's excerpt), and FAIL then ERROR, which stays
//! FAIL. ERROR is never a flake. Across runs the **latest** run that
//! reported a check decides it: an earlier flake never turns a later FAIL
//! into a pass.
//!
//! Measurements against the base are judged in [`super::measure`].
//!
//! One file over 500 lines: every rule of a check's status (retry, flake,
//! hang, SKIP, the evidence line) in one place, read and changed together.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::results::{Run, Status, Timestamp};

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
    /// The status in the latest run that reported the check, after its
    /// retry: a flake never hides a failure of a later run.
    pub status: Status,
    /// Why the check is flaky, if it is: a run whose retry passed after a
    /// FAIL at the first attempt.
    pub flaky: Option<String>,
    /// When the latest such flake was recorded (that run's end): an ack
    /// given before it does not release it.
    pub flaky_at: Option<Timestamp>,
    /// The first attempt's excerpt of the latest flake (what failed).
    pub flaky_excerpt: String,
    pub log_excerpt: String,
    /// Where the deciding run's log is, when it said.
    pub log_path: Option<String>,
    /// How many runs saw it.
    pub runs: usize,
    /// The deciding run's first attempt and its retry both ERRORed with the
    /// guest no longer answering (not QEMU, the emulator or the host dying):
    /// see [`attribute_hangs`].
    #[serde(skip)]
    pub hung: bool,
}

pub type Checks = BTreeMap<CheckKey, CheckState>;

/// A guest that stopped answering (the agent's timeout), as the harness
/// words it, rather than a part of the farm that died: QEMU, the emulator,
/// the exporter guest, the host. Only the former can be the kernel's doing.
pub fn guest_hang(excerpt: &str) -> bool {
    const HANG: [&str; 2] = ["GuestTimeout", "did not answer"];
    const INFRA: [&str; 6] = [
        "GuestDied",
        "EmulatorDied",
        "ExporterFailed",
        "SetupError",
        "MemoryError",
        "out of memory",
    ];
    HANG.iter().any(|p| excerpt.contains(p)) && !INFRA.iter().any(|p| excerpt.contains(p))
}

/// One check in one run, its retry folded in.
#[derive(Debug, Clone)]
struct RunCheck {
    status: Status,
    excerpt: String,
    log_path: Option<String>,
    /// FAIL at the first attempt, PASS on the retry: (reason, first excerpt).
    flake: Option<(String, String)>,
    hung: bool,
}

/// The rule for one run's two attempts: the retry decides, except that
/// FAIL then PASS is a flake (PASS, reported), FAIL then ERROR stays FAIL
/// (the retry proved nothing), and ERROR then PASS is a PASS that is no
/// flake (the first attempt never judged the code).
fn fold_attempts(run: &str, first: (Status, &str), retry: Option<(Status, &str)>) -> RunCheck {
    let (s0, x0) = first;
    let one = |status, excerpt: &str| RunCheck {
        status,
        excerpt: excerpt.to_string(),
        log_path: None,
        flake: None,
        hung: false,
    };
    let Some((s1, x1)) = retry else {
        return one(s0, x0);
    };
    match (s0, s1) {
        (Status::Fail, Status::Pass) => RunCheck {
            flake: Some((
                format!("FAIL then PASS on retry in run {run}"),
                x0.to_string(),
            )),
            ..one(Status::Pass, x0)
        },
        (Status::Fail, Status::Error | Status::Miss) => one(Status::Fail, x0),
        (Status::Error, Status::Error) => RunCheck {
            hung: guest_hang(x0) && guest_hang(x1),
            ..one(Status::Error, x1)
        },
        (_, s1) => one(s1, x1),
    }
}

/// The checks of one run, retries folded in.
fn run_checks(run: &Run) -> BTreeMap<CheckKey, RunCheck> {
    let mut out = BTreeMap::new();
    for b in &run.builds {
        let key = CheckKey {
            path: b.path(),
            variant: None,
        };
        // A build that raises warnings against its base fails its check,
        // as netdev's build checks do; the warning is the evidence.
        let mut c = match b.new_warnings.first() {
            Some(w) if b.status == Status::Pass => RunCheck {
                status: Status::Fail,
                excerpt: format!(
                    "new warning ({} against the base): {w}",
                    b.new_warnings.len()
                ),
                log_path: None,
                flake: None,
                hung: false,
            },
            _ => fold_attempts(&run.id, (b.status, &b.log_excerpt), None),
        };
        c.log_path = b.log_path.clone();
        out.insert(key, c);
    }
    type Attempt<'a> = (Status, &'a str, Option<&'a String>);
    let mut attempts: BTreeMap<CheckKey, [Option<Attempt>; 2]> = BTreeMap::new();
    for t in &run.tests {
        let key = CheckKey {
            path: t.path.clone(),
            variant: t.variant.clone(),
        };
        let slot = attempts.entry(key).or_default();
        slot[usize::from(t.attempt >= 1)] = Some((t.status, &t.log_excerpt, t.log_path.as_ref()));
    }
    for (key, [first, retry]) in attempts {
        let (first, retry) = match (first, retry) {
            (Some(f), r) => (f, r),
            (None, Some(r)) => (r, None),
            (None, None) => continue,
        };
        let mut c = fold_attempts(&run.id, (first.0, first.1), retry.map(|r| (r.0, r.1)));
        c.log_path = retry.and_then(|r| r.2).or(first.2).cloned();
        out.insert(key, c);
    }
    out
}

/// The most telling line of a log excerpt: the first compiler or linker
/// error (`error:`, `error[E0004]:`, `ld:`, "undefined reference"), the first kernel splat (a Rust panic with
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
    let compiler = [
        "error:",
        "error[E",
        "undefined reference",
        "ld: ",
        "ld.lld: ",
    ];
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
    // A line that announces what follows ("panicked at ...:", "patch 3
    // does not apply:", the linker's "in function `probe':") is told with
    // the line after it.
    let with_next = |i: usize| match lines.get(i + 1) {
        Some(next) if lines[i].ends_with(':') => format!("{} {next}", lines[i]),
        _ => lines[i].to_string(),
    };
    if let Some(i) = lines.iter().position(|l| is(l, &compiler) && not_make(l)) {
        return with_next(i);
    }
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

/// Fold the runs of one revision (oldest first) into one state per check:
/// the latest run that reported a check decides it; a flake in any run is
/// reported with the run, the time and the failing attempt's excerpt.
pub fn aggregate(runs: &[&Run]) -> Checks {
    let mut out: Checks = BTreeMap::new();
    for run in runs {
        let at = run.finished.unwrap_or(run.started);
        for (key, c) in run_checks(run) {
            let prev = out.remove(&key);
            let (flaky, flaky_at, flaky_excerpt) = match (c.flake, prev.as_ref()) {
                (Some((why, x)), _) => (Some(why), Some(at), x),
                (None, Some(p)) => (p.flaky.clone(), p.flaky_at, p.flaky_excerpt.clone()),
                (None, None) => (None, None, String::new()),
            };
            out.insert(
                key,
                CheckState {
                    status: c.status,
                    flaky,
                    flaky_at,
                    flaky_excerpt,
                    log_excerpt: c.excerpt,
                    log_path: c.log_path,
                    runs: prev.map_or(0, |p| p.runs) + 1,
                    hung: c.hung,
                },
            );
        }
    }
    out
}

/// The hang rule: a check whose guest stopped answering at both attempts
/// of the deciding run, where the comparable base PASSed the same check, is
/// the revision's FAIL. An ERROR the base shares, or one where part of the
/// farm died (QEMU, the emulator, the exporter, the host), stays ERROR.
pub fn attribute_hangs(this: &mut Checks, base: &Checks) {
    for (key, st) in this.iter_mut() {
        let base_passed = base.get(key).is_some_and(|b| b.status == Status::Pass);
        if st.status == Status::Error && st.hung && base_passed {
            // The harness's evidence names where the blocked tasks wait
            // ("blocked in kworker/0:2 in ...read_status").
            let blocked = st
                .log_excerpt
                .lines()
                .find_map(|l| l.trim().strip_prefix("blocked in "))
                .map(|b| format!("; blocked: {b}"))
                .unwrap_or_default();
            st.status = Status::Fail;
            st.log_excerpt = format!(
                "FAIL: guest stopped answering (revision only; the base passed){blocked}\n{}",
                st.log_excerpt
            );
        }
    }
}

/// The words a farm check's SKIP starts with when the check does not apply
/// to the kernel under test (the harness's `NOT_APPLICABLE`).
pub const NOT_APPLICABLE: &str = "not applicable";

/// A SKIP that stands for "does not apply": a gate the series cannot
/// affect and a patch already in the tree (both decided by phyfarm from the
/// series), a differential of two such checks, and a farm check whose
/// reason says so. Any other SKIP is a check that did not run.
pub fn not_applicable(key: &CheckKey, excerpt: &str) -> bool {
    !key.path.starts_with("farm.")
        || key.path.starts_with("farm.differential.")
        || excerpt.trim_start().starts_with(NOT_APPLICABLE)
}

/// A finding's evidence: the most telling line of the excerpt, else where
/// the log is, else that the check said nothing.
pub fn evidence(st: &CheckState) -> String {
    let line = telling_line(&st.log_excerpt);
    match (&st.log_path, line.is_empty()) {
        (_, false) => line,
        (Some(p), true) => format!("no message; log: {p}"),
        (None, true) => "no message and no log recorded".into(),
    }
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
        let excerpt = || evidence(st);
        let kind = match (st.status, reference) {
            (Status::Fail, Some(Status::Fail)) => Some(FindingKind::StillFailing),
            (Status::Fail, _) => Some(FindingKind::NewFailure),
            // Incomplete here is incomplete, whatever the reference did: the
            // verdict waits for the evidence.
            (s, _) if s.incomplete() => Some(FindingKind::Incomplete),
            // A SKIP that does not say the check does not apply is a check
            // that did not run: no evidence either.
            (Status::Skip, _) if !not_applicable(key, &st.log_excerpt) => {
                Some(FindingKind::Incomplete)
            }
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

pub use super::measure::{
    band, measurements, p_text, regressions, Band, MeasurementDelta, Movement, JUDGED, MIN_SAMPLES,
    REGRESSION_MIN_EFFECT, TARGET_LOSS,
};
