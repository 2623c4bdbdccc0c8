//! Applying a series patch by patch onto a git-initialised copy of the
//! distro tree, with a precise report when a patch does not apply: which
//! file, which hunk, and the rejected hunk's text. A patch whose change is
//! already in the tree (it reverse-applies, or every rejected hunk's added
//! lines are already there) is reported as "already applied".
//!
//! The git directory lives beside the work tree, not in it, so the kernel's
//! `setlocalversion` sees no repository and the release string stays that of
//! the distro package.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::sandbox::runtime::Job;

/// Identity for the commits `git am` makes in the scratch tree.
pub const GIT_IDENTITY: [(&str, &str); 4] = [
    ("GIT_COMMITTER_NAME", "phyfarm"),
    ("GIT_COMMITTER_EMAIL", "phyfarm@example.invalid"),
    ("GIT_AUTHOR_NAME", "phyfarm"),
    ("GIT_AUTHOR_EMAIL", "phyfarm@example.invalid"),
];

/// The tag of the unpatched distro tree.
pub const BASE_TAG: &str = "phyfarm-base";

/// How one patch applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyState {
    Applied,
    AlreadyApplied,
    Failed,
    /// Not attempted (the series could not be read that far).
    Skipped,
}

/// One hunk git rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RejectedHunk {
    pub file: String,
    /// 1-based hunk number within the file's section of the patch.
    pub hunk: usize,
    pub header: String,
    pub text: String,
    /// Every line the hunk adds is already in the file, in order.
    pub already_present: bool,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ApplyReport {
    pub index: usize,
    pub file: String,
    pub state: ApplyState,
    pub message: String,
    pub rejected: Vec<RejectedHunk>,
    /// Files git applied cleanly (for a failed patch: the rest of it).
    pub clean_files: Vec<String>,
}

/// A git command on the scratch tree: work tree at /src, git dir at /git.
pub fn git_job(image: &str, tree: &Path, gitdir: &Path, patches: &Path, args: &[&str]) -> Job {
    let mut argv = vec!["git"];
    argv.extend_from_slice(args);
    let mut j = Job::new(image, "/src", &argv)
        .mount(tree, "/src", false)
        .mount(gitdir, "/git", false)
        .mount(patches, "/patches", true)
        .env("GIT_DIR", "/git")
        .env("GIT_WORK_TREE", "/src");
    for (k, v) in GIT_IDENTITY {
        j = j.env(k, v);
    }
    j
}

/// Parse `git apply --reject --verbose` stderr into (files applied cleanly,
/// (file, rejected hunk numbers)).
pub fn parse_reject_output(text: &str) -> (Vec<String>, Vec<(String, Vec<usize>)>) {
    let mut clean = Vec::new();
    let mut rejects: Vec<(String, Vec<usize>)> = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Applied patch ") {
            // "Applied patch rust/.gitignore cleanly." or "Applied patch to 'x' cleanly."
            let name = rest
                .trim_end_matches(" cleanly.")
                .trim_start_matches("to ")
                .trim_matches('\'');
            clean.push(name.to_string());
        } else if let Some(rest) = line.strip_prefix("Applying patch ") {
            // "Applying patch rust/Makefile with 1 reject..."
            let name = rest
                .split(" with ")
                .next()
                .unwrap_or(rest)
                .trim_matches('\'');
            current = Some(name.to_string());
            rejects.push((name.to_string(), Vec::new()));
        } else if let Some(rest) = line.strip_prefix("Rejected hunk #") {
            let n = rest.trim_end_matches('.').parse().unwrap_or(0);
            if let (Some(_), Some(last)) = (&current, rejects.last_mut()) {
                last.1.push(n);
            }
        }
    }
    (clean, rejects)
}

/// Split a `.rej` file into its hunks: (header, full text).
pub fn split_rej(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.starts_with("@@") {
            out.push((line.to_string(), format!("{line}\n")));
        } else if let Some(last) = out.last_mut() {
            last.1.push_str(line);
            last.1.push('\n');
        }
    }
    out
}

