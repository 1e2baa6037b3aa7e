//! Reporting a channel whose signed metadata expired (a frozen or replayed channel, or a
//! channel job that stopped re-signing the timestamp): condition `ChannelStale` on the
//! channel, one Event when it turns True, and the gauge `k3os_ops_channel_stale{channel}`.
//! A fresh resolve clears all three. Nothing else changes: the node simply does not stage
//! from a stale channel (libupgrade refuses the metadata), and rollback and the boot-time
//! confirm never read channel metadata.
//!
//! The decision is [`with_stale`] (pure, on the status as read); the write is one
//! compare-and-swap of the status like every other status write (see [`crate::agent::cluster::slots`]).

use chrono::{DateTime, Utc};

use super::kube_store::KubeChannelStore;
use super::slots::{self, SlotError, Step};
use crate::agent::channel::crd::{UpdateChannelStatus, COND_CHANNEL_STALE};
use crate::agent::host::ops::StaleMetadata;

/// The condition's message: the role and its expiry, and what the publisher must do.
pub fn message(stale: &StaleMetadata) -> String {
    format!(
        "the channel's {} metadata expired at {}: the channel is not re-signed (or a mirror serves an old copy); no update is staged from it until fresh metadata is published",
        stale.role.as_str(),
        libupgrade::trust::meta::time_str(&stale.expires)
    )
}

/// Change `st`'s `ChannelStale` condition to say `stale` (None: fresh). A fresh channel
/// that was never stale gets no condition. Returns whether anything changed.
pub fn with_stale(
    st: &mut UpdateChannelStatus,
    stale: Option<&StaleMetadata>,
    now: DateTime<Utc>,
) -> bool {
    let before = st.clone();
    match stale {
        Some(s) => st.set_condition(COND_CHANNEL_STALE, true, "MetadataExpired", message(s), now),
        None if st.conditions.iter().any(|c| c.type_ == COND_CHANNEL_STALE) => st.set_condition(
            COND_CHANNEL_STALE,
            false,
            "MetadataFresh",
            "the channel's signed metadata verified and is not expired".to_string(),
            now,
        ),
        None => {}
    }
    *st != before
}

/// Write [`with_stale`] by compare-and-swap: `Ok(true)` when the condition turned True by
/// this write (so this agent reports the Event).
pub async fn write(
    store: &KubeChannelStore,
    stale: Option<&StaleMetadata>,
    now: DateTime<Utc>,
) -> Result<bool, SlotError> {
    slots::cas(store, now, |_, st| {
        let was = is_stale(st);
        if with_stale(st, stale, now) {
            Step::Write(!was && stale.is_some())
        } else {
            Step::Done(false)
        }
    })
    .await
}

pub(in crate::agent) fn is_stale(st: &UpdateChannelStatus) -> bool {
    st.conditions
        .iter()
        .any(|c| c.type_ == COND_CHANNEL_STALE && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use libupgrade::trust::meta::Role;

    #[test]
    fn the_condition_is_set_once_cleared_once_and_never_added_to_a_fresh_channel() {
        let now = Utc::now();
        let s = StaleMetadata {
            role: Role::Timestamp,
            expires: now - chrono::Duration::hours(1),
        };
        let mut st = UpdateChannelStatus::default();
        assert!(
            !with_stale(&mut st, None, now),
            "a never-stale channel gets nothing"
        );
        assert!(st.conditions.is_empty());
        assert!(with_stale(&mut st, Some(&s), now));
        assert!(is_stale(&st));
        assert!(st.conditions[0]
            .message
            .contains("timestamp metadata expired at"));
        assert!(
            !with_stale(&mut st, Some(&s), now),
            "the same staleness again: no write"
        );
        assert!(with_stale(&mut st, None, now));
        assert!(!is_stale(&st));
        assert_eq!(st.conditions[0].reason, "MetadataFresh");
        assert!(!with_stale(&mut st, None, now));
    }
}
