//! `POST /v1/bundles` over real HTTP against a collector on SQLite: a good bundle stored
//! once, every bad one refused with its status, named, and stored nowhere.

use super::tests::{post, start};
use super::*;
use crate::admit::BundleQuota;
use crate::testutil::{bundle, id, key, sealed};
use base64::Engine;
use ed25519_dalek::Signer;
use std::io::Write;

/// An envelope of `body` signed by node `n`, written from the format's description (so the
/// test can sign what `Bundle::seal` never writes).
fn envelope(n: u8, body: &[u8]) -> Vec<u8> {
    let node = id(n).to_string();
    let mut msg = format!("k3os-ops bundle v1\n{node}\n").into_bytes();
    msg.extend_from_slice(body);
    let sig = base64::engine::general_purpose::STANDARD.encode(key(n).sign(&msg).to_bytes());
    let mut out = format!("k3os-bundle 1 {node}\n{sig}\n").into_bytes();
    out.extend_from_slice(body);
    out
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[test]
fn a_good_bundle_is_stored_once_and_every_bad_one_is_refused_and_stored_nowhere() {
    let limits = Limits {
        burst: 1000,
        per_sec: 1000.0,
        ..Limits::default()
    };
    let (addr, app, _dir) = start(limits);
    let p = |body: &[u8]| post(addr, BUNDLES_PATH, body);
    let why = "kubelet: failed to load config";
    let good = sealed(1, 1, why);
    assert_eq!(p(&good), (201, "stored\n".into()));
    assert_eq!(p(&good), (200, "already stored (a resend)\n".into()));
    // A replay with other bytes under the same node, release and attempt.
    let (s, text) = p(&sealed(1, 1, "all is well"));
    assert_eq!(s, 409, "{text}");
    assert!(text.contains("attempt 1 of v2 with other bytes"), "{text}");

    // Over 64 KiB: refused before it is read whole, naming the limit.
    let (s, text) = p(&vec![b'k'; fleet_report::MAX_BUNDLE_BYTES + 1]);
    assert_eq!(
        (s, text.trim()),
        (413, "bundle is more than the 65536 bytes a bundle may have")
    );
    // Not an envelope; hostile bytes in it come back escaped.
    let (s, text) = p(b"k3os-report 1\n\x1b[31m<b>red");
    assert_eq!(s, 400, "{text}");
    assert!(
        text.contains("bundle envelope") && !text.contains('\x1b'),
        "{text:?}"
    );
    assert_eq!(text.lines().count(), 1, "{text:?}");
    // Node 1's id over node 9's signature.
    let forged = {
        let mut b = sealed(9, 1, why);
        let (theirs, victim) = (id(9).to_string(), id(1).to_string());
        let at = b.windows(64).position(|w| w == theirs.as_bytes()).unwrap();
        b[at..at + 64].copy_from_slice(victim.as_bytes());
        b
    };
    let (s, text) = p(&forged);
    assert_eq!(s, 401, "{text}");
    assert!(text.contains("signature"), "{text}");
    // A well-signed bundle of a node that is not enrolled.
    let (s, text) = p(&sealed(42, 1, why));
    assert_eq!(s, 403, "{text}");
    assert!(text.contains("not enrolled"), "{text}");
    // A signed decompression bomb: 4 MiB of spaces in a few KiB.
    let bomb = deflate(&vec![b' '; 4 * fleet_report::MAX_INFLATED_BYTES]);
    let (s, text) = p(&envelope(2, &bomb));
    assert_eq!(s, 400, "{text}");
    assert!(
        text.contains("inflates to more than 1048576 bytes"),
        "{text}"
    );
    // Signed, but not deflate; deflate of something that is not a bundle; a bundle naming
    // another node than its signer.
    let (s, text) = p(&envelope(2, b"\xff\xfe\x1b[31m"));
    assert_eq!(s, 400, "{text}");
    assert!(text.contains("not deflate data"), "{text}");
    let (s, text) = p(&envelope(
        2,
        &deflate(br#"{"format":1,"evil":"\u001b[31m"}"#),
    ));
    assert_eq!(s, 400, "{text}");
    assert!(
        text.contains("bundle body") && !text.contains('\x1b'),
        "{text:?}"
    );
    let json = serde_json::to_vec(&bundle(1, 7, why)).unwrap();
    let (s, text) = p(&envelope(2, &deflate(&json)));
    assert_eq!(s, 400, "{text}");
    assert!(text.contains("inside an envelope signed by node"), "{text}");

    let rows = app.bundles().unwrap();
    assert_eq!(rows.len(), 1, "only the good one: {rows:?}");
    assert_eq!(
        (rows[0].node.clone(), rows[0].attempt),
        (id(1).to_string(), 1)
    );
    assert_eq!(rows[0].site, "site-a", "the site is the allow-list's");
}

#[test]
fn a_node_past_its_quota_gets_507_and_a_flooding_node_429() {
    let one = sealed(1, 1, "x").len() as u64;
    let quota = |count, bytes| Limits {
        burst: 3,
        per_sec: 0.001,
        bundles: BundleQuota { count, bytes },
        ..Limits::default()
    };
    // Count: node 1 may keep two.
    let (addr, app, _dir) = start(quota(2, 100 * one));
    let p = |body: &[u8]| post(addr, BUNDLES_PATH, body);
    assert_eq!(
        [p(&sealed(1, 1, "x")).0, p(&sealed(1, 2, "x")).0],
        [201, 201]
    );
    // Full, it is refused before anything is inflated: a signed bomb is 507, not 400.
    let bomb = deflate(&vec![b' '; 4 * fleet_report::MAX_INFLATED_BYTES]);
    let (s, text) = p(&envelope(1, &bomb));
    assert_eq!(s, 507, "{text}");
    assert!(text.contains("quota (2 bundles"), "{text}");
    // Rate: node 1 has spent its burst of 3 (reports and bundles share it).
    let (s, text) = p(&sealed(1, 4, "x"));
    assert_eq!(s, 429, "{text}");
    assert!(text.contains("faster than"), "{text}");
    assert_eq!(app.bundles().unwrap().len(), 2);
    // Bytes: two bundles fit in 2.5 bundles' bytes, a third does not.
    let (addr, app, _dir) = start(quota(100, one * 5 / 2));
    let p = |body: &[u8]| post(addr, BUNDLES_PATH, body);
    assert_eq!(
        [p(&sealed(2, 1, "x")).0, p(&sealed(2, 2, "x")).0],
        [201, 201]
    );
    let (s, text) = p(&sealed(2, 3, "x"));
    assert_eq!(s, 507, "{text}");
    assert!(text.contains("bytes) stored"), "{text}");
    assert_eq!(app.bundles().unwrap().len(), 2);
}

/// GET `path` from `addr`: the status, the head and the body's bytes.
fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    use std::io::Read;
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..at]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, out[at + 4..].to_vec())
}

