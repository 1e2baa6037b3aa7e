//! Executing a [`Plan`]: every chunk of the file in order — kept, copied from a local file, or
//! read from a range request — is checked against its digest before it is written, and the
//! whole-file sha256 is computed on the way (file order, so no second pass) and compared at
//! the end. Memory: one buffer of the largest chunk size.
//!
//! Chunks to fetch come from a list of range sources tried in order: site mirrors first, the
//! origin last. Each chunk is checked against the signed index whatever its source. A mirror
//! chunk that does not match is refused (counted; warned once per mirror) and that one chunk
//! is taken from the next source, while the mirror keeps serving the chunks after it. A mirror
//! that fails (cannot be opened, drops or times out) is given up for the rest of the file:
//! the chunk in flight is all it costs, the next source continues at that chunk. The origin
//! alone follows the retry policy (`retry`).
//!
//! A dropped origin request is re-opened at the chunk that was being read; only that chunk's
//! bytes are fetched again. An origin chunk whose digest is wrong is never written: the server
//! holds different bytes than the signed index, which no retry can fix.
//!
//! With a byte budget (`rate::Budget`) or a download schedule a request never asks for
//! more than the budget has left or the schedule lets arrive before its window closes
//! (`Throttle::grant`), and the run stops with [`Error::Stopped`] before a chunk it cannot
//! afford or after the schedule's last window; every chunk written so far is verified and kept
//! for the next run.

use std::io::Read;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use super::index::ChunkEntry;
use super::local::LocalFile;
use super::plan::{Action, FetchRange, LocalRef, Plan};
use super::ChunkIndex;
use crate::error::{Error, Result};
use crate::manifest::Part;
use crate::net::rate::{Limited, MinRate, Throttle, Watched};
use crate::net::retry::Backoff;

/// Where the chunks go (a slot's artifact).
pub trait ChunkTarget {
    /// Write `buf` at byte `pos` of the artifact.
    fn write_at(&self, pos: u64, buf: &[u8]) -> Result<()>;
    /// Fill `buf` from byte `pos` of the artifact (to check chunks already in place).
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<()>;
    /// Make what was written durable (called every few seconds, on a stop and at the end).
    fn sync(&self) -> Result<()>;
}

/// Where missing chunks come from: byte ranges of the artifact file.
pub trait RangeSource {
    /// Bytes `start..stop` of the file, exactly.
    fn open_range(&self, start: u64, stop: u64) -> Result<Box<dyn Read + Send>>;
    /// The file's location, for messages.
    fn location(&self) -> String;
}

/// Progress callbacks of [`apply`].
pub trait ApplyProgress {
    /// `bytes` more were fetched from the network.
    fn fetched(&self, bytes: u64);
    /// `bytes` more were reused (kept in place or copied locally).
    fn reused(&self, bytes: u64);
}

/// Parameters of one [`apply`].
pub struct ApplyOptions<'a> {
    /// Which artifact of the release is applied (named in messages and errors).
    pub artifact: Part,
    /// Whole-file sha256 from the manifest.
    pub sha256: String,
    /// Failed attempts tolerated in a row (as `download_retries`).
    pub retries: u32,
    /// Delay before the first retry; it doubles on each failure in a row, up to a cap (`retry`).
    pub retry_delay: Duration,
    /// The rate limit and byte budget every network read goes through.
    pub throttle: Throttle<'a>,
    /// No retry starts that would wait past it (the stage's `--retry-for`).
    pub deadline: Option<Instant>,
    /// Responses slower than this are cut and re-requested.
    pub min_rate: Option<MinRate>,
}

/// What one [`apply`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes already correct in the target.
    pub kept: u64,
    /// Bytes copied from local files.
    pub copied: u64,
    /// Bytes fetched (chunk payload; a dropped request's partial chunk is not counted).
    pub fetched: u64,
    /// Of `fetched`, bytes that came from a mirror (a source before the origin).
    pub from_mirrors: u64,
    /// Chunks a mirror served that did not match the signed index (taken from the next source).
    pub refused: u64,
    /// Range requests made (including re-opened ones).
    pub requests: u64,
}

