//! Where a release comes from, and reading its files from an offset.
//!
//! A [`Source`] is a release directory: a local path, an http(s) base URL, or (for
//! `github-releases://` channels) a map from file name to asset URL. Files are read as streams
//! starting at any offset, so a download that dropped half way resumes with an HTTP `Range`
//! request instead of starting over: on a remote node behind a slow link that is the difference
//! between an upgrade and no upgrade. A server that ignores `Range` (answers 200) is handled by
//! skipping the bytes already held.
//!
//! Before a stage writes anything it [`Source::probe`]s every artifact (one ranged GET of byte
//! 0 each: works on any static server, GitHub's redirected asset URLs included, where a HEAD
//! against the signed S3 URL is refused) so a missing file or a wrong size fails in seconds.
//! Chunked transfers read exact byte ranges with [`Source::open_range`]. An offline bundle
//! ([`crate::bundle`]) is a source too: its members are read by offset, like local files.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The largest manifest or signature accepted (they are a few hundred bytes).
const SMALL_MAX: u64 = 1 << 20;

/// A release directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A local directory holding `manifest.json` and the files.
    Path(PathBuf),
    /// An http(s) base URL ending in `/`.
    Url(String),
    /// File name → URL (release assets that do not share one directory).
    Assets(BTreeMap<String, String>),
    /// An offline bundle file holding the release ([`crate::bundle`]).
    Bundle(crate::bundle::Bundle),
}

/// A place chunks are looked for before the origin (`--extra-source`, the agent's
/// `spec.sources`): whatever it holds is checked against the signed chunk index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraSource {
    /// A local directory or mounted removable medium holding artifact files under the names
    /// the manifest gives them (any release's: their chunks are found by content, like the
    /// running slot's). Copies from it are not network bytes.
    Dir(PathBuf),
    /// A site mirror of the release directory (same file names and bytes), read by range.
    Mirror(Source),
}

impl ExtraSource {
    /// `http://…`/`https://…` → a mirror (a trailing `/` added), anything else a directory.
    pub fn parse(s: &str) -> ExtraSource {
        match Source::parse(s) {
            Source::Path(_) => ExtraSource::Dir(PathBuf::from(s)),
            url => ExtraSource::Mirror(url),
        }
    }
}

/// What the server (or the local directory) says about a file before it is downloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The file's size in bytes.
    pub size: u64,
    /// The server answers `Range` requests with 206 (local files always can).
    pub ranges: bool,
}

impl Source {
    /// `http://…`/`https://…` → [`Source::Url`] (a trailing `manifest.json` is dropped, a `/`
    /// added); anything else is a local path (to the directory or its `manifest.json`).
    pub fn parse(s: &str) -> Source {
        if s.starts_with("http://") || s.starts_with("https://") {
            let base = s.strip_suffix(crate::manifest::MANIFEST_FILE).unwrap_or(s);
            let base = if base.ends_with('/') {
                base.to_string()
            } else {
                format!("{base}/")
            };
            Source::Url(base)
        } else {
            let p = PathBuf::from(s);
            if p.file_name()
                .is_some_and(|n| n == crate::manifest::MANIFEST_FILE)
            {
                Source::Path(p.parent().map(Path::to_path_buf).unwrap_or_default())
            } else {
                Source::Path(p)
            }
        }
    }

    /// Where file `name` of this release is, for messages and requests.
    pub fn location(&self, name: &str) -> String {
        match self {
            Source::Path(dir) => dir.join(name).display().to_string(),
            Source::Url(base) => format!("{base}{name}"),
            Source::Assets(map) => map
                .get(name)
                .cloned()
                .unwrap_or_else(|| format!("<no asset named {name}>")),
            Source::Bundle(b) => b.location(name),
        }
    }

    /// Read a small file (manifest, signature) whole, under `watch` (the minimum rate and the
    /// attempt's deadline: a trickled manifest is cut like a trickled image).
    pub fn read_small(&self, name: &str, watch: Watch) -> Result<Vec<u8>> {
        let buf = self.read_capped(name, SMALL_MAX, watch)?;
        if buf.len() as u64 > SMALL_MAX {
            return Err(fetch_err(
                &self.location(name),
                format!("larger than {SMALL_MAX} bytes; not a manifest or signature"),
            ));
        }
        Ok(buf)
    }

