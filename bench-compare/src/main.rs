//! Comparison benchmark: ckf-core vs dynamo-kv-router 1.6.1 (its CKF, its exact radix trees)
//! vs exact `HashMap` baselines, in one run, on the same Mooncake tables and queries.
//!
//! Run (from `bench-compare/`):
//! `nice -n 10 cargo run --release -- [--quick] [--no-big] [--big-buckets N] [--no-ingest]
//! [--lanes N] [--flushed N] [--trace PATH] [--writer-rate DELTAS_PER_S]`
//!
//! Not part of the product workspace (own `[workspace]` and `Cargo.lock`; the root manifest
//! excludes this directory) and not built by CI. See README.md for the method and results.

mod alloc;
mod fill;
mod flushed;
mod ingest;
mod query;
mod report;
mod tables;
mod timing;
mod trace;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ckf_core::addressing::fmix64;
use ckf_core::bucket::MAX_LANES;

use crate::alloc::retained;
use crate::query::{Timed, Timings, dyn_sum, exact_sum, ours_chained_sum, ours_sum, spawn_writer};
use crate::report::{QueryFigures, Report, check};
use crate::trace::{DEFAULT_LANES, DYN_MAX_LANES, fill_lanes};

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

/// Slot load of both CKF consumer tables after filler.
const QUERY_LOAD: f64 = 0.85;
/// Slot load of the producer ingest runs.
const INGEST_LOAD: f64 = 0.85;

struct Args {
    trace: String,
    quick: bool,
    no_big: bool,
    big_buckets: u64,
    no_ingest: bool,
    lanes: usize,
    writer_rate: f64,
    /// Queries timed on a flushed cache (big table), 0 = none.
    flushed: usize,
}

fn args() -> Args {
    let mut a = Args {
        // `--trace PATH` wins; the Mooncake trace is not part of this repository.
        trace: std::env::var("CKF_TRACE").unwrap_or_default(),
        quick: false,
        no_big: false,
        big_buckets: 2 << 20,
        no_ingest: false,
        lanes: DEFAULT_LANES,
        writer_rate: 100_000.0,
        flushed: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--no-big" => a.no_big = true,
            "--big-buckets" => {
                let v = it.next().unwrap_or_default();
                match v.parse() {
                    // dynamo sizes its tables in powers of two.
                    Ok(n) if n >= 1 << 14 && u64::is_power_of_two(n) => a.big_buckets = n,
                    _ => {
                        eprintln!("error: --big-buckets takes a power of two >= 16384, not {v:?}");
                        std::process::exit(2);
                    }
                }
            }
            "--no-ingest" => a.no_ingest = true,
            "--lanes" => {
                let v = it.next().unwrap_or_default();
                match v.parse() {
                    Ok(n @ 1..=MAX_LANES) => a.lanes = n,
                    _ => {
                        eprintln!(
                            "error: --lanes takes a lane count in 1..={MAX_LANES}, not {v:?}"
                        );
                        std::process::exit(2);
                    }
                }
            }
            "--flushed" => {
                let v = it.next().unwrap_or_default();
                match v.parse() {
                    Ok(n) if n > 0 => a.flushed = n,
                    _ => {
                        eprintln!("error: --flushed takes a query count > 0, not {v:?}");
                        std::process::exit(2);
                    }
                }
            }
            "--trace" => a.trace = it.next().expect("--trace PATH"),
            "--writer-rate" => {
                a.writer_rate = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--writer-rate DELTAS_PER_S")
            }
            // `cargo bench` passes --bench; ignore it and anything unknown after a warning.
            "--bench" => {}
            other => eprintln!("ignoring unknown argument {other}"),
        }
    }
    a
}

