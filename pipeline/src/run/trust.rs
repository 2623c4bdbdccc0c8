//! The trusted side of `phyfarm record` and `phyfarm run --owners-from`.
//! What a pull request's run uploaded (series-build.json, the farm's
//! results.json) is evidence to check, never
//! the source of a revision's identity: series name, version, patchset hash
//! and patch-ids come from the `--series` folder phyfarm parsed itself, an
//! artifact whose claims disagree is refused naming the file and field, a
//! series the default branch holds gets revisions only from its owners,
//! and a superseded revision gets no new runs.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::farm::contract::FarmResults;
use crate::ingest::series::{self, Series};
use crate::kbuild::series_build::SeriesBuild;
use crate::results::{RevisionInfo, Status};
use crate::store::Store;

/// Largest series-build.json read, in bytes.
const MAX_SERIES_BUILD_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{file}: {reason}; nothing was recorded")]
    Unreadable { file: PathBuf, reason: String },
    #[error("{file}: {field}: the artifact claims {claimed} but {series} (parsed by phyfarm) has {parsed}; nothing was recorded")]
    Disagrees {
        file: PathBuf,
        field: String,
        claimed: String,
        parsed: String,
        series: PathBuf,
    },
    #[error("{file}: {field}: {reason}; nothing was recorded")]
    Inconsistent {
        file: PathBuf,
        field: String,
        reason: String,
    },
    #[error("{manifest}: owners: {author} is not an owner of series {name:?}, which the default branch holds; a pull request adds revisions only to a series its author owns; nothing was recorded")]
    NotOwner {
        manifest: PathBuf,
        name: String,
        author: String,
    },
    #[error("{revision} is superseded by {newer} in the store; runs of a superseded revision are not recorded")]
    Superseded { revision: String, newer: String },
}

