//! `phyfarm test`: run the farm's checks (pytest-tests/farm, with the
//! phyfarm_farm pytest plugin in harness/) on a build's outputs, then print
//! a summary table from the run's results.json.

pub mod child;
pub mod contract;
pub mod in_run;
pub mod repro;

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context, Result};

use crate::config::{Paths, Variant};
use crate::guest::accel::Accel;
use crate::kbuild::metadata;
use crate::progress::info;
use crate::results::Status;
use crate::sandbox::runtime::{shell_quote, Runtime};
use crate::Outcome;

#[derive(Debug, Clone)]
pub struct TestOptions {
    /// A build's output folder: OUT/bzImage, or OUT/<variant>/bzImage.
    pub artifacts: Option<PathBuf>,
    /// One kernel image instead of --artifacts.
    pub kernel: Option<PathBuf>,
    pub variant: Option<Variant>,
    pub workers: Option<usize>,
    pub keyword: Option<String>,
    pub accel: Accel,
    pub guest_timeout: u64,
    pub flaps: Option<u32>,
    pub device: Option<String>,
    /// The emulator binary instead of the workspace's release build.
    pub emulator: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub pytest_args: Vec<String>,
    /// Where the guest plan's build steps run (the boot initramfs).
    pub runtime: Runtime,
}

impl TestOptions {
    /// No kernels, every check, one worker, auto accelerator, the emulated
    /// adapter.
    pub fn new(runtime: Runtime) -> TestOptions {
        TestOptions {
            artifacts: None,
            kernel: None,
            variant: None,
            workers: None,
            keyword: None,
            accel: Accel::Auto,
            guest_timeout: 120,
            flaps: None,
            device: None,
            emulator: None,
            out: None,
            pytest_args: vec![],
            runtime,
        }
    }
}

/// The kernels a run covers: (variant name, bzImage).
pub fn kernels(opts: &TestOptions) -> Result<Vec<(String, PathBuf)>> {
    let want = |v: &str| opts.variant.map_or(true, |w| w.name() == v);
    if let Some(k) = &opts.kernel {
        if !k.is_file() {
            bail!(
                "kernel {} does not exist: build one with `phyfarm build --variant rust`",
                k.display()
            );
        }
        let v = opts
            .variant
            .map(|v| v.name().to_string())
            .unwrap_or_else(|| {
                variant_of(k.parent().unwrap_or(Path::new("."))).unwrap_or_else(|| "rust".into())
            });
        return Ok(vec![(v, k.clone())]);
    }
    let Some(out) = &opts.artifacts else {
        bail!("give --artifacts OUT (a `phyfarm build` output folder) or --kernel PATH");
    };
    if !out.is_dir() {
        bail!(
            "--artifacts {} is not a folder: run `phyfarm build --variant rust -o {}` first",
            out.display(),
            out.display()
        );
    }
    if out.join("bzImage").is_file() {
        let v = variant_of(out).unwrap_or_else(|| "rust".into());
        if !want(&v) {
            bail!(
                "{} holds the {v} variant, not the one --variant asks for",
                out.display()
            );
        }
        return Ok(vec![(v, out.join("bzImage"))]);
    }
    let found: Vec<(String, PathBuf)> = Variant::ALL
        .iter()
        .map(|v| v.name())
        .filter(|v| want(v))
        .map(|v| (v.to_string(), out.join(v).join("bzImage")))
        .filter(|(_, p)| p.is_file())
        .collect();
    if found.is_empty() {
        bail!(
            "no kernel in {}: expected {0}/bzImage or {0}/<variant>/bzImage (rust, c); build with `phyfarm build --variant rust -o {0}`",
            out.display()
        );
    }
    Ok(found)
}

fn variant_of(dir: &Path) -> Option<String> {
    let m: serde_json::Value = metadata::read_json(&dir.join("metadata.json")).ok()??;
    m.get("variant")?.as_str().map(str::to_string)
}

pub use crate::farm::contract::{
    FarmMeasurement as Measurement, FarmResults as Results, FarmTest as TestRecord,
};

