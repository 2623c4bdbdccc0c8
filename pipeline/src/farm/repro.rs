//! `phyfarm repro`: one farm check again, on this machine, from what a run
//! recorded: its farm folder's results.json (the check's pytest node), its
//! guest plan (kernels, guest image, emulator, accelerator, machine) with
//! the SHA-256 of every file in it, and its options (environment.json).
//! Nothing is refetched or rebuilt; a file that changed since the run is
//! refused by name. The new results go to a folder of their own, so the
//! recorded logs stay as they were.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::config::{Paths, Variant};
use crate::farm::contract::FarmResults;
use crate::farm::{TestRecord, GUEST_PLAN};
use crate::guest::plan::GuestPlan;
use crate::progress::{info, printable, warn};
use crate::results::Status;
use crate::Outcome;

/// What to rerun.
#[derive(Debug, Clone)]
pub struct Options {
    /// For messages: `<series>/v<N>`.
    pub revision: String,
    pub check: String,
    pub variant: Option<Variant>,
    /// Farm result folders to look in, best first (`farm/`, `farm-retry/`…).
    pub folders: Vec<PathBuf>,
    pub shell: bool,
    pub out: Option<PathBuf>,
}

/// The farm folders of a run folder (or of its `base/`), the retries last.
pub fn farm_folders(run: &Path) -> Vec<PathBuf> {
    [
        "farm",
        "farm-throughput",
        "farm-retry",
        "farm-throughput-retry",
    ]
    .iter()
    .map(|f| run.join(f))
    .filter(|d| d.join("results.json").is_file())
    .collect()
}

/// The check found in a farm folder.
#[derive(Debug)]
pub struct Found {
    pub folder: PathBuf,
    pub record: TestRecord,
}

/// The recorded result of the check, from the first folder that has it.
/// Without a variant, the one where it did not pass; both not passing, or
/// both passing, needs --variant.
pub fn find(opts: &Options) -> Result<Found> {
    if opts.check.starts_with("farm.differential.") {
        bail!(
            "{} compares the rust and c runs of a check: reproduce that check with --variant rust and --variant c",
            opts.check
        );
    }
    if !opts.check.starts_with("farm.") {
        bail!(
            "{} is not a farm check: apply, build, gate and boot checks are rerun by `phyfarm run` on the series",
            opts.check
        );
    }
    if opts.folders.is_empty() {
        bail!(
            "no recorded farm results for {}: give the run folder with --run DIR",
            opts.revision
        );
    }
    for folder in &opts.folders {
        let path = folder.join("results.json");
        let Some(results) = FarmResults::load(&path)? else {
            continue;
        };
        let want = opts.variant.map(Variant::name);
        let all: Vec<&TestRecord> = results
            .tests
            .iter()
            .filter(|t| t.id == opts.check && (want.is_none() || t.variant.as_deref() == want))
            .collect();
        if all.is_empty() {
            continue;
        }
        let failing: Vec<&TestRecord> = all
            .iter()
            .copied()
            .filter(|t| t.status != Status::Pass)
            .collect();
        let pick = match (all.len(), failing.len()) {
            (1, _) => all[0],
            (_, 1) => failing[0],
            _ => {
                let vs: Vec<String> = all
                    .iter()
                    .map(|t| {
                        format!(
                            "{} {}",
                            t.variant.as_deref().unwrap_or("-"),
                            t.status.name()
                        )
                    })
                    .collect();
                bail!(
                    "{} ran on several variants ({}): choose one with --variant",
                    opts.check,
                    vs.join(", ")
                );
            }
        };
        return Ok(Found {
            folder: folder.clone(),
            record: pick.clone(),
        });
    }
    let where_: Vec<String> = opts
        .folders
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    bail!(
        "{}{} is not among the recorded results in {}",
        opts.check,
        opts.variant
            .map(|v| format!(" (variant {})", v.name()))
            .unwrap_or_default(),
        where_.join(", ")
    )
}

/// A pytest node of the farm's own checks, nothing else:
/// `pytest-tests/farm/<file>.py::<test>[<params>]`.
pub fn valid_nodeid(n: &str) -> bool {
    let Some(rest) = n.strip_prefix("pytest-tests/farm/") else {
        return false;
    };
    let Some((file, test)) = rest.split_once("::") else {
        return false;
    };
    let word = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let file_ok = file.strip_suffix(".py").is_some_and(word);
    let (name, params) = match test.split_once('[') {
        Some((name, p)) => (name, p.strip_suffix(']')),
        None => (test, Some("x")),
    };
    file_ok
        && word(name)
        && params.is_some_and(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.,=+-".contains(&b))
        })
}

