//! What is built, as plain data at the bottom of the crate: the test releases' names and
//! failure variants ([`ReleaseSpec`], [`Variant`]) and a built release's files ([`Release`]),
//! the disks' boot variants and partition sizes ([`BootVariant`], [`Sizes`]), what goes on one
//! disk ([`DiskSpec`]), and the constants several builders share ([`GRUB_TRIES`], [`MIB`]).
//! Every builder reads these; none of them is read back by this module.

use std::path::{Path, PathBuf};

use crate::debs::Debs;
use crate::target::Target;

pub const MIB: u64 = 1024 * 1024;

/// Tries GRUB gives a newly activated slot on these test nodes (the loader configuration and
/// the rootfs's node configuration agree on it).
pub const GRUB_TRIES: u8 = 3;

/// How a test release misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Normal,
    /// The initrd's /init exits: kernel panic, `panic=5` reboots into the loader.
    Panic,
    /// The rootfs never confirms (prints `K3OS-NOCONFIRM`); the harness resets the VM.
    NoConfirm,
    /// A health check exits 1, so `k3os-ops slot confirm` fails and rolls back.
    BadHealth,
    /// Init never brings the network up (a release whose network configuration is broken):
    /// the reachability check after its trial boot fails and the node rolls back.
    NoNet,
    /// Signed with `release create --verity`: a node stages its dm-verity tree and FEC, and
    /// the slot boots with its root opened through dm-verity (scenarios `verity-fec`,
    /// `verity-fallback`).
    Verity,
    /// A real Kubernetes node (`src/kube.rs`): containerd, runc, the CNI plugins and the
    /// kubelet, started from a run-time seed disk; its image archive holds runnable images
    /// (the pause image among them). Never in [`STANDARD_RELEASES`]: built by `just
    /// images-kube-<arch>` onto its own disk (`disk-grub-efi-kube.img`).
    Kube,
    /// [`Variant::Kube`] whose kubelet config does not load: the kubelet exits at start and
    /// the Node is never Ready, so the agent's trial boot is never blessed (scenario
    /// `site-rollback`).
    KubeNotReady,
}

impl Variant {
    pub fn suffix(self) -> &'static str {
        match self {
            Variant::Normal => "",
            Variant::Panic => "-panic",
            Variant::NoConfirm => "-noconfirm",
            Variant::BadHealth => "-badhealth",
            Variant::NoNet => "-nonet",
            Variant::Verity => "-verity",
            Variant::Kube => "-kube",
            Variant::KubeNotReady => "-kubenotready",
        }
    }

    /// A Kubernetes node release (its root carries `src/kube.rs`'s additions).
    pub fn is_kube(self) -> bool {
        matches!(self, Variant::Kube | Variant::KubeNotReady)
    }
}

/// One release to build: `v<generation>[-<variant>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseSpec {
    pub version: String,
    pub generation: u64,
    pub variant: Variant,
}

impl ReleaseSpec {
    /// Parse `v2`, `v2-panic`, `v2-noconfirm`, `v2-badhealth`, `v2-nonet`, `v2-verity`,
    /// `v2-kube`, `v2-kubenotready`.
    pub fn parse(version: &str) -> std::result::Result<ReleaseSpec, String> {
        let (base, variant) = match version.split_once('-') {
            None => (version, Variant::Normal),
            Some((b, "panic")) => (b, Variant::Panic),
            Some((b, "noconfirm")) => (b, Variant::NoConfirm),
            Some((b, "badhealth")) => (b, Variant::BadHealth),
            Some((b, "nonet")) => (b, Variant::NoNet),
            Some((b, "verity")) => (b, Variant::Verity),
            Some((b, "kube")) => (b, Variant::Kube),
            Some((b, "kubenotready")) => (b, Variant::KubeNotReady),
            Some((_, v)) => {
                let known = "panic, noconfirm, badhealth, nonet, verity, kube, kubenotready";
                return Err(format!(
                    "release '{version}': unknown variant '{v}' ({known})"
                ));
            }
        };
        let generation = base
            .strip_prefix('v')
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                format!("release '{version}': expected v<generation>[-variant], e.g. v2-panic")
            })?;
        Ok(ReleaseSpec {
            version: version.to_string(),
            generation,
            variant,
        })
    }

    /// The release this one carries per-pair patches from (`release create --patch-from`):
    /// the standard v2 from v1, so a node running v1 upgrades to it through patches.
    pub fn patch_from(&self) -> Option<&'static str> {
        (self.version == "v2").then_some("v1")
    }

    /// The releases the test disks and the VM tests use, parsed from [`STANDARD_RELEASES`].
    pub fn standard() -> Vec<ReleaseSpec> {
        STANDARD_RELEASES
            .iter()
            .map(|v| ReleaseSpec::parse(v).expect("standard release names parse"))
            .collect()
    }
}

