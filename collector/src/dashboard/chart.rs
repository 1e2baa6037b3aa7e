//! Pure: one release's chart, an inline SVG. Per time, how many of the enrolled nodes were
//! offered the release, staged it, run it blessed and failed it (each node's outcome replayed
//! report by report with [`crate::history::step`], so the lines end where the tables stand),
//! against the planned share; with a time axis (UTC dates), a share axis, a legend and the
//! halts, lifts, pauses and withdrawal marked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::esc;
use crate::history::{self, NodeOutcome, NodeState};
use crate::store::Row;
use crate::time;

/// Something that happened to the rollout, marked on the chart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// When (Unix seconds).
    pub at: u64,
    /// `halt`, `lifted`, `pause` or `withdrawn` (its CSS class and colour).
    pub kind: &'static str,
    /// What to write beside it.
    pub label: String,
}

/// The lines, in legend order, with what each counts.
pub const LINES: [(&str, &str, &str); 5] = [
    (
        "planned",
        "#777",
        "planned: the share the rollout offers it to",
    ),
    (
        "offered",
        "#7b3294",
        "offered: took it up (any report but a wait)",
    ),
    ("staged", "#1f78b4", "staged: staged it, at least once"),
    ("blessed", "#33a02c", "blessed: runs it"),
    (
        "failed",
        "#e31a1c",
        "failed: failed it and has not tried again",
    ),
];

fn colour(kind: &str) -> &'static str {
    match kind {
        "halt" => "#e31a1c",
        "lifted" => "#33a02c",
        "withdrawn" => "#000",
        _ => "#ff7f00",
    }
}

/// (time, count) steps of the offered, staged, blessed and failed lines.
pub type Steps = BTreeMap<&'static str, Vec<(u64, u64)>>;

/// Replay the release's reports in the order they were received; after each, the counts.
pub fn series(rows: &[&Row]) -> Steps {
    let mut sorted: Vec<&Row> = rows.to_vec();
    sorted.sort_by_key(|r| (r.received, r.seq));
    let mut now: BTreeMap<&str, NodeOutcome> = BTreeMap::new();
    let mut staged: BTreeSet<&str> = BTreeSet::new();
    let mut out: Steps = LINES[1..].iter().map(|l| (l.0, Vec::new())).collect();
    for r in sorted {
        let o = history::step(now.get(r.node.as_str()).copied(), r);
        now.insert(&r.node, o);
        if o.state == NodeState::Staged {
            staged.insert(&r.node);
        }
        let count = |f: &dyn Fn(&NodeOutcome) -> bool| now.values().filter(|o| f(o)).count();
        let counts = [
            ("offered", count(&|o| o.state != NodeState::Waiting)),
            ("staged", staged.len()),
            ("blessed", count(&|o| o.state == NodeState::Blessed)),
            ("failed", count(&|o| o.state.failed())),
        ];
        for (k, n) in counts {
            let pts = out.get_mut(k).expect("every line");
            if pts.last().map_or(0, |p| p.1) != n as u64 {
                pts.push((r.received, n as u64));
            }
        }
    }
    out
}

/// A round share axis top, in percent: 1, 2 or 5 × a power of ten, at most 100.
fn share_top(max_percent: f64) -> f64 {
    let mut top = 0.1;
    for _ in 0..8 {
        for m in [1.0, 2.0, 5.0] {
            if top * m >= max_percent {
                return (top * m).min(100.0);
            }
        }
        top *= 10.0;
    }
    100.0
}

/// A time step with at most 6 ticks over `span` seconds.
fn time_step(span: u64) -> u64 {
    const STEPS: [u64; 14] = [
        60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 2592000,
    ];
    STEPS
        .into_iter()
        .find(|s| span / s <= 6)
        .unwrap_or(span.div_ceil(6).max(1))
}

fn percent(p: f64) -> String {
    let s = format!("{p:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} %")
}

/// The plot's frame: the time and share ranges and where they go.
struct Frame {
    t0: u64,
    t1: u64,
    top: f64,
}

const W: f64 = 720.0;
const H: f64 = 280.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 52.0;

