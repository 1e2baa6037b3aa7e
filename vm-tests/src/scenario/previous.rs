//! `upgrade-from-previous`: a disk built by the previous release's own code (CHANGELOG.md;
//! `just images-previous`) boots its v1 with its k3os-ops; that old binary upgrades to a
//! current-code v2, which boots under the old boot script and env and is blessed by the
//! current binary; the current binary upgrades to v3 (blessed, current boot script), and a
//! panicking v4 falls back by itself. Then power cuts inside the first migrating write (the
//! boot-time confirm of v2 on a node the old binary upgraded).
//!
//! The previous release's `slot status --json` is read leniently ([`LooseStatus`]): only the
//! fields every release has had.

use std::path::{Path, PathBuf};
use std::time::Instant;

use bootconfig::Slot;
use libupgrade::state::SlotState;

use super::payloads::store_objects;
use super::powercut::fmt_barriers;
use super::steps::{sl, Node, CMD, READY};
use super::Scenario;
use crate::error::{Error, Result};
use crate::server::ReleaseServer;
use crate::target::Target;
use crate::vm::Vm;

impl Scenario {
    /// The previous release's disk (built by its own code) upgraded by its own binary to the
    /// current code, then by the current binary, then a failing release; then power cuts
    /// inside the first migrating write.
    pub(super) fn upgrade_from_previous(&mut self) -> Result<()> {
        let prev = Previous::load(&self.root, self.target)?;
        self.note(format!(
            "previous release {} (commit {}), its disk {}",
            prev.version,
            prev.commit,
            prev.disk.display()
        ));
        let srv = self.server(0)?;

        let mut node = self.node_from("node", &prev.disk)?;
        let (mut vm, script_before) = self.previous_on_v1(&mut node, &prev)?;
        let barriers = self.old_binary_to_v2(&mut vm, &srv, &prev, script_before)?;
        self.current_binary_to_v3(&mut vm, &srv)?;

        // 4. A failing release (panics in its initrd) falls back to A v3 by itself.
        let tries = self.activate_trial(&mut vm, &srv, "v4-panic", "activating v4-panic")?;
        self.fall_back_to_a(&mut vm, "v4-panic", tries, false, "v3")?;
        drop(vm);

        self.cuts_in_migrating_confirm(&srv, &prev, &barriers)
    }

    /// Step 1: The previous release's node: A v1 running the previous k3os-ops, confirmed. Returns
    /// the guest and the version of its boot script.
    fn previous_on_v1(&mut self, node: &mut Node, prev: &Previous) -> Result<(Vm, u32)> {
        let mut vm = self.boot_v1(node)?;
        let sum = self.ops_sha256(&mut vm)?;
        self.check(sum == prev.ops_sha256, || {
            format!(
                "A v1 runs a k3os-ops with sha256 {sum}, not the previous release's ({})",
                prev.ops_sha256
            )
        })?;
        let st = self.loose_status(&mut vm)?;
        st.expect(self, "A", "good", "v1")?;
        self.check(st.booted.as_deref() == Some("A"), || {
            format!("the previous release's status says booted {:?}", st.booted)
        })?;
        let script_before = self.boot_script(&mut vm)?;
        self.note(format!(
            "step 1: A v1 runs {}'s k3os-ops (sha256 {}), confirmed; boot script version {script_before}",
            prev.version,
            &sum[..12]
        ));
        Ok((vm, script_before))
    }