/// Every file of the guest plan against its recorded SHA-256. Returns how
/// many were checked; a plan from before hashes were recorded checks none.
pub fn verify_plan(plan: &GuestPlan, variant: &str) -> Result<usize> {
    let Some(files) = plan.files(variant) else {
        bail!("the guest plan has no {variant} kernel");
    };
    if plan.sha256.is_empty() {
        return Ok(0);
    }
    for path in &files {
        let f = path.display();
        let Some(want) = plan.sha256.get(&f.to_string()) else {
            bail!("the guest plan records no SHA-256 for {f}");
        };
        if !path.is_file() {
            bail!("{f} is gone since the run: run the series again (`phyfarm run`)");
        }
        let got = crate::guest::plan::file_sha256(path)?;
        if &got != want {
            bail!(
                "{f} changed since the run (sha256 {} recorded, {} now): run the series again (`phyfarm run`)",
                &want[..want.len().min(12)],
                &got[..12]
            );
        }
    }
    Ok(files.len())
}

/// The emulator's command line in a check's logs (procs.json), without the
/// per-run paths (sockets, capture and ready files) and the binary's path.
pub fn emulator_args(logs: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(logs.join("procs.json")).ok()?;
    let procs: serde_json::Value = serde_json::from_str(&text).ok()?;
    let argv = procs
        .as_array()?
        .iter()
        .find(|p| p["name"] == "ax88772-emu")?["argv"]
        .as_array()?
        .iter()
        .map(|a| a.as_str().unwrap_or("").to_string())
        .collect::<Vec<_>>();
    let per_run = [
        "--listen",
        "--wire",
        "--ctl",
        "--capture-dir",
        "--ready-file",
    ];
    let mut out = vec![];
    let mut it = argv.into_iter().skip(1);
    while let Some(a) = it.next() {
        let name = a.split('=').next().unwrap_or("");
        if per_run.contains(&name) {
            if !a.contains('=') {
                it.next();
            }
            continue;
        }
        out.push(a);
    }
    Some(out)
}

/// Rerun the check; print what was recorded and what happened now.
pub fn repro(paths: &Paths, opts: &Options) -> Result<Outcome> {
    let (found, variant) = find_node(opts)?;
    let (plan_path, plan) = verified_plan(&found, &variant)?;
    let env_path = found.folder.join("environment.json");
    let env: serde_json::Value = crate::jsonfile::read_json(&env_path)
        .with_context(|| format!("cannot read {}", env_path.display()))?
        .unwrap_or(serde_json::Value::Null);
    let out = repro_folder(&found, opts)?;
    let rerun = Rerun {
        paths,
        opts,
        found,
        variant,
        plan_path,
        plan,
        out,
    };
    let argv = rerun.pytest_argv(&env);
    let again = rerun.run(&argv)?;
    rerun.report(&again)
}

/// The recorded check ([`find`]) and its variant, refused unless its
/// pytest node is one of the farm's own.
fn find_node(opts: &Options) -> Result<(Found, String)> {
    let found = find(opts)?;
    let rec = &found.record;
    let variant = rec.variant.clone().unwrap_or_else(|| "rust".into());
    if !valid_nodeid(&rec.nodeid) {
        bail!(
            "{}: the recorded pytest node of {} is {:?}, not one of pytest-tests/farm",
            found.folder.join("results.json").display(),
            opts.check,
            printable(&rec.nodeid)
        );
    }
    Ok((found, variant))
}

/// The run's guest plan and its path, every file checked against the
/// SHA-256 it recorded ([`verify_plan`]).
fn verified_plan(found: &Found, variant: &str) -> Result<(PathBuf, GuestPlan)> {
    let plan_path = found.folder.join(GUEST_PLAN);
    if !plan_path.is_file() {
        bail!("{} is missing", plan_path.display());
    }
    let plan = GuestPlan::read(&plan_path)?;
    match verify_plan(&plan, variant)? {
        0 => warn(&format!(
            "{} records no SHA-256 (a run before phyfarm recorded them): its files are used as they are now",
            plan_path.display()
        )),
        n => info(&format!(
            "repro: {n} files of the guest plan match the run's SHA-256"
        )),
    }
    Ok((plan_path, plan))
}

/// The folder the new results go to (`-o`, or a new one under `repro/`
/// beside the farm folder), created; one that holds results is refused.
fn repro_folder(found: &Found, opts: &Options) -> Result<PathBuf> {
    let out = match &opts.out {
        Some(o) => o.clone(),
        None => found
            .folder
            .parent()
            .unwrap_or(&found.folder)
            .join("repro")
            .join(crate::kbuild::metadata::now_rfc3339().replace(':', "")),
    };
    if out.join("results.json").exists() {
        bail!("{} already holds results: give another -o", out.display());
    }
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    Ok(out)
}

/// A rerun under way: the recorded check and its variant, the run's guest
/// plan, and the folder the new results go to.
struct Rerun<'a> {
    paths: &'a Paths,
    opts: &'a Options,
    found: Found,
    variant: String,
    plan_path: PathBuf,
    plan: GuestPlan,
    out: PathBuf,
}

