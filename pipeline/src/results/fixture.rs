//! Small runs for unit tests: a series `s` with change-id `c-1`, one patch
//! per revision, base `linux 1`, TCG.

use super::*;

pub fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

pub fn revision(version: u32) -> RevisionInfo {
    RevisionInfo {
        series: "s".into(),
        version,
        change_id: Some("c-1".into()),
        tree: Some("net-next".into()),
        message_id: Some(format!("v{version}-0@example.org")),
        patchset_hash: format!("{version:064}"),
        patches: vec![PatchInfo {
            position: 1,
            subject: "net: phy: a <b> & `c` | d".into(),
            author: "A U Thor".into(),
            author_email: "a@example.org".into(),
            message_id: Some(format!("v{version}-1@example.org")),
            patch_id: format!("{:040}", version),
            file: "0001-net-phy.patch".into(),
        }],
    }
}

pub fn test(path: &str, status: Status) -> TestResult {
    TestResult {
        path: path.into(),
        variant: None,
        status,
        duration_s: Some(1.0),
        log_path: None,
        log_excerpt: String::new(),
        attempt: 0,
    }
}

pub fn build(patch: Option<u32>, status: Status, warnings: u32) -> BuildResult {
    BuildResult {
        patch,
        variant: "rust".into(),
        status,
        duration_s: 10.0,
        warnings,
        new_warnings: vec![],
        log_path: None,
        log_excerpt: String::new(),
    }
}

pub fn measurement(samples: &[f64]) -> Measurement {
    Measurement {
        name: "farm.throughput.tcp_tx".into(),
        variant: Some("rust".into()),
        value: samples.iter().sum::<f64>() / samples.len() as f64,
        unit: "bit/s".into(),
        samples: samples.to_vec(),
        lower_is_better: false,
    }
}

/// A run of revision `version` (None: the base) from `started` to `finished`.
pub fn run(id: &str, version: Option<u32>, started: &str, finished: &str) -> Run {
    Run {
        schema: RESULTS_SCHEMA,
        id: id.into(),
        revision: version.map(revision),
        base: "linux 1".into(),
        environment: Environment {
            accelerator: "tcg".into(),
            host: "h".into(),
            arch: "x86_64".into(),
            ..Default::default()
        },
        started: t(started),
        finished: Some(t(finished)),
        reproducer: "phyfarm run".into(),
        builds: vec![build(None, Status::Pass, 2)],
        tests: vec![test("farm.probe.ids", Status::Pass)],
        measurements: vec![],
    }
}
