//! The stage plan: a pure decision, from the target slot's record, the download checkpoint
//! and what the preflight found on the server, of what a stage run does — nothing (the slot
//! already holds this release), or, per artifact, skip it (an interrupted run completed it),
//! write it chunk by chunk (it has a usable chunk index), or stream it whole from a position.
//! Like RAUC's install plans: made before anything is written, one per part
//! ([`super::parts::PartPlan`]), then each handed to its executor. Tested without disks.
//!
//! A chunked artifact may instead be rebuilt from the running slot's copy by a per-pair patch
//! the signed manifest lists ([`patch_candidates`]): only when the patch's base is exactly what
//! the running slot holds, its kind is one this build applies, and it fetches fewer bytes than
//! the artifact's chunk plan. The patch's output is still checked chunk by chunk against the
//! signed index, so the chunk plan stays the fallback.
//!
//! The same plan, with each chunked artifact's chunk plan, prices the run before its first
//! byte ([`cost`]): what will be fetched and what is reused. `upgrade --plan-only` prints it,
//! the agent publishes it, and the run that follows moves exactly those bytes (the executors
//! carry out these plans, they do not decide again).

use bootconfig::Slot;
use serde::{Deserialize, Serialize};

use crate::chunk::plan::Plan as ChunkPlan;
use crate::manifest::{Part, PatchRef, PATCH_KINDS};
use crate::net::checkpoint::Partial;
use crate::state::{SlotRecord, SlotState};

/// How one part is written, as priced ([`cost`]) and reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// Written and verified by an interrupted run of this release into this slot, or a
    /// payload the store already holds (its object's name is its verified sha256).
    Done,
    /// Chunk by chunk from its index: kept, copied from the running slot or fetched.
    Chunked,
    /// Rebuilt by patch number `patch` of the artifact's manifest entry applied to the running
    /// slot's copy, fetching `fetch` bytes of it (what an interrupted attempt kept is not
    /// fetched again); every chunk of its output checked against the index, the chunk plan
    /// for what does not match.
    Patched { patch: usize, fetch: u64 },
    /// Streamed whole, from byte `resume_at` (a checkpointed position of an interrupted run).
    Stream { resume_at: u64 },
}

/// What the plan knows of one part before deciding how it is written; `I` is its chunk
/// index (what a chunked part is planned from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartFacts<I> {
    /// Which part.
    pub part: Part,
    /// Its chunk index, when it has one the server can serve by range.
    pub index: Option<I>,
    /// Whether the payload store holds this part, its bytes proven
    /// ([`crate::payload::prove`]): Some(true) costs nothing; Some(false) is fetched even
    /// when an interrupted run had finished it (the object changed or was moved aside since).
    /// None: not a part of the store (a slot file).
    pub stored: Option<bool>,
}

/// The first decision for one part: nothing to do, chunks from its index `I`, or a stream.
/// (Whether a patch beats the chunks is decided after, with the chunk plan's price.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<I> {
    /// See [`How::Done`].
    Done,
    /// See [`How::Chunked`]: carries the index it is planned from.
    Chunked(I),
    /// See [`How::Stream`].
    Stream { resume_at: u64 },
}

/// The slot already holds exactly this release (staged or on trial): nothing to do.
pub fn staged_already(target: &SlotRecord, manifest_sha256: &str) -> bool {
    matches!(target.state, SlotState::Staged | SlotState::Trying)
        && target.manifest_sha256.as_deref() == Some(manifest_sha256)
}

/// The checkpoint a stage of release `manifest_sha256` into `slot`, whose record says
/// `state`, continues: `checkpoint` when it is of this release into this slot and the slot is
/// still invalid (a run was interrupted after invalidating it). Then what the target holds is
/// re-verified; otherwise the slot is invalidated first.
pub fn resumed<'p>(
    slot: Slot,
    state: SlotState,
    manifest_sha256: &str,
    checkpoint: Option<&'p Partial>,
) -> Option<&'p Partial> {
    checkpoint.filter(|p| {
        p.slot == slot && p.manifest_sha256 == manifest_sha256 && state == SlotState::Invalid
    })
}

