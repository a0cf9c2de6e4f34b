//! A worker's memory limit and what it does at each threshold (Dask's, as fractions of the
//! limit):
//!
//! | threshold | default | measured on | action |
//! |---|---|---|---|
//! | `target` | 0.60 | bytes of values in memory | spill least-recently-used values |
//! | `spill` | 0.70 | process RSS | hand freed memory back (`malloc_trim`) at each check |
//! | `pause` | 0.80 | process RSS | start no new task (resume below) |
//! | `terminate` | 0.95 | process RSS | exit with [`EXIT_MEMORY`]; the supervisor restarts it |
//!
//! RSS is read from `/proc/self/statm` every 100 ms, and at each reading the values' target
//! becomes what the process's own memory (RSS less the values) leaves of `target`: values spill
//! until the whole process is back at `target`, whatever its RSS, so `spill` is not what starts
//! spilling (Dask's split, values alone up to `spill`, peaked at 77 MiB of a 96 MiB limit in
//! the spill drill while values were made, against 60 this way). Writing is the spill thread's
//! (`spiller`): task threads wait before starting a task while it is behind. After spilling,
//! and at each check past `spill`, freed memory is handed back to the system (`malloc_trim`),
//! and large values are allocated with `mmap` (threshold fixed at 1 MiB) so that freeing them
//! lowers RSS at once: otherwise glibc keeps freed heap memory, RSS stays high after the values
//! left, and the worker pauses for nothing (Dask's "stuck at the pause threshold"). A worker
//! paused with nothing left to spill and nothing running could never resume; it resumes with a
//! warning instead (only `terminate` can help then).

/// The exit status of a worker that went past its `terminate` threshold (`EX_TEMPFAIL`):
/// supervisors restart it.
pub const EXIT_MEMORY: i32 = 75;

/// Memory thresholds, as fractions of the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryThresholds {
    /// Spill least-recently-used values above this fraction of the limit in values.
    pub target: f64,
    /// Spill above this fraction of the limit in process RSS.
    pub spill: f64,
    /// Pause (start no new task) above this fraction in RSS.
    pub pause: f64,
    /// Exit (to be restarted) above this fraction in RSS.
    pub terminate: f64,
}

impl Default for MemoryThresholds {
    fn default() -> Self {
        MemoryThresholds {
            target: 0.6,
            spill: 0.7,
            pause: 0.8,
            terminate: 0.95,
        }
    }
}

/// The machine's memory in bytes (`MemTotal`, or the cgroup's limit when lower); `None` when
/// it cannot be read.
pub fn machine_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)?;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Some(cgroup.map_or(total, |c| c.min(total)))
}

/// This process's resident memory in bytes (0 when it cannot be read).
pub fn rss() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions; it reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(4096) as u64
}

/// This process's CPU time so far (user and system), in seconds; 0 where `/proc` is not
/// there.
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The fields after the command (which may hold spaces) in parentheses: utime and stime
    // are the 12th and 13th.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions; it reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / hz.max(1) as f64
}

/// Allocations of 1 MiB and more get their own mappings, returned to the system when freed.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's thresholds; it is called before the
    // worker's threads allocate much, and glibc serialises it with allocations anyway.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Hands freed heap memory back to the system.
pub fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory at the top of glibc's heaps; it takes
    // the allocator's locks itself.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What a worker's memory check decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Run as usual.
    Run,
    /// Start no new task.
    Pause,
    /// Exit to be restarted.
    Terminate,
}

/// Bytes for each threshold of a `limit`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The limit (0: none).
    pub limit: u64,
    /// Its thresholds.
    pub at: MemoryThresholds,
}

impl Limits {
    fn bytes(&self, fraction: f64) -> u64 {
        (self.limit as f64 * fraction) as u64
    }

    /// Bytes of values in memory above which the store spills (0: never).
    pub fn target(&self) -> u64 {
        self.bytes(self.at.target)
    }

    /// RSS above which the worker hands freed memory back to the system at each check.
    pub fn spill(&self) -> u64 {
        self.bytes(self.at.spill)
    }

    /// The verdict for a process of `rss` bytes.
    pub fn verdict(&self, rss: u64) -> Verdict {
        if self.limit == 0 {
            Verdict::Run
        } else if rss > self.bytes(self.at.terminate) {
            Verdict::Terminate
        } else if rss > self.bytes(self.at.pause) {
            Verdict::Pause
        } else {
            Verdict::Run
        }
    }
}

/// The process's CPU use since `last` (CPU seconds, and when), in thousandths of a core; `last`
/// becomes now.
pub(crate) fn cpu_share_since(
    last: &mut (f64, std::time::Instant),
    now: std::time::Instant,
) -> u32 {
    let cpu = cpu_seconds();
    let (was, at) = std::mem::replace(last, (cpu, now));
    let wall = now.duration_since(at).as_secs_f64();
    if wall > 0.0 {
        ((cpu - was).max(0.0) / wall * 1000.0) as u32
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_and_readings() {
        let l = Limits {
            limit: 1000,
            at: MemoryThresholds::default(),
        };
        assert_eq!((l.target(), l.spill()), (600, 700));
        assert_eq!(l.verdict(790), Verdict::Run);
        assert_eq!(l.verdict(801), Verdict::Pause);
        assert_eq!(l.verdict(951), Verdict::Terminate);
        let none = Limits { limit: 0, ..l };
        assert_eq!(none.verdict(u64::MAX), Verdict::Run);
        assert!(rss() > 0, "this process has resident memory");
        assert!(machine_memory().is_some_and(|m| m > rss()));
    }
}
