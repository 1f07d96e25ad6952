//! The l3fwd benchmark: [`crate::microcode::l3fwd`] on pre-generated IPv4/UDP traffic
//! through the full PFE, against a plain single-threaded Rust loop doing the same work.
//!
//! [`prepare`] builds the workload before any clock starts: the routes (generated, or
//! read from a route file), their DIR-24-8 table, and a pool of up to [`POOL_MAX`] frames
//! replayed until `packets` frames have been offered. Each frame belongs to one of `flows`
//! flows; a flow's destination is a random address inside a random route, so most
//! destinations hit and the table's whole range is used. A configurable share of frames is
//! made invalid (one class per drop reason, in turn), 0 by default so the figure measures
//! forwarding. The expected fate of every frame (the egress port the reference
//! longest-prefix match gives, or the drop reason) is recorded when it is generated.
//!
//! [`run_on`] then times two things on the same frames:
//!
//! - the emulator: the clock runs from the first injected frame until the engine has
//!   drained, so every packet counted has left (`mpps`);
//! - the plain loop: one thread, no engine: copy the head out of the frame as ingress
//!   does, validate, look up the same DIR-24-8 words in a plain `Vec`, decrement the TTL
//!   with the incremental checksum update and rewrite the MACs (`baseline_mpps`).
//!
//! `verified` holds when every packet is accounted for and the forwarded counts per port
//! and the drops per reason of both the emulator and the plain loop equal the expectation.
//!
//! ```no_run
//! use pfemu::lab::bench::l3fwd::{run, L3fwdBenchConfig};
//!
//! let report = run(&L3fwdBenchConfig::default())?;
//! println!("{:.1} Mpps ({:.2} of the plain loop)", report.mpps, report.ratio_to_baseline);
//! assert!(report.verified);
//! # Ok::<(), pfemu::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::report::{RunLength, Summary};
use super::EngineSettings;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::l3fwd::{
    check_ipv4, rewrite_head, write_udp_frame, Dir248, L3Drop, L3fwd, RouteTable, DROP_REASONS,
    ENTRY_TBL8,
};
use crate::packet::{Port, DEFAULT_HEAD_BYTES};
use crate::pfe::Stats;
use crate::pfe::{CountingSink, Pfe};
use crate::rng::SplitMix64;
use crate::wire::{Ipv4, ETHERTYPE_ARP};
use crate::ConfigError;

/// Most distinct frames generated for one run; longer runs replay them.
pub const POOL_MAX: usize = 1 << 20;
/// Smallest accepted frame size (Ethernet + IPv4 + UDP headers, padded to the Ethernet
/// minimum).
pub const MIN_FRAME_SIZE: usize = 64;
/// Largest accepted frame size.
pub const MAX_FRAME_SIZE: usize = 9216;
/// Most flows.
pub const MAX_FLOWS: u32 = 1 << 24;

const ETH_LEN: usize = 14;

/// One benchmark configuration; as command-line options, those of `pfemu bench l3fwd`
/// (defaults from [`L3fwdBenchConfig::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct L3fwdBenchConfig {
    /// Frames to offer (replayed from a pool of at most a million).
    #[arg(long, default_value_t = L3fwdBenchConfig::default().packets)]
    pub packets: u64,
    /// Frame size in bytes, Ethernet header included, FCS excluded (64..=9216).
    #[arg(long, default_value_t = L3fwdBenchConfig::default().size)]
    pub size: usize,
    /// Routes generated (a realistic mix: mostly /24, then /16-/23, a few longer; ignored
    /// with `--route-file`).
    #[arg(long, default_value_t = L3fwdBenchConfig::default().routes)]
    pub routes: usize,
    /// Read the routes from this file instead of generating them: one `A.B.C.D/LEN PORT`
    /// per line, `#` comments.
    #[arg(long, value_name = "FILE")]
    pub route_file: Option<PathBuf>,
    /// Egress ports the generated routes spread over; also the engine's port count (with
    /// a route file, raised to cover its highest port).
    #[arg(long, default_value_t = L3fwdBenchConfig::default().ports)]
    pub ports: u16,
    /// Distinct flows (5-tuples, each with its own destination).
    #[arg(long, default_value_t = L3fwdBenchConfig::default().flows)]
    pub flows: u32,
    /// Percent of frames made invalid (0 to 100), one drop class after another (bad
    /// checksum, TTL 1, ...).
    #[arg(long, default_value_t = L3fwdBenchConfig::default().invalid_percent)]
    pub invalid_percent: u32,
    /// The engine.
    #[serde(flatten)]
    #[command(flatten)]
    pub engine: EngineSettings,
    /// Seed of the routes and the traffic.
    #[arg(long, default_value_t = L3fwdBenchConfig::default().seed)]
    pub seed: u64,
    /// Offer frames for this many seconds instead of `packets` frames (`--duration`).
    #[arg(long = "duration", value_name = "SECONDS", value_parser = super::settings::parse_secs,
          help = "Offer frames for this many seconds instead of --packets frames")]
    pub duration_s: Option<f64>,
}

