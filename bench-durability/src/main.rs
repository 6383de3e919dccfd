//! Durability benchmark for the producer's exact ownership state: redb vs fjall vs a logical
//! write-ahead log with checkpoints, on the producer's workload (see `workload`), in one run.
//!
//! The parent process interleaves repetitions and backends; each measurement runs in a child
//! process of this same binary. The write child ends with `_exit` right after its last group
//! commit (no destructors, no clean close: what kill -9 leaves on disk), and the recovery
//! children reopen that directory, first with its pages dropped from the page cache (cold), then
//! again (warm, the usual case after kill -9 on a live host), and report the digest of what
//! they loaded, which the parent checks against the model's.

mod disk;
mod owners;
mod store_fjall;
mod store_log;
mod store_redb;
mod window;
mod workload;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::{Deserialize, Serialize};

use window::{PhaseStats, Run, WriteStats};
use workload::{Digest, Workload};

/// Benchmark: durable ownership state, redb vs fjall vs checkpoint + write-ahead log.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// Tracked ownership edges in the steady state (the warm-up fill).
    #[arg(long, default_value_t = 10_000_000)]
    blocks: u64,
    /// Members the edges are spread over.
    #[arg(long, default_value_t = 1000)]
    members: u32,
    /// Block ops generated for the op stream (what a store that keeps up applies, and so what
    /// the log replays: 5 s of log at 1 M ops/s).
    #[arg(long, default_value_t = 5_000_000)]
    ops: u64,
    /// Offered load of the paced phase, block ops/s.
    #[arg(long, default_value_t = 1_000_000.0)]
    offered: f64,
    /// Seconds of the paced phase.
    #[arg(long, default_value_t = 2.0)]
    paced_s: f64,
    /// At most this many seconds of the saturated phase (slow stores stop early, at an event
    /// boundary, so the defaults finish in minutes).
    #[arg(long, default_value_t = 15.0)]
    max_run_s: f64,
    /// Directory on the real disk for the stores (one sub-directory per measurement, removed after).
    #[arg(long, default_value = "target/bench-durability-data")]
    dir: PathBuf,
    /// Group-commit window in milliseconds.
    #[arg(long, default_value_t = 50)]
    commit_ms: u64,
    /// Repetitions of every backend, interleaved.
    #[arg(long, default_value_t = 2)]
    reps: u32,
    /// Backends, comma-separated: mem (no durability, the in-memory figure), log, redb,
    /// redb-qr (redb with quick-repair), fjall.
    #[arg(long, default_value = "mem,log,redb,redb-qr,fjall")]
    backends: String,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Internal: run one phase in this process (`write` or `recover`).
    #[arg(long, hide = true)]
    phase: Option<String>,
    /// Internal: the backend of `--phase`.
    #[arg(long, hide = true)]
    backend: Option<String>,
}

/// A write child's report.
#[derive(Debug, Serialize, Deserialize)]
struct WriteReport {
    stats: WriteStats,
    expect: Digest,
}

/// A recovery child's report.
#[derive(Debug, Serialize, Deserialize)]
struct RecoverReport {
    /// Seconds from the first file access to a complete in-memory map.
    total_s: f64,
    /// Part of `total_s`: store open (redb/fjall), checkpoint load (log).
    open_s: f64,
    /// Log records replayed (log only).
    records: u64,
    digest: Digest,
}

fn emit<T: Serialize>(v: &T) -> ! {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v).expect("stdout");
    out.write_all(b"\n")
        .and_then(|_| out.flush())
        .expect("stdout");
    // SAFETY: ends the process at once without destructors or atexit handlers, which is what a
    // kill -9 right after the last group commit leaves behind.
    unsafe { libc::_exit(0) }
}

fn write_phase(a: &Args, backend: &str) -> Result<WriteReport> {
    let w = Workload::generate(a.blocks, a.members, a.ops, a.seed);
    let run = Run {
        commit_ms: a.commit_ms,
        offered: a.offered,
        paced_s: a.paced_s,
        max_s: a.max_run_s,
    };
    let stats = match backend {
        "mem" => mem_run(&w),
        "log" => store_log::write(&a.dir, &w, &run)?,
        "redb" => store_redb::write(&a.dir, &w, &run, false)?,
        "redb-qr" => store_redb::write(&a.dir, &w, &run, true)?,
        "fjall" => store_fjall::write(&a.dir, &w, &run)?,
        b => bail!("unknown backend {b}"),
    };
    let expect = w.digest_after(stats.events);
    Ok(WriteReport { stats, expect })
}

