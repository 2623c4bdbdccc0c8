use super::*;
use serde_json::json;

/// Write a schema-2 results.json whose tests are `tests`, with the fields
/// a test may leave out filled in.
pub(crate) fn write_results(dir: &Path, tests: serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let mut tests = tests;
    for t in tests.as_array_mut().unwrap() {
        let o = t.as_object_mut().unwrap();
        o.entry("duration").or_insert(json!(1.0));
        o.entry("message").or_insert(json!(""));
        o.entry("measurements").or_insert(json!([]));
        o.entry("variant").or_insert(json!(null));
    }
    let doc = json!({
        "schema": 2, "started": "2026-12-03T10:00:00Z", "finished": "2026-12-03T10:05:00Z",
        "environment": {}, "status": "PASS", "counts": {}, "tests": tests,
    });
    std::fs::write(dir.join("results.json"), doc.to_string()).unwrap();
}

fn all_pass(variants: &[&str]) -> serde_json::Value {
    let mut v = vec![];
    for var in variants {
        for id in FARM_CHECKS {
            v.push(json!({"id": id, "variant": var, "status": "PASS"}));
        }
    }
    json!(v)
}

fn status_of(imp: &FarmImport, id: &str, variant: Option<&str>) -> Vec<(u32, Status)> {
    imp.tests
        .iter()
        .filter(|t| t.path == id && t.variant.as_deref() == variant)
        .map(|t| (t.attempt, t.status))
        .collect()
}

#[test]
fn ids_carry_their_parameters_and_odd_ones_are_refused() {
    for ok in [
        "farm.probe",
        "farm.link_flap[reset_after_link_loss]",
        "farm.cable_test[cable-test-tdr]",
        "farm.kunit.rust_doctest_kernel_0",
        "farm.differential.link_flap[plain]",
    ] {
        assert!(valid_check_id(ok), "{ok}");
    }
    for bad in [
        "",
        "Farm.probe",
        "farm..probe",
        "farm.probe[",
        "farm.probe[]",
        "farm.probe[a;b]",
        "farm.probe[a]x",
        "farm.pro be",
        "farm/probe",
    ] {
        assert!(!valid_check_id(bad), "{bad}");
    }
}

#[test]
fn every_planned_check_is_imported_with_its_parameters() {
    let d = tempfile::tempdir().unwrap();
    write_results(d.path(), all_pass(&["rust", "c"]));
    let plan = Plan::new(&["rust", "c"], false);
    let imp = import(d.path(), &plan, None).unwrap();
    assert_eq!(
        status_of(&imp, "farm.link_flap[reset_after_link_loss]", Some("rust")),
        [(0, Status::Pass)]
    );
    assert_eq!(
        status_of(&imp, "farm.cable_test[cable-test]", Some("c")),
        [(0, Status::Pass)]
    );
    // Every check x 2 variants + its differential, nothing dropped or missing.
    assert_eq!(imp.tests.len(), FARM_CHECKS.len() * 3);
    assert!(imp.tests.iter().all(|t| t.status == Status::Pass));
}

#[test]
fn a_planned_check_not_reported_is_miss_and_no_results_is_error() {
    let d = tempfile::tempdir().unwrap();
    let mut tests = all_pass(&["rust"]);
    tests
        .as_array_mut()
        .unwrap()
        .retain(|t| t["id"] != "farm.cable_test[cable-test]");
    write_results(d.path(), tests);
    let plan = Plan::new(&["rust"], true);
    let imp = import(d.path(), &plan, None).unwrap();
    let miss: Vec<&str> = imp
        .tests
        .iter()
        .filter(|t| t.status == Status::Miss)
        .map(|t| t.path.as_str())
        .collect();
    assert_eq!(miss, ["farm.cable_test[cable-test]", "farm.kunit"]);
    assert!(imp.tests[imp.tests.len() - 1]
        .log_excerpt
        .contains("planned but not reported"));

    let empty = tempfile::tempdir().unwrap();
    let imp = import(empty.path(), &plan, Some("pytest was killed")).unwrap();
    assert_eq!(imp.tests.len(), plan.checks.len());
    assert!(imp
        .tests
        .iter()
        .all(|t| t.status == Status::Error && t.log_excerpt.contains("pytest was killed")));
}

#[test]
fn unknown_ids_fields_and_statuses_are_errors_naming_them() {
    let d = tempfile::tempdir().unwrap();
    let plan = Plan::new(&["rust"], false);
    write_results(
        d.path(),
        json!([{"id": "farm.harness.no_process_outlives", "variant": "rust", "status": "PASS"}]),
    );
    let e = import(d.path(), &plan, None).unwrap_err().to_string();
    assert!(
        e.contains("farm.harness.no_process_outlives") && e.contains("not in the run's plan"),
        "{e}"
    );

    write_results(
        d.path(),
        json!([{"id": "farm.probe", "variant": "rust", "status": "PASS", "colour": "red"}]),
    );
    let e = import(d.path(), &plan, None).unwrap_err().to_string();
    assert!(
        e.contains("colour") && e.contains("farm-results.schema.json"),
        "{e}"
    );

    write_results(
        d.path(),
        json!([{"id": "farm.probe", "variant": "rust", "status": "FLAKY"}]),
    );
    let e = import(d.path(), &plan, None).unwrap_err().to_string();
    assert!(e.contains("FLAKY"), "{e}");

    write_results(
        d.path(),
        json!([{"id": "farm.probe[a;b]", "variant": "rust", "status": "PASS"}]),
    );
    let e = import(d.path(), &plan, None).unwrap_err().to_string();
    assert!(e.contains("tests[0].id"), "{e}");
}

