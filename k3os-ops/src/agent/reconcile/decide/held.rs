//! What the decision sees besides the channel and the node ([`Inputs`], gathered by the
//! controller) and the part of it that holds a claim or a stage back: every slot taken, a
//! pre-reboot gate closed, a back-off running, the thin-link settings (stage windows, daily
//! quota), a pinned release the channel's rollout holds back ([`pin_gate`]). Pure, like the rest
//! of [`super`].

use chrono::{DateTime, Utc};
use libupgrade::Release;

use super::{Action, IdleReason, Policy};
use crate::agent::channel::crd::UpdateChannel;
use crate::agent::channel::fleet_pinned::waiting_message;
use crate::agent::channel::latest::Latest;
use crate::agent::channel::pinned::Pinned;
use crate::agent::channel::thin::Gate;

/// A fact [`super::step`] needs before it can decide, fetched only then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// The pre-reboot gates' verdict ([`crate::agent::cluster::gate_probe::check`]).
    Gates,
    /// The bytes fetched on the quota day `day` (the node's ledger).
    FetchedOn(chrono::NaiveDate),
    /// What this node itself resolves `latest` to through the channel's signed metadata, for
    /// the cluster's seed: a claim for `status.latestVersion` waits until it agrees (the status
    /// is written by whichever agent holds the poller Lease, and no admission policy can tell
    /// who that is), and is never made for a release the channel withdrew.
    OwnLatest,
    /// Whether the channel's rollout offers the pinned version to this cluster, as this node
    /// resolves it itself (looking only, the cluster's seed), before it starts staging or claims a
    /// pinned release the status does not hold back (the poller may not have looked since the
    /// pin, or since the channel withdrew it).
    OwnPinned,
}

/// What this node's own resolution says of the pinned version ([`Need::OwnPinned`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PinVerdict {
    /// Not asked yet.
    #[default]
    Unknown,
    /// Offered to this cluster now (or `spec.ignoreRollout` takes it anyway).
    Offered,
    /// Held back by the channel's rollout; the text says why and until when.
    Held(String),
    /// Withdrawn by the channel.
    Withdrawn,
    /// The channel could not be resolved (the text says why): the stage goes ahead and
    /// reports what fails, or stages from an offline bundle, as before pins were checked.
    Unresolved(String),
}

impl PinVerdict {
    /// The verdict of a resolution of the pinned release for the cluster placed at `seed`.
    pub fn of(resolved: Result<&Pinned, String>, seed: libupgrade::rollout::Seed) -> PinVerdict {
        match resolved {
            Err(e) => PinVerdict::Unresolved(e),
            Ok(p) if p.is_withdrawn() => PinVerdict::Withdrawn,
            Ok(Pinned {
                version,
                hold: Some(h),
                ..
            }) => PinVerdict::Held(waiting_message(version, h, seed)),
            Ok(_) => PinVerdict::Offered,
        }
    }
}

/// What the pre-reboot gates say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Verdict {
    /// Not asked yet.
    #[default]
    Unknown,
    /// Nothing blocks a claim.
    Open,
    /// A gate blocks it; the text names the gate.
    Closed(String),
}

/// What the decision sees besides the channel and the node, gathered by the controller.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inputs {
    /// Wall-clock time (maintenance windows, slot holding).
    pub now: DateTime<Utc>,
    /// The stage's clock (stage windows, the quota day, the stage back-off).
    pub stage_now: DateTime<Utc>,
    /// No claim before this time (back-off after an aborted update attempt).
    pub claim_not_before: Option<DateTime<Utc>>,
    /// No stage before this time (back-off after a failed stage).
    pub stage_not_before: Option<DateTime<Utc>>,
    /// The pre-reboot gates' verdict.
    pub gates: Verdict,
    /// Bytes fetched on the quota day, once read (`None`: not read yet).
    pub fetched_today: Option<u64>,
    /// What this node resolved `latest` to itself for the cluster's seed, once asked (`None`:
    /// not asked yet; `Err`: the resolution's error), with the releases the channel withdrew.
    pub own_latest: Option<Result<Latest, String>>,
    /// What this node resolved the pinned version to itself, once asked.
    pub own_pin: PinVerdict,
    /// The release that resolution found, when it offers the version: a stage of it rides
    /// in [`Action::Stage`].
    pub pinned_release: Option<Release>,
}

impl Inputs {
    /// Nothing held back at `now` (one clock): no back-off, the gates open, nothing fetched
    /// today, a pinned version offered. What [`super::decide()`] assumes.
    #[cfg(test)]
    pub fn open_at(now: DateTime<Utc>) -> Inputs {
        Inputs {
            now,
            stage_now: now,
            gates: Verdict::Open,
            fetched_today: Some(0),
            own_latest: None,
            own_pin: PinVerdict::Offered,
            ..Inputs::default()
        }
    }
}

/// How a stage that [`super::step`] allows runs: within the open stage windows and what today's
/// quota leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct StagePlan {
    /// The stage windows' schedule (None: no end).
    pub schedule: Option<libupgrade::Schedule>,
    /// What today's quota leaves (None: no quota).
    pub max_bytes: Option<u64>,
    /// The quota day the fetched bytes are booked on (None: no quota).
    pub day: Option<chrono::NaiveDate>,
    /// Bytes fetched on that day so far.
    pub fetched_today: u64,
}

