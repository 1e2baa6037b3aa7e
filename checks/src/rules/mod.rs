//! The code rules the project writes down, as checks that fail CI when broken: no non-test
//! source file over [`MAX_FILE_LINES`] ([`sizes`]), the agent's layering as its module docs
//! state it ([`layering`]), and one public path per type in each crate ([`paths`]). The
//! function-length rule is clippy's `too_many_lines` (threshold in `clippy.toml`), not here.
//!
//! Each rule is a pure function over file texts and paths, unit-tested on samples here; the
//! test in `tests/code_rules.rs` runs them over the repository's tracked files. Rust is read
//! with `syn` (a parse, not a regex: `use` trees with braces and `self`, nested modules and
//! `#[cfg(test)]` items are what text matching gets wrong).

pub mod layering;
pub mod paths;
pub mod sizes;

pub use sizes::MAX_FILE_LINES;
