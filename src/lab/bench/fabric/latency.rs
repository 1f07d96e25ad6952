//! Figures 9, 11 and 12: latency and carried load against the input rate, infinite FIFOs.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::{check_loads, run_points, Point, SwitchSettings};
use crate::fabric::latency::{md1_wait, oq_bernoulli_wait};
use crate::fabric::{Architecture, Depth, Iterations, OutputArbiter, Report, Scheduler};
use crate::lab::bench::experiments::{Claim, ExperimentError, Figure};
use crate::lab::bench::plot::{self, Line, Panel, Panels, Series};
use crate::lab::bench::PlotError;

// ----- Figures 9, 11 and 12 ----------------------------------------------------------------

/// Figures 9, 11 and 12 and the throughput of §5.5. As command-line options, those of
/// `pfemu experiment fabric-latency`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FabricLatencyConfig {
    /// The switch and the traffic.
    #[command(flatten)]
    pub switch: SwitchSettings,
    /// Input rates r to measure.
    #[arg(long, value_name = "R,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&FabricLatencyConfig::default().loads),
          help = "Input rates r to measure, in (0, 1]")]
    pub loads: Vec<f64>,
}

impl Default for FabricLatencyConfig {
    /// r = 0.1 to 0.9 by 0.1, then 0.95 and 0.99 (the paper's "near 1").
    fn default() -> Self {
        FabricLatencyConfig {
            switch: SwitchSettings::default(),
            loads: vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99],
        }
    }
}

/// One architecture under one traffic model at one input rate.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    /// `uniform`, `bursty` or `nonuniform` (in JSON `traffic_name`: the run's `traffic`
    /// is the model with its parameters).
    #[serde(rename = "traffic_name")]
    pub traffic: &'static str,
    /// As the paper names it (`CPRR`, `OQ-xbar`, `PIM`, `PIM-1`, ...).
    pub architecture: String,
    /// The run.
    #[serde(flatten)]
    pub report: Report,
}

/// The report of [`fabric_latency`].
#[derive(Clone, Debug, Serialize)]
pub struct FabricLatencyReport {
    /// What was run.
    pub config: FabricLatencyConfig,
    /// One row per architecture, traffic model and input rate.
    pub rows: Vec<LatencyRow>,
    /// Figure 9: CPRR's largest distance from the exact output-queue wait under uniform
    /// traffic, `(P - 1) / P` of equation 7, over the rates up to 0.9, as a fraction; absent
    /// when no such rate was measured.
    pub md1_deviation: Option<f64>,
    /// Near rate 1, per traffic model: CPRR's mean latency and the best alternative's.
    pub key: Vec<Claim>,
    /// Every point conserved its cells, accounted for each measured one and dropped none
    /// (the FIFOs are infinite).
    pub verified: bool,
    /// Wall-clock seconds of the sweep.
    pub seconds: f64,
}

/// Runs Figures 9, 11 and 12; `progress` gets (points done, points).
pub fn fabric_latency(
    cfg: &FabricLatencyConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<FabricLatencyReport, ExperimentError> {
    let s = &cfg.switch;
    s.check()?;
    check_loads("--loads", &cfg.loads)?;
    let mut points = Vec::new();
    for traffic in s.traffic() {
        for &load in &cfg.loads {
            for architecture in Architecture::FIGURE_11 {
                points.push(Point {
                    architecture,
                    traffic,
                    load,
                    depth: Depth::Infinite,
                });
            }
        }
    }
    let start = Instant::now();
    let reports = run_points(s, &points, progress)?;
    let seconds = start.elapsed().as_secs_f64();
    let rows: Vec<LatencyRow> = points
        .iter()
        .zip(reports)
        .map(|(p, report)| LatencyRow {
            traffic: p.traffic.name(),
            architecture: p.architecture.name(),
            report,
        })
        .collect();
    let verified = rows.iter().all(|r| {
        let p = &r.report;
        p.counters.conserved() && p.accounted() && p.dropped == 0 && p.stranded == 0
    });
    let md1_deviation = md1_deviations(&rows, s.ports)
        .map(|(_, deviation)| deviation)
        .reduce(f64::max);
    let key = latency_claims(&rows, &cfg.loads);
    Ok(FabricLatencyReport {
        config: cfg.clone(),
        rows,
        md1_deviation,
        key,
        verified,
        seconds,
    })
}

/// Figure 9's points: (rate, CPRR's distance from the exact output-queue wait as a
/// fraction) under uniform traffic, at each rate up to 0.9 with a mean latency.
fn md1_deviations(rows: &[LatencyRow], ports: usize) -> impl Iterator<Item = (f64, f64)> + '_ {
    rows.iter()
        .filter(|r| r.traffic == "uniform" && r.architecture == "CPRR" && r.report.load <= 0.9)
        .filter_map(move |r| {
            let exact = oq_bernoulli_wait(ports, r.report.load);
            let deviation = (r.report.mean_latency? - exact).abs() / exact.max(1e-9);
            Some((r.report.load, deviation))
        })
}

