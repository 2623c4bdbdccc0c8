//! UTC timestamps as whole seconds, written as RFC 3339 (`2026-06-12T10:15:00Z`).
//!
//! Every time phyfarm stores or compares (run start and end, verdict
//! transitions, reviews, `--now`) is one of these, so ordering is plain
//! integer ordering and no date library is needed.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Seconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

/// Why a string is not a timestamp.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not an RFC 3339 time (like 2026-06-12T10:15:00Z or @1781259300): {reason}")]
pub struct TimeError {
    pub input: String,
    pub reason: &'static str,
}

impl Timestamp {
    pub const HOUR: i64 = 3600;

    /// The wall clock now.
    pub fn now() -> Timestamp {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Timestamp(secs)
    }

    pub fn plus_hours(self, hours: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(hours.saturating_mul(Self::HOUR)))
    }

    /// Whole hours from `self` to `later` (negative when `later` is earlier).
    pub fn hours_until(self, later: Timestamp) -> f64 {
        (later.0 - self.0) as f64 / Self::HOUR as f64
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = civil_from_days(self.0.div_euclid(86_400));
        let rem = self.0.rem_euclid(86_400);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }
}

fn num(s: &str, input: &str, reason: &'static str) -> Result<i64, TimeError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TimeError {
            input: input.to_string(),
            reason,
        });
    }
    s.parse().map_err(|_| TimeError {
        input: input.to_string(),
        reason,
    })
}

impl FromStr for Timestamp {
    type Err = TimeError;

    /// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (a space may replace the `T`),
    /// or `@SECONDS` since the epoch. Fractions of a second are dropped.
    fn from_str(input: &str) -> Result<Timestamp, TimeError> {
        let bad = |reason| TimeError {
            input: input.to_string(),
            reason,
        };
        let s = input.trim();
        if let Some(secs) = s.strip_prefix('@') {
            let neg = secs.starts_with('-');
            let v = num(secs.trim_start_matches('-'), input, "bad epoch seconds")?;
            return Ok(Timestamp(if neg { -v } else { v }));
        }
        if !s.is_ascii() || s.len() < 20 {
            return Err(bad("too short"));
        }
        let (date, rest) = s.split_at(10);
        let b = date.as_bytes();
        if b[4] != b'-' || b[7] != b'-' {
            return Err(bad("date must be YYYY-MM-DD"));
        }
        let y = num(&date[..4], input, "bad year")?;
        let mo = num(&date[5..7], input, "bad month")?;
        let d = num(&date[8..10], input, "bad day")?;
        if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) {
            return Err(bad("no such date"));
        }
        let rest = rest
            .strip_prefix(['T', 't', ' '])
            .ok_or(bad("expected T between date and time"))?;
        if rest.len() < 9 || rest.as_bytes()[2] != b':' || rest.as_bytes()[5] != b':' {
            return Err(bad("time must be HH:MM:SS"));
        }
        let h = num(&rest[..2], input, "bad hour")?;
        let mi = num(&rest[3..5], input, "bad minute")?;
        let se = num(&rest[6..8], input, "bad second")?;
        if h > 23 || mi > 59 || se > 60 {
            return Err(bad("time out of range"));
        }
        let mut zone = &rest[8..];
        if let Some(frac) = zone.strip_prefix('.') {
            let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(bad("empty fraction of a second"));
            }
            zone = &frac[digits..];
        }
        let offset = match zone {
            "Z" | "z" => 0,
            z if z.len() == 6 && (z.starts_with('+') || z.starts_with('-')) => {
                if z.as_bytes()[3] != b':' {
                    return Err(bad("offset must be ±HH:MM"));
                }
                let oh = num(&z[1..3], input, "bad offset hours")?;
                let om = num(&z[4..6], input, "bad offset minutes")?;
                let o = oh * 3600 + om * 60;
                if z.starts_with('-') {
                    -o
                } else {
                    o
                }
            }
            _ => return Err(bad("missing zone: end with Z or ±HH:MM")),
        };
        let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset;
        Ok(Timestamp(secs))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_known_dates() {
        for (text, secs) in [
            ("1970-01-01T00:00:00Z", 0),
            ("2000-02-29T00:00:00Z", 951_782_400),
            ("2026-06-12T10:15:00Z", 1_781_259_300),
        ] {
            let t: Timestamp = text.parse().unwrap();
            assert_eq!(t.0, secs, "{text}");
            assert_eq!(t.to_string(), text);
        }
    }

    #[test]
    fn offsets_fractions_and_epoch() {
        let z: Timestamp = "2026-06-12T10:15:00Z".parse().unwrap();
        assert_eq!("2026-06-12T12:15:00+02:00".parse::<Timestamp>(), Ok(z));
        assert_eq!("2026-06-12 10:15:00.967Z".parse::<Timestamp>(), Ok(z));
        assert_eq!("@1781259300".parse::<Timestamp>(), Ok(z));
        assert_eq!(z.plus_hours(72).to_string(), "2026-06-15T10:15:00Z");
    }

    #[test]
    fn refuses_nonsense_without_panicking() {
        for bad in [
            "",
            "yesterday",
            "2026-02-30T00:00:00Z",
            "2026-06-12T10:15:00",
            "2026-06-12T25:00:00Z",
            "2026-06-12T10:15:00+0200",
            "２０２６-06-12T10:15:00Z",
            "@12x",
        ] {
            let e = bad.parse::<Timestamp>().unwrap_err();
            assert!(e.to_string().contains("RFC 3339"), "{bad}: {e}");
        }
    }
}
