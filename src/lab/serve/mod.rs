//! A UDP front end for the aggregation programs: real end-host processes send Trio-ML (or
//! FPISA) packets over UDP to a running engine and get their Results back.
//!
//! # Datagrams and frames
//!
//! On the wire between hosts and this process, a datagram's UDP payload is the 12-byte
//! Trio-ML header followed by `grad_cnt` gradients (the paper's Figure 7 without the
//! Ethernet, IPv4 and UDP headers, which the kernel owns). The engine works on Ethernet
//! frames, so [`Server`] maps between the two:
//!
//! - **Ingress.** Every configured source of every job, `(job_id, src_id)`, is a *member*
//!   with a fixed index `i` (the jobs' sources numbered in the order the jobs are given),
//!   a synthetic IPv4 address ([`peer_ip`]: `10.(1 + i / 65536).(i / 256 % 256).(i %
//!   256)`) and an ingress port, [`PEER_PORT_BASE`]` + i`. A datagram becomes the frame
//!   Ethernet (to [`TrioMlConfig::local_mac`]) + IPv4 (from the member's synthetic address
//!   to [`TrioMlConfig::local_addr`]) + UDP (from the sender's UDP port to
//!   [`TrioMlConfig::udp_port`]) + the payload unchanged, injected on the member's port.
//!   The server remembers the address each member last sent from: that is where the
//!   member's Results go, so a worker that restarts on a new port is answered there (a
//!   datagram of a run counts from the address the member joined from alone: see *Runs
//!   across restarts*). A
//!   datagram naming a source outside its job's sources is injected on [`STRANGER_PORT`]
//!   from [`STRANGER_IP`] for the engine to drop (`unknown_source`), and its sender is not
//!   remembered: the front end's state is fixed by the configuration, whatever arrives.
//! - **Egress.** Every job's Results go to egress port `job_id` (the job's `out_nh_addr`;
//!   ports `0..256` are job ports). The sink strips Ethernet, IPv4 and UDP from
//!   each frame leaving the engine and sends the payload as a datagram: a frame on a job
//!   port is fanned out to every member of the job (this emulates the multicast group), a
//!   frame on a peer port (a kept Result answering one source's retransmission) goes to that
//!   peer only, and a frame on [`STRANGER_PORT`] (an answer to a datagram from outside its
//!   job) to nobody, counted in [`ServeStats::unroutable`].
//! - **Hierarchy.** With [`ServeConfig::upstream`] set, this server is a first-level
//!   aggregator: each job's Results carry `src_id` [`ServeConfig::upstream_src`] (the low byte
//!   of `out_src_addr`) and every Result leaving the engine, whatever its port, goes to the
//!   upstream aggregator as one source of the upper job. Datagrams *from* the upstream
//!   address are the upper job's Results: they are not injected but fanned out to the local
//!   members of the job with the same id. A worker's retransmission is answered by this
//!   level's kept Result, which then goes upstream again, where it asks the upper level for
//!   its kept Result, which comes back down to every member.
//! - **Runs in a tree.** A first-level server takes part in the run protocol upstream on
//!   behalf of its members: when a member's Join starts a new run of a job here (a Joined
//!   with a new run id leaves the engine), the server sends a Join of its own to the
//!   upstream aggregator and holds that job's Results (up to [`MAX_HELD_RESULTS`]) until the
//!   Joined comes back, sending the Join again every 100 ms while it does not. Results go up
//!   in the run the upstream aggregator gave it; Results of a run the job here has left are
//!   not sent ([`ServeStats::results_of_left_runs`]); Results from above are fanned out only
//!   if they are of that run ([`ServeStats::upstream_stale_in`] counts the others), with the
//!   job's run here in their header. So a job restarted through a tree is never answered
//!   with the last run's sums at either level. When the upstream aggregator answers a
//!   Result with Superseded (the job above moved on to another run: it restarted, or
//!   another of its sources started a new run), this server joins the job above again
//!   with the nonce it joined with (so the job above takes it for a source joining its
//!   current run, never for a restart) and holds the Results meanwhile, as for a new run here
//!   ([`ServeStats::upstream_superseded`]); the Results lost up there come up again with
//!   the members' retransmissions. A Superseded naming run 0 (the upstream aggregator
//!   restarted and this server has not joined it: see *Runs across restarts*) is handled
//!   the same way. Members that never join (run 0) keep the
//!   server out of the protocol upstream too, as before.
//!
//! # Runs across restarts
//!
//! A server instance starts with no member joined, and a member's datagram of a run
//! (gradients with a `run_id`, or a request for a kept Result) counts only from the
//! address that member last sent a Join from to this instance. From any other address it
//! is not injected, its sender is not remembered, and the front end answers it with
//! [`Control::Superseded`] naming run 0 (this server has no run of the job for that
//! sender), counted in [`ServeStats::not_joined`]. So the workers of an earlier instance,
//! still sending when the server restarted, are never added to this instance's blocks nor
//! answered with its Results, whatever run id the new instance's job has. Run ids have 4
//! bits: a restarted server's job comes back to the last instance's run id
//! ([`ServeConfig::first_run`], drawn at random, does 1 time in 15), and neither the run
//! id nor anything else in a data packet tells the two instances' workers apart (the nonce
//! travels in the Join alone). What this server knows of its members does: the address each
//! joined from. The same holds for an earlier process of a source that joined again from
//! another address while the old one still sends (one source, two processes: the engine's
//! per-source state cannot tell them apart). Such a worker stops with
//! [`HostError::Superseded`]; a first-level server answered so by its upstream aggregator
//! joins the job above again (see *Runs in a tree*), so a restarted upper server takes its
//! lower servers back at once. The fan-out goes to the addresses the front end took
//! datagrams from, so those senders get none of the job's Results either. Datagrams without
//! a run (clients of the paper's header alone) are taken from any address for a member that
//! has not joined this instance, as before: such clients are not protected against a
//! restart, as they are not against another run of their job. Once a member has joined,
//! its datagrams count from its joined address alone, with a run or without: a client
//! that does not join cannot take a joined member's place (its address, so its Results),
//! and is answered Superseded (run 0) like the others.
//!
//! Nothing outlives the instance (no state file to keep, lose or share between servers),
//! the guarantee does not depend on the run id drawn, and the wire is unchanged: the answer
//! is the protocol's Superseded, with the run 0 it already names when a job has no run. A
//! job removed through the control plane forgets its members' joins and addresses, as the
//! engine forgets their joins with the job, so added again it takes its members' datagrams
//! of a run only once they have joined it.
//!
//! A worker whose address changes while it runs (a NAT rebinding) is answered the same
//! way, and joins its run again from the new address: a Join naming the run it joined, with
//! the nonce it joined with (a *rejoin*). The front end takes a rejoin only with the nonce
//! of the member's last Join to this instance, which no other process knows (the last
//! instance's workers, an earlier process of the source), and the engine answers it as the
//! repeated Join it is (same nonce, same run). Any other rejoin is answered Superseded
//! (run 0) with the rejoin's nonce in `block_id`, so the worker tells that refusal from
//! the answers to its gradients, and stops. [`allreduce`] (`pfemu worker`) rejoins so,
//! and its refused chunks go again when overdue ([`ClientReport::rejoins`]).
//!
//! Datagrams that are not aggregation packets are dropped and counted in [`ServeStats`]:
//! shorter than the header, a length that is not the header plus `grad_cnt` gradients, or a
//! job not configured here. The engine counts its own drops (`unknown_source`, `duplicate`,
//! `block_cnt_max`, ...) in its [`Stats`]. Every datagram is accounted for:
//! [`ServeStats::unaccounted`] is 0. Datagrams that never reach the server, because the
//! kernel dropped them while the listening socket's receive buffer was full, are counted
//! too, in [`ServeStats::kernel_dropped`] (the kernel's count for the socket), with a
//! warning in the report; so is a receive buffer granted smaller than
//! [`ServeConfig::recv_buffer_bytes`] asked for.
//!
//! # Batches
//!
//! The front end moves datagrams in batches ([`udp_batch`]): the receive loop takes what
//! is queued on the socket with one `recvmmsg` and injects the members' frames together,
//! each as the Ethernet, IPv4 and UDP headers it makes and the payload where the receive
//! left it, which the engine's ingress copy joins (after the receive, a datagram's bytes
//! are copied once, into the engine: [`crate::pfe::FrameBytes`]);
//! the sink sends the datagrams of each burst of frames leaving the engine with one
//! `sendmmsg`, a member's Results (equal-sized, 4 KB with 1024 gradients) as one GSO
//! message; a [`Worker`] run by [`allreduce`] sends what one poll gives with one call and
//! takes every queued Result with one. With GRO on, the kernel hands a sender's GSO
//! message over whole (on loopback it never cuts it up), so a window of packets crosses
//! the kernel as one buffer, and the front end cuts it into the datagrams again: every
//! datagram is still counted, checked and injected on its own. Where the kernel lacks
//! GSO or GRO (or refuses a GSO message, e.g. datagrams larger than the route's MTU) the
//! datagrams go singly; [`ServeStats::gso`] and [`ServeStats::gro`] say what was used,
//! and [`ServeConfig::gso`] / [`ServeConfig::gro`] turn them off.
//!
//! # Bounded state
//!
//! Nothing the server keeps grows with what it receives: the members are fixed by the jobs,
//! a job's blocks by its slots ([`AggregationSetup::slots`]; a flood of new block ids beyond them is
//! dropped as `block_cnt_max`, and blocks nobody completes time out after
//! [`AggregationSetup::block_exp_ms`]), and the engine's memory is allocated when it starts.
//!
//! A finished block keeps its Result in its slot (for sources that lost it) until the next
//! generation of the same block id finishes, or until nobody asked for it during
//! [`AggregationSetup::keep_result_ms`]. So a member that floods new block ids fills its job's
//! slots for that long at most; the job then takes new blocks again. Sources are not
//! authenticated: a member's datagrams are trusted.
//!
//! # Stopping
//!
//! [`StopHandle::stop`] (SIGINT or SIGTERM in `pfemu serve`) stops injecting: from the
//! receive loop's next turn, the members' datagrams are still received and counted, in
//! [`ServeStats::dropped_stopping`], but not injected (nor their senders remembered), so no
//! new block opens. Meanwhile the server waits for the blocks still open to time out, so
//! their partial Results go out like any other (about one block timeout;
//! [`TrioMl::finish_open_blocks`] gives up when none has finished for twice the timeout and
//! 0.5 s more, counted in the timers' scans so that a loaded machine is waited for), and
//! shuts the engine down after it drained: no Result the engine built or owes is lost.
//! Without a block timeout ([`NO_BLOCK_TIMEOUT`]) no partial Result is owed: a block
//! still missing a source when the server stops is left open, counted in
//! [`ServeReport::open_blocks_left`].
//!
//! [`NO_BLOCK_TIMEOUT`]: crate::microcode::trio_ml::NO_BLOCK_TIMEOUT
//!
//! A first-level server goes on reading the upstream aggregator's datagrams all the while,
//! fanning its Results out and taking its answers to Joins as ever, and after the engine stopped
//! it waits for the answers its members are owed: to every Result it sent up while
//! stopping (the partial Results of the open blocks among them) or in the
//! [`ServeConfig::stop_upstream_wait`] (2 s by default, `--stop-upstream-wait-ms`) before
//! the stop (a Result that went up just before it is answered after it), and to those it
//! holds for a Join upstream, until they have all come, or until that wait has passed since
//! the engine stopped and since the last Result went up. Those still unanswered then are
//! counted in [`ServeStats::upstream_unanswered`]. (Answers to Results sent up longer ago
//! than the wait before the stop are taken for lost: one that still comes after the
//! server stopped is not read.)
//!
//! # Clients
//!
//! [`allreduce`] runs a [`Worker`] (the sans-IO host of
//! [`host`](crate::microcode::trio_ml::host)) over a UDP socket: the UDP payloads of the
//! frames [`Worker::poll`] gives are sent to the server, and each datagram received is
//! wrapped into a frame again for [`Worker::on_frame_at`]; a client that waits in vain says
//! whether anything answered at all ([`NoProgress`]). [`seeded_ints`] and [`seeded_floats`]
//! give every worker every other worker's vector, so each can check the exact sums
//! ([`expected_int_sums`], [`expected_float_sums`], [`ExpectedSums`], which also
//! recognises the sums of a server running the other lane type: integers sent to FPISA,
//! floats to Trio-ML). [`resolve`] turns `HOST:PORT` into an address, IPv4 first.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;

use crate::lab::aggregation::{AggregationSetup, JobSpec};
use crate::lab::control::{ControlServer, Controller, JobsTarget, Target};
use crate::lab::trace::{TraceOutput, TraceSpec, TraceSummary};
use crate::lab::udp_batch::{self, Gso, RecvBatch, SendBatch};
use crate::mem::SharedMemory;
use crate::microcode::trio_ml::host::{
    HostError, Payloads, Received, Worker, WorkerConfig, WorkerStats,
};
use crate::microcode::trio_ml::wire::{
    self, Control, Endpoints, TrioMlHdr, TrioMlHdrFields, GRADS_AT, GRAD_BYTES, HEADERS_LEN,
    MAX_GRAD_CNT, TRIO_ML_HDR_AT, TRIO_ML_HDR_LEN,
};
use crate::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig, TrioMlError};
use crate::packet::Port;
use crate::pfe::{Frames, Pfe, Sink, Stats, DEFAULT_BATCH_SIZE};
use crate::rng::{mix, SplitMix64};
use crate::timer::ManualClock;
use crate::ConfigError;

/// Ingress port of member 0; ports `0..256` are job ports (egress port `job_id`).
pub const PEER_PORT_BASE: u16 = 257;
/// Ingress port of datagrams from sources outside their job (the engine drops them).
pub const STRANGER_PORT: u16 = 256;
/// IPv4 source address of datagrams from sources outside their job.
pub const STRANGER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 255, 254);
/// Largest UDP payload of an aggregation packet: the header and 4095 gradients.
pub const MAX_PAYLOAD: usize = TRIO_ML_HDR_LEN + MAX_GRAD_CNT as usize * GRAD_BYTES;

