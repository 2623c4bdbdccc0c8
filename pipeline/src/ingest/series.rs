//! Patch series ingest: a directory of `git format-patch` files or an mbox
//! becomes a [`Series`] with each patch's subject prefix, author, Message-ID,
//! `git patch-id --stable`, the files it touches, and the series' b4
//! change-id and KCIDB `patchset_hash`.
//!
//! Input is untrusted: nothing here panics on any bytes, every read is
//! bounded, paths in diffs are plain data, and every refusal is a
//! [`SeriesError`] naming the file and line at fault.

mod diff;
mod error;
mod mail;
mod manifest;
mod patch_id;
mod render;
mod subject;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

pub use error::SeriesError;
pub use manifest::{load_manifest, valid_name, AcceptedWarning, Base, Manifest, Revision};
pub use patch_id::stable as patch_id_stable;
pub use render::render_text;

/// Largest patch file (or mbox message) accepted, in bytes.
pub const MAX_PATCH_BYTES: u64 = 10 * 1024 * 1024;
/// Largest mbox file accepted, in bytes.
pub const MAX_MBOX_BYTES: u64 = 16 * MAX_PATCH_BYTES;
/// The file next to the revision folders that describes a series.
pub const MANIFEST_FILE: &str = "series.toml";

/// One revision of a patch series, as posted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Series {
    /// The directory or mbox it was read from.
    pub source: PathBuf,
    /// Revision (`vN`); 1 when the subjects carry none.
    pub version: u32,
    /// Target tree from the subject prefix (`net-next`).
    pub tree: Option<String>,
    pub rfc: bool,
    pub resend: bool,
    /// b4 change-id: the cover letter's, else the series manifest's.
    pub change_id: Option<String>,
    /// `base-commit:` from the cover letter or a patch, if any.
    pub base_commit: Option<String>,
    /// KCIDB `patchset_hash`: sha256 over the newline-terminated sha256 of
    /// each patch, in application order (the cover letter is not a patch).
    pub patchset_hash: String,
    pub cover: Option<Cover>,
    /// The patches, ordered by index.
    pub patches: Vec<Patch>,
}

/// The `0/m` cover letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Cover {
    pub total: u32,
    pub subject: String,
    pub author: String,
    pub author_email: String,
    pub date: Option<String>,
    pub message_id: Option<String>,
    pub file: PathBuf,
}

/// One patch of the series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Patch {
    pub index: u32,
    pub total: u32,
    /// The subject without its `[PATCH ...]` prefix.
    pub subject: String,
    /// The author: the in-body `From:` if there is one, as `git am` takes it.
    pub author: String,
    pub author_email: String,
    pub date: Option<String>,
    /// Without the angle brackets.
    pub message_id: Option<String>,
    /// `git patch-id --stable`.
    pub patch_id: String,
    /// sha256 of the patch as stored (the file, or the mbox message).
    pub sha256: String,
    /// The file it came from (for an mbox, the mbox).
    pub file: PathBuf,
    /// Line of `file` on which the patch starts.
    pub line: usize,
    /// Tree-relative paths the diff touches (both names of a rename).
    pub files_touched: Vec<String>,
    /// The diff has binary parts (`GIT binary patch`, `Binary files ... differ`).
    pub binary: bool,
}

