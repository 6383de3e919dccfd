use super::*;

const MS: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_millis(3_000);

fn limits(max_pushed: usize) -> PushLimits {
    PushLimits {
        ttl: TTL,
        max_pushed,
    }
}

fn engine(worker_id: u64, capacity: f64, scraped: bool) -> ConfiguredEngine {
    ConfiguredEngine {
        worker_id,
        prefill_tokens_per_s: capacity,
        ranks: 1,
        scraped,
    }
}

fn load(running: u32, waiting: u32, kv_usage: f64) -> EngineLoad {
    EngineLoad {
        running,
        waiting,
        kv_usage,
    }
}

fn push(worker_id: u64, load: EngineLoad, capacity: Option<f64>) -> PushedLoad {
    PushedLoad {
        worker_id,
        load,
        prefill_tokens_per_s: capacity,
        age: Duration::ZERO,
    }
}

#[test]
fn a_pushed_worker_not_configured_joins_the_pool_with_its_capacity() {
    let t0 = Instant::now();
    let mut shares = PoolShares::new(&[engine(7, 8_000.0, true)], limits(4));
    shares.scraped(0, Some(load(3, 4, 0.25)), t0);
    let accepted = shares
        .push(&push(42, load(1, 2, 0.75), Some(2_000.0)), t0 + 10 * MS)
        .unwrap();
    assert_eq!(
        accepted,
        PushAccepted {
            prefill_tokens_per_s: 2_000.0,
            expires_in: TTL
        }
    );
    let (pool, age) = shares.pool(t0 + 100 * MS).unwrap();
    assert_eq!(
        pool,
        PoolLoad {
            engines_reporting: 2,
            engines_configured: 2,
            running: 4,
            waiting: 6,
            kv_usage: 0.5,
            prefill_tokens_per_s: 10_000.0,
        }
    );
    assert_eq!(age, 100 * MS, "the oldest reading is the scrape's");
    assert_eq!(shares.configured(t0), 2);
    assert_eq!(shares.pushed_workers(), 1);
}

#[test]
fn a_push_for_a_configured_engine_is_its_share_and_its_configured_capacity_wins() {
    let t0 = Instant::now();
    let engines = [engine(7, 8_000.0, false), engine(8, 0.0, false)];
    let mut shares = PoolShares::new(&engines, limits(0));
    assert_eq!(shares.pool(t0), None, "nothing known yet");
    assert_eq!(shares.configured(t0), 2);
    let accepted = shares
        .push(&push(7, load(1, 1, 0.5), Some(3_000.0)), t0)
        .unwrap();
    assert_eq!(accepted.prefill_tokens_per_s, 8_000.0, "configured wins");
    // Engine 8 was configured without a capacity: the pushed one counts.
    let accepted = shares
        .push(&push(8, load(1, 1, 0.5), Some(3_000.0)), t0)
        .unwrap();
    assert_eq!(accepted.prefill_tokens_per_s, 3_000.0);
    let (pool, _) = shares.pool(t0).unwrap();
    assert_eq!(
        (
            pool.engines_reporting,
            pool.engines_configured,
            pool.prefill_tokens_per_s
        ),
        (2, 2, 11_000.0)
    );
    // No room is needed for configured engines (max_pushed 0), and none is taken.
    assert_eq!(shares.pushed_workers(), 0);
    let refused = shares
        .push(&push(9, load(0, 0, 0.0), None), t0)
        .unwrap_err();
    assert_eq!(
        refused,
        PushRefused::Full {
            worker_id: 9,
            limit: 0
        }
    );
    assert_eq!(refused.label(), "full");
}

#[test]
fn a_scraped_engine_cannot_be_pushed() {
    let t0 = Instant::now();
    let mut shares = PoolShares::new(&[engine(7, 8_000.0, true)], limits(4));
    let refused = shares
        .push(&push(7, load(1, 1, 0.5), None), t0)
        .unwrap_err();
    assert_eq!(refused, PushRefused::Scraped(7));
    assert_eq!(refused.label(), "invalid");
    assert!(refused.to_string().starts_with("worker_id: "), "{refused}");
    assert_eq!(shares.pool(t0), None, "unchanged");
}

#[test]
fn out_of_range_values_are_refused_naming_the_field_and_change_nothing() {
    let t0 = Instant::now();
    let mut shares = PoolShares::new(&[], limits(4));
    let cases = [
        (push(1, load(0, 0, 1.5), None), "kv_usage"),
        (push(1, load(0, 0, -0.1), None), "kv_usage"),
        (push(1, load(0, 0, f64::NAN), None), "kv_usage"),
        (push(1, load(0, 0, 0.5), Some(0.5)), "prefill_tokens_per_s"),
        (push(1, load(0, 0, 0.5), Some(-3.0)), "prefill_tokens_per_s"),
        (
            push(1, load(0, 0, 0.5), Some(f64::INFINITY)),
            "prefill_tokens_per_s",
        ),
        // Finite but so large that two such workers would sum to infinity.
        (
            push(1, load(0, 0, 0.5), Some(1.7e308)),
            "prefill_tokens_per_s",
        ),
        (
            push(1, load(0, 0, 0.5), Some(MAX_CAPACITY * 2.0)),
            "prefill_tokens_per_s",
        ),
        (
            PushedLoad {
                age: TTL,
                ..push(1, load(0, 0, 0.5), None)
            },
            "age_ms",
        ),
    ];
    for (report, field) in cases {
        let refused = shares.push(&report, t0).unwrap_err();
        assert!(
            matches!(&refused, PushRefused::Invalid { field: f, .. } if *f == field),
            "{report:?}: {refused:?}"
        );
        assert!(refused.to_string().starts_with(field), "{refused}");
        assert_eq!(refused.label(), "invalid");
    }
    assert_eq!(shares.pushed_workers(), 0);
    assert_eq!(shares.pool(t0), None);
    // The edges are valid: usage 0 and 1, capacity 0 and 1, an age just below the TTL.
    for report in [
        push(1, load(0, 0, 0.0), Some(0.0)),
        push(2, load(0, 0, 1.0), Some(1.0)),
        PushedLoad {
            age: TTL - MS,
            ..push(3, load(0, 0, 0.5), None)
        },
    ] {
        shares.push(&report, t0).unwrap();
    }
}

