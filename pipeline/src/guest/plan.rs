//! What every farm guest needs, resolved once per farm run: the kernels, the
//! emulator, the guest image, the accelerator (a KVM probe, else TCG, with
//! the reason) and the QEMU machine. `phyfarm test` hands it to the farm's
//! pytest plugin as a file (`--guest-plan`); run by hand, the plugin asks
//! `phyfarm guest plan` for the same document. The plugin only runs checks.
//! Both sides hold the document to `pipeline/schema/guest-plan.schema.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::Paths;
use crate::guest::accel::Accel;
use crate::guest::{boot, machine};
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

/// Where the exporter guest's kernel (the forwarded-gadget path) comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exporter {
    /// No exporter guest.
    None,
    /// This bzImage.
    Given(PathBuf),
    /// `<cache>/out/exporter`, built (incrementally) with this many jobs.
    Build { jobs: usize },
}

/// `--device` of the forwarded-gadget path: the model as a USB gadget in an
/// exporter guest, exported by the real usbredirect.
pub const FORWARDED_GADGET: &str = "forwarded-gadget";

/// The exporter kernel's configuration on top of the c variant.
pub const EXPORTER_FRAGMENT: &str = "qemu-farm/guest/exporter.config";

/// What to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub accel: Accel,
    /// A guest image instead of the one phyfarm builds.
    pub image: Option<PathBuf>,
    /// The kernels of the run, by variant; the first one is the KVM probe's.
    pub kernels: Vec<(String, PathBuf)>,
    pub emulator: Emulator,
    pub exporter: Exporter,
}

impl Request {
    /// What a farm run on `--device` needs: the emulator unless the adapter
    /// is a forwarded one, and the exporter guest's kernel on the
    /// forwarded-gadget path; phyfarm's guest image.
    pub fn for_farm(accel: Accel, kernels: Vec<(String, PathBuf)>, device: Option<&str>) -> Self {
        let forwarded = device.is_some_and(|d| d.starts_with("forwarded:"));
        Request {
            accel,
            image: None,
            kernels,
            emulator: if forwarded {
                Emulator::None
            } else {
                Emulator::Build
            },
            exporter: if device == Some(FORWARDED_GADGET) {
                Exporter::Build {
                    jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
                }
            } else {
                Exporter::None
            },
        }
    }
}

/// The JSON Schema of `guest-plan.json` (repo-relative): the harness
/// validates a plan against it before it boots anything, and a test holds
/// it and [`GuestPlan`] to the same fields.
pub const GUEST_PLAN_SCHEMA_FILE: &str = "pipeline/schema/guest-plan.schema.json";

/// The guest plan (`guest-plan.json`), as phyfarm writes it, the harness
/// reads it and `phyfarm repro` checks it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestPlan {
    /// The SHA-256 of every file below, by path: `phyfarm repro` reruns a
    /// check only on the same files. (Empty in plans written before they
    /// were recorded.)
    #[serde(default)]
    pub sha256: BTreeMap<String, String>,
    pub guest_image: PathBuf,
    /// The accelerator the guests use, never `auto`.
    pub accel: Accel,
    /// Why: "requested", or what the KVM probe saw.
    pub accel_reason: String,
    pub machine: machine::Machine,
    /// The kernels, by variant.
    pub kernels: BTreeMap<String, PathBuf>,
    /// The kernels' variants in the run's order (the first one is what a
    /// single-variant check runs on).
    pub variants: Vec<String>,
    /// The emulator binary, or None for a forwarded adapter.
    pub emulator: Option<PathBuf>,
    /// The exporter guest's kernel (the forwarded-gadget path), or None.
    pub exporter_kernel: Option<PathBuf>,
}

impl GuestPlan {
    /// The plan of a run folder's `guest-plan.json`.
    pub fn read(file: &Path) -> Result<GuestPlan> {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a guest plan phyfarm wrote", file.display()))
    }

    /// Every file the plan names for one variant's guests (its kernel, the
    /// image, the emulator and the exporter kernel), or None without a
    /// kernel of that variant.
    pub fn files(&self, variant: &str) -> Option<Vec<&Path>> {
        let kernel = self.kernels.get(variant)?;
        let rest = [&self.emulator, &self.exporter_kernel];
        Some(
            [kernel.as_path(), self.guest_image.as_path()]
                .into_iter()
                .chain(rest.into_iter().flatten().map(|p| p.as_path()))
                .collect(),
        )
    }
}

/// Resolve what the guests of a farm run need.
pub fn resolve(paths: &Paths, runtime: Runtime, req: &Request) -> Result<GuestPlan> {
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
    let exporter_kernel = match &req.exporter {
        Exporter::None => None,
        Exporter::Given(p) if p.is_file() => Some(crate::config::absolute(p)),
        Exporter::Given(p) => bail!("--exporter-kernel {}: no such file", p.display()),
        Exporter::Build { jobs } => Some(build_exporter_kernel(paths, runtime, *jobs)?),
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
            machine::DEFAULT_MEMORY_MB,
            scratch.path(),
        )
    } else {
        (req.accel, "requested".to_string())
    };
    let kernels: BTreeMap<String, PathBuf> = req
        .kernels
        .iter()
        .map(|(v, k)| (v.clone(), crate::config::absolute(k)))
        .collect();
    // What the guests run, by content: `phyfarm repro` reruns a check only
    // on these same files.
    let mut sha256 = BTreeMap::new();
    let image = Some(guest_image.clone());
    let files = kernels
        .values()
        .chain([&image, &emulator, &exporter_kernel].into_iter().flatten());
    for f in files {
        sha256.insert(f.display().to_string(), file_sha256(f)?);
    }
    Ok(GuestPlan {
        sha256,
        guest_image,
        accel,
        accel_reason: reason,
        machine: machine::machine_description(accel),
        kernels,
        variants: req.kernels.iter().map(|(v, _)| v.clone()).collect(),
        emulator,
        exporter_kernel,
    })
}

