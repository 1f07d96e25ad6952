//! The output-queued crossbar (OQ-xbar) with speedup P, the ideal switch (§5.5, Figure 8).
//!
//! The crossbar and the queues run P times faster than the ports, so every cell of a cycle
//! reaches its output's queue at once, and each output sends one cell per cycle. The queue
//! of an output holds P x D cells, the buffer CPRR spreads over a group of P FIFOs of depth D.
//! Within one cycle the cells for one output are written in input order starting from the
//! input `now mod P`, a round-robin arbitration that decides who is dropped when the queue
//! is nearly full (§5.5: "as simple as a round-robin arbitration policy").

use super::queue::Fifo;
use super::{validate, Cell, Counters, Depth, DropReason, Dropped, Fabric, Outputs, StepError};

/// An OQ-xbar switch: see the module's doc.
#[derive(Clone, Debug)]
pub struct OqXbar {
    ports: usize,
    /// One queue per output.
    queues: Vec<Fifo>,
    /// Outputs whose queue holds a cell.
    busy: u64,
    /// The cycle's cells by input, reused each cycle.
    by_input: Vec<Option<Cell>>,
    counters: Counters,
    now: u64,
}

impl OqXbar {
    /// A `ports`-port OQ-xbar whose output queues hold `ports` x `depth` cells.
    pub(super) fn new(ports: usize, depth: Depth) -> Self {
        OqXbar {
            ports,
            queues: (0..ports).map(|_| Fifo::new(depth.times(ports))).collect(),
            busy: 0,
            by_input: vec![None; ports],
            counters: Counters::default(),
            now: 0,
        }
    }

    /// The cells in output `output`'s queue. Panics unless `output` is below P.
    pub fn queue_len(&self, output: usize) -> usize {
        self.queues[output].len()
    }

    fn enqueue(&mut self, cell: Cell, out: &mut Outputs) {
        let d = usize::from(cell.dst);
        match self.queues[d].push(cell) {
            Ok(()) => self.busy |= 1 << d,
            Err(cell) => {
                self.counters.drop_cell(DropReason::QueueFull);
                out.drops.push(Dropped {
                    cell,
                    reason: DropReason::QueueFull,
                });
            }
        }
    }
}

impl Fabric for OqXbar {
    common_accessors!();

    fn step(&mut self, arrivals: &[Cell], out: &mut Outputs) -> Result<(), StepError> {
        validate(self.ports, arrivals)?;
        out.clear();
        for &cell in arrivals {
            let mut cell = cell;
            cell.arrival = self.now;
            self.counters.enter();
            self.by_input[usize::from(cell.src)] = Some(cell);
        }
        if !arrivals.is_empty() {
            let first = (self.now % self.ports as u64) as usize;
            for i in (first..self.ports).chain(0..first) {
                if let Some(cell) = self.by_input[i].take() {
                    self.enqueue(cell, out);
                }
            }
        }
        let mut outputs = self.busy;
        while outputs != 0 {
            let d = outputs.trailing_zeros() as usize;
            outputs &= outputs - 1;
            let queue = &mut self.queues[d];
            if let Some(cell) = queue.pop() {
                if queue.is_empty() {
                    self.busy &= !(1 << d);
                }
                self.counters.leave();
                out.departures.push(cell);
            }
        }
        self.now += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cell_of_a_cycle_reaches_its_queue_and_one_leaves() {
        let mut s = OqXbar::new(4, Depth::Infinite);
        let mut out = Outputs::default();
        let all: Vec<Cell> = (0..4).map(|i| Cell::new(i, 3, u64::from(i))).collect();
        s.step(&all, &mut out).unwrap();
        assert_eq!(out.departures.len(), 1);
        assert_eq!(s.queue_len(3), 3);
        for _ in 0..3 {
            s.step(&[], &mut out).unwrap();
            assert_eq!(out.departures.len(), 1);
            assert!(out.departures[0].arrival == 0);
        }
        assert_eq!(s.counters().delivered, 4);
        assert!(s.counters().conserved());
    }

    #[test]
    fn the_queue_holds_p_times_d_and_the_rotation_picks_who_drops() {
        let mut s = OqXbar::new(2, Depth::Finite(1));
        let mut out = Outputs::default();
        let both = [Cell::new(0, 0, 0), Cell::new(1, 0, 1)];
        // Cycle 0: both fit (2 x 1), one leaves.
        s.step(&both, &mut out).unwrap();
        assert!(out.drops.is_empty());
        // Cycle 1: one place left; the rotation starts at input 1, so input 0's cell drops.
        s.step(&both, &mut out).unwrap();
        assert_eq!(out.drops.len(), 1);
        assert_eq!(out.drops[0].cell.src, 0);
        assert!(s.counters().conserved());
    }
}
