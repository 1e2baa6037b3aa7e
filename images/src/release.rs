//! Test releases: `v1`, `v2`, `v3`, the failure variants of `v2` (`-panic`, `-noconfirm`,
//! `-badhealth`) and `v4-panic` (a failing release newer than `v3`, for the upgrade from the
//! previous release), each built to `out/<arch>/build/<version>/` and then signed into a release
//! directory `out/<arch>/releases/<version>/` by `k3os-ops release create` (so the images use
//! exactly the release format nodes verify). Every step is skipped when its inputs are
//! unchanged (see [`crate::stamp`]). The names and variants themselves are [`crate::spec`]'s.

use std::fs;
use std::path::{Path, PathBuf};

use bootconfig::Slot;
use libupgrade::manifest::{MANIFEST_FILE, SIGNATURE_FILE};

use crate::debs::Debs;
use crate::error::{Error, IoContext, Result};
use crate::initramfs::{self as initrd, InitKind};
use crate::kube::{self, KubeInputs};
use crate::loader;
use crate::rootfs;
use crate::run::Cmd;
use crate::secboot::{self, SbKey};
use crate::spec::{Release, ReleaseSpec, Variant, GRUB_TRIES};
use crate::stamp::Stamp;
use crate::target::Target;

/// Everything releases of one architecture are built from.
pub struct ReleaseBuilder {
    pub target: Target,
    pub debs: Debs,
    /// Static k3os-ops for the target, installed into the rootfs.
    pub k3os_ops: PathBuf,
    /// Static k3os-verity-open for the target, the initrd's dm-verity helper.
    pub verity_open: PathBuf,
    /// k3os-ops runnable on this host (release keygen / create).
    pub tool: PathBuf,
    /// `images/out/<arch>`.
    pub out: PathBuf,
    /// `images/out/keys` (test signing key pair).
    pub keys: PathBuf,
    /// The test channel's root version 1 ([`ensure_channel_root`]), baked into every rootfs
    /// at `/etc/k3os-ops/root.json`.
    pub channel_root: PathBuf,
    /// What the Kubernetes node variant (`-kube` releases) adds; building one without it fails.
    pub kube: Option<KubeInputs>,
}

/// Names of the test channel's key pairs in `images/out/<arch>/keys/` (`NAME.key`, `NAME.pub`):
/// root version 1's root, targets, snapshot and timestamp keys. The `trust-rotation` VM
/// scenario signs with them (vm-tests/src/scenario/rotation.rs names the same files).
pub const CHANNEL_KEYS: [&str; 4] = ["root1", "targets1", "snapshot", "timestamp"];

/// Where [`ensure_channel_root`] writes root version 1 (`1.root.json`, `root.json`) under
/// `images/out/<arch>/`.
pub const CHANNEL_ROOT_DIR: &str = "channel-root";

/// The test channel's root version 1, made once: key pairs [`CHANNEL_KEYS`] in `keys` and
/// `dir/1.root.json` + `dir/root.json` signed by `root1` (threshold 1 for every role). Both
/// are kept while they exist (like the release key of [`ensure_keys`]); delete them to make
/// new ones (every rootfs is then rebuilt: its fingerprint has the root file). Returns
/// `dir/root.json`.
pub fn ensure_channel_root(keys: &Path, dir: &Path) -> Result<PathBuf> {
    use libupgrade::signing;
    use libupgrade::trust::meta::Role;
    use libupgrade::trust::publish;
    use libupgrade::trust::publish::RoleSpec;

    let root_file = dir.join(Role::Root.file());
    let have_keys = CHANNEL_KEYS
        .iter()
        .all(|n| keys.join(format!("{n}.key")).is_file());
    if have_keys && root_file.is_file() {
        return Ok(root_file);
    }
    let sig_err = |path: &Path, e: signing::SigningError| Error::Input {
        path: path.to_path_buf(),
        what: e.to_string(),
    };
    let mut secret = Vec::new();
    for name in CHANNEL_KEYS {
        let sk = keys.join(format!("{name}.key"));
        if !sk.is_file() {
            signing::generate_keypair(keys, name).map_err(|e| sig_err(keys, e))?;
        }
        secret.push(signing::load_secret_key(&sk).map_err(|e| sig_err(&sk, e))?);
    }
    if dir.exists() {
        fs::remove_dir_all(dir).ctx("remove old channel root", dir)?;
    }
    fs::create_dir_all(dir).ctx("create directory", dir)?;
    let roles = [Role::Root, Role::Targets, Role::Snapshot, Role::Timestamp]
        .into_iter()
        .zip(&secret)
        .map(|(role, sk)| {
            let spec = RoleSpec {
                keys: vec![sk.verifying_key()],
                threshold: 1,
            };
            (role, spec)
        })
        .collect();
    let expires = publish::expires_in(chrono::Duration::days(publish::ROOT_LIFETIME_DAYS));
    publish::init_root(dir, &roles, &secret[..1], expires).map_err(|e| Error::Input {
        path: dir.to_path_buf(),
        what: format!("writing the test channel's root version 1: {e}"),
    })?;
    Ok(root_file)
}

