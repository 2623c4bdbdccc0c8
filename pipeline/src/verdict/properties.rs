//! The verdict algebra against a reference model: generated histories of
//! one revision (runs with retries, a base run, acks and nacks at their
//! times) are judged by the real state machine ([`super::clock::replay`])
//! and by [`reference`], a plain restatement of the rules written for
//! people, and the two must agree.
//!
//! The rules, as the reference states them:
//! - within a run the retry decides, except FAIL then PASS (a flake, PASS)
//!   and FAIL then ERROR (FAIL); ERROR is never a flake;
//! - the latest complete run that reported a check decides it;
//! - a check whose guest stopped answering at both attempts, where the base
//!   passed it, is FAIL (the hang rule); any other ERROR stays ERROR;
//! - a FAIL the base does not share requests changes; so does a standing
//!   nack (each reviewer's latest word);
//! - otherwise any ERROR or MISS, a farm SKIP that does not say "not
//!   applicable", or farm checks of which none passed keep it testing;
//! - otherwise a flake not released by an ack given after it (or three
//!   clean runs) holds it in awaiting-review;
//! - otherwise it awaits review and is ready to merge 72 hours after it
//!   began to, and never sooner than 72 hours after its first complete run.
//!
//! `make test` runs 10 000 histories with a fresh seed and prints it;
//! `PHYFARM_VERDICT_SEED=<seed>` replays one run of them, and
//! `PHYFARM_VERDICT_CASES` changes how many.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::clock::{self, REVIEW_HOURS};
use super::{Review, ReviewKind, State};
use crate::results::{Environment, Run, Status, TestResult, Timestamp};
use crate::store::{RunRecord, RunState};

/// What one attempt of a check did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum A {
    Pass,
    Fail,
    /// ERROR: the guest agent stopped answering.
    Hang,
    /// ERROR: part of the farm died.
    Infra,
    Miss,
    /// SKIP with no reason that it does not apply.
    Skip,
    /// SKIP: "not applicable: ...".
    SkipNa,
}

impl A {
    fn status(self) -> Status {
        match self {
            A::Pass => Status::Pass,
            A::Fail => Status::Fail,
            A::Hang | A::Infra => Status::Error,
            A::Miss => Status::Miss,
            A::Skip | A::SkipNa => Status::Skip,
        }
    }

    fn excerpt(self) -> &'static str {
        match self {
            A::Pass => "",
            A::Fail => "FAIL in call: CheckFailed: no carrier",
            A::Hang => "ERROR in call: phyfarm_farm.errors.GuestTimeout: the guest agent did not answer ip link within 40s",
            A::Infra => "ERROR in call: phyfarm_farm.errors.EmulatorDied: ax88772-emu exited",
            A::Miss => "MISS: planned but not reported",
            A::Skip => "no KVM here",
            A::SkipNa => "not applicable: this PHY has no cable test",
        }
    }
}

/// A check's attempts in one run: absent, or a first attempt and maybe
/// its retry.
type Cell = Option<(A, Option<A>)>;

const CHECKS: [&str; 3] = ["farm.a", "farm.b", "gate.g"];

#[derive(Debug, Clone)]
struct GenRun {
    complete: bool,
    cells: [Cell; 3],
}

#[derive(Debug, Clone)]
struct History {
    /// The base's one attempt per check; None: no base run.
    base: Option<[A; 3]>,
    runs: Vec<GenRun>,
    /// (minutes after the first run starts, reviewer, kind)
    reviews: Vec<(i64, u8, ReviewKind)>,
    /// Minutes after the last run ends.
    now_after: i64,
}

const T0: i64 = 1_780_000_000;
const RUN_GAP: i64 = 2 * 3600;

fn run_end(i: usize) -> i64 {
    T0 + i as i64 * RUN_GAP + 3600
}

fn first_attempt() -> impl Strategy<Value = A> {
    prop_oneof![
        6 => Just(A::Pass),
        2 => Just(A::Fail),
        1 => Just(A::Hang),
        1 => Just(A::Infra),
        1 => Just(A::Miss),
        1 => Just(A::Skip),
        1 => Just(A::SkipNa),
    ]
}

fn retry() -> impl Strategy<Value = A> {
    prop_oneof![Just(A::Pass), Just(A::Fail), Just(A::Hang), Just(A::Infra)]
}

fn cell() -> impl Strategy<Value = Cell> {
    let present = (first_attempt(), proptest::option::of(retry())).prop_map(|(a, r)| {
        // The farm retries only what failed or errored.
        let r = r.filter(|_| matches!(a, A::Fail | A::Hang | A::Infra));
        (a, r)
    });
    prop_oneof![1 => Just(None), 6 => present.prop_map(Some)]
}

