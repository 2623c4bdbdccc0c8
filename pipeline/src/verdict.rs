//! netdev-style verdicts: each revision compared with the unpatched base in
//! the same environment and with the previous revision of the same change,
//! flakes accounted for, and a state per revision with a 72-hour clock.
//!
//! Only new failures against the base count against a series; a harness
//! problem (ERROR, MISS) never becomes a FAIL: it keeps the revision in
//! `testing` until a rerun completes. See [`compare`] for the retry, flake
//! and noise-band rules and [`clock`] for the state machine.

#[cfg(test)]
mod algebra_tests;
pub mod clock;
pub mod compare;
pub mod differential;
pub mod measure;
#[cfg(test)]
mod properties;
pub mod stats;
#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::results::review::FirstBad;
pub use crate::results::review::{Review, ReviewKind, State, Transition};
use crate::results::{RevisionRef, Run, Status, Timestamp};
use crate::store::{self, RevisionRecord, RunRecord, RunState, Store, StoreError};
pub use compare::{
    Band, CheckKey, CheckState, Checks, Finding, FindingKind, MeasurementDelta, Movement,
};

#[derive(Debug, thiserror::Error)]
pub enum VerdictError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "--now {now} is earlier than the last recorded transition of {revision} ({last}); refusing"
    )]
    NowBeforeLast {
        revision: RevisionRef,
        now: Timestamp,
        last: Timestamp,
    },
}

/// The exit code of a verb that reports one revision's verdict (`run`,
/// `record`, `verdict REV`), from its state alone: 0 awaiting review, ready
/// to merge or superseded; 1 changes requested; 2 testing or not yet
/// recorded (the evidence is incomplete).
pub fn outcome(state: Option<State>) -> crate::Outcome {
    match state {
        Some(State::AwaitingReview | State::ReadyToMerge | State::Superseded) => {
            crate::Outcome::Pass
        }
        Some(State::ChangesRequested) => crate::Outcome::Fail,
        Some(State::Testing | State::New) | None => crate::Outcome::Error,
    }
}

/// Everything known about a revision's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub revision: RevisionRef,
    pub change_id: Option<String>,
    pub state: Option<State>,
    pub since: Option<Timestamp>,
    pub reason: String,
    /// For awaiting-review: when it becomes ready to merge.
    pub ready_at: Option<Timestamp>,
    /// Complete runs the verdict is based on, oldest first.
    pub runs: Vec<String>,
    /// Runs begun and never finished, recorded as interrupted.
    pub interrupted: Vec<String>,
    pub base_run: Option<String>,
    #[serde(serialize_with = "checks_as_list")]
    pub checks: Checks,
    pub vs_base: Vec<Finding>,
    pub previous: Option<RevisionRef>,
    pub vs_previous: Vec<Finding>,
    pub measurements: Vec<MeasurementDelta>,
    pub reviews: Vec<Review>,
    pub transitions: Vec<Transition>,
    pub evaluated_at: Timestamp,
    /// For every farm check that did not pass, or is flaky: the command
    /// that reruns it from the run's recorded artifacts.
    pub reproducers: Vec<Reproducer>,
    /// The first bad patch of each check that fails now, as a bisection
    /// recorded it.
    pub first_bad: Vec<FirstBadPatch>,
}

/// A recorded first bad patch, with the patch's subject.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FirstBadPatch {
    #[serde(flatten)]
    pub check: CheckKey,
    pub patch: u32,
    pub of: u32,
    pub subject: String,
    pub how: String,
    pub at: Timestamp,
}

impl FirstBadPatch {
    /// `2/5 net: phy: …`
    pub fn name(&self) -> String {
        format!("{}/{} {}", self.patch, self.of, self.subject)
    }
}

