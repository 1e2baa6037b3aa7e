//! The read-only dashboard (`GET /` on the collector's dashboard listener): per release, the
//! reported outcomes over time against the planned schedule (an inline SVG chart with time and
//! share axes, a legend, the halts and pauses marked: module `chart`), counts per wave, and the
//! failing sites with their reasons, each beside its failure bundle (readable and downloadable:
//! module `bundle`) and the line the failures share ([`crate::cause`]); times as UTC dates
//! ([`crate::time`]). Rendered on the server from the database (no script, no external
//! asset); the HTML is built with `format!`, and every stored or channel text goes through
//! `esc`.

use std::fmt::Write;

use crate::cause::{self, ReleaseFailures};
use crate::fleet::{self, FleetStatus, ReleaseStatus};
use crate::history::NodeState;
use crate::store::Row;
use crate::time;

mod bundle;
mod chart;

pub use bundle::path as bundle_path;
pub use chart::Mark;

/// What the page shows from the database.
#[derive(Debug, Clone, Copy)]
pub struct Stored<'a> {
    /// Every stored report.
    pub rows: &'a [Row],
    /// Everything the guard did.
    pub actions: &'a [crate::GuardAction],
    /// Every stored failure bundle, opened.
    pub bundles: &'a [fleet_report::Bundle],
}

/// What the dashboard knows of the channel's rollouts (k3os-ops reads them from the channel's
/// signed targets; without one, waves and the planned line are not shown).
pub trait Schedule: Send + Sync {
    /// The wave (from 1) of `version`'s rollout that admits `seed`.
    fn wave_of(&self, version: &str, seed: Option<u32>) -> Option<usize>;
    /// The share of the fleet (0.0–1.0) `version` is offered at Unix time `at`; None when
    /// unknown.
    fn planned_share(&self, version: &str, at: u64) -> Option<f64>;
    /// The rollout's halt, pause or withdrawal now and the command that lifts it (None:
    /// rolling out, or unknown).
    fn hold(&self, _version: &str) -> Option<String> {
        None
    }
    /// The publisher's pause or withdrawal of `version`'s rollout, to mark on its chart (the
    /// guard's halts and lifts come from the database).
    fn marks(&self, _version: &str) -> Vec<Mark> {
        Vec::new()
    }
}

/// No schedule known.
pub struct NoSchedule;

