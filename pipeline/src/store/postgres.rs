//! The PostgreSQL backend, for a fleet of runners sharing one store.
//!
//! The store lives in the current schema of the database the URL names.
//! Writers serialise on a transaction-scoped advisory lock (the counterpart of
//! SQLite's `BEGIN IMMEDIATE`), so every write is one READ COMMITTED
//! transaction that sees all earlier commits; reads run in one REPEATABLE
//! READ snapshot each. The runtime issues only `SELECT` and `INSERT` (see
//! [`super::pg_schema`]), so runners can hold a role with nothing more.
//!
//! The client speaks no TLS: use it on loopback, a unix socket, or through an
//! ssh tunnel or a VPN to the database host.
//!
//! One file over 500 lines: every read query of the PostgreSQL backend, as
//! the SQLite backend's, beside the connection and snapshot handling they use.
//!
//! This file holds the reads; `postgres/write.rs` the SQL the store's rules
//! (`store/rules.rs`) write through.

mod write;

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use postgres::types::ToSql;
use postgres::{Client, IsolationLevel, NoTls, Row, Transaction};

use super::host::hostname;
use super::pg_schema::{self, pg_err, LOCK_KEY, LOCK_SQL};
use super::rules::{self, WriteTx};
use super::{OpenMode, PatchHit, RevisionRecord, RunRecord, RunState, Store, StoreError};
use crate::results::review::{FirstBad, Review, ReviewKind, State, Transition};
use crate::results::{
    BuildResult, Environment, Measurement, PatchInfo, RevisionInfo, RevisionRef, Run, Status,
    TestResult, Timestamp, RESULTS_SCHEMA,
};
use write::PgTx;

pub struct PgStore {
    client: RefCell<Client>,
    /// The URL without its password, for messages.
    loc: PathBuf,
}

/// An error inside a transaction: SQL, or a refusal.
enum InTx {
    Sql(postgres::Error),
    Store(StoreError),
}

impl From<postgres::Error> for InTx {
    fn from(e: postgres::Error) -> InTx {
        InTx::Sql(e)
    }
}

impl From<StoreError> for InTx {
    fn from(e: StoreError) -> InTx {
        InTx::Store(e)
    }
}

type R<T> = Result<T, InTx>;

fn bad(loc: &Path, what: &'static str, detail: impl Into<String>) -> InTx {
    InTx::Store(StoreError::BadValue {
        path: loc.to_path_buf(),
        what,
        detail: detail.into(),
    })
}

fn u32_of(loc: &Path, what: &'static str, v: i64) -> R<u32> {
    u32::try_from(v).map_err(|_| bad(loc, what, v.to_string()))
}

fn status(loc: &Path, s: &str) -> R<Status> {
    Status::parse(s).ok_or_else(|| bad(loc, "status", s))
}

impl PgStore {
    /// Connect to the database at `url`, check it, migrate it, and recover
    /// runs interrupted on this host.
    pub fn open(url: &str, mode: OpenMode) -> Result<PgStore, StoreError> {
        let loc = PathBuf::from(pg_schema::redact(url));
        let config = pg_schema::config(url, &loc)?;
        let mut client = config.connect(NoTls).map_err(|e| pg_err(&loc, e))?;
        pg_schema::prepare(&mut client, &loc, mode)?;
        let mut store = PgStore {
            client: RefCell::new(client),
            loc,
        };
        store.recover()?;
        Ok(store)
    }

    /// The URL without its password.
    pub fn location(&self) -> &Path {
        &self.loc
    }

    fn map(&self, e: InTx) -> StoreError {
        match e {
            InTx::Sql(e) => pg_err(&self.loc, e),
            InTx::Store(e) => e,
        }
    }

    /// Run `f` in one write transaction holding the store's lock; commit
    /// only if it succeeds.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>, &Path) -> R<T>,
    ) -> Result<T, StoreError> {
        let mut client = self.client.borrow_mut();
        let run = || -> R<T> {
            let mut tx = client.transaction()?;
            tx.execute(LOCK_SQL, &[&LOCK_KEY])?;
            let v = f(&mut tx, &self.loc)?;
            tx.commit()?;
            Ok(v)
        };
        run().map_err(|e| self.map(e))
    }

    /// Run `f` in one read-only snapshot.
    fn read<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>, &Path) -> R<T>,
    ) -> Result<T, StoreError> {
        let mut client = self.client.borrow_mut();
        let run = || -> R<T> {
            let mut tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let v = f(&mut tx, &self.loc)?;
            tx.commit()?;
            Ok(v)
        };
        run().map_err(|e| self.map(e))
    }
}

