use super::*;
use crate::results::fixture::{build, measurement, run, t, test};
use crate::results::Status;
use crate::store::{OpenMode, SqliteStore};

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let st = SqliteStore::open(&dir.path().join("r.sqlite"), OpenMode::Create).unwrap();
    (dir, st)
}

fn rev(s: &str) -> RevisionRef {
    s.parse().unwrap()
}

fn states(st: &SqliteStore, r: &str) -> Vec<(String, State)> {
    st.transitions(&rev(r))
        .unwrap()
        .into_iter()
        .map(|t| (t.at.to_string(), t.state))
        .collect()
}

fn base_run() -> crate::results::Run {
    let mut b = run("base", None, "2026-06-01T00:00:00Z", "2026-06-01T01:00:00Z");
    b.tests.push(test("farm.dmesg.clean", Status::Fail));
    b.measurements
        .push(measurement(&[100.0, 102.0, 98.0, 101.0, 99.0]));
    b
}

#[test]
fn passing_revision_waits_72_hours_then_is_ready() {
    let (_d, mut st) = store();
    st.record_run(&base_run()).unwrap();
    st.record_run(&run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    ))
    .unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-04T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    assert_eq!(r.ready_at, Some(t("2026-06-05T01:00:00Z")));
    // One second short of 72 hours: still waiting.
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-05T00:59:59Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-09T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ReadyToMerge));
    assert_eq!(
        states(&st, "s/v1"),
        [
            ("2026-06-02T00:00:00Z".into(), State::New),
            ("2026-06-02T00:00:00Z".into(), State::Testing),
            ("2026-06-02T01:00:00Z".into(), State::AwaitingReview),
            ("2026-06-05T01:00:00Z".into(), State::ReadyToMerge),
        ]
    );
    let e = advance(&mut st, &rev("s/v1"), t("2026-06-04T00:00:00Z")).unwrap_err();
    assert!(
        e.to_string()
            .contains("earlier than the last recorded transition"),
        "{e}"
    );
}

#[test]
fn nack_requests_changes_and_the_reviewers_ack_withdraws_it() {
    let (_d, mut st) = store();
    st.record_run(&run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    ))
    .unwrap();
    advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    let nack = Review {
        at: t("2026-06-04T00:00:00Z"),
        by: "Andrew Lunn".into(),
        kind: ReviewKind::Nack,
        reason: "needs a Fixes: tag".into(),
    };
    review(&mut st, &rev("s/v1"), &nack).unwrap();
    // Long after 72 hours: the objection stands.
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-10T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ChangesRequested));
    assert!(
        r.reason.contains("Andrew Lunn") && r.reason.contains("Fixes"),
        "{}",
        r.reason
    );
    let ack = Review {
        at: t("2026-06-11T00:00:00Z"),
        kind: ReviewKind::Ack,
        ..nack
    };
    review(&mut st, &rev("s/v1"), &ack).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-12T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    assert_eq!(
        r.since,
        Some(t("2026-06-11T00:00:00Z")),
        "the clock restarts"
    );
}

#[test]
fn new_failure_requests_changes_and_a_newer_revision_supersedes() {
    let (_d, mut st) = store();
    st.record_run(&base_run()).unwrap();
    let mut v1 = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    v1.tests.push(test("apply.patch1", Status::Fail));
    v1.tests.push(test("farm.dmesg.clean", Status::Fail));
    st.record_run(&v1).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ChangesRequested));
    assert!(r.reason.contains("apply.patch1 FAIL"), "{}", r.reason);
    assert!(
        !r.reason.contains("dmesg"),
        "a base failure is not counted: {}",
        r.reason
    );
    assert_eq!(r.count(FindingKind::StillFailing), 1);
    let mut v2 = run(
        "v2",
        Some(2),
        "2026-06-04T00:00:00Z",
        "2026-06-04T01:00:00Z",
    );
    v2.tests.push(test("apply.patch1", Status::Pass));
    st.record_run(&v2).unwrap();
    let reps = advance_all(&mut st, t("2026-06-05T00:00:00Z")).unwrap();
    assert_eq!(reps[0].state, Some(State::Superseded));
    assert_eq!(reps[0].since, Some(t("2026-06-04T00:00:00Z")));
    assert_eq!(reps[1].state, Some(State::AwaitingReview));
    assert_eq!(reps[1].previous, Some(rev("s/v1")));
    assert!(reps[1]
        .vs_previous
        .iter()
        .any(|f| f.kind == FindingKind::Fixed && f.check.path == "apply.patch1"));
}

