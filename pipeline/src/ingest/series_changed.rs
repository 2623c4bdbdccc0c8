//! `phyfarm series changed`: which series revisions a range of commits
//! touched, so a pull request builds and tests only those.
//!
//! The rule, path by path (paths relative to the repository's top):
//!
//! - `patches/<series>/v<N>/<anything>` added, modified, type-changed or
//!   deleted: revision `<series>` v`<N>` changed.
//! - `patches/<series>/series.toml` added, modified or deleted: every
//!   revision of `<series>` that exists at HEAD changed (the manifest names
//!   the base and tree every revision is built on).
//! - Anything else (files outside `patches/`, `patches/README.md`,
//!   `patches/<series>/notes.md`) changes no revision.
//!
//! A changed revision is `added` when its folder holds no file at the merge
//! base, `removed` when it holds no file at HEAD (nothing to build: a
//! report, not a job), and `modified` otherwise. The range is the one a pull
//! request shows: from the merge base of BASE and HEAD to HEAD, like
//! `git diff BASE...HEAD`. Renames count as a deletion plus an addition.
//!
//! Folder names come from contributors and end up in job names and
//! command lines, so they are checked: a series folder must match
//! `[A-Za-z0-9][A-Za-z0-9._-]*` and a folder that looks like a revision
//! (`v` then digits) must be `v<N>` with N >= 1 and no leading zero.
//! Anything else is refused (exit 2) rather than silently not tested.
//!
//! git runs as a subprocess with an argv (never a shell), with external
//! diff drivers and textconv filters off.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

/// The folder under the repository's top that holds the series.
pub const PATCHES_DIR: &str = "patches";
/// A series' manifest, beside its revision folders.
pub const MANIFEST: &str = "series.toml";
/// Longest ref or folder name accepted.
const MAX_NAME: usize = 200;

/// Why the changed revisions could not be listed. Every variant is exit 2.
#[derive(Debug, thiserror::Error)]
pub enum ChangedError {
    #[error("bad ref {name:?}: {reason}")]
    BadRef { name: String, reason: &'static str },
    #[error("unknown ref {name:?} in {}: not a commit (is it fetched?)", repo.display())]
    UnknownRef { name: String, repo: PathBuf },
    #[error("cannot run git: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("git {args} failed in {}: {stderr}", repo.display())]
    Git {
        args: String,
        repo: PathBuf,
        stderr: String,
    },
    #[error("{path}: {reason}")]
    BadPath { path: String, reason: &'static str },
}

/// What happened to a revision folder between the merge base and HEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Added,
    Modified,
    Removed,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Added => "added",
            Status::Modified => "modified",
            Status::Removed => "removed",
        }
    }
}

/// Why a revision is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Reason {
    /// A file inside the revision folder changed.
    #[serde(rename = "files")]
    Files,
    /// The series' `series.toml` changed.
    #[serde(rename = "series.toml")]
    Manifest,
}

/// One changed file, as `git diff --name-status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedFile {
    /// `A`, `M`, `D` or `T`.
    pub status: String,
    pub path: String,
}

/// One changed revision folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedRevision {
    pub series: String,
    pub version: u32,
    /// `patches/<series>/v<N>`, relative to the repository's top.
    pub dir: String,
    pub status: Status,
    pub reasons: Vec<Reason>,
    /// Files changed inside the revision folder (empty when only
    /// `series.toml` changed).
    pub files: Vec<ChangedFile>,
}

/// The answer: resolved commits and the changed revisions, sorted by
/// series then version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Changes {
    pub base: String,
    pub head: String,
    pub merge_base: String,
    pub revisions: Vec<ChangedRevision>,
}