/// The test key pair: (secret, public).
pub fn ensure_keys(tool: &Path, keys: &Path) -> Result<(PathBuf, PathBuf)> {
    let find = || -> Option<(PathBuf, PathBuf)> {
        let mut sk = None;
        let mut pk = None;
        for e in fs::read_dir(keys).ok()?.flatten() {
            let p = e.path();
            match p.extension().and_then(|x| x.to_str()) {
                Some("key") => sk = Some(p),
                Some("pub") => pk = Some(p),
                _ => {}
            }
        }
        Some((sk?, pk?))
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    fs::create_dir_all(keys).ctx("create directory", keys)?;
    Cmd::new(tool)
        .args(["release", "keygen", "-o"])
        .arg(keys)
        .run()?;
    find().ok_or_else(|| Error::Input {
        path: keys.to_path_buf(),
        what: "`k3os-ops release keygen` left no *.key and *.pub pair here".into(),
    })
}

impl ReleaseBuilder {
    /// Build (or reuse) one release: kernel, initrd and rootfs under `build/<version>/`, then
    /// the signed release directory; each step only when its inputs changed.
    pub fn build(&self, spec: &ReleaseSpec, secret: &Path, public: &Path) -> Result<Release> {
        let work = self.out.join("build").join(&spec.version);
        fs::create_dir_all(&work).ctx("create directory", &work)?;
        let files = Files {
            kernel: self.kernel(&work)?,
            initrd: self.initrd(spec, &work)?,
            rootfs: self.rootfs(spec, public, &work)?,
        };
        let dir = self.sign(spec, secret, &files, &work)?;
        Ok(Release {
            spec: spec.clone(),
            rootfs: dir.join(libupgrade::layout::ROOTFS_FILE),
            kernel: dir.join(libupgrade::layout::KERNEL_FILE),
            initrd: dir.join(libupgrade::layout::INITRD_FILE),
            dir,
        })
    }

    /// Kernel: the Debian image as is.
    fn kernel(&self, work: &Path) -> Result<PathBuf> {
        let d = &self.debs;
        let kernel = work.join(libupgrade::layout::KERNEL_FILE);
        let mut st = Stamp::new();
        st.file("vmlinuz", &d.vmlinuz)?;
        if !st.is_fresh(&kernel) {
            Stamp::invalidate(&kernel)?;
            fs::copy(&d.vmlinuz, &kernel).ctx("copy kernel to", &kernel)?;
            st.record(&kernel)?;
        }
        Ok(kernel)
    }

    /// Initrd: busybox, the root's modules and the variant's `/init`.
    fn initrd(&self, spec: &ReleaseSpec, work: &Path) -> Result<PathBuf> {
        let (t, d) = (self.target, &self.debs);
        let initrd = work.join(libupgrade::layout::INITRD_FILE);
        let kind = if spec.variant == Variant::Panic {
            InitKind::Panic
        } else {
            InitKind::Normal
        };
        let mut st = Stamp::new();
        st.param("arch", t.arch.as_str())
            .param(
                "init",
                if kind == InitKind::Panic {
                    initrd::INIT_PANIC
                } else {
                    initrd::INIT
                },
            )
            .param("modules", initrd::module_list(d, t)?.join("\n"))
            .param(
                "verity-modules",
                initrd::verity_module_list(d, t)?.join("\n"),
            )
            .param(
                "pstore-modules",
                initrd::pstore_module_list(d, t)?.join("\n"),
            )
            .param("kver", &d.kver)
            .file("busybox", &d.busybox)?
            .file("verity-open", &self.verity_open)?;
        let modules = [
            initrd::module_list(d, t)?,
            initrd::verity_module_list(d, t)?,
            initrd::pstore_module_list(d, t)?,
        ];
        for m in modules.iter().flatten() {
            st.file(m, &d.modules_dir.join(m))?;
        }
        if !st.is_fresh(&initrd) {
            Stamp::invalidate(&initrd)?;
            initrd::build(d, t, kind, &self.verity_open, &initrd)?;
            st.record(&initrd)?;
        }
        Ok(initrd)
    }

    /// Rootfs: the squashfs of [`rootfs::build`].
    fn rootfs(&self, spec: &ReleaseSpec, public: &Path, work: &Path) -> Result<PathBuf> {
        let (t, d) = (self.target, &self.debs);
        let rootfs = work.join(libupgrade::layout::ROOTFS_FILE);
        let mut st = Stamp::new();
        st.param("arch", t.arch.as_str())
            .param("version", &spec.version)
            .param("generation", spec.generation.to_string())
            .param("variant", spec.variant.suffix())
            .param("init", rootfs::INIT)
            .param("udhcpc", rootfs::UDHCPC_SCRIPT)
            .param("profile", rootfs::PROFILE)
            .param("node-config", rootfs::NODE_CONFIG_SCRIPT)
            .param("config", rootfs::node_config("grub", GRUB_TRIES))
            .param("app", format!("{} {}", rootfs::APP_FILE, rootfs::APP_BYTES))
            .param("mksquashfs", rootfs::MKSQUASHFS_OPTS.join(" "))
            .file("busybox", &d.busybox)?
            .file("k3os-ops", &self.k3os_ops)?
            .file("trust", public)?
            .file("channel-root", &self.channel_root)?;
        let kube = self.kube_inputs(spec)?;
        if let Some(k) = kube {
            k.fingerprint(&mut st)?;
        }
        if !st.is_fresh(&rootfs) {
            Stamp::invalidate(&rootfs)?;
            let node = rootfs::NodeTrust {
                release_key: public,
                channel_root: &self.channel_root,
            };
            rootfs::build_with(
                d,
                t,
                &self.k3os_ops,
                &node,
                spec,
                &rootfs,
                |tree| match kube {
                    Some(k) => kube::populate(tree, k, d, spec.variant),
                    None => Ok(()),
                },
            )?;
            st.record(&rootfs)?;
        }
        Ok(rootfs)
    }

    /// The Kubernetes inputs when `spec` is a `-kube` release (an error without them).
    fn kube_inputs(&self, spec: &ReleaseSpec) -> Result<Option<&KubeInputs>> {
        if !spec.variant.is_kube() {
            return Ok(None);
        }
        self.kube.as_ref().map(Some).ok_or_else(|| Error::Input {
            path: self.out.clone(),
            what: format!(
                "release {} is a Kubernetes node: give k3os-images --kube-debs and --kube-assets",
                spec.version
            ),
        })
    }

    /// The signed release directory `releases/<version>/` made from `files` by `k3os-ops
    /// release create`, carrying the boot scripts its disks are installed with.
    fn sign(
        &self,
        spec: &ReleaseSpec,
        secret: &Path,
        files: &Files,
        work: &Path,
    ) -> Result<PathBuf> {
        let t = self.target;
        let dir = self.out.join("releases").join(&spec.version);
        let manifest = dir.join(MANIFEST_FILE);
        // The standard v2 carries patches from v1 (the VM scenario `upgrade-patch`, and
        // `upgrade-from-previous`: v0.1.0 reads a manifest with patches): v1 is built first.
        let patch_from = spec.patch_from().map(|v| self.out.join("releases").join(v));
        let archive = image_archive(spec, &self.debs, t, work)?;
        // A Kubernetes node also carries the agent's own image (src/kube.rs).
        let agent = self.kube_inputs(spec)?.map(|k| k.agent_image.clone());
        let mut st = Stamp::new();
        if let Some(base) = &patch_from {
            st.file("patch-from", &base.join(MANIFEST_FILE))?;
        }
        if let Some(a) = &agent {
            st.file("agent-image", a)?;
        }
        st.file("image-archive", &archive)?;
        st.param("arch", t.arch.as_str())
            .param("version", &spec.version)
            .param("generation", spec.generation.to_string())
            .param("verity", (spec.variant == Variant::Verity).to_string())
            .file("rootfs", &files.rootfs)?
            .file("kernel", &files.kernel)?
            .file("initrd", &files.initrd)?
            .file("secret", secret)?
            .param("boot-config", loader::boot_config(t));
        if st.is_fresh(&manifest) && dir.join(SIGNATURE_FILE).is_file() {
            return Ok(dir);
        }
        Stamp::invalidate(&manifest)?;
        if dir.exists() {
            fs::remove_dir_all(&dir).ctx("remove old release", &dir)?;
        }
        if let Some(p) = dir.parent() {
            fs::create_dir_all(p).ctx("create directory", p)?;
        }
        // The release carries the scripts its disks are installed with.
        let boot_cfg = work.join("boot.toml");
        fs::write(&boot_cfg, loader::boot_config(t)).ctx("write", &boot_cfg)?;
        let mut cmd = Cmd::new(&self.tool)
            .args(["release", "create", "--rootfs"])
            .arg(&files.rootfs)
            .arg("--kernel")
            .arg(&files.kernel)
            .arg("--initrd")
            .arg(&files.initrd)
            .args([
                "--version",
                &spec.version,
                "--arch",
                t.arch.as_str(),
                "--generation",
            ])
            .arg(spec.generation.to_string())
            .arg("--key")
            .arg(secret)
            .arg("--boot-config")
            .arg(&boot_cfg)
            .arg("--image")
            .arg(format!(
                "{}={}",
                crate::oci::PAYLOAD_NAME,
                archive.display()
            ))
            .arg("-o")
            .arg(&dir);
        if let Some(a) = &agent {
            cmd = cmd
                .arg("--image")
                .arg(format!("{}={}", kube::AGENT_PAYLOAD_NAME, a.display()));
        }
        if let Some(base) = &patch_from {
            cmd = cmd.arg("--patch-from").arg(base);
        }
        if spec.variant == Variant::Verity {
            cmd = cmd.arg("--verity");
        }
        log_patches(spec, &cmd.run()?);
        written(&dir)?;
        st.record(&manifest)?;
        Ok(dir)
    }
}

/// Directory of a release's signed unified kernel images under `images/out/<arch>/`:
/// `uki/<version>/k3os-<slot>.efi` ([`slot_ukis`]).
pub const UKI_DIR: &str = "uki";

/// The kernel command line a slot's UKI carries: the loader entry's, then what the GRUB
/// script appends on the unsigned path (`k3os.slot=`, `panic=`). Under Secure Boot the stub
/// ignores any command line its loader passes, so this is the whole of it.
pub fn uki_cmdline(t: Target, slot: Slot) -> String {
    format!(
        "{} k3os.slot={} panic={}",
        loader::entry(t, slot).cmdline,
        slot.letter(),
        loader::PANIC_SECS
    )
}

/// `release`'s two signed UKIs (slot A's, slot B's: the command line names the slot's root
/// partition and letter) in `<arch_out>/uki/<version>/`, each checked with `sbverify`;
/// rebuilt only when the kernel, initrd, stub, command line or certificate changed.
pub fn slot_ukis(
    t: Target,
    release: &Release,
    key: &SbKey,
    arch_out: &Path,
) -> Result<[PathBuf; 2]> {
    let dir = arch_out.join(UKI_DIR).join(&release.spec.version);
    fs::create_dir_all(&dir).ctx("create directory", &dir)?;
    let mut out = Vec::new();
    for slot in Slot::ALL {
        let signed = dir.join(format!("k3os-{}.efi", slot.lower()));
        let cmdline = uki_cmdline(t, slot);
        let os_release = secboot::os_release(&release.spec.version);
        let mut st = Stamp::new();
        st.param("cmdline", &cmdline)
            .param("os-release", &os_release)
            .file("stub", Path::new(secboot::STUB_X64))?
            .file("kernel", &release.kernel)?
            .file("initrd", &release.initrd)?
            .file("cert", &key.cert)?;
        if !st.is_fresh(&signed) {
            Stamp::invalidate(&signed)?;
            let work = tempfile::tempdir_in(&dir).ctx("create scratch directory in", &dir)?;
            let unsigned = work.path().join("unsigned.efi");
            let parts = secboot::UkiParts {
                kernel: &release.kernel,
                initrd: &release.initrd,
                cmdline: &cmdline,
                os_release: &os_release,
            };
            secboot::build_uki(Path::new(secboot::STUB_X64), &parts, &unsigned, work.path())?;
            secboot::sign(key, &unsigned, &signed)?;
            st.record(&signed)?;
        }
        out.push(signed);
    }
    Ok([out.remove(0), out.remove(0)])
}

/// The test image archive of `spec`'s generation, written into `work` (issue 33: every
/// release carries one, slot A's is in the store from the first boot, and a stage fetches only
/// the changed layer).
/// A `-kube` release's archive holds runnable images instead ([`crate::oci::write_kube_archive`]).
fn image_archive(spec: &ReleaseSpec, debs: &Debs, t: Target, work: &Path) -> Result<PathBuf> {
    let archive = work.join(format!("{}.tar", crate::oci::PAYLOAD_NAME));
    if spec.variant.is_kube() {
        crate::oci::write_kube_archive(spec.generation, &debs.busybox, t.debian(), &archive)?;
    } else {
        crate::oci::write_archive(spec.generation, &archive)?;
    }
    Ok(archive)
}

/// `release create` wrote the manifest and its signature into `dir`.
fn written(dir: &Path) -> Result<()> {
    for f in [MANIFEST_FILE, SIGNATURE_FILE] {
        if !dir.join(f).is_file() {
            return Err(Error::Input {
                path: dir.join(f),
                what: "`k3os-ops release create` did not write it".into(),
            });
        }
    }
    Ok(())
}

/// What `release create` said of its patches (sizes, build times), for the build log.
fn log_patches(spec: &ReleaseSpec, out: &[u8]) {
    for line in String::from_utf8_lossy(out).lines() {
        if line.trim_start().starts_with("patch ") {
            eprintln!("k3os-images: {}: {}", spec.version, line.trim());
        }
    }
}

/// The built (unsigned) files of one release.
struct Files {
    kernel: PathBuf,
    initrd: PathBuf,
    rootfs: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The root is made once and kept (the rootfs fingerprints have it), and it is a root a
    /// node accepts as its starting point: self-signed by its threshold.
    #[test]
    fn the_channel_root_is_made_once_and_is_a_valid_root_version_1() {
        let t = tempfile::tempdir().unwrap();
        let (keys, dir) = (t.path().join("keys"), t.path().join(CHANNEL_ROOT_DIR));
        let root = ensure_channel_root(&keys, &dir).unwrap();
        let bytes = fs::read(&root).unwrap();
        assert_eq!(bytes, fs::read(dir.join("1.root.json")).unwrap());
        let rec = libupgrade::trust::Record::from_root(&bytes, "test root").unwrap();
        assert_eq!(rec.root_version(), 1);
        for n in CHANNEL_KEYS {
            assert!(keys.join(format!("{n}.key")).is_file(), "{n}");
        }
        assert_eq!(ensure_channel_root(&keys, &dir).unwrap(), root);
        assert_eq!(fs::read(&root).unwrap(), bytes, "kept, not remade");
    }
}
