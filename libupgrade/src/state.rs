//! The updater's own record of both slots: what is in each, what state it is in, and the log of
//! every boot decision with the generation it concerned, so `slot status` can say *why* a slot
//! booted (tries left, fallback taken, checks failed).
//!
//! The bootloader's files say what boots next; this file says what each slot holds. It lives
//! on the state partition as JSON and is replaced atomically (temp, fsync, rename, fsync dir).
//! Slot lifecycle:
//!
//! ```text
//!  Empty ──stage──▶ Invalid ──verified──▶ Staged ──activate──▶ Trying ──confirm ok──▶ Good
//!                     ▲  (write failed: stays Invalid)            │
//!                     └──────── next stage ◀── Bad ◀─ checks fail / tries run out / rollback
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use bootconfig::Slot;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// File name of the state file inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// The state file's format. Format 1 is what v0.1.0 wrote, and both slots of a node may run
/// different releases that read and write the same file (a v0.2.0 trial falls back to a v0.1.0
/// slot), so format 1 only grows in ways every format-1 reader accepts: new fields are
/// optional (serde defaults; older readers skip unknown fields) and no enum gains a variant
/// (an older reader would refuse the whole file). `tests/state_formats.rs` holds the current
/// types to that against v0.1.0's own output. A change that cannot follow these rules bumps
/// the number and is rolled out in two releases (the first reads both and writes the old).
const FORMAT: u32 = 1;
/// Decisions kept in the log (oldest dropped first).
const HISTORY: usize = 64;

/// What a slot holds, as far as the updater knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlotState {
    /// Never written by us.
    Empty,
    /// Being written, or a write failed: its content must not be trusted.
    Invalid,
    /// Completely written and verified; not yet tried.
    Staged,
    /// Activated: the bootloader is trying it.
    Trying,
    /// Booted and passed its health checks.
    Good,
    /// Failed to boot, failed its checks, or was rolled back from.
    Bad,
}

impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SlotState::Empty => "empty",
            SlotState::Invalid => "invalid",
            SlotState::Staged => "staged",
            SlotState::Trying => "trying",
            SlotState::Good => "good",
            SlotState::Bad => "bad",
        })
    }
}

/// One slot's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    pub state: SlotState,
    pub version: Option<String>,
    pub generation: Option<u64>,
    /// sha256 of the manifest that was staged (identifies the exact release).
    pub manifest_sha256: Option<String>,
    /// Unix seconds of the last state change.
    pub since: u64,
    /// How the bytes of the release staged into this slot were obtained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferStats>,
}

/// Bytes of one update by origin: `fetched` over the network (all attempts that recorded it),
/// `reused` copied from what the node already held (the running slot; chunks an interrupted
/// attempt left in the target count as fetched by that attempt), out of `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TransferStats {
    pub fetched: u64,
    pub reused: u64,
    pub total: u64,
}

impl SlotRecord {
    pub fn empty() -> SlotRecord {
        SlotRecord {
            state: SlotState::Empty,
            version: None,
            generation: None,
            manifest_sha256: None,
            since: 0,
            transfer: None,
        }
    }
}

/// What kind of decision was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    Bootstrap,
    StageStarted,
    Staged,
    StageFailed,
    Activated,
    Confirmed,
    HealthFailed,
    FallbackTaken,
    ActivationLost,
    RolledBack,
    MarkedBad,
    Booted,
}

/// A logged decision: when, about which slot and generation, what and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub at: u64,
    pub slot: Slot,
    pub event: Event,
    pub version: Option<String>,
    pub generation: Option<u64>,
    pub why: String,
}

/// The whole state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub format: u32,
    pub slots: BTreeMap<Slot, SlotRecord>,
    pub history: Vec<Decision>,
    /// A slot handed to the bootloader for trial and not yet settled.
    #[serde(default)]
    pub activation: Option<crate::updater::Activation>,
    /// The boot in which `confirm` last ran (one `booted` decision per boot).
    #[serde(default)]
    pub last_boot_id: Option<String>,
    /// The last boot assessment's verdict (see [`crate::assess`]).
    #[serde(default)]
    pub verdict: Option<crate::assess::Verdict>,
}

