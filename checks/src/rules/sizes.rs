//! File size: a non-test source file over [`MAX_FILE_LINES`] lines usually holds two concerns.

use std::path::Path;

/// The most lines a non-test `.rs` file may have.
pub const MAX_FILE_LINES: usize = 600;

/// Whether `path` (relative to the repository) is test code, which the size rule leaves out:
/// integration tests, benches, fuzz targets, test-only crates, and unit-test files
/// (`tests.rs`, `*_tests.rs`, anything under a `tests/` folder).
pub fn is_test_code(path: &Path) -> bool {
    let s = path.to_string_lossy();
    let first = path
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    if ["fuzz", "testkit", "k3os-ops-testing"].contains(&first.as_str()) {
        return true;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || s.split('/')
            .any(|c| c == "tests" || c == "benches" || c == "testutil.rs")
}

/// The lines of `text` that count: all but an inline unit-test module at the file's end
/// (`#[cfg(test)]` then `mod NAME {` at the start of a line, whose braces close on the last
/// line; braces are counted as text, which string literals in tests keep balanced).
pub fn counted_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let last = lines.iter().rposition(|l| !l.trim().is_empty());
    let start = lines
        .windows(2)
        .position(|w| w[0] == "#[cfg(test)]" && w[1].starts_with("mod ") && w[1].ends_with(" {"));
    let Some(start) = start else {
        return lines.len();
    };
    let mut depth = 0i64;
    for (i, l) in lines.iter().enumerate().skip(start + 1) {
        depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
        if depth == 0 {
            return if Some(i) == last { start } else { lines.len() };
        }
    }
    lines.len()
}

/// The files of `files` (path, counted lines) that break the rule, as messages.
pub fn oversized<'a>(files: impl IntoIterator<Item = (&'a Path, usize)>) -> Vec<String> {
    files
        .into_iter()
        .filter(|(p, n)| !is_test_code(p) && *n > MAX_FILE_LINES)
        .map(|(p, n)| {
            format!(
                "{}: {n} lines (its unit-test module aside), over {MAX_FILE_LINES}: split it by concern",
                p.display()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_code_is_left_out_and_the_rest_is_counted() {
        for t in [
            "libupgrade/tests/integration/stage.rs",
            "libupgrade/src/trust/client/tests.rs",
            "k3os-ops/src/agent/reconcile/decide/window_tests.rs",
            "libupgrade/benches/delta.rs",
            "fuzz/fuzz_targets/patch.rs",
            "testkit/src/lib.rs",
            "collector/src/store/tests/pg_server.rs",
        ] {
            assert!(is_test_code(Path::new(t)), "{t}");
        }
        for c in [
            "libupgrade/src/stage/mod.rs",
            "vm-tests/src/scenario/steps.rs",
        ] {
            assert!(!is_test_code(Path::new(c)), "{c}");
        }
        let big = Path::new("libupgrade/src/big.rs");
        let ok = Path::new("libupgrade/src/ok.rs");
        let t = Path::new("libupgrade/src/tests.rs");
        let out = oversized([(big, 601), (ok, 600), (t, 5000)]);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(
            out[0].starts_with("libupgrade/src/big.rs: 601 lines"),
            "{out:?}"
        );
    }

    #[test]
    fn a_trailing_test_module_is_not_counted() {
        let code = "fn a() {}\nfn b() {}\n";
        assert_eq!(counted_lines(code), 2);
        let with_tests =
            format!("{code}#[cfg(test)]\nmod tests {{\n    #[test]\n    fn t() {{}}\n}}\n");
        assert_eq!(counted_lines(&with_tests), 2);
        // A test module that is not last counts: what follows it is code.
        let middle = format!("#[cfg(test)]\nmod tests {{\n}}\n{code}fn c() {{\n}}\n");
        assert_eq!(counted_lines(&middle), 7);
    }
}
