//! `grub.cfg`: the selection script (copy choice, range checks, choice, countdown) and the menu.

use super::verity::{verity_file, verity_var, UNREADABLE};
use super::version::{GrubScript, SCRIPT_MARKER};
use super::{
    check_expr, env_var_names, state_var, tries_var, GOOD_FILE, MAX_TRIES_MARKER, MENU_MARKER,
    VAR_CHECK, VAR_EDITING, VAR_GOOD, VAR_GOOD_AGAIN, VAR_PRIMARY,
};
use crate::{BootEntry, Slot};

/// Everything `grub.cfg` needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrubConfig {
    /// `[A, B]`.
    pub entries: [BootEntry; 2],
    /// Highest tries count the script accepts and counts down from (at least 1).
    pub max_tries: u8,
    /// Seconds the menu waits before booting the chosen slot.
    pub timeout_secs: u32,
    /// Also use the first serial port (115200 8N1) for the menu.
    pub serial: bool,
    /// `panic=<secs>` on every kernel command line, so a panicking kernel reboots.
    pub panic_secs: u32,
}

/// Quote one word for GRUB script: single quotes, `'` written as `'\''`.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// The kernel arguments of `slot`'s entry: the configured command line, then `k3os.slot=` and
/// `panic=` (last, so they win over any earlier occurrence).
pub(crate) fn kernel_args(entry: &BootEntry, slot: Slot, panic_secs: u32) -> Vec<String> {
    let mut args: Vec<String> = entry
        .cmdline
        .split_whitespace()
        .map(str::to_string)
        .collect();
    args.push(format!("k3os.slot={}", slot.letter()));
    args.push(format!("panic={panic_secs}"));
    args
}

/// The complete `grub.cfg` (installed as `<grub dir>/grub.cfg`; the env files are found under
/// `${prefix}/k3os/`).
pub fn render_cfg(cfg: &GrubConfig) -> String {
    let max = cfg.max_tries.max(1);
    let names = env_var_names().join(" ");
    let check = check_expr();
    let mut out = Lines(String::new());
    header(&mut out, cfg, max, "\"${prefix}/k3os\"");
    read_copies(&mut out, &names, &check);
    verity_files(&mut out);
    range_checks(&mut out, max);
    choice(&mut out);
    countdown(&mut out, max, &names, &check);
    menu(&mut out, cfg);
    out.0
}

/// The chooser script of the signed UEFI path (docs/design/trust.md), built into the signed
/// GRUB image rather than read from the disk: the same copy choice, range checks, choice and
/// countdown over the env copies in `env_dir` (a GRUB path, e.g. `(hd0,gpt3)/grub/k3os`), and
/// menu entries that `chainloader` each slot's signed unified kernel image (`images`, `[A, B]`,
/// GRUB paths). The firmware checks the image's signature; one that does not load fails its
/// entry, and GRUB takes the fallback entry (the other slot), as after a failed `linux`. No
/// dm-verity file is read: the root hash is on the image's signed command line. The menu can
/// be neither edited nor left for a GRUB command line (a superuser with no password).
pub fn render_signed_cfg(cfg: &GrubConfig, env_dir: &str, images: [&str; 2]) -> String {
    let max = cfg.max_tries.max(1);
    let names = env_var_names().join(" ");
    let check = check_expr();
    let mut out = Lines(String::new());
    header(&mut out, cfg, max, &quote(env_dir));
    out.w("# Signed image: no menu editing, no command line (no superuser can log in).");
    out.w("set superusers=\"k3os-locked\"");
    out.w("");
    read_copies(&mut out, &names, &check);
    range_checks(&mut out, max);
    choice(&mut out);
    countdown(&mut out, max, &names, &check);
    fallback(&mut out);
    for (slot, image) in Slot::ALL.into_iter().zip(images) {
        out.w(&format!(
            "menuentry {} --id k3os-{slot} --unrestricted {{",
            quote(&format!("k3OS slot {slot}"))
        ));
        // GRUB 2.06's `chainloader` finds the firmware's device through `root`, not through
        // the file's device: name the device as `root`, then the file on it.
        match image.strip_prefix('(').and_then(|r| r.split_once(')')) {
            Some((dev, path)) => {
                out.w(&format!("  set root={}", quote(&format!("({dev})"))));
                out.w(&format!("  chainloader {}", quote(path)));
            }
            None => out.w(&format!("  chainloader {}", quote(image))),
        }
        out.w("}");
    }
    out.0
}

/// The script text being rendered, a line at a time.
struct Lines(String);

impl Lines {
    fn w(&mut self, line: &str) {
        self.0.push_str(line);
        self.0.push('\n');
    }
}

