//! Bounded retrieval (TUF's slow-retrieval and endless-retry cases): a response that trickles
//! below the minimum rate is cut and retried, and a stage attempt ends at its overall deadline
//! with one error naming the URL, the last error, the attempts and the time spent. Servers
//! here listen on 127.0.0.1 only.

use libupgrade::Release;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use libupgrade::manifest::Arch;
use libupgrade::state::SlotState;
use libupgrade::MinRate;
use libupgrade::{NoProgress, Source, StageOptions};
use testkit::sim::SimNode;
use testkit::{keys, make_release, TestServer};

fn opts(retry_for: Duration, min_rate: Option<MinRate>) -> StageOptions {
    StageOptions {
        retry_delay: Duration::from_millis(200),
        retry_for: Some(retry_for),
        min_rate,
        ..StageOptions::default()
    }
}

/// Stage the release at `url` on `node` with `opts`, which must fail: the error's text and how
/// long the attempt took.
fn stage_fails(node: &SimNode, url: &str, opts: &StageOptions) -> (String, Duration) {
    let t = Instant::now();
    let e = node
        .updater()
        .stage(&Release::at(Source::parse(url)), opts, &NoProgress)
        .unwrap_err()
        .to_string();
    (e, t.elapsed())
}

#[test]
fn a_trickling_server_is_cut_by_the_minimum_rate_and_the_attempt_ends_at_its_deadline() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    make_release(&k, rels.path(), "v2", 2, 64 << 10, Arch::host());
    // 4 KB/s: the manifest and indexes arrive, the artifacts would take minutes.
    let srv = TestServer::paced(rels.path().to_path_buf(), 4000);
    let mut node = SimNode::new(&k.trust, 3, 1);
    node.cfg.download_retries = 1000;
    let rule = MinRate {
        bytes_per_sec: 20_000,
        window: Duration::from_secs(1),
    };
    let (e, took) = stage_fails(
        &node,
        &format!("{}v2", srv.base),
        &opts(Duration::from_secs(6), Some(rule)),
    );
    assert!(
        e.contains("minimum rate of 20000 bytes/s") && e.contains("timed out"),
        "{e}"
    );
    assert!(e.contains(&srv.base) && e.contains("gave up after"), "{e}");
    assert!(e.contains("deadline (--retry-for)"), "{e}");
    assert!(
        took < Duration::from_secs(12),
        "ended at its deadline, not later: {took:?}"
    );
    assert_ne!(
        node.updater().status().unwrap().slots[0].state,
        SlotState::Invalid,
        "the running slot is never touched"
    );
}

#[test]
fn a_server_that_never_answers_ends_at_the_deadline_naming_url_error_attempts_and_time() {
    let k = keys();
    // A port that refuses connections: bound, then closed.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut node = SimNode::new(&k.trust, 3, 1);
    node.cfg.download_retries = 1000;
    let url = format!("http://127.0.0.1:{port}/v2");
    let (e, took) = stage_fails(&node, &url, &opts(Duration::from_secs(3), None));
    assert!(took < Duration::from_secs(8), "{:?}", took);
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(
        e.contains("gave up after") && e.contains("deadline (--retry-for)"),
        "{e}"
    );
}

/// One-shot server answering every request with `response` (127.0.0.1 only), for `n` requests.
fn canned(response: &'static str, n: usize) -> String {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming().take(n) {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(response.as_bytes());
        }
    });
    base
}

#[test]
fn a_redirect_to_another_scheme_fails_at_once_naming_its_target() {
    let k = keys();
    let base = canned(
        "HTTP/1.1 302 Found\r\nLocation: file:///etc/passwd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        4,
    );
    let mut node = SimNode::new(&k.trust, 3, 1);
    node.cfg.download_retries = 1000;
    let (e, took) = stage_fails(
        &node,
        &format!("{base}v2"),
        &opts(Duration::from_secs(60), None),
    );
    assert!(
        took < Duration::from_secs(5),
        "a permanent answer is not retried"
    );
    assert!(
        e.contains("redirect to 'file:///etc/passwd' refused") && !e.contains("Some("),
        "{e}"
    );
}

/// Serves the files under `dir` (127.0.0.1 only) one body byte every `gap` for as long as the
/// client reads: a server that trickles even the manifest. Returns its base URL.
fn trickle_server(dir: std::path::PathBuf, gap: Duration) -> String {
    use std::io::{BufRead, BufReader, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                let mut r = BufReader::new(s.try_clone().unwrap());
                if r.read_line(&mut line).is_err() {
                    return;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                }
                let mut w = s;
                let Ok(body) = std::fs::read(dir.join(path.trim_start_matches('/'))) else {
                    let _ = w.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                    return;
                };
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                if w.write_all(head.as_bytes()).is_err() {
                    return;
                }
                for b in body {
                    std::thread::sleep(gap);
                    if w.write_all(&[b]).and_then(|()| w.flush()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    base
}

/// The measurement: a manifest trickled at a few bytes per second held `upgrade`
/// past any `--retry-for`. Every body is now read under the attempt's deadline.
#[test]
fn a_trickled_manifest_ends_at_the_attempts_deadline_named_as_a_timeout() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    make_release(&k, rels.path(), "v2", 2, 4096, Arch::host());
    let base = trickle_server(rels.path().to_path_buf(), Duration::from_millis(100));
    let mut node = SimNode::new(&k.trust, 3, 1);
    node.cfg.download_retries = 1000;
    let (e, took) = stage_fails(
        &node,
        &format!("{base}v2"),
        &opts(Duration::from_secs(2), None),
    );
    assert!(
        took < Duration::from_secs(8),
        "ended at its deadline: {took:?}"
    );
    assert!(
        e.contains("manifest.json") && e.contains("timed out"),
        "{e}"
    );
    assert!(e.contains("--retry-for"), "{e}");
}

/// A trickled manifest is also cut by the minimum rate, as an artifact is.
#[test]
fn a_trickled_manifest_is_cut_by_the_minimum_rate() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    make_release(&k, rels.path(), "v2", 2, 4096, Arch::host());
    let base = trickle_server(rels.path().to_path_buf(), Duration::from_millis(20));
    let mut node = SimNode::new(&k.trust, 3, 1);
    node.cfg.download_retries = 2;
    let rule = MinRate {
        bytes_per_sec: 1000,
        window: Duration::from_millis(500),
    };
    let (e, _) = stage_fails(
        &node,
        &format!("{base}v2"),
        &opts(Duration::from_secs(60), Some(rule)),
    );
    assert!(
        e.contains("manifest.json") && e.contains("minimum rate of 1000 bytes/s"),
        "{e}"
    );
}
