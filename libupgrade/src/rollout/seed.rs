//! The node's seed: its stable place in every rollout, and the file that keeps it.
//!
//! A seed is a position in `0..`[`SEED_SPACE`] (a million). A share `s` of the fleet admits
//! the seeds below `s × SEED_SPACE`. Why a million and not updog's 2048: shares are signed in
//! basis points and a million positions hold each basis point exactly (100 positions), so a
//! 1 % wave admits exactly 1 % of the space; and the linear growth between two wave starts
//! moves one position every few seconds instead of letting a block of ~5 nodes per position
//! (10,000 nodes over 2048 positions) reach the origin in the same instant.
//!
//! The file `node-seed.json` in the state directory, next to (never inside) `state.json`, is
//! format 1: `{"format":1,"seed":N}`. It is written once, atomically and power-cut safe
//! (temp file, fsync, rename, fsync of the directory: `bootconfig::atomic::write_atomic`), and
//! never rewritten while it reads well. What [`load_or_create`] does with each case:
//! - no file (a new node, or one made by v0.1.0 or v0.2.0 before this file existed: that is
//!   its migration): a seed is drawn at random and written;
//! - a newer format: refused naming the file and both formats, nothing rewritten (a newer
//!   k3os-ops wrote it and will read it again after a rollback of this one);
//! - damaged (not JSON, no format, format 0, a seed outside the space): a new seed is drawn and
//!   written, and the damaged file is kept aside as `node-seed.json.bad` (replacing an older
//!   one) for inspection; the caller is told both through [`Origin::Replaced`]. The node keeps
//!   updating — a remote site should not stop at a file that only places it in a wave — and
//!   its new place may be in an earlier or a later wave;
//! - unreadable (an I/O error other than "not found"): an error naming the file, nothing
//!   written (what cannot be read may still be good).
//!
//! A re-imaged node has a new state directory and draws a new seed.

use std::path::{Path, PathBuf};

use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Number of seed positions: seeds are `0..SEED_SPACE`.
pub const SEED_SPACE: u32 = 1_000_000;
/// File name of the node's seed in the state directory.
pub const SEED_FILE: &str = "node-seed.json";
/// Suffix of a damaged seed file kept aside.
pub const BAD_SUFFIX: &str = ".bad";
/// The seed file format this build writes and the newest it reads.
pub const SEED_FORMAT: u32 = 1;

/// A position in `0..`[`SEED_SPACE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Seed(u32);

impl Seed {
    /// The seed at position `n`, if `n` is in the space.
    pub fn new(n: u32) -> Option<Seed> {
        (n < SEED_SPACE).then_some(Seed(n))
    }

    /// Its position.
    pub fn get(self) -> u32 {
        self.0
    }

    /// A seed drawn uniformly at random.
    pub fn random() -> Seed {
        Seed(rand::thread_rng().gen_range(0..SEED_SPACE))
    }

    /// A seed derived from a stable identifier (for one seed shared by a whole cluster, e.g. a
    /// namespace's UID): the first 8 bytes of its SHA-256, modulo the space (the bias of a
    /// 64-bit value modulo a million is below 10⁻¹³).
    pub fn derived_from(id: &str) -> Seed {
        let digest = Sha256::digest(id.as_bytes());
        let mut head = [0u8; 8];
        head.copy_from_slice(&digest[..8]);
        let n = u64::from_be_bytes(head) % u64::from(SEED_SPACE);
        Seed(u32::try_from(n).unwrap_or(0))
    }
}

impl TryFrom<u32> for Seed {
    type Error = String;
    fn try_from(n: u32) -> Result<Seed, String> {
        Seed::new(n).ok_or_else(|| format!("seed {n} is outside 0..{SEED_SPACE}"))
    }
}

impl From<Seed> for u32 {
    fn from(s: Seed) -> u32 {
        s.0
    }
}

impl std::fmt::Display for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The seed file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct SeedFile {
    format: u32,
    seed: Seed,
}

/// Where a loaded seed came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Read from the seed file.
    Read,
    /// No seed file: drawn and written now.
    Drawn,
    /// The seed file was damaged: a new seed was drawn and written, the old file kept aside.
    Replaced {
        /// Where the damaged file now is.
        kept_as: PathBuf,
        /// What was wrong with it.
        what: String,
    },
}

/// The node's seed and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The seed.
    pub seed: Seed,
    /// How it was found.
    pub origin: Origin,
}

/// A seed file that cannot be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// Written by a newer build; left alone.
    #[error("{path}: format {found} is newer than this build of k3os-ops reads (format {SEED_FORMAT}); nothing was rewritten: upgrade k3os-ops")]
    Newer {
        /// The file.
        path: PathBuf,
        /// The format found.
        found: u64,
    },
    /// Could not be read, written or kept aside.
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Could not be written atomically.
    #[error("{path}: cannot write the node's seed: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: bootconfig::Error,
    },
}

/// Why the bytes of a seed file are not a seed (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// A newer format.
    Newer(u64),
    /// Damaged, with what is wrong (untrusted text escaped).
    Damaged(String),
}

