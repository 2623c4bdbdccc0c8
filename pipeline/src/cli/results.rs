//! The results verbs: `verdict`, `review`, `export`, `b4-ci-check` and
//! `store import|recover|list`. They need no repository checkout (b4 runs
//! them from a kernel tree), only the store.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args, Subcommand, ValueEnum};

use crate::export;
use crate::results::review::FirstBad;
use crate::results::{RevisionRef, Run, Timestamp};
use crate::store::{store_path, OpenMode, Store};
use crate::verdict::{self, Review, ReviewKind};
use crate::Outcome;

/// Default dashboard address used in links (patchwork target_url, b4 url).
pub const DEFAULT_DASHBOARD_URL: &str = "http://127.0.0.1:8080";

#[derive(Debug, Subcommand)]
pub enum ResultsCommand {
    /// Bring revision verdicts up to date (storing every state change) and
    /// print them: state, why, new failures, fixed, flaky, measurements.
    /// For the one revision asked for, the exit code is its state's: 0
    /// awaiting review, ready to merge or superseded, 1 changes requested,
    /// 2 testing (not complete)
    Verdict(VerdictArgs),
    /// Record an ack or a nack (an objection) of a revision
    Review(ReviewArgs),
    /// Record the first bad patch a bisection found for a farm check of a
    /// revision (`phyfarm watch` bisects; the verdict, exports and pages
    /// show it). The same finding is recorded once.
    #[command(name = "first-bad")]
    FirstBad(FirstBadArgs),
    /// Export a revision's results as KCIDB v5 JSON, patchwork checks,
    /// JUnit XML or a markdown summary
    Export(ExportArgs),
    /// b4 CI-check command: reads one patch email on stdin and prints b4's
    /// JSON for it (set b4.review-perpatch-check-cmd = "phyfarm b4-ci-check")
    #[command(name = "b4-ci-check")]
    B4CiCheck(B4Args),
    /// The results store
    #[command(subcommand)]
    Store(StoreCommand),
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Record runs from results.json files, each in one transaction
    Import {
        #[arg(required = true, value_name = "RESULTS.json")]
        files: Vec<PathBuf>,
    },
    /// Record runs whose writer died (on this host) as interrupted (MISS)
    Recover,
    /// Create the store or bring its schema up to date, then say its
    /// version (for PostgreSQL: run it with the owner role, not a runner's)
    Migrate,
    /// List revisions with their runs and current state
    List,
}

#[derive(Debug, Args)]
pub struct VerdictArgs {
    /// `<series-name>/v<N>` or `<change-id>/v<N>` [default: every revision]
    pub revision: Option<RevisionRef>,
    /// The time to evaluate at, RFC 3339 (2026-06-15T10:00:00Z) or @SECONDS;
    /// earlier than the last recorded transition is refused [default: now]
    #[arg(long, value_name = "TIME")]
    pub now: Option<Timestamp>,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("kind").required(true).args(["ack", "nack"])))]
pub struct ReviewArgs {
    /// Acknowledge REVISION
    #[arg(long, value_name = "REVISION")]
    pub ack: Option<RevisionRef>,
    /// Object to REVISION: it becomes changes-requested
    #[arg(long, value_name = "REVISION")]
    pub nack: Option<RevisionRef>,
    /// Who reviews, e.g. "Jakub Kicinski <kuba@kernel.org>"
    #[arg(long, value_name = "NAME")]
    pub by: String,
    /// Why, in one line
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// When [default: now]
    #[arg(long, value_name = "TIME")]
    pub now: Option<Timestamp>,
}

#[derive(Debug, Args)]
pub struct FirstBadArgs {
    /// `<series-name>/v<N>` or `<change-id>/v<N>`
    pub revision: RevisionRef,
    /// The farm check, as the verdict names it: `farm.link_flap[plain]`
    pub check: String,
    /// The variant it fails on
    #[arg(long, value_enum)]
    pub variant: Option<crate::config::Variant>,
    /// The first patch that fails it, from 1
    #[arg(long, value_name = "N")]
    pub patch: u32,
    /// How it was found, in one line: the steps and what each gave
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub how: String,
    /// When [default: now]
    #[arg(long, value_name = "TIME")]
    pub now: Option<Timestamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// KCIDB v5 JSON: checkouts, builds, tests
    Kcidb,
    /// Patchwork checks per patch (context, state, description, target_url)
    Patchwork,
    /// JUnit XML
    Junit,
    /// Markdown summary for a pull-request comment or check run
    Markdown,
}

