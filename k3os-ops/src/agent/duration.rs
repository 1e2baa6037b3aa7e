//! Parsing of the short durations used in the `UpdateChannel` spec (`90s`, `15m`, `1h30m`,
//! `2d`). Hand-written because the grammar is four units and a dependency is not worth it.

use std::time::Duration;

/// A duration string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: '{value}' is not a duration (expected e.g. 90s, 15m, 1h30m, 2d): {why}")]
pub struct DurationError {
    pub field: String,
    pub value: String,
    pub why: &'static str,
}

/// Parse `value` (the spec field named `field`, for the error message).
pub fn parse(field: &str, value: &str) -> Result<Duration, DurationError> {
    let err = |why| DurationError {
        field: field.to_string(),
        value: value.to_string(),
        why,
    };
    let s = value.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total: u64 = 0;
    let mut num: Option<u64> = None;
    for c in s.chars() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse("f", "90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("f", "15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse("f", "1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("f", "2d").unwrap(), Duration::from_secs(172_800));
    }

    #[test]
    fn rejects_garbage_naming_the_field() {
        let e = parse("spec.rebootTimeout", "15").unwrap_err();
        assert!(e.to_string().contains("spec.rebootTimeout"), "{e}");
        assert!(parse("f", "").is_err());
        assert!(parse("f", "m").is_err());
        assert!(parse("f", "3x").is_err());
        assert!(parse("f", "99999999999999999999s").is_err());
    }
}
