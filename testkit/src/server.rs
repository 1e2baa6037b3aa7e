//! [`TestServer`]: the workspace's one test HTTP file server.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A static file server on 127.0.0.1 (GET, `Range: bytes=a-` / `a-b`, 404 for a missing file)
/// for the stage tests and the delta bench, streaming from the file (images of any size) and
/// counting every byte it sends (headers included: what the link carries). It can pace its
/// bodies to `rate` bytes/s (what a slow link looks like to the client) and drop the next
/// `drops` connections half way through a body larger than 64 KiB.
///
/// Hand-written on std rather than a crate: the tests need exactly these three knobs (half-way
/// drops, pacing, a wire-byte count), which test HTTP servers such as httpmock or wiremock do
/// not offer, and the whole protocol here is one request line and one Range header.
pub struct TestServer {
    pub base: String,
    /// Connections still to be dropped half way through their body.
    pub drops: Arc<AtomicUsize>,
    /// `path range` of every request, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
}

/// `SO_SNDBUF` of a paced server's connections (bytes; the kernel doubles it).
pub const PACED_SNDBUF: libc::c_int = 32 << 10;

/// Pin `s`'s kernel send buffer (autotuning would otherwise grow it to megabytes).
fn pin_send_buffer(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let v = PACED_SNDBUF;
    // SAFETY: a valid socket descriptor and a c_int option value of the size given.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "setsockopt(SO_SNDBUF): {}",
        std::io::Error::last_os_error()
    );
}

#[derive(Clone, Copy)]
struct Knobs {
    /// Body bytes per second; 0: as fast as the socket takes them.
    rate: u64,
}

impl TestServer {
    /// Serve `root`, dropping the next `drops` large bodies half way.
    pub fn start(root: PathBuf, drops: usize) -> TestServer {
        Self::spawn(root, drops, Knobs { rate: 0 })
    }

    /// Serve `root` at `rate` body bytes per second (0: unpaced), never dropping. Each
    /// connection's kernel send buffer is pinned to [`PACED_SNDBUF`], so the bytes counted as
    /// sent but still queued in the kernel when a client dies are bounded (see
    /// [`TestServer::in_flight_bound`]).
    pub fn paced(root: PathBuf, rate: u64) -> TestServer {
        Self::spawn(root, 0, Knobs { rate })
    }

    /// Most bytes this server can have counted as sent that a client killed at that moment
    /// never read: its pinned send buffer (the kernel doubles the value set) plus the client's
    /// default receive buffer (`net.ipv4.tcp_rmem`, middle value). Paced servers only.
    pub fn in_flight_bound() -> u64 {
        let rmem = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(128 << 10);
        2 * PACED_SNDBUF as u64 + rmem
    }

    /// Bytes sent so far, headers included.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// The byte counter itself, for code that measures a window of it.
    pub fn sent_counter(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    fn spawn(root: PathBuf, drops: usize, knobs: Knobs) -> TestServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}/", l.local_addr().unwrap());
        let drops = Arc::new(AtomicUsize::new(drops));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let conn = Conn {
            root,
            knobs,
            drops: drops.clone(),
            log: requests.clone(),
            sent: sent.clone(),
        };
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                if conn.knobs.rate > 0 {
                    pin_send_buffer(&s);
                }
                let conn = conn.clone();
                std::thread::spawn(move || conn.serve(s));
            }
        });
        TestServer {
            base,
            drops,
            requests,
            sent,
        }
    }
}

#[derive(Clone)]
struct Conn {
    root: PathBuf,
    knobs: Knobs,
    drops: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
}

impl Conn {
    fn send(&self, w: &mut TcpStream, bytes: &[u8]) -> bool {
        let ok = w.write_all(bytes).is_ok();
        if ok {
            self.sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        }
        ok
    }

    fn serve(&self, s: TcpStream) {
        let mut rd = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        loop {
            let mut line = String::new();
            if rd.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
            let mut range = None;
            loop {
                let mut h = String::new();
                if rd.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    // `a-` or `a-b` (inclusive).
                    let (a, b) = v.trim().split_once('-').unwrap_or((v.trim(), ""));
                    range = a.parse::<u64>().ok().map(|a| (a, b.parse::<u64>().ok()));
                }
            }
            self.log.lock().unwrap().push(format!("{path} {range:?}"));
            let file = self.root.join(path.trim_start_matches('/'));
            let Ok(mut f) = std::fs::File::open(&file) else {
                self.send(
                    &mut w,
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                );
                continue;
            };
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let start = range.map_or(0, |r| r.0).min(len);
            let stop = range
                .and_then(|r| r.1)
                .map_or(len, |b| (b + 1).min(len))
                .max(start);
            let head = if range.is_some() {
                format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {}-{}/{}\r\n\r\n",
                    stop - start,
                    start,
                    stop.saturating_sub(1),
                    len
                )
            } else {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    stop - start
                )
            };
            if !self.send(&mut w, head.as_bytes()) {
                return;
            }
            let body = stop - start;
            let cut = body > 64 * 1024
                && self
                    .drops
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            let until = if cut { body / 2 } else { body };
            if f.seek(SeekFrom::Start(start)).is_err() || !self.body(&mut f, &mut w, until) {
                return;
            }
            if cut {
                let _ = w.flush();
                let _ = w.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }

    /// `n` bytes from `f` in 16 KiB pieces, paced to the rate; false when the client left.
    fn body(&self, f: &mut std::fs::File, w: &mut TcpStream, n: u64) -> bool {
        let t0 = std::time::Instant::now();
        let mut buf = vec![0u8; 16 << 10];
        let mut done = 0u64;
        while done < n {
            let want = (n - done).min(buf.len() as u64) as usize;
            if f.read_exact(&mut buf[..want]).is_err() {
                return false;
            }
            if self.knobs.rate > 0 {
                let due = std::time::Duration::from_secs_f64(done as f64 / self.knobs.rate as f64);
                if let Some(d) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(d);
                }
            }
            if !self.send(w, &buf[..want]) {
                return false;
            }
            done += want as u64;
        }
        true
    }
}