    /// Read file `name` whole, but never more than `max + 1` bytes (a chunk index of a
    /// declared size: one byte more tells the caller it is larger than declared), under
    /// `watch`.
    pub fn read_capped(&self, name: &str, max: u64, watch: Watch) -> Result<Vec<u8>> {
        let loc = self.location(name);
        let (r, _) = self.open(name, 0)?;
        let mut buf = Vec::new();
        watch
            .reader(r)
            .take(max + 1)
            .read_to_end(&mut buf)
            .map_err(|e| retryable_err(&loc, body_failed(&e)))?;
        Ok(buf)
    }

    /// Does file `name` exist, how large is it, can it be read by range? One ranged GET of
    /// byte 0 (or a `stat`); the body is never read.
    pub fn probe(&self, name: &str) -> Result<Probe> {
        let loc = self.location(name);
        match self {
            Source::Path(dir) => {
                let md = std::fs::metadata(dir.join(name))
                    .map_err(|e| fetch_err(&loc, format!("cannot stat: {e}")))?;
                Ok(Probe {
                    size: md.len(),
                    ranges: true,
                })
            }
            Source::Bundle(b) => Ok(Probe {
                size: b.member(name)?.1,
                ranges: true,
            }),
            Source::Url(_) | Source::Assets(_) => {
                if matches!(self, Source::Assets(m) if !m.contains_key(name)) {
                    return Err(fetch_err(&loc, "the release has no such asset".into()));
                }
                http_probe(&loc)
            }
        }
    }

    /// Exactly bytes `start..stop` of file `name`.
    pub fn open_range(&self, name: &str, start: u64, stop: u64) -> Result<Box<dyn Read + Send>> {
        let loc = self.location(name);
        match self {
            Source::Path(_) | Source::Bundle(_) => {
                let (r, _) = self.open(name, start)?;
                Ok(Box::new(r.take(stop - start)))
            }
            Source::Url(_) | Source::Assets(_) => {
                if matches!(self, Source::Assets(m) if !m.contains_key(name)) {
                    return Err(fetch_err(&loc, "the release has no such asset".into()));
                }
                http_range(&loc, start, stop)
            }
        }
    }

    /// A stream of file `name` from byte `offset` on.
    pub fn open(&self, name: &str, offset: u64) -> Result<(Box<dyn Read + Send>, String)> {
        let loc = self.location(name);
        match self {
            Source::Path(dir) => {
                let p = dir.join(name);
                let mut f =
                    File::open(&p).map_err(|e| fetch_err(&loc, format!("cannot open: {e}")))?;
                f.seek(SeekFrom::Start(offset))
                    .map_err(|e| fetch_err(&loc, format!("cannot seek to {offset}: {e}")))?;
                Ok((Box::new(f), loc))
            }
            Source::Bundle(b) => Ok((b.open_at(name, offset)?, loc)),
            Source::Url(_) | Source::Assets(_) => {
                if matches!(self, Source::Assets(m) if !m.contains_key(name)) {
                    return Err(fetch_err(&loc, "the release has no such asset".into()));
                }
                Ok((http_open(&loc, offset)?, loc))
            }
        }
    }
}

fn fetch_err(loc: &str, what: String) -> Error {
    Error::Fetch {
        location: loc.to_string(),
        what,
        retryable: false,
    }
}

/// What went wrong with a request, in words: "timed out after N s" for the client's timeouts,
/// else the error and its causes (reqwest's own text stops at "error sending request").
pub(crate) fn request_failed(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return format!(
            "request timed out after {} s without progress",
            crate::net::http::READ_TIMEOUT.as_secs()
        );
    }
    format!("request failed: {}", crate::error::chain_line(e))
}

/// The rules every response body is read under: the minimum rate and the attempt's deadline.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watch {
    /// Cut a body slower than this over its window (None: no floor).
    pub min_rate: Option<crate::net::rate::MinRate>,
    /// Cut a read once this has passed (None: no deadline).
    pub deadline: Option<std::time::Instant>,
}

impl Watch {
    /// `r` under these rules.
    pub fn reader<R: Read>(self, r: R) -> crate::net::rate::Watched<R> {
        crate::net::rate::Watched::new(r, self.min_rate).until(self.deadline)
    }
}

