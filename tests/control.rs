//! The runtime control plane: the library's answers for every path while traffic flows,
//! the HTTP server and its client, bad requests refused by name, and the Prometheus
//! output read by a real parser (Python's `prometheus_client`, when installed).

#![cfg(feature = "lab")]

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use pfemu::lab::control::{
    request, AdaTarget, ControlServer, Controller, NimbleTarget, ServerLimits, Target, TcamTarget,
    MAX_HEAD,
};
use pfemu::microcode::nimble::{Nimble, NimbleConfig};
use pfemu::prelude::*;

use common::{small_memory, udp_frame};

const PATIENCE: Duration = Duration::from_secs(60);

/// A running PFE with Nimble (ADA on the rate, its controller a timer every 100 us) on the
/// real clock, and its control plane with the limiter's classes, ADA's operand and its
/// calculation table as targets.
fn rig() -> (Pfe, Nimble, Controller) {
    let mem = small_memory();
    let nimble = Nimble::install(
        &mem,
        NimbleConfig {
            rates_bps: vec![1_000_000_000, 2_000_000_000],
            out_port: 1,
            ..NimbleConfig::default()
        },
    )
    .expect("installs");
    let mut pfe = Pfe::builder()
        .program(nimble.program())
        .memory(mem.clone())
        .ppe_threads(2)
        .timers(nimble.timer_specs().expect("a valid period"))
        .sink(Arc::new(CountingSink::new(4)))
        .build()
        .expect("a valid engine");
    pfe.start().expect("starts");
    let ada = Arc::clone(nimble.ada().expect("ADA on the rate"));
    let targets: Vec<Arc<dyn Target>> = vec![
        Arc::new(NimbleTarget::new(nimble.clone(), mem)),
        Arc::new(AdaTarget::new("rate", Arc::clone(&ada))),
        Arc::new(TcamTarget::new(
            "rate_table",
            Arc::new(
                pfemu::mem::tcam::Tcam::new(4, pfemu::mem::tcam::MatchMode::LongestPrefix).unwrap(),
            ),
        )),
    ];
    let ctl = Controller::new(pfe.control(), targets);
    (pfe, nimble, ctl)
}

fn ok(ctl: &Controller, method: &str, target: &str, body: Value) -> Value {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let r = ctl.handle(method, target, &body);
    assert_eq!(r.status, 200, "{method} {target}: {}", r.body);
    r.json_body()
}

fn refused(ctl: &Controller, method: &str, target: &str, body: &str, status: u16, says: &str) {
    let r = ctl.handle(method, target, body.as_bytes());
    assert_eq!(r.status, status, "{method} {target} {body}: {}", r.body);
    let e = r.json_body()["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        e.contains(says),
        "{method} {target}: `{e}` does not say `{says}`"
    );
}

