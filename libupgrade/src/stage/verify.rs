//! Everything about a release checked before a byte of the slot is written: the manifest the
//! channel's signed metadata pins (then the targets role vouches for it) or else the signature
//! against the trust dir, the manifest, the architecture, the generation floor and the space
//! ([`release`]); then on the server every artifact's presence and size, every chunk
//! index and every boot script against the signed manifest ([`preflight`]).

use super::run::{Env, Verified};
use super::Release;
use super::{sha256_hex, StageOptions};
use crate::chunk::ChunkIndex;
use crate::error::{Error, Result};
use crate::manifest::{Arch, Manifest, ScriptFile, MANIFEST_FILE, SIGNATURE_FILE};
use crate::net::fetch::Source;
use crate::net::retry::retrying;
use crate::payload::kinds::{PartRef, Place, Room};
use crate::state::{SlotState, State};
use crate::trust::ManifestPin;
use bootconfig::Slot;

/// What the server holds of a verified release, checked before any write.
pub(super) struct Preflight {
    /// The boot scripts the release carries, checked against the manifest.
    pub scripts: Vec<(ScriptFile, Vec<u8>)>,
    /// The link rate the chunk indexes' downloads measured (bytes per second), when they add
    /// up to [`super::weigh::MEASURE_MIN`] (a lower bound: their requests' latency included).
    pub measured: Option<u64>,
}

/// One part of a verified release as the preflight found it.
pub(super) struct Probed<'m> {
    /// Which part, its signed entry and kind.
    pub part: PartRef<'m>,
    /// Its chunk index, when it has one and the server serves ranges.
    pub index: Option<ChunkIndex>,
    /// A payload the store already holds complete (nothing of it is read).
    pub stored: bool,
}

impl<'m> Probed<'m> {
    /// A payload the store holds.
    fn stored(part: PartRef<'m>) -> Self {
        Probed {
            part,
            index: None,
            stored: true,
        }
    }

    /// A part read whole (no usable chunk index).
    fn whole(part: PartRef<'m>) -> Self {
        Probed {
            part,
            index: None,
            stored: false,
        }
    }
}

/// The generation floor: never older than the running release, nor than a release already
/// staged (or on trial) in the target slot; the running generation again only as the very
/// same build (its manifest's sha256), since one generation names one build.
fn check_generation(st: &State, booted: Slot, m: &Manifest, sha256: &str) -> Result<()> {
    let running = st.slot(booted);
    if let Some(installed) = running.generation {
        if m.generation < installed {
            return Err(Error::Downgrade {
                version: m.version.clone(),
                found: m.generation,
                installed,
            });
        }
        if m.generation == installed {
            match running.manifest_sha256.as_deref() {
                Some(r) if r != sha256 => {
                    return Err(Error::SameGenerationOtherBuild {
                        version: m.version.clone(),
                        generation: installed,
                        found: sha256.to_string(),
                        running: r.to_string(),
                    })
                }
                Some(_) => {}
                // A slot written by an image builder that kept no manifest: which build runs
                // is unknown, so no build of this generation can be told to be the same one.
                None => {
                    return Err(Error::SameGenerationUnknownBuild {
                        version: m.version.clone(),
                        generation: installed,
                    })
                }
            }
        }
    }
    let target = st.slot(booted.other());
    if let (SlotState::Staged | SlotState::Trying, Some(staged)) = (target.state, target.generation)
    {
        if m.generation < staged {
            return Err(Error::OlderThanStaged {
                version: m.version.clone(),
                found: m.generation,
                staged,
                slot: booted.other(),
            });
        }
    }
    Ok(())
}

