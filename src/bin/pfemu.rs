//! `pfemu`: run and benchmark the Trio-like PFE emulator.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use pfemu::bench::demo::DemoConfig;
use pfemu::bench::filter::{self, FilterBenchConfig, FilterBenchReport};
use pfemu::bench::timers::{self, TimerBenchConfig};
use pfemu::bench::trio_ml::{self, TrioMlBenchConfig, TrioMlBenchReport};
use pfemu::pfe::{
    default_ppe_threads, DEFAULT_BATCH_SIZE, DEFAULT_CAPACITY, DEFAULT_REORDER_CONTEXTS,
};

#[derive(Parser, Debug)]
#[command(
    name = "pfemu",
    version,
    about = "An emulator of a Trio-like Packet Forwarding Engine",
    long_about = "An emulator of a Trio-like Packet Forwarding Engine: Microcode-like programs run to \
                  completion on hundreds of PPE threads that share a banked read-modify-write memory; \
                  a reorder engine keeps each flow in order.\n\nWith no command, runs the default job: \
                  the Trio-ML demo (`pfemu demo`): four workers allreduce real vectors through the \
                  PFE, once all together and once with a straggler the PFE's timer threads give up \
                  on, and every sum is checked."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The Trio-ML demo (the default job): workers allreduce vectors, one straggles.
    Demo {
        /// Workers (sources) of the job.
        #[arg(long, default_value_t = 4)]
        workers: u8,
        /// Gradients in each worker's vector.
        #[arg(long, default_value_t = 100_000)]
        gradients: usize,
        /// Block timeout in milliseconds (the job's block_exp).
        #[arg(long, default_value_t = 10)]
        block_exp_ms: u8,
        /// How late the straggler is, in milliseconds.
        #[arg(long, default_value_t = 200)]
        straggle_ms: u64,
        /// PPE threads.
        #[arg(long, default_value_t = 64)]
        ppe_threads: usize,
        /// Print one JSON object instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Run a shipped program on generated traffic and print a summary (the default job).
    Run {
        /// The program to run.
        #[arg(value_enum, default_value_t = Workload::Filter)]
        program: Workload,
        #[command(flatten)]
        traffic: TrafficArgs,
        /// PPE threads (default: available cores).
        #[arg(long)]
        ppe_threads: Option<usize>,
    },
    /// Measure a program or a block of the engine.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// The paper's packet filter through the full PFE.
    #[command(after_help = "Examples:\n  \
        pfemu bench filter --size 64 --flows 1024\n  \
        pfemu bench filter --ppe-threads 2,256 --reorder both --runs 5\n  \
        pfemu bench filter --json > report.json\n\n\
        Traffic is generated before the clock starts (90% plain IPv4, 5% IPv4 with options, 5% \
        non-IP); the clock runs from the first frame in to the last frame out, and the filter's \
        counters are checked against the traffic (exit status 2 if they do not match).")]
    Filter(FilterArgs),
    /// Launch jitter of staggered timer threads on the real clock.
    #[command(after_help = "Examples:\n  \
        pfemu bench timers\n  \
        pfemu bench timers --timers 100 --period-ms 10 --load\n\n\
        Each timer thread records how late it started (engine clock at its first instruction \
        minus its scheduled time): the launcher's sleep overshoot, the hand-off through \
        dispatch, and with --load the wait for a PPE thread to finish its batch.")]
    Timers(TimerArgs),
    /// Trio-ML gradient aggregation through the full PFE, against a plain Rust loop.
    #[command(after_help = "Examples:\n  \
        pfemu bench trio-ml\n  \
        pfemu bench trio-ml --grads 1024 --window 2047 --workers 4 --json\n\n\
        Each worker streams `window` blocks of `grads` gradients per generation; a generation \
        starts when the previous one's Results are out. The clock runs from the first packet \
        in to the last Result out; the last generation's sums are checked (exit status 2 if \
        they do not match). The baseline is one thread adding the same packets into the same \
        layout with no engine.")]
    TrioMl(TrioMlArgs),
}

