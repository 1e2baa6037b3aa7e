//! The tests that need a real API server (kube-apiserver v1.36 and etcd, which
//! `scripts/setup.sh` installs and [`support`] starts; part of `just test`): the agent's requests under
//! deploy/rbac.yaml (`agent_cluster`), three agent processes rolling a release out
//! (`cluster_fleet`), and the node-scoped admission policies (`cluster_scope`). Run them with
//! `cargo test -p k3os-ops --test cli cluster::`; they take turns ([`support::exclusive`]).

mod support;

mod agent_cluster;
mod cluster_fleet;
mod cluster_scope;
