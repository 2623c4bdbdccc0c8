//! Every route over a fixture store: status codes, key content, JSON twins,
//! escaping of hostile input, the empty store, and consistent reads while a
//! writer commits.

mod common;

use std::path::Path;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dashboards::app::{router, AppState};
use dashboards::source::Source;
use http_body_util::BodyExt;
use phyfarm::store::{OpenMode, SqliteStore, Store};
use tower::ServiceExt;

struct Got {
    status: StatusCode,
    content_type: String,
    csp: String,
    body: String,
}

async fn get(store: &Path, path: &str) -> Got {
    let state = AppState::new(Source::new(store), Some(common::NOW.parse().unwrap()));
    let resp = router(state)
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let (status, content_type, csp) = (
        resp.status(),
        header("content-type"),
        header("content-security-policy"),
    );
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Got {
        status,
        content_type,
        csp,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

const PAGES: [&str; 9] = [
    "/",
    "/series/rust-phy-enum-check",
    "/series/rust-phy-enum-check/v7",
    "/series/rust-phy-enum-check/v8",
    "/compare",
    "/compare/rust-phy-enum-check/v7/rust-phy-enum-check/v8",
    "/trends",
    "/run/20260612T100000Z-v8-1",
    "/farm",
];

#[tokio::test]
async fn every_page_and_its_json_twin_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    for page in PAGES {
        let html = get(&store, page).await;
        assert_eq!(html.status, StatusCode::OK, "{page}: {}", html.body);
        assert!(html.content_type.starts_with("text/html"), "{page}");
        assert!(html.csp.contains("script-src 'self'"), "{page}");
        assert!(html.body.contains("phyfarm"), "{page}");
        let twin = if page == "/" {
            "/index.json".to_string()
        } else {
            format!("{page}.json")
        };
        let json = get(&store, &twin).await;
        assert_eq!(json.status, StatusCode::OK, "{twin}");
        assert_eq!(json.content_type, "application/json", "{twin}");
        let v: serde_json::Value = serde_json::from_str(&json.body).unwrap();
        assert!(v.get("generated").is_some(), "{twin}: {v}");
    }
}

#[tokio::test]
async fn key_content_of_the_shipped_series() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    let index = get(&store, "/").await.body;
    assert!(index.contains("changes requested"), "v7 does not apply");
    assert!(
        index.contains("superseded"),
        "v7 is superseded by v8 or folded"
    );

    let v8: serde_json::Value = serde_json::from_str(
        &get(&store, "/series/rust-phy-enum-check/v8.json")
            .await
            .body,
    )
    .unwrap();
    assert_eq!(v8["summary"]["reference"], "rust-phy-enum-check/v8");
    assert_eq!(v8["previous"], "rust-phy-enum-check/v7");
    assert_eq!(v8["variants"], serde_json::json!(["rust", "c"]));
    let flap = v8["farm"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["check"] == "farm.link_flap.flap10")
        .expect("link-flap row");
    assert!(flap["cells"][0]["flaky"].is_string(), "{flap}");
    assert_eq!(v8["measurements"][0]["movement"], "within-noise");

    let page = get(&store, "/series/rust-phy-enum-check/v8").await.body;
    assert!(page.contains("Farm matrix") && page.contains("farm.link_flap.flap10"));
    assert!(page.contains("94.1 Mbit/s"), "throughput in readable units");
    assert!(page.contains("flaky"));

    let v7: serde_json::Value = serde_json::from_str(
        &get(&store, "/series/rust-phy-enum-check/v7.json")
            .await
            .body,
    )
    .unwrap();
    assert_eq!(v7["patches"][0]["apply"]["status"], "FAIL");

    let trends = get(&store, "/trends").await.body;
    assert!(
        trends.contains("<svg") && trends.contains("Mbit/s"),
        "chart with units"
    );

    let run = get(&store, "/run/20260612T100000Z-v8-1").await.body;
    assert!(
        run.contains("phyfarm run patches/rust-phy-enum-check/v8"),
        "reproducer"
    );
    assert!(run.contains("10.0.2") && run.contains("tcg"), "environment");

    let farm = get(&store, "/farm").await.body;
    assert!(farm.contains("Flaky checks") && farm.contains("farm.link_flap.flap10"));
}

