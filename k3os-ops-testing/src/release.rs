//! Release fixtures of k3os-ops' CLI tests (the `cli` and `suc_plan` test binaries): a
//! `k3os-ops release serve` child process, signing keys, release inputs and `release create`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use libupgrade::manifest::Arch;
use libupgrade::release;
use libupgrade::release::CreateOptions;

/// Points libupgrade's GitHub client at `api` (`K3OS_OPS_GITHUB_API`, read when a
/// `github-releases://` channel is resolved) for as long as the returned guard lives. The
/// variable is process-wide and the tests of one binary share the process: a test holds the
/// guard from setting it to its last resolve, so no other test re-points it meanwhile.
pub fn github_api(api: &str) -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it leaves nothing half-done behind: the next one sets
    // the variable anew.
    let guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    std::env::set_var(libupgrade::channel::GITHUB_API_ENV, api);
    guard
}

/// The `k3os-ops` binary cargo built for the running test: cargo builds a package's binaries
/// before its integration tests, into the directory above the tests' `deps/` (what
/// `CARGO_BIN_EXE_k3os-ops` names at compile time, which only k3os-ops' own targets see).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the path of the running test binary");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test binary lies in <target>/<profile>/deps/");
        let bin = dir.join("k3os-ops");
        assert!(
            bin.is_file(),
            "no k3os-ops binary at {} (run the test with `cargo test -p k3os-ops`, which builds it)",
            bin.display()
        );
        bin.to_string_lossy().into_owned()
    })
}

/// `k3os-ops release serve DIR --listen 127.0.0.1:0`, killed on drop.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT/`
    pub url: String,
}

impl Server {
    pub fn start(dir: &Path) -> Server {
        Self::spawn(dir, Stdio::null())
    }

    /// Like [`Server::start`], with the per-request log (stderr) appended to `log`.
    pub fn start_logged(dir: &Path, log: &Path) -> Server {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Self::spawn(dir, Stdio::from(f))
    }

    fn spawn(dir: &Path, stderr: Stdio) -> Server {
        let mut child = Command::new(bin())
            .args(["release", "serve"])
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn k3os-ops release serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read serve banner");
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://127.0.0.1:") && u.ends_with('/'))
            .unwrap_or_else(|| panic!("unexpected serve banner: {line:?}"))
            .to_string();
        Server { child, url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A key pair in `dir/keys` and a trust dir `dir/trust` holding its public key.
pub fn keys(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (secret, public) = libupgrade::signing::generate_keypair(&dir.join("keys"), name).unwrap();
    let trust = dir.join("trust");
    std::fs::create_dir_all(&trust).unwrap();
    std::fs::copy(&public, trust.join(format!("{name}.pub"))).unwrap();
    (secret, trust)
}

/// Input files for a release whose contents are marked with `tag`; the rootfs starts with the
/// squashfs magic (enough for `release create`; not a mountable image).
pub fn fake_inputs(dir: &Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let r = dir.join(format!("{tag}.squashfs"));
    let mut bytes = b"hsqs".to_vec();
    bytes.extend(tag.bytes().cycle().take(100_000));
    std::fs::write(&r, bytes).unwrap();
    let k = dir.join(format!("{tag}.vmlinuz"));
    std::fs::write(&k, format!("kernel {tag}")).unwrap();
    let i = dir.join(format!("{tag}.initrd"));
    std::fs::write(&i, format!("initrd {tag}")).unwrap();
    (r, k, i)
}

/// Input files for a release `version`: a real (mksquashfs) rootfs holding
/// `etc/k3os-release` and 100 kB of payload, and small kernel and initrd files; returned as
/// (rootfs, kernel, initrd).
pub fn squashfs_inputs(dir: &Path, version: &str) -> (PathBuf, PathBuf, PathBuf) {
    let tree = dir.join(format!("{version}.tree"));
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(
        tree.join("etc/k3os-release"),
        format!("VERSION={version}\n"),
    )
    .unwrap();
    std::fs::write(
        tree.join("payload"),
        testkit::pseudo_random(100_000, version.len() as u64),
    )
    .unwrap();
    let sq = dir.join(format!("{version}.squashfs"));
    testkit::run(Command::new("mksquashfs").arg(&tree).arg(&sq).args([
        "-noappend",
        "-quiet",
        "-all-root",
    ]));
    let k = dir.join(format!("{version}.vmlinuz"));
    std::fs::write(&k, format!("kernel {version}")).unwrap();
    let i = dir.join(format!("{version}.initrd"));
    std::fs::write(&i, format!("initrd {version}")).unwrap();
    (sq, k, i)
}

pub fn create(
    inputs: &(PathBuf, PathBuf, PathBuf),
    key: &Path,
    out: &Path,
    version: &str,
    arch: Arch,
    generation: Option<u64>,
) {
    release::create(&CreateOptions {
        rootfs: inputs.0.clone(),
        kernel: inputs.1.clone(),
        initrd: inputs.2.clone(),
        version: version.into(),
        arch,
        secret_key: key.to_path_buf(),
        out_dir: out.to_path_buf(),
        generation,
        scripts: Vec::new(),
        payloads: Vec::new(),
    })
    .unwrap();
}

/// The channel metadata keys a publisher holds in one directory: `root`, `targets`, `snapshot`
/// and `timestamp` (each `.key` and `.pub`, made by `release keygen`), and the commands that
/// sign a channel with them. `run` is each caller's way of running the binary.
pub struct MetaKeys {
    dir: PathBuf,
}

impl MetaKeys {
    /// Generate the four keys into `dir`.
    pub fn generate(dir: &Path, run: &dyn Fn(&[&str])) -> MetaKeys {
        let d = dir.display().to_string();
        for name in ["root", "targets", "snapshot", "timestamp"] {
            run(&["release", "keygen", "-o", &d, "--name", name]);
        }
        MetaKeys {
            dir: dir.to_path_buf(),
        }
    }

    /// The path of key file `name` (`targets.key`, `root.pub`, …), as an argument.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The channel's first signed metadata: `release root init`, then [`MetaKeys::relist`].
    pub fn init_channel(&self, chan: &Path, run: &dyn Fn(&[&str])) {
        let k = |n: &str| self.file(n);
        let c = chan.display().to_string();
        run(&[
            "release",
            "root",
            "init",
            &c,
            "--root-key",
            &k("root.key"),
            "--targets-key",
            &k("targets.pub"),
            "--snapshot-key",
            &k("snapshot.pub"),
            "--timestamp-key",
            &k("timestamp.pub"),
        ]);
        self.relist(chan, run);
    }

    /// `release targets` then `release timestamp`, as a publisher re-lists the channel.
    pub fn relist(&self, chan: &Path, run: &dyn Fn(&[&str])) {
        let c = chan.display().to_string();
        run(&["release", "targets", &c, "--key", &self.file("targets.key")]);
        run(&[
            "release",
            "timestamp",
            &c,
            "--snapshot-key",
            &self.file("snapshot.key"),
            "--timestamp-key",
            &self.file("timestamp.key"),
        ]);
    }

    /// The flags that sign a publisher command that re-signs the channel (`release rollout`,
    /// `pause`, `withdraw`, …): `--key`, `--snapshot-key`, `--timestamp-key`.
    pub fn signing(&self) -> Vec<String> {
        vec![
            "--key".into(),
            self.file("targets.key"),
            "--snapshot-key".into(),
            self.file("snapshot.key"),
            "--timestamp-key".into(),
            self.file("timestamp.key"),
        ]
    }
}
