//! Rust against C: the differential of each farm check. Both drivers of a
//! check must reach the same outcome, and their throughput must not differ
//! beyond [`DIFFERENTIAL_MIN_EFFECT`] with significance. Noise is judged as
//! everywhere in the verdict ([`super::stats`]: a one-sided Mann–Whitney test
//! and a minimum effect), with the minimum share stated here.

use crate::results::{Measurement, Status};
use crate::verdict::compare::telling_line as first_line;
use crate::verdict::stats;

/// Rust and C throughput differing by less than this share is not a
/// finding: both drivers leave the MAC's data path alone, so what a PHY
/// driver gets wrong shows as a wrong speed or duplex (10 instead of 100
/// Mbit/s is -90 %, a duplex mismatch worse than -50 %), while two TCG
/// guests on a shared 2-core host were measured up to ~20 % apart.
pub const DIFFERENTIAL_MIN_EFFECT: f64 = 0.40;

/// Rust against C for one check `id`: both final outcomes (status and log
/// excerpt), then, when both pass alike, every Mbit/s measurement of the
/// check in `measurements` (rust's samples against c's).
pub fn compare(
    id: &str,
    (r, rx): (Status, &str),
    (c, cx): (Status, &str),
    measurements: &[Measurement],
) -> (Status, String) {
    if r == Status::Skip && c == Status::Skip {
        return (Status::Skip, "both variants skipped".into());
    }
    // A side that did not run leaves nothing to compare: the differential
    // waits for it, naming it, and never blames the side that did run.
    let absent = |s: Status| s.incomplete() || s == Status::Skip;
    if absent(r) || absent(c) {
        let sides: Vec<String> = [("rust", r), ("c", c)]
            .iter()
            .filter(|(_, s)| absent(*s))
            .map(|(n, s)| format!("{n} {s}"))
            .collect();
        return (
            Status::Miss,
            format!(
                "MISS: cannot compare: {} did not run (rust {r}, c {c})",
                sides.join(" and ")
            ),
        );
    }
    if r == Status::Fail && c == Status::Fail {
        return (
            Status::Fail,
            format!(
                "both variants fail: rust: {}; c: {}",
                first_line(rx),
                first_line(cx)
            ),
        );
    }
    if r != c {
        let (side, why) = if r == Status::Fail {
            ("rust", rx)
        } else {
            ("c", cx)
        };
        return (
            Status::Fail,
            format!("{side} deviates: rust {r}, c {c}: {}", first_line(why)),
        );
    }
    let mut problems = Vec::new();
    let prefix = format!("{id}.");
    for m in measurements
        .iter()
        .filter(|m| m.variant.as_deref() == Some("rust") && m.unit == "Mbit/s")
        .filter(|m| m.name.starts_with(&prefix))
    {
        let Some(other) = measurements
            .iter()
            .find(|o| o.name == m.name && o.variant.as_deref() == Some("c"))
        else {
            continue;
        };
        if let Some(d) = stats::shift(&other.samples, &m.samples, DIFFERENTIAL_MIN_EFFECT) {
            let side = if d.ratio < 1.0 { "rust" } else { "c" };
            problems.push(format!(
                "{}: {side} is slower: rust {:.1} vs c {:.1} Mbit/s ({:+.1} %, p = {:.4})",
                m.name.trim_start_matches(&prefix),
                stats::median(&m.samples),
                stats::median(&other.samples),
                (d.ratio - 1.0) * 100.0,
                d.p
            ));
        }
    }
    if problems.is_empty() {
        (Status::Pass, String::new())
    } else {
        (Status::Fail, problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(variant: &str, samples: &[f64]) -> Measurement {
        Measurement {
            name: "farm.throughput.tcp_tx".into(),
            variant: Some(variant.into()),
            value: samples.iter().sum::<f64>() / samples.len() as f64,
            unit: "Mbit/s".into(),
            samples: samples.to_vec(),
            lower_is_better: false,
        }
    }

    #[test]
    fn only_a_significant_difference_beyond_the_minimum_share_fails_the_pair() {
        let pass = (Status::Pass, "");
        let c = [94.0, 94.5, 94.2, 94.8, 94.1, 94.6];
        // 20 % slower, clearly separated: within what two TCG guests differ by.
        let rust = c.map(|x| x * 0.8);
        let (s, why) = compare(
            "farm.throughput",
            pass,
            pass,
            &[tp("rust", &rust), tp("c", &c)],
        );
        assert_eq!((s, why.as_str()), (Status::Pass, ""));
        // 10 instead of 100 Mbit/s: a PHY driver's wrong speed.
        let rust = c.map(|x| x * 0.1);
        let (s, why) = compare(
            "farm.throughput",
            pass,
            pass,
            &[tp("rust", &rust), tp("c", &c)],
        );
        assert_eq!(s, Status::Fail);
        assert!(
            why.starts_with("tcp_tx: rust is slower: rust 9.4 vs c 94.3 Mbit/s (-90.0 %"),
            "{why}"
        );
        // c slower names c; a measurement of another check is not compared.
        let (s, why) = compare(
            "farm.throughput",
            pass,
            pass,
            &[tp("rust", &c), tp("c", &rust)],
        );
        assert!(s == Status::Fail && why.contains("c is slower"), "{why}");
        let (s, _) = compare("farm.probe", pass, pass, &[tp("rust", &c), tp("c", &rust)]);
        assert_eq!(s, Status::Pass);
        // Outcomes come first.
        let (s, why) = compare("farm.probe", (Status::Fail, "no carrier"), pass, &[]);
        assert!(
            s == Status::Fail && why.starts_with("rust deviates: rust FAIL, c PASS"),
            "{why}"
        );
        let (s, _) = compare("farm.probe", (Status::Error, "x"), pass, &[]);
        assert_eq!(s, Status::Miss);
    }

    #[test]
    fn a_side_that_did_not_run_makes_the_differential_miss_naming_it() {
        let pass = (Status::Pass, "");
        let (s, why) = compare("farm.probe", (Status::Skip, "not run"), pass, &[]);
        assert_eq!(s, Status::Miss);
        assert!(why.contains("rust SKIP did not run"), "{why}");
        assert!(!why.contains("deviates"), "{why}");
        let (s, why) = compare("farm.probe", pass, (Status::Miss, "MISS: x"), &[]);
        assert!(
            s == Status::Miss && why.contains("c MISS did not run"),
            "{why}"
        );
        let (s, _) = compare("farm.probe", (Status::Skip, ""), (Status::Skip, ""), &[]);
        assert_eq!(s, Status::Skip);
    }
}
