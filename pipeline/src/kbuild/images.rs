//! The container images: a Debian trixie minbase made locally with mmdebstrap
//! (no registry is ever contacted), and the `kbuild` and `farm` images built
//! on top of it from the Containerfiles in `containers/`. Each image's tag
//! carries a hash of its inputs, so an image is rebuilt only when they change.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::config::Paths;
use crate::jsonfile::{read_json, write_json_atomic};
use crate::progress::{self, info};
use crate::sandbox::runtime::{podman_env, shell_quote, ulimit_args};

/// The Debian suite every image is made from.
pub const SUITE: &str = "trixie";
/// The source package of the kernel under test.
pub const LINUX_SOURCE_PACKAGE: &str = "linux-source-6.12";
/// Bump when the way the base image is made changes.
const BASE_RECIPE: &str = "mmdebstrap --variant=minbase trixie; recipe 1";

#[derive(Debug, Error)]
pub enum ImageError {
    #[error("podman is not installed: run `bash containers/host-setup.sh` (or `apt-get install podman runc`), or use --runtime host")]
    NoPodman,
    #[error("mmdebstrap is not installed: run `bash containers/host-setup.sh` (or `apt-get install mmdebstrap`)")]
    NoMmdebstrap,
    #[error("cannot reach the Debian package mirror while building the {kind} image ({hint}); check the network and /etc/apt/sources.list, then retry. Full log: {log}")]
    Mirror {
        kind: &'static str,
        hint: String,
        log: PathBuf,
    },
    #[error("building the {kind} image failed ({last}). Full log: {log}")]
    Build {
        kind: &'static str,
        last: String,
        log: PathBuf,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImageKind {
    /// Debian trixie minbase, from mmdebstrap.
    Base,
    /// Kernel source package and the Rust-enabled toolchain.
    Kbuild,
    /// QEMU, guest user space and the Python test tools.
    Farm,
}

impl ImageKind {
    pub fn name(self) -> &'static str {
        match self {
            ImageKind::Base => "base",
            ImageKind::Kbuild => "kbuild",
            ImageKind::Farm => "farm",
        }
    }
}

/// What is known about a built image; cached in `<cache>/images/`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageInfo {
    pub kind: String,
    pub tag: String,
    pub id: String,
    pub size_bytes: u64,
    /// Debian package versions installed in the image (those that matter).
    pub packages: BTreeMap<String, String>,
    /// `--version` lines of the tools.
    pub tools: BTreeMap<String, String>,
    pub build_seconds: Option<f64>,
}

fn hash_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize()[..6])
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `PHYFARM_LINUX_SOURCE_VERSION` pins the kernel source package version.
pub fn source_pin() -> String {
    std::env::var("PHYFARM_LINUX_SOURCE_VERSION").unwrap_or_default()
}

fn containerfile(paths: &Paths, kind: ImageKind) -> PathBuf {
    paths
        .containers_dir()
        .join(format!("{}.Containerfile", kind.name()))
}

/// The content-addressed tag of an image.
pub fn tag(paths: &Paths, kind: ImageKind) -> Result<String, ImageError> {
    let base = format!(
        "localhost/phyfarm-base:{}",
        hash_hex(&[BASE_RECIPE.as_bytes()])
    );
    if kind == ImageKind::Base {
        return Ok(base);
    }
    let file = std::fs::read(containerfile(paths, kind))?;
    let pin = if kind == ImageKind::Kbuild {
        source_pin()
    } else {
        String::new()
    };
    Ok(format!(
        "localhost/phyfarm-{}:{}",
        kind.name(),
        hash_hex(&[base.as_bytes(), &file, pin.as_bytes()])
    ))
}

