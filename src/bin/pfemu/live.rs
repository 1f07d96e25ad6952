//! `pfemu run --iface ...`: a shipped program between Linux interfaces until Ctrl-C or
//! `--duration`.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::ValueEnum;

use pfemu::fpisa::Variant;
use pfemu::lab::aggregation::{Aggregation, AggregationSetup, JobSpec};
use pfemu::lab::bench::nimble::ArithmeticChoice;
use pfemu::lab::live::{Live, LiveConfig, LiveProgram, LiveReport, NimbleSetup, ProgramCounters};
use pfemu::lab::ports::{PortSpec, PortsConfig, RingConfig};
use pfemu::lab::replay::Routes;

use super::CliResult;

/// The programs `pfemu run` runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// The paper's packet filter (§3.2): forward plain IPv4 to port 1, drop and count the rest.
    Filter,
    /// IPv4 forwarding (LPM on DIR-24-8, TTL - 1, checksum, MAC rewrite); --routes FILE.
    L3fwd,
    /// The Nimble rate limiter: one class per ingress port (--rates), admitted frames to
    /// --out-port.
    Nimble,
    /// Trio-ML aggregation (32-bit integers) of the --job jobs.
    TrioMl,
    /// FPISA aggregation (FP32) of the --job jobs.
    Fpisa,
    /// FPISA-A aggregation of the --job jobs.
    FpisaApprox,
}

/// The `--help` epilogue of `pfemu run`.
pub const HELP: &str = "Examples:\n  \
    pfemu run\n  \
    pfemu run filter --packets 1000000 --ppe-threads 4\n  \
    pfemu run filter --sizes imix --flow-dist zipf:1.1 --duration 2\n  \
    pfemu run --program l3fwd --routes routes.txt --iface 0=veth0 --iface 1=veth2\n  \
    pfemu run --program filter --iface 0=veth0 --iface 1=veth2 --duration 10 --json\n  \
    pfemu run --program nimble --rates 0.1 --iface 0=veth0 --tap 1=tap0\n  \
    pfemu run --program trio-ml --job 1:4 --iface 1=veth1\n\n\
    Without --iface or --tap, generates traffic (the same generator as pfemu bench filter), \
    runs it through the filter once, prints the program's counters and the common summary, \
    and ends with a check line: the counters match the generated traffic and every packet \
    is accounted for (exit status 2 if not).\n\n\
    With --iface PORT=NAME (an existing interface: a veth, a NIC) or --tap PORT=NAME (a TAP \
    device, created if missing and brought up), the PFE is a device on those interfaces, \
    like bmv2's simple_switch -i 0@veth0: every frame arriving on NAME enters the program \
    on PORT, and what the program sends out of PORT leaves on NAME. Interfaces are read \
    through a memory-mapped TPACKET_V3 ring (promiscuous; a block is handed over when full \
    or after --ring-block-timeout-ms) and written with sendmmsg. Needs root (CAP_NET_RAW, \
    and CAP_NET_ADMIN for TAP). Prints `ready: ...` once every port is bound, then a line \
    of counters every --stats-every seconds, and runs until Ctrl-C (SIGINT, SIGTERM) or \
    --duration; then it stops receiving (taking what the rings hold then, however fast frames \
    keep arriving), lets everything in flight leave, and prints every port's counters \
    (--json: one JSON object; the other lines go to standard error), the engine's, the \
    program's, and a check line: every frame received entered the engine and every frame \
    the engine sent left a port or was counted as a drop (exit status 2 if not). A Ctrl-C \
    during the stop (a second one, or one after --duration ended) exits at once, without the \
    report (exit status 130). Drops at the \
    interfaces are counted: rx_kernel_drops (the ring was full), rx_truncated (longer than \
    a ring block), rx_unread (in the ring or the TAP device's queue at the stop), tx \
    errors by errno (EMSGSIZE: longer than the MTU), and tx_kernel_drops (frames the \
    interface dropped after the kernel took them: it had no carrier).\n\n\
    Programs on interfaces: filter (plain IPv4 out of port 1); l3fwd --routes FILE (one \
    `A.B.C.D/LEN PORT` per line; forwarded frames leave port p with destination MAC \
    02:00:00:01:pp:pp and source MAC 02:00:00:00:pp:pp, so give the host behind port p that \
    MAC, and its neighbour entry for its gateway the MAC 02:00:00:00:pp:pp: the README's \
    \"Hosts talking through pfemu\" does it step by step); nimble --rates G0[,G1...] (Gbit/s \
    of the class of port 0, 1, ...; admitted frames leave --out-port); trio-ml, fpisa, \
    fpisa-approx --job JOB:N (aggregation packets to 10.0.0.254, UDP port 12000; job J's \
    Results leave port J).\n\n\
    Hosts that send TCP through a veth must turn segmentation offload off on their end \
    (`ip link set dev X gso_max_segs 1`), or their frames exceed the MTU: those longer \
    than the engine takes (9216 bytes) are dropped as they arrive (oversize), the others \
    are counted as EMSGSIZE tx errors where they leave; a warning says so. Offloaded \
    checksums are completed by the ports.\n\n\
    While it runs on interfaces: --control [ADDR] serves the runtime control plane (HTTP with \
    JSON; `pfemu ctl` is its client): counters, shared memory, timers, and the program's \
    tables (l3fwd's routes: `pfemu ctl --control ADDR call routes add '{\"route\": \
    \"10.0.3.0/24\", \"port\": 2}'`; Nimble's classes and ADA tables; aggregation jobs), and \
    Prometheus metrics at /metrics. --trace prints what chosen packets did (instructions by \
    label, every XTXN with its address and value, the verdict, the reorder wait), narrowed by \
    --trace-port, --trace-host, --trace-one-in and --trace-limit (1000 by default), as text \
    or --trace-json, to standard error or --trace-file.";