#[test]
fn a_retry_is_recorded_as_attempt_one() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("farm");
    let mut tests = all_pass(&["rust"]);
    tests[6]["status"] = json!("FAIL");
    tests[6]["measurements"] = json!([{"name": "settle_autoneg", "value": 0.1, "unit": "s"}]);
    write_results(&out, tests);
    write_results(
        &retry_dir(&out),
        json!([{"id": "farm.speed_duplex", "variant": "rust", "status": "PASS", "duration": 21.0}]),
    );
    let imp = import(&out, &Plan::new(&["rust"], false), None).unwrap();
    assert_eq!(
        status_of(&imp, "farm.speed_duplex", Some("rust")),
        [(0, Status::Fail), (1, Status::Pass)]
    );
    assert_eq!(imp.measurements.len(), 1);
    assert!(imp.measurements[0].lower_is_better);
    assert_eq!(retry_dir(&out), d.path().join("farm-retry"));
}

#[test]
fn the_differential_names_the_side_that_deviates_and_both_failing_is_not_pass() {
    let d = tempfile::tempdir().unwrap();
    let plan = Plan::new(&["rust", "c"], false);
    let mut tests = all_pass(&["rust", "c"]);
    // The c variant's checks follow the rust variant's n.
    let n = FARM_CHECKS.len();
    // probe: rust fails; dmesg: both fail.
    tests[0]["status"] = json!("FAIL");
    tests[0]["message"] = json!("AssertionError: PHY driver is 'Generic PHY'");
    tests[7]["status"] = json!("FAIL");
    tests[n + 7]["status"] = json!("FAIL");
    // throughput: rust clearly slower than c.
    tests[1]["measurements"] = json!([{"name": "tcp_tx", "value": 40.0, "unit": "Mbit/s",
        "samples": [40.0, 41.0, 39.5, 40.5, 40.2]}]);
    tests[n + 1]["measurements"] = json!([{"name": "tcp_tx", "value": 93.0, "unit": "Mbit/s",
        "samples": [93.0, 93.5, 92.8, 93.2, 93.1]}]);
    write_results(d.path(), tests);
    let imp = import(d.path(), &plan, None).unwrap();
    let diff = |id: &str| {
        imp.tests
            .iter()
            .find(|t| t.path == differential_id(id))
            .unwrap()
            .clone()
    };
    let probe = diff("farm.probe");
    assert_eq!(probe.status, Status::Fail);
    assert!(
        probe
            .log_excerpt
            .starts_with("rust deviates: rust FAIL, c PASS"),
        "{}",
        probe.log_excerpt
    );
    let dmesg = diff("farm.dmesg");
    assert_eq!(dmesg.status, Status::Fail);
    assert!(dmesg.log_excerpt.starts_with("both variants fail"));
    let tp = diff("farm.throughput");
    assert_eq!(tp.status, Status::Fail);
    assert!(
        tp.log_excerpt.contains("tcp_tx: rust is slower") && tp.log_excerpt.contains("p = "),
        "{}",
        tp.log_excerpt
    );
    assert_eq!(diff("farm.speed_duplex").status, Status::Pass);
}

#[test]
fn the_schema_file_and_the_reader_agree_on_the_id_pattern() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/farm-results.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let pattern = schema["$defs"]["id"]["pattern"].as_str().unwrap();
    assert_eq!(
        pattern,
        r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*(\[[A-Za-z0-9_,=+-]+\])?$"
    );
    assert_eq!(schema["properties"]["schema"]["const"], json!(FARM_SCHEMA));
}

#[test]
fn the_reader_accepts_and_refuses_the_same_examples_as_the_schema() {
    // pipeline/schema/examples: good.json and bad-*.json; the harness's
    // tests run the same files through the JSON Schema (jsonschema).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/examples");
    let mut bad = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let r = FarmResults::load(&p);
        if name == "good.json" {
            assert_eq!(r.unwrap().unwrap().tests.len(), 3);
        } else {
            assert!(name.starts_with("bad-"), "{name}");
            let e = r.expect_err(&name).to_string();
            assert!(e.contains(&name), "{e}");
            bad += 1;
        }
    }
    assert!(bad >= 10, "{bad}");
}

