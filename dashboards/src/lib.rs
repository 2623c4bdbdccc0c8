//! phyfarm's dashboards: what maintainers read to decide on a series.
//!
//! Pages are rendered on the server (maud templates, compiled in) from one
//! consistent read of the results store ([`source`]), each also as JSON at
//! the same path with `.json` ([`routes`] lists them). Every asset is
//! embedded ([`assets`]); nothing is fetched at view time. [`app`] serves
//! them with axum, bound to loopback unless told otherwise; [`export`]
//! writes them as static files for GitHub Pages.

pub mod app;
pub mod assets;
pub mod export;
pub mod model;
pub mod render;
pub mod routes;
pub mod source;
pub mod text;
