//! The staging area (`<state_dir>/patches/`): a patch fetched there resumably and checked
//! by sha256 before use.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::PatchWork;
use crate::error::{Error, Result};
use crate::manifest::Part;
use crate::net::rate::Limited;
use crate::stage::run::Run;
use crate::stage::BUF;

/// The staging area for patches under `state_dir`.
pub(crate) fn staging_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("patches")
}

/// Remove the staging area (a new attempt starts, or the slot is staged).
pub(crate) fn clear_staging(state_dir: &Path) -> Result<()> {
    let d = staging_dir(state_dir);
    match std::fs::remove_dir_all(&d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", &d, e)),
    }
}
/// Fetch patch `pw` into the staging area from what it holds, then check its size and
/// sha256; `fetched` counts this run's network bytes. A staged copy that does not verify
/// is removed (the next attempt fetches it again).
pub(super) fn fetch(run: &Run, a: &Part, pw: &PatchWork, fetched: &mut u64) -> Result<File> {
    let p = &pw.patch;
    let mut st = Staged::open(&run.env.cfg.state_dir, &pw.staged, p.size)?;
    let loc = run.source.location(&p.path);
    run.progress
        .begin(&format!("{a} patch ({})", p.path), p.size, st.have);
    let mut backoff = run.env.backoff(run.opts);
    let mut buf = vec![0u8; BUF];
    while st.have < p.size {
        let left = run.throttle.grant(1).map_err(|why| Error::Stopped {
            why,
            fetched: run.throttle.budget.map_or(0, |b| b.used()),
            left: 0,
        })?;
        let stop = p.size.min(st.have.saturating_add(left));
        let body = match run.source.open_range(&p.path, st.have, stop) {
            Ok(b) => b,
            Err(e) => {
                backoff.attempt_failed(&loc, e)?;
                continue;
            }
        };
        let r = Limited::new(run.env.watch(run.opts).reader(body), run.throttle);
        let before = st.have;
        let failed = st.take(r, &mut buf, fetched, run)?;
        if st.have == stop {
            backoff.progressed();
            continue;
        }
        if st.have > before {
            backoff.progressed();
        }
        let what =
            failed.unwrap_or_else(|| format!("stream ended at byte {} of {}", st.have, p.size));
        if !backoff.wait(&loc, &what) {
            run.progress.end();
            return Err(Error::Fetch {
                location: loc,
                what: format!(
                    "{} (the {} bytes staged are kept for the next attempt)",
                    backoff.gave_up(&what),
                    st.have
                ),
                retryable: true,
            });
        }
    }
    run.progress.end();
    let found = sha256_file(&pw.staged)?;
    if found != p.sha256 {
        std::fs::remove_file(&pw.staged).map_err(|e| Error::io("remove", &pw.staged, e))?;
        return Err(Error::Checksum {
            artifact: a.clone(),
            location: loc,
            expected: p.sha256.clone(),
            found,
        });
    }
    File::open(&pw.staged).map_err(|e| Error::io("open", &pw.staged, e))
}

/// A patch being fetched into the staging area: the file, appended to, and its length.
struct Staged<'p> {
    f: File,
    path: &'p Path,
    have: u64,
}

impl<'p> Staged<'p> {
    /// Open (or create) `path` in `state_dir`'s staging area for appending; a copy longer than
    /// the patch's `size` is emptied (it cannot be this patch's prefix).
    fn open(state_dir: &Path, path: &'p Path, size: u64) -> Result<Staged<'p>> {
        let dir = staging_dir(state_dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let f = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        let mut have = f.metadata().map_err(|e| Error::io("stat", path, e))?.len();
        if have > size {
            f.set_len(0).map_err(|e| Error::io("truncate", path, e))?;
            have = 0;
        }
        Ok(Staged { f, path, have })
    }

    /// Append what `r` yields (one range response), then fsync; returns why the response
    /// ended early, if it failed (a write error is the stage's).
    fn take(
        &mut self,
        mut r: impl Read,
        buf: &mut [u8],
        fetched: &mut u64,
        run: &Run,
    ) -> Result<Option<String>> {
        let failed = loop {
            match r.read(buf) {
                Ok(0) => break None,
                Ok(n) => {
                    self.f
                        .write_all(&buf[..n])
                        .map_err(|e| Error::io("write", self.path, e))?;
                    self.have += n as u64;
                    *fetched += n as u64;
                    run.progress.advance(n as u64);
                    run.progress.fetched(n as u64);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Some(crate::net::fetch::body_failed(&e)),
            }
        };
        self.f
            .sync_data()
            .map_err(|e| Error::io("fsync", self.path, e))?;
        Ok(failed)
    }
}

/// sha256 of a whole file, hex.
fn sha256_file(p: &Path) -> Result<String> {
    let mut f = File::open(p).map_err(|e| Error::io("open", p, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; BUF];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io("read", p, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}
