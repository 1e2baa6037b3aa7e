//! Chunked staging on a real GPT disk image against a real (throttled, byte-counting) HTTP
//! server: delta from the running slot, a chunk missing locally, a tampered chunk on the
//! server, an index that does not match its manifest, a 404 found by the preflight, the rate
//! cap, and `kill -9` at random points with the bytes on the wire bounded by the release size
//! plus 1 MiB.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use libupgrade::Release;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use libupgrade::{Error, NoProgress, Source, StageOptions, Updater};

use libupgrade::state::SlotState;
use testkit::*;

mod patched;
mod payloads;

/// A signed release whose kernel and initrd are noise from `seed + 100` and `seed + 200`.
fn release(
    k: &Keys,
    out: &Path,
    version: &str,
    generation: u64,
    payload: &[u8],
    seed: u64,
) -> PathBuf {
    noise_release(k, out, version, generation, payload, seed + 100, seed + 200)
}

/// v1 and a "monthly" v2: the same payload with three 40 KiB regions rewritten.
fn v1_v2(k: &Keys, out: &Path, size: usize) -> (PathBuf, PathBuf) {
    let p1 = pseudo_random(size, 11);
    let mut p2 = p1.clone();
    for (i, at) in [size / 5, size / 2, size * 4 / 5].into_iter().enumerate() {
        p2[at..at + 40_000].copy_from_slice(&pseudo_random(40_000, 50 + i as u64));
    }
    // The kernel stays, the initrd changes.
    let v1 = noise_release(k, out, "v1", 1, &p1, 101, 201);
    let v2 = noise_release(k, out, "v2", 2, &p2, 101, 999);
    (v1, v2)
}

#[test]
fn delta_from_the_running_slot_fetches_only_changed_chunks_and_a_locally_damaged_one() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let (v1, v2) = v1_v2(&k, rels.path(), 16 << 20);
    disk.install_in_a(&v1);
    // Damage slot A where v2 is unchanged (30% into the image): that chunk must be fetched.
    let (off, _) = disk.parts["rootfs-a"];
    let img = std::fs::OpenOptions::new()
        .write(true)
        .open(&disk.image)
        .unwrap();
    img.write_all_at(b"damaged", off + (16 << 20) * 3 / 10)
        .unwrap();
    img.sync_all().unwrap();

    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let r = u
        .stage(
            &Release::at(Source::parse(&format!("{}v2", srv.base))),
            &fast_stage(),
            &NoProgress,
        )
        .unwrap();
    disk.assert_b_is(&v2);
    let total = release_size(&v2);
    // The rootfs regions and the whole new initrd; each changed region costs at most the
    // chunks it touches (≤ 2 max-size chunks), the damaged one chunk.
    let changed = 3 * 40_000 + 400_000;
    let max = u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max);
    assert!(
        r.bytes_fetched <= changed + 7 * max,
        "fetched {} of {total}",
        r.bytes_fetched
    );
    assert!(r.bytes_fetched > 400_000, "the new initrd must be fetched");
    assert_eq!(r.bytes_fetched + r.bytes_reused, total);
    assert!(
        srv.sent() <= r.bytes_fetched + 64 * 1024 + 40_000,
        "{} on the wire",
        srv.sent()
    );
    let st = u.status().unwrap();
    let t = st.slots[1].transfer.expect("transfer recorded for slot B");
    assert_eq!(
        (t.fetched, t.reused, t.total),
        (r.bytes_fetched, r.bytes_reused, total)
    );
    let d = st.slots[1].last_decision.as_ref().unwrap();
    assert!(
        d.why.contains("fetched") && d.why.contains("reused"),
        "{}",
        d.why
    );
}

#[test]
fn a_tampered_chunk_on_the_server_never_reaches_the_slot() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = release(&k, rels.path(), "v2", 2, &pseudo_random(8 << 20, 3), 2);
    // Tamper after signing, in the middle of the image.
    let p = rel.join("rootfs.squashfs");
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let at = std::fs::metadata(&p).unwrap().len() / 2;
    f.write_all_at(b"EVIL-BYTES", at).unwrap();
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let e = u
        .stage(
            &Release::at(Source::parse(&format!("{}v2", srv.base))),
            &fast_stage(),
            &NoProgress,
        )
        .unwrap_err();
    assert!(matches!(e, Error::ChunkDigest { .. }), "{e}");
    assert!(e.to_string().contains("refused before writing"), "{e}");
    let b = disk.part_bytes("rootfs-b", at + 10);
    assert_ne!(
        &b[at as usize..],
        b"EVIL-BYTES",
        "the tampered chunk was written"
    );
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Invalid);
}

