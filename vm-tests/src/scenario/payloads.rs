//! `payload-images` (issue 33): a release's container images come with the slot. Every test
//! release carries an image archive (`site-images`: `k3os.test/pause:3.6` and
//! `k3os.test/site-app:g<generation>`, written by the images builder), and the disk's state
//! partition holds v1's in the payload store from the first boot.
//!
//! v1 boots with its archive linked into k3s's airgap directory (the built-in `images` check
//! passes). `--plan-only` prices v2's archive with the slot files, the stage fetches exactly
//! that, and `slot status` lists B's payload in the store. Then the link is cut (the release
//! server is stopped, as at a site whose uplink went down after the stage): v2 boots, its
//! archive (an image only the store holds) is linked and checked, v2 is blessed, and the prune
//! after the bless leaves exactly v1's and v2's objects (a stray object is removed). A rollback
//! to v1 links v1's archive again: the fallback kept its images. Finally both objects are read
//! off the powered-off disk's state partition and `skopeo inspect` (a real OCI tool) reads
//! every image the manifests name from them.

use std::path::Path;
use std::process::Command;

use bootconfig::Slot;
use libupgrade::manifest::{Manifest, Payload, MANIFEST_FILE};
use libupgrade::state::SlotState;
use libupgrade::Status;

use super::steps::{sl, CMD};
use super::Scenario;
use crate::error::{Error, Result};
use crate::vm::Vm;

/// The payload every test release carries (images/src/oci.rs).
const PAYLOAD: &str = "site-images";
/// Where the guest's store and airgap directory are (the node config's defaults).
const OBJECTS: &str = "/var/lib/k3os-ops/payloads/objects";
const AIRGAP: &str = "/var/lib/rancher/k3s/agent/images";
/// An object no manifest names: the next prune must remove it.
const STRAY: &str = "0000000000000000000000000000000000000000000000000000000000000000";

impl Scenario {
    pub(super) fn payload_images(&mut self) -> Result<()> {
        let (v1, v2) = (self.site_images("v1")?, self.site_images("v2")?);
        let srv = self.server(0)?;
        let mut node = self.node("node")?;
        let mut vm = self.boot_v1(&mut node)?;
        self.archive_linked(&mut vm, &v1, "v1 from the first boot")?;
        plant_stray(&mut vm)?;

        let plan = vm.run_ok(
            &format!(
                "k3os-ops upgrade --plan-only --source {}",
                srv.guest_url("v2")
            ),
            CMD,
        )?;
        self.check(plan.contains(PAYLOAD), || {
            format!("--plan-only does not price the payload {PAYLOAD}:\n{plan}")
        })?;
        let out = self.upgrade_to(&mut vm, &srv, "v2", "")?;
        self.check(out.contains("activated slot B"), || {
            format!("the upgrade did not activate B:\n{out}")
        })?;
        let status = vm.run_ok("k3os-ops slot status", CMD)?;
        self.check(
            status.contains(PAYLOAD) && status.contains(&v2.file.sha256[..12]),
            || {
                format!(
                    "slot status does not list B's payload {PAYLOAD} ({}):\n{status}",
                    &v2.file.sha256[..12]
                )
            },
        )?;

        // The link goes down after the stage: the release server is gone (nothing but the
        // node's own store can provide an image from now on), and v2 boots.
        drop(srv);
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::B, "v2")?;
        self.ready(&mut vm)?;
        let st = self.status(&mut vm)?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        self.archive_linked(&mut vm, &v2, "v2 offline, an image only the store held")?;
        let objects = vm.run_ok(&format!("ls {OBJECTS}"), CMD)?;
        let mut held: Vec<&str> = objects.split_whitespace().collect();
        held.sort();
        let mut want = vec![v1.file.sha256.as_str(), v2.file.sha256.as_str()];
        want.sort();
        self.check(held == want, || {
            format!(
                "after the bless the store holds {held:?}, expected exactly v1's and v2's {want:?}"
            )
        })?;

