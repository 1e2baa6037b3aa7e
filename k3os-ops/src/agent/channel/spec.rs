//! A channel's spec parsed and checked once: the [`Policy`] (windows, timeouts, rate, waves,
//! gates, thin-link settings) every decision and step reads, or the message naming the field
//! that makes the channel invalid.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::crd::UpdateChannelSpec;
use super::duration;
use super::gates::Gates;
use super::rollout::Rollout;
use super::thin::ThinPolicy;
use super::window::Window;

/// The channel's spec, parsed and checked.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `spec.window` then `spec.windows`; empty: no window, claims at any time.
    pub windows: Vec<Window>,
    pub reboot_timeout: Duration,
    pub drain_timeout: Duration,
    /// `spec.maxRate` in bytes per second.
    pub max_rate: Option<u64>,
    /// `spec.rollout`: the waves (none: every selected node may claim).
    pub rollout: Option<Rollout>,
    /// `spec.blockingPodSelector` and `spec.prometheus`: what must be quiet before a claim.
    pub gates: Gates,
    /// `spec.stage` and `spec.sources`: when and how much to download, and from where.
    pub thin: ThinPolicy,
}

impl Policy {
    /// Parse the durations and the window; the error names the field.
    pub fn from_spec(spec: &UpdateChannelSpec) -> Result<Policy, String> {
        let mut windows = Vec::new();
        if let Some(w) = &spec.window {
            windows.push(Window::parse(w).map_err(|e| e.to_string())?);
        }
        for (i, w) in spec.windows.iter().enumerate() {
            windows.push(Window::parse(w).map_err(|e| format!("spec.windows[{i}]: {e}"))?);
        }
        let reboot_timeout = duration::parse("spec.rebootTimeout", &spec.reboot_timeout)
            .map_err(|e| e.to_string())?;
        let drain_timeout = duration::parse("spec.drain.timeout", &spec.drain.timeout)
            .map_err(|e| e.to_string())?;
        if reboot_timeout.is_zero() {
            return Err(format!(
                "spec.rebootTimeout: '{}' must be greater than 0 (a zero timeout would reclaim every slot at once)",
                spec.reboot_timeout
            ));
        }
        if drain_timeout.is_zero() {
            return Err(format!(
                "spec.drain.timeout: '{}' must be greater than 0",
                spec.drain.timeout
            ));
        }
        if spec.concurrency == 0 {
            return Err("spec.concurrency: must be at least 1".into());
        }
        let max_rate = spec
            .max_rate
            .as_deref()
            .map(libupgrade::units::parse_rate)
            .transpose()
            .map_err(|e| format!("spec.maxRate: {e}"))?;
        let rollout = spec.rollout.as_ref().map(Rollout::from_spec).transpose()?;
        let gates = Gates::from_spec(
            spec.blocking_pod_selector.as_deref(),
            spec.prometheus.as_ref(),
        )?;
        let thin = ThinPolicy::from_spec(spec, max_rate)?;
        Ok(Policy {
            windows,
            reboot_timeout,
            drain_timeout,
            max_rate,
            rollout,
            gates,
            thin,
        })
    }

    /// Whether an update started at `now` ends inside one of the windows (drain + reboot
    /// timeouts); always with no window.
    pub fn fits_window(&self, now: DateTime<Utc>) -> bool {
        let needed = chrono::Duration::from_std(self.needed()).unwrap_or(chrono::Duration::MAX);
        self.windows.is_empty()
            || self
                .windows
                .iter()
                .any(|w| w.open_until(now).is_some_and(|end| end - now >= needed))
    }

    /// The first start of any window strictly after `now`.
    pub fn next_window_start(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.windows.iter().filter_map(|w| w.next_start(now)).min()
    }

    /// How long a claimed update may take from claim to the node being back: the drain
    /// timeout plus the reboot timeout. A claim must leave this much of the window.
    pub fn needed(&self) -> Duration {
        self.drain_timeout + self.reboot_timeout
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::Policy;
    use crate::agent::channel::crd::UpdateChannel;
    use crate::agent::channel::thin::Gate;

    /// The channel v0.1.0 wrote (tests/fixtures/v0.1.0) has no thin-link settings: its policy
    /// stages at once without a cap, and re-encoding its spec adds none.
    #[test]
    fn a_v010_channel_has_no_thin_link_settings_and_stages_as_before() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/v0.1.0/updatechannel.json"
        );
        let ch: UpdateChannel = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let policy = Policy::from_spec(&ch.spec).expect("a v0.1.0 spec is valid");
        assert!(policy.thin.windows.is_empty() && policy.thin.sources.is_empty());
        assert_eq!(policy.thin.max_bytes_per_day, None);
        assert_eq!(
            policy.thin.gate(Utc::now(), 0),
            Gate::Stage {
                schedule: None,
                max_bytes: None
            }
        );
        // Re-encoded, it gains no field.
        let again = serde_json::to_value(&ch.spec).unwrap();
        assert!(again.get("stage").is_none() && again.get("sources").is_none());
    }
}