impl Default for L3fwdBenchConfig {
    /// 10 000 000 frames of 64 bytes, 100 000 generated routes over 16 ports, 1024 flows,
    /// no invalid frames, seed 1, the default [`EngineSettings`] with 2 PPE threads.
    fn default() -> Self {
        L3fwdBenchConfig {
            packets: 10_000_000,
            size: 64,
            routes: 100_000,
            route_file: None,
            ports: 16,
            flows: 1024,
            invalid_percent: 0,
            engine: EngineSettings {
                ppe_threads: 2,
                ..EngineSettings::default()
            },
            seed: 1,
            duration_s: None,
        }
    }
}

impl L3fwdBenchConfig {
    /// Checks every setting; the error names the setting at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.packets == 0 {
            return Err(ConfigError::new("packets", "must be at least 1"));
        }
        if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&self.size) {
            return Err(ConfigError::new(
                "size",
                format!(
                    "must be in {MIN_FRAME_SIZE}..={MAX_FRAME_SIZE} bytes, got {}",
                    self.size
                ),
            ));
        }
        if self.route_file.is_none() && self.routes == 0 {
            return Err(ConfigError::new(
                "routes",
                "must be at least 1 (or give a route file)",
            ));
        }
        if self.ports == 0 {
            return Err(ConfigError::new("ports", "must be at least 1"));
        }
        if !(1..=MAX_FLOWS).contains(&self.flows) {
            return Err(ConfigError::new(
                "flows",
                format!("must be in 1..={MAX_FLOWS}, got {}", self.flows),
            ));
        }
        if let Some(s) = self.duration_s {
            crate::duration::secs_setting("duration", s)?;
        }
        if self.invalid_percent > 100 {
            return Err(ConfigError::new(
                "invalid_percent",
                format!("must be 0 to 100, got {}", self.invalid_percent),
            ));
        }
        Ok(())
    }
}

/// The result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct L3fwdBenchReport {
    /// The configuration measured.
    pub config: L3fwdBenchConfig,
    /// Routes in the table.
    pub routes: usize,
    /// Routes per prefix length.
    pub route_lengths: BTreeMap<u8, usize>,
    /// tbl8 groups the table needed (one per /24 holding a route longer than /24).
    pub tbl8_groups: usize,
    /// PPE threads (repeated at top level for scripts).
    pub ppe_threads: usize,
    /// The engine's counters of the run (frames offered `packets_in`, forwarded
    /// `packets_out`, `dropped` and `dropped_by_reason`, `per_ppe_packets`, `reorder_held`,
    /// ...), at the report's top level in JSON.
    #[serde(flatten)]
    pub stats: Stats,
    /// Frames forwarded per egress port (ports with traffic only).
    pub forwarded_by_port: BTreeMap<u16, u64>,
    /// Seconds from the first frame in to the last frame out.
    pub elapsed_s: f64,
    /// Million packets per second offered and fully processed by the emulator.
    pub mpps: f64,
    /// Gbit/s of frames processed (frame bytes only).
    pub gbps: f64,
    /// Mean instructions per packet.
    pub instructions_per_packet: f64,
    /// Mean XTXNs per packet, all kinds.
    pub xtxns_per_packet: f64,
    /// Mean XTXNs per packet, by kind.
    pub xtxns_per_packet_by_kind: BTreeMap<String, f64>,
    /// Million packets per second of the plain loop (one thread, no engine).
    pub baseline_mpps: f64,
    /// Seconds the plain loop took.
    pub baseline_elapsed_s: f64,
    /// `mpps / baseline_mpps`.
    pub ratio_to_baseline: f64,
    /// Every packet accounted for, and the emulator's and the plain loop's forwarded
    /// counts per port and drops per reason equal those the reference longest-prefix
    /// match and the generated invalid classes predict.
    pub verified: bool,
    /// The common report: rates in and out, drops, latency, PPE load, the plain loop.
    pub summary: Summary,
}

