//! The PostgreSQL schema, its migrations, and the checks made before a
//! database is trusted: the store lives in the connection's current schema
//! (`public`, or the first of `search_path`), which must be empty or carry
//! phyfarm's `phyfarm_schema` table with a version this phyfarm knows.
//!
//! As in the SQLite schema the result tables are append-only: a run's state
//! is the last row of `run_events`, and its builds, tests and measurements
//! belong to one event (`gen`). So the runtime needs only `SELECT` and
//! `INSERT`, and triggers keep even a role that has only those from changing
//! a finished run: an event must follow the run's lifecycle (running →
//! interrupted → complete, complete is final) and results are accepted only
//! in the transaction that wrote their event.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use postgres::config::{Host, SslMode};
use postgres::error::SqlState;
use postgres::{Client, Config};

use super::{OpenMode, StoreError};

/// Migration i takes the store from version i to i + 1; append, never edit.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE phyfarm_schema (
    version  integer PRIMARY KEY,
    applied  bigint NOT NULL,
    phyfarm  text NOT NULL
);
CREATE TABLE series (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name      text NOT NULL UNIQUE,
    change_id text
);
CREATE TABLE series_trees (
    series_id bigint PRIMARY KEY REFERENCES series(id),
    tree      text NOT NULL
);
CREATE TABLE revisions (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    series_id     bigint NOT NULL REFERENCES series(id),
    version       bigint NOT NULL,
    change_id     text,
    message_id    text,
    patchset_hash text NOT NULL,
    created       bigint NOT NULL,
    UNIQUE (series_id, version)
);
CREATE INDEX revisions_change_id ON revisions(change_id, version);
CREATE TABLE patches (
    revision_id  bigint NOT NULL REFERENCES revisions(id),
    position     bigint NOT NULL,
    subject      text NOT NULL,
    author       text NOT NULL,
    author_email text NOT NULL,
    message_id   text,
    patch_id     text NOT NULL,
    file         text NOT NULL,
    PRIMARY KEY (revision_id, position)
);
CREATE INDEX patches_message_id ON patches(message_id);
CREATE INDEX patches_patch_id ON patches(patch_id);
CREATE TABLE runs (
    id          text PRIMARY KEY,
    revision_id bigint REFERENCES revisions(id),
    base        text NOT NULL,
    started     bigint NOT NULL,
    reproducer  text NOT NULL,
    pid         bigint,
    host        text
);
CREATE INDEX runs_revision ON runs(revision_id, started);
CREATE INDEX runs_base ON runs(base, started) WHERE revision_id IS NULL;
CREATE TABLE run_events (
    run_id      text NOT NULL REFERENCES runs(id),
    seq         bigint NOT NULL,
    state       text NOT NULL CHECK (state IN ('running', 'complete', 'interrupted')),
    finished    bigint,
    accelerator text NOT NULL,
    environment text NOT NULL,
    txid        bigint NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE builds (
    run_id       text NOT NULL,
    gen          bigint NOT NULL,
    seq          bigint NOT NULL,
    patch        bigint,
    variant      text NOT NULL,
    status       text NOT NULL,
    duration_s   double precision NOT NULL,
    warnings     bigint NOT NULL,
    new_warnings text NOT NULL,
    log_path     text,
    log_excerpt  text NOT NULL,
    PRIMARY KEY (run_id, gen, seq),
    FOREIGN KEY (run_id, gen) REFERENCES run_events(run_id, seq)
);
CREATE TABLE tests (
    run_id      text NOT NULL,
    gen         bigint NOT NULL,
    seq         bigint NOT NULL,
    path        text NOT NULL,
    variant     text,
    status      text NOT NULL,
    duration_s  double precision,
    log_path    text,
    log_excerpt text NOT NULL,
    attempt     bigint NOT NULL,
    PRIMARY KEY (run_id, gen, seq),
    FOREIGN KEY (run_id, gen) REFERENCES run_events(run_id, seq)
);
CREATE INDEX tests_path ON tests(path);
CREATE TABLE measurements (
    run_id          text NOT NULL,
    gen             bigint NOT NULL,
    seq             bigint NOT NULL,
    name            text NOT NULL,
    variant         text,
    value           double precision NOT NULL,
    unit            text NOT NULL,
    samples         text NOT NULL,
    lower_is_better boolean NOT NULL,
    PRIMARY KEY (run_id, gen, seq),
    FOREIGN KEY (run_id, gen) REFERENCES run_events(run_id, seq)
);
CREATE TABLE transitions (
    revision_id bigint NOT NULL REFERENCES revisions(id),
    seq         bigint NOT NULL,
    at          bigint NOT NULL,
    state       text NOT NULL,
    reason      text NOT NULL,
    PRIMARY KEY (revision_id, seq)
);
CREATE TABLE reviews (
    revision_id bigint NOT NULL REFERENCES revisions(id),
    seq         bigint NOT NULL,
    at          bigint NOT NULL,
    reviewer    text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('ack', 'nack')),
    reason      text NOT NULL,
    PRIMARY KEY (revision_id, seq)
);

