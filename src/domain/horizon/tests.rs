use proptest::prelude::*;

use super::*;

fn at(commit_lsn: u64, index: u32) -> Position {
    Position { commit_lsn, index }
}

#[test]
fn a_shorter_stream_is_judged_refilled_when_the_slot_is_behind_its_tail() {
    let stored = Stored { sequence: 1_000, position: at(0x9000, 0) };
    assert_eq!(Forgotten::judge(stored, 1_000, Some(at(0x9000, 0)), 0x9100), None);
    let held = Forgotten::judge(stored, 600, Some(at(0x6000, 0)), 0x5000).unwrap();
    assert!(held.refilled() && held.lost() == 400);
    assert!(held.to_string().contains("published again"), "{held}");
    let gone = Forgotten::judge(stored, 600, Some(at(0x6000, 0)), 0x9100).unwrap();
    assert!(!gone.refilled());
    assert!(gone.to_string().contains("--durability-horizon"), "{gone}");
    let emptied = Forgotten::judge(stored, 0, None, 0x5000).unwrap();
    assert!(emptied.refilled() && emptied.lost() == 1_000);
    let emptied_past = Forgotten::judge(stored, 0, None, 0x9100).unwrap();
    assert!(!emptied_past.refilled());
}

/// The message of sequence `n`.
fn message(n: u64) -> Option<Stored> {
    Some(Stored { sequence: n, position: at(n, 0) })
}

#[test]
fn no_horizon_releases_at_once() {
    let now = Instant::now();
    let mut horizon = Horizon::new(Duration::ZERO, 10);
    horizon.offer(20, now, message(1));
    assert_eq!(horizon.due(now), None);
    assert_eq!(horizon.release(now), 20);
}

#[test]
fn a_position_waits_until_the_stream_is_seen_holding_its_ack_a_horizon_later() {
    let t0 = Instant::now();
    let secs = |s| t0 + Duration::from_secs(s);
    let span = Duration::from_secs(120);
    let mut horizon = Horizon::new(span, 10);
    horizon.offer(20, t0, message(1));
    horizon.offer(30, secs(60), message(2));
    assert_eq!(horizon.due(secs(119)), None);
    assert_eq!(horizon.release(secs(119)), 10);
    // Old enough, but nobody looked: time alone releases nothing.
    assert_eq!(horizon.release(secs(500)), 10);
    assert_eq!(horizon.due(secs(120)), message(1));
    // A look asked for before the horizon passed vouches for nothing.
    horizon.vouched(message(1).unwrap(), secs(119));
    assert_eq!(horizon.release(secs(500)), 10);
    horizon.vouched(message(1).unwrap(), secs(120));
    assert_eq!(horizon.release(secs(120)), 20);
    assert_eq!(horizon.due(secs(179)), None);
    assert_eq!(horizon.due(secs(180)), message(2));
    horizon.vouched(message(2).unwrap(), secs(181));
    assert_eq!(horizon.release(secs(181)), 30);
}

#[test]
fn an_idle_keepalive_after_an_old_ack_is_released_with_the_next_look() {
    let t0 = Instant::now();
    let mut horizon = Horizon::new(Duration::from_secs(120), 10);
    horizon.offer(20, t0, message(1));
    let later = t0 + Duration::from_secs(600);
    horizon.offer(900, t0, message(1)); // a keepalive, nothing acknowledged since t0
    assert_eq!(horizon.due(later), message(1));
    horizon.vouched(message(1).unwrap(), later);
    assert_eq!(horizon.release(later), 900);
    horizon.offer(950, t0, message(1)); // the next keepalive needs no other look
    assert_eq!(horizon.due(later), None);
    assert_eq!(horizon.release(later), 950);
}

