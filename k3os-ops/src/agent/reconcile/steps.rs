//! The stage and the disruptive steps of an update, in order, each a function over the
//! [`Agent`] context: stage (no disruption; in [`super::staging`]), cordon + drain
//! (`disrupt`), bootloader flip + reboot (`flip_and_reboot`), and after the boot the health
//! verdict (`confirm`). Each disruptive step first fences on the
//! slot's token (CAS of its phase) and aborts if the slot was lost. Each returns what it did
//! (`Done`) for the controller to publish; only the drain and the health checks' wait are
//! announced before they start (`Agent::announce`): they take long.

use std::time::Duration;

use chrono::Utc;
use kube::ResourceExt;

use super::tick::Tick;
use crate::agent::channel::crd::SlotPhase;
use crate::agent::channel::format::{ANN_CORDONED, ANN_PROGRESS};
use crate::agent::channel::listing::Channel;
use crate::agent::channel::spec::Policy;
use crate::agent::cluster::drain;
use crate::agent::cluster::publish::{self, Done, Report, Say, Then};
use crate::agent::cluster::slots::{self, FenceOutcome};
use crate::agent::context::Agent;
use crate::agent::errors::{AgentError, KubeContext};
use crate::agent::host::ops::{ConfirmResult, NODE_READY};
use crate::agent::metrics::Outcome;
use crate::agent::phase::Phase;
use libupgrade::health::CheckResult;

/// After an aborted disruption: the next claim backs off ([`crate::agent::cooldown::Cooldown::claims`];
/// a drain that is refused must not cordon the node every resync).
pub(in crate::agent) fn back_off_claims(cx: &Agent) {
    cx.remember(|m| m.claims.failed(Utc::now()));
}

/// Fence the slot at `Rebooting` before `step`: `Some(done)` when it was lost and the
/// update aborted ([`abort_lost`]).
async fn fence_rebooting_or_abort(t: &Tick<'_>, step: &str) -> Result<Option<Done>, AgentError> {
    let cx = t.cx;
    let fenced = slots::fence(
        &t.store,
        &cx.settings.node,
        &t.token,
        SlotPhase::Rebooting,
        None,
        Utc::now(),
    )
    .await?;
    match fenced {
        FenceOutcome::Held(_) => Ok(None),
        FenceOutcome::Lost => abort_lost(cx, step).await.map(Some),
    }
}

/// Abort after losing the slot: undo our cordon, say why.
pub(in crate::agent) async fn abort_lost(cx: &Agent, step: &str) -> Result<Done, AgentError> {
    back_off_claims(cx);
    let said = cx.undo_cordon().await?.into_iter().collect();
    let report = Report::new(
        Phase::Aborted,
        format!("lost the update slot before {step}"),
        Say::warn("SlotLost", format!("the update slot is gone or carries another token; aborted before {step} and undid the cordon")),
    );
    Ok(Done::report(report, Then::Again).after(said))
}

/// Cordon (unless the node was unschedulable already) and drain, then flip and reboot.
pub(in crate::agent) async fn disrupt(t: &Tick<'_>, version: &str) -> Result<Done, AgentError> {
    let Tick { cx, ch, view, .. } = *t;
    let policy = channel_policy(ch)?;
    let entry = match slots::fence(
        &t.store,
        &cx.settings.node,
        &t.token,
        SlotPhase::Draining,
        Some(view.unschedulable),
        Utc::now(),
    )
    .await?
    {
        FenceOutcome::Held(e) => e,
        FenceOutcome::Lost => return abort_lost(cx, "cordon").await,
    };
    let mut said = Vec::new();
    if !entry.was_unschedulable.unwrap_or(false) && !view.unschedulable {
        cx.annotate(&[(ANN_CORDONED, Some("true"))]).await?;
        drain::set_unschedulable(&cx.nodes(), &cx.settings.node, true).await?;
        said.push(Say::info("Cordoned", "cordoned the node".into()));
    }
    if !ch.spec.drain.skip {
        match drain_or_give_up(t, policy, said).await? {
            Drained::Yes(events) => said = events,
            Drained::GaveUp(done) => return Ok(done),
        }
    }
    flip_then_reboot(t, version, said).await
}

/// How a drain ended.
enum Drained {
    /// Drained: the Events to publish with the step's outcome.
    Yes(Vec<Say>),
    /// The drain failed and this update attempt was given up.
    GaveUp(Done),
}