fn resolve(tx: &mut Transaction<'_>, r: &RevisionRef) -> R<i64> {
    let rows = tx.query(
        "SELECT r.id FROM revisions r JOIN series s ON s.id = r.series_id
         WHERE (s.name = $1 OR r.change_id = $1) AND r.version = $2",
        &[&r.series, &i64::from(r.version)],
    )?;
    match rows.as_slice() {
        [one] => Ok(one.get(0)),
        [] => Err(StoreError::UnknownRevision(r.clone()).into()),
        _ => Err(StoreError::Ambiguous(r.clone()).into()),
    }
}

fn load_revision(tx: &mut Transaction<'_>, loc: &Path, id: i64) -> R<RevisionRecord> {
    let row = tx.query_one(
        "SELECT s.name, r.version, r.change_id,
                (SELECT tree FROM series_trees t WHERE t.series_id = s.id),
                r.message_id, r.patchset_hash, r.created
         FROM revisions r JOIN series s ON s.id = r.series_id WHERE r.id = $1",
        &[&id],
    )?;
    let mut patches = Vec::new();
    for p in tx.query(
        "SELECT position, subject, author, author_email, message_id, patch_id, file
         FROM patches WHERE revision_id = $1 ORDER BY position",
        &[&id],
    )? {
        patches.push(PatchInfo {
            position: u32_of(loc, "patch position", p.get(0))?,
            subject: p.get(1),
            author: p.get(2),
            author_email: p.get(3),
            message_id: p.get(4),
            patch_id: p.get(5),
            file: p.get(6),
        });
    }
    Ok(RevisionRecord {
        info: RevisionInfo {
            series: row.get(0),
            version: u32_of(loc, "revision version", row.get(1))?,
            change_id: row.get(2),
            tree: row.get(3),
            message_id: row.get(4),
            patchset_hash: row.get(5),
            patches,
        },
        created: Timestamp(row.get(6)),
    })
}

const RUNS_SQL: &str = "SELECT r.id, r.revision_id, r.base, e.environment, e.state, r.started,
        e.finished, r.reproducer, e.seq
    FROM runs r JOIN LATERAL (
        SELECT * FROM run_events e WHERE e.run_id = r.id ORDER BY e.seq DESC LIMIT 1
    ) e ON true";

fn load_runs(
    tx: &mut Transaction<'_>,
    loc: &Path,
    where_sql: &str,
    arg: &(dyn ToSql + Sync),
) -> R<Vec<RunRecord>> {
    let rows = tx.query(
        &format!("{RUNS_SQL} WHERE {where_sql} ORDER BY r.started, r.id"),
        &[arg],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let id: String = row.get(0);
        let env: String = row.get(3);
        let environment: Environment = serde_json::from_str(&env)
            .map_err(|e| bad(loc, "run environment", format!("run {id}: {e}")))?;
        let state: String = row.get(4);
        let state = RunState::parse(&state)
            .ok_or_else(|| bad(loc, "run state", format!("run {id}: {state:?}")))?;
        let revision = match row.get::<_, Option<i64>>(1) {
            Some(rid) => Some(load_revision(tx, loc, rid)?.info),
            None => None,
        };
        let mut run = Run {
            schema: RESULTS_SCHEMA,
            id,
            revision,
            base: row.get(2),
            environment,
            started: Timestamp(row.get(5)),
            finished: row.get::<_, Option<i64>>(6).map(Timestamp),
            reproducer: row.get(7),
            builds: vec![],
            tests: vec![],
            measurements: vec![],
        };
        load_results(tx, loc, &mut run, row.get(8))?;
        out.push(RunRecord { state, run });
    }
    Ok(out)
}