fn podman(paths: &Paths, args: &[&str]) -> Vec<String> {
    let _ = paths;
    let mut v = vec!["podman".to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

fn env(paths: &Paths) -> Vec<(String, String)> {
    vec![podman_env(&paths.repo)]
}

pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

fn exists(paths: &Paths, tag: &str) -> Result<bool, ImageError> {
    let st = progress::command(&podman(paths, &["image", "exists", tag]), None, &env(paths))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    Ok(st.success())
}

fn info_path(paths: &Paths, tag: &str) -> PathBuf {
    let file = tag
        .trim_start_matches("localhost/")
        .replace([':', '/'], "-");
    paths.images_dir().join(format!("{file}.json"))
}

fn mirror_hint(log: &str) -> Option<String> {
    const SIGNS: [&str; 6] = [
        "Could not resolve",
        "Temporary failure resolving",
        "Network is unreachable",
        "Failed to fetch",
        "Connection timed out",
        "Could not connect",
    ];
    log.lines()
        .find(|l| SIGNS.iter().any(|s| l.contains(s)))
        .map(|l| l.trim().chars().take(160).collect())
}

fn last_line(log: &str) -> String {
    log.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .chars()
        .take(200)
        .collect()
}

/// The commands that build `kind`, for `--dry-run` and for running.
pub fn build_commands(paths: &Paths, kind: ImageKind) -> Result<Vec<Vec<String>>, ImageError> {
    let t = tag(paths, kind)?;
    Ok(match kind {
        ImageKind::Base => vec![
            vec![
                "mmdebstrap".into(),
                "--variant=minbase".into(),
                "--quiet".into(),
                SUITE.into(),
                "-".into(),
            ],
            podman(paths, &["import", "-", &t]),
        ],
        _ => {
            let file = containerfile(paths, kind);
            let mut v = podman(paths, &["build"]);
            v.extend(ulimit_args());
            v.push("--build-arg".into());
            v.push(format!("BASE={}", tag(paths, ImageKind::Base)?));
            if kind == ImageKind::Kbuild {
                v.push("--build-arg".into());
                v.push(format!("LINUX_SOURCE_VERSION={}", source_pin()));
            }
            v.extend([
                "-f".into(),
                file.display().to_string(),
                "-t".into(),
                t,
                paths.containers_dir().display().to_string(),
            ]);
            vec![v]
        }
    })
}

/// Make sure the image exists (building it and what it stands on if not) and
/// return what is known about it.
pub fn ensure(paths: &Paths, kind: ImageKind) -> Result<ImageInfo, ImageError> {
    if !have("podman") {
        return Err(ImageError::NoPodman);
    }
    let t = tag(paths, kind)?;
    if exists(paths, &t)? {
        if let Ok(Some(info)) = read_json::<ImageInfo>(&info_path(paths, &t)) {
            return Ok(info);
        }
        return describe(paths, kind, &t, None);
    }
    if kind != ImageKind::Base {
        ensure(paths, ImageKind::Base)?;
    }
    std::fs::create_dir_all(paths.images_dir())?;
    let log_path = paths.images_dir().join(format!("{}.log", kind.name()));
    info(&format!("building image {t} (log: {})", log_path.display()));
    let start = Instant::now();
    let cmds = build_commands(paths, kind)?;
    let mut log = File::create(&log_path)?;
    let ok = if kind == ImageKind::Base {
        if !have("mmdebstrap") {
            return Err(ImageError::NoMmdebstrap);
        }
        use std::io::Write;
        writeln!(
            log,
            "$ {} | {}",
            shell_quote(&cmds[0]),
            shell_quote(&cmds[1])
        )?;
        let mut deb = progress::command(&cmds[0], None, &[])
            .stdout(Stdio::piped())
            .stderr(log.try_clone()?)
            .spawn()?;
        let imp = progress::command(&cmds[1], None, &env(paths))
            .stdin(deb.stdout.take().expect("piped"))
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?)
            .status()?;
        deb.wait()?.success() && imp.success()
    } else {
        use std::io::Write;
        writeln!(log, "$ {}", shell_quote(&cmds[0]))?;
        let cmd = progress::command(&cmds[0], None, &env(paths));
        let label = format!("image {}", kind.name());
        progress::run_logged(cmd, &mut log, &label, Duration::from_secs(30))?
            .status
            .success()
    };
    if !ok {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        return Err(match mirror_hint(&text) {
            Some(hint) => ImageError::Mirror {
                kind: kind.name(),
                hint,
                log: log_path,
            },
            None => ImageError::Build {
                kind: kind.name(),
                last: last_line(&text),
                log: log_path,
            },
        });
    }
    let secs = start.elapsed().as_secs_f64();
    info(&format!("built image {t} in {secs:.0}s"));
    describe(paths, kind, &t, Some(secs))
}

fn describe(
    paths: &Paths,
    kind: ImageKind,
    tag: &str,
    build_seconds: Option<f64>,
) -> Result<ImageInfo, ImageError> {
    let out = progress::capture(
        &podman(
            paths,
            &["image", "inspect", "--format", "{{.Id}} {{.Size}}", tag],
        ),
        &env(paths),
    )?;
    let mut it = out.split_whitespace();
    let id = it.next().unwrap_or_default().to_string();
    let size_bytes = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let (pkgs, tools): (&[&str], &[&str]) = match kind {
        ImageKind::Base => (&["base-files", "apt"], &[]),
        ImageKind::Kbuild => (
            &[
                LINUX_SOURCE_PACKAGE,
                "rustc",
                "rust-src",
                "bindgen",
                "clang",
                "lld",
                "gcc",
                "make",
            ],
            &[
                "rustc --version",
                "bindgen --version",
                "clang --version",
                "gcc --version",
                "make --version",
                "ld.lld --version",
            ],
        ),
        ImageKind::Farm => (
            &[
                "qemu-system-x86",
                "busybox-static",
                "iperf3",
                "ethtool",
                "iproute2",
                "usbredirect",
                "python3-pytest",
            ],
            &["qemu-system-x86_64 --version"],
        ),
    };
    let mut script = String::from("dpkg-query -W -f '${Package}=${Version}\\n'");
    for p in pkgs {
        script.push(' ');
        script.push_str(p);
    }
    script.push_str("; echo ---");
    for t in tools {
        script.push_str(&format!("; {t} 2>&1 | head -n1"));
    }
    let out = progress::capture(
        &podman(
            paths,
            &["run", "--rm", "--network=none", tag, "sh", "-c", &script],
        ),
        &env(paths),
    )?;
    let (pk, tl) = out.split_once("---\n").unwrap_or((&out, ""));
    let packages = pk
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let tools = tools
        .iter()
        .zip(tl.lines())
        .map(|(cmd, line)| {
            let name = cmd.split_whitespace().next().unwrap_or(cmd);
            (name.to_string(), line.trim().to_string())
        })
        .collect();
    let info = ImageInfo {
        kind: kind.name().to_string(),
        tag: tag.to_string(),
        id,
        size_bytes,
        packages,
        tools,
        build_seconds,
    };
    write_json_atomic(&info_path(paths, tag), &info)?;
    Ok(info)
}

/// Print the commands `ensure` would run for `kind`.
pub fn dry_run(paths: &Paths, kind: ImageKind) -> Result<(), ImageError> {
    let cmds = build_commands(paths, kind)?;
    let line: Vec<String> = cmds.iter().map(|c| shell_quote(c)).collect();
    let (k, v) = podman_env(&paths.repo);
    println!("{k}={} {}", shell_quote(&[v]), line.join(" | "));
    Ok(())
}

pub fn human_size(bytes: u64) -> String {
    let mb = bytes as f64 / 1e6;
    if mb >= 1000.0 {
        format!("{:.2} GB", mb / 1000.0)
    } else {
        format!("{mb:.0} MB")
    }
}

/// For tests: the tag changes when the Containerfile changes.
pub fn tag_for_dir(repo: &Path, cache: &Path, kind: ImageKind) -> Result<String, ImageError> {
    tag(
        &Paths {
            repo: repo.to_path_buf(),
            cache: cache.to_path_buf(),
        },
        kind,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_repo(kbuild: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("containers")).unwrap();
        std::fs::write(d.path().join("containers/kbuild.Containerfile"), kbuild).unwrap();
        std::fs::write(d.path().join("containers/farm.Containerfile"), "FROM x\n").unwrap();
        d
    }

    #[test]
    fn tags_follow_their_inputs() {
        let a = fake_repo("FROM ${BASE}\nRUN a\n");
        let b = fake_repo("FROM ${BASE}\nRUN b\n");
        let c = Path::new("/tmp/c");
        let ka = tag_for_dir(a.path(), c, ImageKind::Kbuild).unwrap();
        let kb = tag_for_dir(b.path(), c, ImageKind::Kbuild).unwrap();
        assert_ne!(ka, kb);
        assert!(ka.starts_with("localhost/phyfarm-kbuild:"), "{ka}");
        // The farm image does not depend on the kbuild Containerfile.
        assert_eq!(
            tag_for_dir(a.path(), c, ImageKind::Farm).unwrap(),
            tag_for_dir(b.path(), c, ImageKind::Farm).unwrap()
        );
        assert_eq!(
            tag_for_dir(a.path(), c, ImageKind::Base).unwrap(),
            tag_for_dir(b.path(), c, ImageKind::Base).unwrap()
        );
    }

    #[test]
    fn build_commands_never_pull() {
        let a = fake_repo("FROM ${BASE}\n");
        let p = Paths {
            repo: a.path().to_path_buf(),
            cache: "/tmp/c".into(),
        };
        let base = build_commands(&p, ImageKind::Base).unwrap();
        assert_eq!(base[0][0], "mmdebstrap");
        assert_eq!(base[1][..3], ["podman", "import", "-"]);
        let k = build_commands(&p, ImageKind::Kbuild).unwrap();
        let line = k[0].join(" ");
        assert!(line.contains("BASE=localhost/phyfarm-base:"), "{line}");
        assert!(!line.contains("pull"), "{line}");
    }

    #[test]
    fn mirror_failures_are_recognised() {
        let log = "Get:1 x\nErr:2 http://mirror trixie InRelease\n  Temporary failure resolving 'mirror'\n";
        assert!(mirror_hint(log)
            .unwrap()
            .contains("Temporary failure resolving"));
        assert!(mirror_hint("E: Package 'x' has no installation candidate\n").is_none());
    }
}
