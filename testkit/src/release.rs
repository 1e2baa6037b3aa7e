//! Signing keys and signed test releases built from real squashfs images.

use std::path::{Path, PathBuf};
use std::process::Command;

use libupgrade::manifest::Arch;

use crate::{pseudo_random, run};

/// The artifact files of a release directory, in manifest order.
pub const ARTIFACTS: [&str; 3] = ["rootfs.squashfs", "vmlinuz", "initrd"];

/// The bytes of a release directory's parts together, its payloads included (what a full
/// stage fetches).
pub fn release_size(dir: &Path) -> u64 {
    let m = release_manifest(dir);
    libupgrade::payload::kinds::parts(&m)
        .iter()
        .map(|p| p.entry.size)
        .sum()
}

/// The signed manifest of the release directory `dir`.
pub fn release_manifest(dir: &Path) -> libupgrade::manifest::Manifest {
    let bytes = std::fs::read(dir.join(libupgrade::manifest::MANIFEST_FILE)).unwrap();
    libupgrade::manifest::Manifest::parse(&bytes).unwrap()
}

/// Every payload the release in `rel` names is in the payload store under `state_dir`, byte
/// for byte the release's file; returns how many there are.
pub fn assert_payloads_stored(state_dir: &Path, rel: &Path) -> usize {
    let m = release_manifest(rel);
    for p in &m.payloads {
        let obj = libupgrade::payload::object_path(state_dir, &p.file.sha256);
        let stored = std::fs::read(&obj).unwrap_or_else(|e| panic!("{}: {e}", obj.display()));
        assert!(
            stored == std::fs::read(rel.join(&p.file.path)).unwrap(),
            "payload {}: {} is not the release's file",
            p.name,
            obj.display()
        );
    }
    m.payloads.len()
}

/// A signing key pair and a trust dir holding its public key.
pub struct Keys {
    pub dir: tempfile::TempDir,
    pub secret: PathBuf,
    pub trust: PathBuf,
}

pub fn keys() -> Keys {
    let dir = tempfile::tempdir().unwrap();
    let (secret, public) = libupgrade::signing::generate_keypair(dir.path(), "test").unwrap();
    let trust = dir.path().join("trust.d");
    std::fs::create_dir_all(&trust).unwrap();
    std::fs::copy(&public, trust.join(public.file_name().unwrap())).unwrap();
    Keys { dir, secret, trust }
}

/// What goes into a test release: a squashfs of a release file and `payload` (at
/// /usr/share/payload), the kernel and initrd bytes, and image archives (name, tar bytes:
/// [`crate::image_archive`]) published as the release's payloads ([`ReleaseInputs::image`]).
pub struct ReleaseInputs<'a> {
    pub version: &'a str,
    pub generation: u64,
    pub payload: &'a [u8],
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
    pub arch: Arch,
    pub images: Vec<(String, Vec<u8>)>,
}

impl<'a> ReleaseInputs<'a> {
    /// Release `version` for the host's arch whose rootfs holds `payload`, with a 600 kB
    /// kernel and a 400 kB initrd of noise from `kernel_seed` and `initrd_seed` (the same
    /// seed, the same bytes), and no payloads yet.
    pub fn noise(
        version: &'a str,
        generation: u64,
        payload: &'a [u8],
        kernel_seed: u64,
        initrd_seed: u64,
    ) -> Self {
        ReleaseInputs {
            version,
            generation,
            payload,
            kernel: pseudo_random(600_000, kernel_seed),
            initrd: pseudo_random(400_000, initrd_seed),
            arch: Arch::host(),
            images: Vec::new(),
        }
    }

    /// Release `version` of `generation` for `arch` whose rootfs holds `payload`, with a
    /// kernel (300 kB + the generation) and a 200 kB initrd of noise seeded by the generation:
    /// what [`make_release`] builds, no payloads yet.
    pub fn of_generation(version: &'a str, generation: u64, payload: &'a [u8], arch: Arch) -> Self {
        ReleaseInputs {
            version,
            generation,
            payload,
            kernel: pseudo_random(300_000 + generation as usize, generation + 100),
            initrd: pseudo_random(200_000, generation + 200),
            arch,
            images: Vec::new(),
        }
    }