#[test]
fn every_path_answers_while_traffic_flows() {
    let (pfe, nimble, ctl) = rig();
    let pfe = Arc::new(pfe);
    let stop = Arc::new(AtomicBool::new(false));
    // Traffic on both classes from another thread for the whole test.
    let sender = {
        let (pfe, stop) = (Arc::clone(&pfe), Arc::clone(&stop));
        std::thread::spawn(move || {
            let frames: Vec<Vec<u8>> = (0..64).map(|i| udp_frame(i, 0, 256)).collect();
            let mut sent = 0u64;
            while !stop.load(Ordering::Acquire) {
                let burst = frames
                    .iter()
                    .enumerate()
                    .map(|(i, f)| ((i % 2) as u16, f.as_slice()));
                sent += pfe.inject_burst(burst).expect("running");
            }
            sent
        })
    };
    let deadline = Instant::now() + PATIENCE;
    // The counters only grow while traffic flows.
    let mut last = 0;
    for _ in 0..20 {
        let s = ok(&ctl, "GET", "/stats", Value::Null);
        let n = s["packets_in"].as_u64().expect("a number");
        assert!(n >= last, "packets_in went back from {last} to {n}");
        last = n;
        assert!(Instant::now() < deadline, "gave up reading stats");
    }
    while ok(&ctl, "GET", "/stats", Value::Null)["packets_in"].as_u64() < Some(1000) {
        assert!(Instant::now() < deadline, "no traffic arrived");
        std::thread::yield_now();
    }
    // And the PPE threads have processed some (they may start late on a busy machine).
    let processed = |s: &Value| -> u64 {
        s["per_ppe_packets"]
            .as_array()
            .map_or(0, |a| a.iter().filter_map(Value::as_u64).sum())
    };
    while processed(&ok(&ctl, "GET", "/stats", Value::Null)) < 1000 {
        assert!(
            Instant::now() < deadline,
            "the PPE threads processed nothing"
        );
        std::thread::yield_now();
    }

    // Memory: the limiter's class records, by region name, and a write read back.
    let regions = ok(&ctl, "GET", "/memory/regions", Value::Null);
    assert!(regions
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "nimble.classes"));
    let rate = ok(
        &ctl,
        "GET",
        "/memory?region=nimble.classes&offset=0&words=1",
        Value::Null,
    );
    assert_eq!(rate["words"][0], 1_000_000_000 / 8);
    let scratch = pfe
        .memory()
        .alloc("test.scratch", Region::Sram, 4)
        .expect("room");
    ok(
        &ctl,
        "POST",
        "/memory",
        json!({ "addr": scratch, "words": [7, 8, 9] }),
    );
    let back = ok(
        &ctl,
        "GET",
        &format!("/memory?addr={scratch:#x}&words=3"),
        Value::Null,
    );
    assert_eq!(back["words"], json!([7, 8, 9]));

    // Timers: ADA's controller, slowed and switched off and on.
    let t = ok(&ctl, "GET", "/timers", Value::Null);
    assert_eq!(t.as_array().map(Vec::len), Some(1));
    let t = ok(&ctl, "POST", "/timers/0", json!({ "period_ns": 5_000_000 }));
    assert_eq!(t["spec"]["period_ns"], 5_000_000);
    let t = ok(&ctl, "POST", "/timers/0", json!({ "enabled": false }));
    assert_eq!(
        (t["enabled"].as_bool(), t["next_due_ns"].is_null()),
        (Some(false), true)
    );
    ok(
        &ctl,
        "POST",
        "/timers/0",
        json!({ "enabled": true, "period_ns": 100_000 }),
    );

    // Targets: the classes' rates, set by the control plane mid-stream, take effect.
    let targets = ok(&ctl, "GET", "/targets", Value::Null);
    assert!(targets["classes"]["set_rate"].is_string() && targets["rate"]["epoch"].is_string());
    ok(
        &ctl,
        "POST",
        "/targets/classes/set_rate",
        json!({ "class": 1, "bps": 5_000_000_000u64 }),
    );
    assert_eq!(
        nimble.rate(pfe.memory(), 1).expect("class 1"),
        5_000_000_000
    );
    let list = ok(&ctl, "POST", "/targets/classes/list", Value::Null);
    assert_eq!(list[1]["rate_bps"], 5_000_000_000u64);
    assert!(
        list[0]["admitted_packets"].as_u64() > Some(0),
        "{list} {}",
        ok(&ctl, "GET", "/stats", Value::Null)
    );
    let stats = ok(&ctl, "POST", "/targets/rate/stats", Value::Null);
    assert!(stats["epochs"].as_u64() > Some(0), "{stats}");
    ok(&ctl, "POST", "/targets/rate/epoch", Value::Null);
    let replaced = ok(
        &ctl,
        "POST",
        "/targets/rate_table/replace",
        json!({ "entries": [{ "value": 0, "mask": 0, "priority": 0, "result": 42 }] }),
    );
    assert_eq!(replaced["version"], 1);
    let entries = ok(&ctl, "POST", "/targets/rate_table/entries", Value::Null);
    assert_eq!(entries["entries"][0]["result"], 42);

    // Refusals, each naming what is wrong.
    refused(&ctl, "GET", "/nowhere", "", 404, "no such path");
    refused(&ctl, "DELETE", "/stats", "", 405, "DELETE");
    refused(
        &ctl,
        "GET",
        "/memory?region=nope&words=1",
        "",
        400,
        "no region `nope`",
    );
    refused(&ctl, "GET", "/memory?addr=0&words=0", "", 400, "`words`");
    refused(
        &ctl,
        "GET",
        "/memory?addr=0&words=99999",
        "",
        400,
        "`words`",
    );
    refused(&ctl, "GET", "/memory?addr=banana", "", 400, "`addr`");
    // Percent-encoded names are decoded; a malformed escape is refused by name.
    ok(
        &ctl,
        "GET",
        "/memory?region=nimble%2Eclasses&words=1",
        Value::Null,
    );
    refused(
        &ctl,
        "GET",
        "/memory?region=nimble%2",
        "",
        400,
        "invalid percent-encoding in `region`",
    );
    refused(
        &ctl,
        "POST",
        "/targets/cl%zzasses/list",
        "",
        400,
        "invalid percent-encoding in the path",
    );
    refused(
        &ctl,
        "POST",
        "/targets/classes%2Flist/list",
        "",
        404,
        "no target `classes/list`",
    );
    refused(
        &ctl,
        "GET",
        "/memory?region=nimble.classes&offset=13&words=2",
        "",
        400,
        "run past",
    );
    refused(
        &ctl,
        "POST",
        "/memory",
        r#"{"addr": 0, "words": [-1]}"#,
        400,
        "invalid word",
    );
    refused(
        &ctl,
        "POST",
        "/memory",
        r#"{"addr": 1099511627776, "words": [1]}"#,
        400,
        "invalid `addr` 0x10000000000",
    );
    refused(&ctl, "POST", "/memory", "not json", 400, "not JSON");
    refused(
        &ctl,
        "POST",
        "/timers/9",
        r#"{"enabled": true}"#,
        400,
        "no timer 9",
    );
    refused(
        &ctl,
        "POST",
        "/timers/0",
        r#"{"period_ns": 0}"#,
        400,
        "period 0",
    );
    refused(
        &ctl,
        "POST",
        "/timers/0",
        r#"{"period_ns": -5}"#,
        400,
        "`period_ns`",
    );
    refused(
        &ctl,
        "POST",
        "/timers/0",
        r#"{"period_ns": 18446744073709551615}"#,
        400,
        "invalid timer period 18446744073709551615 ns: at most",
    );
    refused(&ctl, "POST", "/timers/x", "{}", 400, "invalid timer `x`");
    refused(
        &ctl,
        "POST",
        "/targets/nope/list",
        "",
        404,
        "no target `nope`",
    );
    refused(
        &ctl,
        "POST",
        "/targets/classes/fly",
        "",
        404,
        "no command `fly`",
    );
    refused(
        &ctl,
        "POST",
        "/targets/classes/set_rate",
        r#"{"class": 7, "bps": 1}"#,
        400,
        "no class 7",
    );
    refused(
        &ctl,
        "POST",
        "/targets/classes/set_rate",
        r#"{"class": 0, "bps": 1e30}"#,
        400,
        "`bps`",
    );
    refused(
        &ctl,
        "POST",
        "/targets/rate_table/replace",
        r#"{"entries": [{"value": 1, "mask": 4294967296, "result": 1}]}"#,
        400,
        "entry 0: invalid `mask`",
    );

    stop.store(true, Ordering::Release);
    let sent = sender.join().expect("the sender");
    let pfe = Arc::into_inner(pfe).expect("the last handle");
    let s = pfe.shutdown();
    assert!(s.is_conserved());
    assert_eq!(s.packets_in, sent);
    // The control plane still answers after shutdown, with the final counters.
    let after = ok(&ctl, "GET", "/stats", Value::Null);
    assert_eq!(after["packets_in"], sent);
    refused(
        &ctl,
        "POST",
        "/timers/0",
        r#"{"enabled": false}"#,
        400,
        "not running",
    );
}

