//! Three `k3os-ops agent` *processes* (the real binary) against a real kube-apiserver, under
//! deploy/rbac.yaml's ServiceAccount, each over a simulated host: the k3OS dir layout in a
//! temp dir with real GRUB env files (bootconfig's writer), booted the way GRUB's script
//! would boot it (bootconfig's model of that script, countdown included). This is the black
//! box the agent twice passed its mocks and then failed: nothing of the agent runs in this
//! process, and nothing answers for the API server.
//!
//! The driver plays what is not the agent: the kubelet (a Node's `Ready` condition, posted once
//! the host is up), the host's reboot (`K3OS_OPS_REBOOT_CMD` touches a file; the driver then
//! kills that host's processes, marks the Node NotReady, runs the loader model, writes the
//! new command line, boot id and `/etc/k3os-release` of the slot booted) and init (`k3os-ops
//! slot confirm` first thing at every boot; exit 75 starts `slot await-bless --reboot` in the
//! background; any other failure reboots at once, as images/files/rootfs-init.sh does). A
//! bare API server has no kubelet, scheduler or controllers, so no pods run: drains evict
//! nothing (the fake-API fleet test, agent_fleet.rs, covers pods and PodDisruptionBudgets).
//!
//! Needs a bare API server the test starts itself (setup.sh's binaries or KUBEBUILDER_ASSETS),
//! not KUBECONFIG's cluster, whose kubelets would fight over the simulated Nodes:
//!
//! ```sh
//! cargo test -p k3os-ops --test cli cluster::cluster_fleet::
//! ```

use super::support as cluster_support;
use k3os_ops_testing::cli as cli_support;
use k3os_ops_testing::release as release_support;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bootconfig::Slot;
use k3os_ops::agent::testing::crd::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use libupgrade::manifest::Arch;
use libupgrade::state::store::StateStore;
use rand::Rng;
use serde_json::json;

const NS: &str = "k3os-system";
const HOSTS: usize = 3;
const DEADLINE: Duration = Duration::from_secs(300);

/// One simulated host: its temp root, config, and the processes running "on" it.
struct Host {
    name: String,
    dir: tempfile::TempDir,
    config: PathBuf,
    /// The agent's credentials: a token bound to a Pod on this host's Node.
    kubeconfig: PathBuf,
    agent: Option<Child>,
    await_bless: Option<Child>,
    boots: u32,
    /// Slots booted, in order (the first boot included).
    booted: Vec<Slot>,
}

impl Host {
    fn p(&self) -> &Path {
        self.dir.path()
    }

    fn reboot_flag(&self) -> PathBuf {
        self.p().join("reboot-requested")
    }

    fn cmd(&self, kubeconfig: &Path) -> Command {
        let mut c = Command::new(release_support::bin());
        c.env("K3OS_OPS_CONFIG", &self.config)
            .env("KUBECONFIG", kubeconfig)
            .env(
                k3os_ops::node::REBOOT_CMD_ENV,
                format!("touch {}", self.reboot_flag().display()),
            )
            .env_remove("K3OS_OPS_BARRIERS")
            .env_remove("K3OS_OPS_BARRIER_STOP")
            .env("RUST_LOG", "info");
        c
    }

