//! The slot root filesystem (squashfs): static busybox, the static `k3os-ops`, `/sbin/init`
//! (`images/files/rootfs-init.sh`), the node configuration for both bootloaders (init picks one
//! by what exists on /boot), the trusted release key, the test channel's root
//! (`/etc/k3os-ops/root.json`), `/etc/k3os-release`, and the failure variant's twist (a failing
//! health check, no confirm at all, or no network).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use crate::debs::Debs;
use crate::error::{IoContext, Result};
use crate::run::Cmd;
use crate::spec::{ReleaseSpec, Variant, GRUB_TRIES};
use crate::target::Target;

pub const INIT: &str = include_str!("../files/rootfs-init.sh");
pub const UDHCPC_SCRIPT: &str = include_str!("../files/udhcpc.script");
pub const PROFILE: &str = include_str!("../files/profile");

/// `/sbin/k3os-node-config`: writes each boot's node config from the loader's and the report
/// keys a scenario put on the state partition ([`REPORT_TO`]).
pub const NODE_CONFIG_SCRIPT: &str = include_str!("../files/node-config.sh");

/// Where a test node reports its outcomes once a scenario turns reporting on: a fixed
/// guest-side address that vm-tests forwards, per VM, to the host port of that VM's own
/// collector (QEMU user networking's `guestfwd`, `vm-tests/src/target/mod.rs`). The boot-time
/// confirm reads the config before the harness could tell the guest anything, so the address
/// cannot name a host port chosen at run time.
pub const REPORT_URL: &str = "http://10.0.2.100/v1/reports";
/// The site a test node reports as (the `report-spool` scenario enrols it).
pub const REPORT_SITE: &str = "vm-site";
/// The file on the state partition whose lines [`NODE_CONFIG_SCRIPT`] puts before the loader's
/// config: absent (every disk as built), the test OS reports nowhere, so a scenario or the demo
/// without a collector sends nothing; `report-spool` writes [`report_keys`] there.
pub const REPORT_TO: &str = "/var/lib/k3os-ops/report-to.toml";

/// The config lines that turn reporting on (to [`REPORT_URL`] as [`REPORT_SITE`]), for
/// [`REPORT_TO`]: top-level keys, so they go before the config's `[layout]` table.
pub fn report_keys() -> String {
    format!("report_url = \"{REPORT_URL}\"\nreport_site = \"{REPORT_SITE}\"\n")
}

/// The node configuration (`/etc/k3os-ops/config.<loader>.toml`) libupgrade reads.
pub fn node_config(bootloader: &str, tries: u8) -> String {
    format!(
        "bootloader = \"{bootloader}\"\n\
         tries = {tries}\n\
         state_dir = \"/var/lib/k3os-ops\"\n\
         trust_dir = \"/etc/k3os-ops/trust.d\"\n\
         health_dir = \"/etc/k3os-ops/health.d\"\n\
         health_timeout_secs = 30\n\
         [layout]\n\
         kind = \"gpt\"\n\
         disk = \"/dev/vda\"\n\
         boot_dir = \"/boot\"\n"
    )
}

/// `/etc/k3os-release`: `KEY=value` lines as libupgrade's health check parses them.
pub fn release_file(spec: &ReleaseSpec) -> String {
    format!(
        "VERSION=\"{}\"\nGENERATION={}\n",
        spec.version, spec.generation
    )
}

const BADHEALTH_CHECK: &str = "#!/bin/sh\n\
# Health check of the -badhealth test release: always fails, so confirm rolls back.\n\
echo \"badhealth: this release fails its health check on purpose\" >&2\n\
exit 1\n";

fn write(path: &Path, data: impl AsRef<[u8]>, mode: u32) -> Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).ctx("create directory", d)?;
    }
    fs::write(path, data).ctx("write", path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).ctx("chmod", path)
}

fn link(target: &str, path: &Path) -> Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).ctx("create directory", d)?;
    }
    symlink(target, path).ctx("symlink", path)
}

/// The "application" each release ships: incompressible bytes that differ between generations
/// (the variants of one generation share them). It makes the test releases look like a real
/// update to the delta path — most of the image (kernel, initrd, busybox, k3os-ops) is unchanged
/// and reused from the running slot, a few MiB are new and fetched — and gives the `upgrade`
/// scenario a download long enough to poll the workload during it.
pub const APP_FILE: &str = "srv/app/payload.bin";
/// Size of [`APP_FILE`].
pub const APP_BYTES: usize = 4 << 20;

/// [`APP_FILE`]'s content for `generation` (xorshift64*, seeded by the generation).
pub fn app_payload(generation: u64) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ generation.wrapping_mul(0xd134_2543_de82_ef95);
    let mut out = Vec::with_capacity(APP_BYTES);
    while out.len() < APP_BYTES {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(APP_BYTES);
    out
}

/// What a node trusts: the release key (trust.d) and its channel's root.
pub struct NodeTrust<'a> {
    /// Public key put into `/etc/k3os-ops/trust.d/`.
    pub release_key: &'a Path,
    /// Root metadata put at `/etc/k3os-ops/root.json` (the config's default `channel_root`).
    pub channel_root: &'a Path,
}

