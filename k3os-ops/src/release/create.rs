//! `k3os-ops release create`: arguments mapped onto `libupgrade::release::create_with`, and
//! what was written printed per file.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use libupgrade::manifest::Arch;
use libupgrade::release;

use super::Bar;

/// `release create` arguments.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The root filesystem, a squashfs image.
    #[arg(long)]
    rootfs: PathBuf,
    /// The kernel image (becomes vmlinuz).
    #[arg(long)]
    kernel: PathBuf,
    /// The initramfs (becomes initrd).
    #[arg(long)]
    initrd: PathBuf,
    /// The release's version, a plain name: 1-128 bytes, an ASCII letter or digit, then
    /// letters, digits, `.` `_` `+` `~` `-`, without `..` (e.g. `v1.2.0`, `v2-rc.1`).
    #[arg(long)]
    version: String,
    /// x86_64 (amd64) or aarch64 (arm64).
    #[arg(long)]
    arch: Arch,
    /// Secret key file made by `release keygen`.
    #[arg(long)]
    key: PathBuf,
    /// Release directory to write (created; must not already hold a release).
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
    /// Monotonic release number nodes compare to refuse downgrades. Required unless -o is a subdirectory of a channel (a directory holding index.json).
    #[arg(long)]
    generation: Option<u64>,
    /// Average chunk size of the chunk indexes (KiB; min = avg/4, max = avg×4). Nodes fetch
    /// only the chunks they lack; 32 KiB measured best on Debian squashfs images.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    chunk_avg_kib: u32,
    /// Write no chunk indexes: nodes download whole files (releases of earlier versions).
    #[arg(long, conflicts_with = "chunk_avg_kib")]
    no_chunks: bool,
    /// Boot config (see `k3os-ops bootloader`): the release carries the GRUB and syslinux
    /// scripts rendered from it, and a node installs its loader's script when it activates
    /// the release (when both of its slots read that script's version).
    #[arg(long)]
    boot_config: Option<PathBuf>,
    /// An earlier release (its directory or manifest.json) to build per-pair patches from,
    /// repeatable (N-1, N-2, …): one per artifact (squashfs-aware for the rootfs, plain for
    /// the kernel and initrd), listed in the signed manifest only when smaller than what a
    /// node running that release fetches by chunks. Nodes running any other release, and
    /// v0.1.0 nodes, ignore them. Prints each patch's size and build time.
    #[arg(long, value_name = "RELEASE")]
    patch_from: Vec<PathBuf>,
    /// A container image archive to stage with the slot (repeatable): a plain tar, OCI image
    /// layout or `docker save` (k3s's `k3s-airgap-images-<arch>.tar`), named by its file
    /// name without the extension, or `NAME=FILE`. Nodes keep it in their payload store and
    /// k3s finds it before it starts; it gets a chunk index and, with --patch-from, a plain
    /// patch from the earlier release's archive of the same name. Older nodes ignore it.
    #[arg(long = "image", value_name = "[NAME=]FILE")]
    images: Vec<String>,
    /// Record the rootfs's dm-verity root hash, salt and geometry in the signed manifest
    /// (`veritysetup format`, Debian's cryptsetup-bin, with FEC). Nothing more is published:
    /// nodes compute the tree and FEC data after writing the rootfs and refuse the slot unless
    /// they hash to what is signed. The rootfs must be whole 4 KiB blocks (mksquashfs's
    /// default padding). Nodes of earlier versions ignore the field.
    #[arg(long)]
    verity: bool,
    /// Reed-Solomon parity bytes per 253 bytes of rootfs and tree (2..=24; 2 corrects one
    /// damaged 4 KiB block in each FEC round and adds 0.8 %).
    #[arg(long, requires = "verity", default_value_t = libupgrade::release::DEFAULT_FEC_ROOTS,
        value_parser = clap::value_parser!(u32).range(2..=24))]
    fec_roots: u32,
    /// Publish the rootfs's bytes as given. By default a zstd squashfs whose blocks another
    /// libzstd made is re-packed with the nodes' zstd (same files, other bytes) so that
    /// squashfs patches to it rebuild every block on the node; use this when the image's
    /// exact bytes are pinned elsewhere (a hash computed by the build).
    #[arg(long)]
    keep_rootfs: bool,
}

/// Create, sign and print the release.
pub fn run(a: CreateArgs) -> anyhow::Result<()> {
    let CreateArgs {
        rootfs,
        kernel,
        initrd,
        version,
        arch,
        key,
        out,
        generation,
        chunk_avg_kib,
        no_chunks,
        boot_config,
        patch_from,
        images,
        verity,
        fec_roots,
        keep_rootfs,
    } = a;
    // Before anything is read or written (the value is printed once, escaped, by the error).
    libupgrade::version::check_version(&version).context("release create --version")?;
    let scripts = match &boot_config {
        Some(p) => crate::bootloader::BootConfig::load(p)?.scripts(),
        None => Vec::new(),
    };
    let chunking =
        (!no_chunks).then(|| libupgrade::chunk::ChunkParams::with_avg(chunk_avg_kib << 10));
    // The key before a re-pack of minutes (create checks everything else again); `_scratch`
    // lives until the release is written: a re-packed image is what gets signed.
    libupgrade::signing::load_secret_key(&key).context("release create --key")?;
    let (rootfs, _scratch) = published_rootfs(rootfs, &out, keep_rootfs)?;
    let opts = release::CreateOptions {
        rootfs,
        kernel,
        initrd,
        version,
        arch,
        secret_key: key,
        out_dir: out.clone(),
        generation,
        scripts,
        payloads: images
            .iter()
            .map(|s| release::PayloadInput::image(s))
            .collect(),
    };
    let bar = Bar::new();
    let verity = verity.then_some(release::VerityOptions { fec_roots });
    let (m, patches) = release::create_with_verity(&opts, chunking, &patch_from, verity, &bar)
        .with_context(|| format!("creating release in {}", out.display()))?;
    print_created(&m, &out);
    print_patches(&patches);
    Ok(())
}