    /// Step 2: The OLD binary upgrades to a current-code v2; B boots under the old boot script and
    /// env, the current binary's boot-time confirm blesses it (its barriers announced: the
    /// power cuts of step 5 land in them). Returns those barriers.
    fn old_binary_to_v2(
        &mut self,
        vm: &mut Vm,
        srv: &ReleaseServer,
        prev: &Previous,
        script_before: u32,
    ) -> Result<Vec<(u64, String)>> {
        let out = self.upgrade_to(vm, srv, "v2", "")?;
        let st = self.loose_status(vm)?;
        st.expect(self, "B", "trying", "v2")
            .map_err(|e| self.fail(format!("{e}; the old binary's upgrade printed:\n{out}")))?;
        // v2 names an image archive (issue 33); the old binary knows no payloads: it staged
        // the slot files as before and left the payload store alone.
        let v2_images = self.site_images("v2")?;
        let held = store_objects(vm)?;
        self.check(!held.contains(&v2_images.file.sha256), || {
            format!("the previous release's binary put v2's payload into the store: {held:?}")
        })?;
        self.note(format!(
            "step 2: the old binary staged v2's slot files and ignored its payload {} ({} bytes): the store holds {held:?}",
            v2_images.name, v2_images.file.size
        ));
        self.check(st.next_boot.as_deref() == Some("B"), || {
            format!(
                "after the old binary's upgrade next boot is {:?}",
                st.next_boot
            )
        })?;
        vm.run_ok(
            "echo announce >/var/lib/k3os-ops/barrier-request && sync",
            CMD,
        )?;
        self.reboot(vm)?;
        self.expect_boot(vm, Slot::B, "v2")?;
        let barriers = self.confirm_barriers(vm)?;
        vm.expect_not("K3OS-READY", &["Kernel panic"], READY)?;
        vm.wait_shell(CMD)?;
        let sum2 = self.ops_sha256(vm)?;
        self.check(sum2 != prev.ops_sha256, || {
            "B v2 runs the previous release's k3os-ops, not the current one".to_string()
        })?;
        let script_b = self.v2_blessed_under(vm, script_before)?;
        self.note(format!(
            "step 2: the old binary staged and activated v2; B v2 (current k3os-ops) booted under the previous boot script (version {script_before}) and its confirm blessed it; confirm barriers {}; boot script still version {script_b}",
            fmt_barriers(&barriers)
        ));
        Ok(barriers)
    }

    /// B v2 is blessed, booted and next, with A v1 still good, and the node still runs boot
    /// script `script_before` (which status reports); returns the script's version.
    fn v2_blessed_under(&mut self, vm: &mut Vm, script_before: u32) -> Result<u32> {
        let st = self.status(vm)?;
        self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
        self.check_slot(&st, Slot::A, SlotState::Good, Some("v1"))?;
        self.check_b_blessed_and_booted(&st)?;
        let script_b = self.boot_script(vm)?;
        self.check(st.boot_script.installed == Some(script_b), || {
            format!(
                "slot status says the installed boot script is {:?}, the file is version {script_b}",
                st.boot_script
            )
        })?;
        self.check(script_b == script_before, || {
            format!("B's boot-time confirm replaced the boot script (version {script_before} -> {script_b}): B must be blessed under the previous release's script")
        })?;
        Ok(script_b)
    }

