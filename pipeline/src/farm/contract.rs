//! The farm's run contract: what a farm run must report (its plan), the
//! typed `results.json` the pytest harness writes (validated by both sides
//! against `pipeline/schema/farm-results.schema.json`), and the import of
//! that file into the store's tests and measurements.
//!
//! The import is where completeness is decided: a planned check the run did
//! not report is MISS, a run that left no results makes every planned check
//! ERROR, and an id or field the store cannot keep is an error naming it,
//! never dropped. Each planned Rust-versus-C differential is added here as a
//! result of its own, judged by the verdict (`verdict/differential.rs`).
//!
//! One file over 500 lines: validation and import against the plan are one
//! pass over the harness's file; its tests are in `contract/tests.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::results::{Measurement, Status, TestResult};
use crate::verdict::differential;

/// The `schema` of a farm `results.json`.
pub const FARM_SCHEMA: u32 = 2;
/// The JSON Schema both the harness and this reader follow (repo-relative).
pub const FARM_SCHEMA_FILE: &str = "pipeline/schema/farm-results.schema.json";

/// The product's farm checks, each reported once per variant. Every test in
/// `pytest-tests/farm` declares one of these with `@pytest.mark.check`; the
/// project's tests hold the two lists equal. The last three drive the
/// emulator's fault injection: MDIO errors, USB replug, a limited partner.
pub const FARM_CHECKS: &[&str] = &[
    "farm.probe",
    "farm.throughput",
    "farm.link_flap[plain]",
    "farm.link_flap[reset_after_link_loss]",
    "farm.cable_test[cable-test]",
    "farm.cable_test[cable-test-tdr]",
    "farm.speed_duplex",
    "farm.dmesg",
    "farm.mdio_faults",
    "farm.replug",
    "farm.partner_limited[10full]",
    "farm.partner_limited[10half]",
    "farm.partner_limited[100half]",
    "farm.partner_limited[none]",
    "farm.link_flap[forced_slow_reset]",
];
/// The Rust KUnit doctests: one run, on a kernel of their own (rust only).
pub const KUNIT_CHECK: &str = "farm.kunit";

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: does not match {FARM_SCHEMA_FILE}: {reason}")]
    Schema { file: String, reason: String },
    #[error("{file}: {what}")]
    Invalid { file: String, what: String },
}

/// One check a run must report.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Planned {
    pub id: String,
    pub variant: Option<String>,
}

/// What a farm run must report: every check per variant, KUnit when a KUnit
/// kernel is part of the run, and the differential of each check when both
/// variants run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub variants: Vec<String>,
    pub kunit: bool,
    pub checks: Vec<Planned>,
}

impl Plan {
    pub fn new(variants: &[&str], kunit: bool) -> Plan {
        let mut checks = Vec::new();
        for v in variants {
            for id in FARM_CHECKS {
                checks.push(Planned {
                    id: id.to_string(),
                    variant: Some(v.to_string()),
                });
            }
        }
        if kunit {
            checks.push(Planned {
                id: KUNIT_CHECK.into(),
                variant: Some("rust".into()),
            });
        }
        if variants.contains(&"rust") && variants.contains(&"c") {
            for id in FARM_CHECKS {
                checks.push(Planned {
                    id: differential_id(id),
                    variant: None,
                });
            }
        }
        Plan {
            variants: variants.iter().map(|v| v.to_string()).collect(),
            kunit,
            checks,
        }
    }

    /// Keep only the checks of these families (`farm.link_flap` keeps both
    /// of its parameter sets and their differentials); empty keeps all.
    pub fn only(mut self, families: &[String]) -> Plan {
        if families.is_empty() {
            return self;
        }
        let family = |id: &str| {
            let id = id.replace("farm.differential.", "farm.");
            id.split('[').next().unwrap_or("").to_string()
        };
        self.checks.retain(|c| families.contains(&family(&c.id)));
        self.kunit = self.kunit && families.iter().any(|f| f == KUNIT_CHECK);
        self
    }

