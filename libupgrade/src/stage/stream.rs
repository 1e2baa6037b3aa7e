//! The stream executor: one part without a usable chunk index downloaded whole, hashed
//! while it is written, resumed from the checkpointed position after a dropped connection
//! (HTTP `Range`) or a restart; progress is checkpointed ([`crate::net::checkpoint::due`]) so a
//! later run resumes where this one synced.

use std::io::Read;

use sha2::{Digest, Sha256};

use super::parts::{self, PartPlan};
use super::run::Run;
use super::BUF;
use crate::error::{Error, Result};
use crate::layout::Target;
use crate::manifest::Part;
use crate::net::checkpoint::{self, Partial};
use crate::net::fetch::Source;
use crate::net::rate::Limited;

/// Stream part `p` into the target slot from byte `resume_at`; returns the bytes fetched by
/// this call.
pub(super) fn write(run: &Run, p: &PartPlan, resume_at: u64, partial: &mut Partial) -> Result<u64> {
    let (a, entry) = (&p.part, &p.entry);
    let size = entry.size;
    let target = parts::target(&run.env, run.slot, &run.m.version, a, entry, resume_at > 0)?;
    let mut hasher = Sha256::new();
    let start = resume_from(&target, resume_at.min(size), &mut hasher)?;
    run.progress
        .begin(&format!("{a} ({})", entry.path), size, start);
    let mut w = Writing {
        target: &target,
        hasher: &mut hasher,
        buf: &mut vec![0u8; BUF],
        pos: start,
        size,
        ckpt: (start, std::time::Instant::now()),
    };
    download(run, a, &entry.path, &mut w, partial)?;
    let pos = w.pos;
    run.progress.end();
    let found = hex::encode(hasher.finalize());
    if found != entry.sha256 {
        return Err(Error::Checksum {
            artifact: a.clone(),
            location: run.source.location(&entry.path),
            expected: entry.sha256.clone(),
            found,
        });
    }
    target.finish()?;
    crate::barrier::hit("stage:artifact-complete");
    Ok(pos - start)
}

/// Open responses from `w.pos` and pump them into the target until the artifact is
/// complete, retrying dropped connections by the stage's backoff; when it gives up, what
/// was synced is checkpointed so a later run resumes there.
fn download(run: &Run, a: &Part, name: &str, w: &mut Writing, partial: &mut Partial) -> Result<()> {
    let is_local = matches!(run.source, Source::Path(_) | Source::Bundle(_));
    let mut backoff = run.env.backoff(run.opts);
    let mut last_err = String::new();
    while w.pos < w.size {
        let left = grant(run, w, a, partial)?;
        let opened = if left < w.size - w.pos {
            run.source
                .open_range(name, w.pos, w.pos + left)
                .map(|r| (r, run.source.location(name)))
        } else {
            run.source.open(name, w.pos)
        };
        let (mut r, loc) = match opened {
            Ok(x) => x,
            Err(e) => {
                last_err = backoff.attempt_failed(&run.source.location(name), e)?;
                continue;
            }
        };
        let before = w.pos;
        let mut r = Limited::new(run.env.watch(run.opts).reader(&mut r), run.throttle);
        if let Some(e) = pump(run, w, &mut r, a, partial)? {
            last_err = e;
        }
        let (pos, size) = (w.pos, w.size);
        if pos == size || pos - before == left {
            // Done, or the granted bytes arrived: the next grant decides.
            continue;
        }
        if is_local {
            return Err(Error::Size {
                artifact: a.clone(),
                location: loc,
                expected: size,
                found: pos,
            });
        }
        if pos > before {
            backoff.progressed();
        }
        if last_err.is_empty() {
            last_err = format!("stream ended at byte {pos} of {size}");
        }
        let Some(delay) = backoff.failed() else {
            // Keep what was synced: the next run resumes from the checkpoint.
            checkpoint_at(run, w.target, partial, a, pos)?;
            return Err(Error::Fetch {
                location: loc,
                what: format!(
                    "{} (progress kept, a later run resumes at byte {pos})",
                    backoff.gave_up(&last_err)
                ),
                retryable: true,
            });
        };
        log::warn!("{loc}: {last_err}; resuming at byte {pos} in {delay:?}");
        std::thread::sleep(delay);
        last_err.clear();
    }
    Ok(())
}

