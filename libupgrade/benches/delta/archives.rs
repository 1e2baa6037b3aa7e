//! The image-archive pair of `just bench-delta` (issue 33): the agent's own OCI image from two
//! commits (`benches/delta-images.sh` writes them), each as a plain-tar layer (what a release
//! carries as a payload) and a gzipped layer (what a registry serves). Printed as shares of the
//! new plain archive's size:
//! - ours, chunks: the new archive's chunks the old one lacks, the index and the headers;
//! - ours, patch: a `plain` per-pair patch old → new;
//! - xdelta3 -9 on the same pair;
//! - ours, chunks of the gzipped archives (why a release carries plain layers);
//! - registry pull: the blobs (layers, configs, manifests) of the new image whose digests the
//!   old one lacks, as `docker pull`/`ctr pull` of the new tag would fetch them.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::Path;

use libupgrade::chunk::ChunkParams;

use super::{ours, patch_run, pct, xdelta};

/// Digest → size of every blob in an OCI archive.
fn blobs(archive: &Path) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let mut ar = tar::Archive::new(fs::File::open(archive).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        if let Some(d) = name.strip_prefix("blobs/sha256/") {
            out.insert(d.to_string(), e.size());
        }
        std::io::copy(&mut e.by_ref().take(0), &mut std::io::sink()).unwrap();
    }
    out
}

fn registry_pull(old: &Path, new: &Path) -> u64 {
    let have: HashSet<String> = blobs(old).into_keys().collect();
    blobs(new)
        .into_iter()
        .filter(|(d, _)| !have.contains(d))
        .map(|(_, s)| s)
        .sum()
}

/// Print the pair's rows, if its inputs exist (else say how to make them).
pub fn run(cache: &Path, work: &Path) {
    let dir = cache.join("oci");
    let f = |n: &str| dir.join(n);
    if !f("new-plain.tar").is_file() {
        println!(
            "\nimage archives: skipped, {} missing (run libupgrade/benches/delta-images.sh {})",
            f("new-plain.tar").display(),
            cache.display()
        );
        return;
    }
    let size = fs::metadata(f("new-plain.tar")).unwrap().len();
    let (chunks, _) = ours(
        &f("old-plain.tar"),
        &f("new-plain.tar"),
        ChunkParams::DEFAULT,
    );
    let patch = patch_run(
        &["build", "plain"],
        &[
            &f("old-plain.tar"),
            &f("new-plain.tar"),
            &work.join("img.patch"),
        ],
    );
    let xd = xdelta(work, &f("old-plain.tar"), &f("new-plain.tar"));
    let (gz_chunks, _) = ours(&f("old-gzip.tar"), &f("new-gzip.tar"), ChunkParams::DEFAULT);
    let pull = registry_pull(&f("old-gzip.tar"), &f("new-gzip.tar"));
    println!(
        "\nimage archives: the agent's OCI image, previous release → this tree (new archive {} bytes, plain layer)",
        size
    );
    println!(
        "  ours, chunks (plain layer)     {} {:>12} B",
        pct(chunks, size),
        chunks
    );
    println!(
        "  ours, plain patch              {} {:>12} B",
        pct(patch.bytes, size),
        patch.bytes
    );
    println!(
        "  xdelta3 -9                     {} {:>12} B",
        pct(xd, size),
        xd
    );
    println!(
        "  ours, chunks (gzipped layer)   {} {:>12} B",
        pct(gz_chunks, size),
        gz_chunks
    );
    println!(
        "  registry pull of changed blobs {} {:>12} B",
        pct(pull, size),
        pull
    );
    println!(
        "  patch / xdelta3 = {:.2}x, patch / registry pull = {:.2}x",
        patch.bytes as f64 / xd as f64,
        patch.bytes as f64 / pull as f64
    );
}
