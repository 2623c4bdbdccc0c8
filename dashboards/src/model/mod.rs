//! What each page shows, gathered from the store. Every page is one
//! `Serialize` struct: the HTML is rendered from it and its JSON twin is it.
//!
//! Verdicts are evaluated at the page's time with
//! [`phyfarm::verdict::evaluate`], which stores nothing: the dashboard only
//! reads.

mod compare;
mod revision;
mod run;
mod trends;

use std::collections::BTreeMap;

use phyfarm::results::{RevisionRef, Timestamp};
use phyfarm::store::{RevisionRecord, RunState, Store, StoreError};
use phyfarm::verdict::{self, FindingKind, Report, State, VerdictError};
use serde::Serialize;

pub use compare::{
    compare_page, pick, ComparePage, ComparePick, CompareRow, MeasurementPair, PatchPair,
};
pub use revision::{
    revision, CheckCell, MatrixRow, MeasurementRow, PatchRow, RevisionPage, RunLink, WarningRow,
};
pub use run::{
    all_runs, farm, run, BuildRow, CheckDuration, FarmPage, FlakyRow, RunPage, RunSummary,
    StatusCounts, TestRow,
};
pub use trends::{trends, Chart, Point, TrendGroup, Trends};

#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Store(StoreError),
    #[error(transparent)]
    Verdict(VerdictError),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> PageError {
        match e {
            StoreError::UnknownRevision(r) => {
                PageError::NotFound(format!("no revision {r} in the store"))
            }
            StoreError::Ambiguous(r) => PageError::NotFound(format!(
                "{r} names revisions of more than one series; use <series-name>/v<N>"
            )),
            e => PageError::Store(e),
        }
    }
}

impl From<VerdictError> for PageError {
    fn from(e: VerdictError) -> PageError {
        match e {
            VerdictError::Store(s) => s.into(),
            e => PageError::Verdict(e),
        }
    }
}

/// The three-day clock of a revision.
#[derive(Debug, Clone, Serialize)]
pub struct Clock {
    /// `time-left` (awaiting review), `ready-since` (ready to merge) or
    /// `stopped` (any other state).
    pub kind: &'static str,
    /// When it becomes (or became) ready to merge.
    pub at: Option<Timestamp>,
    /// Hours left, or hours since it became ready.
    pub hours: Option<f64>,
    pub text: String,
}

impl Clock {
    fn of(rep: &Report, now: Timestamp) -> Clock {
        match rep.state {
            Some(State::AwaitingReview) => {
                let at = rep.ready_at;
                let left = at.map(|a| now.hours_until(a).max(0.0));
                Clock {
                    kind: "time-left",
                    at,
                    hours: left,
                    text: left.map_or("waiting for review".into(), |h| {
                        format!("{} left", crate::text::hours(h))
                    }),
                }
            }
            Some(State::ReadyToMerge) => {
                let since = rep.since;
                let h = since.map(|s| s.hours_until(now).max(0.0));
                Clock {
                    kind: "ready-since",
                    at: since,
                    hours: h,
                    text: h.map_or("ready".into(), |h| {
                        format!("ready for {}", crate::text::hours(h))
                    }),
                }
            }
            _ => Clock {
                kind: "stopped",
                at: None,
                hours: None,
                text: "–".into(),
            },
        }
    }
}

/// One revision in a list: its verdict and what led to it.
#[derive(Debug, Clone, Serialize)]
pub struct RevisionSummary {
    pub series: String,
    pub version: u32,
    /// `<series>/v<N>`.
    pub reference: String,
    pub change_id: Option<String>,
    /// The first patch's subject (the cover letter is not stored).
    pub title: String,
    pub author: String,
    pub patches: usize,
    pub created: Timestamp,
    /// None: no verdict could be formed yet.
    pub state: Option<State>,
    pub since: Option<Timestamp>,
    pub reason: String,
    pub clock: Clock,
    pub runs: usize,
    pub interrupted: usize,
    pub last_run: Option<String>,
    pub new_failures: usize,
    pub still_failing: usize,
    pub fixed: usize,
    pub incomplete: usize,
    pub new_warnings: usize,
    pub flaky: usize,
    pub superseded: bool,
}

/// Evaluate a revision's verdict at `now`, or at its last stored
/// transition if that is later (a clock running behind never errors).
pub fn report(store: &dyn Store, r: &RevisionRef, now: Timestamp) -> Result<Report, PageError> {
    let last = store.transitions(r)?.last().map(|t| t.at);
    let at = last.map_or(now, |l| l.max(now));
    Ok(verdict::evaluate(store, r, at)?)
}