impl Schedule for NoSchedule {
    fn wave_of(&self, _: &str, _: Option<u32>) -> Option<usize> {
        None
    }
    fn planned_share(&self, _: &str, _: u64) -> Option<f64> {
        None
    }
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The release's chart: its reports replayed, the planned share, the guard's halts and lifts
/// of it and the schedule's pause or withdrawal marked.
fn release_chart(
    rel: &ReleaseStatus,
    rows: &[&Row],
    actions: &[crate::GuardAction],
    enrolled: u64,
    s: &dyn Schedule,
    now: u64,
) -> String {
    let mut marks: Vec<Mark> = actions
        .iter()
        .filter(|a| a.version == rel.version)
        .filter_map(|a| match a.action.as_str() {
            "halt" => Some(Mark {
                at: a.at,
                kind: "halt",
                label: "halted by the guard".into(),
            }),
            "lifted" => Some(Mark {
                at: a.at,
                kind: "lifted",
                label: "halt lifted".into(),
            }),
            _ => None,
        })
        .collect();
    marks.extend(s.marks(&rel.version));
    marks.sort_by_key(|m| m.at);
    chart::chart(
        &rel.version,
        &chart::series(rows),
        &|t| s.planned_share(&rel.version, t),
        enrolled,
        &marks,
        now,
    )
}

fn wave_table(rel: &ReleaseStatus) -> String {
    let states = [
        NodeState::Waiting,
        NodeState::Staged,
        NodeState::TrialBoot,
        NodeState::Blessed,
        NodeState::StageFailed,
        NodeState::RolledBack,
        NodeState::FellBack,
        NodeState::WithdrawnDropped,
    ];
    let head: String = states
        .iter()
        .map(|s| format!("<th>{}</th>", s.label()))
        .collect();
    let mut t = format!(
        "<table class=\"waves\"><tr><th>wave</th><th>nodes</th><th>offered</th>{head}<th>failed, waiting</th></tr>"
    );
    for w in &rel.waves {
        let name = w.wave.map_or("?".to_string(), |n| n.to_string());
        let cells: String = states
            .iter()
            .map(|s| format!("<td>{}</td>", w.states.get(s).copied().unwrap_or(0)))
            .collect();
        let _ = write!(
            t,
            "<tr data-wave=\"{name}\"><td>{name}</td><td>{}</td><td>{}</td>{cells}<td>{}</td></tr>",
            w.nodes,
            w.offered,
            w.failed_waiting.values().sum::<u64>()
        );
    }
    t.push_str("</table>");
    t
}

/// Most bundles a release's failing table shows inline (their sections readable); the rest
/// show what they are and their downloads, so a page stays a few MiB however many fail.
pub const MAX_INLINE_BUNDLES: usize = 50;

fn failing(f: Option<&ReleaseFailures>) -> String {
    let Some(f) = f else {
        return "<p class=\"failing\">No failing site.</p>".into();
    };
    let mut t = f.common.as_ref().map_or(String::new(), |c| {
        format!(
            "<p class=\"common\">Common cause: {}</p>",
            esc(&c.to_string())
        )
    });
    t.push_str(
        "<table class=\"failing\"><tr><th>site</th><th>node</th><th>outcome</th><th>why</th><th>failed at (UTC)</th><th>failure bundle</th></tr>",
    );
    for (i, n) in f.failed.iter().enumerate() {
        let bundle = match &n.bundle {
            None => "none received".to_string(),
            Some(b) if i < MAX_INLINE_BUNDLES => bundle::cell(b),
            Some(b) => bundle::brief(b),
        };
        let _ = write!(
            t,
            "<tr data-node=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&n.node),
            esc(&n.site),
            esc(&n.node[..16.min(n.node.len())]),
            esc(&n.label),
            esc(&n.why),
            time::utc(n.received),
            bundle
        );
    }
    t.push_str("</table>");
    t
}

/// What the guard did (`collector guard`), newest first, at most 50 rows: its halts, the lifts
/// it saw, and its last re-signing run.
fn guard_table(actions: &[crate::GuardAction]) -> String {
    if actions.is_empty() {
        return "<p id=\"guard\">The guard has not run.</p>".into();
    }
    let mut t = String::from(
        "<table id=\"guard\"><tr><th>at (UTC)</th><th>action</th><th>release</th><th>detail</th><th>halt.json version</th></tr>",
    );
    let last_refresh = actions.iter().rposition(|a| a.action == "refresh");
    let shown = actions
        .iter()
        .enumerate()
        .rev()
        .filter(|(i, a)| a.action != "refresh" || Some(*i) == last_refresh)
        .take(50);
    for (_, a) in shown {
        let _ = write!(
            t,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&a.action),
            time::utc(a.at),
            esc(&a.action),
            esc(&a.version),
            esc(&a.detail),
            a.halt_version
        );
    }
    t.push_str("</table>");
    t
}

const STYLE: &str = "body{font-family:sans-serif;margin:16px 24px;color:#222}\
table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;white-space:nowrap}\
th{font-weight:600;background:#f4f4f4}table.waves th{white-space:normal}\
table.failing td:nth-child(4),table.failing td:nth-child(6),#guard td:nth-child(4){white-space:normal}\
details.bundle pre{white-space:pre-wrap;max-width:70em;max-height:24em;overflow:auto;background:#f8f8f8;margin:2px 0}\
details.bundle h4{margin:6px 0 0;font-size:13px}p.common{font-weight:bold}\
figure.rollout{margin:8px 0}ul.legend{list-style:none;padding:0;margin:4px 0 0 64px;font-size:13px}\
ul.legend li{margin:2px 0}.swatch{display:inline-block;width:18px;height:4px;margin-right:6px;vertical-align:middle}\
li.offered .swatch{height:6px;opacity:.35}p.hold{color:#b30000;font-weight:bold}";