fn load_results(tx: &mut Transaction<'_>, loc: &Path, run: &mut Run, gen: i64) -> R<()> {
    let key: [&(dyn ToSql + Sync); 2] = [&run.id, &gen];
    for r in tx.query(
        "SELECT patch, variant, status, duration_s, warnings, new_warnings, log_path, log_excerpt
         FROM builds WHERE run_id = $1 AND gen = $2 ORDER BY seq",
        &key,
    )? {
        let nw: String = r.get(5);
        run.builds.push(BuildResult {
            patch: r
                .get::<_, Option<i64>>(0)
                .map(|p| u32_of(loc, "build patch", p))
                .transpose()?,
            variant: r.get(1),
            status: status(loc, r.get(2))?,
            duration_s: r.get(3),
            warnings: u32_of(loc, "build warnings", r.get(4))?,
            new_warnings: serde_json::from_str(&nw)
                .map_err(|x| bad(loc, "new_warnings", x.to_string()))?,
            log_path: r.get(6),
            log_excerpt: r.get(7),
        });
    }
    for r in tx.query(
        "SELECT path, variant, status, duration_s, log_path, log_excerpt, attempt
         FROM tests WHERE run_id = $1 AND gen = $2 ORDER BY seq",
        &key,
    )? {
        run.tests.push(TestResult {
            path: r.get(0),
            variant: r.get(1),
            status: status(loc, r.get(2))?,
            duration_s: r.get(3),
            log_path: r.get(4),
            log_excerpt: r.get(5),
            attempt: u32_of(loc, "test attempt", r.get(6))?,
        });
    }
    for r in tx.query(
        "SELECT name, variant, value, unit, samples, lower_is_better
         FROM measurements WHERE run_id = $1 AND gen = $2 ORDER BY seq",
        &key,
    )? {
        let samples: String = r.get(4);
        run.measurements.push(Measurement {
            name: r.get(0),
            variant: r.get(1),
            value: r.get(2),
            unit: r.get(3),
            samples: serde_json::from_str(&samples)
                .map_err(|x| bad(loc, "samples", x.to_string()))?,
            lower_is_better: r.get(5),
        });
    }
    Ok(())
}

impl PgStore {
    /// Run `f` under the store's rules in one write transaction.
    fn write_rules<T>(
        &self,
        f: impl FnOnce(&mut dyn WriteTx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write(|tx, loc| Ok(f(&mut PgTx { tx, loc })?))
    }
}

impl Store for PgStore {
    fn record_runs(&mut self, runs: &[Run]) -> Result<(), StoreError> {
        runs.iter().try_for_each(rules::check_run)?;
        self.write_rules(|tx| rules::record_runs(tx, runs))
    }

    fn begin_run(&mut self, run: &Run) -> Result<(), StoreError> {
        rules::check_run(run)?;
        self.write_rules(|tx| rules::begin_run(tx, run))
    }

    fn finish_run(&mut self, run: &Run) -> Result<(), StoreError> {
        rules::check_run(run)?;
        self.write_rules(|tx| rules::finish_run(tx, run))
    }

    fn recover(&mut self) -> Result<Vec<String>, StoreError> {
        let host = hostname();
        let running: Vec<(String, Option<i64>)> = self.read(|tx, _| {
            Ok(tx
                .query(
                    "SELECT r.id, r.pid FROM runs r JOIN LATERAL (
                         SELECT state FROM run_events e WHERE e.run_id = r.id ORDER BY e.seq DESC LIMIT 1
                     ) e ON true
                     WHERE e.state = 'running' AND r.host = $1",
                    &[&host],
                )?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })?;
        let dead = rules::dead_runs(running);
        if dead.is_empty() {
            return Ok(vec![]);
        }
        let now = Timestamp::now();
        self.write_rules(|tx| rules::record_interrupted(tx, &dead, now))
    }

