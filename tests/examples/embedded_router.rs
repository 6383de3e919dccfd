//! Embedded mode, end to end: a "router" process that is an indexer replica itself.
//!
//! Starts, in this one process and on loopback ports: an indexer (`indexer_svc::serve`) for two
//! DC lanes, and two real producers (`producer_svc::serve`) publishing to it over
//! `ckf.v1.Relay`, exactly as remote producers would. It stores a synthetic workload of prefix
//! chains through the producers' `Ingest` API, waits until the replica sees every chain, then
//! times the router's question "which DC holds the longest prefix?" two ways on the same
//! queries:
//! - in-process, through `RunningIndexer::query_handle()` (no RPC at all);
//! - over gRPC, `Query/FindMatches` on the same replica, one request in flight.
//!
//! Then it asks the routing question itself, "which DC should serve this request?" (cached
//! prefix, load, round trip: `Query/Route`), the same two ways: in-process through
//! `EmbeddedQuery::route` (the RPC's own code, bookings included) and over gRPC.
//!
//! Both must give the same answer for every query (the run fails otherwise). Latencies are
//! per-call wall times recorded in HDR histograms, in nanoseconds.
//!
//! ```sh
//! cargo run --release -p ckf-e2e --example embedded_router
//! cargo run --release -p ckf-e2e --example embedded_router -- --chains 4000 --queries 200000
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ckf_proto::v1::{self, ingest_client::IngestClient, query_client::QueryClient};
use hdrhistogram::Histogram;
use indexer_svc::route::wire_answer;
use indexer_svc::router::RouteQuery;
use indexer_svc::{EmbeddedQuery, IndexerConfig};
use producer_svc::config::ProducerConfig;

const DOMAIN: &str = "router";
/// Blocks per stored chain (one conversation's prefix).
const CHAIN_BLOCKS: u64 = 32;

/// `--chains N` (stored chains per DC) and `--queries N` (timed in-process queries).
struct Args {
    chains: u64,
    queries: u64,
}

fn args() -> anyhow::Result<Args> {
    let mut out = Args {
        chains: 2_000,
        queries: 100_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let n: u64 = value
            .parse()
            .with_context(|| format!("{flag} {value}: not a whole number"))?;
        match flag.as_str() {
            "--chains" if n > 0 => out.chains = n,
            "--queries" if n > 0 => out.queries = n,
            _ => bail!("unknown flag or zero value: {flag} {value} (flags: --chains, --queries)"),
        }
    }
    Ok(out)
}

/// Block `i` of chain `c`: distinct 64-bit hashes (a bijective mix of a counter).
fn block(chain: u64, i: u64) -> u64 {
    let mut x = chain * CHAIN_BLOCKS + i + 1;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

fn chain(c: u64, len: u64) -> Vec<u64> {
    (0..len).map(|i| block(c, i)).collect()
}

/// dc-a holds every even chain whole, dc-b every chain's first half: queries then have a
/// clear best DC, a partial one, or none.
fn held(dc: usize, c: u64) -> u64 {
    match dc {
        0 if c.is_multiple_of(2) => CHAIN_BLOCKS,
        1 => CHAIN_BLOCKS / 2,
        _ => 0,
    }
}

async fn store(ingest: &str, dc: usize, chains: u64) -> anyhow::Result<()> {
    let mut client = IngestClient::connect(ingest.to_owned()).await?;
    let mut sequence = 0;
    for first in (0..chains).step_by(64) {
        let events = (first..(first + 64).min(chains))
            .filter(|&c| held(dc, c) > 0)
            .map(|c| v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id: c % 4,
                    dp_rank: 0,
                }),
                kind: Some(v1::kv_event::Kind::Stored(v1::Stored {
                    block_hashes: chain(c, held(dc, c)),
                    parent_hash: None,
                })),
            })
            .collect();
        sequence += 1;
        let result = client
            .publish_batch(v1::KvEventBatch {
                source_id: format!("embedded-example/dc-{dc}"),
                sequence,
                events,
            })
            .await?
            .into_inner();
        if let Some(refused) = result.refused {
            bail!("batch {sequence} refused: {}", refused.message);
        }
    }
    Ok(())
}

fn depths(query: &EmbeddedQuery, hashes: &[u64]) -> Vec<(u8, u32)> {
    query.find_prefix_matches(hashes).iter().collect()
}

