//! The fabric in a chassis: Trio-ML's hierarchical aggregation (two first-level PFEs with two
//! workers each, under a top-level PFE, as the Trio paper's §4 arranges them) with the links
//! through the fabric ([`crate::pfe::ChassisFabric`]), loaded by background traffic, for
//! CPRR, iSLIP-1, iSLIP and the OQ crossbar: how long the aggregation takes on the real
//! clock, and how many fabric cycles its frames spend crossing.
//!
//! The fabric runs `--cycles-per-us` cycles per microsecond of wall time while background
//! traffic loads it (as fast as it can when it cannot keep up), so times in fabric cycles
//! (each frame's, and the span from the first frame in to the last out) compare the
//! architectures under the same load; the wall time is the emulator's, simulation included.
//! The PFEs' threads decide when frames reach the fabric, so a run is not repeatable to the
//! cycle, and at low load the differences between architectures are within that noise.
//! Every worker's sums are checked against the flat sums.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::bad;
use crate::fabric::{Architecture, Depth, Iterations, OutputArbiter, Scheduler};
use crate::lab::bench::experiments::{gradients, sums_of, ExperimentError, Figure};
use crate::lab::bench::plot::{self, Line, Panel, Panels, Series};
use crate::lab::bench::PlotError;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::trio_ml::host::{run_workers, Attached, DriveOptions, Worker, WorkerConfig};
use crate::microcode::trio_ml::{wire, JobConfig, TrioMl, TrioMlConfig};
use crate::packet::{Dest, Port};
use crate::pfe::{Chassis, ChassisFabric, FabricStats, Frames, Pfe};

/// The chassis experiment. As command-line options, those of
/// `pfemu experiment fabric-chassis`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FabricChassisConfig {
    /// Background loads to measure, cells per input per cycle.
    #[arg(long, value_name = "B,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&FabricChassisConfig::default().backgrounds),
          help = "Background loads, cells per fabric input per cycle, in [0, 1)")]
    pub backgrounds: Vec<f64>,
    /// Gradients each worker contributes.
    #[arg(long, default_value_t = FabricChassisConfig::default().gradients,
          help = "Gradients each of the four workers contributes (1 to 16777216)")]
    pub gradients: usize,
    /// Packets each worker keeps in flight.
    #[arg(long, default_value_t = FabricChassisConfig::default().window,
          help = "Packets each worker keeps in flight (its window, 1 to 1024)")]
    pub window: usize,
    /// Fabric cycles per microsecond of wall time.
    #[arg(long, default_value_t = FabricChassisConfig::default().cycles_per_us,
          help = "Fabric cycles per microsecond of wall time, in (0, 1e6]")]
    pub cycles_per_us: f64,
    /// Bytes per cell.
    #[arg(long, default_value_t = FabricChassisConfig::default().cell_bytes,
          help = "Bytes of a frame one cell carries (1 to 65536)")]
    pub cell_bytes: usize,
    /// PPE threads per PFE.
    #[arg(long, default_value_t = FabricChassisConfig::default().ppe_threads,
          help = "PPE threads of each of the three PFEs (1 to 1024)")]
    pub ppe_threads: usize,
    /// Seed of the background traffic and the gradients.
    #[arg(long, default_value_t = FabricChassisConfig::default().seed,
          help = "Seed of the background traffic and the gradients")]
    pub seed: u64,
}

impl Default for FabricChassisConfig {
    /// Background 0, 0.3, 0.6 and 0.9; 2^20 gradients per worker (1024 packets of 1024);
    /// window 8; 100 cycles per µs; 64-byte cells; 8 PPE threads per PFE; seed 1.
    fn default() -> Self {
        FabricChassisConfig {
            backgrounds: vec![0.0, 0.3, 0.6, 0.9],
            gradients: 1 << 20,
            window: 8,
            cycles_per_us: 100.0,
            cell_bytes: 64,
            ppe_threads: 8,
            seed: 1,
        }
    }
}

/// The architectures compared.
pub const CHASSIS_ARCHITECTURES: [Architecture; 4] = [
    Architecture::Cprr(OutputArbiter::Simple),
    Architecture::Voq(Scheduler::Islip, Iterations::One),
    Architecture::Voq(Scheduler::Islip, Iterations::Log2),
    Architecture::OqXbar,
];

