//! One named test per way the verdict once went wrong on schema-valid
//! runs: each history here gave a wrong state or a silent pass before the
//! rules of `compare.rs` and `clock.rs` took their present form, and the
//! generated histories of `properties.rs` hold the same rules in general.

use super::*;
use crate::results::fixture::{measurement, run, t, test};
use crate::results::{Status, TestResult};
use crate::store::{OpenMode, SqliteStore};

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let st = SqliteStore::open(&dir.path().join("r.sqlite"), OpenMode::Create).unwrap();
    (dir, st)
}

fn rev() -> RevisionRef {
    "s/v1".parse().unwrap()
}

fn attempt(path: &str, status: Status, attempt: u32, excerpt: &str) -> TestResult {
    TestResult {
        attempt,
        log_excerpt: excerpt.into(),
        ..test(path, status)
    }
}

const HANG: &str = "ERROR in call: phyfarm_farm.errors.GuestTimeout: the guest agent did not answer ethtool eth0 within 40s\nblocked in kworker/0:2 in _RNvXs_13ax88796b_rust11read_status\n[ 42.1] sysrq: Show Blocked State";
const EMU_DIED: &str =
    "ERROR in call: phyfarm_farm.errors.EmulatorDied: ax88772-emu exited with 101";

/// A base run in which `path` passed (and throughput has five samples).
fn base_with(path: &str, status: Status, excerpt: &str) -> crate::results::Run {
    let mut b = run("base", None, "2026-06-01T00:00:00Z", "2026-06-01T01:00:00Z");
    b.tests.push(attempt(path, status, 0, excerpt));
    b
}

fn state_at(st: &mut SqliteStore, at: &str) -> Report {
    advance(st, &rev(), t(at)).unwrap()
}

#[test]
fn a_failure_confirmed_by_its_retry_in_the_latest_run_is_not_hidden_by_an_earlier_pass() {
    let (_d, mut st) = store();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    r1.tests.push(test("farm.speed_duplex", Status::Pass));
    let mut r2 = run(
        "r2",
        Some(1),
        "2026-06-02T02:00:00Z",
        "2026-06-02T03:00:00Z",
    );
    r2.tests.extend([
        attempt("farm.speed_duplex", Status::Fail, 0, "FAIL: 10 Mbit/s"),
        attempt("farm.speed_duplex", Status::Fail, 1, "FAIL: 10 Mbit/s"),
    ]);
    st.record_run(&r1).unwrap();
    st.record_run(&r2).unwrap();
    let r = state_at(&mut st, "2026-06-06T00:00:00Z");
    assert_eq!(r.state, Some(State::ChangesRequested), "{}", r.reason);
    let c = r
        .checks
        .iter()
        .find(|(k, _)| k.path == "farm.speed_duplex")
        .unwrap()
        .1;
    assert_eq!((c.status, c.flaky.as_deref()), (Status::Fail, None));
}

#[test]
fn error_twice_after_a_pass_is_no_flake_and_keeps_the_revision_testing() {
    let (_d, mut st) = store();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    r1.tests.push(test("farm.replug", Status::Pass));
    let mut r2 = run(
        "r2",
        Some(1),
        "2026-06-02T02:00:00Z",
        "2026-06-02T03:00:00Z",
    );
    r2.tests.extend([
        attempt("farm.replug", Status::Error, 0, EMU_DIED),
        attempt("farm.replug", Status::Error, 1, EMU_DIED),
    ]);
    st.record_run(&r1).unwrap();
    st.record_run(&r2).unwrap();
    let r = state_at(&mut st, "2026-06-06T00:00:00Z");
    assert_eq!(r.state, Some(State::Testing), "{}", r.reason);
    assert_eq!(r.flaky().count(), 0);
    // ERROR then PASS within a run is a pass, and no flake either.
    let mut r3 = run(
        "r3",
        Some(1),
        "2026-06-06T01:00:00Z",
        "2026-06-06T02:00:00Z",
    );
    r3.tests.extend([
        attempt("farm.replug", Status::Error, 0, EMU_DIED),
        attempt("farm.replug", Status::Pass, 1, ""),
    ]);
    st.record_run(&r3).unwrap();
    let r = state_at(&mut st, "2026-06-06T03:00:00Z");
    assert_eq!(r.state, Some(State::AwaitingReview), "{}", r.reason);
    assert_eq!(r.flaky().count(), 0);
}

