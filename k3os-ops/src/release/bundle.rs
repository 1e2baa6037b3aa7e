//! `k3os-ops release bundle DIR -o FILE`: one file holding the signed release in DIR, for a
//! site without a network (`k3os-ops upgrade --bundle FILE` installs it). The format and its
//! versioning are `libupgrade::bundle`'s; this only maps arguments and prints the result.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use libupgrade::units::Size;

#[derive(Args, Debug)]
pub struct BundleArgs {
    /// A release directory (manifest.json, manifest.json.sig and the files it names).
    dir: PathBuf,
    /// The bundle file to write (replaced atomically).
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
}

pub fn run(args: BundleArgs) -> anyhow::Result<()> {
    let h = libupgrade::bundle::write(&args.dir, &args.out)
        .with_context(|| format!("bundling the release in {}", args.dir.display()))?;
    let size = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote {} (bundle format {}): release {} (generation {}), {}",
        args.out.display(),
        h.format,
        h.version,
        h.generation,
        Size(size)
    );
    Ok(())
}
