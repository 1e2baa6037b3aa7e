//! The one place the agent acts on a withdrawal: a release staged in this node's inactive slot
//! that the channel's signed metadata withdrew is dropped (the slot marked bad, so it is never
//! activated), by this node's own agent. The decision asks for it ([`super::decide`]'s
//! `DropWithdrawn`) from `status.fleetRollout`; the node then resolves the channel itself, and
//! libupgrade marks the slot bad only when its own signed metadata says the staged release is
//! withdrawn, so a status nobody signed cannot make a node drop a slot.
//!
//! Not the poller: it runs on the one node holding the channel's poller Lease and could drop
//! only that node's slot. Not the stage tick: a node whose target is the release it already runs
//! never stages again, and would keep the withdrawn slot staged.

use super::tick::Tick;
use crate::agent::channel::fleet_waves::cluster_seed;
use crate::agent::cluster::publish::{Done, Say, Then};
use crate::agent::errors::AgentError;

/// Drop the staged, withdrawn `version` of `ch`: the Event `WithdrawnDropped` when the slot was
/// marked bad (decided again at once), else a warning once (the node's own metadata does not
/// withdraw it) and a wait.
pub(in crate::agent) async fn tick_drop(t: &Tick<'_>, version: &str) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    let url = ch.spec.url.clone();
    let seed = cluster_seed(ch);
    let dropped = cx
        .blocking(move |ops| ops.drop_withdrawn(&url, seed))
        .await?;
    Ok(match dropped {
        Some(v) => Done::then(Then::Again).after(vec![Say::warn(
            "WithdrawnDropped",
            format!(
                "dropped the staged {}: the channel withdrew it; its slot is marked bad and will never be activated",
                v.escape_debug()
            ),
        )]),
        None => Done::then(Then::Wait).after(vec![Say::warn(
            "WithdrawnNotConfirmed",
            format!(
                "status.fleetRollout says the staged {} is withdrawn, but this node's signed channel metadata does not: keeping it",
                version.escape_debug()
            ),
        )
        .once()]),
    })
}
