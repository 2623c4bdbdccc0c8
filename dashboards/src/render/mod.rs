//! HTML for every page, with maud: a splice `(value)` is always escaped, so
//! subjects, authors, file names and log lines from patches and guests can
//! never become markup. Nothing here emits inline script or style (the
//! served pages forbid both with a Content-Security-Policy).

mod chart;
mod pages;
mod views;

use maud::{html, Markup, DOCTYPE};
use phyfarm::export::url_segment;
use phyfarm::results::{Status, Timestamp};
use phyfarm::verdict::{FindingKind, Movement, State};

pub use chart::line_chart;
pub use pages::{index, revision, series};
pub use views::{compare, compare_pick, empty, error, farm, run, trends};

/// How links are written: served (`/series/x/v8`) or exported
/// (`../../series/x/v8.html`, or under a `--base-url`).
#[derive(Debug, Clone)]
pub struct Site {
    /// Prefix of every link, ending in `/` (or empty for "this folder").
    pub root: String,
    /// `""` when served, `".html"` when exported.
    pub ext: &'static str,
    /// Path of this page (no leading slash; `""` for the index), for its
    /// JSON twin.
    pub here: String,
}

impl Site {
    pub fn served(here: &str) -> Site {
        Site {
            root: "/".into(),
            ext: "",
            here: here.into(),
        }
    }

    /// A page at `here` in a static export: links relative to it, or
    /// absolute under `base_url`.
    pub fn exported(here: &str, base_url: Option<&str>) -> Site {
        let root = match base_url {
            Some(b) => format!("{}/", b.trim_end_matches('/')),
            None => "../".repeat(here.matches('/').count()),
        };
        Site {
            root,
            ext: ".html",
            here: here.into(),
        }
    }

    /// Link to a page given by its path (`""` is the index).
    pub fn page(&self, path: &str) -> String {
        match (path, self.ext) {
            ("", "") => self.root.clone(),
            ("", ext) => format!("{}index{ext}", self.root),
            (p, ext) => format!("{}{p}{ext}", self.root),
        }
    }

    pub fn json(&self) -> String {
        let p = if self.here.is_empty() {
            "index"
        } else {
            &self.here
        };
        format!("{}{p}.json", self.root)
    }

    pub fn asset(&self, name: &str) -> String {
        format!("{}static/{name}", self.root)
    }
}

/// Page paths (no leading slash, no extension).
pub mod paths {
    use super::url_segment;

    pub fn series(name: &str) -> String {
        format!("series/{}", url_segment(name))
    }

    pub fn revision(series: &str, version: u32) -> String {
        format!("series/{}/v{version}", url_segment(series))
    }

    /// From a `<series>/v<N>` reference string.
    pub fn revision_ref(r: &str) -> String {
        match r.rsplit_once('/') {
            Some((s, v)) => format!("series/{}/{}", url_segment(s), url_segment(v)),
            None => format!("series/{}", url_segment(r)),
        }
    }

    pub fn run(id: &str) -> String {
        format!("run/{}", url_segment(id))
    }

    pub fn compare(a: &str, b: &str) -> String {
        let split = |r: &str| -> String {
            match r.rsplit_once('/') {
                Some((s, v)) => format!("{}/{}", url_segment(s), url_segment(v)),
                None => url_segment(r),
            }
        };
        format!("compare/{}/{}", split(a), split(b))
    }
}

pub struct Page<'a> {
    pub title: String,
    pub site: &'a Site,
    pub generated: Timestamp,
    /// Which navigation entry is current.
    pub nav: &'static str,
}

/// The Content-Security-Policy of the static export, as a `<meta>` (the
/// served pages send crate::app::CSP as a header; `frame-ancestors` has no
/// effect in a meta element, so it is left out here).
pub const EXPORT_CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; \
                              img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'";

