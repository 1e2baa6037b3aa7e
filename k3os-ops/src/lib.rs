//! `k3os-ops` as a library: the subcommands' modules, so integration tests (and the binary's
//! thin dispatcher in `main.rs`) use `k3os_ops::…` instead of compiling sources via `#[path]`.
//!
//! - [`agent`]: the Kubernetes UpdateChannel controller (`k3os-ops agent`);
//! - [`upgrade`]: one-shot stage/activate/reboot (`k3os-ops upgrade`);
//! - [`slot`]: manual A/B slot steering (`k3os-ops slot …`); [`slot_verify`]: its dm-verity
//!   scrub (`k3os-ops slot verify`);
//! - [`release`]: create, sign, index, verify and serve releases (`k3os-ops release …`);
//! - [`bootloader`]: write a node's loader files and render boot scripts (`k3os-ops bootloader …`);
//! - [`collector`]: receive and store the fleet's reports (`k3os-ops collector serve`);
//! - [`logging`]: the library's warnings (each retry and why) on stderr for one-shot commands;
//! - [`node`]: the node config argument and the reboot, shared by the node-side commands;
//! - [`progress`]: how `upgrade` shows a download; [`report`]: how a failed command prints
//!   (and how a boot outcome that is not a good slot becomes a message and an exit status).
//!
//! # Architecture
//! `main.rs` parses and dispatches to one module per subcommand; each maps its own input to
//! `libupgrade` (the CLI's `upgrade` and the agent both build one `libupgrade::StageRequest`)
//! and `bootconfig`, and uses the shared edges ([`node`], [`progress`], [`report`],
//! [`logging`]), which import no subcommand. Between subcommands data flows one way, and no
//! module imports one that imports it back:
//! - [`slot`] shows the agent's last stage preview (`libupgrade::state::ledger`);
//! - [`agent`] reports a boot outcome through [`report`]'s mapping;
//! - [`release`] renders boot scripts through [`bootloader`] and reads times and durations
//!   with [`upgrade`]'s parsers (`parse_time`, `parse_retry_for`).

pub mod agent;
pub mod bootloader;
#[cfg(feature = "fleet")]
pub mod collector;
pub mod logging;
pub mod node;
pub mod progress;
pub mod release;
pub mod report;
pub mod slot;
pub mod slot_verify;
pub mod upgrade;
