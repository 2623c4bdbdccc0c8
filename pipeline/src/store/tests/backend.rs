//! The backends the store tests run against: an SQLite file in a temporary
//! directory, and a fresh schema on the PostgreSQL server named by
//! `PHYFARM_TEST_POSTGRES` (a URL; `make unit` starts one with
//! containers/postgres-test.sh). Without it the PostgreSQL tests say SKIP
//! and return.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use sha2::{Digest, Sha256};

use crate::store::{open, OpenMode, Store, StoreError, PG_SCHEMA_VERSION, SCHEMA_VERSION};

/// What the test bodies need from a backend beyond the [`Store`] trait:
/// a location for [`open`], and raw access to poke at what is stored.
pub trait Backend {
    /// What `PHYFARM_STORE` would hold.
    fn location(&self) -> PathBuf;
    fn open(&self, mode: OpenMode) -> Result<Box<dyn Store>, StoreError> {
        open(&self.location(), mode)
    }
    /// Run SQL on the store directly, past every phyfarm check (as the
    /// store's owner would: on SQLite its append-only triggers are lifted
    /// for the statement and put back).
    fn exec(&self, sql: &str);
    /// Every row of every table the store records into, as text: what an
    /// append-only store only ever adds to.
    fn rows(&self) -> std::collections::BTreeSet<String>;
    /// A digest of everything stored, to tell "left untouched".
    fn fingerprint(&self) -> String;
    /// Make the stored schema claim version `v`.
    fn set_schema_version(&self, v: u32);
    /// The schema version this phyfarm writes for the backend.
    fn supported_version(&self) -> u32;
}

