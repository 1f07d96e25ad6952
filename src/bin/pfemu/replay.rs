//! `pfemu replay`: run a pcap or pcapng capture through the PFE and write each port's
//! egress (and optionally the dropped packets) as pcap captures.

use std::path::PathBuf;

use clap::ValueEnum;

use pfemu::fpisa::Variant;
use pfemu::lab::aggregation::{Aggregation, AggregationSetup, JobSpec};
use pfemu::lab::replay::{self, ReplayConfig, ReplayProgram, Routes, Timing};
use pfemu::pfe::default_ppe_threads;

use super::CliResult;

/// The `--help` epilogue.
pub const HELP: &str = "Examples (the samples are in the repository's examples/captures):\n  \
    pfemu replay --pcap examples/captures/filter-mix.pcap --out out/ --drops\n  \
    pfemu replay --pcap examples/captures/l3fwd.pcap --program l3fwd --route-file examples/captures/l3fwd-routes.txt --out out/\n  \
    pfemu replay --pcap examples/captures/trio-ml-workers.pcapng --program trio-ml --job 1:4 --out out/   # Results in out/port1.pcap\n  \
    pfemu replay --pcap in.pcap --timing recorded --speed 10 --json > report.json\n  \
    pfemu replay --pcap examples/captures/trio-ml-workers.pcapng --program trio-ml --job 1:4 --timing capture --out out/\n  \
    tshark -r out/port1.pcap\n\n\
    Reads a classic pcap or a pcapng capture (link type Ethernet), checks all of it first, \
    then injects every packet: a pcap capture's on --port, a pcapng capture's interface i \
    on --port + i (pcapng timestamps at each interface's if_tsresol, microseconds when \
    absent). Writes OUT/port<N>.pcap for every port that sent anything, in the order frames \
    left that port, with egress timestamps on the capture's timeline (first input timestamp \
    + time since the first injection, times --speed with --timing recorded; + the \
    capture clock with --timing capture); nanosecond pcap, link type Ethernet. Packets captured shorter than on the wire are replayed as \
    captured (and counted). Earlier port<N>.pcap and dropped.pcap files in OUT are removed \
    first.\n\n\
    --timing capture replays in capture time: the engine's clock (its timers, the egress \
    timestamps) is moved by the replay to each packet's timestamp (relative to the first) \
    before the packet goes in, every timer launch due by then run first, in order, and \
    nothing sleeps. A frame a packet caused carries that packet's timestamp; a block \
    timeout (--block-exp-ms) follows the capture's own gaps, so which blocks get partial \
    Results, and when, is the same on any machine. The engine drains at each new \
    timestamp (less parallel than --timing fast).\n\n\
    --drops finds each dropped packet exactly by injecting one packet at a time and reading \
    the engine's counters after it drained (slow: for debugging a program, not measuring \
    it), and writes them as captured, with their input timestamps, to OUT/dropped.pcap; the \
    summary (or --json) lists each one's index in the capture (0-based), ingress port and \
    drop reason.\n\n\
    Route files for l3fwd hold one `A.B.C.D/LEN PORT` per line, each prefix once, `#` comments. Without one, \
    --routes random routes are generated, which real captures mostly miss (no_route).\n\n\
    trio-ml, fpisa and fpisa-approx aggregate the capture's Trio-ML packets (Ethernet + \
    IPv4 + UDP to port 12000 + the Trio-ML header + gradients, to 10.0.0.254) for the \
    --job jobs, set up as `pfemu serve` sets them up; job J's Results leave on port J \
    (OUT/portJ.pcap). Aggregated packets are consumed, not dropped. The straggler scan \
    runs meanwhile: a block missing a source gets a partial Result --block-exp-ms after \
    its last packet, and after the last packet the replay waits until every open block \
    has timed out, so those partial Results are written too. With --timing fast or \
    recorded the scan runs on the wall clock, so a stall of the host as long as \
    --block-exp-ms can split a block; with --timing capture it runs on the capture's \
    clock and the outcome is exact. (tshark guesses LLC for UDP \
    port 12000; `tshark -d udp.port==12000,data` shows the Trio-ML bytes as data.)";

/// Program choices of `pfemu replay`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayProgramArg {
    /// The paper's packet filter: plain IPv4 leaves on port 1, the rest is dropped.
    Filter,
    /// IPv4 forwarding: LPM lookup, TTL - 1, MAC rewrite.
    L3fwd,
    /// Trio-ML: 32-bit integer gradients.
    TrioMl,
    /// FPISA (full variant): FP32 gradients.
    Fpisa,
    /// FPISA-A (the approximate variant): FP32 gradients.
    FpisaApprox,
}

impl ReplayProgramArg {
    /// The aggregation it runs, for the aggregation programs.
    fn aggregation(self) -> Option<Aggregation> {
        match self {
            ReplayProgramArg::Filter | ReplayProgramArg::L3fwd => None,
            ReplayProgramArg::TrioMl => Some(Aggregation::TrioMl),
            ReplayProgramArg::Fpisa => Some(Aggregation::Fpisa(Variant::Full)),
            ReplayProgramArg::FpisaApprox => Some(Aggregation::Fpisa(Variant::Approx)),
        }
    }
}

