//! What every farm guest needs, resolved once per farm run: the kernels, the
//! emulator, the guest image, the accelerator (a KVM probe, else TCG, with
//! the reason) and the QEMU machine. `phyfarm test` hands it to the farm's
//! pytest plugin as a file (`--guest-plan`); run by hand, the plugin asks
//! `phyfarm guest plan` for the same document. The plugin only runs checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::Paths;
use crate::guest::accel::Accel;
use crate::guest::boot;
use crate::progress::info;
use crate::sandbox::runtime::Runtime;

/// Where the farm's emulator comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Emulator {
    /// No emulator: a forwarded adapter.
    None,
    /// This binary.
    Given(PathBuf),
    /// The workspace's release build (`cargo build --release`, a no-op when
    /// it is up to date).
    Build,
}

/// What to resolve.
#[derive(Debug, Clone)]
pub struct Request {
    pub accel: Accel,
    /// A guest image instead of the one phyfarm builds.
    pub image: Option<PathBuf>,
    /// The kernels of the run, by variant; the first one is the KVM probe's.
    pub kernels: Vec<(String, PathBuf)>,
    pub emulator: Emulator,
}

/// The plan as the harness reads it (`guest-plan.json`).
pub fn resolve(paths: &Paths, runtime: Runtime, req: &Request) -> Result<serde_json::Value> {
    let guest_image = match &req.image {
        Some(p) if p.is_file() => crate::config::absolute(p),
        Some(p) => bail!("--image {}: no such file", p.display()),
        None => crate::guest::image::image(paths, None, None)?.path,
    };
    let emulator = match &req.emulator {
        Emulator::None => None,
        Emulator::Given(p) if p.is_file() => Some(crate::config::absolute(p)),
        Emulator::Given(p) => bail!("--emulator {}: no such file", p.display()),
        Emulator::Build => Some(build_emulator(paths)?),
    };
    let (accel, reason) = if req.accel == Accel::Auto {
        let Some((_, kernel)) = req.kernels.first() else {
            bail!("--accel auto needs --kernel, --artifacts or --default-kernels: the KVM probe boots the first kernel");
        };
        let initrd = boot::boot_initramfs(paths, runtime)?;
        let scratch = tempfile::tempdir()?;
        boot::resolve_accel(
            paths,
            req.accel,
            &crate::config::absolute(kernel),
            &initrd,
            boot::DEFAULT_MEMORY_MB,
            scratch.path(),
        )
    } else {
        (req.accel, "requested".to_string())
    };
    let kernels: BTreeMap<&str, PathBuf> = req
        .kernels
        .iter()
        .map(|(v, k)| (v.as_str(), crate::config::absolute(k)))
        .collect();
    Ok(serde_json::json!({
        "guest_image": guest_image,
        "accel": accel.name(),
        "accel_reason": reason,
        "machine": boot::machine_description(accel),
        "kernels": kernels,
        "emulator": emulator,
    }))
}

/// `ax88772-emu` from the workspace's release build.
fn build_emulator(paths: &Paths) -> Result<PathBuf> {
    let bin = paths.repo.join("target/release/ax88772-emu");
    info("emulator: cargo build --release -p ax88772 --bin ax88772-emu");
    let mut cargo = std::process::Command::new("cargo");
    cargo
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "ax88772",
            "--bin",
            "ax88772-emu",
        ])
        .current_dir(&paths.repo)
        .stdin(std::process::Stdio::null());
    if std::env::var_os("CARGO_BUILD_JOBS").is_none() {
        // One core for it: a farm run may start beside a kernel build.
        cargo.env("CARGO_BUILD_JOBS", "1");
    }
    let out = cargo
        .output()
        .context("cannot run cargo to build ax88772-emu")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(20).collect();
        bail!(
            "cargo build of ax88772-emu failed:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    if !bin.is_file() {
        bail!("cargo build left no {}", bin.display());
    }
    Ok(bin)
}

/// The default kernels of the cache (`<cache>/out/<variant>/bzImage`), each
/// built when it is missing or its last build did not pass.
pub fn default_kernels(
    paths: &Paths,
    runtime: Runtime,
    variants: &[crate::config::Variant],
    jobs: usize,
) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for v in variants {
        let dir = paths.cache.join("out").join(v.name());
        let kernel = dir.join("bzImage");
        let passed =
            crate::build::metadata::read_json::<serde_json::Value>(&dir.join("metadata.json"))
                .ok()
                .flatten()
                .is_some_and(|m| m["status"] == "PASS");
        if !kernel.is_file() || !passed {
            crate::build::kernel::build(
                paths,
                &crate::build::kernel::BuildOptions {
                    variant: *v,
                    out: dir.clone(),
                    runtime,
                    jobs,
                    dry_run: false,
                    extra: vec![],
                    reproducer: format!("phyfarm build --variant {}", v.name()),
                },
            )?;
        }
        if !kernel.is_file() {
            bail!(
                "phyfarm build --variant {} left no {}",
                v.name(),
                kernel.display()
            );
        }
        out.push((v.name().to_string(), kernel));
    }
    Ok(out)
}

/// Write the plan where the harness reads it.
pub fn write(plan: &serde_json::Value, file: &Path) -> Result<()> {
    std::fs::write(file, serde_json::to_string_pretty(plan)? + "\n")
        .with_context(|| format!("cannot write {}", file.display()))
}
