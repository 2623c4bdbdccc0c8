//! Where pages read from: the results store, SQLite or PostgreSQL, read
//! consistently.
//!
//! A page makes many store reads. So that a run being recorded while a page
//! is built cannot give a page half of it, each page is built as one read:
//! the store's [`Store::generation`] grows with every write that commits
//! (the store only appends), so a page built while it stayed the same saw
//! one state of the store; otherwise it is built again (a few times, then
//! the page says the store is busy).

use std::path::{Path, PathBuf};

use phyfarm::store::{self, OpenMode, Store, StoreError};

/// How often a page is rebuilt while writers keep committing.
pub const ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("store {0} kept changing while this page was read; reload the page")]
    Busy(String),
}

/// The store behind the dashboard: an SQLite file or a `postgresql://` URL.
/// It may not exist yet (no run recorded): every read then returns `None`
/// and the pages say how to run a job.
pub struct Source {
    location: PathBuf,
    name: String,
    open: Option<Box<dyn Store>>,
}

impl Source {
    pub fn new(location: &Path) -> Source {
        Source {
            location: location.to_path_buf(),
            name: store::display_location(location),
            open: None,
        }
    }

    /// The store's location fit for pages and messages (a URL loses its
    /// password).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn ensure_open(&mut self) -> Result<bool, SourceError> {
        if self.open.is_some() {
            return Ok(true);
        }
        match store::open(&self.location, OpenMode::Existing) {
            Ok(s) => self.open = Some(s),
            Err(StoreError::Missing { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        Ok(true)
    }

    /// Build something from one consistent state of the store; `None` when
    /// the store does not exist yet.
    pub fn read<T, E>(
        &mut self,
        build: impl FnMut(&dyn Store) -> Result<T, E>,
    ) -> Result<Option<Result<T, E>>, SourceError> {
        if !self.ensure_open()? {
            return Ok(None);
        }
        let store = self.open.as_deref().expect("opened above");
        match store::read_consistently(store, ATTEMPTS, build) {
            Ok(Ok(page)) => Ok(Some(page)),
            Ok(Err(store::KeptChanging)) => Err(SourceError::Busy(self.name.clone())),
            Err(e) => {
                // A lost connection (a restarted database server) is opened
                // afresh by the next page.
                self.open = None;
                Err(e.into())
            }
        }
    }
}
