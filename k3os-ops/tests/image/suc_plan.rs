//! deploy/suc/plan.yaml, the system-upgrade-controller Plan: it uses only fields of SUC's Plan
//! type (upgrade.cattle.io/v1) and the DaemonSet's host mounts; its `prepare` container stages
//! the version the Plan pins, its `upgrade` container activates it and reboots, and both are
//! no-ops when SUC runs them again after that reboot, or refusals when the version failed here.
//!
//! The containers' commands run against a node under a temp root (dir layout, real GRUB env
//! files, a channel served on 127.0.0.1), their environment made as SUC makes it
//! (`SYSTEM_UPGRADE_PLAN_LATEST_VERSION` = `spec.version`, `$(VAR)` expanded as the kubelet
//! does). `plan_commands_*` run them with this build's binary on the host (in `cargo test`);
//! `runc_runs_the_plans_containers_*` runs them in the image under runc with exactly the
//! Plan's mounts, host namespaces and privileges (ignored in `cargo test`: it needs the OCI
//! archive and root; `just image-test` runs it). The reboot is intercepted with
//! `K3OS_OPS_REBOOT_CMD` (the command `upgrade --reboot` runs instead of rebooting).

use crate::oci_support;
use k3os_ops_testing::release as release_support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bootconfig::{BootEnv, Slot, SlotBoot};
use libupgrade::manifest::Arch;
use oci_support::{Bundle, HostNamespaces, Process, REFERENCE};
use release_support::{bin, create, fake_inputs, keys, Server};
use serde_yaml::Value;

/// The version the tests pin in the Plan (its channel holds it).
const VERSION: &str = "v2";

fn plan() -> Value {
    let text =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/suc/plan.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

// SUC's Plan schema: the json names of rancher/system-upgrade-controller's
// pkg/apis/upgrade.cattle.io/v1/types.go (PlanSpec, ContainerSpec, VolumeSpec, DrainSpec).
const PLAN_SPEC: &[&str] = &[
    "concurrency",
    "jobActiveDeadlineSecs",
    "nodeSelector",
    "serviceAccountName",
    "channel",
    "version",
    "secrets",
    "tolerations",
    "exclusive",
    "window",
    "prepare",
    "upgrade",
    "cordon",
    "drain",
    "imagePullSecrets",
    "postCompleteDelay",
    "priorityClassName",
    "postCompleteLabels",
];
const CONTAINER_SPEC: &[&str] = &[
    "image",
    "command",
    "args",
    "envs",
    "envFrom",
    "volumes",
    "securityContext",
];
const VOLUME_SPEC: &[&str] = &["name", "source", "destination"];
const DRAIN_SPEC: &[&str] = &[
    "timeout",
    "gracePeriod",
    "deleteLocalData",
    "deleteEmptydirData",
    "ignoreDaemonSets",
    "force",
    "disableEviction",
    "skipWaitForDeleteTimeout",
    "podSelector",
];
/// What SUC puts into every container's environment (pkg/upgrade/container/container.go).
const SUC_ENV: &[&str] = &[
    "SYSTEM_UPGRADE_NODE_NAME",
    "SYSTEM_UPGRADE_POD_NAME",
    "SYSTEM_UPGRADE_POD_UID",
    "SYSTEM_UPGRADE_PLAN_NAME",
    "SYSTEM_UPGRADE_PLAN_LATEST_HASH",
    "SYSTEM_UPGRADE_PLAN_LATEST_VERSION",
];

fn keys_of(v: &Value) -> Vec<String> {
    v.as_mapping()
        .unwrap_or_else(|| panic!("expected a mapping: {v:?}"))
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

fn assert_fields(what: &str, v: &Value, allowed: &[&str]) {
    for k in keys_of(v) {
        assert!(
            allowed.contains(&k.as_str()),
            "{what}: `{k}` is not a field of SUC's Plan type (has: {allowed:?})"
        );
    }
}

/// The `$(NAME)` references of `s`.
fn references(s: &str) -> Vec<String> {
    s.split("$(")
        .skip(1)
        .filter_map(|r| r.split_once(')').map(|(n, _)| n.to_string()))
        .collect()
}

/// The host paths the agent's DaemonSet mounts, but its offline-bundle directory
/// (`K3OS_OPS_BUNDLE_DIR`): only the agent looks there; the Plan's containers stage the version
/// the Plan pins from its channel.
fn daemonset_mounts() -> Vec<(String, String)> {
    let text = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/daemonset.yaml"
    ))
    .unwrap();
    let ds: Value = serde_yaml::from_str(&text).unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let mut out: Vec<(String, String)> = pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| {
            let vol = pod["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap();
            (
                vol["hostPath"]["path"].as_str().unwrap().to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
            )
        })
        .filter(|(_, mount)| mount != "/bundles")
        .collect();
    out.sort();
    out
}

