//! A download schedule: when a stage may fetch, and how fast. Pure: [`Schedule::at`] answers
//! for a given instant; the shared limiter ([`super::rate::RateLimit`]) asks it with its clock.
//!
//! A schedule is a list of absolute UTC intervals `[start, end)`, each with its own rate
//! (`None`: as fast as the link and `--max-rate` allow; `Some(0)`: nothing). Outside every
//! interval nothing is fetched; after the last one the stage stops, resumable. There are no
//! time zones, days or repetition here: the caller turns its own rules into intervals (the
//! agent from `spec.stage.windows[]`, the CLI from `--stage-until` / `--stage-window`), so the
//! library does not depend on the agent's window semantics.

use chrono::{DateTime, Utc};

/// One interval of a [`Schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// When it opens (inclusive).
    pub start: DateTime<Utc>,
    /// When it closes (exclusive).
    pub end: DateTime<Utc>,
    /// Bytes per second in it: `None` as fast as allowed otherwise, `Some(0)` nothing.
    pub rate: Option<u64>,
}

/// Sorted, non-overlapping [`Window`]s (adjacent ones may differ in rate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    windows: Vec<Window>,
}

/// What a [`Schedule`] allows at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowance {
    /// Fetch at `rate` (as [`Window::rate`], never `Some(0)`) until `until` (exclusive).
    Open {
        /// Bytes per second allowed (None: as fast as allowed otherwise).
        rate: Option<u64>,
        /// When this window closes.
        until: DateTime<Utc>,
        /// Where this window started (a new window starts with an empty token bucket).
        since: DateTime<Utc>,
    },
    /// Nothing may be fetched before `until` (between windows, or in a window of rate 0).
    Wait {
        /// When to ask again: the next window's start, or the end of this rate-0 window.
        until: DateTime<Utc>,
    },
    /// No window remains: the last one closed at `closed`.
    Over {
        /// When the last window closed.
        closed: DateTime<Utc>,
    },
}

/// A schedule that cannot be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// A window's end is not after its start.
    #[error("download window {start} to {end} ends before it starts")]
    Empty {
        /// The window's start.
        start: DateTime<Utc>,
        /// The window's end, at or before its start.
        end: DateTime<Utc>,
    },
    /// Two windows overlap.
    #[error("download windows {a} and {b} overlap")]
    Overlap {
        /// The earlier window, as `start/end` in RFC 3339.
        a: String,
        /// The later window, as `start/end` in RFC 3339.
        b: String,
    },
    /// The schedule has no window.
    #[error("a download schedule needs at least one window")]
    None,
}

impl Window {
    fn describe(&self) -> String {
        format!(
            "{}/{}",
            self.start
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    }
}

impl Schedule {
    /// Windows in any order; refused when one is empty or two overlap.
    pub fn new(mut windows: Vec<Window>) -> Result<Schedule, ScheduleError> {
        if let Some(w) = windows.iter().find(|w| w.end <= w.start) {
            return Err(ScheduleError::Empty {
                start: w.start,
                end: w.end,
            });
        }
        windows.sort_by_key(|w| w.start);
        if let Some(p) = windows.windows(2).find(|p| p[1].start < p[0].end) {
            return Err(ScheduleError::Overlap {
                a: p[0].describe(),
                b: p[1].describe(),
            });
        }
        if windows.is_empty() {
            return Err(ScheduleError::None);
        }
        Ok(Schedule { windows })
    }

    /// One window from now on that ends at `end` (`--stage-until`).
    pub fn until(now: DateTime<Utc>, end: DateTime<Utc>, rate: Option<u64>) -> Schedule {
        Schedule {
            windows: vec![Window {
                start: now.min(end),
                end,
                rate,
            }],
        }
    }

    /// The windows, sorted by start.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// What may be fetched at `now`.
    pub fn at(&self, now: DateTime<Utc>) -> Allowance {
        let next = self.windows.partition_point(|w| w.end <= now);
        let Some(w) = self.windows.get(next) else {
            let last = self.windows.last().expect("a schedule has a window");
            return Allowance::Over { closed: last.end };
        };
        if now < w.start || w.rate == Some(0) {
            // Waiting past a rate-0 window lands in the next one (or past the last: over).
            let until = if now < w.start { w.start } else { w.end };
            return Allowance::Wait { until };
        }
        Allowance::Open {
            rate: w.rate,
            until: w.end,
            since: w.start,
        }
    }

