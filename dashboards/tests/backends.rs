//! The dashboard serves the same pages from PostgreSQL as from SQLite: the
//! same runs are recorded into both, and every page and its JSON twin must
//! come out byte for byte the same. The PostgreSQL half needs a server
//! (`PHYFARM_TEST_POSTGRES`, as for the store tests; `make unit` starts
//! one); without it the test says SKIP and returns.

mod common;

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use dashboards::app::{render_path, AppState};
use dashboards::source::Source;
use phyfarm::results::Status;
use phyfarm::store::{self, OpenMode, Store};
use phyfarm::verdict::{Review, ReviewKind};

/// A schema of its own on the test server, dropped when the test ends.
struct PgSchema {
    admin: postgres::Client,
    url: String,
    schema: String,
}

impl PgSchema {
    fn new() -> Option<PgSchema> {
        let url = match std::env::var("PHYFARM_TEST_POSTGRES") {
            Ok(u) if !u.is_empty() => u,
            _ => {
                eprintln!(
                    "SKIP: PHYFARM_TEST_POSTGRES is not set, so the dashboard cannot be \
                     checked on PostgreSQL (`make unit` starts a server and sets it)"
                );
                return None;
            }
        };
        let mut admin = postgres::Client::connect(&url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("PHYFARM_TEST_POSTGRES is set but unusable: {e}"));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let schema = format!("dash_{}_{nanos}", std::process::id());
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .unwrap();
        Some(PgSchema { admin, url, schema })
    }

    fn location(&self) -> PathBuf {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        PathBuf::from(format!(
            "{}{sep}options=-csearch_path%3D{}",
            self.url, self.schema
        ))
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
        if let Err(e) = self.admin.batch_execute(&sql) {
            eprintln!("W: dropping test schema {}: {e}", self.schema);
        }
    }
}

/// The same history on any backend: the fixture runs, a run begun and
/// finished later, and a review.
fn fill(st: &mut dyn Store) {
    for r in common::shipped_runs() {
        st.record_run(&r).unwrap();
    }
    st.record_run(&common::hostile_run()).unwrap();
    let mut late = common::shipped_runs().remove(2);
    late.id = "20260614T100000Z-v8-late".into();
    late.started = "2026-06-14T10:00:00Z".parse().unwrap();
    late.finished = Some("2026-06-14T11:00:00Z".parse().unwrap());
    let tests = std::mem::take(&mut late.tests);
    st.begin_run(&late).unwrap();
    late.tests = tests;
    late.tests[0].status = Status::Fail;
    st.finish_run(&late).unwrap();
    st.add_review(
        &"rust-phy-enum-check/v8".parse().unwrap(),
        &Review {
            at: "2026-06-15T00:00:00Z".parse().unwrap(),
            by: "Reviewer <r@example.org>".into(),
            kind: ReviewKind::Ack,
            reason: "looks right".into(),
        },
    )
    .unwrap();
}

/// Every page the store has, with its JSON twin.
fn pages(location: &Path) -> Vec<String> {
    let mut source = Source::new(location);
    let runs = source
        .read(dashboards::model::all_runs)
        .unwrap()
        .unwrap()
        .unwrap();
    let mut out: Vec<String> = [
        "/",
        "/series/rust-phy-enum-check",
        "/series/rust-phy-enum-check/v7",
        "/series/rust-phy-enum-check/v8",
        "/series/evil",
        "/series/evil/v1",
        "/compare",
        "/compare/rust-phy-enum-check/v7/rust-phy-enum-check/v8",
        "/trends",
        "/farm",
        "/series/nope/v1",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    out.extend(runs.iter().map(|r| format!("/run/{}", r.run.id)));
    let twins: Vec<String> = out
        .iter()
        .map(|p| match p.as_str() {
            "/" => "/index.json".to_string(),
            p => format!("{p}.json"),
        })
        .collect();
    out.extend(twins);
    out
}

fn render(location: &Path, path: &str) -> (StatusCode, String) {
    let state = AppState::new(Source::new(location), Some(common::NOW.parse().unwrap()));
    let (status, r, json) = render_path(&state, path);
    (status, if json { r.json } else { r.html })
}

#[test]
fn postgresql_serves_the_same_pages_as_sqlite() {
    let Some(pg) = PgSchema::new() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("results.sqlite");
    let postgres = pg.location();

    // Before anything is recorded: the page that says how to run a job,
    // naming the store without its password.
    let (status, body) = render(&postgres, "/");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("phyfarm run"), "{body}");
    let (status, body) = render(&postgres, "/series/x/v1");
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains(&pg.schema), "names the store: {body}");
    if let Some(pw) = url_password(&pg.url) {
        assert!(!body.contains(&format!(":{pw}@")), "{body}");
    }

    fill(&mut *store::open(&sqlite, OpenMode::Create).unwrap());
    fill(&mut *store::open(&postgres, OpenMode::Create).unwrap());
    let paths = pages(&sqlite);
    assert_eq!(paths, pages(&postgres), "the same runs");
    assert!(paths.len() >= 2 * (11 + 5), "{paths:?}");
    for path in &paths {
        let (a_status, a) = render(&sqlite, path);
        let (b_status, b) = render(&postgres, path);
        assert_eq!(a_status, b_status, "{path}: {b}");
        if path != "/series/nope/v1" && path != "/series/nope/v1.json" {
            assert_eq!(a_status, StatusCode::OK, "{path}: {a}");
        }
        assert_eq!(a, b, "{path} differs between SQLite and PostgreSQL");
    }
    // The late run is seen with its final results on both.
    let (_, run) = render(&postgres, "/run/20260614T100000Z-v8-late.json");
    assert!(run.contains("FAIL"), "{run}");
}

#[test]
fn a_lost_postgresql_connection_is_opened_again_by_the_next_page() {
    let Some(mut pg) = PgSchema::new() else {
        return;
    };
    let app = pg.schema.clone();
    let location = PathBuf::from(format!(
        "{}&application_name={app}",
        pg.location().display()
    ));
    fill(&mut *store::open(&location, OpenMode::Create).unwrap());
    let state = AppState::new(Source::new(&location), Some(common::NOW.parse().unwrap()));
    assert_eq!(render_path(&state, "/").0, StatusCode::OK);
    // The database server drops the dashboard's connection.
    let killed = pg
        .admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .unwrap();
    assert!(!killed.is_empty(), "the dashboard holds a connection");
    let (status, _, _) = render_path(&state, "/");
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "this page fails");
    let (status, page, _) = render_path(&state, "/");
    assert_eq!(
        status,
        StatusCode::OK,
        "the next one reconnects: {}",
        page.html
    );
}

fn url_password(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let auth = &rest[..rest.find('@')?];
    Some(auth.split_once(':')?.1.to_string())
}
