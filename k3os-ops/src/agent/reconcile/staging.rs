//! The stage step: download, verify and write the target into the inactive slot, following
//! the channel's thin-link settings ([`crate::agent::channel::thin`]).
//!
//! Whether a stage may run now is [`super::decide::step`]'s call (the back-off, the stage
//! windows, today's quota read from the node's ledger): it hands over a
//! [`StagePlan`], or decides `StageWaiting`, whose phase says why and until when (every
//! reconcile asks again, so a spec change is seen at once). Here, each returning what the
//! controller publishes: the target annotation and the announcement ([`announcement`]);
//! resolve the release once (the node's offline bundle of it, the release a pinned version's
//! own check resolved in this tick, else one resolution of the channel:
//! [`crate::agent::host::requests::for_stage`]) and preview it ([`prepare`]: the preview —
//! annotation, gauge, `slot status` — and whether what is left can arrive before the next
//! maintenance window, condition `StageWillMissWindow`); then stage within the plan's open
//! windows and the quota's budget ([`run`]). A clean stop at the quota or the windows' end is
//! `Staging::Stopped` (the controller decides again, normally `StageWaiting`), never a
//! failure: no `StageFailed`, no `k3os_ops_stage_failures_total`, no back-off, nothing in
//! `status.failures`; the next stage resumes where it stopped.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::decide::StagePlan;
use super::tick::Tick;
use crate::agent::channel::format::{ANN_PROGRESS, ANN_TARGET};
use crate::agent::channel::listing::Channel;
use crate::agent::channel::thin::Miss;
use crate::agent::channel::thin::ThinPolicy;
use crate::agent::cluster::publish::{Done, Mark, Report, Say, Then};
use crate::agent::context::{Agent, PROGRESS_PERIOD};
use crate::agent::errors::AgentError;
use crate::agent::host::ops::StageEnd;
use crate::agent::host::requests::for_stage;
use crate::agent::host::stage_progress::AnnotationProgress;
use crate::agent::phase::Phase;
use libupgrade::state::ledger::PreviewRecord;
use libupgrade::Stop;
use libupgrade::{ExtraSource, Release, StageOptions, StageRequest, Wanted};

/// How a stage step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) enum Staging {
    /// Staged, or failed (backing off): what to publish and what follows.
    Done(Done),
    /// Stopped cleanly at the quota or the end of the open windows: the deadline judged
    /// again with what is left, and whether the channel's metadata is fresh.
    Stopped(Vec<Mark>),
}

/// What a stage announces before it starts, for the controller to publish: the target
/// annotation, then the `Staging` report.
pub(in crate::agent) fn announcement(ch: &Channel, version: &str) -> (Mark, Report) {
    let staging = Report::new(
        Phase::Staging,
        "downloading and verifying into the inactive slot",
        Say::info(
            "Staging",
            format!(
                "staging {version} from {} into the inactive slot",
                ch.spec.url
            ),
        ),
    );
    (
        Mark::Annotation(ANN_TARGET, Some(version.to_string())),
        staging,
    )
}

/// A stage resolved and previewed, before its first byte: what the controller publishes
/// then (the preview and the deadline condition it implies), and what the stage runs.
pub(in crate::agent) struct Ready {
    /// What the stage will fetch and reuse (None where the node cannot tell).
    pub preview: Option<PreviewRecord>,
    /// Whether what is left can arrive before the next maintenance window.
    pub deadline: Option<Mark>,
    rel: Release,
    opts: StageOptions,
    book_on: Option<chrono::NaiveDate>,
}

/// Resolve `version` of `ch` once (`release`: the channel's release of it this tick already
/// resolved, a pinned version's own check, taken instead of resolving again) and preview its
/// stage as `plan` allows.
pub(in crate::agent) async fn prepare(
    t: &Tick<'_>,
    version: &str,
    plan: StagePlan,
    release: Option<Release>,
) -> Result<Ready, AgentError> {
    let cx = t.cx;
    let StagePlan {
        schedule,
        max_bytes,
        day,
        fetched_today: used,
    } = plan;
    let req = request(t, version, schedule, max_bytes);
    let (rel, opts, preview) = cx
        .blocking(move |ops| {
            let rel = for_stage(ops, &req, release)?;
            let preview = ops.preview(&rel, &req.options)?;
            Ok((rel, req.options, preview))
        })
        .await?;
    let deadline = preview.as_ref().and_then(|p| deadline(t, p.fetch, used));
    Ok(Ready {
        preview,
        deadline,
        rel,
        opts,
        book_on: day,
    })
}

