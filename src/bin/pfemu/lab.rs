//! `pfemu bench l3fwd`, `pfemu bench nimble`, `pfemu linerate` and `pfemu latency`: the
//! forwarding and rate-limiting benchmarks and the RFC 2544-style tests of the engine as a
//! device under test.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use pfemu::lab::bench::l3fwd::{self, L3fwdBenchConfig};
use pfemu::lab::bench::linerate::{
    self, InitialRate, LatencyReport, LinerateConfig, Progress as SearchProgress,
};
use pfemu::lab::bench::linerate_pfe::{DeviceProgram, PfeDevice, PfeDeviceConfig};
use pfemu::lab::bench::nimble::{self, NimbleBenchConfig, NimbleBenchReport};
use pfemu::lab::bench::report::{Progress, Summary};
use pfemu::lab::bench::runs::{Median, Spread};
use pfemu::lab::bench::settings::list_text;
use pfemu::lab::bench::EngineChoice;
use pfemu::pfe::default_ppe_threads;

use super::CliResult;

/// `--runs` and `--json`, as every packet benchmark here takes them.
#[derive(clap::Args, Debug)]
pub struct Runs {
    /// Runs; the report gives the median (with several, each run's overhead against its
    /// own plain loop too), and every run must pass its check.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Print one JSON object (the median run, with `verified_all_runs`) instead of the
    /// summary.
    #[arg(long)]
    json: bool,
}

impl Runs {
    /// Runs `run` `--runs` times, each with a progress bar (none with `--json`) and a line
    /// on standard error (`line` of the report); the median by `mpps`, and which runs
    /// failed `verified`.
    fn median<R>(
        &self,
        mut run: impl FnMut(&Progress) -> Result<R, Box<dyn std::error::Error>>,
        mpps: impl Fn(&R) -> f64,
        verified: impl Fn(&R) -> bool,
        line: impl Fn(&R) -> String,
    ) -> Result<Median<R>, Box<dyn std::error::Error>> {
        if self.runs == 0 {
            return Err("invalid option `--runs`: must be at least 1".into());
        }
        let mut runs: Vec<R> = Vec::new();
        for i in 0..self.runs {
            let bar = Progress::new(&format!("run {}/{}", i + 1, self.runs), self.json);
            let r = run(&bar)?;
            bar.finish();
            if !self.json {
                eprintln!("run {}/{}: {}", i + 1, self.runs, line(&r));
            }
            runs.push(r);
        }
        Ok(Median::of(runs, mpps, verified).expect("at least one run"))
    }

    /// Prints the median report of `m` as one JSON object with every run's `mpps`,
    /// `verified_all_runs` and `overhead_of_runs` beside it ([`median_json`]).
    fn print_json<R: serde::Serialize>(
        &self,
        m: &Median<R>,
        summary: impl Fn(&R) -> &Summary,
    ) -> CliResult {
        println!(
            "{}",
            serde_json::to_string_pretty(&median_json(m, summary)?)?
        );
        Ok(())
    }
}

/// The median report of `m` as JSON, with every run's `mpps` (`mpps_runs`, in run order),
/// whether every run passed its check (`verified_all_runs`; `verified` is the median
/// run's) and the spread of each run's overhead against its own plain loop
/// (`overhead_of_runs`, [`overhead_of_runs`]; `null` for one run).
pub(crate) fn median_json<R: serde::Serialize>(
    m: &Median<R>,
    summary: impl Fn(&R) -> &Summary,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(&m.median)?;
    v["mpps_runs"] = serde_json::json!(m.measures);
    v["verified_all_runs"] = serde_json::json!(m.verified_all_runs());
    v["overhead_of_runs"] = serde_json::json!(overhead_of_runs(m, summary));
    Ok(v)
}

/// The median, least and greatest of each run's overhead (its plain loop's rate / its
/// engine's, both measured in that run), when there are several runs and each measured its
/// plain loop. The summary's overhead is the run of median rate's, whose plain loop may
/// have met a faster or slower phase of the machine than its engine did.
pub(crate) fn overhead_of_runs<R>(
    m: &Median<R>,
    summary: impl Fn(&R) -> &Summary,
) -> Option<Spread> {
    if m.runs() < 2 {
        return None;
    }
    m.spread_of(|r| summary(r).overhead_ratio)
        .filter(|s| s.min > 0.0)
}

