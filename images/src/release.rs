//! Test releases: `v1`, `v2`, `v3`, the failure variants of `v2` (`-panic`, `-noconfirm`,
//! `-badhealth`) and `v4-panic` (a failing release newer than `v3`, for the upgrade from the
//! previous release), each built to `out/<arch>/build/<version>/` and then signed into a release
//! directory `out/<arch>/releases/<version>/` by `k3os-ops release create` (so the images use
//! exactly the release format nodes verify). Every step is skipped when its inputs are
//! unchanged (see [`crate::stamp`]).

use std::fs;
use std::path::{Path, PathBuf};

use libupgrade::manifest::{MANIFEST_FILE, SIGNATURE_FILE};

use crate::debs::Debs;
use crate::error::{Error, IoContext, Result};
use crate::initrd::{self, InitKind};
use crate::rootfs;
use crate::run::Cmd;
use crate::stamp::Stamp;
use crate::target::Target;

/// How a test release misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Normal,
    /// The initrd's /init exits: kernel panic, `panic=5` reboots into the loader.
    Panic,
    /// The rootfs never confirms (prints `K3OS-NOCONFIRM`); the harness resets the VM.
    NoConfirm,
    /// A health check exits 1, so `k3os-ops slot confirm` fails and rolls back.
    BadHealth,
}

impl Variant {
    pub fn suffix(self) -> &'static str {
        match self {
            Variant::Normal => "",
            Variant::Panic => "-panic",
            Variant::NoConfirm => "-noconfirm",
            Variant::BadHealth => "-badhealth",
        }
    }
}

/// One release to build: `v<generation>[-<variant>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseSpec {
    pub version: String,
    pub generation: u64,
    pub variant: Variant,
}

impl ReleaseSpec {
    /// Parse `v2`, `v2-panic`, `v2-noconfirm`, `v2-badhealth`.
    pub fn parse(version: &str) -> std::result::Result<ReleaseSpec, String> {
        let (base, variant) = match version.split_once('-') {
            None => (version, Variant::Normal),
            Some((b, "panic")) => (b, Variant::Panic),
            Some((b, "noconfirm")) => (b, Variant::NoConfirm),
            Some((b, "badhealth")) => (b, Variant::BadHealth),
            Some((_, v)) => {
                return Err(format!(
                    "release '{version}': unknown variant '{v}' (panic, noconfirm, badhealth)"
                ))
            }
        };
        let generation = base
            .strip_prefix('v')
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                format!("release '{version}': expected v<generation>[-variant], e.g. v2-panic")
            })?;
        Ok(ReleaseSpec {
            version: version.to_string(),
            generation,
            variant,
        })
    }

    /// The releases the test disks and the VM tests use. `v4-panic`: the scenario
    /// `upgrade-from-previous` ends on v3 and needs a failing release of a higher generation.
    pub fn standard() -> Vec<ReleaseSpec> {
        [
            "v1",
            "v2",
            "v3",
            "v2-panic",
            "v2-noconfirm",
            "v2-badhealth",
            "v4-panic",
        ]
        .iter()
        .map(|v| ReleaseSpec::parse(v).expect("standard release names parse"))
        .collect()
    }
}

/// A built (and signed) release directory.
#[derive(Debug, Clone)]
pub struct Release {
    pub spec: ReleaseSpec,
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

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
    /// Build (or reuse) one release.
    pub fn build(&self, spec: &ReleaseSpec, secret: &Path, public: &Path) -> Result<Release> {
        let work = self.out.join("build").join(&spec.version);
        fs::create_dir_all(&work).ctx("create directory", &work)?;
        let (t, d) = (self.target, &self.debs);

        // Kernel: the Debian image as is.
        let kernel = work.join(libupgrade::layout::KERNEL_FILE);
        let mut st = Stamp::new();
        st.file("vmlinuz", &d.vmlinuz)?;
        if !st.is_fresh(&kernel) {
            Stamp::invalidate(&kernel)?;
            fs::copy(&d.vmlinuz, &kernel).ctx("copy kernel to", &kernel)?;
            st.record(&kernel)?;
        }

        // Initrd.
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

        // Rootfs.
        let rootfs = work.join(libupgrade::layout::ROOTFS_FILE);
        let mut st = Stamp::new();
        st.param("arch", t.arch.as_str())
            .param("version", &spec.version)
            .param("generation", spec.generation.to_string())
            .param("variant", spec.variant.suffix())
            .param("init", rootfs::INIT)
            .param("udhcpc", rootfs::UDHCPC_SCRIPT)
            .param("profile", rootfs::PROFILE)
            .param("config", rootfs::node_config("grub", rootfs::GRUB_TRIES))
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

        // Signed release directory.
        let dir = self.out.join("releases").join(&spec.version);
        let manifest = dir.join(MANIFEST_FILE);
        let mut st = Stamp::new();
        st.param("arch", t.arch.as_str())
            .param("version", &spec.version)
            .param("generation", spec.generation.to_string())
            .file("rootfs", &rootfs)?
            .file("kernel", &kernel)?
            .file("initrd", &initrd)?
            .file("secret", secret)?
            .param("boot-config", crate::loader::boot_config(t));
        if !(st.is_fresh(&manifest) && dir.join(SIGNATURE_FILE).is_file()) {
            Stamp::invalidate(&manifest)?;
            if dir.exists() {
                fs::remove_dir_all(&dir).ctx("remove old release", &dir)?;
            }
            if let Some(p) = dir.parent() {
                fs::create_dir_all(p).ctx("create directory", p)?;
            }
            // The release carries the scripts its disks are installed with.
            let boot_cfg = work.join("boot.toml");
            fs::write(&boot_cfg, crate::loader::boot_config(t)).ctx("write", &boot_cfg)?;
            Cmd::new(&self.tool)
                .args(["release", "create", "--rootfs"])
                .arg(&rootfs)
                .arg("--kernel")
                .arg(&kernel)
                .arg("--initrd")
                .arg(&initrd)
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
        }
        Ok(Release {
            spec: spec.clone(),
            rootfs: dir.join(libupgrade::layout::ROOTFS_FILE),
            kernel: dir.join(libupgrade::layout::KERNEL_FILE),
            initrd: dir.join(libupgrade::layout::INITRD_FILE),
            dir,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_names() {
        let s = ReleaseSpec::parse("v2-noconfirm").unwrap();
        assert_eq!((s.generation, s.variant), (2, Variant::NoConfirm));
        assert_eq!(ReleaseSpec::parse("v3").unwrap().variant, Variant::Normal);
        assert!(ReleaseSpec::parse("v2-weird")
            .unwrap_err()
            .contains("weird"));
        assert!(ReleaseSpec::parse("x2").is_err());
        assert!(ReleaseSpec::parse("v0").is_err());
        let std: Vec<String> = ReleaseSpec::standard()
            .into_iter()
            .map(|s| s.version)
            .collect();
        assert_eq!(
            std,
            [
                "v1",
                "v2",
                "v3",
                "v2-panic",
                "v2-noconfirm",
                "v2-badhealth",
                "v4-panic"
            ]
        );
    }
}
