//! A release's payloads staged on a real GPT disk image (the GPT layout's node: its slot
//! files on partitions and the boot filesystem, its payloads in the store on the state
//! directory) against the byte-counting server: an unchanged archive costs nothing, a changed
//! one its chunk or patch delta, the stage fetches what the preview said, the running slot's
//! objects are never written, and the status lists both slots' payloads in the store. An
//! object whose bytes are not its name (another archive, random bytes, a short file) is moved
//! to the quarantine, fetched again and reported; a good one is held by its proof, not hashed.

use std::path::{Path, PathBuf};

use bootconfig::Slot;
use libupgrade::manifest::{Arch, Part};
use libupgrade::payload::{object_path, prove, Held};
use libupgrade::{NoProgress, Release, Source};
use testkit::*;

/// Release `version` with a small rootfs and the image archives `images`, patched from `from`.
fn release(
    k: &Keys,
    out: &Path,
    version: &str,
    generation: u64,
    images: &[(&str, Vec<u8>)],
    from: &[PathBuf],
) -> PathBuf {
    let mut inputs = ReleaseInputs {
        version,
        generation,
        payload: b"rootfs",
        kernel: pseudo_random(200_000, 5),
        initrd: pseudo_random(100_000, 6),
        arch: Arch::host(),
        images: Vec::new(),
    };
    for (name, tar) in images {
        inputs = inputs.image(name, tar.clone());
    }
    signed_release_patched(k, out, &inputs, Vec::new(), from)
}

/// Slot A runs `v1`; an image builder keeps its manifest and its payloads in the store (as a
/// store written before proofs: no proof, each object hashed once when first counted).
fn run_v1(disk: &TestDisk, v1: &Path) {
    disk.install_in_a(v1);
    let keep = libupgrade::slotfiles::manifest_path(&disk.state_dir, Slot::A);
    std::fs::create_dir_all(keep.parent().unwrap()).unwrap();
    std::fs::copy(v1.join("manifest.json"), keep).unwrap();
    for p in &release_manifest(v1).payloads {
        let obj = object_path(&disk.state_dir, &p.file.sha256);
        std::fs::create_dir_all(obj.parent().unwrap()).unwrap();
        std::fs::copy(v1.join(&p.file.path), obj).unwrap();
    }
}

#[test]
fn a_gpt_node_stages_the_payloads_into_its_store_for_their_delta_and_keeps_the_running_ones() {
    let disk = TestDisk::new(16 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let base = pseudo_random(700_000, 21);
    let app = pseudo_random(500_000, 22);
    let mut app2 = app.clone();
    app2[100_000..110_000].copy_from_slice(&pseudo_random(10_000, 23));
    let k3s = image_archive(
        "docker.io/rancher/mirrored-coredns:1.10",
        std::slice::from_ref(&base),
    );
    let v1 = release(
        &k,
        rels.path(),
        "v1",
        1,
        &[
            ("k3s", k3s.clone()),
            ("app", image_archive("site/app:1", &[app])),
        ],
        &[],
    );
    let v2 = release(
        &k,
        rels.path(),
        "v2",
        2,
        &[("k3s", k3s), ("app", image_archive("site/app:2", &[app2]))],
        std::slice::from_ref(&v1),
    );
    run_v1(&disk, &v1);
    let running: Vec<(PathBuf, Vec<u8>)> = release_manifest(&v1)
        .payloads
        .iter()
        .map(|p| {
            let o = object_path(&disk.state_dir, &p.file.sha256);
            let b = std::fs::read(&o).unwrap();
            (o, b)
        })
        .collect();

    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let u = disk.updater(disk.config(&k.trust));
    let rel = Release::at(Source::parse(&format!("{}v2", srv.base)));
    let preview = u.preview(&rel, &fast_stage()).unwrap();
    let cost = |name: &str| {
        preview
            .artifacts
            .iter()
            .find(|c| c.artifact == Part::Payload(name.into()))
            .unwrap_or_else(|| panic!("no {name} in {preview:?}"))
            .clone()
    };
    assert_eq!(cost("k3s").fetch, 0, "held: {preview:?}");
    let app_cost = cost("app");
    assert!(
        app_cost.fetch > 0 && app_cost.fetch < app_cost.size / 10,
        "{app_cost:?}"
    );
    let before = srv.sent();
    let r = u.stage(&rel, &fast_stage(), &NoProgress).unwrap();
    assert_eq!(r.bytes_fetched, preview.fetch(), "{r:?}");
    assert!(srv.sent() - before >= r.bytes_fetched);
    disk.assert_b_is(&v2);
    assert_eq!(assert_payloads_stored(&disk.state_dir, &v2), 2);
    for (o, b) in &running {
        assert_eq!(&std::fs::read(o).unwrap(), b, "{} was written", o.display());
    }
    let st = u.status().unwrap();
    for s in &st.slots {
        assert_eq!(s.payloads.len(), 2, "{s:?}");
        assert!(s.payloads.iter().all(|p| p.in_store), "{s:?}");
    }
    assert_eq!(st.slots[1].payloads[1].name, "app");
}

/// The inode and ctime of `p` (a rewrite of a proof replaces its file).
fn identity(p: &Path) -> (u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.ino(), m.ctime(), m.ctime_nsec())
}

