//! What goes into a failure bundle, decided without I/O: the gathered [`Evidence`] (already
//! read by `sources`) becomes a [`Bundle`], redacted by the node's rules, its sections in the
//! order a reader needs them (failed checks, the decision log, the kernel log, the service
//! logs, then what survived a boot that never reached userspace).

use bootconfig::Slot;
use fleet_report::{Bundle, Failure, NodeId, Section, BUNDLE_FORMAT, MAX_NAME_BYTES};

use crate::report::Redactor;
use crate::state::{CheckResult, Decision};

/// Bytes of each log's tail read from the node; the seal cuts the longest further to fit
/// 64 KiB compressed.
pub const TAIL_BYTES: usize = 96 * 1024;
/// Decisions of the slot decision log carried (the newest).
pub const DECISIONS: usize = 16;

/// One attempt's release and how it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The release's version.
    pub version: String,
    /// Its generation (0: unknown).
    pub generation: u64,
    /// Which failed attempt of it on this node (1 for the first).
    pub attempt: u32,
    /// The slot it was tried in.
    pub slot: Slot,
    /// How it failed.
    pub failure: Failure,
    /// The one-line why.
    pub why: String,
}

/// A named text read on the node (a log's tail, a pstore record, the loader's tries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Section name before it is made safe (`log/kubelet`, `pstore/dmesg-efi-1`).
    pub name: String,
    /// The text, unredacted.
    pub text: String,
}

/// Everything gathered for one bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The attempt.
    pub attempt: Attempt,
    /// When (RFC 3339, UTC).
    pub time: String,
    /// The health checks of the failed assessment, in the order they ran.
    pub checks: Vec<CheckResult>,
    /// The state file's decision log, oldest first.
    pub decisions: Vec<Decision>,
    /// Logs and records, in the order they go in after the checks and decisions.
    pub pieces: Vec<Piece>,
    /// `name=value` lines: this build, the kernel, the running release.
    pub versions: Vec<(String, String)>,
}

/// The last `max` bytes of `text`, starting at a line when one starts within them.
pub fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut at = text.len() - max;
    while !text.is_char_boundary(at) {
        at += 1;
    }
    let rest = &text[at..];
    match rest.find('\n') {
        Some(nl) if nl + 1 < rest.len() => &rest[nl + 1..],
        _ => rest,
    }
}

/// `name` as a bundle's section name: lower case, `[a-z0-9._/-]` (others become `-`), at
/// most [`MAX_NAME_BYTES`], never empty.
pub fn section_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '_' | '/' | '-' => c,
            _ => '-',
        })
        .take(MAX_NAME_BYTES)
        .collect();
    if out.is_empty() {
        out.push('-');
    }
    out
}

fn decision_line(d: &Decision) -> String {
    let event = serde_json::to_value(d.event)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", d.event));
    let time = chrono::DateTime::from_timestamp(d.at as i64, 0).map_or_else(
        || d.at.to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    );
    format!(
        "{time} slot {} {event} {} (generation {}): {}",
        d.slot,
        d.version.as_deref().unwrap_or("-"),
        d.generation.map_or_else(|| "-".into(), |g| g.to_string()),
        d.why
    )
}

fn check_text(c: &CheckResult) -> String {
    format!("{}\n{}", if c.ok { "passed" } else { "FAILED" }, c.detail)
}

/// The bundle of `ev` for `node`, every text but the versions redacted by `redactor` (the
/// count in [`Bundle::redacted`]). Sections: each check (failed first, `health/<name>`), the
/// newest [`DECISIONS`] decisions (`slot/decisions`), then the pieces, each cut to its last
/// [`TAIL_BYTES`]; empty pieces are left out. Texts are not yet cut to the 64 KiB the seal
/// fits them into.
pub fn compose(ev: &Evidence, node: NodeId, redactor: &Redactor) -> Bundle {
    let mut redacted = 0u64;
    let mut clean = |text: &str| {
        let (out, n) = redactor.redact(text);
        redacted += n;
        out
    };
    let mut sections = Vec::new();
    let mut checks: Vec<&CheckResult> = ev.checks.iter().collect();
    checks.sort_by_key(|c| c.ok);
    for c in checks {
        sections.push((format!("health/{}", c.name), check_text(c)));
    }
    let from = ev.decisions.len().saturating_sub(DECISIONS);
    let decisions: Vec<String> = ev.decisions[from..].iter().map(decision_line).collect();
    if !decisions.is_empty() {
        sections.push(("slot/decisions".into(), decisions.join("\n")));
    }
    for p in ev.pieces.iter().filter(|p| !p.text.trim().is_empty()) {
        sections.push((p.name.clone(), tail(&p.text, TAIL_BYTES).to_string()));
    }
    let sections: Vec<Section> = sections
        .into_iter()
        .take(fleet_report::MAX_SECTIONS)
        .map(|(name, text)| Section {
            name: section_name(&name),
            text: clean(&text),
            cut_bytes: 0,
        })
        .collect();
    let a = &ev.attempt;
    let why = clean(&a.why);
    let versions: Vec<String> = ev
        .versions
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Bundle {
        format: BUNDLE_FORMAT,
        node,
        version: fit(&a.version),
        generation: a.generation,
        attempt: a.attempt,
        slot: a.slot.to_string(),
        time: ev.time.clone(),
        failure: a.failure,
        why: fit(&why),
        versions: versions.join("\n"),
        redacted,
        sections,
    }
}