/// The options of a run on interfaces.
#[derive(clap::Args, Debug)]
pub struct LiveArgs {
    /// Bind PFE port PORT to interface NAME (repeatable): frames arriving on NAME enter
    /// on PORT, frames the program sends out of PORT leave on NAME.
    #[arg(long = "iface", value_name = "PORT=NAME", value_parser = parse_iface)]
    pub ifaces: Vec<PortSpec>,
    /// Bind PFE port PORT to TAP device NAME, created if it does not exist and brought up
    /// (repeatable): a port on this host's own stack.
    #[arg(long = "tap", value_name = "PORT=NAME", value_parser = parse_tap)]
    pub taps: Vec<PortSpec>,
    /// The program (the same as the positional PROGRAM).
    #[arg(
        long = "program",
        id = "program_flag",
        value_enum,
        value_name = "PROGRAM"
    )]
    pub program: Option<Workload>,
    /// l3fwd: the route file (one `A.B.C.D/LEN PORT` per line, each prefix once, `#` comments).
    #[arg(long, value_name = "FILE")]
    pub routes: Option<PathBuf>,
    /// nimble: each class's rate in Gbit/s, class i being the frames arriving on port i.
    #[arg(long, value_delimiter = ',', value_name = "GBPS[,GBPS...]")]
    pub rates: Vec<f64>,
    /// nimble: each class's bucket depth in bytes [default: 65536].
    #[arg(long)]
    pub burst_bytes: Option<u64>,
    /// nimble: where admitted frames leave [default: 1].
    #[arg(long)]
    pub out_port: Option<u16>,
    /// nimble: how the refill is multiplied [default: ada].
    #[arg(long, value_enum)]
    pub arithmetic: Option<ArithmeticChoice>,
    /// trio-ml, fpisa: a job, JOB:N (sources 0..N) or JOB:FIRST..END; repeatable. Job J's
    /// Results leave on port J.
    #[arg(long = "job", value_name = "JOB:N")]
    pub jobs: Vec<JobSpec>,
    /// trio-ml, fpisa: more jobs from a file, one per line.
    #[arg(long, value_name = "FILE")]
    pub jobs_file: Option<PathBuf>,
    /// trio-ml, fpisa: block timeout of every job in ms (1..=255), or `off` (none: every
    /// block waits for all its workers, exact sums, no partial Result) [default: 20].
    #[arg(long, value_name = "MS|off", value_parser = super::serve::parse_block_exp)]
    pub block_exp_ms: Option<super::serve::BlockExp>,
    /// trio-ml, fpisa: the largest worker window [default: 64].
    #[arg(long)]
    pub window: Option<usize>,
    /// Print the counters every this many seconds while running (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub stats_every: f64,
    /// Print the final report as one JSON object (the other lines go to standard error).
    #[arg(long)]
    pub json: bool,
    /// Bytes per block of each interface's receive ring (a multiple of 4096).
    #[arg(long, default_value_t = RingConfig::default().block_bytes)]
    pub ring_block_bytes: u32,
    /// Blocks per receive ring.
    #[arg(long, default_value_t = RingConfig::default().blocks)]
    pub ring_blocks: u32,
    /// A block that is not full is handed over after this many ms (1..=1000): the most a
    /// lone frame waits in the ring.
    #[arg(long, default_value_t = RingConfig::default().block_timeout_ms)]
    pub ring_block_timeout_ms: u32,
    #[command(flatten)]
    pub runtime: super::runtime::RuntimeArgs,
}

fn parse_iface(s: &str) -> Result<PortSpec, String> {
    PortSpec::interface(s).map_err(|e| e.reason)
}