/// Populate `dir` (empty) with the rootfs tree.
pub fn populate(
    dir: &Path,
    debs: &Debs,
    target: Target,
    k3os_ops: &Path,
    trust: &NodeTrust,
    spec: &ReleaseSpec,
) -> Result<()> {
    for d in [
        "proc",
        "sys",
        "dev",
        "boot",
        "tmp",
        "run",
        "var",
        "root",
        "mnt",
        "usr/bin",
        "usr/sbin",
        "etc/k3os-ops/health.d",
    ] {
        fs::create_dir_all(dir.join(d)).ctx("create directory", dir.join(d))?;
    }
    write(
        &dir.join("bin/busybox"),
        fs::read(&debs.busybox).ctx("read", &debs.busybox)?,
        0o755,
    )?;
    for a in debs.busybox_applets(target)? {
        if a == "bin/busybox" || a == "linuxrc" || a == "sbin/init" {
            continue;
        }
        link("/bin/busybox", &dir.join(&a))?;
    }
    write(
        &dir.join("usr/bin/k3os-ops"),
        fs::read(k3os_ops).ctx("read", k3os_ops)?,
        0o755,
    )?;
    write(&dir.join("sbin/init"), INIT, 0o755)?;
    write(
        &dir.join("sbin/k3os-node-config"),
        NODE_CONFIG_SCRIPT,
        0o755,
    )?;
    write(&dir.join("etc/udhcpc/default.script"), UDHCPC_SCRIPT, 0o755)?;
    write(&dir.join("etc/profile"), PROFILE, 0o644)?;
    write(
        &dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\n",
        0o644,
    )?;
    write(&dir.join("etc/group"), "root:x:0:\n", 0o644)?;
    write(&dir.join("etc/hostname"), "k3os-node\n", 0o644)?;
    link("/run/resolv.conf", &dir.join("etc/resolv.conf"))?;
    write(&dir.join("srv/www/index.html"), "alive\n", 0o644)?;
    write(&dir.join(APP_FILE), app_payload(spec.generation), 0o644)?;
    write(&dir.join("etc/k3os-release"), release_file(spec), 0o644)?;
    node_files(dir, trust, spec)
}

/// `/etc/k3os-ops`: the node configuration for both loaders, the trusted key, the channel
/// root, and the failure variant's twist.
fn node_files(dir: &Path, trust: &NodeTrust, spec: &ReleaseSpec) -> Result<()> {
    let trust_pub = trust.release_key;
    let ops = dir.join("etc/k3os-ops");
    write(
        &ops.join("config.grub.toml"),
        node_config("grub", GRUB_TRIES),
        0o644,
    )?;
    write(
        &ops.join("config.syslinux.toml"),
        node_config("syslinux", 1),
        0o644,
    )?;
    // Tools run without K3OS_OPS_CONFIG get the one init wrote for this boot.
    link("/run/k3os-ops/config.toml", &ops.join("config.toml"))?;
    let key_name = trust_pub
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "release.pub".into());
    write(
        &ops.join("trust.d").join(key_name),
        fs::read(trust_pub).ctx("read", trust_pub)?,
        0o644,
    )?;
    write(
        &ops.join("root.json"),
        fs::read(trust.channel_root).ctx("read", trust.channel_root)?,
        0o644,
    )?;
    match spec.variant {
        Variant::Normal
        | Variant::Panic
        | Variant::Verity
        | Variant::Kube
        | Variant::KubeNotReady => {}
        Variant::BadHealth => write(&ops.join("health.d/10-badhealth"), BADHEALTH_CHECK, 0o755)?,
        Variant::NoConfirm => write(&ops.join("mode"), "noconfirm\n", 0o644)?,
        Variant::NoNet => write(&ops.join("mode"), "nonet\n", 0o644)?,
    }
    Ok(())
}

/// mksquashfs options of every slot image: reproducible (mksquashfs sorts each directory
/// itself; every inode gets time 0 and owner root, the superblock time 0, no xattrs), so an
/// unchanged file yields the same bytes in the next version and the chunk index finds them.
/// zstd: fast to decompress under TCG and supported by the Debian kernel.
/// `-no-fragments`: measured by `just bench-delta` on real Debian images (README, "Delta
/// updates"): fragments pack the tails of many files into shared blocks, so one changed file
/// changes blocks its neighbours share; without them a monthly update fetched the fewest bytes
/// (the image grows ~3%). `-b 64K` (RAUC's advice for 4 KiB block hashing) did not help
/// content-defined chunks and grows the image further.
pub const MKSQUASHFS_OPTS: &[&str] = &[
    "-noappend",
    "-all-root",
    "-no-xattrs",
    "-comp",
    "zstd",
    "-no-fragments",
    "-mkfs-time",
    "0",
    "-all-time",
    "0",
    "-quiet",
];

/// Build `out` (squashfs with [`MKSQUASHFS_OPTS`]).
pub fn build(
    debs: &Debs,
    target: Target,
    k3os_ops: &Path,
    trust: &NodeTrust,
    spec: &ReleaseSpec,
    out: &Path,
) -> Result<()> {
    build_with(debs, target, k3os_ops, trust, spec, out, |_| Ok(()))
}

