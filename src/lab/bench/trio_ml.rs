//! The Trio-ML throughput benchmark: `workers` sources stream blocks of `grads`
//! gradients, `window` blocks at a time, through the full PFE; and the same additions done
//! by a plain Rust loop over the same packets, so the emulator's cost shows as a ratio.
//!
//! Traffic is generated before the clock starts: one generation of `window` blocks from
//! every worker (workers interleaved block by block, as their packets would meet at the
//! PFE). Each generation re-sends the same gradients under the next `gen_id`; a generation
//! starts when the previous one's Results are all out (each worker's window is full), so
//! a block id is never aggregating in two generations at once. The clock runs from the
//! first packet in to the last Result out. The last generation's Results are checked
//! against sums computed here.
//!
//! The straggler scan runs on the system clock, as the bench measures wall-clock time, and
//! gives up on a block that no packet referenced for 100 ms. A busy machine can hold a PPE
//! thread (or the injecting one) up that long: the block then goes out as a partial Result
//! (`degraded`), and its late packet is answered with it and dropped as `late`. That is a
//! figure of the machine's speed, not a wrong sum, so the check accepts it as long as it is
//! consistent: a partial Result must hold exactly the sums of as many of its block's
//! sources as its `src_cnt` says, every late drop must have had its answer, and nothing
//! else may be dropped. The report counts them ([`TrioMlBenchReport::degraded`],
//! [`TrioMlBenchReport::late`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::report::Summary;
use crate::fpisa;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::trio_ml::wire::{self, AggPacket, Endpoints, TrioMlHdrFields};
use crate::microcode::trio_ml::{JobConfig, Lanes, TrioMl, TrioMlConfig};
use crate::packet::{Dest, Port};
use crate::pfe::Stats;
use crate::pfe::{FnSink, Pfe};
use crate::rng::SplitMix64;
use crate::ConfigError;

/// Byte offset of `gen_id` in an aggregation frame.
const GEN_AT: usize = wire::TRIO_ML_HDR_AT + 8;

/// One benchmark configuration; as command-line options, those of `pfemu bench trio-ml`
/// and `pfemu bench fpisa` (defaults from [`TrioMlBenchConfig::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct TrioMlBenchConfig {
    /// Sources of the job (the paper's benchmark: 4 servers).
    #[arg(long, default_value_t = TrioMlBenchConfig::default().workers)]
    pub workers: u8,
    /// Gradients per packet (1..=4095; the paper: 1024).
    #[arg(long, default_value_t = TrioMlBenchConfig::default().grads)]
    pub grads: u16,
    /// Blocks each worker has outstanding (block ids in use; at most 2047: a job holds
    /// 2 x window slots).
    #[arg(long, default_value_t = TrioMlBenchConfig::default().window)]
    pub window: u16,
    /// Generations streamed (each is `window` blocks from every worker).
    #[arg(long, default_value_t = TrioMlBenchConfig::default().generations)]
    pub generations: u32,
    /// PPE threads (the command's `--ppe-threads` sweeps them).
    #[arg(skip = TrioMlBenchConfig::default().ppe_threads)]
    pub ppe_threads: usize,
    /// Packets in flight in the PFE (ingress waits when they are all taken); unset, 8 MiB of
    /// frames (e.g. 2048 of 1024 gradients).
    #[arg(long)]
    pub capacity: Option<usize>,
    /// Run the straggler-scan timer threads meanwhile (`--no-timers` does not).
    #[arg(long = "no-timers", action = clap::ArgAction::SetFalse,
          help = "Do not run the straggler-scan timer threads meanwhile")]
    pub timers: bool,
    /// Staggered scan timers (Trio-ML's N).
    #[arg(long = "timers", value_name = "N", default_value_t = TrioMlBenchConfig::default().scan_timers)]
    pub scan_timers: u32,
    /// Time between two visits of a block by the scan, in nanoseconds (given in
    /// milliseconds as `--scan-period-ms`).
    #[arg(long = "scan-period-ms", value_name = "MS", value_parser = super::settings::parse_millis_as_ns,
          default_value = super::settings::ns_as_millis_text(TrioMlBenchConfig::default().scan_period_ns),
          help = "Time between two visits of a block by the scan, in milliseconds")]
    pub scan_period_ns: u64,
    /// Seed of the gradient values.
    #[arg(skip = TrioMlBenchConfig::default().seed)]
    pub seed: u64,
    /// What the gradients are: Trio-ML's integers, or FPISA's floats (`pfemu bench fpisa`).
    #[arg(skip = TrioMlBenchConfig::default().lanes)]
    pub lanes: Lanes,
    /// Print where the time went per stage: ingress, dispatch, program, reorder, egress,
    /// sink, timers
    #[arg(long)]
    pub profile: bool,
}

