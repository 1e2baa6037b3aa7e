//! The signed per-release rollout data: its waves, its pause, its withdrawal and its required
//! stop, how it is checked, and the publisher's pure transitions (pause, resume, withdraw).
//!
//! Every field is optional so that a node that does not know this object (v0.1.0, v0.2.0
//! before it) skips it, and so that a later format 1 can only grow by optional fields.
//! Shares are integers in basis points (1/100 of a percent) because the object is signed as
//! canonical JSON, which has no floating-point numbers.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::schedule::{self, Wave};

/// The rollout format this build writes and the newest it reads. Absent in the data means 1.
/// A node that finds a newer one offers nothing of that release (it cannot tell whom the
/// publisher meant to admit) and names both formats.
pub const ROLLOUT_FORMAT: u32 = 1;

/// A share of the fleet that is the whole fleet, in basis points.
pub const WHOLE_FLEET_BP: u32 = 10_000;

fn format_v1() -> u32 {
    1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How one release is rolled out, carried in the signed target's custom data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// [`ROLLOUT_FORMAT`]; absent means 1.
    #[serde(default = "format_v1")]
    pub format: u32,
    /// The schedule: points (share, start) with both strictly increasing, the last one the
    /// whole fleet. Empty: the whole fleet at once (what a release without rollout data gets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<Wave>,
    /// Set while the rollout is paused: no node that has not started the release takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// Seconds of every earlier, closed pause: the schedule runs this much later than its
    /// wave times say (see [`Rollout::resume`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub paused_secs: u64,
    /// Set once the release is withdrawn: no node takes it, a node that staged it drops it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdrawn: Option<Withdrawal>,
    /// The required stop: a node running an older generation is offered this release first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_at_least: Option<Floor>,
    /// The publisher lifted the guard's halts of this release up to this `since`: a halt
    /// ([`crate::trust::halt`]) whose `since` is at or before it no longer holds anyone. Only
    /// the publisher's keys sign it (`release resume`); absent: no halt was ever lifted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt_lifted: Option<DateTime<Utc>>,
    /// The publisher's override for nodes on which the release failed: how many more
    /// attempts each may make, and the backoff between them (see [`super::decide_retry`]).
    /// Absent: none (a node where it failed waits for a newer release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retries>,
}

/// Further attempts a node makes of a release that failed on it, like Mender's deployment
/// retries: attempt `n + 1` (after `n` failures, `n <= count`) waits `backoff_secs × 2^(n-1)`
/// after the last failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retries {
    /// Attempts after the first failure.
    pub count: u32,
    /// The wait after the first failure, in seconds; it doubles after each further one.
    #[serde(default = "hour")]
    pub backoff_secs: u64,
}

fn hour() -> u64 {
    3600
}

/// A pause of the rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// When the pause began.
    pub since: DateTime<Utc>,
}

/// A withdrawal of the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Withdrawal {
    /// When it was withdrawn.
    pub at: DateTime<Utc>,
}

/// A required stop: the release a node must run (or have passed) before this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Floor {
    /// The stop's version as the channel lists it.
    pub version: String,
    /// The stop's generation; a node running at least this generation has passed it.
    pub generation: u64,
}