#[derive(Debug, Args)]
pub struct LinkArgs {
    /// Dashboard base URL for links (`<URL>/series/<name>/v<N>`)
    #[arg(long, env = "PHYFARM_DASHBOARD_URL", default_value = DEFAULT_DASHBOARD_URL, value_name = "URL")]
    pub dashboard_url: String,
    /// Evaluate the verdict at this time [default: now]
    #[arg(long, value_name = "TIME")]
    pub now: Option<Timestamp>,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[arg(value_enum)]
    pub format: ExportFormat,
    /// `<series-name>/v<N>` or `<change-id>/v<N>` [default: the most recently recorded]
    pub revision: Option<RevisionRef>,
    /// Write to FILE (atomically) instead of stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub link: LinkArgs,
}

#[derive(Debug, Args)]
pub struct B4Args {
    #[command(flatten)]
    pub link: LinkArgs,
}

fn open(path: &Path, mode: OpenMode) -> Result<Box<dyn Store>> {
    Ok(crate::store::open(path, mode)?)
}

fn link_now(now: Option<Timestamp>) -> Timestamp {
    now.unwrap_or_else(Timestamp::now)
}

/// Write `text` to `output` atomically, or to stdout.
fn emit(text: &str, output: Option<&Path>) -> Result<()> {
    use std::io::Write;
    match output {
        Some(p) => {
            let dir = p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let mut tmp = tempfile::NamedTempFile::new_in(dir)
                .with_context(|| format!("-o {}: cannot write there", p.display()))?;
            tmp.write_all(text.as_bytes())
                .and_then(|_| tmp.as_file().sync_all())
                .with_context(|| format!("-o {}", p.display()))?;
            tmp.persist(p)
                .map_err(|e| e.error)
                .with_context(|| format!("-o {}", p.display()))?;
            Ok(())
        }
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                r => Ok(r?),
            }
        }
    }
}

