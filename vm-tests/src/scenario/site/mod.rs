//! `site-upgrade`: a real site, end to end. On the host: etcd, kube-apiserver (audit log on),
//! controller manager and scheduler (crate `kube-testenv`), and a signed channel of v1-kube and
//! v2-kube served over HTTP. The `-kube` disk boots v1-kube and joins as in `kube-node-joins`;
//! then, as a user does, `kubectl apply -k` of an overlay over `k3os-ops/deploy` (the agent's
//! image never pulled: every `-kube` release carries it; the API server's address for a node
//! without kube-proxy), a workload Deployment with a PodDisruptionBudget, an app whose image
//! only v2-kube's payload carries, and an UpdateChannel pinning v2-kube.
//!
//! Expected, judged by [`timeline::judge`]: the agent pod stages v2-kube before it cordons (the
//! stage preview on the Node while it is schedulable), claims, cordons, drains with real
//! evictions, activates and reboots the guest; the host's channel server is stopped then. B
//! boots (the trial boot pending on the agent's Node-Ready), containerd imports v2-kube's
//! images, the kubelet reports Ready, the agent's restarted pod confirms: B blessed, the Node
//! uncordoned, the v2-only app Running. Checked as a user reads it: `kubectl get upchan` (the
//! printer columns), the channel's conditions, the Node's Events; the audit log holds the
//! evictions and no 403 for the agent's ServiceAccount; `slot status` on the node. A guest
//! stuck at a step fails within [`STEP`] with the console and the guest's logs.
mod after;
mod faults;
mod manifests;
mod rollback;
mod timeline;

use std::path::Path;
use std::time::{Duration, Instant};

use bootconfig::Slot;
use kube_testenv::TestEnv;
use libupgrade::trust::publish;
use serde_json::Value;

use super::kube::NODE;
use super::rotation::{days, link_release, ROOT1_KEYS};
use super::Scenario;
use crate::error::{Error, Result};
use crate::scenario::steps::Node;
use crate::server::ReleaseServer;
use crate::target::kube_assets;
use crate::vm::Vm;
use manifests::{AGENT_LABEL, AGENT_NS, APP, APP_IMAGE, TARGET, WEB};
use timeline::{AgentEvent, Sample};

/// The agent pod Ready after `kubectl apply -k`; a workload pod Ready or Running.
const POD: Duration = Duration::from_secs(300);
/// No change on the Node, the workload or the console for this long fails the upgrade.
const STEP: Duration = Duration::from_secs(900);
/// From the UpdateChannel applied to the node blessed and uncordoned.
const UPGRADE: Duration = Duration::from_secs(3600);
/// How often the upgrade is observed.
const POLL: Duration = Duration::from_secs(2);
/// Phases after which the upgrade cannot succeed any more.
const FAILED: [&str; 7] = [
    "StageFailed",
    "DrainFailed",
    "ActivateFailed",
    "Aborted",
    "RollingBack",
    "Failed",
    "Unhealthy",
];
/// The API server's address as the guest sees the host (QEMU user networking), which the
/// overlay gives the agent pod.
const API_HOST: &str = "10.0.2.2";
/// The agent's ServiceAccount, as the API server names its user.
const AGENT_USER: &str = "system:serviceaccount:k3os-system:k3os-ops-agent";

impl Scenario {
    pub(super) fn site_upgrade(&mut self) -> Result<()> {
        let assets = kube_assets(&self.root);
        let kubectl = assets.join("kubectl");
        let mut env = self.control_plane(&assets, &kubectl, true)?;
        let SiteNode {
            srv,
            mut vm,
            booted,
            ..
        } = self.site_node(&env, TARGET)?;
        let r = self.site(&mut vm, &mut env, &kubectl, booted, srv);
        r.map_err(|e| self.site_logs(&mut vm, e))
    }

    /// The channel of v1-kube and `target` served, the node powered on with its seed and
    /// booted into A v1-kube.
    fn site_node(&mut self, env: &TestEnv, target: &str) -> Result<SiteNode> {
        let chan = self.out.join("channel");
        self.publish_site_channel(&chan, target)?;
        let srv = ReleaseServer::start(&chan, 0)?;
        let seed = self.seed_disk(env)?;
        let mut node = self.node_from("node", &self.target.kube_disk(&self.root))?;
        node.attach_seed(&seed);
        node.resize(3072, 2);
        let mut vm = self.power_on(&mut node)?;
        let booted = vm.elapsed();
        self.expect_boot(&mut vm, Slot::A, "v1-kube")?;
        Ok(SiteNode {
            srv,
            vm,
            node,
            booted,
        })
    }

