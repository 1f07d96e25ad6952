//! Figure 13: loss against FIFO depth, and the smallest depth without loss near rate 1.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::{bad, check_loads, run_points, Point, SwitchSettings};
use crate::fabric::{Architecture, Depth, Iterations, OutputArbiter, Report, Scheduler, Traffic};
use crate::lab::bench::experiments::Claim;
use crate::lab::bench::experiments::{ExperimentError, Figure};
use crate::lab::bench::plot::{self, Line, Panel, Panels, Series};
use crate::lab::bench::PlotError;

// ----- Figure 13 ---------------------------------------------------------------------------

/// Figure 13: loss against FIFO depth. As command-line options, those of
/// `pfemu experiment fabric-loss`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FabricLossConfig {
    /// The switch and the traffic.
    #[command(flatten)]
    pub switch: SwitchSettings,
    /// Input rates r to measure.
    #[arg(long, value_name = "R,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&FabricLossConfig::default().loads),
          help = "Input rates r to measure, in (0, 1]")]
    pub loads: Vec<f64>,
    /// FIFO depths D to measure, 1 to 2^20.
    #[arg(long, value_name = "D,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&FabricLossConfig::default().depths),
          help = "FIFO depths D to measure (each of the P x P FIFOs), 1 to 1048576")]
    pub depths: Vec<usize>,
    /// The rate "near 1" at which the smallest depth without loss is searched.
    #[arg(long, default_value_t = FabricLossConfig::default().near_one,
          help = "The input rate near 1 at which the smallest depth without loss is searched")]
    pub near_one: f64,
    /// The deepest FIFO the search tries, 1 to 2^20.
    #[arg(long, default_value_t = FabricLossConfig::default().max_depth,
          help = "The deepest FIFO the zero-loss search tries, 1 to 1048576")]
    pub max_depth: usize,
}

impl Default for FabricLossConfig {
    /// r = 0.6 to 0.9 by 0.1, 0.95, 0.99 and 1; D = 1, 2, 4, ..., 256; the search at 0.99
    /// up to D = 1024; the shared settings' defaults.
    fn default() -> Self {
        FabricLossConfig {
            switch: SwitchSettings::default(),
            loads: vec![0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0],
            depths: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            near_one: 0.99,
            max_depth: 1024,
        }
    }
}

/// The deepest FIFO `--depths` and `--max-depth` take: 2^20 cells, so that P x P FIFOs of
/// it stay within reach of a machine's memory (the backlog bound stops a point before).
const MAX_DEPTH: usize = 1 << 20;

/// The architectures of Figure 13: CPRR and the best alternative per traffic model.
fn loss_architectures(traffic: Traffic) -> [Architecture; 2] {
    let alternative = match traffic {
        Traffic::Nonuniform { .. } => Scheduler::Edrrm,
        _ => Scheduler::Pim,
    };
    [
        Architecture::Cprr(OutputArbiter::Simple),
        Architecture::Voq(alternative, Iterations::Log2),
    ]
}

/// One architecture under one traffic model at one rate and depth.
#[derive(Clone, Debug, Serialize)]
pub struct LossRow {
    /// `uniform`, `bursty` or `nonuniform` (in JSON `traffic_name`: the run's `traffic`
    /// is the model with its parameters).
    #[serde(rename = "traffic_name")]
    pub traffic: &'static str,
    /// As the paper names it.
    pub architecture: String,
    /// The depth D of each FIFO.
    pub depth: usize,
    /// The run.
    #[serde(flatten)]
    pub report: Report,
}

/// The smallest FIFO depth without loss at the rate near 1: no cell dropped in the run,
/// warm-up included, and none stranded.
#[derive(Clone, Debug, Serialize)]
pub struct ZeroLossDepth {
    /// `uniform`, `bursty` or `nonuniform`.
    pub traffic: &'static str,
    /// As the paper names it.
    pub architecture: String,
    /// The rate.
    pub load: f64,
    /// The depth, or `None` when even `max_depth` lost cells.
    pub depth: Option<usize>,
    /// The loss ratio at depth 1 (absent if that point was saturated or measured no cell).
    pub loss_at_depth_1: Option<f64>,
}

