//! The farm inside `phyfarm run`: run it on a set of kernels, retry the
//! checks that failed once (recorded as their retry, so a check that passes
//! the second time is flaky rather than a failure of the series), and turn
//! its results.json into the store's tests and measurements.

use std::path::Path;

use crate::config::Paths;
use crate::farm::TestOptions;
use crate::progress::{info, warn};
use crate::results::Status;
use crate::Outcome;

pub use crate::contract::retry_dir;

/// Run the farm on the kernels under `artifacts` (`<variant>/bzImage`) into
/// `out`; a failed check runs once more into [`retry_dir`]. Returns the
/// outcome and, when the farm itself could not run, why.
pub fn farm(
    paths: &Paths,
    base: &TestOptions,
    artifacts: &Path,
    out: &Path,
) -> (Outcome, Option<String>) {
    // What an earlier run left in this run folder (its results were recorded
    // then) must not be read as this run's: a stale retry would pass for
    // this run's second attempt.
    if let Err(e) = clear(out) {
        let why = format!("cannot clear {} for this run: {e}", out.display());
        warn(&why);
        return (Outcome::Error, Some(why));
    }
    let first = farm_once(paths, base, artifacts, out, None);
    let Some(failed) = failed_selection(out).filter(|_| first.0 == Outcome::Fail) else {
        return first;
    };
    info(&format!("retrying the failed farm checks once: {failed}"));
    farm_once(paths, base, artifacts, &retry_dir(out), Some(failed))
}

pub(crate) fn farm_once(
    paths: &Paths,
    base: &TestOptions,
    artifacts: &Path,
    out: &Path,
    keyword: Option<String>,
) -> (Outcome, Option<String>) {
    let mut o = base.clone();
    o.artifacts = Some(artifacts.to_path_buf());
    o.out = Some(out.to_path_buf());
    if keyword.is_some() {
        o.keyword = keyword;
    }
    let repro = format!(
        "phyfarm test --artifacts {} -o {}",
        artifacts.display(),
        out.display()
    );
    match crate::farm::test(paths, &o, &repro) {
        Ok(x) => (x, None),
        Err(e) => {
            let why = format!("the farm could not run on {}: {e:#}", artifacts.display());
            warn(&why);
            (Outcome::Error, Some(why))
        }
    }
}

