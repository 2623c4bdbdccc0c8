//! The store's rules, written once for every backend: a run id is recorded
//! once, a revision keeps its patchset, a run's state only moves forward
//! (running → interrupted → complete), a run whose writer died is recorded
//! as interrupted with one MISS, and time never goes back on a revision.
//!
//! The backends supply only SQL, through [`WriteTx`]: one write transaction
//! that can look things up and append rows. Nothing here updates or deletes;
//! a run's state is its last event and its results belong to that event
//! (`gen`), so a rerun or a late result appends a new generation.

use super::host::{hostname, pid_alive};
use super::{RunState, StoreError, INTERRUPTED_PATH};
use crate::results::review::{FirstBad, Review, Transition, MAX_FIRST_BAD_HOW};
use crate::results::{
    BuildResult, Measurement, RevisionInfo, RevisionRef, Run, Status, TestResult, Timestamp,
};

/// A run's environment as stored with each of its events.
pub(super) struct EventEnv {
    pub accelerator: String,
    /// The [`crate::results::Environment`] as JSON.
    pub environment: String,
}

impl EventEnv {
    pub fn of(run: &Run) -> EventEnv {
        EventEnv {
            accelerator: run.environment.accelerator.clone(),
            environment: json(&run.environment),
        }
    }
}

/// The results of one run event.
pub(super) struct Results<'a> {
    pub builds: &'a [BuildResult],
    pub tests: &'a [TestResult],
    pub measurements: &'a [Measurement],
}

