//! The store's guarantees, checked on every backend: each body below runs
//! once on SQLite (`store::tests::sqlite::…`) and once on PostgreSQL
//! (`store::tests::postgres::…`, skipped with a printed reason when
//! `PHYFARM_TEST_POSTGRES` is unset). Backend-specific checks follow.

use super::*;
use crate::results::fixture::{run, t, test};
use crate::results::review::{FirstBad, ReviewKind, State};
use crate::results::Status;

mod backend;
mod pg;
mod sqlite_only;

use backend::Backend;

fn run_round_trips_through_the_store(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    let mut r = run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    r.tests.push(crate::results::TestResult {
        attempt: 1,
        variant: Some("c".into()),
        ..test("farm.probe.ids", Status::Pass)
    });
    r.builds[0].new_warnings = vec!["drivers/net/phy/ax88796b.rs:1: warning: x".into()];
    r.measurements
        .push(crate::results::fixture::measurement(&[1.0, 2.5, 0.1]));
    st.record_run(&r).unwrap();
    let base = run("b1", None, "2026-05-31T00:00:00Z", "2026-05-31T01:00:00Z");
    st.record_run(&base).unwrap();
    let back = st.run("r1").unwrap().unwrap();
    assert_eq!(back.state, RunState::Complete);
    assert_eq!(back.run, r);
    let rev = st.revision(&"c-1/v1".parse().unwrap()).unwrap();
    assert_eq!(rev.reference().to_string(), "s/v1");
    assert_eq!(rev.created, t("2026-06-01T00:00:00Z"));
    assert_eq!(rev.info, r.revision.clone().unwrap());
    let bases = st.base_runs("linux 1").unwrap();
    assert_eq!(bases.len(), 1);
    assert_eq!(bases[0].run, base);
    assert!(st.base_runs("linux 2").unwrap().is_empty());
    assert!(st.run("nope").unwrap().is_none());
    let e = st.revision(&"s/v9".parse().unwrap()).unwrap_err();
    assert!(matches!(e, StoreError::UnknownRevision(_)), "{e}");
}

fn reopening_keeps_everything(b: &dyn Backend) {
    let r = run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    b.open(OpenMode::Create).unwrap().record_run(&r).unwrap();
    let before = b.fingerprint();
    let st = b.open(OpenMode::Existing).unwrap();
    assert_eq!(st.run("r1").unwrap().unwrap().run, r);
    assert_eq!(st.revisions().unwrap().len(), 1);
    drop(st);
    assert_eq!(b.fingerprint(), before, "opening again migrates nothing");
}