fn main() {
    let started = Instant::now();
    let a = args();
    let trace = trace::load(&a.trace).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2);
    });
    let passes = if a.quick { 2 } else { 6 };
    let scale = timing::ns_per_tick();
    let m = timing::machine();
    println!(
        "machine: {} ({} CPUs), kernel {}, nice {}, load average {} at start",
        m.cpu,
        m.cpus,
        m.kernel,
        m.nice,
        timing::loadavg()
    );
    println!(
        "simd: {}; ckf-core search kernel: {}",
        if m.simd.is_empty() {
            "none detected".to_owned()
        } else {
            m.simd.join(" ")
        },
        m.ckf_kernel
    );
    let probe = timing::probe_timers(scale);
    println!(
        "timer (measured): rdtsc {:.3} ns/tick, step {:.1} ns (smallest difference {:.1} ns), \
         read {:.1} ns; Instant::now() step {:.1} ns (smallest {:.1} ns), read {:.1} ns. Queries \
         are timed one by one with rdtsc: each sample is quantised to its step and includes \
         about one read",
        scale,
        probe.tsc.step_ns,
        probe.tsc.min_ns,
        probe.tsc.read_ns,
        probe.instant.step_ns,
        probe.instant.min_ns,
        probe.instant.read_ns
    );
    let lanes = a.lanes;
    let fill = fill_lanes(&trace, lanes);
    let entries: usize = fill.held.iter().map(|h| h.len()).sum();
    let events: usize = fill.events.iter().map(|e| e.len()).sum();
    println!(
        "trace: {} requests, {} blocks; {lanes} lanes hold {} (block, lane) entries from {} store \
         events; {passes} timed passes",
        trace.chained.len(),
        trace.chained.iter().map(Vec::len).sum::<usize>(),
        entries,
        events,
    );
    let mut report = Report {
        lanes,
        entries,
        resolution_ns: probe.tsc.step_ns.max(scale),
        ..Report::default()
    };

    // Exact structures: independent of the CKF table size, built once.
    let (exact, b) = retained(|| tables::build_exact(&fill));
    report.mem_exact = b;
    let (radix, b) = retained(|| tables::build_radix(&trace, &fill));
    report.mem_radix = b;
    let (mut crtc, b) = retained(|| tables::build_crtc(&trace, &fill));
    report.mem_crtc = b;
    let mean_depth = trace
        .chained
        .iter()
        .map(|q| f64::from(exact_sum(&exact, q, lanes)))
        .sum::<f64>()
        / trace.chained.len() as f64;
    let best_depth = trace
        .chained
        .iter()
        .map(|q| {
            let d = query::exact_depths::<MAX_LANES>(&exact, q, lanes);
            f64::from(*d.iter().max().unwrap_or(&0))
        })
        .sum::<f64>()
        / trace.chained.len() as f64;
    println!(
        "exact: summed depth over {lanes} lanes {mean_depth:.1} per query, best lane depth \
         {best_depth:.1}; built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let run_dyn = lanes <= DYN_MAX_LANES;
    if !run_dyn {
        println!(
            "dynamo CKF: not run at {lanes} lanes (its consumer holds at most {DYN_MAX_LANES} lanes: \
             u16 ready masks); CRTC, RadixTree and HashMap hold the same {lanes} DCs as ckf-core"
        );
    }

    // A fixed random query order, the same for every implementation.
    let mut order: Vec<usize> = (0..trace.chained.len()).collect();
    order.sort_by_key(|&i| fmix64(i as u64 ^ 0x0DE5));

    // Table sizes are bucket counts per lane (2 MiB and, by default, 256 MiB in total at 16
    // lanes; `--big-buckets` sets the second); more lanes keep the buckets, so the total (the
    // label) grows with the lanes.
    if a.flushed > 0 && a.no_big {
        println!("note: --flushed times the big table, which --no-big skips: no flushed figures");
    }
    let sizes: &[u64] = if a.no_big {
        &[16 << 10]
    } else {
        &[16 << 10, a.big_buckets]
    };
    for &buckets in sizes {
        let t0 = Instant::now();
        let (ours, mem_ours) = retained(|| tables::build_ours(&trace, &fill, buckets, QUERY_LOAD));
        let (mut dynamo, mem_dyn) = if run_dyn {
            let (d, m) = retained(|| tables::build_dynamo(&trace, &fill, buckets, QUERY_LOAD));
            (Some(d), Some(m))
        } else {
            (None, None)
        };
        let table_bytes = buckets * lanes as u64 * 8;
        let label = match table_bytes {
            b if b >= 1 << 30 => format!("{} GiB", b >> 30),
            b if b >= 1 << 20 => format!("{} MiB", b >> 20),
            b => format!("{} KiB", b >> 10),
        };
        println!(
            "{label}: {buckets} buckets x {lanes} lanes = {label} per CKF (ckf-core table {} \
             bytes, {} per lane, {} retained bytes per lane); ckf-core huge pages {}; omissions \
             ours {} dynamo {}; filler ours {} dynamo {}; built in {:.1} s",
            ours.ix.table().bytes(),
            ours.ix.table().bytes() / lanes,
            mem_ours / lanes as isize,
            ours.ix.huge_pages(),
            ours.omitted,
            dynamo
                .as_ref()
                .map_or("-".into(), |d| d.omitted.to_string()),
            ours.filler,
            dynamo.as_ref().map_or("-".into(), |d| d.filler.to_string()),
            t0.elapsed().as_secs_f64()
        );
        let checks = query::verify(&trace, &exact, &ours, dynamo.as_ref(), &radix, &crtc, lanes);
        println!(
            "  check vs exact (lane answers under / over): ckf-core {}, dynamo CKF {}, \
             RadixTree {}, CRTC {}",
            check(checks[0]),
            check(checks[1]),
            check(checks[2]),
            check(checks[3])
        );

        let ix = ours.ix.clone();
        let lats = {
            let mut impls = vec![
                Timed {
                    name: "ckf-core",
                    run: Box::new(|i| ours_sum(&ix, &trace.chained[i])),
                },
                Timed {
                    name: "ckf-core +chain",
                    run: Box::new(|i| ours_chained_sum(&ix, &trace.local[i])),
                },
                Timed {
                    name: "dynamo CRTC",
                    run: Box::new(|i| {
                        use dynamo_kv_router::indexer::SyncIndexer;
                        crtc.tree
                            .find_matches(&trace.local[i], false)
                            .scores
                            .values()
                            .sum()
                    }),
                },
                Timed {
                    name: "dynamo RadixTree",
                    run: Box::new(|i| {
                        radix
                            .find_matches(trace.local[i].clone(), false)
                            .scores
                            .values()
                            .sum()
                    }),
                },
                Timed {
                    name: "HashMap exact",
                    run: Box::new(|i| exact_sum(&exact, &trace.chained[i], lanes)),
                },
            ];
            if let Some(d) = &dynamo {
                let run = Box::new(|i: usize| dyn_sum(d, &trace.local[i]));
                impls.insert(
                    2,
                    Timed {
                        name: "dynamo CKF",
                        run,
                    },
                );
            }
            let lats = time_report(
                &mut impls,
                &order,
                passes,
                scale,
                &label,
                "",
                report.resolution_ns,
            );
            if a.flushed > 0 && Some(&buckets) == sizes.last() && !a.no_big {
                report_flushed(&mut impls, &order, &trace, a.flushed, scale, &label);
            }
            dyn_gap(lats, run_dyn)
        };

        // Concurrent writer on lane 0 of both CKFs (of ckf-core's alone without dynamo).
        let stop = Arc::new(AtomicBool::new(false));
        let dyn0 = dynamo.as_mut().map(|d| {
            (
                d.ingestors.remove(0),
                d.identity0,
                d.lease0,
                d.words0.clone(),
            )
        });
        let writer = spawn_writer(
            ours.ix.clone(),
            ours.tag0,
            dyn0,
            a.writer_rate,
            stop.clone(),
        );
        let wlats = {
            let mut impls = vec![
                Timed {
                    name: "ckf-core",
                    run: Box::new(|i| ours_sum(&ix, &trace.chained[i])),
                },
                Timed {
                    name: "ckf-core +chain",
                    run: Box::new(|i| ours_chained_sum(&ix, &trace.local[i])),
                },
            ];
            if let Some(d) = &dynamo {
                let run = Box::new(|i: usize| dyn_sum(d, &trace.local[i]));
                impls.push(Timed {
                    name: "dynamo CKF",
                    run,
                });
            }
            let lats = time_report(
                &mut impls,
                &order,
                passes,
                scale,
                &label,
                " +writer",
                report.resolution_ns,
            );
            dyn_gap(lats, run_dyn)
        };
        stop.store(true, Ordering::Relaxed);
        let (w, dyn0) = writer.join().expect("writer");
        if let (Some(d), Some((ing0, ..))) = (dynamo.as_mut(), dyn0) {
            d.ingestors.insert(0, ing0);
        }
        let writer_rates = (
            w.ours_deltas as f64 / w.seconds,
            w.dyn_deltas as f64 / w.seconds,
        );
        println!(
            "  writer: {:.0} deltas/s into ckf-core, {:.0} deltas/s into dynamo (8 images each)",
            writer_rates.0, writer_rates.1
        );
        report.query.push(QueryFigures {
            label,
            table_bytes,
            mem_ours,
            mem_dyn,
            filler_ours: ours.filler,
            filler_dyn: dynamo.as_ref().map(|d| d.filler),
            checks,
            lats,
            wlats,
            writer_rates,
        });
    }
    crtc.stop();
    drop(radix);

    // The producer ingest workload has no lanes (one DC's producer); --no-ingest skips it.
    let ingest_sizes: &[u64] = if a.no_ingest {
        &[]
    } else {
        &[1 << 16, 1 << 20]
    };
    for &buckets in ingest_sizes {
        let t0 = Instant::now();
        let row = ingest::run(buckets, INGEST_LOAD);
        println!(
            "ingest {buckets} buckets: ckf-core {:.2} M/s (+chain {:.2}, +pub {:.2}), dynamo {:.2} M/s \
             (pub/64 {:.2}, pub/1 {}), RadixTree {:.2} M/s, HashMap {:.2} M/s; load ours {:.3} \
             dynamo {:.3}; omitted ours {} dynamo {}; {:.1} s",
            row.ours / 1e6,
            row.ours_chain / 1e6,
            row.ours_pub / 1e6,
            row.dyn_never / 1e6,
            row.dyn_pub / 1e6,
            // NaN: the default cadence is skipped at the large size (time).
            if row.dyn_default.is_nan() {
                "not run".to_owned()
            } else {
                format!("{:.2}", row.dyn_default / 1e6)
            },
            row.radix / 1e6,
            row.exact / 1e6,
            row.load_ours,
            row.load_dyn,
            row.omitted_ours,
            row.omitted_dyn,
            t0.elapsed().as_secs_f64()
        );
        report.ingest.push(row);
    }
    println!();
    report.print();
    println!(
        "total {:.0} s; load average {} at end",
        started.elapsed().as_secs_f64(),
        timing::loadavg()
    );
}