/// `unset` every state variable and the check, each line prefixed with `indent`.
fn unset_all(out: &mut Lines, indent: &str) {
    for v in env_var_names() {
        out.w(&format!("{indent}unset {v}"));
    }
    out.w(&format!("{indent}unset {VAR_CHECK}"));
}

/// Version and tries markers, menu timeout, serial console, the env directory (`k3os_dir`, a
/// GRUB word).
fn header(out: &mut Lines, cfg: &GrubConfig, max: u8, k3os_dir: &str) {
    // The version marker comes first: it is how Rust knows which rules this script applies.
    out.w(&format!("{SCRIPT_MARKER}{}", GrubScript::CURRENT));
    out.w("# k3OS A/B boot: generated by bootconfig::grub::render_cfg, do not edit.");
    out.w("# State: ${prefix}/k3os/env1 and env2 (K3OS_CHECK repeats the values), each guarded by lock1/lock2");
    out.w("# (K3OS_EDITING=0: complete); ${prefix}/k3os/good names the slot last confirmed good.");
    out.w(&format!("{MAX_TRIES_MARKER}{max}"));
    out.w(&format!("set timeout={}", cfg.timeout_secs));
    out.w("set timeout_style=menu");
    if cfg.serial {
        out.w("serial --unit=0 --speed=115200 --word=8 --parity=no --stop=1");
        out.w("terminal_input console serial");
        out.w("terminal_output console serial");
    }
    out.w(&format!("set k3os_dir={k3os_dir}"));
    out.w("");
}

/// Load both copies and their locks, check each copy, pick one, else the last-good record.
fn read_copies(out: &mut Lines, names: &str, check: &str) {
    out.w(
        "# Integrity of each copy: it loads and K3OS_CHECK repeats its values (crate::grub docs).",
    );
    for n in [1, 2] {
        out.w(&format!("set {VAR_EDITING}=1"));
        out.w(&format!(
            "if load_env --skip-sig --file \"${{k3os_dir}}/lock{n}\" {VAR_EDITING}; then true; fi"
        ));
        out.w(&format!("set k3os_lock{n}=\"${{{VAR_EDITING}}}\""));
        unset_all(out, "");
        out.w(&format!("set k3os_ok{n}=0"));
        out.w(&format!(
            "if load_env --skip-sig --file \"${{k3os_dir}}/env{n}\" {names} {VAR_CHECK}; then"
        ));
        out.w(&format!(
            "  if [ \"${{{VAR_CHECK}}}\" = {check} ]; then set k3os_ok{n}=1; fi"
        ));
        out.w("fi");
    }
    out.w("# Which copy: 1 if intact and not marked editing, else 2 if intact, else 1 if intact.");
    out.w("set k3os_copy=none");
    out.w("if [ \"${k3os_ok1}\" = \"1\" ]; then if [ \"${k3os_lock1}\" = \"0\" ]; then set k3os_copy=1; fi; fi");
    out.w("if [ \"${k3os_copy}\" = \"none\" ]; then if [ \"${k3os_ok2}\" = \"1\" ]; then set k3os_copy=2; fi; fi");
    out.w("if [ \"${k3os_copy}\" = \"none\" ]; then if [ \"${k3os_ok1}\" = \"1\" ]; then set k3os_copy=1; fi; fi");
    unset_all(out, "");
    out.w("if [ \"${k3os_copy}\" != \"none\" ]; then");
    out.w(&format!(
        "  if load_env --skip-sig --file \"${{k3os_dir}}/env${{k3os_copy}}\" {names}; then true; fi"
    ));
    out.w("else");
    out.w("  # Both copies damaged: the slot last confirmed good, if its record is intact.");
    out.w(&format!("  unset {VAR_GOOD}"));
    out.w(&format!("  unset {VAR_GOOD_AGAIN}"));
    out.w(&format!(
        "  if load_env --skip-sig --file \"${{k3os_dir}}/{GOOD_FILE}\" {VAR_GOOD} {VAR_GOOD_AGAIN}; then true; fi"
    ));
    out.w(&format!(
        "  if [ \"${{{VAR_GOOD}}}\" = \"${{{VAR_GOOD_AGAIN}}}\" ]; then"
    ));
    for g in Slot::ALL {
        out.w(&format!(
            "    if [ \"${{{VAR_GOOD}}}\" = \"{g}\" ]; then set {VAR_PRIMARY}={g}; set {}=good; set {}=bad; set k3os_copy=good; fi",
            state_var(g),
            state_var(g.other())
        ));
    }
    out.w("  fi");
    out.w("fi");
    out.w("");
}