/// The report of [`fabric_loss`].
#[derive(Clone, Debug, Serialize)]
pub struct FabricLossReport {
    /// What was run.
    pub config: FabricLossConfig,
    /// One row per traffic model, architecture, rate and depth.
    pub rows: Vec<LossRow>,
    /// Per traffic model and architecture, the smallest depth without loss near rate 1.
    pub zero_loss: Vec<ZeroLossDepth>,
    /// The paper's figures beside these.
    pub key: Vec<Claim>,
    /// Every point conserved its cells and accounted for each measured one.
    pub verified: bool,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Runs Figure 13; `progress` gets (points done, points) of the grid, then of each step of
/// the zero-loss search.
pub fn fabric_loss(
    cfg: &FabricLossConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<FabricLossReport, ExperimentError> {
    let s = &cfg.switch;
    s.check()?;
    check_loads("--loads", &cfg.loads)?;
    check_loads("--near-one", &[cfg.near_one])?;
    if cfg.depths.is_empty() {
        return bad("--depths", "give at least one depth".into());
    }
    if let Some(d) = cfg.depths.iter().find(|d| !(1..=MAX_DEPTH).contains(*d)) {
        return bad("--depths", format!("{d}: a depth is 1 to {MAX_DEPTH}"));
    }
    if cfg.max_depth == 0 || cfg.max_depth > MAX_DEPTH {
        return bad(
            "--max-depth",
            format!("{}: 1 to {MAX_DEPTH}", cfg.max_depth),
        );
    }
    let start = Instant::now();
    let mut points = Vec::new();
    for traffic in s.traffic() {
        for architecture in loss_architectures(traffic) {
            for &load in &cfg.loads {
                for &d in &cfg.depths {
                    points.push(Point {
                        architecture,
                        traffic,
                        load,
                        depth: Depth::Finite(d),
                    });
                }
            }
        }
    }
    let reports = run_points(s, &points, progress)?;
    let rows: Vec<LossRow> = points
        .iter()
        .zip(reports)
        .map(|(p, report)| LossRow {
            traffic: p.traffic.name(),
            architecture: p.architecture.name(),
            depth: match p.depth {
                Depth::Finite(d) => d,
                Depth::Infinite => usize::MAX,
            },
            report,
        })
        .collect();
    let zero_loss = zero_loss_depths(cfg, progress)?;
    let verified = rows
        .iter()
        .all(|r| r.report.counters.conserved() && r.report.accounted());
    let key = loss_claims(&zero_loss, &rows);
    Ok(FabricLossReport {
        config: cfg.clone(),
        rows,
        zero_loss,
        key,
        verified,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// For each traffic model and architecture of Figure 13, the smallest depth that loses
/// nothing at `near_one`, by bisection (loss falls as the depth grows), all searches
/// stepping together so that each step's points run in parallel.
fn zero_loss_depths(
    cfg: &FabricLossConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<ZeroLossDepth>, ExperimentError> {
    struct Search {
        traffic: Traffic,
        architecture: Architecture,
        /// Deepest depth known to lose, and shallowest known not to (if any).
        lossy: usize,
        clean: Option<usize>,
        loss_at_1: Option<f64>,
    }
    let s = &cfg.switch;
    let mut searches: Vec<Search> = Vec::new();
    for traffic in s.traffic() {
        for architecture in loss_architectures(traffic) {
            searches.push(Search {
                traffic,
                architecture,
                lossy: 0,
                clean: None,
                loss_at_1: None,
            });
        }
    }
    let point = |x: &Search, d: usize| Point {
        architecture: x.architecture,
        traffic: x.traffic,
        load: cfg.near_one,
        depth: Depth::Finite(d),
    };
    // Depth 1, then the maximum: a search whose maximum loses has no answer.
    for d in [1, cfg.max_depth] {
        let pts: Vec<Point> = searches.iter().map(|x| point(x, d)).collect();
        for (x, r) in searches.iter_mut().zip(run_points(s, &pts, progress)?) {
            if d == 1 {
                x.loss_at_1 = r.loss_ratio;
            }
            if loses_nothing(&r) {
                x.clean = Some(x.clean.map_or(d, |c| c.min(d)));
            } else {
                x.lossy = x.lossy.max(d);
            }
        }
    }
    loop {
        let open: Vec<usize> = (0..searches.len())
            .filter(|&i| matches!(searches[i].clean, Some(c) if c > searches[i].lossy + 1))
            .collect();
        if open.is_empty() {
            break;
        }
        let mid = |x: &Search| (x.lossy + x.clean.unwrap_or(x.lossy)).div_ceil(2);
        let pts: Vec<Point> = open
            .iter()
            .map(|&i| point(&searches[i], mid(&searches[i])))
            .collect();
        for (&i, r) in open.iter().zip(run_points(s, &pts, progress)?) {
            let x = &mut searches[i];
            let d = mid(x);
            if loses_nothing(&r) {
                x.clean = Some(d);
            } else {
                x.lossy = d;
            }
        }
    }
    Ok(searches
        .into_iter()
        .map(|x| ZeroLossDepth {
            traffic: x.traffic.name(),
            architecture: x.architecture.name(),
            load: cfg.near_one,
            depth: x.clean,
            loss_at_depth_1: x.loss_at_1,
        })
        .collect())
}

/// Whether a run of the search loses nothing: no cell dropped in the whole run, warm-up
/// included (a depth whose warm-up drops is not one without loss, even if the window's
/// cells happen to get through), none stranded, and not stopped saturated.
fn loses_nothing(r: &Report) -> bool {
    r.saturated_at.is_none() && r.counters.dropped_total() == 0 && r.stranded == 0
}

fn loss_claims(zero: &[ZeroLossDepth], rows: &[LossRow]) -> Vec<Claim> {
    let find = |traffic: &str, arch: &str| {
        zero.iter()
            .find(|z| z.traffic == traffic && z.architecture == arch)
    };
    let depth = |z: &ZeroLossDepth| {
        z.depth
            .map_or("beyond the search".into(), |d| d.to_string())
    };
    let mut claims = Vec::new();
    if let (Some(c), Some(p)) = (find("uniform", "CPRR"), find("uniform", "PIM")) {
        claims.push(Claim {
            what: format!("uniform, r = {}: smallest FIFO depth without loss", c.load),
            paper: "CPRR 33, PIM 153".into(),
            measured: format!("CPRR {}, PIM {}", depth(c), depth(p)),
        });
        // Loss at depth 1 from the grid's top rate (r = 1 by default): no depth loses
        // nothing there, so the search above runs just below it.
        let depth_1 = |arch: &str| {
            rows.iter()
                .filter(|r| r.traffic == "uniform" && r.architecture == arch && r.depth == 1)
                .max_by(|a, b| a.report.load.total_cmp(&b.report.load))
        };
        if let (Some(c), Some(p)) = (depth_1("CPRR"), depth_1("PIM")) {
            claims.push(Claim {
                what: format!("uniform, r = {}: loss at depth 1", c.report.load),
                paper: "CPRR 5.2%, PIM 16.1%".into(),
                measured: format!(
                    "CPRR {}, PIM {}",
                    loss_text(&c.report, 1),
                    loss_text(&p.report, 1)
                ),
            });
        }
    }
    for (traffic, alt) in [("bursty", "PIM"), ("nonuniform", "EDRRM")] {
        if let (Some(c), Some(a)) = (find(traffic, "CPRR"), find(traffic, alt)) {
            claims.push(Claim {
                what: format!(
                    "{traffic}, r = {}: smallest FIFO depth without loss",
                    c.load
                ),
                paper: format!("CPRR small; {alt} beyond the paper's design space"),
                measured: format!("CPRR {}, {alt} {}", depth(c), depth(a)),
            });
        }
    }
    claims
}

/// A loss ratio in percent with `decimals`, or `saturated` for a point that has none.
/// A loss ratio as a percentage; `-` when the point has none (saturated, or no cell
/// measured).
fn percent(ratio: Option<f64>, decimals: usize) -> String {
    ratio.map_or("-".into(), |r| format!("{:.*}%", decimals, r * 100.0))
}

/// A point's loss ratio as a percentage, or why it has none.
fn loss_text(r: &Report, decimals: usize) -> String {
    match r.loss_ratio {
        _ if r.saturated_at.is_some() => "saturated".into(),
        None => "no cell measured".into(),
        ratio => percent(ratio, decimals),
    }
}

impl Figure for FabricLossReport {
    fn name(&self) -> &'static str {
        "fabric-loss"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        vec![
            "traffic",
            "architecture",
            "load",
            "depth",
            "loss_ratio",
            "measured",
            "dropped",
            "stranded",
            "throughput",
            "saturated",
        ]
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let p = &r.report;
                // An absent value (a saturated point's loss ratio) is an empty field.
                let or_empty = |v: Option<String>| v.unwrap_or_default();
                vec![
                    r.traffic.to_string(),
                    r.architecture.clone(),
                    p.load.to_string(),
                    r.depth.to_string(),
                    or_empty(p.loss_ratio.map(|v| format!("{v:.6}"))),
                    p.measured.to_string(),
                    p.dropped.to_string(),
                    p.stranded.to_string(),
                    or_empty(p.throughput.map(|v| format!("{v:.5}"))),
                    p.saturated_at.is_some().to_string(),
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), PlotError> {
        let mut panels = Vec::new();
        for traffic in self.config.switch.traffic() {
            for arch in loss_architectures(traffic) {
                let name = arch.name();
                let lines = self
                    .config
                    .loads
                    .iter()
                    .enumerate()
                    .map(|(i, &load)| Line {
                        series: Series {
                            name: format!("r = {load}"),
                            points: self
                                .rows
                                .iter()
                                .filter(|r| {
                                    r.traffic == traffic.name()
                                        && r.architecture == name
                                        && r.report.load == load
                                })
                                .filter_map(|r| Some((r.depth as f64, r.report.loss_ratio?)))
                                .collect(),
                        },
                        color: i,
                        dashed: false,
                    })
                    .collect();
                panels.push(Panel {
                    title: format!("{}: {name}", traffic.name()),
                    x_label: "FIFO depth D".into(),
                    y_label: "loss ratio".into(),
                    y_log: true,
                    x_log2: true,
                    lines,
                });
            }
        }
        let p = self.config.switch.ports;
        plot::svg_panels(
            path,
            &Panels {
                title: &format!("Figure 13: loss against FIFO depth, {p} x {p} switch"),
                columns: 2,
                panels,
            },
        )
    }

    fn table(&self) -> String {
        let mut t = String::from("smallest FIFO depth without loss, and loss at depth 1\n");
        for z in &self.zero_loss {
            t += &format!(
                "{:<11} {:<6} r = {}: {:>18}  loss at D = 1: {}\n",
                z.traffic,
                z.architecture,
                z.load,
                z.depth
                    .map_or(format!("> {}", self.config.max_depth), |d| d.to_string()),
                percent(z.loss_at_depth_1, 2)
            );
        }
        for c in &self.key {
            t += &format!("{}: paper {}; measured {}\n", c.what, c.paper, c.measured);
        }
        t += &format!("{} points in {:.1} s", self.rows.len(), self.seconds);
        t
    }

    fn verified(&self) -> bool {
        self.verified
    }
}
