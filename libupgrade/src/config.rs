//! Node configuration: where the slots live, which bootloader flips them, where state is kept.
//!
//! Read from TOML (`/etc/k3os-ops/config.toml`, or the file named by `K3OS_OPS_CONFIG`):
//!
//! ```toml
//! bootloader = "grub"            # or "syslinux"
//! tries = 3                      # boots a new slot gets before the loader falls back (syslinux: always 1)
//! state_dir = "/var/lib/k3os-ops"
//! trust_dir = "/etc/k3os-ops/trust.d"
//! channel_root = "/etc/k3os-ops/root.json"   # signed channel metadata's starting root (optional)
//! channel_metadata = "auto"      # or "required": refuse channels without signed metadata
//! health_dir = "/etc/k3os-ops/health.d"
//! health_timeout_secs = 30
//! airgap_dir = "/var/lib/rancher/k3s/agent/images"   # where the booted slot's image archives are linked
//! report_url = "https://fleet.example/reports"   # optional: where outcomes are reported
//! report_site = "store-0042"     # this node's site, as the collector enrolled it
//! [failure_bundle]               # optional: what a failed attempt's bundle carries
//! logs = ["/var/log/kubelet.log", "/var/log/containerd.log", "/var/log/k3s-service.log"]
//! redact = ["site-[0-9]+"]       # redacted on top of the default rules
//! kept = 4                       # bundles kept on the state partition
//! [layout]
//! kind = "gpt"                   # partitions rootfs-a/rootfs-b + kernels on the boot partition
//! disk = "/dev/vda"
//! boot_dir = "/boot"
//! # kind = "dir"                 # k3OS style: files in one filesystem, switched by renames
//! # root = "/k3os/system"
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Default location of the node configuration.
pub const DEFAULT_CONFIG: &str = "/etc/k3os-ops/config.toml";
/// Environment variable that overrides [`DEFAULT_CONFIG`].
pub const CONFIG_ENV: &str = "K3OS_OPS_CONFIG";

/// Which bootloader flips the slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootloaderKind {
    /// GRUB, with its environment block `grubenv` (BIOS and UEFI).
    Grub,
    /// syslinux/extlinux, with its `extlinux.conf`.
    Syslinux,
}

/// Where the slots' bytes live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum LayoutConfig {
    /// GPT partitions `rootfs-a`/`rootfs-b` on `disk`; kernels under `boot_dir/{a,b}/`.
    Gpt {
        /// The whole disk holding the GPT (`/dev/vda`).
        disk: PathBuf,
        /// The mounted boot partition.
        boot_dir: PathBuf,
    },
    /// k3OS style: `root/rootfs/<version>/`, `root/kernel/<version>/`, slot links `a`/`b`.
    Dir {
        /// The directory holding `rootfs/`, `kernel/` and the slot links.
        root: PathBuf,
        /// The mounted boot partition.
        boot_dir: PathBuf,
    },
}

impl LayoutConfig {
    /// The mounted boot partition, where the loader's files live.
    pub fn boot_dir(&self) -> &Path {
        match self {
            LayoutConfig::Gpt { boot_dir, .. } | LayoutConfig::Dir { boot_dir, .. } => boot_dir,
        }
    }
}

fn default_tries() -> u8 {
    3
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/k3os-ops")
}
fn default_trust_dir() -> PathBuf {
    PathBuf::from("/etc/k3os-ops/trust.d")
}
fn default_health_dir() -> PathBuf {
    PathBuf::from("/etc/k3os-ops/health.d")
}
fn default_airgap_dir() -> PathBuf {
    PathBuf::from(crate::payload::airgap::DEFAULT_DIR)
}
fn default_health_timeout() -> u64 {
    30
}
fn default_cmdline() -> PathBuf {
    PathBuf::from("/proc/cmdline")
}
fn default_release_file() -> PathBuf {
    PathBuf::from("/etc/k3os-release")
}
fn default_mounts() -> PathBuf {
    PathBuf::from("/proc/self/mountinfo")
}
fn default_retries() -> u32 {
    20
}
fn default_boot_id() -> PathBuf {
    PathBuf::from("/proc/sys/kernel/random/boot_id")
}
fn default_channel_root() -> PathBuf {
    PathBuf::from("/etc/k3os-ops/root.json")
}
/// Default budget of the payload store: 4 GiB (two releases' k3s airgap images with room).
pub const DEFAULT_PAYLOAD_STORE_MAX_BYTES: u64 = 4 << 30;

