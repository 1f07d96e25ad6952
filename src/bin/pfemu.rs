//! `pfemu`: run and benchmark the Trio-like PFE emulator.

#[path = "pfemu/ctl.rs"]
mod ctl;
#[path = "pfemu/fabric.rs"]
mod fabric;
#[path = "pfemu/flags.rs"]
mod flags;
#[path = "pfemu/lab.rs"]
mod lab;
#[path = "pfemu/live.rs"]
mod live;
#[path = "pfemu/replay.rs"]
mod replay;
#[path = "pfemu/runtime.rs"]
mod runtime;
#[path = "pfemu/serve.rs"]
mod serve;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use serde_json::json;

use pfemu::lab::bench::ada::AdaConfig;
use pfemu::lab::bench::demo::DemoConfig;
use pfemu::lab::bench::experiments::{
    self, Fig13Config, Fig14Config, Fig15Config, Fig16Config, Figure,
};
use pfemu::lab::bench::fabric::{
    FabricChassisConfig, FabricLatencyConfig, FabricLossConfig, SwitchSettings,
};
use pfemu::lab::bench::filter::{self, FilterBenchConfig, FilterBenchReport};
use pfemu::lab::bench::fpisa_accuracy::{self, AccuracyConfig};
use pfemu::lab::bench::pipelines::PipelinesConfig;
use pfemu::lab::bench::runs::Median;
pub(crate) use pfemu::lab::bench::settings::parse_secs;
use pfemu::lab::bench::timers::{self, TimerBenchConfig};
use pfemu::lab::bench::traffic::{FlowDist, FrameSizes, Mix, TrafficSpec};
use pfemu::lab::bench::trio_ml::{self, TrioMlBenchConfig, TrioMlBenchReport};
use pfemu::lab::bench::{EngineChoice, EngineSweep};
use pfemu::pfe::default_ppe_threads;

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
                  on, and every sum is checked.",
    after_help = "Each command's options, with their defaults, and examples: pfemu <COMMAND> --help.\n\
                  The README explains them: Quick start (demo), Benchmarking (run, bench, linerate, \
                  latency), The paper's Trio-ML experiments (experiment), and Real packets and real \
                  processes (replay, serve, worker)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The Trio-ML demo (the default job): workers allreduce vectors, one straggles.
    Demo {
        #[command(flatten)]
        cfg: DemoConfig,
        /// Print one JSON object instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Run a shipped program on generated traffic once, or between Linux interfaces
    /// (--iface, --tap) until Ctrl-C.
    #[command(after_help = live::HELP)]
    Run {
        /// The program to run [default: filter].
        #[arg(value_enum)]
        program: Option<Workload>,
        #[command(flatten)]
        cfg: FilterBenchConfig,
        #[command(flatten)]
        engine: EngineChoice,
        #[command(flatten)]
        traffic: TrafficArgs,
        #[command(flatten)]
        live: Box<live::LiveArgs>,
    },
    /// Measure a program or a block of the engine.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
    /// The papers' experiments: Trio-ML (Figures 13-16), FPISA's accuracy, Hipernetch's fabric.
    #[command(
        long_about = "Reproduce the Trio paper's Trio-ML experiments (SIGCOMM 2022, §6.2-6.3) \
                      in-process on the real clock: end-host workers on their own threads \
                      stream gradients to a running PFE with Trio-ML installed. Each experiment \
                      writes DIR/<name>.csv (one row per point) and DIR/<name>.svg, prints a \
                      table (or with --json one JSON object: the rows and the key figure), and \
                      checks every Result's sums (exit status 2 if any is wrong or missing).\n\n\
                      Also the FPISA accuracy report (FPISA paper, NSDI 2022, §5.3.1): the \
                      error of FPISA and FPISA-A sums of gradient-like values, host-side \
                      arithmetic only (exit status 2 if an FPISA sum leaves its documented \
                      error bound).\n\n\
                      And Hipernetch's single-switch evaluation (TRETS 2021, §5.5, §6.1) on \
                      the cycle-level fabric models: latency, throughput and loss of CPRR \
                      against the OQ crossbar and VOQ crossbar schedulers (exit status 2 if \
                      a cell is not accounted for).\n\n\
                      And the ADA paper's accuracy evaluation (§V.A): adaptive binning, the \
                      error of lookup-table arithmetic against its entry budget and significant \
                      bits, error propagation and a shifting distribution, host-side \
                      arithmetic only (exit status 2 if a lookup matches no entry or a uniform \
                      population's result leaves its error bound).",
        after_help = EXPERIMENT_HELP
    )]
    Experiment(Box<ExperimentArgs>),
    /// RFC 2544 throughput: the highest rate without loss per frame size; CSV and SVG.
    ///
    /// Per frame size, the highest rate the engine carries without loss (binary search over
    /// paced trials); a table, CSV and SVG.
    #[command(after_help = "Examples:\n  \
        pfemu linerate\n  \
        pfemu linerate --program l3fwd --line-rate 25 --sizes 64,512,1518\n  \
        pfemu linerate --loss 0.1 --trial-ms 1000 --json > linerate.json\n\n\
        Each trial offers frames at one rate for --trial-ms, in bursts, with the engine's \
        non-blocking ingress: frames that find it full are dropped and counted, as a NIC's \
        receive ring overflows. The first trial is at the line rate (20 bytes of preamble and \
        gap per frame on the wire); after a loss the search narrows the rate until its bracket \
        is --resolution percent of the line rate. The generator runs in this process, on the \
        same cores as the PPE threads. Writes DIR/linerate.csv, linerate_trials.csv and \
        linerate.svg (--out).")]
    Linerate(Box<lab::LinerateArgs>),
    /// Latency under load: offered load against p50/p99/p99.9 latency, CSV and SVG.
    #[command(after_help = "Examples:\n  \
        pfemu latency\n  \
        pfemu latency --program l3fwd --size 64 --loads 0.1,0.5,0.9,1.0\n  \
        pfemu latency --reference-mpps 10 --json\n\n\
        Finds the throughput at --size first (as pfemu linerate does), unless \
        --reference-mpps gives it, then runs one paced trial per load (a fraction of that \
        rate) and reports the engine's ingress-to-egress latency percentiles. Writes \
        DIR/latency_<size>.csv and .svg (--out).")]
    Latency(Box<lab::LatencyArgs>),
    /// Replay a pcap or pcapng capture through any shipped program; write each port's
    /// egress (and optionally the dropped packets) as pcap captures.
    #[command(after_help = replay::HELP)]
    Replay(Box<replay::ReplayArgs>),
    /// Reads and changes a running pfemu through its control plane (--control).
    #[command(after_help = ctl::HELP)]
    Ctl(ctl::CtlArgs),
    /// Serve Trio-ML/FPISA aggregation over UDP to real worker processes.
    #[command(after_help = "Examples:\n  \
        pfemu serve --listen 127.0.0.1:12000 --job 1:4\n  \
        pfemu serve --program fpisa --job 1:4 --job 2:8 --block-exp-ms 50 --idle-exit-ms 2000\n  \
        pfemu serve --jobs-file jobs.txt   # one JOB:N or JOB:FIRST..END per line, # comments\n  \
        pfemu serve --job 1:4 --block-exp-ms off   # no straggler timeout: exact sums, however slow a worker\n\n\
        Each datagram's UDP payload is the 12-byte Trio-ML header and the gradients. Results go \
        back to the job's members (each source at the address it last sent from), or with \
        --upstream to the next aggregator. Datagrams that are not aggregation packets, of jobs \
        not configured, or of sources outside their job are dropped and counted; a flood \
        of new blocks is capped at the job's 2 * --window slots. Prints `listening ADDR` first \
        (on standard error with --json, so `--json > serve.json` is one JSON object); \
        stops on --seconds, --idle-exit-ms, SIGINT or SIGTERM: it waits for the open blocks to \
        time out (their partial Results go out; with --block-exp-ms off, a block still missing \
        a worker is left open, counted in open_blocks_left), drains the engine (no Result in \
        flight is lost), and prints the final counters.")]
    Serve(Box<serve::ServeArgs>),
    /// A worker process: allreduce a vector through `pfemu serve` and check the sums.
    #[command(after_help = "Examples:\n  \
        for s in 0 1 2 3; do pfemu worker --server 127.0.0.1:12000 --src $s & done; wait\n  \
        pfemu worker --server 127.0.0.1:12000 --src 0 --workers 1 --vector v.txt")]
    Worker(Box<serve::WorkerArgs>),
}

