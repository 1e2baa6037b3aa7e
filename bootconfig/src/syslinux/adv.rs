//! The ADV (auxiliary data vector) at the end of `ldlinux.sys`: two checksummed 512-byte
//! copies, and the boot-once record `extlinux --once` writes (byte-identical, checked against
//! the real extlinux in tests/integration/extlinux_real.rs).

use byteorder::{ByteOrder, LittleEndian as LE};

/// Size of one ADV copy; the ADV is two copies at the end of `ldlinux.sys`.
pub const ADV_SIZE: usize = 512;
const ADV_LEN: usize = ADV_SIZE - 3 * 4;
const ADV_MAGIC1: u32 = 0x5a2d_2fa5;
const ADV_MAGIC2: u32 = 0xa304_1767;
const ADV_MAGIC3: u32 = 0xdd28_bf64;
/// ADV tag of the boot-once command line.
pub const ADV_BOOTONCE: u8 = 1;

fn get32(b: &[u8], i: usize) -> u32 {
    LE::read_u32(&b[i..])
}

/// The ADV: two 512-byte copies as stored at the end of `ldlinux.sys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adv(pub [u8; 2 * ADV_SIZE]);

impl Adv {
    /// An empty, valid ADV (what `extlinux --reset-adv` writes).
    pub fn empty() -> Self {
        let mut a = Adv([0; 2 * ADV_SIZE]);
        a.seal();
        a
    }

    /// Whether one 512-byte copy carries both magics and a correct checksum.
    pub fn copy_valid(copy: &[u8]) -> bool {
        if copy.len() != ADV_SIZE
            || get32(copy, 0) != ADV_MAGIC1
            || get32(copy, ADV_SIZE - 4) != ADV_MAGIC3
        {
            return false;
        }
        (4..ADV_SIZE - 4)
            .step_by(4)
            .fold(0u32, |c, i| c.wrapping_add(get32(copy, i)))
            == ADV_MAGIC2
    }

    /// The ADV the loader and `extlinux` work with: copy 0 if valid, else copy 1, else empty
    /// (`valid` false). The result has both copies equal.
    pub fn load(raw: &[u8; 2 * ADV_SIZE]) -> (Adv, bool) {
        for c in 0..2 {
            let copy = &raw[c * ADV_SIZE..(c + 1) * ADV_SIZE];
            if Self::copy_valid(copy) {
                let mut a = [0; 2 * ADV_SIZE];
                a[..ADV_SIZE].copy_from_slice(copy);
                a[ADV_SIZE..].copy_from_slice(copy);
                return (Adv(a), true);
            }
        }
        (Adv::empty(), false)
    }

    /// Set magics and checksum of copy 0 and mirror it into copy 1.
    fn seal(&mut self) {
        let b = &mut self.0;
        b[0..4].copy_from_slice(&ADV_MAGIC1.to_le_bytes());
        let csum = (8..ADV_SIZE - 4)
            .step_by(4)
            .fold(ADV_MAGIC2, |c, i| c.wrapping_sub(get32(b, i)));
        b[4..8].copy_from_slice(&csum.to_le_bytes());
        b[ADV_SIZE - 4..ADV_SIZE].copy_from_slice(&ADV_MAGIC3.to_le_bytes());
        let (c0, c1) = b.split_at_mut(ADV_SIZE);
        c1.copy_from_slice(c0);
    }

    /// The data of `tag`, as the loader's lookup finds it.
    pub fn get(&self, tag: u8) -> Option<&[u8]> {
        let data = &self.0[8..8 + ADV_LEN];
        let mut p = 0;
        while p + 2 <= ADV_LEN {
            let (t, len) = (data[p], data[p + 1] as usize);
            if t == 0 || p + 2 + len > ADV_LEN {
                return None;
            }
            if t == tag {
                return Some(&data[p + 2..p + 2 + len]);
            }
            p += 2 + len;
        }
        None
    }

