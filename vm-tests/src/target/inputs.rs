//! What a run needs before it boots anything: the disk, the standard releases (the images
//! crate's one list), the test channel, the previous release's disk and the offline bundle's
//! tool, each missing input an error that names it and the recipe that makes it.

use std::path::Path;

use std::process::Command;

use super::{host_tool, which, Target};
use crate::error::{Error, Result};

impl Target {
    /// The test channel's root version 1 and its secret keys `names` exist.
    pub fn check_channel_inputs(self, root: &Path, names: &[&str]) -> Result<()> {
        let dir = self.channel_root_dir(root);
        let keys = self.channel_keys(root);
        let files = ["1.root.json", "root.json"]
            .iter()
            .map(|f| dir.join(f))
            .chain(names.iter().map(|n| keys.join(format!("{n}.key"))));
        for f in files {
            if !f.is_file() {
                return Err(Error::Missing {
                    what: "test channel root (made by k3os-images)".into(),
                    path: f,
                    hint: format!("build it with `just images-{}`", self.arch()),
                });
            }
        }
        Ok(())
    }

    /// Fail with the reason when the inputs of `upgrade-from-previous` are missing: the
    /// previous release's disk (naming the release and, when this clone lacks its commit, how
    /// to fetch the history) and the current releases it upgrades to.
    pub fn check_previous_inputs(self, root: &Path) -> Result<()> {
        let changelog = root.join("CHANGELOG.md");
        let text =
            std::fs::read_to_string(&changelog).map_err(|e| Error::io("read", &changelog, e))?;
        let Some((version, commit)) = previous_release(&text) else {
            return Err(Error::Missing {
                what: "previous release (a `## vX.Y.Z — date — commit <sha>` entry)".into(),
                path: changelog,
                hint: "upgrade-from-previous needs a released version to upgrade from".into(),
            });
        };
        let have_commit = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !have_commit {
            return Err(Error::NoHistory { version, commit });
        }
        let disk = self.previous_disk(root);
        if !disk.is_file() {
            return Err(Error::Missing {
                what: format!(
                    "{} disk of the previous release {version} ({commit})",
                    self.name()
                ),
                path: disk,
                hint: format!(
                    "build it with `just images-previous` (or `just images-previous-{}`)",
                    self.arch()
                ),
            });
        }
        let sum = self.previous_dir(root).join("k3os-ops.sha256");
        if !sum.is_file() {
            return Err(Error::Missing {
                what: format!("checksum of {version}'s k3os-ops"),
                path: sum,
                hint: "build it with `just images-previous`".into(),
            });
        }
        for v in PREVIOUS_TARGETS {
            let m = self
                .releases(root)
                .join(v)
                .join(libupgrade::manifest::MANIFEST_FILE);
            if !m.is_file() {
                return Err(Error::Missing {
                    what: format!("current release {v} manifest"),
                    path: m,
                    hint: format!("build it with `just images-{}`", self.arch()),
                });
            }
        }
        Ok(())
    }

    /// Fail with the reason when the inputs of `bundle-offline` are missing: the host
    /// `k3os-ops` that writes the bundle ([`host_tool`]) and `mkfs.ext4` for the USB stick.
    pub fn check_bundle_inputs(self, root: &Path) -> Result<()> {
        let tool = host_tool(root);
        if !tool.is_file() {
            return Err(Error::Missing {
                what: "host k3os-ops (writes the offline bundle)".into(),
                path: tool,
                hint: format!(
                    "build it with `just images-{}`, or name one with VM_TESTS_TOOL",
                    self.arch()
                ),
            });
        }
        if which("mkfs.ext4").is_none() {
            return Err(Error::Missing {
                what: "mkfs.ext4 (writes the USB stick image)".into(),
                path: "mkfs.ext4".into(),
                hint: "apt-get install e2fsprogs".into(),
            });
        }
        Ok(())
    }

    /// Fail naming the first of `versions` whose release (its manifest) is missing.
    pub fn check_releases(self, root: &Path, versions: &[&str]) -> Result<()> {
        let rel = self.releases(root);
        for v in versions {
            let m = rel.join(v).join(libupgrade::manifest::MANIFEST_FILE);
            if !m.is_file() {
                return Err(Error::Missing {
                    what: format!("release {v} manifest"),
                    path: m,
                    hint: format!("build it with `just images-{}`", self.arch()),
                });
            }
        }
        Ok(())
    }

