//! `pfemu serve` (a UDP front end to an aggregating engine) and `pfemu worker` (a real
//! end host that allreduces a vector through it). See `pfemu::lab::serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde_json::json;

use pfemu::fpisa::Variant;
use pfemu::lab::aggregation::{Aggregation, AggregationSetup, JobSpec};
use pfemu::lab::serve::{
    self, ClientConfig, LaneType, RunLimits, SeededCheck, ServeConfig, ServeError, Server,
};
use pfemu::microcode::trio_ml::host::{HostError, Worker};
use pfemu::microcode::trio_ml::NO_BLOCK_TIMEOUT;
use pfemu::ConfigError;

use super::CliResult;

/// The aggregation program `pfemu serve` runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeProgram {
    /// Trio-ML: 32-bit integer gradients.
    TrioMl,
    /// FPISA (full variant): FP32 gradients.
    Fpisa,
    /// FPISA-A (the approximate variant): FP32 gradients.
    FpisaApprox,
}

/// `pfemu serve`'s options.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The aggregation program.
    #[arg(long, value_enum, default_value_t = ServeProgram::TrioMl)]
    pub program: ServeProgram,
    /// Address and UDP port to listen on, HOST:PORT (port 0: any free port; the address in
    /// use is printed first).
    #[arg(long, default_value = "127.0.0.1:12000", value_parser = parse_addr)]
    pub listen: SocketAddr,
    /// A job: JOB:N (sources 0..N) or JOB:FIRST..END; repeatable.
    #[arg(
        long = "job",
        value_name = "JOB:N",
        required_unless_present = "jobs_file"
    )]
    pub jobs: Vec<JobSpec>,
    /// More jobs, from a file: one JOB:N or JOB:FIRST..END per line, `#` comments.
    #[arg(long, value_name = "FILE")]
    pub jobs_file: Option<PathBuf>,
    /// Block timeout of every job, in milliseconds (1..=255): a worker process that starts
    /// later than this after the others is left out (partial Results). 200 here, 20 for
    /// `pfemu replay`: worker processes started by hand or by a shell loop start tens of
    /// milliseconds apart, while a capture replays without those gaps. `off`: no straggler
    /// timeout, every block waits for all its workers however late one comes (exact sums,
    /// never a partial Result; a worker that never sends holds its blocks open).
    #[arg(long, value_name = "MS|off", default_value = "200", value_parser = parse_block_exp)]
    pub block_exp_ms: BlockExp,
    /// Drop a kept Result (and free its slot) nobody asked for during this many
    /// milliseconds (0: keep it until the next generation of its block id). Longer than the
    /// workers' --retransmit-ms.
    #[arg(long, default_value_t = 1000)]
    pub keep_result_ms: u32,
    /// The largest worker window: each job needs 2 * window block slots (a block id's kept
    /// Result and its next generation).
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// Block slots per job (block_cnt_max, 1..=4095, at least 2 * --window): the blocks a
    /// job's clients may have in flight, kept Results included. Default: the paper's 4095
    /// where 1 GiB holds them for every job. Blocks past it are dropped (block_cnt_max,
    /// with a warning on standard error).
    #[arg(long)]
    pub block_cnt_max: Option<u16>,
    /// Most gradients per packet (1..=4095).
    #[arg(long, default_value_t = 1024)]
    pub block_grad_max: u16,
    /// PPE threads (default: the cores available less one, which the thread receiving the
    /// datagrams takes; at least one).
    #[arg(long)]
    pub ppe_threads: Option<usize>,
    /// Stop after this many seconds (default: run until --idle-exit-ms, SIGINT or SIGTERM;
    /// each stops gracefully and prints the final report).
    #[arg(long, value_parser = super::parse_secs)]
    pub seconds: Option<f64>,
    /// Stop after this long without a datagram, once one has arrived (at least 1; leave it
    /// out to run until --seconds, SIGINT or SIGTERM).
    #[arg(long)]
    pub idle_exit_ms: Option<u64>,
    /// Send Results to this aggregator, HOST:PORT (as one source of its job), instead of
    /// the members.
    #[arg(long, value_parser = parse_addr)]
    pub upstream: Option<SocketAddr>,
    /// This aggregator's source id in the upstream job.
    #[arg(long, default_value_t = 0)]
    pub upstream_src: u8,
    /// With --upstream: how long a stopping server waits, in milliseconds, for the upper
    /// level's answers to the Results it sent up while stopping (or held for its Join
    /// above), from when its engine stopped and from the last of them sent (positive, at most
    /// 10^12). Its members get those answers; the ones still missing then are counted in
    /// upstream_unanswered.
    #[arg(
        long,
        value_name = "MS",
        requires = "upstream",
        value_parser = pfemu::lab::bench::settings::parse_millis,
        default_value_t = serve::DEFAULT_STOP_UPSTREAM_WAIT.as_millis() as f64
    )]
    pub stop_upstream_wait_ms: f64,
    /// Receive buffer asked for the listening socket, KiB (the kernel caps it at
    /// net.core.rmem_max, with a warning; 0 keeps the system's default). Datagrams that
    /// arrive while it is full are dropped by the kernel, counted in kernel_dropped.
    #[arg(long, default_value_t = 4096)]
    pub recv_buffer_kb: usize,
    /// Send each burst of Results for a member as single datagrams, not as one UDP GSO
    /// message (GSO is used where the kernel has it otherwise; the report says).
    #[arg(long)]
    pub no_gso: bool,
    /// Do not ask the kernel to coalesce a sender's datagrams (UDP GRO; used where the
    /// kernel has it otherwise; the report says).
    #[arg(long)]
    pub no_gro: bool,
    /// Print the final report as one JSON object (the `listening` line then goes to
    /// standard error).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub runtime: super::runtime::RuntimeArgs,
}

