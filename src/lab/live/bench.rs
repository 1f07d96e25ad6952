//! The filter through real interfaces (`pfemu bench ports`), beside the same filter fed in
//! process (`pfemu bench filter`).
//!
//! ```text
//! generator thread --sendmmsg--> OFFER veth ==> port 0's veth --ring--> PFE (filter)
//!                                                                          |
//!                           port 1's veth <==sendmmsg (PPE threads) <------+
//! ```
//!
//! A thread sends plain IPv4 frames (every one forwarded by the filter) into the offer
//! interface, whose veth peer is bound to port 0, as fast as one `sendmmsg` loop goes, for
//! the run's duration; port 1 sends them out. The report gives the rates offered, taken
//! by port 0 and sent out of port 1, where frames were lost (on the veth, whose backlog
//! overflows before the ring when the receiver is slower than the sender; in the ring; on
//! the way out), and the in-process filter's rate on the same frames, PPE threads and
//! duration. Every frame offered is accounted for: [`PortsBenchReport::accounted`].
//!
//! # Frames lost on the veth
//!
//! A veth whose peer's backlog is full drops the frame in the sender's `sendmmsg` call,
//! which refuses it with `ENOBUFS`: it was offered and lost on the veth, and the generator
//! goes on. The kernel counts that drop twice, as the offer interface's `tx_dropped` and as
//! port 0's `rx_dropped` (checked on Linux 6.18: one dropped frame adds one to each), so the
//! two are never summed. Neither is the measure of frames lost: a frame refused in the
//! middle of a `sendmmsg` call is dropped and counted too, but the call only returns how
//! many went before it, and the generator sends that frame again. The frames refused with
//! `ENOBUFS` are exactly the frames lost on the veth; the larger of the two counters is
//! reported beside them (`veth_drop_counters`: those and the attempts sent again).
//!
//! That holds on kernels whose veth reports a drop to the sender (checked on Linux 6.18;
//! `veth_xmit` has returned the drop since 2024). On an older kernel a veth drops
//! silently: the sender's `sendmmsg` counts the frame as sent, `veth_dropped` misses it,
//! and the frame is in no counter, so [`PortsBenchReport::accounted`] is false. The cross-check is
//! `veth_delivered`, the frames the veth handed to port 0's interface (its `rx_packets`):
//! where drops are reported it equals `offered - veth_dropped`; what it falls short by
//! is what the veth dropped silently (and `veth_drop_counters` counts those too). Frames
//! that something else sends into the offer interface (the host's IPv6 or ARP, unless
//! turned off) add to it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::ConfigError;
use crate::lab::bench::filter::{self, FilterBenchConfig};
use crate::lab::bench::linerate::{
    self, Device, DeviceError, LinerateConfig, LinerateError, LinerateReport, Progress, Trial,
};
use crate::lab::bench::settings::EngineSettings;
use crate::lab::bench::traffic::{Traffic, TrafficSpec};
use crate::lab::live::{
    if_mtu, Live, LiveConfig, LiveError, LiveProgram, LiveReport, ETHERNET_HEADER,
};
use crate::lab::ports::{PortKind, PortSpec, PortsConfig, RawSocket};

