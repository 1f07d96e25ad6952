//! Counters: each PPE thread totals its own per batch and publishes them into its own
//! cache-padded slot; a [`Stats`] snapshot sums the slots.

use std::collections::BTreeMap;

use std::sync::atomic::Ordering;

use super::latency::LatencyStats;
use super::profile::{StageProfile, StageTimes};
use super::{Pfe, Shared};
use crate::mem::XtxnKind;
use crate::program::FaultKind;

/// Drop reasons the engine itself uses, ahead of the program's own and the fault reasons.
/// `rx_full`: offered with [`crate::pfe::Pfe::offer_burst`] while the engine was full (a
/// NIC's receive ring overflowing). `classifier_panic`, `sink_panic`: a callback panicked on
/// the packet (see `pfe::contain`).
pub(crate) const ENGINE_DROP_REASONS: [&str; 7] = [
    "runt",
    "oversize",
    "rx_full",
    "no_such_port",
    "no_such_group",
    "classifier_panic",
    "sink_panic",
];
pub(crate) const DROP_RUNT: usize = 0;
pub(crate) const DROP_OVERSIZE: usize = 1;
pub(crate) const DROP_RX_FULL: usize = 2;
pub(crate) const DROP_NO_SUCH_PORT: usize = 3;
pub(crate) const DROP_NO_SUCH_GROUP: usize = 4;
pub(crate) const DROP_CLASSIFIER_PANIC: usize = 5;
pub(crate) const DROP_SINK_PANIC: usize = 6;
/// Index of the first fault drop reason; program reasons follow the fault reasons.
pub(crate) const DROP_FAULT_BASE: usize = ENGINE_DROP_REASONS.len();
pub(crate) const DROP_PROGRAM_BASE: usize = DROP_FAULT_BASE + FaultKind::COUNT;

/// What one PPE thread has counted.
#[derive(Clone, Debug, Default)]
pub(crate) struct WorkerStats {
    pub packets: u64,
    pub forwarded: u64,
    pub multicast: u64,
    pub consumed: u64,
    pub created: u64,
    pub created_invalid: u64,
    pub drops: Vec<u64>,
    pub faults: [u64; FaultKind::COUNT],
    pub instructions: u64,
    /// `Yield` steps taken by packet and timer threads (waits for another thread).
    pub yields: u64,
    pub xtxns: [u64; XtxnKind::COUNT],
    /// Timer threads run, the instructions they executed, and those that faulted.
    pub timer_runs: u64,
    pub timer_instructions: u64,
    pub timer_faults: u64,
    /// Fault handlers run, and of those the ones that faulted.
    pub fault_handlers: u64,
    pub fault_handler_faults: u64,
    /// Nanoseconds per stage (all 0 unless the engine profiles).
    pub profile: StageTimes,
}

impl WorkerStats {
    pub fn new(drop_reasons: usize) -> Self {
        WorkerStats {
            drops: vec![0; drop_reasons],
            ..Default::default()
        }
    }

    pub fn add(&mut self, o: &WorkerStats) {
        self.packets += o.packets;
        self.forwarded += o.forwarded;
        self.multicast += o.multicast;
        self.consumed += o.consumed;
        self.created += o.created;
        self.created_invalid += o.created_invalid;
        // Drops live in their own allocation, which may share a cache line with another
        // thread's: write only what changed, so publishing a batch with no drops writes
        // nothing there.
        for (a, &b) in self.drops.iter_mut().zip(&o.drops) {
            if b != 0 {
                *a += b;
            }
        }
        for (a, b) in self.faults.iter_mut().zip(&o.faults) {
            *a += b;
        }
        self.instructions += o.instructions;
        self.yields += o.yields;
        for (a, b) in self.xtxns.iter_mut().zip(&o.xtxns) {
            *a += b;
        }
        self.timer_runs += o.timer_runs;
        self.timer_instructions += o.timer_instructions;
        self.timer_faults += o.timer_faults;
        self.fault_handlers += o.fault_handlers;
        self.fault_handler_faults += o.fault_handler_faults;
        self.profile.merge(&o.profile);
    }

    /// Counts the fault handler a faulting thread ran, if its program has one.
    pub fn count_fault_handler(&mut self, handled: &Option<Result<(), crate::program::Fault>>) {
        if let Some(h) = handled {
            self.fault_handlers += 1;
            self.fault_handler_faults += u64::from(h.is_err());
        }
    }

