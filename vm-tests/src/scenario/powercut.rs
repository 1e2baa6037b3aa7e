//! `powercut`: a dry run counts the write barriers of an upgrade; then for each sampled
//! barrier k the upgrade freezes at k, QEMU is killed, and the node must come up on a good
//! slot with slot B either complete (re-stage reports it already staged, and it boots) or not
//! bootable (and a new upgrade recovers). The same for the barriers of the boot-time confirm
//! of the new slot. Also the barrier parsing and sampling the other scenarios use.
//!
//! The upgrade's sample (without `--all-barriers`): the first, the last, every payload-store
//! barrier, and every [`STRIDE`]-th from an offset taken from the commit ([`barrier_seed`]),
//! so commits cut different barriers ([`STRIDE`] consecutive seeds cut them all) while one run
//! cuts about half of what "every third" did (the sample was CI's longest scenario). The seed
//! is printed; `VM_TESTS_BARRIER_SEED` repeats a run's sample.
//!
//! The payload store's barriers are always cut (issue 33): a stray object is planted before
//! the upgrade and before the new slot's first boot, so the stage's and the confirm's prunes
//! pass `payload:object-pruned`, and v2's image archive passes `payload:object-renamed`.
//! After every cut both slots' payloads must be in the store with their sha256.
//!
//! v1 boots once per run: every dry run and cut starts from that booted, idle guest, saved
//! after its boot and resumed on a copy of its disk ([`super::snapshot`]). The boots after
//! the cuts are real boots.

use std::time::Instant;

use bootconfig::{Slot, SlotBoot};
use libupgrade::state::SlotState;
use libupgrade::Status;

use super::payloads::plant_stray;
use super::snapshot::V1Snapshot;
use super::steps::{sl, Node, CMD, DOWNLOAD, READY};
use super::Scenario;
use crate::error::Result;
use crate::server::ReleaseServer;
use crate::vm::Vm;

impl Scenario {
    pub(super) fn powercut(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let v1 = self.booted_v1_snapshot()?;
        // Dry run: count the barriers of a complete upgrade.
        let (_node, mut vm) = self.restore_v1(&v1, "dry-run")?;
        plant_stray(&mut vm)?;
        let out = self.upgrade_to_env(&mut vm, &srv, "v2", "K3OS_OPS_BARRIERS=1", "")?;
        drop(vm);
        let barriers = parse_barriers(&out);
        self.check(!barriers.is_empty(), || {
            format!(
                "the upgrade printed no K3OS-BARRIER lines (K3OS_OPS_BARRIERS=1 was set):\n{out}"
            )
        })?;
        for (i, (n, _)) in barriers.iter().enumerate() {
            self.check(*n == i as u64 + 1, || {
                format!("barrier numbers are not 1..N: {barriers:?}")
            })?;
        }
        let total = barriers.len() as u64;
        let (every, offset) = if self.opts.all_barriers {
            (1, 0)
        } else {
            (STRIDE, rotation(self.opts.barrier_seed))
        };
        let ks = sample(&barriers, every, offset);
        let seed = self.opts.barrier_seed;
        self.note(format!(
            "upgrade has {total} barriers: {}; cutting at {ks:?} (stride {every} from barrier {}; VM_TESTS_BARRIER_SEED={seed} repeats it)",
            fmt_barriers(&barriers),
            offset + 1,
        ));
        for k in ks {
            let name = &barriers[(k - 1) as usize].1;
            let t0 = Instant::now();
            let hit = self.cut_at(&srv, &v1, k, name)?;
            self.note(format!(
                "cut at barrier {k} ({hit}): recovered and verified in {:.1}s",
                t0.elapsed().as_secs_f64()
            ));
        }
        self.powercut_confirm(&srv, &v1)
    }

