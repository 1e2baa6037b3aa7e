//! What the node side (libupgrade) reports about this node's slots, as the decision reads it.

/// State of the slot the node is *not* running from, as libupgrade reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Inactive {
    /// Nothing usable in it (empty, or being written).
    #[default]
    Empty,
    /// A verified release is staged there, not yet handed to the bootloader.
    Staged(String),
    /// Handed to the bootloader: the next boot tries it.
    Activated(String),
    /// Tried and failed (the bootloader fell back, or health checks rolled it back).
    Failed(String),
}

/// What the node-side (libupgrade) reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeUpdateStatus {
    /// Version of the slot the node booted from (`None` if unknown, e.g. first install).
    pub booted_version: Option<String>,
    /// The booted slot is on trial (not yet confirmed good).
    pub booted_on_trial: bool,
    pub inactive: Inactive,
    /// With [`Inactive::Failed`]: what the boot-assessment core recorded about that failure
    /// (its decision log), which the agent reports as is instead of guessing from which slot
    /// booted.
    pub failed_trial: Option<TrialFailure>,
    /// The releases that failed on this node (its state file's records, which outlive the
    /// bad slot), for [`libupgrade::rollout::decide_retry`].
    pub failed: Vec<libupgrade::state::FailedRelease>,
}

/// The boot-assessment core's record of why the inactive slot's trial failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialFailure {
    /// The core's event, as its decision log names it: `health-failed` (the health checks
    /// failed and the core rolled back), `fallback-taken` (the bootloader fell back),
    /// `marked-bad`, ….
    pub event: String,
    /// The core's reason, with the failed checks' output.
    pub reason: String,
}

/// The core's event for a trial whose health checks failed.
pub const HEALTH_FAILED: &str = "health-failed";
/// The core's event for a trial the bootloader fell back from.
pub const FALLBACK_TAKEN: &str = "fallback-taken";