fn parse_tap(s: &str) -> Result<PortSpec, String> {
    PortSpec::tap(s).map_err(|e| e.reason)
}

impl LiveArgs {
    /// Whether any port is given: the run is on interfaces.
    pub fn is_live(&self) -> bool {
        !self.ifaces.is_empty() || !self.taps.is_empty()
    }

    /// The options that apply to a program on interfaces only, as given.
    pub fn live_only_given(&self) -> Option<&'static str> {
        [
            (self.routes.is_some(), "--routes"),
            (!self.rates.is_empty(), "--rates"),
            (self.burst_bytes.is_some(), "--burst-bytes"),
            (self.out_port.is_some(), "--out-port"),
            (self.arithmetic.is_some(), "--arithmetic"),
            (!self.jobs.is_empty(), "--job"),
            (self.jobs_file.is_some(), "--jobs-file"),
            (self.block_exp_ms.is_some(), "--block-exp-ms"),
            (self.window.is_some(), "--window"),
            (self.json, "--json"),
        ]
        .into_iter()
        .find(|(given, _)| *given)
        .map(|(_, flag)| flag)
        .or_else(|| self.runtime.given())
    }

    /// The program and its settings, refusing options of other programs.
    fn program(&self, workload: Workload) -> Result<LiveProgram, Box<dyn std::error::Error>> {
        let name = workload
            .to_possible_value()
            .map_or_else(|| "?".to_string(), |v| v.get_name().to_string());
        let refuse = |flag: &str, owners: &str| -> Box<dyn std::error::Error> {
            format!("invalid option `{flag}`: applies to `--program {owners}` only, not {name}")
                .into()
        };
        let aggregation = match workload {
            Workload::TrioMl => Some(Aggregation::TrioMl),
            Workload::Fpisa => Some(Aggregation::Fpisa(Variant::Full)),
            Workload::FpisaApprox => Some(Aggregation::Fpisa(Variant::Approx)),
            _ => None,
        };
        if workload != Workload::L3fwd && self.routes.is_some() {
            return Err(refuse("--routes", "l3fwd"));
        }
        if workload != Workload::Nimble {
            for (given, flag) in [
                (!self.rates.is_empty(), "--rates"),
                (self.burst_bytes.is_some(), "--burst-bytes"),
                (self.out_port.is_some(), "--out-port"),
                (self.arithmetic.is_some(), "--arithmetic"),
            ] {
                if given {
                    return Err(refuse(flag, "nimble"));
                }
            }
        }
        if aggregation.is_none() {
            for (given, flag) in [
                (!self.jobs.is_empty(), "--job"),
                (self.jobs_file.is_some(), "--jobs-file"),
                (self.block_exp_ms.is_some(), "--block-exp-ms"),
                (self.window.is_some(), "--window"),
            ] {
                if given {
                    return Err(refuse(flag, "trio-ml, fpisa or fpisa-approx"));
                }
            }
        }
        Ok(match (workload, aggregation) {
            (_, Some(aggregation)) => {
                let jobs = super::serve::jobs_of(&self.jobs, self.jobs_file.as_deref())?;
                if jobs.is_empty() {
                    return Err(format!(
                        "missing option `--job`: `--program {name}` needs at least one job, \
                         e.g. `--job 1:4` (job 1, sources 0..4; its Results leave port 1)"
                    )
                    .into());
                }
                let d = AggregationSetup::default();
                LiveProgram::Aggregation(AggregationSetup {
                    aggregation,
                    jobs,
                    block_exp_ms: match self.block_exp_ms {
                        Some(b) => b.setting()?,
                        None => d.block_exp_ms,
                    },
                    window: self.window.unwrap_or(d.window),
                    ..d
                })
            }
            (Workload::Filter, None) => LiveProgram::Filter,
            (Workload::L3fwd, None) => match &self.routes {
                Some(f) => LiveProgram::L3fwd(Routes::File(f.clone())),
                None => {
                    return Err(
                        "missing option `--routes`: `--program l3fwd` on interfaces \
                                needs a route file (one `A.B.C.D/LEN PORT` per line)"
                            .into(),
                    )
                }
            },
            (Workload::Nimble, None) => {
                let d = NimbleSetup::default();
                if self.rates.is_empty() {
                    return Err("missing option `--rates`: `--program nimble` needs each \
                                class's rate in Gbit/s, class i being port i (e.g. \
                                `--rates 1,0.5`)"
                        .into());
                }
                let mut rates_bps = Vec::new();
                for (i, &g) in self.rates.iter().enumerate() {
                    if !(g.is_finite() && g > 0.0) {
                        return Err(format!(
                            "invalid option `--rates`: class {i}'s rate {g} is not a positive \
                             number of Gbit/s"
                        )
                        .into());
                    }
                    rates_bps.push((g * 1e9).round() as u64);
                }
                LiveProgram::Nimble(NimbleSetup {
                    rates_bps,
                    burst_bytes: self.burst_bytes.unwrap_or(d.burst_bytes),
                    out_port: self.out_port.unwrap_or(d.out_port),
                    arithmetic: self.arithmetic.map_or(d.arithmetic, |a| a.arithmetic()),
                })
            }
            (_, None) => LiveProgram::Filter,
        })
    }
}