impl RevisionSummary {
    pub fn new(rec: &RevisionRecord, rep: &Report, now: Timestamp) -> RevisionSummary {
        let first = rec.info.patches.iter().min_by_key(|p| p.position);
        let count = |k: FindingKind| rep.vs_base.iter().filter(|f| f.kind == k).count();
        RevisionSummary {
            series: rec.info.series.clone(),
            version: rec.info.version,
            reference: rec.reference().to_string(),
            change_id: rec.info.change_id.clone(),
            title: first.map(|p| clean(&p.subject)).unwrap_or_default(),
            author: first.map(|p| clean(&p.author)).unwrap_or_default(),
            patches: rec.info.patches.len(),
            created: rec.created,
            state: rep.state,
            since: rep.since,
            reason: clean(&rep.reason),
            clock: Clock::of(rep, now),
            runs: rep.runs.len(),
            interrupted: rep.interrupted.len(),
            last_run: rep.runs.last().cloned(),
            new_failures: count(FindingKind::NewFailure),
            still_failing: count(FindingKind::StillFailing),
            fixed: count(FindingKind::Fixed),
            incomplete: count(FindingKind::Incomplete),
            new_warnings: count(FindingKind::NewWarning),
            flaky: rep.flaky().count(),
            superseded: rep.state == Some(State::Superseded),
        }
    }
}

/// One series with its revisions, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesGroup {
    pub name: String,
    pub change_id: Option<String>,
    pub tree: Option<String>,
    /// Revisions that are not superseded.
    pub current: Vec<RevisionSummary>,
    /// Superseded revisions (folded on the page).
    pub superseded: Vec<RevisionSummary>,
}

/// The front page: every series and revision with its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Index {
    pub generated: Timestamp,
    pub series: Vec<SeriesGroup>,
    /// How many revisions are in each state.
    pub states: BTreeMap<String, usize>,
}

pub fn index(store: &dyn Store, now: Timestamp) -> Result<Index, PageError> {
    let mut groups: BTreeMap<String, SeriesGroup> = BTreeMap::new();
    let mut states = BTreeMap::new();
    for rec in store.revisions()? {
        let rep = report(store, &rec.reference(), now)?;
        let s = RevisionSummary::new(&rec, &rep, now);
        let name = rep.state.map_or("none", State::name);
        *states.entry(name.to_string()).or_insert(0) += 1;
        let g = groups
            .entry(rec.info.series.clone())
            .or_insert_with(|| SeriesGroup {
                name: rec.info.series.clone(),
                change_id: rec.info.change_id.clone(),
                tree: rec.info.tree.clone(),
                current: vec![],
                superseded: vec![],
            });
        if s.superseded {
            g.superseded.push(s);
        } else {
            g.current.push(s);
        }
    }
    let mut series: Vec<SeriesGroup> = groups.into_values().collect();
    for g in &mut series {
        g.current.sort_by_key(|r| std::cmp::Reverse(r.version));
        g.superseded.sort_by_key(|r| std::cmp::Reverse(r.version));
    }
    // The series with the latest activity first.
    series.sort_by_key(|g| {
        std::cmp::Reverse(
            g.current
                .iter()
                .chain(&g.superseded)
                .map(|r| r.created)
                .max(),
        )
    });
    Ok(Index {
        generated: now,
        series,
        states,
    })
}

/// One series: its revisions and their verdict histories.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesPage {
    pub generated: Timestamp,
    pub group: SeriesGroup,
    pub history: Vec<(String, Vec<verdict::Transition>)>,
}

pub fn series(store: &dyn Store, name: &str, now: Timestamp) -> Result<SeriesPage, PageError> {
    let idx = index(store, now)?;
    let group = idx
        .series
        .into_iter()
        .find(|g| g.name == name)
        .ok_or_else(|| PageError::NotFound(format!("no series {name:?} in the store")))?;
    let mut history = Vec::new();
    for r in group.current.iter().chain(&group.superseded) {
        let rep = report(
            store,
            &RevisionRef {
                series: r.series.clone(),
                version: r.version,
            },
            now,
        )?;
        history.push((r.reference.clone(), clean_transitions(&rep.transitions)));
    }
    Ok(SeriesPage {
        generated: now,
        group,
        history,
    })
}

/// Complete runs of a revision, oldest first.
fn complete_runs(
    store: &dyn Store,
    r: &RevisionRef,
) -> Result<Vec<phyfarm::results::Run>, StoreError> {
    Ok(store
        .runs(r)?
        .into_iter()
        .filter(|x| x.state == RunState::Complete)
        .map(|x| x.run)
        .collect())
}

/// Text from a patch, a guest or a reviewer without terminal escapes or
/// control characters (HTML escaping is the templates' job).
pub fn clean(s: &str) -> String {
    crate::text::strip_ansi(s)
}

pub fn clean_transitions(ts: &[verdict::Transition]) -> Vec<verdict::Transition> {
    ts.iter()
        .map(|t| verdict::Transition {
            at: t.at,
            state: t.state,
            reason: clean(&t.reason),
        })
        .collect()
}

pub fn clean_reviews(rs: &[verdict::Review]) -> Vec<verdict::Review> {
    rs.iter()
        .map(|r| verdict::Review {
            at: r.at,
            by: clean(&r.by),
            kind: r.kind,
            reason: clean(&r.reason),
        })
        .collect()
}
