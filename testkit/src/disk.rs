//! Real GPT disk image files attached to loop devices (no partition scanning, as on CI hosts),
//! with an ext4 boot partition mounted, for the tests of the GPT layout: an updater of the
//! disk, a release put into slot A as if installed, and the check that slot B holds one.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use bootconfig::Slot;
use libupgrade::layout::GptLayout;
use libupgrade::Updater;
use libupgrade::{BootloaderKind, Config, LayoutConfig};

use crate::node::{boot_as, ModelLoader};
use crate::{require_root, run};

/// Loop device setup is racy between threads (find free → attach): serialize it.
static LOOP_LOCK: Mutex<()> = Mutex::new(());

/// A loop device released on drop.
pub struct Loop {
    pub dev: loopdev::LoopDevice,
    pub path: PathBuf,
}

impl Loop {
    pub fn attach(file: &Path, offset: u64, size: u64) -> Loop {
        let _g = LOOP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let lc = loopdev::LoopControl::open().expect("open /dev/loop-control");
        for _ in 0..20 {
            let dev = lc.next_free().expect("a free loop device");
            let mut opts = dev.with();
            if offset > 0 || size > 0 {
                opts = opts.offset(offset).size_limit(size);
            }
            match opts.attach(file) {
                Ok(()) => {
                    let path = dev.path().expect("loop device path");
                    return Loop { dev, path };
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
        panic!("could not attach {} to a loop device", file.display());
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = self.dev.detach();
    }
}

/// A GPT disk image file: boot (ext4, mounted), rootfs-a, rootfs-b, state; the whole disk is
/// attached to a loop device (no partition scanning, as on CI hosts) that the layout writes.
pub struct TestDisk {
    pub dir: tempfile::TempDir,
    pub image: PathBuf,
    pub disk: Loop,
    pub boot_mount: Option<sys_mount::Mount>,
    pub boot_loop: Loop,
    pub boot_dir: PathBuf,
    pub state_dir: PathBuf,
    pub parts: BTreeMap<String, (u64, u64)>,
}

pub const MIB: u64 = 1 << 20;

impl TestDisk {
    pub fn new(rootfs_size: u64) -> TestDisk {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let total = 2 * MIB + 32 * MIB + 2 * rootfs_size + 8 * MIB + 2 * MIB;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&image)
            .unwrap();
        f.set_len(total).unwrap();
        let mbr = gpt::mbr::ProtectiveMBR::with_lb_size(
            u32::try_from((total / 512) - 1).unwrap_or(0xFFFF_FFFF),
        );
        let mut f2 = f.try_clone().unwrap();
        mbr.overwrite_lba0(&mut f2).unwrap();
        let mut g = gpt::GptConfig::new()
            .writable(true)
            .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
            .create_from_device(f, None)
            .unwrap();
        let mut parts = BTreeMap::new();
        for (name, size) in [
            ("boot", 32 * MIB),
            ("rootfs-a", rootfs_size),
            ("rootfs-b", rootfs_size),
            ("state", 8 * MIB),
        ] {
            let id = g
                .add_partition(name, size, gpt::partition_types::LINUX_FS, 0, Some(2048))
                .unwrap();
            let p = &g.partitions()[&id];
            parts.insert(
                name.to_string(),
                (p.first_lba * 512, (p.last_lba + 1 - p.first_lba) * 512),
            );
        }
        g.write().unwrap();
        let disk = Loop::attach(&image, 0, 0);
        let (bo, bl) = parts["boot"];
        let boot_loop = Loop::attach(&image, bo, bl);
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "boot"])
            .arg(&boot_loop.path));
        let boot_dir = dir.path().join("boot");
        std::fs::create_dir_all(&boot_dir).unwrap();
        let m = sys_mount::Mount::builder()
            .fstype("ext4")
            .mount(&boot_loop.path, &boot_dir)
            .expect("mount boot ext4");
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        TestDisk {
            dir,
            image,
            disk,
            boot_mount: Some(m),
            boot_loop,
            boot_dir,
            state_dir,
            parts,
        }
    }

    /// Config for this disk; `cmdline` and `boot_id` files live in the temp dir.
    pub fn config(&self, trust_dir: &Path) -> Config {
        let c = Config {
            bootloader: BootloaderKind::Grub,
            tries: 3,
            layout: LayoutConfig::Gpt {
                disk: self.disk.path.clone(),
                boot_dir: self.boot_dir.clone(),
            },
            state_dir: self.state_dir.clone(),
            trust_dir: trust_dir.to_path_buf(),
            health_dir: self.dir.path().join("health.d"),
            airgap_dir: self.dir.path().join("airgap"),
            health_timeout_secs: 10,
            download_retries: 20,
            proc_cmdline: self.dir.path().join("cmdline"),
            release_file: self.dir.path().join("k3os-release"),
            mountinfo: self.dir.path().join("mountinfo"),
            boot_id_file: self.dir.path().join("boot_id"),
            builtin_health_check: false,
            reachability: None,
            channel_root: self.dir.path().join("root.json"),
            channel_metadata: Default::default(),
            report_url: None,
            report_site: None,
            payload_store_max_bytes: libupgrade::DEFAULT_PAYLOAD_STORE_MAX_BYTES,
            failure_bundle: Default::default(),
        };
        std::fs::write(&c.release_file, "VERSION=v1\nGENERATION=1\n").unwrap();
        boot_as(&c, Slot::A, "boot-1");
        c
    }

    /// An updater of this disk's GPT layout with `cfg` and the in-memory loader.
    pub fn updater(&self, cfg: Config) -> Updater {
        let layout =
            GptLayout::open(&self.disk.path, &self.boot_dir).expect("GPT of the test disk");
        Updater::with_parts(cfg, Box::new(layout), Box::new(ModelLoader::new(9)))
    }

    /// Put release `rel` into slot A (as if installed), the booted slot.
    pub fn install_in_a(&self, rel: &Path) {
        let (off, _) = self.parts["rootfs-a"];
        let img = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.image)
            .unwrap();
        img.write_all_at(&std::fs::read(rel.join("rootfs.squashfs")).unwrap(), off)
            .unwrap();
        img.sync_all().unwrap();
        std::fs::create_dir_all(self.boot_dir.join("a")).unwrap();
        for f in ["vmlinuz", "initrd"] {
            std::fs::copy(rel.join(f), self.boot_dir.join("a").join(f)).unwrap();
        }
    }

    /// Slot B holds exactly `rel`.
    pub fn assert_b_is(&self, rel: &Path) {
        let rootfs = std::fs::read(rel.join("rootfs.squashfs")).unwrap();
        assert!(
            self.part_bytes("rootfs-b", rootfs.len() as u64) == rootfs,
            "rootfs-b differs"
        );
        for f in ["vmlinuz", "initrd"] {
            assert_eq!(
                std::fs::read(self.boot_dir.join("b").join(f)).unwrap(),
                std::fs::read(rel.join(f)).unwrap(),
                "b/{f}"
            );
        }
    }

    /// Bytes of a partition, read back from the image file.
    pub fn part_bytes(&self, name: &str, len: u64) -> Vec<u8> {
        let (o, _) = self.parts[name];
        let mut f = std::fs::File::open(&self.image).unwrap();
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(o)).unwrap();
        let mut v = vec![0u8; len as usize];
        f.read_exact(&mut v).unwrap();
        v
    }

    /// Mount a rootfs partition read-only (squashfs, through its own loop device).
    pub fn mount_rootfs(&self, name: &str, at: &Path) -> (Loop, sys_mount::Mount) {
        let (o, l) = self.parts[name];
        let lp = Loop::attach(&self.image, o, l);
        std::fs::create_dir_all(at).unwrap();
        let m = sys_mount::Mount::builder()
            .fstype("squashfs")
            .flags(sys_mount::MountFlags::RDONLY)
            .mount(&lp.path, at)
            .expect("mount squashfs read-only");
        (lp, m)
    }
}

impl Drop for TestDisk {
    fn drop(&mut self) {
        if let Some(m) = self.boot_mount.take() {
            let _ = sys_mount::Unmount::unmount(&m, sys_mount::UnmountFlags::empty());
        }
    }
}
