//! One reconcile of the agent: the read phase ([`super::observe`]: read the Node and the
//! channels, pick this node's channel, build the [`NodeView`]) returns what it saw, published
//! in one place (`observe::publish`); then gather the decision's
//! [`Inputs`] (the back-offs from memory; the gates' verdict and today's fetched bytes only
//! when [`super::decide::step`] asks for them), ask it for the next step and dispatch it to
//! the one function that carries it out ([`super::waits`] for what a waiting step says,
//! [`super::actions`] for the bookkeeping actions, [`super::steps`] for stage and the
//! disruptive steps). Nothing here decides: the dispatch is one match, like Zincati's actor.

use chrono::Utc;

use super::actions;
use super::decide::{Action, Inputs, Need, PinVerdict, Step, Verdict};
use super::observe::Ready;
use super::steps;
use super::tick::Tick;
use crate::agent::channel::crd::SlotPhase;
use crate::agent::cluster::publish::{Done, Mark, Say, Then};
use crate::agent::context::{Agent, Next};
use crate::agent::errors::AgentError;
use crate::agent::host::requests::{resolve_latest, resolve_pinned};
use libupgrade::Release;

impl Agent {
    /// One decision and its execution.
    pub async fn reconcile(&self) -> Result<Next, AgentError> {
        reconcile(self).await
    }
}

/// One decision and its execution (see the module docs).
pub async fn reconcile(cx: &Agent) -> Result<Next, AgentError> {
    let (seen, ready) = super::observe::observe(cx).await?;
    super::observe::publish(cx, &seen).await?;
    let Some(Ready { channel, view }) = ready else {
        return Ok(Next::Wait);
    };
    let t = Tick::new(cx, &channel, &view);
    let step = decide(&t).await?;
    tracing::debug!(?step, channel = %channel.name(), "decided");
    if step.undo_cordon {
        if let Some(said) = cx.undo_cordon().await? {
            cx.say(&channel, said).await;
        }
    }
    let done = execute(&t, step).await?;
    carry_out(&t, done).await
}

/// Publish what a tick did, once and in order (its conditions and annotations, its Events,
/// its phase), then do what follows it.
async fn carry_out(t: &Tick<'_>, done: Done) -> Result<Next, AgentError> {
    let Tick { cx, ch, .. } = *t;
    mark(t, done.marks).await?;
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

/// Publish `marks` in order: conditions and annotations.
async fn mark(t: &Tick<'_>, marks: Vec<Mark>) -> Result<(), AgentError> {
    let Tick { cx, ch, .. } = *t;
    for mark in marks {
        match mark {
            Mark::StageDeadline(miss) => super::thin_report::report_miss(cx, ch, miss).await,
            Mark::Stale(stale) => cx.report_stale(ch, stale.as_ref()).await,
            Mark::Annotation(key, value) => cx.annotate(&[(key, value.as_deref())]).await?,
        }
    }
    Ok(())
}

/// The decision for `view` under `ch`, with the inputs it asks for gathered (the release a
/// pinned version's own check resolved among them: a stage of it carries it in
/// [`Action::Stage`], and does not resolve the channel again).
async fn decide(t: &Tick<'_>) -> Result<Step, AgentError> {
    let Tick { cx, ch, view, .. } = *t;
    let now = Utc::now();
    let stage_now = cx.settings.clock.now();
    let (claim_not_before, stage_not_before) =
        cx.remember(|m| (m.claims.waits_until(now), m.stages.waits_until(stage_now)));
    let mut inputs = Inputs {
        now,
        stage_now,
        claim_not_before,
        stage_not_before,
        ..Inputs::default()
    };
    loop {
        let step = super::decide::step(ch, &ch.policy, view, &inputs);
        match step.action {
            Action::Gather(Need::Gates) => inputs.gates = gates_verdict(t).await,
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
                inputs.pinned_release = own.ok().and_then(|p| p.release);
            }
            Action::Gather(Need::FetchedOn(day)) => {
                let fetched = cx.blocking(move |ops| ops.fetched_on(day)).await?;
                inputs.fetched_today = Some(fetched);
            }
            _ => return Ok(step),
        }
    }
}

