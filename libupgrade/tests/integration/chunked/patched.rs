//! Patched staging (issue 26) on a real GPT disk image against a real byte-counting HTTP
//! server: slot A runs v1 (its manifest kept as an image builder keeps it), v2 carries
//! per-pair patches from v1 built by `release create --patch-from`'s code. A patched stage
//! writes exactly v2, fetches what its preview said and never writes the running slot; a patch
//! for another base is never chosen; a tampered patch writes nothing and the stage falls back
//! to chunks; a patch whose output does not verify costs only its bad chunks by range; a
//! `kill -9` in the patch's download loses at most what was in flight.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bootconfig::Slot;
use libupgrade::manifest::{Arch, Artifact, Part};
use libupgrade::{NoProgress, Release, Source};
use testkit::*;

/// Payload of v1's rootfs, and v2's: three 40 KB regions rewritten (a "monthly" update).
fn payloads(size: usize) -> (Vec<u8>, Vec<u8>) {
    let p1 = pseudo_random(size, 11);
    let mut p2 = p1.clone();
    for (i, at) in [size / 5, size / 2, size * 4 / 5].into_iter().enumerate() {
        p2[at..at + 40_000].copy_from_slice(&pseudo_random(40_000, 50 + i as u64));
    }
    (p1, p2)
}

/// A kernel of noise with one 30 KB region rewritten (seed 0: the original).
fn kernel(changed: u64) -> Vec<u8> {
    let mut k = pseudo_random(600_000, 101);
    if changed > 0 {
        k[200_000..230_000].copy_from_slice(&pseudo_random(30_000, changed));
    }
    k
}

fn inputs<'a>(version: &'a str, generation: u64, payload: &'a [u8], k: u64) -> ReleaseInputs<'a> {
    ReleaseInputs {
        version,
        generation,
        payload,
        kernel: kernel(k),
        initrd: pseudo_random(400_000, 201),
        arch: Arch::host(),
        images: Vec::new(),
    }
}

/// v1, and v2 with patches from v1; their directories.
fn v1_v2(k: &Keys, out: &Path) -> (PathBuf, PathBuf) {
    let (p1, p2) = payloads(6 << 20);
    let v1 = signed_release(k, out, &inputs("v1", 1, &p1, 0));
    let v2 = signed_release_patched(
        k,
        out,
        &inputs("v2", 2, &p2, 7),
        Vec::new(),
        std::slice::from_ref(&v1),
    );
    (v1, v2)
}

/// Slot A runs `rel`, and the node keeps its manifest (what an image builder does).
fn run_in_a(disk: &TestDisk, rel: &Path) {
    disk.install_in_a(rel);
    let keep = libupgrade::slotfiles::manifest_path(&disk.state_dir, Slot::A);
    std::fs::create_dir_all(keep.parent().unwrap()).unwrap();
    std::fs::copy(rel.join("manifest.json"), keep).unwrap();
}

/// Everything slot A holds: its rootfs partition and its kernel and initrd.
fn slot_a(disk: &TestDisk) -> Vec<u8> {
    let (_, len) = disk.parts["rootfs-a"];
    let mut all = disk.part_bytes("rootfs-a", len);
    for f in ["vmlinuz", "initrd"] {
        all.extend(std::fs::read(disk.boot_dir.join("a").join(f)).unwrap());
    }
    all
}

fn at(srv: &TestServer) -> Release {
    Release::at(Source::parse(&format!("{}v2", srv.base)))
}

