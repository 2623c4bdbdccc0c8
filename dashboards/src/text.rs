//! Text that comes from patches and guests, made safe to show, and numbers
//! made readable.
//!
//! HTML escaping is maud's job (every `(value)` splice is escaped); this
//! module removes what escaping does not: ANSI escape sequences and other
//! control characters a guest console is full of.

use serde::Serialize;

/// `s` without ANSI escape sequences (CSI, OSC, and two-byte escapes) and
/// without control characters other than newline and tab. A carriage
/// return ends the line's earlier text, as on a terminal.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates, then one final byte @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC, DCS, SOS, PM, APC: up to BEL or ST (ESC \).
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                // A two-byte escape (ESC c, ESC 7, ESC ( B ...).
                Some('(' | ')' | '*' | '+') => {
                    chars.next();
                }
                _ => {}
            },
            // 8-bit CSI.
            '\u{9b}' => {
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    let start = out.rfind('\n').map_or(0, |i| i + 1);
                    out.truncate(start);
                }
            }
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// How a console line reads to a kernel developer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LineKind {
    /// Oops, BUG, panic, WARN, lockdep, KASAN: what a maintainer looks for.
    Oops,
    /// An ordinary error or warning line.
    Warn,
    Plain,
}

const OOPS: [&str; 16] = [
    "Oops",
    "BUG:",
    "BUG ",
    "Kernel panic",
    "kernel BUG",
    "WARNING:",
    "------------[ cut here ]",
    "Call Trace",
    "RIP:",
    "general protection fault",
    "KASAN:",
    "UBSAN:",
    "possible circular locking",
    "lockdep",
    "rust_panic",
    "panicked at",
];

pub fn classify(line: &str) -> LineKind {
    if OOPS.iter().any(|p| line.contains(p)) {
        return LineKind::Oops;
    }
    let l = line.to_ascii_lowercase();
    if l.contains("error") || l.contains("warning") || l.contains("fail") || l.contains("timed out")
    {
        LineKind::Warn
    } else {
        LineKind::Plain
    }
}

/// A log excerpt as lines, cleaned and classified.
#[derive(Debug, Clone, Serialize)]
pub struct LogLine {
    pub kind: LineKind,
    pub text: String,
}

pub fn log_lines(raw: &str) -> Vec<LogLine> {
    strip_ansi(raw)
        .lines()
        .map(|l| LogLine {
            kind: classify(l),
            text: l.to_string(),
        })
        .collect()
}

/// A value and its unit scaled for reading: `94.07 Mbit/s`, `1.25 s`.
pub fn human(value: f64, unit: &str) -> String {
    let (v, u) = scale(value, unit, value.abs());
    format!("{} {u}", sig(v))
}

/// The factor and unit to show values of magnitude `typical` in.
pub fn unit_scale(unit: &str, typical: f64) -> (f64, String) {
    let (prefixes, base): (&[(f64, &str)], &str) = match unit {
        "bit/s" | "b/s" | "bps" => (
            &[(1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")],
            "bit/s",
        ),
        "B/s" => (&[(1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")], "B/s"),
        "s" => {
            return if typical != 0.0 && typical < 1.0 {
                (1e-3, "ms".into())
            } else {
                (1.0, "s".into())
            }
        }
        "ms" => {
            return if typical >= 1000.0 {
                (1e3, "s".into())
            } else {
                (1.0, "ms".into())
            }
        }
        other => return (1.0, other.to_string()),
    };
    for (f, u) in prefixes {
        if typical >= *f {
            return (*f, (*u).to_string());
        }
    }
    (1.0, base.to_string())
}

fn scale(value: f64, unit: &str, typical: f64) -> (f64, String) {
    let (f, u) = unit_scale(unit, typical);
    (value / f, u)
}

/// Four significant digits at most, without trailing zeros.
pub fn sig(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    let decimals = if a >= 1000.0 {
        0
    } else if a >= 100.0 {
        1
    } else if a >= 10.0 {
        2
    } else {
        3
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A duration in seconds as `1 h 02 min`, `4 min 10 s`, `12.5 s`.
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "–".into();
    }
    let s = secs.round() as i64;
    if s >= 3600 {
        format!("{} h {:02} min", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{} s", sig(secs))
    }
}

/// Hours as `2 d 5 h`, `5 h 20 min`, `40 min`.
pub fn hours(h: f64) -> String {
    let mins = (h * 60.0).round().max(0.0) as i64;
    let (d, hh, mm) = (mins / 1440, mins % 1440 / 60, mins % 60);
    if d > 0 {
        format!("{d} d {hh} h")
    } else if hh > 0 {
        format!("{hh} h {mm:02} min")
    } else {
        format!("{mm} min")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_sequences_are_removed() {
        let raw = "\u{1b}[1;31mred\u{1b}[0m \u{1b}]0;title\u{7}ok\u{1b}(B\u{1b}[2K\tx\u{0}\u{8}";
        assert_eq!(strip_ansi(raw), "red ok\tx");
        assert_eq!(
            strip_ansi("\u{1b}]8;;http://x\u{1b}\\link\u{1b}]8;;\u{1b}\\"),
            "link"
        );
        assert_eq!(strip_ansi("50%\r100%\ndone\r\n"), "100%\ndone\n");
        // A truncated sequence at the end never panics.
        assert_eq!(strip_ansi("a\u{1b}["), "a");
        assert_eq!(strip_ansi("a\u{1b}"), "a");
    }

    #[test]
    fn oops_lines_stand_out() {
        assert_eq!(
            classify("[   12.3] BUG: kernel NULL pointer dereference"),
            LineKind::Oops
        );
        assert_eq!(
            classify("WARNING: CPU: 0 PID: 1 at drivers/net/phy/phy.c"),
            LineKind::Oops
        );
        assert_eq!(classify("asix 1-1:1.0 eth0: link down"), LineKind::Plain);
        assert_eq!(
            classify("iperf3: error - unable to connect"),
            LineKind::Warn
        );
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(human(94_066_666.7, "bit/s"), "94.07 Mbit/s");
        assert_eq!(human(0.25, "s"), "250 ms");
        assert_eq!(human(1500.0, "ms"), "1.5 s");
        assert_eq!(human(3.0, "frames"), "3 frames");
        assert_eq!(duration(3725.0), "1 h 02 min");
        assert_eq!(duration(12.5), "12.5 s");
        assert_eq!(hours(53.5), "2 d 5 h");
        assert_eq!(hours(0.5), "30 min");
    }
}
