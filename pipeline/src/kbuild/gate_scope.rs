//! Which Rust gates a revision can affect.
//!
//! kbuild records, for every object, the files it was built from (the
//! `deps_…` list of its `.cmd` file). Read from the base build of the rust
//! variant, those lists say which source files the Rust code depends on: the
//! `rust/` crates (including every header bindgen read for the bindings) and
//! each Rust driver object. A gate whose inputs the series does not touch
//! would see exactly the base's inputs, so it is skipped with that reason
//! (a SKIP, never counted as a pass). Anything that can change the kernel
//! configuration or the build rules (Kconfig, Makefile, Kbuild, scripts/)
//! runs every gate, and so does a base whose records cannot be read.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

/// Largest `.cmd` file read; bindgen's dependency list is about 60 KiB.
const MAX_CMD_BYTES: u64 = 4 << 20;

/// The source files the base's Rust code was built from, tree-relative.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RustDeps {
    /// Files the `rust/` crates were built from: what rustdoc documents and
    /// the enum check reads.
    pub crates: BTreeSet<String>,
    /// Files any Rust object was built from (the crates and the drivers):
    /// what clippy lints.
    pub objects: BTreeSet<String>,
}

impl RustDeps {
    /// Read the `.cmd` files of a finished build tree. The tree is walked
    /// without following links.
    pub fn read(build: &Path) -> Result<RustDeps> {
        let mut deps = RustDeps::default();
        let mut stack = vec![build.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let entries =
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
            for e in entries {
                let e = e?;
                let kind = e.file_type()?;
                let name = e.file_name();
                let name = name.to_string_lossy();
                if kind.is_dir() {
                    stack.push(e.path());
                    continue;
                }
                if !(kind.is_file() && name.starts_with('.') && name.ends_with(".cmd")) {
                    continue;
                }
                let rel = e.path();
                let rel = rel.strip_prefix(build).unwrap_or(&rel);
                let in_rust = rel.starts_with("rust");
                let mut text = String::new();
                use std::io::Read;
                std::fs::File::open(e.path())?
                    .take(MAX_CMD_BYTES)
                    .read_to_string(&mut text)
                    .map_err(|err| anyhow::anyhow!("{}: {err}", e.path().display()))?;
                if !in_rust && !is_rust_object(&text) {
                    continue;
                }
                for f in sources(&text) {
                    if in_rust {
                        deps.crates.insert(f.clone());
                    }
                    deps.objects.insert(f);
                }
            }
        }
        Ok(deps)
    }
}

/// The saved command compiles Rust (as rustc, or clippy-driver in a clippy
/// build).
fn is_rust_object(cmd: &str) -> bool {
    cmd.lines()
        .find(|l| l.starts_with("savedcmd_"))
        .is_some_and(|l| {
            l.split_whitespace()
                .any(|w| w == "rustc" || w == "clippy-driver")
        })
}

/// The source-tree files a `.cmd` file names: its `source_…` and the
/// `/src/…` entries of its `deps_…` list. Generated files (`/build/…`),
/// toolchain files and `$(wildcard …)` configuration entries are left out.
fn sources(cmd: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in cmd.lines() {
        let words: Vec<&str> = if line.starts_with("source_") || line.starts_with("deps_") {
            in_deps = line.starts_with("deps_");
            line.split_once(":=")
                .map(|(_, r)| r.split_whitespace().collect())
                .unwrap_or_default()
        } else if in_deps {
            line.split_whitespace().collect()
        } else {
            continue;
        };
        if in_deps && !line.trim_end().ends_with('\\') {
            in_deps = false;
        }
        for w in words {
            if let Some(rel) = w.strip_prefix("/src/") {
                if !rel.is_empty() {
                    out.push(rel.to_string());
                }
            }
        }
    }
    out
}

/// A file that can change the configuration or the build rules of every
/// object.
fn is_build_rule(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.starts_with("scripts/")
        || name.starts_with("Kconfig")
        || name.starts_with("Makefile")
        || name.starts_with("Kbuild")
        || name.ends_with(".mk")
        || (!path.contains('/') && name.starts_with('.'))
}

/// Whether one gate runs, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scope {
    pub gate: String,
    pub runs: bool,
    /// Why: the first touched file that makes the gate run, or why it is
    /// skipped.
    pub reason: String,
}

