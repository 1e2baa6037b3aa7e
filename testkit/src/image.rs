//! Image archives for tests: a plain tar holding a real OCI image layout (`oci-layout`,
//! `index.json`, `blobs/sha256/…`: one manifest, its config and its layers, each at the size
//! and digest its descriptor says), with the reference `name` in the index's
//! `org.opencontainers.image.ref.name` annotation, what `skopeo copy … oci-archive:` writes.
//! The layers are bytes the caller chooses (two archives sharing a layer share its bytes, as
//! two image versions sharing a base layer do), stored uncompressed in the tar, so chunks
//! and plain patches find them.

use libupgrade::payload::image_layout::{
    sha256_digest as digest, Descriptor, ImageIndex, ImageManifest, ANNOTATION_REF_NAME,
    MEDIA_CONFIG, MEDIA_LAYER_TAR, MEDIA_MANIFEST, OCI_LAYOUT,
};

/// The tar bytes of an OCI image layout holding image `name` (`docker.io/library/app:1`)
/// made of `layers`.
pub fn image_archive(name: &str, layers: &[Vec<u8>]) -> Vec<u8> {
    archive(name, layers, false)
}

/// [`image_archive`] without the blob of its last layer (the manifest still lists it): an
/// incomplete archive, as a `docker save` cut short leaves.
pub fn image_archive_missing_layer(name: &str, layers: &[Vec<u8>]) -> Vec<u8> {
    archive(name, layers, true)
}

fn archive(name: &str, layers: &[Vec<u8>], drop_last: bool) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| digest(l)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let manifest = ImageManifest::new(
        Descriptor::of(MEDIA_CONFIG, &config),
        layers
            .iter()
            .map(|l| Descriptor::of(MEDIA_LAYER_TAR, l))
            .collect(),
    );
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let mut entry = Descriptor::of(MEDIA_MANIFEST, &manifest);
    entry
        .annotations
        .insert(ANNOTATION_REF_NAME.to_string(), name.to_string());
    let index = serde_json::to_vec(&ImageIndex::new(vec![entry], None)).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data).unwrap();
    };
    add("oci-layout", OCI_LAYOUT);
    add("index.json", &index);
    let mut blobs: Vec<&[u8]> = vec![&manifest, &config];
    let kept = layers.len() - usize::from(drop_last && !layers.is_empty());
    blobs.extend(layers[..kept].iter().map(Vec::as_slice));
    let mut seen = std::collections::BTreeSet::new();
    for blob in blobs {
        let d = digest(blob);
        if seen.insert(d.clone()) {
            add(&format!("blobs/sha256/{}", &d["sha256:".len()..]), blob);
        }
    }
    b.into_inner().unwrap()
}
