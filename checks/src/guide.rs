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

/// The relative link targets of a Markdown text with their 1-based lines: every `](target)`
/// that is not a URL (`scheme:`) or a bare `#anchor`, without its `#anchor` part.
pub fn relative_links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split('#').next().unwrap_or("");
            let url = target.contains(':');
            if !target.is_empty() && !url && !target.contains(' ') {
                out.push((i + 1, target.to_string()));
            }
            rest = &rest[end..];
        }
    }
    out
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
    fn relative_links_skip_urls_and_anchors() {
        let text = "[a](docs/x.md#y) and [b](https://e.org/z) [c](#here)\n\n[d](../e.md)";
        assert_eq!(
            relative_links(text),
            vec![(1, "docs/x.md".to_string()), (3, "../e.md".to_string())]
        );
    }

    #[test]
    fn a_block_must_check_something() {
        assert!(asserts("k3os-ops slot status | grep -q v1\n"));
        assert!(asserts("test -f x\n"));
        assert!(!asserts("k3os-ops release keygen -o keys\n"));
        assert!(!asserts("echo done   # test -f x\n"));
    }
}
