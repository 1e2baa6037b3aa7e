//! The keys every command that changes a channel's rollouts re-signs its metadata with, and
//! the channel's published targets those commands start from: only once the metadata as
//! served verified (`libupgrade::trust::client::served`). Shared by `rollout`, `halt` and
//! `guard`, which need it and not each other.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::Args;
use libupgrade::trust::meta::Targets;
use libupgrade::trust::{meta::Role, publish};

/// The keys that re-sign targets, snapshot and timestamp, and their lifetimes.
#[derive(Args, Debug)]
pub struct SignArgs {
    /// Targets secret keys (a threshold of them; repeat).
    #[arg(long = "key", required = true)]
    keys: Vec<PathBuf>,
    /// Snapshot secret keys (repeat).
    #[arg(long = "snapshot-key", required = true)]
    snapshot: Vec<PathBuf>,
    /// Timestamp secret keys (repeat).
    #[arg(long = "timestamp-key", required = true)]
    timestamp: Vec<PathBuf>,
    /// Lifetime of the new targets.json.
    #[arg(long, default_value = "90d", value_parser = super::metadata::parse_lifetime)]
    targets_expires: chrono::Duration,
    /// Lifetime of the new snapshot.json.
    #[arg(long, default_value = "30d", value_parser = super::metadata::parse_lifetime)]
    snapshot_expires: chrono::Duration,
    /// Lifetime of the new timestamp.json.
    #[arg(long, default_value = "7d", value_parser = super::metadata::parse_lifetime)]
    expires: chrono::Duration,
    #[command(flatten)]
    anchor: super::metadata::AnchorArgs,
}

/// The published targets of `dir`, once the channel's metadata as served verified (as every
/// signing command verifies it first: `libupgrade::trust::client::served`).
pub(super) fn published(dir: &Path) -> anyhow::Result<Targets> {
    let what = dir.join(Role::Targets.file());
    libupgrade::trust::client::served::verify_served(dir)?
        .targets
        .map(|(t, _)| t)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{}: no targets: run `k3os-ops release targets` first",
                what.display()
            )
        })
}

/// How a command stages the new targets: (transaction, targets signers, expiry).
pub(super) type StageTargets<'a> = dyn Fn(
        &mut publish::Publish,
        &[publish::SigningKey],
        DateTime<Utc>,
    ) -> Result<Targets, libupgrade::trust::TrustError>
    + 'a;

impl SignArgs {
    /// Re-sign targets with `stage`, then snapshot and timestamp, in one transaction over the
    /// channel as it verified (from `--root` when given): every key file is read and every document signed and checked in
    /// memory first, so a wrong or unreadable key of any role writes nothing.
    pub(super) fn sign_with(&self, dir: &Path, stage: &StageTargets<'_>) -> anyhow::Result<()> {
        let targets_keys = super::metadata::secrets(&self.keys)?;
        let mut keys = super::metadata::secrets(&self.snapshot)?;
        keys.extend(super::metadata::secrets(&self.timestamp)?);
        let mut p = self.anchor.begin(dir)?;
        let t = stage(
            &mut p,
            &targets_keys,
            publish::expires_in(self.targets_expires),
        )?;
        let (s, ts) = publish::stage_timestamp(
            &mut p,
            &keys,
            publish::expires_in(self.snapshot_expires),
            publish::expires_in(self.expires),
        )?;
        p.commit()?;
        println!(
            "wrote targets version {}, snapshot version {}, timestamp version {}",
            t.version, s.version, ts.version
        );
        Ok(())
    }
}