/// Rollout data that breaks a rule; each message names what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    /// The data is in a format newer than this build reads.
    #[error("rollout format {found} is newer than this build reads (format {ROLLOUT_FORMAT}): upgrade k3os-ops")]
    NewerFormat {
        /// The format found.
        found: u32,
    },
    /// Format 0 does not exist.
    #[error("rollout format {found} does not exist (formats start at 1)")]
    BadFormat {
        /// The format found.
        found: u32,
    },
    /// A wave's share is more than the whole fleet.
    #[error(
        "wave {index}: share {share_bp} bp is more than the whole fleet ({WHOLE_FLEET_BP} bp)"
    )]
    ShareTooLarge {
        /// Position of the wave in the list, from 0.
        index: usize,
        /// Its share.
        share_bp: u32,
    },
    /// A wave's share is not larger than the one before.
    #[error("wave {index}: share {share_bp} bp must be larger than the previous wave's {previous_bp} bp")]
    SharesNotIncreasing {
        /// Position of the wave in the list, from 0.
        index: usize,
        /// Its share.
        share_bp: u32,
        /// The previous wave's share.
        previous_bp: u32,
    },
    /// A wave does not start after the one before.
    #[error("wave {index}: start {start} must be later than the previous wave's {previous}")]
    TimesNotIncreasing {
        /// Position of the wave in the list, from 0.
        index: usize,
        /// Its start.
        start: DateTime<Utc>,
        /// The previous wave's start.
        previous: DateTime<Utc>,
    },
    /// The last wave does not reach the whole fleet.
    #[error(
        "the last wave reaches {share_bp} bp; it must reach the whole fleet ({WHOLE_FLEET_BP} bp)"
    )]
    LastNotWhole {
        /// The last wave's share.
        share_bp: u32,
    },
    /// The required stop is not older than the release.
    #[error("required stop {version:?} has generation {stop}, expected one below this release's {generation}")]
    FloorNotOlder {
        /// The stop's version.
        version: String,
        /// The stop's generation.
        stop: u64,
        /// The release's generation.
        generation: u64,
    },
    /// A transition that needs a pause found none, or the reverse.
    #[error("{what}")]
    Transition {
        /// What was asked and what the data says.
        what: String,
    },
}

impl Default for Rollout {
    /// Format [`ROLLOUT_FORMAT`], no waves, not paused, not withdrawn, no required stop: the
    /// whole fleet at once.
    fn default() -> Rollout {
        Rollout {
            format: ROLLOUT_FORMAT,
            waves: Vec::new(),
            paused: None,
            paused_secs: 0,
            withdrawn: None,
            from_at_least: None,
            halt_lifted: None,
            retries: None,
        }
    }
}

impl Rollout {
    /// Check the data of the release of `generation` against every rule: format, shares
    /// (strictly increasing, at most the whole fleet, the last one the whole fleet), start times
    /// (strictly increasing), the required stop (older than the release).
    pub fn validate(&self, generation: u64) -> Result<(), RolloutError> {
        match self.format {
            0 => return Err(RolloutError::BadFormat { found: 0 }),
            f if f > ROLLOUT_FORMAT => return Err(RolloutError::NewerFormat { found: f }),
            _ => {}
        }
        for (index, w) in self.waves.iter().enumerate() {
            if w.share_bp > WHOLE_FLEET_BP {
                return Err(RolloutError::ShareTooLarge {
                    index,
                    share_bp: w.share_bp,
                });
            }
            let Some(prev) = index.checked_sub(1).map(|i| self.waves[i]) else {
                continue;
            };
            if w.share_bp <= prev.share_bp {
                return Err(RolloutError::SharesNotIncreasing {
                    index,
                    share_bp: w.share_bp,
                    previous_bp: prev.share_bp,
                });
            }
            if w.start <= prev.start {
                return Err(RolloutError::TimesNotIncreasing {
                    index,
                    start: w.start,
                    previous: prev.start,
                });
            }
        }
        if let Some(last) = self.waves.last() {
            if last.share_bp != WHOLE_FLEET_BP {
                return Err(RolloutError::LastNotWhole {
                    share_bp: last.share_bp,
                });
            }
        }
        if let Some(f) = &self.from_at_least {
            if f.generation >= generation {
                return Err(RolloutError::FloorNotOlder {
                    version: f.version.clone(),
                    stop: f.generation,
                    generation,
                });
            }
        }
        Ok(())
    }

    /// The rollout paused at `at` (the publisher's `pause`). Refused when already paused or
    /// withdrawn (a withdrawal is final; a second pause would lose the first one's start).
    pub fn pause(&self, at: DateTime<Utc>) -> Result<Rollout, RolloutError> {
        self.not_withdrawn("pause")?;
        if let Some(p) = self.paused {
            return Err(RolloutError::Transition {
                what: format!(
                    "cannot pause: the rollout is already paused since {}",
                    p.since
                ),
            });
        }
        Ok(Rollout {
            paused: Some(Pause { since: at }),
            ..self.clone()
        })
    }

