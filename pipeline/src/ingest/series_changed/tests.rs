//! `series changed` on a real git history built in a temporary directory.

use std::fs;
use std::path::Path;
use std::process::Command;

use super::*;

/// A git repository in a tempdir, committed to step by step.
struct Repo {
    dir: tempfile::TempDir,
}

impl Repo {
    fn new() -> Repo {
        let r = Repo {
            dir: tempfile::tempdir().unwrap(),
        };
        r.git(&["init", "-q", "-b", "main"]);
        r.write("README.md", "fixture\n");
        r.commit("initial");
        r
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(self.path())
            .args([
                "-c",
                "user.name=Fixture",
                "-c",
                "user.email=fixture@example.org",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.path().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    fn commit(&self, msg: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "--allow-empty", "-m", msg]);
        self.git(&["rev-parse", "HEAD"])
    }

    fn changed(&self, base: &str, head: &str) -> Vec<(String, Status, Vec<Reason>, Vec<String>)> {
        changed(self.path(), base, head)
            .unwrap()
            .revisions
            .into_iter()
            .map(|r| {
                let files = r
                    .files
                    .iter()
                    .map(|f| format!("{} {}", f.status, f.path))
                    .collect();
                (r.dir, r.status, r.reasons, files)
            })
            .collect()
    }
}

const MANIFEST_V1: &str = "name = \"s\"\ntree = \"net-next\"\n";

/// The history most tests read: v1, then v2, v1 modified, v1 deleted,
/// the manifest edited, unrelated files.
struct History {
    repo: Repo,
    c0: String,
    add_v1: String,
    add_v2: String,
    mod_v1: String,
    del_v1: String,
    manifest: String,
    noise: String,
}

fn history() -> History {
    let repo = Repo::new();
    let c0 = repo.git(&["rev-parse", "HEAD"]);
    repo.write("patches/s/series.toml", MANIFEST_V1);
    repo.write("patches/s/v1/0001-a.patch", "one\n");
    repo.write("patches/s/v1/0002-b.patch", "two\n");
    let add_v1 = repo.commit("add s v1");
    repo.write("patches/s/v2/0001-a.patch", "one, v2\n");
    let add_v2 = repo.commit("add s v2");
    repo.write("patches/s/v1/0001-a.patch", "one, fixed\n");
    let mod_v1 = repo.commit("modify s v1");
    repo.git(&["rm", "-q", "-r", "patches/s/v1"]);
    let del_v1 = repo.commit("delete s v1");
    repo.write("patches/s/series.toml", "name = \"s\"\ntree = \"net\"\n");
    let manifest = repo.commit("retarget s");
    repo.write("README.md", "changed\n");
    repo.write("patches/README.md", "about patches\n");
    repo.write("patches/s/notes.md", "notes\n");
    let noise = repo.commit("documentation only");
    History {
        repo,
        c0,
        add_v1,
        add_v2,
        mod_v1,
        del_v1,
        manifest,
        noise,
    }
}

fn v(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

#[test]
fn history_step_by_step() {
    let h = history();
    let r = &h.repo;
    assert_eq!(
        r.changed(&h.c0, &h.add_v1),
        [(
            "patches/s/v1".into(),
            Status::Added,
            vec![Reason::Files, Reason::Manifest],
            v(&["A patches/s/v1/0001-a.patch", "A patches/s/v1/0002-b.patch"])
        )]
    );
    assert_eq!(
        r.changed(&h.add_v1, &h.add_v2),
        [(
            "patches/s/v2".into(),
            Status::Added,
            vec![Reason::Files],
            v(&["A patches/s/v2/0001-a.patch"])
        )]
    );
    assert_eq!(
        r.changed(&h.add_v2, &h.mod_v1),
        [(
            "patches/s/v1".into(),
            Status::Modified,
            vec![Reason::Files],
            v(&["M patches/s/v1/0001-a.patch"])
        )]
    );
    assert_eq!(
        r.changed(&h.mod_v1, &h.del_v1),
        [(
            "patches/s/v1".into(),
            Status::Removed,
            vec![Reason::Files],
            v(&["D patches/s/v1/0001-a.patch", "D patches/s/v1/0002-b.patch"])
        )]
    );
    // The manifest changed: every revision still there (v2 only) is listed.
    assert_eq!(
        r.changed(&h.del_v1, &h.manifest),
        [(
            "patches/s/v2".into(),
            Status::Modified,
            vec![Reason::Manifest],
            vec![]
        )]
    );
    // Files outside revision folders change nothing.
    assert_eq!(r.changed(&h.manifest, &h.noise), []);
}

#[test]
fn whole_range_nets_out_a_revision_added_then_deleted() {
    let h = history();
    let got = h.repo.changed(&h.c0, &h.noise);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "patches/s/v2");
    assert_eq!(got[0].1, Status::Added);
    // Deleting v1 relative to a base that had it is a removal.
    let got = h.repo.changed(&h.add_v2, &h.noise);
    let dirs: Vec<_> = got.iter().map(|g| (g.0.as_str(), g.1)).collect();
    assert_eq!(
        dirs,
        [
            ("patches/s/v1", Status::Removed),
            ("patches/s/v2", Status::Modified)
        ]
    );
}

#[test]
fn base_ahead_of_the_fork_point_is_not_blamed_on_the_branch() {
    let h = history();
    let r = &h.repo;
    r.git(&["checkout", "-q", "-b", "feature", &h.add_v2]);
    r.write("patches/s/v3/0001-a.patch", "one, v3\n");
    let feature = r.commit("add s v3");
    // main moved on (v1 modified and deleted, the manifest edited) after
    // the fork point; the branch only added v3.
    assert_eq!(
        r.changed("main", &feature),
        [(
            "patches/s/v3".into(),
            Status::Added,
            vec![Reason::Files],
            v(&["A patches/s/v3/0001-a.patch"])
        )]
    );
    let c = changed(r.path(), "main", "feature").unwrap();
    assert_eq!(c.merge_base, h.add_v2);
    assert_eq!(c.head, feature);
}

#[test]
fn a_renamed_revision_is_removed_plus_added() {
    let h = history();
    let r = &h.repo;
    r.git(&["mv", "patches/s/v2", "patches/s/v4"]);
    let moved = r.commit("renumber v2 as v4");
    let got: Vec<_> = r
        .changed(&h.noise, &moved)
        .into_iter()
        .map(|g| (g.0, g.1))
        .collect();
    assert_eq!(
        got,
        [
            ("patches/s/v2".to_string(), Status::Removed),
            ("patches/s/v4".to_string(), Status::Added)
        ]
    );
}

#[test]
fn head_defaults_and_symbolic_refs_resolve() {
    let h = history();
    let c = changed(h.repo.path(), "HEAD~5", "HEAD").unwrap();
    assert_eq!(c.base, h.add_v1);
    assert_eq!(c.head, h.noise);
    let got: Vec<_> = c
        .revisions
        .iter()
        .map(|r| (r.dir.as_str(), r.status))
        .collect();
    assert_eq!(
        got,
        [
            ("patches/s/v1", Status::Removed),
            ("patches/s/v2", Status::Added)
        ]
    );
}

#[test]
fn unknown_and_malformed_refs_are_refused() {
    let h = history();
    let p = h.repo.path();
    let err = changed(p, "no-such-branch", "HEAD").unwrap_err();
    assert!(matches!(err, ChangedError::UnknownRef { .. }), "{err}");
    assert!(err.to_string().contains("no-such-branch"), "{err}");
    for bad in [
        "",
        "--output=/tmp/x",
        "-p",
        "main..HEAD",
        "main...HEAD",
        "HEAD@{1}",
        "main;rm",
        "a b",
        "$(id)",
        "main:README.md",
        "topic/",
        "x.lock",
    ] {
        let err = changed(p, bad, "HEAD").unwrap_err();
        assert!(matches!(err, ChangedError::BadRef { .. }), "{bad:?}: {err}");
        let err = changed(p, "HEAD", bad).unwrap_err();
        assert!(matches!(err, ChangedError::BadRef { .. }), "{bad:?}: {err}");
    }
    for good in ["main", "origin/main", "HEAD~2", "HEAD^", "v8.0", &h.c0] {
        validate_ref(good).unwrap();
    }
}

#[test]
fn not_a_repository_is_a_git_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = changed(dir.path(), "HEAD", "HEAD").unwrap_err();
    assert!(
        matches!(
            err,
            ChangedError::UnknownRef { .. } | ChangedError::Git { .. }
        ),
        "{err}"
    );
}

