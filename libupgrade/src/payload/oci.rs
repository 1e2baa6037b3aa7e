//! Reading an image archive: which images it holds, and that each is complete.
//!
//! Two layouts are read, both as a plain (uncompressed) tar, and both may be in one archive
//! (newer `docker save` writes both):
//! - an **OCI image layout** (`oci-layout`, `index.json`, `blobs/<alg>/<hex>`; what
//!   `skopeo copy … oci-archive:` and `ctr export` write). An image's names are its index
//!   entry's `io.containerd.image.name` and `org.opencontainers.image.ref.name` annotations. Each
//!   named manifest (or image index, one level down for multi-platform images) must be a blob
//!   of the size the index says, and every config and layer it lists must be present at its
//!   size.
//! - a **docker archive** (`manifest.json`: `Config`, `RepoTags`, `Layers`; what `docker save`
//!   and k3s's `k3s-airgap-images-*.tar` are): names are `RepoTags`, and the config and every
//!   layer must be in the tar.
//!
//! A compressed archive is refused, naming its compression: a compressed tar changes as a
//! whole when one layer does, so neither chunks nor patches can reuse anything of the node's
//! previous copy (k3s imports plain `.tar` archives as well).
//!
//! Memory is bounded: only the JSON documents (`index.json`, `manifest.json`, manifests and
//! image indexes, each at most [`MAX_ARCHIVE_JSON`]) are kept; layers are seeked over, so
//! reading an archive costs its headers, not its size.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::image_layout::{
    Descriptor, ImageIndex, ImageManifest, ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME,
    MEDIA_DOCKER_LIST, MEDIA_INDEX,
};

/// Largest JSON document read from an archive (an index, a manifest, a config is not read).
pub const MAX_ARCHIVE_JSON: u64 = 4 << 20;

const INDEX_MEDIA: &[&str] = &[MEDIA_INDEX, MEDIA_DOCKER_LIST];

/// Why an archive's images could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The file could not be opened or read.
    #[error("image archive {path}: {source}")]
    Io {
        /// The archive.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The archive is compressed.
    #[error("image archive {path} is {compression}-compressed: publish the plain .tar (a compressed archive changes as a whole, so neither chunks nor patches reuse the node's copy; k3s imports plain .tar too)")]
    Compressed {
        /// The archive.
        path: PathBuf,
        /// `gzip`, `zstd`, `xz`, `bzip2` or `lz4`.
        compression: &'static str,
    },
    /// The tar or a document in it is not what an image archive holds.
    #[error("image archive {path}: {what}")]
    Invalid {
        /// The archive.
        path: PathBuf,
        /// What is wrong (untrusted text escaped).
        what: String,
    },
}

/// The images `path` holds, sorted and without repeats, after checking every one is complete
/// (see the module docs). An archive that names no image is refused: k3s would import
/// nothing from it.
pub fn archive_images(path: &Path) -> Result<Vec<String>, ArchiveError> {
    let io = |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    };
    let invalid = |what: String| ArchiveError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 6];
    let n = read_up_to(&mut f, &mut magic).map_err(io)?;
    if let Some(compression) = compression(&magic[..n]) {
        return Err(ArchiveError::Compressed {
            path: path.to_path_buf(),
            compression,
        });
    }
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let contents = Contents::read(f, len).map_err(invalid)?;
    let names = contents.images().map_err(invalid)?;
    if names.is_empty() {
        return Err(invalid(
            "names no image (no tagged entry in index.json or manifest.json)".into(),
        ));
    }
    Ok(names.into_iter().collect())
}