/// How the part `f` says is written, when `resumed` is the checkpoint continued
/// ([`resumed`]): done (the store holds it, or the interrupted run finished it), chunked from
/// its index, else streamed from where the interrupted run was in it.
pub fn decide<I>(f: PartFacts<I>, resumed: Option<&Partial>) -> (Part, Decision<I>) {
    let a = f.part;
    let done = match f.stored {
        Some(held) => held,
        None => resumed.is_some_and(|p| p.done.contains(&a)),
    };
    let how = if done {
        Decision::Done
    } else if let Some(index) = f.index {
        Decision::Chunked(index)
    } else {
        Decision::Stream {
            resume_at: match resumed.and_then(|p| p.current.as_ref()) {
                Some((ca, pos)) if *ca == a => *pos,
                _ => 0,
            },
        }
    };
    (a, how)
}

/// What the node has proven of the running slot's copy of an artifact: its first `size`
/// bytes hash to `sha256`. From the running release's kept manifest (the whole artifact), or
/// from hashing the slot's range when no kept manifest names the running build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proven {
    /// Bytes from the start of the slot's copy.
    pub size: u64,
    /// Lower-case hex sha256 of those bytes.
    pub sha256: String,
}

/// The bytes patch `p` would still fetch (`held`: what an interrupted attempt holds), when
/// it is of a kind this build applies and fetches fewer bytes than the chunk plan.
fn worth_fetching(p: &PatchRef, held: u64, chunk_fetch: u64) -> Option<u64> {
    let fetch = p.size - held.min(p.size);
    (PATCH_KINDS.contains(&p.kind.as_str()) && fetch < chunk_fetch).then_some(fetch)
}

/// The patches of one artifact worth trying, best first, with the bytes each would fetch:
/// those whose base is exactly what the node proved the running slot holds (`running`; no
/// patch without a proof), of a kind this build applies, fetching fewer bytes than the
/// artifact's chunk plan (`chunk_fetch`). `held[i]`: bytes of patch `i` an interrupted
/// attempt already holds (not fetched again).
pub fn patch_candidates(
    patches: &[PatchRef],
    running: &[Proven],
    held: &[u64],
    chunk_fetch: u64,
) -> Vec<(usize, u64)> {
    let mut out: Vec<(usize, u64)> = patches
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            running
                .iter()
                .any(|r| r.size == p.base.size && r.sha256 == p.base.sha256)
        })
        .filter_map(|(i, p)| {
            worth_fetching(p, held.get(i).copied().unwrap_or(0), chunk_fetch).map(|f| (i, f))
        })
        .collect();
    out.sort_by_key(|&(i, fetch)| (fetch, i));
    out
}

/// The base sizes worth proving by hashing the running slot's copy, when no kept manifest
/// names the running build: those of the patches [`patch_candidates`] could pick on a proof,
/// whose base fits in the `readable` bytes of the slot. Ascending, each once (one pass over
/// the slot hashes every prefix).
pub fn sizes_to_prove(
    patches: &[PatchRef],
    held: &[u64],
    chunk_fetch: u64,
    readable: u64,
) -> Vec<u64> {
    let mut sizes: Vec<u64> = patches
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            p.base.size <= readable
                && worth_fetching(p, held.get(*i).copied().unwrap_or(0), chunk_fetch).is_some()
        })
        .map(|(_, p)| p.base.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// What one part of a stage run costs, known before its first byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactCost {
    /// Which part (`rootfs`, `payload:<name>` in JSON, as [`Part`] writes it).
    pub artifact: Part,
    /// The artifact's size (the signed manifest's).
    pub size: u64,
    /// Bytes the run will fetch over the network (chunk payload or the stream's rest).
    pub fetch: u64,
    /// Bytes it will not fetch: kept from an earlier attempt or copied from a local file.
    pub reuse: u64,
    /// Range requests planned (0 for a stream, which is one request plus re-opens).
    pub requests: u64,
    /// The version whose copy of the artifact a patch rebuilds it from (then `fetch` is the
    /// patch's bytes and `reuse` what it rebuilds locally); absent for every other way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_from: Option<String>,
    /// Why a listed patch was or was not taken, when one was weighed against the chunks
    /// (bytes or time, `stage::weigh`); absent when no patch could be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
}

