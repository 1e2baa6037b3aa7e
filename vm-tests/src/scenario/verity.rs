//! The dm-verity scenarios (issue 34 item 5), on the test release `v2-verity` (signed with
//! `release create --verity`): after the stage wrote B's squashfs, tree and FEC, bytes of B's
//! partition are overwritten from the guest, below dm-verity, as a rotting disk would.
//!
//! - `verity-fec`: a few bytes in three data blocks. B boots with its root on the verity
//!   device, and reading the whole device corrects every damaged block (the kernel's
//!   `verity-fec: … corrected` lines counted). Also measured in the same run: the read of the
//!   device through dm-verity against the plain partition, a read of every file of the mounted
//!   tree (B through dm-verity, A plain earlier in the run), and the time the initramfs takes
//!   to switch_root with and without dm-verity.
//! - `verity-fallback`: the first MiB of B overwritten, beyond what FEC corrects. Every trial
//!   boot fails in the initramfs (`K3OS-INITRD-VERITY-FAILED`), the loader falls back to A,
//!   and `slot status` names the dm-verity failure as the why.

use std::time::Instant;

use bootconfig::Slot;
use libupgrade::state::{Event, SlotState};

use super::steps::{parse_booted, sl, BOOT, CMD, GRUB_STUCK};
use super::Scenario;
use crate::error::Result;
use crate::vm::Vm;

/// The `--verity` test release.
const VERSION: &str = "v2-verity";

/// Shell: `$b` is slot B's rootfs partition.
const FIND_B: &str = "b=; for u in /sys/class/block/*/uevent; do grep -qx PARTNAME=rootfs-b $u && b=/dev/$(sed -n 's/^DEVNAME=//p' $u); done; [ -n \"$b\" ]";

/// Byte offsets in B's squashfs overwritten by `verity-fec`: three data blocks (25, 512 and
/// 1250 of 4 KiB), each in another FEC codeword group.
const FLIPS: [u64; 3] = [
    100 * 1024 + 7,
    2 * 1024 * 1024 + 123,
    5 * 1024 * 1024 + 4000,
];

/// Shell: seconds of uptime, for timing in the guest.
const UPTIME: &str = "$(cut -d' ' -f1 /proc/uptime)";

impl Scenario {
    pub(super) fn verity_fec(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        let plain_tree = self.read_tree(&mut vm, "A (plain squashfs)")?;
        self.upgrade_to(&mut vm, &srv, VERSION, "")?;
        let flips: Vec<String> = FLIPS
            .iter()
            .map(|o| format!("printf K3OSFLIP | dd of=$b bs=1 seek={o} conv=notrunc 2>/dev/null"))
            .collect();
        vm.run_ok(&format!("{FIND_B} && {} && sync", flips.join(" && ")), CMD)?;
        self.note(format!(
            "overwrote 8 bytes in each of {} data blocks of B after the stage",
            FLIPS.len()
        ));
        let st = self.reboot_into_good(&mut vm, Slot::B, VERSION)?;
        self.check_b_blessed_and_booted(&st)?;
        self.root_is_verity(&mut vm)?;
        let (through, plain) = self.read_device(&mut vm)?;
        let corrected = vm.run_ok("dmesg | grep -c 'verity-fec.*corrected' || true", CMD)?;
        let corrected: u32 = corrected.trim().parse().unwrap_or(0);
        self.check(corrected >= FLIPS.len() as u32, || {
            format!(
                "the kernel logged {corrected} FEC corrections reading B, expected at least {}",
                FLIPS.len()
            )
        })?;
        self.note(format!(
            "{corrected} FEC corrections logged (kernel `verity-fec: … corrected`); the device read back whole"
        ));
        let verity_tree = self.read_tree(&mut vm, "B (through dm-verity)")?;
        self.note(format!(
            "MEASURE device read: {through:.2}s through dm-verity, {plain:.2}s plain partition; \
             tree read: {verity_tree:.2}s B through dm-verity, {plain_tree:.2}s A plain"
        ));
        self.switch_root_times(&vm)
    }