#[test]
fn an_object_that_is_not_its_name_is_quarantined_fetched_again_and_reported() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let k3s = image_archive(
        "docker.io/rancher/mirrored-coredns:1.10",
        &[pseudo_random(300_000, 31)],
    );
    let app1 = image_archive("site/app:1", &[pseudo_random(200_000, 32)]);
    let app2 = image_archive("site/app:2", &[pseudo_random(200_000, 33)]);
    assert_eq!(
        app1.len(),
        app2.len(),
        "the planted archive must pass the size check"
    );
    let v1 = release(
        &k,
        rels.path(),
        "v1",
        1,
        &[("k3s", k3s.clone()), ("app", app1.clone())],
        &[],
    );
    let v2 = release(
        &k,
        rels.path(),
        "v2",
        2,
        &[("k3s", k3s), ("app", app2.clone())],
        &[],
    );
    let m2 = release_manifest(&v2);
    let (k3s_sha, app_sha) = (
        m2.payloads[0].file.sha256.clone(),
        m2.payloads[1].file.sha256.clone(),
    );
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let plants = [
        ("another release's valid archive", app1),
        ("random bytes", pseudo_random(app2.len(), 34)),
        ("a truncated copy", app2[..app2.len() / 2].to_vec()),
    ];
    let plants_first = plants[0].0;
    for (case, planted) in plants {
        let disk = TestDisk::new(16 * MIB);
        run_v1(&disk, &v1);
        let obj = object_path(&disk.state_dir, &app_sha);
        std::fs::write(&obj, &planted).unwrap();
        let u = disk.updater(disk.config(&k.trust));
        let rel = Release::at(Source::parse(&format!("{}v2", srv.base)));

        let k3s_proof = disk.state_dir.join("payloads/proofs").join(&k3s_sha);
        // The first case previews: the planted object is not counted, the whole archive is
        // to be fetched, and v1's shared archive is proven by hashing it once (no proof yet).
        // The others go straight to the stage, which asks the same proof.
        let previewed = (case == plants_first).then(|| {
            let preview = u.preview(&rel, &fast_stage()).unwrap();
            let fetch = |name: &str| {
                preview
                    .artifacts
                    .iter()
                    .find(|c| c.artifact == Part::Payload(name.into()))
                    .unwrap_or_else(|| panic!("{case}: no {name} in {preview:?}"))
                    .fetch
            };
            assert_eq!(fetch("app"), app2.len() as u64, "{case}: {preview:?}");
            assert_eq!(fetch("k3s"), 0, "{case}: {preview:?}");
            (identity(&k3s_proof), preview.fetch())
        });
        let r = u.stage(&rel, &fast_stage(), &NoProgress).unwrap();
        // The whole archive fetched again (beside a few chunks of the slot files), not k3s.
        let (app_len, k3s_len) = (app2.len() as u64, m2.payloads[0].file.size);
        assert!(
            r.bytes_fetched >= app_len && r.bytes_fetched < app_len + k3s_len / 2,
            "{case}: {r:?}"
        );
        disk.assert_b_is(&v2);
        assert_eq!(assert_payloads_stored(&disk.state_dir, &v2), 2, "{case}");
        // Held by its proof: the stage did not hash it again (a hash rewrites the proof).
        if let Some((proven, fetch)) = previewed {
            assert_eq!(identity(&k3s_proof), proven, "{case}: k3s was hashed again");
            assert_eq!(r.bytes_fetched, fetch, "{case}: {r:?}");
        }
        assert_eq!(
            prove(&disk.state_dir, &k3s_sha, m2.payloads[0].file.size),
            Held::Proven { hashed: false },
            "{case}"
        );
        // The stage proved what it wrote.
        assert_eq!(
            prove(&disk.state_dir, &app_sha, app2.len() as u64),
            Held::Proven { hashed: false },
            "{case}"
        );
        // The planted bytes are in the quarantine, and the status says so.
        let st = u.status().unwrap();
        assert_eq!(st.quarantined.len(), 1, "{case}: {:?}", st.quarantined);
        let q = &st.quarantined[0];
        assert!(q.file.starts_with(&app_sha), "{case}: {q:?}");
        let moved = libupgrade::payload::quarantine_dir(&disk.state_dir).join(&q.file);
        assert!(std::fs::read(&moved).unwrap() == planted, "{case}: {q:?}");
        assert!(
            st.slots[1].payloads.iter().all(|p| p.in_store),
            "{case}: {st:?}"
        );
    }
}
