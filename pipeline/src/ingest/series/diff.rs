//! The diff part of a patch: which files it touches, whether it is binary,
//! and whether its hunks are whole. Paths are data: quoted names with C-style
//! escapes are decoded the way git writes them, and nothing here ever hands a
//! name to a shell.

use super::mail::{chomp, lines};

/// What the diff of one patch contains.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DiffSummary {
    /// Paths relative to the tree, in order of appearance, each once.
    pub files: Vec<String>,
    pub binary: bool,
}

/// Why a diff was refused; `line` is relative to the start of the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DiffProblem {
    /// The hunks do not add up (a bad header, a truncated body).
    Corrupt { line: usize, reason: String },
    /// A path leaves the tree (`..`, absolute).
    Outside { line: usize, path: String },
}

/// Decode a git C-quoted name (`"a/x\tb\303\251"`). Returns the name and the
/// rest of the input after the closing quote.
pub(crate) fn unquote_c(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let bytes = body.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let rest = &body[i + 1..];
                return Some((String::from_utf8_lossy(&out).into_owned(), rest));
            }
            b'\\' => {
                let c = *bytes.get(i + 1)?;
                let simple = match c {
                    b'a' => Some(7),
                    b'b' => Some(8),
                    b't' => Some(b'\t'),
                    b'n' => Some(b'\n'),
                    b'v' => Some(11),
                    b'f' => Some(12),
                    b'r' => Some(b'\r'),
                    b'"' => Some(b'"'),
                    b'\\' => Some(b'\\'),
                    _ => None,
                };
                if let Some(b) = simple {
                    out.push(b);
                    i += 2;
                } else if (b'0'..=b'3').contains(&c) {
                    let oct = bytes.get(i + 1..i + 4)?;
                    if !oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                        return None;
                    }
                    out.push((oct[0] - b'0') * 64 + (oct[1] - b'0') * 8 + (oct[2] - b'0'));
                    i += 4;
                } else {
                    return None;
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

/// A name on a `---`/`+++` line: quoted, or up to a tab (GNU diff puts a
/// timestamp after it).
fn side_name(s: &str) -> Option<String> {
    if s.starts_with('"') {
        return unquote_c(s).map(|(n, _)| n);
    }
    let name = s.split('\t').next().unwrap_or("").trim_end_matches('\r');
    if name.is_empty() {
        None
    } else {
        Some(name.to_string())
    }
}

/// Drop the first path component, as `git apply -p1` does.
fn strip_p1(name: &str) -> String {
    match name.split_once('/') {
        Some((_, rest)) => rest.to_string(),
        None => name.to_string(),
    }
}

/// The two names of `diff --git a/X b/Y`.
fn git_header_names(rest: &str) -> Vec<String> {
    if rest.starts_with('"') {
        let Some((a, tail)) = unquote_c(rest) else {
            return Vec::new();
        };
        let tail = tail.trim_start();
        let b = if tail.starts_with('"') {
            unquote_c(tail).map(|(b, _)| b)
        } else {
            Some(tail.to_string())
        };
        return [Some(a), b].into_iter().flatten().collect();
    }
    // Unquoted: "a/NAME b/NAME" with the same name is split in the middle,
    // which is right even when NAME has spaces.
    let len = rest.len();
    if len % 2 == 1 && rest.is_char_boundary(len / 2) && rest.is_char_boundary(len / 2 + 1) {
        let (a, b) = (&rest[..len / 2], &rest[len / 2 + 1..]);
        if rest.as_bytes()[len / 2] == b' ' && strip_p1(a) == strip_p1(b) {
            return vec![a.to_string(), b.to_string()];
        }
    }
    if let Some(i) = rest.find(" \"") {
        let b = unquote_c(&rest[i + 1..]).map(|(b, _)| b);
        return [Some(rest[..i].to_string()), b]
            .into_iter()
            .flatten()
            .collect();
    }
    match rest.find(" b/") {
        Some(i) => vec![rest[..i].to_string(), rest[i + 1..].to_string()],
        None => vec![rest.to_string()],
    }
}

/// A tree-relative path is safe when it is not absolute and has no `..`.
fn is_outside(path: &str) -> bool {
    path.is_empty()
        || path.starts_with('/')
        || path.starts_with('\\')
        || path.split('/').any(|c| c == "..")
}

#[derive(Default)]
struct Collector {
    files: Vec<String>,
}

impl Collector {
    fn add(&mut self, line: usize, path: &str) -> Result<(), DiffProblem> {
        if is_outside(path) {
            return Err(DiffProblem::Outside {
                line,
                path: path.to_string(),
            });
        }
        if !self.files.iter().any(|f| f == path) {
            self.files.push(path.to_string());
        }
        Ok(())
    }
}

/// Parse `@@ -a[,b] +c[,d] @@`; returns the old and new line counts.
fn hunk_counts(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("@@ -")?;
    let (old, rest) = rest.split_once(" +")?;
    let (new, _) = rest.split_once(" @@")?;
    let count = |range: &str| -> Option<u64> {
        let mut it = range.splitn(2, ',');
        let start = it.next()?;
        if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        match it.next() {
            Some(c) if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) => c.parse().ok(),
            Some(_) => None,
            None => Some(1),
        }
    };
    Some((count(old)?, count(new)?))
}

