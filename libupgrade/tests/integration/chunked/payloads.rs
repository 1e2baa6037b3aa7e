//! A release's payloads staged on a real GPT disk image (the GPT layout's node: its slot
//! files on partitions and the boot filesystem, its payloads in the store on the state
//! directory) against the byte-counting server: an unchanged archive costs nothing, a changed
//! one its chunk or patch delta, the stage fetches what the preview said, the running slot's
//! objects are never written, and the status lists both slots' payloads in the store.

use std::path::{Path, PathBuf};

use bootconfig::Slot;
use libupgrade::manifest::{Arch, Part};
use libupgrade::payload::object_path;
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
    // Slot A runs v1; an image builder keeps its manifest and its payloads in the store.
    disk.install_in_a(&v1);
    let keep = libupgrade::slotfiles::manifest_path(&disk.state_dir, Slot::A);
    std::fs::create_dir_all(keep.parent().unwrap()).unwrap();
    std::fs::copy(v1.join("manifest.json"), keep).unwrap();
    for p in &release_manifest(&v1).payloads {
        let obj = object_path(&disk.state_dir, &p.file.sha256);
        std::fs::create_dir_all(obj.parent().unwrap()).unwrap();
        std::fs::copy(v1.join(&p.file.path), obj).unwrap();
    }
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
