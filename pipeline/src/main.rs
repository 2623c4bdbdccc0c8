//! `phyfarm`: thin entry point. Parses the command line and calls the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    unset_empty_settings();
    let cli = phyfarm::cli::Cli::parse();
    match phyfarm::cli::run(cli) {
        Ok(outcome) => ExitCode::from(outcome.code()),
        Err(err) => {
            let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
            eprintln!("E: {}", chain.join(": "));
            ExitCode::from(phyfarm::Outcome::Error.code())
        }
    }
}

/// An empty `PHYFARM_*` setting (`PHYFARM_STORE=`) is the same as an unset
/// one, as for most tools; clap would refuse it as a missing value even
/// beside the option given on the command line. Called before parsing,
/// while the process has one thread.
fn unset_empty_settings() {
    for (k, v) in std::env::vars_os() {
        if v.is_empty() && k.to_string_lossy().starts_with("PHYFARM_") {
            std::env::remove_var(k);
        }
    }
}
