//! A slot's dm-verity root hash on its `APPEND` line (`k3os.verity=<hex>`, issue 34): edited
//! in the installed `extlinux.conf` text, which is replaced atomically, and carried over when a
//! release's conf is installed. Pure text functions; the backend does the writes.

use super::conf::slot_of_label;
use crate::Slot;

/// The kernel parameter, as the initramfs and the confirm step read it.
const PARAM: &str = "k3os.verity=";

/// The first word of `line` (upper-cased) and the rest.
fn keyword(line: &str) -> Option<(String, &str)> {
    let t = line.trim_start();
    let k = t.split_whitespace().next()?;
    Some((k.to_ascii_uppercase(), t[k.len()..].trim()))
}

/// `text` with `slot`'s `APPEND` line(s) naming `root_hash` (`None`: no `k3os.verity=`).
/// Other lines are kept byte for byte.
pub(super) fn with_verity(text: &str, slot: Slot, root_hash: Option<&str>) -> String {
    let mut label = None;
    let mut out = String::with_capacity(text.len() + 80);
    for line in text.lines() {
        match keyword(line) {
            Some((k, rest)) if k == "LABEL" => label = slot_of_label(rest),
            Some((k, rest)) if k == "APPEND" && label == Some(slot) => {
                let indent = &line[..line.len() - line.trim_start().len()];
                let mut words: Vec<&str> = rest
                    .split_whitespace()
                    .filter(|w| !w.starts_with(PARAM))
                    .collect();
                let arg = root_hash.map(|h| format!("{PARAM}{h}"));
                words.extend(arg.as_deref());
                out.push_str(&format!("{indent}APPEND {}\n", words.join(" ")));
                continue;
            }
            _ => {}
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The root hash `slot`'s `APPEND` line passes (the last `k3os.verity=` wins, as on a
/// kernel command line).
pub(super) fn verity_of(text: &str, slot: Slot) -> Option<String> {
    let mut label = None;
    let mut found = None;
    for line in text.lines() {
        match keyword(line) {
            Some((k, rest)) if k == "LABEL" => label = slot_of_label(rest),
            Some((k, rest)) if k == "APPEND" && label == Some(slot) => {
                if let Some(h) = rest
                    .split_whitespace()
                    .filter_map(|w| w.strip_prefix(PARAM))
                    .next_back()
                {
                    found = Some(h.to_string());
                }
            }
            _ => {}
        }
    }
    found
}
