//! Creating a release directory: copy the three artifacts, hash them, write and sign the manifest.
//!
//! This module owns the publisher side of a release: `create` streams each input file once
//! (read → sha256 → write, 1 MiB at a time, so a multi-GiB rootfs never sits in memory),
//! writes every output under a temporary name and renames it into place after fsync, writes
//! `manifest.json` and its signature last, and — when the output directory sits inside a
//! channel (its parent holds `index.json`) — picks the generation and rebuilds the channel
//! index. A half-written release therefore never appears in a channel's index.
//!
//! Each artifact also gets a chunk index (`<file>.chunks`, see [`crate::chunk`]), cut in the same
//! single pass as the copy and the hash, and referenced with its sha256 from the signed manifest:
//! nodes fetch only the chunks they lack with HTTP `Range` requests against the plain files.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::channel::{self, ChannelError};
use crate::chunk::{ChunkEntry, ChunkIndex, ChunkParams, IndexError};
use crate::manifest::{
    Arch, BootSupport, FileEntry, Files, IndexRef, Manifest, ManifestError, ScriptFile, ScriptKind,
    FORMAT, MANIFEST_FILE, SIGNATURE_FILE,
};
use crate::signing::{self, SigningError};
use crate::updater::{NoProgress, Progress};

/// Output file names inside a release directory: the same names a slot uses on the boot
/// partition (one definition, in [`crate::layout`]).
pub use crate::layout::{INITRD_FILE, KERNEL_FILE, ROOTFS_FILE};

/// Magic at offset 0 of a squashfs image ("hsqs", little endian).
const SQUASHFS_MAGIC: &[u8; 4] = b"hsqs";
const COPY_BUF: usize = 1 << 20;

/// What to put in a release.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// A squashfs image.
    pub rootfs: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub version: String,
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
}

/// A boot script for [`CreateOptions::scripts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootScript {
    pub kind: ScriptKind,
    pub text: String,
}

