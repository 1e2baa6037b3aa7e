//! `trust-rotation`: a node trusting only root version 1 of its channel (baked into the image
//! at `/etc/k3os-ops/root.json` by `k3os-images`, keys in `images/out/<arch>/keys/`) upgrades
//! to a release whose manifest is signed by a key that exists only since root version 2, with
//! no change on the node.
//!
//! The harness publishes a scratch channel (v1 and v2 of the images, hard-linked, v2's
//! `manifest.json.sig` re-made with a brand-new key no trust.d holds) through
//! `libupgrade::trust::publish`, the code behind `k3os-ops release root|targets|timestamp`:
//! targets by root 1's targets key, then root 2 (new root key, new targets key: the old one is
//! revoked), snapshot and timestamp. Steps:
//! 1. targets still signed only by the revoked key: the guest's `upgrade --channel` is refused
//!    with one error naming the targets role and root version 2, and slot B is untouched;
//! 2. v2 staged by `--source` (no metadata): refused for its signature (no trust.d key made it);
//! 3. targets re-signed by root 2's targets key: `upgrade --channel URL --version v2` stages
//!    v2 on the targets role's word and activates B, which boots and is blessed; the node's
//!    root file and trust.d are what the image put there.

use std::fs;
use std::path::{Path, PathBuf};

use bootconfig::Slot;
use ed25519_dalek::SigningKey;
use libupgrade::manifest::{MANIFEST_FILE, SIGNATURE_FILE};
use libupgrade::signing;
use libupgrade::state::SlotState;
use libupgrade::trust::meta::Role;
use libupgrade::trust::publish;
use libupgrade::trust::publish::RoleSpec;

use super::steps::{sl, CMD, DOWNLOAD};
use super::Scenario;
use crate::error::{Error, Result};
use crate::server::ReleaseServer;
use crate::vm::Vm;

/// Key pairs `k3os-images` made for root version 1 (images/src/release.rs `CHANNEL_KEYS`).
pub(crate) const ROOT1_KEYS: [&str; 4] = ["root1", "targets1", "snapshot", "timestamp"];

/// The channel's signing keys: root 1's (from the images) and the ones made for root 2.
struct Keys {
    root1: SigningKey,
    targets1: SigningKey,
    /// Snapshot and timestamp (kept across the rotation).
    online: Vec<SigningKey>,
    root2: SigningKey,
    targets2: SigningKey,
}

pub(super) fn days(n: i64) -> chrono::DateTime<chrono::Utc> {
    publish::expires_in(chrono::Duration::days(n))
}

/// Hard-link the files of release directory `from` into `to` (they are never written here;
/// the signature is replaced, not rewritten in place).
pub(super) fn link_release(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).map_err(|e| Error::io("create directory", to, e))?;
    for e in fs::read_dir(from).map_err(|e| Error::io("list release", from, e))? {
        let src = e.map_err(|e| Error::io("list release", from, e))?.path();
        let dst = to.join(src.file_name().expect("read_dir entries have names"));
        if src.is_dir() {
            link_release(&src, &dst)?;
        } else if fs::hard_link(&src, &dst).is_err() {
            fs::copy(&src, &dst).map_err(|e| Error::io("copy release file", &src, e))?;
        }
    }
    Ok(())
}

impl Scenario {
    pub(super) fn trust_rotation(&mut self) -> Result<()> {
        let chan = self.out.join("channel");
        let keys = self.channel_keys()?;
        self.publish_revoked_targets(&chan, &keys)?;
        let srv = ReleaseServer::start(&chan, 0)?;
        let url = srv.guest_root();
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;

        self.revoked_targets_refused(&mut vm, &url)?;
        self.unsigned_without_metadata_refused(&mut vm, &srv)?;

        publish::write_targets(&chan, std::slice::from_ref(&keys.targets2), days(90))
            .map_err(|e| self.publish_failed(&chan, e))?;
        publish::write_timestamp(&chan, &keys.online, days(30), days(7))
            .map_err(|e| self.publish_failed(&chan, e))?;
        self.rotated_release_installs(&mut vm, &url)?;
        self.node_unchanged(&mut vm)?;
        if !self.opts.keep {
            let _ = fs::remove_dir_all(&chan);
        }
        Ok(())
    }

