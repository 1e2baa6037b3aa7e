//! Two of the agent's background tasks besides the reconcile loop: renewing this node's
//! liveness Lease and reclaiming the slots of dead holders (the poller is [`super::poller`]).
//! They read the channels from the watch cache when the agent has one
//! ([`Agent::channels_now`]), so neither lists anything while the fleet is idle.
//!
//! **The liveness Lease period** ([`lease_period`]): a quarter of the shortest
//! `rebootTimeout` of the channels, within [1 s, 5 min] (5 min when there is no channel). A
//! holder is reclaimed when an observer saw its Lease unchanged for `rebootTimeout` on the
//! observer's own clock, counted from the first answer that showed the marker; renewing every
//! `rebootTimeout / 4` leaves three renewals in a row to fail (or to take as long as a
//! period each) before a live holder could be judged silent. The loop also wakes on every
//! change of the channels and renews at once when a channel with a shorter timeout shortens
//! the period below the time since the last renewal. A start-up silence of
//! `rebootTimeout / 2` makes a restarted holder forfeit its claim
//! ([`crate::agent::reconcile::decide::Action::Forfeit`]): the period keeps a restart of up to a quarter of
//! the timeout below that. With the default `rebootTimeout` of 15 min an idle node renews
//! every 3 min 45 s: one PUT (the Lease as last written carries its resourceVersion; a GET
//! only when that write conflicts).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use rand::Rng;

use crate::agent::cluster::kube_store::{
    acquire_lease, node_lease_name, renew_own_lease, LeaseOutcome,
};
use crate::agent::cluster::slots::{self, LivenessObserver};
use crate::agent::context::Agent;
use crate::agent::metrics::Outcome;

/// Bounds of the period between renewals of the node Lease (see the module docs).
const MIN_LEASE_PERIOD: Duration = Duration::from_secs(1);
const MAX_LEASE_PERIOD: Duration = Duration::from_secs(300);

/// Period between renewals of the node liveness Lease: a quarter of the shortest reboot
/// timeout, within [1 s, 5 min] (see the module docs for the bound it keeps).
pub fn lease_period(shortest_reboot_timeout: Option<Duration>) -> Duration {
    shortest_reboot_timeout
        .map_or(MAX_LEASE_PERIOD, |t| t / 4)
        .clamp(MIN_LEASE_PERIOD, MAX_LEASE_PERIOD)
}

/// The shortest `rebootTimeout` of the valid channels.
fn shortest_reboot_timeout(list: &crate::agent::channel::listing::Listed) -> Option<Duration> {
    list.channels
        .iter()
        .filter_map(|c| c.policy.as_ref().ok().map(|p| p.reboot_timeout))
        .min()
}
/// Bounds of the period between looks for dead slot holders.
const MIN_RECLAIM_PERIOD: Duration = Duration::from_secs(10);
const MAX_RECLAIM_PERIOD: Duration = Duration::from_secs(120);

/// Period between looks for dead holders: a quarter of the shortest reboot timeout, within
/// [10 s, 120 s], ±25 % jitter; the shortest period while no valid channel exists (so a channel
/// created after the agent started is looked at within seconds, not after the 2-minute cap).
/// Every agent looks (any may reclaim), so on a large fleet this bounds the reads (two per
/// held slot per look) while detection stays within a fraction of the timeout.
pub fn reclaim_period(shortest_reboot_timeout: Option<Duration>) -> Duration {
    reclaim_period_base(shortest_reboot_timeout).mul_f64(rand::thread_rng().gen_range(0.75..1.25))
}

