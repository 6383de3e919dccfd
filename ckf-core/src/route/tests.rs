use super::*;
use std::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn dc(lane: LaneIndex, depth: u32) -> DcInput {
    DcInput {
        lane,
        depth,
        block_size: 16,
        rtt: None,
        configured_rtt: None,
        load: None,
        booked: 0,
    }
}

fn load(waiting: u32, capacity: f64) -> PoolLoad {
    PoolLoad {
        engines_reporting: 2,
        engines_configured: 2,
        running: 4,
        waiting,
        kv_usage: 0.5,
        prefill_tokens_per_s: capacity,
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[test]
fn each_term_of_the_formula_on_a_hand_computed_case() {
    let model = RouteModel::default();
    // 1,000 tokens. Lane 0: 800 cached (50 blocks of 16), 2 waiting + 1 booked at 20,000
    // tokens/s, the router's own 10 ms round trip. Lane 1: nothing cached, no report (default
    // 1 ms, 10,000 tokens/s). Lane 2: 992 cached, a report 6 s old (stale), 279 ms away.
    let dcs = [
        DcInput {
            rtt: Some(10 * MS),
            load: Some((load(2, 20_000.0), Duration::from_secs(1))),
            booked: 1,
            ..dc(0, 50)
        },
        dc(1, 0),
        DcInput {
            rtt: Some(279 * MS),
            load: Some((load(9, 50_000.0), Duration::from_secs(6))),
            ..dc(2, 62)
        },
    ];
    let route = route(&model, 1_000, &dcs);
    let [first, second, third] = route.ranked.as_slice() else {
        panic!("{route:?}")
    };
    // Lane 1: 1 ms + 0 + 1000 / 10000 s.
    assert_eq!(first.lane, 1);
    assert_eq!((first.cached_tokens, first.uncached_tokens), (0, 1_000));
    assert_eq!(first.load, LoadState::Unknown);
    assert!(!first.rtt_from_request);
    assert_eq!(first.ttft, MS + secs(0.1));
    // Lane 0: 10 ms + (2 + 1) * 1024 / 20000 s + 200 / (20000 / 2 engines) s: the queue
    // drains at the pool's rate, the request's own prefill runs on one of its two engines.
    assert_eq!(second.lane, 0);
    assert_eq!((second.cached_tokens, second.uncached_tokens), (800, 200));
    assert_eq!(second.load, LoadState::Known(Duration::from_secs(1)));
    assert!(second.rtt_from_request);
    assert_eq!(second.queue, secs(3.0 * 1024.0 / 20_000.0));
    assert_eq!(second.prefill, secs(0.02));
    assert_eq!(second.ttft, 10 * MS + secs(0.1536) + secs(0.02));
    // Lane 2: its stale report is not used (no queue, default capacity): 279 ms + 8 / 10000 s.
    assert_eq!(third.lane, 2);
    assert_eq!(third.load, LoadState::Stale(Duration::from_secs(6)));
    assert_eq!((third.capacity, third.queue), (10_000.0, Duration::ZERO));
    assert_eq!(third.ttft, 279 * MS + secs(0.0008));
    assert_eq!(route.choice, Some((1, Reason::Fastest)));
}

#[test]
fn equal_estimates_go_to_the_deeper_prefix_then_the_lower_lane() {
    let model = RouteModel::default();
    // Lane 0: nothing cached, 1 ms: 1 + 102.4 ms. Lane 1: half cached, 52.2 ms: 52.2 + 51.2 ms.
    let dcs = [
        dc(0, 0),
        DcInput {
            rtt: Some(Duration::from_micros(52_200)),
            ..dc(1, 32)
        },
    ];
    let route = route(&model, 1_024, &dcs);
    assert_eq!(route.ranked[0].ttft, route.ranked[1].ttft);
    assert_eq!(route.choice, Some((1, Reason::DeepestOfEqual)));
    // Identical DCs: the lower lane, and nothing to break by depth.
    let route = super::route(&model, 1_024, &[dc(3, 4), dc(2, 4)]);
    assert_eq!(route.choice, Some((2, Reason::Fastest)));
    // No DC, no choice.
    assert_eq!(super::route(&model, 1_024, &[]).choice, None);
}

#[test]
fn the_routers_own_round_trips_override_the_default_and_can_flip_the_choice() {
    let model = RouteModel::default();
    // Lane 0 holds everything, lane 1 nothing: with default round trips lane 0 wins.
    let dcs = [dc(0, 64), dc(1, 0)];
    assert_eq!(
        route(&model, 1_024, &dcs).choice,
        Some((0, Reason::Fastest))
    );
    // The router is 456 ms from lane 0 and 1 ms from lane 1: prefilling 1,024 tokens at
    // 10,000 tokens/s (102.4 ms) is faster than the round trip.
    let far = [
        DcInput {
            rtt: Some(456 * MS),
            ..dc(0, 64)
        },
        DcInput {
            rtt: Some(MS),
            ..dc(1, 0)
        },
    ];
    let route = route(&model, 1_024, &far);
    assert_eq!(route.choice, Some((1, Reason::Fastest)));
    assert_eq!(route.ranked[1].ttft, 456 * MS);
    // A configured round trip stands when the request gives none, and yields to its own.
    let configured = [
        DcInput {
            configured_rtt: Some(456 * MS),
            ..dc(0, 64)
        },
        dc(1, 0),
    ];
    let by_config = super::route(&model, 1_024, &configured);
    assert_eq!(by_config.choice, Some((1, Reason::Fastest)));
    assert!(!by_config.ranked[1].rtt_from_request);
    let overridden = [
        DcInput {
            rtt: Some(MS),
            ..configured[0]
        },
        configured[1],
    ];
    assert_eq!(
        super::route(&model, 1_024, &overridden).choice,
        Some((0, Reason::Fastest))
    );
}

#[test]
fn a_depth_past_the_request_counts_only_the_request() {
    let route = route(&RouteModel::default(), 100, &[dc(0, 64)]);
    assert_eq!(
        (
            route.ranked[0].cached_tokens,
            route.ranked[0].uncached_tokens
        ),
        (100, 0)
    );
    assert_eq!(route.ranked[0].ttft, MS);
}

#[test]
fn a_burst_inside_one_load_interval_is_spread_as_the_model_predicts() {
    // Two DCs with nothing cached and nothing waiting, 16,384 and 8,192 tokens/s (every
    // estimate is exact in binary), requests of 1,024 tokens, one request standing for 1,024.
    let model = RouteModel::default();
    let capacity = [16_384.0, 8_192.0];
    let mut bookings = Bookings::default();
    let mut chosen = [0_u32; 2];
    // The model by hand: ttft_d - rtt = (booked_d + 1) * 1024 / capacity_d; ties to lane 0.
    let mut predicted = [0_u32; 2];
    for _ in 0..100 {
        let dcs: Vec<DcInput> = (0..2)
            .map(|lane| DcInput {
                load: Some((load(0, capacity[usize::from(lane)]), Duration::ZERO)),
                booked: bookings.booked(lane),
                ..dc(lane, 0)
            })
            .collect();
        let (lane, _) = route(&model, 1_024, &dcs).choice.expect("a choice");
        bookings.book(lane, Instant::now());
        chosen[usize::from(lane)] += 1;
        // (b0 + 1) / 16384 <= (b1 + 1) / 8192  <=>  (b0 + 1) <= 2 (b1 + 1)
        let by_hand = usize::from(predicted[0] + 1 > 2 * (predicted[1] + 1));
        predicted[by_hand] += 1;
    }
    assert_eq!(chosen, predicted);
    assert_eq!(chosen, [67, 33], "two to one, as the capacities");
    // A report observed after the bookings covers them.
    bookings.reported(0, Instant::now());
    assert_eq!((bookings.booked(0), bookings.booked(1)), (0, 33));
}

#[test]
fn a_report_covers_only_the_bookings_made_before_its_observation() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut bookings = Bookings::default();
    for ms in [10, 20, 30] {
        bookings.book(1, at(ms));
    }
    assert_eq!((bookings.booked(0), bookings.booked(1)), (0, 3));
    // A report observed at 5 ms (received later, or re-sent): nothing it could count.
    bookings.reported(1, at(5));
    assert_eq!(bookings.booked(1), 3);
    // Observed at 20 ms: the two made by then.
    bookings.reported(1, at(20));
    assert_eq!(bookings.booked(1), 1);
    bookings.reported(0, at(1_000));
    assert_eq!(
        bookings.booked(1),
        1,
        "another lane's report changes nothing"
    );
    // The bound: the oldest are forgotten.
    for i in 0..Bookings::MAX_PER_LANE as u64 + 5 {
        bookings.book(2, at(100 + i));
    }
    assert_eq!(bookings.booked(2) as usize, Bookings::MAX_PER_LANE);
    bookings.reported(2, at(104));
    assert_eq!(bookings.booked(2) as usize, Bookings::MAX_PER_LANE);
    bookings.reported(2, at(105));
    assert_eq!(bookings.booked(2) as usize, Bookings::MAX_PER_LANE - 1);
}

#[test]
fn without_load_every_dc_is_ranked_by_prefix_and_round_trip() {
    let model = RouteModel::default();
    let dcs = [
        DcInput {
            booked: 50,
            ..dc(0, 10)
        },
        dc(1, 20),
        DcInput {
            rtt: Some(5 * MS),
            ..dc(2, 40)
        },
    ];
    let route = route(&model, 1_024, &dcs);
    assert!(route.ranked.iter().all(|e| e.load == LoadState::Unknown));
    assert!(
        route.ranked.iter().all(|e| e.queue == Duration::ZERO),
        "bookings need a report"
    );
    // 2: 5 ms + 384/10000 s = 43.4 ms; 1: 1 ms + 704/10000 s = 71.4 ms; 0: 1 + 86.4 ms.
    let lanes: Vec<LaneIndex> = route.ranked.iter().map(|e| e.lane).collect();
    assert_eq!(lanes, vec![2, 1, 0]);
}

#[test]
fn a_pool_load_counts_what_its_engines_reported_and_only_that() {
    let share = |load, capacity| EngineShare {
        load,
        prefill_tokens_per_s: capacity,
        ranks: 1,
    };
    let busy = EngineLoad {
        running: 8,
        waiting: 3,
        kv_usage: 0.9,
    };
    let idle = EngineLoad {
        running: 0,
        waiting: 0,
        kv_usage: 0.1,
    };
    let pool = PoolLoad::from_engines(&[
        share(Some(busy), 6_000.0),
        share(None, 50_000.0),
        share(Some(idle), 4_000.0),
    ])
    .expect("two engines reported");
    assert_eq!(
        (pool.engines_reporting, pool.engines_configured),
        (2, 3),
        "the silent engine is configured, not reporting"
    );
    assert_eq!((pool.running, pool.waiting), (8, 3));
    assert!((pool.kv_usage - 0.5).abs() < 1e-12, "{}", pool.kv_usage);
    assert_eq!(
        pool.prefill_tokens_per_s, 10_000.0,
        "only the reporting engines' capacity"
    );
    assert_eq!(PoolLoad::from_engines(&[share(None, 1.0)]), None);
    assert_eq!(PoolLoad::from_engines(&[]), None);
}

#[test]
fn a_lane_keeps_its_newest_valid_report_with_its_age() {
    let t0 = Instant::now();
    let mut loads = LaneLoads::default();
    assert_eq!(loads.latest(3, t0), None);
    let report = load(4, 8_000.0);
    // Sent 200 ms after it was observed, received at t0: 200 ms old then, 1.2 s a second on.
    loads
        .report(3, 1, 1, report, 200 * MS, t0)
        .expect("first report");
    assert_eq!(loads.latest(3, t0), Some((report, 200 * MS)));
    assert_eq!(
        loads.latest(3, t0 + Duration::from_secs(1)),
        Some((report, 1_200 * MS))
    );
    // An older one (same lease, same or lower sequence) is ignored.
    let other = load(9, 1.0);
    assert_eq!(
        loads.report(3, 1, 1, other, Duration::ZERO, t0),
        Err(LoadRefused::Older)
    );
    assert_eq!(loads.latest(3, t0).map(|(l, _)| l), Some(report));
    // A new lease starts its sequence again.
    loads
        .report(3, 2, 1, other, Duration::ZERO, t0)
        .expect("a new lease's first report");
    assert_eq!(
        loads.report(3, 1, 7, report, Duration::ZERO, t0),
        Err(LoadRefused::Older),
        "an older lease"
    );
    // Out of range: refused, nothing changes; other lanes untouched.
    for bad in [
        PoolLoad {
            kv_usage: 1.5,
            ..report
        },
        PoolLoad {
            prefill_tokens_per_s: f64::NAN,
            ..report
        },
        PoolLoad {
            engines_reporting: 3,
            ..report
        },
        PoolLoad {
            prefill_tokens_per_s: 1e-300,
            ..report
        },
        PoolLoad {
            engines_reporting: 0,
            ..report
        },
    ] {
        let refused = loads.report(3, 2, 9, bad, Duration::ZERO, t0).unwrap_err();
        assert_eq!(refused.label(), "invalid", "{refused}");
    }
    assert_eq!(loads.latest(3, t0).map(|(l, _)| l), Some(other));
    assert_eq!(loads.latest(0, t0), None);
}

#[test]
fn huge_inputs_saturate_instead_of_overflowing() {
    // A round trip near Duration::MAX, a request of u64::MAX tokens at the least capacity,
    // and a queue that overflows f64: the estimate saturates, the overloaded DC ranks last.
    let model = RouteModel::default();
    let dcs = [
        DcInput {
            rtt: Some(Duration::MAX - MS),
            ..dc(0, 0)
        },
        DcInput {
            load: Some((
                PoolLoad {
                    waiting: u32::MAX,
                    ..load(0, 1.0)
                },
                Duration::ZERO,
            )),
            ..dc(1, 0)
        },
        dc(2, 0),
    ];
    let route = route(&model, u64::MAX, &dcs);
    assert!(route.ranked.iter().all(|e| e.ttft > Duration::ZERO));
    assert_eq!(route.ranked[0].lane, 2, "{route:?}");
    let overflowing = RouteModel {
        queued_request_tokens: f64::MAX,
        ..model
    };
    let queued = super::route(&overflowing, 1, &dcs[1..]);
    let busy = queued.ranked.iter().find(|e| e.lane == 1).expect("lane 1");
    assert_eq!(
        busy.queue,
        Duration::MAX,
        "an infinite queue is the longest"
    );
    assert_eq!(queued.choice, Some((2, Reason::Fastest)));
}

#[test]
fn a_deeper_prefix_within_the_band_of_the_fastest_is_chosen() {
    // 1,024 tokens at the default 10,000 tokens/s. Lane 0: nothing cached, 1 ms: 103.4 ms.
    // Lane 1: 512 cached, 51.2 ms of prefill + its round trip.
    let with_rtt = |ms: u32| {
        [
            dc(0, 0),
            DcInput {
                rtt: Some(ms * MS),
                ..dc(1, 32)
            },
        ]
    };
    let model = RouteModel::default();
    // 75 ms: 126.2 ms <= 1.25 x 103.4 = 129.25 ms: the deeper lane 1, though slower.
    let r = route(&model, 1_024, &with_rtt(75));
    assert_eq!(r.ranked[0].lane, 0, "ranked by estimate");
    assert_eq!(r.choice, Some((1, Reason::DeepestOfEqual)));
    // 79 ms: 130.2 ms > 129.25 ms: the fastest.
    assert_eq!(
        route(&model, 1_024, &with_rtt(79)).choice,
        Some((0, Reason::Fastest))
    );
    // Without a band only exact ties go to depth.
    let exact = RouteModel {
        prefer_deeper_within: 0.0,
        ..model
    };
    assert_eq!(
        route(&exact, 1_024, &with_rtt(75)).choice,
        Some((0, Reason::Fastest))
    );
    // The fastest being the deepest is simply the fastest.
    let r = route(
        &model,
        1_024,
        &[
            dc(0, 32),
            DcInput {
                rtt: Some(10 * MS),
                ..dc(1, 0)
            },
        ],
    );
    assert_eq!(r.choice, Some((0, Reason::Fastest)));
}

#[test]
fn an_engine_without_a_capacity_counts_at_the_mean_of_the_others() {
    let share = |capacity: f64| EngineShare {
        load: Some(EngineLoad {
            running: 1,
            waiting: 1,
            kv_usage: 0.5,
        }),
        prefill_tokens_per_s: capacity,
        ranks: 1,
    };
    // 20,000 + 10,000 known, one unknown: 45,000 over three engines, 15,000 each.
    let pool = PoolLoad::from_engines(&[share(20_000.0), share(0.0), share(10_000.0)]).unwrap();
    assert_eq!(
        (pool.engines_reporting, pool.prefill_tokens_per_s),
        (3, 45_000.0)
    );
    // None known: 0, and the route model then takes one engine of the default capacity.
    // An engine of two data-parallel ranks counts as two: 20,000 tokens/s over 2 ranks plus
    // one rank without a capacity at 10,000.
    let dp = EngineShare {
        ranks: 2,
        ..share(20_000.0)
    };
    let pool = PoolLoad::from_engines(&[dp, share(0.0)]).unwrap();
    assert_eq!(
        (
            pool.engines_reporting,
            pool.engines_configured,
            pool.prefill_tokens_per_s
        ),
        (3, 3, 30_000.0)
    );
    let none = PoolLoad::from_engines(&[share(0.0), share(0.0)]).unwrap();
    assert_eq!(none.prefill_tokens_per_s, 0.0);
    let model = RouteModel::default();
    let dcs = [DcInput {
        load: Some((none, Duration::ZERO)),
        ..dc(0, 0)
    }];
    let r = route(&model, 1_000, &dcs);
    // 1 ms + (2 waiting x 1,024) / 10,000 s + 1,000 / 10,000 s.
    assert_eq!(r.ranked[0].prefill, secs(0.1));
    assert_eq!(r.ranked[0].ttft, MS + secs(0.2048) + secs(0.1));
}

#[test]
fn a_new_lease_drops_its_predecessors_report_and_refuses_older_leases() {
    let t0 = Instant::now();
    let mut loads = LaneLoads::default();
    loads
        .report(2, 1, 5, load(500, 8_000.0), Duration::ZERO, t0)
        .unwrap();
    assert!(loads.latest(2, t0).is_some());
    // The producer restarts: lease 2 takes the lane before reporting.
    loads.lease_started(2, 2);
    assert_eq!(
        loads.latest(2, t0),
        None,
        "the dead incarnation's queue is not the pool's"
    );
    assert_eq!(
        loads.report(2, 1, 6, load(1, 8_000.0), Duration::ZERO, t0),
        Err(LoadRefused::Older)
    );
    loads
        .report(2, 2, 1, load(3, 8_000.0), Duration::ZERO, t0)
        .unwrap();
    assert_eq!(loads.latest(2, t0).map(|(l, _)| l.waiting), Some(3));
    // The same lease again (a re-attach of the holder) keeps its report; other lanes untouched.
    loads.lease_started(2, 2);
    assert!(loads.latest(2, t0).is_some());
    loads.lease_started(0, 9);
    assert!(loads.latest(2, t0).is_some());
}
