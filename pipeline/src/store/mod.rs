//! The results store: series → revision → patch → run → build / test /
//! measurement, plus reviews and the verdict history of every revision.
//!
//! [`Store`] is the interface the CLI, the verdict and the exports use; it
//! speaks only the plain types of [`crate::results`] (the review states and
//! transitions included: the store never imports the verdict), so the embedded SQLite default ([`SqliteStore`]) and the PostgreSQL
//! backend for a fleet of runners ([`PgStore`]) are interchangeable; [`open`]
//! picks one from the store's location.
//!
//! Guarantees every backend keeps:
//! - a run's results are written in one transaction ([`Store::finish_run`],
//!   [`Store::record_run`]), and runs recorded together
//!   ([`Store::record_runs`]) in one; a run that was begun and never finished is found
//!   by [`Store::recover`] and recorded as interrupted (one MISS), and
//!   nothing recorded before it is touched;
//! - nothing is ever overwritten: a run id or a revision with a different
//!   patchset is refused, transitions and reviews are append-only;
//! - time never goes back: a transition or review earlier than the last
//!   transition of its revision is refused.
//!
//! These rules are written once, in `store/rules.rs`, over a small write
//! transaction (`WriteTx`) that each backend implements in SQL;
//! both backends are append-only (a run's state is its last event) and run
//! the same tests (`store/tests.rs`).

mod host;
mod pg_schema;
mod postgres;
mod rules;
mod schema;
mod sqlite;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::results::review::{FirstBad, Review, Transition};
use crate::results::{RevisionInfo, RevisionRef, Run, Timestamp};

pub use pg_schema::{redact, PG_SCHEMA_VERSION};
pub use postgres::PgStore;
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};
pub use sqlite::SqliteStore;

/// Default file name of the store in the cache directory.
pub const DEFAULT_FILE: &str = "results.sqlite";
/// Test path recorded for a run that was begun and never finished.
pub const INTERRUPTED_PATH: &str = "harness.interrupted";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store {path} does not exist: record a run first (phyfarm store import RESULTS.json)")]
    Missing { path: PathBuf },
    #[error("store {path} is not a phyfarm results store ({detail}); it was left untouched")]
    Foreign { path: PathBuf, detail: String },
    #[error("store {path} is corrupt ({detail}); it was left untouched")]
    Corrupt { path: PathBuf, detail: String },
    #[error("store {path} has schema version {found}, newer than this phyfarm supports ({supported}); upgrade phyfarm")]
    NewerSchema {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("store {path}: {what} is not a valid stored value ({detail})")]
    BadValue {
        path: PathBuf,
        what: &'static str,
        detail: String,
    },
    /// `error` is no `source`: its causes are already in the message.
    #[error("store {path}: {}", pg_schema::pg_detail(.error))]
    Postgres {
        path: PathBuf,
        error: ::postgres::Error,
    },
    #[error("store {path}: {detail}")]
    BadLocation { path: PathBuf, detail: String },
    #[error("store {path} has schema version {found} and this phyfarm needs {supported}, but this role may not migrate it ({detail}): run `phyfarm store migrate` with the owner role")]
    MigrationDenied {
        path: PathBuf,
        found: u32,
        supported: u32,
        detail: String,
    },
    #[error("{backend} stores are not built into this phyfarm; use a file path for SQLite or a postgresql:// URL")]
    Unsupported { backend: String },
    #[error("run {id}: {reason}")]
    InvalidRun { id: String, reason: String },
    #[error("{revision}: first bad patch refused: {why}")]
    InvalidFirstBad { revision: RevisionRef, why: String },
    #[error("run {id} is already recorded; nothing was changed")]
    DuplicateRun { id: String },
    #[error("run {id} was never begun in this store")]
    NotBegun { id: String },
    #[error("{revision} is recorded with patchset_hash {stored:?} but run {run} has {given:?}: a changed revision needs a new version")]
    RevisionChanged {
        revision: RevisionRef,
        run: String,
        stored: String,
        given: String,
    },
    #[error("no revision {0} in the store")]
    UnknownRevision(RevisionRef),
    #[error("{0} names revisions of more than one series; use <series-name>/v<N>")]
    Ambiguous(RevisionRef),
    #[error(
        "{revision}: time {at} is earlier than its last recorded transition ({last}); refusing"
    )]
    TimeGoesBack {
        revision: RevisionRef,
        at: Timestamp,
        last: Timestamp,
    },
    #[error("{revision}: its transitions changed while this verdict was computed; run it again")]
    Conflict { revision: RevisionRef },
}

