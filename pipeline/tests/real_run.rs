//! The verdict path on outputs of a real run (tests/fixtures/real-run,
//! refreshed by `make fixtures` from what `make run` leaves): the shipped
//! v8's series-build.json and its farm's results.json on the patched and on
//! the base kernels (the checks, then throughput measured apart), recorded
//! with `phyfarm record` as the
//! pull-request workflow does, then the same run with a check missing and
//! with an id nobody planned.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-run")
}

fn series() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../patches/rust-phy-enum-check/v8")
}

fn record(store: &Path, farm: &Path) -> Output {
    let out = store.with_extension("out");
    Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .arg("--store")
        .arg(store)
        .arg("record")
        .arg("-o")
        .arg(&out)
        .arg("--series")
        .arg(series())
        .arg("--build")
        .arg(fixture())
        .arg("--farm")
        .arg(farm)
        .arg("--farm")
        .arg(fixture().join("farm-throughput"))
        .arg("--base-farm")
        .arg(fixture().join("base/farm"))
        .arg("--base-farm")
        .arg(fixture().join("base/farm-throughput"))
        .env_remove("PHYFARM_STORE")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A copy of the fixture's farm results with `edit` applied to its tests,
/// its counts kept the tally of its tests (as the harness writes them).
fn edited(dir: &Path, edit: impl FnOnce(&mut Vec<serde_json::Value>)) -> PathBuf {
    let text = std::fs::read_to_string(fixture().join("farm/results.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(doc["tests"].as_array_mut().unwrap());
    let mut counts = serde_json::Map::new();
    for t in doc["tests"].as_array().unwrap() {
        let s = t["status"].as_str().unwrap().to_string();
        let n = counts.get(&s).and_then(|n| n.as_u64()).unwrap_or(0);
        counts.insert(s, (n + 1).into());
    }
    doc["counts"] = counts.into();
    let farm = dir.join("farm");
    std::fs::create_dir_all(&farm).unwrap();
    std::fs::write(farm.join("results.json"), doc.to_string()).unwrap();
    farm
}

#[test]
fn the_real_v8_run_records_every_planned_check_and_awaits_review() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("r.sqlite");
    let o = record(&store, &fixture().join("farm"));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("rust-phy-enum-check/v8: awaiting-review"),
        "{out}"
    );
    // 8 checks x 2 variants, 8 differentials, the builds and gates.
    assert!(out.contains("checks planned and reported"), "{out}");
    let v = Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .args(["--store", store.to_str().unwrap(), "verdict", "--json"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    let checks = doc[0]["checks"].as_array().unwrap();
    let has = |path: &str, variant: Option<&str>| {
        checks
            .iter()
            .any(|c| c["path"] == path && c["variant"].as_str() == variant && c["status"] == "PASS")
    };
    for variant in ["rust", "c"] {
        for id in phyfarm::farm::contract::FARM_CHECKS {
            assert!(
                has(id, Some(variant)),
                "{id} ({variant}) not PASS: {checks:?}"
            );
        }
    }
    assert!(has(
        "farm.differential.link_flap[reset_after_link_loss]",
        None
    ));
    assert!(has("farm.differential.cable_test[cable-test]", None));
    // The KUnit build of the patched tree and its doctests, case by case.
    assert!(has("gate.kunit_build", Some("rust")));
    assert!(has("farm.kunit", Some("rust")));
    let doctests = checks
        .iter()
        .filter(|c| c["path"].as_str().unwrap().starts_with("farm.kunit."))
        .count();
    assert!(doctests > 100, "{doctests} doctest cases");
}

#[test]
fn without_the_base_farm_throughput_cannot_be_judged_and_the_revision_keeps_testing() {
    let d = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .arg("--store")
        .arg(d.path().join("r.sqlite"))
        .arg("record")
        .arg("-o")
        .arg(d.path().join("out"))
        .arg("--series")
        .arg(series())
        .arg("--build")
        .arg(fixture())
        .arg("--farm")
        .arg(fixture().join("farm"))
        .arg("--farm")
        .arg(fixture().join("farm-throughput"))
        .env_remove("PHYFARM_STORE")
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("rust-phy-enum-check/v8: testing"), "{out}");
    assert!(
        out.contains("MISS: tcp_tx: the base has no samples to compare with"),
        "{out}"
    );
}

#[test]
fn a_planned_check_that_did_not_report_keeps_the_revision_testing() {
    let d = tempfile::tempdir().unwrap();
    let farm = edited(d.path(), |tests| {
        tests.retain(|t| {
            !(t["id"] == "farm.link_flap[reset_after_link_loss]" && t["variant"] == "c")
        })
    });
    let o = record(&d.path().join("r.sqlite"), &farm);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("rust-phy-enum-check/v8: testing"), "{out}");
    assert!(
        out.contains("incomplete: farm.link_flap[reset_after_link_loss] (c) MISS"),
        "{out}"
    );
}

#[test]
fn an_unplanned_id_is_refused_and_nothing_is_recorded() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("r.sqlite");
    let farm = edited(d.path(), |tests| {
        let mut x = tests[0].clone();
        x["id"] = "farm.harness.no_process_outlives".into();
        tests.push(x);
    });
    let o = record(&store, &farm);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("\"farm.harness.no_process_outlives\"")
            && out.contains("not in the run's plan"),
        "{out}"
    );
    assert!(!store.exists(), "a refused run must record nothing");
    assert!(
        !fixture().join("results.json").exists(),
        "the fixture folder is input only"
    );
}

