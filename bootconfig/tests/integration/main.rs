//! bootconfig's integration tests, one test binary: each module was its own binary before, and
//! every binary links the crate graph again (CI's builds phase; docs/benchmarks.md, "CI"). Run
//! one module with `cargo test -p bootconfig --test integration <module>::`, e.g.
//! `grub_real::`. `common` holds the helpers they share; fixtures are in
//! `bootconfig/tests/fixtures/`.

mod common;
mod extlinux_real;
mod grub_qemu;
mod grub_real;
mod grubenv_editenv;
mod integrity;
mod memory_vs_grub;
mod migration;
mod power_cut;
mod props;
mod syslinux_qemu;
