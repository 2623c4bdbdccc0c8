//! The SQLite schema, its migrations and the checks made before a file is
//! trusted: it must be an SQLite file, carry phyfarm's `application_id` (or be
//! empty), and have a `user_version` this phyfarm knows.
//!
//! Since version 2 the schema is append-only, as PostgreSQL's: a run's state
//! is the last row of `run_events`, and its builds, tests and measurements
//! belong to one event (`gen`). With no roles to withhold UPDATE and DELETE,
//! triggers refuse both on every recorded table, for any connection (and an
//! INSERT over a recorded key, which `OR REPLACE` would turn into a delete); an
//! event must follow the run's lifecycle (running → interrupted → complete,
//! complete is final) and results join only the latest event of their run.

use std::io::Read;
use std::path::Path;

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use super::StoreError;

/// `PRAGMA application_id` of a phyfarm store: "phyf".
pub const APPLICATION_ID: i32 = 0x7068_7966;

/// Migration i takes `user_version` i to i + 1; append, never edit.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
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
"#,
    r#"
-- Version 2: append-only, as the PostgreSQL store. A run's state is the last
-- row of run_events; its builds, tests and measurements belong to one event
-- (gen). What version 1 held becomes event 0 and its results.
CREATE TABLE series_trees (
    series_id INTEGER PRIMARY KEY REFERENCES series(id),
    tree      TEXT NOT NULL
);
INSERT INTO series_trees (series_id, tree) SELECT id, tree FROM series WHERE tree IS NOT NULL;
ALTER TABLE series DROP COLUMN tree;

CREATE TABLE run_events (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    seq         INTEGER NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('running', 'complete', 'interrupted')),
    finished    INTEGER,
    accelerator TEXT NOT NULL,
    environment TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
INSERT INTO run_events (run_id, seq, state, finished, accelerator, environment)
    SELECT id, 0, state, finished, accelerator, environment FROM runs;
ALTER TABLE runs DROP COLUMN state;
ALTER TABLE runs DROP COLUMN finished;
ALTER TABLE runs DROP COLUMN accelerator;
ALTER TABLE runs DROP COLUMN environment;

CREATE TABLE builds_v2 (
    run_id       TEXT NOT NULL,
    gen          INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    patch        INTEGER,
    variant      TEXT NOT NULL,
    status       TEXT NOT NULL,
    duration_s   REAL NOT NULL,
    warnings     INTEGER NOT NULL,
    new_warnings TEXT NOT NULL,
    log_path     TEXT,
    log_excerpt  TEXT NOT NULL,
    PRIMARY KEY (run_id, gen, seq),
    FOREIGN KEY (run_id, gen) REFERENCES run_events(run_id, seq)
);
INSERT INTO builds_v2 SELECT run_id, 0, seq, patch, variant, status, duration_s, warnings,
    new_warnings, log_path, log_excerpt FROM builds;
DROP TABLE builds;
ALTER TABLE builds_v2 RENAME TO builds;

CREATE TABLE tests_v2 (
    run_id      TEXT NOT NULL,
    gen         INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    path        TEXT NOT NULL,
    variant     TEXT,
    status      TEXT NOT NULL,
    duration_s  REAL,
    log_path    TEXT,
    log_excerpt TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    PRIMARY KEY (run_id, gen, seq),
    FOREIGN KEY (run_id, gen) REFERENCES run_events(run_id, seq)
);
INSERT INTO tests_v2 SELECT run_id, 0, seq, path, variant, status, duration_s, log_path,
    log_excerpt, attempt FROM tests;
DROP TABLE tests;
ALTER TABLE tests_v2 RENAME TO tests;
CREATE INDEX tests_path ON tests(path);

CREATE TABLE measurements_v2 (
    run_id          TEXT NOT NULL,
    gen             INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    name            TEXT NOT NULL,
    variant         TEXT,
    value           REAL NOT NULL,
    unit            TEXT NOT NULL,
    samples         TEXT NOT NULL,
    lower_is_better INTEGER NOT NULL,
    PRIMARY KEY (run_id, gen, seq),
    FOREIGN KEY (run_id, gen) REFERENCES run_events(run_id, seq)
);
INSERT INTO measurements_v2 SELECT run_id, 0, seq, name, variant, value, unit, samples,
    lower_is_better FROM measurements;
DROP TABLE measurements;
ALTER TABLE measurements_v2 RENAME TO measurements;

