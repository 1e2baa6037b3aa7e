//! Sending kept failure bundles from the good slot: after the reports, only while the caller
//! allows it ([`Allowance`]: inside a stage window, within what is left of the byte budget),
//! oldest first, each POSTed as it was sealed to the collector's `/v1/bundles`. The
//! collector's answers are read as for reports (`refusal::verdict`): stored or already held
//! (2xx) is sent; 400, 409 and 413 are refused for good; 401, 403 and other 4xx set the bundle
//! aside for a later try with the reports' backoff, then refused; 408, 429, 507, 5xx and no
//! answer stop the send, and everything waits for the next command.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::store::{Delivery, Entry, Store};
use crate::report::refusal::{self, After, Refusal, Verdict};
use crate::report::send::post;

/// One request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole send's time limit: what is left waits for the next command.
const SEND_BUDGET: Duration = Duration::from_secs(20);
/// The body's media type.
pub const BUNDLE_CONTENT_TYPE: &str = "application/vnd.k3os-ops.bundle.v1";

/// When and how much the caller lets bundles be sent now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    /// A stage window is open now (true where the node has no windows).
    pub open: bool,
    /// Bytes left of the byte budget (None: no budget).
    pub max_bytes: Option<u64>,
}

impl Allowance {
    /// Any time, any size: a node with no windows and no budget.
    pub const ANY: Allowance = Allowance {
        open: true,
        max_bytes: None,
    };
}

/// What one send of failure bundles did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BundlesSent {
    /// Bundles the collector stored or already held.
    pub sent: u64,
    /// Bytes of bundles sent this time, answered or not (what counts against a byte budget).
    pub bytes: u64,
    /// Bundles refused this time (set aside or for good).
    pub refused: u64,
    /// Bundles still waiting (not sent yet, or set aside).
    pub waiting: u64,
    /// Why the send stopped or did not start (a window closed, the budget, the collector).
    pub stopped: Option<String>,
}

/// The bundles to send at `now` within `allow`, oldest first: those waiting, and those set
/// aside whose time has come; as many as fit the byte budget in that order (a bundle that does
/// not fit ends the list, so the oldest is never passed over for ever).
pub fn plan(entries: &[Entry], allow: Allowance, now: u64) -> Vec<&Entry> {
    if !allow.open {
        return Vec::new();
    }
    let mut left = allow.max_bytes;
    let mut out = Vec::new();
    for e in entries {
        let due = match &e.delivery {
            Delivery::Waiting => true,
            Delivery::SetAside { next_at, .. } => now >= *next_at,
            Delivery::Sent { .. } | Delivery::Refused { .. } => false,
        };
        if !due {
            continue;
        }
        if let Some(l) = &mut left {
            if e.bytes > *l {
                break;
            }
            *l -= e.bytes;
        }
        out.push(e);
    }
    out
}

/// What becomes of a bundle delivered as `before` after the collector answered `status` with
/// `reason` at `now` (None: try again later, the send stops).
pub fn after(before: &Delivery, status: u16, reason: &str, now: u64) -> Option<Delivery> {
    match refusal::verdict(status) {
        Verdict::Done => Some(Delivery::Sent { at: now, status }),
        Verdict::Rejected => Some(Delivery::Refused {
            status,
            reason: reason.to_string(),
        }),
        Verdict::Refused => {
            let prev = match before {
                Delivery::SetAside {
                    status,
                    reason,
                    tries,
                    next_at,
                } => Some(Refusal {
                    status: *status,
                    reason: reason.clone(),
                    tries: *tries,
                    next_at: *next_at,
                }),
                _ => None,
            };
            Some(
                match refusal::after_refusal(prev.as_ref(), status, reason, now) {
                    After::Kept(r) => Delivery::SetAside {
                        status: r.status,
                        reason: r.reason,
                        tries: r.tries,
                        next_at: r.next_at,
                    },
                    After::Dropped(r) => Delivery::Refused {
                        status: r.status,
                        reason: r.reason,
                    },
                },
            )
        }
        Verdict::Retry => None,
    }
}

/// The bundles URL of a node's `report_url`: its last path segment replaced by `bundles`
/// (`…/v1/reports` → `…/v1/bundles`).
pub fn bundles_url(report_url: &str) -> String {
    let base = report_url.split(['?', '#']).next().unwrap_or_default();
    let base = base.trim_end_matches('/');
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    match base[scheme_end..].rfind('/') {
        Some(i) => format!("{}/bundles", &base[..scheme_end + i]),
        None => format!("{base}/bundles"),
    }
}