fn unreadable(file: &Path, reason: impl ToString) -> TrustError {
    TrustError::Unreadable {
        file: file.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Read a `series-build.json` a build (perhaps a pull request's) wrote:
/// no link followed, bounded, every field as the schema says.
pub fn load_build(file: &Path) -> Result<SeriesBuild, TrustError> {
    let f = crate::sandbox::safe_fs::open_file(file).map_err(|e| unreadable(file, e))?;
    let mut bytes = Vec::new();
    f.take(MAX_SERIES_BUILD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(file, e))?;
    if bytes.len() as u64 > MAX_SERIES_BUILD_BYTES {
        return Err(unreadable(
            file,
            format!("larger than {MAX_SERIES_BUILD_BYTES} bytes"),
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| unreadable(file, format!("not a series-build.json: {e}")))
}

/// Refuse a `series-build.json` whose series is not the one parsed from
/// `dir`, or whose builds name patches or variants the series does not
/// have. On success the caller replaces its series with `parsed`.
pub fn check_build(
    file: &Path,
    b: &SeriesBuild,
    parsed: &Series,
    dir: &Path,
) -> Result<(), TrustError> {
    let differ = |field: &str, claimed: String, have: String| {
        if claimed == have {
            Ok(())
        } else {
            Err(TrustError::Disagrees {
                file: file.to_path_buf(),
                field: field.to_string(),
                claimed,
                parsed: have,
                series: dir.to_path_buf(),
            })
        }
    };
    let s = &b.series;
    differ(
        "series.version",
        format!("v{}", s.version),
        format!("v{}", parsed.version),
    )?;
    differ(
        "series.patchset_hash",
        s.patchset_hash.clone(),
        parsed.patchset_hash.clone(),
    )?;
    differ(
        "series.change_id",
        format!("{:?}", s.change_id),
        format!("{:?}", parsed.change_id),
    )?;
    differ(
        "series.tree",
        format!("{:?}", s.tree),
        format!("{:?}", parsed.tree),
    )?;
    differ(
        "series.patches",
        format!("{} patches", s.patches.len()),
        format!("{} patches", parsed.patches.len()),
    )?;
    for (i, (c, p)) in s.patches.iter().zip(&parsed.patches).enumerate() {
        differ(
            &format!("series.patches[{i}].index"),
            c.index.to_string(),
            p.index.to_string(),
        )?;
        differ(
            &format!("series.patches[{i}].patch_id"),
            c.patch_id.clone(),
            p.patch_id.clone(),
        )?;
        differ(
            &format!("series.patches[{i}].sha256"),
            c.sha256.clone(),
            p.sha256.clone(),
        )?;
    }
    let inconsistent = |field: String, reason: String| TrustError::Inconsistent {
        file: file.to_path_buf(),
        field,
        reason,
    };
    let variant_ok = |v: &str| matches!(v, "rust" | "c");
    if let Some(v) = b.base.keys().find(|v| !variant_ok(v)) {
        return Err(inconsistent(
            "base".into(),
            format!("variant {v:?} is neither rust nor c"),
        ));
    }
    for (i, x) in b.builds.iter().enumerate() {
        if !parsed.patches.iter().any(|p| p.index == x.index) {
            return Err(inconsistent(
                format!("builds[{i}].index"),
                format!("patch {} is not in the series", x.index),
            ));
        }
        if !b.base.contains_key(x.variant.name()) {
            return Err(inconsistent(
                format!("builds[{i}].variant"),
                format!("variant {} has no base build", x.variant.name()),
            ));
        }
    }
    for (i, a) in b.apply.iter().enumerate() {
        if !parsed.patches.iter().any(|p| p.index as usize == a.index) {
            return Err(inconsistent(
                format!("apply[{i}].index"),
                format!("patch {} is not in the series", a.index),
            ));
        }
    }
    Ok(())
}

/// Refuse a farm `results.json` (and its retry's) that contradicts itself:
/// counts that are not the tally of its tests, a status that is not their
/// worst, a test of a variant that was not built. A missing file is left
/// to the import (the planned checks become ERROR).
pub fn check_farm(dir: &Path, variants: &[&str]) -> Result<(), TrustError> {
    for file in [
        dir.join("results.json"),
        crate::farm::contract::retry_dir(dir).join("results.json"),
    ] {
        let Some(r) = FarmResults::load(&file).map_err(|e| unreadable(&file, e))? else {
            continue;
        };
        let inconsistent = |field: &str, reason: String| TrustError::Inconsistent {
            file: file.clone(),
            field: field.to_string(),
            reason,
        };
        let mut tally = std::collections::BTreeMap::<Status, u32>::new();
        for (i, t) in r.tests.iter().enumerate() {
            *tally.entry(t.status).or_default() += 1;
            if let Some(v) = t.variant.as_deref().filter(|v| !variants.contains(v)) {
                return Err(inconsistent(
                    &format!("tests[{i}].variant"),
                    format!("{v:?} was not built (built: {})", variants.join(", ")),
                ));
            }
        }
        let claimed: std::collections::BTreeMap<Status, u32> = r
            .counts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| (*s, *n))
            .collect();
        if claimed != tally {
            return Err(inconsistent(
                "counts",
                format!("{:?} is not the tally of its tests, {:?}", claimed, tally),
            ));
        }
        let worst = r
            .tests
            .iter()
            .map(|t| t.status)
            .min()
            .unwrap_or(Status::Miss);
        if r.status != worst {
            return Err(inconsistent(
                "status",
                format!("{} but its worst test is {}", r.status, worst),
            ));
        }
    }
    Ok(())
}

/// A series the default branch holds (same folder, name or change-id as
/// the pull request's `dir`) gets revisions only from its `owners`.
/// `patches` is the default branch's `patches/` folder; `author` is
/// `github:<login>` of the pull request.
pub fn check_owner(
    patches: &Path,
    dir: &Path,
    name: &str,
    parsed: &Series,
    author: &str,
) -> Result<(), TrustError> {
    let folder = dir
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let entries = std::fs::read_dir(patches).map_err(|e| unreadable(patches, e))?;
    let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for d in entries {
        let manifest = d.join(series::MANIFEST_FILE);
        if !d.is_dir() || std::fs::symlink_metadata(&manifest).is_err() {
            continue;
        }
        let m = series::load_manifest(&manifest).map_err(|e| unreadable(&manifest, e))?;
        let same_folder = d.file_name().map(|n| n.to_string_lossy().into_owned()) == folder;
        let same_change = m.change_id.is_some() && m.change_id == parsed.change_id;
        if !(same_folder || m.name == name || same_change) {
            continue;
        }
        if !m.owners.iter().any(|o| o == author) {
            return Err(TrustError::NotOwner {
                manifest,
                name: m.name,
                author: author.to_string(),
            });
        }
    }
    Ok(())
}

/// The check family of a farm result id: `farm.link_flap` for
/// `farm.link_flap[reset_after_link_loss]` and `farm.link_flap.flap10`,
/// `farm.differential.probe` for `farm.differential.probe`.
fn family(id: &str) -> &str {
    let prefix = if id.starts_with("farm.differential.") {
        "farm.differential.".len()
    } else {
        "farm.".len().min(id.len())
    };
    let end = id[prefix..]
        .find(['.', '['])
        .map_or(id.len(), |i| prefix + i);
    &id[..end]
}

/// The rules `phyfarm record` keeps, for a run that arrives as a
/// `results.json` (`phyfarm store import`): a series name that is one safe
/// path component, variants rust or c, farm results the plan allows (a
/// planned check's family and variant, such as a KUnit case under the
/// planned KUnit check or a sub-result of a planned check), and only
/// the kinds of check phyfarm records.
pub fn check_stored_run(file: &Path, run: &crate::results::Run) -> Result<(), TrustError> {
    let bad = |field: String, reason: String| TrustError::Inconsistent {
        file: file.to_path_buf(),
        field,
        reason,
    };
    if let Some(r) = &run.revision {
        if !series::valid_name(&r.series) {
            return Err(bad(
                "revision.series".into(),
                format!("{:?} is not one path component of [A-Za-z0-9._-]", r.series),
            ));
        }
    }
    let variant_ok = |v: Option<&str>| matches!(v, None | Some("rust") | Some("c"));
    let plan = crate::farm::contract::Plan::new(&["rust", "c"], true);
    for (i, b) in run.builds.iter().enumerate() {
        if !variant_ok(Some(&b.variant)) {
            return Err(bad(
                format!("builds[{i}].variant"),
                format!("{:?} is neither rust nor c", b.variant),
            ));
        }
    }
    for (i, t) in run.tests.iter().enumerate() {
        let v = t.variant.as_deref();
        if !variant_ok(v) {
            return Err(bad(
                format!("tests[{i}].variant"),
                format!("{v:?} is neither rust nor c"),
            ));
        }
        let kind = t.path.split('.').next().unwrap_or("");
        let allowed = match kind {
            "farm" => plan
                .checks
                .iter()
                .any(|c| family(&c.id) == family(&t.path) && c.variant.as_deref() == v),
            "apply" | "gate" | "boot" | "harness" => true,
            _ => false,
        };
        if !allowed {
            return Err(bad(
                format!("tests[{i}].path"),
                format!(
                    "{:?} (variant {}) is not a check of the plan (phyfarm farm plan)",
                    t.path,
                    v.unwrap_or("none")
                ),
            ));
        }
    }
    Ok(())
}

/// What the trusted side checks before it builds or records anything of a
/// pull request's revision: the series name (`series.toml`'s, checked),
/// the owners (with `owners`: the default branch's `patches/` and the
/// author, `github:<login>`) and that no newer revision of the same change
/// is in the store. Returns the series name.
pub fn admit(
    store: &Path,
    dir: &Path,
    parsed: &Series,
    owners: Option<&(PathBuf, String)>,
) -> anyhow::Result<String> {
    let name = crate::run::store_runs::series_name(dir)?;
    if let Some((patches, author)) = owners {
        check_owner(patches, dir, &name, parsed, author)?;
    }
    match crate::store::open(store, crate::store::OpenMode::Existing) {
        Ok(st) => check_not_superseded(st.as_ref(), &RevisionInfo::from_series(&name, parsed))?,
        Err(crate::store::StoreError::Missing { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(name)
}

/// Refuse runs of a revision a newer one of the same change supersedes.
pub fn check_not_superseded(st: &dyn Store, info: &RevisionInfo) -> Result<(), TrustError> {
    let all = st
        .revisions()
        .map_err(|e| unreadable(Path::new("store"), e))?;
    let me = crate::store::RevisionRecord {
        info: info.clone(),
        created: crate::results::Timestamp(0),
    };
    match crate::store::newer_revisions(&all, &me).last() {
        Some(newer) => Err(TrustError::Superseded {
            revision: info.reference().to_string(),
            newer: newer.reference().to_string(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
