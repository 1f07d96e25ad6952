//! The runner: one switch under one traffic model at one load, measured the paper's way.
//!
//! A run is three phases:
//!
//! 1. **Warm-up**, `warmup_cycles`: traffic flows, nothing is measured, so that the queues
//!    reach their steady state.
//! 2. **Window**, `cycles`: the cells that *arrive* now are the measured ones; the cells
//!    that *leave* now (measured or not) give the throughput.
//! 3. **Drain**: arrivals stop and the switch runs until every measured cell has left or
//!    been dropped (§5.5's "convention to wait to empty the queues"), so that the latency
//!    of a late cell is counted, not censored. CPRR's simple arbiter can strand cells for
//!    good after a drop (§5.4); the drain stops at the first cycle with no departure at all
//!    (with no arrivals, nothing can change after it) and reports them as stranded.
//!
//! Each run owns all its state (no shared state, no threads), so a sweep may run points on
//! as many threads as it likes; the same arguments always give the same [`Report`].
//!
//! Memory: a queued cell takes 24 bytes and storage is kept at its high-water mark. Above an
//! architecture's saturation with infinite FIFOs the backlog grows every cycle (PIM-1 at
//! r = 1 on 16 ports: about 0.36 x 16 cells a cycle, 140 MB after 10^6 cycles), and without
//! a limit a long run would take all the memory there is. So a run is held to a backlog:
//! after any cycle that leaves more than `max_backlog` cells queued ([`DEFAULT_MAX_BACKLOG`],
//! 4 x 10^6, for [`simulate`]), it stops there, without a drain, and its report says it was
//! saturated ([`Report::saturated_at`]) instead of giving latencies or a loss ratio, which a
//! stopped run does not have. A run's memory is then at most about twice the bound's cells
//! (the queues' spare capacity), some 200 MB by default. The bound is on memory, not a test of
//! stability: a run too short to reach it above saturation reports numbers that grow with
//! its length, and a carried load below the offered one.

use super::{AnyFabric, Cell, Counters, Fabric, FabricConfig, Outputs, Traffic, TrafficGen};
use crate::error::ConfigError;
use crate::rng::mix;

/// The backlog [`simulate`] lets a run build up, in cells queued in the fabric: 4 x 10^6,
/// about 100 MB of cells. A run that passes it stops, reported saturated (see the module's
/// doc); [`simulate_bounded`] takes another bound.
pub const DEFAULT_MAX_BACKLOG: u64 = 4_000_000;

/// The longest warm-up, and the longest measured window, a run takes: 10^10 cycles each.
/// A 16-port point of 10^10 cycles runs for hours; a longer one would look like a hang, and
/// the two together stay far below `u64::MAX`, so the window's end never wraps.
pub const MAX_CYCLES: u64 = 10_000_000_000;

/// What a run measured. Latencies are in cycles, in queues (see [`super`]).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Report {
    /// The switch that ran.
    pub config: FabricConfig,
    /// The traffic model.
    pub traffic: Traffic,
    /// The input rate r the traffic was drawn at.
    pub load: f64,
    /// The warm-up's length.
    pub warmup_cycles: u64,
    /// The measured window's length.
    pub cycles: u64,
    /// The most cells the fabric could hold queued before the run stopped.
    pub max_backlog: u64,
    /// The cycle after which the fabric held more than `max_backlog` cells, if it did: the
    /// load is beyond what the switch carries, so its queues grew until the run stopped
    /// there, undrained. The counts below are those up to that cycle; the latencies and the
    /// loss ratio, which a stopped run does not have, are absent.
    pub saturated_at: Option<u64>,
    /// Cells that arrived in the window.
    pub measured: u64,
    /// Of those, the cells that left (in the window or the drain).
    pub delivered: u64,
    /// Of those, the cells dropped.
    pub dropped: u64,
    /// Of those, the cells still queued when the drain stopped (CPRR's simple arbiter only;
    /// 0 in a saturated run, which has no drain).
    pub stranded: u64,
    /// Of those, the cells still in the fabric when a saturated run stopped, undrained (0 in
    /// a run that finished). So `measured == delivered + dropped + stranded + unfinished`
    /// ([`Report::accounted`]).
    pub unfinished: u64,
    /// The mean latency of the delivered measured cells (Figures 9 and 11); absent when the
    /// run was saturated or delivered none (no cell, no latency: not a latency of 0).
    pub mean_latency: Option<f64>,
    /// The paper's "average worst-case latency" (Figure 12), read as: the largest latency
    /// of a measured cell at each output, averaged over the outputs that delivered one;
    /// absent when the run was saturated or delivered none.
    pub avg_worst_latency: Option<f64>,
    /// The largest latency of any measured cell; absent when the run was saturated or
    /// delivered none.
    pub max_latency: Option<u64>,
    /// Cells that left in the window, per output per cycle: the carried load. Over the
    /// window's cycles that ran, so absent only when a saturated run stopped before it.
    pub throughput: Option<f64>,
    /// `dropped / measured` (Figure 13); absent when the run was saturated or measured no
    /// cell (no cell, no loss ratio: not a ratio of 0).
    pub loss_ratio: Option<f64>,
    /// Cycles the drain took.
    pub drain_cycles: u64,
    /// The fabric's counters at the end, over all three phases.
    pub counters: Counters,
}