#[derive(clap::Args, Debug)]
struct TrioMlArgs {
    /// Sources (workers) of the job.
    #[arg(long, default_value_t = 4)]
    workers: u8,
    /// Gradients per packet (1..=4095).
    #[arg(long, default_value_t = 1024)]
    grads: u16,
    /// Blocks each worker has outstanding (at most 2047: a job holds 2 x window slots).
    #[arg(long, default_value_t = 2047)]
    window: u16,
    /// Generations streamed per run.
    #[arg(long, default_value_t = 16)]
    generations: u32,
    /// PPE threads; a comma-separated list measures each, interleaved.
    #[arg(long, value_delimiter = ',')]
    ppe_threads: Vec<usize>,
    /// Do not run the straggler-scan timer threads meanwhile.
    #[arg(long)]
    no_timers: bool,
    /// Staggered scan timers (Trio-ML's N).
    #[arg(long, default_value_t = pfemu::microcode::trio_ml::DEFAULT_TIMERS)]
    timers: u32,
    /// Time between two visits of a block by the scan, in milliseconds.
    #[arg(long, default_value_t = pfemu::microcode::trio_ml::DEFAULT_SCAN_PERIOD_NS as f64 / 1e6)]
    scan_period_ms: f64,
    /// Runs of each configuration; the report gives the median.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct FilterArgs {
    #[command(flatten)]
    traffic: TrafficArgs,
    /// PPE threads; a comma-separated list measures each, interleaved (e.g. 2,256).
    #[arg(long, value_delimiter = ',')]
    ppe_threads: Vec<usize>,
    /// Turn per-flow reordering off (measures the reorder engine's cost).
    #[arg(long, conflicts_with = "reorder")]
    no_reorder: bool,
    /// Per-flow reordering: on, off, or both (measured interleaved in one run).
    #[arg(long, value_enum, default_value_t = ReorderArg::On)]
    reorder: ReorderArg,
    /// Packets per dispatch batch.
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE)]
    batch: usize,
    /// Packets in flight at most.
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    capacity: usize,
    /// Reorder contexts flows are folded into (a power of two).
    #[arg(long, default_value_t = DEFAULT_REORDER_CONTEXTS)]
    reorder_contexts: usize,
    /// Pin PPE threads to cores.
    #[arg(long)]
    pin: bool,
    /// Runs of each configuration; the report gives the median.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct TimerArgs {
    /// Staggered timers (the paper uses 100).
    #[arg(long, default_value_t = 100)]
    timers: u32,
    /// Each timer's period in milliseconds (launches come every period / timers).
    #[arg(long, default_value_t = 10.0)]
    period_ms: f64,
    /// Seconds to run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// PPE threads (default: available cores).
    #[arg(long)]
    ppe_threads: Option<usize>,
    /// Keep the PPE threads busy with 64-byte filter traffic meanwhile.
    #[arg(long)]
    load: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug, Clone)]
