//! Which external commands the repository runs, and whether `scripts/setup.sh` installs them.
//!
//! Pure parts ([`words_of_rust`], [`words_of_shell`], [`setup_packages`], [`verdict`]) are
//! unit-tested here; [`scan`] and [`Machine`] do the file and dpkg look-ups.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;

/// Words that name a command on this host but are not run on it by the repository: either they
/// run inside the test VMs (from the image's own packages) or they are data that happens to be
/// spelled like a command. Each with its reason.
pub const NOT_HOST_COMMANDS: &[(&str, &str)] = &[
    (
        "reboot",
        "run on the node (k3os-ops slot rollback --reboot, the VM guests), never on the host",
    ),
    ("poweroff", "run inside the VM guests (busybox)"),
    ("halt", "run inside the VM guests (busybox)"),
    ("udhcpc", "run inside the VM guests (busybox)"),
    ("httpd", "run inside the VM guests (busybox)"),
    ("file", "a word in messages and JSON keys, never run"),
    (
        "bzip2",
        "a compression libupgrade's image-archive reader names when it refuses one, never run",
    ),
    (
        "xz",
        "a compression libupgrade's image-archive reader names when it refuses one, never run",
    ),
    (
        "lz4",
        "a compression libupgrade's image-archive reader names when it refuses one, never run",
    ),
    ("time", "a word in messages, never run"),
    ("host", "a word in messages and config keys, never run"),
    ("ip", "a word in messages and config keys, never run"),
    ("top", "a word in messages, never run"),
    ("watch", "a word in messages and kube-rs calls, never run"),
    ("info", "a log level, never run"),
    ("less", "a word in messages, never run"),
    ("delta", "a word in messages, never run"),
    ("patch", "a Kubernetes verb and HTTP method, never run"),
    ("apply", "a word in messages, never run"),
    ("list", "a subcommand name, never run"),
    ("run", "a subcommand name, never run"),
    ("wait", "a word in messages, never run"),
    ("dir", "a config key (layout kind), never run"),
    (
        "bash",
        "shell of the scripts themselves; Essential on Debian but not always owned by dpkg -S",
    ),
    (
        "kill",
        "the shell builtin in the scripts (procps' /usr/bin/kill is never called)",
    ),
    (
        "make",
        "the casync subcommand in benches/delta.rs (casync make), never run",
    ),
    (
        "init",
        "a file name in the test initramfs, never run on the host",
    ),
    ("node", "a word in messages and Kubernetes kinds, never run"),
    (
        "iptables",
        "a Debian package images/scripts/fetch-debs.sh --kube downloads for the Kubernetes node guest (dpkg-deb -x), never run on the host",
    ),
    (
        "containerd",
        "a Debian package images/scripts/fetch-debs.sh --kube downloads for the Kubernetes node guest; run inside the guest only",
    ),
    (
        "iptables-save",
        "file names in the Kubernetes node guest's root (images/src/kube.rs: iptables' legacy links, its multi-call binary), never run on the host",
    ),
    (
        "iptables-restore",
        "file names in the Kubernetes node guest's root (images/src/kube.rs: iptables' legacy links, its multi-call binary), never run on the host",
    ),
    (
        "ip6tables",
        "file names in the Kubernetes node guest's root (images/src/kube.rs: iptables' legacy links, its multi-call binary), never run on the host",
    ),
    (
        "ip6tables-save",
        "file names in the Kubernetes node guest's root (images/src/kube.rs: iptables' legacy links, its multi-call binary), never run on the host",
    ),
    (
        "ip6tables-restore",
        "file names in the Kubernetes node guest's root (images/src/kube.rs: iptables' legacy links, its multi-call binary), never run on the host",
    ),
    (
        "xtables-legacy-multi",
        "file names in the Kubernetes node guest's root (images/src/kube.rs: iptables' legacy links, its multi-call binary), never run on the host",
    ),
    (
        "bridge",
        "a CNI plugin copied into the Kubernetes node guest's root and its config's plugin type (images/src/kube.rs), never run on the host",
    ),
    (
        "ctr",
        "containerd's client, run inside the Kubernetes node guest (vm-tests kube-node-joins), never on the host",
    ),
    (
        "cc",
        "a digest in test fixtures (libupgrade/src/stage/plan.rs), never run by a test or script; the C compiler itself is rustup's prerequisite",
    ),
    (
        "open",
        "a word in messages (xdg-utils' open arrives with chromium, never run)",
    ),
    (
        "red",
        "a colour in the collector's dashboard (ed's red arrives with chromium, never run)",
    ),
    ("size", "a word in messages and JSON keys, never run"),
    ("write", "a word in messages, never run"),
    (
        "activate",
        "a subcommand name (k3os-ops slot activate), never run",
    ),
    (
        "as",
        "a word in Rust comments inside shell heredocs (bootconfig/tests/fixtures/v0.1.0/make.sh); binutils' assembler is never run",
    ),
];

