//! Small documents over HTTP (an index, a manifest, an API page): read whole with a size cap,
//! conditionally with `If-None-Match`, through the one HTTP client, and never slower than a
//! minimum rate (a server trickling a document is cut after a window, like an image).

use std::io::Read;
use std::path::PathBuf;

use super::{ChannelError, MAX_DOC};

pub(super) fn client(url: &str) -> Result<reqwest::blocking::Client, ChannelError> {
    crate::net::http::client().map_err(|source| ChannelError::Http {
        url: url.to_string(),
        source,
    })
}

/// A fetched document and the response headers that matter here.
#[derive(Debug, Clone)]
pub(super) struct Doc {
    pub body: Vec<u8>,
    /// RFC 8288 `Link` header (GitHub pagination).
    pub link: Option<String>,
    pub etag: Option<String>,
}

/// GET a small document (index, manifest, API page). With `if_none_match`, a `304 Not
/// Modified` answer gives `Ok(None)`.
pub(super) fn get_doc(
    client: &reqwest::blocking::Client,
    url: &str,
    accept: Option<&str>,
    if_none_match: Option<&str>,
) -> Result<Option<Doc>, ChannelError> {
    let http = |source| ChannelError::Http {
        url: url.to_string(),
        source,
    };
    let mut req = client.get(url);
    if let Some(a) = accept {
        req = req.header(reqwest::header::ACCEPT, a);
    }
    if let Some(tag) = if_none_match {
        req = req.header(reqwest::header::IF_NONE_MATCH, tag);
    }
    let resp = req.send().map_err(http)?;
    if if_none_match.is_some() && resp.status() == reqwest::StatusCode::NOT_MODIFIED {
        return Ok(None);
    }
    if !resp.status().is_success() {
        return Err(ChannelError::Status {
            url: url.to_string(),
            status: resp.status().as_u16(),
        });
    }
    let header = |name: reqwest::header::HeaderName| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (link, etag) = (header(reqwest::header::LINK), header(reqwest::header::ETAG));
    if resp.content_length().is_some_and(|n| n > MAX_DOC) {
        return Err(ChannelError::TooLarge {
            what: url.to_string(),
        });
    }
    let mut body = Vec::new();
    // A trickled index or API page is cut like any other body (the default minimum rate).
    crate::net::rate::Watched::new(resp, Some(crate::net::rate::MinRate::DEFAULT))
        .take(MAX_DOC + 1)
        .read_to_end(&mut body)
        .map_err(|source| ChannelError::Io {
            path: PathBuf::from(url),
            source,
        })?;
    if body.len() as u64 > MAX_DOC {
        return Err(ChannelError::TooLarge {
            what: url.to_string(),
        });
    }
    Ok(Some(Doc { body, link, etag }))
}

pub(super) fn get_small(
    client: &reqwest::blocking::Client,
    url: &str,
) -> Result<Vec<u8>, ChannelError> {
    let doc = get_doc(client, url, None, None)?.expect("no conditional request was made");
    Ok(doc.body)
}

/// GET a metadata file: at most `max` bytes (more is refused: endless data), and a response
/// slower than `min_rate` over its window is cut (slow retrieval, the `--min-rate` rule).
/// `Ok(None)` on 404/410: the channel does not have the file.
pub(super) fn get_bounded(
    client: &reqwest::blocking::Client,
    url: &str,
    max: u64,
    min_rate: Option<crate::net::rate::MinRate>,
) -> Result<Option<Vec<u8>>, crate::trust::TrustError> {
    use crate::trust::TrustError;
    let fetch = |why: String| TrustError::Fetch {
        location: url.to_string(),
        why,
    };
    let resp = client
        .get(url)
        .send()
        .map_err(|e| fetch(crate::net::fetch::request_failed(&e)))?;
    let status = resp.status();
    if matches!(status.as_u16(), 404 | 410) {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(fetch(format!("server answered HTTP {status}")));
    }
    let too_large = || TrustError::TooLarge {
        what: url.to_string(),
        max,
    };
    if resp.content_length().is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    crate::net::rate::Watched::new(resp, min_rate)
        .take(max + 1)
        .read_to_end(&mut body)
        .map_err(|e| fetch(crate::net::fetch::body_failed(&e)))?;
    if body.len() as u64 > max {
        return Err(too_large());
    }
    Ok(Some(body))
}
