//! The four boot targets (architecture × bootloader variant), where their disk images and
//! releases live, and the exact QEMU command line that boots each one.
//!
//! Inputs come from the images crate's output tree (`images/out/<arch>/disk-<variant>.img`,
//! `images/out/<arch>/releases/<version>/`); the harness only ever boots a scratch copy of a
//! disk (and of the UEFI variable store), never the originals.
//!
//! Submodules: `inputs` (what a run needs before it boots: the `check_*` methods and the
//! previous release), `accel` (KVM or TCG, by a probe boot).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use crate::error::{Error, Result};

mod accel;
mod inputs;

pub use accel::Accel;
pub use inputs::{previous_release, PREVIOUS_TARGETS};

/// One bootable test disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    X86_64GrubBios,
    X86_64GrubEfi,
    X86_64Extlinux,
    Aarch64GrubEfi,
}

impl Target {
    pub const ALL: [Target; 4] = [
        Target::X86_64GrubBios,
        Target::X86_64GrubEfi,
        Target::X86_64Extlinux,
        Target::Aarch64GrubEfi,
    ];

    /// `x86_64-grub-bios`, … (the name the CLI and the test names use).
    pub fn name(self) -> &'static str {
        match self {
            Target::X86_64GrubBios => "x86_64-grub-bios",
            Target::X86_64GrubEfi => "x86_64-grub-efi",
            Target::X86_64Extlinux => "x86_64-extlinux",
            Target::Aarch64GrubEfi => "aarch64-grub-efi",
        }
    }

    pub fn arch(self) -> &'static str {
        match self {
            Target::Aarch64GrubEfi => "aarch64",
            _ => "x86_64",
        }
    }

    /// The OCI platform of the guest's images (`linux/amd64`, `linux/arm64`), as containerd's
    /// `ctr images ls` prints it.
    pub fn oci_platform(self) -> &'static str {
        match self {
            Target::Aarch64GrubEfi => "linux/arm64",
            _ => "linux/amd64",
        }
    }

    /// Disk variant name as the images crate spells it.
    pub fn variant(self) -> &'static str {
        match self {
            Target::X86_64GrubBios => "grub-bios",
            Target::X86_64GrubEfi | Target::Aarch64GrubEfi => "grub-efi",
            Target::X86_64Extlinux => "extlinux",
        }
    }

    /// `images/out/<arch>/disk-<variant>.img` under the workspace root (see [`images_dir`]).
    pub fn disk(self, root: &Path) -> PathBuf {
        images_dir(root)
            .join(self.arch())
            .join(format!("disk-{}.img", self.variant()))
    }

    /// The Kubernetes node variant's disk, `images/out/<arch>/disk-<variant>-kube.img` (slot A
    /// v1-kube; `just images-kube-<arch>`; the name is k3os-images' `spec::disk_file_name`).
    pub fn kube_disk(self, root: &Path) -> PathBuf {
        images_dir(root)
            .join(self.arch())
            .join(format!("disk-{}-kube.img", self.variant()))
    }

    /// `images/out/<arch>/releases` under the workspace root (see [`images_dir`]).
    pub fn releases(self, root: &Path) -> PathBuf {
        images_dir(root).join(self.arch()).join("releases")
    }

    /// `images/out/<arch>/keys`: the key pairs of the test channel's root version 1.
    pub fn channel_keys(self, root: &Path) -> PathBuf {
        images_dir(root).join(self.arch()).join("keys")
    }

    /// `images/out/<arch>/channel-root`: the test channel's root version 1 (`1.root.json`,
    /// `root.json`), the one every rootfs has at `/etc/k3os-ops/root.json`.
    pub fn channel_root_dir(self, root: &Path) -> PathBuf {
        images_dir(root).join(self.arch()).join("channel-root")
    }

    /// `images/out/previous/<arch>/`: the previous release's disks and v1, built by its own code
    /// (`just images-previous`, images/scripts/build-previous.sh).
    pub fn previous_dir(self, root: &Path) -> PathBuf {
        images_dir(root).join("previous").join(self.arch())
    }

    /// The previous release's disk of this target.
    pub fn previous_disk(self, root: &Path) -> PathBuf {
        self.previous_dir(root)
            .join(format!("disk-{}.img", self.variant()))
    }

    /// UEFI firmware (code, pristine variable store), if this target boots through UEFI.
    pub fn firmware(self) -> Option<(PathBuf, PathBuf)> {
        match self {
            Target::X86_64GrubEfi => Some((
                "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
                "/usr/share/OVMF/OVMF_VARS_4M.fd".into(),
            )),
            Target::Aarch64GrubEfi => Some((
                "/usr/share/AAVMF/AAVMF_CODE.fd".into(),
                "/usr/share/AAVMF/AAVMF_VARS.fd".into(),
            )),
            _ => None,
        }
    }

    pub fn qemu_binary(self) -> &'static str {
        match self {
            Target::Aarch64GrubEfi => "qemu-system-aarch64",
            _ => "qemu-system-x86_64",
        }
    }

    /// Boot attempts the bootloader gives a new slot (GRUB: the configured tries; extlinux: one).
    pub fn uses_grub(self) -> bool {
        !matches!(self, Target::X86_64Extlinux)
    }

    /// The QEMU command for one boot of `disk` (a scratch copy). `vars` is the scratch UEFI
    /// variable store (UEFI targets), `monitor` the HMP unix socket, `net` the node's network,
    /// `usb_stick` a raw image plugged in as a USB mass-storage device (xHCI). The serial
    /// console is on stdio.
    pub fn qemu_command(
        self,
        accel: Accel,
        disk: &Path,
        vars: Option<&Path>,
        monitor: &Path,
        net: Network,
        usb_stick: Option<&Path>,
    ) -> Command {
        let mut c = Command::new(self.qemu_binary());
        match self {
            Target::X86_64GrubBios | Target::X86_64Extlinux => {}
            Target::X86_64GrubEfi => {
                c.args(["-M", "q35"]);
            }
            Target::Aarch64GrubEfi => {
                c.args(["-M", "virt", "-cpu", "cortex-a57", "-smp", "2"]);
            }
        }
        c.args([
            "-m",
            "512",
            "-accel",
            accel.as_str(),
            "-display",
            "none",
            "-serial",
            "stdio",
        ]);
        c.arg("-monitor")
            .arg(format!("unix:{},server=on,wait=off", monitor.display()));
        match usb_stick {
            None => {
                c.arg("-drive")
                    .arg(format!("file={},format=raw,if=virtio", disk.display()));
            }
            Some(stick) => {
                // The node's disk must stay the firmware's first disk (SeaBIOS would otherwise
                // hand GRUB/extlinux the stick as drive 0x80): only a bootindex says so.
                c.arg("-drive").arg(format!(
                    "if=none,id=disk0,file={},format=raw",
                    disk.display()
                ));
                c.args(["-device", "virtio-blk-pci,drive=disk0,bootindex=0"]);
                c.arg("-drive").arg(format!(
                    "if=none,id=stick,file={},format=raw",
                    stick.display()
                ));
                c.args(["-device", "qemu-xhci,id=xhci"]);
                c.args(["-device", "usb-storage,bus=xhci.0,drive=stick"]);
            }
        }
        match net {
            Network::User {
                http_port,
                report_port,
            } => {
                c.arg("-nic").arg(format!(
                    "user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{http_port}-:80,\
                     guestfwd=tcp:{REPORT_GUEST_ADDR}-cmd:busybox nc 127.0.0.1 {report_port}"
                ));
            }
            Network::None => {
                c.args(["-nic", "none"]);
            }
        }
        if let (Some((code, _)), Some(vars)) = (self.firmware(), vars) {
            c.arg("-drive").arg(format!(
                "if=pflash,format=raw,readonly=on,file={}",
                code.display()
            ));
            c.arg("-drive")
                .arg(format!("if=pflash,format=raw,file={}", vars.display()));
        }
        c
    }
}