/// What a failed read of a response body means, in words: a stall (no byte within the
/// client's read timeout), the minimum-rate rule or the deadline is named as the timeout it
/// is; anything else is the connection dropping, with its causes.
pub(crate) fn body_failed(e: &std::io::Error) -> String {
    let stalled = e
        .get_ref()
        .and_then(|r| r.downcast_ref::<reqwest::Error>())
        .is_some_and(|r| r.is_timeout());
    if stalled {
        return format!(
            "timed out: no byte for {} s (the server stalled)",
            crate::net::http::READ_TIMEOUT.as_secs()
        );
    }
    if e.kind() == std::io::ErrorKind::TimedOut {
        return e.to_string();
    }
    format!("connection dropped: {}", crate::error::chain_line(e))
}

fn retryable_err(loc: &str, what: String) -> Error {
    Error::Fetch {
        location: loc.to_string(),
        what,
        retryable: true,
    }
}

/// GET `url` from `offset` on, with `Range` when `offset > 0`.
fn http_open(url: &str, offset: u64) -> Result<Box<dyn Read + Send>> {
    let client = crate::net::http::client()
        .map_err(|e| fetch_err(url, format!("cannot build an HTTP client: {e}")))?;
    let mut req = client.get(url);
    if offset > 0 {
        req = req.header(reqwest::header::RANGE, format!("bytes={offset}-"));
    }
    let resp = req
        .send()
        .map_err(|e| retryable_err(url, request_failed(&e)))?;
    let status = resp.status();
    match status.as_u16() {
        206 if offset > 0 => {
            let start = resp
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split('-').next())
                .and_then(|v| v.parse::<u64>().ok());
            if start != Some(offset) {
                let what = match start {
                    Some(s) => format!("asked for bytes from {offset}, server sent a range starting at byte {s}"),
                    None => format!("asked for bytes from {offset}, server answered 206 with {}", content_range_text(&resp)),
                };
                return Err(fetch_err(url, what));
            }
            Ok(Box::new(resp))
        }
        200 => {
            let mut r: Box<dyn Read + Send> = Box::new(resp);
            if offset > 0 {
                // The server ignores Range: skip what is already held.
                let skipped = std::io::copy(&mut (&mut r).take(offset), &mut std::io::sink())
                    .map_err(|e| fetch_err(url, format!("skipping {offset} bytes the server re-sent: {e}")))?;
                if skipped != offset {
                    return Err(fetch_err(url, format!("file ended after {skipped} bytes, before the resume offset {offset}")));
                }
            }
            Ok(r)
        }
        416 => Err(fetch_err(url, format!("server says offset {offset} is past the end of the file (416): the file is shorter than the manifest says"))),
        _ => Err(status_err(url, &resp)),
    }
}

/// The error for an answer that is not the file: 404/410 and refused redirects fail at once
/// (no retry can fix them), 5xx, 408 and 429 are retried.
fn status_err(url: &str, resp: &reqwest::blocking::Response) -> Error {
    let status = resp.status();
    match status.as_u16() {
        404 | 410 => fetch_err(url, format!("HTTP {status}: the file is not on the server")),
        s if s >= 500 || s == 408 || s == 429 => retryable_err(url, format!("HTTP {status}")),
        300..=399 => {
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            fetch_err(
                url,
                match to {
                    Some(to) => format!("HTTP {status}: redirect to '{to}' refused (only http and https redirects are followed, at most 10)"),
                    None => format!("HTTP {status} without a Location to follow"),
                },
            )
        }
        _ => fetch_err(url, format!("HTTP {status}")),
    }
}

/// `Content-Range: bytes A-B/T` → (A, T).
/// The raw `Content-Range` header for messages: quoted, or "no Content-Range".
fn content_range_text(resp: &reqwest::blocking::Response) -> String {
    match resp.headers().get(reqwest::header::CONTENT_RANGE) {
        Some(v) => format!("Content-Range '{}'", String::from_utf8_lossy(v.as_bytes())),
        None => "no Content-Range".into(),
    }
}

fn content_range(resp: &reqwest::blocking::Response) -> Option<(u64, Option<u64>)> {
    let v = resp
        .headers()
        .get(reqwest::header::CONTENT_RANGE)?
        .to_str()
        .ok()?
        .strip_prefix("bytes ")?;
    let (span, total) = v.split_once('/')?;
    let start = span.split('-').next()?.trim().parse().ok()?;
    Some((start, total.trim().parse().ok()))
}