/// A copy of the fixture's series-build.json with `edit` applied, as the
/// folder of a `--build`.
fn forged_build(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let text = std::fs::read_to_string(fixture().join("series-build.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut doc);
    let build = dir.join("build");
    std::fs::create_dir_all(&build).unwrap();
    std::fs::write(build.join("series-build.json"), doc.to_string()).unwrap();
    build
}

fn record_with(store: &Path, build: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .arg("--store")
        .arg(store)
        .arg("record")
        .arg("-o")
        .arg(store.with_extension("out"))
        .arg("--series")
        .arg(series())
        .arg("--build")
        .arg(build)
        .arg("--farm")
        .arg(fixture().join("farm"))
        .arg("--farm")
        .arg(fixture().join("farm-throughput"))
        .arg("--base-farm")
        .arg(fixture().join("base/farm"))
        .arg("--base-farm")
        .arg(fixture().join("base/farm-throughput"))
        .env_remove("PHYFARM_STORE")
        .output()
        .unwrap()
}

#[test]
fn a_series_build_claiming_another_revision_is_refused_and_nothing_is_recorded() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("r.sqlite");
    type Edit = fn(&mut serde_json::Value);
    let claims: [(&str, Edit); 3] = [
        ("series.version", |doc| doc["series"]["version"] = 99.into()),
        ("series.patchset_hash", |doc| {
            doc["series"]["patchset_hash"] = "0".repeat(64).into()
        }),
        ("series.patches[0].patch_id", |doc| {
            doc["series"]["patches"][0]["patch_id"] = "f".repeat(40).into()
        }),
    ];
    for (field, edit) in claims {
        let build = forged_build(d.path(), edit);
        let o = record_with(&store, &build);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{field}: {out}");
        let line = format!("{}: {field}:", build.join("series-build.json").display());
        assert!(out.contains(&line), "{field}: {out}");
        assert!(
            !store.exists(),
            "{field}: a refused artifact recorded something"
        );
    }
}

#[test]
fn a_superseded_revision_gets_no_new_runs() {
    let d = tempfile::tempdir().unwrap();
    // The real v8's revision run, renamed v9 of the same change, recorded
    // as if a newer revision had been tested.
    let first = d.path().join("first.sqlite");
    let o = record(&first, &fixture().join("farm"));
    let results = first.with_extension("out").join("results.json");
    assert!(results.is_file(), "{}", text(&o));
    let mut run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    run["id"] = "v9-run".into();
    run["revision"]["version"] = 9.into();
    run["revision"]["patchset_hash"] = "9".repeat(64).into();
    let v9 = d.path().join("v9.json");
    std::fs::write(&v9, run.to_string()).unwrap();
    let store = d.path().join("r.sqlite");
    let o = Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .arg("--store")
        .arg(&store)
        .args(["store", "import"])
        .arg(&v9)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let before = std::fs::read(&store).unwrap();
    let o = record(&store, &fixture().join("farm"));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("rust-phy-enum-check/v8 is superseded by rust-phy-enum-check/v9"),
        "{out}"
    );
    assert_eq!(std::fs::read(&store).unwrap(), before, "the store changed");
}

#[test]
fn a_changed_revision_refused_by_the_store_leaves_no_base_run_behind() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("r.sqlite");
    let o = record(&store, &fixture().join("farm"));
    assert!(store.exists(), "{}", text(&o));
    // The same v8 with one commit message changed: another patchset hash,
    // and a build of exactly that series.
    let copy = d.path().join("rust-phy-enum-check");
    std::fs::create_dir_all(copy.join("v8")).unwrap();
    let shipped = series();
    std::fs::copy(
        shipped.parent().unwrap().join("series.toml"),
        copy.join("series.toml"),
    )
    .unwrap();
    for e in std::fs::read_dir(&shipped).unwrap() {
        let p = e.unwrap().path();
        let mut text = std::fs::read_to_string(&p).unwrap();
        if p.file_name().unwrap().to_string_lossy().starts_with("0001") {
            text = text.replacen("\n---\n", "\nA sentence added on resend.\n---\n", 1);
        }
        std::fs::write(copy.join("v8").join(p.file_name().unwrap()), text).unwrap();
    }
    let show = Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .args(["series", "show", "--json"])
        .arg(copy.join("v8"))
        .output()
        .unwrap();
    assert!(show.status.success(), "{}", text(&show));
    let parsed: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    let build = forged_build(d.path(), |doc| doc["series"] = parsed.clone());
    let before = std::fs::read(&store).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_phyfarm"))
        .arg("--store")
        .arg(&store)
        .arg("record")
        .arg("-o")
        .arg(d.path().join("out2"))
        .arg("--series")
        .arg(copy.join("v8"))
        .arg("--build")
        .arg(&build)
        .arg("--farm")
        .arg(fixture().join("farm"))
        .arg("--farm")
        .arg(fixture().join("farm-throughput"))
        .env_remove("PHYFARM_STORE")
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("a changed revision needs a new version"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(&store).unwrap(),
        before,
        "the refused revision's base run was recorded alone"
    );
}
