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
use crate::agent::channel::crd::UpdateChannel;
use crate::agent::channel::{fleet_pinned, fleet_waves};
use crate::agent::context::Agent;
use crate::agent::host::latest::Latest;
use crate::agent::host::pinned::Pinned;

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

/// Publish the poller's resolution of `ch` (as read): the status write, and the Events of a
/// new `latestVersion` (`LatestResolved`) and of a withdrawn target (`ReleaseWithdrawn`).
/// A failed write is logged (the next poll tries again).
pub async fn publish(cx: &Agent, ch: &UpdateChannel, latest: &Latest, seed: Seed) {
    let name = ch.metadata.name.clone().unwrap_or_default();
    let withdrawn = match write(&cx.store(&name), latest, seed, Utc::now()).await {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("write latestVersion of {name}: {e}");
            return;
        }
    };
    if let Some(note) = withdrawn {
        cx.event(Some(ch), true, "ReleaseWithdrawn", note).await;
    }
    let v = &latest.version;
    if ch.status.as_ref().and_then(|s| s.latest_version.as_deref()) != Some(v) {
        cx.event(
            Some(ch),
            false,
            "LatestResolved",
            format!("newest release of {} is {v}", ch.spec.url),
        )
        .await;
    }
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
        fleet_pinned::apply(st, pinned, seed, now)
    })
    .await
}

/// Publish the poller's resolution of `ch`'s pinned release: the status write and the Event of
/// a withdrawn pin (`ReleaseWithdrawn`). A failed write is logged (the next poll tries again).
pub async fn publish_pinned(cx: &Agent, ch: &UpdateChannel, pinned: &Pinned, seed: Seed) {
    let name = ch.metadata.name.clone().unwrap_or_default();
    match write_pinned(&cx.store(&name), pinned, seed, Utc::now()).await {
        Ok(Some(note)) => cx.event(Some(ch), true, "ReleaseWithdrawn", note).await,
        Ok(None) => {}
        Err(e) => tracing::warn!("write fleetRollout of {name}: {e}"),
    }
}
