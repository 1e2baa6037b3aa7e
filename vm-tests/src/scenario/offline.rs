//! `bundle-offline`: a site without a network upgrades from a USB stick. On the host, the host
//! `k3os-ops release bundle` writes v2 into one bundle file, and `mkfs.ext4 -d` puts it on an
//! ext4 stick image (no mount). The node has no NIC at any boot and the stick plugged in (QEMU
//! xHCI + usb-storage; the initrd loads xhci_pci, usb_storage and sd_mod): v1 mounts the stick
//! read-only, `k3os-ops upgrade --bundle` stages and activates v2 from it, and v2 boots, is
//! blessed and is good, still without a network.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use bootconfig::Slot;
use libupgrade::state::SlotState;

use super::steps::{CMD, DOWNLOAD};
use super::Scenario;
use crate::error::{Error, Result};
use crate::target::host_tool;
use crate::vm::Vm;

/// Label of the stick's filesystem.
const STICK_LABEL: &str = "K3OS-BUNDLE";
/// Where the guest mounts the stick (an empty directory of the read-only rootfs).
const GUEST_MOUNT: &str = "/mnt";
/// Seconds the guest waits for the stick's disk to appear (usb-storage settles for 1 s after
/// the device is found; enumeration under TCG takes a few more).
const STICK_WAIT_SECS: u32 = 60;

/// Size of an ext4 image holding one file of `file_len` bytes: the file, a quarter more and
/// 16 MiB for the journal and metadata, in whole MiB.
fn stick_bytes(file_len: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    (file_len + file_len / 4 + 16 * MIB).div_ceil(MIB) * MIB
}

/// Run `cmd` on the host; its stdout on success, [`Error::Host`] with everything it printed
/// otherwise.
fn host(mut cmd: Command) -> Result<String> {
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| Error::Spawn {
        program,
        hint: "see `just setup`".into(),
        source: e,
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(Error::Host {
            cmd: line,
            status: out.status.to_string(),
            output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(stdout)
}

impl Scenario {
    pub(super) fn bundle_offline(&mut self) -> Result<()> {
        let version = "v2";
        let (stick, bundle) = self.bundle_stick(version)?;
        let mut node = self.node("node")?;
        node.unplug_network();
        node.plug_usb_stick(&stick);
        let mut vm = self.boot_v1(&mut node)?;
        self.check_offline(&mut vm, "v1")?;

        let guest_bundle = self.mount_stick(&mut vm, &bundle)?;
        let t0 = Instant::now();
        let out = vm.run_ok(
            &format!("k3os-ops upgrade --quiet --bundle {guest_bundle}"),
            DOWNLOAD,
        )?;
        self.check(
            out.contains(&format!("staged {version}"))
                && out.contains("into slot B")
                && out.contains("activated slot B"),
            || format!("upgrade --bundle did not stage {version} into B and activate it:\n{out}"),
        )?;
        self.note(format!(
            "{}: upgrade --bundle {guest_bundle} (no network) staged and activated {version} in {:.1}s",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Trying, Some(version))?;
        vm.run_ok(&format!("umount {GUEST_MOUNT}"), CMD)?;

        let st = self.reboot_into_good(&mut vm, Slot::B, version)?;
        self.check_b_blessed_and_booted(&st)?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))?;
        self.check_offline(&mut vm, version)?;
        self.note(format!(
            "{}: {version} booted from B without a network, confirmed and blessed; A keeps v1",
            vm.name()
        ));
        Ok(())
    }

    /// The host writes `version`'s bundle with the host tool and an ext4 stick image holding
    /// it; returns (stick image, bundle file name).
    fn bundle_stick(&mut self, version: &str) -> Result<(PathBuf, String)> {
        let dir = self.out.join("stick");
        let tree = dir.join("tree");
        std::fs::create_dir_all(&tree).map_err(|e| Error::io("create directory", &tree, e))?;
        let name = format!("{version}.bundle");
        let bundle = tree.join(&name);
        let mut c = Command::new(host_tool(&self.root));
        c.args(["release", "bundle"])
            .arg(self.target.releases(&self.root).join(version))
            .arg("-o")
            .arg(&bundle);
        let said = host(c)?;
        let len = std::fs::metadata(&bundle)
            .map_err(|e| Error::io("stat the bundle", &bundle, e))?
            .len();
        let stick = dir.join("stick.img");
        mkfs_ext4(&stick, stick_bytes(len), &tree, STICK_LABEL)?;
        std::fs::remove_dir_all(&tree).map_err(|e| Error::io("remove", &tree, e))?;
        self.note(format!(
            "host: {}; on a {} MiB ext4 USB stick image",
            said.trim(),
            stick_bytes(len) >> 20
        ));
        Ok((stick, name))
    }

    /// Wait for the stick's disk, check it is a USB device, mount it read-only; returns the
    /// bundle's path in the guest.
    fn mount_stick(&mut self, vm: &mut Vm, bundle: &str) -> Result<String> {
        let out = vm.run_ok(
            &format!(
                "i=0; while [ ! -b /dev/sda ] && [ $i -lt {STICK_WAIT_SECS} ]; do sleep 1; i=$((i + 1)); done; \
                 echo \"disks: $(ls /sys/class/block | tr '\\n' ' ')\"; ls -l /sys/class/block/sda; \
                 mount -t ext4 -o ro /dev/sda {GUEST_MOUNT} && ls -l {GUEST_MOUNT}"
            ),
            CMD,
        )?;
        self.check(out.contains("/usb"), || {
            format!("/dev/sda is not on the USB bus:\n{out}")
        })?;
        self.check(out.contains(bundle), || {
            format!("the stick mounted at {GUEST_MOUNT} holds no {bundle}:\n{out}")
        })?;
        Ok(format!("{GUEST_MOUNT}/{bundle}"))
    }

    /// The node has no network interface besides loopback (`when`: which release runs).
    fn check_offline(&mut self, vm: &mut Vm, when: &str) -> Result<()> {
        let out = vm.run_ok("ls /sys/class/net", CMD)?;
        let ifaces: Vec<&str> = out.split_whitespace().collect();
        self.check(ifaces == ["lo"], || {
            format!("{when}: the offline node has network interfaces {ifaces:?}, expected only lo")
        })
    }
}

/// `mkfs.ext4 -d tree` into a new image file of `size` bytes labelled `label` (owner root, no
/// mount): the USB stick here, the `kube-node-joins` seed disk.
pub(super) fn mkfs_ext4(img: &Path, size: u64, tree: &Path, label: &str) -> Result<()> {
    let _ = std::fs::remove_file(img);
    let mut c = Command::new("mkfs.ext4");
    c.args(["-q", "-F", "-L", label, "-E", "root_owner=0:0", "-d"])
        .arg(tree)
        .arg(img)
        .arg(format!("{}k", size / 1024));
    host(c).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stick_holds_the_bundle_with_room_for_ext4() {
        let mib = 1u64 << 20;
        assert_eq!(stick_bytes(0), 16 * mib);
        let b = 21 * mib + 12_345;
        let s = stick_bytes(b);
        assert_eq!(s % mib, 0);
        assert!(s >= b + b / 4 + 16 * mib && s < b + b / 4 + 17 * mib, "{s}");
    }
}
