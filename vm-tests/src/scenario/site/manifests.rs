//! What `site-upgrade` applies, as a user writes it: the kustomize overlay over
//! `k3os-ops/deploy` for a node without kube-proxy whose images come with the slot, the site's
//! workload with its PodDisruptionBudget, the v2-only app and the UpdateChannel.

use super::super::kube::NODE;

/// The namespace of `k3os-ops/deploy`.
pub(super) const AGENT_NS: &str = "k3os-system";
/// The DaemonSet's pod label.
pub(super) const AGENT_LABEL: &str = "app.kubernetes.io/name=k3os-ops-agent";
/// The UpdateChannel's name.
pub(super) const CHANNEL: &str = "site";
/// The version the channel pins.
pub(super) const TARGET: &str = "v2-kube";
/// The workload: in both releases' payloads (the sandbox image, busybox), answering on 8080.
pub(super) const WEB: &str = "site-web";
/// The workload's image.
pub(super) const WEB_IMAGE: &str = k3os_images::oci::KUBE_PAUSE_IMAGE;
/// The app whose image only v2-kube's payload carries.
pub(super) const APP: &str = "site-app";
/// Its image (images/src/oci.rs, `kube_images(2)`).
pub(super) const APP_IMAGE: &str = "k3os.test/site-app:g2-kube";

/// The overlay's `kustomization.yaml`: `deploy` (the path of `k3os-ops/deploy` relative to
/// the overlay; kustomize refuses absolute ones) with the agent's image never pulled (every
/// `-kube` release carries it), the API server's address for a node without kube-proxy
/// (`KUBERNETES_SERVICE_HOST`/`PORT`, what a kube-proxy-less CNI's users set), and the host's
/// `/run/k3os-ops` (the test OS links `/etc/k3os-ops/config.toml` to this boot's config there).
pub(super) fn overlay(deploy: &str, api_host: &str, api_port: u16) -> String {
    format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n\
         - {deploy}\npatches:\n- target: {{kind: DaemonSet, name: k3os-ops-agent}}\n  patch: |-\n    \
         - {{op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}}\n    \
         - op: add\n      path: /spec/template/spec/containers/0/env/-\n      \
         value: {{name: KUBERNETES_SERVICE_HOST, value: \"{api_host}\"}}\n    \
         - op: add\n      path: /spec/template/spec/containers/0/env/-\n      \
         value: {{name: KUBERNETES_SERVICE_PORT, value: \"{api_port}\"}}\n    \
         - op: add\n      path: /spec/template/spec/containers/0/volumeMounts/-\n      \
         value: {{name: run-k3os-ops, mountPath: /run/k3os-ops, readOnly: true}}\n    \
         - op: add\n      path: /spec/template/spec/volumes/-\n      \
         value: {{name: run-k3os-ops, hostPath: {{path: /run/k3os-ops, type: Directory}}}}\n"
    )
}

/// The site's workload: [`WEB`] (one replica answering on 8080, Ready while it does) with a
/// PodDisruptionBudget that lets a drain evict it (on a single node nothing else can run it:
/// `minAvailable: 1` would hold the drain until its timeout), and [`APP`], whose image only
/// the v2 payload carries (on v1 its pod waits with `ErrImageNeverPull`).
pub(super) fn workload() -> String {
    let pod = |name: &str, image: &str, args: &str, probe: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: default\n\
             spec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    \
             metadata:\n      labels: {{app: {name}}}\n    spec:\n      \
             automountServiceAccountToken: false\n      terminationGracePeriodSeconds: 10\n      \
             nodeSelector: {{kubernetes.io/hostname: {NODE}}}\n      containers:\n      \
             - name: main\n        image: {image}\n        imagePullPolicy: Never\n{args}{probe}"
        )
    };
    let web = pod(
        WEB,
        WEB_IMAGE,
        "        args: [httpd, -f, -p, \"8080\", -h, /]\n",
        "        readinessProbe:\n          tcpSocket: {port: 8080}\n          periodSeconds: 2\n",
    );
    let app = pod(APP, APP_IMAGE, "", "");
    format!(
        "{web}---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: {WEB}\n  \
         namespace: default\nspec:\n  maxUnavailable: 1\n  selector:\n    matchLabels: {{app: {WEB}}}\n\
         ---\n{app}"
    )
}

/// The UpdateChannel: `version` from the channel at `url`, one node at a time, any time,
/// pausing after one failure; `reboot_timeout` is also the trial boot's limit for the agent's
/// Node-Ready (agent/reconcile/steps.rs).
pub(super) fn update_channel(url: &str, version: &str, reboot_timeout: &str) -> String {
    format!(
        "apiVersion: k3os.io/v1\nkind: UpdateChannel\nmetadata:\n  name: {CHANNEL}\n  \
         namespace: {AGENT_NS}\nspec:\n  url: {url}\n  version: {version}\n  concurrency: 1\n  \
         drain: {{timeout: 5m, gracePeriod: 10}}\n  rebootTimeout: {reboot_timeout}\n  \
         maxFailures: 1\n"
    )
}

/// The path of `to` relative to `from` (both absolute, under one root), as kustomize wants
/// its resources.
pub(super) fn relative(from: &std::path::Path, to: &std::path::Path) -> String {
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".into(); f.len() - common];
    parts.extend(
        t[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(text: &str) -> Vec<serde_json::Value> {
        text.split("\n---\n")
            .map(|d| serde_yaml::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn the_manifests_are_yaml_of_the_right_shape() {
        let o = &docs(&overlay("../../deploy", "10.0.2.2", 6443))[0];
        assert_eq!(o["resources"][0], "../../deploy");
        let patch: Vec<serde_json::Value> =
            serde_yaml::from_str(o["patches"][0]["patch"].as_str().unwrap()).unwrap();
        assert_eq!(patch[0]["value"], "Never");
        assert_eq!(patch[1]["value"]["name"], "KUBERNETES_SERVICE_HOST");
        assert_eq!(patch[2]["value"]["value"], "6443");
        assert_eq!(patch[4]["value"]["hostPath"]["path"], "/run/k3os-ops");

        let w = docs(&workload());
        assert_eq!(w.len(), 3);
        let web = &w[0]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(web["image"], WEB_IMAGE);
        assert_eq!(web["readinessProbe"]["tcpSocket"]["port"], 8080);
        assert_eq!(w[1]["kind"], "PodDisruptionBudget");
        assert_eq!(w[1]["spec"]["maxUnavailable"], 1);
        let app = &w[2]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(app["image"], APP_IMAGE);
        assert_eq!(app["imagePullPolicy"], "Never");

        let c = &docs(&update_channel("http://10.0.2.2:1/", TARGET, "20m"))[0];
        assert_eq!(c["spec"]["version"], TARGET);
        assert_eq!(c["spec"]["rebootTimeout"], "20m");
        assert_eq!(c["spec"]["url"], "http://10.0.2.2:1/");
        assert_eq!(c["spec"]["drain"]["timeout"], "5m");
    }

    #[test]
    fn relative_paths_climb_to_the_common_root() {
        use std::path::Path;
        assert_eq!(
            relative(
                Path::new("/r/vm-tests/out/t/s/overlay"),
                Path::new("/r/k3os-ops/deploy")
            ),
            "../../../../../k3os-ops/deploy"
        );
    }
}
