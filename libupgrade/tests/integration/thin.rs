//! Sites on thin links, on a real GPT disk image (loop devices) against a real byte-counting
//! HTTP server: the preview of a stage equals what the stage then fetches (full, delta,
//! resumed), a byte budget stops an attempt cleanly and the next one resumes with nothing
//! lost, and extra chunk sources (a local directory, a corrupt mirror, a dying mirror) cut
//! what the origin sends without ever letting an unverified chunk into the slot. A download
//! schedule, followed on a virtual clock: nothing is sent outside its windows, inside them at
//! most the rate times the time plus the one request in flight; windows closing mid-file and
//! reopening re-fetch nothing; the end of the schedule stops the attempt, resumable.

use libupgrade::Release;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use libupgrade::{Error, ExtraSource, NoProgress, Source, StageOptions, StageReport, Updater};
use libupgrade::{Schedule, Stop, Window};
use testkit::*;

/// A site: release `v2` signed by `k` in `rels`, served by `srv` (`src` is its URL), and an
/// empty test disk whose updater `u` trusts `k`. Fields drop in this order: the updater before
/// its disk, the server before the files it serves.
struct Site {
    u: Updater,
    disk: TestDisk,
    src: Source,
    srv: TestServer,
    v2: PathBuf,
    rels: tempfile::TempDir,
    k: Keys,
}

/// A [`Site`] whose v2 carries `mib` MiB of noise from `seed`, its initrd from `initrd`.
fn site(mib: usize, seed: u64, initrd: u64) -> Site {
    let payload = pseudo_random(mib << 20, seed);
    site_of(&ReleaseInputs::noise("v2", 2, &payload, 101, initrd))
}

/// A [`Site`] whose v2 is made of `inputs` (version `v2`).
fn site_of(inputs: &ReleaseInputs) -> Site {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let v2 = signed_release(&k, rels.path(), inputs);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let src = Source::parse(&format!("{}v2", srv.base));
    let disk = TestDisk::new(24 * MIB);
    let u = disk.updater(disk.config(&k.trust));
    Site {
        u,
        disk,
        src,
        srv,
        v2,
        rels,
        k,
    }
}

impl Site {
    /// The release, the server, its URL, the disk and the updater, borrowed for a test body.
    fn parts(&self) -> (&Path, &TestServer, &Source, &TestDisk, &Updater) {
        (&self.v2, &self.srv, &self.src, &self.disk, &self.u)
    }
}

/// The bytes of `rel`'s chunk indexes, every part's (metadata a chunked stage fetches first).
fn index_bytes(rel: &Path) -> u64 {
    release_manifest(rel)
        .file_entries()
        .filter_map(|e| e.chunks.as_ref())
        .map(|c| c.size)
        .sum()
}

/// Bytes and requests a server sent while `f` ran.
fn metered<T>(srv: &TestServer, f: impl FnOnce() -> T) -> (T, u64, usize) {
    let (b, r) = (srv.sent(), srv.request_count());
    let out = f();
    (out, srv.sent() - b, srv.request_count() - r)
}

/// Response headers of the test server are under this many bytes each.
const HEAD: u64 = 160;

/// The preview's fetch equals the stage's `bytes_fetched`, and what the stage sent beyond the
/// preview's own requests (the same metadata) is that plus one response head per request.
fn preview_then_stage(u: &Updater, srv: &TestServer, src: &Source, opts: &StageOptions) -> u64 {
    let (p, p_wire, p_req) = metered(srv, || u.preview(&Release::at(src.clone()), opts).unwrap());
    assert!(!p.already_staged);
    let (r, s_wire, s_req) = metered(srv, || {
        u.stage(&Release::at(src.clone()), opts, &NoProgress)
            .unwrap()
    });
    assert_eq!(r.bytes_fetched, p.fetch(), "preview {p:?} vs report {r:?}");
    assert_eq!(r.bytes_reused, p.reuse(), "preview {p:?} vs report {r:?}");
    assert_eq!(r.resumed, p.resume);
    let extra = (s_wire - p_wire) as i64 - p.fetch() as i64;
    let heads = (s_req - p_req) as u64 * HEAD;
    eprintln!(
        "preview {} fetch, {} reuse; stage sent {} bytes beyond the preview's metadata ({} requests): {extra} bytes of headers",
        p.fetch(),
        p.reuse(),
        s_wire - p_wire,
        s_req - p_req
    );
    assert!(
        extra >= 0 && extra as u64 <= heads,
        "wire {s_wire} - {p_wire} vs preview {}: {extra} bytes not in the preview, {heads} allowed for heads",
        p.fetch()
    );
    p.fetch()
}

