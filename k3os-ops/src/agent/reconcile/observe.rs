//! The read phase of one reconcile: read the Node and the channels, pick this node's channel,
//! ask the node for its slots, and return what was seen (`Seen`) and, when the node can be
//! decided for, the channel and the [`NodeView`]. It publishes nothing: what it saw that the
//! agent reports (annotations in a newer format, unusable channels, a conflict between
//! channels, a boot not assessed yet or assessed again, the booted version) is published by
//! `publish`, the one place for it, which the controller calls before the decision.

use chrono::Utc;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{DynamicObject, ListParams};
use kube::ResourceExt;

use super::assessment;
use super::decide::NodeView;
use crate::agent::channel::format::{FormatError, ANN_CORDONED, ANN_TOKEN, ANN_VERSION};
use crate::agent::channel::listing::{Channel, Listed};
use crate::agent::cluster::cache::Fresh;
use crate::agent::context::Agent;
use crate::agent::errors::{AgentError, KubeContext};
use crate::agent::host::ops::NodeError;
use crate::agent::host::status::Inactive;

/// What the read phase saw that the agent reports.
pub(in crate::agent) struct Seen {
    /// The Node as read.
    node: Node,
    /// The Node's annotations are in a newer format than this agent knows: nothing else is
    /// read or done on this node.
    newer_node: Option<FormatError>,
    /// The channels of the namespace (the unusable ones are reported on themselves).
    listed: Option<Listed>,
    /// The channel picked for this node (what the reports about it regard).
    channel: Option<Channel>,
    /// The `ChannelConflict` note when several channels select this node.
    conflict: Option<String>,
    /// This boot: not assessed yet (the agent waits), assessed, or not asked.
    boot: Boot,
    /// The booted version for the Node's annotation, when it differs from the one read.
    booted_annotation: Option<String>,
}

/// What the read phase learned of this boot's assessment.
enum Boot {
    /// The node was not asked (no channel picks it, or its annotations are newer).
    NotAsked,
    /// `k3os-ops slot confirm` has not run since the boot.
    NotAssessed(NodeError),
    /// Assessed.
    Assessed,
}

/// What the decision needs once the read phase found a channel and an assessed boot.
pub(in crate::agent) struct Ready {
    /// The channel picked for this node.
    pub channel: Channel,
    /// This node as the decision sees it.
    pub view: NodeView,
}

/// Read and look: what was seen, and what to decide for (None: nothing to decide now).
pub(in crate::agent) async fn observe(cx: &Agent) -> Result<(Seen, Option<Ready>), AgentError> {
    let (node, objects) = read(cx).await?;
    // Ready: the loop runs, it read its Node and the channels (none is fine: a DaemonSet
    // is applied before its first channel) and the watches, if any, hold their first lists.
    if cx.clients.watched.as_ref().is_none_or(|w| w.synced()) {
        cx.clients.metrics.reconciled(true);
    }
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    cx.saw_annotations(annotations.clone());
    let mut seen = Seen {
        node,
        newer_node: None,
        listed: None,
        channel: None,
        conflict: None,
        boot: Boot::NotAsked,
        booted_annotation: None,
    };
    let what = format!(
        "the k3os.io/update-* annotations of Node {}",
        cx.settings.node
    );
    if let Err(e) = crate::agent::channel::format::node_format(&what, &annotations) {
        seen.newer_node = Some(e);
        return Ok((seen, None));
    }
    let listed = crate::agent::channel::listing::sort_out(&cx.settings.namespace, objects);
    let labels = seen.node.metadata.labels.clone().unwrap_or_default();
    let picked = crate::agent::channel::listing::pick(&cx.settings.node, &listed.channels, &labels)
        .map(|p| (p.channel.clone(), conflict_note(&p)));
    seen.listed = Some(listed);
    let Some((channel, conflict)) = picked else {
        return Ok((seen, None));
    };
    seen.channel = Some(channel.clone());
    seen.conflict = conflict;
    let view = match node_view(cx, &seen.node, &channel).await {
        Err(AgentError::Node(e)) if e.is_not_assessed() => {
            seen.boot = Boot::NotAssessed(e);
            return Ok((seen, None));
        }
        other => other?,
    };
    seen.boot = Boot::Assessed;
    let booted = view.update.booted_version.as_deref();
    if booted.is_some() && annotations.get(ANN_VERSION).map(String::as_str) != booted {
        seen.booted_annotation = booted.map(String::from);
    }
    let silence = cx.remember(|m| m.startup_silence.take());
    let view = NodeView {
        silent_at_start: silence,
        ..view
    };
    Ok((seen, Some(Ready { channel, view })))
}

