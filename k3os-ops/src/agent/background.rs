//! The agent's background tasks besides the reconcile loop: renewing this node's liveness
//! Lease, reclaiming the slots of dead holders, and (while holding a channel's poller Lease)
//! resolving `latest`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use rand::Rng;

use super::context::Agent;
use super::kube_store::{acquire_lease, node_lease_name, poller_lease_name, LeaseOutcome};
use super::metrics::Outcome;
use super::slots::{self, LivenessObserver};

/// Seconds a node liveness Lease is declared valid (informational: staleness is judged by
/// observers against `spec.rebootTimeout` on their own clocks).
pub const NODE_LEASE_SECS: i32 = 60;
/// How often the node Lease is renewed.
const LIVENESS_PERIOD: Duration = Duration::from_secs(15);
/// Bounds of the period between looks for dead slot holders.
const MIN_RECLAIM_PERIOD: Duration = Duration::from_secs(10);
const MAX_RECLAIM_PERIOD: Duration = Duration::from_secs(120);

/// Period between looks for dead holders: a quarter of the shortest reboot timeout, within
/// [10 s, 120 s], ±25 % jitter; the shortest period while no valid channel exists (so a channel
/// created after the agent started is looked at within seconds, not after the 2-minute cap).
/// Every agent looks (any may reclaim), so on a large fleet this bounds the reads (two per
/// held slot per look) while detection stays within a fraction of the timeout.
pub fn reclaim_period(shortest_reboot_timeout: Option<Duration>) -> Duration {
    let base = shortest_reboot_timeout
        .map_or(MIN_RECLAIM_PERIOD, |t| t / 4)
        .clamp(MIN_RECLAIM_PERIOD, MAX_RECLAIM_PERIOD);
    base.mul_f64(rand::thread_rng().gen_range(0.75..1.25))
}
/// How often the poller looks for new or changed channels (a list), so `latest` is resolved
/// within seconds of a channel's creation or spec change instead of on the next poll tick.
const POLL_LOOK_PERIOD: Duration = Duration::from_secs(10);
/// Renew this node's liveness Lease forever.
pub async fn renew_node_lease(client: Client, namespace: String, node: String) {
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let name = node_lease_name(&node);
    loop {
        if let Err(e) = acquire_lease(&leases, &name, &node, NODE_LEASE_SECS).await {
            tracing::warn!("renew Lease {namespace}/{name}: {e}");
        }
        tokio::time::sleep(LIVENESS_PERIOD).await;
    }
}