impl BootScript {
    /// The script's version, from its marker line; refused when this build does not know it.
    pub fn version(&self) -> Result<u32, ReleaseError> {
        let path = Path::new(self.kind.file_name());
        let v = match self.kind {
            ScriptKind::GrubCfg => {
                bootconfig::grub::GrubScript::of_cfg(path, &self.text).map(|v| v.number())
            }
            ScriptKind::ExtlinuxConf => bootconfig::syslinux::conf_version(path, &self.text),
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
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{what} input {path} is empty")]
    EmptyInput { what: &'static str, path: PathBuf },
    #[error("rootfs input {path} is not a squashfs image: expected magic 'hsqs' at offset 0, found {found:02x?}")]
    NotSquashfs { path: PathBuf, found: Vec<u8> },
    #[error("{out_dir} already holds a release ({MANIFEST_FILE} exists); remove it or choose another directory")]
    Exists { out_dir: PathBuf },
    #[error("no generation given and {out_dir} is not inside a channel (no index.json in its parent directory): pass --generation N (release create)")]
    GenerationRequired { out_dir: PathBuf },
    #[error("generation {generation} for {arch} is already used by release {other_version} ({other_path}) in channel {channel}")]
    GenerationTaken {
        generation: u64,
        arch: Arch,
        other_version: String,
        other_path: String,
        channel: PathBuf,
    },
    #[error("invalid release: {0}")]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Signing(#[from] SigningError),
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error("boot script ({kind}): {what}")]
    Script { kind: ScriptKind, what: String },
    #[error("chunk index of {path}: {what}")]
    ChunkIndex { path: PathBuf, what: String },
    #[error("{path}: expected {expected_size} bytes with sha256 {expected_sha256}, found {found_size} bytes with sha256 {found_sha256}")]
    FileMismatch {
        path: PathBuf,
        expected_size: u64,
        expected_sha256: String,
        found_size: u64,
        found_sha256: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ReleaseError + '_ {
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
    if let Some(p) = chunking {
        p.check().map_err(|e| ReleaseError::ChunkIndex {
            path: opts.out_dir.clone(),
            what: e.to_string(),
        })?;
    }
    // Everything that can be checked cheaply is checked before a byte is copied.
    let key = signing::load_secret_key(&opts.secret_key)?;
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
    if opts.out_dir.join(MANIFEST_FILE).exists() {
        return Err(ReleaseError::Exists {
            out_dir: opts.out_dir.clone(),
        });
    }

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

    let placeholder = |p: &str| FileEntry {
        path: p.into(),
        size: 1,
        sha256: "0".repeat(64),
        chunks: None,
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
            grub_script: bootconfig::grub::GrubScript::CURRENT.number(),
            extlinux_conf: bootconfig::syslinux::CONF_VERSION,
            scripts: Vec::new(),
        }),
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
    Manifest::parse(&manifest.to_bytes())?;

    fs::create_dir_all(&opts.out_dir).map_err(io_err(&opts.out_dir))?;
    let copy = |src: &Path, name: &str| copy_hashed(src, &opts.out_dir, name, chunking, progress);
    manifest.files.rootfs = copy(&opts.rootfs, ROOTFS_FILE)?;
    manifest.files.kernel = copy(&opts.kernel, KERNEL_FILE)?;
    manifest.files.initrd = copy(&opts.initrd, INITRD_FILE)?;
    for sc in &opts.scripts {
        write_atomic(&opts.out_dir, sc.kind.file_name(), sc.text.as_bytes())?;
    }

    let bytes = manifest.to_bytes();
    Manifest::parse(&bytes)?;
    let sig = signing::sign_with(&bytes, &key);
    // Signature first, manifest last: a directory with a manifest is a complete release.
    write_atomic(&opts.out_dir, SIGNATURE_FILE, &sig)?;
    write_atomic(&opts.out_dir, MANIFEST_FILE, &bytes)?;
    fsync_dir(&opts.out_dir)?;

    if let Some(ch) = channel_dir {
        channel::write_index(&ch)?;
    }
    Ok(manifest)
}

/// Check a local release directory the way a node would: the manifest's signature against
/// `trust_dir`, then each file's size and sha256. Returns the manifest and the signing key.
pub fn verify_dir(
    dir: &Path,
    trust_dir: &Path,
) -> Result<(Manifest, signing::KeyId), ReleaseError> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let bytes = fs::read(&manifest_path).map_err(io_err(&manifest_path))?;
    let sig_path = dir.join(SIGNATURE_FILE);
    let sig = match fs::read(&sig_path) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(ReleaseError::Io {
                path: sig_path,
                source: e,
            })
        }
    };
    let key = signing::verify(&bytes, &sig, trust_dir)?;
    let manifest = Manifest::parse(&bytes)?;
    for a in crate::manifest::Artifact::ALL {
        let e = manifest.files.get(a);
        let path = dir.join(&e.path);
        let (found_size, found_sha256) = sha256_file(&path).map_err(io_err(&path))?;
        if found_size != e.size || found_sha256 != e.sha256 {
            return Err(ReleaseError::FileMismatch {
                path,
                expected_size: e.size,
                expected_sha256: e.sha256.clone(),
                found_size,
                found_sha256,
            });
        }
        if let Some(r) = &e.chunks {
            verify_chunk_index(dir, r, &path, e.size)?;
        }
    }
    for sc in manifest.boot.iter().flat_map(|b| &b.scripts) {
        let path = dir.join(&sc.path);
        let (found_size, found_sha256) = sha256_file(&path).map_err(io_err(&path))?;
        if found_size != sc.size || found_sha256 != sc.sha256 {
            return Err(ReleaseError::FileMismatch {
                path,
                expected_size: sc.size,
                expected_sha256: sc.sha256.clone(),
                found_size,
                found_sha256,
            });
        }
    }
    Ok((manifest, key))
}

