//! Offline bundles: one file holding a whole signed release, for sites without a network (a
//! USB stick, a disk carried in) — `k3os-ops release bundle` writes one, `k3os-ops upgrade
//! --bundle FILE` stages from it with exactly the checks of a network stage (signature,
//! sha256 of every artifact and chunk index, generation floor, version binding): a bundle is
//! just another [`Source`](crate::Source), [`Source::Bundle`](crate::Source::Bundle).
//!
//! # Format, version 1
//!
//! A POSIX tar archive (GNU headers for long names; mode 0644, owner 0, mtime 0, so the same
//! release always gives the same bytes). Members, in this order:
//! 1. `k3os-bundle.json`: `{"format": 1, "version": …, "generation": …}`. Not signed and not
//!    trusted: it only says how to read the rest. A reader refuses a newer `format` by name.
//! 2. `release/manifest.json` and `release/manifest.json.sig`, then every file the manifest
//!    names (the artifacts, their chunk indexes, boot scripts) under `release/<its path>`.
//! 3. `channel/…`: reserved for the signed channel metadata (to come with signed channels);
//!    readers of format 1 ignore members outside `release/`.
//!
//! Why tar (the `tar` crate: pure Rust, the one cargo itself uses): any machine can list or
//! unpack a bundle with the tools it has (`tar tvf`), it is written as a stream, and each
//! member's bytes are one contiguous range of the file, so a stage reads artifacts by offset
//! straight from the bundle — random access for chunked writes and resume, no unpacking, no
//! second copy of a 1 GiB image on the node.
//!
//! A damaged bundle fails naming the member: a tampered member by the signature or sha256 it
//! no longer matches (at `FILE:release/<path>`), a truncated one by where it ends and where the
//! file does.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::manifest::{Manifest, MANIFEST_FILE, SIGNATURE_FILE};

/// The bundle format this build writes and the newest it reads.
pub const FORMAT: u32 = 1;
/// The first member: how to read the rest.
pub const HEADER_MEMBER: &str = "k3os-bundle.json";
/// The release's files are under this prefix.
pub const RELEASE_DIR: &str = "release/";

/// `k3os-bundle.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleHeader {
    /// The bundle format ([`FORMAT`]); a newer one is refused.
    pub format: u32,
    /// The release's version string (untrusted until its manifest verifies).
    pub version: String,
    /// The release's generation (untrusted until its manifest verifies).
    pub generation: u64,
}

/// An opened bundle: where each release file's bytes are in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// The bundle file.
    pub path: PathBuf,
    /// Its first member, as read.
    pub header: BundleHeader,
    /// Release file name (as the manifest names it) → (offset of its data, size).
    members: BTreeMap<String, (u64, u64)>,
}

fn bad(path: &Path, what: String) -> Error {
    Error::Fetch {
        location: path.display().to_string(),
        what,
        retryable: false,
    }
}

impl Bundle {
    /// Read the member list of the bundle at `path` (headers only; the data is read later, by
    /// range). Refuses a file that is not a bundle, a newer format, and a truncated bundle.
    pub fn open(path: &Path) -> Result<Bundle> {
        let f = File::open(path).map_err(|e| Error::io("open bundle", path, e))?;
        let len = f
            .metadata()
            .map_err(|e| Error::io("stat bundle", path, e))?
            .len();
        let mut ar = tar::Archive::new(f);
        let entries = ar
            .entries_with_seek()
            .map_err(|e| bad(path, format!("not a bundle (tar): {e}")))?;
        let mut members = BTreeMap::new();
        let mut header: Option<BundleHeader> = None;
        let mut last = String::from("(start)");
        for entry in entries {
            let mut e = entry.map_err(|e| {
                bad(
                    path,
                    format!("cannot read the member after {last}: {e} (truncated or not a bundle)"),
                )
            })?;
            let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
            let (offset, size) = (e.raw_file_position(), e.size());
            if offset.saturating_add(size) > len {
                return Err(bad(
                    path,
                    format!(
                        "truncated: member {name} needs bytes {offset}..{} but the file ends at {len}",
                        offset.saturating_add(size)
                    ),
                ));
            }
            if header.is_none() {
                header = Some(read_header(path, &name, &mut e)?);
            } else if let Some(file) = name.strip_prefix(RELEASE_DIR) {
                members.insert(file.to_string(), (offset, size));
            }
            last = name;
        }
        let header = header.ok_or_else(|| bad(path, "empty: no members".into()))?;
        Ok(Bundle {
            path: path.to_path_buf(),
            header,
            members,
        })
    }

    /// Where release file `name` is, for messages: `FILE:release/<name>`.
    pub fn location(&self, name: &str) -> String {
        format!("{}:{RELEASE_DIR}{name}", self.path.display())
    }