/// The exit status after a Ctrl-C (SIGINT or SIGTERM) during the stop cut it short: 128 +
/// SIGINT, as a shell reports a program the signal ended.
const INTERRUPTED_TWICE: i32 = 130;

/// Runs `workload` on the interfaces of `a` until Ctrl-C or `duration_s`.
pub fn run(
    a: &LiveArgs,
    workload: Workload,
    ppe_threads: usize,
    reorder: bool,
    duration_s: Option<f64>,
) -> CliResult {
    // 0: never; otherwise a positive, finite number of seconds up to the longest duration.
    let every = if a.stats_every == 0.0 {
        None
    } else {
        Some(
            pfemu::duration::secs(a.stats_every)
                .map_err(|e| format!("invalid option `--stats-every`: {e} (0: never)"))?,
        )
    };
    let duration = duration_s
        .map(pfemu::duration::secs)
        .transpose()
        .map_err(|e| format!("invalid option `--duration`: {e}"))?;
    let program = a.program(workload)?;
    let mut ports = a.ifaces.clone();
    ports.extend(a.taps.iter().cloned());
    let cfg = LiveConfig {
        program,
        ports: PortsConfig {
            ring: RingConfig {
                block_bytes: a.ring_block_bytes,
                blocks: a.ring_blocks,
                block_timeout_ms: a.ring_block_timeout_ms,
                ..RingConfig::default()
            },
            ..PortsConfig::new(ports)
        },
        ppe_threads,
        reorder,
        control: a.runtime.control.clone(),
        trace: a.runtime.trace_spec(),
        clock: None,
    };
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    // Up once the stop has begun: asked for by a first Ctrl-C, or at --duration's end.
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler_stopping = std::sync::Arc::clone(&stopping);
    ctrlc::set_handler(move || {
        if handler_stopping.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // A stop that has not finished (an interface still flooding, a send waiting):
            // the user wants out now.
            eprintln!("pfemu: interrupted during the stop: exiting without the final report");
            std::process::exit(INTERRUPTED_TWICE);
        }
        let _ = stop_tx.try_send(());
    })
    .map_err(|e| format!("cannot install the SIGINT/SIGTERM handler: {e}"))?;
    let live = Live::start(&cfg).map_err(|e| match e {
        // Restated at the boundary with this command's option (flags.rs).
        pfemu::lab::live::LiveError::Config(c) => Box::new(c) as Box<dyn std::error::Error>,
        e => Box::new(e) as Box<dyn std::error::Error>,
    })?;
    let bindings: Vec<String> = cfg
        .ports
        .ports
        .iter()
        .map(|p| format!("port {} = {}", p.port, p.kind))
        .collect();
    let ready = format!(
        "ready: {} on {}; {} PPE threads; {}",
        cfg.program.name(),
        bindings.join(", "),
        cfg.ppe_threads,
        match duration {
            Some(d) => format!("for {:.3} s (or Ctrl-C)", d.as_secs_f64()),
            None => "Ctrl-C to stop".to_string(),
        }
    );
    let start = Instant::now();
    {
        let r = live.report();
        let mut out = info(a.json);
        let _ = writeln!(out, "{ready}");
        if let Some(addr) = live.control_addr() {
            let _ = writeln!(
                out,
                "control: http://{addr}/ (e.g. pfemu ctl --control {addr} stats; metrics at \
                 /metrics)"
            );
        }
        for w in r.warnings.iter().chain(&r.ports.warnings) {
            let _ = writeln!(out, "warning: {w}");
        }
        let _ = out.flush();
    }
    let mut next_stats = every.map(|e| start + e);
    let mut last: Option<(Instant, LiveReport)> = None;
    loop {
        let now = Instant::now();
        let until_end = duration.map(|d| (start + d).saturating_duration_since(now));
        if until_end == Some(Duration::ZERO) {
            break;
        }
        let until_stats = next_stats.map(|t| t.saturating_duration_since(now));
        let wait = match (until_end, until_stats) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => Duration::from_secs(3600),
        };
        match stop_rx.recv_timeout(wait) {
            Ok(()) => break,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
        }
        if let (Some(t), Some(e)) = (next_stats, every) {
            if Instant::now() >= t {
                let r = live.report();
                let line = stats_line(&r, last.as_ref());
                let mut out = info(a.json);
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                last = Some((Instant::now(), r));
                next_stats = Some(t + e);
            }
        }
    }
    stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = live
        .stop()
        .map_err(|e| Box::new(e) as Box<dyn std::error::Error>)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_final(&r);
    }
    if !r.accounted() {
        return Err(
            "not every frame is accounted for: the ports' and the engine's counters disagree"
                .into(),
        );
    }
    if !a.json {
        println!(
            "\ncheck: every frame received entered the engine, and every frame it sent left a \
             port or is counted as a drop"
        );
    }
    Ok(())
}

