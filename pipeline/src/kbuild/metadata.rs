//! `metadata.json` of a build or boot: what ran, with which tools, how long,
//! and how it ended. Written atomically (temporary file + rename), so a reader
//! never sees half a file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The status of a build or boot: the one KCIDB status enum of phyfarm
/// (a build or boot is PASS, FAIL or ERROR).
pub use crate::results::Status;

/// Versions of the tools a step ran with.
pub type Versions = BTreeMap<String, String>;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildMetadata {
    pub schema: u32,
    /// The phyfarm command line that reproduces this build.
    pub reproducer: String,
    pub variant: String,
    pub runtime: String,
    pub kernel_package: String,
    pub kernel_version: String,
    /// Container image name and id (absent for `--runtime host`).
    pub image: Option<ImageRef>,
    pub tools: Versions,
    /// sha256 of the final `.config`.
    pub config_hash: Option<String>,
    pub fragments: Vec<String>,
    /// Seconds per stage, in the order they ran.
    pub durations: Vec<(String, f64)>,
    pub status: Status,
    /// The first error lines of the log when the build failed.
    pub log_excerpt: Vec<String>,
    pub started: String,
    pub finished: String,
    pub artifacts: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageRef {
    pub name: String,
    pub id: String,
}

pub use crate::jsonfile::{read_json, write_json_atomic};

/// UTC time as RFC 3339 (the results model's one date algorithm).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

pub fn rfc3339(secs: u64) -> String {
    crate::results::Timestamp(i64::try_from(secs).unwrap_or(i64::MAX)).to_string()
}

/// The first lines of a build log that look like errors, at most `max`.
pub fn error_excerpt(log: &str, max: usize) -> Vec<String> {
    let is_error = |l: &str| {
        l.contains("error:")
            || l.contains("error[E")
            || l.contains("Error ")
            || l.starts_with("make: ***")
            || l.contains("undefined reference")
    };
    let mut out: Vec<String> = log
        .lines()
        .filter(|l| is_error(l))
        .take(max)
        .map(|l| l.chars().take(400).collect())
        .collect();
    if out.is_empty() {
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(max);
        out = lines[from..].iter().map(|l| l.to_string()).collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_243_199), "2026-12-25T23:59:59Z");
    }

    #[test]
    fn atomic_write_replaces_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metadata.json");
        write_json_atomic(&p, &serde_json::json!({"status": "PASS"})).unwrap();
        write_json_atomic(&p, &serde_json::json!({"status": "FAIL"})).unwrap();
        let v: serde_json::Value = read_json(&p).unwrap().unwrap();
        assert_eq!(v["status"], "FAIL");
        // No temporary files left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn excerpt_prefers_error_lines() {
        let log =
            "CC a.o\nfoo.c:1:2: error: bad\nmake[2]: *** [x] Error 1\nmake: *** [all] Error 2\n";
        let ex = error_excerpt(log, 2);
        assert_eq!(ex, ["foo.c:1:2: error: bad", "make[2]: *** [x] Error 1"]);
        let ex = error_excerpt("a\nb\nc\n", 2);
        assert_eq!(ex, ["b", "c"]);
    }

    #[test]
    fn build_metadata_round_trips() {
        let m = BuildMetadata {
            schema: 1,
            reproducer: "phyfarm build --variant rust".into(),
            variant: "rust".into(),
            runtime: "podman".into(),
            kernel_package: "linux-source-6.12".into(),
            kernel_version: "6.12.1-1".into(),
            image: Some(ImageRef {
                name: "localhost/phyfarm-kbuild:abc".into(),
                id: "123".into(),
            }),
            tools: Versions::from([("rustc".to_string(), "1.85.1".to_string())]),
            config_hash: None,
            fragments: vec![],
            durations: vec![("build".into(), 1.5)],
            status: Status::Fail,
            log_excerpt: vec!["error: x".into()],
            started: now_rfc3339(),
            finished: now_rfc3339(),
            artifacts: BTreeMap::new(),
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.json");
        write_json_atomic(&p, &m).unwrap();
        let back: BuildMetadata = read_json(&p).unwrap().unwrap();
        assert_eq!(back.status, Status::Fail);
        assert_eq!(back.tools["rustc"], "1.85.1");
        let raw = std::fs::read_to_string(&p).unwrap();
        assert!(raw.contains("\"status\": \"FAIL\""), "{raw}");
    }
}