/// The paper's best alternative per traffic model (§6.1) and its claims near rate 1:
/// (traffic, alternative, mean-latency ratio, CPRR's worst case, the alternative's).
const PAPER_NEAR_ONE: [(&str, &str, f64, u64, u64); 3] = [
    ("uniform", "PIM", 2.0, 375, 1_535),
    ("bursty", "PIM", 1.4, 2_807, 7_992),
    ("nonuniform", "EDRRM", 6.0, 310, 7_212),
];

fn latency_claims(rows: &[LatencyRow], loads: &[f64]) -> Vec<Claim> {
    let top = loads.iter().copied().fold(0.0, f64::max);
    let at = |traffic: &str, arch: &str| {
        rows.iter()
            .find(|r| r.traffic == traffic && r.architecture == arch && r.report.load == top)
    };
    // The latencies of a row that has them (not saturated).
    let latencies = |r: &LatencyRow| Some((r.report.mean_latency?, r.report.avg_worst_latency?));
    let mut claims = Vec::new();
    for (traffic, paper_best, ratio, cprr_worst, best_worst) in PAPER_NEAR_ONE {
        let Some((c_mean, c_worst)) = at(traffic, "CPRR").and_then(latencies) else {
            continue;
        };
        // The best alternative: the crossbar scheduler with the lowest mean latency.
        let best = rows
            .iter()
            .filter(|r| r.traffic == traffic && r.report.load == top)
            .filter(|r| r.architecture != "CPRR" && r.architecture != "OQ-xbar")
            .filter_map(|r| Some((r, latencies(r)?)))
            .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0));
        let Some((best, (b_mean, b_worst))) = best else {
            continue;
        };
        claims.push(Claim {
            what: format!("{traffic}, r = {top}: mean latency, best alternative over CPRR"),
            paper: format!("{paper_best}: {ratio}x"),
            measured: format!(
                "{}: {:.1} / {:.1} = {:.1}x",
                best.architecture,
                b_mean,
                c_mean,
                b_mean / c_mean.max(1e-9)
            ),
        });
        claims.push(Claim {
            what: format!("{traffic}, r = {top}: average worst-case latency, cycles"),
            paper: format!("CPRR {cprr_worst}, {paper_best} {best_worst}"),
            measured: format!("CPRR {:.0}, {} {:.0}", c_worst, best.architecture, b_worst),
        });
    }
    claims
}

impl FabricLatencyReport {
    /// The rows of one traffic model and architecture, in rate order, those that have a `y`
    /// (a saturated point has no latency).
    fn series(&self, traffic: &str, arch: &str, y: impl Fn(&Report) -> Option<f64>) -> Series {
        Series {
            name: arch.to_string(),
            points: self
                .rows
                .iter()
                .filter(|r| r.traffic == traffic && r.architecture == arch)
                .filter_map(|r| Some((r.report.load, y(&r.report)?)))
                .collect(),
        }
    }

    /// One panel per traffic model of `y` against the input rate, every architecture.
    fn panels(
        &self,
        y_label: &str,
        y_log: bool,
        y: impl Fn(&Report) -> Option<f64> + Copy,
    ) -> Vec<Panel> {
        ["uniform", "bursty", "nonuniform"]
            .iter()
            .zip([
                "(a) uniform Bernoulli",
                "(b) uniform bursty",
                "(c) nonuniform",
            ])
            .map(|(traffic, title)| Panel {
                title: title.to_string(),
                x_label: "input rate r".into(),
                y_label: y_label.into(),
                y_log,
                x_log2: false,
                lines: Architecture::FIGURE_11
                    .iter()
                    .map(|a| architecture_line(*a, self.series(traffic, &a.name(), y)))
                    .collect(),
            })
            .collect()
    }
}

/// A series drawn in its architecture's colour: each scheduler one colour, its
/// one-iteration variant dashed.
fn architecture_line(a: Architecture, series: Series) -> Line {
    let (color, dashed) = match a {
        Architecture::Cprr(OutputArbiter::Simple) => (0, false),
        Architecture::Cprr(OutputArbiter::RoundRobin) => (0, true),
        Architecture::OqXbar => (1, false),
        Architecture::Voq(s, it) => {
            let i = Scheduler::ALL.iter().position(|x| *x == s).unwrap_or(0);
            (2 + i, it == Iterations::One)
        }
    };
    Line {
        series,
        color,
        dashed,
    }
}

