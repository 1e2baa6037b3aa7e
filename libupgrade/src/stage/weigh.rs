//! Bytes or time: whether a listed patch or the chunk plan stages an artifact sooner. Pure.
//!
//! A patch fetches fewer bytes than chunks (the planner lists it only then), but a squashfs
//! patch makes the node recompress every block it rebuilds: on a fast link the chunks finish
//! first (the major pair of `just bench-delta`: 71 s of recompression against under a second
//! of chunks on localhost). The planner estimates both ways:
//! - chunks: the chunk plan's bytes over the link rate;
//! - patch: the patch's bytes over the link rate, plus the blocks the manifest says the node
//!   recompresses (`PatchRef::blocks`, written by `release create`) × the block size over the
//!   recompression rate at the patch's level ([`recompress_rate`]) on up to
//!   [`crate::patch::workers`] threads, plus the patch's output decoded at
//!   [`DECODE_RATE`].
//!
//! The link rate is the one the node is told (`--max-rate`, the slowest rate of the stage
//! windows: the thin-link settings) or, failing that, the one it measured on the stage's own
//! metadata (the chunk indexes, when they add up to [`MEASURE_MIN`]: a smaller transfer is all
//! latency). A measured rate is a lower bound (it includes the requests' latency), so a
//! borderline case keeps the patch's bytes. With no rate, or a patch that names no block
//! count (listed by an earlier `release create`), the rule is the fewest bytes, as before.
//!
//! [`Prefer`] overrides: `bytes` always takes the patch (fewest bytes), `time` always the
//! sooner way, by the told rate or else the measured one. The default `auto` weighs time by a
//! told rate only, and keeps the fewest bytes under a byte budget (`--max-bytes`, the agent's
//! daily quota), where bytes are what is scarce.
//!
//! Why `auto` ignores a measured rate: a told rate gives the same verdict on every run, so
//! `--plan-only` (or the agent's preview) and the stage that follows move exactly the same
//! bytes; two measurements of the same link differ, and a verdict near the boundary could
//! flip between the preview and the stage.

use serde::{Deserialize, Serialize};

/// What a stage weighs first when a patch fetches fewer bytes than chunks but may take
/// longer (`upgrade --prefer`, [`crate::StageOptions::prefer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Prefer {
    /// The sooner way at a told link rate; the fewest bytes with no rate told or under a byte
    /// budget.
    #[default]
    Auto,
    /// The fewest bytes: a listed patch whenever it fetches fewer than chunks.
    Bytes,
    /// The sooner way, at a told or else a measured link rate, even under a byte budget.
    Time,
}

/// The link rate the planner weighs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkRate {
    /// Bytes per second.
    pub bytes_per_sec: u64,
    /// Told (`--max-rate`, a stage window's rate) rather than measured.
    pub told: bool,
}

/// Transfers smaller than this do not measure a link (they are latency).
pub const MEASURE_MIN: u64 = 256 << 10;

/// Bytes per second a node decodes a patch's output at (zstd frames, base reads, the
/// target's hashing): measured ~300 MB/s on one shared core here; 200 MB/s kept.
pub const DECODE_RATE: f64 = 200e6;

/// Uncompressed bytes per second one thread recompresses squashfs blocks at, by zstd level.
/// Measured on this project's build machine (zstd 1.5.4, 8 MB of binaries cut into 128 KiB
/// blocks, each compressed alone as mksquashfs does, CPU time of one core, 2026-12-05): level
/// 3 ~270 MB/s, 6 ~100, 9 ~73, 12 ~19, 15 7.6, 16 5.8, 19 2.8, 22 2.7.
pub fn recompress_rate(level: i32) -> f64 {
    match level {
        ..=3 => 250e6,
        4..=6 => 100e6,
        7..=9 => 70e6,
        10..=12 => 19e6,
        13..=15 => 7.5e6,
        16..=18 => 5.5e6,
        _ => 2.7e6,
    }
}

