//! The actions of [`super::decide::Action`] that keep the books, one `tick_*` function each
//! (what a waiting action says is in [`super::waits`], the stage and the disruptive steps in
//! [`super::steps`]): claim or give back a slot, record a failed update. Each returns what it
//! did (`Done`) for the controller to publish.

use chrono::Utc;
use rand::Rng;

use super::decide::{Action, IdleReason};
use super::tick::Tick;
use crate::agent::channel::format::{ANN_MESSAGE, ANN_PROGRESS, ANN_TOKEN};
use crate::agent::channel::listing::Channel;
use crate::agent::cluster::publish::{self, Done, Report, Say, Then};
use crate::agent::cluster::slots::{self, ClaimOutcome};
use crate::agent::errors::AgentError;
use crate::agent::host::status::{TrialFailure, FALLBACK_TAKEN, HEALTH_FAILED};
use crate::agent::metrics::Outcome;
use crate::agent::phase::Phase;

/// Nothing to do: the node's kept failure bundles go home (an Event says what went), then
/// say why where it helps; a slot of this node under another token (an earlier agent
/// instance) is taken over in place.
pub(in crate::agent) async fn tick_idle(
    t: &Tick<'_>,
    reason: IdleReason,
) -> Result<Done, AgentError> {
    let sent = send_bundles(t).await?;
    Ok(idle(t, reason).await?.after(sent.into_iter().collect()))
}

/// [`tick_idle`] after the bundles.
async fn idle(t: &Tick<'_>, reason: IdleReason) -> Result<Done, AgentError> {
    let cx = t.cx;
    match reason {
        // The Node's phase message says why (published once per text), and so does an Event.
        IdleReason::FailedHere { version, why } => {
            let said = Say::warn(
                "NotRetrying",
                format!("not retrying {}: {why}", version.escape_debug()),
            );
            let report = Report::new(Phase::Failed, why, said.once());
            return Ok(Done::report(report, Then::Wait));
        }
        IdleReason::BadSlot(version) => {
            let said = Say::warn(
                "NotRetrying",
                format!(
                    "the slot holding {} is bad (marked by hand or dropped for a withdrawal); not staging it again",
                    version.escape_debug()
                ),
            );
            return Ok(Done::then(Then::Wait).after(vec![said.once()]));
        }
        IdleReason::ForeignSlot => return tick_take_over(t).await,
        IdleReason::UpToDate => {
            cx.annotate_phase(
                Phase::UpToDate,
                &[(ANN_PROGRESS, None), (ANN_MESSAGE, None)],
            )
            .await?;
        }
        IdleReason::NotSelected | IdleReason::NoTarget => {}
    }
    Ok(Done::then(Then::Wait))
}

/// A failing site's kept bundles go while the node is idle (never in the way of a stage),
/// inside the channel's stage windows and within its daily quota, their bytes booked on it;
/// the Event `FailureBundlesSent` says how many went (None: none did).
async fn send_bundles(t: &Tick<'_>) -> Result<Option<Say>, AgentError> {
    let Ok(policy) = t.ch.policy.as_ref() else {
        return Ok(None);
    };
    let thin = policy.thin.clone();
    let sent =
        t.cx.blocking(move |ops| {
            let now = Utc::now();
            let day = thin.max_bytes_per_day.map(|_| thin.day(now));
            let used = match day {
                Some(d) => ops.fetched_on(d)?,
                None => 0,
            };
            ops.send_bundles(thin.bundle_allowance(now, used), day)
        })
        .await?;
    Ok(bundles_sent(&sent))
}

/// The Event saying that `sent` delivered failure bundles to the collector (None: it
/// delivered none).
fn bundles_sent(sent: &libupgrade::BundlesSent) -> Option<Say> {
    (sent.sent > 0).then(|| {
        Say::info(
            "FailureBundlesSent",
            format!(
                "sent {} failure bundle(s) of failed updates to the collector ({} bytes); {} waiting",
                sent.sent, sent.bytes, sent.waiting
            ),
        )
        .about_node()
    })
}

/// Only one agent runs per node; a slot of this node under another token belongs to an
/// earlier instance (or one whose claim outlived its token annotation). Take it over in
/// place: the fence stops that instance.
async fn tick_take_over(t: &Tick<'_>) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    let said = Say::warn("SlotTakenOver", "the channel holds a slot for this node under another token (an earlier agent instance); taking it over".into());
    let version = ch
        .status
        .as_ref()
        .and_then(|s| s.slot_of(&cx.settings.node))
        .and_then(|s| s.version.clone())
        .or_else(|| ch.target_version())
        .unwrap_or_default();
    Ok(tick_claim(t, &version).await?.after(vec![said]))
}

/// The spec cannot be used: an Event naming the field (the condition is written by
/// [`super::invalid`]).
pub(in crate::agent) fn tick_invalid(ch: &Channel, msg: &str) -> Done {
    let said = Say::warn(
        "InvalidChannel",
        format!("UpdateChannel {}: {msg}", ch.name()),
    );
    Done::then(Then::Wait).after(vec![said.once()])
}

