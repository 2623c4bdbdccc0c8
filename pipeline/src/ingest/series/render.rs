//! The human summary of a series.

use super::Series;

/// Text from a patch made safe for a terminal: control characters escaped.
fn clean(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// A human summary of a series, as `phyfarm series show` prints it.
pub fn render_text(s: &Series) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut flags = String::new();
    if s.rfc {
        flags.push_str(" RFC");
    }
    if s.resend {
        flags.push_str(" RESEND");
    }
    let total = s.patches.first().map_or(0, |p| p.total);
    let _ = writeln!(
        out,
        "series v{}{} {} ({} of {} patches) from {}",
        s.version,
        flags,
        clean(s.tree.as_deref().unwrap_or("(no tree)")),
        s.patches.len(),
        total,
        s.source.display()
    );
    let none = "(none)";
    let _ = writeln!(
        out,
        "  change-id:     {}",
        clean(s.change_id.as_deref().unwrap_or(none))
    );
    let _ = writeln!(
        out,
        "  base-commit:   {}",
        clean(s.base_commit.as_deref().unwrap_or(none))
    );
    let _ = writeln!(out, "  patchset_hash: {}", s.patchset_hash);
    if let Some(c) = &s.cover {
        let _ = writeln!(
            out,
            "  0/{} {}\n      {} <{}>, {}",
            c.total,
            clean(&c.subject),
            clean(&c.author),
            clean(&c.author_email),
            clean(c.date.as_deref().unwrap_or(none))
        );
    }
    for p in &s.patches {
        let _ = writeln!(out, "  {}/{} {}", p.index, p.total, clean(&p.subject));
        let _ = writeln!(
            out,
            "      author:   {} <{}>, {}",
            clean(&p.author),
            clean(&p.author_email),
            clean(p.date.as_deref().unwrap_or(none))
        );
        let _ = writeln!(out, "      patch-id: {}", p.patch_id);
        let files: Vec<String> = p.files_touched.iter().map(|f| clean(f)).collect();
        let _ = writeln!(
            out,
            "      files:    {}{}",
            files.join(", "),
            if p.binary { " (binary)" } else { "" }
        );
    }
    out
}
