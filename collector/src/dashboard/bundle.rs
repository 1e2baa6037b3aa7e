//! A failed node's bundle on the dashboard: a `<details>` element (opens without a script)
//! with its sections readable and every text escaped, and the links that download it, sealed
//! as received or as JSON ([`path`], served by `server::dashboard_router`).

use std::fmt::Write;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use fleet_report::Bundle;

use super::esc;

/// The dashboard path of a bundle's download: `/bundles/<node>/<version>/<attempt>` (the
/// sealed bytes); with `/json` appended, the bundle as JSON. The version is percent-encoded.
pub fn path(node: &str, version: &str, attempt: u32) -> String {
    format!("/bundles/{}/{}/{attempt}", pct(node), pct(version))
}

/// Every byte but the unreserved ones (RFC 3986: letters, digits, `-._~`) as `%XX`.
fn pct(s: &str) -> String {
    const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// The JSON serialization of a failure kind (`health_check`, …).
pub fn failure_name(b: &Bundle) -> String {
    serde_json::to_value(b.failure)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The download links of a bundle.
fn downloads(b: &Bundle) -> String {
    let h = esc(&path(&b.node.to_string(), &b.version, b.attempt));
    format!(
        "<p class=\"download\">download: <a href=\"{h}\" download>sealed</a> (as the node signed it) · <a href=\"{h}/json\" download>JSON</a></p>"
    )
}

/// The cell of a failed node's bundle past the page's inline limit: what it is and its
/// downloads only.
pub fn brief(b: &Bundle) -> String {
    format!(
        "<div class=\"bundle\" data-attempt=\"{a}\">attempt {a}, {f}{}</div>",
        downloads(b),
        a = b.attempt,
        f = esc(&failure_name(b)),
    )
}

/// The cell of a failed node's bundle: what it says, readable, and its downloads.
pub fn cell(b: &Bundle) -> String {
    let mut t = format!(
        "<details class=\"bundle\" data-attempt=\"{a}\"><summary>attempt {a}, {f}, {n} section(s)</summary>{d}\
         <p class=\"meta\">slot {slot}, written <time>{time}</time> (the node's clock), {r} redaction(s); versions: {v}</p>",
        a = b.attempt,
        f = esc(&failure_name(b)),
        n = b.sections.len(),
        d = downloads(b),
        slot = esc(&b.slot),
        time = esc(&b.time),
        r = b.redacted,
        v = esc(&b.versions.lines().collect::<Vec<_>>().join(", ")),
    );
    for s in &b.sections {
        let cut = match s.cut_bytes {
            0 => String::new(),
            n => format!(" <span class=\"cut\">({n} bytes cut from its head)</span>"),
        };
        let _ = write!(
            t,
            "<div class=\"section\"><h4>{}{cut}</h4><pre>{}</pre></div>",
            esc(&s.name),
            esc(&s.text)
        );
    }
    t.push_str("</details>");
    t
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hostile_bundle_is_escaped_and_its_links_encoded() {
        let mut b = crate::testutil::bundle(1, 2, "kubelet: failed");
        b.version = "v2/<x>?".into();
        b.sections[0].text = "</pre><script>alert(1)</script>\u{1b}[31m".into();
        b.sections[1].cut_bytes = 7;
        let c = super::cell(&b);
        assert!(!c.contains("<script>"), "{c}");
        assert!(
            c.contains("&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{c}"
        );
        assert!(
            c.contains("/v2%2F%3Cx%3E%3F/2/json\" download>JSON</a>"),
            "{c}"
        );
        assert!(c.contains("(7 bytes cut from its head)"), "{c}");
        assert!(c.contains("attempt 2, health_check, 2 section(s)"), "{c}");
        let brief = super::brief(&b);
        assert!(!brief.contains("script"), "{brief}");
        assert!(
            brief.contains("/v2%2F%3Cx%3E%3F/2\" download>sealed</a>"),
            "{brief}"
        );
    }
}
