//! `series.toml`: what a series folder under `patches/` says about itself.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{read_bounded, SeriesError};

/// Largest manifest accepted, in bytes.
const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// A series folder's `series.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Manifest {
    /// Short name; the folder's name by convention.
    pub name: String,
    /// b4 change-id (`YYYYMMDD-<slug>-<12 hex>`), shared by every revision.
    pub change_id: Option<String>,
    /// Target tree (`net-next`).
    pub tree: String,
    pub description: Option<String>,
    /// The tree the series is built on.
    pub base: Base,
    /// Revisions, oldest first.
    #[serde(default, rename = "revision")]
    pub revisions: Vec<Revision>,
    /// Who may add revisions through a pull request (`github:<login>`).
    /// The trusted record job reads it from the default branch's copy:
    /// a pull request by anyone else that adds a revision of this series
    /// is refused, so it cannot supersede revisions it does not own.
    #[serde(default)]
    pub owners: Vec<String>,
    /// New compiler warnings the series means to add, each with why. A new
    /// warning fails its patch's build check (as netdev's build checks do)
    /// unless its text contains one of these `warning` strings.
    #[serde(default)]
    pub accepted_warnings: Vec<AcceptedWarning>,
}

/// `[[accepted-warnings]]`: a new warning a series adds on purpose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptedWarning {
    /// Part of the warning's text, e.g. "unused variable: `lpa`".
    pub warning: String,
    /// Why the warning is intended; shown wherever it is accepted.
    pub reason: String,
}

/// Whether `name` may name a series: it becomes a store key, a revision
/// reference (`<name>/v<N>`) and a folder name under the cache, so it is
/// one path component of `[A-Za-z0-9._-]`, 1-100 characters, starting with
/// a letter or digit.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 100
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// The distro kernel source package a series is built on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Base {
    /// Source package, e.g. `linux-source-6.12`.
    pub package: String,
    /// Distro and release, e.g. `debian trixie`.
    pub distro: String,
    /// Optional pin of the package version; without it the version that
    /// was installed is recorded with every build.
    pub version: Option<String>,
}

/// One revision folder (`v7/`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Revision {
    pub version: u32,
    /// Folder relative to the manifest.
    pub dir: String,
    /// What this revision is, for people (as posted, forward-port, ...).
    pub note: Option<String>,
}

/// Read and check a `series.toml`.
pub fn load_manifest(path: &Path) -> Result<Manifest, SeriesError> {
    let bytes = read_bounded(path, MAX_MANIFEST_BYTES)?;
    let bad = |reason: String| SeriesError::Manifest {
        file: path.to_path_buf(),
        reason,
    };
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8".to_string()))?;
    let m: Manifest = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if !valid_name(&m.name) {
        return Err(bad(format!(
            "name {:?}: one path component of [A-Za-z0-9._-] (1-100 characters, starting with a letter or digit) needed",
            m.name
        )));
    }
    for (i, w) in m.accepted_warnings.iter().enumerate() {
        if w.warning.trim().len() < 8 || w.reason.trim().is_empty() {
            return Err(bad(format!(
                "accepted-warnings[{i}]: a `warning` of at least 8 characters and a `reason` are needed"
            )));
        }
    }
    for r in &m.revisions {
        let dir = Path::new(&r.dir);
        if dir.is_absolute() || dir.components().any(|c| c.as_os_str() == "..") {
            return Err(bad(format!(
                "revision v{}: dir {:?} must stay inside the series folder",
                r.version, r.dir
            )));
        }
    }
    Ok(m)
}
