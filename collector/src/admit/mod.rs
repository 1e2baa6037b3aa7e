//! Pure: whether a report is stored, answered as a resend, or refused, and with which status.

use fleet_report::{AllowList, ReportError, Verified};

use crate::store::Known;

/// The collector's limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Most reports stored per node.
    pub rows_per_node: u64,
    /// Reports a node may send at once.
    pub burst: u32,
    /// Reports per second a node's allowance refills by.
    pub per_sec: f64,
}

impl Default for Limits {
    /// 100,000 rows (years of outcomes) per node; a burst of 300 (a full spool after an
    /// outage) refilled at 1 report per second.
    fn default() -> Self {
        Limits {
            rows_per_node: 100_000,
            burst: 300,
            per_sec: 1.0,
        }
    }
}

/// A refusal: the HTTP status and one line saying why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The HTTP status.
    pub status: u16,
    /// Why, with what was found (untrusted parts escaped).
    pub why: String,
}

impl Refused {
    fn new(status: u16, why: impl Into<String>) -> Refused {
        Refused {
            status,
            why: why.into(),
        }
    }
}

/// What to do with a report that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Store it (201).
    Store,
    /// It is already stored, byte for byte: a resend (200, stored once).
    Resend,
}

/// Parse, verify and check enrolment: the report, or the refusal (413, 400, 401, 403).
pub fn verify(body: &[u8], allow: &AllowList) -> Result<Verified, Refused> {
    let v = fleet_report::parse(body).map_err(|e| {
        let status = match e {
            ReportError::TooLarge { .. } => 413,
            ReportError::Signature { .. } => 401,
            _ => 400,
        };
        Refused::new(status, e.to_string().escape_debug().to_string())
    })?;
    if v.report.seq > i64::MAX as u64 {
        return Err(Refused::new(
            400,
            format!(
                "seq {} is above {} (the largest stored)",
                v.report.seq,
                i64::MAX
            ),
        ));
    }
    allow
        .check(&v.report)
        .map_err(|e| Refused::new(403, e.to_string()))?;
    Ok(v)
}

/// Against what the store holds for the node: store, a resend, or 409 / 507.
pub fn admit(v: &Verified, known: &Known, limits: &Limits) -> Result<Admit, Refused> {
    let seq = v.report.seq;
    if let Some(body) = &known.same_seq {
        return if *body == v.bytes {
            Ok(Admit::Resend)
        } else {
            Err(Refused::new(
                409,
                format!(
                    "node {} already reported number {seq} with other bytes",
                    v.report.node
                ),
            ))
        };
    }
    if let Some(max) = known.max_seq.filter(|m| seq <= *m) {
        return Err(Refused::new(
            409,
            format!(
                "node {} report number {seq} is not above its newest stored ({max}): a replay",
                v.report.node
            ),
        ));
    }
    if known.rows >= limits.rows_per_node {
        return Err(Refused::new(
            507,
            format!(
                "node {} has {} reports stored, the most one node may have ({})",
                v.report.node, known.rows, limits.rows_per_node
            ),
        ));
    }
    Ok(Admit::Store)
}

#[cfg(test)]
mod tests;
