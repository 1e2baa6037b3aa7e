//! Test fixtures shared by the workspace's integration tests (libupgrade's and k3os-ops'), one
//! home instead of copies and `#[path]` includes: real GPT disk image files attached with
//! `loopdev`, ext4 filesystems made with mkfs.ext4 and mounted with `sys-mount`, real squashfs
//! images from mksquashfs, signed releases, a Range-capable HTTP server that can drop
//! connections half way, a [`Config`] for a node under a temp root ([`dir_config`]), and the
//! real bootloader backends on temp dirs ([`loaders`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bootconfig::Slot;
use libupgrade::config::{BootloaderKind, Config, LayoutConfig};
use libupgrade::manifest::Arch;

pub mod loaders;
pub mod sim;

/// Loop device setup is racy between threads (find free → attach): serialize it.
static LOOP_LOCK: Mutex<()> = Mutex::new(());

pub fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e} (is it installed? .ci/run installs it)")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn require_root() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test needs root (loop devices, mount); run the suite as root like CI does"
    );
}

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
            health_timeout_secs: 10,
            download_retries: 20,
            proc_cmdline: self.dir.path().join("cmdline"),
            release_file: self.dir.path().join("k3os-release"),
            mountinfo: self.dir.path().join("mountinfo"),
            boot_id_file: self.dir.path().join("boot_id"),
            builtin_health_check: false,
        };
        std::fs::write(&c.release_file, "VERSION=v1\nGENERATION=1\n").unwrap();
        boot_as(&c, Slot::A, "boot-1");
        c
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

/// Pretend the node booted `slot` in boot `boot_id`.
pub fn boot_as(c: &Config, slot: Slot, boot_id: &str) {
    std::fs::write(
        &c.proc_cmdline,
        format!(
            "root=PARTLABEL=rootfs-{} ro k3os.slot={slot}\n",
            slot.lower()
        ),
    )
    .unwrap();
    std::fs::write(&c.boot_id_file, format!("{boot_id}\n")).unwrap();
}

/// A signing key pair and a trust dir holding its public key.
pub struct Keys {
    pub dir: tempfile::TempDir,
    pub secret: PathBuf,
    pub trust: PathBuf,
}

pub fn keys() -> Keys {
    let dir = tempfile::tempdir().unwrap();
    let (secret, public) = libupgrade::signing::generate_keypair(dir.path(), "test").unwrap();
    let trust = dir.path().join("trust.d");
    std::fs::create_dir_all(&trust).unwrap();
    std::fs::copy(&public, trust.join(public.file_name().unwrap())).unwrap();
    Keys { dir, secret, trust }
}

/// What goes into a test release: a squashfs of a release file and `payload` (at
/// /usr/share/payload), and the kernel and initrd bytes.
pub struct ReleaseInputs<'a> {
    pub version: &'a str,
    pub generation: u64,
    pub payload: &'a [u8],
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
    pub arch: Arch,
}

/// Build a real squashfs (mksquashfs, fixed times: unchanged files give unchanged bytes) and
/// sign it as release `inputs.version` in `out`; the source tree is kept beside it as
/// `<version>.tree` for content comparisons. Returns the release directory.
pub fn signed_release(keys: &Keys, out: &Path, inputs: &ReleaseInputs) -> PathBuf {
    signed_release_with(keys, out, inputs, Vec::new())
}

