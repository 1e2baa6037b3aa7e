//! Which boot script an activation leaves installed: a pure decision, made once per activation
//! by [`decide`] and carried out by [`crate::Updater::activate_awaiting`].
//!
//! After an activation two `k3os-ops` binaries can run on the node: the one activating (the
//! running slot, which is the fallback) and the one in the trial slot. Both must read the
//! installed boot script's env layout (see `bootconfig::GrubScript`): a binary that does
//! not could write what the script reads as damage, or refuse to read it at all. So the
//! script after the activation must be no newer than this build knows (`known`) nor than the
//! trial release's `k3os-ops` reads (`target_reads`, from its manifest; 1 for releases made
//! before v0.2.0). A release carrying a script of the installed version or a newer one gets it
//! installed here when both can read it (the same version with other text: a fixed command
//! line, say; installing identical text writes nothing); an older one is not installed over a
//! script both still read; a script newer than this build is left for the trial slot's own binary to install
//! on a later activation (the two-release rollout); an installed script the trial release
//! cannot read is kept only if the release carries one it can, else the activation is refused
//! before anything is written.

use crate::manifest::ScriptKind;

/// What an activation does with the boot script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptStep {
    /// Leave the installed script.
    Keep,
    /// Install the trial release's script of this version before arming the trial.
    Install(u32),
}

/// Why an activation must not go ahead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the installed {kind} is version {installed}, but this release's k3os-ops reads only versions up to {target_reads} and the release carries no {kind} it can read: it cannot run on this node; stage a newer release")]
pub struct ScriptRefusal {
    /// Which loader's script.
    pub kind: ScriptKind,
    /// Version of the script installed on the node.
    pub installed: u32,
    /// Newest version the release to activate reads.
    pub target_reads: u32,
}

/// The step for one loader. `installed`: the installed script's version (`None`: no script,
/// nothing to keep or migrate); `known`: the newest this build reads; `target_reads`: the
/// newest the trial release reads; `carried`: the version of the script the trial release
/// carries, if any.
pub fn decide(
    kind: ScriptKind,
    installed: Option<u32>,
    known: u32,
    target_reads: u32,
    carried: Option<u32>,
) -> Result<ScriptStep, ScriptRefusal> {
    let Some(installed) = installed else {
        return Ok(ScriptStep::Keep);
    };
    let readable = |v: u32| v <= known && v <= target_reads;
    match carried.filter(|&v| readable(v)) {
        Some(v) if v >= installed || !readable(installed) => Ok(ScriptStep::Install(v)),
        _ if readable(installed) => Ok(ScriptStep::Keep),
        _ => Err(ScriptRefusal {
            kind,
            installed,
            target_reads,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const K: ScriptKind = ScriptKind::GrubCfg;

    #[test]
    fn the_two_release_rollout() {
        // v0.1.0 activating a v0.2.0 release never gets here (it predates this code); the
        // v0.2.0 binary then activating a v0.2.0 release that carries script 2 installs it.
        assert_eq!(
            decide(K, Some(1), 2, 2, Some(2)),
            Ok(ScriptStep::Install(2))
        );
        // The same version again (other text, e.g. a new command line) is installed too; an
        // older one is not, while both read the installed one.
        assert_eq!(
            decide(K, Some(2), 2, 2, Some(2)),
            Ok(ScriptStep::Install(2))
        );
        assert_eq!(decide(K, Some(2), 2, 2, Some(1)), Ok(ScriptStep::Keep));
        // A release carrying no script keeps what is there when it reads it.
        assert_eq!(decide(K, Some(1), 2, 2, None), Ok(ScriptStep::Keep));
        // A release with a script newer than this build: kept for its own binary to install.
        assert_eq!(decide(K, Some(2), 2, 3, Some(3)), Ok(ScriptStep::Keep));
        // A release made before v0.2.0 (reads 1) on a node with script 2: refused.
        let e = decide(K, Some(2), 2, 1, None).unwrap_err();
        assert!(e.to_string().contains("version 2") && e.to_string().contains("up to 1"));
        // ... unless it carries a script it reads: that is installed instead.
        assert_eq!(
            decide(K, Some(2), 2, 1, Some(1)),
            Ok(ScriptStep::Install(1))
        );
        // No script installed: nothing to decide.
        assert_eq!(decide(K, None, 2, 1, Some(1)), Ok(ScriptStep::Keep));
    }

    proptest! {
        /// Whatever the versions: after the step both binaries read the installed script, a
        /// script is installed only when the release carries it, and an activation is refused
        /// only when no readable script is possible.
        #[test]
        fn both_slots_read_the_script_afterwards(
            installed in 1u32..5, known in 1u32..5, reads in 1u32..5, carried in proptest::option::of(1u32..5),
        ) {
            prop_assume!(installed <= known);
            prop_assume!(carried.is_none_or(|c| c <= reads));
            match decide(K, Some(installed), known, reads, carried) {
                Ok(ScriptStep::Keep) => prop_assert!(installed <= known && installed <= reads),
                Ok(ScriptStep::Install(v)) => {
                    prop_assert_eq!(Some(v), carried);
                    prop_assert!(v <= known && v <= reads);
                }
                Err(_) => {
                    prop_assert!(installed > reads);
                    prop_assert!(carried.is_none_or(|c| c > known));
                }
            }
        }
    }
}