    /// Everything after v1-kube's `K3OS-BOOTED`.
    fn site(
        &mut self,
        vm: &mut Vm,
        env: &mut TestEnv,
        kubectl: &Path,
        booted: Duration,
        srv: ReleaseServer,
    ) -> Result<()> {
        self.kubelet_joins(vm, env, kubectl, booted)?;
        self.deploy_agent(env, kubectl)?;
        self.site_workload(env, kubectl)?;
        let t0 = Instant::now();
        let channel = manifests::update_channel(&srv.guest_root(), TARGET, "20m");
        self.apply(env, kubectl, "updatechannel.yaml", &channel)?;
        let samples = self.watch_upgrade(vm, env, kubectl, srv, t0)?;
        let events = self.agent_events(env, kubectl, "UpdateSucceeded")?;
        let changes: Vec<String> = timeline::transitions(&samples)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let f = timeline::judge(&samples, &events)
            .map_err(|e| self.fail(format!("{e}\nwhat was seen:\n{}", changes.join("\n"))))?;
        self.note(format!(
            "the Node's Events in order: {}",
            f.events.join(", ")
        ));
        self.note(format!(
            "figures (TCG): claim to blessed {:.1}s; stage {:.1}s, drain {:.1}s (agent clock); \
             reboot {}s, B booted to the Node Ready {}s (host, ±{}s); confirm {:.1}s; \
             {WEB} had no Ready replica for {}s",
            f.claim_to_blessed,
            f.stage,
            f.drain,
            f.reboot,
            f.kubelet_ready,
            POLL.as_secs(),
            f.confirm,
            f.web_down
        ));
        self.after_upgrade(vm, env, kubectl)
    }

    /// The scratch channel: v1-kube and `target` (hard-linked), signed by the images' root 1
    /// keys every image trusts (targets, snapshot, timestamp), no rollout: every node may take
    /// either.
    fn publish_site_channel(&mut self, chan: &Path, target: &str) -> Result<()> {
        let releases = self.target.releases(&self.root);
        for v in ["v1-kube", target] {
            link_release(&releases.join(v), &chan.join(v))?;
        }
        let root1 = self.target.channel_root_dir(&self.root);
        for f in ["1.root.json", "root.json"] {
            std::fs::copy(root1.join(f), chan.join(f))
                .map_err(|e| Error::io("copy channel root", root1.join(f), e))?;
        }
        let keys = self.target.channel_keys(&self.root);
        let load = |name: &str| {
            let p = keys.join(format!("{name}.key"));
            libupgrade::signing::load_secret_key(&p)
                .map_err(|e| self.fail(format!("{}: {e}", p.display())))
        };
        let targets = load(ROOT1_KEYS[1])?;
        let online = [load(ROOT1_KEYS[2])?, load(ROOT1_KEYS[3])?];
        let failed = |e: libupgrade::trust::TrustError| {
            self.fail(format!("publishing the channel {}: {e}", chan.display()))
        };
        publish::write_targets(chan, &[targets], days(90)).map_err(failed)?;
        publish::write_timestamp(chan, &online, days(30), days(7)).map_err(failed)?;
        Ok(())
    }

    /// Write `text` to `<out>/<name>` and `kubectl apply -f` it.
    fn apply(&mut self, env: &TestEnv, kubectl: &Path, name: &str, text: &str) -> Result<()> {
        let p = self.out.join(name);
        std::fs::write(&p, text).map_err(|e| Error::io("write", &p, e))?;
        let out = env
            .kubectl(kubectl, &["apply", "-f", &p.display().to_string()])
            .map_err(|e| self.fail(format!("kubectl apply -f {}: {e}", p.display())))?;
        self.note(format!("kubectl apply -f {name}: {}", one_line(&out)));
        Ok(())
    }

    /// `kubectl apply -k` of the overlay over `k3os-ops/deploy`; the DaemonSet's image is the
    /// one v2-kube's agent payload names; its pod becomes Ready.
    fn deploy_agent(&mut self, env: &mut TestEnv, kubectl: &Path) -> Result<()> {
        let dir = self.out.join("overlay");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let deploy = manifests::relative(&dir, &self.root.join("k3os-ops/deploy"));
        let k = dir.join("kustomization.yaml");
        std::fs::write(&k, manifests::overlay(&deploy, API_HOST, env.port))
            .map_err(|e| Error::io("write", &k, e))?;
        let run = |args: &[&str]| env.kubectl(kubectl, args);
        let applied = run(&["apply", "-k", &dir.display().to_string()])
            .map_err(|e| self.fail(format!("kubectl apply -k {}: {e}", dir.display())))?;
        self.note(format!(
            "kubectl apply -k {} (over {deploy}): {} objects",
            dir.display(),
            applied.lines().count()
        ));
        let crd = "crd/updatechannels.k3os.io";
        run(&["wait", "--for=condition=Established", crd, "--timeout=60s"])
            .map_err(|e| self.fail(format!("the CRD: {e}")))?;
        let jp = "-o=jsonpath={.spec.template.spec.containers[0].image}";
        let image = run(&["-n", AGENT_NS, "get", "ds", "k3os-ops-agent", jp])
            .map_err(|e| self.fail(format!("the DaemonSet: {e}")))?;
        let carried = self.agent_payload_images()?;
        self.check(carried.contains(&image), || {
            format!("the DaemonSet runs {image}; {TARGET}'s agent payload holds {carried:?}")
        })?;
        // Ready only once it has reconciled a channel: wait for its container, then for its
        // first read of its Node in the audit log.
        let up = self.wait_api(env, kubectl, POD, "the agent's container started", |k| {
            let jp = "-o=jsonpath={.items[*].status.containerStatuses[*].started}";
            k(&["-n", AGENT_NS, "get", "pods", "-l", AGENT_LABEL, jp]).map(|o| o.trim() == "true")
        })?;
        let api = self.agent_reaches_api(env)?;
        self.note(format!(
            "api: the agent pod ({image}, imagePullPolicy Never, from the slot's payload) started {up:.1}s after apply -k; it read its Node through {}:{} {api:.1}s later",
            API_HOST, env.port
        ));
        Ok(())
    }

