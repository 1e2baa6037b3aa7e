//! One reconcile of the agent: read the Node and the channels, pick this node's channel
//! ([`crate::agent::channel::listing::pick`]), build the [`NodeView`], gather the decision's
//! [`Inputs`] (the back-offs from memory; the gates' verdict and today's fetched bytes only
//! when [`super::decide::step`] asks for them), ask it for the next step and dispatch it to
//! the one function that carries it out ([`super::waits`] for what a waiting step says,
//! [`super::actions`] for the bookkeeping actions, [`super::steps`] for stage and the
//! disruptive steps). Nothing here decides: the dispatch is one match, like Zincati's actor.

use chrono::Utc;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{DynamicObject, ListParams};
use kube::ResourceExt;

use super::actions;
use super::assessment;
use super::decide::{Action, Inputs, Need, NodeView, PinVerdict, Step, Verdict};
use super::steps;
use crate::agent::channel::crd::SlotPhase;
use crate::agent::channel::format::{ANN_CORDONED, ANN_TOKEN, ANN_VERSION};
use crate::agent::channel::listing::{Channel, Listed, Picked};
use crate::agent::cluster::cache::Fresh;
use crate::agent::cluster::publish::{Done, Then};
use crate::agent::context::{Agent, Next};
use crate::agent::errors::{AgentError, KubeContext};
use crate::agent::host::requests::{resolve_latest, resolve_pinned};
use crate::agent::host::status::Inactive;
use libupgrade::Release;

impl Agent {
    /// One decision and its execution.
    pub async fn reconcile(&self) -> Result<Next, AgentError> {
        reconcile(self).await
    }
}

/// One decision and its execution (see the module docs).
pub async fn reconcile(cx: &Agent) -> Result<Next, AgentError> {
    let (node, objects) = read(cx).await?;
    // Annotations of a newer agent than this one: touch nothing on this node.
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    cx.saw_annotations(annotations.clone());
    let what = format!(
        "the k3os.io/update-* annotations of Node {}",
        cx.settings.node
    );
    if let Err(e) = crate::agent::channel::format::node_format(&what, &annotations) {
        cx.report_format(None, &e).await;
        return Ok(Next::Wait);
    }
    let listed = sort_channels(cx, objects).await;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let Some(picked) =
        crate::agent::channel::listing::pick(&cx.settings.node, &listed.channels, &labels)
    else {
        return Ok(Next::Wait);
    };
    report_conflict(cx, &picked).await;
    let channel = picked.channel.clone();
    let Some(view) = node_view(cx, &node, &channel).await? else {
        return Ok(Next::Wait);
    };
    let silence = cx.remember(|m| m.startup_silence.take());
    let view = NodeView {
        silent_at_start: silence,
        ..view
    };
    let (step, resolved) = decide(cx, &channel, &view).await?;
    tracing::debug!(?step, channel = %channel.name(), "decided");
    if step.undo_cordon {
        if let Some(said) = cx.undo_cordon().await? {
            cx.say(&channel, said).await;
        }
    }
    let done = execute(cx, &channel, &view, step, resolved).await?;
    carry_out(cx, &channel, done).await
}

/// Publish what a tick did, once and in order, then do what follows it.
async fn carry_out(cx: &Agent, ch: &Channel, done: Done) -> Result<Next, AgentError> {
    cx.say_all(ch, done.said).await;
    if let Some(report) = done.report {
        cx.publish(ch, report).await?;
    }
    Ok(match done.then {
        Then::Again => Next::Again,
        Then::Wait => Next::Wait,
        Then::Reboot => {
            cx.blocking(|ops| ops.reboot()).await?;
            Next::Wait
        }
    })
}

