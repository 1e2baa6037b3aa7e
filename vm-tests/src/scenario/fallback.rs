//! The fallback family: a trial slot that never makes it. `fallback-panic` and
//! `fallback-noconfirm` use up the bootloader's tries, `badhealth` fails its health check and
//! rolls back on its first boot, `missing-kernel` cannot even be loaded; each time the node
//! must come back on A by itself and `slot status` must say why B failed. On the x86_64 GRUB
//! targets `fallback-panic` reports to a collector on the host, which must receive the
//! panicking attempt's failure bundle (`panic_bundle`).

use std::time::Instant;

use bootconfig::{Slot, SlotBoot};
use libupgrade::state::{Event, SlotState};

use super::panic_bundle::PanicEvidence;
use super::steps::{parse_booted, sl, BOOT, CMD, GRUB_STUCK, READY};
use super::Scenario;
use crate::error::Result;
use crate::server::ReleaseServer;
use crate::vm::Vm;

impl Scenario {
    /// Activate a v2 that never makes it; count the boots the bootloader gives it.
    pub(super) fn fallback(&mut self, noconfirm: bool) -> Result<()> {
        let version = if noconfirm {
            "v2-noconfirm"
        } else {
            "v2-panic"
        };
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        let evidence = PanicEvidence::on(self.target).filter(|_| !noconfirm);
        let reports = match evidence {
            Some(_) => Some(self.site_collector(&mut vm, node.report_port)?),
            None => None,
        };
        let tries = self.activate_trial(&mut vm, &srv, version, "activation")?;
        self.note(format!("activated {version} in B with {tries} tries"));
        self.fall_back_to_a(&mut vm, version, tries, noconfirm, "v1")?;
        match (reports, evidence) {
            (Some((site, col)), Some(want)) => {
                self.panic_bundle_arrived(&mut vm, &site, col, version, tries, want)
            }
            _ => Ok(()),
        }
    }

