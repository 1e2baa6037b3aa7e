//! Sending the spool: oldest first, each report POSTed as it was signed, under a short
//! deadline. A report the collector refuses is set aside and the send goes on with the newer
//! ones; the send stops at the first answer that says the collector can take nothing now
//! ([`super::refusal`] states which answer is which).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::refusal::{self, due, Refusal, Verdict};
use super::spool::Spool;

/// One request's time limit.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole send's time limit: what is left waits for the next command.
pub const SEND_BUDGET: Duration = Duration::from_secs(10);
/// The body's media type.
pub const CONTENT_TYPE: &str = "application/vnd.k3os-ops.report.v1";

/// What one send did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReportsSent {
    /// Reports the collector accepted (or already held: a resend).
    pub sent: u64,
    /// Reports dropped as refused for good: rejected (malformed, or another report holds the
    /// number), refused a few times (`refusal::MAX_TRIES`), or refused and then outnumbered by a
    /// stored newer one; counted in the running total every report carries.
    pub refused: u64,
    /// Reports the collector refused this time and that are set aside for a later try.
    pub set_aside: u64,
    /// Reports still spooled for the next send.
    pub kept: u64,
    /// Why sending stopped early (the collector unreachable or busy).
    pub stopped: Option<String>,
}

/// One send's answers, for the spool's bookkeeping (`Reporter::send`).
#[derive(Debug, Default)]
pub(super) struct Round {
    /// What the send did (`refused` counts the rejected only, until the bookkeeping).
    pub out: ReportsSent,
    /// Reports refused this time: number, status, reason.
    pub refused: Vec<(u64, u16, String)>,
    /// The highest number the collector stored this time.
    pub stored_max: Option<u64>,
}

/// POST `body` as `content_type` within `timeout`: the status and, for a 4xx, the collector's
/// reason (one line, escaped); Err when no answer came. Reports and failure bundles go the
/// same way (a bundle, up to 64 KiB, gets a longer time than a report's 1 KiB).
pub(super) fn post(
    client: &reqwest::blocking::Client,
    url: &str,
    content_type: &str,
    timeout: Duration,
    body: Vec<u8>,
) -> Result<(u16, String), String> {
    let r = client
        .post(url)
        .timeout(timeout)
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .body(body)
        .send()
        .map_err(|e| format!("POST {url}: {}", crate::chain_line(&e)))?;
    let status = r.status().as_u16();
    let text = match status {
        400..=499 => r.text().unwrap_or_default(),
        _ => String::new(),
    };
    Ok((status, refusal::reason_of(&text)))
}

/// Send what `spool` holds to `url` at `now` (Unix seconds): reports set aside in `aside`
/// are sent only once due. Every failure is in the result, never an error.
pub(super) fn send(spool: &Spool, url: &str, aside: &BTreeMap<u64, Refusal>, now: u64) -> Round {
    let mut round = Round::default();
    let pending = match spool.pending() {
        Ok(p) => p,
        Err(e) => {
            round.out.stopped = Some(crate::chain_line(&e));
            return round;
        }
    };
    round.out.kept = pending.len() as u64;
    let todo: Vec<_> = pending
        .into_iter()
        .filter(|(seq, _, _)| aside.get(seq).is_none_or(|r| due(r, now)))
        .collect();
    if todo.is_empty() {
        return round;
    }
    let client = match crate::http::client() {
        Ok(c) => c,
        Err(e) => {
            round.out.stopped = Some(format!("no HTTP client: {e}"));
            return round;
        }
    };
    let start = Instant::now();
    for (seq, path, _) in todo {
        if start.elapsed() > SEND_BUDGET {
            round.out.stopped = Some(format!("{} s spent; the rest waits", SEND_BUDGET.as_secs()));
            break;
        }
        let Ok(body) = std::fs::read(&path) else {
            continue; // another sender took it
        };
        let (status, reason) = match post(&client, url, CONTENT_TYPE, REQUEST_TIMEOUT, body) {
            Ok(s) => s,
            Err(e) => {
                round.out.stopped = Some(e);
                break;
            }
        };
        match refusal::verdict(status) {
            Verdict::Retry => {
                round.out.stopped = Some(format!("{url} answered HTTP {status} to report {seq}"));
                break;
            }
            Verdict::Refused => {
                log::warn!(
                    "{url} refused report {seq} ({}: {reason}): set aside, newer reports go on",
                    refusal::status_text(status)
                );
                round.refused.push((seq, status, reason));
            }
            v => {
                if let Err(e) = spool.remove(seq) {
                    round.out.stopped = Some(crate::chain_line(&e));
                    break;
                }
                round.out.kept -= 1;
                if v == Verdict::Done {
                    round.out.sent += 1;
                    round.stored_max = round.stored_max.max(Some(seq));
                } else {
                    log::warn!("{url} refused report {seq} for good (HTTP {status}): dropped");
                    round.out.refused += 1;
                }
            }
        }
    }
    round
}
