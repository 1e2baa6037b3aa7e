//! Reporting a thin-link stage: the preview before its first byte (Node annotation
//! [`ANN_STAGE_PREVIEW`], gauge `k3os_ops_stage_preview_bytes{channel,kind}`) and the
//! channel condition `StageWillMissWindow`.
//!
//! The condition is the channel's, like `ChannelStale` (see [`crate::agent::cluster::stale`]): an operator
//! looks at the channel to see whether the next maintenance window will find the nodes
//! staged. Several nodes share it, so its message holds one line per node that will miss,
//! `node <name>: <figures>`, sorted by node; each agent rewrites only its own line
//! ([`with_miss`], pure) by compare-and-swap of the status, and the condition is True while
//! any line is left, False (reason `StageOnTime`) once the last is removed. A channel no node
//! ever reported gets no condition (no write per stage).
//!
//! The annotation is small JSON ([`PreviewRecord`] without `at`): `{"format":1,"version":
//! "v2","fetch":123,"reuse":456}` (`bundle` when staged from an offline bundle). Its
//! `format` is its version; readers ignore fields they do not know. Its key is
//! `k3os.io/update-stage-preview`; an agent of the previous release wrote
//! `k3os.io/stage-preview`, which [`preview_annotation`] still reads and the next preview
//! removes.

use chrono::{DateTime, Utc};

use crate::agent::channel::crd::{UpdateChannel, UpdateChannelStatus, COND_STAGE_WILL_MISS_WINDOW};
use crate::agent::channel::thin::Miss;
use crate::agent::cluster::kube_store::KubeChannelStore;
use crate::agent::cluster::slots::{self, SlotError, Step};
use crate::agent::context::Agent;
use libupgrade::state::ledger::PreviewRecord;

/// Node annotation: the preview of the stage in progress or next (JSON, see module docs). In
/// the agent's own `k3os.io/update-*` space, which deploy/node-scope.yaml lets it write.
pub const ANN_STAGE_PREVIEW: &str = "k3os.io/update-stage-preview";

/// The key agents before v0.2.0's issue 34 wrote the preview to (outside `k3os.io/update-*`,
/// so the shipped Node policy refused it): read as a fallback, removed at the next preview.
pub const ANN_STAGE_PREVIEW_V1: &str = "k3os.io/stage-preview";

