//! The tests that need a real API server (`#[ignore]`d; run them with `KUBEBUILDER_ASSETS`
//! pointing at a kube-apiserver and etcd, see `cluster_support`), in one binary: the agent's
//! requests under deploy/rbac.yaml (`agent_cluster`), three agent processes rolling a release
//! out (`cluster_fleet`), and the node-scoped admission policies (`cluster_scope`). Run one with
//! `cargo test -p k3os-ops --test cluster <name>:: -- --ignored`.

#[path = "../cli_support/mod.rs"]
mod cli_support;
#[path = "../release_support/mod.rs"]
mod release_support;

mod cluster_support;

mod agent_cluster;
mod cluster_fleet;
mod cluster_scope;
