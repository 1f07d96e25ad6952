//! Ingress-to-egress latency, when [`crate::pfe::PfeBuilder::latency`] turns it on.
//!
//! Ingress stamps each batch with the clock when it hands the batch to dispatch; every packet
//! of the batch shares that stamp (a burst fills a batch at once, so the stamp is the arrival
//! of its last packet, which is off by at most the time to fill one batch). When a packet's
//! outputs are handed to the egress queues, the time since its stamp is recorded: once per
//! ingress packet that leaves (forwarded, multicast, or creating packets), never for drops or
//! packets a program consumed. A packet the reorder engine held keeps its own stamp while it
//! waits, so the wait is part of its latency.
//!
//! Samples go to HdrHistograms (2 significant digits: 1% resolution, from 1 ns to an hour),
//! one per PPE thread so that recording never contends; a snapshot merges them.

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use parking_lot::Mutex;

/// Largest latency recorded (an hour); longer ones are clamped to it.
const MAX_NS: u64 = 3_600_000_000_000;
/// Significant decimal digits of the histograms.
const SIGFIG: u8 = 2;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, SIGFIG).expect("valid histogram bounds")
}

/// One histogram per PPE thread.
pub(crate) struct LatencyRecorder {
    shards: Box<[CachePadded<Mutex<Histogram<u64>>>]>,
}

impl LatencyRecorder {
    pub fn new(shards: usize) -> Self {
        LatencyRecorder {
            shards: (0..shards.max(1))
                .map(|_| CachePadded::new(Mutex::new(histogram())))
                .collect(),
        }
    }

    /// Records `count` packets that took `ns` each, in shard `shard`.
    pub fn record(&self, shard: usize, ns: u64, count: u64) {
        if count == 0 {
            return;
        }
        let shard = &self.shards[shard % self.shards.len()];
        // saturating_record_n clamps to the histogram's range instead of failing.
        shard.lock().saturating_record_n(ns.clamp(1, MAX_NS), count);
    }

    /// Every shard merged.
    pub fn snapshot(&self) -> Histogram<u64> {
        let mut all = histogram();
        for s in self.shards.iter() {
            all.add(&*s.lock()).expect("histograms of equal bounds");
        }
        all
    }

    /// Forgets every sample (e.g. after a warm-up, or between the trials of a test).
    pub fn reset(&self) {
        for s in self.shards.iter() {
            s.lock().reset();
        }
    }
}

/// A summary of ingress-to-egress latencies, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LatencyStats {
    /// Packets timed.
    pub count: u64,
    /// Shortest.
    pub min_ns: u64,
    /// Mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Longest.
    pub max_ns: u64,
}

impl LatencyStats {
    /// The summary of `h` (all zeros when it is empty). Percentiles are the histogram's
    /// bucket values: within 1% of the exact sample.
    pub fn of(h: &Histogram<u64>) -> LatencyStats {
        if h.is_empty() {
            return LatencyStats::default();
        }
        LatencyStats {
            count: h.len(),
            min_ns: h.min(),
            mean_ns: h.mean(),
            p50_ns: h.value_at_quantile(0.5),
            p90_ns: h.value_at_quantile(0.9),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_merge_and_percentiles_follow_the_samples() {
        let r = LatencyRecorder::new(3);
        // 990 samples at 1 us, 9 at 100 us, 1 at 10 ms, spread over the shards.
        r.record(0, 1_000, 500);
        r.record(1, 1_000, 490);
        r.record(2, 100_000, 9);
        r.record(7, 10_000_000, 1); // shard 7 % 3
        let s = LatencyStats::of(&r.snapshot());
        assert_eq!(s.count, 1000);
        let near = |v: u64, want: u64| v.abs_diff(want) * 100 <= want;
        assert!(near(s.p50_ns, 1_000) && near(s.p90_ns, 1_000), "{s:?}");
        assert!(near(s.p99_ns, 1_000), "{s:?}");
        assert!(near(s.p999_ns, 100_000), "{s:?}");
        assert!(near(s.max_ns, 10_000_000) && near(s.min_ns, 1_000), "{s:?}");
        r.reset();
        assert_eq!(LatencyStats::of(&r.snapshot()), LatencyStats::default());
    }

    #[test]
    fn zero_and_huge_latencies_are_clamped_not_lost() {
        let r = LatencyRecorder::new(1);
        r.record(0, 0, 2);
        r.record(0, u64::MAX, 1);
        r.record(0, 5, 0);
        let s = LatencyStats::of(&r.snapshot());
        assert_eq!(s.count, 3);
        assert!(s.max_ns >= MAX_NS / 100 * 99);
    }
}
