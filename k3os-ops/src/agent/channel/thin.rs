//! A channel's thin-link settings, parsed once, and every decision about them (pure, no I/O):
//! `spec.stage.windows[]` (when a node may download and how fast), `spec.stage.maxBytesPerDay`
//! (a daily quota) and `spec.sources[]` (chunk sources before the origin).
//!
//! - [`ThinPolicy::intervals`] expands the recurring stage windows into concrete UTC
//!   intervals for libupgrade's [`Schedule`] (the one place that does it, through
//!   [`Window::occurrences`]: the maintenance windows' DST rules). Where windows overlap the
//!   lower rate applies (`0` is the lowest: an explicit "not now" wins); rate-0 stretches are
//!   left out, so they read as "outside every window".
//! - [`ThinPolicy::gate`] decides whether a stage may run now, with which schedule and byte
//!   budget, or until when it waits. A stage runs only inside a window, and only until the
//!   stretch of back-to-back windows it started in ends (and, with a quota, until the day
//!   ends): it never sleeps inside the library between windows, so a reconcile is never held
//!   for hours and a spec change is seen at the next window.
//! - The quota day is the UTC day, or the local day of the first stage window's `timeZone`
//!   (a site's "day" is its own; documented in the CRD field).
//! - [`ThinPolicy::capacity`] / [`ThinPolicy::will_miss`]: how many bytes can still arrive
//!   before a deadline (the next maintenance window) at the windows' rates, `spec.maxRate` and
//!   the quota — the `StageWillMissWindow` decision.

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use libupgrade::{BundleAllowance, Schedule, Window as Interval};

use super::crd::UpdateChannelSpec;
use super::window::Window;

/// How far ahead the recurring windows are expanded (a weekly window recurs within it).
pub const HORIZON: chrono::Duration = chrono::Duration::days(8);

/// One `spec.stage.windows[]` entry, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct StageWindow {
    pub window: Window,
    /// Bytes per second; `None` as fast as `spec.maxRate` allows, `Some(0)` nothing.
    pub rate: Option<u64>,
}

/// The thin-link part of a channel's spec.
#[derive(Debug, Clone, PartialEq)]
pub struct ThinPolicy {
    /// Empty: a node may download at any time.
    pub windows: Vec<StageWindow>,
    /// `spec.stage.maxBytesPerDay` in bytes (more than 0).
    pub max_bytes_per_day: Option<u64>,
    /// `spec.maxRate`: caps every window.
    pub max_rate: Option<u64>,
    /// `spec.sources[]`, in order.
    pub sources: Vec<String>,
    /// The quota's day boundaries (midnight in the first stage window's zone, else UTC).
    day: Window,
}

/// Whether a stage may run now.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Stage now, within `schedule` (None: no end) and `max_bytes` (None: no budget).
    Stage {
        schedule: Option<Schedule>,
        max_bytes: Option<u64>,
    },
    /// Not before `until`.
    Wait { why: Waiting, until: DateTime<Utc> },
}

/// Why a stage waits (not a failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Outside every stage window (or in a window of rate 0).
    OutsideWindows,
    /// Today's quota is spent.
    QuotaSpent { quota: u64 },
}

impl Waiting {
    /// The phase message: why, and when the stage goes on.
    pub fn message(&self, until: DateTime<Utc>) -> String {
        let at = until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        match self {
            Waiting::OutsideWindows => {
                format!("outside the stage windows (spec.stage.windows); the next opens at {at}")
            }
            Waiting::QuotaSpent { quota } => format!(
                "today's download quota of {} (spec.stage.maxBytesPerDay) is spent; staging goes on at {at}",
                libupgrade::units::Size(*quota)
            ),
        }
    }
}

fn parse_rate(field: &str, s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" => Ok(0),
        t => libupgrade::units::parse_rate(t).map_err(|e| format!("{field}: {e}")),
    }
}