/// The line [`overhead_of_runs`] gives, under a summary (nothing for one run); `of` names
/// the configuration (` (2 PPE threads, reorder on)`) when a sweep's summaries are left
/// out, and is empty otherwise.
pub(crate) fn print_overhead_of_runs<R>(m: &Median<R>, summary: impl Fn(&R) -> &Summary, of: &str) {
    if let Some(s) = overhead_of_runs(m, summary) {
        println!(
            "  Overhead by run{of}: {}, each run's plain loop / its own rate",
            s.text(2, m.runs(), "runs")
        );
    }
}

/// The error of a benchmark some run of which failed its check: which runs, and `what` did
/// not check out. `Ok` when every run passed.
pub(crate) fn check_every_run<R>(m: &Median<R>, what: &str) -> CliResult {
    match m.failed_runs() {
        None => Ok(()),
        Some(runs) => Err(format!("{runs}: {what}").into()),
    }
}

#[derive(clap::Args, Debug)]
pub struct L3fwdArgs {
    #[command(flatten)]
    cfg: L3fwdBenchConfig,
    #[command(flatten)]
    engine: EngineChoice,
    #[command(flatten)]
    runs: Runs,
}

pub fn bench_l3fwd(a: &L3fwdArgs) -> CliResult {
    let cfg = L3fwdBenchConfig {
        engine: a.engine.apply(&a.cfg.engine),
        ..a.cfg.clone()
    };
    if cfg.route_file.is_none() {
        pfemu::microcode::l3fwd::RouteTable::check_generated_count(cfg.routes)
            .map_err(|e| format!("invalid option `--routes`: {e}"))?;
    }
    let spinner = Progress::spinner(
        "generating the routes, the DIR-24-8 table and the traffic",
        a.runs.json,
    );
    let workload = l3fwd::prepare(&cfg);
    spinner.finish();
    let workload = workload?;
    let m = a.runs.median(
        |bar| {
            Ok(l3fwd::run_with_progress(&cfg, &workload, |f, n| {
                bar.set(f, format!("{n} frames"))
            })?)
        },
        |r| r.mpps,
        |r| r.verified,
        |r| {
            format!(
                "{:.2} Mpps (plain loop {:.2}){}",
                r.mpps,
                r.baseline_mpps,
                if r.verified {
                    ""
                } else {
                    "  (COUNTS DO NOT MATCH)"
                }
            )
        },
    )?;
    let r = &m.median;
    if a.runs.json {
        a.runs.print_json(&m, |r| &r.summary)?;
    } else {
        println!(
            "\nl3fwd: {} routes ({} tbl8 groups), {}-byte frames, {} PPE threads, median of {}:\n",
            r.routes, r.tbl8_groups, cfg.size, cfg.engine.ppe_threads, a.runs.runs
        );
        r.summary.print();
        print_overhead_of_runs(&m, |r| &r.summary, "");
        match m.failed_runs() {
            None => println!(
                "  check: in every run, every packet accounted for; forwards per port and \
                 drops per reason match the reference longest-prefix match"
            ),
            Some(runs) => {
                println!("  check: MISMATCH against the reference longest-prefix match in {runs}")
            }
        }
    }
    check_every_run(&m, "l3fwd's forwards or drops did not match the reference")
}

#[derive(clap::Args, Debug)]
pub struct NimbleArgs {
    #[command(flatten)]
    cfg: NimbleBenchConfig,
    #[command(flatten)]
    engine: EngineChoice,
    #[command(flatten)]
    runs: Runs,
}