#[test]
fn an_ack_given_before_a_flake_appears_does_not_release_it() {
    let (_d, mut st) = store();
    let r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    st.record_run(&r1).unwrap();
    review(
        &mut st,
        &rev(),
        &Review {
            at: t("2026-06-02T01:30:00Z"),
            by: "maintainer".into(),
            kind: ReviewKind::Ack,
            reason: "LGTM".into(),
        },
    )
    .unwrap();
    let mut r2 = run(
        "r2",
        Some(1),
        "2026-06-02T02:00:00Z",
        "2026-06-02T03:00:00Z",
    );
    r2.tests.extend([
        attempt(
            "farm.link_flap[plain]",
            Status::Fail,
            0,
            "FAIL: flap 3: carrier still up after 5 s",
        ),
        attempt("farm.link_flap[plain]", Status::Pass, 1, ""),
    ]);
    st.record_run(&r2).unwrap();
    let r = state_at(&mut st, "2026-06-09T00:00:00Z");
    assert_eq!(r.state, Some(State::AwaitingReview), "{}", r.reason);
    assert!(r.reason.contains("held by flaky checks"), "{}", r.reason);
    // The flaky line carries what the failing attempt said.
    let text = render_text(&r);
    assert!(
        text.contains("(the failing attempt: FAIL: flap 3: carrier still up after 5 s)"),
        "{text}"
    );
    // An ack after the flake releases it.
    review(
        &mut st,
        &rev(),
        &Review {
            at: t("2026-06-09T01:00:00Z"),
            by: "maintainer".into(),
            kind: ReviewKind::Ack,
            reason: "the flake is the farm's".into(),
        },
    )
    .unwrap();
    let r = state_at(&mut st, "2026-06-09T02:00:00Z");
    assert_eq!(r.state, Some(State::ReadyToMerge), "{}", r.reason);
}

#[test]
fn farm_checks_that_all_skip_are_no_evidence_and_never_ready() {
    let (_d, mut st) = store();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    // Every farm check SKIPs, each saying it does not apply.
    r1.tests = ["farm.probe", "farm.throughput", "farm.link_flap[plain]"]
        .iter()
        .map(|p| attempt(p, Status::Skip, 0, "not applicable: no adapter"))
        .collect();
    st.record_run(&r1).unwrap();
    let r = state_at(&mut st, "2026-06-09T00:00:00Z");
    assert_eq!(r.state, Some(State::Testing), "{}", r.reason);
    assert!(
        r.reason.contains("none of the 3 farm checks passed"),
        "{}",
        r.reason
    );
}

fn throughput_run(
    id: &str,
    version: Option<u32>,
    start: &str,
    end: &str,
    samples: &[f64],
) -> crate::results::Run {
    let mut r = run(id, version, start, end);
    r.tests.push(test("farm.throughput", Status::Pass));
    r.measurements.push(measurement(samples));
    r
}

#[test]
fn too_few_throughput_samples_are_miss_never_a_pass() {
    let base = [100.0, 101.0, 99.0, 100.5, 99.5];
    for (samples, n) in [(&[53.0, 53.5][..], 2), (&[10.0][..], 1)] {
        let (_d, mut st) = store();
        st.record_run(&throughput_run(
            "b",
            None,
            "2026-06-01T00:00:00Z",
            "2026-06-01T01:00:00Z",
            &base,
        ))
        .unwrap();
        st.record_run(&throughput_run(
            "r",
            Some(1),
            "2026-06-02T00:00:00Z",
            "2026-06-02T01:00:00Z",
            samples,
        ))
        .unwrap();
        let r = state_at(&mut st, "2026-06-09T00:00:00Z");
        assert_eq!(r.state, Some(State::Testing), "{}", r.reason);
        let miss = r
            .vs_base
            .iter()
            .find(|f| f.kind == FindingKind::Incomplete)
            .unwrap();
        assert_eq!(
            miss.detail,
            format!("MISS: too few samples: tcp_tx {n} < 5 on the revision")
        );
    }
    // No base samples at all: no comparison, no pass.
    let (_d, mut st) = store();
    st.record_run(&run(
        "b",
        None,
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    ))
    .unwrap();
    st.record_run(&throughput_run(
        "r",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
        &base,
    ))
    .unwrap();
    let r = state_at(&mut st, "2026-06-09T00:00:00Z");
    assert_eq!(r.state, Some(State::Testing), "{}", r.reason);
    assert!(r.reason.contains("farm.throughput"), "{}", r.reason);
}

