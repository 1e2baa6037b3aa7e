//! `site-rollback`: the site of `site-upgrade`, with the UpdateChannel pinning v2-kubenotready,
//! whose kubelet config does not load. The agent stages, drains and reboots into B; B boots on
//! trial (pending on the agent's Node-Ready), its kubelet exits (`K3OS-KUBE-FAILED kubelet`), so
//! no Node Ready and no agent pod on B: `slot await-bless` on the node rolls back at the limit
//! the activation set ([`LIMIT`]) and reboots into A. On v1-kube the kubelet is Ready again and
//! the agent's pod finishes the failed update: the Node uncordoned with phase `Failed`, the
//! claim released, the failure in the channel's status with its why, the channel paused
//! (`maxFailures: 1`), the Event `HealthCheckFailed`; `slot status` says B is bad and why.
//!
//! The limit is the channel's `rebootTimeout` ([`REBOOT_TIMEOUT`], short here): the agent's
//! activation passes it to the node, nothing is added to it, so the rollback comes within
//! [`LIMIT`] of B's boot (checked: before the former 10-minute floor).
//!
//! The node reports to a collector on the host, as in `report-spool`: reporting turned on in
//! v1-kube (the state partition's report keys, every later boot too), the node id enrolled
//! for the test OS's site, `k3os-ops collector serve` on the node's report port. The node's
//! own `rolled_back` report, with the missing `node-ready` as its why, must be stored, and the
//! collector's fleet summary (what `release rollout-status --reports` prints) must count
//! v2-kubenotready rolled back on this node.
//!
//! The failed attempt's failure bundle comes home through the agent: B's `await-bless`
//! keeps it on the state partition when it rolls back, and sends none (a slot that is not
//! good never sends); A's boot-time `slot confirm` runs before eth0 is up; so the first
//! sender on A is the agent's pod, whose idle ticks send kept bundles inside the channel's
//! stage windows and byte quota and say so with the Event `FailureBundlesSent`. The scenario
//! checks that Event and the bundle stored by the collector (v2-kubenotready, awaited check
//! timed out, the checks' output and kubelet's log tail) before the harness runs any k3os-ops
//! command on A.

use std::path::Path;
use std::time::{Duration, Instant};

use bootconfig::Slot;
use kube_testenv::TestEnv;
use libupgrade::state::SlotState;
use serde_json::Value;

use super::manifests::{self, AGENT_NS, CHANNEL};
use super::{after, NODE, POD, STEP};
use crate::collector::{Collector, CollectorSite};
use crate::error::Result;
use crate::scenario::bundles::WantedBundle;
use crate::scenario::steps::{sl, CMD, READY};
use crate::scenario::Scenario;
use crate::server::ReleaseServer;
use crate::target::kube_assets;
use crate::vm::Vm;

/// The release whose kubelet never starts (images/src/kube.rs, `kubelet_config`).
const BROKEN: &str = "v2-kubenotready";
/// The channel's `rebootTimeout`: the trial boot waits this long for Node-Ready. Room for a
/// TCG boot of B and its kubelet's start (under a minute at load 10–12, benchmarks.md).
const REBOOT_TIMEOUT: &str = "3m";
/// That wait.
const LIMIT: Duration = Duration::from_secs(180);
/// The agent's limit before the channel's `rebootTimeout` governed: its Ready wait + 5 min.
const FORMER_FLOOR: Duration = Duration::from_secs(600);
/// From B's boot to its kubelet's exit (containerd, the import, the kubelet's start): before
/// the limit passes.
const KUBELET_FAILS: Duration = LIMIT;
/// The agent's Event for failure bundles it delivered (agent/reconcile/actions.rs).
const SENT: &str = "FailureBundlesSent";

impl Scenario {
    pub(in crate::scenario) fn site_rollback(&mut self) -> Result<()> {
        let assets = kube_assets(&self.root);
        let kubectl = assets.join("kubectl");
        let mut env = self.control_plane(&assets, &kubectl, true)?;
        let super::SiteNode {
            srv,
            mut vm,
            node,
            booted,
        } = self.site_node(&env, BROKEN)?;
        let r = self
            .site_collector(&mut vm, node.report_port)
            .and_then(|(site, col)| {
                self.rollback_site(&mut vm, &mut env, &kubectl, booted, srv, &site)?;
                self.collector_has_rollback(&mut vm, &site, col)
            });
        r.map_err(|e| self.site_logs(&mut vm, e))
    }

