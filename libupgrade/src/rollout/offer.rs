//! The pure decision: which release a node is offered now, which newer one it waits for and
//! until when, and whether it must drop what it staged.
//!
//! Rules, in the order they apply to one release:
//! 1. Rollout data this build cannot read (a newer format, broken rules) admits nobody: the
//!    publisher's intent cannot be known, and taking a release early is the harm waves exist
//!    to prevent. The release is reported as held with the reason.
//! 2. Withdrawn: never offered, never reported as awaited; a node that staged it is told to
//!    drop it ([`Offer::drop_staged`]). A node that runs it keeps running it: withdrawal does
//!    not roll back (the publisher rolls those nodes back by publishing a newer release, e.g.
//!    the previous content under a higher generation).
//! 3. Started (the node staged it): offered, through a pause, so a node half-way is not left
//!    with a staged slot it may not activate. "Started" is the node's own view, an input.
//! 4. Paused (since a time not after now): not offered to a node that has not started it.
//! 5. The wave: offered once the schedule, shifted by every closed pause, admits the seed.
//!
//! Across releases: candidates are the releases newer (by generation) than the running one,
//! newest first. For each, its required stops are walked down (`from_at_least`, then the
//! stop's own, …) to the oldest stop the node has not passed; that first step must itself be
//! admitted by the rules above (a withdrawn or paused stop holds every release behind it).
//! The first candidate whose first step is admitted is offered, as that step; the newest
//! candidate above it that is held (not withdrawn) is reported in [`Offer::waiting`].

use chrono::{DateTime, Duration, Utc};

use super::plan::Rollout;
use super::schedule;
use super::seed::Seed;

/// A release a node runs or staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Its version as the channel lists it.
    pub version: String,
    /// Its generation.
    pub generation: u64,
}

/// What the decision knows of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its seed.
    pub seed: Seed,
    /// The release it runs.
    pub running: Installed,
    /// The release staged in its other slot, if any (the node has "started" it).
    pub staged: Option<Installed>,
}

/// A release as the channel's signed metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its version.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// Its rollout data; `None`: the whole fleet at once.
    pub rollout: Option<Rollout>,
}

/// Why a release is not offered to a node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// The node's wave has not reached it; `starts` is when it will (`None`: never, which
    /// valid data cannot say).
    Wave {
        /// When this seed is admitted, if the rollout is not paused before.
        starts: Option<DateTime<Utc>>,
    },
    /// Paused and not started by this node.
    Paused {
        /// Since when.
        since: DateTime<Utc>,
    },
    /// Withdrawn (reported only as the reason a required stop holds a newer release).
    Withdrawn {
        /// Since when.
        at: DateTime<Utc>,
    },
    /// Rollout data this build cannot use.
    Unreadable {
        /// What is wrong.
        what: String,
    },
    /// A required stop on the way is not offered.
    Stop {
        /// The stop's version.
        version: String,
        /// Why it is not offered.
        hold: Box<Hold>,
    },
    /// A required stop is not in the channel.
    StopMissing {
        /// The stop's version.
        version: String,
        /// Its generation.
        generation: u64,
    },
}

impl std::fmt::Display for Hold {
    /// One line for `upgrade`, `release resolve` and the agent's conditions, e.g. "this node's
    /// wave starts at 2026-12-08 06:12:00 UTC".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hold::Wave { starts: Some(at) } => write!(f, "this node's wave starts at {at}"),
            Hold::Wave { starts: None } => write!(f, "no wave of this rollout reaches this node"),
            Hold::Paused { since } => write!(f, "the rollout is paused since {since}"),
            Hold::Withdrawn { at } => write!(f, "withdrawn at {at}"),
            Hold::Unreadable { what } => write!(f, "rollout data not usable: {what}"),
            Hold::Stop { version, hold } => write!(f, "required stop {version:?} is held: {hold}"),
            Hold::StopMissing {
                version,
                generation,
            } => write!(
                f,
                "required stop {version:?} (generation {generation}) is not in the channel"
            ),
        }
    }
}

/// The release to stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Its version.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// When it is a required stop: the newer release it leads to.
    pub toward: Option<String>,
}

/// A newer release than the offered one that the node waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Its version.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// Why it is not offered now.
    pub hold: Hold,
}