fn default_payload_store_max_bytes() -> u64 {
    DEFAULT_PAYLOAD_STORE_MAX_BYTES
}

fn default_true() -> bool {
    true
}

/// The node configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Which bootloader flips the slots.
    pub bootloader: BootloaderKind,
    /// Boots a newly activated slot gets (GRUB; syslinux always gives exactly one).
    #[serde(default = "default_tries")]
    pub tries: u8,
    /// Where the slots' bytes live.
    pub layout: LayoutConfig,
    /// Directory for the state file and partial downloads (the state partition).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// Public keys (`*.pub`) whose signatures this node accepts.
    #[serde(default = "default_trust_dir")]
    pub trust_dir: PathBuf,
    /// Extra health checks: every executable file here is run by `confirm`.
    #[serde(default = "default_health_dir")]
    pub health_dir: PathBuf,
    /// Where every boot links the booted slot's image archives for k3s to import, before the
    /// health checks ([`crate::payload::airgap`]); k3s's airgap image directory by default.
    #[serde(default = "default_airgap_dir")]
    pub airgap_dir: PathBuf,
    /// Seconds each health check in `health_dir` may run before it is killed and fails.
    #[serde(default = "default_health_timeout")]
    pub health_timeout_secs: u64,
    /// Download attempts per file before giving up (each resumes where the last stopped).
    #[serde(default = "default_retries")]
    pub download_retries: u32,
    /// Where the booted slot is read from (`k3os.slot=` on the kernel command line).
    #[serde(default = "default_cmdline")]
    pub proc_cmdline: PathBuf,
    /// The running rootfs's release file (`VERSION=`, `GENERATION=`).
    #[serde(default = "default_release_file")]
    pub release_file: PathBuf,
    /// Mount table used by the built-in health check.
    #[serde(default = "default_mounts")]
    pub mountinfo: PathBuf,
    /// Changes on every boot: tells `confirm` whether a reboot happened since `activate`.
    #[serde(default = "default_boot_id")]
    pub boot_id_file: PathBuf,
    /// Run the built-in root-filesystem check in `confirm` (off only for hosts that do not boot
    /// from a slot, such as tests of the state machine).
    #[serde(default = "default_true")]
    pub builtin_health_check: bool,
    /// A reachability check every activation awaits on its trial boot ([`crate::boot::reach`]);
    /// None (no `[reachability]` table): none.
    #[serde(default)]
    pub reachability: Option<crate::boot::reach::Reachability>,
    /// The node's starting root of channel metadata (see [`crate::trust`]), put there at image
    /// build; when the file is absent, channels are resolved from their unsigned index.
    #[serde(default = "default_channel_root")]
    pub channel_root: PathBuf,
    /// `"auto"` (default) or `"required"`: whether a channel without signed metadata may be
    /// used (see [`crate::channel::MetadataPolicy`]).
    #[serde(default)]
    pub channel_metadata: crate::channel::MetadataPolicy,
    /// The collector's URL (`http://` or `https://`) that this node's update outcomes are
    /// reported to (see `crate::report`); None (default): the node reports nothing and
    /// spools nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_url: Option<String>,
    /// The site (cluster) this node reports for, as the collector's allow-list enrols it:
    /// 1-63 of `a-z 0-9 . _ -`. Required with `report_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_site: Option<String>,
    /// Bytes the payload store on the state partition may hold ([`crate::payload`]): a
    /// release whose payloads do not fit beside the running release's is refused before
    /// anything is written. Default [`DEFAULT_PAYLOAD_STORE_MAX_BYTES`].
    #[serde(default = "default_payload_store_max_bytes")]
    pub payload_store_max_bytes: u64,
    /// `[failure_bundle]`: what a failed attempt's bundle carries and how many are kept
    /// ([`crate::BundleSettings`]); collected only with `report_url`.
    #[serde(default)]
    pub failure_bundle: crate::BundleSettings,
}