/// The recorded first bad patches whose check fails now (the latest of
/// each check), with their subjects.
fn first_bad_now(rec: &RevisionRecord, found: &[FirstBad], checks: &Checks) -> Vec<FirstBadPatch> {
    let mut out: Vec<FirstBadPatch> = vec![];
    for f in found.iter().rev() {
        let check = CheckKey {
            path: f.check.clone(),
            variant: f.variant.clone(),
        };
        let failing = checks.get(&check).is_some_and(|c| c.status == Status::Fail);
        if !failing || out.iter().any(|o| o.check == check) {
            continue;
        }
        let subject = rec
            .info
            .patches
            .iter()
            .find(|p| p.position == f.patch)
            .map(|p| p.subject.clone())
            .unwrap_or_default();
        out.push(FirstBadPatch {
            check,
            patch: f.patch,
            of: rec.info.patches.len() as u32,
            subject,
            how: f.how.clone(),
            at: f.at,
        });
    }
    out.reverse();
    out
}

/// `phyfarm repro` for one check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reproducer {
    #[serde(flatten)]
    pub check: CheckKey,
    pub command: String,
}

/// The reproducers of `checks`: farm checks that failed, erred, went
/// missing or are flaky (a SKIP does not apply; a differential is rerun
/// through its two sides).
pub fn reproducers(rev: &RevisionRef, checks: &Checks) -> Vec<Reproducer> {
    checks
        .iter()
        .filter(|(_, c)| c.status.not_passed() || c.flaky.is_some())
        .filter_map(|(k, _)| {
            let command =
                crate::results::repro_command(&rev.to_string(), &k.path, k.variant.as_deref())?;
            Some(Reproducer {
                check: k.clone(),
                command,
            })
        })
        .collect()
}

impl Report {
    /// The reproducer of one check, if it has one.
    pub fn reproducer(&self, k: &CheckKey) -> Option<&str> {
        self.reproducers
            .iter()
            .find(|r| &r.check == k)
            .map(|r| r.command.as_str())
    }
}

/// JSON has no struct keys: checks are a list of `{check, ...state}`.
fn checks_as_list<S: serde::Serializer>(c: &Checks, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Row<'a> {
        #[serde(flatten)]
        check: &'a CheckKey,
        #[serde(flatten)]
        state: &'a CheckState,
    }
    s.collect_seq(c.iter().map(|(check, state)| Row { check, state }))
}

impl Report {
    pub fn flaky(&self) -> impl Iterator<Item = (&CheckKey, &CheckState)> {
        self.checks.iter().filter(|(_, c)| c.flaky.is_some())
    }

    pub fn count(&self, kind: FindingKind) -> usize {
        self.vs_base.iter().filter(|f| f.kind == kind).count()
    }
}

/// Base runs comparable with `runs`: same base, same environment key.
fn comparable_base(store: &dyn Store, runs: &[RunRecord]) -> Result<Vec<RunRecord>, StoreError> {
    let Some(last) = runs
        .iter()
        .rev()
        .find(|r| r.state == RunState::Complete)
        .or(runs.last())
    else {
        return Ok(vec![]);
    };
    let key = last.run.environment.key();
    Ok(store
        .base_runs(&last.run.base)?
        .into_iter()
        .filter(|r| r.state == RunState::Complete && r.run.environment.key() == key)
        .collect())
}

fn complete_by(runs: &[RunRecord], t: Timestamp) -> Vec<&Run> {
    runs.iter()
        .filter(|r| r.state == RunState::Complete && r.run.finished.unwrap_or(r.run.started) <= t)
        .map(|r| &r.run)
        .collect()
}

/// Bring the stored state of `r` up to `now` (appending transitions) and
/// report it.
pub fn advance(
    store: &mut dyn Store,
    r: &RevisionRef,
    now: Timestamp,
) -> Result<Report, VerdictError> {
    let (rep, existing, new) = compute(store, r, now)?;
    if !new.is_empty() {
        store.append_transitions(&rep.revision, existing, &new)?;
    }
    Ok(rep)
}

/// The report at `now` without storing anything (for exports).
pub fn evaluate(
    store: &dyn Store,
    r: &RevisionRef,
    now: Timestamp,
) -> Result<Report, VerdictError> {
    Ok(compute(store, r, now)?.0)
}

