//! The summary every `pfemu bench <program>` prints, in the spirit of DPDK testpmd's port
//! statistics: packets and rates in and out, drops by reason, latency percentiles, how the
//! PPE threads shared the load, instructions and XTXNs per packet, and the emulator's
//! overhead against a plain Rust loop doing the program's work on the same packets; and, when
//! the engine was profiled (`--profile`), where its time went per stage.
//!
//! [`Summary::from_stats`] builds it from the engine's [`Stats`]; each program's report
//! carries one (field `summary`), and [`Summary::print`] writes the text form.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::pfe::{LatencyStats, StageCost, StageProfile, Stats};

/// Bytes a frame takes on the wire beyond its own: preamble (8) and inter-frame gap (12).
const WIRE_OVERHEAD_BYTES: u64 = super::traffic::L1_OVERHEAD_BYTES as u64;

/// What one benchmark run measured, program-independent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// The program measured.
    pub program: String,
    /// Seconds from the first frame in to the last frame out.
    pub elapsed_s: f64,
    /// Frames offered to the engine (ingress drops included).
    pub packets_in: u64,
    /// Their bytes (frames without FCS).
    pub bytes_in: u64,
    /// Frames that left the engine (multicast copies and created packets included).
    pub packets_out: u64,
    /// Their bytes.
    pub bytes_out: u64,
    /// Million frames per second in.
    pub mpps_in: f64,
    /// Million frames per second out.
    pub mpps_out: f64,
    /// Gbit/s of frame bytes in.
    pub gbps_in: f64,
    /// Gbit/s of frame bytes out.
    pub gbps_out: f64,
    /// Gbit/s in as a link carries them, with 20 bytes of preamble and gap per frame.
    pub gbps_in_on_wire: f64,
    /// Ingress packets dropped, over all reasons.
    pub dropped: u64,
    /// Drops by reason.
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// Ingress-to-egress latency of the packets that left (when measured).
    pub latency: Option<LatencyStats>,
    /// Packets each PPE thread processed.
    pub per_ppe_packets: Vec<u64>,
    /// Fewest and most packets of one PPE thread, as multiples of the mean (1.0 is an even
    /// share).
    pub ppe_load_min_max: (f64, f64),
    /// Mean instructions per packet.
    pub instructions_per_packet: f64,
    /// Mean XTXNs per packet, by kind.
    pub xtxns_per_packet: BTreeMap<String, f64>,
    /// A plain Rust loop doing the program's work on the same packets (one thread, no
    /// engine), in million packets per second; 0 when the program has none.
    pub plain_loop_mpps: f64,
    /// The emulator's overhead: plain loop / emulator (how many times faster the plain loop
    /// is). 0 without a plain loop.
    pub overhead_ratio: f64,
    /// Where the time went per stage, when the engine was profiled (`--profile`).
    pub profile: Option<ProfileSummary>,
}

/// Where an engine's time went per packet, stage by stage: its [`StageProfile`] divided by
/// the packets the PPE threads processed (`pfemu bench ... --profile`).
#[derive(Clone, Debug, Serialize)]
pub struct ProfileSummary {
    /// Packets the PPE threads processed: what the figures are per.
    pub packets: u64,
    /// Each busy stage ([`StageProfile::STAGES`]): nanoseconds summed over threads, per
    /// packet, and share of the busy time.
    pub stages: Vec<StageCost>,
    /// Nanoseconds per packet of every busy stage together.
    pub busy_ns_per_packet: f64,
    /// Nanoseconds per packet the PPE threads were parked for lack of work (not busy).
    pub parked_ns_per_packet: f64,
    /// Nanoseconds per packet the injecting threads waited for in-flight room (not busy).
    pub ingress_waiting_ns_per_packet: f64,
    /// Nanoseconds per packet the PPE threads ran on a core, by the kernel's count (0 where
    /// it gives none): [`StageProfile::on_core_ns`].
    pub on_core_ns_per_packet: f64,
    /// Nanoseconds per packet the PPE threads were runnable but waited for a core:
    /// [`StageProfile::runnable_ns`].
    pub runnable_ns_per_packet: f64,
}

