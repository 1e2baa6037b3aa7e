//! Whether a target that failed on this node is tried again: the node's own failure record
//! judged by [`libupgrade::rollout::decide_retry`] (the one decision, which the CLI's
//! `upgrade` and `slot status` take too) with the retries the target's rollout allows, read
//! from this node's own resolution of the signed channel. Pure, like the rest of [`super`].

use libupgrade::rollout::Retry;

use super::{Inputs, Need, NodeView, PinVerdict};
use crate::agent::channel::crd::{UpdateChannel, UpdateChannelStatus};

/// What a target that may have failed on this node comes to ([`retrying`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Retrying {
    /// It never failed here: staged as usual.
    NeverFailed,
    /// Held back; the sentence says why (and until when, if a retry is to come).
    Held(String),
    /// Tried again now, as the rollout's retries allow; the sentence the stage announces.
    Again(String),
    /// The rollout's retries are not known yet: this node's own resolution of the channel.
    Ask(Need),
}

/// Whether `target` is tried on this node, if it failed here: the node's own record judged by
/// [`libupgrade::rollout::decide_retry`] (the one decision, as the CLI's `upgrade` and `slot
/// status` take it) with the retries of the target's rollout as this node's own signed
/// channel metadata says them ([`rollout_retries`]). Without a record of its own, the channel's
/// record of this node's failure holds it back (it counts no attempts to retry by). A bad
/// inactive slot with no such record is [`super::IdleReason::BadSlot`], not a failure.
pub(super) fn retrying(
    channel: &UpdateChannel,
    status: &UpdateChannelStatus,
    node: &NodeView,
    target: &str,
    inputs: &Inputs,
) -> Retrying {
    let Some(record) = node.update.failed.iter().rev().find(|f| f.is(target, None)) else {
        let listed = status
            .failures
            .iter()
            .any(|f| f.node == node.name && f.version == target);
        return match listed {
            true => Retrying::Held(format!(
                "failed here: {target} failed on this node (status.failures lists it)"
            )),
            false => Retrying::NeverFailed,
        };
    };
    let retries = match rollout_retries(channel, target, inputs) {
        Ok(r) => r,
        Err(need) => return Retrying::Ask(need),
    };
    match libupgrade::rollout::decide_retry(Some(record), retries, inputs.now) {
        Retry::Wait { why, .. } => Retrying::Held(why),
        Retry::Proceed => Retrying::Again(format!(
            "retrying {}: it failed {} time(s) on this node (last: {}); retry {} of {} its rollout allows",
            target.escape_debug(),
            record.attempts,
            record.why.escape_debug(),
            record.attempts,
            retries.map_or(0, |r| r.count)
        )),
    }
}

/// The retries the rollout of `target` allows, as this node resolved the channel itself (a
/// retry is a gate the node opens, so it is never read from the status, which any poller
/// writes): `Err` names the resolution to gather first. None: no retries (the release has no
/// such rollout, the channel offers another release now, or it could not be resolved).
fn rollout_retries(
    channel: &UpdateChannel,
    target: &str,
    inputs: &Inputs,
) -> Result<Option<libupgrade::rollout::Retries>, Need> {
    if channel.spec.pinned_version().is_some() {
        return match &inputs.own_pin {
            PinVerdict::Unknown => Err(Need::OwnPinned),
            _ => Ok(inputs
                .pinned_release
                .as_ref()
                .and_then(crate::agent::channel::latest::rollout_retries)),
        };
    }
    match &inputs.own_latest {
        None => Err(Need::OwnLatest),
        Some(Ok(own)) if own.version == target => Ok(own.retries),
        Some(_) => Ok(None),
    }
}