/// Each slot's dm-verity root hash file (script 3, [`super::verity`]): its value, or
/// `unreadable` when the file exists but yields none; exported so the menu entries see it.
fn verity_files(out: &mut Lines) {
    out.w("# dm-verity root hash of each slot (script 3): present file, unreadable value fails that boot.");
    for slot in Slot::ALL {
        let (var, file) = (verity_var(slot), verity_file(slot));
        out.w(&format!("unset {var}"));
        out.w(&format!("if [ -f \"${{k3os_dir}}/{file}\" ]; then"));
        out.w(&format!(
            "  if load_env --skip-sig --file \"${{k3os_dir}}/{file}\" {var}; then true; fi"
        ));
        out.w(&format!(
            "  if [ -z \"${{{var}}}\" ]; then set {var}={UNREADABLE}; fi"
        ));
        out.w("fi");
        out.w(&format!("export {var}"));
    }
    out.w("");
}

/// Anything outside the exact allowed values becomes the safe default; which slots may boot.
fn range_checks(out: &mut Lines, max: u8) {
    out.w("# Range checks: anything outside the exact allowed set becomes the safe default.");
    out.w(&format!(
        "if [ \"${{{VAR_PRIMARY}}}\" != \"B\" ]; then set {VAR_PRIMARY}=A; fi"
    ));
    for slot in Slot::ALL {
        let (sv, tv) = (state_var(slot), tries_var(slot));
        out.w(&format!("if [ \"${{{sv}}}\" = \"good\" ]; then true"));
        out.w(&format!("elif [ \"${{{sv}}}\" = \"try\" ]; then true"));
        out.w(&format!("else set {sv}=bad; fi"));
        out.w(&format!("if [ \"${{{tv}}}\" = \"0\" ]; then true"));
        for t in 1..=max {
            out.w(&format!("elif [ \"${{{tv}}}\" = \"{t}\" ]; then true"));
        }
        out.w(&format!("else set {tv}=0; fi"));
        let ok = format!("k3os_{}_ok", slot.letter());
        out.w(&format!("set {ok}=0"));
        out.w(&format!(
            "if [ \"${{{sv}}}\" = \"good\" ]; then set {ok}=1; fi"
        ));
        out.w(&format!("if [ \"${{{sv}}}\" = \"try\" ]; then if [ \"${{{tv}}}\" != \"0\" ]; then set {ok}=1; fi; fi"));
    }
    out.w("");
}

/// The slot to boot (`BootEnv::next_boot`'s rule).
fn choice(out: &mut Lines) {
    out.w("# Choice (BootEnv::next_boot): primary if bootable, else the other, else any slot not bad.");
    for (i, p) in [Slot::B, Slot::A].into_iter().enumerate() {
        let o = p.other();
        if i == 0 {
            out.w(&format!("if [ \"${{{VAR_PRIMARY}}}\" = \"{p}\" ]; then"));
        } else {
            out.w("else");
        }
        out.w(&format!(
            "  if [ \"${{k3os_{p}_ok}}\" = \"1\" ]; then set k3os_boot={p}"
        ));
        out.w(&format!(
            "  elif [ \"${{k3os_{o}_ok}}\" = \"1\" ]; then set k3os_boot={o}"
        ));
        out.w(&format!(
            "  elif [ \"${{{}}}\" != \"bad\" ]; then set k3os_boot={p}",
            state_var(p)
        ));
        out.w(&format!(
            "  elif [ \"${{{}}}\" != \"bad\" ]; then set k3os_boot={o}",
            state_var(o)
        ));
        out.w(&format!("  else set k3os_boot={p}; fi"));
    }
    out.w("fi");
    out.w("");
}

/// Count a trial boot down and save it into every intact copy.
fn countdown(out: &mut Lines, max: u8, names: &str, check: &str) {
    out.w("# Count a trial boot down and save it into every intact copy (1, then 2), each marked editing meanwhile.");
    out.w("set k3os_count=0");
    for slot in Slot::ALL {
        let (sv, tv) = (state_var(slot), tries_var(slot));
        out.w(&format!(
            "if [ \"${{k3os_boot}}\" = \"{slot}\" ]; then if [ \"${{{sv}}}\" = \"try\" ]; then"
        ));
        for t in (1..=max).rev() {
            let kw = if t == max { "if" } else { "elif" };
            out.w(&format!(
                "  {kw} [ \"${{{tv}}}\" = \"{t}\" ]; then set {tv}={}; set k3os_count=1",
                t - 1
            ));
        }
        out.w("  fi");
        out.w("fi; fi");
    }
    out.w("if [ \"${k3os_count}\" = \"1\" ]; then");
    out.w(&format!("  set {VAR_CHECK}={check}"));
    for n in [1, 2] {
        out.w(&format!("  if [ \"${{k3os_ok{n}}}\" = \"1\" ]; then"));
        out.w(&format!("    set {VAR_EDITING}=1"));
        out.w(&format!(
            "    if save_env --file \"${{k3os_dir}}/lock{n}\" {VAR_EDITING}; then"
        ));
        out.w(&format!(
            "      if save_env --file \"${{k3os_dir}}/env{n}\" {names} {VAR_CHECK}; then"
        ));
        out.w(&format!("        set {VAR_EDITING}=0"));
        out.w(&format!(
            "        save_env --file \"${{k3os_dir}}/lock{n}\" {VAR_EDITING}"
        ));
        out.w("      fi");
        out.w("    fi");
        out.w("  fi");
    }
    out.w("fi");
    out.w("");
}

