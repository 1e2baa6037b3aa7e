//! The scenarios under QEMU, one test per (scenario, target).
//!
//! Default set (`cargo test -p vm-tests`): x86_64 GRUB BIOS upgrade, fallback-panic and sampled
//! power cuts, and the aarch64 upgrade. The rest of the matrix is `#[ignore]`d and runs with
//! `just vm-test-all` (`--include-ignored`). `VM_TESTS_ALL_BARRIERS=1` cuts at every barrier.
//! A missing image or QEMU fails the test with the reason. The VMs run one at a time (two cores).

use std::sync::Mutex;

use vm_tests::{Options, ScenarioKind, Target};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn scenario(kind: ScenarioKind, target: Target) {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let opts = Options {
        all_barriers: std::env::var("VM_TESTS_ALL_BARRIERS").is_ok_and(|v| v == "1"),
        keep: false,
    };
    let t0 = std::time::Instant::now();
    let r = vm_tests::run(kind, target, opts);
    let wall = t0.elapsed().as_secs_f64();
    match r {
        Ok(r) => println!("{r}wall time: {kind} on {target}: {wall:.1}s"),
        Err(e) => panic!("{kind} on {target} failed after {wall:.1}s: {e}"),
    }
}

macro_rules! default_test {
    ($name:ident, $kind:ident, $target:ident) => {
        #[test]
        fn $name() {
            scenario(ScenarioKind::$kind, Target::$target);
        }
    };
}

macro_rules! matrix_test {
    ($name:ident, $kind:ident, $target:ident) => {
        #[test]
        #[ignore = "full matrix: just vm-test-all"]
        fn $name() {
            scenario(ScenarioKind::$kind, Target::$target);
        }
    };
}

default_test!(x86_64_grub_bios_upgrade, Upgrade, X86_64GrubBios);
default_test!(
    x86_64_grub_bios_fallback_panic,
    FallbackPanic,
    X86_64GrubBios
);
default_test!(x86_64_grub_bios_powercut, PowerCut, X86_64GrubBios);
default_test!(aarch64_grub_efi_upgrade, Upgrade, Aarch64GrubEfi);

matrix_test!(
    x86_64_grub_bios_fallback_noconfirm,
    FallbackNoConfirm,
    X86_64GrubBios
);
matrix_test!(x86_64_grub_bios_badhealth, BadHealth, X86_64GrubBios);

matrix_test!(x86_64_grub_efi_upgrade, Upgrade, X86_64GrubEfi);
matrix_test!(x86_64_grub_efi_fallback_panic, FallbackPanic, X86_64GrubEfi);
matrix_test!(
    x86_64_grub_efi_fallback_noconfirm,
    FallbackNoConfirm,
    X86_64GrubEfi
);
matrix_test!(x86_64_grub_efi_badhealth, BadHealth, X86_64GrubEfi);
matrix_test!(x86_64_grub_efi_powercut, PowerCut, X86_64GrubEfi);

matrix_test!(x86_64_extlinux_upgrade, Upgrade, X86_64Extlinux);
matrix_test!(
    x86_64_extlinux_fallback_panic,
    FallbackPanic,
    X86_64Extlinux
);
matrix_test!(
    x86_64_extlinux_fallback_noconfirm,
    FallbackNoConfirm,
    X86_64Extlinux
);
matrix_test!(x86_64_extlinux_badhealth, BadHealth, X86_64Extlinux);
matrix_test!(x86_64_extlinux_powercut, PowerCut, X86_64Extlinux);

matrix_test!(
    aarch64_grub_efi_fallback_panic,
    FallbackPanic,
    Aarch64GrubEfi
);
matrix_test!(
    aarch64_grub_efi_fallback_noconfirm,
    FallbackNoConfirm,
    Aarch64GrubEfi
);
matrix_test!(aarch64_grub_efi_badhealth, BadHealth, Aarch64GrubEfi);
matrix_test!(aarch64_grub_efi_powercut, PowerCut, Aarch64GrubEfi);

matrix_test!(
    x86_64_grub_bios_missing_kernel,
    MissingKernel,
    X86_64GrubBios
);
matrix_test!(x86_64_grub_efi_missing_kernel, MissingKernel, X86_64GrubEfi);
matrix_test!(
    x86_64_extlinux_missing_kernel,
    MissingKernel,
    X86_64Extlinux
);
matrix_test!(
    aarch64_grub_efi_missing_kernel,
    MissingKernel,
    Aarch64GrubEfi
);