        vm.run_ok(
            "k3os-ops slot rollback --reason 'payload scenario: back to v1'",
            CMD,
        )?;
        self.reboot(&mut vm)?;
        self.expect_boot(&mut vm, Slot::A, "v1")?;
        self.ready(&mut vm)?;
        self.archive_linked(&mut vm, &v1, "v1 again after the rollback")?;
        vm.run_ok("sync", CMD)?;
        vm.power_cut()?;
        self.inspect_objects(node.disk_path(), &[&v1, &v2])
    }

    /// Every payload slot A's kept manifest names is in the store with its sha256, and B's
    /// too when B holds a complete release (staged, on trial or good): what a power cut must
    /// never cost a slot. A must name at least one (every test release carries `site-images`).
    pub(super) fn payloads_intact(&mut self, vm: &mut Vm, st: &Status, when: &str) -> Result<()> {
        let mut objects = Vec::new();
        for slot in [Slot::A, Slot::B] {
            let s = sl(st, slot);
            let complete = matches!(
                s.state,
                SlotState::Staged | SlotState::Trying | SlotState::Good
            );
            if slot == Slot::B && !complete {
                continue;
            }
            self.check(
                !s.payloads.is_empty() && s.payloads.iter().all(|p| p.in_store),
                || {
                    format!(
                        "{when}: slot {slot} ({}) lacks payloads: {:?}",
                        s.state, s.payloads
                    )
                },
            )?;
            objects.extend(s.payloads.iter().map(|p| p.sha256.clone()));
        }
        let sums = vm.run_ok(
            &format!("cd {OBJECTS} && sha256sum {}", objects.join(" ")),
            CMD,
        )?;
        for o in &objects {
            self.check(sums.contains(&format!("{o}  {o}")), || {
                format!("{when}: object {o} does not have its sha256:\n{sums}")
            })?;
        }
        self.note(format!(
            "{when}: the slots' {} payload objects are in the store with their sha256",
            objects.len()
        ));
        Ok(())
    }

    /// The `site-images` payload of release `version` (its signed manifest on the host).
    pub(super) fn site_images(&self, version: &str) -> Result<Payload> {
        let path = self
            .target
            .releases(&self.root)
            .join(version)
            .join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).map_err(|e| Error::io("read", &path, e))?;
        let m =
            Manifest::parse(&bytes).map_err(|e| self.fail(format!("{}: {e}", path.display())))?;
        m.payloads
            .into_iter()
            .find(|p| p.name == PAYLOAD)
            .ok_or_else(|| {
                self.fail(format!(
                    "{} names no payload {PAYLOAD}: rebuild the images",
                    path.display()
                ))
            })
    }

    /// The airgap link of `p` points at its object, which has its sha256, and the boot's
    /// `images` check passed.
    fn archive_linked(&mut self, vm: &mut Vm, p: &Payload, when: &str) -> Result<()> {
        let link = format!("{AIRGAP}/k3os-{PAYLOAD}.tar");
        let out = vm.run_ok(&format!("readlink {link}; sha256sum < {link}"), CMD)?;
        let object = format!("{OBJECTS}/{}", p.file.sha256);
        self.check(
            out.contains(&object) && out.matches(&p.file.sha256).count() >= 2,
            || format!("{when}: {link} should link {object} with that sha256:\n{out}"),
        )?;
        let json = self.status_value(vm)?.to_string();
        self.check(json.contains("\"images\""), || {
            format!("{when}: slot status records no 'images' check: {json}")
        })?;
        self.note(format!(
            "{when}: {link} -> {object} ({} bytes, {})",
            p.file.size,
            p.images.join(", ")
        ));
        Ok(())
    }

    /// Read each payload's object off the state partition of the powered-off `disk` and
    /// inspect every image its manifest names with skopeo.
    fn inspect_objects(&mut self, disk: &Path, payloads: &[&Payload]) -> Result<()> {
        let [state] = libupgrade::layout::part_ranges(disk, [libupgrade::layout::PART_STATE])
            .map_err(|e| self.fail(e.to_string()))?;
        let dir = self.out.join("objects");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        let part = dir.join("state.img");
        copy_range(disk, state.start, state.len, &part)?;
        for p in payloads {
            let out = dir.join(format!("{}.tar", &p.file.sha256[..12]));
            host(
                Command::new("debugfs")
                    .arg("-R")
                    .arg(format!(
                        "dump /payloads/objects/{} {}",
                        p.file.sha256,
                        out.display()
                    ))
                    .arg(&part),
            )?;
            for image in &p.images {
                host(
                    Command::new("skopeo")
                        .arg("inspect")
                        .arg(format!("oci-archive:{}:{image}", out.display())),
                )?;
            }
            self.note(format!(
                "skopeo inspect read {} from object {}",
                p.images.join(", "),
                &p.file.sha256[..12]
            ));
        }
        let _ = std::fs::remove_file(&part);
        Ok(())
    }
}

/// The names in the guest's payload store (none when it has no store yet).
pub(super) fn store_objects(vm: &mut Vm) -> Result<Vec<String>> {
    let out = vm.run_ok(&format!("ls {OBJECTS} 2>/dev/null; true"), CMD)?;
    Ok(out.split_whitespace().map(String::from).collect())
}

/// Put an object no manifest names into the guest's store (what a cut before a prune leaves):
/// the next prune removes it, so the stage or confirm that follows passes its
/// `payload:object-pruned` barrier.
pub(super) fn plant_stray(vm: &mut Vm) -> Result<()> {
    vm.run_ok(&format!("printf stray > {OBJECTS}/{STRAY} && sync"), CMD)
        .map(drop)
}

/// `len` bytes of `from` at `start`, into the new file `to`.
fn copy_range(from: &Path, start: u64, len: u64, to: &Path) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(from).map_err(|e| Error::io("open", from, e))?;
    f.seek(SeekFrom::Start(start))
        .map_err(|e| Error::io("seek", from, e))?;
    let mut o = std::fs::File::create(to).map_err(|e| Error::io("create", to, e))?;
    std::io::copy(&mut f.take(len), &mut o).map_err(|e| Error::io("copy", to, e))?;
    Ok(())
}

/// Run a host tool; its failure names the command and what it printed.
fn host(cmd: &mut Command) -> Result<String> {
    let line = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| Error::Spawn {
        program: cmd.get_program().to_string_lossy().into_owned(),
        hint: "see `just setup`".into(),
        source: e,
    })?;
    if !out.status.success()
        || (line.contains("debugfs")
            && !String::from_utf8_lossy(&out.stderr)
                .lines()
                .all(|l| l.starts_with("debugfs ")))
    {
        return Err(Error::Host {
            cmd: line,
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
