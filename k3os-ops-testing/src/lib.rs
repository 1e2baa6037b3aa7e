//! Test doubles of k3os-ops that more than one of its test targets uses: the agent's
//! integration-test binary (`k3os-ops/tests/agent/`) and the fleet bench
//! (`k3os-ops/benches/fleet/main.rs`). It owns no test itself; it speaks the Kubernetes API as
//! JSON and uses k3os-ops only for the agent's write counter. Depending on it turns on
//! k3os-ops' `testing` feature, which gives the integration tests the library's own
//! fixtures (`UpdateChannel::test()`).

pub mod fake_api;
pub mod sim_node;