const EXPERIMENT_HELP: &str = "Experiments:
  fig13  Training iteration time vs straggling probability p (--probabilities, percent).
         Emulated training: --workers workers, --iterations iterations of --compute-ms of
         compute (sleep, in three parts) and an allreduce of --model-gradients gradients.
         The paper's Slow Worker Pattern: at each of three delay points per iteration, with
         probability p one random worker sleeps 0.5-2x the typical iteration time (measured
         first at p = 0). Straggler aware (Trio-ML with timers, --block-exp-ms timeout) vs
         wait-for-all (no timers: blocks finish only when every worker is in, as SwitchML),
         on the same seeded schedule. A straggler left behind resynchronises (skips to the
         iteration in progress). Key figure: the speedup at the largest p (paper: 1.72-1.8x
         at 16%).
  fig14  Time to a partial result vs the block timeout T (--timeouts, ms). One worker never
         sends; the others send --blocks blocks back to back. Per block and worker: time
         from the last of the block's packets being sent to the partial Result arriving.
         Reports p50, mean and max against the bound (1 + 1/N) T + 1 ms, with N = --timers;
         a block ages out within one scan period (--scan-period-ms, 0.5 by default here)
         of its timeout. Key figure: p50 and max within the bound. --virtual-time runs it
         on a clock the experiment moves itself: the timer logic's times alone, the same
         on any machine (on the system clock a sender a busy machine holds up past T
         misses its block, and the row does not verify).
  fig15  Aggregation latency and rate vs gradients per packet (--sizes), window 1: each
         worker sends --blocks packets one at a time. Latency from a packet's send to its
         Result; rate = all workers' gradients per second.
  fig16  Latency and throughput vs window (--windows), --grads gradients per packet, each
         worker sends --blocks packets.
  all    All four, in that order (about half a minute with the defaults); not
         fpisa-accuracy, which measures arithmetic, not the PFE.

  fpisa-accuracy
         The FPISA paper's error analysis (§4.3, §5.3.1, Figure 8) on synthetic gradients:
         for each worker count W (--workers-list), each worker w draws --lanes values from
         N(0, sigma_w), the scales log-spaced over --sigma-decades decades around 1e-3 (one
         by default, which matches the spread of the paper's Figure 7) and dealt to the
         workers in a seeded order. Each lane is summed over the workers in worker order
         by FPISA (shift-and-add unit), FPISA-A (Tofino: left shift up to 2^7, overwrite
         beyond) and sequential f32 addition; the reference is the f64 sum. Per W and
         method: absolute error median, p99 and max, the share of lanes per error decade
         ([0, 1e-12), [1e-12, 1e-10), [1e-10, 1e-8), [1e-8, 1e-6), >= 1e-6), relative
         error, distance to the f32 sum, and FPISA-A's overwrite and left-shift events as
         shares of all additions, overflowed lanes, and the share of lanes whose error exceeds
         FPISA's rounding bound. Checks every FPISA sum against the bound documented in
         src/fpisa.rs. Key figure at 8 workers (paper: >95% of errors in [1e-10, 1e-8],
         overwrites <0.9% of additions). Takes under a second.

  fabric-latency
         Hipernetch's Figures 9, 11 and 12 (TRETS 2021, §5.5, §6.1) on the fabric models: a
         --ports x --ports switch (16), every architecture of Figure 11 (CPRR, OQ-xbar, and a
         VOQ crossbar under PIM, RRM, iSLIP, DRRM, EDRRM with log2(P) iterations and with one,
         -1) under uniform Bernoulli, uniform bursty (mean burst --burst, 32) and nonuniform
         (--same, 0.5) traffic at each input rate (--loads), FIFOs of infinite depth. Each
         point: --warmup cycles, then --cycles measured (10^6), then a drain. Mean latency
         (Figure 11), average worst-case latency (Figure 12), carried load, and CPRR against
         M/D/1's equation 7 (Figure 9). Key figures near rate 1 beside the paper's (2x, 1.4x,
         6x lower mean latency than PIM, PIM, EDRRM). About two minutes on two cores.
  fabric-loss
         Hipernetch's Figure 13: loss against FIFO depth (--depths) at each input rate, CPRR
         against the paper's best alternative per traffic model (PIM, PIM, EDRRM), and the
         smallest depth that loses nothing at --near-one (0.99), searched up to --max-depth
         (paper, uniform: 33 against 153; loss at depth 1: 5.2% against 16.1%).
  fabric Both, with the options they share.
  fabric-chassis
         Trio-ML's hierarchical aggregation (two first-level PFEs with two workers each
         under a top PFE) with the chassis links through a fabric loaded by background
         traffic (--backgrounds, cells per input per cycle), for CPRR, iSLIP-1, iSLIP and
         OQ-xbar: the aggregation's wall time and its frames' cycles in the fabric (which
         runs --cycles-per-us cycles per microsecond). Every sum is checked.
  pipelines
         The dRMT paper's evaluation (Chole et al., SIGCOMM 2017, §4) on the shipped
         programs' operation dependency graphs (filter, l3fwd, the Trio-ML aggregation step),
         any --odg FILE described in JSON, and --graphs seeded random graphs of the paper's
         shape: RMT stages (whole tables, and fine-grained), dRMT processors for one packet
         per cycle with IPC 1 and 2 (heuristics, then the paper's ILP within
         --ilp-node-limit branch-and-bound nodes per solve, so the output is the same on any
         machine; --ilp-time-limit adds an optional wall-clock guard per period, and the
         output names the bound that stopped a solve), the lower bound, each one's latency and threads
         at line rate; beside them the PFE's instructions, XTXNs and threads per packet; and
         throughput as processors shrink, simulated cycle by cycle (RMT's cliff, dRMT's
         decline). Every schedule is validated, every simulated throughput checked.
  ada    The ADA paper's accuracy evaluation (Malekpourshahraki et al., §V.A, Figures 5-7)
         on the binning trie and lookup tables of src/ada, 32-bit operands in [0, 650000):
         Figure 5, Algorithms 1-2 run epoch by epoch (--epoch-operands, --monitor-entries,
         --th-balance 0.2, --th-expansion 2) until --steady-epochs epochs change nothing, on
         uniform, exponential (mean 20000), F(100, 20) x 100000 and two Gaussian mixtures,
         with the total variation distance to the true distribution in bins of 2000; Figure
         6, the bins after each change from b = 1 on a Gaussian (4000, variance 32500); the
         mean and p99 error of square, sqrt, log2, mul and div at each of --budgets entries,
         the prior work's uniform population against ADA's; Figure 7a-b, the uniform
         population against --significant-bits; Figure 7c, 2x and x^2 iterated
         --iterations times; and a shift from exponential to Gaussian operands after
         --shift-after epochs (ADA re-populated per epoch, frozen, uniform). Then §V.B on
         the Nimble rate limiter, run frame by frame on an emulated clock: Figure 8, one
         class offered --nimble-offered-gbps of Poisson frames, its rate halved from 24 to
         12 Gbit/s at --nimble-change-us by the data plane, admitted Gbit/s per
         --nimble-window-us for exact, uniform, static (Nimble's) and ADA arithmetic;
         Table II, the controller's reads and writes per update for ADA(R), ADA(dT) and
         ADA(dT, R), and TCAM lookups per packet in place of RMT stages; Figure 9, the
         controller epochs ADA needs after the change at each of --nimble-table-entries.
         Checks that every lookup finds an entry, every uniform result is within its error
         bound, every frame is admitted or dropped, and exact arithmetic admits its rates
         within 0.5%. Seeded; a few seconds.

Each experiment has its own options, with its defaults (`pfemu experiment fig14 --help`);
`all` takes the options the four share (--workers, --timers, --scan-period-ms,
--ppe-threads, --seed). --out and --json apply to every experiment.

Examples:
  pfemu experiment all
  pfemu experiment fig14 --timeouts 2,5,10 --timers 100 --scan-period-ms 1
  pfemu experiment fig14 --virtual-time
  pfemu experiment fig13 --probabilities 0,16 --iterations 20 --out results/
  pfemu experiment fig15 --sizes 64,256,1024 --blocks 5000 --json > fig15.json
  pfemu experiment fig16 --windows 1,16,256 --no-timers
  pfemu experiment fpisa-accuracy --workers-list 2,8,64 --lanes 100000 --seed 7
  pfemu experiment fabric-latency --loads 0.5,0.9,0.99 --cycles 100000
  pfemu experiment fabric-loss --json > fabric-loss.json
  pfemu experiment pipelines --odg examples/pipelines/l3fwd.json --ilp-node-limit 200
  pfemu experiment ada --budgets 64,240,896 --shift-op square --json > ada.json";

#[derive(Subcommand, Debug)]
enum Which {
    /// Iteration time vs straggling probability.
    Fig13(Fig13Config),
    /// Time to a partial result vs the timeout.
    Fig14(Fig14Config),
    /// Aggregation latency and rate vs gradients per packet.
    Fig15(Fig15Config),
    /// Latency and throughput vs window.
    Fig16(Fig16Config),
    /// All four (not fpisa-accuracy), each with its defaults but for the options given.
    All(AllArgs),
    /// FPISA and FPISA-A error against f64 and f32 sums.
    FpisaAccuracy(AccuracyConfig),
    /// Hipernetch's Figures 9, 11, 12: fabric latency and throughput vs input rate.
    FabricLatency(FabricLatencyConfig),
    /// Hipernetch's Figure 13: fabric loss vs FIFO depth.
    FabricLoss(FabricLossConfig),
    /// Both fabric experiments, each with its defaults but for the options given.
    Fabric(SwitchSettings),
    /// Trio-ML's hierarchical aggregation through a chassis fabric under background load.
    FabricChassis(FabricChassisConfig),
    /// The dRMT paper's evaluation: RMT, fine-grained RMT, dRMT and the PFE on the same programs.
    Pipelines(PipelinesConfig),
    /// The ADA paper's evaluation: adaptive bins, lookup error vs budget, shift, and Nimble's
    /// rate change (Figures 8-9, Table II).
    Ada(AdaConfig),
}

/// What `pfemu experiment all` takes: the options the four figures share, overriding
/// each figure's default.
#[derive(clap::Args, Debug)]
struct AllArgs {
    /// Workers in each job [default: each figure's; see pfemu experiment fig13 --help ...].
    #[arg(long)]
    workers: Option<u8>,
    /// Staggered scan timer threads, Trio-ML's N [default: each figure's].
    #[arg(long)]
    timers: Option<u32>,
    /// Time between two visits of a block by the scan, in ms [default: each figure's].
    #[arg(long = "scan-period-ms", value_name = "MS", value_parser = pfemu::lab::bench::settings::parse_millis_as_ns)]
    scan_period_ns: Option<u64>,
    /// PPE threads [default: available cores].
    #[arg(long)]
    ppe_threads: Option<usize>,
    /// Seed of the gradients and (fig13) the straggle schedules [default: each figure's].
    #[arg(long)]
    seed: Option<u64>,
}

impl AllArgs {
    /// The four figures' configurations: each one's defaults, with these options.
    fn configs(&self) -> (Fig13Config, Fig14Config, Fig15Config, Fig16Config) {
        let (mut f13, mut f14, mut f15, mut f16) = (
            Fig13Config::default(),
            Fig14Config::default(),
            Fig15Config::default(),
            Fig16Config::default(),
        );
        if let Some(w) = self.workers {
            (f13.workers, f14.workers, f15.job.workers, f16.job.workers) = (w, w, w, w);
        }
        if let Some(t) = self.timers {
            (
                f13.timers,
                f14.timers,
                f15.job.scan_timers,
                f16.job.scan_timers,
            ) = (t, t, t, t);
        }
        if let Some(ns) = self.scan_period_ns {
            (
                f13.scan_period_ns,
                f14.scan_period_ns,
                f15.job.scan_period_ns,
                f16.job.scan_period_ns,
            ) = (ns, ns, ns, ns);
        }
        if let Some(n) = self.ppe_threads {
            (
                f13.ppe_threads,
                f14.ppe_threads,
                f15.job.ppe_threads,
                f16.job.ppe_threads,
            ) = (n, n, n, n);
        }
        if let Some(seed) = self.seed {
            (f13.seed, f14.seed, f15.job.seed, f16.job.seed) = (seed, seed, seed, seed);
        }
        (f13, f14, f15, f16)
    }
}

#[derive(clap::Args, Debug)]
struct ExperimentArgs {
    /// The experiment to run.
    #[command(subcommand)]
    which: Which,
    /// Directory for <name>.csv and <name>.svg (created if missing).
    #[arg(long, global = true, default_value = "pfemu-results")]
    out: std::path::PathBuf,
    /// Print one JSON object (the rows and the key figure) instead of the table.
    #[arg(long, global = true)]
    json: bool,
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
        counters are checked against the traffic in every run (exit status 2 if they do not match).\n\n\
        The frames come from a pool of at most 1048576 distinct frames (64 MiB of 64-byte \
        frames; --packets, if fewer), replayed until the run ends; the plain loop runs the \
        filter's work over the same pool on one thread. A pool larger than the caches is \
        streamed from memory, so the plain loop's rate, and the overhead ratio with it, \
        follows the machine's memory more than the engine's does: a smaller pool \
        (--packets 8192 --duration 2) shows the engine's path with the frames cached. Each \
        run measures its own plain loop; with --runs above 1 the report gives every run's \
        overhead too (median, least, greatest), the figure to read on a machine whose speed \
        moves.")]
    Filter(FilterArgs),
    /// Launch jitter of staggered timer threads on the real clock.
    #[command(after_help = "Examples:\n  \
        pfemu bench timers\n  \
        pfemu bench timers --timers 100 --period-ms 10 --load\n\n\
        Each timer thread records how late it started (engine clock at its first instruction \
        minus its scheduled time): the launcher's sleep overshoot, the hand-off through \
        dispatch, and with --load the wait for a PPE thread to finish its batch.")]
    Timers(TimerArgs),
    /// How fast the fabric models simulate, against a loop that only draws their traffic.
    #[command(after_help = "Examples:\n  \
        pfemu bench fabric\n  \
        pfemu bench fabric --ports 32 --load 0.99 --json\n\n\
        Each architecture of Hipernetch's Figure 11 runs uniform Bernoulli traffic for \
        --cycles cycles on one thread; between them, the traffic generator runs alone for as \
        many cycles. Speeds are port-cycles per second (cycles x ports), per core.")]
    Fabric(fabric::FabricBenchArgs),
    /// Trio-ML gradient aggregation through the full PFE, against a plain Rust loop.
    #[command(after_help = "Examples:\n  \
        pfemu bench trio-ml\n  \
        pfemu bench trio-ml --grads 1024 --window 2047 --workers 4 --json\n\n\
        Each worker streams `window` blocks of `grads` gradients per generation; a generation \
        starts when the previous one's Results are out. The clock runs from the first packet \
        in to the last Result out; the last generation's sums are checked in every run (exit status \
        2 if they do not match). The baseline is one thread adding the same packets into the same \
        layout with no engine.")]
    TrioMl(TrioMlArgs),
    /// FPISA aggregation (native FP32 gradients, the engine's shift-and-add) against
    /// Trio-ML's integers on the same workload.
    #[command(after_help = "Examples:\n  \
        pfemu bench fpisa\n  \
        pfemu bench fpisa --variant approx --runs 5 --json\n\n\
        Runs `pfemu bench trio-ml`'s workload twice per round, interleaved: with Trio-ML's \
        32-bit integers and with FPISA lanes (each gradient an FPISA accumulator, added with \
        the RMW engine's shift-and-add, renormalized into FP32 in the Result). The FPISA \
        traffic is integer-valued floats of one binade, which FPISA adds exactly in any order, \
        so every Result is checked bit for bit, in every run of both kinds (exit status 2 if \
        a Trio-ML or an FPISA sum is wrong or missing). Reports the FPISA run (the same fields as \
        `pfemu bench trio-ml --json`), its ratio to Trio-ML, and the end hosts' conversion \
        cost per gradient (Trio-ML scales floats to integers and back; FPISA sends the bits).")]
    Fpisa(FpisaArgs),
    /// l3fwd through the full PFE: parse, validate, LPM on a DIR-24-8 table, TTL and
    /// checksum, MAC rewrite; against a plain Rust loop.
    #[command(after_help = "Examples:\n  \
        pfemu bench l3fwd\n  \
        pfemu bench l3fwd --size 64 --routes 100000 --json\n  \
        pfemu bench l3fwd --route-file routes.txt --invalid-percent 5\n\n\
        Routes are generated (or read from --route-file) and loaded into the DIR-24-8 table \
        in shared memory (tbl24 in DRAM, next hops in SRAM); traffic goes to addresses the \
        routes cover. Forwards per port and drops per reason are checked against a reference \
        longest-prefix match in every run (exit status 2 if they differ). The summary prints the rates, \
        drops, latency, PPE load, per-packet costs and the plain loop's rate on the same \
        frames.")]
    L3fwd(lab::L3fwdArgs),
    /// A Nimble-style rate limiter (a token bucket per ingress port, the refill multiplied
    /// by TCAM lookups, ADA's controller on a timer) through the full PFE on the real clock;
    /// against a plain Rust loop.
    #[command(after_help = "Examples:\n  \
        pfemu bench nimble\n  \
        pfemu bench nimble --arithmetic uniform --classes 8 --rate-gbps 0.05\n  \
        pfemu bench nimble --arithmetic exact --runs 3 --json > nimble.json\n\n\
        Traffic (plain IPv4/UDP, flow i on port i % --classes) is generated before the clock \
        starts; every class gets --rate-gbps and a --burst-bytes bucket. The refill (rate x \
        time since the class's last packet) is a native multiplication (exact) or three to \
        four ternary lookups: log2 rate in the rate's table (uniform: 124 entries; static and \
        ada: ADA's 128, fitted to the rate; ada also counts the rate in its monitoring bins \
        and re-populates every 100 us on a timer thread), log2 time, then the antilog. The \
        clock runs from the first frame in to the last frame out. Checked (exit status 2 if \
        not): every packet accounted for, admitted + rate_exceeded + no_class = offered, the \
        sink saw every admitted packet, and each class admitted at most rate x time (times \
        the table's measured excess) + the bucket + the concurrency overdraw: with two or \
        more PPE threads a class's clock can go back between batches and the time be \
        refilled twice, allowed for up to 1.5 x rate x time more (the `past rate` column and \
        `max_overshoot_share` show what a run leaked; with --ppe-threads 1 the bound is \
        tight). The plain loop runs the same four steps through the same tables on one \
        thread.")]
    Nimble(lab::NimbleArgs),
    /// The filter through a real veth pair (frames offered on one veth, taken by a port,
    /// sent out of another), beside the in-process figure; --search: its RFC 2544
    /// throughput per frame size.
    #[command(after_help = live::BENCH_PORTS_HELP)]
    Ports(live::PortsBenchArgs),
}

#[derive(clap::Args, Debug)]
struct FpisaArgs {
    #[command(flatten)]
    t: TrioMlArgs,
    /// Full FPISA (the shift-and-add memory unit) or FPISA-A.
    #[arg(long, value_enum, default_value_t = FpisaVariant::Full)]
    variant: FpisaVariant,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FpisaVariant {
    /// FPISA with the shift-and-add unit: the stored mantissa is shifted when needed.
    Full,
    /// FPISA-A: only the incoming mantissa is shifted; past 2^7 it overwrites.
    Approx,
}

#[derive(clap::Args, Debug)]
struct TrioMlArgs {
    #[command(flatten)]
    cfg: TrioMlBenchConfig,
    /// PPE threads; a comma-separated list measures each, interleaved [default: available
    /// cores].
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]")]
    ppe_threads: Vec<usize>,
    /// Runs of each configuration; the report gives the median, and every run must pass
    /// its check.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct FilterArgs {
    #[command(flatten)]
    cfg: FilterBenchConfig,
    #[command(flatten)]
    sweep: EngineSweep,
    #[command(flatten)]
    traffic: TrafficArgs,
    /// Runs of each configuration; the report gives the median (with several, each run's
    /// overhead against its own plain loop too), and every run must pass its check.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct TimerArgs {
    #[command(flatten)]
    cfg: TimerBenchConfig,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// The shape of the generated traffic beyond a [`FilterBenchConfig`]'s size, flows and
/// seed (defaults from [`TrafficSpec::default`]).
#[derive(clap::Args, Debug, Clone)]
struct TrafficArgs {
    /// Frame sizes instead of --size: a list cycled in order (`64,594,1518`) or `imix`
    /// (64, 594 and 1518 bytes, 7:4:1).
    #[arg(long)]
    sizes: Option<FrameSizes>,
    /// How packets pick their flow: `uniform` or `zipf[:S]` (exponent S, default 1).
    #[arg(long, default_value_t = TrafficSpec::default().flow_dist)]
    flow_dist: FlowDist,
    /// Protocol mix in percent (omitted classes are 0; the shares sum to 100).
    #[arg(long, default_value_t = TrafficSpec::default().mix)]
    mix: Mix,
}

impl TrafficArgs {
    /// The generator's pool: the traffic replayed until the run ends.
    fn spec(&self, cfg: &FilterBenchConfig) -> TrafficSpec {
        TrafficSpec {
            packets: cfg.pool_frames(),
            frame_size: cfg.size,
            sizes: self.sizes.clone(),
            flows: cfg.flows,
            flow_dist: self.flow_dist,
            mix: self.mix,
            seed: cfg.seed,
            ..Default::default()
        }
    }

    /// What a run offers, for headings: the frame sizes, the flows, and the packets or the
    /// duration per run.
    fn describe(&self, cfg: &FilterBenchConfig) -> String {
        let frames = match &self.sizes {
            Some(sizes) => format!("{sizes} frames"),
            None => format!("{}-byte frames", cfg.size),
        };
        let length = match cfg.duration_s {
            Some(s) => format!("{s} s per run"),
            None => format!("{} packets per run", cfg.packets),
        };
        format!(
            "{frames}, {} flows, {length}, {} distinct frames replayed",
            cfg.flows,
            cfg.pool_frames()
        )
    }
}

use live::Workload;

/// Restores the default action of SIGPIPE (the Rust runtime ignores it), so that when the
/// reader of our output goes away (`pfemu ... | head`) the command ends quietly, as Unix
/// filters do, instead of panicking on the failed write.
#[cfg(unix)]
#[allow(unsafe_code)]
fn end_quietly_on_closed_pipe() {
    // SAFETY: `signal` with `SIG_DFL` only resets a disposition; it runs first thing in
    // `main`, before any other thread exists that could be installing handlers.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn end_quietly_on_closed_pipe() {}

fn main() -> ExitCode {
    end_quietly_on_closed_pipe();
    let matches = Cli::command()
        .try_get_matches()
        .unwrap_or_else(|e| exit_on(e));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| exit_on(e));
    let result = match cli.command {
        None => demo(&DemoConfig::default(), false),
        Some(Command::Demo { cfg, json }) => demo(&cfg, json),
        Some(Command::Run {
            program,
            cfg,
            engine,
            traffic,
            live,
        }) => run(
            program,
            &FilterBenchConfig {
                engine: engine.apply(&cfg.engine),
                ..cfg
            },
            &traffic,
            &live,
            matches.subcommand_matches("run"),
        ),
        Some(Command::Bench {
            which: BenchCmd::Filter(a),
        }) => bench_filter(&a),
        Some(Command::Bench {
            which: BenchCmd::Timers(a),
        }) => bench_timers(&a),
        Some(Command::Bench {
            which: BenchCmd::Fabric(a),
        }) => fabric::bench(&a),
        Some(Command::Bench {
            which: BenchCmd::TrioMl(a),
        }) => bench_trio_ml(&a),
        Some(Command::Bench {
            which: BenchCmd::Fpisa(a),
        }) => bench_fpisa(&a),
        Some(Command::Experiment(a)) => experiment(&a),
        Some(Command::Bench {
            which: BenchCmd::L3fwd(a),
        }) => lab::bench_l3fwd(&a),
        Some(Command::Bench {
            which: BenchCmd::Nimble(a),
        }) => lab::bench_nimble(&a),
        Some(Command::Bench {
            which: BenchCmd::Ports(a),
        }) => live::bench_ports(&a),
        Some(Command::Linerate(a)) => lab::linerate(&a),
        Some(Command::Latency(a)) => lab::latency(&a),
        Some(Command::Replay(a)) => replay::replay(&a, matches.subcommand_matches("replay")),
        Some(Command::Serve(a)) => serve::serve(&a),
        Some(Command::Worker(a)) => serve::worker(&a),
        Some(Command::Ctl(a)) => ctl::ctl(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let top = matches.subcommand_name();
            match flags::refused_option(e.as_ref(), top, &flags::invoked(&matches)) {
                Some(named) => eprintln!("pfemu: {named}"),
                None => eprintln!("pfemu: {e}"),
            }
            ExitCode::from(2)
        }
    }
}

/// Exits on a command-line error; an option given to an experiment it does not apply to is
/// named with the experiments that take it.
fn exit_on(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let args: Vec<String> = std::env::args().collect();
    if e.kind() == ErrorKind::UnknownArgument
        && args.get(1).map(String::as_str) == Some("experiment")
    {
        if let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) {
            let flag = arg.split('=').next().unwrap_or(arg);
            let long = flag.trim_start_matches("--");
            let cmd = Cli::command();
            let owners: Vec<String> = cmd
                .find_subcommand("experiment")
                .into_iter()
                .flat_map(|c| c.get_subcommands())
                .filter(|c| c.get_arguments().any(|a| a.get_long() == Some(long)))
                .map(|c| c.get_name().to_string())
                .collect();
            if !owners.is_empty() {
                let hint = if long == "workers"
                    && args.get(2).map(String::as_str) == Some("fpisa-accuracy")
                {
                    "; fpisa-accuracy takes --workers-list"
                } else {
                    ""
                };
                eprintln!(
                    "pfemu: invalid option `{flag}`: applies to {} only{hint}",
                    owners.join(", ")
                );
                std::process::exit(2);
            }
        }
    }
    e.exit()
}

pub(crate) type CliResult = Result<(), Box<dyn std::error::Error>>;

fn experiment(a: &ExperimentArgs) -> CliResult {
    // Fail on an unusable --out before spending a minute measuring.
    std::fs::create_dir_all(&a.out).map_err(|e| {
        format!(
            "invalid option `--out`: cannot create directory {}: {e}",
            a.out.display()
        )
    })?;
    let mut summary = serde_json::Map::new();
    let mut failed = Vec::new();
    let mut record = |(name, value, verified): (&'static str, serde_json::Value, bool)| {
        if !verified {
            failed.push(name);
        }
        summary.insert(name.to_string(), value);
    };
    let running = |name: &str| {
        if !a.json {
            eprintln!("running {name} ...");
        }
    };
    match &a.which {
        Which::Fig13(cfg) => {
            running("fig13");
            record(emit(&experiments::fig13(cfg)?, a)?);
        }
        Which::Fig14(cfg) => {
            running("fig14");
            record(emit(&experiments::fig14(cfg)?, a)?);
        }
        Which::Fig15(cfg) => {
            running("fig15");
            record(emit(&experiments::fig15(cfg)?, a)?);
        }
        Which::Fig16(cfg) => {
            running("fig16");
            record(emit(&experiments::fig16(cfg)?, a)?);
        }
        Which::FpisaAccuracy(cfg) => {
            running("fpisa-accuracy");
            record(emit(&fpisa_accuracy::fpisa_accuracy(cfg)?, a)?);
        }
        Which::FabricLatency(cfg) => {
            running("fabric-latency");
            record(emit(&fabric::latency(cfg, a.json)?, a)?);
        }
        Which::FabricLoss(cfg) => {
            running("fabric-loss");
            record(emit(&fabric::loss(cfg, a.json)?, a)?);
        }
        Which::Fabric(switch) => {
            let latency = FabricLatencyConfig {
                switch: switch.clone(),
                ..FabricLatencyConfig::default()
            };
            let loss = FabricLossConfig {
                switch: switch.clone(),
                ..FabricLossConfig::default()
            };
            running("fabric-latency");
            record(emit(&fabric::latency(&latency, a.json)?, a)?);
            running("fabric-loss");
            record(emit(&fabric::loss(&loss, a.json)?, a)?);
        }
        Which::FabricChassis(cfg) => {
            running("fabric-chassis");
            record(emit(&fabric::chassis(cfg, a.json)?, a)?);
        }
        Which::Pipelines(cfg) => {
            running("pipelines");
            record(emit(&fabric::pipelines(cfg, a.json)?, a)?);
        }
        Which::Ada(cfg) => {
            running("ada");
            record(emit(&fabric::ada(cfg, a.json)?, a)?);
        }
        Which::All(all) => {
            let (f13, f14, f15, f16) = all.configs();
            running("fig13");
            record(emit(&experiments::fig13(&f13)?, a)?);
            running("fig14");
            record(emit(&experiments::fig14(&f14)?, a)?);
            running("fig15");
            record(emit(&experiments::fig15(&f15)?, a)?);
            running("fig16");
            record(emit(&experiments::fig16(&f16)?, a)?);
        }
    }
    if a.json {
        let out = if summary.len() == 1 {
            summary
                .into_iter()
                .next()
                .map(|(_, v)| v)
                .unwrap_or_default()
        } else {
            serde_json::Value::Object(summary)
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if !failed.is_empty() {
        let why: Vec<String> = failed
            .iter()
            .map(|&name| {
                if name == "fpisa-accuracy" {
                    format!("{name}: an FPISA sum left its documented error bound")
                } else if name == "ada" {
                    format!("{name}: a lookup matched no entry, or a uniform population's result \
                             left its error bound")
                } else if name == "pipelines" {
                    format!("{name}: a schedule failed its validator, or a simulated throughput \
                             differed from the one its schedule promises")
                } else if name.starts_with("fabric") {
                    format!("{name}: a cell was not accounted for, or a FIFO of infinite depth dropped one")
                } else {
                    format!("{name}: Results were missing or their sums did not match")
                }
            })
            .collect();
        return Err(why.join("; ").into());
    }
    Ok(())
}

/// Writes a report's files and prints its table (unless `--json`); returns its name, its
/// JSON and whether it verified.
fn emit<F: Figure>(
    report: &F,
    a: &ExperimentArgs,
) -> Result<(&'static str, serde_json::Value, bool), Box<dyn std::error::Error>> {
    let written = experiments::write_files(report, &a.out)?;
    let mut value = serde_json::to_value(report)?;
    value["experiment"] = json!(report.name());
    value["files"] = json!(written);
    if !a.json {
        println!("{}", report.table());
        println!(
            "wrote {} and {}",
            written.csv.display(),
            written.svg.display()
        );
        print_kept(&written.kept);
        let check = match (report.name(), report.verified()) {
            ("fpisa-accuracy", true) => "every FPISA sum is within its documented error bound",
            ("fpisa-accuracy", false) => "FAILED: an FPISA sum left its documented error bound",
            ("fabric-latency" | "fabric-loss", true) => {
                "every cell is accounted for: delivered, dropped at a full FIFO or still queued"
            }
            ("ada", true) => {
                "every lookup found an entry; every uniform result is within its error bound; \
                 every Nimble frame was admitted or dropped, exact arithmetic within 0.5%"
            }
            ("ada", false) => {
                "FAILED: a lookup matched no entry, a uniform result left its error bound, a \
                 Nimble frame was not accounted for, or exact arithmetic missed its rate"
            }
            ("fabric-chassis", true) => "every worker's sums are exact; no frame was dropped",
            ("fabric-chassis", false) => "FAILED: a sum was wrong or a frame was dropped",
            ("fabric-latency" | "fabric-loss", false) => {
                "FAILED: a cell was not accounted for, or a FIFO of infinite depth dropped one"
            }
            (_, true) => "every Result arrived and its sums match",
            (_, false) => "FAILED: Results were missing or their sums did not match",
        };
        println!("check: {check}\n");
    }
    Ok((report.name(), value, report.verified()))
}

/// Says where an earlier run's files were moved, if any were.
pub(crate) fn print_kept(kept: &[std::path::PathBuf]) {
    if !kept.is_empty() {
        let names: Vec<String> = kept.iter().map(|p| p.display().to_string()).collect();
        println!("kept the earlier run's files as {}", names.join(", "));
    }
}

/// The workload `pfemu bench trio-ml` and `pfemu bench fpisa` share, from their options.
fn trio_ml_bench_config(a: &TrioMlArgs, ppe_threads: usize) -> TrioMlBenchConfig {
    TrioMlBenchConfig {
        ppe_threads,
        ..a.cfg.clone()
    }
}

fn bench_fpisa(a: &FpisaArgs) -> CliResult {
    let t = &a.t;
    if t.ppe_threads.len() > 1 {
        return Err("invalid option `--ppe-threads`: bench fpisa takes one value".into());
    }
    let ppe_threads = t
        .ppe_threads
        .first()
        .copied()
        .unwrap_or_else(default_ppe_threads);
    let cfg = pfemu::lab::bench::fpisa::FpisaBenchConfig {
        base: trio_ml_bench_config(t, ppe_threads),
        variant: match a.variant {
            FpisaVariant::Full => pfemu::fpisa::Variant::Full,
            FpisaVariant::Approx => pfemu::fpisa::Variant::Approx,
        },
        runs: t.runs,
    };
    let json_out = t.json;
    let r = pfemu::lab::bench::fpisa::run(&cfg, |run, kind, r| {
        if !json_out {
            eprintln!(
                "run {}/{}: {kind:>7}: {:.3} G gradients/s ({:.2}x of its plain loop){}",
                run + 1,
                cfg.runs,
                r.gradients_per_s / 1e9,
                r.ratio_to_baseline,
                if r.verified {
                    ""
                } else {
                    "  (SUMS DO NOT MATCH)"
                }
            );
        }
    })?;
    let verified = r.verified_all_runs;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let f = &r.fpisa;
        println!(
            "\nfpisa ({}): {} workers, {} gradients/packet, window {}, {} generations, {} PPE \
             threads, median of {}:",
            r.variant,
            t.cfg.workers,
            t.cfg.grads,
            t.cfg.window,
            t.cfg.generations,
            f.ppe_threads,
            t.runs
        );
        println!(
            "  FPISA    {:.3} G gradients/s ({:.2} Gbit/s), {:.3}x of its plain loop ({:.3} G/s)",
            f.gradients_per_s / 1e9,
            f.gradient_gbps,
            f.ratio_to_baseline,
            f.baseline_gradients_per_s / 1e9
        );
        println!(
            "  Trio-ML  {:.3} G gradients/s; FPISA / Trio-ML = {:.3}x",
            r.trio_ml_gradients_per_s / 1e9,
            r.ratio_to_trio_ml
        );
        if let (true, Some(s)) = (t.runs > 1, r.ratio_to_trio_ml_of_rounds) {
            println!(
                "  FPISA / Trio-ML, each round's two runs: {}",
                s.text(3, t.runs, "rounds")
            );
        }
        println!(
            "  hosts, ns per gradient: FPISA send {:.2} / receive {:.2}; Trio-ML scaling send \
             {:.2} / receive {:.2}",
            r.host.fpisa_send_ns,
            r.host.fpisa_receive_ns,
            r.host.trio_ml_send_ns,
            r.host.trio_ml_receive_ns
        );
        println!();
        f.summary.print();
        match &r.failed_runs {
            None => println!(
                "  check: in every run of both kinds, every Result arrived; the last \
                 generation's sums match bit for bit"
            ),
            Some(runs) => println!(
                "  check: FAILED in {runs}: Results were missing or their sums did not match"
            ),
        }
    }
    match (verified, &r.failed_runs) {
        (true, _) => Ok(()),
        (false, runs) => Err(format!(
            "{}: Results were missing or their sums did not match",
            runs.as_deref().unwrap_or("a run")
        )
        .into()),
    }
}

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
        .map(|&t| trio_ml_bench_config(a, t))
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
    let sets: Vec<Median<TrioMlBenchReport>> = results
        .into_iter()
        .map(|rs| Median::of(rs, |r| r.gradients_per_s, |r| r.verified).expect("runs >= 1"))
        .collect();
    let failed = failed_configurations(&sets, |r| format!("{} PPE threads", r.ppe_threads));
    let medians: Vec<&TrioMlBenchReport> = sets.iter().map(|m| &m.median).collect();
    if a.json {
        let objects = sets
            .iter()
            .map(|m| {
                let mut v = serde_json::to_value(&m.median)?;
                v["verified_all_runs"] = json!(m.verified_all_runs());
                v["ratio_to_baseline_of_runs"] = json!(m.spread_of(|r| r.ratio_to_baseline));
                Ok(v)
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        if objects.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&objects[0])?);
        } else {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "results": objects,
                    "verified_all_runs": failed.is_none(),
                }))?
            );
        }
    } else {
        println!(
            "\ntrio-ml: {} workers, {} gradients/packet, window {}, {} generations, {} packets \
             in flight, median of {}:",
            a.cfg.workers,
            a.cfg.grads,
            a.cfg.window,
            a.cfg.generations,
            medians[0].capacity,
            a.runs
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
                r.stats.timer_runs
            );
        }
        if a.runs > 1 {
            // Each run's ratio pairs the engine with the plain loop measured beside it; the
            // row above is the run of median rate, whose plain loop may be fast or slow.
            for m in &sets {
                if let Some(s) = m.spread_of(|r| r.ratio_to_baseline) {
                    println!(
                        "  ratio, each run to its own plain loop ({} PPE threads): {}",
                        m.median.ppe_threads,
                        s.text(3, m.runs(), "runs")
                    );
                }
            }
        }
        let r = medians[0];
        println!(
            "\n  {} Results of {} gradients, instructions per gradient {:.4}\n",
            r.stats.created, r.grads, r.instructions_per_gradient
        );
        if r.degraded + r.late > 0 {
            println!(
                "  {} partial Results in the last generation, {} late packets: blocks that \
                 outlived the 100 ms block timeout on this machine's clock (checked against \
                 the sources they hold)\n",
                r.degraded, r.late
            );
        }
        r.summary.print();
        match &failed {
            None => println!(
                "  check: in every run, every Result arrived; the last generation's sums match \
                 (a partial one's, those of the sources it holds)"
            ),
            Some(runs) => println!(
                "  check: FAILED in {runs}: Results were missing or their sums did not match"
            ),
        }
    }
    match failed {
        None => Ok(()),
        Some(runs) => {
            Err(format!("{runs}: Trio-ML Results were missing or their sums did not match").into())
        }
    }
}

