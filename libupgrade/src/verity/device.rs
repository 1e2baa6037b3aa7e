//! A [`BlockDevice`] over files: the data, the tree and the FEC area each at an offset of a
//! file (one partition holding all three, or a rootfs file and a verity file beside it).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{BlockDevice, BLOCK_SIZE};

/// Where the data, tree and FEC area of one verity device are.
#[derive(Debug, Clone)]
pub struct FileDevice {
    /// The file holding the data blocks, and their offset.
    pub data: (Arc<File>, u64),
    /// Data blocks: block `i` at or past it is tree block `i - data_blocks`.
    pub data_blocks: u64,
    /// The file holding the tree, and its offset.
    pub hash: (Arc<File>, u64),
    /// The file holding the FEC area, and its offset.
    pub fec: (Arc<File>, u64),
}

impl FileDevice {
    /// Make everything written durable (each file once).
    pub fn sync(&self) -> std::io::Result<()> {
        self.data.0.sync_data()?;
        if !Arc::ptr_eq(&self.data.0, &self.hash.0) {
            self.hash.0.sync_data()?;
        }
        if !Arc::ptr_eq(&self.hash.0, &self.fec.0) {
            self.fec.0.sync_data()?;
        }
        Ok(())
    }

    fn place(&self, i: u64) -> (&File, u64) {
        if i < self.data_blocks {
            (&self.data.0, self.data.1 + i * BLOCK_SIZE)
        } else {
            (
                &self.hash.0,
                self.hash.1 + (i - self.data_blocks) * BLOCK_SIZE,
            )
        }
    }
}

impl BlockDevice for FileDevice {
    fn read_block(&self, i: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let (f, at) = self.place(i);
        f.read_exact_at(buf, at)
    }
    fn write_block(&self, i: u64, buf: &[u8]) -> std::io::Result<()> {
        let (f, at) = self.place(i);
        f.write_all_at(buf, at)
    }
    fn read_fec(&self, pos: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.fec.0.read_exact_at(buf, self.fec.1 + pos)
    }
    fn write_fec(&self, pos: u64, buf: &[u8]) -> std::io::Result<()> {
        self.fec.0.write_all_at(buf, self.fec.1 + pos)
    }
}