pub fn bench_nimble(a: &NimbleArgs) -> CliResult {
    let cfg = NimbleBenchConfig {
        engine: a.engine.apply(&a.cfg.engine),
        ..a.cfg.clone()
    };
    let traffic = nimble::prepare(&cfg)?;
    let m = a.runs.median(
        |bar| {
            Ok(nimble::run_with_progress(&cfg, &traffic, |f, n| {
                bar.set(f, format!("{n} frames"))
            })?)
        },
        |r| r.mpps,
        |r| r.verified,
        |r| {
            format!(
                "{:.2} Mpps, {:.1}% admitted (plain loop {:.2}){}",
                r.mpps,
                r.admitted_share * 100.0,
                r.baseline_mpps,
                if r.verified { "" } else { "  (NOT VERIFIED)" }
            )
        },
    )?;
    if a.runs.json {
        a.runs.print_json(&m, |r| &r.summary)?;
    } else {
        print_nimble(&m, &cfg);
    }
    check_every_run(
        &m,
        "nimble's verdicts or admitted bytes did not check out (see `verified`)",
    )
}

/// The text form of a `pfemu bench nimble` report (its median run): the limiter's verdicts
/// per class, ADA's controller, then the common summary and the check of every run.
fn print_nimble(m: &Median<NimbleBenchReport>, cfg: &NimbleBenchConfig) {
    let (r, runs) = (&m.median, m.runs());
    println!(
        "\nnimble ({}): {} classes at {} Gbit/s each, {}-byte frames, {} PPE threads, median \
         of {runs}:\n",
        r.arithmetic, cfg.classes, cfg.rate_gbps, cfg.size, cfg.engine.ppe_threads
    );
    println!(
        "  admitted {} of {} frames ({:.1}%), {:.3} Gbit/s; rate_exceeded {}, no_class {}",
        r.admitted,
        r.stats.packets_in,
        r.admitted_share * 100.0,
        r.admitted_gbps,
        r.rate_exceeded,
        r.no_class
    );
    println!(
        "  {:>5} {:>10} {:>10} {:>10} {:>10} {:>14} {:>14}",
        "class", "offered", "admitted", "Gbit/s", "past rate", "allowed bytes", "table excess"
    );
    for c in &r.classes {
        println!(
            "  {:>5} {:>10} {:>10} {:>10.4} {:>9.1}% {:>14.0} {:>13.2}%{}",
            c.class,
            c.offered_packets,
            c.admitted_packets,
            c.admitted_gbps,
            c.overshoot_share * 100.0,
            c.allowed_bytes,
            c.refill_excess * 100.0,
            if c.within { "" } else { "  OVER" }
        );
    }
    println!(
        "  TCAM lookups per packet: {:.2}",
        r.tcam_lookups_per_packet
    );
    if let (Some(end), Some(start)) = (&r.ada, &r.ada_at_start) {
        println!(
            "  ADA controller this run: {} epochs ({} idle, {} frozen), {} re-populations, \
             {} reads, {} writes; now {} bins, {} table entries",
            end.epochs - start.epochs,
            end.idle_epochs - start.idle_epochs,
            end.frozen_epochs - start.frozen_epochs,
            end.repopulations - start.repopulations,
            end.reads - start.reads,
            end.writes - start.writes,
            end.bins,
            end.table_entries
        );
    }
    println!();
    r.summary.print();
    print_overhead_of_runs(m, |r| &r.summary, "");
    match m.failed_runs() {
        None => println!(
            "  check: in every run, every packet accounted for; admitted + rate_exceeded + \
             no_class = offered; the sink saw every admitted packet; every class within its \
             bucket's bound"
        ),
        Some(runs) if r.verified => {
            println!("  check: FAILED in {runs} (see its line above); the median run shown passed")
        }
        Some(runs) => {
            println!("  check: FAILED in {runs}: see the classes marked OVER, or the counts above")
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceArg {
    /// The paper's packet filter, on plain IPv4 traffic.
    Filter,
    /// l3fwd on traffic to its generated routes (--routes).
    L3fwd,
}

/// What the engine under test is: shared by `linerate` and `latency`.
#[derive(clap::Args, Debug)]
pub struct DeviceArgs {
    /// The program under test.
    #[arg(long, value_enum, default_value_t = DeviceArg::Filter)]
    program: DeviceArg,
    /// Routes for l3fwd.
    #[arg(long, default_value_t = L3fwdBenchConfig::default().routes)]
    routes: usize,
    /// PPE threads [default: available cores].
    #[arg(long)]
    ppe_threads: Option<usize>,
    /// Frames per burst of the paced generator (1 to 4096).
    #[arg(long, default_value_t = PfeDeviceConfig::default().burst)]
    burst: usize,
    /// Milliseconds each trial offers frames (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), default_value_t = LinerateConfig::default().trial_duration.as_millis() as u64)]
    trial_ms: u64,
    /// The line rate, Gbit/s (10, 25, 100, ...; at most 1000).
    #[arg(long, default_value_t = LinerateConfig::default().line_rate_gbps)]
    line_rate: f64,
    /// Directory for the CSV and SVG files.
    #[arg(long, default_value = "pfemu-results")]
    out: PathBuf,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

impl DeviceArgs {
    fn device(&self) -> Result<PfeDevice, Box<dyn std::error::Error>> {
        if self.program == DeviceArg::L3fwd {
            pfemu::microcode::l3fwd::RouteTable::check_generated_count(self.routes)
                .map_err(|e| format!("invalid option `--routes`: {e}"))?;
        }
        Ok(PfeDevice::new(PfeDeviceConfig {
            program: match self.program {
                DeviceArg::Filter => DeviceProgram::Filter,
                DeviceArg::L3fwd => DeviceProgram::L3fwd {
                    routes: self.routes,
                },
            },
            ppe_threads: self.ppe_threads.unwrap_or_else(default_ppe_threads),
            burst: self.burst,
            ..PfeDeviceConfig::default()
        })?)
    }

    fn name(&self) -> &'static str {
        match self.program {
            DeviceArg::Filter => "filter",
            DeviceArg::L3fwd => "l3fwd",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct LinerateArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Frame sizes, bytes, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "N,...",
          default_value = list_text(&LinerateConfig::default().sizes))]
    sizes: Vec<usize>,
    /// Largest loss a passing trial may have, percent of the frames offered.
    #[arg(long, default_value_t = LinerateConfig::default().loss_tolerance * 100.0)]
    loss: f64,
    /// The search stops when its bracket is this narrow, percent of the line rate.
    #[arg(long, default_value_t = LinerateConfig::default().resolution * 100.0)]
    resolution: f64,
    /// Most trials per frame size.
    #[arg(long, default_value_t = LinerateConfig::default().max_trials_per_size)]
    max_trials: u32,
    /// After a failed line-rate trial: `measured` (start from what the device carried) or
    /// `bisect` (RFC 2544's plain binary search).
    #[arg(long, default_value = "measured")]
    initial: InitialRate,
}

pub fn linerate(a: &LinerateArgs) -> CliResult {
    let d = &a.device;
    // The library takes fractions; say what is wrong in the percent the user typed.
    if !(0.0..100.0).contains(&a.loss) {
        return Err(format!(
            "invalid option `--loss`: {} is not a percentage in [0, 100)",
            a.loss
        )
        .into());
    }
    if !(a.resolution > 0.0 && a.resolution <= 100.0) {
        return Err(format!(
            "invalid option `--resolution`: {} is not a percentage of the line rate in (0, 100]",
            a.resolution
        )
        .into());
    }
    let cfg = LinerateConfig {
        sizes: a.sizes.clone(),
        loss_tolerance: a.loss / 100.0,
        trial_duration: Duration::from_millis(d.trial_ms),
        resolution: a.resolution / 100.0,
        line_rate_gbps: d.line_rate,
        max_trials_per_size: a.max_trials,
        initial_rate: a.initial,
        ..LinerateConfig::default()
    };
    cfg.validate()?;
    let mut dev = d.device()?;
    if !d.json {
        eprintln!(
            "pfemu linerate: {} on {} PPE threads, {} Gbit/s line rate, {} ms trials, loss <= {}%",
            d.name(),
            dev.pfe().config().ppe_threads,
            d.line_rate,
            d.trial_ms,
            a.loss
        );
    }
    let bar = Progress::new("linerate", d.json);
    let sizes = cfg.sizes.len();
    let mut done = 0usize;
    let mut report = linerate::search(&mut dev, &cfg, |p| match p {
        SearchProgress::Trial {
            frame_size,
            index,
            record,
        } => bar.set(
            done as f64 / sizes as f64,
            format!(
                "{frame_size} B, trial {index}: {:.3} Mpps, loss {:.3}%",
                record.rate_pps / 1e6,
                record.loss * 100.0
            ),
        ),
        SearchProgress::SizeDone(_) => done += 1,
    })?;
    bar.finish();
    report.program = Some(d.name().to_string());
    let written = report.write_files(&d.out)?;
    let short = report.rows.iter().filter(|r| !r.resolved).count();
    let check = if short == 0 {
        "every frame size's search reached the resolution".to_string()
    } else {
        format!(
            "{short} of {} frame sizes ran out of trials before the resolution (marked *)",
            report.rows.len()
        )
    };
    emit(d, &report, report.table(), &written, &check)
}

#[derive(clap::Args, Debug)]
pub struct LatencyArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Frame size, bytes.
    #[arg(long, default_value_t = L3fwdBenchConfig::default().size)]
    size: usize,
    /// Offered loads, as fractions of the reference rate (above 0, at most 10), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "F,...",
          default_value = list_text(&linerate::default_loads()))]
    loads: Vec<f64>,
    /// The reference rate, Mpps [default: the throughput an RFC 2544 search finds first].
    #[arg(long)]
    reference_mpps: Option<f64>,
}