#[test]
fn unsafe_folder_names_are_refused_not_skipped() {
    for (path, what) in [
        ("patches/bad name/v1/0001-a.patch", "series folder name"),
        ("patches/$(id)/v1/0001-a.patch", "series folder name"),
        ("patches/.hidden/v1/0001-a.patch", "series folder name"),
        ("patches/s/v01/0001-a.patch", "revision folder"),
        ("patches/s/v0/0001-a.patch", "revision folder"),
        ("patches/s/v99999999999/0001-a.patch", "revision folder"),
    ] {
        let r = Repo::new();
        let base = r.git(&["rev-parse", "HEAD"]);
        r.write(path, "x\n");
        let head = r.commit("bad");
        let err = changed(r.path(), &base, &head).unwrap_err();
        assert!(matches!(err, ChangedError::BadPath { .. }), "{path}: {err}");
        assert!(err.to_string().contains(what), "{path}: {err}");
    }
}

#[test]
fn folder_name_rules() {
    assert_eq!(revision_number("v8"), Ok(Some(8)));
    assert_eq!(revision_number("v12"), Ok(Some(12)));
    assert_eq!(revision_number("notes"), Ok(None));
    assert_eq!(revision_number("v"), Ok(None));
    assert_eq!(revision_number("v8-draft"), Ok(None));
    assert!(revision_number("v08").is_err());
    assert!(revision_number("v0").is_err());
    assert_eq!(
        place("patches/s/v8/0001.patch").unwrap(),
        Place::Revision {
            series: "s",
            version: 8
        }
    );
    assert_eq!(
        place("patches/s/series.toml").unwrap(),
        Place::Manifest { series: "s" }
    );
    assert_eq!(place("patches/s/notes.md").unwrap(), Place::Other);
    assert_eq!(place("patches/README.md").unwrap(), Place::Other);
    assert_eq!(place("pipeline/src/lib.rs").unwrap(), Place::Other);
    assert_eq!(place("patches/s/draft/0001.patch").unwrap(), Place::Other);
}

