//! `kube-node-joins`: the test OS as a real Kubernetes node. On the host, a control plane
//! (etcd, kube-apiserver with its own CA and a serving certificate for 10.0.2.2 — the host as
//! a QEMU guest sees it — and 127.0.0.1, the Node authorizer, kube-controller-manager and
//! kube-scheduler; crate `kube-testenv`, binaries from `KUBEBUILDER_ASSETS`); a seed disk
//! (ext4 labelled `k3os-seed`) with the node's kubeconfig (its client certificate
//! `CN=system:node:<name>, O=system:nodes`); the `-kube` disk boots v1-kube with 2 GiB and two
//! vCPUs: containerd starts, the slot's image archive is imported, the kubelet registers the
//! Node, which becomes Ready, and a Deployment of an image only the slot's payload carries
//! (`imagePullPolicy: Never`) gets a Running pod; containerd holds the agent's image (the
//! other payload) for the guest's platform. On `x86_64-grub-efi` and `aarch64-grub-efi`. Each
//! step's time is noted. A guest that never gets there fails within the step's bound, with the
//! console's last lines and the guest's kubelet and containerd log tails.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use bootconfig::Slot;
use kube_testenv::{Options as EnvOptions, TestEnv};

use super::offline::mkfs_ext4;
use super::steps::CMD;
use super::Scenario;
use crate::error::{Error, Result};
use crate::target::kube_assets;
use crate::vm::Vm;

/// The Node's name (the seed's `node-name`, the client certificate's CN).
pub(super) const NODE: &str = "kube-node-1";
/// The seed filesystem's label (images/files/kube-up.sh looks for it).
const SEED_LABEL: &str = "k3os-seed";
/// The workload: in the archive of v1-kube's payload only (images/src/oci.rs, `kube_images`).
const APP_IMAGE: &str = "k3os.test/site-app:g1-kube";
/// The agent's image (the `-kube` releases' payload `k3os-ops-agent`, the justfile's
/// `images-kube` recipe), any version: its reference up to the tag.
const AGENT_IMAGE_REPO: &str = "docker.io/library/k3os-ops:";
/// From `K3OS-BOOTED` to the kubelet started (containerd, import; TCG, a loaded host).
const KUBE_UP: Duration = Duration::from_secs(420);
/// From the kubelet started to the Node registered, and to Ready.
const JOIN: Duration = Duration::from_secs(300);
/// From the Deployment applied to its pod Running.
const POD: Duration = Duration::from_secs(300);
/// How often the kubelet's log is read for a refusal while the Node has not registered.
const REFUSED_LOOK: Duration = Duration::from_secs(10);
/// The guest's kubelet log (images/files/kube-up.sh).
const KUBELET_LOG: &str = "/var/log/kubelet.log";
/// What a kubelet logs when it cannot verify the API server (`x509:`) or the API server does
/// not take its credentials (`Unauthorized`, 401). Not `forbidden`: a kubelet that registers
/// may log a 403 for a read its Node is not yet authorized for.
const REFUSALS: [&str; 2] = ["x509:", "Unauthorized"];

/// The first line of `log` that says the kubelet cannot verify the API server or was refused
/// (one of [`REFUSALS`]), trimmed; None while it only waits.
fn refusal(log: &str) -> Option<&str> {
    log.lines()
        .find(|l| REFUSALS.iter().any(|r| l.contains(r)))
        .map(str::trim)
}

impl Scenario {
    pub(super) fn kube_node_joins(&mut self) -> Result<()> {
        let assets = kube_assets(&self.root);
        let kubectl = assets.join("kubectl");
        let mut env = self.control_plane(&assets, &kubectl, false)?;
        let seed = self.seed_disk(&env)?;
        let mut node = self.node_from("node", &self.target.kube_disk(&self.root))?;
        node.attach_seed(&seed);
        node.resize(2048, 2);
        let mut vm = self.power_on(&mut node)?;
        let booted = vm.elapsed();
        self.expect_boot(&mut vm, Slot::A, "v1-kube")?;
        let r = self.join(&mut vm, &mut env, &kubectl, booted);
        if let Err(e) = r {
            return Err(self.guest_logs(&mut vm, e));
        }
        Ok(())
    }

