use super::*;
use crate::bench::synth::synthetic_workload;
use crate::hashing::block_hashes;

fn hashes_of(requests: &[Request]) -> Vec<Vec<u64>> {
    requests.iter().map(|r| block_hashes(&r.hash_ids)).collect()
}

fn request(timestamp_ms: u64, input_length: u64, hash_ids: &[u64]) -> Request {
    Request {
        timestamp_ms,
        input_length,
        output_length: 1,
        hash_ids: hash_ids.to_vec(),
    }
}

fn one_engine_per_dc(dcs: usize) -> FleetShape {
    FleetShape {
        dcs,
        workers_per_dc: 1,
        ranks_per_worker: 1,
        capacity_blocks: 64,
    }
}

#[test]
fn ckf_beats_cache_blind_policies_on_shared_prefixes() {
    let requests = synthetic_workload(1500, 3);
    let hashes = hashes_of(&requests);
    let shape = FleetShape {
        dcs: 3,
        workers_per_dc: 2,
        ranks_per_worker: 2,
        capacity_blocks: 256,
    };
    let model = ServingModel::unequal(3);
    let run = |p| serve(&requests, &hashes, shape, &model, p, 1).hit_rate;
    let deepest = run(Policy::DeepestPrefix);
    for blind in [Policy::Random, Policy::RoundRobin, Policy::LeastLoaded] {
        let other = run(blind);
        assert_eq!(deepest.blocks_requested, other.blocks_requested);
        assert!(
            deepest.hit_rate > other.hit_rate,
            "{deepest:?} vs {other:?}"
        );
    }
    assert!(deepest.blocks_reused <= deepest.blocks_requested);
}

#[test]
fn ttft_is_round_trip_wait_and_prefill_at_one_engines_rate() {
    // One DC, one engine of 1,000 tokens/s, 10 ms away. Request 0 at 0 ms: 2 blocks, 1,000
    // tokens, nothing cached: 10 + 1,000 ms. Request 1 at 100 ms, same prefix + 1 block
    // (1,500 tokens, 1,024 cached): it waits for request 0 (arrives at 105 ms, starts at
    // 1,005 ms), prefills 476 tokens: first token back at 1,005 + 476 + 5 ms, 1,386 ms after
    // it was sent. Request 2 at 5,000 ms: alone again, 512 tokens, nothing cached.
    let requests = [
        request(0, 1_000, &[1, 2]),
        request(100, 1_500, &[1, 2, 3]),
        request(5_000, 512, &[9]),
    ];
    let model = ServingModel {
        dcs: vec![DcServing {
            prefill_tokens_per_s: 1_000.0,
            rtt_ms: 10.0,
        }],
        speed: 1.0,
        load_interval_ms: 1_000.0,
        queued_request_tokens: 1_000.0,
    };
    let out = serve(
        &requests,
        &hashes_of(&requests),
        one_engine_per_dc(1),
        &model,
        Policy::RoundRobin,
        0,
    );
    let close = |got: f64, want: f64| (got - want).abs() <= want * 1e-3;
    assert!(close(out.ttft_ms.max, 1_386.0), "{:?}", out.ttft_ms);
    assert!(close(out.ttft_ms.p50, 1_010.0), "{:?}", out.ttft_ms);
    let mean = (1_010.0 + 1_386.0 + 522.0) / 3.0;
    assert!((out.ttft_ms.mean - mean).abs() < 1e-6, "{:?}", out.ttft_ms);
    assert_eq!(
        (out.hit_rate.blocks_requested, out.hit_rate.blocks_reused),
        (6, 2)
    );
    assert_eq!(out.dcs[0].requests, 3);
    assert_eq!(
        out.dcs[0].peak_queue, 1,
        "request 1 waited behind request 0"
    );
    // Twice the speed: request 1 arrives at 55 ms, still behind request 0 (until 1,005 ms).
    let fast = ServingModel {
        speed: 2.0,
        ..model
    };
    let out = serve(
        &requests,
        &hashes_of(&requests),
        one_engine_per_dc(1),
        &fast,
        Policy::RoundRobin,
        0,
    );
    assert!(
        close(out.ttft_ms.max, 1_005.0 + 476.0 + 5.0 - 50.0),
        "{:?}",
        out.ttft_ms
    );
}

