//! Whether a target that failed on this node is tried again: the node's own failure record of
//! its version and generation ([`libupgrade::state::failure_of`]) judged by
//! [`libupgrade::rollout::decide_retry`] (the one decision, which the CLI's `upgrade` and `slot
//! status` take too) with the retries the target's rollout allows, the generation and the
//! retries read from this node's own resolution of the signed channel. Pure, like the rest of
//! [`super`].

use libupgrade::rollout::Retry;
use libupgrade::state::failure_of;

use super::{Inputs, Need, NodeView, PinVerdict};
use crate::agent::channel::crd::{UpdateChannel, UpdateChannelStatus};

/// What a target that may have failed on this node comes to ([`retrying`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Retrying {
    /// It never failed here: staged as usual.
    NeverFailed,
    /// Its version failed here, but as another generation: this one (republished under the
    /// same version) is another release, staged as a first attempt, over the bad slot too.
    Republished,
    /// Held back; the sentence says why (and until when, if a retry is to come).
    Held(String),
    /// Tried again now, as the rollout's retries allow; the sentence the stage announces.
    Again(String),
    /// The target's generation and its rollout's retries are not known yet: this node's own
    /// resolution of the channel.
    Ask(Need),
}

/// Whether `target` is tried on this node, if it failed here: the node's own record of the
/// target's version and generation ([`libupgrade::state::failure_of`], the matching the CLI's
/// `upgrade` holds a release back by) judged by [`libupgrade::rollout::decide_retry`] (the one
/// decision, as the CLI's `upgrade` and `slot status` take it) with the retries of the
/// target's rollout; the generation and the retries as this node's own signed channel
/// metadata says them ([`own_target`]). Without a record of its own, the channel's record of
/// this node's failure holds it back (it counts no attempts to retry by). A bad inactive slot
/// with no such record is [`super::IdleReason::BadSlot`], not a failure.
pub(super) fn retrying(
    channel: &UpdateChannel,
    status: &UpdateChannelStatus,
    node: &NodeView,
    target: &str,
    inputs: &Inputs,
) -> Retrying {
    let failed = &node.update.failed;
    // A record of the version, whatever its generation: only then is the target's own
    // generation asked for.
    if failure_of(failed, target, None).is_none() {
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
    }
    let own = match own_target(channel, target, inputs) {
        Ok(o) => o,
        Err(need) => return Retrying::Ask(need),
    };
    let Some(record) = failure_of(failed, target, own.generation) else {
        return Retrying::Republished;
    };
    let retries = own.retries;
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

/// The target as this node resolved the channel itself: its generation and the retries its
/// rollout allows.
#[derive(Debug, Clone, Copy, Default)]
struct OwnTarget {
    /// None: not known (any failure of the version is then taken as of this release).
    generation: Option<u64>,
    /// None: no retries.
    retries: Option<libupgrade::rollout::Retries>,
}

/// The target's generation and the retries its rollout allows, as this node resolved the
/// channel itself (a retry is a gate the node opens, so it is never read from the status,
/// which any poller writes): `Err` names the resolution to gather first. Neither known (the
/// default): the release has no such rollout, the channel offers another release now, or it
/// could not be resolved.
fn own_target(channel: &UpdateChannel, target: &str, inputs: &Inputs) -> Result<OwnTarget, Need> {
    if channel.spec.pinned_version().is_some() {
        return match &inputs.own_pin {
            PinVerdict::Unknown => Err(Need::OwnPinned),
            _ => Ok(inputs
                .pinned_release
                .as_ref()
                .map(|rel| OwnTarget {
                    generation: rel.generation,
                    retries: crate::agent::channel::latest::rollout_retries(rel),
                })
                .unwrap_or_default()),
        };
    }
    match &inputs.own_latest {
        None => Err(Need::OwnLatest),
        Some(Ok(own)) if own.version == target => Ok(OwnTarget {
            generation: own.generation,
            retries: own.retries,
        }),
        Some(_) => Ok(OwnTarget::default()),
    }
}