impl Default for State {
    fn default() -> Self {
        let mut slots = BTreeMap::new();
        for s in Slot::ALL {
            slots.insert(s, SlotRecord::empty());
        }
        State {
            format: FORMAT,
            slots,
            history: Vec::new(),
            activation: None,
            last_boot_id: None,
            verdict: None,
        }
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl State {
    pub fn slot(&self, s: Slot) -> &SlotRecord {
        self.slots.get(&s).expect("both slots always present")
    }

    pub fn slot_mut(&mut self, s: Slot) -> &mut SlotRecord {
        self.slots.entry(s).or_insert_with(SlotRecord::empty)
    }

    /// Set a slot's state and log why.
    pub fn transition(&mut self, s: Slot, state: SlotState, event: Event, why: impl Into<String>) {
        let rec = self.slot_mut(s);
        rec.state = state;
        rec.since = now();
        let (version, generation) = (rec.version.clone(), rec.generation);
        self.log(s, event, version, generation, why);
    }

    /// Append a decision to the log.
    pub fn log(
        &mut self,
        slot: Slot,
        event: Event,
        version: Option<String>,
        generation: Option<u64>,
        why: impl Into<String>,
    ) {
        let why = why.into();
        log::info!("slot {slot} {event:?} (version {version:?}, generation {generation:?}): {why}");
        self.history.push(Decision {
            at: now(),
            slot,
            event,
            version,
            generation,
            why,
        });
        if self.history.len() > HISTORY {
            let drop = self.history.len() - HISTORY;
            self.history.drain(..drop);
        }
    }

    /// The newest decision about `slot`.
    pub fn last_decision(&self, slot: Slot) -> Option<&Decision> {
        self.history.iter().rev().find(|d| d.slot == slot)
    }
}

/// Reads and atomically replaces the state file.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
}

impl StateStore {
    pub fn new(state_dir: &Path) -> StateStore {
        StateStore {
            path: state_dir.join(STATE_FILE),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An exclusive advisory lock (`flock`) next to the state file, held until the guard is
    /// dropped: for read-decide-write sequences that several processes may run at once.
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>> {
        let path = self.path.with_extension("lock");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("create state dir", dir, e))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open lock", &path, e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| Error::io("lock", &path, std::io::Error::from(e)))
    }

    /// Load the state; a missing file is a fresh node (both slots empty). A file that exists
    /// but does not parse is an error: guessing could lose the record of the good slot.
    pub fn load(&self) -> Result<State> {
        #[derive(Deserialize)]
        struct Head {
            format: u32,
        }
        match std::fs::read(&self.path) {
            Ok(bytes) => {
                let invalid = |e: serde_json::Error| Error::State {
                    path: self.path.clone(),
                    what: format!("not valid state JSON: {e}"),
                };
                // The format first: a newer file may not parse as this build's types at all.
                let head: Head = serde_json::from_slice(&bytes).map_err(invalid)?;
                if head.format != FORMAT {
                    return Err(Error::State {
                        path: self.path.clone(),
                        what: if head.format > FORMAT {
                            format!("format {} is newer than this build of k3os-ops reads (format {FORMAT}); nothing was rewritten: upgrade k3os-ops first", head.format)
                        } else {
                            format!("format {} does not exist (formats start at 1)", head.format)
                        },
                    });
                }
                let st: State = serde_json::from_slice(&bytes).map_err(invalid)?;
                // Every reader looks both slots up (`State::slot`); a file without one is
                // damaged, and guessing its record could lose the good slot.
                if let Some(s) = Slot::ALL.into_iter().find(|s| !st.slots.contains_key(s)) {
                    return Err(Error::State {
                        path: self.path.clone(),
                        what: format!("no record of slot {s}: every state file has both"),
                    });
                }
                Ok(st)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(Error::io("read state", &self.path, e)),
        }
    }

    /// Replace the state file atomically, then announce the write barrier `barrier`.
    pub fn save(&self, st: &State, barrier: &str) -> Result<()> {
        let mut bytes = serde_json::to_vec_pretty(st).expect("state serializes");
        bytes.push(b'\n');
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("create state dir", dir, e))?;
        }
        bootconfig::atomic::write_atomic(&self.path, &bytes)?;
        crate::barrier::hit(barrier);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_round_trip_and_history_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut st = store.load().unwrap();
        assert_eq!(st.slot(Slot::A).state, SlotState::Empty);
        st.slot_mut(Slot::B).version = Some("v2".into());
        for i in 0..100 {
            st.transition(Slot::B, SlotState::Staged, Event::Staged, format!("n{i}"));
        }
        store.save(&st, "test").unwrap();
        let back = store.load().unwrap();
        assert_eq!(back, st);
        assert_eq!(back.history.len(), HISTORY);
        assert_eq!(back.last_decision(Slot::B).unwrap().why, "n99");
        assert_eq!(
            back.last_decision(Slot::B).unwrap().version.as_deref(),
            Some("v2")
        );
    }

    #[test]
    fn corrupt_state_is_an_error_not_a_fresh_node() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), b"{\"format\":1,\"slots\":").unwrap();
        let e = StateStore::new(dir.path()).load().unwrap_err().to_string();
        assert!(e.contains("state.json") && e.contains("not valid"), "{e}");
    }

    #[test]
    fn a_state_without_a_slot_record_is_an_error_not_a_panic() {
        // Found by fuzz/ (target `state`): every reader calls `slot()` on both slots.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(STATE_FILE),
            br#"{"format":1,"slots":{"A":{"state":"good","version":"v1","generation":1,
                "manifest_sha256":null,"since":0}},"history":[]}"#,
        )
        .unwrap();
        let e = StateStore::new(dir.path()).load().unwrap_err().to_string();
        assert!(e.contains("state.json") && e.contains("slot B"), "{e}");
    }
}