#[test]
fn harness_trouble_keeps_testing_and_never_fails() {
    let (_d, mut st) = store();
    let mut v1 = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    v1.tests.push(test("farm.throughput.tcp_tx", Status::Error));
    st.record_run(&v1).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::Testing));
    assert!(r.reason.contains("rerun"), "{}", r.reason);
}

#[test]
fn a_new_warning_fails_its_build_check_like_a_build_failure() {
    let (_d, mut st) = store();
    let mut v1 = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    let mut b = build(Some(1), Status::Pass, 4);
    b.new_warnings = vec!["drivers/net/phy/ax88796b_rust.rs:10: warning: unused".into()];
    v1.builds.push(b);
    st.record_run(&v1).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    assert_eq!(
        r.state,
        Some(State::ChangesRequested),
        "netdev's build checks fail on a new warning"
    );
    assert!(r.reason.contains("build.rust.patch1 FAIL"), "{}", r.reason);
    let new: Vec<_> = r
        .vs_base
        .iter()
        .filter(|f| f.kind == FindingKind::NewFailure)
        .collect();
    assert_eq!(new.len(), 1);
    assert!(
        new[0]
            .detail
            .contains("new warning (1 against the base): drivers/net/phy/ax88796b_rust.rs:10: warning: unused"),
        "{}",
        new[0].detail
    );
    let w: Vec<_> = r
        .vs_base
        .iter()
        .filter(|f| f.kind == FindingKind::NewWarning)
        .collect();
    assert_eq!(w.len(), 1);
    assert!(
        w[0].detail.contains("warnings before: 2 this patch: 4"),
        "{}",
        w[0].detail
    );

    let mut v2 = run(
        "v2",
        Some(2),
        "2026-06-04T00:00:00Z",
        "2026-06-04T01:00:00Z",
    );
    v2.builds.push(build(Some(1), Status::Fail, 2));
    st.record_run(&v2).unwrap();
    let r = advance(&mut st, &rev("s/v2"), t("2026-06-05T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ChangesRequested));
    assert!(r.reason.contains("build.rust.patch1 FAIL"), "{}", r.reason);
}

#[test]
fn the_latest_run_decides_and_a_flip_between_runs_is_no_flake() {
    let (_d, mut st) = store();
    let mut a = run("a", Some(1), "2026-06-02T00:00:00Z", "2026-06-02T01:00:00Z");
    a.tests.push(test("farm.link_flap.flap10", Status::Fail));
    st.record_run(&a).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-02T02:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ChangesRequested));
    let mut b = run("b", Some(1), "2026-06-02T03:00:00Z", "2026-06-02T04:00:00Z");
    b.tests.push(test("farm.link_flap.flap10", Status::Pass));
    st.record_run(&b).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-02T05:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    assert_eq!(r.flaky().count(), 0);
    // And the other way round: a later FAIL is a FAIL, whatever passed before.
    let mut c = run("c", Some(1), "2026-06-02T06:00:00Z", "2026-06-02T07:00:00Z");
    c.tests.push(test("farm.link_flap.flap10", Status::Fail));
    st.record_run(&c).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-02T08:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ChangesRequested));
}

#[test]
fn retry_fold_confirmed_failure_and_flake() {
    let mut r = run("r", Some(1), "2026-06-02T00:00:00Z", "2026-06-02T01:00:00Z");
    r.tests = vec![
        test("farm.a", Status::Fail),
        crate::results::TestResult {
            attempt: 1,
            ..test("farm.a", Status::Pass)
        },
        test("farm.b", Status::Fail),
        crate::results::TestResult {
            attempt: 1,
            ..test("farm.b", Status::Fail)
        },
    ];
    let c = compare::aggregate(&[&r]);
    let get = |p: &str| c.iter().find(|(k, _)| k.path == p).unwrap().1;
    assert_eq!(get("farm.a").status, Status::Pass);
    assert!(get("farm.a").flaky.is_some());
    assert_eq!(get("farm.b").status, Status::Fail);
    assert!(get("farm.b").flaky.is_none());
}

