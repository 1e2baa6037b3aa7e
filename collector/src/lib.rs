//! collector: receives, verifies and stores the reports of a fleet's nodes
//! ([`fleet_report`]) over HTTP; `k3os-ops collector serve` runs it.
//!
//! `POST /v1/reports` with one report envelope as the body. Every request is judged in this
//! order, cheapest first, and a report is stored only when it passes all of them
//! (module `admit`, pure; [`server`] does the I/O):
//!
//! | check | refused with |
//! |---|---|
//! | body at most 1 KiB ([`fleet_report::MAX_REPORT_BYTES`]) | 413 Payload Too Large |
//! | envelope, format 1, canonical JSON, field limits | 400 Bad Request |
//! | signature of the named node over the bytes | 401 Unauthorized |
//! | node enrolled, for the site the report claims ([`fleet_report::AllowList`]) | 403 Forbidden |
//! | the node's rate (token bucket, [`Limits`]) | 429 Too Many Requests |
//! | number above the node's newest stored (a resend of the same bytes: 200, stored once) | 409 Conflict |
//! | the node's row cap ([`Limits::rows_per_node`]) | 507 Insufficient Storage |
//!
//! Stored: 201 Created. The body of every refusal names the check and what was found
//! (escaped, one line); the refusal is logged once and nothing of the report is stored.
//!
//! `POST /v1/bundles` with one sealed failure bundle ([`fleet_report::Bundle`], Content-Type
//! `application/vnd.k3os-ops.bundle.v1`), under the same threat model, in this order:
//!
//! | check | refused with |
//! |---|---|
//! | body at most 64 KiB ([`fleet_report::MAX_BUNDLE_BYTES`]), before it is read whole | 413 |
//! | envelope `k3os-bundle 1 <node>`, a signature line | 400 |
//! | signature of the named node over the compressed bytes | 401 |
//! | node enrolled (the site stored is the allow-list's) | 403 |
//! | the node's rate (the same token bucket as its reports) | 429 |
//! | these bytes not stored for the node yet (else a resend: 200, stored once) | — |
//! | the node's bundle quota, count and bytes ([`BundleQuota`]) | 507 |
//! | body inflates within 1 MiB to a bundle of format 1 within its limits, of that node | 400 |
//! | its (version, attempt) not taken by other bytes | 409 |
//!
//! Nothing is inflated before all of the checks above the body's: an unenrolled sender, a
//! flooding node and a node whose quota is full cannot make the collector decompress a byte.
//! The 409 comes last because the (version, attempt) a bundle is stored under is inside it.
//!
//! # Threat model
//! Whoever can reach the collector's port (the collector is meant to face the sites' networks)
//! may send anything. The reports feed fleet status and, later, an automatic halt, so:
//! - **Forged reports from invented sites** (to halt a good rollout): a report is signed by a
//!   node key and stored only when that key is on the publisher's allow-list. A made-up key is
//!   403; a real node id with a forger's signature is 401.
//! - **Reports for another site** (to blame or hide one): the site is bound to the key on the
//!   allow-list; a node enrolled for `a` claiming `b` is 403.
//! - **Hiding real failures**: a sender without the node's key cannot make a report the
//!   collector prefers over the node's own (numbers only go up, and only the node can sign
//!   them); it can only drop traffic on the path, which shows as the site going silent.
//! - **Replay** (an old "blessed" to mask a rollback): each node numbers its reports; one at or
//!   below the newest stored is 409 unless it is byte for byte the stored one (a resend, 200).
//! - **Flood**: bodies over 1 KiB are refused before they are read whole; each enrolled node
//!   has a token bucket (429); unenrolled senders cost one signature check and are never
//!   stored. Per-address limits are the reverse proxy's job.
//! - **Disk fill**: at most [`Limits::rows_per_node`] reports and [`BundleQuota`] bundles per
//!   enrolled node (507), so the database is bounded by the allow-list's size. A full bundle
//!   quota refuses; it does not evict (why: [`BundleQuota`]). The publisher frees it with
//!   [`Store::delete_bundles`] (`k3os-ops collector delete-bundles`).
//! - **Decompression bombs**: a bundle is inflated only after its node's signature and
//!   enrolment are checked, and never past 1 MiB.
//!
//! Not covered: a node whose key is stolen can report anything for its own site (within its
//! rate and cap); the publisher removes it from the allow-list. TLS is a reverse proxy's (the
//! reports need no secrecy; their signatures give integrity end to end).
//!
//! # Storage
//! One [`Store`] trait, two backends: SQLite ([`SqliteStore`], `sqlite:PATH`, the embedded
//! default) and PostgreSQL ([`PgStore`], a `postgres://` URL) for a collector on more than one
//! machine. Both keep each report's and each bundle's fields as columns and its envelope as
//! received.
#![warn(missing_docs)]

mod admit;
#[cfg(test)]
mod bench;
pub mod cause;
pub mod dashboard;
pub mod fleet;
pub mod guard;
pub mod history;
mod rate;
pub mod server;
mod store;
#[cfg(test)]
mod testutil;
pub mod time;

pub use admit::{BundleQuota, Limits, Refused};
pub use rate::RateLimiter;
pub use store::{
    open, BundleKnown, BundleRow, BundleSelection, GuardAction, Known, PgStore, Row, SqliteStore,
    Store, StoreError,
};
