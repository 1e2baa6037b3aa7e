//! `site-faults`: the site of `site-upgrade` (the agent pod upgrades the node v1-kube →
//! v2-kube), with three real faults on the way:
//!
//! 1. **A power cut while the stage writes.** The host's channel server is slowed so that the
//!    stage of v2-kube's few MB would last [`STAGE_SECS`]; once it has fetched for
//!    [`STAGE_CUT_AFTER`] (past the stage's first time checkpoint, one a minute: libupgrade's
//!    `net/checkpoint.rs`), QEMU gets SIGKILL, as `powercut` cuts it. The node
//!    powers on into A v1-kube, its kubelet is Ready again, the agent's pod restarts and the
//!    stage resumes: what the channel server sends from the cut to the stage's end is less
//!    than the stage's preview said the whole stage fetches.
//! 2. **A power cut during the drain.** Once the Node's phase is `Draining` (the workload's
//!    pod evicted under its PodDisruptionBudget with a 10 s grace period: a window of about
//!    20 s), SIGKILL again. The node comes back on A, cordoned and holding its claim; the
//!    agent drains again to the end (`Drained`), activates and reboots.
//! 3. **The API server down while the node reboots into B.** Once the agent's reboot has
//!    taken the old kernel down (`reboot: Restarting system`), the host's kube-apiserver is
//!    stopped (SIGKILL; etcd keeps the state) and started again [`API_DOWN`] later, on the same
//!    address: B boots, its kubelet and the agent's pod start without an API server.
//!
//! Expected each time: the node back Ready on its good slot and the agent resuming; at the end
//! B blessed (`slot status`), the Node Ready, uncordoned and `UpToDate`, the workload Ready,
//! and no 403 for the agent's ServiceAccount in the audit log (both API server runs append to
//! it). A step that does not come within [`STEP`] fails with the guest's logs.

use std::path::Path;
use std::time::{Duration, Instant};

use bootconfig::Slot;
use kube_testenv::TestEnv;
use serde_json::Value;

use super::after::agent_audit;
use super::manifests::{self, TARGET, WEB};
use super::{SiteNode, NODE, POD, POLL, STEP};
use crate::error::Result;
use crate::scenario::steps::Node;
use crate::scenario::Scenario;
use crate::server::ReleaseServer;
use crate::target::kube_assets;
use crate::vm::Vm;

/// Bytes per second per response until the stage preview says how much the stage fetches.
const STAGE_RATE: u64 = 24 * 1024;
/// Then the rate is set so that the whole stage would take this long.
const STAGE_SECS: u64 = 200;
/// How long the stage fetches before the first power cut: past its first time checkpoint
/// (one a minute), well before its end.
const STAGE_CUT_AFTER: Duration = Duration::from_secs(90);
/// How long the API server stays down while the node reboots into B.
const API_DOWN: Duration = Duration::from_secs(60);
/// The channel's `rebootTimeout`: room for the outage and TCG boots.
const REBOOT_TIMEOUT: &str = "20m";

/// The Node as one poll sees it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct NodeNow {
    /// `k3os.io/update-phase`.
    phase: String,
    /// `spec.unschedulable`.
    cordoned: bool,
    /// The Ready condition is `True`.
    ready: bool,
    /// The stage preview's `fetch` (bytes the stage fetches), when the Node carries one.
    fetch: Option<u64>,
}

/// The Node's JSON, read as [`NodeNow`].
fn node_now(node: &Value) -> NodeNow {
    let ann = &node["metadata"]["annotations"];
    let preview: Option<Value> = ann["k3os.io/update-stage-preview"]
        .as_str()
        .and_then(|t| serde_json::from_str(t).ok());
    NodeNow {
        phase: ann["k3os.io/update-phase"]
            .as_str()
            .unwrap_or_default()
            .into(),
        cordoned: node["spec"]["unschedulable"].as_bool().unwrap_or(false),
        ready: node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        fetch: preview.and_then(|p| p["fetch"].as_u64()),
    }
}

