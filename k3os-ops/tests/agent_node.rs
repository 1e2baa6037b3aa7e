//! The agent's node side over the real `libupgrade::Updater`: k3OS-style dir layout in a
//! temp dir, real signed releases (mksquashfs) in a local channel, and a small in-memory
//! bootloader that counts tries. Checks what the decision logic relies on: versions, staged
//! vs activated vs failed slots, trial boots and their confirmation.

use k3os_ops::agent;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use agent::decide::{Inactive, NodeUpdateStatus};
use agent::node::{ConfirmResult, LibupgradeNode, NodeOps, StageProgress};
use bootconfig::Slot;
use libupgrade::config::{BootloaderKind, Config, LayoutConfig};
use libupgrade::layout::DirLayout;
use libupgrade::manifest::Arch;

/// Boot environment in memory; `power_on` counts a trial down like the GRUB script.
type Loader = bootconfig::memory::MemoryBootloader;

struct Progress(Mutex<Vec<String>>);

impl StageProgress for Progress {
    fn begin(&self, what: &str, total: u64, already: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("begin {what} {total} {already}"));
    }
    fn advance(&self, _: u64) {}
    fn end(&self) {
        self.0.lock().unwrap().push("end".into());
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (mksquashfs is in squashfs-tools)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A signed release `version` in `channel/version/`, then the channel index rebuilt.
fn release(channel: &Path, secret: &Path, version: &str, generation: u64) {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree/etc");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(
        tree.join("k3os-release"),
        format!("VERSION={version}\nGENERATION={generation}\n"),
    )
    .unwrap();
    let sq = work.path().join("rootfs.squashfs");
    run(Command::new("mksquashfs")
        .arg(work.path().join("tree"))
        .arg(&sq)
        .args(["-noappend", "-quiet", "-all-root"]));
    std::fs::write(
        work.path().join("vmlinuz"),
        format!("kernel {version}").repeat(1000),
    )
    .unwrap();
    std::fs::write(
        work.path().join("initrd"),
        format!("initrd {version}").repeat(1000),
    )
    .unwrap();
    libupgrade::release::create(&libupgrade::release::CreateOptions {
        rootfs: sq,
        kernel: work.path().join("vmlinuz"),
        initrd: work.path().join("initrd"),
        version: version.into(),
        arch: Arch::host(),
        secret_key: secret.to_path_buf(),
        out_dir: channel.join(version),
        generation: Some(generation),
    })
    .expect("release create");
    libupgrade::channel::write_index(channel).expect("write index");
}

struct Rig {
    _dir: tempfile::TempDir,
    cfg: Config,
    loader: Loader,
    channel: String,
    boots: u32,
}

impl Rig {
    fn new(tries: u8) -> Rig {
        Rig::with_generation(tries, 1)
    }

    fn with_generation(tries: u8, booted_generation: u64) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let (secret, public) = libupgrade::signing::generate_keypair(p, "publisher").unwrap();
        let trust = p.join("trust.d");
        std::fs::create_dir_all(&trust).unwrap();
        std::fs::copy(&public, trust.join(public.file_name().unwrap())).unwrap();
        let channel = p.join("channel");
        std::fs::create_dir_all(&channel).unwrap();
        release(&channel, &secret, "v2", 2);
        let cfg = Config {
            bootloader: BootloaderKind::Grub,
            tries,
            layout: LayoutConfig::Dir {
                root: p.join("system"),
                boot_dir: p.join("boot"),
            },
            state_dir: p.join("state"),
            trust_dir: trust,
            health_dir: p.join("health.d"),
            health_timeout_secs: 5,
            download_retries: 0,
            proc_cmdline: p.join("cmdline"),
            release_file: p.join("k3os-release"),
            mountinfo: p.join("mountinfo"),
            boot_id_file: p.join("boot_id"),
            builtin_health_check: false,
        };
        std::fs::create_dir_all(p.join("system")).unwrap();
        std::fs::create_dir_all(p.join("boot")).unwrap();
        std::fs::create_dir_all(&cfg.health_dir).unwrap();
        std::fs::write(
            &cfg.release_file,
            format!("VERSION=v1\nGENERATION={booted_generation}\n"),
        )
        .unwrap();
        let loader = Loader::new(3);
        let mut rig = Rig {
            channel: channel.display().to_string(),
            _dir: dir,
            cfg,
            loader,
            boots: 0,
        };
        rig.boot_into(Slot::A);
        rig
    }

    fn boot_into(&mut self, slot: Slot) {
        self.boots += 1;
        std::fs::write(&self.cfg.proc_cmdline, format!("ro k3os.slot={slot}\n")).unwrap();
        std::fs::write(&self.cfg.boot_id_file, format!("boot-{}\n", self.boots)).unwrap();
    }

    /// Power-cycle through the loader.
    fn reboot(&mut self) -> Slot {
        let s = self.loader.power_on();
        self.boot_into(s);
        s
    }

    fn node(&self) -> LibupgradeNode {
        let LayoutConfig::Dir { root, boot_dir } = &self.cfg.layout else {
            unreachable!()
        };
        let updater = libupgrade::Updater::with_parts(
            self.cfg.clone(),
            Box::new(DirLayout::new(root, boot_dir)),
            Box::new(self.loader.clone()),
        );
        LibupgradeNode::new(updater, vec!["false".into()])
    }
}