    /// `kube-join-refused`: the seed's kubeconfig trusts another CA than the API server's, so
    /// the kubelet cannot verify the server and the Node never registers. The harness's join
    /// wait must fail well within its bound, naming the node and the kubelet log's reason
    /// (`x509`), and the node keeps running its good slot A v1-kube.
    pub(super) fn kube_join_refused(&mut self) -> Result<()> {
        let assets = kube_assets(&self.root);
        let kubectl = assets.join("kubectl");
        let mut env = self.control_plane(&assets, &kubectl, false)?;
        let other = kube_testenv::Ca::new(&self.out.join("other-ca"), "not-the-site-ca");
        let seed = self.seed_trusting(&env, &other.pair.cert)?;
        let mut node = self.node_from("node", &self.target.kube_disk(&self.root))?;
        node.attach_seed(&seed);
        node.resize(2048, 2);
        let mut vm = self.power_on(&mut node)?;
        let booted = vm.elapsed();
        self.expect_boot(&mut vm, Slot::A, "v1-kube")?;
        let t0 = Instant::now();
        let said = match self.kubelet_joins(&mut vm, &mut env, &kubectl, booted) {
            Ok(()) => {
                return Err(self.fail(format!(
                    "Node {NODE} joined with a seed that trusts another CA than the API server's"
                )))
            }
            Err(e) => e.detail(),
        };
        let took = t0.elapsed();
        self.check(
            said.contains(NODE) && said.contains("x509") && took < KUBE_UP + JOIN,
            || {
                format!(
                    "the join must fail naming {NODE} and the x509 reason within {}s ({}s): {said}",
                    (KUBE_UP + JOIN).as_secs(),
                    took.as_secs()
                )
            },
        )?;
        self.note(format!(
            "the join failed {:.1}s after K3OS-BOOTED: {said}",
            took.as_secs_f64()
        ));
        vm.wait_shell(CMD)?;
        let st = self.status(&mut vm)?;
        self.check_slot(
            &st,
            Slot::A,
            libupgrade::state::SlotState::Good,
            Some("v1-kube"),
        )?;
        self.check(st.booted == Some(Slot::A), || {
            format!("the node must keep running A: {st:?}")
        })?;
        self.note(format!(
            "{}: slot status: A good v1-kube, booted",
            vm.name()
        ));
        Ok(())
    }

    /// The host's control plane for a guest (serving 10.0.2.2, the Node authorizer, the
    /// controllers; with `audit`, the audit log), ready.
    pub(super) fn control_plane(
        &mut self,
        assets: &Path,
        kubectl: &Path,
        audit: bool,
    ) -> Result<TestEnv> {
        let t0 = Instant::now();
        let mut env = TestEnv::start(
            assets,
            &EnvOptions {
                tls_ips: vec!["10.0.2.2".into(), "127.0.0.1".into()],
                node_authorizer: true,
                controllers: true,
                audit,
            },
        );
        env.wait_ready(kubectl, Duration::from_secs(120))
            .map_err(|e| self.fail(e))?;
        self.note(format!(
            "host: etcd, kube-apiserver, controller manager and scheduler ready in {:.1}s ({})",
            t0.elapsed().as_secs_f64(),
            env.dir().display()
        ));
        Ok(env)
    }

    /// Everything after `K3OS-BOOTED`: the guest's steps, then the Node and the pod as the API
    /// server sees them.
    fn join(
        &mut self,
        vm: &mut Vm,
        env: &mut TestEnv,
        kubectl: &Path,
        booted: Duration,
    ) -> Result<()> {
        self.kubelet_joins(vm, env, kubectl, booted)?;
        self.run_workload(env, kubectl)?;
        vm.wait_shell(CMD)?;
        let images = vm.run_ok("ctr -n k8s.io images ls", CMD)?;
        self.check(images.contains(APP_IMAGE), || {
            format!("containerd's k8s.io store lacks {APP_IMAGE}:\n{images}")
        })?;
        let platform = self.target.oci_platform();
        match agent_image_line(&images) {
            Some(line) if line.split(' ').any(|w| w.contains(platform)) => {
                self.note(format!(
                    "guest: containerd has the agent's image for {platform}: {line}"
                ));
                Ok(())
            }
            found => Err(self.fail(format!(
                "containerd's k8s.io store has no agent image ({AGENT_IMAGE_REPO}…) for \
                 {platform} (found: {found:?}):\n{images}"
            ))),
        }
    }