/// The hex SHA-256 of a file's content.
pub fn file_sha256(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// `ax88772-emu` from the workspace's release build.
pub fn build_emulator(paths: &Paths) -> Result<PathBuf> {
    let bin = paths.repo.join("target/release/ax88772-emu");
    info("emulator: cargo build --release -p ax88772 --bin ax88772-emu");
    let t = std::time::Instant::now();
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
    if t.elapsed().as_secs() >= 2 {
        info(&format!(
            "emulator: built in {:.0} s",
            t.elapsed().as_secs_f64()
        ));
    }
    Ok(bin)
}

/// The exporter guest's kernel, `<cache>/out/exporter/bzImage`: the c
/// variant with [`EXPORTER_FRAGMENT`], as `make exporter-kernel` builds it.
/// The build is incremental, a short no-op when nothing changed.
fn build_exporter_kernel(paths: &Paths, runtime: Runtime, jobs: usize) -> Result<PathBuf> {
    let fragment = paths.repo.join(EXPORTER_FRAGMENT);
    let out = paths.cache.join("out").join("exporter");
    let extra =
        crate::kbuild::kconfig::as_options(&crate::kbuild::kconfig::parse_fragment(&fragment)?);
    info(&format!("exporter kernel: {}", out.display()));
    let outcome = crate::kbuild::kernel::build(
        paths,
        &crate::kbuild::kernel::BuildOptions {
            variant: crate::config::Variant::C,
            out: out.clone(),
            runtime,
            jobs,
            dry_run: false,
            extra,
            reproducer: format!(
                "phyfarm build --variant c --kconfig-fragment {EXPORTER_FRAGMENT} -o {}",
                out.display()
            ),
        },
    )?;
    let kernel = out.join("bzImage");
    if outcome != crate::Outcome::Pass || !kernel.is_file() {
        bail!(
            "the exporter kernel did not build ({outcome:?}): see {}",
            out.join("build.log").display()
        );
    }
    Ok(kernel)
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
            crate::kbuild::metadata::read_json::<serde_json::Value>(&dir.join("metadata.json"))
                .ok()
                .flatten()
                .is_some_and(|m| m["status"] == "PASS");
        if !kernel.is_file() || !passed {
            crate::kbuild::kernel::build(
                paths,
                &crate::kbuild::kernel::BuildOptions {
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
pub fn write(plan: &GuestPlan, file: &Path) -> Result<()> {
    std::fs::write(file, serde_json::to_string_pretty(plan)? + "\n")
        .with_context(|| format!("cannot write {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_farm_run_asks_for_what_its_device_needs() {
        let k = vec![("rust".to_string(), PathBuf::from("bzImage"))];
        let req = |d| Request::for_farm(Accel::Tcg, k.clone(), d);
        assert_eq!(req(None).emulator, Emulator::Build);
        assert_eq!(req(None).exporter, Exporter::None);
        assert_eq!(req(Some("emulated")).exporter, Exporter::None);
        let gadget = req(Some(FORWARDED_GADGET));
        assert_eq!(gadget.emulator, Emulator::Build);
        assert!(matches!(gadget.exporter, Exporter::Build { .. }));
        let forwarded = req(Some("forwarded:10.0.0.2:4000"));
        assert_eq!(
            (forwarded.emulator, forwarded.exporter),
            (Emulator::None, Exporter::None)
        );
        assert_eq!((gadget.kernels, gadget.image), (k, None));
    }

    /// The fields a JSON Schema object names (its `properties`), and
    /// those it requires.
    fn schema_fields(obj: &serde_json::Value) -> (Vec<String>, Vec<String>) {
        let props = obj["properties"].as_object().unwrap().keys().cloned();
        let required = obj["required"].as_array().unwrap().iter();
        (
            props.collect(),
            required.map(|r| r.as_str().unwrap().to_string()).collect(),
        )
    }

    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    #[test]
    fn the_plan_and_its_json_schema_name_the_same_fields() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let text = std::fs::read_to_string(repo.join(GUEST_PLAN_SCHEMA_FILE)).unwrap();
        let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
        let plan = GuestPlan {
            sha256: [("/k".to_string(), "0".repeat(64))].into(),
            guest_image: "/img".into(),
            accel: Accel::Tcg,
            accel_reason: "requested".into(),
            machine: machine::machine_description(Accel::Tcg),
            kernels: [("rust".to_string(), PathBuf::from("/k"))].into(),
            variants: vec!["rust".into()],
            emulator: Some("/emu".into()),
            exporter_kernel: None,
        };
        let doc = serde_json::to_value(&plan).unwrap();
        // Every field is required but the hashes and the devices (absent
        // from plans written before they were recorded).
        for (obj, def, optional) in [
            (&doc, &schema, &["sha256"][..]),
            (
                &doc["machine"],
                &schema["$defs"]["machine"],
                &["devices", "device_slots"][..],
            ),
        ] {
            let (mut props, mut required) = schema_fields(def);
            props.sort();
            required.sort();
            assert_eq!(
                keys(obj),
                props,
                "the schema's properties are the type's fields"
            );
            let mut expected = props.clone();
            expected.retain(|p| !optional.contains(&p.as_str()));
            assert_eq!(required, expected);
            assert_eq!(def["additionalProperties"], serde_json::json!(false));
        }
        let accel = &schema["properties"]["accel"]["enum"];
        assert_eq!(accel, &serde_json::json!(["kvm", "tcg"]), "never auto");
    }
}