    fn publish_failed(&self, chan: &Path, e: impl std::fmt::Display) -> Error {
        self.fail(format!(
            "publishing the scratch channel {}: {e}",
            chan.display()
        ))
    }

    /// Root 1's keys from the images, and brand-new keys for root 2 and for v2's manifest.
    fn channel_keys(&self) -> Result<Keys> {
        let dir = self.target.channel_keys(&self.root);
        let load = |name: &str, dir: &Path| {
            let p = dir.join(format!("{name}.key"));
            signing::load_secret_key(&p).map_err(|e| self.fail(format!("{}: {e}", p.display())))
        };
        let fresh = self.out.join("keys");
        for name in ["root2", "targets2", "release-new"] {
            signing::generate_keypair(&fresh, name)
                .map_err(|e| self.fail(format!("{}: {e}", fresh.display())))?;
        }
        Ok(Keys {
            root1: load(ROOT1_KEYS[0], &dir)?,
            targets1: load(ROOT1_KEYS[1], &dir)?,
            online: vec![load(ROOT1_KEYS[2], &dir)?, load(ROOT1_KEYS[3], &dir)?],
            root2: load("root2", &fresh)?,
            targets2: load("targets2", &fresh)?,
        })
    }

    /// The channel after a rotation whose publisher has not yet re-signed the targets: v1 and
    /// v2 (its manifest signed by `release-new`), root 1 (the image's) and root 2, targets
    /// signed only by root 1's targets key, fresh snapshot and timestamp.
    fn publish_revoked_targets(&mut self, chan: &Path, keys: &Keys) -> Result<()> {
        let releases = self.target.releases(&self.root);
        for v in ["v1", "v2"] {
            link_release(&releases.join(v), &chan.join(v))?;
        }
        let v2 = chan.join("v2");
        let manifest = fs::read(v2.join(MANIFEST_FILE))
            .map_err(|e| Error::io("read", v2.join(MANIFEST_FILE), e))?;
        let new_key: PathBuf = self.out.join("keys/release-new.key");
        let sig = signing::sign(&manifest, &new_key).map_err(|e| self.publish_failed(chan, e))?;
        let sig_path = v2.join(SIGNATURE_FILE);
        fs::remove_file(&sig_path).map_err(|e| Error::io("remove", &sig_path, e))?;
        fs::write(&sig_path, sig).map_err(|e| Error::io("write", &sig_path, e))?;

        let root1 = self.target.channel_root_dir(&self.root);
        for f in ["1.root.json", Role::Root.file()] {
            fs::copy(root1.join(f), chan.join(f))
                .map_err(|e| Error::io("copy channel root", root1.join(f), e))?;
        }
        publish::write_targets(chan, std::slice::from_ref(&keys.targets1), days(90))
            .map_err(|e| self.publish_failed(chan, e))?;
        // Published under root 1 first: after the rotation, the publisher's commands accept
        // the targets the revoked key signed only as what a snapshot pins (verify before
        // signing, libupgrade::trust::client::served).
        publish::write_timestamp(chan, &keys.online, days(30), days(7))
            .map_err(|e| self.publish_failed(chan, e))?;
        let one = |k: &SigningKey| RoleSpec {
            keys: vec![k.verifying_key()],
            threshold: 1,
        };
        let changes = [
            (Role::Root, one(&keys.root2)),
            (Role::Targets, one(&keys.targets2)),
        ]
        .into_iter()
        .collect();
        let signers = [keys.root1.clone(), keys.root2.clone()];
        publish::rotate_root(chan, &changes, &signers, days(365))
            .map_err(|e| self.publish_failed(chan, e))?;
        publish::write_timestamp(chan, &keys.online, days(30), days(7))
            .map_err(|e| self.publish_failed(chan, e))?;
        self.note(format!(
            "scratch channel {}: root 1 -> 2 (new root and targets keys), targets signed only by the revoked targets key, v2 signed by a key in no trust.d",
            chan.display()
        ));
        Ok(())
    }

