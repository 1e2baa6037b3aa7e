//! `k3os-images build`: build the signed test releases and the A/B test disks of one
//! architecture (see the library docs for the pipeline). Normally run by `just images-<arch>`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use k3os_images::debs::Debs;
use k3os_images::disk;
use k3os_images::kube::KubeInputs;
use k3os_images::release::{ensure_channel_root, ensure_keys, ReleaseBuilder, CHANNEL_ROOT_DIR};
use k3os_images::spec::{
    disk_file_name, BootVariant, DiskSpec, Release, ReleaseSpec, SignedBoot, Sizes,
};
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
        /// Static k3os-verity-open for the target (the initrd's dm-verity helper; default: the
        /// one beside --k3os-ops).
        #[arg(long)]
        verity_open: Option<PathBuf>,
        /// k3os-ops runnable on this host (signs the releases).
        #[arg(long)]
        tool: PathBuf,
        /// Output root (images/out).
        #[arg(long, default_value = "images/out")]
        out: PathBuf,
        /// Releases to build (default: v1 v2 v3 v2-panic v2-noconfirm v2-badhealth v4-panic
        /// v2-nonet v2-verity).
        #[arg(long = "release", value_parser = ReleaseSpec::parse)]
        releases: Vec<ReleaseSpec>,
        /// Disk boot variants (default: all the architecture has, but grub-efi-sb, which needs
        /// --secure-boot).
        #[arg(long = "boot", value_parser = BootVariant::parse)]
        boots: Vec<BootVariant>,
        /// Release installed in slot A of every disk.
        #[arg(long, default_value = "v1")]
        slot_a: String,
        /// The Kubernetes node variant's Debian packages (`-kube` releases):
        /// `.cache/debs/<arch>/kube/root` from `images/scripts/fetch-debs.sh --kube <arch>`.
        #[arg(long, requires = "kube_assets")]
        kube_debs: Option<PathBuf>,
        /// The Kubernetes binaries of the target's platform for `-kube` releases (the kubelet):
        /// `.cache/kube/<version>/linux-<amd64|arm64>`.
        #[arg(long, requires = "kube_debs")]
        kube_assets: Option<PathBuf>,
        /// The agent's OCI image archive for the target's platform (k3os-oci with
        /// `--layer-compression none`), a payload of every `-kube` release.
        #[arg(long, requires = "kube_debs")]
        kube_agent_image: Option<PathBuf>,
        /// Also make the signed UEFI path's pieces (x86_64): the test Secure Boot key
        /// (`<out>/keys/secure-boot/`), each built release's signed UKIs
        /// (`<out>/<arch>/uki/<version>/k3os-{a,b}.efi`) and the OVMF variable store with the
        /// key enrolled (`<out>/<arch>/secure-boot/OVMF_VARS_4M.fd`).
        #[arg(long)]
        secure_boot: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Command::Build {
            arch,
            debs,
            k3os_ops,
            verity_open,
            tool,
            out,
            releases,
            boots,
            slot_a,
            kube_debs,
            kube_assets,
            kube_agent_image,
            secure_boot,
        } => {
            let t0 = Instant::now();
            let target = Target::new(arch);
            let debs = Debs::locate(&debs, target)?;
            let keys = out.join("keys");
            let (secret, public) = ensure_keys(&tool, &keys).context("test signing key")?;
            let arch_out = out.join(arch.as_str());
            let channel_root =
                ensure_channel_root(&arch_out.join("keys"), &arch_out.join(CHANNEL_ROOT_DIR))
                    .context("test channel root")?;
            let builder = ReleaseBuilder {
                target,
                debs: debs.clone(),
                verity_open: verity_open
                    .unwrap_or_else(|| k3os_ops.with_file_name("k3os-verity-open")),
                k3os_ops,
                tool: tool.clone(),
                out: arch_out.clone(),
                keys,
                channel_root,
                kube: kube_inputs(kube_debs, kube_assets, kube_agent_image)?,
            };
            let signing = Signing {
                secret: &secret,
                public: &public,
            };
            let built = build_releases(&builder, &releases, &signing)?;
            // No channel index here: the failure variants share generation 2 with v2 on purpose,
            // which a channel (one release per generation) refuses. Tests name release dirs directly.
            let slot_a_release = match built.iter().find(|r| r.spec.version == slot_a) {
                Some(r) => r.clone(),
                None => builder.build(
                    &ReleaseSpec::parse(&slot_a).map_err(anyhow::Error::msg)?,
                    &secret,
                    &public,
                )?,
            };
            let sb_keys = out.join("keys");
            let sb = secure_boot
                .then(|| secure_boot_pieces(target, &built, &slot_a_release, &sb_keys, &arch_out))
                .transpose()?;
            let base = DiskSpec {
                target,
                variant: BootVariant::GrubEfi,
                sizes: sizes_for(&built)?,
                slot_a: &slot_a_release,
                debs: &debs,
                tool: &tool,
                signed: sb.as_ref().map(|(key, uki)| SignedBoot {
                    key: &key.key,
                    cert: &key.cert,
                    slot_a_uki: uki,
                }),
            };
            build_disks(base, boots, &arch_out)?;
            print_built(&arch_out.join("releases"), &arch_out, &out, &public);
            eprintln!(
                "k3os-images: {arch} done in {:.1}s",
                t0.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}

/// The Kubernetes node variant's inputs, when their flags are given (clap requires the
/// Debian tree and the assets together; the agent image is named when missing).
fn kube_inputs(
    debs: Option<PathBuf>,
    assets: Option<PathBuf>,
    agent_image: Option<PathBuf>,
) -> anyhow::Result<Option<KubeInputs>> {
    Ok(match (debs, assets) {
        (Some(d), Some(a)) => {
            let image = agent_image.context(
                "--kube-debs and --kube-assets need --kube-agent-image (the agent's OCI archive, \
                 written by `just images-kube-<arch>`)",
            )?;
            Some(KubeInputs::locate(&d, &a, &image)?)
        }
        _ => None,
    })
}

/// Where the releases, disks and keys of a build are.
fn print_built(releases_dir: &Path, arch_out: &Path, out: &Path, public: &Path) {
    println!("releases: {}", releases_dir.display());
    println!("disks:    {}/disk-*.img", arch_out.display());
    println!(
        "keys:     {} (public: {})",
        out.join("keys").display(),
        public.display()
    );
}

/// The test signing key pair.
struct Signing<'a> {
    secret: &'a Path,
    public: &'a Path,
}