    /// Power cuts during `confirm` on the first boot of the new slot. init takes a one-shot
    /// request from the state partition (`/var/lib/k3os-ops/barrier-request`: `announce` or
    /// `stop k`, see images/files/rootfs-init.sh), so the cut lands inside the boot-time
    /// confirm. A dry run counts confirm's barriers; then the first, the last and the payload
    /// store's (every one with `--all-barriers`) are cut.
    fn powercut_confirm(&mut self, srv: &ReleaseServer, v1: &V1Snapshot) -> Result<()> {
        let (_node, vm) = self.restore_v1(v1, "confirm-dry-run")?;
        let mut vm = self.activated_v2(vm, srv, "announce", true)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        let barriers = self.confirm_barriers(&mut vm)?;
        drop(vm);
        let total = barriers.len() as u64;
        let ks = sample(
            &barriers,
            if self.opts.all_barriers {
                1
            } else {
                usize::MAX
            },
            0,
        );
        self.note(format!(
            "confirm has {total} barriers: {}; cutting at {ks:?}",
            fmt_barriers(&barriers)
        ));
        for k in ks {
            let name = barriers[(k - 1) as usize].1.clone();
            let t0 = Instant::now();
            self.cut_confirm_at(srv, v1, k, &name)?;
            self.note(format!(
                "confirm cut at barrier {k} ({name}): recovered and verified in {:.1}s",
                t0.elapsed().as_secs_f64()
            ));
        }
        Ok(())
    }

    /// The boot-time confirm's `K3OS-BARRIER` lines (barrier-request `announce`), up to
    /// `K3OS-CONFIRM ok`; at least one.
    pub(super) fn confirm_barriers(&mut self, vm: &mut Vm) -> Result<Vec<(u64, String)>> {
        let mut barriers = Vec::new();
        loop {
            let (i, line) = vm.expect_any(
                &[
                    "K3OS-BARRIER ",
                    "K3OS-CONFIRM ok",
                    "K3OS-CONFIRM failed",
                    "K3OS-CONFIRM pending",
                    "Kernel panic",
                ],
                READY,
            )?;
            match i {
                0 => barriers.extend(parse_barriers(&line)),
                1 => break,
                _ => {
                    return Err(self.fail(format!(
                    "{}: the boot-time confirm did not bless the slot: `{line}` (console log {})",
                    vm.name(),
                    vm.log().display()
                )))
                }
            }
        }
        self.check(!barriers.is_empty(), || {
            "confirm printed no K3OS-BARRIER lines for barrier-request `announce`".to_string()
        })?;
        Ok(barriers)
    }

    /// `vm`, a node ready on v1 (fresh from its image), stages and activates v2, with `request`
    /// left for the next boot's init (and a stray object in the store for its prune, `stray`);
    /// rebooted (the returned guest is booting).
    pub(super) fn activated_v2(
        &mut self,
        mut vm: Vm,
        srv: &ReleaseServer,
        request: &str,
        stray: bool,
    ) -> Result<Vm> {
        self.upgrade_to(&mut vm, srv, "v2", "")?;
        if stray {
            plant_stray(&mut vm)?;
        }
        vm.run_ok(
            &format!("echo '{request}' >/var/lib/k3os-ops/barrier-request && sync"),
            CMD,
        )?;
        self.reboot(&mut vm)?;
        Ok(vm)
    }

    /// On `node` (fresh from its image, `vm` ready on its v1), activate v2 (with a stray object
    /// for the confirm's prune, `stray`), stop the boot-time confirm of v2 at barrier `k` and
    /// cut the power; power on again and wait until the node is up and confirmed. Returns the
    /// guest and the slot and version it booted.
    pub(super) fn cut_in_confirm(
        &mut self,
        node: &mut Node,
        vm: Vm,
        srv: &ReleaseServer,
        k: u64,
        stray: bool,
    ) -> Result<(Vm, Slot, String)> {
        let mut vm = self.activated_v2(vm, srv, &format!("stop {k}"), stray)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        vm.expect_not(
            &format!("K3OS-BARRIER-STOP {k} "),
            &["K3OS-CONFIRM ok", "K3OS-CONFIRM failed", "Kernel panic"],
            READY,
        )?;
        vm.power_cut()?;

        let mut vm = self.power_on(node)?;
        let (slot, version) = self.booted(&mut vm)?;
        self.ready(&mut vm)?;
        Ok((vm, slot, version))
    }