/// The bytes of the ranges (206 answers) among the channel server's requests (the length
/// answered, logged before the body is sent): what a stage asks for of its artifacts, without
/// the metadata and indexes, which are read whole.
fn ranged_bytes(served: &[testkit::server::Served]) -> u64 {
    served
        .iter()
        .filter(|r| r.status == 206)
        .map(|r| r.bytes)
        .sum()
}

/// The guest across power cuts: its node and the QEMU of the current power-on.
struct Guest {
    node: Node,
    vm: Vm,
}

impl Scenario {
    pub(in crate::scenario) fn site_faults(&mut self) -> Result<()> {
        let assets = kube_assets(&self.root);
        let kubectl = assets.join("kubectl");
        let mut env = self.control_plane(&assets, &kubectl, true)?;
        let SiteNode {
            srv,
            vm,
            node,
            booted,
        } = self.site_node(&env, TARGET)?;
        let mut g = Guest { node, vm };
        let r = self.faults_site(&mut g, &mut env, &kubectl, booted, &srv);
        r.map_err(|e| self.site_logs(&mut g.vm, e))
    }

    fn faults_site(
        &mut self,
        g: &mut Guest,
        env: &mut TestEnv,
        kubectl: &Path,
        booted: Duration,
        srv: &ReleaseServer,
    ) -> Result<()> {
        self.kubelet_joins(&mut g.vm, env, kubectl, booted)?;
        self.deploy_agent(env, kubectl)?;
        self.site_workload(env, kubectl)?;
        srv.set_rate(STAGE_RATE);
        let t0 = Instant::now();
        let channel = manifests::update_channel(&srv.guest_root(), TARGET, REBOOT_TIMEOUT);
        self.apply(env, kubectl, "updatechannel.yaml", &channel)?;
        let (fetch, at_cut) = self.cut_while_staging(g, env, kubectl, srv)?;
        srv.set_rate(0);
        self.back_on_a(g, env, kubectl, "the stage's power cut")?;
        let staged = self.wait_node(env, kubectl, "the stage resumed and done", |n| {
            n.phase == "Draining" || n.cordoned
        })?;
        let log = srv.requests();
        let (before, after) = log.split_at(at_cut.min(log.len()));
        let (before, after) = (ranged_bytes(before), ranged_bytes(after));
        self.check(after < fetch, || {
            format!("the stage started over: {after} bytes of ranges asked for after the cut ({before} before it), the whole stage fetches {fetch}")
        })?;
        self.note(format!(
            "stage resumed: {after} bytes of ranges asked for after the cut, {before} before it, the one cut short included (the preview: {fetch} to fetch); done {staged:.1}s after A was Ready"
        ));
        self.cut_while_draining(g, env, kubectl)?;
        self.back_on_a(g, env, kubectl, "the drain's power cut")?;
        self.api_down_while_rebooting(g, env, kubectl)?;
        self.faults_blessed(g, env, kubectl, t0)
    }

    /// Wait for the stage to fetch for [`STAGE_CUT_AFTER`], then cut the power. Returns the
    /// preview's bytes to fetch and how many requests the channel server had answered then.
    fn cut_while_staging(
        &mut self,
        g: &mut Guest,
        env: &mut TestEnv,
        kubectl: &Path,
        srv: &ReleaseServer,
    ) -> Result<(u64, usize)> {
        let before = srv.body_sent();
        // The preview (bytes to fetch) and the bytes sent when it was first seen: what the
        // channel server sends after it is the stage's.
        let mut preview: Option<(u64, u64)> = None;
        let mut first_byte: Option<Instant> = None;
        let t0 = Instant::now();
        loop {
            if let Ok(n) = self.read_node(env, kubectl) {
                if n.cordoned || n.phase == "Draining" {
                    return Err(self.fail(format!(
                        "the stage ended before the power cut ({} bytes sent): slow the channel server more",
                        srv.body_sent() - before
                    )));
                }
                if preview.is_none() {
                    preview = n.fetch.map(|f| (f, srv.body_sent()));
                    if let Some(f) = n.fetch {
                        srv.set_rate((f / STAGE_SECS).max(4096));
                    }
                }
            }
            let fetch = preview.map(|(f, _)| f);
            if let (None, Some((_, at))) = (first_byte, preview) {
                if srv.body_sent() > at {
                    first_byte = Some(Instant::now());
                }
            }
            match (fetch, first_byte) {
                (Some(f), Some(t)) if t.elapsed() >= STAGE_CUT_AFTER => {
                    let sent = srv.body_sent() - before;
                    g.vm.cut_power()?;
                    let at_cut = srv.requests().len();
                    self.note(format!(
                        "power cut while staging: {sent} bytes sent, the stage's for {:.1}s (the preview: {f} to fetch, at {} B/s per response)",
                        t.elapsed().as_secs_f64(),
                        (f / STAGE_SECS).max(4096)
                    ));
                    return Ok((f, at_cut));
                }
                _ if t0.elapsed() > STEP => {
                    return Err(self.fail(format!(
                        "no stage seen within {}s (preview {fetch:?}, {} bytes sent)",
                        STEP.as_secs(),
                        srv.body_sent() - before
                    )))
                }
                _ => std::thread::sleep(POLL),
            }
        }
    }