/// What applying one patch costs the node's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyWork {
    /// Blocks it recompresses (`PatchRef::blocks`; None: not said).
    pub blocks: Option<u64>,
    /// The target's squashfs block size (the patch header's; 0 for a plain patch).
    pub block_size: u32,
    /// The zstd level it recompresses at (the patch header's).
    pub level: i32,
    /// The artifact's size (decoded, hashed and written either way).
    pub target_size: u64,
    /// Threads that recompress.
    pub workers: usize,
}

/// Seconds the node spends applying a patch, when the patch says how many blocks it
/// recompresses.
pub fn apply_secs(w: &ApplyWork) -> Option<f64> {
    let blocks = w.blocks?;
    let recompress = (blocks as f64 * f64::from(w.block_size))
        / recompress_rate(w.level)
        / w.workers.max(1) as f64;
    Some(recompress + w.target_size as f64 / DECODE_RATE)
}

/// Which way an artifact goes, and why (said in the log, the preview and `--plan-only`).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Use the patch (else the chunk plan).
    pub patch: bool,
    /// Why, for people.
    pub why: String,
}

/// What [`weigh`] compares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ways {
    /// Bytes the chunk plan fetches.
    pub chunk_fetch: u64,
    /// Bytes the patch fetches.
    pub patch_fetch: u64,
    /// Seconds the patch's apply takes (None: unknown).
    pub apply_secs: Option<f64>,
}

/// The patch or the chunks, under `prefer`, with a byte `budget` set or not, over `link`.
pub fn weigh(prefer: Prefer, budget: bool, link: Option<LinkRate>, w: Ways) -> Verdict {
    let bytes = |why: String| Verdict { patch: true, why };
    let mb = |b: u64| crate::units::Size(b).to_string();
    match prefer {
        Prefer::Bytes => return bytes("fewest bytes (prefer bytes)".into()),
        Prefer::Auto if budget => {
            return bytes("fewest bytes (a byte budget is set; --prefer time weighs time)".into())
        }
        _ => {}
    }
    let link = link.filter(|l| l.bytes_per_sec > 0);
    let Some(link) = link.filter(|l| l.told || prefer == Prefer::Time) else {
        return bytes(
            match link {
                Some(_) => {
                    "fewest bytes (no link rate told; --prefer time weighs the measured one)"
                }
                None => "fewest bytes (no link rate told or measured to weigh time by)",
            }
            .into(),
        );
    };
    let Some(apply) = w.apply_secs else {
        return bytes(
            "fewest bytes (the release names no block count to weigh the apply by)".into(),
        );
    };
    let rate = link.bytes_per_sec as f64;
    let chunks = w.chunk_fetch as f64 / rate;
    let patch = w.patch_fetch as f64 / rate + apply;
    let how = if link.told { "told" } else { "measured" };
    let said = format!(
        "at {}/s ({how}): chunks {} ≈ {}, patch {} + ≈ {} to apply ≈ {}",
        mb(link.bytes_per_sec),
        mb(w.chunk_fetch),
        secs(chunks),
        mb(w.patch_fetch),
        secs(apply),
        secs(patch)
    );
    if chunks < patch {
        Verdict {
            patch: false,
            why: format!("chunks finish sooner {said}"),
        }
    } else {
        Verdict {
            patch: true,
            why: format!("patch finishes sooner {said}"),
        }
    }
}

