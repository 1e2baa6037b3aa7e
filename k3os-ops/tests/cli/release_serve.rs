//! `k3os-ops release serve`: a static server that honours Range requests (resumable downloads).

use k3os_ops_testing::release as release_support;

use std::io::Read;

use http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use release_support::Server;

fn body_of(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 256) as u8).collect()
}

#[test]
fn serves_whole_files_ranges_and_416() {
    let t = tempfile::tempdir().unwrap();
    let data = body_of(3 * 1024 * 1024 + 17);
    std::fs::create_dir(t.path().join("v1")).unwrap();
    std::fs::write(t.path().join("v1/rootfs.squashfs"), &data).unwrap();
    std::fs::write(t.path().join("secret-outside"), b"x").unwrap();
    let srv = Server::start(&t.path().join("v1"));
    let client = libupgrade::http::client().unwrap();
    let url = format!("{}rootfs.squashfs", srv.url);
    let n = data.len();

    let r = client.get(&url).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()[ACCEPT_RANGES], "bytes");
    assert_eq!(r.bytes().unwrap().as_ref(), &data[..]);

    let r = client
        .get(&url)
        .header(RANGE, "bytes=1000-1999")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 206);
    assert_eq!(
        r.headers()[CONTENT_RANGE].to_str().unwrap(),
        format!("bytes 1000-1999/{n}")
    );
    assert_eq!(r.bytes().unwrap().as_ref(), &data[1000..2000]);

    // Open-ended range: the resume request libupgrade's fetch sends.
    let r = client
        .get(&url)
        .header(RANGE, format!("bytes={}-", n - 10))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 206);
    assert_eq!(
        r.headers()[CONTENT_RANGE].to_str().unwrap(),
        format!("bytes {}-{}/{n}", n - 10, n - 1)
    );
    assert_eq!(r.bytes().unwrap().as_ref(), &data[n - 10..]);

    // Past the end: 416 with the real size.
    let r = client
        .get(&url)
        .header(RANGE, format!("bytes={n}-"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 416);
    assert_eq!(
        r.headers()[CONTENT_RANGE].to_str().unwrap(),
        format!("bytes */{n}")
    );

    let r = client.head(&url).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()[CONTENT_LENGTH].to_str().unwrap(), n.to_string());

    let r = client.get(format!("{}missing", srv.url)).send().unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Nothing outside the served directory is reachable.
    for p in [
        "../secret-outside",
        "..%2fsecret-outside",
        "%2e%2e/secret-outside",
    ] {
        let r = client.get(format!("{}{p}", srv.url)).send().unwrap();
        assert_ne!(r.status().as_u16(), 200, "{p}");
    }
    let r = client.post(&url).body("x").send().unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

#[test]
fn libupgrade_fetch_resumes_against_it() {
    let t = tempfile::tempdir().unwrap();
    let data = body_of(200_000);
    std::fs::write(t.path().join("f"), &data).unwrap();
    let srv = Server::start(t.path());
    let src = libupgrade::Source::Url(srv.url.clone());
    for offset in [0u64, 1, 123_456, 199_999] {
        let (mut r, loc) = src.open("f", offset).unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got, &data[offset as usize..], "{loc} from {offset}");
    }
    let e = src
        .open("f", 200_000)
        .err()
        .expect("offset past the end is refused")
        .to_string();
    assert!(e.contains("416"), "{e}");
}

#[test]
fn refuses_missing_directory_and_busy_port() {
    let t = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(release_support::bin())
        .args(["release", "serve"])
        .arg(t.path().join("nope"))
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nope"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let srv = Server::start(t.path());
    let addr = srv
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let out = std::process::Command::new(release_support::bin())
        .args(["release", "serve"])
        .arg(t.path())
        .args(["--listen", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&addr), "{err}");
}