impl Report {
    /// Whether every measured cell is accounted for: delivered, dropped, stranded or, in a
    /// saturated run, still in the fabric.
    pub fn accounted(&self) -> bool {
        self.measured == self.delivered + self.dropped + self.stranded + self.unfinished
    }
}

/// What the loop accumulates.
struct Tally {
    window: std::ops::Range<u64>,
    measured: u64,
    delivered: u64,
    dropped: u64,
    latency_sum: u128,
    worst: Vec<Option<u64>>,
    left_in_window: u64,
}

impl Tally {
    fn observe(&mut self, now: u64, arrivals: &[Cell], out: &Outputs) {
        if self.window.contains(&now) {
            self.measured += arrivals.len() as u64;
            self.left_in_window += out.departures.len() as u64;
        }
        for cell in &out.departures {
            if self.window.contains(&cell.arrival) {
                let latency = now - cell.arrival;
                self.delivered += 1;
                self.latency_sum += u128::from(latency);
                let worst = &mut self.worst[usize::from(cell.dst)];
                *worst = Some(worst.map_or(latency, |w| w.max(latency)));
            }
        }
        for d in &out.drops {
            if self.window.contains(&d.cell.arrival) {
                self.dropped += 1;
            }
        }
    }

    fn outstanding(&self) -> u64 {
        self.measured - self.delivered - self.dropped
    }
}

/// A run's parameters, as the report repeats them.
struct Plan {
    config: FabricConfig,
    traffic: Traffic,
    load: f64,
    warmup_cycles: u64,
    cycles: u64,
    max_backlog: u64,
}

fn run<F: Fabric>(fabric: &mut F, gen: &mut TrafficGen, plan: Plan) -> Report {
    let Plan {
        warmup_cycles,
        cycles,
        max_backlog,
        ..
    } = plan;
    let ports = fabric.ports();
    let mut tally = Tally {
        window: warmup_cycles..warmup_cycles.saturating_add(cycles),
        measured: 0,
        delivered: 0,
        dropped: 0,
        latency_sum: 0,
        worst: vec![None; ports],
        left_in_window: 0,
    };
    let mut arrivals = Vec::with_capacity(ports);
    let mut out = Outputs::with_ports(ports);
    let mut saturated_at = None;
    for now in 0..warmup_cycles.saturating_add(cycles) {
        gen.generate(&mut arrivals);
        fabric
            .step(&arrivals, &mut out)
            .expect("the generator draws one cell per input to ports in range");
        tally.observe(now, &arrivals, &out);
        if fabric.counters().queued > max_backlog {
            saturated_at = Some(now);
            break;
        }
    }
    let mut drain_cycles = 0;
    while saturated_at.is_none() && tally.outstanding() > 0 {
        let now = fabric.now();
        fabric
            .step(&[], &mut out)
            .expect("an empty cycle is always valid");
        tally.observe(now, &[], &out);
        drain_cycles += 1;
        if out.departures.is_empty() {
            break; // stranded: with no arrivals nothing can move again
        }
    }
    let worst: Vec<u64> = tally.worst.iter().flatten().copied().collect();
    // A saturated run stopped with measured cells still queued: no latency or loss to give;
    // nor a latency when no measured cell left.
    let finished = saturated_at.is_none();
    let latencies = finished && tally.delivered > 0;
    let window_cycles_run = saturated_at.map_or(cycles, |s| (s + 1).saturating_sub(warmup_cycles));
    Report {
        config: plan.config,
        traffic: plan.traffic,
        load: plan.load,
        warmup_cycles,
        cycles,
        max_backlog,
        saturated_at,
        measured: tally.measured,
        delivered: tally.delivered,
        dropped: tally.dropped,
        stranded: if finished { tally.outstanding() } else { 0 },
        unfinished: if finished { 0 } else { tally.outstanding() },
        mean_latency: latencies.then(|| tally.latency_sum as f64 / tally.delivered as f64),
        avg_worst_latency: latencies.then(|| worst.iter().sum::<u64>() as f64 / worst.len() as f64),
        max_latency: worst.iter().copied().max().filter(|_| latencies),
        throughput: (window_cycles_run > 0)
            .then(|| tally.left_in_window as f64 / (ports as f64 * window_cycles_run as f64)),
        loss_ratio: (finished && tally.measured > 0)
            .then(|| tally.dropped as f64 / tally.measured as f64),
        drain_cycles,
        counters: fabric.counters().clone(),
    }
}