    pub(super) fn verity_fallback(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        let tries = self.activate_trial(&mut vm, &srv, VERSION, "activation")?;
        vm.run_ok(
            &format!("{FIND_B} && dd if=/dev/urandom of=$b bs=4096 count=256 conv=notrunc 2>/dev/null && sync"),
            CMD,
        )?;
        self.note(format!(
            "overwrote B's first MiB after the stage (256 blocks: beyond FEC); {tries} tries"
        ));
        self.reboot(&mut vm)?;
        self.sit_out_verity_failures(&mut vm, tries)?;
        self.ready(&mut vm)?;
        self.explain_failed_b_on(&mut vm, "v1", VERSION, &[Event::FallbackTaken])?;
        let st = self.status(&mut vm)?;
        let why = sl(&st, Slot::B)
            .last_decision
            .as_ref()
            .map(|d| d.why.clone())
            .unwrap_or_default();
        self.check(why.contains("dm-verity failure"), || {
            format!("B's fallback does not name dm-verity: {why}")
        })?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))
    }

    /// Boots of B that fail in the initramfs on dm-verity until the loader boots A v1 by
    /// itself: exactly `tries` of them.
    fn sit_out_verity_failures(&mut self, vm: &mut Vm, tries: u32) -> Result<()> {
        let t0 = Instant::now();
        let mut failed = 0u32;
        loop {
            let pats = [
                "K3OS-BOOTED",
                "K3OS-INITRD-VERITY-FAILED",
                GRUB_STUCK,
                "K3OS-INITRD-FAILED",
                "Kernel panic",
            ];
            let (i, line) = vm.expect_any(&pats, BOOT)?;
            match i {
                0 => {
                    let (slot, v) = parse_booted(&line)
                        .ok_or_else(|| self.fail(format!("cannot parse `{line}`")))?;
                    self.check(slot == Slot::A && v == "v1", || {
                        format!("booted {slot} {v} with B's root corrupted, expected A v1")
                    })?;
                    break;
                }
                1 => {
                    failed += 1;
                    self.count_boot();
                    self.note(format!(
                        "{}: attempt {failed} of B: {} ({:.1}s)",
                        vm.name(),
                        line.trim(),
                        t0.elapsed().as_secs_f64()
                    ));
                    self.check(failed <= tries, || {
                        format!("B was tried {failed} times, more than its {tries} tries")
                    })?;
                }
                _ => {
                    return Err(self.fail(format!(
                        "{}: `{}` instead of a dm-verity failure (console log {})",
                        vm.name(),
                        line.trim(),
                        vm.log().display()
                    )))
                }
            }
        }
        self.note(format!(
            "{}: fell back to A v1 after {failed} failed boots of B ({:.1}s)",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        self.check(failed == tries, || {
            format!("B failed {failed} times, expected exactly its {tries} tries")
        })
    }

    /// The running root is the verity device the initramfs made.
    fn root_is_verity(&mut self, vm: &mut Vm) -> Result<()> {
        let root = vm.run_ok("awk '$2 == \"/\" { print $1, $3 }' /proc/mounts", CMD)?;
        let dm = vm.run_ok("cat /sys/block/dm-0/dm/name", CMD)?;
        self.check(
            root.trim() == "/dev/dm-0 squashfs" && dm.trim() == "k3os-root",
            || {
                format!(
                    "root is `{}` on `{}`, expected /dev/dm-0 squashfs on k3os-root",
                    root.trim(),
                    dm.trim()
                )
            },
        )?;
        self.note("B's root is squashfs on /dev/dm-0 (k3os-root, dm-verity)");
        Ok(())
    }

    /// Seconds to read the whole verity device, then as many bytes of the plain partition
    /// under it, each from a dropped page cache.
    fn read_device(&mut self, vm: &mut Vm) -> Result<(f64, f64)> {
        let timed = |dev: &str| {
            format!(
                "sync; echo 3 >/proc/sys/vm/drop_caches; t0={UPTIME}; \
                 dd if={dev} of=/dev/null bs=4096 count=$n 2>/dev/null || exit 1; \
                 echo \"$t0 {UPTIME}\""
            )
        };
        let script = format!(
            "{FIND_B} && n=$(($(blockdev --getsize64 /dev/dm-0) / 4096)) && echo blocks $n && \
             ( {} ) && ( {} )",
            timed("/dev/dm-0"),
            timed("$b")
        );
        let out = vm.run_ok(&script, CMD)?;
        let spans: Vec<f64> = out
            .lines()
            .filter_map(|l| {
                let (a, b) = l.trim().split_once(' ')?;
                Some(b.parse::<f64>().ok()? - a.parse::<f64>().ok()?)
            })
            .collect();
        let [through, plain] = spans[..] else {
            return Err(self.fail(format!("cannot read the timings from:\n{out}")));
        };
        Ok((through, plain))
    }

    /// Seconds to read every file of the mounted root from a dropped page cache.
    fn read_tree(&mut self, vm: &mut Vm, what: &str) -> Result<f64> {
        let out = vm.run_ok(
            &format!(
                "sync; echo 3 >/proc/sys/vm/drop_caches; t0={UPTIME}; \
                 find / -xdev -type f -exec cat {{}} + >/dev/null 2>&1; echo \"$t0 {UPTIME}\""
            ),
            CMD,
        )?;
        let span = out.lines().rev().find_map(|l| {
            let (a, b) = l.trim().split_once(' ')?;
            Some(b.parse::<f64>().ok()? - a.parse::<f64>().ok()?)
        });
        let s = span.ok_or_else(|| self.fail(format!("cannot read the timing from:\n{out}")))?;
        self.note(format!("read every file of {what} in {s:.2}s"));
        Ok(s)
    }

    /// The initramfs's switch_root times of this run's boots (console log), in boot order.
    fn switch_root_times(&mut self, vm: &Vm) -> Result<()> {
        let log = std::fs::read_to_string(vm.log())
            .map_err(|e| crate::error::Error::io("read console log", vm.log(), e))?;
        let times: Vec<&str> = log
            .lines()
            .filter_map(|l| l.split("k3os-initrd: switch_root at ").nth(1))
            .map(|t| t.split('s').next().unwrap_or(t))
            .collect();
        self.note(format!(
            "MEASURE initramfs switch_root at (uptime, per boot: A plain, then B through dm-verity): {}",
            times.join("s, ")
        ));
        Ok(())
    }
}
