//! The results verbs end to end through the binary: fixture runs of the
//! shipped series, two processes writing at once, and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results")
}

fn phyfarm(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("PHYFARM_STORE")
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn import_fixtures(store: &Path) {
    for f in ["base.json", "v7.json", "v8.json"] {
        let o = phyfarm(
            store,
            &["store", "import", fixtures().join(f).to_str().unwrap()],
        );
        assert!(o.status.success(), "{:?}", text(&o));
    }
}

#[test]
fn shipped_series_v7_changes_requested_then_superseded_v8_awaiting_review() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("r.sqlite");
    let f = fixtures();
    let o = phyfarm(
        &store,
        &[
            "store",
            "import",
            f.join("base.json").to_str().unwrap(),
            f.join("v7.json").to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let o = phyfarm(
        &store,
        &[
            "verdict",
            "rust-phy-enum-check/v7",
            "--now",
            "2026-06-12T09:30:00Z",
        ],
    );
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "changes-requested exits 1: {out}");
    assert!(
        out.contains("changes-requested") && out.contains("apply.patch1 FAIL"),
        "{out}"
    );
    let o = phyfarm(
        &store,
        &["store", "import", f.join("v8.json").to_str().unwrap()],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let o = phyfarm(
        &store,
        &["verdict", "--json", "--now", "2026-06-12T12:00:00Z"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["state"], "superseded");
    let history: Vec<&str> = v[0]["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        history,
        ["new", "testing", "changes-requested", "superseded"]
    );
    assert_eq!(v[1]["state"], "awaiting-review");
    assert_eq!(v[1]["ready_at"], "2026-06-15T11:00:00Z");
    let o = phyfarm(
        &store,
        &[
            "review",
            "--nack",
            "20231026-rust-phy-enum-check-fdb11bdd318a/v8",
            "--by",
            "Andrew Lunn",
            "--reason",
            "needs a Fixes: tag",
            "--now",
            "2026-06-13T00:00:00Z",
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("changes-requested") && out.contains("Andrew Lunn"),
        "{out}"
    );
    let o = phyfarm(
        &store,
        &[
            "verdict",
            "rust-phy-enum-check/v8",
            "--now",
            "2026-06-12T13:00:00Z",
        ],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.starts_with("E: --now 2026-06-12T13:00:00Z is earlier"),
        "{err}"
    );
}

#[test]
fn two_processes_importing_at_once_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("r.sqlite");
    import_fixtures(&store);
    let template: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("v8.json")).unwrap()).unwrap();
    let mut batches: [Vec<PathBuf>; 2] = [vec![], vec![]];
    for (w, batch) in batches.iter_mut().enumerate() {
        for i in 0..12 {
            let mut v = template.clone();
            v["id"] = format!("w{w}-{i}").into();
            let p = dir.path().join(format!("w{w}-{i}.json"));
            std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
            batch.push(p);
        }
    }
    let children: Vec<_> = batches
        .iter()
        .map(|b| {
            Command::new(env!("CARGO_BIN_EXE_phyfarm"))
                .arg("--store")
                .arg(&store)
                .args(["store", "import"])
                .args(b)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = phyfarm(&store, &["store", "list"]);
    let (out, _) = text(&o);
    let v8 = out
        .lines()
        .find(|l| l.starts_with("rust-phy-enum-check/v8"))
        .unwrap();
    assert!(v8.contains("runs  25"), "{out}");
}

#[test]
fn bad_input_is_one_line_exit_2_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("r.sqlite");
    import_fixtures(&store);
    let before = text(&phyfarm(&store, &["store", "list"])).0;
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, b"{\"schema\": 1, \"id\": ").unwrap();
    let o = phyfarm(&store, &["store", "import", bad.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.starts_with("E: ") && err.contains("bad.json") && err.lines().count() == 1,
        "{err}"
    );
    let o = phyfarm(
        &store,
        &[
            "store",
            "import",
            fixtures().join("v8.json").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("already recorded"), "{:?}", text(&o));
    assert_eq!(text(&phyfarm(&store, &["store", "list"])).0, before);

    let junk = dir.path().join("junk.sqlite");
    std::fs::write(&junk, b"PK\x03\x04 a zip file").unwrap();
    let o = phyfarm(
        &junk,
        &[
            "store",
            "import",
            fixtures().join("v8.json").to_str().unwrap(),
        ],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("junk.sqlite") && err.contains("not a phyfarm results store"),
        "{err}"
    );
    assert_eq!(std::fs::read(&junk).unwrap(), b"PK\x03\x04 a zip file");

    for args in [
        vec!["verdict", "nonsense"],
        vec!["verdict", "--now", "yesterday"],
        vec![
            "review", "--ack", "x/v1", "--nack", "x/v1", "--by", "a", "--reason", "b",
        ],
        vec!["export", "kcidb", "nosuch/v1"],
    ] {
        let o = phyfarm(&store, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {:?}", text(&o));
    }
}

#[test]
fn an_empty_setting_in_the_environment_is_as_if_unset() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.sqlite");
    import_fixtures(&store);
    let o = Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .arg("--store")
        .arg(&store)
        .args(["verdict", "--json"])
        .env("PHYFARM_STORE", "")
        .env("PHYFARM_ACCEL", "")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("rust-phy-enum-check"), "{out}");
}

#[test]
fn an_import_is_all_or_nothing_and_refuses_what_record_would() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("r.sqlite");
    let f = fixtures();
    let v8: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.join("v8.json")).unwrap()).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let forgeries: [(&str, Edit); 3] = [
        // A field phyfarm does not know (a verdict the run claims for itself).
        ("unknown field `verdict`", |v| v["verdict"] = "PASS".into()),
        ("tests[0].path", |v| {
            v["tests"][0]["path"] = "farm.harness.no_process_outlives".into()
        }),
        ("revision.series", |v| v["revision"]["series"] = "..".into()),
    ];
    for (field, edit) in forgeries {
        let mut doc = v8.clone();
        edit(&mut doc);
        let forged = dir.path().join("forged.json");
        std::fs::write(&forged, doc.to_string()).unwrap();
        // The good file first: the forged one takes it back.
        let o = phyfarm(
            &store,
            &[
                "store",
                "import",
                f.join("base.json").to_str().unwrap(),
                forged.to_str().unwrap(),
            ],
        );
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{field}: {err}");
        assert!(
            err.contains("forged.json") && err.contains(field),
            "{field}: {err}"
        );
        assert!(
            !store.exists(),
            "{field}: a refused import recorded something"
        );
    }
    // Two files with one run id: neither is recorded.
    let o = phyfarm(
        &store,
        &[
            "store",
            "import",
            f.join("base.json").to_str().unwrap(),
            f.join("base.json").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(!store.exists());
}
