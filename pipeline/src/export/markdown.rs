//! A markdown summary for a pull-request comment or a GitHub check run:
//! the state and why, what counts against the series, what got fixed, the
//! flaky checks, the measurements with their call as it was decided (the
//! test, the effect, p, the samples, the power) beside the base's band, and the link to
//! the dashboard. Every string from a patch or a log is escaped.

use super::patchwork::{self, CheckState4};
use super::Bundle;
use crate::verdict::{FindingKind, Movement};

/// A zero-width space: it breaks GitHub's @mentions and autolinks without
/// changing what a reader sees.
const ZWSP: char = '\u{200B}';

/// Escape markdown (and inline HTML) so patch text renders as text, and
/// neutralise what GitHub would act on: `@name` mentions (notifications)
/// and bare `scheme://` or `www.` links (autolinks).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let next = |k: usize| chars.get(i + k).copied();
        if c == '@' {
            out.push('@');
            out.push(ZWSP);
            continue;
        }
        if c == ':' && next(1) == Some('/') && next(2) == Some('/') {
            out.push(':');
            out.push(ZWSP);
            continue;
        }
        if matches!(c, 'w' | 'W')
            && (i == 0 || !chars[i - 1].is_alphanumeric())
            && next(1).is_some_and(|x| x.eq_ignore_ascii_case(&'w'))
            && next(2).is_some_and(|x| x.eq_ignore_ascii_case(&'w'))
            && next(3) == Some('.')
        {
            out.push(c);
            out.push(ZWSP);
            continue;
        }
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '(' | ')' | '#' | '|' | '!' | '~' | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn icon(s: CheckState4) -> &'static str {
    match s {
        CheckState4::Success => "✅ success",
        CheckState4::Warning => "⚠️ warning",
        CheckState4::Pending => "⏳ pending",
        CheckState4::Fail => "❌ fail",
    }
}