/// The decision for `view` under `ch`, with the inputs it asks for gathered, and the release
/// a pinned version's own check resolved (offered): a stage in this tick takes it instead of
/// resolving the channel again.
async fn decide(
    cx: &Agent,
    ch: &Channel,
    view: &NodeView,
) -> Result<(Step, Option<Release>), AgentError> {
    let now = Utc::now();
    let stage_now = cx.settings.clock.now();
    let (claim_not_before, stage_not_before) = cx.remember(|m| {
        (
            m.claims.waits_until(now),
            m.stages.waits_until(stage_now),
        )
    });
    let mut inputs = Inputs {
        now,
        stage_now,
        claim_not_before,
        stage_not_before,
        ..Inputs::default()
    };
    let mut resolved = None;
    loop {
        let step = super::decide::step(ch, &ch.policy, view, &inputs);
        match step.action {
            Action::Gather(Need::Gates) => inputs.gates = gates_verdict(cx, ch).await,
            Action::Gather(Need::OwnLatest) => {
                let url = ch.spec.url.clone();
                let seed = crate::agent::channel::fleet_waves::cluster_seed(ch);
                let own = cx
                    .blocking(move |ops| Ok(resolve_latest(ops, &url, seed)))
                    .await?;
                inputs.own_latest = Some(own.map_err(|e| e.to_string()));
            }
            Action::Gather(Need::OwnPinned) => {
                let url = ch.spec.url.clone();
                let version = ch.spec.pinned_version().unwrap_or_default().to_string();
                let seed = crate::agent::channel::fleet_waves::cluster_seed(ch);
                let ignore = ch.spec.ignores_rollout();
                let own = cx
                    .blocking(move |ops| Ok(resolve_pinned(ops, &url, &version, seed, ignore)))
                    .await?;
                inputs.own_pin = PinVerdict::of(
                    own.as_ref().map(|p| &p.pinned).map_err(|e| e.to_string()),
                    seed,
                );
                resolved = own.ok().and_then(|p| p.release);
            }
            Action::Gather(Need::FetchedOn(day)) => {
                let fetched = cx.blocking(move |ops| ops.fetched_on(day)).await?;
                inputs.fetched_today = Some(fetched);
            }
            _ => return Ok((step, resolved)),
        }
    }
}