    fn log(&self, what: &str) -> Stdio {
        let f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.p().join(format!("{what}.log")))
            .unwrap();
        Stdio::from(f)
    }

    fn kill(&mut self) {
        for c in [self.agent.take(), self.await_bless.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Power on through GRUB's script (its countdown written as GRUB's `save_env` would) and
    /// return the slot booted, with the kernel's files of that boot written.
    fn power_on(&mut self) -> Slot {
        let grub = self.p().join("boot/grub");
        let sim = bootconfig::simulate_boot(&grub, 3)
            .unwrap_or_else(|e| panic!("{}: GRUB's script cannot boot: {e}", self.name));
        bootconfig::apply_all(&sim.countdown).unwrap();
        self.boots += 1;
        let slot = sim.choice;
        fs::write(
            self.p().join("cmdline"),
            format!("root=/dev/vda4 ro k3os.slot={slot}\n"),
        )
        .unwrap();
        fs::write(self.p().join("boot_id"), format!("boot-{}\n", self.boots)).unwrap();
        // /etc/k3os-release comes from the slot's root filesystem: the version staged there.
        let st = StateStore::new(&self.p().join("state")).load().unwrap();
        let rec = st.slot(slot);
        let (v, g) = match (&rec.version, rec.generation) {
            (Some(v), Some(g)) => (v.clone(), g),
            _ => ("v1".to_string(), 1),
        };
        fs::write(
            self.p().join("k3os-release"),
            format!("VERSION={v}\nGENERATION={g}\n"),
        )
        .unwrap();
        self.booted.push(slot);
        slot
    }

    /// What init runs first: `slot confirm`. Ok(true): good; Ok(false): pending, await-bless
    /// started; Err: init reboots.
    fn init(&mut self, kubeconfig: &Path) -> Result<bool, String> {
        let out = self
            .cmd(kubeconfig)
            .args(["slot", "confirm"])
            .output()
            .unwrap();
        match out.status.code() {
            Some(0) => Ok(true),
            Some(75) => {
                let child = self
                    .cmd(kubeconfig)
                    .args(["slot", "await-bless", "--reboot"])
                    .stdout(self.log("await-bless"))
                    .stderr(self.log("await-bless"))
                    .spawn()
                    .unwrap();
                self.await_bless = Some(child);
                Ok(false)
            }
            _ => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }

    fn start_agent(&mut self, kubeconfig: &Path) {
        let child = self
            .cmd(kubeconfig)
            .args([
                "agent",
                "--node-name",
                &self.name,
                "--namespace",
                NS,
                "--resync-secs",
                "5",
                "--count-secs",
                "5",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .stdout(self.log("agent"))
            .stderr(self.log("agent"))
            .spawn()
            .unwrap();
        self.agent = Some(child);
    }

    fn tail(&self, what: &str) -> String {
        let t = fs::read_to_string(self.p().join(format!("{what}.log"))).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fleet: the hosts, the admin client, the channel.
struct Fleet {
    hosts: Vec<Host>,
    admin: Client,
    channel: String,
    _work: tempfile::TempDir,
    _server: release_support::Server,
    /// Most slot holders seen at once (sampled every pass of the driver).
    peak: usize,
    /// Holders seen over the run.
    holders: BTreeSet<String>,
}

async fn set_ready(admin: &Client, node: &str, ready: bool) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let now = chrono::Utc::now().to_rfc3339();
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            // Strategic merge keyed by type, as the kubelet posts: the agent's own
            // K3osBootAssessed condition stays.
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready",
                "status": if ready { "True" } else { "False" },
                "reason": if ready { "KubeletReady" } else { "NodeRebooting" },
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }]}})),
        )
        .await
        .unwrap_or_else(|e| panic!("mark Node {node} ready={ready}: {e}"));
}

/// A kubeconfig for deploy/rbac.yaml's ServiceAccount as the agent pod on `node` holds it
/// (a token bound to a Pod on that Node, what deploy/node-scope.yaml's policies judge).
async fn agent_kubeconfig(admin: &Client, dir: &Path, node: &str) -> PathBuf {
    let token = cluster_support::agent_pod_token(admin, node).await;
    let url = cluster_support::admin_config().await.cluster_url;
    let path = dir.join(format!("{node}.kubeconfig"));
    fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    insecure-skip-tls-verify: true\nusers:\n- name: agent\n  user:\n    token: {token}\ncontexts:\n- name: agent\n  context: {{cluster: test, user: agent, namespace: {NS}}}\ncurrent-context: agent\n"
        ),
    )
    .unwrap();
    path
}

