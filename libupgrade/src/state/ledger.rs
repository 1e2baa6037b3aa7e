//! What the node keeps about its thin-link staging, in libupgrade's state directory next to
//! (never inside) `state.json`, each file small, versioned JSON written atomically (temp,
//! fsync, rename, fsync dir: `bootconfig::write_atomic`). It lives here, beside the slot
//! records, so every front end of a node reads the same files (the agent books and previews,
//! `k3os-ops slot status` shows them):
//!
//! - `stage-ledger.json`: the bytes fetched on one quota day, so `spec.stage.maxBytesPerDay`
//!   holds across agent restarts and reboots. Format 1:
//!   `{"format":1,"day":"2026-12-03","fetched":123456}`, plus `"spent":true` once a stage
//!   stopped at the quota that day (what is left of it is less than the next chunk or
//!   request: no stage runs again that day, which would only resolve the channel to fetch
//!   nothing). A ledger of another day counts as 0 for today (and is replaced by today's at
//!   the next write).
//! - `stage-preview.json`: the last stage preview (what the stage of `version` fetches and
//!   reuses), read by `k3os-ops slot status`. Format 1: [`PreviewRecord`].
//!
//! A file in a newer format than this build knows is refused with its path and both versions
//! (never overwritten); a v0.1.0 node has neither file, which reads as nothing fetched and no
//! preview. The agent on the node is the only writer of both.

use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

/// The format this build writes and reads.
pub const FORMAT: u32 = 1;
/// File name of the quota ledger in the state directory.
pub const LEDGER_FILE: &str = "stage-ledger.json";
/// File name of the last stage preview in the state directory.
pub const PREVIEW_FILE: &str = "stage-preview.json";

/// A record that cannot be read or written; names the file.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Unreadable, not JSON, of an unknown format or not written.
    #[error("{}: {what}", path.display())]
    Bad {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// Written by a newer build: never overwritten.
    #[error("{}: format {found} is newer than this build knows ({FORMAT}); upgrade k3os-ops or remove the file", path.display())]
    Newer {
        /// The file.
        path: PathBuf,
        /// The format it declares.
        found: u32,
    },
}

/// Bytes fetched on one quota day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// [`FORMAT`].
    pub format: u32,
    /// The quota day.
    pub day: NaiveDate,
    /// Network bytes fetched that day.
    pub fetched: u64,
    /// A stage stopped at the quota this day.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spent: bool,
}

/// What one quota day used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DayUse {
    /// Network bytes fetched.
    pub fetched: u64,
    /// A stage stopped at the quota: the day is done.
    pub spent: bool,
}

impl DayUse {
    /// Bytes counted against a quota: all of it once spent.
    pub fn counted(&self) -> u64 {
        if self.spent {
            u64::MAX
        } else {
            self.fetched
        }
    }
}

/// What a stage of `version` would fetch and reuse (the preview before its first byte): the
/// `k3os.io/stage-preview` annotation and `stage-preview.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewRecord {
    /// [`FORMAT`].
    pub format: u32,
    /// The release previewed.
    pub version: String,
    /// Bytes the stage fetches over the network.
    pub fetch: u64,
    /// Bytes it does not fetch (running slot, earlier attempt, local extra sources).
    pub reuse: u64,
    /// The offline bundle it stages from (absent: the channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// When the preview was made (absent in the annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DateTime<Utc>>,
    /// The artifacts the stage rebuilds by a per-pair patch, as `<artifact> from <version>`
    /// (absent: none; older agents neither write nor read it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_patch: Vec<String>,
}

fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, RecordError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(RecordError::Bad {
                path: path.into(),
                what: e.to_string(),
            })
        }
    };
    let bad = |what: String| RecordError::Bad {
        path: path.into(),
        what,
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    match v.get("format").and_then(|f| f.as_u64()) {
        Some(f) if f == u64::from(FORMAT) => {}
        Some(f) if f > u64::from(FORMAT) => {
            return Err(RecordError::Newer {
                path: path.into(),
                found: u32::try_from(f).unwrap_or(u32::MAX),
            })
        }
        other => return Err(bad(format!("format {other:?}, expected {FORMAT}"))),
    }
    serde_json::from_value(v)
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

fn write<T: Serialize>(path: &Path, value: &T) -> Result<(), RecordError> {
    let bytes = serde_json::to_vec(value).expect("records serialize");
    bootconfig::write_atomic(path, &bytes).map_err(|e| RecordError::Bad {
        path: path.into(),
        what: format!("cannot write: {e}"),
    })
}

/// What `day` used (nothing without a ledger or with another day's).
pub fn used_on(state_dir: &Path, day: NaiveDate) -> Result<DayUse, RecordError> {
    let l: Option<Ledger> = read(&state_dir.join(LEDGER_FILE))?;
    Ok(l.filter(|l| l.day == day)
        .map_or(DayUse::default(), |l| DayUse {
            fetched: l.fetched,
            spent: l.spent,
        }))
}

/// Add `bytes` fetched on `day` (and mark it `spent` when the stage stopped at the quota);
/// answers the day's new use.
pub fn add_fetched(
    state_dir: &Path,
    day: NaiveDate,
    bytes: u64,
    spent: bool,
) -> Result<DayUse, RecordError> {
    let before = used_on(state_dir, day)?;
    let l = Ledger {
        format: FORMAT,
        day,
        fetched: before.fetched.saturating_add(bytes),
        spent: before.spent || spent,
    };
    write(&state_dir.join(LEDGER_FILE), &l)?;
    Ok(DayUse {
        fetched: l.fetched,
        spent: l.spent,
    })
}

/// The last preview recorded on this node.
pub fn last_preview(state_dir: &Path) -> Result<Option<PreviewRecord>, RecordError> {
    read(&state_dir.join(PREVIEW_FILE))
}

/// Record `p` as the last preview.
pub fn record_preview(state_dir: &Path, p: &PreviewRecord) -> Result<(), RecordError> {
    write(&state_dir.join(PREVIEW_FILE), p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 12, d).unwrap()
    }

    #[test]
    fn the_ledger_counts_per_day_and_starts_over_the_next() {
        let t = tempfile::tempdir().unwrap();
        let used = |d| used_on(t.path(), day(d)).unwrap();
        assert_eq!(used(3), DayUse::default(), "no file: nothing");
        assert_eq!(
            add_fetched(t.path(), day(3), 100, false).unwrap().fetched,
            100
        );
        assert_eq!(
            add_fetched(t.path(), day(3), 50, false).unwrap().fetched,
            150
        );
        assert_eq!(used(3).counted(), 150);
        assert_eq!(used(4), DayUse::default());
        assert_eq!(add_fetched(t.path(), day(4), 7, false).unwrap().fetched, 7);
        let text = std::fs::read_to_string(t.path().join(LEDGER_FILE)).unwrap();
        assert_eq!(text, r#"{"format":1,"day":"2026-12-04","fetched":7}"#);
        // A stop at the quota closes the day, whatever is left of it.
        assert!(add_fetched(t.path(), day(4), 3, true).unwrap().spent);
        assert_eq!(used(4).counted(), u64::MAX);
        assert_eq!(used(4).fetched, 10);
        let text = std::fs::read_to_string(t.path().join(LEDGER_FILE)).unwrap();
        assert_eq!(
            text,
            r#"{"format":1,"day":"2026-12-04","fetched":10,"spent":true}"#
        );
        assert_eq!(used(5), DayUse::default(), "the next day starts over");
    }

    #[test]
    fn a_newer_or_broken_file_is_refused_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(LEDGER_FILE);
        std::fs::write(&p, r#"{"format":2,"day":"2026-12-04","fetched":7}"#).unwrap();
        let e = used_on(t.path(), day(4)).unwrap_err().to_string();
        assert!(
            e.contains(LEDGER_FILE) && e.contains("format 2 is newer"),
            "{e}"
        );
        std::fs::write(&p, "{").unwrap();
        let e = add_fetched(t.path(), day(4), 1, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not JSON"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "{",
            "never overwritten"
        );
    }

    #[test]
    fn the_preview_round_trips() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(last_preview(t.path()).unwrap(), None);
        let p = PreviewRecord {
            format: FORMAT,
            version: "v2".into(),
            fetch: 10,
            reuse: 20,
            bundle: None,
            at: None,
            by_patch: vec!["rootfs from v1".into()],
        };
        record_preview(t.path(), &p).unwrap();
        assert_eq!(last_preview(t.path()).unwrap(), Some(p));
    }
}