// Long: one arm per results subcommand.
/// Run one results verb. `store` and `cache` are the global options.
pub fn run(store: Option<PathBuf>, cache: Option<PathBuf>, cmd: ResultsCommand) -> Result<Outcome> {
    let path = store_path(store, cache)?;
    match cmd {
        ResultsCommand::Store(StoreCommand::Import { files }) => {
            // Every file is read and checked as `phyfarm record` checks what
            // it records, then all runs go in one transaction: a refused
            // file (or run) records none of them.
            let mut runs = Vec::new();
            let mut seen = std::collections::BTreeMap::new();
            for f in &files {
                let run = Run::load(f)?;
                crate::run::trust::check_stored_run(f, &run)?;
                if let Some(first) = seen.insert(run.id.clone(), f.clone()) {
                    bail!(
                        "{}: id: run {} is also in {}; nothing was recorded",
                        f.display(),
                        run.id,
                        first.display()
                    );
                }
                runs.push(run);
            }
            let mut st = open(&path, OpenMode::Create)?;
            st.record_runs(&runs)
                .context("store import: nothing was recorded")?;
            for run in &runs {
                let what = run
                    .reference()
                    .map_or(format!("base {}", run.base), |r| r.to_string());
                eprintln!(
                    "I: recorded run {} ({what}) in {}",
                    run.id,
                    crate::store::display_location(&path)
                );
            }
            Ok(Outcome::Pass)
        }
        ResultsCommand::Store(StoreCommand::Migrate) => {
            drop(open(&path, OpenMode::Create)?);
            let version = if crate::store::is_postgres(&path) {
                crate::store::PG_SCHEMA_VERSION
            } else {
                crate::store::SCHEMA_VERSION
            };
            eprintln!(
                "I: store {} is at schema version {version}",
                crate::store::display_location(&path)
            );
            Ok(Outcome::Pass)
        }
        ResultsCommand::Store(StoreCommand::Recover) => {
            let mut st = open(&path, OpenMode::Existing)?;
            for id in st.recover()? {
                eprintln!("I: run {id} recorded as interrupted (MISS)");
            }
            Ok(Outcome::Pass)
        }
        ResultsCommand::Store(StoreCommand::List) => {
            let st = open(&path, OpenMode::Existing)?;
            let mut text = String::new();
            for rev in st.revisions()? {
                let r = rev.reference();
                let runs = st.runs(&r)?;
                let state = st
                    .transitions(&r)?
                    .last()
                    .map_or("-".to_string(), |t| t.state.to_string());
                text.push_str(&format!(
                    "{r:40} {state:18} runs {:3}  {} patches  recorded {}\n",
                    runs.len(),
                    rev.info.patches.len(),
                    rev.created
                ));
            }
            emit(&text, None)?;
            Ok(Outcome::Pass)
        }
        ResultsCommand::Verdict(a) => {
            let mut st = open(&path, OpenMode::Existing)?;
            let now = link_now(a.now);
            let reports = match &a.revision {
                Some(r) => vec![verdict::advance(st.as_mut(), r, now)?],
                None => verdict::advance_all(st.as_mut(), now)?,
            };
            let text = if a.json {
                let v = match (&a.revision, reports.as_slice()) {
                    (Some(_), [one]) => serde_json::to_value(one)?,
                    _ => serde_json::to_value(&reports)?,
                };
                serde_json::to_string_pretty(&v)? + "\n"
            } else {
                reports
                    .iter()
                    .map(verdict::render_text)
                    .collect::<Vec<_>>()
                    .join("")
            };
            emit(&text, None)?;
            // One revision: its state decides (verdict::outcome); the list
            // of all of them is a report and exits 0.
            Ok(match (&a.revision, reports.as_slice()) {
                (Some(_), [one]) => verdict::outcome(one.state),
                _ => Outcome::Pass,
            })
        }
        ResultsCommand::Review(a) => {
            let (r, kind) = match (a.ack, a.nack) {
                (Some(r), None) => (r, ReviewKind::Ack),
                (None, Some(r)) => (r, ReviewKind::Nack),
                _ => bail!("give exactly one of --ack REVISION or --nack REVISION"),
            };
            if a.by.trim().is_empty() || a.reason.trim().is_empty() {
                bail!("--by and --reason must not be empty");
            }
            let mut st = open(&path, OpenMode::Existing)?;
            let now = link_now(a.now);
            let review = Review {
                at: now,
                by: a.by.trim().to_string(),
                kind,
                reason: a.reason.trim().to_string(),
            };
            // The verdicts job reads every open pull request's reviews on
            // each run: the same review (reviewer, kind, reason) is
            // recorded once.
            let recorded = st
                .reviews(&r)?
                .iter()
                .any(|x| x.by == review.by && x.kind == review.kind && x.reason == review.reason);
            if recorded {
                eprintln!(
                    "I: {r}: this {} by {} is already recorded; nothing was changed",
                    format!("{kind:?}").to_lowercase(),
                    review.by
                );
            } else {
                verdict::review(st.as_mut(), &r, &review)?;
            }
            let rep = verdict::advance(st.as_mut(), &r, now)?;
            emit(&verdict::render_text(&rep), None)?;
            Ok(Outcome::Pass)
        }
        ResultsCommand::FirstBad(a) => {
            let mut st = open(&path, OpenMode::Existing)?;
            let now = link_now(a.now);
            let f = FirstBad {
                at: now,
                check: a.check,
                variant: a.variant.map(|v| v.name().to_string()),
                patch: a.patch,
                how: a.how.split_whitespace().collect::<Vec<_>>().join(" "),
            };
            let recorded = st.first_bad(&a.revision)?.iter().any(|x| {
                (&x.check, &x.variant, x.patch, &x.how) == (&f.check, &f.variant, f.patch, &f.how)
            });
            if recorded {
                eprintln!(
                    "I: {}: this first bad patch is already recorded; nothing was changed",
                    a.revision
                );
            } else {
                st.add_first_bad(&a.revision, &f)?;
            }
            let rep = verdict::advance(st.as_mut(), &a.revision, now)?;
            emit(&verdict::render_text(&rep), None)?;
            Ok(Outcome::Pass)
        }
        ResultsCommand::Export(a) => {
            let st = open(&path, OpenMode::Existing)?;
            let r = match a.revision {
                Some(r) => r,
                None => st
                    .revisions()?
                    .into_iter()
                    .max_by_key(|r| (r.created, r.info.version))
                    .map(|r| r.reference())
                    .with_context(|| {
                        format!(
                            "store {} has no revisions to export",
                            crate::store::display_location(&path)
                        )
                    })?,
            };
            let bundle = export::Bundle::gather(
                st.as_ref(),
                &r,
                link_now(a.link.now),
                &a.link.dashboard_url,
            )?;
            let text = match a.format {
                ExportFormat::Kcidb => {
                    serde_json::to_string_pretty(&export::kcidb::export(&bundle))? + "\n"
                }
                ExportFormat::Patchwork => {
                    serde_json::to_string_pretty(&export::patchwork::export(&bundle))? + "\n"
                }
                ExportFormat::Junit => export::junit::export(&bundle),
                ExportFormat::Markdown => export::markdown::export(&bundle),
            };
            emit(&text, a.output.as_deref())?;
            Ok(Outcome::Pass)
        }
        ResultsCommand::B4CiCheck(a) => {
            let mut mail = Vec::new();
            std::io::stdin()
                .lock()
                .take(crate::ingest::series::MAX_PATCH_BYTES + 1)
                .read_to_end(&mut mail)
                .context("reading the patch email on stdin")?;
            if mail.len() as u64 > crate::ingest::series::MAX_PATCH_BYTES {
                bail!(
                    "stdin: the email is larger than {} bytes",
                    crate::ingest::series::MAX_PATCH_BYTES
                );
            }
            let st = open(&path, OpenMode::Existing)?;
            let v = export::b4::check(
                st.as_ref(),
                &mail,
                link_now(a.link.now),
                &a.link.dashboard_url,
            )?;
            emit(&(serde_json::to_string(&v)? + "\n"), None)?;
            Ok(Outcome::Pass)
        }
    }
}
