//! The extracted Debian packages an architecture's images are built from (downloaded by
//! `images/scripts/fetch-debs.sh` into `.cache/debs/<arch>/root`).

use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::target::Target;

/// Paths inside one extracted package tree.
#[derive(Debug, Clone)]
pub struct Debs {
    pub root: PathBuf,
    /// Kernel release, e.g. `6.1.0-57-amd64`.
    pub kver: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<kver>` (with `modules.dep` from depmod).
    pub modules_dir: PathBuf,
    pub busybox: PathBuf,
    /// GRUB's arm64-efi module directory (aarch64 only; x86 uses the host's grub-*-bin).
    pub grub_arm64_efi: Option<PathBuf>,
}

impl Debs {
    /// Find the pieces in `root`; every missing one is named with what was expected.
    pub fn locate(root: &Path, target: Target) -> Result<Debs> {
        let missing = |p: &Path, what: &str| Error::Input {
            path: p.to_path_buf(),
            what: format!("{what} (run images/scripts/fetch-debs.sh {})", target.arch),
        };
        let mods = root.join("lib/modules");
        let suffix = format!("-{}", target.debian());
        let mut kvers: Vec<String> = std::fs::read_dir(&mods)
            .map_err(|_| missing(&mods, "no extracted kernel modules"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(&suffix))
            .collect();
        kvers.sort();
        let kver = match kvers.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(missing(
                    &mods,
                    &format!("no kernel release ending in {suffix}"),
                ))
            }
            many => {
                return Err(Error::Input {
                    path: mods,
                    what: format!(
                        "more than one kernel release extracted: {}",
                        many.join(", ")
                    ),
                })
            }
        };
        let vmlinuz = root.join(format!("boot/vmlinuz-{kver}"));
        let modules_dir = mods.join(&kver);
        let busybox = root.join("bin/busybox");
        for (p, what) in [
            (&vmlinuz, "no kernel image"),
            (
                &modules_dir.join("modules.dep"),
                "no modules.dep (depmod not run)",
            ),
            (&busybox, "no static busybox (busybox-static)"),
        ] {
            if !p.is_file() {
                return Err(missing(p, what));
            }
        }
        let grub_arm64_efi = match target.arch {
            libupgrade::manifest::Arch::Aarch64 => {
                let d = root.join("usr/lib/grub/arm64-efi");
                if !d.join("kernel.img").is_file() {
                    return Err(missing(
                        &d,
                        "no GRUB arm64-efi modules (grub-efi-arm64-bin)",
                    ));
                }
                Some(d)
            }
            libupgrade::manifest::Arch::X86_64 => None,
        };
        Ok(Debs {
            root: root.to_path_buf(),
            kver,
            vmlinuz,
            modules_dir,
            busybox,
            grub_arm64_efi,
        })
    }

    /// Applet paths busybox installs (`bin/sh`, `sbin/reboot`, ...), asked from the binary itself.
    pub fn busybox_applets(&self, target: Target) -> Result<Vec<String>> {
        let out = match target.host_runner() {
            None => crate::run::Cmd::new(&self.busybox)
                .arg("--list-full")
                .output()?,
            Some(qemu) => crate::run::Cmd::new(qemu)
                .arg(&self.busybox)
                .arg("--list-full")
                .output()?,
        };
        let applets: Vec<String> = out
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        if !applets.iter().any(|a| a == "bin/sh") {
            return Err(Error::Input {
                path: self.busybox.clone(),
                what: format!(
                    "`busybox --list-full` lists no bin/sh ({} applets)",
                    applets.len()
                ),
            });
        }
        Ok(applets)
    }
}

/// Read a whole file with context.
pub(crate) fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).ctx("read", p)
}