/// What `release create` wrote: each file of the release with its size and digest.
fn print_created(m: &libupgrade::manifest::Manifest, out: &Path) {
    println!(
        "created release {} ({}, generation {}) in {}",
        m.version,
        m.arch,
        m.generation,
        out.display()
    );
    for a in libupgrade::manifest::Artifact::ALL {
        let f = m.files.get(a);
        println!("  {:<16} {:>12} bytes  sha256 {}", f.path, f.size, f.sha256);
        if let Some(c) = &f.chunks {
            println!("  {:<16} {:>12} bytes  (chunk index)", c.path, c.size);
        }
    }
    for p in &m.payloads {
        let f = &p.file;
        println!(
            "  {:<16} {:>12} bytes  sha256 {}  ({} {}, {} image(s))",
            f.path,
            f.size,
            f.sha256,
            p.kind,
            p.name,
            p.images.len()
        );
        if let Some(c) = &f.chunks {
            println!("  {:<16} {:>12} bytes  (chunk index)", c.path, c.size);
        }
    }
    for sc in m.boot.iter().flat_map(|b| &b.scripts) {
        println!(
            "  {:<16} {:>12} bytes  ({} version {})",
            sc.path, sc.size, sc.kind, sc.version
        );
    }
    if let Some(v) = &m.verity {
        println!(
            "  dm-verity        root {} (tree {} bytes, FEC {} bytes with {} roots; computed by nodes, not published)",
            v.root_hash, v.hash_size, v.fec_size, v.fec_roots
        );
    }
}

/// The rootfs to publish: with `keep`, `rootfs`; else `rootfs` re-packed into a scratch file
/// near `out` when its blocks are another zstd's (see `libupgrade::patch::repack`), else
/// `rootfs`; says which and why. The scratch file is deleted when the returned handle drops.
fn published_rootfs(
    rootfs: PathBuf,
    out: &Path,
    keep: bool,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempPath>)> {
    use libupgrade::patch::Rootfs;
    if keep {
        return Ok((rootfs, None));
    }
    // Beside the release (same filesystem, not a tmpfs), in the nearest directory that exists:
    // create makes `out` and its parents only after its own checks.
    let dir = out
        .ancestors()
        .skip(1)
        .find(|d| d.is_dir())
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let scratch = tempfile::Builder::new()
        .prefix(".rootfs-repacked-")
        .tempfile_in(dir)
        .context("release create: a scratch file for the re-packed rootfs")?
        .into_temp_path();
    let zstd = libupgrade::patch::zstd_version();
    Ok(match libupgrade::patch::for_release(&rootfs, &scratch)? {
        Rootfs::Repacked(st) => {
            println!(
                "rootfs re-packed with the nodes' zstd {zstd} (level {}): {} of {} blocks were made by another compressor; {} bytes published instead of {} (the same files), in {:.1} s",
                st.level, st.changed, st.blocks, st.size_out, st.size_in, st.time.as_secs_f64()
            );
            (scratch.to_path_buf(), Some(scratch))
        }
        Rootfs::Unchanged(_) => (rootfs, None),
        Rootfs::NotRepacked(why) => {
            println!(
                "rootfs published as given, not re-packed: {}",
                why.escape_debug()
            );
            (rootfs, None)
        }
    })
}

/// One line per patch `release create` built (kept or dropped), and why one is large.
fn print_patches(patches: &[release::PatchBuilt]) {
    for p in patches {
        println!(
            "  patch {} from {} ({}): {} bytes, by chunks {} bytes, built in {:.1} s: {}{}",
            p.artifact,
            p.from.escape_debug(),
            p.kind,
            p.size,
            p.chunk_fetch,
            p.took.as_secs_f64(),
            match &p.path {
                Some(name) => format!("listed as {name}"),
                None => "not smaller than chunks, dropped".into(),
            },
            match &p.note {
                Some(why) => format!(" (squashfs kind not used: {})", why.escape_debug()),
                None => String::new(),
            }
        );
        let (recompressed, verbatim) = p.blocks;
        if verbatim > 0 {
            println!(
                "    {verbatim} of {} changed blocks do not recompress identically with the nodes' zstd {} and are carried whole: the image was made by another compressor and kept as given (--keep-rootfs, or a layout the re-pack refused)",
                recompressed + verbatim,
                libupgrade::patch::zstd_version()
            );
        }
    }
}