/// How a [`Server`] is set up.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The aggregation program and its jobs.
    pub setup: AggregationSetup,
    /// PPE threads of the engine (default: [`default_ppe_threads`]).
    pub ppe_threads: usize,
    /// Send Results to this aggregator instead of the job's members (see the module docs).
    pub upstream: Option<SocketAddr>,
    /// This aggregator's source id in the upper job (the Results' `src_id`).
    pub upstream_src: u8,
    /// Receive buffer asked of the kernel for the listening socket, bytes (0: the
    /// system's default). Linux caps it at `net.core.rmem_max`; the granted size is in
    /// [`ServeStats::recv_buffer_bytes`]. Workers' windows of packets arrive in bursts, and
    /// the default buffer (about 200 KB) overflows with four workers of window 16.
    pub recv_buffer_bytes: usize,
    /// Print a warning to standard error while the server runs when blocks are refused
    /// because a job's slots are full, or packets because they carry more gradients than
    /// [`AggregationSetup::block_grad_max`] (at most once a second; [`ServeReport::warnings`]
    /// has the totals either way).
    pub log_warnings: bool,
    /// Send a burst of Results for one member as one GSO message (`UDP_SEGMENT`) when the
    /// kernel has it; [`ServeStats::gso`] says whether it was used.
    pub gso: bool,
    /// Ask the kernel to coalesce a sender's datagrams into one message (`UDP_GRO`) when
    /// it has it; [`ServeStats::gro`] says whether it was used.
    pub gro: bool,
    /// Serve the runtime control plane ([`crate::lab::control`]) on this address while the
    /// server runs: counters, memory, timers and the jobs ([`Server::control_addr`]). The
    /// members are fixed by [`ServeConfig::setup`]'s jobs: a job added must be one of them
    /// (removed before), with sources among its own; others are refused.
    pub control: Option<String>,
    /// Trace these packets ([`crate::lab::trace`]); [`ServeReport::trace`] says what was
    /// written.
    pub trace: Option<TraceSpec>,
    /// The run (1..=15) each job's first Join joins ([`TrioMl::start_runs_at`]); `None`:
    /// drawn at random per job and server instance. A restarted server forgets its jobs'
    /// runs, and its last instance's workers may still send theirs: what keeps their
    /// gradients out of the new instance's blocks is the front end, which takes a member's
    /// datagrams of a run only from the address it joined this instance from (module docs,
    /// *Runs across restarts*), whatever this setting, two instances given the same run
    /// included. The draw guards nothing; it only makes two instances' runs differ (in
    /// traces and reports) 14 times in 15. (Jobs added through the control plane start at
    /// run 1.)
    pub first_run: Option<u8>,
    /// How long a stopping first-level server (with [`ServeConfig::upstream`]) waits for
    /// the upstream aggregator's answers to the Results it sent up while stopping (or this
    /// long before the stop), after
    /// the engine stopped and after the last of them went up (see the module docs,
    /// *Stopping*; default: [`DEFAULT_STOP_UPSTREAM_WAIT`]; `pfemu serve
    /// --stop-upstream-wait-ms`).
    pub stop_upstream_wait: Duration,
    /// The engine's clock when it is not the system's: the straggler scan (block timeouts)
    /// and the expiry of kept Results follow it, the rest of the server (retransmission
    /// answers, idle exit, stopping waits) the system's. A [`ManualClock`] nobody moves
    /// makes every block wait for all its sources, however late one comes, but stops the
    /// expiry of kept Results too; for the first alone, give the jobs no block timeout
    /// ([`AggregationSetup::block_exp_ms`] 0, `pfemu serve --block-exp-ms off`). `None`:
    /// the system clock.
    pub clock: Option<Arc<ManualClock>>,
}

/// Default [`ServeConfig::stop_upstream_wait`]: 2 s, a round trip and the longest block
/// timeout up there (255 ms) several times over.
pub const DEFAULT_STOP_UPSTREAM_WAIT: Duration = Duration::from_secs(2);

/// Default [`ServeConfig::ppe_threads`]: the cores available to the process less one, which
/// the thread receiving the datagrams takes; at least one.
///
/// More PPE threads than cores only take turns on them: on two cores with four workers
/// beside the server, one PPE thread aggregates 1.16x the goodput of four in the same
/// sitting (median of 5 interleaved rounds, BENCHMARKS.md), using a sixth less CPU; the
/// threads stop handing blocks and timer launches to each other.
pub fn default_ppe_threads() -> usize {
    crate::pfe::default_ppe_threads().saturating_sub(1).max(1)
}

/// Default [`ServeConfig::recv_buffer_bytes`]: 4 MiB.
pub const DEFAULT_RECV_BUFFER_BYTES: usize = 4 << 20;

/// Largest [`ServeConfig::recv_buffer_bytes`]: what `setsockopt(SO_RCVBUF)` takes (a C
/// `int`, which the kernel doubles).
pub const MAX_RECV_BUFFER_BYTES: usize = (i32::MAX / 2) as usize;

/// The warning for a listening socket's receive buffer granted smaller than asked for
/// (`None` when it is not), naming the option and the system setting that raise it.
/// `granted` is what the kernel reports (`SO_RCVBUF`): Linux keeps twice the size it
/// takes, for its own bookkeeping, so a buffer granted in full reads `2 * asked`, and one
/// capped at `net.core.rmem_max` reads less.
pub fn recv_buffer_warning(asked: usize, granted: u64) -> Option<String> {
    let asked = asked as u64;
    (asked > 0 && granted < asked.saturating_mul(2)).then(|| {
        format!(
            "the kernel capped the listening socket's receive buffer at {} KiB, less than \
             the {} KiB asked for (--recv-buffer-kb): Linux caps it at net.core.rmem_max, so \
             bursts of datagrams may overflow it (counted in kernel_dropped); raise the cap \
             (sysctl -w net.core.rmem_max={asked})",
            granted / 2 / 1024,
            asked / 1024
        )
    })
}

/// The warning for `n` datagrams the kernel dropped because the listening socket's receive
/// buffer (`granted` bytes) was full.
pub fn kernel_dropped_warning(n: u64, granted: u64) -> String {
    format!(
        "{n} datagrams dropped by the kernel before they were received: the listening \
         socket's receive buffer ({} KiB) was full; raise --recv-buffer-kb (and \
         net.core.rmem_max) or lower the clients' window",
        granted / 1024
    )
}

impl Default for ServeConfig {
    /// 127.0.0.1:12000, the default [`AggregationSetup`] (Trio-ML; give jobs),
    /// [`default_ppe_threads`], no upstream, a 4 MiB receive buffer, GSO and GRO where the
    /// kernel has them.
    fn default() -> Self {
        ServeConfig {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, wire::DEFAULT_UDP_PORT)),
            setup: AggregationSetup::default(),
            ppe_threads: default_ppe_threads(),
            upstream: None,
            upstream_src: 0,
            recv_buffer_bytes: DEFAULT_RECV_BUFFER_BYTES,
            log_warnings: false,
            gso: true,
            gro: true,
            control: None,
            trace: None,
            first_run: None,
            stop_upstream_wait: DEFAULT_STOP_UPSTREAM_WAIT,
            clock: None,
        }
    }
}

/// Refuses a receive buffer larger than `SO_RCVBUF` takes (a C `int`, which the kernel
/// doubles): handed to the kernel, it would wrap to a tiny buffer.
fn check_recv_buffer(bytes: usize) -> Result<(), ServeError> {
    if bytes > MAX_RECV_BUFFER_BYTES {
        return Err(ServeError::Config {
            setting: "recv_buffer_bytes",
            reason: format!(
                "{bytes} bytes is more than the kernel takes ({MAX_RECV_BUFFER_BYTES} bytes at \
                 most; Linux caps it at net.core.rmem_max anyway)"
            ),
        });
    }
    Ok(())
}

/// A UDP socket bound to `addr`, its receive buffer raised to `recv_buffer` bytes when
/// asked (best effort: the kernel grants at most its maximum, which is not an error).
fn bind_udp(addr: SocketAddr, recv_buffer: usize) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if recv_buffer > 0 {
        let _ = socket.set_recv_buffer_size(recv_buffer);
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Why the server or a client could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// A setting is out of range; names the setting.
    Config {
        /// The setting at fault.
        setting: &'static str,
        /// Why.
        reason: String,
    },
    /// An address (`--server`, `--listen`, `--upstream`) names no socket address.
    Resolve {
        /// The address as given.
        addr: String,
        /// Why it does not resolve.
        reason: String,
    },
    /// A socket operation failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The engine or the aggregation program refused its configuration.
    Engine(String),
    /// The worker failed (bad settings, or the job moved on to another run).
    Host(HostError),
    /// A client waited [`ClientConfig::give_up_after`] without progress: for the answer to
    /// its Join, or for Results. [`NoProgress::datagrams`] says whether anything answered.
    NoProgress(NoProgress),
}

/// What a client that gave up waiting saw ([`ServeError::NoProgress`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoProgress {
    /// The server.
    pub server: SocketAddr,
    /// The worker's job.
    pub job_id: u8,
    /// The worker's source id.
    pub src_id: u8,
    /// `true` while joining the job's run, `false` while waiting for Results.
    pub joining: bool,
    /// How long it waited without progress.
    pub waited: Duration,
    /// Datagrams received from the server in all (0: nothing answered at all).
    pub datagrams: u64,
    /// Receives that failed with "connection refused": the server's host reported that
    /// nothing listens on the port (ICMP port unreachable).
    pub refused: u64,
    /// Chunks still without a Result.
    pub missing: usize,
    /// The worker's gradients per packet: a server whose `--block-grad-max` is lower drops
    /// every packet without an answer.
    pub grads_per_packet: usize,
}

impl fmt::Display for NoProgress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let NoProgress {
            server,
            job_id,
            src_id,
            waited,
            ..
        } = self;
        let waited = waited.as_secs_f64();
        if self.datagrams == 0 && self.refused > 0 {
            return write!(
                f,
                "nothing listens on {server}: its host refused the datagrams (port \
                 unreachable) for {waited} s; start `pfemu serve --listen {server} --job \
                 {job_id}:N` first, or give --server the address `pfemu serve` printed"
            );
        }
        if self.datagrams == 0 {
            return write!(
                f,
                "no datagram came back from {server} in {waited} s: is `pfemu serve` running \
                 there, with job {job_id} and source {src_id} in its --job (e.g. --job \
                 {job_id}:{})? It drops datagrams of other jobs and sources without an answer",
                u16::from(*src_id) + 1
            );
        }
        if self.joining {
            write!(
                f,
                "{} datagrams came back from {server}, but none answered the Join of job \
                 {job_id} source {src_id} in {waited} s: is it `pfemu serve`? (--no-join \
                 speaks the paper's header alone, without the run protocol)",
                self.datagrams
            )
        } else {
            write!(
                f,
                "gave up after {waited} s without a Result: {} chunks missing, though {} \
                 datagrams came back from {server} (is the server's --block-grad-max, {} \
                 unless set, below this worker's --grads-per-packet {}? It drops such packets \
                 without an answer, and warns of them as block_grad_max in its report. Or is \
                 another process of job {job_id} using source {src_id}, or the server's \
                 --window below the worker's?)",
                self.missing,
                self.datagrams,
                AggregationSetup::default().block_grad_max,
                self.grads_per_packet
            )
        }
    }
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Config { setting, reason } => write!(f, "invalid `{setting}`: {reason}"),
            ServeError::Resolve { addr, reason } => write!(
                f,
                "cannot resolve `{addr}`: {reason} (expected HOST:PORT, e.g. localhost:12000)"
            ),
            ServeError::Io { what, source } => write!(f, "{what}: {source}"),
            ServeError::Engine(e) => write!(f, "engine: {e}"),
            ServeError::Host(e) => write!(f, "worker: {e}"),
            ServeError::NoProgress(p) => write!(f, "worker: {p}"),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Io { source, .. } => Some(source),
            ServeError::Host(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for ServeError {
    fn from(e: ConfigError) -> Self {
        ServeError::Config {
            setting: e.setting,
            reason: e.reason,
        }
    }
}

impl From<HostError> for ServeError {
    fn from(e: HostError) -> Self {
        ServeError::Host(e)
    }
}

/// The socket address `addr` (`HOST:PORT`, e.g. `localhost:12000` or `127.0.0.1:12000`)
/// names: the first IPv4 address it resolves to, else the first one (IPv6).
///
/// ```
/// use pfemu::lab::serve::resolve;
///
/// assert_eq!(resolve("127.0.0.1:12000")?.to_string(), "127.0.0.1:12000");
/// assert!(resolve("localhost:12000")?.ip().is_loopback());
/// assert!(resolve("localhost").is_err()); // no port
/// # Ok::<(), pfemu::lab::serve::ServeError>(())
/// ```
pub fn resolve(addr: &str) -> Result<SocketAddr, ServeError> {
    use std::net::ToSocketAddrs;
    let bad = |reason: String| ServeError::Resolve {
        addr: addr.to_string(),
        reason,
    };
    let all: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| bad("it resolves to no address".into()))
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> ServeError {
    move |source| ServeError::Io { what, source }
}

/// What the front end counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServeStats {
    /// The listening socket's receive buffer as the kernel granted it, bytes (Linux grants
    /// twice what is asked for, its bookkeeping counting in it, up to twice
    /// `net.core.rmem_max`; [`ServeReport::warnings`] says when the kernel capped it below
    /// [`ServeConfig::recv_buffer_bytes`]).
    pub recv_buffer_bytes: u64,
    /// Datagrams the kernel dropped before the server could receive them, because the
    /// listening socket's receive buffer was full (the kernel's count of the socket's
    /// drops, `SO_RXQ_OVFL`, and `SO_MEMINFO` for those after the last datagram received;
    /// 0 where the kernel has neither; the count also holds the rare datagram dropped for a
    /// bad checksum). Not in `datagrams_in`: what reached the host is `datagrams_in +
    /// kernel_dropped`, and what was still queued when the server stopped. A sender's GSO message coalesced whole for GRO
    /// (loopback) and dropped may count once.
    pub kernel_dropped: u64,
    /// Datagrams received.
    pub datagrams_in: u64,
    /// Their payload bytes.
    pub bytes_in: u64,
    /// Frames injected into the engine.
    pub injected: u64,
    /// Dropped: shorter than the Trio-ML header.
    pub dropped_short: u64,
    /// Dropped: payload length is not the header plus `grad_cnt` gradients.
    pub dropped_bad_length: u64,
    /// Dropped: the job is not configured here.
    pub dropped_unknown_job: u64,
    /// Of `injected`, datagrams from a source outside its job (the engine drops them as
    /// `unknown_source`).
    pub strangers: u64,
    /// Injections the engine refused because it had stopped (not injected).
    pub not_injected: u64,
    /// Members' datagrams that arrived while the server was stopping (after the stop was
    /// asked for, while the open blocks finished and the upstream aggregator's answers
    /// came): not injected, so that no new block opens, and their senders not remembered.
    pub dropped_stopping: u64,
    /// Members' datagrams of a run (gradients with a `run_id`) from an address that has
    /// not joined this server as that member: a worker of an earlier instance of this
    /// server, an earlier process of a source that joined again from elsewhere, or a worker
    /// whose address changed (it rejoins). Also a joined member's datagrams without a run
    /// from another address, and rejoins without the member's nonce. Not injected, their
    /// senders not remembered, each answered Superseded naming run 0 (see the module docs,
    /// *Runs across restarts*).
    pub not_joined: u64,
    /// Results from the upstream aggregator fanned out to members.
    pub upstream_results_in: u64,
    /// Run-protocol answers from the upstream aggregator (Joined, Superseded).
    pub upstream_control_in: u64,
    /// Joins this first-level server sent upstream (the first of a run, those sent again
    /// while unanswered, and those after a Superseded): the upstream aggregator answers
    /// each one.
    pub upstream_joins_sent: u64,
    /// Superseded answers from the upstream aggregator that made this server join the job
    /// above again (its job there had moved on to another run: e.g. it restarted).
    pub upstream_superseded: u64,
    /// Results from the upstream aggregator of a run this server is no longer in, dropped.
    pub upstream_stale_in: u64,
    /// Results of a run the job here has left, not sent upstream (a first-level server).
    pub results_of_left_runs: u64,
    /// Results dropped because more than [`MAX_HELD_RESULTS`] waited for the upstream
    /// aggregator's answer to a Join.
    pub results_held_over: u64,
    /// Results a stopping first-level server sent up while stopping or in the
    /// [`ServeConfig::stop_upstream_wait`] before (or held for a Join upstream) whose
    /// answer had not come when it stopped waiting:
    /// their members get no Result for them. 0 unless the upstream aggregator stopped or
    /// datagrams were lost.
    pub upstream_unanswered: u64,
    /// Result frames that left the engine.
    pub results: u64,
    /// Datagrams sent (a fanned-out Result counts once per member).
    pub datagrams_out: u64,
    /// Their payload bytes.
    pub bytes_out: u64,
    /// Results nobody could be sent to (no member known, or not a Trio-ML frame).
    pub unroutable: u64,
    /// Failed sends and receives.
    pub socket_errors: u64,
    /// Members (configured sources) heard from so far.
    pub peers: u64,
    /// Times a member was heard from a new address (a worker restarted elsewhere); its
    /// Results go to the newest one.
    pub readdressed: u64,
    /// Receive system calls that returned datagrams (`datagrams_in / recv_calls`
    /// datagrams each: `recvmmsg` takes what is queued, GRO coalesces a sender's).
    pub recv_calls: u64,
    /// Send system calls (`sendmmsg`, one per burst of Results leaving the engine, and
    /// single sends after a refused GSO message).
    pub send_calls: u64,
    /// GRO is on for the listening socket (asked for with [`ServeConfig::gro`] and the
    /// kernel has it: Linux 5.0 and later).
    pub gro: bool,
    /// GSO was in use when the stats were taken (asked for with [`ServeConfig::gso`], the
    /// kernel has it, Linux 4.18 and later, and never refused a GSO message).
    pub gso: bool,
    /// GSO messages the kernel refused (e.g. datagrams larger than the route's MTU), sent
    /// again as single datagrams; GSO is off after the first.
    pub gso_refused: u64,
}