#[test]
fn a_ten_percent_throughput_loss_is_a_regression_and_requests_changes() {
    let (_d, mut st) = store();
    let base = [94.1, 94.6, 93.9, 94.4, 94.2, 94.5];
    let slow: Vec<f64> = base.iter().map(|x| x * 0.9).collect();
    st.record_run(&throughput_run(
        "b",
        None,
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
        &base,
    ))
    .unwrap();
    st.record_run(&throughput_run(
        "r",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
        &slow,
    ))
    .unwrap();
    let r = state_at(&mut st, "2026-06-09T00:00:00Z");
    assert_eq!(r.state, Some(State::ChangesRequested), "{}", r.reason);
    let f = r
        .vs_base
        .iter()
        .find(|f| f.kind == FindingKind::NewFailure)
        .unwrap();
    assert!(
        f.detail.starts_with(
            "throughput regression vs base: tcp_tx -10.0 % (p = 0.0011, 6 vs 6 samples)"
        ),
        "{}",
        f.detail
    );
}

#[test]
fn a_guest_that_stops_answering_only_on_the_revision_is_the_revisions_fail() {
    let (_d, mut st) = store();
    st.record_run(&base_with("farm.probe", Status::Pass, ""))
        .unwrap();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    r1.tests.extend([
        attempt("farm.probe", Status::Error, 0, HANG),
        attempt("farm.probe", Status::Error, 1, HANG),
    ]);
    st.record_run(&r1).unwrap();
    let r = state_at(&mut st, "2026-06-03T00:00:00Z");
    assert_eq!(r.state, Some(State::ChangesRequested), "{}", r.reason);
    let f = r
        .vs_base
        .iter()
        .find(|f| f.check.path == "farm.probe")
        .unwrap();
    assert_eq!(
        (f.kind, f.status, f.detail.as_str()),
        (
            FindingKind::NewFailure,
            Status::Fail,
            "FAIL: guest stopped answering (revision only; the base passed); blocked: kworker/0:2 in _RNvXs_13ax88796b_rust11read_status"
        )
    );
}

#[test]
fn a_hang_the_base_shares_or_a_dead_emulator_stays_error() {
    // The base hangs too: not the series' doing.
    let (_d, mut st) = store();
    st.record_run(&base_with("farm.probe", Status::Error, HANG))
        .unwrap();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    r1.tests.extend([
        attempt("farm.probe", Status::Error, 0, HANG),
        attempt("farm.probe", Status::Error, 1, HANG),
    ]);
    st.record_run(&r1).unwrap();
    let r = state_at(&mut st, "2026-06-03T00:00:00Z");
    assert_eq!(r.state, Some(State::Testing), "{}", r.reason);

    // The emulator died on both attempts while the base passed: the farm's
    // trouble, never a FAIL.
    let (_d, mut st) = store();
    st.record_run(&base_with("farm.probe", Status::Pass, ""))
        .unwrap();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    r1.tests.extend([
        attempt("farm.probe", Status::Error, 0, EMU_DIED),
        attempt("farm.probe", Status::Error, 1, EMU_DIED),
    ]);
    st.record_run(&r1).unwrap();
    let r = state_at(&mut st, "2026-06-03T00:00:00Z");
    assert_eq!(r.state, Some(State::Testing), "{}", r.reason);

    // One hang without its retry is not yet evidence either.
    let (_d, mut st) = store();
    st.record_run(&base_with("farm.probe", Status::Pass, ""))
        .unwrap();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    r1.tests.push(attempt("farm.probe", Status::Error, 0, HANG));
    st.record_run(&r1).unwrap();
    let r = state_at(&mut st, "2026-06-03T00:00:00Z");
    assert_eq!(r.state, Some(State::Testing), "{}", r.reason);
}

#[test]
fn the_exit_code_follows_the_verdict_state() {
    use crate::Outcome;
    assert_eq!(outcome(Some(State::AwaitingReview)), Outcome::Pass);
    assert_eq!(outcome(Some(State::ReadyToMerge)), Outcome::Pass);
    assert_eq!(outcome(Some(State::Superseded)), Outcome::Pass);
    assert_eq!(outcome(Some(State::ChangesRequested)), Outcome::Fail);
    assert_eq!(outcome(Some(State::Testing)), Outcome::Error);
    assert_eq!(outcome(None), Outcome::Error);
}