/// Reads and writes whose words run past the address space or out of a memory region are
/// refused whole, naming `addr`, and nothing is written; the server answers after them.
#[test]
fn memory_ranges_past_the_end_are_refused_naming_addr() {
    let (pfe, _nimble, ctl) = rig();
    let top = u64::MAX;
    // Past the last word address: `start + words` would wrap.
    for words in [2, 4096] {
        refused(
            &ctl,
            "GET",
            &format!("/memory?addr={top:#x}&words={words}"),
            "",
            400,
            "invalid `addr` 0xffffffffffffffff",
        );
        let ones = vec![1u64; words];
        refused(
            &ctl,
            "POST",
            "/memory",
            &json!({ "addr": top, "words": ones }).to_string(),
            400,
            "invalid `addr` 0xffffffffffffffff",
        );
    }
    refused(
        &ctl,
        "GET",
        &format!("/memory?addr={top:#x}&words=1"),
        "",
        400,
        "invalid `addr`",
    );
    // Across the end of SRAM: the last word is mapped, the one after is not.
    let last = common::small_mem().sram_words() - 1;
    let before = ok(
        &ctl,
        "GET",
        &format!("/memory?addr={last}&words=1"),
        Value::Null,
    );
    refused(
        &ctl,
        "GET",
        &format!("/memory?addr={last}&words=2"),
        "",
        400,
        "invalid `addr`",
    );
    refused(
        &ctl,
        "POST",
        "/memory",
        &json!({ "addr": last, "words": [7, 7] }).to_string(),
        400,
        "invalid `addr`",
    );
    assert_eq!(
        ok(
            &ctl,
            "GET",
            &format!("/memory?addr={last}&words=1"),
            Value::Null
        ),
        before,
        "a refused write wrote nothing"
    );
    // Through the server: it answers 400 and goes on serving.
    let server = ControlServer::start("127.0.0.1:0", ctl).expect("a free port");
    let addr = server.addr().to_string();
    let (status, body) = request(
        &addr,
        "GET",
        "/memory?addr=0xffffffffffffffff&words=2",
        None,
    )
    .expect("answers");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`addr`"), "{body}");
    let (status, body) = request(&addr, "GET", "/stats", None).expect("still answers");
    assert_eq!(status, 200, "{body}");
    drop(server);
    pfe.shutdown();
}

