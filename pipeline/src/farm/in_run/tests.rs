use super::*;
use crate::farm::contract::tests::write_results;

#[test]
fn failed_checks_become_a_keyword_selection() {
    let d = tempfile::tempdir().unwrap();
    write_results(
        d.path(),
        serde_json::json!([
            {"id": "farm.speed_duplex", "nodeid": "pytest-tests/farm/test_speed_duplex.py::test_speed_duplex[rust]", "variant": "rust", "status": "FAIL"},
            {"id": "farm.probe", "nodeid": "pytest-tests/farm/test_probe.py::test_probe[c]", "variant": "c", "status": "PASS"},
            {"id": "farm.link_flap[plain]", "nodeid": "pytest-tests/farm/test_link_flap.py::test_link_flap[rust-plain]", "variant": "rust", "status": "ERROR"},
            {"id": "farm.dmesg", "nodeid": "pytest-tests/farm/test_x.py::test_y[a;b]", "variant": null, "status": "ERROR"}
        ]),
    );
    assert_eq!(
        failed_selection(d.path()).unwrap(),
        "(test_speed_duplex and rust) or test_link_flap or test_y"
    );
    write_results(
        d.path(),
        serde_json::json!([{"id": "farm.probe", "nodeid": "t.py::test_a", "variant": "rust", "status": "PASS"}]),
    );
    assert!(failed_selection(d.path()).is_none());
}

fn opts() -> TestOptions {
    TestOptions {
        artifacts: None,
        kernel: None,
        variant: None,
        workers: Some(2),
        keyword: Some("probe".into()),
        accel: crate::guest::accel::Accel::Tcg,
        guest_timeout: 60,
        flaps: None,
        device: None,
        emulator: None,
        out: None,
        pytest_args: vec![],
        runtime: crate::sandbox::runtime::Runtime::Podman,
    }
}

#[test]
fn the_base_key_changes_with_each_input_and_only_then() {
    let d = tempfile::tempdir().unwrap();
    let paths = Paths {
        repo: d.path().join("repo"),
        cache: d.path().join("cache"),
    };
    for dir in [
        "pytest-tests/farm",
        "harness/phyfarm_farm",
        "qemu-farm/ax88772/src",
        "qemu-farm/target",
        "containers",
        "pipeline/schema",
    ] {
        std::fs::create_dir_all(paths.repo.join(dir)).unwrap();
    }
    std::fs::write(paths.repo.join("pytest-tests/farm/test_probe.py"), "a").unwrap();
    std::fs::write(paths.repo.join("qemu-farm/ax88772/src/phy.rs"), "b").unwrap();
    let art = d.path().join("base");
    std::fs::create_dir_all(art.join("rust")).unwrap();
    std::fs::write(art.join("rust/bzImage"), "kernel 1").unwrap();
    let plan = crate::farm::contract::Plan::new(&["rust"], false);
    let key = || base_key(&paths, &opts(), &art, &plan).unwrap();
    let k0 = key();
    assert_eq!(k0, key(), "same inputs, same key");
    // Build outputs and caches do not count.
    std::fs::write(paths.repo.join("qemu-farm/target/x"), "out").unwrap();
    assert_eq!(k0, key());
    std::fs::write(art.join("rust/bzImage"), "kernel 2").unwrap();
    let k1 = key();
    assert_ne!(k0, k1, "a different base kernel");
    // With its build metadata a kernel is what it was built from: a
    // relink (new build number and date) is the same kernel, another
    // configuration is not.
    let meta = |config: &str| {
        serde_json::json!({"variant": "rust", "kernel_package": "linux-source-6.12",
            "kernel_version": "6.12.118-1", "config_hash": config, "status": "PASS",
            "image": {"name": "kbuild", "id": "abc"}, "tools": {"rustc": "1.85"},
            "started": "2026-12-03T16:00:00Z", "durations": [["build", 9.5]]})
    };
    std::fs::write(art.join("rust/metadata.json"), meta("c1").to_string()).unwrap();
    let k1 = key();
    std::fs::write(art.join("rust/bzImage"), "kernel 2, relinked").unwrap();
    let mut relinked = meta("c1");
    relinked["started"] = "2026-12-03T17:00:00Z".into();
    std::fs::write(art.join("rust/metadata.json"), relinked.to_string()).unwrap();
    assert_eq!(k1, key(), "a relink of the same build");
    std::fs::write(art.join("rust/metadata.json"), meta("c2").to_string()).unwrap();
    assert_ne!(k1, key(), "another configuration");
    std::fs::write(art.join("rust/metadata.json"), meta("c1").to_string()).unwrap();
    std::fs::write(paths.repo.join("qemu-farm/ax88772/src/phy.rs"), "c").unwrap();
    let k2 = key();
    assert_ne!(k1, k2, "a different emulator");
    std::fs::write(paths.repo.join("pytest-tests/farm/test_probe.py"), "d").unwrap();
    let k3 = key();
    assert_ne!(k2, k3, "a different check");
    let other = crate::farm::contract::Plan::new(&["rust"], true);
    assert_ne!(k3, base_key(&paths, &opts(), &art, &other).unwrap());
    let mut o = opts();
    o.flaps = Some(3);
    assert_ne!(k3, base_key(&paths, &o, &art, &plan).unwrap());
    let mut o = opts();
    o.workers = Some(3);
    assert_ne!(
        k3,
        base_key(&paths, &o, &art, &plan).unwrap(),
        "more guests at once"
    );
    // A given emulator binary: its bytes, not only its path.
    let emu = d.path().join("ax88772-emu");
    std::fs::write(&emu, "emulator 1").unwrap();
    let mut o = opts();
    o.emulator = Some(emu.clone());
    let k4 = base_key(&paths, &o, &art, &plan).unwrap();
    assert_ne!(k3, k4, "a given emulator instead of the built one");
    std::fs::write(&emu, "emulator 2").unwrap();
    assert_ne!(
        k4,
        base_key(&paths, &o, &art, &plan).unwrap(),
        "another binary at that path"
    );
}