/// Build (or reuse) `releases`, the standard set when empty.
fn build_releases(
    builder: &ReleaseBuilder,
    releases: &[ReleaseSpec],
    keys: &Signing,
) -> anyhow::Result<Vec<Release>> {
    let standard;
    let releases = if releases.is_empty() {
        standard = ReleaseSpec::standard();
        &standard[..]
    } else {
        releases
    };
    let mut built = Vec::new();
    for spec in releases {
        let r = builder
            .build(spec, keys.secret, keys.public)
            .with_context(|| format!("release {}", spec.version))?;
        eprintln!(
            "k3os-images: release {} -> {}",
            spec.version,
            r.dir.display()
        );
        built.push(r);
    }
    Ok(built)
}

/// The test Secure Boot key, the signed UKIs of the `built` releases and `slot_a`'s, and the enrolled OVMF variable
/// store (x86_64 only: the arm64 stub and AAVMF's Secure Boot build are not set up yet).
fn secure_boot_pieces(
    target: Target,
    built: &[Release],
    slot_a: &Release,
    keys: &Path,
    arch_out: &Path,
) -> anyhow::Result<(k3os_images::secboot::SbKey, PathBuf)> {
    use k3os_images::secboot;
    let mut releases = built.to_vec();
    if !releases.iter().any(|r| r.spec == slot_a.spec) {
        releases.push(slot_a.clone());
    }
    anyhow::ensure!(
        target.arch == Arch::X86_64,
        "--secure-boot: only x86_64 has a signed UEFI path so far (not {})",
        target.arch.as_str()
    );
    let t0 = Instant::now();
    let key = secboot::ensure_key(keys).context("test Secure Boot key")?;
    let mut slot_a_uki = None;
    for r in &releases {
        let [a, _] = k3os_images::release::slot_ukis(target, r, &key, arch_out)
            .with_context(|| format!("signed UKIs of release {}", r.spec.version))?;
        if r.spec == slot_a.spec {
            slot_a_uki = Some(a);
        }
    }
    let vars = arch_out.join("secure-boot").join("OVMF_VARS_4M.fd");
    let mut st = Stamp::new();
    st.file("template", Path::new(secboot::OVMF_VARS_TEMPLATE))?
        .file("cert", &key.cert)?;
    if !st.is_fresh(&vars) {
        Stamp::invalidate(&vars)?;
        std::fs::create_dir_all(arch_out.join("secure-boot"))?;
        secboot::enrolled_vars(Path::new(secboot::OVMF_VARS_TEMPLATE), &key.cert, &vars)
            .context("OVMF variable store with the test key enrolled")?;
        st.record(&vars)?;
    }
    eprintln!(
        "k3os-images: Secure Boot pieces of {} releases in {:.1}s",
        releases.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok((key, slot_a_uki.context("slot A's UKI was not built")?))
}

/// Partition sizes with room for the largest rootfs of `built`.
fn sizes_for(built: &[Release]) -> anyhow::Result<Sizes> {
    let mut largest = 0;
    for r in built {
        largest = largest.max(
            std::fs::metadata(&r.rootfs)
                .with_context(|| r.rootfs.display().to_string())?
                .len(),
        );
    }
    Ok(Sizes::for_largest_rootfs(largest))
}

/// Every disk of `boots` (the architecture's default set when empty), as `base` with that
/// variant.
fn build_disks(base: DiskSpec, boots: Vec<BootVariant>, arch_out: &Path) -> anyhow::Result<()> {
    let boots = if boots.is_empty() {
        BootVariant::for_target(base.target)
    } else {
        boots
    };
    for variant in boots {
        build_disk(&DiskSpec { variant, ..base }, arch_out)?;
    }
    Ok(())
}

/// `disk-<variant>.img` in `arch_out`, rebuilt only when its inputs changed.
fn build_disk(spec: &DiskSpec, arch_out: &Path) -> anyhow::Result<()> {
    let img = arch_out.join(disk_file_name(spec.variant, &spec.slot_a.spec));
    let mut st = Stamp::new();
    st.param("variant", spec.variant.name())
        .param("sizes", format!("{:?}", spec.sizes))
        .param("loader", k3os_images::loader::fingerprint(spec)?)
        .file(
            "manifest",
            &spec.slot_a.dir.join(libupgrade::manifest::MANIFEST_FILE),
        )?;
    if st.is_fresh(&img) {
        eprintln!("k3os-images: disk {} is up to date", img.display());
    } else {
        Stamp::invalidate(&img)?;
        disk::assemble(spec, &img).with_context(|| format!("disk {}", img.display()))?;
        st.record(&img)?;
        eprintln!("k3os-images: disk {} built", img.display());
    }
    Ok(())
}