/// The manifest must be exactly the one the channel's targets role pins (arbitrary software,
/// mix-and-match); then the targets role is its signer (see [`crate::trust`]).
/// Every hash the targets list for it must match (TUF 5.7.3, as for the metadata files); an
/// algorithm this node cannot compute counts as a mismatch, not a pass.
fn check_pin(pin: &ManifestPin, mbytes: &[u8], mloc: &str) -> Result<String> {
    let refused = |expected: String, found: String| Error::ManifestPin {
        location: mloc.to_string(),
        from: pin.from.clone(),
        expected,
        found,
    };
    let found = sha256_hex(mbytes);
    if mbytes.len() as u64 != pin.length || found != pin.sha256 {
        return Err(refused(
            format!("{} bytes, sha256 {}", pin.length, pin.sha256),
            format!("{} bytes, sha256 {found}", mbytes.len()),
        ));
    }
    for (algorithm, want) in &pin.hashes {
        match crate::trust::meta::digest_hex(algorithm, mbytes) {
            Some(got) if got == *want => {}
            Some(got) => {
                return Err(refused(
                    format!("{algorithm} {want}"),
                    format!("{algorithm} {got}"),
                ))
            }
            None => {
                return Err(refused(
                    format!("{} {want}", algorithm.escape_debug()),
                    "a hash algorithm this node cannot compute".into(),
                ))
            }
        }
    }
    Ok(pin.vouched_by.clone())
}

/// Read and check the release `rel` for the slot that is not `booted`: its signature (or
/// the pin the channel's signed metadata gave), and that it is the version asked for.
pub(super) fn release(
    env: &Env,
    booted: Slot,
    st: &State,
    rel: &Release,
    opts: &StageOptions,
) -> Result<Verified> {
    let source = &rel.source;
    let target = booted.other();
    let mloc = source.location(MANIFEST_FILE);
    let mbytes = retrying(env.backoff(opts), || {
        source.read_small(MANIFEST_FILE, env.watch(opts))
    })?;
    let key = match &rel.pin {
        // The targets role vouches for exactly these bytes: no trust.d signature needed.
        Some(pin) => check_pin(pin, &mbytes, &mloc)?,
        None => check_signature(env, source, &mbytes, &mloc, opts)?,
    };
    let manifest = Manifest::parse(&mbytes).map_err(|source| Error::Manifest {
        location: mloc.clone(),
        source,
    })?;
    manifest
        .check_version_name()
        .and_then(|()| manifest.check_arch(Arch::host()))
        .map_err(|source| Error::Manifest {
            location: mloc.clone(),
            source,
        })?;
    if let Some(want) = &rel.version {
        if manifest.version != *want {
            return Err(Error::VersionMismatch {
                location: mloc,
                asked: want.clone(),
                found: manifest.version,
            });
        }
    }
    let sha256 = sha256_hex(&mbytes);
    if !opts.allow_downgrade {
        check_generation(st, booted, &manifest, &sha256)?;
    }
    check_space(env, target, &manifest)?;
    check_store(env, booted, &manifest)?;
    Ok(Verified {
        sha256,
        bytes: mbytes,
        manifest,
        key,
        location: mloc,
    })
}

/// The release's `manifest.sig` against the trust dir; returns the signing key's id.
fn check_signature(
    env: &Env,
    source: &Source,
    mbytes: &[u8],
    mloc: &str,
    opts: &StageOptions,
) -> Result<String> {
    let sig = retrying(env.backoff(opts), || {
        source.read_small(SIGNATURE_FILE, env.watch(opts))
    })
    .map_err(|e| Error::Signature {
        location: mloc.to_string(),
        what: format!("release is not signed ({SIGNATURE_FILE} cannot be read: {e})"),
    })?;
    let trust = opts.trust_dir.as_deref().unwrap_or(&env.cfg.trust_dir);
    let key = crate::signing::verify(mbytes, &sig, trust).map_err(|e| Error::Signature {
        location: mloc.to_string(),
        what: e.to_string(),
    })?;
    Ok(key.to_string())
}

