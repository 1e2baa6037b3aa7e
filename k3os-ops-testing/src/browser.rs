//! Headless Chromium (Debian's `chromium`, installed by scripts/setup.sh) for the tests that
//! look at the collector's dashboard as a browser renders it: the DOM after the page loaded,
//! and a screenshot. A missing browser fails the test saying what to install.

use std::path::Path;
use std::process::Command;

/// `chromium --headless` with a throw-away profile and `args`; its stdout.
fn chromium(args: &[&str]) -> Vec<u8> {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .output()
        .expect("chromium (Debian package chromium, installed by scripts/setup.sh)");
    assert!(
        out.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The page at `url` as Chromium rendered it (`--dump-dom`: the DOM after the page loaded).
pub fn dump_dom(url: &str) -> String {
    String::from_utf8_lossy(&chromium(&["--dump-dom", url])).into_owned()
}

/// A PNG screenshot of the page at `url`, `width`×`height` pixels, written to `png`; panics
/// unless a PNG was written.
pub fn screenshot(url: &str, png: &Path, width: u32, height: u32) {
    chromium(&[
        &format!("--screenshot={}", png.display()),
        &format!("--window-size={width},{height}"),
        url,
    ]);
    let bytes = std::fs::read(png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        png.display()
    );
}
