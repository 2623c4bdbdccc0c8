//! The web server: every page built on a blocking thread from one
//! consistent read of the store, served with headers that forbid inline
//! script and style, framing and sniffing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use phyfarm::results::{RevisionRef, Timestamp};

use crate::assets;
use crate::model::PageError;
use crate::render::{paths, Site};
use crate::routes::{self, Rendered, Route};
use crate::source::{Source, SourceError};

/// The Content-Security-Policy of every page: only the app's own assets.
pub const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
                       connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

pub struct AppState {
    source: Mutex<Source>,
    /// Evaluate verdicts at this time instead of the wall clock (tests,
    /// reproducible exports).
    now: Option<Timestamp>,
}

impl AppState {
    pub fn new(source: Source, now: Option<Timestamp>) -> Arc<AppState> {
        Arc::new(AppState {
            source: Mutex::new(source),
            now,
        })
    }

    fn now(&self) -> Timestamp {
        self.now.unwrap_or_else(Timestamp::now)
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/static/{file}", get(asset))
        .route("/favicon.ico", get(favicon))
        .fallback(page)
        .with_state(state)
}

fn secure(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    match assets::get(&file) {
        Some((body, mime)) => secure(
            (
                [
                    (header::CONTENT_TYPE, mime),
                    (header::CACHE_CONTROL, "public, max-age=300"),
                ],
                body,
            )
                .into_response(),
        ),
        None => secure((StatusCode::NOT_FOUND, "no such asset").into_response()),
    }
}

async fn favicon() -> Response {
    Redirect::permanent("/static/favicon.svg").into_response()
}

fn respond(code: StatusCode, r: Rendered, json: bool) -> Response {
    let (body, mime) = if json {
        (r.json, "application/json")
    } else {
        (r.html, "text/html; charset=utf-8")
    };
    secure(
        (
            code,
            [
                (header::CONTENT_TYPE, mime),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
    )
}

/// Build the page at `path` (blocking: reads the store).
pub fn render_path(state: &AppState, path: &str) -> (StatusCode, Rendered, bool) {
    let now = state.now();
    let json = path.ends_with(".json");
    let Some((route, json)) = routes::parse(path) else {
        let site = Site::served("");
        let msg = format!("There is no page at {path}.");
        return (
            StatusCode::NOT_FOUND,
            routes::error(&site, 404, &msg, now),
            json,
        );
    };
    let site = Site::served(&route.path());
    let mut source = state.source.lock().unwrap_or_else(|e| e.into_inner());
    let name = source.name().to_string();
    let built = source.read(|store| routes::build(&site, &route, store, &name, now));
    let fail = |code: u16, msg: String| {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, routes::error(&site, code, &msg, now), json)
    };
    match built {
        Ok(Some(Ok(r))) => (StatusCode::OK, r, json),
        Ok(None) => match route {
            Route::Index | Route::Trends | Route::Farm | Route::ComparePick => (
                StatusCode::OK,
                routes::empty(&site, &route, &name, now),
                json,
            ),
            _ => fail(
                404,
                format!(
                    "No results store at {name} yet, so there is no {}.",
                    route.path()
                ),
            ),
        },
        Ok(Some(Err(PageError::NotFound(m)))) => fail(404, m),
        Ok(Some(Err(e))) => fail(500, e.to_string()),
        Err(e @ SourceError::Busy(_)) => fail(503, e.to_string()),
        Err(e) => fail(500, e.to_string()),
    }
}

async fn page(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let path = uri.path().to_string();
    if path.trim_end_matches('/') == "/compare" {
        if let (Some(a), Some(b)) = (q.get("a"), q.get("b")) {
            if let (Ok(a), Ok(b)) = (a.parse::<RevisionRef>(), b.parse::<RevisionRef>()) {
                let to = format!("/{}", paths::compare(&a.to_string(), &b.to_string()));
                return Redirect::to(&to).into_response();
            }
        }
    }
    let result = tokio::task::spawn_blocking(move || render_path(&state, &path)).await;
    match result {
        Ok((code, r, json)) => respond(code, r, json),
        Err(e) => secure(
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("page builder failed: {e}"),
            )
                .into_response(),
        ),
    }
}

/// Whether `addr` is reachable only from this machine.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// Serve until Ctrl-C or SIGTERM. `ready` gets the bound address (port 0
/// picks a free one).
pub async fn serve(
    state: Arc<AppState>,
    listen: SocketAddr,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    ready(listener.local_addr()?);
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown())
        .await
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
