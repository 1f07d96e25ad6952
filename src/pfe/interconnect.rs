//! A chassis' links through a switch fabric ([`ChassisBuilder::fabric`]): frames between
//! PFEs are cut into cells, cross a cycle-level [`crate::fabric`] model with whatever
//! contention it has, and are reassembled before they enter the far PFE.
//!
//! The fabric has one port per PFE (at least two): input `i` is PFE `i`'s side of the
//! fabric, output `j` leads into PFE `j`. One thread runs it:
//!
//! 1. A PPE thread's frame for a linked port goes into one channel with its far end
//!    ([`Crossing`]); `pending` counts it until it is injected at the far end or dropped,
//!    so [`super::Chassis::drain`] waits for it.
//! 2. The fabric thread cuts each frame into `ceil(len / cell_bytes)` cells in the queue of
//!    its input (the PFE's fabric interface, unbounded, as a PFE holds a frame it sends).
//! 3. Each cycle, each input offers its next cell, or with probability `background` a
//!    background cell to a uniformly chosen output; the fabric steps.
//! 4. A frame whose last cell leaves is injected into the far PFE. A frame that lost a cell
//!    at a full FIFO is dropped when its last cell is accounted for, and counted by reason.
//!    Through CPRR with finite FIFOs a drop can leave a frame's cell where the output
//!    arbiter will not read it until a later cell fills its row (§5.4); when the fabric
//!    stands still, no cell entering or leaving, for 10^6 cycles, the frames in it are
//!    dropped as `stranded`, so that a drain ends.
//! 5. Without background traffic the fabric runs cycles only while a frame's cells are in
//!    it, so fabric time is counted in cycles of work; an idle fabric waits for frames.
//!    With background traffic, it runs continuously, `cycles_per_us` cycles per
//!    microsecond of wall time (the fabric clock relative to packet time), and frames meet
//!    the background's contention.
//!
//! Order: a frame is delivered only once all its cells are out, and a frame that lost one is
//! dropped whole, so a delivered frame is always whole. Frames from one PFE to another arrive
//! in the order they were sent through the OQ-xbar and the VOQ crossbars (their queues are
//! FIFOs), and through CPRR while nothing drops, as with the default infinite FIFOs. Through
//! CPRR with finite FIFOs, once a cell (a frame's or a background cell) drops at a PFE's
//! output, a later frame to that PFE can overtake an earlier one from the same PFE: the
//! drop's hole desynchronises the output arbiter (`fabric::Cprr`'s doc, "Order"). The far
//! PFE's reorder engine does not repair it; it orders the frames as they enter.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use hashbrown::HashMap;
use parking_lot::Mutex;

use super::Pfe;
use crate::error::ConfigError;
use crate::fabric::{
    AnyFabric, Architecture, Cell, Depth, DropReason, Fabric, FabricConfig, Outputs,
};
use crate::packet::Port;
use crate::rng::SplitMix64;

/// The fabric a chassis' links cross ([`super::ChassisBuilder::fabric`]), and how it runs.
///
/// The fabric has one port per PFE (at least two). A frame for a linked port is cut into
/// `ceil(len / cell_bytes)` cells queued at its PFE's input; each cycle every input offers
/// its next cell (or, with probability `background`, a background cell to a random
/// output); a frame whose last cell leaves enters the far PFE, and a frame that lost a cell
/// at a full FIFO is dropped and counted ([`FabricStats`]); CPRR with finite FIFOs can,
/// after such a drop, deliver a PFE's frames out of order (see the module's doc). Without
/// background traffic
/// the fabric runs cycles only while frames are in it (time counted in cycles of work);
/// with background traffic it runs continuously at `cycles_per_us` cycles per microsecond
/// of wall time, so frames meet the background's contention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChassisFabric {
    /// The switch architecture.
    pub architecture: Architecture,
    /// The depth of each FIFO.
    pub depth: Depth,
    /// Bytes of a frame one cell carries.
    pub cell_bytes: usize,
    /// Background cells each input offers per cycle, uniformly to every output (0: none).
    pub background: f64,
    /// With background traffic: fabric cycles per microsecond of wall time.
    pub cycles_per_us: f64,
    /// Seed of the background traffic and of the scheduler's random choices.
    pub seed: u64,
}