fn history() -> impl Strategy<Value = History> {
    let base_attempt = prop_oneof![4 => Just(A::Pass), 1 => Just(A::Fail), 1 => Just(A::Hang), 1 => Just(A::Infra)];
    let run = (proptest::bool::weighted(0.85), [cell(), cell(), cell()])
        .prop_map(|(complete, cells)| GenRun { complete, cells });
    let review = (
        0i64..(6 * 60 * 24),
        0u8..2,
        prop_oneof![Just(ReviewKind::Ack), Just(ReviewKind::Nack)],
    );
    (
        proptest::option::weighted(
            0.8,
            [base_attempt.clone(), base_attempt.clone(), base_attempt],
        ),
        proptest::collection::vec(run, 1..5),
        proptest::collection::vec(review, 0..4),
        0i64..(150 * 60),
    )
        .prop_map(|(base, runs, reviews, now_after)| History {
            base,
            runs,
            reviews,
            now_after,
        })
}

fn test_result(path: &str, a: A, attempt: u32) -> TestResult {
    TestResult {
        path: path.into(),
        variant: None,
        status: a.status(),
        duration_s: Some(1.0),
        log_path: None,
        log_excerpt: a.excerpt().into(),
        attempt,
    }
}

fn make_run(id: &str, revision: bool, start: i64, end: i64, tests: Vec<TestResult>) -> Run {
    Run {
        schema: crate::results::RESULTS_SCHEMA,
        id: id.into(),
        revision: revision.then(|| crate::results::fixture::revision(1)),
        base: "linux 1".into(),
        environment: Environment {
            accelerator: "tcg".into(),
            host: "h".into(),
            arch: "x86_64".into(),
            ..Default::default()
        },
        started: Timestamp(start),
        finished: Some(Timestamp(end)),
        reproducer: String::new(),
        builds: vec![],
        tests,
        measurements: vec![],
    }
}

struct Built {
    runs: Vec<RunRecord>,
    base: Vec<RunRecord>,
    reviews: Vec<Review>,
    now: Timestamp,
}

fn build(h: &History) -> Built {
    let runs = h
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut tests = Vec::new();
            for (c, cell) in CHECKS.iter().zip(&r.cells) {
                if let Some((a, retry)) = cell {
                    tests.push(test_result(c, *a, 0));
                    if let Some(b) = retry {
                        tests.push(test_result(c, *b, 1));
                    }
                }
            }
            let start = T0 + i as i64 * RUN_GAP;
            RunRecord {
                state: if r.complete {
                    RunState::Complete
                } else {
                    RunState::Interrupted
                },
                run: make_run(&format!("r{i}"), true, start, run_end(i), tests),
            }
        })
        .collect();
    let base = h
        .base
        .iter()
        .map(|b| RunRecord {
            state: RunState::Complete,
            run: make_run(
                "base",
                false,
                T0 - 2 * 3600,
                T0 - 3600,
                CHECKS
                    .iter()
                    .zip(b)
                    .map(|(c, a)| test_result(c, *a, 0))
                    .collect(),
            ),
        })
        .collect();
    // One review a minute at most: the store keeps them in time order.
    let mut reviews: Vec<Review> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut sorted = h.reviews.clone();
    sorted.sort_by_key(|r| r.0);
    for (min, by, kind) in sorted {
        if seen.insert(min) {
            reviews.push(Review {
                at: Timestamp(T0 + min * 60),
                by: format!("m{by}"),
                kind,
                reason: "r".into(),
            });
        }
    }
    let now = Timestamp(run_end(h.runs.len() - 1) + h.now_after * 60);
    Built {
        runs,
        base,
        reviews,
        now,
    }
}

/// The class of state the rules give at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    ChangesRequested,
    Testing,
    /// Awaiting review, held by a flake.
    Held,
    /// Awaiting review or ready to merge, by the clock.
    Open,
}

/// A check's outcome in one run: status, flaky, hung.
fn fold(first: A, retry: Option<A>) -> (Status, bool, bool) {
    match (first, retry) {
        (a, None) => (a.status(), false, false),
        (A::Fail, Some(A::Pass)) => (Status::Pass, true, false),
        (A::Fail, Some(A::Hang | A::Infra)) => (Status::Fail, false, false),
        (A::Hang, Some(A::Hang)) => (Status::Error, false, true),
        (_, Some(b)) => (b.status(), false, false),
    }
}

