//! A GitHub releases API page and its `Link` header, as `channel::resolve` and `list` read
//! them for `github-releases://` channels (the page parser, the pagination link and the
//! per-architecture asset map, through `channel::fuzzing::github_page`).
//!
//! Input: `page JSON SEP Link header`. Asserts: the next link is a `<…>` target of the header;
//! every file of a release's map is one of its assets (plain name, or arch prefix stripped)
//! with that asset's URL, arch-prefixed assets win, and the manifest URL is the map's
//! `manifest.json`.
#![no_main]

use k3os_fuzz::split_files;
use libfuzzer_sys::fuzz_target;
use libupgrade::channel::fuzzing::github_page;
use libupgrade::manifest::Arch;

fuzz_target!(|data: &[u8]| {
    let parts = split_files(data, 2);
    let link = String::from_utf8_lossy(parts[1].unwrap_or_default());
    let Ok((releases, next)) = github_page(parts[0].unwrap_or_default(), &link) else {
        return;
    };
    if let Some(n) = &next {
        assert!(
            link.contains(&format!("<{n}>")),
            "next link {n:?} not in {link:?}"
        );
    }
    for r in &releases {
        for (arch, files, manifest) in &r.files {
            let (mine, other): (&[&str], &[&str]) = match arch {
                Arch::X86_64 => (&["x86_64-", "amd64-"], &["aarch64-", "arm64-"]),
                Arch::Aarch64 => (&["aarch64-", "arm64-"], &["x86_64-", "amd64-"]),
            };
            for (name, url) in files {
                let prefixed: Vec<&(String, String)> = r
                    .assets
                    .iter()
                    .filter(|(n, _)| mine.iter().any(|p| n.strip_prefix(p) == Some(name)))
                    .collect();
                if prefixed.is_empty() {
                    assert!(
                        r.assets.iter().any(|(n, u)| n == name
                            && u == url
                            && !mine.iter().chain(other).any(|p| n.starts_with(p))),
                        "{name} -> {url} is no plain asset of {}",
                        r.tag_name
                    );
                } else {
                    assert!(
                        prefixed.iter().any(|(_, u)| u == url),
                        "{name}: the {arch} asset must win"
                    );
                }
            }
            assert_eq!(manifest.as_ref(), files.get("manifest.json"));
        }
    }
});