    /// Zeroes every counter in place (no allocation: called once per batch).
    pub fn reset(&mut self) {
        let WorkerStats {
            packets,
            forwarded,
            multicast,
            consumed,
            created,
            created_invalid,
            drops,
            faults,
            instructions,
            yields,
            xtxns,
            timer_runs,
            timer_instructions,
            timer_faults,
            fault_handlers,
            fault_handler_faults,
            profile,
        } = self;
        for c in [
            packets,
            forwarded,
            multicast,
            consumed,
            created,
            created_invalid,
            instructions,
            yields,
            timer_runs,
            timer_instructions,
            timer_faults,
            fault_handlers,
            fault_handler_faults,
        ] {
            *c = 0;
        }
        drops.fill(0);
        faults.fill(0);
        xtxns.fill(0);
        profile.reset();
    }
}

/// A snapshot of the engine's counters.
///
/// Every ingress packet ends in exactly one of: `packets_out` (forwarded or multicast),
/// `consumed`, `dropped`, or is still `in_flight`; [`Stats::is_conserved`] checks
/// `packets_in == packets_out + consumed + dropped + in_flight`, which holds exactly once
/// the engine is drained (counters of a running engine are read one after another).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Stats {
    /// Frames injected (including those dropped at ingress).
    pub packets_in: u64,
    /// Ingress packets that left the engine (forwarded, or multicast once per packet).
    pub packets_out: u64,
    /// Of `packets_out`, those multicast to a group.
    pub multicast: u64,
    /// Ingress packets a program consumed.
    pub consumed: u64,
    /// Ingress packets dropped, over all reasons.
    pub dropped: u64,
    /// Drops by reason (ingress checks, program reasons, `fault_*` for faults); reasons
    /// nothing was dropped for are left out (see [`Stats::drops`]).
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// Every reason the engine could have counted a drop under: its own (`runt`,
    /// `oversize`, `rx_full`, ...), one `fault_*` per fault kind, then the program's, in that
    /// order. [`Stats::drops`] refuses any other name, so a misspelt reason cannot read as 0.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub drop_reasons: Vec<String>,
    /// Faults by kind.
    pub faults: BTreeMap<String, u64>,
    /// Packets accepted and not yet released.
    pub in_flight: u64,
    /// Packets created by programs (of a thread that faulted, those it kept,
    /// [`crate::program::Thread::keep_created`], and its fault handler's).
    pub created: u64,
    /// Created packets discarded because their port or group does not exist.
    pub created_invalid: u64,
    /// Frames handed to sinks (multicast copies and created packets included).
    pub frames_tx: u64,
    /// Bytes handed to sinks.
    pub bytes_tx: u64,
    /// Frames and bytes handed to sinks, per port (ports with traffic only).
    pub tx_by_port: BTreeMap<u16, (u64, u64)>,
    /// Packets the reorder engine held because an earlier packet of their flow had not
    /// finished yet (0 with reordering off).
    pub reorder_held: u64,
    /// Batches ingress handed to dispatch. The packets it took (`packets_in` less the
    /// ingress drops) over this is the mean batch: `batch_size` while the PPE threads keep
    /// up, up to `max_batch_size` under a backlog ([`crate::pfe::PfeBuilder::max_batch_size`]).
    pub batches: u64,
    /// Instructions executed by packet threads (timer threads' are `timer_instructions`).
    pub instructions: u64,
    /// `Yield` steps taken by packet and timer threads: how often a program waited for
    /// another thread (e.g. Trio-ML's packets for the thread creating their block). Each
    /// wait holds the PPE thread; a high count says threads spend time waiting.
    pub yields: u64,
    /// External transactions by kind (non-zero kinds only).
    pub xtxns: BTreeMap<String, u64>,
    /// Packets processed by each PPE thread.
    pub per_ppe_packets: Vec<u64>,
    /// Timer launches handed to dispatch.
    pub timer_launches: u64,
    /// Timer threads that ran to completion or faulted.
    pub timer_runs: u64,
    /// Instructions executed by timer threads.
    pub timer_instructions: u64,
    /// Timer threads that faulted (also counted in `faults` by kind; they had no packet
    /// to drop).
    pub timer_faults: u64,
    /// Fault handlers run by threads that faulted (packet and timer threads of a program
    /// with one: [`crate::program::ProgramBuilder::on_fault`]).
    pub fault_handlers: u64,
    /// Of those, the ones that faulted in turn (they are not handled again, and the
    /// packets they created are discarded).
    pub fault_handler_faults: u64,
    /// Launches skipped because the same timer's previous thread had not finished.
    pub timer_overruns: u64,
    /// Timer periods skipped because the launcher woke up more than a period late (not the
    /// periods before the engine started: nobody's to launch).
    pub timer_missed: u64,
    /// Ingress-to-egress latency of the packets that left, when the engine measures it
    /// ([`crate::pfe::PfeBuilder::latency`]; since the last [`crate::pfe::Pfe::reset_latency`]).
    pub latency: Option<LatencyStats>,
    /// Panics the engine caught in callbacks it runs: `sink` (a [`crate::pfe::Sink`]'s
    /// `deliver`), `clock` (a [`crate::timer::Clock`]), `classifier` (a
    /// [`crate::pfe::FlowClassifier::Custom`] function): how many, and the first one's
    /// message. Panics in program closures are faults (`faults`, `fault_panic`) instead.
    pub callback_panics: BTreeMap<String, (u64, String)>,
    /// Where the threads' time went per stage (ingress, dispatch, the program, reorder,
    /// sink, egress, timers), when the engine profiles ([`crate::pfe::PfeBuilder::profile`];
    /// `None` otherwise). A PPE thread publishes a batch's release times with its next
    /// batch, so a running engine's profile lags by a batch per thread; a shut-down
    /// engine's is complete.
    pub profile: Option<StageProfile>,
}

