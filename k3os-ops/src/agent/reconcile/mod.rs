//! One reconcile of this node: [`controller`] has the read phase ([`observe`]: the Node, the
//! channels, the node's slots) return what it saw and publishes it, gathers what
//! the decision needs and asks the pure [`decide`] for the next step (the back-offs it reads
//! are [`cooldown`]s), then carries it out: what a waiting step says ([`waits`]), the
//! bookkeeping ticks ([`actions`]), the stage ([`staging`]) and the disruptive steps
//! ([`steps`]), the reports about unusable channels ([`invalid`]), a boot not assessed yet
//! ([`assessment`]), the stage preview with its deadline condition ([`thin_report`]) and the
//! drop of a withdrawn staged release ([`withdrawn`]). Each step is handed one [`tick::Tick`]
//! (the agent, the channel, the node's view, its slot store and token) and returns what it
//! did for the controller to publish.

pub mod actions;
pub mod assessment;
pub mod controller;
pub mod decide;
pub mod invalid;
pub mod observe;
pub mod staging;
pub mod steps;
pub mod thin_report;
pub mod tick;
pub mod waits;
pub mod withdrawn;
