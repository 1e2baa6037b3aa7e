//! What a node's resolution of a channel's `latest` tells the agent: the release offered to
//! the cluster now, the newer one held back and why (its wave, a pause, a required stop), the
//! releases the channel withdrew, and the retries the offered release's rollout allows. The
//! poller publishes it on the channel's status (`status.latestVersion`, `status.fleetRollout`,
//! the conditions `WaitingForWave` and `ReleaseWithdrawn`); the claim check compares it with
//! the status before a node claims, and a node on which the release failed reads the retries
//! from its own resolution (never from the status, which any poller writes).

use chrono::{DateTime, Utc};
use libupgrade::rollout::{Hold, Retries, Waiting};

/// A resolution of `latest` for the cluster's seed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Latest {
    /// The release offered now (what `status.latestVersion` names).
    pub version: String,
    /// Its generation (None: not known): a failure of `version` recorded here holds it back
    /// only when of this generation ([`libupgrade::state::failure_of`]).
    pub generation: Option<u64>,
    /// The newest release above it that the channel's rollout holds back, and why.
    pub waiting: Option<Waiting>,
    /// Every release the channel lists as withdrawn, oldest first.
    pub withdrawn: Vec<String>,
    /// The retries the offered release's rollout allows a node on which it failed (None:
    /// none).
    pub retries: Option<Retries>,
}

/// The retries the rollout of `rel` (a channel's release, as this node resolved it) allows a
/// node on which it failed: what [`libupgrade::rollout::decide_retry`] is asked with.
pub fn rollout_retries(rel: &libupgrade::Release) -> Option<Retries> {
    match &rel.origin {
        libupgrade::Origin::Channel {
            rollout: Some(note),
            ..
        } => note.retries,
        _ => None,
    }
}

impl Latest {
    /// `version`, with nothing held back and nothing withdrawn (a channel without rollouts).
    #[cfg(any(test, feature = "testing"))]
    pub fn plain(version: impl Into<String>) -> Latest {
        Latest {
            version: version.into(),
            ..Latest::default()
        }
    }

    /// What resolving `latest` to `rel` found.
    pub fn of(rel: &libupgrade::Release) -> Latest {
        let note = match &rel.origin {
            libupgrade::Origin::Channel {
                rollout: Some(note),
                ..
            } => Some(note.as_ref()),
            _ => None,
        };
        Latest {
            version: rel.version.clone().unwrap_or_default(),
            generation: rel.generation,
            waiting: note.and_then(|n| n.waiting.clone()),
            withdrawn: note.map(|n| n.withdrawn.clone()).unwrap_or_default(),
            retries: rollout_retries(rel),
        }
    }

    /// When the release held back for its wave is admitted for this seed (the wave's linear
    /// growth gives each seed its own instant), if that is why it waits: the poller looks again
    /// then, so a wave is taken on time whatever the poll period. `None` for a pause, a
    /// required stop or nothing held back: those change only by a new publication, which the
    /// next periodic poll sees.
    pub fn admitted_at(&self) -> Option<DateTime<Utc>> {
        match self.waiting.as_ref()?.hold {
            Hold::Wave { starts } => starts,
            _ => None,
        }
    }

    /// Whether the channel withdrew `version`.
    pub fn withdraws(&self, version: &str) -> bool {
        self.withdrawn.iter().any(|w| w == version)
    }
}
