//! The SQLite schema, its migrations and the checks made before a file is
//! trusted: it must be an SQLite file, carry phyfarm's `application_id` (or be
//! empty), and have a `user_version` this phyfarm knows.

use std::io::Read;
use std::path::Path;

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use super::StoreError;

/// `PRAGMA application_id` of a phyfarm store: "phyf".
pub const APPLICATION_ID: i32 = 0x7068_7966;

/// Migration i takes `user_version` i to i + 1; append, never edit.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE series (
    id        INTEGER PRIMARY KEY,
    name      TEXT NOT NULL UNIQUE,
    change_id TEXT,
    tree      TEXT
);
CREATE TABLE revisions (
    id            INTEGER PRIMARY KEY,
    series_id     INTEGER NOT NULL REFERENCES series(id),
    version       INTEGER NOT NULL,
    change_id     TEXT,
    message_id    TEXT,
    patchset_hash TEXT NOT NULL,
    created       INTEGER NOT NULL,
    UNIQUE (series_id, version)
);
CREATE INDEX revisions_change_id ON revisions(change_id, version);
CREATE TABLE patches (
    revision_id  INTEGER NOT NULL REFERENCES revisions(id),
    position     INTEGER NOT NULL,
    subject      TEXT NOT NULL,
    author       TEXT NOT NULL,
    author_email TEXT NOT NULL,
    message_id   TEXT,
    patch_id     TEXT NOT NULL,
    file         TEXT NOT NULL,
    PRIMARY KEY (revision_id, position)
);
CREATE INDEX patches_message_id ON patches(message_id);
CREATE INDEX patches_patch_id ON patches(patch_id);
CREATE TABLE runs (
    id          TEXT PRIMARY KEY,
    revision_id INTEGER REFERENCES revisions(id),
    base        TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    environment TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('running', 'complete', 'interrupted')),
    started     INTEGER NOT NULL,
    finished    INTEGER,
    reproducer  TEXT NOT NULL,
    pid         INTEGER,
    host        TEXT
);
CREATE INDEX runs_revision ON runs(revision_id, started);
CREATE INDEX runs_base ON runs(base, started) WHERE revision_id IS NULL;
CREATE TABLE builds (
    run_id       TEXT NOT NULL REFERENCES runs(id),
    seq          INTEGER NOT NULL,
    patch        INTEGER,
    variant      TEXT NOT NULL,
    status       TEXT NOT NULL,
    duration_s   REAL NOT NULL,
    warnings     INTEGER NOT NULL,
    new_warnings TEXT NOT NULL,
    log_path     TEXT,
    log_excerpt  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE tests (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    seq         INTEGER NOT NULL,
    path        TEXT NOT NULL,
    variant     TEXT,
    status      TEXT NOT NULL,
    duration_s  REAL,
    log_path    TEXT,
    log_excerpt TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX tests_path ON tests(path);
CREATE TABLE measurements (
    run_id          TEXT NOT NULL REFERENCES runs(id),
    seq             INTEGER NOT NULL,
    name            TEXT NOT NULL,
    variant         TEXT,
    value           REAL NOT NULL,
    unit            TEXT NOT NULL,
    samples         TEXT NOT NULL,
    lower_is_better INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE transitions (
    revision_id INTEGER NOT NULL REFERENCES revisions(id),
    seq         INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    PRIMARY KEY (revision_id, seq)
);
CREATE TABLE reviews (
    revision_id INTEGER NOT NULL REFERENCES revisions(id),
    seq         INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    by          TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('ack', 'nack')),
    reason      TEXT NOT NULL,
    PRIMARY KEY (revision_id, seq)
);
"#];

/// The schema version this phyfarm writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Before SQLite sees the file: an existing non-empty file must start with
/// the SQLite header, else it is someone else's file.
pub(super) fn check_header(path: &Path) -> Result<bool, StoreError> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut head = Vec::with_capacity(16);
    f.by_ref()
        .take(16)
        .read_to_end(&mut head)
        .map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if head.is_empty() {
        return Ok(true);
    }
    if head.as_slice() != SQLITE_MAGIC {
        let shown: String = head
            .iter()
            .map(|&b| if b.is_ascii_graphic() { b as char } else { '.' })
            .collect();
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            detail: format!("not an SQLite database: it starts with {shown:?}"),
        });
    }
    Ok(true)
}

/// Map an SQLite error, naming corruption as such.
pub(super) fn sql_err(path: &Path, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseCorrupt) | Some(ErrorCode::NotADatabase) => StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
        _ => StoreError::Sqlite {
            path: path.to_path_buf(),
            source: e,
        },
    }
}

fn identity(conn: &Connection) -> rusqlite::Result<(i32, u32, Vec<String>)> {
    let app: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )?;
    let tables = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok((app, version, tables))
}

/// Check the file is ours and not newer, then bring it to
/// [`SCHEMA_VERSION`]. Nothing is written to a file that fails a check.
pub(super) fn prepare(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let err = |e| sql_err(path, e);
    let check = |app: i32, version: u32, tables: &[String]| -> Result<(), StoreError> {
        if app == APPLICATION_ID {
            if version > SCHEMA_VERSION {
                return Err(StoreError::NewerSchema {
                    path: path.to_path_buf(),
                    found: version,
                    supported: SCHEMA_VERSION,
                });
            }
            return Ok(());
        }
        if app == 0 && version == 0 && tables.is_empty() {
            return Ok(());
        }
        let mut detail = format!("application_id {app:#x}, user_version {version}");
        if !tables.is_empty() {
            detail.push_str(&format!(", tables {}", tables.join(", ")));
        }
        Err(StoreError::Foreign {
            path: path.to_path_buf(),
            detail,
        })
    };
    let (app, version, tables) = identity(conn).map_err(err)?;
    check(app, version, &tables)?;
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .map_err(err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
            .map_err(err)?;
    }
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(err)?;
    // Another process may have migrated while we waited for the lock.
    let (app, version, tables) = identity(&tx).map_err(err)?;
    check(app, version, &tables)?;
    for sql in &MIGRATIONS[version as usize..] {
        tx.execute_batch(sql).map_err(err)?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(err)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(err)?;
    tx.commit().map_err(err)
}