#[test]
fn a_share_not_renewed_becomes_unknown_then_is_forgotten() {
    let t0 = Instant::now();
    let mut shares = PoolShares::new(&[engine(7, 8_000.0, false)], limits(4));
    shares.push(&push(7, load(1, 0, 0.5), None), t0).unwrap();
    // Observed 1 s before it was sent: it expires 1 s earlier.
    let report = PushedLoad {
        age: 1_000 * MS,
        ..push(42, load(2, 3, 0.5), Some(1_000.0))
    };
    let accepted = shares.push(&report, t0).unwrap();
    assert_eq!(accepted.expires_in, TTL - 1_000 * MS);
    let (pool, age) = shares.pool(t0).unwrap();
    assert_eq!((pool.engines_reporting, pool.running), (2, 3));
    assert_eq!(age, 1_000 * MS);
    // Worker 42's share expired, engine 7's not yet: 42 unknown, still configured.
    let (pool, _) = shares.pool(t0 + TTL - 1_000 * MS).unwrap();
    assert_eq!(
        (
            pool.engines_reporting,
            pool.engines_configured,
            pool.running
        ),
        (1, 2, 1)
    );
    assert_eq!(pool.prefill_tokens_per_s, 8_000.0);
    // Both expired: the pool's load is unknown, never zero.
    assert_eq!(shares.pool(t0 + TTL), None);
    assert_eq!(shares.configured(t0 + TTL), 2);
    // Worker 42 is forgotten 10 TTLs after its observation; the configured engine never is.
    let forgotten = t0 + TTL * FORGET_AFTER_TTLS - 1_000 * MS;
    assert_eq!(shares.configured(forgotten - MS), 2);
    assert_eq!(shares.configured(forgotten), 1);
    // A new push makes it known again.
    shares
        .push(&push(42, load(0, 0, 0.0), None), forgotten)
        .unwrap();
    assert_eq!(shares.pool(forgotten).unwrap().0.engines_reporting, 1);
}

#[test]
fn a_scraped_reading_holds_until_the_next_scrape() {
    let t0 = Instant::now();
    let mut shares = PoolShares::new(&[engine(7, 8_000.0, true)], limits(0));
    shares.scraped(0, Some(load(1, 1, 0.5)), t0);
    let (pool, age) = shares.pool(t0 + TTL * 2).unwrap();
    assert_eq!((pool.engines_reporting, age), (1, TTL * 2));
    shares.scraped(0, None, t0 + TTL * 2);
    assert_eq!(shares.pool(t0 + TTL * 2), None);
    shares.scraped(5, Some(load(1, 1, 0.5)), t0);
    assert_eq!(
        shares.pool(t0),
        None,
        "an index past the engines is ignored"
    );
}

#[test]
fn distinct_pushed_workers_are_bounded_and_forgotten_ones_make_room() {
    let t0 = Instant::now();
    let mut shares = PoolShares::new(&[], limits(3));
    for worker in 0..3 {
        shares
            .push(&push(worker, load(1, 0, 0.5), None), t0)
            .unwrap();
    }
    // A flood of new ids is refused; the held ones may still renew.
    for worker in 3..100 {
        let refused = shares
            .push(&push(worker, load(1, 0, 0.5), None), t0)
            .unwrap_err();
        assert_eq!(
            refused,
            PushRefused::Full {
                worker_id: worker,
                limit: 3
            }
        );
    }
    assert_eq!(shares.pushed_workers(), 3);
    shares
        .push(&push(1, load(5, 0, 0.5), None), t0 + MS)
        .unwrap();
    assert_eq!(shares.pool(t0 + MS).unwrap().0.running, 7);
    // Expired is not forgotten: still no room.
    assert!(
        shares
            .push(&push(3, load(1, 0, 0.5), None), t0 + TTL)
            .is_err()
    );
    // Workers 0 and 2 forgotten (1 renewed later): room for one more, not two.
    let later = t0 + TTL * FORGET_AFTER_TTLS;
    shares.push(&push(3, load(1, 0, 0.5), None), later).unwrap();
    shares.push(&push(4, load(1, 0, 0.5), None), later).unwrap();
    assert!(shares.push(&push(5, load(1, 0, 0.5), None), later).is_err());
    assert_eq!(shares.pushed_workers(), 3);
}
