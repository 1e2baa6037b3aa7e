//! `release create --verity` and `slot verify` through the real binary on a dir-layout node:
//! the stage writes the tree and FEC beside the rootfs; a few flipped bytes are repaired and
//! counted; damage beyond FEC fails the command and leaves slot B marked bad, with the
//! scrub as the why in `slot status`.

use std::fs;
use std::os::unix::fs::FileExt;

use k3os_ops_testing::cli::Node;
use k3os_ops_testing::release::fake_inputs;
use libupgrade::manifest::{Arch, Manifest};

fn flip(p: &std::path::Path, at: u64, n: usize) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap();
    let mut b = vec![0u8; n];
    f.read_exact_at(&mut b, at).unwrap();
    b.iter_mut().for_each(|v| *v ^= 0xa5);
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn slot_verify_repairs_what_fec_can_and_marks_a_rotten_slot_bad() {
    let n = Node::new();
    let tree = n.path().join("v2.tree/usr/share");
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("payload"), testkit_noise(2 << 20)).unwrap();
    let inputs = fake_inputs(&n.path().join("v2.in"), "v2");
    fs::remove_file(&inputs.0).unwrap();
    testkit::squashfs(&n.path().join("v2.tree"), &inputs.0, &[]);
    let rel = n.path().join("v2");
    let p = |x: &std::path::Path| x.to_str().unwrap().to_string();
    let created = n.ok(&[
        "release",
        "create",
        "--rootfs",
        &p(&inputs.0),
        "--kernel",
        &p(&inputs.1),
        "--initrd",
        &p(&inputs.2),
        "--version",
        "v2",
        "--arch",
        Arch::host().as_str(),
        "--key",
        &p(&n.path().join("keys/node.key")),
        "-o",
        &p(&rel),
        "--generation",
        "6",
        "--verity",
    ]);
    assert!(
        created.contains("dm-verity        root ") && created.contains("not published"),
        "{created}"
    );
    let v = Manifest::parse(&fs::read(rel.join("manifest.json")).unwrap())
        .unwrap()
        .verity
        .unwrap();
    n.ok(&["upgrade", "--stage-only", "--source", &p(&rel)]);
    let rootfs = n.path().join("system/rootfs/v2/rootfs.squashfs");
    let beside = n.path().join("system/rootfs/v2/rootfs.squashfs.verity");
    assert_eq!(
        fs::metadata(&beside).unwrap().len(),
        v.hash_size + v.fec_size
    );
    let said = n.ok(&["slot", "verify"]);
    assert!(
        said.contains("slot A (v1, booted): not read: no signed manifest is kept for it"),
        "{said}"
    );
    assert!(said.contains("slot B (v2): every block verifies"), "{said}");

    let pristine = fs::read(&rootfs).unwrap();
    flip(&rootfs, 3 * 4096 + 11, 4);
    flip(&beside, 200, 1);
    let said = n.ok(&["slot", "verify"]);
    assert!(
        said.contains("slot B (v2): 2 blocks repaired from FEC"),
        "{said}"
    );
    assert!(fs::read(&rootfs).unwrap() == pristine);

    let rounds = (v.data_blocks + v.hash_size / 4096).div_ceil(255 - u64::from(v.fec_roots));
    for j in 0..3 {
        flip(&rootfs, (1 + j * rounds) * 4096, 4096);
    }
    let line = n.fails(&["slot", "verify"]);
    assert_eq!(
        line,
        "error: slot verify: dm-verity damage beyond FEC in slot B"
    );
    let status = String::from_utf8_lossy(&n.ops(&["slot", "status"]).stdout).into_owned();
    assert!(status.contains("dm-verity scrub: 3 of"), "{status}");
}

/// Incompressible bytes (xorshift), so the squashfs spans many blocks.
fn testkit_noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