/// What should happen to a generated frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Forward(Port),
    /// Dropped for this reason.
    Drop(L3Drop),
}

/// A prepared workload: routes, their DIR-24-8 table and the frame pool.
#[derive(Clone, Debug)]
pub struct L3fwdWorkload {
    routes: RouteTable,
    table: Dir248,
    ports: u16,
    size: usize,
    bytes: Vec<u8>,
    in_ports: Vec<u16>,
    expect: Vec<Expect>,
}

impl L3fwdWorkload {
    /// Frames in the pool.
    pub fn len(&self) -> usize {
        self.expect.len()
    }

    /// Whether the pool is empty (never true for a prepared workload).
    pub fn is_empty(&self) -> bool {
        self.expect.is_empty()
    }

    /// Frame `i` of the pool.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn frame(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.size..(i + 1) * self.size]
    }

    /// The ingress port of frame `i`.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn in_port(&self, i: usize) -> Port {
        self.in_ports[i]
    }

    /// Egress ports the routes use (`0..ports`).
    pub fn ports(&self) -> u16 {
        self.ports
    }

    /// The routes.
    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    /// The routes' DIR-24-8 table.
    pub fn table(&self) -> &Dir248 {
        &self.table
    }

    /// The expected forwarded counts per port and drops per reason of the first `n`
    /// frames of the pool replayed to `packets` frames.
    fn expected(&self, packets: u64) -> (Vec<u64>, [u64; DROP_REASONS.len()]) {
        let mut fwd = vec![0u64; usize::from(self.ports)];
        let mut drops = [0u64; DROP_REASONS.len()];
        let n = self.len() as u64;
        let (rounds, rest) = (packets / n, (packets % n) as usize);
        for (i, e) in self.expect.iter().enumerate() {
            let times = rounds + u64::from(i < rest);
            match *e {
                Expect::Forward(p) => fwd[usize::from(p)] += times,
                Expect::Drop(r) => drops[r as usize] += times,
            }
        }
        (fwd, drops)
    }
}

