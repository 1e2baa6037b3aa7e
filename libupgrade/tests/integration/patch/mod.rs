//! Per-pair patches (`libupgrade::patch`), one test binary: the plain kind and every refusal
//! (`plain`), squashfs patches against real mksquashfs images (`squashfs`).

mod plain;
mod squashfs;

/// Deterministic incompressible bytes (xorshift) for `seed`.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}
