//! The SQL the store's rules write PostgreSQL through: lookups and INSERTs,
//! in one transaction holding the store's lock.

use std::path::Path;

use postgres::types::ToSql;
use postgres::Transaction;

use super::super::pg_schema::pg_err;
use super::super::rules::{self, EventEnv, Results, WriteTx};
use super::super::{RunState, StoreError};
use super::{bad, resolve, InTx};
use crate::results::review::{FirstBad, Review, Transition};
use crate::results::{RevisionInfo, RevisionRef, Run, Timestamp};

/// One PostgreSQL write transaction, holding the store's lock, as the
/// store's rules see it.
pub(super) struct PgTx<'a, 'b> {
    pub tx: &'a mut Transaction<'b>,
    pub loc: &'a Path,
}

impl<'a> PgTx<'a, '_> {
    fn err(&self) -> impl Fn(postgres::Error) -> StoreError + 'a {
        let loc = self.loc;
        move |e| pg_err(loc, e)
    }

    fn exec(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<(), StoreError> {
        self.tx
            .execute(sql, params)
            .map(drop)
            .map_err(|e| pg_err(self.loc, e))
    }
}

/// A refusal as it is, anything else as a store error.
fn store_err(loc: &Path, e: InTx) -> StoreError {
    match e {
        InTx::Sql(e) => pg_err(loc, e),
        InTx::Store(e) => e,
    }
}

impl WriteTx for PgTx<'_, '_> {
    fn last_event(&mut self, run: &str) -> Result<Option<(i64, RunState)>, StoreError> {
        let row = self
            .tx
            .query_opt(
                "SELECT seq, state FROM run_events WHERE run_id = $1 ORDER BY seq DESC LIMIT 1",
                &[&run],
            )
            .map_err(self.err())?;
        row.map(|r| {
            let state: String = r.get(1);
            RunState::parse(&state)
                .map(|s| (r.get(0), s))
                .ok_or_else(|| {
                    store_err(
                        self.loc,
                        bad(self.loc, "run state", format!("run {run}: {state:?}")),
                    )
                })
        })
        .transpose()
    }

    fn series(&mut self, info: &RevisionInfo) -> Result<i64, StoreError> {
        self.exec(
            "INSERT INTO series (name, change_id) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            &[&info.series, &info.change_id],
        )?;
        let id: i64 = self
            .tx
            .query_one("SELECT id FROM series WHERE name = $1", &[&info.series])
            .map_err(self.err())?
            .get(0);
        if let Some(tree) = &info.tree {
            self.exec(
                "INSERT INTO series_trees (series_id, tree) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&id, tree],
            )?;
        }
        Ok(id)
    }

    fn find_revision(
        &mut self,
        series: i64,
        version: u32,
    ) -> Result<Option<(i64, String)>, StoreError> {
        Ok(self
            .tx
            .query_opt(
                "SELECT id, patchset_hash FROM revisions WHERE series_id = $1 AND version = $2",
                &[&series, &i64::from(version)],
            )
            .map_err(self.err())?
            .map(|row| (row.get(0), row.get(1))))
    }

    fn insert_revision(
        &mut self,
        series: i64,
        info: &RevisionInfo,
        created: Timestamp,
    ) -> Result<i64, StoreError> {
        let id: i64 = self
            .tx
            .query_one(
                "INSERT INTO revisions (series_id, version, change_id, message_id, patchset_hash, created)
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                &[&series, &i64::from(info.version), &info.change_id, &info.message_id, &info.patchset_hash, &created.0],
            )
            .map_err(self.err())?
            .get(0);
        for p in &info.patches {
            self.exec(
                "INSERT INTO patches (revision_id, position, subject, author, author_email, message_id, patch_id, file)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                &[&id, &i64::from(p.position), &p.subject, &p.author, &p.author_email, &p.message_id, &p.patch_id, &p.file],
            )?;
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
        self.exec(
            "INSERT INTO runs (id, revision_id, base, started, reproducer, pid, host)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &run.id,
                &revision,
                &run.base,
                &run.started.0,
                &run.reproducer,
                &pid,
                &host,
            ],
        )
    }