#[test]
fn an_index_that_does_not_match_its_manifest_is_a_clear_error_before_any_write() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = release(&k, rels.path(), "v2", 2, &pseudo_random(4 << 20, 4), 2);
    let u = disk.updater(disk.config(&k.trust));
    u.confirm().ok();
    let state_before = std::fs::read(disk.state_dir.join("state.json")).unwrap();
    let b_before = disk.part_bytes("rootfs-b", MIB);

    // 1. The index file was replaced on the server after signing.
    let ipath = rel.join("vmlinuz.chunks");
    let good = std::fs::read(&ipath).unwrap();
    let other = libupgrade::chunk::ChunkIndex::build(
        &pseudo_random(600_000, 77)[..],
        libupgrade::chunk::ChunkParams::DEFAULT,
    )
    .unwrap()
    .to_bytes();
    std::fs::write(&ipath, &other).unwrap();
    let e = u
        .stage(
            &Release::at(Source::Path(rel.clone())),
            &fast_stage(),
            &NoProgress,
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::ChunkIndex { .. }), "{msg}");
    assert!(
        msg.contains("kernel")
            && msg.contains("vmlinuz.chunks")
            && msg.contains("signed manifest says"),
        "{msg}"
    );
    std::fs::write(&ipath, &good).unwrap();

    // 2. A publisher signed an index for a file of another size.
    let m_bytes = std::fs::read(rel.join("manifest.json")).unwrap();
    let mut m = libupgrade::manifest::Manifest::parse(&m_bytes).unwrap();
    let short = libupgrade::chunk::ChunkIndex::build(
        &std::fs::read(rel.join("vmlinuz")).unwrap()[..500_000],
        libupgrade::chunk::ChunkParams::DEFAULT,
    )
    .unwrap()
    .to_bytes();
    std::fs::write(&ipath, &short).unwrap();
    let r = m.files.kernel.chunks.as_mut().unwrap();
    r.size = short.len() as u64;
    r.sha256 = hex_sha256(&short);
    std::fs::write(rel.join("manifest.json"), m.to_bytes()).unwrap();
    std::fs::write(
        rel.join("manifest.json.sig"),
        libupgrade::signing::sign(&m.to_bytes(), &k.secret).unwrap(),
    )
    .unwrap();
    let e = u
        .stage(
            &Release::at(Source::Path(rel.clone())),
            &fast_stage(),
            &NoProgress,
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("describes 500000 bytes") && msg.contains("600000"),
        "{msg}"
    );

    assert_eq!(
        std::fs::read(disk.state_dir.join("state.json")).unwrap(),
        state_before
    );
    assert_eq!(disk.part_bytes("rootfs-b", MIB), b_before);
}

fn hex_sha256(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

#[test]
fn a_missing_artifact_fails_the_preflight_in_seconds_and_writes_nothing() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = release(&k, rels.path(), "v2", 2, &pseudo_random(12 << 20, 5), 2);
    std::fs::remove_file(rel.join("initrd")).unwrap();
    let srv = TestServer::paced(rels.path().to_path_buf(), 1 << 20); // 1 MiB/s: a full download would take 13 s
    let u = disk.updater(disk.config(&k.trust)); // 20 retries configured: a 404 is not retried
    u.confirm().ok();
    let state_before = std::fs::read(disk.state_dir.join("state.json")).unwrap();
    let t = Instant::now();
    let e = u
        .stage(
            &Release::at(Source::parse(&format!("{}v2", srv.base))),
            &fast_stage(),
            &NoProgress,
        )
        .unwrap_err()
        .to_string();
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    assert!(e.contains("initrd") && e.contains("404"), "{e}");
    assert_eq!(
        std::fs::read(disk.state_dir.join("state.json")).unwrap(),
        state_before
    );
    assert!(
        srv.sent() < 200_000,
        "{} bytes sent before the 404 was found",
        srv.sent()
    );
}

#[test]
fn max_rate_caps_the_download() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = release(&k, rels.path(), "v2", 2, &pseudo_random(6 << 20, 6), 2);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let t = Instant::now();
    let opts = StageOptions {
        max_rate: Some(2 << 20),
        ..fast_stage()
    };
    u.stage(
        &Release::at(Source::parse(&format!("{}v2", srv.base))),
        &opts,
        &NoProgress,
    )
    .unwrap();
    // ~7 MiB at 2 MiB/s after a 2 MiB burst: at least 2.3 s.
    let s = t.elapsed().as_secs_f64();
    assert!(s >= 2.3, "{s} s for {} bytes", release_size(&rel));
    disk.assert_b_is(&rel);
}