/// The names of the releases the test disks and the VM tests use: the one list that
/// `k3os-images` builds ([`ReleaseSpec::standard`]) and `vm-tests` requires before a scenario
/// boots. `v4-panic`: the scenario `upgrade-from-previous` ends on v3 and needs a failing
/// release of a higher generation; `v2-nonet`: the scenario `reachability`; `v2-verity`: the
/// dm-verity scenarios.
pub const STANDARD_RELEASES: &[&str] = &[
    "v1",
    "v2",
    "v3",
    "v2-panic",
    "v2-noconfirm",
    "v2-badhealth",
    "v4-panic",
    "v2-nonet",
    "v2-verity",
];

/// A built (and signed) release directory.
#[derive(Debug, Clone)]
pub struct Release {
    pub spec: ReleaseSpec,
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// How the disk boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootVariant {
    /// Legacy BIOS, GRUB core.img in `bios-boot`.
    GrubBios,
    /// UEFI (OVMF / AAVMF), GRUB as the removable-media loader on the ESP.
    GrubEfi,
    /// Legacy BIOS, gptmbr.bin + extlinux on the legacy-bootable `boot` partition.
    Extlinux,
    /// UEFI with Secure Boot (x86_64): a signed GRUB carrying its chooser script chainloads
    /// each slot's signed UKI (docs/design/trust.md). Built only when asked for (`--boot
    /// grub-efi-sb --secure-boot`), never by default.
    GrubEfiSb,
}

impl BootVariant {
    pub const ALL: [BootVariant; 4] = [
        BootVariant::GrubBios,
        BootVariant::GrubEfi,
        BootVariant::Extlinux,
        BootVariant::GrubEfiSb,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BootVariant::GrubBios => "grub-bios",
            BootVariant::GrubEfi => "grub-efi",
            BootVariant::Extlinux => "extlinux",
            BootVariant::GrubEfiSb => "grub-efi-sb",
        }
    }

    pub fn parse(s: &str) -> std::result::Result<BootVariant, String> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!("unknown boot variant '{s}': expected grub-bios, grub-efi, extlinux or grub-efi-sb")
            })
    }

    /// Variants built by default for `target` (arm64 has no legacy BIOS; the Secure Boot
    /// variant only when asked for).
    pub fn for_target(target: Target) -> Vec<BootVariant> {
        match target.arch {
            libupgrade::manifest::Arch::X86_64 => vec![
                BootVariant::GrubBios,
                BootVariant::GrubEfi,
                BootVariant::Extlinux,
            ],
            libupgrade::manifest::Arch::Aarch64 => vec![BootVariant::GrubEfi],
        }
    }

    pub fn is_grub(self) -> bool {
        self != BootVariant::Extlinux
    }
}

/// Partition sizes; `rootfs` is the size of each slot partition.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub bios_boot: u64,
    pub esp: u64,
    pub boot: u64,
    pub rootfs: u64,
    pub state: u64,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            bios_boot: MIB,
            esp: 32 * MIB,
            boot: 128 * MIB,
            rootfs: 64 * MIB,
            state: 64 * MIB,
        }
    }
}

