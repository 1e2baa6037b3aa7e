//! Redaction of a failure bundle's text on the node, before it is sealed: what leaves the site
//! carries no credentials and no addresses. The default rules ([`DEFAULT_RULES`]) cover private
//! keys (PEM blocks), bearer and JSON web tokens, k3s join tokens, `name=value` secrets
//! (token, password, secret, api key) and IPv4/IPv6 addresses; the node config adds its own
//! patterns (`failure_bundle.redact`), each match replaced whole. A bundle says how many redactions
//! were made, never what they were.
//!
//! `regex` (not hand-written matching): the node's own patterns are regular expressions, and
//! its matching is linear in the text, so a hostile log line cannot make redaction slow.

use regex::Regex;

/// One default rule: its name (said in errors and docs), the pattern, and the replacement
/// (`$1` keeps a captured label such as `password=`).
pub struct Rule {
    /// What it redacts.
    pub name: &'static str,
    /// The regular expression.
    pub pattern: &'static str,
    /// What a match becomes.
    pub replacement: &'static str,
}

/// The rules every node applies, in this order (keys before tokens before addresses, so a
/// key's base64 is not half-taken by a later rule).
pub const DEFAULT_RULES: &[Rule] = &[
    Rule {
        name: "private key",
        pattern: r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
        replacement: "[REDACTED private key]",
    },
    Rule {
        name: "bearer token",
        pattern: r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}",
        replacement: "${1}[REDACTED]",
    },
    Rule {
        name: "JSON web token",
        pattern: r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
        replacement: "[REDACTED token]",
    },
    Rule {
        name: "k3s token",
        pattern: r"\bK10[0-9a-f]{16,}::[A-Za-z0-9_.:-]+",
        replacement: "[REDACTED token]",
    },
    Rule {
        name: "secret setting",
        pattern: r#"(?i)(\b(?:token|password|passwd|secret|api[_-]?key|client[_-]?key)["']?\s*[=:]\s*["']?)[^\s"',;\[][^\s"',;]*"#,
        replacement: "${1}[REDACTED]",
    },
    Rule {
        name: "IPv4 address",
        pattern: r"\b(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}\b",
        replacement: "[REDACTED address]",
    },
    Rule {
        name: "IPv6 or MAC address",
        // Six or more groups (full IPv6, MAC addresses), or a `::` with a group on either side
        // (`fe80::1`, `::1`); clock times (`04:33:31`) and Rust paths (`serde::de`) stay.
        pattern: r"(?i)\b[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){5,7}\b|\b[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,6}::(?:[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,6})?(?:%[0-9a-z]+)?|\B::[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,6}\b",
        replacement: "[REDACTED address]",
    },
];

/// A pattern of the node config that is not a regular expression.
#[derive(Debug, thiserror::Error)]
#[error(
    "failure_bundle.redact pattern {index} ({pattern:?}) is not a regular expression: {reason}"
)]
pub struct RedactError {
    /// Its position in `failure_bundle.redact` (from 0).
    pub index: usize,
    /// The pattern as written (escaped when printed).
    pub pattern: String,
    /// The regex crate's reason.
    pub reason: String,
}

/// The rules of one node: the defaults, then the node's own.
pub struct Redactor {
    rules: Vec<(Regex, String)>,
}

impl Redactor {
    /// The default rules and `extra` (the node config's `failure_bundle.redact`), each match of an
    /// extra pattern replaced by `[REDACTED]`.
    pub fn new(extra: &[String]) -> Result<Redactor, RedactError> {
        let mut rules: Vec<(Regex, String)> = DEFAULT_RULES
            .iter()
            .map(|r| {
                let re = Regex::new(r.pattern)
                    .unwrap_or_else(|e| panic!("default rule {}: {e}", r.name));
                (re, r.replacement.to_string())
            })
            .collect();
        for (index, p) in extra.iter().enumerate() {
            let re = Regex::new(p).map_err(|e| RedactError {
                index,
                pattern: p.clone(),
                reason: e.to_string(),
            })?;
            rules.push((re, "[REDACTED]".into()));
        }
        Ok(Redactor { rules })
    }

    /// `text` with every rule applied in order, and how many matches were replaced.
    pub fn redact(&self, text: &str) -> (String, u64) {
        let mut out = text.to_string();
        let mut n = 0u64;
        for (re, with) in &self.rules {
            let found = re.find_iter(&out).count() as u64;
            if found > 0 {
                n += found;
                out = re.replace_all(&out, with.as_str()).into_owned();
            }
        }
        (out, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(text: &str) -> (String, u64) {
        Redactor::new(&[]).unwrap().redact(text)
    }

    #[test]
    fn credentials_and_addresses_are_redacted_and_counted() {
        let log = "\
I1207 kubelet: connecting to https://10.0.2.2:6443 from fe80::5054:ff:fe12:3456%eth0\n\
Authorization: Bearer abcdefgh.ijklmnop-qrst\n\
token=K10c0ffee0123456789abcdef::server:5ecr3t\n\
password: \"hunter2\"\n\
jwt eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJub2RlIn0.c2lnbmF0dXJl end\n\
-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIGh\nAAAA\n-----END EC PRIVATE KEY-----\n\
version 1.36.2 and 6.1.0-57-amd64 stay at 04:33:31 in serde::de, not ::1 or 52:54:00:12:34:56\n";
        let (out, n) = redact(log);
        for gone in [
            "10.0.2.2",
            "fe80::5054",
            "abcdefgh.ijklmnop",
            "c0ffee",
            "5ecr3t",
            "hunter2",
            "eyJhbGci",
            "MHcCAQEEIGh",
        ] {
            assert!(!out.contains(gone), "{gone} left in:\n{out}");
        }
        assert!(
            out.contains("1.36.2 and 6.1.0-57-amd64 stay at 04:33:31 in serde::de, not [REDACTED address] or [REDACTED address]"),
            "{out}"
        );
        assert!(out.contains("Authorization: Bearer [REDACTED]"), "{out}");
        assert!(out.contains("password: \"[REDACTED]"), "{out}");
        assert!(out.contains("[REDACTED private key]"), "{out}");
        assert!(
            out.contains("token=[REDACTED token]\n"),
            "a rule does not redact another's mark: {out}"
        );
        assert_eq!(n, 9, "{out}");
    }

    #[test]
    fn a_truncated_key_block_is_still_redacted_to_the_end() {
        let (out, n) = redact("tail\n-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq");
        assert_eq!(out, "tail\n[REDACTED private key]");
        assert_eq!(n, 1);
    }

    #[test]
    fn the_nodes_own_patterns_apply_and_a_bad_one_is_named() {
        let r = Redactor::new(&["site-[0-9]+".into()]).unwrap();
        let (out, n) = r.redact("node of site-0042 failed");
        assert_eq!(out, "node of [REDACTED] failed");
        assert_eq!(n, 1);
        let e = Redactor::new(&["ok".into(), "(unclosed".into()])
            .err()
            .unwrap();
        assert_eq!(e.index, 1);
        assert!(
            e.to_string()
                .starts_with("failure_bundle.redact pattern 1 (\"(unclosed\")"),
            "{e}"
        );
    }
}
