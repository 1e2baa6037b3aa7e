//! `report-spool`: a guest reports to a collector on the host through a dropped
//! link, and the spool on its state partition brings every report over once the link is back.
//!
//! Design:
//! - **Where the guest sends.** The test OS reports nowhere unless asked: this scenario writes
//!   `report_url = "http://10.0.2.100/v1/reports"` and `report_site = "vm-site"` into
//!   `/var/lib/k3os-ops/report-to.toml` on the state partition and runs `k3os-node-config`
//!   (images/src/rootfs.rs, `REPORT_TO`), which puts them before the loader's config in this
//!   boot's config and, through init, in every later boot's, so the boot-time confirm (which
//!   reports blessed and rolled back) reports too. QEMU forwards that guest-side address, per
//!   VM, to the host port the node was given (`guestfwd=…-cmd:busybox nc 127.0.0.1
//!   <report_port>`, vm-tests/src/target/mod.rs): concurrent VMs never share a collector.
//! - **Enrolment.** The node id is read from `slot status --json` over the serial console, the
//!   allow-list (`<node id> vm-site`) is written, and `k3os-ops collector serve` (the host build
//!   with the `fleet` feature) is started: it reads the allow-list only when it starts, so it is
//!   started after the enrolment.
//! - **The dropped link.** The collector is stopped (SIGKILL), not the NIC (OVMF drops to its
//!   shell without one, and the release server must stay reachable), before the guest stages.
//! - **The failing trial boot.** `v2-badhealth` (its health check fails, as in `badhealth`)
//!   is what is staged behind the dropped link: its trial boot rolls back to A by itself, so
//!   the rollback's why is the node's own. Then v2 is staged and blessed with the link up.
//!   This order needs no `--allow-downgrade` (a rollback after v2's bless would need a release
//!   newer than v2 that fails, which the test images do not have) and boots as often (4).
//!
//! - **The failure bundle.** The link drops again before the reboot into `v2-badhealth`: its
//!   boot-time confirm rolls back and keeps a failure bundle on the state partition; slot A's
//!   `slot status` says it waits; once the collector is back, the reports go, then the bundle,
//!   which the collector stores with the failed check's output and the kernel log's tail.
//!
//! Checks: while the collector is down the reports wait in the spool (`reports_spooled` in
//! `slot status`) and none is stored; once it is back, the next `slot status` sends them,
//! oldest first, and the database holds them numbered without gaps; a report put back into the
//! spool and sent again is answered as already held and stored once; after the rollback the
//! database has `rolled_back` with the health check's why, after v2's boot `blessed`; the
//! collector's fleet summary (what `release rollout-status --reports` prints) counts v2 blessed
//! and v2-badhealth rolled back.

use std::time::Instant;

use bootconfig::Slot;
use collector::fleet::summarize;
use collector::history::NodeState;
use collector::Row;
use libupgrade::state::SlotState;

use super::bundles::WantedBundle;
use super::steps::{CMD, READY};
use super::Scenario;
use crate::collector::{Collector, CollectorSite};
use crate::error::Result;
use crate::vm::Vm;

/// Where the guest's spool is (the test OS's `state_dir` + libupgrade's spool directory).
const SPOOL: &str = "/var/lib/k3os-ops/report-spool/v1";
/// The site the test OS reports as (images/src/rootfs.rs `REPORT_SITE`).
const SITE: &str = k3os_images::rootfs::REPORT_SITE;
/// The state partition's file that turns the test OS's reporting on (images/src/rootfs.rs).
const REPORT_TO: &str = k3os_images::rootfs::REPORT_TO;
/// The release whose trial boot fails its health check.
const BAD: &str = "v2-badhealth";