/// `pfemu worker`'s options.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The server (`pfemu serve --listen`), HOST:PORT, e.g. localhost:12000 (a name
    /// resolves to its first IPv4 address, else its first IPv6 one).
    #[arg(long, value_parser = parse_addr, required_unless_present = "iface")]
    pub server: Option<SocketAddr>,
    /// Instead of a server over UDP, send the packets as Ethernet frames on this Linux
    /// interface (AF_PACKET; root) to a PFE port running the job's program, e.g. `pfemu run
    /// --program trio-ml --job 1:4 --iface 1=veth1` on the other end of a veth, and take
    /// the Results that arrive there (the paper's workers on a wire). Joins no run.
    #[arg(long, value_name = "NAME", conflicts_with = "server")]
    pub iface: Option<String>,
    /// The job id.
    #[arg(long, default_value_t = 1)]
    pub job: u8,
    /// This worker's source id.
    #[arg(long)]
    pub src: u8,
    /// Workers in the job (sources 0..N, N at least 1): with --seed, the sums are checked
    /// against them.
    #[arg(long, default_value_t = 4)]
    pub workers: u8,
    /// Gradients in the vector (with --seed).
    #[arg(long, default_value_t = 100_000)]
    pub gradients: usize,
    /// FP32 gradients (for `pfemu serve --program fpisa`).
    #[arg(long)]
    pub fpisa: bool,
    /// Seed of the random vectors: every worker's vector follows from (seed, src).
    #[arg(long, default_value_t = 1, conflicts_with = "vector")]
    pub seed: u64,
    /// Read the vector from this file instead (numbers separated by white space or commas);
    /// the sums are printed, not checked.
    #[arg(long)]
    pub vector: Option<PathBuf>,
    /// Gradients per packet.
    #[arg(long, default_value_t = 1024)]
    pub grads_per_packet: usize,
    /// Packets outstanding (at most the server's --window, which gives each job
    /// 2 * window slots: a block id's kept Result and its next generation).
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Receive buffer asked for the worker's socket, KiB (the kernel caps it at
    /// net.core.rmem_max; 0 keeps the system's default). Every member receives every Result
    /// of its job, a window of them at a time.
    #[arg(long, default_value_t = 4096)]
    pub recv_buffer_kb: usize,
    /// Resend a packet whose Result has not come back in this many milliseconds (0: never;
    /// at most 18446744073709, the nanoseconds of which fit 64 bits).
    #[arg(long, default_value_t = 50)]
    pub retransmit_ms: u64,
    /// Give up after this many seconds without a Result.
    #[arg(long, default_value_t = 10.0, value_parser = super::parse_secs)]
    pub give_up_s: f64,
    /// Fault injection: drop every N-th packet this worker sends (N at least 1).
    #[arg(long)]
    pub drop_every: Option<u64>,
    /// Do not join the job's run first: speak the paper's header alone. A worker that joins
    /// (the default) is never answered with Results kept from an earlier run of the job;
    /// one that does not is fine for a job's single run (see the README's run protocol).
    #[arg(long)]
    pub no_join: bool,
    /// Send a window's packets as single datagrams, not as UDP GSO messages (GSO is used
    /// where the kernel has it otherwise).
    #[arg(long)]
    pub no_gso: bool,
    /// Do not ask the kernel to coalesce the server's datagrams (UDP GRO; used where the
    /// kernel has it otherwise).
    #[arg(long)]
    pub no_gro: bool,
    /// Start sending at this Unix time, in milliseconds (e.g. `$(( $(date +%s%3N) + 3000 ))`),
    /// once the vector is built: workers started together by a script then begin at the
    /// same moment, and none measures the time the others spent building theirs. A time
    /// already past starts at once; more than an hour ahead is refused.
    #[arg(long, value_name = "UNIX_MS")]
    pub start_at_ms: Option<u64>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `pfemu serve`.