/// Timing choices of `pfemu replay`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimingArg {
    /// As fast as the engine takes frames.
    Fast,
    /// At the capture's timestamps (divided by --speed).
    Recorded,
    /// In capture time: the engine's clock follows the capture's timestamps, moved by the
    /// replay (no waiting), so timeouts and egress timestamps are exact on any machine.
    Capture,
}

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The capture to replay (classic pcap or pcapng, Ethernet).
    #[arg(long, value_name = "FILE")]
    pcap: PathBuf,
    /// The program to run.
    #[arg(long, value_enum, default_value_t = ReplayProgramArg::Filter)]
    program: ReplayProgramArg,
    /// l3fwd: routes to generate (random prefixes over --route-ports ports; not with
    /// --route-file).
    #[arg(long, default_value_t = 1000)]
    routes: usize,
    /// l3fwd: egress ports the generated routes use (not with --route-file).
    #[arg(long, default_value_t = 16)]
    route_ports: u16,
    /// l3fwd: load the routes from this file instead of generating them.
    #[arg(long, value_name = "FILE")]
    route_file: Option<PathBuf>,
    /// When to inject frames, and on which clock the engine runs (capture: the capture's
    /// timestamps, moved by the replay; exact on any machine).
    #[arg(long, value_enum, default_value_t = TimingArg::Fast)]
    timing: TimingArg,
    /// Speed-up factor of --timing recorded (2 = twice as fast as recorded; positive and
    /// finite).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Ingress port of every packet (pcapng: of interface 0; interface i enters on
    /// --port + i).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// trio-ml, fpisa: a job, JOB:N (sources 0..N) or JOB:FIRST..END; repeatable, at least
    /// one. Job J's Results leave on port J.
    #[arg(long = "job", value_name = "JOB:N")]
    jobs: Vec<JobSpec>,
    /// trio-ml, fpisa: more jobs, from a file: one JOB:N or JOB:FIRST..END per line, `#`
    /// comments.
    #[arg(long, value_name = "FILE")]
    jobs_file: Option<PathBuf>,
    /// trio-ml, fpisa: block timeout of every job, in milliseconds (1..=255; default 20):
    /// a block missing a source this long after its last packet gets a partial Result.
    /// Shorter than `pfemu serve`'s 200: a capture replays without the start-up gaps of
    /// worker processes, and the replay waits this long after its last packet for the
    /// partial Results (raise it for `--timing recorded` and `--timing capture` replays of
    /// captures with longer gaps).
    #[arg(long)]
    block_exp_ms: Option<u8>,
    /// trio-ml, fpisa: the largest worker window (each job needs 2 * window block slots;
    /// default 64).
    #[arg(long)]
    window: Option<usize>,
    /// trio-ml, fpisa: block slots per job (block_cnt_max, 1..=4095, at least 2 * window;
    /// default: the paper's 4095 where 1 GiB holds them for every job).
    #[arg(long)]
    block_cnt_max: Option<u16>,
    /// trio-ml, fpisa: most gradients per packet (1..=4095; default 1024).
    #[arg(long)]
    block_grad_max: Option<u16>,
    /// Directory for the output captures (created if missing).
    #[arg(long, value_name = "DIR", default_value = "replay-out")]
    out: PathBuf,
    /// Write the dropped packets to OUT/dropped.pcap (exact, one packet at a time: slow).
    #[arg(long)]
    drops: bool,
    /// PPE threads (default: available cores).
    #[arg(long)]
    ppe_threads: Option<usize>,
    /// Print the report as one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

