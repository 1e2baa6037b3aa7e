//! Pure: whether a report or a failure bundle is stored, answered as a resend, or refused,
//! and with which status.

use fleet_report::{AllowList, BundleError, Opened, ReportError, Sealed, Verified};

use crate::store::{BundleKnown, Known};

/// The collector's limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Most reports stored per node.
    pub rows_per_node: u64,
    /// Reports a node may send at once.
    pub burst: u32,
    /// Reports per second a node's allowance refills by (a bundle takes from the same
    /// allowance as a report).
    pub per_sec: f64,
    /// What one node may keep of failure bundles.
    pub bundles: BundleQuota,
}

/// The per-node quota of failure bundles: a node past either is refused (507) until the
/// publisher removes some (`k3os-ops collector delete-bundles`, [`crate::Store::delete_bundles`]).
///
/// Refused rather than making room by evicting the node's oldest bundle: the bundles kept are
/// the evidence the guard and the publisher judged a release by (the first failures, the
/// canaries'), and the collector deletes none by itself. A refused node loses nothing: 507
/// leaves its bundles kept on its state partition (its newest few) for the next try. And an
/// eviction by arrival would let anyone on the path who captured a node's old bundles replay
/// them, each stored anew as the newest, until they had pushed its real newest evidence out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleQuota {
    /// Most bundles stored per node.
    pub count: u64,
    /// Most sealed bytes stored per node, summed over its bundles.
    pub bytes: u64,
}

impl Default for BundleQuota {
    /// 32 bundles and 1 MiB per node: a few failed attempts of each of the last releases
    /// (a bundle is at most 64 KiB sealed, a failing health check's usually a few KiB), so
    /// 10,000 enrolled nodes hold at most 10 GiB of bundles.
    fn default() -> Self {
        BundleQuota {
            count: 32,
            bytes: 1024 * 1024,
        }
    }
}

impl Default for Limits {
    /// 100,000 rows (years of outcomes) per node; a burst of 300 (a full spool after an
    /// outage) refilled at 1 report per second.
    fn default() -> Self {
        Limits {
            rows_per_node: 100_000,
            burst: 300,
            per_sec: 1.0,
            bundles: BundleQuota::default(),
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

/// Check a bundle's envelope, its signature and the node's enrolment, without inflating
/// anything: the sealed bundle with the node's site, or the refusal (413, 400, 401, 403).
pub fn verify_bundle<'a>(
    body: &'a [u8],
    allow: &'a AllowList,
) -> Result<(Sealed<'a>, &'a str), Refused> {
    let sealed = fleet_report::verify_bundle(body).map_err(bundle_refusal)?;
    let site = allow.site_of(&sealed.node).ok_or_else(|| {
        Refused::new(
            403,
            format!(
                "node {} is not enrolled (not on the allow-list)",
                sealed.node
            ),
        )
    })?;
    Ok((sealed, site))
}

/// The status of a bundle [`fleet_report::open_bundle`] refused: 413 for the size, 401 for the
/// signature, 400 for the rest; the why escaped.
pub fn bundle_refusal(e: BundleError) -> Refused {
    let status = match e {
        BundleError::TooLarge { .. } => 413,
        BundleError::Signature { .. } => 401,
        _ => 400,
    };
    Refused::new(status, e.to_string().escape_debug().to_string())
}

/// A verified bundle, before it is inflated, against what the store holds of its node: a
/// resend (these bytes are stored for the node: 200, stored once), the node's quota full
/// (507), or None: go on.
pub fn admit_sealed(
    s: &Sealed,
    known: &BundleKnown,
    q: &BundleQuota,
) -> Result<Option<Admit>, Refused> {
    if known.resend {
        return Ok(Some(Admit::Resend));
    }
    let size = s.bytes.len() as u64;
    if known.count >= q.count || known.bytes.saturating_add(size) > q.bytes {
        return Err(Refused::new(
            507,
            format!(
                "node {} has {} bundles ({} bytes) stored; {size} more bytes would pass its \
                 quota ({} bundles, {} bytes): the publisher frees it with \
                 `k3os-ops collector delete-bundles --node {}`",
                s.node, known.count, known.bytes, q.count, q.bytes, s.node
            ),
        ));
    }
    Ok(None)
}

/// An opened bundle whose (version, attempt) the node already has a bundle for (other bytes:
/// the same ones were answered by [`admit_sealed`]): 409. None taken: store it.
pub fn admit_opened(o: &Opened, taken: bool) -> Result<Admit, Refused> {
    let b = &o.bundle;
    if taken {
        return Err(Refused::new(
            409,
            format!(
                "node {} already sent a bundle for attempt {} of {} with other bytes",
                b.node,
                b.attempt,
                b.version.escape_debug()
            ),
        ));
    }
    Ok(Admit::Store)
}

#[cfg(test)]
mod tests;
