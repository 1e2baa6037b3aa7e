//! The disruptive steps of an update, in order: stage (no disruption), cordon + drain
//! ([`Agent::disrupt`]), bootloader flip + reboot ([`Agent::flip_and_reboot`]), and after the
//! boot the health verdict ([`Agent::confirm`]). Each disruptive step first fences on the
//! slot's token (CAS of its phase) and aborts if the slot was lost.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use kube::ResourceExt;

use super::controller::*;
use super::crd::{SlotPhase, UpdateChannel};
use super::decide::{NodeView, Policy};
use super::drain;
use super::errors::{AgentError, KubeContext};
use super::kube_store::KubeChannelStore;
use super::metrics::Outcome;
use super::node::{ConfirmResult, NODE_READY};
use super::progress::AnnotationProgress;
use super::slots::{self, FenceOutcome};
use libupgrade::health::CheckResult;

impl Agent {
    pub(super) async fn stage(
        &self,
        ch: &UpdateChannel,
        version: &str,
    ) -> Result<Next, AgentError> {
        let now_s = Utc::now().timestamp().max(0) as u64;
        if now_s < self.stage_not_before.load(Ordering::Relaxed) {
            return Ok(Next::Wait);
        }
        self.annotate(&[
            (ANN_PHASE, Some("Staging")),
            (ANN_TARGET, Some(version)),
            (
                ANN_MESSAGE,
                Some("downloading and verifying into the inactive slot"),
            ),
        ])
        .await?;
        self.event(
            Some(ch),
            false,
            "Staging",
            format!(
                "staging {version} from {} into the inactive slot",
                ch.spec.url
            ),
        )
        .await;
        let (tx, mut rx) = tokio::sync::watch::channel(String::new());
        rx.mark_unchanged();
        let progress = Arc::new(AnnotationProgress::new(tx, self.metrics.clone()));
        let url = ch.spec.url.clone();
        let v = version.to_string();
        let p = progress.clone();
        let pinned = ch.spec.pinned_version().is_some();
        // Validated with the rest of the spec before any action (an invalid maxRate makes the
        // channel Invalid), so a parse error here cannot happen; no cap rather than a panic.
        let max_rate = ch
            .spec
            .max_rate
            .as_deref()
            .and_then(|r| crate::upgrade::parse_rate(r).ok());
        let work = self.blocking(move |ops| ops.stage(&url, &v, pinned, max_rate, p.as_ref()));
        tokio::pin!(work);
        // The annotation is written at most every PROGRESS_PERIOD (the Node object is shared
        // with the kubelet; a byte counter must not flood the API server).
        let mut last_write: Option<tokio::time::Instant> = None;
        let mut ticker = tokio::time::interval(PROGRESS_PERIOD);
        let result = loop {
            tokio::select! {
                r = &mut work => break r,
                _ = ticker.tick() => {
                    let due = last_write.is_none_or(|t| t.elapsed() >= PROGRESS_PERIOD);
                    if due && rx.has_changed().unwrap_or(false) {
                        let text = rx.borrow_and_update().clone();
                        if let Err(e) = self.annotate(&[(ANN_PROGRESS, Some(&text))]).await {
                            tracing::warn!("progress annotation: {e:#}");
                        }
                        last_write = Some(tokio::time::Instant::now());
                    }
                }
            }
        };
        match result {
            Ok(()) => {
                self.stage_failures.store(0, Ordering::Relaxed);
                self.annotate(&[
                    (ANN_PHASE, Some("Staged")),
                    (ANN_PROGRESS, None),
                    (ANN_MESSAGE, Some("verified and staged")),
                ])
                .await?;
                self.event(
                    Some(ch),
                    false,
                    "Staged",
                    format!("{version} verified and staged in the inactive slot"),
                )
                .await;
                Ok(Next::Again)
            }
            Err(e) => {
                let n = self.stage_failures.fetch_add(1, Ordering::Relaxed) + 1;
                let backoff = (60u64 << n.min(6)).min(3600);
                self.stage_not_before
                    .store(now_s + backoff, Ordering::Relaxed);
                let msg = format!(
                    "staging {version} failed (attempt {n}, next in {backoff}s): {}",
                    super::errors::message(&e)
                );
                self.phase("StageFailed", &msg).await?;
                self.event(Some(ch), true, "StageFailed", msg).await;
                Ok(Next::Wait)
            }
        }
    }

    /// After an aborted disruption: wait 5 min, doubling per abort in a row, up to 1 h, before
    /// claiming again (a drain that is refused must not cordon the node every resync).
    pub(super) fn back_off_claims(&self) {
        let n = self.claim_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let secs = (300u64 << (n - 1).min(4)).min(3600);
        let now_s = Utc::now().timestamp().max(0) as u64;
        self.claim_not_before.store(now_s + secs, Ordering::Relaxed);
    }

