//! What a channel says, parsed once; pure (no I/O): the `UpdateChannel` resource and its
//! status ([`crd`]), its spec parsed into a [`spec::Policy`] (maintenance [`window`]s,
//! [`duration`]s, the waves of [`rollout`], the thin-link settings of [`thin`], the pre-reboot
//! [`gates`]' judgement, label [`selector`]s), the channels of a namespace decoded and the one
//! that selects this node picked ([`listing`]), the fleet counts derived from the Nodes
//! ([`counts`]), the cluster's seed and status in the channel's fleet rollouts
//! ([`fleet_waves`]; for a pinned version, [`fleet_pinned`]), what a node's resolution of
//! `latest` found ([`latest`]) and of a pinned version ([`pinned`]), and the versions and migrations of everything the agent stores
//! ([`mod@format`]).

pub mod counts;
pub mod crd;
pub mod duration;
pub mod fleet_pinned;
pub mod fleet_waves;
pub mod format;
pub mod gates;
pub mod latest;
pub mod listing;
pub mod pinned;
pub mod rollout;
pub mod selector;
pub mod spec;
pub mod thin;
pub mod window;