    /// Replace (or with empty `value`, delete) `tag`, with the same byte result as syslinux's
    /// installer: the tag is removed where it was, appended after the others, the rest zeroed.
    pub fn set(&mut self, tag: u8, value: &[u8]) -> Result<(), String> {
        if tag == 0 {
            return Err("ADV tag 0 is the end marker".into());
        }
        if value.len() > 255 {
            return Err(format!(
                "ADV item of {} bytes: at most 255 fit",
                value.len()
            ));
        }
        let mut tmp = [0u8; ADV_LEN];
        tmp.copy_from_slice(&self.0[8..8 + ADV_LEN]);
        // `left`: room from `p` on; `rleft`: bytes from `p` on still to read. A deleted item
        // moves the rest down and leaves stale bytes at the end, which are not read again
        // (syslinux_setadv's `rleft`).
        let (mut left, mut rleft) = (ADV_LEN, ADV_LEN);
        let mut p = 0;
        while rleft >= 2 {
            let (ptag, plen) = (tmp[p], tmp[p + 1] as usize + 2);
            if ptag == 0 {
                break;
            }
            if ptag == tag {
                if plen >= rleft {
                    break;
                }
                tmp.copy_within(p + plen..p + rleft, p);
                rleft -= plen;
            } else {
                if plen > rleft {
                    break;
                }
                left -= plen;
                rleft -= plen;
                p += plen;
            }
        }
        if !value.is_empty() {
            if left < value.len() + 2 {
                return Err(format!(
                    "ADV full: {left} bytes left, {} needed",
                    value.len() + 2
                ));
            }
            tmp[p] = tag;
            tmp[p + 1] = value.len() as u8;
            tmp[p + 2..p + 2 + value.len()].copy_from_slice(value);
            p += value.len() + 2;
            left -= value.len() + 2;
        }
        tmp[p..p + left].fill(0);
        self.0[8..8 + ADV_LEN].copy_from_slice(&tmp);
        self.seal();
        Ok(())
    }

    /// The pending boot-once command line's first word, if any.
    pub fn boot_once(&self) -> Option<String> {
        let d = self.get(ADV_BOOTONCE)?;
        let s = String::from_utf8_lossy(d);
        s.split_whitespace().next().map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ADV whose items fill the whole data area, the last item's data ending in `tail`.
    fn full(tail: [u8; 3]) -> Adv {
        let mut area = vec![ADV_BOOTONCE, 1, b'a', 2, 252];
        area.extend([0xaa; 252]);
        area.extend([3, 241]);
        area.extend([0xbb; 238]);
        area.extend(tail);
        assert_eq!(area.len(), ADV_LEN);
        let mut a = Adv([0; 2 * ADV_SIZE]);
        a.0[8..8 + ADV_LEN].copy_from_slice(&area);
        a.seal();
        a
    }

    #[test]
    fn set_in_a_full_adv_reads_only_what_is_left_like_syslinux_setadv() {
        // Deleting the old boot-once moves the other items down; the bytes left behind at the
        // end are stale copies and must not be read as items (syslinux_setadv counts them
        // out with `rleft`): here they would take the room the new record needs.
        let mut a = full([5, 0, 0]);
        a.set(ADV_BOOTONCE, b"b").expect("syslinux_setadv fits it");
        let mut want = vec![2, 252];
        want.extend([0xaa; 252]);
        want.extend([3, 241]);
        want.extend([0xbb; 238]);
        want.extend([5, 0, 0]);
        want.extend([ADV_BOOTONCE, 1, b'b']);
        assert_eq!(&a.0[8..8 + ADV_LEN], &want[..]);
        // Clearing the boot-once zeroes the stale tail instead of keeping it as an item.
        let mut a = full([5, 0, 0]);
        a.set(ADV_BOOTONCE, b"").unwrap();
        assert_eq!(&a.0[8 + ADV_LEN - 3..8 + ADV_LEN], &[0, 0, 0]);
        assert_eq!(a.get(5), None, "no item made of stale bytes");
    }
}
