//! What only the PostgreSQL backend promises: runners need nothing beyond
//! SELECT and INSERT, even those cannot change a finished run, migrations
//! need the owner, and passwords stay out of messages.

use super::backend::{self, Backend};
use crate::results::fixture::{run, test};
use crate::results::review::{Review, ReviewKind, State, Transition};
use crate::results::Status;
use crate::store::pg_schema::{pgpass_lookup, redact};
use crate::store::{open, OpenMode, RunState, StoreError};

/// A role with the grants containers/runner/README.md gives runners.
fn runner(b: &backend::Postgres) -> std::path::PathBuf {
    let role = b.role("runner", "runner-pw");
    b.exec(&format!(
        "GRANT USAGE ON SCHEMA {s} TO {role};
         GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA {s} TO {role};",
        s = b.schema()
    ));
    b.location_as(&role, "runner-pw")
}

#[test]
fn a_runner_role_with_select_and_insert_only_does_everything() {
    let Some(b) = backend::Postgres::new() else {
        return;
    };
    drop(b.open(OpenMode::Create).unwrap());
    let loc = runner(&b);
    let mut st = open(&loc, OpenMode::Existing).unwrap();
    let done = run(
        "done",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.record_run(&done).unwrap();
    let mut later = run(
        "later",
        Some(2),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    st.begin_run(&later).unwrap();
    drop(st);
    b.exec("UPDATE runs SET pid = 0 WHERE id = 'later'");
    // Reopening as the runner recovers the dead run with INSERTs alone.
    let mut st = open(&loc, OpenMode::Existing).unwrap();
    assert_eq!(
        st.run("later").unwrap().unwrap().state,
        RunState::Interrupted
    );
    later.tests.push(test("farm.link.up", Status::Fail));
    st.finish_run(&later).unwrap();
    assert_eq!(st.run("later").unwrap().unwrap().run, later);
    let r = "s/v1".parse().unwrap();
    let at = done.finished.unwrap();
    st.append_transitions(
        &r,
        0,
        &[Transition {
            at,
            state: State::Testing,
            reason: "x".into(),
        }],
    )
    .unwrap();
    st.add_review(
        &r,
        &Review {
            at,
            by: "R".into(),
            kind: ReviewKind::Ack,
            reason: "ok".into(),
        },
    )
    .unwrap();
    assert_eq!(st.run("done").unwrap().unwrap().run, done);
}

#[test]
fn even_a_runner_role_cannot_change_a_finished_run() {
    let Some(b) = backend::Postgres::new() else {
        return;
    };
    let mut st = b.open(OpenMode::Create).unwrap();
    let done = run(
        "done",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.record_run(&done).unwrap();
    drop(st);
    let loc = runner(&b);
    let url = loc.to_str().unwrap();
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    for sql in [
        "UPDATE tests SET status = 'FAIL'",
        "DELETE FROM tests",
        "UPDATE runs SET base = 'x'",
        "TRUNCATE transitions",
        "DROP TABLE reviews",
        // A second "complete" event would hide the stored results.
        "INSERT INTO run_events (run_id, seq, state, finished, accelerator, environment, txid)
         VALUES ('done', 1, 'complete', 0, 'tcg', '{}', 0)",
        // Results may only join the transaction that wrote their event.
        "INSERT INTO tests (run_id, gen, seq, path, status, log_excerpt, attempt)
         VALUES ('done', 0, 9, 'farm.x', 'FAIL', '', 0)",
    ] {
        let e = c.batch_execute(sql).unwrap_err();
        assert!(e.code().is_some(), "{sql}: {e}");
    }
    drop(c);
    let st = b.open(OpenMode::Existing).unwrap();
    assert_eq!(st.run("done").unwrap().unwrap().run, done);
}

#[test]
fn a_runner_role_may_not_migrate() {
    let Some(b) = backend::Postgres::new() else {
        return;
    };
    let loc = runner(&b);
    let e = open(&loc, OpenMode::Create).err().unwrap();
    assert!(matches!(e, StoreError::MigrationDenied { .. }), "{e}");
    assert!(e.to_string().contains("owner role"), "{e}");
    assert_eq!(b.fingerprint(), "", "nothing was created");
}

#[test]
fn an_empty_version_table_is_corrupt_not_foreign() {
    let Some(b) = backend::Postgres::new() else {
        return;
    };
    drop(b.open(OpenMode::Create).unwrap());
    b.exec("DELETE FROM phyfarm_schema");
    let e = b.open(OpenMode::Existing).err().unwrap();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
}

#[test]
fn passwords_stay_out_of_messages() {
    let Some(b) = backend::Postgres::new() else {
        return;
    };
    let loc = b.location_as("nobody", "s3cret-pw");
    let e = open(&loc, OpenMode::Existing).err().unwrap();
    let msg = e.to_string();
    assert!(!msg.contains("s3cret-pw"), "{msg}");
    assert!(msg.contains("nobody:***@"), "{msg}");
    assert!(msg.contains("password authentication failed"), "{msg}");
}

#[test]
fn tls_modes_are_refused_by_name_without_connecting() {
    let e = open(
        std::path::Path::new("postgresql://u:pw@127.0.0.1:1/db?sslmode=verify-full"),
        OpenMode::Existing,
    )
    .err()
    .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("sslmode=verify-full") && msg.contains("ssh tunnel"),
        "{msg}"
    );
    assert!(!msg.contains(":pw@"), "{msg}");
}

#[test]
fn urls_lose_their_passwords() {
    assert_eq!(
        redact("postgresql://run:pw@db:5432/phyfarm?sslmode=disable"),
        "postgresql://run:***@db:5432/phyfarm?sslmode=disable"
    );
    assert_eq!(redact("postgres://run@db/p"), "postgres://run@db/p");
    assert_eq!(
        redact("postgres://db/p?user=u&password=x&a=b"),
        "postgres://db/p?user=u&password=***&a=b"
    );
    assert_eq!(
        crate::store::display_location(std::path::Path::new("/tmp/r.sqlite")),
        "/tmp/r.sqlite"
    );
}

#[test]
fn pgpass_lines_match_as_libpq_reads_them() {
    let text = "# comment\n\
                other:5432:*:run:wrong\n\
                db\\:x:5432:phyfarm:run:a\\:b\\\\c\n\
                *:*:*:run:fallback\n";
    assert_eq!(
        pgpass_lookup(text, ["db:x", "5432", "phyfarm", "run"]).as_deref(),
        Some("a:b\\c")
    );
    assert_eq!(
        pgpass_lookup(text, ["db", "6000", "x", "run"]).as_deref(),
        Some("fallback")
    );
    assert_eq!(pgpass_lookup(text, ["db", "5432", "x", "other"]), None);
}