fn container_mounts(c: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = c["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["source"].as_str().unwrap().to_string(),
                v["destination"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn plan_uses_only_fields_of_the_suc_plan_schema() {
    let p = plan();
    assert_eq!(p["apiVersion"], "upgrade.cattle.io/v1");
    assert_eq!(p["kind"], "Plan");
    assert!(p["metadata"]["name"].is_string() && p["metadata"]["namespace"].is_string());
    let spec = &p["spec"];
    assert_fields("spec", spec, PLAN_SPEC);
    assert!(
        spec["version"].as_str().is_some_and(|v| !v.is_empty()),
        "the Plan pins a version"
    );
    assert_fields("spec.drain", &spec["drain"], DRAIN_SPEC);
    let upgrade_volumes = container_mounts(&spec["upgrade"]);
    for name in ["prepare", "upgrade"] {
        let c = &spec[name];
        assert_fields(&format!("spec.{name}"), c, CONTAINER_SPEC);
        // Without a tag SUC would append spec.version (a release name) as the image tag.
        assert_eq!(c["image"], REFERENCE, "spec.{name}.image");
        for v in c["volumes"].as_sequence().unwrap() {
            assert_fields(&format!("spec.{name}.volumes"), v, VOLUME_SPEC);
            for f in VOLUME_SPEC {
                assert!(v[*f].is_string(), "spec.{name}.volumes: {f} is required");
            }
        }
        // SUC declares the pod's hostPath volumes from `upgrade.volumes` only.
        assert_eq!(container_mounts(c), upgrade_volumes, "spec.{name}.volumes");
        assert_eq!(
            container_mounts(c),
            daemonset_mounts(),
            "spec.{name} mounts what the agent's DaemonSet mounts"
        );
        let envs: Vec<String> = c["envs"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|e| {
                assert!(e["value"].is_string(), "spec.{name}.envs: {e:?}");
                e["name"].as_str().unwrap().to_string()
            })
            .collect();
        for a in c["args"].as_sequence().unwrap() {
            for r in references(a.as_str().unwrap()) {
                assert!(
                    envs.contains(&r) || SUC_ENV.contains(&r.as_str()),
                    "spec.{name}.args: $({r}) is neither in envs nor set by SUC"
                );
            }
        }
    }
    assert_eq!(
        spec["prepare"]["securityContext"]["privileged"],
        Value::Bool(true),
        "SUC gives prepare no privileges of its own; it writes the disk"
    );
}

/// A node under a temp root `host` (what SUC mounts at /host) and its release channel.
struct Node {
    host: tempfile::TempDir,
    work: tempfile::TempDir,
    server: Server,
}

impl Node {
    fn new() -> Node {
        let host = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let h = host.path();
        for d in [
            "boot/grub",
            "var/lib/k3os-ops",
            "k3os/system",
            "etc/k3os-ops/health.d",
            "etc/k3os-ops/trust.d",
            "run/test-kernel",
        ] {
            fs::create_dir_all(h.join(d)).unwrap();
        }
        let (secret, trust) = keys(work.path(), "plan");
        fs::copy(
            trust.join("plan.pub"),
            h.join("etc/k3os-ops/trust.d/plan.pub"),
        )
        .unwrap();
        bootconfig::GrubBootloader::new(h.join("boot/grub"), 3)
            .install(&BootEnv {
                primary: Slot::A,
                a: SlotBoot::Good,
                b: SlotBoot::Bad,
            })
            .unwrap();
        fs::write(h.join("run/test-kernel/mountinfo"), "").unwrap();
        // The config inside the containers: the Plan's mounts, and the node's dir layout and
        // kernel files (plain files here) through /host.
        fs::write(h.join("etc/k3os-ops/config.toml"), config("", "/host")).unwrap();
        // The same node seen from the host (init's confirm, the checks of this test).
        let hs = h.to_str().unwrap();
        fs::write(h.join("etc/k3os-ops/host.toml"), config(hs, hs)).unwrap();
        let server = Server::start(&channel(work.path(), &secret));
        let n = Node { host, work, server };
        n.boot(Slot::A, "boot-1", "v1", 1);
        n
    }

    fn path(&self) -> &Path {
        self.host.path()
    }

    /// The kernel booted `slot` running `version` (init mounted its rootfs).
    fn boot(&self, slot: Slot, boot_id: &str, version: &str, generation: u64) {
        let h = self.path();
        fs::write(
            h.join("run/test-kernel/cmdline"),
            format!("ro k3os.slot={slot}\n"),
        )
        .unwrap();
        fs::write(h.join("run/test-kernel/boot_id"), format!("{boot_id}\n")).unwrap();
        fs::write(
            h.join("etc/k3os-release"),
            format!("VERSION={version}\nGENERATION={generation}\n"),
        )
        .unwrap();
    }

    /// `k3os-ops ARGS` on the host (as init runs it).
    fn host_ops(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .env(
                "K3OS_OPS_CONFIG",
                self.path().join("etc/k3os-ops/host.toml"),
            )
            .env_remove("K3OS_OPS_REBOOT_CMD")
            .output()
            .unwrap()
    }

    /// Slot `slot`'s state and version in `slot status --json`, and the next boot.
    fn slot(&self, slot: &str) -> (String, String, String) {
        let out = self.host_ops(&["slot", "status", "--json"]);
        assert!(out.status.success(), "{out:?}");
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let s = st["slots"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["slot"] == slot)
            .unwrap();
        (
            s["state"].as_str().unwrap().to_string(),
            s["version"].as_str().unwrap_or("-").to_string(),
            st["next_boot"].as_str().unwrap().to_string(),
        )
    }

    /// The Plan as SUC would run it here: `spec.version` pinned to [`VERSION`], the channel
    /// this node's server.
    fn plan(&self) -> Value {
        let mut p = plan();
        p["spec"]["version"] = Value::from(VERSION);
        for c in ["prepare", "upgrade"] {
            for e in p["spec"][c]["envs"].as_sequence_mut().unwrap() {
                if e["name"] == "K3OS_OPS_CHANNEL" {
                    e["value"] = Value::from(self.server.url.clone());
                }
            }
        }
        p
    }
}

/// The node config with state, boot and config paths under `root` and the dir layout and the
/// kernel's files under `kernel`.
fn config(root: &str, kernel: &str) -> String {
    format!(
        r#"bootloader = "grub"
tries = 3
state_dir = "{root}/var/lib/k3os-ops"
trust_dir = "{root}/etc/k3os-ops/trust.d"
health_dir = "{root}/etc/k3os-ops/health.d"
health_timeout_secs = 5
proc_cmdline = "{kernel}/run/test-kernel/cmdline"
release_file = "{root}/etc/k3os-release"
mountinfo = "{kernel}/run/test-kernel/mountinfo"
boot_id_file = "{kernel}/run/test-kernel/boot_id"
builtin_health_check = false
[layout]
kind = "dir"
root = "{kernel}/k3os/system"
boot_dir = "{root}/boot"
"#
    )
}

/// A channel in `dir/channel` holding [`VERSION`] (generation 2, a real squashfs: staging
/// checks the image it wrote), signed with `secret`, indexed by `release index`.
fn channel(dir: &Path, secret: &Path) -> PathBuf {
    let tree = dir.join("v2.tree/etc");
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("k3os-release"), "VERSION=v2\nGENERATION=2\n").unwrap();
    let inputs = fake_inputs(&dir.join("v2.in"), VERSION);
    fs::remove_file(&inputs.0).unwrap();
    let out = Command::new("mksquashfs")
        .arg(dir.join("v2.tree"))
        .arg(&inputs.0)
        .args(["-noappend", "-quiet", "-all-root"])
        .output()
        .expect("mksquashfs (squashfs-tools, installed by scripts/setup.sh)");
    assert!(out.status.success(), "{out:?}");
    let ch = dir.join("channel");
    create(
        &inputs,
        secret,
        &ch.join(VERSION),
        VERSION,
        Arch::host(),
        Some(2),
    );
    let out = Command::new(bin())
        .args(["release", "index"])
        .arg(&ch)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    ch
}

/// A container of the Plan as SUC makes it: its args with `$(VAR)` expanded from its
/// environment (SUC's variables and the Plan's `envs`), and that environment.
fn container(plan: &Value, name: &str) -> (Vec<String>, Vec<(String, String)>) {
    let spec = &plan["spec"];
    let c = &spec[name];
    assert!(
        c["command"].is_null(),
        "spec.{name}: the image's entrypoint (k3os-ops) runs"
    );
    let mut env: Vec<(String, String)> = vec![
        ("SYSTEM_UPGRADE_NODE_NAME".into(), "node-1".into()),
        ("SYSTEM_UPGRADE_POD_NAME".into(), format!("apply-{name}")),
        ("SYSTEM_UPGRADE_POD_UID".into(), "0000".into()),
    ];
    for e in c["envs"].as_sequence().unwrap() {
        env.push((
            e["name"].as_str().unwrap().into(),
            e["value"].as_str().unwrap().into(),
        ));
    }
    env.push((
        "SYSTEM_UPGRADE_PLAN_NAME".into(),
        plan["metadata"]["name"].as_str().unwrap().into(),
    ));
    env.push(("SYSTEM_UPGRADE_PLAN_LATEST_HASH".into(), "hash".into()));
    env.push((
        "SYSTEM_UPGRADE_PLAN_LATEST_VERSION".into(),
        spec["version"].as_str().unwrap().into(),
    ));
    let args = c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| {
            let mut a = a.as_str().unwrap().to_string();
            for (k, v) in &env {
                a = a.replace(&format!("$({k})"), v);
            }
            assert!(!a.contains("$("), "unexpanded reference in {a}");
            a
        })
        .collect();
    (args, env)
}

/// Runs one of the Plan's containers to its end (`extra`: environment the test adds).
type Runner<'a> = dyn FnMut(&str, &[(&str, String)]) -> Output + 'a;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What the Plan does to the node, in SUC's order: prepare stages (and again: a no-op),
/// upgrade activates and "reboots"; the node boots B and init's confirm blesses it; SUC runs
/// the pod again and both containers find the work done.
fn plan_converges(n: &Node, run: &mut Runner) {
    // `{bin}`: the runner's k3os-ops; it prints its version where the reboot would be.
    let reboot_cmd = [("K3OS_OPS_REBOOT_CMD", "{bin} --version".to_string())];
    let o = run("prepare", &[]);
    assert!(o.status.success(), "prepare: {}", text(&o));
    assert!(
        text(&o).contains(&format!("staged {VERSION}")) && text(&o).contains("into slot B"),
        "{}",
        text(&o)
    );
    assert_eq!(n.slot("B"), ("staged".into(), VERSION.into(), "A".into()));
    let o = run("prepare", &[]);
    assert!(
        o.status.success() && text(&o).contains(&format!("slot B already holds {VERSION}")),
        "a second prepare is a no-op: {}",
        text(&o)
    );

    let o = run("upgrade", &reboot_cmd);
    let t = text(&o);
    assert!(o.status.success(), "upgrade: {t}");
    let activated = t.find("activated slot B").expect("upgrade activates B");
    let rebooting = t.find("rebooting").expect("upgrade reboots");
    assert!(
        activated < rebooting && t[rebooting..].contains("k3os-ops 0.2.0"),
        "the reboot command ran after the activation: {t}"
    );
    assert_eq!(n.slot("B"), ("trying".into(), VERSION.into(), "B".into()));

    n.boot(Slot::B, "boot-2", VERSION, 2);
    let o = n.host_ops(&["slot", "confirm"]);
    assert!(
        o.status.success() && text(&o).contains("slot B (v2) is good (confirmed now)"),
        "init's confirm: {}",
        text(&o)
    );
    for c in ["prepare", "upgrade"] {
        let o = run(c, &reboot_cmd);
        let t = text(&o);
        assert!(
            o.status.success() && t.contains("slot B already runs v2 (good): nothing to do"),
            "{c} after the reboot: {t}"
        );
        assert!(!t.contains("rebooting"), "{c} after the reboot: {t}");
    }
    assert_eq!(n.slot("A"), ("good".into(), "v1".into(), "B".into()));
    assert_eq!(n.slot("B"), ("good".into(), VERSION.into(), "B".into()));
}

/// The Plan's containers with this build's binary on the host; their config path rewritten
/// to the host's view of the node (the Plan's mounts are runc's part).
fn host_runner(n: &Node) -> impl FnMut(&str, &[(&str, String)]) -> Output + '_ {
    let plan = n.plan();
    move |name, extra| {
        let (args, env) = container(&plan, name);
        let mut cmd = Command::new(bin());
        cmd.args(&args).env_clear().env("PATH", "/usr/bin:/bin");
        for (k, v) in env.iter().filter(|(k, _)| k != "K3OS_OPS_CONFIG") {
            cmd.env(k, v);
        }
        cmd.env("K3OS_OPS_CONFIG", n.path().join("etc/k3os-ops/host.toml"));
        for (k, v) in extra {
            cmd.env(k, v.replace("{bin}", bin()));
        }
        cmd.output().unwrap()
    }
}