    /// From `K3OS-BOOTED` (at `booted` since power-on) to the Node Ready: the kubelet started
    /// after `K3OS-CONFIRM ok`, the Node registered, Ready (each step noted).
    pub(super) fn kubelet_joins(
        &mut self,
        vm: &mut Vm,
        env: &mut TestEnv,
        kubectl: &Path,
        booted: Duration,
    ) -> Result<()> {
        vm.expect_not(
            "K3OS-KUBE kubelet",
            &[
                "K3OS-KUBE-FAILED",
                "no seed: kubelet not started",
                "K3OS-CONFIRM failed",
                "Kernel panic",
            ],
            KUBE_UP,
        )?;
        let kubelet_at = vm.elapsed();
        let console = vm.tail(100_000);
        self.check(console.contains("K3OS-CONFIRM ok"), || {
            "v1-kube did not print K3OS-CONFIRM ok before the kubelet started".into()
        })?;
        let marks: Vec<&str> = console
            .lines()
            .filter_map(|l| l.find("K3OS-KUBE ").map(|i| l[i..].trim()))
            .collect();
        self.note(format!(
            "{}: kubelet started {:.1}s after power-on (guest uptimes: {})",
            vm.name(),
            (kubelet_at - booted).as_secs_f64(),
            marks.join(", ")
        ));
        let registered = self.node_registers(vm, env, kubectl)?;
        self.note(format!(
            "api: Node {NODE} registered {registered:.1}s after the kubelet started"
        ));
        let jsonpath = "-o=jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
        let ready = registered
            + self.wait_api(env, kubectl, JOIN, "the Node Ready", |k| {
                k(&["get", "node", NODE, jsonpath]).map(|o| o.trim() == "True")
            })?;
        self.note(format!(
            "api: Node {NODE} Ready {ready:.1}s after the kubelet started"
        ));
        Ok(())
    }