/// A run's settings.
#[derive(Clone, Debug)]
pub struct PortsBenchConfig {
    /// The interface the generator sends into: a veth whose peer is port 0's interface.
    pub offer: String,
    /// Port 0's and port 1's interfaces (port 1: where the filter forwards).
    pub port0: String,
    /// See `port0`.
    pub port1: String,
    /// Frame size, bytes.
    pub size: usize,
    /// Flows.
    pub flows: u32,
    /// How long the generator sends, seconds.
    pub duration_s: f64,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Also run the in-process filter on the same frames for comparison.
    pub in_process: bool,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct PortsBenchReport {
    /// Frame size, bytes.
    pub size: usize,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Seconds the generator sent.
    pub elapsed_s: f64,
    /// Frames offered: the generator's `sendmmsg` calls took them, or refused them with
    /// `ENOBUFS` because the veth's backlog was full (lost on the veth: `veth_dropped`).
    pub offered: u64,
    /// Frames the kernel refused to the generator for another reason (not offered).
    pub offer_errors: u64,
    /// Why the generator stopped before the run's duration: the kernel refused a whole
    /// burst for a reason other than `ENOBUFS` (the interface went down or away).
    pub offer_stopped: Option<String>,
    /// `offered` per second, millions.
    pub offered_mpps: f64,
    /// Frames lost on the veth between the generator and port 0 (its backlog was full):
    /// those the kernel refused with `ENOBUFS`. Complete where the veth reports its drops
    /// to the sender (checked on Linux 6.18); an older kernel's veth drops frames silently,
    /// which this misses: `veth_delivered` shows them (see the module docs).
    pub veth_dropped: u64,
    /// The veth's own drop count over the run: the larger of the offer interface's
    /// `tx_dropped` and port 0's `rx_dropped` (each drop is counted on both). At least
    /// `veth_dropped` on Linux 6.18: it also counts the attempts the generator sent again.
    pub veth_drop_counters: u64,
    /// Frames the veth handed to port 0's interface over the run (its `rx_packets`):
    /// `offered - veth_dropped` on a kernel whose veth reports every drop to the sender
    /// (checked on Linux 6.18); less on an older one, whose veth drops frames silently, by
    /// those frames (see the module docs).
    pub veth_delivered: u64,
    /// Frames port 0 injected into the engine.
    pub port_in: u64,
    /// `port_in` per second, millions.
    pub port_in_mpps: f64,
    /// Frames lost at port 0: ring full, cut, unread at the stop.
    pub port_dropped: u64,
    /// Frames port 1 sent out.
    pub port_out: u64,
    /// `port_out` per second, millions.
    pub port_out_mpps: f64,
    /// The in-process filter's rate on the same frames, PPE threads and duration.
    pub in_process_mpps: Option<f64>,
    /// What was missing when the wait for the frames in flight after the generator stopped
    /// ended: `None` when port 0 counted every frame the veth took. Otherwise the frames
    /// port 0 had not counted by [`VETH_DRAIN_DEADLINE`], or, once its counters had been
    /// still a moment with as many counted as reached its interface, those the kernel lost
    /// without a word (a veth on a kernel before 2024).
    pub drain_missing: Option<String>,
    /// The live run's full report (ports, engine).
    pub live: LiveReport,
}

impl PortsBenchReport {
    /// Every frame offered is accounted for: lost on the veth, injected, or lost at
    /// port 0; every frame injected left port 1 (the filter forwards them all) or was
    /// counted as a drop; and the live run accounted for all of its frames.
    pub fn accounted(&self) -> bool {
        self.offered == self.veth_dropped + self.port_in + self.port_dropped
            && self.live.accounted()
    }
}

/// A counter of `/sys/class/net/IFACE/statistics/` (0 when it cannot be read).
fn if_stat(iface: &str, name: &str) -> u64 {
    if_stat_now(iface, name).unwrap_or(0)
}

/// A counter of `/sys/class/net/IFACE/statistics/`, if it can be read.
fn if_stat_now(iface: &str, name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The veth's counters between the generator and port 0: its drops (the offer interface's
/// `tx_dropped` and port 0's `rx_dropped`) and the frames it delivered (port 0's
/// `rx_packets`).
#[derive(Clone, Copy, Debug)]
struct VethDrops {
    tx: u64,
    rx: u64,
    delivered: u64,
}

impl VethDrops {
    fn now(offer: &str, port0: &str) -> VethDrops {
        VethDrops {
            tx: if_stat(offer, "tx_dropped"),
            rx: if_stat(port0, "rx_dropped"),
            delivered: if_stat(port0, "rx_packets"),
        }
    }

    /// Frames the veth delivered to port 0's interface since `before`.
    fn delivered_since(&self, before: &VethDrops) -> u64 {
        self.delivered.saturating_sub(before.delivered)
    }

    /// Drops since `before`: the larger of the two counters' increase, as Linux counts
    /// one drop on both sides.
    fn since(&self, before: &VethDrops) -> u64 {
        self.tx
            .saturating_sub(before.tx)
            .max(self.rx.saturating_sub(before.rx))
    }
}

/// What a generator offered, burst by burst.
#[derive(Debug, Default, PartialEq, Eq)]
struct Offer {
    /// Frames the kernel took.
    accepted: u64,
    /// Frames it refused with `ENOBUFS`: the veth's backlog was full, the frame was lost
    /// on the veth. Offered.
    enobufs: u64,
    /// Frames it refused for another reason: not offered.
    refused: u64,
    /// The first of those other refusals.
    first_error: Option<String>,
    /// Why the generator stopped early: a burst was refused whole, not for `ENOBUFS`.
    stopped: Option<String>,
}

impl Offer {
    /// Frames offered: taken, or lost on the veth.
    fn offered(&self) -> u64 {
        self.accepted + self.enobufs
    }

    /// Adds a burst that the kernel took `ok` frames of, refusing the others with
    /// `errors`. False when the generator should stop: the kernel refused every frame, not
    /// for a full backlog (`ENOBUFS`, which passes), so the next burst would fare the same.
    fn add(&mut self, ok: u64, errors: Vec<std::io::Error>, iface: &str) -> bool {
        self.accepted += ok;
        let mut other = 0;
        for e in errors {
            if e.raw_os_error() == Some(libc::ENOBUFS) {
                self.enobufs += 1;
            } else {
                other += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
        self.refused += other;
        if ok == 0 && other > 0 && self.stopped.is_none() {
            self.stopped = Some(format!(
                "the kernel refused a whole burst sent into {iface}: {}",
                self.first_error.as_deref().unwrap_or("?")
            ));
            return false;
        }
        true
    }
}

/// Offers bursts with `send` (which returns the frames the kernel took and the error of
/// each it refused) until `stop` is set or a burst is refused whole ([`Offer::add`]).
fn offer_until(
    stop: &AtomicBool,
    iface: &str,
    mut send: impl FnMut() -> (u64, Vec<std::io::Error>),
) -> Offer {
    let mut offer = Offer::default();
    while !stop.load(Ordering::Relaxed) {
        let (ok, errors) = send();
        if !offer.add(ok, errors, iface) {
            break;
        }
    }
    offer
}

/// `pfemu bench filter`'s rate (Mpps) on `traffic` (frames of `size` bytes over `flows`
/// flows) with `ppe_threads` PPE threads for `duration_s` seconds.
fn in_process_mpps(
    traffic: &Traffic,
    size: usize,
    flows: u32,
    ppe_threads: usize,
    duration_s: f64,
) -> Result<f64, ConfigError> {
    let fcfg = FilterBenchConfig {
        engine: EngineSettings {
            ppe_threads,
            ..EngineSettings::default()
        },
        size,
        flows,
        duration_s: Some(duration_s),
        ..FilterBenchConfig::default()
    };
    Ok(filter::run_with_progress(&fcfg, traffic, |_, _| {})?.mpps)
}

/// The filter from interface `port0` (port 0) to `port1` (port 1) on `ppe_threads`.
fn filter_between(port0: &str, port1: &str, ppe_threads: usize) -> LiveConfig {
    let port = |port, name: &str| PortSpec {
        port,
        kind: PortKind::Interface(name.to_string()),
    };
    LiveConfig {
        ppe_threads,
        ..LiveConfig::new(
            LiveProgram::Filter,
            PortsConfig::new(vec![port(0, port0), port(1, port1)]),
        )
    }
}

/// What a drain looks at, read once per step (counts since the run or trial began).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct DrainView {
    /// Frames counted at port 0: injected, or dropped there.
    at_port0: u64,
    /// Frames the veth handed port 0's interface (its `rx_packets`), if readable.
    delivered: Option<u64>,
    /// Whether the engine holds nothing and has resolved every frame injected.
    engine_done: bool,
    /// The counters, to tell whether they still move.
    counters: Snapshot,
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Drained {
    /// Every frame the veth took is counted at port 0, and the engine is done with them.
    Counted,
    /// Frames are missing, but the counters have been still for [`DRAIN_QUIET`] with as
    /// many counted at port 0 as reached its interface: the kernel lost the rest without
    /// saying so (the message names them).
    Quiet(String),
    /// The deadline came first (the message names what is missing).
    TimedOut(String),
}

impl Drained {
    /// What is missing, if anything.
    fn missing(&self) -> Option<String> {
        match self {
            Drained::Counted => None,
            Drained::Quiet(m) | Drained::TimedOut(m) => Some(m.clone()),
        }
    }
}

/// How long a drain's counters must be still before it ends with frames missing, when the
/// kernel may have lost them silently: a few ring block timeouts.
const DRAIN_QUIET: Duration = Duration::from_millis(3);

/// Decides when the frames in flight after a generator stopped have all been counted.
///
/// By count: done once port 0 counts (injected or dropped) every frame the veth took from
/// the generator (`expected`: those `sendmmsg` accepted) and the engine is done with them.
/// A veth that reports its drops to the sender (Linux 6.18; `veth_xmit` since 2024) hands
/// every frame it accepted to port 0's interface, so no clock is involved, however late a
/// frame comes. Only an older kernel's veth loses frames silently, and then nothing counts
/// when the last frame has come: as a fallback the drain ends once port 0 counts at least
/// what reached its interface (`rx_packets`, when readable) and the counters have been
/// still for [`DRAIN_QUIET`], naming the frames missing. Time is passed in, so the
/// decisions are tested without a clock.
#[derive(Debug)]
struct Drain {
    expected: u64,
    deadline: Duration,
    last: Option<Snapshot>,
    still_since: Duration,
}

impl Drain {
    fn new(expected: u64, deadline: Duration) -> Drain {
        Drain {
            expected,
            deadline,
            last: None,
            still_since: Duration::ZERO,
        }
    }

    /// One look at `v`, `at` after the drain began: `Some` once it is over.
    fn step(&mut self, at: Duration, v: &DrainView) -> Option<Drained> {
        if v.at_port0 >= self.expected && v.engine_done {
            return Some(Drained::Counted);
        }
        if self.last != Some(v.counters) {
            self.last = Some(v.counters);
            self.still_since = at;
        }
        let missing = || {
            let mut m = format!(
                "port 0 counted {} of the {} frames the veth took",
                v.at_port0, self.expected
            );
            if let Some(d) = v.delivered {
                m.push_str(&format!(" ({d} reached its interface)"));
            }
            if !v.engine_done {
                m.push_str("; the engine was not done with the frames it took");
            }
            m
        };
        let arrived = v.delivered.is_none_or(|d| v.at_port0 >= d);
        if arrived && v.engine_done && at.saturating_sub(self.still_since) >= DRAIN_QUIET {
            return Some(Drained::Quiet(format!(
                "{}: the kernel lost the rest without a word (counters still for {:?})",
                missing(),
                DRAIN_QUIET
            )));
        }
        if at >= self.deadline {
            return Some(Drained::TimedOut(format!(
                "{} within {:?}",
                missing(),
                self.deadline
            )));
        }
        None
    }
}

/// Runs `drain` on `view()` every millisecond until it ends.
fn run_drain(mut drain: Drain, mut view: impl FnMut() -> DrainView) -> Drained {
    let start = Instant::now();
    loop {
        if let Some(end) = drain.step(start.elapsed(), &view()) {
            return end;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until every frame `offer` offered is counted at port 0 (taken, or dropped there)
/// or was lost on the veth ([`Drain`]), or [`VETH_DRAIN_DEADLINE`]: frames still in the
/// veth's backlog when the generator stops reach the port's ring a moment later, and
/// stopping the port before then would leave them in no counter. `delivered_before` is
/// port 0's interface's `rx_packets` when the run began.
fn drain_into_port0(
    live: &Live,
    offer: &Offer,
    port0: &str,
    delivered_before: Option<u64>,
) -> Drained {
    let drain = Drain::new(offer.accepted, VETH_DRAIN_DEADLINE);
    run_drain(drain, || {
        let now = Snapshot::of(&live.report());
        DrainView {
            at_port0: now.port_in + now.port_dropped,
            delivered: delivered_since(port0, delivered_before),
            // The stop drains the engine.
            engine_done: true,
            counters: now,
        }
    })
}

/// Frames port 0's interface `port0` received since its `rx_packets` was `before`.
fn delivered_since(port0: &str, before: Option<u64>) -> Option<u64> {
    Some(if_stat_now(port0, "rx_packets")?.saturating_sub(before?))
}

/// Runs the benchmark (see the module docs).
pub fn run(cfg: &PortsBenchConfig) -> Result<PortsBenchReport, LiveError> {
    let length = crate::duration::secs_setting("duration", cfg.duration_s)?;
    let traffic = plain_ipv4(cfg.size, cfg.flows)?;
    let live_cfg = filter_between(&cfg.port0, &cfg.port1, cfg.ppe_threads);
    let tx = RawSocket::open(&cfg.offer, false)?;
    let live = Live::start(&live_cfg)?;
    let veth_before = VethDrops::now(&cfg.offer, &cfg.port0);
    let delivered_before = if_stat_now(&cfg.port0, "rx_packets");

    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let offer = std::thread::scope(|s| {
        let gen = s.spawn(|| {
            let n = traffic.len();
            let mut i = 0usize;
            offer_until(&stop, &cfg.offer, || {
                let at = i;
                i = (i + VETH_BURST as usize) % n;
                tx.send_counting((0..VETH_BURST as usize).map(|k| traffic.frame((at + k) % n)))
            })
        });
        // The run's clock: the scope waits for the generator, which looks at `stop`.
        std::thread::sleep(length);
        stop.store(true, Ordering::Relaxed);
        // A generator that panicked offered an unknown number of frames: no figure.
        gen.join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    let elapsed = start.elapsed().as_secs_f64();
    let drained = drain_into_port0(&live, &offer, &cfg.port0, delivered_before);
    let live = live.stop()?;
    let veth_after = VethDrops::now(&cfg.offer, &cfg.port0);
    let veth_drop_counters = veth_after.since(&veth_before);

    let in_process_mpps = if cfg.in_process {
        Some(in_process_mpps(
            &traffic,
            cfg.size,
            cfg.flows,
            cfg.ppe_threads,
            cfg.duration_s,
        )?)
    } else {
        None
    };
    let p0 = live.ports.ports.first().cloned().unwrap_or_default();
    let p1 = live.ports.ports.get(1).cloned().unwrap_or_default();
    let mpps = |n: u64| n as f64 / elapsed.max(1e-9) / 1e6;
    Ok(PortsBenchReport {
        size: cfg.size,
        ppe_threads: cfg.ppe_threads,
        elapsed_s: elapsed,
        offered: offer.offered(),
        offer_errors: offer.refused,
        offered_mpps: mpps(offer.offered()),
        offer_stopped: offer.stopped,
        veth_dropped: offer.enobufs,
        veth_drop_counters,
        veth_delivered: veth_after.delivered_since(&veth_before),
        port_in: p0.rx_frames,
        port_in_mpps: mpps(p0.rx_frames),
        port_dropped: p0.rx_dropped(),
        port_out: p1.tx_frames,
        port_out_mpps: mpps(p1.tx_frames),
        in_process_mpps,
        drain_missing: drained.missing(),
        live,
    })
}

// ----- RFC 2544 through the veth pair ---------------------------------------------------------

/// Where a [`VethDevice`] offers frames, which interfaces its ports are bound to, and the
/// engine's settings.
#[derive(Clone, Debug)]
pub struct VethDeviceConfig {
    /// The interface the trials send into: a veth whose peer is `port0`.
    pub offer: String,
    /// Port 0's interface (the peer of `offer`).
    pub port0: String,
    /// Port 1's interface, where the filter forwards.
    pub port1: String,
    /// Distinct flows of the generated frames.
    pub flows: u32,
    /// PPE threads.
    pub ppe_threads: usize,
}

/// What one trial of a [`VethDevice`] counted: the [`Trial`] it reported and where the
/// frames went. Once the trial drained, `offered == veth_dropped + port_in + port_dropped`
/// ([`VethTrial::accounted`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VethTrial {
    /// Frame size, bytes.
    pub frame_size: usize,
    /// The rate asked for, frames per second.
    pub rate_pps: f64,
    /// Frames that rate calls for over the trial's duration (rounded).
    pub scheduled: u64,
    /// Frames offered: the kernel took them from the generator's `sendmmsg`, or refused
    /// them with `ENOBUFS` because the veth's backlog was full (lost on the veth, counted in
    /// `veth_dropped`).
    pub offered: u64,
    /// Frames the kernel refused for another reason (not offered).
    pub refused: u64,
    /// Frames scheduled that the generator had not sent when the trial's time (and a grace
    /// of 5% of it, 2 to 50 ms) was up: it could not keep the rate (not offered).
    pub behind: u64,
    /// Seconds the generator sent.
    pub send_s: f64,
    /// Frames lost on the veth (its backlog was full): those the kernel refused with
    /// `ENOBUFS`. Complete where the veth reports its drops to the sender (checked on Linux
    /// 6.18); an older kernel's veth drops frames silently, which this misses:
    /// `veth_delivered` shows them (see the module docs).
    pub veth_dropped: u64,
    /// The veth's own drop count over the trial: the larger of the offer interface's
    /// `tx_dropped` and port 0's `rx_dropped` (each drop is counted on both). At least
    /// `veth_dropped` on Linux 6.18: it also counts the attempts the generator sent again.
    pub veth_drop_counters: u64,
    /// Frames the veth handed to port 0's interface over the trial (its `rx_packets`):
    /// `offered - veth_dropped` where the veth reports every drop to the sender (checked
    /// on Linux 6.18); less, by the frames it dropped silently, on an older kernel.
    pub veth_delivered: u64,
    /// Frames port 0 injected into the engine.
    pub port_in: u64,
    /// Frames lost at port 0 (ring full, cut).
    pub port_dropped: u64,
    /// Frames port 1 sent out: the trial's received count.
    pub received: u64,
    /// Frames the engine sent to port 1 that did not leave it: refused by the kernel or
    /// dropped by the interface (port 1's [`PortStats::tx_dropped`](crate::lab::ports::PortStats::tx_dropped)).
    pub out_dropped: u64,
    /// Frames the engine dropped or consumed (by the program or for a reason of its own).
    pub engine_dropped: u64,
    /// Whether the trial's frames had all come out (or been counted lost, or lost by the
    /// kernel without a word: `drain_missing`) before the drain's deadline
    /// ([`VETH_DRAIN_DEADLINE`]).
    pub drained: bool,
    /// What was missing when the drain ended: `None` when port 0 counted every frame the
    /// veth took and the engine was done with them; otherwise what port 0 had not
    /// counted by the deadline, or what the kernel lost without a word (see
    /// [`PortsBenchReport::drain_missing`]).
    pub drain_missing: Option<String>,
    /// Seconds spent waiting for the frames in flight after the generator stopped.
    pub drain_s: f64,
}

impl VethTrial {
    /// Every frame offered is accounted for: lost on the veth, injected, or lost at
    /// port 0; and no more came out of port 1 than went in.
    pub fn accounted(&self) -> bool {
        self.offered == self.veth_dropped + self.port_in + self.port_dropped
            && self.received <= self.port_in
    }
}

/// The most a [`VethDevice`] trial waits, after the generator stopped, for the frames in
/// flight to come out.
pub const VETH_DRAIN_DEADLINE: Duration = Duration::from_secs(2);

/// Frames the generator hands `sendmmsg` at most at once.
const VETH_BURST: u64 = 256;

/// The filter on live ports bound to a veth pair, as a [`Device`] for the RFC 2544
/// throughput search of [`linerate`] (`pfemu bench ports --search`).
///
/// It holds a running [`Live`] (the filter, port 0 on [`VethDeviceConfig::port0`], port 1
/// on [`VethDeviceConfig::port1`]) and a [`RawSocket`] on [`VethDeviceConfig::offer`], the
/// veth peer of port 0. A trial sends plain IPv4 frames of its size (which the filter
/// forwards; 4096 frames per size, generated once as [`run`] generates them) paced at its
/// rate: the generator works out from the time elapsed how many frames should have gone,
/// sends those in `sendmmsg` bursts of up to 256, and sleeps briefly when it is ahead.
/// Then it waits until the frames in flight came out (port 0 counts every frame the veth
/// took and the engine is done with them, within [`VETH_DRAIN_DEADLINE`]; see
/// [`VethTrial::drain_missing`] for a kernel that loses frames silently), and reports `received` as the frames port 1 sent during the trial. A frame lost on the
/// veth or in port 0's ring did not come out: it counts as lost, as RFC 2544 counts a
/// frame the device under test did not forward. [`VethDevice::trials`] keeps where each
/// trial's frames went.
///
/// ```no_run
/// use std::time::Duration;
/// use pfemu::lab::bench::linerate::{self, LinerateConfig};
/// use pfemu::lab::live::bench::{VethDevice, VethDeviceConfig};
///
/// let mut dev = VethDevice::start(&VethDeviceConfig {
///     offer: "gen0".into(),
///     port0: "pfe0".into(),
///     port1: "pfe1".into(),
///     flows: 1024,
///     ppe_threads: 2,
/// })?;
/// let cfg = LinerateConfig {
///     sizes: vec![64, 1518],
///     line_rate_gbps: 1.0,
///     ..LinerateConfig::default()
/// };
/// let report = linerate::search(&mut dev, &cfg, |_| {})?;
/// print!("{}", report.table());
/// let live = dev.stop()?;
/// assert!(live.accounted());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct VethDevice {
    cfg: VethDeviceConfig,
    live: Live,
    tx: RawSocket,
    traffic: HashMap<usize, Traffic>,
    /// The next frame of the size's traffic to send (frames cycle across trials).
    next: usize,
    trials: Vec<VethTrial>,
}

impl fmt::Debug for VethDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VethDevice")
            .field("cfg", &self.cfg)
            .field("live", &self.live)
            .field("trials", &self.trials.len())
            .finish()
    }
}

/// The frames [`run`] and [`VethDevice`] offer: 4096 plain IPv4 frames of `size` bytes
/// over `flows` flows.
fn plain_ipv4(size: usize, flows: u32) -> Result<Traffic, ConfigError> {
    Traffic::generate(&TrafficSpec {
        packets: 4096,
        frame_size: size,
        flows,
        mix: "ipv4=100".parse()?,
        seed: 1,
        ..TrafficSpec::default()
    })
}

impl VethDevice {
    /// Starts the filter on the ports and opens the generator's socket.
    pub fn start(cfg: &VethDeviceConfig) -> Result<VethDevice, LiveError> {
        let live_cfg = filter_between(&cfg.port0, &cfg.port1, cfg.ppe_threads);
        let tx = RawSocket::open(&cfg.offer, false)?;
        let live = Live::start(&live_cfg)?;
        Ok(VethDevice {
            cfg: cfg.clone(),
            live,
            tx,
            traffic: HashMap::new(),
            next: 0,
            trials: Vec::new(),
        })
    }

    /// Refuses `frame_size` when a frame that long (Ethernet header included) does not fit
    /// the MTU of the offer interface or of a port's: the kernel would refuse or drop every
    /// one, and the search would report a throughput of 0 for a setup fault.
    pub fn check_frame_size(&self, frame_size: usize) -> Result<(), ConfigError> {
        for iface in [&self.cfg.offer, &self.cfg.port0, &self.cfg.port1] {
            if let Some(mtu) = if_mtu(iface) {
                if frame_size > mtu + ETHERNET_HEADER {
                    return Err(ConfigError::new(
                        "sizes",
                        format!(
                            "{frame_size} B frames do not fit the MTU of {iface} ({mtu}: \
                             frames up to {} B); raise it on every interface of the pairs, \
                             e.g. `ip link set {iface} mtu 9000`",
                            mtu + ETHERNET_HEADER
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The counters of the live run now.
    pub fn report(&self) -> LiveReport {
        self.live.report()
    }

    /// Where the frames of every trial so far went, in the order run.
    pub fn trials(&self) -> &[VethTrial] {
        &self.trials
    }

    /// The device's settings.
    pub fn config(&self) -> &VethDeviceConfig {
        &self.cfg
    }

    /// Stops the live run (drains it) and returns its final counters.
    pub fn stop(self) -> Result<LiveReport, LiveError> {
        self.live.stop()
    }

    fn veth_drops_now(&self) -> VethDrops {
        VethDrops::now(&self.cfg.offer, &self.cfg.port0)
    }
}

/// The counters a trial takes differences of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Snapshot {
    port_in: u64,
    port_dropped: u64,
    out: u64,
    out_dropped: u64,
    engine_dropped: u64,
    /// Frames the engine resolved: sent out of a port (or refused there), dropped, consumed.
    resolved: u64,
    packets_in: u64,
    /// Frames every port injected into the engine.
    injected: u64,
    in_flight: u64,
}

impl Snapshot {
    fn of(r: &LiveReport) -> Snapshot {
        let p0 = r.ports.ports.first().cloned().unwrap_or_default();
        let p1 = r.ports.ports.get(1).cloned().unwrap_or_default();
        let e = &r.engine;
        let engine_dropped = e.dropped + e.consumed;
        Snapshot {
            port_in: p0.rx_frames,
            port_dropped: p0.rx_dropped(),
            out: p1.tx_frames,
            out_dropped: p1.tx_dropped(),
            engine_dropped,
            resolved: r.ports.tx_frames() + r.ports.tx_dropped() + engine_dropped,
            packets_in: e.packets_in,
            injected: r.ports.rx_frames(),
            in_flight: e.in_flight,
        }
    }

    /// Whether the engine holds nothing and has resolved every frame taken since `before`:
    /// as many resolved as it counted in and as the ports injected. The report reads the
    /// engine's counters before the ports' (as [`Live::report`] promises), so a frame
    /// injected between the two reads is in the ports' count and not yet in `packets_in`:
    /// measured against `packets_in` alone, the engine looked done with it still to come
    /// (the cause of a trial that received one or two frames fewer than port 0 took).
    fn engine_done_since(&self, before: &Snapshot) -> bool {
        let taken = (self.packets_in - before.packets_in).max(self.injected - before.injected);
        self.in_flight == 0 && self.resolved - before.resolved >= taken
    }
}

impl Device for VethDevice {
    fn trial(
        &mut self,
        frame_size: usize,
        offered_pps: f64,
        duration: Duration,
    ) -> Result<Trial, DeviceError> {
        if !(offered_pps.is_finite() && offered_pps > 0.0) {
            return Err(ConfigError::new(
                "offered_pps",
                format!("{offered_pps} is not a positive rate in frames per second"),
            )
            .into());
        }
        self.check_frame_size(frame_size)?;
        if !self.traffic.contains_key(&frame_size) {
            let t = plain_ipv4(frame_size, self.cfg.flows)?;
            self.traffic.insert(frame_size, t);
        }
        let traffic = &self.traffic[&frame_size];
        let n = traffic.len();
        let before = Snapshot::of(&self.live.report());
        let veth_before = self.veth_drops_now();
        let delivered_before = if_stat_now(&self.cfg.port0, "rx_packets");

        // Offer, paced: frame k is due k / rate seconds after the start.
        let scheduled = (offered_pps * duration.as_secs_f64()).round() as u64;
        let grace = (duration / 20).clamp(Duration::from_millis(2), Duration::from_millis(50));
        let (mut attempted, mut accepted, mut enobufs, mut refused) = (0u64, 0u64, 0u64, 0u64);
        let mut other_error: Option<std::io::Error> = None;
        let start = Instant::now();
        while attempted < scheduled {
            let t = start.elapsed();
            if t > duration + grace {
                break;
            }
            let due = ((offered_pps * t.as_secs_f64()).floor() as u64)
                .saturating_add(1)
                .min(scheduled);
            if due <= attempted {
                let next = Duration::from_secs_f64(attempted as f64 / offered_pps);
                let wait = next.saturating_sub(t).min(Duration::from_millis(1));
                if wait >= Duration::from_micros(50) {
                    std::thread::sleep(wait);
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            let burst = (due - attempted).min(VETH_BURST);
            let frames = (0..burst as usize).map(|k| traffic.frame((self.next + k) % n));
            let (ok, errors) = self.tx.send_counting(frames);
            self.next = (self.next + burst as usize) % n;
            attempted += burst;
            accepted += ok;
            for e in errors {
                if e.raw_os_error() == Some(libc::ENOBUFS) {
                    enobufs += 1;
                } else {
                    refused += 1;
                    other_error.get_or_insert(e);
                }
            }
        }
        let send_s = start.elapsed().as_secs_f64();
        if accepted + enobufs == 0 && refused > 0 {
            return Err(format!(
                "the kernel refused every frame sent into {} ({refused} of them): {}",
                self.cfg.offer,
                other_error.map_or_else(|| "?".to_string(), |e| e.to_string())
            )
            .into());
        }
        let offered = accepted + enobufs;

        // Let what is in flight come out: every frame the veth took counted at port 0 and
        // the engine done with them ([`Drain`]), or the deadline.
        let drain_start = Instant::now();
        let mut now = before;
        let drain = Drain::new(accepted, VETH_DRAIN_DEADLINE);
        let drained = run_drain(drain, || {
            now = Snapshot::of(&self.live.report());
            DrainView {
                at_port0: (now.port_in - before.port_in)
                    + now.port_dropped.saturating_sub(before.port_dropped),
                delivered: delivered_since(&self.cfg.port0, delivered_before),
                engine_done: now.engine_done_since(&before),
                counters: now,
            }
        });
        let veth_after = self.veth_drops_now();
        let veth_drop_counters = veth_after.since(&veth_before);
        // Port 1's sent count is read after the interface's drops: it may lag a moment.
        let received = now.out.saturating_sub(before.out);
        self.trials.push(VethTrial {
            frame_size,
            rate_pps: offered_pps,
            scheduled,
            offered,
            refused,
            behind: scheduled - attempted,
            send_s,
            veth_dropped: enobufs,
            veth_drop_counters,
            veth_delivered: veth_after.delivered_since(&veth_before),
            port_in: now.port_in - before.port_in,
            port_dropped: now.port_dropped.saturating_sub(before.port_dropped),
            received,
            out_dropped: now.out_dropped.saturating_sub(before.out_dropped),
            engine_dropped: now.engine_dropped.saturating_sub(before.engine_dropped),
            drained: !matches!(drained, Drained::TimedOut(_)),
            drain_missing: drained.missing(),
            drain_s: drain_start.elapsed().as_secs_f64(),
        });
        Ok(Trial {
            offered,
            received,
            latency: None,
        })
    }
}

/// `pfemu bench ports --search`'s settings: the device, the search, and whether to measure
/// the in-process filter beside it.
#[derive(Clone, Debug)]
pub struct PortsSearchConfig {
    /// The veth pair and the engine.
    pub device: VethDeviceConfig,
    /// The RFC 2544 search (sizes, line rate, loss tolerance, trials).
    pub search: LinerateConfig,
    /// Also run the in-process filter on each size's frames, PPE threads and the trial
    /// duration, once the search is over (it does not share the cores with the search).
    pub in_process: bool,
}

impl PortsSearchConfig {
    /// Checks every setting but the interfaces (which [`search`] checks when it binds
    /// them); the error names the first one at fault and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.search.validate()?;
        if self.device.ppe_threads == 0 {
            return Err(ConfigError::new("ppe_threads", "must be at least 1"));
        }
        // The frames' settings (flows).
        plain_ipv4(self.search.sizes[0], self.device.flows).map(|_| ())
    }
}

/// One frame size's throughput through the veth pair beside the in-process rate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SizeComparison {
    /// Frame size, bytes.
    pub frame_size: usize,
    /// The RFC 2544 throughput through the ports, Mpps (the search's result).
    pub ports_mpps: f64,
    /// The in-process filter's rate on the same frames and PPE threads, Mpps (it drops
    /// nothing: it runs as fast as the engine goes).
    pub in_process_mpps: Option<f64>,
    /// `ports_mpps / in_process_mpps`.
    pub ratio: Option<f64>,
}

/// What `pfemu bench ports --search` measured.
#[derive(Clone, Debug, Serialize)]
pub struct PortsSearchReport {
    /// PPE threads.
    pub ppe_threads: usize,
    /// The search's result, per frame size (every trial included).
    pub search: LinerateReport,
    /// Per frame size, the throughput beside the in-process rate.
    pub sizes: Vec<SizeComparison>,
    /// Where each trial's frames went, in the order run.
    pub trials: Vec<VethTrial>,
    /// The live run's final report (ports, engine), over all trials.
    pub live: LiveReport,
}

impl PortsSearchReport {
    /// Every trial drained and accounted for its frames ([`VethTrial::accounted`]), and
    /// the live run accounted for all of its own ([`LiveReport::accounted`]).
    pub fn accounted(&self) -> bool {
        self.live.accounted() && self.trials.iter().all(|t| t.drained && t.accounted())
    }
}

/// Why `pfemu bench ports --search` stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum PortsSearchError {
    /// The live ports could not start or stop.
    Live(LiveError),
    /// The search refused a setting or a trial failed.
    Search(LinerateError),
}

impl fmt::Display for PortsSearchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortsSearchError::Live(e) => e.fmt(f),
            PortsSearchError::Search(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PortsSearchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PortsSearchError::Live(e) => Some(e),
            PortsSearchError::Search(e) => Some(e),
        }
    }
}

impl From<LiveError> for PortsSearchError {
    fn from(e: LiveError) -> Self {
        PortsSearchError::Live(e)
    }
}

impl From<LinerateError> for PortsSearchError {
    fn from(e: LinerateError) -> Self {
        PortsSearchError::Search(e)
    }
}

impl From<ConfigError> for PortsSearchError {
    fn from(e: ConfigError) -> Self {
        PortsSearchError::Search(LinerateError::Config(e))
    }
}

/// Runs the RFC 2544 throughput search through the veth pair ([`VethDevice`],
/// [`linerate::search`]), telling `progress` of every trial; then, if asked, the
/// in-process filter on each size's frames. The settings are checked before any port
/// is bound, and every size against the interfaces' MTU before the first trial.
pub fn search(
    cfg: &PortsSearchConfig,
    progress: impl FnMut(Progress<'_>),
) -> Result<PortsSearchReport, PortsSearchError> {
    cfg.validate()?;
    let mut dev = VethDevice::start(&cfg.device)?;
    let result = cfg
        .search
        .sizes
        .iter()
        .try_for_each(|&s| dev.check_frame_size(s))
        .map_err(LinerateError::Config)
        .and_then(|()| linerate::search(&mut dev, &cfg.search, progress));
    let trials = dev.trials().to_vec();
    // Stopped whatever the search's outcome, so the ports and the engine's threads end.
    let live = dev.stop()?;
    let mut report = result?;
    report.program = Some("filter through a veth pair".to_string());
    let mut sizes = Vec::with_capacity(report.rows.len());
    for row in &report.rows {
        let in_process = if cfg.in_process {
            let traffic = plain_ipv4(row.frame_size, cfg.device.flows)?;
            Some(in_process_mpps(
                &traffic,
                row.frame_size,
                cfg.device.flows,
                cfg.device.ppe_threads,
                cfg.search.trial_duration.as_secs_f64(),
            )?)
        } else {
            None
        };
        sizes.push(SizeComparison {
            frame_size: row.frame_size,
            ports_mpps: row.mpps,
            in_process_mpps: in_process,
            ratio: in_process.map(|m| row.mpps / m.max(1e-9)),
        });
    }
    Ok(PortsSearchReport {
        ppe_threads: cfg.device.ppe_threads,
        search: report,
        sizes,
        trials,
        live,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(n: usize, errno: i32) -> Vec<std::io::Error> {
        (0..n)
            .map(|_| std::io::Error::from_raw_os_error(errno))
            .collect()
    }

    /// A burst the veth refuses whole with ENOBUFS (its backlog full) is offered and lost,
    /// and the generator goes on; other refusals are not offered.
    #[test]
    fn frames_refused_with_enobufs_are_offered_and_the_generator_goes_on() {
        let stop = AtomicBool::new(false);
        let mut bursts = vec![
            (0, errors(256, libc::ENOBUFS)),
            (100, errors(156, libc::ENOBUFS)),
            (250, errors(6, libc::EMSGSIZE)),
            (256, Vec::new()),
        ]
        .into_iter();
        let offer = offer_until(&stop, "gen0", || {
            let b = bursts.next().expect("stops after the last burst");
            if bursts.len() == 0 {
                stop.store(true, Ordering::Relaxed);
            }
            b
        });
        assert_eq!(bursts.len(), 0, "every burst was sent: {offer:?}");
        assert_eq!(
            (offer.accepted, offer.enobufs, offer.refused),
            (606, 412, 6),
            "{offer:?}"
        );
        assert_eq!(offer.offered(), 1018);
        assert_eq!(offer.stopped, None);
        assert!(
            offer
                .first_error
                .as_deref()
                .is_some_and(|e| e.contains("long")),
            "{offer:?}"
        );
    }

    /// A burst refused whole for another reason (the interface went down) stops the
    /// generator, saying why.
    #[test]
    fn a_burst_refused_whole_for_another_reason_stops_the_generator_saying_why() {
        let stop = AtomicBool::new(false);
        let mut calls = 0;
        let offer = offer_until(&stop, "gen0", || {
            calls += 1;
            match calls {
                1 => (256, Vec::new()),
                _ => (0, errors(256, libc::ENETDOWN)),
            }
        });
        assert_eq!(calls, 2);
        assert_eq!(
            (offer.accepted, offer.enobufs, offer.refused),
            (256, 0, 256)
        );
        let why = offer.stopped.expect("a reason");
        assert!(why.contains("gen0") && why.contains("down"), "{why}");
    }

    fn view(at_port0: u64, delivered: Option<u64>, engine_done: bool) -> DrainView {
        DrainView {
            at_port0,
            delivered,
            engine_done,
            counters: Snapshot {
                port_in: at_port0,
                ..Snapshot::default()
            },
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// A frame that comes after the counters have been still for longer than the old 3 ms
    /// stillness is still waited for: the drain ends on the count, not on the clock.
    #[test]
    fn a_drain_waits_for_a_late_frame_however_long_the_counters_were_still() {
        let mut d = Drain::new(100, VETH_DRAIN_DEADLINE);
        for t in 0..100 {
            assert_eq!(
                d.step(t * MS, &view(99, Some(100), true)),
                None,
                "at {t} ms"
            );
        }
        assert_eq!(
            d.step(50 * MS, &view(100, Some(100), true)),
            Some(Drained::Counted)
        );
    }

    /// Every frame counted ends the drain at once, without waiting for still counters;
    /// frames counted but not through the engine yet do not.
    #[test]
    fn a_drain_ends_on_the_count_once_the_engine_is_done() {
        let mut d = Drain::new(100, VETH_DRAIN_DEADLINE);
        assert_eq!(d.step(Duration::ZERO, &view(100, Some(100), false)), None);
        assert_eq!(d.step(MS, &view(100, Some(100), false)), None);
        assert_eq!(
            d.step(2 * MS, &view(100, Some(100), true)),
            Some(Drained::Counted)
        );
    }

    /// A kernel that lost frames silently (fewer reached port 0's interface than the veth
    /// took): once port 0 counts what arrived and the counters are still, the drain ends
    /// naming what is missing.
    #[test]
    fn a_drain_ends_on_still_counters_only_when_the_kernel_lost_frames_silently() {
        let mut d = Drain::new(100, VETH_DRAIN_DEADLINE);
        let lost = view(90, Some(90), true);
        assert_eq!(d.step(Duration::ZERO, &lost), None);
        assert_eq!(d.step(2 * MS, &lost), None);
        let Some(Drained::Quiet(m)) = d.step(3 * MS, &lost) else {
            panic!("the drain ends once the counters were still for 3 ms");
        };
        assert!(
            m.contains("90 of the 100") && m.contains("90 reached"),
            "{m}"
        );
        // Frames that reached the interface but not the port yet are waited for.
        let mut d = Drain::new(100, VETH_DRAIN_DEADLINE);
        for t in 0..100 {
            assert_eq!(d.step(t * MS, &view(90, Some(95), true)), None, "at {t} ms");
        }
    }

    /// At the deadline the drain ends, naming what is missing.
    #[test]
    fn a_drain_times_out_naming_what_is_missing() {
        let mut d = Drain::new(100, 10 * MS);
        assert_eq!(d.step(Duration::ZERO, &view(40, Some(100), false)), None);
        let Some(Drained::TimedOut(m)) = d.step(10 * MS, &view(40, Some(100), false)) else {
            panic!("the drain ends at its deadline");
        };
        assert!(
            m.contains("40 of the 100") && m.contains("engine was not done"),
            "{m}"
        );
    }

    /// The failure seen in CI and reproduced in a loop (about 1 trial in 50): the report
    /// read the engine with 198 frames in and resolved, then the ports with 200 injected.
    /// The engine is not done until it resolved what the ports injected.
    #[test]
    fn the_engine_is_done_only_with_every_frame_the_ports_injected() {
        let before = Snapshot {
            resolved: 7,
            packets_in: 7,
            injected: 7,
            ..Snapshot::default()
        };
        let at = |packets_in: u64, injected: u64, resolved: u64, in_flight: u64| Snapshot {
            port_in: injected,
            resolved,
            packets_in,
            injected,
            in_flight,
            ..before
        };
        assert!(
            !at(205, 207, 205, 0).engine_done_since(&before),
            "2 injected, unseen"
        );
        assert!(
            !at(207, 207, 205, 2).engine_done_since(&before),
            "2 in flight"
        );
        assert!(
            !at(207, 207, 206, 0).engine_done_since(&before),
            "1 unresolved"
        );
        assert!(at(207, 207, 207, 0).engine_done_since(&before));
        assert!(at(7, 7, 7, 0).engine_done_since(&before), "nothing taken");
    }

    /// Linux counts one veth drop on both ends: the larger increase, not the sum.
    #[test]
    fn veth_drops_take_the_larger_side_not_the_sum() {
        let d = |tx, rx| VethDrops {
            tx,
            rx,
            delivered: 0,
        };
        let before = d(10, 3);
        assert_eq!(d(15, 8).since(&before), 5);
        assert_eq!(d(10, 7).since(&before), 4);
        assert_eq!(d(9, 3).since(&before), 0, "a counter reset");
    }
}
