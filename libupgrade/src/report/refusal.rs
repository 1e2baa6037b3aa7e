//! What a node does with a report the collector refused, and what `slot status` says of it.
//! Pure: the send loop (`send`) and the spool's bookkeeping (`spool::Meta`) apply it.
//!
//! The collector's answers fall into four kinds ([`verdict`]):
//! - **stored** (2xx): the report is forgotten;
//! - **rejected** (400, 409, 413, 422): the bytes can never be stored (malformed, too large,
//!   a number at or below one already stored): dropped at once and counted;
//! - **refused** (every other 4xx but 408 and 429: 401, 403 — not enrolled, or enrolled for
//!   another site —, 404, …): the collector will not take *this* report now, perhaps later
//!   (the publisher enrols the node). The report is set aside with its status and the
//!   collector's reason, tried again at most [`MAX_TRIES`] times in all, [`RETRY_BASE_SECS`]
//!   after the first refusal and twice as long after each next one, then dropped and counted.
//!   Newer reports are sent meanwhile, never held behind it; and once a newer report is
//!   stored, the set-aside one is dropped and counted at once (the collector takes no number
//!   at or below one it stored);
//! - **later** (408, 429, 5xx, no answer): the collector cannot take anything now: the send
//!   stops, everything stays spooled for the next command.

use serde::{Deserialize, Serialize};

/// Tries in all (the first included) before a refused report is dropped.
pub const MAX_TRIES: u32 = 3;
/// Wait after the first refusal before the next try (doubled after each next refusal).
pub const RETRY_BASE_SECS: u64 = 3600;

/// What to do with a report after the collector's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Stored or already held: forget it.
    Done,
    /// Can never be stored: forget it and count it.
    Rejected,
    /// Refused now: set it aside, try again later (at most [`MAX_TRIES`] in all).
    Refused,
    /// Not now (busy, timing out, unreachable): keep everything and stop.
    Retry,
}

/// The collector's HTTP status → what to do with the report (module docs).
pub fn verdict(status: u16) -> Verdict {
    match status {
        200..=299 => Verdict::Done,
        400 | 409 | 413 | 422 => Verdict::Rejected,
        408 | 429 => Verdict::Retry,
        401..=499 => Verdict::Refused,
        _ => Verdict::Retry,
    }
}

/// A report the collector refused, as the spool keeps it (`spool.json`, by report number).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The last refusal's HTTP status.
    pub status: u16,
    /// The collector's reason (its answer's first line, control characters escaped, cut at
    /// 160 bytes).
    pub reason: String,
    /// Tries so far, each refused.
    pub tries: u32,
    /// Not tried again before this time (Unix seconds).
    pub next_at: u64,
}

/// What became of a refused report after a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    /// Kept aside for a later try.
    Kept(Refusal),
    /// Tried [`MAX_TRIES`] times: dropped.
    Dropped(Refusal),
}

/// The record after a refusal with `status` and `reason` at `now`, `before` the earlier one.
pub fn after_refusal(before: Option<&Refusal>, status: u16, reason: &str, now: u64) -> After {
    let tries = before.map_or(0, |r| r.tries).saturating_add(1);
    let wait = RETRY_BASE_SECS.saturating_mul(1 << (tries - 1).min(16));
    let r = Refusal {
        status,
        reason: reason.to_string(),
        tries,
        next_at: now.saturating_add(wait),
    };
    match tries >= MAX_TRIES {
        true => After::Dropped(r),
        false => After::Kept(r),
    }
}

/// Whether a report set aside as `r` is tried again at `now`.
pub fn due(r: &Refusal, now: u64) -> bool {
    now >= r.next_at
}

/// Why refused reports were dropped, for `slot status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Refused [`MAX_TRIES`] times.
    Tries,
    /// A newer report was stored: the collector takes no older number.
    Superseded,
}

/// The refused reports dropped so far, and the last one (`spool.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// How many, in all.
    pub count: u64,
    /// The last one's refusal.
    pub last: Refusal,
    /// Why the last one was dropped.
    pub why: DropReason,
}

/// `403 Forbidden` (the reason phrase of `status` when it has one).
pub fn status_text(status: u16) -> String {
    match reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
    {
        Some(phrase) => format!("{status} {phrase}"),
        None => status.to_string(),
    }
}