impl ServeStats {
    /// Datagrams received and neither dropped (by the front end, or while stopping),
    /// answered as not joined, fanned out from upstream, injected nor refused by a stopped
    /// engine: 0 unless the front end lost one.
    pub fn unaccounted(&self) -> i128 {
        i128::from(self.datagrams_in)
            - i128::from(self.dropped_short)
            - i128::from(self.dropped_bad_length)
            - i128::from(self.dropped_unknown_job)
            - i128::from(self.upstream_results_in)
            - i128::from(self.upstream_control_in)
            - i128::from(self.upstream_stale_in)
            - i128::from(self.injected)
            - i128::from(self.not_injected)
            - i128::from(self.dropped_stopping)
            - i128::from(self.not_joined)
    }
}

#[derive(Default)]
struct Counters {
    /// The kernel's drop count as the last datagram received carried it (with its wraps).
    kernel_dropped: AtomicU64,
    datagrams_in: AtomicU64,
    bytes_in: AtomicU64,
    injected: AtomicU64,
    dropped_short: AtomicU64,
    dropped_bad_length: AtomicU64,
    dropped_unknown_job: AtomicU64,
    strangers: AtomicU64,
    not_injected: AtomicU64,
    dropped_stopping: AtomicU64,
    not_joined: AtomicU64,
    upstream_unanswered: AtomicU64,
    readdressed: AtomicU64,
    recv_calls: AtomicU64,
    send_calls: AtomicU64,
    gso_refused: AtomicU64,
    upstream_results_in: AtomicU64,
    upstream_control_in: AtomicU64,
    upstream_joins_sent: AtomicU64,
    upstream_superseded: AtomicU64,
    upstream_stale_in: AtomicU64,
    results_of_left_runs: AtomicU64,
    results_held_over: AtomicU64,
    results: AtomicU64,
    datagrams_out: AtomicU64,
    bytes_out: AtomicU64,
    unroutable: AtomicU64,
    socket_errors: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Counts one in `c`; nothing to return.
fn bump_none<T>(c: &AtomicU64) -> Option<T> {
    bump(c, 1);
    None
}

/// The members of one job: member indices `first..first + sources` are its sources
/// `first_src..first_src + sources`.
#[derive(Clone, Copy, Debug)]
struct JobMembers {
    first: u32,
    first_src: u8,
    sources: u8,
}

impl JobMembers {
    /// The member index of `src_id`, if it is one of the job's sources.
    fn member(&self, src_id: u8) -> Option<u32> {
        let k = src_id.checked_sub(self.first_src)?;
        (k < self.sources).then(|| self.first + u32::from(k))
    }
}

/// Per job id: its members, if the job is configured here.
fn job_members(specs: &[JobSpec]) -> [Option<JobMembers>; 256] {
    let mut jobs = [None; 256];
    let mut first = 0u32;
    for j in specs {
        jobs[usize::from(j.job_id)] = Some(JobMembers {
            first,
            first_src: j.first_src,
            sources: j.sources,
        });
        first += u32::from(j.sources);
    }
    jobs
}

/// Where members are: fixed in size by the configuration.
struct Peers {
    /// Per member: the address it last sent from (a datagram the front end took: a Join, a
    /// datagram without a run, or one of a run from the address it joined from; not another
    /// control message, which only the engine reads, to drop it).
    addrs: Vec<Option<SocketAddr>>,
    /// Per member: the address its last Join to this server instance came from (`None`:
    /// it has not joined here). Its datagrams of a run count from that address alone (see
    /// the module docs, *Runs across restarts*).
    joined: Vec<Option<SocketAddr>>,
    /// Per member: the nonce of its last Join to this server instance. A Join naming a run
    /// (a rejoin: the worker's address changed while it ran, e.g. a NAT rebinding) counts
    /// only with this nonce, which the worker's process alone knows.
    nonces: Vec<Option<u32>>,
    /// Per job id: the distinct addresses of its members (the fan-out list).
    fanout: Vec<Vec<SocketAddr>>,
}

impl Peers {
    /// Makes job `job`'s fan-out list (id `job_id`) from its members' addresses again.
    fn refan(&mut self, job_id: u8, job: JobMembers) {
        let members = job.first as usize..(job.first + u32::from(job.sources)) as usize;
        let mut list: Vec<SocketAddr> = self.addrs[members].iter().flatten().copied().collect();
        list.sort_unstable();
        list.dedup();
        self.fanout[usize::from(job_id)] = list;
    }
}

/// What the front end makes of a datagram of a configured job ([`Shared::admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// Member `i`'s: for the engine, on its port.
    Member(u32),
    /// From a source outside its job: for the engine to drop, on [`STRANGER_PORT`].
    Stranger,
    /// A member's datagram of a run, from an address that has not joined this server as
    /// that member: answered Superseded (run 0) and counted in [`ServeStats::not_joined`].
    NotJoined,
}

/// A member's datagram as [`Shared::admit`] weighs it against what the front end knows of
/// the member ([`Peers`]).
#[derive(Clone, Copy, Debug)]
struct Ask {
    /// The member.
    i: u32,
    job_id: u8,
    src_id: u8,
    job: JobMembers,
    from: SocketAddr,
    /// A Join: `from` becomes the member's joined address.
    join: bool,
    /// A Join naming the run its worker joined before (from another address): taken only
    /// with the nonce the member last joined with ([`Peers::nonces`]).
    rejoin: bool,
    /// The Join's nonce.
    nonce: u32,
    /// Gradients or a request for a kept Result (not a control message).
    data: bool,
    /// Gradients of a run (or a request for a kept Result of one): taken from the member's
    /// joined address alone.
    of_run: bool,
    /// The sender is remembered as the member's address. Control messages other than a
    /// Join (no sender sends them: the engine drops them as `bad_control`) are injected, but
    /// their sender is not remembered, so a forged one cannot redirect the member's Results.
    remember: bool,
}

/// What [`Shared::admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// For the engine, on the member's port.
    Admit,
    /// Not from the member's joined address: answered Superseded (run 0).
    Refuse,
}

impl Ask {
    /// The datagram `hdr` from `from`, if its job is configured here and its source is one
    /// of the job's (`None`: a stranger's).
    fn of(
        jobs: &[Option<JobMembers>; 256],
        from: SocketAddr,
        hdr: &TrioMlHdrFields,
    ) -> Option<Ask> {
        let job = jobs[usize::from(hdr.job_id)]?;
        let i = job.member(hdr.src_id)?;
        let join = is_join(hdr);
        Some(Ask {
            i,
            job_id: hdr.job_id,
            src_id: hdr.src_id,
            job,
            from,
            join,
            rejoin: join && hdr.run_id != 0,
            nonce: hdr.block_id,
            data: !hdr.ctl,
            of_run: !hdr.ctl && hdr.run_id != 0,
            remember: join || !hdr.ctl,
        })
    }

    /// Refused: a datagram of a run from another address than the member joined this
    /// instance from; once the member joined, any of its data from another address, with or
    /// without a run (a client of the paper's header alone must not take a joined member's
    /// place and its Results); a rejoin without the member's nonce.
    fn refused(&self, p: &Peers) -> bool {
        let k = self.i as usize;
        let joined = p.joined[k];
        if self.rejoin {
            return p.nonces[k] != Some(self.nonce);
        }
        self.data && (self.of_run || joined.is_some()) && joined != Some(self.from)
    }

    /// The verdict under the read lock, when nothing need be written (`None`: the sender
    /// must be remembered, under the write lock: [`Ask::remember`]).
    fn settled(&self, p: &Peers) -> Option<Verdict> {
        let k = self.i as usize;
        if self.refused(p) {
            return Some(Verdict::Refuse);
        }
        let known = p.addrs[k] == Some(self.from)
            && (!self.join || p.joined[k] == Some(self.from) && p.nonces[k] == Some(self.nonce));
        (!self.remember || known).then_some(Verdict::Admit)
    }

    /// The verdict under the write lock, the sender remembered if admitted. Decided again:
    /// the peers may have changed since [`Ask::settled`] read them (a `forget_members`
    /// between the two would otherwise let the datagram in from an address forgotten).
    fn remember(&self, p: &mut Peers, counters: &Counters) -> Verdict {
        if self.refused(p) {
            return Verdict::Refuse;
        }
        let k = self.i as usize;
        if self.join {
            p.joined[k] = Some(self.from);
            p.nonces[k] = Some(self.nonce);
        }
        if p.addrs[k]
            .replace(self.from)
            .is_some_and(|a| a != self.from)
        {
            bump(&counters.readdressed, 1);
        }
        p.refan(self.job_id, self.job);
        Verdict::Admit
    }
}

/// Whether `hdr` is a Join (a control message without gradients; the engine refuses any
/// other as `bad_control`).
fn is_join(hdr: &TrioMlHdrFields) -> bool {
    hdr.grad_cnt == 0 && matches!(Control::of(hdr), Some(Control::Join { .. }))
}

/// The payload of the front end's answer to a member's datagram from an address that has
/// not joined this server as that member ([`Admission::NotJoined`]): Superseded, naming
/// run 0 (this server has no run of the job for that sender). The answer to a refused
/// rejoin carries the rejoin's nonce in its `block_id` (0 otherwise), so that the worker
/// tells it from the answers to its gradients.
fn not_joined_answer(job_id: u8, src_id: u8, nonce: u32) -> [u8; TRIO_ML_HDR_LEN] {
    let mut b = [0u8; TRIO_ML_HDR_LEN];
    TrioMlHdrFields {
        block_id: nonce,
        ..Control::Superseded { run_id: 0 }.header(job_id, src_id)
    }
    .write(&mut TrioMlHdr::new_unchecked(&mut b[..]));
    b
}

/// State shared by the receive loop and the egress sink (PPE threads).
struct Shared {
    socket: UdpSocket,
    /// GSO for the socket's sends (off for good after the kernel refused a GSO message).
    gso: Gso,
    /// GRO is on for the socket.
    gro: bool,
    /// Per job id: its members, if the job is configured here (fixed).
    jobs: [Option<JobMembers>; 256],
    peers: RwLock<Peers>,
    counters: Counters,
    upstream: Option<SocketAddr>,
    /// This server's source id in the job above.
    upstream_src: u8,
    /// Per job id: this server's run at the upstream aggregator (a first-level server).
    up_runs: Mutex<Vec<UpstreamRun>>,
    /// The server is stopping.
    stopping: AtomicBool,
    /// Results sent up whose answer has not come (a first-level server).
    awaited: Mutex<Awaited>,
    /// [`ServeConfig::stop_upstream_wait`].
    stop_upstream_wait: Duration,
}

/// What a stopping first-level server waits for: the upstream aggregator's answers to the
/// Results it sent up while stopping, or in the [`ServeConfig::stop_upstream_wait`] before
/// (an answer to a Result sent up just before the stop comes after it).
#[derive(Debug, Default)]
struct Awaited {
    /// Each Result's job, block and generation, which its answer has too, and when it went
    /// up. At most [`MAX_AWAITED`]: past that, those older than the stop's wait go.
    results: std::collections::HashMap<(u8, u32, u16), Instant>,
    /// When the last of them went up.
    last_sent: Option<Instant>,
    /// When the set, full, was last rid of the entries older than the stop's wait: at most
    /// every quarter of the wait, so that a full set of young entries (an upstream
    /// aggregator that answers nothing) costs no scan per Result.
    pruned: Option<Instant>,
}

/// Results a first-level server holds per job while its Join upstream is unanswered: one
/// window of the paper's `block_cnt_max` (4095 blocks); more are dropped, counted in
/// [`ServeStats::results_held_over`].
pub const MAX_HELD_RESULTS: usize = 4095;

/// Results sent up whose answers a first-level server keeps track of at most: 16 windows
/// of the paper's `block_cnt_max`. Answers normally come within a block timeout above; the
/// entries of those that never come (lost datagrams) give way once older than the stop's
/// wait, so the set does not grow with what the server receives.
const MAX_AWAITED: usize = 16 * 4095;

/// How often a first-level server sends an unanswered Join upstream again.
const UPSTREAM_JOIN_RESEND: Duration = Duration::from_millis(100);

/// Messages the receive loop takes per system call at most (each a datagram, or with GRO
/// several of one sender).
const RECV_BATCH: usize = 32;

/// One job's run at the upstream aggregator, as a first-level server keeps it (see the
/// module docs, *Runs in a tree*).
#[derive(Debug, Default)]
struct UpstreamRun {
    /// The job's run here, as the last Joined leaving the engine gave it (0: no member has
    /// joined, or old clients that speak the paper's header alone).
    local: u8,
    /// The run the upstream aggregator gave this server for `local` (0: not joined there).
    up: u8,
    /// The nonce of a Join sent upstream and not answered yet, and when it was last sent.
    pending: Option<(u32, Instant)>,
    /// The nonce of the Join that joined run `local` above: a Join after a Superseded goes
    /// with it, so that the job above takes it for this source joining its current run, not
    /// for a restart (a late Superseded, of a run above left since, must not start another).
    nonce: u32,
    /// Results of run `local` waiting for that answer.
    held: Vec<Vec<u8>>,
}

/// Sets the run id in the Trio-ML header at the start of `payload`.
fn set_run_id(payload: &mut [u8], run_id: u8) {
    TrioMlHdr::new_unchecked(&mut payload[..TRIO_ML_HDR_LEN]).set_run_id(run_id);
}