/// [`signed_release`] carrying boot `scripts`.
pub fn signed_release_with(
    keys: &Keys,
    out: &Path,
    inputs: &ReleaseInputs,
    scripts: Vec<libupgrade::release::BootScript>,
) -> PathBuf {
    let version = inputs.version;
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::create_dir_all(tree.join("usr/share")).unwrap();
    std::fs::write(
        tree.join("etc/k3os-release"),
        format!("VERSION={version}\nGENERATION={}\n", inputs.generation),
    )
    .unwrap();
    std::fs::write(tree.join("usr/share/payload"), inputs.payload).unwrap();
    let sq = work.path().join("rootfs.squashfs");
    run(Command::new("mksquashfs").arg(&tree).arg(&sq).args([
        "-noappend",
        "-quiet",
        "-all-root",
        "-comp",
        "gzip",
        "-mkfs-time",
        "0",
        "-all-time",
        "0",
    ]));
    let kernel = work.path().join("vmlinuz");
    let initrd = work.path().join("initrd");
    std::fs::write(&kernel, &inputs.kernel).unwrap();
    std::fs::write(&initrd, &inputs.initrd).unwrap();
    let dir = out.join(version);
    libupgrade::release::create(&libupgrade::release::CreateOptions {
        rootfs: sq,
        kernel,
        initrd,
        version: version.to_string(),
        arch: inputs.arch,
        secret_key: keys.secret.clone(),
        out_dir: dir.clone(),
        generation: Some(inputs.generation),
        scripts,
    })
    .expect("release create");
    let keep = out.join(format!("{version}.tree"));
    let _ = std::fs::remove_dir_all(&keep);
    run(Command::new("cp").arg("-a").arg(&tree).arg(&keep));
    dir
}

/// [`signed_release`] with `extra` bytes of incompressible payload and kernel/initrd blobs
/// derived from the generation.
pub fn make_release(
    keys: &Keys,
    out: &Path,
    version: &str,
    generation: u64,
    extra: usize,
    arch: Arch,
) -> PathBuf {
    signed_release(
        keys,
        out,
        &ReleaseInputs {
            version,
            generation,
            payload: &pseudo_random(extra, generation),
            kernel: pseudo_random(300_000 + generation as usize, generation + 100),
            initrd: pseudo_random(200_000, generation + 200),
            arch,
        },
    )
}

/// Deterministic incompressible test bytes (xorshift64): the same `seed` gives the same bytes
/// in every test and bench.
pub fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A static file server on 127.0.0.1 (GET, `Range: bytes=a-` / `a-b`, 404 for a missing file)
/// for the stage tests and the delta bench, streaming from the file (images of any size) and
/// counting every byte it sends (headers included: what the link carries). It can pace its
/// bodies to `rate` bytes/s (what a slow link looks like to the client) and drop the next
/// `drops` connections half way through a body larger than 64 KiB.
///
/// Hand-written on std rather than a crate: the tests need exactly these three knobs (half-way
/// drops, pacing, a wire-byte count), which test HTTP servers such as httpmock or wiremock do
/// not offer, and the whole protocol here is one request line and one Range header.
pub struct TestServer {
    pub base: String,
    /// Connections still to be dropped half way through their body.
    pub drops: Arc<AtomicUsize>,
    /// `path range` of every request, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
}

#[derive(Clone, Copy)]
struct Knobs {
    /// Body bytes per second; 0: as fast as the socket takes them.
    rate: u64,
}

impl TestServer {
    /// Serve `root`, dropping the next `drops` large bodies half way.
    pub fn start(root: PathBuf, drops: usize) -> TestServer {
        Self::spawn(root, drops, Knobs { rate: 0 })
    }

    /// Serve `root` at `rate` body bytes per second (0: unpaced), never dropping.
    pub fn paced(root: PathBuf, rate: u64) -> TestServer {
        Self::spawn(root, 0, Knobs { rate })
    }

    /// Bytes sent so far, headers included.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// The byte counter itself, for code that measures a window of it.
    pub fn sent_counter(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    fn spawn(root: PathBuf, drops: usize, knobs: Knobs) -> TestServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}/", l.local_addr().unwrap());
        let drops = Arc::new(AtomicUsize::new(drops));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let conn = Conn {
            root,
            knobs,
            drops: drops.clone(),
            log: requests.clone(),
            sent: sent.clone(),
        };
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let conn = conn.clone();
                std::thread::spawn(move || conn.serve(s));
            }
        });
        TestServer {
            base,
            drops,
            requests,
            sent,
        }
    }
}

