//! The stage and the disruptive steps of an update, in order, each a function over the
//! [`Agent`] context: stage (no disruption; in [`super::staging`]), cordon + drain
//! (`disrupt`), bootloader flip + reboot (`flip_and_reboot`), and after the boot the health
//! verdict (`confirm`). Each disruptive step first fences on the
//! slot's token (CAS of its phase) and aborts if the slot was lost.

use std::time::Duration;

use chrono::Utc;
use kube::ResourceExt;

use super::decide::NodeView;
use crate::agent::channel::crd::SlotPhase;
use crate::agent::channel::format::{ANN_CORDONED, ANN_MESSAGE, ANN_PROGRESS};
use crate::agent::channel::listing::Channel;
use crate::agent::channel::spec::Policy;
use crate::agent::cluster::drain;
use crate::agent::cluster::kube_store::KubeChannelStore;
use crate::agent::cluster::publish::Say;
use crate::agent::cluster::slots::{self, FenceOutcome};
use crate::agent::context::{Agent, Next};
use crate::agent::errors::{AgentError, KubeContext};
use crate::agent::host::ops::{ConfirmResult, NODE_READY};
use crate::agent::metrics::Outcome;
use crate::agent::phase::Phase;
use libupgrade::health::CheckResult;

/// After an aborted disruption: the next claim backs off ([`super::cooldown::Cooldown::claims`];
/// a drain that is refused must not cordon the node every resync).
pub(in crate::agent) fn back_off_claims(cx: &Agent) {
    cx.memory
        .claims
        .lock()
        .expect("not poisoned")
        .failed(Utc::now());
}

/// Fence the slot at `Rebooting` before `step`: `Some(next)` when it was lost and the
/// update aborted ([`Self::abort_lost`]).
async fn fence_rebooting_or_abort(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: &str,
    step: &str,
) -> Result<Option<Next>, AgentError> {
    let fenced = slots::fence(
        store,
        &cx.settings.node,
        token,
        SlotPhase::Rebooting,
        None,
        Utc::now(),
    )
    .await?;
    match fenced {
        FenceOutcome::Held(_) => Ok(None),
        FenceOutcome::Lost => abort_lost(cx, ch, step).await.map(Some),
    }
}

/// Abort after losing the slot: undo our cordon, tell why.
pub(in crate::agent) async fn abort_lost(
    cx: &Agent,
    ch: &Channel,
    step: &str,
) -> Result<Next, AgentError> {
    back_off_claims(cx);
    cx.undo_cordon().await?;
    cx.report(
        ch,
        Phase::Aborted,
        &format!("lost the update slot before {step}"),
        Say::warn("SlotLost", format!("the update slot is gone or carries another token; aborted before {step} and undid the cordon")),
    )
    .await?;
    Ok(Next::Again)
}

pub(in crate::agent) async fn disrupt(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    view: &NodeView,
    token: &str,
    version: &str,
) -> Result<Next, AgentError> {
    let policy = channel_policy(ch)?;
    let entry = match slots::fence(
        store,
        &cx.settings.node,
        token,
        SlotPhase::Draining,
        Some(view.unschedulable),
        Utc::now(),
    )
    .await?
    {
        FenceOutcome::Held(e) => e,
        FenceOutcome::Lost => return abort_lost(cx, ch, "cordon").await,
    };
    if !entry.was_unschedulable.unwrap_or(false) && !view.unschedulable {
        cx.annotate(&[(ANN_CORDONED, Some("true"))]).await?;
        drain::set_unschedulable(&cx.nodes(), &cx.settings.node, true).await?;
        cx.event(Some(ch), false, "Cordoned", "cordoned the node".into())
            .await;
    }
    if !ch.spec.drain.skip && !drain_or_give_up(cx, ch, store, token, policy).await? {
        return Ok(Next::Wait);
    }
    flip_and_reboot(cx, ch, store, token, version).await
}

/// Drain the node; when the drain fails, give this update attempt up (back off, uncordon,
/// release the slot) and answer `false`.
async fn drain_or_give_up(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: &str,
    policy: &Policy,
) -> Result<bool, AgentError> {
    cx.report(
        ch,
        Phase::Draining,
        &format!("evicting pods (timeout {:?})", policy.drain_timeout),
        Say::info("Draining", "evicting pods through the Eviction API".into()),
    )
    .await?;
    let drain_started = tokio::time::Instant::now();
    let drained = drain::drain(
        &cx.clients.client,
        &cx.settings.node,
        &ch.spec.drain,
        cx.settings.self_pod.as_deref(),
        policy.drain_timeout,
        cx.settings.drain_retry,
    )
    .await;
    cx.clients
        .metrics
        .observe_drain(drain_started.elapsed().as_secs_f64());
    match drained {
        Ok(r) => {
            cx.event(
                Some(ch),
                false,
                "Drained",
                format!(
                    "evicted {} pod(s) ({} disruption-budget retries)",
                    r.evicted.len(),
                    r.budget_retries
                ),
            )
            .await;
            Ok(true)
        }
        Err(e) => {
            back_off_claims(cx);
            cx.event(
                Some(ch),
                true,
                "DrainFailed",
                format!("{e}; giving up this update attempt"),
            )
            .await;
            cx.give_back(ch, store, token, "the drain failed").await?;
            cx.phase(Phase::DrainFailed, &e.to_string()).await?;
            Ok(false)
        }
    }
}

