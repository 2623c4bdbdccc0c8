//! The verdict state machine of one revision, replayed over its facts.
//!
//! ```text
//!  new ──run starts──▶ testing ──new FAIL vs base / no apply / no build / new warning──▶ changes-requested
//!                        │   ▲                                                              ▲
//!                        │   └── ERROR/MISS, a SKIP that is not "not applicable",           │ nack
//!                        │       too few throughput samples, no farm evidence: testing      │
//!                        └──passes──▶ awaiting-review ──72 h, no objection──▶ ready-to-merge
//!  any state ──a newer revision of the same change-id is recorded──▶ superseded
//! ```
//!
//! In that order: a new failure, then a standing nack, then missing
//! evidence; a flaky check holds awaiting-review until an ack given after
//! its latest flake, or [`FLAKE_CLEAR_RUNS`] clean runs, releases it.
//!
//! The facts (runs, reviews, newer revisions) carry their own times, so the
//! states are replayed at those times: a transition is stored at the moment
//! its cause happened (never before the last stored transition, never after
//! `now`), which keeps the history right however rarely `verdict` runs.

use crate::results::{RevisionRef, Timestamp};
use crate::store::{RunRecord, RunState};

use super::compare::{self, Checks, FindingKind};
use super::{Review, ReviewKind, State, Transition, VerdictError};

/// Hours of no objection after which a passing revision is ready to merge.
pub const REVIEW_HOURS: i64 = 72;
/// Consecutive complete runs in which a flaky check passes at the first
/// attempt before its flakiness stops holding the revision back. A check
/// that fails one run in two passes three in a row one time in eight; one
/// that fails one in five does so half the time, so three clean runs (about
/// 10 minutes of farm each) are cheap evidence that a flake was the farm's,
/// and a maintainer's ack settles it sooner.
pub const FLAKE_CLEAR_RUNS: usize = 3;

/// Everything the state of a revision depends on.
pub struct Facts<'a> {
    pub revision: &'a RevisionRef,
    pub created: Timestamp,
    /// The first newer revision of the same change and when it was recorded.
    pub superseded: Option<(Timestamp, RevisionRef)>,
    /// Runs of the revision, oldest first.
    pub runs: &'a [RunRecord],
    /// Comparable base runs, oldest first.
    pub base_runs: &'a [RunRecord],
    pub reviews: &'a [Review],
}

fn finished(r: &RunRecord) -> Timestamp {
    r.run.finished.unwrap_or(r.run.started)
}

