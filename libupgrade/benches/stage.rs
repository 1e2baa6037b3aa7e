//! Stage throughput and memory against the obvious reference.
//!
//! Builds a signed release whose rootfs is an uncompressed squashfs of `BENCH_SIZE_MIB`
//! (default 1024) MiB of random bytes, then times, on the same data and disk:
//! - reference: `dd if=rootfs of=<partition offset in a disk image> bs=1M conv=fsync,notrunc`
//!   (and `dd … conv=fsync` of the kernel and initrd) followed by `sha256sum` of all three;
//! - ours: `Updater::stage` from the local release into slot B of a GPT disk image file
//!   (stream once, hash while writing, fsync, squashfs check), run in a child process whose
//!   peak RSS (`ru_maxrss`) is reported.
//!
//! Prints `ratio = ours / reference` (target <= 1.2) and `peak RSS` (target < 64 MiB). Run with
//! `cargo bench -p libupgrade --bench stage` (or `just bench`).
//!
//! Then, for a site on a thin link, the same release served over HTTP (testkit's byte-counting
//! server on 127.0.0.1): the preview's bytes next to what the stage fetched and what crossed
//! the wire (target: preview = fetched exactly, the wire only adds response headers), and the
//! bytes fetched with an extra source directory holding the first 80 % of every artifact,
//! against the full fetch measured in the same run (target ratio <= 0.22).
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use libupgrade::Release;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use bootconfig::MemoryBootloader;
use libupgrade::layout::GptLayout;
use libupgrade::{BootloaderKind, Config, LayoutConfig};
use libupgrade::{ExtraSource, NoProgress, Source, StageOptions, Updater};

const MIB: u64 = 1 << 20;

fn sh(cmd: &mut Command) {
    let st = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(st.success(), "{cmd:?} failed");
}

fn config(work: &Path, disk: &Path) -> Config {
    Config {
        bootloader: BootloaderKind::Grub,
        tries: 3,
        layout: LayoutConfig::Gpt {
            disk: disk.to_path_buf(),
            boot_dir: work.join("boot"),
        },
        state_dir: work.join("state"),
        trust_dir: work.join("trust"),
        health_dir: work.join("health.d"),
        airgap_dir: work.join("airgap"),
        health_timeout_secs: 5,
        download_retries: 0,
        proc_cmdline: work.join("cmdline"),
        release_file: work.join("release"),
        mountinfo: work.join("mountinfo"),
        boot_id_file: work.join("boot_id"),
        builtin_health_check: false,
        reachability: None,
        channel_root: std::path::PathBuf::from("/nonexistent/root.json"),
        channel_metadata: Default::default(),
        report_url: None,
        report_site: None,
        payload_store_max_bytes: libupgrade::DEFAULT_PAYLOAD_STORE_MAX_BYTES,
        failure_bundle: Default::default(),
    }
}

