//! Hipernetch's combined parallel round-robin arbiter (CPRR), modelled functionally (§4, §5.4).
//!
//! The switch has P groups of P FIFOs, one group per output port. One cycle:
//!
//! 1. **Sorting network.** The up to P cells of the cycle, one per input lane, are sorted on
//!    `{valid, dest}` by Batcher's odd-even merge sort (§4.2), invalid lanes first, so that
//!    cells for one output end up consecutive. The network is run as the comparators of the
//!    real one (P rounded up to a power of two), each swapping only on a strictly greater
//!    key: so the order of same-destination cells within a cycle is the network's, which is
//!    not the input order (sorting networks are not stable, §5.5).
//! 2. **Offsets.** The adder trees count the cells per output, the prefix sum finds where
//!    each output's run starts; the barrel shifter rotates the run so that its j-th cell
//!    lands in FIFO `(offset[d] + j) mod P` of group d, and the offset counter advances by
//!    the run's length, whether or not the cells fit.
//! 3. **FIFOs.** A cell whose FIFO is full is dropped: the only place CPRR drops (§4.1).
//!    Its slot in the rotation is lost all the same, so the group's rows now have a hole.
//! 4. **Output arbiters.** Each output reads one cell from its group, round-robin. With the
//!    paper's simple arbiter ([`OutputArbiter::Simple`], §5.4) it looks only at the FIFO its
//!    index names and, if that FIFO is empty, waits: after a drop it can get out of step
//!    with the writes and leave cells waiting in other FIFOs until the row fills (§5.4's
//!    desynchronisation, kept in this model as in the paper's simulations). With
//!    [`OutputArbiter::RoundRobin`] (§5.4's workaround (d)) it takes the next non-empty FIFO.
//!
//! Without drops the two arbiters behave alike and the group is one FIFO written P cells a
//! cycle: the OQ-xbar, up to the order within a cycle (§5.5, equations 5-6).
//!
//! # Order
//!
//! An input sends at most one cell a cycle, so the order within a cycle never puts two cells
//! of one flow (one input, one output) out of order, and until its group's first drop an
//! output sends each flow's cells in the order they arrived. A drop breaks that: the arbiter
//! reads FIFOs by position, and from the hole's FIFO it takes the cell written P positions
//! later (the simple arbiter waits for it if need be), which leaves before the cells written
//! between; with either arbiter, a later cell of a flow can overtake an earlier one at that
//! output from then on. So per-flow order holds with infinite FIFOs, and with
//! finite ones at an output that has dropped nothing; `tests/fabric.rs` checks both, and
//! that drops do reorder. (The OQ-xbar and the VOQ crossbars keep it always: their queues
//! are FIFOs.)
//!
//! # Loss (§5.5)
//!
//! The cells of one cycle for one output go to distinct FIFOs, so none is dropped while
//! every FIFO of the group has room. §5.5 argues more: that the free places of a group are
//! always consecutive and even, so that P free places anywhere suffice; from which CPRR
//! loses no more than an OQ-xbar with P fewer places per output. The first part holds only
//! until the group's first drop: the hole a dropped cell leaves unbalances the FIFOs, and
//! this model sees a few later drops (about 0.5% of them under saturation, either arbiter)
//! with P or more places free. The loss bound itself held in every run tried
//! (`tests/fabric.rs` checks both).

use super::queue::Fifo;
use super::{next_at_or_after, validate, Depth, MAX_PORTS};
use super::{Cell, Counters, DropReason, Dropped, Fabric, Outputs, StepError};

/// How an output port's arbiter picks the FIFO of its group to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum OutputArbiter {
    /// §5.4's simpler arbiter: read the FIFO at the arbiter's index if it holds a cell (and
    /// move the index on), else wait. The paper's choice, desynchronisation included.
    Simple,
    /// A regular round-robin arbiter: the next non-empty FIFO at or after the index
    /// (§5.4's workaround (d)); never waits while the group holds a cell.
    RoundRobin,
}

/// Bits of a lane's value that hold its input (the key above them).
const LANE_BITS: u32 = 6;
const LANE_MASK: u16 = (1 << LANE_BITS) - 1;

/// Comparators in the largest network, Batcher's for 64 lanes.
const MAX_COMPARATORS: usize = 543;