impl Shared {
    /// The state of a server set up as `cfg` sending on `socket` (GRO on for it: `gro`),
    /// no member known yet.
    fn new(socket: UdpSocket, cfg: &ServeConfig, gro: bool) -> Shared {
        let members = cfg.setup.sources();
        Shared {
            gso: Gso::probe(&socket, cfg.gso),
            gro,
            socket,
            jobs: job_members(&cfg.setup.jobs),
            peers: RwLock::new(Peers {
                addrs: vec![None; members],
                joined: vec![None; members],
                nonces: vec![None; members],
                fanout: vec![Vec::new(); 256],
            }),
            counters: Counters::default(),
            upstream: cfg.upstream,
            upstream_src: cfg.upstream_src,
            up_runs: Mutex::new((0..256).map(|_| UpstreamRun::default()).collect()),
            stopping: AtomicBool::new(false),
            awaited: Mutex::new(Awaited::default()),
            stop_upstream_wait: cfg.stop_upstream_wait,
        }
    }

    /// Sends the datagrams collected in `out` (a burst leaving the engine, or what one
    /// receive produced) and counts them.
    fn flush(&self, out: &SendBatch<'_>) {
        if out.is_empty() {
            return;
        }
        let r = out.send(&self.socket, &self.gso);
        let c = &self.counters;
        bump(&c.datagrams_out, r.datagrams);
        bump(&c.bytes_out, r.bytes);
        bump(&c.socket_errors, r.failed);
        bump(&c.send_calls, r.calls);
        bump(&c.gso_refused, r.gso_refused);
    }

    /// `payload` to every member of job `job_id`.
    fn fan_out<'f>(&self, job_id: u8, payload: &'f [u8], out: &mut SendBatch<'f>) {
        let peers = self.peers.read();
        let list = &peers.fanout[usize::from(job_id)];
        if list.is_empty() {
            return bump(&self.counters.unroutable, 1);
        }
        for &to in list {
            out.push(Some(to), payload);
        }
    }

    /// A Result of this first-level server's job goes up as one source of the job above, in
    /// the run the upstream aggregator gave it; held while that run is being joined, and not
    /// sent at all if it belongs to a run the job here has left.
    fn send_upstream(
        &self,
        hdr: &TrioMlHdrFields,
        payload: &[u8],
        up: SocketAddr,
        out: &mut SendBatch<'_>,
    ) {
        let mut runs = self.up_runs.lock();
        let run = &mut runs[usize::from(hdr.job_id)];
        if hdr.run_id != run.local {
            return bump(&self.counters.results_of_left_runs, 1);
        }
        if run.pending.is_some() {
            if run.held.len() >= MAX_HELD_RESULTS {
                return bump(&self.counters.results_held_over, 1);
            }
            return run.held.push(payload.to_vec());
        }
        let up_run = run.up;
        drop(runs);
        self.sent_up(hdr);
        set_run_id(out.push_copy(Some(up), payload), up_run);
    }

    /// A Result goes up: its answer is awaited, so that a stop waits for it if it went up
    /// during the stop's wait before.
    fn sent_up(&self, hdr: &TrioMlHdrFields) {
        let now = Instant::now();
        let mut a = self.awaited.lock();
        let wait = self.stop_upstream_wait;
        let due = a.pruned.is_none_or(|t| now.duration_since(t) >= wait / 4);
        if a.results.len() >= MAX_AWAITED && due {
            a.results.retain(|_, sent| now.duration_since(*sent) < wait);
            a.pruned = Some(now);
        }
        if a.results.len() < MAX_AWAITED {
            a.results
                .insert((hdr.job_id, hdr.block_id, hdr.gen_id), now);
        }
        a.last_sent = Some(now);
    }

    /// The stop begins: of the Results sent up, those sent longer than the stop's wait ago
    /// are no longer awaited (their answers were lost).
    fn forget_old_awaited(&self) {
        let wait = self.stop_upstream_wait;
        let mut a = self.awaited.lock();
        a.results.retain(|_, sent| sent.elapsed() < wait);
    }

    /// Results owed to the members that the upstream aggregator has yet to answer: sent up
    /// while stopping, or held for a Join upstream.
    fn unanswered_upstream(&self) -> u64 {
        let held: usize = self.up_runs.lock().iter().map(|r| r.held.len()).sum();
        (self.awaited.lock().results.len() + held) as u64
    }

    /// A member joined run `run_id` of job `job_id` here: when that is a new run, this server
    /// joins a new run of the job above too, so the upstream aggregator never answers the
    /// new run's Results with the last run's.
    fn local_run(&self, job_id: u8, run_id: u8, up: SocketAddr, out: &mut SendBatch<'_>) {
        let mut runs = self.up_runs.lock();
        let run = &mut runs[usize::from(job_id)];
        if run.local == run_id {
            return;
        }
        // The held Results belong to the run just left.
        bump(&self.counters.results_of_left_runs, run.held.len() as u64);
        let nonce = random_nonce();
        *run = UpstreamRun {
            local: run_id,
            up: 0,
            pending: Some((nonce, Instant::now())),
            nonce,
            held: Vec::new(),
        };
        drop(runs);
        bump(&self.counters.upstream_joins_sent, 1);
        out.push_copy(Some(up), &upstream_join(job_id, self.upstream_src, nonce));
    }

    /// Job `job_id` was added or removed here (the control plane): its next run joins a new
    /// run above even if the job's run id here repeats the last one's (a job added again
    /// starts from run 1), and the Results held for the run it left go.
    fn forget_upstream_run(&self, job_id: u8) {
        let mut runs = self.up_runs.lock();
        let run = &mut runs[usize::from(job_id)];
        bump(&self.counters.results_of_left_runs, run.held.len() as u64);
        *run = UpstreamRun::default();
    }

    /// Sends again the Joins upstream that are still unanswered after
    /// [`UPSTREAM_JOIN_RESEND`] (datagrams get lost).
    fn resend_upstream_joins(&self, up: SocketAddr) {
        let mut out = SendBatch::new();
        for (job_id, run) in self.up_runs.lock().iter_mut().enumerate() {
            if let Some((nonce, sent)) = &mut run.pending {
                if sent.elapsed() >= UPSTREAM_JOIN_RESEND {
                    *sent = Instant::now();
                    bump(&self.counters.upstream_joins_sent, 1);
                    out.push_copy(
                        Some(up),
                        &upstream_join(job_id as u8, self.upstream_src, *nonce),
                    );
                }
            }
        }
        self.flush(&out);
    }

    /// A datagram from the upstream aggregator: a run-protocol answer, or a Result of the job
    /// above for the local members, in this job's run here.
    fn on_upstream_datagram(
        &self,
        hdr: &TrioMlHdrFields,
        payload: &[u8],
        up: SocketAddr,
        out: &mut SendBatch<'_>,
    ) {
        let c = &self.counters;
        let mut runs = self.up_runs.lock();
        let run = &mut runs[usize::from(hdr.job_id)];
        match Control::of(hdr) {
            Some(Control::Joined { run_id, nonce }) => {
                bump(&c.upstream_control_in, 1);
                if run.pending.is_some_and(|(n, _)| n == nonce) {
                    run.pending = None;
                    run.up = run_id;
                    let held = std::mem::take(&mut run.held);
                    drop(runs);
                    for r in held {
                        self.sent_up(&TrioMlHdrFields::read(&TrioMlHdr::new_unchecked(&r[..])));
                        set_run_id(out.push_copy(Some(up), &r), run_id);
                    }
                }
            }
            // The job above left the run this server is in (the upper aggregator restarted,
            // or another of its sources started a new run): the Result that was answered so
            // is lost up there, and so would be every later one. Join the job's run there
            // again, and hold the Results meanwhile; the members' retransmissions bring the
            // lost ones up again. A Superseded naming run 0 says the same of an upstream
            // aggregator that restarted (this server has not joined it). A Superseded naming
            // the run this server is in answers a Result of a run it has already left:
            // nothing to do.
            Some(Control::Superseded { run_id }) => {
                bump(&c.upstream_control_in, 1);
                if run.pending.is_none() && run.up != 0 && run_id != run.up {
                    bump(&c.upstream_superseded, 1);
                    let nonce = run.nonce;
                    run.pending = Some((nonce, Instant::now()));
                    run.up = 0;
                    drop(runs);
                    bump(&c.upstream_joins_sent, 1);
                    out.push_copy(
                        Some(up),
                        &upstream_join(hdr.job_id, self.upstream_src, nonce),
                    );
                }
            }
            Some(Control::Join { .. }) => bump(&c.upstream_control_in, 1),
            None if hdr.ctl || hdr.run_id != run.up => bump(&c.upstream_stale_in, 1),
            None => {
                let local = run.local;
                drop(runs);
                bump(&c.upstream_results_in, 1);
                let key = (hdr.job_id, hdr.block_id, hdr.gen_id);
                self.awaited.lock().results.remove(&key);
                let peers = self.peers.read();
                let mut list = peers.fanout[usize::from(hdr.job_id)].iter();
                // One copy with this level's run, sent to every member.
                let Some(&first) = list.next() else {
                    return bump(&c.unroutable, 1);
                };
                set_run_id(out.push_copy(Some(first), payload), local);
                for &to in list {
                    out.push_last_again(Some(to));
                }
            }
        }
    }

    /// A frame leaving the engine on `port`: its payload goes into `out` for the members
    /// (or the upstream aggregator) it is for.
    fn egress<'f>(&self, port: Port, frame: &'f [u8], out: &mut SendBatch<'f>) {
        bump(&self.counters.results, 1);
        let Ok((hdr, grads)) = wire::parse(frame) else {
            bump(&self.counters.unroutable, 1);
            return;
        };
        let payload = &frame[TRIO_ML_HDR_AT..GRADS_AT + grads.len()];
        if port == STRANGER_PORT {
            // An answer to a datagram from a source outside its job (whose sender is not
            // remembered): nobody to send it to, and never the job's members.
            return bump(&self.counters.unroutable, 1);
        }
        if let Some(up) = self.upstream {
            if !hdr.ctl {
                return self.send_upstream(&hdr, payload, up, out);
            }
            if let Some(Control::Joined { run_id, .. }) = Control::of(&hdr) {
                self.local_run(hdr.job_id, run_id, up, out);
            }
        }
        if port >= PEER_PORT_BASE {
            let to = self
                .peers
                .read()
                .addrs
                .get(usize::from(port - PEER_PORT_BASE))
                .copied()
                .flatten();
            match to {
                Some(to) => out.push(Some(to), payload),
                None => bump(&self.counters.unroutable, 1),
            }
        } else {
            self.fan_out(hdr.job_id, payload, out);
        }
    }

    /// What becomes of a datagram of job `hdr.job_id` (configured here) from `from`: a
    /// member's is admitted and its sender remembered, unless it is of a run (gradients with
    /// a `run_id`) and `from` has not joined this server as that member, when it is answered
    /// Superseded with run 0 (into `out`) and neither injected nor remembered. A Join makes
    /// `from` the member's joined address. (See the module docs, *Runs across restarts*.)
    ///
    /// Decided under the read lock when nothing need change ([`Ask::settled`]), else under
    /// the write lock ([`Ask::remember`]), which decides again.
    fn admit(&self, from: SocketAddr, hdr: &TrioMlHdrFields, out: &mut SendBatch<'_>) -> Admission {
        let Some(ask) = Ask::of(&self.jobs, from, hdr) else {
            return Admission::Stranger;
        };
        let settled = ask.settled(&self.peers.read());
        let verdict =
            settled.unwrap_or_else(|| ask.remember(&mut self.peers.write(), &self.counters));
        self.verdict(&ask, verdict, out)
    }

    /// What [`Shared::admit`] decided for `ask`: a member's datagram for the engine, or,
    /// refused, the answer Superseded (run 0) into `out`, counted.
    fn verdict(&self, ask: &Ask, verdict: Verdict, out: &mut SendBatch<'_>) -> Admission {
        match verdict {
            Verdict::Admit => Admission::Member(ask.i),
            Verdict::Refuse => {
                bump(&self.counters.not_joined, 1);
                let nonce = if ask.rejoin { ask.nonce } else { 0 };
                let answer = not_joined_answer(ask.job_id, ask.src_id, nonce);
                out.push_copy(Some(ask.from), &answer);
                Admission::NotJoined
            }
        }
    }

    /// Job `job_id` was added or removed through the control plane (the hook runs after the
    /// change): its next run joins a new run above, and, once removed, its members' joins
    /// and addresses are forgotten. Only once removed: the workers may join the job as soon
    /// as it is added, before this hook runs, and a Join the new job answered meanwhile,
    /// forgotten, would leave its worker refused as not joined.
    fn job_changed(&self, trio: &TrioMl, job_id: u8) {
        self.forget_upstream_run(job_id);
        if !trio.jobs().contains(&job_id) {
            self.forget_members(job_id);
        }
    }

    /// Job `job_id` was removed here (the control plane): its members have joined nothing of
    /// the job any more (the engine forgot their joins with the job), so their addresses are
    /// forgotten too, until they join again (or send without a run).
    fn forget_members(&self, job_id: u8) {
        let Some(job) = self.jobs[usize::from(job_id)] else {
            return;
        };
        let mut p = self.peers.write();
        for k in job.first as usize..(job.first + u32::from(job.sources)) as usize {
            p.addrs[k] = None;
            p.joined[k] = None;
            p.nonces[k] = None;
        }
        p.refan(job_id, job);
    }

    /// Receives what is queued on the socket into `rx` (waiting up to the read timeout) and
    /// counts the call; `false` when nothing came.
    fn receive(&self, rx: &mut RecvBatch) -> bool {
        let c = &self.counters;
        match rx.recv(&self.socket) {
            Ok(_) => {
                bump(&c.recv_calls, 1);
                c.kernel_dropped
                    .store(rx.kernel_dropped(), Ordering::Relaxed);
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                false
            }
            Err(_) => {
                // E.g. an ICMP port unreachable reported for an earlier send.
                bump(&c.socket_errors, 1);
                false
            }
        }
    }

    /// One datagram from `from`, counted: dropped if it is no aggregation packet or of a
    /// job not configured here, handled if it is the upstream aggregator's (into `out`);
    /// otherwise its header: a member's (or a stranger's) datagram for the engine.
    fn take_datagram<'p>(
        &self,
        payload: &'p [u8],
        truncated: bool,
        from: SocketAddr,
        out: &mut SendBatch<'p>,
    ) -> Option<TrioMlHdrFields> {
        let c = &self.counters;
        bump(&c.datagrams_in, 1);
        bump(&c.bytes_in, payload.len() as u64);
        let hdr = match datagram_header(payload) {
            // Cut short by the buffer: whatever its header says, not all of it is here.
            Ok(_) if truncated => return bump_none(&c.dropped_bad_length),
            Ok(h) => h,
            Err(DatagramError::Short) => return bump_none(&c.dropped_short),
            Err(DatagramError::BadLength) => return bump_none(&c.dropped_bad_length),
        };
        if let Some(up) = self.upstream.filter(|&up| up == from) {
            self.on_upstream_datagram(&hdr, payload, up, out);
            return None;
        }
        if self.jobs[usize::from(hdr.job_id)].is_none() {
            return bump_none(&c.dropped_unknown_job);
        }
        Some(hdr)
    }

    /// The receive loop while the server stops (see the module docs, *Stopping*): the
    /// upstream aggregator's datagrams are handled as ever, members' are counted in
    /// `dropped_stopping`. Runs until `engine_stopped`, then, for a first-level server,
    /// until every Result it owes its members has been answered from above, or `wait` has
    /// passed since the engine stopped and since the last Result went up.
    fn receive_while_stopping(
        &self,
        rx: &mut RecvBatch,
        engine_stopped: &AtomicBool,
        wait: Duration,
    ) {
        let c = &self.counters;
        let mut stopped_at = None;
        self.forget_old_awaited();
        loop {
            if let Some(up) = self.upstream {
                self.resend_upstream_joins(up);
            }
            if engine_stopped.load(Ordering::Acquire) {
                let at = *stopped_at.get_or_insert_with(Instant::now);
                let owed = self.unanswered_upstream();
                let last = self.awaited.lock().last_sent.map_or(at, |t| t.max(at));
                if owed == 0 || last.elapsed() >= wait {
                    c.upstream_unanswered.store(owed, Ordering::Relaxed);
                    return;
                }
            }
            if !self.receive(rx) {
                continue;
            }
            let mut out = SendBatch::new();
            for d in rx.datagrams() {
                let Some(from) = d.from else {
                    bump(&c.socket_errors, 1);
                    continue;
                };
                if self
                    .take_datagram(d.payload, d.truncated, from, &mut out)
                    .is_some()
                {
                    bump(&c.dropped_stopping, 1);
                }
            }
            self.flush(&out);
        }
    }

    fn stats(&self) -> ServeStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // The drop count the datagrams carried, and those dropped since the last one.
        let seen = l(&c.kernel_dropped);
        let kernel_dropped = udp_batch::socket_drops(&self.socket)
            .map_or(seen, |now| seen + u64::from(now.wrapping_sub(seen as u32)));
        ServeStats {
            kernel_dropped,
            datagrams_in: l(&c.datagrams_in),
            bytes_in: l(&c.bytes_in),
            injected: l(&c.injected),
            dropped_short: l(&c.dropped_short),
            dropped_bad_length: l(&c.dropped_bad_length),
            dropped_unknown_job: l(&c.dropped_unknown_job),
            strangers: l(&c.strangers),
            not_injected: l(&c.not_injected),
            dropped_stopping: l(&c.dropped_stopping),
            not_joined: l(&c.not_joined),
            upstream_unanswered: l(&c.upstream_unanswered),
            upstream_results_in: l(&c.upstream_results_in),
            upstream_control_in: l(&c.upstream_control_in),
            upstream_joins_sent: l(&c.upstream_joins_sent),
            upstream_superseded: l(&c.upstream_superseded),
            upstream_stale_in: l(&c.upstream_stale_in),
            results_of_left_runs: l(&c.results_of_left_runs),
            results_held_over: l(&c.results_held_over),
            results: l(&c.results),
            datagrams_out: l(&c.datagrams_out),
            bytes_out: l(&c.bytes_out),
            unroutable: l(&c.unroutable),
            socket_errors: l(&c.socket_errors),
            peers: self.peers.read().addrs.iter().flatten().count() as u64,
            readdressed: l(&c.readdressed),
            recv_calls: l(&c.recv_calls),
            send_calls: l(&c.send_calls),
            gro: self.gro,
            gso: self.gso.is_on(),
            gso_refused: l(&c.gso_refused),
            recv_buffer_bytes: socket2::SockRef::from(&self.socket)
                .recv_buffer_size()
                .unwrap_or(0) as u64,
        }
    }
}