    /// Uncordon if (and only if) this agent cordoned the node.
    pub(super) async fn undo_cordon(&self) -> Result<(), AgentError> {
        let node = self
            .nodes()
            .get(&self.node)
            .await
            .kube_ctx(|| format!("read own Node {}", self.node))?;
        let ours = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_CORDONED))
            .is_some_and(|v| v == "true");
        if ours {
            drain::set_unschedulable(&self.nodes(), &self.node, false).await?;
            self.annotate(&[(ANN_CORDONED, None)]).await?;
            self.event(
                None,
                false,
                "Uncordoned",
                "uncordoned the node (the agent had cordoned it)".into(),
            )
            .await;
        }
        Ok(())
    }

    /// Fence the slot at `Rebooting` before `step`: `Some(next)` when it was lost and the
    /// update aborted ([`Self::abort_lost`]).
    async fn fence_rebooting_or_abort(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        token: &str,
        step: &str,
    ) -> Result<Option<Next>, AgentError> {
        let fenced = slots::fence(
            store,
            &self.node,
            token,
            SlotPhase::Rebooting,
            None,
            Utc::now(),
        )
        .await?;
        match fenced {
            FenceOutcome::Held(_) => Ok(None),
            FenceOutcome::Lost => self.abort_lost(ch, step).await.map(Some),
        }
    }

    /// Abort after losing the slot: undo our cordon, tell why.
    pub(super) async fn abort_lost(
        &self,
        ch: &UpdateChannel,
        step: &str,
    ) -> Result<Next, AgentError> {
        self.back_off_claims();
        self.undo_cordon().await?;
        self.phase("Aborted", &format!("lost the update slot before {step}"))
            .await?;
        self.event(Some(ch), true, "SlotLost", format!("the update slot is gone or carries another token; aborted before {step} and undid the cordon")).await;
        Ok(Next::Again)
    }

    pub(super) async fn disrupt(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        view: &NodeView,
        token: &str,
        version: &str,
    ) -> Result<Next, AgentError> {
        let policy = channel_policy(ch)?;
        let entry = match slots::fence(
            store,
            &self.node,
            token,
            SlotPhase::Draining,
            Some(view.unschedulable),
            Utc::now(),
        )
        .await?
        {
            FenceOutcome::Held(e) => e,
            FenceOutcome::Lost => return self.abort_lost(ch, "cordon").await,
        };
        if !entry.was_unschedulable.unwrap_or(false) && !view.unschedulable {
            self.annotate(&[(ANN_CORDONED, Some("true"))]).await?;
            drain::set_unschedulable(&self.nodes(), &self.node, true).await?;
            self.event(Some(ch), false, "Cordoned", "cordoned the node".into())
                .await;
        }
        if !ch.spec.drain.skip {
            self.phase(
                "Draining",
                &format!("evicting pods (timeout {:?})", policy.drain_timeout),
            )
            .await?;
            self.event(
                Some(ch),
                false,
                "Draining",
                "evicting pods through the Eviction API".into(),
            )
            .await;
            let drain_started = tokio::time::Instant::now();
            let drained = drain::drain(
                &self.client,
                &self.node,
                &ch.spec.drain,
                self.self_pod.as_deref(),
                policy.drain_timeout,
                self.drain_retry,
            )
            .await;
            self.metrics
                .observe_drain(drain_started.elapsed().as_secs_f64());
            match drained {
                Ok(r) => {
                    self.event(
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
                }
                Err(e) => {
                    self.back_off_claims();
                    self.event(
                        Some(ch),
                        true,
                        "DrainFailed",
                        format!("{e}; giving up this update attempt"),
                    )
                    .await;
                    self.undo_cordon().await?;
                    let released = slots::release(store, &self.node, token, Utc::now()).await?;
                    self.slot_released(ch, released, "the drain failed").await;
                    self.phase("DrainFailed", &e.to_string()).await?;
                    return Ok(Next::Wait);
                }
            }
        }
        self.flip_and_reboot(ch, store, token, version).await
    }

    pub(super) async fn flip_and_reboot(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        token: &str,
        version: &str,
    ) -> Result<Next, AgentError> {
        if let Some(next) = self
            .fence_rebooting_or_abort(ch, store, token, "the bootloader flip")
            .await?
        {
            return Ok(next);
        }
        let policy = channel_policy(ch)?;
        // The trial boot waits for our Node-Ready before it is blessed; when we do not report
        // it by then (k3s or the agent broken in the new version), `slot await-bless` on the
        // node counts it failed and rolls back.
        let within = node_ready_limit(policy.reboot_timeout, self.node_ready_wait);
        if let Err(e) = self.blocking(move |ops| ops.activate(within)).await {
            self.back_off_claims();
            self.event(Some(ch), true, "ActivateFailed", super::errors::message(&e))
                .await;
            self.undo_cordon().await?;
            let released = slots::release(store, &self.node, token, Utc::now()).await?;
            self.slot_released(ch, released, "the bootloader flip failed")
                .await;
            self.phase("ActivateFailed", &super::errors::message(&e))
                .await?;
            return Ok(Next::Wait);
        }
        self.event(
            Some(ch),
            false,
            "Activated",
            format!("the bootloader tries {version} at the next boot"),
        )
        .await;
        // Last fence before the point of no return.
        if let Some(next) = self
            .fence_rebooting_or_abort(ch, store, token, "the reboot")
            .await?
        {
            return Ok(next);
        }
        self.phase("Rebooting", &format!("rebooting into {version}"))
            .await?;
        self.event(
            Some(ch),
            false,
            "Rebooting",
            format!("syncing and rebooting into {version}"),
        )
        .await;
        self.blocking(|ops| ops.reboot()).await?;
        Ok(Next::Wait)
    }

    pub(super) async fn node_ready(&self) -> Result<bool, AgentError> {
        let node = self
            .nodes()
            .get(&self.node)
            .await
            .kube_ctx(|| format!("read own Node {} for its Ready condition", self.node))?;
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        Ok(ready_in_this_boot(&conditions, self.booted_at))
    }

    pub(super) async fn confirm(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        token: &str,
        version: &str,
        held: bool,
    ) -> Result<Next, AgentError> {
        self.phase("Confirming", &format!("checking health of {version}"))
            .await?;
        self.event(
            Some(ch),
            false,
            "Confirming",
            format!(
                "booted {version} on trial; waiting for Node Ready and running the health checks"
            ),
        )
        .await;
        let start = tokio::time::Instant::now();
        let mut ready = self.node_ready().await?;
        while !ready && start.elapsed() < self.node_ready_wait {
            tokio::time::sleep(self.node_ready_poll).await;
            ready = self.node_ready().await?;
        }
        // Node-Ready is one health check of the boot-assessment core, reported before its
        // single bless point; the core decides (bless, roll back, or — on a slot blessed
        // already — record only) and we carry out its verdict.
        let node_ready = CheckResult {
            name: NODE_READY.into(),
            ok: ready,
            detail: if ready {
                "the Node's Ready condition is True".into()
            } else {
                format!(
                    "the Node was not Ready within {:?} after booting {version}",
                    self.node_ready_wait
                )
            },
        };
        let verdict = self.blocking(move |ops| ops.confirm(node_ready)).await?;
        match verdict {
            ConfirmResult::Healthy => {
                self.claim_failures.store(0, Ordering::Relaxed);
                self.undo_cordon().await?;
                let released = held && slots::release(store, &self.node, token, Utc::now()).await?;
                self.annotate(&[
                    (ANN_PHASE, Some("UpToDate")),
                    (ANN_MESSAGE, Some(&format!("running {version}"))),
                    (ANN_PROGRESS, None),
                ])
                .await?;
                self.event(
                    Some(ch),
                    false,
                    "UpdateSucceeded",
                    format!("{version} is healthy and confirmed"),
                )
                .await;
                self.slot_released(ch, released, &format!("{version} is healthy and confirmed"))
                    .await;
                Ok(Next::Again)
            }
            ConfirmResult::RolledBack(reason) => {
                self.metrics.count(Outcome::Failure);
                self.metrics.count(Outcome::Rollback);
                let t = held.then_some(token);
                let out =
                    slots::record_failure(store, &self.node, t, version, &reason, true, Utc::now())
                        .await?;
                self.phase("RollingBack", &reason).await?;
                self.event(
                    Some(ch),
                    true,
                    "HealthCheckFailed",
                    format!("{version}: {reason}; rebooting back"),
                )
                .await;
                self.failure_recorded(ch, version, out, "").await;
                self.blocking(|ops| ops.reboot()).await?;
                Ok(Next::Wait)
            }
            ConfirmResult::Unhealthy(reason) => {
                // Blessed already (or nothing good to return to): nothing rolls back after
                // a bless. Record the failure so the channel's budget sees it, give the node
                // back and release the slot.
                self.metrics.count(Outcome::Failure);
                // Uncordon first: a node is never left cordoned by us without a slot.
                self.undo_cordon().await?;
                let t = held.then_some(token);
                // Recorded with the token, the slot is released in the same write.
                let out = slots::record_failure(
                    store,
                    &self.node,
                    t,
                    version,
                    &reason,
                    false,
                    Utc::now(),
                )
                .await?;
                self.phase("Unhealthy", &reason).await?;
                self.event(
                    Some(ch),
                    true,
                    "HealthCheckFailed",
                    format!("{version}: {reason}; not rolling back"),
                )
                .await;
                self.failure_recorded(ch, version, out, &format!("{version} is unhealthy"))
                    .await;
                Ok(Next::Wait)
            }
        }
    }
}

/// The channel's spec as a [`Policy`], or the error naming the channel.
fn channel_policy(ch: &UpdateChannel) -> Result<Policy, AgentError> {
    Policy::from_spec(&ch.spec).map_err(|what| AgentError::Spec {
        channel: ch.name_any(),
        what,
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
pub(super) fn node_ready_limit(reboot_timeout: Duration, ready_wait: Duration) -> Duration {
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