impl Frame {
    fn x(&self, t: u64) -> f64 {
        LEFT + (t.saturating_sub(self.t0)) as f64 / (self.t1 - self.t0) as f64 * (W - LEFT - RIGHT)
    }
    fn y(&self, share_percent: f64) -> f64 {
        H - BOTTOM - share_percent / self.top * (H - BOTTOM - TOP)
    }
}

fn axes(f: &Frame, enrolled: u64) -> String {
    let (x0, x1, yb, yt) = (LEFT, W - RIGHT, H - BOTTOM, TOP);
    let mut s = format!(
        "<g class=\"axes\" font-size=\"11\" fill=\"#333\"><line x1=\"{x0}\" y1=\"{yb}\" x2=\"{x1}\" y2=\"{yb}\" stroke=\"#333\"/><line x1=\"{x0}\" y1=\"{yt}\" x2=\"{x0}\" y2=\"{yb}\" stroke=\"#333\"/>"
    );
    let ticks = if f.top == 2.0 * 10f64.powi(f.top.log10().floor() as i32) {
        4
    } else {
        5
    };
    for i in 0..=ticks {
        let p = f.top * f64::from(i) / f64::from(ticks);
        let y = f.y(p);
        let _ = write!(
            s,
            "<line class=\"grid\" x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text class=\"y-tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 6.0,
            y + 4.0,
            percent(p)
        );
    }
    let step = time_step(f.t1 - f.t0);
    let mut t = f.t0.div_ceil(step) * step;
    let mut last_date = String::new();
    while t <= f.t1 {
        let x = f.x(t);
        let date = time::date(t);
        let top_line = if step >= 86_400 {
            date.clone()
        } else {
            time::hour_minute(t)
        };
        let second = if step < 86_400 && date != last_date {
            date.clone()
        } else {
            String::new()
        };
        last_date = date;
        let _ = write!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{yb}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#333\"/><text class=\"x-tick\" x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{top_line}<tspan x=\"{x:.1}\" dy=\"13\">{second}</tspan></text>",
            yb + 4.0,
            yb + 16.0
        );
        t += step;
    }
    let _ = write!(
        s,
        "<text class=\"x-title\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time (UTC)</text><text class=\"y-title\" transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">share of {enrolled} enrolled node(s)</text></g>",
        (x0 + x1) / 2.0,
        H - 6.0,
        (yt + yb) / 2.0
    );
    s
}

/// The marks as dashed vertical lines, labelled at the top (stacked, to the left of the line
/// in the right half); `now` as a grey line labelled at the bottom.
fn marks(f: &Frame, marks: &[Mark], now: u64) -> String {
    let x = f.x(now);
    let mut s = format!(
        "<g class=\"now\"><title>now, {at}</title><line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{yb}\" stroke=\"#999\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#666\" text-anchor=\"end\">now</text></g>",
        x - 3.0,
        H - BOTTOM - 4.0,
        at = time::utc(now),
        yb = H - BOTTOM
    );
    for (i, m) in marks.iter().enumerate() {
        let x = f.x(m.at);
        let c = colour(m.kind);
        let (tx, anchor) = match x > (LEFT + W - RIGHT) / 2.0 {
            true => (x - 3.0, "end"),
            false => (x + 3.0, "start"),
        };
        let _ = write!(
            s,
            "<g class=\"mark {k}\"><title>{l} at {at}</title><line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"{c}\" stroke-dasharray=\"4 3\"/><text x=\"{tx:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"{c}\" text-anchor=\"{anchor}\">{l}</text></g>",
            H - BOTTOM,
            TOP + 12.0 + 12.0 * (i % 4) as f64,
            k = esc(m.kind),
            l = esc(&m.label),
            at = time::utc(m.at)
        );
    }
    s
}

/// A line's SVG points: the planned share straight through its samples, a count in steps (held
/// until its next report, and to now: it is known up to now).
fn points(f: &Frame, planned: bool, pts: &[(u64, f64)], now: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut held = 0.0;
    for &(t, v) in pts {
        if !planned {
            out.push(format!("{:.1},{:.1}", f.x(t), f.y(held)));
        }
        out.push(format!("{:.1},{:.1}", f.x(t), f.y(v)));
        held = v;
    }
    if !planned {
        out.push(format!("{:.1},{:.1}", f.x(now.min(f.t1)), f.y(held)));
    }
    out
}

