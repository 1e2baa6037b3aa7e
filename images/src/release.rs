//! Test releases: `v1`, `v2`, `v3`, the failure variants of `v2` (`-panic`, `-noconfirm`,
//! `-badhealth`) and `v4-panic` (a failing release newer than `v3`, for the upgrade from the
//! previous release), each built to `out/<arch>/build/<version>/` and then signed into a release
//! directory `out/<arch>/releases/<version>/` by `k3os-ops release create` (so the images use
//! exactly the release format nodes verify). Every step is skipped when its inputs are
//! unchanged (see [`crate::stamp`]). The names and variants themselves are [`crate::spec`]'s.

use std::fs;
use std::path::{Path, PathBuf};

use libupgrade::manifest::{MANIFEST_FILE, SIGNATURE_FILE};

use crate::debs::Debs;
use crate::error::{Error, IoContext, Result};
use crate::initrd::{self, InitKind};
use crate::loader;
use crate::rootfs;
use crate::run::Cmd;
use crate::spec::{Release, ReleaseSpec, Variant, GRUB_TRIES};
use crate::stamp::Stamp;
use crate::target::Target;

/// Everything releases of one architecture are built from.
pub struct ReleaseBuilder {
    pub target: Target,
    pub debs: Debs,
    /// Static k3os-ops for the target, installed into the rootfs.
    pub k3os_ops: PathBuf,
    /// k3os-ops runnable on this host (release keygen / create).
    pub tool: PathBuf,
    /// `images/out/<arch>`.
    pub out: PathBuf,
    /// `images/out/keys` (test signing key pair).
    pub keys: PathBuf,
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
            .param("kver", &d.kver)
            .file("busybox", &d.busybox)?;
        for m in initrd::module_list(d, t)? {
            st.file(&m, &d.modules_dir.join(&m))?;
        }
        if !st.is_fresh(&initrd) {
            Stamp::invalidate(&initrd)?;
            initrd::build(d, t, kind, &initrd)?;
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
            .param("config", rootfs::node_config("grub", GRUB_TRIES))
            .param("app", format!("{} {}", rootfs::APP_FILE, rootfs::APP_BYTES))
            .param("mksquashfs", rootfs::MKSQUASHFS_OPTS.join(" "))
            .file("busybox", &d.busybox)?
            .file("k3os-ops", &self.k3os_ops)?
            .file("trust", public)?;
        if !st.is_fresh(&rootfs) {
            Stamp::invalidate(&rootfs)?;
            rootfs::build(d, t, &self.k3os_ops, public, spec, &rootfs)?;
            st.record(&rootfs)?;
        }
        Ok(rootfs)
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
        let mut st = Stamp::new();
        st.param("arch", t.arch.as_str())
            .param("version", &spec.version)
            .param("generation", spec.generation.to_string())
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
        Cmd::new(&self.tool)
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
            .arg("-o")
            .arg(&dir)
            .run()?;
        for f in [MANIFEST_FILE, SIGNATURE_FILE] {
            if !dir.join(f).is_file() {
                return Err(Error::Input {
                    path: dir.join(f),
                    what: "`k3os-ops release create` did not write it".into(),
                });
            }
        }
        st.record(&manifest)?;
        Ok(dir)
    }
}

/// The built (unsigned) files of one release.
struct Files {
    kernel: PathBuf,
    initrd: PathBuf,
    rootfs: PathBuf,
}