struct TrafficArgs {
    /// Frames to offer.
    #[arg(long, default_value_t = 10_000_000)]
    packets: u64,
    /// Frame size in bytes (64..=9216).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Distinct flows (IPv4 5-tuples).
    #[arg(long, default_value_t = 1024)]
    flows: u32,
    /// Seed of the traffic generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    /// The paper's packet filter (§3.2): forward plain IPv4, drop and count the rest.
    Filter,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ReorderArg {
    On,
    Off,
    Both,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => demo(&DemoConfig::default(), false),
        Some(Command::Demo {
            workers,
            gradients,
            block_exp_ms,
            straggle_ms,
            ppe_threads,
            json,
        }) => demo(
            &DemoConfig {
                workers,
                gradients,
                block_exp_ms,
                straggle_ms,
                ppe_threads,
                ..DemoConfig::default()
            },
            json,
        ),
        Some(Command::Run {
            program: Workload::Filter,
            traffic,
            ppe_threads,
        }) => run_filter(&traffic, ppe_threads),
        Some(Command::Bench {
            which: BenchCmd::Filter(a),
        }) => {
            let reorder = if a.no_reorder {
                ReorderArg::Off
            } else {
                a.reorder
            };
            bench_filter(
                &a.traffic,
                a.ppe_threads,
                reorder,
                (a.batch, a.capacity, a.reorder_contexts),
                a.pin,
                a.runs,
                a.json,
            )
        }
        Some(Command::Bench {
            which: BenchCmd::Timers(a),
        }) => bench_timers(&a),
        Some(Command::Bench {
            which: BenchCmd::TrioMl(a),
        }) => bench_trio_ml(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pfemu: {e}");
            ExitCode::from(2)
        }
    }
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

fn bench_trio_ml(a: &TrioMlArgs) -> CliResult {
    if a.runs == 0 {
        return Err("invalid option `--runs`: must be at least 1".into());
    }
    let threads = if a.ppe_threads.is_empty() {
        vec![default_ppe_threads()]
    } else {
        a.ppe_threads.clone()
    };
    let configs: Vec<TrioMlBenchConfig> = threads
        .iter()
        .map(|&t| TrioMlBenchConfig {
            workers: a.workers,
            grads: a.grads,
            window: a.window,
            generations: a.generations,
            ppe_threads: t,
            timers: !a.no_timers,
            scan_timers: a.timers,
            scan_period_ns: (a.scan_period_ms * 1e6) as u64,
            seed: 1,
        })
        .collect();
    let mut traffic = trio_ml::generate(&configs[0]);
    let mut results: Vec<Vec<TrioMlBenchReport>> = vec![Vec::new(); configs.len()];
    for run in 0..a.runs {
        for (i, cfg) in configs.iter().enumerate() {
            let r = trio_ml::run_on(cfg, &mut traffic)?;
            if !a.json {
                eprintln!(
                    "run {}/{}: {} PPE threads: {:.3} G gradients/s ({:.2}x of the plain loop){}",
                    run + 1,
                    a.runs,
                    cfg.ppe_threads,
                    r.gradients_per_s / 1e9,
                    r.ratio_to_baseline,
                    if r.verified {
                        ""
                    } else {
                        "  (SUMS DO NOT MATCH)"
                    }
                );
            }
            results[i].push(r);
        }
    }
    let medians: Vec<TrioMlBenchReport> = results
        .into_iter()
        .map(|mut rs| {
            rs.sort_by(|x, y| x.gradients_per_s.total_cmp(&y.gradients_per_s));
            rs.swap_remove(rs.len() / 2)
        })
        .collect();
    let verified = medians.iter().all(|r| r.verified);
    if a.json {
        if medians.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&medians[0])?);
        } else {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({ "results": medians }))?
            );
        }
    } else {
        println!(
            "\ntrio-ml: {} workers, {} gradients/packet, window {}, {} generations, median of {}:",
            a.workers, a.grads, a.window, a.generations, a.runs
        );
        println!(
            "{:>12} {:>14} {:>10} {:>16} {:>9} {:>11} {:>9}",
            "ppe_threads", "G grads/s", "Gbit/s", "plain loop G/s", "ratio", "instr/grad", "timers"
        );
        for r in &medians {
            println!(
                "{:>12} {:>14.3} {:>10.2} {:>16.3} {:>8.3}x {:>11.4} {:>9}",
                r.ppe_threads,
                r.gradients_per_s / 1e9,
                r.gradient_gbps,
                r.baseline_gradients_per_s / 1e9,
                r.ratio_to_baseline,
                r.instructions_per_gradient,
                r.timer_runs
            );
        }
        let r = &medians[0];
        println!(
            "\n  packets in {}  Results {}  frames out {}  dropped {}  elapsed {:.3} s  \
             instructions/packet {:.1}",
            r.packets_in,
            r.results,
            r.packets_out,
            r.dropped,
            r.elapsed_s,
            r.instructions_per_packet
        );
        let x: Vec<String> = r
            .xtxns_per_packet
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        println!("  XTXNs/packet: {}", x.join(", "));
        if verified {
            println!("  check: every Result arrived; the last generation's sums match");
        }
    }
    if !verified {
        return Err("Trio-ML Results were missing or their sums did not match".into());
    }
    Ok(())
}

fn bench_timers(a: &TimerArgs) -> CliResult {
    if !(a.period_ms > 0.0 && a.period_ms.is_finite()) {
        return Err("invalid option `--period-ms`: must be a positive number".into());
    }
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        return Err("invalid option `--seconds`: must be a positive number".into());
    }
    let cfg = TimerBenchConfig {
        timers: a.timers,
        period_ns: (a.period_ms * 1e6) as u64,
        duration_ms: (a.seconds * 1e3) as u64,
        ppe_threads: a.ppe_threads.unwrap_or_else(default_ppe_threads),
        load: a.load,
    };
    let r = timers::run(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "timers: {} staggered, period {} ms (a launch every {:.1} us), {} PPE threads, {}",
        cfg.timers,
        a.period_ms,
        a.period_ms * 1e3 / f64::from(cfg.timers.max(1)),
        cfg.ppe_threads,
        if cfg.load {
            "with filter traffic"
        } else {
            "idle"
        }
    );
    println!("  launches           {:>12}", r.launches);
    println!("  overruns           {:>12}", r.overruns);
    println!("  missed periods     {:>12}", r.missed);
    println!(
        "  launch jitter      {:>9.1} us p50 {:>9.1} us p99 {:>9.1} us max",
        r.jitter_p50_us, r.jitter_p99_us, r.jitter_max_us
    );
    if cfg.load {
        println!(
            "  packets forwarded  {:>12} ({:.2} Mpps)",
            r.packets_out, r.mpps
        );
    }
    Ok(())
}