pub fn serve(a: &ServeArgs) -> CliResult {
    let cfg = ServeConfig {
        listen: a.listen,
        setup: AggregationSetup {
            aggregation: match a.program {
                ServeProgram::TrioMl => Aggregation::TrioMl,
                ServeProgram::Fpisa => Aggregation::Fpisa(Variant::Full),
                ServeProgram::FpisaApprox => Aggregation::Fpisa(Variant::Approx),
            },
            jobs: jobs_of(&a.jobs, a.jobs_file.as_deref())?,
            block_exp_ms: a.block_exp_ms.setting()?,
            keep_result_ms: a.keep_result_ms,
            window: a.window,
            block_cnt_max: a.block_cnt_max,
            block_grad_max: a.block_grad_max,
            ..AggregationSetup::default()
        },
        ppe_threads: a.ppe_threads.unwrap_or_else(serve::default_ppe_threads),
        upstream: a.upstream,
        upstream_src: a.upstream_src,
        recv_buffer_bytes: a.recv_buffer_kb.saturating_mul(1024),
        log_warnings: true,
        gso: !a.no_gso,
        gro: !a.no_gro,
        control: a.runtime.control.clone(),
        trace: a.runtime.trace_spec(),
        // At random (the front end, not the draw, keeps a restarted server's jobs apart
        // from the last instance's workers: see `pfemu::lab::serve`, Runs across restarts).
        first_run: None,
        // Checked by clap (`parse_millis`): the conversion cannot fail.
        stop_upstream_wait: pfemu::duration::millis(a.stop_upstream_wait_ms)
            .map_err(|e| format!("invalid option `--stop-upstream-wait-ms`: {e}"))?,
        clock: None,
    };
    if a.idle_exit_ms == Some(0) {
        // 0 would stop the server after the first receive.
        return Err(OptionError {
            option: "--idle-exit-ms",
            reason: "0 stops at the first datagram; give at least 1, or leave the option out \
                     to run until --seconds, SIGINT or SIGTERM"
                .into(),
        }
        .into());
    }
    // As every option in milliseconds: at most 10^9 s.
    if let Some(ms) = a.idle_exit_ms.filter(|&ms| ms > 1_000_000_000_000) {
        return Err(OptionError {
            option: "--idle-exit-ms",
            reason: format!(
                "{ms} ms is more than 10^9 s; leave the option out to run until \
                 --seconds, SIGINT or SIGTERM"
            ),
        }
        .into());
    }
    // Checked by clap (`parse_secs`); converted before binding, so nothing can fail later.
    let duration = a
        .seconds
        .map(pfemu::duration::secs)
        .transpose()
        .map_err(|e| format!("invalid option `--seconds`: {e}"))?;
    let server = Server::bind(&cfg).map_err(serve_error)?;
    // SIGINT / SIGTERM stop the server the graceful way: the engine drains, every Result in
    // flight goes out, and the final report is printed.
    let stop = server.stop_handle();
    ctrlc::set_handler(move || stop.stop())
        .map_err(|e| format!("cannot install the SIGINT/SIGTERM handler: {e}"))?;
    let addr = server.local_addr().map_err(serve_error)?;
    // The first line is the address, so a script (or a test) can read the port; with
    // --json it goes to standard error, so standard output is one JSON object.
    let control = server
        .control_addr()
        .map(|c| format!("control http://{c}/ (pfemu ctl --control {c} stats)"));
    if a.json {
        eprintln!("listening {addr}");
        if let Some(c) = &control {
            eprintln!("{c}");
        }
    } else {
        println!("listening {addr}");
        if let Some(c) = &control {
            println!("{c}");
        }
    }
    let cpu0 = serve::process_cpu_times();
    let report = server.run(RunLimits {
        duration,
        idle_exit: a.idle_exit_ms.map(Duration::from_millis),
    });
    let cpu = match (cpu0, serve::process_cpu_times()) {
        (Some((u0, s0)), Some((u1, s1))) => Some((u1 - u0, s1 - s0)),
        _ => None,
    };
    let f = &report.front_end;
    if a.json {
        println!(
            "{}",
            json!({
                "elapsed_s": report.elapsed_s,
                "front_end": f,
                "engine": report.engine,
                "open_blocks_at_stop": report.open_blocks_at_stop,
                "open_blocks_left": report.open_blocks_left,
                "warnings": report.warnings,
                "trace": report.trace,
                "cpu_user_s": cpu.map(|c| c.0),
                "cpu_system_s": cpu.map(|c| c.1),
            })
        );
    } else {
        println!(
            "served {:.2} s: {} datagrams in ({} B), {} injected, {} Results -> {} datagrams out \
             ({} B), {} members heard ({} from a new address)",
            report.elapsed_s,
            f.datagrams_in,
            f.bytes_in,
            f.injected,
            f.results,
            f.datagrams_out,
            f.bytes_out,
            f.peers,
            f.readdressed
        );
        println!(
            "dropped: {} by the kernel (receive buffer of {} KiB full), {} short, {} bad \
             length, {} unknown job; {} from sources outside their job (the engine drops \
             them); {} of a run from senders that had not joined this server (answered \
             Superseded); {} unroutable, {} socket errors",
            f.kernel_dropped,
            f.recv_buffer_bytes / 1024,
            f.dropped_short,
            f.dropped_bad_length,
            f.dropped_unknown_job,
            f.strangers,
            f.not_joined,
            f.unroutable,
            f.socket_errors
        );
        if let Some(t) = &report.trace {
            println!(
                "trace: {} packets written, {} lost (the writer fell behind)",
                t.written, t.lost
            );
        }
        println!(
            "stop: {} blocks open, {} still open after waiting for their timeout; {} \
             members' datagrams dropped while stopping; {} Results sent up without an answer",
            report.open_blocks_at_stop,
            report.open_blocks_left,
            f.dropped_stopping,
            f.upstream_unanswered
        );
        println!(
            "engine: {} in, {} consumed, {} dropped {:?}",
            report.engine.packets_in,
            report.engine.consumed,
            report.engine.dropped,
            report.engine.dropped_by_reason
        );
        println!(
            "batching: {} datagrams in {} receives, {} out in {} sends; GRO {}, GSO {}{}",
            f.datagrams_in,
            f.recv_calls,
            f.datagrams_out,
            f.send_calls,
            if f.gro { "on" } else { "off" },
            if f.gso { "on" } else { "off" },
            if f.gso_refused > 0 {
                format!(
                    " ({} GSO messages refused by the kernel, resent singly)",
                    f.gso_refused
                )
            } else {
                String::new()
            }
        );
        if let Some((u, s)) = cpu {
            println!("cpu: {u:.2} s user, {s:.2} s system");
        }
        for w in &report.warnings {
            println!("warning: {w}");
        }
    }
    Ok(())
}