#[test]
fn noise_band_calls_regressions_only_outside_it() {
    let base = [100.0, 102.0, 98.0, 101.0, 99.0];
    let b = compare::band(&base).unwrap();
    // The base as the call sees it: its median and its span.
    assert_eq!(
        (b.median, b.low, b.high, b.samples),
        (100.0, 98.0, 102.0, 5)
    );
    assert!(
        compare::band(&[100.0]).is_none(),
        "one sample gives no band"
    );
    // A constant base still gets a band as wide as what it showed.
    let flat = compare::band(&[5.0, 5.0]).unwrap();
    assert_eq!((flat.low, flat.high), (5.0, 5.0));
    let mut br = run("b", None, "2026-06-01T00:00:00Z", "2026-06-01T01:00:00Z");
    br.measurements.push(measurement(&base));
    let call = |samples: &[f64], lower: bool| {
        let mut r = run("r", Some(1), "2026-06-02T00:00:00Z", "2026-06-02T01:00:00Z");
        let mut m = measurement(samples);
        m.lower_is_better = lower;
        r.measurements.push(m);
        let mut b2 = br.clone();
        b2.measurements[0].lower_is_better = lower;
        compare::measurements(&[&r], &[&b2])[0].movement
    };
    // Samples inside the base's spread: noise.
    assert_eq!(
        call(&[96.0, 97.0, 101.0, 99.0, 98.5], false),
        Movement::WithinNoise
    );
    // 2 % lower and separated: significant, but below the 2.5 % minimum effect.
    assert_eq!(
        call(&[98.0, 97.5, 98.5, 97.8, 98.2], false),
        Movement::WithinNoise
    );
    // 6 % lower and separated: a regression.
    assert_eq!(
        call(&[94.0, 93.5, 94.5, 93.8, 94.2], false),
        Movement::Regression
    );
    // 30 % lower, separated: a regression, p < 0.01.
    let slow = [70.0, 71.0, 69.5, 70.5, 70.2];
    assert_eq!(call(&slow, false), Movement::Regression);
    assert_eq!(
        call(&[130.0, 131.0, 129.0, 130.5, 132.0], false),
        Movement::Improvement
    );
    // For times, higher is worse.
    assert_eq!(
        call(&[130.0, 131.0, 129.0, 130.5, 132.0], true),
        Movement::Regression
    );
    // Too few samples on either side: no call.
    assert_eq!(call(&[50.0, 51.0], false), Movement::NoBand);
    let mut one = br.clone();
    one.measurements[0].samples = vec![100.0];
    let mut r = run("r", Some(1), "2026-06-02T00:00:00Z", "2026-06-02T01:00:00Z");
    r.measurements.push(measurement(&slow));
    assert_eq!(
        compare::measurements(&[&r], &[&one])[0].movement,
        Movement::NoBand
    );
    // A throughput regression is a failure of the check that measured it.
    let mut r = run("r", Some(1), "2026-06-02T00:00:00Z", "2026-06-02T01:00:00Z");
    r.measurements.push(measurement(&slow));
    let deltas = compare::measurements(&[&r], &[&br]);
    let f = compare::regressions(&deltas);
    assert_eq!(f.len(), 1, "{deltas:?}");
    assert_eq!(f[0].check.path, "farm.throughput");
    assert!(
        f[0].detail
            .starts_with("throughput regression vs base: tcp_tx -29.8 %")
            && f[0].detail.contains("(p = 0.00"),
        "{}",
        f[0].detail
    );
    assert_eq!(compare::p_text(0.0040), "p = 0.0040");
    assert_eq!(compare::p_text(0.00001), "p < 0.0001");
}

#[test]
fn an_interrupted_run_alone_keeps_the_revision_testing() {
    let (_d, mut st) = store();
    let v1 = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    st.begin_run(&v1).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-02T00:30:00Z")).unwrap();
    assert_eq!(r.state, Some(State::Testing));
    assert!(r.reason.contains("in progress"), "{}", r.reason);
}

#[test]
fn missing_evidence_keeps_testing_even_when_the_base_misses_it_too() {
    let (_d, mut st) = store();
    let mut b = base_run();
    b.tests.push(test("farm.kunit", Status::Miss));
    st.record_run(&b).unwrap();
    let mut v1 = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    v1.tests.push(test("farm.kunit", Status::Miss));
    st.record_run(&v1).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-09T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::Testing));
    assert!(r.reason.contains("farm.kunit"), "{}", r.reason);
}

