//! The retry decision `upgrade` acts on ([`Updater::resolve_with_retry`]) matches the node's
//! failure records by version and generation: a release that failed here is held back, and
//! the same version republished with a higher generation (a fix under the same name) is
//! another release, staged as usual. Real signed releases as offline bundles, a real state
//! file with the failure recorded the way a rollback leaves it.

use std::path::Path;

use bootconfig::Slot;
use libupgrade::layout::DirLayout;
use libupgrade::manifest::Arch;
use libupgrade::rollout::Retry;
use libupgrade::state::store::StateStore;
use libupgrade::state::FailedRelease;
use libupgrade::{BootloaderKind, LayoutConfig, StageRequest, Updater, Wanted};
use testkit::loaders::{Kind, RealLoader};
use testkit::*;

/// A node running v1 from slot A whose state records v2 of generation 2 failing once here.
fn node_where_v2_failed(dir: &Path, trust: &Path) -> Updater {
    let cfg = dir_config(dir, trust, BootloaderKind::Grub);
    std::fs::write(&cfg.release_file, "VERSION=v1\nGENERATION=1\n").unwrap();
    boot_as(&cfg, Slot::A, "boot-0");
    std::fs::create_dir_all(dir.join("system")).unwrap();
    let loader = RealLoader::install(Kind::Grub, &dir.join("loader"), 3);
    let store = StateStore::new(&cfg.state_dir);
    let mut st = store.load().unwrap();
    st.failed.push(FailedRelease {
        version: "v2".into(),
        generation: Some(2),
        attempts: 1,
        at: 1_800_000_000,
        why: "50-app: app is down".into(),
    });
    store.save(&st, "test: v2 rolled back").unwrap();
    let LayoutConfig::Dir { root, boot_dir } = &cfg.layout else {
        unreachable!("dir_config makes a dir layout")
    };
    let layout = Box::new(DirLayout::new(root, boot_dir));
    Updater::with_parts(cfg, layout, loader.backend())
}

/// The retry decision for the bundle of `version` of `generation`, made with `keys`.
fn decided(u: &Updater, keys: &Keys, work: &Path, version: &str, generation: u64) -> Retry {
    let out = work.join(format!("{version}-g{generation}"));
    std::fs::create_dir_all(&out).unwrap();
    let rel = make_release(keys, &out, version, generation, 1024, Arch::host());
    let file = work.join(format!("{version}-g{generation}.bundle"));
    libupgrade::bundle::write(&rel, &file).unwrap();
    let r = u
        .resolve_with_retry(&StageRequest::new(Wanted::Bundle(file)))
        .unwrap();
    assert_eq!(
        (r.release.version.as_deref(), r.release.generation),
        (Some(version), Some(generation))
    );
    r.retry.unwrap()
}

#[test]
fn a_release_republished_under_the_same_version_is_not_held_back_by_the_old_failure() {
    let k = keys();
    let (node, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let u = node_where_v2_failed(node.path(), &k.trust);
    match decided(&u, &k, work.path(), "v2", 2) {
        Retry::Wait { why, until } => {
            assert!(why.starts_with("failed here: v2 (generation 2)"), "{why}");
            assert_eq!(until, None, "no rollout allows retries");
        }
        Retry::Proceed => panic!("v2 of generation 2 failed here: it must be held back"),
    }
    assert_eq!(
        decided(&u, &k, work.path(), "v2", 3),
        Retry::Proceed,
        "v2 republished as generation 3 is another release"
    );
}
