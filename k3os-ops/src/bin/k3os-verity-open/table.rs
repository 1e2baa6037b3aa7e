//! The kernel's dm-verity table from the loader's `k3os.verity=` value and the partition's
//! device number (pure).
//!
//! The value is what libupgrade's activation hands the loader
//! (`<root hash>,<salt>,<data blocks>,<hash start>,<FEC start>,<FEC roots>`, starts in 4096-byte
//! blocks of the partition): data, tree and FEC are contiguous on the slot's partition, so one
//! device serves as data, hash and FEC device. A value of the root hash alone (written by
//! v0.2.0's first builds, before the initramfs opened dm-verity) carries no geometry: that is
//! [`TableError::NoGeometry`], which `/init` answers by booting without dm-verity, as those
//! builds' boots did.

/// The one data and hash block size libupgrade writes.
const BLOCK_SIZE: u64 = 4096;
/// Sectors (512 bytes) per block.
const SECTORS_PER_BLOCK: u64 = BLOCK_SIZE / 512;

/// Why a `k3os.verity=` value gives no table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    /// The root hash alone.
    #[error(
        "k3os.verity='{0}' names a root hash but no geometry (activated by an earlier k3os-ops)"
    )]
    NoGeometry(String),
    /// Anything else that is not the six fields.
    #[error("k3os.verity='{value}' is not <root hash>,<salt>,<data blocks>,<hash start>,<FEC start>,<FEC roots>: {what}")]
    Malformed {
        /// The value, escaped.
        value: String,
        /// What is wrong with it.
        what: String,
    },
}

/// What the verity target needs besides the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Lower-case hex root hash (sha256).
    pub root_hash: String,
    /// Lower-case hex salt.
    pub salt: String,
    /// Data blocks (the squashfs, padded to whole blocks).
    pub data_blocks: u64,
    /// First block of the tree.
    pub hash_start: u64,
    /// First block of the FEC area; FEC covers the blocks before it (data and tree).
    pub fec_start: u64,
    /// Reed-Solomon parity bytes per codeword.
    pub fec_roots: u32,
}

fn is_hex(s: &str, len: Option<usize>) -> bool {
    !s.is_empty()
        && s.len() % 2 == 0
        && len.is_none_or(|l| s.len() == l)
        && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Params {
    /// Parse a `k3os.verity=` value (without the `k3os.verity=`).
    pub fn parse(value: &str) -> Result<Params, TableError> {
        let bad = |what: &str| TableError::Malformed {
            value: value.escape_debug().to_string(),
            what: what.into(),
        };
        let fields: Vec<&str> = value.split(',').collect();
        if fields.len() == 1 && is_hex(value, Some(64)) {
            return Err(TableError::NoGeometry(value.into()));
        }
        let [root, salt, data, hash, fec, roots] = fields[..] else {
            return Err(bad(&format!("{} fields", fields.len())));
        };
        if !is_hex(root, Some(64)) {
            return Err(bad("the root hash is not 64 lower-case hex digits"));
        }
        if !is_hex(salt, None) || salt.len() > 128 {
            return Err(bad("the salt is not 1 to 64 bytes of lower-case hex"));
        }
        let num = |f: &str, name: &str| {
            f.parse::<u64>()
                .map_err(|_| bad(&format!("{name} '{f}' is not a number")))
        };
        let p = Params {
            root_hash: root.into(),
            salt: salt.into(),
            data_blocks: num(data, "data blocks")?,
            hash_start: num(hash, "hash start")?,
            fec_start: num(fec, "FEC start")?,
            fec_roots: u32::try_from(num(roots, "FEC roots")?)
                .map_err(|_| bad("FEC roots out of range"))?,
        };
        if p.data_blocks == 0 || p.hash_start < p.data_blocks || p.fec_start <= p.hash_start {
            return Err(bad(
                "expected 0 < data blocks <= hash start < FEC start (data, tree, FEC in order)",
            ));
        }
        if p.data_blocks > u64::MAX / BLOCK_SIZE || p.fec_start > u64::MAX / BLOCK_SIZE {
            return Err(bad("a start beyond any device"));
        }
        Ok(p)
    }

    /// Length of the mapped device in 512-byte sectors (the data blocks).
    pub fn sectors(&self) -> u64 {
        self.data_blocks * SECTORS_PER_BLOCK
    }

    /// The verity target's parameters over the partition `dev` (`major:minor`). Corruption
    /// FEC cannot correct makes the read fail with EIO (no `restart_on_corruption`): `/init`
    /// sees it while it mounts and reads the root, and after switch_root the failing service
    /// and the confirm step's health checks do; a restart would loop a confirmed slot.
    pub fn target_params(&self, dev: &str) -> String {
        format!(
            "1 {dev} {dev} {BLOCK_SIZE} {BLOCK_SIZE} {} {} sha256 {} {} \
             8 use_fec_from_device {dev} fec_roots {} fec_blocks {} fec_start {}",
            self.data_blocks,
            self.hash_start,
            self.root_hash,
            self.salt,
            self.fec_roots,
            // FEC covers every block before its area: the data, then the tree.
            self.fec_start,
            self.fec_start,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value() -> String {
        format!("{},{},836,836,844,2", "cd".repeat(32), "07".repeat(32))
    }

    #[test]
    fn the_loaders_value_gives_the_table_veritysetup_would() {
        let p = Params::parse(&value()).unwrap();
        assert_eq!(p.sectors(), 836 * 8);
        assert_eq!(
            p.target_params("254:4"),
            format!(
                "1 254:4 254:4 4096 4096 836 836 sha256 {} {} 8 use_fec_from_device 254:4 \
                 fec_roots 2 fec_blocks 844 fec_start 844",
                "cd".repeat(32),
                "07".repeat(32)
            )
        );
    }

    #[test]
    fn a_root_hash_alone_is_no_geometry_and_anything_else_is_refused() {
        let root = "cd".repeat(32);
        assert_eq!(
            Params::parse(&root),
            Err(TableError::NoGeometry(root.clone()))
        );
        let salt = "07".repeat(32);
        for (bad, why) in [
            ("", "1 fields"),
            ("unreadable", "1 fields"),
            (&*format!("{root},{salt},836,836,844"), "5 fields"),
            (
                &*format!("AB{},{salt},836,836,844,2", &root[2..]),
                "root hash",
            ),
            (&*format!("{root},0,836,836,844,2"), "salt"),
            (&*format!("{root},{salt},-1,836,844,2"), "data blocks '-1'"),
            (&*format!("{root},{salt},836,835,844,2"), "in order"),
            (&*format!("{root},{salt},836,844,844,2"), "in order"),
            (&*format!("{root},{salt},0,1,2,2"), "in order"),
            (
                &*format!("{root},{salt},836,836,844,99999999999"),
                "out of range",
            ),
            (&*format!("{root},{salt},836,836,{},2", u64::MAX), "beyond"),
            ("\u{1b}[2J", "1 fields"),
        ] {
            let e = Params::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert!(!e.contains('\u{1b}'), "escaped: {e}");
        }
    }
}
