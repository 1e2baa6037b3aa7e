//! Failure bundles on the node: the evidence of a failed attempt, collected while the failing
//! slot still runs, kept on the state partition through the rollback, and sent home from the
//! good slot (the format, [`fleet_report::Bundle`], is fleet-report's; the collector stores
//! it). Not the offline release bundle of [`crate::bundle`].
//!
//! - **When** (`collect`): the failing slot's assessment rolls back — a health check failed,
//!   or an awaited check (the agent's Node Ready, reachability) did not come in time — or its
//!   confirm itself fails while the slot is on trial: one bundle per failed attempt, written
//!   before the assessment's loader writes and so before any fallback reboot. Where the slot
//!   never reached userspace (a panic, the initramfs, dm-verity), the good slot writes a
//!   [`fleet_report::Failure::NoUserspace`] bundle when its assessment settles the loader's
//!   fallback and no bundle of that attempt is kept: from the loader's try counts, the
//!   initramfs's `verity-failure` record and pstore (`/sys/fs/pstore`) where the node has one;
//!   the pstore records it carries are removed once the bundle is kept (a firmware backend's
//!   space is small, and they would ride along with the next fallback's bundle).
//! - **What** (`compose`, pure): each health check's output, the newest decisions of the
//!   slot decision log, the tails of the kernel log (`/dev/kmsg`) and of the service logs
//!   ([`BundleSettings::logs`]), the versions; redacted by the node's rules
//!   ([`crate::Redactor`]: the defaults and [`BundleSettings::redact`]), only the count said;
//!   sealed with the node key into at most 64 KiB ([`fleet_report::Bundle::seal`] cuts the
//!   longest section's head).
//! - **Where** (`store`): `<state_dir>/failure-bundles/v1/`, at most [`BundleSettings::kept`]
//!   bundles, the oldest dropped; written by temp file, fsync and rename.
//! - **Sent** (`send`): by [`Updater::send_bundles`], after the reports, within what the
//!   caller allows ([`BundleAllowance`]: the stage windows, the byte budget), to the
//!   `report_url` with its last segment replaced by `bundles`; `slot status` lists the kept
//!   bundles and what became of each ([`Updater::failure_bundle_lines`]).
//!
//! Only a node with a `report_url` collects bundles (like reports: no URL, no node key is
//! made). Collecting never fails or delays the assessment: errors are logged.

mod compose;
mod send;
mod settings;
mod sources;
mod store;

use bootconfig::Slot;
use fleet_report::{Failure, NodeId};

pub use send::{Allowance as BundleAllowance, BundlesSent, BUNDLE_CONTENT_TYPE};
pub use settings::{BundleSettings, DEFAULT_KEPT as DEFAULT_BUNDLES_KEPT, DEFAULT_LOGS};
pub use store::{Delivery as BundleDelivery, Entry as KeptBundle, BUNDLE_DIR};

use compose::{Attempt, Evidence, Piece};
use store::Store;

use crate::boot::assess::Assessment;
use crate::boot::verity_failure::VerityFailure;
use crate::error::{Error, Result};
use crate::state::{CheckResult, Decision, OtherSlot, Outcome, SlotState, State};
use crate::updater::Updater;

/// Why an assessment ran, as far as a bundle's failure kind goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Assessed {
    /// The boot-time confirm, `slot confirm`, the agent's report of its checks.
    Checks,
    /// The awaited checks' time limit passed (`slot await-bless`, the agent).
    AwaitedTimeout,
}

/// The bundle an assessment calls for, before it is carried out: the booted slot's own
/// failed attempt (a rollback), or the other slot's fallback that left no bundle (`kept`
/// says whether one of an attempt is kept). Pure.
fn wanted(
    a: &Assessment,
    booted: Slot,
    how: Assessed,
    kept: &dyn Fn(&str, u64, u32) -> bool,
) -> Option<(Attempt, bool)> {
    let st = &a.state;
    let attempt_of = |slot: Slot| {
        let r = st.slot(slot);
        let version = r.version.clone().unwrap_or_default();
        let generation = r.generation.unwrap_or(0);
        let n = st
            .failed_for(&version, r.generation)
            .map_or(1, |f| f.attempts.max(1));
        (version, generation, n)
    };
    if let Outcome::RolledBack { .. } = a.verdict.outcome {
        let (version, generation, attempt) = attempt_of(booted);
        let failure = match how {
            Assessed::Checks => Failure::HealthCheck,
            Assessed::AwaitedTimeout => Failure::AwaitedTimeout,
        };
        return Some((
            Attempt {
                version,
                generation,
                attempt,
                slot: booted,
                failure,
                why: a.verdict.reason.clone(),
            },
            false,
        ));
    }
    let Some(OtherSlot::FallbackTaken { slot, .. }) = a.verdict.other_slot else {
        return None;
    };
    let (version, generation, attempt) = attempt_of(slot);
    if version.is_empty() || kept(&version, generation, attempt) {
        return None;
    }
    let why = st
        .last_decision(slot)
        .map_or_else(String::new, |d| d.why.clone());
    Some((
        Attempt {
            version,
            generation,
            attempt,
            slot,
            failure: Failure::NoUserspace,
            why,
        },
        true,
    ))
}