    /// The images the release [`TARGET`]'s agent payload names (its signed manifest).
    fn agent_payload_images(&self) -> Result<Vec<String>> {
        let p = self
            .target
            .releases(&self.root)
            .join(TARGET)
            .join("manifest.json");
        let bytes = std::fs::read(&p).map_err(|e| Error::io("read", &p, e))?;
        let m = libupgrade::manifest::Manifest::parse(&bytes)
            .map_err(|e| self.fail(format!("{}: {e}", p.display())))?;
        Ok(m.payloads
            .into_iter()
            .filter(|x| x.name == k3os_images::kube::AGENT_PAYLOAD_NAME)
            .flat_map(|x| x.images)
            .collect())
    }

    /// The workload Ready, and the v2-only app's pod waiting for its image on v1.
    fn site_workload(&mut self, env: &mut TestEnv, kubectl: &Path) -> Result<()> {
        self.apply(env, kubectl, "workload.yaml", &manifests::workload())?;
        let web = self.wait_api(env, kubectl, POD, "the workload Ready", |k| {
            let jp = "-o=jsonpath={.status.readyReplicas}";
            k(&["get", "deploy", WEB, jp]).map(|o| o.trim() == "1")
        })?;
        let app = self.wait_api(env, kubectl, POD, "the v2-only app waiting", |k| {
            let jp = "-o=jsonpath={.items[*].status.containerStatuses[*].state.waiting.reason}";
            k(&["get", "pods", "-l", &format!("app={APP}"), jp])
                .map(|o| o.contains("ErrImageNeverPull"))
        })?;
        self.note(format!(
            "api: {WEB} Ready {web:.1}s after apply; {APP} ({APP_IMAGE}) waits with ErrImageNeverPull on v1-kube ({app:.1}s)"
        ));
        Ok(())
    }

