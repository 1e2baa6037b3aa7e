//! The initrd: static busybox, the kernel modules the root needs (see
//! [`Target::initrd_modules`]), `/etc/modules` with their load order, the dm-verity modules
//! ([`Target::initrd_verity_modules`], `/etc/modules.verity`), the pstore backends
//! ([`Target::initrd_pstore_modules`], `/etc/modules.pstore`), the dm-verity helper
//! (`/bin/k3os-verity-open`, k3os-ops/src/bin/k3os-verity-open), `/dev/console`, and the
//! `/init` script (`images/files/initrd-init.sh`, or `initrd-init-panic.sh` for the `-panic`
//! variant) that finds `root=PARTLABEL=...`, opens it through dm-verity when the command line
//! names a root hash (`k3os.verity=`), mounts the squashfs and switch_roots into it.
//! Written as a gzip-compressed newc cpio.

pub mod cpio;
pub mod kmod;

use std::collections::BTreeSet;
use std::path::Path;

use crate::debs::{read, Debs};
use crate::error::{Error, IoContext, Result};
use crate::run::Cmd;
use crate::target::Target;
use cpio::Entry;
use kmod::{module_name, ModDeps};

pub const INIT: &str = include_str!("../../files/initrd-init.sh");
pub const INIT_PANIC: &str = include_str!("../../files/initrd-init-panic.sh");

/// Which `/init` the initrd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitKind {
    /// Mount the slot's squashfs and switch_root.
    Normal,
    /// Exit at once so the kernel panics (and `panic=N` reboots).
    Panic,
}

/// Ordered module paths (relative to the modules dir) the initrd loads.
pub fn module_list(debs: &Debs, target: Target) -> Result<Vec<String>> {
    ModDeps::load(&debs.modules_dir)?.resolve(target.initrd_modules())
}

/// Directories, in parent-first order, needed for `paths`.
fn parents<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut dirs = BTreeSet::new();
    for p in paths {
        let mut cur = Path::new(p).parent();
        while let Some(d) = cur {
            if d.as_os_str().is_empty() {
                break;
            }
            dirs.insert(d.to_string_lossy().into_owned());
            cur = d.parent();
        }
    }
    // BTreeSet order puts "a" before "a/b": parents first.
    dirs.into_iter().collect()
}

/// Ordered module paths the initrd loads for a dm-verity root, after [`module_list`]'s (those
/// left out).
pub fn verity_module_list(debs: &Debs, target: Target) -> Result<Vec<String>> {
    let base = module_list(debs, target)?;
    let all = ModDeps::load(&debs.modules_dir)?.resolve(target.initrd_verity_modules())?;
    Ok(all.into_iter().filter(|m| !base.contains(m)).collect())
}

/// Ordered module paths the initrd loads as pstore backends, after [`module_list`]'s (those
/// left out). A backend this kernel does not build as a module is left out: the target then
/// keeps no panic across a reboot, which is what the docs say per target.
pub fn pstore_module_list(debs: &Debs, target: Target) -> Result<Vec<String>> {
    let base = module_list(debs, target)?;
    let deps = ModDeps::load(&debs.modules_dir)?;
    let wanted: Vec<&str> = target
        .initrd_pstore_modules()
        .iter()
        .copied()
        .filter(|m| deps.contains(m))
        .collect();
    let all = deps.resolve(&wanted)?;
    Ok(all.into_iter().filter(|m| !base.contains(m)).collect())
}

