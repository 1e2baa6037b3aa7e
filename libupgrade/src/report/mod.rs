//! Reports back to the publisher: at every outcome of an update (staged, stage failed,
//! waiting for a wave, a pause or a retry, trial boot, blessed, rolled back, fell back, a
//! withdrawn release dropped) the node spools one small signed report ([`fleet_report`], at
//! most 1 KiB) on its state partition, and sends the spool to the collector at the end of a
//! command.
//!
//! - **Where**: `report_url` in the node config ([`crate::Config`]), with the node's site name
//!   `report_site`. No URL: nothing is spooled or sent, and no key is made by a flow.
//! - **Who**: the node key ([`key`], `<state_dir>/node-key`), made at first use; its public
//!   half is the node's id, shown by `k3os-ops slot status` ([`Updater::node_id`]) for the
//!   publisher to enrol.
//! - **When**: the flows that record outcomes spool them as they return ([`Updater::stage`],
//!   [`Updater::resolve`], [`Updater::activate_awaiting`], [`Updater::rollback`],
//!   [`Updater::confirm_with`]); pure mappings in `outcome` decide which outcome makes which
//!   report. A wait is reported once per release and reason: an idle or waiting node
//!   spools nothing new. A resolution reports a release it holds back because it failed here
//!   ([`crate::rollout::decide_retry`]) as a wait for a retry (report format 2), so the CLI's
//!   `upgrade` and the agent, which both resolve through [`Updater::resolve`], say it alike.
//!   [`Updater::send_reports`] sends, oldest first (`send`); a report the collector refuses
//!   is set aside and never holds newer ones back (`refusal` states which answers refuse, how
//!   often a refused report is tried and when it is dropped; [`Updater::report_refusals`]
//!   says what became of them).
//! - **Never in the way**: spooling and sending never fail or stop a flow (errors are logged);
//!   a send gives up after a few seconds, leaving the rest spooled ([`spool`]: bounded,
//!   oldest dropped and counted, numbered so that a resend is idempotent).

pub(crate) mod evidence;
mod key;
pub(crate) mod outcome;
mod redact;
mod refusal;
mod send;
mod spool;

use std::path::{Path, PathBuf};

use fleet_report::{NodeId, Report};

pub use evidence::{
    BundleAllowance, BundleDelivery, BundleSettings, BundlesSent, KeptBundle, BUNDLE_CONTENT_TYPE,
    BUNDLE_DIR, DEFAULT_BUNDLES_KEPT, DEFAULT_LOGS as DEFAULT_BUNDLE_LOGS,
};
pub use key::KEY_FILE;
pub use redact::{
    RedactError, Redactor, Rule as RedactRule, DEFAULT_RULES as DEFAULT_REDACT_RULES,
};
pub use send::{ReportsSent, CONTENT_TYPE};
pub use spool::{Limits, SPOOL_DIR};

use crate::error::Result;
use crate::updater::Updater;
use outcome::Note;
use refusal::{After, DropReason};
use spool::Spool;

/// A resolution's wait, as far as reporting goes.
enum Wait {
    /// Not a resolution: the last wait reported stays as it is.
    Unchanged,
    /// A resolution's rollout seed (None: no rollout took part), its wait now (None: it
    /// waits for nothing) and the wait's key.
    Now(Option<u32>, Option<(Note, String)>),
}

/// The reporter of one node: where to send, as whom, what is spooled.
pub(crate) struct Reporter {
    state_dir: PathBuf,
    url: String,
    site: String,
    spool: Spool,
}

impl Reporter {
    /// The reporter `cfg` asks for (None: no `report_url`).
    pub(crate) fn of(cfg: &crate::Config) -> Option<Reporter> {
        let url = cfg.report_url.clone()?;
        Some(Reporter {
            spool: Spool::new(&cfg.state_dir, Limits::default()),
            state_dir: cfg.state_dir.clone(),
            url,
            site: cfg.report_site.clone().unwrap_or_default(),
        })
    }

    /// Spool `notes` in order; `channel`, when given, is remembered for later reports; `wait`
    /// is a resolution's wait (reported unless it is the last one reported) or its absence.
    fn spool(&self, notes: Vec<Note>, channel: Option<&str>, wait: Wait) {
        if let Err(e) = self.try_spool(notes, channel, wait) {
            log::warn!("report not spooled: {}", crate::chain_line(&e));
        }
    }