#[tokio::test]
async fn unknown_things_are_404_pages_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    for path in [
        "/series/nope",
        "/series/rust-phy-enum-check/v99",
        "/series/nope/v1.json",
        "/run/nope",
        "/compare/rust-phy-enum-check/v7/nope/v1",
        "/no/such/page",
        "/series/x/vv",
        "/series/%ff",
    ] {
        let r = get(&store, path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert!(
            r.body.contains("404") || r.body.contains("\"status\": 404"),
            "{path}: {}",
            r.body
        );
    }
    let r = get(&store, "/series/nope.json").await;
    assert_eq!(r.content_type, "application/json");
}

#[tokio::test]
async fn hostile_input_is_escaped_and_ansi_is_stripped() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    for page in [
        "/",
        "/series/evil",
        "/series/evil/v1",
        "/run/20260613T100000Z-evil-1",
        "/farm",
        "/trends",
    ] {
        let body = get(&store, page).await.body;
        assert_eq!(
            body.matches("<script").count(),
            1,
            "{page}: only the app's own script tag"
        );
        assert!(!body.contains("<img"), "{page}");
        assert!(!body.contains("<b>bold"), "{page}");
        assert!(
            !body.contains('\u{1b}'),
            "{page}: no escape character reaches the page"
        );
        assert!(!body.contains("\u{7}"), "{page}");
    }
    let rev = get(&store, "/series/evil/v1").await.body;
    assert!(
        rev.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the subject is shown, escaped"
    );
    let run = get(&store, "/run/20260613T100000Z-evil-1").await.body;
    assert!(
        run.contains("<mark class=\"oops\">[   3.100] BUG: kernel NULL pointer dereference"),
        "oops highlighted"
    );
    assert!(run.contains("&lt;img src=x onerror=alert(2)&gt;"));
    assert!(!run.contains("pwned"), "OSC title sequence removed");
    let json = get(&store, "/run/20260613T100000Z-evil-1.json").await.body;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["tests"][0]["log"][0]["kind"], "oops");
}

#[tokio::test]
async fn an_empty_or_missing_store_says_how_to_run_the_first_job() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.sqlite");
    for page in ["/", "/trends", "/farm", "/compare"] {
        let r = get(&missing, page).await;
        assert_eq!(r.status, StatusCode::OK, "{page}");
        assert!(
            r.body.contains("make run") && r.body.contains("phyfarm run"),
            "{page}"
        );
    }
    assert!(!missing.exists(), "the dashboard never creates a store");
    let r = get(&missing, "/series/x/v1").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let j: serde_json::Value =
        serde_json::from_str(&get(&missing, "/index.json").await.body).unwrap();
    assert_eq!(j["empty"], true);

    let empty = dir.path().join("empty.sqlite");
    drop(SqliteStore::open(&empty, OpenMode::Create).unwrap());
    let r = get(&empty, "/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("No results yet"));
}

#[tokio::test]
async fn assets_are_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    for (a, ty) in [
        ("style.css", "text/css"),
        ("app.js", "text/javascript"),
        ("favicon.svg", "image/svg+xml"),
    ] {
        let r = get(&store, &format!("/static/{a}")).await;
        assert_eq!(r.status, StatusCode::OK, "{a}");
        assert!(r.content_type.starts_with(ty), "{a}");
    }
    assert_eq!(
        get(&store, "/static/nope.js").await.status,
        StatusCode::NOT_FOUND
    );
    let index = get(&store, "/").await.body;
    assert!(
        !index.contains("http://") && !index.contains("https://"),
        "no external resource"
    );
}

#[tokio::test]
async fn compare_query_redirects_to_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    let state = AppState::new(Source::new(&store), Some(common::NOW.parse().unwrap()));
    let resp = router(state)
        .oneshot(
            Request::get("/compare?a=rust-phy-enum-check/v7&b=evil/v1")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(resp.status().is_redirection());
    assert_eq!(
        resp.headers()["location"],
        "/compare/rust-phy-enum-check/v7/evil/v1"
    );
    assert_eq!(
        get(&store, "/compare/rust-phy-enum-check/v7/evil/v1")
            .await
            .status,
        StatusCode::OK
    );
}