/// The report, how many transitions were stored, and the new ones.
fn compute(
    store: &dyn Store,
    r: &RevisionRef,
    now: Timestamp,
) -> Result<(Report, usize, Vec<Transition>), VerdictError> {
    let all = store.revisions()?;
    let rec = store.revision(r)?;
    let r = rec.reference();
    let runs = store.runs(&r)?;
    let base_runs = comparable_base(store, &runs)?;
    let reviews = store.reviews(&r)?;
    let superseded = store::newer_revisions(&all, &rec)
        .into_iter()
        .map(|n| (n.created.max(rec.created), n.reference()))
        .min();
    let facts = clock::Facts {
        revision: &r,
        created: rec.created,
        superseded,
        runs: &runs,
        base_runs: &base_runs,
        reviews: &reviews,
    };
    let existing = store.transitions(&r)?;
    let new = clock::replay(&facts, &existing, now)?;
    let count = existing.len();
    let mut transitions = existing;
    transitions.extend(new.iter().cloned());
    let rep = report(store, &all, &rec, &facts, transitions, now)?;
    Ok((rep, count, new))
}

fn report(
    store: &dyn Store,
    all: &[RevisionRecord],
    rec: &RevisionRecord,
    facts: &clock::Facts<'_>,
    transitions: Vec<Transition>,
    now: Timestamp,
) -> Result<Report, StoreError> {
    let (checks, vs_base) = facts.outcome(now);
    let this = complete_by(facts.runs, now);
    let base = complete_by(facts.base_runs, now);
    let previous = store::previous_revision(all, rec);
    let vs_previous = match &previous {
        Some(p) => {
            let prev_runs = store.runs(&p.reference())?;
            let prev_checks = compare::aggregate(&complete_by(&prev_runs, now));
            compare::compare(&checks, &prev_checks, false)
        }
        None => vec![],
    };
    let last = transitions.last();
    let state = last.map(|t| t.state);
    // The reason moves on without a state change (a rerun with more
    // checks, a run that finishes with ERROR while testing): say the
    // current one, not the one the state was entered with.
    let fresh = last
        .map(|t| facts.desired(now, Some((t.state, t.at))))
        .filter(|d| Some(d.0) == state && !d.1.is_empty())
        .map(|d| d.1);
    let reproducers = reproducers(&rec.reference(), &checks);
    let first_bad = first_bad_now(rec, &store.first_bad(&rec.reference())?, &checks);
    Ok(Report {
        revision: rec.reference(),
        change_id: rec.info.change_id.clone(),
        state,
        since: last.map(|t| t.at),
        reason: fresh
            .or_else(|| last.map(|t| t.reason.clone()))
            .unwrap_or_default(),
        ready_at: last
            .filter(|t| t.state == State::AwaitingReview)
            .map(|t| t.at.plus_hours(clock::REVIEW_HOURS)),
        runs: this.iter().map(|r| r.id.clone()).collect(),
        interrupted: facts
            .runs
            .iter()
            .filter(|r| r.state == RunState::Interrupted)
            .map(|r| r.run.id.clone())
            .collect(),
        base_run: base.last().map(|r| r.id.clone()),
        checks,
        vs_base,
        previous: previous.map(|p| p.reference()),
        vs_previous,
        measurements: compare::measurements(&this, &base),
        reviews: facts.reviews.to_vec(),
        transitions,
        evaluated_at: now,
        reproducers,
        first_bad,
    })
}

/// Bring every stored revision up to `now`, by series and version.
pub fn advance_all(store: &mut dyn Store, now: Timestamp) -> Result<Vec<Report>, VerdictError> {
    let refs: Vec<RevisionRef> = store.revisions()?.iter().map(|r| r.reference()).collect();
    refs.iter().map(|r| advance(store, r, now)).collect()
}

/// Record an ack or nack; refused if `review.at` is before the revision's
/// last transition.
pub fn review(store: &mut dyn Store, r: &RevisionRef, review: &Review) -> Result<(), VerdictError> {
    Ok(store.add_review(r, review)?)
}

