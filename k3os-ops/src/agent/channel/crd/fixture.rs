//! The one test fixture of an [`UpdateChannel`] (like controller-rs's `Document::test()`):
//! the channel every decision, race and wave test starts from, changed only where a test
//! says so. Compiled for the crate's unit tests and, through the `testing` feature, for the
//! integration tests and benches (`k3os-ops-testing` turns it on); never in a release build.

use super::{RolloutSpec, UpdateChannel, UpdateChannelSpec, UpdateChannelStatus};

/// Builds an [`UpdateChannel`] for tests. Unless changed: named `stable`, releases at
/// `https://releases.example/stable/`, version `v2` pinned, concurrency 1, rebootTimeout
/// `15m`, maxFailures 1, every other spec field absent, and an empty status.
#[derive(Debug, Clone)]
pub struct ChannelFixture {
    name: String,
    spec: UpdateChannelSpec,
    status: Option<UpdateChannelStatus>,
}

impl UpdateChannel {
    /// The test channel; see [`ChannelFixture`] for what it holds.
    pub fn test() -> ChannelFixture {
        ChannelFixture {
            name: "stable".into(),
            spec: UpdateChannelSpec {
                url: "https://releases.example/stable/".into(),
                version: Some("v2".into()),
                concurrency: 1,
                reboot_timeout: "15m".into(),
                max_failures: 1,
                ..Default::default()
            },
            status: Some(UpdateChannelStatus::default()),
        }
    }
}

impl ChannelFixture {
    /// Named `name`.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// Releases at `url`.
    pub fn url(mut self, url: &str) -> Self {
        self.spec.url = url.into();
        self
    }

    /// `spec.version`: `None` follows the newest release.
    pub fn version(mut self, version: Option<&str>) -> Self {
        self.spec.version = version.map(String::from);
        self
    }

    /// `spec.concurrency`.
    pub fn concurrency(mut self, concurrency: u32) -> Self {
        self.spec.concurrency = concurrency;
        self
    }

    /// `spec.rebootTimeout`, e.g. `10s`.
    pub fn reboot_timeout(mut self, timeout: &str) -> Self {
        self.spec.reboot_timeout = timeout.into();
        self
    }

    /// `spec.maxFailures`.
    pub fn max_failures(mut self, max_failures: u32) -> Self {
        self.spec.max_failures = max_failures;
        self
    }

    /// `spec.rollout` (waves).
    pub fn rollout(mut self, rollout: RolloutSpec) -> Self {
        self.spec.rollout = Some(rollout);
        self
    }

    /// Any other change of the spec.
    pub fn spec_with(mut self, change: impl FnOnce(&mut UpdateChannelSpec)) -> Self {
        change(&mut self.spec);
        self
    }

    /// The status; `None` is a channel no agent has written yet.
    pub fn status(mut self, status: Option<UpdateChannelStatus>) -> Self {
        self.status = status;
        self
    }

    /// The spec alone.
    pub fn spec(self) -> UpdateChannelSpec {
        self.spec
    }

    /// The channel.
    pub fn build(self) -> UpdateChannel {
        let mut ch = UpdateChannel::new(&self.name, self.spec);
        ch.status = self.status;
        ch
    }
}