impl ProfileSummary {
    /// The per-packet figures of `profile`.
    pub fn of(profile: &StageProfile) -> ProfileSummary {
        ProfileSummary {
            packets: profile.packets,
            stages: profile.costs().to_vec(),
            busy_ns_per_packet: profile.per_packet(profile.busy_ns()),
            parked_ns_per_packet: profile.per_packet(profile.parked_ns),
            ingress_waiting_ns_per_packet: profile.per_packet(profile.ingress_waiting_ns),
            on_core_ns_per_packet: profile.per_packet(profile.on_core_ns),
            runnable_ns_per_packet: profile.per_packet(profile.runnable_ns),
        }
    }

    /// The text form: a table of the busy stages (timers only when they ran), their total,
    /// and the waits.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "  Where the time went (ns per packet, all threads' time in each stage):"
        );
        let _ = writeln!(s, "    {:<10} {:>9} {:>7}", "stage", "ns/pkt", "share");
        let mut row = |stage: &str, ns_per_packet: f64, share: f64| {
            let _ = writeln!(
                s,
                "    {stage:<10} {ns_per_packet:>9.1} {:>6.1}%",
                share * 100.0
            );
        };
        for c in &self.stages {
            if c.stage != "timers" || c.ns > 0 {
                row(c.stage, c.ns_per_packet, c.share);
            }
        }
        let all = if self.busy_ns_per_packet > 0.0 {
            1.0
        } else {
            0.0
        };
        row("total", self.busy_ns_per_packet, all);
        let _ = writeln!(
            s,
            "    waiting, not in the total: PPE threads parked {:.1} ns/pkt, injectors waiting \
             for room {:.1} ns/pkt ({} packets)",
            self.parked_ns_per_packet, self.ingress_waiting_ns_per_packet, self.packets
        );
        if self.on_core_ns_per_packet > 0.0 {
            let _ = writeln!(
                s,
                "    the kernel's count for the PPE threads: on a core {:.1} ns/pkt, runnable but \
                 waiting for a core {:.1} ns/pkt (inside the stages' wall-clock times)",
                self.on_core_ns_per_packet, self.runnable_ns_per_packet
            );
        }
        s
    }
}

impl Summary {
    /// The summary of a run of `program` that took `elapsed` and offered `bytes_in` bytes,
    /// from the engine's final `stats`.
    pub fn from_stats(program: &str, stats: &Stats, elapsed: Duration, bytes_in: u64) -> Summary {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let processed = stats.processed().max(1) as f64;
        let threads = stats.per_ppe_packets.len().max(1) as f64;
        let mean = stats.processed() as f64 / threads;
        let (min, max) = stats
            .per_ppe_packets
            .iter()
            .fold((u64::MAX, 0u64), |(lo, hi), &n| (lo.min(n), hi.max(n)));
        let share = |n: u64| if mean > 0.0 { n as f64 / mean } else { 0.0 };
        Summary {
            program: program.to_string(),
            elapsed_s: secs,
            packets_in: stats.packets_in,
            bytes_in,
            packets_out: stats.frames_tx,
            bytes_out: stats.bytes_tx,
            mpps_in: stats.packets_in as f64 / secs / 1e6,
            mpps_out: stats.frames_tx as f64 / secs / 1e6,
            gbps_in: bytes_in as f64 * 8.0 / secs / 1e9,
            gbps_out: stats.bytes_tx as f64 * 8.0 / secs / 1e9,
            gbps_in_on_wire: (bytes_in + WIRE_OVERHEAD_BYTES * stats.packets_in) as f64 * 8.0
                / secs
                / 1e9,
            dropped: stats.dropped,
            dropped_by_reason: stats.dropped_by_reason.clone(),
            latency: stats.latency,
            per_ppe_packets: stats.per_ppe_packets.clone(),
            ppe_load_min_max: if stats.per_ppe_packets.is_empty() {
                (0.0, 0.0)
            } else {
                (share(min), share(max))
            },
            instructions_per_packet: stats.instructions as f64 / processed,
            xtxns_per_packet: stats
                .xtxns
                .iter()
                .map(|(k, &n)| (k.clone(), n as f64 / processed))
                .collect(),
            plain_loop_mpps: 0.0,
            overhead_ratio: 0.0,
            profile: stats.profile.as_ref().map(ProfileSummary::of),
        }
    }