    /// Fail with the reason when something `kube-node-joins` needs is missing: the `-kube`
    /// disk and release, the host's Kubernetes binaries ([`super::kube_assets`]), the
    /// firmware and QEMU.
    pub fn check_kube_inputs(self, root: &Path) -> Result<()> {
        let disk = self.kube_disk(root);
        if !disk.is_file() {
            return Err(Error::Missing {
                what: format!("{} Kubernetes node disk image", self.name()),
                path: disk,
                hint: format!("build it with `just images-kube-{}`", self.arch()),
            });
        }
        let assets = super::kube_assets(root);
        for b in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
        ] {
            if !assets.join(b).is_file() {
                return Err(Error::Missing {
                    what: format!("Kubernetes binary {b} (KUBEBUILDER_ASSETS)"),
                    path: assets.join(b),
                    hint: "run `just setup` (scripts/setup.sh installs them), or set KUBEBUILDER_ASSETS".into(),
                });
            }
        }
        self.check_machine()
    }

    /// Fail with the reason when something this target needs is missing.
    pub fn check_inputs(self, root: &Path) -> Result<()> {
        let disk = self.disk(root);
        let hint = format!("build it with `just images-{}`", self.arch());
        if !disk.is_file() {
            return Err(Error::Missing {
                what: format!("{} disk image", self.name()),
                path: disk,
                hint,
            });
        }
        self.check_releases(root, k3os_images::spec::STANDARD_RELEASES)?;
        self.check_machine()
    }

    /// The target's UEFI firmware (if any) and QEMU emulator are installed.
    fn check_machine(self) -> Result<()> {
        if let Some((code, vars)) = self.firmware() {
            for f in [code, vars] {
                if !f.is_file() {
                    let hint = "apt-get install ovmf qemu-efi-aarch64".to_string();
                    return Err(Error::Missing {
                        what: "UEFI firmware".into(),
                        path: f,
                        hint,
                    });
                }
            }
        }
        if which(self.qemu_binary()).is_none() {
            return Err(Error::Missing {
                what: "QEMU emulator".into(),
                path: self.qemu_binary().into(),
                hint: "apt-get install qemu-system-x86 qemu-system-arm".into(),
            });
        }
        Ok(())
    }
}

/// The current-code releases `upgrade-from-previous` upgrades the previous release's node to.
pub const PREVIOUS_TARGETS: [&str; 3] = ["v2", "v3", "v4-panic"];

/// The previous release named by CHANGELOG.md: the newest `## vX.Y.Z — <date> — commit <sha>`
/// entry that has a commit (the entry being developed has none) → (version, sha).
pub fn previous_release(changelog: &str) -> Option<(String, String)> {
    changelog.lines().find_map(|l| {
        let rest = l.strip_prefix("## v")?;
        let version: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        if version.split('.').count() != 3 || version.split('.').any(|p| p.is_empty()) {
            return None;
        }
        let (_, sha) = l.trim_end().rsplit_once(" commit ")?;
        let ok = sha.len() == 40
            && sha
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        ok.then(|| (format!("v{version}"), sha.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::workspace_root;

    /// Every standard release the images crate builds is an input a scenario requires: with
    /// the disk and all other standard releases present, the missing one is named.
    #[test]
    fn check_inputs_requires_every_standard_release() {
        let root = std::env::temp_dir().join(format!("vm-tests-releases-{}", std::process::id()));
        let t = Target::X86_64Extlinux;
        let names = k3os_images::spec::ReleaseSpec::standard();
        assert!(names.iter().any(|s| s.version == "v2-nonet"));
        for missing in &names {
            let _ = std::fs::remove_dir_all(&root);
            let disk = t.disk(&root);
            std::fs::create_dir_all(disk.parent().unwrap()).unwrap();
            std::fs::write(&disk, b"").unwrap();
            for s in names.iter().filter(|s| s.version != missing.version) {
                let dir = t.releases(&root).join(&s.version);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(libupgrade::manifest::MANIFEST_FILE), b"{}").unwrap();
            }
            match t.check_inputs(&root) {
                Err(Error::Missing { what, .. }) => {
                    assert_eq!(what, format!("release {} manifest", missing.version))
                }
                other => panic!(
                    "{}: expected a missing manifest, got {other:?}",
                    missing.version
                ),
            }
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn previous_release_is_the_newest_entry_with_a_commit() {
        let text = "# Changelog\n\nRule: …\n\n## v0.3.0 — unreleased\n\n## v0.2.0 — 2027-01-10 — commit 1111111111111111111111111111111111111111\n\n- x\n\n## v0.1.0 — 2026-12-02 — commit c063939740e017d9331b7c0795bd1c3e413ad5cd\n";
        assert_eq!(
            previous_release(text),
            Some((
                "v0.2.0".into(),
                "1111111111111111111111111111111111111111".into()
            ))
        );
        assert_eq!(previous_release("## v0.2.0 — unreleased\n"), None);
        assert_eq!(
            previous_release("## v0.1.0 — 2026-12-02 — commit c063939\n"),
            None,
            "short sha"
        );
        let real = std::fs::read_to_string(workspace_root().join("CHANGELOG.md")).unwrap();
        let (v, sha) = previous_release(&real).expect("CHANGELOG.md names a previous release");
        assert!(v.starts_with('v') && sha.len() == 40, "{v} {sha}");
    }
}
