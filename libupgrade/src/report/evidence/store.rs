//! Failure bundles kept on the state partition, and what became of each.
//!
//! Directory `<state_dir>/failure-bundles/v1/` (the `v1` is the layout's version): one file
//! per failed attempt, `g<generation>-a<attempt>-<version>.bundle`, holding the sealed bundle
//! exactly as it is sent, and `bundles.json` (`format: 1`): the bundles kept, oldest first,
//! each with its release, attempt, size and delivery ([`Delivery`]). A bundle for an attempt
//! already kept replaces it (an assessment cut by a power loss runs again on the next boot).
//!
//! Power-cut safe: each file is written to a temporary name, synced and renamed, then the
//! directory synced; the bundle file before `bundles.json`. A bundle file that
//! `bundles.json` does not name (a cut between the two) is adopted as waiting when listed;
//! an entry whose file is gone is forgotten. Bounded: at most `kept` bundles
//! ([`super::BundleSettings::kept`]), the oldest dropped first ([`to_drop`]).

use std::path::{Path, PathBuf};

use fleet_report::{Bundle, Failure};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::report::spool::write_file;

/// The bundles' directory inside the state directory.
pub const BUNDLE_DIR: &str = "failure-bundles/v1";
const META: &str = "bundles.json";
const FORMAT: u32 = 1;

/// What became of a kept bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum Delivery {
    /// Not sent yet (or the collector could not take it yet).
    Waiting,
    /// The collector stored it (201) or already held it (200).
    Sent {
        /// Unix seconds.
        at: u64,
        /// The collector's status.
        status: u16,
    },
    /// Refused for now (401, 403, …): tried again after `next_at`, a few times in all.
    SetAside {
        /// The last refusal's status.
        status: u16,
        /// The collector's reason.
        reason: String,
        /// Tries so far.
        tries: u32,
        /// Not tried before this time (Unix seconds).
        next_at: u64,
    },
    /// Refused for good (400, 409, 413, or refused every try): never sent again.
    Refused {
        /// The last status.
        status: u16,
        /// The collector's reason.
        reason: String,
    },
}

/// One kept bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its file name in the directory.
    pub file: String,
    /// The release attempted.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// Which attempt.
    pub attempt: u32,
    /// How it failed.
    pub failure: Failure,
    /// Unix seconds when it was written.
    pub at: u64,
    /// The sealed size in bytes (what sending it costs).
    pub bytes: u64,
    /// What became of it.
    pub delivery: Delivery,
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    format: u32,
    bundles: Vec<Entry>,
}

/// The file name of `b`'s attempt.
pub fn file_name(b: &Bundle) -> String {
    let slug: String = b
        .version
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .take(64)
        .collect();
    format!("g{}-a{}-{slug}.bundle", b.generation, b.attempt)
}

/// The files to drop so that `entries` (oldest first) keep at most `kept`: the oldest.
pub fn to_drop(entries: &[Entry], kept: usize) -> Vec<String> {
    let over = entries.len().saturating_sub(kept.max(1));
    entries[..over].iter().map(|e| e.file.clone()).collect()
}

