//! `phyfarm repro`: finding the recorded check, the plan's hashes, the
//! emulator's arguments.

use super::*;

#[test]
fn only_nodes_of_the_farm_checks_are_run() {
    assert!(valid_nodeid(
        "pytest-tests/farm/test_link_flap.py::test_link_flap[rust-reset_after_link_loss]"
    ));
    assert!(valid_nodeid(
        "pytest-tests/farm/test_cable_test.py::test_cable_test[rust---cable-test-tdr]"
    ));
    assert!(valid_nodeid(
        "pytest-tests/farm/test_dmesg.py::test_dmesg_clean"
    ));
    for bad in [
        "pytest-tests/mail/test_x.py::test_y",
        "pytest-tests/farm/../../x.py::test_y",
        "pytest-tests/farm/test_x.py",
        "pytest-tests/farm/test_x.py::test_y[a b]",
        "pytest-tests/farm/test_x.py::test_y[]",
        "pytest-tests/farm/test_x.py::test_y[$(id)]",
        "-p evil",
    ] {
        assert!(!valid_nodeid(bad), "{bad}");
    }
}

fn farm_folder(d: &Path, name: &str, tests: &[(&str, &str, &str)]) -> PathBuf {
    let f = d.join(name);
    std::fs::create_dir_all(&f).unwrap();
    let tests: Vec<serde_json::Value> = tests
        .iter()
        .map(|(id, v, st)| {
            serde_json::json!({"id": id, "nodeid": "pytest-tests/farm/test_a.py::test_a", "variant": v,
                "status": st, "duration": 1.0, "message": "", "measurements": []})
        })
        .collect();
    let r = serde_json::json!({"schema": crate::farm::contract::FARM_SCHEMA, "reproducer": "",
        "started": "", "finished": "", "duration": 1.0, "status": "PASS", "counts": {},
        "tests": tests, "environment": {}});
    std::fs::write(f.join("results.json"), r.to_string()).unwrap();
    f
}

fn opts(check: &str, variant: Option<Variant>, folders: Vec<PathBuf>) -> Options {
    Options {
        revision: "s/v1".into(),
        check: check.into(),
        variant,
        folders,
        shell: false,
        out: None,
    }
}

#[test]
fn the_variant_that_did_not_pass_is_chosen_and_two_need_a_choice() {
    let d = tempfile::tempdir().unwrap();
    let f = farm_folder(
        d.path(),
        "farm",
        &[
            ("farm.probe", "rust", "FAIL"),
            ("farm.probe", "c", "PASS"),
            ("farm.dmesg", "rust", "FAIL"),
            ("farm.dmesg", "c", "ERROR"),
        ],
    );
    let got = find(&opts("farm.probe", None, vec![f.clone()])).unwrap();
    assert_eq!(got.record.variant.as_deref(), Some("rust"));
    let err = find(&opts("farm.dmesg", None, vec![f.clone()]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rust FAIL, c ERROR") && err.contains("--variant"),
        "{err}"
    );
    let got = find(&opts("farm.dmesg", Some(Variant::C), vec![f.clone()])).unwrap();
    assert_eq!(got.record.status, Status::Error);
    let err = find(&opts("farm.nope", None, vec![f.clone()]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not among the recorded results"), "{err}");
    let err = find(&opts("gate.clippy", None, vec![f.clone()]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a farm check"), "{err}");
    let err = find(&opts("farm.differential.probe", None, vec![f]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--variant rust and --variant c"), "{err}");
}

#[test]
fn a_file_that_changed_since_the_run_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let k = d.path().join("bzImage");
    let img = d.path().join("farm.cpio");
    std::fs::write(&k, b"kernel").unwrap();
    std::fs::write(&img, b"image").unwrap();
    let hash = |p: &Path| crate::guest::plan::file_sha256(p).unwrap();
    let mut plan = GuestPlan {
        sha256: [
            (k.display().to_string(), hash(&k)),
            (img.display().to_string(), hash(&img)),
        ]
        .into(),
        guest_image: img.clone(),
        accel: crate::guest::accel::Accel::Tcg,
        accel_reason: "requested".into(),
        machine: crate::guest::machine::machine_description(crate::guest::accel::Accel::Tcg),
        kernels: [("rust".to_string(), k.clone())].into(),
        variants: vec!["rust".into()],
        emulator: None,
        exporter_kernel: None,
    };
    assert_eq!(verify_plan(&plan, "rust").unwrap(), 2);
    assert!(verify_plan(&plan, "c")
        .unwrap_err()
        .to_string()
        .contains("no c kernel"));
    std::fs::write(&k, b"rebuilt kernel").unwrap();
    let err = verify_plan(&plan, "rust").unwrap_err().to_string();
    assert!(err.contains("bzImage changed since the run"), "{err}");
    std::fs::remove_file(&k).unwrap();
    let err = verify_plan(&plan, "rust").unwrap_err().to_string();
    assert!(err.contains("is gone since the run"), "{err}");
    // A plan written before the hashes were: nothing to check against.
    plan.sha256.clear();
    assert_eq!(verify_plan(&plan, "rust").unwrap(), 0);
}

#[test]
fn the_emulators_arguments_are_compared_without_per_run_paths() {
    let d = tempfile::tempdir().unwrap();
    let procs = serde_json::json!([
        {"name": "ax88772-emu", "argv": ["/x/ax88772-emu", "--listen", "unix:/tmp/a/usb.sock",
         "--wire", "dgram:unix:/tmp/a/e", "--ctl", "/tmp/a/ctl", "--capture-dir", "/logs",
         "--ready-file", "/tmp/a/r", "--autoneg-ms=1500", "--on-disconnect", "exit"]},
        {"name": "qemu", "argv": ["qemu-system-x86_64"]},
    ]);
    std::fs::write(d.path().join("procs.json"), procs.to_string()).unwrap();
    assert_eq!(
        emulator_args(d.path()).unwrap(),
        ["--autoneg-ms=1500", "--on-disconnect", "exit"]
    );
    assert!(emulator_args(&d.path().join("nope")).is_none());
}
