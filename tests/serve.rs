//! `pfemu::serve` and `pfemu serve` / `pfemu worker`: real UDP sockets on loopback.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use pfemu::fpisa::Variant;
use pfemu::microcode::trio_ml::host::Worker;
use pfemu::serve::{
    self, Aggregation, ClientConfig, ClientReport, JobSpec, RunLimits, ServeConfig, ServeReport,
    Server, StopHandle,
};

const BIN: &str = env!("CARGO_BIN_EXE_pfemu");

fn job(spec: &str) -> JobSpec {
    spec.parse().unwrap()
}

/// A library server on a thread, on a free loopback port.
fn start(cfg: ServeConfig) -> (SocketAddr, StopHandle, JoinHandle<ServeReport>) {
    let server = Server::bind(&ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..cfg
    })
    .unwrap();
    let addr = server.local_addr().unwrap();
    let stop = server.stop_handle();
    let h = std::thread::spawn(move || {
        server.run(RunLimits {
            duration: Some(Duration::from_secs(120)),
            idle_exit: None,
        })
    });
    (addr, stop, h)
}

fn config(aggregation: Aggregation, jobs: &[&str]) -> ServeConfig {
    ServeConfig {
        aggregation,
        jobs: jobs.iter().map(|j| job(j)).collect(),
        // Long enough that a worker thread delayed by a loaded machine is not left out.
        block_exp_ms: 255,
        ppe_threads: 2,
        ..ServeConfig::default()
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
}

/// Runs one worker thread per source through the server at `addr`.
fn run_workers(addr: SocketAddr, r: &Run) -> Vec<(Worker, ClientReport)> {
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
                    let ccfg = ClientConfig {
                        give_up_after: Duration::from_secs(30),
                        drop_every: r.drop_every,
                        ..ClientConfig::new(addr)
                    };
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
    let (addr, stop, h) = start(config(Aggregation::TrioMl, &["1:4"]));
    let r = Run {
        fpisa: false,
        job: 1,
        sources: vec![0, 1, 2, 3],
        gradients: 50_000,
        seed: 7,
        drop_every: None,
        retransmit: Some(Duration::from_millis(200)),
    };
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

#[test]
fn four_library_workers_get_exact_fpisa_sums() {
    let (addr, stop, h) = start(config(Aggregation::Fpisa(Variant::Full), &["3:4"]));
    let r = Run {
        fpisa: true,
        job: 3,
        sources: vec![0, 1, 2, 3],
        gradients: 20_000,
        seed: 11,
        drop_every: None,
        retransmit: Some(Duration::from_millis(200)),
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
        let (addr, stop, h) = start(config(aggregation, &["1:4"]));
        let r = Run {
            fpisa,
            job: 1,
            sources: vec![0, 1, 2, 3],
            gradients: 20_000,
            seed: 3,
            drop_every: Some(7),
            retransmit: Some(Duration::from_millis(20)),
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

#[test]
fn a_slow_worker_is_left_out_and_answered_with_the_partial_result() {
    let (addr, stop, h) = start(ServeConfig {
        block_exp_ms: 30,
        ..config(Aggregation::TrioMl, &["1:4"])
    });
    // 8 chunks of 256 in a window of 8: one generation, so the kept partial Results are
    // still there when the slow worker comes.
    let n = 2048;
    let on_time = Run {
        fpisa: false,
        job: 1,
        sources: vec![0, 1, 2],
        gradients: n,
        seed: 5,
        drop_every: None,
        retransmit: Some(Duration::from_millis(500)),
    };
    let done = run_workers(addr, &on_time);
    let want = serve::expected_int_sums(5, &[0, 1, 2], n);
    for (w, _) in &done {
        assert!(w.degraded().iter().all(|&d| d));
        assert!(w.src_counts().iter().all(|&c| c == 3));
        assert_eq!(w.sums(), want);
    }
    let slow = run_workers(
        addr,
        &Run {
            sources: vec![3],
            ..on_time
        },
    );
    let (w, _) = &slow[0];
    assert!(w.degraded().iter().all(|&d| d));
    assert_eq!(
        w.sums(),
        want,
        "the slow worker gets the others' partial sums"
    );
    stop.stop();
    h.join().unwrap();
}

#[test]
fn bad_datagrams_are_dropped_and_counted() {
    let (addr, stop, h) = start(config(Aggregation::TrioMl, &["1:1"]));
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(&[], addr).unwrap();
    s.send_to(&[1, 2, 3], addr).unwrap();
    // A header announcing 2 gradients with 1 behind it.
    let mut bad_len = vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    bad_len.extend_from_slice(&[0, 0, 0, 1]);
    s.send_to(&bad_len, addr).unwrap();
    // Job 9 is not configured.
    let mut unknown = vec![9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    unknown.extend_from_slice(&[0, 0, 0, 1]);
    s.send_to(&unknown, addr).unwrap();
    // Job 1, source 200 is not in the job: the engine drops it.
    let mut stranger = vec![1, 0, 0, 0, 0, 0, 200, 0, 0, 0, 0, 1];
    stranger.extend_from_slice(&[0, 0, 0, 1]);
    s.send_to(&stranger, addr).unwrap();
    // The server still works.
    let r = Run {
        fpisa: false,
        job: 1,
        sources: vec![0],
        gradients: 1000,
        seed: 1,
        drop_every: None,
        retransmit: Some(Duration::from_millis(200)),
    };
    let done = run_workers(addr, &r);
    check_exact(&r, &done);
    stop.stop();
    let rep = h.join().unwrap();
    let f = &rep.front_end;
    assert_eq!(f.dropped_short, 2, "{f:?}");
    assert_eq!(f.dropped_bad_length, 1, "{f:?}");
    assert_eq!(f.dropped_unknown_job, 1, "{f:?}");
    assert_eq!(
        rep.engine.dropped_by_reason.get("unknown_source"),
        Some(&1),
        "{:?}",
        rep.engine.dropped_by_reason
    );
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
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .parse()
        .unwrap();
    (child, addr)
}

fn server_report(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

fn worker_processes(addr: SocketAddr, extra: &[&str]) -> Vec<serde_json::Value> {
    let kids: Vec<Child> = (0..4)
        .map(|src| {
            Command::new(BIN)
                .arg("worker")
                .args(["--server", &addr.to_string(), "--src", &src.to_string()])
                .args(["--workers", "4", "--gradients", "100000", "--json"])
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

#[test]
fn the_python_client_gets_its_sums() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 is not available");
        return;
    }
    let (server, addr) = spawn_server(&["--job", "5:1"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/trio_ml_client.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--server", &addr.to_string(), "--job", "5", "--src", "0"])
        .args(["--count", "3000"])
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
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut first)
            .unwrap();
        let addr: SocketAddr = first
            .trim()
            .strip_prefix("listening ")
            .unwrap()
            .parse()
            .unwrap();
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
