//! The summary table (Markdown, pasted into README.md) with ratios against each competitor.
//!
//! Headline column: **ckf-core +chain** (the caller computes the sequence-hash chain from the
//! local token hashes, as dynamo's CKF query and producer do inside), so every ratio against
//! dynamo compares the same work. Latency headlines are over all samples (every timed query of
//! every pass); best-of-passes p50 stays as one secondary row per table, labelled.

use crate::ingest::IngestRow;
use crate::query::{Check, Timings};
use crate::timing::Lat;

/// One consumer table size's figures.
pub struct QueryFigures {
    /// Total table bytes, as "2 MiB" (16 lanes) or "8 MiB" (64 lanes, same buckets).
    pub label: String,
    pub table_bytes: u64,
    pub mem_ours: isize,
    /// `None` (here and below): dynamo's CKF was not run (more than 16 lanes).
    pub mem_dyn: Option<isize>,
    pub filler_ours: u64,
    pub filler_dyn: Option<u64>,
    /// ckf-core, dynamo CKF, RadixTree, CRTC
    pub checks: [Option<Check>; 4],
    /// ckf-core, ckf-core +chain, dynamo CKF, CRTC, RadixTree, HashMap
    pub lats: Vec<Option<Timings>>,
    /// ckf-core, ckf-core +chain, dynamo CKF (with the concurrent writer)
    pub wlats: Vec<Option<Timings>>,
    pub writer_rates: (f64, f64),
}

/// Everything measured in one run.
#[derive(Default)]
pub struct Report {
    /// Lanes (DCs) in every structure.
    pub lanes: usize,
    /// The per-query timer's measured resolution, ns (its smallest step, at least one tick).
    pub resolution_ns: f64,
    /// (block, lane) entries of the trace fill.
    pub entries: usize,
    pub mem_exact: isize,
    pub mem_radix: isize,
    pub mem_crtc: isize,
    pub query: Vec<QueryFigures>,
    pub ingest: Vec<IngestRow>,
}

/// Row title of a latency figure: table size, optional writer note, statistic, sample set.
fn label(size: &str, writer: &str, lanes: usize, stat: &str, kind: &str) -> String {
    let writer = if writer.is_empty() {
        String::new()
    } else {
        format!(" {writer}")
    };
    format!("query {size}{writer}, {lanes} lanes, {stat} ns ({kind})")
}

/// "under/over" of a correctness check, or "not run".
pub fn check(c: Option<Check>) -> String {
    c.map_or("not run".into(), |c| format!("{}/{}", c.under, c.over))
}

fn cell(v: Option<f64>, digits: usize) -> String {
    // NaN marks a figure the run skipped.
    let v = v.filter(|v| !v.is_nan());
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 && !a.is_nan() && !b.is_nan() => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

/// One table row. Values in the order ckf-core, ckf-core +chain, dynamo CKF, CRTC, RadixTree,
/// HashMap; printed with +chain first (the headline), ratios of +chain against each dynamo
/// structure, and of plain ckf-core against the exact HashMap (both take chained hashes).
fn row(name: &str, v: [Option<f64>; 6], digits: usize) {
    let [ours, chain, dynamo, crtc, radix, exact] = v;
    println!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        cell(chain, digits),
        cell(ours, digits),
        cell(dynamo, digits),
        cell(crtc, digits),
        cell(radix, digits),
        cell(exact, digits),
        ratio(chain, dynamo),
        ratio(chain, crtc),
        ratio(chain, radix),
        ratio(ours, exact),
    );
}