/// Make the target hold the file `index` describes, following `plan`. `remotes` are tried in
/// order for each chunk to fetch; the last one is the origin.
pub fn apply(
    index: &ChunkIndex,
    plan: &Plan,
    target: &dyn ChunkTarget,
    remotes: &[&dyn RangeSource],
    locals: &[LocalFile],
    opts: &ApplyOptions,
    progress: &dyn ApplyProgress,
) -> Result<Transfer> {
    assert!(!remotes.is_empty(), "apply needs the origin");
    let mut a = Applier {
        chunks: &index.chunks,
        target,
        remotes,
        locals,
        opts,
        progress,
        t: Transfer::default(),
        streams: remotes.iter().map(|_| None).collect(),
        dead: vec![false; remotes.len()],
        warned: vec![false; remotes.len()],
        backoff: Backoff::new(opts.retry_delay, opts.retries).until(opts.deadline),
        locs: remotes.iter().map(|r| r.location()).collect(),
    };
    let mut whole = Sha256::new();
    let mut buf = vec![0u8; index.params.max as usize];
    let mut last_sync = Instant::now();
    let result = (|| {
        for (i, c) in index.chunks.iter().enumerate() {
            let data = &mut buf[..c.len as usize];
            match plan.actions[i] {
                Action::Keep => a.keep(c, data)?,
                Action::Copy(l) => a.copy(i, c, l, data)?,
                Action::Fetch(r) => a.fetch(i, (r, plan.ranges[r]), data)?,
            }
            whole.update(&*data);
            if last_sync.elapsed() >= Duration::from_secs(5) {
                target.sync()?;
                last_sync = Instant::now();
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        // What was written stays: a later run re-verifies it in place and keeps it.
        if matches!(e, Error::Stopped { .. }) {
            target.sync()?;
        }
        return Err(e);
    }
    let Applier { t, mut locs, .. } = a;
    let found = hex::encode(whole.finalize());
    if found != opts.sha256 {
        return Err(Error::Checksum {
            artifact: opts.artifact.clone(),
            location: locs.pop().expect("the origin"),
            expected: opts.sha256.clone(),
            found,
        });
    }
    target.sync()?;
    Ok(t)
}

/// An open range request: which planned range it reads, the next byte it yields, where it ends.
struct Open<'a> {
    range: usize,
    next: u64,
    stop: u64,
    r: Box<dyn Read + Send + 'a>,
}

/// What reading one chunk from one source gave.
enum Read1 {
    /// The chunk's bytes are in the buffer (not yet checked).
    Got,
    /// The origin could not be opened; the backoff waited: try it again.
    Again,
    /// The source failed in this chunk (why); a mirror is then given up.
    Failed(String),
}

/// One [`apply`] in progress: where chunks go and come from, what was done, the open range
/// request of each source, which mirrors were given up and which were warned about.
struct Applier<'a> {
    chunks: &'a [ChunkEntry],
    target: &'a dyn ChunkTarget,
    remotes: &'a [&'a dyn RangeSource],
    locals: &'a [LocalFile],
    opts: &'a ApplyOptions<'a>,
    progress: &'a dyn ApplyProgress,
    t: Transfer,
    streams: Vec<Option<Open<'a>>>,
    dead: Vec<bool>,
    warned: Vec<bool>,
    backoff: Backoff,
    locs: Vec<String>,
}

