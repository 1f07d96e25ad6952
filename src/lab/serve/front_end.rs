//! The front end's state, shared by the receive loop and the engine's sink (the PPE
//! threads): the members the jobs fix ([`JobMembers`]), the address each member last sent
//! from and joined from ([`Peers`]), the admission of a member's datagram against them
//! ([`Ask`], [`Verdict`], [`Admission`]: the module docs, *Runs across restarts*), a
//! first-level server's runs and Results upstream ([`UpstreamRun`], [`Awaited`]: *Runs in
//! a tree*, *Stopping*), and the sink that sends the frames leaving the engine as datagrams
//! ([`UdpSink`]). All of it in [`Shared`].

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::datagram::set_run_id;
use super::stats::{bump, bump_none, Counters};
use super::{
    datagram_header, random_nonce, DatagramError, ServeConfig, ServeStats, PEER_PORT_BASE,
    STRANGER_PORT,
};
use crate::lab::aggregation::JobSpec;
use crate::lab::udp_batch::{self, Gso, RecvBatch, SendBatch};
use crate::microcode::trio_ml::wire::{
    self, Control, Endpoints, TrioMlHdr, TrioMlHdrFields, GRADS_AT, TRIO_ML_HDR_AT, TRIO_ML_HDR_LEN,
};
use crate::microcode::trio_ml::{JobConfig, TrioMl};
use crate::packet::Port;
use crate::pfe::{Frames, Sink};

/// The members of one job: member indices `first..first + sources` are its sources
/// `first_src..first_src + sources`.
#[derive(Clone, Copy, Debug)]
pub(super) struct JobMembers {
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
pub(super) enum Admission {
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
pub(super) struct Shared {
    socket: UdpSocket,
    /// GSO for the socket's sends (off for good after the kernel refused a GSO message).
    gso: Gso,
    /// GRO is on for the socket.
    gro: bool,
    /// Per job id: its members, if the job is configured here (fixed).
    pub(super) jobs: [Option<JobMembers>; 256],
    peers: RwLock<Peers>,
    pub(super) counters: Counters,
    pub(super) upstream: Option<SocketAddr>,
    /// This server's source id in the job above.
    upstream_src: u8,
    /// Per job id: this server's run at the upstream aggregator (a first-level server).
    up_runs: Mutex<Vec<UpstreamRun>>,
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

impl Shared {
    /// The state of a server set up as `cfg` sending on `socket` (GRO on for it: `gro`),
    /// no member known yet.
    pub(super) fn new(socket: UdpSocket, cfg: &ServeConfig, gro: bool) -> Shared {
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
            awaited: Mutex::new(Awaited::default()),
            stop_upstream_wait: cfg.stop_upstream_wait,
        }
    }

    /// Sends the datagrams collected in `out` (a burst leaving the engine, or what one
    /// receive produced) and counts them.
    pub(super) fn flush(&self, out: &SendBatch<'_>) {
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
    pub(super) fn resend_upstream_joins(&self, up: SocketAddr) {
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
    pub(super) fn admit(
        &self,
        from: SocketAddr,
        hdr: &TrioMlHdrFields,
        out: &mut SendBatch<'_>,
    ) -> Admission {
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
    pub(super) fn job_changed(&self, trio: &TrioMl, job_id: u8) {
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
    pub(super) fn receive(&self, rx: &mut RecvBatch) -> bool {
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
    pub(super) fn take_datagram<'p>(
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
    pub(super) fn receive_while_stopping(
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

    pub(super) fn stats(&self) -> ServeStats {
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

pub(super) struct UdpSink(pub(super) Arc<Shared>);

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

/// Whether a job added through the control plane can be served: the front end's members
/// (the jobs' sources, each with its ingress port) are fixed when the server starts, so a
/// job added must be one of the jobs it started with, with sources among theirs. Anything
/// else would be aggregated by the engine but never reached by its sources' datagrams.
pub(super) fn servable(members: &[Option<JobMembers>; 256], job: &JobConfig) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::aggregation::AggregationSetup;
    use crate::mem::SharedMemory;
    use crate::microcode::trio_ml::wire::GRAD_BYTES;

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
