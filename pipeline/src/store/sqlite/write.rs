//! The SQL the store's rules write SQLite through: lookups and INSERTs.

use std::path::Path;

use rusqlite::{params, OptionalExtension, Transaction};

use super::super::rules::{self, EventEnv, Results, WriteTx};
use super::super::schema::sql_err;
use super::super::{RunState, StoreError};
use super::resolve;
use crate::results::review::{FirstBad, Review, Transition};
use crate::results::{RevisionInfo, RevisionRef, Run, Timestamp};

/// One SQLite write transaction, as the store's rules see it.
pub(super) struct SqlTx<'a> {
    pub tx: &'a Transaction<'a>,
    pub path: &'a Path,
}

impl SqlTx<'_> {
    fn err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |e| sql_err(self.path, e)
    }

    fn bad(&self, what: &'static str, detail: impl Into<String>) -> StoreError {
        StoreError::BadValue {
            path: self.path.to_path_buf(),
            what,
            detail: detail.into(),
        }
    }
}

impl WriteTx for SqlTx<'_> {
    fn last_event(&mut self, run: &str) -> Result<Option<(i64, RunState)>, StoreError> {
        let row: Option<(i64, String)> = self
            .tx
            .query_row(
                "SELECT seq, state FROM run_events WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1",
                [run],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.err())?;
        row.map(|(seq, state)| {
            RunState::parse(&state)
                .map(|s| (seq, s))
                .ok_or_else(|| self.bad("run state", format!("run {run}: {state:?}")))
        })
        .transpose()
    }

    fn series(&mut self, info: &RevisionInfo) -> Result<i64, StoreError> {
        let e = self.err();
        self.tx
            .execute(
                "INSERT INTO series (name, change_id) SELECT ?1, ?2
                 WHERE NOT EXISTS (SELECT 1 FROM series WHERE name = ?1)",
                params![info.series, info.change_id],
            )
            .map_err(&e)?;
        let id: i64 = self
            .tx
            .query_row(
                "SELECT id FROM series WHERE name = ?1",
                [&info.series],
                |r| r.get(0),
            )
            .map_err(&e)?;
        if let Some(tree) = &info.tree {
            self.tx
                .execute(
                    "INSERT INTO series_trees (series_id, tree) SELECT ?1, ?2
                     WHERE NOT EXISTS (SELECT 1 FROM series_trees WHERE series_id = ?1)",
                    params![id, tree],
                )
                .map_err(&e)?;
        }
        Ok(id)
    }

    fn find_revision(
        &mut self,
        series: i64,
        version: u32,
    ) -> Result<Option<(i64, String)>, StoreError> {
        self.tx
            .query_row(
                "SELECT id, patchset_hash FROM revisions WHERE series_id = ?1 AND version = ?2",
                params![series, version],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.err())
    }

    fn insert_revision(
        &mut self,
        series: i64,
        info: &RevisionInfo,
        created: Timestamp,
    ) -> Result<i64, StoreError> {
        let e = self.err();
        self.tx
            .execute(
                "INSERT INTO revisions (series_id, version, change_id, message_id, patchset_hash, created)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![series, info.version, info.change_id, info.message_id, info.patchset_hash, created.0],
            )
            .map_err(&e)?;
        let id = self.tx.last_insert_rowid();
        for p in &info.patches {
            self.tx
                .execute(
                    "INSERT INTO patches (revision_id, position, subject, author, author_email, message_id, patch_id, file)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    params![id, p.position, p.subject, p.author, p.author_email, p.message_id, p.patch_id, p.file],
                )
                .map_err(&e)?;
        }
        Ok(id)
    }

    fn insert_run(
        &mut self,
        run: &Run,
        revision: Option<i64>,
        pid: i64,
        host: &str,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO runs (id, revision_id, base, started, reproducer, pid, host)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    run.id,
                    revision,
                    run.base,
                    run.started.0,
                    run.reproducer,
                    pid,
                    host
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    fn insert_event(
        &mut self,
        run: &str,
        seq: i64,
        state: RunState,
        finished: Option<Timestamp>,
        env: &EventEnv,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO run_events (run_id, seq, state, finished, accelerator, environment)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    run,
                    seq,
                    state.name(),
                    finished.map(|t| t.0),
                    env.accelerator,
                    env.environment
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    fn insert_results(
        &mut self,
        run: &str,
        gen: i64,
        results: &Results<'_>,
    ) -> Result<(), StoreError> {
        let e = self.err();
        for (seq, b) in (0i64..).zip(results.builds) {
            self.tx.execute(
                "INSERT INTO builds (run_id, gen, seq, patch, variant, status, duration_s, warnings, new_warnings, log_path, log_excerpt)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![run, gen, seq, b.patch, b.variant, b.status.name(), b.duration_s, b.warnings,
                        rules::json(&b.new_warnings), b.log_path, b.log_excerpt],
            ).map_err(&e)?;
        }
        for (seq, t) in (0i64..).zip(results.tests) {
            self.tx.execute(
                "INSERT INTO tests (run_id, gen, seq, path, variant, status, duration_s, log_path, log_excerpt, attempt)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![run, gen, seq, t.path, t.variant, t.status.name(), t.duration_s, t.log_path,
                        t.log_excerpt, t.attempt],
            ).map_err(&e)?;
        }
        for (seq, m) in (0i64..).zip(results.measurements) {
            self.tx.execute(
                "INSERT INTO measurements (run_id, gen, seq, name, variant, value, unit, samples, lower_is_better)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![run, gen, seq, m.name, m.variant, m.value, m.unit, rules::json(&m.samples), m.lower_is_better],
            ).map_err(&e)?;
        }
        Ok(())
    }

    fn event_env(&mut self, run: &str, seq: i64) -> Result<(Timestamp, EventEnv), StoreError> {
        self.tx
            .query_row(
                "SELECT r.started, e.accelerator, e.environment
                 FROM runs r JOIN run_events e ON e.run_id = r.id AND e.seq = ?2
                 WHERE r.id = ?1",
                params![run, seq],
                |r| {
                    Ok((
                        Timestamp(r.get(0)?),
                        EventEnv {
                            accelerator: r.get(1)?,
                            environment: r.get(2)?,
                        },
                    ))
                },
            )
            .map_err(self.err())
    }

    fn resolve(&mut self, r: &RevisionRef) -> Result<i64, StoreError> {
        resolve(self.tx, self.path, r)
    }

    fn transition_stats(
        &mut self,
        revision: i64,
    ) -> Result<(usize, Option<Timestamp>), StoreError> {
        self.tx
            .query_row(
                "SELECT count(*), max(at) FROM transitions WHERE revision_id = ?1",
                [revision],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)? as usize,
                        r.get::<_, Option<i64>>(1)?.map(Timestamp),
                    ))
                },
            )
            .map_err(self.err())
    }

    fn insert_transition(
        &mut self,
        revision: i64,
        seq: i64,
        t: &Transition,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO transitions (revision_id, seq, at, state, reason) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![revision, seq, t.at.0, t.state.name(), t.reason],
            )
            .map_err(self.err())?;
        Ok(())
    }

    fn first_bad_count(&mut self, revision: i64) -> Result<i64, StoreError> {
        self.tx
            .query_row(
                "SELECT count(*) FROM first_bad WHERE revision_id = ?1",
                [revision],
                |r| r.get(0),
            )
            .map_err(self.err())
    }

    fn insert_first_bad(
        &mut self,
        revision: i64,
        seq: i64,
        f: &FirstBad,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO first_bad (revision_id, seq, at, check_path, variant, patch, how) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![revision, seq, f.at.0, f.check, f.variant, f.patch, f.how],
            )
            .map_err(self.err())?;
        Ok(())
    }

    fn patch_count(&mut self, revision: i64) -> Result<i64, StoreError> {
        self.tx
            .query_row(
                "SELECT count(*) FROM patches WHERE revision_id = ?1",
                [revision],
                |r| r.get(0),
            )
            .map_err(self.err())
    }

    fn review_count(&mut self, revision: i64) -> Result<i64, StoreError> {
        self.tx
            .query_row(
                "SELECT count(*) FROM reviews WHERE revision_id = ?1",
                [revision],
                |r| r.get(0),
            )
            .map_err(self.err())
    }

    fn insert_review(
        &mut self,
        revision: i64,
        seq: i64,
        review: &Review,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO reviews (revision_id, seq, at, by, kind, reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![revision, seq, review.at.0, review.by, review.kind.name(), review.reason],
            )
            .map_err(self.err())?;
        Ok(())
    }
}
