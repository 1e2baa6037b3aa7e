//! Executing a [`Plan`]: every chunk of the file in order — kept, copied from a local file, or
//! read from a range request — is checked against its digest before it is written, and the
//! whole-file sha256 is computed on the way (file order, so no second pass) and compared at
//! the end. Memory: one buffer of the largest chunk size.
//!
//! A dropped range request is re-opened at the chunk that was being read; only that chunk's
//! bytes are fetched again. A chunk whose digest is wrong is never written: the server holds
//! different bytes than the signed index, which no retry can fix.

use std::io::Read;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use super::index::ChunkEntry;
use super::local::LocalFile;
use super::plan::{Action, FetchRange, LocalRef, Plan};
use super::rate::{Limited, MinRate, RateLimit, Watched};
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
    pub limit: Option<&'a RateLimit>,
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
    /// Range requests made (including re-opened ones).
    pub requests: u64,
}

/// Make the target hold the file `index` describes, following `plan`.
pub fn apply(
    index: &ChunkIndex,
    plan: &Plan,
    target: &dyn ChunkTarget,
    remote: &dyn RangeSource,
    locals: &[LocalFile],
    opts: &ApplyOptions,
    progress: &dyn ApplyProgress,
) -> Result<Transfer> {
    let mut a = Applier {
        target,
        remote,
        locals,
        opts,
        progress,
        t: Transfer::default(),
        stream: None,
        backoff: Backoff::new(opts.retry_delay, opts.retries).until(opts.deadline),
        loc: remote.location(),
    };
    let mut whole = Sha256::new();
    let mut buf = vec![0u8; index.params.max as usize];
    let mut last_sync = Instant::now();
    for (i, c) in index.chunks.iter().enumerate() {
        let data = &mut buf[..c.len as usize];
        match plan.actions[i] {
            Action::Keep => a.keep(c, data)?,
            Action::Copy(l) => a.copy(i, c, l, data)?,
            Action::Fetch(r) => a.fetch(i, c, (r, plan.ranges[r]), data)?,
        }
        whole.update(&*data);
        if last_sync.elapsed() >= Duration::from_secs(5) {
            target.sync()?;
            last_sync = Instant::now();
        }
    }
    let Applier { t, loc, .. } = a;
    let found = hex::encode(whole.finalize());
    if found != opts.sha256 {
        return Err(Error::Checksum {
            artifact: opts.artifact,
            location: loc,
            expected: opts.sha256.clone(),
            found,
        });
    }
    target.sync()?;
    Ok(t)
}

/// One [`apply`] in progress: where chunks go and come from, what was done, and the open
/// range request (the number of the planned range it reads, and the response).
struct Applier<'a> {
    target: &'a dyn ChunkTarget,
    remote: &'a dyn RangeSource,
    locals: &'a [LocalFile],
    opts: &'a ApplyOptions<'a>,
    progress: &'a dyn ApplyProgress,
    t: Transfer,
    stream: Option<(usize, Box<dyn Read + Send + 'a>)>,
    backoff: Backoff,
    loc: String,
}

