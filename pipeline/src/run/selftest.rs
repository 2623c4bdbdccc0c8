//! `phyfarm selftest`: the seeded faults of `patches/selftest`, each run
//! through `phyfarm run` exactly as a contributor's series would be, and
//! checked for the verdict class and the evidence line it must get. The
//! project proves on itself that a broken driver is caught, and how.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::config::Paths;
use crate::progress::{info, warn};
use crate::Outcome;

/// The cases file, relative to the repository.
pub const CASES: &str = "patches/selftest/cases.toml";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    /// What is wrong with the patch, in a few words.
    pub fault: String,
    pub variants: Vec<String>,
    /// Farm check families the case needs (see `phyfarm farm plan`).
    pub checks: Vec<String>,
    /// The exit code `phyfarm run` must end with.
    pub exit: i32,
    /// The verdict state it must print (empty: none, the run is refused).
    pub state: String,
    /// Strings the run's output must contain.
    pub evidence: Vec<String>,
    /// Run in `make test` too.
    #[serde(default)]
    pub quick: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CasesFile {
    case: Vec<Case>,
}

pub fn load(repo: &Path) -> Result<Vec<Case>> {
    let path = repo.join(CASES);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let f: CasesFile = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start].lines().count().max(1))
            .unwrap_or(0);
        anyhow::anyhow!("{}:{line}: {}", path.display(), e.message())
    })?;
    for c in &f.case {
        let dir = repo.join("patches/selftest").join(&c.name).join("v1");
        if !dir.is_dir() {
            bail!(
                "{}: case {:?} has no folder {}",
                path.display(),
                c.name,
                dir.display()
            );
        }
    }
    Ok(f.case)
}

/// What one case did.
#[derive(Debug)]
pub struct Outcome1 {
    pub case: Case,
    pub exit: Option<i32>,
    pub state: String,
    pub missing: Vec<String>,
    pub problems: Vec<String>,
    pub evidence: String,
    pub seconds: f64,
}

impl Outcome1 {
    pub fn caught(&self) -> bool {
        self.missing.is_empty() && self.problems.is_empty()
    }
}

/// The verdict line of `series` in `phyfarm run`'s output:
/// `<series>/v1: <state> since ...`.
fn state_of(out: &str, series: &str) -> String {
    let prefix = format!("{series}/v1: ");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or("")
        .to_string()
}

/// The line of the output holding the first evidence string.
fn evidence_line(out: &str, case: &Case) -> String {
    let first = case.evidence.first().map(String::as_str).unwrap_or("");
    out.lines()
        .find(|l| !first.is_empty() && l.contains(first))
        .unwrap_or("")
        .trim()
        .chars()
        .take(240)
        .collect()
}

pub struct Options {
    pub names: Vec<String>,
    pub quick: bool,
    pub out: PathBuf,
    /// Cases run at once. Their kernel builds take turns (the series tree
    /// is locked); one case's farm runs while the next one builds.
    pub jobs: usize,
}

pub fn run(paths: &Paths, opts: &Options) -> Result<Outcome> {
    let mut cases = load(&paths.repo)?;
    if opts.quick {
        cases.retain(|c| c.quick);
    }
    if !opts.names.is_empty() {
        for n in &opts.names {
            if !cases.iter().any(|c| &c.name == n) {
                bail!("--case {n:?}: no such case in {CASES}");
            }
        }
        cases.retain(|c| opts.names.contains(&c.name));
    }
    // A store of its own, new each time: earlier self-test runs must not
    // turn a fault into a flake or supersede anything.
    let store = opts.out.join("store.sqlite");
    std::fs::create_dir_all(&opts.out)?;
    for f in ["store.sqlite", "store.sqlite-wal", "store.sqlite-shm"] {
        let _ = std::fs::remove_file(opts.out.join(f));
    }
    let exe = std::env::current_exe().context("cannot find the phyfarm binary")?;
    // Cases start in the file's order, at most `jobs` at once, each once
    // the one before it has built its kernels (their builds would only
    // take turns on the series tree's lock): one case's farm runs while the
    // next one builds. A case that measures throughput runs alone,
    // afterwards, so that no other case's build or guests compete with its
    // measurement. The table keeps the file's order.
    let mut done: Vec<Option<Result<Outcome1>>> = cases.iter().map(|_| None).collect();
    let together: Vec<usize> = (0..cases.len())
        .filter(|&i| !runs_alone(&cases[i]))
        .collect();
    let apart: Vec<usize> = (0..cases.len())
        .filter(|&i| runs_alone(&cases[i]))
        .collect();
    for (batch, jobs) in [(together, opts.jobs.max(1)), (apart, 1)] {
        std::thread::scope(|scope| {
            let mut running = Vec::new();
            for i in batch {
                loop {
                    reap(&mut running, &mut done);
                    let previous_built = match running.last() {
                        Some((j, _, since)) => built_since(&opts.out.join(&cases[*j].name), *since),
                        None => true,
                    };
                    if running.len() < jobs && previous_built {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                let since = std::time::SystemTime::now();
                let (exe, store, case) = (&exe, &store, cases[i].clone());
                let h = scope.spawn(move || run_case(paths, exe, store, &opts.out, case));
                running.push((i, h, since));
            }
            for (j, h, _) in running {
                done[j] = Some(join_case(h));
            }
        });
    }
    let mut results = Vec::new();
    for (case, r) in cases.iter().zip(done) {
        match r {
            Some(r) => results.push(r?),
            None => bail!("selftest {}: the case did not finish", case.name),
        }
    }
    print!("{}", table(&results));
    let ok = results.iter().all(Outcome1::caught);
    println!("{}", opts.out.display());
    Ok(if ok { Outcome::Pass } else { Outcome::Fail })
}

/// A case running: its index, its thread, when it started.
type Running<'s> = (
    usize,
    std::thread::ScopedJoinHandle<'s, Result<Outcome1>>,
    std::time::SystemTime,
);

/// Take the cases in `running` that have finished into `done`.
fn reap(running: &mut Vec<Running<'_>>, done: &mut [Option<Result<Outcome1>>]) {
    let (finished, still) = std::mem::take(running)
        .into_iter()
        .partition(|(_, h, _)| h.is_finished());
    *running = still;
    for (j, h, _) in finished {
        done[j] = Some(join_case(h));
    }
}

fn join_case(h: std::thread::ScopedJoinHandle<'_, Result<Outcome1>>) -> Result<Outcome1> {
    h.join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("a self-test case's thread panicked")))
}

