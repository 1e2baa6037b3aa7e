//! `vm-tests`: run one scenario (or all) on one target and print each scenario's wall time.
//!
//! ```text
//! cargo run -p vm-tests -- run upgrade x86_64-grub-bios
//! cargo run -p vm-tests -- run powercut x86_64-grub-bios --all-barriers
//! cargo run -p vm-tests -- run all aarch64-grub-efi
//! cargo run -p vm-tests -- list
//! ```

use clap::{Parser, Subcommand};
use vm_tests::{Options, ScenarioKind, Target};

#[derive(Parser)]
#[command(
    name = "vm-tests",
    about = "Boot the A/B test disks under QEMU and prove upgrade, fallback and power-cut safety"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a scenario (upgrade, fallback-panic, fallback-noconfirm, badhealth, powercut,
    /// missing-kernel, awaited-check, upgrade-from-previous, bundle-offline, reachability,
    /// report-spool, `list` shows all; `all`) on a
    /// target (x86_64-grub-bios, x86_64-grub-efi, x86_64-extlinux, aarch64-grub-efi, all).
    Run {
        scenario: String,
        target: String,
        /// Power cuts at every barrier instead of a sample (the first, the last, the payload
        /// store's and every sixth from an offset rotating with the commit or
        /// VM_TESTS_BARRIER_SEED).
        #[arg(long)]
        all_barriers: bool,
        /// Keep the scratch disk images (vm-tests/out/<target>/<scenario>/).
        #[arg(long)]
        keep: bool,
    },
    /// List scenarios and targets.
    List,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::List => {
            println!(
                "scenarios: {}",
                ScenarioKind::ALL.map(|k| k.name()).join(" ")
            );
            println!("targets:   {}", Target::ALL.map(|t| t.name()).join(" "));
        }
        Cmd::Run {
            scenario,
            target,
            all_barriers,
            keep,
        } => {
            let kinds: Vec<ScenarioKind> = if scenario == "all" {
                ScenarioKind::ALL.to_vec()
            } else {
                vec![scenario.parse()?]
            };
            let targets: Vec<Target> = if target == "all" {
                Target::ALL.to_vec()
            } else {
                vec![target.parse()?]
            };
            let opts = Options {
                all_barriers,
                keep,
                barrier_seed: vm_tests::scenario::barrier_seed(),
            };
            let mut failed = Vec::new();
            let mut lines = Vec::new();
            for t in &targets {
                for k in kinds.iter().filter(|k| k.runs_on(*t)) {
                    let t0 = std::time::Instant::now();
                    match vm_tests::run(*k, *t, opts.clone()) {
                        Ok(r) => lines.push(format!(
                            "PASS {:<20} {:<18} {:>7.1}s  {} boots",
                            k.name(),
                            t.name(),
                            r.wall.as_secs_f64(),
                            r.boots
                        )),
                        Err(e) => {
                            eprintln!("vm-tests: FAIL {k} on {t}: {e}");
                            lines.push(format!(
                                "FAIL {:<20} {:<18} {:>7.1}s  {e}",
                                k.name(),
                                t.name(),
                                t0.elapsed().as_secs_f64()
                            ));
                            failed.push(format!("{k} on {t}"));
                        }
                    }
                }
            }
            println!("--- vm-tests summary");
            for l in &lines {
                println!("{l}");
            }
            if !failed.is_empty() {
                eprintln!(
                    "vm-tests: {} scenario(s) failed: {}",
                    failed.len(),
                    failed.join(", ")
                );
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