/// What survives of a boot that never reached userspace: the loader's tries, the
/// initramfs's record naming `slot`, pstore's records.
fn survived(
    other: Option<&OtherSlot>,
    verity: Option<&VerityFailure>,
    pstore: Vec<Piece>,
) -> Vec<Piece> {
    let mut out = Vec::new();
    if let Some(OtherSlot::FallbackTaken { slot, used, tries }) = other {
        out.push(Piece {
            name: "loader/tries".into(),
            text: format!(
                "the loader fell back from slot {slot} after {used} of {tries} boot tries, \
                 none of which reached a verdict in userspace"
            ),
        });
        if let Some(v) = verity.filter(|v| v.slot == *slot) {
            out.push(Piece {
                name: "initramfs/verity-failure".into(),
                text: format!("slot {}: {}", v.slot, v.reason),
            });
        }
    }
    out.extend(pstore);
    out
}

fn rfc3339(at: u64) -> String {
    chrono::DateTime::from_timestamp(at as i64, 0)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl Updater {
    fn bundle_store(&self) -> Option<Store> {
        self.cfg
            .report_url
            .as_ref()
            .map(|_| Store::new(&self.cfg.state_dir))
    }

    /// Keep the bundle `a` calls for (module docs), before its effects are carried out.
    /// Never an error: a bundle that cannot be made is logged.
    pub(crate) fn bundle_assessment(
        &self,
        a: &Assessment,
        booted: Slot,
        how: Assessed,
        verity: Option<&VerityFailure>,
    ) {
        let Some(store) = self.bundle_store() else {
            return;
        };
        let kept = |v: &str, g: u64, n: u32| {
            store.list().is_ok_and(|l| {
                l.iter()
                    .any(|e| e.version == v && e.generation == g && e.attempt == n)
            })
        };
        let Some((attempt, no_userspace)) = wanted(a, booted, how, &kept) else {
            return;
        };
        // The good slot's own checks and logs are not the failed boots' evidence.
        let pstore_dir = &self.cfg.failure_bundle.pstore_dir;
        let records = match no_userspace {
            true => sources::pstore(pstore_dir),
            false => Vec::new(),
        };
        let (checks, pieces) = match no_userspace {
            true => (
                &[][..],
                survived(a.verdict.other_slot.as_ref(), verity, records.clone()),
            ),
            false => (&a.verdict.checks[..], self.live_pieces()),
        };
        if self.keep_bundle(&store, attempt, checks, &a.state.history, pieces) {
            sources::remove_pstore(pstore_dir, &records);
        }
    }

    /// Keep a bundle of a confirm that failed with `err` while the booted slot is on trial.
    pub(crate) fn bundle_confirm_failure(&self, err: &Error) {
        let Some(store) = self.bundle_store() else {
            return;
        };
        let Ok(booted) = self.booted_slot() else {
            return;
        };
        let Ok(st) = self.load(Some(booted)) else {
            return;
        };
        let Some(attempt) = confirm_attempt(&st, booted, err) else {
            return;
        };
        // The assessment kept one before its loader writes failed: it says more.
        let kept = store.list().is_ok_and(|l| {
            l.iter().any(|e| {
                (e.version.as_str(), e.generation, e.attempt)
                    == (
                        attempt.version.as_str(),
                        attempt.generation,
                        attempt.attempt,
                    )
            })
        });
        if kept {
            return;
        }
        self.keep_bundle(&store, attempt, &[], &st.history, self.live_pieces());
    }

    /// The running slot's kernel log and service logs.
    fn live_pieces(&self) -> Vec<Piece> {
        let s = &self.cfg.failure_bundle;
        let kernel = sources::kernel_log(&s.kernel_log).map(|text| Piece {
            name: "log/kernel".into(),
            text,
        });
        kernel
            .into_iter()
            .chain(sources::service_logs(&s.logs))
            .collect()
    }

    /// Compose, seal and store a bundle; whether it was kept (a failure is logged).
    fn keep_bundle(
        &self,
        store: &Store,
        attempt: Attempt,
        checks: &[CheckResult],
        decisions: &[Decision],
        pieces: Vec<Piece>,
    ) -> bool {
        let what = format!("{} attempt {}", attempt.version, attempt.attempt);
        match self.try_keep_bundle(store, attempt, checks, decisions, pieces) {
            Ok(bytes) => {
                log::info!("failure bundle of {what} kept ({bytes} bytes sealed)");
                true
            }
            Err(e) => {
                log::warn!(
                    "failure bundle of {what} not kept: {}",
                    crate::chain_line(&e)
                );
                false
            }
        }
    }

    fn try_keep_bundle(
        &self,
        store: &Store,
        attempt: Attempt,
        checks: &[CheckResult],
        decisions: &[Decision],
        pieces: Vec<Piece>,
    ) -> Result<usize> {
        let s = &self.cfg.failure_bundle;
        let redactor = crate::Redactor::new(&s.redact).map_err(|e| Error::Usage(e.to_string()))?;
        let key = crate::report::key::load_or_create(&self.cfg.state_dir)?;
        let now = crate::state::now();
        let ev = Evidence {
            attempt,
            time: rfc3339(now),
            checks: checks.to_vec(),
            decisions: decisions.to_vec(),
            pieces,
            versions: sources::versions(&self.cfg.release_file),
        };
        let b = compose::compose(&ev, NodeId::of(&key.verifying_key()), &redactor);
        let sealed = b
            .seal(&key)
            .map_err(|e| Error::Usage(format!("failure bundle: {e}")))?;
        for gone in store.put(&b, &sealed, now, s.kept)? {
            log::warn!(
                "failure bundles: {} dropped, the oldest beyond {}",
                gone.file,
                s.kept
            );
        }
        Ok(sealed.len())
    }

    /// Send the kept failure bundles within `allow` (after the reports; see the module docs),
    /// only when the running slot is good; None when the node reports nowhere. Never an error: what failed is in
    /// [`BundlesSent::stopped`], and the rest waits for the next call.
    pub fn send_bundles(&self, allow: BundleAllowance) -> Option<BundlesSent> {
        let store = self.bundle_store()?;
        let url = send::bundles_url(self.cfg.report_url.as_deref()?);
        // From a good slot only: a failing slot falls back first, never held by a send.
        let good = self
            .booted_slot()
            .and_then(|s| {
                self.load(Some(s))
                    .map(|st| st.slot(s).state == SlotState::Good)
            })
            .unwrap_or(false);
        let allow = BundleAllowance {
            open: allow.open && good,
            ..allow
        };
        let mut out = send::send(&store, &url, allow, crate::state::now());
        if !good && out.waiting > 0 {
            out.stopped = Some("the running slot is not good: bundles go from a good slot".into());
        }
        if let (Some(why), true) = (&out.stopped, out.waiting > 0) {
            log::info!(
                "failure bundles: {} sent, {} waiting: {why}",
                out.sent,
                out.waiting
            );
        }
        Some(out)
    }

    /// The failure bundles kept on the state partition, oldest first (none when the node
    /// reports nowhere).
    pub fn failure_bundles(&self) -> Vec<KeptBundle> {
        self.bundle_store()
            .and_then(|s| s.list().ok())
            .unwrap_or_default()
    }

    /// `slot status` lines about the kept failure bundles, one each.
    pub fn failure_bundle_lines(&self) -> Vec<String> {
        self.failure_bundles().iter().map(status_line).collect()
    }
}

/// The attempt of a confirm that failed with `err`: the booted slot is on trial.
fn confirm_attempt(st: &State, booted: Slot, err: &Error) -> Option<Attempt> {
    let r = st.slot(booted);
    if r.state != SlotState::Trying {
        return None;
    }
    let version = r.version.clone()?;
    let attempt = st
        .failed_for(&version, r.generation)
        .map_or(0, |f| f.attempts)
        .saturating_add(1);
    Some(Attempt {
        version,
        generation: r.generation.unwrap_or(0),
        attempt,
        slot: booted,
        failure: Failure::Confirm,
        why: format!("confirm failed: {}", crate::chain_line(err)),
    })
}

fn failure_word(f: Failure) -> &'static str {
    match f {
        Failure::HealthCheck => "health check failed",
        Failure::AwaitedTimeout => "awaited check timed out",
        Failure::Confirm => "confirm failed",
        Failure::NoUserspace => "never reached userspace",
    }
}

/// One kept bundle as `slot status` says it.
pub fn status_line(e: &KeptBundle) -> String {
    let what = format!(
        "failure bundle: {} (generation {}) attempt {}, {}, {} bytes",
        e.version.escape_debug(),
        e.generation,
        e.attempt,
        failure_word(e.failure),
        e.bytes
    );
    let status = crate::report::refusal::status_text;
    let fate = match &e.delivery {
        BundleDelivery::Waiting => "waiting to be sent".to_string(),
        BundleDelivery::Sent { at, status: s } => {
            format!("sent {} ({})", rfc3339(*at), status(*s))
        }
        BundleDelivery::SetAside {
            status: s,
            reason,
            tries,
            next_at,
        } => format!(
            "refused ({}: {reason}), {tries} of {} tries, next after {}",
            status(*s),
            crate::report::refusal::MAX_TRIES,
            rfc3339(*next_at)
        ),
        BundleDelivery::Refused { status: s, reason } => {
            format!("refused for good ({}: {reason})", status(*s))
        }
    };
    format!("{what}: {fate}")
}

#[cfg(test)]
mod tests;
