//! `pfemu::lab::serve` and `pfemu serve` / `pfemu worker`: real UDP sockets on loopback.

#![cfg(feature = "lab")]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pfemu::fpisa::Variant;
use pfemu::lab::aggregation::{Aggregation, AggregationSetup, JobSpec};
use pfemu::lab::serve::{
    self, ClientConfig, ClientReport, Monitor, RunLimits, ServeConfig, ServeReport, Server,
    StopHandle,
};
use pfemu::lab::udp_batch::{self, Gso, RecvBatch, SendBatch};
use pfemu::microcode::trio_ml::host::Worker;
use pfemu::microcode::trio_ml::wire::{self, TrioMlHdr, TrioMlHdrFields, TRIO_ML_HDR_LEN};
use pfemu::microcode::trio_ml::NO_BLOCK_TIMEOUT;
use pfemu::pfe::Stats;
use pfemu::timer::ManualClock;

const BIN: &str = env!("CARGO_BIN_EXE_pfemu");

fn job(spec: &str) -> JobSpec {
    spec.parse().unwrap()
}

/// A library server on a thread, on a free loopback port.
fn start(cfg: ServeConfig) -> (SocketAddr, StopHandle, JoinHandle<ServeReport>) {
    let (addr, stop, _, h) = start_monitored(cfg);
    (addr, stop, h)
}

/// [`start`], with a [`Monitor`] of the running server.
fn start_monitored(cfg: ServeConfig) -> (SocketAddr, StopHandle, Monitor, JoinHandle<ServeReport>) {
    let server = Server::bind(&ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..cfg
    })
    .unwrap();
    let addr = server.local_addr().unwrap();
    let stop = server.stop_handle();
    let monitor = server.monitor();
    let h = std::thread::spawn(move || server.run(RUN_LIMITS));
    (addr, stop, monitor, h)
}

/// `POST /targets/jobs/{command}` with `args` to the control server at `control`: the
/// status and the body.
fn jobs_call(control: &str, command: &str, args: serde_json::Value) -> (u16, String) {
    pfemu::lab::control::request(
        control,
        "POST",
        &format!("/targets/jobs/{command}"),
        Some(&args),
    )
    .unwrap()
}

/// [`start`] with the control plane on a free loopback port: the server's address, the
/// control plane's, a stop handle and the server's thread.
fn start_with_control(
    cfg: ServeConfig,
) -> (SocketAddr, String, StopHandle, JoinHandle<ServeReport>) {
    let server = Server::bind(&ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        control: Some("127.0.0.1:0".into()),
        ..cfg
    })
    .unwrap();
    let addr = server.local_addr().unwrap();
    let control = server
        .control_addr()
        .expect("a control address")
        .to_string();
    let stop = server.stop_handle();
    let h = std::thread::spawn(move || server.run(RUN_LIMITS));
    (addr, control, stop, h)
}

/// How long a test's server may run: long enough for any test, so a hung one still ends.
const RUN_LIMITS: RunLimits = RunLimits {
    duration: Some(Duration::from_secs(120)),
    idle_exit: None,
};

/// An aggregation datagram of generation 0: the Trio-ML header and `grads`.
fn datagram(job_id: u8, src_id: u8, block_id: u32, grads: &[i32]) -> Vec<u8> {
    datagram_gen(job_id, src_id, block_id, 0, grads)
}

/// An aggregation datagram: the Trio-ML header and `grads`.
fn datagram_gen(job_id: u8, src_id: u8, block_id: u32, gen_id: u16, grads: &[i32]) -> Vec<u8> {
    let mut d = vec![0u8; TRIO_ML_HDR_LEN + 4 * grads.len()];
    let fields = TrioMlHdrFields {
        job_id,
        block_id,
        age_op: 0,
        final_block: false,
        degraded: false,
        src_id,
        src_cnt: 0,
        gen_id,
        grad_cnt: grads.len() as u16,
        ..Default::default()
    };
    fields.write(&mut TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]));
    for (i, g) in grads.iter().enumerate() {
        let at = TRIO_ML_HDR_LEN + 4 * i;
        d[at..at + 4].copy_from_slice(&g.to_be_bytes());
    }
    d
}