pub(in crate::agent) async fn flip_and_reboot(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: &str,
    version: &str,
) -> Result<Next, AgentError> {
    if let Some(next) =
        fence_rebooting_or_abort(cx, ch, store, token, "the bootloader flip").await?
    {
        return Ok(next);
    }
    let policy = channel_policy(ch)?;
    // The trial boot waits for our Node-Ready before it is blessed; when we do not report
    // it by then (k3s or the agent broken in the new version), `slot await-bless` on the
    // node counts it failed and rolls back.
    let within = node_ready_limit(policy.reboot_timeout, cx.settings.node_ready_wait);
    if let Err(e) = cx.blocking(move |ops| ops.activate(within)).await {
        back_off_claims(cx);
        cx.event(
            Some(ch),
            true,
            "ActivateFailed",
            crate::agent::errors::message(&e),
        )
        .await;
        cx.give_back(ch, store, token, "the bootloader flip failed")
            .await?;
        cx.phase(Phase::ActivateFailed, &crate::agent::errors::message(&e))
            .await?;
        return Ok(Next::Wait);
    }
    cx.event(
        Some(ch),
        false,
        "Activated",
        format!("the bootloader tries {version} at the next boot"),
    )
    .await;
    // Last fence before the point of no return.
    if let Some(next) = fence_rebooting_or_abort(cx, ch, store, token, "the reboot").await? {
        return Ok(next);
    }
    cx.report(
        ch,
        Phase::Rebooting,
        &format!("rebooting into {version}"),
        Say::info("Rebooting", format!("syncing and rebooting into {version}")),
    )
    .await?;
    cx.blocking(|ops| ops.reboot()).await?;
    Ok(Next::Wait)
}

pub(in crate::agent) async fn node_ready(cx: &Agent) -> Result<bool, AgentError> {
    let node = cx
        .nodes()
        .get(&cx.settings.node)
        .await
        .kube_ctx(|| format!("read own Node {} for its Ready condition", cx.settings.node))?;
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    Ok(ready_in_this_boot(&conditions, cx.settings.booted_at))
}

pub(in crate::agent) async fn confirm(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: &str,
    version: &str,
    held: bool,
) -> Result<Next, AgentError> {
    cx.report(
        ch,
        Phase::Confirming,
        &format!("checking health of {version}"),
        Say::info(
            "Confirming",
            format!(
                "booted {version} on trial; waiting for Node Ready and running the health checks"
            ),
        ),
    )
    .await?;
    // Node-Ready is one health check of the boot-assessment core, reported before its
    // single bless point; the core decides (bless, roll back, or — on a slot blessed
    // already — record only) and we carry out its verdict.
    let node_ready = await_node_ready(cx, version).await?;
    let verdict = cx.blocking(move |ops| ops.confirm(node_ready)).await?;
    let token = held.then_some(token);
    match verdict {
        ConfirmResult::Healthy => confirmed(cx, ch, store, token, version).await,
        ConfirmResult::RolledBack(reason) => {
            rolled_back(cx, ch, store, token, version, &reason).await
        }
        ConfirmResult::Unhealthy(reason) => unhealthy(cx, ch, store, token, version, &reason).await,
    }
}

/// Wait up to the Ready wait for the Node to be Ready in this boot: the Node-Ready check.
async fn await_node_ready(cx: &Agent, version: &str) -> Result<CheckResult, AgentError> {
    let start = tokio::time::Instant::now();
    let mut ready = node_ready(cx).await?;
    while !ready && start.elapsed() < cx.settings.node_ready_wait {
        tokio::time::sleep(cx.settings.node_ready_poll).await;
        ready = node_ready(cx).await?;
    }
    Ok(CheckResult {
        name: NODE_READY.into(),
        ok: ready,
        detail: if ready {
            "the Node's Ready condition is True".into()
        } else {
            format!(
                "the Node was not Ready within {:?} after booting {version}",
                cx.settings.node_ready_wait
            )
        },
    })
}