struct UdpSink(Arc<Shared>);

impl Sink for UdpSink {
    /// The burst's datagrams leave together: one `sendmmsg`, a member's Results as one GSO
    /// message.
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        let mut out = SendBatch::new();
        for f in frames.iter() {
            self.0.egress(port, f, &mut out);
        }
        self.0.flush(&out);
    }
}

/// The synthetic IPv4 source address of peer `index` (see the module docs).
pub fn peer_ip(index: u32) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        1u8.wrapping_add((index >> 16) as u8),
        (index >> 8) as u8,
        index as u8,
    )
}

/// Why a datagram is not an aggregation packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatagramError {
    /// Shorter than the Trio-ML header.
    Short,
    /// The length is not the header plus `grad_cnt` gradients.
    BadLength,
}

/// Reads the Trio-ML header of a datagram and checks its length.
pub fn datagram_header(payload: &[u8]) -> Result<TrioMlHdrFields, DatagramError> {
    let hdr = TrioMlHdr::new_checked(payload).map_err(|_| DatagramError::Short)?;
    let fields = TrioMlHdrFields::read(&hdr);
    if payload.len() != TRIO_ML_HDR_LEN + usize::from(fields.grad_cnt) * GRAD_BYTES {
        return Err(DatagramError::BadLength);
    }
    Ok(fields)
}

/// Wraps a datagram's payload (Trio-ML header and gradients) into an Ethernet/IPv4/UDP frame
/// with addresses `ep`, replacing the contents of `frame`; returns the header.
pub fn frame_of(
    payload: &[u8],
    ep: &Endpoints,
    frame: &mut Vec<u8>,
) -> Result<TrioMlHdrFields, DatagramError> {
    let hdr = datagram_header(payload)?;
    frame.clear();
    frame.extend_from_slice(&frame_header(payload.len(), ep));
    frame.extend_from_slice(payload);
    Ok(hdr)
}

/// The Ethernet, IPv4 and UDP headers that go before a datagram's payload of `payload_len`
/// bytes (Trio-ML header and gradients) in a frame with addresses `ep`.
fn frame_header(payload_len: usize, ep: &Endpoints) -> [u8; TRIO_ML_HDR_AT] {
    let mut headers = [0u8; TRIO_ML_HDR_AT];
    wire::write_l2_to_l4(&mut headers, ep, payload_len);
    headers
}

/// The frames of one receive, for the engine, each as its ingress port, the Ethernet, IPv4
/// and UDP headers the server puts before a datagram, and the datagram's payload where the
/// receive left it: the engine's ingress copy joins the two ([`crate::pfe::FrameBytes`]).
type FrameBurst<'p> = Vec<(Port, [u8; TRIO_ML_HDR_AT], &'p [u8])>;

/// When [`Server::run`] returns.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunLimits {
    /// After this long.
    pub duration: Option<Duration>,
    /// After this long without a datagram (once one has arrived).
    pub idle_exit: Option<Duration>,
}

/// What a server did.
#[derive(Clone, Debug, Serialize)]
pub struct ServeReport {
    /// Seconds it ran.
    pub elapsed_s: f64,
    /// The front end's counters.
    pub front_end: ServeStats,
    /// The engine's counters.
    pub engine: Stats,
    /// Blocks still open (waiting for sources) when the server was asked to stop; it waited
    /// for them to time out and send their partial Results before stopping the engine.
    pub open_blocks_at_stop: u64,
    /// Of those, blocks still open when the engine stopped (their sources get no Result): 0
    /// unless a timeout scan could not keep up, or the jobs have no block timeout
    /// ([`AggregationSetup::block_exp_ms`] 0: a block missing a source at the stop is left
    /// open).
    pub open_blocks_left: u64,
    /// What the operator should know: e.g. blocks refused because a job's slots were full.
    pub warnings: Vec<String>,
    /// What the trace wrote, when [`ServeConfig::trace`] asked for one.
    pub trace: Option<TraceSummary>,
}

/// The warning for `n` blocks refused as `block_cnt_max` (a job's slots full), naming the
/// option that raises the limit.
pub fn slots_full_warning(n: u64, slots: u16) -> String {
    format!(
        "{n} packets dropped as block_cnt_max: a job had all its {slots} block slots in use \
         (clients with more blocks in flight than half of them, or block ids that are never \
         completed); raise --block-cnt-max (at most 4095) or lower the clients' window"
    )
}

/// The warning for `n` packets dropped as `block_grad_max`: more gradients than the
/// server's `grad_max` per packet. Their workers get no answer (the protocol has none for
/// it), so only the server can say why.
pub fn grad_max_warning(n: u64, grad_max: u16) -> String {
    format!(
        "{n} packets dropped as block_grad_max: they carried more than --block-grad-max \
         {grad_max} gradients, and their workers get no answer; give the workers \
         --grads-per-packet {grad_max} at most, or raise --block-grad-max (at most {})",
        wire::MAX_GRAD_CNT
    )
}

/// Logs packets the engine refuses for the server's limits while it runs (blocks refused as
/// `block_cnt_max`, packets too large as `block_grad_max`): at most once a second, to
/// standard error, when a count went up.
#[derive(Default)]
struct LimitsLog {
    checked: Option<Instant>,
    slots_full: u64,
    too_large: u64,
}

impl LimitsLog {
    fn check(&mut self, pfe: &Pfe, slots: u16, grad_max: u16) {
        if self
            .checked
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.checked = Some(Instant::now());
        let stats = pfe.stats();
        let n = stats.drops("block_cnt_max");
        if n > self.slots_full {
            eprintln!("pfemu serve: warning: {}", slots_full_warning(n, slots));
            self.slots_full = n;
        }
        let n = stats.drops("block_grad_max");
        if n > self.too_large {
            eprintln!("pfemu serve: warning: {}", grad_max_warning(n, grad_max));
            self.too_large = n;
        }
    }
}

/// Stops a running [`Server`] from another thread (or a signal handler's thread).
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    /// Asks the server to stop: [`Server::run`] stops injecting within about 50 ms, and
    /// returns once the open blocks finished and, for a first-level server, the answers
    /// from above came (see the module docs, *Stopping*).
    pub fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Reads a running [`Server`]'s counters and its jobs' state ([`Server::monitor`]).
#[derive(Clone)]
pub struct Monitor {
    shared: Arc<Shared>,
    trio: TrioMl,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// The front end's counters so far.
    pub fn stats(&self) -> ServeStats {
        self.shared.stats()
    }

    /// The aggregation program: its jobs' state ([`TrioMl::job_state`]), blocks and tables.
    pub fn trio_ml(&self) -> &TrioMl {
        &self.trio
    }
}

/// A UDP front end to an engine running Trio-ML or FPISA (see the module docs).
pub struct Server {
    socket: UdpSocket,
    pfe: Pfe,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    cfg: ServeConfig,
    trio: TrioMl,
    control: Option<ControlServer>,
    trace: Option<TraceOutput>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("socket", &self.socket)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds the socket, installs the program with the jobs and starts the engine.
    pub fn bind(cfg: &ServeConfig) -> Result<Server, ServeError> {
        let members = cfg.setup.sources();
        let max_members = usize::from(u16::MAX - PEER_PORT_BASE) + 1;
        if members > max_members {
            return Err(ServeError::Config {
                setting: "jobs",
                reason: format!(
                    "{members} sources over all jobs; at most {max_members} (one ingress port each)"
                ),
            });
        }
        let upstream_is_self = |listen: SocketAddr| ServeError::Config {
            setting: "upstream",
            reason: format!(
                "{} is this server's own address (--listen {listen}): its Joins and Results \
                 would come back to itself; give the upper aggregator's address",
                cfg.upstream.map_or(String::new(), |u| u.to_string())
            ),
        };
        if cfg.upstream == Some(cfg.listen) {
            return Err(upstream_is_self(cfg.listen));
        }
        check_recv_buffer(cfg.recv_buffer_bytes)?;
        let eng = |e: &dyn fmt::Display| ServeError::Engine(e.to_string());
        let mem = Arc::new(SharedMemory::new(&cfg.setup.mem_config()).map_err(|e| eng(&e))?);
        let out_src_addr = Ipv4Addr::new(10, 0, 0, cfg.upstream_src);
        let trio = cfg.setup.install(&mem, out_src_addr)?;
        // The runs may repeat the last instance's: its workers are kept out by the front
        // end, which takes datagrams of a run only from members that joined this instance
        // (see the module docs, *Runs across restarts*).
        for j in &cfg.setup.jobs {
            let run = cfg
                .first_run
                .unwrap_or_else(|| (random_nonce() % u32::from(wire::MAX_RUN_ID)) as u8 + 1);
            trio.start_runs_at(j.job_id, run).map_err(|e| match e {
                TrioMlError::Config(c) => ServeError::Config {
                    setting: "first_run",
                    reason: c.reason,
                },
                e => eng(&e),
            })?;
        }
        let socket =
            bind_udp(cfg.listen, cfg.recv_buffer_bytes).map_err(io_err("binding --listen"))?;
        // Port 0, or the unspecified address, names this socket only once it is bound.
        if let (Some(up), Ok(bound)) = (cfg.upstream, socket.local_addr()) {
            let this_host = up.ip().is_loopback() || up.ip().is_unspecified();
            let same_ip = up.ip() == bound.ip() || (bound.ip().is_unspecified() && this_host);
            if up.port() == bound.port() && same_ip {
                return Err(upstream_is_self(bound));
            }
        }
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(io_err("setting the socket's read timeout"))?;
        // Best effort: without it, `kernel_dropped` stays 0.
        udp_batch::enable_drop_count(&socket);
        let gro = cfg.gro && udp_batch::enable_gro(&socket);
        let shared = Arc::new(Shared::new(
            socket
                .try_clone()
                .map_err(io_err("cloning the socket for the sink"))?,
            cfg,
            gro,
        ));
        let mut builder = Pfe::builder();
        if let Some(clock) = &cfg.clock {
            builder = builder.clock(clock.clone());
        }
        let (builder, trace) = crate::lab::trace::attach(cfg.trace.as_ref(), builder)?;
        let mut pfe = builder
            .program(trio.program())
            .ppe_threads(cfg.ppe_threads)
            .memory(mem)
            .ports(usize::from(PEER_PORT_BASE) + members)
            .max_frame_bytes(HEADERS_LEN + MAX_PAYLOAD)
            .timers(trio.timer_specs().map_err(|e| eng(&e))?)
            .sink(Arc::new(UdpSink(shared.clone())))
            // A refused setting (`ppe_threads`) stays named.
            .build()?;
        pfe.start().map_err(|e| eng(&e))?;
        let control = match &cfg.control {
            Some(addr) => {
                // A job added here is set up as the server's own jobs are, and starts its
                // runs afresh: it joins a new run above too, whatever its run id here.
                let setup = cfg.setup.clone();
                let up = shared.clone();
                let members = shared.jobs;
                let jobs = JobsTarget::new(trio.clone())
                    .template(move |job_id| setup.job_config(job_id, out_src_addr))
                    .on_change({
                        let trio = trio.clone();
                        move |job_id| up.job_changed(&trio, job_id)
                    })
                    .check_add(move |job| servable(&members, job));
                let targets: Vec<Arc<dyn Target>> = vec![Arc::new(jobs)];
                Some(
                    ControlServer::start(addr, Controller::new(pfe.control(), targets))
                        .map_err(io_err("starting the control plane (--control)"))?,
                )
            }
            None => None,
        };
        Ok(Server {
            socket,
            pfe,
            shared,
            stop: Arc::new(AtomicBool::new(false)),
            cfg: cfg.clone(),
            trio,
            control,
            trace,
        })
    }

