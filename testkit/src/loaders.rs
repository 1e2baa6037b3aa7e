//! The real bootloader backends on temp dirs, with a power-on that does what the loader does at
//! boot: GRUB's script (`simulate_boot`, held to the real GRUB in bootconfig's grub_real tests)
//! counts a try down and writes it back; syslinux consumes the ADV boot-once record. The
//! library is tested against these, not against a fake with different rules.

use std::path::{Path, PathBuf};

use bootconfig::{render_cfg, GrubBootloader, GrubConfig};
use bootconfig::{render_conf, Adv, SyslinuxBootloader, SyslinuxConfig, ADV_BOOTONCE};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};

/// Which backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Grub,
    Syslinux,
}

pub const KINDS: [Kind; 2] = [Kind::Grub, Kind::Syslinux];

/// A backend installed under one directory: A good and primary, B bad.
#[derive(Debug, Clone)]
pub struct RealLoader {
    pub kind: Kind,
    pub dir: PathBuf,
    /// Tries the GRUB script counts (syslinux: 1).
    pub tries: u8,
}

fn entry(s: &str) -> BootEntry {
    BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: "console=ttyS0".into(),
    }
}

/// Where the files of a node made by v0.1.0 are kept (written by v0.1.0's own code).
pub fn v010_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bootconfig/tests/fixtures/v0.1.0")
}

fn grub_cfg(tries: u8) -> GrubConfig {
    GrubConfig {
        entries: [entry("a"), entry("b")],
        max_tries: tries,
        timeout_secs: 0,
        serial: false,
        panic_secs: 5,
    }
}

fn syslinux_cfg() -> SyslinuxConfig {
    SyslinuxConfig {
        entries: [entry("a"), entry("b")],
        primary: Slot::A,
        timeout_tenths: 0,
        serial: false,
        panic_secs: 5,
    }
}

impl RealLoader {
    /// Today's boot script for this loader (what `release create` would carry).
    pub fn script_text(kind: Kind, tries: u8) -> (bootconfig::ScriptKind, String) {
        match kind {
            Kind::Grub => (
                bootconfig::ScriptKind::GrubCfg,
                render_cfg(&grub_cfg(tries)),
            ),
            Kind::Syslinux => (
                bootconfig::ScriptKind::ExtlinuxConf,
                render_conf(&syslinux_cfg()),
            ),
        }
    }

    /// The loader files of a freshly installed v0.1.0 node (A good, B bad): its script
    /// (`grub.cfg` without a version marker, `extlinux.conf`) and, for GRUB, its env copies.
    pub fn install_v010(kind: Kind, dir: &Path) -> RealLoader {
        std::fs::create_dir_all(dir.join("k3os")).unwrap();
        let fx = v010_fixtures();
        match kind {
            Kind::Grub => {
                std::fs::copy(fx.join("grub.cfg"), dir.join("grub.cfg")).unwrap();
                for f in ["env1", "env2", "lock1", "lock2"] {
                    std::fs::copy(fx.join("installed/k3os").join(f), dir.join("k3os").join(f))
                        .unwrap();
                }
            }
            Kind::Syslinux => {
                std::fs::copy(fx.join("extlinux.conf"), dir.join("extlinux.conf")).unwrap();
                let mut ld = vec![0xeb; 4096];
                ld.extend_from_slice(&Adv::empty().0);
                std::fs::write(dir.join("ldlinux.sys"), ld).unwrap();
            }
        }
        RealLoader {
            kind,
            dir: dir.to_path_buf(),
            tries: if kind == Kind::Syslinux { 1 } else { 3 },
        }
    }

    pub fn install(kind: Kind, dir: &Path, tries: u8) -> RealLoader {
        std::fs::create_dir_all(dir).unwrap();
        let initial = BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad,
        };
        let l = RealLoader {
            kind,
            dir: dir.to_path_buf(),
            tries: if kind == Kind::Syslinux { 1 } else { tries },
        };
        match kind {
            Kind::Grub => {
                std::fs::write(dir.join("grub.cfg"), render_cfg(&grub_cfg(tries))).unwrap();
                GrubBootloader::new(dir, tries).install(&initial).unwrap();
            }
            Kind::Syslinux => {
                std::fs::write(dir.join("extlinux.conf"), render_conf(&syslinux_cfg())).unwrap();
                let mut ld = vec![0xeb; 4096];
                ld.extend_from_slice(&Adv::empty().0);
                std::fs::write(dir.join("ldlinux.sys"), ld).unwrap();
                SyslinuxBootloader::new(dir).install(&initial).unwrap();
            }
        }
        l
    }

    pub fn backend(&self) -> Box<dyn Bootloader> {
        match self.kind {
            Kind::Grub => Box::new(GrubBootloader::new(&self.dir, self.tries)),
            Kind::Syslinux => Box::new(SyslinuxBootloader::new(&self.dir)),
        }
    }

    /// Power on: the slot the loader boots, after doing its own writes.
    pub fn power_on(&self) -> Slot {
        match self.kind {
            Kind::Grub => {
                let sim = GrubBootloader::new(&self.dir, self.tries)
                    .simulate_boot()
                    .unwrap();
                for op in &sim.countdown {
                    op.apply().unwrap();
                }
                sim.choice
            }
            Kind::Syslinux => {
                let view = SyslinuxBootloader::new(&self.dir).view().unwrap();
                if view.once.is_some() {
                    // ldlinux clears the boot-once record before it boots that label.
                    let p = self.dir.join("ldlinux.sys");
                    let mut bytes = std::fs::read(&p).unwrap();
                    let off = bytes.len() - 2 * bootconfig::ADV_SIZE;
                    let raw: [u8; 2 * bootconfig::ADV_SIZE] = bytes[off..].try_into().unwrap();
                    let (mut adv, _) = Adv::load(&raw);
                    adv.set(ADV_BOOTONCE, b"").unwrap();
                    bytes[off..].copy_from_slice(&adv.0);
                    std::fs::write(&p, bytes).unwrap();
                }
                view.choice
            }
        }
    }

    /// Every file of the loader, to put back later (a write that never happened).
    pub fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        out
    }

    pub fn restore(&self, snap: &[(PathBuf, Vec<u8>)]) {
        for (p, b) in snap {
            std::fs::write(p, b).unwrap();
        }
    }
}