#[test]
fn the_preview_equals_what_a_full_and_a_delta_stage_fetch() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let p1 = pseudo_random(12 << 20, 21);
    let mut p2 = p1.clone();
    for at in [1 << 20, 6 << 20, 10 << 20] {
        p2[at..at + 50_000].copy_from_slice(&pseudo_random(50_000, at as u64));
    }
    let v1 = noise_release(&k, rels.path(), "v1", 1, &p1, 101, 201);
    let v2 = noise_release(&k, rels.path(), "v2", 2, &p2, 101, 202);
    let srv = TestServer::paced(rels.path().to_path_buf(), 0);
    let src = Source::parse(&format!("{}v2", srv.base));

    // Full: nothing on the node.
    let disk = TestDisk::new(24 * MIB);
    let u = disk.updater(disk.config(&k.trust));
    let full = preview_then_stage(&u, &srv, &src, &fast_stage());
    assert_eq!(full, release_size(&v2));
    disk.assert_b_is(&v2);
    let again = u.preview(&Release::at(src.clone()), &fast_stage()).unwrap();
    assert!(again.already_staged && again.fetch() == 0, "{again:?}");

    // Delta: v1 runs in slot A.
    let disk = TestDisk::new(24 * MIB);
    disk.install_in_a(&v1);
    let u = disk.updater(disk.config(&k.trust));
    let delta = preview_then_stage(&u, &srv, &src, &fast_stage());
    assert!(
        delta < release_size(&v2) / 4,
        "delta {delta} of {}",
        release_size(&v2)
    );
    disk.assert_b_is(&v2);
}

#[test]
fn a_byte_budget_stops_cleanly_and_the_resumed_stage_fetches_exactly_the_rest() {
    let s = site(10, 31, 203);
    let (v2, srv, src, disk, u) = s.parts();
    let total = release_size(v2);
    let need = u
        .preview(&Release::at(src.clone()), &fast_stage())
        .unwrap()
        .fetch();
    assert_eq!(need, total);

    // Day 1: 40 % of the need.
    let budget = need * 2 / 5;
    let opts = StageOptions {
        max_bytes: Some(budget),
        ..fast_stage()
    };
    let (e, wire, requests) = metered(srv, || {
        u.stage(&Release::at(src.clone()), &opts, &NoProgress)
            .unwrap_err()
    });
    let Error::Stopped {
        why: Stop::Budget { budget: b },
        fetched,
        left,
    } = e
    else {
        panic!("expected a budget stop, got: {e}")
    };
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains("budget") && msg.contains("later run resumes"),
        "{msg}"
    );
    assert_eq!(b, budget);
    let max = u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max);
    assert!(
        fetched <= budget && fetched + max > budget,
        "fetched {fetched} of a {budget} budget"
    );
    assert_eq!(left, need - fetched);
    // On the wire: the budget, the metadata (probes, indexes), heads.
    let indexes = index_bytes(v2);
    assert!(
        wire <= budget + indexes + 8192 + requests as u64 * HEAD,
        "{wire} on the wire for a {budget} budget"
    );

    // Day 2: the preview says what is left; the stage fetches exactly that.
    let rest = preview_then_stage(u, srv, src, &fast_stage());
    assert_eq!(rest, left, "nothing fetched on day 1 is fetched again");
    disk.assert_b_is(v2);
}

/// A copy of `rel`'s artifacts holding only their first `share` (an interrupted copy onto a
/// removable medium).
fn partial_copy(rel: &Path, to: &Path, share: f64) {
    std::fs::create_dir_all(to).unwrap();
    for f in ARTIFACTS {
        let b = std::fs::read(rel.join(f)).unwrap();
        std::fs::write(to.join(f), &b[..(b.len() as f64 * share) as usize]).unwrap();
    }
}

#[test]
fn a_directory_with_80_percent_of_the_chunks_cuts_origin_bytes_to_about_20_percent() {
    let s = site(12, 41, 204);
    let (v2, srv, src, disk, u) = s.parts();
    let total = release_size(v2);
    let medium = tempfile::tempdir().unwrap();
    partial_copy(v2, medium.path(), 0.8);
    let opts = StageOptions {
        extra_sources: vec![ExtraSource::parse(medium.path().to_str().unwrap())],
        ..fast_stage()
    };
    let fetched = preview_then_stage(u, srv, src, &opts);
    disk.assert_b_is(v2);
    let share = fetched as f64 / total as f64;
    eprintln!(
        "80 %-complete extra directory: origin sent {fetched} of {total} bytes ({:.1} %)",
        share * 100.0
    );
    assert!((0.19..0.24).contains(&share), "{share}");
}

