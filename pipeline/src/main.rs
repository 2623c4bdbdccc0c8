//! `phyfarm`: thin entry point. Parses the command line and calls the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    phyfarm::cli::unset_empty_settings();
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