impl Applier<'_> {
    fn origin(&self) -> usize {
        self.remotes.len() - 1
    }

    /// The first source not given up at or after `from` (the origin never is).
    fn alive_from(&self, from: usize) -> usize {
        (from..self.origin())
            .find(|&s| !self.dead[s])
            .unwrap_or(self.origin())
    }

    /// Chunk `c` is already correct in the target: read it back for the whole-file hash.
    fn keep(&mut self, c: &ChunkEntry, data: &mut [u8]) -> Result<()> {
        self.target.read_at(c.offset, data)?;
        self.t.kept += u64::from(c.len);
        self.progress.reused(u64::from(c.len));
        Ok(())
    }

    /// Copy chunk `i` from a local file; fetch it alone if the local bytes no longer match.
    fn copy(&mut self, i: usize, c: &ChunkEntry, l: LocalRef, data: &mut [u8]) -> Result<()> {
        let len = u64::from(c.len);
        let src = &self.locals[l.source];
        let ok = src.read_at(l.offset, data).is_ok() && super::digest(data) == c.digest;
        if ok {
            self.t.copied += len;
            self.progress.reused(len);
            return self.target.write_at(c.offset, data);
        }
        // The local file changed under us (it should not): fetch this one chunk.
        log::warn!(
            "{}: chunk {i} no longer matches at {} byte {}; fetching it",
            &self.opts.artifact,
            src.name,
            l.offset
        );
        let single = FetchRange {
            first: i,
            end: i + 1,
            start: c.offset,
            stop: c.end(),
        };
        self.fetch(i, (usize::MAX, single), data)
    }

    /// Fetch chunk `i` of planned range `r` from the first source that serves it intact,
    /// check it and write it.
    fn fetch(&mut self, i: usize, (r, range): (usize, FetchRange), data: &mut [u8]) -> Result<()> {
        let c = self.chunks[i];
        let first = self.alive_from(0);
        let mut s = first;
        loop {
            // A fallback after a source still alive fetches this chunk alone.
            let stop = if s == first { range.stop } else { c.end() };
            match self.read_from(s, i, (r, stop), data)? {
                Read1::Got if super::digest(data) == c.digest => break,
                Read1::Got if s == self.origin() => {
                    check(self.opts, &self.locs[s], i, c.offset, &c.digest, data)?;
                }
                Read1::Got => {
                    self.refuse(s, i);
                    s = self.alive_from(s + 1);
                }
                Read1::Again => {}
                Read1::Failed(why) if s == self.origin() => self.dropped(i, &why)?,
                Read1::Failed(why) => {
                    let next = self.alive_from(s + 1);
                    log::warn!(
                        "{}: {why}; not used again for the {}, chunk {i} on come from {}",
                        self.locs[s],
                        &self.opts.artifact,
                        self.locs[next]
                    );
                    self.dead[s] = true;
                    self.streams[s] = None;
                    s = next;
                }
            }
        }
        if s == self.origin() {
            self.backoff.progressed();
        } else {
            self.t.from_mirrors += u64::from(c.len);
        }
        self.target.write_at(c.offset, data)?;
        self.t.fetched += u64::from(c.len);
        self.progress.fetched(u64::from(c.len));
        Ok(())
    }

    /// Read chunk `i` from source `s`, through its open request when that is at this chunk,
    /// else a new one for the chunk's bytes up to `stop` (never past what the budget has left).
    fn read_from(
        &mut self,
        s: usize,
        i: usize,
        (r, stop): (usize, u64),
        data: &mut [u8],
    ) -> Result<Read1> {
        let c = self.chunks[i];
        let at_chunk = self.streams[s]
            .as_ref()
            .is_some_and(|o| o.range == r && o.next == c.offset && c.end() <= o.stop);
        if !at_chunk {
            let stop = self.affordable(i, stop)?;
            match self.remotes[s].open_range(c.offset, stop) {
                Ok(body) => {
                    self.t.requests += 1;
                    let body = Limited::new(
                        Watched::new(body, self.opts.min_rate).until(self.opts.deadline),
                        self.opts.throttle,
                    );
                    self.streams[s] = Some(Open {
                        range: r,
                        next: c.offset,
                        stop,
                        r: Box::new(body),
                    });
                }
                Err(e) if s == self.origin() => {
                    // Transient: the backoff waited; else it gave up with the error.
                    self.backoff.attempt_failed(&self.locs[s], e)?;
                    return Ok(Read1::Again);
                }
                Err(e) => return Ok(Read1::Failed(e.to_string())),
            }
        }
        let o = self.streams[s].as_mut().expect("opened above");
        match o.r.read_exact(data) {
            Ok(()) => {
                o.next = c.end();
                Ok(Read1::Got)
            }
            Err(e) => {
                self.streams[s] = None;
                Ok(Read1::Failed(format!(
                    "{} in chunk {i} (bytes {}..{})",
                    crate::net::fetch::body_failed(&e),
                    c.offset,
                    c.end()
                )))
            }
        }
    }

    /// The end of the last chunk from `i` on, up to `stop`, that the byte budget still pays
    /// for and the schedule lets arrive in its window (waiting for one to open);
    /// [`Error::Stopped`] when either cannot carry chunk `i`.
    fn affordable(&self, i: usize, stop: u64) -> Result<u64> {
        let start = self.chunks[i].offset;
        let fetched = self.opts.throttle.budget.map_or(0, |b| b.used());
        let left = match self.opts.throttle.grant(u64::from(self.chunks[i].len)) {
            Ok(n) => n,
            Err(why) => {
                return Err(Error::Stopped {
                    why,
                    fetched,
                    left: 0,
                })
            }
        };
        Ok(self.chunks[i..]
            .iter()
            .take_while(|c| c.end() <= stop && c.end() - start <= left)
            .last()
            .map_or(self.chunks[i].end(), |c| c.end()))
    }

    /// Source `s` (a mirror) served chunk `i` with other bytes than the signed index: count
    /// it, and warn the first time.
    fn refuse(&mut self, s: usize, i: usize) {
        self.t.refused += 1;
        if !std::mem::replace(&mut self.warned[s], true) {
            log::warn!(
                "{}: chunk {i} does not match the signed chunk index; refused, taken from {} (further refusals from this source are only counted)",
                self.locs[s],
                self.locs[self.alive_from(s + 1)]
            );
        }
    }

    /// The origin dropped inside chunk `i`: wait before re-requesting it, or give up.
    fn dropped(&mut self, i: usize, what: &str) -> Result<()> {
        let c = self.chunks[i];
        let loc = &self.locs[self.origin()];
        let Some(delay) = self.backoff.failed() else {
            return Err(Error::Fetch {
                location: loc.clone(),
                what: format!(
                    "{} (a later run keeps every chunk already written)",
                    self.backoff.gave_up(what)
                ),
                retryable: true,
            });
        };
        log::warn!(
            "{loc}: {what}; re-requesting from byte {} in {delay:?}",
            c.offset
        );
        std::thread::sleep(delay);
        Ok(())
    }
}

fn check(
    opts: &ApplyOptions,
    loc: &str,
    i: usize,
    offset: u64,
    want: &super::Digest,
    data: &[u8],
) -> Result<()> {
    let got = super::digest(data);
    if &got != want {
        return Err(Error::ChunkDigest {
            artifact: opts.artifact.clone(),
            location: loc.to_string(),
            chunk: i,
            offset,
            expected: hex::encode(want),
            found: hex::encode(got),
        });
    }
    Ok(())
}

/// A target in memory (tests, benches).
impl ChunkTarget for std::cell::RefCell<Vec<u8>> {
    fn write_at(&self, pos: u64, buf: &[u8]) -> Result<()> {
        let mut v = self.borrow_mut();
        let end = pos as usize + buf.len();
        if v.len() < end {
            v.resize(end, 0);
        }
        v[pos as usize..end].copy_from_slice(buf);
        Ok(())
    }
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        let v = self.borrow();
        let s = v
            .get(pos as usize..pos as usize + buf.len())
            .ok_or_else(|| Error::Layout(format!("memory target: no bytes at {pos}")))?;
        buf.copy_from_slice(s);
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
