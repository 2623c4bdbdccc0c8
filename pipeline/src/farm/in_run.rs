//! The farm inside `phyfarm run`: run it on a set of kernels, retry the
//! checks that failed or errored once (recorded as their retry, so a check that passes
//! the second time is flaky rather than a failure of the series), and turn
//! its results.json into the store's tests and measurements.

use std::path::Path;

use crate::config::Paths;
use crate::farm::TestOptions;
use crate::progress::{info, warn};
use crate::results::Status;
use crate::Outcome;

pub use crate::farm::contract::retry_dir;

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
    // ERRORs are retried too: a guest that stops answering twice, where
    // the base's did not, is the revision's failure (verdict::compare's
    // hang rule), and once is not evidence.
    let retry = matches!(first.0, Outcome::Fail | Outcome::Error);
    let Some(failed) = failed_selection(out).filter(|_| retry) else {
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
    let r = crate::farm::contract::FarmResults::load(&out.join("results.json")).ok()??;
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

/// What decides the base's farm results: the plan and the farm's options
/// (the number of guests at once among them: it shifts the timings), the
/// base kernels (by content), and the code of the farm, the plugin, the
/// emulator, the guest and the contract (by content). Two runs with the same
/// key would run the same checks on the same kernels with the same code.
pub fn base_key(
    paths: &Paths,
    opts: &TestOptions,
    artifacts: &Path,
    plan: &crate::farm::contract::Plan,
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
        "keyword={:?} accel={} flaps={:?} timeout={} device={:?} variant={:?} args={:?} workers={:?}",
        opts.keyword,
        opts.accel.name(),
        opts.flaps,
        opts.guest_timeout,
        opts.device,
        opts.variant,
        opts.pytest_args,
        opts.workers
    );
    field("options", options.as_bytes());
    // What the harness's automatic link-partner choice depends on besides
    // its own code (`host_partner_unavailable` in harness/phyfarm_farm/
    // partner.py): base results measured with the guest's partner are not
    // reused for a run that gets the host's, nor the other way round.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let partner = format!(
        "root={root} tun={} ip={}",
        Path::new("/dev/net/tun").exists(),
        Path::new("/usr/bin/ip").exists()
    );
    field("partner", partner.as_bytes());
    // A given emulator is part of the farm as much as its sources are.
    if let Some(e) = &opts.emulator {
        field("emulator", &std::fs::read(e)?);
    }
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
        "harness/phyfarm_farm",
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
    Ok(crate::kbuild::images::hex(&h.finalize())[..16].to_string())
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
    if !matches!(crate::farm::contract::FarmResults::load(&from), Ok(Some(_))) {
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
    let Ok(Some(r)) = crate::farm::contract::FarmResults::load(&out.join("results.json")) else {
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
    // Runs at once (a self-test's cases) may keep the same key: each
    // writes its own folder and renames it into place.
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
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
    base: &crate::farm::contract::FarmImport,
    rev: &crate::farm::contract::FarmImport,
) -> Vec<(String, Option<String>)> {
    rev.measurements
        .iter()
        .filter(|m| m.unit.ends_with("bit/s"))
        .filter(|m| {
            base.measurements
                .iter()
                .find(|b| b.name == m.name && b.variant == m.variant)
                .is_some_and(|b| {
                    crate::verdict::stats::lower(
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
    base: &mut crate::farm::contract::FarmImport,
    rev: &mut crate::farm::contract::FarmImport,
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
    let mut fresh: [Vec<crate::farm::contract::FarmResults>; 2] = [vec![], vec![]];
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
            match crate::farm::contract::FarmResults::load(&dir.join("results.json")) {
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
mod tests;
