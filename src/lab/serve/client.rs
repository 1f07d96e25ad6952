//! The client side (`pfemu worker`): [`allreduce`] runs a [`Worker`] over a UDP socket to a
//! [`Server`](super::Server), joining its job's run first and again when its address
//! changed (a rejoin); [`worker_config`] sets a worker up for it.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::datagram::set_run_id;
use super::{
    bind_udp, check_recv_buffer, datagram_header, frame_of, io_err, random_nonce, NoProgress,
    ServeError, DEFAULT_RECV_BUFFER_BYTES,
};
use crate::lab::udp_batch::{self, Gso, RecvBatch, SendBatch};
use crate::microcode::trio_ml::host::{
    HostError, Payloads, Received, Worker, WorkerConfig, WorkerStats,
};
use crate::microcode::trio_ml::wire::{Control, TRIO_ML_HDR_AT};
use crate::microcode::trio_ml::TrioMlConfig;
use crate::timer::{Clock, SystemClock};

#[cfg(doc)]
use crate::microcode::trio_ml::wire;

/// How a client ([`allreduce`]) talks to the server.
#[derive(Clone)]
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
    /// The clock [`ClientConfig::give_up_after`] is counted by (`None`: real time). Only
    /// the client's patience follows it; the worker's retransmissions and the resent
    /// Joins keep real time. A test replaces it to decide when the client gives up.
    pub patience_clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("server", &self.server)
            .field("bind", &self.bind)
            .field("give_up_after", &self.give_up_after)
            .field("drop_every", &self.drop_every)
            .field("recv_buffer_bytes", &self.recv_buffer_bytes)
            .field("join", &self.join)
            .field("gso", &self.gso)
            .field("gro", &self.gro)
            .field(
                "patience_clock",
                &self.patience_clock.as_ref().map(|_| "replaced"),
            )
            .finish()
    }
}

/// How long a client has waited, by its [`ClientConfig::patience_clock`].
struct Patience {
    clock: Arc<dyn Clock>,
    give_up_after_ns: u64,
}

impl Patience {
    fn of(cfg: &ClientConfig) -> Self {
        Patience {
            clock: cfg
                .patience_clock
                .clone()
                .unwrap_or_else(|| Arc::new(SystemClock::new())),
            give_up_after_ns: u64::try_from(cfg.give_up_after.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Now, by the clock.
    fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Whether `give_up_after` has passed since `since` (a [`Patience::now`]).
    fn exhausted(&self, since: u64) -> bool {
        self.now().saturating_sub(since) > self.give_up_after_ns
    }
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
            patience_clock: None,
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
    let patience = Patience::of(cfg);
    let nonce = if cfg.join {
        Some(join(cfg, &patience, &mut rx, worker)?.1)
    } else {
        None
    };
    let mut rejoins = 0u64;
    let mut last_progress = patience.now();
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
                last_progress = patience.now();
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
                rejoin(cfg, &patience, &mut rx, worker, nonce, run_id, &now)?;
                rejoins += 1;
                // The server answered: progress, however long the rejoin took of
                // `give_up_after` (counted from before it, the loop would give up at once).
                last_progress = patience.now();
            }
            (Err(e), _) => return Err(e.into()),
        }
        if patience.exhausted(last_progress) {
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
    patience: &Patience,
    rx: &mut ClientRx,
    worker: &mut Worker,
) -> Result<(u8, u32), ServeError> {
    let nonce = random_nonce();
    let join = worker.join_frame(nonce);
    let ep = worker.config().endpoints;
    let start = patience.now();
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
        if patience.exhausted(start) {
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
    patience: &Patience,
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
    let start = patience.now();
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
            None if patience.exhausted(start) => return Err(rx.no_progress(cfg, worker, true)),
            None => {}
        }
    }
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
