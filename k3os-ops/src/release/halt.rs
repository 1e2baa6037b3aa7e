//! `k3os-ops release delegate-halt`: the publisher names the guard's stop-only key as the
//! channel's `halt` role (a TUF delegation in targets.json; `libupgrade::trust::halt` states
//! what that key can and cannot do), and the halts the guard published, for `rollout-status`
//! and `resume`.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::Args;
use libupgrade::trust::halt::{self, Applied};
use libupgrade::trust::meta::{time_str, Targets};
use libupgrade::trust::publish;

/// `release delegate-halt`.
#[derive(Args, Debug)]
pub struct DelegateArgs {
    /// The channel directory (with targets.json from `release targets`).
    dir: PathBuf,
    /// The guard's public key (`release keygen --name halt`; repeat for several). A key of any
    /// top-level role is refused: the halt key must sign nothing else.
    #[arg(long = "halt-key", required_unless_present = "remove")]
    halt_keys: Vec<PathBuf>,
    /// How many halt keys must sign a halt.
    #[arg(long, default_value_t = 1)]
    halt_threshold: u32,
    /// Remove the delegation: the channel has no guard (nodes stop reading halt.json).
    #[arg(long, conflicts_with = "halt_keys")]
    remove: bool,
    #[command(flatten)]
    sign: super::resign::SignArgs,
}

/// `release delegate-halt`: re-sign targets with the halt delegation, then snapshot and
/// timestamp.
pub fn delegate(a: DelegateArgs) -> anyhow::Result<()> {
    let keys = a
        .halt_keys
        .iter()
        .map(|p| super::metadata::public_key(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    a.sign.sign_with(&a.dir, &|p, signers, expires| {
        publish::stage_delegation(p, &keys, a.halt_threshold, signers, expires)
    })?;
    match keys.len() {
        0 => println!("{}: no halt role any more", a.dir.display()),
        n => println!(
            "{}: halt role delegated to {n} key(s), threshold {}: the guard writes {} there (`k3os-ops collector guard`)",
            a.dir.display(),
            a.halt_threshold,
            halt::HALT_FILE
        ),
    }
    Ok(())
}

/// The published targets of `dir` with the guard's served halts applied at `at` (as a node
/// applies them), and what they hold. A halt file that does not verify is an error naming it.
pub fn effective(dir: &Path, at: DateTime<Utc>) -> anyhow::Result<(Targets, Vec<Applied>)> {
    let mut t = super::resign::published(dir)?;
    let held = match halt::served(dir, &t)? {
        Some(doc) => halt::apply(&mut t, &doc, at),
        None => Vec::new(),
    };
    Ok((t, held))
}

/// One line per halted release: since when, why, and the command that lifts it.
pub fn lines(held: &[Applied], dir: &Path) -> Vec<String> {
    held.iter()
        .map(|a| {
            format!(
                "  {} halted by the guard since {} ({}): nodes hold as for a pause; lift with `k3os-ops release resume {} {} …keys…`",
                a.version,
                time_str(&a.since),
                a.reason.escape_debug(),
                dir.display(),
                a.version
            )
        })
        .collect()
}
