//! The signed envelope: [`Report::sign`] writes it, [`parse`] reads and verifies it.

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};

use crate::report::{NodeId, Report, FORMAT};

/// Largest report on the wire, envelope included, in bytes.
pub const MAX_REPORT_BYTES: usize = 1024;

/// The envelope's first line.
const HEADER: &[u8] = b"k3os-report 1\n";
/// What the node key signs before the JSON bytes (domain separation).
const SIGNED_PREFIX: &[u8] = b"k3os-ops report v1\n";
/// Length of an ed25519 signature in standard base64.
const SIG_B64: usize = 88;

/// Why a report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// More bytes than [`MAX_REPORT_BYTES`].
    #[error("report is {found} bytes, more than the {MAX_REPORT_BYTES} a report may have")]
    TooLarge {
        /// The bytes found (at least).
        found: usize,
    },
    /// The envelope is not `k3os-report 1`, a signature line, then JSON.
    #[error("report envelope: {0}")]
    Envelope(String),
    /// The JSON is not a report of a format this reader knows, or a field breaks its limit.
    #[error("report body: {0}")]
    Body(String),
    /// The signature is not the named node's over the body.
    #[error("report signature does not verify with node {node}'s key over the body received")]
    Signature {
        /// The node the report names.
        node: NodeId,
    },
    /// A report to sign is not the signing key's, or cannot be shortened to fit.
    #[error("cannot sign report: {0}")]
    Sign(String),
}

/// A report whose signature verified, with the exact bytes received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The report.
    pub report: Report,
    /// The whole envelope as received (what a collector stores and compares on resend).
    pub bytes: Vec<u8>,
}

fn signed_message(json: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNED_PREFIX.len() + json.len());
    m.extend_from_slice(SIGNED_PREFIX);
    m.extend_from_slice(json);
    m
}

