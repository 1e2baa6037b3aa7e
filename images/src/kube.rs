//! The Kubernetes node variant of the slot root (the `-kube` releases): what it adds to the
//! plain tree of [`crate::rootfs::populate`].
//!
//! - Debian 12's containerd, runc, CNI plugins (`bridge`, `host-local`, `loopback`,
//!   `portmap`) and iptables (legacy) with every shared library they link, from the tree
//!   `images/scripts/fetch-debs.sh --kube` extracts ([`KubeInputs::debs_root`]);
//! - the static kubelet from the Kubernetes assets directory ([`KubeInputs::assets`]);
//! - the configuration of containerd, the kubelet and the CNI bridge (`images/files/kube/`);
//! - the kernel modules they need, resolved from the Debian kernel's `modules.dep` with their
//!   dependencies, plus a `modules.dep` for busybox modprobe (`depmod -b`);
//! - `/sbin/init` = `images/files/kube-init.sh`, which runs before the plain init (moved to
//!   `/sbin/init.base`), and `/usr/sbin/k3os-kube-up` (`images/files/kube-up.sh`);
//! - the node config reads the mount table of PID 1 (`mountinfo = "/proc/1/mountinfo"`), as the
//!   agent's DaemonSet asks: its `rootfs` check then sees the host's root from the agent pod.
//!
//! Beside the root, every `-kube` release carries the agent's own OCI image
//! ([`KubeInputs::agent_image`], `just image`'s k3os-oci output for the target's platform) as a
//! second image-archive payload ([`AGENT_PAYLOAD_NAME`]): containerd imports it at every boot
//! like the site's images, so the DaemonSet runs it with `imagePullPolicy: Never`.
//!
//! The plain releases never read any of this: their build inputs are unchanged.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::debs::Debs;
use crate::error::{Error, IoContext, Result};
use crate::initramfs::kmod::ModDeps;
use crate::run::Cmd;
use crate::spec::Variant;
use crate::stamp::Stamp;

pub const INIT: &str = include_str!("../files/kube-init.sh");
pub const KUBE_UP: &str = include_str!("../files/kube-up.sh");
pub const CONTAINERD_CONFIG: &str = include_str!("../files/kube/containerd.toml");
pub const KUBELET_CONFIG: &str = include_str!("../files/kube/kubelet.yaml");
pub const CNI_CONFIG: &str = include_str!("../files/kube/cni.conflist");
/// Kernel modules the variant loads at boot, one a line (`#` comments), in load order.
pub const MODULES: &str = include_str!("../files/kube/modules");
/// The agent image's payload name in a `-kube` release (`release create --image NAME=FILE`).
pub const AGENT_PAYLOAD_NAME: &str = "k3os-ops-agent";
/// The node config line the variant adds: the agent pod (hostPID) reads the host's mounts.
pub const MOUNTINFO_LINE: &str = "mountinfo = \"/proc/1/mountinfo\"\n";

/// The CNI plugins the root carries (of the ~20 Debian ships): the bridge network and its
/// IPAM, the loopback containerd sets up itself, and portmap for host ports.
pub const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "loopback", "portmap"];

/// Parts of the extracted packages left out of the root: documentation, systemd units and
/// the CNI plugins not in [`CNI_PLUGINS`].
const SKIPPED: &[&str] = &["usr/share", "lib/systemd", "usr/lib/cni", ".extracted"];

/// The iptables commands linked to the legacy (x_tables) backend, whose modules the root has.
const IPTABLES_LINKS: &[&str] = &[
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
];

/// Where the variant's extra pieces come from.
#[derive(Debug, Clone)]
pub struct KubeInputs {
    /// The tree `fetch-debs.sh --kube` extracted (`.cache/debs/<arch>/kube/root`).
    pub debs_root: PathBuf,
    /// The Kubernetes binaries of the target's platform
    /// (`.cache/kube/<version>/linux-<debarch>`, `kubelet` in it).
    pub assets: PathBuf,
    /// The agent's OCI image archive for the target's platform (k3os-oci, uncompressed layer),
    /// carried by every `-kube` release as the payload [`AGENT_PAYLOAD_NAME`].
    pub agent_image: PathBuf,
}

impl KubeInputs {
    /// Check that both directories and the agent image hold what the releases need; each
    /// missing piece is named.
    pub fn locate(debs_root: &Path, assets: &Path, agent_image: &Path) -> Result<KubeInputs> {
        let k = KubeInputs {
            debs_root: debs_root.to_path_buf(),
            assets: assets.to_path_buf(),
            agent_image: agent_image.to_path_buf(),
        };
        let hint_debs = "run images/scripts/fetch-debs.sh --kube <arch>";
        let hint_kube = "run scripts/setup.sh (bash ../shared/kube/install.sh DEST)";
        let hint_image = "run just images-kube-<arch> (it writes the agent image with k3os-oci)";
        for (p, hint) in [
            (k.agent_image.clone(), hint_image),
            (k.containerd(), hint_debs),
            (k.debs_root.join("usr/sbin/runc"), hint_debs),
            (k.debs_root.join("usr/bin/ctr"), hint_debs),
            (k.debs_root.join("usr/lib/cni/bridge"), hint_debs),
            (k.kubelet(), hint_kube),
        ] {
            if !p.is_file() {
                return Err(Error::Input {
                    path: p,
                    what: format!("missing ({hint})"),
                });
            }
        }
        Ok(k)
    }