    fn try_spool(&self, mut notes: Vec<Note>, channel: Option<&str>, wait: Wait) -> Result<()> {
        let _lock = self.spool.lock()?;
        let mut meta = self.spool.meta()?;
        let before = meta.clone();
        if let Some(c) = channel {
            meta.channel = c.to_string();
        }
        match wait {
            Wait::Unchanged => {}
            Wait::Now(seed, None) => {
                meta.last_wait = None;
                meta.seed = seed.or(meta.seed);
            }
            Wait::Now(seed, Some((note, key))) => {
                meta.seed = seed.or(meta.seed);
                if meta.last_wait.as_ref() != Some(&key) {
                    notes.push(note);
                    meta.last_wait = Some(key);
                }
            }
        }
        if notes.is_empty() {
            return if meta != before {
                self.spool.save_meta(&meta)
            } else {
                Ok(())
            };
        }
        let key = key::load_or_create(&self.state_dir)?;
        for n in notes {
            let report = Report {
                v: n.outcome.format(),
                node: NodeId::of(&key.verifying_key()),
                site: self.site.clone(),
                seq: meta.next_seq,
                at: crate::state::now(),
                channel: fit(&meta.channel, 256),
                version: fit(&n.version, 128),
                generation: n.generation,
                outcome: n.outcome,
                seed: meta.seed,
                dropped: meta.dropped,
            };
            let bytes = report
                .sign(&key)
                .map_err(|e| crate::Error::Usage(format!("report {}: {e}", report.seq)))?;
            meta.next_seq += 1;
            // The number is reserved before the file exists: a cut leaves a gap, not a reuse.
            self.spool.save_meta(&meta)?;
            meta.dropped += self.spool.put(report.seq, &bytes)?;
        }
        self.spool.save_meta(&meta)
    }

    fn send(&self) -> ReportsSent {
        self.send_at(unix_now())
    }

    /// Send the spool at `now` (Unix seconds), then settle the refused reports in `spool.json`.
    fn send_at(&self, now: u64) -> ReportsSent {
        let aside = self.spool.meta().map(|m| m.refused).unwrap_or_default();
        let round = send::send(&self.spool, &self.url, &aside, now);
        let mut out = round.out.clone();
        let nothing_to_settle = round.refused.is_empty()
            && out.refused == 0
            && (aside.is_empty() || round.stored_max.is_none());
        if nothing_to_settle {
            out.set_aside = aside.len() as u64;
            return out;
        }
        match self.settle(&round, now) {
            Ok((dropped, set_aside)) => {
                out.refused += dropped;
                out.kept = out.kept.saturating_sub(dropped);
                out.set_aside = set_aside;
            }
            Err(e) => log::warn!("refused reports not counted: {}", crate::chain_line(&e)),
        }
        out
    }

    /// Record `round`'s refusals in `spool.json` ([`refusal`]: set aside, or dropped after the
    /// last try or once a newer report was stored) and count what was dropped. Returns how
    /// many refused reports were dropped and how many stay set aside.
    fn settle(&self, round: &send::Round, now: u64) -> Result<(u64, u64)> {
        let _lock = self.spool.lock()?;
        let mut meta = self.spool.meta()?;
        meta.dropped += round.out.refused;
        let mut gone = Vec::new();
        for (seq, status, reason) in &round.refused {
            match refusal::after_refusal(meta.refused.get(seq), *status, reason, now) {
                After::Kept(r) => {
                    meta.refused.insert(*seq, r);
                }
                After::Dropped(r) => gone.push((*seq, r, DropReason::Tries)),
            }
        }
        if let Some(max) = round.stored_max {
            let older: Vec<u64> = meta.refused.range(..max).map(|(s, _)| *s).collect();
            for seq in older {
                let r = meta.refused[&seq].clone();
                gone.push((seq, r, DropReason::Superseded));
            }
        }
        for (seq, r, why) in &gone {
            self.spool.remove(*seq)?;
            meta.refused.remove(seq);
            meta.dropped += 1;
            let count = meta.refused_dropped.as_ref().map_or(0, |d| d.count) + 1;
            meta.refused_dropped = Some(refusal::Dropped {
                count,
                last: r.clone(),
                why: *why,
            });
        }
        // A report no longer spooled (the oldest of a full spool, dropped) is not set aside.
        let spooled: Vec<u64> = self.spool.pending()?.iter().map(|p| p.0).collect();
        meta.refused.retain(|s, _| spooled.contains(s));
        self.spool.save_meta(&meta)?;
        Ok((gone.len() as u64, meta.refused.len() as u64))
    }