/// What the pre-reboot gates of `ch` say about a claim now ([`crate::agent::channel::gates`]).
async fn gates_verdict(cx: &Agent, ch: &Channel) -> Verdict {
    let Ok(policy) = ch.policy.as_ref() else {
        return Verdict::Open;
    };
    match crate::agent::cluster::gate_probe::check(
        &cx.clients.client,
        &cx.settings.node,
        &policy.gates,
    )
    .await
    {
        None => Verdict::Open,
        Some(why) => Verdict::Closed(why),
    }
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

/// The channels of the namespace, with those this agent cannot use reported on themselves.
async fn sort_channels(cx: &Agent, objects: Vec<DynamicObject>) -> Listed {
    let namespace = &cx.settings.namespace;
    let listed = crate::agent::channel::listing::sort_out(namespace, objects);
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
    super::invalid::report_channels(cx, &listed).await;
    listed
}

/// A `ChannelConflict` Event when several channels select this node (again only when the
/// note changes).
async fn report_conflict(cx: &Agent, picked: &Picked<'_>) {
    if picked.losers.is_empty() {
        return;
    }
    let losers: Vec<String> = picked
        .losers
        .iter()
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    let note = format!(
        "several UpdateChannels select this node; {} wins because {}; not used: {}",
        picked.channel.name(),
        picked.why,
        losers.join(", ")
    );
    let fresh = cx.remember(|m| {
        let fresh = m.last_conflict.as_deref() != Some(note.as_str());
        m.last_conflict = Some(note.clone());
        fresh
    });
    if fresh {
        cx.event(Some(picked.channel), true, "ChannelConflict", note)
            .await;
    }
}

/// This node as the decision sees it (and its metrics), or `None` while its boot is not
/// assessed (reported once, then waited out).
async fn node_view(
    cx: &Agent,
    node: &Node,
    channel: &Channel,
) -> Result<Option<NodeView>, AgentError> {
    let update = match cx.blocking(|ops| ops.status()).await {
        Err(AgentError::Node(e)) if e.is_not_assessed() => {
            assessment::report_not_assessed(cx, node, Some(channel), &e).await?;
            return Ok(None);
        }
        other => other?,
    };
    assessment::clear_not_assessed(cx, node).await?;
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
    metrics.reconciled(true);
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    // The fleet counter reads the booted version from the Node (written once per boot).
    let booted = update.booted_version.as_deref();
    if booted.is_some() && annotations.get(ANN_VERSION).map(String::as_str) != booted {
        cx.annotate(&[(ANN_VERSION, booted)]).await?;
    }
    Ok(Some(NodeView {
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
        update,
    }))
}

/// Carry out `step`'s action, one function each; a waiting one is worded by
/// [`super::waits`]. Returns what happened, for [`carry_out`] to publish.
pub(in crate::agent) async fn execute(
    cx: &Agent,
    ch: &Channel,
    view: &NodeView,
    step: Step,
    resolved: Option<Release>,
) -> Result<Done, AgentError> {
    if let Some(report) = super::waits::report(&step.action, Utc::now()) {
        return Ok(Done::report(report, Then::Wait));
    }
    let store = cx.store(ch.name());
    let token = view.token.clone().unwrap_or_default();
    match step.action {
        Action::Idle(reason) => actions::tick_idle(cx, ch, reason).await,
        Action::Invalid(msg) => Ok(actions::tick_invalid(ch, &msg)),
        Action::Stage { version } => match step.stage {
            Some(plan) => stage(cx, ch, view, &version, plan, resolved).await,
            None => Ok(Done::then(Then::Wait)),
        },
        // Reported above; a stage back-off is waited out quietly.
        Action::Paused { .. }
        | Action::PausedBySpec { .. }
        | Action::Withdrawn { .. }
        | Action::WaitForWave { .. }
        | Action::WaitForChannelWave { .. }
        | Action::WaitForWindow { .. }
        | Action::WaitForSlot { .. }
        | Action::WaitForGate { .. }
        | Action::ClaimBackingOff { .. }
        | Action::StageWaiting { .. }
        | Action::StageBackingOff { .. } => Ok(Done::then(Then::Wait)),
        Action::DropWithdrawn { version } => super::withdrawn::tick_drop(cx, ch, &version).await,
        // decide() answered the facts it needs before returning.
        Action::Gather(_) => Ok(Done::then(Then::Again)),
        // The claim itself is a compare-and-swap on a fresh read.
        Action::Claim { version } => actions::tick_claim(cx, ch, &store, &version).await,
        Action::Forfeit { version } => actions::tick_forfeit(cx, ch, &store, &version).await,
        Action::Continue { phase, version } => match phase {
            SlotPhase::Claimed | SlotPhase::Draining => {
                steps::disrupt(cx, ch, &store, view, &token, &version).await
            }
            SlotPhase::Rebooting => steps::flip_and_reboot(cx, ch, &store, &token, &version).await,
            SlotPhase::RollingBack => Ok(actions::tick_reboot_back(&version)),
        },
        Action::Confirm { version, held } => {
            steps::confirm(cx, ch, &store, &token, &version, held).await
        }
        Action::RolledBack { version } => {
            actions::tick_rolled_back(cx, ch, &store, view, &token, &version).await
        }
        Action::FinishRollback => actions::tick_finish_rollback(cx, &store, &token).await,
        Action::Release { reason } => actions::tick_release(cx, &store, &token, &reason).await,
    }
}

/// Stage per `plan`; when the stage stops cleanly (the quota or the windows' end), decide
/// again with the bytes fetched by then: waiting is published, a next stretch that begins at
/// once goes on at the next reconcile.
async fn stage(
    cx: &Agent,
    ch: &Channel,
    view: &NodeView,
    version: &str,
    plan: super::decide::StagePlan,
    resolved: Option<Release>,
) -> Result<Done, AgentError> {
    match super::staging::stage(cx, ch, version, plan, resolved).await? {
        super::staging::Staging::Done(done) => Ok(done),
        super::staging::Staging::Stopped => {
            let (step, _) = decide(cx, ch, view).await?;
            match super::waits::report(&step.action, Utc::now()) {
                Some(report) if matches!(step.action, Action::StageWaiting { .. }) => {
                    Ok(Done::report(report, Then::Wait))
                }
                _ => Ok(Done::then(Then::Again)),
            }
        }
    }
}
