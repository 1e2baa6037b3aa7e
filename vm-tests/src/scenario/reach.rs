//! `reachability`: a trial release must reach its update server within a limit, or the node
//! rolls back by itself (nobody is at the site). The activations here read a config with a
//! `[reachability]` table (`within_secs` = [`LIMIT`], no endpoints: the default is the URL the
//! release was staged from, the harness's release server), so they await the built-in check
//! `reachable`. v2-nonet (its init never brings eth0 up) boots pending; `slot await-bless`
//! probes in vain, rolls back and reboots into A at the limit; B is bad, naming the check.
//! v2 reaches the server: the check blesses it, and it boots again as good.
//!
//! The table goes into a copy of the node's config on /tmp (tmpfs) that only these upgrades
//! read; the releases' own configs stay as they are, so no other scenario awaits the check and
//! a v0.1.0 reader (which refuses unknown keys) never meets it. The trial boots read their own
//! config: the awaits are the activating slot's.

use std::time::{Duration, Instant};

use bootconfig::Slot;
use libupgrade::state::Outcome;
use libupgrade::state::SlotState;

use super::steps::{sl, CMD};
use super::Scenario;
use crate::error::Result;
use crate::server::ReleaseServer;
use crate::vm::Vm;

/// Seconds a trial boot has to reach the server: long enough for DHCP and a probe under TCG.
const LIMIT: u64 = 60;
/// The activating node's config with the `[reachability]` table.
const REACH_CONFIG: &str = "/tmp/reach.toml";
/// The release whose network configuration is broken.
const NONET: &str = "v2-nonet";

/// The lines appended to the node's config: the check with its limit and the default endpoint.
fn reach_table() -> [String; 3] {
    [
        String::new(),
        "[reachability]".into(),
        format!("within_secs = {LIMIT}"),
    ]
}

impl Scenario {
    pub(super) fn reachability(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.unreachable_rolls_back(&mut vm, &srv)?;
        self.reachable_is_blessed(&mut vm, &srv)
    }

    /// Upgrade to `version` (stage over HTTP, activate) under the config with the
    /// `[reachability]` table, and reboot into its pending trial boot.
    fn trial_awaiting_reach(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        version: &str,
    ) -> Result<()> {
        let lines: Vec<String> = reach_table().iter().map(|l| format!("'{l}'")).collect();
        vm.run_ok(
            &format!(
                "cp \"$K3OS_OPS_CONFIG\" {REACH_CONFIG} && printf '%s\\n' {} >>{REACH_CONFIG}",
                lines.join(" ")
            ),
            CMD,
        )?;
        let env = format!("K3OS_OPS_CONFIG={REACH_CONFIG}");
        let out = self.upgrade_to_env(vm, srv, version, &env, "")?;
        self.check(
            out.contains(&format!("staged {version}")) && out.contains("activated slot B"),
            || format!("the upgrade did not stage {version} and activate B:\n{out}"),
        )?;
        self.reboot_into_pending(vm, Slot::B, version)
    }

    /// v2-nonet cannot reach the server: pending on `reachable` at first, rolled back to A at
    /// the limit by `slot await-bless` alone.
    fn unreachable_rolls_back(&mut self, vm: &mut Vm, srv: &ReleaseServer) -> Result<()> {
        self.trial_awaiting_reach(vm, srv, NONET)?;
        let t0 = Instant::now();
        let st = self.status(vm)?;
        let outcome = st.verdict.as_ref().map(|v| v.outcome.clone());
        self.check(
            matches!(&outcome, Some(Outcome::Pending { waiting_for, within_secs })
                if waiting_for.iter().any(|n| n == "reachable") && *within_secs == LIMIT)
                && sl(&st, Slot::B).state == SlotState::Trying,
            || format!("{NONET} on B must be on trial, waiting for `reachable` within {LIMIT} s: {outcome:?}"),
        )?;
        self.rolled_back_at_limit(
            vm,
            t0,
            LIMIT,
            (
                "reachable",
                &format!("{NONET} never reached the server"),
                Some("none of"),
            ),
        )
    }

    /// v2 reaches the server: `slot await-bless` reports `reachable` passed, B is blessed, and
    /// it boots again as good.
    fn reachable_is_blessed(&mut self, vm: &mut Vm, srv: &ReleaseServer) -> Result<()> {
        self.trial_awaiting_reach(vm, srv, "v2")?;
        let t0 = Instant::now();
        let deadline = Duration::from_secs(LIMIT) + Duration::from_secs(30);
        let st = loop {
            let st = self.status(vm)?;
            if sl(&st, Slot::B).state != SlotState::Trying || t0.elapsed() > deadline {
                break st;
            }
            std::thread::sleep(Duration::from_secs(3));
        };
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        let verdict = st.verdict.as_ref();
        let reach = verdict.and_then(|v| v.checks.iter().find(|c| c.name == "reachable"));
        self.check(
            verdict.is_some_and(|v| v.outcome == Outcome::Blessed) && reach.is_some_and(|c| c.ok),
            || format!("B must be blessed by the `reachable` check: {verdict:?}"),
        )?;
        self.note(format!(
            "{}: v2 reached the server ({}): blessed {:.1}s after its shell was ready",
            vm.name(),
            reach.map(|c| c.detail.as_str()).unwrap_or_default(),
            t0.elapsed().as_secs_f64()
        ));
        let st = self.reboot_into_good(vm, Slot::B, "v2")?;
        self.check_b_blessed_and_booted(&st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the scenario appends to a node's config gives the check its limit and the default
    /// endpoint (none listed: the staged URL).
    #[test]
    fn the_appended_table_is_what_libupgrade_reads() {
        let base = "bootloader = \"syslinux\"\ntries = 1\n[layout]\nkind = \"gpt\"\ndisk = \"/dev/vda\"\nboot_dir = \"/boot\"\n";
        let text = format!("{base}{}\n", reach_table().join("\n"));
        let r = libupgrade::Config::parse(&text)
            .unwrap()
            .reachability
            .expect("a [reachability] table");
        assert_eq!((r.within_secs, r.endpoints.len()), (LIMIT, 0));
    }
}
