//! The result data model every stage produces and the store records.
//!
//! One [`Run`] is one pass of the pipeline over one revision of a series (or
//! over the unpatched base, `revision: None`) in one environment. It is what a
//! `results.json` holds, what `phyfarm store import` records, and what the
//! verdict and the exports read back.
//!
//! Paths of checks are dotted KCIDB test paths:
//!
//! | path                          | what                                       |
//! |-------------------------------|--------------------------------------------|
//! | `apply.patch2`                | `git am` of patch 2 (FAIL: does not apply)  |
//! | `build.rust.patch2`           | derived from a [`BuildResult`]             |
//! | `gate.rustfmtcheck`           | a Rust gate (rustfmtcheck, clippy, rustdoc) |
//! | `farm.throughput.tcp_tx`      | a farm check in a guest                     |
//! | `harness.interrupted`         | recorded by the store for a dead run (MISS) |
//!
//! One file over 500 lines: the results model is one set of types every
//! stage speaks; splitting it would scatter the one place they are defined.

#[cfg(test)]
pub(crate) mod fixture;
pub mod review;
mod time;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ingest::series::Series;
pub use time::{TimeError, Timestamp};

/// The `schema` of a `results.json` this phyfarm writes and reads.
pub const RESULTS_SCHEMA: u32 = 1;
/// Largest `results.json` accepted, in bytes.
pub const MAX_RESULTS_BYTES: u64 = 64 * 1024 * 1024;
/// Longest log excerpt kept (KCIDB's limit), in bytes.
pub const MAX_EXCERPT_BYTES: usize = 16_384;

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: larger than {} MiB: refused unread", .limit >> 20)]
    TooLarge { file: String, limit: u64 },
    #[error("{file}: not a phyfarm results.json: {source}")]
    Parse {
        file: String,
        source: serde_json::Error,
    },
    #[error("{file}: results schema {found} is newer than this phyfarm understands ({supported}); upgrade phyfarm")]
    NewerSchema {
        file: String,
        found: u32,
        supported: u32,
    },
    #[error("{file}: {reason}")]
    Invalid { file: String, reason: String },
}

/// KCIDB status, in priority order: the worst comes first, so `min()` over
/// a set of statuses is their summary.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// The code under test is wrong.
    Fail,
    /// The test could not complete (guest hang, QEMU or emulator died).
    Error,
    /// The harness failed and the test did not run.
    Miss,
    Pass,
    /// Completed without a verdict, e.g. a measurement.
    Done,
    /// Not applicable.
    Skip,
}