/// `--block-exp-ms` of `pfemu serve` and `pfemu run`: a block timeout, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockExp {
    /// A block no packet touched for this many milliseconds gets a partial Result (0 is
    /// refused by [`BlockExp::setting`], naming `off`).
    Ms(u8),
    /// `off`: no block timeout; every block waits for all its sources.
    Off,
}

impl BlockExp {
    /// The jobs' `block_exp_ms` ([`NO_BLOCK_TIMEOUT`] for `off`); 0 ms is refused, so a
    /// typo never turns the timeout off.
    pub fn setting(self) -> Result<u8, OptionError> {
        match self {
            BlockExp::Off => Ok(NO_BLOCK_TIMEOUT),
            BlockExp::Ms(0) => Err(OptionError {
                option: "--block-exp-ms",
                reason: "0 ms; give 1..=255, or `off` for no block timeout (every block \
                         waits for all its workers)"
                    .into(),
            }),
            BlockExp::Ms(ms) => Ok(ms),
        }
    }
}

/// clap's parser of `--block-exp-ms`: `off`, or milliseconds (0..=255; 0 is refused later,
/// naming the option).
pub fn parse_block_exp(s: &str) -> Result<BlockExp, String> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(BlockExp::Off);
    }
    s.trim()
        .parse()
        .map(BlockExp::Ms)
        .map_err(|_| format!("`{s}` is neither a number of milliseconds (1..=255) nor `off`"))
}

