//! Shared by the container image tests (`agent_image`, `suc_plan`): the OCI archive `just
//! image` writes, its amd64 rootfs unpacked into a runc bundle, and running a process of it
//! under `runc` with the mounts, namespaces and privileges a Kubernetes pod spec gives it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

/// The archive's image reference (deploy/daemonset.yaml and deploy/suc/plan.yaml run it).
pub const REFERENCE: &str = "docker.io/library/k3os-ops:0.2.0";

pub fn archive() -> PathBuf {
    if let Ok(p) = std::env::var("K3OS_OPS_OCI_ARCHIVE") {
        return PathBuf::from(p);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("oci/k3os-ops.oci.tar")
}

pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e} (scripts/setup.sh installs runc and skopeo)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn need_archive() -> PathBuf {
    let a = archive();
    assert!(
        a.is_file(),
        "{} missing: build it with `just image` (or set K3OS_OPS_OCI_ARCHIVE)",
        a.display()
    );
    a
}

/// Read `path` of the OCI archive.
pub fn member(a: &Path, path: &str) -> Vec<u8> {
    let mut t = tar::Archive::new(std::fs::File::open(a).unwrap());
    for e in t.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_str() == Some(path) {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut out).unwrap();
            return out;
        }
    }
    panic!("{path} not in {}", a.display());
}

pub fn blob(a: &Path, digest: &Value) -> Vec<u8> {
    let d = digest.as_str().unwrap().trim_start_matches("sha256:");
    member(a, &format!("blobs/sha256/{d}"))
}

/// The amd64 image's rootfs unpacked into `rootfs`, and its config.
pub fn unpack_amd64(a: &Path, rootfs: &Path) -> Value {
    let index: Value = serde_json::from_slice(&member(a, "index.json")).unwrap();
    let images: Value = serde_json::from_slice(&blob(a, &index["manifests"][0]["digest"])).unwrap();
    let m = images["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["platform"]["architecture"] == "amd64")
        .expect("amd64 manifest");
    let manifest: Value = serde_json::from_slice(&blob(a, &m["digest"])).unwrap();
    let config: Value = serde_json::from_slice(&blob(a, &manifest["config"]["digest"])).unwrap();
    for l in manifest["layers"].as_array().unwrap() {
        let gz = blob(a, &l["digest"]);
        tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]))
            .unpack(rootfs)
            .unwrap();
    }
    config
}

/// A bind mount of the host's `source` at `destination` in the container.
pub fn bind(destination: &str, source: &Path, read_only: bool) -> Value {
    json!({
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", if read_only { "ro" } else { "rw" }],
    })
}

/// The host namespaces a pod shares (`hostPID`, `hostIPC`, `hostNetwork`).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostNamespaces {
    pub pid: bool,
    pub ipc: bool,
    pub network: bool,
}

/// One process of the image under runc: `args` (the image's entrypoint already resolved),
/// `env`, extra `mounts`, the pod's host namespaces, and the container's privileges:
/// `privileged` (every capability, no seccomp, no masked or read-only /proc and /sys paths,
/// every device) or runc's default capabilities plus `add_caps`.
pub struct Process<'a> {
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub mounts: Vec<Value>,
    pub host: HostNamespaces,
    pub privileged: bool,
    pub add_caps: &'a [&'a str],
}

/// The capabilities in kernel order (bit n of a capability set is `CAPS[n]`).
const CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// What a privileged container gets: every capability this process may hold (its bounding
/// set), as containerd gives one.
fn privileged_caps() -> Vec<&'static str> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bnd = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .expect("CapBnd in /proc/self/status");
    let bits = u64::from_str_radix(bnd.trim(), 16).unwrap();
    CAPS.iter()
        .enumerate()
        .filter(|(i, _)| bits & (1u64 << i) != 0)
        .map(|(_, c)| *c)
        .collect()
}

/// A runc bundle of the amd64 image, made once per test; each [`Bundle::run`] writes its own
/// `config.json` and runs one container to its end.
pub struct Bundle {
    pub dir: PathBuf,
    /// The image config's `Entrypoint` (what a pod runs when its spec gives no `command`).
    pub entrypoint: Vec<String>,
}

impl Bundle {
    pub fn new(archive: &Path, dir: &Path) -> Bundle {
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        let config = unpack_amd64(archive, &rootfs);
        let entrypoint = config["config"]["Entrypoint"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        Bundle {
            dir: dir.to_path_buf(),
            entrypoint,
        }
    }

    /// Run `p` to its end (at most `timeout_secs`) as container `id`.
    pub fn run(&self, id: &str, p: &Process, timeout_secs: u32) -> Output {
        let _ = std::fs::remove_file(self.dir.join("config.json"));
        run(Command::new("runc").arg("spec").current_dir(&self.dir));
        let spec_path = self.dir.join("config.json");
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
        spec["process"]["args"] = json!(p.args);
        spec["process"]["terminal"] = json!(false);
        spec["process"]["env"] = json!(p.env);
        spec["root"]["readonly"] = json!(false);
        spec["mounts"]
            .as_array_mut()
            .unwrap()
            .extend(p.mounts.iter().cloned());
        let shared: Vec<&str> = [
            (p.host.pid, "pid"),
            (p.host.ipc, "ipc"),
            (p.host.network, "network"),
        ]
        .into_iter()
        .filter_map(|(on, ns)| on.then_some(ns))
        .collect();
        spec["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .retain(|n| !shared.contains(&n["type"].as_str().unwrap_or("")));
        let caps = &mut spec["process"]["capabilities"];
        for set in ["bounding", "effective", "permitted"] {
            let list = caps[set].as_array_mut().unwrap();
            if p.privileged {
                *list = privileged_caps().into_iter().map(|c| json!(c)).collect();
            } else {
                list.extend(p.add_caps.iter().map(|c| json!(c)));
            }
        }
        if p.privileged {
            let linux = spec["linux"].as_object_mut().unwrap();
            linux.remove("seccomp");
            linux.remove("maskedPaths");
            linux.remove("readonlyPaths");
            linux.insert(
                "resources".into(),
                json!({"devices": [{"allow": true, "access": "rwm"}]}),
            );
        }
        std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let out = Command::new("timeout")
            .arg(timeout_secs.to_string())
            .args(["runc", "run", "--bundle"])
            .arg(&self.dir)
            .arg(id)
            .output()
            .expect("run runc (scripts/setup.sh installs it)");
        let _ = Command::new("runc")
            .args(["delete", "--force", id])
            .output();
        out
    }
}
