//! Whether a node tries again a release that failed on it: the one decision the CLI's
//! `upgrade`, the agent and `slot status` take, so none of them re-derives it.
//!
//! A release that failed here (a trial whose checks failed, a fallback, a rollback: the
//! node's [`FailedRelease`]) is not staged again by itself: on a timer that would be a loop of
//! downloads, reboots and rollbacks on the site's thin link. It is tried again only when the
//! publisher says so in its rollout ([`Retries`], like Mender's deployment retries): `count`
//! further attempts, the first `backoff_secs` after the last failure, each next one twice as
//! long after. A release of another generation (a fix published under the same version) or
//! a newer release is another release: it has no record and proceeds as usual.

use chrono::{DateTime, Utc};

use super::plan::Retries;
use crate::state::FailedRelease;

/// What a node does about a release it is about to stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// Stage it: it never failed here, or the rollout's retries allow one more attempt now.
    Proceed,
    /// Hold it back.
    Wait {
        /// One sentence for people, beginning with "failed here" (the reason recorded is
        /// escaped).
        why: String,
        /// When an attempt is allowed again (None: not before a newer release, or a rollout
        /// with more retries, is published).
        until: Option<DateTime<Utc>>,
    },
}

impl std::fmt::Display for Retry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Retry::Proceed => f.write_str("proceed"),
            Retry::Wait { why, .. } => f.write_str(why),
        }
    }
}

/// The time `secs` Unix seconds name (the latest time there is for one out of range, so a
/// wait until it never ends early).
fn time(secs: u64) -> DateTime<Utc> {
    i64::try_from(secs)
        .ok()
        .and_then(|s| DateTime::from_timestamp(s, 0))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Decide whether the release `failed` is the record of (None: it never failed here) is
/// staged at `now`, under its rollout's `retries` (None: no retries).
pub fn decide(
    failed: Option<&FailedRelease>,
    retries: Option<Retries>,
    now: DateTime<Utc>,
) -> Retry {
    let Some(f) = failed else {
        return Retry::Proceed;
    };
    let last = time(f.at);
    let generation = f
        .generation
        .map_or(String::new(), |g| format!(" (generation {g})"));
    let said = format!(
        "failed here: {}{generation} failed {} time(s) on this node, last at {}: {}",
        f.version.escape_debug(),
        f.attempts,
        last.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        f.why.escape_debug()
    );
    let allowed = retries.map_or(0, |r| r.count);
    let Some(r) = retries.filter(|_| f.attempts <= allowed) else {
        let more = match retries {
            Some(r) => format!("more than the {} retries it allows", r.count),
            None => "retries".to_string(),
        };
        return Retry::Wait {
            why: format!(
                "{said}; not tried again until a newer release is published or its rollout allows {more}"
            ),
            until: None,
        };
    };
    let doublings = f.attempts.saturating_sub(1).min(32);
    let wait = r.backoff_secs.saturating_mul(1u64 << doublings);
    let until = time(f.at.saturating_add(wait));
    if now >= until {
        return Retry::Proceed;
    }
    Retry::Wait {
        why: format!(
            "{said}; retry {} of {allowed} the rollout allows, not before {}",
            f.attempts,
            until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        until: Some(until),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000;

    fn failed(attempts: u32) -> FailedRelease {
        FailedRelease {
            version: "v2".into(),
            generation: Some(2),
            attempts,
            at: T0,
            why: "50-app: app is down\n".into(),
        }
    }

    fn at(secs_after: u64) -> DateTime<Utc> {
        time(T0 + secs_after)
    }

    fn retries(count: u32) -> Option<Retries> {
        Some(Retries {
            count,
            backoff_secs: 3600,
        })
    }

    /// (attempts failed, retries allowed, seconds after the last failure) → proceed, or wait
    /// until (None: for a newer release).
    #[test]
    fn the_table() {
        type Row = (u32, Option<u32>, u64, Option<Option<u64>>);
        let rows: &[Row] = &[
            // No rollout retries: held for good, at any time.
            (1, None, 0, Some(None)),
            (1, None, 10 * 86_400, Some(None)),
            (1, Some(0), 10 * 86_400, Some(None)),
            // One retry: after 1 h, not before.
            (1, Some(1), 0, Some(Some(3600))),
            (1, Some(1), 3599, Some(Some(3600))),
            (1, Some(1), 3600, None),
            // Failed again: the one retry is spent.
            (2, Some(1), 100 * 3600, Some(None)),
            // Three retries: 1 h, then 2 h, then 4 h after each failure.
            (2, Some(3), 7199, Some(Some(7200))),
            (2, Some(3), 7200, None),
            (3, Some(3), 14_399, Some(Some(14_400))),
            (3, Some(3), 14_400, None),
            (4, Some(3), 100 * 3600, Some(None)),
        ];
        for &(attempts, count, after, want) in rows {
            let got = decide(Some(&failed(attempts)), count.and_then(retries), at(after));
            match (want, &got) {
                (None, Retry::Proceed) => {}
                (Some(until), Retry::Wait { why, until: u }) => {
                    assert_eq!(*u, until.map(at), "{attempts} {count:?} {after}");
                    assert!(
                        why.starts_with("failed here: v2 (generation 2) failed"),
                        "{why}"
                    );
                    assert!(why.contains("50-app: app is down\\n"), "escaped: {why}");
                }
                _ => panic!("{attempts} {count:?} {after}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_release_that_never_failed_here_proceeds() {
        assert_eq!(decide(None, None, at(0)), Retry::Proceed);
    }

    #[test]
    fn huge_counts_and_backoffs_do_not_overflow() {
        let r = Some(Retries {
            count: u32::MAX,
            backoff_secs: u64::MAX,
        });
        let mut f = failed(u32::MAX - 1);
        f.at = u64::MAX;
        assert!(matches!(
            decide(Some(&f), r, at(0)),
            Retry::Wait { until: Some(_), .. }
        ));
    }

    /// Property: more time never turns a proceed into a wait, and a wait's `until` is when
    /// it turns into a proceed.
    #[test]
    fn waiting_ends_exactly_at_until() {
        for attempts in 1..6 {
            for count in 0..6 {
                let f = failed(attempts);
                let mut proceeded = false;
                for step in 0..40u64 {
                    let now = at(step * 1800);
                    match decide(Some(&f), retries(count), now) {
                        Retry::Proceed => proceeded = true,
                        Retry::Wait { until, .. } => {
                            assert!(!proceeded, "a wait after a proceed");
                            if let Some(u) = until {
                                assert!(u > now);
                                assert_eq!(decide(Some(&f), retries(count), u), Retry::Proceed);
                            }
                        }
                    }
                }
                assert_eq!(proceeded, attempts <= count, "{attempts} {count}");
            }
        }
    }
}
