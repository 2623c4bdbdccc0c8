//! `phyfarm guest image`: the farm guest's initramfs. busybox, iperf3,
//! ethtool, ip and usbredirect with every shared library they need (copied
//! out of the farm image, with a check that none is missing), the guest
//! agent, `ax88772-gadget` (for the exporter guest of the forwarded-gadget
//! path), and the /init in `qemu-farm/guest/farm-init.sh`. The file is content addressed:
//! `<cache>/guest/farm-<hash>.cpio`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Serialize;
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::config::Paths;
use crate::guest::cpio::{self, Entry};
use crate::jsonfile::write_json_atomic;
use crate::kbuild::images::{self, hex, ImageKind};
use crate::progress::info;
use crate::sandbox::runtime::{copy_out, CopyOutError};

/// The farm guest's /init.
pub const FARM_INIT: &str = include_str!("../../../qemu-farm/guest/farm-init.sh");
/// Where the agent lives in the guest.
pub const AGENT_PATH: &str = "usr/bin/phyfarm-agent";
/// Where the model's gadget front end lives in the guest.
pub const GADGET_PATH: &str = "usr/bin/ax88772-gadget";
/// The user-space programs the checks run, as looked up in the farm image;
/// usbredirect is the exporter guest's.
pub const PROGRAMS: [&str; 5] = ["busybox", "iperf3", "ethtool", "ip", "usbredirect"];
/// The target the agent is built for (statically).
pub const AGENT_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Runs inside the farm image: resolves each program, lists its libraries
/// with ldd (failing on any "not found"), and writes a tar of all of them
/// plus a manifest to stdout.
const COLLECT: &str = r#"set -eu
DLOPEN="libgcc_s.so.1"
m=/tmp/phyfarm-manifest
: > "$m"
for p in "$@"; do
  b=$(command -v "$p") || { echo "missing program: $p" >&2; exit 3; }
  echo "bin $p $b $(readlink -f "$b")" >> "$m"
  out=$(ldd "$b" 2>&1 || true)
  if echo "$out" | grep -q 'not found'; then
    echo "missing library for $b: $(echo "$out" | grep 'not found' | tr -s ' \t' ' ')" >&2; exit 3
  fi
  echo "$out" | awk -v b="$b" '/=> \//{print "lib", b, $3} /^[ \t]*\/[^ ]+ \(/{print "lib", b, $1}' >> "$m"
done
# Loaded with dlopen, so ldd cannot see them: glibc needs libgcc_s for
# pthread_cancel (iperf3).
for l in $DLOPEN; do
  p=$(ls /lib/x86_64-linux-gnu/$l /usr/lib/x86_64-linux-gnu/$l 2>/dev/null | head -n1)
  [ -n "$p" ] || { echo "missing library $l (loaded with dlopen)" >&2; exit 3; }
  echo "lib dlopen $p" >> "$m"
done
{ awk '$1=="bin"{print $4} $1=="lib"{print $3}' "$m"; echo "$m"; } | sed 's|^/||' | sort -u > /tmp/list
cd / && tar -chf - -T /tmp/list
"#;

