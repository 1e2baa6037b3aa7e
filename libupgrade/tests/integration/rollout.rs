//! Fleet rollouts (issue 24): the pure offer against hand-made cases, its properties under
//! proptest, a simulated fleet of 10,000 seeds over virtual time, and the node seed file's
//! migration from a state directory written by the previous release.

use std::path::Path;

use chrono::{DateTime, Duration, Utc};
use libupgrade::rollout::{
    admission, admits_from, load_or_create_seed, offer, read_seed, Floor, Hold, Installed, Listed,
    Node, Offer, Rollout, Seed, SeedOrigin, Step, Wave, SEED_FILE, SEED_SPACE,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

fn t(h: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
}

/// The example: 1 % at T, 10 % at T+24 h, 50 % at T+48 h, 100 % at T+72 h.
fn four_waves() -> Rollout {
    Rollout {
        waves: [(100, 0), (1_000, 24), (5_000, 48), (10_000, 72)]
            .map(|(share_bp, h)| Wave {
                share_bp,
                start: t(h),
            })
            .to_vec(),
        ..Rollout::default()
    }
}

fn installed(version: &str, generation: u64) -> Installed {
    Installed {
        version: version.into(),
        generation,
    }
}

fn node(seed: u32, running: u64, staged: Option<u64>) -> Node {
    Node {
        seed: Seed::new(seed).unwrap(),
        running: installed(&format!("v{running}"), running),
        staged: staged.map(|g| installed(&format!("v{g}"), g)),
    }
}

fn listed(generation: u64, rollout: Option<Rollout>) -> Listed {
    Listed {
        version: format!("v{generation}"),
        generation,
        rollout,
    }
}

fn step(generation: u64, toward: Option<u64>) -> Option<Step> {
    Some(Step {
        version: format!("v{generation}"),
        generation,
        toward: toward.map(|g| format!("v{g}")),
    })
}

fn floor(generation: u64) -> Option<Floor> {
    Some(Floor {
        version: format!("v{generation}"),
        generation,
    })
}

// ---- hand-made cases -------------------------------------------------------------------

#[test]
fn a_release_without_rollout_data_is_offered_at_once() {
    let o = offer(
        &node(999_999, 1, None),
        t(0),
        &[listed(1, None), listed(2, None)],
    );
    assert_eq!(
        o,
        Offer {
            take: step(2, None),
            ..Offer::default()
        }
    );
}

#[test]
fn latest_is_the_newest_release_whose_wave_reached_the_seed_and_the_start_is_told() {
    let releases = [listed(2, None), listed(3, Some(four_waves()))];
    // Seed 300,000 is inside the 10 %→50 % stretch (24 h over 4,000 bp): admitted after 30 h.
    let n = node(300_000, 1, None);
    let o = offer(&n, t(30), &releases);
    assert_eq!(o.take, step(2, None));
    let w = o.waiting.unwrap();
    assert_eq!(w.version, "v3");
    assert!(
        w.hold
            .to_string()
            .starts_with("this node's wave starts at "),
        "{}",
        w.hold
    );
    let Hold::Wave {
        starts: Some(starts),
    } = w.hold
    else {
        panic!("{:?}", w.hold)
    };
    assert!(starts > t(36) && starts <= t(37), "{starts}");
    assert_eq!(
        offer(&n, starts - Duration::seconds(1), &releases).take,
        step(2, None)
    );
    assert_eq!(
        offer(&n, starts, &releases),
        Offer {
            take: step(3, None),
            ..Offer::default()
        }
    );
}

#[test]
fn a_pause_holds_nodes_that_have_not_started_and_lets_a_staged_one_go_on() {
    let paused = four_waves().pause(t(30)).unwrap();
    let releases = [listed(2, Some(paused))];
    let o = offer(&node(5_000, 1, None), t(31), &releases);
    assert_eq!(o.take, None);
    assert_eq!(o.waiting.unwrap().hold, Hold::Paused { since: t(30) });
    assert_eq!(
        offer(&node(5_000, 1, Some(2)), t(31), &releases).take,
        step(2, None)
    );
}

#[test]
fn a_withdrawn_staged_release_is_dropped_for_the_newest_still_offered() {
    let releases = [
        listed(2, None),
        listed(3, Some(four_waves().withdraw(t(50)))),
    ];
    let o = offer(&node(0, 1, Some(3)), t(51), &releases);
    assert_eq!(o.take, step(2, None));
    assert_eq!(o.drop_staged, Some(installed("v3", 3)));
    assert_eq!(o.waiting, None, "a withdrawn release is not awaited");
    assert!(matches!(
        admission(Seed::new(0).unwrap(), t(51), &releases[1], true),
        Err(Hold::Withdrawn { .. })
    ));
}

#[test]
fn required_stops_are_walked_oldest_first() {
    let with_floor = |f| Rollout {
        from_at_least: floor(f),
        ..Rollout::default()
    };
    let releases = [
        listed(2, None),
        listed(3, Some(with_floor(2))),
        listed(4, None),
        listed(5, Some(with_floor(3))),
    ];
    assert_eq!(
        offer(&node(7, 1, None), t(0), &releases).take,
        step(2, Some(5))
    );
    assert_eq!(
        offer(&node(7, 2, None), t(0), &releases).take,
        step(3, Some(5))
    );
    assert_eq!(
        offer(&node(7, 3, None), t(0), &releases).take,
        step(5, None)
    );
}

#[test]
fn a_missing_or_held_stop_holds_the_release_behind_it() {
    let behind = Rollout {
        from_at_least: floor(3),
        ..Rollout::default()
    };
    let o = offer(
        &node(7, 1, None),
        t(0),
        &[listed(2, None), listed(4, Some(behind.clone()))],
    );
    assert_eq!(o.take, step(2, None));
    assert_eq!(
        o.waiting.unwrap().hold,
        Hold::StopMissing {
            version: "v3".into(),
            generation: 3
        }
    );
    let paused_stop = four_waves().pause(t(0)).unwrap();
    let o = offer(
        &node(7, 1, None),
        t(1),
        &[listed(3, Some(paused_stop)), listed(4, Some(behind))],
    );
    assert_eq!(o.take, None);
    let hold = o.waiting.unwrap().hold;
    assert_eq!(
        hold.to_string(),
        format!(
            "required stop \"v3\" is held: the rollout is paused since {}",
            t(0)
        )
    );
    assert_eq!(
        hold,
        Hold::Stop {
            version: "v3".into(),
            hold: Box::new(Hold::Paused { since: t(0) })
        }
    );
}

#[test]
fn rollout_data_this_build_cannot_read_admits_nobody_and_says_why() {
    let newer = Rollout {
        format: 2,
        ..Rollout::default()
    };
    let o = offer(&node(0, 1, None), t(0), &[listed(2, Some(newer))]);
    assert_eq!(o.take, None);
    let Hold::Unreadable { what } = o.waiting.unwrap().hold else {
        panic!()
    };
    assert!(
        what.contains("\"v2\"") && what.contains("format 2 is newer"),
        "{what}"
    );
}

#[test]
fn todays_target_reader_skips_the_rollout_field() {
    // What a node of v0.2.0 before this change does with a target carrying rollout data: it
    // reads the target and ignores the rollout (so it takes the release at once).
    let json = serde_json::json!({
        "version": "v3", "generation": 3, "arch": "x86_64",
        "rollout": serde_json::to_value(four_waves()).unwrap(),
    });
    let c: libupgrade::trust::meta::TargetCustom = serde_json::from_value(json).unwrap();
    assert_eq!((c.version.as_str(), c.generation), ("v3", 3));
}

// ---- properties ------------------------------------------------------------------------

prop_compose! {
    /// A valid schedule: 1–5 points, shares and times strictly increasing, the last 100 %.
    fn waves()(points in prop::collection::btree_set(0u32..10_000, 0..4),
               gaps in prop::collection::vec(1i64..200_000, 5),
               first in -400_000i64..400_000) -> Vec<Wave> {
        let mut shares: Vec<u32> = points.into_iter().collect();
        shares.push(10_000);
        let mut at = 1_800_000_000 + first;
        shares.iter().zip(&gaps).map(|(&share_bp, gap)| {
            let w = Wave { share_bp, start: DateTime::from_timestamp(at, 0).unwrap() };
            at += gap;
            w
        }).collect()
    }
}

fn when(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
}

fn admitted(seed: u32, now: DateTime<Utc>, r: &Rollout, started: bool) -> bool {
    admission(
        Seed::new(seed).unwrap(),
        now,
        &listed(2, Some(r.clone())),
        started,
    )
    .is_ok()
}

proptest! {
    #[test]
    fn once_offered_a_release_stays_offered(w in waves(), seed in 0..SEED_SPACE,
                                            a in -500_000i64..1_500_000, d in 0i64..1_000_000,
                                            paused_secs in prop::option::of(0u64..500_000)) {
        // Also after earlier pauses (a resumed rollout), which only shift the schedule.
        let r = Rollout { waves: w, paused_secs: paused_secs.unwrap_or(0), ..Rollout::default() };
        if admitted(seed, when(a), &r, false) {
            prop_assert!(admitted(seed, when(a + d), &r, false));
        }
    }

    #[test]
    fn shares_are_respected_exactly(w in waves(), seed in 0..SEED_SPACE, frac in 0i64..=100) {
        let r = Rollout { waves: w.clone(), ..Rollout::default() };
        for p in &w {
            // At a wave's start exactly its share: the seeds below share × space.
            prop_assert_eq!(admitted(seed, p.start, &r, false), seed < p.share_bp * 100);
        }
        for pair in w.windows(2) {
            // Between two starts the share lies between theirs, and the seed is admitted
            // exactly from the second `admits_from` names.
            let span = pair[1].start.timestamp() - pair[0].start.timestamp();
            let at = pair[0].start + Duration::seconds(span * frac / 100);
            let share = r.share_ppm_at(at);
            prop_assert!(pair[0].share_bp * 100 <= share && share <= pair[1].share_bp * 100);
        }
        let from = admits_from(&w, seed).unwrap();
        prop_assert!(admitted(seed, from, &r, false));
        prop_assert!(!admitted(seed, from - Duration::seconds(1), &r, false));
    }

    #[test]
    fn a_pause_holds_the_offered_set_flat_and_a_resume_continues_from_it(
        w in waves(), seed in 0..SEED_SPACE, since in -500_000i64..1_500_000,
        a in 0i64..1_000_000, b in 0i64..1_000_000, held in 0i64..1_000_000, started: bool) {
        let r = Rollout { waves: w, ..Rollout::default() };
        let paused = r.pause(when(since)).unwrap();
        // Paused: exactly the nodes that started, at every time of the pause.
        prop_assert_eq!(admitted(seed, when(since + a), &paused, started), started);
        prop_assert_eq!(admitted(seed, when(since + b), &paused, started), started);
        // Resumed: the schedule continues from the share held at the pause.
        let resumed = paused.resume(when(since + held)).unwrap();
        prop_assert_eq!(resumed.share_ppm_at(when(since + held)), r.share_ppm_at(when(since)));
        prop_assert_eq!(resumed.share_ppm_at(when(since + held + a)), r.share_ppm_at(when(since + a)));
    }

    #[test]
    fn a_withdrawn_release_is_never_offered(
        flags in prop::collection::vec((any::<bool>(), any::<bool>()), 1..8),
        seed in 0..SEED_SPACE, now in -100i64..200, staged in 0usize..8) {
        let releases: Vec<Listed> = flags.iter().enumerate().map(|(i, &(gone, waves))| {
            let mut r = if waves { four_waves() } else { Rollout::default() };
            if gone { r = r.withdraw(t(0)); }
            listed(i as u64 + 2, Some(r))
        }).collect();
        let staged = (staged < releases.len()).then_some(staged as u64 + 2);
        let o = offer(&node(seed, 1, staged), t(now), &releases);
        let gone = |v: &str| releases.iter().any(|l| l.version == v
            && l.rollout.as_ref().unwrap().withdrawn.is_some());
        if let Some(s) = &o.take { prop_assert!(!gone(&s.version)); }
        prop_assert_eq!(o.drop_staged.is_some(), staged.is_some_and(|g| gone(&format!("v{g}"))));
    }

    #[test]
    fn required_stops_are_walked_in_order(
        floors in prop::collection::vec(prop::option::of(0.0f64..1.0), 1..12), seed in 0..SEED_SPACE) {
        // Release g (2..) may require a random older release (1 is the running one).
        let releases: Vec<Listed> = floors.iter().enumerate().map(|(i, f)| {
            let g = i as u64 + 2;
            let stop = f.map(|x| 1 + (x * (g - 1) as f64) as u64).filter(|&s| s >= 2 && s < g);
            listed(g, Some(Rollout { from_at_least: stop.and_then(floor), ..Rollout::default() }))
        }).collect();
        let newest = releases.len() as u64 + 1;
        let mut running = 1;
        for _ in 0..=releases.len() {
            let Some(s) = offer(&node(seed, running, None), t(0), &releases).take else { break };
            let l = &releases[(s.generation - 2) as usize];
            let f = l.rollout.as_ref().unwrap().from_at_least.as_ref();
            // Never a release whose stop the node has not passed, never backwards.
            prop_assert!(f.is_none_or(|f| f.generation <= running), "{s:?} from {running}");
            prop_assert!(s.generation > running);
            running = s.generation;
        }
        prop_assert_eq!(running, newest);
    }
}

// ---- a simulated fleet ------------------------------------------------------------------

/// The schedule as a plain function of hours (independent of the crate's curve).
fn scheduled_share(h: f64) -> f64 {
    let pts = [(0.0, 0.01), (24.0, 0.10), (48.0, 0.50), (72.0, 1.0)];
    if h < 0.0 {
        return 0.0;
    }
    for p in pts.windows(2) {
        if h < p[1].0 {
            return p[0].1 + (p[1].1 - p[0].1) * (h - p[0].0) / (p[1].0 - p[0].0);
        }
    }
    1.0
}

struct Fleet {
    nodes: Vec<Node>,
}

impl Fleet {
    /// 10,000 nodes, one seed in each ten-thousandth of the seed space (drawn uniformly inside
    /// its slice by a fixed generator, so the run is repeatable).
    ///
    /// Why not 10,000 seeds drawn uniformly over the whole space, as nodes draw them: their
    /// share below a bound is a binomial sample, off the schedule by ~sqrt(p(1-p)/n) = 0.5 %
    /// (one standard error) at p = 50 %, n = 10,000. The largest gap over 83 hours was 0.96 %
    /// with one generator seed, so "within ±1 %" held by luck and another generator (or a new
    /// `rand`) could break it. That noise belongs to the fleet, not to the decision (see
    /// `uniform_seeds_miss_the_schedule_only_by_sampling_noise`). One seed per slice removes
    /// it: the count below any bound is within one node of exact, so these tests check the
    /// decision against the schedule to 0.01 % and the ±1 % claim holds by construction, for
    /// any generator seed.
    fn new() -> Fleet {
        Fleet::stratified(24)
    }

    fn stratified(generator: u64) -> Fleet {
        let mut rng = rand::rngs::StdRng::seed_from_u64(generator);
        let slice = SEED_SPACE / 10_000;
        let nodes = (0..10_000)
            .map(|i| node(i * slice + rng.gen_range(0..slice), 1, None))
            .collect();
        Fleet { nodes }
    }

    /// One poll of every node at `now`: a node offered a release stages it, a node told to
    /// drop its staged release drops it. Returns (new stages, drops).
    fn poll(&mut self, now: DateTime<Utc>, releases: &[Listed]) -> (usize, usize) {
        let (mut staged, mut dropped) = (0, 0);
        for n in &mut self.nodes {
            let o = offer(n, now, releases);
            if o.drop_staged.is_some() {
                n.staged = None;
                dropped += 1;
            }
            if let Some(s) = o.take {
                if n.staged
                    .as_ref()
                    .is_none_or(|st| st.generation != s.generation)
                {
                    n.staged = Some(installed(&s.version, s.generation));
                    staged += 1;
                }
            }
        }
        (staged, dropped)
    }

    fn share_staged(&self) -> f64 {
        self.nodes.iter().filter(|n| n.staged.is_some()).count() as f64 / self.nodes.len() as f64
    }
}

#[test]
fn a_fleet_of_10000_seeds_follows_the_schedule_hour_by_hour() {
    for generator in [24, 1, 2, 3] {
        let mut fleet = Fleet::stratified(generator);
        let releases = [listed(2, Some(four_waves()))];
        let mut worst = 0.0f64;
        for h in -2..=80 {
            fleet.poll(t(h), &releases);
            let (got, want) = (fleet.share_staged(), scheduled_share(h as f64));
            // Exactly the seeds below the curve, …
            let below = releases[0].rollout.as_ref().unwrap().share_ppm_at(t(h));
            let exact = fleet.nodes.iter().filter(|n| n.seed.get() < below).count();
            assert_eq!(exact as f64 / 10_000.0, got, "hour {h}");
            // … which, one seed per slice of the space, is the schedule to one node in 10,000:
            // within ±1 % with a hundredfold margin, whatever the generator.
            worst = worst.max((got - want).abs());
            assert!(
                (got - want).abs() <= 0.0002,
                "hour {h}: {got:.4} of the fleet, schedule {want:.4}"
            );
        }
        assert!(worst <= 0.01, "generator {generator}: {worst}");
        assert_eq!(fleet.share_staged(), 1.0);
    }
}

/// A real fleet draws its seeds uniformly over the whole space: its share below the schedule's
/// bound is a binomial sample, so it misses the schedule by sampling noise only. Over many
/// generators the largest gap over 83 hours stays within 5 standard errors of a 50 % share
/// (5 × 0.5 % for 10,000 seeds) and the gaps average out around zero (no bias); a single
/// fleet's gap above 1 % is possible (about 1 in 20 at 2 standard errors), which is why the
/// schedule tests above use one seed per slice.
#[test]
fn uniform_seeds_miss_the_schedule_only_by_sampling_noise() {
    let rollout = four_waves();
    let n = 10_000usize;
    let sigma = (0.25 / n as f64).sqrt();
    let mut signed_sum = 0.0;
    let mut samples = 0;
    for generator in 0..20u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(generator);
        let mut seeds: Vec<u32> = (0..n).map(|_| rng.gen_range(0..SEED_SPACE)).collect();
        seeds.sort_unstable();
        for h in 0..=80 {
            let below = rollout.share_ppm_at(t(h));
            let got = seeds.partition_point(|s| *s < below) as f64 / n as f64;
            let gap = got - scheduled_share(h as f64);
            assert!(
                gap.abs() <= 5.0 * sigma,
                "generator {generator}, hour {h}: {gap}"
            );
            signed_sum += gap;
            samples += 1;
        }
    }
    let mean = signed_sum / f64::from(samples);
    assert!(mean.abs() <= sigma, "biased: mean gap {mean}");
}