-- Tables are named through TG_TABLE_SCHEMA, never the caller's search_path.
CREATE FUNCTION phyfarm_run_event_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_seq   bigint;
    last_state text;
BEGIN
    EXECUTE format('SELECT seq, state FROM %I.run_events WHERE run_id = $1 ORDER BY seq DESC LIMIT 1',
                   TG_TABLE_SCHEMA)
        INTO last_seq, last_state USING NEW.run_id;
    IF NOT ((last_state IS NULL AND NEW.seq = 0 AND NEW.state IN ('running', 'complete'))
         OR (last_state = 'running' AND NEW.seq = last_seq + 1
             AND NEW.state IN ('interrupted', 'complete'))
         OR (last_state = 'interrupted' AND NEW.seq = last_seq + 1 AND NEW.state = 'complete'))
    THEN
        RAISE EXCEPTION 'run %: a % event (seq %) cannot follow %: stored runs are append-only',
            NEW.run_id, NEW.state, NEW.seq, coalesce(last_state, 'nothing')
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.txid := txid_current();
    RETURN NEW;
END $$;
CREATE TRIGGER run_events_lifecycle BEFORE INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION phyfarm_run_event_check();

CREATE FUNCTION phyfarm_result_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_tx bigint;
BEGIN
    EXECUTE format('SELECT txid FROM %I.run_events WHERE run_id = $1 AND seq = $2', TG_TABLE_SCHEMA)
        INTO event_tx USING NEW.run_id, NEW.gen;
    IF event_tx IS DISTINCT FROM txid_current() THEN
        RAISE EXCEPTION 'run %: results are written only with their run state, in one transaction',
            NEW.run_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER builds_append BEFORE INSERT ON builds
    FOR EACH ROW EXECUTE FUNCTION phyfarm_result_check();
CREATE TRIGGER tests_append BEFORE INSERT ON tests
    FOR EACH ROW EXECUTE FUNCTION phyfarm_result_check();
CREATE TRIGGER measurements_append BEFORE INSERT ON measurements
    FOR EACH ROW EXECUTE FUNCTION phyfarm_result_check();
"#,
    r#"
-- Version 2: the first bad patch of a revision for a farm check, as a
-- bisection over its patches found it.
CREATE TABLE first_bad (
    revision_id bigint NOT NULL REFERENCES revisions(id),
    seq         bigint NOT NULL,
    at          bigint NOT NULL,
    check_path  text NOT NULL,
    variant     text,
    patch       bigint NOT NULL,
    how         text NOT NULL,
    PRIMARY KEY (revision_id, seq)
);
"#,
];

/// The schema version this phyfarm writes.
pub const PG_SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// First key of the advisory locks that serialise writers and migrations
/// ("phyf"); the second is a hash of the store's schema name.
pub(super) const LOCK_KEY: i32 = 0x7068_7966;