fn demo(cfg: &DemoConfig, json: bool) -> CliResult {
    if cfg.workers < 2 {
        return Err("invalid option `--workers`: the demo needs at least 2".into());
    }
    if cfg.gradients == 0 {
        return Err("invalid option `--gradients`: must be at least 1".into());
    }
    if cfg.block_exp_ms == 0 {
        return Err("invalid option `--block-exp-ms`: must be 1..=255".into());
    }
    if !json {
        println!(
            "pfemu: Trio-ML (Trio paper §4-5) on one PFE with {} PPE threads: {} workers \
             allreduce {} f32 gradients each, {} per packet, window {}, block timeout {} ms\n",
            cfg.ppe_threads,
            cfg.workers,
            cfg.gradients,
            cfg.grads_per_packet,
            cfg.window,
            cfg.block_exp_ms
        );
    }
    let r = pfemu::bench::demo::run(cfg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let show = |name: &str, x: &pfemu::bench::demo::RoundReport| {
            println!("{name}");
            println!(
                "  results per worker {:>8}   partial (degraded) {:>6}   src_cnt {:?}",
                x.results / u64::from(cfg.workers - u8::from(x.degraded > 0)).max(1),
                x.degraded,
                x.src_cnt
            );
            println!(
                "  done after         {:>8.1} ms   integer sums exact: {}   largest error of the mean: {:.2e}",
                x.elapsed_ms,
                if x.sums_exact { "yes" } else { "NO" },
                x.max_abs_error
            );
        };
        show("round 1: every worker on time", &r.all_in);
        show(
            &format!(
                "round 2: worker {} is {} ms late; the others get a partial result after the timeout",
                cfg.workers - 1,
                cfg.straggle_ms
            ),
            &r.with_straggler,
        );
        println!(
            "  the straggler, when it woke, was answered with the partial result: {}",
            if r.straggler_answered { "yes" } else { "NO" }
        );
        let s = &r.stats;
        println!("\nthe PFE");
        println!(
            "  packets in {}   Result frames out {}   timer threads run {}",
            s.packets_in, s.frames_tx, s.timer_runs
        );
        let drops: Vec<String> = s
            .dropped_by_reason
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!(
            "  dropped {} ({})",
            s.dropped,
            if drops.is_empty() {
                "none".to_string()
            } else {
                drops.join(", ")
            }
        );
        println!(
            "  instructions per gradient {:.3}   every packet accounted for: {}",
            r.instructions_per_gradient,
            if s.is_conserved() { "yes" } else { "NO" }
        );
    }
    if !r.ok() {
        return Err("the demo's checks failed (see above)".into());
    }
    if !json {
        println!("\ncheck: every sum matches; the straggler was left out only of round 2");
    }
    Ok(())
}

fn run_filter(traffic: &TrafficArgs, ppe_threads: Option<usize>) -> CliResult {
    let cfg = FilterBenchConfig {
        ppe_threads: ppe_threads.unwrap_or_else(default_ppe_threads),
        packets: traffic.packets,
        size: traffic.size,
        flows: traffic.flows,
        reorder: true,
        batch_size: DEFAULT_BATCH_SIZE,
        capacity: DEFAULT_CAPACITY,
        reorder_contexts: DEFAULT_REORDER_CONTEXTS,
        pin: false,
        seed: traffic.seed,
    };
    println!(
        "pfemu: the packet filter (Trio paper §3.2) on {} generated {}-byte frames \
         (90% IPv4, 5% IPv4 with options, 5% non-IP) over {} flows, {} PPE threads, reordering on\n",
        cfg.packets, cfg.size, cfg.flows, cfg.ppe_threads
    );
    let r = filter::run(&cfg)?;
    print_summary(&r);
    if !r.verified {
        return Err("the counters do not match the generated traffic".into());
    }
    println!("\ncheck: counters match the generated traffic; every packet is accounted for");
    Ok(())
}

fn print_summary(r: &FilterBenchReport) {
    println!("  packets in         {:>12}", r.packets_in);
    println!("  forwarded          {:>12}", r.packets_out);
    println!("  dropped            {:>12}", r.dropped_total);
    for (reason, n) in &r.dropped {
        println!("    {reason:<16} {n:>12}");
    }
    println!(
        "  counter non-IP     {:>12} packets {:>14} bytes",
        r.counters.non_ip.0, r.counters.non_ip.1
    );
    println!(
        "  counter IP options {:>12} packets {:>14} bytes",
        r.counters.ip_options.0, r.counters.ip_options.1
    );
    println!("  instructions/pkt   {:>12.2}", r.instructions_per_packet);
    println!("  XTXNs/pkt          {:>12.3}", r.xtxns_per_packet);
    println!(
        "  per-PPE packets    {:>12} min {:>10} max",
        r.per_ppe_min_max.0, r.per_ppe_min_max.1
    );
    println!("  held for reorder   {:>12}", r.reorder_held);
    println!("  elapsed            {:>12.3} s", r.elapsed_s);
    println!(
        "  throughput         {:>12.2} Mpps {:>8.2} Gbit/s",
        r.mpps, r.gbps
    );
}

