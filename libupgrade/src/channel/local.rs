//! Local channel directories: their `index.json`, and rebuilding it from the release
//! subdirectories (what `release create` and `release index` do).

use std::fs;
use std::path::Path;

use super::{io_err, sort_newest_first, ChannelError, Index, IndexEntry, INDEX_FILE};
use crate::manifest::{Manifest, MANIFEST_FILE, SIGNATURE_FILE};

/// Read `DIR/index.json`.
pub fn read_local_index(dir: &Path) -> Result<Index, ChannelError> {
    let path = dir.join(INDEX_FILE);
    let bytes = fs::read(&path).map_err(io_err(&path))?;
    Index::parse(&bytes, &path.display().to_string())
}

/// Build the index of a channel directory from its release subdirectories (those holding a
/// `manifest.json`). Refuses unsigned releases, malformed manifests and two releases claiming
/// the same generation for one architecture.
pub fn build_index(dir: &Path) -> Result<Index, ChannelError> {
    let mut entries = Vec::new();
    let mut names: Vec<_> = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io_err(dir))?;
    names.sort();
    for sub in names {
        let manifest_path = sub.join(MANIFEST_FILE);
        // A hidden directory is a release `release create` is still building: never listed.
        let hidden = sub
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden || !sub.is_dir() || !manifest_path.is_file() {
            continue;
        }
        if !sub.join(SIGNATURE_FILE).is_file() {
            return Err(ChannelError::Unsigned { dir: sub });
        }
        let bytes = fs::read(&manifest_path).map_err(io_err(&manifest_path))?;
        let m = Manifest::parse(&bytes).map_err(|source| ChannelError::Manifest {
            location: manifest_path.display().to_string(),
            source,
        })?;
        let name = sub
            .file_name()
            .expect("read_dir entries have names")
            .to_string_lossy()
            .into_owned();
        entries.push(IndexEntry {
            version: m.version,
            generation: m.generation,
            arch: m.arch,
            path: format!("{name}/"),
        });
    }
    sort_newest_first(&mut entries);
    for pair in entries.windows(2) {
        if pair[0].arch == pair[1].arch && pair[0].generation == pair[1].generation {
            return Err(ChannelError::DuplicateGeneration {
                channel: dir.display().to_string(),
                first: pair[0].path.clone(),
                second: pair[1].path.clone(),
                generation: pair[0].generation,
                arch: pair[0].arch,
            });
        }
    }
    Ok(Index::new(entries))
}

/// Rebuild and atomically write `DIR/index.json`; returns the new index.
pub fn write_index(dir: &Path) -> Result<Index, ChannelError> {
    let index = build_index(dir)?;
    let tmp = dir.join(format!(".{INDEX_FILE}.part"));
    let path = dir.join(INDEX_FILE);
    fs::write(&tmp, index.to_bytes()).map_err(io_err(&tmp))?;
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&tmp))?;
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(index)
}