    /// With an image archive payload `name` holding `tar` (`release create --image`).
    pub fn image(mut self, name: &str, tar: Vec<u8>) -> Self {
        self.images.push((name.to_string(), tar));
        self
    }
}

/// Build a real squashfs (mksquashfs, fixed times: unchanged files give unchanged bytes) and
/// sign it as release `inputs.version` in `out`; the source tree is kept beside it as
/// `<version>.tree` for content comparisons. Returns the release directory.
pub fn signed_release(keys: &Keys, out: &Path, inputs: &ReleaseInputs) -> PathBuf {
    signed_release_with(keys, out, inputs, Vec::new())
}

/// A signed release for the host's arch whose rootfs holds `payload`, with a 600 kB kernel and
/// a 400 kB initrd of noise from `kernel_seed` and `initrd_seed` (the same seed, the same
/// bytes: what two releases share is chosen by their seeds). Returns the release directory.
pub fn noise_release(
    keys: &Keys,
    out: &Path,
    version: &str,
    generation: u64,
    payload: &[u8],
    kernel_seed: u64,
    initrd_seed: u64,
) -> PathBuf {
    signed_release(
        keys,
        out,
        &ReleaseInputs::noise(version, generation, payload, kernel_seed, initrd_seed),
    )
}

/// [`signed_release`] carrying boot `scripts`.
pub fn signed_release_with(
    keys: &Keys,
    out: &Path,
    inputs: &ReleaseInputs,
    scripts: Vec<libupgrade::release::BootScript>,
) -> PathBuf {
    signed_release_patched(keys, out, inputs, scripts, &[])
}

/// [`signed_release_with`] carrying per-pair patches from each release in `patch_from` (as
/// `release create --patch-from` builds them: listed only when smaller than chunks).
pub fn signed_release_patched(
    keys: &Keys,
    out: &Path,
    inputs: &ReleaseInputs,
    scripts: Vec<libupgrade::release::BootScript>,
    patch_from: &[PathBuf],
) -> PathBuf {
    let version = inputs.version;
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::create_dir_all(tree.join("usr/share")).unwrap();
    std::fs::write(
        tree.join("etc/k3os-release"),
        format!("VERSION={version}\nGENERATION={}\n", inputs.generation),
    )
    .unwrap();
    std::fs::write(tree.join("usr/share/payload"), inputs.payload).unwrap();
    let sq = work.path().join("rootfs.squashfs");
    crate::squashfs(&tree, &sq, &["-comp", "gzip"]);
    let kernel = work.path().join("vmlinuz");
    let initrd = work.path().join("initrd");
    std::fs::write(&kernel, &inputs.kernel).unwrap();
    std::fs::write(&initrd, &inputs.initrd).unwrap();
    let payloads = inputs
        .images
        .iter()
        .map(|(name, tar)| {
            let p = work.path().join(format!("{name}.tar"));
            std::fs::write(&p, tar).unwrap();
            libupgrade::release::PayloadInput::image(&format!("{name}={}", p.display()))
        })
        .collect();
    let dir = out.join(version);
    libupgrade::release::create_patched(
        &libupgrade::release::CreateOptions {
            rootfs: sq,
            kernel,
            initrd,
            version: version.to_string(),
            arch: inputs.arch,
            secret_key: keys.secret.clone(),
            out_dir: dir.clone(),
            generation: Some(inputs.generation),
            scripts,
            payloads,
        },
        Some(libupgrade::chunk::ChunkParams::DEFAULT),
        patch_from,
        &libupgrade::NoProgress,
    )
    .expect("release create");
    let keep = out.join(format!("{version}.tree"));
    let _ = std::fs::remove_dir_all(&keep);
    run(Command::new("cp").arg("-a").arg(&tree).arg(&keep));
    dir
}

/// [`signed_release`] with `extra` bytes of incompressible payload and kernel/initrd blobs
/// derived from the generation.
pub fn make_release(
    keys: &Keys,
    out: &Path,
    version: &str,
    generation: u64,
    extra: usize,
    arch: Arch,
) -> PathBuf {
    let payload = pseudo_random(extra, generation);
    signed_release(
        keys,
        out,
        &ReleaseInputs::of_generation(version, generation, &payload, arch),
    )
}