/// The index file matches its manifest entry, describes exactly `size` bytes, and every chunk's
/// digest matches the artifact's bytes.
fn verify_chunk_index(
    dir: &Path,
    r: &IndexRef,
    artifact: &Path,
    size: u64,
) -> Result<(), ReleaseError> {
    let ipath = dir.join(&r.path);
    let bytes = fs::read(&ipath).map_err(io_err(&ipath))?;
    let sha = hex::encode(Sha256::digest(&bytes));
    if bytes.len() as u64 != r.size || sha != r.sha256 {
        return Err(ReleaseError::FileMismatch {
            path: ipath,
            expected_size: r.size,
            expected_sha256: r.sha256.clone(),
            found_size: bytes.len() as u64,
            found_sha256: sha,
        });
    }
    let bad = |what: String| ReleaseError::ChunkIndex {
        path: artifact.to_path_buf(),
        what,
    };
    let index = ChunkIndex::parse(&bytes).map_err(|e| bad(e.to_string()))?;
    if index.size() != size {
        return Err(bad(format!(
            "describes {} bytes, the file has {size}",
            index.size()
        )));
    }
    let mut f = fs::File::open(artifact).map_err(io_err(artifact))?;
    let mut buf = vec![0u8; index.params.max as usize];
    for (i, c) in index.chunks.iter().enumerate() {
        let data = &mut buf[..c.len as usize];
        f.read_exact(data).map_err(io_err(artifact))?;
        if crate::chunk::digest(data) != c.digest {
            return Err(bad(format!(
                "chunk {i} (bytes {}..{}) does not match the file",
                c.offset,
                c.end()
            )));
        }
    }
    Ok(())
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
    if magic.as_slice() != SQUASHFS_MAGIC {
        return Err(ReleaseError::NotSquashfs {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    Ok(())
}

/// Stream `src` into `dir/name` (via a temporary file, removed on failure), hashing as it goes.
/// Also writes `dir/name.chunks` (before the artifact is renamed into place) when chunking.
fn copy_hashed(
    src: &Path,
    dir: &Path,
    name: &str,
    chunking: Option<ChunkParams>,
    progress: &dyn Progress,
) -> Result<FileEntry, ReleaseError> {
    let dst = dir.join(name);
    let tmp = dir.join(format!(".{name}.part"));
    let result = copy_hashed_to(src, &tmp, name, chunking, progress);
    progress.end();
    let (mut entry, index) = match result {
        Ok(e) => e,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if let Some(index) = index {
        let iname = format!("{name}.chunks");
        let bytes = index.to_bytes();
        write_atomic(dir, &iname, &bytes)?;
        entry.chunks = Some(IndexRef {
            path: iname,
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
        });
    }
    fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    Ok(entry)
}

/// Reads `input`, hashing every byte, writing it to `output` and reporting progress: the one
/// pass that copies, hashes and (when chunking reads through it) chunks an artifact.
struct Tee<'a> {
    input: fs::File,
    output: fs::File,
    hasher: Sha256,
    size: u64,
    progress: &'a dyn Progress,
}

impl Read for Tee<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = loop {
            match self.input.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        self.hasher.update(&buf[..n]);
        // An output error is tagged so it is reported against the output path.
        self.output
            .write_all(&buf[..n])
            .map_err(|e| io::Error::new(e.kind(), OutputError(e)))?;
        self.size += n as u64;
        self.progress.advance(n as u64);
        Ok(n)
    }
}

#[derive(Debug)]
struct OutputError(io::Error);

impl std::fmt::Display for OutputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for OutputError {}

fn copy_hashed_to(
    src: &Path,
    tmp: &Path,
    name: &str,
    chunking: Option<ChunkParams>,
    progress: &dyn Progress,
) -> Result<(FileEntry, Option<ChunkIndex>), ReleaseError> {
    let input = fs::File::open(src).map_err(io_err(src))?;
    let total = input.metadata().map_err(io_err(src))?.len();
    let output = fs::File::create(tmp).map_err(io_err(tmp))?;
    progress.begin(name, total, 0);
    let mut tee = Tee {
        input,
        output,
        hasher: Sha256::new(),
        size: 0,
        progress,
    };
    let which = |e: io::Error| {
        let path = if e.get_ref().is_some_and(|i| i.is::<OutputError>()) {
            tmp
        } else {
            src
        };
        ReleaseError::Io {
            path: path.to_path_buf(),
            source: e,
        }
    };
    let index = match chunking {
        None => {
            let mut buf = vec![0u8; COPY_BUF];
            while tee.read(&mut buf).map_err(which)? > 0 {}
            None
        }
        Some(params) => {
            let mut chunks = Vec::new();
            crate::chunk::index::for_each_chunk(&mut tee, params, |offset, data| {
                chunks.push(ChunkEntry {
                    offset,
                    len: data.len() as u32,
                    digest: crate::chunk::digest(data),
                });
                Ok(())
            })
            .map_err(|e| match e {
                IndexError::Io(e) => which(e),
                IndexError::Invalid(what) => ReleaseError::ChunkIndex {
                    path: src.to_path_buf(),
                    what,
                },
            })?;
            Some(ChunkIndex { params, chunks })
        }
    };
    tee.output.sync_all().map_err(io_err(tmp))?;
    Ok((
        FileEntry {
            path: name.to_string(),
            size: tee.size,
            sha256: hex::encode(tee.hasher.finalize()),
            chunks: None,
        },
        index,
    ))
}

/// Write `dir/name` via a temporary file + fsync + rename.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ReleaseError> {
    let tmp = dir.join(format!(".{name}.part"));
    let dst = dir.join(name);
    let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    fs::rename(&tmp, &dst).map_err(io_err(&dst))
}

fn fsync_dir(dir: &Path) -> Result<(), ReleaseError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Stream-hash a file: (size, lower-case hex sha256).
pub fn sha256_file(path: &Path) -> io::Result<(u64, String)> {
    let mut f = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; COPY_BUF];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Artifact;

    struct Fixture {
        t: tempfile::TempDir,
        key: PathBuf,
        trust: PathBuf,
    }

    fn fixture() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        let (key, pk) = signing::generate_keypair(&t.path().join("keys"), "k").unwrap();
        let trust = t.path().join("trust");
        fs::create_dir(&trust).unwrap();
        fs::copy(pk, trust.join("k.pub")).unwrap();
        let mut rootfs = b"hsqs".to_vec();
        rootfs.extend((0..3_000_000u32).map(|i| (i % 251) as u8));
        fs::write(t.path().join("in.squashfs"), rootfs).unwrap();
        fs::write(t.path().join("in.kernel"), b"kernel bytes").unwrap();
        fs::write(t.path().join("in.initrd"), b"initrd bytes").unwrap();
        Fixture { t, key, trust }
    }

    impl Fixture {
        fn opts(
            &self,
            out: &Path,
            version: &str,
            arch: Arch,
            generation: Option<u64>,
        ) -> CreateOptions {
            let p = self.t.path();
            CreateOptions {
                rootfs: p.join("in.squashfs"),
                kernel: p.join("in.kernel"),
                initrd: p.join("in.initrd"),
                version: version.into(),
                arch,
                secret_key: self.key.clone(),
                out_dir: out.to_path_buf(),
                generation,
                scripts: Vec::new(),
            }
        }
    }

    #[test]
    fn create_writes_verifiable_release() {
        let f = fixture();
        let out = f.t.path().join("rel");
        let m = create(&f.opts(&out, "v1.0.0", Arch::X86_64, Some(7))).unwrap();
        assert_eq!(m.generation, 7);
        let bytes = fs::read(out.join(MANIFEST_FILE)).unwrap();
        assert_eq!(Manifest::parse(&bytes).unwrap(), m);
        signing::verify(
            &bytes,
            &fs::read(out.join(SIGNATURE_FILE)).unwrap(),
            &f.trust,
        )
        .unwrap();
        for (file, input) in [
            (ROOTFS_FILE, "in.squashfs"),
            (KERNEL_FILE, "in.kernel"),
            (INITRD_FILE, "in.initrd"),
        ] {
            assert_eq!(
                fs::read(out.join(file)).unwrap(),
                fs::read(f.t.path().join(input)).unwrap()
            );
        }
        let (vm, _) = verify_dir(&out, &f.trust).unwrap();
        assert_eq!(vm, m);
        let (size, sha) = sha256_file(&out.join(ROOTFS_FILE)).unwrap();
        assert_eq!(
            (size, sha),
            (m.files.rootfs.size, m.files.rootfs.sha256.clone())
        );
        assert_eq!(size, 3_000_004);
        // No temporary files left behind.
        let names: Vec<_> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 8, "{names:?}");
        let ix = m.files.rootfs.chunks.as_ref().expect("rootfs chunk index");
        let index = ChunkIndex::parse(&fs::read(out.join(&ix.path)).unwrap()).unwrap();
        assert_eq!(index.size(), m.files.rootfs.size);
        assert_eq!(index.params, ChunkParams::DEFAULT);
        assert_eq!(
            index,
            ChunkIndex::build(
                fs::File::open(out.join(ROOTFS_FILE)).unwrap(),
                ChunkParams::DEFAULT
            )
            .unwrap()
        );
        // A second create into the same directory is refused and changes nothing.
        let e = create(&f.opts(&out, "v1.0.1", Arch::X86_64, Some(8))).unwrap_err();
        assert!(matches!(e, ReleaseError::Exists { .. }), "{e}");
        assert_eq!(fs::read(out.join(MANIFEST_FILE)).unwrap(), bytes);
    }

    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<(String, u64, u64)>>);

    impl Progress for Recorder {
        fn begin(&self, what: &str, total: u64, _already: u64) {
            self.0.lock().unwrap().push((what.to_string(), total, 0));
        }
        fn advance(&self, bytes: u64) {
            self.0.lock().unwrap().last_mut().unwrap().2 += bytes;
        }
        fn end(&self) {}
    }

    #[test]
    fn progress_reports_every_byte_of_each_file() {
        let f = fixture();
        let rec = Recorder::default();
        let m = create_with_progress(
            &f.opts(&f.t.path().join("rel"), "v1", Arch::X86_64, Some(1)),
            &rec,
        )
        .unwrap();
        let got = rec.0.into_inner().unwrap();
        let want: Vec<_> = crate::manifest::Artifact::ALL
            .iter()
            .map(|a| {
                let e = m.files.get(*a);
                (e.path.clone(), e.size, e.size)
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn verify_dir_catches_tampered_file_and_missing_signature() {
        let f = fixture();
        let out = f.t.path().join("rel");
        create(&f.opts(&out, "v1", Arch::X86_64, Some(1))).unwrap();
        let rootfs = out.join(ROOTFS_FILE);
        let mut bytes = fs::read(&rootfs).unwrap();
        bytes[1_000_000] ^= 1;
        fs::write(&rootfs, &bytes).unwrap();
        let e = verify_dir(&out, &f.trust).unwrap_err();
        assert!(matches!(e, ReleaseError::FileMismatch { .. }), "{e}");
        assert!(e.to_string().contains("rootfs.squashfs"), "{e}");
        fs::remove_file(out.join(SIGNATURE_FILE)).unwrap();
        let e = verify_dir(&out, &f.trust).unwrap_err();
        assert!(
            matches!(e, ReleaseError::Signing(SigningError::Unsigned { .. })),
            "{e}"
        );
    }

    #[test]
    fn verify_dir_catches_an_index_that_does_not_match_its_file() {
        let f = fixture();
        let out = f.t.path().join("rel");
        // Sign a manifest whose rootfs index was made for other bytes (a publisher bug).
        let m = create(&f.opts(&out, "v1", Arch::X86_64, Some(1))).unwrap();
        let mut other = fs::read(out.join(ROOTFS_FILE)).unwrap();
        other[2_000_000] ^= 1;
        let bytes = ChunkIndex::build(&other[..], ChunkParams::DEFAULT)
            .unwrap()
            .to_bytes();
        let r = m.files.rootfs.chunks.clone().unwrap();
        fs::write(out.join(&r.path), &bytes).unwrap();
        let mut m2 = m.clone();
        m2.files.rootfs.chunks = Some(IndexRef {
            sha256: hex::encode(Sha256::digest(&bytes)),
            size: bytes.len() as u64,
            ..r
        });
        let key = signing::load_secret_key(&f.key).unwrap();
        fs::write(
            out.join(SIGNATURE_FILE),
            signing::sign_with(&m2.to_bytes(), &key),
        )
        .unwrap();
        fs::write(out.join(MANIFEST_FILE), m2.to_bytes()).unwrap();
        let e = verify_dir(&out, &f.trust).unwrap_err().to_string();
        assert!(
            e.contains("chunk index of") && e.contains("does not match"),
            "{e}"
        );
    }

    #[test]
    fn without_chunking_no_index_is_written() {
        let f = fixture();
        let out = f.t.path().join("rel");
        let m = create_with(
            &f.opts(&out, "v1", Arch::X86_64, Some(1)),
            None,
            &NoProgress,
        )
        .unwrap();
        assert!(Artifact::ALL
            .iter()
            .all(|a| m.files.get(*a).chunks.is_none()));
        assert_eq!(fs::read_dir(&out).unwrap().count(), 5);
        verify_dir(&out, &f.trust).unwrap();
    }

    #[test]
    fn refuses_bad_inputs_before_writing() {
        let f = fixture();
        let out = f.t.path().join("rel");
        let mut o = f.opts(&out, "v1", Arch::X86_64, Some(1));
        o.rootfs = f.t.path().join("in.kernel");
        let e = create(&o).unwrap_err();
        assert!(matches!(e, ReleaseError::NotSquashfs { .. }), "{e}");
        assert!(e.to_string().contains("in.kernel"), "{e}");

        let mut o = f.opts(&out, "v1", Arch::X86_64, Some(1));
        fs::write(f.t.path().join("empty"), b"").unwrap();
        o.initrd = f.t.path().join("empty");
        assert!(matches!(
            create(&o).unwrap_err(),
            ReleaseError::EmptyInput { what: "initrd", .. }
        ));

        let e = create(&f.opts(&out, "bad version", Arch::X86_64, Some(1))).unwrap_err();
        assert!(e.to_string().contains("version"), "{e}");

        let e = create(&f.opts(&out, "v1", Arch::X86_64, None)).unwrap_err();
        assert!(matches!(e, ReleaseError::GenerationRequired { .. }), "{e}");

        let mut o = f.opts(&out, "v1", Arch::X86_64, Some(1));
        o.secret_key = f.trust.join("k.pub");
        assert!(matches!(create(&o).unwrap_err(), ReleaseError::Signing(_)));
        assert!(!out.exists(), "nothing may be written for refused input");
    }

    #[test]
    fn channel_generation_and_index() {
        let f = fixture();
        let ch = f.t.path().join("channel");
        fs::create_dir(&ch).unwrap();
        channel::write_index(&ch).unwrap();
        let m1 = create(&f.opts(&ch.join("v1"), "v1", Arch::X86_64, None)).unwrap();
        assert_eq!(m1.generation, 1);
        let m2 = create(&f.opts(&ch.join("v2"), "v2", Arch::X86_64, None)).unwrap();
        assert_eq!(m2.generation, 2);
        // Same version for another architecture shares the generation.
        let m2a = create(&f.opts(&ch.join("v2-arm"), "v2", Arch::Aarch64, None)).unwrap();
        assert_eq!(m2a.generation, 2);
        // A generation already used for that arch is refused.
        let e = create(&f.opts(&ch.join("v9"), "v9", Arch::X86_64, Some(1))).unwrap_err();
        assert!(matches!(e, ReleaseError::GenerationTaken { .. }), "{e}");
        let index = channel::read_local_index(&ch).unwrap();
        let got: Vec<_> = index
            .releases
            .iter()
            .map(|e| (e.version.as_str(), e.generation, e.arch, e.path.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("v2", 2, Arch::Aarch64, "v2-arm/"),
                ("v2", 2, Arch::X86_64, "v2/"),
                ("v1", 1, Arch::X86_64, "v1/")
            ]
        );
        // A release copied into the channel without re-indexing still counts.
        create(&f.opts(&f.t.path().join("elsewhere"), "v7", Arch::X86_64, Some(7))).unwrap();
        fs::create_dir(ch.join("v7")).unwrap();
        for e in fs::read_dir(f.t.path().join("elsewhere")).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), ch.join("v7").join(e.file_name())).unwrap();
        }
        let m8 = create(&f.opts(&ch.join("v8"), "v8", Arch::X86_64, None)).unwrap();
        assert_eq!(m8.generation, 8);
        let index = channel::read_local_index(&ch).unwrap();
        assert_eq!(index.releases[0].path, "v8/");
        assert_eq!(index.releases[1].path, "v7/");
    }
}