/// The core blessed `version`: uncordon, release the slot (`token`: held).
async fn confirmed(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: Option<&str>,
    version: &str,
) -> Result<Next, AgentError> {
    cx.memory.claims.lock().expect("not poisoned").succeeded();
    cx.undo_cordon().await?;
    let released = match token {
        Some(t) => slots::release(store, &cx.settings.node, t, Utc::now()).await?,
        None => false,
    };
    cx.annotate_phase(
        Phase::UpToDate,
        &[
            (ANN_MESSAGE, Some(&format!("running {version}"))),
            (ANN_PROGRESS, None),
        ],
    )
    .await?;
    cx.event(
        Some(ch),
        false,
        "UpdateSucceeded",
        format!("{version} is healthy and confirmed"),
    )
    .await;
    cx.slot_released(ch, released, &format!("{version} is healthy and confirmed"))
        .await;
    Ok(Next::Again)
}

/// The core rolled back (health failed before the bless): record it, reboot back.
async fn rolled_back(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: Option<&str>,
    version: &str,
    reason: &str,
) -> Result<Next, AgentError> {
    cx.clients.metrics.count(Outcome::Rollback);
    let out = cx
        .record_failure(store, token, version, reason, true)
        .await?;
    cx.report(
        ch,
        Phase::RollingBack,
        reason,
        Say::warn(
            "HealthCheckFailed",
            format!("{version}: {reason}; rebooting back"),
        ),
    )
    .await?;
    cx.failure_recorded(ch, version, out, "").await;
    cx.blocking(|ops| ops.reboot()).await?;
    Ok(Next::Wait)
}

/// Blessed already (or nothing good to return to): nothing rolls back after a bless. Record
/// the failure so the channel's budget sees it, give the node back and release the slot.
async fn unhealthy(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: Option<&str>,
    version: &str,
    reason: &str,
) -> Result<Next, AgentError> {
    // Uncordon first: a node is never left cordoned by us without a slot.
    cx.undo_cordon().await?;
    // Recorded with the token, the slot is released in the same write.
    let out = cx
        .record_failure(store, token, version, reason, false)
        .await?;
    cx.report(
        ch,
        Phase::Unhealthy,
        reason,
        Say::warn(
            "HealthCheckFailed",
            format!("{version}: {reason}; not rolling back"),
        ),
    )
    .await?;
    cx.failure_recorded(ch, version, out, &format!("{version} is unhealthy"))
        .await;
    Ok(Next::Wait)
}

/// The channel's parsed spec, or the error naming the channel.
fn channel_policy(ch: &Channel) -> Result<&Policy, AgentError> {
    ch.policy.as_ref().map_err(|what| AgentError::Spec {
        channel: ch.name_any(),
        what: what.clone(),
    })
}

/// The Node is Ready, said by the kubelet of this boot: Ready=True, and — when the boot time
/// is known — last heard from after it (the condition of the previous boot stays until the
/// new kubelet posts, and the node controller marks it Unknown only after its grace period).
pub fn ready_in_this_boot(
    conditions: &[k8s_openapi::api::core::v1::NodeCondition],
    booted_at: Option<k8s_openapi::jiff::Timestamp>,
) -> bool {
    conditions.iter().any(|c| {
        c.type_ == "Ready"
            && c.status == "True"
            && match (booted_at, &c.last_heartbeat_time) {
                (Some(boot), Some(heard)) => heard.0 >= boot,
                _ => true,
            }
    })
}

/// The host's boot time: `btime` of /proc/stat (the kernel's, not namespaced by containers).
pub fn host_boot_time(proc_stat: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    let secs: i64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    k8s_openapi::jiff::Timestamp::from_second(secs).ok()
}

/// How long the trial boot may take to report Node-Ready before the node rolls back by
/// itself: the channel's reboot timeout, and never less than our own Ready wait plus time to
/// boot and start k3s and the agent.
pub(in crate::agent) fn node_ready_limit(
    reboot_timeout: Duration,
    ready_wait: Duration,
) -> Duration {
    reboot_timeout.max(ready_wait + Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn ready(status: &str, heard: Option<i64>) -> NodeCondition {
        NodeCondition {
            type_: "Ready".into(),
            status: status.into(),
            last_heartbeat_time: heard.map(|s| Time(Timestamp::from_second(s).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn a_ready_condition_from_before_the_boot_does_not_count() {
        let boot = Some(Timestamp::from_second(1_000).unwrap());
        assert!(!ready_in_this_boot(&[ready("True", Some(990))], boot));
        assert!(ready_in_this_boot(&[ready("True", Some(1_010))], boot));
        assert!(!ready_in_this_boot(&[ready("False", Some(1_010))], boot));
        // Unknown boot time or heartbeat: the condition alone decides.
        assert!(ready_in_this_boot(&[ready("True", Some(990))], None));
        assert!(ready_in_this_boot(&[ready("True", None)], boot));
        assert!(!ready_in_this_boot(&[], boot));
    }

    #[test]
    fn boot_time_comes_from_proc_stat() {
        let stat = "cpu  1 2 3\nintr 5\nbtime 1764720000\nprocesses 9\n";
        assert_eq!(
            host_boot_time(stat),
            Some(Timestamp::from_second(1_764_720_000).unwrap())
        );
        assert_eq!(host_boot_time("cpu 1\n"), None);
    }
}