impl Rerun<'_> {
    /// pytest on the recorded node, with the run's guest plan, artifacts,
    /// accelerator and options (`env`: its environment.json).
    fn pytest_argv(&self, env: &serde_json::Value) -> Vec<String> {
        let (paths, out) = (self.paths, &self.out);
        // The run's artifacts (the KUnit kernel is found there) are the farm
        // folder's parent: the run folder or its base/.
        let artifacts = self.found.folder.parent().unwrap_or(&self.found.folder);
        let mut argv: Vec<String> = vec![
            crate::farm::python(paths).display().to_string(),
            "-m".into(),
            "pytest".into(),
            paths
                .repo
                .join(&self.found.record.nodeid)
                .display()
                .to_string(),
            "--results-dir".into(),
            out.display().to_string(),
            "--junitxml".into(),
            out.join("junit.xml").display().to_string(),
            "--guest-plan".into(),
            self.plan_path.display().to_string(),
            "--artifacts".into(),
            artifacts.display().to_string(),
            "--accel".into(),
            self.plan.accel.name().to_string(),
            "-p".into(),
            "no:cacheprovider".into(),
        ];
        if let Some(t) = env["guest_timeout"].as_f64() {
            argv.extend(["--guest-timeout".into(), t.to_string()]);
        }
        if let Some(f) = env["flaps"].as_u64() {
            argv.extend(["--flaps".into(), f.to_string()]);
        }
        if let Some(d) = env["device"].as_str() {
            argv.extend(["--device".into(), d.to_string()]);
        }
        if self.opts.shell {
            argv.extend(["-s".into(), "--shell".into()]);
        }
        argv
    }

    /// Write `reproduce.sh`, run pytest (`argv`) and return the check's new
    /// record from the results it wrote.
    fn run(&self, argv: &[String]) -> Result<TestRecord> {
        let (opts, rec, variant) = (self.opts, &self.found.record, &self.variant);
        std::fs::write(
            self.out.join("reproduce.sh"),
            format!(
                "# reproduce: {}\n{}\n",
                crate::results::repro_command(&opts.revision, &opts.check, Some(variant))
                    .unwrap_or_default(),
                crate::sandbox::runtime::shell_quote(argv)
            ),
        )?;
        info(&format!(
            "repro: {} ({variant}) of {}, recorded {} in {}",
            opts.check,
            opts.revision,
            rec.status.name(),
            self.found.folder.display()
        ));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&self.paths.repo)
            .env("PHYFARM_CACHE", &self.paths.cache);
        if !opts.shell {
            // pytest's report goes to stderr; stdout carries the comparison.
            let err = std::os::fd::AsFd::as_fd(&std::io::stderr()).try_clone_to_owned()?;
            cmd.stdin(Stdio::null()).stdout(Stdio::from(err));
        }
        let status = cmd
            .status()
            .with_context(|| format!("cannot run {}", argv[0]))?;
        let results_path = self.out.join("results.json");
        let Some(now) = FarmResults::load(&results_path)? else {
            bail!(
                "pytest ended with {status} and wrote no {}: the check could not run",
                results_path.display()
            );
        };
        let Some(again) = now
            .tests
            .into_iter()
            .find(|t| t.id == rec.id && t.variant == rec.variant)
        else {
            bail!(
                "pytest ended with {status} and {} has no {} ({variant})",
                results_path.display(),
                rec.id
            );
        };
        Ok(again)
    }

    /// Print (and keep in `repro.txt`) what was recorded and what happened
    /// now, with the emulator's arguments compared; the outcome is now's.
    fn report(&self, again: &TestRecord) -> Result<Outcome> {
        let (opts, rec, variant) = (self.opts, &self.found.record, &self.variant);
        // "FAIL in call: …" already says its status.
        let said = |t: &TestRecord| -> String {
            let line = t.message.lines().next().unwrap_or("");
            let line = if line.starts_with(t.status.name()) {
                line.to_string()
            } else {
                format!("{} {line}", t.status.name())
            };
            printable(line.trim_end()).chars().take(200).collect()
        };
        let mut report = format!(
            "{} ({variant}) of {}\n  recorded: {}\n  now:      {}\n",
            opts.check,
            opts.revision,
            said(rec),
            said(again),
        );
        let logs_of = |t: &TestRecord| t.logs.as_deref().map(PathBuf::from);
        match (
            logs_of(rec).and_then(|l| emulator_args(&l)),
            logs_of(again).and_then(|l| emulator_args(&l)),
        ) {
            (Some(a), Some(b)) if a == b => report.push_str(&format!(
                "  emulator arguments: as recorded ({})\n",
                if a.is_empty() {
                    "none beyond the defaults".into()
                } else {
                    a.join(" ")
                }
            )),
            (Some(a), Some(b)) => report.push_str(&format!(
                "  emulator arguments: differ: recorded {} now {}\n",
                printable(&a.join(" ")),
                printable(&b.join(" "))
            )),
            _ => {
                report.push_str("  emulator arguments: not compared (no procs.json on one side)\n")
            }
        }
        if let Some(l) = &again.logs {
            report.push_str(&format!("  logs: {l}\n"));
        }
        print!("{report}");
        std::fs::write(self.out.join("repro.txt"), &report)?;
        println!("{}", self.out.display());
        Ok(match again.status {
            Status::Pass => Outcome::Pass,
            Status::Fail => Outcome::Fail,
            _ => Outcome::Error,
        })
    }
}

#[cfg(test)]
mod tests;