impl ThinPolicy {
    /// Parse `spec.stage` and `spec.sources` (`max_rate`: the parsed `spec.maxRate`); the
    /// error names the field.
    pub fn from_spec(
        spec: &UpdateChannelSpec,
        max_rate: Option<u64>,
    ) -> Result<ThinPolicy, String> {
        let stage = spec.stage.clone().unwrap_or_default();
        let mut windows = Vec::new();
        for (i, w) in stage.windows.iter().enumerate() {
            let field = format!("spec.stage.windows[{i}]");
            let window = Window::parse(&w.window).map_err(|e| format!("{field}: {e}"))?;
            let rate = w
                .max_rate
                .as_deref()
                .map(|r| parse_rate(&format!("{field}.maxRate"), r))
                .transpose()?;
            windows.push(StageWindow { window, rate });
        }
        let max_bytes_per_day = match stage.max_bytes_per_day.as_deref() {
            None => None,
            Some(s) => match libupgrade::units::parse_bytes(s) {
                Ok(0) => {
                    return Err(format!(
                        "spec.stage.maxBytesPerDay: '{s}' must be more than 0 bytes"
                    ))
                }
                Ok(n) => Some(n),
                Err(e) => return Err(format!("spec.stage.maxBytesPerDay: {e}")),
            },
        };
        for (i, s) in spec.sources.iter().enumerate() {
            let ok = s.starts_with('/') || s.starts_with("http://") || s.starts_with("https://");
            if !ok {
                return Err(format!(
                    "spec.sources[{i}]: '{s}' is neither an absolute host directory nor an http(s) URL"
                ));
            }
        }
        let tz = windows.first().map_or(Tz::UTC, |w| w.window.time_zone());
        Ok(ThinPolicy {
            windows,
            max_bytes_per_day,
            max_rate,
            sources: spec.sources.clone(),
            day: Window::daily(tz),
        })
    }

    /// The quota day `t` belongs to.
    pub fn day(&self, t: DateTime<Utc>) -> NaiveDate {
        t.with_timezone(&self.day.time_zone()).date_naive()
    }

    /// When the quota day after `t`'s begins.
    pub fn next_day(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        self.day
            .next_start(t)
            .unwrap_or(t + chrono::Duration::days(1))
    }

    /// The stage windows from `from` to `to` as concrete, sorted, non-overlapping intervals
    /// (lower rate where they overlap; rate-0 stretches left out). Empty without windows.
    pub fn intervals(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<Interval> {
        let raw: Vec<(DateTime<Utc>, DateTime<Utc>, Option<u64>)> = self
            .windows
            .iter()
            .flat_map(|w| {
                w.window
                    .occurrences(from, to)
                    .into_iter()
                    .map(move |(s, e)| (s, e, w.rate))
            })
            .collect();
        let mut cuts: Vec<DateTime<Utc>> = raw.iter().flat_map(|(s, e, _)| [*s, *e]).collect();
        cuts.sort();
        cuts.dedup();
        let mut out: Vec<Interval> = Vec::new();
        for pair in cuts.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let rate = raw
                .iter()
                .filter(|(s, e, _)| *s <= a && b <= *e)
                .map(|(_, _, r)| *r)
                .reduce(lower);
            let Some(rate) = rate else { continue };
            if rate == Some(0) {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.end == a && last.rate == rate => last.end = b,
                _ => out.push(Interval {
                    start: a,
                    end: b,
                    rate,
                }),
            }
        }
        out
    }

    /// Whether and how a stage may run at `now`, `used_today` bytes of today's quota spent.
    pub fn gate(&self, now: DateTime<Utc>, used_today: u64) -> Gate {
        let day_end = self.max_bytes_per_day.map(|_| self.next_day(now));
        let max_bytes = self.max_bytes_per_day.map(|q| q.saturating_sub(used_today));
        if let (Some(0), Some(until), Some(quota)) = (max_bytes, day_end, self.max_bytes_per_day) {
            return Gate::Wait {
                why: Waiting::QuotaSpent { quota },
                until,
            };
        }
        if self.windows.is_empty() {
            let schedule = day_end.map(|end| Schedule::until(now, end, None));
            return Gate::Stage {
                schedule,
                max_bytes,
            };
        }
        let ivs = self.intervals(now, now + HORIZON);
        let Some(k) = ivs.iter().position(|w| w.end > now) else {
            return Gate::Wait {
                why: Waiting::OutsideWindows,
                until: now + HORIZON,
            };
        };
        if ivs[k].start > now {
            return Gate::Wait {
                why: Waiting::OutsideWindows,
                until: ivs[k].start,
            };
        }
        // The stretch of back-to-back windows open now, cut at the end of the quota day.
        let mut stretch = vec![ivs[k]];
        for w in &ivs[k + 1..] {
            if w.start != stretch.last().expect("not empty").end {
                break;
            }
            stretch.push(*w);
        }
        if let Some(end) = day_end {
            stretch.retain(|w| w.start < end);
            for w in &mut stretch {
                w.end = w.end.min(end);
            }
        }
        Gate::Stage {
            schedule: Some(Schedule::new(stretch).expect("sorted, disjoint, not empty")),
            max_bytes,
        }
    }