/// The bench's straggler-scan period: the paper's evaluation setting (§6.1: "N = 100 timer
/// threads on Trio, each with a 10 ms timeout period"), so that every record is visited once
/// per 10 ms. The library's default ([`crate::microcode::trio_ml::DEFAULT_SCAN_PERIOD_NS`],
/// 1 ms) scans ten times as often, for a finer straggler timeout; `--scan-period-ms 1`
/// measures that.
pub const PAPER_SCAN_PERIOD_NS: u64 = 10_000_000;

impl Default for TrioMlBenchConfig {
    /// 4 workers, 1024 gradients per packet, a window of 2047 blocks, 64 generations,
    /// PPE threads = cores, 100 timers scanning every 10 ms ([`PAPER_SCAN_PERIOD_NS`]).
    ///
    /// 64 generations (about 0.4 s of the engine's time here) rather than 16: the first
    /// generation creates every block's hash record and grows the engine's batch arenas,
    /// and takes about twice a later one's time; over 16 it was 5-10% of the run, and the
    /// engine's ratio to its plain loop spread 0.50-0.66 over six runs, against 0.60-0.67
    /// over 64.
    fn default() -> Self {
        TrioMlBenchConfig {
            workers: 4,
            grads: 1024,
            window: 2047,
            generations: 64,
            ppe_threads: crate::pfe::default_ppe_threads(),
            capacity: None,
            timers: true,
            scan_timers: crate::microcode::trio_ml::DEFAULT_TIMERS,
            scan_period_ns: PAPER_SCAN_PERIOD_NS,
            seed: 1,
            lanes: Lanes::Int32,
            profile: false,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct TrioMlBenchReport {
    /// The configuration measured.
    pub config: TrioMlBenchConfig,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Packets in flight in the PFE.
    pub capacity: usize,
    /// Gradients per packet.
    pub grads: u16,
    /// Blocks outstanding per worker.
    pub window: u16,
    /// Sources.
    pub workers: u8,
    /// The engine's counters of the run, at the report's top level in JSON: aggregation
    /// packets injected (`packets_in`), Result frames out (`frames_tx`, one per worker and
    /// block), Result packets built (`created`, one per block), drops (`dropped`, 0
    /// expected, and `dropped_by_reason`), timer threads run (`timer_runs`), ...
    #[serde(flatten)]
    pub stats: Stats,
    /// Seconds from the first packet in to the last Result out.
    pub elapsed_s: f64,
    /// Gradients aggregated per second through the PFE (every source's count).
    pub gradients_per_s: f64,
    /// Gbit/s of gradient payload in.
    pub gradient_gbps: f64,
    /// The same additions (and Result copies) by a plain Rust loop, one thread.
    pub baseline_gradients_per_s: f64,
    /// `gradients_per_s / baseline_gradients_per_s`.
    pub ratio_to_baseline: f64,
    /// Instructions executed per gradient (the paper: about 1.2).
    pub instructions_per_gradient: f64,
    /// Instructions per aggregation packet.
    pub instructions_per_packet: f64,
    /// XTXNs per aggregation packet, by kind.
    pub xtxns_per_packet: std::collections::BTreeMap<String, f64>,
    /// Partial Results of the checked (last) generation: blocks the straggler scan gave up
    /// on because a packet of theirs came more than the block timeout (100 ms) after the
    /// block's previous one, on a machine too busy to keep up. 0 expected; each is checked
    /// against the sums of the sources it says it holds.
    pub degraded: u64,
    /// Packets of every generation that came after their block had been given up on,
    /// answered with its partial Result and dropped as `late` (`dropped_by_reason`).
    pub late: u64,
    /// Every block of the last generation was answered, a complete Result with exactly its
    /// sums and a partial one ([`TrioMlBenchReport::degraded`]) with exactly the sums of
    /// `src_cnt` of its sources; one Result was built per block and generation plus one per
    /// late packet; and nothing was dropped but late packets.
    pub verified: bool,
    /// The common report, in packets: rates in and out (Results out), drops, latency (of
    /// the packets that complete a block, to their Result's egress), PPE load, the plain
    /// loop in packets per second.
    pub summary: Summary,
}

/// The generated traffic of one generation and the sums it must produce. The frames are
/// injected by reference ([`Pfe::inject_shared`]), as a traffic generator's buffers would be:
/// ingress does not copy them, so the figure is the PFE's work, not a memory copy's.
pub struct TrioMlTraffic {
    frames: Vec<Arc<[u8]>>,
    ports: Vec<Port>,
    /// Per block: the expected sums.
    sums: Vec<Vec<i32>>,
}

fn endpoints(src: u8, aggregator: std::net::Ipv4Addr) -> Endpoints {
    Endpoints {
        src_mac: [2, 0, 0, 0, 1, src],
        dst_mac: [2, 0, 0, 0, 0, 0xFE],
        src_addr: std::net::Ipv4Addr::new(10, 1, 0, src + 1),
        dst_addr: aggregator,
        src_port: wire::DEFAULT_UDP_PORT,
        dst_port: wire::DEFAULT_UDP_PORT,
    }
}

/// Bytes of aggregation frames the PFE holds in flight by default: about 8 MiB (2021 frames
/// of 1024 gradients), which keeps the PPE threads' working set (batches, output arenas,
/// the frames' tails) closer to the cache than the engine's default of 16384 packets
/// would (64 MiB of 4 KB frames). On the development VM, interleaved: 1.04-1.06 G
/// gradients/s against 1.02 with 16384 and 1.02-1.04 with 512; with ingress copying the
/// frames it mattered more (0.77 against 0.68).
pub const DEFAULT_IN_FLIGHT_BYTES: usize = 8 << 20;

/// Packets in flight for frames of `grads` gradients: [`DEFAULT_IN_FLIGHT_BYTES`] worth,
/// at least 256 and at most the engine's default capacity.
pub fn default_capacity(grads: u16) -> usize {
    let frame = wire::GRADS_AT + usize::from(grads) * 4;
    (DEFAULT_IN_FLIGHT_BYTES / frame).clamp(256, crate::pfe::DEFAULT_CAPACITY)
}

/// Generates one generation's packets (generation 0).
pub fn generate(cfg: &TrioMlBenchConfig) -> TrioMlTraffic {
    let aggregator = TrioMlConfig::default().local_addr;
    let g = usize::from(cfg.grads);
    let mut rng = SplitMix64::new(cfg.seed);
    let fpisa = matches!(cfg.lanes, Lanes::Fpisa(_));
    // Integers in +-2^20: sums of up to 255 sources stay far from overflow. FPISA's floats
    // (sent as their bits) are integers of one binade, +-(2^20 .. 2^21): FPISA adds them
    // exactly in whatever order the PPE threads take them, so the Results can be checked
    // bit for bit, and sums of up to 127 sources fit the accumulator's headroom.
    let mut next = move || {
        let r = rng.next_u64();
        if fpisa {
            let v = ((1u64 << 20) + (r >> 44)) as f32;
            (if r & 1 == 0 { v } else { -v }).to_bits() as i32
        } else {
            (r >> 43) as i32 - (1 << 20)
        }
    };
    let mut frames = Vec::new();
    let mut ports = Vec::new();
    let mut sums = Vec::new();
    for block in 0..u32::from(cfg.window) {
        let mut sum = vec![0i32; g];
        let mut float_sum = vec![0f64; g];
        for src in 0..cfg.workers {
            let grads: Vec<i32> = (0..g).map(|_| next()).collect();
            if fpisa {
                for (s, v) in float_sum.iter_mut().zip(&grads) {
                    *s += f64::from(f32::from_bits(*v as u32));
                }
            } else {
                for (s, v) in sum.iter_mut().zip(&grads) {
                    *s = s.wrapping_add(*v);
                }
            }
            frames.push(Arc::from(wire::agg_packet(&AggPacket {
                endpoints: endpoints(src, aggregator),
                hdr: TrioMlHdrFields {
                    job_id: 1,
                    block_id: block,
                    src_id: src,
                    gen_id: 0,
                    grad_cnt: cfg.grads,
                    ..TrioMlHdrFields::default()
                },
                gradients: &grads,
            })));
            ports.push(Port::from(src));
        }
        if fpisa {
            // Exact: integers below 2^28 (255 sources of less than 2^21).
            sum = float_sum
                .iter()
                .map(|&s| (s as f32).to_bits() as i32)
                .collect();
        }
        sums.push(sum);
    }
    TrioMlTraffic {
        frames,
        ports,
        sums,
    }
}

/// Stamps `gen` on every frame. The engine must hold none of them (it releases them all
/// before [`Pfe::drain`] returns).
fn set_gen(frames: &mut [Arc<[u8]>], gen: u16) {
    for f in frames {
        let f = Arc::get_mut(f).expect("a drained engine holds no frame");
        f[GEN_AT..GEN_AT + 2].copy_from_slice(&gen.to_be_bytes());
    }
}

/// Checks the last generation's Results as they leave (port 0's copy of each): each
/// complete one must carry exactly its block's sums, and each block must be answered once.
/// `checked` counts the distinct blocks answered correctly; `bad` the Results that were
/// wrong, short, long, of no block, or a second complete answer for a block. Partial
/// Results (`degraded`) are kept in `partial`, to be checked after the run against the
/// block's sources ([`partial_is_consistent`]); a block given up on may be answered twice
/// (the multicast Result, then the answer to its late packet, if that came from port 0's
/// source).
struct Checker {
    expect: Vec<Vec<i32>>,
    checking: AtomicBool,
    /// The blocks answered so far, a bit per block id.
    answered: Vec<AtomicU64>,
    checked: AtomicU64,
    bad: AtomicU64,
    /// The partial Results: block id, `src_cnt`, sums.
    partial: parking_lot::Mutex<Vec<(usize, u8, Vec<i32>)>>,
}

impl Checker {
    fn new(expect: Vec<Vec<i32>>) -> Self {
        Checker {
            answered: (0..expect.len().div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            expect,
            checking: AtomicBool::new(false),
            checked: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            partial: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Marks `block` answered; whether it was not before.
    fn answer(&self, block: usize) -> bool {
        let bit = 1u64 << (block % 64);
        self.answered[block / 64].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    /// The blocks answered, complete or partial.
    fn blocks_answered(&self) -> u64 {
        self.answered
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    fn deliver(&self, port: Port, f: &[u8]) {
        if port != 0 {
            return;
        }
        if !self.checking.load(Ordering::Relaxed) {
            return;
        }
        let block = match wire::parse(f) {
            Ok((h, grads)) if h.degraded => {
                let fits = self
                    .expect
                    .get(h.block_id as usize)
                    .is_some_and(|e| grads.len() == e.len() * 4);
                if fits {
                    let b = h.block_id as usize;
                    self.answer(b);
                    self.partial
                        .lock()
                        .push((b, h.src_cnt, wire::gradients(grads)));
                    return;
                }
                None
            }
            Ok((h, grads)) => self.expect.get(h.block_id as usize).and_then(|e| {
                let ok = h.src_cnt as usize > 0
                    && grads.len() == e.len() * 4
                    && grads
                        .chunks_exact(4)
                        .zip(e)
                        .all(|(b, v)| i32::from_be_bytes([b[0], b[1], b[2], b[3]]) == *v);
                ok.then_some(h.block_id as usize)
            }),
            Err(_) => None,
        };
        // A block's first correct answer counts; any other answer for it is one too many.
        let first = block.is_some_and(|b| self.answer(b));
        if first {
            self.checked.fetch_add(1, Ordering::Relaxed);
        } else {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether a partial Result of `block` holding `src_cnt` sources has exactly the sums of
/// `src_cnt` of the block's sources in `traffic` (the Result does not say which: some set
/// of the others is left out), added as `lanes` adds them. Jobs of more than 63 sources are
/// not checked this way (false).
fn partial_is_consistent(
    traffic: &TrioMlTraffic,
    workers: u8,
    lanes: Lanes,
    block: usize,
    src_cnt: u8,
    sums: &[i32],
) -> bool {
    let w = usize::from(workers);
    let Some(frames) = traffic.frames.get(block * w..(block + 1) * w) else {
        return false;
    };
    let sources: Vec<Vec<i32>> = frames
        .iter()
        .map(|f| wire::parse(f).map_or(Vec::new(), |(_, g)| wire::gradients(g)))
        .collect();
    if workers > 63 || src_cnt == 0 || src_cnt >= workers {
        return false;
    }
    let sum_without = |missing: u64| -> Vec<i32> {
        let kept = || (0..w).filter(move |&s| missing & 1 << s == 0);
        (0..sums.len())
            .map(|i| match lanes {
                Lanes::Int32 => kept().fold(0i32, |a, s| {
                    a.wrapping_add(sources[s].get(i).copied().unwrap_or(0))
                }),
                // Exact: integers of one binade, as `generate` makes them.
                Lanes::Fpisa(_) => {
                    let f = kept().fold(0f64, |a, s| {
                        a + f64::from(f32::from_bits(
                            sources[s].get(i).copied().unwrap_or(0) as u32
                        ))
                    });
                    (f as f32).to_bits() as i32
                }
            })
            .collect()
    };
    crate::lab::bench::experiments::sets_of(workers, workers - src_cnt)
        .any(|missing| sum_without(missing) == sums)
}

/// Checks the settings `run_on` needs; returns the job's slots (2 x window).
fn check(cfg: &TrioMlBenchConfig) -> Result<u32, ConfigError> {
    for (setting, value) in [
        ("workers", u64::from(cfg.workers)),
        ("window", u64::from(cfg.window)),
        ("grads", u64::from(cfg.grads)),
        ("generations", u64::from(cfg.generations)),
    ] {
        if value == 0 {
            return Err(ConfigError::new(setting, "must be at least 1"));
        }
    }
    let slots = u32::from(cfg.window) * 2;
    if slots > 4095 {
        return Err(ConfigError::new(
            "window",
            format!(
                "{} is too large: Trio-ML keeps a finished block's Result until the block id's \
                 next generation finishes, so a job needs 2 x window <= 4095 slots \
                 (block_cnt_max is 12 bits)",
                cfg.window
            ),
        ));
    }
    Ok(slots)
}

/// Memory for the job's `slots` and Trio-ML installed in it, with the job (`workers`
/// sources, Results to multicast group 0).
fn install(
    cfg: &TrioMlBenchConfig,
    slots: u32,
) -> Result<(Arc<SharedMemory>, TrioMl), super::BenchError> {
    let g = u64::from(cfg.grads);
    let slot_bytes = 64 + (g * 4).div_ceil(64) * 64;
    let dram = (u64::from(slots) * slot_bytes + (1 << 20)).next_power_of_two();
    let mem = Arc::new(SharedMemory::new(&MemConfig {
        dram_bytes: dram.max(64 << 20),
        ..MemConfig::default()
    })?);
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            timers: cfg.scan_timers,
            scan_period_ns: cfg.scan_period_ns,
            // Sized to the job, as a deployment would: the active table holds at most one
            // record per slot (a block being aggregated) plus the keys of blocks being
            // created. Its size, not its use, is what the scan timers
            // sweep, so the default 64k records would make them four times busier.
            hash_capacity: (2 * slots as usize).next_power_of_two().max(1024),
            lanes: cfg.lanes,
            ..TrioMlConfig::default()
        },
    )?;
    trio.add_job(&JobConfig {
        job_id: 1,
        sources: (0..cfg.workers).collect(),
        block_cnt_max: slots as u16,
        block_grad_max: cfg.grads,
        block_exp_ms: 100,
        out_dest: Dest::Group(0),
        ..JobConfig::default()
    })?;
    Ok((mem, trio))
}

/// Sends `generations` generations of `traffic` through the running `pfe`, each after
/// the previous one's Results are out, `checker` checking the last; returns the time
/// taken.
fn run_generations(
    pfe: &Pfe,
    traffic: &mut TrioMlTraffic,
    checker: &Checker,
    generations: u32,
) -> Result<Duration, super::BenchError> {
    let start = Instant::now();
    for gen in 0..generations {
        if gen + 1 == generations {
            checker.checking.store(true, Ordering::Relaxed);
        }
        set_gen(&mut traffic.frames, gen as u16);
        pfe.inject_shared(
            traffic
                .frames
                .iter()
                .zip(&traffic.ports)
                .map(|(f, &p)| (p, Arc::clone(f))),
        )?;
        pfe.drain();
    }
    Ok(start.elapsed())
}

/// Runs one configuration on pre-generated traffic.
pub fn run_on(
    cfg: &TrioMlBenchConfig,
    traffic: &mut TrioMlTraffic,
) -> Result<TrioMlBenchReport, super::BenchError> {
    let slots = check(cfg)?;
    let g = u64::from(cfg.grads);
    let (mem, trio) = install(cfg, slots)?;
    let sources: Vec<u8> = (0..cfg.workers).collect();
    let checker = Arc::new(Checker::new(std::mem::take(&mut traffic.sums)));
    let sink = {
        let c = checker.clone();
        FnSink(move |port: Port, frame: &[u8]| c.deliver(port, frame))
    };
    let capacity = cfg.capacity.unwrap_or_else(|| default_capacity(cfg.grads));
    // Blocks of more than about 2250 gradients make frames past the default jumbo size;
    // the bench's ports take them (a Result is as large as the block's packets).
    let frame_bytes = traffic.frames.iter().map(|f| f.len()).max().unwrap_or(0);
    let mut builder = Pfe::builder()
        .max_frame_bytes(frame_bytes.max(crate::pfe::DEFAULT_MAX_FRAME_BYTES))
        .program(trio.program())
        .ppe_threads(cfg.ppe_threads)
        .memory(mem)
        .reorder(false)
        .capacity(capacity)
        .multicast_group(
            0,
            sources.iter().map(|&s| Port::from(s)).collect::<Vec<_>>(),
        )
        .sink(Arc::new(sink));
    if cfg.timers {
        builder = builder.timers(trio.timer_specs()?);
    }
    let mut pfe = builder.latency(true).profile(cfg.profile).build()?;
    pfe.start()?;
    let elapsed_d = run_generations(&pfe, traffic, &checker, cfg.generations)?;
    let elapsed = elapsed_d.as_secs_f64();
    let stats = pfe.shutdown();
    let (checked, bad) = (
        checker.checked.load(Ordering::Relaxed),
        checker.bad.load(Ordering::Relaxed),
    );
    traffic.sums = checker.expect.clone();
    let packets = traffic.frames.len() as u64 * u64::from(cfg.generations);
    let results = u64::from(cfg.window) * u64::from(cfg.generations);
    let gradients = packets * g;
    let baseline = baseline(cfg, traffic);
    let gps = gradients as f64 / elapsed;
    let frame_bytes: u64 = traffic.frames.iter().map(|f| f.len() as u64).sum();
    let name = match cfg.lanes {
        Lanes::Int32 => "trio-ml",
        Lanes::Fpisa(_) => "fpisa",
    };
    let summary = Summary::from_stats(
        name,
        &stats,
        elapsed_d,
        frame_bytes * u64::from(cfg.generations),
    )
    .with_plain_loop(baseline / g as f64 / 1e6);
    let late = stats.dropped_by_reason.get("late").copied().unwrap_or(0);
    let partial = std::mem::take(&mut *checker.partial.lock());
    let partial_ok = partial.iter().all(|(block, src_cnt, sums)| {
        partial_is_consistent(traffic, cfg.workers, cfg.lanes, *block, *src_cnt, sums)
    });
    let answered = checker.blocks_answered();
    let degraded = answered.saturating_sub(checked);
    let verified = stats.created == results + late
        && stats.dropped == late
        && bad == 0
        && partial_ok
        && answered == u64::from(cfg.window);
    Ok(TrioMlBenchReport {
        config: cfg.clone(),
        ppe_threads: cfg.ppe_threads,
        capacity,
        grads: cfg.grads,
        window: cfg.window,
        workers: cfg.workers,
        elapsed_s: elapsed,
        gradients_per_s: gps,
        gradient_gbps: gps * 32.0 / 1e9,
        baseline_gradients_per_s: baseline,
        ratio_to_baseline: gps / baseline,
        degraded,
        late,
        instructions_per_gradient: stats.instructions as f64 / gradients as f64,
        // The same per-packet figures as the summary's, from the same stats.
        instructions_per_packet: summary.instructions_per_packet,
        xtxns_per_packet: summary.xtxns_per_packet.clone(),
        verified,
        summary,
        stats,
    })
}

/// The plain loop: the same packets, the same sums in the same layout (a buffer of
/// `window` blocks of 32-bit lanes, or of FPISA accumulator words), one thread, no engine:
/// per packet, read the header, skip a source already counted, add the big-endian gradients
/// (FPISA's with the same vectorised shift-and-add the engine runs,
/// [`crate::fpisa::add_fp32_be`]); when every source is in, copy the sums out (the Result's
/// payload; FPISA's renormalized into FP32 by the kernel the engine's Result read runs) and clear
/// the block. Returns gradients per second.
pub fn baseline(cfg: &TrioMlBenchConfig, traffic: &mut TrioMlTraffic) -> f64 {
    match cfg.lanes {
        Lanes::Int32 => plain_loop(
            cfg,
            traffic,
            0u32,
            |sums, grads| {
                for (sum, lane) in sums.iter_mut().zip(grads.chunks_exact(4)) {
                    *sum =
                        sum.wrapping_add(u32::from_be_bytes([lane[0], lane[1], lane[2], lane[3]]));
                }
            },
            |sums, out| {
                for (o, sum) in out.chunks_exact_mut(4).zip(sums) {
                    o.copy_from_slice(&std::mem::take(sum).to_be_bytes());
                }
            },
        ),
        Lanes::Fpisa(variant) => plain_loop(
            cfg,
            traffic,
            0u64,
            |words, grads| {
                fpisa::add_fp32_be(words, grads, variant);
            },
            |words, out| {
                // As the engine's Result reads them: renormalized from the words as memory
                // holds them, without a copy into network order first.
                fpisa::lanes::fpisa_fp32_values_of_words(out, words);
                words.fill(0);
            },
        ),
    }
}

/// [`baseline`]'s loop, over sums of type `S` starting at `zero`: `add` adds a packet's
/// big-endian lanes into its block's sums, `take` writes the sums out (the Result's payload,
/// 4 bytes each) and clears them.
fn plain_loop<S: Copy>(
    cfg: &TrioMlBenchConfig,
    traffic: &mut TrioMlTraffic,
    zero: S,
    mut add: impl FnMut(&mut [S], &[u8]),
    mut take: impl FnMut(&mut [S], &mut [u8]),
) -> f64 {
    let g = usize::from(cfg.grads);
    let w = usize::from(cfg.window);
    let mut buf = vec![zero; w * g];
    let mut seen = vec![[0u64; 4]; w];
    let mut count = vec![0u8; w];
    let mut out = vec![0u8; g * 4];
    let mut results = 0u64;
    // The engine's buffers are backed before its clock starts (`TrioMl::add_job`); so are
    // these: a first write to each page, so that the timed loop adds gradients rather than
    // waiting for the kernel's zeroed pages (about 7% of this loop's time otherwise).
    let page = (4096 / std::mem::size_of::<S>()).max(1);
    for sum in buf.iter_mut().step_by(page) {
        // Through `black_box`: a store of a known zero into zeroed memory may be dropped.
        *sum = std::hint::black_box(zero);
    }
    let start = Instant::now();
    for gen in 0..cfg.generations {
        set_gen(&mut traffic.frames, gen as u16);
        for f in &traffic.frames {
            let (h, grads) = match wire::parse(f) {
                Ok(x) => x,
                Err(_) => continue,
            };
            let b = h.block_id as usize % w;
            let (word, bit) = (usize::from(h.src_id / 64), h.src_id % 64);
            if seen[b][word] & (1 << bit) != 0 {
                continue;
            }
            seen[b][word] |= 1 << bit;
            let n = usize::from(h.grad_cnt).min(grads.len() / 4);
            let sums = &mut buf[b * g..b * g + n];
            add(sums, &grads[..4 * n]);
            count[b] += 1;
            if count[b] == cfg.workers {
                take(sums, &mut out[..4 * n]);
                std::hint::black_box(&out);
                results += 1;
                count[b] = 0;
                seen[b] = [0; 4];
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    std::hint::black_box(results);
    let gradients = traffic.frames.len() as u64 * u64::from(cfg.generations) * g as u64;
    gradients as f64 / elapsed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Result of `block` carrying `sums` (of two sources), as the engine sends it.
    fn result(block: u32, sums: &[i32]) -> Vec<u8> {
        wire::agg_packet(&AggPacket {
            endpoints: endpoints(0, TrioMlConfig::default().local_addr),
            hdr: TrioMlHdrFields {
                job_id: 1,
                block_id: block,
                src_cnt: 2,
                grad_cnt: sums.len() as u16,
                ..TrioMlHdrFields::default()
            },
            gradients: sums,
        })
    }

    fn checker() -> Checker {
        let c = Checker::new(vec![vec![1, 2, 3], vec![4, 5, 6]]);
        c.checking.store(true, Ordering::Relaxed);
        c
    }

    fn counts(c: &Checker) -> (u64, u64) {
        (
            c.checked.load(Ordering::Relaxed),
            c.bad.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn every_block_answered_once_with_its_sums_checks_out() {
        let c = checker();
        c.deliver(0, &result(0, &[1, 2, 3]));
        c.deliver(1, &result(0, &[9, 9, 9])); // another port's copy: not checked
        c.deliver(0, &result(1, &[4, 5, 6]));
        assert_eq!(counts(&c), (2, 0));
    }

    #[test]
    fn a_short_result_is_bad() {
        let c = checker();
        // Its two sums match the first two expected: a zip would stop there and pass it.
        c.deliver(0, &result(0, &[1, 2]));
        c.deliver(0, &result(1, &[4, 5, 6, 7]));
        assert_eq!(counts(&c), (0, 2));
    }

    #[test]
    fn a_second_answer_for_a_block_is_bad_and_not_counted_again() {
        let c = checker();
        c.deliver(0, &result(0, &[1, 2, 3]));
        c.deliver(0, &result(0, &[1, 2, 3]));
        // Two good frames, but one block: block 1 was never answered.
        assert_eq!(counts(&c), (1, 1));
        c.deliver(0, &result(1, &[4, 5, 6]));
        assert_eq!(counts(&c), (2, 1));
    }

    /// A partial Result of `block` with `src_cnt` sources, carrying `sums`.
    fn partial(block: u32, src_cnt: u8, sums: &[i32]) -> Vec<u8> {
        let mut f = result(block, sums);
        let (mut h, _) = wire::parse(&f).unwrap();
        h.src_cnt = src_cnt;
        h.degraded = true;
        h.age_op = 1;
        let grads = f[wire::GRADS_AT..].to_vec();
        f = wire::agg_packet(&AggPacket {
            endpoints: endpoints(0, TrioMlConfig::default().local_addr),
            hdr: h,
            gradients: &wire::gradients(&grads),
        });
        f
    }

    #[test]
    fn a_partial_result_answers_its_block_and_waits_for_its_check() {
        let c = checker();
        c.deliver(0, &partial(1, 1, &[7, 8, 9]));
        // Its late packet's answer: the same Result again.
        c.deliver(0, &partial(1, 1, &[7, 8, 9]));
        c.deliver(0, &result(0, &[1, 2, 3]));
        assert_eq!(counts(&c), (1, 0));
        assert_eq!(c.blocks_answered(), 2);
        assert_eq!(c.partial.lock().len(), 2);
        // A complete answer after a partial one is one too many; a partial Result of the
        // wrong length is bad.
        c.deliver(0, &result(1, &[4, 5, 6]));
        c.deliver(0, &partial(0, 1, &[1, 2]));
        assert_eq!(counts(&c), (1, 2));
    }

    /// Block `block`'s sums over the sources `srcs` of `traffic` (3 workers), as `lanes`
    /// adds them.
    fn sums_over(traffic: &TrioMlTraffic, lanes: Lanes, block: usize, srcs: &[usize]) -> Vec<i32> {
        let grads: Vec<Vec<i32>> = srcs
            .iter()
            .map(|&s| wire::gradients(wire::parse(&traffic.frames[block * 3 + s]).unwrap().1))
            .collect();
        (0..grads[0].len())
            .map(|i| match lanes {
                Lanes::Int32 => grads.iter().fold(0i32, |a, g| a.wrapping_add(g[i])),
                Lanes::Fpisa(_) => {
                    let f: f64 = grads
                        .iter()
                        .map(|g| f64::from(f32::from_bits(g[i] as u32)))
                        .sum();
                    (f as f32).to_bits() as i32
                }
            })
            .collect()
    }

    #[test]
    fn a_partial_result_must_hold_exactly_as_many_sources_as_it_says() {
        for lanes in [Lanes::Int32, Lanes::Fpisa(crate::fpisa::Variant::Full)] {
            let cfg = TrioMlBenchConfig {
                workers: 3,
                grads: 5,
                window: 2,
                lanes,
                ..TrioMlBenchConfig::default()
            };
            let t = generate(&cfg);
            let ok = |block, src_cnt, sums: &[i32]| {
                partial_is_consistent(&t, 3, lanes, block, src_cnt, sums)
            };
            assert!(ok(1, 2, &sums_over(&t, lanes, 1, &[0, 2])), "{lanes:?}");
            assert!(ok(1, 2, &sums_over(&t, lanes, 1, &[1, 2])), "{lanes:?}");
            assert!(ok(0, 1, &sums_over(&t, lanes, 0, &[1])), "{lanes:?}");
            // Another block's sources, fewer or more sources than it says, a lane off.
            assert!(!ok(0, 2, &sums_over(&t, lanes, 1, &[0, 2])), "{lanes:?}");
            assert!(!ok(1, 2, &sums_over(&t, lanes, 1, &[0])), "{lanes:?}");
            assert!(!ok(1, 2, &sums_over(&t, lanes, 1, &[0, 1, 2])), "{lanes:?}");
            let mut off = sums_over(&t, lanes, 1, &[0, 2]);
            off[4] ^= 1;
            assert!(!ok(1, 2, &off), "{lanes:?}");
            // Every source is no partial Result; nor is none; nor a block out of range.
            assert!(!ok(1, 3, &sums_over(&t, lanes, 1, &[0, 1, 2])), "{lanes:?}");
            assert!(!ok(1, 0, &[0; 5]), "{lanes:?}");
            assert!(!ok(2, 1, &sums_over(&t, lanes, 1, &[0])), "{lanes:?}");
        }
    }

    #[test]
    fn a_result_of_no_block_or_not_parsing_is_bad() {
        let c = checker();
        c.deliver(0, &result(2, &[1, 2, 3]));
        c.deliver(0, &[0u8; 20]);
        assert_eq!(counts(&c), (0, 2));
    }
}