/// The preview a Node's annotations carry: the current key's, else the one an agent of the
/// previous release wrote (for readers other than the agent, which only writes it: the tests).
#[cfg(test)]
pub fn preview_annotation(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<&str> {
    annotations
        .get(ANN_STAGE_PREVIEW)
        .or_else(|| annotations.get(ANN_STAGE_PREVIEW_V1))
        .map(String::as_str)
}

fn lines(st: &UpdateChannelStatus) -> Vec<String> {
    st.conditions
        .iter()
        .find(|c| c.type_ == COND_STAGE_WILL_MISS_WINDOW && c.status == "True")
        .map(|c| c.message.lines().map(String::from).collect())
        .unwrap_or_default()
}

/// Set `node`'s line of the condition to `miss` (None: on time). Returns whether anything
/// changed.
pub fn with_miss(
    st: &mut UpdateChannelStatus,
    node: &str,
    miss: Option<&Miss>,
    now: DateTime<Utc>,
) -> bool {
    let before = st.clone();
    let prefix = format!("node {node}: ");
    let mut ls: Vec<String> = lines(st)
        .into_iter()
        .filter(|l| !l.starts_with(&prefix))
        .collect();
    if let Some(m) = miss {
        ls.push(m.line(node));
    }
    ls.sort();
    let exists = st
        .conditions
        .iter()
        .any(|c| c.type_ == COND_STAGE_WILL_MISS_WINDOW);
    if !ls.is_empty() {
        st.set_condition(
            COND_STAGE_WILL_MISS_WINDOW,
            true,
            "BytesLeftExceedCapacity",
            ls.join("\n"),
            now,
        );
    } else if exists {
        st.set_condition(
            COND_STAGE_WILL_MISS_WINDOW,
            false,
            "StageOnTime",
            "every node's stage can finish before the next maintenance window".into(),
            now,
        );
    }
    *st != before
}

/// Whether `node` has a line in the condition as read.
fn has_line(st: &UpdateChannelStatus, node: &str) -> bool {
    let prefix = format!("node {node}: ");
    lines(st).iter().any(|l| l.starts_with(&prefix))
}

async fn write(
    store: &KubeChannelStore,
    node: &str,
    miss: Option<&Miss>,
    now: DateTime<Utc>,
) -> Result<bool, SlotError> {
    slots::cas(store, now, |_, st| {
        let was = has_line(st, node);
        if with_miss(st, node, miss, now) {
            Step::Write(!was && miss.is_some())
        } else {
            Step::Done(false)
        }
    })
    .await
}

/// Report whether this node's stage will miss the next maintenance window: the condition
/// (written only when this node's line changes; nothing when it is on time and has no line)
/// and a warning Event when its line appears. A failed write is logged (the next stage
/// attempt reports again).
pub async fn report_miss(cx: &Agent, ch: &UpdateChannel, miss: Option<Miss>) {
    let node = &cx.settings.node;
    let name = ch.metadata.name.clone().unwrap_or_default();
    let had = ch.status.as_ref().is_some_and(|s| has_line(s, node));
    if miss.is_none() && !had {
        return;
    }
    let now = cx.settings.clock.now();
    match write(&cx.store(&name), node, miss.as_ref(), now).await {
        Ok(true) => {
            let m = miss.expect("only a miss adds a line");
            cx.event(Some(ch), true, "StageWillMissWindow", m.line(node))
                .await;
        }
        Ok(false) => {}
        Err(e) => tracing::warn!("set condition {COND_STAGE_WILL_MISS_WINDOW} of {name}: {e}"),
    }
}

/// Publish the preview: the annotation and the gauge.
pub async fn publish_preview(cx: &Agent, ch: &UpdateChannel, p: &PreviewRecord) {
    let name = ch.metadata.name.clone().unwrap_or_default();
    cx.clients
        .metrics
        .set_stage_preview(&name, p.fetch, p.reuse);
    let text = serde_json::to_string(&PreviewRecord {
        at: None,
        ..p.clone()
    })
    .expect("a preview serializes");
    // The old key goes in the same patch (a no-op when absent: `annotate` skips what is known).
    let ann = [
        (ANN_STAGE_PREVIEW, Some(text.as_str())),
        (ANN_STAGE_PREVIEW_V1, None),
    ];
    if let Err(e) = cx.annotate(&ann).await {
        tracing::warn!("stage preview annotation: {e:#}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn miss(left: u64) -> Miss {
        Miss {
            left,
            capacity: 10,
            deadline: DateTime::parse_from_rfc3339("2026-12-06T01:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
        }
    }

    #[test]
    fn the_preview_is_read_from_the_new_key_else_the_old_one() {
        let mut ann = std::collections::BTreeMap::new();
        assert_eq!(preview_annotation(&ann), None);
        ann.insert(ANN_STAGE_PREVIEW_V1.to_string(), "old".to_string());
        assert_eq!(preview_annotation(&ann), Some("old"));
        ann.insert(ANN_STAGE_PREVIEW.to_string(), "new".to_string());
        assert_eq!(preview_annotation(&ann), Some("new"));
        assert!(ANN_STAGE_PREVIEW.starts_with("k3os.io/update-"));
    }

    #[test]
    fn each_node_owns_its_line_and_the_last_one_out_clears_the_condition() {
        let now = Utc::now();
        let mut st = UpdateChannelStatus::default();
        assert!(
            !with_miss(&mut st, "n1", None, now),
            "on time, never reported"
        );
        assert!(st.conditions.is_empty());
        assert!(with_miss(&mut st, "n2", Some(&miss(100)), now));
        assert!(with_miss(&mut st, "n1", Some(&miss(200)), now));
        let c = &st.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "BytesLeftExceedCapacity")
        );
        let ls: Vec<&str> = c.message.lines().collect();
        assert_eq!(ls.len(), 2);
        assert!(ls[0].starts_with("node n1: 200 B left"), "{}", ls[0]);
        assert!(ls[1].contains("2026-12-06T01:00:00Z"), "{}", ls[1]);
        assert!(
            !with_miss(&mut st, "n1", Some(&miss(200)), now),
            "same again: no write"
        );
        assert!(with_miss(&mut st, "n1", None, now));
        assert_eq!(st.conditions[0].status, "True", "n2 still misses");
        assert!(with_miss(&mut st, "n2", None, now));
        assert_eq!(st.conditions[0].status, "False");
        assert_eq!(st.conditions[0].reason, "StageOnTime");
        assert!(!with_miss(&mut st, "n2", None, now));
    }
}
