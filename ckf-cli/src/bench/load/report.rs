//! The summary of a run: [`LoadReport`], as JSON and as text.

use std::time::Duration;

use serde_json::json;

use crate::bench::args::{LoadArgs, LoadMode};

use crate::bench::load::tally::Tally;

/// The outcome of a run (what the summary prints).
#[derive(Debug)]
pub struct LoadReport {
    /// Every sender's tally merged.
    pub tally: Tally,
    /// Wall time from the first send to the last answer.
    pub elapsed: Duration,
    /// The indexer's pid and CPU time over the run, when its process is on this host.
    pub indexer_cpu: Option<(u32, Duration)>,
}

impl LoadReport {
    /// Indexer CPU per answered query, microseconds.
    pub fn cpu_per_query_us(&self) -> Option<f64> {
        let (_, cpu) = self.indexer_cpu?;
        (self.tally.queries > 0).then(|| cpu.as_secs_f64() * 1e6 / self.tally.queries as f64)
    }
}

/// "closed loop", or "open loop at RATE UNIT/s" (`unit`: what the mode counts).
pub(crate) fn loop_kind(args: &LoadArgs, unit: &str) -> String {
    match args.rate {
        Some(rate) => format!("open loop at {rate} {unit}/s"),
        None => "closed loop".into(),
    }
}

/// The JSON summary.
pub fn json_report(args: &LoadArgs, per_message: usize, report: &LoadReport) -> serde_json::Value {
    let t = &report.tally;
    let seconds = report.elapsed.as_secs_f64();
    json!({
        "mode": args.mode.name(),
        "loop": if args.rate.is_some() { "open" } else { "closed" },
        "rate": args.rate,
        "queries_per_message": per_message,
        "concurrency": args.concurrency,
        "connections": args.connections,
        "elapsed_s": seconds,
        "messages": t.messages,
        "queries_sent": t.sent,
        "queries": t.queries,
        "qps": t.queries as f64 / seconds,
        "messages_per_s": t.messages as f64 / seconds,
        "latency_us": {
            "p50": t.latency_us(0.50),
            "p90": t.latency_us(0.90),
            "p99": t.latency_us(0.99),
            "p999": t.latency_us(0.999),
            "max": t.latency_us(1.0),
        },
        // Open loop: due time to send, per message (null in closed loop).
        "send_delay_us": (!t.send_delay.is_empty()).then(|| json!({
            "p50": t.send_delay_us(0.50),
            "p99": t.send_delay_us(0.99),
            "max": t.send_delay_us(1.0),
        })),
        "errors": t.errors,
        "error_count": t.errors.values().sum::<u64>(),
        "indexer_pid": report.indexer_cpu.map(|(pid, _)| pid),
        "indexer_cpu_s": report.indexer_cpu.map(|(_, cpu)| cpu.as_secs_f64()),
        "indexer_cpu_us_per_query": report.cpu_per_query_us(),
    })
}

/// The text summary.
pub fn text_report(args: &LoadArgs, per_message: usize, report: &LoadReport) -> String {
    let t = &report.tally;
    let seconds = report.elapsed.as_secs_f64();
    // A health check is counted where a query would be; the text names it.
    let (unit, one) = match args.mode {
        LoadMode::Health => ("health checks", "health check"),
        _ => ("queries", "query"),
    };
    let per = if per_message == 1 { one } else { unit };
    let mut out = format!(
        "ckf load: {} ({per_message} {per}/message), {}, {} in flight over {} connection(s), {seconds:.2} s\n",
        args.mode.name(),
        loop_kind(args, unit),
        args.concurrency,
        args.connections,
    );
    out += &format!(
        "answered   {} {unit} ({:.0}/s) in {} messages ({:.0}/s); {} {unit} sent\n",
        t.queries,
        t.queries as f64 / seconds,
        t.messages,
        t.messages as f64 / seconds,
        t.sent,
    );
    out += &format!(
        "latency    per message, us: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}\n",
        t.latency_us(0.50),
        t.latency_us(0.90),
        t.latency_us(0.99),
        t.latency_us(0.999),
        t.latency_us(1.0),
    );
    if let (Some(p50), Some(p99), Some(max)) = (
        t.send_delay_us(0.50),
        t.send_delay_us(0.99),
        t.send_delay_us(1.0),
    ) {
        out += &format!(
            "send delay per message, due to sent (part of the latency), us: p50 {p50:.1}  p99 {p99:.1}  max {max:.1}\n"
        );
    }
    if t.errors.is_empty() {
        out += "errors     none\n";
    } else {
        let list: Vec<String> = t.errors.iter().map(|(c, n)| format!("{c} {n}")).collect();
        out += &format!("errors     {}\n", list.join(", "));
    }
    match (report.indexer_cpu, report.cpu_per_query_us()) {
        (Some((pid, cpu)), Some(per_query)) => {
            out += &format!(
                "indexer    pid {pid}: {:.3} s CPU, {per_query:.2} us per {}\n",
                cpu.as_secs_f64(),
                one,
            );
        }
        (Some((pid, cpu)), None) => {
            out += &format!(
                "indexer    pid {pid}: {:.3} s CPU, none answered (no CPU per {})\n",
                cpu.as_secs_f64(),
                one,
            );
        }
        _ => out += "indexer    CPU not measured (not on this host, or give --indexer-pid)\n",
    }
    out
}
