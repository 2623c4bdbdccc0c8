//! The embedded assets: one stylesheet, one small script (filters and the
//! compare form; the pages work without it), the icon. Nothing is fetched
//! from anywhere else.

pub const STYLE: &str = include_str!("../static/style.css");
pub const SCRIPT: &str = include_str!("../static/app.js");
pub const FAVICON: &str = include_str!("../static/favicon.svg");

/// Every asset: file name, content, MIME type.
pub const ALL: [(&str, &str, &str); 3] = [
    ("style.css", STYLE, "text/css; charset=utf-8"),
    ("app.js", SCRIPT, "text/javascript; charset=utf-8"),
    ("favicon.svg", FAVICON, "image/svg+xml"),
];

pub fn get(name: &str) -> Option<(&'static str, &'static str)> {
    ALL.iter().find(|a| a.0 == name).map(|a| (a.1, a.2))
}
