//! What the front end counts: [`ServeStats`], the counters a report or a
//! [`Monitor`](super::Monitor) reads, and [`Counters`], the atomics the receive loop and the
//! engine's sink (the PPE threads) count in as datagrams come and go.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[cfg(doc)]
use super::{ServeConfig, ServeReport, MAX_HELD_RESULTS};

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
pub(super) struct Counters {
    /// The kernel's drop count as the last datagram received carried it (with its wraps).
    pub(super) kernel_dropped: AtomicU64,
    pub(super) datagrams_in: AtomicU64,
    pub(super) bytes_in: AtomicU64,
    pub(super) injected: AtomicU64,
    pub(super) dropped_short: AtomicU64,
    pub(super) dropped_bad_length: AtomicU64,
    pub(super) dropped_unknown_job: AtomicU64,
    pub(super) strangers: AtomicU64,
    pub(super) not_injected: AtomicU64,
    pub(super) dropped_stopping: AtomicU64,
    pub(super) not_joined: AtomicU64,
    pub(super) upstream_unanswered: AtomicU64,
    pub(super) readdressed: AtomicU64,
    pub(super) recv_calls: AtomicU64,
    pub(super) send_calls: AtomicU64,
    pub(super) gso_refused: AtomicU64,
    pub(super) upstream_results_in: AtomicU64,
    pub(super) upstream_control_in: AtomicU64,
    pub(super) upstream_joins_sent: AtomicU64,
    pub(super) upstream_superseded: AtomicU64,
    pub(super) upstream_stale_in: AtomicU64,
    pub(super) results_of_left_runs: AtomicU64,
    pub(super) results_held_over: AtomicU64,
    pub(super) results: AtomicU64,
    pub(super) datagrams_out: AtomicU64,
    pub(super) bytes_out: AtomicU64,
    pub(super) unroutable: AtomicU64,
    pub(super) socket_errors: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Counts one in `c`; nothing to return.
pub(super) fn bump_none<T>(c: &AtomicU64) -> Option<T> {
    bump(c, 1);
    None
}