/// Whether the run in `out` has written its series build since `t`.
fn built_since(out: &Path, t: std::time::SystemTime) -> bool {
    std::fs::metadata(out.join("series-build.json"))
        .and_then(|m| m.modified())
        .is_ok_and(|m| m >= t)
}

/// Whether a case measures throughput, and so runs with no other case.
fn runs_alone(c: &Case) -> bool {
    c.checks
        .iter()
        .any(|x| x == crate::farm::contract::THROUGHPUT_FAMILY)
}

/// One case through `phyfarm run`, checked against what it must get.
fn run_case(
    paths: &Paths,
    exe: &Path,
    store: &Path,
    out_root: &Path,
    case: Case,
) -> Result<Outcome1> {
    let dir = paths
        .repo
        .join("patches/selftest")
        .join(&case.name)
        .join("v1");
    let out = out_root.join(&case.name);
    info(&format!("selftest {}: {}", case.name, case.fault));
    let started = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.arg("--store")
        .arg(store)
        .arg("--cache")
        .arg(&paths.cache)
        .arg("run")
        .arg(&dir)
        .arg("-o")
        .arg(&out)
        .arg("--no-gates")
        .arg("--variants")
        .arg(case.variants.join(","))
        .arg("--checks")
        .arg(case.checks.join(","))
        .current_dir(&paths.repo)
        .stdin(Stdio::null());
    let o = cmd
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("selftest.log"), &text)?;
    let state = state_of(&text, &case.name);
    let mut problems = Vec::new();
    if o.status.code() != Some(case.exit) {
        problems.push(format!(
            "exit {} (expected {})",
            o.status.code().map_or("signal".into(), |c| c.to_string()),
            case.exit
        ));
    }
    if state != case.state {
        problems.push(format!(
            "verdict {:?} (expected {:?})",
            if state.is_empty() { "none" } else { &state },
            case.state
        ));
    }
    if case.name == "hostile-metadata" && text.contains('\u{1b}') {
        problems.push("a terminal escape sequence from the patch reached the output".into());
    }
    let missing: Vec<String> = case
        .evidence
        .iter()
        .filter(|e| !text.contains(e.as_str()))
        .cloned()
        .collect();
    let r = Outcome1 {
        exit: o.status.code(),
        state,
        missing,
        problems,
        evidence: evidence_line(&text, &case),
        seconds: started.elapsed().as_secs_f64(),
        case,
    };
    if r.caught() {
        info(&format!(
            "selftest {}: caught ({:.0} s)",
            r.case.name, r.seconds
        ));
    } else {
        warn(&format!(
            "selftest {}: NOT as expected: {}{} (log: {})",
            r.case.name,
            r.problems.join("; "),
            if r.missing.is_empty() {
                String::new()
            } else {
                format!("; missing evidence {:?}", r.missing)
            },
            out.join("selftest.log").display()
        ));
    }
    Ok(r)
}

/// One line per case: fault, expected and got, the evidence line.
pub fn table(results: &[Outcome1]) -> String {
    let mut s = String::from("CASE                  RESULT  EXIT  VERDICT            EVIDENCE\n");
    for r in results {
        s.push_str(&format!(
            "{:21} {:7} {:>4}  {:18} {}\n",
            r.case.name,
            if r.caught() { "caught" } else { "MISSED" },
            r.exit.map_or("-".into(), |c| c.to_string()),
            if r.state.is_empty() {
                "(refused)"
            } else {
                &r.state
            },
            r.evidence
        ));
    }
    let caught = results.iter().filter(|r| r.caught()).count();
    s.push_str(&format!(
        "{caught} passed, {} failed\n",
        results.len() - caught
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_case_has_its_series_and_a_known_check() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cases = load(&repo).unwrap();
        assert!(cases.len() >= 7, "{}", cases.len());
        for c in &cases {
            crate::farm::contract::keyword_for(&c.checks).unwrap();
            assert!(!c.evidence.is_empty(), "{}", c.name);
            assert!([0, 1, 2].contains(&c.exit), "{}", c.name);
        }
        let quick: Vec<&str> = cases
            .iter()
            .filter(|c| c.quick)
            .map(|c| c.name.as_str())
            .collect();
        assert!(quick.contains(&"link-loss-no-reset") && quick.contains(&"panic-on-link-down"));
        // The throughput case measures alone; the quick ones share the host.
        let alone: Vec<&str> = cases
            .iter()
            .filter(|c| runs_alone(c))
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            alone,
            ["slow-throughput", "rx-split-dropped", "no-tx-pause"]
        );
    }

    #[test]
    fn the_verdict_state_is_read_from_the_series_line_only() {
        let out = "I: x\nother/v1: awaiting-review since t\nwrong-speed/v1: changes-requested since 2026\n";
        assert_eq!(state_of(out, "wrong-speed"), "changes-requested");
        assert_eq!(state_of(out, "panic-on-link-down"), "");
    }
}