    /// Wait for the Node to register, at most [`JOIN`]; the seconds it took. The kubelet's
    /// log is read every [`REFUSED_LOOK`]: a kubelet that cannot verify the API server, or
    /// that the API server refuses, fails at once naming the node and the log's line.
    fn node_registers(&mut self, vm: &mut Vm, env: &mut TestEnv, kubectl: &Path) -> Result<f64> {
        let t0 = Instant::now();
        let mut looked = Instant::now();
        loop {
            if let Some(gone) = env.exited() {
                return Err(self.fail(format!("waiting for Node {NODE} to register: {gone}")));
            }
            let got = env.kubectl(kubectl, &["get", "node", NODE, "-o", "name"]);
            if got.is_ok_and(|o| o.contains(NODE)) {
                return Ok(t0.elapsed().as_secs_f64());
            }
            if looked.elapsed() >= REFUSED_LOOK {
                looked = Instant::now();
                let log = vm.run(&format!("tail -n 200 {KUBELET_LOG}"), CMD)?.output;
                if let Some(line) = refusal(&log) {
                    return Err(self.fail(format!(
                        "Node {NODE} cannot join ({:.0}s after its kubelet started): {KUBELET_LOG} says {:?}",
                        t0.elapsed().as_secs_f64(),
                        line
                    )));
                }
            }
            if t0.elapsed() > JOIN {
                return Err(self.fail(format!(
                    "Node {NODE} did not register within {}s of its kubelet's start",
                    JOIN.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// A Deployment of [`APP_IMAGE`] (never pulled) gets a Running pod on the node.
    fn run_workload(&mut self, env: &mut TestEnv, kubectl: &Path) -> Result<()> {
        let manifest = self.out.join("site-app.yaml");
        std::fs::write(&manifest, deployment())
            .map_err(|e| Error::io("write the Deployment", &manifest, e))?;
        env.kubectl(kubectl, &["apply", "-f", &manifest.display().to_string()])
            .map_err(|e| self.fail(format!("kubectl apply {}: {e}", manifest.display())))?;
        let running = self.wait_api(env, kubectl, POD, "the site-app pod Running", |k| {
            let jp = "-o=jsonpath={.items[*].status.phase}";
            k(&["get", "pods", "-l", "app=site-app", jp]).map(|o| o.trim() == "Running")
        })?;
        self.note(format!(
            "api: Deployment site-app ({APP_IMAGE}, imagePullPolicy Never) has a Running pod {running:.1}s after it was applied"
        ));
        Ok(())
    }

    /// Poll `done` (given a kubectl runner) every second until it says true, at most `limit`;
    /// returns the seconds it took. A control-plane process that exits fails at once.
    pub(super) fn wait_api(
        &mut self,
        env: &mut TestEnv,
        kubectl: &Path,
        limit: Duration,
        what: &str,
        done: impl Fn(
            &dyn Fn(&[&str]) -> std::result::Result<String, String>,
        ) -> std::result::Result<bool, String>,
    ) -> Result<f64> {
        let t0 = Instant::now();
        let mut last = String::new();
        loop {
            if let Some(gone) = env.exited() {
                return Err(self.fail(format!("waiting for {what}: {gone}")));
            }
            let run = |args: &[&str]| env.kubectl(kubectl, args);
            match done(&run) {
                Ok(true) => return Ok(t0.elapsed().as_secs_f64()),
                Ok(false) => {}
                Err(e) => last = e,
            }
            if t0.elapsed() > limit {
                return Err(self.fail(format!(
                    "{what}: not within {}s (kubectl said last: {last})",
                    limit.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// The seed disk: the node's kubeconfig (server `https://10.0.2.2:<port>`, the CA, its
    /// client certificate and key embedded), the CA and the node's name.
    pub(super) fn seed_disk(&mut self, env: &TestEnv) -> Result<PathBuf> {
        let ca = env.ca.as_ref().expect("the env was started with tls_ips");
        self.seed_trusting(env, &ca.pair.cert)
    }

    /// [`Scenario::seed_disk`] whose kubeconfig trusts `server_ca` for the API server (a
    /// wrong one: the node never joins).
    fn seed_trusting(&mut self, env: &TestEnv, server_ca: &Path) -> Result<PathBuf> {
        let ca = env.ca.as_ref().expect("the env was started with tls_ips");
        let pair = ca.client("node", &format!("system:node:{NODE}"), &["system:nodes"]);
        let dir = self.out.join("seed");
        let tree = dir.join("tree");
        std::fs::create_dir_all(&tree).map_err(|e| Error::io("create directory", &tree, e))?;
        let b64 = |p: &Path| -> Result<String> {
            let bytes = std::fs::read(p).map_err(|e| Error::io("read", p, e))?;
            Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
        };
        let kubeconfig = node_kubeconfig(
            &format!("https://10.0.2.2:{}", env.port),
            &b64(server_ca)?,
            &b64(&pair.cert)?,
            &b64(&pair.key)?,
        );
        for (name, data) in [
            ("kubeconfig", kubeconfig.into_bytes()),
            (
                "ca.crt",
                std::fs::read(server_ca).map_err(|e| Error::io("read", server_ca, e))?,
            ),
            ("node-name", format!("{NODE}\n").into_bytes()),
        ] {
            let p = tree.join(name);
            std::fs::write(&p, data).map_err(|e| Error::io("write", &p, e))?;
        }
        let img = dir.join("seed.img");
        mkfs_ext4(&img, 8 << 20, &tree, SEED_LABEL)?;
        Ok(img)
    }

    /// Add what the guest's console and logs showed last to `e` (bounded: a shell that does
    /// not answer within 20 s adds nothing more).
    pub(super) fn guest_logs(&mut self, vm: &mut Vm, e: Error) -> Error {
        let console = vm.tail(30);
        let logs = vm
            .run(
                "tail -n 15 /var/log/containerd.log /var/log/import.log /var/log/kubelet.log 2>&1",
                Duration::from_secs(20),
            )
            .map(|o| o.output)
            .unwrap_or_else(|e| format!("(the guest shell did not answer: {e})"));
        self.fail(format!(
            "{}\n--- the guest's console, last lines:\n{console}\n--- the guest's logs:\n{logs}",
            e.detail()
        ))
    }
}

/// The line of `ctr images ls` (REF TYPE DIGEST SIZE PLATFORMS LABELS) naming the agent's
/// image, its columns joined by one space.
fn agent_image_line(images: &str) -> Option<String> {
    images
        .lines()
        .find(|l| l.trim_start().starts_with(AGENT_IMAGE_REPO))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// A kubeconfig with everything embedded (the seed is all the node gets).
fn node_kubeconfig(server: &str, ca: &str, cert: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: site\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: {NODE}\n  user:\n    \
         client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: site\n  \
         context:\n    cluster: site\n    user: {NODE}\ncurrent-context: site\n"
    )
}

/// The workload: one replica of [`APP_IMAGE`] on [`NODE`], never pulled, no API token.
fn deployment() -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: site-app\n  namespace: default\n\
         spec:\n  replicas: 1\n  selector:\n    matchLabels:\n      app: site-app\n  template:\n    \
         metadata:\n      labels:\n        app: site-app\n    spec:\n      \
         automountServiceAccountToken: false\n      nodeSelector:\n        \
         kubernetes.io/hostname: {NODE}\n      containers:\n      - name: app\n        \
         image: {APP_IMAGE}\n        imagePullPolicy: Never\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_are_yaml_of_the_right_shape() {
        let d: serde_json::Value = yaml(&deployment());
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["image"],
            APP_IMAGE
        );
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "Never"
        );
        let k: serde_json::Value = yaml(&node_kubeconfig(
            "https://10.0.2.2:1",
            "Q0E=",
            "Q0VSVA==",
            "S0VZ",
        ));
        assert_eq!(k["clusters"][0]["cluster"]["server"], "https://10.0.2.2:1");
        assert_eq!(k["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(k["current-context"], "site");
    }

    /// containerd 1.6's `ctr images ls` output, as the guest prints it.
    #[test]
    fn the_agent_image_line_is_found_with_its_platforms() {
        let out = "REF TYPE DIGEST SIZE PLATFORMS LABELS \n\
                   docker.io/library/k3os-ops:0.2.0 application/vnd.oci.image.index.v1+json sha256:ab 9.6 MiB linux/arm64 io.cri-containerd.image=managed \n\
                   k3os.test/site-app:g1-kube application/vnd.oci.image.manifest.v1+json sha256:cd 1.2 MiB linux/arm64 - \n";
        let line = agent_image_line(out).unwrap();
        assert!(line.starts_with("docker.io/library/k3os-ops:0.2.0 application/"));
        assert!(line.split(' ').any(|w| w == "linux/arm64"));
        assert_eq!(
            agent_image_line("REF TYPE\nk3os.test/pause:busybox x\n"),
            None
        );
    }

    #[test]
    fn a_refused_kubelet_is_told_from_one_that_waits() {
        let log = "I1207 10:00:00 kubelet.go:1 \"Starting kubelet\"\n\
E1207 10:00:05 kubelet_node_status.go:99 \"Unable to register node with API server\" err=\"Post \\\"https://10.0.2.2:1/api/v1/nodes\\\": tls: failed to verify certificate: x509: certificate signed by unknown authority\" node=\"kube-node-1\"\n";
        let line = refusal(log).unwrap();
        assert!(
            line.contains("x509") && line.contains("kube-node-1"),
            "{line}"
        );
        assert_eq!(refusal("I1207 \"Attempting to register node\"\n"), None);
    }

    fn yaml(text: &str) -> serde_json::Value {
        serde_yaml::from_str(text).unwrap()
    }
}
