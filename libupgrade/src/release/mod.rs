//! Creating a release directory: copy the three artifacts and any payloads (`payloads`), hash
//! them, write and sign the manifest.
//!
//! This module owns the publisher side of a release: `create` streams each input file once
//! (read → sha256 → write, 1 MiB at a time, so a multi-GiB rootfs never sits in memory),
//! writes every output under a temporary name and renames it into place after fsync, writes
//! `manifest.json` and its signature last, all in a staging directory beside the output that
//! is moved into place only once the release is complete (`staging`: a refusal at any step
//! leaves the output directory as it was), and — when the output directory sits inside a
//! channel (its parent holds `index.json`) — picks the generation and rebuilds the channel
//! index. A half-written release therefore never appears in a channel's index.
//!
//! Each artifact also gets a chunk index (`<file>.chunks`, see [`crate::chunk`]), cut in the same
//! single pass as the copy and the hash, and referenced with its sha256 from the signed manifest:
//! nodes fetch only the chunks they lack with HTTP `Range` requests against the plain files.
//!
//! Files: this one (options, errors, `create` in its steps), `copy` (the copy-hash-chunk pass
//! and atomic writes), `staging` (the directory a release is built in), `verify` (`verify_dir`, what `release verify` runs), `tests`.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::channel::{self, ChannelError};
use crate::chunk::ChunkParams;
use crate::manifest::{
    Arch, BootSupport, FileEntry, Files, Manifest, ManifestError, ScriptFile, ScriptKind, FORMAT,
    MANIFEST_FILE, SIGNATURE_FILE,
};
use crate::signing::{self, SigningError};
use crate::updater::{NoProgress, Progress};

/// Output file names inside a release directory: the same names a slot uses on the boot
/// partition (one definition, in [`crate::layout`]).
pub use crate::layout::{INITRD_FILE, KERNEL_FILE, ROOTFS_FILE};

pub(super) const COPY_BUF: usize = 1 << 20;

/// What to put in a release.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// A squashfs image.
    pub rootfs: PathBuf,
    /// The kernel image to ship.
    pub kernel: PathBuf,
    /// The initramfs to ship.
    pub initrd: PathBuf,
    /// The release's version string, written to the manifest (`v1.2.0`).
    pub version: String,
    /// The architecture the artifacts are built for.
    pub arch: Arch,
    /// The publisher's secret key (PKCS#8 PEM, see [`crate::signing`]).
    pub secret_key: PathBuf,
    /// The release directory to write; created if missing, must not already hold a release.
    pub out_dir: PathBuf,
    /// Generation; `None` = derived from the enclosing channel (see [`create`]).
    pub generation: Option<u64>,
    /// Boot scripts to carry (at most one per loader), as rendered by `bootconfig`: a node
    /// installs one when it activates this release and both slots read its version.
    pub scripts: Vec<BootScript>,
    /// Payloads beside the slot files (issue 33): image archives a node stages into its
    /// payload store with the slot ([`PayloadInput`]).
    pub payloads: Vec<PayloadInput>,
}

/// A boot script for [`CreateOptions::scripts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootScript {
    /// Which loader's script this is (GRUB or extlinux).
    pub kind: ScriptKind,
    /// The script's full text, including its version marker line.
    pub text: String,
}

impl BootScript {
    /// The script's version, from its marker line; refused when this build does not know it.
    pub fn version(&self) -> Result<u32, ReleaseError> {
        let path = Path::new(self.kind.file_name());
        let v = match self.kind {
            ScriptKind::GrubCfg => {
                bootconfig::GrubScript::of_cfg(path, &self.text).map(|v| v.number())
            }
            ScriptKind::ExtlinuxConf => bootconfig::conf_version(path, &self.text),
        };
        v.map_err(|e| ReleaseError::Script {
            kind: self.kind,
            what: e.to_string(),
        })
    }
}

