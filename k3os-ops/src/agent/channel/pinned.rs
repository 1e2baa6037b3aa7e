//! What a node's looking-only resolution of a *pinned* version (`spec.version: vN`) tells the
//! agent: whether the channel's signed rollout offers that release to the cluster now or holds
//! it back (its wave, a pause, a withdrawal, unusable rollout data), and the releases the channel
//! withdrew. The poller publishes it on the channel's status (`status.fleetRollout.heldTarget`,
//! the conditions `WaitingForWave` and `ReleaseWithdrawn`); a node asks it itself once before
//! it starts staging a pinned release the status does not hold back, so a release the channel
//! withholds is waited for, never attempted and recorded as a failure.

use libupgrade::rollout::Hold;
use libupgrade::Release;

/// A resolution of a pinned version for the cluster's seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// The version pinned.
    pub version: String,
    /// Why the channel's rollout holds it back from this cluster now (`None`: offered). A
    /// withdrawn release is `Hold::Withdrawn`.
    pub hold: Option<Hold>,
    /// Every release the channel lists as withdrawn, oldest first (libupgrade lists them
    /// whether it offers the version or refuses it).
    pub withdrawn: Vec<String>,
}

impl Pinned {
    /// `version`, offered, nothing withdrawn (a channel without rollouts).
    #[cfg(test)]
    pub fn offered(version: impl Into<String>) -> Pinned {
        Pinned {
            version: version.into(),
            hold: None,
            withdrawn: Vec::new(),
        }
    }

    /// What resolving `version` (looking only) to `rel` found: offered, with the releases the
    /// channel withdrew.
    pub fn from_release(version: &str, rel: &Release) -> Pinned {
        let withdrawn = match &rel.origin {
            libupgrade::Origin::Channel {
                rollout: Some(note),
                ..
            } => note.withdrawn.clone(),
            _ => Vec::new(),
        };
        Pinned {
            version: version.to_string(),
            hold: None,
            withdrawn,
        }
    }

    /// Held back by `hold`, when resolving `version` failed because the channel's rollout
    /// withholds it (the node's typed refusal), with the releases the channel withdrew.
    pub fn withheld(version: &str, hold: &Hold, withdrawn: &[String]) -> Pinned {
        Pinned {
            version: version.to_string(),
            hold: Some(hold.clone()),
            withdrawn: withdrawn.to_vec(),
        }
    }

    /// Whether the channel withdrew the pinned release.
    pub fn is_withdrawn(&self) -> bool {
        matches!(self.hold, Some(Hold::Withdrawn { .. })) || self.withdrawn.contains(&self.version)
    }
}
