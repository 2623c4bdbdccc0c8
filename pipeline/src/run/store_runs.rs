//! Turning what `phyfarm run` produced (series-build.json, boot.json) into
//! the store's runs: one run of the unpatched base and one of the revision,
//! in the same environment, so the verdict compares like with like.

use crate::run_folder::RunFolder;
use std::collections::BTreeMap;
use std::path::Path;

use crate::config::Variant;
use crate::kbuild::series_build::SeriesBuild;
use crate::results::{BuildResult, Environment, RevisionInfo, Run, Status, TestResult, Timestamp};

/// One boot check: variant, status, accelerator, duration, console path.
#[derive(Debug, Clone)]
pub struct Boot {
    pub variant: Variant,
    pub status: Status,
    pub accel: String,
    pub seconds: f64,
    pub console: String,
    pub message: String,
}

impl Boot {
    /// What a boot check recorded (in memory, or read from `boot.json`).
    pub fn from_record(variant: Variant, r: &crate::guest::boot::BootRecord) -> Boot {
        let failed: Vec<&str> = r
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        Boot {
            variant,
            status: r.status,
            accel: r.accel.clone(),
            seconds: r.seconds,
            console: r.console.clone(),
            message: if failed.is_empty() {
                r.message.clone()
            } else {
                format!("failed: {}", failed.join(", "))
            },
        }
    }

    /// A boot check that did not finish: an ERROR (the harness broke), never
    /// a FAIL.
    pub fn unfinished(variant: Variant, dir: &Path, why: &str) -> Boot {
        Boot {
            variant,
            status: Status::Error,
            accel: String::new(),
            seconds: 0.0,
            console: dir.join("console.log").display().to_string(),
            message: format!("the boot check did not finish: {why}"),
        }
    }
}

/// Read `boot.json` written by `phyfarm boot` (an earlier run's folder); a
/// missing or unreadable file is an ERROR (the harness did not finish),
/// never a FAIL.
pub fn read_boot(variant: Variant, dir: &Path) -> Boot {
    let file = dir.join("boot.json");
    match crate::kbuild::metadata::read_json::<crate::guest::boot::BootRecord>(&file) {
        Ok(Some(r)) => Boot::from_record(variant, &r),
        Ok(None) => Boot::unfinished(variant, dir, "no boot.json"),
        Err(e) => Boot::unfinished(variant, dir, &format!("{}: {e}", file.display())),
    }
}