/// The in-memory figure: the same op stream applied to the recovery map, no durability,
/// saturated only.
fn mem_run(w: &Workload) -> WriteStats {
    let t = Instant::now();
    let mut map = owners::OwnersMap::with_capacity(w.fill_edges() as usize);
    let tags: Vec<u32> = w.members.iter().map(|&m| map.tag(m)).collect();
    for (hs, &t) in w.fill.iter().zip(&tags) {
        for &h in hs {
            map.store(h, t);
        }
    }
    let fill_s = t.elapsed().as_secs_f64();
    let (t, cpu) = (Instant::now(), disk::cpu_seconds());
    for ev in &w.events {
        let tag = tags[ev.member as usize];
        for &h in w.event_hashes(ev) {
            if ev.store {
                map.store(h, tag);
            } else {
                map.remove(h, tag);
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu_s = disk::cpu_seconds() - cpu;
    assert_eq!(map.digest(), w.final_digest, "in-memory model diverged");
    let saturated = PhaseStats {
        ops: w.ops(),
        secs,
        cpu_s,
        commit_ms: vec![],
    };
    WriteStats {
        fill_s,
        saturated,
        events: w.events.len(),
        ..Default::default()
    }
}

fn recover_phase(a: &Args, backend: &str) -> Result<RecoverReport> {
    let t = Instant::now();
    let (map, open_s, records) = match backend {
        "log" => store_log::recover(&a.dir)?,
        "redb" | "redb-qr" => {
            let (m, o) = store_redb::recover(&a.dir)?;
            (m, o, 0)
        }
        "fjall" => {
            let (m, o) = store_fjall::recover(&a.dir)?;
            (m, o, 0)
        }
        b => bail!("backend {b} has no recovery"),
    };
    let total_s = t.elapsed().as_secs_f64();
    Ok(RecoverReport {
        total_s,
        open_s,
        records,
        digest: map.digest(),
    })
}

/// Runs this binary as a child for one phase and parses its one-line JSON report.
fn child<T: for<'de> Deserialize<'de>>(
    a: &Args,
    phase: &str,
    backend: &str,
    dir: &Path,
) -> Result<T> {
    let out = Command::new(std::env::current_exe()?)
        .args(["--phase", phase, "--backend", backend])
        .arg("--dir")
        .arg(dir)
        .args([
            "--blocks",
            &a.blocks.to_string(),
            "--members",
            &a.members.to_string(),
        ])
        .args([
            "--ops",
            &a.ops.to_string(),
            "--commit-ms",
            &a.commit_ms.to_string(),
        ])
        .args([
            "--seed",
            &a.seed.to_string(),
            "--offered",
            &a.offered.to_string(),
        ])
        .args([
            "--paced-s",
            &a.paced_s.to_string(),
            "--max-run-s",
            &a.max_run_s.to_string(),
        ])
        .output()?;
    if !out.status.success() {
        bail!(
            "{phase} {backend} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = String::from_utf8(out.stdout)?;
    serde_json::from_str(line.trim()).with_context(|| format!("{phase} {backend} report: {line}"))
}

/// One (repetition, backend) measurement.
#[derive(Debug, Serialize)]
struct Sample {
    rep: u32,
    backend: String,
    fdatasync_ms_p50: f64,
    fdatasync_ms_p99: f64,
    /// Paced phase: achieved / offered block ops/s.
    paced_ratio: f64,
    paced_cores: f64,
    paced_commit_ms_p50: f64,
    paced_commit_ms_p99: f64,
    paced_commit_ms_max: f64,
    /// Saturated phase: block ops/s.
    ops_per_s: f64,
    cores: f64,
    commit_ms_p50: f64,
    commit_ms_p99: f64,
    commit_ms_max: f64,
    windows: usize,
    fill_s: f64,
    edges: u64,
    bytes_per_edge: f64,
    allocated_bytes_per_edge: f64,
    recover_cold_s: f64,
    recover_cold_open_s: f64,
    recover_warm_s: f64,
    recover_warm_open_s: f64,
    log_records: u64,
}

fn measure(a: &Args, rep: u32, backend: &str) -> Result<Sample> {
    let dir = a.dir.join(format!("rep{rep}-{backend}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let mut probe = disk::fdatasync_probe(&dir, 40, 4096)?;
    let (f50, f99, _) = disk::percentiles(&mut probe);
    let w: WriteReport = child(a, "write", backend, &dir)?;
    let mut s = w.stats;
    let (p50, p99, pmax) = disk::percentiles(&mut s.paced.commit_ms);
    let (c50, c99, cmax) = disk::percentiles(&mut s.saturated.commit_ms);
    let durable = backend != "mem";
    let nan_unless = |x: f64| if durable { x } else { f64::NAN };
    let mut sample = Sample {
        rep,
        backend: backend.to_string(),
        fdatasync_ms_p50: f50,
        fdatasync_ms_p99: f99,
        paced_ratio: nan_unless(s.paced.ops as f64 / s.paced.secs / s.offered),
        paced_cores: nan_unless(s.paced.cpu_s / s.paced.secs),
        paced_commit_ms_p50: nan_unless(p50),
        paced_commit_ms_p99: nan_unless(p99),
        paced_commit_ms_max: nan_unless(pmax),
        // NaN when the paced phase used up the stream.
        ops_per_s: if s.saturated.ops > 0 {
            s.saturated.ops as f64 / s.saturated.secs
        } else {
            f64::NAN
        },
        cores: if s.saturated.ops > 0 {
            s.saturated.cpu_s / s.saturated.secs
        } else {
            f64::NAN
        },
        commit_ms_p50: nan_unless(c50),
        commit_ms_p99: nan_unless(c99),
        commit_ms_max: nan_unless(cmax),
        windows: s.paced.commit_ms.len() + s.saturated.commit_ms.len(),
        fill_s: s.fill_s,
        edges: w.expect.edges,
        bytes_per_edge: f64::NAN,
        allocated_bytes_per_edge: f64::NAN,
        recover_cold_s: f64::NAN,
        recover_cold_open_s: f64::NAN,
        recover_warm_s: f64::NAN,
        recover_warm_open_s: f64::NAN,
        log_records: 0,
    };
    if durable {
        let (len, alloc) = disk::dir_bytes(&dir)?;
        sample.bytes_per_edge = len as f64 / w.expect.edges as f64;
        sample.allocated_bytes_per_edge = alloc as f64 / w.expect.edges as f64;
        disk::drop_cache(&dir)?;
        let cold: RecoverReport = child(a, "recover", backend, &dir)?;
        let warm: RecoverReport = child(a, "recover", backend, &dir)?;
        for r in [&cold, &warm] {
            if r.digest != w.expect {
                bail!(
                    "{backend}: recovered {:?}, expected {:?}",
                    r.digest,
                    w.expect
                );
            }
        }
        sample.recover_cold_s = cold.total_s;
        sample.recover_cold_open_s = cold.open_s;
        sample.recover_warm_s = warm.total_s;
        sample.recover_warm_open_s = warm.open_s;
        sample.log_records = cold.records;
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(sample)
}

fn spread(v: &[f64], fmt: impl Fn(f64) -> String) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.is_empty() || v.iter().any(|x| x.is_nan()) {
        "-".into()
    } else if v.len() == 1 || fmt(lo) == fmt(hi) {
        fmt(lo)
    } else {
        format!("{}-{}", fmt(lo), fmt(hi))
    }
}

fn table(samples: &[Sample], backends: &[&str], offered: f64) {
    println!(
        "| backend | paced: achieved / offered {:.2} M | paced: cores, commit ms p50 / p99 / max | saturated: block ops/s, cores | saturated: commit ms p99 / max | fill s | bytes/edge (allocated) | recovery cold s (open) | recovery warm s (open) | fdatasync ms p50 / p99 |",
        offered / 1e6
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for b in backends {
        let s: Vec<&Sample> = samples.iter().filter(|s| s.backend == *b).collect();
        let col = |f: &dyn Fn(&Sample) -> f64, fmt: &dyn Fn(f64) -> String| {
            spread(&s.iter().map(|x| f(x)).collect::<Vec<_>>(), fmt)
        };
        let m = |x: f64| format!("{:.2} M", x / 1e6);
        let f1 = |x: f64| format!("{x:.1}");
        let f2 = |x: f64| format!("{x:.2}");
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        println!(
            "| {b} | {} | {}, {} / {} / {} | {}, {} | {} / {} | {} | {} ({}) | {} ({}) | {} ({}) | {} / {} |",
            col(&|x| x.paced_ratio, &pct),
            col(&|x| x.paced_cores, &f2),
            col(&|x| x.paced_commit_ms_p50, &f1),
            col(&|x| x.paced_commit_ms_p99, &f1),
            col(&|x| x.paced_commit_ms_max, &f1),
            col(&|x| x.ops_per_s, &m),
            col(&|x| x.cores, &f2),
            col(&|x| x.commit_ms_p99, &f1),
            col(&|x| x.commit_ms_max, &f1),
            col(&|x| x.fill_s, &f1),
            col(&|x| x.bytes_per_edge, &f1),
            col(&|x| x.allocated_bytes_per_edge, &f1),
            col(&|x| x.recover_cold_s, &f2),
            col(&|x| x.recover_cold_open_s, &f2),
            col(&|x| x.recover_warm_s, &f2),
            col(&|x| x.recover_warm_open_s, &f2),
            col(&|x| x.fdatasync_ms_p50, &f2),
            col(&|x| x.fdatasync_ms_p99, &f2),
        );
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if let Some(phase) = a.phase.as_deref() {
        let backend = a.backend.as_deref().context("--phase needs --backend")?;
        match phase {
            "write" => emit(&write_phase(&a, backend)?),
            "recover" => emit(&recover_phase(&a, backend)?),
            p => bail!("unknown phase {p}"),
        }
    }
    let backends: Vec<&str> = a.backends.split(',').map(str::trim).collect();
    std::fs::create_dir_all(&a.dir)?;
    eprintln!(
        "blocks {} over {} members, {} block ops per run, commit every {} ms, {} reps, dir {}",
        a.blocks,
        a.members,
        a.ops,
        a.commit_ms,
        a.reps,
        a.dir.display()
    );
    let mut samples = Vec::new();
    for rep in 0..a.reps {
        for b in &backends {
            let t = Instant::now();
            let s = measure(&a, rep, b)?;
            eprintln!(
                "[{:.0}s] {}",
                t.elapsed().as_secs_f64(),
                serde_json::to_string(&s)?
            );
            samples.push(s);
        }
    }
    table(&samples, &backends, a.offered);
    let path = a.dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&samples)?)?;
    eprintln!("samples: {}", path.display());
    Ok(())
}
