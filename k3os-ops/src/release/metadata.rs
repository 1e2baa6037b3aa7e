//! `k3os-ops release root init|rotate`, `release targets`, `release timestamp`: the channel's
//! signed metadata (see `libupgrade::trust`). Argument mapping and printing only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use libupgrade::signing;
use libupgrade::trust::client::served;
use libupgrade::trust::meta::Role;
use libupgrade::trust::meta::{time_str, Key};
use libupgrade::trust::publish;
use libupgrade::trust::publish::RoleSpec;

/// A lifetime: `7d`, `12h`, `90m`, `3600s`.
pub(super) fn parse_lifetime(s: &str) -> Result<chrono::Duration, String> {
    match crate::upgrade::parse_retry_for(s)?.0 {
        Some(d) => chrono::Duration::from_std(d).map_err(|e| e.to_string()),
        None => Err(format!("'{s}': metadata must expire")),
    }
}

/// Keys of each role as given on the command line (`.pub` or `.key` files).
#[derive(Args, Debug, Default)]
pub struct RoleKeyArgs {
    /// Root keys (public or secret key files); repeat for several.
    #[arg(long = "root-key")]
    root: Vec<PathBuf>,
    #[arg(long)]
    root_threshold: Option<u32>,
    /// Targets keys: they sign the list of releases.
    #[arg(long = "targets-key")]
    targets: Vec<PathBuf>,
    #[arg(long)]
    targets_threshold: Option<u32>,
    /// Snapshot keys.
    #[arg(long = "snapshot-key")]
    snapshot: Vec<PathBuf>,
    #[arg(long)]
    snapshot_threshold: Option<u32>,
    /// Timestamp keys (online: a cron job re-signs with them).
    #[arg(long = "timestamp-key")]
    timestamp: Vec<PathBuf>,
    #[arg(long)]
    timestamp_threshold: Option<u32>,
}

impl RoleKeyArgs {
    /// The roles given (keys named); a threshold without keys is refused.
    fn specs(&self) -> anyhow::Result<BTreeMap<Role, RoleSpec>> {
        let mut out = BTreeMap::new();
        for (role, files, threshold) in [
            (Role::Root, &self.root, self.root_threshold),
            (Role::Targets, &self.targets, self.targets_threshold),
            (Role::Snapshot, &self.snapshot, self.snapshot_threshold),
            (Role::Timestamp, &self.timestamp, self.timestamp_threshold),
        ] {
            if files.is_empty() {
                if threshold.is_some() {
                    bail!("--{role}-threshold given without --{role}-key");
                }
                continue;
            }
            let keys = files
                .iter()
                .map(|p| public_key(p))
                .collect::<anyhow::Result<Vec<_>>>()?;
            out.insert(
                role,
                RoleSpec {
                    keys,
                    threshold: threshold.unwrap_or(1),
                },
            );
        }
        Ok(out)
    }

    /// Every secret key among the files (used to sign where it belongs).
    fn secrets(&self) -> Vec<PathBuf> {
        [&self.root, &self.targets, &self.snapshot, &self.timestamp]
            .into_iter()
            .flatten()
            .filter(|p| p.extension().is_some_and(|e| e == signing::SECRET_KEY_EXT))
            .cloned()
            .collect()
    }
}

/// A public key from a `.pub` file, or derived from a `.key` file.
pub(super) fn public_key(p: &Path) -> anyhow::Result<publish::VerifyingKey> {
    match signing::load_public_key(p) {
        Ok(k) => Ok(k),
        Err(_) => Ok(signing::load_secret_key(p)
            .with_context(|| format!("{}: neither a public nor a secret key", p.display()))?
            .verifying_key()),
    }
}

pub(super) fn secrets(paths: &[PathBuf]) -> anyhow::Result<Vec<publish::SigningKey>> {
    paths
        .iter()
        .map(|p| Ok(signing::load_secret_key(p)?))
        .collect()
}

