//! `payload::archive_images`: the node's reading of an image archive a release names (every
//! boot's built-in `images` check reads the archives linked into k3s's airgap directory, and a
//! damaged state partition can hold anything).
//!
//! The input is the archive's bytes, written to a file in `/dev/shm` (the reader takes a path:
//! it seeks over layers instead of reading them).
//!
//! Asserts: an accepted archive names at least one image, sorted without repeats, each name
//! non-empty, without control characters and shorter than the input (a name is read from the
//! archive, never invented); a refusal's message names the file and carries no control
//! character (untrusted text is escaped before it is printed).
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use libupgrade::payload::archive_images;

fuzz_target!(|data: &[u8]| {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let mut f = tempfile::NamedTempFile::new_in(dir).expect("temp file");
    f.write_all(data).expect("write the input");
    let path = f.path().to_path_buf();
    match archive_images(&path) {
        Ok(names) => {
            assert!(!names.is_empty(), "an accepted archive names an image");
            assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats: {names:?}");
            for n in &names {
                assert!(!n.is_empty() && n.len() < data.len(), "{n:?}");
                assert!(!n.chars().any(char::is_control), "control character in {n:?}");
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(!msg.chars().any(char::is_control), "unescaped: {msg:?}");
        }
    }
});
