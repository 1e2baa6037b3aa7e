//! The agent's container image, one test binary: the OCI archive `just image` writes, validated
//! and run under runc (`agent_image`), and the system-upgrade-controller Plan's containers with
//! the Plan's mounts and privileges (`suc_plan`); `oci_support` is what they share. Their
//! `#[ignore]`d tests need that archive and run with `just image-test`
//! (`cargo test -p k3os-ops --test image -- --ignored`).

mod agent_image;
mod oci_support;
mod suc_plan;
