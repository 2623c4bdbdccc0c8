//! The trusted record's checks against the real run's outputs and edits of them.

use super::*;

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../patches")
}

fn fixture_build() -> SeriesBuild {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-run/series-build.json");
    load_build(&f).unwrap()
}

#[test]
fn the_real_build_agrees_with_the_shipped_series() {
    let dir = shipped().join("rust-phy-enum-check/v8");
    let parsed = series::load(&dir).unwrap();
    check_build(Path::new("sb.json"), &fixture_build(), &parsed, &dir).unwrap();
}

#[test]
fn every_identity_field_is_checked() {
    let dir = shipped().join("rust-phy-enum-check/v8");
    let parsed = series::load(&dir).unwrap();
    type Edit = fn(&mut SeriesBuild);
    let edits: [(&str, Edit); 6] = [
        ("series.version", |b| b.series.version = 99),
        ("series.patchset_hash", |b| {
            b.series.patchset_hash = "0".repeat(64)
        }),
        ("series.change_id", |b| b.series.change_id = None),
        ("series.patches", |b| {
            b.series.patches.pop();
        }),
        ("series.patches[0].patch_id", |b| {
            b.series.patches[0].patch_id = "1".repeat(40)
        }),
        ("builds[0].index", |b| b.builds[0].index = 7),
    ];
    for (field, edit) in edits {
        let mut b = fixture_build();
        edit(&mut b);
        let e = check_build(Path::new("sb.json"), &b, &parsed, &dir).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("sb.json: {field}:")),
            "{field}: {text}"
        );
    }
}

#[test]
fn a_farm_result_that_contradicts_itself_is_refused() {
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-run/farm");
    check_farm(&real, &["rust", "c"]).unwrap();
    let e = check_farm(&real, &["rust"]).unwrap_err().to_string();
    assert!(e.contains("tests[0].variant"), "{e}");
    let text = std::fs::read_to_string(real.join("results.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["tests"][3]["status"] = "FAIL".into();
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("results.json"), doc.to_string()).unwrap();
    let e = check_farm(d.path(), &["rust", "c"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("results.json: counts:"), "{e}");
    let n = doc["tests"].as_array().unwrap().len();
    doc["counts"] = serde_json::json!({"PASS": n - 1, "FAIL": 1});
    std::fs::write(d.path().join("results.json"), doc.to_string()).unwrap();
    let e = check_farm(d.path(), &["rust", "c"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("results.json: status: PASS but its worst test is FAIL"),
        "{e}"
    );
}

#[test]
fn a_stored_run_keeps_to_the_plan() {
    let ok =
        crate::results::fixture::run("r", Some(1), "2026-06-01T00:00:00Z", "2026-06-01T01:00:00Z");
    let f = Path::new("r.json");
    let mut r = ok.clone();
    r.tests[0].path = "farm.probe".into();
    r.tests[0].variant = Some("rust".into());
    check_stored_run(f, &r).unwrap();
    r.tests[0].path = "farm.harness.no_process_outlives".into();
    let e = check_stored_run(f, &r).unwrap_err().to_string();
    assert!(e.starts_with("r.json: tests[0].path:"), "{e}");
    r.tests[0].path = "farm.kunit.rust_doctest_0".into();
    check_stored_run(f, &r).unwrap();
    r.tests[0].variant = Some("c".into());
    let e = check_stored_run(f, &r).unwrap_err().to_string();
    assert!(e.starts_with("r.json: tests[0].path:"), "{e}");
    r.tests[0].path = "farm.differential.probe".into();
    r.tests[0].variant = None;
    check_stored_run(f, &r).unwrap();
    r.tests[0].path = "farm.probe".into();
    r.tests[0].variant = Some("arm".into());
    let e = check_stored_run(f, &r).unwrap_err().to_string();
    assert!(e.starts_with("r.json: tests[0].variant:"), "{e}");
    let mut r = ok;
    r.revision.as_mut().unwrap().series = "..".into();
    let e = check_stored_run(f, &r).unwrap_err().to_string();
    assert!(e.starts_with("r.json: revision.series:"), "{e}");
}

#[test]
fn only_owners_add_revisions_to_a_series_the_default_branch_holds() {
    let d = tempfile::tempdir().unwrap();
    let trusted = d.path().join("trusted");
    let own = trusted.join("owned");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::write(
        own.join("series.toml"),
        "name = \"owned\"\nchange-id = \"20260101-owned-0123456789ab\"\ntree = \"net-next\"\n\
         owners = [\"github:alice\"]\nbase = { package = \"p\", distro = \"d\" }\n",
    )
    .unwrap();
    let v8 = shipped().join("rust-phy-enum-check/v8");
    let mut parsed = series::load(&v8).unwrap();
    let pr = d.path().join("pr/owned/v9");
    // By folder, by name and by change-id, the owner list decides.
    let by_folder = check_owner(&trusted, &pr, "other", &parsed, "github:mallory");
    assert!(
        matches!(by_folder, Err(TrustError::NotOwner { .. })),
        "{by_folder:?}"
    );
    let elsewhere = d.path().join("pr/elsewhere/v9");
    assert!(check_owner(&trusted, &elsewhere, "owned", &parsed, "github:mallory").is_err());
    parsed.change_id = Some("20260101-owned-0123456789ab".into());
    assert!(check_owner(&trusted, &elsewhere, "other", &parsed, "github:mallory").is_err());
    check_owner(&trusted, &pr, "owned", &parsed, "github:alice").unwrap();
    parsed.change_id = None;
    check_owner(
        &trusted,
        &elsewhere,
        "new-series",
        &parsed,
        "github:mallory",
    )
    .unwrap();
}
