//! Sending the spool: oldest first, each report POSTed as it was signed, under a short
//! deadline, stopping at the first report the collector cannot take now.

use std::time::{Duration, Instant};

use serde::Serialize;

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
    /// Reports the collector refused for good (malformed, or another report holds the
    /// number): dropped from the spool and counted in the running total every report carries.
    pub refused: u64,
    /// Reports still spooled for the next send.
    pub kept: u64,
    /// Why sending stopped early (the collector unreachable, busy, or refusing this node).
    pub stopped: Option<String>,
}

/// What to do with a report after the collector's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted or already held: forget it.
    Done,
    /// Refused for good: forget it and count it.
    Refused,
    /// Not now (unreachable, busy, not enrolled yet): keep it and stop.
    Retry,
}

/// Pure: the collector's HTTP status → what to do with the report.
pub fn verdict(status: u16) -> Verdict {
    match status {
        200..=299 => Verdict::Done,
        // Bad bytes, too large, or a replayed number: sending again cannot help.
        400 | 409 | 413 | 422 => Verdict::Refused,
        // 403 (not enrolled yet), 429 (rate limit), 5xx, others: later.
        _ => Verdict::Retry,
    }
}

fn post(client: &reqwest::blocking::Client, url: &str, body: Vec<u8>) -> Result<u16, String> {
    client
        .post(url)
        .timeout(REQUEST_TIMEOUT)
        .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
        .body(body)
        .send()
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("POST {url}: {}", crate::chain_line(&e)))
}

/// Send what `spool` holds to `url`; every failure is in the result, never an error.
pub fn send(spool: &Spool, url: &str) -> ReportsSent {
    let mut out = ReportsSent::default();
    let pending = match spool.pending() {
        Ok(p) => p,
        Err(e) => {
            out.stopped = Some(crate::chain_line(&e));
            return out;
        }
    };
    out.kept = pending.len() as u64;
    if pending.is_empty() {
        return out;
    }
    let client = match crate::http::client() {
        Ok(c) => c,
        Err(e) => {
            out.stopped = Some(format!("no HTTP client: {e}"));
            return out;
        }
    };
    let start = Instant::now();
    for (seq, path, _) in pending {
        if start.elapsed() > SEND_BUDGET {
            out.stopped = Some(format!("{} s spent; the rest waits", SEND_BUDGET.as_secs()));
            break;
        }
        let Ok(body) = std::fs::read(&path) else {
            continue; // another sender took it
        };
        let status = match post(&client, url, body) {
            Ok(s) => s,
            Err(e) => {
                out.stopped = Some(e);
                break;
            }
        };
        match verdict(status) {
            Verdict::Retry => {
                out.stopped = Some(format!("{url} answered HTTP {status} to report {seq}"));
                break;
            }
            v => {
                if let Err(e) = spool.remove(seq) {
                    out.stopped = Some(crate::chain_line(&e));
                    break;
                }
                out.kept -= 1;
                if v == Verdict::Done {
                    out.sent += 1;
                } else {
                    log::warn!("{url} refused report {seq} for good (HTTP {status}): dropped");
                    out.refused += 1;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_what_a_resend_could_change() {
        assert_eq!(verdict(200), Verdict::Done);
        assert_eq!(verdict(201), Verdict::Done);
        for s in [400, 409, 413, 422] {
            assert_eq!(verdict(s), Verdict::Refused, "{s}");
        }
        for s in [403, 404, 429, 500, 503] {
            assert_eq!(verdict(s), Verdict::Retry, "{s}");
        }
    }
}
