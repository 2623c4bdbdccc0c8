//! The pages and their paths, shared by the server and the static export.
//!
//! | path                                   | page                          |
//! |----------------------------------------|-------------------------------|
//! | `/`                                    | series list (`/index.json`)   |
//! | `/series/<name>`                       | one series                    |
//! | `/series/<name>/v<N>`                  | one revision                  |
//! | `/compare`                             | pick two revisions            |
//! | `/compare/<name>/v<A>/<name>/v<B>`     | two revisions side by side    |
//! | `/trends`                              | measurement charts            |
//! | `/run/<id>`                            | one run: environment, logs    |
//! | `/farm`                                | recent runs, flaky checks     |
//!
//! Every page is also JSON at the same path with `.json`.

use phyfarm::results::{RevisionRef, Timestamp};
use phyfarm::store::Store;
use serde::Serialize;

use crate::model::{self, PageError};
use crate::render::{self, Site};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Index,
    Series(String),
    Revision(RevisionRef),
    ComparePick,
    Compare(RevisionRef, RevisionRef),
    Trends,
    Run(String),
    Farm,
}

/// Decode `%XX` escapes; None for a malformed escape or invalid UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn version(seg: &str) -> Option<u32> {
    seg.strip_prefix('v')?.parse().ok().filter(|&v| v > 0)
}

fn rev(series: &str, v: &str) -> Option<RevisionRef> {
    Some(RevisionRef {
        series: series.to_string(),
        version: version(v)?,
    })
}

/// The route of a URL path and whether the JSON twin is asked for.
pub fn parse(path: &str) -> Option<(Route, bool)> {
    let trimmed = path.trim_start_matches('/');
    let (trimmed, json) = match trimmed.strip_suffix(".json") {
        Some(t) => (t, true),
        None => (trimmed.strip_suffix(".html").unwrap_or(trimmed), false),
    };
    let segs: Vec<String> = if trimmed.is_empty() {
        vec![]
    } else {
        trimmed
            .split('/')
            .map(percent_decode)
            .collect::<Option<Vec<_>>>()?
    };
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let route = match s.as_slice() {
        [] | ["index"] => Route::Index,
        ["series", name] if !name.is_empty() => Route::Series(name.to_string()),
        ["series", name, v] if !name.is_empty() => Route::Revision(rev(name, v)?),
        ["compare"] => Route::ComparePick,
        ["compare", sa, va, sb, vb] => Route::Compare(rev(sa, va)?, rev(sb, vb)?),
        ["trends"] => Route::Trends,
        ["farm"] => Route::Farm,
        ["run", id] if !id.is_empty() => Route::Run(id.to_string()),
        _ => return None,
    };
    Some((route, json))
}

impl Route {
    /// The page's path, without leading slash or extension.
    pub fn path(&self) -> String {
        use render::paths;
        match self {
            Route::Index => String::new(),
            Route::Series(n) => paths::series(n),
            Route::Revision(r) => paths::revision(&r.series, r.version),
            Route::ComparePick => "compare".into(),
            Route::Compare(a, b) => paths::compare(&a.to_string(), &b.to_string()),
            Route::Trends => "trends".into(),
            Route::Run(id) => paths::run(id),
            Route::Farm => "farm".into(),
        }
    }

    fn nav(&self) -> &'static str {
        match self {
            Route::Index | Route::Series(_) | Route::Revision(_) => "series",
            Route::ComparePick | Route::Compare(..) => "compare",
            Route::Trends => "trends",
            Route::Run(_) | Route::Farm => "farm",
        }
    }
}

/// A built page: its HTML and its JSON twin.
pub struct Rendered {
    pub html: String,
    pub json: String,
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")) + "\n"
}