/// The comparators of Batcher's odd-even merge sort over `width` lanes (a power of two, at
/// most 64), in the order the pipeline applies them: the first `.1` of the array.
const fn odd_even_merge_sort(width: usize) -> ([(u8, u8); MAX_COMPARATORS], usize) {
    let mut net = [(0u8, 0u8); MAX_COMPARATORS];
    let mut n = 0;
    let mut p = 1;
    while p < width {
        let mut k = p;
        while k >= 1 {
            let mut j = k % p;
            while j + k < width {
                let end = if k < width - j - k { k } else { width - j - k };
                let mut i = 0;
                while i < end {
                    if (i + j) / (2 * p) == (i + j + k) / (2 * p) {
                        // Lanes are below 64, so they fit a byte.
                        net[n] = ((i + j) as u8, (i + j + k) as u8);
                        n += 1;
                    }
                    i += 1;
                }
                j += 2 * k;
            }
            k /= 2;
        }
        p *= 2;
    }
    (net, n)
}

/// The network over `W` lanes, built at compile time so that the compiler sees its
/// comparators as constants (and keeps a small one's lanes in registers).
struct Network<const W: usize>;

impl<const W: usize> Network<W> {
    const COMPARATORS: ([(u8, u8); MAX_COMPARATORS], usize) = odd_even_merge_sort(W);

    /// Runs the comparators over the first `W` lanes. Each compare-and-swap looks at the
    /// keys only and swaps on a strictly greater one, as the hardware's CAS units do;
    /// branch-free, because the keys are random and a branch would mispredict half the time.
    fn sort(lanes: &mut [u16; MAX_PORTS]) {
        let (net, n) = &Self::COMPARATORS;
        let mut l = [0u16; W];
        l.copy_from_slice(&lanes[..W]);
        for &(a, b) in &net[..*n] {
            let (a, b) = (usize::from(a) % W, usize::from(b) % W);
            let (x, y) = (u32::from(l[a]), u32::from(l[b]));
            let mask = 0u32.wrapping_sub(u32::from(x >> LANE_BITS > y >> LANE_BITS));
            let t = (x ^ y) & mask;
            l[a] = (x ^ t) as u16;
            l[b] = (y ^ t) as u16;
        }
        lanes[..W].copy_from_slice(&l);
    }
}

/// Sorts the first `width` lanes (a power of two, 2..=64) with Batcher's network.
fn sort(lanes: &mut [u16; MAX_PORTS], width: usize) {
    match width {
        2 => Network::<2>::sort(lanes),
        4 => Network::<4>::sort(lanes),
        8 => Network::<8>::sort(lanes),
        16 => Network::<16>::sort(lanes),
        32 => Network::<32>::sort(lanes),
        _ => Network::<64>::sort(lanes),
    }
}

/// A CPRR switch: see the module's doc.
#[derive(Clone, Debug)]
pub struct Cprr {
    ports: usize,
    arbiter: OutputArbiter,
    /// FIFO `q` of output `d`'s group at `d * ports + q`.
    fifos: Vec<Fifo>,
    /// Per output: the offset counter, the FIFO its next cell is written to.
    offset: Vec<usize>,
    /// Per output: the arbiter's index, the FIFO it reads next.
    index: Vec<usize>,
    /// Per output: bit `q` set while FIFO `q` of its group holds a cell.
    occupied: Vec<u64>,
    /// Outputs whose group holds a cell.
    busy: u64,
    /// The sorting network's lanes, P rounded up to a power of two.
    network_width: usize,
    /// The network's lanes, reused each cycle: `key << LANE_BITS | input`, key 0 for an
    /// empty lane and `1 + dest` for a cell, so empty lanes sort first as in the hardware.
    /// The comparators look at the key only; the input rides along to find the cell.
    lanes: [u16; MAX_PORTS],
    /// The cycle's cells by input.
    by_input: Vec<Cell>,
    counters: Counters,
    now: u64,
}

impl Cprr {
    /// A `ports`-port CPRR with FIFOs of `depth` (the configuration is checked by
    /// [`FabricConfig::build`](super::FabricConfig::build)).
    pub(super) fn new(ports: usize, depth: Depth, arbiter: OutputArbiter) -> Self {
        let width = ports.next_power_of_two();
        Cprr {
            ports,
            arbiter,
            fifos: (0..ports * ports).map(|_| Fifo::new(depth)).collect(),
            offset: vec![0; ports],
            index: vec![0; ports],
            occupied: vec![0; ports],
            busy: 0,
            network_width: width,
            lanes: [0; MAX_PORTS],
            by_input: vec![Cell::new(0, 0, 0); ports],
            counters: Counters::default(),
            now: 0,
        }
    }

    /// The cells in FIFO `fifo` of output `output`'s group. Panics unless both are below P.
    pub fn fifo_len(&self, output: usize, fifo: usize) -> usize {
        self.fifos[output * self.ports + fifo].len()
    }

    /// Free slots in output `output`'s group (saturating at `usize::MAX` when infinite).
    /// Panics unless `output` is below P.
    pub fn group_room(&self, output: usize) -> usize {
        let group = &self.fifos[output * self.ports..(output + 1) * self.ports];
        group.iter().fold(0usize, |n, f| n.saturating_add(f.room()))
    }