    /// The rollout resumed at `at` (the publisher's `resume`): the pause is lifted and its
    /// length added to [`Rollout::paused_secs`], so the schedule continues from the share it
    /// held when the pause began instead of jumping to where the wave times have moved on
    /// meanwhile (which would admit every node of the skipped stretch in the same hour, the
    /// burst waves exist to avoid). Refused when not paused, or when `at` is before the pause.
    pub fn resume(&self, at: DateTime<Utc>) -> Result<Rollout, RolloutError> {
        self.not_withdrawn("resume")?;
        let Some(p) = self.paused else {
            return Err(RolloutError::Transition {
                what: "cannot resume: the rollout is not paused".into(),
            });
        };
        let held = at.signed_duration_since(p.since);
        if held < Duration::zero() {
            return Err(RolloutError::Transition {
                what: format!(
                    "cannot resume at {at}: the pause began later, at {}",
                    p.since
                ),
            });
        }
        Ok(Rollout {
            paused: None,
            paused_secs: self
                .paused_secs
                .saturating_add(held.num_seconds().unsigned_abs()),
            ..self.clone()
        })
    }

    /// The guard's halt that began at `since` lifted at `at` (the publisher's `resume` of a
    /// halted release): [`Rollout::halt_lifted`] moves to `since`, and the time the halt held
    /// the schedule is added to [`Rollout::paused_secs`] as a pause's is. The held time counts
    /// from `since`, but never from before the first wave's start nor an earlier lift (a
    /// guard's `since` far in the past must not stall the rollout for years), and is zero when
    /// `since` is after `at`. A publisher's own pause is kept (lift it with [`Rollout::resume`]).
    pub fn lift_halt(
        &self,
        since: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Result<Rollout, RolloutError> {
        self.not_withdrawn("lift a halt of")?;
        if self.halt_lifted.is_some_and(|l| since <= l) {
            return Err(RolloutError::Transition {
                what: format!(
                    "cannot lift the halt since {since}: halts up to {} are already lifted",
                    self.halt_lifted.expect("checked")
                ),
            });
        }
        let floor = [self.halt_lifted, self.waves.first().map(|w| w.start)]
            .into_iter()
            .flatten()
            .max();
        let from = floor.map_or(since, |f| since.max(f));
        // From the publisher's own pause on, that pause held the schedule: its resume counts it.
        let until = self.paused.map_or(at, |p| at.min(p.since));
        let held = until.signed_duration_since(from).num_seconds().max(0);
        Ok(Rollout {
            halt_lifted: Some(since),
            paused_secs: self.paused_secs.saturating_add(held.unsigned_abs()),
            ..self.clone()
        })
    }

    /// The release withdrawn at `at` (the publisher's `withdraw`); final. Withdrawing twice
    /// keeps the first time.
    pub fn withdraw(&self, at: DateTime<Utc>) -> Rollout {
        Rollout {
            withdrawn: Some(self.withdrawn.unwrap_or(Withdrawal { at })),
            ..self.clone()
        }
    }

    /// The share of the fleet offered this release at `now` (not counting pause, which holds
    /// the nodes that have not started, nor withdrawal), in parts per million.
    pub fn share_ppm_at(&self, now: DateTime<Utc>) -> u32 {
        schedule::threshold(&self.waves, self.schedule_time(now))
    }

    /// The point of the schedule that applies at `now`: `now` less every closed pause, held
    /// at the pause's start while paused.
    pub(crate) fn schedule_time(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let shifted = |t: DateTime<Utc>| {
            let secs = i64::try_from(self.paused_secs).unwrap_or(i64::MAX);
            t.checked_sub_signed(Duration::seconds(secs))
                .unwrap_or(DateTime::<Utc>::MIN_UTC)
        };
        match self.paused {
            Some(p) if p.since <= now => shifted(p.since),
            _ => shifted(now),
        }
    }

    fn not_withdrawn(&self, verb: &str) -> Result<(), RolloutError> {
        match self.withdrawn {
            Some(w) => Err(RolloutError::Transition {
                what: format!("cannot {verb}: the release was withdrawn at {}", w.at),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
    }

    fn standard() -> Rollout {
        Rollout {
            waves: vec![
                Wave {
                    share_bp: 100,
                    start: t(0),
                },
                Wave {
                    share_bp: 1_000,
                    start: t(24),
                },
                Wave {
                    share_bp: 5_000,
                    start: t(48),
                },
                Wave {
                    share_bp: 10_000,
                    start: t(72),
                },
            ],
            ..Rollout::default()
        }
    }

    #[test]
    fn absent_fields_read_as_an_open_format_1_rollout_and_are_not_written() {
        let r: Rollout = serde_json::from_str("{}").unwrap();
        assert_eq!(
            r,
            Rollout {
                format: 1,
                ..Rollout::default()
            }
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"format":1}"#);
        let back: Rollout =
            serde_json::from_str(&serde_json::to_string(&standard()).unwrap()).unwrap();
        assert_eq!(
            back,
            Rollout {
                format: 1,
                ..standard()
            }
        );
    }

    #[test]
    fn unknown_fields_of_a_later_format_1_are_skipped() {
        let r: Rollout = serde_json::from_str(r#"{"format":1,"later":true}"#).unwrap();
        assert_eq!(r.format, 1);
    }

    #[test]
    fn every_rule_is_checked_and_named() {
        let ok = Rollout {
            format: 1,
            ..standard()
        };
        ok.validate(5).unwrap();
        let mut r = ok.clone();
        r.format = 2;
        assert!(r
            .validate(5)
            .unwrap_err()
            .to_string()
            .contains("format 2 is newer"));
        r.format = 0;
        assert!(matches!(
            r.validate(5),
            Err(RolloutError::BadFormat { found: 0 })
        ));
        let mut r = ok.clone();
        r.waves[1].share_bp = 100;
        let e = r.validate(5).unwrap_err().to_string();
        assert!(
            e.contains("wave 1") && e.contains("larger than the previous wave's 100 bp"),
            "{e}"
        );
        let mut r = ok.clone();
        r.waves[2].start = t(24);
        assert!(matches!(
            r.validate(5),
            Err(RolloutError::TimesNotIncreasing { index: 2, .. })
        ));
        let mut r = ok.clone();
        r.waves[3].share_bp = 10_001;
        assert!(matches!(
            r.validate(5),
            Err(RolloutError::ShareTooLarge { index: 3, .. })
        ));
        let mut r = ok.clone();
        r.waves.pop();
        assert!(matches!(
            r.validate(5),
            Err(RolloutError::LastNotWhole { share_bp: 5_000 })
        ));
        let mut r = ok.clone();
        r.from_at_least = Some(Floor {
            version: "v5".into(),
            generation: 5,
        });
        let e = r.validate(5).unwrap_err().to_string();
        assert!(
            e.contains("\"v5\" has generation 5, expected one below this release's 5"),
            "{e}"
        );
    }

    #[test]
    fn a_resume_shifts_the_schedule_by_the_pause() {
        let r = standard().pause(t(30)).unwrap();
        assert!(r.pause(t(31)).is_err());
        assert!(r.resume(t(29)).is_err());
        let held = r.share_ppm_at(t(30));
        assert_eq!(r.share_ppm_at(t(39)), held);
        let resumed = r.resume(t(40)).unwrap();
        assert_eq!(resumed.paused_secs, 10 * 3600);
        assert_eq!(resumed.share_ppm_at(t(40)), held);
        assert_eq!(resumed.share_ppm_at(t(58)), standard().share_ppm_at(t(48)));
        assert!(resumed.resume(t(41)).is_err());
    }

    #[test]
    fn a_withdrawal_is_final() {
        let w = standard().withdraw(t(5));
        assert_eq!(w.withdraw(t(9)).withdrawn, Some(Withdrawal { at: t(5) }));
        assert!(w
            .pause(t(6))
            .unwrap_err()
            .to_string()
            .contains("withdrawn at"));
    }
}
