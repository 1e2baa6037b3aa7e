//! The booted slot's image archives, where k3s imports them at start: its airgap image
//! directory (`/var/lib/rancher/k3s/agent/images/` by default, the node config's
//! `airgap_dir`).
//!
//! [`activate`] runs on every boot before the health checks (and before k3s starts): it links
//! each image archive of the booted slot's release into the directory as
//! `k3os-<payload name>.tar`, a symbolic link to the payload's object in the store, and
//! removes the `k3os-*.tar` links no archive of the booted slot has. Only symbolic links with
//! that prefix are ever touched: archives an operator put there stay. Each link is made under a
//! temporary name and renamed over the old one, then the directory is synced, so a power cut
//! leaves every link either old or new. A rollback boots the other slot, whose next
//! [`activate`] links its own archives again; the store keeps both slots' objects.
//!
//! [`check`] is the built-in health check `images`: every archive is linked, has the size the
//! signed manifest says, and holds every image the manifest names (read again from the
//! archive, checked down to its blobs: [`super::archive_images`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Prefix of the links [`activate`] owns in the airgap directory.
pub const LINK_PREFIX: &str = "k3os-";
/// Default airgap image directory (k3s's).
pub const DEFAULT_DIR: &str = "/var/lib/rancher/k3s/agent/images";

/// One image archive of the booted slot's release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// The payload's name in the manifest (a plain name).
    pub name: String,
    /// Its object in the store.
    pub object: PathBuf,
    /// Its size in bytes, as the signed manifest says.
    pub size: u64,
    /// The images the signed manifest says it holds.
    pub images: Vec<String>,
}

impl Archive {
    /// The link's file name in the airgap directory.
    pub fn link_name(&self) -> String {
        format!("{LINK_PREFIX}{}.tar", self.name)
    }
}

/// What [`activate`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activated {
    /// Links made or re-pointed (file names).
    pub linked: Vec<String>,
    /// Links removed: no archive of the booted slot has them (file names).
    pub removed: Vec<String>,
}

/// Why the airgap directory could not be brought up to date.
#[derive(Debug, thiserror::Error)]
#[error("airgap image directory: cannot {what} {path}: {source}")]
pub struct AirgapError {
    /// What was being done.
    pub what: &'static str,
    /// The path it was done to.
    pub path: PathBuf,
    /// The error.
    #[source]
    pub source: std::io::Error,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> AirgapError + 'a {
    move |source| AirgapError {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Link every archive into `dir` and remove the links of archives the booted slot does not
/// have (see the module docs).
pub fn activate(dir: &Path, archives: &[Archive]) -> Result<Activated, AirgapError> {
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let mut done = Activated::default();
    let wanted: BTreeSet<String> = archives.iter().map(Archive::link_name).collect();
    for a in archives {
        let name = a.link_name();
        let link = dir.join(&name);
        if std::fs::read_link(&link).is_ok_and(|t| t == a.object) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&a.object, &tmp).map_err(io("link", &tmp))?;
        std::fs::rename(&tmp, &link).map_err(io("rename into place", &link))?;
        done.linked.push(name);
    }
    for e in std::fs::read_dir(dir).map_err(io("read", dir))? {
        let e = e.map_err(io("read", dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with(LINK_PREFIX) && name.ends_with(".tar");
        let is_link = e.file_type().is_ok_and(|t| t.is_symlink());
        if ours && is_link && !wanted.contains(&name) {
            std::fs::remove_file(e.path()).map_err(io("remove", &e.path()))?;
            done.removed.push(name);
        }
    }
    if !(done.linked.is_empty() && done.removed.is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync", dir))?;
    }
    Ok(done)
}

/// The built-in check: every archive is linked, complete and holds the images the manifest
/// names. `Err` lists every problem, `; `-joined (untrusted text escaped).
pub fn check(dir: &Path, archives: &[Archive]) -> Result<(), String> {
    let mut problems = Vec::new();
    for a in archives {
        let link = dir.join(a.link_name());
        match std::fs::metadata(&link) {
            Ok(m) if m.is_file() && m.len() == a.size => {}
            Ok(m) => {
                problems.push(format!(
                    "{} is {} bytes, the release says {}",
                    link.display(),
                    m.len(),
                    a.size
                ));
                continue;
            }
            Err(e) => {
                problems.push(format!("{}: {e}", link.display()));
                continue;
            }
        }
        match super::archive_images(&link) {
            Ok(held) => {
                let missing: Vec<String> = a
                    .images
                    .iter()
                    .filter(|i| !held.contains(i))
                    .map(|i| i.escape_debug().to_string())
                    .collect();
                if !missing.is_empty() {
                    problems.push(format!("{} lacks {}", link.display(), missing.join(", ")));
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests;