/// Seconds for people: milliseconds below a tenth of a second.
fn secs(s: f64) -> String {
    match s < 0.1 {
        true => format!("{:.0} ms", s * 1000.0),
        false => format!("{s:.1} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ways(chunk_fetch: u64, patch_fetch: u64, apply: Option<f64>) -> Ways {
        Ways {
            chunk_fetch,
            patch_fetch,
            apply_secs: apply,
        }
    }

    const FAST: Option<LinkRate> = Some(LinkRate {
        bytes_per_sec: 100_000_000,
        told: true,
    });
    const SLOW: Option<LinkRate> = Some(LinkRate {
        bytes_per_sec: 250_000,
        told: false,
    });

    #[test]
    fn the_major_pair_takes_chunks_on_a_fast_link_and_the_patch_on_a_thin_one() {
        // The major pair of `just bench-delta`: chunks 137.7 MB, patch 93.0 MB and 71 s.
        let major = ways(137_700_000, 93_000_000, Some(71.0));
        let v = weigh(Prefer::Auto, false, FAST, major);
        assert!(!v.patch, "{v:?}");
        assert!(
            v.why.starts_with("chunks finish sooner") && v.why.contains("told"),
            "{}",
            v.why
        );
        let v = weigh(Prefer::Time, false, SLOW, major);
        assert!(v.patch && v.why.contains("(measured)"), "{v:?}");
        let v = weigh(Prefer::Auto, false, SLOW, major);
        assert!(
            v.patch && v.why.contains("--prefer time weighs the measured one"),
            "{v:?}"
        );
        let fast_measured = Some(LinkRate {
            bytes_per_sec: 100_000_000,
            told: false,
        });
        assert!(
            weigh(Prefer::Auto, false, fast_measured, major).patch,
            "auto goes by a told rate only"
        );
        assert!(!weigh(Prefer::Time, false, fast_measured, major).patch);
        // The monthly pair: 14.4 MB of chunks against 2.6 MB and 5.5 s.
        let monthly = ways(14_400_000, 2_600_000, Some(5.5));
        assert!(!weigh(Prefer::Time, false, FAST, monthly).patch);
        let at_2m = Some(LinkRate {
            bytes_per_sec: 2_000_000,
            told: true,
        });
        assert!(weigh(Prefer::Time, false, at_2m, monthly).patch);
    }

    #[test]
    fn bytes_win_when_asked_under_a_budget_or_when_time_cannot_be_weighed() {
        let major = ways(137_700_000, 93_000_000, Some(71.0));
        for (prefer, budget, link, w) in [
            (Prefer::Bytes, false, FAST, major),
            (Prefer::Auto, true, FAST, major),
            (Prefer::Auto, false, None, major),
            (Prefer::Time, false, None, major),
            (
                Prefer::Auto,
                false,
                FAST,
                ways(137_700_000, 93_000_000, None),
            ),
        ] {
            let v = weigh(prefer, budget, link, w);
            assert!(
                v.patch && v.why.starts_with("fewest bytes"),
                "{prefer:?} {budget} {v:?}"
            );
        }
        assert!(
            !weigh(Prefer::Time, true, FAST, major).patch,
            "--prefer time weighs time under a budget too"
        );
    }

    #[test]
    fn the_reason_names_both_estimates_in_readable_units() {
        let v = weigh(
            Prefer::Time,
            false,
            FAST,
            ways(150_000, 40_000, Some(0.012)),
        );
        assert!(!v.patch);
        assert!(
            v.why
                .ends_with("chunks 146.5 KiB ≈ 2 ms, patch 39.1 KiB + ≈ 12 ms to apply ≈ 12 ms"),
            "{}",
            v.why
        );
        let v = weigh(
            Prefer::Time,
            false,
            SLOW,
            ways(137_700_000, 93_000_000, Some(71.0)),
        );
        assert!(v.why.contains("≈ 550.8 s, patch"), "{}", v.why);
    }

    #[test]
    fn the_apply_estimate_counts_blocks_at_the_level_on_the_workers_and_the_decode() {
        let w = ApplyWork {
            blocks: Some(1000),
            block_size: 131_072,
            level: 15,
            target_size: 200_000_000,
            workers: 2,
        };
        let secs = apply_secs(&w).unwrap();
        let want = 1000.0 * 131_072.0 / 7.5e6 / 2.0 + 1.0;
        assert!((secs - want).abs() < 1e-9, "{secs} vs {want}");
        assert!(apply_secs(&ApplyWork { workers: 4, ..w }).unwrap() < secs);
        assert!(apply_secs(&ApplyWork { level: 19, ..w }).unwrap() > secs);
        assert_eq!(apply_secs(&ApplyWork { blocks: None, ..w }), None);
        // A plain patch recompresses nothing: decode only.
        let plain = ApplyWork {
            blocks: Some(0),
            block_size: 0,
            level: 0,
            target_size: 8_000_000,
            workers: 1,
        };
        assert!((apply_secs(&plain).unwrap() - 0.04).abs() < 1e-9);
    }
}