#[test]
fn a_skip_is_not_counted_as_a_pass() {
    let (_d, mut st) = store();
    let mut v1 = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    v1.tests.push(crate::results::TestResult {
        log_excerpt: "not applicable: the PHY has no cable test".into(),
        ..test("farm.cable_test[cable-test]", Status::Skip)
    });
    st.record_run(&v1).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    assert!(
        r.reason.contains("3 checks planned and reported, 2 passed")
            && r.reason
                .contains("1 not applicable (SKIP, not counted as passed)"),
        "{}",
        r.reason
    );
    // A SKIP that does not say the check does not apply is a check that
    // did not run: no evidence, so the revision keeps testing.
    let mut v2 = run(
        "v2",
        Some(2),
        "2026-06-04T00:00:00Z",
        "2026-06-04T01:00:00Z",
    );
    v2.tests
        .push(test("farm.cable_test[cable-test]", Status::Skip));
    st.record_run(&v2).unwrap();
    let r = advance(&mut st, &rev("s/v2"), t("2026-06-05T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::Testing));
    assert!(
        r.reason.contains("farm.cable_test[cable-test] SKIP"),
        "{}",
        r.reason
    );
}

#[test]
fn a_flake_holds_ready_to_merge_until_acked_or_three_clean_reruns() {
    let flaky_run = |id: &str, start: &str, end: &str| {
        let mut r = run(id, Some(1), start, end);
        let mut first = test("farm.link_flap[plain]", Status::Fail);
        first.variant = Some("rust".into());
        let mut retry = first.clone();
        retry.status = Status::Pass;
        retry.attempt = 1;
        r.tests.extend([first, retry]);
        r
    };
    let clean_run = |id: &str, start: &str, end: &str| {
        let mut r = run(id, Some(1), start, end);
        let mut x = test("farm.link_flap[plain]", Status::Pass);
        x.variant = Some("rust".into());
        r.tests.push(x);
        r
    };
    // Held: flaky on the revision, stable on the base, 72 hours later.
    let (_d, mut st) = store();
    st.record_run(&base_run()).unwrap();
    st.record_run(&flaky_run(
        "a",
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    ))
    .unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-09T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    assert!(
        r.reason
            .contains("held by flaky checks: farm.link_flap[plain] (rust)"),
        "{}",
        r.reason
    );
    assert_eq!(r.flaky().count(), 1);
    // Two clean reruns are not enough; the third releases it.
    st.record_run(&clean_run(
        "b",
        "2026-06-09T01:00:00Z",
        "2026-06-09T02:00:00Z",
    ))
    .unwrap();
    st.record_run(&clean_run(
        "c",
        "2026-06-09T03:00:00Z",
        "2026-06-09T04:00:00Z",
    ))
    .unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-09T05:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    st.record_run(&clean_run(
        "d",
        "2026-06-09T06:00:00Z",
        "2026-06-09T07:00:00Z",
    ))
    .unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-13T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ReadyToMerge), "{}", r.reason);

    // Or a maintainer's ack releases it.
    let (_d, mut st) = store();
    st.record_run(&base_run()).unwrap();
    st.record_run(&flaky_run(
        "a",
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    ))
    .unwrap();
    advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    let ack = Review {
        at: t("2026-06-04T00:00:00Z"),
        by: "Andrew Lunn".into(),
        kind: ReviewKind::Ack,
        reason: "the flap check is the farm's".into(),
    };
    review(&mut st, &rev("s/v1"), &ack).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-09T00:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::ReadyToMerge), "{}", r.reason);
}

#[test]
fn a_rerun_says_what_it_counted_and_keeps_the_clock() {
    let (_d, mut st) = store();
    st.record_run(&base_run()).unwrap();
    st.record_run(&run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    ))
    .unwrap();
    let first = advance(&mut st, &rev("s/v1"), t("2026-06-02T02:00:00Z")).unwrap();
    assert_eq!(first.state, Some(State::AwaitingReview));
    // A rerun of the same revision with one more check passing.
    let mut again = run(
        "v1b",
        Some(1),
        "2026-06-03T00:00:00Z",
        "2026-06-03T01:00:00Z",
    );
    again.tests.push(test("farm.kunit", Status::Pass));
    st.record_run(&again).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-03T02:00:00Z")).unwrap();
    assert_eq!(r.state, Some(State::AwaitingReview));
    assert_eq!(r.since, first.since, "the 72-hour clock is not restarted");
    assert_eq!(r.checks.len(), first.checks.len() + 1);
    for rep in [&first, &r] {
        let counted = format!("{} checks planned and reported", rep.checks.len());
        assert!(rep.reason.starts_with(&counted), "{}", rep.reason);
    }
    assert!(
        r.reason
            .contains("ready to merge at 2026-06-05T01:00:00Z unless someone objects"),
        "{}",
        r.reason
    );
}

