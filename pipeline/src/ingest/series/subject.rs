//! Subject prefixes: `[PATCH net-next v7 3/5]`, `[RFC PATCH v2 0/3]`,
//! `[PATCH RESEND net 1/1]`, `[PATCHv3]`, `[PATCH]`.

/// What the bracketed prefix of a subject says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Prefix {
    /// Target tree (`net-next`, `net`, `bpf-next`...), if named.
    pub tree: Option<String>,
    /// Revision; a subject without `vN` is revision 1.
    pub version: u32,
    pub rfc: bool,
    pub resend: bool,
    /// `n/m`, if present.
    pub counter: Option<(u32, u32)>,
    /// The subject with the prefix removed.
    pub subject: String,
    /// Whether any `[...PATCH...]` bracket was seen.
    pub is_patch: bool,
}

fn parse_version(token: &str) -> Option<u32> {
    let lower = token.to_ascii_lowercase();
    let digits = lower.strip_prefix('v')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn parse_counter(token: &str) -> Option<(u32, u32)> {
    let (n, m) = token.split_once('/')?;
    let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !ok(n) || !ok(m) {
        return None;
    }
    Some((n.parse().ok()?, m.parse().ok()?))
}

/// Parse the prefixes of a subject. Leading `Re:`/`Fwd:` and every leading
/// bracket group are consumed; the rest is the patch title.
pub(crate) fn parse(subject: &str) -> Prefix {
    let mut p = Prefix {
        version: 1,
        ..Prefix::default()
    };
    let mut rest = subject.trim();
    loop {
        let lower = rest.to_ascii_lowercase();
        if lower.starts_with("re:") || lower.starts_with("fw:") {
            rest = rest[3..].trim_start();
        } else if lower.starts_with("fwd:") {
            rest = rest[4..].trim_start();
        } else {
            break;
        }
    }
    while let Some(inner_start) = rest.strip_prefix('[') {
        let Some(close) = inner_start.find(']') else {
            break;
        };
        let inner = &inner_start[..close];
        for token in inner.split(|c: char| c.is_whitespace() || c == ',') {
            if token.is_empty() {
                continue;
            }
            let upper = token.to_ascii_uppercase();
            if upper == "PATCH" {
                p.is_patch = true;
            } else if let Some(v) = upper.strip_prefix("PATCH").and_then(parse_version) {
                // "PATCHv3"
                p.is_patch = true;
                p.version = v;
            } else if upper == "RFC" {
                p.rfc = true;
            } else if upper == "RESEND" {
                p.resend = true;
            } else if let Some(v) = parse_version(token) {
                p.version = v;
            } else if let Some(c) = parse_counter(token) {
                p.counter = Some(c);
            } else if p.tree.is_none() {
                p.tree = Some(token.to_string());
            }
        }
        rest = inner_start[close + 1..].trim_start();
    }
    p.subject = rest.to_string();
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_prefix() {
        let p = parse("[PATCH net-next v7 3/5] rust: add second `bindgen` pass");
        assert_eq!(p.tree.as_deref(), Some("net-next"));
        assert_eq!(p.version, 7);
        assert_eq!(p.counter, Some((3, 5)));
        assert!(!p.rfc && !p.resend && p.is_patch);
        assert_eq!(p.subject, "rust: add second `bindgen` pass");
    }

    #[test]
    fn rfc_resend_and_bare() {
        let p = parse("[RFC PATCH v2 0/3] cover");
        assert!(p.rfc);
        assert_eq!((p.version, p.counter, p.tree), (2, Some((0, 3)), None));
        let p = parse("[PATCH RESEND net 1/1] fix");
        assert!(p.resend);
        assert_eq!(p.tree.as_deref(), Some("net"));
        let p = parse("[PATCH] MAINTAINERS: add me");
        assert_eq!((p.version, p.counter), (1, None));
        assert_eq!(p.subject, "MAINTAINERS: add me");
        let p = parse("Re: [PATCHv3 2/4] x");
        assert_eq!((p.version, p.counter), (3, Some((2, 4))));
        let p = parse("no prefix");
        assert!(!p.is_patch);
    }
}
