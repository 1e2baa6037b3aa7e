//! fleet-report: the small signed report a node sends when an update reaches an outcome, and
//! the rules a collector uses to accept it.
//!
//! Both sides read this crate: `libupgrade` (the node) builds, signs and spools reports;
//! the `collector` crate parses, verifies and stores them. It does no I/O.
//!
//! # The report (formats 1 and 2)
//! A [`Report`] names the node (its ed25519 public key, [`NodeId`]), the site it belongs to,
//! a per-node sequence number, the time, the channel, the release (version and generation) and
//! one [`Outcome`]: staged (bytes fetched, by patch, chunks or whole files), stage failed
//! (why), waiting (for the site's wave, a pause, or a retry of a release that failed on the
//! node), trial boot, blessed, rolled back (why), fell back (why), or a withdrawn release
//! dropped. A report carries the lowest format that holds its outcome ([`Outcome::format`]): 2
//! for a wait for a retry, 1 for the rest, so a collector that reads only format 1 (the
//! previous release) refuses only those, naming the format, and takes everything else.
//!
//! On the wire ([`Report::sign`], [`parse`]) a report is at most [`MAX_REPORT_BYTES`] (1 KiB):
//!
//! ```text
//! k3os-report 1\n
//! <base64 of the ed25519 signature>\n
//! <the report's JSON, compact>
//! ```
//!
//! The signature is the node key's over `k3os-ops report v1\n` followed by *the exact JSON
//! bytes that follow it*: the reader verifies the bytes it received, and accepts them only
//! when they are the canonical encoding of the fields they hold (compact JSON in the declared
//! field order, as `serde_json` writes [`Report`]), so one report has exactly one signed form
//! and a resend is byte-identical. The prefix keeps a report signature from ever being a valid
//! signature of anything else. Reasons (`why`) are shortened (at a character boundary, marked
//! with `…`) so that the whole fits. [`parse`] refuses oversized bodies before reading them,
//! unknown fields, a newer format (naming both numbers), malformed names and keys, and a
//! signature that is not the named node's over those bytes.
//!
//! # Failure bundles
//! A [`Bundle`] is the evidence of one failed attempt (health check output, log tails, the
//! slot's decisions), sealed with the same node key and read with the same rules: see
//! `bundle`'s module docs for its envelope and limits ([`open_bundle`], [`Bundle::seal`]).
//!
//! # Enrolment: an allow-list of node keys
//! A collector stores a report only from a node key the publisher enrolled for a site
//! ([`AllowList`]: lines of `<node id> <site>`). Chosen over the alternatives because the
//! collector's reports feed an automatic halt, so whoever can reach the collector must not be
//! able to make sites up:
//! - *trust on first use per site name* lets anyone invent sites ("site-0001" … "site-9999")
//!   and report failures from all of them, which is exactly the forged halt to prevent;
//! - *signed enrolment* (a site key signs node keys) also prevents that but adds a second key
//!   per site to make, keep and rotate, for a gain (no publisher step per node) a fleet of
//!   single-node sites does not have.
//!
//! The node id is shown by `k3os-ops slot status` from the node's first use, so enrolling is
//! one line per node. A node enrolled for one site cannot report for another
//! ([`Refusal::WrongSite`]): the site is bound to the key, not taken from the report.
#![warn(missing_docs)]

mod allow;
mod bundle;
mod report;
mod wire;

pub use allow::{AllowList, AllowListError, Refusal};
#[cfg(feature = "fuzzing")]
pub use bundle::seal_body_for_fuzzing;
pub use bundle::{
    open as open_bundle, verify as verify_bundle, Bundle, BundleError, Failure, Opened, Sealed,
    Section, BUNDLE_FORMAT, MAX_BUNDLE_BYTES, MAX_INFLATED_BYTES, MAX_NAME_BYTES, MAX_SECTIONS,
    MAX_WHY_CHARS,
};
pub use report::{NodeId, Outcome, Report, Transfer, WaitFor, FORMAT};
pub use wire::{parse, ReportError, Verified, MAX_REPORT_BYTES};
