//! Tests of series ingest against the shipped series, git itself, and the
//! bad inputs under tests/fixtures/series.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use proptest::prelude::*;

use super::*;

fn patches_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("patches")
        .join("rust-phy-enum-check")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join("series")
        .join(name)
}

/// `git patch-id --stable` with the patch on stdin (git is a test
/// requirement, as it is for the pipeline's apply stage).
fn git_patch_id(bytes: &[u8]) -> String {
    let mut child = Command::new("git")
        .args(["patch-id", "--stable"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("git patch-id runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(bytes)
        .expect("write patch");
    let out = child.wait_with_output().expect("git patch-id output");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn v7_as_posted() {
    let s = load(&patches_dir().join("v7")).expect("v7 loads");
    assert_eq!(s.version, 7);
    assert_eq!(s.tree.as_deref(), Some("net-next"));
    assert!(!s.rfc && !s.resend && s.cover.is_none());
    let idx: Vec<(u32, u32)> = s.patches.iter().map(|p| (p.index, p.total)).collect();
    assert_eq!(idx, vec![(3, 5), (4, 5)]);
    assert_eq!(s.patches[0].author, "Miguel Ojeda");
    assert_eq!(s.patches[0].author_email, "ojeda@kernel.org");
    assert_eq!(s.patches[1].author, "FUJITA Tomonori");
    assert_eq!(s.patches[1].author_email, "fujita.tomonori@gmail.com");
    assert_eq!(
        s.patches[0].subject,
        "rust: add second `bindgen` pass for enum exhaustiveness checking"
    );
    assert_eq!(
        s.patches[0].files_touched,
        vec![
            "rust/.gitignore",
            "rust/Makefile",
            "rust/bindings/bindings_enum_check.rs"
        ]
    );
    assert_eq!(s.patches[1].files_touched, vec!["MAINTAINERS"]);
    // No cover letter in v7: the change-id comes from series.toml.
    let manifest = load_manifest(&patches_dir().join(MANIFEST_FILE)).expect("manifest");
    assert_eq!(s.change_id, manifest.change_id);
    assert!(s.change_id.is_some());
    for p in &s.patches {
        let bytes = std::fs::read(&p.file).expect("read patch");
        assert_eq!(p.patch_id, git_patch_id(&bytes), "{}", p.file.display());
        assert_eq!(p.sha256, sha256_hex(&bytes));
        assert!(!p.binary);
    }
    // KCIDB: sha256sum *.patch | cut -c-64 | sha256sum | cut -c-64
    let list = format!("{}\n{}\n", s.patches[0].sha256, s.patches[1].sha256);
    assert_eq!(s.patchset_hash, sha256_hex(list.as_bytes()));
}

#[test]
fn v8_forward_port() {
    let s = load(&patches_dir().join("v8")).expect("v8 loads");
    assert_eq!(s.version, 8);
    assert_eq!(s.tree.as_deref(), Some("net-next"));
    assert_eq!(s.patches.len(), 2);
    let cover = s.cover.as_ref().expect("cover letter");
    assert_eq!(cover.total, 2);
    assert_eq!(cover.author, "phyfarm maintainers");
    // The cover letter carries the change-id, and it is the series' one.
    assert_eq!(
        s.change_id.as_deref(),
        Some("20231026-rust-phy-enum-check-fdb11bdd318a")
    );
    let manifest = load_manifest(&patches_dir().join(MANIFEST_FILE)).expect("manifest");
    assert_eq!(s.change_id, manifest.change_id);
    // The subject of 1/2 is folded over two header lines.
    assert_eq!(
        s.patches[0].subject,
        "rust: add second `bindgen` pass for enum exhaustiveness checking"
    );
    assert_eq!(s.patches[0].author, "Miguel Ojeda");
    assert_eq!(s.patches[1].author, "FUJITA Tomonori");
    assert!(s.patches[0]
        .files_touched
        .contains(&"rust/kernel/net/phy.rs".to_string()));
    for p in &s.patches {
        let bytes = std::fs::read(&p.file).expect("read patch");
        assert_eq!(p.patch_id, git_patch_id(&bytes), "{}", p.file.display());
    }
    // The MAINTAINERS patch changed context only: same patch-id as v7's 4/5
    // would need identical hunks, which 6.12 does not have.
    let v7 = load(&patches_dir().join("v7")).expect("v7 loads");
    assert_ne!(v7.patchset_hash, s.patchset_hash);
}

#[test]
fn manifest_lists_revisions_that_load() {
    let m = load_manifest(&patches_dir().join(MANIFEST_FILE)).expect("manifest");
    assert_eq!(m.name, "rust-phy-enum-check");
    assert_eq!(m.tree, "net-next");
    assert_eq!(m.base.package, "linux-source-6.12");
    let versions: Vec<u32> = m.revisions.iter().map(|r| r.version).collect();
    assert_eq!(versions, vec![7, 8]);
    for r in &m.revisions {
        let s = load(&patches_dir().join(&r.dir)).expect("revision loads");
        assert_eq!(s.version, r.version);
        assert_eq!(s.tree.as_deref(), Some(m.tree.as_str()));
    }
}

/// The v7 files as an mboxrd, separator lines added and a body line that
/// needs `>From ` quoting.
#[test]
fn v7_as_mbox() {
    let dir = load(&patches_dir().join("v7")).expect("v7 loads");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mbox = tmp.path().join("v7.mbox");
    let mut data = Vec::new();
    for p in &dir.patches {
        data.extend_from_slice(
            b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n",
        );
        let text = std::fs::read(&p.file).expect("read patch");
        for line in text.split_inclusive(|&b| b == b'\n') {
            if line.starts_with(b"From ") {
                data.push(b'>');
            }
            data.extend_from_slice(line);
        }
    }
    std::fs::write(&mbox, &data).expect("write mbox");
    let s = load(&mbox).expect("mbox loads");
    assert_eq!(s.version, 7);
    assert_eq!(s.patches.len(), 2);
    for (a, b) in s.patches.iter().zip(&dir.patches) {
        assert_eq!((a.index, a.total), (b.index, b.total));
        assert_eq!(a.author, b.author);
        assert_eq!(a.subject, b.subject);
        assert_eq!(a.patch_id, b.patch_id);
        assert_eq!(a.files_touched, b.files_touched);
        assert_eq!(a.file, mbox);
    }
    assert_eq!(s.patches[0].line, 1);
    assert!(s.patches[1].line > 1);
}

fn expect_err(path: &Path) -> (SeriesError, String) {
    let err = load(path).expect_err("must be refused");
    let msg = err.to_string();
    (err, msg)
}

#[test]
fn missing_index() {
    let (err, msg) = expect_err(&fixture("missing-index"));
    assert!(
        matches!(err, SeriesError::MissingIndex { line: 3, .. }),
        "{err:?}"
    );
    assert!(msg.contains("0002-b.patch:3:"), "{msg}");
}

#[test]
fn duplicate_index() {
    let (err, msg) = expect_err(&fixture("duplicate-index"));
    assert!(
        matches!(err, SeriesError::DuplicateIndex { index: 1, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("0002-b.patch:3:") && msg.contains("0001-a.patch"),
        "{msg}"
    );
}

#[test]
fn totals_disagree() {
    let (err, msg) = expect_err(&fixture("total-mismatch"));
    assert!(
        matches!(
            err,
            SeriesError::TotalMismatch {
                total: 3,
                expected: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(msg.contains("0002-b.patch:3:"), "{msg}");
}

#[test]
fn mixed_versions() {
    let (err, msg) = expect_err(&fixture("mixed-versions"));
    assert!(
        matches!(
            err,
            SeriesError::MixedVersions {
                version: 8,
                expected: 7,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(msg.contains("0002-b.patch:3:"), "{msg}");
}

#[test]
fn not_a_patch() {
    let (err, msg) = expect_err(&fixture("not-a-patch"));
    assert!(
        matches!(err, SeriesError::NotAPatch { line: 5, .. }),
        "{err:?}"
    );
    assert!(msg.contains("0002-notes.patch:5:"), "{msg}");
}

#[test]
fn bad_hunk_header() {
    let (err, msg) = expect_err(&fixture("bad-hunk-header"));
    // Line 20 is the "@@ -7818,6 +7818,15 @@" header.
    assert!(
        matches!(err, SeriesError::CorruptPatch { line: 20, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("0001-a.patch:20:") && msg.contains("@@ -7818,6 +7818,15 @@"),
        "{msg}"
    );
}

#[test]
fn truncated_patch() {
    let (err, msg) = expect_err(&fixture("truncated"));
    assert!(
        matches!(err, SeriesError::CorruptPatch { line: 20, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("0001-a.patch:20:") && msg.contains("truncated"),
        "{msg}"
    );
}

#[test]
fn path_outside_tree() {
    for (case, line) in [("outside-tree", 16), ("absolute-path", 18)] {
        let (err, msg) = expect_err(&fixture(case));
        assert!(
            matches!(&err, SeriesError::PathOutsideTree { line: l, .. } if *l == line),
            "{case}: {err:?}"
        );
        assert!(msg.contains(&format!("0001-a.patch:{line}:")), "{msg}");
    }
}

#[test]
fn html_only_mail() {
    let (err, msg) = expect_err(&fixture("html-only.mbox"));
    assert!(
        matches!(err, SeriesError::HtmlOnly { line: 6, .. }),
        "{err:?}"
    );
    assert!(msg.contains("html-only.mbox:6:"), "{msg}");
}

#[test]
fn oversized_patch_is_refused_unread() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let big = tmp.path().join("0001-big.patch");
    let file = std::fs::File::create(&big).expect("create");
    file.set_len(MAX_PATCH_BYTES + 1).expect("sparse file");
    let (err, msg) = expect_err(tmp.path());
    assert!(matches!(err, SeriesError::TooLarge { .. }), "{err:?}");
    assert!(msg.contains("0001-big.patch"), "{msg}");
}

#[test]
fn empty_directory_has_no_patches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (err, _) = expect_err(tmp.path());
    assert!(matches!(err, SeriesError::NoPatches { .. }), "{err:?}");
}

#[test]
fn binary_and_awkward_names() {
    let s = load(&fixture("binary")).expect("binary patch loads");
    let p = &s.patches[0];
    assert!(p.binary);
    assert!(s.rfc);
    assert_eq!(s.version, 2);
    assert_eq!((p.index, p.total), (1, 1));
    assert_eq!(p.author, "Jörg Tester");
    assert_eq!(p.subject, "firmware: add a blob for the emulated PHY");
    assert_eq!(
        p.files_touched,
        vec!["firmware/phy \"x\";$(reboot).txt", "firmware/phy.bin"]
    );
    let bytes = std::fs::read(&p.file).expect("read");
    assert_eq!(p.patch_id, git_patch_id(&bytes));
    let text = render_text(&s);
    assert!(
        text.contains("(binary)") && text.contains("1/1 firmware"),
        "{text}"
    );
}

#[test]
fn json_shape() {
    let s = load(&patches_dir().join("v8")).expect("v8 loads");
    let v = serde_json::to_value(&s).expect("serialize");
    for key in [
        "version",
        "tree",
        "rfc",
        "resend",
        "change_id",
        "patchset_hash",
        "cover",
        "patches",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let p = &v["patches"][0];
    for key in [
        "index",
        "total",
        "subject",
        "author",
        "author_email",
        "date",
        "message_id",
        "patch_id",
        "file",
        "files_touched",
        "binary",
    ] {
        assert!(p.get(key).is_some(), "missing patch.{key}");
    }
}

/// Patches made by git itself (renames, mode changes, deletions, missing
/// final newline, binary, names with spaces): patch-ids equal git's.
#[test]
fn patch_id_matches_git_on_generated_patches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=T", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(repo)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let write = |name: &str, data: &[u8]| {
        let p = repo.join(name);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::write(p, data).expect("write");
    };
    git(&["init", "-q"]);
    let lines: String = (0..40).map(|i| format!("line {i}\n")).collect();
    write("a.txt", lines.as_bytes());
    write("dir/x y.txt", b"one\ntwo\n");
    write("gone.txt", b"bye\n");
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "base"]);
    write(
        "a.txt",
        lines
            .replace("line 3\n", "line three\n")
            .replace("line 30\n", "")
            .as_bytes(),
    );
    write("dir/x y.txt", b"one\ntwo\tthree");
    write("blob.bin", &[0, 1, 2, 3, 255, 0, 7]);
    std::fs::remove_file(repo.join("gone.txt")).expect("rm");
    git(&["add", "-A"]);
    git(&[
        "commit",
        "-q",
        "-m",
        "change\n\nFrom the start, this is a body line.",
    ]);
    git(&["mv", "a.txt", "renamed \"a\".txt"]);
    git(&["commit", "-q", "-m", "rename"]);
    git(&["format-patch", "-q", "-o", "out", "HEAD~2"]);
    let s = load(&repo.join("out")).expect("generated series loads");
    assert_eq!(s.patches.len(), 2);
    assert!(s.patches[0].binary);
    assert!(s.patches[0]
        .files_touched
        .contains(&"dir/x y.txt".to_string()));
    assert!(s.patches[1]
        .files_touched
        .contains(&"renamed \"a\".txt".to_string()));
    for p in &s.patches {
        let bytes = std::fs::read(&p.file).expect("read");
        assert_eq!(p.patch_id, git_patch_id(&bytes), "{}", p.file.display());
    }
}

fn parse_everything(bytes: &[u8]) {
    for raw in mail::split_mbox(bytes) {
        let _ = parse_item(Path::new("fuzz.mbox"), &raw);
    }
    let _ = patch_id::stable(bytes);
    let _ = diff::parse(bytes, 0);
    let _ = subject::parse(&String::from_utf8_lossy(bytes));
    let _ = mail::decode_rfc2047(&String::from_utf8_lossy(bytes));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        parse_everything(&bytes);
    }

    #[test]
    fn mutated_patches_never_panic(
        cut in 0usize..2000,
        flips in proptest::collection::vec((0usize..2000, any::<u8>()), 0..8),
    ) {
        let mut bytes = std::fs::read(
            patches_dir().join("v7").join("0003-rust-add-second-bindgen-pass-for-enum-exhaustiveness-che.patch"),
        ).expect("seed");
        for (at, b) in flips {
            let i = at % bytes.len();
            bytes[i] = b;
        }
        bytes.truncate(cut.max(1) * bytes.len() / 2000);
        parse_everything(&bytes);
    }
}

#[test]
fn a_missing_series_names_the_path_and_the_os_error_once() {
    let e = load(Path::new("/nonexistent/phyfarm-series")).unwrap_err();
    // As the CLI prints it: the error and its chain of causes.
    let text = format!("{:#}", anyhow::Error::from(e));
    assert!(
        text.starts_with("/nonexistent/phyfarm-series: cannot read: "),
        "{text}"
    );
    assert_eq!(
        text.matches("No such file or directory").count(),
        1,
        "{text}"
    );
}