/// Words that name a program some test runs, but never from `PATH`: the test takes it from a
/// directory an environment variable names, so whether a Debian package of the same name is
/// installed here says nothing about a fresh machine. Each with where it comes from.
pub const FROM_ASSETS: &[(&str, &str)] = &[
    (
        "etcd",
        "k3os-ops/tests/cli/cluster/ runs $KUBEBUILDER_ASSETS/etcd (controller-runtime's envtest binaries), not the etcd-server package's",
    ),
    (
        "kube-apiserver",
        "k3os-ops/tests/cli/cluster/ runs $KUBEBUILDER_ASSETS/kube-apiserver (envtest binaries)",
    ),
    (
        "kube-controller-manager",
        "kube-testenv runs $KUBEBUILDER_ASSETS/kube-controller-manager (vm-tests kube-node-joins)",
    ),
    (
        "kube-scheduler",
        "kube-testenv runs $KUBEBUILDER_ASSETS/kube-scheduler (vm-tests kube-node-joins)",
    ),
    (
        "kubectl",
        "vm-tests kube-node-joins runs $KUBEBUILDER_ASSETS/kubectl (v1.36; Debian's 1.20 is too old), never the one on PATH",
    ),
    (
        "kubelet",
        "copied from .cache/kube/<version>/linux-<arch> into the -kube test images (images/src/kube.rs); runs inside the guest only",
    ),
];

/// Whether the check judges `word` as a command run on the host from `PATH` (not one of
/// [`NOT_HOST_COMMANDS`] or [`FROM_ASSETS`]).
pub fn checked_on_host(word: &str) -> bool {
    !NOT_HOST_COMMANDS
        .iter()
        .chain(FROM_ASSETS.iter())
        .any(|(w, _)| *w == word)
}

/// Non-Debian executables every machine of ours has: the Rust toolchain (rustup) that
/// README's fresh machine starts with.
/// `git` is there too: the repository is a clone.
pub const TOOLCHAIN: &[&str] = &["cargo", "rustc", "rustup", "rustfmt", "cargo-clippy", "git"];

/// A word that names an executable, and where it was seen first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    pub word: String,
    pub file: PathBuf,
    pub line: usize,
}