/// `--root FILE` of the commands that re-sign: the anchor of their verification of the
/// channel as served (`libupgrade::trust::client::served`).
#[derive(Args, Debug, Default)]
pub struct AnchorArgs {
    /// A root kept apart from the served directory (e.g. the root.json baked into the nodes'
    /// images): the channel's root chain must walk from it before anything is signed, so a
    /// chain replaced from its first root on is refused. Default: the directory's own
    /// 1.root.json.
    #[arg(long = "root", value_name = "FILE")]
    trusted_root: Option<PathBuf>,
}

impl AnchorArgs {
    /// Verify `dir` from the anchor when one is given (the signing function then verifies it
    /// again from its own `1.root.json`, which the anchored walk has already vouched for).
    pub(super) fn check(&self, dir: &Path) -> anyhow::Result<()> {
        let Some(p) = &self.trusted_root else {
            return Ok(());
        };
        let bytes = std::fs::read(p).with_context(|| format!("--root {}", p.display()))?;
        served::verify_served_from(dir, &bytes, &p.display().to_string())?;
        Ok(())
    }

    /// A publish transaction over `dir`: its served metadata verified from the anchor when
    /// one is given ([`AnchorArgs::check`]), and from the directory's own `1.root.json`.
    pub(super) fn begin(&self, dir: &Path) -> anyhow::Result<publish::Publish> {
        self.check(dir)?;
        Ok(publish::Publish::begin(dir)?)
    }
}

#[derive(Subcommand, Debug)]
pub enum RootCmd {
    /// Write the channel's first root (1.root.json, root.json): the keys and thresholds of all
    /// four roles, signed by its root keys (give those as secret key files). Copy root.json to
    /// each node's `channel_root` (default /etc/k3os-ops/root.json) at image build.
    Init {
        dir: PathBuf,
        #[command(flatten)]
        keys: RoleKeyArgs,
        /// Lifetime of the root (renew by rotating before it ends).
        #[arg(long, default_value = "365d", value_parser = parse_lifetime)]
        expires: chrono::Duration,
    },
    /// Publish root N+1 (N+1.root.json, root.json): the roles named here get new keys (a role
    /// left out keeps its keys; dropping a key revokes it), signed by a threshold of root N's
    /// root keys and of root N+1's. Nodes walk to it at their next poll.
    Rotate {
        dir: PathBuf,
        #[command(flatten)]
        keys: RoleKeyArgs,
        /// Secret keys of root N that sign the new root (repeat).
        #[arg(long = "sign-key")]
        sign: Vec<PathBuf>,
        #[arg(long, default_value = "365d", value_parser = parse_lifetime)]
        expires: chrono::Duration,
        #[command(flatten)]
        anchor: AnchorArgs,
    },
}

#[derive(Args, Debug)]
pub struct TargetsArgs {
    /// The channel directory (after `release create` / `release index`).
    dir: PathBuf,
    /// Targets secret keys (a threshold of them; repeat).
    #[arg(long = "key", required = true)]
    keys: Vec<PathBuf>,
    #[arg(long, default_value = "90d", value_parser = parse_lifetime)]
    expires: chrono::Duration,
    /// Snapshot secret keys: with --timestamp-key, snapshot and timestamp are re-signed in the
    /// same step, so nodes never see the new targets without the snapshot that pins them.
    #[arg(long = "snapshot-key", requires = "timestamp")]
    snapshot: Vec<PathBuf>,
    /// Timestamp secret keys (with --snapshot-key).
    #[arg(long = "timestamp-key", requires = "snapshot")]
    timestamp: Vec<PathBuf>,
    /// With the snapshot and timestamp keys: lifetime of the new snapshot.json.
    #[arg(long, default_value = "30d", value_parser = parse_lifetime)]
    snapshot_expires: chrono::Duration,
    /// With the snapshot and timestamp keys: lifetime of the new timestamp.json.
    #[arg(long, default_value = "7d", value_parser = parse_lifetime)]
    timestamp_expires: chrono::Duration,
    #[command(flatten)]
    anchor: AnchorArgs,
}

