//! The input-queued crossbar with virtual output queues (VOQ) and its schedulers (§2.1,
//! §2.3, §6.1).
//!
//! Input `i` keeps one FIFO per output, VOQ(i, j), of depth D (P x P FIFOs, as CPRR). Each
//! cycle the arriving cells join their VOQs (a full VOQ drops), then a [`Scheduler`] finds a
//! matching between inputs and outputs, each input and each output in at most one pair, and
//! every matched input sends the head of VOQ(i, j) across the crossbar. The schedulers run
//! one iteration ("-1") or log2(P) ([`Iterations`]); each iteration after the first only
//! adds pairs between inputs and outputs still unmatched.
//!
//! Request sets are bitmasks, one `u64` per input (the outputs it holds cells for) and per
//! output (the inputs holding cells for it); a round-robin pick from a pointer is a mask and
//! a `trailing_zeros`.
//!
//! The schedulers, with their original papers' rules:
//!
//! - **PIM**, parallel iterative matching (Anderson, Owicki, Saxe & Thacker, "High-speed
//!   switch scheduling for local-area networks", ACM TOCS 11(4), 1993). *Request*: every
//!   unmatched input requests every output it has a cell for. *Grant*: every unmatched output
//!   grants one request, uniformly at random. *Accept*: every input accepts one grant,
//!   uniformly at random. One iteration matches about 1 - 1/e = 63% under saturation.
//! - **RRM**, round-robin matching (McKeown, "The iSLIP scheduling algorithm for
//!   input-queued switches", IEEE/ACM ToN 7(2), 1999, §II). As PIM, but each output grants
//!   the next requesting input at or after its grant pointer `g`, and each input accepts the
//!   next granting output at or after its accept pointer `a`; `g` moves one past the granted
//!   input *whether or not the grant is accepted*, `a` one past the accepted output. The
//!   pointers synchronise and one iteration saturates near 63%; pushed beyond that with
//!   infinite VOQs, every VOQ fills, the grant pointers move in lockstep and RRM-1 carries
//!   less still (about 0.3 on 16 ports at r = 0.9-0.99 here; 1/P once all are backlogged). In
//!   iterations after the first the pointers move the same way (the iterative RRM of Chao &
//!   Liu's text).
//! - **iSLIP** (McKeown 1999, §III): as RRM, but `g` moves one past the granted input
//!   *only if the grant is accepted*, and the pointers move only in the first iteration.
//!   The pointers desynchronise and one iteration reaches 100% under uniform Bernoulli.
//! - **DRRM**, dual round-robin matching (Chao & Park, Globecom 1998; Li, Panwar & Chao,
//!   "On the performance of a dual round-robin switch", INFOCOM 2001). *Request*: every
//!   unmatched input sends one request, to the next output at or after its request pointer
//!   `r` that it holds a cell for (and that is unmatched). *Grant*: every output grants the
//!   next requesting input at or after `g`; a grant is a match (an input made one request).
//!   `r` moves one past the output if the request is granted, and to the requested output
//!   (it "remains at that nonempty VOQ") if not; `g` moves one past the granted input; in
//!   the first iteration only.
//! - **EDRRM**, DRRM with exhaustive service (Li, Panwar & Chao, "The dual round-robin
//!   matching switch with exhaustive service", HPSR 2002). As DRRM, but an input keeps its
//!   request pointer on the output it was just served for as long as that VOQ still holds
//!   cells (it moves one past the output if the request was not granted, or if the cell sent
//!   emptied the VOQ), and an output's grant pointer stays *on* the input it granted, so a
//!   matched pair stays matched until the VOQ empties. First iteration only, as DRRM.

use super::queue::Fifo;
use super::{next_at_or_after, validate};
use super::{Cell, Counters, Depth, DropReason, Dropped, Fabric, Outputs, StepError};
use crate::rng::SplitMix64;

