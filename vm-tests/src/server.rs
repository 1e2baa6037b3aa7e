//! The host side of a scenario's HTTP: the release directories served to the guest, and a
//! small client for the guest's own HTTP port.
//!
//! The server is the workspace's one test file server ([`testkit::TestServer`]: GET, HEAD,
//! ranges, a rate the scenario changes mid-transfer to hold a download open long enough to
//! observe the node serving during it, bodies in flight, a request log); [`ReleaseServer`]
//! adds only the guest's view of it (QEMU user networking shows 127.0.0.1 as 10.0.2.2).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use testkit::TestServer;

use crate::error::{Error, Result};

/// The release directories served to the guest; stops when dropped. Everything else a
/// scenario asks of it (bytes, rate, requests) is the [`TestServer`]'s.
pub struct ReleaseServer(TestServer);

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
        Ok(ReleaseServer(TestServer::paced(root.to_path_buf(), rate)))
    }

    /// The URL of release `version` as the guest sees it.
    pub fn guest_url(&self, version: &str) -> String {
        format!("http://10.0.2.2:{}/{version}/", self.0.port())
    }

    /// The URL of the served directory itself (a channel) as the guest sees it.
    pub fn guest_root(&self) -> String {
        format!("http://10.0.2.2:{}/", self.0.port())
    }
}

impl std::ops::Deref for ReleaseServer {
    type Target = TestServer;

    fn deref(&self) -> &TestServer {
        &self.0
    }
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
