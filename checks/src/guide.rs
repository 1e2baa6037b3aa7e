//! The guide's runnable blocks: every fenced block of `docs/guide/*.md` opened with
//! ```` ```sh test ```` is a shell script that CI runs against the built `k3os-ops`
//! (`tests/guide.rs`), so the guide cannot drift from the binary.
//!
//! A page's marked blocks run in order, each with `bash -euo pipefail`, in one fresh directory
//! per page. A block must check what it claims ([`asserts`]): a block that only runs commands
//! would pass as long as they exit 0, which says little about what the page tells the reader.

/// The info string that marks a runnable block (the text after the opening fence).
pub const MARKER: &str = "sh test";

/// One marked block of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The 1-based line of the block's opening fence in its page.
    pub line: usize,
    /// The block's text, without the fences.
    pub script: String,
}

/// A page whose blocks cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuideError {
    /// A marked block opened at `line` is never closed.
    #[error("the ```{MARKER} block opened at line {line} has no closing ``` fence")]
    Unterminated {
        /// The line of its opening fence.
        line: usize,
    },
}

/// Every marked block of a page's Markdown text, in order. Other fenced blocks (any other info
/// string, or none) are skipped whole, so a marker inside them is not a block.
pub fn marked_blocks(text: &str) -> Result<Vec<Block>, GuideError> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, bool, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match &mut open {
            None if fence => {
                let info = line.trim_start().trim_start_matches('`').trim();
                open = Some((i + 1, info == MARKER, String::new()));
            }
            None => {}
            Some((start, marked, body)) => {
                if fence && line.trim() == "```" {
                    if *marked {
                        blocks.push(Block {
                            line: *start,
                            script: std::mem::take(body),
                        });
                    }
                    open = None;
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    match open {
        Some((line, true, _)) => Err(GuideError::Unterminated { line }),
        _ => Ok(blocks),
    }
}

/// Words that check something: a block must hold at least one (`grep -q`, `test`, `[ … ]`,
/// `cmp`, `diff`). Commands that fail already fail the block under `bash -e`; these are for
/// what the page claims about their output or effects.
const CHECKS: &[&str] = &["grep -q", "test ", "[ ", "cmp ", "diff "];

/// Whether a block checks something: holds `grep -q`, `test`, `[ … ]`, `cmp` or `diff` outside
/// a comment.
pub fn asserts(script: &str) -> bool {
    script
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .any(|l| CHECKS.iter().any(|c| l.contains(c)))
}

/// One relative link of a Markdown text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The 1-based line it is on.
    pub line: usize,
    /// The file it names, relative to the page; empty for a link into the page itself.
    pub path: String,
    /// The `#anchor` part, if any.
    pub anchor: Option<String>,
}

/// The relative links of a Markdown text: every `](target)` that is not a URL (`scheme:`).
pub fn relative_links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if !target.is_empty() && !target.contains(':') && !target.contains(' ') {
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a.to_string())),
                    None => (target, None),
                };
                out.push(Link {
                    line: i + 1,
                    path: path.to_string(),
                    anchor,
                });
            }
            rest = &rest[end..];
        }
    }
    out
}

/// The anchors GitHub makes of a Markdown text's headings: lower case, characters other than
/// letters, digits, `-`, `_` and spaces dropped, spaces as `-`. Lines that look like headings
/// inside code blocks count too (a link to one is still caught when nothing matches).
pub fn heading_anchors(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let t = l.trim_start_matches('#');
            (t.len() < l.len() && t.starts_with(' ')).then_some(t.trim())
        })
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_marked_blocks_with_their_lines_and_skips_others() {
        let page = "# T\n\n```sh\nnot run\n```\n\n```sh test\necho a\ntest -n a\n```\n\
                    ```toml\n```sh test\n```\n\n  ```sh test\nb\n  ```\n";
        let b = marked_blocks(page).unwrap();
        assert_eq!(
            b,
            vec![
                Block {
                    line: 7,
                    script: "echo a\ntest -n a\n".into()
                },
                Block {
                    line: 15,
                    script: "b\n".into()
                },
            ]
        );
    }

    #[test]
    fn an_unclosed_marked_block_is_an_error_naming_its_line() {
        let e = marked_blocks("x\n```sh test\necho\n").unwrap_err();
        assert_eq!(e, GuideError::Unterminated { line: 2 });
        assert!(e.to_string().contains("line 2"), "{e}");
        // An unclosed block of another kind is the page's own business.
        assert_eq!(marked_blocks("```sh\necho\n").unwrap(), vec![]);
    }

    #[test]
    fn relative_links_skip_urls_and_keep_anchors() {
        let text = "[a](docs/x.md#y) and [b](https://e.org/z) [c](#here)\n\n[d](../e.md)";
        let link = |line, path: &str, anchor: Option<&str>| Link {
            line,
            path: path.into(),
            anchor: anchor.map(String::from),
        };
        assert_eq!(
            relative_links(text),
            vec![
                link(1, "docs/x.md", Some("y")),
                link(1, "", Some("here")),
                link(3, "../e.md", None)
            ]
        );
    }

    #[test]
    fn heading_anchors_are_githubs() {
        let a = heading_anchors(
            "# Top\n## Node: the state partition (`state_dir`)\n#no\n### 1. What it is\n",
        );
        let want = ["top", "node-the-state-partition-state_dir", "1-what-it-is"];
        assert_eq!(a, want.iter().map(|s| s.to_string()).collect());
    }

    #[test]
    fn a_block_must_check_something() {
        assert!(asserts("k3os-ops slot status | grep -q v1\n"));
        assert!(asserts("test -f x\n"));
        assert!(!asserts("k3os-ops release keygen -o keys\n"));
        assert!(!asserts("echo done   # test -f x\n"));
    }
}