impl Config {
    /// Parse a configuration file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("read config", path, e))?;
        Self::parse(&text).map_err(|what| Error::Config {
            path: path.to_path_buf(),
            what,
        })
    }

    /// Parse configuration text; the error says which key is wrong.
    pub fn parse(text: &str) -> std::result::Result<Config, String> {
        let c: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        if c.tries == 0 || c.tries > crate::MAX_TRIES {
            return Err(format!(
                "tries = {} is out of range 1..={}",
                c.tries,
                crate::MAX_TRIES
            ));
        }
        check_report_keys(&c)?;
        c.failure_bundle.check()?;
        Ok(c)
    }

    /// The configuration named by `K3OS_OPS_CONFIG`, else [`DEFAULT_CONFIG`].
    pub fn from_env() -> Result<Config> {
        let path = std::env::var_os(CONFIG_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
        Self::load(&path)
    }
}

/// `report_url` is an http(s) URL and comes with a valid `report_site`.
fn check_report_keys(c: &Config) -> std::result::Result<(), String> {
    let Some(url) = &c.report_url else {
        return match &c.report_site {
            Some(_) => Err("report_site is set but report_url is not".into()),
            None => Ok(()),
        };
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "report_url = {:?} is not an http:// or https:// URL",
            url.escape_debug().to_string()
        ));
    }
    let site = c
        .report_site
        .as_deref()
        .ok_or("report_url needs report_site (the node's site name)")?;
    let ok = !site.is_empty()
        && site.len() <= 63
        && site.as_bytes()[0].is_ascii_alphanumeric()
        && site
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if !ok {
        return Err(format!(
            "report_site = {:?} is not 1-63 of a-z 0-9 . _ - starting with a letter or digit",
            site.escape_debug().to_string()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let c = Config::parse(
            r#"bootloader = "grub"
            tries = 3
            [layout]
            kind = "gpt"
            disk = "/dev/vda"
            boot_dir = "/boot"
            "#,
        )
        .unwrap();
        assert_eq!(c.bootloader, BootloaderKind::Grub);
        assert_eq!(
            c.layout,
            LayoutConfig::Gpt {
                disk: "/dev/vda".into(),
                boot_dir: "/boot".into()
            }
        );
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/k3os-ops"));
    }

    #[test]
    fn names_the_bad_key() {
        let e = Config::parse(
            "bootloader = \"lilo\"\n[layout]\nkind=\"gpt\"\ndisk=\"/d\"\nboot_dir=\"/b\"\n",
        )
        .unwrap_err();
        assert!(e.contains("lilo"), "{e}");
        let e = Config::parse("bootloader = \"grub\"\ntries = 0\n[layout]\nkind=\"gpt\"\ndisk=\"/d\"\nboot_dir=\"/b\"\n")
            .unwrap_err();
        assert!(e.contains("tries"), "{e}");
    }

    #[test]
    fn report_keys_come_together_and_are_checked() {
        let base = "bootloader = \"grub\"\n[layout]\nkind=\"gpt\"\ndisk=\"/d\"\nboot_dir=\"/b\"\n";
        let with = |keys: &str| Config::parse(&format!("{keys}\n{base}"));
        let c = with("report_url = \"https://c.example/r\"\nreport_site = \"site-1\"").unwrap();
        assert_eq!(c.report_url.as_deref(), Some("https://c.example/r"));
        assert_eq!(c.report_site.as_deref(), Some("site-1"));
        assert_eq!(with("").unwrap().report_url, None);
        for (keys, want) in [
            ("report_url = \"https://c.example/r\"", "needs report_site"),
            ("report_site = \"a\"", "report_url is not"),
            (
                "report_url = \"ftp://x\"\nreport_site = \"a\"",
                "not an http",
            ),
            (
                "report_url = \"http://x\"\nreport_site = \"Site A\"",
                "report_site",
            ),
        ] {
            let e = with(keys).unwrap_err();
            assert!(e.contains(want), "{keys}: {e}");
        }
    }
}
