//! The embedded SQLite backend: one file, WAL, a busy timeout so that two
//! processes writing at once wait for each other instead of failing.
//!
//! This file holds the reads; `sqlite/write.rs` the SQL the store's rules
//! (`store/rules.rs`) write through. Both only SELECT and INSERT: a run's
//! state is its last row of `run_events` (see `schema.rs`).
//!
//! One file over 500 lines: every read query of the SQLite backend, beside
//! the schema upgrade that decides what those reads see.

mod write;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, Transaction, TransactionBehavior};

use super::host::hostname;
use super::rules::{self, WriteTx};
use super::schema::{self, sql_err};
use super::{OpenMode, PatchHit, RevisionRecord, RunRecord, RunState, Store, StoreError};
use crate::results::review::{FirstBad, Review, ReviewKind, State, Transition};
use crate::results::{
    BuildResult, Environment, Measurement, PatchInfo, RevisionInfo, RevisionRef, Run, Status,
    TestResult, Timestamp, RESULTS_SCHEMA,
};
use write::SqlTx;

/// How long a writer waits for another one before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

impl SqliteStore {
    /// Open (or, with [`OpenMode::Create`], create) the store at `path`,
    /// check it, migrate it, and recover runs interrupted on this host.
    pub fn open(path: &Path, mode: OpenMode) -> Result<SqliteStore, StoreError> {
        let exists = schema::check_header(path)?;
        if !exists {
            if mode == OpenMode::Existing {
                return Err(StoreError::Missing {
                    path: path.to_path_buf(),
                });
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
                    path: path.to_path_buf(),
                    source,
                })?;
            }
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(|e| sql_err(path, e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| sql_err(path, e))?;
        schema::prepare(&mut conn, path)?;
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(|e| sql_err(path, e))?;
        let mut store = SqliteStore {
            conn,
            path: path.to_path_buf(),
        };
        store.recover()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        sql_err(&self.path, e)
    }

    fn bad(&self, what: &'static str, detail: impl Into<String>) -> StoreError {
        StoreError::BadValue {
            path: self.path.clone(),
            what,
            detail: detail.into(),
        }
    }

