//! Measurements across the revisions of each series: throughput and
//! link-flap timings, each point with the base's median and span and its call.

use std::collections::BTreeMap;

use phyfarm::results::Timestamp;
use phyfarm::store::Store;
use phyfarm::verdict::{Band, Movement};
use serde::Serialize;

use super::{report, PageError};

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub revision: String,
    pub version: u32,
    pub value: f64,
    pub samples: usize,
    pub band: Option<Band>,
    pub movement: Movement,
    /// The call as it was decided (`MeasurementDelta::call_text`).
    pub call: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    pub name: String,
    pub variant: Option<String>,
    pub unit: String,
    /// `throughput`, `link-flap` or `other`.
    pub kind: &'static str,
    /// By revision version.
    pub points: Vec<Point>,
}

impl Chart {
    pub fn title(&self) -> String {
        match &self.variant {
            Some(v) => format!("{} ({v})", self.name),
            None => self.name.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TrendGroup {
    pub series: String,
    pub charts: Vec<Chart>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trends {
    pub generated: Timestamp,
    pub groups: Vec<TrendGroup>,
}

fn kind(name: &str) -> &'static str {
    if name.contains("throughput") {
        "throughput"
    } else if name.contains("flap") {
        "link-flap"
    } else {
        "other"
    }
}

pub fn trends(store: &dyn Store, now: Timestamp) -> Result<Trends, PageError> {
    type Key = (String, Option<String>);
    let mut groups: BTreeMap<String, BTreeMap<Key, Chart>> = BTreeMap::new();
    for rec in store.revisions()? {
        let rep = report(store, &rec.reference(), now)?;
        let charts = groups.entry(rec.info.series.clone()).or_default();
        for m in &rep.measurements {
            let c = charts
                .entry((m.name.clone(), m.variant.clone()))
                .or_insert_with(|| Chart {
                    name: m.name.clone(),
                    variant: m.variant.clone(),
                    unit: m.unit.clone(),
                    kind: kind(&m.name),
                    points: vec![],
                });
            c.points.push(Point {
                revision: rep.revision.to_string(),
                version: rec.info.version,
                value: m.value,
                samples: m.samples,
                band: m.base,
                movement: m.movement,
                call: m.call_text(),
            });
        }
    }
    let groups = groups
        .into_iter()
        .map(|(series, charts)| {
            let mut charts: Vec<Chart> = charts.into_values().collect();
            for c in &mut charts {
                c.points.sort_by_key(|p| p.version);
            }
            let order = |k: &str| match k {
                "throughput" => 0,
                "link-flap" => 1,
                _ => 2,
            };
            let variant =
                |v: &Option<String>| v.as_deref().map(|v| (v != "rust", v != "c", v.to_string()));
            charts.sort_by_key(|c| (order(c.kind), c.name.clone(), variant(&c.variant)));
            TrendGroup { series, charts }
        })
        .filter(|g| !g.charts.is_empty())
        .collect();
    Ok(Trends {
        generated: now,
        groups,
    })
}