impl Scenario {
    pub(super) fn report_spool(&mut self) -> Result<()> {
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut site =
            CollectorSite::new(&self.root, node.report_port, &self.out.join("collector"))?;
        let mut vm = self.boot_v1(&mut node)?;
        self.report_from_now_on(&mut vm)?;
        let id = self.node_id(&mut vm)?;
        site.enrol(&id, SITE)?;
        let col = site.start()?;
        self.note(format!(
            "enrolled node {id} as {SITE}; collector up on 127.0.0.1:{}",
            node.report_port
        ));

        // The link drops before the stage: staged and the trial boot wait in the spool.
        col.stop()?;
        let t0 = Instant::now();
        self.upgrade_to(&mut vm, &srv, BAD, "")?;
        let t1 = Instant::now();
        let spooled = self.spooled(&mut vm)?;
        let status_secs = t1.elapsed().as_secs_f64();
        self.check(spooled >= 2 && site.rows()?.is_empty(), || {
            format!("with the collector down, {spooled} report(s) spooled (expected staged and trial boot) and the database must be empty")
        })?;
        self.note(format!(
            "collector down: upgrade to {BAD} and its sends took {:.1}s, {spooled} report(s) spooled; \
             a `slot status` whose send found no collector took {status_secs:.2}s",
            t0.elapsed().as_secs_f64()
        ));

        // The link is back: the next command sends the spool, oldest first.
        let first = vm.run_ok(&format!("ls {SPOOL} | grep report | head -n 1"), CMD)?;
        let first = first.trim().to_string();
        vm.run_ok(&format!("cp {SPOOL}/{first} /tmp/{first}"), CMD)?;
        let col = site.start()?;
        let left = self.spooled(&mut vm).and_then(|_| self.spooled(&mut vm))?;
        let rows = site.rows()?;
        self.check(left == 0 && rows.len() == spooled, || {
            format!("after the link came back {left} report(s) still spooled and {} stored, expected 0 and {spooled}: {rows:?}", rows.len())
        })?;
        self.check_kinds(&rows, &[("staged", BAD), ("trial_boot", BAD)])?;
        self.note(format!(
            "collector back: {} spooled report(s) arrived, numbers {:?}",
            rows.len(),
            seqs(&rows)
        ));

        // A resend of a report already stored is taken and stored once.
        vm.run_ok(&format!("cp /tmp/{first} {SPOOL}/{first}"), CMD)?;
        let left = self.spooled(&mut vm).and_then(|_| self.spooled(&mut vm))?;
        let again = site.rows()?;
        self.check(left == 0 && again == rows, || {
            format!("the resent report {first}: {left} still spooled, database {again:?}, expected it unchanged: {rows:?}")
        })?;
        self.note(format!(
            "resent {first}: answered as held, stored once ({} rows)",
            again.len()
        ));

        let col = self.rolled_back_reported(&mut vm, &mut site, col)?;
        self.blessed_reported(&mut vm, &srv, &mut site, col)
    }

    /// Reboot into the badhealth trial with the link dropped: it rolls back to A by itself,
    /// keeping a failure bundle of its evidence; once the link is back, `rolled_back` with the
    /// health check's why and then the bundle reach the collector.
    fn rolled_back_reported(
        &mut self,
        vm: &mut Vm,
        site: &mut CollectorSite,
        col: Collector,
    ) -> Result<Collector> {
        col.stop()?;
        self.reboot(vm)?;
        self.expect_boot(vm, Slot::B, BAD)?;
        vm.expect_not("K3OS-ROLLBACK", &["K3OS-CONFIRM ok", "Kernel panic"], READY)?;
        self.count_boot();
        self.expect_boot(vm, Slot::A, "v1")?;
        self.ready(vm)?;
        let v = self.status_value(vm)?;
        let kept = &v["failure_bundles"][0];
        self.check(
            kept["version"] == BAD
                && kept["failure"] == "health_check"
                && kept["delivery"]["state"] == "waiting"
                && site.bundles()?.is_empty(),
            || format!("after the rollback with the link down, one {BAD} bundle must wait: {v}"),
        )?;
        let col = site.start()?;
        self.spooled(vm)?;
        // The badhealth trial's failure bundle: its failed check's output and the kernel
        // log's tail, sealed by the node.
        let want = WantedBundle {
            version: BAD,
            failure: fleet_report::Failure::HealthCheck,
            sections: &["health/", "log/kernel"],
        };
        self.bundle_arrived(site, &want, "after the link came back")?;
        let rows = site.rows()?;
        self.check_kinds(
            &rows,
            &[("staged", BAD), ("trial_boot", BAD), ("rolled_back", BAD)],
        )?;
        let why = rows
            .iter()
            .find_map(|r| {
                r.outcome
                    .why()
                    .filter(|_| r.outcome.kind() == "rolled_back")
            })
            .unwrap_or_default()
            .to_string();
        self.check(why.contains("badhealth") || why.contains("health"), || {
            format!("rolled_back names no failed health check: {why:?}")
        })?;
        self.note(format!(
            "rolled back reported with its why: {}",
            why.escape_debug()
        ));
        Ok(col)
    }

