//! Kernel config fragments: parsing (with file and line in every error), and
//! verification of a final `.config` against what the fragments asked for. An
//! option that did not stick is named together with its `depends on` line and
//! the current values of the symbols in it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum KconfigError {
    #[error("{file}:{line}: cannot parse `{text}`: expected CONFIG_NAME=value or `# CONFIG_NAME is not set`")]
    Syntax {
        file: PathBuf,
        line: usize,
        text: String,
    },
    #[error("cannot read {file}")]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}:{line}: CONFIG_{name} does not exist in this kernel (no `config {name}` in any Kconfig file): remove it from the fragment")]
    Unknown {
        file: PathBuf,
        line: usize,
        name: String,
    },
    #[error("{0}")]
    DidNotStick(Box<NotStuck>),
}

/// An option whose requested value is not in the final `.config`.
#[derive(Debug)]
pub struct NotStuck {
    pub file: PathBuf,
    pub line: usize,
    pub name: String,
    pub want: String,
    pub got: String,
    /// `: it depends on ...`, or empty.
    pub deps: String,
}

impl std::fmt::Display for NotStuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: CONFIG_{}={} did not stick (final .config has {}){}",
            self.file.display(),
            self.line,
            self.name,
            self.want,
            self.got,
            self.deps
        )
    }
}

/// One requested option, with where it was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub name: String,
    /// `y`, `m`, `n`, a number or a quoted string, as written.
    pub value: String,
    pub file: PathBuf,
    pub line: usize,
}

fn parse_line(text: &str) -> Option<Option<(String, String)>> {
    let t = text.trim();
    if t.is_empty() {
        return Some(None);
    }
    if let Some(rest) = t.strip_prefix('#') {
        let rest = rest.trim();
        if let Some(name) = rest
            .strip_prefix("CONFIG_")
            .and_then(|r| r.strip_suffix(" is not set"))
        {
            if is_symbol(name) {
                return Some(Some((name.to_string(), "n".to_string())));
            }
            return None;
        }
        return Some(None);
    }
    let (k, v) = t.split_once('=')?;
    let name = k.strip_prefix("CONFIG_")?;
    if !is_symbol(name) || v.is_empty() {
        return None;
    }
    let value_ok = v.starts_with('"') && v.ends_with('"') && v.len() >= 2
        || v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !value_ok {
        return None;
    }
    Some(Some((name.to_string(), v.to_string())))
}

fn is_symbol(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parse a fragment file. Later lines override earlier ones, as in Kconfig.
pub fn parse_fragment(file: &Path) -> Result<Vec<Request>, KconfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| KconfigError::Io {
        file: file.to_path_buf(),
        source,
    })?;
    parse_fragment_text(file, &text)
}

pub fn parse_fragment_text(file: &Path, text: &str) -> Result<Vec<Request>, KconfigError> {
    let mut out: Vec<Request> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        match parse_line(raw) {
            Some(None) => {}
            Some(Some((name, value))) => {
                out.retain(|r| r.name != name);
                out.push(Request {
                    name,
                    value,
                    file: file.to_path_buf(),
                    line: i + 1,
                });
            }
            None => {
                return Err(KconfigError::Syntax {
                    file: file.to_path_buf(),
                    line: i + 1,
                    text: raw.chars().take(120).collect(),
                })
            }
        }
    }
    Ok(out)
}

/// Requests from several fragments, merged as merge_config.sh does: a later
/// fragment's value for an option replaces an earlier one.
pub fn last_wins(requests: Vec<Request>) -> Vec<Request> {
    let mut out: Vec<Request> = Vec::new();
    for r in requests {
        out.retain(|o| o.name != r.name);
        out.push(r);
    }
    out
}

/// A fragment's requests as `-K` options (`CONFIG_X=VAL`, `CONFIG_X=n` for
/// "is not set"), in the fragment's order: what `phyfarm build
/// --kconfig-fragment` adds to its `-K` options.
pub fn as_options(requests: &[Request]) -> Vec<String> {
    requests
        .iter()
        .map(|r| format!("CONFIG_{}={}", r.name, r.value))
        .collect()
}

/// A final `.config`: symbol → value; unset symbols are absent.
pub fn parse_dotconfig(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| parse_line(l).flatten())
        .filter(|(_, v)| v != "n")
        .collect()
}

/// Where Kconfig symbols are defined and what they depend on.
pub trait KconfigIndex {
    /// `None` when no Kconfig file defines the symbol; otherwise its
    /// `depends on` expressions (possibly none).
    fn lookup(&self, name: &str) -> Option<Vec<String>>;
}

/// Scans the Kconfig files of a kernel source tree.
pub struct SourceTree {
    root: PathBuf,
}

impl SourceTree {
    pub fn new(root: &Path) -> Self {
        SourceTree {
            root: root.to_path_buf(),
        }
    }