impl Default for ChassisFabric {
    /// CPRR with infinite FIFOs, 64-byte cells, no background traffic (1000 cycles per µs
    /// when there is), seed 1.
    fn default() -> Self {
        ChassisFabric {
            architecture: Architecture::Cprr(crate::fabric::OutputArbiter::Simple),
            depth: Depth::Infinite,
            cell_bytes: 64,
            background: 0.0,
            cycles_per_us: 1000.0,
            seed: 1,
        }
    }
}

/// Most bytes one cell may carry.
pub const MAX_CELL_BYTES: usize = 1 << 16;

impl ChassisFabric {
    /// Checks the settings for a chassis of `pfes` PFEs, naming the one at fault
    /// (`ports` for too many PFEs, `depth`, `cell_bytes`, `background`, `cycles_per_us`).
    pub fn validate(&self, pfes: usize) -> Result<(), ConfigError> {
        FabricConfig::new(self.architecture, pfes.max(2), self.depth).validate()?;
        if self.cell_bytes == 0 || self.cell_bytes > MAX_CELL_BYTES {
            return Err(ConfigError::new(
                "cell_bytes",
                format!("cell_bytes {}: 1 to {MAX_CELL_BYTES}", self.cell_bytes),
            ));
        }
        if !(0.0..=1.0).contains(&self.background) {
            return Err(ConfigError::new(
                "background",
                format!(
                    "background {}: cells per input per cycle, in [0, 1]",
                    self.background
                ),
            ));
        }
        if !(self.cycles_per_us > 0.0 && self.cycles_per_us <= 1e6) {
            return Err(ConfigError::new(
                "cycles_per_us",
                format!("cycles_per_us {}: in (0, 10^6]", self.cycles_per_us),
            ));
        }
        Ok(())
    }
}

/// What the fabric of a chassis has done, since the chassis started.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FabricStats {
    /// Frames handed to the fabric: `frames_out + dropped() + frames_in_flight` at every
    /// snapshot ([`FabricStats::accounted`]).
    pub frames_in: u64,
    /// Frames that crossed it and entered their far PFE.
    pub frames_out: u64,
    /// Frames dropped, by reason (`queue_full`: a cell found its FIFO full; `stranded`: a
    /// cell stayed in a FIFO no arbiter would read again, §5.4's desynchronisation).
    pub frames_dropped: std::collections::BTreeMap<String, u64>,
    /// Frames with cells still at their input or in the fabric (0 once the chassis drained).
    pub frames_in_flight: u64,
    /// Cells of frames that entered the fabric.
    pub cells_in: u64,
    /// Background cells offered.
    pub background_cells: u64,
    /// Cycles the fabric ran.
    pub cycles: u64,
    /// Mean cycles from a delivered frame's first cell entering the fabric to its last cell
    /// leaving it (its wait at the input included); `None` when no frame was delivered (a
    /// mean of nothing, not 0 cycles).
    pub mean_frame_cycles: Option<f64>,
    /// The largest of those; `None` when no frame was delivered (not a frame of 0 cycles).
    pub max_frame_cycles: Option<u64>,
    /// The cycle the first frame's cells were queued at their input; `None` when no frame
    /// entered (cycle 0 is a cycle like any other).
    pub first_frame_cycle: Option<u64>,
    /// The cycle the last delivered frame's last cell left; `None` when no frame was
    /// delivered.
    pub last_frame_cycle: Option<u64>,
}

impl FabricStats {
    /// Cycles from the first frame entering the fabric to the last one leaving it: how long
    /// the traffic between the PFEs took, in fabric time; `None` when no frame was delivered.
    pub fn span_cycles(&self) -> Option<u64> {
        Some(
            self.last_frame_cycle?
                .saturating_sub(self.first_frame_cycle?),
        )
    }

    /// Frames dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.frames_dropped.values().sum()
    }

    /// Whether every frame handed to the fabric is accounted for: delivered, dropped or
    /// still in flight.
    pub fn accounted(&self) -> bool {
        self.frames_in == self.frames_out + self.dropped() + self.frames_in_flight
    }
}

/// A frame on its way to the far end of a link.
pub(super) struct Crossing {
    pub from: usize,
    pub to: usize,
    pub to_port: Port,
    pub frame: Vec<u8>,
}

/// A frame whose cells are in the fabric.
struct InFlight {
    to: usize,
    to_port: Port,
    frame: Vec<u8>,
    /// Cells not yet out or dropped.
    left: u32,
    lost: bool,
    /// The cycle its cells were queued at the input.
    queued_at: u64,
}

