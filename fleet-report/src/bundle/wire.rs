//! The sealed envelope: [`Bundle::seal`] writes it, [`open`] reads and verifies it.
//!
//! The envelope's first line names the node (`k3os-bundle 1 <node id>`), so the signature is
//! checked against the sender's key before anything is inflated.

use std::io::{Read, Write};

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use flate2::Compression;

use super::{Bundle, MAX_BUNDLE_BYTES, MAX_INFLATED_BYTES};
use crate::report::NodeId;

/// The envelope's first line, before the node id.
const HEADER: &[u8] = b"k3os-bundle 1 ";
/// What the node key signs before the node id line and the compressed bytes.
const SIGNED_PREFIX: &[u8] = b"k3os-ops bundle v1\n";
/// Length of an ed25519 signature in standard base64.
const SIG_B64: usize = 88;

/// Why a bundle was refused (by [`open`]) or could not be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// More bytes than [`MAX_BUNDLE_BYTES`].
    #[error("bundle is {found} bytes, more than the {MAX_BUNDLE_BYTES} a bundle may have")]
    TooLarge {
        /// The bytes found (at least).
        found: usize,
    },
    /// The envelope is not `k3os-bundle 1 <node>`, a signature line, then the body.
    #[error("bundle envelope: {0}")]
    Envelope(String),
    /// The signature is not the named node's over the body.
    #[error("bundle signature does not verify with node {node}'s key over the body received")]
    Signature {
        /// The node the envelope names.
        node: NodeId,
    },
    /// The body does not inflate to a bundle of a format this reader knows within the limits.
    #[error("bundle body: {0}")]
    Body(String),
    /// A bundle to seal is not the key's, breaks a limit, or cannot be cut to fit.
    #[error("cannot seal bundle: {0}")]
    Seal(String),
}

/// A bundle whose signature verified, with the exact bytes received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The bundle.
    pub bundle: Bundle,
    /// The whole envelope as received (what a collector stores and serves for download).
    pub bytes: Vec<u8>,
}

fn signed_message(node: &NodeId, body: &[u8]) -> Vec<u8> {
    let node = node.to_string();
    let mut m = Vec::with_capacity(SIGNED_PREFIX.len() + node.len() + 1 + body.len());
    m.extend_from_slice(SIGNED_PREFIX);
    m.extend_from_slice(node.as_bytes());
    m.push(b'\n');
    m.extend_from_slice(body);
    m
}

pub(super) fn deflate(json: &[u8]) -> Result<Vec<u8>, BundleError> {
    let mut enc = DeflateEncoder::new(Vec::new(), Compression::best());
    enc.write_all(json)
        .and_then(|_| enc.finish())
        .map_err(|e| BundleError::Seal(format!("deflate: {e}")))
}

fn wire_len(body: usize) -> usize {
    HEADER.len() + 64 + 1 + SIG_B64 + 1 + body
}

/// `text` without its first `n` bytes, moved forward to a character boundary.
fn cut_head(text: &str, n: usize) -> (&str, usize) {
    let mut at = n.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    (&text[at..], at)
}

impl Bundle {
    /// The sealed envelope of this bundle (see the module docs). When the compressed whole
    /// would be over [`MAX_BUNDLE_BYTES`], the longest section's head is cut by half, again
    /// until it fits (logs keep their newest lines; each section says what it lost). Refused
    /// when `key` is not the bundle's node or a limit is broken.
    pub fn seal(&self, key: &SigningKey) -> Result<Vec<u8>, BundleError> {
        let node = NodeId::of(&key.verifying_key());
        if node != self.node {
            return Err(BundleError::Seal(format!(
                "the bundle names node {} but the key is node {node}",
                self.node
            )));
        }
        self.check().map_err(BundleError::Seal)?;
        let mut b = self.clone();
        loop {
            let json = serde_json::to_vec(&b).map_err(|e| BundleError::Seal(e.to_string()))?;
            let body = deflate(&json)?;
            if wire_len(body.len()) <= MAX_BUNDLE_BYTES && json.len() <= MAX_INFLATED_BYTES {
                return Ok(envelope(key, &node, &body));
            }
            let longest = b
                .sections
                .iter_mut()
                .filter(|s| !s.text.is_empty())
                .max_by_key(|s| s.text.len())
                .ok_or_else(|| {
                    BundleError::Seal(format!(
                        "{} bytes with every section empty, more than {MAX_BUNDLE_BYTES}",
                        wire_len(body.len())
                    ))
                })?;
            let (rest, cut) = cut_head(&longest.text, longest.text.len().div_ceil(2));
            longest.text = rest.to_string();
            longest.cut_bytes += cut as u64;
        }
    }
}

