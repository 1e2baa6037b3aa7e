//! Delta benchmark on real data (`just bench-delta`; not part of CI).
//!
//! Inputs: root trees extracted from real Debian packages by `benches/delta-debs.sh` into
//! `$BENCH_DELTA_CACHE/trees` (default `<workspace>/.cache/delta/trees`):
//! - monthly: `monthly-v1` → `monthly-v2` (same bookworm package set, a handful of packages at
//!   their next security/point-release version);
//! - monthly2: `monthly-v0` → `monthly-v1` (the month before: openssl and openssh one release
//!   further back, the versions the archive still carries), so the patch figure is not tuned
//!   to one pair;
//! - major: `monthly-v2` → `major-v2` (the same roles from trixie).
//!
//! For each pair it builds both rootfs squashfs images with the same mksquashfs options and
//! prints, as ratios of the v2 image size:
//! - ours: bytes a node fetches (the chunks of v2 its running v1 lacks, the chunk index, and
//!   ~300 bytes of HTTP headers per range request) as planned by `libupgrade::chunk`;
//! - casync (default chunking, zstd): the compressed chunks in v2's store that v1's lacks, plus
//!   v2's .caibx;
//! - 4 KiB blocks: v2's 4 KiB blocks whose sha256 is not among v1's (what RAUC 1.8's
//!   `block-hash-index` adaptive mode fetches; computed directly because RAUC's adaptive
//!   install needs a streaming verity bundle served to a D-Bus service, not files);
//! - xdelta3 -9 patch size (the per-pair lower anchor);
//! - patch: a `libupgrade::patch` squashfs patch v1 → v2 (built and applied each in a child
//!   process: time and peak RSS, `VmHWM`), and the publisher's cost of the major release's
//!   patches from two bases (N-1 = monthly-v2, N-2 = monthly-v1);
//!
//! then the foreign-zstd pair (`delta/zstd_pair.rs`: the monthly pair made with trixie's
//! libzstd 1.5.7, as published and re-packed), then the same with several mksquashfs options and chunk sizes (monthly pair), and the real
//! stage of each v2 from a local HTTP server into a file-backed GPT disk whose running slot holds
//! v1 (bytes on the wire counted by the server, wall time, child peak RSS).
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

#[path = "delta/zstd_pair.rs"]
mod zstd_pair;

use libupgrade::Release;
use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bootconfig::MemoryBootloader;
use libupgrade::layout::GptLayout;
use libupgrade::{BootloaderKind, Config, LayoutConfig};
use libupgrade::{NoProgress, Source, StageOptions, Updater};

use libupgrade::chunk::local::{find_local, LocalFile};
use libupgrade::chunk::plan::plan;
use libupgrade::chunk::{ChunkIndex, ChunkParams};

#[path = "delta/archives.rs"]
mod archives;

/// HTTP request + response headers per range request (measured with `release serve`: ~120 B
/// request, ~180 B response).
const HEADER_BYTES: u64 = 300;
const MIB: u64 = 1 << 20;

/// The image options the images crate uses (reproducible: fixed times, root-owned, no xattrs).
const BASE: &[&str] = &[
    "-noappend",
    "-quiet",
    "-all-root",
    "-no-xattrs",
    "-comp",
    "zstd",
    "-mkfs-time",
    "0",
    "-all-time",
    "0",
];