    /// Records the plain loop's rate and the overhead ratio it gives.
    pub fn with_plain_loop(mut self, plain_mpps: f64) -> Summary {
        self.plain_loop_mpps = plain_mpps;
        self.overhead_ratio = if self.mpps_in > 0.0 {
            plain_mpps / self.mpps_in
        } else {
            0.0
        };
        self
    }

    /// The text form: one block, testpmd-like.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let rule = "-".repeat(20);
        let _ = writeln!(s, "  {rule} pfemu bench {} {rule}", self.program);
        let _ = writeln!(
            s,
            "  RX-packets: {:<12} RX-bytes: {:<14} {:>8.2} Mpps {:>8.2} Gbit/s ({:.2} on the wire)",
            self.packets_in, self.bytes_in, self.mpps_in, self.gbps_in, self.gbps_in_on_wire
        );
        let _ = writeln!(
            s,
            "  TX-packets: {:<12} TX-bytes: {:<14} {:>8.2} Mpps {:>8.2} Gbit/s",
            self.packets_out, self.bytes_out, self.mpps_out, self.gbps_out
        );
        let reasons: Vec<String> = self
            .dropped_by_reason
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  Dropped:    {:<12} {}",
            self.dropped,
            if reasons.is_empty() {
                String::new()
            } else {
                format!("({})", reasons.join(", "))
            }
        );
        if let Some(l) = &self.latency {
            let _ = writeln!(
                s,
                "  Latency:    p50 {}  p99 {}  p99.9 {}  max {}  ({} packets, ingress to egress)",
                fmt_ns(l.p50_ns),
                fmt_ns(l.p99_ns),
                fmt_ns(l.p999_ns),
                fmt_ns(l.max_ns),
                l.count
            );
        }
        let _ = writeln!(
            s,
            "  PPE load:   {} threads, {:.2}x to {:.2}x of an even share",
            self.per_ppe_packets.len(),
            self.ppe_load_min_max.0,
            self.ppe_load_min_max.1
        );
        let xtxns: Vec<String> = self
            .xtxns_per_packet
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        let _ = writeln!(
            s,
            "  Per packet: {:.2} instructions, {:.2} XTXNs{}",
            self.instructions_per_packet,
            self.xtxns_per_packet.values().sum::<f64>(),
            if xtxns.is_empty() {
                String::new()
            } else {
                format!(" ({})", xtxns.join(", "))
            }
        );
        if self.plain_loop_mpps > 0.0 {
            let _ = writeln!(
                s,
                "  Plain loop: {:.2} Mpps on one thread; overhead {:.2}x (plain loop / emulator)",
                self.plain_loop_mpps, self.overhead_ratio
            );
        }
        let _ = writeln!(s, "  Elapsed:    {:.3} s", self.elapsed_s);
        if let Some(p) = &self.profile {
            s.push_str(&p.render());
        }
        s
    }

    /// Prints [`Summary::render`] to standard output.
    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// Nanoseconds in the unit that reads best (ns, us, ms).
pub fn fmt_ns(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns} ns"),
        10_000..=9_999_999 => format!("{:.1} us", ns as f64 / 1e3),
        _ => format!("{:.2} ms", ns as f64 / 1e6),
    }
}

/// Frames [`RunLength::offer`] injects between two looks at the clock and the progress
/// callback.
pub const OFFER_BURST: usize = 1 << 16;

/// How long a run goes on: a number of packets, or a duration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum RunLength {
    /// Offer this many frames.
    Packets(u64),
    /// Offer frames for this long (checked between bursts).
    Duration(Duration),
}