/// Where progress lines go: standard output, or standard error with `--json`.
fn info(json: bool) -> Box<dyn Write> {
    if json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    }
}

/// One line of counters, with rates since `last`.
fn stats_line(r: &LiveReport, last: Option<&(Instant, LiveReport)>) -> String {
    let mut parts = Vec::new();
    for p in &r.ports.ports {
        let rate = last
            .and_then(|(t, l)| {
                let lp = l.ports.ports.iter().find(|x| x.port == p.port)?;
                let dt = t.elapsed().as_secs_f64().max(1e-9);
                Some(format!(
                    " ({:.0}/s in, {:.0}/s out)",
                    (p.rx_frames - lp.rx_frames) as f64 / dt,
                    p.tx_frames.saturating_sub(lp.tx_frames) as f64 / dt
                ))
            })
            .unwrap_or_default();
        parts.push(format!(
            "port {} {}: in {} out {} drops {}/{}{rate}",
            p.port,
            p.binding.as_ref().map_or("?", |b| b.name()),
            p.rx_frames,
            p.tx_frames,
            p.rx_dropped(),
            p.tx_dropped()
        ));
    }
    let e = &r.engine;
    format!(
        "[{:>8.1} s] {} | engine: in {} out {} consumed {} dropped {}",
        r.elapsed_s,
        parts.join(" | "),
        e.packets_in,
        e.packets_out,
        e.consumed,
        e.dropped
    )
}

fn print_final(r: &LiveReport) {
    println!("\n{} on live ports for {:.3} s", r.program, r.elapsed_s);
    println!(
        "  {:>5} {:<16} {:>10} {:>12} {:>8} {:>8} {:>8} {:>10} {:>12} {:>9}",
        "port",
        "interface",
        "rx frames",
        "rx bytes",
        "ring",
        "cut",
        "unread",
        "tx frames",
        "tx bytes",
        "tx errors"
    );
    for p in &r.ports.ports {
        println!(
            "  {:>5} {:<16} {:>10} {:>12} {:>8} {:>8} {:>8} {:>10} {:>12} {:>9}",
            p.port,
            p.binding
                .as_ref()
                .map_or("?".to_string(), |b| b.to_string()),
            p.rx_frames,
            p.rx_bytes,
            p.rx_kernel_drops,
            p.rx_truncated,
            p.rx_unread,
            p.tx_frames,
            p.tx_bytes,
            p.tx_dropped()
        );
        for (e, n) in &p.tx_errors {
            println!("          tx error {e}: {n}");
        }
        if p.tx_kernel_drops > 0 {
            println!(
                "          tx dropped by the interface without a word (no carrier): {}",
                p.tx_kernel_drops
            );
        }
        if p.rx_checksums_completed + p.rx_vlan_restored + p.rx_checksums_left > 0 {
            println!(
                "          offloads finished: {} checksums completed ({} left as they were), \
                 {} VLAN tags put back",
                p.rx_checksums_completed, p.rx_checksums_left, p.rx_vlan_restored
            );
        }
        if p.rx_errors + p.rx_bad_blocks > 0 {
            println!(
                "          {} receive errors, {} bad ring blocks ({} frames), the last: {}",
                p.rx_errors,
                p.rx_bad_blocks,
                p.rx_bad_block_frames,
                p.last_rx_error.as_deref().unwrap_or("?")
            );
        }
    }
    if r.ports.tx_unbound > 0 {
        println!(
            "  frames for ports no interface is bound to: {}",
            r.ports.tx_unbound
        );
    }
    let e = &r.engine;
    println!(
        "  engine: {} in, {} forwarded, {} consumed, {} created, {} dropped",
        e.packets_in, e.packets_out, e.consumed, e.created, e.dropped
    );
    for (reason, n) in &e.dropped_by_reason {
        println!("    {reason:<20} {n:>12}");
    }
    match &r.counters {
        ProgramCounters::Filter(c) => {
            println!(
                "  filter counters: non-IP {} packets {} bytes, IP options {} packets {} bytes, \
                 truncated IPv4 {} packets {} bytes",
                c.non_ip.0,
                c.non_ip.1,
                c.ip_options.0,
                c.ip_options.1,
                c.truncated.0,
                c.truncated.1
            );
        }
        ProgramCounters::Nimble(classes) => {
            for c in classes {
                println!(
                    "  class {} ({:.3} Gbit/s): admitted {} packets {} bytes",
                    c.class,
                    c.rate_bps as f64 / 1e9,
                    c.admitted_packets,
                    c.admitted_bytes
                );
            }
        }
        ProgramCounters::None => {}
    }
    if let Some(t) = &r.trace {
        println!(
            "  trace: {} packets written, {} lost (the writer fell behind)",
            t.written, t.lost
        );
    }
    for w in r.warnings.iter().chain(&r.ports.warnings) {
        println!("warning: {w}");
    }
}