fn sh(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (run scripts/setup.sh)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The squashfs of `tree` with `extra` options, cached in `images` by tree and options (the
/// trees only change when delta-debs.sh re-extracts them, which removes the cache).
fn squashfs(images: &Path, tree: &Path, extra: &[&str]) -> PathBuf {
    squashfs_with(images, tree, extra, None)
}

/// [`squashfs`], made by mksquashfs with the libzstd in `lib` when given (`LD_LIBRARY_PATH`).
fn squashfs_with(images: &Path, tree: &Path, extra: &[&str], lib: Option<&Path>) -> PathBuf {
    let name = format!(
        "{}{}{}.sq",
        tree.file_name().unwrap().to_string_lossy(),
        extra.concat().replace('-', "_"),
        if lib.is_some() { "_zstd_trixie" } else { "" }
    );
    let out = images.join(name);
    let stamp = fs::metadata(tree.with_extension("debs"))
        .and_then(|m| m.modified())
        .ok();
    let fresh = fs::metadata(&out).and_then(|m| m.modified()).ok();
    if fresh.is_none() || fresh < stamp {
        let tmp = out.with_extension("tmp");
        let _ = fs::remove_file(&tmp);
        let mut cmd = Command::new("mksquashfs");
        if let Some(lib) = lib {
            cmd.env("LD_LIBRARY_PATH", lib);
        }
        sh(cmd.arg(tree).arg(&tmp).args(BASE).args(extra));
        fs::rename(&tmp, &out).unwrap();
    }
    out
}

fn len(p: &Path) -> u64 {
    fs::metadata(p).unwrap().len()
}

fn local(path: &Path) -> LocalFile {
    let file = fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len();
    LocalFile {
        file,
        offset: 0,
        len,
        name: path.display().to_string(),
    }
}

/// (bytes a node fetches, range requests)
fn ours(v1: &Path, v2: &Path, params: ChunkParams) -> (u64, usize) {
    let index = ChunkIndex::build(fs::File::open(v2).unwrap(), params).unwrap();
    let n = index.chunks.len();
    let found = find_local(&index, &vec![true; n], &[local(v1)]).unwrap();
    let p = plan(&index, &vec![false; n], &found);
    let bytes =
        p.fetch_bytes + index.to_bytes().len() as u64 + HEADER_BYTES * (p.ranges.len() as u64 + 1);
    (bytes, p.ranges.len())
}

fn dir_size(d: &Path, names: &mut Vec<(String, u64)>) {
    for e in fs::read_dir(d).unwrap() {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        if md.is_dir() {
            dir_size(&e.path(), names);
        } else {
            names.push((e.file_name().to_string_lossy().into_owned(), md.len()));
        }
    }
}

fn casync(work: &Path, v1: &Path, v2: &Path) -> u64 {
    let mut stores = Vec::new();
    for (i, img) in [v1, v2].iter().enumerate() {
        let store = work.join(format!("castr{i}"));
        let _ = fs::remove_dir_all(&store);
        let idx = work.join(format!("v{i}.caibx"));
        sh(Command::new("casync")
            .arg("make")
            .arg(format!("--store={}", store.display()))
            .arg(&idx)
            .arg(img));
        let mut names = Vec::new();
        dir_size(&store, &mut names);
        stores.push((names, fs::metadata(&idx).unwrap().len()));
    }
    let have: HashSet<&String> = stores[0].0.iter().map(|(n, _)| n).collect();
    let missing: u64 = stores[1]
        .0
        .iter()
        .filter(|(n, _)| !have.contains(n))
        .map(|(_, s)| s)
        .sum();
    missing + stores[1].1
}

fn blocks4k(v1: &Path, v2: &Path) -> u64 {
    let hashes = |p: &Path, mut f: Box<dyn FnMut([u8; 32], usize)>| {
        let mut r = std::io::BufReader::with_capacity(1 << 20, fs::File::open(p).unwrap());
        let mut b = [0u8; 4096];
        loop {
            let mut n = 0;
            while n < 4096 {
                match r.read(&mut b[n..]).unwrap() {
                    0 => break,
                    k => n += k,
                }
            }
            if n == 0 {
                break;
            }
            b[n..].fill(0);
            f(libupgrade::chunk::digest(&b), n);
        }
    };
    let have = std::rc::Rc::new(std::cell::RefCell::new(HashSet::new()));
    let h = have.clone();
    hashes(
        v1,
        Box::new(move |d, _| {
            h.borrow_mut().insert(d);
        }),
    );
    let missing = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let m = missing.clone();
    hashes(
        v2,
        Box::new(move |d, n| {
            if !have.borrow().contains(&d) {
                m.set(m.get() + n as u64);
            }
        }),
    );
    missing.get()
}

fn xdelta(work: &Path, v1: &Path, v2: &Path) -> u64 {
    let patch = work.join("patch.xd3");
    let window = fs::metadata(v1)
        .unwrap()
        .len()
        .next_power_of_two()
        .max(1 << 20);
    sh(Command::new("xdelta3")
        .args(["-e", "-9", "-f", "-B"])
        .arg(window.to_string())
        .arg("-s")
        .arg(v1)
        .arg(v2)
        .arg(&patch));
    fs::metadata(&patch).unwrap().len()
}

fn pct(x: u64, of: u64) -> String {
    format!("{:6.1}%", 100.0 * x as f64 / of as f64)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_DELTA_PATCH") {
        patch_child(&spec);
        return;
    }
    if let (Ok(w), Ok(url)) = (
        std::env::var("BENCH_DELTA_CHILD"),
        std::env::var("BENCH_DELTA_URL"),
    ) {
        child(Path::new(&w), &url);
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let cache = std::env::var_os("BENCH_DELTA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/delta"));
    // BENCH_DELTA_SECTIONS=archives,options,chunks,zstd,pairs,stage (default: all) runs a subset.
    let sections = std::env::var("BENCH_DELTA_SECTIONS").unwrap_or_default();
    let want = |s: &str| sections.is_empty() || sections.split(',').any(|x| x == s);
    if want("archives") {
        fs::create_dir_all(&cache).unwrap();
        archives::run(&cache, tempfile::tempdir_in(&cache).unwrap().path());
        if sections == "archives" {
            return;
        }
    }
    let trees = cache.join("trees");
    for t in ["monthly-v0", "monthly-v1", "monthly-v2", "major-v2"] {
        assert!(
            trees.join(t).is_dir(),
            "{} missing: run libupgrade/benches/delta-debs.sh {} first (just bench-delta does)",
            trees.join(t).display(),
            cache.display()
        );
    }
    let work = tempfile::tempdir_in(&cache).unwrap();
    let w = work.path();
    let images = cache.join("images");
    fs::create_dir_all(&images).unwrap();
    let pairs = [
        ("monthly", "monthly-v1", "monthly-v2"),
        ("monthly2", "monthly-v0", "monthly-v1"),
        ("major", "monthly-v2", "major-v2"),
    ];

    if want("options") {
        println!("== mksquashfs options (monthly pair; ours at the default chunk size) ==");
        println!(
            "{:<34} {:>10} {:>9} {:>9}",
            "options", "v2 bytes", "ours", "4K-blocks"
        );
        let variants: [&[&str]; 4] = [
            &[],
            &["-b", "64K"],
            &["-no-fragments"],
            &["-b", "64K", "-no-fragments"],
        ];
        for extra in variants {
            let v1 = squashfs(&images, &trees.join("monthly-v1"), extra);
            let v2 = squashfs(&images, &trees.join("monthly-v2"), extra);
            let size = len(&v2);
            let (o, _) = ours(&v1, &v2, ChunkParams::DEFAULT);
            let b = blocks4k(&v1, &v2);
            let name = if extra.is_empty() {
                "(default: -b 128K, fragments)".to_string()
            } else {
                extra.join(" ")
            };
            println!("{name:<34} {size:>10} {} {}", pct(o, size), pct(b, size));
        }
    }
    let rec: &[&str] = &["-no-fragments"];
    println!(
        "\n== chunk size (monthly pair, mksquashfs {}) ==",
        rec.join(" ")
    );
    if want("chunks") {
        let v1 = squashfs(&images, &trees.join("monthly-v1"), rec);
        let v2 = squashfs(&images, &trees.join("monthly-v2"), rec);
        let size = len(&v2);
        for kib in [32u32, 64, 128] {
            let t = Instant::now();
            let (o, reqs) = ours(&v1, &v2, ChunkParams::with_avg(kib << 10));
            println!(
            "avg {kib:>3} KiB: fetched {} ({o} bytes, {reqs} range requests, index+plan {:.1} s)",
            pct(o, size),
            t.elapsed().as_secs_f64()
        );
        }
    }

    if want("zstd") {
        let lib = trees.join("libzstd-trixie/usr/lib/x86_64-linux-gnu");
        zstd_pair::run(&images, &trees, &lib, rec, w);
    }

    let mut stages = Vec::new();
    println!(
        "\n== per pair (mksquashfs {}), ratios of the v2 image ==",
        rec.join(" ")
    );
    println!(
        "{:<8} {:>11} {:>9} {:>9} {:>10} {:>9} {:>9}",
        "pair", "v2 bytes", "ours", "casync", "4K-blocks", "xdelta3", "patch"
    );
    let mut patch_runs = Vec::new();
    for (name, a, b) in pairs {
        if !want("pairs") && !want("stage") {
            break; // the images only serve these two sections
        }
        let v1 = squashfs(&images, &trees.join(a), rec);
        let v2 = squashfs(&images, &trees.join(b), rec);
        let size = len(&v2);
        stages.push((name, v1.clone(), v2.clone(), size));
        if !want("pairs") {
            continue;
        }
        let (o, _) = ours(&v1, &v2, ChunkParams::DEFAULT);
        let c = casync(w, &v1, &v2);
        let k = blocks4k(&v1, &v2);
        let x = xdelta(w, &v1, &v2);
        let built = patch_run(&["build", "squashfs"], &[&v1, &v2, &w.join("patch")]);
        let applied = patch_run(&["apply"], &[&w.join("patch"), &v1, &w.join("patched")]);
        println!(
            "{name:<8} {size:>11} {} {} {}  {} {}",
            pct(o, size),
            pct(c, size),
            pct(k, size),
            pct(x, size),
            pct(built.bytes, size)
        );
        patch_runs.push((name, built, applied));
    }
    for (name, built, applied) in &patch_runs {
        println!(
            "{name:<8} patch: built in {:.1} s, builder peak RSS {:.0} MiB ({}); applied in {:.2} s, applier peak RSS {:.1} MiB",
            built.secs,
            built.rss_kib as f64 / 1024.0,
            built.note,
            applied.secs,
            applied.rss_kib as f64 / 1024.0
        );
    }
    if let Some((_, n1, _)) = patch_runs.iter().find(|(n, _, _)| *n == "major") {
        // The publisher's cost: the major release's patches from two bases, N-1 (monthly-v2,
        // the major pair's patch above) and N-2 (monthly-v1).
        let n2 = squashfs(&images, &trees.join("monthly-v1"), rec);
        let n = squashfs(&images, &trees.join("major-v2"), rec);
        let b = patch_run(&["build", "squashfs"], &[&n2, &n, &w.join("patch2")]);
        println!(
            "publisher: major-v2 from monthly-v2 and monthly-v1: {:.1} s + {:.1} s, peak RSS {:.0} MiB, published {} + {} bytes ({})",
            n1.secs,
            b.secs,
            n1.rss_kib.max(b.rss_kib) as f64 / 1024.0,
            n1.bytes,
            b.bytes,
            b.note
        );
    }
    if !want("stage") {
        return;
    }

    println!("\n== real stage into a file-backed GPT disk, from a local HTTP server ==");
    let keys = w.join("keys");
    let (secret, public) = libupgrade::signing::generate_keypair(&keys, "bench").unwrap();
    fs::create_dir_all(w.join("trust")).unwrap();
    fs::copy(&public, w.join("trust/bench.pub")).unwrap();
    fs::write(w.join("k"), testkit::pseudo_random(8 << 20, 1)).unwrap();
    fs::write(w.join("i"), testkit::pseudo_random(16 << 20, 2)).unwrap();
    let srv = testkit::TestServer::start(w.to_path_buf(), 0);
    let (base, sent) = (srv.base.clone(), srv.sent_counter());
    for (name, v1, v2, size) in &stages {
        let _ = fs::remove_dir_all(w.join("rel"));
        libupgrade::release::create(&libupgrade::release::CreateOptions {
            rootfs: v2.clone(),
            kernel: w.join("k"),
            initrd: w.join("i"),
            version: "v2".into(),
            arch: libupgrade::manifest::Arch::host(),
            secret_key: secret.clone(),
            out_dir: w.join("rel"),
            generation: Some(2),
            scripts: Vec::new(),
            payloads: Vec::new(),
        })
        .unwrap();
        let (secs, wire, fetched, rss) = stage_run(w, Some(v1), &base, &sent);
        println!(
            "{name:<8} delta: {secs:6.2} s, on the wire {} of the v2 image ({fetched} payload bytes fetched), peak RSS {:.1} MiB",
            pct(wire, *size),
            rss as f64 / 1024.0
        );
        if let Some((_, _, applied)) = patch_runs.iter().find(|(n, _, _)| n == name) {
            println!(
                "{name:<8} patch apply (base file → target file, no network): {:6.2} s = {:.2}× the delta stage, peak RSS {:.1} MiB",
                applied.secs,
                applied.secs / secs,
                applied.rss_kib as f64 / 1024.0
            );
        }
        let (secs, wire, _, rss) = stage_run(w, None, &base, &sent);
        println!(
            "{name:<8} full:  {secs:6.2} s, on the wire {} (slot A empty: nothing to reuse), peak RSS {:.1} MiB",
            pct(wire, *size),
            rss as f64 / 1024.0
        );
        let (secs, svc, cli) = rauc_install(w, v2);
        println!(
            "{name:<8} rauc install (plain bundle, local file, into a file slot): {secs:6.2} s, peak RSS service {:.1} MiB + client {:.1} MiB",
            svc as f64 / 1024.0,
            cli as f64 / 1024.0
        );
    }
}

// ---- the real stage: v2 from a local HTTP server into slot B, slot A running v1 ----

fn config(work: &Path) -> Config {
    Config {
        bootloader: BootloaderKind::Grub,
        tries: 3,
        layout: LayoutConfig::Gpt {
            disk: work.join("disk.img"),
            boot_dir: work.join("boot"),
        },
        state_dir: work.join("state"),
        trust_dir: work.join("trust"),
        health_dir: work.join("health.d"),
        airgap_dir: work.join("airgap"),
        health_timeout_secs: 5,
        download_retries: 3,
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

/// `rauc install` of a plain bundle holding `image` into a file-backed slot B (slot A booted,
/// noop bootloader), through a private D-Bus system bus and `rauc service`. Returns (seconds of
/// `rauc install`, peak RSS of the service in KiB, peak RSS of the `rauc install` client).
fn rauc_install(work: &Path, image: &Path) -> (f64, u64, u64) {
    let r = work.join("rauc");
    let _ = fs::remove_dir_all(&r);
    fs::create_dir_all(r.join("bundle")).unwrap();
    fs::create_dir_all(r.join("mnt")).unwrap();
    fs::write(
        r.join("bus.conf"),
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>system</type><listen>unix:path={}/bus</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="*"/><allow send_type="method_call"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>
"#,
            r.display()
        ),
    )
    .unwrap();
    sh(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "10",
            "-subj",
            "/CN=bench",
        ])
        .arg("-keyout")
        .arg(r.join("key.pem"))
        .arg("-out")
        .arg(r.join("cert.pem"))
        .stderr(std::process::Stdio::null()));
    let slot_len = (len(image) / MIB + 8) * MIB;
    for s in ["slotA.img", "slotB.img"] {
        fs::File::create(r.join(s))
            .unwrap()
            .set_len(slot_len)
            .unwrap();
    }
    fs::write(
        r.join("system.conf"),
        format!(
            "[system]\ncompatible=k3os-bench\nbootloader=noop\nmountprefix={0}/mnt\n[keyring]\npath={0}/cert.pem\n\
             [slot.rootfs.0]\ndevice={0}/slotA.img\ntype=raw\nbootname=A\n\
             [slot.rootfs.1]\ndevice={0}/slotB.img\ntype=raw\nbootname=B\n",
            r.display()
        ),
    )
    .unwrap();
    fs::copy(image, r.join("bundle/rootfs.img")).unwrap();
    fs::write(
        r.join("bundle/manifest.raucm"),
        "[update]\ncompatible=k3os-bench\nversion=2\n[bundle]\nformat=plain\n[image.rootfs]\nfilename=rootfs.img\n",
    )
    .unwrap();
    sh(Command::new("rauc")
        .arg("bundle")
        .arg(format!("--cert={}", r.join("cert.pem").display()))
        .arg(format!("--key={}", r.join("key.pem").display()))
        .arg(r.join("bundle"))
        .arg(r.join("b.raucb")));
    let bus = format!("unix:path={}/bus", r.display());
    let mut dbus = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", r.join("bus.conf").display()))
        .arg("--nofork")
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut svc = Command::new("rauc")
        .arg("service")
        .arg(format!("--conf={}", r.join("system.conf").display()))
        .arg("--override-boot-slot=A")
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    sh(&mut Command::new("sync"));
    let t = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "MAXRSS_KIB %M", "rauc", "install"])
        .arg(r.join("b.raucb"))
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus)
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let hwm = fs::read_to_string(format!("/proc/{}/status", svc.id()))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let _ = svc.kill();
    let _ = svc.wait();
    let _ = dbus.kill();
    let _ = dbus.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rauc install failed: {err}");
    let mut got = vec![0u8; len(image) as usize];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(r.join("slotB.img")).unwrap(),
        &mut got,
        0,
    )
    .unwrap();
    assert!(
        got == fs::read(image).unwrap(),
        "rauc did not write the image into slot B"
    );
    let cli = err
        .lines()
        .find_map(|l| l.strip_prefix("MAXRSS_KIB "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (secs, hwm, cli)
}

/// In the child: stage from `url`, print the report and the peak RSS.
fn child(work: &Path, url: &str) {
    let cfg = config(work);
    let layout = GptLayout::open(&work.join("disk.img"), &work.join("boot")).expect("GPT");
    let u = Updater::with_parts(cfg, Box::new(layout), Box::new(MemoryBootloader::new(3)));
    let r = u
        .stage(
            &Release::at(Source::parse(url)),
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
    println!("FETCHED {} REUSED {}", r.bytes_fetched, r.bytes_reused);
    println!("MAXRSS_KIB {hwm}");
}

/// A GPT disk image file with rootfs-a/rootfs-b of `part` bytes; returns rootfs-a's offset.
fn make_disk(work: &Path, part: u64) -> u64 {
    let disk = work.join("disk.img");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&disk)
        .unwrap();
    let total = 2 * part + 4 * MIB;
    f.set_len(total).unwrap();
    let mut f2 = f.try_clone().unwrap();
    gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(total / 512 - 1).unwrap_or(u32::MAX))
        .overwrite_lba0(&mut f2)
        .unwrap();
    let mut g = gpt::GptConfig::new()
        .writable(true)
        .create_from_device(f, None)
        .unwrap();
    let mut a_offset = None;
    for name in ["rootfs-a", "rootfs-b"] {
        let id = g
            .add_partition(name, part, gpt::partition_types::LINUX_FS, 0, Some(2048))
            .unwrap();
        a_offset.get_or_insert(g.partitions()[&id].first_lba * 512);
    }
    g.write().unwrap();
    a_offset.unwrap()
}