    /// Cut the power at barrier `k` of the boot-time confirm of v2, then check the node comes
    /// up on a confirmed slot and that B ends good (booted) or recoverable.
    fn cut_confirm_at(
        &mut self,
        srv: &ReleaseServer,
        v1: &V1Snapshot,
        k: u64,
        name: &str,
    ) -> Result<()> {
        let (mut node, vm) = self.restore_v1(v1, &format!("confirm-cut-{k:02}"))?;
        let (mut vm, slot, version) = self.cut_in_confirm(&mut node, vm, srv, k, true)?;
        let st = self.status(&mut vm)?;
        let b = sl(&st, Slot::B).clone();
        self.note(format!(
            "confirm cut at {k} ({name}): came up on {slot} {version}; B is {} / bootloader {:?}",
            b.state, b.boot
        ));
        self.payloads_intact(&mut vm, &st, &format!("confirm cut at {k} ({name})"))?;
        self.check(sl(&st, slot).state == SlotState::Good, || {
            format!(
                "the booted slot {slot} is {} after confirm",
                sl(&st, slot).state
            )
        })?;
        match slot {
            Slot::B => {
                self.check(version == "v2", || format!("B runs {version}"))?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))
            }
            Slot::A => {
                // The trial was spent (syslinux's one try) or given up: never blessed, never
                // booted next, and a new upgrade brings v2 back.
                self.check(version == "v1", || format!("A runs {version}"))?;
                self.check(
                    b.state != SlotState::Good && st.next_boot == Slot::A,
                    || {
                        format!(
                            "booted A but B is {} and boots next: {}",
                            b.state, st.next_boot
                        )
                    },
                )?;
                self.upgrade_again_to_v2(&mut vm, srv, "the confirm cut")
            }
        }
    }

    /// Cut the power at barrier `k` of the v2 upgrade, then check the node and slot B.
    /// Returns the name of the barrier the upgrade actually stopped at.
    fn cut_at(
        &mut self,
        srv: &ReleaseServer,
        v1: &V1Snapshot,
        k: u64,
        name: &str,
    ) -> Result<String> {
        let (mut node, mut vm) = self.restore_v1(v1, &format!("cut-{k:02}"))?;
        plant_stray(&mut vm)?;
        let hit = self.stop_upgrade_at(&mut vm, srv, k, name)?;
        vm.power_cut()?;
        let (mut vm, slot, st) = self.up_after_upgrade_cut(&mut node, k, &hit)?;
        self.payloads_intact(&mut vm, &st, &format!("cut at {k} ({hit})"))?;
        self.recover_b(&mut vm, srv, slot, &st)?;
        Ok(hit)
    }

    /// Run the v2 upgrade told to stop at barrier `k` (`name` in the dry run); returns the
    /// barrier it actually stopped at.
    fn stop_upgrade_at(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        k: u64,
        name: &str,
    ) -> Result<String> {
        vm.send_line(&format!(
            "K3OS_OPS_BARRIER_STOP={k} k3os-ops upgrade --quiet --source {}; echo \"@@NOSTOP$(({k}))@@ rc=$?\"",
            srv.guest_url("v2")
        ))?;
        let (i, line) = vm.expect_any(
            &[
                &format!("K3OS-BARRIER-STOP {k} "),
                &format!("@@NOSTOP{k}@@"),
            ],
            DOWNLOAD,
        )?;
        // Download checkpoints are taken by bytes *and* time, so on a slower run barrier k can be
        // a different step than in the dry run (or past the last one): judge the cut by the
        // barrier actually hit.
        let hit = if i == 0 {
            line.split_whitespace()
                .last()
                .unwrap_or_default()
                .to_string()
        } else {
            self.check(line.contains("rc=0"), || {
                format!("the upgrade with a stop at barrier {k} failed: `{line}`")
            })?;
            "activate:completed".to_string()
        };
        if hit != name {
            self.note(format!(
                "barrier {k} is {hit} in this run ({name} in the dry run: checkpoints are time-driven)"
            ));
        }
        Ok(hit)
    }

    /// Power `node` on after a cut at barrier `k` (`name`): it must boot A v1, or B v2 when
    /// the cut came after activation, and confirm the slot it booted. Returns the guest, that
    /// slot and the status.
    fn up_after_upgrade_cut(
        &mut self,
        node: &mut Node,
        k: u64,
        name: &str,
    ) -> Result<(Vm, Slot, Status)> {
        let mut vm = self.power_on(node)?;
        let (slot, version) = self.booted(&mut vm)?;
        let activated = name.starts_with("activate:");
        match slot {
            Slot::A => self.check(version == "v1", || {
                format!("after the cut A runs {version}")
            })?,
            Slot::B => self.check(activated && version == "v2", || {
                format!("after a cut at {name} the node booted B {version}")
            })?,
        }
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        let booted = sl(&st, slot);
        self.check(booted.state == SlotState::Good, || {
            format!("the booted slot {slot} is {} after confirm", booted.state)
        })?;
        let b = sl(&st, Slot::B);
        self.note(format!(
            "cut at {k} ({name}): came up on {slot} {version}; B is {} / bootloader {:?}",
            b.state, b.boot
        ));
        Ok((vm, slot, st))
    }

    /// After an upgrade cut, B is good and booted, or complete (it stages as a no-op and
    /// boots), or not bootable (a new upgrade recovers it).
    fn recover_b(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        slot: Slot,
        st: &Status,
    ) -> Result<()> {
        let b = sl(st, Slot::B).clone();
        match b.state {
            SlotState::Good => self.check(slot == Slot::B, || {
                "B is good but the node did not boot it".to_string()
            }),
            SlotState::Staged | SlotState::Trying => {
                // Complete and valid: the same release stages as a no-op, and it boots.
                let out = self.upgrade_to(vm, srv, "v2", "--stage-only")?;
                self.check(out.contains("already holds v2"), || {
                    format!(
                        "B is {} but re-staging v2 did not report it already staged:\n{out}",
                        b.state
                    )
                })?;
                if st.next_boot != Slot::B {
                    vm.run_ok("k3os-ops slot activate", CMD)?;
                }
                self.reboot_into_good(vm, Slot::B, "v2").map(drop)
            }
            SlotState::Empty | SlotState::Invalid | SlotState::Bad => {
                // Not valid: the bootloader must not pick it; a new upgrade must recover.
                self.check(slot == Slot::A && st.next_boot == Slot::A, || {
                    format!("B is {} but boots next ({})", b.state, st.next_boot)
                })?;
                self.check(
                    !matches!(b.boot, SlotBoot::Good | SlotBoot::Trying { .. }),
                    || format!("B is {} but the bootloader has it as {:?}", b.state, b.boot),
                )?;
                self.upgrade_again_to_v2(vm, srv, "the cut")
            }
        }
    }
}

