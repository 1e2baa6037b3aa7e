//! The failure bundle a scenario's node sent home: stored by the collector on the host, opened
//! as the collector's readers open it ([`fleet_report::open_bundle`]) and held to what the
//! failed attempt must carry. One check, for `report-spool`, `site-rollback` and the
//! panicking attempt's evidence (`panic_bundle`), which checks more of what it returns.

use super::Scenario;
use crate::collector::CollectorSite;
use crate::error::Result;

/// The one failure bundle a scenario expects the collector to hold.
pub(in crate::scenario) struct WantedBundle<'a> {
    /// The release whose failed attempt it is.
    pub version: &'a str,
    /// How that attempt failed.
    pub failure: fleet_report::Failure,
    /// Prefixes of section names each of which some section with text must have
    /// (`health/`: the checks' output, `log/kernel`, `log/kubelet`: logs' tails).
    pub sections: &'a [&'a str],
}

impl Scenario {
    /// The collector at `site` holds exactly one failure bundle, `want`, sealed by the node and
    /// opening as the collector's readers open it; noted with `when` it was found. Returns
    /// its stored row and the opened bundle.
    pub(in crate::scenario) fn bundle_arrived(
        &mut self,
        site: &CollectorSite,
        want: &WantedBundle<'_>,
        when: &str,
    ) -> Result<(collector::BundleRow, fleet_report::Bundle)> {
        let stored = site.bundles()?;
        let Some((row, body)) = stored.first() else {
            return Err(self.fail(format!("the collector holds no failure bundle {when}")));
        };
        let b = fleet_report::open_bundle(body)
            .map_err(|e| self.fail(format!("the stored bundle does not open: {e}")))?
            .bundle;
        let has = |prefix: &str| {
            b.sections
                .iter()
                .any(|s| s.name.starts_with(prefix) && !s.text.is_empty())
        };
        let names: Vec<String> = b
            .sections
            .iter()
            .map(|s| format!("{} ({} B)", s.name, s.text.len()))
            .collect();
        self.check(
            stored.len() == 1
                && row.version == want.version
                && b.version == want.version
                && b.attempt == row.attempt
                && row.failure == want.failure
                && want.sections.iter().all(|p| has(p)),
            || {
                format!(
                    "one {} bundle of a {:?} failure with sections {:?} expected {when}: {row:?}, sections {names:?}",
                    want.version, want.failure, want.sections
                )
            },
        )?;
        self.note(format!(
            "failure bundle of {} attempt {} stored {when}: {} bytes sealed, sections {names:?}, {} redaction(s)",
            want.version,
            row.attempt,
            body.len(),
            b.redacted
        ));
        Ok((row.clone(), b))
    }
}