/// Stage `v2` (signed release in `work/rel`) with slot A holding `v1` (None: empty slot A, a
/// full download). Returns (seconds, bytes on the wire, fetched, peak RSS KiB).
fn stage_run(work: &Path, v1: Option<&Path>, base: &str, sent: &AtomicU64) -> (f64, u64, u64, u64) {
    let v2 = work.join("rel/rootfs.squashfs");
    let size = fs::metadata(&v2)
        .unwrap()
        .len()
        .max(v1.map_or(0, |p| fs::metadata(p).unwrap().len()));
    let a = make_disk(work, (size / MIB + 8) * MIB);
    let _ = fs::remove_dir_all(work.join("state"));
    let _ = fs::remove_dir_all(work.join("boot"));
    fs::create_dir_all(work.join("boot/a")).unwrap();
    for f in ["vmlinuz", "initrd"] {
        fs::copy(work.join("rel").join(f), work.join("boot/a").join(f)).unwrap();
    }
    if let Some(v1) = v1 {
        let img = fs::OpenOptions::new()
            .write(true)
            .open(work.join("disk.img"))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&img, &fs::read(v1).unwrap(), a).unwrap();
    }
    fs::write(work.join("cmdline"), "k3os.slot=A").unwrap();
    fs::write(work.join("release"), "VERSION=v1\nGENERATION=1\n").unwrap();
    sh(&mut Command::new("sync"));
    let before = sent.load(Ordering::SeqCst);
    let t = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .env("BENCH_DELTA_CHILD", work)
        .env("BENCH_DELTA_URL", format!("{base}rel/"))
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "stage child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.split_whitespace()
            .skip_while(|w| *w != k)
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (
        secs,
        sent.load(Ordering::SeqCst) - before,
        field("FETCHED"),
        field("MAXRSS_KIB"),
    )
}

