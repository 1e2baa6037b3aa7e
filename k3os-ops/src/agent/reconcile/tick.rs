//! What one tick knows once the read phase found this node's channel: the [`Tick`] every
//! function that carries out a decided step is handed, in place of the agent, the channel,
//! the node's view, its slot store and its token passed one by one. What a tick did comes
//! back as one value ([`crate::agent::cluster::publish::Done`]) for the controller to
//! publish; the release a stage acts on rides in its action ([`super::decide::Action::Stage`]).

use super::decide::NodeView;
use crate::agent::channel::listing::Channel;
use crate::agent::cluster::kube_store::KubeChannelStore;
use crate::agent::context::Agent;

/// One tick of this node under its channel: who acts, on what, as the read phase saw it.
///
/// Clocks are read where each step needs them (a step after a long stage or drain reads a
/// later time than the tick's start), so the tick carries no `now`.
pub(in crate::agent) struct Tick<'a> {
    /// The agent acting (its settings, clients and memory).
    pub cx: &'a Agent,
    /// This node's channel, its spec parsed.
    pub ch: &'a Channel,
    /// This node as the read phase saw it.
    pub view: &'a NodeView,
    /// The channel's status, where the update slots are claimed and fenced.
    pub store: KubeChannelStore,
    /// The token this node's slot is held under (empty: none claimed yet).
    pub token: String,
}

impl<'a> Tick<'a> {
    /// The tick of `cx` for the node seen as `view` under `ch`.
    pub(in crate::agent) fn new(cx: &'a Agent, ch: &'a Channel, view: &'a NodeView) -> Self {
        Tick {
            cx,
            ch,
            view,
            store: cx.store(ch.name()),
            token: view.token.clone().unwrap_or_default(),
        }
    }
}