impl<'a> Results<'a> {
    pub fn of(run: &'a Run) -> Results<'a> {
        Results {
            builds: &run.builds,
            tests: &run.tests,
            measurements: &run.measurements,
        }
    }
}

/// One write transaction of a backend: lookups and appends, nothing else.
/// Every method is plain SQL; the decisions are in this module.
pub(super) trait WriteTx {
    /// The last event of a run: (seq, state), or None if never begun.
    fn last_event(&mut self, run: &str) -> Result<Option<(i64, RunState)>, StoreError>;
    /// The id of the revision's series, inserting the series if it is new.
    /// Only inserts: the first change-id and tree recorded stay.
    fn series(&mut self, info: &RevisionInfo) -> Result<i64, StoreError>;
    /// The stored revision `version` of a series: (id, patchset_hash).
    fn find_revision(
        &mut self,
        series: i64,
        version: u32,
    ) -> Result<Option<(i64, String)>, StoreError>;
    /// Insert a revision and its patches; returns its id.
    fn insert_revision(
        &mut self,
        series: i64,
        info: &RevisionInfo,
        created: Timestamp,
    ) -> Result<i64, StoreError>;
    /// Insert the run's own row (what never changes about it).
    fn insert_run(
        &mut self,
        run: &Run,
        revision: Option<i64>,
        pid: i64,
        host: &str,
    ) -> Result<(), StoreError>;
    /// Append an event to a run's lifecycle.
    fn insert_event(
        &mut self,
        run: &str,
        seq: i64,
        state: RunState,
        finished: Option<Timestamp>,
        env: &EventEnv,
    ) -> Result<(), StoreError>;
    /// Append the results of event `gen` of a run.
    fn insert_results(
        &mut self,
        run: &str,
        gen: i64,
        results: &Results<'_>,
    ) -> Result<(), StoreError>;
    /// When a run started and the environment of its event `seq`.
    fn event_env(&mut self, run: &str, seq: i64) -> Result<(Timestamp, EventEnv), StoreError>;
    /// The id of a revision by `<series-name>/v<N>` or `<change-id>/v<N>`.
    fn resolve(&mut self, r: &RevisionRef) -> Result<i64, StoreError>;
    /// (count, latest `at`) of a revision's transitions.
    fn transition_stats(&mut self, revision: i64)
        -> Result<(usize, Option<Timestamp>), StoreError>;
    fn insert_transition(
        &mut self,
        revision: i64,
        seq: i64,
        t: &Transition,
    ) -> Result<(), StoreError>;
    fn review_count(&mut self, revision: i64) -> Result<i64, StoreError>;
    fn first_bad_count(&mut self, revision: i64) -> Result<i64, StoreError>;
    fn insert_first_bad(&mut self, revision: i64, seq: i64, f: &FirstBad)
        -> Result<(), StoreError>;
    /// How many patches a revision has.
    fn patch_count(&mut self, revision: i64) -> Result<i64, StoreError>;
    fn insert_review(&mut self, revision: i64, seq: i64, review: &Review)
        -> Result<(), StoreError>;
}

pub(super) fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Refuse a run that is not valid before any transaction starts.
pub(super) fn check_run(run: &Run) -> Result<(), StoreError> {
    run.validate().map_err(|reason| StoreError::InvalidRun {
        id: run.id.clone(),
        reason,
    })
}

/// Insert or find the revision of `run`; refuse a changed patchset.
fn revision_of(tx: &mut dyn WriteTx, run: &Run) -> Result<Option<i64>, StoreError> {
    let Some(info) = &run.revision else {
        return Ok(None);
    };
    let series = tx.series(info)?;
    if let Some((id, stored)) = tx.find_revision(series, info.version)? {
        if stored != info.patchset_hash {
            return Err(StoreError::RevisionChanged {
                revision: info.reference(),
                run: run.id.clone(),
                stored,
                given: info.patchset_hash.clone(),
            });
        }
        return Ok(Some(id));
    }
    tx.insert_revision(series, info, run.started).map(Some)
}

/// A new run: refused if its id is recorded; its first event is `state`.
fn first_event(tx: &mut dyn WriteTx, run: &Run, state: RunState) -> Result<(), StoreError> {
    if tx.last_event(&run.id)?.is_some() {
        return Err(StoreError::DuplicateRun { id: run.id.clone() });
    }
    let revision = revision_of(tx, run)?;
    tx.insert_run(run, revision, i64::from(std::process::id()), &hostname())?;
    tx.insert_event(&run.id, 0, state, run.finished, &EventEnv::of(run))
}

/// [`super::Store::record_run`].
pub(super) fn record_run(tx: &mut dyn WriteTx, run: &Run) -> Result<(), StoreError> {
    first_event(tx, run, RunState::Complete)?;
    tx.insert_results(&run.id, 0, &Results::of(run))
}

/// [`super::Store::record_runs`]: every run, in order, in the caller's one
/// transaction; the first refusal refuses them all.
pub(super) fn record_runs(tx: &mut dyn WriteTx, runs: &[Run]) -> Result<(), StoreError> {
    runs.iter().try_for_each(|run| record_run(tx, run))
}

/// [`super::Store::begin_run`].
pub(super) fn begin_run(tx: &mut dyn WriteTx, run: &Run) -> Result<(), StoreError> {
    first_event(tx, run, RunState::Running)
}

/// [`super::Store::finish_run`]: a new generation of a begun or interrupted
/// run; a complete run is final.
pub(super) fn finish_run(tx: &mut dyn WriteTx, run: &Run) -> Result<(), StoreError> {
    let seq = match tx.last_event(&run.id)? {
        None => return Err(StoreError::NotBegun { id: run.id.clone() }),
        Some((_, RunState::Complete)) => {
            return Err(StoreError::DuplicateRun { id: run.id.clone() })
        }
        Some((seq, _)) => seq + 1,
    };
    tx.insert_event(
        &run.id,
        seq,
        RunState::Complete,
        run.finished,
        &EventEnv::of(run),
    )?;
    tx.insert_results(&run.id, seq, &Results::of(run))
}

/// Of the running runs of this host, (id, pid), those whose writer is gone.
pub(super) fn dead_runs(running: Vec<(String, Option<i64>)>) -> Vec<(String, i64)> {
    running
        .into_iter()
        .filter(|(_, pid)| !pid.is_some_and(pid_alive))
        .map(|(id, pid)| (id, pid.unwrap_or(0)))
        .collect()
}

/// [`super::Store::recover`], inside the write transaction: record each run
/// of `dead` that is still running as interrupted, with one MISS.
pub(super) fn record_interrupted(
    tx: &mut dyn WriteTx,
    dead: &[(String, i64)],
    now: Timestamp,
) -> Result<Vec<String>, StoreError> {
    let host = hostname();
    let mut done = Vec::new();
    for (id, pid) in dead {
        // Re-check inside the lock: the writer may have finished meanwhile.
        let seq = match tx.last_event(id)? {
            Some((seq, RunState::Running)) => seq,
            _ => continue,
        };
        let (started, env) = tx.event_env(id, seq)?;
        let finished = Timestamp(started.0.max(now.0));
        tx.insert_event(id, seq + 1, RunState::Interrupted, Some(finished), &env)?;
        let miss = TestResult {
            path: INTERRUPTED_PATH.to_string(),
            variant: None,
            status: Status::Miss,
            duration_s: None,
            log_path: None,
            log_excerpt: format!(
                "run {id} was begun by process {pid} on {host} and never finished; recorded as interrupted at {now}"
            ),
            attempt: 0,
        };
        let results = Results {
            builds: &[],
            tests: std::slice::from_ref(&miss),
            measurements: &[],
        };
        tx.insert_results(id, seq + 1, &results)?;
        done.push(id.clone());
    }
    Ok(done)
}

/// Refuse `at` earlier than the revision's last transition.
fn not_back(r: &RevisionRef, at: Timestamp, last: Option<Timestamp>) -> Result<(), StoreError> {
    match last {
        Some(last) if at.0 < last.0 => Err(StoreError::TimeGoesBack {
            revision: r.clone(),
            at,
            last,
        }),
        _ => Ok(()),
    }
}

/// [`super::Store::append_transitions`].
pub(super) fn append_transitions(
    tx: &mut dyn WriteTx,
    r: &RevisionRef,
    expected: usize,
    new: &[Transition],
) -> Result<(), StoreError> {
    let id = tx.resolve(r)?;
    let (count, mut last) = tx.transition_stats(id)?;
    if count != expected {
        return Err(StoreError::Conflict {
            revision: r.clone(),
        });
    }
    for (seq, t) in (count as i64..).zip(new) {
        not_back(r, t.at, last)?;
        tx.insert_transition(id, seq, t)?;
        last = Some(t.at);
    }
    Ok(())
}

/// [`super::Store::add_review`].
pub(super) fn add_review(
    tx: &mut dyn WriteTx,
    r: &RevisionRef,
    review: &Review,
) -> Result<(), StoreError> {
    let id = tx.resolve(r)?;
    let (_, last) = tx.transition_stats(id)?;
    not_back(r, review.at, last)?;
    let seq = tx.review_count(id)?;
    tx.insert_review(id, seq, review)
}

/// [`super::Store::add_first_bad`]: a farm check of the revision, a patch
/// it has, a variant phyfarm builds, a bounded account of how.
pub(super) fn add_first_bad(
    tx: &mut dyn WriteTx,
    r: &RevisionRef,
    f: &FirstBad,
) -> Result<(), StoreError> {
    let id = tx.resolve(r)?;
    let bad = |why: String| StoreError::InvalidFirstBad {
        revision: r.clone(),
        why,
    };
    if !f.check.starts_with("farm.") || !crate::results::valid_path(&f.check) {
        return Err(bad(format!("{:?} is not a farm check id", f.check)));
    }
    if let Some(v) = &f.variant {
        if !["rust", "c"].contains(&v.as_str()) {
            return Err(bad(format!("variant {v:?} is not rust or c")));
        }
    }
    let n = tx.patch_count(id)?;
    if f.patch == 0 || i64::from(f.patch) > n {
        return Err(bad(format!("patch {} is not one of its {n}", f.patch)));
    }
    if f.how.len() > MAX_FIRST_BAD_HOW {
        return Err(bad(format!("how is longer than {MAX_FIRST_BAD_HOW} bytes")));
    }
    let seq = tx.first_bad_count(id)?;
    tx.insert_first_bad(id, seq, f)
}
