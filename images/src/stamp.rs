//! Input fingerprints for incremental builds: every output records the sha256 of everything it
//! was made from (file contents, parameters, the builder's own scripts) next to itself, and is
//! rebuilt only when that fingerprint changes.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::error::{IoContext, Result};

type DigestKey = (PathBuf, u64, Option<std::time::SystemTime>);
static DIGESTS: Mutex<Option<HashMap<DigestKey, [u8; 32]>>> = Mutex::new(None);

fn file_digest(path: &Path) -> Result<[u8; 32]> {
    let meta = fs::metadata(path).ctx("stat", path)?;
    let key = (path.to_path_buf(), meta.len(), meta.modified().ok());
    if let Some(d) = DIGESTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return Ok(*d);
    }
    let mut f = fs::File::open(path).ctx("open", path)?;
    let mut fh = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).ctx("read", path)?;
        if n == 0 {
            break;
        }
        fh.update(&buf[..n]);
    }
    let digest: [u8; 32] = fh.finalize().into();
    DIGESTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, digest);
    Ok(digest)
}

/// A fingerprint under construction.
pub struct Stamp {
    h: Sha256,
}

impl Default for Stamp {
    fn default() -> Self {
        Self::new()
    }
}

impl Stamp {
    pub fn new() -> Stamp {
        let mut h = Sha256::new();
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        Stamp { h }
    }

    /// A named parameter.
    pub fn param(&mut self, key: &str, value: impl AsRef<[u8]>) -> &mut Self {
        let v = value.as_ref();
        self.h.update((key.len() as u64).to_le_bytes());
        self.h.update(key.as_bytes());
        self.h.update((v.len() as u64).to_le_bytes());
        self.h.update(v);
        self
    }

    /// A file's whole content (streamed; digests are remembered for the rest of the process
    /// by path, size and modification time, since many outputs share inputs).
    pub fn file(&mut self, key: &str, path: &Path) -> Result<&mut Self> {
        let digest = file_digest(path)?;
        Ok(self.param(key, digest))
    }

    pub fn hex(&self) -> String {
        hex::encode(self.h.clone().finalize())
    }

    fn stamp_path(output: &Path) -> PathBuf {
        let mut name = output.file_name().unwrap_or_default().to_os_string();
        name.push(".inputs");
        output.with_file_name(name)
    }

    /// True when `output` exists and was recorded with this fingerprint.
    pub fn is_fresh(&self, output: &Path) -> bool {
        output.exists()
            && fs::read_to_string(Self::stamp_path(output))
                .map(|s| s.trim() == self.hex())
                .unwrap_or(false)
    }

    /// Remove the record (before rebuilding `output`), so a half-built output is never fresh.
    pub fn invalidate(output: &Path) -> Result<()> {
        let p = Self::stamp_path(output);
        match fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).ctx("remove", p),
            _ => Ok(()),
        }
    }

    /// Record that `output` is now built from these inputs.
    pub fn record(&self, output: &Path) -> Result<()> {
        let p = Self::stamp_path(output);
        fs::write(&p, format!("{}\n", self.hex())).ctx("write", p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_tracks_params_and_content() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        let out = dir.path().join("out");
        fs::write(&input, b"one").unwrap();
        let mut s = Stamp::new();
        s.param("v", "1").file("in", &input).unwrap();
        assert!(!s.is_fresh(&out), "missing output is never fresh");
        fs::write(&out, b"x").unwrap();
        assert!(!s.is_fresh(&out), "unrecorded output is not fresh");
        s.record(&out).unwrap();
        assert!(s.is_fresh(&out));

        // (a different size: within one process digests are remembered by size and mtime)
        fs::write(&input, b"three").unwrap();
        let mut s2 = Stamp::new();
        s2.param("v", "1").file("in", &input).unwrap();
        assert!(!s2.is_fresh(&out), "changed content must rebuild");

        let mut s3 = Stamp::new();
        s3.param("v1", "").file("in", &input).unwrap();
        assert_ne!(s2.hex(), s3.hex(), "keys and values are length-delimited");
        Stamp::invalidate(&out).unwrap();
        assert!(!s.is_fresh(&out));
    }
}