/// The tag of a background cell (frames take ids from 0 up).
const BACKGROUND: u64 = u64::MAX;
/// Cycles run between two looks at the channel.
const CYCLES_PER_ROUND: u64 = 256;
/// Cycles the fabric may stand still, with frames in it and no cell entering or leaving,
/// before those frames are given up as stranded: some 4,000 looks at the channel for a
/// frame that would release them.
const STRAND_AFTER: u64 = 1_000_000;

/// The fabric thread's state.
pub(super) struct FabricRunner {
    cfg: ChassisFabric,
    fabric: AnyFabric,
    inputs: Vec<VecDeque<Cell>>,
    frames: HashMap<u64, InFlight>,
    next_id: u64,
    rng: SplitMix64,
    arrivals: Vec<Cell>,
    out: Outputs,
    /// Frames to inject, per far PFE: (port, frame).
    ready: Vec<Vec<(Port, Vec<u8>)>>,
    stats: FabricStats,
    frame_cycles: u128,
    /// Cycles in a row in which the fabric stood still with a frame in it: no cell
    /// entered and none left. Nothing can move in such a cycle, nor in the next unless a
    /// cell enters: a frame's cell still in the fabric then waits for one (§5.4's
    /// desynchronised arbiter) and may never leave.
    idle: u64,
    /// Standing-still cycles after which the frames in the fabric are given up as stranded.
    strand_after: u64,
}

impl FabricRunner {
    /// The runner for a chassis of `pfes` PFEs (`cfg` validated).
    pub fn new(cfg: ChassisFabric, pfes: usize) -> Result<FabricRunner, ConfigError> {
        cfg.validate(pfes)?;
        let ports = pfes.max(2);
        let fabric = FabricConfig::new(cfg.architecture, ports, cfg.depth).build(cfg.seed)?;
        Ok(FabricRunner {
            cfg,
            fabric,
            inputs: vec![VecDeque::new(); ports],
            frames: HashMap::new(),
            next_id: 0,
            rng: SplitMix64::new(crate::rng::mix(cfg.seed ^ 0xBAC6)),
            arrivals: Vec::with_capacity(ports),
            out: Outputs::with_ports(ports),
            ready: vec![Vec::new(); pfes],
            stats: FabricStats::default(),
            frame_cycles: 0,
            idle: 0,
            strand_after: STRAND_AFTER,
        })
    }

    /// Cuts a frame into cells at its input.
    fn admit(&mut self, c: Crossing) {
        let cells = c.frame.len().div_ceil(self.cfg.cell_bytes).max(1) as u32;
        let id = self.next_id;
        self.next_id += 1;
        for _ in 0..cells {
            self.inputs[c.from].push_back(Cell::new(c.from as u16, c.to as u16, id));
        }
        if self.stats.first_frame_cycle.is_none() {
            self.stats.first_frame_cycle = Some(self.fabric.now());
        }
        self.stats.frames_in += 1;
        self.stats.cells_in += u64::from(cells);
        self.frames.insert(
            id,
            InFlight {
                to: c.to,
                to_port: c.to_port,
                frame: c.frame,
                left: cells,
                lost: false,
                queued_at: self.fabric.now(),
            },
        );
    }

    /// Runs one cycle; returns how many frames left the fabric for good (delivered or
    /// dropped).
    fn cycle(&mut self) -> u64 {
        self.arrivals.clear();
        let ports = self.inputs.len() as u64;
        for (i, q) in self.inputs.iter_mut().enumerate() {
            if let Some(c) = q.pop_front() {
                self.arrivals.push(c);
            } else if self.cfg.background > 0.0 && self.rng.uniform() < self.cfg.background {
                let dst = self.rng.below(ports) as u16;
                self.arrivals.push(Cell::new(i as u16, dst, BACKGROUND));
                self.stats.background_cells += 1;
            }
        }
        // Cells to outputs that exist, one per input: the fabric cannot refuse them.
        let _ = self.fabric.step(&self.arrivals, &mut self.out);
        self.stats.cycles += 1;
        let now = self.fabric.now();
        let mut finished = 0;
        for i in 0..self.out.departures.len() {
            let id = self.out.departures[i].tag;
            if id != BACKGROUND {
                finished += self.account(id, false, now);
            }
        }
        for i in 0..self.out.drops.len() {
            let d = self.out.drops[i];
            if d.cell.tag != BACKGROUND {
                debug_assert_eq!(d.reason, DropReason::QueueFull);
                finished += self.account(d.cell.tag, true, now);
            }
        }
        // A cycle in which no cell entered or left changes nothing, and with no cell entering
        // the next is the same: a frame's cell then sits in a FIFO its arbiter will not read
        // until a later write fills its row. After long enough, give its frame up rather
        // than hang a drain. A frame cell merely waiting behind others (background cells in
        // a long queue) is not stranded: cells leave meanwhile.
        self.idle = if self.arrivals.is_empty() && self.out.departures.is_empty() {
            self.idle + 1
        } else {
            0
        };
        if !self.frames.is_empty() && self.idle > self.strand_after {
            finished += self.give_up_stranded();
        }
        finished
    }