/// `pfemu bench ports`: the filter through a veth pair, beside the in-process figure.
#[derive(clap::Args, Debug)]
pub struct PortsBenchArgs {
    /// The interface the generator sends into: a veth whose peer is --port0.
    #[arg(long, value_name = "IFACE")]
    pub offer: String,
    /// Port 0's interface (the peer of --offer).
    #[arg(long, value_name = "IFACE")]
    pub port0: String,
    /// Port 1's interface, where the filter forwards.
    #[arg(long, value_name = "IFACE")]
    pub port1: String,
    /// Frame size in bytes (without --search).
    #[arg(long, default_value_t = 64, conflicts_with = "search")]
    pub size: usize,
    /// Distinct flows.
    #[arg(long, default_value_t = 1024)]
    pub flows: u32,
    /// Seconds the generator sends (without --search).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = super::parse_secs,
          conflicts_with = "search")]
    pub duration: f64,
    /// PPE threads [default: available cores].
    #[arg(long)]
    pub ppe_threads: Option<usize>,
    /// Skip the in-process run on the same frames.
    #[arg(long)]
    pub no_in_process: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// RFC 2544 throughput through the pair: per frame size, the highest rate offered
    /// with no loss (or at most --loss), found by paced trials (as pfemu linerate does).
    #[arg(long)]
    pub search: bool,
    /// --search: frame sizes, bytes, comma-separated [default: 64,128,256,512,1024,1280,1518].
    #[arg(long, value_delimiter = ',', value_name = "N,...", requires = "search")]
    pub sizes: Vec<usize>,
    /// --search: the line rate, Gbit/s: the first trial's rate [default: 10].
    #[arg(long, value_name = "GBPS", requires = "search")]
    pub line_rate: Option<f64>,
    /// --search: milliseconds each trial offers frames [default: 500].
    #[arg(long, value_name = "MS", requires = "search",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub trial_ms: Option<u64>,
    /// --search: largest loss a passing trial may have, percent of the frames offered
    /// [default: 0].
    #[arg(long, value_name = "PERCENT", requires = "search")]
    pub loss: Option<f64>,
    /// --search: the search stops when its bracket is this narrow, percent of the line
    /// rate [default: 0.5].
    #[arg(long, value_name = "PERCENT", requires = "search")]
    pub resolution: Option<f64>,
    /// --search: most trials per frame size [default: 8].
    #[arg(long, value_name = "N", requires = "search")]
    pub max_trials: Option<u32>,
    /// --search: after a failed line-rate trial, `measured` (next, the rate the pair
    /// carried) or `bisect` (RFC 2544's binary search) [default: measured].
    #[arg(long, requires = "search")]
    pub initial: Option<pfemu::lab::bench::linerate::InitialRate>,
}

