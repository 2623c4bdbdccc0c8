//! The dashboard as static files for GitHub Pages: every page as
//! `<path>.html` beside its `<path>.json` twin, the assets under `static/`,
//! a `404.html`, all built from one consistent read of the store.
//!
//! Links are relative, so the folder also works opened from disk, or
//! absolute under `--base-url` for a Pages site.

use std::path::{Path, PathBuf};

use phyfarm::results::Timestamp;
use phyfarm::store::Store;

use crate::assets;
use crate::model::{self, PageError};
use crate::render::Site;
use crate::routes::{self, percent_decode, Rendered, Route};
use crate::source::{Source, SourceError};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Page(#[from] PageError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--base-url {0:?}: must start with http:// or https:// or /")]
    BadBaseUrl(String),
}

/// What an export wrote.
#[derive(Debug, Default)]
pub struct Summary {
    pub pages: usize,
    /// Pages left out because a name cannot be a file name (`..`, `/`).
    pub skipped: Vec<String>,
}

/// The file a page path becomes: each segment decoded; None if a segment
/// cannot be a file name.
fn file_for(dir: &Path, path: &str, ext: &str) -> Option<PathBuf> {
    let path = if path.is_empty() { "index" } else { path };
    let mut out = dir.to_path_buf();
    let segs: Vec<&str> = path.split('/').collect();
    for (i, seg) in segs.iter().enumerate() {
        let s = percent_decode(seg)?;
        if s.is_empty() || s == "." || s == ".." || s.contains(['/', '\\', '\0']) {
            return None;
        }
        if i + 1 == segs.len() {
            out.push(format!("{s}{ext}"));
        } else {
            out.push(s);
        }
    }
    Some(out)
}

fn write(path: &Path, body: &str) -> Result<(), ExportError> {
    let io = |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    std::fs::write(path, body).map_err(io)
}

/// Every page of the store.
fn routes_of(store: &dyn Store) -> Result<Vec<Route>, PageError> {
    let mut out = vec![Route::Index, Route::ComparePick, Route::Trends, Route::Farm];
    let revs = store.revisions()?;
    let mut names: Vec<String> = revs.iter().map(|r| r.info.series.clone()).collect();
    names.dedup();
    out.extend(names.into_iter().map(Route::Series));
    out.extend(revs.iter().map(|r| Route::Revision(r.reference())));
    // Static pages cannot take a query: every pair within a series.
    for a in &revs {
        for b in revs
            .iter()
            .filter(|b| b.info.series == a.info.series && b.info.version > a.info.version)
        {
            out.push(Route::Compare(a.reference(), b.reference()));
        }
    }
    out.extend(
        model::all_runs(store)?
            .into_iter()
            .map(|r| Route::Run(r.run.id)),
    );
    Ok(out)
}

fn site(route_path: &str, base_url: Option<&str>) -> Site {
    Site::exported(route_path, base_url)
}

/// Write the dashboard into `dir`.
pub fn export(
    source: &mut Source,
    dir: &Path,
    base_url: Option<&str>,
    now: Timestamp,
) -> Result<Summary, ExportError> {
    if let Some(b) = base_url {
        if !(b.starts_with("http://") || b.starts_with("https://") || b.starts_with('/'))
            || b.contains(char::is_whitespace)
        {
            return Err(ExportError::BadBaseUrl(b.to_string()));
        }
    }
    let name = source.name().to_string();
    let pages: Vec<(String, Rendered)> = match source.read(|store| -> Result<_, PageError> {
        let mut pages = Vec::new();
        for route in routes_of(store)? {
            let path = route.path();
            let r = routes::build(&site(&path, base_url), &route, store, &name, now)?;
            pages.push((path, r));
        }
        Ok(pages)
    })? {
        Some(r) => r?,
        None => [Route::Index, Route::ComparePick, Route::Trends, Route::Farm]
            .iter()
            .map(|route| {
                let path = route.path();
                (
                    path.clone(),
                    routes::empty(&site(&path, base_url), route, &name, now),
                )
            })
            .collect(),
    };
    let mut summary = Summary::default();
    for (path, r) in &pages {
        match (file_for(dir, path, ".html"), file_for(dir, path, ".json")) {
            (Some(h), Some(j)) => {
                write(&h, &r.html)?;
                write(&j, &r.json)?;
                summary.pages += 1;
            }
            _ => summary.skipped.push(path.clone()),
        }
    }
    for (file, body, _) in assets::ALL {
        write(&dir.join("static").join(file), body)?;
    }
    let not_found = routes::error(
        &site("", base_url.or(Some("/"))),
        404,
        "There is no such page in this export.",
        now,
    );
    write(&dir.join("404.html"), &not_found.html)?;
    // GitHub Pages: serve the files as they are.
    write(&dir.join(".nojekyll"), "")?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_decoded_and_never_escape() {
        let d = Path::new("out");
        assert_eq!(file_for(d, "", ".html"), Some(d.join("index.html")));
        assert_eq!(
            file_for(d, "series/x/v8", ".json"),
            Some(d.join("series/x/v8.json"))
        );
        assert_eq!(
            file_for(d, "run/a%2Bb", ".html"),
            Some(d.join("run/a+b.html"))
        );
        assert_eq!(file_for(d, "series/..", ".html"), None);
        assert_eq!(file_for(d, "series/%2E%2E", ".html"), None);
        assert_eq!(file_for(d, "run/a%2Fb", ".html"), None);
    }
}
