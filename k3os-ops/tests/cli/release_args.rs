//! The `k3os-ops release create` command line the publisher tests share (trust, rollouts, TUF
//! interop): one place that knows the flags.

use std::path::Path;

/// `release create` of `version` (generation `generation`) from `(rootfs, kernel, initrd)`,
/// signed with `key`, into `chan/<version>`, for this host's architecture.
pub(crate) fn release_create(
    (rootfs, kernel, initrd): (&Path, &Path, &Path),
    chan: &Path,
    key: &Path,
    version: &str,
    generation: u64,
) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    [
        "release",
        "create",
        "--rootfs",
        &s(rootfs),
        "--kernel",
        &s(kernel),
        "--initrd",
        &s(initrd),
        "--version",
        version,
        "--arch",
        libupgrade::manifest::Arch::host().as_str(),
        "--key",
        &s(key),
        "-o",
        &s(&chan.join(version)),
        "--generation",
        &generation.to_string(),
    ]
    .map(String::from)
    .to_vec()
}