/// A copy of the release directory `rel` under `root/<name>` with bytes overwritten in
/// `file` at each of `at` (after signing: a mirror serving other bytes).
fn corrupt_mirror(rel: &Path, root: &Path, file: &str, at: &[u64]) {
    let dst = root.join(rel.file_name().unwrap());
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(rel).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dst.join(file))
        .unwrap();
    for &p in at {
        f.write_all_at(b"MIRROR-ROT", p).unwrap();
    }
}

/// Stage site `s`'s v2 with a mirror serving `file` overwritten at each of `at`: each corrupt
/// chunk is refused and taken alone from the origin, which sends nothing else but the
/// metadata, and the preview is exact.
fn stage_past_a_corrupt_mirror(s: &Site, file: &str, at: &[u64]) {
    let (v2, origin, src, disk, u) = s.parts();
    let mirror_root = tempfile::tempdir().unwrap();
    corrupt_mirror(v2, mirror_root.path(), file, at);
    let mirror = TestServer::paced(mirror_root.path().to_path_buf(), 0);
    let opts = StageOptions {
        extra_sources: vec![ExtraSource::parse(&format!("{}v2", mirror.base))],
        ..fast_stage()
    };
    let p = u.preview(&Release::at(src.clone()), &opts).unwrap();
    let (r, origin_wire, _) = metered(origin, || {
        u.stage(&Release::at(src.clone()), &opts, &NoProgress)
            .unwrap()
    });
    disk.assert_b_is(v2);
    let bad = at.len() as u64;
    assert_eq!(r.chunks_refused, bad, "{r:?}");
    assert_eq!(r.bytes_fetched, p.fetch());
    let max = u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max);
    let from_origin = r.bytes_fetched - r.bytes_from_mirrors;
    assert!(
        from_origin <= bad * max,
        "{from_origin} bytes from the origin"
    );
    // The origin sent the metadata and the corrupt chunks, nothing else.
    let indexes = index_bytes(v2);
    assert!(
        origin_wire <= from_origin + indexes + 16_384,
        "origin sent {origin_wire}"
    );
}

#[test]
fn corrupt_mirror_chunks_are_refused_and_taken_from_the_origin() {
    let s = site(8, 51, 205);
    stage_past_a_corrupt_mirror(&s, "rootfs.squashfs", &[1 << 20, 4 << 20, 7 << 20]);
}

/// A release's image archive payload (issue 33) comes through a mirror like the rootfs: the
/// mirror's corrupt chunks of it are refused and taken alone from the origin, the preview is
/// exact, and the payload store ends with the signed bytes.
#[test]
fn a_mirror_serves_a_payloads_chunks_and_its_corrupt_ones_come_from_the_origin() {
    let noise = pseudo_random(1 << 20, 71);
    let s = site_of(&ReleaseInputs::noise("v2", 2, &noise, 171, 271).image(
        "site-images",
        image_archive("registry.local/site/app:2", &[pseudo_random(4 << 20, 72)]),
    ));
    stage_past_a_corrupt_mirror(&s, "site-images.tar", &[1 << 20, 3 << 20]);
    assert_eq!(assert_payloads_stored(&s.u.config().state_dir, &s.v2), 1);
}

#[test]
fn a_mirror_dying_mid_stage_costs_at_most_the_chunk_in_flight() {
    let s = site(8, 61, 206);
    let (v2, origin, src, disk, u) = s.parts();
    let total = release_size(v2);
    // Drops its first large body half way, then stays up: given up at once all the same.
    let mirror = TestServer::start(s.rels.path().to_path_buf(), 1);
    let opts = StageOptions {
        extra_sources: vec![ExtraSource::parse(&format!("{}v2", mirror.base))],
        ..fast_stage()
    };
    let (r, origin_wire, _) = metered(origin, || {
        u.stage(&Release::at(src.clone()), &opts, &NoProgress)
            .unwrap()
    });
    let mirror_wire = mirror.sent();
    disk.assert_b_is(v2);
    assert!(r.bytes_from_mirrors > 0, "{r:?}");
    let max = u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max);
    let indexes = index_bytes(v2);
    eprintln!("release {total}: mirror sent {mirror_wire}, origin {origin_wire}");
    assert!(
        mirror_wire + origin_wire <= total + max + indexes + 32_768,
        "mirror {mirror_wire} + origin {origin_wire} for a {total}-byte release"
    );
    // Given up after the drop: no request to the mirror's rootfs after the first range.
    let ranges = mirror
        .requests()
        .iter()
        .filter(|l| l.is_get_of("/v2/rootfs.squashfs") && l.range != Some((0, Some(0))))
        .count();
    assert_eq!(ranges, 1, "{:?}", mirror.requests());
}

