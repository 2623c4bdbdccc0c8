//! `phyfarm-dashboard serve | export`: the dashboards over a results store.
//! `phyfarm serve` and `phyfarm dashboard export` run this binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use dashboards::app::{self, AppState};
use dashboards::export;
use dashboards::source::Source;
use phyfarm::results::Timestamp;

/// phyfarm's dashboards: series verdicts with the three-day clock,
/// revisions against the base and the previous revision, runs with their
/// logs, trends and the farm, as web pages and JSON.
///
/// Exit codes: 0 done, 2 could not serve or export.
#[derive(Debug, Parser)]
#[command(name = "phyfarm-dashboard", version, max_term_width = 100)]
struct Cli {
    /// Results store: an SQLite file or a postgresql:// URL
    /// [default: <cache>/results.sqlite]
    #[arg(long, global = true, env = "PHYFARM_STORE", value_name = "PATH|URL")]
    store: Option<PathBuf>,
    /// Cache directory holding the default store
    /// [default: $XDG_CACHE_HOME/phyfarm or ~/.cache/phyfarm]
    #[arg(long, global = true, env = "PHYFARM_CACHE", value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Evaluate verdicts and clocks at this time (RFC 3339 or @SECONDS)
    /// instead of now
    #[arg(long, global = true, value_name = "TIME")]
    now: Option<Timestamp>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the dashboard (read-only) until Ctrl-C
    Serve {
        /// Address to listen on; only loopback unless you say otherwise
        /// (port 0 picks a free port, printed on stdout)
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
        listen: SocketAddr,
    },
    /// Write every page as static HTML and JSON into DIR (for GitHub Pages)
    Export {
        /// Output folder (created if missing; existing pages are replaced)
        dir: PathBuf,
        /// Absolute URL (or path) the folder will be published at; links
        /// are relative without it
        #[arg(long, value_name = "URL")]
        base_url: Option<String>,
    },
}

fn run(cli: Cli) -> Result<()> {
    let store = phyfarm::store::store_path(cli.store, cli.cache)?;
    let mut source = Source::new(&store);
    let name = source.name().to_string();
    match cli.command {
        Command::Serve { listen } => {
            if !app::is_loopback(&listen) {
                eprintln!(
                    "W: listening on {listen}: the dashboard is reachable from other machines"
                );
            }
            if !phyfarm::store::is_postgres(&store) && !store.exists() {
                eprintln!(
                    "W: no results store at {name} yet: the pages say how to run the first job"
                );
            }
            let state = AppState::new(source, cli.now);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(app::serve(state, listen, |addr| {
                eprintln!("I: dashboard of {name} at http://{addr}/ (Ctrl-C stops)");
                println!("http://{addr}/");
                use std::io::Write;
                let _ = std::io::stdout().flush();
            }))
            .with_context(|| format!("serving on {listen}"))?;
            Ok(())
        }
        Command::Export { dir, base_url } => {
            let now = cli.now.unwrap_or_else(Timestamp::now);
            let s = export::export(&mut source, &dir, base_url.as_deref(), now)?;
            for p in &s.skipped {
                eprintln!("W: page {p} left out: its name cannot be a file name");
            }
            eprintln!("I: {} pages (HTML and JSON) of {name}", s.pages);
            println!("{}", dir.join("index.html").display());
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    // An empty PHYFARM_STORE= is the same as an unset one (clap would
    // refuse it as a missing value even beside --store).
    for (k, v) in std::env::vars_os() {
        if v.is_empty() && k.to_string_lossy().starts_with("PHYFARM_") {
            std::env::remove_var(k);
        }
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("E: {e:#}");
            ExitCode::from(2)
        }
    }
}