pub fn layout(p: Page<'_>, body: Markup) -> Markup {
    let s = p.site;
    let nav = [
        ("series", "Series", s.page("")),
        ("compare", "Compare", s.page("compare")),
        ("trends", "Trends", s.page("trends")),
        ("farm", "Farm", s.page("farm")),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if s.ext == ".html" {
                    // The static export has no server to send the header:
                    // the same policy, as the first thing in <head>.
                    meta http-equiv="Content-Security-Policy" content=(EXPORT_CSP);
                }
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (p.title) " · phyfarm" }
                link rel="stylesheet" href=(s.asset("style.css"));
                link rel="icon" href=(s.asset("favicon.svg")) type="image/svg+xml";
                script src=(s.asset("app.js")) defer {}
            }
            body {
                header.top {
                    a.brand href=(s.page("")) { "phyfarm" }
                    nav {
                        @for (key, label, href) in &nav {
                            @if *key == p.nav {
                                a.current href=(href) aria-current="page" { (label) }
                            } @else {
                                a href=(href) { (label) }
                            }
                        }
                    }
                    a.json href=(s.json()) title="This page as JSON" { "JSON" }
                }
                main { (body) }
                footer {
                    "Generated " (p.generated) " by phyfarm-dashboard "
                    (env!("CARGO_PKG_VERSION")) ". Verdicts are evaluated at that time; "
                    "times are UTC."
                }
            }
        }
    }
}

pub fn verdict(state: Option<State>) -> Markup {
    let (class, label) = match state {
        Some(State::ReadyToMerge) => ("ready", "✔ ready to merge"),
        Some(State::AwaitingReview) => ("awaiting", "◷ awaiting review"),
        Some(State::ChangesRequested) => ("changes", "✘ changes requested"),
        Some(State::Testing) => ("testing", "… testing"),
        Some(State::New) => ("new", "• new"),
        Some(State::Superseded) => ("superseded", "⤳ superseded"),
        None => ("new", "no verdict yet"),
    };
    html! { span class={"verdict v-" (class)} { (label) } }
}

pub fn status(s: Status) -> Markup {
    let mark = match s {
        Status::Fail => "✘ ",
        Status::Error => "⚠ ",
        Status::Miss => "? ",
        Status::Pass => "✔ ",
        Status::Done => "◆ ",
        Status::Skip => "– ",
    };
    html! { span class={"st st-" (s.name().to_ascii_lowercase())} { (mark) (s.name()) } }
}

pub fn opt_status(s: Option<Status>) -> Markup {
    match s {
        Some(s) => status(s),
        None => html! { span.none { "–" } },
    }
}

pub fn finding(k: Option<FindingKind>) -> Markup {
    match k {
        None => html! {},
        Some(k) => {
            let class = match k {
                FindingKind::NewFailure => "new-failure",
                FindingKind::Incomplete => "incomplete",
                FindingKind::NewWarning => "new-warning",
                FindingKind::StillFailing => "still-failing",
                FindingKind::Fixed => "fixed",
            };
            html! { span class={"fd fd-" (class)} { (k.label()) } }
        }
    }
}

pub fn movement(m: Movement) -> Markup {
    let (class, label) = match m {
        Movement::Regression => ("regression", "▼ regression"),
        Movement::Improvement => ("improvement", "▲ improvement"),
        Movement::WithinNoise => ("noise", "within noise"),
        Movement::NoBand => ("noband", "no call (under 5 samples a side)"),
        Movement::NoBase => ("noband", "not measured on the base"),
    };
    html! { span class={"mv mv-" (class)} { (label) } }
}

pub fn time(t: Timestamp) -> Markup {
    let s = t.to_string();
    html! { time datetime=(s) { (s.replace('T', " ").trim_end_matches('Z')) } }
}

pub fn opt_time(t: Option<Timestamp>) -> Markup {
    match t {
        Some(t) => time(t),
        None => html! { "–" },
    }
}

/// A percentage with its sign: `+1.2 %`.
pub fn pct(p: Option<f64>) -> String {
    p.map_or("–".into(), |p| format!("{p:+.2} %"))
}

/// The variant of a check, as a small tag.
pub fn variant(v: Option<&str>) -> Markup {
    match v {
        Some(v) => html! { span.variant { (v) } },
        None => html! {},
    }
}
