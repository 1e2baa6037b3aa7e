//! Fleet rollouts of one release across many independent nodes: waves, pause, withdrawal and
//! required stops, decided by every node alone from the channel's signed metadata (no server
//! beyond static files).
//!
//! This module owns three things, one file each:
//! - `plan`: the per-release rollout data ([`Rollout`]), carried in the signed target's custom
//!   data, its rules ([`Rollout::validate`]) and the publisher's transitions
//!   ([`Rollout::pause`], [`Rollout::resume`], [`Rollout::withdraw`]);
//! - `offer`: the pure decision [`offer()`] (node seed, now, running and staged release, the
//!   listed releases → what to stage, what it waits for and until when, what to drop) and the
//!   per-release [`admission`]; `schedule` holds the curve both use;
//! - `seed`: the node's [`Seed`] and its file `node-seed.json` in the state directory;
//! - `retry`: the pure decision [`decide_retry`] whether a node tries again a release that
//!   failed on it (its record in the state file, the rollout's [`Retries`], now).
//!
//! # Format
//! The data is a JSON object, every field optional (absent: format 1, no waves, not paused,
//! not withdrawn, no required stop):
//! ```json
//! {"format":1,
//!  "waves":[{"share_bp":100,"start":"2026-12-07T00:00:00Z"},
//!           {"share_bp":1000,"start":"2026-12-08T00:00:00Z"},
//!           {"share_bp":5000,"start":"2026-12-09T00:00:00Z"},
//!           {"share_bp":10000,"start":"2026-12-10T00:00:00Z"}],
//!  "paused":{"since":"2026-12-08T06:00:00Z"},
//!  "paused_secs":0,
//!  "withdrawn":{"at":"2026-12-08T07:00:00Z"},
//!  "from_at_least":{"version":"v0.2.0","generation":20},
//!  "retries":{"count":1,"backoff_secs":3600}}
//! ```
//! Versioning follows the project's rule (see `channel`'s `INDEX_FORMAT` and CHANGELOG.md):
//! format 1 grows only by optional fields, which older readers skip; a change an older reader
//! would misread bumps `format`, and a reader refuses a newer format by name — here by
//! admitting nobody to that release ([`Hold::Unreadable`]), never by guessing. A node from
//! before this module (v0.1.0, v0.2.0 until now) skips the whole object and takes the release
//! at once: waves, pause, withdrawal and stops protect only nodes from this release on.
//!
//! # Rules and their reasons
//! - **Seeds**: a node's seed is a position in a million; share `s` admits the seeds below
//!   `s × 1,000,000` (see `seed` for why a million rather than 2048).
//! - **Linear growth between wave starts**: the admitted share goes linearly from one wave's
//!   share at its start to the next wave's share at the next start. Steps would admit every
//!   node of a wave in the same instant, and single-node sites polling on timers would then
//!   all hit the origin in the same hour; updog spreads the nodes of a wave over its span for
//!   the same reason. The first wave's share is admitted at its start (a step); a publisher
//!   who wants it spread too begins the list with a 0 bp point.
//! - **Pause** holds every node that has not started the release (staged it); a node that
//!   staged it may go on, so no node is left with a slot it may not activate. **Resume
//!   shifts the schedule** by the pause's length ([`Rollout::resume`] adds it to
//!   `paused_secs`): the share continues from where it was held instead of jumping to where the
//!   wave times moved on meanwhile, which would admit the whole skipped stretch at once — the
//!   burst the pause was meant to prevent. The shift is signed data, so every node agrees
//!   without knowing the pause's history.
//! - **Withdrawal** is final: never offered; a node that staged it drops it and is offered the
//!   newest release still offered; a node that runs it is not rolled back by this (the
//!   publisher releases a fix, or the previous content, under a higher generation).
//! - **Required stops** (Flatcar's floors without a server): a node running a generation below
//!   a release's `from_at_least` is offered that stop first, and each stop's own stop before
//!   it, so `latest` walks the node through every stop in order. A stop is offered by its own
//!   rollout: a withdrawn or paused stop holds the releases behind it.

mod offer;
mod plan;
mod retry;
mod schedule;
mod seed;

pub use offer::{admission, offer, Hold, Installed, Listed, Node, Offer, Step, Waiting};
pub use plan::{
    Floor, Pause, Retries, Rollout, RolloutError, Withdrawal, ROLLOUT_FORMAT, WHOLE_FLEET_BP,
};
pub use retry::{decide as decide_retry, Retry};
pub use schedule::{admits_from, threshold, Wave};
pub use seed::{
    load_or_create as load_or_create_seed, parse as parse_seed, path as seed_path,
    read as read_seed, Loaded as LoadedSeed, Origin as SeedOrigin, Seed, SeedError,
    Unusable as UnusableSeed, BAD_SUFFIX, SEED_FILE, SEED_FORMAT, SEED_SPACE,
};