/// [`reclaim_period`] without its jitter.
fn reclaim_period_base(shortest_reboot_timeout: Option<Duration>) -> Duration {
    shortest_reboot_timeout
        .map_or(MIN_RECLAIM_PERIOD, |t| t / 4)
        .clamp(MIN_RECLAIM_PERIOD, MAX_RECLAIM_PERIOD)
}
/// Renew this node's liveness Lease forever, every `lease_period` (recomputed on every
/// change of the channels when the agent watches them).
pub async fn renew_node_lease(agent: Arc<Agent>) {
    let (namespace, node) = (&agent.settings.namespace, &agent.settings.node);
    let leases: Api<Lease> = Api::namespaced(agent.clients.client.clone(), namespace);
    let name = node_lease_name(node);
    let mut changes = agent
        .clients
        .watched
        .as_ref()
        .map(|w| w.changes.subscribe());
    let mut last: Option<Lease> = None;
    let mut renewed: Option<tokio::time::Instant> = None;
    loop {
        let period = match agent.channels_now().await {
            Ok(list) => lease_period(shortest_reboot_timeout(&list)),
            Err(_) => MIN_LEASE_PERIOD.max(Duration::from_secs(15)),
        };
        if renewed.is_none_or(|t| t.elapsed() >= period) {
            // Declared valid for three periods (informational: observers judge silence
            // against rebootTimeout on their own clocks).
            let secs = i32::try_from(period.as_secs().max(1) * 3).unwrap_or(i32::MAX);
            match renew_own_lease(&leases, &name, node, secs, last.take()).await {
                Ok(l) => last = Some(l),
                Err(e) => tracing::warn!("renew Lease {namespace}/{name}: {e}"),
            }
            renewed = Some(tokio::time::Instant::now());
        }
        let wait = period.saturating_sub(renewed.map_or(Duration::ZERO, |t| t.elapsed()));
        match changes.as_mut() {
            Some(rx) => {
                let _ = tokio::time::timeout(wait, rx.changed()).await;
            }
            None => tokio::time::sleep(wait).await,
        }
    }
}

/// Name of the reclaimer Lease of channel `channel`.
pub fn reclaimer_lease_name(channel: &str) -> String {
    format!("k3os-upgrade-reclaim-{channel}")
}

/// Reclaim dead holders' slots in every channel, forever.
///
/// One agent per channel looks (the holder of the Lease `reclaimer_lease_name`, declared
/// valid for three reclaim periods), and only while another node holds a slot: looking
/// costs a read of the channel and two of each holder's Lease, so a thousand agents looking
/// at a hundred holders would cost the API server more than the rollout itself. An agent
/// whose own node holds a slot does not take the Lease (it may reboot any minute); the others
/// look at the Lease once per its duration, and take it over when its holder stopped renewing
/// (died, or claimed a slot). A takeover only delays a reclaim: the new reclaimer's
/// [`LivenessObserver`] counts silence from its own first look, never from the old one's.
pub async fn reclaim_loop(agent: Arc<Agent>) {
    let leases: Api<Lease> =
        Api::namespaced(agent.clients.client.clone(), &agent.settings.namespace);
    let mut observers: BTreeMap<String, LivenessObserver> = BTreeMap::new();
    let mut next_look: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    loop {
        let mut shortest: Option<Duration> = None;
        match agent.channels_now().await {
            Ok(list) => {
                shortest = shortest_reboot_timeout(&list);
                for ch in list.channels {
                    let name = ch.name().to_string();
                    let Ok(policy) = &ch.policy else {
                        continue;
                    };
                    // Only a slot held by another node can be reclaimed: no reads otherwise
                    // (the slots as last seen; a slot claimed since is looked at next time).
                    let slots = ch
                        .status
                        .as_ref()
                        .map(|s| s.slots.as_slice())
                        .unwrap_or(&[]);
                    let me = &agent.settings.node;
                    if slots.is_empty() || slots.iter().any(|s| s.node == *me) {
                        observers.remove(&name);
                        continue;
                    }
                    let now = tokio::time::Instant::now();
                    if next_look.get(&name).is_some_and(|at| now < *at) {
                        continue;
                    }
                    let valid = reclaim_period_base(Some(policy.reboot_timeout)) * 3;
                    let secs = i32::try_from(valid.as_secs()).unwrap_or(i32::MAX);
                    match acquire_lease(&leases, &reclaimer_lease_name(&name), me, secs).await {
                        Ok(LeaseOutcome::Held) => {
                            next_look.remove(&name);
                        }
                        Ok(LeaseOutcome::HeldBy(_)) => {
                            observers.remove(&name);
                            next_look.insert(name, now + valid);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!("reclaimer Lease of {name}: {e}");
                            continue;
                        }
                    }
                    let obs = observers.entry(name.clone()).or_default();
                    reclaim_channel(&agent, &ch, policy.reboot_timeout, obs).await;
                }
            }
            Err(e) => tracing::warn!(
                "list UpdateChannels: {}",
                crate::agent::cluster::client::kube_message(&e)
            ),
        }
        tokio::time::sleep(reclaim_period(shortest)).await;
    }
}