#[test]
fn a_link_error_and_a_silent_failure_still_have_evidence() {
    let log = "  LD      vmlinux.o\nld: drivers/net/phy/ax88796b_rust.o: in function `probe':\nld: ax88796b_rust.rs:(.text+0x1c): undefined reference to `phy_read_paged'\nmake[2]: *** [scripts/Makefile.vmlinux_o:72: vmlinux.o] Error 1\n";
    assert_eq!(
        compare::telling_line(log),
        "ld: drivers/net/phy/ax88796b_rust.o: in function `probe': ld: ax88796b_rust.rs:(.text+0x1c): undefined reference to `phy_read_paged'"
    );
    let mut st = CheckState {
        status: Status::Fail,
        flaky: None,
        flaky_at: None,
        flaky_excerpt: String::new(),
        log_excerpt: String::new(),
        log_path: Some("logs/patch1-rust.log".into()),
        runs: 1,
        hung: false,
    };
    assert_eq!(
        compare::evidence(&st),
        "no message; log: logs/patch1-rust.log"
    );
    st.log_path = None;
    assert_eq!(compare::evidence(&st), "no message and no log recorded");
}

#[test]
fn a_run_dated_before_its_base_is_judged_against_the_base_as_it_stood_at_each_moment() {
    // Clock skew: the revision's run ends before the comparable base run
    // exists. Until the base is recorded a FAIL has nothing to share it with
    // (a new failure); from the base's end on, the base fails it too.
    let (_d, mut st) = store();
    let mut r1 = run(
        "r1",
        Some(1),
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    );
    r1.tests
        .push(attempt("farm.dmesg", Status::Fail, 0, "FAIL: WARNING at x"));
    st.record_run(&r1).unwrap();
    let mut b = run("base", None, "2026-06-01T02:00:00Z", "2026-06-01T03:00:00Z");
    b.tests
        .push(attempt("farm.dmesg", Status::Fail, 0, "FAIL: WARNING at x"));
    st.record_run(&b).unwrap();
    let r = state_at(&mut st, "2026-06-02T00:00:00Z");
    let states: Vec<(String, State)> = r
        .transitions
        .iter()
        .map(|t| (t.at.to_string(), t.state))
        .collect();
    assert_eq!(
        states,
        [
            ("2026-06-01T00:00:00Z".to_string(), State::New),
            ("2026-06-01T00:00:00Z".to_string(), State::Testing),
            ("2026-06-01T01:00:00Z".to_string(), State::ChangesRequested),
            ("2026-06-01T03:00:00Z".to_string(), State::AwaitingReview),
        ]
    );
}

#[test]
fn two_acks_by_one_reviewer_and_a_withdrawn_nack_count_as_that_reviewers_latest_word() {
    let (_d, mut st) = store();
    st.record_run(&run(
        "r1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    ))
    .unwrap();
    let word = |at: &str, kind| Review {
        at: t(at),
        by: "maintainer".into(),
        kind,
        reason: format!("{kind:?} at {at}"),
    };
    review(
        &mut st,
        &rev(),
        &word("2026-06-02T02:00:00Z", ReviewKind::Ack),
    )
    .unwrap();
    review(
        &mut st,
        &rev(),
        &word("2026-06-02T03:00:00Z", ReviewKind::Ack),
    )
    .unwrap();
    review(
        &mut st,
        &rev(),
        &word("2026-06-02T04:00:00Z", ReviewKind::Nack),
    )
    .unwrap();
    let r = state_at(&mut st, "2026-06-02T05:00:00Z");
    assert_eq!(r.state, Some(State::ChangesRequested), "{}", r.reason);
    // Withdrawn: the same reviewer's later ack.
    review(
        &mut st,
        &rev(),
        &word("2026-06-02T06:00:00Z", ReviewKind::Ack),
    )
    .unwrap();
    let r = state_at(&mut st, "2026-06-02T07:00:00Z");
    assert_eq!(r.state, Some(State::AwaitingReview), "{}", r.reason);
    // The clock restarts from the withdrawal: 72 hours from 06:00.
    assert_eq!(r.ready_at, Some(t("2026-06-05T06:00:00Z")));
}