fn read_up_to(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn compression(magic: &[u8]) -> Option<&'static str> {
    [
        (&[0x1f, 0x8b][..], "gzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0][..], "xz"),
        (&b"BZh"[..], "bzip2"),
        (&[0x04, 0x22, 0x4d, 0x18][..], "lz4"),
    ]
    .into_iter()
    .find(|(m, _)| magic.starts_with(m))
    .map(|(_, c)| c)
}

/// What one pass over the tar keeps: every regular file's size, and the small JSON files.
#[derive(Debug, Default)]
struct Contents {
    sizes: BTreeMap<String, u64>,
    json: BTreeMap<String, Vec<u8>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    #[serde(default)]
    layers: Vec<String>,
}

fn esc(s: &str) -> String {
    s.escape_debug().to_string()
}
// Every text an archive chooses goes through `esc` before it is part of an error, the tar
// crate's and serde_json's messages too: they quote member names and JSON strings.

/// `name` as kept: without a leading `./`.
fn clean(name: &str) -> String {
    name.trim_start_matches("./").to_string()
}

/// Whether a tar member is one of the JSON documents kept: the top-level index and manifest,
/// and blobs small enough to be a manifest or an index (configs too, read only if named).
fn keep_json(name: &str, size: u64) -> bool {
    size <= MAX_ARCHIVE_JSON
        && (name == "index.json" || name == "manifest.json" || name.starts_with("blobs/"))
}

impl Contents {
    /// One pass over the tar's headers; a member that is not kept is seeked over, not read
    /// (every boot's `images` check reads an airgap archive of hundreds of MB this way).
    /// `len`: the archive's size, which every member's data must end within (a seek past the
    /// end reads as the end of the archive, so a truncated one is caught here).
    fn read(r: impl Read + std::io::Seek, len: u64) -> Result<Contents, String> {
        let mut c = Contents::default();
        let mut ar = tar::Archive::new(r);
        let entries = ar
            .entries_with_seek()
            .map_err(|e| format!("not a tar: {}", esc(&e.to_string())))?;
        for entry in entries {
            let mut e = entry.map_err(|e| format!("not a tar: {}", esc(&e.to_string())))?;
            let end = e.raw_file_position().saturating_add(e.size());
            if end > len {
                return Err(format!(
                    "truncated: a member's data ends at byte {end}, the archive has {len}"
                ));
            }
            if !e.header().entry_type().is_file() {
                continue;
            }
            let name = clean(
                &e.path()
                    .map_err(|e| format!("a member's name: {}", esc(&e.to_string())))?
                    .to_string_lossy(),
            );
            let size = e.size();
            if keep_json(&name, size) {
                let mut buf = Vec::with_capacity(size as usize);
                e.read_to_end(&mut buf).map_err(|err| {
                    format!("reading '{}': {}", esc(&name), esc(&err.to_string()))
                })?;
                c.json.insert(name.clone(), buf);
            }
            c.sizes.insert(name, size);
        }
        Ok(c)
    }

    /// Every image name the archive holds, each checked complete.
    fn images(&self) -> Result<BTreeSet<String>, String> {
        if !self.sizes.contains_key("index.json") && !self.sizes.contains_key("manifest.json") {
            return Err(
                "has neither index.json (OCI image layout) nor manifest.json (docker archive)"
                    .into(),
            );
        }
        let mut names = BTreeSet::new();
        if self.sizes.contains_key("index.json") {
            names.extend(self.oci_images()?);
        }
        if self.sizes.contains_key("manifest.json") {
            names.extend(self.docker_images()?);
        }
        Ok(names)
    }

    fn doc<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T, String> {
        let bytes = self
            .json
            .get(name)
            .ok_or_else(|| format!("'{}' is larger than {MAX_ARCHIVE_JSON} bytes", esc(name)))?;
        serde_json::from_slice(bytes)
            .map_err(|e| format!("'{}' is not valid: {}", esc(name), esc(&e.to_string())))
    }

    fn oci_images(&self) -> Result<Vec<String>, String> {
        let index: ImageIndex = self.doc("index.json")?;
        let mut names = Vec::new();
        for d in &index.manifests {
            self.check_descriptor(d, 0)?;
            for key in [ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME] {
                if let Some(n) = d.annotations.get(key) {
                    names.push(check_name(n)?);
                }
            }
        }
        Ok(names)
    }

    /// `d`'s blob is in the archive at its size, and so is everything it lists (an image
    /// index one level down, then its manifests' config and layers).
    fn check_descriptor(&self, d: &Descriptor, depth: u8) -> Result<(), String> {
        let path = self.blob(d)?;
        if INDEX_MEDIA.contains(&d.media_type.as_str()) {
            if depth > 0 {
                return Err(format!(
                    "image index '{}' nests another index",
                    esc(&d.digest)
                ));
            }
            let inner: ImageIndex = self.doc(&path)?;
            for m in &inner.manifests {
                self.check_descriptor(m, depth + 1)?;
            }
            return Ok(());
        }
        let m: ImageManifest = self.doc(&path)?;
        for blob in std::iter::once(&m.config).chain(&m.layers) {
            self.blob(blob)?;
        }
        Ok(())
    }

    /// The member holding `d`'s blob, present at `d`'s size.
    fn blob(&self, d: &Descriptor) -> Result<String, String> {
        let (alg, hex) = d
            .digest
            .split_once(':')
            .filter(|(a, h)| {
                !a.is_empty()
                    && a.bytes().all(|b| b.is_ascii_alphanumeric())
                    && !h.is_empty()
                    && h.bytes().all(|b| b.is_ascii_hexdigit())
            })
            .ok_or_else(|| format!("'{}' is not a digest", esc(&d.digest)))?;
        let path = format!("blobs/{alg}/{hex}");
        match self.sizes.get(&path) {
            Some(&s) if s == d.size => Ok(path),
            Some(&s) => Err(format!(
                "blob {} is {s} bytes, its descriptor says {}",
                d.digest, d.size
            )),
            // `d.digest` passed the hex check above: nothing in it to escape.
            None => Err(format!("blob {} is missing", d.digest)),
        }
    }

    fn docker_images(&self) -> Result<Vec<String>, String> {
        let entries: Vec<DockerEntry> = self.doc("manifest.json")?;
        let mut names = Vec::new();
        for e in &entries {
            for member in std::iter::once(&e.config).chain(&e.layers) {
                if !self.sizes.contains_key(&clean(member)) {
                    return Err(format!(
                        "manifest.json names '{}', which is not in the archive",
                        esc(member)
                    ));
                }
            }
            for t in e.repo_tags.iter().flatten() {
                names.push(check_name(t)?);
            }
        }
        Ok(names)
    }
}

/// An image name as kept in a manifest: 1-255 printable ASCII characters without spaces.
fn check_name(n: &str) -> Result<String, String> {
    if n.is_empty() || n.len() > 255 || !n.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("'{}' is not an image name", esc(n)));
    }
    Ok(n.to_string())
}

#[cfg(test)]
mod tests;