/// The collector's answer body as a reason: its first line, control characters escaped, at
/// most 160 bytes.
pub fn reason_of(body: &str) -> String {
    let line = body.lines().next().unwrap_or("").trim();
    let mut out = String::new();
    for c in line.chars() {
        // Control characters escaped (a terminal must not act on them), the rest as sent.
        let esc: String = match c.is_control() {
            true => c.escape_debug().collect(),
            false => c.to_string(),
        };
        if out.len() + esc.len() > 160 {
            out.push('…');
            break;
        }
        out.push_str(&esc);
    }
    out
}

fn tries(n: u32) -> String {
    match n {
        1 => "1 try".into(),
        n => format!("{n} tries"),
    }
}

/// `403 Forbidden: REASON` (without the reason when the collector gave none).
fn answer(r: &Refusal) -> String {
    match r.reason.is_empty() {
        true => status_text(r.status),
        false => format!("{}: {}", status_text(r.status), r.reason),
    }
}

/// `slot status` lines: the reports set aside now, and those dropped so far.
pub fn status_lines(aside: &[&Refusal], dropped: Option<&Dropped>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(r) = aside.iter().max_by_key(|r| r.next_at) {
        let next = chrono::DateTime::from_timestamp(r.next_at as i64, 0).map_or_else(
            || r.next_at.to_string(),
            |t| crate::trust::meta::time_str(&t),
        );
        out.push(format!(
            "reports: {} refused by the collector ({}), set aside after {} of {MAX_TRIES}, next not before {next}; newer reports are sent meanwhile",
            aside.len(),
            answer(r),
            tries(r.tries)
        ));
    }
    if let Some(d) = dropped {
        let why = match d.why {
            DropReason::Tries => format!("dropped after {}", tries(d.last.tries)),
            DropReason::Superseded => format!(
                "dropped after {}: a newer report was stored, and the collector takes no older number",
                tries(d.last.tries)
            ),
        };
        out.push(format!(
            "reports: {} refused by the collector ({}), {why}",
            d.count,
            answer(&d.last)
        ));
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
            assert_eq!(verdict(s), Verdict::Rejected, "{s}");
        }
        for s in [401, 403, 404, 410, 451] {
            assert_eq!(verdict(s), Verdict::Refused, "{s}");
        }
        for s in [408, 429, 500, 503, 507, 302] {
            assert_eq!(verdict(s), Verdict::Retry, "{s}");
        }
    }

    #[test]
    fn a_refused_report_waits_longer_each_time_and_is_dropped_at_the_third_refusal() {
        let first = match after_refusal(None, 403, "x", 1000) {
            After::Kept(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!((first.tries, first.next_at), (1, 1000 + RETRY_BASE_SECS));
        assert!(!due(&first, 1000 + RETRY_BASE_SECS - 1));
        assert!(due(&first, 1000 + RETRY_BASE_SECS));
        let second = match after_refusal(Some(&first), 403, "x", 5000) {
            After::Kept(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (second.tries, second.next_at),
            (2, 5000 + 2 * RETRY_BASE_SECS)
        );
        match after_refusal(Some(&second), 404, "gone", 9000) {
            After::Dropped(r) => assert_eq!((r.tries, r.status), (3, 404)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reasons_are_one_escaped_line_and_statuses_read_as_words() {
        assert_eq!(
            reason_of("node abc\u{1b}[31m\nsecond"),
            "node abc\\u{1b}[31m"
        );
        assert!(reason_of(&"x".repeat(500)).len() <= 164);
        assert_eq!(status_text(403), "403 Forbidden");
        assert_eq!(status_text(499), "499");
    }

    #[test]
    fn status_lines_say_what_is_set_aside_and_what_was_dropped() {
        let r = Refusal {
            status: 403,
            reason: "site x".into(),
            tries: 3,
            next_at: 0,
        };
        let d = Dropped {
            count: 1,
            last: r.clone(),
            why: DropReason::Tries,
        };
        assert_eq!(
            status_lines(&[], Some(&d)),
            ["reports: 1 refused by the collector (403 Forbidden: site x), dropped after 3 tries"]
        );
        let aside = Refusal { tries: 1, ..r };
        let l = status_lines(&[&aside], None);
        assert!(l[0].starts_with("reports: 1 refused by the collector (403 Forbidden: site x), set aside after 1 try of 3"), "{l:?}");
    }
}