/// Runs `config` under `traffic` at input rate `load` for `warmup_cycles`, then measures
/// `cycles` (each at most [`MAX_CYCLES`]), then drains (see the module's doc). `seed` decides the traffic and the
/// scheduler's random choices, from separate streams: two architectures run with the same
/// seed see the same arrivals. A run whose backlog passes [`DEFAULT_MAX_BACKLOG`] cells
/// stops there and is reported saturated.
pub fn simulate(
    config: &FabricConfig,
    traffic: Traffic,
    load: f64,
    warmup_cycles: u64,
    cycles: u64,
    seed: u64,
) -> Result<Report, ConfigError> {
    simulate_bounded(
        config,
        traffic,
        load,
        warmup_cycles,
        cycles,
        seed,
        DEFAULT_MAX_BACKLOG,
    )
}

/// [`simulate`], with the run stopped and reported saturated once more than `max_backlog`
/// cells (at least 1) are queued in the fabric. `warmup_cycles` and `cycles` are each at
/// most [`MAX_CYCLES`].
pub fn simulate_bounded(
    config: &FabricConfig,
    traffic: Traffic,
    load: f64,
    warmup_cycles: u64,
    cycles: u64,
    seed: u64,
    max_backlog: u64,
) -> Result<Report, ConfigError> {
    if max_backlog == 0 {
        return Err(ConfigError::new(
            "max_backlog",
            "0 cells: the bound on a run's queued cells is at least 1",
        ));
    }
    for (setting, value) in [("warmup_cycles", warmup_cycles), ("cycles", cycles)] {
        if value > MAX_CYCLES {
            return Err(ConfigError::new(
                setting,
                format!("{value} cycles: a run takes at most {MAX_CYCLES} (10^10)"),
            ));
        }
    }
    let mut fabric = config.build(mix(seed ^ 0xFAB_5EED))?;
    let mut gen = TrafficGen::new(traffic, config.ports, load, mix(seed))?;
    let plan = Plan {
        config: *config,
        traffic,
        load,
        warmup_cycles,
        cycles,
        max_backlog,
    };
    // One match, then a loop monomorphised for the architecture.
    Ok(match &mut fabric {
        AnyFabric::Cprr(f) => run(f, &mut gen, plan),
        AnyFabric::OqXbar(f) => run(f, &mut gen, plan),
        AnyFabric::Voq(f) => run(f, &mut gen, plan),
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Architecture, Depth, Iterations, Scheduler};
    use super::*;

    /// With no cell delivered there is no latency to report, and with none measured no loss
    /// ratio: absent, not 0 as for a perfect switch.
    #[test]
    fn a_quiet_switch_has_no_latency() {
        let config = FabricConfig::new(Architecture::OqXbar, 4, Depth::Infinite);
        let r = simulate(&config, Traffic::Bernoulli, 0.0, 10, 100, 1).unwrap();
        assert_eq!((r.measured, r.delivered), (0, 0));
        assert_eq!(
            (r.mean_latency, r.avg_worst_latency, r.max_latency),
            (None, None, None)
        );
        // Nothing carried is a measurement (0 cells a cycle); a loss ratio of no cells is not.
        assert_eq!((r.throughput, r.loss_ratio), (Some(0.0), None));
        let r = simulate(&config, Traffic::Bernoulli, 0.05, 100, 1000, 1).unwrap();
        assert_eq!(r.measured, r.delivered);
        assert!(r.mean_latency.is_some_and(|l| l < 0.1));
        assert!(r.counters.conserved());
    }

    #[test]
    fn bad_runs_are_refused() {
        let config = FabricConfig::new(Architecture::OqXbar, 4, Depth::Infinite);
        let err = simulate(&config, Traffic::Bernoulli, 1.2, 0, 1, 1).unwrap_err();
        assert_eq!(err.setting, "load");
        let config = FabricConfig::new(Architecture::OqXbar, 100, Depth::Infinite);
        let err = simulate(&config, Traffic::Bernoulli, 0.5, 0, 1, 1).unwrap_err();
        assert_eq!(err.setting, "ports");
        let config = FabricConfig::new(Architecture::OqXbar, 4, Depth::Infinite);
        let err = simulate_bounded(&config, Traffic::Bernoulli, 0.5, 0, 1, 1, 0).unwrap_err();
        assert_eq!(err.setting, "max_backlog");
        // Runs too long to end are refused up front, not run for ever (or wrapped).
        for (warmup, cycles, setting) in [
            (0, u64::MAX, "cycles"),
            (0, MAX_CYCLES + 1, "cycles"),
            (u64::MAX, 1, "warmup_cycles"),
            (MAX_CYCLES + 1, 1, "warmup_cycles"),
        ] {
            let err = simulate(&config, Traffic::Bernoulli, 0.5, warmup, cycles, 1).unwrap_err();
            assert_eq!(err.setting, setting, "{err}");
            assert!(
                err.reason.contains(&cycles.max(warmup).to_string()),
                "{err}"
            );
        }
    }

    /// Above saturation with infinite FIFOs the backlog grows every cycle: the run stops
    /// once it passes the bound, with no more cells queued than the bound and one cycle's
    /// arrivals, and reports no latency or loss. Without the bound the same run would queue
    /// 7 cells a cycle and more, tens of thousands over its 5,200 cycles.
    #[test]
    fn a_saturated_run_stops_at_its_backlog_bound() {
        let rrm_1 = Architecture::Voq(Scheduler::Rrm, Iterations::One);
        let config = FabricConfig::new(rrm_1, 16, Depth::Infinite);
        let bound = 5_000;
        let r = simulate_bounded(&config, Traffic::Bernoulli, 0.99, 200, 5_000, 3, bound).unwrap();
        let stopped = r.saturated_at.expect("RRM-1 does not carry 0.99");
        assert!((200..5_200).contains(&stopped), "{r:?}");
        assert!(
            r.counters.queued > bound && r.counters.queued <= bound + 16,
            "{r:?}"
        );
        assert!(r.counters.conserved());
        // The measured cells it stopped with are counted, not lost from the report.
        assert!(r.unfinished > 0 && r.stranded == 0, "{r:?}");
        assert!(r.accounted(), "{r:?}");
        assert_eq!(r.drain_cycles, 0);
        assert_eq!(
            (r.mean_latency, r.avg_worst_latency, r.max_latency),
            (None, None, None)
        );
        assert_eq!(r.loss_ratio, None);
        // The carried load is still measured, over the window's cycles that ran.
        assert!(r.throughput.is_some_and(|t| t < 0.9), "{r:?}");
        // A bound passed in the warm-up leaves no window to measure.
        let r = simulate_bounded(&config, Traffic::Bernoulli, 0.99, 5_000, 5_000, 3, 100).unwrap();
        assert!(r.saturated_at.is_some_and(|s| s < 5_000), "{r:?}");
        assert_eq!((r.measured, r.throughput), (0, None));
        assert!(r.accounted());
        // A stable point runs to its end as before.
        let r = simulate_bounded(&config, Traffic::Bernoulli, 0.2, 1_000, 5_000, 3, 5_000).unwrap();
        assert_eq!(r.saturated_at, None);
        assert!(r.mean_latency.is_some() && r.loss_ratio == Some(0.0));
        assert_eq!(r.unfinished, 0);
        assert!(r.accounted());
    }
}