    /// `slot status` lines about refused reports (none when none was refused).
    fn status_lines(&self) -> Vec<String> {
        let Ok(meta) = self.spool.meta() else {
            return Vec::new();
        };
        let aside: Vec<&refusal::Refusal> = meta.refused.values().collect();
        refusal::status_lines(&aside, meta.refused_dropped.as_ref())
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Updater {
    fn reporter(&self) -> Option<Reporter> {
        Reporter::of(&self.cfg)
    }

    /// This node's id for the collector's allow-list: its report key's public half, the key
    /// made now when the node has none (`<state_dir>/node-key`).
    pub fn node_id(&self) -> Result<NodeId> {
        key::load_or_create(&self.cfg.state_dir).map(|k| NodeId::of(&k.verifying_key()))
    }

    /// Send the spooled reports to the configured `report_url`, oldest first, within a few
    /// seconds; None when the node reports nowhere. Never an error: what failed is in
    /// [`ReportsSent::stopped`] and the rest stays spooled for the next call.
    pub fn send_reports(&self) -> Option<ReportsSent> {
        let r = self.reporter()?;
        let out = r.send();
        if let Some(why) = &out.stopped {
            log::warn!("reports: {} sent, {} kept: {why}", out.sent, out.kept);
        }
        Some(out)
    }

    /// What became of the reports the collector refused, one line each for `slot status`:
    /// those set aside for a later try, and those dropped so far (none when the node reports
    /// nowhere or the collector refused none).
    pub fn report_refusals(&self) -> Vec<String> {
        self.reporter().map_or_else(Vec::new, |r| r.status_lines())
    }

    /// Reports spooled and not yet sent (0 when the node reports nowhere).
    pub fn spooled_reports(&self) -> usize {
        self.reporter()
            .and_then(|r| r.spool.pending().ok())
            .map_or(0, |p| p.len())
    }

    pub(crate) fn report_stage(&self, rel: &crate::Release, res: &Result<crate::StageReport>) {
        let Some(r) = self.reporter() else { return };
        let notes = outcome::of_stage(res, rel.version.as_deref(), rel.generation);
        r.spool(
            notes.into_iter().collect(),
            channel_of(rel),
            Wait::Unchanged,
        );
    }

    /// Spool what a resolution of `rel` reports: a withdrawn staged release it `dropped`, and
    /// its wait: for the release's wave or a pause, else, when `retry` holds back a release
    /// that failed here, for a retry (each once, see [`Wait`]).
    pub(crate) fn report_resolve(
        &self,
        rel: &crate::Release,
        dropped: bool,
        retry: &crate::rollout::Retry,
    ) {
        let Some(r) = self.reporter() else { return };
        let held = || outcome::of_retry(rel, retry);
        let note = match &rel.origin {
            crate::Origin::Channel {
                rollout: Some(n), ..
            } => n,
            _ => return r.spool(Vec::new(), channel_of(rel), Wait::Now(None, held())),
        };
        let notes = outcome::of_drop(note)
            .into_iter()
            .filter(|_| dropped)
            .collect();
        let seed = Some(note.seed.get());
        let wait = match note.nothing_newer {
            true => outcome::of_wait(note),
            false => outcome::of_wait(note).or_else(held),
        };
        r.spool(notes, channel_of(rel), Wait::Now(seed, wait));
    }

    pub(crate) fn report_notes(&self, notes: Vec<Note>) {
        if let Some(r) = self.reporter() {
            r.spool(notes, None, Wait::Unchanged);
        }
    }
}

/// `text` as a report field allows it: control characters dropped, cut at a character
/// boundary to at most `max` bytes (a field over its limit would make the report unsignable).
fn fit(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

fn channel_of(rel: &crate::Release) -> Option<&str> {
    match &rel.origin {
        crate::Origin::Channel { channel, .. } => Some(channel),
        _ => None,
    }
}

pub(crate) use outcome::of_verdict;

/// The spool directory of `state_dir` (for tests and tools).
pub fn spool_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(SPOOL_DIR)
}

#[cfg(test)]
mod tests;
