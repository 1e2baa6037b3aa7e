//! The staging area (`<state_dir>/patches/`): a patch fetched there resumably and checked
//! by sha256 before use.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::PatchWork;
use crate::error::{Error, Result};
use crate::manifest::Artifact;
use crate::net::rate::Limited;
use crate::stage::{Run, Stager, BUF};

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
impl Stager<'_> {
    /// Fetch patch `pw` into the staging area from what it holds, then check its size and
    /// sha256; `fetched` counts this run's network bytes. A staged copy that does not verify
    /// is removed (the next attempt fetches it again).
    pub(super) fn fetch_patch(
        &self,
        run: &Run,
        a: Artifact,
        pw: &PatchWork,
        fetched: &mut u64,
    ) -> Result<File> {
        let p = &pw.patch;
        let dir = staging_dir(&self.cfg.state_dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let mut f = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&pw.staged)
            .map_err(|e| Error::io("open", &pw.staged, e))?;
        let mut have = f
            .metadata()
            .map_err(|e| Error::io("stat", &pw.staged, e))?
            .len();
        if have > p.size {
            f.set_len(0)
                .map_err(|e| Error::io("truncate", &pw.staged, e))?;
            have = 0;
        }
        let loc = run.source.location(&p.path);
        run.progress
            .begin(&format!("{a} patch ({})", p.path), p.size, have);
        let mut backoff = self.backoff(run.opts);
        let mut buf = vec![0u8; BUF];
        while have < p.size {
            let left = run.throttle.grant(1).map_err(|why| Error::Stopped {
                why,
                fetched: run.throttle.budget.map_or(0, |b| b.used()),
                left: 0,
            })?;
            let stop = p.size.min(have.saturating_add(left));
            let body = match run.source.open_range(&p.path, have, stop) {
                Ok(b) => b,
                Err(e) => {
                    backoff.attempt_failed(&loc, e)?;
                    continue;
                }
            };
            let mut r = Limited::new(self.watch(run.opts).reader(body), run.throttle);
            let before = have;
            let failed = loop {
                match r.read(&mut buf) {
                    Ok(0) => break None,
                    Ok(n) => {
                        f.write_all(&buf[..n])
                            .map_err(|e| Error::io("write", &pw.staged, e))?;
                        have += n as u64;
                        *fetched += n as u64;
                        run.progress.advance(n as u64);
                        run.progress.fetched(n as u64);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Some(crate::net::fetch::body_failed(&e)),
                }
            };
            f.sync_data()
                .map_err(|e| Error::io("fsync", &pw.staged, e))?;
            if have == stop {
                backoff.progressed();
                continue;
            }
            if have > before {
                backoff.progressed();
            }
            let what =
                failed.unwrap_or_else(|| format!("stream ended at byte {have} of {}", p.size));
            if !backoff.wait(&loc, &what) {
                run.progress.end();
                return Err(Error::Fetch {
                    location: loc,
                    what: format!(
                        "{} (the {have} bytes staged are kept for the next attempt)",
                        backoff.gave_up(&what)
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
                artifact: a,
                location: loc,
                expected: p.sha256.clone(),
                found,
            });
        }
        File::open(&pw.staged).map_err(|e| Error::io("open", &pw.staged, e))
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
