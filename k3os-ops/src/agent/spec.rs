//! A channel's spec parsed and checked once: the [`Policy`] (window, timeouts, rate) every
//! decision and step reads, or the message naming the field that makes the channel invalid.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::crd::UpdateChannelSpec;
use super::duration;
use super::window::Window;

/// The channel's spec, parsed and checked.
#[derive(Debug, Clone)]
pub struct Policy {
    pub window: Option<Window>,
    pub reboot_timeout: Duration,
    pub drain_timeout: Duration,
    /// `spec.maxRate` in bytes per second.
    pub max_rate: Option<u64>,
}

impl Policy {
    /// Parse the durations and the window; the error names the field.
    pub fn from_spec(spec: &UpdateChannelSpec) -> Result<Policy, String> {
        let window = match &spec.window {
            Some(w) => Some(Window::parse(w).map_err(|e| e.to_string())?),
            None => None,
        };
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
            .map(crate::upgrade::parse_rate)
            .transpose()
            .map_err(|e| format!("spec.maxRate: {e}"))?;
        Ok(Policy {
            window,
            reboot_timeout,
            drain_timeout,
            max_rate,
        })
    }

    /// Whether an update started at `now` ends inside the window (drain + reboot timeouts);
    /// always with no window.
    pub fn fits_window(&self, now: DateTime<Utc>) -> bool {
        let Some(window) = &self.window else {
            return true;
        };
        let needed = chrono::Duration::from_std(self.needed()).unwrap_or(chrono::Duration::MAX);
        window
            .open_until(now)
            .is_some_and(|end| end - now >= needed)
    }

    /// How long a claimed update may take from claim to the node being back: the drain
    /// timeout plus the reboot timeout. A claim must leave this much of the window.
    pub fn needed(&self) -> Duration {
        self.drain_timeout + self.reboot_timeout
    }
}
