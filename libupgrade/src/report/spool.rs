//! The spool: reports made and not yet accepted by the collector, on the state partition.
//!
//! Directory `<state_dir>/report-spool/v1/` (the `v1` is the layout's version: a later layout
//! takes a new name): one file per report, `<seq, 20 digits>.report`, holding the signed
//! envelope exactly as it is sent, and `spool.json` (`format: 1`): the next sequence number,
//! the running total of reports dropped (carried in every report's `dropped`, so the collector
//! learns it from whichever report arrives), the last
//! channel and the last wait reported (so a waiting node reports its wait once), and the
//! reports the collector refused, set aside with their status, reason and tries
//! ([`super::refusal`]; optional fields of format 1: a spool written before them reads as
//! having none, and a build before them ignores them).
//!
//! Bounded by [`Limits`]: when a new report makes it hold more files or bytes, the oldest are
//! dropped and counted. Numbers are reserved in `spool.json` before the report file is written,
//! so a cut between the two leaves a gap, never two reports with one number. A missing or
//! damaged `spool.json` starts again at the current Unix time in milliseconds, above every
//! number used before as long as the node made fewer than one report per millisecond.

use std::io::Write;
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::refusal::{Dropped, Refusal};
use crate::error::{Error, Result};

/// The spool's directory inside the state directory.
pub const SPOOL_DIR: &str = "report-spool/v1";
const META: &str = "spool.json";
const FORMAT: u32 = 1;

/// How much the spool may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most reports kept.
    pub files: usize,
    /// Most bytes of reports kept.
    pub bytes: u64,
}

impl Default for Limits {
    /// 256 reports and 128 KiB: weeks of outcomes of a node whose link is down.
    fn default() -> Self {
        Limits {
            files: 256,
            bytes: 128 * 1024,
        }
    }
}

/// `spool.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Format, 1.
    pub format: u32,
    /// The number the next report gets.
    pub next_seq: u64,
    /// Reports dropped in all (spool full, or refused for good by the collector).
    pub dropped: u64,
    /// The channel of the last release resolved from one (empty: none yet).
    #[serde(default)]
    pub channel: String,
    /// The rollout seed of the last resolution through a rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u32>,
    /// The last wait reported (release, reason, start), so it is reported once.
    #[serde(default)]
    pub last_wait: Option<String>,
    /// Reports the collector refused, set aside for a later try, by number
    /// ([`super::refusal`]); absent in spools written before refusals were set aside (read
    /// as none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refused: BTreeMap<u64, Refusal>,
    /// Refused reports dropped so far, and the last one (for `slot status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_dropped: Option<Dropped>,
}

/// The spool of one node.
#[derive(Debug, Clone)]
pub struct Spool {
    dir: PathBuf,
    limits: Limits,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(1)
        .max(1)
}

/// Write `bytes` to `path` through a temporary file (fsync, rename, fsync of the directory;
/// no syncfs: a report is not worth flushing the state partition for).
pub(super) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename over", path, e))?;
    bootconfig::fsync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(())
}

impl Spool {
    /// The spool of `state_dir` (nothing is read or created yet).
    pub fn new(state_dir: &Path, limits: Limits) -> Spool {
        Spool {
            dir: state_dir.join(SPOOL_DIR),
            limits,
        }
    }

    /// The spool directory.
    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// An exclusive lock over the spool's bookkeeping (not held while sending).
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io("create spool", &self.dir, e))?;
        let path = self.dir.join("spool.lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open lock", &path, e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| Error::io("lock", &path, std::io::Error::from(e)))
    }

    /// `spool.json`; a fresh one (numbers from the current time) when missing or damaged, an
    /// error when it is of a newer format (nothing is rewritten then).
    pub fn meta(&self) -> Result<Meta> {
        let path = self.dir.join(META);
        let fresh = Meta {
            format: FORMAT,
            next_seq: now_ms(),
            dropped: 0,
            channel: String::new(),
            seed: None,
            last_wait: None,
            refused: BTreeMap::new(),
            refused_dropped: None,
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(fresh),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        #[derive(Deserialize)]
        struct Head {
            format: u32,
        }
        match serde_json::from_slice::<Head>(&bytes) {
            Ok(h) if h.format > FORMAT => Err(Error::State {
                path,
                what: format!(
                    "spool format {} is newer than this build reads ({FORMAT}); nothing was rewritten",
                    h.format
                ),
            }),
            _ => Ok(serde_json::from_slice::<Meta>(&bytes)
                .ok()
                .filter(|m| m.format == FORMAT && m.next_seq > 0)
                .unwrap_or_else(|| {
                    log::warn!("{} is damaged: numbering reports from the clock", path.display());
                    fresh
                })),
        }
    }

    /// Replace `spool.json`.
    pub fn save_meta(&self, meta: &Meta) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io("create spool", &self.dir, e))?;
        let bytes = serde_json::to_vec(meta).expect("spool meta serializes");
        write_file(&self.dir.join(META), &bytes)
    }

    /// Keep one signed report under its number (the caller reserved it in `spool.json`), then
    /// drop the oldest beyond the limits; returns how many were dropped.
    pub fn put(&self, seq: u64, bytes: &[u8]) -> Result<u64> {
        write_file(&self.dir.join(format!("{seq:020}.report")), bytes)?;
        let mut files = self.pending()?;
        let mut total: u64 = files.iter().map(|(_, _, n)| n).sum();
        let mut dropped = 0;
        while files.len() > self.limits.files || total > self.limits.bytes {
            let (s, path, n) = files.remove(0);
            std::fs::remove_file(&path).map_err(|e| Error::io("drop report", &path, e))?;
            log::warn!("report spool full: dropped report {s} ({n} bytes), the oldest");
            total -= n;
            dropped += 1;
        }
        Ok(dropped)
    }

    /// The reports kept, oldest first: number, file, size.
    pub fn pending(&self) -> Result<Vec<(u64, PathBuf, u64)>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("list spool", &self.dir, e)),
        };
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io("list spool", &self.dir, e))?;
            let name = entry.file_name();
            let Some(seq) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".report"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((seq, entry.path(), len));
        }
        out.sort_by_key(|(s, _, _)| *s);
        Ok(out)
    }

    /// Forget report `seq` (accepted, or refused for good); a report already gone is fine.
    pub fn remove(&self, seq: u64) -> Result<()> {
        let path = self.dir.join(format!("{seq:020}.report"));
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove report", &path, e)),
        }
    }
}