#[test]
fn a_horizon_resumed_by_the_next_attempt_keeps_what_waits_beyond_its_start() {
    let t0 = Instant::now();
    let span = Duration::from_secs(10);
    let mut horizon = Horizon::new(span, 10);
    horizon.offer(20, t0, message(1));
    horizon.offer(30, t0 + Duration::from_secs(5), message(2));
    let mut horizon = horizon.resumed_at(20);
    assert_eq!(horizon.release(t0), 20);
    let later = t0 + Duration::from_secs(15);
    assert_eq!(horizon.due(later), message(2));
    horizon.vouched(message(2).unwrap(), later);
    assert_eq!(horizon.release(later), 30);
}

#[test]
fn before_the_first_ack_a_position_waits_by_time_alone() {
    let t0 = Instant::now();
    let mut horizon = Horizon::new(Duration::from_secs(120), 10);
    horizon.offer(20, t0, None);
    assert_eq!(horizon.due(t0 + Duration::from_secs(120)), None);
    assert_eq!(horizon.release(t0 + Duration::from_secs(119)), 10);
    assert_eq!(horizon.release(t0 + Duration::from_secs(120)), 20);
}

#[test]
fn with_nothing_of_ours_past_the_start_a_position_without_acks_is_released_at_once() {
    let t0 = Instant::now();
    let mut horizon = Horizon::new(Duration::from_secs(120), 10);
    horizon.nothing_past_the_start();
    horizon.offer(20, t0, None);
    assert_eq!(horizon.release(t0), 20);
    horizon.offer(30, t0, message(3));
    assert_eq!(horizon.release(t0 + Duration::from_secs(119)), 20, "an ack still waits");
}

#[test]
fn a_pinned_seed_row_holds_every_position_past_its_slot_until_it_is_vouched_for() {
    let t0 = Instant::now();
    let mut horizon = Horizon::new(Duration::from_secs(120), 10);
    horizon.pin(message(5).unwrap(), t0, 10);
    horizon.offer(20, t0, message(6));
    let ripe = t0 + Duration::from_secs(120);
    assert_eq!(horizon.due(ripe), message(6), "the newest ripe message is looked for");
    horizon.vouched(message(5).unwrap(), ripe);
    assert_eq!(horizon.release(ripe), 10, "the seed's row vouched, the newer one not yet");
    assert!(horizon.pinned().is_none());
    horizon.vouched(message(6).unwrap(), ripe);
    assert_eq!(horizon.release(ripe), 20);
    let mut none = Horizon::new(Duration::ZERO, 0);
    none.pin(message(5).unwrap(), t0, 0);
    assert!(none.pinned().is_none(), "no horizon, nothing to wait for");
}

#[test]
fn positions_within_a_grain_wait_as_one() {
    let t0 = Instant::now();
    let mut horizon = Horizon::new(Duration::from_secs(120), 0);
    for i in 1..=1_000u64 {
        horizon.offer(i, t0 + Duration::from_millis(i), message(i));
    }
    assert!(horizon.waiting() <= 11, "{}", horizon.waiting());
}

/// What the property test below does at each step.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A message published and acknowledged.
    Publish,
    /// A keepalive: confirmable without a new acknowledgement.
    Keepalive,
    /// The message [`Horizon::due`] names looked for in the stream.
    Look,
    /// The server loses power and restarts with what it synced.
    PowerLoss,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Publish),
        1 => Just(Step::Keepalive),
        3 => Just(Step::Look),
        1 => Just(Step::PowerLoss),
    ]
}

