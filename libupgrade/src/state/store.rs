//! The state file on disk: read (a newer format refused before its body is read), replaced
//! atomically, and locked for read-decide-write sequences. Its errors are its own
//! ([`StoreError`]): the crate's [`crate::Error`] takes them in (with the same messages), and
//! the state folder depends on nothing above it.

use std::path::{Path, PathBuf};

use bootconfig::Slot;
use serde::Deserialize;

use super::{State, FORMAT, STATE_FILE};

/// Why the state file could not be read, replaced or locked; names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An operating-system call on the file or its directory failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("read state", "lock").
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is damaged or in another format.
    #[error("state file {}: {what}", path.display())]
    Damaged {
        /// The state file.
        path: PathBuf,
        /// What is wrong in it.
        what: String,
    },
    /// The atomic replacement failed.
    #[error(transparent)]
    Write(#[from] bootconfig::Error),
}

type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> StoreError {
        StoreError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Reads and atomically replaces the state file.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
}

impl StateStore {
    /// The store of `state_dir/state.json` (nothing is read or created yet).
    pub fn new(state_dir: &Path) -> StateStore {
        StateStore {
            path: state_dir.join(STATE_FILE),
        }
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An exclusive advisory lock (`flock`) next to the state file, held until the guard is
    /// dropped: for read-decide-write sequences that several processes may run at once.
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>> {
        let path = self.path.with_extension("lock");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create state dir", dir, e))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| StoreError::io("open lock", &path, e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| StoreError::io("lock", &path, std::io::Error::from(e)))
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
                let invalid = |e: serde_json::Error| StoreError::Damaged {
                    path: self.path.clone(),
                    what: format!("not valid state JSON: {e}"),
                };
                // The format first: a newer file may not parse as this build's types at all.
                let head: Head = serde_json::from_slice(&bytes).map_err(invalid)?;
                if head.format != FORMAT {
                    return Err(StoreError::Damaged {
                        path: self.path.clone(),
                        what: if head.format > FORMAT {
                            format!("format {} is newer than this build of k3os-ops reads (format {FORMAT}); nothing was rewritten: upgrade k3os-ops first", head.format)
                        } else {
                            format!("format {} does not exist (formats start at 1)", head.format)
                        },
                    });
                }
                let mut st: State = serde_json::from_slice(&bytes).map_err(invalid)?;
                // Every reader looks both slots up (`State::slot`); a file without one is
                // damaged, and guessing its record could lose the good slot.
                if let Some(s) = Slot::ALL.into_iter().find(|s| !st.slots.contains_key(s)) {
                    return Err(StoreError::Damaged {
                        path: self.path.clone(),
                        what: format!("no record of slot {s}: every state file has both"),
                    });
                }
                st.adopt_failed_slots();
                Ok(st)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(StoreError::io("read state", &self.path, e)),
        }
    }

    /// Replace the state file atomically, then announce the write barrier `barrier`.
    pub fn save(&self, st: &State, barrier: &str) -> Result<()> {
        let mut bytes = serde_json::to_vec_pretty(st).expect("state serializes");
        bytes.push(b'\n');
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create state dir", dir, e))?;
        }
        bootconfig::write_atomic(&self.path, &bytes)?;
        crate::barrier::hit(barrier);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Event, SlotState, HISTORY};

    #[test]
    fn save_load_round_trip_and_history_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut st = store.load().unwrap();
        assert_eq!(st.slot(Slot::A).state, SlotState::Empty);
        st.slot_mut(Slot::B).version = Some("v2".into());
        for i in 0..100 {
            // Invalid -> staged, again and again (each edge from a state it may leave).
            st.transition(Slot::B, Event::StageStarted, format!("m{i}"))
                .unwrap();
            st.transition(Slot::B, Event::Staged, format!("n{i}"))
                .unwrap();
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