-- A run event follows the run's lifecycle: running -> interrupted ->
-- complete, complete is final.
CREATE TRIGGER run_events_lifecycle BEFORE INSERT ON run_events
WHEN NOT coalesce((
    (NOT EXISTS (SELECT 1 FROM run_events WHERE run_id = NEW.run_id)
        AND NEW.seq = 0 AND NEW.state IN ('running', 'complete'))
    OR (NEW.seq = (SELECT max(seq) + 1 FROM run_events WHERE run_id = NEW.run_id)
        AND ((NEW.state IN ('interrupted', 'complete')
              AND (SELECT state FROM run_events WHERE run_id = NEW.run_id
                   ORDER BY seq DESC LIMIT 1) = 'running')
          OR (NEW.state = 'complete'
              AND (SELECT state FROM run_events WHERE run_id = NEW.run_id
                   ORDER BY seq DESC LIMIT 1) = 'interrupted')))), 0)
BEGIN
    SELECT RAISE(ABORT, 'a run event must follow the run lifecycle: stored runs are append-only');
END;
"#,
    r#"
-- Version 3: the first bad patch of a revision for a farm check, as a
-- bisection over its patches found it.
CREATE TABLE first_bad (
    revision_id INTEGER NOT NULL REFERENCES revisions(id),
    seq         INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    check_path  TEXT NOT NULL,
    variant     TEXT,
    patch       INTEGER NOT NULL,
    how         TEXT NOT NULL,
    PRIMARY KEY (revision_id, seq)
);
"#,
];

/// The tables a store records into. Each refuses UPDATE and DELETE (see
/// [`append_only_triggers`]); version 2 made the store append-only.
pub(super) const RECORDED_TABLES: &[&str] = &[
    "series",
    "series_trees",
    "revisions",
    "patches",
    "runs",
    "run_events",
    "builds",
    "tests",
    "measurements",
    "transitions",
    "reviews",
    "first_bad",
];

/// The keys of each recorded table: an INSERT that matches a recorded row
/// on one of them is refused before SQLite's conflict handling could
/// replace that row (`INSERT OR REPLACE` deletes without a DELETE trigger).
const KEYS: &[(&str, &[&[&str]])] = &[
    ("series", &[&["id"], &["name"]]),
    ("series_trees", &[&["series_id"]]),
    ("revisions", &[&["id"], &["series_id", "version"]]),
    ("patches", &[&["revision_id", "position"]]),
    ("runs", &[&["id"]]),
    ("run_events", &[&["run_id", "seq"]]),
    ("builds", &[&["run_id", "gen", "seq"]]),
    ("tests", &[&["run_id", "gen", "seq"]]),
    ("measurements", &[&["run_id", "gen", "seq"]]),
    ("transitions", &[&["revision_id", "seq"]]),
    ("reviews", &[&["revision_id", "seq"]]),
    ("first_bad", &[&["revision_id", "seq"]]),
];

/// Triggers that make every recorded table refuse UPDATE, DELETE and an
/// INSERT over a recorded row, and results join only the latest event of
/// their run.
pub(super) fn append_only_triggers() -> String {
    let mut sql = String::new();
    for (t, keys) in KEYS {
        let matches: Vec<String> = keys
            .iter()
            .map(|cols| {
                let eq: Vec<String> = cols.iter().map(|c| format!("{c} = NEW.{c}")).collect();
                format!("({})", eq.join(" AND "))
            })
            .collect();
        sql.push_str(&format!(
            "CREATE TRIGGER IF NOT EXISTS {t}_no_replace BEFORE INSERT ON {t}
             WHEN EXISTS (SELECT 1 FROM {t} WHERE {})
             BEGIN SELECT RAISE(ABORT, '{t} is append-only: a row with this key is recorded'); END;\n",
            matches.join(" OR ")
        ));
    }
    for t in RECORDED_TABLES {
        for op in ["UPDATE", "DELETE"] {
            sql.push_str(&format!(
                "CREATE TRIGGER IF NOT EXISTS {t}_no_{name} BEFORE {op} ON {t}
                 BEGIN SELECT RAISE(ABORT, '{t} is append-only: nothing recorded is overwritten'); END;\n",
                name = op.to_lowercase(),
            ));
        }
    }
    for t in ["builds", "tests", "measurements"] {
        sql.push_str(&format!(
            "CREATE TRIGGER IF NOT EXISTS {t}_latest_event BEFORE INSERT ON {t}
             WHEN NEW.gen IS NOT (SELECT max(seq) FROM run_events WHERE run_id = NEW.run_id)
             BEGIN SELECT RAISE(ABORT, 'results join only the latest event of their run'); END;\n"
        ));
    }
    sql
}

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
    tx.execute_batch(&append_only_triggers()).map_err(err)?;
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(err)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(err)?;
    tx.commit().map_err(err)
}
