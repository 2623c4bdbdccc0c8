//! The embedded SQLite backend: one file, WAL, a busy timeout so that two
//! processes writing at once wait for each other instead of failing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{
    params, Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior,
};

use super::schema::{self, sql_err};
use super::{
    OpenMode, PatchHit, RevisionRecord, RunRecord, RunState, Store, StoreError, INTERRUPTED_PATH,
};
use crate::results::{
    BuildResult, Environment, Measurement, PatchInfo, RevisionInfo, RevisionRef, Run, Status,
    TestResult, Timestamp, RESULTS_SCHEMA,
};
use crate::verdict::{Review, ReviewKind, State, Transition};

/// How long a writer waits for another one before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

/// This host's name, for telling whose running runs may be recovered.
pub(super) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // on success when the name fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

pub(super) fn pid_alive(pid: i64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
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
        let ids = Self::revision_id(&self.conn, r).map_err(|e| self.err(e))?;
        match ids.as_slice() {
            [id] => Ok(*id),
            [] => Err(StoreError::UnknownRevision(r.clone())),
            _ => Err(StoreError::Ambiguous(r.clone())),
        }
    }

    fn load_revision(&self, id: i64) -> Result<RevisionRecord, StoreError> {
        let (series, version, change_id, tree, message_id, hash, created) = self
            .conn
            .query_row(
                "SELECT s.name, r.version, r.change_id, s.tree, r.message_id, r.patchset_hash, r.created
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
        let sql = format!(
            "SELECT id, revision_id, base, environment, state, started, finished, reproducer
             FROM runs WHERE {where_sql} ORDER BY started, id"
        );
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
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for (id, rev, base, env, state, started, finished, reproducer) in rows {
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
            self.load_results(&mut run)?;
            out.push(RunRecord { state, run });
        }
        Ok(out)
    }

    fn status(&self, s: &str) -> Result<Status, StoreError> {
        Status::parse(s).ok_or_else(|| self.bad("status", s))
    }

    fn load_results(&self, run: &mut Run) -> Result<(), StoreError> {
        let e = |e| self.err(e);
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT patch, variant, status, duration_s, warnings, new_warnings, log_path, log_excerpt
                 FROM builds WHERE run_id = ?1 ORDER BY seq",
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
            .query_map([&run.id], |r| {
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
                 FROM tests WHERE run_id = ?1 ORDER BY seq",
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
            .query_map([&run.id], |r| {
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
                 FROM measurements WHERE run_id = ?1 ORDER BY seq",
            )
            .map_err(e)?;
        type M = (String, Option<String>, f64, String, String, bool);
        let rows: Vec<M> = stmt
            .query_map([&run.id], |r| {
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

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Insert or find the revision of `run`; refuse a changed patchset.
fn upsert_revision(tx: &Transaction<'_>, run: &Run) -> Result<Option<i64>, InTx> {
    let Some(info) = &run.revision else {
        return Ok(None);
    };
    tx.execute(
        "INSERT INTO series (name, change_id, tree) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET
           change_id = coalesce(series.change_id, excluded.change_id),
           tree = coalesce(series.tree, excluded.tree)",
        params![info.series, info.change_id, info.tree],
    )?;
    let series_id: i64 = tx.query_row(
        "SELECT id FROM series WHERE name = ?1",
        [&info.series],
        |r| r.get(0),
    )?;
    let existing: Option<(i64, String)> = tx
        .query_row(
            "SELECT id, patchset_hash FROM revisions WHERE series_id = ?1 AND version = ?2",
            params![series_id, info.version],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((id, stored)) = existing {
        if stored != info.patchset_hash {
            return Err(InTx::Store(StoreError::RevisionChanged {
                revision: info.reference(),
                run: run.id.clone(),
                stored,
                given: info.patchset_hash.clone(),
            }));
        }
        return Ok(Some(id));
    }
    tx.execute(
        "INSERT INTO revisions (series_id, version, change_id, message_id, patchset_hash, created)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            series_id,
            info.version,
            info.change_id,
            info.message_id,
            info.patchset_hash,
            run.started.0
        ],
    )?;
    let id = tx.last_insert_rowid();
    for p in &info.patches {
        tx.execute(
            "INSERT INTO patches (revision_id, position, subject, author, author_email, message_id, patch_id, file)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![id, p.position, p.subject, p.author, p.author_email, p.message_id, p.patch_id, p.file],
        )?;
    }
    Ok(Some(id))
}

fn insert_run_row(
    tx: &Transaction<'_>,
    run: &Run,
    rev: Option<i64>,
    state: RunState,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO runs (id, revision_id, base, accelerator, environment, state, started, finished, reproducer, pid, host)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            run.id,
            rev,
            run.base,
            run.environment.accelerator,
            json(&run.environment),
            state.name(),
            run.started.0,
            run.finished.map(|t| t.0),
            run.reproducer,
            i64::from(std::process::id()),
            hostname(),
        ],
    )?;
    Ok(())
}

fn insert_results(tx: &Transaction<'_>, run: &Run) -> rusqlite::Result<()> {
    for (seq, b) in (0i64..).zip(&run.builds) {
        tx.execute(
            "INSERT INTO builds (run_id, seq, patch, variant, status, duration_s, warnings, new_warnings, log_path, log_excerpt)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![run.id, seq, b.patch, b.variant, b.status.name(), b.duration_s, b.warnings,
                    json(&b.new_warnings), b.log_path, b.log_excerpt],
        )?;
    }
    for (seq, t) in (0i64..).zip(&run.tests) {
        tx.execute(
            "INSERT INTO tests (run_id, seq, path, variant, status, duration_s, log_path, log_excerpt, attempt)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![run.id, seq, t.path, t.variant, t.status.name(), t.duration_s, t.log_path,
                    t.log_excerpt, t.attempt],
        )?;
    }
    for (seq, m) in (0i64..).zip(&run.measurements) {
        tx.execute(
            "INSERT INTO measurements (run_id, seq, name, variant, value, unit, samples, lower_is_better)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![run.id, seq, m.name, m.variant, m.value, m.unit, json(&m.samples), m.lower_is_better],
        )?;
    }
    Ok(())
}

fn delete_results(tx: &Transaction<'_>, id: &str) -> rusqlite::Result<()> {
    for table in ["builds", "tests", "measurements"] {
        tx.execute(&format!("DELETE FROM {table} WHERE run_id = ?1"), [id])?;
    }
    Ok(())
}

/// An error inside a transaction: SQL, or a refusal.
enum InTx {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for InTx {
    fn from(e: rusqlite::Error) -> InTx {
        InTx::Sql(e)
    }
}

impl SqliteStore {
    /// Run `f` in one IMMEDIATE transaction; commit only if it succeeds.
    fn in_tx<T>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, InTx>,
    ) -> Result<T, StoreError> {
        let path = self.path.clone();
        let tx = self.write_tx()?;
        let map = |e: InTx| match e {
            InTx::Sql(e) => sql_err(&path, e),
            InTx::Store(e) => e,
        };
        let v = f(&tx).map_err(map)?;
        tx.commit().map_err(|e| sql_err(&path, e))?;
        Ok(v)
    }

    fn run_state(tx: &Transaction<'_>, id: &str) -> rusqlite::Result<Option<String>> {
        tx.query_row("SELECT state FROM runs WHERE id = ?1", [id], |r| r.get(0))
            .optional()
    }

    fn last_transition_at(
        tx: &Connection,
        rev: i64,
    ) -> rusqlite::Result<Option<(usize, Option<i64>)>> {
        tx.query_row(
            "SELECT count(*), max(at) FROM transitions WHERE revision_id = ?1",
            [rev],
            |r| Ok(Some((r.get::<_, i64>(0)? as usize, r.get(1)?))),
        )
    }
}

fn check_run(run: &Run) -> Result<(), StoreError> {
    run.validate().map_err(|reason| StoreError::InvalidRun {
        id: run.id.clone(),
        reason,
    })
}

impl Store for SqliteStore {
    fn record_run(&mut self, run: &Run) -> Result<(), StoreError> {
        check_run(run)?;
        self.in_tx(|tx| {
            if Self::run_state(tx, &run.id)?.is_some() {
                return Err(InTx::Store(StoreError::DuplicateRun { id: run.id.clone() }));
            }
            let rev = upsert_revision(tx, run)?;
            insert_run_row(tx, run, rev, RunState::Complete)?;
            insert_results(tx, run)?;
            Ok(())
        })
    }

    fn begin_run(&mut self, run: &Run) -> Result<(), StoreError> {
        check_run(run)?;
        self.in_tx(|tx| {
            if Self::run_state(tx, &run.id)?.is_some() {
                return Err(InTx::Store(StoreError::DuplicateRun { id: run.id.clone() }));
            }
            let rev = upsert_revision(tx, run)?;
            insert_run_row(tx, run, rev, RunState::Running)?;
            Ok(())
        })
    }

    fn finish_run(&mut self, run: &Run) -> Result<(), StoreError> {
        check_run(run)?;
        self.in_tx(|tx| {
            match Self::run_state(tx, &run.id)?.as_deref() {
                None => return Err(InTx::Store(StoreError::NotBegun { id: run.id.clone() })),
                Some("complete") => {
                    return Err(InTx::Store(StoreError::DuplicateRun { id: run.id.clone() }))
                }
                _ => {}
            }
            delete_results(tx, &run.id)?;
            tx.execute(
                "UPDATE runs SET state = 'complete', finished = ?2, environment = ?3, accelerator = ?4
                 WHERE id = ?1",
                params![run.id, run.finished.map(|t| t.0), json(&run.environment), run.environment.accelerator],
            )?;
            insert_results(tx, run)?;
            Ok(())
        })
    }

    fn recover(&mut self) -> Result<Vec<String>, StoreError> {
        let host = hostname();
        let mut stmt = self
            .conn
            .prepare("SELECT id, pid, host FROM runs WHERE state = 'running'")
            .map_err(|e| self.err(e))?;
        let running: Vec<(String, Option<i64>, Option<String>)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        drop(stmt);
        let dead: Vec<(String, i64)> = running
            .into_iter()
            .filter(|(_, pid, h)| {
                h.as_deref() == Some(host.as_str()) && !pid.is_some_and(pid_alive)
            })
            .map(|(id, pid, _)| (id, pid.unwrap_or(0)))
            .collect();
        if dead.is_empty() {
            return Ok(vec![]);
        }
        let now = Timestamp::now();
        self.in_tx(|tx| {
            let mut done = Vec::new();
            for (id, pid) in &dead {
                // Re-check inside the lock: the writer may have finished meanwhile.
                if Self::run_state(tx, id)?.as_deref() != Some("running") {
                    continue;
                }
                delete_results(tx, id)?;
                tx.execute(
                    "UPDATE runs SET state = 'interrupted', finished = max(started, ?2) WHERE id = ?1",
                    params![id, now.0],
                )?;
                let excerpt = format!(
                    "run {id} was begun by process {pid} on {host} and never finished; recorded as interrupted at {now}"
                );
                tx.execute(
                    "INSERT INTO tests (run_id, seq, path, variant, status, duration_s, log_path, log_excerpt, attempt)
                     VALUES (?1, 0, ?2, NULL, 'MISS', NULL, NULL, ?3, 0)",
                    params![id, INTERRUPTED_PATH, excerpt],
                )?;
                done.push(id.clone());
            }
            Ok(done)
        })
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
        self.load_runs("revision_id = ?1", &id)
    }

    fn base_runs(&self, base: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.load_runs("revision_id IS NULL AND base = ?1", &base)
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        Ok(self.load_runs("id = ?1", &id)?.into_iter().next())
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
        let id = self.resolve(r)?;
        self.in_tx(|tx| {
            let (count, last) = Self::last_transition_at(tx, id)?.unwrap_or((0, None));
            if count != expected {
                return Err(InTx::Store(StoreError::Conflict { revision: r.clone() }));
            }
            let mut last = last;
            for (i, t) in new.iter().enumerate() {
                if let Some(l) = last.filter(|&l| t.at.0 < l) {
                    return Err(InTx::Store(StoreError::TimeGoesBack {
                        revision: r.clone(),
                        at: t.at,
                        last: Timestamp(l),
                    }));
                }
                tx.execute(
                    "INSERT INTO transitions (revision_id, seq, at, state, reason) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![id, (count + i) as i64, t.at.0, t.state.name(), t.reason],
                )?;
                last = Some(t.at.0);
            }
            Ok(())
        })
    }

    fn add_review(&mut self, r: &RevisionRef, review: &Review) -> Result<(), StoreError> {
        let id = self.resolve(r)?;
        self.in_tx(|tx| {
            if let Some((_, Some(last))) = Self::last_transition_at(tx, id)? {
                if review.at.0 < last {
                    return Err(InTx::Store(StoreError::TimeGoesBack {
                        revision: r.clone(),
                        at: review.at,
                        last: Timestamp(last),
                    }));
                }
            }
            let seq: i64 = tx.query_row("SELECT count(*) FROM reviews WHERE revision_id = ?1", [id], |r| r.get(0))?;
            tx.execute(
                "INSERT INTO reviews (revision_id, seq, at, by, kind, reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, seq, review.at.0, review.by, review.kind.name(), review.reason],
            )?;
            Ok(())
        })
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
}