    /// When failure bundles may go at `now`, `used_today` of today's quota spent: as a stage
    /// would (inside a window, within the quota left), never outside.
    pub fn bundle_allowance(&self, now: DateTime<Utc>, used_today: u64) -> BundleAllowance {
        match self.gate(now, used_today) {
            Gate::Stage { max_bytes, .. } => BundleAllowance {
                open: true,
                max_bytes,
            },
            Gate::Wait { .. } => BundleAllowance {
                open: false,
                max_bytes: Some(0),
            },
        }
    }

    /// Bytes that can arrive from `now` to `deadline` at the windows' rates (each capped by
    /// `spec.maxRate`) within the daily quota, `used_today` of today's spent; `None`: no bound
    /// (an uncapped window or no windows and no cap, and no quota).
    pub fn capacity(
        &self,
        now: DateTime<Utc>,
        deadline: DateTime<Utc>,
        used_today: u64,
    ) -> Option<u64> {
        let open = if self.windows.is_empty() {
            vec![Interval {
                start: now,
                end: deadline,
                rate: None,
            }]
        } else {
            self.intervals(now, deadline)
        };
        let mut total: Option<u64> = Some(0);
        let (mut t, mut first) = (now, true);
        while t < deadline {
            let end = self.next_day(t).min(deadline);
            let mut day: Option<f64> = Some(0.0);
            for w in &open {
                let (a, b) = (w.start.max(t), w.end.min(end));
                if a >= b {
                    continue;
                }
                let secs = (b - a).as_seconds_f64();
                day = match (day, lower(w.rate, self.max_rate)) {
                    (Some(d), Some(r)) => Some(d + r as f64 * secs),
                    _ => None,
                };
            }
            let quota = self.max_bytes_per_day.map(|q| {
                if first {
                    q.saturating_sub(used_today)
                } else {
                    q
                }
            });
            let day = match (day, quota) {
                (Some(d), Some(q)) => Some((d as u64).min(q)),
                (Some(d), None) => Some(d as u64),
                (None, q) => q,
            };
            total = match (total, day) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            };
            (t, first) = (end, false);
        }
        total
    }

    /// Whether `left` bytes cannot arrive before `deadline` ([`Self::capacity`]).
    pub fn will_miss(
        &self,
        left: u64,
        now: DateTime<Utc>,
        deadline: DateTime<Utc>,
        used_today: u64,
    ) -> bool {
        left > 0
            && self
                .capacity(now, deadline, used_today)
                .is_some_and(|c| c < left)
    }
}

/// The lower of two rates, `None` being unlimited.
fn lower(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

/// Why a node's stage cannot be done before the next maintenance window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Miss {
    /// Bytes left to fetch.
    pub left: u64,
    /// What can arrive by then.
    pub capacity: u64,
    /// The next maintenance window's start.
    pub deadline: DateTime<Utc>,
}

