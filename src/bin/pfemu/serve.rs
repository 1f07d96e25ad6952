//! `pfemu serve` (a UDP front end to an aggregating engine) and `pfemu worker` (a real
//! end host that allreduces a vector through it). See `pfemu::lab::serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde_json::json;

use pfemu::fpisa::Variant;
use pfemu::lab::aggregation::{Aggregation, AggregationSetup, JobSpec};
use pfemu::lab::serve::{self, ClientConfig, RunLimits, ServeConfig, Server};
use pfemu::microcode::trio_ml::host::Worker;

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
    /// Address and UDP port to listen on (port 0: any free port; the address in use is
    /// printed first).
    #[arg(long, default_value = "127.0.0.1:12000")]
    pub listen: SocketAddr,
    /// A job: JOB:N (sources 0..N) or JOB:FIRST..END; repeatable.
    #[arg(long = "job", required_unless_present = "jobs_file")]
    pub jobs: Vec<JobSpec>,
    /// More jobs, from a file: one JOB:N or JOB:FIRST..END per line, `#` comments.
    #[arg(long, value_name = "FILE")]
    pub jobs_file: Option<PathBuf>,
    /// Block timeout of every job, in milliseconds (1..=255): a worker process that starts
    /// later than this after the others is left out (partial Results).
    #[arg(long, default_value_t = 200)]
    pub block_exp_ms: u8,
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
    /// PPE threads.
    #[arg(long, default_value_t = 4)]
    pub ppe_threads: usize,
    /// Stop after this many seconds (default: run until --idle-exit-ms, SIGINT or SIGTERM;
    /// each stops gracefully and prints the final report).
    #[arg(long, value_parser = super::parse_secs)]
    pub seconds: Option<f64>,
    /// Stop after this long without a datagram, once one has arrived.
    #[arg(long)]
    pub idle_exit_ms: Option<u64>,
    /// Send Results to this aggregator (as one source of its job) instead of the members.
    #[arg(long)]
    pub upstream: Option<SocketAddr>,
    /// This aggregator's source id in the upstream job.
    #[arg(long, default_value_t = 0)]
    pub upstream_src: u8,
    /// Receive buffer asked for the listening socket, KiB (the kernel caps it at
    /// net.core.rmem_max; 0 keeps the system's default).
    #[arg(long, default_value_t = 4096)]
    pub recv_buffer_kb: usize,
    /// Print the final report as one JSON object (the `listening` line then goes to
    /// standard error).
    #[arg(long)]
    pub json: bool,
}