/// Refuse what cannot fit before the slot is touched (a full disk is not a reason to
/// invalidate it). Slot files sharing one filesystem must fit together; the payloads'
/// room is the store's ([`check_store`]).
fn check_space(env: &Env, target: Slot, manifest: &Manifest) -> Result<()> {
    let mut shared_need = 0u64;
    for p in crate::payload::kinds::parts(manifest) {
        let Place::Slot(a) = p.kind.place else {
            continue;
        };
        let need = p.entry.size;
        let cap = env.layout.capacity(target, a)?;
        let shared = p.kind.room == Room::Shared;
        let need_here = if shared { shared_need + need } else { need };
        if shared {
            shared_need += need;
        }
        if need_here > cap {
            return Err(Error::NoSpace {
                artifact: a.into(),
                target: format!("slot {target}: {}", env.layout.place(target, a)),
                needed: need_here,
                available: cap,
            });
        }
    }
    Ok(())
}

/// Refuse a release whose payloads do not fit in the payload store beside the running
/// release's (its budget, then the state partition's free space), before anything is
/// written: naming the bytes needed, held and the budget.
fn check_store(env: &Env, booted: Slot, m: &Manifest) -> Result<()> {
    let Some(first) = crate::payload::kinds::stored_payloads(m).next() else {
        return Ok(());
    };
    let state_dir = &env.cfg.state_dir;
    let running = crate::slotfiles::manifest(state_dir, booted).unwrap_or_else(|e| {
        log::warn!("slot {booted}: {e}; its payloads are not counted in the budget");
        None
    });
    let u = crate::payload::check_budget(
        state_dir,
        m,
        running.as_ref(),
        env.cfg.payload_store_max_bytes,
    )?;
    // Partial objects of an interrupted attempt already take their room.
    let dir = crate::payload::objects_dir(state_dir);
    let probe = if dir.exists() {
        dir.as_path()
    } else {
        state_dir.as_path()
    };
    let free = crate::layout::free_bytes(probe).unwrap_or(u64::MAX);
    let partial: u64 = crate::payload::kinds::stored_payloads(m)
        .map(|p| {
            std::fs::metadata(dir.join(crate::layout::partial_name(&p.file.sha256)))
                .map_or(0, |x| x.len())
        })
        .sum();
    if u.needed > free.saturating_add(partial) {
        return Err(Error::NoSpace {
            artifact: crate::manifest::Part::Payload(first.name.clone()),
            target: format!("the payload store ({})", dir.display()),
            needed: u.needed,
            available: free.saturating_add(partial),
        });
    }
    Ok(())
}

/// Every file exists with the right size, every chunk index and boot script matches.
pub(super) fn preflight<'m>(
    env: &Env,
    source: &Source,
    m: &'m Manifest,
    opts: &StageOptions,
) -> Result<(Preflight, Vec<Probed<'m>>)> {
    let mut timed = (0u64, std::time::Duration::ZERO);
    let parts = probe(env, source, m, opts, &mut timed)?;
    let (bytes, took) = timed;
    let pre = Preflight {
        scripts: fetch_scripts(env, source, m, opts)?,
        measured: (bytes >= super::weigh::MEASURE_MIN && !took.is_zero())
            .then(|| (bytes as f64 / took.as_secs_f64()) as u64),
    };
    Ok((pre, parts))
}