/// The plain-spoken rules, at `now` (after every run has ended).
fn reference(h: &History, b: &Built) -> Class {
    let complete: Vec<(usize, &GenRun)> = h
        .runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.complete)
        .collect();
    if complete.is_empty() {
        return Class::Testing;
    }
    let base_status = |c: usize| h.base.map(|b| b[c].status());
    // Per check: (status, excerpt kind, latest flake's run end).
    let mut finals: BTreeMap<usize, (Status, A, Option<i64>)> = BTreeMap::new();
    for (i, r) in &complete {
        for (c, cell) in r.cells.iter().enumerate() {
            let Some((a, retry)) = cell else { continue };
            let (mut s, flaky, hung) = fold(*a, *retry);
            if hung && base_status(c) == Some(Status::Pass) {
                s = Status::Fail;
            }
            let shown = retry.unwrap_or(*a);
            let earlier = finals.get(&c).and_then(|f| f.2);
            let flake_at = if flaky { Some(run_end(*i)) } else { earlier };
            finals.insert(c, (s, shown, flake_at));
        }
    }
    if finals
        .iter()
        .any(|(c, f)| f.0 == Status::Fail && base_status(*c) != Some(Status::Fail))
    {
        return Class::ChangesRequested;
    }
    let mut word: BTreeMap<&str, ReviewKind> = BTreeMap::new();
    for r in b.reviews.iter().filter(|r| r.at <= b.now) {
        word.insert(&r.by, r.kind);
    }
    if word.values().any(|k| *k == ReviewKind::Nack) {
        return Class::ChangesRequested;
    }
    let farm = |c: usize| CHECKS[c].starts_with("farm.");
    let no_evidence = finals
        .iter()
        .any(|(c, f)| f.0.incomplete() || (f.0 == Status::Skip && farm(*c) && f.1 != A::SkipNa));
    if no_evidence {
        return Class::Testing;
    }
    let farm_checks: Vec<_> = finals.iter().filter(|(c, _)| farm(**c)).collect();
    if !farm_checks.is_empty() && !farm_checks.iter().any(|(_, f)| f.0 == Status::Pass) {
        return Class::Testing;
    }
    let last3: Vec<&GenRun> = complete.iter().rev().take(3).map(|(_, r)| *r).collect();
    let held = finals.iter().any(|(c, f)| {
        let Some(at) = f.2 else { return false };
        let acked = b
            .reviews
            .iter()
            .any(|r| r.kind == ReviewKind::Ack && r.at.0 >= at && r.at <= b.now);
        let clean = last3.len() == 3
            && last3
                .iter()
                .all(|r| matches!(r.cells[*c], Some((A::Pass, None))));
        !acked && !clean
    });
    if held {
        Class::Held
    } else {
        Class::Open
    }
}

fn actual(b: &Built) -> Result<State, String> {
    let r: crate::results::RevisionRef = "s/v1".parse().unwrap();
    let facts = clock::Facts {
        revision: &r,
        created: Timestamp(T0),
        superseded: None,
        runs: &b.runs,
        base_runs: &b.base,
        reviews: &b.reviews,
    };
    let t = clock::replay(&facts, &[], b.now).map_err(|e| e.to_string())?;
    t.last()
        .map(|t| t.state)
        .ok_or_else(|| "no transition".to_string())
}

/// The whole check for one history: the class agrees, and the clock keeps
/// its promises.
fn check(h: &History) -> Result<(), String> {
    let b = build(h);
    let want = reference(h, &b);
    let got = actual(&b)?;
    let ok = match want {
        Class::ChangesRequested => got == State::ChangesRequested,
        Class::Testing => got == State::Testing,
        Class::Held => got == State::AwaitingReview,
        Class::Open => matches!(got, State::AwaitingReview | State::ReadyToMerge),
    };
    if !ok {
        return Err(format!("the rules say {want:?}, the verdict says {got}"));
    }
    if want == Class::Open {
        let first_end = h
            .runs
            .iter()
            .enumerate()
            .find(|(_, r)| r.complete)
            .map(|(i, _)| run_end(i))
            .unwrap_or(i64::MAX);
        let last_event = b
            .reviews
            .iter()
            .map(|r| r.at.0)
            .chain([run_end(h.runs.len() - 1)])
            .max()
            .unwrap_or(0);
        let day3 = REVIEW_HOURS * 3600;
        if got == State::ReadyToMerge && b.now.0 < first_end + day3 {
            return Err("ready to merge sooner than 72 hours after the first complete run".into());
        }
        if got == State::AwaitingReview && b.now.0 >= last_event + day3 {
            return Err("72 hours past every event and still awaiting review".into());
        }
    }
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

#[test]
fn generated_histories_agree_with_the_reference_rules() {
    let seed = env_u64("PHYFARM_VERDICT_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    });
    let cases = env_u64("PHYFARM_VERDICT_CASES").unwrap_or(10_000) as u32;
    eprintln!(
        "I: verdict properties: {cases} generated histories, seed {seed:#018x} (PHYFARM_VERDICT_SEED={seed:#x} replays them)"
    );
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&history(), |h| {
        check(&h).map_err(proptest::test_runner::TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("seed {seed:#x}: {e}");
    }
}
