//! One back-off for the agent's retried attempts: claims after an aborted disruption and
//! stages after a failed one. It counts failures in a row and says until when the next
//! attempt waits; [`super::decide::step`] reads that time, the steps only count.
//!
//! The delay doubles per failure in a row from the first one and is capped at an hour:
//! claims 5, 10, 20, 40, 60 min ([`Cooldown::claims`]), stages 2, 4, 8, 16, 32, 60 min
//! ([`Cooldown::stages`]). It lives in the process only (see [`crate::agent::context::Memory`]).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The longest any back-off waits.
pub const CAP: Duration = Duration::from_secs(3600);

/// Failures in a row and the earliest next attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cooldown {
    first: Duration,
    failures: u32,
    not_before: Option<DateTime<Utc>>,
}

impl Cooldown {
    /// A back-off whose first delay is `first`.
    pub fn new(first: Duration) -> Cooldown {
        Cooldown {
            first,
            failures: 0,
            not_before: None,
        }
    }

    /// Claims after an aborted disruption (a drain that is refused must not cordon the node
    /// every resync): 5 min, doubling.
    pub fn claims() -> Cooldown {
        Cooldown::new(Duration::from_secs(300))
    }

    /// Stages after a failed one: 2 min, doubling.
    pub fn stages() -> Cooldown {
        Cooldown::new(Duration::from_secs(120))
    }

    /// The delay after `n` failures in a row (`n` ≥ 1).
    pub fn delay(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(16);
        (self.first * (1u32 << doublings)).min(CAP)
    }

    /// Count a failure at `now`: the number of failures in a row and the delay until the
    /// next attempt.
    pub fn failed(&mut self, now: DateTime<Utc>) -> (u32, Duration) {
        self.failures = self.failures.saturating_add(1);
        let delay = self.delay(self.failures);
        // Whole seconds, as the phase message counts them.
        let from = DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now);
        self.not_before = Some(from + chrono::Duration::from_std(delay).unwrap_or_default());
        (self.failures, delay)
    }

    /// A success: the next failure waits the first delay again. (A running back-off still
    /// runs out, as before.)
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// Until when the next attempt waits at `now`, if it does.
    pub fn waits_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.not_before.filter(|t| now < *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn claims_wait_five_minutes_doubling_up_to_an_hour() {
        let mut c = Cooldown::claims();
        let delays: Vec<u64> = (0..6).map(|_| c.failed(at(0)).1.as_secs()).collect();
        assert_eq!(delays, [300, 600, 1200, 2400, 3600, 3600]);
    }

    #[test]
    fn stages_wait_two_minutes_doubling_up_to_an_hour() {
        let mut c = Cooldown::stages();
        let delays: Vec<u64> = (0..8).map(|_| c.failed(at(0)).1.as_secs()).collect();
        assert_eq!(delays, [120, 240, 480, 960, 1920, 3600, 3600, 3600]);
    }

    #[test]
    fn the_wait_ends_at_the_delay_and_a_success_starts_over() {
        let mut c = Cooldown::claims();
        assert_eq!(c.waits_until(at(0)), None, "nothing failed yet");
        assert_eq!(c.failed(at(0)), (1, Duration::from_secs(300)));
        assert_eq!(c.waits_until(at(299)), Some(at(300)));
        assert_eq!(c.waits_until(at(300)), None);
        assert_eq!(c.failed(at(300)).0, 2);
        c.succeeded();
        assert_eq!(c.failed(at(1000)), (1, Duration::from_secs(300)));
    }
}