/// One architecture at one background load.
#[derive(Clone, Debug, Serialize)]
pub struct ChassisRow {
    /// As the paper names it.
    pub architecture: String,
    /// Background cells per input per cycle.
    pub background: f64,
    /// Fabric cycles from the first frame entering it to the last leaving it: the
    /// aggregation's time in the fabric's clock; `None` when no frame got through.
    pub span_cycles: Option<u64>,
    /// Wall-clock seconds from the first worker's start to the last worker's last Result
    /// (the emulator's time, which includes simulating the fabric).
    pub seconds: f64,
    /// The fabric's counters at the end (frames through it, their cycles in it).
    pub fabric: FabricStats,
    /// Every worker got the flat sums of all four.
    pub sums_exact: bool,
}

/// The report of [`fabric_chassis`].
#[derive(Clone, Debug, Serialize)]
pub struct FabricChassisReport {
    /// What was run.
    pub config: FabricChassisConfig,
    /// One row per architecture and background load.
    pub rows: Vec<ChassisRow>,
    /// Every sum exact, no frame dropped, every frame accounted for.
    pub verified: bool,
}

/// Workers per first-level PFE, and first-level PFEs.
const WORKERS_PER_LEAF: u8 = 2;
const LEAVES: u8 = 2;
const JOB: u8 = 1;
/// The port of a first-level PFE that leads up to the top.
const UPLINK: Port = 60;

/// Runs the aggregation through each architecture at each background load.
pub fn fabric_chassis(
    cfg: &FabricChassisConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<FabricChassisReport, ExperimentError> {
    if cfg.backgrounds.is_empty() {
        return bad("--backgrounds", "give at least one load, in [0, 1)".into());
    }
    if let Some(b) = cfg.backgrounds.iter().find(|b| !(0.0..1.0).contains(*b)) {
        return bad(
            "--backgrounds",
            format!("{b}: a background load is in [0, 1) cells per input per cycle"),
        );
    }
    if cfg.gradients == 0 || cfg.gradients > 1 << 24 {
        return bad(
            "--gradients",
            format!("{}: 1 to {}", cfg.gradients, 1 << 24),
        );
    }
    if cfg.window == 0 || cfg.window > 1024 {
        return bad("--window", format!("{}: 1 to 1024", cfg.window));
    }
    if cfg.ppe_threads == 0 || cfg.ppe_threads > 1024 {
        return bad("--ppe-threads", format!("{}: 1 to 1024", cfg.ppe_threads));
    }
    let fabric = |architecture, background| ChassisFabric {
        architecture,
        depth: Depth::Infinite,
        cell_bytes: cfg.cell_bytes,
        background,
        cycles_per_us: cfg.cycles_per_us,
        seed: cfg.seed,
    };
    // The fabric's own settings, checked once, named as the options are.
    fabric(CHASSIS_ARCHITECTURES[0], 0.0)
        .validate(3)
        .map_err(|e| ExperimentError::Option {
            option: match e.setting {
                "cell_bytes" => "--cell-bytes",
                _ => "--cycles-per-us",
            },
            reason: e.reason,
        })?;
    let all: Vec<u8> = (0..LEAVES * WORKERS_PER_LEAF).collect();
    let want = sums_of(cfg.seed, &all, 0, cfg.gradients);
    let total = CHASSIS_ARCHITECTURES.len() * cfg.backgrounds.len();
    let mut rows = Vec::new();
    for &background in &cfg.backgrounds {
        for architecture in CHASSIS_ARCHITECTURES {
            let (seconds, workers, stats) = aggregate(cfg, fabric(architecture, background))?;
            rows.push(ChassisRow {
                architecture: architecture.name(),
                background,
                span_cycles: stats.span_cycles(),
                seconds,
                fabric: stats,
                sums_exact: workers.iter().all(|w| w.sums() == want),
            });
            progress(rows.len(), total);
        }
    }
    let verified = rows
        .iter()
        .all(|r| r.sums_exact && r.fabric.dropped() == 0 && r.fabric.accounted());
    Ok(FabricChassisReport {
        config: cfg.clone(),
        rows,
        verified,
    })
}

/// Trio-ML with job `JOB` of `sources`, its Results to `out_dst` through `out_dest`.
fn trio_ml_pfe(
    cfg: &FabricChassisConfig,
    local: Ipv4Addr,
    sources: Vec<u8>,
    out: (Ipv4Addr, Ipv4Addr, Dest),
    group: Vec<Port>,
) -> Result<(TrioMl, crate::pfe::PfeBuilder), ExperimentError> {
    let setup = |e: &dyn std::fmt::Display| ExperimentError::Setup(e.to_string());
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).map_err(|e| setup(&e))?);
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            local_addr: local,
            ..TrioMlConfig::default()
        },
    )
    .map_err(|e| setup(&e))?;
    trio.add_job(&JobConfig {
        job_id: JOB,
        sources,
        block_cnt_max: (2 * cfg.window) as u16,
        block_grad_max: 1024,
        block_exp_ms: 200,
        out_src_addr: out.0,
        out_dst_addr: out.1,
        out_dest: out.2,
    })
    .map_err(|e| setup(&e))?;
    let builder = Pfe::builder()
        .program(trio.program())
        .ppe_threads(cfg.ppe_threads)
        .memory(mem)
        .multicast_group(0, group);
    Ok((trio, builder))
}