// ---- patches (libupgrade::patch): built and applied in a child each, for time and peak RSS ----

/// What one patch child measured.
struct PatchRun {
    secs: f64,
    rss_kib: u64,
    /// Bytes of the patch (build) or of the output (apply).
    bytes: u64,
    /// The builder's op counts.
    note: String,
}

/// Run this bench as a child that builds or applies a patch (`mode` + `files`).
fn patch_run(mode: &[&str], files: &[&Path]) -> PatchRun {
    let mut spec: Vec<String> = mode.iter().map(|m| m.to_string()).collect();
    spec.extend(files.iter().map(|f| f.display().to_string()));
    let t = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .env("BENCH_DELTA_PATCH", spec.join("\n"))
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "patch child {mode:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| {
        text.split_whitespace()
            .skip_while(|w| *w != k)
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    PatchRun {
        secs,
        rss_kib: field("MAXRSS_KIB"),
        bytes: field("BYTES"),
        note: text
            .lines()
            .find_map(|l| l.strip_prefix("NOTE "))
            .unwrap_or("")
            .to_string(),
    }
}

/// In the child: `build\nsquashfs|plain\nBASE\nTARGET\nOUT` or `apply\nPATCH\nBASE\nOUT`.
fn patch_child(spec: &str) {
    use libupgrade::patch::{self, PatchKind};
    let a: Vec<&str> = spec.split('\n').collect();
    match a[..] {
        ["build", kind, base, target, out] => {
            let kind = if kind == "plain" {
                PatchKind::Plain
            } else {
                PatchKind::Squashfs
            };
            let mut f = std::io::BufWriter::new(fs::File::create(out).unwrap());
            let st = patch::build(kind, Path::new(base), Path::new(target), &mut f).unwrap();
            println!("BYTES {}", st.bytes);
            println!(
                "NOTE {} copy ops ({} MB), {} literal ({} MB), {} data ops ({} blocks recompressed, {} not reproducible), {}",
                st.copy_ops,
                st.copy_bytes / 1_000_000,
                st.literal_ops,
                st.literal_bytes / 1_000_000,
                st.data_ops,
                st.blocks_recompressed,
                st.blocks_not_reproducible,
                st.compressor
            );
        }
        ["apply", p, base, out] => {
            let mut r = std::io::BufReader::new(fs::File::open(p).unwrap());
            let base = fs::File::open(base).unwrap();
            let mut o = std::io::BufWriter::new(fs::File::create(out).unwrap());
            let st = patch::apply(
                &mut r,
                patch::Base::whole(&base).unwrap(),
                &mut |b: &[u8]| std::io::Write::write_all(&mut o, b),
            )
            .unwrap();
            std::io::Write::flush(&mut o).unwrap();
            println!("BYTES {}", st.bytes);
        }
        _ => panic!("BENCH_DELTA_PATCH {spec:?}"),
    }
    let hwm: u64 = fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    println!("MAXRSS_KIB {hwm}");
}