/// Stage what [`prepare`] made `ready` (or its failure), started at `now`; returns how it
/// ended, for the controller to publish.
pub(in crate::agent) async fn run(
    t: &Tick<'_>,
    version: &str,
    now: DateTime<Utc>,
    ready: Result<Ready, AgentError>,
) -> Result<Staging, AgentError> {
    let cx = t.cx;
    let result = match ready {
        Ok(r) => stage_with_progress(cx, r.rel, r.opts, r.book_on).await,
        Err(e) => Err(e),
    };
    let stale: Vec<Mark> = staleness(&result).into_iter().collect();
    match result {
        Ok(StageEnd::Staged { .. }) => Ok(Staging::Done(staged(cx, version).marked(stale))),
        Ok(StageEnd::Stopped { why, left, .. }) => {
            cx.remember(|m| m.stages.succeeded());
            let mut marks = stopped(t, version, why, left).await?;
            marks.extend(stale);
            Ok(Staging::Stopped(marks))
        }
        Err(e) => Ok(Staging::Done(failed(cx, version, now, &e).marked(stale))),
    }
}

/// The one libupgrade request the agent makes to stage `version` of `ch` (the CLI's `upgrade
/// --channel URL --version V` makes the same): the channel's rate cap and sources, the open
/// stage windows and what today's quota has left; an older release only when the channel pins
/// it; bytes or time as `spec.stage.prefer` says; the cluster's seed for the channel's fleet rollouts (ignored only for a pinned version
/// with `spec.ignoreRollout`). The node adds its offline-bundle
/// directory.
fn request(
    t: &Tick<'_>,
    version: &str,
    schedule: Option<libupgrade::Schedule>,
    max_bytes: Option<u64>,
) -> StageRequest {
    let Tick { cx, ch, .. } = *t;
    let policy = ch.policy.as_ref().ok();
    let req = StageRequest {
        // The cluster's place in the channel's fleet rollouts, as every agent of it resolves.
        seed: Some(crate::agent::channel::fleet_waves::cluster_seed(ch)),
        // Only a pinned channel that says so in its spec (`ignoreRollout`).
        ignore_rollout: ch.spec.ignores_rollout(),
        ..StageRequest::new(Wanted::channel(ch.spec.url.clone(), Some(version)))
    };
    req.with_options(StageOptions {
        allow_downgrade: ch.spec.pinned_version().is_some(),
        max_rate: policy.and_then(|p| p.max_rate),
        max_bytes,
        schedule,
        extra_sources: policy
            .map(|p| {
                p.thin
                    .sources
                    .iter()
                    .map(|s| ExtraSource::parse(s))
                    .collect()
            })
            .unwrap_or_default(),
        clock: cx.settings.clock.clone(),
        prefer: ch
            .spec
            .stage
            .as_ref()
            .and_then(|s| s.prefer)
            .unwrap_or_default()
            .into(),
        ..StageOptions::default()
    })
}

/// Whether `left` bytes can arrive before the next maintenance window: the condition (None:
/// the channel has no thin-link policy to judge by).
fn deadline(t: &Tick<'_>, left: u64, used: u64) -> Option<Mark> {
    let Tick { cx, ch, .. } = *t;
    let policy = ch.policy.as_ref().ok()?;
    let now = cx.settings.clock.now();
    let miss = miss(&policy.thin, policy.next_window_start(now), left, now, used);
    Some(Mark::StageDeadline(miss))
}

/// The miss, if `left` bytes cannot arrive by `deadline` (None: no maintenance window).
fn miss(
    thin: &ThinPolicy,
    deadline: Option<DateTime<Utc>>,
    left: u64,
    now: DateTime<Utc>,
    used: u64,
) -> Option<Miss> {
    let deadline = deadline?;
    let capacity = thin.capacity(now, deadline, used)?;
    thin.will_miss(left, now, deadline, used).then_some(Miss {
        left,
        capacity,
        deadline,
    })
}

/// Staged: the deadline condition cleared, the progress annotation removed.
fn staged(cx: &Agent, version: &str) -> Done {
    cx.remember(|m| m.stages.succeeded());
    let report = Report::new(
        Phase::Staged,
        "verified and staged",
        Say::info(
            "Staged",
            format!("{version} verified and staged in the inactive slot"),
        ),
    );
    Done::report(report, Then::Again).marked(vec![
        Mark::StageDeadline(None),
        Mark::Annotation(ANN_PROGRESS, None),
    ])
}