    /// The offset counter of output `output`: the FIFO its next cell is written to. Panics
    /// unless `output` is below P.
    pub fn offset(&self, output: usize) -> usize {
        self.offset[output]
    }

    /// The output arbiter's index for `output`: the FIFO it reads next. Panics unless
    /// `output` is below P.
    pub fn arbiter_index(&self, output: usize) -> usize {
        self.index[output]
    }

    /// Steps 1-3: sort the cycle's cells, rotate each output's run onto its FIFOs.
    fn enqueue(&mut self, arrivals: &[Cell], out: &mut Outputs) {
        if arrivals.is_empty() {
            return;
        }
        for (i, lane) in self.lanes[..self.network_width].iter_mut().enumerate() {
            *lane = i as u16;
        }
        let mut dsts = 0u64;
        for &cell in arrivals {
            let mut cell = cell;
            cell.arrival = self.now;
            let i = usize::from(cell.src);
            self.lanes[i] = (1 + cell.dst) << LANE_BITS | cell.src;
            self.by_input[i] = cell;
            dsts |= 1 << cell.dst;
            self.counters.enter();
        }
        // The network's order matters only between cells for one output: with none such,
        // every run is one cell long and any order writes the same FIFOs.
        let shared = dsts.count_ones() as usize != arrivals.len();
        if shared {
            sort(&mut self.lanes, self.network_width);
        }
        let p = self.ports;
        // Walk the sorted lanes: the runs of one destination, each rotated by its offset.
        let mut run_dst = usize::MAX;
        let mut slot = 0;
        for &lane in &self.lanes[..self.network_width] {
            if lane >> LANE_BITS == 0 {
                continue;
            }
            let cell = self.by_input[usize::from(lane & LANE_MASK)];
            let d = usize::from(cell.dst);
            if d != run_dst {
                run_dst = d;
                slot = self.offset[d];
            }
            let q = slot;
            slot = if slot + 1 == p { 0 } else { slot + 1 };
            self.offset[d] = slot;
            match self.fifos[d * p + q].push(cell) {
                Ok(()) => {
                    self.occupied[d] |= 1 << q;
                    self.busy |= 1 << d;
                }
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

    /// Step 4: each output's arbiter reads at most one cell.
    fn dequeue(&mut self, out: &mut Outputs) {
        let p = self.ports;
        let mut outputs = self.busy;
        while outputs != 0 {
            let d = outputs.trailing_zeros() as usize;
            outputs &= outputs - 1;
            let q = match self.arbiter {
                OutputArbiter::Simple => {
                    let q = self.index[d];
                    if self.occupied[d] & (1 << q) == 0 {
                        continue; // desynchronised: wait for this FIFO
                    }
                    q
                }
                OutputArbiter::RoundRobin => {
                    match next_at_or_after(self.occupied[d], self.index[d]) {
                        Some(q) => q,
                        None => continue,
                    }
                }
            };
            self.index[d] = if q + 1 == p { 0 } else { q + 1 };
            let fifo = &mut self.fifos[d * p + q];
            if let Some(cell) = fifo.pop() {
                if fifo.is_empty() {
                    self.occupied[d] &= !(1 << q);
                    if self.occupied[d] == 0 {
                        self.busy &= !(1 << d);
                    }
                }
                self.counters.leave();
                out.departures.push(cell);
            }
        }
    }
}

impl Fabric for Cprr {
    common_accessors!();

    fn step(&mut self, arrivals: &[Cell], out: &mut Outputs) -> Result<(), StepError> {
        validate(self.ports, arrivals)?;
        out.clear();
        self.enqueue(arrivals, out);
        self.dequeue(out);
        self.now += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 0/1 input of `width` lanes comes out sorted (the 0-1 principle: then every
    /// input does), and the comparator count is Batcher's.
    #[test]
    fn the_network_sorts() {
        for (width, comparators) in [(2, 1), (4, 5), (8, 19), (16, 63), (32, 191), (64, 543)] {
            let (net, n) = odd_even_merge_sort(width);
            assert_eq!(n, comparators, "width {width}");
            if width > 16 {
                continue; // 2^width inputs is too many to try
            }
            let net = &net[..n];
            for bits in 0u32..(1 << width) {
                let mut v: Vec<u32> = (0..width).map(|i| (bits >> i) & 1).collect();
                for &(a, b) in net {
                    let (a, b) = (usize::from(a), usize::from(b));
                    if v[a] > v[b] {
                        v.swap(a, b);
                    }
                }
                assert!(v.windows(2).all(|w| w[0] <= w[1]), "width {width}: {v:?}");
            }
        }
    }

    fn cprr(ports: usize, depth: Depth, arbiter: OutputArbiter) -> Cprr {
        Cprr::new(ports, depth, arbiter)
    }

    /// Figure 3's effect: the cells of one output are spread round-robin over its P FIFOs,
    /// across cycles, by the offset counter.
    #[test]
    fn writes_rotate_across_the_group() {
        let mut s = cprr(4, Depth::Infinite, OutputArbiter::Simple);
        let mut out = Outputs::default();
        // Three cells to output 2, then two: FIFOs 0,1,2 then 3,0.
        let a = [Cell::new(0, 2, 0), Cell::new(1, 2, 1), Cell::new(3, 2, 2)];
        s.enqueue(&a, &mut out);
        assert_eq!(
            (0..4).map(|q| s.fifo_len(2, q)).collect::<Vec<_>>(),
            [1, 1, 1, 0]
        );
        assert_eq!(s.offset(2), 3);
        s.enqueue(&[Cell::new(0, 2, 3), Cell::new(2, 2, 4)], &mut out);
        assert_eq!(
            (0..4).map(|q| s.fifo_len(2, q)).collect::<Vec<_>>(),
            [2, 1, 1, 1]
        );
        assert_eq!(s.offset(2), 1);
        assert!(out.drops.is_empty());
    }

    /// The sorting network, not the input order, decides the order within a cycle: cells
    /// from inputs 0, 1 and 3 to one output leave as 1, 0, 3 (a stable sort keeps 0, 1, 3).
    #[test]
    fn the_order_within_a_cycle_is_the_networks() {
        let mut s = cprr(4, Depth::Infinite, OutputArbiter::Simple);
        let mut out = Outputs::default();
        let cells = [Cell::new(0, 0, 0), Cell::new(1, 0, 1), Cell::new(3, 0, 3)];
        s.step(&cells, &mut out).unwrap();
        let mut order: Vec<u64> = out.departures.iter().map(|c| c.tag).collect();
        for _ in 0..2 {
            s.step(&[], &mut out).unwrap();
            order.extend(out.departures.iter().map(|c| c.tag));
        }
        assert_eq!(order, [1, 0, 3]);
    }

    /// §5.4: a drop leaves a hole in the rotation, and the simple arbiter then waits at the
    /// empty FIFO while a cell sits in the other one; the round-robin arbiter takes it. The
    /// simple arbiter then reads the next write first: two cells of one flow (input 0 to
    /// output 0) leave in the wrong order.
    #[test]
    fn a_drop_desynchronises_the_simple_arbiter() {
        for arbiter in [OutputArbiter::Simple, OutputArbiter::RoundRobin] {
            let mut s = cprr(2, Depth::Finite(1), arbiter);
            let mut out = Outputs::default();
            let two = [Cell::new(0, 0, 0), Cell::new(1, 0, 1)];
            // Cycle 0: both FIFOs filled (write positions 0, 1); FIFO 0 is read.
            s.step(&two, &mut out).unwrap();
            // Cycle 1: positions 2 (FIFO 0) and 3 (FIFO 1, still full: dropped); FIFO 1 read.
            s.step(&two, &mut out).unwrap();
            assert_eq!((out.drops.len(), out.departures.len()), (1, 1));
            // Cycle 2: FIFO 0 read (position 2); the arbiter now expects position 3 in
            // FIFO 1, which was dropped.
            s.step(&[], &mut out).unwrap();
            assert_eq!(out.departures.len(), 1);
            assert_eq!((s.offset(0), s.arbiter_index(0)), (0, 1));
            // Cycle 3: one cell, position 4, written to FIFO 0.
            s.step(&[Cell::new(0, 0, 9)], &mut out).unwrap();
            match arbiter {
                OutputArbiter::Simple => {
                    assert!(out.departures.is_empty(), "waits at the empty FIFO 1");
                    s.step(&[], &mut out).unwrap();
                    assert!(out.departures.is_empty(), "and keeps waiting");
                    assert_eq!(s.counters().queued, 1);
                    // The next write, the same flow's, fills FIFO 1; the arbiter takes it,
                    // then FIFO 0's: cell 10 overtakes cell 9.
                    s.step(&[Cell::new(0, 0, 10)], &mut out).unwrap();
                    assert_eq!(out.departures[0].tag, 10);
                    s.step(&[], &mut out).unwrap();
                    assert_eq!(out.departures[0].tag, 9);
                }
                OutputArbiter::RoundRobin => assert_eq!(out.departures[0].tag, 9),
            }
            assert!(s.counters().conserved());
        }
    }
}
