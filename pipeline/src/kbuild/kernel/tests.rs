use super::*;

fn tc() -> Toolchain {
    Toolchain {
        image: Some(ImageRef {
            name: "localhost/phyfarm-kbuild:x".into(),
            id: "id".into(),
        }),
        kernel_version: "6.12.1-1".into(),
        tools: Versions::new(),
    }
}

fn paths() -> Paths {
    Paths {
        repo: "/repo".into(),
        cache: "/cache".into(),
    }
}

#[test]
fn layout_is_keyed_by_version_and_variant() {
    let l = Layout::new(&paths(), "6.12.1-1", Variant::C);
    assert_eq!(
        l.src,
        Path::new("/cache/src/linux-source-6.12_6.12.1-1/linux-source-6.12")
    );
    assert_eq!(l.build, Path::new("/cache/build/6.12.1-1/c"));
}

#[test]
fn copy_tree_keeps_mtimes_and_replaces_the_destination() {
    let d = tempfile::tempdir().unwrap();
    let (from, to) = (d.path().join("a"), d.path().join("b"));
    std::fs::create_dir_all(from.join("sub")).unwrap();
    std::fs::write(from.join("sub/x.o"), "obj").unwrap();
    std::fs::create_dir_all(&to).unwrap();
    std::fs::write(to.join("stale"), "old").unwrap();
    copy_tree(&from, &to).unwrap();
    assert_eq!(std::fs::read_to_string(to.join("sub/x.o")).unwrap(), "obj");
    assert!(!to.join("stale").exists());
    assert!(!to.with_extension("tmp").exists());
    let m = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(m(&from.join("sub/x.o")), m(&to.join("sub/x.o")));
}

#[test]
fn a_tree_being_built_is_copied_only_when_its_build_ends() {
    let d = tempfile::tempdir().unwrap();
    let (from, to) = (d.path().join("base"), d.path().join("series"));
    std::fs::create_dir_all(&from).unwrap();
    std::fs::write(from.join("vmlinux"), "half-linked").unwrap();
    // Another build holds the base tree's lock, as kernel::build does.
    let building = lock(&from.with_extension("lock"), "[test]").unwrap();
    let copier = {
        let (from, to) = (from.clone(), to.clone());
        std::thread::spawn(move || copy_built_tree(&from, &to, "[test]").unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !copier.is_finished(),
        "copied while the tree was being built"
    );
    std::fs::write(from.join("vmlinux"), "linked").unwrap();
    drop(building);
    copier.join().unwrap();
    assert_eq!(
        std::fs::read_to_string(to.join("vmlinux")).unwrap(),
        "linked"
    );
}

#[test]
fn extra_options_get_their_own_tree() {
    let plain = Layout::with_extra(&paths(), "v", Variant::Rust, "");
    let k = Layout::with_extra(&paths(), "v", Variant::Rust, "CONFIG_KUNIT=y\n");
    assert_eq!(plain.build, Path::new("/cache/build/v/rust"));
    assert_ne!(k.build, plain.build);
    assert!(k
        .build
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("rust-"));
    assert_eq!(k.src, plain.src);
}

#[test]
fn configure_merges_the_variant_fragment() {
    let l = Layout::new(&paths(), "v", Variant::Rust);
    let jobs = configure_jobs(&tc(), &l, Variant::Rust, false);
    assert_eq!(
        jobs[0].argv,
        [
            "make",
            "-s",
            "-C",
            "/src",
            "O=/build",
            "ARCH=x86_64",
            "tinyconfig"
        ]
    );
    assert!(jobs[1]
        .argv
        .contains(&"/phyfarm/variant-rust.config".to_string()));
    assert!(jobs[1]
        .argv
        .contains(&"/src/kernel/configs/kvm_guest.config".to_string()));
    assert_eq!(jobs[2].argv.last().unwrap(), "olddefconfig");
    let c = configure_jobs(&tc(), &l, Variant::C, true);
    assert!(c[1].argv.contains(&"/phyfarm/variant-c.config".to_string()));
    assert!(c[1]
        .argv
        .contains(&"/build/.phyfarm-extra.config".to_string()));
}

#[test]
fn make_job_is_64_bit_and_out_of_tree() {
    let l = Layout::new(&paths(), "v", Variant::Rust);
    let (argv, _) = Runtime::Podman.argv(&make_job(&tc(), &l, 2));
    let s = argv.join(" ");
    assert!(s.contains("--network=none"), "{s}");
    assert!(
        s.ends_with("make -C /src O=/build ARCH=x86_64 -j2 bzImage"),
        "{s}"
    );
    assert!(
        s.contains("src=/cache/src/linux-source-6.12_v/linux-source-6.12,dst=/src,ro"),
        "{s}"
    );
}

#[test]
fn extra_options_become_a_fragment() {
    let f = extra_fragment(&["CONFIG_KUNIT=y".into(), "CONFIG_X=n".into()]).unwrap();
    assert_eq!(f, "CONFIG_KUNIT=y\n# CONFIG_X is not set\n");
    let err = extra_fragment(&["KUNIT=y".into()]).unwrap_err().to_string();
    assert!(err.contains("-K option 1 (`KUNIT=y`)"), "{err}");
}

#[test]
fn free_space_walks_up_to_an_existing_dir() {
    assert!(free_space(Path::new("/tmp/does/not/exist/yet")) > 0);
    let err = need_space(Path::new("/tmp"), u64::MAX - 1, "x")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not enough disk space"), "{err}");
}
