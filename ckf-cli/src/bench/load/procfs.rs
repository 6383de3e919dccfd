//! The indexer's CPU time, when its process is on this host: found by `--indexer-pid` or by the
//! port of the URL (`/proc/net/tcp*` and `/proc/*/fd`), read from `/proc/<pid>/stat`.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};

/// A process's CPU time so far (user + system), from `/proc/<pid>/stat`.
///
/// # Errors
/// The process is gone or the file is not in the documented format.
pub fn process_cpu(pid: u32) -> Result<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    let ticks = cpu_ticks(&text).ok_or_else(|| anyhow!("/proc/{pid}/stat: unexpected format"))?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 {
        per_second as u64
    } else {
        100
    };
    Ok(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / per_second,
    ))
}

/// utime + stime (fields 14 and 15, in clock ticks) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may hold spaces, so fields are counted after its `)`.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After ")": field 3 (state) is the first; utime is field 14, i.e. the 12th after it.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Socket inodes in LISTEN state on `port`, from the text of `/proc/net/tcp` or `tcp6`.
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let local_port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            // State 0A is TCP_LISTEN.
            (local_port == port && *fields.get(3)? == "0A")
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The process listening on TCP `port` of this host, if `/proc` shows one we may inspect.
pub fn pid_listening_on(port: u16) -> Option<u32> {
    let inodes: Vec<u64> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && wanted.iter().any(|w| target.as_os_str() == w.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// The port of an `http://host:port` / `https://host:port` URL when its host is this machine
/// (loopback or `localhost`), else `None` (a remote indexer's CPU cannot be read).
pub fn local_port(url: &str) -> Option<u16> {
    let uri: tonic::transport::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let local = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback() || ip.is_unspecified());
    local.then(|| uri.port_u16()).flatten()
}
