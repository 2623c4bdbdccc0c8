//! Why a series was refused.

use std::path::PathBuf;

/// Why a series was refused. Every variant is unusable input (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum SeriesError {
    /// The I/O error is part of the message, not a separate cause, so a
    /// chain of causes does not print it twice.
    #[error("{}: cannot read: {err}", file.display())]
    Io { file: PathBuf, err: std::io::Error },
    #[error("{}: larger than {limit} bytes; refusing to read it", file.display())]
    TooLarge { file: PathBuf, limit: u64 },
    #[error("{}: no patches (a series needs *.patch files or mbox messages with a diff)", file.display())]
    NoPatches { file: PathBuf },
    #[error("{}:{line}: not a patch: {reason}", file.display())]
    NotAPatch {
        file: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{}:{line}: HTML-only message (Content-Type: text/html); patches must be plain text", file.display())]
    HtmlOnly { file: PathBuf, line: usize },
    #[error("{}:{line}: subject has no n/m patch index: {subject:?}", file.display())]
    MissingIndex {
        file: PathBuf,
        line: usize,
        subject: String,
    },
    #[error("{}:{line}: patch index {index}/{total} is out of range", file.display())]
    IndexOutOfRange {
        file: PathBuf,
        line: usize,
        index: u32,
        total: u32,
    },
    #[error("{}:{line}: duplicate patch {index}/{total}, also in {}", file.display(), first.display())]
    DuplicateIndex {
        file: PathBuf,
        line: usize,
        index: u32,
        total: u32,
        first: PathBuf,
    },
    #[error("{}:{line}: series total {total} disagrees with {expected} in {}", file.display(), first.display())]
    TotalMismatch {
        file: PathBuf,
        line: usize,
        total: u32,
        expected: u32,
        first: PathBuf,
    },
    #[error("{}:{line}: revision v{version} mixed with v{expected} of {}", file.display(), first.display())]
    MixedVersions {
        file: PathBuf,
        line: usize,
        version: u32,
        expected: u32,
        first: PathBuf,
    },
    #[error("{}:{line}: target tree {tree:?} mixed with {expected:?} of {}", file.display(), first.display())]
    MixedTrees {
        file: PathBuf,
        line: usize,
        tree: Option<String>,
        expected: Option<String>,
        first: PathBuf,
    },
    #[error("{}:{line}: corrupt patch: {reason}", file.display())]
    CorruptPatch {
        file: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{}:{line}: patch touches a path outside the tree: {path:?}", file.display())]
    PathOutsideTree {
        file: PathBuf,
        line: usize,
        path: String,
    },
    #[error("{}: {reason}", file.display())]
    Manifest { file: PathBuf, reason: String },
    /// A link, or something other than a regular file, where a series file
    /// was expected.
    #[error(transparent)]
    Unsafe(Box<crate::sandbox::safe_fs::SafeFsError>),
}