proptest! {
    /// A server that syncs at least once a horizon and loses power at any moment, and a
    /// pgoutbox that may be paused for any time between any two steps (the gaps): no
    /// position is ever released past a message the server lost, before or after the
    /// loss; what is released never goes back, and once the stream is looked at a
    /// horizon after the last acknowledgement, everything offered is released.
    #[test]
    fn nothing_the_server_forgets_is_released(
        steps in proptest::collection::vec((step(), 0u64..3_000), 1..80),
        span_ms in 1u64..2_000,
        sync_fraction in 1u64..=100,
    ) {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let sync_every = (span_ms * sync_fraction / 100).max(1);
        let mut horizon = Horizon::new(Duration::from_millis(span_ms), 0);
        // The server: each message's sequence (= position) and when it was stored.
        let mut server: Vec<(u64, u64)> = Vec::new();
        let (mut now, mut sequence, mut released) = (0u64, 0u64, 0u64);
        let mut lost_from: Option<u64> = None;
        let mut last_ack: Option<(u64, u64)> = None;
        for (step, gap) in steps {
            now += gap;
            match step {
                // After a loss the chain guard refuses every publish of this attempt.
                Step::Publish if lost_from.is_none() => {
                    sequence += 1;
                    server.push((sequence, now));
                    last_ack = Some((sequence, now));
                    horizon.offer(10 * sequence, ms(now), message(sequence));
                }
                Step::Publish => {}
                Step::Keepalive => {
                    if let Some((acked, at)) = last_ack {
                        horizon.offer(10 * sequence + 5, ms(at), message(acked));
                    }
                }
                Step::Look => {
                    if let Some(stored) = horizon.due(ms(now))
                        && server.iter().any(|&(n, _)| n == stored.sequence)
                    {
                        horizon.vouched(stored, ms(now));
                    }
                }
                Step::PowerLoss => {
                    let synced = now / sync_every * sync_every;
                    if let Some(&(first, _)) = server.iter().find(|&&(_, at)| at > synced) {
                        let first = 10 * first;
                        prop_assert!(first > released, "released {released}, lost from {first}");
                        lost_from = Some(lost_from.map_or(first, |f| f.min(first)));
                    }
                    server.retain(|&(_, at)| at <= synced);
                }
            }
            let now_released = horizon.release(ms(now));
            prop_assert!(now_released >= released);
            released = now_released;
            if let Some(first) = lost_from {
                prop_assert!(released < first, "released {released} past lost {first}");
            }
        }
        if lost_from.is_none() && let Some((_, at)) = last_ack {
            let later = at + span_ms;
            if let Some(stored) = horizon.due(ms(later)) {
                horizon.vouched(stored, ms(later));
            }
            prop_assert!(horizon.release(ms(later)) >= 10 * sequence);
        }
    }
}

/// How acknowledgements arrive, as the gaps between them in ms.
#[derive(Debug, Clone)]
enum Arrivals {
    /// A writer that never pauses: one ack every `gap` ms.
    Constant { gap: u64 },
    /// Independent commits at `per_second` on average (exponential gaps), from a fixed seed.
    Poisson { per_second: u64, seed: u64 },
    /// `size` acks at once, then `pause` ms of nothing, again and again.
    Bursts { size: u64, pause: u64 },
}

impl Arrivals {
    /// The ack times in ms, up to `until`.
    fn times(&self, until: u64) -> Vec<u64> {
        let mut times = Vec::new();
        let mut now = 0u64;
        let mut state = match self {
            Arrivals::Poisson { seed, .. } => seed | 1,
            _ => 1,
        };
        while now <= until {
            match *self {
                Arrivals::Constant { gap } => {
                    times.push(now);
                    now += gap.max(1);
                }
                Arrivals::Poisson { per_second, .. } => {
                    times.push(now);
                    // xorshift: a uniform in (0, 1], then an exponential gap.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let uniform = ((state >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                    now += (-uniform.ln() * 1_000.0 / per_second.max(1) as f64) as u64;
                }
                Arrivals::Bursts { size, pause } => {
                    times.extend(std::iter::repeat_n(now, size.max(1) as usize));
                    now += pause.max(1);
                }
            }
        }
        times
    }
}