/// At most [`fleet_report::MAX_WHY_CHARS`] characters.
fn fit(text: &str) -> String {
    text.chars().take(fleet_report::MAX_WHY_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Event;

    fn evidence() -> Evidence {
        Evidence {
            attempt: Attempt {
                version: "v2".into(),
                generation: 6,
                attempt: 1,
                slot: Slot::B,
                failure: Failure::HealthCheck,
                why: "health check fails: kubelet at 10.0.2.15 not ready".into(),
            },
            time: "2026-12-07T17:00:00Z".into(),
            checks: vec![
                CheckResult {
                    name: "rootfs".into(),
                    ok: true,
                    detail: "mounted".into(),
                },
                CheckResult {
                    name: "20-Kubelet Ready".into(),
                    ok: false,
                    detail: "token=s3cret exit 1".into(),
                },
            ],
            decisions: (0..20)
                .map(|i| Decision {
                    at: 1_765_000_000 + i,
                    slot: Slot::B,
                    event: Event::Booted,
                    version: Some("v2".into()),
                    generation: Some(6),
                    why: format!("boot {i}"),
                })
                .collect(),
            pieces: vec![
                Piece {
                    name: "log/kernel".into(),
                    text: "panic? no\n".into(),
                },
                Piece {
                    name: "log/k3s".into(),
                    text: "  \n".into(),
                },
            ],
            versions: vec![("k3os-ops".into(), "0.3.0".into())],
        }
    }

    #[test]
    fn failed_checks_come_first_then_the_newest_decisions_then_the_pieces() {
        let r = Redactor::new(&[]).unwrap();
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let b = compose(&evidence(), NodeId::of(&key.verifying_key()), &r);
        let names: Vec<&str> = b.sections.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "health/20-kubelet-ready",
                "health/rootfs",
                "slot/decisions",
                "log/kernel"
            ],
            "an empty log is left out"
        );
        let decisions = &b.sections[2].text;
        assert_eq!(decisions.lines().count(), DECISIONS);
        assert!(
            decisions.ends_with("slot B booted v2 (generation 6): boot 19"),
            "{decisions}"
        );
        assert!(!decisions.contains("boot 3\n"), "only the newest are kept");
        // The check's secret and the why's address are redacted, and counted.
        assert_eq!(b.sections[0].text, "FAILED\ntoken=[REDACTED] exit 1");
        assert_eq!(
            b.why,
            "health check fails: kubelet at [REDACTED address] not ready"
        );
        assert_eq!(b.redacted, 2);
        assert_eq!((b.slot.as_str(), b.attempt, b.generation), ("B", 1, 6));
        assert_eq!(b.versions, "k3os-ops=0.3.0");
        b.check().unwrap();
        b.seal(&key).unwrap();
    }

    #[test]
    fn a_tail_starts_at_a_line_and_a_name_is_made_safe() {
        assert_eq!(tail("one\ntwo\nthree\n", 100), "one\ntwo\nthree\n");
        assert_eq!(tail("one\ntwo\nthree\n", 9), "three\n");
        assert_eq!(tail("ééé", 3), "é", "cut at a character boundary");
        assert_eq!(tail("no newline at all", 3), "all");
        assert_eq!(section_name("log/K3s Service.log"), "log/k3s-service.log");
        assert_eq!(section_name(""), "-");
        assert_eq!(section_name(&"x".repeat(100)).len(), MAX_NAME_BYTES);
    }
}
