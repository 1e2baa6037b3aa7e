//! QEMU harness that proves the A/B installer on real disk images: upgrade while the workload
//! runs, fallback when a new slot panics or never confirms, rollback on failed health checks,
//! and power-cut safety at every write barrier of an upgrade.
//!
//! - [`vm::Vm`]: one QEMU process — serial console with timeouts and pattern waits, typed shell
//!   commands with exit codes, `system_reset` (watchdog) and SIGKILL (power cut).
//! - [`monitor::Monitor`]: its QEMU monitor: one HMP command at a time, and saving the running
//!   guest's state to a file a new QEMU resumes (`-incoming`).
//! - [`target::Target`]: the four boot targets and their QEMU command lines.
//! - [`server::ReleaseServer`]: the host side HTTP server for the signed releases.
//! - [`collector::Collector`]: the host's fleet collector (`k3os-ops collector serve`) a
//!   guest reports to.
//! - [`scenario::Scenario`]: the scenarios of the issue; [`run`] is the one-call entry point.
//!
//! # Architecture
//! `main.rs` (the CLI) and `tests/scenarios.rs` call [`run`] → [`scenario`] (the catalogue and
//! a run; one file per scenario family over the shared `steps`). The scenario layer is the only
//! one that combines the three below it: `steps` boots a disk with [`target`]'s QEMU command
//! line and drives it through [`vm`] (one QEMU process: console, shell, reset, power cut); the
//! families serve releases with [`server`] (HTTP) and read [`target`]'s paths. `vm`, `server`
//! and `target` know no scenario and not each other ([`vm`] reaches its QEMU monitor through
//! [`monitor`]); [`error`] is shared by all. `target` reads
//! the images crate's one list of standard releases (`k3os_images::spec::STANDARD_RELEASES`)
//! to check a run's inputs. `bin/demo.rs` (`just demo`) uses `vm`, `server` and `target`
//! directly to print the story as it happens.
//!
//! Inputs are the images crate's outputs (`just images-x86_64` / `just images-aarch64`); a
//! missing input is an error naming it, never a skipped check.

pub mod collector;
pub mod error;
pub mod monitor;
pub mod scenario;
pub mod server;
pub mod target;
pub mod vm;

pub use error::{Error, Result};
pub use scenario::{Options, Report, Scenario, ScenarioKind};
pub use target::{Accel, Target};
pub use vm::Vm;

/// Run `kind` on `target` and return what it measured.
pub fn run(kind: ScenarioKind, target: Target, opts: Options) -> Result<Report> {
    Scenario::new(kind, target, opts)?.run()
}