/// `1:name 2:name …`
pub(super) fn fmt_barriers(b: &[(u64, String)]) -> String {
    b.iter()
        .map(|(n, name)| format!("{n}:{name}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `K3OS-BARRIER <n> <name>` lines of a command's output, in order.
pub fn parse_barriers(out: &str) -> Vec<(u64, String)> {
    out.lines()
        .filter_map(|l| {
            let rest = &l[l.find("K3OS-BARRIER ")? + "K3OS-BARRIER ".len()..];
            let (n, name) = rest.trim().split_once(' ')?;
            Some((n.parse().ok()?, name.trim().to_string()))
        })
        .collect()
}

/// The stride of the upgrade's default power-cut sample.
pub const STRIDE: usize = 6;

/// Where the upgrade's sample starts within [`STRIDE`] (0-based), for a seed.
pub fn rotation(seed: u64) -> usize {
    (seed % STRIDE as u64) as usize
}

/// The seed of the rotating sample: `VM_TESTS_BARRIER_SEED` when set, else the checked-out
/// commit (its first 16 hex digits), else 0.
pub fn barrier_seed() -> u64 {
    if let Some(v) = std::env::var("VM_TESTS_BARRIER_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return v;
    }
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let hex = String::from_utf8_lossy(&o.stdout);
            u64::from_str_radix(hex.trim().get(..16)?, 16).ok()
        })
        .unwrap_or(0)
}

/// Barriers to cut at, in order: the first, the last, every `every`-th from `1 + offset`, and
/// every barrier of the payload store (`payload:*`). `every` 1 is all of them; `usize::MAX`
/// (offset 0) only the ends and the payload store's.
pub fn sample(barriers: &[(u64, String)], every: usize, offset: usize) -> Vec<u64> {
    let total = barriers.len() as u64;
    if total == 0 {
        return Vec::new();
    }
    let mut v: Vec<u64> = (1 + offset as u64..=total).step_by(every).collect();
    v.push(1);
    v.extend(payload_barriers(barriers));
    v.push(total);
    v.sort_unstable();
    v.dedup();
    v
}

/// The numbers of the payload store's barriers (`payload:…`).
fn payload_barriers(barriers: &[(u64, String)]) -> impl Iterator<Item = u64> + '_ {
    barriers
        .iter()
        .filter(|(_, name)| name.starts_with("payload:"))
        .map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_barriers() {
        let out = "x\nK3OS-BARRIER 1 stage:bootloader-marked-bad\nK3OS-BARRIER 2 state:invalid\nstaged v2\n";
        assert_eq!(
            parse_barriers(out),
            vec![
                (1, "stage:bootloader-marked-bad".into()),
                (2, "state:invalid".into())
            ]
        );
        assert_eq!(
            fmt_barriers(&parse_barriers(out)),
            "1:stage:bootloader-marked-bad 2:state:invalid"
        );
    }

    #[test]
    fn sampling_keeps_first_and_last() {
        let named = |n: u64, payload: &[u64]| -> Vec<(u64, String)> {
            (1..=n)
                .map(|k| {
                    let name = if payload.contains(&k) {
                        "payload:object-renamed"
                    } else {
                        "stage:checkpoint"
                    };
                    (k, name.to_string())
                })
                .collect()
        };
        assert_eq!(sample(&named(10, &[]), 3, 0), vec![1, 4, 7, 10]);
        assert_eq!(sample(&named(11, &[]), 3, 0), vec![1, 4, 7, 10, 11]);
        assert_eq!(sample(&named(3, &[]), 1, 0), vec![1, 2, 3]);
        assert_eq!(sample(&named(1, &[]), 3, 0), vec![1]);
        assert!(sample(&[], 1, 0).is_empty());
        // A rotated start still keeps the first and the last.
        assert_eq!(sample(&named(20, &[]), 6, 2), vec![1, 3, 9, 15, 20]);
        assert_eq!(sample(&named(20, &[]), 6, 5), vec![1, 6, 12, 18, 20]);
        // The payload store's barriers are always cut.
        assert_eq!(
            sample(&named(20, &[3, 12]), 3, 0),
            vec![1, 3, 4, 7, 10, 12, 13, 16, 19, 20]
        );
        // Only the ends and the payload store's (the boot-time confirm's short list).
        assert_eq!(sample(&named(4, &[3]), usize::MAX, 0), vec![1, 3, 4]);
        assert_eq!(sample(&named(3, &[]), usize::MAX, 0), vec![1, 3]);
        assert_eq!(sample(&named(1, &[]), usize::MAX, 0), vec![1]);
        assert!(sample(&[], usize::MAX, 0).is_empty());
    }

    #[test]
    fn the_rotating_samples_of_stride_consecutive_seeds_cut_every_barrier() {
        let barriers: Vec<(u64, String)> = (1..=40)
            .map(|k| (k, "stage:checkpoint".to_string()))
            .collect();
        let mut cut: Vec<u64> = (0..STRIDE as u64)
            .flat_map(|seed| sample(&barriers, STRIDE, rotation(seed)))
            .collect();
        cut.sort_unstable();
        cut.dedup();
        assert_eq!(cut, (1..=40).collect::<Vec<_>>());
        // One run cuts about half of what every third did.
        let one = sample(&barriers, STRIDE, rotation(3)).len();
        let third = sample(&barriers, 3, 0).len();
        assert!(one * 2 <= third + 2, "{one} vs {third}");
    }
}