    /// One cell of frame `id` left (or was dropped); returns 1 if the frame is done with.
    fn account(&mut self, id: u64, dropped: bool, now: u64) -> u64 {
        let Some(f) = self.frames.get_mut(&id) else {
            return 0; // a frame given up as stranded
        };
        f.left -= 1;
        f.lost |= dropped;
        if f.left > 0 {
            return 0;
        }
        let f = self.frames.remove(&id).expect("looked up above");
        if f.lost {
            *self
                .stats
                .frames_dropped
                .entry(DropReason::QueueFull.name().to_string())
                .or_default() += 1;
        } else {
            let cycles = now - f.queued_at;
            self.frame_cycles += u128::from(cycles);
            self.stats.max_frame_cycles = Some(
                self.stats
                    .max_frame_cycles
                    .map_or(cycles, |m| m.max(cycles)),
            );
            self.stats.frames_out += 1;
            self.stats.last_frame_cycle = Some(now);
            self.ready[f.to].push((f.to_port, f.frame));
            return 0; // counted when injected
        }
        1
    }

    fn give_up_stranded(&mut self) -> u64 {
        let n = self.frames.len() as u64;
        self.frames.clear();
        *self
            .stats
            .frames_dropped
            .entry("stranded".to_string())
            .or_default() += n;
        self.idle = 0;
        n
    }

    /// Injects the frames that crossed; returns how many.
    fn deliver(&mut self, pfes: &[Arc<Pfe>]) -> u64 {
        let mut n = 0;
        for (to, ready) in self.ready.iter_mut().enumerate() {
            if ready.is_empty() {
                continue;
            }
            // The far PFE runs until the fabric thread has exited (the chassis stops it
            // first), so this cannot fail.
            let _ = pfes[to].inject_burst(ready.iter().map(|(p, f)| (*p, &f[..])));
            n += ready.len() as u64;
            ready.clear();
        }
        n
    }

    /// A snapshot of the counters.
    fn snapshot(&self) -> FabricStats {
        let mut s = self.stats.clone();
        s.frames_in_flight = self.frames.len() as u64;
        s.mean_frame_cycles =
            (s.frames_out > 0).then(|| self.frame_cycles as f64 / s.frames_out as f64);
        s
    }

    /// Whether a frame has cells in the fabric or at an input.
    fn busy(&self) -> bool {
        !self.frames.is_empty()
    }
}