    /// Release file `name`'s (offset, size) in the bundle.
    pub fn member(&self, name: &str) -> Result<(u64, u64)> {
        self.members.get(name).copied().ok_or_else(|| Error::Fetch {
            location: self.location(name),
            what: "the bundle has no such member (truncated, or not made from this release)".into(),
            retryable: false,
        })
    }

    /// Release file `name` from byte `offset` on.
    pub fn open_at(&self, name: &str, offset: u64) -> Result<Box<dyn Read + Send>> {
        let (start, size) = self.member(name)?;
        let mut f = File::open(&self.path).map_err(|e| Error::io("open bundle", &self.path, e))?;
        f.seek(SeekFrom::Start(start + offset.min(size)))
            .map_err(|e| Error::io("seek in bundle", &self.path, e))?;
        Ok(Box::new(f.take(size - offset.min(size))))
    }
}

/// The first member must be the bundle header, of a format this build reads.
fn read_header(path: &Path, name: &str, e: &mut impl Read) -> Result<BundleHeader> {
    if name != HEADER_MEMBER {
        return Err(bad(
            path,
            format!("not a bundle: its first member is {name}, not {HEADER_MEMBER}"),
        ));
    }
    let mut bytes = Vec::new();
    e.take(64 << 10)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("read bundle header", path, e))?;
    let h: BundleHeader =
        serde_json::from_slice(&bytes).map_err(|e| bad(path, format!("{HEADER_MEMBER}: {e}")))?;
    if h.format > FORMAT {
        return Err(bad(
            path,
            format!(
                "bundle format {} is newer than this build reads ({FORMAT}); upgrade k3os-ops first",
                h.format
            ),
        ));
    }
    Ok(h)
}

/// The files of the release in `dir` that go into its bundle, in order: manifest, signature,
/// then every file the manifest names (the slot files, then every payload's, of any kind: a
/// bundle carries the whole release).
fn release_files(m: &Manifest) -> Vec<String> {
    let mut out = vec![MANIFEST_FILE.to_string(), SIGNATURE_FILE.to_string()];
    for e in m.file_entries() {
        out.push(e.path.clone());
        out.extend(e.chunks.iter().map(|c| c.path.clone()));
    }
    out.extend(
        m.boot
            .iter()
            .flat_map(|b| &b.scripts)
            .map(|s| s.path.clone()),
    );
    out
}

/// Write the release in directory `dir` as a bundle at `out` (via a temporary file renamed
/// into place). Nothing is trusted here: the stage that reads the bundle checks everything.
/// Returns the header written.
pub fn write(dir: &Path, out: &Path) -> Result<BundleHeader> {
    let mpath = dir.join(MANIFEST_FILE);
    let mbytes = std::fs::read(&mpath).map_err(|e| Error::io("read", &mpath, e))?;
    let m = Manifest::parse(&mbytes).map_err(|source| Error::Manifest {
        location: mpath.display().to_string(),
        source,
    })?;
    let header = BundleHeader {
        format: FORMAT,
        version: m.version.clone(),
        generation: m.generation,
    };
    let tmp = out.with_extension("partial");
    let f = File::create(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(f));
    let hbytes = serde_json::to_vec_pretty(&header).expect("header serializes");
    append(
        &mut b,
        HEADER_MEMBER,
        hbytes.len() as u64,
        &hbytes[..],
        &tmp,
    )?;
    for name in release_files(&m) {
        let p = dir.join(&name);
        let f = File::open(&p).map_err(|e| Error::io("open release file", &p, e))?;
        let size = f.metadata().map_err(|e| Error::io("stat", &p, e))?.len();
        append(&mut b, &format!("{RELEASE_DIR}{name}"), size, f, &tmp)?;
    }
    let w = b.into_inner().map_err(|e| Error::io("write", &tmp, e))?;
    let f = w
        .into_inner()
        .map_err(|e| Error::io("write", &tmp, e.into_error()))?;
    f.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
    std::fs::rename(&tmp, out).map_err(|e| Error::io("rename into place", out, e))?;
    Ok(header)
}

fn append<W: std::io::Write>(
    b: &mut tar::Builder<W>,
    name: &str,
    size: u64,
    data: impl Read,
    tmp: &Path,
) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, name, data)
        .map_err(|e| Error::io("write bundle member", tmp, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_format_and_a_foreign_tar_are_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        for (first, body, want) in [
            (
                HEADER_MEMBER,
                br#"{"format":2,"version":"v9","generation":9}"#.to_vec(),
                "bundle format 2 is newer",
            ),
            (
                "etc/passwd",
                b"root:x:0:0".to_vec(),
                "its first member is etc/passwd",
            ),
        ] {
            let p = t.path().join("b.tar");
            let mut b = tar::Builder::new(File::create(&p).unwrap());
            append(&mut b, first, body.len() as u64, &body[..], &p).unwrap();
            b.finish().unwrap();
            drop(b);
            let e = Bundle::open(&p).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("b.tar"), "{e}");
        }
    }
}
