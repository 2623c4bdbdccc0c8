use super::*;
use crate::results::fixture::{run, t, test};
use crate::results::Status;
use crate::store::{OpenMode, SqliteStore, Store};

fn bundle(failing: bool) -> (tempfile::TempDir, Bundle) {
    let dir = tempfile::tempdir().unwrap();
    let mut st = SqliteStore::open(&dir.path().join("r.sqlite"), OpenMode::Create).unwrap();
    st.record_run(&run(
        "base",
        None,
        "2026-06-01T00:00:00Z",
        "2026-06-01T01:00:00Z",
    ))
    .unwrap();
    let mut v = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    v.tests.push(test(
        "apply.patch1",
        if failing { Status::Fail } else { Status::Pass },
    ));
    v.tests[0].log_excerpt = "guest said <oops> & \u{1} \"bye\"".into();
    st.record_run(&v).unwrap();
    let r = "s/v1".parse().unwrap();
    let b = Bundle::gather(
        &st,
        &r,
        t("2026-06-03T00:00:00Z"),
        "https://ci.example.org/",
    )
    .unwrap();
    (dir, b)
}

#[test]
fn patchwork_states_follow_the_verdict() {
    let (_d, b) = bundle(true);
    let v = patchwork::export(&b);
    let checks = v["patches"][0]["checks"].as_array().unwrap();
    let apply = checks
        .iter()
        .find(|c| c["context"] == "phyfarm-apply")
        .unwrap();
    assert_eq!(apply["state"], "fail");
    assert_eq!(apply["target_url"], "https://ci.example.org/series/s/v1");
    let farm = checks
        .iter()
        .find(|c| c["context"] == "phyfarm-farm")
        .unwrap();
    assert_eq!(farm["state"], "success");
    for c in checks {
        let ctx = c["context"].as_str().unwrap();
        assert!(
            ctx.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{ctx}"
        );
    }
    let (_d, ok) = bundle(false);
    let v = patchwork::export(&ok);
    assert_eq!(v["patches"][0]["checks"][0]["state"], "success");
}

#[test]
fn kcidb_checkout_carries_the_patchset() {
    let (_d, b) = bundle(true);
    let v = kcidb::export(&b);
    assert_eq!(v["version"]["major"], 5);
    let co = &v["checkouts"][1];
    assert_eq!(co["id"], "phyfarm:v1");
    assert_eq!(co["patchset_hash"], format!("{:064}", 1));
    assert_eq!(co["message_id"], "v1-0@example.org");
    assert_eq!(co["valid"], false);
    assert_eq!(v["checkouts"][0]["patchset_hash"], "");
    assert!(v["tests"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| !t["path"].as_str().unwrap().starts_with("apply.")));
}

#[test]
fn junit_and_markdown_escape_what_comes_from_patches() {
    let (_d, b) = bundle(true);
    let x = junit::export(&b);
    assert!(x.contains("&lt;oops&gt; &amp;  &quot;bye&quot;"), "{x}");
    assert!(!x.contains('\u{1}'));
    assert!(x.contains("<failure type=\"FAIL\""));
    let md = markdown::export(&b);
    assert!(md.contains("a &lt;b&gt; &amp; \\`c\\` \\| d"), "{md}");
    assert!(md.contains("**changes-requested**"), "{md}");
}

#[test]
fn b4_finds_a_patch_by_message_id_and_says_nothing_for_strangers() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = SqliteStore::open(&dir.path().join("r.sqlite"), OpenMode::Create).unwrap();
    let mut v = run(
        "v1",
        Some(1),
        "2026-06-02T00:00:00Z",
        "2026-06-02T01:00:00Z",
    );
    v.tests.push(test("apply.patch1", Status::Fail));
    st.record_run(&v).unwrap();
    let mail = b"From: A <a@example.org>\r\nMessage-Id:\r\n <v1-1@example.org>\r\nSubject: x\r\n\r\nbody\r\n";
    assert_eq!(b4::message_id(mail).as_deref(), Some("v1-1@example.org"));
    let out = b4::check(
        &st,
        mail,
        t("2026-06-03T00:00:00Z"),
        "http://127.0.0.1:8080",
    )
    .unwrap();
    let apply = out.iter().find(|r| r.tool == "phyfarm-apply").unwrap();
    assert_eq!(apply.status, "fail");
    assert!(apply.details.contains("s/v1 patch 1"), "{}", apply.details);
    let cover = b"Message-ID: <v1-0@example.org>\n\n";
    let out = b4::check(
        &st,
        cover,
        t("2026-06-03T00:00:00Z"),
        "http://127.0.0.1:8080",
    )
    .unwrap();
    assert!(!out.is_empty() && out.iter().all(|r| !r.tool.starts_with("phyfarm-apply")));
    let stranger = b"Message-ID: <who@else>\n\n";
    assert!(
        b4::check(&st, stranger, t("2026-06-03T00:00:00Z"), "http://x")
            .unwrap()
            .is_empty()
    );
    let e = Bundle::gather(
        &st,
        &"s/v1".parse().unwrap(),
        t("2026-06-03T00:00:00Z"),
        "ftp://x",
    );
    assert!(matches!(e, Err(ExportError::BadUrl(_))));
    let _ = st.revisions().unwrap();
}
