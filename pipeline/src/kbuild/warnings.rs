//! Compiler and rustc warnings in a build log, keyed so that the same warning
//! at a moved line is still the same warning. New warnings are those of a
//! patched build whose key the base build of the same variant did not have.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Warning {
    /// File and message, without line and column.
    pub key: String,
    /// The warning as printed (first line, and for rustc its location).
    pub text: String,
}

fn strip_line_col(loc: &str) -> &str {
    // "drivers/x.c:12:5" -> "drivers/x.c"
    let mut s = loc;
    for _ in 0..2 {
        if let Some((head, tail)) = s.rsplit_once(':') {
            if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit()) {
                s = head;
            }
        }
    }
    s
}

/// Every warning in `log`: GCC/Clang (`file:line:col: warning: msg`) and rustc
/// (`warning: msg` followed by `--> file:line:col`).
pub fn parse(log: &str) -> Vec<Warning> {
    let lines: Vec<&str> = log.lines().collect();
    let mut out = BTreeSet::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_end();
        if let Some((loc, msg)) = t.split_once(": warning: ") {
            if !loc.contains(' ') {
                out.insert(Warning {
                    key: format!("{}: {}", strip_line_col(loc), msg.trim()),
                    text: t.to_string(),
                });
            }
        } else if let Some(msg) = t.strip_prefix("warning: ") {
            if msg.ends_with("warning emitted") || msg.ends_with("warnings emitted") {
                continue;
            }
            let loc = lines
                .iter()
                .skip(i + 1)
                .take(3)
                .find_map(|n| n.trim_start().strip_prefix("--> "))
                .unwrap_or("");
            out.insert(Warning {
                key: format!("{}: {}", strip_line_col(loc.trim()), msg.trim()),
                text: if loc.is_empty() {
                    t.to_string()
                } else {
                    format!("{t} --> {}", loc.trim())
                },
            });
        }
    }
    out.into_iter().collect()
}

/// Warnings of `patched` whose key is not among `base_keys`.
pub fn new_warnings(patched: &[Warning], base_keys: &BTreeSet<String>) -> Vec<Warning> {
    patched
        .iter()
        .filter(|w| !base_keys.contains(&w.key))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "  CC      drivers/net/phy/ax88796b.o\n\
drivers/net/phy/ax88796b.c:40:6: warning: unused variable 'x' [-Wunused-variable]\n\
   40 |  int x;\n\
warning: unused variable: `y`\n\
  --> drivers/net/phy/ax88796b_rust.rs:55:13\n\
   |\n\
warning: 1 warning emitted\n";

    #[test]
    fn gcc_and_rustc_warnings_are_found() {
        let w = parse(LOG);
        let keys: Vec<&str> = w.iter().map(|w| w.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "drivers/net/phy/ax88796b.c: unused variable 'x' [-Wunused-variable]",
                "drivers/net/phy/ax88796b_rust.rs: unused variable: `y`",
            ]
        );
        assert!(w[1]
            .text
            .ends_with("--> drivers/net/phy/ax88796b_rust.rs:55:13"));
    }

    #[test]
    fn moved_warning_is_not_new() {
        let base: BTreeSet<String> = parse(LOG).into_iter().map(|w| w.key).collect();
        let moved = LOG.replace(":40:6:", ":44:6:").replace(":55:13", ":60:1");
        assert!(new_warnings(&parse(&moved), &base).is_empty());
        let extra = format!("{LOG}drivers/net/usb/asix.c:1:1: warning: new one\n");
        let n = new_warnings(&parse(&extra), &base);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].key, "drivers/net/usb/asix.c: new one");
    }
}
