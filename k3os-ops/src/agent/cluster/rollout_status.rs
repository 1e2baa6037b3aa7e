//! The poller's report of a channel's fleet rollouts: `status.latestVersion`, the cluster's
//! seed and withdrawn releases (`status.fleetRollout`) and the conditions `WaitingForWave` and
//! `ReleaseWithdrawn`, in one compare-and-swap of the status; the `ReleaseWithdrawn` Event once
//! when the release the cluster was updating to is withdrawn. The rules are
//! [`crate::agent::channel::fleet_waves`] (pure); a poll that changes nothing writes nothing.
//! On a channel that pins `spec.version`, the same for the pinned release
//! ([`publish_pinned`], rules in [`crate::agent::channel::fleet_pinned`]; `latestVersion` is
//! not written there).

use chrono::{DateTime, Utc};
use libupgrade::rollout::Seed;

use super::kube_store::KubeChannelStore;
use super::slots::{self, SlotError};
use crate::agent::channel::latest::Latest;
use crate::agent::channel::pinned::Pinned;
use crate::agent::channel::{fleet_pinned, fleet_waves};

/// Write what resolving `latest` with `seed` found: `Ok(Some(note))` when this write turned
/// `ReleaseWithdrawn` True (its Event's note).
pub async fn write(
    store: &KubeChannelStore,
    latest: &Latest,
    seed: Seed,
    now: DateTime<Utc>,
) -> Result<Option<String>, SlotError> {
    slots::cas_changed(store, now, |_, st| {
        let turned = fleet_waves::apply(st, latest, seed, now);
        slots::with_latest(st, Ok(&latest.version), now);
        turned
    })
    .await
}

/// Write what resolving the pinned release with `seed` found: `Ok(Some(note))` when this write
/// turned `ReleaseWithdrawn` True (its Event's note).
pub async fn write_pinned(
    store: &KubeChannelStore,
    pinned: &Pinned,
    seed: Seed,
    now: DateTime<Utc>,
) -> Result<Option<String>, SlotError> {
    slots::cas_changed(store, now, |_, st| {
        slots::with_pinned_resolved(st, &pinned.version, now);
        fleet_pinned::apply(st, pinned, seed, now)
    })
    .await
}