#[test]
fn the_text_verdict_shows_throughput_and_what_moved_not_every_timing() {
    let (_d, mut st) = store();
    let mut b = base_run();
    let mut boot = measurement(&[2.1, 2.3]);
    boot.name = "farm.probe.boot_to_agent_ready".into();
    boot.unit = "s".into();
    b.measurements.push(boot.clone());
    st.record_run(&b).unwrap();
    let mut r = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    r.measurements
        .push(measurement(&[100.5, 101.0, 99.5, 100.0, 100.25]));
    r.measurements.push(boot);
    st.record_run(&r).unwrap();
    let rep = advance(&mut st, &rev("s/v1"), t("2026-06-02T02:00:00Z")).unwrap();
    let text = render_text(&rep);
    assert!(
        text.contains("farm.throughput.tcp_tx (rust): 100.2 bit/s (base "),
        "{text}"
    );
    assert!(!text.contains("boot_to_agent_ready"), "{text}");
    assert!(!text.contains("e0 "), "no scientific notation: {text}");
    assert!(text.contains("(1 other measurements"), "{text}");
}

/// A store with the base and s/v1, whose link-flap check FAILs on rust;
/// `more` adds to v1's tests before it is recorded.
fn with_a_failing_flap(more: Vec<crate::results::TestResult>) -> (tempfile::TempDir, SqliteStore) {
    let (d, mut st) = store();
    st.record_run(&base_run()).unwrap();
    let mut v1 = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    let mut flap = test("farm.link_flap[plain]", Status::Fail);
    flap.variant = Some("rust".into());
    v1.tests.push(flap);
    v1.tests.extend(more);
    st.record_run(&v1).unwrap();
    (d, st)
}

#[test]
fn a_farm_check_that_did_not_pass_comes_with_its_reproducer() {
    let mut probe = test("farm.probe", Status::Pass);
    probe.variant = Some("rust".into());
    let (_d, mut st) = with_a_failing_flap(vec![test("gate.clippy", Status::Fail), probe]);
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    let cmds: Vec<&str> = r.reproducers.iter().map(|x| x.command.as_str()).collect();
    assert_eq!(
        cmds,
        ["phyfarm repro s/v1 'farm.link_flap[plain]' --variant rust"],
        "farm checks only, and only those that did not pass"
    );
    let text = render_text(&r);
    assert!(
        text.contains(
            "(rust) FAIL (no message and no log recorded)\n    reproduce: phyfarm repro s/v1 'farm.link_flap[plain]' --variant rust\n"
        ),
        "{text}"
    );
    assert_eq!(text.matches("reproduce:").count(), 1, "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["reproducers"][0]["path"], "farm.link_flap[plain]");
    assert_eq!(json["reproducers"][0]["variant"], "rust");
}

#[test]
fn a_recorded_first_bad_patch_is_shown_while_its_check_fails() {
    let (_d, mut st) = with_a_failing_flap(vec![]);
    let found = crate::results::review::FirstBad {
        at: t("2026-06-02T02:00:00Z"),
        check: "farm.link_flap[plain]".into(),
        variant: Some("rust".into()),
        patch: 1,
        how: "1..1: FAIL FAIL".into(),
    };
    st.add_first_bad(&rev("s/v1"), &found).unwrap();
    // A finding for a check that does not fail now is not shown.
    let stale = crate::results::review::FirstBad {
        check: "farm.probe".into(),
        ..found.clone()
    };
    st.add_first_bad(&rev("s/v1"), &stale).unwrap();
    let r = advance(&mut st, &rev("s/v1"), t("2026-06-03T00:00:00Z")).unwrap();
    assert_eq!(r.first_bad.len(), 1, "{:?}", r.first_bad);
    let text = render_text(&r);
    assert!(
        text.contains(
            "  first bad patch: 1/1 net: phy: a <b> & `c` | d (farm.link_flap[plain] (rust); 1..1: FAIL FAIL)\n"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["first_bad"][0]["patch"], 1);
    assert_eq!(json["first_bad"][0]["path"], "farm.link_flap[plain]");
}
