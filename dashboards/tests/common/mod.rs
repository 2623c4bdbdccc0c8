//! A fixture store: the shipped series' v7 and v8 with their base run
//! (pipeline/tests/fixtures/results), and a hostile series whose subject,
//! author, file name and logs try to inject markup and terminal escapes.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use phyfarm::results::{
    BuildResult, Environment, Measurement, PatchInfo, RevisionInfo, Run, Status, TestResult,
    RESULTS_SCHEMA,
};
use phyfarm::store::{OpenMode, SqliteStore, Store};

pub const NOW: &str = "2026-06-16T00:00:00Z";
pub const SCRIPT: &str = "<script>alert(1)</script>";

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipeline/tests/fixtures/results")
}

pub fn shipped_runs() -> Vec<Run> {
    ["base.json", "v7.json", "v8.json"]
        .iter()
        .map(|f| Run::load(&fixtures().join(f)).expect("fixture loads"))
        .collect()
}

/// A run of the hostile series `evil` v1 in the shipped environment.
pub fn hostile_run() -> Run {
    let base = &shipped_runs()[0];
    let ansi_log = "\u{1b}[1;31m[   3.100] BUG: kernel NULL pointer dereference, address: 0000000000000008\u{1b}[0m\n\
                    \u{1b}]0;pwned\u{7}\u{1b}[2J[   3.101] RIP: 0010:phy_attach+0x1c/0x60 <img src=x onerror=alert(2)>\n\
                    [   3.102] Call Trace:\r\n\u{1b}[32mok\u{1b}[0m";
    Run {
        schema: RESULTS_SCHEMA,
        id: "20260613T100000Z-evil-1".into(),
        revision: Some(RevisionInfo {
            series: "evil".into(),
            version: 1,
            change_id: Some("20260613-evil-0000".into()),
            tree: Some("net-next".into()),
            message_id: Some("evil-0@example.org".into()),
            patchset_hash: "e".repeat(64),
            patches: vec![PatchInfo {
                position: 1,
                subject: SCRIPT.into(),
                author: "\"><img src=x onerror=alert(3)>".into(),
                author_email: "evil@example.org".into(),
                message_id: Some("evil-1@example.org".into()),
                patch_id: "0".repeat(40),
                file: "0001-<b>bold</b>.patch".into(),
            }],
        }),
        base: base.base.clone(),
        environment: Environment {
            accelerator: "tcg".into(),
            host: "runner-<i>1</i>".into(),
            arch: "x86_64".into(),
            images: Default::default(),
            tools: [("rustc".to_string(), "1.85.0 <u>x</u>".to_string())].into(),
        },
        started: "2026-06-13T10:00:00Z".parse().unwrap(),
        finished: Some("2026-06-13T10:30:00Z".parse().unwrap()),
        reproducer: "phyfarm run 'patches/evil/v1' && echo \u{1b}[31m<script>alert(4)</script>"
            .into(),
        builds: vec![BuildResult {
            patch: Some(1),
            variant: "rust".into(),
            status: Status::Pass,
            duration_s: 90.0,
            warnings: 4,
            new_warnings: vec![
                "drivers/net/phy/<evil>.rs:1: warning: \u{1b}[33munused\u{1b}[0m".into(),
            ],
            log_path: Some("build/rust/<patch1>.log".into()),
            log_excerpt: String::new(),
        }],
        tests: vec![TestResult {
            path: "farm.dmesg.clean".into(),
            variant: Some("rust".into()),
            status: Status::Fail,
            duration_s: Some(9.0),
            log_path: Some("farm/dmesg.log".into()),
            log_excerpt: ansi_log.into(),
            attempt: 0,
        }],
        measurements: vec![Measurement {
            name: "farm.throughput.tcp_tx".into(),
            variant: Some("rust".into()),
            value: 80e6,
            unit: "bit/s".into(),
            samples: vec![79e6, 80e6, 81e6],
            lower_is_better: false,
        }],
    }
}

/// A store with the shipped runs and the hostile one.
pub fn store(dir: &Path) -> PathBuf {
    let path = dir.join("results.sqlite");
    let mut st = SqliteStore::open(&path, OpenMode::Create).unwrap();
    for r in shipped_runs() {
        st.record_run(&r).unwrap();
    }
    st.record_run(&hostile_run()).unwrap();
    path
}