/// Drain the node (announced first, with the Events `said` so far: it can take long); when
/// the drain fails, give this update attempt up (back off, uncordon, release the slot).
async fn drain_or_give_up(
    t: &Tick<'_>,
    policy: &Policy,
    said: Vec<Say>,
) -> Result<Drained, AgentError> {
    let Tick { cx, ch, .. } = *t;
    let draining = Report::new(
        Phase::Draining,
        format!("evicting pods (timeout {:?})", policy.drain_timeout),
        Say::info("Draining", "evicting pods through the Eviction API".into()),
    );
    cx.announce(ch, said, draining).await?;
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
        Ok(r) => Ok(Drained::Yes(vec![Say::info(
            "Drained",
            format!(
                "evicted {} pod(s) ({} disruption-budget retries)",
                r.evicted.len(),
                r.budget_retries
            ),
        )])),
        Err(e) => {
            back_off_claims(cx);
            let failed = Say::warn("DrainFailed", format!("{e}; giving up this update attempt"));
            let mut said = vec![failed];
            said.extend(cx.give_back(&t.store, &t.token, "the drain failed").await?);
            let report = Report::quiet(Phase::DrainFailed, e.to_string());
            Ok(Drained::GaveUp(
                Done::report(report, Then::Wait).after(said),
            ))
        }
    }
}

/// Flip the bootloader to the staged slot and reboot into it (the slot was fenced at
/// `Rebooting` before: a restarted agent continues here).
pub(in crate::agent) async fn flip_and_reboot(
    t: &Tick<'_>,
    version: &str,
) -> Result<Done, AgentError> {
    flip_then_reboot(t, version, Vec::new()).await
}

/// [`flip_and_reboot`] after the steps that said `said`.
async fn flip_then_reboot(
    t: &Tick<'_>,
    version: &str,
    mut said: Vec<Say>,
) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    if let Some(done) = fence_rebooting_or_abort(t, "the bootloader flip").await? {
        return Ok(done.after(said));
    }
    let policy = channel_policy(ch)?;
    // The trial boot waits for our Node-Ready before it is blessed; when we do not report
    // it within the channel's rebootTimeout of the boot (k3s or the agent broken in the new
    // version), `slot await-bless` on the node counts it failed and rolls back.
    let within = node_ready_limit(policy.reboot_timeout);
    if let Err(e) = cx.blocking(move |ops| ops.activate(within)).await {
        back_off_claims(cx);
        let message = crate::agent::errors::message(&e);
        said.push(Say::warn("ActivateFailed", message.clone()));
        said.extend(
            cx.give_back(&t.store, &t.token, "the bootloader flip failed")
                .await?,
        );
        let report = Report::quiet(Phase::ActivateFailed, message);
        return Ok(Done::report(report, Then::Wait).after(said));
    }
    said.push(Say::info(
        "Activated",
        format!("the bootloader tries {version} at the next boot"),
    ));
    // Last fence before the point of no return.
    if let Some(done) = fence_rebooting_or_abort(t, "the reboot").await? {
        return Ok(done.after(said));
    }
    let rebooting = Report::new(
        Phase::Rebooting,
        format!("rebooting into {version}"),
        Say::info("Rebooting", format!("syncing and rebooting into {version}")),
    );
    Ok(Done::report(rebooting, Then::Reboot).after(said))
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

/// After the trial boot: announce the health checks, wait for Node-Ready, let the
/// boot-assessment core judge, and carry out its verdict.
pub(in crate::agent) async fn confirm(
    t: &Tick<'_>,
    version: &str,
    held: bool,
) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    let confirming = Report::new(
        Phase::Confirming,
        format!("checking health of {version}"),
        Say::info(
            "Confirming",
            format!(
                "booted {version} on trial; waiting for Node Ready and running the health checks"
            ),
        ),
    );
    cx.announce(ch, Vec::new(), confirming).await?;
    // Node-Ready is one health check of the boot-assessment core, reported before its
    // single bless point; the core decides (bless, roll back, or — on a slot blessed
    // already — record only) and we carry out its verdict.
    let wait = ready_wait(
        ch.policy.as_ref().ok().map(|p| p.reboot_timeout),
        cx.settings.node_ready_wait,
    );
    let node_ready = await_node_ready(cx, version, wait).await?;
    let verdict = cx.blocking(move |ops| ops.confirm(node_ready)).await?;
    let token = held.then_some(t.token.as_str());
    match verdict {
        ConfirmResult::Healthy => confirmed(t, token, version).await,
        ConfirmResult::RolledBack(reason) => rolled_back(t, token, version, &reason).await,
        ConfirmResult::Unhealthy(reason) => unhealthy(t, token, version, &reason).await,
    }
}

