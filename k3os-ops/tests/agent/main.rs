//! The agent's integration tests, one test binary (linking kube and the crate graph once
//! instead of once per file). Each module is one former `tests/agent_<name>.rs`; run one with
//! `cargo test -p k3os-ops --test agent <name>::`.
//!
//! The modules share one process: none sets environment variables, changes the current
//! directory or binds a fixed port; the metrics registry is per agent (`agent.clients`).
//! The fake Kubernetes API server is `k3os_ops_testing::fake_api` (shared with the fleet bench).
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

mod fleet;
mod fleet_rig;
mod fleet_waves;
mod flow;
mod idle;
mod kube_mock;
mod node;
mod pinned_waves;
mod race;
mod retries;
mod thin;
mod trust;
