//! `k3os-ops bootloader …`: write a node's loader files from a boot config, for image builders
//! and for adopting a machine (or a node made by an earlier release), and render the boot
//! scripts that `release create --boot-config` puts into a release.
//!
//! The boot config (TOML, versioned by its `format` key, format 1; a newer one is refused
//! naming both) says what both loaders' scripts need:
//!
//! ```toml
//! format = 1
//! panic_secs = 5
//! [slots.a]
//! kernel = "/a/vmlinuz"
//! initrd = "/a/initrd"
//! cmdline = "root=PARTLABEL=rootfs-a ro console=ttyS0 quiet"
//! [slots.b]
//! kernel = "/b/vmlinuz"
//! initrd = "/b/initrd"
//! cmdline = "root=PARTLABEL=rootfs-b ro console=ttyS0 quiet"
//! [grub]
//! max_tries = 3
//! timeout_secs = 0
//! serial = true
//! [syslinux]
//! timeout_tenths = 1
//! serial = true
//! ```
//!
//! `install` keeps the boot state when the loader's files hold one (a node made by v0.1.0 is
//! migrated: its env copies are rewritten under its own script's rules, then the script is
//! replaced; see `bootconfig::GrubScript`), else writes A good and primary, B bad.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bootconfig::{render_cfg, GrubBootloader, GrubConfig};
use bootconfig::{render_conf, SyslinuxBootloader, SyslinuxConfig};
use bootconfig::{BootEntry, BootEnv, Bootloader, ScriptKind, Slot, SlotBoot};
use clap::{Args, Subcommand, ValueEnum};
use libupgrade::release::BootScript;
use libupgrade::{BootloaderKind, Config};
use serde::Deserialize;

/// The boot config format this build reads.
pub const BOOT_CONFIG_FORMAT: u32 = 1;

