//! The durations of the `UpdateChannel` spec (`90s`, `15m`, `1h30m`, `2d`): libupgrade's one
//! grammar ([`libupgrade::units::parse_duration`]), with the spec field an error names.

use std::time::Duration;

use libupgrade::units::{parse_duration, UnitError};

/// A spec field's duration that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {source}")]
pub struct DurationError {
    /// The spec field, e.g. `spec.rebootTimeout`.
    pub field: String,
    /// What is wrong with its value.
    #[source]
    pub source: UnitError,
}

/// Parse `value` (the spec field named `field`, for the error message).
pub fn parse(field: &str, value: &str) -> Result<Duration, DurationError> {
    parse_duration(value).map_err(|source| DurationError {
        field: field.to_string(),
        source,
    })
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