/// One aggregation through a chassis whose links cross `fabric`: its wall time, the
/// workers (with their sums) and the fabric's counters.
fn aggregate(
    cfg: &FabricChassisConfig,
    fabric: ChassisFabric,
) -> Result<(f64, Vec<Worker>, FabricStats), ExperimentError> {
    let top_addr = Ipv4Addr::new(10, 0, 9, 1);
    let group = Ipv4Addr::new(239, 0, 0, 1);
    let mut c = Chassis::builder();
    let mut keep = Vec::new();
    let mut leaves = Vec::new();
    let mut leaf_addrs = Vec::new();
    for l in 0..LEAVES {
        let addr = Ipv4Addr::new(10, 0, 7 + l, 1);
        let first = l * WORKERS_PER_LEAF;
        let (trio, b) = trio_ml_pfe(
            cfg,
            addr,
            (first..first + WORKERS_PER_LEAF).collect(),
            (
                Ipv4Addr::new(10, 0, 7 + l, 11 + l),
                top_addr,
                Dest::Port(UPLINK),
            ),
            (0..Port::from(WORKERS_PER_LEAF)).collect(),
        )?;
        // The top's Result comes down addressed to the group: to this leaf's workers.
        trio.add_route(group, Dest::Group(0))
            .map_err(|e| ExperimentError::Setup(e.to_string()))?;
        leaves.push(c.pfe(&format!("leaf{l}"), b));
        leaf_addrs.push(addr);
        keep.push(trio);
    }
    let leaf_srcs: Vec<u8> = (0..LEAVES).map(|l| 11 + l).collect();
    let (top, b) = trio_ml_pfe(
        cfg,
        top_addr,
        leaf_srcs,
        (top_addr, group, Dest::Group(0)),
        (1..=Port::from(LEAVES)).collect(),
    )?;
    let t = c.pfe("top", b);
    keep.push(top);
    for (l, &leaf) in leaves.iter().enumerate() {
        c.link((leaf, UPLINK), (t, l as Port + 1));
    }
    c.fabric(fabric);
    let workers = usize::from(LEAVES * WORKERS_PER_LEAF);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..workers).map(|_| crossbeam_channel::unbounded()).unzip();
    c.sink(Arc::new(
        move |pfe: usize, port: Port, frames: Frames<'_>| {
            if pfe < usize::from(LEAVES) && port < Port::from(WORKERS_PER_LEAF) {
                for f in frames.iter() {
                    let _ = txs[pfe * usize::from(WORKERS_PER_LEAF) + usize::from(port)]
                        .send(f.to_vec());
                }
            }
        },
    ));
    let chassis = c
        .start()
        .map_err(|e| ExperimentError::Setup(e.to_string()))?;
    let attached = (0..LEAVES * WORKERS_PER_LEAF)
        .map(|s| {
            let leaf = usize::from(s / WORKERS_PER_LEAF);
            let base = WorkerConfig::new(JOB, s, leaf_addrs[leaf]);
            let config = WorkerConfig {
                grads_per_packet: 1024,
                window: cfg.window,
                endpoints: wire::Endpoints {
                    dst_addr: leaf_addrs[leaf],
                    ..base.endpoints
                },
                ..base
            };
            Ok(Attached {
                worker: Worker::new(config, gradients(cfg.seed, s, 0, cfg.gradients))?,
                // Worker s is port s of the chassis' numbering: leaf s / 2, its port s % 2.
                port: Port::from(s),
                rx: rxs[usize::from(s)].clone(),
                opts: DriveOptions::default(),
            })
        })
        .collect::<Result<Vec<_>, ExperimentError>>()?;
    let start = Instant::now();
    let inject = |p: Port, frame: &[u8]| {
        let leaf = leaves[usize::from(p) / usize::from(WORKERS_PER_LEAF)];
        let _ = chassis
            .pfe(leaf)
            .inject_frame(p % Port::from(WORKERS_PER_LEAF), frame);
    };
    let done = run_workers(attached, &inject)?;
    let seconds = start.elapsed().as_secs_f64();
    chassis.drain();
    let stats = chassis.fabric_stats().unwrap_or_default();
    chassis.shutdown();
    Ok((seconds, done, stats))
}