/// How far a run got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Begun, results not yet written (or the writer died).
    Running,
    /// Results written.
    Complete,
    /// The writer died; recorded with one MISS at [`INTERRUPTED_PATH`].
    Interrupted,
}

impl RunState {
    pub fn name(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Complete => "complete",
            RunState::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<RunState> {
        [RunState::Running, RunState::Complete, RunState::Interrupted]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

/// A stored run and how far it got.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunRecord {
    pub state: RunState,
    pub run: Run,
}

/// A stored revision.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RevisionRecord {
    pub info: RevisionInfo,
    /// When it was first recorded (the start of its first run).
    pub created: Timestamp,
}

impl RevisionRecord {
    pub fn reference(&self) -> RevisionRef {
        self.info.reference()
    }
}

/// A patch found by Message-ID or patch-id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchHit {
    pub revision: RevisionRef,
    pub position: u32,
    /// True when the Message-ID matched (else only the patch-id did).
    pub by_message_id: bool,
}

/// The results store. Reads take `&self`, writes `&mut self`; every write
/// method is one transaction. A store can move to another thread (the
/// dashboard serves pages from a pool).
pub trait Store: Send {
    /// Record a complete run (and its revision and patches, if new) at once.
    fn record_run(&mut self, run: &Run) -> Result<(), StoreError> {
        self.record_runs(std::slice::from_ref(run))
    }
    /// Record complete runs in one transaction: all of them, or (when one
    /// is refused) none. A revision's run and the base run it is judged
    /// against go in together, so no refusal or crash leaves one alone.
    fn record_runs(&mut self, runs: &[Run]) -> Result<(), StoreError>;
    /// Record that `run` has started (its revision too), committed at once,
    /// so an interruption is visible later. Results in `run` are ignored.
    fn begin_run(&mut self, run: &Run) -> Result<(), StoreError>;
    /// Write the results of a begun run in one transaction. A run that was
    /// recorded as interrupted gets its real results instead.
    fn finish_run(&mut self, run: &Run) -> Result<(), StoreError>;
    /// Record runs whose writer is gone (a dead process on this host) as
    /// interrupted; returns their ids.
    fn recover(&mut self) -> Result<Vec<String>, StoreError>;

    /// Every revision, by series name then version.
    fn revisions(&self) -> Result<Vec<RevisionRecord>, StoreError>;
    /// A revision by `<series-name>/v<N>` or `<change-id>/v<N>`.
    fn revision(&self, r: &RevisionRef) -> Result<RevisionRecord, StoreError>;
    /// Runs of a revision, oldest first.
    fn runs(&self, r: &RevisionRef) -> Result<Vec<RunRecord>, StoreError>;
    /// Runs of the unpatched `base`, oldest first.
    fn base_runs(&self, base: &str) -> Result<Vec<RunRecord>, StoreError>;
    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError>;
    /// Patches whose Message-ID or `git patch-id --stable` matches.
    fn find_patch(
        &self,
        message_id: Option<&str>,
        patch_id: Option<&str>,
    ) -> Result<Vec<PatchHit>, StoreError>;

    /// The verdict history of a revision, oldest first.
    fn transitions(&self, r: &RevisionRef) -> Result<Vec<Transition>, StoreError>;
    /// Append transitions, provided the revision still has exactly
    /// `expected` of them (else [`StoreError::Conflict`]).
    fn append_transitions(
        &mut self,
        r: &RevisionRef,
        expected: usize,
        new: &[Transition],
    ) -> Result<(), StoreError>;
    fn add_review(&mut self, r: &RevisionRef, review: &Review) -> Result<(), StoreError>;
    /// Reviews of a revision, oldest first.
    fn reviews(&self, r: &RevisionRef) -> Result<Vec<Review>, StoreError>;
    /// Record the first bad patch a bisection found for a check.
    fn add_first_bad(&mut self, r: &RevisionRef, f: &FirstBad) -> Result<(), StoreError>;
    /// The first bad patches recorded for a revision, in order.
    fn first_bad(&self, r: &RevisionRef) -> Result<Vec<FirstBad>, StoreError>;