pub(super) fn envelope(key: &SigningKey, node: &NodeId, body: &[u8]) -> Vec<u8> {
    let sig = key.sign(&signed_message(node, body));
    let b64 = base64::engine::general_purpose::STANDARD.encode(sig.to_bytes());
    let mut out = Vec::with_capacity(wire_len(body.len()));
    out.extend_from_slice(HEADER);
    out.extend_from_slice(node.to_string().as_bytes());
    out.push(b'\n');
    out.extend_from_slice(b64.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}

fn line(bytes: &[u8], what: &str) -> Result<(usize, usize), BundleError> {
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| BundleError::Envelope(format!("no {what} line")))?;
    Ok((nl, nl + 1))
}

/// A bundle envelope whose signature verified, not yet inflated: what a collector holds
/// before it decides (enrolment, rate) whether the body is worth inflating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed<'a> {
    /// The node the envelope names and whose key signed it.
    pub node: NodeId,
    /// The whole envelope as received.
    pub bytes: &'a [u8],
    body: &'a [u8],
}

/// Check one bundle envelope without inflating anything: size first, then the header and
/// node, then the signature of that node over the compressed bytes as received.
pub fn verify(bytes: &[u8]) -> Result<Sealed<'_>, BundleError> {
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Err(BundleError::TooLarge { found: bytes.len() });
    }
    let rest = bytes.strip_prefix(HEADER).ok_or_else(|| {
        BundleError::Envelope(format!(
            "expected a first line starting {:?}, found {:?}",
            String::from_utf8_lossy(HEADER),
            String::from_utf8_lossy(&bytes[..bytes.len().min(HEADER.len())])
                .escape_debug()
                .to_string()
        ))
    })?;
    let (end, next) = line(rest, "node")?;
    let node = std::str::from_utf8(&rest[..end])
        .ok()
        .and_then(NodeId::parse)
        .filter(|n| n.key().is_some())
        .ok_or_else(|| {
            BundleError::Envelope(
                "the first line does not end in a node id (64 hex digits of a key)".into(),
            )
        })?;
    let rest = &rest[next..];
    let (end, next) = line(rest, "signature")?;
    let sig = Some(&rest[..end])
        .filter(|l| l.len() == SIG_B64)
        .and_then(|l| base64::engine::general_purpose::STANDARD.decode(l).ok())
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
        .ok_or_else(|| BundleError::Envelope("signature line is not base64 of 64 bytes".into()))?;
    let body = &rest[next..];
    let key = node
        .key()
        .ok_or_else(|| BundleError::Envelope(format!("node {node} is not a key")))?;
    key.verify(&signed_message(&node, body), &Signature::from_bytes(&sig))
        .map_err(|_| BundleError::Signature { node })?;
    Ok(Sealed { node, bytes, body })
}

impl Sealed<'_> {
    /// Inflate the verified body to at most [`MAX_INFLATED_BYTES`] and read its JSON (no
    /// unknown fields, format [`super::BUNDLE_FORMAT`], the node of the envelope, every limit
    /// of [`Bundle::check`]).
    pub fn inflate(&self) -> Result<Opened, BundleError> {
        let mut json = Vec::new();
        DeflateDecoder::new(self.body)
            .take(MAX_INFLATED_BYTES as u64 + 1)
            .read_to_end(&mut json)
            .map_err(|e| BundleError::Body(format!("not deflate data: {e}")))?;
        if json.len() > MAX_INFLATED_BYTES {
            return Err(BundleError::Body(format!(
                "inflates to more than {MAX_INFLATED_BYTES} bytes"
            )));
        }
        let bundle = read_json(&json)?;
        if bundle.node != self.node {
            return Err(BundleError::Body(format!(
                "names node {} inside an envelope signed by node {}",
                bundle.node, self.node
            )));
        }
        Ok(Opened {
            bundle,
            bytes: self.bytes.to_vec(),
        })
    }
}

/// Read and verify one bundle envelope: [`verify`] (size, envelope, signature), then
/// [`Sealed::inflate`] (the body within its limits).
pub fn open(bytes: &[u8]) -> Result<Opened, BundleError> {
    verify(bytes)?.inflate()
}

fn read_json(json: &[u8]) -> Result<Bundle, BundleError> {
    // The format number first, so a newer bundle is named as such, not as unknown fields.
    #[derive(serde::Deserialize)]
    struct Format {
        format: u32,
    }
    let f: Format = serde_json::from_slice(json)
        .map_err(|e| BundleError::Body(format!("not a bundle (no format number): {e}")))?;
    if f.format != super::BUNDLE_FORMAT {
        return Err(BundleError::Body(format!(
            "format {} is not the format this reader knows ({})",
            f.format,
            super::BUNDLE_FORMAT
        )));
    }
    let b: Bundle = serde_json::from_slice(json)
        .map_err(|e| BundleError::Body(format!("format {}: {e}", super::BUNDLE_FORMAT)))?;
    b.check().map_err(BundleError::Body)?;
    Ok(b)
}