    /// Wait for the Node's phase `Draining` and cut the power.
    fn cut_while_draining(
        &mut self,
        g: &mut Guest,
        env: &mut TestEnv,
        kubectl: &Path,
    ) -> Result<()> {
        let t = self.wait_node(env, kubectl, "the drain", |n| n.phase == "Draining")?;
        g.vm.cut_power()?;
        self.note(format!(
            "power cut while draining ({t:.1}s after the wait began)"
        ));
        Ok(())
    }

    /// Power the node on after a cut: A v1-kube, the kubelet Ready, the agent pod running.
    fn back_on_a(
        &mut self,
        g: &mut Guest,
        env: &mut TestEnv,
        kubectl: &Path,
        after: &str,
    ) -> Result<()> {
        let vm = self.power_on(&mut g.node)?;
        g.vm = vm;
        let booted = g.vm.elapsed();
        self.expect_boot(&mut g.vm, Slot::A, "v1-kube")?;
        self.kubelet_joins(&mut g.vm, env, kubectl, booted)?;
        self.note(format!(
            "{}: after {after}, back on A v1-kube and Ready",
            g.vm.name()
        ));
        Ok(())
    }

    /// At the agent's reboot into B, stop the API server; start it again [`API_DOWN`] later.
    fn api_down_while_rebooting(
        &mut self,
        g: &mut Guest,
        env: &mut TestEnv,
        kubectl: &Path,
    ) -> Result<()> {
        g.vm.expect_not("K3OS-SHUTDOWN reboot", &["Kernel panic"], STEP)?;
        // Once the old kernel has gone down: an API server stopped while the TCG guest was
        // still shutting down left it in soft lockups (twice; measured, see benchmarks.md).
        g.vm.expect_not("reboot: Restarting system", &["Kernel panic"], STEP)?;
        env.stop_apiserver();
        let down = Instant::now();
        self.count_boot();
        self.note(format!(
            "{}: the agent rebooted the node; kube-apiserver stopped",
            g.vm.name()
        ));
        self.expect_boot(&mut g.vm, Slot::B, TARGET)?;
        let b = down.elapsed();
        std::thread::sleep(API_DOWN.saturating_sub(b));
        env.start_apiserver();
        env.wait_ready(kubectl, Duration::from_secs(120))
            .map_err(|e| self.fail(e))?;
        self.note(format!(
            "kube-apiserver down {:.1}s (B booted {:.1}s into it), ready again",
            down.elapsed().as_secs_f64(),
            b.as_secs_f64()
        ));
        Ok(())
    }

