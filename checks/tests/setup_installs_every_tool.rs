//! Every external command that a test, recipe or script of this repository runs is installed
//! by `scripts/setup.sh` (or is part of every Debian system). Fails naming each one that is
//! not, with the file and line where it is used and the package to add.
//!
//! A command that is not installed on this machine at all cannot be resolved to a package;
//! the test that runs it fails on its own. This check catches the case CI cannot: a package
//! installed by hand on the developer's machine that a fresh machine will not have.

use std::path::Path;

use checks::tools::{checked_on_host, scan, setup_packages, verdict, Machine, Verdict};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn problems(setup_text: &str) -> Vec<String> {
    problems_on(setup_text, &Machine::new())
}

fn problems_on(setup_text: &str, machine: &Machine) -> Vec<String> {
    let setup = setup_packages(setup_text);
    assert!(
        setup.len() > 10,
        "found only {setup:?} in scripts/setup.sh's PKGS=\"…\""
    );
    let uses = scan(repo()).expect("scan the repository");
    let found: Vec<(&String, &checks::tools::Use, std::path::PathBuf)> = uses
        .iter()
        .filter(|(word, _)| checked_on_host(word))
        .filter_map(|(word, u)| machine.which(word).map(|exe| (word, u, exe)))
        .collect();
    let exes: Vec<_> = found.iter().map(|(_, _, e)| e.clone()).collect();
    let origins = machine.origins(&exes);
    let mut out = Vec::new();
    for (word, u, exe) in &found {
        match verdict(word, &origins[exe], &setup, setup_text) {
            Verdict::Ok => {}
            Verdict::MissingPackage(p) => out.push(format!(
                "{word} ({}:{}) comes from Debian package {p}, which scripts/setup.sh does not install: add {p} to PKGS",
                u.file.display(),
                u.line
            )),
            Verdict::NotInstalled(path) => out.push(format!(
                "{word} ({}:{}) is {} (no Debian package owns it) and scripts/setup.sh never installs it",
                u.file.display(),
                u.line,
                path.display()
            )),
        }
    }
    out
}

#[test]
fn setup_sh_installs_every_tool_the_repository_runs() {
    let text = std::fs::read_to_string(repo().join("scripts/setup.sh")).unwrap();
    let p = problems(&text);
    assert!(p.is_empty(), "\n{}\n", p.join("\n"));
}

/// The check has teeth: without grub-emu and mksquashfs's package in setup.sh it names them
/// (both are installed here, by setup.sh, before the tests run).
#[test]
fn the_check_names_a_package_setup_sh_forgot() {
    let text = std::fs::read_to_string(repo().join("scripts/setup.sh")).unwrap();
    let forgot = text
        .replace(" grub-emu", " ")
        .replace(" squashfs-tools ", " ");
    let p = problems(&forgot).join("\n");
    assert!(
        p.contains("grub-emu (") && p.contains("package grub-emu"),
        "grub-emu not reported:\n{p}"
    );
    assert!(
        p.contains("mksquashfs (") && p.contains("package squashfs-tools,"),
        "mksquashfs not reported:\n{p}"
    );
}

/// The verdict does not depend on what was installed by hand. `etcd` and
/// `kube-apiserver` (agent_cluster.rs runs them from $KUBEBUILDER_ASSETS) installed on this
/// machine — as the etcd-server package would — are not reported, and neither are they when
/// absent.
#[test]
fn envtest_binaries_installed_by_hand_do_not_change_the_verdict() {
    let text = std::fs::read_to_string(repo().join("scripts/setup.sh")).unwrap();
    let dir = std::env::temp_dir().join(format!("checks-by-hand-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for exe in ["etcd", "kube-apiserver"] {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(exe);
        std::fs::write(&p, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let machine = Machine::with_path_first(std::slice::from_ref(&dir));
    assert!(machine.which("etcd").is_some_and(|p| p.starts_with(&dir)));
    let with = problems_on(&text, &machine);
    let without = problems(&text);
    std::fs::remove_dir_all(&dir).unwrap();
    for p in [&with, &without] {
        assert!(
            !p.iter()
                .any(|l| l.starts_with("etcd ") || l.starts_with("kube-apiserver ")),
            "{p:#?}"
        );
    }
    assert_eq!(with, without, "the verdict depends on what is installed");
}
