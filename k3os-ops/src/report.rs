//! How a failed command reports its error: once, as one line a person can act on.
//!
//! anyhow's default `main` report prints the top error and then every `Caused by:` — but our
//! library errors already carry their cause in their message (`manifest URL: missing field
//! …`, `open /dev/vda5: Permission denied`), so the same sentence showed up twice. [`render`]
//! joins the chain with ": " and leaves out every cause whose text the line already holds.
//!
//! A boot assessment that does not end on a good slot is a value of the library
//! ([`ConfirmReport`]); [`Unconfirmed`] makes it the command's error and [`exit_code`] its exit
//! status.

use bootconfig::Slot;
use libupgrade::state::Outcome;
use libupgrade::state::SlotState;
use libupgrade::ConfirmReport;

/// One line for the whole error chain, each distinct message once.
pub fn render(err: &anyhow::Error) -> String {
    libupgrade::join_messages(err.chain().map(|e| e.to_string()))
}

/// `EX_TEMPFAIL` (sysexits.h): the command did what it could and the rest must come later,
/// e.g. `slot confirm` on a trial boot that waits for the agent's Node-Ready, or `upgrade`
/// stopped at its byte budget or at the end of its download schedule (progress kept).
pub const EXIT_PENDING: u8 = 75;

/// A boot assessment whose outcome is not a good slot, as the error of the command that
/// asked for it: the one place an [`Outcome`] becomes a message and an exit status.
#[derive(Debug, thiserror::Error)]
pub enum Unconfirmed {
    /// A check failed; `rolled_back`: the loader boots the other (good) slot next.
    #[error("health check failed on slot {slot}: {failures}")]
    HealthFailed {
        slot: Slot,
        failures: String,
        rolled_back: bool,
    },
    /// Awaited checks were not reported yet: still on trial.
    #[error("slot {slot} passed its health checks but is not marked good yet: waiting for {waiting_for} (to be reported within {within_secs} s of the boot, e.g. by the agent); a reboot before then counts as a failed try")]
    Pending {
        slot: Slot,
        waiting_for: String,
        within_secs: u64,
    },
    /// The booted slot's content is not known to be complete.
    #[error("slot {slot} is {state}, expected staged, trying or good (its content is not known to be complete)")]
    NotAssessable { slot: Slot, state: SlotState },
}

impl Unconfirmed {
    /// `None` when `rep` ends on a good slot (blessed now or before).
    pub fn of(rep: &ConfirmReport) -> Option<Unconfirmed> {
        let slot = rep.slot;
        match rep.outcome() {
            Outcome::Blessed | Outcome::Good => None,
            Outcome::RolledBack { .. } | Outcome::Unhealthy => Some(Unconfirmed::HealthFailed {
                slot,
                failures: rep.failures(),
                rolled_back: matches!(rep.outcome(), Outcome::RolledBack { .. }),
            }),
            Outcome::Pending {
                waiting_for,
                within_secs,
            } => Some(Unconfirmed::Pending {
                slot,
                waiting_for: waiting_for.join(", "),
                within_secs: *within_secs,
            }),
            Outcome::NotAssessable { state } => Some(Unconfirmed::NotAssessable {
                slot,
                state: *state,
            }),
        }
    }

    /// [`EXIT_PENDING`] when the bless waits for awaited checks, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Unconfirmed::Pending { .. } => EXIT_PENDING,
            _ => 1,
        }
    }
}

/// The exit status for a failed command: the [`Unconfirmed`] outcome's (75 for a bless that
/// waits for awaited checks), 75 for a stage that stopped resumable (its byte budget, the end
/// of its download schedule: [`libupgrade::Error::Stopped`]), 1 for everything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    let stopped = err.chain().any(|e| {
        matches!(
            e.downcast_ref::<libupgrade::Error>(),
            Some(libupgrade::Error::Stopped { .. })
        )
    });
    if stopped {
        return EXIT_PENDING;
    }
    err.chain()
        .find_map(|e| e.downcast_ref::<Unconfirmed>())
        .map_or(1, Unconfirmed::exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("manifest {location}: {source}")]
    struct Outer {
        location: String,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let e = anyhow::Error::new(Outer {
            location: "http://x/v2/manifest.json".into(),
            source: std::io::Error::other("missing field `version`"),
        });
        assert_eq!(
            render(&e),
            "manifest http://x/v2/manifest.json: missing field `version`"
        );
    }

    fn report(outcome: Outcome, checks: Vec<libupgrade::health::CheckResult>) -> ConfirmReport {
        ConfirmReport {
            slot: Slot::B,
            version: Some("v2".into()),
            newly_good: false,
            checks: checks.clone(),
            other_slot: None,
            verdict: libupgrade::state::Verdict {
                boot_id: "boot-2".into(),
                slot: Slot::B,
                version: Some("v2".into()),
                outcome,
                reason: "test".into(),
                other_slot: None,
                checks,
                loader_damage: Vec::new(),
            },
        }
    }

    /// Every outcome maps to one message and exit status: good ones to none (exit 0), a bless
    /// waiting for awaited checks to 75, the rest to 1.
    #[test]
    fn outcomes_map_to_messages_and_exit_codes() {
        let failed = vec![libupgrade::health::CheckResult {
            name: "50-app".into(),
            ok: false,
            detail: "app is down".into(),
        }];
        assert!(Unconfirmed::of(&report(Outcome::Blessed, vec![])).is_none());
        assert!(Unconfirmed::of(&report(Outcome::Good, vec![])).is_none());
        let cases = [
            (
                Outcome::RolledBack { to: Slot::A },
                "health check failed on slot B: 50-app: app is down",
                1,
            ),
            (
                Outcome::Unhealthy,
                "health check failed on slot B: 50-app: app is down",
                1,
            ),
            (
                Outcome::Pending {
                    waiting_for: vec!["node-ready".into()],
                    within_secs: 600,
                },
                "slot B passed its health checks but is not marked good yet: waiting for node-ready (to be reported within 600 s",
                EXIT_PENDING,
            ),
            (
                Outcome::NotAssessable {
                    state: SlotState::Invalid,
                },
                "slot B is invalid, expected staged, trying or good",
                1,
            ),
        ];
        for (outcome, text, code) in cases {
            let e = Unconfirmed::of(&report(outcome.clone(), failed.clone()))
                .unwrap_or_else(|| panic!("{outcome:?} is not good"));
            assert!(e.to_string().starts_with(text), "{outcome:?}: {e}");
            let err = anyhow::Error::new(e).context("slot confirm");
            assert_eq!(exit_code(&err), code, "{outcome:?}");
        }
        assert_eq!(exit_code(&anyhow::anyhow!("other")), 1);
    }

    #[test]
    fn a_resumable_stage_stop_exits_75_like_a_pending_bless() {
        use libupgrade::Stop;
        let e = anyhow::Error::new(libupgrade::Error::Stopped {
            why: Stop::Budget { budget: 1 << 20 },
            fetched: 1 << 20,
            left: 5,
        })
        .context("upgrade");
        assert_eq!(exit_code(&e), EXIT_PENDING);
        let e = anyhow::Error::new(libupgrade::Error::Usage("bad".into()));
        assert_eq!(exit_code(&e), 1);
    }

    #[test]
    fn context_and_new_causes_are_joined() {
        let e = anyhow::Error::new(std::io::Error::other("health check failed on slot B"))
            .context("slot confirm");
        assert_eq!(render(&e), "slot confirm: health check failed on slot B");
    }
}
