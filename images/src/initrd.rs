//! The initrd: static busybox, the kernel modules the root needs (see
//! [`Target::initrd_modules`]), `/etc/modules` with their load order, `/dev/console`, and the
//! `/init` script (`images/files/initrd-init.sh`, or `initrd-init-panic.sh` for the `-panic`
//! variant) that finds `root=PARTLABEL=...`, mounts the squashfs and switch_roots into it.
//! Written as a gzip-compressed newc cpio.

use std::collections::BTreeSet;
use std::path::Path;

use crate::cpio::Entry;
use crate::debs::{read, Debs};
use crate::error::{Error, IoContext, Result};
use crate::kmod::{module_name, ModDeps};
use crate::run::Cmd;
use crate::target::Target;

pub const INIT: &str = include_str!("../files/initrd-init.sh");
pub const INIT_PANIC: &str = include_str!("../files/initrd-init-panic.sh");

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

/// Build the initrd at `out`.
pub fn build(debs: &Debs, target: Target, kind: InitKind, out: &Path) -> Result<()> {
    let applets = debs.busybox_applets(target)?;
    let modules = module_list(debs, target)?;

    let mut files: Vec<(String, Entry)> = Vec::new();
    files.push((
        "bin/busybox".into(),
        Entry::File {
            path: "bin/busybox".into(),
            mode: 0o755,
            data: read(&debs.busybox)?,
        },
    ));
    for a in &applets {
        if a == "bin/busybox" || a == "linuxrc" {
            continue;
        }
        files.push((
            a.clone(),
            Entry::Symlink {
                path: a.clone(),
                target: "/bin/busybox".into(),
            },
        ));
    }
    let mut load_order = String::new();
    for m in &modules {
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
        let path = format!("lib/modules/{base}");
        files.push((
            path.clone(),
            Entry::File {
                path,
                mode: 0o644,
                data: read(&src)?,
            },
        ));
        load_order.push_str(&base);
        load_order.push('\n');
    }
    files.push((
        "etc/modules".into(),
        Entry::File {
            path: "etc/modules".into(),
            mode: 0o644,
            data: load_order.into_bytes(),
        },
    ));
    let init = match kind {
        InitKind::Normal => INIT,
        InitKind::Panic => INIT_PANIC,
    };
    files.push((
        "init".into(),
        Entry::File {
            path: "init".into(),
            mode: 0o755,
            data: init.as_bytes().to_vec(),
        },
    ));

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

    let mut cpio = Vec::new();
    crate::cpio::write(&mut cpio, &entries).ctx("build cpio for", out)?;
    let gz = Cmd::new("gzip")
        .args(["-n", "-9", "-c"])
        .stdin(cpio)
        .run()?;
    std::fs::write(out, gz).ctx("write", out)?;
    eprintln!(
        "k3os-images: initrd {} ({} modules: {})",
        out.display(),
        modules.len(),
        modules
            .iter()
            .map(|m| module_name(m))
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(())
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
