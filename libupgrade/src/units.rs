//! Sizes, rates and durations as people write and read them: one grammar for the CLI's flags,
//! the agent's `UpdateChannel` spec and every message.
//!
//! - Byte counts: `500M`, `2G`, `1.5GiB`, `100000` ([`parse_bytes`]; K/M/G are powers of 1024,
//!   an optional `B` or `iB` after them), printed like `df -h` ([`Size`]: `12.5 MiB`).
//! - Rates: the same, optionally followed by `/s`, at least 1 KiB/s ([`parse_rate`]).
//! - Durations: `90s`, `15m`, `1h30m`, `2d` — a sum of numbers each with its unit
//!   ([`parse_duration`]), printed as the largest whole units ([`Span`]: `1h30m`).
//!
//! Hand-written: the grammar is three units of size and four of time, and the crates that parse
//! human durations (humantime) accept a wider one (`1hour 2min`, fractions) than the CRD's CEL
//! rules and v0.1.0 agents do; a spec must mean the same to every agent of a mixed fleet.

use std::time::Duration;

/// A size, rate or duration that could not be read: the text, what was expected and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{text}' is not {expected}: {why}")]
pub struct UnitError {
    /// The text as given (escaped when printed).
    pub text: String,
    /// What it should have looked like, e.g. "a byte count like 500M, 2G or 1.5GiB".
    pub expected: &'static str,
    /// What is wrong with it.
    pub why: &'static str,
}

impl UnitError {
    fn new(text: &str, expected: &'static str, why: &'static str) -> UnitError {
        UnitError {
            text: text.escape_debug().to_string(),
            expected,
            why,
        }
    }
}

const BYTES: &str = "a byte count like 500M, 2G or 1.5GiB";
const RATE: &str = "a rate like 500K, 2M or 1.5MiB (bytes per second)";
const DURATION: &str = "a duration like 90s, 15m, 1h30m or 2d";

/// `500M`, `2G`, `1.5GiB`, `100000` → bytes (K/M/G are powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, UnitError> {
    let (num, mul) = binary_unit(s.trim());
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok((v * mul as f64) as u64),
        _ => Err(UnitError::new(s, BYTES, "not a number with K, M or G")),
    }
}

/// `2M`, `512K`, `1.5MiB/s`, `100000` → bytes per second (K/M/G are powers of 1024); below
/// 1 KiB/s is refused: it would never finish an image.
pub fn parse_rate(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    let (num, mul) = binary_unit(t.strip_suffix("/s").unwrap_or(t));
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| UnitError::new(s, RATE, "not a number with K, M or G"))?;
    let rate = (v * mul as f64) as u64;
    if !(v.is_finite() && rate >= 1024) {
        return Err(UnitError::new(
            s,
            RATE,
            "a rate below 1 KiB/s would never finish an image",
        ));
    }
    Ok(rate)
}

/// The number's text and its multiplier in `500M`, `1.5GiB`, `2k`, `100000`: an optional `B` or
/// `iB` after an optional K/M/G (powers of 1024, any case).
fn binary_unit(t: &str) -> (&str, u64) {
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    match t.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&t[..i], 1u64 << 10),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&t[..i], 1 << 20),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&t[..i], 1 << 30),
        _ => (t, 1),
    }
}

/// `90s`, `15m`, `1h30m`, `2d` → a duration: numbers each followed by `s`, `m`, `h` or `d`,
/// added up. A number without a unit is refused (is `15` seconds or minutes?).
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let err = |why| UnitError::new(s, DURATION, why);
    let t = s.trim();
    if t.is_empty() {
        return Err(err("empty"));
    }
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in t.chars() {
        if let Some(d) = c.to_digit(10) {
            let n = num.unwrap_or(0);
            num = Some(
                n.checked_mul(10)
                    .and_then(|n| n.checked_add(u64::from(d)))
                    .ok_or_else(|| err("number too large"))?,
            );
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(err("unknown unit (use s, m, h, d)")),
        };
        let n = num.take().ok_or_else(|| err("unit without a number"))?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| err("number too large"))?;
    }
    if num.is_some() {
        return Err(err("number without a unit"));
    }
    Ok(Duration::from_secs(total))
}

/// A byte count for people: `512 B`, `4.0 KiB`, `12.5 MiB`, `1.50 GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
        for (unit, n) in UNITS {
            if self.0 >= n {
                let v = self.0 as f64 / n as f64;
                return if unit == "GiB" {
                    write!(f, "{v:.2} {unit}")
                } else {
                    write!(f, "{v:.1} {unit}")
                };
            }
        }
        write!(f, "{} B", self.0)
    }
}

/// A duration for people, in the grammar [`parse_duration`] reads: `0s`, `45s`, `1h30m`, `2d3h`
/// (whole seconds; what is below a second is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub Duration);

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut left = self.0.as_secs();
        if left == 0 {
            return write!(f, "0s");
        }
        for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
            if left >= n {
                write!(f, "{}{unit}", left / n)?;
                left %= n;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_read_like_df_h() {
        assert_eq!(Size(0).to_string(), "0 B");
        assert_eq!(Size(1023).to_string(), "1023 B");
        assert_eq!(Size(4096).to_string(), "4.0 KiB");
        assert_eq!(Size(12 * (1 << 20) + (1 << 19)).to_string(), "12.5 MiB");
        assert_eq!(Size(3 * (1 << 29)).to_string(), "1.50 GiB");
    }

    #[test]
    fn byte_counts_and_rates() {
        assert_eq!(parse_bytes("500M").unwrap(), 500 << 20);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("2k").unwrap(), 2048);
        assert_eq!(parse_bytes("100000").unwrap(), 100_000);
        assert!(parse_bytes("-1M").is_err());
        assert!(parse_bytes("lots").is_err());
        assert_eq!(parse_rate("2M").unwrap(), 2 << 20);
        assert_eq!(parse_rate("1.5MiB/s").unwrap(), 3 << 19);
        let e = parse_rate("512").unwrap_err();
        assert!(e.to_string().contains("below 1 KiB/s"), "{e}");
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn durations_parse_units_and_combinations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        for bad in ["", "m", "15", "3x", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn untrusted_text_is_escaped_in_messages() {
        let e = parse_bytes("1\u{1b}[2J").unwrap_err();
        assert!(!e.to_string().contains('\u{1b}'), "{e}");
        assert!(e.to_string().contains("\\u{1b}"), "{e}");
    }

    proptest! {
        #[test]
        fn a_printed_span_parses_back(secs in 1u64..10_000_000) {
            let d = Duration::from_secs(secs);
            prop_assert_eq!(parse_duration(&Span(d).to_string()).unwrap(), d);
        }
    }
}