impl Report {
    /// Prints the Markdown table.
    pub fn print(&self) {
        println!(
            "| figure | ckf-core +chain | ckf-core | dynamo CKF | dynamo CRTC | dynamo RadixTree | \
             HashMap exact | +chain / dyn CKF | +chain / CRTC | +chain / RadixTree | \
             ckf-core / HashMap |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        type Stat = (&'static str, fn(&Lat) -> f64);
        let stats: [Stat; 4] = [
            ("p50", |x| x.p50),
            ("p99", |x| x.p99),
            ("p99.9", |x| x.p999),
            ("mean", |x| x.mean),
        ];
        let six = |v: Vec<Option<f64>>| -> [Option<f64>; 6] {
            std::array::from_fn(|k| v.get(k).copied().flatten())
        };
        for q in &self.query {
            let writer = format!(
                "+ writer ({:.0}k / {:.0}k deltas/s)",
                q.writer_rates.0 / 1e3,
                q.writer_rates.1 / 1e3
            );
            for (what, lats) in [("", &q.lats), (writer.as_str(), &q.wlats)] {
                for (stat, f) in stats {
                    let v = lats.iter().map(|t| t.map(|t| f(&t.raw))).collect();
                    let name = label(&q.label, what, self.lanes, stat, "all samples");
                    row(&name, six(v), 0);
                }
                let v = lats.iter().map(|t| t.map(|t| t.filtered.p50)).collect();
                row(
                    &label(
                        &q.label,
                        what,
                        self.lanes,
                        "p50",
                        "best of passes, secondary",
                    ),
                    six(v),
                    0,
                );
            }
        }
        for r in &self.ingest {
            row(
                &format!("ingest, {} buckets, 85% load, M block ops/s", r.buckets),
                [
                    Some(r.ours / 1e6),
                    Some(r.ours_chain / 1e6),
                    Some(r.dyn_never / 1e6),
                    None,
                    Some(r.radix / 1e6),
                    Some(r.exact / 1e6),
                ],
                2,
            );
            row(
                &format!(
                    "ingest + publication every 64 events, {} buckets, M block ops/s",
                    r.buckets
                ),
                [
                    Some(r.ours_pub / 1e6),
                    None,
                    Some(r.dyn_pub / 1e6),
                    None,
                    None,
                    None,
                ],
                2,
            );
        }
        let e = self.entries as f64;
        for q in &self.query {
            row(
                &format!(
                    "consumer bytes per trace (block, lane) entry, {} table",
                    q.label
                ),
                // Chaining is done per query and retains nothing: +chain uses the same structure.
                [
                    Some(q.mem_ours as f64 / e),
                    Some(q.mem_ours as f64 / e),
                    q.mem_dyn.map(|m| m as f64 / e),
                    Some(self.mem_crtc as f64 / e),
                    Some(self.mem_radix as f64 / e),
                    Some(self.mem_exact as f64 / e),
                ],
                2,
            );
            let slots = |filler: u64| q.table_bytes as f64 * 8.0 / (e + filler as f64);
            row(
                &format!("consumer bits per occupied (block, lane) slot, {}", q.label),
                [
                    Some(slots(q.filler_ours)),
                    Some(slots(q.filler_ours)),
                    q.filler_dyn.map(slots),
                    None,
                    None,
                    None,
                ],
                2,
            );
        }
        for r in &self.ingest {
            row(
                &format!(
                    "producer heap bytes per tracked block, {} buckets, 85% load",
                    r.buckets
                ),
                [
                    Some(r.mem_ours),
                    Some(r.mem_ours),
                    Some(r.mem_dyn),
                    None,
                    Some(r.mem_radix),
                    Some(r.mem_exact),
                ],
                1,
            );
        }
        println!();
        for q in &self.query {
            println!(
                "check {} (lane answers under / over the exact depth over all queries x {} \
                 lanes): ckf-core {}, dynamo CKF {}, RadixTree {}, CRTC {}",
                q.label,
                self.lanes,
                check(q.checks[0]),
                check(q.checks[1]),
                check(q.checks[2]),
                check(q.checks[3])
            );
        }
        for r in &self.ingest {
            println!(
                "ingest {} buckets: {} distinct blocks, load ours {:.3} dynamo {:.3}, omissions \
                 ours {} dynamo {}; dynamo at its default publish_every_n_events = 1: {}",
                r.buckets,
                r.unique_blocks,
                r.load_ours,
                r.load_dyn,
                r.omitted_ours,
                r.omitted_dyn,
                if r.dyn_default.is_nan() {
                    "not run".to_owned()
                } else {
                    format!("{:.2} M/s", r.dyn_default / 1e6)
                }
            );
        }
    }
}