    /// The address the server listens on (with the port the system chose for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        self.socket
            .local_addr()
            .map_err(io_err("reading the socket's address"))
    }

    /// The address the control plane listens on, when [`ServeConfig::control`] was given.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control.as_ref().map(ControlServer::addr)
    }

    /// A handle that stops [`Server::run`].
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop.clone())
    }

    /// The installed aggregation program (its jobs' state, FPISA event counters).
    pub fn trio_ml(&self) -> &TrioMl {
        &self.trio
    }

    /// The front end's counters so far.
    pub fn stats(&self) -> ServeStats {
        self.shared.stats()
    }

    /// A handle that reads the server's counters and the program's state while
    /// [`Server::run`] runs (from another thread).
    pub fn monitor(&self) -> Monitor {
        Monitor {
            shared: self.shared.clone(),
            trio: self.trio.clone(),
        }
    }

    /// Receives datagrams and injects them until stopped or a limit is reached, then shuts
    /// the engine down and reports.
    ///
    /// Each turn takes what is queued on the socket with one system call ([`RecvBatch`]),
    /// injects the frames of the members' datagrams together, and sends what the upstream
    /// aggregator's datagrams produce (fanned-out Results, Joins) together.
    pub fn run(mut self, limits: RunLimits) -> ServeReport {
        let start = Instant::now();
        let mut last = None::<Instant>;
        let mut rx = RecvBatch::new(RECV_BATCH);
        let c = &self.shared.counters;
        let slots = self.cfg.setup.slots();
        let grad_max = self.cfg.setup.block_grad_max;
        let mut refused = LimitsLog::default();
        if self.cfg.log_warnings {
            let granted = self.shared.stats().recv_buffer_bytes;
            if let Some(w) = recv_buffer_warning(self.cfg.recv_buffer_bytes, granted) {
                eprintln!("pfemu serve: warning: {w}");
            }
        }
        loop {
            if self.cfg.log_warnings {
                refused.check(&self.pfe, slots, grad_max);
            }
            if let Some(up) = self.shared.upstream {
                self.shared.resend_upstream_joins(up);
            }
            if self.stop.load(Ordering::Acquire)
                || limits.duration.is_some_and(|d| start.elapsed() >= d)
                || matches!((limits.idle_exit, last), (Some(d), Some(t)) if t.elapsed() >= d)
            {
                break;
            }
            if !self.shared.receive(&mut rx) {
                continue;
            }
            last = Some(Instant::now());
            let mut burst = FrameBurst::with_capacity(RECV_BATCH);
            let mut out = SendBatch::new();
            for d in rx.datagrams() {
                let Some(from) = d.from else {
                    // Not an IPv4 or IPv6 sender: a failed receive, not a datagram.
                    bump(&c.socket_errors, 1);
                    continue;
                };
                self.on_datagram(d.payload, d.truncated, from, &mut burst, &mut out);
            }
            self.inject(&burst);
            self.shared.flush(&out);
        }
        // Stopping: the socket is still read while the open blocks finish (members'
        // datagrams are counted, not injected; the upstream aggregator's answers are fanned
        // out), and a first-level server then waits for the answers to what it sent up.
        self.shared.stopping.store(true, Ordering::Release);
        let engine_stopped = Arc::new(AtomicBool::new(false));
        // Set when the engine has stopped, or when this thread unwinds before that: the
        // reader must not outlive the stop on a socket nobody will read from.
        struct SetOnDrop(Arc<AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let stopped_guard = SetOnDrop(engine_stopped.clone());
        let reader = {
            let (shared, stopped) = (self.shared.clone(), engine_stopped.clone());
            let wait = self.cfg.stop_upstream_wait;
            std::thread::spawn(move || shared.receive_while_stopping(&mut rx, &stopped, wait))
        };
        let open_blocks_at_stop = self.open_blocks();
        // The open blocks time out and send their partial Results (a starved timer scan
        // ages them slower than the clock: the patience counts scans, not time). Without a
        // block timeout they never do: only the blocks finishing meanwhile are waited for.
        let timeout = self.cfg.setup.block_timeout().unwrap_or_default();
        let patience = 2 * timeout + Duration::from_millis(500);
        let open_blocks_left = self
            .trio
            .finish_open_blocks(&self.pfe, patience)
            .unwrap_or(open_blocks_at_stop);
        // Nothing changes the engine through the control plane once it stops.
        drop(self.control.take());
        let trace_output = self.trace.take();
        let engine = self.pfe.shutdown();
        drop(stopped_guard);
        if let Err(panic) = reader.join() {
            std::panic::resume_unwind(panic);
        }
        let front_end = self.shared.stats();
        let mut warnings = Vec::new();
        warnings.extend(recv_buffer_warning(
            self.cfg.recv_buffer_bytes,
            front_end.recv_buffer_bytes,
        ));
        if front_end.kernel_dropped > 0 {
            warnings.push(kernel_dropped_warning(
                front_end.kernel_dropped,
                front_end.recv_buffer_bytes,
            ));
        }
        let full = engine.drops("block_cnt_max");
        if full > 0 {
            warnings.push(slots_full_warning(full, slots));
        }
        let too_large = engine.drops("block_grad_max");
        if too_large > 0 {
            warnings.push(grad_max_warning(too_large, grad_max));
        }
        let trace = trace_output.and_then(|t| match t.finish() {
            Ok(summary) => Some(summary),
            Err(e) => {
                warnings.push(format!("writing the trace failed: {e}"));
                None
            }
        });
        ServeReport {
            elapsed_s: start.elapsed().as_secs_f64(),
            front_end,
            engine,
            open_blocks_at_stop,
            open_blocks_left,
            warnings,
            trace,
        }
    }

    /// Blocks being aggregated (not kept Results), over all jobs.
    fn open_blocks(&self) -> u64 {
        self.trio.active_blocks().map_or(0, |b| b.len() as u64)
    }

    /// Injects the frames of `burst`, a dispatch batch at a time (so that an engine that
    /// stopped refuses whole batches, each counted once).
    fn inject(&self, burst: &FrameBurst<'_>) {
        let c = &self.shared.counters;
        for chunk in burst.chunks(DEFAULT_BATCH_SIZE) {
            let frames =
                (chunk.iter()).map(|(port, headers, payload)| (*port, (&headers[..], *payload)));
            match self.pfe.inject_burst(frames) {
                Ok(n) => bump(&c.injected, n),
                Err(_) => bump(&c.not_injected, chunk.len() as u64),
            }
        }
    }

    /// One datagram from `from`: dropped and counted, handled as the upstream aggregator's,
    /// or framed into `burst` for the engine.
    fn on_datagram<'p>(
        &self,
        payload: &'p [u8],
        truncated: bool,
        from: SocketAddr,
        burst: &mut FrameBurst<'p>,
        out: &mut SendBatch<'p>,
    ) {
        let c = &self.shared.counters;
        let Some(hdr) = self.shared.take_datagram(payload, truncated, from, out) else {
            return;
        };
        let (port, src_addr, src_mac) = match self.shared.admit(from, &hdr, out) {
            // Member indices are below the ports the engine has (checked in `bind`).
            Admission::Member(i) => (
                PEER_PORT_BASE + i as u16,
                peer_ip(i),
                [0x02, 0x01, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8],
            ),
            Admission::NotJoined => return,
            Admission::Stranger => {
                bump(&c.strangers, 1);
                (
                    STRANGER_PORT,
                    STRANGER_IP,
                    [0x02, 0x01, 0xff, 0xff, 0xff, 0xfe],
                )
            }
        };
        let t = self.trio.config();
        let ep = Endpoints {
            src_mac,
            dst_mac: t.local_mac,
            src_addr,
            dst_addr: t.local_addr,
            src_port: from.port(),
            dst_port: t.udp_port,
        };
        burst.push((port, frame_header(payload.len(), &ep), payload));
    }
}

/// Whether a job added through the control plane can be served: the front end's members
/// (the jobs' sources, each with its ingress port) are fixed when the server starts, so a
/// job added must be one of the jobs it started with, with sources among theirs. Anything
/// else would be aggregated by the engine but never reached by its sources' datagrams.
fn servable(members: &[Option<JobMembers>; 256], job: &JobConfig) -> Result<(), String> {
    let j = job.job_id;
    let Some(m) = members[usize::from(j)] else {
        return Err(format!(
            "pfemu serve fixes its jobs and their sources when it starts (--job, \
             --jobs-file): job {j} is not one of them, so its datagrams would be dropped as \
             an unknown job; restart the server with --job {j}:N"
        ));
    };
    if let Some(&s) = job.sources.iter().find(|&&s| m.member(s).is_none()) {
        let (first, end) = (m.first_src, u16::from(m.first_src) + u16::from(m.sources));
        return Err(format!(
            "pfemu serve fixes its jobs and their sources when it starts (--job, \
             --jobs-file): source {s} is not among job {j}'s sources {first}..{end}, so its \
             datagrams would never reach the job; restart the server with the sources in \
             --job"
        ));
    }
    Ok(())
}

/// How a client ([`allreduce`]) talks to the server.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The server.
    pub server: SocketAddr,
    /// The local address to bind (port 0: any).
    pub bind: SocketAddr,
    /// Give up when no Result arrived for this long.
    pub give_up_after: Duration,
    /// Fault injection: drop every `n`-th packet this worker would send (`None`: none).
    pub drop_every: Option<u64>,
    /// Receive buffer asked of the kernel for the worker's socket, bytes (0: the system's
    /// default). Every member receives every Result of its job: with a window of 32 and
    /// 1024 gradients per packet a window of Results is 128 KiB per job member, and the
    /// default buffer (about 200 KB) overflows, which costs a retransmission timeout per
    /// lost Result.
    pub recv_buffer_bytes: usize,
    /// Join the job's run before sending gradients ([`wire::Control`]), so that a new run
    /// of the job is never answered with an earlier run's kept Results. `false` speaks
    /// the paper's header alone (fine for a single run of the job).
    pub join: bool,
    /// Send a window's packets as GSO messages (`UDP_SEGMENT`) when the kernel has it.
    pub gso: bool,
    /// Ask the kernel to coalesce the server's datagrams (`UDP_GRO`) when it has it.
    pub gro: bool,
}

impl ClientConfig {
    /// A client of `server`, bound to the unspecified address of its family; gives up after
    /// 10 s without progress; no faults; a 4 MiB receive buffer; GSO and GRO where the
    /// kernel has them.
    pub fn new(server: SocketAddr) -> Self {
        let bind = if server.is_ipv4() {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
        } else {
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
        };
        ClientConfig {
            server,
            bind,
            give_up_after: Duration::from_secs(10),
            drop_every: None,
            recv_buffer_bytes: DEFAULT_RECV_BUFFER_BYTES,
            join: true,
            gso: true,
            gro: true,
        }
    }
}

/// What one client's allreduce did.
#[derive(Clone, Debug, Serialize)]
pub struct ClientReport {
    /// Seconds from the first send to the last Result.
    pub elapsed_s: f64,
    /// Gradients in this worker's vector.
    pub gradients: usize,
    /// Goodput: this worker's gradient bits per second, in Gbit/s.
    pub goodput_gbps: f64,
    /// The worker's counters.
    pub stats: WorkerStats,
    /// Packets the fault injector dropped.
    pub dropped_by_injector: u64,
    /// Datagrams received that were not aggregation packets.
    pub bad_datagrams: u64,
    /// The run the worker joined (0: it did not join; see [`ClientConfig::join`]).
    pub run_id: u8,
    /// Joins sent: one, or more when the answer was late or lost (each is answered again,
    /// with the same run: the server's engine counts every one as `join_answered`).
    pub joins_sent: u64,
    /// Times the worker joined its run again, from a new address (the server answered its
    /// gradients Superseded with run 0: its address changed, e.g. a NAT rebinding, and the
    /// server took the rejoin with the worker's nonce).
    pub rejoins: u64,
    /// Datagrams received from the server.
    pub datagrams_in: u64,
    /// Receive system calls that returned datagrams.
    pub recv_calls: u64,
    /// Send system calls.
    pub send_calls: u64,
    /// GRO was on for the worker's socket.
    pub gro: bool,
    /// GSO was in use at the end (asked for, the kernel has it, and never refused it).
    pub gso: bool,
}

/// Runs `worker`'s allreduce through the server: sends what [`Worker::poll`] gives (UDP
/// payloads only), feeds each datagram back (wrapped into a frame), retransmits as the
/// worker's config says, until every Result has arrived. Gives up with
/// [`ServeError::NoProgress`] after [`ClientConfig::give_up_after`] without progress,
/// saying whether anything answered at all.
///
/// What one poll gives leaves with one system call (a window's packets as GSO messages
/// where the kernel has it), and each receive takes every Result queued.
pub fn allreduce(cfg: &ClientConfig, worker: &mut Worker) -> Result<ClientReport, ServeError> {
    check_recv_buffer(cfg.recv_buffer_bytes)?;
    let socket =
        bind_udp(cfg.bind, cfg.recv_buffer_bytes).map_err(io_err("binding the worker's socket"))?;
    socket
        .connect(cfg.server)
        .map_err(io_err("connecting to --server"))?;
    let tick = worker
        .config()
        .retransmit_after_ns
        .map_or(Duration::from_millis(5), |ns| {
            Duration::from_nanos(ns / 4).clamp(Duration::from_micros(200), Duration::from_millis(5))
        });
    socket
        .set_read_timeout(Some(tick))
        .map_err(io_err("setting the worker's read timeout"))?;
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut out = Payloads::new();
    let mut rx = ClientRx::new(socket, tick, cfg);
    let mut sent = 0u64;
    let mut dropped = 0u64;
    let nonce = if cfg.join {
        Some(join(cfg, &mut rx, worker)?.1)
    } else {
        None
    };
    let mut rejoins = 0u64;
    let mut last_progress = Instant::now();
    while !worker.is_done() {
        out.clear();
        worker.poll_payloads(now(), &mut out);
        let mut batch = SendBatch::new();
        for p in out.iter() {
            sent += 1;
            if cfg
                .drop_every
                .is_some_and(|n| n > 0 && sent.is_multiple_of(n))
            {
                dropped += 1;
                continue;
            }
            batch.push(None, p);
        }
        // Failures (e.g. the server not up yet) are recovered by retransmission.
        rx.send(&batch);
        drop(batch);
        let superseded = rx.recv(|p| match worker.on_payload_at(p, now()) {
            Ok(Received::Result { .. } | Received::Lost { .. }) => {
                last_progress = Instant::now();
                Ok(true)
            }
            Ok(Received::Ignored) => Ok(true),
            Err(e @ HostError::Superseded { .. }) => Err(e),
            Err(_) => Ok(false),
        });
        match (superseded, nonce) {
            (Ok(()), _) => {}
            // No run here for this address: it changed since the Join (a NAT rebinding), or
            // the server is another instance. The server takes a rejoin with this nonce only
            // if this process joined it, so the run goes on only with the same server.
            (
                Err(HostError::Superseded {
                    run_id, current: 0, ..
                }),
                Some(nonce),
            ) => {
                rejoin(cfg, &mut rx, worker, nonce, run_id, &now)?;
                rejoins += 1;
            }
            (Err(e), _) => return Err(e.into()),
        }
        if last_progress.elapsed() > cfg.give_up_after {
            return Err(rx.no_progress(cfg, worker, false));
        }
    }
    let elapsed_s = worker
        .finished_ns()
        .map_or(start.elapsed().as_secs_f64(), |ns| ns as f64 / 1e9);
    let gradients = worker.sums().len();
    Ok(ClientReport {
        elapsed_s,
        gradients,
        goodput_gbps: (gradients * 32) as f64 / elapsed_s.max(1e-9) / 1e9,
        stats: worker.stats(),
        dropped_by_injector: dropped,
        bad_datagrams: rx.bad,
        run_id: worker.run_id(),
        joins_sent: rx.joins_sent,
        rejoins,
        datagrams_in: rx.datagrams,
        recv_calls: rx.recv_calls,
        send_calls: rx.send_calls,
        gro: rx.gro,
        gso: rx.gso.is_on(),
    })
}