/// The `--help` epilogue of `pfemu bench ports`.
pub const BENCH_PORTS_HELP: &str = "Examples (as root):\n  \
    ip link add gen0 type veth peer name pfe0\n  \
    ip link add pfe1 type veth peer name sink1\n  \
    for i in gen0 pfe0 pfe1 sink1; do sysctl -qw net.ipv6.conf.$i.disable_ipv6=1; ip link set $i mtu 9000 up; done\n  \
    pfemu bench ports --offer gen0 --port0 pfe0 --port1 pfe1 --size 64 --duration 2\n  \
    pfemu bench ports --offer gen0 --port0 pfe0 --port1 pfe1 --search --sizes 64,512,1518\n  \
    pfemu bench ports --offer gen0 --port0 pfe0 --port1 pfe1 --search --line-rate 1 --loss 0.1 --json\n\n\
    One thread sends plain IPv4 frames (all forwarded by the filter) into --offer with \
    sendmmsg as fast as it can for --duration; its veth peer is PFE port 0 (a TPACKET_V3 \
    ring), and port 1 sends them out (sendmmsg) to its own peer. Reports the rates offered, \
    taken by port 0 and sent by port 1, where frames were lost (the veth's backlog \
    overflows first when the PFE is slower than the sender: the kernel refuses such a frame \
    with ENOBUFS, and the generator counts it as offered and lost and goes on; then port 0's \
    ring), and then the in-process filter's rate on the same frames, PPE threads and \
    duration (pfemu bench filter's measurement). Every frame offered is accounted for (exit \
    status 2 if not). A generator whose every frame of a burst is refused for another \
    reason (the interface went down) stops, with a warning that says why. The generator, \
    the RX thread and the PPE threads share the machine's cores.\n\n\
    With --search, an RFC 2544 throughput search through the pair instead (pfemu linerate's \
    search, with the same options: --sizes, --line-rate, --trial-ms, --loss, --resolution, \
    --max-trials, --initial). Per frame size, each trial offers frames paced at one rate for \
    --trial-ms (sendmmsg bursts of up to 256, as many as are due by the clock), waits for \
    the frames in flight to come out, and counts as received the frames port 1 sent: a \
    frame lost on the veth (its backlog full: the kernel refuses it with ENOBUFS and \
    counts it in the veth's drop statistics) or in port 0's ring is lost, as RFC 2544 \
    counts it. A trial passes with at most --loss lost and at least 99.9% of the frames \
    its rate calls for offered (a rate the generator cannot keep is not carried). The \
    first trial is at the line rate (20 bytes of preamble and gap per frame); after a \
    loss the search narrows until its bracket is --resolution percent of the line rate, \
    or --max-trials ran. Prints the search's table, then per size the in-process filter's \
    rate on the same frames and PPE threads (pfemu bench filter for --trial-ms, after the \
    search; --no-in-process skips it) and the ratio of the two. A frame size larger than \
    an interface's MTU plus 14 is refused (1518 needs an MTU of 1504, hence mtu 9000 \
    above). Exit status 2 if a trial's frames are not all accounted for.";

/// Runs `pfemu bench ports`.
pub fn bench_ports(a: &PortsBenchArgs) -> CliResult {
    if a.search {
        return bench_ports_search(a);
    }
    let cfg = pfemu::lab::live::bench::PortsBenchConfig {
        offer: a.offer.clone(),
        port0: a.port0.clone(),
        port1: a.port1.clone(),
        size: a.size,
        flows: a.flows,
        duration_s: a.duration,
        ppe_threads: a
            .ppe_threads
            .unwrap_or_else(pfemu::pfe::default_ppe_threads),
        in_process: !a.no_in_process,
    };
    let r = pfemu::lab::live::bench::run(&cfg).map_err(|e| match e {
        // Restated at the boundary with this command's option (flags.rs).
        pfemu::lab::live::LiveError::Config(c) => Box::new(c) as Box<dyn std::error::Error>,
        e => Box::new(e) as Box<dyn std::error::Error>,
    })?;
    if let Some(why) = &r.offer_stopped {
        eprintln!("warning: the generator stopped before --duration was up: {why}");
    }
    if let Some(missing) = &r.drain_missing {
        eprintln!("warning: frames in flight when the generator stopped: {missing}");
    }
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["accounted"] = serde_json::json!(r.accounted());
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "filter through {} -> {} | {} -> out, {}-byte frames, {} PPE threads, {:.2} s",
            a.offer, a.port0, a.port1, r.size, r.ppe_threads, r.elapsed_s
        );
        println!(
            "  offered (sendmmsg)   {:>12} frames {:>9.3} Mpps  ({} refused)",
            r.offered, r.offered_mpps, r.offer_errors
        );
        println!(
            "  lost on the veth     {:>12} frames            (its backlog was full: ENOBUFS; \
             the veth's own count, with attempts sent again: {})",
            r.veth_dropped, r.veth_drop_counters
        );
        println!(
            "  veth to port 0       {:>12} frames            (offered less those lost, where \
             the kernel reports veth drops to the sender)",
            r.veth_delivered
        );
        println!(
            "  port 0 took          {:>12} frames {:>9.3} Mpps",
            r.port_in, r.port_in_mpps
        );
        println!(
            "  lost at port 0       {:>12} frames            (ring full, cut, unread)",
            r.port_dropped
        );
        println!(
            "  port 1 sent          {:>12} frames {:>9.3} Mpps",
            r.port_out, r.port_out_mpps
        );
        if let Some(m) = r.in_process_mpps {
            println!(
                "  in process (bench filter, same frames and threads): {m:>9.3} Mpps; through \
                 the ports: {:.1}% of it",
                100.0 * r.port_out_mpps / m.max(1e-9)
            );
        }
        println!(
            "\ncheck: {}",
            if r.accounted() {
                "every frame offered is accounted for"
            } else {
                "FAILED: frames offered and counted disagree"
            }
        );
    }
    if !r.accounted() {
        return Err("not every frame offered is accounted for".into());
    }
    Ok(())
}

