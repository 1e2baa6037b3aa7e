//! The schedule's curve: which seeds a list of waves admits at a point of the schedule, and
//! from when it admits a given seed. Pure integer arithmetic on whole seconds (sub-second
//! digits of a time are dropped), so both directions agree exactly: a seed is admitted at the
//! second [`admits_from`] names and not one second earlier.
//!
//! The curve goes through every wave's point (start, share): 0 before the first start, the
//! first wave's share at its start (a publisher who wants the first wave spread too begins
//! with a 0 bp point), linear between two starts, the last share after the last start.

use chrono::{DateTime, Utc};

use super::seed::SEED_SPACE;
use serde::{Deserialize, Serialize};

/// One point of the schedule: from `start` on, `share_bp` of the fleet is offered the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wave {
    /// Share of the fleet in basis points (100 = 1 %, [`super::WHOLE_FLEET_BP`] = all).
    pub share_bp: u32,
    /// When that share is reached.
    pub start: DateTime<Utc>,
}

/// Seed positions per basis point of share.
const PPM_PER_BP: u64 = SEED_SPACE as u64 / 10_000;

fn ppm(w: &Wave) -> u64 {
    u64::from(w.share_bp) * PPM_PER_BP
}

/// The seeds admitted at schedule time `t`: every seed below the returned bound (in
/// 0..=[`SEED_SPACE`]). No waves: the whole fleet.
pub fn threshold(waves: &[Wave], t: DateTime<Utc>) -> u32 {
    let Some(first) = waves.first() else {
        return SEED_SPACE;
    };
    let now = t.timestamp();
    if now < first.start.timestamp() {
        return 0;
    }
    let bound = match waves.windows(2).find(|p| now < p[1].start.timestamp()) {
        None => ppm(waves.last().unwrap_or(first)),
        Some(p) => {
            let (a, b) = (ppm(&p[0]), ppm(&p[1]));
            let (from, to) = (p[0].start.timestamp(), p[1].start.timestamp());
            let span = i128::from(to - from).max(1);
            let into = i128::from(now - from).clamp(0, span);
            let grown = (i128::from(b.saturating_sub(a)) * into) / span;
            a + u64::try_from(grown).unwrap_or(0)
        }
    };
    u32::try_from(bound.min(u64::from(SEED_SPACE))).unwrap_or(SEED_SPACE)
}

/// The first schedule time at which `seed` is admitted (`threshold > seed`), to the second.
/// `None` when no point of the schedule admits it (only for waves that never reach the whole
/// fleet, which validation refuses). No waves: the earliest time there is.
pub fn admits_from(waves: &[Wave], seed: u32) -> Option<DateTime<Utc>> {
    let Some(first) = waves.first() else {
        return Some(DateTime::<Utc>::MIN_UTC);
    };
    let pos = u64::from(seed);
    if pos < ppm(first) {
        return DateTime::from_timestamp(first.start.timestamp(), 0);
    }
    let p = waves
        .windows(2)
        .find(|p| ppm(&p[0]) <= pos && pos < ppm(&p[1]))?;
    let (a, b) = (ppm(&p[0]), ppm(&p[1]));
    let span = i128::from(p[1].start.timestamp() - p[0].start.timestamp()).max(1);
    let need = i128::from(pos + 1 - a) * span;
    let grow = i128::from(b - a);
    let secs = (need + grow - 1) / grow;
    DateTime::from_timestamp(p[0].start.timestamp() + i64::try_from(secs).ok()?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
    }

    fn waves() -> Vec<Wave> {
        vec![
            Wave {
                share_bp: 100,
                start: t(0),
            },
            Wave {
                share_bp: 1_000,
                start: t(24),
            },
            Wave {
                share_bp: 10_000,
                start: t(48),
            },
        ]
    }

    #[test]
    fn the_curve_steps_to_the_first_share_then_grows_linearly() {
        let w = waves();
        assert_eq!(threshold(&w, t(-1)), 0);
        assert_eq!(threshold(&w, t(0)), 10_000);
        assert_eq!(threshold(&w, t(12)), 55_000);
        assert_eq!(threshold(&w, t(24)), 100_000);
        assert_eq!(threshold(&w, t(36)), 550_000);
        assert_eq!(threshold(&w, t(48)), SEED_SPACE);
        assert_eq!(threshold(&w, t(1000)), SEED_SPACE);
        assert_eq!(threshold(&[], t(-1000)), SEED_SPACE);
    }

    #[test]
    fn a_seed_is_admitted_exactly_from_the_second_named() {
        let w = waves();
        for seed in [0, 9_999, 10_000, 54_999, 55_000, 99_999, 100_000, 999_999] {
            let at = admits_from(&w, seed).unwrap();
            assert!(threshold(&w, at) > seed, "seed {seed} at {at}");
            let before = at - chrono::Duration::seconds(1);
            assert!(
                threshold(&w, before) <= seed,
                "seed {seed} a second before {at}"
            );
        }
        assert_eq!(admits_from(&w, 0), Some(t(0)));
        assert_eq!(admits_from(&w, 55_000).map(|a| a > t(12)), Some(true));
    }
}