impl RunLength {
    /// Whether a run that started at `start` and offered `offered` frames is done.
    pub fn done(&self, start: Instant, offered: u64) -> bool {
        match *self {
            RunLength::Packets(n) => offered >= n,
            RunLength::Duration(d) => start.elapsed() >= d,
        }
    }

    /// Offers frames `0..pool` of a pre-built pool to `pfe`, replayed from the start, in
    /// bursts of [`OFFER_BURST`] (the fast path), until the run that started at `start`
    /// is done, calling `progress(fraction done, frames offered)` after each burst; the
    /// frames offered. `frame(i)` is the `i`-th frame and the port it arrives on. Refuses
    /// an empty pool, and names an engine that stopped taking frames as `start`.
    pub fn offer<'f>(
        &self,
        pfe: &crate::pfe::Pfe,
        start: Instant,
        pool: usize,
        frame: impl Fn(usize) -> (crate::packet::Port, &'f [u8]),
        mut progress: impl FnMut(f64, u64),
    ) -> Result<u64, crate::ConfigError> {
        if pool == 0 {
            return Err(crate::ConfigError::new("traffic", "no frames to replay"));
        }
        let mut offered = 0u64;
        while !self.done(start, offered) {
            // The next burst of the pool, not past its end nor past the packet count.
            let at = (offered % pool as u64) as usize;
            let mut len = OFFER_BURST.min(pool - at);
            if let RunLength::Packets(total) = *self {
                len = len.min((total - offered) as usize);
            }
            pfe.inject_burst((at..at + len).map(&frame))
                .map_err(|e| crate::ConfigError::new("start", e.to_string()))?;
            offered += len as u64;
            progress(self.progress(start, offered), offered);
        }
        Ok(offered)
    }

    /// How far along a run is, in 0..=1.
    pub fn progress(&self, start: Instant, offered: u64) -> f64 {
        match *self {
            RunLength::Packets(n) => (offered as f64 / n.max(1) as f64).min(1.0),
            RunLength::Duration(d) => {
                (start.elapsed().as_secs_f64() / d.as_secs_f64().max(1e-9)).min(1.0)
            }
        }
    }
}