fn run_id(kind: &str, now: Timestamp) -> String {
    let stamp = now.to_string().replace(['-', ':'], "");
    let nonce: u32 = std::process::id() ^ (now.0 as u32).rotate_left(7);
    format!("{stamp}-{kind}-{nonce:08x}")
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The environment of a run: accelerator, host, images and tools.
pub fn environment(b: &SeriesBuild, accel: &str, tools: &BTreeMap<String, String>) -> Environment {
    let mut images = BTreeMap::new();
    if let Some(i) = &b.image {
        let (name, _) = i.name.split_once(':').unwrap_or((&i.name, ""));
        images.insert(name.to_string(), i.id.chars().take(12).collect());
    }
    let mut tools = tools.clone();
    tools.insert(
        crate::kbuild::images::LINUX_SOURCE_PACKAGE.into(),
        b.kernel_version.clone(),
    );
    Environment {
        accelerator: accel.to_string(),
        host: hostname(),
        arch: "x86_64".into(),
        images,
        tools,
    }
}

fn boot_test(b: &Boot) -> TestResult {
    TestResult {
        path: "boot.drivers".into(),
        variant: Some(b.variant.name().into()),
        status: b.status,
        duration_s: Some(b.seconds),
        log_path: Some(b.console.clone()),
        log_excerpt: b.message.clone(),
        attempt: 0,
    }
}

fn base_build(b: &SeriesBuild, v: &str, out: &Path) -> BuildResult {
    let meta: Option<crate::kbuild::metadata::BuildMetadata> =
        crate::kbuild::metadata::read_json(&RunFolder::new(out).base().metadata(v))
            .ok()
            .flatten();
    BuildResult {
        patch: None,
        variant: v.to_string(),
        status: b.base.get(v).copied().unwrap_or(Status::Miss),
        duration_s: meta
            .as_ref()
            .map(|m| m.durations.iter().map(|(_, s)| s).sum())
            .unwrap_or(0.0),
        warnings: 0,
        new_warnings: vec![],
        log_path: Some(
            RunFolder::new(out)
                .base()
                .variant(v)
                .join("build.log")
                .display()
                .to_string(),
        ),
        log_excerpt: meta.map(|m| m.log_excerpt.join("\n")).unwrap_or_default(),
    }
}

/// The run of the unpatched base: base builds and base boots.
pub fn base_run(
    b: &SeriesBuild,
    out: &Path,
    boots: &[Boot],
    env: &Environment,
    started: Timestamp,
) -> Run {
    let now = Timestamp::now();
    Run {
        schema: 1,
        id: run_id("base", now),
        revision: None,
        base: format!(
            "{} {}",
            crate::kbuild::images::LINUX_SOURCE_PACKAGE,
            b.kernel_version
        ),
        environment: env.clone(),
        started,
        finished: Some(now),
        reproducer: b.reproducer.clone(),
        builds: b.base.keys().map(|v| base_build(b, v, out)).collect(),
        tests: boots.iter().map(boot_test).collect(),
        measurements: vec![],
    }
}

/// The run of the revision: apply per patch, build per patch and variant,
/// the Rust gates and the boots of the patched kernels.
pub fn revision_run(
    name: &str,
    b: &SeriesBuild,
    boots: &[Boot],
    env: &Environment,
    started: Timestamp,
) -> Run {
    let now = Timestamp::now();
    let mut tests = Vec::new();
    for a in &b.apply {
        let (st, msg) = match a.state {
            crate::kbuild::apply::ApplyState::Applied => (Status::Pass, String::new()),
            crate::kbuild::apply::ApplyState::AlreadyApplied => (Status::Skip, a.message.clone()),
            crate::kbuild::apply::ApplyState::Failed => (Status::Fail, a.message.clone()),
            crate::kbuild::apply::ApplyState::Skipped => (Status::Miss, a.message.clone()),
        };
        let index = b
            .series
            .patches
            .get(tests.len())
            .map(|p| p.index)
            .unwrap_or(a.index as u32);
        tests.push(TestResult {
            path: format!("apply.patch{index}"),
            variant: None,
            status: st,
            duration_s: None,
            log_path: None,
            log_excerpt: msg,
            attempt: 0,
        });
    }
    for g in &b.gates {
        tests.push(TestResult {
            path: format!("gate.{}", g.name.replace('-', "_")),
            variant: Some("rust".into()),
            status: Status::parse(&g.status).unwrap_or(Status::Error),
            duration_s: Some(g.seconds),
            log_path: (!g.log.is_empty()).then(|| g.log.clone()),
            log_excerpt: g.message.clone(),
            attempt: 0,
        });
    }
    tests.extend(boots.iter().map(boot_test));
    Run {
        schema: 1,
        id: run_id(&format!("v{}", b.series.version), now),
        revision: Some(RevisionInfo::from_series(name, &b.series)),
        base: format!(
            "{} {}",
            crate::kbuild::images::LINUX_SOURCE_PACKAGE,
            b.kernel_version
        ),
        environment: env.clone(),
        started,
        finished: Some(now),
        reproducer: b.reproducer.clone(),
        builds: b
            .builds
            .iter()
            .map(|x| BuildResult {
                patch: Some(x.index),
                variant: x.variant.name().into(),
                status: x.status,
                duration_s: x.seconds,
                warnings: x.new_warnings.len() as u32,
                new_warnings: x.new_warnings.iter().map(|w| w.text.clone()).collect(),
                log_path: Some(x.log.clone()),
                log_excerpt: x.log_excerpt.join("\n"),
            })
            .collect(),
        tests,
        measurements: vec![],
    }
}

/// The series name: `series.toml`'s name beside the revision folder, else
/// the folder's (or mbox file's) parent name. A manifest that cannot be
/// read, or a name that is not one safe path component (it becomes a store
/// key and a folder under the cache), is refused naming the file.
pub fn series_name(dir: &Path) -> Result<String, crate::ingest::series::SeriesError> {
    use crate::ingest::series::{load_manifest, valid_name, SeriesError, MANIFEST_FILE};
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(m) = parent.map(|p| p.join(MANIFEST_FILE)) {
        // symlink_metadata: a linked series.toml is refused by name, not
        // skipped.
        if std::fs::symlink_metadata(&m).is_ok() {
            return Ok(load_manifest(&m)?.name);
        }
    }
    let name = parent
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "series".into());
    if valid_name(&name) {
        Ok(name)
    } else {
        Err(SeriesError::Manifest {
            file: parent.map(Path::to_path_buf).unwrap_or_default(),
            reason: format!("the series folder's name {name:?} is not one path component of [A-Za-z0-9._-]; add a series.toml naming the series"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_boot_json_is_an_error_not_a_failure() {
        let d = tempfile::tempdir().unwrap();
        let b = read_boot(Variant::Rust, d.path());
        assert_eq!(b.status, Status::Error);
    }

    #[test]
    fn failed_boot_checks_are_named() {
        let d = tempfile::tempdir().unwrap();
        use crate::guest::boot::{BootRecord, Check};
        let check = |name: &str, ok| Check {
            name: name.into(),
            ok,
            detail: String::new(),
        };
        let record = BootRecord {
            reproducer: "phyfarm boot --kernel k".into(),
            kernel: "k".into(),
            kernel_release: "6.12.118".into(),
            accel: "tcg".into(),
            accel_reason: "requested".into(),
            qemu: "QEMU emulator version 7.2.19".into(),
            seconds: 3.2,
            status: Status::Fail,
            checks: vec![check("phy driver is the Rust one", false), check("x", true)],
            console: "c.log".into(),
            message: String::new(),
        };
        // What the run keeps in memory and what a later reader of the folder
        // gets are the same.
        let in_memory = Boot::from_record(Variant::Rust, &record);
        std::fs::write(
            d.path().join("boot.json"),
            serde_json::to_string(&record).unwrap(),
        )
        .unwrap();
        let b = read_boot(Variant::Rust, d.path());
        assert_eq!(
            (in_memory.status, &in_memory.message, &in_memory.accel),
            (b.status, &b.message, &b.accel)
        );
        assert_eq!(b.status, Status::Fail);
        assert_eq!(b.message, "failed: phy driver is the Rust one");
        assert_eq!(b.accel, "tcg");
    }

    #[test]
    fn shipped_series_is_named_by_its_manifest() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../patches/rust-phy-enum-check/v8");
        assert_eq!(series_name(&dir).unwrap(), "rust-phy-enum-check");
    }

    #[test]
    fn a_series_name_that_escapes_is_refused_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let series = d.path().join("s");
        std::fs::create_dir_all(series.join("v1")).unwrap();
        for bad in ["../../etc", "a/b", ".hidden", ""] {
            std::fs::write(
                series.join("series.toml"),
                format!("name = {bad:?}\ntree = \"net-next\"\nbase = {{ package = \"p\", distro = \"d\" }}\n"),
            )
            .unwrap();
            let e = series_name(&series.join("v1")).unwrap_err().to_string();
            assert!(
                e.contains("series.toml") && e.contains("name"),
                "{bad}: {e}"
            );
        }
        std::fs::remove_file(series.join("series.toml")).unwrap();
        assert_eq!(series_name(&series.join("v1")).unwrap(), "s");
    }

    #[test]
    fn run_ids_are_valid_and_distinct_per_kind() {
        let t = Timestamp(1_800_000_000);
        let a = run_id("base", t);
        let b = run_id("v8", t);
        assert_ne!(a, b);
        assert!(a.contains("-base-"), "{a}");
    }
}
