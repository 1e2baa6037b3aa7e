//! The executor against in-memory targets and scripted range sources: delta copies, drops,
//! tampered and corrupt chunks, dying mirrors and byte budgets.

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
        artifact: crate::manifest::Artifact::Rootfs.into(),
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
    let budget = crate::net::rate::Budget::new(100_000);
    let mut o = opts(&new);
    o.throttle.budget = Some(&budget);
    let server = mem(&new);
    let target = RefCell::new(Vec::new());
    let e = run(&ix, &pl, &target, &[&server], &[], &o).unwrap_err();
    let Error::Stopped {
        why: crate::net::rate::Stop::Budget { budget: b },
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
