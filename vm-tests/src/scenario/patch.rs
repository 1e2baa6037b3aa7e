//! `upgrade-patch`: v1 on A upgrades to v2, which carries per-pair patches from v1 (the
//! images builder makes it with `release create --patch-from`): `--plan-only` says the rootfs
//! comes by patch from v1 and prices it, the stage rebuilds the rootfs from the running slot
//! by that patch (every chunk of its output checked against the signed index; none taken by
//! range), fetching what the plan said, and v2 boots and is blessed.

use bootconfig::Slot;
use libupgrade::state::SlotState;

use super::steps::{sl, CMD};
use super::Scenario;
use crate::error::Result;

impl Scenario {
    pub(super) fn upgrade_patch(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))?;

        let plan = vm.run_ok(
            &format!(
                "k3os-ops upgrade --plan-only --source {}",
                srv.guest_url("v2")
            ),
            CMD,
        )?;
        let rootfs = plan.lines().find(|l| l.trim_start().starts_with("rootfs"));
        self.check(
            rootfs.is_some_and(|l| l.contains("by patch from v1")),
            || format!("--plan-only does not say the rootfs comes by patch from v1:\n{plan}"),
        )?;
        let planned = total_fetch(&plan)
            .ok_or_else(|| self.fail(format!("no total line in --plan-only:\n{plan}")))?;
        let before = srv.body_sent();

        let out = self.upgrade_to(&mut vm, &srv, "v2", "")?;
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with("rootfs by patch from v1"));
        self.check(
            line.is_some_and(|l| !l.contains("fell back") && !l.contains("taken by range")),
            || format!("the upgrade did not rebuild the rootfs by patch from v1 alone:\n{out}"),
        )?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Trying, Some("v2"))?;
        let Some(t) = sl(&st, Slot::B).transfer else {
            return Err(self.fail("slot status records no transfer for B".to_string()));
        };
        let served = srv.body_sent() - before;
        self.check(t.fetched == planned, || {
            format!(
                "the stage fetched {} bytes, --plan-only said {planned}: {t:?}",
                t.fetched
            )
        })?;
        self.check(served <= planned + (512 << 10), || {
            format!("the server sent {served} bytes for {planned} planned + 512 KiB of metadata")
        })?;
        self.note(format!(
            "v1 -> v2 by patch: {}; fetched {} of {} bytes ({:.2}%), the server sent {served}",
            line.unwrap_or_default().trim(),
            t.fetched,
            t.total,
            100.0 * t.fetched as f64 / t.total.max(1) as f64
        ));

        let st = self.reboot_into_good(&mut vm, Slot::B, "v2")?;
        self.check_b_blessed_and_booted(&st)
    }
}

/// The exact byte count of `--plan-only`'s total line (`total   fetch … (N bytes), …`).
fn total_fetch(plan: &str) -> Option<u64> {
    let line = plan.lines().find(|l| l.trim_start().starts_with("total"))?;
    let (_, rest) = line.split_once('(')?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_total_line_gives_the_exact_bytes() {
        let plan = "plan for v2 (generation 2) into slot B:\n  rootfs  fetch     12.0 KiB (12288 bytes), reuse 11.0 MiB of 11.0 MiB, by patch from v1\n  total   fetch     12.0 KiB (12288 bytes), reuse   20.0 MiB of 20.0 MiB\n";
        assert_eq!(super::total_fetch(plan), Some(12288));
        assert_eq!(super::total_fetch("nothing"), None);
    }
}