/// The price of part `artifact` (`size` bytes) written `how`, with its chunk plan when it is
/// chunked. A stream from `resume_at` fetches the rest of the file.
pub fn cost(artifact: Part, size: u64, how: How, chunks: Option<&ChunkPlan>) -> ArtifactCost {
    let (fetch, requests) = match (how, chunks) {
        (How::Done, _) => (0, 0),
        (How::Chunked, Some(p)) => (p.fetch_bytes, p.ranges.len() as u64),
        (How::Chunked, None) => (size, 1),
        (How::Patched { fetch, .. }, _) => (fetch, u64::from(fetch > 0)),
        (How::Stream { resume_at }, _) => (size - resume_at.min(size), 0),
    };
    ArtifactCost {
        artifact,
        size,
        fetch,
        reuse: size - fetch.min(size),
        requests,
        patch_from: None,
        choice: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Artifact, FileEntry};

    fn facts(has_index: [bool; 3]) -> Vec<PartFacts<()>> {
        Artifact::ALL
            .into_iter()
            .zip(has_index)
            .map(|(a, has_index)| PartFacts {
                part: a.into(),
                index: has_index.then_some(()),
                stored: None,
            })
            .collect()
    }

    /// Every part's decision, as the stage makes them one part at a time.
    #[derive(Debug)]
    struct WritePlan {
        resume: bool,
        steps: Vec<(Part, How)>,
    }

    fn plan_writes(
        slot: Slot,
        state: SlotState,
        sha: &str,
        checkpoint: Option<&Partial>,
        parts: &[PartFacts<()>],
    ) -> WritePlan {
        let resumed = resumed(slot, state, sha, checkpoint);
        WritePlan {
            resume: resumed.is_some(),
            steps: parts
                .iter()
                .map(|f| {
                    let (part, d) = decide(f.clone(), resumed);
                    let how = match d {
                        Decision::Done => How::Done,
                        Decision::Chunked(()) => How::Chunked,
                        Decision::Stream { resume_at } => How::Stream { resume_at },
                    };
                    (part, how)
                })
                .collect(),
        }
    }

    /// Each step's price, as the stage prices them one part at a time.
    fn cost(p: &WritePlan, sizes: &[u64], chunks: &[Option<&ChunkPlan>]) -> Vec<ArtifactCost> {
        p.steps
            .iter()
            .zip(sizes.iter().zip(chunks))
            .map(|((part, how), (size, chunks))| super::cost(part.clone(), *size, *how, *chunks))
            .collect()
    }

    fn partial(slot: Slot, sha: &str) -> Partial {
        Partial {
            slot,
            manifest_sha256: sha.into(),
            done: vec![Artifact::Rootfs.into()],
            current: Some((Artifact::Kernel.into(), 4096)),
            objects: Vec::new(),
            fetched: 0,
            reused: 0,
        }
    }

    #[test]
    fn a_fresh_stage_writes_everything_from_the_start() {
        let p = plan_writes(
            Slot::B,
            SlotState::Empty,
            "m",
            None,
            &facts([true, false, false]),
        );
        assert!(!p.resume);
        assert_eq!(
            p.steps,
            [
                (Artifact::Rootfs.into(), How::Chunked),
                (Artifact::Kernel.into(), How::Stream { resume_at: 0 }),
                (Artifact::Initrd.into(), How::Stream { resume_at: 0 }),
            ]
        );
    }

    #[test]
    fn an_interrupted_run_of_the_same_release_is_continued() {
        let cp = partial(Slot::B, "m");
        let p = plan_writes(
            Slot::B,
            SlotState::Invalid,
            "m",
            Some(&cp),
            &facts([false; 3]),
        );
        assert!(p.resume);
        assert_eq!(
            p.steps,
            [
                (Artifact::Rootfs.into(), How::Done),
                (Artifact::Kernel.into(), How::Stream { resume_at: 4096 }),
                (Artifact::Initrd.into(), How::Stream { resume_at: 0 }),
            ]
        );
    }

    #[test]
    fn a_checkpoint_of_another_release_slot_or_state_is_not_continued() {
        for (slot, state, sha) in [
            (Slot::A, SlotState::Invalid, "m"),
            (Slot::B, SlotState::Invalid, "other"),
            (Slot::B, SlotState::Bad, "m"),
        ] {
            let cp = partial(slot, sha);
            let p = plan_writes(Slot::B, state, "m", Some(&cp), &facts([false; 3]));
            assert!(!p.resume, "{slot} {state:?} {sha}");
            assert!(p
                .steps
                .iter()
                .all(|(_, h)| *h == How::Stream { resume_at: 0 }));
        }
    }

    #[test]
    fn cost_counts_done_as_reused_streams_from_their_position_and_chunks_by_their_plan() {
        use crate::chunk::plan::{FetchRange, Plan};
        let cp = partial(Slot::B, "m");
        let p = plan_writes(
            Slot::B,
            SlotState::Invalid,
            "m",
            Some(&cp),
            &facts([false, false, true]),
        );
        let chunks = Plan {
            actions: Vec::new(),
            ranges: vec![
                FetchRange {
                    first: 0,
                    end: 1,
                    start: 0,
                    stop: 100,
                };
                2
            ],
            stream: false,
            keep_bytes: 300,
            copy_bytes: 400,
            fetch_bytes: 200,
        };
        let c = cost(&p, &[1000, 10_000, 900], &[None, None, Some(&chunks)]);
        let row = |a: Artifact, size, fetch, requests| ArtifactCost {
            artifact: a.into(),
            size,
            fetch,
            reuse: size - fetch,
            requests,
            patch_from: None,
            choice: None,
        };
        assert_eq!(
            c,
            vec![
                row(Artifact::Rootfs, 1000, 0, 0),
                row(Artifact::Kernel, 10_000, 10_000 - 4096, 0),
                row(Artifact::Initrd, 900, 200, 2),
            ]
        );
    }

    fn entry(size: u64, sha: &str) -> FileEntry {
        FileEntry {
            path: "rootfs.squashfs".into(),
            size,
            sha256: sha.repeat(32),
            chunks: None,
            patches: Vec::new(),
        }
    }

    fn patch(base: &FileEntry, kind: &str, size: u64) -> PatchRef {
        PatchRef {
            base: crate::manifest::PatchBase {
                version: "v1".into(),
                size: base.size,
                sha256: base.sha256.clone(),
            },
            kind: kind.into(),
            path: format!("p{size}"),
            size,
            sha256: "cd".repeat(32),
            blocks: None,
        }
    }

    fn proven(e: &FileEntry) -> Vec<Proven> {
        vec![Proven {
            size: e.size,
            sha256: e.sha256.clone(),
        }]
    }

    #[test]
    fn a_patch_is_a_candidate_only_for_its_exact_base_a_known_kind_and_fewer_bytes() {
        let running = entry(1000, "aa");
        let other_build = entry(1000, "bb");
        let other_size = entry(999, "aa");
        let patches = vec![
            patch(&running, "squashfs", 300),
            patch(&other_build, "squashfs", 10),
            patch(&other_size, "squashfs", 10),
            patch(&running, "lz4diff", 10),
            patch(&running, "plain", 200),
            patch(&running, "plain", 600),
        ];
        let known = proven(&running);
        assert_eq!(
            patch_candidates(&patches, &known, &[], 500),
            vec![(4, 200), (0, 300)],
            "another base, a kind this build does not apply, or more than the chunks: never"
        );
        assert!(
            patch_candidates(&patches, &[], &[], 500).is_empty(),
            "nothing proven of the running slot"
        );
        assert!(patch_candidates(&patches, &known, &[], 200).is_empty());
        // What an interrupted attempt holds is not fetched again, and can tip the choice.
        assert_eq!(
            patch_candidates(&patches, &known, &[250, 0, 0, 0, 0, 0], 500),
            vec![(0, 50), (4, 200)]
        );
        assert_eq!(
            patch_candidates(&patches[..1], &known, &[999], 1),
            vec![(0, 0)],
            "held beyond the size counts as the whole patch"
        );
    }

    #[test]
    fn without_a_kept_manifest_the_bases_worth_hashing_are_the_candidates_sizes_once() {
        let a = entry(1000, "aa");
        let b = entry(1000, "bb");
        let small = entry(600, "ce");
        let big = entry(5000, "dd");
        let patches = vec![
            patch(&a, "squashfs", 300),
            patch(&b, "plain", 200),
            patch(&small, "squashfs", 100),
            patch(&big, "squashfs", 100),
            patch(&small, "lz4diff", 10),
            patch(&a, "plain", 900),
        ];
        assert_eq!(
            sizes_to_prove(&patches, &[], 500, 4096),
            vec![600, 1000],
            "each size once, ascending; not past the slot, nor for a patch that cannot win"
        );
        assert!(sizes_to_prove(&patches, &[], 50, 4096).is_empty());
        // The hashes of those prefixes then choose exactly as a kept manifest would.
        let hashed = vec![
            Proven {
                size: 600,
                sha256: "ee".repeat(32),
            },
            Proven {
                size: 1000,
                sha256: "bb".repeat(32),
            },
        ];
        assert_eq!(
            patch_candidates(&patches, &hashed, &[], 500),
            vec![(1, 200)]
        );
    }

    #[test]
    fn a_patched_step_costs_its_patch_bytes() {
        let mut p = plan_writes(
            Slot::B,
            SlotState::Empty,
            "m",
            None,
            &facts([true, false, false]),
        );
        p.steps[0].1 = How::Patched {
            patch: 0,
            fetch: 70,
        };
        let c = cost(&p, &[1000, 10, 10], &[None, None, None]);
        assert_eq!((c[0].fetch, c[0].reuse, c[0].requests), (70, 930, 1));
        p.steps[0].1 = How::Patched { patch: 0, fetch: 0 };
        let c = cost(&p, &[1000, 10, 10], &[None, None, None]);
        assert_eq!((c[0].fetch, c[0].reuse, c[0].requests), (0, 1000, 0));
    }

    #[test]
    fn a_payload_the_store_holds_costs_nothing_and_one_in_flight_resumes() {
        let mut parts = facts([true, true, true]);
        for (name, stored) in [("k3s", true), ("site", false), ("app", false)] {
            parts.push(PartFacts {
                part: Part::Payload(name.into()),
                index: None,
                stored: Some(stored),
            });
        }
        let mut cp = partial(Slot::B, "m");
        cp.current = Some((Part::Payload("site".into()), 700));
        // An interrupted run finished "app", but the store no longer proves it: fetched again.
        cp.done.push(Part::Payload("app".into()));
        let p = plan_writes(Slot::B, SlotState::Invalid, "m", Some(&cp), &parts);
        assert_eq!(
            p.steps[3..],
            [
                (Part::Payload("k3s".into()), How::Done),
                (Part::Payload("site".into()), How::Stream { resume_at: 700 }),
                (Part::Payload("app".into()), How::Stream { resume_at: 0 }),
            ]
        );
        let c = cost(&p, &[10, 10, 10, 5000, 1000, 300], &[None; 6]);
        let fetch: Vec<u64> = c.iter().map(|c| c.fetch).collect();
        assert_eq!(fetch[3..], [0, 300, 300]);
        assert_eq!(c[3].reuse, 5000, "the held object is reused whole");
    }

    #[test]
    fn staged_or_trying_with_the_same_manifest_is_already_staged() {
        let mut r = SlotRecord::empty();
        r.manifest_sha256 = Some("m".into());
        for (state, want) in [
            (SlotState::Staged, true),
            (SlotState::Trying, true),
            (SlotState::Good, false),
            (SlotState::Invalid, false),
        ] {
            r.state = state;
            assert_eq!(staged_already(&r, "m"), want, "{state:?}");
        }
        r.state = SlotState::Staged;
        assert!(!staged_already(&r, "other"));
    }
}
