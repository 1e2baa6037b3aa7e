//! The failure bundle of a trial that panicked before userspace (`fallback-panic` on the
//! x86_64 GRUB targets): the node reports to a collector on the host, and after the fallback
//! to A the good slot's bundle of the panicking attempt must arrive, open, name the release
//! and the attempt, carry the loader's try counts and — where the firmware keeps a panic's
//! kernel log (UEFI variables through `efi_pstore`) — the pstore record with the panic, which
//! the node then removes from the firmware's store.

use fleet_report::Failure;

use super::bundles::WantedBundle;
use super::steps::CMD;
use super::Scenario;
use crate::collector::{Collector, CollectorSite};
use crate::error::Result;
use crate::target::Target;
use crate::vm::Vm;

/// What a panicking attempt's bundle must carry on a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PanicEvidence {
    /// The loader's tries only (no pstore backend: BIOS has no firmware store).
    Tries,
    /// The loader's tries and pstore's `dmesg-efi-*` record of the panic (OVMF's variables).
    TriesAndPstore,
}

impl PanicEvidence {
    /// The bundle `fallback-panic` checks on `target`; None where it is not checked (extlinux
    /// and aarch64 keep their CI time; what survives there is in docs/design/reports.md).
    pub(super) fn on(target: Target) -> Option<PanicEvidence> {
        match target {
            Target::X86_64GrubEfi => Some(PanicEvidence::TriesAndPstore),
            Target::X86_64GrubBios => Some(PanicEvidence::Tries),
            Target::X86_64Extlinux | Target::Aarch64GrubEfi => None,
        }
    }
}

/// The sections a panicking attempt's bundle misses (empty: all there): the loader's tries
/// naming all `tries`, and with [`PanicEvidence::TriesAndPstore`] a pstore record holding the
/// kernel's panic line. Pure.
fn missing(want: PanicEvidence, tries: u32, b: &fleet_report::Bundle) -> Vec<String> {
    let has = |prefix: &str, text: &str| {
        b.sections
            .iter()
            .any(|s| s.name.starts_with(prefix) && s.text.contains(text))
    };
    let mut out = Vec::new();
    let used = format!("after {tries} of {tries} boot tries");
    if !has("loader/tries", &used) {
        out.push(format!("loader/tries saying `{used}`"));
    }
    if want == PanicEvidence::TriesAndPstore && !has("pstore/dmesg-efi-", "Kernel panic") {
        out.push("pstore/dmesg-efi-* holding `Kernel panic`".into());
    }
    out
}

impl Scenario {
    /// Back on A after `version`'s `tries` panicking boots: the next `slot status` sends what
    /// waits; the collector holds one `no_userspace` bundle of `version` carrying `want`; the
    /// pstore records it carries are gone from the guest's `/sys/fs/pstore`.
    pub(super) fn panic_bundle_arrived(
        &mut self,
        vm: &mut Vm,
        site: &CollectorSite,
        col: Collector,
        version: &str,
        tries: u32,
        want: PanicEvidence,
    ) -> Result<()> {
        self.spooled(vm)?;
        let want_bundle = WantedBundle {
            version,
            failure: Failure::NoUserspace,
            sections: &["loader/tries"],
        };
        let arrived = self.bundle_arrived(site, &want_bundle, "after the fallback");
        let log = col.stop()?;
        let (row, b) =
            arrived.map_err(|e| self.fail(format!("{e}\nthe collector's log:\n{log}")))?;
        let names: Vec<String> = b.sections.iter().map(|s| s.name.clone()).collect();
        let missing = missing(want, tries, &b);
        self.check(missing.is_empty(), || {
            format!(
                "the bundle of {version} attempt {} misses {missing:?}: sections {names:?}\n{}",
                row.attempt,
                b.sections
                    .iter()
                    .map(|s| format!("--- {}\n{}", s.name, s.text))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })?;
        let left = vm.run_ok("ls /sys/fs/pstore 2>/dev/null | wc -l", CMD)?;
        let left: u32 = left.trim().parse().unwrap_or(u32::MAX);
        if want == PanicEvidence::TriesAndPstore {
            self.check(left == 0, || {
                format!("{left} pstore record(s) left in the guest after their bundle was kept")
            })?;
        }
        self.note(format!(
            "{version} attempt {}: {left} pstore record(s) left after the bundle was kept",
            row.attempt
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_report::{Bundle, Section};

    fn bundle(sections: &[(&str, &str)]) -> Bundle {
        let mut b = Bundle {
            format: fleet_report::BUNDLE_FORMAT,
            node: fleet_report::NodeId([0; 32]),
            version: "v2-panic".into(),
            generation: 2,
            attempt: 1,
            slot: "B".into(),
            time: "2026-12-07T00:00:00Z".into(),
            failure: Failure::NoUserspace,
            why: String::new(),
            versions: String::new(),
            redacted: 0,
            sections: Vec::new(),
        };
        b.sections = sections
            .iter()
            .map(|(name, text)| Section {
                name: name.to_string(),
                text: text.to_string(),
                cut_bytes: 0,
            })
            .collect();
        b
    }

    #[test]
    fn the_panic_must_be_in_pstore_only_where_the_firmware_keeps_it() {
        let tries = ("loader/tries", "fell back after 3 of 3 boot tries, none");
        let panic = ("pstore/dmesg-efi-176", "Kernel panic - not syncing");
        let only_tries = bundle(&[tries]);
        assert!(missing(PanicEvidence::Tries, 3, &only_tries).is_empty());
        assert_eq!(
            missing(PanicEvidence::TriesAndPstore, 3, &only_tries).len(),
            1
        );
        assert!(missing(PanicEvidence::TriesAndPstore, 3, &bundle(&[tries, panic])).is_empty());
        assert_eq!(missing(PanicEvidence::Tries, 2, &only_tries).len(), 1);
        assert_eq!(missing(PanicEvidence::Tries, 3, &bundle(&[panic])).len(), 1);
    }
}
