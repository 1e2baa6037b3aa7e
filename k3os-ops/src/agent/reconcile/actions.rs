//! The actions of [`super::decide::Action`] that keep the books, one `tick_*` function each
//! (what a waiting action says is in [`super::waits`], the stage and the disruptive steps in
//! [`super::steps`]): claim or give back a slot, record a failed update.

use chrono::Utc;
use rand::Rng;

use super::decide::{Action, IdleReason, NodeView};
use crate::agent::channel::format::{ANN_MESSAGE, ANN_PROGRESS, ANN_TOKEN};
use crate::agent::channel::listing::Channel;
use crate::agent::cluster::kube_store::KubeChannelStore;
use crate::agent::cluster::publish::Say;
use crate::agent::cluster::slots::{self, ClaimOutcome};
use crate::agent::context::{Agent, Next};
use crate::agent::errors::AgentError;
use crate::agent::host::status::{TrialFailure, FALLBACK_TAKEN, HEALTH_FAILED};
use crate::agent::metrics::Outcome;
use crate::agent::phase::Phase;

/// Nothing to do: say why where it helps; a slot of this node under another token (an earlier
/// agent instance) is taken over in place.
pub(in crate::agent) async fn tick_idle(
    cx: &Agent,
    ch: &Channel,
    reason: IdleReason,
) -> Result<Next, AgentError> {
    match reason {
        IdleReason::FailedHere(v) => {
            cx.event_once(
                Some(ch),
                true,
                "NotRetrying",
                format!("{v} failed on this node before; not retrying it"),
            )
            .await;
        }
        IdleReason::ForeignSlot => return tick_take_over(cx, ch).await,
        IdleReason::UpToDate => {
            cx.annotate_phase(
                Phase::UpToDate,
                &[(ANN_PROGRESS, None), (ANN_MESSAGE, None)],
            )
            .await?;
        }
        IdleReason::NotSelected | IdleReason::NoTarget => {}
    }
    Ok(Next::Wait)
}

/// Only one agent runs per node; a slot of this node under another token belongs to an
/// earlier instance (or one whose claim outlived its token annotation). Take it over in
/// place: the fence stops that instance.
async fn tick_take_over(cx: &Agent, ch: &Channel) -> Result<Next, AgentError> {
    cx.event(Some(ch), true, "SlotTakenOver", "the channel holds a slot for this node under another token (an earlier agent instance); taking it over".into()).await;
    let version = ch
        .status
        .as_ref()
        .and_then(|s| s.slot_of(&cx.settings.node))
        .and_then(|s| s.version.clone())
        .or_else(|| ch.target_version())
        .unwrap_or_default();
    let store = cx.store(ch.name());
    tick_claim(cx, ch, &store, &version).await
}

/// The spec cannot be used: an Event naming the field (the condition is written by
/// [`super::invalid`]).
pub(in crate::agent) async fn tick_invalid(
    cx: &Agent,
    ch: &Channel,
    msg: &str,
) -> Result<Next, AgentError> {
    cx.event_once(
        Some(ch),
        true,
        "InvalidChannel",
        format!("UpdateChannel {}: {msg}", ch.name()),
    )
    .await;
    Ok(Next::Wait)
}

/// Claim an update slot with a fresh token (written on the Node first, so a restarted agent
/// finds its slot). The back-off, the gates and full slots were the decision's to judge.
pub(in crate::agent) async fn tick_claim(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    version: &str,
) -> Result<Next, AgentError> {
    let token = format!(
        "{:016x}{:016x}",
        rand::thread_rng().gen::<u64>(),
        rand::thread_rng().gen::<u64>()
    );
    cx.annotate(&[(ANN_TOKEN, Some(&token))]).await?;
    match slots::claim(store, &cx.settings.node, &token, version, Utc::now()).await? {
        ClaimOutcome::Claimed | ClaimOutcome::AlreadyHeld => {
            cx.report(
                ch,
                Phase::Claimed,
                &format!("holding an update slot for {version}"),
                Say::info(
                    "SlotClaimed",
                    format!(
                        "claimed an update slot of {} to install {version}",
                        ch.name()
                    ),
                ),
            )
            .await?;
            Ok(Next::Again)
        }
        ClaimOutcome::Full(holders) => {
            let wait = Action::WaitForSlot { holders };
            if let Some(report) = super::waits::report(&wait, Utc::now()) {
                cx.publish(ch, report).await?;
            }
            Ok(Next::Wait)
        }
        ClaimOutcome::Paused => Ok(Next::Again),
        ClaimOutcome::TargetChanged(_) => Ok(Next::Again),
    }
}