/// Probe every artifact (exists, right size) and fetch and check every chunk index;
/// `timed` adds the indexes' bytes and download time.
fn probe<'m>(
    env: &Env,
    source: &Source,
    m: &'m Manifest,
    opts: &StageOptions,
    timed: &mut (u64, std::time::Duration),
) -> Result<Vec<Probed<'m>>> {
    let mut out = Vec::new();
    for p in crate::payload::kinds::parts(m) {
        let (a, e) = (&p.part, p.entry);
        if p.kind.place == Place::Store
            && crate::payload::holds(&env.cfg.state_dir, &e.sha256, e.size)
        {
            // Already in the store: nothing of it is read.
            out.push(Probed::stored(p));
            continue;
        }
        let probe = retrying(env.backoff(opts), || source.probe(&e.path))?;
        if probe.size != e.size {
            return Err(Error::Size {
                artifact: a.clone(),
                location: source.location(&e.path),
                expected: e.size,
                found: probe.size,
            });
        }
        let Some(r) = &e.chunks else {
            out.push(Probed::whole(p));
            continue;
        };
        if !probe.ranges {
            log::warn!(
                "{}: the server ignores Range requests; {a} is downloaded whole",
                source.location(&e.path)
            );
            out.push(Probed::whole(p));
            continue;
        }
        let loc = source.location(&r.path);
        let bad = |what: String| Error::ChunkIndex {
            artifact: a.clone(),
            location: loc.clone(),
            what,
        };
        let started = std::time::Instant::now();
        let bytes = retrying(env.backoff(opts), || {
            source.read_capped(&r.path, r.size, env.watch(opts))
        })?;
        timed.0 += bytes.len() as u64;
        timed.1 += started.elapsed();
        let sha = sha256_hex(&bytes);
        if bytes.len() as u64 > r.size {
            return Err(bad(format!(
                "larger than the {} bytes the signed manifest says",
                r.size
            )));
        }
        if bytes.len() as u64 != r.size || sha != r.sha256 {
            return Err(bad(format!(
                "{} bytes with sha256 {sha}, the signed manifest says {} bytes with sha256 {}",
                bytes.len(),
                r.size,
                r.sha256
            )));
        }
        let index = ChunkIndex::parse(&bytes).map_err(|e| bad(e.to_string()))?;
        if index.size() != e.size {
            return Err(bad(format!(
                "describes {} bytes, the manifest says {} ({}) has {}",
                index.size(),
                a,
                e.path,
                e.size
            )));
        }
        out.push(Probed {
            part: p,
            index: Some(index),
            stored: false,
        });
    }
    Ok(out)
}

/// Fetch every boot script the manifest names and check it against its signed size and
/// sha256 (they are small: read whole, capped at the signed size).
fn fetch_scripts(
    env: &Env,
    source: &Source,
    m: &Manifest,
    opts: &StageOptions,
) -> Result<Vec<(crate::manifest::ScriptFile, Vec<u8>)>> {
    let mut out = Vec::new();
    for sc in m.boot.iter().flat_map(|b| &b.scripts) {
        let bytes = retrying(env.backoff(opts), || {
            source.read_capped(&sc.path, sc.size, env.watch(opts))
        })?;
        let sha = sha256_hex(&bytes);
        if bytes.len() as u64 != sc.size || sha != sc.sha256 {
            return Err(Error::Fetch {
                location: source.location(&sc.path),
                what: format!(
                    "boot script ({}): {} bytes with sha256 {sha}, the signed manifest says {} bytes with sha256 {}",
                    sc.kind,
                    bytes.len(),
                    sc.size,
                    sc.sha256
                ),
                retryable: false,
            });
        }
        out.push((sc.clone(), bytes));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(bytes: &[u8], hashes: &[(&str, String)]) -> ManifestPin {
        ManifestPin {
            length: bytes.len() as u64,
            sha256: sha256_hex(bytes),
            hashes: hashes
                .iter()
                .map(|(a, h)| (a.to_string(), h.clone()))
                .collect(),
            from: "target v2/manifest.json".into(),
            vouched_by: "the targets role".into(),
        }
    }

    /// Every hash the targets list for the manifest is checked, not only sha256, and an
    /// algorithm the node cannot compute is a mismatch (issue 25, TUF 5.7.3).
    #[test]
    fn every_listed_hash_of_the_pinned_manifest_must_match() {
        let m = b"{\"version\":\"v2\"}";
        let sha512 = crate::trust::meta::digest_hex("sha512", m).unwrap();
        assert!(check_pin(&pin(m, &[("sha512", sha512.clone())]), m, "m").is_ok());
        let e = check_pin(&pin(m, &[("sha512", "00".repeat(64))]), m, "m").unwrap_err();
        assert!(e.to_string().contains("sha512"), "{e}");
        let e = check_pin(&pin(m, &[("blake9", "ab".into())]), m, "m").unwrap_err();
        assert!(e.to_string().contains("cannot compute"), "{e}");
        // The length and sha256 still bind it first.
        let other = b"{\"version\":\"v3\"}";
        assert!(check_pin(&pin(m, &[("sha512", sha512)]), other, "m").is_err());
    }
}
