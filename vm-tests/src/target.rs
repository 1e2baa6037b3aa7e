//! The four boot targets (architecture × bootloader variant), where their disk images and
//! releases live, and the exact QEMU command line that boots each one.
//!
//! Inputs come from the images crate's output tree (`images/out/<arch>/disk-<variant>.img`,
//! `images/out/<arch>/releases/<version>/`); the harness only ever boots a scratch copy of a
//! disk (and of the UEFI variable store), never the originals.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// One bootable test disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    X86_64GrubBios,
    X86_64GrubEfi,
    X86_64Extlinux,
    Aarch64GrubEfi,
}

impl Target {
    pub const ALL: [Target; 4] = [
        Target::X86_64GrubBios,
        Target::X86_64GrubEfi,
        Target::X86_64Extlinux,
        Target::Aarch64GrubEfi,
    ];

    /// `x86_64-grub-bios`, … (the name the CLI and the test names use).
    pub fn name(self) -> &'static str {
        match self {
            Target::X86_64GrubBios => "x86_64-grub-bios",
            Target::X86_64GrubEfi => "x86_64-grub-efi",
            Target::X86_64Extlinux => "x86_64-extlinux",
            Target::Aarch64GrubEfi => "aarch64-grub-efi",
        }
    }

    pub fn arch(self) -> &'static str {
        match self {
            Target::Aarch64GrubEfi => "aarch64",
            _ => "x86_64",
        }
    }

    /// Disk variant name as the images crate spells it.
    pub fn variant(self) -> &'static str {
        match self {
            Target::X86_64GrubBios => "grub-bios",
            Target::X86_64GrubEfi | Target::Aarch64GrubEfi => "grub-efi",
            Target::X86_64Extlinux => "extlinux",
        }
    }

    /// `images/out/<arch>/disk-<variant>.img` under the workspace root (see [`images_dir`]).
    pub fn disk(self, root: &Path) -> PathBuf {
        images_dir(root)
            .join(self.arch())
            .join(format!("disk-{}.img", self.variant()))
    }

    /// `images/out/<arch>/releases` under the workspace root (see [`images_dir`]).
    pub fn releases(self, root: &Path) -> PathBuf {
        images_dir(root).join(self.arch()).join("releases")
    }

    /// `images/out/<arch>/keys`: the key pairs of the test channel's root version 1.
    pub fn channel_keys(self, root: &Path) -> PathBuf {
        images_dir(root).join(self.arch()).join("keys")
    }

    /// `images/out/<arch>/channel-root`: the test channel's root version 1 (`1.root.json`,
    /// `root.json`), the one every rootfs has at `/etc/k3os-ops/root.json`.
    pub fn channel_root_dir(self, root: &Path) -> PathBuf {
        images_dir(root).join(self.arch()).join("channel-root")
    }

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

    /// `images/out/previous/<arch>/`: the previous release's disks and v1, built by its own code
    /// (`just images-previous`, images/scripts/build-previous.sh).
    pub fn previous_dir(self, root: &Path) -> PathBuf {
        images_dir(root).join("previous").join(self.arch())
    }

    /// The previous release's disk of this target.
    pub fn previous_disk(self, root: &Path) -> PathBuf {
        self.previous_dir(root)
            .join(format!("disk-{}.img", self.variant()))
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

    /// UEFI firmware (code, pristine variable store), if this target boots through UEFI.
    pub fn firmware(self) -> Option<(PathBuf, PathBuf)> {
        match self {
            Target::X86_64GrubEfi => Some((
                "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
                "/usr/share/OVMF/OVMF_VARS_4M.fd".into(),
            )),
            Target::Aarch64GrubEfi => Some((
                "/usr/share/AAVMF/AAVMF_CODE.fd".into(),
                "/usr/share/AAVMF/AAVMF_VARS.fd".into(),
            )),
            _ => None,
        }
    }

    pub fn qemu_binary(self) -> &'static str {
        match self {
            Target::Aarch64GrubEfi => "qemu-system-aarch64",
            _ => "qemu-system-x86_64",
        }
    }

    /// Boot attempts the bootloader gives a new slot (GRUB: the configured tries; extlinux: one).
    pub fn uses_grub(self) -> bool {
        !matches!(self, Target::X86_64Extlinux)
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

    /// The QEMU command for one boot of `disk` (a scratch copy). `vars` is the scratch UEFI
    /// variable store (UEFI targets), `monitor` the HMP unix socket, `net` the node's network,
    /// `usb_stick` a raw image plugged in as a USB mass-storage device (xHCI). The serial
    /// console is on stdio.
    pub fn qemu_command(
        self,
        accel: Accel,
        disk: &Path,
        vars: Option<&Path>,
        monitor: &Path,
        net: Network,
        usb_stick: Option<&Path>,
    ) -> Command {
        let mut c = Command::new(self.qemu_binary());
        match self {
            Target::X86_64GrubBios | Target::X86_64Extlinux => {}
            Target::X86_64GrubEfi => {
                c.args(["-M", "q35"]);
            }
            Target::Aarch64GrubEfi => {
                c.args(["-M", "virt", "-cpu", "cortex-a57", "-smp", "2"]);
            }
        }
        c.args([
            "-m",
            "512",
            "-accel",
            accel.as_str(),
            "-display",
            "none",
            "-serial",
            "stdio",
        ]);
        c.arg("-monitor")
            .arg(format!("unix:{},server=on,wait=off", monitor.display()));
        match usb_stick {
            None => {
                c.arg("-drive")
                    .arg(format!("file={},format=raw,if=virtio", disk.display()));
            }
            Some(stick) => {
                // The node's disk must stay the firmware's first disk (SeaBIOS would otherwise
                // hand GRUB/extlinux the stick as drive 0x80): only a bootindex says so.
                c.arg("-drive").arg(format!(
                    "if=none,id=disk0,file={},format=raw",
                    disk.display()
                ));
                c.args(["-device", "virtio-blk-pci,drive=disk0,bootindex=0"]);
                c.arg("-drive").arg(format!(
                    "if=none,id=stick,file={},format=raw",
                    stick.display()
                ));
                c.args(["-device", "qemu-xhci,id=xhci"]);
                c.args(["-device", "usb-storage,bus=xhci.0,drive=stick"]);
            }
        }
        match net {
            Network::User { http_port } => {
                c.arg("-nic").arg(format!(
                    "user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{http_port}-:80"
                ));
            }
            Network::None => {
                c.args(["-nic", "none"]);
            }
        }
        if let (Some((code, _)), Some(vars)) = (self.firmware(), vars) {
            c.arg("-drive").arg(format!(
                "if=pflash,format=raw,readonly=on,file={}",
                code.display()
            ));
            c.arg("-drive")
                .arg(format!("if=pflash,format=raw,file={}", vars.display()));
        }
        c
    }
}

