//! The loops a Lease grants, beside the reconcile loop: this node's Lease renewal, the reclaim
//! of slots held by dead nodes and the `latest` poller ([`background`]), and the fleet
//! counter that writes `status.nodes`, `Complete` and the waves ([`counter`]).

pub mod background;
pub mod counter;