/// Waits (up to a minute) until the server has received `n` datagrams in all; the kernel
/// may drop datagrams when the socket's buffer is full, so senders of exact counts pace
/// themselves with this.
fn wait_received(m: &Monitor, n: u64) {
    let t0 = Instant::now();
    while m.stats().datagrams_in < n {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the server received {} of {n} datagrams: {:?}",
            m.stats().datagrams_in,
            m.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends `d` and waits until the server has it (the count received so far goes up by one).
fn send_paced(s: &UdpSocket, d: &[u8], addr: SocketAddr, m: &Monitor) {
    let before = m.stats().datagrams_in;
    s.send_to(d, addr).unwrap();
    wait_received(m, before + 1);
}

/// Every packet the engine took left, was consumed, dropped, or is still in flight.
fn assert_conserved(e: &Stats) {
    assert_eq!(
        e.packets_in,
        e.packets_out + e.consumed + e.dropped + e.in_flight,
        "{e:?}"
    );
    assert_eq!(
        e.dropped,
        e.dropped_by_reason.values().sum::<u64>(),
        "{:?}",
        e.dropped_by_reason
    );
}

/// Receives one datagram within `wait`, if any.
fn recv_within(s: &UdpSocket, wait: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = vec![0u8; 65_536];
    match s.recv_from(&mut buf) {
        Ok((n, _)) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

fn config(aggregation: Aggregation, jobs: &[&str]) -> ServeConfig {
    config_with(aggregation, jobs, |_| {})
}

/// [`config`], with changes to its aggregation setup.
fn config_with(
    aggregation: Aggregation,
    jobs: &[&str],
    change: impl FnOnce(&mut AggregationSetup),
) -> ServeConfig {
    let mut setup = AggregationSetup {
        // The longest block timeout, for the tests that time blocks out on the system
        // clock; those that check exact sums take timeouts away ([`no_timeouts`]).
        block_exp_ms: 255,
        ..AggregationSetup::new(aggregation, jobs.iter().map(|j| job(j)).collect())
    };
    change(&mut setup);
    ServeConfig {
        setup,
        ppe_threads: 2,
        ..ServeConfig::default()
    }
}

/// `cfg` with its engine on a manual clock nobody moves: no block ever times out, so every
/// Result waits for all its sources however late one comes (a worker thread held up, or a
/// datagram the kernel dropped and retransmitted, on a loaded machine), and the sums are
/// exact at any speed. For the tests that check exact sums, not timeouts.
fn no_timeouts(cfg: ServeConfig) -> ServeConfig {
    ServeConfig {
        clock: Some(Arc::new(ManualClock::new())),
        ..cfg
    }
}

struct Run {
    fpisa: bool,
    job: u8,
    sources: Vec<u8>,
    gradients: usize,
    seed: u64,
    drop_every: Option<u64>,
    retransmit: Option<Duration>,
    /// Join the job's run first (`ClientConfig::join`).
    join: bool,
}

impl Run {
    /// Integer gradients, no packets dropped, a 200 ms retransmission timeout.
    fn ints(job: u8, sources: &[u8], gradients: usize, seed: u64) -> Run {
        Run {
            fpisa: false,
            job,
            sources: sources.to_vec(),
            gradients,
            seed,
            drop_every: None,
            retransmit: Some(Duration::from_millis(200)),
            join: true,
        }
    }
}

/// Runs one worker thread per source through the server at `addr`.
fn run_workers(addr: SocketAddr, r: &Run) -> Vec<(Worker, ClientReport)> {
    run_workers_with(addr, r, |c| c)
}

/// [`run_workers`], each client's configuration changed by `change`.
fn run_workers_with(
    addr: SocketAddr,
    r: &Run,
    change: impl Fn(ClientConfig) -> ClientConfig + Sync,
) -> Vec<(Worker, ClientReport)> {
    let change = &change;
    // The workers start together once every vector is built: a thread that built its
    // vector first would otherwise open the blocks alone, and one started later than the
    // block timeout would be left out (partial Results).
    let ready = &std::sync::Barrier::new(r.sources.len());
    std::thread::scope(|s| {
        let hs: Vec<_> = r
            .sources
            .iter()
            .map(|&src| {
                s.spawn(move || {
                    let wcfg = serve::worker_config(r.job, src, 256, 8, r.retransmit);
                    let mut w = if r.fpisa {
                        Worker::from_f32(wcfg, &serve::seeded_floats(r.seed, src, r.gradients))
                    } else {
                        Worker::new(wcfg, serve::seeded_ints(r.seed, src, r.gradients))
                    }
                    .unwrap();
                    let ccfg = change(ClientConfig {
                        give_up_after: Duration::from_secs(30),
                        drop_every: r.drop_every,
                        join: r.join,
                        ..ClientConfig::new(addr)
                    });
                    ready.wait();
                    let rep = serve::allreduce(&ccfg, &mut w).unwrap();
                    (w, rep)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn check_exact(r: &Run, done: &[(Worker, ClientReport)]) {
    for (w, _) in done {
        assert!(w.degraded().iter().all(|d| !d), "no partial Results");
        assert!(w
            .src_counts()
            .iter()
            .all(|&c| usize::from(c) == r.sources.len()));
        if r.fpisa {
            let want = serve::expected_float_sums(r.seed, &r.sources, r.gradients);
            assert_eq!(w.float_sums(), want);
        } else {
            let want = serve::expected_int_sums(r.seed, &r.sources, r.gradients);
            assert_eq!(w.sums(), want);
        }
    }
}

#[test]
fn four_library_workers_get_exact_integer_sums() {
    let (addr, stop, h) = start(no_timeouts(config(Aggregation::TrioMl, &["1:4"])));
    let r = Run::ints(1, &[0, 1, 2, 3], 50_000, 7);
    let done = run_workers(addr, &r);
    check_exact(&r, &done);
    stop.stop();
    let rep = h.join().unwrap();
    let f = &rep.front_end;
    assert_eq!(f.peers, 4);
    assert!(f.injected >= 4 * 196, "{f:?}");
    assert_eq!(
        f.dropped_short + f.dropped_bad_length + f.dropped_unknown_job,
        0
    );
    assert!(rep.engine.is_conserved());
}

/// What this kernel offers: GRO on a socket, GSO for its sends.
fn kernel_offload() -> (bool, bool) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    (udp_batch::enable_gro(&s), Gso::probe(&s, true).is_on())
}

/// The batched paths with the kernel's offload (where it has it) and with it turned off at
/// both ends: exact sums, every datagram accounted for, the stats saying which was used.
#[test]
fn sums_are_exact_with_and_without_gso_and_gro() {
    let (gro, gso) = kernel_offload();
    for offload in [true, false] {
        let (addr, stop, h) = start(ServeConfig {
            gso: offload,
            gro: offload,
            ..no_timeouts(config(Aggregation::TrioMl, &["1:4"]))
        });
        let r = Run::ints(1, &[0, 1, 2, 3], 30_000, 11);
        let done = run_workers_with(addr, &r, |c| ClientConfig {
            gso: offload,
            gro: offload,
            ..c
        });
        check_exact(&r, &done);
        for (_, rep) in &done {
            assert_eq!(
                (rep.gro, rep.gso),
                (offload && gro, offload && gso),
                "{rep:?}"
            );
            assert!(rep.recv_calls <= rep.datagrams_in, "{rep:?}");
        }
        stop.stop();
        let rep = h.join().unwrap();
        let f = &rep.front_end;
        assert_eq!(
            (f.gro, f.gso, f.gso_refused),
            (offload && gro, offload && gso, 0),
            "{f:?}"
        );
        assert_eq!(f.unaccounted(), 0, "{f:?}");
        // Each block's Result to each of the 4 members, once; a Joined (one per Join, and
        // a Join is sent again when its answer is late) and a kept Result answering a
        // retransmission (when a Result is late) to the one member that asked. How many of
        // those there are depends on the machine's speed, so: every block's Result went
        // out once and was fanned out, and every other frame answered one request.
        let blocks = 30_000u64.div_ceil(256);
        let d = |reason: &str| rep.engine.drops(reason);
        let answers = d("join_answered") + d("retransmit_answered");
        assert_eq!(f.results, blocks + answers, "{f:?} {:?}", rep.engine);
        assert_eq!(f.datagrams_out, 4 * blocks + answers, "{f:?}");
        let joins: u64 = done.iter().map(|(_, c)| c.joins_sent).sum();
        assert!((4..=joins).contains(&d("join_answered")), "{joins}: {f:?}");
        assert!(f.recv_calls > 0 && f.recv_calls <= f.datagrams_in, "{f:?}");
        assert!(f.send_calls > 0 && f.send_calls <= f.datagrams_out, "{f:?}");
        assert_eq!(f.socket_errors, 0, "{f:?}");
        assert!(rep.engine.is_conserved());
    }
}

/// One sender's burst of many datagrams (one GSO message where the kernel has it): with GRO
/// the server takes it whole and cuts it into the datagrams sent; without, the kernel
/// does. Either way each is taken on its own: the valid ones aggregate, a datagram of the
/// same size with a wrong `grad_cnt` and a short last one are dropped and counted.
#[test]
fn a_burst_in_one_message_is_taken_datagram_by_datagram() {
    for gro in [true, false] {
        let (addr, stop, m, h) = start_monitored(ServeConfig {
            gro,
            ..no_timeouts(config_with(Aggregation::TrioMl, &["1:2"], |s| {
                s.block_grad_max = 256
            }))
        });
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let gso = Gso::probe(&s, true);
        let client_gro = udp_batch::enable_gro(&s);
        // Blocks 0..8 from sources 0 and 1 (both this socket), 256 gradients each.
        let grads = |src: i32, b: i32| -> Vec<i32> { (0..256).map(|i| i * b - src).collect() };
        let mut burst: Vec<Vec<u8>> = (0..8u32)
            .flat_map(|b| (0..2u8).map(move |src| (b, src)))
            .map(|(b, src)| datagram(1, src, b, &grads(i32::from(src), b as i32)))
            .collect();
        // Same size, but announcing 255 gradients: bad length.
        let mut wrong = datagram(1, 0, 9, &grads(0, 9));
        TrioMlHdr::new_unchecked(&mut wrong[..TRIO_ML_HDR_LEN]).set_grad_cnt(255);
        burst.insert(5, wrong);
        // Shorter than the header, last (a GSO message's last datagram may be short).
        burst.push(vec![1, 2, 3]);
        let mut batch = SendBatch::new();
        for d in &burst {
            batch.push(Some(addr), d);
        }
        let sent = batch.send(&s, &gso);
        assert_eq!((sent.datagrams, sent.failed), (18, 0));
        wait_received(&m, 18);
        // The 8 Results, each once (both members are this socket).
        let mut rx = RecvBatch::new(8);
        let mut results = Vec::new();
        while results.len() < 8 {
            rx.recv(&s).expect("the Results within 5 s");
            results.extend(rx.datagrams().map(|d| d.payload.to_vec()));
        }
        results.sort_by_key(|r| wire::parse_payload(r).unwrap().0.block_id);
        for (b, r) in results.iter().enumerate() {
            let (hdr, g) = wire::parse_payload(r).unwrap();
            assert_eq!((hdr.block_id, hdr.src_cnt), (b as u32, 2));
            let want: Vec<i32> = (0..256).map(|i| 2 * i * b as i32 - 1).collect();
            assert_eq!(
                wire::gradients(g),
                want,
                "block {b}, gro {gro}, client gro {client_gro}"
            );
        }
        stop.stop();
        let rep = h.join().unwrap();
        let f = &rep.front_end;
        assert_eq!(f.datagrams_in, 18, "{f:?}");
        assert_eq!(
            (f.injected, f.dropped_bad_length, f.dropped_short),
            (16, 1, 1),
            "{f:?}"
        );
        assert_eq!(f.unaccounted(), 0, "{f:?}");
        if gso.is_on() && f.gro {
            assert!(f.recv_calls < 18, "one burst, coalesced: {f:?}");
        }
        assert!(rep.engine.is_conserved());
    }
}

/// The job run again and again by new workers with other vectors, as after restarts: each
/// run gets its own sums at once. Runs of 8 chunks end at generation 0, so the next run's
/// blocks are the kept ones' (once answered with the last run's sums); runs of 196 chunks
/// end at generation 24, ahead of the next run's (once refused as stale until expiry).
#[test]
fn a_job_run_again_gets_its_own_sums_never_the_last_runs() {
    let (addr, stop, h) = start(no_timeouts(config(Aggregation::TrioMl, &["1:2"])));
    let mut runs = Vec::new();
    let mut joins = 0;
    for (seed, gradients) in [(1, 2048), (2, 2048), (3, 50_000), (4, 50_000), (5, 2048)] {
        let r = Run::ints(1, &[0, 1], gradients, seed);
        let done = run_workers(addr, &r);
        check_exact(&r, &done);
        joins += done.iter().map(|(_, rep)| rep.joins_sent).sum::<u64>();
        let ids: Vec<u8> = done.iter().map(|(_, rep)| rep.run_id).collect();
        assert!(ids[0] != 0 && ids.iter().all(|&i| i == ids[0]), "{ids:?}");
        runs.push(ids[0]);
    }
    // Every run a new one.
    assert!(runs.windows(2).all(|w| w[0] != w[1]), "{runs:?}");
    stop.stop();
    let rep = h.join().unwrap();
    let d = &rep.engine.dropped_by_reason;
    // Every worker's Join answered (a Join sent again when its answer was late is
    // answered again: at most as many as were sent).
    let answered = d.get("join_answered").copied().unwrap_or(0);
    assert!(
        (10..=joins).contains(&answered),
        "{joins} Joins sent: {d:?}"
    );
    for reason in ["stale_gen", "stale_run", "block_cnt_max"] {
        assert_eq!(d.get(reason).copied().unwrap_or(0), 0, "{reason}: {d:?}");
    }
    assert!(rep.engine.is_conserved());
}

/// A client written from the paper's Figures 7-8 sends its blocks without a window: with
/// the default settings a job takes the paper's 4095 blocks at once, so 200 blocks in
/// flight all get their Results.
#[test]
fn a_client_without_a_window_gets_every_result_of_200_blocks_in_flight() {
    let (addr, stop, m, h) = start_monitored(config(Aggregation::TrioMl, &["1:1"]));
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // 200 Results at once: the default buffer (about 208 KiB, each datagram counting its
    // bytes and about 1 KiB of the kernel's) holds some 160 of them (the README says so).
    socket2::SockRef::from(&client)
        .set_recv_buffer_size(4 << 20)
        .unwrap();
    for b in 0..200u32 {
        // Paced only so that the kernel's buffers lose nothing; nothing waits for Results.
        send_paced(&client, &datagram(1, 0, b, &[b as i32; 64]), addr, &m);
    }
    let mut got = std::collections::BTreeSet::new();
    let mut buf = vec![0u8; 65_536];
    while got.len() < 200 {
        let n = client.recv(&mut buf).unwrap_or_else(|e| {
            panic!(
                "{} of 200 Results, then none within 10 s ({e}): {:?}",
                got.len(),
                m.stats()
            )
        });
        let hdr = serve::datagram_header(&buf[..n]).unwrap();
        assert_eq!(
            &buf[TRIO_ML_HDR_LEN..TRIO_ML_HDR_LEN + 4],
            &hdr.block_id.to_be_bytes()
        );
        got.insert(hdr.block_id);
    }
    stop.stop();
    let rep = h.join().unwrap();
    assert_eq!(rep.engine.drops("block_cnt_max"), 0);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
}

/// Blocks refused because a job's slots are full are reported with the option that raises
/// the limit.
#[test]
fn full_slots_are_reported_with_the_option_that_raises_them() {
    let (addr, stop, m, h) = start_monitored(config_with(Aggregation::TrioMl, &["1:2"], |s| {
        s.window = 2;
        s.block_cnt_max = Some(4);
    }));
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Source 0 alone opens six blocks: four fit, two are refused.
    for b in 0..6u32 {
        send_paced(&client, &datagram(1, 0, b, &[1]), addr, &m);
    }
    stop.stop();
    let rep = h.join().unwrap();
    assert_eq!(rep.engine.drops("block_cnt_max"), 2);
    assert_eq!(rep.warnings.len(), 1, "{:?}", rep.warnings);
    assert!(
        rep.warnings[0].contains("--block-cnt-max"),
        "{}",
        rep.warnings[0]
    );
    assert!(
        rep.warnings[0].starts_with("2 packets"),
        "{}",
        rep.warnings[0]
    );
    // Settings that cannot hold a window are refused by name.
    let err = serve::Server::bind(&config_with(Aggregation::TrioMl, &["1:2"], |s| {
        s.window = 8;
        s.block_cnt_max = Some(15);
    }))
    .unwrap_err();
    assert!(err.to_string().contains("block_cnt_max"), "{err}");
}

#[test]
fn four_library_workers_get_exact_fpisa_sums() {
    let (addr, stop, h) = start(no_timeouts(config(
        Aggregation::Fpisa(Variant::Full),
        &["3:4"],
    )));
    let r = Run {
        fpisa: true,
        ..Run::ints(3, &[0, 1, 2, 3], 20_000, 11)
    };
    let done = run_workers(addr, &r);
    check_exact(&r, &done);
    stop.stop();
    h.join().unwrap();
}

#[test]
fn dropped_packets_are_retransmitted_and_sums_stay_exact() {
    for (aggregation, fpisa) in [
        (Aggregation::TrioMl, false),
        (Aggregation::Fpisa(Variant::Full), true),
    ] {
        let (addr, stop, h) = start(no_timeouts(config(aggregation, &["1:4"])));
        let r = Run {
            fpisa,
            drop_every: Some(7),
            retransmit: Some(Duration::from_millis(20)),
            ..Run::ints(1, &[0, 1, 2, 3], 20_000, 3)
        };
        let done = run_workers(addr, &r);
        check_exact(&r, &done);
        for (_, rep) in &done {
            assert!(rep.dropped_by_injector > 0);
            assert!(rep.stats.retransmitted >= rep.dropped_by_injector);
        }
        stop.stop();
        let rep = h.join().unwrap();
        assert!(rep.engine.is_conserved());
    }
}

/// A worker that comes after its job's blocks timed out is left out of them, and its packets
/// are answered with the kept partial Results: the others' sums, degraded.
///
/// Which of the on-time workers make each block in time depends on the machine (a thread
/// delayed past the 30 ms timeout is left out of some blocks too, and answered the same
/// way), so each chunk is checked against the sources its Result counts: its sums are
/// those of `src_cnt` of the on-time workers, never the slow one's, and every worker got
/// the very same Result, the slow one included.
#[test]
fn a_slow_worker_is_left_out_and_answered_with_the_partial_result() {
    // Kept Results stay until their block id's next generation (no expiry), so the slow
    // worker finds them however late it comes.
    let (addr, stop, h) = start(config_with(Aggregation::TrioMl, &["1:4"], |s| {
        s.block_exp_ms = 30;
        s.keep_result_ms = 0;
    }));
    // 8 chunks of 256 in a window of 8: one generation, so the kept partial Results are
    // still there when the slow worker comes.
    let (n, g) = (2048, 256);
    let on_time = Run {
        retransmit: Some(Duration::from_millis(500)),
        ..Run::ints(1, &[0, 1, 2], n, 5)
    };
    let done = run_workers(addr, &on_time);
    let slow = run_workers(
        addr,
        &Run {
            sources: vec![3],
            ..on_time
        },
    );
    // The sums of each non-empty set of on-time sources, with its size.
    let vectors: Vec<Vec<i32>> = (0..3).map(|s| serve::seeded_ints(5, s, n)).collect();
    let subsets: Vec<(u8, Vec<i32>)> = (1..8u32)
        .map(|mask| {
            let mut sum = vec![0i32; n];
            for (s, v) in vectors.iter().enumerate() {
                if mask & 1 << s != 0 {
                    sum.iter_mut()
                        .zip(v)
                        .for_each(|(a, b)| *a = a.wrapping_add(*b));
                }
            }
            (mask.count_ones() as u8, sum)
        })
        .collect();
    let (first, _) = &done[0];
    for c in 0..n / g {
        let range = c * g..(c + 1) * g;
        let cnt = first.src_counts()[c];
        assert!(
            subsets
                .iter()
                .any(|(k, sum)| *k == cnt && sum[range.clone()] == first.sums()[range.clone()]),
            "chunk {c}: not the sums of {cnt} on-time sources"
        );
        for (w, _) in done.iter().chain(&slow) {
            assert!(w.degraded()[c], "chunk {c}: the slow worker was left out");
            assert_eq!(w.src_counts()[c], cnt, "chunk {c}: one Result for all");
            assert_eq!(
                w.sums()[range.clone()],
                first.sums()[range.clone()],
                "chunk {c}: the slow worker gets the others' partial sums"
            );
        }
    }
    stop.stop();
    h.join().unwrap();
}

/// Every class of bad datagram is dropped under its own counted reason, nothing is lost
/// (every datagram is accounted for), a stranger is never sent a Result, and the server
/// still aggregates exactly afterwards.
#[test]
fn bad_datagrams_are_dropped_and_counted() {
    let (addr, stop, m, h) = start_monitored(config_with(Aggregation::TrioMl, &["1:1"], |s| {
        s.block_grad_max = 256
    }));
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Empty, and shorter than the header.
    send_paced(&s, &[], addr, &m);
    send_paced(&s, &[1, 2, 3], addr, &m);
    // A header announcing 2 gradients with 1 behind it (truncated), and with 3 (too long).
    let mut bad_len = datagram(1, 0, 0, &[5, 6]);
    bad_len.truncate(bad_len.len() - 4);
    send_paced(&s, &bad_len, addr, &m);
    let mut long = datagram(1, 0, 0, &[5, 6]);
    long.extend_from_slice(&[0, 0, 0, 7]);
    send_paced(&s, &long, addr, &m);
    // Job 9 is not configured.
    send_paced(&s, &datagram(9, 0, 0, &[1]), addr, &m);
    // Job 1, source 200 is not in the job: the engine drops it.
    send_paced(&stranger, &datagram(1, 200, 0, &[1]), addr, &m);
    // More gradients than the job's block_grad_max (256), in a block id the worker below
    // never uses (its packets may reach the engine first).
    send_paced(&s, &datagram(1, 0, 1000, &[1; 300]), addr, &m);
    // The server still works.
    let r = Run::ints(1, &[0], 1000, 1);
    let done = run_workers(addr, &r);
    check_exact(&r, &done);
    stop.stop();
    let rep = h.join().unwrap();
    let f = &rep.front_end;
    assert_eq!(f.dropped_short, 2, "{f:?}");
    assert_eq!(f.dropped_bad_length, 2, "{f:?}");
    assert_eq!(f.dropped_unknown_job, 1, "{f:?}");
    assert_eq!(f.strangers, 1, "{f:?}");
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    assert_eq!(f.peers, 1, "the stranger is not a member: {f:?}");
    let by = &rep.engine.dropped_by_reason;
    assert_eq!(by.get("unknown_source"), Some(&1), "{by:?}");
    assert_eq!(by.get("block_grad_max"), Some(&1), "{by:?}");
    assert_conserved(&rep.engine);
    assert_eq!(
        recv_within(&stranger, Duration::from_millis(100)),
        None,
        "a source outside the job got a datagram"
    );
}

/// A member that floods new block ids gets at most its job's slots; the rest are dropped
/// as `block_cnt_max`, the tables stay within the job limits, another job aggregates
/// exactly all the while, and once the flood's Results expire the flooded job aggregates
/// exactly again.
#[test]
fn a_flood_of_new_block_ids_is_capped_and_other_jobs_still_aggregate() {
    // 16 slots per job: the workers below (window 8) need two per block id.
    let window = 8;
    let server = Server::bind(&ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        control: Some("127.0.0.1:0".into()),
        ..config_with(Aggregation::TrioMl, &["1:2", "2:2"], |s| {
            s.window = window;
            s.block_cnt_max = Some(2 * window as u16);
            // Job 1's flood must time out (255 ms, as in `config`) and its Results expire
            // to give its slots back.
            s.keep_result_ms = 100;
        })
    })
    .unwrap();
    let (addr, stop, m) = (
        server.local_addr().unwrap(),
        server.stop_handle(),
        server.monitor(),
    );
    let control = server
        .control_addr()
        .expect("a control address")
        .to_string();
    let h = std::thread::spawn(move || server.run(RUN_LIMITS));
    // The other job, made again without a block timeout: its sums are exact however long
    // its workers, which share the machine with the flood, are held up.
    for (command, args) in [
        ("remove", serde_json::json!({ "job_id": 2 })),
        (
            "add",
            serde_json::json!({ "job_id": 2, "sources": [0, 1], "block_exp_ms": NO_BLOCK_TIMEOUT }),
        ),
    ] {
        let (status, body) = jobs_call(&control, command, args);
        assert_eq!(status, 200, "{command}: {body}");
    }
    assert_eq!(
        m.trio_ml().job_state(2).unwrap().block_exp_ms,
        NO_BLOCK_TIMEOUT
    );
    let slots = 2 * window as u16;
    let flood = 20_000u32;
    let flooder = UdpSocket::bind("127.0.0.1:0").unwrap();
    let peak = std::sync::atomic::AtomicU32::new(0);
    let r = Run {
        retransmit: Some(Duration::from_millis(100)),
        ..Run::ints(2, &[0, 1], 20_000, 3)
    };
    let flooding = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            // Source 0 of job 1 sends block after block; source 1 never does.
            for b in 0..flood {
                flooder
                    .send_to(&datagram(1, 0, b, &[1, 2, 3, 4]), addr)
                    .unwrap();
                if b % 1000 == 999 {
                    // Let the server keep up with most of it.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            flooding.store(false, std::sync::atomic::Ordering::Release);
        });
        sc.spawn(|| {
            while flooding.load(std::sync::atomic::Ordering::Acquire) {
                // Slots taken in the job's bitmap (block_curr_cnt is counted up before
                // the check, and back down on refusal, so it may pass the cap for a moment).
                let used = m.trio_ml().job_state(1).unwrap().slots_in_use;
                peak.fetch_max(used, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let done = run_workers(addr, &r);
        check_exact(&r, &done);
    });
    let peak = peak.into_inner();
    assert!(
        peak <= u32::from(slots),
        "job 1 used {peak} of {slots} slots"
    );
    let t = m.trio_ml();
    let job1 = t.job_state(1).unwrap();
    assert!(job1.block_curr_cnt <= slots, "{job1:?}");
    // Every record in the engine's tables belongs to a slot of one of the two jobs.
    assert!(
        t.kept_records() <= 2 * usize::from(slots),
        "{}",
        t.kept_records()
    );
    assert!(
        t.active_records() <= 2 * usize::from(slots),
        "{}",
        t.active_records()
    );
    // The flood's blocks time out (255 ms), their Results expire (100 ms more), and job 1
    // has all its slots back.
    let t0 = Instant::now();
    while t.job_state(1).unwrap().block_curr_cnt > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{:?}",
            t.job_state(1)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let created = u64::from(t.job_state(1).unwrap().block_total_cnt);
    let again = Run {
        job: 1,
        sources: vec![0, 1],
        ..r
    };
    check_exact(&again, &run_workers(addr, &again));
    stop.stop();
    let rep = h.join().unwrap();
    let by = &rep.engine.dropped_by_reason;
    let capped = by.get("block_cnt_max").copied().unwrap_or(0);
    assert!(capped > 0, "the flood was not capped: {by:?}");
    let f = &rep.front_end;
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    // Job 1's two sources (the flooder's source 0 moved to its worker) and job 2's two.
    assert_eq!((f.peers, f.readdressed), (4, 1), "{f:?}");
    assert_conserved(&rep.engine);
    assert_eq!(rep.engine.in_flight, 0);
    assert_eq!(rep.open_blocks_left, 0, "{rep:?}");
    // Blocks the flood created and flood packets refused: at most the flood.
    assert!(created + capped <= u64::from(flood), "{created} + {capped}");
    assert!(created >= u64::from(slots), "{created}");
}

/// The members are fixed by the configuration: hundreds of addresses sending as a member
/// move that member, and its Results go to the newest address each time; hundreds of
/// strangers leave nothing behind.
#[test]
fn many_senders_leave_the_members_fixed_and_results_follow_the_newest_address() {
    let (addr, stop, m, h) = start_monitored(config(Aggregation::TrioMl, &["1:1"]));
    // Every socket stays open to the end: a closed one's port could be handed to the next,
    // which would then not be a new address.
    let mut open = Vec::new();
    for k in 0..200u32 {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        // A complete block of source 0 (the job's only source) from a fresh address, with
        // block ids reused as a worker of window 8 does: its Result comes back here.
        let (block, gen) = (k % 8, (k / 8) as u16);
        send_paced(&s, &datagram_gen(1, 0, block, gen, &[k as i32]), addr, &m);
        let Some(res) = recv_within(&s, Duration::from_secs(10)) else {
            stop.stop();
            panic!("no Result for block {k}: {:?}", h.join().unwrap());
        };
        let hdr = serve::datagram_header(&res).unwrap();
        assert_eq!(
            (hdr.job_id, hdr.block_id, hdr.gen_id, hdr.src_cnt),
            (1, block, gen, 1)
        );
        assert_eq!(wire::gradients(&res[TRIO_ML_HDR_LEN..]), vec![k as i32]);
        // A stranger from a fresh address.
        let x = UdpSocket::bind("127.0.0.1:0").unwrap();
        send_paced(&x, &datagram(1, 7, k, &[1]), addr, &m);
        open.extend([s, x]);
    }
    stop.stop();
    let rep = h.join().unwrap();
    let f = &rep.front_end;
    assert_eq!(f.peers, 1, "{f:?}");
    assert_eq!(f.readdressed, 199, "{f:?}");
    assert_eq!(f.strangers, 200, "{f:?}");
    assert_eq!(
        f.datagrams_out, 200,
        "one Result to each member address: {f:?}"
    );
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    assert_eq!(
        rep.engine.dropped_by_reason.get("unknown_source"),
        Some(&200)
    );
    assert_conserved(&rep.engine);
}

/// Random datagrams (random bytes, and well-formed headers with random fields) never
/// stop the server: each is accounted for, the engine conserves packets, and workers still
/// get exact sums.
#[test]
fn random_datagrams_are_all_accounted_for() {
    // Random headers name jobs 1, 2 (not configured), 3 and random ones, never job 5,
    // whose worker checks afterwards that the server still aggregates.
    let (addr, stop, m, h) = start_monitored(config(Aggregation::TrioMl, &["1:2", "3:1", "5:1"]));
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let n = 3000u64;
    for i in 0..n {
        let d = if i % 2 == 0 {
            let len = (next() % 80) as usize;
            (0..len).map(|_| next() as u8).collect::<Vec<u8>>()
        } else {
            let grads: Vec<i32> = (0..next() % 40).map(|_| next() as i32).collect();
            let job = match [1, 3, 2, next() as u8][(next() % 4) as usize] {
                5 => 6,
                j => j,
            };
            let mut d = datagram(job, (next() % 4) as u8, (next() % 64) as u32, &grads);
            // Random header bits: age_op, flags, src_cnt, gen_id.
            for at in [5, 6, 7, 8, 9] {
                if next() % 3 == 0 {
                    d[at] = next() as u8;
                }
            }
            d
        };
        s.send_to(&d, addr).unwrap();
        if i % 100 == 99 {
            wait_received(&m, i + 1);
        }
    }
    wait_received(&m, n);
    let r = Run::ints(5, &[0], 3000, 5);
    check_exact(&r, &run_workers(addr, &r));
    stop.stop();
    let rep = h.join().unwrap();
    let f = &rep.front_end;
    assert!(f.datagrams_in > n, "{f:?}");
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    assert!(f.dropped_short + f.dropped_bad_length > 0, "{f:?}");
    assert!(f.dropped_unknown_job > 0, "{f:?}");
    assert!(f.strangers > 0, "{f:?}");
    assert_conserved(&rep.engine);
    assert_eq!(rep.engine.in_flight, 0);
    assert!(rep.engine.faults.is_empty(), "{:?}", rep.engine.faults);
}

/// Datagrams the kernel drops because the server's receive buffer is full are counted
/// (`kernel_dropped`, the kernel's own count for the socket): every datagram sent is
/// received or counted dropped, and the report warns, naming the option that raises the
/// buffer. The overflow is forced: a burst far larger than the smallest buffer, sent before
/// the server reads at all.
#[test]
fn datagrams_the_kernel_drops_for_a_full_buffer_are_counted() {
    let server = Server::bind(&ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        // The smallest buffer the kernel grants: a few datagrams.
        recv_buffer_bytes: 1,
        // One message per datagram, so the kernel counts datagrams.
        gro: false,
        ..config(Aggregation::TrioMl, &["1:1"])
    })
    .unwrap();
    let addr = server.local_addr().unwrap();
    let m = server.monitor();
    let stop = server.stop_handle();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Job 9 is not configured: each datagram received is dropped as an unknown job.
    let d = datagram(9, 0, 1, &[7; 256]);
    let sent = 200u64;
    for _ in 0..sent {
        s.send_to(&d, addr).unwrap();
    }
    let h = std::thread::spawn(move || server.run(RUN_LIMITS));
    // Until every datagram is received or counted dropped.
    let t0 = Instant::now();
    loop {
        let f = m.stats();
        if f.datagrams_in + f.kernel_dropped >= sent {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{sent} sent: {f:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    // A last one, queued once the buffer was emptied: it carries the kernel's count too.
    send_paced(&s, &d, addr, &m);
    stop.stop();
    let rep = h.join().unwrap();
    let f = &rep.front_end;
    assert!(
        f.kernel_dropped > 0,
        "200 datagrams fitted a few KiB: {f:?}"
    );
    assert_eq!(f.datagrams_in + f.kernel_dropped, sent + 1, "{f:?}");
    assert_eq!(f.dropped_unknown_job, f.datagrams_in, "{f:?}");
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    let warned = |what: &str| rep.warnings.iter().any(|w| w.contains(what));
    assert!(
        warned("dropped by the kernel") && warned("--recv-buffer-kb"),
        "{:?}",
        rep.warnings
    );
}

/// A receive buffer granted smaller than asked for (Linux caps it at
/// `net.core.rmem_max`) is a warning in the human report too, naming the option and the
/// cap; a size the kernel cannot take is refused by name.
#[test]
fn a_receive_buffer_granted_smaller_than_asked_is_a_warning() {
    let Some(rmem_max) = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    else {
        eprintln!("no net.core.rmem_max: nothing caps the buffer");
        return;
    };
    // More than the cap, though less than twice the cap the kernel then reports (it
    // keeps double the size for its bookkeeping): capped all the same.
    let asked_kb = rmem_max / 1024 + 1024;
    if asked_kb * 1024 > serve::MAX_RECV_BUFFER_BYTES as u64 {
        eprintln!("net.core.rmem_max {rmem_max} is above what --recv-buffer-kb takes");
        return;
    }
    let asked_kb = asked_kb.to_string();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--job", "1:1"])
        .args(["--seconds", "0.1", "--recv-buffer-kb", &asked_kb])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning: ") && l.contains("receive buffer"))
        .unwrap_or_else(|| panic!("no warning: {text}"));
    assert!(
        warning.contains(&format!("{asked_kb} KiB asked for (--recv-buffer-kb)"))
            && warning.contains("net.core.rmem_max"),
        "{warning}"
    );
    // The --json report has it among its warnings too.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--job", "1:1", "--json"])
        .args(["--seconds", "0.1", "--recv-buffer-kb", &asked_kb])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let rep: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let warnings = rep["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("--recv-buffer-kb")),
        "{rep}"
    );
    // Past what setsockopt takes: refused, naming the option.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--job", "1:1"])
        .args(["--seconds", "0.1", "--recv-buffer-kb", "4194304"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("`--recv-buffer-kb`"), "{err}");
}

/// Stopping waits for the open blocks to time out, so a source whose peers never came
/// still gets its partial Result.
#[test]
fn stopping_sends_the_partial_results_of_open_blocks() {
    // The engine's clock stands still until the stop: the block is open when it comes, at
    // any speed of the machine.
    let clock = Arc::new(ManualClock::new());
    let (addr, stop, m, h) = start_monitored(ServeConfig {
        clock: Some(clock.clone()),
        ..config(Aggregation::TrioMl, &["1:3"])
    });
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    send_paced(&s, &datagram(1, 0, 7, &[10, -20, 30]), addr, &m);
    wait_for_an_open_block(&m);
    stop.stop();
    let rep = run_clock_until_stopped(&clock, h);
    assert_eq!(
        (rep.open_blocks_at_stop, rep.open_blocks_left),
        (1, 0),
        "{rep:?}"
    );
    let res = recv_within(&s, Duration::from_secs(10)).expect("the partial Result");
    let hdr = serve::datagram_header(&res).unwrap();
    assert_eq!(
        (hdr.job_id, hdr.block_id, hdr.src_cnt),
        (1, 7, 1),
        "{hdr:?}"
    );
    assert!(hdr.degraded, "{hdr:?}");
    assert_eq!(wire::gradients(&res[TRIO_ML_HDR_LEN..]), vec![10, -20, 30]);
}

/// Waits until the server `m` watches has a block open (within 30 s: a hang guard).
fn wait_for_an_open_block(m: &Monitor) {
    let t0 = Instant::now();
    while m.trio_ml().active_blocks().unwrap().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no block opened");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Moves `clock` (a stopping server's engine clock) a millisecond at a time until the
/// server has stopped: its timers time the open blocks out as the clock passes. Returns
/// the server's report.
fn run_clock_until_stopped(clock: &ManualClock, h: JoinHandle<ServeReport>) -> ServeReport {
    let t0 = Instant::now();
    while !h.is_finished() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the server did not stop within 120 s of its clock's moving"
        );
        clock.advance(1_000_000);
        std::thread::sleep(Duration::from_millis(1));
    }
    h.join().unwrap()
}

/// A server without a block timeout owes no partial Result: a block still missing a source
/// when it stops is left open, and said so in the report (`open_blocks_left`), and its
/// source gets nothing. (The block can never time out: this holds at any speed.)
#[test]
fn stopping_without_a_block_timeout_leaves_the_open_blocks_open() {
    let cfg = config_with(Aggregation::TrioMl, &["1:3"], |s| {
        s.block_exp_ms = NO_BLOCK_TIMEOUT;
    });
    let (addr, stop, m, h) = start_monitored(cfg);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    send_paced(&s, &datagram(1, 0, 7, &[10, -20, 30]), addr, &m);
    wait_for_an_open_block(&m);
    stop.stop();
    let rep = h.join().unwrap();
    assert_eq!(
        (rep.open_blocks_at_stop, rep.open_blocks_left),
        (1, 1),
        "{rep:?}"
    );
    assert!(rep.engine.is_conserved(), "{:?}", rep.engine);
    // The server has stopped: whatever it sent is in the socket already.
    assert_eq!(recv_within(&s, Duration::from_millis(100)), None);
}

/// Stopping a first-level server: the partial Result of its open block goes up while it
/// stops, and the upper level's answer still reaches the member. (It used to stop reading
/// its socket before the open blocks finished: the answers to the last partial Results it
/// sent up were never read, and its members waited in vain.)
#[test]
fn a_stopping_first_level_server_passes_the_answers_to_its_last_results_down() {
    let (up, up_stop, up_h) = start(config(Aggregation::TrioMl, &["1:1"]));
    // The lower server's clock stands still until the stop: its block is open when it
    // comes (see `stopping_sends_the_partial_results_of_open_blocks`).
    let clock = Arc::new(ManualClock::new());
    let (a, a_stop, a_m, a_h) = start_monitored(ServeConfig {
        upstream: Some(up),
        // However long the answer takes on this machine.
        stop_upstream_wait: Duration::from_secs(60),
        clock: Some(clock.clone()),
        ..config(Aggregation::TrioMl, &["1:2"])
    });
    // Source 0 of two: its block waits for source 1, which never comes.
    let member = UdpSocket::bind("127.0.0.1:0").unwrap();
    send_paced(&member, &datagram(1, 0, 7, &[10, -20, 30]), a, &a_m);
    wait_for_an_open_block(&a_m);
    a_stop.stop();
    let rep = run_clock_until_stopped(&clock, a_h);
    up_stop.stop();
    let upper = up_h.join().unwrap();
    assert_eq!(rep.open_blocks_at_stop, 1, "{rep:?}");
    let f = &rep.front_end;
    assert_eq!(rep.open_blocks_left, 0, "{rep:?}");
    assert_eq!(upper.front_end.injected, 1, "{:?}", upper.front_end);
    assert_eq!(
        (f.upstream_results_in, f.upstream_unanswered),
        (1, 0),
        "{f:?}"
    );
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    // The server fanned the answer out before it returned.
    let res = recv_within(&member, Duration::from_secs(10)).expect("the upper's answer");
    let hdr = serve::datagram_header(&res).unwrap();
    assert_eq!((hdr.job_id, hdr.block_id), (1, 7), "{hdr:?}");
    assert!(
        hdr.degraded,
        "a partial Result below stays degraded above: {hdr:?}"
    );
    assert_eq!(wire::gradients(&res[TRIO_ML_HDR_LEN..]), vec![10, -20, 30]);
}

/// A stopping first-level server keeps reading its socket while it owes its members
/// Results: here one held for its Join upstream, which the upper aggregator (played by the
/// test) answers only after the stop. A member's datagram that arrives meanwhile is counted
/// (`dropped_stopping`), not injected; the Joined releases the held Result, which goes up,
/// and the answer to it comes down to the member before the server stops.
#[test]
fn a_stopping_first_level_server_counts_members_datagrams_and_waits_for_its_answers() {
    use pfemu::microcode::trio_ml::host::WorkerConfig;
    use pfemu::microcode::trio_ml::wire::Control;

    let upper = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (a, a_stop, a_m, a_h) = start_monitored(ServeConfig {
        upstream: Some(upper.local_addr().unwrap()),
        first_run: Some(1),
        stop_upstream_wait: Duration::from_secs(60),
        ..config(Aggregation::TrioMl, &["1:1"])
    });
    let member = UdpSocket::bind("127.0.0.1:0").unwrap();
    let deadline = Duration::from_secs(60);
    // The next datagram from `s` that `wanted` takes, within the deadline.
    let next = |s: &UdpSocket, what: &str, wanted: &dyn Fn(&TrioMlHdrFields) -> bool| {
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < deadline, "no {what}: {:?}", a_m.stats());
            if let Some(d) = recv_within(s, Duration::from_millis(100)) {
                if wanted(&serve::datagram_header(&d).unwrap()) {
                    return d;
                }
            }
        }
    };
    let ep = WorkerConfig::new(1, 0, "10.0.0.100".parse().unwrap()).endpoints;
    let join = wire::join_packet(ep, 1, 0, 0x5eed)[wire::TRIO_ML_HDR_AT..].to_vec();
    member.send_to(&join, a).unwrap();
    let joined = next(&member, "Joined", &|h| Control::of(h).is_some());
    let run = serve::datagram_header(&joined).unwrap().run_id;
    // The server joins the job above; the upper aggregator does not answer yet.
    let up_join = next(&upper, "Join upstream", &|h| {
        matches!(Control::of(h), Some(Control::Join { .. }))
    });
    let nonce = serve::datagram_header(&up_join).unwrap().block_id;
    // Block 7's Result (one source: at once) is held for the Joined.
    let mut d = datagram(1, 0, 7, &[5, 6]);
    TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]).set_run_id(run);
    member.send_to(&d, a).unwrap();
    let t0 = Instant::now();
    while a_m.stats().results < 2 {
        assert!(t0.elapsed() < deadline, "no Result: {:?}", a_m.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    a_stop.stop();
    // The member sends on while the server stops: counted, not injected. The stop takes
    // effect at the receive loop's next turn, so its Join is sent again until one is
    // counted (one taken before that is answered with a Joined, as ever).
    let t0 = Instant::now();
    let mut joins_after_stop = 0u64;
    while a_m.stats().dropped_stopping < 1 {
        assert!(t0.elapsed() < deadline, "not counted: {:?}", a_m.stats());
        member.send_to(&join, a).unwrap();
        joins_after_stop += 1;
        let sent = Instant::now();
        while a_m.stats().dropped_stopping < 1 && sent.elapsed() < Duration::from_millis(100) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // The upper aggregator answers the Join: the held Result goes up in its run 5.
    let a_addr = a;
    let mut answer = Vec::new();
    wire::append_payload(
        &mut answer,
        &Control::Joined { run_id: 5, nonce }.header(1, 0),
        &[],
    );
    upper.send_to(&answer, a_addr).unwrap();
    let result = next(&upper, "Result upstream", &|h| !h.ctl);
    let (mut hdr, grads) = wire::parse_payload(&result).unwrap();
    assert_eq!((hdr.block_id, hdr.run_id), (7, 5), "{hdr:?}");
    assert_eq!(wire::gradients(grads), [5, 6]);
    // Its answer: the sums of two first-level servers, say.
    hdr.src_cnt = 2;
    let mut answer = Vec::new();
    wire::append_payload(&mut answer, &hdr, &[50, 60]);
    upper.send_to(&answer, a_addr).unwrap();
    let rep = a_h.join().unwrap();
    let f = &rep.front_end;
    assert_eq!(
        (f.upstream_results_in, f.upstream_unanswered),
        (1, 0),
        "{f:?}"
    );
    // Every Join sent after the stop was either taken before the stop took effect or
    // counted; one was counted at least (more on a loaded machine, where the count came
    // after the next resend).
    assert!(
        (1..=joins_after_stop).contains(&f.dropped_stopping),
        "{joins_after_stop} Joins sent after the stop: {f:?}"
    );
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    // The answer reached the member before the server stopped, in the member's run.
    let res = next(&member, "answer", &|h| !h.ctl);
    let hdr = serve::datagram_header(&res).unwrap();
    assert_eq!(
        (hdr.block_id, hdr.run_id, hdr.src_cnt),
        (7, run, 2),
        "{hdr:?}"
    );
    assert_eq!(wire::gradients(&res[TRIO_ML_HDR_LEN..]), [50, 60]);
}

/// `--stop-upstream-wait-ms` sets how long a stopping first-level server waits for the
/// upper level's answers (`ServeConfig::stop_upstream_wait`, 2 s unless given): refused,
/// naming the option, unless a positive number of milliseconds up to 10^12, and without
/// `--upstream`; shown in `--help`; and honoured, here with a Result held for a Join the
/// upper level (a silent socket) never answers.
#[test]
fn the_stop_upstream_wait_is_an_option_of_serve() {
    use pfemu::microcode::trio_ml::host::WorkerConfig;
    use pfemu::microcode::trio_ml::wire::Control;

    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let upstream = silent.local_addr().unwrap().to_string();
    let serve_args = |extra: &[&str]| -> Vec<String> {
        ["serve", "--listen", "127.0.0.1:0", "--job", "1:1", "--json"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect()
    };
    for bad in ["nan", "-1", "0", "1e300", "inf", "2s"] {
        let wait = format!("--stop-upstream-wait-ms={bad}");
        let out = Command::new(BIN)
            .args(serve_args(&[
                "--seconds",
                "5",
                "--upstream",
                &upstream,
                &wait,
            ]))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("'--stop-upstream-wait-ms <MS>'"),
            "{bad}: {err}"
        );
    }
    let out = Command::new(BIN)
        .args(serve_args(&[
            "--seconds",
            "5",
            "--stop-upstream-wait-ms",
            "100",
        ]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--upstream"), "{err}");
    let help = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--stop-upstream-wait-ms <MS>") && help.contains("[default: 2000]"),
        "{help}"
    );

    // A member joins, and sends a block whose Result is held for the server's Join above,
    // which never comes: the server exits the wait given after its idle exit (500 ms), not
    // the default 2 s after it.
    let waited = |wait_ms: &str| {
        let mut child = Command::new(BIN)
            .args(serve_args(&[
                "--idle-exit-ms",
                "500",
                "--upstream",
                &upstream,
                "--stop-upstream-wait-ms",
                wait_ms,
            ]))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = listening_addr(&mut child);
        let member = UdpSocket::bind("127.0.0.1:0").unwrap();
        let ep = WorkerConfig::new(1, 0, "10.0.0.9".parse().unwrap()).endpoints;
        let join = wire::join_packet(ep, 1, 0, 5)[wire::TRIO_ML_HDR_AT..].to_vec();
        let run = loop {
            member.send_to(&join, addr).unwrap();
            if let Some(d) = recv_within(&member, Duration::from_millis(100)) {
                match Control::of(&serve::datagram_header(&d).unwrap()) {
                    Some(Control::Joined { run_id, .. }) => break run_id,
                    other => panic!("not a Joined: {other:?}"),
                }
            }
        };
        let mut d = datagram(1, 0, 7, &[5]);
        TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]).set_run_id(run);
        member.send_to(&d, addr).unwrap();
        let sent = Instant::now();
        let rep = server_report(child);
        let f = &rep["front_end"];
        assert_eq!(f["upstream_unanswered"], 1, "{rep}");
        assert!(f["upstream_joins_sent"].as_u64().unwrap() >= 1, "{rep}");
        sent.elapsed()
    };
    // A lower bound only: a slow machine can make the exit later, never earlier. Past the
    // default 2 s, it shows the option was taken.
    let long = waited("3000.5");
    assert!(long >= Duration::from_millis(3000), "{long:?}");
}

/// `pfemu serve` as a child process; returns it and the address it printed.
fn spawn_server(args: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args([
            "--listen",
            "127.0.0.1:0",
            "--idle-exit-ms",
            "3000",
            "--json",
            // No block timeout: every block waits for all its workers, so a worker process
            // that starts late, or that a loaded machine stalls, still makes every block
            // (with the longest timeout, 255 ms, such a stall left it out: partial
            // Results, and sums that were not exact).
            "--block-exp-ms",
            "off",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = listening_addr(&mut child);
    (child, addr)
}

/// The address a `pfemu serve --json` child prints on its first line of standard error
/// (`listening ADDR`); the rest of its standard error is copied to the test's.
fn listening_addr(child: &mut Child) -> SocketAddr {
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::stderr()));
    first
        .trim()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .parse()
        .unwrap()
}

fn server_report(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

/// `--give-up-s` of the worker processes of a server without a block timeout: a worker
/// waits for the slowest of the others (a process started late or stalled by a loaded
/// machine) without a Result, and gives up only if none comes for this long.
const GIVE_UP_S: [&str; 2] = ["--give-up-s", "120"];

/// Unix time `ahead` from now, in milliseconds, for `pfemu worker --start-at-ms`.
fn unix_ms_in(ahead: Duration) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (now + ahead).as_millis().to_string()
}

/// Four worker processes of job 1 with `extra` options (the server has no block timeout:
/// they need not start together).
fn worker_processes(addr: SocketAddr, extra: &[&str]) -> Vec<serde_json::Value> {
    let kids: Vec<Child> = (0..4)
        .map(|src| {
            Command::new(BIN)
                .arg("worker")
                .args(["--server", &addr.to_string(), "--src", &src.to_string()])
                .args(["--workers", "4", "--gradients", "100000", "--json"])
                .args(GIVE_UP_S)
                .args(extra)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    kids.into_iter()
        .map(|k| {
            let out = k.wait_with_output().unwrap();
            assert!(out.status.success(), "a worker failed");
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect()
}

#[test]
fn four_worker_processes_through_the_serve_binary() {
    for (program, extra) in [("trio-ml", vec![]), ("fpisa", vec!["--fpisa"])] {
        let (server, addr) = spawn_server(&["--program", program, "--job", "1:4"]);
        for w in worker_processes(addr, &extra) {
            assert_eq!(w["exact"], true, "{program}: {w}");
            assert_eq!(w["src_cnt_min"], 4);
        }
        let rep = server_report(server);
        assert_eq!(rep["front_end"]["peers"], 4, "{rep}");
    }
}

/// `--block-exp-ms off`: a worker held back far longer than any block timeout still makes
/// every block, and every sum of both workers is exact. Worker 0 sends its first window and
/// waits without retransmitting (a retransmission references its blocks and keeps them from
/// ageing, timeout or not); worker 1 starts 1.5 s later, six times the longest timeout
/// (with a timeout, worker 0's blocks time out meanwhile and both get partial Results).
/// A loaded machine may hold worker 0 up as long, and the Results must be complete either
/// way: the test asserts nothing of the time.
#[test]
fn with_no_block_timeout_a_worker_held_back_still_makes_every_block() {
    let (server, addr) = spawn_server(&["--job", "1:2"]);
    let worker = |src: u8, extra: &[&str]| {
        Command::new(BIN)
            .arg("worker")
            .args(["--server", &addr.to_string(), "--src", &src.to_string()])
            .args(["--workers", "2", "--gradients", "20000", "--json"])
            .args(GIVE_UP_S)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = worker(0, &["--retransmit-ms", "0"]);
    let held_back = worker(
        1,
        &["--start-at-ms", &unix_ms_in(Duration::from_millis(1500))],
    );
    for (src, k) in [(0, first), (1, held_back)] {
        let out = k.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "worker {src} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(w["exact"], true, "worker {src}: {w}");
        assert_eq!(w["degraded_chunks"], 0, "worker {src}: {w}");
        assert_eq!(w["src_cnt_min"], 2, "worker {src}: {w}");
    }
    let rep = server_report(server);
    // No block was given up on: nothing came late for one, and none was left open.
    let drops = &rep["engine"]["dropped_by_reason"];
    assert!(drops["late"].is_null(), "{rep}");
    assert_eq!(rep["open_blocks_left"], 0, "{rep}");
}

/// `--block-exp-ms` takes `off` or 1..=255 ms: 0 is refused naming `off` (a typo does not
/// turn the timeout off), and `pfemu replay` refuses no timeout.
#[test]
fn block_exp_ms_off_is_named_and_zero_refused() {
    let serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--job", "1:1"])
        .args(["--block-exp-ms", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid option `--block-exp-ms`") && err.contains("`off`"),
        "{err}"
    );
    let help = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--block-exp-ms <MS|off>"), "{help}");
    let replay = Command::new(BIN)
        .args([
            "replay",
            "--pcap",
            "examples/captures/trio-ml-workers.pcapng",
        ])
        .args([
            "--program",
            "trio-ml",
            "--job",
            "1:4",
            "--block-exp-ms",
            "0",
        ])
        .args([
            "--out",
            concat!(env!("CARGO_TARGET_TMPDIR"), "/replay-no-block-timeout"),
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&replay.stderr);
    assert!(!replay.status.success(), "{err}");
    assert!(
        err.contains("invalid option `--block-exp-ms`") && err.contains("no block timeout"),
        "{err}"
    );
}

/// `--no-gso` and `--no-gro` force the single-datagram paths at both ends; the reports
/// say which offload was used.
#[test]
fn no_gso_and_no_gro_force_single_datagrams_and_the_reports_say_so() {
    let (gro, gso) = kernel_offload();
    for (flags, on) in [(vec![], true), (vec!["--no-gso", "--no-gro"], false)] {
        let mut args = vec!["--job", "1:4"];
        args.extend(&flags);
        let (server, addr) = spawn_server(&args);
        for w in worker_processes(addr, &flags) {
            assert_eq!(w["exact"], true, "{flags:?}: {w}");
            assert_eq!(w["report"]["gro"], on && gro, "{w}");
            assert_eq!(w["report"]["gso"], on && gso, "{w}");
        }
        let rep = server_report(server);
        let f = &rep["front_end"];
        assert_eq!(f["gro"], on && gro, "{rep}");
        assert_eq!(f["gso"], on && gso, "{rep}");
        assert_eq!(f["gso_refused"], 0, "{rep}");
    }
}

/// `--jobs-file` configures the server's jobs (with `--job` ones), and a bad line is
/// refused with its number.
#[test]
fn a_jobs_file_configures_the_servers_jobs() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join("serve-jobs.txt");
    std::fs::write(
        &file,
        "# job 1: the four workers below\n1:4\n\n3:10..12  # another\n",
    )
    .unwrap();
    let (server, addr) = spawn_server(&["--jobs-file", file.to_str().unwrap(), "--job", "2:1"]);
    for w in worker_processes(addr, &[]) {
        assert_eq!(w["exact"], true, "{w}");
    }
    let rep = server_report(server);
    // Members: 4 (job 1) heard; jobs 2 and 3 configured (a datagram of job 3 would be
    // injected, not dropped as unknown).
    assert_eq!(rep["front_end"]["peers"], 4, "{rep}");

    let bad = dir.join("serve-jobs-bad.txt");
    std::fs::write(&bad, "1:4\n2:0..0\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--jobs-file"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Named by the option typed (issue 14), no longer by the library's `jobs_file`.
    assert!(
        err.contains("`--jobs-file`") && err.contains("line 2"),
        "{err}"
    );
    // No --job and no --jobs-file: clap says what is missing.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--job"));
}

#[test]
fn a_two_level_tree_gives_the_flat_sums() {
    // The upper aggregator's job 1 has two sources: the two lower aggregators.
    let (upper, up_addr) = spawn_server(&["--job", "1:2"]);
    let up = up_addr.to_string();
    let (lower_a, a_addr) = spawn_server(&["--job", "1:0..2", "--upstream", &up]);
    let (lower_b, b_addr) =
        spawn_server(&["--job", "1:2..4", "--upstream", &up, "--upstream-src", "1"]);
    let kids: Vec<Child> = [(0, a_addr), (1, a_addr), (2, b_addr), (3, b_addr)]
        .iter()
        .map(|(src, addr)| {
            Command::new(BIN)
                .arg("worker")
                .args(["--server", &addr.to_string(), "--src", &src.to_string()])
                .args(["--workers", "4", "--gradients", "30000", "--json"])
                .args(GIVE_UP_S)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(out.status.success(), "a worker failed");
        let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(w["exact"], true, "{w}");
        assert_eq!(w["src_cnt_min"], 4, "src_cnt counts the servers: {w}");
    }
    for s in [lower_a, lower_b, upper] {
        server_report(s);
    }
}

/// The Python client's path, or `None` (the test is skipped, and says so) where there is no
/// `python3`.
fn python_client() -> Option<&'static str> {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 is not available");
        return None;
    }
    Some(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/trio_ml_client.py"
    ))
}

#[test]
fn the_python_client_gets_its_sums() {
    let Some(script) = python_client() else {
        return;
    };
    let (server, addr) = spawn_server(&["--job", "5:1"]);
    // One run of the paper's header alone, then two that join (the second a new run of
    // the job). (Not the other way round: once source 0 joined, the server takes its
    // datagrams from its joined address alone, with a run or without, so a client that does
    // not join cannot take its place.) `--verbose` prints the sums after the verdict.
    for extra in [
        &["--no-join", "--verbose"][..],
        &["--verbose"],
        &["--verbose"],
    ] {
        let out = Command::new("python3")
            .arg(script)
            .args(["--server", &addr.to_string(), "--job", "5", "--src", "0"])
            .args(["--count", "3000"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let sums: Vec<i64> = text
            .lines()
            .find_map(|l| l.strip_prefix("sums "))
            .unwrap()
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(sums, (0..3000).map(|i| i - 1500).collect::<Vec<i64>>());
        assert!(text.contains("src_cnt 1 1"));
        assert!(text.contains("verdict: exact: 3000 of 3000 sums"), "{text}");
    }
    let report = server_report(server);
    // Both joining runs' Joins answered (the client sends its Join again every 100 ms
    // while unanswered: at least 2).
    let answered = report["engine"]["dropped_by_reason"]["join_answered"].as_u64();
    assert!(answered.unwrap_or(0) >= 2, "{report}");
}

/// The Python client prints a verdict (exact or not, with counts), not 3,000 sums; the sums
/// only with `--verbose`.
#[test]
fn the_python_client_prints_a_verdict_not_the_sums() {
    let Some(script) = python_client() else {
        return;
    };
    let (server, addr) = spawn_server(&["--job", "2:2"]);
    let kids: Vec<Child> = (0..2)
        .map(|src| {
            Command::new("python3")
                .arg(script)
                .args(["--server", &addr.to_string(), "--job", "2"])
                .args(["--src", &src.to_string(), "--count", "3000"])
                .args(GIVE_UP_S)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("verdict: exact: 3000 of 3000 sums are src_cnt x the values sent"),
            "{text}"
        );
        assert!(!text.lines().any(|l| l.starts_with("sums")), "{text}");
        assert!(text.lines().count() <= 2, "{text}");
    }
    server_report(server);
}

/// SIGTERM and SIGINT stop `pfemu serve` gracefully: it exits with success and prints the
/// final report, and every Result the engine built went out (none left in flight).
#[test]
fn a_signal_stops_the_server_gracefully_with_its_report() {
    for signal in ["-TERM", "-INT"] {
        // No idle exit: only the signal can stop it.
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--json", "--job", "1:4"])
            .args(["--block-exp-ms", "off"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = listening_addr(&mut child);
        for w in worker_processes(addr, &[]) {
            assert_eq!(w["exact"], true, "{w}");
        }
        let killed = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let rep = server_report(child);
        let engine = &rep["engine"];
        assert_eq!(engine["in_flight"], 0, "{rep}");
        // 100,000 gradients in 1024-gradient blocks: 98 Results at least (a retransmission
        // is answered with its block's Result again).
        assert!(rep["front_end"]["results"].as_u64().unwrap() >= 98, "{rep}");
        assert!(rep["front_end"]["recv_buffer_bytes"].as_u64().unwrap() > 0);
    }
}

/// A job run again through a two-level tree, as after restarts: each first-level server
/// joins a new run of the job above when its members start one, so neither level answers a
/// new run with the last run's sums. (With the first-level servers sending Results up with
/// no run, the top level answered the second run's blocks with the first run's kept
/// Results.)
#[test]
fn a_job_run_again_through_a_tree_gets_its_own_sums() {
    let (up, up_stop, up_h) = start(no_timeouts(config(Aggregation::TrioMl, &["1:2"])));
    let lower = |jobs: &str, src: u8| ServeConfig {
        upstream: Some(up),
        upstream_src: src,
        ..no_timeouts(config(Aggregation::TrioMl, &[jobs]))
    };
    let (a, a_stop, a_h) = start(lower("1:0..2", 0));
    let (b, b_stop, b_h) = start(lower("1:2..4", 1));
    for (seed, gradients) in [(1, 2048), (2, 2048), (3, 50_000), (4, 2048)] {
        let all = Run::ints(1, &[0, 1, 2, 3], gradients, seed);
        let done: Vec<_> = std::thread::scope(|s| {
            let at_a = s.spawn(|| run_workers(a, &Run::ints(1, &[0, 1], gradients, seed)));
            let at_b = s.spawn(|| run_workers(b, &Run::ints(1, &[2, 3], gradients, seed)));
            let mut done = at_a.join().unwrap();
            done.extend(at_b.join().unwrap());
            done
        });
        check_exact(&all, &done);
    }
    for (stop, h) in [(a_stop, a_h), (b_stop, b_h)] {
        stop.stop();
        let rep = h.join().unwrap();
        let f = &rep.front_end;
        assert_eq!(f.unaccounted(), 0, "{f:?}");
        // One Join upstream per run at least (more only where one was sent again).
        assert!(f.upstream_control_in >= 4, "{f:?}");
        assert_eq!(f.results_held_over, 0, "{f:?}");
        assert!(rep.engine.is_conserved());
    }
    up_stop.stop();
    let rep = up_h.join().unwrap();
    let d = &rep.engine.dropped_by_reason;
    assert!(d.get("join_answered").copied().unwrap_or(0) >= 8, "{d:?}");
    assert!(rep.engine.is_conserved());
}

/// `pfemu worker` as a child process with `args`, to completion.
fn worker_process(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("worker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `--server localhost:PORT` resolves the name (issue 14); an address that names nothing is
/// refused naming `--server`, with the form expected.
#[test]
fn a_worker_reaches_the_server_by_name() {
    let (server, addr) = spawn_server(&["--job", "1:1"]);
    let by_name = format!("localhost:{}", addr.port());
    let out = worker_process(&[
        "--server",
        &by_name,
        "--src",
        "0",
        "--workers",
        "1",
        "--gradients",
        "5000",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(w["exact"], true, "{w}");
    server_report(server);

    for bad in ["no-such-host.invalid:12000", "localhost"] {
        let out = worker_process(&["--server", bad, "--src", "0"]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--server") && err.contains("cannot resolve") && err.contains("HOST:PORT"),
            "{bad}: {err}"
        );
    }
}

/// A client that gets nothing back says so, and tells "nothing came back at all" (is the
/// server there?) from "datagrams came back, but no answer" (issue 14).
#[test]
fn a_worker_that_gets_no_result_says_whether_anything_answered() {
    let give_up = Duration::from_millis(300);
    let worker = || Worker::new(serve::worker_config(1, 0, 64, 4, None), vec![1; 256]).unwrap();
    let cfg = |server: SocketAddr, join: bool| ClientConfig {
        give_up_after: give_up,
        join,
        ..ClientConfig::new(server)
    };
    let no_progress = |e: serve::ServeError| match e {
        serve::ServeError::NoProgress(p) => p,
        e => panic!("not NoProgress: {e}"),
    };

    // A socket that never answers, joining or not.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    for join in [true, false] {
        let e = serve::allreduce(&cfg(silent_addr, join), &mut worker()).unwrap_err();
        let msg = e.to_string();
        let p = no_progress(e);
        assert_eq!((p.datagrams, p.joining), (0, join), "{msg}");
        assert!(
            msg.contains(&format!("no datagram came back from {silent_addr}"))
                && msg.contains("is `pfemu serve` running there"),
            "{msg}"
        );
    }

    // A socket that echoes every datagram: something answers, but never the Join.
    let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
    let echo_addr = echo.local_addr().unwrap();
    echo.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echoing = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((n, from)) = echo.recv_from(&mut buf) {
                    let _ = echo.send_to(&buf[..n], from);
                }
            }
        })
    };
    // (Given longer: the echo must answer at least once before the worker gives up.)
    let e = serve::allreduce(
        &ClientConfig {
            give_up_after: Duration::from_secs(2),
            ..cfg(echo_addr, true)
        },
        &mut worker(),
    )
    .unwrap_err();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    echoing.join().unwrap();
    let msg = e.to_string();
    let p = no_progress(e);
    assert!(p.datagrams > 0 && p.joining, "{msg}");
    assert!(msg.contains("none answered the Join"), "{msg}");

    // Nothing listens: loopback refuses the datagrams.
    let closed_addr = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = serve::allreduce(&cfg(closed_addr, true), &mut worker()).unwrap_err();
    let msg = e.to_string();
    assert_eq!(no_progress(e).datagrams, 0, "{msg}");
    assert!(
        msg.contains(&format!("nothing listens on {closed_addr}"))
            || msg.contains("no datagram came back"),
        "{msg}"
    );

    // The command says the same.
    let out = worker_process(&[
        "--server",
        &silent_addr.to_string(),
        "--src",
        "0",
        "--give-up-s",
        "0.3",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no datagram came back from"), "{err}");
}

/// A worker of the other lane type than the server's program is told which program the
/// server runs and which flag fixes it, not "99,923 sums differ" (issue 14). Two workers:
/// one float's bits summed as an integer are still that float.
#[test]
fn a_worker_against_the_other_program_is_named() {
    for (program, worker_flags, fix) in [
        ("fpisa", &[][..], "run the worker with --fpisa"),
        (
            "trio-ml",
            &["--fpisa"][..],
            "run the worker without --fpisa",
        ),
    ] {
        let (server, addr) = spawn_server(&["--program", program, "--job", "1:2"]);
        let kids: Vec<Child> = (0..2)
            .map(|src| {
                Command::new(BIN)
                    .arg("worker")
                    .args(["--server", &addr.to_string(), "--src", &src.to_string()])
                    .args(["--workers", "2", "--gradients", "3000"])
                    .args(GIVE_UP_S)
                    .args(worker_flags)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (src, k) in kids.into_iter().enumerate() {
            let out = k.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(2), "{program}: {err}");
            assert!(err.contains(fix), "{program}: {err}");
            assert!(!err.contains("sums differ"), "{program}: {err}");
            // "1/0" no more: the job and the source are named.
            assert!(
                text.contains(&format!("worker: job 1, source {src}:")),
                "{text}"
            );
        }
        server_report(server);
    }
}

/// `--control` and `--trace` on a server: the control plane answers while workers
/// aggregate (stats, the jobs, metrics), and the trace writes exactly its limit of records,
/// each a JSON object with the packet's verdict, to its file.
#[test]
fn a_server_answers_its_control_plane_and_writes_its_trace() {
    use pfemu::lab::control::request;
    use pfemu::lab::trace::{TraceFormat, TraceSpec};

    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-trace");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    let cfg = ServeConfig {
        trace: Some(TraceSpec {
            limit: 5,
            format: TraceFormat::Json,
            path: Some(path.clone()),
            ..TraceSpec::default()
        }),
        ..no_timeouts(config(Aggregation::TrioMl, &["1:2"]))
    };
    let (addr, control, stop, h) = start_with_control(cfg);
    let r = Run::ints(1, &[0, 1], 4 * 256, 7);
    check_exact(&r, &run_workers(addr, &r));

    let (status, body) = request(&control, "GET", "/stats", None).unwrap();
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(stats["packets_in"].as_u64().unwrap() >= 8, "{stats}");
    let (status, body) = request(&control, "POST", "/targets/jobs/list", None).unwrap();
    assert_eq!(status, 200, "{body}");
    let jobs: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(jobs[0]["job_id"], 1, "{jobs}");
    assert_eq!(jobs[0]["sources"], serde_json::json!([0, 1]), "{jobs}");
    let (status, metrics) = request(&control, "GET", "/metrics", None).unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("pfemu_in_flight"), "{metrics}");

    stop.stop();
    let rep = h.join().unwrap();
    assert_eq!(rep.trace.map(|t| (t.written, t.lost)), Some((5, 0)));
    let text = std::fs::read_to_string(&path).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 5, "{text}");
    for r in &records {
        assert!(r["verdict"].is_string(), "{r}");
        assert!(!r["instructions"].as_array().unwrap().is_empty(), "{r}");
    }
    // The control plane stopped with the server.
    assert!(request(&control, "GET", "/stats", None).is_err());
}

/// A first-level server whose job is removed and added again through its control plane.
/// The job added takes the server's settings for its jobs (its Results go upstream as
/// source 0), and its first run has the removed job's run id here: it must still join a
/// new run above, or the upstream aggregator answers its Results with the removed job's
/// kept sums.
#[test]
fn a_job_added_again_below_joins_a_new_run_above() {
    use pfemu::lab::control::request;
    use serde_json::json;

    let (upper, stop_upper, upper_m, upper_h) =
        start_monitored(config(Aggregation::TrioMl, &["1:1"]));
    let cfg = ServeConfig {
        upstream: Some(upper),
        // As the job added again (through the control plane) does.
        first_run: Some(1),
        ..no_timeouts(config(Aggregation::TrioMl, &["1:2"]))
    };
    let (addr, control, stop, h) = start_with_control(cfg);
    let call = |command: &str, args: serde_json::Value| {
        let (status, body) = request(
            &control,
            "POST",
            &format!("/targets/jobs/{command}"),
            Some(&args),
        )
        .unwrap();
        assert_eq!(status, 200, "{command}: {body}");
        body
    };
    let before = call("list", json!({}));

    let mut run_ids = Vec::new();
    let mut upper_runs = Vec::new();
    let mut retransmitted = 0;
    for seed in [1, 2] {
        if seed == 2 {
            call("remove", json!({ "job_id": 1 }));
            call("add", json!({ "job_id": 1, "sources": [0, 1] }));
            assert_eq!(
                call("list", json!({})),
                before,
                "the job added is as the first"
            );
        }
        let r = Run::ints(1, &[0, 1], 4 * 256, seed);
        let want = serve::expected_int_sums(seed, &r.sources, r.gradients);
        for (w, rep) in run_workers(addr, &r) {
            assert_eq!(w.sums().len(), want.len());
            let wrong = w.sums().iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(wrong, 0, "run {seed}: sums not of this run's gradients");
            run_ids.push(rep.run_id);
            retransmitted += rep.stats.retransmitted;
        }
        upper_runs.push(upper_m.trio_ml().job_state(1).unwrap().run_id);
    }
    assert!(
        run_ids.iter().all(|&id| id == run_ids[0]),
        "the job added again starts at the same run id here: {run_ids:?}"
    );
    // A run above for each (a Join sent again while unanswered gets the same run).
    assert!(upper_runs[0] != upper_runs[1], "{upper_runs:?}");
    stop.stop();
    stop_upper.stop();
    let below = h.join().unwrap();
    assert!(below.engine.is_conserved());
    let up = upper_h.join().unwrap();
    assert!(up.engine.is_conserved());
    let d = &up.engine.dropped_by_reason;
    let joins = below.front_end.upstream_joins_sent;
    let answered = d.get("join_answered").copied().unwrap_or(0);
    assert!((2..=joins).contains(&answered), "{joins} Joins sent: {d:?}");
    // The second run's Results were not taken above for retransmissions of the first's:
    // only a worker's own retransmission sends a kept Result up again.
    let again = d.get("retransmit_answered").copied().unwrap_or(0);
    assert!(
        again <= retransmitted,
        "{retransmitted} retransmitted: {d:?}"
    );
}

/// Options out of range are refused at once, naming the option: before the worker sends
/// anything (a worker that went on would wait for the server, or run the whole allreduce
/// first), and before the server serves.
#[test]
fn options_out_of_range_are_refused_by_name() {
    // A server that never answers: nothing may reach it.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = silent.local_addr().unwrap().to_string();
    for (args, option) in [
        // Its nanoseconds do not fit 64 bits (they wrapped to about 0.45 ms).
        (["--retransmit-ms", "18446744073710"], "--retransmit-ms"),
        (["--drop-every", "0"], "--drop-every"),
        (["--workers", "0"], "--workers"),
    ] {
        let mut all = vec!["--server", &server, "--src", "0", "--give-up-s", "30"];
        all.extend(args);
        let out = worker_process(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&format!("`{option}`")), "{args:?}: {err}");
    }
    silent.set_nonblocking(true).unwrap();
    assert!(
        silent.recv(&mut [0u8; 64]).is_err(),
        "a refused worker sent a datagram"
    );
    // The largest value that fits is taken.
    let mut all = vec!["--server", &server, "--src", "0", "--give-up-s", "0.2"];
    all.extend(["--retransmit-ms", "18446744073709"]);
    let err = String::from_utf8_lossy(&worker_process(&all).stderr).into_owned();
    assert!(!err.contains("--retransmit-ms"), "{err}");

    // The server: an idle exit of 0 (it stopped after the first receive) or past 10^9 s
    // (taken, unlike every other option in milliseconds), and an upstream that is the
    // server itself (its Joins went to itself). `--seconds` ends a server that is not
    // refused.
    for args in [
        &["--listen", "127.0.0.1:0", "--idle-exit-ms", "0"][..],
        &["--listen", "127.0.0.1:0", "--idle-exit-ms", "1000000000001"],
        &["--listen", "127.0.0.1:9", "--upstream", "127.0.0.1:9"],
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--job", "1:1", "--seconds", "5"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        let option = args[2];
        assert!(err.contains(&format!("`{option}`")), "{args:?}: {err}");
    }
    // The same through the library, with the port the system chose: the unspecified
    // address listens on loopback too.
    let port = UdpSocket::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = ServeConfig {
        listen: SocketAddr::from(([0, 0, 0, 0], port)),
        upstream: Some(SocketAddr::from(([127, 0, 0, 1], port))),
        ..config(Aggregation::TrioMl, &["1:1"])
    };
    match Server::bind(&cfg) {
        Err(serve::ServeError::Config { setting, reason }) => {
            assert_eq!(setting, "upstream", "{reason}")
        }
        // Another process took the port meanwhile: nothing to check.
        Err(serve::ServeError::Io { .. }) => eprintln!("port {port} taken meanwhile: skipped"),
        other => panic!("not refused: {other:?}"),
    }
}

/// A worker whose packets are larger than the server takes (`--grads-per-packet` above its
/// `--block-grad-max`: the engine drops them without an answer) is told that this may be
/// why no Result came, not only that the server's window may be too small; the server's
/// report warns of the packets it dropped so, naming both options.
#[test]
fn a_worker_whose_packets_are_too_large_is_told_which_options_to_check() {
    let (addr, stop, h) = start(config_with(Aggregation::TrioMl, &["1:1"], |s| {
        s.block_grad_max = 256
    }));
    let mut w = Worker::new(serve::worker_config(1, 0, 1024, 4, None), vec![1; 2048]).unwrap();
    let cfg = ClientConfig {
        give_up_after: Duration::from_secs(2),
        ..ClientConfig::new(addr)
    };
    let e = serve::allreduce(&cfg, &mut w).unwrap_err();
    let msg = e.to_string();
    let serve::ServeError::NoProgress(p) = e else {
        panic!("not NoProgress: {msg}")
    };
    // The Join was answered: the server is there.
    assert!(!p.joining && p.datagrams > 0, "{msg}");
    assert!(
        msg.contains("--block-grad-max") && msg.contains("--grads-per-packet 1024"),
        "{msg}"
    );
    stop.stop();
    let rep = h.join().unwrap();
    assert!(rep.engine.drops("block_grad_max") >= 2, "{:?}", rep.engine);
    // The worker cannot know (no answer tells it), but the server's report says why.
    let warning = rep
        .warnings
        .iter()
        .find(|w| w.contains("block_grad_max"))
        .unwrap_or_else(|| panic!("no warning: {:?}", rep.warnings));
    assert!(
        warning.contains("--block-grad-max 256") && warning.contains("--grads-per-packet 256"),
        "{warning}"
    );
}

/// A first-level server whose job above moves on to another run (here: the upper server
/// restarts, its job starting afresh) while the job below stays in its run: the upper
/// server answers its Results with Superseded, and it joins the job above again, holding
/// its Results meanwhile; the member's retransmission brings the lost Result up again in
/// the new run, and it comes back down. (It used to count the Superseded and go on sending
/// in the old run: its members waited in vain.) The restarted upper server's job starts at
/// another run, or at the same one (as the random draw does 1 time in 15): the first-level
/// server has not joined the new instance, which answers Superseded naming run 0 (it used
/// to take the Results of the run it no longer knew).
#[test]
fn a_first_level_server_joins_again_when_the_job_above_moves_on() {
    for again_at in [2, 1] {
        joins_again_when_the_job_above_moves_on(again_at);
    }
}

fn joins_again_when_the_job_above_moves_on(again_at: u8) {
    use pfemu::microcode::trio_ml::host::WorkerConfig;
    use pfemu::microcode::trio_ml::wire::Control;

    let upper_cfg = config(Aggregation::TrioMl, &["1:1"]);
    let (up, up_stop, up_h) = start(ServeConfig {
        first_run: Some(1),
        ..upper_cfg.clone()
    });
    let (a, a_stop, a_m, a_h) = start_monitored(ServeConfig {
        upstream: Some(up),
        ..config(Aggregation::TrioMl, &["1:1"])
    });
    // The member, by hand: it stays in one run all along.
    let member = UdpSocket::bind("127.0.0.1:0").unwrap();
    let deadline = Duration::from_secs(30);
    // Sends `d` every 100 ms until a datagram that `answers` comes back.
    let ask = |d: &[u8], what: &str, answers: &dyn Fn(&TrioMlHdrFields) -> bool| {
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < deadline, "no {what}: {:?}", a_m.stats());
            member.send_to(d, a).unwrap();
            let t = Instant::now();
            while let Some(r) = recv_within(&member, Duration::from_millis(100)) {
                let hdr = serve::datagram_header(&r).unwrap();
                if answers(&hdr) {
                    return r;
                }
                if t.elapsed() > Duration::from_millis(100) {
                    break;
                }
            }
        }
    };
    let ep = WorkerConfig::new(1, 0, "10.0.0.100".parse().unwrap()).endpoints;
    let join = wire::join_packet(ep, 1, 0, 0x5eed)[wire::TRIO_ML_HDR_AT..].to_vec();
    let joined = ask(&join, "Joined", &|h| {
        matches!(Control::of(h), Some(Control::Joined { nonce: 0x5eed, .. }))
    });
    let run = serve::datagram_header(&joined).unwrap().run_id;
    // Block `b` of this run, until its Result comes back.
    let block = |b: u32| {
        let mut d = datagram(1, 0, b, &[b as i32 + 10, -7]);
        TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]).set_run_id(run);
        let r = ask(&d, "Result", &|h| !h.ctl && h.block_id == b);
        let hdr = serve::datagram_header(&r).unwrap();
        assert_eq!((hdr.run_id, hdr.src_cnt), (run, 1), "{hdr:?}");
        assert_eq!(wire::gradients(&r[TRIO_ML_HDR_LEN..]), [b as i32 + 10, -7]);
    };
    block(0);
    // The upper server restarts at the same address.
    up_stop.stop();
    up_h.join().unwrap();
    let again = Server::bind(&ServeConfig {
        listen: up,
        first_run: Some(again_at),
        ..upper_cfg
    })
    .unwrap();
    let up_stop = again.stop_handle();
    let up_h = std::thread::spawn(move || again.run(RUN_LIMITS));
    block(1);
    a_stop.stop();
    let f = a_h.join().unwrap().front_end;
    assert!(f.upstream_superseded >= 1, "{f:?}");
    // A Join for the run below, and one after the Superseded at least.
    assert!(f.upstream_joins_sent >= 2, "{f:?}");
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    up_stop.stop();
    let rep = up_h.join().unwrap();
    assert!(rep.engine.drops("join_answered") >= 1, "{:?}", rep.engine);
    // The new instance took none of the Results it had not been joined for.
    assert!(rep.front_end.not_joined >= 1, "{:?}", rep.front_end);
    assert_eq!(rep.engine.drops("stale_run"), 0, "{:?}", rep.engine);
}

/// A restarted server forgets its jobs' runs, and the workers of its last instance may still
/// send theirs. The front end takes a member's datagrams of a run only from the address it
/// joined this instance from, so such a worker's gradients are answered Superseded naming
/// run 0 (`not_joined`), never added to the new run's block nor sent its Results, whatever
/// run the new instance's job has: here the last instance's run 3 again (as the random draw
/// gives 1 time in 15: its gradients then went into the new run's block 1), another run,
/// and the same run with the old worker's own source joined again by a new process. The
/// new worker's block gets its gradients alone (a partial Result at the block timeout).
#[test]
fn a_restarted_server_never_takes_the_last_instances_workers() {
    use pfemu::microcode::trio_ml::host::WorkerConfig;
    use pfemu::microcode::trio_ml::wire::Control;

    let first = |run: Option<u8>| ServeConfig {
        first_run: run,
        ..config(Aggregation::TrioMl, &["1:2"])
    };
    let join = |src: u8, nonce: u32| {
        let ep = WorkerConfig::new(1, src, "10.0.0.9".parse().unwrap()).endpoints;
        wire::join_packet(ep, 1, src, nonce)[wire::TRIO_ML_HDR_AT..].to_vec()
    };
    let joined = |s: &UdpSocket| {
        let d = recv_within(s, Duration::from_secs(30)).expect("the Joined");
        Control::of(&serve::datagram_header(&d).unwrap())
    };
    let of_run = |src: u8, block: u32, grad: i32, run: u8| {
        let mut d = datagram(1, src, block, &[grad]);
        TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]).set_run_id(run);
        d
    };
    for (new_run, new_src) in [(3, 1), (4, 1), (3, 0)] {
        let case = format!("new instance at run {new_run}, new worker of source {new_src}");
        // The last instance, at run 3: the old worker (source 0) joins it.
        let (addr, stop, m, h) = start_monitored(first(Some(3)));
        let old = UdpSocket::bind("127.0.0.1:0").unwrap();
        send_paced(&old, &join(0, 77), addr, &m);
        assert_eq!(
            joined(&old),
            Some(Control::Joined {
                run_id: 3,
                nonce: 77
            })
        );
        stop.stop();
        h.join().unwrap();
        // (The monitor holds the instance's socket.)
        drop(m);
        // The next instance, at the same address: a new worker joins it.
        let again = Server::bind(&ServeConfig {
            listen: addr,
            ..first(Some(new_run))
        })
        .unwrap();
        let (stop, m) = (again.stop_handle(), again.monitor());
        let h = std::thread::spawn(move || again.run(RUN_LIMITS));
        let new = UdpSocket::bind("127.0.0.1:0").unwrap();
        send_paced(&new, &join(new_src, 78), addr, &m);
        assert_eq!(
            joined(&new),
            Some(Control::Joined {
                run_id: new_run,
                nonce: 78
            }),
            "{case}"
        );
        // The old worker sends on in its run 3: answered Superseded, naming no run.
        send_paced(&old, &of_run(0, 1, 6, 3), addr, &m);
        let answer = recv_within(&old, Duration::from_secs(30)).expect("an answer");
        assert_eq!(
            Control::of(&serve::datagram_header(&answer).unwrap()),
            Some(Control::Superseded { run_id: 0 }),
            "{case}: {answer:?}"
        );
        // The new worker's block 1 is its alone: a partial Result at the block timeout
        // (with the old worker's gradients in, it was complete at once, [16] of 2 sources).
        send_paced(&new, &of_run(new_src, 1, 10, new_run), addr, &m);
        let r = recv_within(&new, Duration::from_secs(30)).expect("the Result");
        let hdr = serve::datagram_header(&r).unwrap();
        assert_eq!(
            (hdr.ctl, hdr.block_id, hdr.run_id, hdr.src_cnt, hdr.degraded),
            (false, 1, new_run, 1, true),
            "{case}: {hdr:?}"
        );
        assert_eq!(wire::gradients(&r[TRIO_ML_HDR_LEN..]), [10], "{case}");
        // The old worker is no member here: the Result was not fanned out to it.
        assert_eq!(
            recv_within(&old, Duration::from_millis(300)),
            None,
            "{case}"
        );
        stop.stop();
        let rep = h.join().unwrap();
        let f = rep.front_end;
        assert_eq!(f.not_joined, 1, "{case}: {f:?}");
        assert_eq!(f.unaccounted(), 0, "{case}: {f:?}");
        assert_eq!(rep.engine.drops("stale_run"), 0, "{case}: {:?}", rep.engine);
        assert_eq!(rep.engine.drops("duplicate"), 0, "{case}: {:?}", rep.engine);
    }

    // Drawn at random per instance, in 1..=15: eight instances all alike would be one
    // draw in 15^7.
    let runs: std::collections::BTreeSet<u8> = (0..8)
        .map(|_| {
            let (_, stop, m, h) = start_monitored(first(None));
            let run = m.trio_ml().job_state(1).unwrap().run_id;
            stop.stop();
            h.join().unwrap();
            run
        })
        .collect();
    assert!(runs.iter().all(|r| (1..=15).contains(r)), "{runs:?}");
    assert!(runs.len() > 1, "{runs:?}");
    // A first run outside 1..=15 is refused by name.
    for bad in [0, 16] {
        match Server::bind(&first(Some(bad))) {
            Err(serve::ServeError::Config { setting, .. }) => assert_eq!(setting, "first_run"),
            other => panic!("{bad}: not refused: {other:?}"),
        }
    }
}

/// A job removed and added again through the control plane forgets its members' joins, in
/// the engine and at the front end alike: a worker that joined the job before is answered
/// Superseded (run 0) when it sends on, even in the run id the job's new life gives a new
/// worker (both run 1 here), and is sent none of the new run's Results. Once it joins
/// again, it is a member of the new life as the new worker is: their gradients make one
/// whole Result, sent to both.
#[test]
fn a_job_added_again_forgets_its_members_joins() {
    use pfemu::microcode::trio_ml::host::WorkerConfig;
    use pfemu::microcode::trio_ml::wire::Control;
    use serde_json::json;

    let (addr, control, stop, h) = start_with_control(ServeConfig {
        first_run: Some(1),
        ..config(Aggregation::TrioMl, &["1:2"])
    });
    let call = |command: &str, args: serde_json::Value| jobs_call(&control, command, args).0;
    let join = |s: &UdpSocket, src: u8, nonce: u32| {
        let ep = WorkerConfig::new(1, src, "10.0.0.9".parse().unwrap()).endpoints;
        s.send_to(
            &wire::join_packet(ep, 1, src, nonce)[wire::TRIO_ML_HDR_AT..],
            addr,
        )
        .unwrap();
        let d = recv_within(s, Duration::from_secs(30)).expect("the Joined");
        Control::of(&serve::datagram_header(&d).unwrap())
    };
    let old = UdpSocket::bind("127.0.0.1:0").unwrap();
    assert_eq!(
        join(&old, 0, 7),
        Some(Control::Joined {
            run_id: 1,
            nonce: 7
        })
    );
    assert_eq!(call("remove", json!({ "job_id": 1 })), 200);
    assert_eq!(call("add", json!({ "job_id": 1, "sources": [0, 1] })), 200);
    let new = UdpSocket::bind("127.0.0.1:0").unwrap();
    assert_eq!(
        join(&new, 1, 8),
        Some(Control::Joined {
            run_id: 1,
            nonce: 8
        })
    );
    let of_run_1 = |src: u8, block: u32, grad: i32| {
        let mut d = datagram(1, src, block, &[grad]);
        TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]).set_run_id(1);
        d
    };
    old.send_to(&of_run_1(0, 0, 6), addr).unwrap();
    let answer = recv_within(&old, Duration::from_secs(30)).expect("an answer");
    assert_eq!(
        Control::of(&serve::datagram_header(&answer).unwrap()),
        Some(Control::Superseded { run_id: 0 })
    );
    // The new worker's block 0 is its alone: a partial Result at the block timeout.
    new.send_to(&of_run_1(1, 0, 10), addr).unwrap();
    let r = recv_within(&new, Duration::from_secs(30)).expect("the Result");
    let hdr = serve::datagram_header(&r).unwrap();
    assert_eq!((hdr.ctl, hdr.src_cnt), (false, 1), "{hdr:?}");
    assert_eq!(wire::gradients(&r[TRIO_ML_HDR_LEN..]), [10]);
    assert_eq!(recv_within(&old, Duration::from_millis(300)), None);
    // The old worker joins again, with its new process's nonce: a member of the new run.
    assert_eq!(
        join(&old, 0, 9),
        Some(Control::Joined {
            run_id: 1,
            nonce: 9
        })
    );
    old.send_to(&of_run_1(0, 1, 6), addr).unwrap();
    new.send_to(&of_run_1(1, 1, 10), addr).unwrap();
    for (who, s) in [("the member joined again", &old), ("the new member", &new)] {
        let r = recv_within(s, Duration::from_secs(30)).expect(who);
        let hdr = serve::datagram_header(&r).unwrap();
        assert_eq!((hdr.ctl, hdr.src_cnt), (false, 2), "{who}: {hdr:?}");
        assert_eq!(wire::gradients(&r[TRIO_ML_HDR_LEN..]), [16], "{who}");
    }
    stop.stop();
    let f = h.join().unwrap().front_end;
    assert_eq!((f.not_joined, f.unaccounted()), (1, 0), "{f:?}");
}

/// The front end's members (each job's sources, with their ingress ports) are fixed when
/// the server starts, so the control plane refuses to add a job the server did not start
/// with, or sources outside its job's (it used to add them to the engine, whose sources'
/// datagrams then never reached them); a job removed and added again with its sources is
/// served.
#[test]
fn the_control_plane_refuses_jobs_the_server_cannot_serve() {
    use serde_json::json;

    let (addr, control, stop, h) =
        start_with_control(no_timeouts(config(Aggregation::TrioMl, &["1:2"])));
    let call = |command: &str, args: serde_json::Value| jobs_call(&control, command, args);
    let (status, body) = call("add", json!({ "job_id": 9, "sources": [0] }));
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("job 9") && body.contains("--job 9:N"),
        "{body}"
    );
    assert_eq!(call("remove", json!({ "job_id": 1 })).0, 200);
    let (status, body) = call("add", json!({ "job_id": 1, "sources": [0, 1, 5] }));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("source 5") && body.contains("0..2"), "{body}");
    let (status, body) = call("add", json!({ "job_id": 1, "sources": [0, 1] }));
    assert_eq!(status, 200, "{body}");
    let r = Run::ints(1, &[0, 1], 4 * 256, 3);
    check_exact(&r, &run_workers(addr, &r));
    stop.stop();
    assert!(h.join().unwrap().engine.is_conserved());
}

/// A frame the engine sends out of the stranger port answers a datagram from a source
/// outside its job at the front end: it goes to nobody (counted unroutable), never to the
/// job's members. (Here the engine's job is given a source the front end does not have,
/// behind the control plane's back.)
#[test]
fn answers_to_strangers_are_never_fanned_out_to_the_members() {
    use pfemu::microcode::trio_ml::host::WorkerConfig;

    let cfg = config(Aggregation::TrioMl, &["1:2"]);
    let job = cfg.setup.job_config(1, "10.0.0.0".parse().unwrap());
    let (addr, stop, m, h) = start_monitored(cfg);
    let trio = m.trio_ml();
    trio.remove_job(1).unwrap();
    trio.add_job(&pfemu::microcode::trio_ml::JobConfig {
        sources: vec![0, 1, 5],
        ..job
    })
    .unwrap();
    // Member 0 joins: the front end knows its address.
    let member = UdpSocket::bind("127.0.0.1:0").unwrap();
    let join = |src: u8, nonce: u32| {
        let ep = WorkerConfig::new(1, src, "10.0.0.9".parse().unwrap()).endpoints;
        wire::join_packet(ep, 1, src, nonce)[wire::TRIO_ML_HDR_AT..].to_vec()
    };
    send_paced(&member, &join(0, 1), addr, &m);
    assert!(
        recv_within(&member, Duration::from_secs(30)).is_some(),
        "the Joined"
    );
    // (The sink counts a datagram once its send returned, which may be after it arrived.)
    let t0 = Instant::now();
    while m.stats().datagrams_out < 1 {
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", m.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    // Source 5, a stranger at the front end, joins: the engine answers out of the stranger
    // port.
    let before = m.stats();
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    send_paced(&stranger, &join(5, 2), addr, &m);
    let t0 = Instant::now();
    let after = loop {
        let f = m.stats();
        if f.results > before.results
            && (f.unroutable > before.unroutable || f.datagrams_out > before.datagrams_out)
        {
            break f;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no answer: {f:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(after.strangers, 1, "{after:?}");
    assert_eq!(after.unroutable, before.unroutable + 1, "{after:?}");
    assert_eq!(after.datagrams_out, before.datagrams_out, "{after:?}");
    stop.stop();
    let f = h.join().unwrap().front_end;
    assert_eq!(f.datagrams_out, before.datagrams_out, "{f:?}");
    assert_eq!(f.unaccounted(), 0, "{f:?}");
}

/// The payload of a Join of job 1 from source `src` with `nonce`; naming run `run` (not 0),
/// a rejoin of that run from a new address.
fn join_payload(src: u8, nonce: u32, run: u8) -> Vec<u8> {
    use pfemu::microcode::trio_ml::host::WorkerConfig;
    let ep = WorkerConfig::new(1, src, "10.0.0.9".parse().unwrap()).endpoints;
    let mut d = wire::join_packet(ep, 1, src, nonce)[wire::TRIO_ML_HDR_AT..].to_vec();
    TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]).set_run_id(run);
    d
}

/// A datagram of job 1 from source `src`: block `block`, one gradient, run `run`.
fn of_run(src: u8, block: u32, grad: i32, run: u8) -> Vec<u8> {
    let mut d = datagram(1, src, block, &[grad]);
    TrioMlHdr::new_unchecked(&mut d[..TRIO_ML_HDR_LEN]).set_run_id(run);
    d
}

/// The header of the next datagram `s` receives (within 30 s: a hang guard).
fn next_header(s: &UdpSocket, what: &str) -> (TrioMlHdrFields, Vec<u8>) {
    let d = recv_within(s, Duration::from_secs(30)).unwrap_or_else(|| panic!("no {what}"));
    (serve::datagram_header(&d).unwrap(), d)
}

/// A client of the paper's header alone (run 0) claiming a source that joined the job's
/// run used to be taken from any address: it moved the member's address to its own, so
/// the member's Results went to it, and the joined worker got none. Once a member has
/// joined, its datagrams count from its joined address alone, with or without a run; the
/// impostor is answered Superseded (run 0), and the joined workers get their sums.
#[test]
fn a_client_without_a_run_cannot_take_a_joined_members_place() {
    use pfemu::microcode::trio_ml::wire::Control;

    let (addr, stop, m, h) = start_monitored(ServeConfig {
        first_run: Some(2),
        ..config(Aggregation::TrioMl, &["1:2"])
    });
    let (w0, w1, other) = (
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    );
    let joined = |nonce| Some(Control::Joined { run_id: 2, nonce });
    send_paced(&w0, &join_payload(0, 11, 0), addr, &m);
    assert_eq!(Control::of(&next_header(&w0, "Joined").0), joined(11));
    // Source 0's gradients and a request for a kept Result, without a run, from elsewhere.
    for d in [of_run(0, 0, 100, 0), datagram_gen(1, 0, 0, 0, &[100])] {
        send_paced(&other, &d, addr, &m);
        let (hdr, _) = next_header(&other, "answer");
        assert_eq!(
            Control::of(&hdr),
            Some(Control::Superseded { run_id: 0 }),
            "{hdr:?}"
        );
    }
    send_paced(&w1, &join_payload(1, 12, 0), addr, &m);
    assert_eq!(Control::of(&next_header(&w1, "Joined").0), joined(12));
    send_paced(&w0, &of_run(0, 0, 1, 2), addr, &m);
    send_paced(&w1, &of_run(1, 0, 2, 2), addr, &m);
    for (w, name) in [(&w0, "source 0"), (&w1, "source 1")] {
        let (hdr, d) = next_header(w, &format!("Result for {name}"));
        assert_eq!(
            (hdr.ctl, hdr.run_id, hdr.src_cnt, hdr.degraded),
            (false, 2, 2, false),
            "{name}: {hdr:?}"
        );
        assert_eq!(wire::gradients(&d[TRIO_ML_HDR_LEN..]), [3], "{name}");
    }
    stop.stop();
    let rep = h.join().unwrap();
    let f = rep.front_end;
    assert_eq!((f.not_joined, f.readdressed, f.peers), (2, 0, 2), "{f:?}");
    assert_eq!((f.injected, f.unaccounted()), (4, 0), "{f:?}");
    assert_conserved(&rep.engine);
}

/// A worker whose address changes while it runs (a NAT rebinding) is answered Superseded
/// (run 0) from its new address, as the last instance's workers are; it joins its run
/// again from there with a Join naming the run and the nonce it joined with, which the
/// server takes from the member's nonce alone: another process of the source (or the last
/// instance's worker, which joined with another nonce) is refused, with its nonce in the
/// answer. Rejoined, the worker's gradients count from the new address, and its Results go
/// there.
#[test]
fn a_worker_whose_address_changes_rejoins_its_run_with_its_nonce_alone() {
    use pfemu::microcode::trio_ml::wire::Control;

    let (addr, stop, m, h) = start_monitored(ServeConfig {
        first_run: Some(5),
        ..config(Aggregation::TrioMl, &["1:1"])
    });
    let (before, after) = (
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    );
    send_paced(&before, &join_payload(0, 41, 0), addr, &m);
    assert_eq!(
        Control::of(&next_header(&before, "Joined").0),
        Some(Control::Joined {
            run_id: 5,
            nonce: 41
        })
    );
    // Rebound: its gradients from the new address are refused.
    send_paced(&after, &of_run(0, 0, 7, 5), addr, &m);
    let (hdr, _) = next_header(&after, "answer to the gradients");
    assert_eq!(
        (Control::of(&hdr), hdr.block_id),
        (Some(Control::Superseded { run_id: 0 }), 0),
        "{hdr:?}"
    );
    // A rejoin with another nonce is refused, naming that nonce.
    send_paced(&after, &join_payload(0, 42, 5), addr, &m);
    let (hdr, _) = next_header(&after, "answer to the wrong rejoin");
    assert_eq!(
        (Control::of(&hdr), hdr.block_id),
        (Some(Control::Superseded { run_id: 0 }), 42),
        "{hdr:?}"
    );
    // The worker's own rejoin is answered Joined, with its run.
    send_paced(&after, &join_payload(0, 41, 5), addr, &m);
    assert_eq!(
        Control::of(&next_header(&after, "Joined").0),
        Some(Control::Joined {
            run_id: 5,
            nonce: 41
        })
    );
    send_paced(&after, &of_run(0, 0, 7, 5), addr, &m);
    let (hdr, d) = next_header(&after, "Result");
    assert_eq!(
        (hdr.ctl, hdr.block_id, hdr.run_id, hdr.src_cnt),
        (false, 0, 5, 1),
        "{hdr:?}"
    );
    assert_eq!(wire::gradients(&d[TRIO_ML_HDR_LEN..]), [7]);
    // The old address is no member any more: its gradients of the run are refused.
    send_paced(&before, &of_run(0, 1, 7, 5), addr, &m);
    let (hdr, _) = next_header(&before, "answer at the old address");
    assert_eq!(Control::of(&hdr), Some(Control::Superseded { run_id: 0 }));
    stop.stop();
    let rep = h.join().unwrap();
    let f = rep.front_end;
    assert_eq!((f.not_joined, f.readdressed), (3, 1), "{f:?}");
    assert_eq!((f.injected, f.unaccounted()), (3, 0), "{f:?}");
    assert_eq!(rep.engine.drops("join_answered"), 2, "{:?}", rep.engine);
    assert_eq!(rep.engine.drops("stale_run"), 0, "{:?}", rep.engine);
}

/// A NAT between a worker and the server, on loopback: what the worker sends to its front
/// socket goes on to `server` from an outside socket, and what comes back to that socket
/// goes to the worker. After `rebind_after` datagrams from the worker the NAT rebinds: it
/// sends from a second outside socket (another source port), and drops what still comes to
/// the first, whose mapping it forgot. Runs until `stop`.
fn nat<'scope>(
    front: &'scope UdpSocket,
    server: SocketAddr,
    rebind_after: u64,
    stop: &'scope std::sync::atomic::AtomicBool,
    s: &'scope std::thread::Scope<'scope, '_>,
) {
    nat_watched(front, server, rebind_after, stop, s, |_| {});
}

/// [`nat`], calling `coming_back` with each datagram it passes back to the worker, just
/// before it does.
fn nat_watched<'scope>(
    front: &'scope UdpSocket,
    server: SocketAddr,
    rebind_after: u64,
    stop: &'scope std::sync::atomic::AtomicBool,
    s: &'scope std::thread::Scope<'scope, '_>,
    coming_back: impl Fn(&[u8]) + Send + Sync + 'scope,
) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let coming_back = std::sync::Arc::new(coming_back);
    let outside = [
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    ];
    let sent = std::sync::Arc::new(AtomicU64::new(0));
    let worker = std::sync::Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
    for sock in [front].into_iter().chain(&outside).collect::<Vec<_>>() {
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
    }
    let outside = std::sync::Arc::new(outside);
    {
        let (outside, sent, worker) = (outside.clone(), sent.clone(), worker.clone());
        s.spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !stop.load(Ordering::Acquire) {
                let Ok((n, from)) = front.recv_from(&mut buf) else {
                    continue;
                };
                *worker.lock().unwrap() = Some(from);
                let k = usize::from(sent.fetch_add(1, Ordering::AcqRel) >= rebind_after);
                let _ = outside[k].send_to(&buf[..n], server);
            }
        });
    }
    for k in 0..2 {
        let (outside, sent, worker) = (outside.clone(), sent.clone(), worker.clone());
        let coming_back = coming_back.clone();
        s.spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !stop.load(Ordering::Acquire) {
                let Ok(n) = outside[k].recv(&mut buf) else {
                    continue;
                };
                let rebound = sent.load(Ordering::Acquire) > rebind_after;
                let to = *worker.lock().unwrap();
                if let (Some(to), true) = (to, (k == 1) == rebound) {
                    coming_back(&buf[..n]);
                    let _ = front.send_to(&buf[..n], to);
                }
            }
        });
    }
}

/// The NAT tests' server (job 1, one source, its first run numbered 4) and the run its
/// worker does.
fn nat_server() -> (SocketAddr, StopHandle, JoinHandle<ServeReport>, Run) {
    let (addr, stop, h) = start(ServeConfig {
        first_run: Some(4),
        ..config(Aggregation::TrioMl, &["1:1"])
    });
    (addr, stop, h, Run::ints(1, &[0], 256 * 32, 9))
}

/// The NAT tests' worker: source 0 of job 1, 256 gradients a packet, a window of 8.
fn nat_worker(r: &Run) -> Worker {
    Worker::new(
        serve::worker_config(1, 0, 256, 8, r.retransmit),
        serve::seeded_ints(r.seed, 0, r.gradients),
    )
    .unwrap()
}

/// The NAT tests' client of the NAT at `nat_addr` (no GSO or GRO: one datagram a
/// message, as the NAT relays them), giving up after `give_up_after` by `clock`.
fn nat_client(
    nat_addr: SocketAddr,
    give_up_after: Duration,
    clock: Option<Arc<dyn pfemu::timer::Clock>>,
) -> ClientConfig {
    ClientConfig {
        give_up_after,
        patience_clock: clock,
        gso: false,
        gro: false,
        ..ClientConfig::new(nat_addr)
    }
}

/// `serve::allreduce` (`pfemu worker`) through a NAT that rebinds mid-run: the worker's
/// gradients from the new port are refused (Superseded, run 0), it rejoins its run with its
/// nonce, and its refused chunks, sent again, complete its sums exactly.
#[test]
fn an_allreduce_through_a_nat_that_rebinds_gets_its_sums() {
    use std::sync::atomic::AtomicBool;

    let (addr, stop, h, r) = nat_server();
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    let nat_addr = front.local_addr().unwrap();
    let nat_stop = AtomicBool::new(false);
    let (w, rep) = std::thread::scope(|s| {
        // The Join and four chunks before the rebinding.
        nat(&front, addr, 5, &nat_stop, s);
        let mut w = nat_worker(&r);
        let ccfg = nat_client(nat_addr, Duration::from_secs(30), None);
        let rep = serve::allreduce(&ccfg, &mut w);
        nat_stop.store(true, std::sync::atomic::Ordering::Release);
        (w, rep.unwrap())
    });
    check_exact(&r, &[(w, rep.clone())]);
    assert!(rep.rejoins >= 1, "{rep:?}");
    assert_eq!(rep.run_id, 4, "{rep:?}");
    stop.stop();
    let rep = h.join().unwrap();
    let f = rep.front_end;
    assert!(f.not_joined >= 1 && f.readdressed >= 1, "{f:?}");
    assert_eq!(f.unaccounted(), 0, "{f:?}");
    assert_eq!(rep.engine.drops("stale_run"), 0, "{:?}", rep.engine);
}

/// A rejoin is progress, however long it took: the client's patience counts from its end.
/// The client's clock is the test's: no time passes but what the NAT says. When the first
/// refusal (Superseded, run 0) comes back after the rebinding, 6 s have passed since the
/// last Result; when the Joined answering the rejoin comes back, 6 s more, so the rejoin
/// took 6 of the 10 s the client waits. Counted from the last Result (12 s), the client
/// would give up right after the rejoin; counted from the rejoin, it goes on and gets its
/// sums.
#[test]
fn a_rejoin_that_took_most_of_the_clients_patience_is_progress() {
    use pfemu::microcode::trio_ml::wire::Control;
    use pfemu::timer::Clock;
    use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
    use std::sync::mpsc::RecvTimeoutError;

    let (addr, stop, h, r) = nat_server();
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    let nat_addr = front.local_addr().unwrap();
    let nat_stop = AtomicBool::new(false);
    let clock = Arc::new(ManualClock::new());
    const SIX_S: u64 = 6_000_000_000;
    // 0: nothing refused yet; 1: the first refusal came back; 2: the rejoin was answered.
    let stage = AtomicU8::new(0);
    let (w, rep) = std::thread::scope(|s| {
        let coming_back = |d: &[u8]| {
            let Ok(hdr) = serve::datagram_header(d) else {
                return;
            };
            let next = match Control::of(&hdr) {
                Some(Control::Superseded { run_id: 0 }) => 1,
                Some(Control::Joined { .. }) => 2,
                _ => return,
            };
            if stage
                .compare_exchange(next - 1, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                clock.advance(SIX_S);
            }
        };
        // The Join and four chunks before the rebinding.
        nat_watched(&front, addr, 5, &nat_stop, s, coming_back);
        // A hang guard: a run stuck for a minute of real time is made to give up. The
        // client's end drops `finished`, which ends the guard's wait at once.
        let (finished, ended) = std::sync::mpsc::channel::<()>();
        let guard_clock = &clock;
        let guard = s.spawn(move || {
            if ended.recv_timeout(Duration::from_secs(60)) == Err(RecvTimeoutError::Timeout) {
                guard_clock.advance(1_000 * SIX_S);
            }
        });
        let mut w = nat_worker(&r);
        let ccfg = nat_client(nat_addr, Duration::from_secs(10), Some(clock.clone()));
        let rep = serve::allreduce(&ccfg, &mut w);
        drop(finished);
        nat_stop.store(true, Ordering::Release);
        guard.join().unwrap();
        (w, rep)
    });
    assert_eq!(
        (stage.load(Ordering::Acquire), clock.now_ns()),
        (2, 2 * SIX_S),
        "the refusal and the rejoin each took 6 s, nothing else moved the clock"
    );
    let rep = rep.expect("the client goes on after a rejoin");
    check_exact(&r, &[(w, rep.clone())]);
    assert!(rep.rejoins >= 1, "{rep:?}");
    stop.stop();
    let rep = h.join().unwrap();
    assert_eq!(rep.front_end.unaccounted(), 0, "{:?}", rep.front_end);
}

/// A first-level server stopping right after a Result went up waits for its answer too: the
/// upper aggregator answers after the stop (a complete block up there waits for its other
/// sources, a partial one for its timeout). It used to await only what went up while
/// stopping, so it returned without reading that answer and its member never got it.
/// Played by the test as the upper aggregator: never answered, the Result is counted
/// unanswered; answered after the stop, it comes down to the member before the server
/// returns.
#[test]
fn a_stopping_first_level_server_awaits_the_answers_to_results_sent_just_before() {
    for answer in [false, true] {
        let upper = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, stop, m, h) = start_monitored(ServeConfig {
            upstream: Some(upper.local_addr().unwrap()),
            upstream_src: 3,
            // Never answered: the wait elapses (its length only makes the test longer).
            // Answered: a hang guard, however long the answer takes here.
            stop_upstream_wait: Duration::from_millis(if answer { 60_000 } else { 200 }),
            ..config(Aggregation::TrioMl, &["1:1"])
        });
        // The member's block is complete at once (one source, no run): its Result goes up
        // before the stop.
        let member = UdpSocket::bind("127.0.0.1:0").unwrap();
        send_paced(&member, &datagram(1, 0, 7, &[4, 5]), a, &m);
        let (hdr, up) = next_header(&upper, "Result sent up");
        assert_eq!(
            (hdr.block_id, hdr.src_id, hdr.ctl),
            (7, 3, false),
            "{hdr:?}"
        );
        stop.stop();
        if answer {
            let mut down = up.clone();
            TrioMlHdr::new_unchecked(&mut down[..TRIO_ML_HDR_LEN]).set_src_cnt(2);
            upper.send_to(&down, a).unwrap();
        }
        let rep = h.join().unwrap();
        let f = &rep.front_end;
        assert_eq!(f.unaccounted(), 0, "{f:?}");
        if answer {
            assert_eq!(
                (f.upstream_results_in, f.upstream_unanswered),
                (1, 0),
                "{f:?}"
            );
            let (hdr, d) = next_header(&member, "the upper's answer");
            assert_eq!((hdr.block_id, hdr.src_cnt), (7, 2), "{hdr:?}");
            assert_eq!(wire::gradients(&d[TRIO_ML_HDR_LEN..]), [4, 5]);
        } else {
            assert_eq!(
                (f.upstream_results_in, f.upstream_unanswered),
                (0, 1),
                "{f:?}"
            );
        }
    }
}

/// The Python client through a NAT that rebinds mid-run: it rejoins its run with its nonce
/// (as `pfemu worker` does) and gets its sums.
#[test]
fn the_python_client_rejoins_after_a_nat_rebinding() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some(script) = python_client() else {
        return;
    };
    let (addr, stop, h) = start(ServeConfig {
        first_run: Some(6),
        ..config(Aggregation::TrioMl, &["5:1"])
    });
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    let nat_addr = front.local_addr().unwrap().to_string();
    let nat_stop = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        // The Join and three chunks before the rebinding.
        nat(&front, addr, 4, &nat_stop, s);
        let out = Command::new("python3")
            .arg(script)
            .args(["--server", &nat_addr, "--job", "5", "--src", "0"])
            .args(["--count", "3000", "--give-up-s", "30"])
            .output()
            .unwrap();
        nat_stop.store(true, Ordering::Release);
        out
    });
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("verdict: exact: 3000 of 3000 sums"), "{text}");
    stop.stop();
    let f = h.join().unwrap().front_end;
    assert!(f.not_joined >= 1 && f.readdressed >= 1, "{f:?}");
    assert_eq!(f.unaccounted(), 0, "{f:?}");
}