    /// Stage v2 with the link up and boot it: `blessed` reaches the collector, the numbers have
    /// no gap and no duplicate, and the fleet summary counts both releases.
    fn blessed_reported(
        &mut self,
        vm: &mut Vm,
        srv: &crate::server::ReleaseServer,
        site: &mut CollectorSite,
        col: Collector,
    ) -> Result<()> {
        self.upgrade_to(vm, srv, "v2", "")?;
        let st = self.reboot_into_good(vm, Slot::B, "v2")?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))?;
        let left = self.spooled(vm)?;
        let rows = site.rows()?;
        let want = [
            ("staged", BAD),
            ("trial_boot", BAD),
            ("rolled_back", BAD),
            ("staged", "v2"),
            ("trial_boot", "v2"),
            ("blessed", "v2"),
        ];
        self.check_kinds(&rows, &want)?;
        let n = seqs(&rows);
        self.check(left == 0 && n.windows(2).all(|w| w[1] == w[0] + 1), || {
            format!("numbers {n:?} must go up by one with nothing left spooled ({left})")
        })?;
        let f = summarize(&rows, &|_, _| None, 0);
        let count = |v: &str, s: NodeState| {
            f.releases
                .iter()
                .filter(|r| r.version == v)
                .flat_map(|r| &r.waves)
                .map(|w| w.states.get(&s).copied().unwrap_or(0))
                .sum::<u64>()
        };
        self.check(
            count("v2", NodeState::Blessed) == 1 && count(BAD, NodeState::RolledBack) == 1,
            || format!("fleet status must count v2 blessed and {BAD} rolled back: {f:?}"),
        )?;
        let log = col.stop()?;
        self.check(!log.contains("refused"), || {
            format!("the collector refused a report:\n{log}")
        })?;
        self.note(format!(
            "{} reports stored, numbers {n:?}: {}",
            rows.len(),
            rows.iter()
                .map(|r| format!("{} {}", r.outcome.kind(), r.version))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        Ok(())
    }

    /// Turn reporting on in the guest: the report keys into [`REPORT_TO`] on the state
    /// partition, then this boot's config rewritten from them (the shell's `K3OS_OPS_CONFIG`
    /// names that file; init does the same at every later boot), checked by `slot status`
    /// naming where the node reports.
    pub(super) fn report_from_now_on(&mut self, vm: &mut Vm) -> Result<()> {
        let lines: String = k3os_images::rootfs::report_keys()
            .lines()
            .map(|l| format!(" '{l}'"))
            .collect();
        let url = k3os_images::rootfs::REPORT_URL;
        vm.run_ok(
            &format!(
                "printf '%s\\n'{lines} >{REPORT_TO} && k3os-node-config && \
                 k3os-ops slot status | grep -F 'reports to {url}'"
            ),
            CMD,
        )?;
        Ok(())
    }

    /// Turn the node's reports on (this boot and every later one) towards a collector on the
    /// host at `port`, its node id enrolled for the test OS's site.
    pub(super) fn site_collector(
        &mut self,
        vm: &mut Vm,
        port: u16,
    ) -> Result<(CollectorSite, Collector)> {
        self.report_from_now_on(vm)?;
        let id = self.node_id(vm)?;
        let mut site = CollectorSite::new(&self.root, port, &self.out.join("collector"))?;
        site.enrol(&id, SITE)?;
        let col = site.start()?;
        self.note(format!(
            "{}: reports on; node {id} enrolled as {SITE}, collector on 127.0.0.1:{port}",
            vm.name()
        ));
        Ok((site, col))
    }

    /// The node's id (`slot status --json`), the key made at first use.
    pub(super) fn node_id(&mut self, vm: &mut Vm) -> Result<String> {
        let v = self.status_value(vm)?;
        let id = v["node_id"].as_str().unwrap_or_default().to_string();
        self.check(!id.is_empty(), || {
            format!("slot status shows no node id: {v}")
        })?;
        Ok(id)
    }

    /// Run `slot status` (which sends the spool at its end) and return the reports spooled
    /// when it read the status, i.e. before its own send.
    pub(super) fn spooled(&mut self, vm: &mut Vm) -> Result<usize> {
        let v = self.status_value(vm)?;
        v["reports_spooled"]
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| self.fail(format!("slot status shows no reports_spooled: {v}")))
    }

    /// `rows` hold exactly `want` (outcome kind, version) in this order.
    fn check_kinds(&self, rows: &[Row], want: &[(&str, &str)]) -> Result<()> {
        let got: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.outcome.kind(), r.version.as_str()))
            .collect();
        self.check(got == want && rows.iter().all(|r| r.site == SITE), || {
            format!("the collector holds {got:?}, expected {want:?} from site {SITE}: {rows:?}")
        })
    }
}

/// The report numbers in `rows`.
fn seqs(rows: &[Row]) -> Vec<u64> {
    rows.iter().map(|r| r.seq).collect()
}
