//! The phases a node's update passes through: the value of the Node annotation
//! `k3os.io/update-phase` (see [`crate::agent::channel::format`]) and the label of the
//! `k3os_ops_update_phase{phase}` metric, one enum so the two cannot drift apart.

use std::fmt;

/// Where this node's update stands, as its agent last wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    UpToDate,
    Staging,
    /// Staging waits, not failed: outside the stage windows or at the daily quota.
    StageWaiting,
    Staged,
    StageFailed,
    WaitingForWave,
    WaitingForWindow,
    WaitingForSlot,
    WaitingForGate,
    BackingOff,
    Paused,
    Claimed,
    Draining,
    DrainFailed,
    ActivateFailed,
    Aborted,
    Rebooting,
    Confirming,
    RollingBack,
    Failed,
    Unhealthy,
    NotAssessed,
}

impl Phase {
    /// Every phase, in the order an update meets them (the metric exports one series each).
    pub const ALL: [Phase; 22] = [
        Phase::UpToDate,
        Phase::Staging,
        Phase::StageWaiting,
        Phase::Staged,
        Phase::StageFailed,
        Phase::WaitingForWave,
        Phase::WaitingForWindow,
        Phase::WaitingForSlot,
        Phase::WaitingForGate,
        Phase::BackingOff,
        Phase::Paused,
        Phase::Claimed,
        Phase::Draining,
        Phase::DrainFailed,
        Phase::ActivateFailed,
        Phase::Aborted,
        Phase::Rebooting,
        Phase::Confirming,
        Phase::RollingBack,
        Phase::Failed,
        Phase::Unhealthy,
        Phase::NotAssessed,
    ];

    /// The annotation value and metric label (node annotation format 1 and 2 alike).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::UpToDate => "UpToDate",
            Phase::Staging => "Staging",
            Phase::StageWaiting => "StageWaiting",
            Phase::Staged => "Staged",
            Phase::StageFailed => "StageFailed",
            Phase::WaitingForWave => "WaitingForWave",
            Phase::WaitingForWindow => "WaitingForWindow",
            Phase::WaitingForSlot => "WaitingForSlot",
            Phase::WaitingForGate => "WaitingForGate",
            Phase::BackingOff => "BackingOff",
            Phase::Paused => "Paused",
            Phase::Claimed => "Claimed",
            Phase::Draining => "Draining",
            Phase::DrainFailed => "DrainFailed",
            Phase::ActivateFailed => "ActivateFailed",
            Phase::Aborted => "Aborted",
            Phase::Rebooting => "Rebooting",
            Phase::Confirming => "Confirming",
            Phase::RollingBack => "RollingBack",
            Phase::Failed => "Failed",
            Phase::Unhealthy => "Unhealthy",
            Phase::NotAssessed => "NotAssessed",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_is_listed_once() {
        let names: std::collections::BTreeSet<&str> =
            Phase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names.len(), Phase::ALL.len());
    }
}