impl Stats {
    /// Packets processed by PPE threads (ingress drops excluded).
    pub fn processed(&self) -> u64 {
        self.per_ppe_packets.iter().sum()
    }

    /// Mean instructions per processed packet.
    pub fn instructions_per_packet(&self) -> f64 {
        let p = self.processed();
        if p == 0 {
            0.0
        } else {
            self.instructions as f64 / p as f64
        }
    }

    /// Drops under one reason (0 when the engine knows the reason but dropped nothing for
    /// it).
    ///
    /// # Panics
    ///
    /// When `reason` is none of [`Stats::drop_reasons`] (a misspelling, or a reason of
    /// another program): the message lists the known ones. [`Stats::try_drops`] does not
    /// panic.
    pub fn drops(&self, reason: &str) -> u64 {
        match self.try_drops(reason) {
            Some(n) => n,
            None => panic!(
                "`{reason}` is not a drop reason of this engine or its program; known reasons: {}",
                self.drop_reasons.join(", ")
            ),
        }
    }

    /// Packets per batch ingress dispatched, on average: the packets it took (`packets_in`
    /// less its own drops: runts, oversize frames, `rx_full`, classifier panics) over
    /// [`Stats::batches`]; 0 before the first batch.
    pub fn mean_batch(&self) -> f64 {
        if self.batches == 0 {
            return 0.0;
        }
        let at_ingress: u64 = [
            DROP_RUNT,
            DROP_OVERSIZE,
            DROP_RX_FULL,
            DROP_CLASSIFIER_PANIC,
        ]
        .iter()
        .filter_map(|&i| self.dropped_by_reason.get(ENGINE_DROP_REASONS[i]))
        .sum();
        self.packets_in.saturating_sub(at_ingress) as f64 / self.batches as f64
    }

    /// Drops under one reason, or `None` when `reason` is none of [`Stats::drop_reasons`]
    /// (and nothing was counted under it).
    pub fn try_drops(&self, reason: &str) -> Option<u64> {
        match self.dropped_by_reason.get(reason) {
            Some(&n) => Some(n),
            None => self.drop_reasons.iter().any(|r| r == reason).then_some(0),
        }
    }

    /// Faults of one kind.
    pub fn faults_of(&self, kind: FaultKind) -> u64 {
        self.faults.get(kind.name()).copied().unwrap_or(0)
    }

    /// `packets_in == packets_out + consumed + dropped + in_flight`.
    pub fn is_conserved(&self) -> bool {
        self.packets_in == self.packets_out + self.consumed + self.dropped + self.in_flight
    }
}

impl Pfe {
    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        snapshot(&self.shared)
    }
}