/// `pfemu replay`. `matches` (the subcommand's) tells an option typed from its default: an
/// option that does not apply to the replay asked for is refused by name, never ignored.
pub fn replay(a: &ReplayArgs, matches: Option<&clap::ArgMatches>) -> CliResult {
    let given = |id: &str| {
        matches.is_some_and(|m| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
    };
    // The value first: a speed that is no speed is wrong whatever the timing.
    if !(a.speed.is_finite() && a.speed > 0.0) {
        return Err(format!(
            "invalid option `--speed`: {} is not a positive, finite speed-up factor",
            a.speed
        )
        .into());
    }
    if a.timing != TimingArg::Recorded && (given("speed") || a.speed != 1.0) {
        return Err("invalid option `--speed`: applies to `--timing recorded` only".into());
    }
    if a.program != ReplayProgramArg::L3fwd && a.route_file.is_some() {
        return Err("invalid option `--route-file`: applies to `--program l3fwd` only".into());
    }
    for (id, flag) in [("routes", "--routes"), ("route_ports", "--route-ports")] {
        if !given(id) {
            continue;
        }
        if a.program != ReplayProgramArg::L3fwd {
            return Err(
                format!("invalid option `{flag}`: applies to `--program l3fwd` only").into(),
            );
        }
        if a.route_file.is_some() {
            return Err(format!(
                "invalid option `{flag}`: shapes generated routes, which --route-file \
                 replaces (the routes come from the file)"
            )
            .into());
        }
    }
    let aggregation = a.program.aggregation();
    if aggregation.is_none() {
        for (given, flag) in [
            (!a.jobs.is_empty(), "--job"),
            (a.jobs_file.is_some(), "--jobs-file"),
            (a.block_exp_ms.is_some(), "--block-exp-ms"),
            (a.window.is_some(), "--window"),
            (a.block_cnt_max.is_some(), "--block-cnt-max"),
            (a.block_grad_max.is_some(), "--block-grad-max"),
        ] {
            if given {
                return Err(format!(
                    "invalid option `{flag}`: applies to `--program trio-ml`, `fpisa` and \
                     `fpisa-approx` only"
                )
                .into());
            }
        }
    }
    let program = match (a.program, aggregation) {
        (_, Some(aggregation)) => {
            let jobs = super::serve::jobs_of(&a.jobs, a.jobs_file.as_deref())?;
            if jobs.is_empty() {
                return Err(format!(
                    "missing option `--job`: `--program {}` needs at least one job, e.g. \
                     `--job 1:4` (job 1, sources 0..4; its Results go to port1.pcap), or \
                     `--jobs-file`",
                    a.program
                        .to_possible_value()
                        .map_or("?".into(), |v| v.get_name().to_string())
                )
                .into());
            }
            let d = AggregationSetup::default();
            ReplayProgram::Aggregation(AggregationSetup {
                aggregation,
                jobs,
                block_exp_ms: a.block_exp_ms.unwrap_or(d.block_exp_ms),
                window: a.window.unwrap_or(d.window),
                block_cnt_max: a.block_cnt_max,
                block_grad_max: a.block_grad_max.unwrap_or(d.block_grad_max),
                ..d
            })
        }
        (ReplayProgramArg::L3fwd, None) if a.route_file.is_none() && a.route_ports == 0 => {
            return Err(
                "invalid option `--route-ports`: 0; generated routes need at least \
                        one egress port"
                    .into(),
            );
        }
        (ReplayProgramArg::L3fwd, None) if a.route_file.is_none() => {
            pfemu::microcode::l3fwd::RouteTable::check_generated_count(a.routes)
                .map_err(|e| format!("invalid option `--routes`: {e}"))?;
            ReplayProgram::L3fwd(Routes::Generated {
                count: a.routes,
                ports: a.route_ports,
                seed: 1,
            })
        }
        (ReplayProgramArg::L3fwd, None) => ReplayProgram::L3fwd(match &a.route_file {
            Some(f) => Routes::File(f.clone()),
            None => Routes::Generated {
                count: a.routes,
                ports: a.route_ports,
                seed: 1,
            },
        }),
        (_, None) => ReplayProgram::Filter,
    };
    let cfg = ReplayConfig {
        program,
        timing: match a.timing {
            TimingArg::Fast => Timing::AsFast,
            TimingArg::Recorded => Timing::Recorded { speed: a.speed },
            TimingArg::Capture => Timing::Capture,
        },
        ppe_threads: a.ppe_threads.unwrap_or_else(default_ppe_threads),
        port: a.port,
        write_drops: a.drops,
    };
    let r = replay::replay_file(&cfg, &a.pcap, &a.out).map_err(|e| match e {
        replay::ReplayError::Config(c) => super::serve::config_error(c),
        e => Box::new(e),
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "replay of {} ({}) through {} ({} PPE threads): {} packets in ({} bytes{}) in {:.3} s",
        a.pcap.display(),
        r.format,
        r.program,
        cfg.ppe_threads,
        r.packets_in,
        r.bytes_in,
        if r.truncated_in > 0 {
            format!(", {} captured short of their length", r.truncated_in)
        } else {
            String::new()
        },
        r.elapsed_s
    );
    if r.packets_in_by_port.len() > 1 {
        for (port, n) in &r.packets_in_by_port {
            println!("  port {port:>4}: {n} packets in");
        }
    }
    for (port, n) in &r.packets_out_by_port {
        println!("  port {port:>4}: {n} frames out");
    }
    println!("  forwarded: {}", r.forwarded);
    if r.consumed > 0 || r.created > 0 {
        println!(
            "  consumed: {} (aggregated; {} Results created)",
            r.consumed, r.created
        );
    }
    if r.open_blocks > 0 {
        println!(
            "  WARNING: {} blocks never finished (no Result left for them)",
            r.open_blocks
        );
    }
    println!("  dropped: {}", r.dropped);
    for (reason, n) in &r.dropped_by_reason {
        println!("    {reason:<20} {n}");
    }
    if a.drops {
        for d in r.drops.iter().take(20) {
            println!("    packet {:>8} (port {}): {}", d.index, d.port, d.reason);
        }
        if r.drops.len() > 20 {
            println!("    ... and {} more (see --json)", r.drops.len() - 20);
        }
    }
    println!("wrote:");
    for f in &r.files {
        println!("  {}", f.display());
    }
    if r.files.is_empty() {
        println!("  nothing (no frame left the engine)");
    }
    Ok(())
}
