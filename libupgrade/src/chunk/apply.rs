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
use super::rate::{Limited, MinRate, Throttle, Watched};
use super::ChunkIndex;
use crate::error::{Error, Result};
use crate::manifest::Artifact;
use crate::retry::Backoff;

/// Where the chunks go (a slot's artifact).
pub trait ChunkTarget {
    fn write_at(&self, pos: u64, buf: &[u8]) -> Result<()>;
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<()>;
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
    pub artifact: Artifact,
    /// Whole-file sha256 from the manifest.
    pub sha256: String,
    /// Failed attempts tolerated in a row (as `download_retries`).
    pub retries: u32,
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
            artifact: opts.artifact,
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
            self.opts.artifact,
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
                        self.opts.artifact,
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
                    let body =
                        Limited::new(Watched::new(body, self.opts.min_rate), self.opts.throttle);
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
                    "connection dropped in chunk {i} (bytes {}..{}): {e}",
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
            artifact: opts.artifact,
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
mod tests {
    use super::*;
    use crate::chunk::local::{find_local, verify_in_place};
    use crate::chunk::plan::plan;
    use crate::chunk::ChunkParams;
    use std::cell::RefCell;
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// An in-memory "server": counts bytes sent, can drop a request after some bytes.
    struct Mem {
        data: Vec<u8>,
        sent: AtomicU64,
        requests: Mutex<Vec<(u64, u64)>>,
        drop_after: AtomicUsize,
    }

    struct Dropping {
        inner: std::io::Cursor<Vec<u8>>,
        left: usize,
    }

