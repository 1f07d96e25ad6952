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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::lab::aggregation::AggregationSetup;
use crate::lab::control::{ControlServer, Controller, JobsTarget, Target};
use crate::lab::trace::{TraceOutput, TraceSpec, TraceSummary};
use crate::lab::udp_batch::{self, RecvBatch, SendBatch};
use crate::mem::SharedMemory;
use crate::microcode::trio_ml::host::HostError;
use crate::microcode::trio_ml::wire::{
    self, Endpoints, GRAD_BYTES, HEADERS_LEN, MAX_GRAD_CNT, TRIO_ML_HDR_AT, TRIO_ML_HDR_LEN,
};
use crate::microcode::trio_ml::{TrioMl, TrioMlError};
use crate::packet::Port;
use crate::pfe::{Pfe, Stats, DEFAULT_BATCH_SIZE};
use crate::timer::ManualClock;
use crate::ConfigError;

// Named by the module docs alone.
#[cfg(doc)]
use crate::microcode::trio_ml::{host::Worker, wire::Control, TrioMlConfig};

// The server's parts: its counters (`stats`); its state shared with the engine's sink:
// members, admission, upstream runs (`front_end`); datagrams as frames (`datagram`); the
// client (`client`); the seeded vectors clients check their sums with (`seeded`). Their
// public items are re-exported here, so that every path stays `lab::serve::X`.
mod client;
mod datagram;
mod front_end;
mod seeded;
mod stats;

pub use client::{allreduce, worker_config, ClientConfig, ClientReport};
pub use datagram::{datagram_header, frame_of, peer_ip, DatagramError};
pub use front_end::MAX_HELD_RESULTS;
pub use seeded::{
    check_seeded_sums, expected_float_sums, expected_int_sums, seeded_floats, seeded_ints,
    ExpectedSums, LaneType, SeededCheck,
};
pub use stats::ServeStats;

use datagram::frame_header;
use front_end::{servable, Admission, Shared, UdpSink};
use stats::bump;

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

/// Messages the receive loop takes per system call at most (each a datagram, or with GRO
/// several of one sender).
const RECV_BATCH: usize = 32;

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