fn word_re() -> Regex {
    Regex::new(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$").expect("static regex")
}

/// The string literals of Rust source that could be a command name, with their line numbers.
pub fn words_of_rust(text: &str) -> Vec<(String, usize)> {
    let lit = Regex::new(r#""([^"\\\n]*)""#).expect("static regex");
    let word = word_re();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        for c in lit.captures_iter(line) {
            let w = &c[1];
            if word.is_match(w) {
                out.push((w.to_string(), i + 1));
            }
        }
    }
    out
}

/// The words of a shell script or justfile that could be a command name (comments dropped).
/// The words of a guide page's marked shell blocks, which CI runs (`crate::guide`), with
/// their lines in the page; a page that cannot be read has none (the guide's test says why).
pub fn words_of_guide(text: &str) -> Vec<(String, usize)> {
    let blocks = crate::guide::marked_blocks(text).unwrap_or_default();
    blocks
        .iter()
        .flat_map(|b| {
            words_of_shell(&b.script)
                .into_iter()
                .map(move |(w, line)| (w, b.line + line))
        })
        .collect()
}

pub fn words_of_shell(text: &str) -> Vec<(String, usize)> {
    let split = Regex::new(r#"[\s;|&()<>`'"={}\[\]$,:]+"#).expect("static regex");
    let word = word_re();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = strip_shell_comment(line);
        for w in split.split(code) {
            if word.is_match(w) && !w.starts_with('-') {
                out.push((w.to_string(), i + 1));
            }
        }
    }
    out
}

fn strip_shell_comment(line: &str) -> &str {
    let t = line.trim_start();
    if t.starts_with('#') {
        return "";
    }
    match line.find(" #") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// The Debian packages `scripts/setup.sh` installs: the words of its `PKGS="…"` string.
pub fn setup_packages(setup_sh: &str) -> BTreeSet<String> {
    let re = Regex::new(r#"(?s)\bPKGS="([^"]*)""#).expect("static regex");
    re.captures_iter(setup_sh)
        .flat_map(|c| {
            c[1].split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Where a command comes from on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A Debian package; `base`: Essential or Priority required (on every Debian system).
    Package { name: String, base: bool },
    /// An executable no package owns (rustup's toolchain, `cargo install`, a local build).
    Unpackaged(PathBuf),
}

/// What the check says about one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// The package that provides it is not installed by setup.sh.
    MissingPackage(String),
    /// Not from a package, and setup.sh does not mention it.
    NotInstalled(PathBuf),
}

/// Decide one command: `setup` is setup.sh's packages, `setup_text` its whole text.
pub fn verdict(word: &str, origin: &Origin, setup: &BTreeSet<String>, setup_text: &str) -> Verdict {
    match origin {
        Origin::Package { base: true, .. } => Verdict::Ok,
        Origin::Package { name, base: false } => {
            if setup.contains(name) {
                Verdict::Ok
            } else {
                Verdict::MissingPackage(name.clone())
            }
        }
        Origin::Unpackaged(path) => {
            let mentioned = Regex::new(&format!(r"\b{}\b", regex::escape(word)))
                .map(|r| r.is_match(setup_text))
                .unwrap_or(false);
            if TOOLCHAIN.contains(&word) || mentioned {
                Verdict::Ok
            } else {
                Verdict::NotInstalled(path.clone())
            }
        }
    }
}

/// Every word of the repository's tracked sources, scripts and recipes that may name a
/// command, first use each. Files that run inside the VM guests (`images/files/`) are left
/// out (their commands come from the image's own packages), and so are this crate (its unit
/// tests hold sample words) and setup.sh itself (its words are package names).
pub fn scan(repo: &Path) -> Result<BTreeMap<String, Use>, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .output()
        .map_err(|e| format!("git ls-files in {}: {e}", repo.display()))?;
    if !out.status.success() {
        return Err(format!(
            "git ls-files in {}: {}",
            repo.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut uses = BTreeMap::new();
    for rel in String::from_utf8_lossy(&out.stdout).lines() {
        // images/files/ runs inside the guests; checks/ holds this check's own sample words.
        if rel.starts_with("images/files/")
            || rel.starts_with("checks/")
            || rel == "scripts/setup.sh"
        {
            continue;
        }
        let name = Path::new(rel)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let words = if rel.ends_with(".rs") {
            words_of_rust
        } else if rel.ends_with(".sh") || name == "justfile" || rel == ".ci/run" {
            words_of_shell
        } else if rel.starts_with("docs/guide/") && rel.ends_with(".md") {
            words_of_guide
        } else {
            continue;
        };
        let path = repo.join(rel);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (w, line) in words(&text) {
            uses.entry(w.clone()).or_insert(Use {
                word: w,
                file: PathBuf::from(rel),
                line,
            });
        }
    }
    Ok(uses)
}

/// Look-ups on this machine: `PATH` and dpkg.
pub struct Machine {
    path: Vec<PathBuf>,
}

impl Machine {
    pub fn new() -> Machine {
        Machine::with_path_first(&[])
    }

    /// [`Machine::new`] with `dirs` looked up before `PATH` (tests: commands installed by
    /// hand).
    pub fn with_path_first(dirs: &[PathBuf]) -> Machine {
        let mut path: Vec<PathBuf> = dirs.to_vec();
        path.extend(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        // Tests may run with a trimmed PATH; the sbin dirs hold mkfs.*, losetup, sgdisk.
        for d in [
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ] {
            if !path.iter().any(|p| p == Path::new(d)) {
                path.push(d.into());
            }
        }
        Machine { path }
    }

    /// The executable `word` names on PATH, if any.
    pub fn which(&self, word: &str) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        self.path.iter().map(|d| d.join(word)).find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
    }

    /// Which package owns each of `exes`, in two dpkg calls for all of them. Each path is tried
    /// as found, canonical, and as its usrmerge twin (dpkg records `/sbin/mkfs.ext4` where
    /// PATH finds `/usr/sbin/mkfs.ext4`).
    pub fn origins(&self, exes: &[PathBuf]) -> BTreeMap<PathBuf, Origin> {
        let mut tries: Vec<(PathBuf, Vec<PathBuf>)> = Vec::new();
        for exe in exes {
            let mut c = vec![exe.clone()];
            if let Ok(canon) = std::fs::canonicalize(exe) {
                c.push(canon);
            }
            for p in c.clone() {
                let s = p.to_string_lossy().into_owned();
                match s.strip_prefix("/usr") {
                    Some(rest) => c.push(PathBuf::from(rest)),
                    None => c.push(PathBuf::from(format!("/usr{s}"))),
                }
            }
            tries.push((exe.clone(), c));
        }
        let all: BTreeSet<PathBuf> = tries.iter().flat_map(|(_, c)| c.clone()).collect();
        let owners = dpkg_owners(&all);
        let pkgs: BTreeSet<String> = owners.values().cloned().collect();
        let base = base_packages(&pkgs);
        tries
            .into_iter()
            .map(|(exe, c)| {
                let origin = match c.iter().find_map(|p| owners.get(p)) {
                    Some(pkg) => Origin::Package {
                        name: pkg.clone(),
                        base: base.contains(pkg),
                    },
                    None => Origin::Unpackaged(exe.clone()),
                };
                (exe, origin)
            })
            .collect()
    }
}

impl Default for Machine {
    fn default() -> Self {
        Self::new()
    }
}

/// `dpkg -S` for many paths at once: path -> first owning package (arch suffix dropped).
/// Paths no package owns are simply absent.
fn dpkg_owners(paths: &BTreeSet<PathBuf>) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    if paths.is_empty() {
        return out;
    }
    let Ok(o) = Command::new("dpkg").arg("-S").args(paths).output() else {
        return out;
    };
    // "pkg[:arch][, pkg2]: /path"; diversions print "diversion by …" lines.
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        if line.starts_with("diversion") {
            continue;
        }
        let Some((pkgs, path)) = line.rsplit_once(": ") else {
            continue;
        };
        let Some(first) = pkgs.split(", ").next() else {
            continue;
        };
        let pkg = first.split(':').next().unwrap_or(first).to_string();
        out.entry(PathBuf::from(path)).or_insert(pkg);
    }
    out
}

/// The packages of `pkgs` on every Debian system: `Essential: yes` or `Priority: required`.
fn base_packages(pkgs: &BTreeSet<String>) -> BTreeSet<String> {
    if pkgs.is_empty() {
        return BTreeSet::new();
    }
    let Ok(o) = Command::new("dpkg-query")
        .arg("-W")
        .arg("-f=${Package} ${Essential} ${Priority}\\n")
        .args(pkgs)
        .output()
    else {
        return BTreeSet::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?;
            let rest: Vec<&str> = w.collect();
            (rest.contains(&"yes") || rest.contains(&"required")).then(|| name.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_literals_and_shell_words() {
        let rs = "// Command::new(\"ignored\")\nlet c = Command::new(\"grub-emu\").arg(\"-X\");\n let x = \"two words\";";
        let w = words_of_rust(rs);
        assert_eq!(w, vec![("grub-emu".to_string(), 2)]);
        let sh = "# curl in a comment\nset -eu\nbody=$(curl -s \"$url\" || true) # wget here\n";
        let w: Vec<_> = words_of_shell(sh).into_iter().map(|(w, _)| w).collect();
        assert!(
            w.contains(&"curl".to_string()) && w.contains(&"true".to_string()),
            "{w:?}"
        );
        assert!(!w.contains(&"wget".to_string()), "{w:?}");
        assert!(!w.iter().any(|x| x.starts_with('-')), "{w:?}");
    }

    #[test]
    fn envtest_binaries_are_not_host_commands() {
        for w in ["etcd", "kube-apiserver"] {
            assert!(!checked_on_host(w), "{w}");
        }
        assert!(checked_on_host("mksquashfs"));
        assert!(!checked_on_host("reboot"));
    }

    #[test]
    fn setup_packages_span_lines() {
        let s = "set -e\nPKGS=\"qemu-system-x86 grub-pc-bin\ngrub-emu\n  openssl\"\nfoo=\"bar\"\n";
        let p = setup_packages(s);
        assert_eq!(
            p.into_iter().collect::<Vec<_>>(),
            vec!["grub-emu", "grub-pc-bin", "openssl", "qemu-system-x86"]
        );
    }

    #[test]
    fn verdicts() {
        let setup: BTreeSet<String> = ["grub-common".to_string()].into();
        let pkg = |n: &str, base| Origin::Package {
            name: n.into(),
            base,
        };
        assert_eq!(
            verdict("dd", &pkg("coreutils", true), &setup, ""),
            Verdict::Ok
        );
        assert_eq!(
            verdict("grub-editenv", &pkg("grub-common", false), &setup, ""),
            Verdict::Ok
        );
        assert_eq!(
            verdict("grub-emu", &pkg("grub-emu", false), &setup, ""),
            Verdict::MissingPackage("grub-emu".into())
        );
        let local = Origin::Unpackaged("/root/.cargo/bin/just".into());
        assert_eq!(
            verdict("just", &local, &setup, "cargo install just --locked"),
            Verdict::Ok
        );
        assert_eq!(verdict("cargo", &local, &setup, ""), Verdict::Ok);
        assert_eq!(
            verdict("justify", &local, &setup, "cargo install just"),
            Verdict::NotInstalled("/root/.cargo/bin/just".into())
        );
    }
}
