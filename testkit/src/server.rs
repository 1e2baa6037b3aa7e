//! [`TestServer`]: the workspace's one test HTTP file server, used by the stage and agent
//! tests, the benches and the VM scenarios (which show it to the guest as 10.0.2.2).
//!
//! Hand-written on std rather than a crate: the tests need knobs that test HTTP servers such as
//! httpmock or wiremock do not offer — half-way drops, pacing that can change mid-transfer, a
//! count of the bytes on the wire, the number of bodies in flight — and the whole protocol here
//! is one request line and one `Range` header.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One answered request, in the order the server answered them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// `GET`, `HEAD`, …
    pub method: String,
    /// The path asked for, as sent (query included).
    pub path: String,
    /// The `Range: bytes=a-` / `a-b` asked for: `(a, Some(b))` inclusive, `(a, None)` open.
    pub range: Option<(u64, Option<u64>)>,
    /// The status answered.
    pub status: u16,
    /// Body bytes announced (`Content-Length`; a dropped body sends half).
    pub bytes: u64,
}

impl Served {
    /// Whether this was a GET of `file` (the path's last segments, e.g. `v2/manifest.json`).
    pub fn is_get_of(&self, file: &str) -> bool {
        self.method == "GET" && self.path.split('?').next().unwrap_or("").ends_with(file)
    }
}

impl std::fmt::Display for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        match self.range {
            Some((a, Some(b))) => write!(f, " range={a}-{b}")?,
            Some((a, None)) => write!(f, " range={a}-")?,
            None => {}
        }
        write!(f, " -> {} ({} bytes)", self.status, self.bytes)
    }
}

/// A static file server on 127.0.0.1 serving a directory: GET and HEAD, `Range: bytes=a-` and
/// `a-b` (206 with `Content-Range`, 416 past the end), 404 for a missing file or a path that
/// leaves the directory, 405 for other methods; keep-alive unless the client says
/// `Connection: close`. Streams from the file (images of any size) and counts every byte it
/// sends, headers included (what the link carries), and the body bytes alone.
///
/// Knobs: a body rate in bytes/s that the test can change mid-transfer
/// ([`TestServer::set_rate`]), and dropping the next `drops` connections half way through a
/// body larger than 64 KiB. Stops accepting when dropped.
pub struct TestServer {
    /// `http://127.0.0.1:<port>/`.
    pub base: String,
    /// Connections still to be dropped half way through their body.
    pub drops: Arc<AtomicUsize>,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// What the connections share with the test.
#[derive(Default)]
struct Shared {
    /// Body bytes per second; 0: as fast as the socket takes them.
    rate: AtomicU64,
    /// Bytes sent, headers included (shared: [`TestServer::sent_counter`]).
    wire: Arc<AtomicU64>,
    /// Body bytes sent.
    body: AtomicU64,
    /// Bodies being sent right now.
    active: AtomicUsize,
    log: Mutex<Vec<Served>>,
    stop: AtomicBool,
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

impl TestServer {
    /// Serve `root`, dropping the next `drops` large bodies half way.
    pub fn start(root: PathBuf, drops: usize) -> TestServer {
        Self::spawn(root, drops, 0)
    }