impl Facts<'_> {
    fn event_times(&self) -> Vec<Timestamp> {
        let mut v = vec![self.created];
        v.extend(self.superseded.as_ref().map(|s| s.0));
        for r in self.runs.iter().chain(self.base_runs) {
            v.push(r.run.started);
            v.push(finished(r));
        }
        v.extend(self.reviews.iter().map(|r| r.at));
        v
    }

    /// The checks of complete runs finished by `t`, against the base: the
    /// hang rule applied ([`compare::attribute_hangs`]), then every finding.
    pub fn outcome(&self, t: Timestamp) -> (Checks, Vec<compare::Finding>) {
        let done = |rs: &[RunRecord]| -> Vec<crate::results::Run> {
            rs.iter()
                .filter(|r| r.state == RunState::Complete && finished(r) <= t)
                .map(|r| r.run.clone())
                .collect()
        };
        let this = done(self.runs);
        let base = done(self.base_runs);
        let this_refs: Vec<&crate::results::Run> = this.iter().collect();
        let base_last: Vec<&crate::results::Run> = base.last().into_iter().collect();
        let base_checks = compare::aggregate(&base_last);
        let mut checks = compare::aggregate(&this_refs);
        compare::attribute_hangs(&mut checks, &base_checks);
        let mut findings = compare::compare(&checks, &base_checks, true);
        if let Some(last) = this.last() {
            findings.extend(compare::new_warnings(last, base.last()));
        }
        let base_refs: Vec<&crate::results::Run> = base.iter().collect();
        findings.extend(compare::regressions(&compare::measurements(
            &this_refs, &base_refs,
        )));
        (checks, findings)
    }

    /// Objections standing at `t`: each reviewer's latest word, if a nack.
    fn nacks_at(&self, t: Timestamp) -> Vec<&Review> {
        let mut latest: Vec<&Review> = Vec::new();
        for r in self.reviews.iter().filter(|r| r.at <= t) {
            latest.retain(|l| l.by != r.by);
            latest.push(r);
        }
        latest.retain(|r| r.kind == ReviewKind::Nack);
        latest
    }

    /// Flaky checks that hold the revision back at `t`: flaky here, passing
    /// now, not flaky on the base, and neither released by an ack given
    /// after the latest flake was recorded nor passed at the first attempt
    /// in the last [`FLAKE_CLEAR_RUNS`] complete runs.
    fn blocking_flakes(&self, t: Timestamp, checks: &Checks) -> Vec<String> {
        let acked_after = |at: Timestamp| {
            self.reviews
                .iter()
                .any(|r| r.at <= t && r.at >= at && r.kind == ReviewKind::Ack)
        };
        let base: Vec<crate::results::Run> = self
            .base_runs
            .iter()
            .filter(|r| r.state == RunState::Complete && finished(r) <= t)
            .map(|r| r.run.clone())
            .collect();
        let base_checks = compare::aggregate(&base.iter().collect::<Vec<_>>());
        let runs: Vec<&RunRecord> = self
            .runs
            .iter()
            .filter(|r| r.state == RunState::Complete && finished(r) <= t)
            .collect();
        let recent = &runs[runs.len().saturating_sub(FLAKE_CLEAR_RUNS)..];
        checks
            .iter()
            .filter(|(_, c)| c.flaky.is_some())
            .filter(|(_, c)| !c.flaky_at.is_some_and(acked_after))
            .filter(|(k, _)| base_checks.get(*k).map_or(true, |b| b.flaky.is_none()))
            .filter(|(k, _)| {
                let clean = |r: &&RunRecord| {
                    let mine = r
                        .run
                        .tests
                        .iter()
                        .filter(|x| x.path == k.path && x.variant == k.variant);
                    let v: Vec<_> = mine.collect();
                    !v.is_empty()
                        && v.iter()
                            .all(|x| x.attempt == 0 && x.status == crate::results::Status::Pass)
                };
                !(recent.len() == FLAKE_CLEAR_RUNS && recent.iter().all(clean))
            })
            .map(|(k, c)| {
                let mut s = format!("{k} ({}", c.flaky.as_deref().unwrap_or(""));
                let x = compare::telling_line(&c.flaky_excerpt);
                if !x.is_empty() {
                    s.push_str(&format!(": {x}"));
                }
                s + ")"
            })
            .collect()
    }

    // Long: the verdict's rules in the order they decide (README, Verdicts), one block each.
    /// The state the revision should be in at `t`, coming from `prev`.
    pub fn desired(&self, t: Timestamp, prev: Option<(State, Timestamp)>) -> (State, String) {
        if let Some((at, newer)) = self.superseded.as_ref().filter(|s| s.0 <= t) {
            return (
                State::Superseded,
                format!("superseded by {newer} (recorded {at})"),
            );
        }
        if let Some((State::Superseded, _)) = prev {
            return (State::Superseded, String::new());
        }
        let started: Vec<&RunRecord> = self.runs.iter().filter(|r| r.run.started <= t).collect();
        if started.is_empty() {
            return (State::New, "recorded; no run yet".into());
        }
        let complete = started
            .iter()
            .any(|r| r.state == RunState::Complete && finished(r) <= t);
        if !complete {
            let last = started[started.len() - 1];
            let why = if last.state == RunState::Interrupted && finished(last) <= t {
                format!(
                    "run {} was interrupted (MISS); waiting for a rerun",
                    last.run.id
                )
            } else {
                format!("run {} in progress", last.run.id)
            };
            return (State::Testing, why);
        }
        let (checks, findings) = self.outcome(t);
        // One entry per check (a throughput check can miss on three rates).
        let list = |kind: FindingKind| -> Vec<String> {
            let mut v: Vec<String> = Vec::new();
            for f in findings.iter().filter(|f| f.kind == kind) {
                let s = format!("{} {}", f.check, f.status);
                if !v.contains(&s) {
                    v.push(s);
                }
            }
            v
        };
        let new = list(FindingKind::NewFailure);
        if !new.is_empty() {
            return (
                State::ChangesRequested,
                format!("new failures against the base: {}", new.join(", ")),
            );
        }
        let nacks = self.nacks_at(t);
        if let Some(n) = nacks.first() {
            return (
                State::ChangesRequested,
                format!("nacked by {} at {}: {}", n.by, n.at, n.reason),
            );
        }
        let incomplete = list(FindingKind::Incomplete);
        if !incomplete.is_empty() {
            return (
                State::Testing,
                format!(
                    "could not complete, rerun needed: {}",
                    incomplete.join(", ")
                ),
            );
        }
        // Evidence, not its absence: a revision whose farm checks all
        // skipped has shown nothing about the driver.
        let farm = |k: &compare::CheckKey| k.family() == "farm";
        let farm_checks = checks.keys().filter(|k| farm(k)).count();
        let farm_ran = checks.iter().any(|(k, c)| {
            farm(k)
                && matches!(
                    c.status,
                    crate::results::Status::Pass | crate::results::Status::Done
                )
        });
        if farm_checks > 0 && !farm_ran {
            return (
                State::Testing,
                format!("none of the {farm_checks} farm checks passed or measured anything (all SKIP): no evidence yet"),
            );
        }
        let flaky = checks.values().filter(|c| c.flaky.is_some()).count();
        let warnings = list(FindingKind::NewWarning).len();
        let count = |s: crate::results::Status| checks.values().filter(|c| c.status == s).count();
        let skipped = count(crate::results::Status::Skip);
        let mut notes = format!(
            "{} checks planned and reported, {} passed, no new failure against the base",
            checks.len(),
            count(crate::results::Status::Pass) + count(crate::results::Status::Done)
        );
        if skipped > 0 {
            notes.push_str(&format!(
                "; {skipped} not applicable (SKIP, not counted as passed)"
            ));
        }
        if warnings > 0 {
            notes.push_str(&format!("; {warnings} builds with new warnings"));
        }
        if flaky > 0 {
            notes.push_str(&format!("; {flaky} flaky"));
        }
        let held = self.blocking_flakes(t, &checks);
        if !held.is_empty() {
            let why = format!(
                "{notes}; ready-to-merge held by flaky checks: {} (a maintainer's ack, or {FLAKE_CLEAR_RUNS} consecutive clean reruns, releases it)",
                held.join(", ")
            );
            return (State::AwaitingReview, why);
        }
        match prev {
            Some((State::AwaitingReview, since)) if t >= since.plus_hours(REVIEW_HOURS) => (
                State::ReadyToMerge,
                format!("{REVIEW_HOURS} hours without objection since {since}; {notes}"),
            ),
            Some((State::ReadyToMerge, _)) => (State::ReadyToMerge, notes),
            // Still inside the 72 hours: the clock runs from when it started.
            Some((State::AwaitingReview, since)) => (
                State::AwaitingReview,
                format!(
                    "{notes}; ready to merge at {} unless someone objects",
                    since.plus_hours(REVIEW_HOURS)
                ),
            ),
            _ => (
                State::AwaitingReview,
                format!(
                    "{notes}; ready to merge at {} unless someone objects",
                    t.plus_hours(REVIEW_HOURS)
                ),
            ),
        }
    }
}

