//! How a failed command reports its error: once, as one line a person can act on.
//!
//! anyhow's default `main` report prints the top error and then every `Caused by:` — but our
//! library errors already carry their cause in their message (`manifest URL: missing field
//! …`, `open /dev/vda5: Permission denied`), so the same sentence showed up twice. [`render`]
//! joins the chain with ": " and leaves out every cause whose text the line already holds.
//!
//! A boot assessment that does not end on a good slot is a value of the library
//! ([`libupgrade::ConfirmReport::unconfirmed`], a [`Unconfirmed`]); a command makes it its
//! error and [`exit_code`] its exit status.

use libupgrade::Unconfirmed;

/// One line for the whole error chain, each distinct message once.
pub fn render(err: &anyhow::Error) -> String {
    libupgrade::join_messages(err.chain().map(|e| e.to_string()))
}

/// `EX_TEMPFAIL` (sysexits.h): the command did what it could and the rest must come later,
/// e.g. `slot confirm` on a trial boot that waits for the agent's Node-Ready, or `upgrade`
/// stopped at its byte budget or at the end of its download schedule (progress kept).
pub const EXIT_PENDING: u8 = 75;

/// The exit status of a command whose boot assessment did not end on a good slot:
/// [`EXIT_PENDING`] when the bless waits for awaited checks, 1 otherwise.
pub fn unconfirmed_exit(u: &Unconfirmed) -> u8 {
    match u {
        Unconfirmed::Pending { .. } => EXIT_PENDING,
        _ => 1,
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
        .map_or(1, unconfirmed_exit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootconfig::Slot;
    use libupgrade::state::{Outcome, SlotState};
    use libupgrade::ConfirmReport;

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
        assert!(report(Outcome::Blessed, vec![]).unconfirmed().is_none());
        assert!(report(Outcome::Good, vec![]).unconfirmed().is_none());
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
            let e = report(outcome.clone(), failed.clone())
                .unconfirmed()
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