#[derive(Debug, Error)]
pub enum GuestError {
    #[error(transparent)]
    Image(#[from] images::ImageError),
    #[error("collecting guest programs from {image} failed: {msg}")]
    Collect { image: String, msg: String },
    #[error("the guest image would lack {lib}, needed by {by}")]
    MissingLibrary { lib: String, by: String },
    #[error("malformed tar from the farm image: {0}")]
    Tar(String),
    #[error("cannot build the guest agent ({0}); build it with `RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build -p guest-agent --release --target x86_64-unknown-linux-gnu` or pass --agent")]
    Agent(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One regular file of a tar archive (symlinks are dereferenced by `tar -h`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarFile {
    pub path: String,
    pub mode: u32,
    pub data: Vec<u8>,
}

fn octal(field: &[u8]) -> Result<u64, GuestError> {
    let s = std::str::from_utf8(field).map_err(|_| GuestError::Tar("non-ASCII number".into()))?;
    let s = s.trim_matches(|c: char| c == '\0' || c == ' ');
    if s.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(s, 8).map_err(|_| GuestError::Tar(format!("bad octal field {s:?}")))
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Read the regular files of a ustar/GNU archive; directories are skipped.
pub fn read_tar(mut b: &[u8]) -> Result<Vec<TarFile>, GuestError> {
    let mut out = Vec::new();
    let mut long_name: Option<String> = None;
    while b.len() >= 512 {
        let h = &b[..512];
        if h.iter().all(|&x| x == 0) {
            break;
        }
        let size = octal(&h[124..136])? as usize;
        let mode = octal(&h[100..108])? as u32;
        let kind = h[156];
        let mut name = cstr(&h[0..100]);
        if &h[257..262] == b"ustar" {
            let prefix = cstr(&h[345..500]);
            if !prefix.is_empty() {
                name = format!("{prefix}/{name}");
            }
        }
        let padded = size.div_ceil(512) * 512;
        if b.len() < 512 + padded {
            return Err(GuestError::Tar(format!("{name}: truncated")));
        }
        let data = &b[512..512 + size];
        match kind {
            b'L' => long_name = Some(cstr(data)),
            b'0' | 0 => {
                let path = long_name.take().unwrap_or(name);
                out.push(TarFile {
                    path: path.trim_start_matches("./").to_string(),
                    mode: mode & 0o7777,
                    data: data.to_vec(),
                });
            }
            b'5' => long_name = None,
            other => {
                return Err(GuestError::Tar(format!(
                    "{name}: unexpected entry type {:?}",
                    other as char
                )))
            }
        }
        b = &b[512 + padded..];
    }
    Ok(out)
}

/// The manifest the collector wrote: programs (name, path, real path) and
/// (program, library) pairs.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Manifest {
    pub programs: Vec<(String, String, String)>,
    pub libraries: Vec<(String, String)>,
}

pub fn parse_manifest(text: &str) -> Manifest {
    let mut m = Manifest::default();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["bin", name, path, real] => {
                m.programs
                    .push((name.to_string(), path.to_string(), real.to_string()))
            }
            ["lib", by, lib] => m.libraries.push((by.to_string(), lib.to_string())),
            _ => {}
        }
    }
    m
}

/// Every library the manifest names must be among the files.
pub fn check_complete(m: &Manifest, files: &[TarFile]) -> Result<(), GuestError> {
    let have: BTreeSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    for (by, lib) in &m.libraries {
        if !have.contains(lib.trim_start_matches('/')) {
            return Err(GuestError::MissingLibrary {
                lib: lib.clone(),
                by: by.clone(),
            });
        }
    }
    for (name, _, real) in &m.programs {
        if !have.contains(real.trim_start_matches('/')) {
            return Err(GuestError::MissingLibrary {
                lib: real.clone(),
                by: name.clone(),
            });
        }
    }
    Ok(())
}

/// Copy the programs and their libraries out of the farm image (cached by
/// the image id).
pub fn userspace(paths: &Paths) -> Result<(Vec<TarFile>, Manifest, String), GuestError> {
    let img = images::ensure(paths, ImageKind::Farm)?;
    let id = img.id.get(..12).unwrap_or(&img.id).to_string();
    let recipe = hex(&Sha256::digest(COLLECT.as_bytes()));
    let cached = paths
        .guest_dir()
        .join(format!("userspace-{id}-{}.tar", &recipe[..8]));
    let tar = match std::fs::read(&cached) {
        Ok(t) => t,
        Err(_) => {
            let mut argv = vec!["sh", "-c", COLLECT, "collect"];
            argv.extend(PROGRAMS);
            info(&format!("copying guest programs out of {}", img.tag));
            let stdout = match copy_out(&paths.repo, &img.tag, &argv) {
                Ok(stdout) => stdout,
                Err(CopyOutError::Start(e)) => return Err(e.into()),
                Err(CopyOutError::Failed(msg)) => {
                    return Err(GuestError::Collect {
                        image: img.tag,
                        msg,
                    })
                }
            };
            std::fs::create_dir_all(paths.guest_dir())?;
            let tmp = cached.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &stdout)?;
            std::fs::rename(&tmp, &cached)?;
            stdout
        }
    };
    let files = read_tar(&tar)?;
    let manifest = files
        .iter()
        .find(|f| f.path == "tmp/phyfarm-manifest")
        .map(|f| parse_manifest(&String::from_utf8_lossy(&f.data)))
        .ok_or_else(|| GuestError::Tar("no manifest in the archive".into()))?;
    check_complete(&manifest, &files)?;
    let files = files
        .into_iter()
        .filter(|f| f.path != "tmp/phyfarm-manifest")
        .collect();
    Ok((files, manifest, img.tag))
}

/// Build the agent statically (a no-op when it is up to date) and return it.
pub fn build_agent(paths: &Paths) -> Result<PathBuf, GuestError> {
    build_static(paths, "guest-agent", "phyfarm-agent")
}

/// Build `ax88772-gadget` statically and return it.
pub fn build_gadget(paths: &Paths) -> Result<PathBuf, GuestError> {
    build_static(paths, "ax88772", "ax88772-gadget")
}

fn build_static(paths: &Paths, package: &str, bin_name: &str) -> Result<PathBuf, GuestError> {
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| paths.repo.join("target"));
    let bin = target_dir.join(AGENT_TARGET).join("release").join(bin_name);
    let st = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args([
            "build",
            "--quiet",
            "-p",
            package,
            "--bin",
            bin_name,
            "--release",
            "--target",
            AGENT_TARGET,
        ])
        .current_dir(&paths.repo)
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C strip=debuginfo",
        )
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stdin(Stdio::null())
        .status();
    match st {
        Ok(s) if s.success() && bin.is_file() => Ok(bin),
        Ok(s) => Err(GuestError::Agent(format!(
            "cargo build of {bin_name} exited with {s}"
        ))),
        Err(e) => Err(GuestError::Agent(format!("cannot run cargo: {e}"))),
    }
}