#[test]
fn a_page_read_across_a_commit_is_built_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    let mut writer = SqliteStore::open(&store, OpenMode::Existing).unwrap();
    let mut extra = common::shipped_runs().remove(0);
    extra.id = "extra-base".into();
    let mut source = Source::new(&store);
    let mut calls = 0;
    // The first build sees a run committed between its two reads; that
    // build must be thrown away and the page built again.
    let (a, b) = source
        .read(|st| -> Result<_, dashboards::model::PageError> {
            calls += 1;
            let a = dashboards::model::all_runs(st)?.len();
            if calls == 1 {
                writer.record_run(&extra).unwrap();
            }
            let b = dashboards::model::all_runs(st)?.len();
            Ok((a, b))
        })
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(calls, 2, "the page read across a commit was kept");
    assert_eq!((a, b), (5, 5));
}

#[test]
fn pages_stay_consistent_while_a_writer_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            let mut st = SqliteStore::open(&store, OpenMode::Existing).unwrap();
            let mut base = common::shipped_runs().remove(0);
            for n in 0..40 {
                base.id = format!("extra-base-{n}");
                st.record_run(&base).unwrap();
            }
        })
    };
    let mut source = Source::new(&store);
    let page = |source: &mut Source| {
        // Two reads of one page must see the same store.
        source.read(|st| -> Result<_, dashboards::model::PageError> {
            let a = dashboards::model::all_runs(st)?.len();
            std::thread::sleep(std::time::Duration::from_millis(2));
            let b = dashboards::model::all_runs(st)?.len();
            Ok((a, b))
        })
    };
    // While the writer commits, a page is either consistent or busy (how
    // many of each depends on the machine's speed).
    while !writer.is_finished() {
        match page(&mut source) {
            Ok(Some(Ok((a, b)))) => assert_eq!(a, b, "a page saw two states of the store"),
            Err(dashboards::source::SourceError::Busy(_)) => {}
            Ok(Some(Err(e))) => panic!("{e}"),
            other => panic!("{:?}", other.map(|o| o.is_some())),
        }
    }
    writer.join().unwrap();
    // Once it stopped, every page is built and sees every committed run.
    let (a, b) = page(&mut source).unwrap().unwrap().unwrap();
    assert_eq!((a, b), (4 + 40, 4 + 40), "every committed run is seen");
}

#[test]
fn static_export_writes_pages_and_twins_with_relative_links() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path());
    let out = dir.path().join("site");
    let mut source = Source::new(&store);
    let s =
        dashboards::export::export(&mut source, &out, None, common::NOW.parse().unwrap()).unwrap();
    assert!(s.pages >= 9, "{}", s.pages);
    for f in [
        "index.html",
        "index.json",
        "trends.html",
        "farm.json",
        "compare.html",
        "series/rust-phy-enum-check.html",
        "series/rust-phy-enum-check/v8.html",
        "series/rust-phy-enum-check/v8.json",
        "compare/rust-phy-enum-check/v7/rust-phy-enum-check/v8.html",
        "run/20260612T100000Z-v8-1.html",
        "static/style.css",
        "static/app.js",
        "404.html",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let v8 = std::fs::read_to_string(out.join("series/rust-phy-enum-check/v8.html")).unwrap();
    assert!(v8.contains("href=\"../../static/style.css\""));
    assert!(v8.contains("href=\"../../run/20260612T100000Z-v8-1.html\""));
    let missing = dir.path().join("none.sqlite");
    let out2 = dir.path().join("empty-site");
    dashboards::export::export(
        &mut Source::new(&missing),
        &out2,
        Some("https://x.example/phyfarm"),
        common::NOW.parse().unwrap(),
    )
    .unwrap();
    let idx = std::fs::read_to_string(out2.join("index.html")).unwrap();
    assert!(idx.contains("make run") && idx.contains("https://x.example/phyfarm/static/style.css"));
}
