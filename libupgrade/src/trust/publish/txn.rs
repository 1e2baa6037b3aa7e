//! The publish transaction: every command that writes a channel's metadata collects its new
//! files in memory, has the whole new set checked as it will be served, and only then writes
//! them, in the order a node reads nothing half-made from.
//!
//! **Checks before a byte is written** ([`Publish::commit`]): each new document was already
//! checked against its role's threshold when it was signed (a wrong key stops the command
//! there, naming the role and the file); then the directory *as it will be* (the served files
//! with the new ones laid over them) is verified with the publisher's rules
//! ([`crate::trust::client::served`]), and, when the set includes a new `timestamp.json` (the
//! set nodes are meant to take), with the node's own client ([`crate::trust::update`], from the
//! chain's first root, expiry aside: an expired root is the operator's to rotate, and new
//! files are signed with future expiries): a channel nodes take as served must stay one they
//! take (one they already refuse, between a `root rotate` and the re-signing of the roles it
//! rotated, may be re-signed one role at a time, as the publisher's rules allow).
//!
//! **Order of the writes**: every new file is first written beside its final name
//! (`.NAME.part`, fsynced); any failure there removes the temporary files and leaves the
//! directory as it was. Then each is renamed into place and the directory fsynced, one at a
//! time, in reading order reversed: `N.root.json`, `root.json`, `targets.json`,
//! `snapshot.json`, `timestamp.json`, `halt.json`. A node reads the timestamp first and
//! follows its pins, so until the new timestamp is in place it sees the old set (or, during
//! the few milliseconds between two renames, a pin that does not match, which it refuses for
//! that poll and retries at the next); once it is, every file it pins is there. A rename that
//! fails puts the files already renamed back as they were.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::Utc;

use crate::trust::client::served::{verify_served, verify_served_from, verify_source, Served};
use crate::trust::client::{update, ExpiryRule, MAX_ROOT_BYTES};
use crate::trust::kept::{read_bounded, DirMeta};
use crate::trust::meta::Role;
use crate::trust::{MetaSource, Record, TrustError};

/// The node's own client over `src` from its `1.root.json` (expiry aside: module docs).
fn node_verdict(src: &dyn MetaSource) -> Result<(), TrustError> {
    let first = src.location("1.root.json");
    let bytes = src
        .fetch("1.root.json", MAX_ROOT_BYTES)?
        .ok_or_else(|| TrustError::Missing {
            file: "1.root.json".into(),
            location: first.clone(),
        })?;
    let record = Record::from_root(&bytes, &first)?;
    let clock = ExpiryRule {
        now: Utc::now(),
        ignore_expiry: true,
    };
    update(src, None, &record, &clock).map(|_| ())
}

/// Largest earlier file read back to restore it (the largest a node reads).
const MAX_KEPT_BYTES: u64 = crate::trust::client::MAX_TARGETS_BYTES;

/// New metadata files of one channel directory, held in memory until [`Publish::commit`].
#[derive(Debug)]
pub struct Publish {
    dir: PathBuf,
    served: Option<Served>,
    staged: BTreeMap<String, Vec<u8>>,
}

/// Where a file goes in the order of the renames (lower first): roots by version, then the
/// roles a node reads after the root, the last-read role first.
fn rank(name: &str) -> (u8, u64) {
    if let Some(v) = name
        .strip_suffix(".root.json")
        .and_then(|v| v.parse::<u64>().ok())
    {
        return (0, v);
    }
    let step = match name {
        "root.json" => 1,
        "targets.json" => 2,
        "snapshot.json" => 3,
        "timestamp.json" => 4,
        _ => 5,
    };
    (step, 0)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrustError + '_ {
    move |source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The channel directory as it will be: the staged files over the served ones.
struct Overlay<'a> {
    dir: DirMeta,
    staged: &'a BTreeMap<String, Vec<u8>>,
}

impl MetaSource for Overlay<'_> {
    fn fetch(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, TrustError> {
        match self.staged.get(name) {
            Some(b) if b.len() as u64 > max => Err(TrustError::TooLarge {
                what: format!("new {}", self.dir.location(name)),
                max,
            }),
            Some(b) => Ok(Some(b.clone())),
            None => self.dir.fetch(name, max),
        }
    }
    fn location(&self, name: &str) -> String {
        self.dir.location(name)
    }
}

impl Publish {
    /// Start from the channel in `dir` once its metadata as served verified
    /// ([`verify_served`]); nothing is read again at commit but to check the new set.
    pub fn begin(dir: &Path) -> Result<Publish, TrustError> {
        Ok(Publish::over(dir, Some(verify_served(dir)?)))
    }

    /// [`Publish::begin`], the chain walked from `anchor` (a root kept apart:
    /// [`verify_served_from`]).
    pub fn begin_from(dir: &Path, anchor: &[u8], anchor_what: &str) -> Result<Publish, TrustError> {
        Ok(Publish::over(
            dir,
            Some(verify_served_from(dir, anchor, anchor_what)?),
        ))
    }

