//! What Figures 15 and 16 share: one point of aggregation latency and rate, its run, its
//! table and the checks of their common options.

use serde::Serialize;

use super::{
    check_ppe, check_timers, check_workers, gradients, mean, percentile, rig, run_timed, sums_of,
    us, worker_config, yes_no, ExperimentError, RigConfig,
};
use crate::microcode::trio_ml::host::{HostError, Worker};
use crate::packet::Port;

/// One point of Figure 15 or 16: `workers` workers allreduce `blocks` packets of `grads`
/// gradients each with `window` outstanding.
#[derive(Clone, Debug, Serialize)]
pub struct RatePoint {
    /// Gradients per packet.
    pub grads: u16,
    /// Packets outstanding per worker.
    pub window: usize,
    /// Packets each worker sent.
    pub blocks: usize,
    /// Results received over all workers.
    pub results: u64,
    /// Mean time from a packet's first send to its Result, µs.
    pub latency_mean_us: f64,
    /// Median of the same, µs.
    pub latency_p50_us: f64,
    /// 99th percentile of the same, µs.
    pub latency_p99_us: f64,
    /// Gradients aggregated per second, every worker's counted, in millions: all the
    /// workers' gradients over the time from the first send to the last Result.
    pub rate_mgps: f64,
    /// Seconds from the first send to the last Result.
    pub elapsed_s: f64,
    /// Every Result arrived, complete, with the exact sums.
    pub verified: bool,
}

/// One run of [`rate_point`]: the job, the window and the engine.
#[derive(Clone, Copy)]
pub(super) struct RateRun {
    pub(super) workers: u8,
    pub(super) grads: u16,
    pub(super) window: usize,
    pub(super) blocks: usize,
    pub(super) timers: Option<(u32, u64)>,
    pub(super) ppe_threads: usize,
    pub(super) seed: u64,
    pub(super) round: u64,
}

pub(super) fn rate_point(c: RateRun) -> Result<RatePoint, ExperimentError> {
    let r = rig(RigConfig {
        workers: c.workers,
        window: c.window,
        grads: c.grads,
        // Long enough that no block of a queue of full windows ages out.
        // (block_age is 8 bits: at most 255 scan periods).
        block_exp_ms: c.timers.map_or(250, |(_, scan)| {
            (255 * scan / 1_000_000).clamp(1, 250) as u8
        }),
        timers: c.timers,
        ppe_threads: c.ppe_threads,
    })?;
    let n = c.blocks * usize::from(c.grads);
    let srcs: Vec<u8> = (0..c.workers).collect();
    let workers = srcs
        .iter()
        .map(|&s| {
            Ok((
                Worker::new(
                    worker_config(s, c.grads, c.window, 0),
                    gradients(c.seed, s, c.round, n),
                )?,
                Port::from(s),
            ))
        })
        .collect::<Result<Vec<_>, HostError>>()?;
    let timed = run_timed(&r, workers)?;
    r.pfe.shutdown();
    let want = sums_of(c.seed, &srcs, c.round, n);
    let mut lat = Vec::new();
    let mut verified = true;
    let mut results = 0;
    for w in &timed {
        lat.extend_from_slice(w.worker.latencies_ns());
        results += w.worker.stats().results;
        verified &= w.worker.is_done()
            && w.worker.sums() == want
            && w.worker.src_counts().iter().all(|&k| k == c.workers)
            && w.worker.degraded().iter().all(|&d| !d);
    }
    verified &= results == (c.blocks * usize::from(c.workers)) as u64;
    lat.sort_unstable();
    let first = timed
        .iter()
        .flat_map(|w| w.sent_ns.iter())
        .copied()
        .min()
        .unwrap_or(0);
    let last = timed
        .iter()
        .flat_map(|w| w.arrived_ns.iter())
        .copied()
        .max()
        .unwrap_or(0);
    let elapsed = (last.saturating_sub(first)).max(1) as f64 / 1e9;
    let gradients = (n * usize::from(c.workers)) as f64;
    Ok(RatePoint {
        grads: c.grads,
        window: c.window,
        blocks: c.blocks,
        results,
        latency_mean_us: us(mean(&lat)),
        latency_p50_us: us(percentile(&lat, 0.5) as f64),
        latency_p99_us: us(percentile(&lat, 0.99) as f64),
        rate_mgps: gradients / elapsed / 1e6,
        elapsed_s: elapsed,
        verified,
    })
}

pub(super) const RATE_HEADER: [&str; 10] = [
    "grads",
    "window",
    "blocks",
    "results",
    "latency_mean_us",
    "latency_p50_us",
    "latency_p99_us",
    "rate_mgps",
    "elapsed_s",
    "verified",
];

pub(super) fn rate_rows(points: &[RatePoint]) -> Vec<Vec<String>> {
    points
        .iter()
        .map(|p| {
            vec![
                p.grads.to_string(),
                p.window.to_string(),
                p.blocks.to_string(),
                p.results.to_string(),
                format!("{:.2}", p.latency_mean_us),
                format!("{:.2}", p.latency_p50_us),
                format!("{:.2}", p.latency_p99_us),
                format!("{:.3}", p.rate_mgps),
                format!("{:.4}", p.elapsed_s),
                p.verified.to_string(),
            ]
        })
        .collect()
}

pub(super) fn rate_table(
    points: &[RatePoint],
    x_name: &str,
    x: &dyn Fn(&RatePoint) -> String,
) -> String {
    let mut s = format!(
        "{:>10} {:>8} {:>12} {:>11} {:>11} {:>14} {:>9}\n",
        x_name, "results", "latency µs", "p50 µs", "p99 µs", "M gradients/s", "verified"
    );
    for p in points {
        s += &format!(
            "{:>10} {:>8} {:>12.1} {:>11.1} {:>11.1} {:>14.2} {:>9}\n",
            x(p),
            p.results,
            p.latency_mean_us,
            p.latency_p50_us,
            p.latency_p99_us,
            p.rate_mgps,
            yes_no(p.verified)
        );
    }
    s
}

pub(super) fn check_rate_common(
    workers: u8,
    timers: bool,
    scan_timers: u32,
    scan_period_ns: u64,
    ppe_threads: usize,
) -> Result<(), ExperimentError> {
    check_workers("--workers", workers, 1)?;
    if timers {
        check_timers(scan_timers, scan_period_ns)?;
    }
    check_ppe(ppe_threads)
}
