//! The one pass that copies an artifact into a release directory, hashes it and cuts its
//! chunk index, and the atomic writes (temporary file, fsync, rename) every output goes through.

use std::fs;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{io_err, ReleaseError, COPY_BUF};
use crate::chunk::{ChunkEntry, ChunkIndex, ChunkParams, IndexError};
use crate::manifest::FileEntry;
use crate::manifest::IndexRef;
use crate::updater::Progress;

/// Stream `src` into `dir/name` (via a temporary file, removed on failure), hashing as it goes.
/// Also writes `dir/name.chunks` (before the artifact is renamed into place) when chunking.
pub(super) fn copy_hashed(
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
            patches: Vec::new(),
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

/// Write `dir/name` from `fill` (a temporary file, fsynced, renamed into place); when `fill`
/// fails with `Err(why)` the temporary file is removed and `Ok(Err(why))` returned.
pub(super) fn write_atomic_from(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut io::BufWriter<fs::File>) -> Result<(), String>,
) -> Result<Result<(), String>, ReleaseError> {
    let tmp = dir.join(format!(".{name}.part"));
    let dst = dir.join(name);
    let mut w =
        io::BufWriter::with_capacity(COPY_BUF, fs::File::create(&tmp).map_err(io_err(&tmp))?);
    if let Err(why) = fill(&mut w) {
        drop(w);
        fs::remove_file(&tmp).map_err(io_err(&tmp))?;
        return Ok(Err(why));
    }
    let f = w.into_inner().map_err(|e| io_err(&tmp)(e.into_error()))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    Ok(Ok(()))
}

pub(super) fn fsync_dir(dir: &Path) -> Result<(), ReleaseError> {
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