/// The run's outcome from the statuses: any FAIL is a failed check (1); else
/// any ERROR or MISS means the run could not be completed (2).
pub fn outcome(r: &Results) -> Outcome {
    if r.tests.iter().any(|t| t.status == Status::Fail) {
        Outcome::Fail
    } else if r.tests.iter().any(|t| t.status.incomplete()) {
        Outcome::Error
    } else {
        Outcome::Pass
    }
}

/// A plain text table, one line per test.
pub fn summary_table(r: &Results) -> String {
    let mut rows: Vec<[String; 5]> = vec![[
        "CHECK".into(),
        "VARIANT".into(),
        "STATUS".into(),
        "SECONDS".into(),
        "DETAIL".into(),
    ]];
    // A KUnit case that passed is counted, not listed: a kernel has a hundred.
    let case = |t: &TestRecord| {
        t.status == Status::Pass
            && t.id
                .starts_with(&format!("{}.", crate::farm::contract::KUNIT_CHECK))
    };
    for t in r.tests.iter().filter(|t| !case(t)) {
        let detail = if t.status == Status::Pass && !t.measurements.is_empty() {
            t.measurements
                .iter()
                .take(3)
                .map(|m| format!("{}={:.3} {}", m.name, m.value, m.unit))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            t.message
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(100)
                .collect()
        };
        rows.push([
            t.id.clone(),
            t.variant.clone().unwrap_or("-".into()),
            t.status.to_string(),
            format!("{:.1}", t.duration),
            detail,
        ]);
    }
    let mut w = [0usize; 4];
    for r in &rows {
        for i in 0..4 {
            w[i] = w[i].max(r[i].len());
        }
    }
    let mut s = String::new();
    for r in &rows {
        s.push_str(&format!(
            "{:w0$}  {:w1$}  {:w2$}  {:>w3$}  {}\n",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        ));
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &r.tests {
        *counts.entry(t.status.name()).or_default() += 1;
    }
    let c: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    s.push_str(&format!("total: {}\n", c.join(", ")));
    let cases = r.tests.iter().filter(|t| case(t)).count();
    if cases > 0 {
        s.push_str(&format!("({cases} KUnit cases passed, not listed)\n"));
    }
    s
}

pub(crate) fn python(paths: &Paths) -> PathBuf {
    std::env::var_os("PHYFARM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| paths.cache.join("venv").join("bin").join("python"))
}

pub use crate::guest::plan::FORWARDED_GADGET;

/// The guest plan `phyfarm test` writes into the run's folder for the
/// harness (`--guest-plan`).
pub const GUEST_PLAN: &str = "guest-plan.json";

/// The pytest command line of a run.
pub fn pytest_argv(paths: &Paths, opts: &TestOptions, out: &Path) -> Vec<String> {
    let mut v: Vec<String> = vec![
        python(paths).display().to_string(),
        "-m".into(),
        "pytest".into(),
        paths.repo.join("pytest-tests/farm").display().to_string(),
        "--results-dir".into(),
        out.display().to_string(),
        "--junitxml".into(),
        out.join("junit.xml").display().to_string(),
        "--guest-plan".into(),
        out.join(GUEST_PLAN).display().to_string(),
        "--accel".into(),
        opts.accel.name().into(),
        "--guest-timeout".into(),
        opts.guest_timeout.to_string(),
    ];
    if let Some(k) = &opts.kernel {
        v.extend([
            "--kernel".into(),
            crate::config::absolute(k).display().to_string(),
        ]);
    }
    if let Some(a) = &opts.artifacts {
        v.extend([
            "--artifacts".into(),
            crate::config::absolute(a).display().to_string(),
        ]);
    }
    if let Some(var) = opts.variant {
        v.extend(["--variant".into(), var.name().into()]);
    }
    if let Some(f) = opts.flaps {
        v.extend(["--flaps".into(), f.to_string()]);
    }
    if let Some(d) = &opts.device {
        v.extend(["--device".into(), d.clone()]);
    }
    if let Some(n) = opts.workers.filter(|n| *n > 1) {
        v.extend(["-n".into(), n.to_string()]);
    }
    if let Some(k) = &opts.keyword {
        v.extend(["-k".into(), k.clone()]);
    }
    v.extend(opts.pytest_args.iter().cloned());
    v
}

/// Run the farm and print the summary; the last stdout line names the folder.
pub fn test(paths: &Paths, opts: &TestOptions, reproducer: &str) -> Result<Outcome> {
    let kernels = kernels(opts)?;
    let py = python(paths);
    if !py.is_file() {
        bail!(
            "no Python for the farm at {}: run `bash containers/host-setup.sh` (or set PHYFARM_PYTHON)",
            py.display()
        );
    }
    let out = match &opts.out {
        Some(o) => o.clone(),
        None => paths
            .runs_dir()
            .join(format!("test-{}", metadata::now_rfc3339().replace(':', ""))),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    // Everything the guests need, resolved here once; the harness only runs
    // checks.
    let mut req =
        crate::guest::plan::Request::for_farm(opts.accel, kernels.clone(), opts.device.as_deref());
    if let Some(e) = &opts.emulator {
        if req.emulator == crate::guest::plan::Emulator::None {
            bail!(
                "--emulator: the adapter of --device {} is forwarded, not emulated",
                opts.device.as_deref().unwrap_or_default()
            );
        }
        req.emulator = crate::guest::plan::Emulator::Given(e.clone());
    }
    let plan = crate::guest::plan::resolve(paths, opts.runtime, &req)?;
    crate::guest::plan::write(&plan, &out.join(GUEST_PLAN))?;
    let argv = pytest_argv(paths, opts, &out);
    std::fs::write(
        out.join("reproduce.sh"),
        format!("# reproduce: {reproducer}\n{}\n", shell_quote(&argv)),
    )?;
    let names: Vec<&str> = kernels.iter().map(|k| k.0.as_str()).collect();
    info(&format!(
        "farm: {} on {} ({})",
        names.join(", "),
        opts.accel.name(),
        out.display()
    ));
    // pytest's own report goes to stderr: stdout carries the summary only.
    let err = std::io::stderr().as_fd().try_clone_to_owned()?;
    let status = child::ending_with_this_thread(&argv[0])
        .args(&argv[1..])
        .current_dir(&paths.repo)
        .env("PHYFARM_CACHE", &paths.cache)
        .env("PHYFARM_REPRODUCER", reproducer)
        .stdin(Stdio::null())
        .stdout(Stdio::from(err))
        .status()
        .with_context(|| format!("cannot run {}", argv[0]))?;
    let results_path = out.join("results.json");
    let Some(results) = Results::load(&results_path)? else {
        bail!(
            "pytest ended with {status} and wrote no {}: the farm could not run",
            results_path.display()
        );
    };
    if results.tests.is_empty() {
        bail!("no farm check ran (pytest ended with {status}); is -k too narrow?");
    }
    let table = summary_table(&results);
    std::fs::write(out.join("summary.txt"), &table)?;
    print!("{table}");
    for line in contract::environment_lines(&results.environment) {
        info(&line);
    }
    let mut o = outcome(&results);
    if o == Outcome::Pass && !matches!(status.code(), Some(0)) {
        // pytest saw something the statuses do not (an internal error, an
        // interrupt): the run was not complete.
        o = Outcome::Error;
    }
    println!("{}", out.display());
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(statuses: &[&str]) -> Results {
        Results {
            schema: crate::farm::contract::FARM_SCHEMA,
            reproducer: String::new(),
            started: String::new(),
            finished: String::new(),
            duration: 0.0,
            status: Status::Pass,
            counts: BTreeMap::new(),
            tests: statuses
                .iter()
                .enumerate()
                .map(|(i, s)| TestRecord {
                    id: format!("farm.check{i}"),
                    nodeid: String::new(),
                    variant: Some("rust".into()),
                    status: Status::parse(s).unwrap(),
                    duration: 1.5,
                    message: format!("message {i}\nsecond line"),
                    measurements: vec![Measurement {
                        name: "tcp_tx".into(),
                        value: 93.25,
                        unit: "Mbit/s".into(),
                        samples: vec![],
                    }],
                    subtests: vec![],
                    logs: None,
                    accel: None,
                })
                .collect(),
            environment: BTreeMap::new(),
        }
    }

    #[test]
    fn fail_beats_error_beats_pass() {
        assert_eq!(outcome(&results(&["PASS", "SKIP"])), Outcome::Pass);
        assert_eq!(outcome(&results(&["PASS", "MISS"])), Outcome::Error);
        assert_eq!(outcome(&results(&["ERROR", "PASS"])), Outcome::Error);
        assert_eq!(outcome(&results(&["ERROR", "FAIL"])), Outcome::Fail);
    }

    #[test]
    fn table_has_a_line_per_test_and_totals() {
        let t = summary_table(&results(&["PASS", "FAIL"]));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("CHECK"));
        assert!(lines[1].contains("tcp_tx=93.250 Mbit/s"), "{t}");
        assert!(
            lines[2].contains("FAIL") && lines[2].ends_with("message 1"),
            "{t}"
        );
        assert_eq!(lines[3], "total: 1 FAIL, 1 PASS");
    }

    #[test]
    fn passing_kunit_cases_are_counted_not_listed() {
        let mut r = results(&["PASS", "PASS", "FAIL"]);
        r.tests[0].id = "farm.kunit".into();
        r.tests[1].id = "farm.kunit.suite_case_0".into();
        r.tests[2].id = "farm.kunit.suite_case_1".into();
        let t = summary_table(&r);
        assert!(!t.contains("suite_case_0"), "{t}");
        assert!(
            t.contains("farm.kunit.suite_case_1"),
            "a failed case is listed: {t}"
        );
        assert!(t.ends_with("(1 KUnit cases passed, not listed)\n"), "{t}");
    }

    fn opts(artifacts: &Path) -> TestOptions {
        TestOptions {
            artifacts: Some(artifacts.to_path_buf()),
            kernel: None,
            variant: None,
            workers: Some(2),
            keyword: Some("probe".into()),
            accel: Accel::Tcg,
            guest_timeout: 60,
            flaps: None,
            device: None,
            emulator: None,
            out: None,
            pytest_args: vec![],
            runtime: crate::sandbox::runtime::Runtime::Podman,
        }
    }

    #[test]
    fn finds_one_kernel_or_a_series_layout_and_names_what_is_missing() {
        let d = tempfile::tempdir().unwrap();
        let err = kernels(&opts(d.path())).unwrap_err().to_string();
        assert!(err.contains("no kernel in"), "{err}");
        std::fs::create_dir_all(d.path().join("c")).unwrap();
        std::fs::write(d.path().join("c/bzImage"), b"k").unwrap();
        let k = kernels(&opts(d.path())).unwrap();
        assert_eq!(k, vec![("c".to_string(), d.path().join("c/bzImage"))]);
        std::fs::write(d.path().join("bzImage"), b"k").unwrap();
        std::fs::write(d.path().join("metadata.json"), br#"{"variant":"c"}"#).unwrap();
        let k = kernels(&opts(d.path())).unwrap();
        assert_eq!(k[0].0, "c");
        let mut o = opts(d.path());
        o.variant = Some(Variant::Rust);
        assert!(kernels(&o).is_err());
        let mut o = opts(d.path());
        o.artifacts = None;
        o.kernel = Some(d.path().join("nope"));
        assert!(kernels(&o)
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
    }

    #[test]
    fn pytest_argv_passes_workers_keyword_and_results_dir() {
        let paths = Paths {
            repo: PathBuf::from("/r"),
            cache: PathBuf::from("/c"),
        };
        let v = pytest_argv(&paths, &opts(Path::new("/a")), Path::new("/o"));
        let s = v.join(" ");
        assert!(
            s.starts_with("/c/venv/bin/python -m pytest /r/pytest-tests/farm"),
            "{s}"
        );
        assert!(
            s.contains("--results-dir /o --junitxml /o/junit.xml"),
            "{s}"
        );
        assert!(s.contains("--artifacts /a"), "{s}");
        assert!(s.contains("-n 2") && s.contains("-k probe"), "{s}");
        assert!(s.contains("--guest-plan /o/guest-plan.json"), "{s}");
    }
}
