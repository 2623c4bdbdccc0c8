//! b4's CI-check protocol: one RFC 2822 message on stdin, a JSON array of
//! `{tool, status: pass|warn|fail, summary, url, details}` on stdout; `[]`
//! when phyfarm has nothing on that message.
//!
//! The patch is found by its Message-ID, else by `git patch-id --stable`
//! (the same change re-posted), newest revision first. A cover letter gets
//! the series-level checks. Each patchwork context becomes one b4 tool
//! column; `pending` is shown as `warn` (b4 has no pending).

use serde::Serialize;

use super::patchwork::{self, CheckState4};
use super::{Bundle, ExportError};
use crate::results::{RevisionRef, Timestamp};
use crate::store::Store;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct B4Result {
    pub tool: String,
    pub status: &'static str,
    pub summary: String,
    pub url: String,
    pub details: String,
}

/// The Message-ID header of a mail, without angle brackets.
pub fn message_id(mail: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(mail);
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            if let Some(c) = current.as_mut() {
                c.push_str(line.trim());
            }
            continue;
        }
        if current.is_some() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("message-id") {
                current = Some(value.trim().to_string());
            }
        }
    }
    current
        .map(|c| {
            c.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
        .filter(|c| !c.is_empty())
}

fn status(s: CheckState4) -> &'static str {
    match s {
        CheckState4::Success => "pass",
        CheckState4::Warning | CheckState4::Pending => "warn",
        CheckState4::Fail => "fail",
    }
}

/// The b4 results for one mail.
pub fn check(
    store: &dyn Store,
    mail: &[u8],
    now: Timestamp,
    dashboard: &str,
) -> Result<Vec<B4Result>, ExportError> {
    let mid = message_id(mail);
    let pid = crate::ingest::series::patch_id_stable(mail);
    let hits = store.find_patch(mid.as_deref(), pid.as_deref())?;
    let by_mid = hits
        .iter()
        .filter(|h| h.by_message_id)
        .max_by_key(|h| h.revision.version);
    let hit = by_mid.or_else(|| hits.iter().max_by_key(|h| h.revision.version));
    let (revision, position, how): (RevisionRef, Option<u32>, String) = match hit {
        Some(h) => (
            h.revision.clone(),
            Some(h.position),
            if h.by_message_id {
                "matched by Message-ID".into()
            } else {
                format!("matched by patch-id {}", pid.as_deref().unwrap_or(""))
            },
        ),
        None => {
            let cover = mid.as_deref().and_then(|m| {
                store
                    .revisions()
                    .ok()?
                    .into_iter()
                    .find(|r| r.info.message_id.as_deref() == Some(m))
            });
            match cover {
                Some(r) => (
                    r.reference(),
                    None,
                    "matched the cover letter's Message-ID".into(),
                ),
                None => return Ok(vec![]),
            }
        }
    };
    let b = Bundle::gather(store, &revision, now, dashboard)?;
    let checks = match position {
        Some(p) => patchwork::patch_checks(&b, p),
        None => patchwork::patch_checks(&b, 0)
            .into_iter()
            .filter(|c| {
                !c.context.starts_with("phyfarm-apply") && !c.context.starts_with("phyfarm-build-")
            })
            .collect(),
    };
    let state = b
        .report
        .state
        .map_or("not yet recorded".into(), |s| s.to_string());
    let at = position.map_or("series".to_string(), |p| format!("patch {p}"));
    Ok(checks
        .into_iter()
        .map(|c| B4Result {
            tool: c.context.clone(),
            status: status(c.state),
            summary: format!("{}: {}", c.state_word(), c.description),
            url: c.target_url.clone(),
            details: format!(
                "{revision} {at} ({how}); verdict {state}: {}\n{}",
                b.report.reason, c.description
            ),
        })
        .collect())
}

impl patchwork::Check {
    fn state_word(&self) -> &'static str {
        match self.state {
            CheckState4::Success => "success",
            CheckState4::Warning => "warning",
            CheckState4::Pending => "pending",
            CheckState4::Fail => "fail",
        }
    }
}
