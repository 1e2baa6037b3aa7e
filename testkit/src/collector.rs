//! [`report_sink`]: a stand-in for the fleet's report collector, for the tests of the node's
//! report sending (libupgrade's sender, the agent's node port).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver};

/// A collector stand-in on 127.0.0.1: each request's body is handed over (before it is
/// answered), and the requests are answered with `statuses` in order, `200` once they run out.
/// Returns the report URL and the bodies. The listener lives as long as the receiver.
pub fn report_sink(statuses: Vec<u16>) -> (String, Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/reports", l.local_addr().unwrap());
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut statuses = statuses.into_iter();
        for mut c in l.incoming().flatten() {
            let Some(body) = read_body(&mut c) else {
                continue;
            };
            if tx.send(body).is_err() {
                return;
            }
            let status = statuses.next().unwrap_or(200);
            let _ = write!(
                c,
                "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    (url, rx)
}

/// The body of the one request on `c` (by its `content-length`), or None when the connection
/// ends first.
fn read_body(c: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = c.read(&mut chunk).ok()?;
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let l = l.to_ascii_lowercase();
                    l.strip_prefix("content-length:")?.trim().parse().ok()
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Some(buf[end + 4..end + 4 + len].to_vec());
            }
        }
        if n == 0 {
            return None;
        }
    }
}