    /// Bytes the schedule allows from its first window to `now` at its rates (`None` when an
    /// unrated window has begun by then: no bound).
    pub fn allowed_by(&self, now: DateTime<Utc>) -> Option<f64> {
        let mut sum = 0.0;
        for w in self.windows.iter().filter(|w| w.start < now) {
            let secs = (w.end.min(now) - w.start).as_seconds_f64();
            sum += w.rate? as f64 * secs;
        }
        Some(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
    }

    fn w(a: i64, b: i64, rate: Option<u64>) -> Window {
        Window {
            start: t(a),
            end: t(b),
            rate,
        }
    }

    #[test]
    fn open_wait_and_over() {
        let s = Schedule::new(vec![
            w(100, 200, Some(0)),
            w(10, 20, Some(5)),
            w(20, 30, None),
        ])
        .unwrap();
        assert_eq!(s.at(t(0)), Allowance::Wait { until: t(10) });
        assert_eq!(
            s.at(t(10)),
            Allowance::Open {
                rate: Some(5),
                until: t(20),
                since: t(10)
            }
        );
        assert_eq!(
            s.at(t(20)),
            Allowance::Open {
                rate: None,
                until: t(30),
                since: t(20)
            }
        );
        assert_eq!(s.at(t(30)), Allowance::Wait { until: t(100) });
        // A rate-0 window: nothing until it ends, then the schedule is over.
        assert_eq!(s.at(t(150)), Allowance::Wait { until: t(200) });
        assert_eq!(s.at(t(200)), Allowance::Over { closed: t(200) });
        assert_eq!(s.allowed_by(t(15)), Some(25.0));
        assert_eq!(s.allowed_by(t(25)), None);
    }

    #[test]
    fn empty_and_overlapping_windows_are_refused_by_name() {
        let e = Schedule::new(vec![w(10, 10, None)]).unwrap_err();
        assert!(matches!(e, ScheduleError::Empty { .. }), "{e}");
        let e = Schedule::new(vec![w(10, 30, None), w(20, 40, Some(1))]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "download windows 2027-01-15T08:00:10Z/2027-01-15T08:00:30Z and 2027-01-15T08:00:20Z/2027-01-15T08:00:40Z overlap"
        );
        assert_eq!(Schedule::new(vec![]).unwrap_err(), ScheduleError::None);
    }

    proptest! {
        /// Whatever the windows, the answer at any instant agrees with the window holding it:
        /// open exactly inside a window with a non-zero rate, never open outside one, a wait
        /// always ends later, and over only after the last window.
        #[test]
        fn the_answer_matches_the_window_holding_the_instant(
            spans in prop::collection::vec((0i64..50, 1i64..50, prop::option::of(0u64..3)), 1..6),
            at in 0i64..600,
        ) {
            let mut start = 0;
            let ws: Vec<Window> = spans.iter().map(|&(gap, len, rate)| {
                let x = w(start + gap, start + gap + len, rate);
                start += gap + len;
                x
            }).collect();
            let s = Schedule::new(ws.clone()).unwrap();
            let now = t(at);
            let holding = ws.iter().find(|w| w.start <= now && now < w.end);
            match s.at(now) {
                Allowance::Open { rate, until, since } => {
                    let h = holding.expect("open only inside a window");
                    prop_assert_eq!((rate, until, since), (h.rate, h.end, h.start));
                    prop_assert_ne!(rate, Some(0));
                }
                Allowance::Wait { until } => {
                    prop_assert!(until > now);
                    prop_assert!(holding.is_none_or(|h| h.rate == Some(0)));
                }
                Allowance::Over { closed } => {
                    prop_assert!(now >= ws.last().unwrap().end);
                    prop_assert_eq!(closed, ws.last().unwrap().end);
                }
            }
        }
    }
}