/// Builds the routes, their table and the frame pool of `cfg` (deterministic from the
/// seed).
pub fn prepare(cfg: &L3fwdBenchConfig) -> Result<L3fwdWorkload, ConfigError> {
    cfg.validate()?;
    let route_err =
        |e: crate::microcode::l3fwd::L3fwdError| ConfigError::new("routes", e.to_string());
    let routes = match &cfg.route_file {
        Some(path) => RouteTable::from_file(path)
            .map_err(|e| ConfigError::new("route_file", e.to_string()))?,
        None => RouteTable::generate(cfg.routes, cfg.ports, cfg.seed).map_err(route_err)?,
    };
    if routes.is_empty() {
        return Err(ConfigError::new("route_file", "holds no route"));
    }
    let ports = routes
        .next_hops()
        .iter()
        .map(|nh| nh.port)
        .max()
        .map_or(cfg.ports, |p| cfg.ports.max(p.saturating_add(1)));
    let table = Dir248::build(&routes).map_err(route_err)?;
    let all = routes.routes();

    // Flows: a destination inside a random route, a source, an ingress port.
    let mut rng = SplitMix64::new(cfg.seed ^ 0x13F0_0D13_F00D);
    let flows: Vec<(u32, u32, u16, Port)> = (0..cfg.flows)
        .map(|f| {
            let r = all[rng.below(all.len() as u64) as usize];
            let host = if r.len == 32 {
                0
            } else {
                rng.next_u64() as u32 & !crate::microcode::l3fwd::mask(r.len)
            };
            let dst = r.prefix | host;
            let [_, a, b, c] = f.to_be_bytes();
            let src = u32::from_be_bytes([10, a, b, c]);
            (
                dst,
                src,
                1024 + (f % 50_000) as u16,
                (f % u32::from(ports)) as Port,
            )
        })
        .collect();
    let flow_expect: Vec<Expect> = flows
        .iter()
        .map(|&(dst, ..)| match routes.lookup_port(dst) {
            Some(p) => Expect::Forward(p),
            None => Expect::Drop(L3Drop::NoRoute),
        })
        .collect();
    // An address no route covers, for invalid `no_route` frames (none if the table covers
    // everything).
    let uncovered = (0..10_000)
        .map(|_| rng.next_u64() as u32)
        .find(|&a| routes.lookup(a).is_none());

    let pool = (cfg.packets as usize).min(POOL_MAX);
    let size = cfg.size;
    let mut bytes = vec![0u8; pool * size];
    let mut in_ports = Vec::with_capacity(pool);
    let mut expect = Vec::with_capacity(pool);
    let mut invalid_turn = 0usize;
    for (i, frame) in bytes.chunks_exact_mut(size).enumerate() {
        let f = rng.below(u64::from(cfg.flows)) as usize;
        let (dst, src, sport, in_port) = flows[f];
        write_udp_frame(frame, dst, src, sport, 64);
        for (j, b) in frame[ETH_LEN + 28..].iter_mut().enumerate() {
            *b = (i + j) as u8;
        }
        in_ports.push(in_port);
        let invalid = cfg.invalid_percent > 0 && (rng.below(100) as u32) < cfg.invalid_percent;
        if !invalid {
            expect.push(flow_expect[f]);
            continue;
        }
        let class = INVALID_CLASSES[invalid_turn % INVALID_CLASSES.len()];
        invalid_turn += 1;
        expect.push(Expect::Drop(make_invalid(frame, class, uncovered)));
    }
    Ok(L3fwdWorkload {
        routes,
        table,
        ports,
        size,
        bytes,
        in_ports,
        expect,
    })
}

/// The invalid classes generated, in turn (a frame of 64 bytes or more cannot be
/// truncated).
const INVALID_CLASSES: [L3Drop; 7] = [
    L3Drop::NonIpv4,
    L3Drop::BadVersion,
    L3Drop::BadIhl,
    L3Drop::BadLength,
    L3Drop::BadChecksum,
    L3Drop::TtlExceeded,
    L3Drop::NoRoute,
];

