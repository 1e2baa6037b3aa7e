//! `awaited-check`: v2 activated awaiting `node-ready`, as the agent activates. The boot-time
//! confirm leaves B pending; unreported, init's background `slot await-bless` rolls back and
//! reboots into A at the limit; reported (`slot confirm --passed`), B is blessed and stays.

use std::time::Instant;

use bootconfig::Slot;
use libupgrade::state::SlotState;

use super::steps::{sl, CMD};
use super::Scenario;
use crate::error::Result;
use crate::server::ReleaseServer;
use crate::vm::Vm;

/// Long enough for the shell and one `slot status` under TCG before it strikes.
const LIMIT: u64 = 45;

impl Scenario {
    pub(super) fn awaited_check(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.unreported_rolls_back(&mut vm, &srv)?;
        self.reported_is_blessed(&mut vm, &srv)
    }

    /// Stage v2 and activate it awaiting `node-ready` within `limit_secs`, as the agent does;
    /// then reboot and wait until the boot-time confirm of B says it is pending.
    fn pending_trial(&mut self, vm: &mut Vm, srv: &ReleaseServer, limit_secs: u64) -> Result<()> {
        self.upgrade_to(vm, srv, "v2", "--stage-only")?;
        vm.run_ok(
            &format!("k3os-ops slot activate --await node-ready --within-secs {limit_secs}"),
            CMD,
        )?;
        self.reboot_into_pending(vm, Slot::B, "v2")?;
        let st = self.status(vm)?;
        let outcome = st.verdict.as_ref().map(|v| v.outcome.clone());
        self.check(
            matches!(outcome, Some(libupgrade::state::Outcome::Pending { .. }))
                && sl(&st, Slot::B).state == SlotState::Trying,
            || format!("B must be on trial, its bless pending: {st:?}"),
        )
    }

    /// Never reported (k3s or the agent broken in v2): rolled back at the limit, by itself.
    fn unreported_rolls_back(&mut self, vm: &mut Vm, srv: &ReleaseServer) -> Result<()> {
        self.pending_trial(vm, srv, LIMIT)?;
        let t0 = Instant::now();
        self.rolled_back_at_limit(
            vm,
            t0,
            LIMIT,
            ("node-ready", "node-ready never reported", None),
        )
    }

    /// Reported in time: blessed, and it stays.
    fn reported_is_blessed(&mut self, vm: &mut Vm, srv: &ReleaseServer) -> Result<()> {
        self.pending_trial(vm, srv, 600)?;
        let out = vm.run_ok("k3os-ops slot confirm --passed node-ready", CMD)?;
        self.check(out.contains("slot B (v2) is good (confirmed now)"), || {
            format!("the report must bless B: {out}")
        })?;
        self.reboot_into_good(vm, Slot::B, "v2")?;
        self.note(format!(
            "{}: node-ready reported: B blessed, booted again as good",
            vm.name()
        ));
        Ok(())
    }
}