/// The transitions to append to `existing` so the state is right at `now`.
pub fn replay(
    facts: &Facts<'_>,
    existing: &[Transition],
    now: Timestamp,
) -> Result<Vec<Transition>, VerdictError> {
    let mut cursor = existing.last().map(|t| t.at);
    if let Some(last) = cursor.filter(|&l| now < l) {
        return Err(VerdictError::NowBeforeLast {
            revision: facts.revision.clone(),
            now,
            last,
        });
    }
    let mut state = existing.last().map(|t| (t.state, t.at));
    let mut out = Vec::new();
    if state.is_none() && facts.created <= now {
        // Every revision starts as new, at the time it was recorded; the
        // facts of that same instant are evaluated next.
        out.push(Transition {
            at: facts.created,
            state: State::New,
            reason: "recorded".into(),
        });
        state = Some((State::New, facts.created));
        cursor = Some(Timestamp(facts.created.0 - 1));
    }
    let events = facts.event_times();
    loop {
        let after =
            |t: &Timestamp| cursor.map_or(true, |c| *t > c) && *t <= now && *t >= facts.created;
        let mut next: Vec<Timestamp> = events.iter().copied().filter(after).collect();
        if let Some((State::AwaitingReview, since)) = state {
            let ready = since.plus_hours(REVIEW_HOURS);
            if after(&ready) {
                next.push(ready);
            }
        }
        if after(&now) {
            next.push(now);
        }
        let Some(t) = next.into_iter().min() else {
            break;
        };
        let (s, reason) = facts.desired(t, state);
        if state.map(|x| x.0) != Some(s) {
            out.push(Transition {
                at: t,
                state: s,
                reason,
            });
            state = Some((s, t));
        }
        cursor = Some(t);
    }
    Ok(out)
}