/// Decide each of `gates` for a series touching `touched` (tree-relative
/// paths). `deps` is None when the base's records could not be read: then
/// every gate runs.
pub fn decide(gates: &[&str], touched: &[String], deps: Option<&RustDeps>) -> Vec<Scope> {
    gates
        .iter()
        .map(|g| {
            let (runs, reason) = decide_one(g, touched, deps);
            Scope {
                gate: g.to_string(),
                runs,
                reason,
            }
        })
        .collect()
}

fn decide_one(gate: &str, touched: &[String], deps: Option<&RustDeps>) -> (bool, String) {
    let Some(deps) = deps else {
        return (
            true,
            "the base build's dependency records could not be read".into(),
        );
    };
    if let Some(f) = touched.iter().find(|f| is_build_rule(f)) {
        return (true, format!("the series changes a build rule: {f}"));
    }
    match gate {
        // The crates: every file under rust/ and whatever they were built
        // from (headers bindgen read, C helpers).
        "enum-check" | "rustdoc" => {
            let hit = touched
                .iter()
                .find(|f| f.starts_with("rust/") || deps.crates.contains(*f));
            match hit {
                Some(f) => (true, format!("the series changes {f}")),
                None => (
                    false,
                    "the series changes nothing the rust/ crates are built from \
                     (no file under rust/, no header bindgen reads)"
                        .into(),
                ),
            }
        }
        // Formatting: the Rust source files themselves.
        "rustfmtcheck" => match touched.iter().find(|f| f.ends_with(".rs")) {
            Some(f) => (true, format!("the series changes {f}")),
            None => (false, "the series changes no Rust file".into()),
        },
        // Every Rust object: any .rs file (a new one too), and the crates'
        // and drivers' inputs.
        "clippy" => {
            let hit = touched.iter().find(|f| {
                f.ends_with(".rs") || f.starts_with("rust/") || deps.objects.contains(*f)
            });
            match hit {
                Some(f) => (true, format!("the series changes {f}")),
                None => (
                    false,
                    "the series changes no Rust file and nothing a Rust object is built from"
                        .into(),
                ),
            }
        }
        _ => (true, "a gate without a known scope always runs".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of a kbuild `.cmd` file, as the base build writes it.
    const BINDINGS_CMD: &str = "savedcmd_rust/bindings/bindings_generated.rs := bindgen /src/rust/bindings/bindings_helper.h --use-core -o rust/bindings/bindings_generated.rs\n\
\n\
source_rust/bindings/bindings_generated.rs := /src/rust/bindings/bindings_helper.h\n\
\n\
deps_rust/bindings/bindings_generated.rs := \\\n\
  /src/include/linux/compiler-version.h \\\n\
    $(wildcard include/config/CC_VERSION_TEXT) \\\n\
  /src/include/linux/phy.h \\\n\
  /build/include/generated/autoconf.h \\\n\
  /src/include/net/eee.h \\\n\
\n\
rust/bindings/bindings_generated.rs: $(deps_rust/bindings/bindings_generated.rs)\n\
\n\
$(deps_rust/bindings/bindings_generated.rs):\n";

    #[test]
    fn a_cmd_file_yields_its_source_and_source_tree_deps_only() {
        assert_eq!(
            sources(BINDINGS_CMD),
            [
                "rust/bindings/bindings_helper.h",
                "include/linux/compiler-version.h",
                "include/linux/phy.h",
                "include/net/eee.h",
            ]
        );
        assert!(!is_rust_object(BINDINGS_CMD));
        assert!(is_rust_object(
            "savedcmd_drivers/net/phy/x.o := OBJTREE=/build rustc --edition=2021 x.rs\n"
        ));
        assert!(is_rust_object(
            "savedcmd_drivers/net/phy/x.o := OBJTREE=/build clippy-driver --edition=2021\n"
        ));
        assert!(!is_rust_object(
            "savedcmd_drivers/net/phy/x.o := gcc -c x.c\n"
        ));
    }

    #[test]
    fn a_build_tree_is_read_by_directory_and_by_compiler() {
        let d = tempfile::tempdir().unwrap();
        let w = |rel: &str, text: &str| {
            let p = d.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w("rust/bindings/.bindings_generated.rs.cmd", BINDINGS_CMD);
        w(
            "drivers/net/phy/.ax88796b_rust.o.cmd",
            "savedcmd_drivers/net/phy/ax88796b_rust.o := rustc x\n\
             source_drivers/net/phy/ax88796b_rust.o := /src/drivers/net/phy/ax88796b_rust.rs\n\
             deps_drivers/net/phy/ax88796b_rust.o := \\\n  /build/rust/libkernel.rmeta \\\n\n",
        );
        w(
            "drivers/net/phy/.ax88796b.o.cmd",
            "savedcmd_drivers/net/phy/ax88796b.o := gcc -c\n\
             source_drivers/net/phy/ax88796b.o := /src/drivers/net/phy/ax88796b.c\n\
             deps_drivers/net/phy/ax88796b.o := \\\n  /src/include/linux/mii.h \\\n\n",
        );
        // Only kbuild's hidden `.*.cmd` files are records; anything else
        // that looks like one is not read.
        let stray = "savedcmd_x := rustc x\nsource_x := /src/include/linux/stray.h\n";
        w("rust/kernel.cmd", stray);
        w("rust/.kernel.o.d", stray);
        w("drivers/net/phy/notes.txt", stray);
        let deps = RustDeps::read(d.path()).unwrap();
        assert!(!deps.objects.contains("include/linux/stray.h"));
        assert!(deps.crates.contains("include/linux/phy.h"));
        assert!(!deps.crates.contains("drivers/net/phy/ax88796b_rust.rs"));
        assert!(deps.objects.contains("drivers/net/phy/ax88796b_rust.rs"));
        assert!(deps.objects.contains("include/linux/phy.h"));
        // A C object's inputs are not Rust's.
        assert!(!deps.objects.contains("include/linux/mii.h"));
        assert!(!deps.objects.contains("drivers/net/phy/ax88796b.c"));
    }

    fn deps() -> RustDeps {
        RustDeps {
            crates: ["rust/kernel/net/phy.rs", "include/linux/phy.h"]
                .map(String::from)
                .into(),
            objects: [
                "rust/kernel/net/phy.rs",
                "include/linux/phy.h",
                "drivers/net/phy/ax88796b_rust.rs",
            ]
            .map(String::from)
            .into(),
        }
    }

    fn runs(touched: &[&str], d: Option<&RustDeps>) -> Vec<(String, bool)> {
        let t: Vec<String> = touched.iter().map(|s| s.to_string()).collect();
        decide(&["rustfmtcheck", "enum-check", "rustdoc", "clippy"], &t, d)
            .into_iter()
            .map(|s| (s.gate, s.runs))
            .collect()
    }

    fn all(b: [bool; 4]) -> Vec<(String, bool)> {
        ["rustfmtcheck", "enum-check", "rustdoc", "clippy"]
            .iter()
            .zip(b)
            .map(|(g, r)| (g.to_string(), r))
            .collect()
    }

    #[test]
    fn each_gate_runs_only_on_what_the_series_can_affect() {
        let d = deps();
        // A driver change: linted and format-checked, not documented.
        assert_eq!(
            runs(&["drivers/net/phy/ax88796b_rust.rs"], Some(&d)),
            all([true, false, false, true])
        );
        // The abstractions, or a header bindgen reads: everything.
        assert_eq!(runs(&["rust/kernel/net/phy.rs"], Some(&d)), all([true; 4]));
        assert_eq!(
            runs(&["include/linux/phy.h"], Some(&d)),
            all([false, true, true, true])
        );
        // A new Rust file nobody was built from yet.
        assert_eq!(
            runs(&["drivers/net/phy/new_rust.rs"], Some(&d)),
            all([true, false, false, true])
        );
        // C only, and a header no Rust code reads: nothing.
        assert_eq!(
            runs(
                &[
                    "drivers/net/phy/ax88796b.c",
                    "include/linux/mii.h",
                    "MAINTAINERS"
                ],
                Some(&d)
            ),
            all([false; 4])
        );
        // Build rules and unreadable records: everything.
        for rule in [
            "drivers/net/phy/Kconfig",
            "drivers/net/phy/Makefile",
            "arch/x86/Kbuild",
            "tools/build/feature.mk",
            "scripts/Makefile.build",
            ".clippy.toml",
        ] {
            assert_eq!(runs(&[rule], Some(&d)), all([true; 4]), "{rule}");
        }
        assert_eq!(runs(&["drivers/net/phy/ax88796b.c"], None), all([true; 4]));
    }

    #[test]
    fn the_reason_names_the_file_or_says_what_was_not_touched() {
        let d = deps();
        let t = vec!["MAINTAINERS".to_string(), "include/linux/phy.h".to_string()];
        let s = decide(&["rustdoc"], &t, Some(&d));
        assert_eq!(s[0].reason, "the series changes include/linux/phy.h");
        let s = decide(&["clippy"], &["MAINTAINERS".to_string()], Some(&d));
        assert!(!s[0].runs);
        assert!(s[0].reason.contains("no Rust file"), "{}", s[0].reason);
    }
}