impl Fleet {
    /// Three hosts on v1 (confirmed, Nodes Ready, agents running), a v2 release served over
    /// HTTP, and a channel targeting it with `spec`'s other fields. `health_check`: a
    /// health.d script on every host (`RELEASE` stands for its /etc/k3os-release);
    /// `unassessed`: the first host's init never ran `slot confirm` on this boot.
    async fn start(spec: serde_json::Value, health_check: Option<&str>, unassessed: bool) -> Fleet {
        assert!(
            std::env::var_os("KUBECONFIG").is_none()
                && cluster_support::bare_server_assets().is_some(),
            "cluster_fleet needs a bare kube-apiserver + etcd it starts itself (scripts/setup.sh \
             installs them; or KUBEBUILDER_ASSETS), and no KUBECONFIG: its Nodes are simulated, \
             and a cluster's kubelets would fight over them"
        );
        let admin = cluster_support::client().await;
        cluster_support::apply_manifest(&admin, "namespace.yaml").await;
        cluster_support::apply_manifest(&admin, "rbac.yaml").await;
        cluster_support::install_crd(&admin).await;
        cluster_support::apply_node_scope(&admin).await;
        let work = tempfile::tempdir().unwrap();
        let tag = format!("{:06x}", rand::thread_rng().gen::<u32>() & 0xff_ffff);
        // The release: v2, generation 2, signed by the key every host trusts.
        let (secret, trust) = release_support::keys(work.path(), "release");
        let chan = work.path().join("channel");
        let inputs = release_support::squashfs_inputs(work.path(), "v2");
        release_support::create(
            &inputs,
            &secret,
            &chan.join("v2"),
            "v2",
            Arch::host(),
            Some(2),
        );
        let out = Command::new(release_support::bin())
            .args(["release", "index"])
            .arg(&chan)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "release index {}: {out:?}",
            chan.display()
        );
        let server = release_support::Server::start(&chan);
        let nodes: Api<Node> = Api::all(admin.clone());
        let mut hosts = Vec::new();
        for i in 0..HOSTS {
            let name = format!("bb-{tag}-{}", (b'a' + i as u8) as char);
            let dir = tempfile::tempdir().unwrap();
            let config = cli_support::write_node(dir.path(), 1, &trust, "");
            if let Some(script) = health_check {
                let f = dir.path().join("health.d/50-app");
                fs::write(
                    &f,
                    script.replace(
                        "RELEASE",
                        &dir.path().join("k3os-release").display().to_string(),
                    ),
                )
                .unwrap();
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&f, fs::Permissions::from_mode(0o755)).unwrap();
            }
            nodes
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(
                        json!({"metadata": {"name": name, "labels": {"bb": tag}}}),
                    )
                    .unwrap(),
                )
                .await
                .unwrap_or_else(|e| panic!("create Node {name}: {e}"));
            let kubeconfig = agent_kubeconfig(&admin, work.path(), &name).await;
            let mut h = Host {
                name,
                dir,
                config,
                kubeconfig: kubeconfig.clone(),
                agent: None,
                await_bless: None,
                boots: 0,
                booted: Vec::new(),
            };
            assert_eq!(h.power_on(), Slot::A);
            if !(unassessed && i == 0) {
                assert_eq!(h.init(&kubeconfig), Ok(true), "{}: first boot", h.name);
            }
            set_ready(&admin, &h.name, true).await;
            h.start_agent(&kubeconfig);
            hosts.push(h);
        }
        let channel = format!("bb-{tag}");
        let mut full = json!({
            "url": server.url,
            "version": "v2",
            "nodeSelector": {"bb": tag},
        });
        for (k, v) in spec.as_object().unwrap() {
            full[k] = v.clone();
        }
        let chans: Api<UpdateChannel> = Api::namespaced(admin.clone(), NS);
        chans
            .create(
                &PostParams::default(),
                &UpdateChannel::new(&channel, serde_json::from_value(full).unwrap()),
            )
            .await
            .expect("create the channel");
        Fleet {
            hosts,
            admin,
            channel,
            _work: work,
            _server: server,
            peak: 0,
            holders: BTreeSet::new(),
        }
    }

    async fn status(&self) -> UpdateChannelStatus {
        let chans: Api<UpdateChannel> = Api::namespaced(self.admin.clone(), NS);
        chans
            .get(&self.channel)
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    }

    /// One pass of the driver: sample the holders, serve reboot requests.
    async fn step(&mut self) {
        let st = self.status().await;
        self.peak = self.peak.max(st.slots.len());
        self.holders.extend(st.slots.iter().map(|s| s.node.clone()));
        for i in 0..self.hosts.len() {
            if self.hosts[i].reboot_flag().exists() {
                self.reboot(i).await;
            }
        }
    }

    /// The host asked to reboot: its processes die, the Node goes NotReady, the loader picks
    /// a slot, init confirms (a failed confirm reboots again at once), the kubelet reports
    /// Ready, the agent starts.
    async fn reboot(&mut self, i: usize) {
        let kc = self.hosts[i].kubeconfig.clone();
        let h = &mut self.hosts[i];
        fs::remove_file(h.reboot_flag()).unwrap();
        h.kill();
        set_ready(&self.admin, &h.name, false).await;
        for _ in 0..5 {
            let slot = h.power_on();
            match h.init(&kc) {
                Ok(_) => break,
                Err(e) => eprintln!(
                    "{}: init's confirm failed on {slot}, rebooting: {e}",
                    h.name
                ),
            }
        }
        set_ready(&self.admin, &h.name, true).await;
        h.start_agent(&kc);
    }

    async fn run_until(
        &mut self,
        what: &str,
        done: impl Fn(&UpdateChannelStatus, &[Host]) -> bool,
    ) {
        let t0 = Instant::now();
        loop {
            self.step().await;
            let st = self.status().await;
            if done(&st, &self.hosts) {
                eprintln!("{what}: reached after {:.1}s", t0.elapsed().as_secs_f64());
                return;
            }
            if t0.elapsed() > DEADLINE {
                let tails: Vec<String> = self
                    .hosts
                    .iter()
                    .map(|h| format!("--- {} agent:\n{}", h.name, h.tail("agent")))
                    .collect();
                panic!(
                    "{what}: not reached within {DEADLINE:?}; status: {}\n{}",
                    serde_json::to_string(&st).unwrap(),
                    tails.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The channel's Events' reasons, in the order the server keeps them.
    async fn channel_events(&self) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), NS);
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("UpdateChannel")
                        && r.name.as_deref() == Some(self.channel.as_str())
                })
            })
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Issue 34 item 3: under deploy/node-scope.yaml, not one of the agents' own writes was
    /// refused (no 403, no "forbidden" in any agent's log) and each Node carries the stage
    /// preview under `k3os.io/update-stage-preview` (the old key, which the policy refused,
    /// never written).
    async fn assert_no_policy_refusal_and_the_preview_published(&self) {
        for (i, h) in self.hosts.iter().enumerate() {
            let log = fs::read_to_string(h.p().join("agent.log")).unwrap_or_default();
            let refused: Vec<&str> = log
                .lines()
                .filter(|l| {
                    l.contains("forbidden") || l.contains("Forbidden") || l.contains(" 403")
                })
                .collect();
            assert!(
                refused.is_empty(),
                "{}: the policy refused the agent:\n{}",
                h.name,
                refused.join("\n")
            );
            let node = self.node(i).await;
            let ann = node.metadata.annotations.unwrap_or_default();
            let preview: serde_json::Value = serde_json::from_str(
                ann.get("k3os.io/update-stage-preview")
                    .unwrap_or_else(|| panic!("{}: no stage preview: {ann:?}", h.name)),
            )
            .unwrap();
            assert_eq!(preview["version"], "v2", "{}: {preview}", h.name);
            assert!(
                !ann.contains_key("k3os.io/stage-preview"),
                "{}: {ann:?}",
                h.name
            );
        }
    }

    async fn node(&self, i: usize) -> Node {
        let nodes: Api<Node> = Api::all(self.admin.clone());
        nodes.get(&self.hosts[i].name).await.unwrap()
    }
}