    fn write_tx(&mut self) -> Result<Transaction<'_>, StoreError> {
        let path = self.path.clone();
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&path, e))
    }

    /// The revision's row id, or None.
    fn revision_id(conn: &Connection, r: &RevisionRef) -> rusqlite::Result<Vec<i64>> {
        let mut stmt = conn.prepare_cached(
            "SELECT r.id FROM revisions r JOIN series s ON s.id = r.series_id
             WHERE (s.name = ?1 OR r.change_id = ?1) AND r.version = ?2",
        )?;
        let ids = stmt
            .query_map(params![r.series, r.version], |row| row.get(0))?
            .collect();
        ids
    }

    fn resolve(&self, r: &RevisionRef) -> Result<i64, StoreError> {
        resolve(&self.conn, &self.path, r)
    }

    fn load_revision(&self, id: i64) -> Result<RevisionRecord, StoreError> {
        let (series, version, change_id, tree, message_id, hash, created) = self
            .conn
            .query_row(
                "SELECT s.name, r.version, r.change_id,
                        (SELECT tree FROM series_trees t WHERE t.series_id = s.id),
                        r.message_id, r.patchset_hash, r.created
                 FROM revisions r JOIN series s ON s.id = r.series_id WHERE r.id = ?1",
                [id],
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, u32>(1)?,
                        row.get::<_, Option<String>>(2)?,
                        row.get::<_, Option<String>>(3)?,
                        row.get::<_, Option<String>>(4)?,
                        row.get::<_, String>(5)?,
                        row.get::<_, i64>(6)?,
                    ))
                },
            )
            .map_err(|e| self.err(e))?;
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT position, subject, author, author_email, message_id, patch_id, file
                 FROM patches WHERE revision_id = ?1 ORDER BY position",
            )
            .map_err(|e| self.err(e))?;
        let patches = stmt
            .query_map([id], |row| {
                Ok(PatchInfo {
                    position: row.get(0)?,
                    subject: row.get(1)?,
                    author: row.get(2)?,
                    author_email: row.get(3)?,
                    message_id: row.get(4)?,
                    patch_id: row.get(5)?,
                    file: row.get(6)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        Ok(RevisionRecord {
            info: RevisionInfo {
                series,
                version,
                change_id,
                tree,
                message_id,
                patchset_hash: hash,
                patches,
            },
            created: Timestamp(created),
        })
    }

    fn load_runs(
        &self,
        where_sql: &str,
        arg: &dyn rusqlite::ToSql,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let sql = format!("{RUNS_SQL} WHERE {where_sql} ORDER BY r.started, r.id");
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        type Row = (
            String,
            Option<i64>,
            String,
            String,
            String,
            i64,
            Option<i64>,
            String,
            i64,
        );
        let rows: Vec<Row> = stmt
            .query_map([arg], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for (id, rev, base, env, state, started, finished, reproducer, gen) in rows {
            let environment: Environment = serde_json::from_str(&env)
                .map_err(|e| self.bad("run environment", format!("run {id}: {e}")))?;
            let state = RunState::parse(&state)
                .ok_or_else(|| self.bad("run state", format!("run {id}: {state:?}")))?;
            let revision = match rev {
                Some(rid) => Some(self.load_revision(rid)?.info),
                None => None,
            };
            let mut run = Run {
                schema: RESULTS_SCHEMA,
                id,
                revision,
                base,
                environment,
                started: Timestamp(started),
                finished: finished.map(Timestamp),
                reproducer,
                builds: vec![],
                tests: vec![],
                measurements: vec![],
            };
            self.load_results(&mut run, gen)?;
            out.push(RunRecord { state, run });
        }
        Ok(out)
    }

    fn status(&self, s: &str) -> Result<Status, StoreError> {
        Status::parse(s).ok_or_else(|| self.bad("status", s))
    }

    // Long: the run's builds, tests and measurements: three queries, each row checked as it is read.
    fn load_results(&self, run: &mut Run, gen: i64) -> Result<(), StoreError> {
        let e = |e| self.err(e);
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT patch, variant, status, duration_s, warnings, new_warnings, log_path, log_excerpt
                 FROM builds WHERE run_id = ?1 AND gen = ?2 ORDER BY seq",
            )
            .map_err(e)?;
        type B = (
            Option<u32>,
            String,
            String,
            f64,
            u32,
            String,
            Option<String>,
            String,
        );
        let rows: Vec<B> = stmt
            .query_map(params![run.id, gen], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(e)?;
        for (patch, variant, status, duration_s, warnings, nw, log_path, log_excerpt) in rows {
            run.builds.push(BuildResult {
                patch,
                variant,
                status: self.status(&status)?,
                duration_s,
                warnings,
                new_warnings: serde_json::from_str(&nw)
                    .map_err(|x| self.bad("new_warnings", x.to_string()))?,
                log_path,
                log_excerpt,
            });
        }
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT path, variant, status, duration_s, log_path, log_excerpt, attempt
                 FROM tests WHERE run_id = ?1 AND gen = ?2 ORDER BY seq",
            )
            .map_err(e)?;
        type T = (
            String,
            Option<String>,
            String,
            Option<f64>,
            Option<String>,
            String,
            u32,
        );
        let rows: Vec<T> = stmt
            .query_map(params![run.id, gen], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(e)?;
        for (path, variant, status, duration_s, log_path, log_excerpt, attempt) in rows {
            run.tests.push(TestResult {
                path,
                variant,
                status: self.status(&status)?,
                duration_s,
                log_path,
                log_excerpt,
                attempt,
            });
        }
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT name, variant, value, unit, samples, lower_is_better
                 FROM measurements WHERE run_id = ?1 AND gen = ?2 ORDER BY seq",
            )
            .map_err(e)?;
        type M = (String, Option<String>, f64, String, String, bool);
        let rows: Vec<M> = stmt
            .query_map(params![run.id, gen], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(e)?;
        for (name, variant, value, unit, samples, lower_is_better) in rows {
            run.measurements.push(Measurement {
                name,
                variant,
                value,
                unit,
                samples: serde_json::from_str(&samples)
                    .map_err(|x| self.bad("samples", x.to_string()))?,
                lower_is_better,
            });
        }
        Ok(())
    }
}

/// The latest event of each run joined to the run: what [`RunRecord`]s are
/// read from.
const RUNS_SQL: &str = "SELECT r.id, r.revision_id, r.base, e.environment, e.state, r.started,
        e.finished, r.reproducer, e.seq
    FROM runs r JOIN run_events e ON e.run_id = r.id
        AND e.seq = (SELECT max(seq) FROM run_events x WHERE x.run_id = r.id)";

/// See [`Store::generation`]; one statement, so one state of the file.
const GENERATION_SQL: &str = "SELECT (SELECT count(*) FROM run_events) + (SELECT count(*) FROM transitions) + (SELECT count(*) FROM reviews) + (SELECT count(*) FROM first_bad)";

/// The id of a revision by `<series-name>/v<N>` or `<change-id>/v<N>`.
fn resolve(conn: &Connection, path: &Path, r: &RevisionRef) -> Result<i64, StoreError> {
    let ids = SqliteStore::revision_id(conn, r).map_err(|e| sql_err(path, e))?;
    match ids.as_slice() {
        [id] => Ok(*id),
        [] => Err(StoreError::UnknownRevision(r.clone())),
        _ => Err(StoreError::Ambiguous(r.clone())),
    }
}

impl SqliteStore {
    /// Run `f` under the store's rules in one IMMEDIATE transaction; commit
    /// only if it succeeds.
    fn in_tx<T>(
        &mut self,
        f: impl FnOnce(&mut dyn WriteTx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let path = self.path.clone();
        let tx = self.write_tx()?;
        let v = f(&mut SqlTx {
            tx: &tx,
            path: &path,
        })?;
        tx.commit().map_err(|e| sql_err(&path, e))?;
        Ok(v)
    }
}

impl Store for SqliteStore {
    fn record_runs(&mut self, runs: &[Run]) -> Result<(), StoreError> {
        runs.iter().try_for_each(rules::check_run)?;
        self.in_tx(|tx| rules::record_runs(tx, runs))
    }

    fn begin_run(&mut self, run: &Run) -> Result<(), StoreError> {
        rules::check_run(run)?;
        self.in_tx(|tx| rules::begin_run(tx, run))
    }

    fn finish_run(&mut self, run: &Run) -> Result<(), StoreError> {
        rules::check_run(run)?;
        self.in_tx(|tx| rules::finish_run(tx, run))
    }

    fn recover(&mut self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.id, r.pid FROM runs r JOIN run_events e ON e.run_id = r.id
                   AND e.seq = (SELECT max(seq) FROM run_events x WHERE x.run_id = r.id)
                 WHERE e.state = 'running' AND r.host = ?1",
            )
            .map_err(|e| self.err(e))?;
        let running: Vec<(String, Option<i64>)> = stmt
            .query_map([hostname()], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        drop(stmt);
        let dead = rules::dead_runs(running);
        if dead.is_empty() {
            return Ok(vec![]);
        }
        let now = Timestamp::now();
        self.in_tx(|tx| rules::record_interrupted(tx, &dead, now))
    }

    fn revisions(&self) -> Result<Vec<RevisionRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT r.id FROM revisions r JOIN series s ON s.id = r.series_id ORDER BY s.name, r.version")
            .map_err(|e| self.err(e))?;
        let ids: Vec<i64> = stmt
            .query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        ids.into_iter().map(|id| self.load_revision(id)).collect()
    }

    fn revision(&self, r: &RevisionRef) -> Result<RevisionRecord, StoreError> {
        let id = self.resolve(r)?;
        self.load_revision(id)
    }

    fn runs(&self, r: &RevisionRef) -> Result<Vec<RunRecord>, StoreError> {
        let id = self.resolve(r)?;
        self.load_runs("r.revision_id = ?1", &id)
    }

    fn base_runs(&self, base: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.load_runs("r.revision_id IS NULL AND r.base = ?1", &base)
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        Ok(self.load_runs("r.id = ?1", &id)?.into_iter().next())
    }

    fn find_patch(
        &self,
        message_id: Option<&str>,
        patch_id: Option<&str>,
    ) -> Result<Vec<PatchHit>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT p.revision_id, p.position, p.message_id = ?1 FROM patches p
                 WHERE (?1 IS NOT NULL AND p.message_id = ?1) OR (?2 IS NOT NULL AND p.patch_id = ?2)
                 ORDER BY p.revision_id, p.position",
            )
            .map_err(|e| self.err(e))?;
        let rows: Vec<(i64, u32, Option<bool>)> = stmt
            .query_map(params![message_id, patch_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        rows.into_iter()
            .map(|(rid, position, by_mid)| {
                Ok(PatchHit {
                    revision: self.load_revision(rid)?.reference(),
                    position,
                    by_message_id: by_mid.unwrap_or(false),
                })
            })
            .collect()
    }

    fn transitions(&self, r: &RevisionRef) -> Result<Vec<Transition>, StoreError> {
        let id = self.resolve(r)?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT at, state, reason FROM transitions WHERE revision_id = ?1 ORDER BY seq",
            )
            .map_err(|e| self.err(e))?;
        let rows: Vec<(i64, String, String)> = stmt
            .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        rows.into_iter()
            .map(|(at, state, reason)| {
                Ok(Transition {
                    at: Timestamp(at),
                    state: State::parse(&state)
                        .ok_or_else(|| self.bad("verdict state", state.clone()))?,
                    reason,
                })
            })
            .collect()
    }

    fn append_transitions(
        &mut self,
        r: &RevisionRef,
        expected: usize,
        new: &[Transition],
    ) -> Result<(), StoreError> {
        self.in_tx(|tx| rules::append_transitions(tx, r, expected, new))
    }

    fn add_review(&mut self, r: &RevisionRef, review: &Review) -> Result<(), StoreError> {
        self.in_tx(|tx| rules::add_review(tx, r, review))
    }

    fn reviews(&self, r: &RevisionRef) -> Result<Vec<Review>, StoreError> {
        let id = self.resolve(r)?;
        let mut stmt = self
            .conn
            .prepare("SELECT at, by, kind, reason FROM reviews WHERE revision_id = ?1 ORDER BY seq")
            .map_err(|e| self.err(e))?;
        let rows: Vec<(i64, String, String, String)> = stmt
            .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        rows.into_iter()
            .map(|(at, by, kind, reason)| {
                Ok(Review {
                    at: Timestamp(at),
                    by,
                    kind: ReviewKind::parse(&kind)
                        .ok_or_else(|| self.bad("review kind", kind.clone()))?,
                    reason,
                })
            })
            .collect()
    }

    fn add_first_bad(&mut self, r: &RevisionRef, f: &FirstBad) -> Result<(), StoreError> {
        self.in_tx(|tx| rules::add_first_bad(tx, r, f))
    }

    fn first_bad(&self, r: &RevisionRef) -> Result<Vec<FirstBad>, StoreError> {
        let id = self.resolve(r)?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT at, check_path, variant, patch, how FROM first_bad WHERE revision_id = ?1 ORDER BY seq",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([id], |r| {
                Ok(FirstBad {
                    at: Timestamp(r.get(0)?),
                    check: r.get(1)?,
                    variant: r.get(2)?,
                    patch: r.get(3)?,
                    how: r.get(4)?,
                })
            })
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    fn generation(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row(GENERATION_SQL, [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        Ok(n as u64)
    }
}