    /// Poll the Node, the workload and the console every [`POLL`] until the node runs
    /// [`TARGET`] blessed, Ready and uncordoned; the channel server is stopped once the agent
    /// reboots the node. Fails at a failed phase, a control plane that exited, or no change
    /// within [`STEP`].
    fn watch_upgrade(
        &mut self,
        vm: &mut Vm,
        env: &mut TestEnv,
        kubectl: &Path,
        srv: ReleaseServer,
        t0: Instant,
    ) -> Result<Vec<Sample>> {
        let mut srv = Some(srv);
        let mut samples: Vec<Sample> = Vec::new();
        let (mut changed, mut last_err) = (Instant::now(), String::new());
        // Once the node is blessed and uncordoned: the workload must be Ready again in time.
        let mut blessed: Option<Instant> = None;
        loop {
            if let Some(gone) = env.exited() {
                return Err(self.fail(format!("during the upgrade: {gone}")));
            }
            match sample(vm, env, kubectl, t0) {
                Ok((s, message)) => {
                    if FAILED.contains(&s.phase.as_str()) {
                        return Err(self.fail(format!("the agent says {}: {message}", s.phase)));
                    }
                    if srv.is_some() && (s.phase == "Rebooting" || s.shutdowns > 0) {
                        srv = None;
                        self.note(format!(
                            "t={}s: the host's channel server stopped (the agent reboots the node)",
                            s.at
                        ));
                    }
                    if s.booted_b && !samples.last().is_some_and(|l| l.booted_b) {
                        self.count_boot();
                    }
                    if samples.last().is_none_or(|l| !l.same(&s)) {
                        eprintln!("vm-tests: [{} {}] {s}", self.target, self.kind);
                        changed = Instant::now();
                    }
                    let up =
                        s.booted_b && s.phase == "UpToDate" && !s.cordoned && s.ready == "True";
                    let web = s.web_ready > 0;
                    samples.push(s);
                    match (up, blessed) {
                        (true, _) if web => return Ok(samples),
                        (true, None) => blessed = Some(Instant::now()),
                        (true, Some(b)) if b.elapsed() > POD => {
                            return Err(self.fail(format!(
                                "the node runs {TARGET} blessed, but {WEB} was not Ready again within {}s",
                                POD.as_secs()
                            )))
                        }
                        _ => {}
                    }
                }
                Err(e) => last_err = e,
            }
            if changed.elapsed() > STEP || t0.elapsed() > UPGRADE {
                let last = samples.last().map(|s| s.to_string()).unwrap_or_default();
                return Err(self.fail(format!(
                    "the upgrade made no progress for {}s (or took over {}s); last seen: {last}; kubectl said last: {last_err}",
                    STEP.as_secs(),
                    UPGRADE.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The agent's Events about the Node ([`REPORTING`]), oldest first, once one of reason
    /// `last` is among them (an Event is published after the step it reports; at most 60 s).
    fn agent_events(&self, env: &TestEnv, kubectl: &Path, last: &str) -> Result<Vec<AgentEvent>> {
        let t0 = Instant::now();
        loop {
            let events = self.agent_events_now(env, kubectl)?;
            if events.iter().any(|e| e.reason == last) || t0.elapsed() > Duration::from_secs(60) {
                return Ok(events);
            }
            std::thread::sleep(POLL);
        }
    }

    fn agent_events_now(&self, env: &TestEnv, kubectl: &Path) -> Result<Vec<AgentEvent>> {
        let out = env
            .kubectl(
                kubectl,
                &[
                    "get",
                    "events.v1.events.k8s.io",
                    "-n",
                    "default",
                    "-o",
                    "json",
                ],
            )
            .map_err(|e| self.fail(format!("kubectl get events: {e}")))?;
        let v: Value = serde_json::from_str(&out).map_err(|e| self.fail(format!("events: {e}")))?;
        let mut events: Vec<AgentEvent> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reportingController"] == REPORTING && e["regarding"]["name"] == NODE)
            .filter_map(|e| {
                let t = e["eventTime"].as_str()?;
                let at = chrono::DateTime::parse_from_rfc3339(t).ok()?;
                Some(AgentEvent {
                    reason: e["reason"].as_str()?.to_string(),
                    at: at.timestamp_micros() as f64 / 1e6,
                    note: e["note"].as_str().unwrap_or_default().to_string(),
                })
            })
            .collect();
        events.sort_by(|a, b| a.at.total_cmp(&b.at));
        Ok(events)
    }
}

/// The site's node as [`Scenario::site_node`] powered it on.
struct SiteNode {
    /// The channel server.
    srv: ReleaseServer,
    /// The guest, booted into A v1-kube.
    vm: Vm,
    /// Its disks and ports (for the next power-on, and the report port).
    node: Node,
    /// When it booted (`vm.elapsed()`).
    booted: Duration,
}

/// The agent's `reportingController` (k3os-ops/src/agent/cluster/events.rs).
const REPORTING: &str = "k3os.io/k3os-ops-agent";

/// One observation at `t0.elapsed()`, and the Node's `k3os.io/update-message`; the error is
/// what kubectl said.
fn sample(
    vm: &Vm,
    env: &TestEnv,
    kubectl: &Path,
    t0: Instant,
) -> std::result::Result<(Sample, String), String> {
    let node: Value =
        serde_json::from_str(&env.kubectl(kubectl, &["get", "node", NODE, "-o", "json"])?)
            .map_err(|e| format!("the Node's JSON: {e}"))?;
    let ann = &node["metadata"]["annotations"];
    let ready = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default();
    let web = env.kubectl(
        kubectl,
        &["get", "deploy", WEB, "-o=jsonpath={.status.readyReplicas}"],
    )?;
    let console = vm.tail(100_000);
    let s = Sample {
        at: t0.elapsed().as_secs(),
        phase: ann["k3os.io/update-phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        preview: ann.get("k3os.io/update-stage-preview").is_some(),
        cordoned: node["spec"]["unschedulable"].as_bool().unwrap_or(false),
        ready: ready.to_string(),
        web_ready: web.trim().parse().unwrap_or(0),
        shutdowns: console.matches("K3OS-SHUTDOWN reboot").count(),
        booted_b: console.contains("K3OS-BOOTED slot=B"),
        imported: console.matches("K3OS-KUBE imported t=").count(),
        kubelets: console.matches("K3OS-KUBE kubelet t=").count(),
    };
    let message = ann["k3os.io/update-message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((s, message))
}

/// `text` on one line (kubectl's multi-line answers in a note).
fn one_line(text: &str) -> String {
    text.lines().map(str::trim).collect::<Vec<_>>().join("; ")
}
