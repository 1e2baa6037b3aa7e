//! The agent's container image (`just image`): the OCI archive validates with skopeo, holds
//! amd64 and arm64, and runc runs the amd64 image with exactly the DaemonSet's mounts
//! (translated from deploy/daemonset.yaml into the runc bundle's config.json) far enough to
//! print the agent's start-up line. A mount runc refuses (like a hostPath at /proc/cmdline)
//! fails the test.
//!
//! Ignored in `cargo test`: it needs the archive built from the release musl binaries.
//! Run it with `just image-test` (builds the archive first). Needs root, runc and skopeo
//! (scripts/setup.sh installs both).

use crate::oci_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use oci_support::{need_archive, run, unpack_amd64, REFERENCE};
use serde_json::{json, Value};

#[test]
#[ignore = "needs `just image` first; run with `just image-test`"]
fn archive_validates_with_skopeo_for_both_platforms() {
    let a = need_archive();
    let src = format!("oci-archive:{}:{REFERENCE}", a.display());
    let raw: Value =
        serde_json::from_str(&run(Command::new("skopeo").args(["inspect", "--raw", &src])))
            .unwrap();
    assert_eq!(raw["mediaType"], "application/vnd.oci.image.index.v1+json");
    let mut archs: Vec<&str> = raw["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["platform"]["architecture"].as_str().unwrap())
        .collect();
    archs.sort();
    assert_eq!(archs, ["amd64", "arm64"]);
    for arch in ["amd64", "arm64"] {
        let info: Value = serde_json::from_str(&run(Command::new("skopeo").args([
            "inspect",
            "--override-os",
            "linux",
            "--override-arch",
            arch,
            &src,
        ])))
        .unwrap();
        assert_eq!(info["Architecture"], arch);
        assert_eq!(info["Os"], "linux");
        let cfg: Value = serde_json::from_str(&run(Command::new("skopeo").args([
            "inspect",
            "--config",
            "--override-arch",
            arch,
            &src,
        ])))
        .unwrap();
        assert_eq!(cfg["config"]["Entrypoint"], json!(["/usr/bin/k3os-ops"]));
        assert_eq!(cfg["config"]["Cmd"], json!(["agent"]));
    }
}

/// deploy/daemonset.yaml's agent container: (volumeMounts → OCI mounts with sources under
/// `host`, env names, hostPID).
fn daemonset_mounts(host: &Path) -> (Vec<Value>, bool) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/daemonset.yaml"
    ))
    .unwrap();
    let ds: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mut mounts = Vec::new();
    for m in c["volumeMounts"].as_sequence().unwrap() {
        let name = m["name"].as_str().unwrap();
        let vol = pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("volume {name} not declared"));
        let hp = &vol["hostPath"];
        let path = hp["path"]
            .as_str()
            .unwrap_or_else(|| panic!("volume {name}: only hostPath volumes are translated"));
        // The host side lives under `host` (the test must not write to the real /boot or
        // /var/lib), except /dev: the container needs the real device nodes (/dev/null) as in
        // the privileged pod.
        let src = if path == "/dev" {
            PathBuf::from(path)
        } else {
            host.join(path.trim_start_matches('/'))
        };
        match hp["type"].as_str().unwrap_or("") {
            _ if src.exists() => {}
            "File" | "FileOrCreate" => {
                std::fs::create_dir_all(src.parent().unwrap()).unwrap();
                std::fs::write(&src, "VERSION=v1\n").unwrap();
            }
            _ => std::fs::create_dir_all(&src).unwrap(),
        }
        let ro = m["readOnly"].as_bool().unwrap_or(false);
        mounts.push(json!({
            "destination": m["mountPath"].as_str().unwrap(),
            "type": "bind",
            "source": src,
            "options": ["rbind", if ro { "ro" } else { "rw" }],
        }));
    }
    (mounts, pod["hostPID"].as_bool().unwrap_or(false))
}

#[test]
#[ignore = "needs `just image` first and root; run with `just image-test`"]
fn runc_runs_the_amd64_image_with_the_daemonsets_mounts() {
    let a = need_archive();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let config = unpack_amd64(&a, &rootfs);
    run(Command::new("runc").arg("spec").current_dir(&bundle));
    let spec_path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    let mut args: Vec<Value> = config["config"]["Entrypoint"].as_array().unwrap().clone();
    args.extend(config["config"]["Cmd"].as_array().unwrap().iter().cloned());
    spec["process"]["args"] = json!(args);
    spec["process"]["terminal"] = json!(false);
    spec["process"]["env"] = json!([
        "PATH=/usr/bin",
        "NODE_NAME=image-test-node",
        "POD_NAME=k3os-ops-agent-test",
        "POD_NAMESPACE=k3os-system",
        "K3OS_OPS_CONFIG=/etc/k3os-ops/config.toml",
        "RUST_LOG=info",
    ]);
    spec["root"]["readonly"] = json!(false);
    let (mounts, host_pid) = daemonset_mounts(&dir.path().join("host"));
    // The node's config as the host holds it, read through the DaemonSet's read-only mount
    // (the agent opens the node before it connects); a directory layout, as the test has no
    // slot partitions.
    std::fs::write(
        dir.path().join("host/etc/k3os-ops/config.toml"),
        "bootloader = \"grub\"\n\
         state_dir = \"/var/lib/k3os-ops\"\n\
         [layout]\n\
         kind = \"dir\"\n\
         root = \"/var/lib/k3os-ops/test-slots\"\n\
         boot_dir = \"/boot\"\n",
    )
    .unwrap();
    spec["mounts"]
        .as_array_mut()
        .unwrap()
        .extend(mounts.iter().cloned());
    if host_pid {
        spec["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .retain(|n| n["type"] != "pid");
    }
    std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();

    let id = format!("k3os-ops-image-test-{}", std::process::id());
    let out = Command::new("timeout")
        .args(["60", "runc", "run", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .output()
        .expect("run runc (scripts/setup.sh installs it)");
    let _ = Command::new("runc")
        .args(["delete", "--force", &id])
        .output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("cannot be mounted") && !stderr.contains("runc run failed"),
        "runc refused the DaemonSet's mounts:\n{stderr}"
    );
    let line = stdout
        .lines()
        .chain(stderr.lines())
        .find(|l| l.contains("k3os-ops agent") && l.contains("starting on node image-test-node"))
        .unwrap_or_else(|| {
            panic!(
                "no start-up line (exit {:?}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
                out.status
            )
        });
    assert!(
        line.contains("kernel command line") && !line.contains("unreadable"),
        "/proc/cmdline must be readable in the container: {line}"
    );
    // Without a cluster the agent stops right after: it must say why, naming the API.
    assert!(
        stdout.contains("Kubernetes API") || stderr.contains("Kubernetes API"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}