impl Applier<'_> {
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
        } else {
            // The local file changed under us (it should not): fetch this one chunk.
            log::warn!(
                "{}: chunk {i} no longer matches at {} byte {}; fetching it",
                self.opts.artifact,
                src.name,
                l.offset
            );
            let mut r = self.remote.open_range(c.offset, c.end())?;
            self.t.requests += 1;
            r.read_exact(data).map_err(|e| Error::Fetch {
                location: self.loc.clone(),
                what: format!("chunk {i} at byte {}: {e}", c.offset),
                retryable: true,
            })?;
            check(self.opts, &self.loc, i, c.offset, &c.digest, data)?;
            self.t.fetched += len;
            self.progress.fetched(len);
        }
        self.target.write_at(c.offset, data)
    }

    /// Read chunk `i` from planned range `r` (re-opening it at this chunk after a drop),
    /// check it and write it.
    fn fetch(
        &mut self,
        i: usize,
        c: &ChunkEntry,
        (r, range): (usize, FetchRange),
        data: &mut [u8],
    ) -> Result<()> {
        loop {
            if self.stream.as_ref().is_none_or(|s| s.0 != r)
                && !self.open(r, c.offset, range.stop)?
            {
                continue;
            }
            let s = &mut self.stream.as_mut().expect("opened above").1;
            match s.read_exact(data) {
                Ok(()) => break,
                Err(e) => {
                    self.stream = None;
                    self.dropped(i, c, e)?;
                }
            }
        }
        self.backoff.progressed();
        check(self.opts, &self.loc, i, c.offset, &c.digest, data)?;
        self.target.write_at(c.offset, data)?;
        self.t.fetched += u64::from(c.len);
        self.progress.fetched(u64::from(c.len));
        Ok(())
    }

    /// Open bytes `start..stop` for planned range `r`: false after a transient failure (the
    /// backoff waited; try again), an error when the loop gives up.
    fn open(&mut self, r: usize, start: u64, stop: u64) -> Result<bool> {
        match self.remote.open_range(start, stop) {
            Ok(s) => {
                self.t.requests += 1;
                let s = Limited::new(Watched::new(s, self.opts.min_rate), self.opts.limit);
                self.stream = Some((r, Box::new(s)));
                Ok(true)
            }
            Err(e) => {
                self.backoff.attempt_failed(&self.loc, e)?;
                Ok(false)
            }
        }
    }

    /// The connection dropped inside chunk `i`: wait before re-requesting it, or give up.
    fn dropped(&mut self, i: usize, c: &ChunkEntry, e: std::io::Error) -> Result<()> {
        let what = format!(
            "connection dropped in chunk {i} (bytes {}..{}): {e}",
            c.offset,
            c.end()
        );
        let Some(delay) = self.backoff.failed() else {
            return Err(Error::Fetch {
                location: self.loc.clone(),
                what: format!(
                    "{} (a later run keeps every chunk already written)",
                    self.backoff.gave_up(&what)
                ),
                retryable: true,
            });
        };
        log::warn!(
            "{}: {what}; re-requesting from byte {} in {delay:?}",
            self.loc,
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
            limit: None,
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
        let t = apply(&ix, &pl, &target, &server, &locals, &opts(&new), &counts).unwrap();
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
        let p = ChunkParams::with_avg(8 << 10);
        let new = crate::chunk::index::tests_noise(300_000, 7);
        let ix = ChunkIndex::build(&new[..], p).unwrap();
        let mut served = new.clone();
        let victim = ix.chunks[5];
        served[victim.offset as usize + 10] ^= 0xff;
        let n = ix.chunks.len();
        let pl = plan(&ix, &vec![false; n], &vec![None; n]);
        let target = RefCell::new(Vec::new());
        let counts = Counts(AtomicU64::new(0), AtomicU64::new(0));
        let e = apply(&ix, &pl, &target, &mem(&served), &[], &opts(&new), &counts).unwrap_err();
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
        let t = apply(&ix, &pl, &target, &server, &[], &opts(&new), &counts).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        assert_eq!(t.kept, victim.offset);
        assert_eq!(
            server.sent.load(Ordering::SeqCst),
            new.len() as u64 - victim.offset
        );
    }

    #[test]
    fn a_chunk_gone_from_the_local_file_is_fetched_and_a_wrong_whole_file_is_refused() {
        let p = ChunkParams::with_avg(8 << 10);
        let new = crate::chunk::index::tests_noise(400_000, 8);
        let ix = ChunkIndex::build(&new[..], p).unwrap();
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
        let counts = Counts(AtomicU64::new(0), AtomicU64::new(0));
        let t = apply(&ix, &pl, &target, &server, &locals, &opts(&new), &counts).unwrap();
        assert_eq!(target.borrow().as_slice(), new.as_slice());
        assert_eq!(t.fetched, u64::from(c3.len));
        assert_eq!(
            *server.requests.lock().unwrap(),
            vec![(c3.offset, c3.end())]
        );

        let mut o = opts(&new);
        o.sha256 = "00".repeat(32);
        let e = apply(
            &ix,
            &pl,
            &RefCell::new(Vec::new()),
            &mem(&new),
            &[local_file(&new)],
            &o,
            &counts,
        )
        .unwrap_err();
        assert!(matches!(e, Error::Checksum { .. }), "{e}");
    }
}