/// The fabric thread: admits frames, runs cycles, delivers, until the chassis stops and
/// nothing is in flight.
pub(super) fn run(
    mut r: FabricRunner,
    rx: Receiver<Crossing>,
    pfes: Vec<Arc<Pfe>>,
    pending: Arc<AtomicU64>,
    stats: Arc<Mutex<FabricStats>>,
    stop: Arc<AtomicBool>,
) {
    let paced = r.cfg.background > 0.0;
    let start = Instant::now();
    loop {
        if !r.busy() && !paced {
            // Idle: wait for a frame (or the stop).
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(c) => r.admit(c),
                Err(RecvTimeoutError::Timeout) if !stop.load(Ordering::Acquire) => continue,
                Err(_) => break,
            }
        }
        for c in rx.try_iter().take(4096) {
            r.admit(c);
        }
        if paced && !r.busy() && stop.load(Ordering::Acquire) && rx.is_empty() {
            break;
        }
        let rounds = if paced {
            // Catch up with the wall clock, a round at most.
            let due = (start.elapsed().as_secs_f64() * 1e6 * r.cfg.cycles_per_us) as u64;
            due.saturating_sub(r.stats.cycles).min(CYCLES_PER_ROUND)
        } else {
            CYCLES_PER_ROUND
        };
        let mut gone = 0;
        for _ in 0..rounds {
            gone += r.cycle();
            if !paced && !r.busy() {
                break;
            }
        }
        gone += r.deliver(&pfes);
        // The counters first: once `pending` reaches 0 (a drain returns), they are final.
        *stats.lock() = r.snapshot();
        pending.fetch_sub(gone, Ordering::AcqRel);
        if paced && rounds == 0 {
            std::thread::yield_now();
        }
    }
    *stats.lock() = r.snapshot();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Iterations, OutputArbiter, Scheduler};

    fn crossing(from: usize, to: usize, len: usize) -> Crossing {
        Crossing {
            from,
            to,
            to_port: 7,
            frame: vec![from as u8; len],
        }
    }

    /// Runs cycles until every frame is out or dropped; returns the frames ready per PFE.
    fn settle(r: &mut FabricRunner) -> u64 {
        let mut gone = 0;
        for _ in 0..100_000 {
            if !r.busy() {
                break;
            }
            gone += r.cycle();
        }
        assert!(!r.busy(), "frames still in the fabric");
        gone + r.ready.iter().map(|x| x.len() as u64).sum::<u64>()
    }

    #[test]
    fn frames_are_cut_into_cells_and_come_out_whole_in_order() {
        for architecture in [
            Architecture::Cprr(OutputArbiter::Simple),
            Architecture::OqXbar,
            Architecture::Voq(Scheduler::Islip, Iterations::One),
            Architecture::Voq(Scheduler::Pim, Iterations::Log2),
        ] {
            let cfg = ChassisFabric {
                architecture,
                cell_bytes: 16,
                ..ChassisFabric::default()
            };
            let mut r = FabricRunner::new(cfg, 3).unwrap();
            // Two PFEs send to the third at once: contention at its output.
            for i in 0..20 {
                r.admit(crossing(0, 2, 64 + i));
                r.admit(crossing(1, 2, 100));
            }
            // Mid-way the counters add up with the frames still in flight.
            for _ in 0..30 {
                r.cycle();
                let s = r.snapshot();
                assert!(s.accounted() && s.frames_in_flight > 0, "{s:?}");
            }
            assert_eq!(settle(&mut r), 40);
            let s = r.snapshot();
            assert_eq!((s.frames_in, s.frames_out, s.dropped()), (40, 40, 0));
            assert_eq!(s.frames_in_flight, 0);
            assert!(s.accounted());
            // 64..84 bytes take 4 or 5 cells of 16; 100 bytes take 7.
            let want: u64 = (0..20).map(|i| (64 + i as u64).div_ceil(16)).sum::<u64>() + 20 * 7;
            assert_eq!(s.cells_in, want);
            let (max, span) = (s.max_frame_cycles.unwrap(), s.span_cycles().unwrap());
            assert!(
                max >= 7 && s.mean_frame_cycles.is_some_and(|m| m > 0.0),
                "{s:?}"
            );
            // The first frames entered at cycle 0: a cycle, not "none".
            assert_eq!(s.first_frame_cycle, Some(0), "{s:?}");
            // One output takes a cell a cycle: the span is at least every cell's cycle,
            // and at least the longest frame's time in the fabric.
            assert!(span >= want && span >= max, "{s:?}");
            // Each PFE's frames arrive whole and in the order they were sent.
            let from0: Vec<usize> = r.ready[2]
                .iter()
                .filter(|(_, f)| f[0] == 0)
                .map(|(_, f)| f.len())
                .collect();
            assert_eq!(from0, (64..84).collect::<Vec<_>>(), "{architecture}");
            assert!(r.ready[2].iter().all(|(p, _)| *p == 7));
        }
    }

    #[test]
    fn a_full_fifo_drops_the_whole_frame_and_counts_it() {
        let cfg = ChassisFabric {
            architecture: Architecture::OqXbar,
            depth: Depth::Finite(1),
            cell_bytes: 8,
            ..ChassisFabric::default()
        };
        // Two inputs at one output for 8 cycles: the output queue of 2 x 1 cells overflows.
        let mut r = FabricRunner::new(cfg, 2).unwrap();
        r.admit(crossing(0, 1, 64));
        r.admit(crossing(1, 1, 64));
        let gone = settle(&mut r);
        let s = r.snapshot();
        assert!(s.dropped() > 0, "{s:?}");
        assert_eq!(s.frames_dropped["queue_full"], s.dropped());
        assert_eq!(s.frames_out + s.dropped(), 2);
        assert_eq!(gone, 2, "every frame accounted for: delivered or dropped");
        assert_eq!(r.ready[1].len() as u64, s.frames_out);
    }

    /// Three PFEs send one-cell frames to a fourth in irregular bursts. Through CPRR with
    /// FIFOs of depth 1, cells drop, and a drop's hole lets a later frame of a PFE overtake an
    /// earlier one (`fabric::Cprr`'s doc, "Order"); with infinite FIFOs, or through the
    /// OQ-xbar whatever it drops, each PFE's frames arrive in the order sent.
    #[test]
    fn cprr_frames_keep_their_order_unless_a_cell_drops() {
        let cases = [
            (
                Architecture::Cprr(OutputArbiter::Simple),
                Depth::Finite(1),
                true,
            ),
            (
                Architecture::Cprr(OutputArbiter::Simple),
                Depth::Infinite,
                false,
            ),
            (Architecture::OqXbar, Depth::Finite(1), false),
        ];
        for (architecture, depth, reorders) in cases {
            let cfg = ChassisFabric {
                architecture,
                depth,
                ..ChassisFabric::default()
            };
            let mut r = FabricRunner::new(cfg, 4).unwrap();
            // Frame i from PFE `from` carries i; a few frames per PFE, then a few cycles.
            let mut i = 0u32;
            for round in 0..200u32 {
                for from in 0..3u32 {
                    for _ in 0..1 + (round * 7 + from * 3) % 5 {
                        let frame = [from.to_le_bytes(), i.to_le_bytes()].concat();
                        r.admit(Crossing {
                            from: from as usize,
                            to: 3,
                            to_port: 7,
                            frame,
                        });
                        i += 1;
                    }
                }
                for _ in 0..round % 9 {
                    r.cycle();
                }
            }
            settle(&mut r);
            let field =
                |f: &[u8], k: usize| u32::from_le_bytes([f[k], f[k + 1], f[k + 2], f[k + 3]]);
            let overtaken = (0..3u32)
                .map(|from| {
                    let sent: Vec<u32> = r.ready[3]
                        .iter()
                        .filter(|(_, f)| field(f, 0) == from)
                        .map(|(_, f)| field(f, 4))
                        .collect();
                    sent.windows(2).filter(|w| w[0] > w[1]).count()
                })
                .sum::<usize>();
            let s = r.snapshot();
            assert_eq!(
                s.dropped() > 0,
                depth != Depth::Infinite,
                "{architecture}: {s:?}"
            );
            assert_eq!(
                overtaken > 0,
                reorders,
                "{architecture} {depth:?}: {overtaken}"
            );
        }
    }

    /// A fabric that delivered nothing says so: no largest frame time, no first or last
    /// frame cycle, no span; not zeros that read as "a frame at cycle 0". A frame that
    /// entered but was dropped gives a first cycle and nothing else.
    #[test]
    fn nothing_delivered_reads_as_none_not_zero() {
        let cfg = ChassisFabric {
            architecture: Architecture::OqXbar,
            depth: Depth::Finite(1),
            cell_bytes: 8,
            ..ChassisFabric::default()
        };
        let r = FabricRunner::new(cfg, 2).unwrap();
        let s = r.snapshot();
        assert_eq!(
            (s.max_frame_cycles, s.first_frame_cycle, s.last_frame_cycle),
            (None, None, None)
        );
        assert_eq!((s.span_cycles(), s.mean_frame_cycles), (None, None));
        // Two long frames at one output of 2 x 1 places: both lose a cell.
        let mut r = FabricRunner::new(cfg, 2).unwrap();
        for _ in 0..3 {
            r.cycle();
        }
        r.admit(crossing(0, 1, 800));
        r.admit(crossing(1, 1, 800));
        settle(&mut r);
        let s = r.snapshot();
        assert_eq!((s.frames_in, s.frames_out, s.dropped()), (2, 0, 2), "{s:?}");
        assert_eq!(s.first_frame_cycle, Some(3), "{s:?}");
        assert_eq!((s.max_frame_cycles, s.last_frame_cycle), (None, None));
        assert_eq!(s.span_cycles(), None);
    }

    /// §5.4's desynchronisation strands a frame: through CPRR with FIFOs of depth 1, a drop
    /// leaves output 0's simple arbiter waiting at an empty FIFO while a later frame's cell
    /// sits in the other. With nothing entering, the fabric stands still; the runner gives
    /// that frame up as `stranded` (so a drain ends) and every frame is accounted for.
    #[test]
    fn a_frame_no_arbiter_will_read_is_given_up_as_stranded() {
        let cfg = ChassisFabric {
            architecture: Architecture::Cprr(OutputArbiter::Simple),
            depth: Depth::Finite(1),
            ..ChassisFabric::default()
        };
        let mut r = FabricRunner::new(cfg, 2).unwrap();
        r.strand_after = 50;
        let mut gone = 0;
        // The cycles of `fabric::Cprr`'s desynchronisation test, in one-cell frames.
        for _ in 0..2 {
            r.admit(crossing(0, 0, 10));
            r.admit(crossing(1, 0, 10));
            gone += r.cycle();
        }
        gone += r.cycle();
        r.admit(crossing(0, 0, 10));
        for _ in 0..200 {
            gone += r.cycle();
        }
        assert!(!r.busy(), "the stranded frame was given up");
        let s = r.snapshot();
        assert!(s.accounted() && s.frames_in_flight == 0, "{s:?}");
        assert_eq!(s.frames_dropped.get("stranded"), Some(&1), "{s:?}");
        assert_eq!(s.frames_dropped.get("queue_full"), Some(&1), "{s:?}");
        assert_eq!((s.frames_in, s.frames_out), (5, 3), "{s:?}");
        assert_eq!(gone, 2, "both dropped frames left the runner's books");
    }

    /// A frame's cell waiting behind background cells is not stranded, however long it
    /// waits: cells enter and leave meanwhile. (Before, a wait of `strand_after` cycles with
    /// the inputs empty gave the frame up, although it would have been delivered.)
    #[test]
    fn a_frame_waiting_behind_background_cells_is_not_given_up() {
        let cfg = ChassisFabric {
            architecture: Architecture::OqXbar,
            background: 1.0,
            seed: 5,
            ..ChassisFabric::default()
        };
        let mut r = FabricRunner::new(cfg, 8).unwrap();
        r.strand_after = 2;
        // Background alone (at the line rate: the queues wander up) builds the queues up,
        // then a frame joins the longest.
        for _ in 0..2_000 {
            r.cycle();
        }
        let AnyFabric::OqXbar(ref oq) = r.fabric else {
            unreachable!("an OQ-xbar configuration builds an OQ-xbar");
        };
        let to = (1..8).max_by_key(|&j| oq.queue_len(j)).expect("outputs");
        let ahead = oq.queue_len(to);
        assert!(ahead > 10, "a queue to wait in: {ahead}");
        r.admit(crossing(0, to, 10));
        settle(&mut r);
        let s = r.snapshot();
        assert_eq!((s.frames_out, s.dropped()), (1, 0), "{s:?}");
        assert!(s.max_frame_cycles.is_some_and(|c| c > 2), "{s:?}");
    }

    #[test]
    fn background_traffic_is_offered_and_never_delivered() {
        let cfg = ChassisFabric {
            background: 0.5,
            ..ChassisFabric::default()
        };
        let mut r = FabricRunner::new(cfg, 4).unwrap();
        r.admit(crossing(0, 3, 640));
        settle(&mut r);
        let s = r.snapshot();
        assert!(s.background_cells > 0);
        assert_eq!((s.frames_out, r.ready[3].len()), (1, 1));
        assert!(r.ready.iter().map(Vec::len).sum::<usize>() == 1);
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = |f: ChassisFabric| f.validate(3).unwrap_err().reason;
        let d = ChassisFabric::default();
        assert!(bad(ChassisFabric { cell_bytes: 0, ..d }).contains("cell_bytes"));
        assert!(bad(ChassisFabric {
            background: 1.5,
            ..d
        })
        .contains("background"));
        assert!(bad(ChassisFabric {
            background: f64::NAN,
            ..d
        })
        .contains("background"));
        assert!(bad(ChassisFabric {
            cycles_per_us: 0.0,
            ..d
        })
        .contains("cycles_per_us"));
        assert!(bad(ChassisFabric {
            depth: Depth::Finite(0),
            ..d
        })
        .contains("depth"));
        assert!(
            ChassisFabric::default().validate(65).is_err(),
            "more PFEs than ports"
        );
    }
}
