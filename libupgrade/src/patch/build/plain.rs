//! Plain patches: the target as zstd patch-from frames of base windows, in order.

use super::Writer;
use crate::patch::codec::compress_from;
use crate::patch::ops::{Op, MAX_REF, MAX_SPAN};
use crate::patch::PatchError;

/// Where segment `[start, end)` of a target looks in a base of `base_len` bytes: the whole
/// base when it fits in [`MAX_REF`], else a [`MAX_REF`] window centred on the same offsets.
pub fn window(start: u64, end: u64, base_len: u64) -> (u64, u64) {
    let max = MAX_REF as u64;
    if base_len <= max {
        return (0, base_len);
    }
    let margin = (max - (end - start)) / 2;
    let lo = start.saturating_sub(margin).min(base_len - max);
    (lo, lo + max)
}

/// Write Delta ops for `target`, each at most [`MAX_SPAN`] bytes, against `base`.
pub fn delta_ops(
    base: &[u8],
    target: &[u8],
    target_off: u64,
    w: &mut Writer<'_>,
) -> Result<(), PatchError> {
    for (i, seg) in target.chunks(MAX_SPAN).enumerate() {
        let start = target_off + (i * MAX_SPAN) as u64;
        let (lo, hi) = window(start, start + seg.len() as u64, base.len() as u64);
        let reference = &base[lo as usize..hi as usize];
        let frame = compress_from(reference, seg).map_err(|code| PatchError::Zstd {
            what: format!("target bytes {start}+{}", seg.len()),
            code,
        })?;
        w.op(&Op::Delta {
            base_off: lo,
            base_len: reference.len() as u32,
            len: seg.len() as u32,
            frame,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_segment_and_stay_in_the_base() {
        let max = MAX_REF as u64;
        assert_eq!(window(0, 10, 100), (0, 100));
        for (start, end, base) in [
            (0, 16 << 20, 200 << 20),
            (100 << 20, 116 << 20, 200 << 20),
            (190 << 20, 206 << 20, 200 << 20),
            (300 << 20, 301 << 20, 60 << 20),
        ] {
            let (lo, hi) = window(start, end, base);
            assert_eq!(hi - lo, max, "{start}..{end} of {base}");
            assert!(hi <= base);
            if end <= base {
                assert!(lo <= start && end <= hi, "{start}..{end} in {lo}..{hi}");
            }
        }
    }
}