/// A node's network for one boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// QEMU user networking; host port `http_port` (on 127.0.0.1) forwards to the guest's
    /// port 80.
    User { http_port: u16 },
    /// No NIC at all: the guest has no eth0 (a site whose link is down).
    None,
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

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Target {
    type Err = Error;
    fn from_str(s: &str) -> Result<Target> {
        crate::error::by_name("target", &Target::ALL, Target::name, s)
    }
}

/// QEMU accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// The accelerator for `target`: KVM only when the guest has the host's architecture and a
    /// probe boot under KVM actually prints the kernel banner within 15 s (on these hosts
    /// /dev/kvm exists but guests hang under it, so it is never assumed). `VM_TESTS_ACCEL=tcg|kvm`
    /// overrides. The probe runs once per process; the choice and why are printed.
    pub fn for_target(target: Target, root: &Path) -> Accel {
        if target.arch() != std::env::consts::ARCH {
            return Accel::Tcg;
        }
        static PROBE: OnceLock<Accel> = OnceLock::new();
        *PROBE.get_or_init(|| {
            let (a, why) = match std::env::var("VM_TESTS_ACCEL").as_deref() {
                Ok("tcg") => (Accel::Tcg, "VM_TESTS_ACCEL=tcg".to_string()),
                Ok("kvm") => (Accel::Kvm, "VM_TESTS_ACCEL=kvm".to_string()),
                _ => probe_kvm(target, root),
            };
            eprintln!("vm-tests: accelerator {} ({why})", a.as_str());
            a
        })
    }
}

