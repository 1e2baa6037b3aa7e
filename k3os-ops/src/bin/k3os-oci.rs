//! `k3os-oci`: writes the k3os-ops agent's container image as an OCI image archive, without a
//! container daemon or image builder.
//!
//! The image is one layer holding the static musl `k3os-ops` binary at `/usr/bin/k3os-ops`
//! (plus `/tmp`), entrypoint `k3os-ops agent`, one image per architecture under an OCI image
//! index (multi-arch). The archive is a tar of an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`); `index.json` names the index with `org.opencontainers.image.ref.name`
//! and `io.containerd.image.name` set to the full reference, which `skopeo` (oci-archive:) and
//! containerd's `ctr images import` (k3s) both use.
//!
//! `--layer-compression none` writes the layer as a plain tar (`…layer.v1.tar`): what a release
//! should carry as an image-archive payload, because a gzipped layer changes as a whole when
//! one byte of it does, so a node's chunks and patches reuse nothing of its previous copy
//! (`just bench-delta` measures both).
//!
//! Written here rather than with umoci/buildah: the layout is four JSON documents and a
//! gzipped tar (the `tar` and `flate2` crates), umoci cannot build a multi-platform index, and
//! our own code keeps the output reproducible (fixed mtimes, owners and order), so the same
//! binaries give the same digests.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use libupgrade::payload::image_layout::{
    sha256_digest, Descriptor, ImageIndex, ImageManifest, LayoutBlobs, Platform, MEDIA_CONFIG,
    MEDIA_INDEX, MEDIA_LAYER_GZIP, MEDIA_LAYER_TAR, MEDIA_MANIFEST, OCI_LAYOUT,
};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Write the k3os-ops agent image (OCI image index) as an OCI archive")]
struct Args {
    /// Output archive, e.g. target/oci/k3os-ops.oci.tar.
    #[arg(long)]
    out: PathBuf,
    /// Image reference recorded in the archive, e.g. docker.io/library/k3os-ops:0.2.0.
    #[arg(long = "ref")]
    reference: String,
    /// ARCH=PATH of a static k3os-ops binary, ARCH an OCI architecture (amd64, arm64).
    /// Repeat for each platform.
    #[arg(long = "binary", required = true)]
    binaries: Vec<String>,
    /// How the layer is stored: gzip (what a registry serves) or none (a plain tar, which
    /// chunks and patches reuse from one release to the next).
    #[arg(long, value_enum, default_value = "gzip")]
    layer_compression: LayerCompression,
}

/// How the layer blob is stored.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LayerCompression {
    Gzip,
    None,
}

fn header(path: &str, mode: u32, size: u64, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_path(path).expect("short path");
    h.set_mode(mode);
    h.set_size(size);
    h.set_entry_type(kind);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_cksum();
    h
}

/// The root filesystem layer: (uncompressed tar, gzip of it).
fn layer(binary: &Path) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let bin = std::fs::read(binary).with_context(|| format!("read {}", binary.display()))?;
    let mut b = tar::Builder::new(Vec::new());
    for dir in ["usr/", "usr/bin/"] {
        b.append(&header(dir, 0o755, 0, tar::EntryType::Directory), &[][..])?;
    }
    b.append(
        &header("tmp/", 0o1777, 0, tar::EntryType::Directory),
        &[][..],
    )?;
    b.append(
        &header(
            "usr/bin/k3os-ops",
            0o755,
            bin.len() as u64,
            tar::EntryType::Regular,
        ),
        &bin[..],
    )?;
    let raw = b.into_inner()?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)?;
    Ok((raw, gz.finish()?))
}

/// One platform's image: its layer (the binary at `binary`), config and manifest as blobs;
/// returns the manifest's descriptor with its platform.
fn platform(
    blobs: &mut LayoutBlobs,
    arch: &str,
    binary: &Path,
    compression: LayerCompression,
) -> anyhow::Result<Descriptor> {
    let (raw, gz) = layer(binary)?;
    let diff_id = sha256_digest(&raw);
    let layer = match compression {
        LayerCompression::Gzip => blobs.add(MEDIA_LAYER_GZIP, gz),
        LayerCompression::None => blobs.add(MEDIA_LAYER_TAR, raw),
    };
    let config = json!({
        "created": "1970-01-01T00:00:00Z",
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": ["/usr/bin/k3os-ops"],
            "Cmd": ["agent"],
            "Env": ["PATH=/usr/bin"],
            "Labels": {"org.opencontainers.image.title": "k3os-ops agent"},
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "k3os-oci: static musl k3os-ops"}],
    });
    let config = blobs.add_json(MEDIA_CONFIG, &config);
    let manifest = ImageManifest::new(config, vec![layer]);
    let mut d = blobs.add_json(MEDIA_MANIFEST, &manifest);
    d.platform = Some(Platform {
        architecture: arch.to_string(),
        os: "linux".to_string(),
    });
    Ok(d)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut blobs = LayoutBlobs::default();
    let mut manifests = Vec::new();
    for spec in &args.binaries {
        let Some((arch, path)) = spec.split_once('=') else {
            bail!("--binary {spec}: expected ARCH=PATH, e.g. amd64=target/x86_64-unknown-linux-musl/release/k3os-ops");
        };
        if !["amd64", "arm64"].contains(&arch) {
            bail!("--binary {spec}: architecture {arch} is not amd64 or arm64");
        }
        manifests.push(platform(
            &mut blobs,
            arch,
            Path::new(path),
            args.layer_compression,
        )?);
    }
    let index = ImageIndex::new(manifests, Some(MEDIA_INDEX));
    let top = blobs.add_json(MEDIA_INDEX, &index).named(&args.reference);
    let layout_index = ImageIndex::new(vec![top.clone()], Some(MEDIA_INDEX));

    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let tmp = args.out.with_extension("tmp");
    let file = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut t = tar::Builder::new(std::io::BufWriter::new(file));
    let file_header =
        |path: &str, data: &[u8]| header(path, 0o644, data.len() as u64, tar::EntryType::Regular);
    t.append(&file_header("oci-layout", OCI_LAYOUT), OCI_LAYOUT)?;
    for dir in ["blobs/", "blobs/sha256/"] {
        t.append(&header(dir, 0o755, 0, tar::EntryType::Directory), &[][..])?;
    }
    let index = serde_json::to_vec(&layout_index).expect("json");
    t.append(&file_header("index.json", &index), &index[..])?;
    for (path, data) in blobs.files() {
        t.append(&file_header(&path, data), data)?;
    }
    t.into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    std::fs::rename(&tmp, &args.out)
        .with_context(|| format!("rename {} to {}", tmp.display(), args.out.display()))?;
    println!(
        "{}: {} ({} platform(s), index {})",
        args.out.display(),
        args.reference,
        args.binaries.len(),
        top.digest
    );
    Ok(())
}
