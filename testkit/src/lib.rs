//! Test fixtures shared by the workspace's integration tests (libupgrade's and k3os-ops'), one
//! home instead of copies and `#[path]` includes: real GPT disk image files attached with
//! `loopdev`, ext4 filesystems made with mkfs.ext4 and mounted with `sys-mount`, real squashfs
//! images from mksquashfs, signed releases, a Range-capable HTTP server that can drop
//! connections half way, a [`Config`](libupgrade::Config) for a node under a temp root ([`dir_config`]), and the
//! real bootloader backends on temp dirs ([`loaders`]).

//!
//! One module per job: [`disk`] (GPT images on loop devices), [`release`] (keys, signed
//! releases), [`image`] (OCI image archives for a release's payloads), [`server`] (the HTTP file server), [`node`] (a node's config and boot files under
//! a temp root), [`loaders`] (the real bootloader backends), [`sim`] (a whole simulated node),
//! [`clock`] (virtual time for download schedules), [`tree`] (a directory's bytes, to assert a
//! refusal changed nothing).
//! Data flows one way: [`sim`] and [`disk`] build on [`node`]; the other modules stand alone;
//! the tests use them, and nothing here knows a test.

use std::process::Command;

pub mod clock;
pub mod collector;
#[cfg(feature = "disk")]
pub mod disk;
pub mod image;
pub mod loaders;
pub mod node;
pub mod release;
pub mod server;
pub mod sim;
pub mod tree;

pub use clock::VirtualClock;
pub use collector::report_sink;
#[cfg(feature = "disk")]
pub use disk::{Loop, TestDisk, MIB};
pub use image::{image_archive, image_archive_missing_layer};
pub use node::{boot_as, dir_config, ModelLoader};
pub use release::{
    assert_payloads_stored, keys, make_release, noise_release, release_manifest, release_size,
    signed_release, signed_release_patched, signed_release_with, Keys, ReleaseInputs, ARTIFACTS,
};
pub use server::TestServer;
pub use sim::ExpectGood;
pub use tree::{assert_same_tree, tree_bytes};

pub fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e} (is it installed? .ci/run installs it)")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A real squashfs of `tree` at `out` (mksquashfs, installed by scripts/setup.sh): root-owned,
/// fixed times (unchanged files give unchanged bytes), then `extra` options (compressor,
/// fragments, xattrs). The one way the tests make an image.
pub fn squashfs(tree: &std::path::Path, out: &std::path::Path, extra: &[&str]) {
    run(Command::new("mksquashfs")
        .arg(tree)
        .arg(out)
        .args([
            "-noappend",
            "-quiet",
            "-all-root",
            "-mkfs-time",
            "0",
            "-all-time",
            "0",
        ])
        .args(extra));
}

/// Stage options whose retries wait 20 ms (the default waits seconds), for tests whose
/// servers drop connections on purpose.
pub fn fast_stage() -> libupgrade::StageOptions {
    libupgrade::StageOptions {
        retry_delay: std::time::Duration::from_millis(20),
        ..libupgrade::StageOptions::default()
    }
}

pub fn require_root() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test needs root (loop devices, mount); run the suite as root like CI does"
    );
}

/// Deterministic incompressible test bytes (xorshift64): the same `seed` gives the same bytes
/// in every test and bench.
pub fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
