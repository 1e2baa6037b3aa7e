//! The `latest` poller: while this node holds a channel's poller Lease, it resolves `latest`
//! (a pinned channel: its pinned release) for the cluster's seed and publishes what it found
//! ([`crate::agent::cluster::rollout_status`]: `status.latestVersion`, `status.fleetRollout`,
//! the conditions `WaitingForWave` and `ReleaseWithdrawn`). Its resolutions only look
//! (`libupgrade::Writes::Trust`: the node records what it trusted and keeps the verified
//! metadata, so an unchanged channel costs two small downloads) and take the cluster's view
//! (`StageRequest::for_cluster`).
//!
//! **When it polls** ([`Polls`]): every `--poll-secs`; while a newer release waits for this
//! cluster's wave, every `--wait-poll-secs` instead, plus once at the instant the wave reaches
//! the cluster (each seed has its own instant: the waves grow linearly), counted from the
//! resolution's own clock ([`crate::agent::host::ops::NodeOps::rollout_clock`]); and within
//! seconds of a channel's creation or spec change. It reads the channels from the watch cache
//! when the agent has one ([`Agent::channels_now`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::agent::channel::crd::UpdateChannel;
use crate::agent::cluster::kube_store::{acquire_lease, poller_lease_name, LeaseOutcome};
use crate::agent::cluster::slots;
use crate::agent::context::Agent;
use crate::agent::host::requests::{resolve_latest, resolve_pinned};

/// How often the poller looks for new or changed channels (a list), so `latest` is resolved
/// within seconds of a channel's creation or spec change instead of on the next poll tick.
const POLL_LOOK_PERIOD: Duration = Duration::from_secs(10);

/// A channel's last poll: its spec then (uid, generation), when, and when the release it held
/// back for this cluster's wave is admitted.
#[derive(Debug, Clone)]
struct Looked {
    seen: (Option<String>, Option<i64>),
    at: tokio::time::Instant,
    wake: Option<tokio::time::Instant>,
}

impl Looked {
    /// Whether the channel, now with spec `seen`, is due for a poll at `now`: its spec changed,
    /// the period passed (`polls.waiting` while a release waits for this cluster's wave,
    /// `polls.every` otherwise), or the held-back release's admission time came.
    fn due(
        &self,
        seen: &(Option<String>, Option<i64>),
        now: tokio::time::Instant,
        polls: Polls,
    ) -> bool {
        let period = match self.wake {
            Some(_) => polls.waiting.max(polls.every),
            None => polls.every,
        };
        self.seen != *seen
            || now.duration_since(self.at) >= period
            || self.wake.is_some_and(|w| now >= w)
    }
}

/// How long from a resolution judged at `clock` (the node's rollout clock) to poll again for a
/// release admitted at `admitted`: one second past it, so the resolution then sees it admitted.
fn until_admitted(admitted: DateTime<Utc>, clock: DateTime<Utc>) -> Duration {
    (admitted - clock).to_std().unwrap_or_default() + Duration::from_secs(1)
}

/// How often the poller resolves a channel (`--poll-secs`, `--wait-poll-secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polls {
    /// Between polls.
    pub every: Duration,
    /// Between polls while a newer release waits for this cluster's wave (never shorter than
    /// `every`): the poll at the wave's admission instant is made anyway, and a pause, a
    /// withdrawal or a newer release does not change what a waiting cluster does before then,
    /// except a newer release published for it at once, which this period delays.
    pub waiting: Duration,
}

/// Resolve `latest` (or the pinned release) for each channel whose poller Lease this node
/// holds, forever: every `period`, at once (within `POLL_LOOK_PERIOD`) when a channel appears
/// or its spec changes (new `metadata.generation`), and when a release held back for this
/// cluster's wave is admitted (its seed's instant,
/// [`crate::agent::channel::latest::Latest::admitted_at`]): a wave is taken on time whatever
/// `--poll-secs` says, so a site on a thin link can poll hourly.
pub async fn poll_loop(agent: Arc<Agent>, polls: Polls) {
    let leases: Api<Lease> =
        Api::namespaced(agent.clients.client.clone(), &agent.settings.namespace);
    let longest = polls.waiting.max(polls.every);
    let lease_secs = i32::try_from(longest.as_secs().saturating_mul(3)).unwrap_or(i32::MAX);
    let mut looked: BTreeMap<String, Looked> = BTreeMap::new();
    loop {
        if let Ok(list) = agent.channels_now().await {
            let names: Vec<String> = list
                .channels
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            looked.retain(|n, _| names.contains(n));
            for ch in list.channels {
                let name = ch.metadata.name.clone().unwrap_or_default();
                let seen = (ch.metadata.uid.clone(), ch.metadata.generation);
                let now = tokio::time::Instant::now();
                if looked.get(&name).is_some_and(|l| !l.due(&seen, now, polls)) {
                    continue;
                }
                looked.insert(
                    name.clone(),
                    Looked {
                        seen,
                        at: now,
                        wake: None,
                    },
                );
                match acquire_lease(
                    &leases,
                    &poller_lease_name(&name),
                    &agent.settings.node,
                    lease_secs,
                )
                .await
                {
                    Ok(LeaseOutcome::Held) => {}
                    Ok(LeaseOutcome::HeldBy(_)) => continue,
                    Err(e) => {
                        tracing::warn!("poller Lease of {name}: {e}");
                        continue;
                    }
                }
                if let (Some(admitted_in), Some(l)) =
                    (poll(&agent, &ch).await, looked.get_mut(&name))
                {
                    l.wake = Some(tokio::time::Instant::now() + admitted_in);
                }
            }
        }
        tokio::time::sleep(polls.every.min(POLL_LOOK_PERIOD)).await;
    }
}