#[test]
fn text_and_json_output() {
    let h = history();
    let c = changed(h.repo.path(), &h.add_v2, &h.manifest).unwrap();
    assert_eq!(
        render_text(&c),
        "removed   patches/s/v1 (2 files)\nmodified  patches/s/v2 (series.toml)\n"
    );
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["revisions"][0]["status"], "removed");
    assert_eq!(json["revisions"][1]["reasons"][0], "series.toml");
    assert_eq!(json["revisions"][1]["series"], "s");
    assert_eq!(json["revisions"][1]["version"], 2);
    assert_eq!(json["head"], h.manifest);
}

#[test]
fn name_status_parsing() {
    let files = parse_name_status("M\0patches/s/v1/a b.patch\0D\0x\0").unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0].path, "patches/s/v1/a b.patch");
    assert_eq!(files[1].status, "D");
    assert!(parse_name_status("M\0").is_err());
    assert!(parse_name_status("").unwrap().is_empty());
}

#[test]
fn links_under_patches_are_refused_by_name() {
    for link in [
        "patches/s/v1/0001-a.patch",
        "patches/s/series.toml",
        "patches/evil",
    ] {
        let r = Repo::new();
        let base = r.git(&["rev-parse", "HEAD"]);
        r.write("patches/s/v1/0002-b.patch", "x\n");
        let p = r.path().join(link);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        let head = r.commit("link");
        let err = changed(r.path(), &base, &head).unwrap_err();
        assert!(matches!(err, ChangedError::BadPath { .. }), "{link}: {err}");
        let text = err.to_string();
        assert!(
            text.contains(link) && text.contains("symbolic link"),
            "{text}"
        );
        assert!(!text.contains("root:"), "{text}");
    }
}