pub struct Sqlite {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Sqlite {
    pub fn new() -> Sqlite {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.sqlite");
        Sqlite { _dir: dir, path }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Backend for Sqlite {
    fn location(&self) -> PathBuf {
        self.path.clone()
    }

    fn exec(&self, sql: &str) {
        let mut c = rusqlite::Connection::open(&self.path).unwrap();
        let tx = c.transaction().unwrap();
        let triggers: Vec<(String, String)> = tx
            .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        for (name, _) in &triggers {
            tx.execute_batch(&format!("DROP TRIGGER {name}")).unwrap();
        }
        tx.execute_batch(sql).unwrap();
        for (_, sql) in &triggers {
            tx.execute_batch(sql).unwrap();
        }
        tx.commit().unwrap();
    }

    fn rows(&self) -> std::collections::BTreeSet<String> {
        let c = rusqlite::Connection::open(&self.path).unwrap();
        let mut out = std::collections::BTreeSet::new();
        for t in crate::store::schema::RECORDED_TABLES {
            let mut stmt = c.prepare(&format!("SELECT * FROM {t}")).unwrap();
            let n = stmt.column_count();
            let rows = stmt
                .query_map([], |r| {
                    let cols = (0..n)
                        .map(|i| Ok(format!("{:?}", r.get_ref(i)?)))
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    Ok(format!("{t}: {}", cols.join(", ")))
                })
                .unwrap()
                .collect::<rusqlite::Result<Vec<_>>>()
                .unwrap();
            out.extend(rows);
        }
        out
    }

    fn fingerprint(&self) -> String {
        match std::fs::read(&self.path) {
            Ok(bytes) => format!("{:x}", Sha256::digest(bytes)),
            Err(e) => format!("no file ({})", e.kind()),
        }
    }

    fn set_schema_version(&self, v: u32) {
        let c = rusqlite::Connection::open(&self.path).unwrap();
        c.pragma_update(None, "user_version", v).unwrap();
    }

    fn supported_version(&self) -> u32 {
        SCHEMA_VERSION
    }
}

/// A schema of its own on the test server, dropped (with the roles a test
/// made) when the test ends, so tests run in parallel.
pub struct Postgres {
    admin: RefCell<postgres::Client>,
    url: String,
    schema: String,
    roles: RefCell<Vec<String>>,
}

/// The URL of the test server, or None after printing why the test is
/// skipped.
pub fn test_server() -> Option<String> {
    match std::env::var("PHYFARM_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!(
                "SKIP: PHYFARM_TEST_POSTGRES is not set, so the PostgreSQL store tests cannot run \
                 (`make unit` starts a server with containers/postgres-test.sh and sets it)"
            );
            None
        }
    }
}

/// `url` with `key=value` added to its query.
pub fn with_param(url: &str, kv: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{kv}")
}

/// `url` with its user and password replaced.
pub fn with_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host = match rest[..end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!("{scheme}://{user}:{password}@{host}")
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Postgres {
    /// A fresh schema, or None (test skipped) without a server.
    pub fn new() -> Option<Postgres> {
        let url = test_server()?;
        let mut admin = postgres::Client::connect(&url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("PHYFARM_TEST_POSTGRES is set but unusable: {e}"));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let schema = format!(
            "t_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .unwrap();
        Some(Postgres {
            admin: RefCell::new(admin),
            url,
            schema,
            roles: RefCell::new(vec![]),
        })
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The store's URL for another user.
    pub fn location_as(&self, user: &str, password: &str) -> PathBuf {
        let url = with_user(&self.url, user, password);
        PathBuf::from(with_param(
            &url,
            &format!("options=-csearch_path%3D{}", self.schema),
        ))
    }

    /// A login role dropped with the schema; returns its name.
    pub fn role(&self, suffix: &str, password: &str) -> String {
        let name = format!("{}_{suffix}", self.schema);
        self.admin
            .borrow_mut()
            .batch_execute(&format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
            .unwrap();
        self.roles.borrow_mut().push(name.clone());
        name
    }

    /// Rows of one query on the store's schema, each as text columns.
    pub fn query(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let mut c = self.admin.borrow_mut();
        c.batch_execute(&format!("SET search_path TO {}", self.schema))
            .unwrap();
        let rows = c.simple_query(sql).unwrap();
        rows.into_iter()
            .filter_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect()
    }
}

impl Backend for Postgres {
    fn location(&self) -> PathBuf {
        PathBuf::from(with_param(
            &self.url,
            &format!("options=-csearch_path%3D{}", self.schema),
        ))
    }

    fn exec(&self, sql: &str) {
        self.admin
            .borrow_mut()
            .batch_execute(&format!("SET search_path TO {}; {sql}", self.schema))
            .unwrap();
    }

    fn rows(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for t in crate::store::schema::RECORDED_TABLES {
            for row in self.query(&format!("SELECT x::text FROM {t} x")) {
                out.insert(format!("{t}: {}", row[0].clone().unwrap_or_default()));
            }
        }
        out
    }

    fn fingerprint(&self) -> String {
        let tables = self.query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relkind = 'r' ORDER BY 1",
        );
        let mut out = String::new();
        for t in tables {
            let name = t[0].clone().unwrap();
            let rows = self.query(&format!(
                "SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM {name} x"
            ));
            out.push_str(&format!("{name}={:?};", rows[0][0]));
        }
        out
    }

    fn set_schema_version(&self, v: u32) {
        self.exec(&format!(
            "INSERT INTO phyfarm_schema (version, applied, phyfarm) VALUES ({v}, 0, 'test')"
        ));
    }

    fn supported_version(&self) -> u32 {
        PG_SCHEMA_VERSION
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let mut c = self.admin.borrow_mut();
        let mut sql = format!("DROP SCHEMA IF EXISTS {} CASCADE;", self.schema);
        for r in self.roles.borrow().iter() {
            sql.push_str(&format!("DROP ROLE IF EXISTS {r};"));
        }
        if let Err(e) = c.batch_execute(&sql) {
            eprintln!("W: dropping test schema {}: {e}", self.schema);
        }
    }
}