impl Miss {
    /// The line this node's miss adds to the condition and its Event.
    pub fn line(&self, node: &str) -> String {
        format!(
            "node {node}: {} left to fetch, at most {} can arrive before the maintenance window at {} (spec.stage.windows rates, spec.maxRate, spec.stage.maxBytesPerDay)",
            libupgrade::units::Size(self.left),
            libupgrade::units::Size(self.capacity),
            self.deadline
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::channel::crd::{StageSpec, StageWindowSpec, WindowSpec};
    use libupgrade::Allowance;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn win(
        days: &[&str],
        start: &str,
        len: &str,
        tz: Option<&str>,
        rate: Option<&str>,
    ) -> StageWindowSpec {
        StageWindowSpec {
            window: WindowSpec {
                days: days.iter().map(|s| s.to_string()).collect(),
                start: start.into(),
                length: len.into(),
                time_zone: tz.map(Into::into),
            },
            max_rate: rate.map(Into::into),
        }
    }

    fn policy(
        windows: Vec<StageWindowSpec>,
        quota: Option<&str>,
        max_rate: Option<u64>,
    ) -> ThinPolicy {
        let spec = UpdateChannelSpec {
            stage: Some(StageSpec {
                windows,
                max_bytes_per_day: quota.map(Into::into),
                prefer: None,
            }),
            ..Default::default()
        };
        ThinPolicy::from_spec(&spec, max_rate).unwrap()
    }

    fn err(windows: Vec<StageWindowSpec>, quota: Option<&str>, sources: &[&str]) -> String {
        let spec = UpdateChannelSpec {
            stage: Some(StageSpec {
                windows,
                max_bytes_per_day: quota.map(Into::into),
                prefer: None,
            }),
            sources: sources.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        ThinPolicy::from_spec(&spec, None).unwrap_err()
    }

    #[test]
    fn bad_input_names_the_field() {
        let e = err(vec![win(&[], "01:00", "1h", None, Some("fast"))], None, &[]);
        assert!(e.starts_with("spec.stage.windows[0].maxRate:"), "{e}");
        let e = err(vec![win(&[], "25:00", "1h", None, None)], None, &[]);
        assert!(
            e.starts_with("spec.stage.windows[0]: spec.window.start"),
            "{e}"
        );
        let e = err(vec![], Some("0"), &[]);
        assert!(
            e.contains("spec.stage.maxBytesPerDay: '0' must be more than 0"),
            "{e}"
        );
        let e = err(vec![], Some("lots"), &[]);
        assert!(e.starts_with("spec.stage.maxBytesPerDay:"), "{e}");
        let e = err(vec![], None, &["/mnt/usb", "ftp://x"]);
        assert!(e.starts_with("spec.sources[1]: 'ftp://x'"), "{e}");
    }

    #[test]
    fn outside_every_window_nothing_runs_until_the_next_opens() {
        let p = policy(vec![win(&[], "01:00", "4h", None, Some("2M"))], None, None);
        assert_eq!(
            p.gate(utc("2026-12-03T12:00:00Z"), 0),
            Gate::Wait {
                why: Waiting::OutsideWindows,
                until: utc("2026-12-04T01:00:00Z")
            }
        );
        let Gate::Stage {
            schedule,
            max_bytes,
        } = p.gate(utc("2026-12-04T02:00:00Z"), 0)
        else {
            panic!("inside the window")
        };
        assert_eq!(max_bytes, None);
        let s = schedule.unwrap();
        assert_eq!(
            s.windows(),
            &[Interval {
                start: utc("2026-12-04T01:00:00Z"),
                end: utc("2026-12-04T05:00:00Z"),
                rate: Some(2 << 20)
            }]
        );
    }

    #[test]
    fn a_rate_zero_window_blocks_and_overlaps_take_the_lower_rate() {
        // Every night 00:00-06:00 at 1M; Sundays 02:00-04:00 nothing; 05:00-08:00 at 4M.
        let p = policy(
            vec![
                win(&[], "00:00", "6h", None, Some("1M")),
                win(&["sun"], "02:00", "2h", None, Some("0")),
                win(&[], "05:00", "3h", None, Some("4M")),
            ],
            None,
            None,
        );
        // 2026-12-06 is a Sunday.
        let ivs = p.intervals(utc("2026-12-06T00:00:00Z"), utc("2026-12-06T12:00:00Z"));
        let m = 1u64 << 20;
        assert_eq!(
            ivs,
            vec![
                Interval {
                    start: utc("2026-12-06T00:00:00Z"),
                    end: utc("2026-12-06T02:00:00Z"),
                    rate: Some(m)
                },
                Interval {
                    start: utc("2026-12-06T04:00:00Z"),
                    end: utc("2026-12-06T06:00:00Z"),
                    rate: Some(m)
                },
                Interval {
                    start: utc("2026-12-06T06:00:00Z"),
                    end: utc("2026-12-06T08:00:00Z"),
                    rate: Some(4 * m)
                },
            ]
        );
        assert_eq!(
            p.gate(utc("2026-12-06T03:00:00Z"), 0),
            Gate::Wait {
                why: Waiting::OutsideWindows,
                until: utc("2026-12-06T04:00:00Z")
            }
        );
        // A stage started at 04:30 runs through the back-to-back stretch to 08:00.
        let Gate::Stage {
            schedule: Some(s), ..
        } = p.gate(utc("2026-12-06T04:30:00Z"), 0)
        else {
            panic!()
        };
        assert_eq!(s.windows().len(), 2);
        assert!(matches!(
            s.at(utc("2026-12-06T08:00:00Z")),
            Allowance::Over { .. }
        ));
    }

    #[test]
    fn the_quota_counts_per_local_day_and_cuts_the_stretch_at_midnight() {
        let p = policy(
            vec![win(&[], "22:00", "4h", Some("Europe/Berlin"), None)],
            Some("100M"),
            None,
        );
        let q = 100u64 << 20;
        // 23:30 Berlin (22:30 UTC) on 2026-12-03: 40M spent today.
        let now = utc("2026-12-03T22:30:00Z");
        assert_eq!(p.day(now), NaiveDate::from_ymd_opt(2026, 12, 3).unwrap());
        let Gate::Stage {
            schedule: Some(s),
            max_bytes,
        } = p.gate(now, 40 << 20)
        else {
            panic!()
        };
        assert_eq!(max_bytes, Some(60 << 20));
        assert_eq!(
            s.windows().last().unwrap().end,
            utc("2026-12-03T23:00:00Z"),
            "Berlin midnight"
        );
        assert_eq!(
            p.gate(now, q),
            Gate::Wait {
                why: Waiting::QuotaSpent { quota: q },
                until: utc("2026-12-03T23:00:00Z")
            }
        );
        // Past Berlin midnight it is a new day (the caller reads that day's ledger: 0).
        let after = utc("2026-12-03T23:00:01Z");
        assert_eq!(p.day(after), NaiveDate::from_ymd_opt(2026, 12, 4).unwrap());
        assert!(matches!(p.gate(after, 0), Gate::Stage { max_bytes: Some(m), .. } if m == q));
    }

    #[test]
    fn no_windows_and_no_quota_means_any_time_without_limits() {
        let p = policy(vec![], None, Some(1 << 20));
        assert_eq!(
            p.gate(utc("2026-12-03T12:00:00Z"), 0),
            Gate::Stage {
                schedule: None,
                max_bytes: None
            }
        );
    }

    #[test]
    fn capacity_follows_rates_caps_and_quota() {
        let k = 1024u64;
        // 2 h a night at 100K, capped by maxRate 50K: 360_000 s·K/… per night.
        let p = policy(
            vec![win(&[], "01:00", "2h", None, Some("100K"))],
            None,
            Some(50 * k),
        );
        let now = utc("2026-12-03T12:00:00Z");
        let two_nights = utc("2026-12-05T12:00:00Z");
        assert_eq!(p.capacity(now, two_nights, 0), Some(2 * 7200 * 50 * k));
        assert!(!p.will_miss(2 * 7200 * 50 * k, now, two_nights, 0));
        assert!(p.will_miss(2 * 7200 * 50 * k + 1, now, two_nights, 0));
        // A quota of 100M a day bounds each night; today's 30M are spent, but tonight is the
        // 4th (UTC day), so both nights get a full quota.
        let p = policy(
            vec![win(&[], "01:00", "2h", None, None)],
            Some("100M"),
            None,
        );
        assert_eq!(p.capacity(now, two_nights, 30 << 20), Some(200 << 20));
        // From inside tonight's window: today's remainder only.
        let inside = utc("2026-12-04T02:00:00Z");
        assert_eq!(
            p.capacity(inside, utc("2026-12-04T12:00:00Z"), 30 << 20),
            Some(70 << 20)
        );
        // No windows, no cap, no quota: no bound.
        let p = policy(vec![], None, None);
        assert_eq!(p.capacity(now, two_nights, 0), None);
        assert!(!p.will_miss(u64::MAX, now, two_nights, 0));
        // No windows, a cap: the whole time at the cap.
        let p = policy(vec![], None, Some(k));
        assert_eq!(
            p.capacity(now, utc("2026-12-03T13:00:00Z"), 0),
            Some(3600 * k)
        );
    }

    #[test]
    fn capacity_counts_elapsed_time_across_a_dst_change() {
        // Berlin falls back on 2026-10-25: the 01:00-05:00 local window lasts 4 h elapsed
        // (as every window), and the quota day of the 25th is 25 h long.
        let p = policy(
            vec![win(
                &["sun"],
                "01:00",
                "4h",
                Some("Europe/Berlin"),
                Some("1K"),
            )],
            None,
            None,
        );
        let from = utc("2026-10-24T12:00:00Z");
        let to = utc("2026-10-26T12:00:00Z");
        assert_eq!(p.capacity(from, to, 0), Some(4 * 3600 * 1024));
        assert_eq!(
            p.next_day(utc("2026-10-24T23:00:00Z")),
            utc("2026-10-25T23:00:00Z"),
            "midnight CET after the 25-hour day"
        );
    }

    #[test]
    fn failure_bundles_go_as_a_stage_would_inside_a_window_within_the_quota_left() {
        let p = policy(
            vec![win(&[], "22:00", "4h", Some("Europe/Berlin"), None)],
            Some("100M"),
            None,
        );
        let inside = utc("2026-12-03T22:30:00Z");
        assert_eq!(
            p.bundle_allowance(inside, 40 << 20),
            BundleAllowance {
                open: true,
                max_bytes: Some(60 << 20)
            }
        );
        assert!(!p.bundle_allowance(inside, 100 << 20).open, "quota spent");
        assert!(
            !p.bundle_allowance(utc("2026-12-03T12:00:00Z"), 0).open,
            "outside the window"
        );
    }
}