impl Sizes {
    /// Default sizes, with the slot partitions grown (in whole MiB, with a quarter spare) when
    /// the largest rootfs would not fit comfortably.
    pub fn for_largest_rootfs(largest: u64) -> Sizes {
        let mut s = Sizes::default();
        let want = (largest + largest / 4).div_ceil(MIB) * MIB;
        s.rootfs = s.rootfs.max(want);
        s
    }
}

/// The disk image's file name: `disk-<boot variant>.img`, with the slot-A release's variant
/// suffix for a Kubernetes node (`disk-grub-efi-kube.img`), so it never replaces a plain disk.
pub fn disk_file_name(variant: BootVariant, slot_a: &ReleaseSpec) -> String {
    let suffix = match slot_a.variant {
        Variant::Kube => Variant::Kube.suffix(),
        _ => "",
    };
    format!("disk-{}{suffix}.img", variant.name())
}

/// What a `grub-efi-sb` disk needs besides the release: the Secure Boot key (PEM key and
/// certificate) its GRUB is signed with, and slot A's signed UKI.
#[derive(Debug, Clone, Copy)]
pub struct SignedBoot<'a> {
    pub key: &'a Path,
    pub cert: &'a Path,
    pub slot_a_uki: &'a Path,
}

/// The file name of a slot's signed UKI in its directory of the `boot` partition
/// (`/a/k3os.efi`, `/b/k3os.efi`) on a `grub-efi-sb` disk.
pub const UKI_FILE: &str = "k3os.efi";

/// What goes on one disk.
#[derive(Clone, Copy)]
pub struct DiskSpec<'a> {
    pub target: Target,
    pub variant: BootVariant,
    pub sizes: Sizes,
    /// Installed in slot A; slot B is empty.
    pub slot_a: &'a Release,
    pub debs: &'a Debs,
    /// Host `k3os-ops`: writes the loader files (`bootloader install`).
    pub tool: &'a Path,
    /// The signed path's inputs (`grub-efi-sb` only; required there).
    pub signed: Option<SignedBoot<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_names() {
        let s = ReleaseSpec::parse("v2-noconfirm").unwrap();
        assert_eq!((s.generation, s.variant), (2, Variant::NoConfirm));
        assert_eq!(ReleaseSpec::parse("v3").unwrap().variant, Variant::Normal);
        let s = ReleaseSpec::parse("v2-nonet").unwrap();
        assert_eq!(
            (s.generation, s.variant, s.variant.suffix()),
            (2, Variant::NoNet, "-nonet")
        );
        let s = ReleaseSpec::parse("v2-verity").unwrap();
        assert_eq!(
            (s.generation, s.variant, s.variant.suffix()),
            (2, Variant::Verity, "-verity")
        );
        let s = ReleaseSpec::parse("v1-kube").unwrap();
        assert_eq!((s.generation, s.variant.suffix()), (1, "-kube"));
        assert_eq!(
            disk_file_name(BootVariant::GrubEfi, &s),
            "disk-grub-efi-kube.img"
        );
        let s = ReleaseSpec::parse("v2-kubenotready").unwrap();
        assert_eq!((s.generation, s.variant.suffix()), (2, "-kubenotready"));
        assert!(s.variant.is_kube() && !Variant::Normal.is_kube());
        let v1 = ReleaseSpec::parse("v1").unwrap();
        assert_eq!(
            disk_file_name(BootVariant::GrubBios, &v1),
            "disk-grub-bios.img"
        );
        assert!(ReleaseSpec::parse("v2-weird")
            .unwrap_err()
            .contains("weird"));
        assert!(ReleaseSpec::parse("x2").is_err());
        assert!(ReleaseSpec::parse("v0").is_err());
        let std: Vec<String> = ReleaseSpec::standard()
            .into_iter()
            .map(|s| s.version)
            .collect();
        assert_eq!(
            std,
            [
                "v1",
                "v2",
                "v3",
                "v2-panic",
                "v2-noconfirm",
                "v2-badhealth",
                "v4-panic",
                "v2-nonet",
                "v2-verity"
            ]
        );
    }
}