impl Figure for FabricLatencyReport {
    fn name(&self) -> &'static str {
        "fabric-latency"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        vec![
            "traffic",
            "architecture",
            "load",
            "mean_latency",
            "avg_worst_latency",
            "max_latency",
            "throughput",
            "measured",
            "delivered",
            "dropped",
            "stranded",
            "unfinished",
            "saturated",
            "md1_eq7",
        ]
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let p = &r.report;
                // An absent value (a saturated point's latency) is an empty field.
                let or_empty = |v: Option<String>| v.unwrap_or_default();
                vec![
                    r.traffic.to_string(),
                    r.architecture.clone(),
                    p.load.to_string(),
                    or_empty(p.mean_latency.map(|v| format!("{v:.4}"))),
                    or_empty(p.avg_worst_latency.map(|v| format!("{v:.2}"))),
                    or_empty(p.max_latency.map(|v| v.to_string())),
                    or_empty(p.throughput.map(|v| format!("{v:.5}"))),
                    p.measured.to_string(),
                    p.delivered.to_string(),
                    p.dropped.to_string(),
                    p.stranded.to_string(),
                    p.unfinished.to_string(),
                    p.saturated_at.is_some().to_string(),
                    format!("{:.4}", md1_wait(p.load)),
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), PlotError> {
        let mut panels = self.panels("mean latency (cycles)", true, |r| r.mean_latency);
        panels.extend(
            self.panels("average worst-case latency (cycles)", true, |r| {
                r.avg_worst_latency
            }),
        );
        panels.extend(
            self.panels("carried load (cells / output / cycle)", false, |r| {
                r.throughput
            }),
        );
        // Figure 9: CPRR against equation 7 and the exact output-queue wait.
        let cprr = self.series("uniform", "CPRR", |r| r.mean_latency);
        let ports = self.config.switch.ports;
        let curve = |name: &str, f: &dyn Fn(f64) -> f64| Series {
            name: name.into(),
            points: cprr.points.iter().map(|&(x, _)| (x, f(x))).collect(),
        };
        panels.push(Panel {
            title: "Figure 9: CPRR (uniform) against M/D/1".into(),
            x_label: "input rate r".into(),
            y_label: "mean latency (cycles)".into(),
            y_log: true,
            x_log2: false,
            lines: vec![
                Line {
                    series: cprr.clone(),
                    color: 0,
                    dashed: false,
                },
                Line {
                    series: curve("M/D/1, equation 7", &md1_wait),
                    color: 7,
                    dashed: true,
                },
                Line {
                    series: curve("output queue, (P-1)/P of eq. 7", &|r| {
                        oq_bernoulli_wait(ports, r)
                    }),
                    color: 8,
                    dashed: true,
                },
            ],
        });
        plot::svg_panels(
            path,
            &Panels {
                title: &format!(
                    "Figures 11, 12 and 9: {ports} x {ports} switch, infinite FIFOs (rows: mean \
                     latency, average worst-case latency, carried load)"
                ),
                columns: 3,
                panels,
            },
        )
    }

    fn table(&self) -> String {
        let mut t = String::new();
        for traffic in ["uniform", "bursty", "nonuniform"] {
            t += &format!("{traffic}: mean latency (cycles) by input rate\n");
            t += &format!("{:<10}", "r");
            for a in Architecture::FIGURE_11 {
                t += &format!("{:>10}", a.name());
            }
            t += "\n";
            for &load in &self.config.loads {
                t += &format!("{load:<10}");
                for a in Architecture::FIGURE_11 {
                    let name = a.name();
                    let v = self.rows.iter().find(|r| {
                        r.traffic == traffic && r.architecture == name && r.report.load == load
                    });
                    t += &match v.map(|r| &r.report) {
                        Some(r) if r.saturated_at.is_some() => format!("{:>10}", "saturated"),
                        Some(Report {
                            mean_latency: Some(m),
                            ..
                        }) => format!("{m:>10.2}"),
                        _ => format!("{:>10}", "-"),
                    };
                }
                t += "\n";
            }
            t += "\n";
        }
        if self.rows.iter().any(|r| r.report.saturated_at.is_some()) {
            t += &format!(
                "saturated: the point's queues passed --max-backlog ({} cells) and it stopped: \
                 the switch does not carry that load\n",
                self.config.switch.max_backlog
            );
        }
        // Only over rates that were measured: none up to 0.9, no claim.
        let top = md1_deviations(&self.rows, self.config.switch.ports)
            .map(|(load, _)| load)
            .reduce(f64::max);
        if let (Some(deviation), Some(top)) = (self.md1_deviation, top) {
            t += &format!(
                "Figure 9: CPRR's mean latency is within {:.1}% of the exact output-queue wait, \
                 (P - 1)/P of M/D/1's equation 7, up to r = {top}\n",
                deviation * 100.0
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
