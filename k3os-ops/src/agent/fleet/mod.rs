//! The loops a Lease grants, beside the reconcile loop: this node's Lease renewal and the
//! reclaim of slots held by dead nodes ([`background`]), the `latest` poller ([`poller`]), and
//! the fleet counter that writes `status.nodes`, `Complete` and the waves ([`counter`]).

pub mod background;
pub mod counter;
pub mod poller;