/// The default entry and the fallback entry number.
fn fallback(out: &mut Lines) {
    out.w("set default=\"k3os-${k3os_boot}\"");
    out.w("unset fallback");
    // GRUB 2.06 (Debian 12) takes `fallback` as a menu entry *number* only (ids and titles are a
    // downstream Red Hat patch): with an id the fallback silently never happens. The entries
    // below are emitted in Slot::ALL order, so the other slot's index is its entry number.
    for slot in Slot::ALL {
        let o = slot.other();
        let index = Slot::ALL.iter().position(|s| *s == o).expect("slot in ALL");
        out.w(&format!(
            "if [ \"${{k3os_boot}}\" = \"{slot}\" ]; then if [ \"${{{}}}\" != \"bad\" ]; then set fallback=\"{index}\"; fi; fi",
            state_var(o)
        ));
    }
    out.w(MENU_MARKER);
}

/// The default entry, the fallback entry number and the two menu entries.
fn menu(out: &mut Lines, cfg: &GrubConfig) {
    fallback(out);
    for (slot, entry) in Slot::ALL.into_iter().zip(cfg.entries.iter()) {
        let args: Vec<String> = kernel_args(entry, slot, cfg.panic_secs)
            .iter()
            .map(|a| quote(a))
            .collect();
        out.w(&format!(
            "menuentry {} --id k3os-{slot} {{",
            quote(&format!("k3OS slot {slot}"))
        ));
        let linux = format!("linux {} {}", quote(&entry.kernel), args.join(" "));
        let var = verity_var(slot);
        out.w(&format!("  if [ -n \"${{{var}}}\" ]; then"));
        out.w(&format!("    {linux} \"k3os.verity=${{{var}}}\""));
        out.w("  else");
        out.w(&format!("    {linux}"));
        out.w("  fi");
        out.w(&format!("  initrd {}", quote(&entry.initrd)));
        out.w("}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> GrubConfig {
        let e = |s: &str| BootEntry {
            kernel: format!("/{s}/vmlinuz"),
            initrd: format!("/{s}/initrd"),
            cmdline: format!("root=PARTLABEL=rootfs-{s} ro"),
        };
        GrubConfig {
            entries: [e("a"), e("b")],
            max_tries: 3,
            timeout_secs: 0,
            serial: true,
            panic_secs: 5,
        }
    }

    /// The signed script decides exactly as the disk's script does (same text from the copy
    /// choice to the fallback entry), reads its env from the given directory, boots only
    /// through `chainloader`, and names nothing that GRUB would load code from.
    #[test]
    fn the_signed_script_chooses_like_the_disk_script_and_only_chainloads() {
        let plain = render_cfg(&cfg());
        let images = ["(hd0,gpt3)/a/k3os.efi", "(hd0,gpt3)/b/k3os.efi"];
        let signed = render_signed_cfg(&cfg(), "(hd0,gpt3)/grub/k3os", images);
        let between = |t: &str, from: &str, to: &str| {
            let a = t.find(from).expect(from);
            let b = t.find(to).expect(to);
            t[a..b].to_string()
        };
        let first = "# Integrity of each copy";
        assert_eq!(
            between(&plain, "# Range checks", MENU_MARKER),
            between(&signed, "# Range checks", MENU_MARKER)
        );
        assert_eq!(
            between(&plain, first, "# dm-verity"),
            between(&signed, first, "# Range checks")
        );
        assert!(signed.contains("set k3os_dir='(hd0,gpt3)/grub/k3os'\n"));
        assert!(signed.contains("set superusers=\"k3os-locked\"\n"));
        for (slot, image) in Slot::ALL.into_iter().zip(images) {
            let path = &image["(hd0,gpt3)".len()..];
            let entry = format!(
                "menuentry 'k3OS slot {slot}' --id k3os-{slot} --unrestricted {{\n  set root='(hd0,gpt3)'\n  chainloader '{path}'\n}}"
            );
            assert!(signed.contains(&entry), "{entry}\n{signed}");
        }
        for word in [
            "linux",
            "initrd",
            "insmod",
            "configfile",
            "source",
            "prefix",
            "verity",
        ] {
            let lines: Vec<&str> = signed
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .filter(|l| {
                    l.split(|c: char| !c.is_alphanumeric() && c != '_')
                        .any(|w| w == word)
                })
                .collect();
            assert!(lines.is_empty(), "{word}: {lines:?}");
        }
    }
}