    /// Upgrade to `version` (into B): it must be on trial; returns the tries the bootloader
    /// gives it (`after`: what put it on trial, for the message).
    pub(super) fn activate_trial(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        version: &str,
        after: &str,
    ) -> Result<u32> {
        self.upgrade_to(vm, srv, version, "")?;
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::B, SlotState::Trying, Some(version))?;
        self.trial_tries(&st, after)
    }

    /// Reboot into trial B (`version`, `tries` tries) which never makes it: the node must come
    /// back on A running `a_version` by itself, confirmed, and say why B failed.
    pub(super) fn fall_back_to_a(
        &mut self,
        vm: &mut Vm,
        version: &str,
        tries: u32,
        noconfirm: bool,
        a_version: &str,
    ) -> Result<()> {
        self.reboot(vm)?;
        self.sit_out_trial(vm, version, tries, noconfirm, Slot::A, a_version)?;
        self.ready(vm)?;
        self.explain_failed_b_on(vm, a_version, version, &[Event::FallbackTaken])
    }

    /// A trial slot (the other one of `good`) that never makes it, rebooting: count the boots
    /// the bootloader gives it (each panic or each unconfirmed boot reset like a watchdog) until
    /// it boots `good` running `good_version` by itself; exactly `tries` attempts.
    fn sit_out_trial(
        &mut self,
        vm: &mut Vm,
        version: &str,
        tries: u32,
        noconfirm: bool,
        good: Slot,
        good_version: &str,
    ) -> Result<()> {
        let t0 = Instant::now();
        let mut attempts = 0u32;
        loop {
            let pats: &[&str] = if noconfirm {
                &["K3OS-BOOTED", GRUB_STUCK]
            } else {
                &["K3OS-BOOTED", GRUB_STUCK, "K3OS-INITRD-PANIC"]
            };
            let (i, line) = vm.expect_any(pats, BOOT)?;
            if i == 1 {
                return Err(self.fail(format!(
                    "{}: the bootloader is stuck: `{line}` (console log {})",
                    vm.name(),
                    vm.log().display()
                )));
            }
            if i == 2 {
                attempts += 1;
                self.panicked_attempt(vm, attempts, tries, t0)?;
                continue;
            }
            if self.is_good_boot(&line, version, noconfirm, good, good_version)? {
                self.note(format!(
                    "{}: fell back to slot {good} {good_version} after {attempts} attempts of {} ({:.1}s)",
                    vm.name(),
                    good.other(),
                    t0.elapsed().as_secs_f64()
                ));
                break;
            }
            attempts += 1;
            self.check(attempts <= tries, || {
                format!("B was booted {attempts} times, more than its {tries} tries")
            })?;
            self.unconfirmed_attempt(vm, attempts)?;
        }
        self.check(attempts == tries, || {
            format!("B was tried {attempts} times, expected exactly its {tries} tries")
        })
    }

    /// Attempt `attempts` of the trial panicked in its initrd (panic=5 reboots the machine:
    /// one more boot).
    fn panicked_attempt(&mut self, vm: &Vm, attempts: u32, tries: u32, t0: Instant) -> Result<()> {
        self.count_boot();
        self.note(format!(
            "{}: attempt {attempts} of B panicked in the initrd ({:.1}s)",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        self.check(attempts <= tries, || {
            format!("B was booted {attempts} times, more than its {tries} tries")
        })
    }

    /// A `K3OS-BOOTED` line during the trial: `true` when it is `good` running
    /// `good_version`, `false` when it is an (unconfirmed) boot of the trial `version`.
    fn is_good_boot(
        &self,
        line: &str,
        version: &str,
        noconfirm: bool,
        good: Slot,
        good_version: &str,
    ) -> Result<bool> {
        let (slot, v) = parse_booted(line)
            .ok_or_else(|| self.fail(format!("cannot parse the boot line `{line}`")))?;
        if slot == good {
            self.check(v == good_version, || {
                format!("fell back to {good} but it runs {v}, expected {good_version}")
            })?;
            return Ok(true);
        }
        self.check(noconfirm && v == version, || {
            format!("unexpected boot of slot {slot} version {v}")
        })?;
        Ok(false)
    }

    /// A trial boot that runs but never confirms: give it until it is up, then reset it like
    /// a watchdog.
    fn unconfirmed_attempt(&mut self, vm: &mut Vm, attempts: u32) -> Result<()> {
        vm.expect_not("K3OS-NOCONFIRM", &["K3OS-CONFIRM", "Kernel panic"], READY)?;
        vm.expect_not("K3OS-READY", &["Kernel panic"], READY)?;
        self.note(format!(
            "{}: attempt {attempts} of B came up unconfirmed; watchdog reset",
            vm.name()
        ));
        vm.system_reset()?;
        self.count_boot();
        Ok(())
    }

    /// On A running `a_version` after a failed B holding `version`: status shows B bad, not
    /// bootable, and why (a decision among `events`); A good and booted.
    pub(super) fn explain_failed_b_on(
        &mut self,
        vm: &mut Vm,
        a_version: &str,
        version: &str,
        events: &[Event],
    ) -> Result<()> {
        let st = self.status(vm)?;
        self.check(
            st.booted == Some(Slot::A) && st.next_boot == Slot::A,
            || format!("booted {:?} next {}, expected A/A", st.booted, st.next_boot),
        )?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some(a_version))?;
        self.check_slot(&st, Slot::B, SlotState::Bad, Some(version))?;
        let b = sl(&st, Slot::B);
        self.check(matches!(b.boot, SlotBoot::Bad), || {
            format!("bootloader still has B as {:?}", b.boot)
        })?;
        let d = b
            .last_decision
            .as_ref()
            .ok_or_else(|| self.fail("status has no decision about slot B"))?;
        self.check(
            events.contains(&d.event) && !d.why.trim().is_empty(),
            || {
                format!(
                    "last decision about B is {:?} ({}), expected one of {events:?} with a reason",
                    d.event, d.why
                )
            },
        )?;
        let human = vm.run_ok("k3os-ops slot status", CMD)?;
        self.check(human.contains(&d.why), || {
            format!(
                "`slot status` does not show why B failed ({}):\n{human}",
                d.why
            )
        })?;
        self.note(format!(
            "slot status on {a_version}: B is bad, {:?}: {}",
            d.event, d.why
        ));
        Ok(())
    }

    pub(super) fn badhealth(&mut self) -> Result<()> {
        let version = "v2-badhealth";
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.upgrade_to(&mut vm, &srv, version, "")?;
        let st = self.status(&mut vm)?;
        let tries = sl(&st, Slot::B).tries_left.unwrap_or(0);
        self.reboot(&mut vm)?;
        let t0 = Instant::now();
        self.expect_boot(&mut vm, Slot::B, version)?;
        vm.expect_not(
            "K3OS-CONFIRM failed",
            &["K3OS-CONFIRM ok", "K3OS-NOCONFIRM"],
            READY,
        )?;
        vm.expect("K3OS-ROLLBACK", READY)?;
        self.count_boot();
        self.expect_boot(&mut vm, Slot::A, "v1")?;
        self.note(format!("{}: B failed its health check and rolled back after one boot of {tries} tries ({:.1}s)", vm.name(), t0.elapsed().as_secs_f64()));
        self.ready(&mut vm)?;
        self.explain_failed_b_on(
            &mut vm,
            "v1",
            version,
            &[Event::HealthFailed, Event::RolledBack],
        )
    }

    pub(super) fn missing_kernel(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.upgrade_to(&mut vm, &srv, "v2", "")?;
        vm.run_ok("rm /boot/b/vmlinuz && sync", CMD)?;
        self.reboot(&mut vm)?;
        let t0 = Instant::now();
        let (slot, version) = self.booted(&mut vm)?;
        self.check(slot == Slot::A && version == "v1", || {
            format!("with B's kernel gone the node booted {slot} {version}, expected A v1")
        })?;
        self.note(format!(
            "{}: B's kernel missing, the bootloader fell back to A v1 ({:.1}s)",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        let b = sl(&st, Slot::B);
        self.check(st.next_boot == Slot::A, || {
            format!("after the fallback B still boots next: {b:?}")
        })?;
        if let Some(d) = &b.last_decision {
            self.note(format!(
                "slot status on v1: B is {}, {:?}: {}",
                b.state, d.event, d.why
            ));
        }
        Ok(())
    }
}