#[test]
fn a_patched_stage_writes_v2_fetches_its_preview_and_never_writes_the_running_slot() {
    let disk = TestDisk::new(16 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let (v1, v2) = v1_v2(&k, rels.path());
    let m2 = release_manifest(&v2);
    assert!(
        !m2.files.rootfs.patches.is_empty() && !m2.files.kernel.patches.is_empty(),
        "release create kept the rootfs and kernel patches: {:?}",
        m2.files
    );
    assert!(
        m2.files.initrd.patches.is_empty(),
        "the unchanged initrd costs no chunk: a patch is not smaller"
    );
    run_in_a(&disk, &v1);
    let a_before = slot_a(&disk);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));

    let preview = u.preview(&at(&srv), &fast_stage()).unwrap();
    let by_patch: Vec<_> = preview
        .artifacts
        .iter()
        .filter_map(|c| c.patch_from.as_deref().map(|f| (c.artifact.clone(), f)))
        .collect();
    assert_eq!(
        by_patch,
        vec![
            (Part::Slot(Artifact::Rootfs), "v1"),
            (Part::Slot(Artifact::Kernel), "v1")
        ],
        "{preview:?}"
    );
    let patch_bytes: u64 = [&m2.files.rootfs, &m2.files.kernel]
        .iter()
        .map(|e| e.patches[0].size)
        .sum();
    assert_eq!(preview.fetch(), patch_bytes, "{preview:?}");
    let previewed = srv.sent();

    let r = u.stage(&at(&srv), &fast_stage(), &NoProgress).unwrap();
    disk.assert_b_is(&v2);
    assert_eq!(slot_a(&disk), a_before, "the running slot was written");
    assert_eq!(r.bytes_fetched, preview.fetch(), "{r:?}");
    assert_eq!(r.bytes_fetched + r.bytes_reused, release_size(&v2));
    let patched: Vec<_> = r
        .patched
        .iter()
        .map(|p| (p.artifact.clone(), p.mismatched_chunks, p.fell_back.clone()))
        .collect();
    assert_eq!(
        patched,
        vec![
            (Part::Slot(Artifact::Rootfs), 0, None),
            (Part::Slot(Artifact::Kernel), 0, None)
        ],
        "{r:?}"
    );
    // On the wire: the patches, the metadata (manifest, signature, probes, chunk indexes,
    // the patch headers) and HTTP headers.
    let metadata: u64 = ["manifest.json", "manifest.json.sig"]
        .iter()
        .map(|f| std::fs::metadata(v2.join(f)).unwrap().len())
        .sum::<u64>()
        + Artifact::ALL
            .iter()
            .map(|a| m2.files.get(*a).chunks.as_ref().unwrap().size)
            .sum::<u64>();
    let sent = srv.sent() - previewed;
    assert!(
        sent <= patch_bytes + metadata + 64 * 1024,
        "{sent} bytes on the wire for {patch_bytes} bytes of patches and {metadata} of metadata"
    );
    let d = u.status().unwrap().slots[1].last_decision.clone().unwrap();
    assert!(d.why.contains("rootfs by patch from v1"), "{}", d.why);
    assert!(
        !disk.state_dir.join("patches").exists(),
        "the staging area is emptied once staged"
    );
}

