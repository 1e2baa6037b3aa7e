//! Checks that keep a fresh clone working on a fresh Debian 12 machine, keep the guide in
//! `docs/guide/` true (its marked shell blocks run against the built binary: [`guide`]), and
//! hold the code rules that keep the code changeable ([`rules`]: file size, the agent's
//! layering, one public path per type; `tests/code_rules.rs` runs them over the repository).
//!
//! CI runs on the developer's machine, where a package installed by hand hides a missing
//! install step (it happened: `grub-emu` was never installed by `scripts/setup.sh`, and
//! `just test` failed on the first fresh machine). [`tools`] finds every external command the
//! repository's tests, recipes and scripts name, and says which Debian package provides it on
//! this machine; the test in `tests/setup_installs_every_tool.rs` fails naming each command
//! whose package is neither installed by `scripts/setup.sh` nor part of every Debian system
//! (`Essential: yes` or `Priority: required`).
//!
//! How a command is found: every string literal of the Rust sources and every word of the
//! shell scripts and the justfile that names an executable on `PATH` (so words that are not
//! commands drop out by themselves), and its package by `dpkg -S`. Text is scanned, not
//! parsed: a literal like `"file"` in Rust names the `file` command as far as this check knows;
//! such words go into [`tools::NOT_HOST_COMMANDS`] with the reason. Programs a test takes
//! from a directory an environment variable names, never from `PATH` (envtest's `etcd` and
//! `kube-apiserver` from `$KUBEBUILDER_ASSETS`), go into [`tools::FROM_ASSETS`]: whether a
//! package of that name is installed here must not change the verdict.

pub mod guide;
pub mod rules;
pub mod tools;