/// Take the store's write lock for the rest of the transaction.
pub(super) const LOCK_SQL: &str = "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))";

/// The URL with any password replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    let mut out = url.to_string();
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some(colon) = rest[..at].find(':') {
                out = format!("{scheme}://{}:***{}", &rest[..colon], &rest[at..]);
            }
        }
    }
    if let Some(i) = out.find("password=") {
        let end = out[i..].find('&').map_or(out.len(), |e| i + e);
        out.replace_range(i..end, "password=***");
    }
    out
}

fn bad_location(loc: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::BadLocation {
        path: loc.to_path_buf(),
        detail: detail.into(),
    }
}

/// Parse the URL, refuse what the built-in client cannot honour, and fill in
/// the user, the password (`PGPASSWORD`, then the `.pgpass` file as libpq
/// reads it) and a connect timeout.
pub(super) fn config(url: &str, loc: &Path) -> Result<Config, StoreError> {
    if let Some(mode) = url
        .split(['?', '&'])
        .skip(1)
        .find_map(|kv| kv.strip_prefix("sslmode="))
        .filter(|m| !matches!(*m, "disable" | "prefer"))
    {
        return Err(bad_location(
            loc,
            format!(
                "sslmode={mode}: phyfarm's PostgreSQL client has no TLS; reach the server on \
                 loopback through an ssh tunnel or a VPN and use sslmode=disable"
            ),
        ));
    }
    let mut config = Config::from_str(url)
        .map_err(|e| bad_location(loc, format!("not a PostgreSQL URL ({e})")))?;
    config.ssl_mode(SslMode::Disable);
    if config.get_user().is_none() {
        let user = std::env::var("PGUSER")
            .or_else(|_| std::env::var("USER"))
            .or_else(|_| std::env::var("LOGNAME"))
            .map_err(|_| bad_location(loc, "no user in the URL and none in PGUSER or USER"))?;
        config.user(&user);
    }
    if config.get_password().is_none() {
        if let Some(pw) = std::env::var("PGPASSWORD").ok().or_else(|| pgpass(&config)) {
            config.password(pw);
        }
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    Ok(config)
}

/// The password for `config` from `PGPASSFILE` or `~/.pgpass`, which must
/// not be readable by group or others (as libpq requires).
fn pgpass(config: &Config) -> Option<String> {
    let file = std::env::var_os("PGPASSFILE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")))?;
    let meta = std::fs::metadata(&file).ok()?;
    use std::os::unix::fs::PermissionsExt;
    if meta.permissions().mode() & 0o077 != 0 {
        eprintln!(
            "W: {} is readable by group or others; ignoring it (chmod 600)",
            file.display()
        );
        return None;
    }
    let text = std::fs::read_to_string(&file).ok()?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(_)) | None => "localhost".to_string(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default();
    let db = config.get_dbname().unwrap_or(user);
    pgpass_lookup(&text, [&host, &port, db, user])
}

/// The first `.pgpass` line matching host, port, database and user.
pub(super) fn pgpass_lookup(text: &str, want: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = vec![String::new()];
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => fields.last_mut()?.extend(chars.next()),
                ':' if fields.len() < 5 => fields.push(String::new()),
                c => fields.last_mut()?.push(c),
            }
        }
        if fields.len() != 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(want)
            .all(|(f, w)| f.as_str() == "*" || f.as_str() == w)
        {
            return fields.pop();
        }
    }
    None
}