/// Build the initrd at `out`, with `verity_open` as its dm-verity helper.
pub fn build(
    debs: &Debs,
    target: Target,
    kind: InitKind,
    verity_open: &Path,
    out: &Path,
) -> Result<()> {
    let modules = module_list(debs, target)?;
    let verity_modules = verity_module_list(debs, target)?;
    let pstore_modules = pstore_module_list(debs, target)?;
    let mut files = busybox_files(debs, target)?;
    files.extend(module_files(debs, &modules, "etc/modules")?);
    files.extend(module_files(debs, &verity_modules, "etc/modules.verity")?);
    files.extend(module_files(debs, &pstore_modules, "etc/modules.pstore")?);
    files.push(file("bin/k3os-verity-open", 0o755, read(verity_open)?));
    let init = match kind {
        InitKind::Normal => INIT,
        InitKind::Panic => INIT_PANIC,
    };
    files.push(file("init", 0o755, init.as_bytes().to_vec()));
    let entries = archive_entries(files);

    let mut cpio = Vec::new();
    cpio::write(&mut cpio, &entries).ctx("build cpio for", out)?;
    let gz = Cmd::new("gzip")
        .args(["-n", "-9", "-c"])
        .stdin(cpio)
        .run()?;
    std::fs::write(out, gz).ctx("write", out)?;
    let names = |ms: &[String]| ms.iter().map(|m| module_name(m)).collect::<Vec<_>>();
    eprintln!(
        "k3os-images: initrd {} ({} modules: {}; for dm-verity: {}; pstore: {})",
        out.display(),
        modules.len(),
        names(&modules).join(" "),
        names(&verity_modules).join(" "),
        names(&pstore_modules).join(" ")
    );
    Ok(())
}

/// A regular file of the archive, keyed by its path.
fn file(path: &str, mode: u32, data: Vec<u8>) -> (String, Entry) {
    (
        path.to_string(),
        Entry::File {
            path: path.to_string(),
            mode,
            data,
        },
    )
}

/// Static busybox and a symlink for each of its applets.
fn busybox_files(debs: &Debs, target: Target) -> Result<Vec<(String, Entry)>> {
    let mut files = vec![file("bin/busybox", 0o755, read(&debs.busybox)?)];
    for a in debs.busybox_applets(target)? {
        if a == "bin/busybox" || a == "linuxrc" {
            continue;
        }
        files.push((
            a.clone(),
            Entry::Symlink {
                path: a,
                target: "/bin/busybox".into(),
            },
        ));
    }
    Ok(files)
}

/// The modules (plain `.ko` only: busybox insmod reads no compressed ones) under
/// `lib/modules/`, and `list` (e.g. `etc/modules`) naming them in load order.
fn module_files(debs: &Debs, modules: &[String], list: &str) -> Result<Vec<(String, Entry)>> {
    let mut files = Vec::new();
    let mut load_order = String::new();
    for m in modules {
        let src = debs.modules_dir.join(m);
        let base = Path::new(m)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !base.ends_with(".ko") {
            return Err(Error::Input {
                path: src,
                what: "compressed module: busybox insmod needs plain .ko files".into(),
            });
        }
        files.push(file(&format!("lib/modules/{base}"), 0o644, read(&src)?));
        load_order.push_str(&base);
        load_order.push('\n');
    }
    files.push(file(list, 0o644, load_order.into_bytes()));
    Ok(files)
}

/// The archive in order: every directory (parents first, plus the mount points init uses),
/// the two device nodes, then `files` sorted by path.
fn archive_entries(mut files: Vec<(String, Entry)>) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut dirs = parents(files.iter().map(|(p, _)| p.as_str()));
    for d in ["dev", "proc", "sys", "newroot", "tmp"] {
        if !dirs.iter().any(|x| x == d) {
            dirs.push(d.into());
        }
    }
    dirs.sort();
    for d in dirs {
        entries.push(Entry::Dir {
            path: d,
            mode: 0o755,
        });
    }
    entries.push(Entry::CharDev {
        path: "dev/console".into(),
        mode: 0o600,
        major: 5,
        minor: 1,
    });
    entries.push(Entry::CharDev {
        path: "dev/null".into(),
        mode: 0o666,
        major: 1,
        minor: 3,
    });
    files.sort_by(|a, b| a.0.cmp(&b.0));
    entries.extend(files.into_iter().map(|(_, e)| e));
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_dirs_precede_children() {
        let d = parents(["usr/bin/wget", "bin/sh", "usr/sbin/x"].into_iter());
        assert_eq!(d, ["bin", "usr", "usr/bin", "usr/sbin"]);
    }
}
