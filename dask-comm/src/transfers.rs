//! The shuffle's deliveries per worker pair, as dask-cuda's benchmarks print them: for each
//! (sender, receiver), the 25th, 50th and 75th percentiles of the per-delivery rate and the
//! bytes moved (`(w1,w2) | 25% 50% 75% (total nbytes)`), from the workers' transfer logs
//! ([`crate::Client::transfer_log`]).
//!
//! ```
//! use dask_comm::{transfers::pair_rates, Transfer};
//! let t = |peer: &str, bytes, micros, seq| Transfer { peer: peer.into(), bytes, micros, fetched: false, seq };
//! let before = vec![("a".to_string(), vec![t("b", 1, 1, 1)])];
//! let after = vec![
//!     ("a".to_string(), vec![t("b", 1, 1, 1), t("b", 8_000_000, 4_000, 2), t("b", 8_000_000, 2_000, 3)]),
//!     ("b".to_string(), vec![t("a", 1_000_000, 1_000, 1)]),
//! ];
//! let pairs = pair_rates(&before, &after);
//! assert_eq!(pairs.len(), 2);
//! assert_eq!((pairs[0].from.as_str(), pairs[0].to.as_str()), ("a", "b"));
//! assert_eq!((pairs[0].deliveries, pairs[0].bytes), (2, 16_000_000));
//! assert_eq!(dask_comm::transfers::totals(&pairs), (17_000_000, 7_000, 3));
//! // 2,000 and 4,000 MB/s: the quartiles between them.
//! assert_eq!(pairs[0].mb_s, [2_500.0, 3_000.0, 3_500.0]);
//! // A fetch is logged by the receiver: its pair is (peer, receiver).
//! let fetch = Transfer { peer: "a".into(), bytes: 64, micros: 1, fetched: true, seq: 1 };
//! let pairs = pair_rates(&[], &[("c".to_string(), vec![fetch])]);
//! assert_eq!((pairs[0].from.as_str(), pairs[0].to.as_str()), ("a", "c"));
//! // Only the deliveries (what the shuffle's benchmarks count):
//! assert!(dask_comm::transfers::deliveries(after.clone()).iter().all(|(_, e)| e.iter().all(|t| !t.fetched)));
//! ```

use crate::Transfer;

/// One worker pair's deliveries.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PairRates {
    /// The sending worker (its data address).
    pub from: String,
    /// The receiving worker.
    pub to: String,
    /// Deliveries counted.
    pub deliveries: u64,
    /// Bytes they moved.
    pub bytes: u64,
    /// Their times added up, in microseconds.
    pub micros: u64,
    /// The 25th, 50th and 75th percentiles of the per-delivery rate, MB/s (bytes over the
    /// time from the delivery's first byte to the receiver's acknowledgement).
    pub mb_s: [f64; 3],
}

impl PairRates {
    /// One JSON object: `{"from":…,"to":…,"deliveries":…,"bytes":…,"mb_s":[p25,p50,p75]}`.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"from\":{:?},\"to\":{:?},\"deliveries\":{},\"bytes\":{},\"mb_s\":[{:.1},{:.1},{:.1}]}}",
            self.from, self.to, self.deliveries, self.bytes, self.mb_s[0], self.mb_s[1], self.mb_s[2]
        )
    }
}

/// All pairs together: bytes, microseconds, deliveries.
pub fn totals(pairs: &[PairRates]) -> (u64, u64, u64) {
    pairs.iter().fold((0, 0, 0), |(b, m, n), p| {
        (b + p.bytes, m + p.micros, n + p.deliveries)
    })
}

/// The logs with their fetches left out: shuffle deliveries only.
pub fn deliveries(logs: Vec<(String, Vec<Transfer>)>) -> Vec<(String, Vec<Transfer>)> {
    logs.into_iter()
        .map(|(w, e)| (w, e.into_iter().filter(|t| !t.fetched).collect()))
        .collect()
}

/// The transfers logged in `after` and not yet in `before` (two reads of the same workers'
/// logs: entries numbered past the last `before` had), per (sender, receiver), sorted by
/// pair: a delivery's sender is the worker that logged it, a fetch's is its peer.
pub fn pair_rates(
    before: &[(String, Vec<Transfer>)],
    after: &[(String, Vec<Transfer>)],
) -> Vec<PairRates> {
    let mut pairs: std::collections::BTreeMap<(String, String), (u64, u64, Vec<f64>)> =
        Default::default();
    for (worker, entries) in after {
        let seen = before
            .iter()
            .find(|(w, _)| w == worker)
            .and_then(|(_, e)| e.iter().map(|t| t.seq).max())
            .unwrap_or(0);
        for t in entries.iter().filter(|t| t.seq > seen) {
            let pair = if t.fetched {
                (t.peer.clone(), worker.clone())
            } else {
                (worker.clone(), t.peer.clone())
            };
            let pair = pairs.entry(pair).or_default();
            pair.0 += t.bytes;
            pair.1 += t.micros;
            pair.2.push(t.bytes as f64 / (t.micros.max(1) as f64));
        }
    }
    pairs
        .into_iter()
        .map(|((from, to), (bytes, micros, mut rates))| {
            rates.sort_by(f64::total_cmp);
            PairRates {
                from,
                to,
                deliveries: rates.len() as u64,
                bytes,
                micros,
                mb_s: [0.25, 0.5, 0.75].map(|q| percentile(&rates, q)),
            }
        })
        .collect()
}

/// The `q` quantile of sorted `v`, interpolated linearly between ranks (NumPy's default).
fn percentile(v: &[f64], q: f64) -> f64 {
    match v.len() {
        0 => 0.0,
        n => {
            let at = q * (n - 1) as f64;
            let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
        }
    }
}