/// A client error with its causes: the server's message, detail, hint and
/// SQLSTATE, or the I/O error behind a failed connection.
pub(super) fn pg_detail(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(d) = db.detail() {
            s.push_str(&format!("; {d}"));
        }
        if let Some(h) = db.hint() {
            s.push_str(&format!("; hint: {h}"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        s.push_str(&format!(": {c}"));
        cause = c.source();
    }
    s
}

pub(super) fn pg_err(loc: &Path, e: postgres::Error) -> StoreError {
    StoreError::Postgres {
        path: loc.to_path_buf(),
        error: e,
    }
}

/// The tables of the current schema and, if it is a store, its version.
fn identity(
    client: &mut impl postgres::GenericClient,
    loc: &Path,
) -> Result<Vec<String>, StoreError> {
    let schema: Option<String> = client
        .query_one("SELECT current_schema()", &[])
        .map_err(|e| pg_err(loc, e))?
        .get(0);
    if schema.is_none() {
        return Err(bad_location(
            loc,
            "no schema of the search_path exists; create it or fix options=-csearch_path",
        ));
    }
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
             ORDER BY 1",
            &[],
        )
        .map_err(|e| pg_err(loc, e))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// None: an empty schema; else the stored version. Foreign or unreadable
/// contents are refused.
fn version(
    client: &mut impl postgres::GenericClient,
    loc: &Path,
) -> Result<Option<u32>, StoreError> {
    let tables = identity(client, loc)?;
    if tables.is_empty() {
        return Ok(None);
    }
    if !tables.iter().any(|t| t == "phyfarm_schema") {
        return Err(StoreError::Foreign {
            path: loc.to_path_buf(),
            detail: format!("no phyfarm_schema table; tables {}", tables.join(", ")),
        });
    }
    let v: Option<i32> = client
        .query_one("SELECT max(version) FROM phyfarm_schema", &[])
        .map_err(|e| pg_err(loc, e))?
        .get(0);
    match v.map(u32::try_from) {
        Some(Ok(v)) if v > 0 => Ok(Some(v)),
        other => Err(StoreError::Corrupt {
            path: loc.to_path_buf(),
            detail: format!("phyfarm_schema holds no valid version ({other:?})"),
        }),
    }
}

fn check(version: Option<u32>, loc: &Path, mode: OpenMode) -> Result<bool, StoreError> {
    match version {
        Some(v) if v > PG_SCHEMA_VERSION => Err(StoreError::NewerSchema {
            path: loc.to_path_buf(),
            found: v,
            supported: PG_SCHEMA_VERSION,
        }),
        Some(v) => Ok(v < PG_SCHEMA_VERSION),
        None if mode == OpenMode::Existing => Err(StoreError::Missing {
            path: loc.to_path_buf(),
        }),
        None => Ok(true),
    }
}

/// Check the schema is ours and not newer, then bring it to
/// [`PG_SCHEMA_VERSION`] under the store's lock. Nothing is written to a
/// schema that fails a check.
pub(super) fn prepare(client: &mut Client, loc: &Path, mode: OpenMode) -> Result<(), StoreError> {
    let found = version(client, loc)?;
    if !check(found, loc, mode)? {
        return Ok(());
    }
    let mut tx = client.transaction().map_err(|e| pg_err(loc, e))?;
    tx.execute(LOCK_SQL, &[&LOCK_KEY])
        .map_err(|e| pg_err(loc, e))?;
    // Another process may have migrated while we waited for the lock.
    let found = version(&mut tx, loc)?;
    if !check(found, loc, mode)? {
        return Ok(());
    }
    let from = found.unwrap_or(0);
    let denied = |e: postgres::Error| match e.code() {
        Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => StoreError::MigrationDenied {
            path: loc.to_path_buf(),
            found: from,
            supported: PG_SCHEMA_VERSION,
            detail: e
                .as_db_error()
                .map_or(e.to_string(), |d| d.message().to_string()),
        },
        _ => pg_err(loc, e),
    };
    let now = crate::results::Timestamp::now().0;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(from as usize) {
        tx.batch_execute(sql).map_err(denied)?;
        tx.execute(
            "INSERT INTO phyfarm_schema (version, applied, phyfarm) VALUES ($1, $2, $3)",
            &[&(i as i32 + 1), &now, &env!("CARGO_PKG_VERSION")],
        )
        .map_err(denied)?;
    }
    tx.commit().map_err(|e| pg_err(loc, e))
}