fn bench_timers(a: &TimerArgs) -> CliResult {
    let cfg = a.cfg.clone();
    let r = timers::run(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "timers: {} staggered, period {} ms (a launch every {:.1} us), {} PPE threads, {}",
        cfg.timers,
        cfg.period_ns as f64 / 1e6,
        cfg.period_ns as f64 / 1e3 / f64::from(cfg.timers.max(1)),
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
    if r.overruns == 0 && r.missed == 0 {
        println!("\ncheck: every timer launched once per period; none overran or missed one");
    } else {
        println!(
            "\ncheck: the timers fell behind: {} overruns, {} missed periods",
            r.overruns, r.missed
        );
    }
    Ok(())
}

fn demo(cfg: &DemoConfig, json: bool) -> CliResult {
    // Refused settings name their option (`flags::refused_option`).
    cfg.check()?;
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
    let r = pfemu::lab::bench::demo::run(cfg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let show = |name: &str, x: &pfemu::lab::bench::demo::RoundReport| {
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

/// `pfemu run`: on interfaces with `--iface` / `--tap`, else the filter on generated traffic.
fn run(
    program: Option<Workload>,
    cfg: &FilterBenchConfig,
    traffic: &TrafficArgs,
    live: &live::LiveArgs,
    matches: Option<&clap::ArgMatches>,
) -> CliResult {
    let workload = match (program, live.program) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "the program is given twice, as {} and as `--program {}`",
                workload_name(a),
                workload_name(b)
            )
            .into())
        }
        (a, b) => a.or(b).unwrap_or(Workload::Filter),
    };
    let given = |id: &str| {
        matches.is_some_and(|m| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
    };
    if live.is_live() {
        if cfg.engine.profile {
            return Err(
                "invalid option `--profile`: applies to a run on generated traffic \
                        only (without --iface or --tap)"
                    .into(),
            );
        }
        // Generated traffic's options mean nothing on interfaces.
        for (id, flag) in [
            ("packets", "--packets"),
            ("size", "--size"),
            ("flows", "--flows"),
            ("seed", "--seed"),
            ("sizes", "--sizes"),
            ("flow_dist", "--flow-dist"),
            ("mix", "--mix"),
        ] {
            if given(id) {
                return Err(format!(
                    "invalid option `{flag}`: shapes generated traffic, which a run on \
                     interfaces (--iface, --tap) does not have"
                )
                .into());
            }
        }
        return live::run(
            live,
            workload,
            cfg.engine.ppe_threads,
            cfg.engine.reorder,
            cfg.duration_s,
        );
    }
    if workload != Workload::Filter {
        return Err(format!(
            "`pfemu run {}` needs ports: bind interfaces with --iface PORT=NAME or --tap \
             PORT=NAME (on generated traffic, pfemu run runs the filter only; see also \
             pfemu bench {0})",
            workload_name(workload)
        )
        .into());
    }
    let live_flag = live.live_only_given().or_else(|| {
        [
            ("stats_every", "--stats-every"),
            ("ring_block_bytes", "--ring-block-bytes"),
            ("ring_blocks", "--ring-blocks"),
            ("ring_block_timeout_ms", "--ring-block-timeout-ms"),
        ]
        .into_iter()
        .find(|(id, _)| given(id))
        .map(|(_, f)| f)
    });
    if let Some(flag) = live_flag {
        return Err(format!(
            "invalid option `{flag}`: applies to a run on interfaces (--iface, --tap) only"
        )
        .into());
    }
    run_filter(cfg, traffic)
}

/// A program's name as `pfemu run` spells it.
fn workload_name(w: Workload) -> String {
    w.to_possible_value()
        .map_or_else(|| "?".to_string(), |v| v.get_name().to_string())
}

fn run_filter(cfg: &FilterBenchConfig, traffic: &TrafficArgs) -> CliResult {
    let mix = traffic.mix;
    println!(
        "pfemu: the packet filter (Trio paper §3.2) on generated traffic: {} ({}% IPv4, {}% \
         IPv4 with options, {}% IPv6, {}% non-IP), {} PPE threads, reordering {}\n",
        traffic.describe(cfg),
        mix.ipv4,
        mix.ipv4_options,
        mix.ipv6,
        mix.non_ip,
        cfg.engine.ppe_threads,
        if cfg.engine.reorder { "on" } else { "off" }
    );
    let generated = pfemu::lab::bench::traffic::Traffic::generate(&traffic.spec(cfg))?;
    let bar = pfemu::lab::bench::report::Progress::new("run", false);
    let r = filter::run_with_progress(cfg, &generated, |f, n| bar.set(f, format!("{n} frames")))?;
    bar.finish();
    print_summary(&r);
    println!();
    r.summary.print();
    if !r.verified {
        return Err("the counters do not match the generated traffic".into());
    }
    println!("\ncheck: counters match the generated traffic; every packet is accounted for");
    Ok(())
}

fn print_summary(r: &FilterBenchReport) {
    let s = &r.stats;
    println!("  packets in         {:>12}", s.packets_in);
    println!("  forwarded          {:>12}", s.packets_out);
    println!("  dropped            {:>12}", s.dropped);
    for (reason, n) in &s.dropped_by_reason {
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
        s.per_ppe_packets.iter().min().unwrap_or(&0),
        s.per_ppe_packets.iter().max().unwrap_or(&0)
    );
    println!("  held for reorder   {:>12}", s.reorder_held);
    println!(
        "  batches            {:>12} mean {:>8.1} packets (see --max-batch)",
        s.batches,
        s.mean_batch()
    );
    println!("  elapsed            {:>12.3} s", r.elapsed_s);
    println!(
        "  throughput         {:>12.2} Mpps {:>8.2} Gbit/s",
        r.mpps, r.gbps
    );
}

fn bench_filter(a: &FilterArgs) -> CliResult {
    let (runs, json, traffic) = (a.runs, a.json, &a.traffic);
    if runs == 0 {
        return Err("invalid option `--runs`: must be at least 1".into());
    }
    let configs: Vec<FilterBenchConfig> = a
        .sweep
        .points(&a.cfg.engine)
        .into_iter()
        .map(|engine| FilterBenchConfig {
            engine,
            ..a.cfg.clone()
        })
        .collect();
    let generated = pfemu::lab::bench::traffic::Traffic::generate(&traffic.spec(&a.cfg))?;
    // Interleave configurations run by run, so drifts of a shared machine hit all alike.
    let mut results: Vec<Vec<FilterBenchReport>> = vec![Vec::new(); configs.len()];
    for run in 0..runs {
        for (i, cfg) in configs.iter().enumerate() {
            let bar =
                pfemu::lab::bench::report::Progress::new(&format!("run {}/{runs}", run + 1), json);
            let r = filter::run_with_progress(cfg, &generated, |f, n| {
                bar.set(f, format!("{n} frames"))
            })?;
            bar.finish();
            if !json {
                eprintln!(
                    "run {}/{}: {} PPE threads, reorder {}: {:.2} Mpps{}",
                    run + 1,
                    runs,
                    cfg.engine.ppe_threads,
                    if cfg.engine.reorder { "on" } else { "off" },
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
    let sets: Vec<Median<FilterBenchReport>> = results
        .into_iter()
        .map(|rs| Median::of(rs, |r| r.mpps, |r| r.verified).expect("runs >= 1"))
        .collect();
    let failed = failed_configurations(&sets, |r| {
        format!(
            "{} PPE threads, reorder {}",
            r.ppe_threads,
            if r.config.engine.reorder { "on" } else { "off" }
        )
    });
    let medians: Vec<&FilterBenchReport> = sets.iter().map(|m| &m.median).collect();
    if json {
        let objects = sets
            .iter()
            .map(|m| lab::median_json(m, |r| &r.summary))
            .collect::<Result<Vec<_>, _>>()?;
        if objects.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&objects[0])?);
        } else {
            let base = medians[0].mpps;
            let ratios: Vec<f64> = medians.iter().map(|r| r.mpps / base).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "results": objects,
                    "mpps_ratio_to_first": ratios,
                    "verified_all_runs": failed.is_none(),
                }))?
            );
        }
    } else {
        println!("\nfilter, {}, median of {runs}:", traffic.describe(&a.cfg));
        println!(
            "{:>12} {:>8} {:>10} {:>10} {:>9} {:>9}",
            "ppe_threads", "reorder", "Mpps", "Gbit/s", "instr/pkt", "vs first"
        );
        let base = medians[0].mpps;
        for r in &medians {
            println!(
                "{:>12} {:>8} {:>10.2} {:>10.2} {:>9.2} {:>8.2}x",
                r.ppe_threads,
                if r.config.engine.reorder { "on" } else { "off" },
                r.mpps,
                r.gbps,
                r.instructions_per_packet,
                r.mpps / base
            );
        }
        if medians.len() == 1 {
            println!();
            medians[0].summary.print();
            lab::print_overhead_of_runs(&sets[0], |r| &r.summary, "");
        } else {
            // The summaries are left out of a comparison, but not each configuration's
            // overhead by run, nor what --profile asked for.
            if runs > 1 {
                println!();
            }
            for m in &sets {
                let of = format!(
                    " ({} PPE threads, reorder {})",
                    m.median.ppe_threads,
                    if m.median.config.engine.reorder {
                        "on"
                    } else {
                        "off"
                    }
                );
                lab::print_overhead_of_runs(m, |r| &r.summary, &of);
            }
            for r in &medians {
                if let Some(p) = &r.summary.profile {
                    println!(
                        "\n  {} PPE threads, reorder {}:",
                        r.ppe_threads,
                        if r.config.engine.reorder { "on" } else { "off" }
                    );
                    print!("{}", p.render());
                }
            }
        }
        match &failed {
            None => println!(
                "\ncheck: in every run the counters match the generated traffic; every packet \
                 is accounted for"
            ),
            Some(runs) => println!(
                "\ncheck: FAILED in {runs}: the counters did not match the generated traffic"
            ),
        }
    }
    match failed {
        None => Ok(()),
        Some(runs) => {
            Err(format!("{runs}: the filter's counters did not match the generated traffic").into())
        }
    }
}

/// The runs that failed their check, of every configuration of a sweep (each named by
/// `name` of its median report when there are several): `run 2 of 3 (4 PPE threads)`;
/// `None` when every run of every configuration passed.
fn failed_configurations<R>(sets: &[Median<R>], name: impl Fn(&R) -> String) -> Option<String> {
    let failed: Vec<String> = sets
        .iter()
        .filter_map(|m| {
            let runs = m.failed_runs()?;
            Some(if sets.len() == 1 {
                runs
            } else {
                format!("{runs} ({})", name(&m.median))
            })
        })
        .collect();
    (!failed.is_empty()).then(|| failed.join("; "))
}
