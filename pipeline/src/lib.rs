//! phyfarm: CI and emulation test farm for Linux kernel Rust network PHY work.
//!
//! The binary is a thin layer over this library; every verb of the CLI is a
//! function here, so tests drive the same code the user runs.

pub mod accel;
pub mod apply;
pub mod boot;
pub mod cli;
pub mod config;
pub mod contract;
pub mod cpio;
pub mod doctor;
pub mod export;
pub mod farm;
pub mod farm_record;
pub mod guest;
pub mod images;
pub mod kconfig;
pub mod kernel;
pub mod metadata;
pub mod progress;
pub mod record;
pub mod results;
pub mod run;
pub mod run_folder;
pub mod runtime;
pub mod safe_fs;
pub mod sandbox;
pub mod selftest;
pub mod series;
pub mod series_build;
pub mod series_changed;
pub mod stats;
pub mod store;
pub mod verdict;
pub mod warnings;

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