/// Where the diff starts: the first `diff --git`, or a `---` line directly
/// followed by `+++` (a plain unified diff). `None` if the body has no diff.
pub(crate) fn find_start(body: &[u8]) -> Option<usize> {
    let all: Vec<&[u8]> = lines(body).collect();
    for (i, l) in all.iter().enumerate() {
        if l.starts_with(b"diff --git ") {
            return Some(i);
        }
        if l.starts_with(b"--- ") && all.get(i + 1).is_some_and(|n| n.starts_with(b"+++ ")) {
            return Some(i);
        }
    }
    None
}

// Long: one pass over the diff's lines, a state machine whose states share the loop's locals.
/// Check and summarise the diff in `body`, which starts at line `start`
/// (0-based, relative to the body).
pub(crate) fn parse(body: &[u8], start: usize) -> Result<DiffSummary, DiffProblem> {
    let all: Vec<String> = lines(body)
        .map(|l| String::from_utf8_lossy(chomp(l)).into_owned())
        .collect();
    let mut files = Collector::default();
    let mut binary = false;
    let mut i = start;
    // Whether the current file section has a ---/+++ pair waiting for hunks.
    let mut want_hunk: Option<usize> = None;
    while i < all.len() {
        let line = &all[i];
        let lineno = i;
        if let Some(rest) = line.strip_prefix("diff --git ") {
            if let Some(at) = want_hunk.take() {
                return Err(corrupt(at, "file header without any hunk"));
            }
            let names = git_header_names(rest);
            if names.is_empty() {
                return Err(corrupt(lineno, "unreadable file names in diff header"));
            }
            for n in names {
                if n.starts_with('/') {
                    return Err(DiffProblem::Outside {
                        line: lineno,
                        path: n,
                    });
                }
                files.add(lineno, &strip_p1(&n))?;
            }
        } else if let Some(rest) = line.strip_prefix("--- ") {
            let Some(next) = all.get(i + 1).and_then(|n| n.strip_prefix("+++ ")) else {
                return Err(corrupt(lineno, "'---' line not followed by '+++'"));
            };
            for side in [rest, next] {
                let name = side_name(side)
                    .ok_or_else(|| corrupt(lineno, "'---'/'+++' line without a file name"))?;
                if name == "/dev/null" {
                    continue;
                }
                if is_outside(&name) {
                    return Err(DiffProblem::Outside {
                        line: lineno,
                        path: name,
                    });
                }
                files.add(lineno, &strip_p1(&name))?;
            }
            want_hunk = Some(lineno);
            i += 1;
        } else if let Some(path) = ["rename from ", "rename to ", "copy from ", "copy to "]
            .iter()
            .find_map(|p| line.strip_prefix(p))
        {
            let name = if path.starts_with('"') {
                unquote_c(path).map(|(n, _)| n).unwrap_or_default()
            } else {
                path.to_string()
            };
            files.add(lineno, &name)?;
        } else if line.starts_with("GIT binary patch") || line.starts_with("Binary files ") {
            binary = true;
            want_hunk = None;
        } else if line.starts_with("@@ ") {
            let (mut old, mut new) = hunk_counts(line)
                .ok_or_else(|| corrupt(lineno, &format!("bad hunk header {line:?}")))?;
            want_hunk = None;
            let header = line.clone();
            let mut j = i + 1;
            while old > 0 || new > 0 {
                let Some(body_line) = all.get(j) else {
                    return Err(corrupt(
                        lineno,
                        &format!(
                            "truncated: hunk {header} ends early, {old} old and {new} new lines missing"
                        ),
                    ));
                };
                match body_line.as_bytes().first() {
                    Some(b' ') | None => {
                        if old == 0 || new == 0 {
                            return Err(hunk_mismatch(lineno, &header, j));
                        }
                        old -= 1;
                        new -= 1;
                    }
                    Some(b'-') if old > 0 => old -= 1,
                    Some(b'+') if new > 0 => new -= 1,
                    Some(b'\\') => {}
                    _ => return Err(hunk_mismatch(lineno, &header, j)),
                }
                j += 1;
            }
            // A body line right after the counted ones means the header lied.
            while let Some(next) = all.get(j) {
                if next.starts_with('\\') {
                    j += 1;
                    continue;
                }
                let extra = next.starts_with('+')
                    || (next.starts_with('-') && next != "-- " && !next.starts_with("--- "))
                    || next.starts_with(' ');
                if extra {
                    return Err(hunk_mismatch(lineno, &header, j));
                }
                break;
            }
            i = j;
            continue;
        } else if line == "-- " {
            // The signature delimiter ends the patch.
            break;
        }
        i += 1;
    }
    if let Some(at) = want_hunk {
        return Err(corrupt(at, "truncated: file header without any hunk"));
    }
    Ok(DiffSummary {
        files: files.files,
        binary,
    })
}