// Long: the summary's sections one after another, in the order a reader meets them.
pub fn export(b: &Bundle) -> String {
    let rep = &b.report;
    let mut s = String::new();
    let state = rep
        .state
        .map_or("not yet recorded".to_string(), |s| s.to_string());
    s.push_str(&format!(
        "### phyfarm: {} is **{state}**\n\n",
        escape(&rep.revision.to_string())
    ));
    if !rep.reason.is_empty() {
        s.push_str(&format!("> {}\n\n", escape(&rep.reason)));
    }
    s.push_str("| patch | apply | build |\n|---|---|---|\n");
    for p in &b.revision.info.patches {
        let checks = patchwork::patch_checks(b, p.position);
        let apply = checks.iter().find(|c| c.context == "phyfarm-apply");
        let builds: Vec<String> = checks
            .iter()
            .filter(|c| c.context.starts_with("phyfarm-build-"))
            .map(|c| {
                format!(
                    "{}: {}",
                    c.context.trim_start_matches("phyfarm-build-"),
                    icon(c.state)
                )
            })
            .collect();
        s.push_str(&format!(
            "| {}/{} {} | {} | {} |\n",
            p.position,
            b.revision.info.patches.len(),
            escape(&p.subject),
            apply.map_or("", |c| icon(c.state)),
            builds.join(", ")
        ));
    }
    s.push('\n');
    let section = |s: &mut String, title: &str, kind: FindingKind| {
        let f: Vec<_> = rep.vs_base.iter().filter(|f| f.kind == kind).collect();
        if f.is_empty() {
            return;
        }
        s.push_str(&format!("**{title}** ({})\n\n", f.len()));
        for x in f {
            s.push_str(&format!(
                "- `{}` {}",
                x.check.to_string().replace('`', "'"),
                x.status
            ));
            if !x.detail.is_empty() {
                s.push_str(&format!(": {}", escape(&x.detail)));
            }
            s.push('\n');
            // A command with a backquote cannot be shown as code as is.
            if let Some(c) = rep.reproducer(&x.check).filter(|c| !c.contains('`')) {
                s.push_str(&format!(
                    "  reproduce: `{}`\n",
                    crate::progress::printable(c)
                ));
            }
        }
        s.push('\n');
    };
    section(
        &mut s,
        "New failures against the base",
        FindingKind::NewFailure,
    );
    section(
        &mut s,
        "Could not complete (rerun needed)",
        FindingKind::Incomplete,
    );
    section(&mut s, "New warnings", FindingKind::NewWarning);
    section(
        &mut s,
        "Failing on the base too (not counted)",
        FindingKind::StillFailing,
    );
    section(&mut s, "Fixed", FindingKind::Fixed);
    for f in &rep.first_bad {
        s.push_str(&format!(
            "**First bad patch** of `{}`: {}\n\n",
            f.check.to_string().replace('`', "'"),
            escape(&f.name())
        ));
    }
    let flaky: Vec<_> = rep.flaky().collect();
    if !flaky.is_empty() {
        s.push_str(&format!(
            "**Flaky** ({}, not counted, listed)\n\n",
            flaky.len()
        ));
        for (k, c) in flaky {
            s.push_str(&format!(
                "- `{}`: {}\n",
                k.to_string().replace('`', "'"),
                escape(c.flaky.as_deref().unwrap_or(""))
            ));
            if let Some(c) = rep.reproducer(k).filter(|c| !c.contains('`')) {
                s.push_str(&format!(
                    "  reproduce: `{}`\n",
                    crate::progress::printable(c)
                ));
            }
        }
        s.push('\n');
    }
    if let Some(p) = &rep.previous {
        let changed: Vec<_> = rep
            .vs_previous
            .iter()
            .filter(|f| matches!(f.kind, FindingKind::NewFailure | FindingKind::Fixed))
            .collect();
        s.push_str(&format!(
            "Against {}: {} changed\n\n",
            escape(&p.to_string()),
            changed.len()
        ));
        for f in changed {
            s.push_str(&format!(
                "- {}: `{}`\n",
                f.kind.label(),
                f.check.to_string().replace('`', "'")
            ));
        }
        if !rep.vs_previous.is_empty() {
            s.push('\n');
        }
    }
    if !rep.measurements.is_empty() {
        s.push_str(
            "| measurement | median | base samples (lowest … highest) | Δ median | call |\n|---|---|---|---|---|\n",
        );
        for m in &rep.measurements {
            let band = m.base.map_or("—".to_string(), |b| {
                format!("{:.4e} … {:.4e} (n={})", b.low, b.high, b.samples)
            });
            let mark = if m.movement == Movement::Regression {
                "❌ "
            } else {
                ""
            };
            let call = format!("{mark}{}", escape(&m.call_text()));
            s.push_str(&format!(
                "| {}{} | {:.4e} {} | {band} | {} | {call} |\n",
                escape(&m.name),
                m.variant
                    .as_deref()
                    .map(|v| format!(" ({})", escape(v)))
                    .unwrap_or_default(),
                m.value,
                escape(&m.unit),
                m.delta_pct.map_or("—".into(), |d| format!("{d:+.1}%")),
            ));
        }
        s.push('\n');
    }
    if let Some(at) = rep.ready_at {
        s.push_str(&format!(
            "Ready to merge at {at} unless someone objects.\n\n"
        ));
    }
    s.push_str(&format!("Details: {}\n", b.target_url()));
    s
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn mentions_and_bare_links_are_neutralised() {
        let e =
            escape("cc @torvalds see https://evil.example/x and WWW.evil.example, mail a@b.org");
        assert!(!e.contains("@torvalds"), "{e}");
        assert!(e.contains("@\u{200B}torvalds"), "{e}");
        assert!(!e.contains("https://"), "{e}");
        assert!(e.contains("https:\u{200B}//evil.example"), "{e}");
        assert!(!e.contains("WWW.evil"), "{e}");
        assert!(!e.contains("a@b.org"), "{e}");
        // An ordinary word ending in "www" is left alone.
        assert_eq!(escape("awww."), "awww.");
    }

    #[test]
    fn images_links_and_html_stay_text() {
        let e = escape("![x](https://t.example/p.png) [y](javascript:alert(1)) <img src=x>");
        assert!(e.starts_with("\\!\\[x\\]\\("), "{e}");
        assert!(!e.contains("<img"), "{e}");
        assert!(!e.contains("]("), "{e}");
    }
}