/// The server end to end: the client, a request a byte at a time, malformed requests, a
/// body too large, and the metrics through a real Prometheus parser.
#[test]
fn the_http_server_serves_and_refuses() {
    let (pfe, _nimble, ctl) = rig();
    let server = ControlServer::start("127.0.0.1:0", ctl).expect("a free port");
    let addr = server.addr().to_string();
    let frames: Vec<Vec<u8>> = (0..100).map(|i| udp_frame(i, 0, 128)).collect();
    pfe.inject_burst(frames.iter().map(|f| (0u16, f.as_slice())))
        .expect("running");
    pfe.drain();
    let (status, body) = request(&addr, "GET", "/stats", None).expect("answers");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["packets_in"], 100);
    let (status, body) = request(
        &addr,
        "POST",
        "/timers/0",
        Some(&json!({ "enabled": false })),
    )
    .expect("answers");
    assert_eq!(status, 200, "{body}");

    // Raw requests: malformed, too large, and one dribbled a byte at a time. The server
    // may answer and close before a long request is all written: a failed write is fine,
    // the answer is what counts.
    let send = |bytes: &[u8], dribble: bool| -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).expect("connects");
        s.set_read_timeout(Some(PATIENCE)).expect("a timeout");
        let chunk = if dribble { 1 } else { bytes.len().max(1) };
        for piece in bytes.chunks(chunk) {
            if s.write_all(piece).is_err() {
                break;
            }
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let raw = |bytes: &[u8]| send(bytes, false);
    assert!(send(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n", true).starts_with("HTTP/1.1 200"));
    assert!(raw(b"GET /stats HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
    assert!(raw(b"NONSENSE\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(raw(b"GET /stats SPDY/3\r\n\r\n").contains("unsupported protocol"));
    let big = format!(
        "POST /memory HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        1 << 30
    );
    assert!(raw(big.as_bytes()).starts_with("HTTP/1.1 413"));
    let chunked = "POST /memory HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert!(raw(chunked.as_bytes()).contains("Content-Length"));
    let long_header = format!("GET /stats HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(64 << 10));
    assert!(raw(long_header.as_bytes()).starts_with("HTTP/1.1 413"));

    // The metrics, parsed by Prometheus's own Python parser.
    let (status, metrics) = request(&addr, "GET", "/metrics", None).expect("answers");
    assert_eq!(status, 200);
    assert!(metrics.contains("pfemu_packets_in_total 100"), "{metrics}");
    prometheus_parses(&metrics);
    drop(server);
    pfe.shutdown();
}

/// A client that trickles its request a byte at a time, each well within any read
/// timeout, is cut off at the deadline for the whole request (408), and the server then
/// answers the next client.
#[test]
fn a_client_trickling_its_request_is_cut_off_at_the_request_deadline() {
    use std::io::{ErrorKind, Read, Write};

    let (pfe, _nimble, ctl) = rig();
    let limits = ServerLimits {
        request_deadline: Duration::from_millis(300),
    };
    let server = ControlServer::start_with_limits("127.0.0.1:0", ctl, limits).expect("a port");
    let addr = server.addr().to_string();
    let mut s = std::net::TcpStream::connect(&addr).expect("connects");
    s.write_all(b"GET /stats HTTP/1.1\r\nX-Trickle: ")
        .expect("writes");
    // A header that never ends, one byte at a time, each after waiting up to 1 ms for
    // the answer.
    s.set_read_timeout(Some(Duration::from_millis(1)))
        .expect("a timeout");
    let end = Instant::now() + PATIENCE;
    let (mut sent, mut reply, mut buf) = (0usize, Vec::new(), [0u8; 4096]);
    loop {
        assert!(
            Instant::now() < end,
            "still trickling after {PATIENCE:?} ({sent} bytes): the server never cut it off"
        );
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                break;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("reading the answer after {sent} bytes: {e}"),
        }
        if s.write_all(b"a").is_err() {
            break;
        }
        sent += 1;
    }
    s.set_read_timeout(Some(PATIENCE)).expect("a timeout");
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with("HTTP/1.1 408"),
        "after {sent} bytes the answer is a timeout: {reply}"
    );
    assert!(
        sent < MAX_HEAD,
        "cut off by the deadline, not by the header limit ({sent} bytes)"
    );
    // The server is free again.
    let (status, body) = request(&addr, "GET", "/stats", None).expect("answers");
    assert_eq!(status, 200, "{body}");
    drop(server);
    pfe.shutdown();
}

/// The length of the accept queue of the TCP socket listening on `port` (from
/// /proc/net/tcp, whose `rx_queue` of a listening socket is its backlog), if it is there.
fn accept_queue(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = f.get(1)?.rsplit(':').next()?;
        if u16::from_str_radix(local_port, 16).ok()? != port || *f.get(3)? != "0A" {
            return None;
        }
        u64::from_str_radix(f.get(4)?.split(':').nth(1)?, 16).ok()
    })
}

/// The send and receive queues of the established TCP socket from local port `local` to
/// remote port `remote` (bytes the peer has not acknowledged, bytes the socket's owner has
/// not read), from /proc/net/tcp, if it is there.
fn tcp_queues(local: u16, remote: u16) -> Option<(u64, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if port(f.get(1)?)? != local || port(f.get(2)?)? != remote || *f.get(3)? != "01" {
            return None;
        }
        let (tx, rx) = f.get(4)?.split_once(':')?;
        Some((
            u64::from_str_radix(tx, 16).ok()?,
            u64::from_str_radix(rx, 16).ok()?,
        ))
    })
}

/// Waits (up to [`PATIENCE`]) until `cond` holds, panicking with `what` and `state()`.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool, state: impl Fn() -> String) {
    let end = Instant::now() + PATIENCE;
    while !cond() {
        assert!(
            Instant::now() < end,
            "waited {PATIENCE:?} for {what} ({})",
            state()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Connects to `server` and waits until the server has accepted the connection (its side
/// is established, and the listener's accept queue is empty), so that it serves this
/// client before any that connects later.
fn connect_and_be_taken(server: &ControlServer) -> std::net::TcpStream {
    let port = server.addr().port();
    let s = std::net::TcpStream::connect(server.addr()).expect("connects");
    let mine = s.local_addr().expect("an address").port();
    wait_until(
        "the server to accept the connection",
        || tcp_queues(port, mine).is_some() && accept_queue(port) == Some(0),
        || {
            format!(
                "server side {:?}, accept queue {:?}",
                tcp_queues(port, mine),
                accept_queue(port)
            )
        },
    );
    s
}

/// What a client gets until the server closes the connection (within [`PATIENCE`]).
fn reply_of(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    s.set_read_timeout(Some(PATIENCE)).expect("a timeout");
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the server did not close the connection within {PATIENCE:?}: {e}"
        );
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A client that connects and sends nothing, and one that sends part of a request, hold the
/// server (it serves one client at a time) only until the request deadline: each is
/// answered 408 and the client after them is answered, while both are still connected.
#[test]
fn idle_clients_are_cut_off_at_the_request_deadline_and_the_next_is_answered() {
    use std::io::Write;

    let (pfe, _nimble, ctl) = rig();
    let limits = ServerLimits {
        request_deadline: Duration::from_millis(300),
    };
    let server = ControlServer::start_with_limits("127.0.0.1:0", ctl, limits).expect("a port");
    // The server serves the idle client first: the others connect after it took it.
    let mut idle = connect_and_be_taken(&server);
    let mut partial = std::net::TcpStream::connect(server.addr()).expect("connects");
    partial
        .write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n")
        .expect("writes");
    let mut next = std::net::TcpStream::connect(server.addr()).expect("connects");
    next.write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("writes");
    let answer = reply_of(&mut next);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the client after an idle one and a partial one is answered while they are still \
         connected: {answer}"
    );
    let idle_reply = reply_of(&mut idle);
    assert!(
        idle_reply.starts_with("HTTP/1.1 408") && idle_reply.contains("in time"),
        "the client that sent nothing was cut off at the deadline: {idle_reply}"
    );
    let partial_reply = reply_of(&mut partial);
    assert!(
        partial_reply.starts_with("HTTP/1.1 408"),
        "the client that sent part of a request was cut off at the deadline: {partial_reply}"
    );
    drop(server);
    pfe.shutdown();
}

/// Dropping the server while it waits on a client that sends no more cuts that client off:
/// the drop does not wait for the request's deadline (an hour here), nor for a client
/// that connected after and sends nothing.
#[test]
fn stopping_the_server_cuts_off_an_idle_client() {
    use std::io::Write;

    let (pfe, _nimble, ctl) = rig();
    let limits = ServerLimits {
        request_deadline: Duration::from_secs(3600),
    };
    let server = ControlServer::start_with_limits("127.0.0.1:0", ctl, limits).expect("a port");
    let port = server.addr().port();
    let mut stalled = connect_and_be_taken(&server);
    let mine = stalled.local_addr().expect("an address").port();
    // One byte of a request, then nothing: once the server has read it (the byte was
    // acknowledged, and the server's side holds no unread byte), the server is serving this
    // client and waits for the rest of its request, as it would for a client that sends
    // nothing (which the test could not see it read).
    stalled.write_all(b"G").expect("writes");
    wait_until(
        "the server to read the client's first byte",
        || {
            tcp_queues(mine, port).is_some_and(|(unacked, _)| unacked == 0)
                && tcp_queues(port, mine).is_some_and(|(_, unread)| unread == 0)
        },
        || {
            format!(
                "client side {:?}, server side {:?}",
                tcp_queues(mine, port),
                tcp_queues(port, mine)
            )
        },
    );
    // And one that connects behind it and sends nothing.
    let mut queued = std::net::TcpStream::connect(server.addr()).expect("connects");
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        drop(server);
        let _ = tx.send(());
    });
    rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
        panic!(
            "dropping the server did not return within {PATIENCE:?} while it waited on a \
             client's request (its deadline is an hour: the stop did not cut the client off)"
        )
    });
    let rest = reply_of(&mut stalled);
    assert!(rest.is_empty(), "cut off without an answer: {rest}");
    let rest = reply_of(&mut queued);
    assert!(rest.is_empty(), "never served: {rest}");
    pfe.shutdown();
}