fn print_row(name: &str, h: &Histogram<u64>) {
    println!(
        "  {name:<31} p50 {:>7} ns  p99 {:>7} ns  p99.9 {:>8} ns  ({} calls)",
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.len()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let lanes = ["dc-a", "dc-b"];
    let mut config = IndexerConfig::for_lanes(DOMAIN, &lanes);
    config.table.expected_blocks = args.chains * CHAIN_BLOCKS;
    // dc-b is 40 ms from the router (dc-a the default 1 ms).
    config.route.rtt_ms.insert("dc-b".into(), 40.0);
    let indexer = indexer_svc::serve(config, std::future::pending()).await?;
    let relay = format!("http://{}", indexer.grpc_addr);
    let query = indexer.query_handle();

    let mut producers = Vec::new();
    for (dc, name) in lanes.iter().enumerate() {
        let mut config = ProducerConfig::for_pool(DOMAIN, name, vec![relay.clone()]);
        config.table.expected_blocks = args.chains * CHAIN_BLOCKS;
        let producer = producer_svc::serve(config, std::future::pending())
            .await
            .with_context(|| format!("starting the {name} producer"))?;
        store(&format!("http://{}", producer.ingest_addr), dc, args.chains).await?;
        producers.push(producer);
    }

    // The replica has everything once the last chain of each DC answers its full depth.
    let last = args.chains - 1 - (args.chains - 1) % 2;
    let deadline = Instant::now() + Duration::from_secs(30);
    let expected = vec![(0u8, CHAIN_BLOCKS as u32), (1u8, (CHAIN_BLOCKS / 2) as u32)];
    while depths(&query, &chain(last, CHAIN_BLOCKS)) != expected {
        if Instant::now() > deadline {
            bail!(
                "the replica did not see the producers' blocks within 30 s: {:?}",
                depths(&query, &chain(last, CHAIN_BLOCKS))
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Queries: chains in a fixed pseudo-random order, each probed whole.
    let probes: Vec<Vec<u64>> = (0..1024u64)
        .map(|i| chain((i * 2_654_435_761) % args.chains, CHAIN_BLOCKS))
        .collect();
    let mut in_process = Histogram::<u64>::new(3)?;
    let mut best_a = 0u64;
    for i in 0..args.queries {
        let probe = &probes[(i % probes.len() as u64) as usize];
        let started = Instant::now();
        let found = query.find_prefix_matches(probe);
        let ns = started.elapsed().as_nanos() as u64;
        in_process.record(ns.max(1))?;
        best_a += u64::from(matches!(found.best(), Some((0, _))));
    }

    let mut client = QueryClient::connect(relay.clone()).await?;
    let mut rpc = Histogram::<u64>::new(3)?;
    for (i, probe) in probes.iter().cycle().take(5_000).enumerate() {
        let started = Instant::now();
        let response = client
            .find_matches(v1::FindMatchesRequest {
                block_hashes: probe.clone(),
            })
            .await?
            .into_inner();
        rpc.record((started.elapsed().as_nanos() as u64).max(1))?;
        let over_rpc: Vec<(u8, u32)> = response
            .matches
            .iter()
            .map(|m| (m.lane as u8, m.depth))
            .collect();
        if over_rpc != depths(&query, probe) {
            bail!("query {i}: in-process and gRPC answers differ: {over_rpc:?}");
        }
    }

    // Route: the producers here report no load (no engines), so every answer depends on the
    // prefix and the round trips only, and an in-process answer must equal the RPC's (the
    // bookings each adds do not move an unknown load's estimate).
    let mut routed = Histogram::<u64>::new(3)?;
    let mut routed_a = 0u64;
    for probe in probes.iter().cycle().take(20_000) {
        let request = RouteQuery::by_hashes(probe.clone());
        let started = Instant::now();
        let answer = query.route(&request)?;
        routed.record((started.elapsed().as_nanos() as u64).max(1))?;
        routed_a += u64::from(matches!(answer.choice, Some((0, _))));
    }
    let mut route_rpc = Histogram::<u64>::new(3)?;
    for (i, probe) in probes.iter().cycle().take(2_000).enumerate() {
        let started = Instant::now();
        let response = client
            .route(v1::RouteRequest {
                query: Some(v1::route_request::Query::Hashes(v1::FindMatchesRequest {
                    block_hashes: probe.clone(),
                })),
                ..Default::default()
            })
            .await?
            .into_inner();
        route_rpc.record((started.elapsed().as_nanos() as u64).max(1))?;
        let local = wire_answer(
            query.indexer(),
            &query.route(&RouteQuery::by_hashes(probe.clone()))?,
        );
        let choice = |r: &v1::RouteResponse| {
            let ranked: Vec<_> = r
                .ranked
                .iter()
                .map(|d| (d.lane, d.depth, d.ttft_ms))
                .collect();
            (r.chosen_lane, r.reason, ranked)
        };
        if choice(&response) != choice(&local) {
            bail!("route {i}: in-process and gRPC answers differ: {response:?} / {local:?}");
        }
    }

    println!(
        "embedded replica: 2 lanes, {} chains of {CHAIN_BLOCKS} blocks per DC, queries of {CHAIN_BLOCKS} blocks",
        args.chains
    );
    println!(
        "  best DC is dc-a for {:.1}% of in-process queries",
        100.0 * best_a as f64 / args.queries as f64
    );
    print_row("in-process query_handle", &in_process);
    print_row("gRPC FindMatches (1 in flight)", &rpc);
    println!(
        "  gRPC / in-process at p50: {:.0}x",
        rpc.value_at_quantile(0.5) as f64 / in_process.value_at_quantile(0.5).max(1) as f64
    );
    println!(
        "  Route chose dc-a for {:.1}% of in-process requests",
        100.0 * routed_a as f64 / routed.len() as f64
    );
    print_row("in-process EmbeddedQuery::route", &routed);
    print_row("gRPC Route (1 in flight)", &route_rpc);

    for producer in producers {
        producer.shutdown();
        producer.wait().await?;
    }
    indexer.stop().await?;
    Ok(())
}