/// The page for what is `stored` at Unix time `now`; `enrolled` nodes make the planned line's
/// 100 %.
pub fn render(stored: &Stored, enrolled: u64, s: &dyn Schedule, now: u64) -> String {
    let Stored {
        rows,
        actions,
        bundles,
    } = *stored;
    let failures = cause::failures(rows, bundles, None);
    let f: FleetStatus = fleet::summarize(
        rows,
        &|v, seed| s.wave_of(v, seed),
        now.saturating_sub(86_400),
    );
    let mut page = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Fleet status</title>\
         <style>{STYLE}</style></head>\
         <body><h1>Fleet status</h1><p id=\"summary\">{} node(s) at {} site(s) of {enrolled} enrolled, {} report(s), {} dropped unsent; as of <time>{}</time></p>",
        f.nodes,
        f.sites,
        f.reports,
        f.dropped,
        time::utc(now)
    );
    for rel in &f.releases {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.version == rel.version && r.generation == rel.generation)
            .collect();
        let hold = s
            .hold(&rel.version)
            .map(|h| format!("<p class=\"hold\">{}</p>", esc(&h)))
            .unwrap_or_default();
        let _ = write!(
            page,
            "<section class=\"release\" data-version=\"{v}\"><h2>{v} (generation {g})</h2><p class=\"last\">last report <time>{}</time>, {} silent</p>{hold}{}<h3>Per wave</h3>{}<h3>Failing sites</h3>{}</section>",
            time::utc(rel.last_report),
            rel.silent,
            release_chart(rel, &mine, actions, enrolled, s, now),
            wave_table(rel),
            failing(
                failures
                    .iter()
                    .find(|x| x.version == rel.version && x.generation == rel.generation)
            ),
            v = esc(&rel.version),
            g = rel.generation
        );
    }
    let _ = write!(page, "<h2>Automatic halt</h2>{}", guard_table(actions));
    page.push_str("<p>Pause: <code>k3os-ops release pause CHANNEL VERSION …keys…</code>; lift a pause or the guard's halt with <code>k3os-ops release resume CHANNEL VERSION …keys…</code>.</p></body></html>\n");
    page
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_report::Outcome;

    fn stored<'a>(rows: &'a [Row], actions: &'a [crate::GuardAction]) -> Stored<'a> {
        Stored {
            rows,
            actions,
            bundles: &[],
        }
    }

    fn row(node: &str, seq: u64, outcome: Outcome) -> Row {
        Row {
            node: format!("{node:0>64}"),
            site: format!("site-{node}"),
            seq,
            at: seq,
            received: 1000 + seq,
            channel: "c".into(),
            version: "v<2>".into(),
            generation: 2,
            outcome,
            seed: None,
            dropped: 0,
        }
    }

    #[test]
    fn the_page_holds_the_counts_the_failures_escaped_and_a_chart() {
        let rows = vec![
            row("a", 1, Outcome::Blessed),
            row(
                "b",
                1,
                Outcome::RolledBack {
                    why: "<script>alert(1)</script>".into(),
                },
            ),
        ];
        let halt = crate::GuardAction {
            at: 1990,
            channel: "c".into(),
            version: "v<2>".into(),
            action: "halt".into(),
            detail: "1 of 2 <b>failed</b>".into(),
            halt_version: 4,
        };
        let refresh = |at| crate::GuardAction {
            at,
            version: String::new(),
            action: "refresh".into(),
            detail: "1 halt(s) listed".into(),
            ..halt.clone()
        };
        let actions = [refresh(1980), halt.clone(), refresh(1995), refresh(1999)];
        let page = render(&stored(&rows, &actions), 10, &NoSchedule, 2000);
        assert!(
            page.contains("<tr class=\"halt\"><td>1970-01-01T00:33:10Z</td><td>halt</td><td>v&lt;2&gt;</td><td>1 of 2 &lt;b&gt;failed&lt;/b&gt;</td><td>4</td></tr>"),
            "{page}"
        );
        // Only the last re-signing run is shown.
        assert_eq!(page.matches("<tr class=\"refresh\">").count(), 1, "{page}");
        assert!(
            page.contains("<td>1970-01-01T00:33:19Z</td><td>refresh</td>"),
            "{page}"
        );
        assert!(
            render(&stored(&rows, &[]), 10, &NoSchedule, 2000).contains("The guard has not run.")
        );
        assert!(
            page.contains("2 node(s) at 2 site(s) of 10 enrolled"),
            "{page}"
        );
        assert!(page.contains("v&lt;2&gt; (generation 2)"), "{page}");
        assert!(!page.contains("<script>"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(
            page.contains("<polyline class=\"blessed\" data-last=\"1\""),
            "{page}"
        );
        assert!(
            page.contains("<polyline class=\"failed\" data-last=\"1\""),
            "{page}"
        );
    }

    #[test]
    fn past_the_inline_limit_a_bundle_shows_its_downloads_only() {
        let n = MAX_INLINE_BUNDLES as u8 + 1;
        let rows: Vec<Row> = (1..=n)
            .map(|i| Row {
                node: crate::testutil::id(i).to_string(),
                version: "v2".into(),
                ..row("x", 1, Outcome::RolledBack { why: "boom".into() })
            })
            .collect();
        let bundles: Vec<fleet_report::Bundle> = (1..=n)
            .map(|i| crate::testutil::bundle(i, 1, "kubelet: failed to load config"))
            .collect();
        let page = render(
            &Stored {
                rows: &rows,
                actions: &[],
                bundles: &bundles,
            },
            100,
            &NoSchedule,
            2000,
        );
        assert_eq!(
            page.matches("<details class=\"bundle\"").count(),
            MAX_INLINE_BUNDLES
        );
        assert_eq!(page.matches("<div class=\"bundle\"").count(), 1);
        assert_eq!(page.matches("download>sealed</a>").count(), usize::from(n));
        assert!(page.contains(&format!(
            "Common cause: {n} of {n} failed node(s): kubelet: failed to load config"
        )));
    }

    /// A node holding back the release that failed on it: its failure, with when its retry
    /// is allowed as a date, or that none comes.
    #[test]
    fn a_node_waiting_for_a_retry_is_shown_failed_with_its_retry_date() {
        let failed = |n: &str| {
            row(
                n,
                1,
                Outcome::RolledBack {
                    why: "check failed".into(),
                },
            )
        };
        let retry = |n: &str, until| {
            row(
                n,
                2,
                Outcome::Waiting {
                    wait_for: fleet_report::WaitFor::Retry,
                    until,
                },
            )
        };
        let rows = vec![
            failed("a"),
            retry("a", Some(1_800_003_600)),
            failed("b"),
            retry("b", None),
        ];
        let page = render(&stored(&rows, &[]), 10, &NoSchedule, 2000);
        for label in [
            "<td>rolled back, waiting (retry after 2027-01-15T09:00:00Z)</td><td>check failed</td>",
            "<td>rolled back, not retried</td><td>check failed</td>",
        ] {
            assert!(page.contains(label), "{label}\n{page}");
        }
    }

    #[test]
    fn a_canary_that_failed_and_waits_is_shown_failed_and_waiting() {
        let rows = vec![
            row(
                "a",
                1,
                Outcome::RolledBack {
                    why: "check failed".into(),
                },
            ),
            row(
                "a",
                2,
                Outcome::Waiting {
                    wait_for: fleet_report::WaitFor::Pause,
                    until: None,
                },
            ),
        ];
        let page = render(&stored(&rows, &[]), 10, &NoSchedule, 2000);
        assert!(
            page.contains("<td>rolled back, waiting (paused)</td><td>check failed</td><td>1970-01-01T00:16:41Z</td><td>none received</td>"),
            "{page}"
        );
        // nodes 1, offered 1, rolled back 1, failed and waiting 1.
        assert!(
            page.contains("<td>?</td><td>1</td><td>1</td><td>0</td><td>0</td><td>0</td><td>0</td><td>0</td><td>1</td><td>0</td><td>0</td><td>1</td></tr>"),
            "{page}"
        );
    }
}