impl Status {
    pub const ALL: [Status; 6] = [
        Status::Fail,
        Status::Error,
        Status::Miss,
        Status::Pass,
        Status::Done,
        Status::Skip,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Status::Fail => "FAIL",
            Status::Error => "ERROR",
            Status::Miss => "MISS",
            Status::Pass => "PASS",
            Status::Done => "DONE",
            Status::Skip => "SKIP",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|v| v.name() == s)
    }

    /// ERROR or MISS: the outcome of the code under test is unknown.
    pub fn incomplete(self) -> bool {
        matches!(self, Status::Error | Status::Miss)
    }

    /// FAIL, ERROR or MISS: a check worth running again
    /// ([`repro_command`]); PASS, DONE and SKIP are not.
    pub fn not_passed(self) -> bool {
        self == Status::Fail || self.incomplete()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A revision of a series, as `<series-name>/v<N>` (or `<change-id>/v<N>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RevisionRef {
    /// Series name or b4 change-id.
    pub series: String,
    pub version: u32,
}

impl fmt::Display for RevisionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/v{}", self.series, self.version)
    }
}

impl std::str::FromStr for RevisionRef {
    type Err = String;

    fn from_str(s: &str) -> Result<RevisionRef, String> {
        let bad =
            || format!("revision {s:?} must look like <series-name>/v<N> or <change-id>/v<N>");
        let (series, v) = s.rsplit_once('/').ok_or_else(bad)?;
        let version = v
            .strip_prefix('v')
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|&n| n > 0)
            .ok_or_else(bad)?;
        if series.is_empty() || series.contains(char::is_whitespace) {
            return Err(bad());
        }
        Ok(RevisionRef {
            series: series.to_string(),
            version,
        })
    }
}

/// What the store needs to know about a revision to record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevisionInfo {
    /// Series name (the folder under `patches/`).
    pub series: String,
    pub version: u32,
    pub change_id: Option<String>,
    /// Target tree (`net-next`).
    pub tree: Option<String>,
    /// Message-ID of the mail introducing the revision (cover letter, else
    /// patch 1), without angle brackets.
    pub message_id: Option<String>,
    /// KCIDB patchset_hash.
    pub patchset_hash: String,
    pub patches: Vec<PatchInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchInfo {
    pub position: u32,
    pub subject: String,
    pub author: String,
    pub author_email: String,
    pub message_id: Option<String>,
    /// `git patch-id --stable`.
    pub patch_id: String,
    /// File name of the patch (no directories).
    pub file: String,
}

impl RevisionInfo {
    /// From a parsed series; `name` is the series folder's name.
    pub fn from_series(name: &str, s: &Series) -> RevisionInfo {
        let message_id = s
            .cover
            .as_ref()
            .and_then(|c| c.message_id.clone())
            .or_else(|| s.patches.first().and_then(|p| p.message_id.clone()));
        RevisionInfo {
            series: name.to_string(),
            version: s.version,
            change_id: s.change_id.clone(),
            tree: s.tree.clone(),
            message_id,
            patchset_hash: s.patchset_hash.clone(),
            patches: s
                .patches
                .iter()
                .map(|p| PatchInfo {
                    position: p.index,
                    subject: p.subject.clone(),
                    author: p.author.clone(),
                    author_email: p.author_email.clone(),
                    message_id: p.message_id.clone(),
                    patch_id: p.patch_id.clone(),
                    file: p
                        .file
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                })
                .collect(),
        }
    }

    pub fn reference(&self) -> RevisionRef {
        RevisionRef {
            series: self.series.clone(),
            version: self.version,
        }
    }
}

/// Where a run ran. Two runs are comparable when [`Environment::key`] matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// `kvm` or `tcg`.
    pub accelerator: String,
    pub host: String,
    #[serde(default = "default_arch")]
    pub arch: String,
    /// Container image name → id.
    #[serde(default)]
    pub images: BTreeMap<String, String>,
    /// Tool → version (rustc, bindgen, gcc, qemu, linux-source-6.12, ...).
    #[serde(default)]
    pub tools: BTreeMap<String, String>,
}

fn default_arch() -> String {
    "x86_64".into()
}

impl Environment {
    /// What must match for a base run to stand in for a revision's run:
    /// accelerator and architecture (the kernel base is matched separately).
    pub fn key(&self) -> String {
        format!("{}/{}", self.accelerator, self.arch)
    }
}

/// A kernel build: the base tree (`patch: None`) or the tree after patch N.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildResult {
    /// None: the unpatched base; Some(n): with patches 1..=n applied.
    pub patch: Option<u32>,
    /// `rust` or `c`.
    pub variant: String,
    pub status: Status,
    #[serde(default)]
    pub duration_s: f64,
    /// Compiler warnings in this build.
    #[serde(default)]
    pub warnings: u32,
    /// Warning lines this build has and the build before it had not.
    #[serde(default)]
    pub new_warnings: Vec<String>,
    #[serde(default)]
    pub log_path: Option<String>,
    #[serde(default)]
    pub log_excerpt: String,
}

impl BuildResult {
    /// The check path: `build.rust.patch2` or `build.rust.base`.
    pub fn path(&self) -> String {
        match self.patch {
            Some(n) => format!("build.{}.patch{n}", self.variant),
            None => format!("build.{}.base", self.variant),
        }
    }
}

/// One check. A retry is a second `TestResult` with the same path and
/// variant and `attempt: 1` (it is the retry of attempt 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestResult {
    /// Dotted KCIDB path: `farm.throughput.tcp_tx`, `gate.rustfmtcheck`.
    pub path: String,
    /// The kernel variant it ran on, if any.
    #[serde(default)]
    pub variant: Option<String>,
    pub status: Status,
    #[serde(default)]
    pub duration_s: Option<f64>,
    #[serde(default)]
    pub log_path: Option<String>,
    #[serde(default)]
    pub log_excerpt: String,
    /// 0: first attempt; 1: the retry of a failed first attempt.
    #[serde(default)]
    pub attempt: u32,
}

/// A number with its repeated samples (e.g. iperf3 intervals or repeats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    /// Dotted path, like the test that produced it: `farm.throughput.tcp_tx`.
    pub name: String,
    #[serde(default)]
    pub variant: Option<String>,
    /// The reported figure, normally the mean of `samples`.
    pub value: f64,
    /// Unit symbol: `bit/s`, `s`, `ms`.
    pub unit: String,
    #[serde(default)]
    pub samples: Vec<f64>,
    /// True for times and latencies, false for throughput.
    #[serde(default)]
    pub lower_is_better: bool,
}

/// One pass of the pipeline: the content of a `results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    pub schema: u32,
    /// Unique across the store, e.g. `20260612T101500Z-v8-1a2b3c`.
    pub id: String,
    /// The revision tested; None for a run of the unpatched base.
    pub revision: Option<RevisionInfo>,
    /// The kernel base: source package and version (`linux-source-6.12 6.12.38-1`).
    pub base: String,
    pub environment: Environment,
    pub started: Timestamp,
    pub finished: Option<Timestamp>,
    /// The command that reproduces this run.
    #[serde(default)]
    pub reproducer: String,
    #[serde(default)]
    pub builds: Vec<BuildResult>,
    #[serde(default)]
    pub tests: Vec<TestResult>,
    #[serde(default)]
    pub measurements: Vec<Measurement>,
}

/// `phyfarm repro`: the command that reruns farm check `check` of `revision`
/// on `variant` from the run's recorded artifacts (None for a check that is
/// not a farm check, or a differential: those are rerun by `phyfarm run`, or
/// through their two sides).
pub fn repro_command(revision: &str, check: &str, variant: Option<&str>) -> Option<String> {
    if !check.starts_with("farm.") || check.starts_with("farm.differential.") {
        return None;
    }
    let mut argv = vec![
        "phyfarm".to_string(),
        "repro".into(),
        revision.to_string(),
        check.to_string(),
    ];
    if let Some(v) = variant {
        argv.extend(["--variant".into(), v.to_string()]);
    }
    Some(crate::sandbox::runtime::shell_quote(&argv))
}

/// A KCIDB path: dot-separated components of `[A-Za-z0-9_-]`.
pub fn valid_path(p: &str) -> bool {
    !p.is_empty() && p.split('.').all(valid_component)
}

/// One component of a dotted path: `[A-Za-z0-9_-]+`, optionally followed by
/// the check's parameters in brackets (`link_flap[reset_after_link_loss]`).
fn valid_component(c: &str) -> bool {
    let word = |w: &str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    match c.split_once('[') {
        None => word(c),
        Some((name, rest)) => {
            word(name)
                && rest.strip_suffix(']').is_some_and(|params| {
                    !params.is_empty()
                        && params
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_,=+-".contains(&b))
                })
        }
    }
}

/// Cut `s` to at most `max` bytes on a char boundary, keeping the end
/// (the end of a log is where the error is).
pub fn tail_excerpt(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

impl Run {
    /// Read and check a `results.json`.
    pub fn load(path: &Path) -> Result<Run, ResultsError> {
        use std::io::Read;
        let file = path.display().to_string();
        let io = |source| ResultsError::Io {
            file: file.clone(),
            source,
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .map_err(io)?
            .take(MAX_RESULTS_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_RESULTS_BYTES {
            return Err(ResultsError::TooLarge {
                file,
                limit: MAX_RESULTS_BYTES,
            });
        }
        Run::from_json(&file, &bytes)
    }

    /// Parse and check; `file` names the source in errors.
    pub fn from_json(file: &str, bytes: &[u8]) -> Result<Run, ResultsError> {
        #[derive(Deserialize)]
        struct Probe {
            schema: Option<u32>,
        }
        let parse = |source| ResultsError::Parse {
            file: file.to_string(),
            source,
        };
        let probe: Probe = serde_json::from_slice(bytes).map_err(parse)?;
        if let Some(found) = probe.schema.filter(|&s| s > RESULTS_SCHEMA) {
            return Err(ResultsError::NewerSchema {
                file: file.to_string(),
                found,
                supported: RESULTS_SCHEMA,
            });
        }
        let run: Run = serde_json::from_slice(bytes).map_err(parse)?;
        run.validate().map_err(|reason| ResultsError::Invalid {
            file: file.to_string(),
            reason,
        })?;
        Ok(run)
    }

    /// Write atomically (temporary file + rename).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        crate::jsonfile::write_json_atomic(path, self)
    }

    /// The checks a store can rely on; the reason names the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.id.is_empty()
            || self.id.len() > 200
            || !self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b))
        {
            return Err(format!(
                "run id {:?}: use 1-200 characters of [A-Za-z0-9-_.+]",
                self.id
            ));
        }
        if let Some(f) = self.finished.filter(|f| *f < self.started) {
            return Err(format!("finished {f} is before started {}", self.started));
        }
        if let Some(r) = &self.revision {
            if r.series.is_empty() || r.series.contains('/') || r.version == 0 {
                return Err(format!(
                    "revision {:?} v{}: series name without '/' and version >= 1 needed",
                    r.series, r.version
                ));
            }
            // Positions are the n of n/m: a revision may carry a subset of a
            // posting (v7 here keeps 3/5 and 4/5), so they need not start at 1,
            // but each is at least 1 and appears once.
            let mut seen = std::collections::BTreeSet::new();
            for p in &r.patches {
                if p.position == 0 || !seen.insert(p.position) {
                    return Err(format!(
                        "revision {}: patch position {} is 0 or repeated",
                        r.reference(),
                        p.position
                    ));
                }
            }
        }
        for t in &self.tests {
            if !valid_path(&t.path) {
                return Err(format!(
                    "test path {:?}: dot-separated [A-Za-z0-9_-] components needed",
                    t.path
                ));
            }
            if t.attempt > 1 {
                return Err(format!(
                    "test {}: attempt {} (only one retry is allowed)",
                    t.path, t.attempt
                ));
            }
        }
        for b in &self.builds {
            if !valid_path(&b.path()) {
                return Err(format!(
                    "build variant {:?}: not a path component",
                    b.variant
                ));
            }
        }
        for m in &self.measurements {
            if !valid_path(&m.name) {
                return Err(format!("measurement name {:?}: not a dotted path", m.name));
            }
            if !m.value.is_finite() || m.samples.iter().any(|s| !s.is_finite()) {
                return Err(format!("measurement {}: values must be finite", m.name));
            }
        }
        Ok(())
    }

    pub fn reference(&self) -> Option<RevisionRef> {
        self.revision.as_ref().map(RevisionInfo::reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_quotes_the_check_and_is_only_for_farm_checks() {
        assert_eq!(
            repro_command("s/v2", "farm.link_flap[plain]", Some("rust")).unwrap(),
            "phyfarm repro s/v2 'farm.link_flap[plain]' --variant rust"
        );
        assert_eq!(
            repro_command("x';rm -rf ~;'/v1", "farm.probe", None).unwrap(),
            r"phyfarm repro 'x'\'';rm -rf ~;'\''/v1' farm.probe"
        );
        assert!(repro_command("s/v1", "build.rust.patch1", None).is_none());
        assert!(repro_command("s/v1", "farm.differential.probe", None).is_none());
    }

    #[test]
    fn status_priority_order_is_kcidb_order() {
        let mut v = vec![Status::Skip, Status::Pass, Status::Miss, Status::Fail];
        v.sort();
        assert_eq!(v, [Status::Fail, Status::Miss, Status::Pass, Status::Skip]);
        assert_eq!(v.iter().min(), Some(&Status::Fail));
        assert_eq!(Status::parse("DONE"), Some(Status::Done));
        assert_eq!(Status::parse("done"), None);
    }

    #[test]
    fn revision_ref_syntax() {
        let r: RevisionRef = "rust-phy-enum-check/v8".parse().unwrap();
        assert_eq!((r.series.as_str(), r.version), ("rust-phy-enum-check", 8));
        assert_eq!(r.to_string(), "rust-phy-enum-check/v8");
        for bad in ["v8", "x/8", "x/v0", "/v1", "x/vv1"] {
            assert!(bad.parse::<RevisionRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_follow_kcidb() {
        assert!(valid_path("farm.throughput.tcp_tx"));
        assert!(valid_path("build.rust.patch2"));
        assert!(!valid_path("farm..x"));
        assert!(valid_path("farm.link_flap[reset_after_link_loss]"));
        assert!(valid_path("farm.link_flap[plain].detect_median"));
        assert!(!valid_path("farm.x[a;b]"));
        assert!(!valid_path("farm.x["));
        assert!(!valid_path("farm.x[]"));
        assert!(!valid_path("farm.x[a]b"));
        assert!(!valid_path(""));
    }

    #[test]
    fn excerpt_keeps_the_end_on_a_char_boundary() {
        assert_eq!(tail_excerpt("abcdef", 3), "def");
        assert_eq!(tail_excerpt("aé", 1), "");
        assert_eq!(tail_excerpt("short", 100), "short");
    }

    #[test]
    fn newer_results_schema_is_refused_naming_both() {
        let e = Run::from_json("r.json", br#"{"schema": 9}"#).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("r.json") && s.contains('9') && s.contains('1'),
            "{s}"
        );
    }
}
