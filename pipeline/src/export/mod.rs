//! The formats maintainers already read: KCIDB v5 JSON, patchwork checks,
//! JUnit XML, a markdown summary, and b4's CI-check JSON.
//!
//! Every exporter reads one [`Bundle`]: a revision, its complete runs, the
//! base run it was compared with, and the verdict report at one time. Nothing
//! here writes to the store.

pub mod b4;
pub mod junit;
pub mod kcidb;
pub mod markdown;
pub mod patchwork;
#[cfg(test)]
mod tests;

use crate::results::{RevisionRef, Run, Timestamp};
use crate::store::{RevisionRecord, RunState, Store, StoreError};
use crate::verdict::{self, Report, VerdictError};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Verdict(#[from] VerdictError),
    #[error("--dashboard-url {0:?}: must start with http:// or https://")]
    BadUrl(String),
}

/// What every exporter reads.
pub struct Bundle {
    pub revision: RevisionRecord,
    pub report: Report,
    /// Complete runs of the revision, oldest first.
    pub runs: Vec<Run>,
    /// The base run the verdict compared with.
    pub base: Option<Run>,
    /// Dashboard base URL without a trailing slash.
    pub dashboard: String,
}

/// Percent-encode one URL path segment.
pub fn url_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Bundle {
    pub fn gather(
        store: &dyn Store,
        r: &RevisionRef,
        now: Timestamp,
        dashboard: &str,
    ) -> Result<Bundle, ExportError> {
        let dashboard = dashboard.trim_end_matches('/');
        if !(dashboard.starts_with("http://") || dashboard.starts_with("https://"))
            || dashboard.contains(char::is_whitespace)
        {
            return Err(ExportError::BadUrl(dashboard.to_string()));
        }
        let report = verdict::evaluate(store, r, now)?;
        let revision = store.revision(&report.revision)?;
        let runs = store
            .runs(&report.revision)?
            .into_iter()
            .filter(|x| x.state == RunState::Complete && report.runs.contains(&x.run.id))
            .map(|x| x.run)
            .collect();
        let base = match &report.base_run {
            Some(id) => store.run(id)?.map(|x| x.run),
            None => None,
        };
        Ok(Bundle {
            revision,
            report,
            runs,
            base,
            dashboard: dashboard.to_string(),
        })
    }

    /// The dashboard page of the revision: `<base>/series/<name>/v<N>`.
    pub fn target_url(&self) -> String {
        format!(
            "{}/series/{}/v{}",
            self.dashboard,
            url_segment(&self.revision.info.series),
            self.revision.info.version
        )
    }
}