/// A VOQ crossbar's matching algorithm: see the module's doc for each one's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Scheduler {
    /// Parallel iterative matching: random grants and accepts.
    Pim,
    /// Round-robin matching: pointers move on every grant.
    Rrm,
    /// iSLIP: grant pointers move only on accepted grants, in the first iteration.
    Islip,
    /// Dual round-robin matching: one request per input.
    Drrm,
    /// DRRM with exhaustive service: a pair stays matched until its VOQ empties.
    Edrrm,
}

impl Scheduler {
    /// Every scheduler, in the paper's order.
    pub const ALL: [Scheduler; 5] = [
        Scheduler::Pim,
        Scheduler::Rrm,
        Scheduler::Islip,
        Scheduler::Drrm,
        Scheduler::Edrrm,
    ];

    /// Its name as the paper spells it.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Pim => "PIM",
            Scheduler::Rrm => "RRM",
            Scheduler::Islip => "iSLIP",
            Scheduler::Drrm => "DRRM",
            Scheduler::Edrrm => "EDRRM",
        }
    }
}

/// How many iterations a scheduler runs per cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Iterations {
    /// One (the paper's "-1" variants).
    One,
    /// log2(P), rounded up (§6.1's multi-iteration variants).
    Log2,
}

impl Iterations {
    /// The count for a `ports`-port switch.
    pub fn count(self, ports: usize) -> usize {
        match self {
            Iterations::One => 1,
            Iterations::Log2 => (ports.next_power_of_two().trailing_zeros() as usize).max(1),
        }
    }
}

/// A uniformly random member of the non-empty `set`.
fn random_member(set: u64, rng: &mut SplitMix64) -> usize {
    let mut k = rng.below(u64::from(set.count_ones()));
    let mut s = set;
    while k > 0 {
        s &= s - 1;
        k -= 1;
    }
    s.trailing_zeros() as usize
}

#[inline]
fn one_past(x: usize, ports: usize) -> usize {
    if x + 1 == ports {
        0
    } else {
        x + 1
    }
}

/// A VOQ input-queued crossbar: see the module's doc.
#[derive(Clone, Debug)]
pub struct Voq {
    ports: usize,
    scheduler: Scheduler,
    iterations: usize,
    /// VOQ(i, j) at `i * ports + j`.
    voqs: Vec<Fifo>,
    /// Per input: the outputs it holds cells for.
    requests_of_input: Vec<u64>,
    /// Per output: the inputs holding cells for it.
    requests_for_output: Vec<u64>,
    /// Per output: the grant pointer `g`.
    grant_ptr: Vec<usize>,
    /// Per input: the accept pointer `a` (PIM, RRM, iSLIP) or request pointer `r` (DRRM,
    /// EDRRM).
    input_ptr: Vec<usize>,
    /// Scratch per input, reused each iteration: the outputs that granted it (PIM, RRM,
    /// iSLIP) or, per output, the inputs that requested it (DRRM, EDRRM).
    scratch: Vec<u64>,
    /// The cycle's matching: per input, its output.
    matched: Vec<usize>,
    rng: SplitMix64,
    counters: Counters,
    now: u64,
}

/// A matching being built: who is still free.
struct Free {
    inputs: u64,
    outputs: u64,
}

impl Voq {
    /// A `ports`-port VOQ crossbar with VOQs of `depth`, PIM's choices drawn from `seed`.
    pub(super) fn new(
        ports: usize,
        depth: Depth,
        scheduler: Scheduler,
        iterations: Iterations,
        seed: u64,
    ) -> Self {
        Voq {
            ports,
            scheduler,
            iterations: iterations.count(ports),
            voqs: (0..ports * ports).map(|_| Fifo::new(depth)).collect(),
            requests_of_input: vec![0; ports],
            requests_for_output: vec![0; ports],
            grant_ptr: vec![0; ports],
            input_ptr: vec![0; ports],
            scratch: vec![0; ports],
            matched: vec![usize::MAX; ports],
            rng: SplitMix64::new(seed),
            counters: Counters::default(),
            now: 0,
        }
    }