fn http_probe(url: &str) -> Result<Probe> {
    let client = crate::net::http::client()
        .map_err(|e| fetch_err(url, format!("cannot build an HTTP client: {e}")))?;
    let resp = client
        .get(url)
        .header(reqwest::header::RANGE, "bytes=0-0")
        .send()
        .map_err(|e| retryable_err(url, request_failed(&e)))?;
    let status = resp.status();
    match status.as_u16() {
        206 => match content_range(&resp) {
            Some((0, Some(size))) => Ok(Probe { size, ranges: true }),
            other => Err(fetch_err(
                url,
                match other {
                    Some((start, Some(total))) => format!("asked for byte 0, server answered 206 with bytes from {start} of {total}"),
                    _ => format!("asked for byte 0, server answered 206 with {}", content_range_text(&resp)),
                },
            )),
        },
        200 => match resp.content_length() {
            Some(size) => Ok(Probe {
                size,
                ranges: false,
            }),
            None => Err(fetch_err(
                url,
                "server answered 200 without a Content-Length and ignores Range; cannot check the size".into(),
            )),
        },
        // An empty file: 0 is past its end.
        416 => Ok(Probe {
            size: 0,
            ranges: true,
        }),
        _ => Err(status_err(url, &resp)),
    }
}

fn http_range(url: &str, start: u64, stop: u64) -> Result<Box<dyn Read + Send>> {
    let client = crate::net::http::client()
        .map_err(|e| fetch_err(url, format!("cannot build an HTTP client: {e}")))?;
    let resp = client
        .get(url)
        .header(
            reqwest::header::RANGE,
            format!("bytes={start}-{}", stop - 1),
        )
        .send()
        .map_err(|e| retryable_err(url, request_failed(&e)))?;
    let status = resp.status();
    match status.as_u16() {
        206 => match content_range(&resp) {
            Some((s, _)) if s == start => Ok(Box::new(resp.take(stop - start))),
            other => Err(fetch_err(
                url,
                match other {
                    Some((got, _)) => format!("asked for bytes {start}..{stop}, server sent a range starting at byte {got}"),
                    None => format!("asked for bytes {start}..{stop}, server sent {}", content_range_text(&resp)),
                },
            )),
        },
        200 => {
            // The server ignores Range (the probe normally catches this and the plan streams).
            let mut r: Box<dyn Read + Send> = Box::new(resp);
            let skipped = std::io::copy(&mut (&mut r).take(start), &mut std::io::sink())
                .map_err(|e| retryable_err(url, format!("skipping {start} bytes: {e}")))?;
            if skipped != start {
                return Err(fetch_err(url, format!("file ended after {skipped} bytes, before byte {start}")));
            }
            Ok(Box::new(r.take(stop - start)))
        }
        416 => Err(fetch_err(url, format!("bytes {start}..{stop} are past the end of the file (416): it is shorter than the manifest says"))),
        _ => Err(status_err(url, &resp)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_sources() {
        assert_eq!(
            Source::parse("http://h/r/v2"),
            Source::Url("http://h/r/v2/".into())
        );
        assert_eq!(
            Source::parse("https://h/r/v2/manifest.json"),
            Source::Url("https://h/r/v2/".into())
        );
        assert_eq!(
            Source::parse("/srv/v2/manifest.json"),
            Source::Path("/srv/v2".into())
        );
        assert_eq!(Source::parse("rel"), Source::Path("rel".into()));
    }

    #[test]
    fn local_open_at_offset_and_missing_file_is_named() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"0123456789").unwrap();
        let s = Source::Path(t.path().into());
        let (mut r, _) = s.open("f", 4).unwrap();
        let mut v = String::new();
        r.read_to_string(&mut v).unwrap();
        assert_eq!(v, "456789");
        let e = s.open("nope", 0).err().unwrap().to_string();
        assert!(e.contains("nope"), "{e}");
        assert_eq!(
            s.probe("f").unwrap(),
            Probe {
                size: 10,
                ranges: true
            }
        );
        let mut v = String::new();
        s.open_range("f", 2, 5)
            .unwrap()
            .read_to_string(&mut v)
            .unwrap();
        assert_eq!(v, "234");
        assert!(s.probe("nope").unwrap_err().to_string().contains("nope"));
    }
}
