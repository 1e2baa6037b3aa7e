//! Kernel module selection for the initrd: resolve a list of wanted modules to every module
//! file they need, dependencies first, from the `modules.dep` that `depmod` wrote for the
//! extracted Debian kernel. Built-in modules (absent from `modules.dep`) are skipped.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

/// Parsed `modules.dep`: module name -> (path relative to the modules dir, dependencies).
pub struct ModDeps {
    file: PathBuf,
    by_name: HashMap<String, (String, Vec<String>)>,
}

/// `kernel/drivers/virtio/virtio_pci.ko[.xz]` -> `virtio_pci` (dashes and underscores are
/// the same to the kernel; normalised to underscores).
pub fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = base.split(".ko").next().unwrap_or(base);
    stem.replace('-', "_")
}

impl ModDeps {
    pub fn load(modules_dir: &Path) -> Result<ModDeps> {
        let file = modules_dir.join("modules.dep");
        let text = std::fs::read_to_string(&file).ctx("read", &file)?;
        Self::parse(file, &text)
    }

    pub fn parse(file: PathBuf, text: &str) -> Result<ModDeps> {
        let mut by_name = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (path, deps) = line.split_once(':').ok_or_else(|| Error::Input {
                path: file.clone(),
                what: format!(
                    "line {}: expected '<module path>: <deps>', found '{line}'",
                    n + 1
                ),
            })?;
            let deps = deps.split_whitespace().map(module_name).collect();
            by_name.insert(module_name(path), (path.trim().to_string(), deps));
        }
        Ok(ModDeps { file, by_name })
    }

    /// Whether `name` (dashes or underscores) is a loadable module of this kernel.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(&name.replace('-', "_"))
    }

    /// Paths (relative to the modules dir) of `wanted` and their dependencies, each after
    /// everything it depends on. `modules.dep` lists a module's dependencies so that loading
    /// them last-to-first works; this walk does that recursively.
    pub fn resolve(&self, wanted: &[&str]) -> Result<Vec<String>> {
        let mut order = Vec::new();
        let mut done = HashSet::new();
        for w in wanted {
            self.visit(&w.replace('-', "_"), &mut done, &mut Vec::new(), &mut order)?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        done: &mut HashSet<String>,
        stack: &mut Vec<String>,
        order: &mut Vec<String>,
    ) -> Result<()> {
        if done.contains(name) {
            return Ok(());
        }
        if stack.iter().any(|s| s == name) {
            return Err(Error::Input {
                path: self.file.clone(),
                what: format!("dependency cycle: {} -> {name}", stack.join(" -> ")),
            });
        }
        let (path, deps) = self.by_name.get(name).ok_or_else(|| Error::Input {
            path: self.file.clone(),
            what: format!(
                "module {name} is not listed (neither a module of this kernel nor a dependency)"
            ),
        })?;
        stack.push(name.to_string());
        for d in deps.iter().rev() {
            self.visit(d, done, stack, order)?;
        }
        stack.pop();
        done.insert(name.to_string());
        order.push(path.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/squashfs/squashfs.ko:
kernel/crypto/crc32c_generic.ko:
";

    #[test]
    fn dependencies_come_first_in_load_order() {
        let d = ModDeps::parse("modules.dep".into(), DEP).unwrap();
        let order: Vec<String> = d
            .resolve(&["virtio_pci", "virtio-blk", "squashfs"])
            .unwrap()
            .iter()
            .map(|p| module_name(p))
            .collect();
        assert_eq!(
            order,
            [
                "virtio_ring",
                "virtio",
                "virtio_pci_modern_dev",
                "virtio_pci_legacy_dev",
                "virtio_pci",
                "virtio_blk",
                "squashfs"
            ]
        );
    }

    #[test]
    fn unknown_module_is_named() {
        let d = ModDeps::parse("x/modules.dep".into(), DEP).unwrap();
        let e = d.resolve(&["ext4"]).unwrap_err().to_string();
        assert!(e.contains("ext4") && e.contains("x/modules.dep"), "{e}");
    }

    #[test]
    fn malformed_line_is_refused() {
        let e = ModDeps::parse("m".into(), "no colon here\n")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("line 1"), "{e}");
    }
}