/// A clean stop at the quota or the end of the open windows: the deadline judged again with
/// what is left (the controller decides how long to wait).
async fn stopped(
    t: &Tick<'_>,
    version: &str,
    why: Stop,
    left: u64,
) -> Result<Vec<Mark>, AgentError> {
    let Tick { cx, ch, .. } = *t;
    tracing::info!("staging {version} stopped ({why})");
    let Ok(policy) = ch.policy.as_ref() else {
        return Ok(Vec::new());
    };
    let thin = &policy.thin;
    let now = cx.settings.clock.now();
    let used = match thin.max_bytes_per_day.map(|_| thin.day(now)) {
        Some(d) => cx.blocking(move |ops| ops.fetched_on(d)).await?,
        None => 0,
    };
    Ok(deadline(t, left, used).into_iter().collect())
}

/// A failed stage: counted, and the next one backs off ([`crate::agent::cooldown`]).
fn failed(cx: &Agent, version: &str, now: DateTime<Utc>, e: &AgentError) -> Done {
    let (n, backoff) = cx.remember(|m| m.stages.failed(now));
    let msg = format!(
        "staging {version} failed (attempt {n}, next in {}s): {}",
        backoff.as_secs(),
        crate::agent::errors::message(e)
    );
    cx.clients
        .metrics
        .count(crate::agent::metrics::Outcome::StageFailure);
    let report = Report::new(
        Phase::StageFailed,
        msg.clone(),
        Say::warn("StageFailed", msg),
    );
    Done::report(report, Then::Wait)
}

/// A stage resolves the channel too (a pinned channel is resolved nowhere else): expired
/// metadata sets `ChannelStale`, a successful stage clears it; other failures say nothing of it.
fn staleness(result: &Result<StageEnd, AgentError>) -> Option<Mark> {
    match result {
        Err(e) => e.stale().map(|s| Mark::Stale(Some(*s))),
        Ok(_) => Some(Mark::Stale(None)),
    }
}

/// Run libupgrade's stage of `rel`, writing its progress annotation on the way.
async fn stage_with_progress(
    cx: &Agent,
    rel: Release,
    opts: StageOptions,
    book_on: Option<chrono::NaiveDate>,
) -> Result<StageEnd, AgentError> {
    let (tx, mut rx) = tokio::sync::watch::channel(String::new());
    rx.mark_unchanged();
    let progress = Arc::new(AnnotationProgress::new(tx, cx.clients.metrics.clone()));
    let p = progress.clone();
    let work = cx.blocking(move |ops| ops.stage(&rel, &opts, book_on, p.as_ref()));
    tokio::pin!(work);
    // The annotation is written at most every PROGRESS_PERIOD (the Node object is shared
    // with the kubelet; a byte counter must not flood the API server).
    let mut last_write: Option<tokio::time::Instant> = None;
    let mut ticker = tokio::time::interval(PROGRESS_PERIOD);
    loop {
        tokio::select! {
            r = &mut work => break r,
            _ = ticker.tick() => {
                let due = last_write.is_none_or(|t| t.elapsed() >= PROGRESS_PERIOD);
                if due && rx.has_changed().unwrap_or(false) {
                    let text = rx.borrow_and_update().clone();
                    if let Err(e) = cx.annotate(&[(ANN_PROGRESS, Some(&text))]).await {
                        tracing::warn!("progress annotation: {e:#}");
                    }
                    last_write = Some(tokio::time::Instant::now());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::channel::crd::{StageSpec, StageWindowSpec, UpdateChannelSpec, WindowSpec};

    #[test]
    fn a_miss_needs_a_maintenance_window_and_too_little_capacity() {
        let spec = UpdateChannelSpec {
            stage: Some(StageSpec {
                windows: vec![StageWindowSpec {
                    window: WindowSpec {
                        days: vec![],
                        start: "01:00".into(),
                        length: "1h".into(),
                        time_zone: None,
                    },
                    max_rate: Some("1M".into()),
                }],
                max_bytes_per_day: None,
                prefer: None,
            }),
            ..Default::default()
        };
        let thin = ThinPolicy::from_spec(&spec, None).unwrap();
        let now = DateTime::parse_from_rfc3339("2026-12-03T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let deadline = now + chrono::Duration::days(1);
        let per_night = 3600u64 << 20;
        assert_eq!(
            miss(&thin, None, u64::MAX, now, 0),
            None,
            "no window: no deadline"
        );
        assert_eq!(miss(&thin, Some(deadline), per_night, now, 0), None);
        assert_eq!(
            miss(&thin, Some(deadline), per_night + 1, now, 0),
            Some(Miss {
                left: per_night + 1,
                capacity: per_night,
                deadline
            })
        );
    }
}