/// `pfemu worker`'s options.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The server (`pfemu serve --listen`).
    #[arg(long)]
    pub server: SocketAddr,
    /// The job id.
    #[arg(long, default_value_t = 1)]
    pub job: u8,
    /// This worker's source id.
    #[arg(long)]
    pub src: u8,
    /// Workers in the job (sources 0..N): with --seed, the sums are checked against them.
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
    /// Resend a packet whose Result has not come back in this many milliseconds (0: never).
    #[arg(long, default_value_t = 50)]
    pub retransmit_ms: u64,
    /// Give up after this many seconds without a Result.
    #[arg(long, default_value_t = 10.0, value_parser = super::parse_secs)]
    pub give_up_s: f64,
    /// Fault injection: drop every N-th packet this worker sends.
    #[arg(long)]
    pub drop_every: Option<u64>,
    /// Do not join the job's run first: speak the paper's header alone. A worker that joins
    /// (the default) is never answered with Results kept from an earlier run of the job;
    /// one that does not is fine for a job's single run (see the README's run protocol).
    #[arg(long)]
    pub no_join: bool,
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
            block_exp_ms: a.block_exp_ms,
            keep_result_ms: a.keep_result_ms,
            window: a.window,
            block_cnt_max: a.block_cnt_max,
            block_grad_max: a.block_grad_max,
            ..AggregationSetup::default()
        },
        ppe_threads: a.ppe_threads,
        upstream: a.upstream,
        upstream_src: a.upstream_src,
        recv_buffer_bytes: a.recv_buffer_kb.saturating_mul(1024),
        log_warnings: true,
    };
    // Checked by clap (`parse_secs`); converted before binding, so nothing can fail later.
    let duration = a
        .seconds
        .map(pfemu::duration::secs)
        .transpose()
        .map_err(|e| format!("invalid option `--seconds`: {e}"))?;
    let server = Server::bind(&cfg)?;
    // SIGINT / SIGTERM stop the server the graceful way: the engine drains, every Result in
    // flight goes out, and the final report is printed.
    let stop = server.stop_handle();
    ctrlc::set_handler(move || stop.stop())
        .map_err(|e| format!("cannot install the SIGINT/SIGTERM handler: {e}"))?;
    let addr = server.local_addr()?;
    // The first line is the address, so a script (or a test) can read the port; with
    // --json it goes to standard error, so standard output is one JSON object.
    if a.json {
        eprintln!("listening {addr}");
    } else {
        println!("listening {addr}");
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
            "dropped: {} short, {} bad length, {} unknown job; {} from sources outside their \
             job (the engine drops them); {} unroutable, {} socket errors",
            f.dropped_short,
            f.dropped_bad_length,
            f.dropped_unknown_job,
            f.strangers,
            f.unroutable,
            f.socket_errors
        );
        println!(
            "stop: {} blocks open, {} still open after waiting for their timeout",
            report.open_blocks_at_stop, report.open_blocks_left
        );
        println!(
            "engine: {} in, {} consumed, {} dropped {:?}",
            report.engine.packets_in,
            report.engine.consumed,
            report.engine.dropped,
            report.engine.dropped_by_reason
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

/// The jobs given with `--job`, then those of `--jobs-file`.
pub fn jobs_of(
    flags: &[JobSpec],
    file: Option<&std::path::Path>,
) -> Result<Vec<JobSpec>, Box<dyn std::error::Error>> {
    let mut jobs = flags.to_vec();
    if let Some(path) = file {
        jobs.extend(JobSpec::read_list(path)?);
    }
    Ok(jobs)
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

/// `pfemu worker`.
pub fn worker(a: &WorkerArgs) -> CliResult {
    let retransmit = (a.retransmit_ms > 0).then(|| Duration::from_millis(a.retransmit_ms));
    let wcfg = serve::worker_config(a.job, a.src, a.grads_per_packet, a.window, retransmit);
    if a.vector.is_none() {
        // The vector, its scaled copy, the sums and the expected sums.
        pfemu::limits::check_fits("--gradients", a.gradients as u64, "gradients", 32)?;
    }
    let file = a.vector.as_ref().map(read_vector).transpose()?;
    let mut w = match (&file, a.fpisa) {
        (Some(v), false) => Worker::new(wcfg, ints_of(v)?)?,
        (Some(v), true) => Worker::from_f32(wcfg, &floats_of(v)?)?,
        (None, false) => Worker::new(wcfg, serve::seeded_ints(a.seed, a.src, a.gradients))?,
        (None, true) => Worker::from_f32(wcfg, &serve::seeded_floats(a.seed, a.src, a.gradients))?,
    };
    let give_up_after = pfemu::duration::secs(a.give_up_s)
        .map_err(|e| format!("invalid option `--give-up-s`: {e}"))?;
    let ccfg = ClientConfig {
        give_up_after,
        drop_every: a.drop_every,
        recv_buffer_bytes: a.recv_buffer_kb.saturating_mul(1024),
        join: !a.no_join,
        ..ClientConfig::new(a.server)
    };
    let t0 = Instant::now();
    let report = serve::allreduce(&ccfg, &mut w)?;
    let wall = t0.elapsed().as_secs_f64();
    let degraded_chunks = w.degraded().iter().filter(|&&d| d).count();
    let src_cnt_min = w.src_counts().iter().copied().min().unwrap_or(0);
    // Check the chunks every worker contributed to (with seeded vectors): their sums are
    // known. `compared` counts the gradients actually compared.
    let (checked, compared, mismatches) = if file.is_none() {
        let sources: Vec<u8> = (0..a.workers).collect();
        let g = a.grads_per_packet;
        let full = |i: usize| !w.degraded()[i / g] && w.src_counts()[i / g] == a.workers;
        let (mut compared, mut mismatches) = (0usize, 0usize);
        let mut tally = |i: usize, differs: bool| {
            if full(i) {
                compared += 1;
                mismatches += usize::from(differs);
            }
        };
        if a.fpisa {
            let want = serve::expected_float_sums(a.seed, &sources, a.gradients);
            for (i, (got, want)) in w.float_sums().iter().zip(&want).enumerate() {
                tally(i, got != want);
            }
        } else {
            let want = serve::expected_int_sums(a.seed, &sources, a.gradients);
            for (i, (got, want)) in w.sums().iter().zip(&want).enumerate() {
                tally(i, got != want);
            }
        }
        (true, compared, mismatches)
    } else {
        (false, 0, 0)
    };
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
                "exact": exact,
                "sums_head": sums_head,
            })
        );
    } else {
        println!(
            "worker {}/{}: {} gradients in {:.3} s = {:.3} Gbit/s; {} packets sent ({} \
             retransmitted, {} dropped by --drop-every), {} Results ({} degraded)",
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
                if mismatches > 0 {
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
    if checked && mismatches > 0 {
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