/// [`build`], with `extra` adding to the populated tree before it is packed (a variant's own
/// files: the Kubernetes node's, `crate::kube`).
pub fn build_with(
    debs: &Debs,
    target: Target,
    k3os_ops: &Path,
    trust: &NodeTrust,
    spec: &ReleaseSpec,
    out: &Path,
    extra: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("rootfs.")
        .tempdir_in(out.parent().unwrap_or(Path::new(".")))
        .ctx("create temp dir near", out)?;
    let tree = tmp.path().join("tree");
    fs::create_dir(&tree).ctx("create directory", &tree)?;
    populate(&tree, debs, target, k3os_ops, trust, spec)?;
    extra(&tree)?;
    let _ = fs::remove_file(out);
    mksquashfs(&tree, out)
}

/// `mksquashfs tree out` with [`MKSQUASHFS_OPTS`].
pub fn mksquashfs(tree: &Path, out: &Path) -> Result<()> {
    Cmd::new("mksquashfs")
        .arg(tree)
        .arg(out)
        .args(MKSQUASHFS_OPTS)
        .run()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same content gives the same image whatever the files' times, owners and creation
    /// order, and a release with one file changed keeps the other files' bytes.
    #[test]
    fn squashfs_images_are_reproducible() {
        let t = tempfile::tempdir().unwrap();
        let noise = |n: usize, seed: u64| -> Vec<u8> {
            let mut x = seed | 1;
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 32) as u8 & 0x3f
                })
                .collect()
        };
        let make = |name: &str, order: &[u64], changed: Option<u64>| {
            let tree = t.path().join(name);
            for &i in order {
                let d = tree.join(format!("d{}", i % 3));
                fs::create_dir_all(&d).unwrap();
                let data = noise(
                    100_000 + i as usize * 7_000,
                    if changed == Some(i) { 99 } else { i + 1 },
                );
                let p = d.join(format!("f{i}"));
                fs::write(&p, data).unwrap();
                let ft = filetime_secs(1_600_000_000 + order[0] as i64 * 1000 + i as i64);
                let f = fs::File::options().write(true).open(&p).unwrap();
                f.set_modified(ft).unwrap();
            }
            let out = t.path().join(format!("{name}.sq"));
            mksquashfs(&tree, &out).unwrap();
            fs::read(out).unwrap()
        };
        let a = make("a", &[0, 1, 2, 3, 4, 5, 6, 7], None);
        let b = make("b", &[7, 3, 5, 1, 0, 6, 2, 4], None);
        assert!(a == b, "same content, other times and order: images differ");
        let c = make("c", &[0, 1, 2, 3, 4, 5, 6, 7], Some(5));
        // Only the changed file's blocks (and the tables) differ: content-defined chunks (as a
        // node's delta update finds them) cover most of the new image with old bytes.
        use libupgrade::chunk::{ChunkIndex, ChunkParams};
        let p = ChunkParams::with_avg(4096);
        let old: std::collections::HashSet<_> = ChunkIndex::build(&a[..], p)
            .unwrap()
            .chunks
            .iter()
            .map(|c| c.digest)
            .collect();
        let new = ChunkIndex::build(&c[..], p).unwrap();
        let kept: u64 = new
            .chunks
            .iter()
            .filter(|c| old.contains(&c.digest))
            .map(|c| u64::from(c.len))
            .sum();
        assert!(
            kept * 10 >= c.len() as u64 * 7,
            "only {kept} of {} bytes kept",
            c.len()
        );
    }

    fn filetime_secs(s: i64) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(s as u64)
    }

    #[test]
    fn node_config_is_what_libupgrade_parses() {
        for (loader, tries) in [("grub", GRUB_TRIES), ("syslinux", 1)] {
            let c = libupgrade::Config::parse(&node_config(loader, tries)).unwrap();
            assert_eq!(c.tries, tries);
            assert_eq!(c.trust_dir, Path::new("/etc/k3os-ops/trust.d"));
            assert_eq!(c.layout.boot_dir(), Path::new("/boot"));
            assert_eq!(
                c.report_url, None,
                "the test OS reports nowhere unless asked"
            );
            // What k3os-node-config writes once a scenario put the report keys in place.
            let reporting = format!("{}{}", report_keys(), node_config(loader, tries));
            let c = libupgrade::Config::parse(&reporting).unwrap();
            assert_eq!(c.report_url.as_deref(), Some(REPORT_URL));
            assert_eq!(c.report_site.as_deref(), Some(REPORT_SITE));
            assert_eq!(c.layout.boot_dir(), Path::new("/boot"));
        }
    }

    #[test]
    fn release_file_is_what_libupgrade_parses() {
        let spec = ReleaseSpec::parse("v2-badhealth").unwrap();
        let (v, g) = libupgrade::health::parse_release_file(&release_file(&spec));
        assert_eq!(v.as_deref(), Some("v2-badhealth"));
        assert_eq!(g, Some(2));
    }
}
