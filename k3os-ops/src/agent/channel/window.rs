//! Maintenance windows: when a node may start disrupting itself.
//!
//! A window starts at a local wall-clock time on chosen days of the week and lasts a fixed
//! *elapsed* length. It belongs to the day it starts on, so it may run past midnight and past
//! Sunday into Monday. Time zones come from `chrono-tz` (the IANA database compiled in: nodes
//! have no reliable /usr/share/zoneinfo). Daylight-saving rules:
//! - a start time that does not exist that day (clocks jump over it) starts the window at the
//!   first instant after the jump;
//! - a start time that happens twice (clocks fall back) starts the window at the first one;
//! - the length is elapsed time, so a 2 h window is 2 h long even across a DST change.

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveTime, TimeZone, Utc, Weekday,
};
use chrono_tz::Tz;

use super::crd::WindowSpec;
use super::duration;

/// A window spec that cannot be used; names the field and the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("spec.window.days: '{0}' is not a day of the week (expected mon, tue, …, sun)")]
    Day(String),
    #[error("spec.window.start: '{0}' is not a time of day (expected HH:MM, 24 h)")]
    Start(String),
    #[error(transparent)]
    Length(#[from] duration::DurationError),
    #[error("spec.window.length: '{0}' must be more than 0 and at most 7 days")]
    LengthRange(String),
    #[error("spec.window.timeZone: '{0}' is not an IANA time zone (e.g. Europe/Berlin, UTC)")]
    TimeZone(String),
}

/// A parsed, valid window.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Indexed by `Weekday::num_days_from_monday()`.
    days: [bool; 7],
    start: NaiveTime,
    length: Duration,
    tz: Tz,
}

fn parse_day(s: &str) -> Option<Weekday> {
    let l = s.trim().to_ascii_lowercase();
    let all = [
        ("mon", "monday", Weekday::Mon),
        ("tue", "tuesday", Weekday::Tue),
        ("wed", "wednesday", Weekday::Wed),
        ("thu", "thursday", Weekday::Thu),
        ("fri", "friday", Weekday::Fri),
        ("sat", "saturday", Weekday::Sat),
        ("sun", "sunday", Weekday::Sun),
    ];
    all.iter()
        .find(|(short, long, _)| l == *short || l == *long)
        .map(|(_, _, d)| *d)
}

impl Window {
    /// Parse and validate a spec.
    pub fn parse(spec: &WindowSpec) -> Result<Window, WindowError> {
        let mut days = [spec.days.is_empty(); 7];
        for d in &spec.days {
            let wd = parse_day(d).ok_or_else(|| WindowError::Day(d.clone()))?;
            days[wd.num_days_from_monday() as usize] = true;
        }
        let start = NaiveTime::parse_from_str(spec.start.trim(), "%H:%M")
            .map_err(|_| WindowError::Start(spec.start.clone()))?;
        let len = duration::parse("spec.window.length", &spec.length)?;
        if len.is_zero() || len > std::time::Duration::from_secs(7 * 86_400) {
            return Err(WindowError::LengthRange(spec.length.clone()));
        }
        let tz = match spec.time_zone.as_deref().map(str::trim) {
            None | Some("") => Tz::UTC,
            Some(name) => name
                .parse::<Tz>()
                .map_err(|_| WindowError::TimeZone(name.to_string()))?,
        };
        Ok(Window {
            days,
            start,
            length: Duration::from_std(len).expect("at most 7 days"),
            tz,
        })
    }

    /// A window opening every day at local midnight in `tz` and lasting a day: its starts are
    /// the day boundaries of `tz`, with the same DST rules as every window.
    pub fn daily(tz: Tz) -> Window {
        Window {
            days: [true; 7],
            start: NaiveTime::MIN,
            length: Duration::days(1),
            tz,
        }
    }

    /// The window's time zone.
    pub fn time_zone(&self) -> Tz {
        self.tz
    }

    /// How long the window lasts (elapsed time).
    #[cfg(any(test, feature = "testing"))]
    pub fn length(&self) -> Duration {
        self.length
    }

    /// Every `[start, end)` of this window that overlaps `[from, to)`, in order (the
    /// recurring window expanded into concrete instants, DST rules as [`Self::start_on`]).
    pub fn occurrences(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        let first = self.local_date(from) - chrono::Days::new(8);
        let last = self.local_date(to);
        first
            .iter_days()
            .take_while(|d| *d <= last)
            .filter_map(|d| self.start_on(d))
            .map(|s| (s, s + self.length))
            .filter(|(s, e)| *e > from && *s < to)
            .collect()
    }