/// The kept bundles of one node.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store of `state_dir` (nothing is read or created yet).
    pub fn new(state_dir: &Path) -> Store {
        Store {
            dir: state_dir.join(BUNDLE_DIR),
        }
    }

    /// The path of a kept bundle's file.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// An exclusive lock over `bundles.json` (not held while sending).
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io("create", &self.dir, e))?;
        let path = self.dir.join("bundles.lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open lock", &path, e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| Error::io("lock", &path, std::io::Error::from(e)))
    }

    fn read_meta(&self) -> Result<Vec<Entry>> {
        let path = self.dir.join(META);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
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
                    "failure bundle list format {} is newer than this build reads ({FORMAT})",
                    h.format
                ),
            }),
            _ => Ok(serde_json::from_slice::<Meta>(&bytes)
                .map(|m| m.bundles)
                .unwrap_or_else(|e| {
                    log::warn!("{} is damaged ({e}): bundles re-listed", path.display());
                    Vec::new()
                })),
        }
    }

    fn save(&self, entries: &[Entry]) -> Result<()> {
        let meta = Meta {
            format: FORMAT,
            bundles: entries.to_vec(),
        };
        let bytes = serde_json::to_vec_pretty(&meta).expect("bundle list serializes");
        write_file(&self.dir.join(META), &bytes)
    }

    /// The kept bundles, oldest first, `bundles.json` reconciled with the files (call under
    /// [`Self::lock`] before changing anything).
    pub fn list(&self) -> Result<Vec<Entry>> {
        let mut entries = self.read_meta()?;
        let files = self.files()?;
        entries.retain(|e| files.iter().any(|(f, _)| *f == e.file));
        for (file, mtime) in files {
            if entries.iter().any(|e| e.file == file) {
                continue;
            }
            let path = self.dir.join(&file);
            let bytes = std::fs::read(&path).map_err(|e| Error::io("read", &path, e))?;
            match fleet_report::open_bundle(&bytes) {
                Ok(o) => entries.push(Entry {
                    file,
                    version: o.bundle.version,
                    generation: o.bundle.generation,
                    attempt: o.bundle.attempt,
                    failure: o.bundle.failure,
                    at: mtime,
                    bytes: bytes.len() as u64,
                    delivery: Delivery::Waiting,
                }),
                Err(e) => log::warn!("{}: not a failure bundle ({e}): ignored", path.display()),
            }
        }
        entries.sort_by_key(|e| e.at);
        Ok(entries)
    }

    fn files(&self) -> Result<Vec<(String, u64)>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("list", &self.dir, e)),
        };
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io("list", &self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".bundle") {
                continue;
            }
            let mtime = entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            out.push((name, mtime));
        }
        Ok(out)
    }

    /// Keep `sealed` (the sealed `b`) written at `at`, replacing a bundle of the same attempt,
    /// then drop the oldest beyond `kept`; returns the entries dropped.
    pub fn put(&self, b: &Bundle, sealed: &[u8], at: u64, kept: usize) -> Result<Vec<Entry>> {
        let _lock = self.lock()?;
        let file = file_name(b);
        write_file(&self.dir.join(&file), sealed)?;
        let mut entries = self.list()?;
        entries.retain(|e| e.file != file);
        entries.push(Entry {
            file,
            version: b.version.clone(),
            generation: b.generation,
            attempt: b.attempt,
            failure: b.failure,
            at,
            bytes: sealed.len() as u64,
            delivery: Delivery::Waiting,
        });
        let drop = to_drop(&entries, kept);
        let (gone, keep): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| drop.contains(&e.file));
        self.save(&keep)?;
        for e in &gone {
            let path = self.dir.join(&e.file);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(Error::io("drop failure bundle", &path, err)),
            }
        }
        Ok(gone)
    }

    /// Record `delivery` for the kept bundles named in `changes` (those gone meanwhile are
    /// skipped).
    pub fn record(&self, changes: &[(String, Delivery)]) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let _lock = self.lock()?;
        let mut entries = self.list()?;
        for (file, d) in changes {
            if let Some(e) = entries.iter_mut().find(|e| e.file == *file) {
                e.delivery = d.clone();
            }
        }
        self.save(&entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(file: &str, at: u64) -> Entry {
        Entry {
            file: file.into(),
            version: "v2".into(),
            generation: 6,
            attempt: 1,
            failure: Failure::HealthCheck,
            at,
            bytes: 100,
            delivery: Delivery::Waiting,
        }
    }

    #[test]
    fn the_oldest_beyond_the_bound_are_dropped() {
        let e: Vec<Entry> = (0..5).map(|i| entry(&format!("f{i}"), i)).collect();
        assert_eq!(to_drop(&e, 3), ["f0", "f1"]);
        assert!(to_drop(&e, 5).is_empty());
        assert_eq!(to_drop(&e, 0).len(), 4, "at least one is always kept");
    }
}