fn is_word(w: &str) -> bool {
    !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A pytest `-k` expression selecting the tests that failed in `out`, e.g.
/// `(test_speed_duplex and rust)`; None when none failed.
pub fn failed_selection(out: &Path) -> Option<String> {
    let r = crate::contract::FarmResults::load(&out.join("results.json")).ok()??;
    let mut parts: Vec<String> = Vec::new();
    for t in &r.tests {
        if !matches!(t.status, Status::Fail | Status::Error) {
            continue;
        }
        let node = t.nodeid.as_str();
        if node.is_empty() {
            continue;
        }
        let name = node.rsplit("::").next().unwrap_or(node);
        let (func, param) = match name.split_once('[') {
            Some((f, p)) => (f, Some(p.trim_end_matches(']'))),
            None => (name, None),
        };
        if !is_word(func) {
            continue;
        }
        let expr = match param.filter(|p| is_word(p)) {
            Some(p) => format!("({func} and {p})"),
            None => func.to_string(),
        };
        if !parts.contains(&expr) {
            parts.push(expr);
        }
    }
    (!parts.is_empty()).then(|| parts.join(" or "))
}

/// Remove a farm output folder and its retry folder, if there.
fn clear(out: &Path) -> std::io::Result<()> {
    remove_stale(out)?;
    remove_stale(&retry_dir(out))
}

fn remove_stale(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// What decides the base's farm results: the plan and the farm's options,
/// the base kernels (by content), and the code of the farm, the plugin, the
/// emulator, the guest and the contract (by content). Two runs with the same
/// key would run the same checks on the same kernels with the same code.
pub fn base_key(
    paths: &Paths,
    opts: &TestOptions,
    artifacts: &Path,
    plan: &crate::contract::Plan,
) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |name: &str, bytes: &[u8]| {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(
        "plan",
        serde_json::to_string(plan).unwrap_or_default().as_bytes(),
    );
    let options = format!(
        "keyword={:?} accel={} flaps={:?} timeout={} device={:?} variant={:?} args={:?}",
        opts.keyword,
        opts.accel.name(),
        opts.flaps,
        opts.guest_timeout,
        opts.device,
        opts.variant,
        opts.pytest_args
    );
    field("options", options.as_bytes());
    let folder = crate::run_folder::RunFolder::new(artifacts);
    for k in ["rust", "c", crate::run_folder::KUNIT_DIR] {
        if !folder.kernel(k).is_file() {
            continue;
        }
        // A kernel is what it was built from: the distro source, its
        // configuration and the toolchain (kbuild stamps every link with a
        // build number and a date, so the image's bytes differ each time).
        // Without its build metadata, the image's bytes.
        match kernel_identity(&folder.metadata(k)) {
            Some(id) => field(k, id.as_bytes()),
            None => field(k, &Sha256::digest(std::fs::read(folder.kernel(k))?)),
        }
    }
    for dir in [
        "pytest-tests/farm",
        "pytest-tests/phyfarm_farm",
        "qemu-farm",
        "containers",
        "pipeline/schema",
    ] {
        let mut files = Vec::new();
        source_files(&paths.repo.join(dir), &mut files)?;
        files.sort();
        for f in files {
            let rel = f.strip_prefix(&paths.repo).unwrap_or(&f);
            field(&rel.display().to_string(), &std::fs::read(&f)?);
        }
    }
    Ok(crate::images::hex(&h.finalize())[..16].to_string())
}

/// What a kernel was built from, from its build metadata: source package
/// and version, the resulting configuration, the image and tool versions.
fn kernel_identity(metadata: &Path) -> Option<String> {
    let text = std::fs::read_to_string(metadata).ok()?;
    let m: serde_json::Value = serde_json::from_str(&text).ok()?;
    if m.get("status")?.as_str()? != "PASS" || m.get("config_hash")?.as_str()?.is_empty() {
        return None;
    }
    let fields = [
        "variant",
        "kernel_package",
        "kernel_version",
        "config_hash",
        "image",
        "tools",
    ];
    Some(
        fields
            .iter()
            .map(|f| format!("{f}={}", m.get(*f).unwrap_or(&serde_json::Value::Null)))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// Source files under `dir`, without build outputs and caches; links are
/// not followed.
fn source_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || matches!(&*name, "target" | "__pycache__") {
            continue;
        }
        let t = e.file_type()?;
        if t.is_dir() {
            source_files(&e.path(), out)?;
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

/// Where the base's farm results are kept under their key.
pub fn base_cache_dir(paths: &Paths, key: &str) -> std::path::PathBuf {
    paths.cache.join("base-results").join(key)
}

/// The base's farm results of an earlier run with the same key, copied into
/// `out` as if this run had produced them; false when there are none.
pub fn reuse_base(paths: &Paths, key: &str, out: &Path) -> bool {
    let from = base_cache_dir(paths, key).join("results.json");
    if !matches!(crate::contract::FarmResults::load(&from), Ok(Some(_))) {
        return false;
    }
    if clear(out).is_err() || std::fs::create_dir_all(out).is_err() {
        return false;
    }
    std::fs::copy(&from, out.join("results.json")).is_ok()
}

/// Keep the base's farm results under `key` when they can stand for the
/// base next time: every check PASS or SKIP at the first attempt (a flaky
/// or failing base is measured again every run).
pub fn keep_base(paths: &Paths, key: &str, out: &Path) {
    let Ok(Some(r)) = crate::contract::FarmResults::load(&out.join("results.json")) else {
        return;
    };
    if retry_dir(out).exists()
        || r.tests.is_empty()
        || r.tests
            .iter()
            .any(|t| !matches!(t.status, Status::Pass | Status::Skip))
    {
        return;
    }
    let dir = base_cache_dir(paths, key);
    let tmp = dir.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let done = std::fs::create_dir_all(&tmp)
        .and_then(|_| std::fs::copy(out.join("results.json"), tmp.join("results.json")))
        .and_then(|_| {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir)
        });
    if let Err(e) = done {
        warn(&format!(
            "cannot keep the base's results in {}: {e}",
            dir.display()
        ));
    }
}

/// Throughput measurements of `rev` that look like a regression against
/// `base` (the verdict's rule), by measurement name and variant.
pub fn suspected_regressions(
    base: &crate::contract::FarmImport,
    rev: &crate::contract::FarmImport,
) -> Vec<(String, Option<String>)> {
    rev.measurements
        .iter()
        .filter(|m| m.unit.ends_with("bit/s"))
        .filter(|m| {
            base.measurements
                .iter()
                .find(|b| b.name == m.name && b.variant == m.variant)
                .is_some_and(|b| {
                    crate::stats::lower(
                        &b.samples,
                        &m.samples,
                        crate::verdict::compare::REGRESSION_MIN_EFFECT,
                    )
                    .is_some()
                })
        })
        .map(|m| (m.name.clone(), m.variant.clone()))
        .collect()
}

/// Rounds of the interleaved re-measurement.
pub const CONFIRM_ROUNDS: usize = 2;

/// A throughput regression is only called on samples that machine noise hit
/// alike: base and revision measured again, alternately, [`CONFIRM_ROUNDS`]
/// times each, in this invocation. Their samples replace the first ones of
/// both sides (which were taken minutes apart); a round that fails leaves
/// the first samples in place.
pub fn confirm_throughput(
    paths: &Paths,
    opts: &TestOptions,
    (base_art, rev_art): (&Path, &Path),
    out: &Path,
    base: &mut crate::contract::FarmImport,
    rev: &mut crate::contract::FarmImport,
) {
    let suspects = suspected_regressions(base, rev);
    if suspects.is_empty() {
        return;
    }
    let names: Vec<String> = suspects
        .iter()
        .map(|(n, v)| format!("{n} ({})", v.as_deref().unwrap_or("-")))
        .collect();
    info(&format!(
        "throughput lower than the base ({}): measuring base and revision again, interleaved",
        names.join(", ")
    ));
    let mut fresh: [Vec<crate::contract::FarmResults>; 2] = [vec![], vec![]];
    for round in 0..CONFIRM_ROUNDS {
        for (side, art) in [(0, base_art), (1, rev_art)] {
            let dir = out.join(format!(
                "throughput-{}-{round}",
                if side == 0 { "base" } else { "revision" }
            ));
            if remove_stale(&dir).is_err() {
                warn(&format!(
                    "cannot clear {}; keeping the first samples",
                    dir.display()
                ));
                return;
            }
            let (o, _) = farm_once(paths, opts, art, &dir, Some("throughput".into()));
            match crate::contract::FarmResults::load(&dir.join("results.json")) {
                Ok(Some(r)) if o != Outcome::Error => fresh[side].push(r),
                _ => {
                    warn(&format!(
                        "the interleaved throughput round {} failed; keeping the first samples",
                        dir.display()
                    ));
                    return;
                }
            }
        }
    }
    for (side, imp) in [(0, base), (1, rev)] {
        for m in imp
            .measurements
            .iter_mut()
            .filter(|m| m.unit.ends_with("bit/s"))
        {
            let mut samples = Vec::new();
            for r in &fresh[side] {
                for t in r.tests.iter().filter(|t| t.variant == m.variant) {
                    for x in &t.measurements {
                        if format!("{}.{}", t.id, x.name) == m.name {
                            samples.extend(if x.samples.is_empty() {
                                vec![x.value]
                            } else {
                                x.samples.clone()
                            });
                        }
                    }
                }
            }
            if !samples.is_empty() {
                m.value = samples.iter().sum::<f64>() / samples.len() as f64;
                m.samples = samples;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::tests::write_results;

    #[test]
    fn failed_checks_become_a_keyword_selection() {
        let d = tempfile::tempdir().unwrap();
        write_results(
            d.path(),
            serde_json::json!([
                {"id": "farm.speed_duplex", "nodeid": "pytest-tests/farm/test_speed_duplex.py::test_speed_duplex[rust]", "variant": "rust", "status": "FAIL"},
                {"id": "farm.probe", "nodeid": "pytest-tests/farm/test_probe.py::test_probe[c]", "variant": "c", "status": "PASS"},
                {"id": "farm.link_flap[plain]", "nodeid": "pytest-tests/farm/test_link_flap.py::test_link_flap[rust-plain]", "variant": "rust", "status": "ERROR"},
                {"id": "farm.dmesg", "nodeid": "pytest-tests/farm/test_x.py::test_y[a;b]", "variant": null, "status": "ERROR"}
            ]),
        );
        assert_eq!(
            failed_selection(d.path()).unwrap(),
            "(test_speed_duplex and rust) or test_link_flap or test_y"
        );
        write_results(
            d.path(),
            serde_json::json!([{"id": "farm.probe", "nodeid": "t.py::test_a", "variant": "rust", "status": "PASS"}]),
        );
        assert!(failed_selection(d.path()).is_none());
    }

    fn opts() -> TestOptions {
        TestOptions {
            artifacts: None,
            kernel: None,
            variant: None,
            workers: Some(2),
            keyword: Some("probe".into()),
            accel: crate::accel::Accel::Tcg,
            guest_timeout: 60,
            flaps: None,
            device: None,
            out: None,
            pytest_args: vec![],
        }
    }

    #[test]
    fn the_base_key_changes_with_each_input_and_only_then() {
        let d = tempfile::tempdir().unwrap();
        let paths = Paths {
            repo: d.path().join("repo"),
            cache: d.path().join("cache"),
        };
        for dir in [
            "pytest-tests/farm",
            "pytest-tests/phyfarm_farm",
            "qemu-farm/ax88772/src",
            "qemu-farm/target",
            "containers",
            "pipeline/schema",
        ] {
            std::fs::create_dir_all(paths.repo.join(dir)).unwrap();
        }
        std::fs::write(paths.repo.join("pytest-tests/farm/test_probe.py"), "a").unwrap();
        std::fs::write(paths.repo.join("qemu-farm/ax88772/src/phy.rs"), "b").unwrap();
        let art = d.path().join("base");
        std::fs::create_dir_all(art.join("rust")).unwrap();
        std::fs::write(art.join("rust/bzImage"), "kernel 1").unwrap();
        let plan = crate::contract::Plan::new(&["rust"], false);
        let key = || base_key(&paths, &opts(), &art, &plan).unwrap();
        let k0 = key();
        assert_eq!(k0, key(), "same inputs, same key");
        // Build outputs and caches do not count.
        std::fs::write(paths.repo.join("qemu-farm/target/x"), "out").unwrap();
        assert_eq!(k0, key());
        std::fs::write(art.join("rust/bzImage"), "kernel 2").unwrap();
        let k1 = key();
        assert_ne!(k0, k1, "a different base kernel");
        // With its build metadata a kernel is what it was built from: a
        // relink (new build number and date) is the same kernel, another
        // configuration is not.
        let meta = |config: &str| {
            serde_json::json!({"variant": "rust", "kernel_package": "linux-source-6.12",
                "kernel_version": "6.12.118-1", "config_hash": config, "status": "PASS",
                "image": {"name": "kbuild", "id": "abc"}, "tools": {"rustc": "1.85"},
                "started": "2026-12-03T16:00:00Z", "durations": [["build", 9.5]]})
        };
        std::fs::write(art.join("rust/metadata.json"), meta("c1").to_string()).unwrap();
        let k1 = key();
        std::fs::write(art.join("rust/bzImage"), "kernel 2, relinked").unwrap();
        let mut relinked = meta("c1");
        relinked["started"] = "2026-12-03T17:00:00Z".into();
        std::fs::write(art.join("rust/metadata.json"), relinked.to_string()).unwrap();
        assert_eq!(k1, key(), "a relink of the same build");
        std::fs::write(art.join("rust/metadata.json"), meta("c2").to_string()).unwrap();
        assert_ne!(k1, key(), "another configuration");
        std::fs::write(art.join("rust/metadata.json"), meta("c1").to_string()).unwrap();
        std::fs::write(paths.repo.join("qemu-farm/ax88772/src/phy.rs"), "c").unwrap();
        let k2 = key();
        assert_ne!(k1, k2, "a different emulator");
        std::fs::write(paths.repo.join("pytest-tests/farm/test_probe.py"), "d").unwrap();
        let k3 = key();
        assert_ne!(k2, k3, "a different check");
        let other = crate::contract::Plan::new(&["rust"], true);
        assert_ne!(k3, base_key(&paths, &opts(), &art, &other).unwrap());
        let mut o = opts();
        o.flaps = Some(3);
        assert_ne!(k3, base_key(&paths, &o, &art, &plan).unwrap());
    }

    #[test]
    fn only_a_clean_base_is_kept_and_reused() {
        let d = tempfile::tempdir().unwrap();
        let paths = Paths {
            repo: d.path().join("repo"),
            cache: d.path().join("cache"),
        };
        let out = d.path().join("run1/base/farm");
        write_results(
            &out,
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "FAIL"}]),
        );
        keep_base(&paths, "k", &out);
        let next = d.path().join("run2/base/farm");
        assert!(
            !reuse_base(&paths, "k", &next),
            "a failing base is measured again"
        );
        write_results(
            &out,
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
        );
        write_results(
            &retry_dir(&out),
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
        );
        keep_base(&paths, "k", &out);
        assert!(
            !reuse_base(&paths, "k", &next),
            "a base that needed a retry is flaky"
        );
        clear(&out).unwrap();
        write_results(
            &out,
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
        );
        keep_base(&paths, "k", &out);
        // A stale retry in the next run's folder must not survive the reuse.
        write_results(
            &retry_dir(&next),
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "FAIL"}]),
        );
        assert!(reuse_base(&paths, "k", &next));
        assert!(!retry_dir(&next).exists());
        let r = crate::contract::FarmResults::load(&next.join("results.json"))
            .unwrap()
            .unwrap();
        assert_eq!(r.tests[0].status, Status::Pass);
        assert!(!reuse_base(&paths, "other", &d.path().join("run3")));
    }

    #[test]
    fn a_new_farm_run_starts_without_the_last_runs_results() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("farm");
        write_results(
            &out,
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "PASS"}]),
        );
        write_results(
            &retry_dir(&out),
            serde_json::json!([{"id": "farm.probe", "variant": "rust", "status": "FAIL"}]),
        );
        clear(&out).unwrap();
        assert!(!out.exists() && !retry_dir(&out).exists());
        clear(&out).unwrap();
    }

    #[test]
    fn only_a_clear_throughput_drop_is_suspected() {
        let m = |name: &str, samples: &[f64]| crate::results::Measurement {
            name: name.into(),
            variant: Some("rust".into()),
            value: samples.iter().sum::<f64>() / samples.len() as f64,
            unit: "Mbit/s".into(),
            samples: samples.to_vec(),
            lower_is_better: false,
        };
        let base = crate::contract::FarmImport {
            tests: vec![],
            measurements: vec![
                m("farm.throughput.tcp_tx", &[93.0, 93.5, 92.8, 93.2, 93.1]),
                m("farm.throughput.tcp_rx", &[93.0, 93.5, 92.8, 93.2, 93.1]),
            ],
        };
        let rev = crate::contract::FarmImport {
            tests: vec![],
            measurements: vec![
                m("farm.throughput.tcp_tx", &[60.0, 61.0, 59.5, 60.5, 60.2]),
                m("farm.throughput.tcp_rx", &[90.0, 95.0, 91.0, 94.0, 92.0]),
            ],
        };
        assert_eq!(
            suspected_regressions(&base, &rev),
            [(
                "farm.throughput.tcp_tx".to_string(),
                Some("rust".to_string())
            )]
        );
    }
}