#[derive(Args)]
pub struct BootloaderArgs {
    #[command(subcommand)]
    cmd: BootloaderCmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoaderArg {
    Grub,
    Syslinux,
}

#[derive(Subcommand)]
enum BootloaderCmd {
    /// Write the loader's env copies, locks and last-good record (GRUB) or its conf and ADV
    /// record (syslinux), and its script, keeping the boot state if there is one.
    Install {
        /// Boot config (TOML, see `k3os-ops bootloader --help`'s module docs) to render the
        /// script from.
        #[arg(long)]
        boot_config: PathBuf,
        /// The loader's directory (holding grub.cfg, or extlinux.conf and ldlinux.sys);
        /// default: from the node config (`<boot_dir>/grub` or `<boot_dir>/syslinux`).
        #[arg(long, requires = "loader")]
        dir: Option<PathBuf>,
        /// Which loader `--dir` holds.
        #[arg(long)]
        loader: Option<LoaderArg>,
        /// Node config (default $K3OS_OPS_CONFIG or /etc/k3os-ops/config.toml); used when
        /// --dir is not given.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The `manifest.json` of the release the booted slot runs (on a node whose slot was
        /// written by an image builder that kept none): recorded so that another build of the
        /// running generation is refused from the first update on. Needs the node config.
        #[arg(long, conflicts_with = "dir")]
        running_manifest: Option<PathBuf>,
    },
    /// Print a loader's script rendered from a boot config.
    Render {
        #[arg(long)]
        boot_config: PathBuf,
        #[arg(long)]
        loader: LoaderArg,
    },
}

/// The boot config file (see the module docs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootConfig {
    pub format: u32,
    pub panic_secs: u32,
    pub slots: SlotEntries,
    pub grub: GrubSection,
    pub syslinux: SyslinuxSection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotEntries {
    pub a: BootEntry,
    pub b: BootEntry,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrubSection {
    pub max_tries: u8,
    pub timeout_secs: u32,
    pub serial: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyslinuxSection {
    pub timeout_tenths: u32,
    pub serial: bool,
}

impl BootConfig {
    pub fn load(path: &Path) -> anyhow::Result<BootConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading boot config {}", path.display()))?;
        BootConfig::parse(&text).with_context(|| format!("boot config {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<BootConfig> {
        #[derive(Deserialize)]
        struct Head {
            format: Option<u32>,
        }
        let head: Head = toml::from_str(text).context("not valid TOML")?;
        match head.format {
            None => bail!("no `format` key (expected format = {BOOT_CONFIG_FORMAT})"),
            Some(f) if f > BOOT_CONFIG_FORMAT => bail!(
                "format {f} is newer than this build of k3os-ops reads (format {BOOT_CONFIG_FORMAT})"
            ),
            Some(f) if f != BOOT_CONFIG_FORMAT => bail!("format {f} does not exist"),
            Some(_) => {}
        }
        let c: BootConfig = toml::from_str(text)?;
        if c.grub.max_tries == 0 || c.grub.max_tries > libupgrade::MAX_TRIES {
            bail!(
                "grub.max_tries {} is not within 1..={}",
                c.grub.max_tries,
                libupgrade::MAX_TRIES
            );
        }
        Ok(c)
    }

    fn entries(&self) -> [BootEntry; 2] {
        [self.slots.a.clone(), self.slots.b.clone()]
    }

    /// `grub.cfg` for this config.
    pub fn grub_cfg(&self) -> String {
        render_cfg(&GrubConfig {
            entries: self.entries(),
            max_tries: self.grub.max_tries,
            timeout_secs: self.grub.timeout_secs,
            serial: self.grub.serial,
            panic_secs: self.panic_secs,
        })
    }

    /// `extlinux.conf` for this config (`DEFAULT a`; an install keeps the node's state).
    pub fn extlinux_conf(&self) -> String {
        render_conf(&SyslinuxConfig {
            entries: self.entries(),
            primary: Slot::A,
            timeout_tenths: self.syslinux.timeout_tenths,
            serial: self.syslinux.serial,
            panic_secs: self.panic_secs,
        })
    }

    /// Both scripts, as a release carries them.
    pub fn scripts(&self) -> Vec<BootScript> {
        vec![
            BootScript {
                kind: ScriptKind::GrubCfg,
                text: self.grub_cfg(),
            },
            BootScript {
                kind: ScriptKind::ExtlinuxConf,
                text: self.extlinux_conf(),
            },
        ]
    }
}

/// What `install` did, for the one line it prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// Nothing readable was there: A good and primary, B bad, and the script.
    Fresh,
    /// The state was kept; the script was replaced (`from`: the version there before).
    Kept { from: Option<u32>, changed: bool },
}

/// Write the loader files in `dir` (see `BootloaderCmd::Install`).
pub fn install(kind: LoaderArg, dir: &Path, boot: &BootConfig) -> anyhow::Result<Installed> {
    let fresh = BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    };
    match kind {
        LoaderArg::Grub => {
            let g = GrubBootloader::new(dir, boot.grub.max_tries);
            let text = boot.grub_cfg();
            let from = g.script()?.map(|s| s.number());
            if g.read().is_ok() {
                let changed = g.install_script(&text)?;
                Ok(Installed::Kept { from, changed })
            } else {
                g.install_fresh(&fresh, &text)?;
                Ok(Installed::Fresh)
            }
        }
        LoaderArg::Syslinux => {
            let s = SyslinuxBootloader::new(dir);
            let text = boot.extlinux_conf();
            let from = s.script()?.installed;
            if from.is_some() && s.read().is_ok() {
                let changed = s.install_script(&text)?;
                return Ok(Installed::Kept { from, changed });
            }
            if !s.ldlinux_path().is_file() {
                bail!(
                    "{} is missing: run `extlinux --install {}` first (it writes the loader and the ADV this command sets)",
                    s.ldlinux_path().display(),
                    dir.display()
                );
            }
            bootconfig::write_atomic(s.conf_path(), text.as_bytes())?;
            s.install(&fresh)?;
            Ok(Installed::Fresh)
        }
    }
}

pub fn run(args: BootloaderArgs) -> anyhow::Result<()> {
    match args.cmd {
        BootloaderCmd::Render {
            boot_config,
            loader,
        } => {
            let b = BootConfig::load(&boot_config)?;
            print!(
                "{}",
                match loader {
                    LoaderArg::Grub => b.grub_cfg(),
                    LoaderArg::Syslinux => b.extlinux_conf(),
                }
            );
            Ok(())
        }
        BootloaderCmd::Install {
            boot_config,
            dir,
            loader,
            config,
            running_manifest,
        } => {
            let b = BootConfig::load(&boot_config)?;
            let node_config = || match &config {
                Some(p) => Config::load(p),
                None => Config::from_env(),
            };
            if let Some(path) = &running_manifest {
                let bytes =
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let u = libupgrade::Updater::open(node_config()?)?;
                let (slot, sha) = u.record_running_manifest(&bytes).with_context(|| {
                    format!("recording {} as the running build", path.display())
                })?;
                println!("slot {slot}: recorded the running build (manifest sha256 {sha})");
            }
            let (kind, dir) = match (dir, loader) {
                (Some(d), Some(l)) => (l, d),
                _ => {
                    let cfg = node_config()?;
                    let boot_dir = cfg.layout.boot_dir();
                    match cfg.bootloader {
                        BootloaderKind::Grub => (LoaderArg::Grub, boot_dir.join("grub")),
                        BootloaderKind::Syslinux => {
                            (LoaderArg::Syslinux, boot_dir.join("syslinux"))
                        }
                    }
                }
            };
            let what = install(kind, &dir, &b)
                .with_context(|| format!("installing the loader files in {}", dir.display()))?;
            let name = match kind {
                LoaderArg::Grub => {
                    "grub.cfg (GRUB script 2), env copies, locks and last-good record"
                }
                LoaderArg::Syslinux => "extlinux.conf and the ADV record",
            };
            match what {
                Installed::Fresh => {
                    println!("{}: wrote {name}; slot A good and primary, slot B bad", dir.display())
                }
                Installed::Kept { changed: false, .. } => {
                    println!("{}: already installed; nothing written", dir.display())
                }
                Installed::Kept { from, .. } => println!(
                    "{}: kept the boot state and installed {name} (the script there was version {})",
                    dir.display(),
                    from.map_or("none".into(), |v| v.to_string())
                ),
            }
            Ok(())
        }
    }
}