/// Reclaim dead holders' slots in every channel, forever.
pub async fn reclaim_loop(agent: Arc<Agent>) {
    let mut observers: BTreeMap<String, LivenessObserver> = BTreeMap::new();
    loop {
        let mut shortest: Option<Duration> = None;
        match super::channels::list(&agent.clients.client, &agent.settings.namespace).await {
            Ok(list) => {
                for ch in list.channels {
                    let name = ch.metadata.name.clone().unwrap_or_default();
                    let Ok(policy) = &ch.policy else {
                        continue;
                    };
                    shortest = Some(shortest.map_or(policy.reboot_timeout, |s: Duration| {
                        s.min(policy.reboot_timeout)
                    }));
                    let obs = observers.entry(name.clone()).or_default();
                    let store = agent.store(&name);
                    match slots::reclaim_dead(
                        &store,
                        &agent.settings.node,
                        obs,
                        policy.reboot_timeout,
                        Utc::now(),
                    )
                    .await
                    {
                        Ok(done) => {
                            for r in done {
                                agent.clients.metrics.count(Outcome::Reclaim);
                                let why = match r.reason {
                                    slots::DeadReason::NodeDeleted => {
                                        "its Node was deleted".to_string()
                                    }
                                    slots::DeadReason::LeaseStale(d) => {
                                        format!("its Lease was not renewed for {}s", d.as_secs())
                                    }
                                };
                                let failure = match (r.failure_recorded, r.uncordoned) {
                                    (true, _) => " (recorded as a failure of its version)",
                                    (false, true) => {
                                        " and uncordoned it (it died before its bootloader flip; its update is abandoned)"
                                    }
                                    (false, false) => "",
                                };
                                agent
                                    .event(
                                        Some(&ch),
                                        true,
                                        "SlotReclaimed",
                                        format!(
                                            "reclaimed the slot of node {}: {why}{failure}",
                                            r.slot.node
                                        ),
                                    )
                                    .await;
                                if let (true, Some(v)) = (r.paused, r.slot.version.as_deref()) {
                                    let out = slots::FailureOutcome {
                                        released: false,
                                        paused: true,
                                    };
                                    agent.failure_recorded(&ch, v, out, "").await;
                                }
                            }
                        }
                        Err(e) => tracing::warn!("reclaim in {name}: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("list UpdateChannels: {}", super::client::kube_message(&e)),
        }
        tokio::time::sleep(reclaim_period(shortest)).await;
    }
}

/// Resolve `latest` for each channel whose poller Lease this node holds, forever: every
/// `period`, and at once (within [`POLL_LOOK_PERIOD`]) when a channel appears or its spec
/// changes (new `metadata.generation`).
pub async fn poll_loop(agent: Arc<Agent>, period: Duration) {
    let leases: Api<Lease> =
        Api::namespaced(agent.clients.client.clone(), &agent.settings.namespace);
    let lease_secs = i32::try_from(period.as_secs().saturating_mul(3)).unwrap_or(i32::MAX);
    // Per channel: (uid, generation) last looked at, and when.
    type Seen = (Option<String>, Option<i64>);
    let mut looked: BTreeMap<String, (Seen, tokio::time::Instant)> = BTreeMap::new();
    loop {
        if let Ok(list) =
            super::channels::list(&agent.clients.client, &agent.settings.namespace).await
        {
            let names: Vec<String> = list
                .channels
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            looked.retain(|n, _| names.contains(n));
            for ch in list.channels {
                if ch.spec.pinned_version().is_some() {
                    continue;
                }
                let name = ch.metadata.name.clone().unwrap_or_default();
                let key = (ch.metadata.uid.clone(), ch.metadata.generation);
                let now = tokio::time::Instant::now();
                let due = looked
                    .get(&name)
                    .is_none_or(|(k, at)| *k != key || now.duration_since(*at) >= period);
                if !due {
                    continue;
                }
                looked.insert(name.clone(), (key, now));
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
                let url = ch.spec.url.clone();
                let resolved = agent.blocking(move |ops| ops.resolve_latest(&url)).await;
                let stale = resolved.as_ref().err().and_then(|e| e.stale().copied());
                if stale.is_some() || resolved.is_ok() {
                    super::stale::report(&agent, &ch, stale.as_ref()).await;
                }
                let store = agent.store(&name);
                let res = match &resolved {
                    Ok(v) => slots::set_latest(&store, Ok(v), Utc::now()).await,
                    Err(e) => slots::set_latest(&store, Err(&format!("{e:#}")), Utc::now()).await,
                };
                match (&resolved, res) {
                    (_, Err(e)) => tracing::warn!("write latestVersion of {name}: {e}"),
                    (Ok(v), Ok(()))
                        if ch.status.as_ref().and_then(|s| s.latest_version.as_deref())
                            != Some(v) =>
                    {
                        agent
                            .event(
                                Some(&ch),
                                false,
                                "LatestResolved",
                                format!("newest release of {} is {v}", ch.spec.url),
                            )
                            .await;
                    }
                    // Expired metadata was reported as ChannelStale (one Event) above.
                    (Err(e), Ok(())) if e.stale().is_none() => {
                        agent
                            .event_once(Some(&ch), true, "ResolveFailed", format!("{e:#}"))
                            .await;
                    }
                    _ => {}
                }
            }
        }
        tokio::time::sleep(period.min(POLL_LOOK_PERIOD)).await;
    }
}