#[test]
fn the_dashboard_shows_a_bundle_beside_its_reason_and_serves_it_for_download() {
    use fleet_report::Outcome;
    let (addr, app, _dir) = start(Limits::default());
    let why = "kubelet: failed to load config";
    let failed = Outcome::RolledBack {
        why: "health check 20-kubelet failed".into(),
    };
    for n in [1, 2] {
        let report = crate::testutil::signed(n, "site-a", 1, failed.clone());
        assert_eq!(post(addr, REPORTS_PATH, &report).0, 201);
    }
    let mut hostile = bundle(1, 1, why);
    hostile.sections[1].text = "</pre><script>alert(1)</script>".into();
    let sealed_1 = hostile.seal(&key(1)).unwrap();
    assert_eq!(post(addr, BUNDLES_PATH, &sealed_1).0, 201);
    assert_eq!(post(addr, BUNDLES_PATH, &sealed(2, 1, why)).0, 201);

    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dash = l.local_addr().unwrap();
    l.set_nonblocking(true).unwrap();
    let schedule: ScheduleSource = Arc::new(|| Box::new(crate::dashboard::NoSchedule));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            serve_dashboard(l, app, schedule).await.unwrap();
        });
    });
    let (s, _, page) = get(dash, "/");
    let page = String::from_utf8(page).unwrap();
    assert_eq!(s, 200);
    assert!(
        page.contains("Common cause: 2 of 2 failed node(s): kubelet: failed to load config"),
        "{page}"
    );
    assert!(!page.contains("<script>"), "{page}");
    assert!(page.contains("&lt;/pre&gt;&lt;script&gt;"), "{page}");
    let href = crate::dashboard::bundle_path(&id(1).to_string(), "v2", 1);
    assert!(
        page.contains(&format!("<a href=\"{href}\" download>sealed</a>")),
        "{page}"
    );

    let (s, head, body) = get(dash, &href);
    assert_eq!(
        (s, body),
        (200, sealed_1.clone()),
        "the sealed bytes as received"
    );
    assert!(
        head.contains("application/vnd.k3os-ops.bundle.v1"),
        "{head}"
    );
    assert!(
        head.contains("attachment") && head.contains("nosniff"),
        "{head}"
    );
    let (s, head, body) = get(dash, &format!("{href}/json"));
    assert_eq!(s, 200, "{head}");
    let back: fleet_report::Bundle = serde_json::from_slice(&body).unwrap();
    assert_eq!(back, hostile);
    let (s, _, body) = get(
        dash,
        &crate::dashboard::bundle_path(&id(1).to_string(), "v2", 9),
    );
    assert_eq!(s, 404, "{}", String::from_utf8_lossy(&body));
}
