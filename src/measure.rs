//! Measurement helpers: CPU pinning and latency statistics.

use std::time::Duration;

/// Pins the calling thread (and threads it spawns later) to one CPU.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit of the set; cpu is bounds-checked by the macro's callee.
    unsafe { libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set) };
    // SAFETY: pid 0 means the calling thread; set is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Summary of round-trip samples, reported as one-way figures (half a round trip).
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Message size in bytes.
    pub size: usize,
    /// Number of round trips measured.
    pub iters: usize,
    /// Median one-way latency.
    pub median: Duration,
    /// Mean one-way latency.
    pub mean: Duration,
    /// 90th percentile one-way latency.
    pub p90: Duration,
    /// 99th percentile one-way latency.
    pub p99: Duration,
    /// 99.9th percentile one-way latency.
    pub p999: Duration,
    /// Bytes per second from the median (size per one-way latency).
    pub bandwidth: f64,
}

impl Summary {
    /// Summarises round-trip times.
    ///
    /// ```
    /// use std::time::Duration;
    /// let s = ucx_stack::measure::Summary::from_round_trips(
    ///     1000,
    ///     &mut [Duration::from_micros(2), Duration::from_micros(4), Duration::from_micros(6)],
    /// );
    /// assert_eq!(s.median, Duration::from_micros(2));
    /// assert_eq!(s.bandwidth, 1000.0 / 2e-6);
    /// ```
    pub fn from_round_trips(size: usize, rts: &mut [Duration]) -> Summary {
        assert!(!rts.is_empty(), "no samples");
        rts.sort_unstable();
        let pick = |q: f64| rts[((rts.len() - 1) as f64 * q).round() as usize] / 2;
        let total: Duration = rts.iter().sum();
        let median = pick(0.5);
        Summary {
            size,
            iters: rts.len(),
            median,
            mean: total / (2 * rts.len() as u32),
            p90: pick(0.9),
            p99: pick(0.99),
            p999: pick(0.999),
            bandwidth: size as f64 / median.as_secs_f64().max(1e-12),
        }
    }
}

/// Formats bytes per second as MB/s (10^6, like `ucx_perftest`).
pub fn mbps(bytes_per_sec: f64) -> String {
    format!("{:.1}", bytes_per_sec / 1e6)
}
