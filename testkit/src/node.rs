//! A node under a temp root: its [`Config`] ([`dir_config`]) and the kernel's files that say
//! which slot booted ([`boot_as`]).

use std::path::Path;

use bootconfig::Slot;
use libupgrade::{BootloaderKind, Config, LayoutConfig};

/// Pretend the node booted `slot` in boot `boot_id`.
pub fn boot_as(c: &Config, slot: Slot, boot_id: &str) {
    std::fs::write(
        &c.proc_cmdline,
        format!(
            "root=PARTLABEL=rootfs-{} ro k3os.slot={slot}\n",
            slot.lower()
        ),
    )
    .unwrap();
    std::fs::write(&c.boot_id_file, format!("{boot_id}\n")).unwrap();
}

/// The in-memory loader with GRUB's rules (stage tests, where the loader only matters for
/// `mark_bad`); boot-assessment tests use the real backends of [`loaders`](crate::loaders).
pub type ModelLoader = bootconfig::MemoryBootloader;

/// A node under the temp root `p`: k3OS-style dir layout (`p/system`, boot files in
/// `p/boot`), state in `p/state`, health checks in `p/health.d`, and the files the kernel
/// would provide (`cmdline`, `boot_id`, `mountinfo`, `k3os-release`) as plain files; the
/// built-in rootfs check is off (nothing is mounted).
pub fn dir_config(p: &Path, trust: &Path, bootloader: BootloaderKind) -> Config {
    Config {
        bootloader,
        tries: 3,
        layout: LayoutConfig::Dir {
            root: p.join("system"),
            boot_dir: p.join("boot"),
        },
        state_dir: p.join("state"),
        trust_dir: trust.to_path_buf(),
        health_dir: p.join("health.d"),
        airgap_dir: p.join("airgap"),
        health_timeout_secs: 5,
        download_retries: 0,
        proc_cmdline: p.join("cmdline"),
        release_file: p.join("k3os-release"),
        mountinfo: p.join("mountinfo"),
        boot_id_file: p.join("boot_id"),
        builtin_health_check: false,
        reachability: None,
        channel_root: p.join("root.json"),
        channel_metadata: Default::default(),
        report_url: None,
        report_site: None,
        payload_store_max_bytes: libupgrade::DEFAULT_PAYLOAD_STORE_MAX_BYTES,
        failure_bundle: Default::default(),
    }
}