#[derive(Clone)]
struct Conn {
    root: PathBuf,
    knobs: Knobs,
    drops: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
}

impl Conn {
    fn send(&self, w: &mut TcpStream, bytes: &[u8]) -> bool {
        let ok = w.write_all(bytes).is_ok();
        if ok {
            self.sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        }
        ok
    }

    fn serve(&self, s: TcpStream) {
        let mut rd = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        loop {
            let mut line = String::new();
            if rd.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
            let mut range = None;
            loop {
                let mut h = String::new();
                if rd.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    // `a-` or `a-b` (inclusive).
                    let (a, b) = v.trim().split_once('-').unwrap_or((v.trim(), ""));
                    range = a.parse::<u64>().ok().map(|a| (a, b.parse::<u64>().ok()));
                }
            }
            self.log.lock().unwrap().push(format!("{path} {range:?}"));
            let file = self.root.join(path.trim_start_matches('/'));
            let Ok(mut f) = std::fs::File::open(&file) else {
                self.send(
                    &mut w,
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                );
                continue;
            };
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let start = range.map_or(0, |r| r.0).min(len);
            let stop = range
                .and_then(|r| r.1)
                .map_or(len, |b| (b + 1).min(len))
                .max(start);
            let head = if range.is_some() {
                format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {}-{}/{}\r\n\r\n",
                    stop - start,
                    start,
                    stop.saturating_sub(1),
                    len
                )
            } else {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    stop - start
                )
            };
            if !self.send(&mut w, head.as_bytes()) {
                return;
            }
            let body = stop - start;
            let cut = body > 64 * 1024
                && self
                    .drops
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            let until = if cut { body / 2 } else { body };
            if f.seek(SeekFrom::Start(start)).is_err() || !self.body(&mut f, &mut w, until) {
                return;
            }
            if cut {
                let _ = w.flush();
                let _ = w.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }

    /// `n` bytes from `f` in 16 KiB pieces, paced to the rate; false when the client left.
    fn body(&self, f: &mut std::fs::File, w: &mut TcpStream, n: u64) -> bool {
        let t0 = std::time::Instant::now();
        let mut buf = vec![0u8; 16 << 10];
        let mut done = 0u64;
        while done < n {
            let want = (n - done).min(buf.len() as u64) as usize;
            if f.read_exact(&mut buf[..want]).is_err() {
                return false;
            }
            if self.knobs.rate > 0 {
                let due = std::time::Duration::from_secs_f64(done as f64 / self.knobs.rate as f64);
                if let Some(d) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(d);
                }
            }
            if !self.send(w, &buf[..want]) {
                return false;
            }
            done += want as u64;
        }
        true
    }
}

/// The in-memory loader with GRUB's rules (stage tests, where the loader only matters for
/// `mark_bad`); boot-assessment tests use the real backends of [`loaders`].
pub type ModelLoader = bootconfig::memory::MemoryBootloader;

/// A node under the temp root `p`: k3OS-style dir layout (`p/system`, boot files in
/// `p/boot`), state in `p/state`, health checks in `p/health.d`, and the files the kernel
/// would provide (`cmdline`, `boot_id`, `mountinfo`, `k3os-release`) as plain files; the
/// built-in rootfs check is off (nothing is mounted).
pub fn dir_config(p: &Path, trust: &Path, bootloader: BootloaderKind) -> Config {
    Config {
        bootloader,
        tries: 3,
        layout: LayoutConfig::Dir {
            root: p.join("system"),
            boot_dir: p.join("boot"),
        },
        state_dir: p.join("state"),
        trust_dir: trust.to_path_buf(),
        health_dir: p.join("health.d"),
        health_timeout_secs: 5,
        download_retries: 0,
        proc_cmdline: p.join("cmdline"),
        release_file: p.join("k3os-release"),
        mountinfo: p.join("mountinfo"),
        boot_id_file: p.join("boot_id"),
        builtin_health_check: false,
    }
}
