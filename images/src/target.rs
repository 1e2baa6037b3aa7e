//! Per-architecture facts: Debian and Rust names, serial console, EFI names, which kernel
//! modules the initrd loads.

use libupgrade::manifest::Arch;

/// Everything that differs between the x86_64 and aarch64 images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub arch: Arch,
}

impl Target {
    pub fn new(arch: Arch) -> Target {
        Target { arch }
    }

    /// Debian architecture name (`amd64`, `arm64`).
    pub fn debian(self) -> &'static str {
        match self.arch {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// Rust target triple of the static k3os-ops shipped in the rootfs.
    pub fn rust_triple(self) -> &'static str {
        match self.arch {
            Arch::X86_64 => "x86_64-unknown-linux-musl",
            Arch::Aarch64 => "aarch64-unknown-linux-musl",
        }
    }

    /// Serial console device name (QEMU `pc`/`q35`: 16550 ttyS0; `virt`: PL011 ttyAMA0).
    pub fn console(self) -> &'static str {
        match self.arch {
            Arch::X86_64 => "ttyS0",
            Arch::Aarch64 => "ttyAMA0",
        }
    }

    /// GRUB platform directory name of the EFI build.
    pub fn grub_efi_platform(self) -> &'static str {
        match self.arch {
            Arch::X86_64 => "x86_64-efi",
            Arch::Aarch64 => "arm64-efi",
        }
    }

    /// Removable-media file name the firmware boots from `EFI/BOOT/`.
    pub fn efi_boot_file(self) -> &'static str {
        match self.arch {
            Arch::X86_64 => "BOOTX64.EFI",
            Arch::Aarch64 => "BOOTAA64.EFI",
        }
    }

    /// Modules the initrd loads only when the command line names a dm-verity root
    /// (`k3os.verity=`), with their dependencies from modules.dep (Debian 6.1: dm-mod,
    /// dm-bufio, reed_solomon; on arm64 also dax), after [`Target::initrd_modules`].
    pub fn initrd_verity_modules(self) -> &'static [&'static str] {
        &["dm-verity"]
    }

    /// pstore backends the initrd loads (with their dependencies, after
    /// [`Target::initrd_modules`]); a failure to load is printed and tolerated. `efi_pstore` keeps a panic's kernel log in UEFI
    /// variables (OVMF, AAVMF: `pstore/dmesg-efi-*` at the next boot); on BIOS it registers
    /// nothing. Both `/init`s load it: the panicking one so that its panic is written, the
    /// normal one so that the next good boot reads the record back (the rootfs has no modules).
    /// Debian 6.1 builds it enabled (`CONFIG_EFI_VARS_PSTORE_DEFAULT_DISABLE` unset).
    pub fn initrd_pstore_modules(self) -> &'static [&'static str] {
        &["efi_pstore"]
    }

    /// Modules the initrd loads (with their dependencies, resolved from modules.dep): the
    /// virtio PCI transport, disk and NIC; squashfs for the root; ext4 (and the crc32c
    /// implementation its checksums request) for /boot and the state partition; the xHCI USB
    /// host controller, USB mass storage and SCSI disks (and the CRC implementations sd_mod's
    /// integrity code requests) for a USB stick holding an offline bundle (vm-tests
    /// `bundle-offline`). The rootfs holds no modules: what a release can use is loaded here.
    pub fn initrd_modules(self) -> &'static [&'static str] {
        &[
            "crc32c_generic",
            "virtio_pci",
            "virtio_blk",
            "virtio_net",
            "squashfs",
            "ext4",
            "crct10dif_generic",
            "crc64_rocksoft_generic",
            "xhci_pci",
            "usb_storage",
            "sd_mod",
        ]
    }

    /// How to execute a binary of this architecture on the build host (for `busybox
    /// --list-full`): directly on x86_64, through qemu-user on aarch64.
    pub fn host_runner(self) -> Option<&'static str> {
        match self.arch {
            Arch::X86_64 if cfg!(target_arch = "x86_64") => None,
            Arch::Aarch64 if cfg!(target_arch = "aarch64") => None,
            Arch::X86_64 => Some("qemu-x86_64-static"),
            Arch::Aarch64 => Some("qemu-aarch64-static"),
        }
    }
}