#[test]
fn a_paused_fleet_stays_flat_and_a_resumed_one_continues_from_where_it_was() {
    let mut fleet = Fleet::new();
    let mut rollout = four_waves();
    for h in 0..=80 {
        match h {
            30 => rollout = rollout.pause(t(30)).unwrap(),
            40 => rollout = rollout.resume(t(40)).unwrap(),
            _ => {}
        }
        let (new, _) = fleet.poll(t(h), &[listed(2, Some(rollout.clone()))]);
        let got = fleet.share_staged();
        // Paused from hour 30 to 40: held at what hour 29's poll staged; resumed with the
        // schedule 10 h later (at hour 40 it offers what it offered at hour 30).
        let want = scheduled_share(match h {
            ..30 => h,
            30..40 => 29,
            _ => h - 10,
        } as f64);
        if (30..40).contains(&h) {
            assert_eq!(new, 0, "hour {h}: {new} nodes staged during the pause");
        }
        assert!(
            (got - want).abs() <= 0.01,
            "hour {h}: {got:.4} of the fleet, schedule {want:.4}"
        );
    }
}

#[test]
fn a_withdrawal_reaches_zero_new_stages_and_every_staged_node_drops_it() {
    let mut fleet = Fleet::new();
    let mut rollout = four_waves();
    let releases = |r: &Rollout| [listed(2, Some(r.clone()))];
    for h in 0..=50 {
        fleet.poll(t(h), &releases(&rollout));
    }
    let before = fleet.share_staged();
    assert!((before - scheduled_share(50.0)).abs() <= 0.01, "{before}");
    rollout = rollout.withdraw(t(50));
    let (new, dropped) = fleet.poll(t(51), &releases(&rollout));
    assert_eq!((new, dropped as f64 / 10_000.0), (0, before));
    for h in 52..=100 {
        assert_eq!(fleet.poll(t(h), &releases(&rollout)), (0, 0), "hour {h}");
    }
    assert_eq!(fleet.share_staged(), 0.0);
}

// ---- the node seed file --------------------------------------------------------------------

#[test]
fn a_node_made_by_the_previous_release_draws_its_seed_once_and_keeps_its_state() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/state.json");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::copy(&fixture, &state).unwrap();
    assert_eq!(
        read_seed(dir.path()).unwrap(),
        None,
        "the previous release wrote no seed"
    );

    let first = load_or_create_seed(dir.path()).unwrap();
    assert_eq!(first.origin, SeedOrigin::Drawn);
    let again = load_or_create_seed(dir.path()).unwrap();
    assert_eq!((again.seed, again.origin), (first.seed, SeedOrigin::Read));
    assert_eq!(
        std::fs::read(&state).unwrap(),
        std::fs::read(&fixture).unwrap()
    );
    libupgrade::state::store::StateStore::new(dir.path())
        .load()
        .unwrap();
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [SEED_FILE, "state.json"],
        "no temporary file left behind"
    );
}