/// The decision for one node at one time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Offer {
    /// What to stage (`None`: nothing newer than the running release is offered).
    pub take: Option<Step>,
    /// The newest release above `take` (or the running one) that is held, and why.
    pub waiting: Option<Waiting>,
    /// The staged release is withdrawn: drop it (never activate it).
    pub drop_staged: Option<Installed>,
}

/// Whether `listed` is offered to a node with `seed` at `now`; `started`: the node staged it.
/// `Ok(())`: admitted. Also what an explicit `--version` checks before skipping waves.
pub fn admission(
    seed: Seed,
    now: DateTime<Utc>,
    listed: &Listed,
    started: bool,
) -> Result<(), Hold> {
    let Some(r) = &listed.rollout else {
        return Ok(());
    };
    if let Err(e) = r.validate(listed.generation) {
        return Err(Hold::Unreadable {
            what: format!("release {:?}: {e}", listed.version),
        });
    }
    if let Some(w) = r.withdrawn {
        return Err(Hold::Withdrawn { at: w.at });
    }
    if started {
        return Ok(());
    }
    if let Some(p) = r.paused.filter(|p| p.since <= now) {
        return Err(Hold::Paused { since: p.since });
    }
    if seed.get() < schedule::threshold(&r.waves, r.schedule_time(now)) {
        return Ok(());
    }
    let shift = Duration::seconds(i64::try_from(r.paused_secs).unwrap_or(i64::MAX));
    Err(Hold::Wave {
        starts: schedule::admits_from(&r.waves, seed.get())
            .and_then(|t| t.checked_add_signed(shift)),
    })
}

/// The offer for `node` at `now` among `releases` (any order; see the module docs).
pub fn offer(node: &Node, now: DateTime<Utc>, releases: &[Listed]) -> Offer {
    let started = |l: &Listed| {
        node.staged
            .as_ref()
            .is_some_and(|s| s.version == l.version && s.generation == l.generation)
    };
    let drop_staged = releases
        .iter()
        .find(|l| started(l))
        .filter(|l| l.rollout.as_ref().is_some_and(|r| r.withdrawn.is_some()))
        .and(node.staged.clone());
    let mut candidates: Vec<&Listed> = releases
        .iter()
        .filter(|l| l.generation > node.running.generation)
        .collect();
    candidates.sort_by_key(|l| std::cmp::Reverse(l.generation));

    let mut waiting = None;
    let mut take = None;
    for c in candidates {
        let admitted = first_step(c, releases, node.running.generation).and_then(|step| {
            admission(node.seed, now, step, started(step))
                .map(|()| step)
                .map_err(|hold| match std::ptr::eq(step, c) {
                    true => hold,
                    false => Hold::Stop {
                        version: step.version.clone(),
                        hold: Box::new(hold),
                    },
                })
        });
        match admitted {
            Ok(step) => {
                take = Some(Step {
                    version: step.version.clone(),
                    generation: step.generation,
                    toward: (!std::ptr::eq(step, c)).then(|| c.version.clone()),
                });
                break;
            }
            Err(Hold::Withdrawn { .. }) => {}
            Err(hold) => {
                waiting.get_or_insert(Waiting {
                    version: c.version.clone(),
                    generation: c.generation,
                    hold,
                });
            }
        }
    }
    Offer {
        take,
        waiting,
        drop_staged,
    }
}

/// The oldest required stop on the way to `target` that a node running `running` has not
/// passed (`target` itself when there is none).
fn first_step<'a>(target: &'a Listed, all: &'a [Listed], running: u64) -> Result<&'a Listed, Hold> {
    let mut step = target;
    // Each stop is strictly older than the release naming it (checked below), so the walk
    // ends; the bound is a second guard.
    for _ in 0..=all.len() {
        let floor = step.rollout.as_ref().and_then(|r| r.from_at_least.as_ref());
        let Some(f) = floor.filter(|f| f.generation > running) else {
            return Ok(step);
        };
        let missing = || Hold::StopMissing {
            version: f.version.clone(),
            generation: f.generation,
        };
        let next = all
            .iter()
            .find(|l| l.version == f.version)
            .ok_or_else(missing)?;
        if next.generation != f.generation || next.generation >= step.generation {
            return Err(Hold::Unreadable {
                what: format!(
                    "release {:?} requires {:?} at generation {}, the channel lists it at generation {} (expected below {})",
                    step.version, f.version, f.generation, next.generation, step.generation
                ),
            });
        }
        step = next;
    }
    Err(Hold::Unreadable {
        what: format!("the required stops below {:?} do not end", target.version),
    })
}