    /// The instant the window belonging to local date `date` starts, or `None` when the
    /// window does not start on that weekday.
    pub fn start_on(&self, date: NaiveDate) -> Option<DateTime<Utc>> {
        if !self.days[date.weekday().num_days_from_monday() as usize] {
            return None;
        }
        let local = date.and_time(self.start);
        match self.tz.from_local_datetime(&local) {
            LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
            LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
            LocalResult::None => {
                // In a gap: the first local minute after it that exists. Gaps are at most a
                // few hours in the IANA database; scan a day to be safe.
                (1..=24 * 60).find_map(|m| {
                    self.tz
                        .from_local_datetime(&(local + Duration::minutes(m)))
                        .earliest()
                        .map(|t| t.with_timezone(&Utc))
                })
            }
        }
    }

    fn local_date(&self, t: DateTime<Utc>) -> NaiveDate {
        t.with_timezone(&self.tz).date_naive()
    }

    /// When `now` is inside a window, the end of that window (the latest end if windows
    /// overlap); `None` when closed.
    pub fn open_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let today = self.local_date(now);
        // A window lasts at most 7 days, so it started at most 8 local days ago.
        (0..=8)
            .filter_map(|back| today.checked_sub_days(chrono::Days::new(back)))
            .filter_map(|d| self.start_on(d))
            .filter(|s| *s <= now && now < *s + self.length)
            .map(|s| s + self.length)
            .max()
    }

    /// The first window start strictly after `now`.
    pub fn next_start(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let today = self.local_date(now);
        (0..=8)
            .filter_map(|fwd| today.checked_add_days(chrono::Days::new(fwd)))
            .filter_map(|d| self.start_on(d))
            .find(|s| *s > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(days: &[&str], start: &str, length: &str, tz: Option<&str>) -> Window {
        Window::parse(&WindowSpec {
            days: days.iter().map(|s| s.to_string()).collect(),
            start: start.into(),
            length: length.into(),
            time_zone: tz.map(Into::into),
        })
        .unwrap()
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn sunday_night_window_runs_into_monday() {
        let win = w(&["sun"], "23:00", "3h", None);
        // 2026-12-06 is a Sunday.
        assert_eq!(
            win.open_until(utc("2026-12-07T01:00:00Z")),
            Some(utc("2026-12-07T02:00:00Z"))
        );
        assert_eq!(win.open_until(utc("2026-12-07T02:00:00Z")), None);
        assert_eq!(win.open_until(utc("2026-12-06T22:59:59Z")), None);
        assert_eq!(
            win.next_start(utc("2026-12-07T02:00:00Z")),
            Some(utc("2026-12-13T23:00:00Z"))
        );
    }

    #[test]
    fn spring_forward_gap_starts_after_the_jump() {
        // Europe/Berlin jumps 02:00 -> 03:00 on 2026-03-29 (a Sunday).
        let win = w(&["sun"], "02:30", "1h", Some("Europe/Berlin"));
        let s = win
            .start_on(NaiveDate::from_ymd_opt(2026, 3, 29).unwrap())
            .unwrap();
        assert_eq!(s, utc("2026-03-29T01:00:00Z")); // 03:00 CEST
    }

    #[test]
    fn fall_back_ambiguity_starts_at_the_first() {
        // Europe/Berlin repeats 02:00-03:00 on 2026-10-25.
        let win = w(&["sun"], "02:30", "1h", Some("Europe/Berlin"));
        let s = win
            .start_on(NaiveDate::from_ymd_opt(2026, 10, 25).unwrap())
            .unwrap();
        assert_eq!(s, utc("2026-10-25T00:30:00Z")); // 02:30 CEST
    }

    #[test]
    fn bad_specs_name_the_field() {
        let bad = |days: &[&str], start: &str, len: &str, tz: Option<&str>| {
            Window::parse(&WindowSpec {
                days: days.iter().map(|s| s.to_string()).collect(),
                start: start.into(),
                length: len.into(),
                time_zone: tz.map(Into::into),
            })
            .unwrap_err()
            .to_string()
        };
        assert!(bad(&["funday"], "01:00", "1h", None).contains("spec.window.days"));
        assert!(bad(&[], "25:00", "1h", None).contains("spec.window.start"));
        assert!(bad(&[], "01:00", "8d", None).contains("spec.window.length"));
        assert!(bad(&[], "01:00", "0s", None).contains("spec.window.length"));
        assert!(bad(&[], "01:00", "1h", Some("Mars/Olympus")).contains("spec.window.timeZone"));
    }
}