/// The jobs given with `--job`, then those of `--jobs-file`.
pub fn jobs_of(
    flags: &[JobSpec],
    file: Option<&std::path::Path>,
) -> Result<Vec<JobSpec>, Box<dyn std::error::Error>> {
    let mut jobs = flags.to_vec();
    if let Some(path) = file {
        jobs.extend(JobSpec::read_list(path).map_err(config_error)?);
    }
    Ok(jobs)
}

/// clap's parser of addresses (`--listen`, `--server`, `--upstream`): HOST:PORT, a name
/// resolved to its first IPv4 address, else its first IPv6 one ([`serve::resolve`]).
fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    serve::resolve(s).map_err(|e| e.to_string())
}

/// A setting refused, named by the option the user typed (`--block-grad-max`, not the
/// library's `block_grad_max`).
#[derive(Debug)]
pub struct OptionError {
    /// The option, e.g. `--window`.
    pub option: &'static str,
    /// Why its value was refused.
    pub reason: String,
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid option `{}`: {}", self.option, self.reason)
    }
}

impl std::error::Error for OptionError {}

/// The option of `pfemu serve`, `worker` or `replay` behind a library setting (the
/// `setting` of a [`ConfigError`]); `None` for settings no option sets (the engine's).
pub fn option_of(setting: &str) -> Option<&'static str> {
    Some(match setting {
        "jobs" | "job" => "--job",
        "jobs_file" => "--jobs-file",
        "window" => "--window",
        "block_cnt_max" => "--block-cnt-max",
        "block_grad_max" => "--block-grad-max",
        "block_exp_ms" => "--block-exp-ms",
        "keep_result_ms" => "--keep-result-ms",
        "grads_per_packet" => "--grads-per-packet",
        "values" => "--gradients",
        "vector" => "--vector",
        "routes" => "--routes",
        "route_file" => "--route-file",
        "speed" => "--speed",
        "port" => "--port",
        "ppe_threads" => "--ppe-threads",
        "upstream" => "--upstream",
        "recv_buffer_bytes" => "--recv-buffer-kb",
        _ => return None,
    })
}

/// A refused setting as the user should read it: naming its option where it has one.
pub fn setting_error(setting: &'static str, reason: String) -> Box<dyn std::error::Error> {
    match option_of(setting) {
        Some(option) => Box::new(OptionError { option, reason }),
        None => Box::new(ConfigError::new(setting, reason)),
    }
}

/// [`setting_error`] of a [`ConfigError`].
pub fn config_error(e: ConfigError) -> Box<dyn std::error::Error> {
    setting_error(e.setting, e.reason)
}

/// A [`ServeError`] as the user should read it: a refused setting names its option.
fn serve_error(e: ServeError) -> Box<dyn std::error::Error> {
    match e {
        ServeError::Config { setting, reason }
        | ServeError::Host(HostError::Config { setting, reason }) => setting_error(setting, reason),
        e => Box::new(e),
    }
}

fn read_vector(path: &PathBuf) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("invalid `--vector`: reading {}: {e}", path.display()))?;
    let v = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<f64>()
                .map_err(|e| format!("invalid `--vector`: `{t}` is not a number: {e}"))
        })
        .collect::<Result<Vec<f64>, _>>()?;
    if v.is_empty() {
        return Err(format!("invalid `--vector`: {} holds no numbers", path.display()).into());
    }
    Ok(v)
}

/// The `--vector` values as Trio-ML's 32-bit integer gradients (rounded); one that does
/// not fit is refused rather than saturated.
fn ints_of(v: &[f64]) -> Result<Vec<i32>, String> {
    v.iter()
        .map(|&x| {
            let r = x.round();
            if (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&r) {
                Ok(r as i32)
            } else {
                Err(format!(
                    "invalid `--vector`: {x} does not fit a 32-bit integer gradient"
                ))
            }
        })
        .collect()
}