/// Runs `pfemu bench ports --search`.
fn bench_ports_search(a: &PortsBenchArgs) -> CliResult {
    use pfemu::lab::bench::linerate::{LinerateConfig, Progress as SearchProgress};
    use pfemu::lab::live::bench::{PortsSearchConfig, VethDeviceConfig};

    let d = LinerateConfig::default();
    // The library takes fractions; say what is wrong in the percent the user typed.
    let loss = a.loss.unwrap_or(d.loss_tolerance * 100.0);
    if !(0.0..100.0).contains(&loss) {
        return Err(
            format!("invalid option `--loss`: {loss} is not a percentage in [0, 100)").into(),
        );
    }
    let resolution = a.resolution.unwrap_or(d.resolution * 100.0);
    if !(resolution > 0.0 && resolution <= 100.0) {
        return Err(format!(
            "invalid option `--resolution`: {resolution} is not a percentage of the line rate \
             in (0, 100]"
        )
        .into());
    }
    let line_rate = a.line_rate.unwrap_or(d.line_rate_gbps);
    pfemu::lab::bench::linerate::check_line_rate(line_rate)
        .map_err(|e| format!("invalid option `--line-rate`: {}", e.reason))?;
    let search = LinerateConfig {
        sizes: if a.sizes.is_empty() {
            d.sizes.clone()
        } else {
            a.sizes.clone()
        },
        loss_tolerance: loss / 100.0,
        trial_duration: a.trial_ms.map_or(d.trial_duration, Duration::from_millis),
        resolution: resolution / 100.0,
        line_rate_gbps: line_rate,
        max_trials_per_size: a.max_trials.unwrap_or(d.max_trials_per_size),
        initial_rate: a.initial.unwrap_or(d.initial_rate),
        ..d
    };
    let cfg = PortsSearchConfig {
        device: VethDeviceConfig {
            offer: a.offer.clone(),
            port0: a.port0.clone(),
            port1: a.port1.clone(),
            flows: a.flows,
            ppe_threads: a
                .ppe_threads
                .unwrap_or_else(pfemu::pfe::default_ppe_threads),
        },
        search,
        in_process: !a.no_in_process,
    };
    cfg.validate()?;
    eprintln!(
        "pfemu bench ports --search: filter through {} -> {} | {} -> out, {} PPE threads, \
         {} Gbit/s line rate, {} ms trials, loss <= {loss}%",
        a.offer,
        a.port0,
        a.port1,
        cfg.device.ppe_threads,
        line_rate,
        cfg.search.trial_duration.as_millis()
    );
    let r = pfemu::lab::live::bench::search(&cfg, |p| {
        if let SearchProgress::Trial {
            frame_size,
            index,
            record,
        } = p
        {
            eprintln!(
                "  {frame_size} B, trial {index}: {:.4} Mpps asked, {} of {} frames offered, \
                 {} out, loss {:.3}%: {}",
                record.rate_pps / 1e6,
                record.offered,
                record.expected,
                record.received,
                record.loss * 100.0,
                if record.pass { "pass" } else { "fail" }
            );
        }
    })?;
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["accounted"] = serde_json::json!(r.accounted());
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "filter through {} -> {} | {} -> out, {} PPE threads",
            a.offer, a.port0, a.port1, r.ppe_threads
        );
        print!("{}", r.search.table());
        println!(
            "\n{:>7} {:>12} {:>16} {:>9}",
            "size B", "ports Mpps", "in-process Mpps", "ratio"
        );
        for s in &r.sizes {
            println!(
                "{:>7} {:>12.3} {:>16} {:>9}",
                s.frame_size,
                s.ports_mpps,
                s.in_process_mpps
                    .map_or_else(|| "-".to_string(), |m| format!("{m:.3}")),
                s.ratio
                    .map_or_else(|| "-".to_string(), |x| format!("{:.1}%", x * 100.0))
            );
        }
        let lost_on_veth: u64 = r.trials.iter().map(|t| t.veth_dropped).sum();
        let lost_at_port: u64 = r.trials.iter().map(|t| t.port_dropped).sum();
        for t in &r.trials {
            if let Some(missing) = &t.drain_missing {
                println!(
                    "trial of {}-byte frames at {:.0} frames/s: {missing}",
                    t.frame_size, t.rate_pps
                );
            }
        }
        println!(
            "\n{} trials; frames lost on the veth {lost_on_veth}, in port 0's ring \
             {lost_at_port}",
            r.trials.len()
        );
        println!(
            "check: {}",
            if r.accounted() {
                "every trial's frames are accounted for"
            } else {
                "FAILED: a trial's frames offered and counted disagree (or it did not drain)"
            }
        );
    }
    if !r.accounted() {
        return Err("not every frame offered is accounted for".into());
    }
    Ok(())
}
