//! The test releases' image archive: one OCI image layout (a plain tar, what a release
//! carries as an `image-archive` payload and k3s imports from its airgap directory), written
//! here byte-reproducibly, no registry or container tool involved.
//!
//! It holds two images, each one layer (a real tar holding one file of deterministic bytes):
//! - `k3os.test/pause:3.6`, the same in every release (a store object shared by both slots'
//!   archives is still one archive per release; its blobs are what chunks reuse);
//! - `k3os.test/site-app:g<generation>`, whose layer has one block of 16 of
//!   its own per generation (2 of 16 differ from the previous generation's
//!   layer: a monthly update of a site's workload; chunks and patches fetch about that much).

use std::path::Path;

use libupgrade::payload::image_layout::{
    sha256_digest, Descriptor, ImageIndex, ImageManifest, LayoutBlobs, MEDIA_CONFIG,
    MEDIA_LAYER_TAR, MEDIA_MANIFEST, OCI_LAYOUT,
};
use serde_json::{json, Value};

use crate::error::{IoContext, Result};

/// The archive's payload name in the release (`release create --image NAME=FILE`).
pub const PAYLOAD_NAME: &str = "site-images";
/// Bytes of each layer's one file.
const LAYER_FILE: usize = 1 << 20;
const BLOCK: usize = LAYER_FILE / 16;

/// The images the archive of `generation` holds, as the manifest lists them.
pub fn images(generation: u64) -> Vec<String> {
    vec![
        "k3os.test/pause:3.6".to_string(),
        format!("k3os.test/site-app:g{generation}"),
    ]
}

/// Deterministic bytes: block `i` of stream `seed` (xorshift64*).
fn block(seed: u64, i: u64) -> Vec<u8> {
    let mut x =
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i + 1).wrapping_mul(0xd1b5_4a32_d192_ed03);
    let mut out = Vec::with_capacity(BLOCK);
    while out.len() < BLOCK {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out
}

fn tar_of(entries: &[(&str, &[u8])]) -> Result<Vec<u8>> {
    let with_modes: Vec<(&str, &[u8], u32)> =
        entries.iter().map(|(p, d)| (*p, *d, 0o644)).collect();
    tar_with_modes(&with_modes)
}

/// A tar of `(path, bytes, mode)` entries, every time and owner 0.
fn tar_with_modes(entries: &[(&str, &[u8], u32)]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_path(path).ctx("tar path", Path::new(path))?;
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        h.set_cksum();
        b.append(&h, *data).ctx("tar append", Path::new(path))?;
    }
    b.into_inner().ctx("tar finish", Path::new("(memory)"))
}

/// One image: its layer holds `data` at `/data`; returns the manifest's descriptor.
fn image(blobs: &mut LayoutBlobs, data: &[u8], name: &str) -> Result<Descriptor> {
    let layer = tar_of(&[("data", data)])?;
    let config = json!({
        "created": "1970-01-01T00:00:00Z", "architecture": "amd64", "os": "linux",
    });
    image_of_layer(blobs, layer, config, name)
}

/// One image of one `layer` and the image `config` (without its `rootfs`, added here);
/// returns the manifest's descriptor, named `name`.
fn image_of_layer(
    blobs: &mut LayoutBlobs,
    layer: Vec<u8>,
    mut config: Value,
    name: &str,
) -> Result<Descriptor> {
    let diff_id = sha256_digest(&layer);
    let layer = blobs.add(MEDIA_LAYER_TAR, layer);
    config["rootfs"] = json!({"type": "layers", "diff_ids": [diff_id]});
    let config = blobs.add_json(MEDIA_CONFIG, &config);
    let manifest = ImageManifest::new(config, vec![layer]);
    Ok(blobs.add_json(MEDIA_MANIFEST, &manifest).named(name))
}

/// Write the archive of `generation` to `out` (the same bytes every time).
pub fn write_archive(generation: u64, out: &Path) -> Result<()> {
    let mut blobs = LayoutBlobs::default();
    let names = images(generation);
    let pause: Vec<u8> = (0..16).flat_map(|i| block(1, i)).collect();
    let changed = generation % 16;
    let app: Vec<u8> = (0..16)
        .flat_map(|i| {
            block(
                if i == changed {
                    2 + 1000 * generation
                } else {
                    2
                },
                i,
            )
        })
        .collect();
    let manifests = vec![
        image(&mut blobs, &pause, &names[0])?,
        image(&mut blobs, &app, &names[1])?,
    ];
    write_layout(blobs, manifests, out)
}

