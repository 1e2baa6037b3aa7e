//! What a release version may be: a plain name. A version is shown to operators, written in
//! the node's state and annotations, looked up in bundle directories and channel listings, and
//! used as a directory name by publishers (`site/stable/v3/`), so it must never read as a path,
//! carry control characters or be unbounded.
//!
//! The rule (one validator for `release create`, the manifest a node reads, the versions a
//! channel lists and the version an operator or an UpdateChannel asks for):
//! - 1 to [`MAX_VERSION_LEN`] bytes;
//! - the first character an ASCII letter or digit, the others ASCII letters, digits or one of
//!   `.` `_` `+` `~` `-` (semver's `1.2.3-rc.1+build.5` and Debian's `1.0~rc1` fit);
//! - no `..` anywhere (never a parent directory, in any reading).
//!
//! Every version this project's releases, images and tests used before the rule (`v1`,
//! `v2-panic`, `v0.1.0`, `v1.1-arm`, …) is a plain name; `v 1`, `../x`, `v2/x` are not.

/// The longest version accepted, in bytes (a v0.1.0 manifest allowed as much).
pub const MAX_VERSION_LEN: usize = 128;

/// A version that is not a plain name; the message names the value, escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("version \"{}\" is not a plain name: {why} (a version is 1-{MAX_VERSION_LEN} bytes: an ASCII letter or digit, then letters, digits, '.', '_', '+', '~' or '-', without \"..\")", value_shown(.value))]
pub struct VersionError {
    /// The value refused (untrusted: escaped and cut when printed).
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The value as printed: escaped, and cut after 160 characters (a refused value may be long).
fn value_shown(v: &str) -> String {
    let cut: String = v.chars().take(160).collect();
    let more = if cut.len() < v.len() { "…" } else { "" };
    format!("{}{more}", cut.escape_debug())
}

/// `Ok(())` when `v` is a plain name (see the module docs).
pub fn check_version(v: &str) -> Result<(), VersionError> {
    let why = if v.is_empty() {
        Some("it is empty")
    } else if v.len() > MAX_VERSION_LEN {
        Some("it is longer than 128 bytes")
    } else if !v.as_bytes()[0].is_ascii_alphanumeric() {
        Some("it must start with an ASCII letter or digit")
    } else if v.contains("..") {
        Some("it contains \"..\"")
    } else if v.chars().any(char::is_control) {
        Some("it contains a control character")
    } else if v.contains('/') || v.contains('\\') {
        Some("it contains a path separator")
    } else if !v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._+~-".contains(&b))
    {
        Some("it contains a character other than ASCII letters, digits and . _ + ~ -")
    } else {
        None
    };
    match why {
        Some(why) => Err(VersionError {
            value: v.to_string(),
            why,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versions_in_use_are_plain_names() {
        for v in [
            "v1",
            "v2",
            "v2-panic",
            "v0.1.0",
            "v1.1-arm",
            "latest",
            "1.2.3-rc.1+build.5",
            "1.0~rc1",
            "V_2",
            &"a".repeat(128),
        ] {
            assert_eq!(check_version(v), Ok(()), "{v}");
        }
    }

    #[test]
    fn paths_controls_and_long_values_are_refused_naming_the_value_escaped() {
        for (v, why) in [
            ("", "empty"),
            ("../../../../x", "start with"),
            ("v1/../x", "\"..\""),
            ("v1..2", "\"..\""),
            ("v2/x", "path separator"),
            ("v2\\x", "path separator"),
            ("v1\n", "control"),
            ("v\u{1b}[31m", "control"),
            ("v 1", "other than"),
            ("v1é", "other than"),
            (".v1", "start with"),
            ("-v1", "start with"),
        ] {
            let e = check_version(v).unwrap_err();
            assert!(e.why.contains(why), "{v:?}: {e}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("\"{}\"", v.escape_debug())), "{msg}");
            assert!(!msg.contains('\n') && !msg.contains('\u{1b}'), "{msg:?}");
        }
        let long = "a".repeat(200);
        let e = check_version(&long).unwrap_err();
        assert!(e.why.contains("longer than 128"));
        assert!(
            e.to_string().contains('…'),
            "a long value is cut when shown"
        );
    }
}
