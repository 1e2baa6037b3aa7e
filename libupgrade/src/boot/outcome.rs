//! What a boot's assessment means to a front end that asked for a good slot: the outcomes that
//! are not one ([`Unconfirmed`]), as one typed value with one message each. The CLI makes it
//! the command's error (and its exit status), the agent its verdict on a trial boot
//! (rolled back, unhealthy); neither maps an [`Outcome`] itself.

use bootconfig::Slot;

use crate::boot::assess::Outcome;
use crate::boot::confirm::ConfirmReport;
use crate::state::SlotState;

/// A boot assessment whose outcome is not a good slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unconfirmed {
    /// A check failed; `rolled_back`: the loader boots the other (good) slot next.
    #[error("health check failed on slot {slot}: {failures}")]
    HealthFailed {
        /// The booted slot.
        slot: Slot,
        /// The failed checks, `name: detail` joined with "; ".
        failures: String,
        /// The slot was marked bad and the other (good) slot boots next.
        rolled_back: bool,
    },
    /// Awaited checks were not reported yet: still on trial.
    #[error("slot {slot} passed its health checks but is not marked good yet: waiting for {waiting_for} (to be reported within {within_secs} s of the boot, e.g. by the agent); a reboot before then counts as a failed try")]
    Pending {
        /// The booted slot.
        slot: Slot,
        /// The awaited checks, joined with ", ".
        waiting_for: String,
        /// Seconds after the boot by which they must be reported.
        within_secs: u64,
    },
    /// The booted slot's content is not known to be complete.
    #[error("slot {slot} is {state}, expected staged, trying or good (its content is not known to be complete)")]
    NotAssessable {
        /// The booted slot.
        slot: Slot,
        /// Its recorded state.
        state: SlotState,
    },
}

impl ConfirmReport {
    /// `None` when this report ends on a good slot (blessed now or before), else why not.
    pub fn unconfirmed(&self) -> Option<Unconfirmed> {
        let slot = self.slot;
        match self.outcome() {
            Outcome::Blessed | Outcome::Good => None,
            Outcome::RolledBack { .. } | Outcome::Unhealthy => Some(Unconfirmed::HealthFailed {
                slot,
                failures: self.failures(),
                rolled_back: matches!(self.outcome(), Outcome::RolledBack { .. }),
            }),
            Outcome::Pending {
                waiting_for,
                within_secs,
            } => Some(Unconfirmed::Pending {
                slot,
                waiting_for: waiting_for.join(", "),
                within_secs: *within_secs,
            }),
            Outcome::NotAssessable { state } => Some(Unconfirmed::NotAssessable {
                slot,
                state: *state,
            }),
        }
    }
}
