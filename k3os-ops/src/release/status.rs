//! `k3os-ops release rollout-status`: the planned shares of each release as nodes see them
//! (`rollout`), the guard's halts applied (`halt`), and with `--reports` what the sites said
//! (`fleet_status`). Its own file so that those three never need each other back.

use chrono::Utc;

use super::rollout::StatusArgs;

/// `release rollout-status`: the planned shares as nodes see them, the guard's halts applied.
pub fn status(a: StatusArgs) -> anyhow::Result<()> {
    let at = a.at.unwrap_or_else(Utc::now);
    let (t, held) = super::halt::effective(&a.dir, at)?;
    #[cfg(feature = "fleet")]
    return super::fleet_status::status(&a.dir, &t, &held, at, &a);
    #[cfg(not(feature = "fleet"))]
    {
        if a.reports.is_some() || a.abort.abort_if.is_some() || a.json {
            anyhow::bail!("--reports, --abort-if and --json need a build with the `fleet` feature (the node images build without it)");
        }
        super::rollout::print_status(&t, at);
        for line in super::halt::lines(&held, &a.dir) {
            println!("{line}");
        }
        Ok(())
    }
}