#[test]
fn only_a_clean_base_is_kept_and_reused() {
    let d = tempfile::tempdir().unwrap();
    let paths = Paths {
        repo: d.path().join("repo"),
        cache: d.path().join("cache"),
    };
    let out = d.path().join("run1/base/farm");
    write_results(
        &out,
        serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "FAIL"}]),
    );
    keep_base(&paths, "k", &out);
    let next = d.path().join("run2/base/farm");
    assert!(
        !reuse_base(&paths, "k", &next),
        "a failing base is measured again"
    );
    write_results(
        &out,
        serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
    );
    write_results(
        &retry_dir(&out),
        serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
    );
    keep_base(&paths, "k", &out);
    assert!(
        !reuse_base(&paths, "k", &next),
        "a base that needed a retry is flaky"
    );
    clear(&out).unwrap();
    write_results(
        &out,
        serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
    );
    keep_base(&paths, "k", &out);
    // A stale retry in the next run's folder must not survive the reuse.
    write_results(
        &retry_dir(&next),
        serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "FAIL"}]),
    );
    assert!(reuse_base(&paths, "k", &next));
    assert!(!retry_dir(&next).exists());
    let r = crate::farm::contract::FarmResults::load(&next.join("results.json"))
        .unwrap()
        .unwrap();
    assert_eq!(r.tests[0].status, Status::Pass);
    assert!(!reuse_base(&paths, "other", &d.path().join("run3")));
}

#[test]
fn a_new_farm_run_starts_without_the_last_runs_results() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("farm");
    write_results(
        &out,
        serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
    );
    write_results(
        &retry_dir(&out),
        serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "FAIL"}]),
    );
    clear(&out).unwrap();
    assert!(!out.exists() && !retry_dir(&out).exists());
    clear(&out).unwrap();
}

#[test]
fn only_a_clear_throughput_drop_is_suspected() {
    let m = |name: &str, samples: &[f64]| crate::results::Measurement {
        name: name.into(),
        variant: Some("rust".into()),
        value: samples.iter().sum::<f64>() / samples.len() as f64,
        unit: "Mbit/s".into(),
        samples: samples.to_vec(),
        lower_is_better: false,
    };
    let base = crate::farm::contract::FarmImport {
        tests: vec![],
        measurements: vec![
            m("farm.throughput.tcp_tx", &[93.0, 93.5, 92.8, 93.2, 93.1]),
            m("farm.throughput.tcp_rx", &[93.0, 93.5, 92.8, 93.2, 93.1]),
        ],
        ..Default::default()
    };
    let rev = crate::farm::contract::FarmImport {
        tests: vec![],
        measurements: vec![
            m("farm.throughput.tcp_tx", &[60.0, 61.0, 59.5, 60.5, 60.2]),
            m("farm.throughput.tcp_rx", &[90.0, 95.0, 91.0, 94.0, 92.0]),
        ],
        ..Default::default()
    };
    assert_eq!(
        suspected_regressions(&base, &rev),
        [(
            "farm.throughput.tcp_tx".to_string(),
            Some("rust".to_string())
        )]
    );
}