/// The page for a store that has nothing in it yet.
pub fn empty(site: &Site, route: &Route, store: &str, now: Timestamp) -> Rendered {
    #[derive(Serialize)]
    struct Empty<'a> {
        generated: Timestamp,
        empty: bool,
        store: &'a str,
        hint: &'static str,
    }
    Rendered {
        html: render::empty(site, store, now, route.nav()).into_string(),
        json: json(&Empty {
            generated: now,
            empty: true,
            store,
            hint: "no results yet: run `make run` or `phyfarm run`, or `phyfarm store import RESULTS.json`",
        }),
    }
}

/// Whether the store has nothing a page could show.
pub fn store_is_empty(store: &dyn Store) -> Result<bool, PageError> {
    Ok(store.revisions()?.is_empty() && model::all_runs(store)?.is_empty())
}

/// Build one page from the store. Pages that list things show the empty
/// page when the store has nothing yet.
pub fn build(
    site: &Site,
    route: &Route,
    store: &dyn Store,
    store_name: &str,
    now: Timestamp,
) -> Result<Rendered, PageError> {
    let listing = matches!(
        route,
        Route::Index | Route::Trends | Route::Farm | Route::ComparePick
    );
    if listing && store_is_empty(store)? {
        return Ok(empty(site, route, store_name, now));
    }
    Ok(match route {
        Route::Index => {
            let p = model::index(store, now)?;
            Rendered {
                html: render::index(site, &p).into_string(),
                json: json(&p),
            }
        }
        Route::Series(name) => {
            let p = model::series(store, name, now)?;
            Rendered {
                html: render::series(site, &p).into_string(),
                json: json(&p),
            }
        }
        Route::Revision(r) => {
            let p = model::revision(store, r, now)?;
            Rendered {
                html: render::revision(site, &p).into_string(),
                json: json(&p),
            }
        }
        Route::ComparePick => {
            let p = model::pick(store, now)?;
            Rendered {
                html: render::compare_pick(site, &p).into_string(),
                json: json(&p),
            }
        }
        Route::Compare(a, b) => {
            let p = model::compare_page(store, a, b, now)?;
            let all = model::pick(store, now)?.revisions;
            Rendered {
                html: render::compare(site, &p, &all).into_string(),
                json: json(&p),
            }
        }
        Route::Trends => {
            let p = model::trends(store, now)?;
            Rendered {
                html: render::trends(site, &p).into_string(),
                json: json(&p),
            }
        }
        Route::Run(id) => {
            let p = model::run(store, id, now)?;
            Rendered {
                html: render::run(site, &p).into_string(),
                json: json(&p),
            }
        }
        Route::Farm => {
            let p = model::farm(store, now)?;
            Rendered {
                html: render::farm(site, &p).into_string(),
                json: json(&p),
            }
        }
    })
}

/// An error page and its JSON twin.
pub fn error(site: &Site, code: u16, message: &str, now: Timestamp) -> Rendered {
    #[derive(Serialize)]
    struct Err<'a> {
        status: u16,
        error: &'a str,
    }
    Rendered {
        html: render::error(site, code, message, now).into_string(),
        json: json(&Err {
            status: code,
            error: message,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip() {
        let r = RevisionRef {
            series: "rust-phy-enum-check".into(),
            version: 8,
        };
        let routes = [
            Route::Index,
            Route::Series("a b".into()),
            Route::Revision(r.clone()),
            Route::ComparePick,
            Route::Compare(
                RevisionRef {
                    series: "x".into(),
                    version: 7,
                },
                r,
            ),
            Route::Trends,
            Route::Run("2026+run.1".into()),
            Route::Farm,
        ];
        for route in routes {
            let p = format!("/{}", route.path());
            assert_eq!(parse(&p), Some((route.clone(), false)), "{p}");
            assert_eq!(parse(&format!("{p}.json")).map(|x| x.1), Some(true), "{p}");
        }
        assert_eq!(parse("/index.json"), Some((Route::Index, true)));
        assert_eq!(parse("/series/x/8"), None);
        assert_eq!(parse("/series/x/v0"), None);
        assert_eq!(parse("/nope"), None);
        assert_eq!(parse("/series/%zz"), None);
    }
}
