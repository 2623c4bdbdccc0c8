//! Where pages read from: the results store, read consistently.
//!
//! A page makes many store reads. So that a run being recorded while a page
//! is built cannot give a page half of it, each page is built as one read:
//! a second, read-only connection watches SQLite's `data_version`, which
//! changes whenever another connection commits. A page built while the
//! number stayed the same saw one state of the store; otherwise it is built
//! again (a few times, then the page says the store is busy).

use std::path::{Path, PathBuf};

use phyfarm::store::{OpenMode, SqliteStore, Store, StoreError};
use rusqlite::{Connection, OpenFlags};

/// How often a page is rebuilt while writers keep committing.
pub const ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("store {path}: {source}")]
    Watch {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("store {0} kept changing while this page was read; reload the page")]
    Busy(PathBuf),
}

/// The store behind the dashboard. It may not exist yet (no run recorded):
/// every read then returns `None` and the pages say how to run a job.
pub struct Source {
    path: PathBuf,
    open: Option<(SqliteStore, Connection)>,
}

impl Source {
    pub fn new(path: &Path) -> Source {
        Source {
            path: path.to_path_buf(),
            open: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn ensure_open(&mut self) -> Result<bool, SourceError> {
        if self.open.is_some() {
            return Ok(true);
        }
        let store = match SqliteStore::open(&self.path, OpenMode::Existing) {
            Ok(s) => s,
            Err(StoreError::Missing { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let watch = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|source| SourceError::Watch {
            path: self.path.clone(),
            source,
        })?;
        self.open = Some((store, watch));
        Ok(true)
    }

    /// Build something from one consistent state of the store; `None` when
    /// the store does not exist yet.
    pub fn read<T, E>(
        &mut self,
        mut build: impl FnMut(&dyn Store) -> Result<T, E>,
    ) -> Result<Option<Result<T, E>>, SourceError> {
        if !self.ensure_open()? {
            return Ok(None);
        }
        let path = self.path.clone();
        let (store, watch) = self.open.as_ref().expect("opened above");
        let version = |w: &Connection| {
            w.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .map_err(|source| SourceError::Watch {
                    path: path.clone(),
                    source,
                })
        };
        for _ in 0..ATTEMPTS {
            let before = version(watch)?;
            let page = build(store);
            if version(watch)? == before {
                return Ok(Some(page));
            }
        }
        Err(SourceError::Busy(path))
    }
}
