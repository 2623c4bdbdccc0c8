//! What only the SQLite backend needs checking: with no roles to withhold
//! UPDATE and DELETE, triggers make the file append-only for every
//! connection, and a store written by an earlier phyfarm (schema version 1,
//! which updated runs in place) is migrated on open and keeps its runs.

use rusqlite::{params, Connection};

use super::backend::{Backend, Sqlite};
use crate::results::fixture::{measurement, run, t, test};
use crate::results::{Run, Status};
use crate::store::schema::{MIGRATIONS, RECORDED_TABLES};
use crate::store::{OpenMode, RunState, SqliteStore, Store, INTERRUPTED_PATH, SCHEMA_VERSION};

fn refused(c: &Connection, sql: &str) -> String {
    match c.execute_batch(sql) {
        Ok(()) => panic!("{sql}: accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_recorded_row_can_be_updated_or_deleted() {
    let b = Sqlite::new();
    let mut st = b.open(OpenMode::Create).unwrap();
    let done = run(
        "done",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    let mut r = done.clone();
    r.measurements.push(measurement(&[1.0]));
    st.record_run(&r).unwrap();
    let rev = "s/v1".parse().unwrap();
    st.append_transitions(
        &rev,
        0,
        &[crate::results::review::Transition {
            at: t("2026-06-01T02:00:00Z"),
            state: crate::results::review::State::Testing,
            reason: "x".into(),
        }],
    )
    .unwrap();
    st.add_review(
        &rev,
        &crate::results::review::Review {
            at: t("2026-06-01T03:00:00Z"),
            by: "R".into(),
            kind: crate::results::review::ReviewKind::Ack,
            reason: "ok".into(),
        },
    )
    .unwrap();
    st.add_first_bad(
        &rev,
        &crate::results::review::FirstBad {
            at: t("2026-06-01T03:00:00Z"),
            check: "farm.probe".into(),
            variant: Some("rust".into()),
            patch: 1,
            how: "1..1: FAIL FAIL".into(),
        },
    )
    .unwrap();
    drop(st);
    let before = b.rows();
    let c = Connection::open(b.path()).unwrap();
    for table in RECORDED_TABLES {
        let n: i64 = c
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap();
        assert!(n > 0, "{table} holds a row to protect");
        let e = refused(&c, &format!("UPDATE {table} SET rowid = rowid"));
        assert!(e.contains(&format!("{table} is append-only")), "{e}");
        let e = refused(&c, &format!("DELETE FROM {table}"));
        assert!(e.contains(&format!("{table} is append-only")), "{e}");
    }
    // INSERT OR REPLACE would delete the recorded row without a DELETE
    // trigger; an insert over a recorded key is refused first.
    for table in RECORDED_TABLES {
        let e = refused(
            &c,
            &format!("INSERT OR REPLACE INTO {table} SELECT * FROM {table} LIMIT 1"),
        );
        assert!(e.contains(&format!("{table} is append-only")), "{e}");
    }
    // An upsert that would rewrite a row is an UPDATE too.
    let e = refused(
        &c,
        "INSERT INTO series (name, change_id) VALUES ('s', 'other')
         ON CONFLICT (name) DO UPDATE SET change_id = excluded.change_id",
    );
    assert!(e.contains("append-only"), "{e}");
    // A second "complete" event would hide the stored results.
    let e = refused(
        &c,
        "INSERT INTO run_events (run_id, seq, state, finished, accelerator, environment)
         VALUES ('done', 1, 'complete', 0, 'tcg', '{}')",
    );
    assert!(e.contains("run lifecycle"), "{e}");
    let e = refused(
        &c,
        "INSERT INTO run_events (run_id, seq, state, finished, accelerator, environment)
         VALUES ('new', 0, 'interrupted', 0, 'tcg', '{}')",
    );
    assert!(e.contains("run lifecycle"), "{e}");
    drop(c);
    assert_eq!(b.rows(), before, "nothing changed");
    let st = b.open(OpenMode::Existing).unwrap();
    assert_eq!(st.run("done").unwrap().unwrap().run, r);
}

#[test]
fn results_join_only_the_latest_event_of_their_run() {
    let b = Sqlite::new();
    let mut st = b.open(OpenMode::Create).unwrap();
    let begun = run(
        "begun",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.begin_run(&begun).unwrap();
    st.finish_run(&begun).unwrap();
    drop(st);
    let c = Connection::open(b.path()).unwrap();
    let e = refused(
        &c,
        "INSERT INTO tests (run_id, gen, seq, path, status, log_excerpt, attempt)
         VALUES ('begun', 0, 0, 'farm.x', 'FAIL', '', 0)",
    );
    assert!(e.contains("latest event"), "{e}");
}

/// Record `run` as phyfarm with schema version 1 did.
fn record_v1(c: &Connection, r: &Run, state: &str, pid: i64, host: &str) {
    if let Some(info) = &r.revision {
        c.execute(
            "INSERT INTO series (name, change_id, tree) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO NOTHING",
            params![info.series, info.change_id, info.tree],
        )
        .unwrap();
        c.execute(
            "INSERT OR IGNORE INTO revisions (series_id, version, change_id, message_id, patchset_hash, created)
             SELECT id, ?2, ?3, ?4, ?5, ?6 FROM series WHERE name = ?1",
            params![info.series, info.version, info.change_id, info.message_id, info.patchset_hash, r.started.0],
        )
        .unwrap();
        for p in &info.patches {
            c.execute(
                "INSERT OR IGNORE INTO patches (revision_id, position, subject, author, author_email, message_id, patch_id, file)
                 SELECT r.id, ?3, ?4, ?5, ?6, ?7, ?8, ?9 FROM revisions r JOIN series s ON s.id = r.series_id
                 WHERE s.name = ?1 AND r.version = ?2",
                params![info.series, info.version, p.position, p.subject, p.author, p.author_email, p.message_id, p.patch_id, p.file],
            )
            .unwrap();
        }
    }
    c.execute(
        "INSERT INTO runs (id, revision_id, base, accelerator, environment, state, started, finished, reproducer, pid, host)
         VALUES (?1, (SELECT r.id FROM revisions r JOIN series s ON s.id = r.series_id
                      WHERE s.name = ?2 AND r.version = ?3),
                 ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            r.id,
            r.revision.as_ref().map(|i| i.series.clone()),
            r.revision.as_ref().map(|i| i.version),
            r.base,
            r.environment.accelerator,
            serde_json::to_string(&r.environment).unwrap(),
            state,
            r.started.0,
            r.finished.map(|t| t.0),
            r.reproducer,
            pid,
            host,
        ],
    )
    .unwrap();
    for (seq, b) in (0i64..).zip(&r.builds) {
        c.execute(
            "INSERT INTO builds (run_id, seq, patch, variant, status, duration_s, warnings, new_warnings, log_path, log_excerpt)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![r.id, seq, b.patch, b.variant, b.status.name(), b.duration_s, b.warnings,
                    serde_json::to_string(&b.new_warnings).unwrap(), b.log_path, b.log_excerpt],
        )
        .unwrap();
    }
    for (seq, x) in (0i64..).zip(&r.tests) {
        c.execute(
            "INSERT INTO tests (run_id, seq, path, variant, status, duration_s, log_path, log_excerpt, attempt)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![r.id, seq, x.path, x.variant, x.status.name(), x.duration_s, x.log_path,
                    x.log_excerpt, x.attempt],
        )
        .unwrap();
    }
    for (seq, m) in (0i64..).zip(&r.measurements) {
        c.execute(
            "INSERT INTO measurements (run_id, seq, name, variant, value, unit, samples, lower_is_better)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![r.id, seq, m.name, m.variant, m.value, m.unit,
                    serde_json::to_string(&m.samples).unwrap(), m.lower_is_better],
        )
        .unwrap();
    }
}

#[test]
fn a_version_1_store_is_migrated_on_open_and_keeps_its_runs() {
    let b = Sqlite::new();
    let c = Connection::open(b.path()).unwrap();
    c.execute_batch(MIGRATIONS[0]).unwrap();
    c.pragma_update(None, "application_id", crate::store::APPLICATION_ID)
        .unwrap();
    c.pragma_update(None, "user_version", 1).unwrap();
    let mut done = run(
        "done",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    done.measurements.push(measurement(&[1.0, 2.5]));
    done.builds[0].new_warnings = vec!["w".into()];
    record_v1(&c, &done, "complete", 0, "elsewhere");
    let base = run("base", None, "2026-05-31T00:00:00Z", "2026-05-31T01:00:00Z");
    record_v1(&c, &base, "complete", 0, "elsewhere");
    // Version 1 recorded an interruption by replacing the results with a MISS.
    let mut interrupted = run(
        "interrupted",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    interrupted.builds.clear();
    interrupted.tests = vec![test(INTERRUPTED_PATH, Status::Miss)];
    record_v1(&c, &interrupted, "interrupted", 0, "elsewhere");
    // Begun on another host: still running after the migration.
    let mut running = run(
        "running",
        Some(2),
        "2026-06-03T00:00:00Z",
        "2026-06-03T01:00:00Z",
    );
    running.builds.clear();
    running.tests.clear();
    record_v1(&c, &running, "running", 1, "another-host");
    drop(c);

    let mut st = SqliteStore::open(b.path(), OpenMode::Existing).unwrap();
    let c = Connection::open(b.path()).unwrap();
    let v: u32 = c
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let rec = st.run("done").unwrap().unwrap();
    assert_eq!((rec.state, &rec.run), (RunState::Complete, &done));
    assert_eq!(st.base_runs("linux 1").unwrap()[0].run, base);
    let rec = st.run("interrupted").unwrap().unwrap();
    assert_eq!((rec.state, &rec.run), (RunState::Interrupted, &interrupted));
    let rec = st.run("running").unwrap().unwrap();
    assert_eq!((rec.state, &rec.run), (RunState::Running, &running));
    let rev = st.revision(&"s/v1".parse().unwrap()).unwrap();
    assert_eq!(rev.info, done.revision.clone().unwrap());
    assert_eq!(rev.info.tree.as_deref(), Some("net-next"));

    // The migrated runs move on by appending, under the new triggers.
    let e = refused(&c, "UPDATE runs SET base = 'x'");
    assert!(e.contains("append-only"), "{e}");
    let mut late = interrupted.clone();
    late.builds = done.builds.clone();
    late.tests = vec![test("farm.link.up", Status::Fail)];
    st.finish_run(&late).unwrap();
    assert_eq!(st.run("interrupted").unwrap().unwrap().run, late);
    let mut finished = running.clone();
    finished.tests = vec![test("farm.link.up", Status::Pass)];
    st.finish_run(&finished).unwrap();
    assert_eq!(
        st.run("running").unwrap().unwrap().state,
        RunState::Complete
    );
    assert!(st.finish_run(&finished).is_err(), "complete is final");
    assert_eq!(st.runs(&"s/v1".parse().unwrap()).unwrap().len(), 2);
}