/// Check that a ref is something a user would type (a branch, tag,
/// `origin/main`, a commit id, `HEAD~2`) and nothing git could take as an
/// option or a range.
pub fn validate_ref(name: &str) -> Result<(), ChangedError> {
    let bad = |reason| {
        Err(ChangedError::BadRef {
            name: name.into(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME {
        return bad("longer than 200 characters");
    }
    if name.starts_with('-') {
        return bad("starts with '-'");
    }
    if name.contains("..") {
        return bad("contains '..': give one commit, not a range");
    }
    if name.contains("@{") {
        return bad("reflog syntax '@{' is not accepted");
    }
    if name.ends_with('/') || name.ends_with('.') || name.ends_with(".lock") {
        return bad("not a valid ref name ending");
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '.' | '~' | '^');
    if !name.chars().all(ok) {
        return bad("only letters, digits and / _ - . ~ ^ are accepted");
    }
    Ok(())
}

/// List the revisions changed between the merge base of `base` and `head`,
/// and `head`, in the git repository at `repo`.
pub fn changed(repo: &Path, base: &str, head: &str) -> Result<Changes, ChangedError> {
    validate_ref(base)?;
    validate_ref(head)?;
    let base_id = resolve(repo, base)?;
    let head_id = resolve(repo, head)?;
    let merge_base = git(repo, &["merge-base", &base_id, &head_id])?
        .trim()
        .to_string();
    let diff = git(
        repo,
        &[
            "diff",
            "--name-status",
            "-z",
            "--no-renames",
            "--no-ext-diff",
            "--no-textconv",
            &merge_base,
            &head_id,
            "--",
            PATCHES_DIR,
        ],
    )?;
    refuse_links(repo, &head_id)?;
    let before = revisions_at(repo, &merge_base)?;
    let after = revisions_at(repo, &head_id)?;
    let revisions = classify(&parse_name_status(&diff)?, &before, &after)?;
    Ok(Changes {
        base: base_id,
        head: head_id,
        merge_base,
        revisions,
    })
}

/// Text for people: one line per revision.
pub fn render_text(c: &Changes) -> String {
    let mut out = String::new();
    for r in &c.revisions {
        let mut why = Vec::new();
        if r.reasons.contains(&Reason::Manifest) {
            why.push(MANIFEST.to_string());
        }
        match r.files.len() {
            0 => {}
            1 => why.push("1 file".into()),
            n => why.push(format!("{n} files")),
        }
        out.push_str(&format!(
            "{:9} {} ({})\n",
            r.status.name(),
            r.dir,
            why.join(", ")
        ));
    }
    out
}

fn resolve(repo: &Path, name: &str) -> Result<String, ChangedError> {
    let spec = format!("{name}^{{commit}}");
    let out = git_output(repo, &["rev-parse", "--verify", "--quiet", &spec])?;
    if !out.status.success() {
        return Err(ChangedError::UnknownRef {
            name: name.into(),
            repo: repo.into(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn git_output(repo: &Path, args: &[&str]) -> Result<std::process::Output, ChangedError> {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(repo).args(args);
    // A caller inside a git hook or `git rebase -x` must not redirect us.
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_EXTERNAL_DIFF",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().map_err(ChangedError::Spawn)
}

fn git(repo: &Path, args: &[&str]) -> Result<String, ChangedError> {
    let out = git_output(repo, args)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(ChangedError::Git {
            args: args.join(" "),
            repo: repo.into(),
            stderr: stderr.lines().next().unwrap_or("").trim().to_string(),
        });
    }
    String::from_utf8(out.stdout).map_err(|_| ChangedError::BadPath {
        path: format!("git {}", args.first().unwrap_or(&"")),
        reason: "output is not UTF-8 (a file name under patches/ is not UTF-8)",
    })
}

/// `git diff --name-status -z` output: `STATUS NUL PATH NUL`, repeated.
fn parse_name_status(raw: &str) -> Result<Vec<ChangedFile>, ChangedError> {
    let mut fields = raw.split('\0').filter(|f| !f.is_empty());
    let mut files = Vec::new();
    while let Some(status) = fields.next() {
        let path = fields.next().ok_or(ChangedError::BadPath {
            path: status.into(),
            reason: "git diff --name-status: status without a path",
        })?;
        files.push(ChangedFile {
            status: status.chars().take(1).collect(),
            path: path.into(),
        });
    }
    Ok(files)
}

/// Where a path under `patches/` sits.
#[derive(Debug, PartialEq, Eq)]
enum Place<'a> {
    Revision { series: &'a str, version: u32 },
    Manifest { series: &'a str },
    Other,
}

fn place(path: &str) -> Result<Place<'_>, ChangedError> {
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 3 || parts[0] != PATCHES_DIR {
        return Ok(Place::Other);
    }
    let series = parts[1];
    let bad = |reason| ChangedError::BadPath {
        path: path.into(),
        reason,
    };
    check_series_name(series).map_err(bad)?;
    if parts.len() == 3 {
        return Ok(if parts[2] == MANIFEST {
            Place::Manifest { series }
        } else {
            Place::Other
        });
    }
    match revision_number(parts[2]).map_err(bad)? {
        Some(version) => Ok(Place::Revision { series, version }),
        None => Ok(Place::Other),
    }
}

fn check_series_name(name: &str) -> Result<(), &'static str> {
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !first_ok || !rest_ok || name.len() > MAX_NAME {
        return Err("series folder name must match [A-Za-z0-9][A-Za-z0-9._-]* (at most 200)");
    }
    Ok(())
}

/// `v8` is revision 8; `notes` is not a revision; `v08`, `v0` and
/// `v99999999999` look like one but are refused.
fn revision_number(name: &str) -> Result<Option<u32>, &'static str> {
    let Some(digits) = name.strip_prefix('v') else {
        return Ok(None);
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    let bad = "revision folder must be v<N> with N >= 1 and no leading zero";
    if digits.starts_with('0') {
        return Err(bad);
    }
    digits.parse::<u32>().map(Some).map_err(|_| bad)
}

/// A symbolic link (or a submodule) anywhere under `patches/` at `commit`
/// is refused: a checkout would follow it out of the pull request's tree.
fn refuse_links(repo: &Path, commit: &str) -> Result<(), ChangedError> {
    let listing = git(repo, &["ls-tree", "-r", "-z", commit, "--", PATCHES_DIR])?;
    for entry in listing.split('\0').filter(|e| !e.is_empty()) {
        let Some((meta, path)) = entry.split_once('\t') else {
            continue;
        };
        let reason = match meta.split(' ').next() {
            Some("120000") => "a symbolic link; series files must be regular files",
            Some("160000") => "a submodule; series files must be regular files",
            _ => continue,
        };
        return Err(ChangedError::BadPath {
            path: path.to_string(),
            reason,
        });
    }
    Ok(())
}

/// Every revision folder that holds a file at `commit`, per series.
fn revisions_at(
    repo: &Path,
    commit: &str,
) -> Result<BTreeMap<String, BTreeSet<u32>>, ChangedError> {
    let listing = git(
        repo,
        &[
            "ls-tree",
            "-r",
            "-z",
            "--name-only",
            commit,
            "--",
            PATCHES_DIR,
        ],
    )?;
    let mut map: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for path in listing.split('\0').filter(|p| !p.is_empty()) {
        if let Place::Revision { series, version } = place(path)? {
            map.entry(series.into()).or_default().insert(version);
        }
    }
    Ok(map)
}

type Key = (String, u32);

fn classify(
    files: &[ChangedFile],
    before: &BTreeMap<String, BTreeSet<u32>>,
    after: &BTreeMap<String, BTreeSet<u32>>,
) -> Result<Vec<ChangedRevision>, ChangedError> {
    let mut touched: BTreeMap<Key, (BTreeSet<Reason>, Vec<ChangedFile>)> = BTreeMap::new();
    for f in files {
        match place(&f.path)? {
            Place::Revision { series, version } => {
                let e = touched.entry((series.into(), version)).or_default();
                e.0.insert(Reason::Files);
                e.1.push(f.clone());
            }
            Place::Manifest { series } => {
                for v in after.get(series).into_iter().flatten() {
                    let e = touched.entry((series.into(), *v)).or_default();
                    e.0.insert(Reason::Manifest);
                }
            }
            Place::Other => {}
        }
    }
    let exists = |m: &BTreeMap<String, BTreeSet<u32>>, (s, v): &Key| {
        m.get(s).is_some_and(|set| set.contains(v))
    };
    let mut out = Vec::new();
    for (key, (reasons, files)) in touched {
        let status = match (exists(before, &key), exists(after, &key)) {
            (false, true) => Status::Added,
            (true, true) => Status::Modified,
            (true, false) => Status::Removed,
            // Nothing there on either side: a no-op pair in the diff.
            (false, false) => continue,
        };
        let (series, version) = key;
        out.push(ChangedRevision {
            dir: format!("{PATCHES_DIR}/{series}/v{version}"),
            series,
            version,
            status,
            reasons: reasons.into_iter().collect(),
            files,
        });
    }
    Ok(out)
}