#[test]
fn kunit_is_a_family_a_run_can_plan() {
    let k = vec![KUNIT_CHECK.to_string()];
    assert_eq!(keyword_for(&k).unwrap().unwrap(), "kunit");
    let plan = Plan::new(&["rust", "c"], true).only(&k);
    let ids: Vec<(&str, Option<&str>)> = plan
        .checks
        .iter()
        .map(|c| (c.id.as_str(), c.variant.as_deref()))
        .collect();
    assert_eq!(ids, [("farm.kunit", Some("rust"))]);
    assert!(plan.kunit);
    assert!(!Plan::new(&["rust"], true).only(&farm_families()).kunit);
    let mut all = farm_families();
    all.push(KUNIT_CHECK.into());
    assert_eq!(Plan::new(&["rust", "c"], true).families(), all);
    assert_eq!(Plan::new(&["c"], false).families(), farm_families());
}

#[test]
fn the_default_families_are_the_farm_checks() {
    let two = ["farm.link_flap".to_string(), "farm.probe".to_string()];
    assert_eq!(keyword_for(&two).unwrap().unwrap(), "link_flap or probe");
    // Every family of the registry once, parameters folded: a check added to
    // FARM_CHECKS needs no change here.
    let f = farm_families();
    let all = keyword_for(&f).unwrap().unwrap();
    let words: Vec<&str> = all.split(" or ").collect();
    assert_eq!(words.len(), f.len(), "{all}");
    for family in &f {
        let word = family.strip_prefix("farm.").unwrap();
        assert!(!word.contains('['), "{family}");
        assert_eq!(
            words.iter().filter(|w| **w == word).count(),
            1,
            "{word} in {all}"
        );
    }
    assert!(
        words.contains(&"link_flap") && words.contains(&"partner_limited"),
        "{all}"
    );
    let e = keyword_for(&["farm.link-flap".to_string()])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--checks: \"farm.link-flap\" is not a farm check family"),
        "{e}"
    );
    let only = Plan::new(&["rust", "c"], false).only(&["farm.link_flap".to_string()]);
    let ids: Vec<&str> = only.checks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "farm.link_flap[plain]",
            "farm.link_flap[reset_after_link_loss]",
            "farm.link_flap[forced_slow_reset]",
            "farm.link_flap[plain]",
            "farm.link_flap[reset_after_link_loss]",
            "farm.link_flap[forced_slow_reset]",
            "farm.differential.link_flap[plain]",
            "farm.differential.link_flap[reset_after_link_loss]",
            "farm.differential.link_flap[forced_slow_reset]"
        ]
    );
}

#[test]
fn a_differential_reported_by_the_farm_is_refused_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let plan = Plan::new(&["rust", "c"], false);
    let mut tests = all_pass(&["rust", "c"]);
    tests
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "farm.differential.probe", "status": "PASS"}));
    write_results(d.path(), tests);
    let e = import(d.path(), &plan, None).unwrap_err().to_string();
    assert!(
        e.contains("\"farm.differential.probe\": differentials are computed by phyfarm"),
        "{e}"
    );
}

#[test]
fn a_results_file_over_the_limit_is_refused_as_larger_not_misparsed() {
    let d = tempfile::tempdir().unwrap();
    // A valid beginning, then more bytes than the limit allows.
    let path = d.path().join("results.json");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(crate::results::MAX_RESULTS_BYTES + 1).unwrap();
    let e = FarmResults::load(&path).unwrap_err().to_string();
    assert!(e.contains("larger than 64 MiB"), "{e}");
    assert!(e.contains("results.json"), "{e}");
}

#[test]
fn a_duplicate_among_thousands_of_kunit_cases_is_still_found() {
    let d = tempfile::tempdir().unwrap();
    let plan = Plan::new(&["rust"], true);
    let mut tests = all_pass(&["rust"]);
    let v = tests.as_array_mut().unwrap();
    v.push(json!({"id": "farm.kunit", "variant": "rust", "status": "PASS"}));
    for i in 0..5000 {
        v.push(json!({"id": format!("farm.kunit.case_{i}"), "variant": "rust", "status": "PASS"}));
    }
    let dup = v.len();
    v.push(json!({"id": "farm.kunit.case_17", "variant": "rust", "status": "PASS"}));
    write_results(d.path(), tests);
    let e = import(d.path(), &plan, None).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "tests[{dup}].id \"farm.kunit.case_17\" is reported twice"
        )),
        "{e}"
    );
}

#[test]
fn the_run_says_which_accelerator_and_which_link_partner_and_why() {
    let env: BTreeMap<String, serde_json::Value> = serde_json::from_value(json!({
        "accel": "tcg", "accel_reason": "KVM cannot run a guest here",
        "partner": "host", "partner_reason": "the host's stack on the emulator's tap",
        "qemu": "QEMU emulator version 7.2",
    }))
    .unwrap();
    assert_eq!(
        environment_lines(&env),
        [
            "accelerator: tcg (KVM cannot run a guest here)",
            "link partner: host (the host's stack on the emulator's tap)",
        ]
    );
    // A run from before the partner was recorded, or a value of the wrong
    // type, says nothing of it.
    let old: BTreeMap<String, serde_json::Value> =
        serde_json::from_value(json!({"accel": "kvm", "partner": 3})).unwrap();
    assert_eq!(environment_lines(&old), ["accelerator: kvm"]);
}