    /// Back on A: what the node spooled is sent (`slot status`), and the collector holds its
    /// `rolled_back` of [`BROKEN`] with the missing `node-ready` as why; its fleet summary
    /// counts the node rolled back; no report was refused.
    fn collector_has_rollback(
        &mut self,
        vm: &mut Vm,
        site: &CollectorSite,
        col: Collector,
    ) -> Result<()> {
        let left = self.spooled(vm).and_then(|_| self.spooled(vm))?;
        let rows = site.rows()?;
        let kinds: Vec<String> = rows
            .iter()
            .map(|r| format!("{} {}", r.outcome.kind(), r.version))
            .collect();
        let why = rows
            .iter()
            .filter(|r| r.outcome.kind() == "rolled_back" && r.version == BROKEN)
            .find_map(|r| r.outcome.why())
            .unwrap_or_default()
            .to_string();
        self.check(left == 0 && why.contains("node-ready"), || {
            format!(
                "the collector must hold rolled_back {BROKEN} naming node-ready ({left} report(s) still spooled): {kinds:?}, why {why:?}"
            )
        })?;
        let f = collector::fleet::summarize(&rows, &|_, _| None, 0);
        let rolled_back: u64 = f
            .releases
            .iter()
            .filter(|r| r.version == BROKEN)
            .flat_map(|r| &r.waves)
            .map(|w| {
                w.states
                    .get(&collector::history::NodeState::RolledBack)
                    .copied()
                    .unwrap_or(0)
            })
            .sum();
        self.check(rolled_back == 1, || {
            format!("the fleet summary must count {BROKEN} rolled back on one node: {f:?}")
        })?;
        let log = col.stop()?;
        self.check(!log.contains("refused"), || {
            format!("the collector refused a report:\n{log}")
        })?;
        self.note(format!(
            "collector: {} report(s): {}; rolled_back {BROKEN}: {}",
            rows.len(),
            kinds.join(", "),
            why.escape_debug()
        ));
        Ok(())
    }