    /// The end: B blessed, the Node Ready, uncordoned, `UpToDate`, the workload Ready, the
    /// drain completed (`Drained`) and no 403 in the audit log.
    fn faults_blessed(
        &mut self,
        g: &mut Guest,
        env: &mut TestEnv,
        kubectl: &Path,
        t0: Instant,
    ) -> Result<()> {
        let up = self.wait_node(env, kubectl, "B blessed and the Node uncordoned", |n| {
            n.phase == "UpToDate" && n.ready && !n.cordoned
        })?;
        let web = self.wait_api(env, kubectl, POD, "the workload Ready again", |k| {
            let jp = "-o=jsonpath={.status.readyReplicas}";
            k(&["get", "deploy", WEB, jp]).map(|o| o.trim() == "1")
        })?;
        let events = self.agent_events(env, kubectl, "UpdateSucceeded")?;
        let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
        let drained_after_cut = reasons
            .iter()
            .rposition(|r| *r == "Draining")
            .is_some_and(|d| reasons[d..].contains(&"Drained"));
        self.check(
            drained_after_cut && reasons.contains(&"UpdateSucceeded"),
            || format!("the drain must complete and the update succeed: {reasons:?}"),
        )?;
        let log = std::fs::read_to_string(env.audit_log()).unwrap_or_default();
        let a = agent_audit(&log);
        self.check(a.requests > 0 && a.forbidden.is_empty(), || {
            format!("the agent must be refused nothing: {:?}", a.forbidden)
        })?;
        self.note(format!(
            "api: UpToDate, Ready, uncordoned {up:.1}s after the API server was back; {WEB} Ready {web:.1}s later; {} agent requests, no 403; Events: {}",
            a.requests,
            reasons.join(", ")
        ));
        self.note(format!(
            "figures (TCG): UpdateChannel applied → blessed through two power cuts and a {}s API outage: {:.1}s",
            API_DOWN.as_secs(),
            t0.elapsed().as_secs_f64()
        ));
        self.node_says_blessed(&mut g.vm)
    }

    /// The Node now, or what kubectl said.
    fn read_node(&self, env: &TestEnv, kubectl: &Path) -> std::result::Result<NodeNow, String> {
        let text = env.kubectl(kubectl, &["get", "node", NODE, "-o", "json"])?;
        let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok(node_now(&v))
    }

    /// Poll the Node until `done`, at most [`STEP`]; the seconds it took. A failed phase
    /// fails at once.
    fn wait_node(
        &mut self,
        env: &mut TestEnv,
        kubectl: &Path,
        what: &str,
        done: impl Fn(&NodeNow) -> bool,
    ) -> Result<f64> {
        let t0 = Instant::now();
        let mut last = NodeNow::default();
        loop {
            if let Some(gone) = env.exited() {
                return Err(self.fail(format!("waiting for {what}: {gone}")));
            }
            if let Ok(n) = self.read_node(env, kubectl) {
                if super::FAILED.contains(&n.phase.as_str()) {
                    return Err(self.fail(format!("waiting for {what}: phase {}", n.phase)));
                }
                if done(&n) {
                    return Ok(t0.elapsed().as_secs_f64());
                }
                last = n;
            }
            if t0.elapsed() > STEP {
                return Err(self.fail(format!(
                    "{what}: not within {}s; the Node last: {last:?}",
                    STEP.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_read_with_its_phase_cordon_ready_and_preview() {
        let n = serde_json::json!({
            "metadata": {"annotations": {
                "k3os.io/update-phase": "Staging",
                "k3os.io/update-stage-preview": "{\"format\":1,\"version\":\"v2-kube\",\"fetch\":4300000,\"reuse\":1}"
            }},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        assert_eq!(
            node_now(&n),
            NodeNow {
                phase: "Staging".into(),
                cordoned: true,
                ready: true,
                fetch: Some(4_300_000),
            }
        );
        assert_eq!(node_now(&serde_json::json!({})), NodeNow::default());
    }

    #[test]
    fn only_ranges_count_as_the_stages_bytes() {
        let served = |path: &str, range, status, bytes| testkit::server::Served {
            method: "GET".into(),
            path: path.into(),
            range,
            status,
            bytes,
        };
        let lines = [
            served("/timestamp.json", None, 200, 900),
            served("/v2-kube/rootfs.squashfs", Some((0, Some(99))), 206, 100),
            served("/v2-kube/rootfs.squashfs", Some((100, Some(149))), 206, 50),
            served("/v2-kube/nope", Some((0, None)), 404, 0),
        ];
        assert_eq!(ranged_bytes(&lines), 150);
        assert_eq!(ranged_bytes(&[]), 0);
    }
}