    impl Read for Dropping {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.left == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "drop",
                ));
            }
            let n = buf.len().min(self.left);
            let n = self.inner.read(&mut buf[..n])?;
            self.left -= n;
            Ok(n)
        }
    }

    impl RangeSource for Mem {
        fn open_range(&self, start: u64, stop: u64) -> Result<Box<dyn Read + Send>> {
            self.requests.lock().unwrap().push((start, stop));
            let body = self.data[start as usize..stop as usize].to_vec();
            let left = match self.drop_after.swap(usize::MAX, Ordering::SeqCst) {
                usize::MAX => body.len(),
                n => n.min(body.len()),
            };
            self.sent.fetch_add(left as u64, Ordering::SeqCst);
            Ok(Box::new(Dropping {
                inner: std::io::Cursor::new(body),
                left,
            }))
        }
        fn location(&self) -> String {
            "mem://rootfs".into()
        }
    }

    struct Counts(AtomicU64, AtomicU64);
    impl ApplyProgress for Counts {
        fn fetched(&self, b: u64) {
            self.0.fetch_add(b, Ordering::SeqCst);
        }
        fn reused(&self, b: u64) {
            self.1.fetch_add(b, Ordering::SeqCst);
        }
    }

    fn opts(sha: &[u8]) -> ApplyOptions<'static> {
        ApplyOptions {
            artifact: Artifact::Rootfs,
            sha256: hex::encode(crate::chunk::digest(sha)),
            retries: 3,
            retry_delay: Duration::from_millis(1),
            throttle: Throttle::default(),
            deadline: None,
            min_rate: None,
        }
    }

    fn local_file(bytes: &[u8]) -> LocalFile {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        LocalFile {
            file: f,
            offset: 0,
            len: bytes.len() as u64,
            name: "running rootfs".into(),
        }
    }

    fn mem(data: &[u8]) -> Mem {
        Mem {
            data: data.to_vec(),
            sent: AtomicU64::new(0),
            requests: Mutex::new(Vec::new()),
            drop_after: AtomicUsize::new(usize::MAX),
        }
    }

    /// `len` bytes of noise from `seed` and their index at 8 KiB average chunks.
    fn indexed(len: usize, seed: u64) -> (ChunkParams, Vec<u8>, ChunkIndex) {
        let p = ChunkParams::with_avg(8 << 10);
        let new = crate::chunk::index::tests_noise(len, seed);
        let ix = ChunkIndex::build(&new[..], p).unwrap();
        (p, new, ix)
    }

    /// The plan of a target that holds nothing, with no local file: every chunk fetched.
    fn fetch_all(ix: &ChunkIndex) -> Plan {
        let n = ix.chunks.len();
        plan(ix, &vec![false; n], &vec![None; n])
    }

    /// [`apply`] into `target`, progress counted and dropped.
    fn run(
        ix: &ChunkIndex,
        pl: &Plan,
        target: &RefCell<Vec<u8>>,
        remotes: &[&dyn RangeSource],
        locals: &[LocalFile],
        o: &ApplyOptions,
    ) -> Result<Transfer> {
        let counts = Counts(AtomicU64::new(0), AtomicU64::new(0));
        apply(ix, pl, target, remotes, locals, o, &counts)
    }

    #[test]
    fn delta_copies_what_the_node_has_and_fetches_only_the_rest_even_across_a_drop() {
        let p = ChunkParams::with_avg(8 << 10);
        let old = crate::chunk::index::tests_noise(1_000_000, 1);
        let mut new = old.clone();
        // Three edits: the bytes between are reused from the local copy.
        for (at, seed) in [(100_000, 2), (500_000, 3), (900_000, 4)] {
            new[at..at + 3000].copy_from_slice(&crate::chunk::index::tests_noise(3000, seed));
        }
        let ix = ChunkIndex::build(&new[..], p).unwrap();
        let locals = [local_file(&old)];
        let present = vec![false; ix.chunks.len()];
        let wanted = vec![true; ix.chunks.len()];
        let found = find_local(&ix, &wanted, &locals).unwrap();
        let pl = plan(&ix, &present, &found);
        assert!(!pl.stream);
        assert!(pl.fetch_bytes < 120_000, "{}", pl.fetch_bytes);
        let server = mem(&new);
        server.drop_after.store(5000, Ordering::SeqCst);
        let target = RefCell::new(Vec::new());
        let counts = Counts(AtomicU64::new(0), AtomicU64::new(0));
        let t = apply(&ix, &pl, &target, &[&server], &locals, &opts(&new), &counts).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        assert_eq!(t.fetched, pl.fetch_bytes);
        assert_eq!(t.copied, pl.copy_bytes);
        assert_eq!(counts.0.load(Ordering::SeqCst), t.fetched);
        assert_eq!(counts.1.load(Ordering::SeqCst), t.copied);
        assert_eq!(
            t.requests,
            pl.ranges.len() as u64 + 1,
            "one re-opened request"
        );
        // Bytes on the wire: the plan plus at most the dropped partial chunk.
        let sent = server.sent.load(Ordering::SeqCst);
        assert!(
            sent <= pl.fetch_bytes + 5000,
            "{sent} > {} + 5000",
            pl.fetch_bytes
        );
        assert_eq!(pl.ranges.len(), 3, "{:?}", pl.ranges);
    }

    #[test]
    fn a_tampered_chunk_is_refused_before_it_is_written() {
        let (_, new, ix) = indexed(300_000, 7);
        let mut served = new.clone();
        let victim = ix.chunks[5];
        served[victim.offset as usize + 10] ^= 0xff;
        let n = ix.chunks.len();
        let pl = fetch_all(&ix);
        let target = RefCell::new(Vec::new());
        let e = run(&ix, &pl, &target, &[&mem(&served)], &[], &opts(&new)).unwrap_err();
        assert!(matches!(e, Error::ChunkDigest { chunk: 5, .. }), "{e}");
        assert!(e.to_string().contains("refused before writing"), "{e}");
        assert_eq!(
            target.borrow().len() as u64,
            victim.offset,
            "nothing of chunk 5 written"
        );

        // A re-run keeps chunks 0..5 (verified in place) and fetches from chunk 5 on.
        let t2 = target.borrow().clone();
        let present = verify_in_place(&ix, &t2[..], t2.len() as u64).unwrap();
        assert_eq!(present.iter().filter(|p| **p).count(), 5);
        let pl = plan(&ix, &present, &vec![None; n]);
        let server = mem(&new);
        let t = run(&ix, &pl, &target, &[&server], &[], &opts(&new)).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        assert_eq!(t.kept, victim.offset);
        assert_eq!(
            server.sent.load(Ordering::SeqCst),
            new.len() as u64 - victim.offset
        );
    }

    #[test]
    fn a_chunk_gone_from_the_local_file_is_fetched_and_a_wrong_whole_file_is_refused() {
        let (_, new, ix) = indexed(400_000, 8);
        let n = ix.chunks.len();
        let locals = [local_file(&new)];
        let found = find_local(&ix, &vec![true; n], &locals).unwrap();
        let pl = plan(&ix, &vec![false; n], &found);
        assert_eq!(pl.copy_bytes, new.len() as u64);
        // The local file changes after planning: chunk 3 must then come from the server.
        let c3 = ix.chunks[3];
        std::os::unix::fs::FileExt::write_all_at(&locals[0].file, b"XXXX", c3.offset + 1).unwrap();
        let server = mem(&new);
        let target = RefCell::new(Vec::new());
        let t = run(&ix, &pl, &target, &[&server], &locals, &opts(&new)).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        assert_eq!(t.fetched, u64::from(c3.len));
        assert_eq!(
            *server.requests.lock().unwrap(),
            vec![(c3.offset, c3.end())]
        );

        let mut o = opts(&new);
        o.sha256 = "00".repeat(32);
        let e = run(
            &ix,
            &pl,
            &RefCell::new(Vec::new()),
            &[&mem(&new)],
            &[local_file(&new)],
            &o,
        )
        .unwrap_err();
        assert!(matches!(e, Error::Checksum { .. }), "{e}");
    }

    #[test]
    fn a_corrupt_mirror_chunk_is_refused_and_taken_alone_from_the_origin() {
        let (_, new, ix) = indexed(400_000, 9);
        let bad = ix.chunks[6];
        let mut served = new.clone();
        served[bad.offset as usize + 3] ^= 0x55;
        let (mirror, origin) = (mem(&served), mem(&new));
        let target = RefCell::new(Vec::new());
        let pl = fetch_all(&ix);
        let t = run(&ix, &pl, &target, &[&mirror, &origin], &[], &opts(&new)).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        assert_eq!(t.refused, 1);
        assert_eq!(t.fetched, new.len() as u64);
        assert_eq!(t.from_mirrors, new.len() as u64 - u64::from(bad.len));
        // The origin served exactly the refused chunk; the mirror kept serving after it.
        assert_eq!(
            *origin.requests.lock().unwrap(),
            vec![(bad.offset, bad.end())]
        );
        assert_eq!(mirror.requests.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_dying_mirror_costs_at_most_the_chunk_in_flight() {
        let (p, new, ix) = indexed(500_000, 10);
        let (mirror, origin) = (mem(&new), mem(&new));
        mirror.drop_after.store(200_000, Ordering::SeqCst);
        let target = RefCell::new(Vec::new());
        let pl = fetch_all(&ix);
        let t = run(&ix, &pl, &target, &[&mirror, &origin], &[], &opts(&new)).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        let wire = mirror.sent.load(Ordering::SeqCst) + origin.sent.load(Ordering::SeqCst);
        assert!(
            wire <= new.len() as u64 + u64::from(p.max),
            "{wire} bytes for a {}-byte file",
            new.len()
        );
        assert_eq!(
            mirror.requests.lock().unwrap().len(),
            1,
            "never asked again"
        );
        assert_eq!(
            t.from_mirrors + origin.sent.load(Ordering::SeqCst),
            t.fetched
        );
    }

    #[test]
    fn a_byte_budget_stops_before_the_chunk_it_cannot_pay_and_the_next_run_resumes() {
        let (p, new, ix) = indexed(300_000, 11);
        let n = ix.chunks.len();
        let pl = fetch_all(&ix);
        let budget = crate::chunk::rate::Budget::new(100_000);
        let mut o = opts(&new);
        o.throttle.budget = Some(&budget);
        let server = mem(&new);
        let target = RefCell::new(Vec::new());
        let e = run(&ix, &pl, &target, &[&server], &[], &o).unwrap_err();
        let Error::Stopped {
            why: crate::chunk::rate::Stop::Budget { budget: b },
            fetched,
            ..
        } = e
        else {
            panic!("{e}")
        };
        let sent = server.sent.load(Ordering::SeqCst);
        assert_eq!((b, fetched), (100_000, sent));
        assert!(
            sent <= 100_000 && sent > 100_000 - u64::from(p.max),
            "{sent}"
        );
        assert_eq!(
            target.borrow().len() as u64,
            sent,
            "every byte read was written"
        );
        // The next run keeps all of it and fetches only the rest.
        let held = target.borrow().clone();
        let present = verify_in_place(&ix, &held[..], held.len() as u64).unwrap();
        let pl = plan(&ix, &present, &vec![None; n]);
        let again = mem(&new);
        let t = run(&ix, &pl, &target, &[&again], &[], &opts(&new)).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        assert_eq!(t.kept, sent);
        assert_eq!(again.sent.load(Ordering::SeqCst), new.len() as u64 - sent);
    }
}