    /// Step 3: The current binary upgrades to v3 (into A): blessed, and the node runs the current
    /// boot script when v3 carries it.
    fn current_binary_to_v3(&mut self, vm: &mut Vm, srv: &ReleaseServer) -> Result<()> {
        let st = self.upgrade_v3_into_a(vm, srv)?;
        // The current binary staged v3's image archive into the store (its boot linked and
        // checked it); B, staged by the old binary, names none and gets no images check.
        let (a, b) = (sl(&st, Slot::A), sl(&st, Slot::B));
        self.check(
            !a.payloads.is_empty() && a.payloads.iter().all(|p| p.in_store),
            || {
                format!(
                    "v3 in A after the current binary's stage: payloads {:?}",
                    a.payloads
                )
            },
        )?;
        self.check(b.payloads.is_empty(), || {
            format!(
                "B v2, staged by the previous release's binary, lists payloads {:?}",
                b.payloads
            )
        })?;
        self.note(format!(
            "step 3: the current binary staged v3's payloads into the store ({}); B v2 lists none",
            a.payloads
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let script_after = self.boot_script(vm)?;
        let script_status = self.status_script_field(vm)?;
        self.check(st.boot_script.installed == Some(script_after), || {
            format!(
                "slot status says the installed boot script is {:?}, the file is version {script_after}",
                st.boot_script
            )
        })?;
        let current = self.current_script();
        if self.release_carries_script("v3")? {
            self.check(script_after == current, || {
                format!("v3 carries the current boot script but after its activation the node runs version {script_after}, expected {current}")
            })?;
        } else {
            self.note(format!(
                "v3 carries no boot script (its manifest's boot.scripts has none for this loader): the node keeps version {script_after} (the current code renders {current}); not asserted"
            ));
        }
        self.note(format!(
            "step 3: the current binary upgraded to v3 into A, blessed; boot script version {script_after}; slot status reports: {script_status}"
        ));
        Ok(())
    }

    /// Step 5: Power cuts inside the first migrating write (every confirm barrier with
    /// `--all-barriers`).
    fn cuts_in_migrating_confirm(
        &mut self,
        srv: &ReleaseServer,
        prev: &Previous,
        barriers: &[(u64, String)],
    ) -> Result<()> {
        let ks: Vec<u64> = if self.opts.all_barriers {
            barriers.iter().map(|(n, _)| *n).collect()
        } else {
            vec![first_migrating_barrier(barriers)]
        };
        self.note(format!("power cuts in the migrating confirm at {ks:?}"));
        for k in ks {
            let name = barriers
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, name)| name.clone())
                .unwrap_or_default();
            let t0 = Instant::now();
            self.previous_cut_at(srv, prev, k, &name)?;
            self.note(format!(
                "step 5: cut at confirm barrier {k} ({name}) of the migrating boot: recovered and verified in {:.1}s",
                t0.elapsed().as_secs_f64()
            ));
        }
        Ok(())
    }

    /// A fresh previous-release node upgraded to v2 by its old binary; confirm of v2's first
    /// boot stops at barrier `k` and the power is cut. The node must boot (never stuck), end
    /// blessed on B or safely on A, say why, and recover.
    fn previous_cut_at(
        &mut self,
        srv: &ReleaseServer,
        prev: &Previous,
        k: u64,
        name: &str,
    ) -> Result<()> {
        let mut node = self.node_from(&format!("cut-{k:02}"), &prev.disk)?;
        let vm = self.boot_v1(&mut node)?;
        let (mut vm, slot, version) = self.cut_in_confirm(&mut node, vm, srv, k, false)?;
        match slot {
            Slot::B => {
                self.check(version == "v2", || format!("B runs {version}"))?;
                let st = self.status(&mut vm)?;
                self.check_slot(&st, Slot::B, SlotState::Good, Some("v2"))?;
                self.note(format!(
                    "cut at {k} ({name}): came up on B v2, blessed; B bootloader {:?}",
                    sl(&st, Slot::B).boot
                ));
            }
            Slot::A => {
                self.check(version == "v1", || format!("A runs {version}"))?;
                self.back_on_previous_a(&mut vm, k, name)?;
                self.upgrade_to(&mut vm, srv, "v2", "")?;
                self.reboot_into_good(&mut vm, Slot::B, "v2")?;
            }
        }
        Ok(())
    }

    /// Safely back on the previous release after a cut at `k` (`name`; its own binary
    /// confirms A): B is not good and not next, and status says why.
    fn back_on_previous_a(&mut self, vm: &mut Vm, k: u64, name: &str) -> Result<()> {
        let st = self.loose_status(vm)?;
        st.expect(self, "A", "good", "v1")?;
        let b = st.slot("B");
        self.check(
            b.is_some_and(|b| b.state != "good") && st.next_boot.as_deref() == Some("A"),
            || {
                format!(
                    "back on A v1 but B is {b:?} and next boot {:?}",
                    st.next_boot
                )
            },
        )?;
        let why = b.and_then(|b| b.why.clone()).unwrap_or_default();
        self.check(!why.trim().is_empty(), || {
            format!("back on A v1 but status gives no reason about B: {b:?}")
        })?;
        self.note(format!(
            "cut at {k} ({name}): came up on A v1 (previous binary); B is {}: {why}",
            b.map(|b| b.state.as_str()).unwrap_or("?")
        ));
        Ok(())
    }
}

