//! A node simulated under a temp root, for tests that drive whole update cycles without a VM:
//! the k3OS dir layout of [`crate::dir_config`], the in-memory loader with GRUB's rules
//! (`MemoryBootloader`: a trial costs a try at power-on, exhausted tries fall back), and the
//! kernel's files as plain files. A power cycle goes through the loader and writes the new
//! command line and boot id; [`SimNode::init_confirm`] is what init runs first on every boot.

use std::path::Path;

use bootconfig::MemoryBootloader;
use bootconfig::Slot;
use libupgrade::layout::DirLayout;
use libupgrade::{BootloaderKind, Config, LayoutConfig};

/// One simulated node, booted on slot A running `VERSION=v1` of `generation`.
pub struct SimNode {
    dir: tempfile::TempDir,
    pub cfg: Config,
    pub loader: MemoryBootloader,
    boots: u32,
}

impl SimNode {
    /// A fresh node trusting the keys in `trust`, whose trials get `tries` boots; powered on
    /// into A (v1, `generation`) and confirmed like init does.
    pub fn new(trust: &Path, tries: u8, generation: u64) -> SimNode {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let mut cfg = crate::dir_config(p, trust, BootloaderKind::Grub);
        cfg.tries = tries;
        for d in ["system", "boot", "health.d"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        std::fs::write(
            &cfg.release_file,
            format!("VERSION=v1\nGENERATION={generation}\n"),
        )
        .unwrap();
        let loader = MemoryBootloader::new(tries);
        let mut node = SimNode {
            dir,
            cfg,
            loader,
            boots: 0,
        };
        node.boot_into(Slot::A);
        node.init_confirm_good("first boot on v1");
        node
    }

    /// The temp root.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The kernel booted `slot`: new command line and boot id.
    pub fn boot_into(&mut self, slot: Slot) {
        self.boots += 1;
        crate::boot_as(&self.cfg, slot, &format!("boot-{}", self.boots));
    }

    /// Power-cycle through the loader (a trial costs a try); returns the slot booted.
    pub fn power_cycle(&mut self) -> Slot {
        let s = self.loader.power_on();
        self.boot_into(s);
        s
    }

    /// An updater over this node's layout and loader.
    pub fn updater(&self) -> libupgrade::Updater {
        self.updater_with(|_| {})
    }

    /// The same, its configuration changed by `edit` first (e.g. a `report_url`).
    pub fn updater_with(&self, edit: impl FnOnce(&mut libupgrade::Config)) -> libupgrade::Updater {
        let LayoutConfig::Dir { root, boot_dir } = &self.cfg.layout else {
            unreachable!("SimNode uses the dir layout")
        };
        let mut cfg = self.cfg.clone();
        edit(&mut cfg);
        libupgrade::Updater::with_parts(
            cfg,
            Box::new(DirLayout::new(root, boot_dir)),
            Box::new(self.loader.clone()),
        )
    }

    /// What init runs first thing on every boot: `k3os-ops slot confirm`; this boot's
    /// report, whatever its outcome.
    pub fn init_confirm(&self) -> libupgrade::Result<libupgrade::ConfirmReport> {
        self.updater().confirm()
    }

    /// [`Self::init_confirm`] on a boot that must end on a good slot (init's exit 0): the
    /// report, or a panic naming `what` and the outcome.
    pub fn init_confirm_good(&self, what: &str) -> libupgrade::ConfirmReport {
        self.init_confirm().expect_good(what)
    }
}

/// A boot assessment that must end on a good slot (blessed now or before).
pub trait ExpectGood {
    /// The report, or a panic naming `what` and the error or the verdict.
    fn expect_good(self, what: &str) -> libupgrade::ConfirmReport;
}

impl ExpectGood for libupgrade::Result<libupgrade::ConfirmReport> {
    fn expect_good(self, what: &str) -> libupgrade::ConfirmReport {
        let r = self.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(r.is_good(), "{what}: not good: {:?}", r.verdict);
        r
    }
}