/// Read a seed file's bytes: the format first (a newer file may not parse as this one).
pub fn parse(bytes: &[u8]) -> Result<Seed, Unusable> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| Unusable::Damaged(format!("not JSON: {e}")))?;
    match v.get("format").and_then(serde_json::Value::as_u64) {
        Some(f) if f == u64::from(SEED_FORMAT) => {}
        Some(f) if f > u64::from(SEED_FORMAT) => return Err(Unusable::Newer(f)),
        Some(f) => return Err(Unusable::Damaged(format!("format {f} does not exist"))),
        None => {
            let found = v
                .get("format")
                .map(|f| f.to_string().escape_default().to_string());
            return Err(Unusable::Damaged(format!(
                "expected a numeric \"format\", found {}",
                found.as_deref().unwrap_or("none")
            )));
        }
    }
    serde_json::from_value::<SeedFile>(v)
        .map(|f| f.seed)
        .map_err(|e| Unusable::Damaged(format!("expected {{\"format\":1,\"seed\":N}}: {e}")))
}

/// The path of the seed file in `state_dir`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(SEED_FILE)
}

/// The node's seed if its file reads well (`None` when there is none), without writing: for
/// `slot status`.
pub fn read(state_dir: &Path) -> Result<Option<Seed>, SeedError> {
    let p = path(state_dir);
    match read_bytes(&p)? {
        None => Ok(None),
        Some(bytes) => match parse(&bytes) {
            Ok(seed) => Ok(Some(seed)),
            Err(Unusable::Newer(found)) => Err(SeedError::Newer { path: p, found }),
            Err(Unusable::Damaged(_)) => Ok(None),
        },
    }
}

/// The node's seed, drawn and written once when there is none (see the module docs for every
/// case).
pub fn load_or_create(state_dir: &Path) -> Result<Loaded, SeedError> {
    let p = path(state_dir);
    let origin = match read_bytes(&p)? {
        None => Origin::Drawn,
        Some(bytes) => match parse(&bytes) {
            Ok(seed) => {
                return Ok(Loaded {
                    seed,
                    origin: Origin::Read,
                })
            }
            Err(Unusable::Newer(found)) => return Err(SeedError::Newer { path: p, found }),
            Err(Unusable::Damaged(what)) => {
                let mut kept = p.clone().into_os_string();
                kept.push(BAD_SUFFIX);
                let kept_as = PathBuf::from(kept);
                std::fs::rename(&p, &kept_as).map_err(|source| SeedError::Io {
                    path: p.clone(),
                    op: "keep the damaged seed file aside",
                    source,
                })?;
                Origin::Replaced { kept_as, what }
            }
        },
    };
    let seed = Seed::random();
    let bytes = serde_json::to_vec(&SeedFile {
        format: SEED_FORMAT,
        seed,
    })
    .expect("a seed file serializes");
    bootconfig::atomic::write_atomic(&p, &bytes)
        .map_err(|source| SeedError::Write { path: p, source })?;
    crate::barrier::hit("seed-written");
    Ok(Loaded { seed, origin })
}

fn read_bytes(p: &Path) -> Result<Option<Vec<u8>>, SeedError> {
    match std::fs::read(p) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SeedError::Io {
            path: p.to_path_buf(),
            op: "read the node's seed",
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_drawn_once_and_then_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let first = load_or_create(dir.path()).unwrap();
        assert_eq!(first.origin, Origin::Drawn);
        let again = load_or_create(dir.path()).unwrap();
        assert_eq!((again.seed, again.origin), (first.seed, Origin::Read));
        assert_eq!(read(dir.path()).unwrap(), Some(first.seed));
        let text = std::fs::read_to_string(path(dir.path())).unwrap();
        assert_eq!(text, format!("{{\"format\":1,\"seed\":{}}}", first.seed));
    }

    #[test]
    fn a_newer_file_is_refused_by_name_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), br#"{"format":2,"seed":"x"}"#).unwrap();
        let e = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(SEED_FILE) && e.contains("format 2 is newer") && e.contains("format 1"),
            "{e}"
        );
        assert!(read(dir.path()).is_err());
        assert_eq!(
            std::fs::read(path(dir.path())).unwrap(),
            br#"{"format":2,"seed":"x"}"#
        );
    }

    #[test]
    fn a_damaged_file_is_kept_aside_and_a_new_seed_drawn() {
        for bad in [
            &b"{\"format\":1,\"se"[..],
            br#"{"seed":5}"#,
            br#"{"format":0,"seed":5}"#,
            br#"{"format":1,"seed":1000000}"#,
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(path(dir.path()), bad).unwrap();
            assert_eq!(read(dir.path()).unwrap(), None);
            let l = load_or_create(dir.path()).unwrap();
            let Origin::Replaced { kept_as, what } = &l.origin else {
                panic!("{:?}", l.origin)
            };
            assert_eq!(std::fs::read(kept_as).unwrap(), bad, "{what}");
            assert!(kept_as.ends_with("node-seed.json.bad"));
            assert_eq!(read(dir.path()).unwrap(), Some(l.seed));
        }
    }

    #[test]
    fn an_unreadable_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(path(dir.path())).unwrap();
        let e = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(e.contains(SEED_FILE) && e.contains("cannot read"), "{e}");
    }

    #[test]
    fn seeds_stay_in_the_space() {
        assert_eq!(Seed::new(SEED_SPACE), None);
        assert_eq!(
            Seed::new(SEED_SPACE - 1).map(Seed::get),
            Some(SEED_SPACE - 1)
        );
        assert_eq!(Seed::derived_from("uid-1"), Seed::derived_from("uid-1"));
        assert_ne!(Seed::derived_from("uid-1"), Seed::derived_from("uid-2"));
        assert!((0..100).all(|_| Seed::random().get() < SEED_SPACE));
    }
}
