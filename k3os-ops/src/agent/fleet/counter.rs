//! The fleet counter: `status.nodes`, the `Complete` condition and `status.rollout` (the waves).
//!
//! **Who counts.** Each agent knows only its own node, and a channel's status is one object:
//! if every agent added itself to counts in the status, 1000 agents would contend on one
//! resourceVersion and a node that vanished would stay counted. Instead every agent publishes
//! its own facts on its own Node (`k3os.io/update-phase`, and `k3os.io/update-version` = the
//! version it booted), and one agent per channel — the holder of the Lease
//! `k3os-upgrade-fleet-<channel>` — lists the Nodes the channel selects every `period` (one
//! metadata-only list: labels and annotations, no status or images, with the channel's
//! `nodeSelector` as the label selector) and derives the counts and the waves from them
//! ([`crate::agent::channel::counts::refresh`], pure). The result is written by a compare-and-swap of the status
//! like every other status write ([`crate::agent::cluster::slots::write_fleet`]), and only when something
//! changed (judged first on the channel as last seen, so an idle fleet costs one list and one
//! Lease renewal per period, no read of the channel and no write).
//! Events on the channel: `WaveStarted` when a wave may begin, `RolloutComplete` when every
//! selected node runs the target.
//!
//! The Lease is declared valid for [`counter_lease`] (three periods, at least ten minutes);
//! the holder renews it on every count, the other agents look at it once per that duration
//! (not every period: a thousand agents asking every 30 s who counts would cost more than the
//! counting). If the counter's node dies, another agent takes over within two such durations;
//! the counts are stale meanwhile, and no wave starts (a wave only starts on a count), which
//! is the safe side. A counter that reboots (its own update) takes its Lease back at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::Api;

use crate::agent::channel::counts::NodeFacts;
use crate::agent::channel::listing::Channel;
use crate::agent::cluster::kube_store::{acquire_lease, LeaseOutcome};
use crate::agent::cluster::slots;
use crate::agent::context::Agent;
use crate::agent::errors::{AgentError, KubeContext};

/// Name of the counter Lease of channel `channel`.
pub fn fleet_lease_name(channel: &str) -> String {
    format!("k3os-upgrade-fleet-{channel}")
}

/// How long the counter Lease is declared valid: three count periods, at least ten minutes.
pub fn counter_lease(period: Duration) -> Duration {
    (period * 3).max(Duration::from_secs(600))
}

/// Count the fleet of each valid channel whose counter Lease this node holds, every `period`,
/// forever.
pub async fn count_loop(agent: Arc<Agent>, period: Duration) {
    let leases: Api<Lease> =
        Api::namespaced(agent.clients.client.clone(), &agent.settings.namespace);
    let valid = counter_lease(period);
    let lease_secs = i32::try_from(valid.as_secs()).unwrap_or(i32::MAX);
    let mut next_look: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    loop {
        match agent.channels_now().await {
            Ok(list) => {
                for ch in list.channels.iter().filter(|c| c.policy.is_ok()) {
                    let name = fleet_lease_name(ch.name());
                    let now = tokio::time::Instant::now();
                    if next_look.get(&name).is_some_and(|at| now < *at) {
                        continue;
                    }
                    match acquire_lease(&leases, &name, &agent.settings.node, lease_secs).await {
                        Ok(LeaseOutcome::Held) => {
                            next_look.remove(&name);
                        }
                        Ok(LeaseOutcome::HeldBy(_)) => {
                            // Look again when it would have expired, give or take a tenth.
                            let jitter = rand::Rng::gen_range(&mut rand::thread_rng(), 1.0..1.1);
                            next_look.insert(name, now + valid.mul_f64(jitter));
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!("counter Lease {name}: {e}");
                            continue;
                        }
                    }
                    if let Err(e) = count_channel(&agent, ch).await {
                        tracing::warn!(
                            "count the nodes of {}: {}",
                            ch.name(),
                            crate::agent::errors::message(&e)
                        );
                    }
                }
            }
            Err(e) => tracing::warn!(
                "list UpdateChannels: {}",
                crate::agent::cluster::client::kube_message(&e)
            ),
        }
        tokio::time::sleep(period).await;
    }
}

/// List the Nodes `ch` selects, write the counts and waves, publish what changed.
pub async fn count_channel(agent: &Agent, ch: &Channel) -> Result<(), AgentError> {
    let selector: Vec<String> = ch
        .spec
        .node_selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let lp = ListParams::default().labels(&selector.join(","));
    let nodes: Api<Node> = Api::all(agent.clients.client.clone());
    let listed = nodes
        .list_metadata(&lp)
        .await
        .kube_ctx(|| format!("list the Nodes UpdateChannel {} selects", ch.name()))?;
    let facts: Vec<NodeFacts> = listed
        .items
        .iter()
        .map(|n| NodeFacts::from_meta(&n.metadata))
        .filter(|f| ch.selects(&f.labels))
        .collect();
    let rollout = ch.policy.as_ref().ok().and_then(|p| p.rollout.as_ref());
    // Nothing to write on the channel as last seen: no compare-and-swap read either (an idle
    // fleet costs the counter one list per period).
    let mut st = ch.status.clone().unwrap_or_default();
    let before = st.clone();
    crate::agent::channel::counts::refresh(ch, &mut st, &facts, rollout, Utc::now());
    if st == before {
        return Ok(());
    }
    let store = agent.store(ch.name());
    let change = slots::write_fleet(&store, &facts, rollout, Utc::now()).await?;
    let target = ch.target_version().unwrap_or_default();
    if let Some((wave, waves)) = change.wave_started {
        let note = format!("wave {wave} of {waves} may update to {target}");
        agent.channel_event(ch, false, "WaveStarted", note).await;
    }
    if change.completed {
        let note = format!("every selected node runs {target}");
        agent
            .channel_event(ch, false, "RolloutComplete", note)
            .await;
    }
    Ok(())
}