fn with_parents(dirs: &mut BTreeSet<String>, path: &str) {
    let mut p = Path::new(path).parent();
    while let Some(d) = p {
        let s = d.to_string_lossy();
        if s.is_empty() {
            break;
        }
        dirs.insert(s.into_owned());
        p = d.parent();
    }
}

/// The entries of the farm initramfs, in a stable order.
pub fn entries(
    files: &[TarFile],
    manifest: &Manifest,
    agent: Vec<u8>,
    gadget: Vec<u8>,
) -> Vec<Entry> {
    let mut dirs: BTreeSet<String> = [
        "bin", "sbin", "dev", "proc", "sys", "tmp", "run", "root", "etc", "usr/bin", "usr/sbin",
        "var",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut regular: BTreeMap<String, (u32, Vec<u8>)> = BTreeMap::new();
    for f in files {
        regular.insert(f.path.clone(), (f.mode | 0o444, f.data.clone()));
    }
    regular.insert(AGENT_PATH.into(), (0o755, agent));
    regular.insert(GADGET_PATH.into(), (0o755, gadget));
    let mut links: BTreeMap<String, String> = BTreeMap::new();
    links.insert("bin/sh".into(), "busybox".into());
    links.insert("var/run".into(), "../run".into());
    // A program found through a symlink (e.g. /usr/sbin/ip -> ../bin/ip)
    // keeps that name too.
    for (_, path, real) in &manifest.programs {
        let (p, r) = (path.trim_start_matches('/'), real.trim_start_matches('/'));
        if p != r && !regular.contains_key(p) {
            links.insert(p.to_string(), format!("/{r}"));
        }
    }
    if !regular.contains_key("bin/busybox") {
        if let Some((_, _, real)) = manifest.programs.iter().find(|p| p.0 == "busybox") {
            links.insert(
                "bin/busybox".into(),
                format!("/{}", real.trim_start_matches('/')),
            );
        }
    }
    for p in regular.keys().chain(links.keys()) {
        with_parents(&mut dirs, p);
    }
    let mut e: Vec<Entry> = dirs
        .into_iter()
        .map(|path| Entry::Dir { path, mode: 0o755 })
        .collect();
    e.push(Entry::CharDev {
        path: "dev/console".into(),
        mode: 0o600,
        major: 5,
        minor: 1,
    });
    for (path, (mode, data)) in regular {
        e.push(Entry::File { path, mode, data });
    }
    for (path, target) in links {
        e.push(Entry::Symlink { path, target });
    }
    e.push(Entry::File {
        path: "init".into(),
        mode: 0o755,
        data: FARM_INIT.as_bytes().to_vec(),
    });
    e
}

/// What `phyfarm guest image` made; written beside the image as JSON.
#[derive(Debug, Serialize)]
pub struct ImageRecord {
    pub path: PathBuf,
    pub sha256: String,
    pub size_bytes: u64,
    pub farm_image: String,
    pub agent: String,
    pub programs: Vec<(String, String, String)>,
    pub libraries: Vec<String>,
}

/// Build (or reuse) the farm initramfs. `out` copies it to a chosen path.
pub fn image(
    paths: &Paths,
    agent: Option<&Path>,
    out: Option<&Path>,
) -> Result<ImageRecord, GuestError> {
    let t = std::time::Instant::now();
    let (files, manifest, farm_image) = userspace(paths)?;
    let agent_path = match agent {
        Some(a) => a.to_path_buf(),
        None => build_agent(paths)?,
    };
    let agent_bin = std::fs::read(&agent_path)?;
    if agent_bin.get(..4) != Some(b"\x7fELF") {
        return Err(GuestError::Agent(format!(
            "{} is not an ELF program",
            agent_path.display()
        )));
    }
    let gadget_bin = std::fs::read(build_gadget(paths)?)?;
    let mut buf = Vec::new();
    cpio::write(&mut buf, &entries(&files, &manifest, agent_bin, gadget_bin))?;
    let sha = hex(&Sha256::digest(&buf));
    let cached = paths.guest_dir().join(format!("farm-{}.cpio", &sha[..16]));
    if !cached.is_file() {
        std::fs::create_dir_all(paths.guest_dir())?;
        let tmp = cached.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &buf)?;
        std::fs::rename(&tmp, &cached)?;
        info(&format!(
            "guest image {} built in {:.0} s",
            cached.display(),
            t.elapsed().as_secs_f64()
        ));
    }
    let path = match out {
        Some(o) => {
            if let Some(d) = o.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(d)?;
            }
            std::fs::copy(&cached, o)?;
            o.to_path_buf()
        }
        None => cached.clone(),
    };
    let libs: BTreeSet<String> = manifest.libraries.iter().map(|l| l.1.clone()).collect();
    let rec = ImageRecord {
        path,
        sha256: sha,
        size_bytes: buf.len() as u64,
        farm_image,
        agent: agent_path.display().to_string(),
        programs: manifest.programs.clone(),
        libraries: libs.into_iter().collect(),
    };
    write_json_atomic(&cached.with_extension("json"), &rec)?;
    Ok(rec)
}

#[cfg(test)]
mod tests;