#[test]
fn expected_ttft_books_its_choices_and_spreads_a_burst_by_capacity() {
    // 30 cold requests at the same instant on two equal-distance DCs, one with twice the
    // other's capacity, no load observed yet: only the bookings tell them apart. The route
    // model (default capacity, 1,000-token queue entries, 1,000-token requests) alternates as
    // the bookings grow; least-loaded spreads by in-flight count alone.
    let requests: Vec<Request> = (0..30)
        .map(|i| request(0, 1_000, &[100 + i, 200 + i]))
        .collect();
    let model = ServingModel {
        dcs: vec![
            DcServing {
                prefill_tokens_per_s: 2_000.0,
                rtt_ms: 1.0,
            },
            DcServing {
                prefill_tokens_per_s: 1_000.0,
                rtt_ms: 1.0,
            },
        ],
        speed: 1.0,
        load_interval_ms: 1_000.0,
        queued_request_tokens: 1_000.0,
    };
    let hashes = hashes_of(&requests);
    let shape = one_engine_per_dc(2);
    let ttft = serve(&requests, &hashes, shape, &model, Policy::ExpectedTtft, 0);
    let least = serve(&requests, &hashes, shape, &model, Policy::LeastLoaded, 0);
    // Unknown load: the bookings enter no estimate, so every request goes to the lower lane;
    // least-loaded alternates.
    assert_eq!(ttft.dcs[0].requests, 30, "{:?}", ttft.dcs);
    assert_eq!((least.dcs[0].requests, least.dcs[1].requests), (15, 15));
    // Once the load is observed (requests after the first second), bookings count: a burst
    // at 1.5 s splits 2:1 by capacity.
    let mut later = requests.clone();
    for (i, r) in later.iter_mut().enumerate() {
        r.timestamp_ms = 1_500;
        r.hash_ids = vec![300 + i as u64];
    }
    let mut all = vec![request(0, 10, &[1])];
    all.extend(later);
    let hashes = hashes_of(&all);
    let ttft = serve(&all, &hashes, shape, &model, Policy::ExpectedTtft, 0);
    let burst0 = ttft.dcs[0].requests - 1;
    assert_eq!((burst0, ttft.dcs[1].requests), (20, 10), "{:?}", ttft.dcs);
}

#[test]
fn an_invalid_model_names_what_is_wrong() {
    let mut model = ServingModel::unequal(3);
    assert!(model.validate(3).is_ok());
    assert!(
        model
            .validate(2)
            .unwrap_err()
            .contains("3 DC serving entries for 2 DCs")
    );
    model.dcs[1].prefill_tokens_per_s = 0.0;
    assert!(
        model
            .validate(3)
            .unwrap_err()
            .contains("prefill tokens/s = 0: must be a number in 1..=1000000000000")
    );
    let mut model = ServingModel::unequal(3);
    model.speed = f64::NAN;
    assert!(model.validate(3).unwrap_err().contains("speed"));
    let model = ServingModel::unequal(3);
    assert_eq!(
        model.dcs.iter().map(|d| d.rtt_ms).collect::<Vec<_>>(),
        [2.0, 40.0, 280.0]
    );
    assert_eq!(
        model.dcs[1].prefill_tokens_per_s * 2.0,
        model.dcs[0].prefill_tokens_per_s
    );
}

#[test]
fn on_the_built_in_workload_expected_ttft_meets_its_targets() {
    // The defaults of `ckf simulate`: the built-in workload (4,000 requests, seed 42), three
    // DCs of 2 x 2 ranks with 1,024 blocks each, the unequal-capacity, one-far-DC model.
    let requests = synthetic_workload(4_000, 42);
    let hashes = hashes_of(&requests);
    let shape = FleetShape {
        dcs: 3,
        workers_per_dc: 2,
        ranks_per_worker: 2,
        capacity_blocks: 1_024,
    };
    let mut model = ServingModel::unequal(3);
    model.queued_request_tokens =
        requests.iter().map(|r| r.input_length as f64).sum::<f64>() / requests.len() as f64;
    let comparison =
        crate::bench::report::ServingComparison::run(&requests, &hashes, shape, &model, 42);
    let targets = comparison.targets();
    assert_eq!(targets.len(), 4);
    assert!(targets.iter().all(|(_, met)| *met), "{targets:?}");
}

#[test]
fn odd_timestamps_and_intervals_never_panic_and_extremes_are_refused() {
    // An observation time rounded above the request's (1.7 s / 0.1 s), and a timestamp before
    // the previous one (counted as the previous): every policy serves both requests.
    let requests = [
        request(0, 512, &[1]),
        request(1_700, 512, &[2]),
        request(1_000, 512, &[3]),
    ];
    let model = ServingModel {
        load_interval_ms: 100.0,
        ..ServingModel::unequal(2)
    };
    for policy in Policy::ALL {
        let out = serve(
            &requests,
            &hashes_of(&requests),
            one_engine_per_dc(2),
            &model,
            policy,
            0,
        );
        assert_eq!(out.ttft_ms.count, 3, "{policy:?}");
        assert!(out.ttft_ms.max.is_finite(), "{policy:?}: {:?}", out.ttft_ms);
    }
    let refused = |m: ServingModel| m.validate(2).unwrap_err();
    assert!(
        refused(ServingModel {
            speed: 1e-310,
            ..model.clone()
        })
        .contains("speed")
    );
    let mut far = model.clone();
    far.dcs[0].rtt_ms = 1e300;
    assert!(refused(far).contains("round trip (ms) = "));
    let mut tiny = model.clone();
    tiny.dcs[1].prefill_tokens_per_s = 1e-300;
    assert!(refused(tiny).contains("prefill tokens/s"));
    assert!(
        refused(ServingModel {
            load_interval_ms: 1e-9,
            ..model
        })
        .contains("load interval")
    );
}