/// The claim held through a long silence is given up for a fresh one.
pub(in crate::agent) async fn tick_forfeit(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    version: &str,
) -> Result<Next, AgentError> {
    cx.event(
        Some(ch),
        true,
        "ClaimForfeit",
        "this agent was silent too long while holding a slot; claiming afresh with a new token"
            .into(),
    )
    .await;
    tick_claim(cx, ch, store, version).await
}

/// The slot is `RollingBack` and the node still runs the failed `version`: reboot back.
pub(in crate::agent) async fn tick_reboot_back(
    cx: &Agent,
    ch: &Channel,
    version: &str,
) -> Result<Next, AgentError> {
    cx.report(
        ch,
        Phase::RollingBack,
        &format!("rebooting back from {version}"),
        Say::warn(
            "RebootingBack",
            format!("rebooting back from the failed {version}"),
        ),
    )
    .await?;
    cx.blocking(|ops| ops.reboot()).await?;
    Ok(Next::Wait)
}

/// Back on the old slot after trying `version`: report why (as the boot-assessment core
/// recorded it, not a guess from which slot booted), uncordon, record the failure.
pub(in crate::agent) async fn tick_rolled_back(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    view: &NodeView,
    token: &str,
    version: &str,
) -> Result<Next, AgentError> {
    let (event, reason) = rolled_back_reason(version, view.update.failed_trial.as_ref());
    cx.event(Some(ch), true, event, reason.clone()).await;
    cx.undo_cordon().await?;
    cx.clients.metrics.count(Outcome::Rollback);
    let out = cx
        .record_failure(store, Some(token), version, &reason, false)
        .await?;
    cx.failure_recorded(
        ch,
        version,
        out,
        "back on the old slot after a failed update",
    )
    .await;
    cx.phase(Phase::Failed, &reason).await?;
    Ok(Next::Again)
}

/// Back on the old slot after a rollback already recorded: uncordon and release.
pub(in crate::agent) async fn tick_finish_rollback(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: &str,
) -> Result<Next, AgentError> {
    cx.undo_cordon().await?;
    let released = slots::release(store, &cx.settings.node, token, Utc::now()).await?;
    cx.report(
        ch,
        Phase::Failed,
        "back on the old slot after a failed update",
        Say::warn("RollbackFinished", "back on the old slot".into()),
    )
    .await?;
    cx.slot_released(ch, released, "back on the old slot after a failed update")
        .await;
    Ok(Next::Again)
}

/// A held slot with nothing left to do: uncordon and release.
pub(in crate::agent) async fn tick_release(
    cx: &Agent,
    ch: &Channel,
    store: &KubeChannelStore,
    token: &str,
    reason: &str,
) -> Result<Next, AgentError> {
    cx.give_back(ch, store, token, reason).await?;
    Ok(Next::Again)
}

/// The Event reason and the failure text for a node back on its old slot after trying
/// `version`, from what the boot-assessment core recorded about the failed trial.
pub fn rolled_back_reason(
    version: &str,
    recorded: Option<&TrialFailure>,
) -> (&'static str, String) {
    match recorded {
        Some(f) if f.event == HEALTH_FAILED => (
            "HealthCheckFailed",
            format!("{version} failed its health checks on this node and was rolled back: {}", f.reason),
        ),
        Some(f) if f.event == FALLBACK_TAKEN => (
            "RolledBack",
            format!("the node came back on its old slot instead of {version} (the bootloader fell back: {})", f.reason),
        ),
        Some(f) => (
            "RolledBack",
            format!("the node came back on its old slot instead of {version} ({}: {})", f.event, f.reason),
        ),
        None => (
            "RolledBack",
            format!("the node came back on its old slot instead of {version} (the bootloader fell back)"),
        ),
    }
}
