//! Every file under a directory with its bytes, to assert that a refused command changed
//! nothing (a channel directory the nodes read, a node's slots and state).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Each regular file and symlink under `dir` (paths relative to it) with its bytes (a
/// symlink's target for a link); directories appear as empty entries so a new empty one counts.
pub fn tree_bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            let meta = fs::symlink_metadata(&p).unwrap();
            if meta.is_symlink() {
                let target = fs::read_link(&p).unwrap();
                out.insert(rel, target.as_os_str().as_encoded_bytes().to_vec());
            } else if meta.is_dir() {
                out.insert(rel, Vec::new());
                todo.push(p);
            } else {
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// Panics naming the first path that differs between two [`tree_bytes`] (what `what` was).
pub fn assert_same_tree(
    what: &str,
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
) {
    let keys: std::collections::BTreeSet<_> = before.keys().chain(after.keys()).collect();
    for k in keys {
        assert!(
            before.get(k) == after.get(k),
            "{what}: {} changed ({} → {})",
            k.display(),
            before
                .get(k)
                .map_or("absent".into(), |b| format!("{} bytes", b.len())),
            after
                .get(k)
                .map_or("absent".into(), |b| format!("{} bytes", b.len())),
        );
    }
}