/// ADA's target refuses what it does not take, naming the value: arguments of the wrong
/// type or too large, unknown arguments (a misspelt one would otherwise look accepted),
/// and bodies that are not objects; nothing panics, and the operand is left as it was.
#[test]
fn ada_target_refuses_bad_arguments_by_name() {
    use pfemu::ada::arith::Op;
    use pfemu::ada::block::{Ada, AdaConfig};
    let ada = Arc::new(Ada::new(AdaConfig::new(Op::Square)).expect("the paper's settings"));
    let target = AdaTarget::new("sq", Arc::clone(&ada));
    let before = ada.stats();
    let refused = |command: &str, args: Value, says: &str| {
        let e = target
            .call(command, &args)
            .expect_err(&format!("{command} {args} refused"));
        assert!(
            e.contains(says),
            "{command} {args}: `{e}` does not say `{says}`"
        );
    };
    refused(
        "epoch",
        json!({ "epochs": 5 }),
        "`epoch` takes no arguments: got `epochs`",
    );
    refused("stats", json!([1, 2]), "must be a JSON object, got [1,2]");
    refused("bins", json!("all"), "must be a JSON object, got \"all\"");
    refused("lookup", json!({}), "give `x`");
    refused("lookup", json!({ "x": "7" }), "invalid `x` \"7\"");
    refused("lookup", json!({ "x": -1 }), "invalid `x` -1");
    refused("lookup", json!({ "x": 1.5 }), "invalid `x` 1.5");
    refused(
        "lookup",
        json!({ "x": 1u64 << 32 }),
        "invalid `x` 4294967296: must be an operand from 0 to 2^32 - 1",
    );
    refused(
        "lookup",
        json!({ "x": 3, "y": 4 }),
        "`lookup` takes `x`: got `y`",
    );
    refused("fly", Value::Null, "no command `fly`");
    assert_eq!(ada.stats(), before, "a refused request changes nothing");
    // The good ones: a lookup is the table's answer, the square of the representative of
    // the entry covering the operand.
    let entry = ada
        .entries()
        .into_iter()
        .find(|e| e.matches(1000))
        .expect("the table covers every operand");
    let r = target
        .call("lookup", &json!({ "x": 1000 }))
        .expect("a lookup");
    assert_eq!(
        r["result"],
        entry.representative * entry.representative,
        "{r}"
    );
    let r = target
        .call("lookup", &json!({ "x": u32::MAX }))
        .expect("the largest");
    assert!(r["result"].as_u64() > Some(1 << 62), "{r}");
    assert_eq!(ada.stats().epochs, 0, "a lookup runs no epoch");
    target
        .call("epoch", &json!({}))
        .expect("an empty object is no arguments");
    assert_eq!(ada.stats().epochs, 1);
}