/// What the guest runs and carries: binaries, boot scripts, status of any release.
impl Scenario {
    /// sha256 of the k3os-ops the node runs.
    fn ops_sha256(&mut self, vm: &mut Vm) -> Result<String> {
        let out = vm.run_ok("sha256sum \"$(command -v k3os-ops)\"", CMD)?;
        out.split_whitespace()
            .find(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_string)
            .ok_or_else(|| self.fail(format!("no sha256 in `sha256sum k3os-ops`: {out}")))
    }

    /// The version of the boot script installed on /boot (`grub.cfg`, or `extlinux.conf`),
    /// read from the guest's file by bootconfig's own rules (v0.1.0's scripts have no marker
    /// line and are version 1).
    fn boot_script(&mut self, vm: &mut Vm) -> Result<u32> {
        let path = if self.target.uses_grub() {
            "/boot/grub/grub.cfg"
        } else {
            "/boot/syslinux/extlinux.conf"
        };
        let text = vm.run_ok(&format!("cat {path}"), CMD)?;
        let p = Path::new(path);
        let v = if self.target.uses_grub() {
            bootconfig::GrubScript::of_cfg(p, &text).map(|v| v.number())
        } else {
            bootconfig::conf_version(p, &text)
        };
        v.map_err(|e| self.fail(format!("{}: the installed {path}: {e}", vm.name())))
    }

    /// The version of the boot script the current code renders for this target.
    fn current_script(&self) -> u32 {
        if self.target.uses_grub() {
            bootconfig::GrubScript::CURRENT.number()
        } else {
            bootconfig::CONF_VERSION
        }
    }