/// Read at most `limit` bytes; a longer file is refused without reading it all.
fn read_bounded(file: &Path, limit: u64) -> Result<Vec<u8>, SeriesError> {
    let io = |err| SeriesError::Io {
        file: file.to_path_buf(),
        err,
    };
    let mut buf = Vec::new();
    crate::sandbox::safe_fs::open_file(file)
        .map_err(|e| SeriesError::Unsafe(Box::new(e)))?
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(io)?;
    if buf.len() as u64 > limit {
        return Err(SeriesError::TooLarge {
            file: file.to_path_buf(),
            limit,
        });
    }
    Ok(buf)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// KCIDB `patchset_hash` from the sha256 (hex) of each patch in order:
/// `sha256sum *.patch | cut -c-64 | sha256sum | cut -c-64`; "" for none.
pub fn patchset_hash<S: AsRef<str>>(patch_sha256s: &[S]) -> String {
    if patch_sha256s.is_empty() {
        return String::new();
    }
    let mut list = String::new();
    for h in patch_sha256s {
        list.push_str(h.as_ref());
        list.push('\n');
    }
    sha256_hex(list.as_bytes())
}

/// One parsed mail before the series-wide checks.
struct Item {
    file: PathBuf,
    subject_line: usize,
    prefix: subject::Prefix,
    cover: Option<Cover>,
    patch: Option<Patch>,
    change_id: Option<String>,
    base_commit: Option<String>,
}

/// Load a series from a directory of `*.patch` files (sorted by name, an
/// optional `0000` cover letter) or from an mbox file.
pub fn load(path: &Path) -> Result<Series, SeriesError> {
    // The revision folder (or mbox) and every file in it are read without
    // following links: a link in a pull request is refused, by name.
    let meta = std::fs::symlink_metadata(path).map_err(|err| SeriesError::Io {
        file: path.to_path_buf(),
        err,
    })?;
    if meta.file_type().is_symlink() {
        return Err(SeriesError::Unsafe(Box::new(
            crate::sandbox::safe_fs::SafeFsError::Symlink {
                path: path.to_path_buf(),
            },
        )));
    }
    let mut items = Vec::new();
    if meta.is_dir() {
        let mut files: Vec<PathBuf> = Vec::new();
        let entries = std::fs::read_dir(path).map_err(|err| SeriesError::Io {
            file: path.to_path_buf(),
            err,
        })?;
        for e in entries.filter_map(|e| e.ok()) {
            let p = e.path();
            if !p.extension().is_some_and(|e| e == "patch") {
                continue;
            }
            // file_type() does not follow links: a linked *.patch is refused
            // (read_bounded names it), never skipped.
            match e.file_type() {
                Ok(t) if t.is_file() || t.is_symlink() => files.push(p),
                _ => {}
            }
        }
        files.sort();
        for f in files {
            let bytes = read_bounded(&f, MAX_PATCH_BYTES)?;
            let raw = mail::RawMessage {
                bytes,
                first_line: 1,
            };
            items.push(parse_item(&f, &raw)?);
        }
    } else {
        let bytes = read_bounded(path, MAX_MBOX_BYTES)?;
        for raw in mail::split_mbox(&bytes) {
            if raw.bytes.len() as u64 > MAX_PATCH_BYTES {
                return Err(SeriesError::TooLarge {
                    file: path.to_path_buf(),
                    limit: MAX_PATCH_BYTES,
                });
            }
            items.push(parse_item(path, &raw)?);
        }
    }
    let mut series = assemble(path, items)?;
    if series.change_id.is_none() && meta.is_dir() {
        if let Some(parent) = path.parent() {
            let manifest = parent.join(MANIFEST_FILE);
            // symlink_metadata: a linked series.toml is read (and refused
            // by name) rather than silently ignored.
            if std::fs::symlink_metadata(&manifest).is_ok() {
                series.change_id = load_manifest(&manifest)?.change_id;
            }
        }
    }
    Ok(series)
}

fn trailer(body: &[u8], key: &str) -> Option<String> {
    mail::lines(body).find_map(|l| {
        let text = String::from_utf8_lossy(mail::chomp(l)).into_owned();
        let value = text.strip_prefix(key)?.trim().to_string();
        (!value.is_empty() && !value.contains(char::is_whitespace)).then_some(value)
    })
}

fn parse_item(file: &Path, raw: &mail::RawMessage) -> Result<Item, SeriesError> {
    let not_patch = |line, reason: &str| SeriesError::NotAPatch {
        file: file.to_path_buf(),
        line,
        reason: reason.to_string(),
    };
    let m = mail::parse(raw).ok_or_else(|| not_patch(raw.first_line, "no mail headers"))?;
    if m.html_only {
        let line = m
            .mail_header("Content-Type")
            .map_or(raw.first_line, |h| h.line);
        return Err(SeriesError::HtmlOnly {
            file: file.to_path_buf(),
            line,
        });
    }
    let subj = m
        .mail_header("Subject")
        .ok_or_else(|| not_patch(raw.first_line, "no Subject header"))?;
    let prefix = subject::parse(&subj.value);
    // An in-body Subject: replaces the title, as with git am.
    let title = match m.in_body.iter().find(|h| h.name == "Subject") {
        Some(h) => subject::parse(&h.value).subject,
        None => prefix.subject.clone(),
    };
    let (author, author_email) = m
        .get("From")
        .map(|h| mail::split_address(&h.value))
        .unwrap_or_default();
    let date = m.get("Date").map(|h| h.value.clone());
    let message_id = m.mail_header("Message-ID").map(|h| {
        h.value
            .trim()
            .trim_start_matches('<')
            .trim_end_matches('>')
            .to_string()
    });
    let change_id = trailer(&m.body, "change-id:");
    let base_commit = trailer(&m.body, "base-commit:");
    let file_buf = file.to_path_buf();
    let mut item = Item {
        file: file_buf.clone(),
        subject_line: subj.line,
        prefix,
        cover: None,
        patch: None,
        change_id,
        base_commit,
    };
    let (index, total) = item.prefix.counter.unwrap_or((1, 1));
    let start = diff::find_start(&m.body);
    if index == 0 && item.prefix.counter.is_some() {
        item.cover = Some(Cover {
            total,
            subject: title,
            author,
            author_email,
            date,
            message_id,
            file: file_buf,
        });
        return Ok(item);
    }
    let Some(start) = start else {
        return Err(not_patch(
            m.body_line,
            "no diff in the body and not a 0/m cover letter",
        ));
    };
    let summary = diff::parse(&m.body, start).map_err(|p| match p {
        diff::DiffProblem::Corrupt { line, reason } => SeriesError::CorruptPatch {
            file: file.to_path_buf(),
            line: m.body_line + line,
            reason,
        },
        diff::DiffProblem::Outside { line, path } => SeriesError::PathOutsideTree {
            file: file.to_path_buf(),
            line: m.body_line + line,
            path,
        },
    })?;
    let patch_id = patch_id::stable(&m.canonical).ok_or_else(|| SeriesError::CorruptPatch {
        file: file.to_path_buf(),
        line: m.body_line + start,
        reason: "no diff that git patch-id can hash".to_string(),
    })?;
    item.patch = Some(Patch {
        index,
        total,
        subject: title,
        author,
        author_email,
        date,
        message_id,
        patch_id,
        sha256: sha256_hex(&raw.bytes),
        file: file.to_path_buf(),
        line: raw.first_line,
        files_touched: summary.files,
        binary: summary.binary,
    });
    Ok(item)
}

/// The series-wide checks: indices, totals, revision and tree agree.
fn assemble(source: &Path, items: Vec<Item>) -> Result<Series, SeriesError> {
    let Some(first) = items.first() else {
        return Err(SeriesError::NoPatches {
            file: source.to_path_buf(),
        });
    };
    let (version, tree) = (first.prefix.version, first.prefix.tree.clone());
    let first_file = first.file.clone();
    let expected_total = items.iter().find_map(|i| i.prefix.counter.map(|c| c.1));
    let mut seen: Vec<(u32, PathBuf)> = Vec::new();
    for it in &items {
        let at = |it: &Item| (it.file.clone(), it.subject_line);
        let Some((n, m)) = it.prefix.counter else {
            if items.len() > 1 {
                return Err(SeriesError::MissingIndex {
                    file: it.file.clone(),
                    line: it.subject_line,
                    subject: it.prefix.subject.clone(),
                });
            }
            continue;
        };
        let (file, line) = at(it);
        if n > m || m == 0 {
            return Err(SeriesError::IndexOutOfRange {
                file,
                line,
                index: n,
                total: m,
            });
        }
        if let Some(expected) = expected_total.filter(|&e| e != m) {
            let first = items
                .iter()
                .find(|i| i.prefix.counter.map(|c| c.1) == Some(expected))
                .map_or(first_file.clone(), |i| i.file.clone());
            return Err(SeriesError::TotalMismatch {
                file,
                line,
                total: m,
                expected,
                first,
            });
        }
        if let Some((_, f)) = seen.iter().find(|(i, _)| *i == n) {
            return Err(SeriesError::DuplicateIndex {
                file,
                line,
                index: n,
                total: m,
                first: f.clone(),
            });
        }
        seen.push((n, it.file.clone()));
        if it.prefix.version != version {
            return Err(SeriesError::MixedVersions {
                file,
                line,
                version: it.prefix.version,
                expected: version,
                first: first_file,
            });
        }
        if it.prefix.tree != tree {
            return Err(SeriesError::MixedTrees {
                file,
                line,
                tree: it.prefix.tree.clone(),
                expected: tree,
                first: first_file,
            });
        }
    }
    let rfc = items.iter().any(|i| i.prefix.rfc);
    let resend = items.iter().any(|i| i.prefix.resend);
    let cover_item = items.iter().find(|i| i.cover.is_some());
    let change_id = cover_item
        .and_then(|c| c.change_id.clone())
        .or_else(|| items.iter().find_map(|i| i.change_id.clone()));
    let base_commit = cover_item
        .and_then(|c| c.base_commit.clone())
        .or_else(|| items.iter().find_map(|i| i.base_commit.clone()));
    let cover = cover_item.and_then(|c| c.cover.clone());
    let mut patches: Vec<Patch> = items.into_iter().filter_map(|i| i.patch).collect();
    if patches.is_empty() {
        return Err(SeriesError::NoPatches {
            file: source.to_path_buf(),
        });
    }
    patches.sort_by_key(|p| p.index);
    let hashes: Vec<&str> = patches.iter().map(|p| p.sha256.as_str()).collect();
    Ok(Series {
        source: source.to_path_buf(),
        version,
        tree,
        rfc,
        resend,
        change_id,
        base_commit,
        patchset_hash: patchset_hash(&hashes),
        cover,
        patches,
    })
}