    fn containerd(&self) -> PathBuf {
        self.debs_root.join("usr/bin/containerd")
    }

    fn kubelet(&self) -> PathBuf {
        self.assets.join("kubelet")
    }

    /// Add everything the variant's root depends on to `st` (the rootfs fingerprint).
    pub fn fingerprint(&self, st: &mut Stamp) -> Result<()> {
        st.param("kube-init", INIT)
            .param("kube-up", KUBE_UP)
            .param("containerd-config", CONTAINERD_CONFIG)
            .param("kubelet-config", KUBELET_CONFIG)
            .param("cni-config", CNI_CONFIG)
            .param("kube-modules", MODULES)
            .param("kube-mountinfo", MOUNTINFO_LINE)
            .param("cni-plugins", CNI_PLUGINS.join(" "))
            .file("kube-debs", &self.debs_root.join(".extracted"))?
            .file("kubelet", &self.kubelet())?;
        Ok(())
    }
}

fn write(path: &Path, data: impl AsRef<[u8]>, mode: u32) -> Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).ctx("create directory", d)?;
    }
    let _ = fs::remove_file(path);
    fs::write(path, data).ctx("write", path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).ctx("chmod", path)
}

/// The kubelet config of `variant`: [`KUBELET_CONFIG`], or for
/// [`Variant::KubeNotReady`] one of an API version no kubelet knows (it exits at start).
pub fn kubelet_config(variant: Variant) -> String {
    match variant {
        Variant::KubeNotReady => KUBELET_CONFIG.replace(
            "apiVersion: kubelet.config.k8s.io/v1beta1",
            "apiVersion: kubelet.config.k8s.io/v0-broken-on-purpose",
        ),
        _ => KUBELET_CONFIG.to_string(),
    }
}

/// Add the variant to `dir`, a tree [`crate::rootfs::populate`] filled for a release of
/// `variant`.
pub fn populate(dir: &Path, kube: &KubeInputs, debs: &Debs, variant: Variant) -> Result<()> {
    let base = dir.join("sbin/init.base");
    fs::rename(dir.join("sbin/init"), &base).ctx("move the plain init to", &base)?;
    write(&dir.join("sbin/init"), INIT, 0o755)?;
    write(&dir.join("usr/sbin/k3os-kube-up"), KUBE_UP, 0o755)?;
    copy_tree(&kube.debs_root, dir, Path::new(""))?;
    for p in CNI_PLUGINS {
        let src = kube.debs_root.join("usr/lib/cni").join(p);
        write(
            &dir.join("usr/lib/cni").join(p),
            fs::read(&src).ctx("read", &src)?,
            0o755,
        )?;
    }
    for l in IPTABLES_LINKS {
        let at = dir.join("usr/sbin").join(l);
        let _ = fs::remove_file(&at);
        symlink("xtables-legacy-multi", &at).ctx("symlink", &at)?;
    }
    let kubelet = kube.kubelet();
    write(
        &dir.join("usr/bin/kubelet"),
        fs::read(&kubelet).ctx("read", &kubelet)?,
        0o755,
    )?;
    write(
        &dir.join("etc/containerd/config.toml"),
        CONTAINERD_CONFIG,
        0o644,
    )?;
    write(
        &dir.join("etc/kubernetes/kubelet.yaml"),
        kubelet_config(variant),
        0o644,
    )?;
    write(
        &dir.join("etc/cni/net.d/10-k3os.conflist"),
        CNI_CONFIG,
        0o644,
    )?;
    write(&dir.join("etc/hosts"), "127.0.0.1 localhost\n", 0o644)?;
    for loader in ["grub", "syslinux"] {
        let p = dir.join(format!("etc/k3os-ops/config.{loader}.toml"));
        let base = fs::read_to_string(&p).ctx("read", &p)?;
        write(&p, with_mountinfo(&base), 0o644)?;
    }
    modules(dir, debs)
}

/// `config` (a node config) with [`MOUNTINFO_LINE`] first: a top-level key must come before
/// the `[layout]` table.
pub fn with_mountinfo(config: &str) -> String {
    format!("{MOUNTINFO_LINE}{config}")
}

/// The names of [`MODULES`], in order.
pub fn module_names() -> Vec<&'static str> {
    MODULES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Copy the wanted modules of [`MODULES`] and their dependencies under