#[test]
fn a_patch_for_another_base_is_never_used() {
    let disk = TestDisk::new(16 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let (_, v2) = v1_v2(&k, rels.path());
    // The node runs another build of v1 (one byte of its payload differs).
    let other = tempfile::tempdir().unwrap();
    let (mut p1, _) = payloads(6 << 20);
    p1[0] ^= 1;
    let v1b = signed_release(&k, other.path(), &inputs("v1", 1, &p1, 3));
    run_in_a(&disk, &v1b);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let preview = u.preview(&at(&srv), &fast_stage()).unwrap();
    assert!(
        preview.artifacts.iter().all(|c| c.patch_from.is_none()),
        "{preview:?}"
    );
    let r = u.stage(&at(&srv), &fast_stage(), &NoProgress).unwrap();
    assert!(r.patched.is_empty(), "{r:?}");
    assert_eq!(r.bytes_fetched, preview.fetch());
    disk.assert_b_is(&v2);
}

#[test]
fn without_a_kept_manifest_the_base_is_proven_by_hashing_the_running_partition() {
    let disk = TestDisk::new(16 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let (v1, v2) = v1_v2(&k, rels.path());
    let m2 = release_manifest(&v2);
    // Slot A runs v1 (its partition larger than the image), no manifest kept.
    disk.install_in_a(&v1);
    assert!(!libupgrade::slotfiles::manifest_path(&disk.state_dir, Slot::A).exists());
    let a_before = slot_a(&disk);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let preview = u.preview(&at(&srv), &fast_stage()).unwrap();
    let patch_bytes: u64 = [&m2.files.rootfs, &m2.files.kernel]
        .iter()
        .map(|e| e.patches[0].size)
        .sum();
    assert_eq!(preview.fetch(), patch_bytes, "{preview:?}");
    let r = u.stage(&at(&srv), &fast_stage(), &NoProgress).unwrap();
    disk.assert_b_is(&v2);
    assert_eq!(slot_a(&disk), a_before, "the running slot was written");
    assert_eq!(r.bytes_fetched, preview.fetch(), "{r:?}");
    let how: Vec<_> = r
        .patched
        .iter()
        .map(|p| {
            (
                p.artifact.clone(),
                p.base_hashed,
                p.mismatched_chunks,
                p.fell_back.is_some(),
            )
        })
        .collect();
    assert_eq!(
        how,
        vec![
            (Part::Slot(Artifact::Rootfs), true, 0, false),
            (Part::Slot(Artifact::Kernel), true, 0, false)
        ],
        "{r:?}"
    );
    // A node running another build of v1 hashes to another base: chunks, as before.
    let disk = TestDisk::new(16 * MIB);
    let other = tempfile::tempdir().unwrap();
    let (mut p1, _) = payloads(6 << 20);
    p1[0] ^= 1;
    let v1b = signed_release(&k, other.path(), &inputs("v1", 1, &p1, 3));
    disk.install_in_a(&v1b);
    let u = disk.updater(disk.config(&k.trust));
    let preview = u.preview(&at(&srv), &fast_stage()).unwrap();
    assert!(
        preview.artifacts.iter().all(|c| c.patch_from.is_none()),
        "{preview:?}"
    );
}

/// Replace patch `n` of artifact `a` in `rel` by `bytes` and sign the manifest again (a
/// publisher's mistake: the signature holds, the bytes are what they are).
fn resign_patch(k: &Keys, rel: &Path, a: Artifact, bytes: &[u8]) {
    let mut m = release_manifest(rel);
    let p = &mut m.files.get_mut(a).patches[0];
    std::fs::write(rel.join(&p.path), bytes).unwrap();
    p.size = bytes.len() as u64;
    p.sha256 = sha256_hex(bytes);
    std::fs::write(rel.join("manifest.json"), m.to_bytes()).unwrap();
    std::fs::write(
        rel.join("manifest.json.sig"),
        libupgrade::signing::sign(&m.to_bytes(), &k.secret).unwrap(),
    )
    .unwrap();
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

#[test]
fn a_tampered_patch_writes_nothing_and_the_stage_falls_back_to_chunks() {
    let disk = TestDisk::new(16 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let (v1, v2) = v1_v2(&k, rels.path());
    // Tampered on the server after signing.
    let m2 = release_manifest(&v2);
    let p = v2.join(&m2.files.rootfs.patches[0].path);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"EVIL", m2.files.rootfs.patches[0].size / 2)
        .unwrap();
    run_in_a(&disk, &v1);
    let a_before = slot_a(&disk);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let r = u.stage(&at(&srv), &fast_stage(), &NoProgress).unwrap();
    disk.assert_b_is(&v2);
    assert_eq!(slot_a(&disk), a_before);
    let rootfs = &r.patched[0];
    assert_eq!(rootfs.artifact, Artifact::Rootfs);
    assert_eq!(
        rootfs.rebuilt, 0,
        "nothing of a patch that does not verify is used"
    );
    let why = rootfs.fell_back.as_deref().unwrap_or_default();
    assert!(
        why.contains("sha256") && why.contains(&m2.files.rootfs.patches[0].sha256),
        "{why}"
    );
    assert!(
        r.patched[1].fell_back.is_none(),
        "the kernel's patch is good: {r:?}"
    );
}

#[test]
fn a_patch_whose_output_does_not_verify_costs_only_its_bad_chunks_by_range() {
    let disk = TestDisk::new(16 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let (v1, v2) = v1_v2(&k, rels.path());
    // A kernel patch built against a v1 that already had v2's new region (so the patch copies
    // that region from the base), labelled as a patch of the node's v1: its output is right
    // everywhere but there.
    let work = tempfile::tempdir().unwrap();
    let fake_base = work.path().join("base");
    std::fs::write(&fake_base, kernel(7)).unwrap();
    let mut built = Vec::new();
    libupgrade::patch::build(
        libupgrade::patch::PatchKind::Plain,
        &fake_base,
        &v2.join("vmlinuz"),
        &mut built,
    )
    .unwrap();
    let mut h = libupgrade::patch::read_header(&mut built.as_slice()).unwrap();
    let rest = &built[h.encoded_len() as usize..];
    let m1 = release_manifest(&v1);
    h.base_sha256 = hex::decode(&m1.files.kernel.sha256)
        .unwrap()
        .try_into()
        .unwrap();
    let mut forged = Vec::new();
    h.write(&mut forged).unwrap();
    forged.extend_from_slice(rest);
    resign_patch(&k, &v2, Artifact::Kernel, &forged);

    run_in_a(&disk, &v1);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let preview = u.preview(&at(&srv), &fast_stage()).unwrap();
    let r = u.stage(&at(&srv), &fast_stage(), &NoProgress).unwrap();
    disk.assert_b_is(&v2);
    let kernel = r
        .patched
        .iter()
        .find(|p| p.artifact == Artifact::Kernel)
        .unwrap();
    assert!(
        (1..=3).contains(&kernel.mismatched_chunks),
        "the 30 KB region touches 1-3 chunks: {kernel:?}"
    );
    assert!(
        kernel.rebuilt >= 500_000,
        "the rest came from the patch: {kernel:?}"
    );
    let max = u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max);
    assert!(
        r.bytes_fetched > preview.fetch() && r.bytes_fetched <= preview.fetch() + 3 * max,
        "fetched {} for a preview of {}: only the bad chunks more",
        r.bytes_fetched,
        preview.fetch()
    );
}

/// Env var that turns this test binary into the stage child of the kill test.
const CHILD: &str = "LIBUPGRADE_PATCHED_CHILD";

#[test]
fn kill_9_in_the_patch_download_resumes_it_and_loses_at_most_what_was_in_flight() {
    if let Ok(spec) = std::env::var(CHILD) {
        let (u, url) = super::child_updater(&spec);
        let r = u.stage(
            &Release::at(Source::parse(&url)),
            &fast_stage(),
            &NoProgress,
        );
        eprintln!("child: {r:?}");
        r.unwrap();
        return;
    }
    let disk = TestDisk::new(16 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let (v1, v2) = v1_v2(&k, rels.path());
    let m2 = release_manifest(&v2);
    let rootfs_patch = m2.files.rootfs.patches[0].size;
    run_in_a(&disk, &v1);
    let a_before = slot_a(&disk);
    // 64 KiB/s: the rootfs patch takes seconds, so the kills land in it.
    let srv = TestServer::paced(rels.path().to_path_buf(), 64 << 10);
    let cfg = disk.config(&k.trust);
    let url = format!("{}v2", srv.base);
    let spec = serde_json::to_string(&(&cfg, &url)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let metadata = 32 * 1024;
    // Kill points: how much of the rootfs patch the staging area holds (what the node has,
    // whatever the sockets still buffer).
    let staged = disk
        .state_dir
        .join("patches")
        .join(format!("{}.patch", m2.files.rootfs.patches[0].sha256));
    let held = || std::fs::metadata(&staged).map_or(0, |m| m.len());
    let mut kills = Vec::new();
    for point in [rootfs_patch / 4, rootfs_patch * 2 / 3] {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "chunked::patched::kill_9_in_the_patch_download_resumes_it_and_loses_at_most_what_was_in_flight",
                "--nocapture",
            ])
            .env(CHILD, &spec)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while held() < point && t.elapsed() < Duration::from_secs(60) {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the child ended before {point}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        kills.push((held(), srv.sent()));
    }
    let held = held();
    assert!(
        held >= rootfs_patch * 2 / 3 && held < rootfs_patch,
        "the staged patch is kept: {held} of {rootfs_patch} bytes"
    );
    let u = disk.updater(cfg);
    let preview = u
        .preview(&Release::at(Source::parse(&url)), &fast_stage())
        .unwrap();
    assert!(preview.resume);
    let r = u
        .stage(
            &Release::at(Source::parse(&url)),
            &fast_stage(),
            &NoProgress,
        )
        .unwrap();
    assert!(r.resumed);
    disk.assert_b_is(&v2);
    assert_eq!(slot_a(&disk), a_before);
    assert_eq!(r.bytes_fetched, preview.fetch(), "{r:?}");
    assert_eq!(
        r.bytes_fetched,
        rootfs_patch - held + m2.files.kernel.patches[0].size,
        "the rest of the staged patch and the kernel's: {r:?}"
    );
    let patches: u64 = [&m2.files.rootfs, &m2.files.kernel]
        .iter()
        .map(|e| e.patches[0].size)
        .sum();
    // Every run reads the metadata again (three runs) and a kill loses what the sockets held.
    let bound = patches + 3 * metadata + 2 * TestServer::in_flight_bound() + 64 * 1024;
    let sent = srv.sent();
    assert!(
        sent <= bound,
        "sent {sent} for {patches} bytes of patches with kills at (staged, sent) {kills:?} (bound {bound})"
    );
}