fn corrupt(line: usize, reason: &str) -> DiffProblem {
    DiffProblem::Corrupt {
        line,
        reason: reason.to_string(),
    }
}

fn hunk_mismatch(header_line: usize, header: &str, at: usize) -> DiffProblem {
    DiffProblem::Corrupt {
        line: header_line,
        reason: format!(
            "hunk {header} line counts do not match its body (body line {} relative to the hunk)",
            at - header_line
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_names_decode() {
        let (n, rest) = unquote_c(r#""a/x y\t\"z\303\251" tail"#).expect("quoted");
        assert_eq!(n, "a/x y\t\"zé");
        assert_eq!(rest, " tail");
        assert!(unquote_c(r#""unterminated"#).is_none());
    }

    #[test]
    fn names_with_spaces_and_metacharacters() {
        let body = b"diff --git a/dir/x y;$(rm) b/dir/x y;$(rm)\n\
new file mode 100644\n--- /dev/null\n+++ b/dir/x y;$(rm)\n@@ -0,0 +1 @@\n+hi\n";
        let s = parse(body, 0).expect("diff");
        assert_eq!(s.files, vec!["dir/x y;$(rm)".to_string()]);
        let body = b"diff --git \"a/t\\tb\" \"b/t\\tb\"\n--- \"a/t\\tb\"\n+++ \"b/t\\tb\"\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(
            parse(body, 0).expect("diff").files,
            vec!["t\tb".to_string()]
        );
    }

    #[test]
    fn hunk_counts_checked() {
        let ok = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n-- \n2.47\n";
        assert!(parse(ok, 0).is_ok());
        let short = b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n-- \n";
        assert!(matches!(
            parse(short, 0),
            Err(DiffProblem::Corrupt { line: 2, .. })
        ));
        let long = b"--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n-b\n+c\n+d\n";
        assert!(matches!(parse(long, 0), Err(DiffProblem::Corrupt { .. })));
    }

    #[test]
    fn escapes_refused() {
        let up = b"diff --git a/../etc/x b/../etc/x\n";
        assert!(matches!(parse(up, 0), Err(DiffProblem::Outside { .. })));
        let abs = b"--- /dev/null\n+++ /etc/passwd\n@@ -0,0 +1 @@\n+x\n";
        assert!(matches!(parse(abs, 0), Err(DiffProblem::Outside { .. })));
        let abs2 = b"--- a//etc/passwd\n+++ b//etc/passwd\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(matches!(parse(abs2, 0), Err(DiffProblem::Outside { .. })));
    }
}