/// Env var that turns this test binary into the stage child of the kill test.
const CHILD: &str = "LIBUPGRADE_CHUNKED_CHILD";

/// The stage child of a kill test: the updater of the GPT disk in `spec` (the JSON of a
/// config and a release URL) and the URL.
fn child_updater(spec: &str) -> (Updater, String) {
    let (cfg, url): (libupgrade::Config, String) = serde_json::from_str(spec).unwrap();
    let layout = libupgrade::layout::GptLayout::open(
        match &cfg.layout {
            libupgrade::LayoutConfig::Gpt { disk, .. } => disk,
            _ => unreachable!(),
        },
        cfg.layout.boot_dir(),
    )
    .unwrap();
    let u = Updater::with_parts(cfg, Box::new(layout), Box::new(ModelLoader::new(9)));
    (u, url)
}

#[test]
fn kill_9_at_random_points_loses_at_most_the_chunk_in_flight_per_kill() {
    if let Ok(spec) = std::env::var(CHILD) {
        // Child: stage from the URL with the config given, as `k3os-ops upgrade` would.
        let (u, url) = child_updater(&spec);
        let t = Instant::now();
        let r = u.stage(
            &Release::at(Source::parse(&url)),
            &fast_stage(),
            &NoProgress,
        );
        eprintln!("child: {r:?} after {:?}", t.elapsed());
        r.unwrap();
        return;
    }
    let disk = TestDisk::new(40 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = release(&k, rels.path(), "v2", 2, &pseudo_random(24 << 20, 8), 2);
    let total = release_size(&rel);
    // 8 MiB/s: a slow link, so a kill lands where the counter says.
    let srv = TestServer::paced(rels.path().to_path_buf(), 8 << 20);
    let cfg = disk.config(&k.trust);
    let url = format!("{}v2", srv.base);
    let spec = serde_json::to_string(&(&cfg, &url)).unwrap();
    let exe = std::env::current_exe().unwrap();
    // Kill points: random amounts of bytes on the wire, each further into the release than the
    // last (the first may land in the preflight), so the kills spread over the whole transfer
    // whatever the machine's speed; after each kill a new child resumes.
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ std::process::id() as u64;
    let mut points: Vec<u64> = (0..5)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % (total * 9 / 10)
        })
        .collect();
    points.sort_unstable();
    let mut kills = Vec::new();
    for point in points {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "chunked::kill_9_at_random_points_loses_at_most_the_chunk_in_flight_per_kill",
                "--nocapture",
            ])
            .env(CHILD, &spec)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while srv.sent() < point && t.elapsed() < Duration::from_secs(60) {
            if child.try_wait().unwrap().is_some() {
                panic!("the stage child ended before the kill point {point}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let before = srv.sent();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        kills.push(before);
    }
    // The final run, in this process, completes.
    eprintln!(
        "kills at bytes sent: {kills:?}; checkpoint: {:?}",
        std::fs::read_to_string(disk.state_dir.join("download.json"))
    );
    let u = disk.updater(cfg);
    let r = u
        .stage(
            &Release::at(Source::parse(&url)),
            &fast_stage(),
            &NoProgress,
        )
        .unwrap();
    assert!(r.resumed);
    disk.assert_b_is(&rel);
    let sent = srv.sent();
    eprintln!("release {total} bytes, sent {sent} over 5 kills at {kills:?}");
    assert!(
        kills.iter().any(|b| *b > 1 << 20),
        "no kill landed in the download: {kills:?}"
    );
    // A kill loses the chunk in flight and what the kernel still held for the dead client;
    // headers are a few hundred bytes a request. A resume that re-fetched from the start of a
    // file (or of a range) would lose megabytes at the later kills.
    let per_kill =
        u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max) + TestServer::in_flight_bound();
    let bound = total + kills.len() as u64 * per_kill + 64 * 1024;
    assert!(
        sent <= bound,
        "sent {sent} bytes for a {total}-byte release (+{} over the size, bound +{}: the chunk \
         in flight and the socket buffers per kill) with kills at {kills:?}",
        sent as i64 - total as i64,
        bound - total
    );
}