/// Drives a horizon of `span_ms` as the pipeline does: the acks of `arrivals` offered as they
/// come, a tick every 10 ms, a look at most every [`LOOK_EVERY`] that finds the message (the
/// server holds everything), for `until` ms. Returns, for each ack, when its position was
/// released (`None`: not by the end).
fn release_times(arrivals: &Arrivals, span_ms: u64, until: u64) -> Vec<(u64, Option<u64>)> {
    const TICK: u64 = 10;
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let look_every = LOOK_EVERY.as_millis() as u64;
    let mut horizon = Horizon::new(Duration::from_millis(span_ms), 0);
    let times = arrivals.times(until);
    let mut released_at: Vec<(u64, Option<u64>)> = times.iter().map(|&t| (t, None)).collect();
    let (mut next, mut last_look, mut released) = (0usize, None::<u64>, 0u64);
    let mut now = 0;
    while now <= until {
        while next < times.len() && times[next] <= now {
            let sequence = next as u64 + 1;
            horizon.offer(10 * sequence, ms(times[next]), message(sequence));
            next += 1;
        }
        if last_look.is_none_or(|at| now >= at + look_every)
            && let Some(stored) = horizon.due(ms(now))
        {
            last_look = Some(now);
            horizon.vouched(stored, ms(now));
        }
        let up_to = horizon.release(ms(now));
        for (index, (_, at)) in released_at.iter_mut().enumerate().skip(released as usize) {
            if 10 * (index as u64 + 1) > up_to {
                break;
            }
            *at = Some(now);
            released = index as u64 + 1;
        }
        now += TICK;
    }
    released_at
}

/// The longest any position waits: the horizon, the grain its ack may wait as one with
/// others, a look's gap, and a tick.
fn longest_wait(span_ms: u64) -> u64 {
    span_ms + GRAIN.as_millis() as u64 + LOOK_EVERY.as_millis() as u64 + 10
}

fn assert_each_released_in_time(arrivals: &Arrivals, span_ms: u64, until: u64) {
    let bound = longest_wait(span_ms);
    for (acked, released) in release_times(arrivals, span_ms, until) {
        if acked + bound > until {
            break;
        }
        let waited = released.map(|at| at - acked);
        assert!(
            waited.is_some_and(|w| w <= bound),
            "{arrivals:?}, horizon {span_ms} ms: the ack at {acked} ms waited {waited:?} ms \
             (at most {bound})"
        );
    }
}

#[test]
fn a_writer_that_never_pauses_is_released_a_horizon_after_each_ack() {
    // The case: the default horizon, acks 10-90 ms apart; the first release came at
    // 449 s when each ack moved its grain's time forward.
    for gap in [10, 37, 90, 99] {
        assert_each_released_in_time(&Arrivals::Constant { gap }, 150_000, 460_000);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever the gaps between acks (constant, Poisson, bursts), each position is released
    /// within the horizon, a grain, a look's gap and a tick of its ack, and so the WAL the
    /// slot holds stays near rate × horizon.
    #[test]
    fn every_arrival_pattern_is_released_within_the_horizon_and_a_look(
        arrivals in prop_oneof![
            (1u64..400).prop_map(|gap| Arrivals::Constant { gap }),
            (1u64..2_000, any::<u64>())
                .prop_map(|(per_second, seed)| Arrivals::Poisson { per_second, seed }),
            (1u64..50, 10u64..3_000).prop_map(|(size, pause)| Arrivals::Bursts { size, pause }),
        ],
        span_ms in 0u64..5_000,
    ) {
        assert_each_released_in_time(&arrivals, span_ms, 4 * span_ms + 5_000);
    }
}

#[test]
fn the_oldest_wait_says_since_when_and_until_when() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut horizon = Horizon::new(s(150), 0);
    assert_eq!(horizon.oldest_wait(t0), None);
    horizon.offer(10, t0, message(1));
    horizon.offer(20, t0 + s(60), message(2));
    assert_eq!(horizon.oldest_wait(t0 + s(100)), Some((s(100), s(50))));
    assert_eq!(horizon.oldest_wait(t0 + s(200)), Some((s(200), s(0))), "due, not yet looked at");
}