pub fn latency(a: &LatencyArgs) -> CliResult {
    let d = &a.device;
    let trial = Duration::from_millis(d.trial_ms);
    // Every option is checked before the engine starts or a reference search runs.
    linerate::check_line_rate(d.line_rate)?;
    linerate::check_loads(&a.loads)?;
    if let Some(m) = a.reference_mpps {
        linerate::check_reference(m * 1e6, &a.loads, trial)?;
    }
    let mut dev = d.device()?;
    let reference = match a.reference_mpps {
        Some(m) => m * 1e6,
        None => {
            let cfg = LinerateConfig {
                sizes: vec![a.size],
                trial_duration: trial,
                line_rate_gbps: d.line_rate,
                ..LinerateConfig::default()
            };
            let r = linerate::search(&mut dev, &cfg, |_| {})?;
            let pps = r.rows[0].throughput_pps;
            if pps <= 0.0 {
                return Err("the throughput search found no rate without loss; \
                            give --reference-mpps"
                    .into());
            }
            if !d.json {
                eprintln!(
                    "reference: {:.3} Mpps, the throughput at {} bytes without loss",
                    pps / 1e6,
                    a.size
                );
            }
            pps
        }
    };
    let mut report: LatencyReport =
        linerate::latency_sweep(&mut dev, a.size, &a.loads, reference, trial)?;
    report.program = Some(d.name().to_string());
    let written = report.write_files(&d.out)?;
    let lossy: Vec<String> = report
        .rows
        .iter()
        .filter(|r| r.load <= 1.0 && r.loss > 0.0)
        .map(|r| format!("{:.0}%", r.load * 100.0))
        .collect();
    let check = if lossy.is_empty() {
        "no frame lost at or below 100% of the reference rate".to_string()
    } else {
        format!(
            "frames lost at {} of the reference rate (see loss %)",
            lossy.join(", ")
        )
    };
    emit(d, &report, report.table(), &written, &check)
}

/// Prints a linerate or latency report: one JSON object (the report, the files written, the
/// program) with `--json`, else its table and the files written.
fn emit(
    d: &DeviceArgs,
    report: &impl serde::Serialize,
    table: String,
    written: &linerate::Written,
    check: &str,
) -> CliResult {
    if d.json {
        let mut v = serde_json::to_value(report)?;
        v["files"] = serde_json::to_value(written)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{table}");
        let files: Vec<String> = [
            Some(&written.csv),
            written.trials_csv.as_ref(),
            Some(&written.svg),
        ]
        .into_iter()
        .flatten()
        .map(|p| p.display().to_string())
        .collect();
        println!("wrote {}", files.join(", "));
        super::print_kept(&written.kept);
        println!("check: {check}");
    }
    Ok(())
}