/// Copy from one open response into the target until it ends or drops; `Some(why)` when
/// the connection dropped.
fn pump(
    run: &Run,
    w: &mut Writing,
    r: &mut impl Read,
    a: &Part,
    partial: &mut Partial,
) -> Result<Option<String>> {
    loop {
        let want = ((w.size - w.pos) as usize).min(BUF);
        if want == 0 {
            return Ok(None);
        }
        match r.read(&mut w.buf[..want]) {
            Ok(0) => return Ok(None),
            Ok(n) => {
                w.hasher.update(&w.buf[..n]);
                w.target.write_at(w.pos, &w.buf[..n])?;
                w.pos += n as u64;
                run.progress.advance(n as u64);
                if checkpoint::due(w.pos - w.ckpt.0, w.ckpt.1.elapsed()) {
                    checkpoint_at(run, w.target, partial, a, w.pos)?;
                    w.ckpt = (w.pos, std::time::Instant::now());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Ok(Some(format!(
                    "{} (at byte {} of {})",
                    crate::net::fetch::body_failed(&e),
                    w.pos,
                    w.size
                )))
            }
        }
    }
}

/// Bytes the next request may ask for: never more than the budget has left or the
/// schedule lets arrive in its window (which may mean waiting for one to open). A stop
/// keeps what was synced: the next run resumes from the checkpoint.
fn grant(run: &Run, w: &Writing, a: &Part, partial: &mut Partial) -> Result<u64> {
    run.throttle.grant(1).or_else(|why| {
        checkpoint_at(run, w.target, partial, a, w.pos)?;
        Err(Error::Stopped {
            why,
            fetched: run.throttle.budget.map_or(0, |b| b.used()),
            left: 0,
        })
    })
}

/// Sync what was written and record `pos` in the checkpoint.
fn checkpoint_at(
    run: &Run,
    target: &Target,
    partial: &mut Partial,
    a: &Part,
    pos: u64,
) -> Result<()> {
    target.sync()?;
    partial.current = Some((a.clone(), pos));
    partial.save(&run.env.cfg.state_dir)
}

/// One artifact's write in progress: where it goes, its running hash, the position, and the
/// last checkpoint (position, time).
struct Writing<'a> {
    target: &'a Target,
    hasher: &'a mut Sha256,
    buf: &'a mut [u8],
    pos: u64,
    size: u64,
    ckpt: (u64, std::time::Instant),
}

/// Where a resumed download of `target` continues: at the checkpointed `pos`, but never past
/// what a file target really holds; the bytes before it are re-hashed from disk (trust only
/// what the checkpoint says was synced). Bytes past it are dropped.
fn resume_from(target: &Target, pos: u64, hasher: &mut Sha256) -> Result<u64> {
    let mut pos = pos;
    if target.is_file() {
        // A cut after the rename but before the checkpoint leaves no temp file (length 0):
        // resuming at the checkpoint would extend it with zeros (sha256 mismatch on every
        // later run; found by vm-tests powercut at `artifact-renamed`). Start over instead.
        pos = pos.min(target.existing_len()?);
    }
    target.truncate(pos)?;
    if pos > 0 {
        rehash(target, pos, hasher)?;
    }
    Ok(pos)
}

/// Feed the first `pos` bytes the target holds into `hasher` (a resumed download).
fn rehash(target: &Target, pos: u64, hasher: &mut Sha256) -> Result<()> {
    let mut r = target.reader(pos)?;
    let mut buf = vec![0u8; BUF];
    let mut n_total = 0;
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| Error::io("re-read for resume", target.display(), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        n_total += n as u64;
    }
    if n_total != pos {
        return Err(Error::Layout(format!(
            "{}: could re-read only {n_total} of {pos} bytes to resume",
            target.display()
        )));
    }
    Ok(())
}