    fn insert_event(
        &mut self,
        run: &str,
        seq: i64,
        state: RunState,
        finished: Option<Timestamp>,
        env: &EventEnv,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO run_events (run_id, seq, state, finished, accelerator, environment, txid)
             VALUES ($1, $2, $3, $4, $5, $6, 0)",
            &[
                &run,
                &seq,
                &state.name(),
                &finished.map(|t| t.0),
                &env.accelerator,
                &env.environment,
            ],
        )
    }

    fn insert_results(
        &mut self,
        run: &str,
        gen: i64,
        results: &Results<'_>,
    ) -> Result<(), StoreError> {
        for (seq, b) in (0i64..).zip(results.builds) {
            self.exec(
                "INSERT INTO builds (run_id, gen, seq, patch, variant, status, duration_s, warnings, new_warnings, log_path, log_excerpt)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                &[&run, &gen, &seq, &b.patch.map(i64::from), &b.variant, &b.status.name(), &b.duration_s,
                  &i64::from(b.warnings), &rules::json(&b.new_warnings), &b.log_path, &b.log_excerpt],
            )?;
        }
        for (seq, t) in (0i64..).zip(results.tests) {
            self.exec(
                "INSERT INTO tests (run_id, gen, seq, path, variant, status, duration_s, log_path, log_excerpt, attempt)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                &[&run, &gen, &seq, &t.path, &t.variant, &t.status.name(), &t.duration_s, &t.log_path,
                  &t.log_excerpt, &i64::from(t.attempt)],
            )?;
        }
        for (seq, m) in (0i64..).zip(results.measurements) {
            self.exec(
                "INSERT INTO measurements (run_id, gen, seq, name, variant, value, unit, samples, lower_is_better)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[&run, &gen, &seq, &m.name, &m.variant, &m.value, &m.unit, &rules::json(&m.samples), &m.lower_is_better],
            )?;
        }
        Ok(())
    }

    fn event_env(&mut self, run: &str, seq: i64) -> Result<(Timestamp, EventEnv), StoreError> {
        let row = self
            .tx
            .query_one(
                "SELECT r.started, e.accelerator, e.environment
                 FROM runs r JOIN run_events e ON e.run_id = r.id AND e.seq = $2
                 WHERE r.id = $1",
                &[&run, &seq],
            )
            .map_err(self.err())?;
        Ok((
            Timestamp(row.get(0)),
            EventEnv {
                accelerator: row.get(1),
                environment: row.get(2),
            },
        ))
    }

    fn resolve(&mut self, r: &RevisionRef) -> Result<i64, StoreError> {
        resolve(self.tx, r).map_err(|e| store_err(self.loc, e))
    }

    fn transition_stats(
        &mut self,
        revision: i64,
    ) -> Result<(usize, Option<Timestamp>), StoreError> {
        let row = self
            .tx
            .query_one(
                "SELECT count(*), max(at) FROM transitions WHERE revision_id = $1",
                &[&revision],
            )
            .map_err(self.err())?;
        Ok((
            row.get::<_, i64>(0) as usize,
            row.get::<_, Option<i64>>(1).map(Timestamp),
        ))
    }

    fn insert_transition(
        &mut self,
        revision: i64,
        seq: i64,
        t: &Transition,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO transitions (revision_id, seq, at, state, reason)
             VALUES ($1, $2, $3, $4, $5)",
            &[&revision, &seq, &t.at.0, &t.state.name(), &t.reason],
        )
    }

    fn first_bad_count(&mut self, revision: i64) -> Result<i64, StoreError> {
        Ok(self
            .tx
            .query_one(
                "SELECT count(*) FROM first_bad WHERE revision_id = $1",
                &[&revision],
            )
            .map_err(self.err())?
            .get(0))
    }

    fn insert_first_bad(
        &mut self,
        revision: i64,
        seq: i64,
        f: &FirstBad,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO first_bad (revision_id, seq, at, check_path, variant, patch, how)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &revision,
                &seq,
                &f.at.0,
                &f.check,
                &f.variant,
                &i64::from(f.patch),
                &f.how,
            ],
        )
    }

    fn patch_count(&mut self, revision: i64) -> Result<i64, StoreError> {
        Ok(self
            .tx
            .query_one(
                "SELECT count(*) FROM patches WHERE revision_id = $1",
                &[&revision],
            )
            .map_err(self.err())?
            .get(0))
    }

    fn review_count(&mut self, revision: i64) -> Result<i64, StoreError> {
        Ok(self
            .tx
            .query_one(
                "SELECT count(*) FROM reviews WHERE revision_id = $1",
                &[&revision],
            )
            .map_err(self.err())?
            .get(0))
    }

    fn insert_review(
        &mut self,
        revision: i64,
        seq: i64,
        review: &Review,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO reviews (revision_id, seq, at, reviewer, kind, reason)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &revision,
                &seq,
                &review.at.0,
                &review.by,
                &review.kind.name(),
                &review.reason,
            ],
        )
    }
}