impl Figure for FabricChassisReport {
    fn name(&self) -> &'static str {
        "fabric-chassis"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        vec![
            "architecture",
            "background",
            "span_cycles",
            "seconds",
            "frames",
            "mean_frame_cycles",
            "max_frame_cycles",
            "fabric_cycles",
            "background_cells",
            "sums_exact",
        ]
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                vec![
                    r.architecture.clone(),
                    r.background.to_string(),
                    // No frame delivered: no span, no largest time (empty fields).
                    r.span_cycles.map(|c| c.to_string()).unwrap_or_default(),
                    format!("{:.4}", r.seconds),
                    r.fabric.frames_out.to_string(),
                    // No frame delivered, no mean: an empty field.
                    r.fabric
                        .mean_frame_cycles
                        .map(|m| format!("{m:.2}"))
                        .unwrap_or_default(),
                    r.fabric
                        .max_frame_cycles
                        .map(|c| c.to_string())
                        .unwrap_or_default(),
                    r.fabric.cycles.to_string(),
                    r.fabric.background_cells.to_string(),
                    r.sums_exact.to_string(),
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), PlotError> {
        // The rows that have a `y` (a run that delivered no frame has no mean).
        let line = |i: usize, a: Architecture, y: &dyn Fn(&ChassisRow) -> Option<f64>| Line {
            series: Series {
                name: a.name(),
                points: self
                    .rows
                    .iter()
                    .filter(|r| r.architecture == a.name())
                    .filter_map(|r| Some((r.background, y(r)?)))
                    .collect(),
            },
            color: i,
            dashed: false,
        };
        let panel = |title: &str, y_label: &str, y: &dyn Fn(&ChassisRow) -> Option<f64>| Panel {
            title: title.into(),
            x_label: "background load (cells / input / cycle)".into(),
            y_label: y_label.into(),
            y_log: false,
            x_log2: false,
            lines: CHASSIS_ARCHITECTURES
                .iter()
                .enumerate()
                .map(|(i, a)| line(i, *a, y))
                .collect(),
        };
        plot::svg_panels(
            path,
            &Panels {
                title: "Trio-ML hierarchical aggregation through the chassis fabric",
                columns: 2,
                panels: vec![
                    panel("frames' time in the fabric", "mean cycles", &|r| {
                        r.fabric.mean_frame_cycles
                    }),
                    panel("aggregation time in the fabric", "cycles", &|r| {
                        r.span_cycles.map(|c| c as f64)
                    }),
                ],
            },
        )
    }

    fn table(&self) -> String {
        let mut t = format!(
            "{:<10} {:>10} {:>12} {:>9} {:>8} {:>12} {:>10}\n",
            "", "background", "span cycles", "seconds", "frames", "mean cycles", "max cycles"
        );
        for r in &self.rows {
            // No frame delivered, no mean, span or largest time: `-`.
            let mean = r
                .fabric
                .mean_frame_cycles
                .map_or(format!("{:>12}", "-"), |m| format!("{m:>12.1}"));
            let or_dash = |v: Option<u64>| v.map_or("-".to_string(), |c| c.to_string());
            t += &format!(
                "{:<10} {:>10} {:>12} {:>9.3} {:>8} {mean} {:>10}\n",
                r.architecture,
                r.background,
                or_dash(r.span_cycles),
                r.seconds,
                r.fabric.frames_out,
                or_dash(r.fabric.max_frame_cycles)
            );
        }
        t.pop();
        t
    }

    fn verified(&self) -> bool {
        self.verified
    }
}