/// A claim (new, forfeit or taking a slot over) as the channel, the gates and the back-off
/// allow it: every slot taken, a gate closed, or the back-off running hold it back.
pub(super) fn hold_claim(
    channel: &UpdateChannel,
    policy: &Policy,
    action: Action,
    inputs: &Inputs,
) -> Action {
    let claims = matches!(
        action,
        Action::Claim { .. } | Action::Forfeit { .. } | Action::Idle(IdleReason::ForeignSlot)
    );
    if let Action::Claim { version } = &action {
        if let Some(holders) = full_as_read(channel) {
            return Action::WaitForSlot { holders };
        }
        if !policy.gates.is_empty() {
            match &inputs.gates {
                Verdict::Unknown => return Action::Gather(Need::Gates),
                Verdict::Closed(why) => {
                    return Action::WaitForGate {
                        version: version.clone(),
                        why: why.clone(),
                    }
                }
                Verdict::Open => {}
            }
        }
        if channel.spec.pinned_version().is_none() {
            // A claim is the first disruptive step: `status.latestVersion` must be what this
            // node's own signed channel metadata names, not only what another agent wrote.
            // A withdrawn release is never claimed, whatever the status says.
            let why = match &inputs.own_latest {
                None => return Action::Gather(Need::OwnLatest),
                Some(Ok(own)) if own.withdraws(version) => {
                    return Action::Withdrawn {
                        version: version.clone(),
                    }
                }
                Some(Ok(own)) if own.version == *version => None,
                Some(Ok(own)) => Some(format!(
                    "status.latestVersion names {version}, but this node's signed channel metadata offers {}",
                    own.version
                )),
                Some(Err(e)) => Some(format!(
                    "cannot check status.latestVersion ({version}) against the signed channel: {e}"
                )),
            };
            if let Some(why) = why {
                return Action::WaitForGate {
                    version: version.clone(),
                    why,
                };
            }
        } else if let Some(held) = pin_claim(version, &inputs.own_pin) {
            return held;
        }
    }
    match inputs.claim_not_before.filter(|t| inputs.now < *t) {
        Some(until) if claims => Action::ClaimBackingOff { until },
        _ => action,
    }
}

/// A claim of the pinned `version` as this node's own resolution allows it (asked before every
/// claim: the poller may not have published a withdrawal yet): withdrawn, never claimed; held
/// back (which libupgrade says of a staged release only when withdrawn, as it lets a release a
/// node started go on), a wait; offered or not resolvable (an offline site staging from a
/// bundle), the claim goes ahead as before pins were checked.
fn pin_claim(version: &str, own: &PinVerdict) -> Option<Action> {
    let version = version.to_string();
    match own {
        PinVerdict::Unknown => Some(Action::Gather(Need::OwnPinned)),
        PinVerdict::Withdrawn => Some(Action::Withdrawn { version }),
        PinVerdict::Held(why) => Some(Action::WaitForChannelWave {
            version,
            why: why.clone(),
        }),
        PinVerdict::Offered | PinVerdict::Unresolved(_) => None,
    }
}

/// The holders of `channel`'s slots as read when every slot of its `concurrency` is taken.
fn full_as_read(channel: &UpdateChannel) -> Option<Vec<String>> {
    let slots = &channel.status.as_ref()?.slots;
    (slots.len() >= channel.spec.concurrency.max(1) as usize)
        .then(|| slots.iter().map(|s| s.node.clone()).collect())
}

/// A stage of `version` as the back-off and the thin-link settings (stage windows, daily
/// quota) allow it, and how it runs.
pub(super) fn stage_gate(
    policy: &Policy,
    version: String,
    retry: Option<String>,
    inputs: &Inputs,
) -> (Action, Option<StagePlan>) {
    let now = inputs.stage_now;
    if let Some(until) = inputs.stage_not_before.filter(|t| now < *t) {
        return (Action::StageBackingOff { until }, None);
    }
    let thin = &policy.thin;
    let day = thin.max_bytes_per_day.map(|_| thin.day(now));
    let fetched_today = match (day, inputs.fetched_today) {
        (None, _) => 0,
        (Some(_), Some(n)) => n,
        (Some(d), None) => return (Action::Gather(Need::FetchedOn(d)), None),
    };
    match thin.gate(now, fetched_today) {
        Gate::Wait { why, until } => (
            Action::StageWaiting {
                version,
                why,
                until,
            },
            None,
        ),
        Gate::Stage {
            schedule,
            max_bytes,
        } => (
            Action::Stage {
                version,
                release: None,
                retry,
            },
            Some(StagePlan {
                schedule,
                max_bytes,
                day,
                fetched_today,
            }),
        ),
    }
}

/// A stage of a pinned release that [`stage_gate`] allows, as this node's own resolution of it
/// allows it ([`Need::OwnPinned`], asked only now: last, so a stage that waits anyway costs no
/// resolution): held back by the channel's rollout, a wait ([`Action::WaitForChannelWave`]);
/// withdrawn, [`Action::Withdrawn`]; not resolvable, the stage goes ahead as before.
pub(super) fn pin_gate(
    channel: &UpdateChannel,
    staged: (Action, Option<StagePlan>),
    inputs: &Inputs,
) -> (Action, Option<StagePlan>) {
    let version = match &staged.0 {
        Action::Stage { version, .. } if channel.spec.pinned_version().is_some() => version.clone(),
        _ => return staged,
    };
    match &inputs.own_pin {
        PinVerdict::Unknown => (Action::Gather(Need::OwnPinned), None),
        PinVerdict::Held(why) => (
            Action::WaitForChannelWave {
                version,
                why: why.clone(),
            },
            None,
        ),
        PinVerdict::Withdrawn => (Action::Withdrawn { version }, None),
        PinVerdict::Offered => match staged {
            (Action::Stage { version, retry, .. }, plan) => (
                Action::Stage {
                    version,
                    release: inputs.pinned_release.clone().map(Box::new),
                    retry,
                },
                plan,
            ),
            other => other,
        },
        PinVerdict::Unresolved(_) => staged,
    }
}