/// One look for dead holders of `ch`, with the Events of what was reclaimed.
async fn reclaim_channel(
    agent: &Agent,
    ch: &crate::agent::channel::listing::Channel,
    reboot_timeout: Duration,
    obs: &mut LivenessObserver,
) {
    let name = ch.name();
    let store = agent.store(name);
    let done = match slots::reclaim_dead(
        &store,
        &agent.settings.node,
        obs,
        reboot_timeout,
        Utc::now(),
    )
    .await
    {
        Ok(done) => done,
        Err(e) => {
            tracing::warn!("reclaim in {name}: {e}");
            return;
        }
    };
    for r in done {
        agent.clients.metrics.count(Outcome::Reclaim);
        let why = match r.reason {
            slots::DeadReason::NodeDeleted => "its Node was deleted".to_string(),
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
        let note = format!("reclaimed the slot of node {}: {why}{failure}", r.slot.node);
        agent.event(Some(ch), true, "SlotReclaimed", note).await;
        if let (true, Some(v)) = (r.paused, r.slot.version.as_deref()) {
            let out = slots::FailureOutcome {
                released: false,
                paused: true,
            };
            let said = crate::agent::cluster::publish::failure_recorded(ch, v, out, "");
            agent.say_all(ch, said).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder renewing every [`lease_period`] is never seen silent for its
    /// `rebootTimeout`, even when two renewals in a row are lost; three lost in a row and
    /// the observer may judge it (the documented bound).
    #[test]
    fn the_lease_period_keeps_a_live_holder_from_being_reclaimed() {
        let s = Duration::from_secs;
        for timeout in [s(8), s(30), s(120), s(900), s(3600)] {
            let period = lease_period(Some(timeout));
            assert!(period * 4 <= timeout, "{timeout:?}");
            for lost in [0u32, 1, 2, 3] {
                let t0 = tokio::time::Instant::now();
                let mut obs = LivenessObserver::default();
                let mut worst = Duration::ZERO;
                // The observer looks every second (each answer a second after its request)
                // over ten timeouts; renewal k lands at k × period unless it is one of the
                // `lost` renewals after the first.
                let step = s(1).min(period / 2);
                let mut at = Duration::ZERO;
                while at < timeout * 10 {
                    let n = (at.as_nanos() / period.as_nanos()) as u32;
                    let marker = if (1..=lost).contains(&n) { 0 } else { n };
                    let silent =
                        obs.observe("n", Some(marker.to_string()), t0 + at, t0 + at + step);
                    worst = worst.max(silent);
                    at += step;
                }
                if lost < 3 {
                    assert!(
                        worst < timeout,
                        "{timeout:?}, {lost} lost: silent {worst:?}"
                    );
                } else if period * 4 == timeout {
                    // Not capped: four periods of silence are the timeout itself.
                    assert!(worst + period >= timeout, "{timeout:?}: {worst:?}");
                }
            }
        }
        // Below 4 s the period stops at 1 s (fewer lost renewals are then tolerated).
        assert_eq!(lease_period(Some(s(3))), s(1));
        assert_eq!(lease_period(None), MAX_LEASE_PERIOD);
        assert_eq!(lease_period(Some(s(3600))), MAX_LEASE_PERIOD);
        assert_eq!(lease_period(Some(s(900))), s(225));
    }
}