/// The counters of the engine `sh` belongs to, now ([`Pfe::stats`], and a
/// [`super::Control`]'s).
pub(super) fn snapshot(sh: &Shared) -> Stats {
    let mut total = WorkerStats::new(sh.drop_reason_names.len());
    let mut per_ppe = Vec::with_capacity(sh.worker_stats.len());
    for w in sh.worker_stats.iter() {
        let w = w.lock();
        per_ppe.push(w.packets);
        total.add(&w);
    }
    let c = &sh.ingress_counts;
    total.drops[DROP_RUNT] += c[DROP_RUNT + 1].load(Ordering::Relaxed);
    total.drops[DROP_OVERSIZE] += c[DROP_OVERSIZE + 1].load(Ordering::Relaxed);
    total.drops[DROP_RX_FULL] += c[DROP_RX_FULL + 1].load(Ordering::Relaxed);
    total.drops[DROP_CLASSIFIER_PANIC] += sh.classifier_panics.count();
    // Packets a panicking sink lost left the PPE threads as forwarded or multicast.
    let (lost_fwd, lost_mc) = sh.tx.lost();
    total.forwarded -= lost_fwd.min(total.forwarded);
    total.multicast -= lost_mc.min(total.multicast);
    total.drops[DROP_SINK_PANIC] += lost_fwd + lost_mc;
    let mut s = Stats {
        packets_in: c[0].load(Ordering::Relaxed),
        packets_out: total.forwarded + total.multicast,
        multicast: total.multicast,
        consumed: total.consumed,
        dropped: total.drops.iter().sum(),
        in_flight: sh.in_flight.load(Ordering::Acquire),
        created: total.created,
        created_invalid: total.created_invalid,
        instructions: total.instructions,
        yields: total.yields,
        reorder_held: if sh.cfg.reorder {
            sh.reorder.held_total()
        } else {
            0
        },
        batches: sh.ingress.lock().last_batch,
        per_ppe_packets: per_ppe,
        timer_runs: total.timer_runs,
        timer_instructions: total.timer_instructions,
        timer_faults: total.timer_faults,
        fault_handlers: total.fault_handlers,
        fault_handler_faults: total.fault_handler_faults,
        latency: sh.latency.as_ref().map(|l| LatencyStats::of(&l.snapshot())),
        drop_reasons: sh.drop_reason_names.clone(),
        profile: sh
            .cfg
            .profile
            .then(|| StageProfile::of(total.packets, &total.profile, &sh.ingress_time)),
        ..Stats::default()
    };
    for (name, log) in [
        ("sink", &sh.tx.sink_panics),
        ("clock", &*sh.clock_panics),
        ("classifier", &sh.classifier_panics),
    ] {
        if let Some(p) = log.snapshot() {
            s.callback_panics.insert(name.to_string(), p);
        }
    }
    if let Some(t) = &sh.timers {
        let c = t.counts();
        s.timer_launches = c.launches;
        s.timer_overruns = c.overruns;
        s.timer_missed = c.missed;
    }
    for (name, &n) in sh.drop_reason_names.iter().zip(&total.drops) {
        if n > 0 {
            *s.dropped_by_reason.entry(name.clone()).or_default() += n;
        }
    }
    for k in FaultKind::ALL {
        let n = total.faults[k.index()];
        if n > 0 {
            s.faults.insert(k.name().to_string(), n);
        }
    }
    for (name, n) in crate::mem::XtxnKind::named(&total.xtxns) {
        s.xtxns.insert(name.to_string(), n);
    }
    for (port, (frames, bytes)) in sh.tx.per_port().into_iter().enumerate() {
        if frames > 0 {
            s.tx_by_port.insert(port as u16, (frames, bytes));
            s.frames_tx += frames;
            s.bytes_tx += bytes;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> Stats {
        let mut s = Stats {
            drop_reasons: vec!["runt".into(), "fault_budget".into(), "non_ip".into()],
            ..Stats::default()
        };
        s.dropped_by_reason.insert("non_ip".into(), 7);
        s
    }

    #[test]
    fn drops_of_a_known_reason_is_its_count_or_zero() {
        let s = stats();
        assert_eq!(s.drops("non_ip"), 7);
        assert_eq!(s.drops("runt"), 0);
        assert_eq!(s.try_drops("non_ip"), Some(7));
        assert_eq!(s.try_drops("fault_budget"), Some(0));
    }

    #[test]
    fn the_mean_batch_counts_what_ingress_took_and_not_what_it_dropped() {
        let mut s = stats();
        assert_eq!(s.mean_batch(), 0.0, "no batch yet");
        s.packets_in = 110;
        s.batches = 5;
        // Dropped by the program: still taken by ingress, and so in a batch.
        assert_eq!(s.mean_batch(), 22.0);
        s.dropped_by_reason.insert("runt".into(), 6);
        s.dropped_by_reason.insert("rx_full".into(), 4);
        assert_eq!(s.mean_batch(), 20.0);
    }

    #[test]
    fn try_drops_of_an_unknown_reason_is_none() {
        assert_eq!(stats().try_drops("non-ip"), None);
    }

    #[test]
    #[should_panic(
        expected = "`non-ip` is not a drop reason of this engine or its program; \
                               known reasons: runt, fault_budget, non_ip"
    )]
    fn drops_of_a_misspelt_reason_panics_naming_the_known_ones() {
        stats().drops("non-ip");
    }
}
