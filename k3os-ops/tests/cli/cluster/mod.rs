//! The tests that need a real API server (`#[ignore]`d; run them with `KUBEBUILDER_ASSETS`
//! pointing at a kube-apiserver and etcd, see [`support`]): the agent's requests under
//! deploy/rbac.yaml (`agent_cluster`), three agent processes rolling a release out
//! (`cluster_fleet`), and the node-scoped admission policies (`cluster_scope`). Run them with
//! `cargo test -p k3os-ops --test cli cluster:: -- --ignored --test-threads 1`.

mod support;

mod agent_cluster;
mod cluster_fleet;
mod cluster_scope;