    /// The cells in VOQ(`input`, `output`). Panics unless both are below P.
    pub fn voq_len(&self, input: usize, output: usize) -> usize {
        self.voqs[input * self.ports + output].len()
    }

    fn enqueue(&mut self, cell: Cell, out: &mut Outputs) {
        let (i, j) = (usize::from(cell.src), usize::from(cell.dst));
        match self.voqs[i * self.ports + j].push(cell) {
            Ok(()) => {
                self.requests_of_input[i] |= 1 << j;
                self.requests_for_output[j] |= 1 << i;
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

    fn pair(&mut self, free: &mut Free, i: usize, j: usize) {
        self.matched[i] = j;
        free.inputs &= !(1 << i);
        free.outputs &= !(1 << j);
    }

    /// One request-grant-accept iteration of PIM, RRM or iSLIP (`first`: the first of
    /// the cycle, where iSLIP moves its pointers).
    fn request_grant_accept(&mut self, free: &mut Free, first: bool) {
        let p = self.ports;
        let mut granted_inputs = 0u64;
        // Grant: each free output with requests from free inputs picks one.
        let mut outputs = free.outputs;
        while outputs != 0 {
            let j = outputs.trailing_zeros() as usize;
            outputs &= outputs - 1;
            let requests = self.requests_for_output[j] & free.inputs;
            if requests == 0 {
                continue;
            }
            let i = match self.scheduler {
                Scheduler::Pim => random_member(requests, &mut self.rng),
                _ => next_at_or_after(requests, self.grant_ptr[j]).unwrap_or(0),
            };
            if self.scheduler == Scheduler::Rrm {
                self.grant_ptr[j] = one_past(i, p);
            }
            if granted_inputs & (1 << i) == 0 {
                self.scratch[i] = 0;
                granted_inputs |= 1 << i;
            }
            self.scratch[i] |= 1 << j;
        }
        // Accept: each granted input picks one grant.
        while granted_inputs != 0 {
            let i = granted_inputs.trailing_zeros() as usize;
            granted_inputs &= granted_inputs - 1;
            let grants = self.scratch[i];
            let j = match self.scheduler {
                Scheduler::Pim => random_member(grants, &mut self.rng),
                _ => next_at_or_after(grants, self.input_ptr[i]).unwrap_or(0),
            };
            match self.scheduler {
                Scheduler::Rrm => self.input_ptr[i] = one_past(j, p),
                Scheduler::Islip if first => {
                    self.input_ptr[i] = one_past(j, p);
                    self.grant_ptr[j] = one_past(i, p);
                }
                _ => {}
            }
            self.pair(free, i, j);
        }
    }

    /// One request-grant iteration of DRRM or EDRRM.
    fn request_grant(&mut self, free: &mut Free, first: bool) {
        let p = self.ports;
        let exhaustive = self.scheduler == Scheduler::Edrrm;
        // Request: each free input sends one request; `scratch[j]` gathers output j's.
        let mut requesting_outputs = 0u64;
        let mut requested = [usize::MAX; super::MAX_PORTS];
        let mut inputs = free.inputs;
        while inputs != 0 {
            let i = inputs.trailing_zeros() as usize;
            inputs &= inputs - 1;
            let Some(j) =
                next_at_or_after(self.requests_of_input[i] & free.outputs, self.input_ptr[i])
            else {
                continue;
            };
            requested[i] = j;
            if requesting_outputs & (1 << j) == 0 {
                self.scratch[j] = 0;
                requesting_outputs |= 1 << j;
            }
            self.scratch[j] |= 1 << i;
        }
        // Grant: each requested output grants one; a grant is a match.
        while requesting_outputs != 0 {
            let j = requesting_outputs.trailing_zeros() as usize;
            requesting_outputs &= requesting_outputs - 1;
            let i = next_at_or_after(self.scratch[j], self.grant_ptr[j]).unwrap_or(0);
            if first {
                self.grant_ptr[j] = if exhaustive { i } else { one_past(i, p) };
            }
            self.pair(free, i, j);
        }
        if !first {
            return;
        }
        // Request pointers, now that the grants are known.
        for (i, &j) in requested.iter().enumerate().take(p) {
            if j == usize::MAX {
                continue;
            }
            let granted = self.matched[i] == j;
            self.input_ptr[i] = if exhaustive {
                // Stay while the VOQ keeps cells after this cycle's one leaves.
                if granted && self.voqs[i * p + j].len() > 1 {
                    j
                } else {
                    one_past(j, p)
                }
            } else if granted {
                one_past(j, p)
            } else {
                j // stays on the VOQ it asked for, to ask again first
            };
        }
    }

    /// Finds the cycle's matching and sends each matched input's head cell.
    fn schedule(&mut self, out: &mut Outputs) {
        let p = self.ports;
        let all = if p == 64 { u64::MAX } else { (1u64 << p) - 1 };
        // Only inputs and outputs with cells take part.
        let mut with_cells = 0u64;
        for (i, &r) in self.requests_of_input.iter().enumerate() {
            if r != 0 {
                with_cells |= 1 << i;
            }
        }
        if with_cells == 0 {
            return;
        }
        let mut free = Free {
            inputs: with_cells,
            outputs: all,
        };
        for i in 0..p {
            self.matched[i] = usize::MAX;
        }
        for k in 0..self.iterations {
            let before = free.inputs;
            match self.scheduler {
                Scheduler::Pim | Scheduler::Rrm | Scheduler::Islip => {
                    self.request_grant_accept(&mut free, k == 0)
                }
                Scheduler::Drrm | Scheduler::Edrrm => self.request_grant(&mut free, k == 0),
            }
            if free.inputs == before || free.inputs == 0 {
                break; // no new pair: later iterations cannot find one either
            }
        }
        let mut matched = with_cells & !free.inputs;
        while matched != 0 {
            let i = matched.trailing_zeros() as usize;
            matched &= matched - 1;
            let j = self.matched[i];
            let voq = &mut self.voqs[i * p + j];
            if let Some(cell) = voq.pop() {
                if voq.is_empty() {
                    self.requests_of_input[i] &= !(1 << j);
                    self.requests_for_output[j] &= !(1 << i);
                }
                self.counters.leave();
                out.departures.push(cell);
            }
        }
    }
}

impl Fabric for Voq {
    common_accessors!();

    fn step(&mut self, arrivals: &[Cell], out: &mut Outputs) -> Result<(), StepError> {
        validate(self.ports, arrivals)?;
        out.clear();
        for &cell in arrivals {
            let mut cell = cell;
            cell.arrival = self.now;
            self.counters.enter();
            self.enqueue(cell, out);
        }
        self.schedule(out);
        self.now += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voq(ports: usize, scheduler: Scheduler, iterations: Iterations) -> Voq {
        Voq::new(ports, Depth::Infinite, scheduler, iterations, 7)
    }

    #[test]
    fn log2_iterations() {
        assert_eq!(Iterations::Log2.count(16), 4);
        assert_eq!(Iterations::Log2.count(2), 1);
        assert_eq!(Iterations::Log2.count(12), 4);
        assert_eq!(Iterations::One.count(64), 1);
    }

    #[test]
    fn random_member_is_a_member_and_reaches_each() {
        let mut rng = SplitMix64::new(3);
        let set = 0b1010_0110u64;
        let mut seen = 0u64;
        for _ in 0..200 {
            let m = random_member(set, &mut rng);
            assert!(set & (1 << m) != 0);
            seen |= 1 << m;
        }
        assert_eq!(seen, set);
    }

    /// McKeown (1999) §III: with every VOQ backlogged, iSLIP-1's grant pointers
    /// desynchronise within P cycles and it then matches every input every cycle; RRM-1's
    /// move together and keep granting one input.
    #[test]
    fn islip_desynchronises_under_saturation() {
        let p = 4;
        for (scheduler, full_after_warmup) in [(Scheduler::Islip, true), (Scheduler::Rrm, false)] {
            let mut s = voq(p, scheduler, Iterations::One);
            let mut out = Outputs::default();
            // Every VOQ holds 200 cells.
            for i in 0..p as u16 {
                for j in 0..p as u16 {
                    for t in 0..200 {
                        s.counters.enter();
                        s.enqueue(Cell::new(i, j, t), &mut out);
                    }
                }
            }
            for _ in 0..p {
                s.step(&[], &mut out).unwrap();
            }
            let mut sent = 0;
            for _ in 0..100 {
                s.step(&[], &mut out).unwrap();
                sent += out.departures.len();
            }
            assert_eq!(sent == 100 * p, full_after_warmup, "{scheduler:?}: {sent}");
        }
    }

    /// EDRRM keeps a pair matched while its VOQ holds cells: input 0's burst to output 1
    /// leaves back to back although input 1 also has cells for output 1.
    #[test]
    fn edrrm_serves_a_voq_exhaustively() {
        let mut s = voq(2, Scheduler::Edrrm, Iterations::One);
        let mut out = Outputs::default();
        s.step(&[Cell::new(0, 1, 0), Cell::new(1, 1, 100)], &mut out)
            .unwrap();
        let first = out.departures[0].src;
        let mut from_first = 1;
        for t in 1..5 {
            let arrivals = [Cell::new(0, 1, t), Cell::new(1, 1, 100 + t)];
            s.step(&arrivals, &mut out).unwrap();
            if out.departures[0].src == first {
                from_first += 1;
            }
        }
        assert_eq!(from_first, 5, "the first matched input keeps the output");
        // DRRM alternates.
        let mut s = voq(2, Scheduler::Drrm, Iterations::One);
        let mut srcs = Vec::new();
        for t in 0..4 {
            let arrivals = [Cell::new(0, 1, t), Cell::new(1, 1, 100 + t)];
            s.step(&arrivals, &mut out).unwrap();
            srcs.push(out.departures[0].src);
        }
        assert_eq!(srcs, [0, 1, 0, 1]);
    }

    /// DRRM's request pointer (Li, Panwar & Chao 2001): one past the output if the request
    /// is granted, and on the requested output if not. Inputs 0 and 1 both ask output 2;
    /// output 2 grants input 0, and input 1's pointer goes from 0 to 2. So in the next cycle,
    /// holding cells for outputs 0 and 2, input 1 asks output 2 again and sends that cell
    /// first (a pointer left at 0 would ask output 0).
    #[test]
    fn drrm_request_pointer_stays_on_a_refused_output() {
        let mut s = voq(3, Scheduler::Drrm, Iterations::One);
        let mut out = Outputs::default();
        s.step(&[Cell::new(0, 2, 0), Cell::new(1, 2, 1)], &mut out)
            .unwrap();
        assert_eq!(
            out.departures.iter().map(|c| c.tag).collect::<Vec<_>>(),
            [0]
        );
        assert_eq!((s.input_ptr[0], s.input_ptr[1]), (0, 2));
        s.step(&[Cell::new(1, 0, 2)], &mut out).unwrap();
        assert_eq!(
            out.departures.iter().map(|c| c.tag).collect::<Vec<_>>(),
            [1]
        );
        assert_eq!(s.input_ptr[1], 0, "granted: one past output 2");
    }

    /// Puts `cells` cells in VOQ(`i`, `j`) without running a cycle.
    fn fill(s: &mut Voq, i: u16, j: u16, cells: u64) {
        let mut out = Outputs::default();
        for t in 0..cells {
            s.counters.enter();
            s.enqueue(Cell::new(i, j, t), &mut out);
        }
    }

    /// McKeown (1999): iSLIP moves a grant pointer only when its grant is accepted, and
    /// moves pointers in the first iteration only; RRM moves the grant pointer on every
    /// grant, in every iteration. On 4 ports (two iterations): input 0 holds cells for
    /// outputs 0 and 1, input 1 for output 1. In the first iteration outputs 0 and 1 both
    /// grant input 0, which accepts output 0; output 1's grant is refused. In the second,
    /// output 1 grants input 1, which accepts.
    #[test]
    fn islip_moves_pointers_only_on_first_iteration_accepts() {
        for scheduler in [Scheduler::Islip, Scheduler::Rrm] {
            let mut s = voq(4, scheduler, Iterations::Log2);
            fill(&mut s, 0, 0, 1);
            fill(&mut s, 0, 1, 1);
            fill(&mut s, 1, 1, 1);
            let mut out = Outputs::default();
            s.step(&[], &mut out).unwrap();
            let mut pairs: Vec<(u16, u16)> =
                out.departures.iter().map(|c| (c.src, c.dst)).collect();
            pairs.sort_unstable();
            assert_eq!(
                pairs,
                [(0, 0), (1, 1)],
                "{scheduler:?}: both iterations matched"
            );
            let (g, a) = (&s.grant_ptr[..2], &s.input_ptr[..2]);
            match scheduler {
                // Output 0's accepted grant moves g0 past input 0; output 1's refused one
                // leaves g1, and the second iteration's accepted one moves nothing.
                Scheduler::Islip => assert_eq!((g, a), (&[1, 0][..], &[1, 0][..])),
                // g1 moves past input 0 on the refused grant, then past input 1; input 1's
                // accept pointer moves past output 1 in the second iteration.
                _ => assert_eq!((g, a), (&[1, 2][..], &[1, 2][..])),
            }
        }
    }

    /// EDRRM's pointers (Li, Panwar & Chao 2002): an input's request pointer stays on an
    /// output while its VOQ keeps cells after the one sent, and moves one past it when the
    /// VOQ empties or the request is refused (DRRM would keep it on a refused output); the
    /// output's grant pointer stays on the input it granted.
    #[test]
    fn edrrm_pointers_follow_the_exhaustive_rules() {
        let mut s = voq(3, Scheduler::Edrrm, Iterations::One);
        fill(&mut s, 0, 1, 2);
        fill(&mut s, 1, 1, 1);
        let mut out = Outputs::default();
        s.step(&[], &mut out).unwrap();
        assert_eq!(
            out.departures.iter().map(|c| c.src).collect::<Vec<_>>(),
            [0]
        );
        // Input 0 keeps a cell for output 1: its pointer stays there; output 1's grant
        // pointer stays on input 0; input 1 was refused: one past output 1.
        assert_eq!((s.input_ptr[0], s.grant_ptr[1], s.input_ptr[1]), (1, 0, 2));
        s.step(&[], &mut out).unwrap();
        assert_eq!(
            out.departures.iter().map(|c| c.src).collect::<Vec<_>>(),
            [0]
        );
        // Its VOQ now empty, input 0 moves one past output 1.
        assert_eq!((s.input_ptr[0], s.grant_ptr[1]), (2, 0));
    }

    /// A matching never pairs an input or an output twice, under every scheduler.
    #[test]
    fn matchings_are_matchings() {
        let p = 8;
        for scheduler in Scheduler::ALL {
            for iterations in [Iterations::One, Iterations::Log2] {
                let mut s = voq(p, scheduler, iterations);
                let mut rng = SplitMix64::new(11);
                let mut out = Outputs::default();
                for c in 0..2000u64 {
                    let mut arrivals = Vec::new();
                    for i in 0..p as u16 {
                        if rng.uniform() < 0.9 {
                            arrivals.push(Cell::new(i, rng.below(p as u64) as u16, c));
                        }
                    }
                    s.step(&arrivals, &mut out).unwrap();
                    let (mut ins, mut outs) = (0u64, 0u64);
                    for cell in &out.departures {
                        assert_eq!(ins & (1 << cell.src), 0);
                        assert_eq!(outs & (1 << cell.dst), 0);
                        ins |= 1 << cell.src;
                        outs |= 1 << cell.dst;
                    }
                    assert!(s.counters().conserved());
                }
            }
        }
    }
}
