//! The command line end to end, one test binary (linking kube and the crate graph once
//! instead of once per file): `upgrade`, `host`, the messages the CLI prints, and the
//! `release` tools (create, sign, serve, channels, TUF metadata and its interop with
//! python-tuf). Each module is one former `tests/<name>.rs`; run one with
//! `cargo test -p k3os-ops --test cli <name>::`.
//!
//! The modules share one process. Process-wide state they touch: `K3OS_OPS_GITHUB_API`
//! (the GitHub channel tests hold `k3os_ops_testing::release::github_api`'s guard while it points at
//! their server); mounts (tmpfs, loop) only under each test's own temp dir; no fixed port, no
//! change of the current directory.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

#[cfg(feature = "fleet")]
mod bundle_quota;
mod cli_messages;
mod cluster;
#[cfg(feature = "fleet")]
mod failure_bundles;
#[cfg(feature = "fleet")]
mod fleet_reports;
mod host_reboot;
mod release_args;
mod release_atomic;
mod release_channel;
mod release_create_refusal;
mod release_e2e;
mod release_openssl;
mod release_repack;
mod release_resign;
mod release_serve;
mod release_trust;
mod release_trust_cli;
mod retry_cli;
mod rollout_cli;
mod slot_verify;
mod tuf_interop;
mod upgrade_payloads;
mod upgrade_thin;
