//! The agent's looking-only questions to the channel, as [`StageRequest`]s resolved through
//! [`NodeOps::resolve`]: what `latest` is for the cluster ([`resolve_latest`]: the poller, the
//! claim check) and whether a pinned version is offered to it ([`resolve_pinned`]: the
//! poller, the node's own check before a stage or a claim). Both resolve as the cluster's view
//! ([`StageRequest::for_cluster`]: this node's staged release does not count as started) and
//! write only what a TUF client keeps ([`libupgrade::Writes::Trust`]).
//!
//! A pinned version's resolution is also the release a stage of it takes: the stage tick that
//! asked whether the pin is offered hands the release on ([`PinnedRelease::release`]), so the
//! tick reads the channel once.

use libupgrade::rollout::Seed;
use libupgrade::{Release, StageRequest, Wanted, Writes};

use super::ops::{NodeError, NodeOps};
use crate::agent::channel::latest::Latest;
use crate::agent::channel::pinned::Pinned;

/// The cluster's look at `channel`: `version` (None: `latest`) for the cluster placed at
/// `seed`, through the rollouts unless `ignore_rollout`.
pub fn looking(
    channel: &str,
    version: Option<&str>,
    seed: Seed,
    ignore_rollout: bool,
) -> StageRequest {
    StageRequest {
        writes: Writes::Trust,
        for_cluster: true,
        seed: Some(seed),
        ignore_rollout,
        ..StageRequest::new(Wanted::channel(channel, version))
    }
}

/// What `latest` of `channel` is for a node of this architecture placed at `seed` in the
/// channel's rollouts: the release offered, the newer one held back and the withdrawn ones.
pub fn resolve_latest(ops: &dyn NodeOps, channel: &str, seed: Seed) -> Result<Latest, NodeError> {
    Ok(Latest::of(
        &ops.resolve(&looking(channel, None, seed, false))?,
    ))
}

/// A pinned version as this node resolved it: the verdict, and the release when offered.
#[derive(Debug, Clone)]
pub struct PinnedRelease {
    /// Whether the rollout offers it, and what the channel withdrew.
    pub pinned: Pinned,
    /// The release, when the channel offers it: what a stage of it in the same tick takes.
    pub release: Option<Release>,
}

/// Whether `channel`'s rollout offers the pinned `version` to a node placed at `seed` now, or
/// holds it back and why ([`Pinned`]); `ignore_rollout`: as `upgrade --ignore-rollout` (a
/// withdrawal still shows in [`Pinned::withdrawn`]). From the channel only: an offline bundle
/// of the version says nothing about its rollout. `Err`: the channel could not be resolved.
pub fn resolve_pinned(
    ops: &dyn NodeOps,
    channel: &str,
    version: &str,
    seed: Seed,
    ignore_rollout: bool,
) -> Result<PinnedRelease, NodeError> {
    match ops.resolve(&looking(channel, Some(version), seed, ignore_rollout)) {
        Ok(rel) => Ok(PinnedRelease {
            pinned: Pinned::from_release(version, &rel),
            release: Some(rel),
        }),
        Err(e) => match e
            .withheld
            .as_ref()
            .map(|w| Pinned::withheld(version, &w.hold, &w.withdrawn))
        {
            Some(pinned) => Ok(PinnedRelease {
                pinned,
                release: None,
            }),
            None => Err(e),
        },
    }
}

/// The release a stage of `req` takes: the node's offline bundle of the version first, else
/// `resolved` (the channel's release this tick already resolved for the same version), else
/// one resolution of `req`.
pub fn for_stage(
    ops: &dyn NodeOps,
    req: &StageRequest,
    resolved: Option<Release>,
) -> Result<Release, NodeError> {
    if let Some(bundle) = ops.offline(req)? {
        return Ok(bundle);
    }
    let wanted = req.wanted.version();
    match resolved {
        Some(rel) if wanted.is_some() && rel.version.as_deref() == wanted => Ok(rel),
        _ => ops.resolve(req),
    }
}
