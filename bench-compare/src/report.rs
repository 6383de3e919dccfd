//! The summary table (Markdown, pasted into README.md) with ratios against each competitor.

use crate::ingest::IngestRow;
use crate::query::{Check, Timings};
use crate::timing::Lat;

/// One consumer table size's figures.
pub struct QueryFigures {
    pub label: &'static str,
    pub table_bytes: u64,
    pub mem_ours: isize,
    pub mem_dyn: isize,
    pub filler_ours: u64,
    pub filler_dyn: u64,
    /// ckf-core, dynamo CKF, RadixTree, CRTC
    pub checks: [Check; 4],
    /// ckf-core, ckf-core +chain, dynamo CKF, CRTC, RadixTree, HashMap
    pub lats: Vec<Timings>,
    /// ckf-core, ckf-core +chain, dynamo CKF (with the concurrent writer)
    pub wlats: Vec<Timings>,
    pub writer_rates: (f64, f64),
}

/// Everything measured in one run.
#[derive(Default)]
pub struct Report {
    /// (block, lane) entries of the trace fill.
    pub entries: usize,
    pub mem_exact: isize,
    pub mem_radix: isize,
    pub mem_crtc: isize,
    pub query: Vec<QueryFigures>,
    pub ingest: Vec<IngestRow>,
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

/// One table row: values for ckf-core, ckf-core +chain, dynamo CKF, CRTC, RadixTree, HashMap.
fn row(name: &str, v: [Option<f64>; 6], digits: usize) {
    let [ours, chain, dynamo, crtc, radix, exact] = v;
    println!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        cell(ours, digits),
        cell(chain, digits),
        cell(dynamo, digits),
        cell(crtc, digits),
        cell(radix, digits),
        cell(exact, digits),
        ratio(ours, dynamo),
        ratio(chain, dynamo),
        ratio(ours, crtc),
        ratio(ours, radix),
        ratio(ours, exact),
    );
}

impl Report {
    /// Prints the Markdown table.
    pub fn print(&self) {
        println!(
            "| figure | ckf-core | ckf-core +chain | dynamo CKF | dynamo CRTC | dynamo RadixTree | \
             HashMap exact | ours / dyn CKF | ours+chain / dyn CKF | ours / CRTC | ours / RadixTree | \
             ours / HashMap |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        type Stat = (&'static str, fn(&Lat) -> f64);
        let stats: [Stat; 3] = [("p50", |x| x.p50), ("p99", |x| x.p99), ("mean", |x| x.mean)];
        for q in &self.query {
            for (kind, pick) in [
                (
                    "best of passes",
                    (|t: &Timings| t.filtered) as fn(&Timings) -> Lat,
                ),
                ("all samples", |t: &Timings| t.raw),
            ] {
                for (stat, f) in stats {
                    let v: Vec<Option<f64>> = q.lats.iter().map(|t| Some(f(&pick(t)))).collect();
                    row(
                        &format!("query {}, 16 lanes, {stat} ns ({kind})", q.label),
                        [v[0], v[1], v[2], v[3], v[4], v[5]],
                        0,
                    );
                }
                for (stat, f) in stats {
                    let v: Vec<Option<f64>> = q.wlats.iter().map(|t| Some(f(&pick(t)))).collect();
                    row(
                        &format!(
                            "query {} + writer ({:.0}k / {:.0}k deltas/s), {stat} ns ({kind})",
                            q.label,
                            q.writer_rates.0 / 1e3,
                            q.writer_rates.1 / 1e3
                        ),
                        [v[0], v[1], v[2], None, None, None],
                        0,
                    );
                }
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
                [
                    Some(q.mem_ours as f64 / e),
                    None,
                    Some(q.mem_dyn as f64 / e),
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
                    None,
                    Some(slots(q.filler_dyn)),
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
                    None,
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
                "check {} (lane answers under / over the exact depth over all queries x 16 lanes): \
                 ckf-core {}/{}, dynamo CKF {}/{}, RadixTree {}/{}, CRTC {}/{}",
                q.label,
                q.checks[0].under,
                q.checks[0].over,
                q.checks[1].under,
                q.checks[1].over,
                q.checks[2].under,
                q.checks[2].over,
                q.checks[3].under,
                q.checks[3].over
            );
        }
        for r in &self.ingest {
            println!(
                "ingest {} buckets: {} distinct blocks, load ours {:.3} dynamo {:.3}, omissions \
                 ours {} dynamo {}; dynamo at its default publish_every_n_events = 1: {} M/s",
                r.buckets,
                r.unique_blocks,
                r.load_ours,
                r.load_dyn,
                r.omitted_ours,
                r.omitted_dyn,
                cell(Some(r.dyn_default / 1e6), 2)
            );
        }
    }
}
