//! `k3os-ops release …`: the publisher's side — make keys, create and sign releases, index a
//! channel directory, inspect channels, verify a release directory, and serve a channel over
//! HTTP for demos and tests. All logic lives in `libupgrade::{signing, release, channel}`; this
//! module only maps arguments onto it and prints results. `metadata` does the same for the
//! channel's signed metadata (`libupgrade::trust`).

mod bundle;
mod create;
#[cfg(feature = "fleet")]
mod fleet_status;
#[cfg(feature = "fleet")]
mod guard;
mod halt;
mod metadata;
mod resign;
mod rollout;
mod serve;
mod status;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use libupgrade::manifest::Arch;
use libupgrade::{channel, release, signing};

#[cfg(feature = "fleet")]
pub use fleet_status::schedule_source;
#[cfg(feature = "fleet")]
pub use guard::{run as guard, GuardArgs};

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(subcommand)]
    cmd: ReleaseCmd,
}

#[derive(Subcommand, Debug)]
enum ReleaseCmd {
    /// Make an ed25519 key pair: DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub (copy this
    /// into each node's trust dir).
    Keygen {
        /// Directory for the key files (created if missing).
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
        /// Base name of the key files.
        #[arg(long, default_value = "release")]
        name: String,
    },
    /// Create a signed release directory (rootfs.squashfs, vmlinuz, initrd, manifest.json,
    /// manifest.json.sig). Inside a channel directory the index is updated too.
    Create(create::CreateArgs),
    /// (Re)build DIR/index.json from the release subdirectories of DIR.
    Index { dir: PathBuf },
    /// List a channel's releases, newest first (path, http(s) URL or github-releases://OWNER/REPO).
    List {
        channel: String,
        /// Verify the channel's signed metadata from this root (e.g. a node image's
        /// /etc/k3os-ops/root.json) and list the releases its targets name; a channel without
        /// metadata is refused. Nothing is recorded.
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// Show which release a channel resolves to.
    Resolve {
        channel: String,
        /// Resolve through the channel's signed metadata from this root, as a node with that
        /// root does (`list --root`).
        #[arg(long)]
        root: Option<PathBuf>,
        /// A version, or "latest".
        #[arg(long, default_value = "latest")]
        version: String,
        #[arg(long, default_value_t = Arch::host())]
        arch: Arch,
        /// With --root: resolve as a node with this rollout seed (0..1000000, `slot status`
        /// shows a node's) does, honouring the releases' rollouts.
        #[arg(long, requires = "root")]
        seed: Option<u32>,
        /// With --seed: the time of the resolution (RFC 3339; default now).
        #[arg(long, requires = "seed", value_parser = crate::upgrade::parse_time)]
        at: Option<chrono::DateTime<chrono::Utc>>,
        /// With --seed: the generation the node runs (default 0: it runs none of the listed).
        #[arg(long, requires = "seed", default_value_t = 0)]
        running_generation: u64,
    },
    /// Check a local release directory: signature against a trust dir and every file's sha256.
    Verify {
        dir: PathBuf,
        #[arg(long)]
        trust_dir: PathBuf,
    },
    /// The channel's root of signed metadata: `init` (first root) or `rotate` (root N+1).
    Root {
        #[command(subcommand)]
        cmd: metadata::RootCmd,
    },
    /// Sign the list of the channel's releases (targets.json) after `create` / `index`.
    Targets(metadata::TargetsArgs),
    /// Re-sign snapshot.json and timestamp.json (the channel's cron job; nodes refuse a
    /// timestamp past its expiry as a frozen channel).
    Timestamp(metadata::TimestampArgs),
    /// Set a release's rollout: its waves (`--waves 1%@+0,10%@+1d,100%@+3d`) and required stop;
    /// re-signs targets, snapshot and timestamp.
    Rollout(rollout::RolloutArgs),
    /// Pause a release's rollout: nodes that have not staged it wait (re-signs the metadata).
    Pause(rollout::ChangeArgs),
    /// Resume a paused rollout where it was held (the schedule shifts by the pause).
    Resume(rollout::ChangeArgs),
    /// Withdraw a release for good: offered to nobody, dropped where only staged. Nodes that
    /// run it are not rolled back: publish a fixed (or the previous) release under a higher
    /// generation for them.
    Withdraw(rollout::ChangeArgs),
    /// Show which share of the fleet each release of a channel directory is offered at a time.
    RolloutStatus(rollout::StatusArgs),
    /// Name the guard's stop-only key as the channel's `halt` role (a TUF delegation in
    /// targets.json): halts it signs hold a release as a pause does; it can sign nothing else.
    /// `release resume` lifts a halt. Re-signs targets, snapshot and timestamp.
    DelegateHalt(halt::DelegateArgs),
    /// Write one offline bundle file holding a release directory (`upgrade --bundle` reads it).
    Bundle(bundle::BundleArgs),
    /// Serve DIR over HTTP (GET/HEAD, Range requests) until interrupted.
    Serve {
        dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
    },
}

pub fn run(args: ReleaseArgs) -> anyhow::Result<()> {
    match args.cmd {
        ReleaseCmd::Bundle(a) => bundle::run(a)?,
        ReleaseCmd::Keygen { out, name } => {
            let (secret, public) = signing::generate_keypair(&out, &name)?;
            let id = signing::KeyId::of(&signing::load_public_key(&public)?);
            println!("secret key: {}", secret.display());
            println!(
                "public key: {} (key id {id}; as a channel metadata key {})",
                public.display(),
                metadata::tuf_key_id(&public)?
            );
            println!(
                "copy the public key into each node's trust dir; keep the secret key off the nodes"
            );
        }
        ReleaseCmd::Create(a) => create::run(a)?,
        ReleaseCmd::Index { dir } => {
            let index = channel::write_index(&dir)
                .with_context(|| format!("indexing channel {}", dir.display()))?;
            println!(
                "wrote {} ({} releases)",
                dir.join(channel::INDEX_FILE).display(),
                index.releases.len()
            );
            print_index(&index);
        }
        ReleaseCmd::List { channel: ch, root } => list(&ch, root.as_deref())?,
        ReleaseCmd::Resolve {
            channel: ch,
            root,
            version,
            arch,
            seed,
            at,
            running_generation,
        } => {
            let node = seed.map(|s| (s, at, running_generation));
            resolve(&ch, root.as_deref(), &version, arch, node)?
        }
        ReleaseCmd::Verify { dir, trust_dir } => {
            let (m, key) = release::verify_dir(&dir, &trust_dir)?;
            println!(
                "{}: release {} ({}, generation {}) signed by trusted key {key}; all files match",
                dir.display(),
                m.version,
                m.arch,
                m.generation
            );
        }
        ReleaseCmd::Root { cmd } => metadata::root(cmd)?,
        ReleaseCmd::Targets(a) => metadata::targets(a)?,
        ReleaseCmd::Timestamp(a) => metadata::timestamp(a)?,
        ReleaseCmd::Rollout(a) => rollout::rollout(a)?,
        ReleaseCmd::Pause(a) => rollout::change(rollout::Change::Pause, a)?,
        ReleaseCmd::Resume(a) => rollout::change(rollout::Change::Resume, a)?,
        ReleaseCmd::Withdraw(a) => rollout::change(rollout::Change::Withdraw, a)?,
        ReleaseCmd::RolloutStatus(a) => status::status(a)?,
        ReleaseCmd::DelegateHalt(a) => halt::delegate(a)?,
        ReleaseCmd::Serve { dir, listen } => serve::serve(&dir, listen)?,
    }
    Ok(())
}

/// `release list`: the channel's releases, through its signed metadata when `root` is given.
fn list(ch: &str, root: Option<&Path>) -> anyhow::Result<()> {
    let index = match root {
        Some(root) => {
            let (_scratch, trust) = inspect_trust(root)?;
            channel::list_with(ch, &trust)?
        }
        None => channel::list(ch)?,
    };
    print_index(&index);
    Ok(())
}

/// A node as `release resolve --seed` imagines it: seed, time, running generation.
type Imagined = (u32, Option<chrono::DateTime<chrono::Utc>>, u64);

/// `release resolve`: which release `version` names, and the pin that vouches for it; with
/// `node`, what a node with that seed running that generation is offered then.
fn resolve(
    ch: &str,
    root: Option<&Path>,
    version: &str,
    arch: Arch,
    node: Option<Imagined>,
) -> anyhow::Result<()> {
    let r = match (root, node) {
        (Some(root), Some((seed, at, running))) => {
            let (_scratch, mut trust) = inspect_trust(root)?;
            trust.now = at.or(trust.now);
            let seed = libupgrade::rollout::Seed::new(seed).with_context(|| {
                format!(
                    "--seed {seed}: a seed is below {}",
                    libupgrade::rollout::SEED_SPACE
                )
            })?;
            let node = channel::NodeRollout {
                seed: channel::SeedSource::Given(seed),
                running: libupgrade::rollout::Installed {
                    version: String::new(),
                    generation: running,
                },
                staged: None,
                ignore_rollout: false,
            };
            channel::resolve_for(ch, Some(version), arch, &trust, Some(&node))?
        }
        (Some(root), None) => {
            let (_scratch, trust) = inspect_trust(root)?;
            channel::resolve_with(ch, Some(version), arch, &trust)?
        }
        (None, _) => channel::resolve(ch, Some(version), arch)?,
    };
    if let Some(note) = &r.rollout {
        println!("rollout: {note}");
    }
    println!(
        "{} ({}, generation {}) at {}",
        r.version, r.arch, r.generation, r.location
    );
    if let Some(pin) = &r.pin {
        println!(
            "  manifest {} bytes, sha256 {}, vouched for by {}",
            pin.length, pin.sha256, pin.vouched_by
        );
    }
    Ok(())
}

/// Trust options of an inspection from `root`: metadata required, recorded in a scratch dir
/// that is dropped afterwards (an inspection never moves a node's record).
fn inspect_trust(root: &Path) -> anyhow::Result<(tempfile::TempDir, channel::TrustOptions)> {
    if !root.is_file() {
        anyhow::bail!("root file {} does not exist", root.display());
    }
    let scratch = tempfile::tempdir().context("create a scratch dir for the metadata check")?;
    let trust = channel::TrustOptions {
        root_file: root.to_path_buf(),
        store_file: scratch.path().join(libupgrade::trust::STORE_FILE),
        policy: channel::MetadataPolicy::Required,
        now: None,
        ignore_expiry: false,
        min_rate: Some(libupgrade::MinRate::DEFAULT),
        read_only: false,
    };
    Ok((scratch, trust))
}

/// Copy progress on stderr (hidden when stderr is not a terminal).
struct Bar(indicatif::ProgressBar);

impl Bar {
    fn new() -> Bar {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:16} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .expect("valid progress template")
            .progress_chars("=> "),
        );
        Bar(bar)
    }
}

impl libupgrade::Progress for Bar {
    fn begin(&self, what: &str, total: u64, already: u64) {
        self.0.reset();
        self.0.set_message(what.to_string());
        self.0.set_length(total);
        self.0.set_position(already);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn end(&self) {
        self.0.finish_and_clear();
    }
}

fn print_index(index: &channel::Index) {
    for e in &index.releases {
        println!(
            "{:<24} {:<8} generation {:<6} {}",
            e.version,
            e.arch.as_str(),
            e.generation,
            e.path
        );
    }
}