/// Times `n` queries on the flushed cache and prints their figures with ckf-core +chain's
/// ratios against dynamo's CKF and CRTC (`flushed.rs` has the method).
fn report_flushed(
    impls: &mut [Timed<'_>],
    order: &[usize],
    trace: &trace::Trace,
    n: usize,
    scale: f64,
    label: &str,
) {
    let llc = flushed::llc_bytes();
    let evictor = flushed::Evictor::new(llc);
    let (warm, cold) = flushed::chase_check(&evictor);
    println!(
        "  flushed: {} MiB eviction buffer (last-level cache {} MiB) read before each timed \
         query (then one other query, untimed, and the query's input read); a 4 MiB chase takes \
         {:.0} ns per line warm, {:.0} ns after an eviction ({:.1}x){}",
        evictor.bytes() >> 20,
        llc >> 20,
        warm * scale,
        cold * scale,
        cold / warm,
        if cold < flushed::MIN_COLD_RATIO * warm {
            " (too little: the eviction may not have worked)"
        } else {
            ""
        }
    );
    let t0 = Instant::now();
    let Some(f) = flushed::time_flushed(
        impls,
        order,
        n,
        |q| trace.chained[q].len(),
        |q| {
            let chained = trace.chained[q].iter().fold(0, |a, &h| a ^ h);
            trace.local[q].iter().fold(chained, |a, h| a ^ h.0)
        },
        &evictor,
        scale,
    ) else {
        println!(
            "  flushed: skipped: {} timed queries (at most half of the trace's {}) for {} \
             structures; it takes at least one per structure",
            n.min(order.len() / 2),
            order.len(),
            impls.len()
        );
        return;
    };
    let name = |k: usize| impls[k].name;
    let short = |l: Option<timing::Lat>| {
        l.map_or("none".to_owned(), |l| {
            format!("({}): p50 {:>6.0} p99 {:>6.0} ns", l.samples, l.p50, l.p99)
        })
    };
    for (k, x) in f.iter().enumerate() {
        println!(
            "  {label} flushed {:<18} all {} queries: p50 {:>6.0} p99 {:>6.0} mean {:>6.0} ns | \
             at most {} blocks {}",
            name(k),
            x.all.samples,
            x.all.p50,
            x.all.p99,
            x.all.mean,
            flushed::SHORT_BLOCKS,
            short(x.short),
        );
    }
    let find = |s: &str| impls.iter().position(|t| t.name == s);
    let ours = find("ckf-core +chain").expect("ckf-core +chain is timed");
    for other in ["dynamo CKF", "dynamo CRTC", "dynamo RadixTree"] {
        if let Some(o) = find(other) {
            let short = match (f[ours].short, f[o].short) {
                (Some(a), Some(b)) => format!("p50 {:.2} p99 {:.2}", a.p50 / b.p50, a.p99 / b.p99),
                _ => "none".to_owned(),
            };
            println!(
                "  {label} flushed ckf-core +chain / {other}: all p50 {:.2} p99 {:.2}; short \
                 {short}",
                f[ours].all.p50 / f[o].all.p50,
                f[ours].all.p99 / f[o].all.p99,
            );
        }
    }
    println!("  flushed run: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Timings in report order, with `None` where dynamo's CKF (third) was not run.
fn dyn_gap(lats: Vec<Timings>, run_dyn: bool) -> Vec<Option<Timings>> {
    let mut lats: Vec<_> = lats.into_iter().map(Some).collect();
    if !run_dyn {
        lats.insert(2.min(lats.len()), None);
    }
    lats
}

fn time_report(
    impls: &mut [Timed<'_>],
    order: &[usize],
    passes: usize,
    scale: f64,
    label: &str,
    suffix: &str,
    resolution_ns: f64,
) -> Vec<query::Timings> {
    let lats = query::time_interleaved(impls, order, passes, scale);
    for (t, l) in impls.iter().zip(&lats) {
        println!(
            "  {label}{suffix:<8} {:<18} all {} samples: p50 {:>6.0} p99 {:>6.0} p99.9 {:>6.0} \
             mean {:>6.0} ns | best-of-passes p50 {:>6.0} ns",
            t.name, l.raw.samples, l.raw.p50, l.raw.p99, l.raw.p999, l.raw.mean, l.filtered.p50,
        );
        // A per-query sample is only as exact as the clock's step; below ~10 steps the
        // percentiles are visibly quantised, so say so instead of printing them as exact.
        if l.raw.p50 < 10.0 * resolution_ns {
            println!(
                "  warning: {} p50 {:.0} ns is under 10 timer steps ({resolution_ns:.1} ns): \
                 its percentiles are quantised by up to {:.0}%",
                t.name,
                l.raw.p50,
                100.0 * resolution_ns / l.raw.p50
            );
        }
    }
    lats
}