/// Makes a valid frame invalid in `class`; returns the drop reason it will get.
fn make_invalid(frame: &mut [u8], class: L3Drop, uncovered: Option<u32>) -> L3Drop {
    let size = frame.len();
    let mut ip = Ipv4::new_unchecked(&mut frame[ETH_LEN..]);
    match class {
        L3Drop::NonIpv4 => {
            frame[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
            return L3Drop::NonIpv4;
        }
        L3Drop::BadVersion => ip.set_ver(6),
        L3Drop::BadIhl => ip.set_ihl(4),
        L3Drop::BadLength => ip.set_total_len((size - ETH_LEN + 1) as u16),
        L3Drop::BadChecksum => {
            let c = ip.checksum();
            ip.set_checksum(c ^ 0x0100);
            return L3Drop::BadChecksum;
        }
        L3Drop::TtlExceeded => ip.set_ttl(1),
        _ => match uncovered {
            Some(a) => ip.set_dst(a),
            // Every address is routed: make it a checksum error instead.
            None => {
                let c = ip.checksum();
                ip.set_checksum(c ^ 0x0100);
                return L3Drop::BadChecksum;
            }
        },
    }
    ip.set_checksum(0);
    ip.fill_checksum();
    class
}

/// Prepares the workload of `cfg` and runs it once.
pub fn run(cfg: &L3fwdBenchConfig) -> Result<L3fwdBenchReport, ConfigError> {
    let w = prepare(cfg)?;
    run_on(cfg, &w)
}

/// Runs a prepared workload (from [`prepare`] with the same routes, size and traffic
/// settings) through the emulator and the plain loop, replayed to `cfg.packets` frames.
pub fn run_on(cfg: &L3fwdBenchConfig, w: &L3fwdWorkload) -> Result<L3fwdBenchReport, ConfigError> {
    run_with_progress(cfg, w, |_, _| {})
}

/// [`run_on`], calling `progress(fraction done, frames offered)` as the run goes on.
pub fn run_with_progress(
    cfg: &L3fwdBenchConfig,
    w: &L3fwdWorkload,
    mut progress: impl FnMut(f64, u64),
) -> Result<L3fwdBenchReport, ConfigError> {
    cfg.validate()?;
    let length = match cfg.duration_s {
        Some(s) => RunLength::Duration(crate::duration::secs_setting("duration", s)?),
        None => RunLength::Packets(cfg.packets),
    };

    // The emulator.
    let dram = MemConfig::default()
        .dram_bytes
        .max(w.table.dram_bytes().next_multiple_of(64));
    let sram = MemConfig::default()
        .sram_bytes
        .max((w.table.sram_bytes() + 64).next_multiple_of(64));
    let mem = Arc::new(SharedMemory::new(&MemConfig {
        dram_bytes: dram,
        sram_bytes: sram,
        acc_bytes: 0,
        ..MemConfig::default()
    })?);
    let l3fwd = L3fwd::install_table(&mem, &w.table)
        .map_err(|e| ConfigError::new("memory", e.to_string()))?;
    let sink = Arc::new(CountingSink::new(usize::from(w.ports)));
    let mut pfe = cfg
        .engine
        .apply(Pfe::builder())
        .program(l3fwd.program())
        .memory(mem)
        .ports(usize::from(w.ports))
        .sink(sink.clone())
        .build()?;
    pfe.start()
        .map_err(|e| ConfigError::new("start", e.to_string()))?;
    let start = Instant::now();
    let frame = |i| (w.in_ports[i], w.frame(i));
    let offered = length.offer(&pfe, start, w.len(), frame, &mut progress)?;
    pfe.drain();
    let (exp_fwd, exp_drops) = w.expected(offered);
    let elapsed_d = start.elapsed();
    let elapsed = elapsed_d.as_secs_f64();
    let stats = pfe.shutdown();

    // The plain loop, on the same frames.
    let (base_elapsed, base_fwd, base_drops) = plain_loop(w, offered);

    let forwarded_by_port: BTreeMap<u16, u64> = (0..w.ports)
        .map(|p| (p, sink.packets(p)))
        .filter(|&(_, c)| c > 0)
        .collect();
    let emu_fwd: Vec<u64> = (0..w.ports).map(|p| sink.packets(p)).collect();
    let drops_match = DROP_REASONS
        .iter()
        .zip(exp_drops)
        .all(|(r, e)| stats.drops(r) == e);
    let verified = stats.is_conserved()
        && stats.in_flight == 0
        && stats.packets_in == offered
        && stats.packets_out == exp_fwd.iter().sum::<u64>()
        && stats.dropped == exp_drops.iter().sum::<u64>()
        && drops_match
        && emu_fwd == exp_fwd
        && base_fwd == exp_fwd
        && base_drops == exp_drops;

    let processed = stats.processed().max(1) as f64;
    let mpps = stats.packets_in as f64 / elapsed / 1e6;
    let baseline_mpps = offered as f64 / base_elapsed / 1e6;
    let summary = Summary::from_stats(
        "l3fwd",
        &stats,
        elapsed_d,
        stats.packets_in * cfg.size as u64,
    )
    .with_plain_loop(baseline_mpps);
    Ok(L3fwdBenchReport {
        config: cfg.clone(),
        routes: w.routes.len(),
        route_lengths: w.routes.length_histogram(),
        tbl8_groups: w.table.tbl8_groups(),
        ppe_threads: cfg.engine.ppe_threads,
        forwarded_by_port,
        elapsed_s: elapsed,
        mpps,
        gbps: (stats.packets_in * cfg.size as u64) as f64 * 8.0 / elapsed / 1e9,
        instructions_per_packet: stats.instructions_per_packet(),
        xtxns_per_packet: stats.xtxns.values().sum::<u64>() as f64 / processed,
        xtxns_per_packet_by_kind: stats
            .xtxns
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64 / processed))
            .collect(),
        baseline_mpps,
        baseline_elapsed_s: base_elapsed,
        ratio_to_baseline: if baseline_mpps > 0.0 {
            mpps / baseline_mpps
        } else {
            0.0
        },
        verified,
        summary,
        stats,
    })
}