fn nothing_is_overwritten(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    let r = run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.record_run(&r).unwrap();
    let mut again = r.clone();
    again.tests[0].status = Status::Fail;
    let e = st.record_run(&again).unwrap_err();
    assert!(matches!(e, StoreError::DuplicateRun { .. }), "{e}");
    let e = st.begin_run(&again).unwrap_err();
    assert!(matches!(e, StoreError::DuplicateRun { .. }), "{e}");
    let e = st.finish_run(&again).unwrap_err();
    assert!(matches!(e, StoreError::DuplicateRun { .. }), "{e}");
    let mut changed = run(
        "r2",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    changed.revision.as_mut().unwrap().patchset_hash = "f".repeat(64);
    let e = st.record_run(&changed).unwrap_err();
    assert!(e.to_string().contains("needs a new version"), "{e}");
    assert!(
        st.run("r2").unwrap().is_none(),
        "a refused run leaves nothing"
    );
    assert_eq!(st.run("r1").unwrap().unwrap().run, r);
    let e = st.finish_run(&changed).unwrap_err();
    assert!(matches!(e, StoreError::NotBegun { .. }), "{e}");
}

fn runs_recorded_together_are_all_or_nothing(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    let v1 = run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.record_run(&v1).unwrap();
    let before = b.fingerprint();
    let base = run("b1", None, "2026-06-02T00:00:00Z", "2026-06-02T01:00:00Z");
    let mut changed = run(
        "r2",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    changed.revision.as_mut().unwrap().patchset_hash = "f".repeat(64);
    // The base goes first and is valid: the revision's refusal takes it back.
    let e = st
        .record_runs(&[base.clone(), changed.clone()])
        .unwrap_err();
    assert!(matches!(e, StoreError::RevisionChanged { .. }), "{e}");
    assert!(
        st.run("b1").unwrap().is_none(),
        "the base run was kept alone"
    );
    assert_eq!(b.fingerprint(), before, "a refused pair changed the store");
    // An invalid run is refused before any write.
    let mut bad = changed.clone();
    bad.id = "no spaces allowed".into();
    let e = st.record_runs(&[base.clone(), bad]).unwrap_err();
    assert!(matches!(e, StoreError::InvalidRun { .. }), "{e}");
    assert_eq!(b.fingerprint(), before);
    // Both valid: both recorded.
    let fine = run(
        "r2",
        Some(2),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    st.record_runs(&[base.clone(), fine.clone()]).unwrap();
    assert_eq!(st.run("b1").unwrap().unwrap().run, base);
    assert_eq!(st.run("r2").unwrap().unwrap().run, fine);
}

fn foreign_stores_are_refused_and_left_alone(b: &dyn Backend) {
    b.exec("CREATE TABLE mail (id INTEGER); INSERT INTO mail VALUES (1)");
    let before = b.fingerprint();
    for mode in [OpenMode::Create, OpenMode::Existing] {
        let e = b.open(mode).err().unwrap();
        assert!(matches!(e, StoreError::Foreign { .. }), "{e}");
        assert!(e.to_string().contains("tables mail"), "{e}");
    }
    assert_eq!(b.fingerprint(), before);
}

fn newer_schema_is_refused_naming_both_versions(b: &dyn Backend) {
    drop(b.open(OpenMode::Create).unwrap());
    b.set_schema_version(99);
    let before = b.fingerprint();
    let e = b.open(OpenMode::Existing).err().unwrap();
    let msg = e.to_string();
    let supported = b.supported_version();
    assert!(
        msg.contains("schema version 99") && msg.contains(&format!("({supported})")),
        "{msg}"
    );
    assert_eq!(b.fingerprint(), before);
}

fn a_missing_store_is_not_created_for_readers(b: &dyn Backend) {
    let before = b.fingerprint();
    let e = b.open(OpenMode::Existing).err().unwrap();
    assert!(matches!(e, StoreError::Missing { .. }), "{e}");
    assert_eq!(b.fingerprint(), before);
}

/// A pid that no process has: a child that has exited and been reaped.
fn dead_pid() -> i64 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    i64::from(pid)
}

fn an_interrupted_run_is_recorded_as_miss_and_others_are_untouched(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    let done = run(
        "done",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.record_run(&done).unwrap();
    let begun = run(
        "begun",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    st.begin_run(&begun).unwrap();
    let rec = st.run("begun").unwrap().unwrap();
    assert_eq!(rec.state, RunState::Running);
    assert!(rec.run.tests.is_empty(), "{:?}", rec.run.tests);
    // Our own process is alive: nothing to recover.
    assert!(st.recover().unwrap().is_empty());
    drop(st);
    b.exec(&format!(
        "UPDATE runs SET pid = {} WHERE id = 'begun'",
        dead_pid()
    ));
    let mut st = b.open(OpenMode::Existing).unwrap();
    let rec = st.run("begun").unwrap().unwrap();
    assert_eq!(rec.state, RunState::Interrupted);
    assert_eq!(rec.run.tests.len(), 1);
    assert_eq!(rec.run.tests[0].path, INTERRUPTED_PATH);
    assert_eq!(rec.run.tests[0].status, Status::Miss);
    assert!(rec.run.builds.is_empty());
    assert_eq!(st.run("done").unwrap().unwrap().run, done);
    assert!(st.recover().unwrap().is_empty(), "recovered only once");
    // The real results, if they come after all, replace the inference.
    st.finish_run(&begun).unwrap();
    let rec = st.run("begun").unwrap().unwrap();
    assert_eq!((rec.state, rec.run), (RunState::Complete, begun));
    assert_eq!(st.runs(&"s/v1".parse().unwrap()).unwrap().len(), 2);
}

fn two_writers_at_once_lose_nothing(b: &dyn Backend) {
    drop(b.open(OpenMode::Create).unwrap());
    let location = b.location();
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let location = location.clone();
            std::thread::spawn(move || {
                let mut st = open(&location, OpenMode::Existing).unwrap();
                for i in 0..20 {
                    let version = 1 + (i % 3);
                    let mut r = run(
                        &format!("w{w}-{i}"),
                        Some(version),
                        "2026-06-01T00:00:00Z",
                        "2026-06-01T00:10:00Z",
                    );
                    if i % 2 == 0 {
                        st.record_run(&r).unwrap();
                    } else {
                        st.begin_run(&r).unwrap();
                        r.tests.push(test("farm.link.up", Status::Fail));
                        st.finish_run(&r).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let st = b.open(OpenMode::Existing).unwrap();
    let runs: Vec<RunRecord> = (1..=3)
        .flat_map(|v| st.runs(&format!("s/v{v}").parse().unwrap()).unwrap())
        .collect();
    assert_eq!(runs.len(), 60);
    assert!(runs.iter().all(|r| r.state == RunState::Complete));
    let tests: usize = runs.iter().map(|r| r.run.tests.len()).sum();
    assert_eq!(tests, 60 + 30);
    assert_eq!(st.revisions().unwrap().len(), 3);
}

fn transitions_are_append_only_and_never_go_back(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    st.record_run(&run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    ))
    .unwrap();
    let r: RevisionRef = "s/v1".parse().unwrap();
    let tr = |at: &str, state| Transition {
        at: t(at),
        state,
        reason: "x".into(),
    };
    st.append_transitions(&r, 0, &[tr("2026-06-01T00:00:00Z", State::Testing)])
        .unwrap();
    let e = st
        .append_transitions(&r, 0, &[tr("2026-06-01T02:00:00Z", State::AwaitingReview)])
        .unwrap_err();
    assert!(matches!(e, StoreError::Conflict { .. }), "{e}");
    let e = st
        .append_transitions(&r, 1, &[tr("2026-05-01T00:00:00Z", State::AwaitingReview)])
        .unwrap_err();
    assert!(matches!(e, StoreError::TimeGoesBack { .. }), "{e}");
    let review = Review {
        at: t("2026-05-30T00:00:00Z"),
        by: "R".into(),
        kind: ReviewKind::Nack,
        reason: "no".into(),
    };
    assert!(st.add_review(&r, &review).is_err());
    assert_eq!(st.transitions(&r).unwrap().len(), 1);
    assert!(st.reviews(&r).unwrap().is_empty());
    let later = Review {
        at: t("2026-06-02T00:00:00Z"),
        ..review
    };
    st.add_review(&r, &later).unwrap();
    st.append_transitions(
        &r,
        1,
        &[tr("2026-06-02T00:00:00Z", State::ChangesRequested)],
    )
    .unwrap();
    assert_eq!(st.reviews(&r).unwrap(), vec![later]);
    let states: Vec<State> = st
        .transitions(&r)
        .unwrap()
        .iter()
        .map(|t| t.state)
        .collect();
    assert_eq!(states, [State::Testing, State::ChangesRequested]);
}

fn patches_are_found_by_message_id_or_patch_id(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    st.record_run(&run(
        "r1",
        Some(2),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    ))
    .unwrap();
    let hits = st.find_patch(Some("v2-1@example.org"), None).unwrap();
    assert_eq!(hits.len(), 1);
    assert!(hits[0].by_message_id);
    assert_eq!((hits[0].revision.version, hits[0].position), (2, 1));
    let pid = format!("{:040}", 2);
    let hits = st.find_patch(Some("unknown@x"), Some(&pid)).unwrap();
    assert_eq!(hits.len(), 1);
    assert!(!hits[0].by_message_id);
    assert!(st.find_patch(Some("unknown@x"), None).unwrap().is_empty());
    assert!(st.find_patch(None, None).unwrap().is_empty());
}

/// Assert that the store still holds every row of `seen` (and more rows
/// exactly when `grew`); then remember what it holds now.
fn only_appended(
    b: &dyn Backend,
    seen: &mut std::collections::BTreeSet<String>,
    what: &str,
    grew: bool,
) {
    let now = b.rows();
    let lost: Vec<&String> = seen.difference(&now).collect();
    assert!(lost.is_empty(), "{what} changed or removed rows: {lost:#?}");
    assert_eq!(now.len() > seen.len(), grew, "{what}");
    *seen = now;
}

/// Every write, taken or refused, leaves every row recorded before it as it
/// was: the store only appends (rerun, interruption and completion too).
fn every_write_only_appends(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    let mut seen = b.rows();
    let mut appended = |what: &str, grew: bool| only_appended(b, &mut seen, what, grew);
    let done = run(
        "done",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.record_run(&done).unwrap();
    appended("record_run", true);
    assert!(st.record_run(&done).is_err());
    let mut changed = run(
        "changed",
        Some(1),
        "2026-06-01T02:00:00Z",
        "2026-06-01T03:00:00Z",
    );
    changed.revision.as_mut().unwrap().patchset_hash = "f".repeat(64);
    assert!(st.record_run(&changed).is_err());
    appended("refused runs", false);
    let mut begun = run(
        "begun",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    st.begin_run(&begun).unwrap();
    appended("begin_run", true);
    drop(st);
    b.exec(&format!(
        "UPDATE runs SET pid = {} WHERE id = 'begun'",
        dead_pid()
    ));
    let mut seen = b.rows();
    let mut appended = |what: &str, grew: bool| only_appended(b, &mut seen, what, grew);
    let mut st = b.open(OpenMode::Existing).unwrap();
    assert_eq!(
        st.run("begun").unwrap().unwrap().state,
        RunState::Interrupted
    );
    appended("recovering an interrupted run", true);
    begun.tests.push(test("farm.link.up", Status::Fail));
    st.finish_run(&begun).unwrap();
    appended("finishing an interrupted run", true);
    assert_eq!(st.run("begun").unwrap().unwrap().run, begun);
    assert!(st.finish_run(&begun).is_err());
    appended("finishing it again", false);
    let r: RevisionRef = "s/v1".parse().unwrap();
    let tr = Transition {
        at: t("2026-06-02T02:00:00Z"),
        state: State::Testing,
        reason: "x".into(),
    };
    st.append_transitions(&r, 0, std::slice::from_ref(&tr))
        .unwrap();
    appended("append_transitions", true);
    let review = Review {
        at: t("2026-06-02T03:00:00Z"),
        by: "R".into(),
        kind: ReviewKind::Ack,
        reason: "ok".into(),
    };
    st.add_review(&r, &review).unwrap();
    appended("add_review", true);
    let early = Review {
        at: t("2026-06-01T00:00:00Z"),
        ..review
    };
    assert!(st.add_review(&r, &early).is_err());
    assert!(st.append_transitions(&r, 0, &[tr]).is_err());
    appended("refused verdict writes", false);
    assert_eq!(st.run("done").unwrap().unwrap().run, done);
}

/// The generation grows with every write that commits and with nothing
/// else, so readers can tell they saw one state of the store.
fn generation_grows_with_every_commit(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    let mut last = st.generation().unwrap();
    let mut grew = |st: &dyn Store, what: &str, grows: bool| {
        let now = st.generation().unwrap();
        assert_eq!(now > last, grows, "{what}: {last} -> {now}");
        assert!(now >= last, "{what}: {last} -> {now}");
        last = now;
    };
    let mut r = run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    st.begin_run(&r).unwrap();
    grew(&*st, "begin_run", true);
    st.finish_run(&r).unwrap();
    grew(&*st, "finish_run", true);
    assert!(st.finish_run(&r).is_err());
    assert!(st.record_run(&r).is_err());
    grew(&*st, "refused writes", false);
    r.id = "r2".into();
    st.record_run(&r).unwrap();
    grew(&*st, "record_run", true);
    let rev: RevisionRef = "s/v1".parse().unwrap();
    let at = t("2026-06-02T00:00:00Z");
    st.append_transitions(
        &rev,
        0,
        &[Transition {
            at,
            state: State::Testing,
            reason: "x".into(),
        }],
    )
    .unwrap();
    grew(&*st, "append_transitions", true);
    st.add_review(
        &rev,
        &Review {
            at,
            by: "R".into(),
            kind: ReviewKind::Ack,
            reason: "ok".into(),
        },
    )
    .unwrap();
    grew(&*st, "add_review", true);
    let _ = st.runs(&rev).unwrap();
    let _ = st.revisions().unwrap();
    grew(&*st, "reads", false);
    let again = b.open(OpenMode::Existing).unwrap();
    grew(&*again, "another connection", false);
}

fn first_bad_patches_are_checked_and_kept_in_order(b: &dyn Backend) {
    let mut st = b.open(OpenMode::Create).unwrap();
    st.record_run(&run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    ))
    .unwrap();
    let r: RevisionRef = "s/v1".parse().unwrap();
    let good = FirstBad {
        at: t("2026-06-01T02:00:00Z"),
        check: "farm.link_flap[plain]".into(),
        variant: Some("rust".into()),
        patch: 1,
        how: "1..1: FAIL FAIL".into(),
    };
    let before = st.generation().unwrap();
    for (bad, why) in [
        (
            FirstBad {
                patch: 2,
                ..good.clone()
            },
            "patch 2 is not one of its 1",
        ),
        (
            FirstBad {
                patch: 0,
                ..good.clone()
            },
            "patch 0",
        ),
        (
            FirstBad {
                check: "gate.clippy".into(),
                ..good.clone()
            },
            "not a farm check id",
        ),
        (
            FirstBad {
                variant: Some("go".into()),
                ..good.clone()
            },
            "not rust or c",
        ),
        (
            FirstBad {
                how: "x".repeat(5000),
                ..good.clone()
            },
            "longer than",
        ),
    ] {
        let e = st.add_first_bad(&r, &bad).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
    let e = st
        .add_first_bad(&"s/v9".parse().unwrap(), &good)
        .unwrap_err();
    assert!(matches!(e, StoreError::UnknownRevision(_)), "{e}");
    assert_eq!(st.generation().unwrap(), before, "a refusal writes nothing");
    st.add_first_bad(&r, &good).unwrap();
    let second = FirstBad {
        variant: None,
        how: String::new(),
        ..good.clone()
    };
    st.add_first_bad(&r, &second).unwrap();
    assert!(st.generation().unwrap() > before);
    drop(st);
    let st = b.open(OpenMode::Existing).unwrap();
    assert_eq!(st.first_bad(&r).unwrap(), vec![good, second]);
}

/// Each body as a test per backend.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(&super::backend::Sqlite::new());
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                if let Some(b) = super::backend::Postgres::new() {
                    super::$name(&b);
                }
            })*
        }
    };
}

on_every_backend!(
    run_round_trips_through_the_store,
    reopening_keeps_everything,
    nothing_is_overwritten,
    runs_recorded_together_are_all_or_nothing,
    foreign_stores_are_refused_and_left_alone,
    newer_schema_is_refused_naming_both_versions,
    a_missing_store_is_not_created_for_readers,
    an_interrupted_run_is_recorded_as_miss_and_others_are_untouched,
    two_writers_at_once_lose_nothing,
    transitions_are_append_only_and_never_go_back,
    patches_are_found_by_message_id_or_patch_id,
    every_write_only_appends,
    generation_grows_with_every_commit,
    first_bad_patches_are_checked_and_kept_in_order,
);

#[test]
fn corrupt_sqlite_files_are_refused_and_left_alone() {
    let b = backend::Sqlite::new();
    let p = b.path();
    std::fs::write(p, b"hello, not a database\n").unwrap();
    let e = SqliteStore::open(p, OpenMode::Create).err().unwrap();
    assert!(matches!(e, StoreError::Foreign { .. }), "{e}");
    assert_eq!(std::fs::read(p).unwrap(), b"hello, not a database\n");

    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend(vec![0xA5u8; 8192]);
    std::fs::write(p, &bytes).unwrap();
    let e = SqliteStore::open(p, OpenMode::Create).err().unwrap();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    assert_eq!(std::fs::read(p).unwrap(), bytes);
}

#[test]
fn other_backends_are_named_not_guessed() {
    let e = open(Path::new("mysql://db/phyfarm"), OpenMode::Existing)
        .err()
        .unwrap();
    assert!(matches!(e, StoreError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("mysql"), "{e}");
    assert!(is_postgres(Path::new("postgres://db/phyfarm")));
    assert!(is_postgres(Path::new("postgresql://u@db/phyfarm")));
    assert!(!is_postgres(Path::new(
        "/var/lib/postgresql/results.sqlite"
    )));
}