/// The `--vector` values as FP32 gradients; one beyond FP32's range is refused rather than
/// made infinite.
fn floats_of(v: &[f64]) -> Result<Vec<f32>, String> {
    v.iter()
        .map(|&x| {
            let f = x as f32;
            if f.is_finite() {
                Ok(f)
            } else {
                Err(format!(
                    "invalid `--vector`: {x} does not fit an FP32 gradient"
                ))
            }
        })
        .collect()
}

/// The options of `pfemu worker` that are out of range whatever else is given, refused
/// before anything is built or sent.
fn check_worker_args(a: &WorkerArgs) -> Result<(), OptionError> {
    let refuse = |option, reason: String| Err(OptionError { option, reason });
    // The worker counts time in nanoseconds, in 64 bits.
    if a.retransmit_ms.checked_mul(1_000_000).is_none() {
        return refuse(
            "--retransmit-ms",
            format!(
                "{} ms does not fit the worker's 64-bit nanosecond clock (at most {})",
                a.retransmit_ms,
                u64::MAX / 1_000_000
            ),
        );
    }
    if a.drop_every == Some(0) {
        return refuse(
            "--drop-every",
            "0 drops nothing; give N >= 1 (drop every N-th packet), or leave the option out".into(),
        );
    }
    if a.workers == 0 {
        return refuse(
            "--workers",
            "a job has at least one worker (sources 0..N, N >= 1)".into(),
        );
    }
    Ok(())
}

