//! The clock, and Unix seconds as UTC dates for people (the dashboard's times): RFC 3339 as the CLI prints
//! them, and the pieces the chart's axis labels use.

use chrono::{DateTime, Utc};

fn of(secs: u64) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp(i64::try_from(secs).ok()?, 0)
}

/// Now, in Unix seconds (0 for a clock before 1970).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `2026-12-07T04:12:00Z` (the seconds themselves if out of range).
pub fn utc(secs: u64) -> String {
    of(secs).map_or_else(
        || secs.to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

/// `2026-12-07`.
pub fn date(secs: u64) -> String {
    of(secs).map_or_else(|| secs.to_string(), |t| t.format("%Y-%m-%d").to_string())
}

/// `04:12`.
pub fn hour_minute(secs: u64) -> String {
    of(secs).map_or_else(|| secs.to_string(), |t| t.format("%H:%M").to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc(1_800_000_000), "2027-01-15T08:00:00Z");
        assert_eq!(super::date(1_800_000_000), "2027-01-15");
        assert_eq!(super::hour_minute(1_800_000_059), "08:00");
        assert_eq!(super::utc(u64::MAX), u64::MAX.to_string());
    }
}