/// Publish what the read phase saw: a newer format of the Node's annotations or of a channel
/// (once per text), unusable channels (their `Invalid` condition and Event), a conflict
/// between channels (an Event when the note changes), the boot's assessment (reported once
/// while not assessed; the condition turned `True` once it is) and the booted version's
/// annotation.
pub(in crate::agent) async fn publish(cx: &Agent, seen: &Seen) -> Result<(), AgentError> {
    if let Some(e) = &seen.newer_node {
        cx.report_format(None, e).await;
        return Ok(());
    }
    if let Some(listed) = &seen.listed {
        report_listed(cx, listed).await;
    }
    if let (Some(note), Some(ch)) = (&seen.conflict, &seen.channel) {
        report_conflict(cx, ch, note).await;
    }
    match &seen.boot {
        Boot::NotAsked => {}
        Boot::NotAssessed(e) => {
            assessment::report_not_assessed(cx, &seen.node, seen.channel.as_deref(), e).await?
        }
        Boot::Assessed => assessment::clear_not_assessed(cx, &seen.node).await?,
    }
    if let Some(v) = &seen.booted_annotation {
        cx.annotate(&[(ANN_VERSION, Some(v))]).await?;
    }
    Ok(())
}

/// The own Node and the channel objects: from the watch caches when they have caught up with
/// the last fresh read and this agent wrote nothing since, else read fresh (GET and list; what
/// was read is remembered). See [`crate::agent::cluster::cache`].
async fn read(cx: &Agent) -> Result<(Node, Vec<DynamicObject>), AgentError> {
    let watched = cx.clients.watched.as_ref();
    let fresh = cx.remember(|m| m.fresh.clone());
    if let (Some(w), Some(f)) = (watched, &fresh) {
        if let Some(state) = w.state_after(f) {
            return Ok(state);
        }
    }
    let writes = watched.map_or(0, |w| w.writes.get());
    let node = cx
        .nodes()
        .get(&cx.settings.node)
        .await
        .kube_ctx(|| format!("read own Node {}", cx.settings.node))?;
    let namespace = &cx.settings.namespace;
    let objects = crate::agent::channel::listing::dynamic_api(cx.clients.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .kube_ctx(|| format!("list UpdateChannels in namespace {namespace}"))?
        .items;
    if watched.is_some() {
        let seen = Fresh {
            writes,
            node_rv: node.metadata.resource_version.clone(),
            channels: objects
                .iter()
                .map(|o| (o.name_any(), o.metadata.resource_version.clone()))
                .collect(),
        };
        cx.remember(|m| m.fresh = Some(seen));
    }
    Ok((node, objects))
}

/// The channels this agent cannot use, reported on themselves: a newer format (an Event once
/// per text), an invalid spec (the `Invalid` condition and an Event).
async fn report_listed(cx: &Agent, listed: &Listed) {
    let namespace = &cx.settings.namespace;
    for newer in &listed.newer {
        let regarding = ObjectReference {
            api_version: Some("k3os.io/v1".into()),
            kind: Some("UpdateChannel".into()),
            name: Some(newer.name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        };
        cx.report_format(Some(regarding), &newer.error).await;
    }
    super::invalid::report_channels(cx, listed).await;
}

/// The `ChannelConflict` note when several channels select this node.
fn conflict_note(picked: &crate::agent::channel::listing::Picked<'_>) -> Option<String> {
    if picked.losers.is_empty() {
        return None;
    }
    let losers: Vec<String> = picked
        .losers
        .iter()
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    Some(format!(
        "several UpdateChannels select this node; {} wins because {}; not used: {}",
        picked.channel.name(),
        picked.why,
        losers.join(", ")
    ))
}

/// A `ChannelConflict` Event regarding `ch`, again only when the note changes.
async fn report_conflict(cx: &Agent, ch: &Channel, note: &str) {
    let fresh = cx.remember(|m| {
        let fresh = m.last_conflict.as_deref() != Some(note);
        m.last_conflict = Some(note.to_string());
        fresh
    });
    if fresh {
        cx.event(Some(ch), true, "ChannelConflict", note.to_string())
            .await;
    }
}

/// This node as the decision sees it (and its metrics); `Err(AgentError::Node)` with
/// [`NodeError::is_not_assessed`] while its boot is not assessed.
async fn node_view(cx: &Agent, node: &Node, channel: &Channel) -> Result<NodeView, AgentError> {
    let update = cx.blocking(|ops| ops.status()).await?;
    let staged = match &update.inactive {
        Inactive::Staged(v) | Inactive::Activated(v) => Some(v.as_str()),
        _ => None,
    };
    let metrics = &cx.clients.metrics;
    metrics.set_versions(update.booted_version.as_deref(), staged);
    let held = channel
        .status
        .as_ref()
        .and_then(|s| s.slot_of(&cx.settings.node))
        .map_or(0.0, |s| {
            (Utc::now() - s.claimed_at).num_milliseconds().max(0) as f64 / 1000.0
        });
    metrics.set_slot_held(held);
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    Ok(NodeView {
        name: cx.settings.node.clone(),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        unschedulable: node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        token: annotations.get(ANN_TOKEN).cloned(),
        cordoned_by_us: annotations.get(ANN_CORDONED).is_some_and(|v| v == "true"),
        silent_at_start: None,
        not_ready: super::decide::not_ready(
            node.status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .unwrap_or_default(),
        ),
        update,
    })
}