/// `pfemu worker`.
pub fn worker(a: &WorkerArgs) -> CliResult {
    check_worker_args(a)?;
    let retransmit = (a.retransmit_ms > 0).then(|| Duration::from_millis(a.retransmit_ms));
    let wcfg = serve::worker_config(a.job, a.src, a.grads_per_packet, a.window, retransmit);
    if a.vector.is_none() {
        // The vector, its scaled copy, the sums and the expected sums.
        pfemu::limits::check_fits("--gradients", a.gradients as u64, "gradients", 32)?;
    }
    let file = a.vector.as_ref().map(read_vector).transpose()?;
    let lanes = if a.fpisa {
        LaneType::Fp32
    } else {
        LaneType::Int32
    };
    let w = match (&file, lanes) {
        (Some(v), LaneType::Int32) => Worker::new(wcfg, ints_of(v)?),
        (Some(v), LaneType::Fp32) => Worker::from_f32(wcfg, &floats_of(v)?),
        (None, LaneType::Int32) => {
            Worker::new(wcfg, serve::seeded_ints(a.seed, a.src, a.gradients))
        }
        (None, LaneType::Fp32) => {
            Worker::from_f32(wcfg, &serve::seeded_floats(a.seed, a.src, a.gradients))
        }
    };
    let mut w = w.map_err(|e| match e {
        // The vector comes from --gradients (seeded) or --vector.
        HostError::Config {
            setting: "values",
            reason,
        } if file.is_some() => setting_error("vector", reason),
        e => serve_error(e.into()),
    })?;
    let give_up_after = pfemu::duration::secs(a.give_up_s)
        .map_err(|e| format!("invalid option `--give-up-s`: {e}"))?;
    if a.iface.is_some() {
        // What a UDP socket has and an interface does not.
        for (given, flag) in [
            (a.drop_every.is_some(), "--drop-every"),
            (a.no_join, "--no-join"),
            (a.no_gso, "--no-gso"),
            (a.no_gro, "--no-gro"),
        ] {
            if given {
                return Err(format!(
                    "invalid option `{flag}`: applies to a worker of a server (--server), not \
                     on an interface (--iface)"
                )
                .into());
            }
        }
    }
    let ccfg = a.server.map(|server| ClientConfig {
        give_up_after,
        drop_every: a.drop_every,
        recv_buffer_bytes: a.recv_buffer_kb.saturating_mul(1024),
        join: !a.no_join,
        gso: !a.no_gso,
        gro: !a.no_gro,
        ..ClientConfig::new(server)
    });
    // The sums the seeded vectors must give, drawn now: after the allreduce, a worker that
    // finished first would take the CPU from the others still in theirs.
    let sources: Vec<u8> = (0..a.workers).collect();
    let expected = file
        .is_none()
        .then(|| serve::ExpectedSums::new(a.seed, &sources, w.sums().len(), lanes));
    if let Some(ms) = a.start_at_ms {
        let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
        let wait = at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        if wait > Duration::from_secs(3600) {
            return Err(format!(
                "invalid option `--start-at-ms`: {ms} is {:.0} s from now, more than an hour",
                wait.as_secs_f64()
            )
            .into());
        }
        std::thread::sleep(wait);
    }
    let t0 = Instant::now();
    let report = match (&a.iface, ccfg) {
        (Some(iface), _) => {
            pfemu::lab::live::allreduce_on_interface(iface, &mut w, give_up_after).map_err(|e| {
                match e {
                    // The settings it refuses are this command's options, spelt alike
                    // (`grads_per_packet` is --grads-per-packet).
                    pfemu::lab::live::LiveError::Config(c) => format!(
                        "invalid option `--{}`: {}",
                        c.setting.replace('_', "-"),
                        c.reason
                    )
                    .into(),
                    e => Box::new(e) as Box<dyn std::error::Error>,
                }
            })?
        }
        (None, Some(ccfg)) => serve::allreduce(&ccfg, &mut w).map_err(serve_error)?,
        (None, None) => return Err("give --server or --iface".into()),
    };
    let wall = t0.elapsed().as_secs_f64();
    let degraded_chunks = w.degraded().iter().filter(|&&d| d).count();
    let src_cnt_min = w.src_counts().iter().copied().min().unwrap_or(0);
    // Check the chunks every worker contributed to (with seeded vectors): their sums are
    // known.
    let check = expected.map(|e| e.check(&w));
    let SeededCheck {
        compared,
        mismatches,
        server_lanes,
    } = check.clone().unwrap_or_default();
    let checked = check.is_some();
    let total = w.sums().len();
    let exact = checked && compared == total && mismatches == 0;
    if a.json {
        let sums_head: Vec<String> = if a.fpisa {
            w.float_sums()
                .iter()
                .take(8)
                .map(|v| v.to_string())
                .collect()
        } else {
            w.sums().iter().take(8).map(|v| v.to_string()).collect()
        };
        println!(
            "{}",
            json!({
                "job": a.job,
                "src": a.src,
                "report": report,
                "wall_s": wall,
                "degraded_chunks": degraded_chunks,
                "src_cnt_min": src_cnt_min,
                "checked": checked,
                "compared": compared,
                "mismatches": mismatches,
                "server_lanes": server_lanes,
                "exact": exact,
                "sums_head": sums_head,
            })
        );
    } else {
        println!(
            "worker: job {}, source {}: {} gradients in {:.3} s = {:.3} Gbit/s; {} packets \
             sent ({} retransmitted, {} dropped by --drop-every), {} Results ({} degraded)",
            a.job,
            a.src,
            report.gradients,
            report.elapsed_s,
            report.goodput_gbps,
            report.stats.sent,
            report.stats.retransmitted,
            report.dropped_by_injector,
            report.stats.results,
            report.stats.degraded
        );
        if checked {
            println!(
                "sums: {} ({compared} of {total} gradients checked against the sums of \
                 {} workers, {mismatches} mismatches, min src_cnt {src_cnt_min})",
                if server_lanes.is_some() {
                    "NOT exact: the server runs the other program (below)"
                } else if mismatches > 0 {
                    "NOT exact"
                } else if compared == 0 {
                    "NOT checked"
                } else if exact {
                    "exact"
                } else {
                    "partial (degraded chunks), the full ones exact"
                },
                a.workers,
            );
        } else if a.fpisa {
            println!("sums: {:?}", w.float_sums());
        } else {
            println!("sums: {:?}", w.sums());
        }
    }
    if let Some(server) = server_lanes {
        return Err(format!(
            "the server aggregates {server}, this worker sent {lanes}: run the worker {} (or \
             the server with --program {}); every checked sum is what that program gives",
            match server {
                LaneType::Fp32 => "with --fpisa",
                LaneType::Int32 => "without --fpisa",
            },
            match lanes {
                LaneType::Fp32 => "fpisa",
                LaneType::Int32 => "trio-ml",
            }
        )
        .into());
    }
    if mismatches > 0 {
        return Err(format!("{mismatches} sums differ from the expected ones").into());
    }
    if checked && compared == 0 {
        return Err(format!(
            "no sum was checked: the expected sums are those of --workers {} sources, and no \
             Result counted that many (min src_cnt {src_cnt_min}, {degraded_chunks} of {} \
             chunks degraded); give --workers the job's number of sources",
            a.workers,
            w.chunks()
        )
        .into());
    }
    Ok(())
}