#[test]
fn stage_activate_boot_confirm_as_the_agent_sees_it() {
    let mut rig = Rig::new(3);
    let node = rig.node();
    let st = node.status().unwrap();
    assert_eq!(st.booted_version.as_deref(), Some("v1"), "{st:?}");
    assert!(!st.booted_on_trial);
    assert_eq!(st.inactive, Inactive::Empty);

    assert_eq!(node.resolve_latest(&rig.channel).unwrap(), "v2");
    let progress = Progress(Mutex::new(Vec::new()));
    node.stage(&rig.channel, "v2", false, None, &progress)
        .unwrap();
    assert!(
        progress
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("begin")),
        "no progress reported"
    );
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Staged("v2".into())
    );

    node.activate().unwrap();
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Activated("v2".into())
    );

    assert_eq!(rig.reboot(), Slot::B);
    let node = rig.node();
    let st = node.status().unwrap();
    assert_eq!(
        st,
        NodeUpdateStatus {
            booted_version: Some("v2".into()),
            booted_on_trial: true,
            inactive: Inactive::Staged("v1".into())
        },
        "after the trial boot"
    );
    assert_eq!(node.confirm().unwrap(), ConfirmResult::Healthy);
    assert!(!node.status().unwrap().booted_on_trial);
}

#[test]
fn a_spent_trial_reads_as_failed_so_the_agent_records_a_rollback() {
    let mut rig = Rig::new(1);
    let node = rig.node();
    node.stage(
        &rig.channel,
        "v2",
        false,
        None,
        &Progress(Mutex::new(Vec::new())),
    )
    .unwrap();
    node.activate().unwrap();
    assert_eq!(rig.reboot(), Slot::B); // the one try, never confirmed
    assert_eq!(rig.reboot(), Slot::A); // the loader falls back
    let st = rig.node().status().unwrap();
    assert_eq!(st.booted_version.as_deref(), Some("v1"), "{st:?}");
    assert_eq!(st.inactive, Inactive::Failed("v2".into()), "{st:?}");
}

#[test]
fn errors_name_the_channel_and_the_command() {
    let rig = Rig::new(3);
    let node = rig.node();
    let e = node
        .stage(
            &rig.channel,
            "v9",
            false,
            None,
            &Progress(Mutex::new(Vec::new())),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains(&rig.channel) && e.contains("v9"), "{e}");
    let e = node.reboot().unwrap_err().to_string();
    assert!(e.contains("false") && e.contains("failed"), "{e}");
}

#[test]
fn a_downgrade_needs_an_explicit_pin() {
    // The node runs generation 5; the channel's v2 is generation 2.
    let rig = Rig::with_generation(3, 5);
    let node = rig.node();
    let progress = Progress(Mutex::new(Vec::new()));
    let e = node
        .stage(&rig.channel, "v2", false, None, &progress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("generation"), "{e}");
    assert_eq!(node.status().unwrap().inactive, Inactive::Empty);
    node.stage(&rig.channel, "v2", true, None, &progress)
        .unwrap();
    assert_eq!(
        node.status().unwrap().inactive,
        Inactive::Staged("v2".into())
    );
}