/// A virtual clock's sample: the virtual time and the bytes the server had sent by then.
type Sample = (chrono::DateTime<chrono::Utc>, u64);

/// Virtual time: an instant `s` seconds after the test's start.
fn at(s: i64) -> chrono::DateTime<chrono::Utc> {
    use chrono::TimeZone;
    chrono::Utc.timestamp_opt(1_900_000_000 + s, 0).unwrap()
}

fn window(start: i64, secs: i64, rate: Option<u64>) -> Window {
    Window {
        start: at(start),
        end: at(start + secs),
        rate,
    }
}

/// Of what the server sent during a stage (per the clock's samples), the bytes sent while the
/// virtual time was outside every window of `s` (counted from the sample before the bytes).
fn sent_outside(s: &Schedule, samples: &[Sample]) -> u64 {
    samples
        .windows(2)
        .filter(|p| {
            !s.windows()
                .iter()
                .any(|w| w.start <= p[0].0 && p[0].0 < w.end && w.rate != Some(0))
        })
        .map(|p| p[1].1 - p[0].1)
        .sum()
}

/// What the server sent since it stood at `c0`, per the clock's `samples`: nothing outside
/// every window of `s`, and by each sample no more than `s` allowed so far plus `slack`.
fn assert_paced(
    s: &Schedule,
    samples: &[(chrono::DateTime<chrono::Utc>, u64)],
    c0: u64,
    slack: u64,
) {
    assert_eq!(sent_outside(s, samples), 0);
    for (t, c) in samples {
        let allowed = s.allowed_by(*t).unwrap() as u64;
        assert!(
            c - c0 <= allowed + slack,
            "at +{} s: {} sent, {allowed} allowed (+{slack} slack)",
            (*t - at(0)).num_seconds(),
            c - c0
        );
    }
}

/// Stage options following `schedule` on a virtual clock that starts at `at(0)` and samples
/// what `srv` has sent.
fn on_clock(schedule: Schedule, srv: &TestServer) -> (StageOptions, std::sync::Arc<VirtualClock>) {
    let clock = VirtualClock::new(at(0), srv.sent_counter());
    let opts = StageOptions {
        schedule: Some(schedule),
        clock: clock.clone(),
        ..fast_stage()
    };
    (opts, clock)
}

/// Stage the site's v2 following `schedule` on the virtual clock (slot B then holds it): the
/// report, the bytes on the wire and the requests, what the server had sent before, and the
/// clock's samples.
fn stage_paced(s: &Site, schedule: &Schedule) -> (StageReport, u64, usize, u64, Vec<Sample>) {
    let (opts, clock) = on_clock(schedule.clone(), &s.srv);
    let c0 = s.srv.sent();
    let (r, wire, requests) = metered(&s.srv, || {
        s.u.stage(&Release::at(s.src.clone()), &opts, &NoProgress)
            .unwrap()
    });
    s.disk.assert_b_is(&s.v2);
    (r, wire, requests, c0, clock.samples())
}

#[test]
fn a_schedule_sends_nothing_outside_its_windows_and_at_most_its_rate_inside() {
    let s = site(3, 71, 207);
    let (v2, srv, src, _, u) = s.parts();
    let (p, meta, _) = metered(srv, || {
        u.preview(&Release::at(src.clone()), &fast_stage()).unwrap()
    });
    assert_eq!(p.fetch(), release_size(v2));

    // Closes twice mid-file (1.5 MiB, then 384 KiB), a rate-0 window between, and a last
    // window that carries the rest.
    let rate = 256 << 10;
    let schedule = Schedule::new(vec![
        window(60, 6, Some(rate)),
        window(300, 100, Some(0)),
        window(600, 3, Some(rate / 2)),
        window(3600, 100, Some(2 * rate)),
    ])
    .unwrap();
    let (r, wire, requests, c0, samples) = stage_paced(&s, &schedule);
    let last = samples.last().unwrap().0;
    eprintln!(
        "schedule: {} fetched in {requests} requests, {wire} bytes on the wire, done at +{} s (virtual)",
        r.bytes_fetched,
        (last - at(0)).num_seconds()
    );
    assert!(last >= at(3600), "the last window was needed: {last}");
    // Inside: never more than the rate times the time so far, plus the request in flight
    // (about one second of rate, at least a chunk), the metadata and the response heads.
    let max_chunk = u64::from(libupgrade::chunk::ChunkParams::DEFAULT.max);
    let slack = (2 * rate).max(max_chunk) + meta + requests as u64 * HEAD;
    assert_paced(&schedule, &samples, c0, slack);
    // Crossing the boundaries re-fetched nothing.
    assert_eq!(r.bytes_fetched, p.fetch());
    assert!(
        wire <= meta + p.fetch() + requests as u64 * HEAD,
        "{wire} on the wire for {} bytes",
        p.fetch()
    );
}