    /// How much the store holds: its run events, transitions and reviews.
    /// The store only appends, and every write that commits appends one of
    /// these, so equal generations before and after some reads mean the
    /// reads saw one state of the store (see [`read_consistently`]).
    fn generation(&self) -> Result<u64, StoreError>;
}

/// [`read_consistently`] gave up: writers kept committing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptChanging;

/// Run `read` until it ran while the store's [`Store::generation`] stayed
/// the same, at most `attempts` times: the result then comes from one state
/// of the store, on every backend.
pub fn read_consistently<T>(
    store: &dyn Store,
    attempts: usize,
    mut read: impl FnMut(&dyn Store) -> T,
) -> Result<Result<T, KeptChanging>, StoreError> {
    for _ in 0..attempts {
        let before = store.generation()?;
        let v = read(store);
        if store.generation()? == before {
            return Ok(Ok(v));
        }
    }
    Ok(Err(KeptChanging))
}

/// Whether [`open`] may create a new store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    Create,
    Existing,
}

/// Whether `location` names a PostgreSQL store (`postgres://…` or
/// `postgresql://…`) rather than an SQLite file.
pub fn is_postgres(location: &Path) -> bool {
    let s = location.to_string_lossy();
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// `location` fit for messages: a URL loses its password.
pub fn display_location(location: &Path) -> String {
    let s = location.to_string_lossy();
    if s.contains("://") {
        redact(&s)
    } else {
        location.display().to_string()
    }
}

/// Open the store named by `location`: a `postgres://` or `postgresql://`
/// URL (PostgreSQL), else a file path (SQLite). URLs of other backends are
/// refused by name.
pub fn open(location: &Path, mode: OpenMode) -> Result<Box<dyn Store>, StoreError> {
    if is_postgres(location) {
        let url = location.to_str().ok_or_else(|| StoreError::BadLocation {
            path: PathBuf::from(display_location(location)),
            detail: "the URL is not valid UTF-8".into(),
        })?;
        return Ok(Box::new(PgStore::open(url, mode)?));
    }
    let s = location.to_string_lossy();
    if let Some((scheme, _)) = s.split_once("://") {
        return Err(StoreError::Unsupported {
            backend: scheme.to_string(),
        });
    }
    Ok(Box::new(SqliteStore::open(location, mode)?))
}

/// Newer revisions of the same change (same change-id, or the same series
/// when there is none), oldest first.
pub fn newer_revisions(all: &[RevisionRecord], of: &RevisionRecord) -> Vec<RevisionRecord> {
    let same = |r: &RevisionRecord| match (&of.info.change_id, &r.info.change_id) {
        (Some(a), Some(b)) => a == b,
        _ => of.info.series == r.info.series,
    };
    let mut v: Vec<RevisionRecord> = all
        .iter()
        .filter(|r| same(r) && r.info.version > of.info.version)
        .cloned()
        .collect();
    v.sort_by_key(|r| r.info.version);
    v
}

/// The previous revision of the same change, if stored.
pub fn previous_revision(all: &[RevisionRecord], of: &RevisionRecord) -> Option<RevisionRecord> {
    let same = |r: &RevisionRecord| match (&of.info.change_id, &r.info.change_id) {
        (Some(a), Some(b)) => a == b,
        _ => of.info.series == r.info.series,
    };
    all.iter()
        .filter(|r| same(r) && r.info.version < of.info.version)
        .max_by_key(|r| r.info.version)
        .cloned()
}

/// `--store`, else `PHYFARM_STORE` (both via clap), else `<cache>/results.sqlite`.
pub fn store_path(store: Option<PathBuf>, cache: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(s) = store.filter(|s| !s.as_os_str().is_empty()) {
        return Ok(s);
    }
    let cache = match cache {
        Some(c) => c,
        None => crate::config::default_cache()?,
    };
    Ok(cache.join(DEFAULT_FILE))
}