#[test]
fn plan_commands_stage_then_activate_and_are_done_after_the_reboot() {
    let n = Node::new();
    let mut run = host_runner(&n);
    plan_converges(&n, &mut run);
}

/// A version that failed here (its health check failed at boot, the node rolled back) is not
/// staged or activated again: both containers fail naming why, so the Job fails instead of
/// looping through failed trials.
#[test]
fn plan_commands_refuse_a_version_that_failed_on_the_node() {
    let n = Node::new();
    let mut run = host_runner(&n);
    assert!(run("prepare", &[]).status.success());
    let o = run(
        "upgrade",
        &[("K3OS_OPS_REBOOT_CMD", "{bin} --version".into())],
    );
    assert!(o.status.success(), "{}", text(&o));
    n.boot(Slot::B, "boot-2", VERSION, 2);
    let check = n.path().join("etc/k3os-ops/health.d/50-app");
    fs::write(&check, "#!/bin/sh\necho app is down; exit 1\n").unwrap();
    fs::set_permissions(&check, fs::Permissions::from_mode(0o755)).unwrap();
    let o = n.host_ops(&["slot", "confirm"]);
    assert!(!o.status.success(), "{}", text(&o));
    // Back on A: v1's rootfs, without v2's failing check.
    fs::remove_file(&check).unwrap();
    n.boot(Slot::A, "boot-3", "v1", 1);
    let o = n.host_ops(&["slot", "confirm"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(n.slot("B").0, "bad");
    for c in ["prepare", "upgrade"] {
        let o = run(c, &[("K3OS_OPS_REBOOT_CMD", "false".into())]);
        let t = text(&o);
        assert!(
            !o.status.success()
                && t.contains("failed here: v2 (generation 2) failed 1 time(s) on this node")
                && t.contains("50-app"),
            "{c}: {t}"
        );
    }
    assert_eq!(n.slot("B"), ("bad".into(), VERSION.into(), "A".into()));
}

/// The Plan's containers in the image under runc, with what SUC's Job pod gives them: the
/// host's root at /host, the pod info at /run/system-upgrade/pod, the Plan's volumes (host
/// side under the node's temp root, /dev the real one), hostPID/hostIPC/hostNetwork, and the
/// privileges: `prepare` its securityContext, `upgrade` SUC's default (privileged, plus
/// CAP_SYS_BOOT) unless the Plan sets one.
#[test]
#[ignore = "needs `just image` first and root; run with `just image-test`"]
fn runc_runs_the_plans_containers_with_their_mounts_and_privileges() {
    let a = oci_support::need_archive();
    let n = Node::new();
    let bundle = Bundle::new(&a, &n.work.path().join("bundle"));
    let pod_info = n.work.path().join("pod-info");
    fs::create_dir_all(&pod_info).unwrap();
    fs::write(
        pod_info.join("labels"),
        "upgrade.cattle.io/plan=\"k3os-ops\"\n",
    )
    .unwrap();
    fs::write(pod_info.join("annotations"), "").unwrap();
    let plan = n.plan();
    let mut count = 0;
    let mut run = |name: &str, extra: &[(&str, String)]| -> Output {
        let (args, env) = container(&plan, name);
        let c = &plan["spec"][name];
        let mut mounts = vec![
            oci_support::bind("/host", n.path(), false),
            oci_support::bind("/run/system-upgrade/pod", &pod_info, true),
        ];
        for v in c["volumes"].as_sequence().unwrap() {
            let src = v["source"].as_str().unwrap();
            let host_src = if src == "/dev" {
                PathBuf::from(src)
            } else {
                n.path().join(src.trim_start_matches('/'))
            };
            // SUC makes each volume a hostPath without a type, and containerd's CRI creates a
            // missing bind source as a directory (the airgap directory on a node before k3s
            // ever imported an image); runc alone would refuse the mount.
            if !host_src.exists() {
                fs::create_dir_all(&host_src).unwrap();
            }
            mounts.push(oci_support::bind(
                v["destination"].as_str().unwrap(),
                &host_src,
                false,
            ));
        }
        let sc = &c["securityContext"];
        let (privileged, add_caps): (bool, &[&str]) = if sc.is_null() && name == "upgrade" {
            (true, &["CAP_SYS_BOOT"])
        } else {
            (sc["privileged"] == Value::Bool(true), &[])
        };
        let mut full_env = vec!["PATH=/usr/bin".to_string()];
        full_env.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        full_env.extend(
            extra
                .iter()
                .map(|(k, v)| format!("{k}={}", v.replace("{bin}", "/usr/bin/k3os-ops"))),
        );
        let mut argv = bundle.entrypoint.clone();
        argv.extend(args);
        count += 1;
        let out = bundle.run(
            &format!("k3os-ops-suc-{}-{count}", std::process::id()),
            &Process {
                args: argv,
                env: full_env,
                mounts,
                host: HostNamespaces {
                    pid: true,
                    ipc: true,
                    network: true,
                },
                privileged,
                add_caps,
            },
            120,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("cannot be mounted") && !stderr.contains("runc run failed"),
            "runc refused the Plan's {name} container:\n{stderr}"
        );
        out
    };
    plan_converges(&n, &mut run);
}