    /// Serve `root` at `rate` body bytes per second (0: unpaced), never dropping. Each
    /// connection accepted while paced has its kernel send buffer pinned to [`PACED_SNDBUF`],
    /// so the bytes counted as sent but still queued in the kernel when a client dies are
    /// bounded (see [`TestServer::in_flight_bound`]).
    pub fn paced(root: PathBuf, rate: u64) -> TestServer {
        Self::spawn(root, 0, rate)
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

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Bytes sent so far, headers included.
    pub fn sent(&self) -> u64 {
        self.shared.wire.load(Ordering::SeqCst)
    }

    /// The byte counter itself (headers included), for code that measures a window of it.
    pub fn sent_counter(&self) -> Arc<AtomicU64> {
        self.shared.wire.clone()
    }

    /// Body bytes sent so far (file bytes only).
    pub fn body_sent(&self) -> u64 {
        self.shared.body.load(Ordering::SeqCst)
    }

    /// Response bodies being sent right now.
    pub fn active(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// Change the body rate (bytes/s, 0: unpaced); bodies in flight follow it from their next
    /// piece.
    pub fn set_rate(&self, rate: u64) {
        self.shared.rate.store(rate, Ordering::SeqCst);
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<Served> {
        self.shared.log.lock().expect("request log").clone()
    }

    /// How many requests were answered so far (a mark for [`TestServer::requests_since`]).
    pub fn request_count(&self) -> usize {
        self.shared.log.lock().expect("request log").len()
    }

    /// The requests answered after the first `mark`.
    pub fn requests_since(&self, mark: usize) -> Vec<Served> {
        self.shared.log.lock().expect("request log")[mark..].to_vec()
    }

    fn spawn(root: PathBuf, drops: usize, rate: u64) -> TestServer {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = l.local_addr().expect("local address");
        let drops = Arc::new(AtomicUsize::new(drops));
        let shared = Arc::new(Shared::default());
        shared.rate.store(rate, Ordering::SeqCst);
        let conn = Conn {
            root,
            drops: drops.clone(),
            shared: shared.clone(),
        };
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                if conn.shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                if conn.shared.rate.load(Ordering::SeqCst) > 0 {
                    pin_send_buffer(&s);
                }
                let conn = conn.clone();
                std::thread::spawn(move || conn.serve(s));
            }
        });
        TestServer {
            base: format!("http://{addr}/"),
            drops,
            addr,
            shared,
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag (it ends without serving this one).
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// A request's line and the headers the server honours.
struct Request {
    method: String,
    path: String,
    range: Option<(u64, Option<u64>)>,
    close: bool,
}

impl Request {
    /// The next request on the connection; None when the client closed it.
    fn read(rd: &mut impl BufRead) -> Option<Request> {
        let mut line = String::new();
        if rd.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("/").to_string();
        let mut close = parts.next() == Some("HTTP/1.0");
        let mut range = None;
        loop {
            let mut h = String::new();
            if rd.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            let Some((k, v)) = h.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("range") {
                range = v.strip_prefix("bytes=").and_then(|v| {
                    let (a, b) = v.split_once('-')?;
                    Some((a.trim().parse().ok()?, b.trim().parse().ok()))
                });
            } else if k.eq_ignore_ascii_case("connection") {
                close = v.eq_ignore_ascii_case("close");
            }
        }
        Some(Request {
            method,
            path,
            range,
            close,
        })
    }
}

/// The file under `root` that `url_path` names, or None when it would leave `root`.
fn resolve(root: &Path, url_path: &str) -> Option<PathBuf> {
    let rel = Path::new(url_path.split('?').next()?.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

#[derive(Clone)]
struct Conn {
    root: PathBuf,
    drops: Arc<AtomicUsize>,
    shared: Arc<Shared>,
}

/// What to answer: a status, its headers, and the body's byte range of the file.
struct Answer {
    status: u16,
    headers: String,
    body: Option<(std::fs::File, u64, u64)>,
}

impl Conn {
    fn send(&self, w: &mut TcpStream, bytes: &[u8]) -> bool {
        let ok = w.write_all(bytes).is_ok();
        if ok {
            self.shared
                .wire
                .fetch_add(bytes.len() as u64, Ordering::SeqCst);
        }
        ok
    }

    fn serve(&self, s: TcpStream) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let Ok(r) = s.try_clone() else { return };
        let mut rd = BufReader::new(r);
        let mut w = s;
        while let Some(req) = Request::read(&mut rd) {
            if !self.answer(&req, &mut w) || req.close {
                return;
            }
        }
    }

    /// Answer one request; false when the connection is done (client gone, or a drop).
    fn answer(&self, req: &Request, w: &mut TcpStream) -> bool {
        let a = self.decide(req);
        let n = a.body.as_ref().map_or(0, |b| b.2 - b.1);
        let cut = req.method == "GET"
            && n > 64 * 1024
            && self
                .drops
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1))
                .is_ok();
        self.shared.log.lock().expect("request log").push(Served {
            method: req.method.clone(),
            path: req.path.clone(),
            range: req.range,
            status: a.status,
            bytes: if cut { n / 2 } else { n },
        });
        let reason = match a.status {
            200 => "OK",
            206 => "Partial Content",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Range Not Satisfiable",
        };
        let close = if req.close {
            "Connection: close\r\n"
        } else {
            ""
        };
        let head = format!("HTTP/1.1 {} {reason}\r\n{}{close}\r\n", a.status, a.headers);
        if !self.send(w, head.as_bytes()) {
            return false;
        }
        let Some((mut f, start, _)) = a.body.filter(|_| req.method == "GET") else {
            return true;
        };
        let until = if cut { n / 2 } else { n };
        self.shared.active.fetch_add(1, Ordering::SeqCst);
        let ok = f.seek(SeekFrom::Start(start)).is_ok() && self.body(&mut f, w, until);
        self.shared.active.fetch_sub(1, Ordering::SeqCst);
        if cut {
            let _ = w.flush();
            let _ = w.shutdown(std::net::Shutdown::Both);
            return false;
        }
        ok
    }

    /// The answer to `req`: the file (or its range), 404, 405 or 416.
    fn decide(&self, req: &Request) -> Answer {
        let empty = |status: u16, extra: String| Answer {
            status,
            headers: format!("{extra}Content-Length: 0\r\n"),
            body: None,
        };
        if req.method != "GET" && req.method != "HEAD" {
            return empty(405, String::new());
        }
        let file = resolve(&self.root, &req.path).filter(|p| p.is_file());
        let Some(Ok(f)) = file.map(std::fs::File::open) else {
            return empty(404, String::new());
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let Some((a, b)) = req.range else {
            return Answer {
                status: 200,
                headers: format!("Content-Length: {len}\r\nAccept-Ranges: bytes\r\n"),
                body: Some((f, 0, len)),
            };
        };
        let stop = b.map_or(len, |b| b.saturating_add(1).min(len));
        if a >= len || stop <= a {
            return empty(416, format!("Content-Range: bytes */{len}\r\n"));
        }
        Answer {
            status: 206,
            headers: format!(
                "Content-Length: {}\r\nAccept-Ranges: bytes\r\nContent-Range: bytes {a}-{}/{len}\r\n",
                stop - a,
                stop - 1
            ),
            body: Some((f, a, stop)),
        }
    }

    /// `n` bytes from `f` in 16 KiB pieces, paced to the current rate; false when the client
    /// left.
    fn body(&self, f: &mut std::fs::File, w: &mut TcpStream, n: u64) -> bool {
        let t0 = Instant::now();
        let mut buf = vec![0u8; 16 << 10];
        let mut done = 0u64;
        while done < n && !self.shared.stop.load(Ordering::SeqCst) {
            let want = (n - done).min(buf.len() as u64) as usize;
            if f.read_exact(&mut buf[..want]).is_err() {
                return false;
            }
            let rate = self.shared.rate.load(Ordering::SeqCst);
            if rate > 0 {
                let due = Duration::from_secs_f64(done as f64 / rate as f64);
                if let Some(d) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(d);
                }
            }
            if !self.send(w, &buf[..want]) {
                return false;
            }
            self.shared.body.fetch_add(want as u64, Ordering::SeqCst);
            done += want as u64;
        }
        done == n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(port: u16, req: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        String::from_utf8(v).unwrap()
    }

    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("v1")).unwrap();
        std::fs::write(dir.path().join("v1/f"), b"0123456789").unwrap();
        dir
    }

    #[test]
    fn serves_whole_files_ranges_head_404_405_416_and_counts_bytes() {
        let dir = root();
        let srv = TestServer::start(dir.path().into(), 0);
        let close = "Connection: close\r\n\r\n";
        let r = raw(srv.port(), &format!("GET /v1/f HTTP/1.1\r\n{close}"));
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n0123456789"));
        let r = raw(
            srv.port(),
            &format!("GET /v1/f HTTP/1.1\r\nRange: bytes=4-\r\n{close}"),
        );
        assert!(r.starts_with("HTTP/1.1 206"), "{r}");
        assert!(r.contains("Content-Range: bytes 4-9/10"), "{r}");
        assert!(r.ends_with("\r\n\r\n456789"), "{r}");
        let r = raw(
            srv.port(),
            &format!("GET /v1/f HTTP/1.1\r\nRange: bytes=2-3\r\n{close}"),
        );
        assert!(r.ends_with("\r\n\r\n23"), "{r}");
        let r = raw(
            srv.port(),
            &format!("GET /v1/f HTTP/1.1\r\nRange: bytes=10-\r\n{close}"),
        );
        assert!(
            r.starts_with("HTTP/1.1 416") && r.contains("bytes */10"),
            "{r}"
        );
        let r = raw(srv.port(), &format!("HEAD /v1/f HTTP/1.1\r\n{close}"));
        assert!(
            r.contains("Content-Length: 10") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = raw(
            srv.port(),
            &format!("GET /../etc/passwd HTTP/1.1\r\n{close}"),
        );
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        let r = raw(srv.port(), &format!("PUT /v1/f HTTP/1.1\r\n{close}"));
        assert!(r.starts_with("HTTP/1.1 405"), "{r}");
        assert_eq!(srv.body_sent(), 10 + 6 + 2);
        let log: Vec<String> = srv.requests().iter().map(ToString::to_string).collect();
        assert_eq!(
            log,
            [
                "GET /v1/f -> 200 (10 bytes)",
                "GET /v1/f range=4- -> 206 (6 bytes)",
                "GET /v1/f range=2-3 -> 206 (2 bytes)",
                "GET /v1/f range=10- -> 416 (0 bytes)",
                "HEAD /v1/f -> 200 (10 bytes)",
                "GET /../etc/passwd -> 404 (0 bytes)",
                "PUT /v1/f -> 405 (0 bytes)",
            ]
        );
        assert!(srv.sent() > srv.body_sent());
    }

    #[test]
    fn keeps_the_connection_alive_and_drops_a_large_body_half_way() {
        let dir = root();
        std::fs::write(dir.path().join("big"), vec![7u8; 256 << 10]).unwrap();
        let srv = TestServer::start(dir.path().into(), 1);
        // Two requests on one connection: the first answered whole, the second (large) cut.
        let r = raw(
            srv.port(),
            "GET /v1/f HTTP/1.1\r\n\r\nGET /big HTTP/1.1\r\n\r\n",
        );
        assert!(r.contains("0123456789HTTP/1.1 200 OK"), "{}", &r[..200]);
        assert_eq!(srv.body_sent(), 10 + (128 << 10));
        assert_eq!(srv.drops.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_rate_slows_the_body_can_change_in_flight_and_counts_as_active() {
        let dir = root();
        std::fs::write(dir.path().join("big"), vec![7u8; 256 << 10]).unwrap();
        let srv = TestServer::paced(dir.path().into(), 64 << 10);
        let port = srv.port();
        let t = std::thread::spawn(move || {
            raw(port, "GET /big HTTP/1.1\r\nConnection: close\r\n\r\n").len()
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(srv.active(), 1);
        // At 64 KiB/s the body would take 4 s; unpaced, it ends at once.
        let t0 = Instant::now();
        srv.set_rate(0);
        assert!(t.join().unwrap() > 256 << 10);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(srv.active(), 0);
    }
}