fn slot_state(h: &Host, s: Slot) -> (libupgrade::state::SlotState, Option<String>) {
    let st = StateStore::new(&h.p().join("state")).load().unwrap();
    let r = st.slot(s);
    (r.state, r.version.clone())
}

fn on_v2(h: &Host) -> bool {
    h.booted.last() == Some(&Slot::B)
        && slot_state(h, Slot::B) == (libupgrade::state::SlotState::Good, Some("v2".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agent_processes_roll_v2_out_one_node_at_a_time() {
    let _turn = cluster_support::exclusive().await;
    let mut f = Fleet::start(
        json!({"concurrency": 1, "rebootTimeout": "60s", "maxFailures": 1}),
        None,
        false,
    )
    .await;
    f.run_until(
        "every host on v2, blessed, the channel without holders",
        |st, hosts| hosts.iter().all(on_v2) && st.slots.is_empty(),
    )
    .await;
    let st = f.status().await;
    assert_eq!(
        f.peak, 1,
        "at most concurrency 1 holder, and one at some point"
    );
    assert_eq!(
        f.holders.len(),
        HOSTS,
        "every host held the slot: {:?}",
        f.holders
    );
    assert!(st.failures.is_empty(), "{:?}", st.failures);
    for (i, h) in f.hosts.iter().enumerate() {
        assert_eq!(
            h.booted,
            vec![Slot::A, Slot::B],
            "{}: one reboot into B",
            h.name
        );
        let node = f.node(i).await;
        assert_ne!(
            node.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{} left cordoned",
            h.name
        );
    }
    let reasons: Vec<String> = f.channel_events().await.into_iter().map(|e| e.0).collect();
    for want in ["SlotClaimed", "SlotReleased"] {
        let n = reasons.iter().filter(|r| *r == want).count();
        assert_eq!(n, HOSTS, "{want} once per host on the channel: {reasons:?}");
    }
    f.assert_no_policy_refusal_and_the_preview_published().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_health_check_is_reported_as_such_and_pauses_the_channel() {
    let _turn = cluster_support::exclusive().await;
    let check = "#!/bin/sh\nif grep -q '^VERSION=v2' RELEASE; then echo 'app: cannot open its database on v2'; exit 1; fi\n";
    let mut f = Fleet::start(
        json!({"concurrency": 1, "rebootTimeout": "60s", "maxFailures": 1}),
        Some(check),
        false,
    )
    .await;
    f.run_until("one failure recorded and the channel paused", |st, _| {
        !st.failures.is_empty()
            && st
                .conditions
                .iter()
                .any(|c| c.type_ == COND_PAUSED && c.status == "True")
    })
    .await;
    // The others must not claim while paused: watch a while longer.
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        f.step().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let st = f.status().await;
    assert_eq!(st.failures.len(), 1, "{:?}", st.failures);
    let fail = &st.failures[0];
    assert_eq!(fail.version, "v2");
    assert!(
        fail.reason.contains("health") && fail.reason.contains("cannot open its database"),
        "the failure must carry the core's verdict and the check's output: {fail:?}"
    );
    assert!(
        !fail.reason.contains("fell back"),
        "a failed check is not a loader fallback: {fail:?}"
    );
    assert!(st.slots.is_empty(), "{:?}", st.slots);
    let failed = f.hosts.iter().position(|h| h.name == fail.node).unwrap();
    for (i, h) in f.hosts.iter().enumerate() {
        if i == failed {
            assert_eq!(h.booted.first(), Some(&Slot::A));
            assert_eq!(h.booted.last(), Some(&Slot::A), "{} back on v1", h.name);
            assert_eq!(slot_state(h, Slot::B).0, libupgrade::state::SlotState::Bad);
        } else {
            assert_eq!(
                h.booted,
                vec![Slot::A],
                "{} must not reboot while paused",
                h.name
            );
        }
    }
    let events = f.channel_events().await;
    let reasons: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert!(reasons.contains(&"HealthCheckFailed"), "{events:?}");
    assert!(reasons.contains(&"ChannelPaused"), "{events:?}");
    assert_eq!(
        reasons.iter().filter(|r| **r == "SlotClaimed").count(),
        1,
        "only the failing host claimed: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_nobody_assessed_is_reported_once_and_waited_out() {
    let _turn = cluster_support::exclusive().await;
    use k3os_ops::agent::testing::COND_BOOT_ASSESSED;
    let mut f = Fleet::start(
        json!({"concurrency": 1, "rebootTimeout": "60s", "maxFailures": 1, "paused": true}),
        None,
        true,
    )
    .await;
    let assessed = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == COND_BOOT_ASSESSED))
            .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()))
    };
    // Four resyncs (5 s) of the agent that waits: one condition, one Event, no error loop.
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        f.step().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (status, message) = assessed(&f.node(0).await).expect("condition on the Node");
    assert_eq!(status, "False");
    assert!(message.contains("k3os-ops slot confirm"), "{message}");
    // Events about a cluster-scoped Node are in `default`, where kubectl describe looks.
    let events: Api<Event> = Api::namespaced(f.admin.clone(), "default");
    let mine: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("BootNotAssessed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                    == Some(f.hosts[0].name.as_str())
        })
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "one BootNotAssessed Event on the Node: {mine:?}"
    );
    let log = fs::read_to_string(f.hosts[0].p().join("agent.log")).unwrap();
    let errors = log.matches("ERROR").count();
    assert_eq!(errors, 0, "waited quietly:\n{}", f.hosts[0].tail("agent"));
    // What the message says to run, then the condition turns True.
    let kc = f.hosts[0].kubeconfig.clone();
    assert_eq!(f.hosts[0].init(&kc), Ok(true));
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if assessed(&f.node(0).await).map(|a| a.0).as_deref() == Some("True") {
            break;
        }
        assert!(Instant::now() < until, "K3osBootAssessed never turned True");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