fn envelope(key: &SigningKey, json: &[u8]) -> Vec<u8> {
    let sig = key.sign(&signed_message(json));
    let b64 = base64::engine::general_purpose::STANDARD.encode(sig.to_bytes());
    let mut out = Vec::with_capacity(HEADER.len() + SIG_B64 + 1 + json.len());
    out.extend_from_slice(HEADER);
    out.extend_from_slice(b64.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(json);
    out
}

/// `why` cut to its first `chars` characters, with `…` when cut.
fn cut(why: &str, chars: usize) -> String {
    let mut it = why.char_indices();
    match it.nth(chars) {
        Some((end, _)) => format!("{}…", &why[..end]),
        None => why.to_string(),
    }
}

/// Envelope length of a JSON body of `json` bytes.
fn wire_len(json: usize) -> usize {
    HEADER.len() + SIG_B64 + 1 + json
}

impl Report {
    /// The signed envelope of this report (see the crate docs), its reason shortened so that
    /// the whole fits in [`MAX_REPORT_BYTES`]. Refused when `key` is not the report's node or a
    /// field breaks its limit.
    pub fn sign(&self, key: &SigningKey) -> Result<Vec<u8>, ReportError> {
        if NodeId::of(&key.verifying_key()) != self.node {
            return Err(ReportError::Sign(format!(
                "the report names node {} but the key is node {}",
                self.node,
                NodeId::of(&key.verifying_key())
            )));
        }
        if let Some(what) = self.invalid_field() {
            return Err(ReportError::Sign(what));
        }
        let json = |r: &Report| serde_json::to_vec(r).map_err(|e| ReportError::Sign(e.to_string()));
        let whole = json(self)?;
        if wire_len(whole.len()) <= MAX_REPORT_BYTES {
            return Ok(envelope(key, &whole));
        }
        // The longest prefix of the reason that fits (JSON escapes make bytes per character
        // vary, so search on characters: the length grows with the prefix).
        let why = self.outcome.why().unwrap_or_default().to_string();
        let with = |chars: usize| {
            let mut r = self.clone();
            if let Some(w) = r.outcome.why_mut() {
                *w = if chars == 0 {
                    String::new()
                } else {
                    cut(&why, chars)
                };
            }
            r
        };
        let (mut lo, mut hi) = (0usize, why.chars().count());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if wire_len(json(&with(mid))?.len()) <= MAX_REPORT_BYTES {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let body = json(&with(lo))?;
        if wire_len(body.len()) > MAX_REPORT_BYTES {
            return Err(ReportError::Sign(format!(
                "report is {} bytes without its reason, more than {MAX_REPORT_BYTES}",
                wire_len(body.len())
            )));
        }
        Ok(envelope(key, &body))
    }
}

/// Read and verify one report envelope: size first, then the header, the signature line, the
/// JSON (no unknown fields, a format from 1 to [`FORMAT`] that is its outcome's, every field
/// within its limits), then the
/// signature of the named node over the JSON bytes exactly as received.
pub fn parse(bytes: &[u8]) -> Result<Verified, ReportError> {
    if bytes.len() > MAX_REPORT_BYTES {
        return Err(ReportError::TooLarge { found: bytes.len() });
    }
    let rest = bytes.strip_prefix(HEADER).ok_or_else(|| {
        ReportError::Envelope(format!(
            "expected first line {:?}, found {:?}",
            String::from_utf8_lossy(&HEADER[..HEADER.len() - 1]),
            String::from_utf8_lossy(&bytes[..bytes.len().min(HEADER.len())])
                .escape_debug()
                .to_string()
        ))
    })?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| ReportError::Envelope("no signature line".into()))?;
    let (sig_line, json) = (&rest[..nl], &rest[nl + 1..]);
    if sig_line.len() != SIG_B64 {
        return Err(ReportError::Envelope(format!(
            "signature line is {} bytes, expected {SIG_B64} (base64 of 64 bytes)",
            sig_line.len()
        )));
    }
    let sig = base64::engine::general_purpose::STANDARD
        .decode(sig_line)
        .ok()
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
        .ok_or_else(|| ReportError::Envelope("signature line is not base64 of 64 bytes".into()))?;
    let report = read_body(json)?;
    let key = report
        .node
        .key()
        .ok_or_else(|| ReportError::Body(format!("node id {} is not a key", report.node)))?;
    key.verify(&signed_message(json), &Signature::from_bytes(&sig))
        .map_err(|_| ReportError::Signature { node: report.node })?;
    Ok(Verified {
        report,
        bytes: bytes.to_vec(),
    })
}

fn read_body(json: &[u8]) -> Result<Report, ReportError> {
    // The format number first, so a newer report is named as such, not as unknown fields.
    #[derive(serde::Deserialize)]
    struct Version {
        v: u32,
    }
    let v: Version = serde_json::from_slice(json)
        .map_err(|e| ReportError::Body(format!("not a report (no format number `v`): {e}")))?;
    if !(1..=FORMAT).contains(&v.v) {
        return Err(ReportError::Body(format!(
            "report format {} is not a format this reader knows (1 to {FORMAT}){}",
            v.v,
            if v.v > FORMAT {
                ": newer than this collector"
            } else {
                ""
            }
        )));
    }
    let report: Report = serde_json::from_slice(json)
        .map_err(|e| ReportError::Body(format!("format {}: {e}", v.v)))?;
    if let Some(what) = report.invalid_field() {
        return Err(ReportError::Body(what));
    }
    // Only the canonical encoding (what `Report::sign` writes) is a report: no extra fields,
    // spaces, reordering or alternative escapes, so one report has one signed form.
    match serde_json::to_vec(&report) {
        Ok(canonical) if canonical == json => Ok(report),
        _ => Err(ReportError::Body(
            "not the canonical encoding of its fields (compact JSON in the documented order, no unknown fields)".into(),
        )),
    }
}

#[cfg(test)]
mod tests;
