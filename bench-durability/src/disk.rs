//! File-system helpers: space used by a directory, dropping its pages from the page cache
//! (a cold-start recovery without touching the rest of the machine), an fdatasync latency
//! probe, and the process's CPU time.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

/// Files under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            files(&e.path(), out)?;
        } else {
            out.push(e.path());
        }
    }
    Ok(())
}

/// `(apparent bytes, allocated bytes)` of all files under `dir`.
pub fn dir_bytes(dir: &Path) -> std::io::Result<(u64, u64)> {
    let mut v = Vec::new();
    files(dir, &mut v)?;
    let (mut len, mut alloc) = (0, 0);
    for p in v {
        let md = fs::metadata(&p)?;
        len += md.len();
        alloc += md.blocks() * 512;
    }
    Ok((len, alloc))
}

/// Writes back and evicts every file under `dir` from the page cache
/// (`fsync` + `posix_fadvise(POSIX_FADV_DONTNEED)`), so the next read comes from the disk.
pub fn drop_cache(dir: &Path) -> std::io::Result<()> {
    let mut v = Vec::new();
    files(dir, &mut v)?;
    for p in v {
        let f = File::open(&p)?;
        f.sync_all()?;
        // SAFETY: plain syscall on a file descriptor we own for the duration of the call.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

/// Latencies in milliseconds of `n` rounds of "append `bytes` + fdatasync" on a fresh file in
/// `dir`.
pub fn fdatasync_probe(dir: &Path, n: usize, bytes: usize) -> std::io::Result<Vec<f64>> {
    let p = dir.join("fdatasync-probe");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&p)?;
    let buf = vec![0xa5u8; bytes];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&buf)?;
        f.sync_data()?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(f);
    fs::remove_file(&p)?;
    Ok(out)
}

/// CPU seconds (user + system) used by this process so far, all threads.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// `(p50, p99, max)` of `v` (sorted in place); zeros when empty.
pub fn percentiles(v: &mut [f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}