/// Why a release could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// An input or output file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// An input artifact is an empty file.
    #[error("{what} input {path} is empty")]
    EmptyInput {
        /// Which input: "rootfs", "kernel" or "initrd".
        what: &'static str,
        /// The input file.
        path: PathBuf,
    },
    /// The rootfs input does not start with the squashfs magic.
    #[error("rootfs input {path} is not a squashfs image: expected magic 'hsqs' at offset 0, found {found:02x?}")]
    NotSquashfs {
        /// The rootfs input file.
        path: PathBuf,
        /// Its first bytes (up to 4).
        found: Vec<u8>,
    },
    /// The output directory already holds a manifest.
    #[error("{out_dir} already holds a release ({MANIFEST_FILE} exists); remove it or choose another directory")]
    Exists {
        /// The output directory.
        out_dir: PathBuf,
    },
    /// The output directory holds a directory where the release puts a file, or a file where
    /// it puts a directory: found before anything is moved into it.
    #[error("{path} is in the way of the release ({what}); nothing was moved into {out_dir}: remove it or choose another directory")]
    InTheWay {
        /// The output directory.
        out_dir: PathBuf,
        /// The entry in the way.
        path: PathBuf,
        /// What it is and what the release puts there.
        what: &'static str,
    },
    /// No generation was given and the output directory is not inside a channel.
    #[error("no generation given and {out_dir} is not inside a channel (no index.json in its parent directory): pass --generation N (release create)")]
    GenerationRequired {
        /// The output directory.
        out_dir: PathBuf,
    },
    /// The generation is already used by another release of the channel for this architecture.
    #[error("generation {generation} for {arch} is already used by release {other_version} ({other_path}) in channel {channel}")]
    GenerationTaken {
        /// The generation asked for.
        generation: u64,
        /// The architecture of both releases.
        arch: Arch,
        /// The version of the release that has it.
        other_version: String,
        /// The directory of that release, relative to the channel.
        other_path: String,
        /// The channel directory.
        channel: PathBuf,
    },
    /// The manifest drafted or read is invalid.
    #[error("invalid release: {0}")]
    Manifest(#[from] ManifestError),
    /// Loading the key, signing or checking a signature failed.
    #[error(transparent)]
    Signing(#[from] SigningError),
    /// The enclosing channel's index could not be read or rebuilt.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// A boot script has no version marker this build knows.
    #[error("boot script ({kind}): {what}")]
    Script {
        /// Which loader's script.
        kind: ScriptKind,
        /// What is wrong with it.
        what: String,
    },
    /// Chunking parameters are invalid, or an artifact's chunk index does not match it.
    #[error("chunk index of {path}: {what}")]
    ChunkIndex {
        /// The artifact (or, for bad parameters, the output directory).
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A file of a release directory differs from the size and sha256 its manifest gives.
    #[error("{path}: expected {expected_size} bytes with sha256 {expected_sha256}, found {found_size} bytes with sha256 {found_sha256}")]
    FileMismatch {
        /// The file in the release directory.
        path: PathBuf,
        /// Size in bytes from the manifest.
        expected_size: u64,
        /// Hex sha256 from the manifest.
        expected_sha256: String,
        /// Size in bytes of the file.
        found_size: u64,
        /// Hex sha256 of the file.
        found_sha256: String,
    },
    /// A payload input cannot be published (unknown kind, not a file, fails its kind's
    /// check, its images cannot be read).
    #[error("payload {path}: {what}")]
    Payload {
        /// The input file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// An image archive input does not hold complete images (names its path and what).
    #[error(transparent)]
    Archive(#[from] crate::payload::ArchiveError),
    /// The rootfs's dm-verity tree and FEC could not be made (`--verity`): not whole 4 KiB
    /// blocks, veritysetup missing or failing, or its bytes not the nodes' own.
    #[error("dm-verity of {path}: {what}")]
    Verity {
        /// The rootfs in the release directory.
        path: PathBuf,
        /// What went wrong.
        what: String,
    },
    /// A release named by `--patch-from` cannot serve as a patch's base (unreadable or
    /// inconsistent manifest, another architecture, a file that is not what it says), or its
    /// patch could not be built.
    #[error("patch base {path}: {what}")]
    PatchBase {
        /// The base release's manifest or file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ReleaseError + '_ {
    move |source| ReleaseError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Create a signed release in `opts.out_dir` and return its manifest.
///
/// Generation, when not given: if the output directory's parent is a channel (holds
/// `index.json`; its release subdirectories are scanned, so a stale index does not matter), a release of the same version for another architecture lends its generation
/// (one version = one generation across architectures); otherwise it is one more than the
/// highest generation in the channel. Outside a channel a generation is required.
pub fn create(opts: &CreateOptions) -> Result<Manifest, ReleaseError> {
    create_with_progress(opts, &NoProgress)
}

/// [`create`], reporting the copy of each artifact to `progress` (begin/advance/end per file).
pub fn create_with_progress(
    opts: &CreateOptions,
    progress: &dyn Progress,
) -> Result<Manifest, ReleaseError> {
    create_with(opts, Some(ChunkParams::DEFAULT), progress)
}

/// [`create_with_progress`] with a choice of chunk parameters; `None` writes no chunk indexes
/// (nodes then always download whole files).
pub fn create_with(
    opts: &CreateOptions,
    chunking: Option<ChunkParams>,
    progress: &dyn Progress,
) -> Result<Manifest, ReleaseError> {
    create_patched(opts, chunking, &[], progress).map(|(m, _)| m)
}

/// [`create_with`] plus per-pair patches from each earlier release in `patch_from` (its
/// directory or `manifest.json`; see the `patches` module), built after the artifacts are copied and
/// listed in the manifest before it is signed. Returns the manifest and every patch built,
/// kept or not.
pub fn create_patched(
    opts: &CreateOptions,
    chunking: Option<ChunkParams>,
    patch_from: &[PathBuf],
    progress: &dyn Progress,
) -> Result<(Manifest, Vec<PatchBuilt>), ReleaseError> {
    create_with_verity(opts, chunking, patch_from, None, progress)
}

/// [`create_patched`], and with `verity` the rootfs's dm-verity parameters in the manifest
/// (`veritysetup format`, see `release::verity`): the tree and FEC are not published, nodes
/// compute them.
pub fn create_with_verity(
    opts: &CreateOptions,
    chunking: Option<ChunkParams>,
    patch_from: &[PathBuf],
    verity: Option<VerityOptions>,
    progress: &dyn Progress,
) -> Result<(Manifest, Vec<PatchBuilt>), ReleaseError> {
    if let Some(p) = chunking {
        p.check().map_err(|e| ReleaseError::ChunkIndex {
            path: opts.out_dir.clone(),
            what: e.to_string(),
        })?;
    }
    // Everything that can be checked cheaply is checked before a byte is copied.
    let key = signing::load_secret_key(&opts.secret_key)?;
    check_inputs(opts)?;
    let (generation, channel_dir) = generation_for(opts)?;
    let mut manifest = draft_manifest(opts, generation)?;
    let bases = patches::load(patch_from, opts.arch)?;

    // Built beside the output directory and moved into place only when complete.
    let staging = staging::Staging::new(&opts.out_dir)?;
    let out = staging.path();
    let copy = |src: &Path, name: &str| copy_hashed(src, out, name, chunking, progress);
    manifest.files.rootfs = copy(&opts.rootfs, ROOTFS_FILE)?;
    manifest.files.kernel = copy(&opts.kernel, KERNEL_FILE)?;
    manifest.files.initrd = copy(&opts.initrd, INITRD_FILE)?;
    manifest.payloads = opts
        .payloads
        .iter()
        .map(|p| payloads::publish(p, &copy))
        .collect::<Result<_, _>>()?;
    for sc in &opts.scripts {
        write_atomic(out, sc.kind.file_name(), sc.text.as_bytes())?;
    }
    let built = patches::add(out, &mut manifest, &bases)?;
    if let Some(o) = verity {
        manifest.verity = Some(verity::format(out, &manifest.files.rootfs, o)?);
    }

    let bytes = manifest.to_bytes();
    Manifest::parse(&bytes)?;
    let sig = signing::sign_with(&bytes, &key);
    // Signature first, manifest last: a directory with a manifest is a complete release.
    write_atomic(out, SIGNATURE_FILE, &sig)?;
    write_atomic(out, MANIFEST_FILE, &bytes)?;
    fsync_dir(out)?;
    staging.finish()?;

    if let Some(ch) = channel_dir {
        channel::write_index(&ch)?;
    }
    Ok((manifest, built))
}

/// The three inputs are non-empty regular files, the rootfs a squashfs, and the output
/// directory holds no release yet.
fn check_inputs(opts: &CreateOptions) -> Result<(), ReleaseError> {
    let inputs = [
        ("rootfs", &opts.rootfs),
        ("kernel", &opts.kernel),
        ("initrd", &opts.initrd),
    ];
    for (what, path) in inputs {
        let md = fs::metadata(path).map_err(io_err(path))?;
        if !md.is_file() {
            return Err(ReleaseError::Io {
                path: path.to_path_buf(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            });
        }
        if md.len() == 0 {
            return Err(ReleaseError::EmptyInput {
                what,
                path: path.to_path_buf(),
            });
        }
    }
    check_squashfs(&opts.rootfs)?;
    payloads::check(&opts.payloads)?;
    if opts.out_dir.join(MANIFEST_FILE).exists() {
        return Err(ReleaseError::Exists {
            out_dir: opts.out_dir.clone(),
        });
    }
    Ok(())
}

/// The release's generation (given, or derived from the enclosing channel: see [`create`]) and
/// that channel's directory, if any.
fn generation_for(opts: &CreateOptions) -> Result<(u64, Option<PathBuf>), ReleaseError> {
    let channel_dir = enclosing_channel(&opts.out_dir);
    // The releases actually present (not a possibly stale index.json).
    let channel_index = channel_dir
        .as_deref()
        .map(channel::build_index)
        .transpose()?;
    let generation = match (opts.generation, &channel_index) {
        (Some(g), _) => g,
        (None, Some(index)) => match index.releases.iter().find(|e| e.version == opts.version) {
            Some(e) => e.generation,
            None => {
                index
                    .releases
                    .iter()
                    .map(|e| e.generation)
                    .max()
                    .unwrap_or(0)
                    + 1
            }
        },
        (None, None) => {
            return Err(ReleaseError::GenerationRequired {
                out_dir: opts.out_dir.clone(),
            })
        }
    };
    if let (Some(ch), Some(index)) = (&channel_dir, &channel_index) {
        let own = opts
            .out_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(e) = index.releases.iter().find(|e| {
            e.arch == opts.arch && e.generation == generation && e.path.trim_end_matches('/') != own
        }) {
            return Err(ReleaseError::GenerationTaken {
                generation,
                arch: opts.arch,
                other_version: e.version.clone(),
                other_path: e.path.clone(),
                channel: ch.clone(),
            });
        }
    }
    Ok((generation, channel_dir))
}

/// The manifest with placeholder file entries (validated before anything is copied) and the
/// boot scripts' entries.
fn draft_manifest(opts: &CreateOptions, generation: u64) -> Result<Manifest, ReleaseError> {
    let placeholder = |p: &str| FileEntry {
        path: p.into(),
        size: 1,
        sha256: "0".repeat(64),
        chunks: None,
        patches: Vec::new(),
    };
    // Validate version and the rest of the manifest before copying.
    let mut manifest = Manifest {
        format: FORMAT,
        version: opts.version.clone(),
        arch: opts.arch,
        generation,
        files: Files {
            rootfs: placeholder(ROOTFS_FILE),
            kernel: placeholder(KERNEL_FILE),
            initrd: placeholder(INITRD_FILE),
        },
        boot: Some(BootSupport {
            grub_script: bootconfig::GrubScript::CURRENT.number(),
            extlinux_conf: bootconfig::CONF_VERSION,
            scripts: Vec::new(),
        }),
        payloads: payloads::placeholders(&opts.payloads),
        verity: None,
    };
    let mut scripts = Vec::new();
    for sc in &opts.scripts {
        let data = sc.text.as_bytes();
        scripts.push(ScriptFile {
            kind: sc.kind,
            version: sc.version()?,
            path: sc.kind.file_name().to_string(),
            size: data.len() as u64,
            sha256: hex::encode(Sha256::digest(data)),
        });
    }
    if let Some(b) = manifest.boot.as_mut() {
        b.scripts = scripts;
    }
    Manifest::parse(&manifest.to_bytes())?.check_version_name()?;
    Ok(manifest)
}

/// The channel directory that encloses `out_dir`, if its parent holds an index.
fn enclosing_channel(out_dir: &Path) -> Option<PathBuf> {
    let abs = if out_dir.is_absolute() {
        out_dir.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(out_dir)
    };
    let parent = abs.parent()?;
    parent
        .join(channel::INDEX_FILE)
        .is_file()
        .then(|| parent.to_path_buf())
}

fn check_squashfs(path: &Path) -> Result<(), ReleaseError> {
    let mut f = fs::File::open(path).map_err(io_err(path))?;
    let mut magic = Vec::with_capacity(4);
    Read::by_ref(&mut f)
        .take(4)
        .read_to_end(&mut magic)
        .map_err(io_err(path))?;
    if magic.as_slice() != crate::sqcheck::MAGIC {
        return Err(ReleaseError::NotSquashfs {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    Ok(())
}

mod copy;
mod patches;
mod payloads;
mod staging;
mod verify;
mod verity;

use copy::copy_hashed;
use copy::fsync_dir;
pub use copy::sha256_file;
pub(crate) use copy::write_atomic;
pub use patches::PatchBuilt;
pub use payloads::PayloadInput;
pub use verify::verify_dir;
pub use verity::{salt_for, VerityOptions, DEFAULT_FEC_ROOTS};

#[cfg(test)]
mod tests;
