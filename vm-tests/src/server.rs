//! A small HTTP/1.1 file server for the release directories, run inside the harness on
//! 127.0.0.1 (QEMU user networking shows it to the guest as 10.0.2.2).
//!
//! Written here rather than reusing `k3os-ops release serve` because the scenarios need to know
//! *when* a transfer is in flight (to prove the node keeps serving during the download) and to
//! slow it to a chosen rate so that window is long enough to observe. It answers GET and HEAD,
//! `Range: bytes=N-` / `bytes=N-M` with 206 + Content-Range, 416 past the end, 404 otherwise.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

#[derive(Default)]
struct Stats {
    active: AtomicUsize,
    bytes: AtomicU64,
    log: Mutex<Vec<String>>,
}

/// A running server; stops when dropped.
pub struct ReleaseServer {
    port: u16,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    rate: Arc<AtomicU64>,
}

impl ReleaseServer {
    /// Serve `root` on 127.0.0.1 on a free port. `rate` caps each response body in bytes/s
    /// (0 = unlimited).
    pub fn start(root: &Path, rate: u64) -> Result<ReleaseServer> {
        if !root.is_dir() {
            return Err(Error::Missing {
                what: "release directory".into(),
                path: root.into(),
                hint: "run just images-<arch>".into(),
            });
        }
        let l = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| Error::Server(format!("bind 127.0.0.1:0: {e}")))?;
        let port = l
            .local_addr()
            .map_err(|e| Error::Server(e.to_string()))?
            .port();
        l.set_nonblocking(true)
            .map_err(|e| Error::Server(e.to_string()))?;
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let rate = Arc::new(AtomicU64::new(rate));
        let (st, sp, rt, root) = (
            stats.clone(),
            stop.clone(),
            rate.clone(),
            root.to_path_buf(),
        );
        std::thread::spawn(move || {
            while !sp.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((s, _)) => {
                        let (st, rt, root, sp) = (st.clone(), rt.clone(), root.clone(), sp.clone());
                        std::thread::spawn(move || {
                            let _ = s.set_nonblocking(false);
                            let _ = serve(s, &root, &st, &rt, &sp);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(ReleaseServer {
            port,
            stats,
            stop,
            rate,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of release `version` as the guest sees it.
    pub fn guest_url(&self, version: &str) -> String {
        format!("http://10.0.2.2:{}/{version}/", self.port)
    }

    /// The URL of the served directory itself (a channel) as the guest sees it.
    pub fn guest_root(&self) -> String {
        format!("http://10.0.2.2:{}/", self.port)
    }

    /// Response bodies being sent right now.
    pub fn active(&self) -> usize {
        self.stats.active.load(Ordering::SeqCst)
    }

    /// Body bytes sent so far.
    pub fn bytes_sent(&self) -> u64 {
        self.stats.bytes.load(Ordering::SeqCst)
    }

    /// Change the per-response rate limit (bytes/s, 0 = unlimited).
    pub fn set_rate(&self, rate: u64) {
        self.rate.store(rate, Ordering::SeqCst);
    }

    /// One line per request: `GET /v2/rootfs.squashfs range=… -> 206 (n bytes)`.
    pub fn requests(&self) -> Vec<String> {
        self.stats.log.lock().expect("log lock").clone()
    }
}

impl Drop for ReleaseServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn resolve(root: &Path, url_path: &str) -> Option<PathBuf> {
    let p = url_path.split('?').next()?.trim_start_matches('/');
    let rel = Path::new(p);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

/// Parse `bytes=N-` or `bytes=N-M` against a file of `len` bytes: Ok(range) or Err(()) for 416.
fn parse_range(v: &str, len: u64) -> Option<std::result::Result<(u64, u64), ()>> {
    let spec = v.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end = if b.trim().is_empty() {
        len.saturating_sub(1)
    } else {
        b.trim().parse::<u64>().ok()?.min(len.saturating_sub(1))
    };
    if start >= len || end < start {
        return Some(Err(()));
    }
    Some(Ok((start, end)))
}

/// The request line and the one header the server honours.
struct Request {
    method: String,
    path: String,
    range: Option<String>,
}

impl Request {
    fn read(r: &mut impl BufRead) -> std::io::Result<Request> {
        let mut line = String::new();
        r.read_line(&mut line)?;
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut range = None;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.trim().eq_ignore_ascii_case("range") {
                    range = Some(v.trim().to_string());
                }
            }
        }
        Ok(Request {
            method,
            path,
            range,
        })
    }

    /// Record the answer in the server's request log.
    fn log(&self, st: &Stats, status: u16, n: u64) {
        st.log.lock().expect("log lock").push(format!(
            "{} {} range={} -> {status} ({n} bytes)",
            self.method,
            self.path,
            self.range.as_deref().unwrap_or("-")
        ));
    }
}

/// Answer one connection: a file (or its range) under `root`, 404, 405 or 416.
fn serve(
    s: TcpStream,
    root: &Path,
    st: &Stats,
    rate: &AtomicU64,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let req = Request::read(&mut BufReader::new(s.try_clone()?))?;
    let mut w = s;
    let head = req.method == "HEAD";
    let file = resolve(root, &req.path).filter(|p| p.is_file());
    let Some(file) = file.filter(|_| req.method == "GET" || head) else {
        let status = if req.method == "GET" || head {
            404
        } else {
            405
        };
        req.log(st, status, 0);
        write!(
            w,
            "HTTP/1.1 {status} {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            if status == 404 {
                "Not Found"
            } else {
                "Method Not Allowed"
            }
        )?;
        return Ok(());
    };
    let mut f = std::fs::File::open(&file)?;
    let len = f.metadata()?.len();
    let (status, start, end) = match req.range.as_deref().and_then(|v| parse_range(v, len)) {
        Some(Ok((a, b))) => (206, a, b),
        Some(Err(())) => {
            req.log(st, 416, 0);
            write!(w, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
            return Ok(());
        }
        None => (200, 0, len.saturating_sub(1)),
    };
    let n = if len == 0 { 0 } else { end - start + 1 };
    let mut hdr = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {n}\r\nAccept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n",
        if status == 206 { "Partial Content" } else { "OK" }
    );
    if status == 206 {
        hdr.push_str(&format!("Content-Range: bytes {start}-{end}/{len}\r\n"));
    }
    hdr.push_str("\r\n");
    w.write_all(hdr.as_bytes())?;
    req.log(st, status, n);
    if head || n == 0 {
        return Ok(());
    }
    f.seek(SeekFrom::Start(start))?;
    st.active.fetch_add(1, Ordering::SeqCst);
    let res = send_body(&mut f, &mut w, n, st, rate, stop);
    st.active.fetch_sub(1, Ordering::SeqCst);
    res
}

/// Copy `n` bytes from `f` to `w` at no more than `rate` bytes/s (read anew for every
/// block: the scenario changes it mid-transfer; 0 = unlimited), counting them in `st`.
fn send_body(
    f: &mut std::fs::File,
    w: &mut TcpStream,
    n: u64,
    st: &Stats,
    rate: &AtomicU64,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut left = n;
    let mut buf = vec![0u8; 64 << 10];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while left > 0 && !stop.load(Ordering::SeqCst) {
        let want = left.min(buf.len() as u64) as usize;
        let k = f.read(&mut buf[..want])?;
        if k == 0 {
            break;
        }
        w.write_all(&buf[..k])?;
        left -= k as u64;
        sent += k as u64;
        st.bytes.fetch_add(k as u64, Ordering::SeqCst);
        let rate = rate.load(Ordering::SeqCst);
        if rate > 0 {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    w.flush()
}

/// GET `http://127.0.0.1:<port><path>` with a short timeout; the body, or why not.
pub fn http_get(port: u16, path: &str, timeout: Duration) -> std::result::Result<String, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP response: {text:?}"))?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200") {
        return Err(format!("status line {status:?}"));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(port: u16, req: &str) -> Vec<u8> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn serves_ranges_404_416_and_tracks_bytes() {
        let dir = std::env::temp_dir().join(format!("vm-tests-srv-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("v1")).unwrap();
        std::fs::write(dir.join("v1/f"), b"0123456789").unwrap();
        let srv = ReleaseServer::start(&dir, 0).unwrap();
        assert_eq!(
            http_get(srv.port(), "/v1/f", Duration::from_secs(5)).unwrap(),
            "0123456789"
        );
        let r = String::from_utf8(raw(
            srv.port(),
            "GET /v1/f HTTP/1.1\r\nRange: bytes=4-\r\n\r\n",
        ))
        .unwrap();
        assert!(r.starts_with("HTTP/1.1 206"), "{r}");
        assert!(r.contains("Content-Range: bytes 4-9/10"), "{r}");
        assert!(r.ends_with("\r\n\r\n456789"), "{r}");
        let r = String::from_utf8(raw(
            srv.port(),
            "GET /v1/f HTTP/1.1\r\nRange: bytes=10-\r\n\r\n",
        ))
        .unwrap();
        assert!(r.starts_with("HTTP/1.1 416"), "{r}");
        let r = String::from_utf8(raw(srv.port(), "GET /../etc/passwd HTTP/1.1\r\n\r\n")).unwrap();
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        assert!(http_get(srv.port(), "/v1/missing", Duration::from_secs(5)).is_err());
        assert_eq!(srv.bytes_sent(), 16);
        assert_eq!(srv.requests().len(), 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rate_limit_slows_the_body_and_counts_as_active() {
        let dir = std::env::temp_dir().join(format!("vm-tests-srv-rate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("big"), vec![7u8; 256 << 10]).unwrap();
        let srv = ReleaseServer::start(&dir, 512 << 10).unwrap();
        let port = srv.port();
        let t = std::thread::spawn(move || {
            http_get(port, "/big", Duration::from_secs(10)).map(|b| b.len())
        });
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(srv.active(), 1);
        let t0 = Instant::now();
        let _ = t.join().unwrap();
        // 256 KiB at 512 KiB/s: about half a second in all, most of it after the 200 ms sleep.
        assert!(
            t0.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(srv.active(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