/// A client's socket (connected to the server) and what came back on it.
struct ClientRx {
    socket: UdpSocket,
    /// The socket's read timeout, and the pause after a failed receive.
    tick: Duration,
    batch: RecvBatch,
    gso: Gso,
    gro: bool,
    /// Datagrams received.
    datagrams: u64,
    /// Receives refused (ICMP port unreachable: nothing listens at the server's address).
    refused: u64,
    /// Datagrams that were not aggregation packets, or that the worker refused.
    bad: u64,
    /// Joins sent.
    joins_sent: u64,
    recv_calls: u64,
    send_calls: u64,
}

/// Messages a client takes per receive at most: a window of Results, with GRO a few
/// messages.
const CLIENT_RECV_BATCH: usize = 16;

impl ClientRx {
    fn new(socket: UdpSocket, tick: Duration, cfg: &ClientConfig) -> Self {
        let gro = cfg.gro && udp_batch::enable_gro(&socket);
        ClientRx {
            gso: Gso::probe(&socket, cfg.gso),
            gro,
            socket,
            tick,
            batch: RecvBatch::new(CLIENT_RECV_BATCH),
            datagrams: 0,
            refused: 0,
            bad: 0,
            joins_sent: 0,
            recv_calls: 0,
            send_calls: 0,
        }
    }

    /// Sends `batch` to the server; failures are left to retransmission.
    fn send(&mut self, batch: &SendBatch<'_>) {
        self.send_calls += batch.send(&self.socket, &self.gso).calls;
    }

    /// Sends the Join `join` (a whole frame) when none went yet or the last went `tick *
    /// 20` ago (`sent_at`, moved on when it goes). Errors (e.g. the server not up yet) are
    /// recovered by sending again.
    fn send_join_when_due(&mut self, join: &[u8], sent_at: &mut Option<Instant>) {
        if sent_at.is_none_or(|t| t.elapsed() >= self.tick * 20) {
            let mut batch = SendBatch::new();
            batch.push(None, &join[TRIO_ML_HDR_AT..]);
            self.send(&batch);
            self.joins_sent += 1;
            *sent_at = Some(Instant::now());
        }
    }

    /// Receives what the server sent within the read timeout and gives each datagram's
    /// payload to `take`, which says whether it was an aggregation packet the worker took
    /// (`false`: counted as bad) or stops with an error. After a failed receive other than
    /// the timeout (connection refused while nothing listens yet, and the like: the caller
    /// keeps trying) it pauses for `tick`.
    fn recv<E>(&mut self, mut take: impl FnMut(&[u8]) -> Result<bool, E>) -> Result<(), E> {
        match self.batch.recv(&self.socket) {
            Ok(_) => self.recv_calls += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(())
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::ConnectionRefused {
                    self.refused += 1;
                }
                std::thread::sleep(self.tick);
                return Ok(());
            }
        }
        for d in self.batch.datagrams() {
            self.datagrams += 1;
            if d.truncated || !take(d.payload)? {
                self.bad += 1;
            }
        }
        Ok(())
    }

    /// The error of a client that waited `cfg.give_up_after` without progress.
    fn no_progress(&self, cfg: &ClientConfig, worker: &Worker, joining: bool) -> ServeError {
        ServeError::NoProgress(NoProgress {
            server: cfg.server,
            job_id: worker.config().job_id,
            src_id: worker.config().src_id,
            joining,
            waited: cfg.give_up_after,
            datagrams: self.datagrams,
            refused: self.refused,
            missing: worker.missing(),
            grads_per_packet: worker.config().grads_per_packet,
        })
    }
}

/// Joins `worker`'s job's run through `rx`'s socket: sends a Join with a fresh random nonce
/// every `tick * 20` until the server answers it, or gives up after `cfg.give_up_after`.
fn join(
    cfg: &ClientConfig,
    rx: &mut ClientRx,
    worker: &mut Worker,
) -> Result<(u8, u32), ServeError> {
    let nonce = random_nonce();
    let join = worker.join_frame(nonce);
    let ep = worker.config().endpoints;
    let start = Instant::now();
    let mut sent_at: Option<Instant> = None;
    let mut frame = Vec::new();
    loop {
        rx.send_join_when_due(&join, &mut sent_at);
        let mut run = None;
        // Datagrams after the Joined (none that matter yet: the worker has sent nothing
        // else) are left.
        let _ = rx.recv::<std::convert::Infallible>(|p| {
            if frame_of(p, &ep, &mut frame).is_err() {
                return Ok(false);
            }
            if run.is_none() {
                run = worker.take_joined(&frame, nonce);
            }
            Ok(true)
        });
        if let Some(run) = run {
            return Ok((run, nonce));
        }
        if start.elapsed() > cfg.give_up_after {
            return Err(rx.no_progress(cfg, worker, true));
        }
    }
}

/// Joins run `run` of `worker`'s job again, with the `nonce` it joined with, from the
/// socket's address now: a Join naming the run, sent every `tick * 20` until the server
/// answers it. Joined with that run: the worker goes on (its refused chunks are sent again
/// when overdue). Joined with another run (the job moved on meanwhile), or refused (a
/// Superseded naming run 0 and carrying the nonce: the server has no Join of this process,
/// e.g. it restarted since): [`HostError::Superseded`]. Results that arrive meanwhile are
/// taken.
fn rejoin(
    cfg: &ClientConfig,
    rx: &mut ClientRx,
    worker: &mut Worker,
    nonce: u32,
    run: u8,
    now: &dyn Fn() -> u64,
) -> Result<(), ServeError> {
    let mut join = worker.join_frame(nonce);
    set_run_id(&mut join[TRIO_ML_HDR_AT..], run);
    let (job_id, src_id) = (worker.config().job_id, worker.config().src_id);
    let superseded = |worker: &Worker, current: u8| {
        ServeError::from(HostError::Superseded {
            job_id,
            run_id: run,
            current,
            missing: worker.missing(),
        })
    };
    let start = Instant::now();
    let mut sent_at: Option<Instant> = None;
    loop {
        rx.send_join_when_due(&join, &mut sent_at);
        let mut answer = None;
        let _ = rx.recv::<std::convert::Infallible>(|p| {
            let Ok(hdr) = datagram_header(p) else {
                return Ok(false);
            };
            let mine = hdr.job_id == job_id && hdr.src_id == src_id;
            match Control::of(&hdr) {
                Some(Control::Joined { run_id, nonce: n }) if mine && n == nonce => {
                    answer.get_or_insert(run_id);
                }
                Some(Control::Superseded { run_id: 0 }) if mine && hdr.block_id == nonce => {
                    answer.get_or_insert(0);
                }
                // Results, and the answers to gradients sent before the rejoin.
                _ => {
                    let _ = worker.on_payload_at(p, now());
                }
            }
            Ok(true)
        });
        match answer {
            Some(r) if r == run => return Ok(()),
            Some(current) => return Err(superseded(worker, current)),
            None if start.elapsed() > cfg.give_up_after => {
                return Err(rx.no_progress(cfg, worker, true))
            }
            None => {}
        }
    }
}

/// The payload of a Join of job `job_id` from source `src_id` (a first-level server joining
/// the job above).
fn upstream_join(job_id: u8, src_id: u8, nonce: u32) -> Vec<u8> {
    let ep = Endpoints {
        src_mac: [0; 6],
        dst_mac: [0; 6],
        src_addr: Ipv4Addr::UNSPECIFIED,
        dst_addr: Ipv4Addr::UNSPECIFIED,
        src_port: 0,
        dst_port: 0,
    };
    wire::join_packet(ep, job_id, src_id, nonce)[TRIO_ML_HDR_AT..].to_vec()
}

/// A nonce that differs between processes and calls: std's randomly keyed hasher over the
/// time, the process id and a counter.
fn random_nonce() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() as u32
}

/// A worker configuration for the UDP client: job, source, gradients per packet, window,
/// and retransmission (`None`: never).
pub fn worker_config(
    job_id: u8,
    src_id: u8,
    grads_per_packet: usize,
    window: usize,
    retransmit_after: Option<Duration>,
) -> WorkerConfig {
    WorkerConfig {
        grads_per_packet,
        window,
        // Saturating: a timeout past 584 years is never, not a wrapped short one.
        retransmit_after_ns: retransmit_after
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        ..WorkerConfig::new(job_id, src_id, TrioMlConfig::default().local_addr)
    }
}

fn rng_of(seed: u64, src: u8) -> SplitMix64 {
    SplitMix64::new(mix(
        seed ^ (u64::from(src) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    ))
}

/// Source `src`'s vector of `n` integers for `seed`, each in `-2^20..2^20` (so sums of up to
/// 255 sources fit an `i32`).
pub fn seeded_ints(seed: u64, src: u8, n: usize) -> Vec<i32> {
    let mut r = rng_of(seed, src);
    (0..n)
        .map(|_| r.below(1 << 21) as i32 - (1 << 20))
        .collect()
}

/// Source `src`'s vector of `n` integer-valued floats for `seed`, each in `-1024..=1024`
/// (so FP32 sums of up to 255 sources are exact).
pub fn seeded_floats(seed: u64, src: u8, n: usize) -> Vec<f32> {
    let mut r = rng_of(seed, src);
    (0..n).map(|_| r.below(2049) as f32 - 1024.0).collect()
}

/// The exact sums of [`seeded_ints`] over `sources`.
pub fn expected_int_sums(seed: u64, sources: &[u8], n: usize) -> Vec<i32> {
    let mut sum = vec![0i32; n];
    for &s in sources {
        for (a, v) in sum.iter_mut().zip(seeded_ints(seed, s, n)) {
            *a = a.wrapping_add(v);
        }
    }
    sum
}

/// The exact sums of [`seeded_floats`] over `sources`.
pub fn expected_float_sums(seed: u64, sources: &[u8], n: usize) -> Vec<f32> {
    let mut sum = vec![0f32; n];
    for &s in sources {
        for (a, v) in sum.iter_mut().zip(seeded_floats(seed, s, n)) {
            *a += v;
        }
    }
    sum
}

/// The lane type a server aggregates, which its workers must send: `pfemu serve --program
/// trio-ml` takes 32-bit integers, `--program fpisa` (or `fpisa-approx`) FP32 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum LaneType {
    /// Trio-ML: 32-bit two's-complement integers.
    Int32,
    /// FPISA: FP32 values.
    Fp32,
}

impl fmt::Display for LaneType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LaneType::Int32 => "32-bit integers (Trio-ML)",
            LaneType::Fp32 => "FP32 values (FPISA)",
        })
    }
}

/// How a worker's sums compare with the exact sums of the seeded vectors
/// ([`check_seeded_sums`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SeededCheck {
    /// Gradients compared: those of the chunks every source contributed to (neither
    /// degraded nor with fewer sources).
    pub compared: usize,
    /// Of those, sums that differ from the expected ones.
    pub mismatches: usize,
    /// Set when sums differ and every compared one is what a server aggregating this other
    /// lane type returns for the same packets: the worker and the server run different
    /// programs, and nothing was lost or miscounted.
    pub server_lanes: Option<LaneType>,
}

/// The exact sums of the seeded vectors ([`seeded_ints`] or [`seeded_floats`]) of a set of
/// sources: what a worker's allreduce must return. Made before the allreduce (it draws every
/// source's vector), so that a worker that finishes first does not take the CPU from the
/// others still in theirs; [`ExpectedSums::check`] afterwards only compares.
#[derive(Clone, Debug)]
pub struct ExpectedSums {
    seed: u64,
    sources: Vec<u8>,
    sums: Sums,
}

#[derive(Clone, Debug)]
enum Sums {
    Int32(Vec<i32>),
    Fp32(Vec<f32>),
}

impl ExpectedSums {
    /// The sums of the `n`-gradient vectors `sources` draw for `seed`, of lane type `sent`.
    pub fn new(seed: u64, sources: &[u8], n: usize, sent: LaneType) -> Self {
        let sums = match sent {
            LaneType::Int32 => Sums::Int32(expected_int_sums(seed, sources, n)),
            LaneType::Fp32 => Sums::Fp32(expected_float_sums(seed, sources, n)),
        };
        ExpectedSums {
            seed,
            sources: sources.to_vec(),
            sums,
        }
    }

    /// The lane type the vectors were sent as.
    pub fn lanes(&self) -> LaneType {
        match self.sums {
            Sums::Int32(_) => LaneType::Int32,
            Sums::Fp32(_) => LaneType::Fp32,
        }
    }

    /// Compares `worker`'s sums (after its allreduce) with these, on the chunks every
    /// source contributed to (neither degraded nor with fewer sources). When sums differ, it
    /// also tells a server of the other lane type apart ([`SeededCheck::server_lanes`]):
    /// integers sent to FPISA come back as FPISA's sums of their bits read as FP32 (the
    /// seeded integers are all subnormal, flushed to zero, or NaN there, so both FPISA
    /// variants agree), and floats sent to Trio-ML as the integer sums of their bits.
    ///
    /// # Panics
    /// If the worker's vector is not as long as the one these sums are of.
    pub fn check(&self, worker: &Worker) -> SeededCheck {
        let got = worker.sums();
        let n = got.len();
        let want_n = match &self.sums {
            Sums::Int32(v) => v.len(),
            Sums::Fp32(v) => v.len(),
        };
        assert_eq!(
            n, want_n,
            "the worker's vector and the expected sums differ in length"
        );
        let g = worker.config().grads_per_packet;
        // The gradient ranges of the chunks every source contributed to.
        let sources = self.sources.len();
        let full: Vec<Range<usize>> = (0..n.div_ceil(g.max(1)))
            .filter(|&c| !worker.degraded()[c] && usize::from(worker.src_counts()[c]) == sources)
            .map(|c| c * g..((c + 1) * g).min(n))
            .collect();
        let compared = full.iter().map(|r| r.len()).sum();
        // Lanes of the full chunks where `got` and `want` differ.
        fn differing<A, B>(full: &[Range<usize>], got: &[A], want: &[B]) -> usize
        where
            A: PartialEq<B>,
        {
            let differ = |r: &Range<usize>| {
                let pairs = got[r.clone()].iter().zip(&want[r.clone()]);
                pairs.filter(|(g, w)| *g != *w).count()
            };
            full.iter().map(differ).sum()
        }
        let mismatches = match &self.sums {
            Sums::Int32(want) => differing(&full, got, want),
            // As floats: 0.0 and -0.0 are the same sum.
            Sums::Fp32(want) => differing(&full, &worker.float_sums(), want),
        };
        let server_lanes = (mismatches > 0)
            .then(|| {
                let (seed, src) = (self.seed, &self.sources[..]);
                let (other, lanes) = match self.lanes() {
                    LaneType::Int32 => (fpisa_sums_of_int_bits(seed, src, n), LaneType::Fp32),
                    LaneType::Fp32 => (int_sums_of_float_bits(seed, src, n), LaneType::Int32),
                };
                let bits: Vec<u32> = got.iter().map(|&v| v as u32).collect();
                (differing(&full, &bits, &other) == 0).then_some(lanes)
            })
            .flatten();
        SeededCheck {
            compared,
            mismatches,
            server_lanes,
        }
    }
}