/// Two ADA operands (Nimble's rate and time, ADA(ΔT, R)) share the ADA metric families:
/// each family's `# HELP` and `# TYPE` come once, its samples together, told apart by the
/// `operand` label (the text format refuses a family declared twice).
#[test]
fn two_ada_operands_share_one_family_per_metric() {
    let mem = small_memory();
    let nimble = Nimble::install(
        &mem,
        NimbleConfig {
            dt_ada: Some(pfemu::ada::block::AdaConfig::new(
                pfemu::ada::arith::Op::Mul,
            )),
            prime_epochs: 2,
            ..NimbleConfig::default()
        },
    )
    .expect("installs");
    let pfe = Pfe::builder()
        .program(nimble.program())
        .memory(mem.clone())
        .ppe_threads(1)
        .sink(Arc::new(CountingSink::new(2)))
        .build()
        .expect("a valid engine");
    let rate = Arc::clone(nimble.ada().expect("ADA on the rate"));
    let dt = Arc::clone(nimble.dt_ada().expect("ADA on the time"));
    let targets: Vec<Arc<dyn Target>> = vec![
        Arc::new(NimbleTarget::new(nimble.clone(), mem)),
        Arc::new(AdaTarget::new("rate", rate)),
        Arc::new(AdaTarget::new("dt", dt)),
    ];
    let ctl = Controller::new(pfe.control(), targets);
    let r = ctl.handle("GET", "/metrics", b"");
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.body;
    // Every family declared once.
    let mut declared = std::collections::BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
        {
            let name = rest.split(' ').next().unwrap_or_default();
            *declared
                .entry((line[..6].to_string(), name.to_string()))
                .or_insert(0) += 1;
        }
    }
    for ((kind, name), n) in &declared {
        assert_eq!(*n, 1, "{kind} {name} appears {n} times:\n{text}");
    }
    for family in [
        "pfemu_ada_epochs_total",
        "pfemu_ada_repopulations_total",
        "pfemu_ada_reads_total",
        "pfemu_ada_writes_total",
        "pfemu_ada_bins",
    ] {
        assert!(
            declared.contains_key(&("# TYPE".to_string(), family.to_string())),
            "{family} missing:\n{text}"
        );
        // Both operands' samples, right after the family's TYPE line.
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| {
                *l == format!("# TYPE {family} counter") || *l == format!("# TYPE {family} gauge")
            })
            .expect("declared");
        let samples: Vec<&str> = lines[at + 1..]
            .iter()
            .take_while(|l| !l.starts_with('#'))
            .copied()
            .collect();
        assert_eq!(samples.len(), 2, "{family}: {samples:?}");
        assert!(
            samples[0].starts_with(&format!("{family}{{operand=\"dt\"}} ")),
            "{samples:?}"
        );
        assert!(
            samples[1].starts_with(&format!("{family}{{operand=\"rate\"}} ")),
            "{samples:?}"
        );
    }
    // The rate's table was primed (2 epochs), the time's not.
    assert!(
        text.contains("pfemu_ada_epochs_total{operand=\"rate\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("pfemu_ada_epochs_total{operand=\"dt\"} 0\n"),
        "{text}"
    );
    prometheus_parses_families(&text, &["pfemu_ada_epochs", "pfemu_ada_bins"]);
}

/// Parses `text` with `prometheus_client.parser` and checks that each of `families` has
/// one sample per ADA operand (`rate` and `dt`), or prints why it cannot.
fn prometheus_parses_families(text: &str, families: &[&str]) {
    prometheus_run(
        text,
        &format!(
            r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = list(text_string_to_metric_families(sys.stdin.read()))
names = [f.name for f in fams]
assert len(names) == len(set(names)), "a family twice: %s" % names
by = {{f.name: f for f in fams}}
for name in {families:?}:
    ops = sorted(s.labels["operand"] for s in by[name].samples)
    assert ops == ["dt", "rate"], (name, ops)
"#
        ),
    );
}

/// Parses `text` with `prometheus_client.parser` and checks a few families, or prints why
/// it cannot (Python or the package missing: `.ci/run` installs it when it can).
fn prometheus_parses(text: &str) {
    let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}
assert families["pfemu_packets_in"].type == "counter", families.keys()
assert families["pfemu_packets_in"].samples[0].value == 100
assert families["pfemu_in_flight"].type == "gauge"
assert families["pfemu_ada_epochs"].samples[0].labels == {"operand": "rate"}
print(len(families))
"#;
    prometheus_run(text, script);
}

