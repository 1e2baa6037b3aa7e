//! Checking a local release directory the way a node would (`release verify`): the manifest's
//! signature, every file's size and sha256 (artifacts, chunk indexes, patches, boot scripts),
//! each chunk index against its artifact, and the rootfs's dm-verity root hash, tree and FEC
//! as the nodes compute them.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::copy::sha256_file;
use super::{io_err, ReleaseError};
use crate::chunk::ChunkIndex;
use crate::manifest::IndexRef;
use crate::manifest::{Manifest, MANIFEST_FILE, SIGNATURE_FILE};
use crate::signing;

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
    for e in manifest.file_entries() {
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
        for p in &e.patches {
            verify_file(dir, &p.path, p.size, &p.sha256)?;
        }
    }
    for sc in manifest.boot.iter().flat_map(|b| &b.scripts) {
        verify_file(dir, &sc.path, sc.size, &sc.sha256)?;
    }
    if let Some(v) = &manifest.verity {
        super::verity::check_dir(dir, &manifest.files.rootfs, v)?;
    }
    Ok((manifest, key))
}

/// File `name` of the release directory has the size and sha256 its manifest entry gives.
fn verify_file(dir: &Path, name: &str, size: u64, sha256: &str) -> Result<(), ReleaseError> {
    let path = dir.join(name);
    let (found_size, found_sha256) = sha256_file(&path).map_err(io_err(&path))?;
    if found_size != size || found_sha256 != sha256 {
        return Err(ReleaseError::FileMismatch {
            path,
            expected_size: size,
            expected_sha256: sha256.to_string(),
            found_size,
            found_sha256,
        });
    }
    Ok(())
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
