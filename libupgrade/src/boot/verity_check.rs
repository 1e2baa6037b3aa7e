//! The confirm step's dm-verity check (issue 34 item 5): a boot whose kernel command line names
//! a verity root hash (`k3os.verity=<hex>`, what the loader passes the initramfs to open the
//! root through dm-verity) must be of the root hash the booted slot's staged manifest signs;
//! anything else fails the boot's health, so a trial falls back. A command line without the
//! parameter is a boot that did not open its root through dm-verity (a release without it, or
//! a loader that does not pass it yet): nothing to check, no result. Pure; the caller reads the
//! command line and the kept manifest.

use bootconfig::Slot;

use crate::manifest::{Manifest, Verity};
use crate::state::CheckResult;

/// The kernel command line parameter naming the root hash the initramfs opened the root with.
pub const CMDLINE_PARAM: &str = "k3os.verity=";

/// What an activation tells the loader to pass `slot`'s kernel (`k3os.verity=`): the kept
/// manifest's signed root hash with the geometry the initramfs opens the device with, only when
/// this node's stage wrote that root's tree and FEC into the slot (`written`, the slot's
/// `verity-written` record). Anything else (no `--verity` release, a slot staged by an earlier
/// k3os-ops without the tree, a record of another root) boots without dm-verity, as before:
/// opening a root whose tree is not on disk would fail.
pub fn boot_value(signed: Option<&Verity>, written: Option<&str>) -> Option<String> {
    signed
        .filter(|v| written == Some(v.root_hash.as_str()))
        .map(boot_param)
}

/// `<root hash>,<salt>,<data blocks>,<hash start>,<FEC start>,<FEC roots>`: everything the
/// initramfs needs for the kernel's verity table besides the partition (starts in 4096-byte
/// blocks from the partition's start; FEC covers the blocks before its start). The root hash
/// commits to all of it: a wrong field fails the open, it cannot weaken it. Why on the command
/// line rather than read from the state partition: the initramfs then needs nothing but the
/// loader's word and the slot's partition on the good path.
pub fn boot_param(v: &Verity) -> String {
    format!(
        "{},{},{},{},{},{}",
        v.root_hash,
        v.salt,
        v.data_blocks,
        v.hash_offset / v.hash_block_size,
        v.fec_offset / v.data_block_size,
        v.fec_roots
    )
}

/// The root hash of a `k3os.verity=` value (what precedes its geometry, if any).
pub fn root_hash_of(value: &str) -> &str {
    value.split_once(',').map_or(value, |(h, _)| h)
}

/// The check's result for a boot of `slot` with command line `cmdline`, whose kept manifest
/// is `staged` (`None`: none kept); `None` when the command line names no root hash.
pub fn check(cmdline: &str, slot: Slot, staged: Option<&Manifest>) -> Option<CheckResult> {
    let booted = cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix(CMDLINE_PARAM))
        .next_back()
        .map(root_hash_of)?;
    let result = |ok: bool, detail: String| CheckResult {
        name: "verity".into(),
        ok,
        detail,
    };
    let signed = staged.and_then(|m| m.verity.as_ref().map(|v| (m, v)));
    Some(match signed {
        Some((m, v)) if v.root_hash == booted => result(
            true,
            // Only what the command line says: the initramfs opened the root through
            // dm-verity with it (a value of the hash alone, from an earlier k3os-ops, did not).
            format!(
                "slot {slot}'s command line names {}'s signed dm-verity root hash",
                m.version
            ),
        ),
        Some((m, v)) => result(
            false,
            format!(
                "slot {slot} booted with dm-verity root hash '{}', but its release {} signs {}",
                booted.escape_debug(),
                m.version,
                v.root_hash
            ),
        ),
        None => result(
            false,
            format!(
                "slot {slot} booted with dm-verity root hash '{}', but no signed manifest kept for it records one",
                booted.escape_debug()
            ),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_gets_a_root_hash_and_geometry_only_when_its_tree_was_written() {
        let m = crate::manifest::tests::with_verity();
        let v = m.verity.as_ref().unwrap();
        let (r, o) = ("cd".repeat(32), "ab".repeat(32));
        // 836 data blocks: a tree of 7 + 1 blocks right after them, FEC after the tree.
        let want = format!("{r},{},836,836,844,2", "07".repeat(32));
        assert_eq!(boot_value(Some(v), Some(&r)), Some(want.clone()));
        assert_eq!(root_hash_of(&want), r);
        assert_eq!(
            root_hash_of(&r),
            r,
            "the hash-only form of v0.2.0's first builds"
        );
        assert_eq!(
            boot_value(Some(v), None),
            None,
            "staged by an earlier k3os-ops"
        );
        assert_eq!(boot_value(Some(v), Some(&o)), None, "another root's tree");
        assert_eq!(
            boot_value(None, Some(&r)),
            None,
            "a release without --verity"
        );
        assert_eq!(boot_value(None, None), None);
    }

    /// The shared manifest fixture with `verity`, its root hash `root`.
    fn staged(root: &str) -> Manifest {
        let mut m = crate::manifest::tests::with_verity();
        m.verity.as_mut().unwrap().root_hash = root.into();
        m
    }

    #[test]
    fn the_booted_root_hash_must_be_the_staged_manifests() {
        let good = "cd".repeat(32);
        let m = staged(&good);
        let line = |p: &str| format!("root=PARTLABEL=rootfs-b ro k3os.slot=B {p} panic=10");
        // No parameter: not opened through dm-verity, nothing to check (as every boot today).
        assert_eq!(check(&line(""), Slot::B, Some(&m)), None);
        let ok = check(&line(&format!("k3os.verity={good}")), Slot::B, Some(&m)).unwrap();
        assert!(ok.ok && ok.name == "verity", "{ok:?}");
        let with_geometry = format!("k3os.verity={}", boot_param(m.verity.as_ref().unwrap()));
        let ok = check(&line(&with_geometry), Slot::B, Some(&m)).unwrap();
        assert!(ok.ok, "{ok:?}");
        let bad = check(&line("k3os.verity=ab\u{1b}[2J"), Slot::B, Some(&m)).unwrap();
        assert!(!bad.ok);
        assert_eq!(
            bad.detail,
            format!("slot B booted with dm-verity root hash 'ab\\u{{1b}}[2J', but its release v2 signs {good}")
        );
        let plain = crate::manifest::tests::sample();
        for staged in [None, Some(&plain)] {
            let r = check(&line(&format!("k3os.verity={good}")), Slot::B, staged).unwrap();
            assert!(
                !r.ok
                    && r.detail
                        .ends_with("no signed manifest kept for it records one"),
                "{r:?}"
            );
        }
    }
}
