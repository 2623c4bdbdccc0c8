use super::*;

fn tar_entry(name: &str, kind: u8, data: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000755");
    let size = format!("{:011o}", data.len());
    h[124..135].copy_from_slice(size.as_bytes());
    h[156] = kind;
    h[257..262].copy_from_slice(b"ustar");
    let mut v = h;
    v.extend_from_slice(data);
    v.resize(v.len().div_ceil(512) * 512, 0);
    v
}

fn tar(entries: &[(&str, u8, &[u8])]) -> Vec<u8> {
    let mut v: Vec<u8> = entries
        .iter()
        .flat_map(|(n, k, d)| tar_entry(n, *k, d))
        .collect();
    v.extend_from_slice(&[0u8; 1024]);
    v
}

#[test]
fn reads_files_and_gnu_long_names() {
    let long = "usr/lib/x86_64-linux-gnu/".to_string() + &"a".repeat(120);
    let t = tar(&[
        ("usr/", b'5', b""),
        ("usr/bin/iperf3", b'0', b"\x7fELF iperf"),
        ("././@LongLink", b'L', format!("{long}\0").as_bytes()),
        ("ignored", b'0', b"lib"),
    ]);
    let files = read_tar(&t).unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0].path, "usr/bin/iperf3");
    assert_eq!(files[0].data, b"\x7fELF iperf");
    assert_eq!(files[0].mode, 0o755);
    assert_eq!(files[1].path, long);
}

#[test]
fn rejects_truncated_and_odd_archives() {
    let mut t = tar(&[("a", b'0', &[1u8; 600])]);
    t.truncate(700);
    assert!(matches!(read_tar(&t), Err(GuestError::Tar(m)) if m.contains("truncated")));
    let t = tar(&[("dev/x", b'3', b"")]);
    assert!(matches!(read_tar(&t), Err(GuestError::Tar(m)) if m.contains("entry type")));
}

const MANIFEST: &str = "bin ip /usr/sbin/ip /usr/bin/ip\n\
    lib /usr/sbin/ip /lib/x86_64-linux-gnu/libmnl.so.0\n\
    lib /usr/sbin/ip /lib64/ld-linux-x86-64.so.2\n";

fn file(p: &str) -> TarFile {
    TarFile {
        path: p.into(),
        mode: 0o755,
        data: b"\x7fELF".to_vec(),
    }
}

#[test]
fn a_missing_library_is_named() {
    let m = parse_manifest(MANIFEST);
    assert_eq!(m.programs.len(), 1);
    assert_eq!(m.libraries.len(), 2);
    let files = vec![file("usr/bin/ip"), file("lib/x86_64-linux-gnu/libmnl.so.0")];
    match check_complete(&m, &files) {
        Err(GuestError::MissingLibrary { lib, by }) => {
            assert_eq!(lib, "/lib64/ld-linux-x86-64.so.2");
            assert_eq!(by, "/usr/sbin/ip");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn entries_have_init_agent_parents_and_program_links() {
    let m = parse_manifest(MANIFEST);
    let files = vec![
        file("usr/bin/ip"),
        file("lib/x86_64-linux-gnu/libmnl.so.0"),
        file("lib64/ld-linux-x86-64.so.2"),
    ];
    check_complete(&m, &files).unwrap();
    let e = entries(
        &files,
        &m,
        b"\x7fELFagent".to_vec(),
        b"\x7fELFgadget".to_vec(),
    );
    let mut seen_dirs = BTreeSet::new();
    let mut names = BTreeMap::new();
    for x in &e {
        match x {
            Entry::Dir { path, .. } => {
                seen_dirs.insert(path.clone());
            }
            Entry::File { path, .. } | Entry::CharDev { path, .. } => {
                let parent = Path::new(path).parent().unwrap().to_string_lossy();
                assert!(
                    parent.is_empty() || seen_dirs.contains(parent.as_ref()),
                    "{path} before its directory"
                );
                names.insert(path.clone(), String::new());
            }
            Entry::Symlink { path, target } => {
                names.insert(path.clone(), target.clone());
            }
        }
    }
    for n in [
        "init",
        AGENT_PATH,
        "lib64/ld-linux-x86-64.so.2",
        "dev/console",
    ] {
        assert!(names.contains_key(n), "{n} missing");
    }
    assert_eq!(names["usr/sbin/ip"], "/usr/bin/ip");
    assert_eq!(names["var/run"], "../run");
    assert!(FARM_INIT.contains("phyfarm-agent"));
}