/// A progress bar on standard error while a run goes on, when standard error is a terminal
/// (nothing otherwise, and nothing with `quiet`).
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// A bar labelled `label`, hidden when `quiet` or when standard error is not a terminal.
    pub fn new(label: &str, quiet: bool) -> Progress {
        use std::io::IsTerminal;
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(1000);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{prefix} [{bar:40}] {percent:>3}% {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(label.to_string());
            bar
        });
        Progress { bar }
    }

    /// A spinner on standard error for work of unknown length (e.g. building a table), with
    /// `label`; hidden when `quiet` or when standard error is not a terminal.
    pub fn spinner(label: &str, quiet: bool) -> Progress {
        use std::io::IsTerminal;
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_message(label.to_string());
            bar.enable_steady_tick(std::time::Duration::from_millis(100));
            bar
        });
        Progress { bar }
    }

    /// Moves the bar to `fraction` (0..=1) with a message (e.g. the packets so far).
    pub fn set(&self, fraction: f64, msg: impl Into<std::borrow::Cow<'static, str>>) {
        if let Some(b) = &self.bar {
            b.set_position((fraction.clamp(0.0, 1.0) * 1000.0) as u64);
            b.set_message(msg);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_shares_and_overhead_follow_the_stats() {
        let mut stats = Stats {
            packets_in: 2_000_000,
            frames_tx: 1_500_000,
            bytes_tx: 96_000_000,
            dropped: 500_000,
            instructions: 6_000_000,
            per_ppe_packets: vec![900_000, 1_100_000],
            ..Stats::default()
        };
        stats.dropped_by_reason.insert("non_ip".into(), 500_000);
        stats.xtxns.insert("counter_inc".into(), 500_000);
        let s = Summary::from_stats("filter", &stats, Duration::from_secs(2), 128_000_000)
            .with_plain_loop(4.0);
        assert_eq!(s.mpps_in, 1.0);
        assert_eq!(s.mpps_out, 0.75);
        assert!((s.gbps_in - 0.512).abs() < 1e-12);
        // 64-byte frames: 84 bytes each on the wire.
        assert!((s.gbps_in_on_wire - 0.672).abs() < 1e-12);
        assert_eq!(s.ppe_load_min_max, (0.9, 1.1));
        assert_eq!(s.instructions_per_packet, 3.0);
        assert_eq!(s.xtxns_per_packet["counter_inc"], 0.25);
        assert_eq!(s.overhead_ratio, 4.0);
        let text = s.render();
        for want in [
            "RX-packets: 2000000",
            "non_ip 500000",
            "overhead 4.00x",
            "counter_inc 0.25",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        let json = serde_json::to_value(&s).unwrap();
        for key in [
            "mpps_in",
            "gbps_out",
            "dropped_by_reason",
            "latency",
            "overhead_ratio",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn the_profile_table_lists_the_busy_stages_per_packet_and_the_waits_apart() {
        let profile = StageProfile {
            packets: 1000,
            ingress_ns: 10_000,
            ingress_waiting_ns: 7_000,
            dispatch_ns: 5_000,
            parked_ns: 3_000,
            program_ns: 20_000,
            reorder_ns: 8_000,
            sink_ns: 2_000,
            egress_ns: 5_000,
            timers_ns: 0,
            on_core_ns: 0,
            runnable_ns: 0,
        };
        let stats = Stats {
            profile: Some(profile),
            ..Stats::default()
        };
        let s = Summary::from_stats("filter", &stats, Duration::from_secs(1), 0);
        let p = s
            .profile
            .as_ref()
            .expect("a profiled run's summary has its profile");
        assert_eq!(p.busy_ns_per_packet, 50.0);
        assert_eq!(p.parked_ns_per_packet, 3.0);
        assert_eq!(p.ingress_waiting_ns_per_packet, 7.0);
        let text = s.render();
        for want in [
            "Where the time went",
            "ingress         10.0   20.0%",
            "program         20.0   40.0%",
            "total           50.0  100.0%",
            "parked 3.0 ns/pkt, injectors waiting for room 7.0 ns/pkt",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        assert!(!text.contains("timers"), "no timers ran: no row\n{text}");
        // No count from the kernel, no line for it; with one, its figures per packet.
        assert!(!text.contains("on a core"), "{text}");
        let counted = ProfileSummary::of(&StageProfile {
            on_core_ns: 40_000,
            runnable_ns: 4_000,
            ..profile
        });
        assert!(counted
            .render()
            .contains("on a core 40.0 ns/pkt, runnable but waiting for a core 4.0 ns/pkt"));
        let with_timers = ProfileSummary::of(&StageProfile {
            timers_ns: 1_000,
            ..profile
        });
        assert!(with_timers.render().contains("timers"));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["profile"]["stages"][2]["stage"], "program");
        assert!(
            Summary::from_stats("filter", &Stats::default(), Duration::from_secs(1), 0)
                .profile
                .is_none()
        );
    }

    #[test]
    fn run_lengths_end_by_count_or_time() {
        let start = Instant::now();
        assert!(!RunLength::Packets(10).done(start, 9));
        assert!(RunLength::Packets(10).done(start, 10));
        assert_eq!(RunLength::Packets(10).progress(start, 5), 0.5);
        assert!(RunLength::Duration(Duration::ZERO).done(start, 0));
        assert!(!RunLength::Duration(Duration::from_secs(3600)).done(start, u64::MAX));
    }

    #[test]
    fn nanoseconds_read_in_their_unit() {
        assert_eq!(fmt_ns(950), "950 ns");
        assert_eq!(fmt_ns(12_345), "12.3 us");
        assert_eq!(fmt_ns(12_345_678), "12.35 ms");
    }
}