/// The time range shown: from the first report or mark to `now` or the last mark, 5 % more on
/// each side so that nothing sits on the frame, and at least ten minutes (centred) so that the
/// axis has ticks.
fn range(lines: &Steps, marks: &[Mark], now: u64) -> (u64, u64) {
    let first = lines.values().flatten().map(|p| p.0).min().unwrap_or(now);
    let start = first.min(marks.iter().map(|m| m.at).min().unwrap_or(now));
    let end = now.max(marks.iter().map(|m| m.at).max().unwrap_or(0));
    let pad = ((end - start) / 20).max(600u64.saturating_sub(end - start) / 2);
    (start.saturating_sub(pad), end + pad)
}

/// The chart (SVG) and its legend (HTML) of one release: `lines` from [`series`],
/// `planned_at(t)` the planned share (0–1) at a time, `enrolled` nodes making 100 %, the
/// rollout's `marks`; from the first report or mark to `now` (or the last mark).
pub fn chart(
    version: &str,
    lines: &Steps,
    planned_at: &dyn Fn(u64) -> Option<f64>,
    enrolled: u64,
    rollout_marks: &[Mark],
    now: u64,
) -> String {
    let (t0, t1) = range(lines, rollout_marks, now);
    let planned: Vec<(u64, f64)> = (0..=64)
        .filter_map(|i| {
            let t = t0 + (t1 - t0) * i / 64;
            planned_at(t).map(|s| (t, s))
        })
        .collect();
    let denom = enrolled.max(1) as f64;
    let share = |n: u64| n as f64 * 100.0 / denom;
    let max = lines
        .values()
        .flatten()
        .map(|p| share(p.1))
        .chain(planned.iter().map(|p| p.1 * 100.0))
        .fold(0.0, f64::max);
    let f = Frame {
        t0,
        t1,
        top: share_top(max),
    };
    let mut svg = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{} over time\" font-family=\"sans-serif\">",
        esc(version)
    );
    svg.push_str(&axes(&f, enrolled));
    let mut legend = String::from("<ul class=\"legend\">");
    for (k, c, what) in LINES {
        let pts: Vec<(u64, f64)> = match k {
            "planned" => planned.iter().map(|p| (p.0, p.1 * 100.0)).collect(),
            _ => lines[k].iter().map(|p| (p.0, share(p.1))).collect(),
        };
        if k == "planned" && pts.is_empty() {
            continue;
        }
        let last = pts.last().map_or(0.0, |p| p.1);
        let steps = points(&f, k == "planned", &pts, now);
        let count = match k {
            "planned" => (last * denom / 100.0).round() as u64,
            _ => lines[k].last().map_or(0, |p| p.1),
        };
        // Offered is often staged's equal: drawn under it, wide and pale, it still shows.
        let dash = match k {
            "planned" => " stroke-width=\"2\" stroke-dasharray=\"6 4\"",
            "offered" => " stroke-width=\"6\" stroke-opacity=\"0.35\"",
            _ => " stroke-width=\"2\"",
        };
        let _ = write!(
            svg,
            "<polyline class=\"{k}\" data-last=\"{count}\" fill=\"none\" stroke=\"{c}\"{dash} points=\"{}\"/>",
            steps.join(" ")
        );
        let _ = write!(
            legend,
            "<li class=\"{k}\" data-count=\"{count}\"><span class=\"swatch\" style=\"background:{c}\"></span><b>{k}</b> {count} node(s), {}: {}</li>",
            percent(last),
            esc(what.split_once(": ").map_or(what, |w| w.1))
        );
    }
    svg.push_str(&marks(&f, rollout_marks, now));
    svg.push_str("</svg>");
    legend.push_str("</ul>");
    format!("<figure class=\"rollout\">{svg}{legend}</figure>")
}

#[cfg(test)]
mod tests;