    /// Everything after v1-kube's `K3OS-BOOTED`, up to the node's own `slot status` (the
    /// harness's first k3os-ops command on A after the rollback).
    fn rollback_site(
        &mut self,
        vm: &mut Vm,
        env: &mut TestEnv,
        kubectl: &Path,
        booted: Duration,
        srv: ReleaseServer,
        site: &CollectorSite,
    ) -> Result<()> {
        self.kubelet_joins(vm, env, kubectl, booted)?;
        self.deploy_agent(env, kubectl)?;
        let t0 = Instant::now();
        let channel = manifests::update_channel(&srv.guest_root(), BROKEN, REBOOT_TIMEOUT);
        self.apply(env, kubectl, "updatechannel.yaml", &channel)?;
        vm.expect_not("K3OS-SHUTDOWN reboot", &["Kernel panic"], STEP)?;
        self.count_boot();
        drop(srv);
        self.note(format!(
            "{}: the agent rebooted the node {:.1}s after the channel was applied; the channel server stopped",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        self.expect_boot(vm, Slot::B, BROKEN)?;
        let b = Instant::now();
        vm.expect_not(
            "K3OS-CONFIRM pending",
            &["K3OS-CONFIRM ok", "K3OS-CONFIRM failed", "Kernel panic"],
            READY,
        )?;
        let failed = vm.expect("K3OS-KUBE-FAILED kubelet", KUBELET_FAILS)?;
        self.note(format!(
            "{}: B pending, {failed} {:.1}s after its boot",
            vm.name(),
            b.elapsed().as_secs_f64()
        ));
        vm.expect_not("K3OS-SHUTDOWN reboot", &["Kernel panic"], LIMIT + READY)?;
        let rolled = b.elapsed();
        self.check(rolled < FORMER_FLOOR, || {
            format!(
                "the rollback came {}s after B's boot: the channel's rebootTimeout {REBOOT_TIMEOUT} must be the limit, not the former {}s floor",
                rolled.as_secs(),
                FORMER_FLOOR.as_secs()
            )
        })?;
        self.count_boot();
        self.expect_boot(vm, Slot::A, "v1-kube")?;
        self.note(format!(
            "{}: await-bless rolled back and rebooted into A {:.1}s after B's boot (limit: rebootTimeout {REBOOT_TIMEOUT})",
            vm.name(),
            rolled.as_secs_f64(),
        ));
        self.agent_finishes_rollback(env, kubectl)?;
        self.agent_sent_bundle(env, kubectl, site)?;
        self.node_says_rolled_back(vm)
    }

    /// Back on A, before the harness runs any k3os-ops command there (`slot status` sends
    /// bundles too): the agent's pod sent the failed attempt's bundle from its idle tick, said
    /// by its Event `FailureBundlesSent`, and the collector holds it: [`BROKEN`]'s awaited
    /// check timed out, with the checks' output and kubelet's log tail. Nothing else on the
    /// node sends before this: B's `await-bless` rolled back (a slot not good sends none) and
    /// A's boot-time `slot confirm` runs before eth0 is up.
    fn agent_sent_bundle(
        &mut self,
        env: &TestEnv,
        kubectl: &Path,
        site: &CollectorSite,
    ) -> Result<()> {
        let events = self.agent_events(env, kubectl, SENT)?;
        let Some(sent) = events.iter().find(|e| e.reason == SENT) else {
            let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
            return Err(self.fail(format!(
                "the agent sent no failure bundle (no Event {SENT}): {reasons:?}"
            )));
        };
        self.note(format!("Event {SENT}: {}", sent.note));
        let want = WantedBundle {
            version: BROKEN,
            failure: fleet_report::Failure::AwaitedTimeout,
            sections: &["health/", "log/kubelet"],
        };
        self.bundle_arrived(site, &want, "by the agent's pod on A")
            .map(drop)
    }

    /// Back on A: the Node Ready, uncordoned, phase `Failed`; the channel without the claim,
    /// with the failure and its why, paused; the Event `HealthCheckFailed`; no 403.
    fn agent_finishes_rollback(&mut self, env: &mut TestEnv, kubectl: &Path) -> Result<()> {
        let back = self.wait_api(
            env,
            kubectl,
            STEP,
            "the Node Ready on A, uncordoned, Failed",
            |k| {
                let n: Value = serde_json::from_str(&k(&["get", "node", NODE, "-o", "json"])?)
                    .map_err(|e| e.to_string())?;
                let ready = n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let phase = n["metadata"]["annotations"]["k3os.io/update-phase"].as_str();
                Ok(ready
                    && !n["spec"]["unschedulable"].as_bool().unwrap_or(false)
                    && matches!(phase, Some("Failed" | "Paused")))
            },
        )?;
        let get = ["-n", AGENT_NS, "get", "upchan", CHANNEL, "-o", "json"];
        let released = self.wait_api(
            env,
            kubectl,
            POD,
            "the claim released, the failure recorded",
            |k| {
                let c: Value = serde_json::from_str(&k(&get)?).map_err(|e| e.to_string())?;
                let st = &c["status"];
                Ok(st["slots"].as_array().is_none_or(|s| s.is_empty())
                    && st["failures"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|f| f["node"] == NODE))
            },
        )?;
        let c: Value = serde_json::from_str(&env.kubectl(kubectl, &get).map_err(|e| self.fail(e))?)
            .map_err(|e| self.fail(e.to_string()))?;
        let why: Vec<String> = c["status"]["failures"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| format!("{} {}: {}", f["node"], f["version"], f["reason"]).replace('"', ""))
            .collect();
        let paused = c["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|x| x["type"] == "Paused" && x["status"] == "True");
        self.check(
            paused && why.iter().any(|w| w.contains(BROKEN) && w.contains("node-ready")),
            || format!("the channel must be paused with the failure of {BROKEN} naming node-ready: {c}"),
        )?;
        self.note(format!(
            "api: Node Ready on v1-kube, uncordoned, phase Failed {back:.1}s after A booted; the claim released {released:.1}s later; the channel paused; failures: {}",
            why.join("; ")
        ));
        // The agent's reason: HealthCheckFailed when the boot assessment recorded the failed
        // checks (here: node-ready not reported), RolledBack when the loader fell back.
        let events = self.agent_events(env, kubectl, "HealthCheckFailed")?;
        let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
        let told = events
            .iter()
            .find(|e| e.reason == "HealthCheckFailed" || e.reason == "RolledBack");
        let Some(told) = told else {
            return Err(self.fail(format!(
                "no Event HealthCheckFailed or RolledBack: {reasons:?}"
            )));
        };
        self.note(format!("Event {}: {}", told.reason, told.note));
        self.note(format!(
            "the Node's Events in order: {}",
            reasons.join(", ")
        ));
        let log = std::fs::read_to_string(env.audit_log()).unwrap_or_default();
        let a = after::agent_audit(&log);
        self.check(a.requests > 0 && a.forbidden.is_empty(), || {
            format!("the agent must be refused nothing: {:?}", a.forbidden)
        })?;
        Ok(())
    }

    /// `slot status` on the node: A booted and good, B bad, the missing Node-Ready as why.
    fn node_says_rolled_back(&mut self, vm: &mut Vm) -> Result<()> {
        vm.wait_shell(CMD)?;
        let st = self.status(vm)?;
        let b = sl(&st, Slot::B);
        let why = b
            .last_decision
            .as_ref()
            .map(|d| d.why.clone())
            .unwrap_or_default();
        self.check(
            st.booted == Some(Slot::A)
                && sl(&st, Slot::A).state == SlotState::Good
                && b.state == SlotState::Bad
                && why.contains("node-ready"),
            || format!("A must run good and B be bad for the missing node-ready: {st:?}"),
        )?;
        self.note(format!(
            "{}: slot status: A good v1-kube; B bad: {why}",
            vm.name()
        ));
        Ok(())
    }
}
