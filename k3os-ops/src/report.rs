//! How a failed command reports its error: once, as one line a person can act on.
//!
//! anyhow's default `main` report prints the top error and then every `Caused by:` — but our
//! library errors already carry their cause in their message (`manifest URL: missing field
//! …`, `open /dev/vda5: Permission denied`), so the same sentence showed up twice. [`render`]
//! joins the chain with ": " and leaves out every cause whose text the line already holds.

/// One line for the whole error chain, each distinct message once.
pub fn render(err: &anyhow::Error) -> String {
    join_chain(err.chain().map(|e| e.to_string()))
}

/// `EX_TEMPFAIL` (sysexits.h): the command did what it could and the rest must come later,
/// e.g. `slot confirm` on a trial boot that waits for the agent's Node-Ready, or `upgrade`
/// stopped at its byte budget or at the end of its download schedule (progress kept).
pub const EXIT_PENDING: u8 = 75;

/// The exit status for a failed command: [`EXIT_PENDING`] for a bless that waits for awaited
/// checks and for a stage stopped resumable, 1 for everything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    let pending = err.chain().any(|e| {
        matches!(
            e.downcast_ref::<libupgrade::Error>(),
            Some(libupgrade::Error::BlessPending { .. } | libupgrade::Error::Stopped { .. })
        )
    });
    if pending {
        EXIT_PENDING
    } else {
        1
    }
}

fn join_chain(messages: impl IntoIterator<Item = String>) -> String {
    let mut line = String::new();
    for m in messages {
        let m = m.trim();
        if m.is_empty() || line.contains(m) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(m);
    }
    line
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

    #[test]
    fn context_and_new_causes_are_joined() {
        let e = anyhow::Error::new(std::io::Error::other("health check failed on slot B"))
            .context("slot confirm");
        assert_eq!(render(&e), "slot confirm: health check failed on slot B");
    }
}