/// Wait up to `wait` for the Node to be Ready in this boot: the Node-Ready check.
async fn await_node_ready(
    cx: &Agent,
    version: &str,
    wait: Duration,
) -> Result<CheckResult, AgentError> {
    let start = tokio::time::Instant::now();
    let mut ready = node_ready(cx).await?;
    while !ready && start.elapsed() < wait {
        tokio::time::sleep(cx.settings.node_ready_poll).await;
        ready = node_ready(cx).await?;
    }
    Ok(CheckResult {
        name: NODE_READY.into(),
        ok: ready,
        detail: if ready {
            "the Node's Ready condition is True".into()
        } else {
            format!("the Node was not Ready within {wait:?} after booting {version}")
        },
    })
}

/// The core blessed `version`: uncordon, release the slot (`token`: held).
async fn confirmed(t: &Tick<'_>, token: Option<&str>, version: &str) -> Result<Done, AgentError> {
    let cx = t.cx;
    cx.remember(|m| m.claims.succeeded());
    let mut said: Vec<Say> = cx.undo_cordon().await?.into_iter().collect();
    let released = match token {
        Some(token) => slots::release(&t.store, &cx.settings.node, token, Utc::now()).await?,
        None => false,
    };
    cx.annotate(&[(ANN_PROGRESS, None)]).await?;
    let healthy = format!("{version} is healthy and confirmed");
    said.extend(publish::released(released, &healthy));
    let report = Report::new(
        Phase::UpToDate,
        format!("running {version}"),
        Say::info("UpdateSucceeded", healthy),
    );
    Ok(Done::report(report, Then::Again).after(said))
}

/// The core rolled back (health failed before the bless): record it, reboot back.
async fn rolled_back(
    t: &Tick<'_>,
    token: Option<&str>,
    version: &str,
    reason: &str,
) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    cx.clients.metrics.count(Outcome::Rollback);
    let out = cx
        .record_failure(&t.store, token, version, reason, true)
        .await?;
    let report = Report::new(
        Phase::RollingBack,
        reason,
        Say::warn(
            "HealthCheckFailed",
            format!("{version}: {reason}; rebooting back"),
        ),
    );
    let said = publish::failure_recorded(ch, version, out, "");
    Ok(Done::report(report, Then::Reboot).after(said))
}

/// Blessed already (or nothing good to return to): nothing rolls back after a bless. Record
/// the failure so the channel's budget sees it, give the node back and release the slot.
async fn unhealthy(
    t: &Tick<'_>,
    token: Option<&str>,
    version: &str,
    reason: &str,
) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    // Uncordon first: a node is never left cordoned by us without a slot.
    let mut said: Vec<Say> = cx.undo_cordon().await?.into_iter().collect();
    // Recorded with the token, the slot is released in the same write.
    let out = cx
        .record_failure(&t.store, token, version, reason, false)
        .await?;
    let report = Report::new(
        Phase::Unhealthy,
        reason,
        Say::warn(
            "HealthCheckFailed",
            format!("{version}: {reason}; not rolling back"),
        ),
    );
    said.extend(publish::failure_recorded(
        ch,
        version,
        out,
        &format!("{version} is unhealthy"),
    ));
    Ok(Done::report(report, Then::Wait).after(said))
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
/// itself (`slot await-bless`, counted from the boot): the channel's `rebootTimeout`, the one
/// limit a user sets for a node to come back. Nothing is added to it: a site whose nodes boot
/// slowly sets a longer one.
pub(in crate::agent) fn node_ready_limit(reboot_timeout: Duration) -> Duration {
    reboot_timeout
}

/// How long the restarted agent waits for the Node Ready before it reports Node-Ready failed:
/// its own Ready wait, never longer than the channel's `rebootTimeout` (`None`: the spec no
/// longer reads), after which the node has rolled back by itself anyway.
pub(in crate::agent) fn ready_wait(reboot_timeout: Option<Duration>, own: Duration) -> Duration {
    reboot_timeout.map_or(own, |limit| own.min(limit))
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
    fn the_channels_reboot_timeout_is_the_trial_boots_limit() {
        let min = |m: u64| Duration::from_secs(60 * m);
        // A short rebootTimeout is not raised to the agent's Ready wait plus a margin.
        assert_eq!(node_ready_limit(min(3)), min(3));
        assert_eq!(node_ready_limit(min(15)), min(15));
        // The agent's own wait ends no later than the node's limit.
        assert_eq!(ready_wait(Some(min(3)), min(5)), min(3));
        assert_eq!(ready_wait(Some(min(15)), min(5)), min(5));
        assert_eq!(ready_wait(None, min(5)), min(5));
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