    /// The families this plan covers, in plan order (`farm.link_flap` once
    /// for both of its parameter sets; the differentials are not families).
    pub fn families(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in &self.checks {
            if c.id.starts_with("farm.differential.") {
                continue;
            }
            let f = c.id.split('[').next().unwrap_or(&c.id).to_string();
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }

    fn planned(&self, id: &str, variant: Option<&str>) -> bool {
        self.checks
            .iter()
            .any(|c| c.id == id && c.variant.as_deref() == variant)
    }

    /// A result id the plan allows: a planned check, or a KUnit case under
    /// a planned KUnit check (`farm.kunit.<case>`).
    fn allows(&self, id: &str, variant: Option<&str>) -> bool {
        self.planned(id, variant)
            || (id
                .strip_prefix(KUNIT_CHECK)
                .is_some_and(|rest| rest.starts_with('.'))
                && self.planned(KUNIT_CHECK, variant))
    }
}

/// The family `phyfarm run` measures apart, base and revision back to back.
pub const THROUGHPUT_FAMILY: &str = "farm.throughput";

/// The check families of [`FARM_CHECKS`] (`farm.link_flap` once for both
/// of its parameter sets): what `phyfarm run` plans by default.
pub fn farm_families() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in FARM_CHECKS {
        let f = c.split('[').next().unwrap_or(c).to_string();
        if !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// The pytest `-k` expression that runs these check families, after
/// checking each is one: `farm.link_flap,farm.probe` -> `link_flap or probe`.
pub fn keyword_for(families: &[String]) -> Result<Option<String>, ContractError> {
    if families.is_empty() {
        return Ok(None);
    }
    let known: Vec<&str> = FARM_CHECKS
        .iter()
        .map(|c| c.split('[').next().unwrap_or(c))
        .chain([KUNIT_CHECK])
        .collect();
    let mut words = Vec::new();
    for f in families {
        if !known.contains(&f.as_str()) {
            return Err(ContractError::Invalid {
                file: "--checks".into(),
                what: format!(
                    "{f:?} is not a farm check family; one of: {}",
                    dedup(&known).join(", ")
                ),
            });
        }
        words.push(f.trim_start_matches("farm.").to_string());
    }
    Ok(Some(words.join(" or ")))
}

fn dedup<'a>(v: &[&'a str]) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for x in v {
        if !out.contains(x) {
            out.push(x);
        }
    }
    out
}

/// `farm.link_flap[plain]` -> `farm.differential.link_flap[plain]`.
pub fn differential_id(id: &str) -> String {
    format!("farm.differential.{}", id.trim_start_matches("farm."))
}

/// A check id: dotted lower-case words, then optionally `[params]`. The
/// schema file holds the same pattern.
pub fn valid_check_id(id: &str) -> bool {
    let (head, params) = match id.split_once('[') {
        Some((h, p)) => match p.strip_suffix(']') {
            Some(p) => (h, Some(p)),
            None => return false,
        },
        None => (id, None),
    };
    let word = |w: &str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    id.len() <= 200
        && head.starts_with(|c: char| c.is_ascii_lowercase())
        && head.split('.').all(word)
        && params.map_or(true, |p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_,=+-".contains(&b))
        })
}

/// A farm `results.json` (schema 2), as the harness writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FarmResults {
    pub schema: u32,
    #[serde(default)]
    pub reproducer: String,
    pub started: String,
    pub finished: String,
    #[serde(default)]
    pub duration: f64,
    #[serde(default)]
    pub environment: BTreeMap<String, serde_json::Value>,
    pub status: Status,
    pub counts: BTreeMap<Status, u32>,
    pub tests: Vec<FarmTest>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FarmTest {
    pub id: String,
    #[serde(default)]
    pub nodeid: String,
    pub variant: Option<String>,
    pub status: Status,
    pub duration: f64,
    pub message: String,
    pub measurements: Vec<FarmMeasurement>,
    #[serde(default)]
    pub subtests: Vec<FarmSubtest>,
    #[serde(default)]
    pub logs: Option<String>,
    #[serde(default)]
    pub accel: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FarmMeasurement {
    pub name: String,
    pub value: f64,
    pub unit: String,
    #[serde(default)]
    pub samples: Vec<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FarmSubtest {
    pub name: String,
    #[serde(default)]
    pub suite: Option<String>,
    pub status: Status,
    #[serde(default)]
    pub message: String,
}

impl FarmResults {
    /// Read and check a farm `results.json`; None when the file is absent.
    pub fn load(path: &Path) -> Result<Option<FarmResults>, ContractError> {
        let file = path.display().to_string();
        let text = match read_nofollow(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ContractError::Io { file, source }),
        };
        let r: FarmResults = serde_json::from_str(&text).map_err(|e| ContractError::Schema {
            file: file.clone(),
            reason: format!("line {} column {}: {e}", e.line(), e.column()),
        })?;
        r.check()
            .map_err(|reason| ContractError::Schema { file, reason })?;
        Ok(Some(r))
    }

    /// What serde cannot say: the schema version, id and name patterns,
    /// variants, finite numbers.
    pub fn check(&self) -> Result<(), String> {
        if self.schema != FARM_SCHEMA {
            return Err(format!(
                "schema is {}, this phyfarm reads {FARM_SCHEMA}",
                self.schema
            ));
        }
        for (i, t) in self.tests.iter().enumerate() {
            let at = format!("tests[{i}]");
            if !valid_check_id(&t.id) {
                return Err(format!("{at}.id {:?} is not a check id", t.id));
            }
            if let Some(v) = &t.variant {
                if v != "rust" && v != "c" {
                    return Err(format!("{at}.variant {v:?} is not rust or c"));
                }
            }
            if !t.duration.is_finite() || t.duration < 0.0 {
                return Err(format!("{at}.duration must be a finite number >= 0"));
            }
            for (j, m) in t.measurements.iter().enumerate() {
                let ok_name = m.name.len() <= 80
                    && m.name.starts_with(|c: char| c.is_ascii_lowercase())
                    && m.name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !ok_name {
                    return Err(format!(
                        "{at}.measurements[{j}].name {:?} is not [a-z][a-z0-9_]*",
                        m.name
                    ));
                }
                if !m.value.is_finite() || m.samples.iter().any(|s| !s.is_finite()) {
                    return Err(format!("{at}.measurements[{j}] ({}): not finite", m.name));
                }
            }
        }
        Ok(())
    }
}

/// Read a file the run wrote without following a symlink in its place (the
/// run folder may hold what untrusted code produced); at most 64 MiB.
fn read_nofollow(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut s = String::new();
    f.take(crate::results::MAX_RESULTS_BYTES + 1)
        .read_to_string(&mut s)?;
    if s.len() as u64 > crate::results::MAX_RESULTS_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} MiB: refused unread",
                crate::results::MAX_RESULTS_BYTES >> 20
            ),
        ));
    }
    Ok(s)
}