/// Runs the Python `script` on `text` (its stdin) and asserts it succeeds, or prints why it
/// cannot run (Python or `prometheus_client` missing: `.ci/run` installs it when it can).
fn prometheus_run(text: &str, script: &str) {
    let probe = Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!("skipped: the Prometheus parser check needs python3 with prometheus_client (pip install prometheus_client)");
            return;
        }
    }
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("writes");
    }
    let out = child.wait_with_output().expect("finishes");
    assert!(
        out.status.success(),
        "prometheus_client refused the metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pfemu ctl` against a server: each command's answer, a refusal's message and status,
/// and a server that is not there.
#[test]
fn pfemu_ctl_reads_and_changes_a_running_pfe() {
    let (pfe, _nimble, ctl) = rig();
    let server = ControlServer::start("127.0.0.1:0", ctl).expect("a free port");
    let addr = server.addr().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
            .args(["ctl", "--control", &addr])
            .args(args)
            .output()
            .expect("pfemu runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let json = |args: &[&str]| -> Value {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    };
    assert!(json(&["stats"])["packets_in"].is_u64());
    assert_eq!(json(&["timers"]).as_array().map(Vec::len), Some(1));
    assert_eq!(json(&["timer", "0", "--off"])["enabled"], false);
    assert_eq!(
        json(&["timer", "0", "--on", "--period-ms", "0.5"])["spec"]["period_ns"],
        500_000
    );
    assert_eq!(
        json(&["read", "--region", "nimble.classes", "--words", "2"])["words"][0],
        125_000_000
    );
    let scratch = pfe
        .memory()
        .alloc("ctl.scratch", Region::Sram, 2)
        .expect("room");
    let at = scratch.to_string();
    json(&["write", "--addr", &at, "0x10", "17"]);
    assert_eq!(
        json(&["read", "--addr", &at, "--words", "2"])["words"],
        json!([16, 17])
    );
    assert!(json(&["regions"])
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "ctl.scratch"));
    assert!(json(&["targets"])["classes"].is_object());
    let classes = json(&["call", "classes", "list"]);
    assert_eq!(classes[1]["rate_bps"], 2_000_000_000u64);
    json(&[
        "call",
        "classes",
        "set_rate",
        r#"{"class": 1, "bps": 3000000000}"#,
    ]);
    assert_eq!(
        json(&["call", "classes", "list"])[1]["rate_bps"],
        3_000_000_000u64
    );
    let (code, metrics, _) = run(&["metrics"]);
    assert_eq!(code, Some(0));
    assert!(
        metrics.contains("# TYPE pfemu_packets_in_total counter"),
        "{metrics}"
    );

    // Refusals: the server's message, and a non-zero status.
    let (code, _, err) = run(&["timer", "7", "--off"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("no timer 7"), "{err}");
    let (code, _, err) = run(&["call", "classes", "list", "{not json"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("not JSON"), "{err}");
    let (code, _, err) = run(&["timer", "0", "--period-ms", "NaN"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--period-ms"), "{err}");
    // Names go into the URL percent-encoded: one with a space, `/`, `&` or `?` is still
    // the one name, refused as such.
    let (code, _, err) = run(&["call", "no such/table?", "list"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("no target `no such/table?`"), "{err}");
    let (code, _, err) = run(&["call", "classes", "a b"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("no command `a b`"), "{err}");
    let (code, _, err) = run(&["read", "--region", "x&words=9999", "--words", "1"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("no region `x&words=9999`"), "{err}");
    drop(server);
    let (code, _, err) = run(&["stats"]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains(&addr),
        "names the address it could not reach: {err}"
    );
    pfe.shutdown();
}

/// A tbl8 group a removed route freed is reused by another /24 only after the engine's
/// grace period (a packet that read the old pointer may still read the group): the routes
/// target that knows the engine waits for it on the removal, and then the group is free;
/// one without the engine leaves it retired, and an add that needs it is refused.
#[test]
fn a_removed_routes_tbl8_group_is_reused_after_the_engines_grace_period() {
    use pfemu::lab::control::RoutesTarget;
    use pfemu::microcode::l3fwd::live::LiveRoutes;
    use pfemu::microcode::l3fwd::{L3fwd, Room, RouteTable};

    for with_engine in [true, false] {
        let mem = Arc::new(SharedMemory::new(&MemConfig::default()).expect("memory"));
        let routes: RouteTable = "10.0.0.0/8 1\n".parse().expect("routes");
        let room = Room {
            tbl8_groups: 1,
            next_hops: 4,
        };
        let l3 = L3fwd::install_with_room(&mem, &routes, room).expect("installs");
        let live = Arc::new(LiveRoutes::new(&l3, Arc::clone(&mem), routes).expect("takes over"));
        let mut pfe = Pfe::builder()
            .program(l3.program())
            .memory(mem)
            .ppe_threads(2)
            .build()
            .expect("a valid engine");
        pfe.start().expect("starts");
        // Through a controller, which gives its targets the engine; or the target alone.
        let target = Arc::new(RoutesTarget::new(Arc::clone(&live)));
        let ctl = with_engine.then(|| Controller::new(pfe.control(), vec![target.clone()]));
        let call = |command: &str, args: Value| -> Result<Value, String> {
            match &ctl {
                Some(ctl) => {
                    let r = ctl.handle(
                        "POST",
                        &format!("/targets/routes/{command}"),
                        args.to_string().as_bytes(),
                    );
                    let body = r.json_body();
                    match r.status {
                        200 => Ok(body),
                        _ => Err(body["error"].as_str().unwrap_or_default().to_string()),
                    }
                }
                None => target.call(command, &args),
            }
        };
        call("add", json!({ "route": "10.0.1.0/25", "port": 2 })).expect("room for one");
        let removed = call("remove", json!({ "route": "10.0.1.0/25" })).expect("removes");
        assert_eq!(removed["removed"], true);
        let other = json!({ "route": "10.0.9.0/25", "port": 3 });
        if with_engine {
            assert_eq!(removed["retired_groups"], 0, "{removed}");
            assert_eq!(live.free_groups(), 1);
            call("add", other).expect("the group is free after the grace period");
        } else {
            assert_eq!(removed["retired_groups"], 1, "{removed}");
            let e = call("add", other).expect_err("the group is retired");
            assert!(e.contains("waiting for a grace period"), "{e}");
        }
        pfe.shutdown();
    }
}

/// l3fwd under traffic: a route added through the control plane takes effect for the
/// packets after it, removed it stops, and the counters only grow meanwhile.
#[test]
fn a_route_added_through_the_control_plane_takes_effect_mid_stream() {
    use pfemu::lab::control::RoutesTarget;
    use pfemu::microcode::l3fwd::live::LiveRoutes;
    use pfemu::microcode::l3fwd::{udp_frame as l3_frame, L3fwd, Room, RouteTable};

    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).expect("memory"));
    let routes: RouteTable = "10.0.0.0/16 1\n".parse().expect("routes");
    let l3 = L3fwd::install_with_room(
        &mem,
        &routes,
        Room {
            tbl8_groups: 4,
            next_hops: 4,
        },
    )
    .expect("installs");
    let live = Arc::new(LiveRoutes::new(&l3, Arc::clone(&mem), routes).expect("takes over"));
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = Pfe::builder()
        .program(l3.program())
        .memory(mem)
        .ppe_threads(2)
        .sink(sink.clone())
        .build()
        .expect("a valid engine");
    pfe.start().expect("starts");
    let ctl = Controller::new(pfe.control(), vec![Arc::new(RoutesTarget::new(live))]);
    let pfe = Arc::new(pfe);
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (pfe, stop) = (Arc::clone(&pfe), Arc::clone(&stop));
        std::thread::spawn(move || {
            let frame = l3_frame([10, 9, 0, 1], 64, 64);
            let mut sent = 0u64;
            while !stop.load(Ordering::Acquire) {
                sent += pfe
                    .inject_burst((0..32).map(|_| (0u16, frame.as_slice())))
                    .expect("running");
            }
            sent
        })
    };
    let deadline = Instant::now() + PATIENCE;
    let drops = || {
        ok(&ctl, "GET", "/stats", Value::Null)["dropped_by_reason"]["no_route"]
            .as_u64()
            .unwrap_or(0)
    };
    while drops() < 100 {
        assert!(
            Instant::now() < deadline,
            "no packet was dropped as no_route"
        );
        std::thread::yield_now();
    }
    assert_eq!(sink.packets(3), 0);
    ok(
        &ctl,
        "POST",
        "/targets/routes/add",
        json!({ "route": "10.9.0.0/16", "port": 3 }),
    );
    assert_eq!(
        ok(
            &ctl,
            "POST",
            "/targets/routes/lookup",
            json!({ "addr": "10.9.0.1" })
        )["port"],
        3
    );
    while sink.packets(3) < 100 {
        assert!(Instant::now() < deadline, "no packet took the new route");
        std::thread::yield_now();
    }
    let list = ok(&ctl, "POST", "/targets/routes/list", Value::Null);
    assert_eq!(list.as_array().map(Vec::len), Some(2));
    ok(
        &ctl,
        "POST",
        "/targets/routes/remove",
        json!({ "route": "10.9.0.0/16" }),
    );
    // After the removal the packets are dropped again, and the counters only grow.
    let (mut last, removed_at) = ((0, 0), drops());
    while drops() < removed_at + 100 {
        let now = (sink.packets(3), drops());
        assert!(
            now.0 >= last.0 && now.1 >= last.1,
            "counters went back: {last:?} -> {now:?}"
        );
        last = now;
        assert!(
            Instant::now() < deadline,
            "no packet was dropped after the removal"
        );
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Release);
    sender.join().expect("the sender");
    pfe.drain();
    // Packets in flight at the removal may still have taken the route; none after.
    let forwarded = sink.packets(3);
    let frame = l3_frame([10, 9, 0, 1], 64, 64);
    pfe.inject_burst((0..100).map(|_| (0u16, frame.as_slice())))
        .expect("running");
    pfe.drain();
    assert_eq!(
        sink.packets(3),
        forwarded,
        "removed: nothing more takes the route"
    );
    refused(
        &ctl,
        "POST",
        "/targets/routes/add",
        r#"{"route": "10.9.0.1/16", "port": 3}"#,
        400,
        "host bits",
    );
    refused(
        &ctl,
        "POST",
        "/targets/routes/add",
        r#"{"route": "10.9.0.0/33", "port": 3}"#,
        400,
        "0 to 32",
    );
    refused(
        &ctl,
        "POST",
        "/targets/routes/add",
        r#"{"route": "10.9.0.0/16", "port": 70000}"#,
        400,
        "`port`",
    );
    let pfe = Arc::into_inner(pfe).expect("the last handle");
    assert!(pfe.shutdown().is_conserved());
}
