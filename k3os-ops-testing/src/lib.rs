//! Test doubles and fixtures of k3os-ops that more than one of its test targets uses: the
//! fake API server and the simulated node ([`fake_api`], [`sim_node`]: the agent's test
//! binary and the fleet bench), the CLI tests' node and release fixtures ([`cli`],
//! [`release`]: the `cli` and `suc_plan` test binaries). It owns no test itself; it speaks the
//! Kubernetes API as JSON and uses k3os-ops only through the agent's test facade
//! (`k3os_ops::agent::testing`: the write counter, `NodeOps` and its types, the channel
//! type). Depending on it turns on k3os-ops' `testing` feature, which opens that facade and
//! the library's own fixtures (`UpdateChannel::test()`). [`browser`] drives headless Chromium
//! for the dashboard's tests.

pub mod browser;
pub mod cli;
pub mod fake_api;
pub mod release;
pub mod sim_node;
