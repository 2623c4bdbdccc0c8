use super::patches::{accept_warnings, accepted};
use super::*;

#[test]
fn make_test_builds_the_base_kunit_kernel_a_run_starts_from() {
    // Same options, same order: one build tree for `make test` and runs.
    let mk = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Makefile")).unwrap();
    let want = format!("-K {} -o $(KUNIT_OUT)", KUNIT_OPTIONS.join(" -K "));
    assert!(
        mk.contains(&want),
        "the Makefile's KUnit build is not {want}"
    );
}

#[test]
fn gates_have_targets() {
    let d = tempfile::tempdir().unwrap();
    assert!(gate_target("enum-check", 2, d.path()).is_none());
    std::fs::create_dir_all(d.path().join("rust")).unwrap();
    std::fs::write(
        d.path().join("rust/Makefile"),
        "x += bindings/bindings_generated_enum_check.rs\n",
    )
    .unwrap();
    let t = gate_target("enum-check", 2, d.path()).unwrap();
    assert_eq!(t[5..], ["-j2", "rust/"]);
    assert_eq!(
        gate_target("clippy", 2, d.path()).unwrap()[5..],
        ["CLIPPY=1", "-j2", "bzImage"]
    );
    assert_eq!(
        gate_target("rustfmtcheck", 2, d.path())
            .unwrap()
            .last()
            .unwrap(),
        "rustfmtcheck"
    );
    assert!(gate_target("nope", 2, d.path()).is_none());
}

#[test]
fn control_characters_are_not_printed() {
    assert_eq!(printable("a\x1b[31mb\nc"), "a?[31mb?c");
}

#[test]
fn staged_patches_get_safe_names() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../patches/rust-phy-enum-check/v7");
    let s = series::load(&dir).unwrap();
    let out = tempfile::tempdir().unwrap();
    let files = stage_patches(&s, out.path()).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["0003.patch", "0004.patch"]);
    assert_eq!(
        std::fs::read(&files[0]).unwrap(),
        std::fs::read(&s.patches[0].file).unwrap()
    );
}

#[test]
fn mbox_messages_are_cut_apart() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../patches/rust-phy-enum-check/v7");
    let tmp = tempfile::tempdir().unwrap();
    let mut mbox = Vec::new();
    let mut parts = Vec::new();
    for f in [
        "0003-rust-add-second-bindgen-pass-for-enum-exhaustiveness-che.patch",
        "0004-MAINTAINERS-add-Rust-PHY-abstractions-for-ETHERNET-PHY-L.patch",
    ] {
        let body = std::fs::read(dir.join(f)).unwrap();
        let mut msg =
            b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n".to_vec();
        msg.extend_from_slice(&body);
        parts.push(msg.clone());
        mbox.extend_from_slice(&msg);
    }
    let path = tmp.path().join("series.mbox");
    std::fs::write(&path, &mbox).unwrap();
    let s = series::load(&path).unwrap();
    let files = stage_patches(&s, &tmp.path().join("out")).unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(std::fs::read(&files[1]).unwrap(), parts[1]);
    assert_eq!(std::fs::read(&files[0]).unwrap(), parts[0]);
}

#[test]
fn a_new_warning_counts_unless_series_toml_accepts_it_with_a_reason() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("v1")).unwrap();
    let manifest = d.path().join(series::MANIFEST_FILE);
    let head = "name = \"s\"\ntree = \"net-next\"\nbase = { package = \"linux-source-6.12\", distro = \"debian trixie\" }\n";
    std::fs::write(
        &manifest,
        format!("{head}[[accepted-warnings]]\nwarning = \"unused variable: `lpa`\"\nreason = \"kept for the next patch\"\n"),
    )
    .unwrap();
    let w = |text: &str| Warning {
        key: text.into(),
        text: text.into(),
    };
    let found = vec![
        w("warning: unused variable: `lpa` --> drivers/net/phy/ax88796b_rust.rs:58:13"),
        w("drivers/net/phy/ax88796b.c:12:5: warning: unused variable 'x'"),
    ];
    let (counted, let_pass) = accept_warnings(found, &accepted(&d.path().join("v1")).unwrap());
    assert_eq!(counted.len(), 1);
    assert!(counted[0].text.contains("ax88796b.c"));
    assert_eq!(let_pass.len(), 1);
    assert_eq!(let_pass[0].1, "kept for the next patch");
    // No series.toml: every new warning counts.
    let bare = tempfile::tempdir().unwrap();
    assert!(accepted(&bare.path().join("v1")).unwrap().is_empty());
    // An entry without a reason is refused, naming it.
    std::fs::write(
        &manifest,
        format!("{head}[[accepted-warnings]]\nwarning = \"unused variable\"\nreason = \"\"\n"),
    )
    .unwrap();
    let e = accepted(&d.path().join("v1")).unwrap_err().to_string();
    assert!(
        e.contains("series.toml") && e.contains("accepted-warnings[0]"),
        "{e}"
    );
}