#[allow(clippy::too_many_arguments)]
fn bench_filter(
    traffic: &TrafficArgs,
    ppe_threads: Vec<usize>,
    reorder: ReorderArg,
    (batch, capacity, reorder_contexts): (usize, usize, usize),
    pin: bool,
    runs: usize,
    json: bool,
) -> CliResult {
    if runs == 0 {
        return Err("invalid option `--runs`: must be at least 1".into());
    }
    let threads = if ppe_threads.is_empty() {
        vec![default_ppe_threads()]
    } else {
        ppe_threads
    };
    let reorders: &[bool] = match reorder {
        ReorderArg::On => &[true],
        ReorderArg::Off => &[false],
        ReorderArg::Both => &[true, false],
    };
    let mut configs = Vec::new();
    for &t in &threads {
        for &r in reorders {
            configs.push(FilterBenchConfig {
                ppe_threads: t,
                packets: traffic.packets,
                size: traffic.size,
                flows: traffic.flows,
                reorder: r,
                batch_size: batch,
                capacity,
                reorder_contexts,
                pin,
                seed: traffic.seed,
            });
        }
    }
    let pool = (traffic.packets as usize).min(filter::POOL_MAX);
    let spec = pfemu::bench::traffic::TrafficSpec {
        packets: pool,
        frame_size: traffic.size,
        flows: traffic.flows,
        seed: traffic.seed,
        ..Default::default()
    };
    let generated = pfemu::bench::traffic::Traffic::generate(&spec)?;
    // Interleave configurations run by run, so drifts of a shared machine hit all alike.
    let mut results: Vec<Vec<FilterBenchReport>> = vec![Vec::new(); configs.len()];
    for run in 0..runs {
        for (i, cfg) in configs.iter().enumerate() {
            let r = filter::run_on(cfg, &generated)?;
            if !json {
                eprintln!(
                    "run {}/{}: {} PPE threads, reorder {}: {:.2} Mpps{}",
                    run + 1,
                    runs,
                    cfg.ppe_threads,
                    if cfg.reorder { "on" } else { "off" },
                    r.mpps,
                    if r.verified {
                        ""
                    } else {
                        "  (COUNTERS DO NOT MATCH)"
                    }
                );
            }
            results[i].push(r);
        }
    }
    let medians: Vec<(FilterBenchReport, Vec<f64>)> = results
        .into_iter()
        .map(|mut rs| {
            let all: Vec<f64> = rs.iter().map(|r| r.mpps).collect();
            rs.sort_by(|a, b| a.mpps.total_cmp(&b.mpps));
            (rs.swap_remove(rs.len() / 2), all)
        })
        .collect();
    let verified = medians.iter().all(|(r, _)| r.verified);
    if json {
        let objects: Vec<serde_json::Value> = medians
            .iter()
            .map(|(r, all)| {
                let mut v = serde_json::to_value(r).expect("reports serialise");
                v["mpps_runs"] = json!(all);
                v
            })
            .collect();
        if objects.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&objects[0])?);
        } else {
            let base = medians[0].0.mpps;
            let ratios: Vec<f64> = medians.iter().map(|(r, _)| r.mpps / base).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &json!({ "results": objects, "mpps_ratio_to_first": ratios })
                )?
            );
        }
    } else {
        println!(
            "\nfilter, {}-byte frames, {} flows, {} packets per run, median of {runs}:",
            traffic.size, traffic.flows, traffic.packets
        );
        println!(
            "{:>12} {:>8} {:>10} {:>10} {:>9} {:>9}",
            "ppe_threads", "reorder", "Mpps", "Gbit/s", "instr/pkt", "vs first"
        );
        let base = medians[0].0.mpps;
        for (r, _) in &medians {
            println!(
                "{:>12} {:>8} {:>10.2} {:>10.2} {:>9.2} {:>8.2}x",
                r.ppe_threads,
                if r.config.reorder { "on" } else { "off" },
                r.mpps,
                r.gbps,
                r.instructions_per_packet,
                r.mpps / base
            );
        }
        if medians.len() == 1 {
            println!();
            print_summary(&medians[0].0);
        }
    }
    if !verified {
        return Err("the filter's counters did not match the generated traffic".into());
    }
    Ok(())
}
