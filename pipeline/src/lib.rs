//! phyfarm: CI and emulation test farm for Linux kernel Rust network PHY work.
//!
//! The binary is a thin layer over this library; every verb of the CLI is a
//! function here, so tests drive the same code the user runs.

// The folders follow a revision through `phyfarm run`, stage by stage.
pub mod cli; // the verbs
pub mod export; // KCIDB, patchwork, JUnit, markdown, b4
pub mod farm; // the checks: plan, the harness's results contract, base reuse
pub mod guest; // the guest: initramfs, boot, accelerator
pub mod ingest; // the series: parse, refuse bad input, what changed
pub mod kbuild; // the distro tree: apply, build per patch, the Rust gates
pub mod results; // the results model every stage speaks
pub mod run; // one run end to end, its folder, recording it, the self-test
pub mod store; // where results are kept: SQLite or PostgreSQL, append-only
pub mod verdict; // what the results mean: comparisons, flakes, the 72 h clock

// Shared by every stage.
pub mod config;
pub mod jsonfile; // JSON files written atomically and read back
pub mod progress;
pub mod run_folder; // the layout of a run folder, which every stage writes into
pub mod sandbox; // containers, and files read without following links

/// How a run ended, shared by the CLI and the test harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Outcome {
    /// Everything passed.
    Pass,
    /// A check failed: the code under test is wrong.
    Fail,
    /// The run could not be completed: bad input, infrastructure, usage.
    Error,
}

impl Outcome {
    /// The process exit code: 0 pass, 1 a check failed, 2 could not run.
    pub fn code(self) -> u8 {
        match self {
            Outcome::Pass => 0,
            Outcome::Fail => 1,
            Outcome::Error => 2,
        }
    }
}