/// Claim an update slot with a fresh token (written on the Node first, so a restarted agent
/// finds its slot). The back-off, the gates and full slots were the decision's to judge.
pub(in crate::agent) async fn tick_claim(t: &Tick<'_>, version: &str) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    let token = format!(
        "{:016x}{:016x}",
        rand::thread_rng().gen::<u64>(),
        rand::thread_rng().gen::<u64>()
    );
    cx.annotate(&[(ANN_TOKEN, Some(&token))]).await?;
    Ok(
        match slots::claim(&t.store, &cx.settings.node, &token, version, Utc::now()).await? {
            ClaimOutcome::Claimed | ClaimOutcome::AlreadyHeld => {
                let claimed = Report::new(
                    Phase::Claimed,
                    format!("holding an update slot for {version}"),
                    Say::info(
                        "SlotClaimed",
                        format!(
                            "claimed an update slot of {} to install {version}",
                            ch.name()
                        ),
                    ),
                );
                Done::report(claimed, Then::Again)
            }
            ClaimOutcome::Full(holders) => {
                let wait = Action::WaitForSlot { holders };
                match super::waits::report(&wait, Utc::now()) {
                    Some(report) => Done::report(report, Then::Wait),
                    None => Done::then(Then::Wait),
                }
            }
            ClaimOutcome::Paused | ClaimOutcome::TargetChanged(_) => Done::then(Then::Again),
        },
    )
}

/// The claim held through a long silence is given up for a fresh one.
pub(in crate::agent) async fn tick_forfeit(
    t: &Tick<'_>,
    version: &str,
) -> Result<Done, AgentError> {
    let said = Say::warn(
        "ClaimForfeit",
        "this agent was silent too long while holding a slot; claiming afresh with a new token"
            .into(),
    );
    Ok(tick_claim(t, version).await?.after(vec![said]))
}

/// The slot is `RollingBack` and the node still runs the failed `version`: reboot back.
pub(in crate::agent) fn tick_reboot_back(version: &str) -> Done {
    let report = Report::new(
        Phase::RollingBack,
        format!("rebooting back from {version}"),
        Say::warn(
            "RebootingBack",
            format!("rebooting back from the failed {version}"),
        ),
    );
    Done::report(report, Then::Reboot)
}

/// Back on the old slot after trying `version`: report why (as the boot-assessment core
/// recorded it, not a guess from which slot booted), uncordon, record the failure.
pub(in crate::agent) async fn tick_rolled_back(
    t: &Tick<'_>,
    version: &str,
) -> Result<Done, AgentError> {
    let Tick { cx, ch, view, .. } = *t;
    let (event, reason) = rolled_back_reason(version, view.update.failed_trial.as_ref());
    let mut said = vec![Say::warn(event, reason.clone())];
    said.extend(cx.undo_cordon().await?);
    cx.clients.metrics.count(Outcome::Rollback);
    let out = cx
        .record_failure(&t.store, Some(&t.token), version, &reason, false)
        .await?;
    said.extend(publish::failure_recorded(
        ch,
        version,
        out,
        "back on the old slot after a failed update",
    ));
    Ok(Done::report(Report::quiet(Phase::Failed, reason), Then::Again).after(said))
}

/// Back on the old slot after a rollback already recorded: uncordon and release.
pub(in crate::agent) async fn tick_finish_rollback(t: &Tick<'_>) -> Result<Done, AgentError> {
    const BACK: &str = "back on the old slot after a failed update";
    let said = t.cx.give_back(&t.store, &t.token, BACK).await?;
    let report = Report::new(
        Phase::Failed,
        BACK,
        Say::warn("RollbackFinished", "back on the old slot".into()),
    );
    Ok(Done::report(report, Then::Again).after(said))
}

/// A held slot with nothing left to do: uncordon and release.
pub(in crate::agent) async fn tick_release(t: &Tick<'_>, reason: &str) -> Result<Done, AgentError> {
    let said = t.cx.give_back(&t.store, &t.token, reason).await?;
    Ok(Done::then(Then::Again).after(said))
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

#[cfg(test)]
mod tests {
    use super::{bundles_sent, rolled_back_reason};
    use crate::agent::host::status::{TrialFailure, FALLBACK_TAKEN, HEALTH_FAILED};

    fn failure(event: &str, reason: &str) -> TrialFailure {
        TrialFailure {
            event: event.into(),
            reason: reason.into(),
        }
    }

    /// The core's `health-failed` is a failed health check with the checks' output, not a
    /// bootloader fallback.
    #[test]
    fn a_health_failure_is_reported_with_the_checks_output() {
        let f = failure(HEALTH_FAILED, "10-etcd: etcd quorum lost on v2");
        let (event, text) = rolled_back_reason("v2", Some(&f));
        assert_eq!(event, "HealthCheckFailed");
        assert!(
            text.contains("etcd quorum lost on v2") && !text.contains("bootloader fell back"),
            "{text}"
        );
    }

    /// The core's `fallback-taken`, and a trial nothing was recorded of, are fallbacks.
    #[test]
    fn a_fallback_is_reported_as_a_fallback() {
        let f = failure(FALLBACK_TAKEN, "tries spent");
        let (event, text) = rolled_back_reason("v2", Some(&f));
        assert_eq!(event, "RolledBack");
        assert!(text.contains("bootloader fell back"), "{text}");
        let (event, text) = rolled_back_reason("v2", None);
        assert_eq!(event, "RolledBack");
        assert!(
            text.contains("bootloader fell back") && text.contains("v2"),
            "{text}"
        );
    }

    /// A send that delivered bundles is said with an Event about the Node; one that delivered
    /// none (nothing kept, the window closed, the collector away) says nothing.
    #[test]
    fn only_a_send_that_delivered_bundles_is_said() {
        let mut sent = libupgrade::BundlesSent {
            waiting: 1,
            stopped: Some("the collector did not answer".into()),
            ..Default::default()
        };
        assert_eq!(bundles_sent(&sent), None);
        sent.sent = 2;
        sent.bytes = 9000;
        let said = bundles_sent(&sent).expect("an Event");
        assert_eq!(said.reason, "FailureBundlesSent");
        assert!(said.node_only && !said.warning, "{said:?}");
        assert!(
            said.note.contains("sent 2 failure bundle(s)") && said.note.contains("9000 bytes"),
            "{}",
            said.note
        );
    }
}