    fn kconfig_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                let Ok(ft) = e.file_type() else { continue };
                let name = e.file_name();
                let name = name.to_string_lossy();
                if ft.is_dir() && !name.starts_with('.') && name != "Documentation" {
                    stack.push(p);
                } else if ft.is_file() && name.starts_with("Kconfig") {
                    out.push(p);
                }
            }
        }
        out
    }
}

impl KconfigIndex for SourceTree {
    fn lookup(&self, name: &str) -> Option<Vec<String>> {
        let mut found = false;
        let mut deps = Vec::new();
        for f in self.kconfig_files() {
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            if let Some(d) = kconfig_entry_deps(&text, name) {
                found = true;
                deps.extend(d);
            }
        }
        found.then_some(deps)
    }
}

/// The `depends on` lines of `config NAME` entries in one Kconfig file, or
/// `None` if the file does not define NAME.
pub fn kconfig_entry_deps(text: &str, name: &str) -> Option<Vec<String>> {
    let mut found = false;
    let mut deps = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        let mut words = t.split_whitespace();
        let first = words.next().unwrap_or("");
        if matches!(first, "config" | "menuconfig") {
            inside = words.next() == Some(name) && words.next().is_none();
            found |= inside;
            continue;
        }
        if matches!(
            first,
            "endmenu" | "menu" | "endif" | "if" | "choice" | "endchoice" | "source" | "comment"
        ) {
            inside = false;
        }
        if inside {
            if let Some(expr) = t.strip_prefix("depends on") {
                deps.push(expr.trim().to_string());
            }
        }
    }
    found.then_some(deps)
}

fn symbols_in(expr: &str) -> Vec<String> {
    let mut out: Vec<String> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty() && w.chars().any(|c| c.is_ascii_uppercase()))
        .filter(|w| !w.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_string)
        .collect();
    out.dedup();
    out
}

