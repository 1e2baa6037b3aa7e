//! `k3os-verity-open <partition> <k3os.verity value>`: the initramfs's device-mapper helper
//! (issue 34 item 5). Makes the read-only dm-verity device `k3os-root` over the slot's
//! partition, which holds the squashfs, its hash tree and its FEC data in that order, from the
//! geometry the loader passes (`k3os.verity=`, see [`table`]), and prints its node
//! (`/dev/dm-N`) for `/init` to mount.
//!
//! Exit status: 0 opened; 3 the value names no geometry (an activation by an earlier
//! k3os-ops: `/init` boots without dm-verity, as that one did); 1 anything else, with the
//! reason on stderr (a bad value, or the kernel refusing the table: its log says why, e.g.
//! a root hash that does not match the tree).
//!
//! A separate static binary of a few hundred KiB rather than a `k3os-ops` subcommand: the
//! initrd is decompressed on every boot, and the full `k3os-ops` would add ~20 MB to it.

mod dm;
mod table;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::process::ExitCode;

use dm::{Cmd, Control, Target};
use table::{Params, TableError};

/// The mapped device's name.
const NAME: &str = "k3os-root";

/// Why the device was not made.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("{path}: {what}")]
    Partition { path: String, what: String },
    #[error(transparent)]
    Dm(#[from] dm::DmError),
}

/// `major:minor` of the block device at `path`.
fn device_number(path: &str) -> Result<String, OpenError> {
    let bad = |what: String| OpenError::Partition {
        path: path.escape_debug().to_string(),
        what,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot stat: {e}")))?;
    if !meta.file_type().is_block_device() {
        return Err(bad("expected a block device".into()));
    }
    let rdev = meta.rdev();
    Ok(format!(
        "{}:{}",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    ))
}

/// Create, load and resume the device; remove it again when the table is refused.
fn open(partition: &str, value: &str) -> Result<String, OpenError> {
    let params = Params::parse(value)?;
    let dev = device_number(partition)?;
    let target_params = params.target_params(&dev);
    let target = Target {
        sectors: params.sectors(),
        kind: "verity",
        params: &target_params,
    };
    let control = Control::open()?;
    let reply = control.send(Cmd::Create, NAME, None)?;
    let made = control
        .send(Cmd::Load, NAME, Some(&target))
        .and_then(|_| control.send(Cmd::Resume, NAME, None));
    if let Err(e) = made {
        let _ = control.send(Cmd::Remove, NAME, None);
        return Err(e.into());
    }
    let (_, minor) = dm::reply_dev(&reply);
    Ok(format!("/dev/dm-{minor}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [partition, value] = &args[..] else {
        eprintln!("usage: k3os-verity-open <partition> <k3os.verity value>");
        return ExitCode::from(2);
    };
    match open(partition, value) {
        Ok(node) => {
            println!("{node}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("k3os-verity-open: {e}");
            match e {
                OpenError::Table(TableError::NoGeometry(_)) => ExitCode::from(3),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