/// Whether every line `hunk` adds is already in `file_text`, in order and
/// close together: at most as many other lines in between as the hunk adds
/// (an entry that grew a line upstream still counts). Context lines are
/// ignored: they are what moved.
pub fn added_lines_present(hunk: &str, file_text: &str) -> bool {
    let added: Vec<&str> = hunk
        .lines()
        .skip(1)
        .filter_map(|l| l.strip_prefix('+'))
        .collect();
    if added.is_empty() || added.iter().all(|l| l.trim().is_empty()) {
        return false;
    }
    let lines: Vec<&str> = file_text.lines().collect();
    let span = added.len() * 2;
    (0..lines.len())
        .filter(|&i| lines[i] == added[0])
        .any(|start| {
            let end = (start + span).min(lines.len());
            let mut want = added.iter();
            let mut next = want.next();
            for l in &lines[start..end] {
                if Some(l) == next {
                    next = want.next();
                }
            }
            next.is_none()
        })
}

/// Build the rejected-hunk list from the `.rej` files git left in `tree`.
pub fn collect_rejects(tree: &Path, rejects: &[(String, Vec<usize>)]) -> Result<Vec<RejectedHunk>> {
    let mut out = Vec::new();
    for (file, numbers) in rejects {
        let rel = Path::new(file);
        if rel.is_absolute() || rel.components().any(|c| c.as_os_str() == "..") {
            bail!("git reported a path outside the tree: {file}");
        }
        // Both files are in the tree the patch just changed: a patch can
        // create links, so neither is followed (a link reads as empty).
        let read = |rel: &Path| {
            crate::sandbox::safe_fs::read_in(tree, rel, 16 << 20)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let text = read(Path::new(&format!("{file}.rej")));
        let current = read(rel);
        for (i, (header, body)) in split_rej(&text).into_iter().enumerate() {
            let hunk = numbers.get(i).copied().unwrap_or(i + 1);
            let already_present = added_lines_present(&body, &current);
            out.push(RejectedHunk {
                file: file.clone(),
                hunk,
                header,
                text: body,
                already_present,
            });
        }
    }
    Ok(out)
}

/// The human text of a failed apply.
pub fn describe_failure(index: usize, rejected: &[RejectedHunk]) -> String {
    let mut s = format!("patch {index} does not apply:");
    for h in rejected {
        s.push_str(&format!(
            "\n  {} hunk #{} {}{}",
            h.file,
            h.hunk,
            h.header,
            if h.already_present {
                " (its added lines are already in the file)"
            } else {
                ""
            }
        ));
    }
    s
}

/// Where the scratch trees of one kernel version live.
#[derive(Debug, Clone)]
pub struct Trees {
    pub work: PathBuf,
    pub git: PathBuf,
}

impl Trees {
    pub fn new(root: &Path) -> Trees {
        Trees {
            work: root.join("linux"),
            git: root.join("git"),
        }
    }
}

/// Copy the pristine tree (keeping mtimes, so build trees made from it stay
/// valid) unless the copy exists.
pub fn copy_pristine(src: &Path, trees: &Trees) -> Result<bool> {
    if trees.git.join("HEAD").is_file() && trees.work.join("Makefile").is_file() {
        return Ok(false);
    }
    let parent = trees.work.parent().context("tree without parent")?;
    std::fs::create_dir_all(parent)?;
    let _ = std::fs::remove_dir_all(&trees.git);
    crate::kbuild::kernel::copy_tree(src, &trees.work)?;
    std::fs::create_dir_all(&trees.git)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_output_is_parsed_per_file_and_hunk() {
        let err = "Checking patch rust/.gitignore...\nChecking patch rust/Makefile...\nerror: while searching for:\nfoo\nerror: patch failed: rust/Makefile:15\nApplied patch rust/.gitignore cleanly.\nApplying patch rust/Makefile with 2 rejects...\nHunk #1 applied cleanly.\nRejected hunk #2.\nRejected hunk #3.\nApplying patch MAINTAINERS with 1 reject...\nRejected hunk #1.\n";
        let (clean, rej) = parse_reject_output(err);
        assert_eq!(clean, ["rust/.gitignore"]);
        assert_eq!(
            rej,
            [
                ("rust/Makefile".to_string(), vec![2, 3]),
                ("MAINTAINERS".to_string(), vec![1])
            ]
        );
    }

    #[test]
    fn rej_files_split_into_hunks() {
        let rej = "diff a/x b/x\t(rejected hunks)\n@@ -1,2 +1,3 @@\n a\n+b\n c\n@@ -10,1 +11,2 @@\n d\n+e\n";
        let h = split_rej(rej);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].0, "@@ -1,2 +1,3 @@");
        assert_eq!(h[1].1, "@@ -10,1 +11,2 @@\n d\n+e\n");
    }

    #[test]
    fn already_present_needs_all_added_lines_in_order() {
        let hunk = "@@ -1 +1,3 @@\n ctx\n+ETHERNET PHY LIBRARY [RUST]\n+M:\tX\n";
        assert!(added_lines_present(
            hunk,
            "a\nETHERNET PHY LIBRARY [RUST]\nM:\tX\nz\n"
        ));
        // One line more upstream between them still counts.
        assert!(added_lines_present(
            hunk,
            "ETHERNET PHY LIBRARY [RUST]\nz\nM:\tX\n"
        ));
        // Out of order, or too far apart, does not.
        assert!(!added_lines_present(
            hunk,
            "M:\tX\nETHERNET PHY LIBRARY [RUST]\n"
        ));
        assert!(!added_lines_present(
            hunk,
            "ETHERNET PHY LIBRARY [RUST]\n1\n2\n3\n4\nM:\tX\n"
        ));
        assert!(!added_lines_present("@@ -1 +1 @@\n-a\n", "a\n"));
    }

    #[test]
    fn rejects_outside_the_tree_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let err = collect_rejects(d.path(), &[("../etc/passwd".into(), vec![1])]).unwrap_err();
        assert!(err.to_string().contains("outside the tree"));
    }

    #[test]
    fn linked_rejects_and_targets_are_not_read() {
        let d = tempfile::tempdir().unwrap();
        let tree = d.path().join("t");
        std::fs::create_dir_all(&tree).unwrap();
        let secret = d.path().join("secret");
        std::fs::write(&secret, "@@ -1 +1 @@\n+runner password\n").unwrap();
        std::os::unix::fs::symlink(&secret, tree.join("MAINTAINERS.rej")).unwrap();
        let got = collect_rejects(&tree, &[("MAINTAINERS".into(), vec![1])]).unwrap();
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn failure_text_names_file_and_hunk() {
        let h = RejectedHunk {
            file: "rust/Makefile".into(),
            hunk: 1,
            header: "@@ -15,6 +15,7 @@".into(),
            text: String::new(),
            already_present: false,
        };
        assert_eq!(
            describe_failure(3, &[h]),
            "patch 3 does not apply:\n  rust/Makefile hunk #1 @@ -15,6 +15,7 @@"
        );
    }

    #[test]
    fn git_jobs_keep_the_git_dir_outside_the_tree() {
        let j = git_job(
            "img",
            Path::new("/t/linux"),
            Path::new("/t/git"),
            Path::new("/p"),
            &["am", "/patches/0001.patch"],
        );
        assert!(j.env.contains(&("GIT_DIR".into(), "/git".into())));
        assert!(j.env.contains(&("GIT_WORK_TREE".into(), "/src".into())));
        assert_eq!(j.argv, ["git", "am", "/patches/0001.patch"]);
    }
}