/// Compares `worker`'s sums (after its allreduce) with the exact sums of the vectors
/// [`seeded_ints`] (`sent` [`LaneType::Int32`]) or [`seeded_floats`] ([`LaneType::Fp32`])
/// give `sources` for `seed`: [`ExpectedSums::new`] then [`ExpectedSums::check`]. A
/// worker that measures its allreduce alongside others makes the [`ExpectedSums`] before.
pub fn check_seeded_sums(
    worker: &Worker,
    seed: u64,
    sources: &[u8],
    sent: LaneType,
) -> SeededCheck {
    ExpectedSums::new(seed, sources, worker.sums().len(), sent).check(worker)
}

/// What an FPISA server returns for the [`seeded_ints`] of `sources`: their bits summed as
/// FP32 values (the full variant).
fn fpisa_sums_of_int_bits(seed: u64, sources: &[u8], n: usize) -> Vec<u32> {
    use crate::fpisa::{Acc, Format, Variant};
    let mut acc = vec![Acc::default(); n];
    for &s in sources {
        for (a, v) in acc.iter_mut().zip(seeded_ints(seed, s, n)) {
            a.add_bits(v as u32, Format::Fp32, Variant::Full);
        }
    }
    acc.iter().map(|a| a.value(Format::Fp32)).collect()
}

/// What a Trio-ML server returns for the [`seeded_floats`] of `sources`: the wrapping
/// integer sums of their bits.
fn int_sums_of_float_bits(seed: u64, sources: &[u8], n: usize) -> Vec<u32> {
    let mut sum = vec![0u32; n];
    for &s in sources {
        for (a, v) in sum.iter_mut().zip(seeded_floats(seed, s, n)) {
            *a = a.wrapping_add(v.to_bits());
        }
    }
    sum
}

/// This process's user and system CPU time so far, in seconds, from `/proc/self/stat`
/// (Linux; assumes 100 clock ticks per second). `None` elsewhere.
pub fn process_cpu_times() -> Option<(f64, f64)> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime / 100.0, stime / 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_specs_parse() {
        let j: JobSpec = "1:4".parse().unwrap();
        assert_eq!((j.job_id, j.first_src, j.sources), (1, 0, 4));
        let j: JobSpec = "7:2..4".parse().unwrap();
        assert_eq!((j.job_id, j.first_src, j.sources), (7, 2, 2));
        for bad in ["1", "x:4", "1:0", "1:4..2", "300:1", "1:0..257"] {
            assert!(bad.parse::<JobSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn datagram_frame_round_trip() {
        let mut payload = vec![0u8; TRIO_ML_HDR_LEN + 8];
        TrioMlHdrFields {
            job_id: 3,
            src_id: 1,
            grad_cnt: 2,
            ..Default::default()
        }
        .write(&mut TrioMlHdr::new_unchecked(
            &mut payload[..TRIO_ML_HDR_LEN],
        ));
        payload[TRIO_ML_HDR_LEN..].copy_from_slice(&[0, 0, 0, 5, 0xFF, 0xFF, 0xFF, 0xFE]);
        let ep = WorkerConfig::new(3, 1, Ipv4Addr::LOCALHOST).endpoints;
        let mut f = Vec::new();
        frame_of(&payload, &ep, &mut f).unwrap();
        let (h, g) = wire::parse(&f).unwrap();
        assert_eq!((h.job_id, h.src_id), (3, 1));
        assert_eq!(wire::gradients(g), [5, -2]);
        assert_eq!(&f[TRIO_ML_HDR_AT..], &payload[..]);
        assert_eq!(
            frame_of(&payload[..5], &ep, &mut f),
            Err(DatagramError::Short)
        );
        assert_eq!(
            frame_of(&payload[..14], &ep, &mut f),
            Err(DatagramError::BadLength)
        );
    }

    /// Source 0's worker of `sources`, after an allreduce of its seeded integers whose
    /// Results `result` makes: chunk `c` (its range of gradients) comes back with the
    /// returned sums, source count and degraded flag.
    fn allreduced(
        sources: &[u8],
        n: usize,
        g: usize,
        result: impl Fn(usize, Range<usize>) -> (Vec<i32>, u8, bool),
    ) -> Worker {
        let cfg = worker_config(1, sources[0], g, n.div_ceil(g), None);
        let mut w = Worker::new(cfg, seeded_ints(SEED, sources[0], n)).unwrap();
        let mut out = Payloads::new();
        w.poll_payloads(0, &mut out);
        for (c, p) in out.iter().enumerate() {
            let (mut hdr, _) = wire::parse_payload(p).unwrap();
            let (sums, src_cnt, degraded) = result(c, c * g..((c + 1) * g).min(n));
            (hdr.src_cnt, hdr.degraded) = (src_cnt, degraded);
            let mut back = Vec::new();
            wire::append_payload(&mut back, &hdr, &sums);
            assert_eq!(
                w.on_payload_at(&back, 1).unwrap(),
                Received::Result { chunk: c }
            );
        }
        assert!(w.is_done());
        w
    }
    const SEED: u64 = 11;

    #[test]
    fn expected_sums_count_the_full_chunks_and_their_mismatches() {
        let (sources, n, g) = ([0, 1, 2], 10, 4);
        let want = expected_int_sums(SEED, &sources, n);
        let expected = ExpectedSums::new(SEED, &sources, n, LaneType::Int32);
        let exact = allreduced(&sources, n, g, |_, r| (want[r].to_vec(), 3, false));
        let check = |w: &Worker| expected.check(w);
        assert_eq!(
            check(&exact),
            SeededCheck {
                compared: 10,
                mismatches: 0,
                server_lanes: None
            }
        );
        // Chunk 1 wrong in two lanes; chunk 2 (2 gradients) degraded, chunk 0 short of a
        // source: only chunk 1 is compared.
        let w = allreduced(&sources, n, g, |c, r| {
            let mut sums = want[r].to_vec();
            if c == 1 {
                sums[0] += 1;
                sums[3] -= 7;
            }
            (sums, if c == 0 { 2 } else { 3 }, c == 2)
        });
        assert_eq!(
            check(&w),
            SeededCheck {
                compared: 4,
                mismatches: 2,
                server_lanes: None
            }
        );
        // What an FPISA server returns for these integers: told apart.
        let fpisa = fpisa_sums_of_int_bits(SEED, &sources, n);
        let w = allreduced(&sources, n, g, |_, r| {
            (fpisa[r].iter().map(|&b| b as i32).collect(), 3, false)
        });
        let c = check(&w);
        assert_eq!((c.compared, c.server_lanes), (10, Some(LaneType::Fp32)));
        assert!(c.mismatches > 0);
        // And the free function agrees with the precomputed sums.
        assert_eq!(check_seeded_sums(&w, SEED, &sources, LaneType::Int32), c);
    }

    #[test]
    fn expected_float_sums_compare_as_floats() {
        let (sources, n, g) = ([0, 1], 6, 4);
        let want = expected_float_sums(SEED, &sources, n);
        let expected = ExpectedSums::new(SEED, &sources, n, LaneType::Fp32);
        assert_eq!(expected.lanes(), LaneType::Fp32);
        let bits =
            |r: Range<usize>| -> Vec<i32> { want[r].iter().map(|v| v.to_bits() as i32).collect() };
        let w = allreduced(&sources, n, g, |_, r| (bits(r), 2, false));
        let c = expected.check(&w);
        assert_eq!((c.compared, c.mismatches, c.server_lanes), (6, 0, None));
        // Trio-ML's integer sums of the floats' bits: told apart.
        let ints = int_sums_of_float_bits(SEED, &sources, n);
        let w = allreduced(&sources, n, g, |_, r| {
            (ints[r].iter().map(|&b| b as i32).collect(), 2, false)
        });
        assert_eq!(expected.check(&w).server_lanes, Some(LaneType::Int32));
    }

    #[test]
    fn peer_addresses_are_distinct() {
        assert_eq!(peer_ip(0), Ipv4Addr::new(10, 1, 0, 0));
        assert_eq!(peer_ip(0x1_0203), Ipv4Addr::new(10, 2, 2, 3));
    }

    /// A front end's state for `jobs` (no engine: the datagrams admitted go nowhere) on a
    /// loopback socket, and the program installed with the jobs, as `Server::bind` sets
    /// them up; and job 1 as the control plane adds it.
    fn front_end(jobs: &[&str]) -> (Shared, TrioMl, JobConfig) {
        let setup = AggregationSetup {
            block_cnt_max: Some(128),
            ..AggregationSetup::new(
                crate::lab::aggregation::Aggregation::TrioMl,
                jobs.iter().map(|j| j.parse().unwrap()).collect(),
            )
        };
        let cfg = ServeConfig {
            setup,
            ..ServeConfig::default()
        };
        let mem = Arc::new(SharedMemory::new(&cfg.setup.mem_config()).unwrap());
        let out_src_addr = Ipv4Addr::new(10, 0, 0, 0);
        let trio = cfg.setup.install(&mem, out_src_addr).unwrap();
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let job_1 = JobConfig {
            sources: vec![0, 1],
            ..cfg.setup.job_config(1, out_src_addr)
        };
        (Shared::new(socket, &cfg, false), trio, job_1)
    }

    /// The header of a Join of job 1 from source `src` with `nonce`.
    fn join_of(src: u8, nonce: u32) -> TrioMlHdrFields {
        Control::Join { nonce }.header(1, src)
    }

    /// The header of gradients of job 1's run `run` from source `src`.
    fn grads_of(src: u8, run: u8) -> TrioMlHdrFields {
        TrioMlHdrFields {
            job_id: 1,
            src_id: src,
            run_id: run,
            grad_cnt: 1,
            ..TrioMlHdrFields::default()
        }
    }

    /// The control plane adds a job and then runs its hook: a worker's Join can reach the
    /// job in between (the job answers it Joined). The hook must not forget that Join, or
    /// the worker, told it joined, is refused as not joined. Driven in that order: the job
    /// added, the Join admitted, then the hook; the hook forgets the members only once the
    /// job is removed.
    #[test]
    fn a_join_between_a_jobs_add_and_its_hook_is_kept() {
        let (fe, trio, job_1) = front_end(&["1:2"]);
        let w: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        let mut out = SendBatch::new();
        trio.remove_job(1).unwrap();
        fe.job_changed(&trio, 1);
        // Added again; the worker's Join comes before the hook runs.
        trio.add_job(&job_1).unwrap();
        assert_eq!(fe.admit(w, &join_of(0, 5), &mut out), Admission::Member(0));
        fe.job_changed(&trio, 1);
        assert_eq!(
            fe.admit(w, &grads_of(0, 1), &mut out),
            Admission::Member(0),
            "the Join answered before the hook ran was forgotten"
        );
        // Removed: the hook forgets the member's join and address.
        trio.remove_job(1).unwrap();
        fe.job_changed(&trio, 1);
        assert_eq!(fe.admit(w, &grads_of(0, 1), &mut out), Admission::NotJoined);
        assert_eq!(fe.peers.read().fanout[1], Vec::<SocketAddr>::new());
        assert_eq!(fe.counters.not_joined.load(Ordering::Relaxed), 1);
    }

    /// `admit` reads the peers under the read lock and remembers a new sender under the
    /// write lock: a job removed between the two (its members forgotten) must not let a
    /// datagram in on what the removal forgot. Driven in that order: the read, the removal,
    /// the write, for a rejoin from a new address (the worker's address changed) with the
    /// nonce the member joined with, which the removal forgets.
    #[test]
    fn a_job_removed_between_admissions_two_locks_refuses_the_datagram() {
        let (fe, trio, _) = front_end(&["1:2"]);
        let w: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        let mut out = SendBatch::new();
        assert_eq!(fe.admit(w, &join_of(0, 5), &mut out), Admission::Member(0));
        let rebound: SocketAddr = "127.0.0.1:40002".parse().unwrap();
        let rejoin = TrioMlHdrFields {
            run_id: 1,
            ..join_of(0, 5)
        };
        let ask = Ask::of(&fe.jobs, rebound, &rejoin).unwrap();
        assert_eq!(ask.settled(&fe.peers.read()), None, "nothing to write?");
        trio.remove_job(1).unwrap();
        fe.job_changed(&trio, 1);
        assert_eq!(
            ask.remember(&mut fe.peers.write(), &fe.counters),
            Verdict::Refuse,
            "admitted on a nonce the job's removal forgot"
        );
        assert_eq!(fe.peers.read().addrs[0], None);
        // Not removed, the same rejoin is taken.
        let (fe, _, _) = front_end(&["1:2"]);
        assert_eq!(fe.admit(w, &join_of(0, 5), &mut out), Admission::Member(0));
        assert_eq!(fe.admit(rebound, &rejoin, &mut out), Admission::Member(0));
        assert_eq!(fe.peers.read().joined[0], Some(rebound));
    }

    /// A first-level server awaits the answer to every Result it sends up (a stop waits for
    /// those of the last `stop_upstream_wait`), but the set is bounded: past
    /// [`MAX_AWAITED`], the entries older than the wait go, and young ones beyond it are
    /// not kept; an answer clears its entry.
    #[test]
    fn results_awaited_from_above_are_bounded() {
        let hdr = |block_id: u32| TrioMlHdrFields {
            job_id: 1,
            block_id,
            ..TrioMlHdrFields::default()
        };
        let over = MAX_AWAITED as u32 + 10;
        let (fe, _, _) = front_end(&["1:1"]);
        for b in 0..over {
            fe.sent_up(&hdr(b));
        }
        assert_eq!(fe.awaited.lock().results.len(), MAX_AWAITED);
        let answered = datagram_of(&hdr(3));
        let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
        fe.on_upstream_datagram(&hdr(3), &answered, up, &mut SendBatch::new());
        assert!(!fe.awaited.lock().results.contains_key(&(1, 3, 0)));
        // With no wait, the full set is rid of every entry: 10 left of the last ones.
        let (mut fe, _, _) = front_end(&["1:1"]);
        fe.stop_upstream_wait = Duration::ZERO;
        for b in 0..over {
            fe.sent_up(&hdr(b));
        }
        assert_eq!(fe.awaited.lock().results.len(), 10);
    }

    /// A datagram of header `hdr` and its gradients (zeros).
    fn datagram_of(hdr: &TrioMlHdrFields) -> Vec<u8> {
        let mut d = vec![0u8; TRIO_ML_HDR_LEN + usize::from(hdr.grad_cnt) * GRAD_BYTES];
        hdr.write(&mut TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]));
        d
    }
}