/// The guest-side address of the collector a test OS reports to once a scenario turns
/// reporting on (`report_url`, images/src/rootfs.rs `REPORT_TO`; off by default, so other
/// scenarios and the demo send nothing): QEMU forwards each connection to it to the host port
/// `report_port` of that VM alone, so concurrent VMs never share a collector. A `cmd:`
/// guestfwd (one `busybox nc` per connection) rather than a chardev one: a chardev is one
/// stream opened when QEMU starts (QEMU would refuse to start without a listening collector,
/// and a restarted collector would never be reached again). With nothing listening, `nc`
/// exits at once and the guest's POST fails in milliseconds: the report stays spooled.
pub const REPORT_GUEST_ADDR: &str = "10.0.2.100:80";

/// A node's network for one boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// QEMU user networking; host port `http_port` (on 127.0.0.1) forwards to the guest's
    /// port 80, and the guest's connections to [`REPORT_GUEST_ADDR`] go to the host's
    /// 127.0.0.1:`report_port` (a collector, or nothing listening).
    User { http_port: u16, report_port: u16 },
    /// No NIC at all: the guest has no eth0 (a site whose link is down).
    None,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Target {
    type Err = Error;
    fn from_str(s: &str) -> Result<Target> {
        crate::error::by_name("target", &Target::ALL, Target::name, s)
    }
}