/// The plain loop: `packets` frames of the pool, one thread, no engine. Returns the
/// seconds it took, forwarded frames per port and drops per reason.
fn plain_loop(w: &L3fwdWorkload, packets: u64) -> (f64, Vec<u64>, [u64; DROP_REASONS.len()]) {
    let mut fwd = vec![0u64; usize::from(w.ports)];
    let mut drops = [0u64; DROP_REASONS.len()];
    let mut head = [0u8; DEFAULT_HEAD_BYTES];
    let n = w.len();
    let start = Instant::now();
    let mut left = packets;
    while left > 0 {
        let batch = left.min(n as u64) as usize;
        for i in 0..batch {
            let frame = w.frame(i);
            let hl = frame.len().min(DEFAULT_HEAD_BYTES);
            head[..hl].copy_from_slice(&frame[..hl]);
            match plain_forward(&w.table, &mut head[..hl], frame.len()) {
                Ok(port) => fwd[usize::from(port)] += 1,
                Err(r) => drops[r as usize] += 1,
            }
            black_box(&head);
        }
        left -= batch as u64;
    }
    (start.elapsed().as_secs_f64(), fwd, drops)
}

/// What the program does to one head, in plain Rust: `Ok(port)` with the head rewritten,
/// or the drop reason.
#[inline]
fn plain_forward(table: &Dir248, h: &mut [u8], pkt_len: usize) -> Result<Port, L3Drop> {
    let dst = check_ipv4(h, pkt_len)?;
    let e = entry(table.tbl24_words(), (dst >> 8) as usize);
    let e = if e & ENTRY_TBL8 != 0 {
        entry(
            table.tbl8_words(),
            usize::from(e & !ENTRY_TBL8) * 256 + (dst & 0xFF) as usize,
        )
    } else {
        e
    };
    if e == 0 {
        return Err(L3Drop::NoRoute);
    }
    let nh = table.next_hops()[usize::from(e - 1)];
    rewrite_head(
        h,
        &nh.dst_mac.to_be_bytes()[2..8],
        &nh.src_mac.to_be_bytes()[2..8],
    );
    Ok(nh.port)
}

#[inline(always)]
fn entry(words: &[u64], index: usize) -> u16 {
    (words[index / 4] >> ((3 - index % 4) * 16)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> L3fwdBenchConfig {
        L3fwdBenchConfig {
            packets: 30_000,
            routes: 2_000,
            flows: 256,
            invalid_percent: 10,
            ..Default::default()
        }
    }

    #[test]
    fn small_run_is_verified_and_counts_every_class() {
        let r = run(&small()).expect("runs");
        assert!(r.verified, "{r:#?}");
        assert_eq!(r.stats.packets_in, 30_000);
        for reason in [
            "non_ipv4",
            "bad_version",
            "bad_ihl",
            "bad_length",
            "bad_checksum",
            "ttl_exceeded",
            "no_route",
        ] {
            assert!(
                r.stats.dropped_by_reason.get(reason).copied().unwrap_or(0) > 0,
                "{reason}: {r:#?}"
            );
        }
        assert!(r.xtxns_per_packet > 0.0 && r.instructions_per_packet >= 1.0);
        assert_eq!(r.stats.per_ppe_packets.len(), 2);
    }

    #[test]
    fn workload_is_deterministic_and_mostly_routed() {
        let cfg = L3fwdBenchConfig {
            invalid_percent: 0,
            packets: 5_000,
            ..small()
        };
        let (a, b) = (prepare(&cfg).unwrap(), prepare(&cfg).unwrap());
        assert_eq!(a.bytes, b.bytes);
        assert!(a.expect.iter().all(|e| matches!(e, Expect::Forward(_))));
        let (fwd, drops) = a.expected(12_345);
        assert_eq!(fwd.iter().sum::<u64>() + drops.iter().sum::<u64>(), 12_345);
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let e = prepare(&L3fwdBenchConfig {
            size: 40,
            ..small()
        })
        .unwrap_err();
        assert_eq!(e.setting, "size");
        let e = prepare(&L3fwdBenchConfig {
            invalid_percent: 101,
            ..small()
        })
        .unwrap_err();
        assert_eq!(e.setting, "invalid_percent");
        let e = prepare(&L3fwdBenchConfig {
            packets: 0,
            ..small()
        })
        .unwrap_err();
        assert_eq!(e.setting, "packets");
    }
}