fn child(work: &Path) {
    let disk = work.join("disk.img");
    let cfg = config(work, &disk);
    let layout = GptLayout::open(&disk, &work.join("boot")).expect("GPT");
    let u = Updater::with_parts(cfg, Box::new(layout), Box::new(MemoryBootloader::new(3)));
    let r = u
        .stage(
            &Release::at(Source::Path(work.join("rel"))),
            &StageOptions::default(),
            &NoProgress,
        )
        .expect("stage");
    assert!(!r.already_staged);
    // VmHWM, not getrusage's ru_maxrss: the latter keeps the parent's peak from before exec
    // (the forked copy of its memory), which made this child look as large as the bench.
    let hwm: u64 = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    println!("MAXRSS_KIB {hwm}");
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(w) = std::env::var("BENCH_STAGE_CHILD") {
        child(Path::new(&w));
        return;
    }
    let size_mib: u64 = std::env::var("BENCH_SIZE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::tempdir_in(base).unwrap();
    let work = tmp.path();
    println!("stage bench: {size_mib} MiB rootfs in {}", work.display());

    // Release: uncompressed squashfs of random data (so the bytes are incompressible).
    let tree = work.join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    sh(Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "status=none"])
        .arg(format!("of={}", tree.join("payload").display()))
        .arg(format!("count={size_mib}")));
    let sq = work.join("rootfs.squashfs");
    sh(Command::new("mksquashfs").arg(&tree).arg(&sq).args([
        "-noappend",
        "-quiet",
        "-noI",
        "-noD",
        "-noF",
        "-noX",
    ]));
    std::fs::remove_dir_all(&tree).unwrap();
    std::fs::write(work.join("k"), vec![1u8; 4 << 20]).unwrap();
    std::fs::write(work.join("i"), vec![2u8; 4 << 20]).unwrap();
    let keys = work.join("keys");
    let (secret, public) = libupgrade::signing::generate_keypair(&keys, "bench").unwrap();
    std::fs::create_dir_all(work.join("trust")).unwrap();
    std::fs::copy(&public, work.join("trust/bench.pub")).unwrap();
    libupgrade::release::create(&libupgrade::release::CreateOptions {
        rootfs: sq.clone(),
        kernel: work.join("k"),
        initrd: work.join("i"),
        version: "bench".into(),
        arch: libupgrade::manifest::Arch::host(),
        secret_key: secret,
        out_dir: work.join("rel"),
        generation: Some(2),
        scripts: Vec::new(),
        payloads: Vec::new(),
    })
    .unwrap();
    std::fs::remove_file(&sq).unwrap();
    let rootfs = work.join("rel/rootfs.squashfs");
    let len = std::fs::metadata(&rootfs).unwrap().len();

    // Disk image: rootfs-a, rootfs-b sized for the image; sparse.
    let part = (len / MIB + 8) * MIB;
    let disk = work.join("disk.img");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&disk)
        .unwrap();
    f.set_len(2 * part + 4 * MIB).unwrap();
    let mut f2 = f.try_clone().unwrap();
    gpt::mbr::ProtectiveMBR::with_lb_size(
        u32::try_from((2 * part + 4 * MIB) / 512 - 1).unwrap_or(u32::MAX),
    )
    .overwrite_lba0(&mut f2)
    .unwrap();
    let mut g = gpt::GptConfig::new()
        .writable(true)
        .create_from_device(f, None)
        .unwrap();
    let mut b_offset = 0;
    for name in ["rootfs-a", "rootfs-b"] {
        let id = g
            .add_partition(name, part, gpt::partition_types::LINUX_FS, 0, Some(2048))
            .unwrap();
        b_offset = g.partitions()[&id].first_lba * 512;
    }
    g.write().unwrap();
    std::fs::create_dir_all(work.join("boot")).unwrap();
    std::fs::write(work.join("cmdline"), "k3os.slot=A").unwrap();
    std::fs::write(work.join("release"), "VERSION=v1\nGENERATION=1\n").unwrap();

    let mut best_ref = f64::MAX;
    let mut best_ours = f64::MAX;
    let mut rss = 0;
    for _round in 0..2 {
        let t = Instant::now();
        sh(Command::new("dd")
            .arg(format!("if={}", rootfs.display()))
            .arg(format!("of={}", disk.display()))
            .args(["bs=1M", "conv=fsync,notrunc", "status=none"])
            .arg(format!("seek={}", b_offset / MIB)));
        for small in ["vmlinuz", "initrd"] {
            sh(Command::new("dd")
                .arg(format!("if={}", work.join("rel").join(small).display()))
                .arg(format!("of={}", work.join("boot").join(small).display()))
                .args(["bs=1M", "conv=fsync", "status=none"]));
        }
        sh(Command::new("sha256sum")
            .arg(&rootfs)
            .arg(work.join("rel/vmlinuz"))
            .arg(work.join("rel/initrd"))
            .stdout(std::process::Stdio::null()));
        best_ref = best_ref.min(t.elapsed().as_secs_f64());

        let _ = std::fs::remove_dir_all(work.join("state"));
        let t = Instant::now();
        let out = Command::new(std::env::current_exe().unwrap())
            .env("BENCH_STAGE_CHILD", work)
            .output()
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "stage child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        best_ours = best_ours.min(secs);
        let text = String::from_utf8_lossy(&out.stdout);
        rss = text
            .lines()
            .find_map(|l| l.strip_prefix("MAXRSS_KIB "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    let mib = len as f64 / MIB as f64;
    println!(
        "reference dd+sha256sum: {best_ref:.2} s ({:.0} MiB/s)",
        mib / best_ref
    );
    println!(
        "libupgrade stage:       {best_ours:.2} s ({:.0} MiB/s)",
        mib / best_ours
    );
    println!("ratio = {:.2} (target <= 1.2)", best_ours / best_ref);
    println!(
        "peak RSS of the staging process = {:.1} MiB (target < 64 MiB)",
        rss as f64 / 1024.0
    );
    thin_link(work, &disk);
}

/// The thin-link figures (see the module docs): preview vs actual, and an 80 %-complete extra
/// source against the full fetch.
fn thin_link(work: &Path, disk: &Path) {
    let srv = testkit::TestServer::paced(work.to_path_buf(), 0);
    let src = Source::parse(&format!("{}rel", srv.base));
    let medium = work.join("medium");
    std::fs::create_dir_all(&medium).unwrap();
    for f in ["rootfs.squashfs", "vmlinuz", "initrd"] {
        let from = std::fs::File::open(work.join("rel").join(f)).unwrap();
        let len = from.metadata().unwrap().len();
        let mut to = std::fs::File::create(medium.join(f)).unwrap();
        std::io::copy(&mut std::io::Read::take(from, len * 4 / 5), &mut to).unwrap();
    }
    let run = |extra: Vec<ExtraSource>| {
        let _ = std::fs::remove_dir_all(work.join("state"));
        let cfg = config(work, disk);
        let layout = GptLayout::open(disk, &work.join("boot")).expect("GPT");
        let u = Updater::with_parts(cfg, Box::new(layout), Box::new(MemoryBootloader::new(3)));
        let opts = StageOptions {
            extra_sources: extra,
            ..StageOptions::default()
        };
        let p = u
            .preview(&Release::at(src.clone()), &opts)
            .expect("preview");
        let (sent, asked) = (srv.sent(), srv.request_count());
        let r = u
            .stage(&Release::at(src.clone()), &opts, &NoProgress)
            .expect("stage");
        let wire = srv.sent() - sent;
        let requests = srv.request_count() - asked;
        (p.fetch(), r.bytes_fetched, wire, requests)
    };
    let (preview, fetched, wire, requests) = run(Vec::new());
    println!(
        "thin link, full stage: preview {preview} bytes, fetched {fetched} (difference {}; target 0), {wire} on the wire in {requests} requests ({} bytes of metadata and headers)",
        fetched as i64 - preview as i64,
        wire - fetched
    );
    let (p80, f80, w80, _) = run(vec![ExtraSource::Dir(medium)]);
    println!(
        "thin link, 80 %-complete extra source: preview {p80}, fetched {f80} (difference {}), {w80} on the wire",
        f80 as i64 - p80 as i64
    );
    println!(
        "extra-source ratio = {:.3} of the full fetch (target <= 0.22)",
        f80 as f64 / fetched as f64
    );
}