/// `lib/modules/<kver>/`, write their `modules.dep` (`depmod -b`) and
/// `/etc/k3os-kube/modules` (the ones that are modules of this kernel; built-in ones need no
/// loading).
fn modules(dir: &Path, debs: &Debs) -> Result<()> {
    let deps = ModDeps::load(&debs.modules_dir)?;
    let wanted: Vec<&str> = module_names()
        .into_iter()
        .filter(|m| deps.contains(m))
        .collect();
    let rel = Path::new("lib/modules").join(&debs.kver);
    for m in deps.resolve(&wanted)? {
        let src = debs.modules_dir.join(&m);
        write(
            &dir.join(&rel).join(&m),
            fs::read(&src).ctx("read", &src)?,
            0o644,
        )?;
    }
    for f in [
        "modules.order",
        "modules.builtin",
        "modules.builtin.modinfo",
    ] {
        let src = debs.modules_dir.join(f);
        if src.is_file() {
            fs::copy(&src, dir.join(&rel).join(f)).ctx("copy", &src)?;
        }
    }
    Cmd::new("depmod")
        .arg("-b")
        .arg(dir)
        .arg(&debs.kver)
        .run()?;
    write(
        &dir.join("etc/k3os-kube/modules"),
        wanted.join("\n") + "\n",
        0o644,
    )
}

/// Copy `src/rel` into `dst/rel` recursively (files with their modes, symlinks as links),
/// leaving out [`SKIPPED`]; an existing file at the destination (a busybox applet link) is
/// replaced by the package's.
fn copy_tree(src: &Path, dst: &Path, rel: &Path) -> Result<()> {
    let from = src.join(rel);
    for e in fs::read_dir(&from).ctx("read directory", &from)? {
        let e = e.ctx("read directory", &from)?;
        let r = rel.join(e.file_name());
        if SKIPPED.iter().any(|s| Path::new(s) == r) {
            continue;
        }
        let (s, d) = (src.join(&r), dst.join(&r));
        let meta = fs::symlink_metadata(&s).ctx("stat", &s)?;
        if meta.is_dir() {
            fs::create_dir_all(&d).ctx("create directory", &d)?;
            copy_tree(src, dst, &r)?;
        } else if meta.file_type().is_symlink() {
            let target = fs::read_link(&s).ctx("read link", &s)?;
            let _ = fs::remove_file(&d);
            symlink(&target, &d).ctx("symlink", &d)?;
        } else {
            write(
                &d,
                fs::read(&s).ctx("read", &s)?,
                meta.permissions().mode() & 0o7777,
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configs_parse() {
        let c: toml::Value = toml::from_str(CONTAINERD_CONFIG).unwrap();
        let cri = &c["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(
            cri["sandbox_image"].as_str(),
            Some(crate::oci::KUBE_PAUSE_IMAGE)
        );
        assert_eq!(cri["cni"]["bin_dir"].as_str(), Some("/usr/lib/cni"));
        let k: serde_yaml::Value = serde_yaml::from_str(KUBELET_CONFIG).unwrap();
        assert_eq!(kubelet_config(Variant::Kube), KUBELET_CONFIG);
        let broken: serde_yaml::Value =
            serde_yaml::from_str(&kubelet_config(Variant::KubeNotReady)).unwrap();
        assert_ne!(broken["apiVersion"], k["apiVersion"]);
        assert_eq!(broken["kind"], k["kind"]);
        assert_eq!(k["cgroupDriver"].as_str(), Some("cgroupfs"));
        assert_eq!(k["failSwapOn"].as_bool(), Some(false));
        assert_eq!(
            k["containerRuntimeEndpoint"].as_str(),
            Some("unix:///run/containerd/containerd.sock")
        );
        let n: serde_json::Value = serde_json::from_str(CNI_CONFIG).unwrap();
        assert_eq!(n["plugins"][0]["type"], "bridge");
        assert_eq!(n["plugins"][0]["ipam"]["type"], "host-local");
        assert!(module_names().contains(&"overlay"));
        assert_eq!(n["plugins"][0]["ipMasq"], true, "pods reach the API server");
        let c = libupgrade::Config::parse(&with_mountinfo(&crate::rootfs::node_config("grub", 3)))
            .unwrap();
        assert_eq!(c.mountinfo, Path::new("/proc/1/mountinfo"));
        assert!(!module_names().iter().any(|m| m.starts_with('#')));
    }

    #[test]
    fn the_scripts_are_valid_busybox_sh() {
        for (name, text) in [("kube-init.sh", INIT), ("kube-up.sh", KUBE_UP)] {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join(name);
            fs::write(&p, text).unwrap();
            let out = std::process::Command::new("busybox")
                .args(["sh", "-n"])
                .arg(&p)
                .output()
                .expect("busybox (busybox-static, scripts/setup.sh)");
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