    /// A channel without metadata yet (`release root init`).
    pub(crate) fn empty(dir: &Path) -> Publish {
        Publish::over(dir, None)
    }

    fn over(dir: &Path, served: Option<Served>) -> Publish {
        Publish {
            dir: dir.to_path_buf(),
            served,
            staged: BTreeMap::new(),
        }
    }

    /// The channel directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What verified when the transaction began (`None`: the channel had no root).
    pub fn served(&self) -> Option<&Served> {
        self.served.as_ref()
    }

    /// The path of `name` in the channel directory, for messages.
    pub fn path_of(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The new bytes of `name` when staged.
    pub fn staged(&self, name: &str) -> Option<&[u8]> {
        self.staged.get(name).map(Vec::as_slice)
    }

    /// Stage `bytes` as the new `name` (replacing what was staged for it).
    pub(crate) fn stage(&mut self, name: &str, bytes: Vec<u8>) {
        self.staged.insert(name.to_string(), bytes);
    }

    /// The new set, checked as it will be served (module docs); nothing is written.
    pub fn check(&self) -> Result<(), TrustError> {
        let src = Overlay {
            dir: DirMeta(self.dir.clone()),
            staged: &self.staged,
        };
        verify_source(&src)?;
        if !self.staged.contains_key(Role::Timestamp.file()) {
            return Ok(());
        }
        let Err(e) = node_verdict(&src) else {
            return Ok(());
        };
        // A channel nodes already refuse (between a `root rotate` and the re-signing of the
        // roles it rotated, as `client::served` allows) may be re-signed step by step; one
        // they take must stay one they take.
        match node_verdict(&DirMeta(self.dir.clone())) {
            Ok(()) => Err(TrustError::Publish {
                what: "the new metadata".into(),
                why: format!(
                    "nodes take the channel as served, and would refuse it after this change ({e}); nothing was written"
                ),
            }),
            Err(_) => Ok(()),
        }
    }

    /// [`Publish::check`] the new set, then write it in order (module docs). On an error the
    /// directory is as it was.
    pub fn commit(self) -> Result<(), TrustError> {
        self.check()?;
        let mut files: Vec<(&String, &Vec<u8>)> = self.staged.iter().collect();
        files.sort_by_key(|(n, _)| rank(n));
        // What each file was, to put back should a rename fail.
        let old: Vec<Option<Vec<u8>>> = files
            .iter()
            .map(|(n, _)| read_bounded(&self.dir.join(n), MAX_KEPT_BYTES))
            .collect::<Result<_, _>>()?;
        let mut temps = Vec::new();
        for (name, bytes) in &files {
            match self.write_temp(name, bytes) {
                Ok(t) => temps.push(t),
                Err(e) => {
                    temps.iter().for_each(|t| drop(fs::remove_file(t)));
                    return Err(e);
                }
            }
        }
        for (i, ((name, _), tmp)) in files.iter().zip(&temps).enumerate() {
            let dst = self.dir.join(name);
            let done = fs::rename(tmp, &dst)
                .map_err(io(&dst))
                .and_then(|()| self.sync_dir());
            if let Err(e) = done {
                temps[i..].iter().for_each(|t| drop(fs::remove_file(t)));
                self.restore(&files[..i], &old[..i]);
                return Err(e);
            }
        }
        Ok(())
    }

    fn write_temp(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, TrustError> {
        let tmp = self.dir.join(format!(".{name}.part"));
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        });
        if let Err(e) = written {
            drop(fs::remove_file(&tmp));
            return Err(io(&tmp)(e));
        }
        Ok(tmp)
    }

    fn sync_dir(&self) -> Result<(), TrustError> {
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))
    }

    /// Put the files already renamed back as they were (best effort, newest first: the
    /// directory was writable a moment ago).
    fn restore(&self, done: &[(&String, &Vec<u8>)], old: &[Option<Vec<u8>>]) {
        for ((name, _), before) in done.iter().zip(old).rev() {
            let dst = self.dir.join(name);
            let back = match before {
                Some(b) => self
                    .write_temp(name, b)
                    .and_then(|t| fs::rename(&t, &dst).map_err(io(&dst))),
                None => fs::remove_file(&dst).map_err(io(&dst)),
            };
            if let Err(e) = back {
                log::error!("{name} could not be put back as it was: {e}");
            }
        }
        drop(self.sync_dir());
    }
}

#[cfg(test)]
mod tests {
    use super::rank;

    #[test]
    fn renames_go_roots_first_and_timestamp_after_what_it_pins() {
        let mut names = vec![
            "timestamp.json",
            "halt.json",
            "snapshot.json",
            "root.json",
            "targets.json",
            "10.root.json",
            "9.root.json",
        ];
        names.sort_by_key(|n| rank(n));
        assert_eq!(
            names,
            [
                "9.root.json",
                "10.root.json",
                "root.json",
                "targets.json",
                "snapshot.json",
                "timestamp.json",
                "halt.json"
            ]
        );
    }
}
