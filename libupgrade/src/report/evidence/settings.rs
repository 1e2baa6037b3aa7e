//! The node config's `[failure_bundle]` table: which service logs go in, the node's own
//! redaction patterns, how many bundles the state partition keeps, and where the kernel log
//! and pstore are read.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Service logs read by default, those present on the node: the test OS's kubelet and
/// containerd (`images/files/kube-up.sh`), k3OS's k3s service (OpenRC's
/// `/var/log/k3s-service.log`), and a k3s started by hand.
pub const DEFAULT_LOGS: &[&str] = &[
    "/var/log/kubelet.log",
    "/var/log/containerd.log",
    "/var/log/k3s-service.log",
    "/var/log/k3s.log",
];
/// Bundles kept on the state partition by default (the oldest beyond are dropped).
pub const DEFAULT_KEPT: usize = 4;
/// Most bundles a node config may ask to keep (each up to 64 KiB).
pub const MAX_KEPT: usize = 32;

/// `[failure_bundle]` in the node config; every key optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BundleSettings {
    /// Log files whose tails a bundle carries (`log/<file stem>`), in order; a file absent
    /// on the node is left out. Default [`DEFAULT_LOGS`].
    pub logs: Vec<PathBuf>,
    /// Regular expressions redacted on top of the default rules
    /// ([`crate::DEFAULT_REDACT_RULES`]), each match replaced by `[REDACTED]`.
    pub redact: Vec<String>,
    /// Bundles kept on the state partition, sent or not (1 to 32; default 4): the oldest beyond are dropped.
    pub kept: usize,
    /// The kernel log: `/dev/kmsg` (read without blocking), or a file whose tail is taken.
    pub kernel_log: PathBuf,
    /// The pstore filesystem, read by the good slot after a fallback (absent: nothing).
    pub pstore_dir: PathBuf,
}

impl Default for BundleSettings {
    fn default() -> Self {
        BundleSettings {
            logs: DEFAULT_LOGS.iter().map(PathBuf::from).collect(),
            redact: Vec::new(),
            kept: DEFAULT_KEPT,
            kernel_log: PathBuf::from("/dev/kmsg"),
            pstore_dir: PathBuf::from("/sys/fs/pstore"),
        }
    }
}

impl BundleSettings {
    /// Check the table: `kept` in range, every `redact` pattern a regular expression.
    pub fn check(&self) -> Result<(), String> {
        if self.kept == 0 || self.kept > MAX_KEPT {
            return Err(format!(
                "failure_bundle.kept = {} is out of range 1..={MAX_KEPT}",
                self.kept
            ));
        }
        crate::report::Redactor::new(&self.redact).map_err(|e| e.to_string())?;
        Ok(())
    }
}