    fn revisions(&self) -> Result<Vec<RevisionRecord>, StoreError> {
        self.read(|tx, loc| {
            let ids: Vec<i64> = tx
                .query(
                    "SELECT r.id FROM revisions r JOIN series s ON s.id = r.series_id
                     ORDER BY s.name, r.version",
                    &[],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            ids.into_iter()
                .map(|id| load_revision(tx, loc, id))
                .collect()
        })
    }

    fn revision(&self, r: &RevisionRef) -> Result<RevisionRecord, StoreError> {
        self.read(|tx, loc| {
            let id = resolve(tx, r)?;
            load_revision(tx, loc, id)
        })
    }

    fn runs(&self, r: &RevisionRef) -> Result<Vec<RunRecord>, StoreError> {
        self.read(|tx, loc| {
            let id = resolve(tx, r)?;
            load_runs(tx, loc, "r.revision_id = $1", &id)
        })
    }

    fn base_runs(&self, base: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.read(|tx, loc| load_runs(tx, loc, "r.revision_id IS NULL AND r.base = $1", &base))
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.read(|tx, loc| Ok(load_runs(tx, loc, "r.id = $1", &id)?.into_iter().next()))
    }

    fn find_patch(
        &self,
        message_id: Option<&str>,
        patch_id: Option<&str>,
    ) -> Result<Vec<PatchHit>, StoreError> {
        self.read(|tx, loc| {
            let rows: Vec<Row> = tx.query(
                "SELECT p.revision_id, p.position, coalesce(p.message_id = $1::text, false)
                 FROM patches p
                 WHERE ($1::text IS NOT NULL AND p.message_id = $1::text)
                    OR ($2::text IS NOT NULL AND p.patch_id = $2::text)
                 ORDER BY p.revision_id, p.position",
                &[&message_id, &patch_id],
            )?;
            let mut hits = Vec::with_capacity(rows.len());
            for row in rows {
                hits.push(PatchHit {
                    revision: load_revision(tx, loc, row.get(0))?.reference(),
                    position: u32_of(loc, "patch position", row.get(1))?,
                    by_message_id: row.get(2),
                });
            }
            Ok(hits)
        })
    }

    fn transitions(&self, r: &RevisionRef) -> Result<Vec<Transition>, StoreError> {
        self.read(|tx, loc| {
            let id = resolve(tx, r)?;
            tx.query(
                "SELECT at, state, reason FROM transitions WHERE revision_id = $1 ORDER BY seq",
                &[&id],
            )?
            .iter()
            .map(|row| {
                let state: String = row.get(1);
                Ok(Transition {
                    at: Timestamp(row.get(0)),
                    state: State::parse(&state).ok_or_else(|| bad(loc, "verdict state", state))?,
                    reason: row.get(2),
                })
            })
            .collect()
        })
    }

    fn append_transitions(
        &mut self,
        r: &RevisionRef,
        expected: usize,
        new: &[Transition],
    ) -> Result<(), StoreError> {
        self.write_rules(|tx| rules::append_transitions(tx, r, expected, new))
    }

    fn add_review(&mut self, r: &RevisionRef, review: &Review) -> Result<(), StoreError> {
        self.write_rules(|tx| rules::add_review(tx, r, review))
    }

    fn reviews(&self, r: &RevisionRef) -> Result<Vec<Review>, StoreError> {
        self.read(|tx, loc| {
            let id = resolve(tx, r)?;
            tx.query(
                "SELECT at, reviewer, kind, reason FROM reviews WHERE revision_id = $1 ORDER BY seq",
                &[&id],
            )?
            .iter()
            .map(|row| {
                let kind: String = row.get(2);
                Ok(Review {
                    at: Timestamp(row.get(0)),
                    by: row.get(1),
                    kind: ReviewKind::parse(&kind).ok_or_else(|| bad(loc, "review kind", kind))?,
                    reason: row.get(3),
                })
            })
            .collect()
        })
    }

    fn add_first_bad(&mut self, r: &RevisionRef, f: &FirstBad) -> Result<(), StoreError> {
        self.write_rules(|tx| rules::add_first_bad(tx, r, f))
    }

    fn first_bad(&self, r: &RevisionRef) -> Result<Vec<FirstBad>, StoreError> {
        self.read(|tx, loc| {
            let id = resolve(tx, r)?;
            tx.query(
                "SELECT at, check_path, variant, patch, how FROM first_bad
                 WHERE revision_id = $1 ORDER BY seq",
                &[&id],
            )?
            .iter()
            .map(|row| {
                let patch: i64 = row.get(3);
                Ok(FirstBad {
                    at: Timestamp(row.get(0)),
                    check: row.get(1),
                    variant: row.get(2),
                    patch: u32::try_from(patch)
                        .map_err(|_| bad(loc, "first bad patch", patch.to_string()))?,
                    how: row.get(4),
                })
            })
            .collect()
        })
    }

    fn generation(&self) -> Result<u64, StoreError> {
        self.read(|tx, _| {
            let n: i64 = tx
                .query_one(
                    "SELECT (SELECT count(*) FROM run_events) + (SELECT count(*) FROM transitions)
                          + (SELECT count(*) FROM reviews) + (SELECT count(*) FROM first_bad)",
                    &[],
                )?
                .get(0);
            Ok(n as u64)
        })
    }
}