/// Boot the v1 kernel directly under KVM and look for its banner on the serial console.
fn probe_kvm(target: Target, root: &Path) -> (Accel, String) {
    if !Path::new("/dev/kvm").exists() {
        return (Accel::Tcg, "no /dev/kvm".into());
    }
    let kernel = target.releases(root).join("v1/vmlinuz");
    if !kernel.is_file() {
        return (Accel::Tcg, format!("no probe kernel {}", kernel.display()));
    }
    let out = std::env::temp_dir().join(format!("vm-tests-kvm-probe-{}.log", std::process::id()));
    let Ok(file) = std::fs::File::create(&out) else {
        return (Accel::Tcg, format!("cannot create {}", out.display()));
    };
    let child = Command::new(target.qemu_binary())
        .args([
            "-accel",
            "kvm",
            "-m",
            "256",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&kernel)
        .args(["-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"])
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return (Accel::Tcg, "cannot start QEMU for the KVM probe".into());
    };
    let start = Instant::now();
    let mut verdict = (
        Accel::Tcg,
        "a KVM guest printed no kernel banner within 15 s".to_string(),
    );
    while start.elapsed() < Duration::from_secs(15) {
        if let Ok(Some(st)) = child.try_wait() {
            verdict = (Accel::Tcg, format!("QEMU -accel kvm exited at once ({st})"));
            break;
        }
        if std::fs::read(&out)
            .map(|b| String::from_utf8_lossy(&b).contains("Linux version"))
            .unwrap_or(false)
        {
            verdict = (
                Accel::Kvm,
                format!(
                    "a KVM guest printed its banner in {:.1}s",
                    start.elapsed().as_secs_f64()
                ),
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&out);
    verdict
}

/// Full path of `prog` on PATH.
pub fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// The images output tree: `VM_TESTS_IMAGES` (relative to the workspace root unless absolute),
/// else `<root>/images/out`.
pub fn images_dir(root: &Path) -> PathBuf {
    match std::env::var_os("VM_TESTS_IMAGES") {
        Some(d) => root.join(d),
        None => root.join("images/out"),
    }
}

/// The host's `k3os-ops` (the x86_64 musl build `just images` makes to sign the releases):
/// `VM_TESTS_TOOL`, else `x86_64-unknown-linux-musl/release/k3os-ops` under `CARGO_TARGET_DIR`
/// (relative to the workspace root unless absolute) or `<root>/target`.
pub fn host_tool(root: &Path) -> PathBuf {
    if let Some(t) = std::env::var_os("VM_TESTS_TOOL") {
        return root.join(t);
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target"));
    target_dir.join("x86_64-unknown-linux-musl/release/k3os-ops")
}

/// The workspace root: `VM_TESTS_ROOT`, else the parent of this crate's directory.
pub fn workspace_root() -> PathBuf {
    match std::env::var_os("VM_TESTS_ROOT") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("crate has a parent dir")
            .to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn args(c: &Command) -> Vec<String> {
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn has(args: &[String], pair: [&str; 2]) -> bool {
        args.windows(2).any(|w| w == pair)
    }

    /// Without a stick the disk and NIC are what every scenario has always booted with; an
    /// offline boot has no NIC at all, and the stick is a USB disk behind the boot disk.
    #[test]
    fn offline_boot_has_no_nic_and_the_stick_on_usb_behind_the_boot_disk() {
        let p = Path::new;
        let t = Target::X86_64Extlinux;
        let net = Network::User { http_port: 4321 };
        let plain = args(&t.qemu_command(Accel::Tcg, p("/d.img"), None, p("/m"), net, None));
        assert!(
            has(&plain, ["-drive", "file=/d.img,format=raw,if=virtio"]),
            "{plain:?}"
        );
        let nic = "user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:4321-:80";
        assert!(has(&plain, ["-nic", nic]), "{plain:?}");
        assert!(!plain.iter().any(|a| a.contains("usb")), "{plain:?}");

        let stick = Some(p("/s.img"));
        let off =
            args(&t.qemu_command(Accel::Tcg, p("/d.img"), None, p("/m"), Network::None, stick));
        assert!(has(&off, ["-nic", "none"]), "{off:?}");
        assert!(!off.iter().any(|a| a.starts_with("user")), "{off:?}");
        assert!(
            has(&off, ["-drive", "if=none,id=disk0,file=/d.img,format=raw"]),
            "{off:?}"
        );
        assert!(
            has(&off, ["-device", "virtio-blk-pci,drive=disk0,bootindex=0"]),
            "{off:?}"
        );
        assert!(
            has(&off, ["-drive", "if=none,id=stick,file=/s.img,format=raw"]),
            "{off:?}"
        );
        assert!(has(&off, ["-device", "qemu-xhci,id=xhci"]), "{off:?}");
        assert!(
            has(&off, ["-device", "usb-storage,bus=xhci.0,drive=stick"]),
            "{off:?}"
        );
        assert!(!off.iter().any(|a| a.contains("if=virtio")), "{off:?}");
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