/// Where the retry of a farm run writes its results.
pub fn retry_dir(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push("-retry");
    out.with_file_name(name)
}

/// Farm tests and measurements of one set of kernels, ready for the store.
#[derive(Debug, Clone, Default)]
pub struct FarmImport {
    pub tests: Vec<TestResult>,
    pub measurements: Vec<Measurement>,
    /// The accelerator the farm's guests ran under (`kvm`, `tcg`), as its
    /// results say; empty when none did.
    pub accel: String,
}

/// Import the farm run in `dir` (and its retry) against `plan`. `failure`
/// says why the farm run itself failed, if it did; with no results.json,
/// every planned check is ERROR with that reason.
pub fn import(dir: &Path, plan: &Plan, failure: Option<&str>) -> Result<FarmImport, ContractError> {
    import_all(&[dir.to_path_buf()], plan, failure)
}

/// Import farm runs that each covered part of `plan` (a CI matrix of
/// variant x check group), each with its retry. A planned check no run
/// reported is MISS; if a run left no results.json (pytest died), the
/// unreported checks are ERROR instead, since that run may have held them.
pub fn import_all(
    dirs: &[PathBuf],
    plan: &Plan,
    failure: Option<&str>,
) -> Result<FarmImport, ContractError> {
    let mut out = FarmImport::default();
    let mut seen = Seen::new();
    let mut dead: Vec<String> = Vec::new();
    for dir in dirs {
        let path = dir.join("results.json");
        let Some(first) = FarmResults::load(&path)? else {
            dead.push(path.display().to_string());
            continue;
        };
        if out.accel.is_empty() {
            out.accel = accel_of(&first);
        }
        add_run(&mut out, &mut seen, &first, plan, &path, 0)?;
        let retry = retry_dir(dir).join("results.json");
        if let Some(again) = FarmResults::load(&retry)? {
            add_run(&mut out, &mut seen, &again, plan, &retry, 1)?;
        }
    }
    // Planned and not reported: MISS, or ERROR when a run died.
    for c in &plan.checks {
        if c.id.starts_with("farm.differential.") {
            continue;
        }
        if seen.contains(&(c.id.clone(), c.variant.clone(), 0)) {
            continue;
        }
        let (status, why) = if dead.is_empty() {
            (
                Status::Miss,
                format!(
                    "MISS: planned but not reported by the farm ({}){}",
                    dirs.iter()
                        .map(|d| d.join("results.json").display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    failure.map(|f| format!(": {f}")).unwrap_or_default()
                ),
            )
        } else {
            (
                Status::Error,
                format!(
                    "ERROR: {} ({})",
                    failure.unwrap_or("the farm wrote no results.json"),
                    dead.join(", ")
                ),
            )
        };
        out.tests.push(TestResult {
            path: c.id.clone(),
            variant: c.variant.clone(),
            status,
            duration_s: None,
            log_path: None,
            log_excerpt: why,
            attempt: 0,
        });
    }
    if plan.variants.iter().any(|v| v == "rust") && plan.variants.iter().any(|v| v == "c") {
        out.tests.extend(differential(&out, plan));
    }
    Ok(out)
}

/// What a farm run's environment says of its guests, a line each: the
/// accelerator and the link partner, each with why.
pub fn environment_lines(env: &BTreeMap<String, serde_json::Value>) -> Vec<String> {
    let s = |k: &str| env.get(k).and_then(|v| v.as_str()).unwrap_or_default();
    [("accelerator", "accel"), ("link partner", "partner")]
        .into_iter()
        .filter(|(_, k)| !s(k).is_empty())
        .map(|(what, k)| match s(&format!("{k}_reason")) {
            "" => format!("{what}: {}", s(k)),
            why => format!("{what}: {} ({why})", s(k)),
        })
        .collect()
}

/// The accelerator a farm run names (`kvm` or `tcg`), else "".
fn accel_of(r: &FarmResults) -> String {
    r.environment
        .get("accel")
        .and_then(|v| v.as_str())
        .filter(|a| matches!(*a, "kvm" | "tcg"))
        .unwrap_or_default()
        .to_string()
}

/// The (id, variant, attempt) triples imported so far: a duplicate or a
/// retry without its first attempt is found in one look-up, so an import is
/// linear in the number of results (a KUnit kernel reports thousands).
type Seen = std::collections::HashSet<(String, Option<String>, u32)>;

fn add_run(
    out: &mut FarmImport,
    seen: &mut Seen,
    r: &FarmResults,
    plan: &Plan,
    path: &Path,
    attempt: u32,
) -> Result<(), ContractError> {
    let file = path.display().to_string();
    for (i, t) in r.tests.iter().enumerate() {
        // The differential is phyfarm's own comparison of the two variants,
        // never the farm's word.
        if t.id.starts_with("farm.differential.") {
            return Err(ContractError::Invalid {
                file,
                what: format!(
                    "tests[{i}].id {:?}: differentials are computed by phyfarm, not reported by the farm",
                    t.id
                ),
            });
        }
        if !plan.allows(&t.id, t.variant.as_deref()) {
            return Err(ContractError::Invalid {
                file,
                what: format!(
                    "tests[{i}].id {:?} (variant {}) is not in the run's plan ({})",
                    t.id,
                    t.variant.as_deref().unwrap_or("none"),
                    plan.checks.len()
                ),
            });
        }
        if !seen.insert((t.id.clone(), t.variant.clone(), attempt)) {
            return Err(ContractError::Invalid {
                file,
                what: format!("tests[{i}].id {:?} is reported twice", t.id),
            });
        }
        if attempt == 1 && !seen.contains(&(t.id.clone(), t.variant.clone(), 0)) {
            return Err(ContractError::Invalid {
                file,
                what: format!(
                    "tests[{i}].id {:?}: a retry of a check that never ran",
                    t.id
                ),
            });
        }
        out.tests.push(TestResult {
            path: t.id.clone(),
            variant: t.variant.clone(),
            status: t.status,
            duration_s: Some(t.duration),
            log_path: t.logs.clone(),
            log_excerpt: crate::results::tail_excerpt(
                &t.message,
                crate::results::MAX_EXCERPT_BYTES,
            )
            .to_string(),
            attempt,
        });
        if attempt == 1 {
            continue;
        }
        for m in &t.measurements {
            out.measurements.push(Measurement {
                name: format!("{}.{}", t.id, m.name),
                variant: t.variant.clone(),
                value: m.value,
                unit: m.unit.clone(),
                samples: if m.samples.is_empty() {
                    vec![m.value]
                } else {
                    m.samples.clone()
                },
                lower_is_better: matches!(m.unit.as_str(), "s" | "%" | "ms"),
            });
        }
    }
    Ok(())
}

/// The final status of each check after its retry.
fn final_status(tests: &[TestResult], id: &str, variant: &str) -> Option<(Status, String)> {
    let mut found = None;
    for t in tests
        .iter()
        .filter(|t| t.path == id && t.variant.as_deref() == Some(variant))
    {
        if found.as_ref().map_or(true, |(a, _, _)| t.attempt >= *a) {
            found = Some((t.attempt, t.status, t.log_excerpt.clone()));
        }
    }
    found.map(|(_, s, x)| (s, x))
}

/// Rust against C, check by check, as the verdict judges a pair
/// ([`differential::compare`]): one result per planned differential.
pub fn differential(imp: &FarmImport, plan: &Plan) -> Vec<TestResult> {
    let mut out = Vec::new();
    for id in FARM_CHECKS {
        let (rust, c) = (
            final_status(&imp.tests, id, "rust"),
            final_status(&imp.tests, id, "c"),
        );
        if !plan.planned(&differential_id(id), None) {
            continue;
        }
        let (status, message) = match (rust, c) {
            (Some((r, rx)), Some((c, cx))) => {
                differential::compare(id, (r, &rx), (c, &cx), &imp.measurements)
            }
            _ => (Status::Miss, "MISS: a variant did not report".to_string()),
        };
        out.push(TestResult {
            path: differential_id(id),
            variant: None,
            status,
            duration_s: None,
            log_path: None,
            log_excerpt: message,
            attempt: 0,
        });
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