/// What the pre-reboot gates of `ch` say about a claim now ([`crate::agent::channel::gates`]).
async fn gates_verdict(t: &Tick<'_>) -> Verdict {
    let Tick { cx, ch, .. } = *t;
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

/// Carry out `step`'s action, one function each; a waiting one is worded by
/// [`super::waits`]. Returns what happened, for [`carry_out`] to publish.
pub(in crate::agent) async fn execute(t: &Tick<'_>, step: Step) -> Result<Done, AgentError> {
    if let Some(report) = super::waits::report(&step.action, Utc::now()) {
        return Ok(Done::report(report, Then::Wait));
    }
    match step.action {
        Action::Idle(reason) => actions::tick_idle(t, reason).await,
        Action::Invalid(msg) => Ok(actions::tick_invalid(t.ch, &msg)),
        Action::Stage {
            version,
            release,
            retry,
        } => match step.stage {
            Some(plan) => stage(t, &version, plan, release.map(|r| *r), retry).await,
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
        Action::DropWithdrawn { version } => super::withdrawn::tick_drop(t, &version).await,
        // decide() answered the facts it needs before returning.
        Action::Gather(_) => Ok(Done::then(Then::Again)),
        // The claim itself is a compare-and-swap on a fresh read.
        Action::Claim { version } => actions::tick_claim(t, &version).await,
        Action::Forfeit { version } => actions::tick_forfeit(t, &version).await,
        Action::Continue { phase, version } => match phase {
            SlotPhase::Claimed | SlotPhase::Draining => steps::disrupt(t, &version).await,
            SlotPhase::Rebooting => steps::flip_and_reboot(t, &version).await,
            SlotPhase::RollingBack => Ok(actions::tick_reboot_back(&version)),
        },
        Action::Confirm { version, held } => steps::confirm(t, &version, held).await,
        Action::RolledBack { version } => actions::tick_rolled_back(t, &version).await,
        Action::FinishRollback => actions::tick_finish_rollback(t).await,
        Action::Release { reason } => actions::tick_release(t, &reason).await,
    }
}

/// Stage per `plan`, publishing what comes before its first byte (the target annotation, the
/// announcement, the preview and its deadline condition: [`super::staging`] says what);
/// when the stage stops cleanly (the quota or the windows' end), decide again with the bytes
/// fetched by then: waiting is published, a next stretch that begins at once goes on at the
/// next reconcile.
async fn stage(
    t: &Tick<'_>,
    version: &str,
    plan: super::decide::StagePlan,
    resolved: Option<Release>,
    retry: Option<String>,
) -> Result<Done, AgentError> {
    let Tick { cx, ch, .. } = *t;
    let now = cx.settings.clock.now();
    // Published before the first byte: the target and the announcement (with a retry the
    // rollout allows, an Event saying so), then what the resolved release's preview says (and
    // the deadline it implies).
    let (target, announcement) = super::staging::announcement(ch, version);
    mark(t, vec![target]).await?;
    let retrying = retry.map(|note| Say::info("Retrying", note).once());
    cx.announce(ch, retrying.into_iter().collect(), announcement)
        .await?;
    let ready = super::staging::prepare(t, version, plan, resolved).await;
    if let Ok(r) = &ready {
        if let Some(p) = &r.preview {
            super::thin_report::publish_preview(cx, ch, p).await;
        }
        mark(t, r.deadline.clone().into_iter().collect()).await?;
    }
    match super::staging::run(t, version, now, ready).await? {
        super::staging::Staging::Done(done) => Ok(done),
        super::staging::Staging::Stopped(marks) => {
            let step = decide(t).await?;
            let done = match super::waits::report(&step.action, Utc::now()) {
                Some(report) if matches!(step.action, Action::StageWaiting { .. }) => {
                    Done::report(report, Then::Wait)
                }
                _ => Done::then(Then::Again),
            };
            Ok(done.marked(marks))
        }
    }
}