    /// Whether current release `version` carries this target's boot script for the node to
    /// install (its manifest's `boot.scripts`).
    fn release_carries_script(&self, version: &str) -> Result<bool> {
        let m = self
            .target
            .releases(&self.root)
            .join(version)
            .join(libupgrade::manifest::MANIFEST_FILE);
        let text = std::fs::read(&m).map_err(|e| Error::io("read", &m, e))?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            Error::io(
                "parse",
                &m,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        let kind = if self.target.uses_grub() {
            "grub-cfg"
        } else {
            "extlinux-conf"
        };
        Ok(v.pointer("/boot/scripts")
            .and_then(|x| x.as_array())
            .is_some_and(|a| {
                a.iter()
                    .any(|f| f.get("kind").and_then(|k| k.as_str()) == Some(kind))
            }))
    }

    /// What the current binary's `slot status --json` says about the installed boot script
    /// (any top-level field naming a script), or that it says nothing.
    fn status_script_field(&mut self, vm: &mut Vm) -> Result<String> {
        fn find(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
            if let Some(o) = v.as_object() {
                for (k, x) in o {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    if k.contains("script") {
                        out.push(format!("{path}={x}"));
                    } else {
                        find(x, &path, out);
                    }
                }
            }
        }
        let v = self.status_value(vm)?;
        let mut fields = Vec::new();
        find(&v, "", &mut fields);
        Ok(if fields.is_empty() {
            "no script field".into()
        } else {
            fields.join(" ")
        })
    }

    /// `slot status --json` read leniently: the previous release's binary may print other
    /// fields (or fewer) than libupgrade's current types.
    fn loose_status(&mut self, vm: &mut Vm) -> Result<LooseStatus> {
        let v = self.status_value(vm)?;
        Ok(LooseStatus::from_json(&v))
    }
}

/// The previous release's outputs for one target (images/out/previous/<arch>/).
struct Previous {
    version: String,
    commit: String,
    disk: PathBuf,
    /// sha256 of the k3os-ops in its v1 rootfs.
    ops_sha256: String,
}

impl Previous {
    fn load(root: &Path, target: Target) -> Result<Previous> {
        target.check_previous_inputs(root)?;
        let changelog = root.join("CHANGELOG.md");
        let text =
            std::fs::read_to_string(&changelog).map_err(|e| Error::io("read", &changelog, e))?;
        let (version, commit) =
            crate::target::previous_release(&text).expect("checked by check_previous_inputs");
        let sum = target.previous_dir(root).join("k3os-ops.sha256");
        let ops_sha256 = std::fs::read_to_string(&sum)
            .map_err(|e| Error::io("read", &sum, e))?
            .trim()
            .to_string();
        let stamp = target.previous_dir(root).join("previous.stamp");
        let built = std::fs::read_to_string(&stamp).unwrap_or_default();
        if !built.contains(&commit) {
            return Err(Error::Missing {
                what: format!("previous disks built from {version}'s commit {commit} (previous.stamp says otherwise)"),
                path: stamp,
                hint: "rebuild them with `just images-previous`".into(),
            });
        }
        Ok(Previous {
            version,
            commit,
            disk: target.previous_disk(root),
            ops_sha256,
        })
    }
}

/// One slot of [`LooseStatus`].
#[derive(Debug, Clone, Default)]
pub struct LooseSlot {
    pub slot: String,
    pub state: String,
    pub version: Option<String>,
    /// The reason of its last decision, if any.
    pub why: Option<String>,
}

/// `slot status --json` of any release: only the fields every release has had (v0.1.0 on).
#[derive(Debug, Clone, Default)]
pub struct LooseStatus {
    pub booted: Option<String>,
    pub next_boot: Option<String>,
    pub slots: Vec<LooseSlot>,
}

impl LooseStatus {
    pub fn from_json(v: &serde_json::Value) -> LooseStatus {
        let s =
            |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
        LooseStatus {
            booted: s(v, "booted"),
            next_boot: s(v, "next_boot"),
            slots: v
                .get("slots")
                .and_then(|x| x.as_array())
                .map(|a| {
                    a.iter()
                        .map(|x| LooseSlot {
                            slot: s(x, "slot").unwrap_or_default(),
                            state: s(x, "state").unwrap_or_default(),
                            version: s(x, "version"),
                            why: x.get("last_decision").and_then(|d| s(d, "why")),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    pub fn slot(&self, name: &str) -> Option<&LooseSlot> {
        self.slots.iter().find(|s| s.slot == name)
    }

    fn expect(&self, sc: &Scenario, slot: &str, state: &str, version: &str) -> Result<()> {
        let s = self.slot(slot);
        sc.check(
            s.is_some_and(|s| s.state == state && s.version.as_deref() == Some(version)),
            || format!("slot {slot} is {s:?}, expected {state} {version}; status: {self:?}"),
        )
    }
}

/// The first barrier of the migrating confirm that writes the bootloader's state (where the
/// env written by the previous release is first rewritten by the current code); the first
/// barrier when none is named so.
pub fn first_migrating_barrier(barriers: &[(u64, String)]) -> u64 {
    barriers
        .iter()
        .find(|(_, n)| n.contains("bootloader") || n.contains("grub") || n.contains("env"))
        .or(barriers.first())
        .map(|(k, _)| *k)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_barrier_and_loose_status() {
        let b = vec![
            (1, "confirm:boot-recorded".to_string()),
            (2, "confirm:bootloader-good".to_string()),
            (3, "confirm:state-good".to_string()),
        ];
        assert_eq!(first_migrating_barrier(&b), 2);
        assert_eq!(first_migrating_barrier(&b[..1]), 1);
        let v: serde_json::Value = serde_json::from_str(
            r#"{"booted":"A","next_boot":"A","bootloader":"grub","slots":[{"slot":"A","state":"good","version":"v1","last_decision":null},{"slot":"B","state":"bad","version":"v2","extra":1,"last_decision":{"event":"fallback_taken","why":"slot B did not confirm"}}]}"#,
        )
        .unwrap();
        let st = LooseStatus::from_json(&v);
        assert_eq!(st.booted.as_deref(), Some("A"));
        assert_eq!(st.slot("A").unwrap().version.as_deref(), Some("v1"));
        assert_eq!(
            st.slot("B").unwrap().why.as_deref(),
            Some("slot B did not confirm")
        );
    }
}
