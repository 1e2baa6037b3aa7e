//! `k3os-images build`: build the signed test releases and the A/B test disks of one
//! architecture (see the library docs for the pipeline). Normally run by `just images-<arch>`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use k3os_images::debs::Debs;
use k3os_images::disk::{self, BootVariant, DiskSpec, Sizes};
use k3os_images::release::{ensure_keys, ReleaseBuilder, ReleaseSpec};
use k3os_images::stamp::Stamp;
use k3os_images::target::Target;
use libupgrade::manifest::Arch;

#[derive(Parser)]
#[command(
    name = "k3os-images",
    about = "Build the A/B test releases and disk images"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build releases (images/out/<arch>/releases/<version>/) and disks (images/out/<arch>/disk-<variant>.img).
    Build {
        #[arg(long)]
        arch: Arch,
        /// Extracted Debian packages (.cache/debs/<arch>/root from fetch-debs.sh).
        #[arg(long)]
        debs: PathBuf,
        /// Static k3os-ops for the target (installed into every rootfs).
        #[arg(long)]
        k3os_ops: PathBuf,
        /// k3os-ops runnable on this host (signs the releases).
        #[arg(long)]
        tool: PathBuf,
        /// Output root (images/out).
        #[arg(long, default_value = "images/out")]
        out: PathBuf,
        /// Releases to build (default: v1 v2 v3 v2-panic v2-noconfirm v2-badhealth v4-panic).
        #[arg(long = "release", value_parser = ReleaseSpec::parse)]
        releases: Vec<ReleaseSpec>,
        /// Disk boot variants (default: all the architecture has).
        #[arg(long = "boot", value_parser = BootVariant::parse)]
        boots: Vec<BootVariant>,
        /// Release installed in slot A of every disk.
        #[arg(long, default_value = "v1")]
        slot_a: String,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Command::Build {
            arch,
            debs,
            k3os_ops,
            tool,
            out,
            releases,
            boots,
            slot_a,
        } => {
            let t0 = Instant::now();
            let target = Target::new(arch);
            let debs = Debs::locate(&debs, target)?;
            let keys = out.join("keys");
            let (secret, public) = ensure_keys(&tool, &keys).context("test signing key")?;
            let arch_out = out.join(arch.as_str());
            let builder = ReleaseBuilder {
                target,
                debs: debs.clone(),
                k3os_ops,
                tool: tool.clone(),
                out: arch_out.clone(),
                keys,
            };
            let releases = if releases.is_empty() {
                ReleaseSpec::standard()
            } else {
                releases
            };
            let mut built = Vec::new();
            for spec in &releases {
                let r = builder
                    .build(spec, &secret, &public)
                    .with_context(|| format!("release {}", spec.version))?;
                eprintln!(
                    "k3os-images: release {} -> {}",
                    spec.version,
                    r.dir.display()
                );
                built.push(r);
            }
            // No channel index here: the failure variants share generation 2 with v2 on purpose,
            // which a channel (one release per generation) refuses. Tests name release dirs directly.
            let releases_dir = arch_out.join("releases");

            let slot_a_release = match built.iter().find(|r| r.spec.version == slot_a) {
                Some(r) => r.clone(),
                None => builder.build(
                    &ReleaseSpec::parse(&slot_a).map_err(anyhow::Error::msg)?,
                    &secret,
                    &public,
                )?,
            };
            let mut largest = 0;
            for r in &built {
                largest = largest.max(
                    std::fs::metadata(&r.rootfs)
                        .with_context(|| r.rootfs.display().to_string())?
                        .len(),
                );
            }
            let sizes = Sizes::for_largest_rootfs(largest);
            let boots = if boots.is_empty() {
                BootVariant::for_target(target)
            } else {
                boots
            };
            for variant in boots {
                let spec = DiskSpec {
                    target,
                    variant,
                    sizes,
                    slot_a: &slot_a_release,
                    debs: &debs,
                    tool: &tool,
                };
                let img = arch_out.join(format!("disk-{}.img", variant.name()));
                let mut st = Stamp::new();
                st.param("variant", variant.name())
                    .param("sizes", format!("{sizes:?}"))
                    .param("loader", k3os_images::loader::fingerprint(&spec)?)
                    .file(
                        "manifest",
                        &slot_a_release.dir.join(libupgrade::manifest::MANIFEST_FILE),
                    )?;
                if st.is_fresh(&img) {
                    eprintln!("k3os-images: disk {} is up to date", img.display());
                } else {
                    Stamp::invalidate(&img)?;
                    disk::assemble(&spec, &img)
                        .with_context(|| format!("disk {}", img.display()))?;
                    st.record(&img)?;
                    eprintln!("k3os-images: disk {} built", img.display());
                }
            }
            println!("releases: {}", releases_dir.display());
            println!("disks:    {}/disk-*.img", arch_out.display());
            println!(
                "keys:     {} (public: {})",
                out.join("keys").display(),
                public.display()
            );
            eprintln!(
                "k3os-images: {arch} done in {:.1}s",
                t0.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}