/// Check every request against the final `.config`. The first option that did
/// not stick is returned as an error naming the fragment line and, from the
/// Kconfig index, whether the option exists and what it depends on.
pub fn verify(
    requests: &[Request],
    config: &BTreeMap<String, String>,
    index: &dyn KconfigIndex,
) -> Result<(), KconfigError> {
    for r in requests {
        let got = config.get(&r.name).map(String::as_str).unwrap_or("n");
        if got == r.value {
            continue;
        }
        let Some(deps) = index.lookup(&r.name) else {
            return Err(KconfigError::Unknown {
                file: r.file.clone(),
                line: r.line,
                name: r.name.clone(),
            });
        };
        let mut text = String::new();
        if !deps.is_empty() {
            let expr = deps.join(" && ");
            let values: Vec<String> = symbols_in(&expr)
                .iter()
                .map(|s| format!("{s}={}", config.get(s).map(String::as_str).unwrap_or("n")))
                .collect();
            text = format!(": it depends on {expr} ({})", values.join(", "));
            if r.name == "RUST" && !config.contains_key("RUST_IS_AVAILABLE") {
                text.push_str(
                    "; `make rustavailable` in the build environment says why Rust is unavailable",
                );
            }
        }
        return Err(KconfigError::DidNotStick(Box::new(NotStuck {
            file: r.file.clone(),
            line: r.line,
            name: r.name.clone(),
            want: r.value.clone(),
            got: got.to_string(),
            deps: text,
        })));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(BTreeMap<&'static str, Vec<String>>);
    impl KconfigIndex for Fake {
        fn lookup(&self, name: &str) -> Option<Vec<String>> {
            self.0.get(name).cloned()
        }
    }

    fn fake() -> Fake {
        Fake(BTreeMap::from([
            (
                "RUST",
                vec!["HAVE_RUST".to_string(), "RUST_IS_AVAILABLE".to_string()],
            ),
            (
                "AX88796B_RUST_PHY",
                vec!["RUST_PHYLIB_ABSTRACTIONS && AX88796B_PHY".to_string()],
            ),
            ("AX88796B_PHY", vec![]),
        ]))
    }

    #[test]
    fn fragment_parses_set_unset_and_comments() {
        let f = parse_fragment_text(
            Path::new("x.config"),
            "# comment\n\nCONFIG_A=y\n# CONFIG_B is not set\nCONFIG_S=\"hi there\"\nCONFIG_N=0x10\nCONFIG_A=m\n",
        )
        .unwrap();
        let got: Vec<(&str, &str, usize)> = f
            .iter()
            .map(|r| (r.name.as_str(), r.value.as_str(), r.line))
            .collect();
        assert_eq!(
            got,
            [
                ("B", "n", 4),
                ("S", "\"hi there\"", 5),
                ("N", "0x10", 6),
                ("A", "m", 7)
            ]
        );
    }

    #[test]
    fn fragment_syntax_error_names_file_and_line() {
        let err = parse_fragment_text(Path::new("frag.config"), "CONFIG_A=y\nAX=y\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "frag.config:2: cannot parse `AX=y`: expected CONFIG_NAME=value or `# CONFIG_NAME is not set`"
        );
        assert!(parse_fragment_text(Path::new("f"), "CONFIG_A=y z\n").is_err());
        assert!(parse_fragment_text(Path::new("f"), "CONFIG_=y\n").is_err());
    }

    #[test]
    fn verify_accepts_matching_config() {
        let req = parse_fragment_text(
            Path::new("f"),
            "CONFIG_AX88796B_PHY=y\n# CONFIG_MODVERSIONS is not set\n",
        )
        .unwrap();
        let cfg = parse_dotconfig("CONFIG_AX88796B_PHY=y\n# CONFIG_MODVERSIONS is not set\n");
        verify(&req, &cfg, &fake()).unwrap();
    }

    #[test]
    fn verify_names_unmet_dependency() {
        let req =
            parse_fragment_text(Path::new("rust.config"), "CONFIG_AX88796B_RUST_PHY=y\n").unwrap();
        let cfg = parse_dotconfig("CONFIG_RUST_PHYLIB_ABSTRACTIONS=y\n");
        let err = verify(&req, &cfg, &fake()).unwrap_err().to_string();
        assert_eq!(
            err,
            "rust.config:1: CONFIG_AX88796B_RUST_PHY=y did not stick (final .config has n): it depends on RUST_PHYLIB_ABSTRACTIONS && AX88796B_PHY (RUST_PHYLIB_ABSTRACTIONS=y, AX88796B_PHY=n)"
        );
    }

    #[test]
    fn verify_names_unknown_option() {
        let req = parse_fragment_text(Path::new("f.config"), "\nCONFIG_NO_SUCH_THING=y\n").unwrap();
        let err = verify(&req, &BTreeMap::new(), &fake()).unwrap_err();
        assert!(matches!(err, KconfigError::Unknown { line: 2, .. }));
        assert!(
            err.to_string()
                .contains("CONFIG_NO_SUCH_THING does not exist"),
            "{err}"
        );
    }

    #[test]
    fn rust_unavailable_gets_a_hint() {
        let req = parse_fragment_text(Path::new("f"), "CONFIG_RUST=y\n").unwrap();
        let err = verify(&req, &parse_dotconfig("CONFIG_HAVE_RUST=y\n"), &fake())
            .unwrap_err()
            .to_string();
        assert!(err.contains("RUST_IS_AVAILABLE=n"), "{err}");
        assert!(err.contains("make rustavailable"), "{err}");
    }

    #[test]
    fn later_fragments_win() {
        let mut r = parse_fragment_text(Path::new("a"), "CONFIG_A=y\nCONFIG_B=y\n").unwrap();
        r.extend(parse_fragment_text(Path::new("b"), "# CONFIG_A is not set\n").unwrap());
        let r = last_wins(r);
        assert_eq!(r.len(), 2);
        assert_eq!((r[1].name.as_str(), r[1].value.as_str()), ("A", "n"));
        assert_eq!(r[1].file, Path::new("b"));
    }

    #[test]
    fn kconfig_entry_deps_finds_only_the_named_entry() {
        let text = "config FOO\n\tbool \"foo\"\n\tdepends on BAR\n\nconfig FOOBAR\n\tdepends on BAZ\nmenu \"x\"\n\tdepends on QUX\n";
        assert_eq!(
            kconfig_entry_deps(text, "FOO"),
            Some(vec!["BAR".to_string()])
        );
        assert_eq!(
            kconfig_entry_deps(text, "FOOBAR"),
            Some(vec!["BAZ".to_string()])
        );
        assert_eq!(kconfig_entry_deps(text, "NOPE"), None);
    }

    #[test]
    fn a_fragment_becomes_k_options() {
        let text = "# comment\nCONFIG_A=y\n# CONFIG_B is not set\n\nCONFIG_C=\"x y\"\nCONFIG_A=m\n";
        let reqs = parse_fragment_text(Path::new("f.config"), text).unwrap();
        assert_eq!(
            as_options(&reqs),
            ["CONFIG_B=n", "CONFIG_C=\"x y\"", "CONFIG_A=m"]
        );
    }

    #[test]
    fn the_exporter_fragment_gives_the_gadget_stack() {
        let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("../qemu-farm/guest/exporter.config");
        let opts = as_options(&parse_fragment(&f).unwrap());
        // Nothing in the exporter may claim the adapter before usbredirect does.
        for want in [
            "CONFIG_USB_DUMMY_HCD=y",
            "CONFIG_USB_CONFIGFS_F_FS=y",
            "CONFIG_USB_NET_AX8817X=n",
        ] {
            assert!(opts.iter().any(|o| o == want), "{want} not in {opts:?}");
        }
    }

    #[test]
    fn repository_fragments_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kconfig");
        for f in ["phyfarm.config", "variant-rust.config", "variant-c.config"] {
            let reqs = parse_fragment(&dir.join(f)).unwrap();
            assert!(!reqs.is_empty(), "{f} is empty");
        }
    }
}
