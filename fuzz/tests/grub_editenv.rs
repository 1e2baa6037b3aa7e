//! Replays every GRUB env block the fuzzers have (the `grubenv` seeds and corpus, and the env,
//! lock and last-good files of the `grub_boot` ones) against the real `grub-editenv FILE list`
//! (Debian's grub-common, installed by scripts/setup.sh): the model of GRUB's reader that the
//! fuzz targets and the node use (`bootconfig::grub_load`) must print exactly what
//! GRUB prints and refuse exactly what GRUB refuses, and every block the strict reader accepts
//! must be one GRUB accepts. Fails, naming the tool, when `grub-editenv` is not installed.

use std::process::Command;

use bootconfig::GrubEnv;
use k3os_fuzz::{corpus_dirs, editenv_list, split_files};

/// At most this many blocks per run (a long fuzzing run can grow the corpus a lot).
const MAX_BLOCKS: usize = 20_000;

fn blocks() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (target, files) in [("grubenv", 0usize), ("grub_boot", 5)] {
        for dir in corpus_dirs(target) {
            let mut entries: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            for p in entries {
                let data = std::fs::read(&p).unwrap();
                let name = p.display().to_string();
                if files == 0 {
                    out.push((name, data));
                } else if data.len() > 2 {
                    for (i, f) in split_files(&data[2..], files + 1).into_iter().enumerate() {
                        if let (true, Some(f)) = (i < files, f) {
                            out.push((format!("{name} (file {i})"), f.to_vec()));
                        }
                    }
                }
            }
        }
    }
    out.truncate(MAX_BLOCKS);
    out
}

#[test]
fn grub_editenv_lists_what_the_model_reads() {
    let tool = Command::new("grub-editenv").arg("--version").output();
    assert!(
        tool.is_ok_and(|o| o.status.success()),
        "grub-editenv is not installed (Debian package grub-common; scripts/setup.sh installs it)"
    );
    let blocks = blocks();
    assert!(
        blocks.len() >= 10,
        "only {} blocks: seeds missing?",
        blocks.len()
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grubenv");
    let mut mismatches = Vec::new();
    for (name, data) in &blocks {
        std::fs::write(&file, data).unwrap();
        let out = Command::new("grub-editenv")
            .arg(&file)
            .arg("list")
            .output()
            .unwrap();
        let model = editenv_list(data);
        let real = out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned());
        if model != real {
            mismatches.push(format!("{name}: model {model:?}, grub-editenv {real:?}"));
        }
        if GrubEnv::parse(data).is_ok() && real.is_none() {
            mismatches.push(format!(
                "{name}: the strict reader accepts what GRUB refuses"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} blocks differ:\n{}",
        mismatches.len(),
        blocks.len(),
        mismatches.join("\n")
    );
}
