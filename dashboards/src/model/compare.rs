//! Two revisions side by side: patches, checks, measurements.

use std::collections::{BTreeMap, BTreeSet};

use phyfarm::results::{RevisionRef, Status, Timestamp};
use phyfarm::store::Store;
use phyfarm::verdict::{compare, Band, CheckKey, FindingKind};
use serde::Serialize;

use super::{clean, report, PageError, RevisionSummary};

#[derive(Debug, Clone, Serialize)]
pub struct PatchPair {
    pub position: u32,
    pub a: Option<String>,
    pub b: Option<String>,
    /// Same `git patch-id --stable`: the change is identical.
    pub same_patch_id: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompareRow {
    pub path: String,
    pub variant: Option<String>,
    pub a: Option<Status>,
    pub b: Option<Status>,
    /// B against A: new-failure, fixed, still-failing, incomplete.
    pub change: Option<FindingKind>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MeasurementPair {
    pub name: String,
    pub variant: Option<String>,
    pub unit: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// (b − a) / a, in percent.
    pub delta_pct: Option<f64>,
    /// The base's samples, median and span (from B's comparison, else A's).
    pub band: Option<Band>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ComparePage {
    pub generated: Timestamp,
    pub a: RevisionSummary,
    pub b: RevisionSummary,
    pub patches: Vec<PatchPair>,
    pub checks: Vec<CompareRow>,
    pub measurements: Vec<MeasurementPair>,
}

/// The compare form: every revision to pick from.
#[derive(Debug, Clone, Serialize)]
pub struct ComparePick {
    pub generated: Timestamp,
    pub revisions: Vec<String>,
    /// Suggested pairs: each revision with its predecessor.
    pub pairs: Vec<(String, String)>,
}

pub fn pick(store: &dyn Store, now: Timestamp) -> Result<ComparePick, PageError> {
    let all = store.revisions()?;
    let pairs = all
        .iter()
        .filter_map(|r| {
            phyfarm::store::previous_revision(&all, r)
                .map(|p| (p.reference().to_string(), r.reference().to_string()))
        })
        .collect();
    Ok(ComparePick {
        generated: now,
        revisions: all.iter().map(|r| r.reference().to_string()).collect(),
        pairs,
    })
}

pub fn compare_page(
    store: &dyn Store,
    a: &RevisionRef,
    b: &RevisionRef,
    now: Timestamp,
) -> Result<ComparePage, PageError> {
    let ra = store.revision(a)?;
    let rb = store.revision(b)?;
    let pa = report(store, &ra.reference(), now)?;
    let pb = report(store, &rb.reference(), now)?;

    let n = ra.info.patches.len().max(rb.info.patches.len()) as u32;
    let find = |rec: &phyfarm::store::RevisionRecord, i: u32| {
        rec.info.patches.iter().find(|p| p.position == i).cloned()
    };
    let patches = (1..=n)
        .map(|i| {
            let (x, y) = (find(&ra, i), find(&rb, i));
            PatchPair {
                position: i,
                same_patch_id: matches!((&x, &y), (Some(x), Some(y)) if x.patch_id == y.patch_id),
                a: x.map(|p| clean(&p.subject)),
                b: y.map(|p| clean(&p.subject)),
            }
        })
        .collect();

    let changes: BTreeMap<CheckKey, FindingKind> = compare::compare(&pb.checks, &pa.checks, false)
        .into_iter()
        .map(|f| (f.check, f.kind))
        .collect();
    let keys: BTreeSet<&CheckKey> = pa.checks.keys().chain(pb.checks.keys()).collect();
    let checks = keys
        .into_iter()
        .map(|k| CompareRow {
            path: k.path.clone(),
            variant: k.variant.clone(),
            a: pa.checks.get(k).map(|c| c.status),
            b: pb.checks.get(k).map(|c| c.status),
            change: changes.get(k).copied(),
        })
        .collect();

    type MKey = (String, Option<String>);
    let mut ms: BTreeMap<MKey, MeasurementPair> = BTreeMap::new();
    for (side, rep) in [(0, &pa), (1, &pb)] {
        for m in &rep.measurements {
            let e = ms
                .entry((m.name.clone(), m.variant.clone()))
                .or_insert_with(|| MeasurementPair {
                    name: m.name.clone(),
                    variant: m.variant.clone(),
                    unit: m.unit.clone(),
                    a: None,
                    b: None,
                    delta_pct: None,
                    band: None,
                });
            if side == 0 {
                e.a = Some(m.value);
            } else {
                e.b = Some(m.value);
            }
            e.band = m.base.or(e.band);
        }
    }
    let measurements = ms
        .into_values()
        .map(|mut m| {
            m.delta_pct = match (m.a, m.b) {
                (Some(a), Some(b)) if a != 0.0 => Some((b - a) / a * 100.0),
                _ => None,
            };
            m
        })
        .collect();

    Ok(ComparePage {
        generated: now,
        a: RevisionSummary::new(&ra, &pa, now),
        b: RevisionSummary::new(&rb, &pb, now),
        patches,
        checks,
        measurements,
    })
}