#[derive(Args, Debug)]
pub struct TimestampArgs {
    dir: PathBuf,
    /// Snapshot secret keys (repeat).
    #[arg(long = "snapshot-key", required = true)]
    snapshot: Vec<PathBuf>,
    /// Timestamp secret keys (repeat).
    #[arg(long = "timestamp-key", required = true)]
    timestamp: Vec<PathBuf>,
    #[arg(long, default_value = "30d", value_parser = parse_lifetime)]
    snapshot_expires: chrono::Duration,
    /// Lifetime of timestamp.json: nodes refuse the channel as stale after it (re-sign daily).
    #[arg(long, default_value = "7d", value_parser = parse_lifetime)]
    expires: chrono::Duration,
    #[command(flatten)]
    anchor: AnchorArgs,
}

fn print_root(dir: &Path, what: &str, root: &libupgrade::trust::meta::Root) {
    println!(
        "{what} root version {} in {} (expires {})",
        root.version,
        dir.display(),
        time_str(&root.expires)
    );
    for (role, rk) in &root.roles {
        println!(
            "  {:<9} threshold {} of {}",
            role.as_str(),
            rk.threshold,
            rk.keyids
                .iter()
                .map(|id| &id[..16])
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

pub fn root(cmd: RootCmd) -> anyhow::Result<()> {
    match cmd {
        RootCmd::Init { dir, keys, expires } => {
            let roles = keys.specs()?;
            let signers = secrets(&keys.secrets())?;
            let root = publish::init_root(&dir, &roles, &signers, publish::expires_in(expires))?;
            print_root(&dir, "wrote", &root);
        }
        RootCmd::Rotate {
            dir,
            keys,
            sign,
            expires,
            anchor,
        } => {
            anchor.check(&dir)?;
            let roles = keys.specs()?;
            let mut paths = sign;
            paths.extend(keys.secrets());
            let signers = secrets(&paths)?;
            let root = publish::rotate_root(&dir, &roles, &signers, publish::expires_in(expires))?;
            print_root(&dir, "rotated to", &root);
        }
    }
    Ok(())
}

pub fn targets(a: TargetsArgs) -> anyhow::Result<()> {
    let signers = secrets(&a.keys)?;
    let mut keys = secrets(&a.snapshot)?;
    keys.extend(secrets(&a.timestamp)?);
    let mut p = a.anchor.begin(&a.dir)?;
    let t = publish::stage_targets(&mut p, &signers, publish::expires_in(a.expires))?;
    let resigned = match keys.is_empty() {
        true => None,
        false => Some(publish::stage_timestamp(
            &mut p,
            &keys,
            publish::expires_in(a.snapshot_expires),
            publish::expires_in(a.timestamp_expires),
        )?),
    };
    p.commit()?;
    let then = match &resigned {
        Some((s, ts)) => format!(
            "; snapshot version {} and timestamp version {} pin it",
            s.version, ts.version
        ),
        None => "; now run `k3os-ops release timestamp`".into(),
    };
    println!(
        "wrote targets version {} ({} releases, expires {}){then}",
        t.version,
        t.targets.len(),
        time_str(&t.expires)
    );
    for (path, m) in &t.targets {
        if let Some(c) = &m.custom {
            println!(
                "  {path:<40} {} {} generation {}",
                c.version, c.arch, c.generation
            );
        }
    }
    Ok(())
}

pub fn timestamp(a: TimestampArgs) -> anyhow::Result<()> {
    let mut keys = secrets(&a.snapshot)?;
    keys.extend(secrets(&a.timestamp)?);
    let mut p = a.anchor.begin(&a.dir)?;
    let (s, t) = publish::stage_timestamp(
        &mut p,
        &keys,
        publish::expires_in(a.snapshot_expires),
        publish::expires_in(a.expires),
    )?;
    p.commit()?;
    println!(
        "wrote snapshot version {} and timestamp version {} (expires {})",
        s.version,
        t.version,
        time_str(&t.expires)
    );
    Ok(())
}

/// The key id a node sees for a key file (printed by `release keygen`).
pub fn tuf_key_id(p: &Path) -> anyhow::Result<String> {
    Ok(Key::ed25519(&public_key(p)?).id())
}