/// The Kubernetes release the `kube-node-joins` scenario and the `-kube` images use.
pub const KUBE_VERSION: &str = "v1.36.2";

/// The Kubernetes binaries of the host (kube-apiserver, kubectl, …, `etcd`):
/// `$KUBEBUILDER_ASSETS`, else `<root>/.cache/kube/<KUBE_VERSION>/linux-amd64` (where
/// scripts/setup.sh installs them).
pub fn kube_assets(root: &Path) -> PathBuf {
    match std::env::var_os("KUBEBUILDER_ASSETS") {
        Some(d) => PathBuf::from(d),
        None => root
            .join(".cache/kube")
            .join(KUBE_VERSION)
            .join("linux-amd64"),
    }
}

/// Full path of `prog` on PATH.
pub fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// The images output tree: `VM_TESTS_IMAGES` (relative to the workspace root unless absolute),
/// else `<root>/images/out`.
pub fn images_dir(root: &Path) -> PathBuf {
    match std::env::var_os("VM_TESTS_IMAGES") {
        Some(d) => root.join(d),
        None => root.join("images/out"),
    }
}

/// The host's `k3os-ops` (the x86_64 musl build `just images` makes to sign the releases):
/// `VM_TESTS_TOOL`, else `x86_64-unknown-linux-musl/release/k3os-ops` under `CARGO_TARGET_DIR`
/// (relative to the workspace root unless absolute) or `<root>/target`.
pub fn host_tool(root: &Path) -> PathBuf {
    if let Some(t) = std::env::var_os("VM_TESTS_TOOL") {
        return root.join(t);
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target"));
    target_dir.join("x86_64-unknown-linux-musl/release/k3os-ops")
}

/// The workspace root: `VM_TESTS_ROOT`, else the parent of this crate's directory.
pub fn workspace_root() -> PathBuf {
    match std::env::var_os("VM_TESTS_ROOT") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("crate has a parent dir")
            .to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(c: &Command) -> Vec<String> {
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn has(args: &[String], pair: [&str; 2]) -> bool {
        args.windows(2).any(|w| w == pair)
    }

    /// Without a stick the disk and NIC are what every scenario has always booted with; an
    /// offline boot has no NIC at all, and the stick is a USB disk behind the boot disk.
    #[test]
    fn offline_boot_has_no_nic_and_the_stick_on_usb_behind_the_boot_disk() {
        let p = Path::new;
        let t = Target::X86_64Extlinux;
        let net = Network::User {
            http_port: 4321,
            report_port: 4322,
        };
        let plain = args(&t.qemu_command(Accel::Tcg, p("/d.img"), None, p("/m"), net, None));
        assert!(
            has(&plain, ["-drive", "file=/d.img,format=raw,if=virtio"]),
            "{plain:?}"
        );
        let nic = "user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:4321-:80,\
                   guestfwd=tcp:10.0.2.100:80-cmd:busybox nc 127.0.0.1 4322";
        assert!(has(&plain, ["-nic", nic]), "{plain:?}");
        assert!(!plain.iter().any(|a| a.contains("usb")), "{plain:?}");

        let stick = Some(p("/s.img"));
        let off =
            args(&t.qemu_command(Accel::Tcg, p("/d.img"), None, p("/m"), Network::None, stick));
        assert!(has(&off, ["-nic", "none"]), "{off:?}");
        assert!(!off.iter().any(|a| a.starts_with("user")), "{off:?}");
        assert!(
            has(&off, ["-drive", "if=none,id=disk0,file=/d.img,format=raw"]),
            "{off:?}"
        );
        assert!(
            has(&off, ["-device", "virtio-blk-pci,drive=disk0,bootindex=0"]),
            "{off:?}"
        );
        assert!(
            has(&off, ["-drive", "if=none,id=stick,file=/s.img,format=raw"]),
            "{off:?}"
        );
        assert!(has(&off, ["-device", "qemu-xhci,id=xhci"]), "{off:?}");
        assert!(
            has(&off, ["-device", "usb-storage,bus=xhci.0,drive=stick"]),
            "{off:?}"
        );
        assert!(!off.iter().any(|a| a.contains("if=virtio")), "{off:?}");
    }
}