/// Send `store`'s due bundles to `url` within `allow` at `now`, and record what became of
/// each. Never an error: what failed is in [`BundlesSent::stopped`].
pub fn send(store: &Store, url: &str, allow: Allowance, now: u64) -> BundlesSent {
    let mut out = BundlesSent::default();
    let entries = match store.list() {
        Ok(e) => e,
        Err(e) => {
            out.stopped = Some(crate::chain_line(&e));
            return out;
        }
    };
    let waiting = |e: &Entry| matches!(e.delivery, Delivery::Waiting | Delivery::SetAside { .. });
    out.waiting = entries.iter().filter(|e| waiting(e)).count() as u64;
    let todo = plan(&entries, allow, now);
    if out.waiting > 0 && todo.is_empty() {
        out.stopped = Some(match allow.open {
            false => "outside the stage windows".into(),
            true => "not due yet, or over what is left of the byte budget".into(),
        });
    }
    if todo.is_empty() {
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
    let mut changes = Vec::new();
    for e in todo {
        if start.elapsed() > SEND_BUDGET {
            out.stopped = Some(format!("{} s spent; the rest waits", SEND_BUDGET.as_secs()));
            break;
        }
        let Ok(body) = std::fs::read(store.path(&e.file)) else {
            continue; // dropped meanwhile
        };
        out.bytes += body.len() as u64;
        let (status, reason) = match post(&client, url, BUNDLE_CONTENT_TYPE, REQUEST_TIMEOUT, body)
        {
            Ok(s) => s,
            Err(why) => {
                out.stopped = Some(why);
                break;
            }
        };
        let Some(d) = after(&e.delivery, status, &reason, now) else {
            out.stopped = Some(format!("{url} answered HTTP {status} to bundle {}", e.file));
            break;
        };
        match &d {
            Delivery::Sent { .. } => {
                out.sent += 1;
                out.waiting -= 1;
            }
            Delivery::Refused { .. } => {
                log::warn!(
                    "{url} refused failure bundle {} for good (HTTP {status}: {reason})",
                    e.file
                );
                out.refused += 1;
                out.waiting -= 1;
            }
            _ => {
                log::warn!(
                    "{url} refused failure bundle {} (HTTP {status}: {reason}): set aside",
                    e.file
                );
                out.refused += 1;
            }
        }
        changes.push((e.file.clone(), d));
    }
    if let Err(e) = store.record(&changes) {
        log::warn!(
            "failure bundles: what was sent is not recorded: {}",
            crate::chain_line(&e)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_report::Failure;

    fn entry(file: &str, bytes: u64, delivery: Delivery) -> Entry {
        Entry {
            file: file.into(),
            version: "v2".into(),
            generation: 6,
            attempt: 1,
            failure: Failure::HealthCheck,
            at: 0,
            bytes,
            delivery,
        }
    }

    #[test]
    fn only_due_bundles_within_the_window_and_the_budget_are_sent_oldest_first() {
        let aside = |next_at| Delivery::SetAside {
            status: 403,
            reason: "not enrolled".into(),
            tries: 1,
            next_at,
        };
        let e = vec![
            entry("sent", 10, Delivery::Sent { at: 1, status: 201 }),
            entry("old", 100, Delivery::Waiting),
            entry("aside-later", 10, aside(500)),
            entry("aside-due", 10, aside(50)),
            entry("new", 100, Delivery::Waiting),
        ];
        let names = |allow| -> Vec<String> {
            plan(&e, allow, 100)
                .iter()
                .map(|e| e.file.clone())
                .collect()
        };
        assert_eq!(names(Allowance::ANY), ["old", "aside-due", "new"]);
        let closed = Allowance {
            open: false,
            max_bytes: None,
        };
        assert!(names(closed).is_empty(), "nothing outside the windows");
        let budget = |b| Allowance {
            open: true,
            max_bytes: Some(b),
        };
        assert_eq!(names(budget(115)), ["old", "aside-due"]);
        assert!(
            names(budget(99)).is_empty(),
            "the oldest is not passed over"
        );
    }

    #[test]
    fn the_collectors_answers_are_read_as_for_reports() {
        let w = Delivery::Waiting;
        assert_eq!(
            after(&w, 201, "", 9),
            Some(Delivery::Sent { at: 9, status: 201 })
        );
        assert_eq!(
            after(&w, 200, "", 9),
            Some(Delivery::Sent { at: 9, status: 200 })
        );
        for s in [400, 409, 413] {
            assert!(
                matches!(after(&w, s, "no", 9), Some(Delivery::Refused { status, .. }) if status == s)
            );
        }
        for s in [429, 507, 500, 503, 408] {
            assert_eq!(after(&w, s, "", 9), None, "{s}: later");
        }
        // 403: set aside with the reports' backoff, then refused for good after the last try.
        let mut d = w;
        for _ in 1..refusal::MAX_TRIES {
            d = after(&d, 403, "site", 9).unwrap();
            assert!(
                matches!(d, Delivery::SetAside { next_at, .. } if next_at > 9),
                "{d:?}"
            );
        }
        assert!(matches!(
            after(&d, 403, "site", 9),
            Some(Delivery::Refused { status: 403, .. })
        ));
    }

    #[test]
    fn the_bundles_url_replaces_the_reports_last_segment() {
        assert_eq!(
            bundles_url("http://c:8080/v1/reports"),
            "http://c:8080/v1/bundles"
        );
        assert_eq!(
            bundles_url("https://c/x/v1/reports/"),
            "https://c/x/v1/bundles"
        );
        assert_eq!(bundles_url("http://c"), "http://c/bundles");
    }
}
