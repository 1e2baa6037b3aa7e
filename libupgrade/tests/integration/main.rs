//! libupgrade's integration tests, one test binary: each module was its own binary before, and
//! every binary links the whole crate graph again (CI's builds phase; docs/benchmarks.md, "CI").
//! Run one module with `cargo test -p libupgrade --test integration <module>::`, e.g.
//! `stage::` or `chunked::patched::`. Fixtures are in `libupgrade/tests/fixtures/`.

mod assess;
mod binding;
mod bounded;
mod chunked;
mod lifecycle;
mod patch;
mod retry;
mod rollout;
mod stage;
mod state_formats;
mod thin;
mod verity;