    /// Step 1: the node walks to root 2 and refuses targets signed by the key root 2 revoked.
    fn revoked_targets_refused(&mut self, vm: &mut Vm, url: &str) -> Result<()> {
        let out = vm.run(
            &format!("k3os-ops upgrade --quiet --channel {url} --version v2"),
            DOWNLOAD,
        )?;
        let errors = out
            .output
            .lines()
            .filter(|l| l.trim_start().starts_with("error: "))
            .count();
        self.check(
            out.rc != 0
                && errors == 1
                && out
                    .output
                    .contains("0 valid signature(s) by targets keys of root version 2"),
            || {
                format!(
                    "targets signed only by the revoked key must be refused with one error naming the targets role of root 2; exit {}:\n{}",
                    out.rc, out.output
                )
            },
        )?;
        let st = self.status(vm)?;
        let b = sl(&st, Slot::B);
        self.check(
            !matches!(b.state, SlotState::Staged | SlotState::Trying) && st.next_boot == Slot::A,
            || format!("slot B must be untouched after the refusal: {b:?}"),
        )?;
        self.note(format!(
            "{}: targets signed by the revoked key refused: {}",
            vm.name(),
            out.output
                .lines()
                .find(|l| l.starts_with("error: "))
                .unwrap_or("")
        ));
        Ok(())
    }

    /// Step 2: without metadata nothing vouches for v2 but its signature, by no trusted key.
    fn unsigned_without_metadata_refused(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
    ) -> Result<()> {
        let out = vm.run(
            &format!(
                "k3os-ops upgrade --quiet --stage-only --source {}",
                srv.guest_url("v2")
            ),
            DOWNLOAD,
        )?;
        self.check(
            out.rc != 0
                && out.output.contains("signature of")
                && out.output.contains("which is not trusted"),
            || {
                format!(
                    "v2 by --source (no metadata) must be refused for its signature; exit {}:\n{}",
                    out.rc, out.output
                )
            },
        )?;
        self.note(format!(
            "{}: the same v2 without metadata refused for its signature",
            vm.name()
        ));
        Ok(())
    }

    /// Step 3: targets by root 2's key: v2 installs on the targets role's word, is blessed.
    fn rotated_release_installs(&mut self, vm: &mut Vm, url: &str) -> Result<()> {
        let t0 = std::time::Instant::now();
        let out = vm.run_ok(
            &format!("k3os-ops upgrade --quiet --channel {url} --version v2"),
            DOWNLOAD,
        )?;
        self.check(
            out.contains("staged v2")
                && out.contains("signed by the channel's targets role (targets version 2, root version 2)")
                && out.contains("activated slot B"),
            || format!("upgrade through the rotated channel must stage v2 vouched for by targets 2 under root 2 and activate B:\n{out}"),
        )?;
        self.note(format!(
            "{}: upgrade --channel to v2 (signed by a key only root 2 knows of) took {:.1}s",
            vm.name(),
            t0.elapsed().as_secs_f64()
        ));
        let st = self.reboot_into_good(vm, Slot::B, "v2")?;
        self.check_b_blessed_and_booted(&st)
    }

    /// Nothing on the node changed: the root file is the image's root 1 (v2's image carries the
    /// same one), trust.d holds only the image's release key.
    fn node_unchanged(&mut self, vm: &mut Vm) -> Result<()> {
        let baked = self
            .target
            .channel_root_dir(&self.root)
            .join(Role::Root.file());
        let len = fs::metadata(&baked)
            .map_err(|e| Error::io("stat", &baked, e))?
            .len();
        let out = vm.run_ok(
            "echo ROOTLEN=$(wc -c < /etc/k3os-ops/root.json) TRUST=$(ls /etc/k3os-ops/trust.d)",
            CMD,
        )?;
        let want = format!("ROOTLEN={len} TRUST=release.pub");
        self.check(out.lines().any(|l| l.trim() == want), || {
            format!("the node's root file ({len} bytes in the image) and trust.d (release.pub only) must be the image's; expected `{want}`, the node says: {out}")
        })?;
        self.note(format!(
            "{}: blessed on v2; /etc/k3os-ops/root.json is still the image's root 1, trust.d holds only release.pub",
            vm.name()
        ));
        Ok(())
    }
}