/// The report in plain lines for people. Reasons, log lines and reviews
/// carry untrusted text: control characters (terminal escapes) are shown as
/// `?`, line by line.
pub fn render_text(rep: &Report) -> String {
    render_lines(rep)
        .lines()
        .map(|l| crate::progress::printable(l) + "\n")
        .collect()
}

fn render_lines(rep: &Report) -> String {
    let mut s = String::new();
    let state = rep.state.map_or("(not yet recorded)", State::name);
    s.push_str(&format!("{}: {state}", rep.revision));
    if let Some(since) = rep.since {
        s.push_str(&format!(" since {since}"));
    }
    s.push('\n');
    if !rep.reason.is_empty() {
        s.push_str(&format!("  why: {}\n", rep.reason));
    }
    if let Some(at) = rep.ready_at {
        s.push_str(&format!("  ready to merge at {at} unless objected\n"));
    }
    if let Some(b) = &rep.base_run {
        s.push_str(&format!("  base run: {b}\n"));
    }
    for f in &rep.vs_base {
        s.push_str(&format!("  {}: {} {}", f.kind.label(), f.check, f.status));
        if !f.detail.is_empty() {
            s.push_str(&format!(" ({})", f.detail));
        }
        s.push('\n');
        if f.status != Status::Pass {
            if let Some(c) = rep.reproducer(&f.check) {
                s.push_str(&format!("    reproduce: {c}\n"));
            }
        }
    }
    for f in &rep.first_bad {
        s.push_str(&format!("  first bad patch: {} ({}", f.name(), f.check));
        if !f.how.is_empty() {
            s.push_str(&format!("; {}", f.how));
        }
        s.push_str(")\n");
    }
    for (k, c) in rep.flaky() {
        s.push_str(&format!(
            "  flaky: {k}: {}",
            c.flaky.as_deref().unwrap_or("")
        ));
        let x = compare::telling_line(&c.flaky_excerpt);
        if !x.is_empty() {
            s.push_str(&format!(" (the failing attempt: {x})"));
        }
        s.push('\n');
        if let Some(c) = rep.reproducer(k) {
            s.push_str(&format!("    reproduce: {c}\n"));
        }
    }
    if let Some(p) = &rep.previous {
        for f in &rep.vs_previous {
            s.push_str(&format!(
                "  vs {p}: {}: {} {}\n",
                f.kind.label(),
                f.check,
                f.status
            ));
        }
    }
    // Throughput, and whatever was called moved; the rest is in
    // `phyfarm verdict --json` and on the revision page.
    let shown = |m: &&compare::MeasurementDelta| {
        m.unit.ends_with("bit/s")
            || matches!(
                m.movement,
                compare::Movement::Regression | compare::Movement::Improvement
            )
    };
    for m in rep.measurements.iter().filter(shown) {
        let band = m.base.map_or("no band".to_string(), |b| {
            format!(
                "base {}..{} from {} samples",
                number(b.low),
                number(b.high),
                b.samples
            )
        });
        s.push_str(&format!(
            "  {}{}: {} {} ({band}): {}\n",
            m.name,
            m.variant
                .as_deref()
                .map(|v| format!(" ({v})"))
                .unwrap_or_default(),
            number(m.value),
            m.unit,
            m.call_text()
        ));
    }
    let hidden = rep.measurements.len() - rep.measurements.iter().filter(shown).count();
    if hidden > 0 {
        s.push_str(&format!(
            "  ({hidden} other measurements within their noise or without a base band: `phyfarm verdict --json`)\n"
        ));
    }
    for r in &rep.interrupted {
        s.push_str(&format!("  interrupted run: {r} (MISS)\n"));
    }
    for r in &rep.reviews {
        s.push_str(&format!(
            "  {} by {} at {}: {}\n",
            r.kind.name(),
            r.by,
            r.at,
            r.reason
        ));
    }
    s
}

/// A measurement as a reader wants it: three significant digits or so.
fn number(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}