/// Write the OCI image layout tar of `blobs` with an index of `manifests` to `out`.
fn write_layout(blobs: LayoutBlobs, manifests: Vec<Descriptor>, out: &Path) -> Result<()> {
    let index = serde_json::to_vec(&ImageIndex::new(manifests, None)).expect("json");
    let files: Vec<(String, &[u8])> = blobs.files().collect();
    let mut refs: Vec<(&str, &[u8])> = vec![("oci-layout", OCI_LAYOUT), ("index.json", &index)];
    refs.extend(files.iter().map(|(p, d)| (p.as_str(), *d)));
    let bytes = tar_of(&refs)?;
    std::fs::write(out, bytes).ctx("write image archive", out)
}

/// The sandbox ("pause") image of the Kubernetes node variant, containerd's `sandbox_image`.
pub const KUBE_PAUSE_IMAGE: &str = "k3os.test/pause:busybox";

/// The images the archive of a `-kube` release of `generation` holds: the pause image and the
/// site's workload, both runnable (busybox-static as their one binary).
pub fn kube_images(generation: u64) -> Vec<String> {
    vec![
        KUBE_PAUSE_IMAGE.to_string(),
        format!("k3os.test/site-app:g{generation}-kube"),
    ]
}

/// Write the archive of a `-kube` release of `generation` to `out`: [`kube_images`], each one
/// layer holding the static `busybox` at `/bin/busybox` (and the site app a
/// `/etc/site-app` naming its generation). The pause image sleeps as PID 1 (the sandbox only
/// has to hold the namespaces); the site app prints its generation and sleeps. `arch` is the
/// OCI architecture (`amd64`, `arm64`).
pub fn write_kube_archive(generation: u64, busybox: &Path, arch: &str, out: &Path) -> Result<()> {
    let bb = std::fs::read(busybox).ctx("read", busybox)?;
    let names = kube_images(generation);
    let mut blobs = LayoutBlobs::default();
    let config = |cmd: Value| {
        json!({
            "created": "1970-01-01T00:00:00Z", "architecture": arch, "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/busybox"], "Cmd": cmd},
        })
    };
    let pause = tar_with_modes(&[("bin/busybox", &bb, 0o755)])?;
    let marker = format!("site-app g{generation}\n");
    let app = tar_with_modes(&[
        ("bin/busybox", &bb, 0o755),
        ("etc/site-app", marker.as_bytes(), 0o644),
    ])?;
    let manifests = vec![
        image_of_layer(
            &mut blobs,
            pause,
            config(json!(["sleep", "2147483647"])),
            &names[0],
        )?,
        image_of_layer(
            &mut blobs,
            app,
            config(json!([
                "sh",
                "-c",
                "cat /etc/site-app; exec sleep 2147483647"
            ])),
            &names[1],
        )?,
    ];
    write_layout(blobs, manifests, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_reproducible_and_names_its_images() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
        write_archive(1, &a).unwrap();
        write_archive(1, &b).unwrap();
        write_archive(2, &c).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(libupgrade::payload::archive_images(&a).unwrap(), images(1));
        assert_eq!(libupgrade::payload::archive_images(&c).unwrap(), images(2));
        assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());

        // A real OCI tool reads every image of it (skopeo: installed by scripts/setup.sh).
        for name in images(2) {
            skopeo_inspect(&c, &name, &[]);
        }
    }

    /// The kube variant's archive names its runnable images, each with an entrypoint, and a
    /// real OCI tool reads them.
    #[test]
    fn the_kube_archive_holds_runnable_images() {
        let d = tempfile::tempdir().unwrap();
        let bb = d.path().join("busybox");
        std::fs::write(&bb, b"\x7fELF not really").unwrap();
        let a = d.path().join("kube.tar");
        write_kube_archive(3, &bb, "amd64", &a).unwrap();
        assert_eq!(
            libupgrade::payload::archive_images(&a).unwrap(),
            kube_images(3)
        );
        assert_eq!(kube_images(3)[0], KUBE_PAUSE_IMAGE);
        for name in kube_images(3) {
            let cfg: Value =
                serde_json::from_slice(&skopeo_inspect(&a, &name, &["--config"])).unwrap();
            assert_eq!(
                cfg["config"]["Entrypoint"],
                json!(["/bin/busybox"]),
                "{name}"
            );
            assert_eq!(cfg["architecture"], "amd64");
        }
    }

    /// `skopeo inspect [ARGS] oci-archive:ARCHIVE:NAME`, which must succeed; its output.
    fn skopeo_inspect(archive: &std::path::Path, name: &str, args: &[&str]) -> Vec<u8> {
        let out = std::process::Command::new("skopeo")
            .arg("inspect")
            .args(args)
            .arg(format!("oci-archive:{}:{name}", archive.display()))
            .output()
            .expect("skopeo runs");
        assert!(
            out.status.success(),
            "skopeo inspect {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}