#[test]
fn the_end_of_the_schedule_stops_the_attempt_and_the_next_fetches_only_the_rest() {
    let s = site(3, 72, 208);
    let (v2, srv, src, disk, u) = s.parts();
    let need = u
        .preview(&Release::at(src.clone()), &fast_stage())
        .unwrap()
        .fetch();

    let rate = 256 << 10;
    let (opts, clock) = on_clock(Schedule::until(at(0), at(4), Some(rate)), srv);
    let e = u
        .stage(&Release::at(src.clone()), &opts, &NoProgress)
        .unwrap_err();
    let msg = e.to_string();
    eprintln!("{msg}");
    let Error::Stopped {
        why: Stop::Schedule { closed },
        fetched,
        left,
    } = e
    else {
        panic!("expected a schedule stop, got: {e}")
    };
    assert_eq!(closed, at(4));
    assert!(
        msg.contains("2030-03-17T17:46:44Z") && msg.contains("later run resumes"),
        "{msg}"
    );
    assert!(
        fetched > 2 * rate && fetched <= 4 * rate,
        "{fetched} in 4 s at {rate}/s"
    );
    assert_eq!(left, need - fetched);
    assert!(clock.samples().last().unwrap().0 <= at(4));

    // The next attempt, any time: exactly the rest.
    let rest = preview_then_stage(u, srv, src, &fast_stage());
    assert_eq!(
        rest, left,
        "nothing fetched before the stop is fetched again"
    );
    disk.assert_b_is(v2);
}

/// Re-sign `rel`'s manifest without chunk indexes (a release from before them): every
/// artifact is then streamed whole.
fn without_chunk_indexes(k: &Keys, rel: &Path) {
    let path = rel.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for f in m["files"].as_object_mut().unwrap().values_mut() {
        f.as_object_mut().unwrap().remove("chunks");
    }
    let bytes = serde_json::to_vec_pretty(&m).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let sig = libupgrade::signing::sign(&bytes, &k.secret).unwrap();
    std::fs::write(rel.join("manifest.json.sig"), sig).unwrap();
}

#[test]
fn a_schedule_paces_whole_file_streams_the_same_way() {
    let s = site(2, 73, 209);
    let (v2, srv, src, _, u) = s.parts();
    without_chunk_indexes(&s.k, v2);
    let (p, meta, _) = metered(srv, || {
        u.preview(&Release::at(src.clone()), &fast_stage()).unwrap()
    });
    assert!(p.artifacts.iter().all(|a| a.fetch == a.size), "{p:?}");
    let log = srv.requests();
    assert!(!log.iter().any(|l| l.path.contains(".chunks")), "{log:?}");

    let rate = 256 << 10;
    let schedule = Schedule::new(vec![
        window(30, 5, Some(rate)),
        window(900, 2, Some(rate)),
        window(1800, 100, Some(rate)),
    ])
    .unwrap();
    let (r, wire, requests, c0, samples) = stage_paced(&s, &schedule);
    assert!(
        samples.last().unwrap().0 >= at(1800),
        "the last window was needed"
    );
    let slack = rate + meta + requests as u64 * HEAD;
    assert_paced(&schedule, &samples, c0, slack);
    // Streams, re-opened at each window (about a second of rate per request).
    let ranged = srv
        .requests_since(log.len())
        .iter()
        .filter(|l| l.is_get_of("/v2/rootfs.squashfs") && l.range.is_some())
        .count();
    assert!(ranged >= 8, "{ranged} range requests of the rootfs");
    assert_eq!(r.bytes_fetched, release_size(v2));
    assert!(
        wire <= meta + release_size(v2) + requests as u64 * HEAD,
        "{wire} on the wire: something was fetched twice"
    );
}
