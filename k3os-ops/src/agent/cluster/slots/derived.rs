//! The status fields every write recomputes from the rest of the status: the `Paused` and
//! `Degraded` conditions for the channel's current target, `updating` (every holder, for the
//! printer column) and the format marker.

use chrono::{DateTime, Utc};

use crate::agent::channel::crd::{UpdateChannel, UpdateChannelStatus, COND_DEGRADED, COND_PAUSED};
use crate::agent::channel::format::STATUS_FORMAT;

/// Keep the derived fields in line with the status: `Paused` and `Degraded` for the
/// channel's current target, and `updating` (all slot holders) for the printer column.
pub fn refresh_conditions(ch: &mut UpdateChannel, now: DateTime<Utc>) {
    let target = ch.target_version();
    let paused_by_failures = target.as_deref().is_some_and(|v| ch.paused_for(v));
    let paused = paused_by_failures || ch.spec.paused;
    let max = ch.spec.max_failures;
    let failed = match (target.as_deref(), ch.status.as_ref()) {
        (Some(v), Some(st)) => ch.counted_failures(st, v),
        _ => 0,
    };
    let name = ch.metadata.name.clone().unwrap_or_default();
    let generation = ch.metadata.generation;
    let status = ch.status.get_or_insert_with(UpdateChannelStatus::default);
    let holders: Vec<&str> = status.slots.iter().map(|s| s.node.as_str()).collect();
    status.updating = (!holders.is_empty()).then(|| holders.join(","));
    let tv = target.unwrap_or_default();
    let (reason, message) = if paused_by_failures {
        ("TooManyFailures", format!("{failed} node(s) failed to update to {tv} (maxFailures {max}); new claims are paused. {}", resume_hint(&name)))
    } else if paused {
        (
            "PausedBySpec",
            "spec.paused is true; new claims are paused".to_string(),
        )
    } else {
        ("Running", String::new())
    };
    status.set_condition(COND_PAUSED, paused, reason, message, now);
    status.set_condition(
        COND_DEGRADED,
        failed > 0,
        if failed > 0 {
            "UpdateFailed"
        } else {
            "Healthy"
        },
        if failed > 0 {
            let nodes: Vec<&str> = status
                .failures
                .iter()
                .filter(|f| f.version == tv)
                .map(|f| f.node.as_str())
                .collect();
            format!("{tv} failed on {}", nodes.join(", "))
        } else {
            String::new()
        },
        now,
    );
    status.observed_generation = generation;
    // Whatever format was read (v0.1.0 wrote none), the write is in this agent's.
    status.format_version = Some(u64::from(STATUS_FORMAT));
}

/// How to resume channel `name` after a pause by failures: one `kubectl patch`.
pub fn resume_hint(name: &str) -> String {
    format!("Resume with: kubectl patch upchan {name} --type merge -p \"{{\\\"spec\\\":{{\\\"resumedAt\\\":\\\"$(date -u +%FT%TZ)\\\"}}}}\"")
}