/// One poll of `ch` by the poller Lease's holder: resolve `latest` (a pinned channel: its
/// pinned release, [`poll_pinned`]) for the cluster's seed (looking only:
/// [`libupgrade::Writes::Trust`]) and publish it (status, conditions, Events), or the failure.
/// Returns how long until the release held back for this cluster's wave is admitted.
async fn poll(agent: &Arc<Agent>, ch: &UpdateChannel) -> Option<Duration> {
    if let Some(version) = ch.spec.pinned_version() {
        return poll_pinned(agent, ch, version).await;
    }
    let url = ch.spec.url.clone();
    let seed = crate::agent::channel::fleet_waves::cluster_seed(ch);
    let resolved = agent
        .blocking(move |ops| Ok((resolve_latest(ops, &url, seed)?, ops.rollout_clock())))
        .await;
    let stale = resolved.as_ref().err().and_then(|e| e.stale().copied());
    if stale.is_some() || resolved.is_ok() {
        agent.report_stale(ch, stale.as_ref()).await;
    }
    let e = match resolved {
        Ok((latest, clock)) => {
            agent.publish_latest(ch, &latest, seed).await;
            return latest.admitted_at().map(|t| until_admitted(t, clock));
        }
        Err(e) => e,
    };
    // Expired metadata was reported as ChannelStale (one Event) above.
    if e.stale().is_none() {
        resolve_failed(agent, ch, &format!("{e:#}")).await;
    }
    None
}

/// A failed resolve of `ch`: the `LatestResolved` condition says why, and the `ResolveFailed`
/// Event is published once per outage (when the condition turns False), not at every poll or
/// every start of an agent while the channel stays unreachable.
async fn resolve_failed(agent: &Arc<Agent>, ch: &UpdateChannel, why: &str) {
    let name = ch.metadata.name.clone().unwrap_or_default();
    match slots::resolve_failed(&agent.store(&name), why, Utc::now()).await {
        Ok(true) => {
            agent
                .event(Some(ch), true, "ResolveFailed", why.to_string())
                .await
        }
        Ok(false) => tracing::debug!("channel {name} still unresolved: {why}"),
        Err(w) => tracing::warn!("write the LatestResolved condition of {name}: {w}"),
    }
}

/// One poll of a pinned channel: whether its rollout offers the pinned `version` to this
/// cluster now, published by `Agent::publish_pinned` (`latestVersion` is not
/// written). A failed resolution is reported as for `latest` (`ChannelStale`, or one
/// `ResolveFailed` Event) and changes nothing else: the verdict last published stands.
/// Returns how long until the pinned release, held back for this cluster's wave, is admitted.
async fn poll_pinned(agent: &Arc<Agent>, ch: &UpdateChannel, version: &str) -> Option<Duration> {
    let (url, v) = (ch.spec.url.clone(), version.to_string());
    let seed = crate::agent::channel::fleet_waves::cluster_seed(ch);
    let ignore = ch.spec.ignores_rollout();
    let resolved = agent
        .blocking(move |ops| {
            Ok((
                resolve_pinned(ops, &url, &v, seed, ignore)?.pinned,
                ops.rollout_clock(),
            ))
        })
        .await;
    let stale = resolved.as_ref().err().and_then(|e| e.stale().copied());
    if stale.is_some() || resolved.is_ok() {
        agent.report_stale(ch, stale.as_ref()).await;
    }
    match resolved {
        Ok((pinned, clock)) => {
            agent.publish_pinned(ch, &pinned, seed).await;
            return match pinned.hold {
                Some(libupgrade::rollout::Hold::Wave { starts: Some(t) }) => {
                    Some(until_admitted(t, clock))
                }
                _ => None,
            };
        }
        // Expired metadata was reported as ChannelStale (one Event) above.
        Err(e) if e.stale().is_none() => resolve_failed(agent, ch, &format!("{e:#}")).await,
        Err(_) => {}
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiting cluster polls at its seed's admission time and otherwise at the waiting
    /// period; a changed spec polls at once; a cluster not waiting polls every period.
    #[test]
    fn a_poll_is_due_at_the_period_a_spec_change_or_the_admission_of_the_held_release() {
        use tokio::time::Instant;
        let t0 = Instant::now();
        let polls = Polls {
            every: Duration::from_secs(900),
            waiting: Duration::from_secs(3600),
        };
        let seen = (Some("uid".to_string()), Some(1));
        let clock = Utc::now();
        let admitted_in = until_admitted(clock + chrono::Duration::minutes(70), clock);
        assert_eq!(admitted_in, Duration::from_secs(70 * 60 + 1));
        let l = Looked {
            seen: seen.clone(),
            at: t0,
            wake: Some(t0 + admitted_in),
        };
        let min = |m: u64| t0 + Duration::from_secs(60 * m);
        assert!(!l.due(&seen, min(15), polls), "waiting: not every 15 min");
        assert!(l.due(&seen, min(60), polls), "waiting: every hour");
        let far = Looked {
            wake: Some(min(600)),
            ..l.clone()
        };
        assert!(!far.due(&seen, min(59), polls));
        let soon = Looked {
            wake: Some(min(10)),
            ..l.clone()
        };
        assert!(!soon.due(&seen, min(9), polls));
        assert!(soon.due(&seen, min(10), polls), "at the admission instant");
        assert!(l.due(&(Some("uid".into()), Some(2)), min(1), polls));
        let idle = Looked { wake: None, ..l };
        assert!(!idle.due(&seen, min(14), polls));
        assert!(idle.due(&seen, min(15), polls));
        // An admission already past by the node's clock: poll again within a second.
        let past = until_admitted(clock - chrono::Duration::hours(1), clock);
        assert_eq!(past, Duration::from_secs(1));
    }
}
