//! Live ports on real interfaces: network namespaces and veth pairs made per test (unique
//! names, removed by a guard on drop, also on panic). Each test prints `skipped: ...` and
//! passes when it cannot run here: not root, or the kernel refuses namespaces, veth or TAP.
//! Every wait has a deadline and says what it waited for; nothing sleeps to synchronise.

#![cfg(all(feature = "lab", target_os = "linux"))]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pfemu::lab::bench::traffic::{FrameClass, FrameSizes, Mix, Traffic, TrafficSpec};
use pfemu::lab::live::{Live, LiveConfig, LiveError, LiveProgram, ProgramCounters};
use pfemu::lab::ports::{PortError, PortSpec, PortsConfig, RawSocket};

/// How long any one wait may take before the test fails, saying what it waited for.
const DEADLINE: Duration = Duration::from_secs(20);

// ----- the lab's guard ---------------------------------------------------------------------

/// Namespaces, links, TAP devices, processes and files a test made; removed on drop.
struct NetLab {
    prefix: String,
    namespaces: Vec<String>,
    links: Vec<String>,
    children: Vec<Child>,
    dirs: Vec<PathBuf>,
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting one end of a veth pair deletes both; a namespace takes its links along.
        for l in &self.links {
            let _ = Command::new("ip")
                .args(["link", "del", l])
                .stderr(Stdio::null())
                .status();
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Runs `ip` with `args`; the error holds its message.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

impl NetLab {
    /// A lab for `test` with one veth pair, `s0` and `p0` (MTU 1500, both in the host's
    /// namespace): the lab (keep it: dropped, it deletes the pair) and the two names, or
    /// `None` (printed) when this machine cannot make them.
    fn with_veth_pair(test: &str) -> Option<(NetLab, String, String)> {
        let mut lab = NetLab::new(test)?;
        let (s0, p0) = (lab.name("s0"), lab.name("p0"));
        if let Err(e) = lab.veth(&s0, &p0, None, 1500) {
            println!("skipped {test}: the kernel refused a veth pair: {e}");
            return None;
        }
        Some((lab, s0, p0))
    }

    /// A lab with names unique to this process and test, or `None` (printed) when this
    /// machine cannot make one.
    fn new(test: &str) -> Option<NetLab> {
        static N: AtomicU32 = AtomicU32::new(0);
        if !is_root() {
            println!("skipped {test}: not root (network namespaces and AF_PACKET need it)");
            return None;
        }
        if let Err(e) = ip(&["-V"]) {
            println!("skipped {test}: iproute2 is not installed ({e})");
            return None;
        }
        let n = N.fetch_add(1, Ordering::Relaxed);
        Some(NetLab {
            // Interface names have 15 bytes: prefix (at most 9) + a role of at most 6.
            prefix: format!("pl{}{n}", std::process::id() % 100_000),
            namespaces: Vec::new(),
            links: Vec::new(),
            children: Vec::new(),
            dirs: Vec::new(),
        })
    }

    fn name(&self, role: &str) -> String {
        format!("{}{role}", self.prefix)
    }

    /// A TAP device of the lab (`ip tuntap add`, so persistent until the lab removes it),
    /// quiet (no IPv6, so the host sends nothing into a port on it); `None` (printed) when
    /// the kernel refuses one.
    fn tap(&mut self, test: &str) -> Option<String> {
        let tap = self.name("tap");
        if let Err(e) = ip(&["tuntap", "add", "dev", &tap, "mode", "tap"]) {
            println!("skipped {test}: the kernel refused a TAP device: {e}");
            return None;
        }
        self.links.push(tap.clone());
        disable_ipv6(None, &tap).expect("IPv6 off on the TAP device");
        Some(tap)
    }

    fn netns(&mut self, role: &str) -> Result<String, String> {
        let ns = self.name(role);
        ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        Ok(ns)
    }

    /// A veth pair `a` (in the root namespace) - `b` (in `ns_b` if given), IPv6 off on
    /// both (no router solicitations or MLD reports in the counts), MTU `mtu`, both up.
    fn veth(&mut self, a: &str, b: &str, ns_b: Option<&str>, mtu: u32) -> Result<(), String> {
        let mut args = vec!["link", "add", a, "type", "veth", "peer", "name", b];
        if let Some(ns) = ns_b {
            args.extend(["netns", ns]);
        }
        ip(&args)?;
        self.links.push(a.to_string());
        let in_b = |cmd: &[&str]| -> Result<(), String> {
            match ns_b {
                Some(ns) => {
                    let mut v = vec!["-n", ns];
                    v.extend_from_slice(cmd);
                    ip(&v)
                }
                None => ip(cmd),
            }
        };
        disable_ipv6(None, a)?;
        disable_ipv6(ns_b, b)?;
        let mtu = mtu.to_string();
        ip(&["link", "set", a, "mtu", &mtu, "up"])?;
        in_b(&["link", "set", b, "mtu", &mtu, "up"])?;
        Ok(())
    }

    fn temp_dir(&mut self) -> Result<PathBuf, String> {
        let d = std::env::temp_dir().join(format!("pfemu-{}", self.prefix));
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        self.dirs.push(d.clone());
        Ok(d)
    }
}

/// Sets `net.ipv6.conf.IFACE.disable_ipv6` (in namespace `ns` if given), through /proc (no
/// `sysctl` binary needed); nothing to do on a kernel without IPv6.
fn disable_ipv6(ns: Option<&str>, iface: &str) -> Result<(), String> {
    let path = format!("/proc/sys/net/ipv6/conf/{iface}/disable_ipv6");
    match ns {
        None => match std::fs::write(&path, "1") {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("{path}: {e}")),
            _ => Ok(()),
        },
        Some(ns) => {
            let script = format!("[ ! -e {path} ] || echo 1 > {path}");
            in_ns(ns, &["sh", "-c", &script]).map(|_| ())
        }
    }
}

/// Waits for `cond` until the deadline; panics naming `what` when it does not come.
/// `step(d)` waits at most `d` for progress (on a socket, a channel; a short sleep only
/// where there is nothing to wait on), and `cond` decides.
fn wait_for(what: &str, cond: impl FnMut() -> bool, step: impl FnMut(Duration)) {
    wait_explained(what, cond, step, String::new);
}

/// [`wait_for`] on a live engine: the panic shows its report, so a run that times out
/// says where the frames went (dropped by the program, refused by an interface, ...).
fn wait_for_live(live: &Live, what: &str, cond: impl FnMut() -> bool, step: impl FnMut(Duration)) {
    wait_explained(what, cond, step, || format!(": {:#?}", live.report()));
}

/// [`wait_for`], adding `explain()` to the panic's message.
fn wait_explained(
    what: &str,
    mut cond: impl FnMut() -> bool,
    mut step: impl FnMut(Duration),
    explain: impl FnOnce() -> String,
) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            panic!(
                "timed out after {DEADLINE:?} waiting for {what}{}",
                explain()
            );
        }
        step(left.min(Duration::from_millis(5)));
    }
}

// ----- (b) exact filter counters -------------------------------------------------------------

/// The frames of the mix, and what the filter must count for them.
struct Mixed {
    traffic: Traffic,
    plain_ipv4: u64,
    non_ip: (u64, u64),
    ip_options: (u64, u64),
}

fn mixed(frames: usize) -> Mixed {
    let spec = TrafficSpec {
        packets: frames,
        sizes: Some("64,594,1518".parse::<FrameSizes>().expect("sizes")),
        flows: 64,
        mix: "ipv4=80,ipv4opt=7,ipv6=6,nonip=7"
            .parse::<Mix>()
            .expect("mix"),
        seed: 7,
        ..TrafficSpec::default()
    };
    let traffic = Traffic::generate(&spec).expect("traffic");
    let (v6, non) = (
        traffic.count(FrameClass::Ipv6),
        traffic.count(FrameClass::NonIp),
    );
    Mixed {
        plain_ipv4: traffic.count(FrameClass::Ipv4).0,
        // The filter's IP test is the EtherType 0x0800: IPv6 counts as non-IP.
        non_ip: (v6.0 + non.0, v6.1 + non.1),
        ip_options: traffic.count(FrameClass::Ipv4Options),
        traffic,
    }
}

/// Sends the mix into `tx` in bursts, each once the port took the one before (so no
/// queue on the way can overflow, however slow this machine), and waits until the
/// receiver behind the egress port got every forwarded frame.
fn offer_and_collect(live: &Live, tx: &RawSocket, rx: &RawSocket, m: &Mixed) {
    const BURST: usize = 200;
    let n = m.traffic.len();
    let buf = std::cell::RefCell::new(vec![0u8; 65536]);
    let received = std::cell::Cell::new(0u64);
    let drain = || loop {
        match rx.try_recv(&mut buf.borrow_mut()) {
            Ok(Some(_)) => received.set(received.get() + 1),
            Ok(None) => break,
            Err(e) => panic!("receiving on {}: {e}", rx.name()),
        }
    };
    let mut sent = 0usize;
    while sent < n {
        let end = (sent + BURST).min(n);
        let (ok, err) = tx.send((sent..end).map(|i| m.traffic.frame(i)));
        assert_eq!(ok as usize, end - sent, "sending on {}: {err:?}", tx.name());
        sent = end;
        let ports = || {
            let r = live.report();
            r.ports.ports[0].rx_frames + r.ports.ports[0].rx_dropped()
        };
        wait_for_live(
            live,
            &format!("port 0 to take {sent} frames"),
            || ports() >= sent as u64,
            |d| {
                // Empty the receiver meanwhile, so its buffer never fills.
                if rx.wait(d).unwrap_or(false) {
                    drain();
                }
            },
        );
    }
    wait_for_live(
        live,
        &format!("{} forwarded frames on {}", m.plain_ipv4, rx.name()),
        || received.get() >= m.plain_ipv4,
        |d| {
            if rx.wait(d).unwrap_or(false) {
                drain();
            }
        },
    );
    assert_eq!(
        received.get(),
        m.plain_ipv4,
        "frames out of the egress port"
    );
    assert_eq!(rx.take_drops().unwrap_or(0), 0, "receiver drops");
}

/// Checks the final report against the mix: exact counters, every frame accounted for.
fn check_filter_report(r: &pfemu::lab::live::LiveReport, m: &Mixed) {
    let n = m.traffic.len() as u64;
    let p0 = &r.ports.ports[0];
    assert_eq!(
        p0.rx_frames + p0.rx_dropped(),
        n,
        "every frame sent is received or counted as an interface drop: {p0:#?}"
    );
    assert_eq!(
        p0.rx_dropped(),
        0,
        "no interface drops at this pace: {p0:#?}"
    );
    assert_eq!(r.engine.packets_in, n);
    assert_eq!(r.engine.packets_out, m.plain_ipv4);
    let ProgramCounters::Filter(c) = &r.counters else {
        panic!("the filter's counters are missing: {:?}", r.counters);
    };
    assert_eq!(c.non_ip, m.non_ip, "non-IP (and IPv6) packets and bytes");
    assert_eq!(c.ip_options, m.ip_options, "IPv4 with options");
    assert_eq!(r.engine.dropped, m.non_ip.0 + m.ip_options.0);
    assert_eq!(r.ports.ports[1].tx_frames, m.plain_ipv4);
    assert_eq!(r.ports.tx_dropped(), 0, "{:#?}", r.ports);
    assert!(r.accounted(), "{r:#?}");
}

/// Runs the filter between port 0 on interface `port0` and `port1`, offers `frames` of
/// the mix on interface `send` (the other end of `port0`'s pair), collects them on `receive`
/// (where `port1`'s frames arrive) and checks the report against the mix.
fn filter_between(port0: &str, port1: PortSpec, send: &str, receive: &str, frames: usize) {
    let m = mixed(frames);
    let cfg = LiveConfig {
        ppe_threads: 2,
        ..LiveConfig::new(
            LiveProgram::Filter,
            PortsConfig::new(vec![
                PortSpec::interface(&format!("0={port0}")).expect("spec"),
                port1,
            ]),
        )
    };
    let live = Live::start(&cfg).expect("the ports bind");
    let tx = RawSocket::open(send, false).expect("sender");
    let rx = RawSocket::open(receive, true).expect("receiver");
    offer_and_collect(&live, &tx, &rx, &m);
    let r = live.stop().expect("stops");
    check_filter_report(&r, &m);
}

#[test]
fn the_filter_counts_a_mix_sent_into_a_veth_exactly() {
    let Some(mut lab) = NetLab::new("the_filter_counts_a_mix_sent_into_a_veth_exactly") else {
        return;
    };
    let (s0, p0, p1, r1) = (
        lab.name("s0"),
        lab.name("p0"),
        lab.name("p1"),
        lab.name("r1"),
    );
    if let Err(e) = lab
        .veth(&s0, &p0, None, 9000)
        .and_then(|()| lab.veth(&p1, &r1, None, 9000))
    {
        println!("skipped: the kernel refused a veth pair: {e}");
        return;
    }
    let port1 = PortSpec::interface(&format!("1={p1}")).expect("spec");
    filter_between(&p0, port1, &s0, &r1, 3000);
}

#[test]
fn a_tap_port_sends_to_the_host() {
    let Some(mut lab) = NetLab::new("a_tap_port_sends_to_the_host") else {
        return;
    };
    let (s0, p0) = (lab.name("s0"), lab.name("p0"));
    if let Err(e) = lab.veth(&s0, &p0, None, 9000) {
        println!("skipped: the kernel refused a veth pair: {e}");
        return;
    }
    // Made first, quiet (no IPv6), so the host sends nothing into the port.
    let Some(tap) = lab.tap("a_tap_port_sends_to_the_host") else {
        return;
    };
    ip(&["link", "set", &tap, "mtu", "9000"]).expect("mtu");
    // What the port writes to the TAP device arrives at the host on it.
    let port1 = PortSpec::tap(&format!("1={tap}")).expect("spec");
    filter_between(&p0, port1, &s0, &tap, 600);
}

#[test]
fn a_missing_interface_is_named() {
    let name = format!("pfnone{}", std::process::id() % 100_000);
    let cfg = LiveConfig::new(
        LiveProgram::Filter,
        PortsConfig::new(vec![
            PortSpec::interface(&format!("3={name}")).expect("spec")
        ]),
    );
    match Live::start(&cfg) {
        Err(LiveError::Port(e @ PortError::NoSuchInterface { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains(&name) && msg.contains("port 3"), "{msg}");
        }
        other => panic!("expected NoSuchInterface, got {other:?}"),
    }
    // And from the command line.
    let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(["run", "--iface", &format!("0={name}"), "--duration", "1"])
        .output()
        .expect("runs pfemu");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&name) && err.contains("does not exist"),
        "{err}"
    );
}

// ----- (a) l3fwd between two namespaces, through the pfemu command -------------------------

/// `pfemu run` in the background, its standard error's lines on a channel.
struct Pfemu {
    child: Option<Child>,
    lines: crossbeam_channel::Receiver<String>,
}

impl Pfemu {
    fn spawn(args: &[&str]) -> Pfemu {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pfemu"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts pfemu");
        let (tx, lines) = crossbeam_channel::unbounded();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Pfemu {
            child: Some(child),
            lines,
        }
    }

    /// Waits for the `ready:` line; panics with what pfemu said otherwise.
    fn wait_ready(&self) {
        self.wait_line("ready:");
    }

    /// Waits for a line starting with `start` and returns it; panics with what pfemu said
    /// otherwise.
    fn wait_line(&self, start: &str) -> String {
        let end = Instant::now() + DEADLINE;
        let mut said = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(start) => return l,
                Ok(l) => said.push(l),
                Err(_) => {
                    panic!("pfemu did not print `{start}` within {DEADLINE:?}; it said: {said:#?}")
                }
            }
        }
    }

    /// Sends SIGINT and returns its standard output once it exits.
    fn interrupt(mut self) -> (Option<i32>, String) {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        let status = Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            let code = child.wait().ok().and_then(|s| s.code());
            let _ = tx.send((code, s));
        });
        rx.recv_timeout(DEADLINE)
            .expect("pfemu exits within the deadline after SIGINT")
    }
}

impl Drop for Pfemu {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `cmd` in namespace `ns`; its output, or an error with its standard error.
fn in_ns(ns: &str, cmd: &[&str]) -> Result<Vec<u8>, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{cmd:?} in {ns}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// An ICMP echo from `ns` to `dst` with Python's raw socket, for machines without
/// `ping`: prints the reply's TTL.
const PY_PING: &str = r#"
import socket, struct, sys, time
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s & 0xffff) + (s >> 16); s += s >> 16
    return ~s & 0xffff
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(5)
dst = sys.argv[1]
for seq in range(3):
    body = struct.pack('!BBHHH', 8, 0, 0, 0x1234, seq) + b'pfemu' * 8
    body = body[:2] + struct.pack('!H', csum(body)) + body[4:]
    s.sendto(body, (dst, 0))
    while True:
        pkt, addr = s.recvfrom(2048)
        ihl = (pkt[0] & 15) * 4
        if addr[0] == dst and pkt[ihl] == 0 and struct.unpack('!H', pkt[ihl+6:ihl+8])[0] == seq:
            print('ttl=%d' % pkt[8]); break
"#;

/// A TCP server: binds ADDR PORT, prints `listening`, sends FILE to the first client and
/// closes. (Not `http.server`, whose bind looks its name up in DNS, which in a namespace
/// without a resolver waits for the timeout.)
const PY_SERVE: &str = r#"
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print('listening', flush=True)
c, _ = s.accept()
c.sendall(open(sys.argv[3], 'rb').read()); c.close()
"#;

/// A TCP client: connects to ADDR PORT and writes what it receives to standard output.
const PY_FETCH: &str = r#"
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
while True:
    b = c.recv(65536)
    if not b: break
    sys.stdout.buffer.write(b)
"#;

/// Two namespaces, A (10.77.1.1 behind port 0's veth `pa`) and B (10.77.2.1 behind port
/// 1's `pb`), each with the MAC l3fwd writes for its port (02:00:00:01:00:0p), a default
/// route via the PFE, whose MAC for port p is 02:00:00:00:00:0p, and TSO off (frames beyond
/// the MTU cannot leave a port). Returns the namespaces' names.
fn two_hosts(lab: &mut NetLab) -> Result<(String, String), String> {
    let (a, b) = (lab.netns("A")?, lab.netns("B")?);
    let (pa, pb) = (lab.name("pa"), lab.name("pb"));
    let (va, vb) = (lab.name("va"), lab.name("vb"));
    lab.veth(&pa, &va, Some(&a), 1500)?;
    lab.veth(&pb, &vb, Some(&b), 1500)?;
    for (ns, v, p, addr) in [(&a, &va, 0, "10.77.1.1/24"), (&b, &vb, 1, "10.77.2.1/24")] {
        let gw = if p == 0 { "10.77.1.254" } else { "10.77.2.254" };
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            ns,
            "link",
            "set",
            v,
            "address",
            &format!("02:00:00:01:00:0{p}"),
            "gso_max_segs",
            "1",
        ])?;
        ip(&["-n", ns, "addr", "add", addr, "dev", v])?;
        ip(&["-n", ns, "route", "add", "default", "via", gw])?;
        ip(&[
            "-n",
            ns,
            "neigh",
            "add",
            gw,
            "lladdr",
            &format!("02:00:00:00:00:0{p}"),
            "dev",
            v,
            "nud",
            "permanent",
        ])?;
    }
    Ok((a, b))
}

#[test]
fn l3fwd_forwards_ping_and_tcp_between_two_namespaces() {
    let test = "l3fwd_forwards_ping_and_tcp_between_two_namespaces";
    let Some(mut lab) = NetLab::new(test) else {
        return;
    };
    let python = Command::new("python3").arg("--version").output().is_ok();
    let setup = two_hosts(&mut lab);
    let (a, b) = match setup {
        Ok(x) => x,
        Err(e) => {
            println!("skipped {test}: the kernel refused the namespaces or veth pairs: {e}");
            return;
        }
    };
    let dir = lab.temp_dir().expect("temp dir");
    let routes = dir.join("routes.txt");
    std::fs::write(
        &routes,
        "# host A\n10.77.1.0/24 0\n# host B\n10.77.2.0/24 1\n",
    )
    .expect("route file");
    let (pa, pb) = (lab.name("pa"), lab.name("pb"));
    let pfemu = Pfemu::spawn(&[
        "run",
        "--program",
        "l3fwd",
        "--routes",
        routes.to_str().expect("utf-8 path"),
        "--iface",
        &format!("0={pa}"),
        "--iface",
        &format!("1={pb}"),
        "--ppe-threads",
        "2",
        "--stats-every",
        "0",
        "--json",
    ]);
    pfemu.wait_ready();

    // ping: the reply's TTL says the PFE forwarded it once each way (64 - 1), and the
    // receiving stacks checked the rewritten IPv4 checksums.
    let has_ping = Command::new("ping").arg("-V").output().is_ok();
    let pinged = if has_ping {
        in_ns(
            &a,
            &["ping", "-c", "3", "-i", "0.2", "-W", "5", "10.77.2.1"],
        )
    } else if python {
        in_ns(&a, &["python3", "-c", PY_PING, "10.77.2.1"])
    } else {
        Err("neither ping nor python3 is installed".into())
    };
    let pinged = match pinged {
        Ok(out) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) if !has_ping && !python => {
            println!("skipped the ping of {test}: {e}");
            String::new()
        }
        Err(e) => panic!("ping through pfemu failed: {e}"),
    };
    if !pinged.is_empty() {
        assert_eq!(
            pinged.matches("ttl=63").count(),
            3,
            "three replies with TTL 63: {pinged}"
        );
    }

    // TCP: 3 MB, compared byte for byte.
    let mut body_len = 0;
    if python {
        let body: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(dir.join("blob"), &body).expect("blob");
        let mut server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &b,
                "python3",
                "-c",
                PY_SERVE,
                "10.77.2.1",
                "8080",
            ])
            .arg(dir.join("blob"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts the server");
        let out = server.stdout.take().expect("server stdout");
        lab.children.push(server);
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(DEADLINE)
            .expect("the TCP server in namespace B starts within the deadline");
        assert!(line.contains("listening"), "server said: {line}");
        let got = in_ns(&a, &["python3", "-c", PY_FETCH, "10.77.2.1", "8080"])
            .expect("the transfer through pfemu");
        assert_eq!(got.len(), body.len(), "bytes transferred");
        assert!(got == body, "the bytes arrived intact");
        body_len = body.len();
    } else {
        println!("skipped the TCP transfer of {test}: python3 is not installed");
    }

    let (code, out) = pfemu.interrupt();
    assert_eq!(code, Some(0), "pfemu's exit status; its report: {out}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let ports = r["ports"]["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 2);
    for p in ports {
        assert_eq!(p["rx_kernel_drops"], 0, "{p}");
        assert_eq!(p["tx_errors"], serde_json::json!({}), "{p}");
    }
    let forwarded = r["engine"]["packets_out"].as_u64().expect("packets_out");
    assert!(forwarded >= 6, "pings and replies forwarded: {forwarded}");
    if body_len > 0 {
        // The body went from B (port 1) to A (port 0).
        assert!(
            ports[0]["tx_bytes"].as_u64().unwrap_or(0) > body_len as u64,
            "the body left port 0"
        );
        // The hosts left their TCP checksums to offload; the ports completed them.
        for p in ports {
            assert!(p["rx_checksums_completed"].as_u64().unwrap_or(0) > 0, "{p}");
        }
    }
}

/// A ping from A to B through l3fwd, once without and once with a route to B added
/// through the control plane while pfemu runs (`--control`); the trace (`--trace-host`,
/// JSON lines to a file) shows the first echo dropped for want of a route and the later
/// ones forwarded.
#[test]
fn a_route_added_through_the_control_plane_takes_effect_and_the_trace_shows_it() {
    let test = "a_route_added_through_the_control_plane_takes_effect_and_the_trace_shows_it";
    let Some(mut lab) = NetLab::new(test) else {
        return;
    };
    let (a, _b) = match two_hosts(&mut lab) {
        Ok(x) => x,
        Err(e) => {
            println!("skipped {test}: the kernel refused the namespaces or veth pairs: {e}");
            return;
        }
    };
    let has_ping = Command::new("ping").arg("-V").output().is_ok();
    let python = Command::new("python3").arg("--version").output().is_ok();
    if !has_ping && !python {
        println!("skipped {test}: neither ping nor python3 is installed");
        return;
    }
    let ping = |count: &str| {
        if has_ping {
            in_ns(
                &a,
                &["ping", "-c", count, "-i", "0.2", "-W", "2", "10.77.2.1"],
            )
        } else {
            in_ns(&a, &["python3", "-c", PY_PING, "10.77.2.1"])
        }
    };
    let dir = lab.temp_dir().expect("temp dir");
    let routes = dir.join("routes.txt");
    std::fs::write(&routes, "10.77.1.0/24 0\n").expect("route file");
    let trace = dir.join("trace.jsonl");
    let (pa, pb) = (lab.name("pa"), lab.name("pb"));
    let pfemu = Pfemu::spawn(&[
        "run",
        "--program",
        "l3fwd",
        "--routes",
        routes.to_str().expect("utf-8 path"),
        "--iface",
        &format!("0={pa}"),
        "--iface",
        &format!("1={pb}"),
        "--ppe-threads",
        "2",
        "--stats-every",
        "0",
        "--control",
        "127.0.0.1:0",
        "--trace-host",
        "10.77.2.1",
        "--trace-json",
        "--trace-file",
        trace.to_str().expect("utf-8 path"),
        "--json",
    ]);
    pfemu.wait_ready();
    let line = pfemu.wait_line("control: http://");
    let addr = line["control: http://".len()..]
        .split('/')
        .next()
        .expect("an address")
        .to_string();

    assert!(
        ping("1").is_err(),
        "no route to B yet, yet the ping came back"
    );
    let (status, body) = pfemu::lab::control::request(
        &addr,
        "POST",
        "/targets/routes/add",
        Some(&serde_json::json!({"route": "10.77.2.0/24", "port": 1})),
    )
    .expect("the control plane answers");
    assert_eq!(status, 200, "{body}");
    let pinged =
        String::from_utf8_lossy(&ping("3").expect("ping after the route was added")).into_owned();
    assert_eq!(pinged.matches("ttl=63").count(), 3, "{pinged}");
    let (status, body) = pfemu::lab::control::request(&addr, "GET", "/stats", None)
        .expect("the control plane answers");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        stats["dropped_by_reason"]["no_route"].as_u64() >= Some(1),
        "{stats}"
    );

    let (code, out) = pfemu.interrupt();
    assert_eq!(code, Some(0), "pfemu's exit status; its report: {out}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let written = r["trace"]["written"].as_u64().expect("the trace's summary");
    let text = std::fs::read_to_string(&trace).expect("the trace file");
    let verdicts: Vec<String> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            v["verdict"].as_str().expect("a verdict").to_string()
        })
        .collect();
    assert_eq!(verdicts.len() as u64, written, "{text}");
    assert_eq!(verdicts[0], "drop no_route", "the first echo: {text}");
    // Three echoes out of port 1 and three replies out of port 0.
    assert_eq!(
        verdicts.iter().filter(|v| v.starts_with("forward")).count(),
        6,
        "{verdicts:?}"
    );
}

/// Trio-ML's and FPISA's workers as processes in namespaces of their own, each behind its
/// own veth on a Linux bridge that joins them to one PFE port: `pfemu worker --iface` sends
/// the paper's packets as Ethernet frames on the wire, `pfemu run --program trio-ml` (or
/// `fpisa`) aggregates them on that port, and the Results (to the job's multicast group)
/// reach both workers, whose sums are exact. Each worker also sees the other's packets to
/// the aggregator (the bridge floods them) and must not take them for Results.
#[test]
fn worker_processes_in_namespaces_aggregate_through_a_bridge() {
    let test = "worker_processes_in_namespaces_aggregate_through_a_bridge";
    let Some(mut lab) = NetLab::new(test) else {
        return;
    };
    let setup = (|| -> Result<Vec<(String, String)>, String> {
        let br = lab.name("br");
        ip(&["link", "add", &br, "type", "bridge", "mcast_snooping", "0"])?;
        lab.links.push(br.clone());
        disable_ipv6(None, &br)?;
        ip(&["link", "set", &br, "up"])?;
        let (pp, pb) = (lab.name("pp"), lab.name("pb"));
        lab.veth(&pp, &pb, None, 1500)?;
        ip(&["link", "set", &pb, "master", &br])?;
        let mut workers = Vec::new();
        for w in 0..2 {
            let ns = lab.netns(&format!("W{w}"))?;
            let (bw, vw) = (lab.name(&format!("b{w}")), lab.name(&format!("v{w}")));
            lab.veth(&bw, &vw, Some(&ns), 1500)?;
            ip(&["link", "set", &bw, "master", &br])?;
            workers.push((ns, vw));
        }
        Ok(workers)
    })();
    let workers = match setup {
        Ok(w) => w,
        Err(e) => {
            println!("skipped {test}: the kernel refused a bridge, namespaces or veth: {e}");
            return;
        }
    };
    let pp = lab.name("pp");
    for (program, fpisa) in [("trio-ml", false), ("fpisa", true)] {
        let pfemu = Pfemu::spawn(&[
            "run",
            "--program",
            program,
            "--job",
            "1:2",
            // No block timeout: every block waits for its second worker. The workers are
            // processes started one after the other, and on a loaded machine the second
            // one's first packets came later than a timeout (the default 20 ms, even the
            // longest, 255 ms) after the first one's: a window of degraded chunks, not
            // exact sums.
            "--block-exp-ms",
            "off",
            "--iface",
            &format!("1={pp}"),
            "--ppe-threads",
            "2",
            "--stats-every",
            "0",
            "--json",
        ]);
        pfemu.wait_ready();
        let (tx, rx) = crossbeam_channel::unbounded();
        for (w, (ns, vw)) in workers.iter().enumerate() {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_pfemu"), "worker"])
                .args(["--iface", vw, "--src", &w.to_string(), "--workers", "2"])
                .args(["--gradients", "20000", "--grads-per-packet", "256"])
                .args(["--window", "8", "--give-up-s", "15", "--json"]);
            if fpisa {
                cmd.arg("--fpisa");
            }
            let child = cmd
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starts a worker");
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = tx.send((w, child.wait_with_output()));
            });
        }
        for _ in 0..2 {
            let (w, out) = rx.recv_timeout(DEADLINE).unwrap_or_else(|_| {
                panic!("{program}: a worker did not finish within {DEADLINE:?}")
            });
            let out = out.expect("the worker ran");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{program}: worker {w} failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let r: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
            assert_eq!(r["exact"], true, "{program}: worker {w}: {r}");
            assert_eq!(r["compared"], 20000, "{program}: worker {w}: {r}");
        }
        let (code, out) = pfemu.interrupt();
        assert_eq!(
            code,
            Some(0),
            "{program}: pfemu's exit status; its report: {out}"
        );
    }
}

/// The README shows `pfemu run --help` as it is.
#[test]
fn the_readme_shows_pfemu_run_help_as_it_is() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let start = "`pfemu run --help` lists every option:\n\n```text\n";
    let at = readme.find(start).expect("the README's help block") + start.len();
    let shown = &readme[at..at + readme[at..].find("\n```").expect("its end")];
    let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(["run", "--help"])
        .output()
        .expect("runs pfemu");
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        shown,
        help.trim_end(),
        "README's `pfemu run --help` block is out of date: paste `pfemu run --help` in"
    );
}

#[test]
fn a_tap_port_creates_its_device_for_as_long_as_it_is_open() {
    let Some(lab) = NetLab::new("a_tap_port_creates_its_device_for_as_long_as_it_is_open") else {
        return;
    };
    let tap = lab.name("newtap");
    let sys = PathBuf::from(format!("/sys/class/net/{tap}"));
    assert!(!sys.exists());
    let ports = match pfemu::lab::ports::LivePorts::open(&PortsConfig::new(vec![PortSpec::tap(
        &format!("0={tap}"),
    )
    .expect("spec")]))
    {
        Ok(p) => p,
        Err(e) => {
            println!("skipped: the kernel refused a TAP device: {e}");
            return;
        }
    };
    assert!(
        sys.exists(),
        "the TAP device {tap} exists while its port is open"
    );
    let up = std::fs::read_to_string(sys.join("flags")).expect("flags");
    let flags = u32::from_str_radix(up.trim().trim_start_matches("0x"), 16).expect("hex");
    assert_eq!(flags & 1, 1, "and it is up");
    drop(ports);
    // A child another test forks in that moment holds a copy of the descriptor until it
    // execs (close-on-exec), so the device may outlive the port by that much.
    wait_for(
        &format!("the TAP device {tap} pfemu made to go with its port"),
        || !sys.exists(),
        std::thread::sleep,
    );
}

#[test]
fn the_ports_bench_accounts_for_every_frame_it_offers() {
    let _alone = alone();
    let Some(mut lab) = NetLab::new("the_ports_bench_accounts_for_every_frame_it_offers") else {
        return;
    };
    let (g0, p0, p1, s1) = (
        lab.name("g0"),
        lab.name("p0"),
        lab.name("p1"),
        lab.name("s1"),
    );
    if let Err(e) = lab
        .veth(&g0, &p0, None, 1500)
        .and_then(|()| lab.veth(&p1, &s1, None, 1500))
    {
        println!("skipped: the kernel refused a veth pair: {e}");
        return;
    }
    let r = pfemu::lab::live::bench::run(&pfemu::lab::live::bench::PortsBenchConfig {
        offer: g0,
        port0: p0,
        port1: p1,
        size: 64,
        flows: 16,
        duration_s: 0.2,
        ppe_threads: 2,
        in_process: false,
    })
    .expect("the bench runs");
    assert!(r.offered > 0 && r.port_out > 0, "{r:#?}");
    assert_eq!(r.offer_stopped, None, "{r:#?}");
    assert_eq!(r.offer_errors, 0, "{r:#?}");
    // Exact whether or not the veth's backlog overflowed: a frame it dropped was refused
    // with ENOBUFS, offered and counted lost once (the veth's own counters count it on both
    // ends, and also count attempts the generator sent again).
    assert!(r.accounted(), "{r:#?}");
    // The drain ended on the count: port 0 counted every frame the veth took.
    assert_eq!(r.drain_missing, None, "{r:#?}");
    assert!(r.veth_dropped <= r.veth_drop_counters, "{r:#?}");
    // The premise of veth_dropped: this kernel's veth reports every drop to the sender, so
    // the frames it delivered to port 0 are the ones offered less those.
    assert_eq!(r.veth_delivered, r.offered - r.veth_dropped, "{r:#?}");
    assert_eq!(
        r.port_out, r.port_in,
        "the filter forwards every plain IPv4 frame"
    );
}

/// Holds `N` packet sockets on interface `IFACE` (argv 1 and 2), each with a tiny receive
/// buffer, until killed: the kernel hands every frame arriving on `IFACE` to each of them
/// (and drops it there), which makes receiving a frame on it that much slower.
const PY_LISTENERS: &str = r#"
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.bind((sys.argv[1], 0))
    held.append(s)
print('ready', flush=True)
while True:
    time.sleep(3600)
"#;

/// The CPUs this process may run on (`Cpus_allowed_list` of /proc/self/status).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("");
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            cpus.extend(a..=b);
        }
    }
    cpus
}

/// Runs `cmd` to its end, failing the test if it takes longer than the deadline.
fn output_within(mut cmd: Command, what: &str) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let pid = child.id();
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(out) => out.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{what} did not end within {DEADLINE:?}")
        }
    }
}

#[test]
fn the_ports_bench_accounts_for_frames_the_veth_drops() {
    let _alone = alone();
    let test = "the_ports_bench_accounts_for_frames_the_veth_drops";
    let Some(mut lab) = NetLab::new(test) else {
        return;
    };
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        println!("skipped {test}: it needs two CPUs (the generator on one, port 0's on another)");
        return;
    }
    for tool in ["python3", "taskset"] {
        if Command::new(tool).arg("--version").output().is_err() {
            println!("skipped {test}: {tool} is not installed");
            return;
        }
    }
    let Some(dev) = search_pairs(&mut lab) else {
        return;
    };
    // The frames the generator sends on the first CPU are received on port 0's interface
    // on the last (RPS), where every one is also handed to 100 sockets: the veth's backlog
    // on that CPU fills faster than it empties, and the veth drops frames (ENOBUFS).
    let (first, last) = (cpus[0], cpus[cpus.len() - 1]);
    let rps = format!("/sys/class/net/{}/queues/rx-0/rps_cpus", dev.port0);
    let mask = format!("{:x}", 1u128 << last);
    if let Err(e) = std::fs::write(&rps, &mask) {
        println!(
            "skipped {test}: cannot steer {}'s frames to CPU {last} ({rps}: {e})",
            dev.port0
        );
        return;
    }
    let mut listeners = Command::new("python3")
        .args(["-c", PY_LISTENERS, &dev.port0, "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts the listeners");
    let out = listeners.stdout.take().expect("the listeners' stdout");
    lab.children.push(listeners);
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(DEADLINE)
        .expect("the listeners start within the deadline");
    assert!(line.contains("ready"), "the listeners said: {line}");

    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &first.to_string(), env!("CARGO_BIN_EXE_pfemu")]);
    cmd.args([
        "bench", "ports", "--offer", &dev.offer, "--port0", &dev.port0,
    ]);
    cmd.args(["--port1", &dev.port1, "--duration", "1", "--flows", "16"]);
    cmd.args(["--ppe-threads", "1", "--no-in-process", "--json"]);
    let out = output_within(cmd, "pfemu bench ports");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("`{k}` in {r}"));
    if n("veth_dropped") == 0 {
        // How fast each CPU drains is the machine's business: the accounting below holds
        // either way, but this run did not show the drops it is about.
        println!("note {test}: the veth's backlog did not overflow this time: {r}");
    }
    assert_eq!(r["accounted"], true, "{r}");
    assert_eq!(
        n("offered"),
        n("veth_dropped") + n("port_in") + n("port_dropped"),
        "every frame offered (ENOBUFS ones included) is lost on the veth once, or at port 0: {r}"
    );
    assert!(n("veth_drop_counters") >= n("veth_dropped"), "{r}");
    assert_eq!(
        n("veth_delivered"),
        n("offered") - n("veth_dropped"),
        "this kernel's veth reports every drop to the sender (ENOBUFS): it delivered the \
         rest to port 0: {r}"
    );
    assert_eq!(r["offer_stopped"], serde_json::Value::Null, "{r}");
    assert_eq!(n("offer_errors"), 0, "{r}");
}

// ----- RFC 2544 through a veth pair (pfemu bench ports --search) --------------------------------

/// A veth pair for the generator (`g0` - `p0`, port 0) and one out of port 1 (`p1` - `s1`),
/// IPv6 off on all four (so nothing but the trials' frames crosses them): the device's
/// settings, or `None` (printed) when the kernel refuses.
fn search_pairs(lab: &mut NetLab) -> Option<pfemu::lab::live::bench::VethDeviceConfig> {
    let (g0, p0, p1, s1) = (
        lab.name("g0"),
        lab.name("p0"),
        lab.name("p1"),
        lab.name("s1"),
    );
    if let Err(e) = lab
        .veth(&g0, &p0, None, 1500)
        .and_then(|()| lab.veth(&p1, &s1, None, 1500))
    {
        println!("skipped: the kernel refused a veth pair: {e}");
        return None;
    }
    Some(pfemu::lab::live::bench::VethDeviceConfig {
        offer: g0,
        port0: p0,
        port1: p1,
        flows: 16,
        ppe_threads: 2,
    })
}

/// The trials a search recorded are consistent with what the device counted: no more out
/// than in, never more offered than the rate called for, every trial drained and every
/// frame accounted for (lost on the veth, in port 0's ring, or through).
fn check_trials(
    row: &pfemu::lab::bench::linerate::Row,
    trials: &[pfemu::lab::live::bench::VethTrial],
) {
    assert_eq!(row.trials.len(), trials.len(), "{row:#?}\n{trials:#?}");
    for (rec, t) in row.trials.iter().zip(trials) {
        assert_eq!((rec.offered, rec.received), (t.offered, t.received));
        assert_eq!(rec.expected, t.scheduled, "{t:#?}");
        assert!(t.received <= t.offered, "more out than offered: {t:#?}");
        assert!(
            t.offered + t.refused + t.behind <= t.scheduled,
            "more sent than scheduled: {t:#?}"
        );
        assert!(
            t.drained,
            "the trial's frames did not come out in time: {t:#?}"
        );
        assert!(t.accounted(), "frames unaccounted for: {t:#?}");
        assert_eq!(t.drain_missing, None, "{t:#?}");
        assert_eq!(
            t.veth_delivered,
            t.offered - t.veth_dropped,
            "the veth delivered to port 0 what it did not refuse with ENOBUFS: {t:#?}"
        );
        assert_eq!(
            t.received, t.port_in,
            "the filter forwards every plain IPv4 frame it takes: {t:#?}"
        );
    }
}

#[test]
fn a_search_through_a_veth_pair_carries_a_tiny_line_rate_without_loss() {
    let _alone = alone();
    use pfemu::lab::bench::linerate::{self, LinerateConfig};
    use pfemu::lab::live::bench::VethDevice;

    let Some(mut lab) = NetLab::new("a_search_through_a_veth_pair_carries_a_tiny_line_rate") else {
        return;
    };
    let Some(dev_cfg) = search_pairs(&mut lab) else {
        return;
    };
    let mut dev = VethDevice::start(&dev_cfg).expect("the ports bind");
    // 1000 frames/s of 64 B (84 B on the wire, 672 bits each): any machine carries it.
    let cfg = LinerateConfig {
        sizes: vec![64],
        line_rate_gbps: 672e-9 * 1000.0,
        trial_duration: Duration::from_millis(200),
        resolution: 0.05,
        max_trials_per_size: 3,
        // A loaded machine can keep the generator off a core past the trial's end (its
        // grace is 10 ms here), so the last frames go unsent: the pass asks for 1% of them
        // (so no slow phase of the machine fails it), and zero loss of those offered is
        // checked below.
        offered_tolerance: 0.99,
        ..LinerateConfig::default()
    };
    let report = linerate::search(&mut dev, &cfg, |_| {}).expect("the search runs");
    let trials = dev.trials().to_vec();
    let live = dev.stop().expect("stops");
    let row = &report.rows[0];
    check_trials(row, &trials);
    assert_eq!(
        row.trials.len(),
        1,
        "the line rate passes at once: {row:#?}\n{trials:#?}"
    );
    assert!((row.line_rate_pps - 1000.0).abs() < 1e-6, "{row:#?}");
    assert_eq!(row.percent_of_line_rate, 100.0, "{row:#?}");
    let t = &trials[0];
    assert_eq!(t.scheduled, 200, "{t:#?}");
    assert_eq!(
        (t.offered + t.behind, t.refused),
        (200, 0),
        "every frame scheduled was offered or left unsent at the end: {t:#?}"
    );
    assert!(t.offered >= 2, "{t:#?}");
    assert_eq!(t.received, t.offered, "none lost: {t:#?}");
    assert_eq!((t.veth_dropped, t.port_dropped), (0, 0), "{t:#?}");
    assert!(live.accounted(), "{live:#?}");
    assert_eq!(live.ports.ports[1].tx_frames, t.received, "{live:#?}");
}

#[test]
fn a_search_through_a_veth_pair_at_an_impossible_line_rate_records_consistent_trials() {
    let _alone = alone();
    use pfemu::lab::bench::linerate::{self, LinerateConfig};
    use pfemu::lab::live::bench::VethDevice;

    let Some(mut lab) = NetLab::new("a_search_at_an_impossible_line_rate") else {
        return;
    };
    let Some(dev_cfg) = search_pairs(&mut lab) else {
        return;
    };
    let mut dev = VethDevice::start(&dev_cfg).expect("the ports bind");
    // 100 Gbit/s of 64 B frames is 148.8 Mpps: no sendmmsg loop offers that into a veth.
    let cfg = LinerateConfig {
        sizes: vec![64],
        line_rate_gbps: 100.0,
        trial_duration: Duration::from_millis(100),
        max_trials_per_size: 3,
        ..LinerateConfig::default()
    };
    let report = linerate::search(&mut dev, &cfg, |_| {}).expect("the search runs");
    let trials = dev.trials().to_vec();
    let live = dev.stop().expect("stops");
    let row = &report.rows[0];
    check_trials(row, &trials);
    assert!(!row.trials[0].pass, "the line rate cannot pass: {row:#?}");
    assert!(row.trials[0].offered > 0, "{row:#?}");
    assert!((1..=3).contains(&row.trials.len()), "{row:#?}");
    assert!(row.percent_of_line_rate < 100.0, "{row:#?}");
    if let Some(best) = row.trials.iter().rfind(|t| t.pass) {
        assert_eq!(row.throughput_pps, best.rate_pps, "{row:#?}");
    }
    assert!(live.accounted(), "{live:#?}");
    let offered: u64 = trials.iter().map(|t| t.offered).sum();
    let lost: u64 = trials.iter().map(|t| t.veth_dropped + t.port_dropped).sum();
    assert_eq!(
        live.ports.ports[0].rx_frames + lost,
        offered,
        "every frame offered over the search was taken by port 0 or lost on the way"
    );
}

#[test]
fn bench_ports_search_refuses_bad_options_naming_them() {
    // Refused before any interface is looked at: no root or veth needed.
    let base = [
        "bench", "ports", "--offer", "nosuch0", "--port0", "nosuch1", "--port1", "nosuch2",
    ];
    for (args, option) in [
        (&["--search", "--trial-ms=0"][..], "--trial-ms"),
        (&["--search", "--trial-ms=100000000"], "--trial-ms"),
        (&["--search", "--loss=-1"], "--loss"),
        (&["--search", "--loss=NaN"], "--loss"),
        (&["--search", "--loss=100"], "--loss"),
        (&["--search", "--resolution=0"], "--resolution"),
        (&["--search", "--resolution=nan"], "--resolution"),
        (&["--search", "--line-rate=0"], "--line-rate"),
        (&["--search", "--line-rate=-10"], "--line-rate"),
        (&["--search", "--line-rate=NaN"], "--line-rate"),
        (&["--search", "--line-rate=1e12"], "--line-rate"),
        (&["--search", "--max-trials=0"], "--max-trials"),
        (&["--search", "--max-trials=1000"], "--max-trials"),
        (&["--search", "--sizes=10"], "--sizes"),
        (&["--search", "--sizes=100000"], "--sizes"),
        (&["--search", "--ppe-threads=0"], "--ppe-threads"),
        (&["--search", "--flows=0"], "--flows"),
        (&["--search", "--size=128"], "--size"),
        (&["--search", "--duration=3"], "--duration"),
        (&["--sizes=64"], "--sizes"),
        (&["--trial-ms=100"], "--trial-ms"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
            .args(base)
            .args(args)
            .output()
            .expect("runs pfemu");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(option),
            "{args:?}: the error names {option}: {err}"
        );
        assert!(
            !err.contains("nosuch"),
            "{args:?}: refused before the interfaces are looked at: {err}"
        );
    }
}

// ----- the other programs on live ports --------------------------------------------------------

/// Two interfaces in the root namespace joined to `ports` of a live program: returns the
/// test's ends, in port order.
fn pairs(lab: &mut NetLab, ports: &[u16]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for p in ports {
        let (host, pfe) = (lab.name(&format!("h{p}")), lab.name(&format!("p{p}")));
        lab.veth(&host, &pfe, None, 1500)?;
        out.push((host, pfe));
    }
    Ok(out)
}

#[test]
fn nimble_admits_within_its_bucket_on_live_ports() {
    let Some(mut lab) = NetLab::new("nimble_admits_within_its_bucket_on_live_ports") else {
        return;
    };
    let ends = match pairs(&mut lab, &[0, 1]) {
        Ok(e) => e,
        Err(e) => {
            println!("skipped: the kernel refused a veth pair: {e}");
            return;
        }
    };
    // 100 frames of 64 bytes fit a 64 KiB bucket whatever the time: all are admitted.
    let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 64, 64);
    let cfg = LiveConfig {
        ppe_threads: 2,
        ..LiveConfig::new(
            LiveProgram::Nimble(pfemu::lab::live::NimbleSetup {
                rates_bps: vec![10_000_000_000],
                ..Default::default()
            }),
            PortsConfig::new(vec![
                PortSpec::interface(&format!("0={}", ends[0].1)).expect("spec"),
                PortSpec::interface(&format!("1={}", ends[1].1)).expect("spec"),
            ]),
        )
    };
    let live = Live::start(&cfg).expect("the ports bind");
    let tx = RawSocket::open(&ends[0].0, false).expect("sender");
    let rx = RawSocket::open(&ends[1].0, true).expect("receiver");
    let (sent, err) = tx.send(std::iter::repeat_n(&frame[..], 100));
    assert_eq!(sent, 100, "{err:?}");
    let mut buf = vec![0u8; 2048];
    let got = std::cell::Cell::new(0);
    wait_for_live(
        &live,
        &format!("the 100 admitted frames on {}", ends[1].0),
        || got.get() >= 100,
        |d| {
            if rx.wait(d).unwrap_or(false) {
                while let Ok(Some(_)) = rx.try_recv(&mut buf) {
                    got.set(got.get() + 1);
                }
            }
        },
    );
    let r = live.stop().expect("stops");
    let ProgramCounters::Nimble(classes) = &r.counters else {
        panic!("Nimble's counters are missing: {:?}", r.counters);
    };
    assert_eq!(classes[0].admitted_packets, 100);
    assert_eq!(r.ports.ports[1].tx_frames, 100);
    assert!(r.accounted(), "{r:#?}");
}

#[test]
fn trio_ml_aggregates_workers_behind_a_live_port() {
    aggregate_behind_a_live_port(
        "trio_ml_aggregates_workers_behind_a_live_port",
        pfemu::lab::aggregation::Aggregation::TrioMl,
    );
}

#[test]
fn fpisa_aggregates_workers_behind_a_live_port() {
    aggregate_behind_a_live_port(
        "fpisa_aggregates_workers_behind_a_live_port",
        pfemu::lab::aggregation::Aggregation::Fpisa(pfemu::fpisa::Variant::Full),
    );
}

/// Two workers send job 1's packets (integers for Trio-ML, FP32 for FPISA) as Ethernet
/// frames into a veth whose peer is port 1; the Results leave port 1 and both workers get
/// every sum, exact.
fn aggregate_behind_a_live_port(test: &str, aggregation: pfemu::lab::aggregation::Aggregation) {
    use pfemu::lab::aggregation::{Aggregation, AggregationSetup};
    use pfemu::lab::serve::{expected_float_sums, expected_int_sums, seeded_floats, seeded_ints};
    use pfemu::microcode::trio_ml::host::{Worker, WorkerConfig};
    use pfemu::microcode::trio_ml::TrioMlConfig;

    let Some(mut lab) = NetLab::new(test) else {
        return;
    };
    let ends = match pairs(&mut lab, &[1]) {
        Ok(e) => e,
        Err(e) => {
            println!("skipped {test}: the kernel refused a veth pair: {e}");
            return;
        }
    };
    // Job 1, sources 0 and 1; its Results leave port 1, where the workers are. The engine
    // runs on a manual clock nobody moves: no block times out (the default timeout is
    // 20 ms), so every Result has both workers in however long this thread or the port's
    // is held up between their packets on a loaded machine, and the sums are exact.
    let cfg = LiveConfig {
        ppe_threads: 2,
        clock: Some(Arc::new(pfemu::timer::ManualClock::new())),
        ..LiveConfig::new(
            LiveProgram::Aggregation(AggregationSetup::new(
                aggregation,
                vec!["1:2".parse().expect("job")],
            )),
            PortsConfig::new(vec![
                PortSpec::interface(&format!("1={}", ends[0].1)).expect("spec")
            ]),
        )
    };
    let live = Live::start(&cfg).expect("the ports bind");
    let sock = RawSocket::open(&ends[0].0, true).expect("the workers' socket");
    let (seed, n) = (11, 3000);
    let float = matches!(aggregation, Aggregation::Fpisa(_));
    let mut workers: Vec<Worker> = (0..2u8)
        .map(|w| {
            let wcfg = WorkerConfig {
                grads_per_packet: 256,
                window: 8,
                ..WorkerConfig::new(1, w, TrioMlConfig::default().local_addr)
            };
            if float {
                Worker::from_f32(wcfg, &seeded_floats(seed, w, n))
            } else {
                Worker::new(wcfg, seeded_ints(seed, w, n))
            }
            .expect("worker")
        })
        .collect();
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    let end = Instant::now() + DEADLINE;
    while !workers.iter().all(Worker::is_done) {
        assert!(
            Instant::now() < end,
            "timed out waiting for the Results: {} and {} chunks missing: {:#?}",
            workers[0].missing(),
            workers[1].missing(),
            live.report()
        );
        for w in &mut workers {
            out.clear();
            w.poll(0, &mut out);
            let (sent, err) = sock.send(out.iter().map(Vec::as_slice));
            assert_eq!(sent as usize, out.len(), "{err:?}");
        }
        if sock.wait(Duration::from_millis(50)).expect("poll") {
            while let Some(k) = sock.try_recv(&mut buf).expect("recv") {
                for w in &mut workers {
                    w.on_frame(&buf[..k]).expect("a frame the worker can read");
                }
            }
        }
    }
    for w in &workers {
        if float {
            assert_eq!(w.float_sums(), expected_float_sums(seed, &[0, 1], n));
        } else {
            assert_eq!(w.sums(), &expected_int_sums(seed, &[0, 1], n)[..]);
        }
    }
    let r = live.stop().expect("stops");
    assert_eq!(r.engine.consumed, r.engine.packets_in, "{:#?}", r.engine);
    assert!(r.accounted(), "{r:#?}");
}

#[test]
fn without_the_capability_the_error_names_the_interface() {
    if !is_root() {
        println!("skipped: not root (it drops root's privileges to see the error)");
        return;
    }
    // `nobody`, without capabilities, on the loopback interface every machine has.
    let out = match Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_pfemu"))
        .args(["run", "--iface", "0=lo", "--duration", "1"])
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            println!("skipped: cannot run setpriv (util-linux): {e}");
            return;
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("setpriv:") || err.contains("Permission denied") && !err.contains("pfemu") {
        println!("skipped: setpriv could not run pfemu as nobody here: {err}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("interface lo") && err.contains("permission denied") && err.contains("root"),
        "{err}"
    );
}

/// Serialises the tests that load the machine (floods, the ports bench, its line-rate
/// search): each measures or floods as if it had the cores to itself, and a flood beside a
/// zero-loss search would make the search's result the scheduler's.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed holding it leaves it poisoned: the others still run.
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

// ----- stopping under a flood ------------------------------------------------------------------

/// The longest a stop may take under a flood before the test calls it a hang (a deadline for
/// a hang, not a measure of speed).
const STOP_DEADLINE: Duration = Duration::from_secs(30);

/// Threads flooding a port: more than its RX thread (with the engine's) gets of the cores,
/// so frames always wait for it.
const FLOOD_SENDERS: usize = 3;

/// A thread that keeps frames flowing into an interface, as fast as `sendmmsg` goes, until
/// told to stop (or for at most twice [`STOP_DEADLINE`] and the setup's deadline).
struct Flood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<FloodCount>>,
}

/// What a [`Flood`] sent.
#[derive(Debug)]
struct FloodCount {
    /// Frames the kernel took.
    accepted: u64,
    /// Frames it refused with `ENOBUFS` (dropped on a veth whose backlog was full).
    enobufs: u64,
    /// The first other error, which ends the flood.
    error: Option<String>,
}

impl Flood {
    /// `senders` threads, each with its own socket on `iface`.
    fn start(iface: &str, senders: usize) -> Flood {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..senders)
            .map(|_| {
                let sock = RawSocket::open(iface, false).expect("the flood's socket");
                let flag = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 64, 64);
                    let end = Instant::now() + 2 * STOP_DEADLINE + DEADLINE;
                    let mut c = FloodCount {
                        accepted: 0,
                        enobufs: 0,
                        error: None,
                    };
                    while !flag.load(Ordering::Relaxed) && Instant::now() < end {
                        let (ok, errors) = sock.send_counting(std::iter::repeat_n(&frame[..], 64));
                        c.accepted += ok;
                        for e in errors {
                            if e.raw_os_error() == Some(libc::ENOBUFS) {
                                c.enobufs += 1;
                            } else {
                                c.error = Some(e.to_string());
                                return c;
                            }
                        }
                    }
                    c
                })
            })
            .collect();
        Flood { stop, threads }
    }

    /// Whether the flood still runs (every sender).
    fn flowing(&self) -> bool {
        !self.threads.is_empty() && self.threads.iter().all(|t| !t.is_finished())
    }

    /// Stops the flood and returns what it sent, summed over the senders.
    fn finish(mut self) -> FloodCount {
        self.stop.store(true, Ordering::Relaxed);
        let mut sum = FloodCount {
            accepted: 0,
            enobufs: 0,
            error: None,
        };
        for t in std::mem::take(&mut self.threads) {
            let c = t.join().expect("a sender's thread");
            sum.accepted += c.accepted;
            sum.enobufs += c.enobufs;
            sum.error = sum.error.or(c.error);
        }
        sum
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }
}

/// Starts the filter on `port` (port 0 only: what it forwards to port 1 is dropped as
/// `no_such_port`), floods it through `send` until `overflowing()` says the port cannot keep
/// up (so a frame is always waiting for its RX thread), and stops the run while the flood
/// goes on. Fails if the stop does not return within [`STOP_DEADLINE`]; returns the report
/// and what the flood sent in all (stopped after the run was).
fn stop_under_a_flood(
    port: PortSpec,
    send: &str,
    overflowing: impl Fn(&Live) -> bool,
) -> (pfemu::lab::live::LiveReport, FloodCount) {
    let cfg = LiveConfig {
        ppe_threads: 1,
        ..LiveConfig::new(LiveProgram::Filter, PortsConfig::new(vec![port]))
    };
    let live = Live::start(&cfg).expect("the port binds");
    let flood = Flood::start(send, FLOOD_SENDERS);
    // Whether the flood outruns the port is the machine's business: the stop must return
    // and the counters add up either way, but without an overflow the run does not show
    // what it is about (it did when it was written: without the fix, it hung).
    let end = Instant::now() + DEADLINE;
    while !overflowing(&live) {
        assert!(flood.flowing(), "the flood stopped early");
        if Instant::now() >= end {
            println!("note: the flood did not overflow the port within {DEADLINE:?}");
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let stopper = std::thread::spawn(move || {
        let _ = tx.send(live.stop());
    });
    let r = match rx.recv_timeout(STOP_DEADLINE) {
        Ok(r) => r.expect("stops"),
        Err(_) => panic!(
            "Live::stop did not return within {STOP_DEADLINE:?} while frames kept arriving \
             (the RX thread never looked at its stop flag?)"
        ),
    };
    // (Whether the senders got a core during the stop is the scheduler's business.)
    assert!(flood.flowing(), "the flood still ran while the run stopped");
    let _ = stopper.join();
    let sent = flood.finish();
    assert_eq!(sent.error, None, "the flood's sends: {sent:?}");
    (r, sent)
}

#[test]
fn an_interface_port_stops_while_frames_keep_arriving() {
    let _alone = alone();
    let Some((_lab, s0, p0)) =
        NetLab::with_veth_pair("an_interface_port_stops_while_frames_keep_arriving")
    else {
        return;
    };
    let port = PortSpec::interface(&format!("0={p0}")).expect("spec");
    let (r, sent) = stop_under_a_flood(port, &s0, |live| {
        live.report().ports.ports[0].rx_kernel_drops > 0
    });
    let p = &r.ports.ports[0];
    assert!(r.accounted(), "{r:#?}");
    assert!(p.rx_frames > 0, "{p:#?}");
    // Every frame the port counts (injected, dropped by the full ring, left in it at the
    // stop) is one the flood sent: none counted twice, none made up.
    assert!(
        p.rx_frames + p.rx_dropped() <= sent.accepted,
        "the port counted more frames than were sent: {p:#?}\n{sent:?}"
    );
    assert_eq!(p.rx_errors, 0, "{p:#?}");
}

#[test]
fn a_tap_port_stops_while_frames_keep_arriving() {
    let _alone = alone();
    let Some(mut lab) = NetLab::new("a_tap_port_stops_while_frames_keep_arriving") else {
        return;
    };
    let Some(tap) = lab.tap("a_tap_port_stops_while_frames_keep_arriving") else {
        return;
    };
    // A long queue, so the host's senders keep frames waiting for the port even when the
    // machine's scheduler pauses them all for a moment.
    ip(&["link", "set", &tap, "txqueuelen", "100000"]).expect("txqueuelen");
    let port = PortSpec::tap(&format!("0={tap}")).expect("spec");
    let tx_dropped = || {
        std::fs::read_to_string(format!("/sys/class/net/{tap}/statistics/tx_dropped"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    // The host's frames wait in the TAP device's queue; when the port reads slower than
    // the host sends, it overflows and the device counts TX drops.
    let before_stop = std::cell::Cell::new(0);
    let (r, sent) = stop_under_a_flood(port, &tap, |_| {
        before_stop.set(tx_dropped());
        before_stop.get() > 0
    });
    let p = &r.ports.ports[0];
    assert!(r.accounted(), "{r:#?}");
    assert!(p.rx_frames > 0, "{p:#?}");
    assert!(
        p.rx_frames + p.rx_dropped() <= sent.accepted,
        "the port counted more frames than were sent: {p:#?}\n{sent:?}"
    );
    // The port's drops are the device's (what it dropped up to the stop): those seen
    // before, and no more than it counts in all.
    assert!(
        (before_stop.get()..=tx_dropped()).contains(&p.rx_kernel_drops),
        "the device dropped {} frames before the stop and {} in all: {p:#?}",
        before_stop.get(),
        tx_dropped()
    );
    assert_eq!(p.rx_errors, 0, "{p:#?}");
}

/// Sends `n` copies of `frame` into `iface` through `tx`, each accepted by the kernel (a
/// veth that refuses one with `ENOBUFS` gets it again).
fn send_exactly(tx: &RawSocket, frame: &[u8], n: u64) {
    let end = Instant::now() + DEADLINE;
    let mut sent = 0;
    while sent < n {
        assert!(
            Instant::now() < end,
            "sent only {sent} of {n} frames into {} within {DEADLINE:?}",
            tx.name()
        );
        let (ok, errors) =
            tx.send_counting(std::iter::repeat_n(frame, (n - sent).min(64) as usize));
        sent += ok;
        for e in errors {
            assert_eq!(
                e.raw_os_error(),
                Some(libc::ENOBUFS),
                "sending into {}: {e}",
                tx.name()
            );
        }
    }
}

/// Receives from `observer` until it has seen `n` frames, within the deadline.
fn observe(observer: &RawSocket, n: u64, what: &str) {
    let (mut seen, mut buf) = (0u64, vec![0u8; 2048]);
    wait_for(
        &format!(
            "the observer on {} to see {what} ({n} frames)",
            observer.name()
        ),
        || {
            while let Ok(Some(_)) = observer.try_recv(&mut buf) {
                seen += 1;
            }
            seen >= n
        },
        |d| {
            let _ = observer.wait(d);
        },
    );
}

/// A stopped interface port takes no more frames, although its socket stays open (for
/// sending) as long as the engine lives: frames that arrive after `RunningPorts::stop`
/// enter none of its counters, nor the kernel's count for it, so the stop's counts are
/// final, and every frame the kernel handed the port is taken or counted as dropped.
///
/// The observer that says when frames have arrived is opened before the port: the kernel
/// offers a frame to an interface's packet sockets newest first, each frame to all of them
/// before the next, and the stop's rebinding makes the port's socket the newest again. So
/// once the observer has seen a frame, the port's socket was offered it: without the stop's
/// drop-all filter, every frame sent after the stop is in the port's kernel count when the
/// test reads it (it then fails by exactly that many), and no wait depends on the clock.
#[test]
fn a_stopped_interface_port_takes_no_more_frames() {
    let Some((_lab, s0, p0)) =
        NetLab::with_veth_pair("a_stopped_interface_port_takes_no_more_frames")
    else {
        return;
    };
    const BEFORE: u64 = 200;
    const AFTER: u64 = 300;
    // Before the port: the port's socket is offered each frame first (see above).
    let observer = RawSocket::open(&p0, true).expect("the observer's socket");
    // The sink (and with it the port's socket) outlives the stop: the engine holds it.
    let (sink, running, pfe) = filter_on_ports(&PortsConfig::new(vec![PortSpec::interface(
        &format!("0={p0}"),
    )
    .expect("spec")]));
    let tx = RawSocket::open(&s0, false).expect("the sender's socket");
    let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 64, 64);

    // Once the observer has them, the port's ring holds them (or the port took them), and
    // the stop takes every frame its ring holds.
    send_exactly(&tx, &frame, BEFORE);
    observe(&observer, BEFORE, "the frames sent before the stop");
    let stopped = running.stop();
    let at_stop = stopped.ports[0].clone();
    assert!(at_stop.rx_accounted(), "{at_stop:#?}");
    assert_eq!(
        (at_stop.rx_kernel_frames, at_stop.rx_frames),
        (BEFORE, BEFORE),
        "the kernel handed the port the frames sent, and it took them all: {at_stop:#?}"
    );

    // Frames arriving now reach the interface (the observer sees them all, each after the
    // port's socket was offered it), but not the port.
    send_exactly(&tx, &frame, AFTER);
    observe(&observer, AFTER, "the frames sent after the stop");
    let after = sink.report().ports[0].clone();
    assert_eq!(
        after.rx_kernel_frames,
        at_stop.rx_kernel_frames,
        "{AFTER} frames arrived at {p0} after the stop; the stopped port's socket took \
         {} of them, which no counter of the stop's report holds: {after:#?}",
        after
            .rx_kernel_frames
            .saturating_sub(at_stop.rx_kernel_frames)
    );
    assert_eq!(after, at_stop, "the counters after the stop are the stop's");
    assert!(after.rx_accounted(), "{after:#?}");
    drop(sink);
    let engine = Arc::try_unwrap(pfe)
        .unwrap_or_else(|_| panic!("the engine is still shared"))
        .shutdown();
    assert_eq!(engine.packets_in, BEFORE, "{engine:#?}");
}

#[test]
fn pfemu_run_stops_on_ctrl_c_while_frames_keep_arriving() {
    let _alone = alone();
    let test = "pfemu_run_stops_on_ctrl_c_while_frames_keep_arriving";
    let Some((_lab, s0, p0)) = NetLab::with_veth_pair(test) else {
        return;
    };
    let pfemu = Pfemu::spawn(&[
        "run",
        "--program",
        "filter",
        "--iface",
        &format!("0={p0}"),
        "--ppe-threads",
        "1",
        "--stats-every",
        "0.05",
        "--json",
    ]);
    pfemu.wait_ready();
    let flood = Flood::start(&s0, FLOOD_SENDERS);
    // The counters' lines say `drops RX/TX` per port: wait until the ring overflows (or
    // the deadline: as in stop_under_a_flood, the stop must work either way).
    let end = Instant::now() + DEADLINE;
    loop {
        if Instant::now() >= end {
            println!("note {test}: the flood did not overflow port 0's ring within {DEADLINE:?}");
            break;
        }
        let line = pfemu.wait_line("[");
        let drops = line
            .split("drops ")
            .nth(1)
            .and_then(|d| d.split('/').next())
            .and_then(|d| d.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("a counters line without `drops N/M`: {line}"));
        if drops > 0 {
            break;
        }
    }
    let (code, out) = pfemu.interrupt();
    assert!(flood.flowing(), "the flood still ran while pfemu stopped");
    let sent = flood.finish();
    assert_eq!(code, Some(0), "pfemu's exit status; its report: {out}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let p = &r["ports"]["ports"][0];
    let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("`{k}` in {p}"));
    assert!(n("rx_frames") > 0, "{p}");
    assert!(
        n("rx_frames") + n("rx_kernel_drops") + n("rx_unread") <= sent.accepted,
        "the port counted more frames than were sent: {p}\n{sent:?}"
    );
}

/// A TAP device deleted under a running port: its receive thread counts the error once,
/// says so, and reads no more (it does not spin on a descriptor that fails at once).
#[test]
fn a_deleted_tap_device_ends_its_ports_receiving_with_one_error() {
    let Some(mut lab) = NetLab::new("a_deleted_tap_device_ends_its_ports_receiving") else {
        return;
    };
    let Some(tap) = lab.tap("a_deleted_tap_device_ends_its_ports_receiving") else {
        return;
    };
    let cfg = LiveConfig {
        ppe_threads: 1,
        ..LiveConfig::new(
            LiveProgram::Filter,
            PortsConfig::new(vec![PortSpec::tap(&format!("0={tap}")).expect("spec")]),
        )
    };
    let live = Live::start(&cfg).expect("the port binds");
    ip(&["link", "del", &tap]).expect("deletes the TAP device");
    // Its receive thread finds out on its next read or poll, and says so.
    wait_for_live(
        &live,
        "the port to report that its TAP device failed",
        || {
            let r = live.report();
            r.ports.warnings.iter().any(|w| w.contains(&tap))
        },
        std::thread::sleep,
    );
    let r = live.stop().expect("stops");
    // Once, and only what happened: a device that is gone receives nothing more, so the
    // stop has nothing to refuse there.
    assert_eq!(
        r.ports.warnings.iter().filter(|w| w.contains(&tap)).count(),
        1,
        "{:#?}",
        r.ports.warnings
    );
    let p = &r.ports.ports[0];
    assert_eq!(
        p.rx_errors, 1,
        "one error, counted once: the thread stopped reading: {p:#?}"
    );
    assert!(
        p.last_rx_error
            .as_deref()
            .is_some_and(|e| e.contains("no more")),
        "{p:#?}"
    );
    assert!(r.accounted(), "{r:#?}");
}

/// A frame longer than the engine takes (what a host with segmentation offload on hands a
/// veth) is dropped at ingress as `oversize`, counted, and the report says why and what to
/// do about it.
#[test]
fn a_frame_longer_than_the_engine_takes_is_dropped_as_oversize_with_a_warning() {
    let Some(mut lab) = NetLab::new("a_frame_longer_than_the_engine_takes") else {
        return;
    };
    let (s0, p0) = (lab.name("s0"), lab.name("p0"));
    if let Err(e) = lab.veth(&s0, &p0, None, 16000) {
        println!("skipped: the kernel refused a veth pair with a 16000-byte MTU: {e}");
        return;
    }
    let cfg = LiveConfig {
        ppe_threads: 1,
        ..LiveConfig::new(
            LiveProgram::Filter,
            PortsConfig::new(vec![PortSpec::interface(&format!("0={p0}")).expect("spec")]),
        )
    };
    let live = Live::start(&cfg).expect("the port binds");
    let tx = RawSocket::open(&s0, false).expect("sender");
    let long = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 12_000, 64);
    assert_eq!(long.len(), 12_000);
    let (sent, err) = tx.send([&long[..]]);
    assert_eq!(sent, 1, "{err:?}");
    wait_for_live(
        &live,
        "port 0 to take the frame",
        || live.report().ports.ports[0].rx_frames == 1,
        std::thread::sleep,
    );
    let r = live.stop().expect("stops");
    assert_eq!(
        r.engine.dropped_by_reason.get("oversize"),
        Some(&1),
        "{r:#?}"
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("oversize") && w.contains("gso_max_segs")),
        "the report says why: {:#?}",
        r.warnings
    );
    assert!(r.accounted(), "{r:#?}");
}

/// Which end of the veth pair goes down before the stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Down {
    /// The port's own interface.
    Itself,
    /// Its peer: the port's interface loses its carrier but stays up, so the rebinding
    /// leaves no error (nor does the run see one); the case checks that it stays so.
    Peer,
}

/// An interface port whose interface (or its peer) is down at the stop: the stop's
/// rebinding of a socket on an interface that is down leaves `ENETDOWN` pending on it (the
/// kernel cannot hook the socket to a down interface, and says so through `SO_ERROR`,
/// although `bind` succeeds). That error is the stop's own: the stop reports no error for
/// it, and leaves none behind for the port's next send once the interface is up again. The
/// real error (the interface going down while the port ran) is counted once.
///
/// The port's ring holds frames the kernel has not handed over yet (a 1 s block timeout)
/// when it stops, so the stop polls the socket: without the fix, the stop's own `ENETDOWN`
/// is either counted there as a second receive error or, if the stop did not poll, it fails
/// the first frame the port sends once the interface is up again.
fn down_at_the_stop(test: &str, down: Down) {
    use pfemu::lab::ports::RingConfig;

    let Some((_lab, s0, p0)) = NetLab::with_veth_pair(test) else {
        return;
    };
    const FRAMES: u64 = 3;
    // Opened before the port, so that once they have seen a frame the port's socket was
    // offered it (see a_stopped_interface_port_takes_no_more_frames).
    let on_p0 = RawSocket::open(&p0, true).expect("the observer on the port's interface");
    let on_s0 = RawSocket::open(&s0, true).expect("the observer on its peer");
    // Port 1: the filter sends the plain IPv4 frames of port 0 there.
    let cfg = PortsConfig {
        ring: RingConfig {
            block_timeout_ms: 1000,
            ..RingConfig::default()
        },
        ..PortsConfig::new(vec![PortSpec::interface(&format!("1={p0}")).expect("spec")])
    };
    let (sink, running, pfe) = filter_on_ports(&cfg);

    // Frames that are not IPv4 (the filter drops them: the port sends nothing while its
    // interface is down), left in the ring's block in progress.
    let mut other = vec![0u8; 64];
    other[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    other[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    other[12..14].copy_from_slice(&[0x88, 0xb5]);
    let tx = RawSocket::open(&s0, false).expect("the sender's socket");
    send_exactly(&tx, &other, FRAMES);
    observe(&on_p0, FRAMES, "the frames sent to the port");

    let (downed, real_errors) = match down {
        Down::Itself => (&p0, 1),
        Down::Peer => (&s0, 0),
    };
    ip(&["link", "set", downed, "down"]).expect("sets the interface down");
    if real_errors > 0 {
        // The kernel tells the port's socket that its interface went down: a real error.
        wait_for(
            "the port to count its interface going down",
            || running.report().ports[0].rx_errors >= real_errors,
            std::thread::sleep,
        );
    }
    if running.report().ports[0].rx_frames > 0 {
        println!(
            "note {test}: the kernel handed the block over before the stop, which then did \
             not poll the socket"
        );
    }
    let at_stop = running.stop().ports[0].clone();
    assert!(at_stop.rx_accounted(), "{at_stop:#?}");
    assert_eq!(at_stop.rx_kernel_frames, FRAMES, "{at_stop:#?}");
    assert_eq!(
        at_stop.rx_errors, real_errors,
        "the stop counted an error of its own (its rebinding on a down interface): {at_stop:#?}"
    );

    // Up again, the port sends as before: no error of the stop's was left pending for it.
    ip(&["link", "set", downed, "up"]).expect("sets the interface up");
    send_until_one_arrives(&pfe, &sink, &on_s0, test);
    drop(sink);
    let _ = Arc::try_unwrap(pfe)
        .unwrap_or_else(|_| panic!("the engine is still shared"))
        .shutdown();
}

#[test]
fn an_interface_down_at_the_stop_leaves_no_error_of_the_stops() {
    down_at_the_stop(
        "an_interface_down_at_the_stop_leaves_no_error_of_the_stops",
        Down::Itself,
    );
}

#[test]
fn an_interface_whose_peer_is_down_at_the_stop_leaves_no_error_of_the_stops() {
    down_at_the_stop("an_interface_whose_peer_is_down_at_the_stop", Down::Peer);
}

/// Has the engine send a frame out of the port on `sink` (port 1, through the filter) until
/// one arrives at `observer`, the other end of the port's veth, within the deadline; every
/// send must succeed (no transmit error). Until the kernel has activated a link that just
/// came up (asynchronously, once its carrier is back), the interface drops what the port
/// sends without telling the sender, and the port counts those as the interface's drops,
/// not as sent: the frame is sent again until it arrives. Returns how many were sent.
fn send_until_one_arrives(
    pfe: &pfemu::pfe::Pfe,
    sink: &pfemu::lab::ports::PortSink,
    observer: &RawSocket,
    test: &str,
) -> u64 {
    let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 64, 64);
    let before = sink.report().ports[0].clone();
    let (mut sent, mut arrived, mut buf) = (0u64, false, vec![0u8; 2048]);
    let end = Instant::now() + DEADLINE;
    while !arrived {
        assert!(
            Instant::now() < end,
            "none of the {sent} frames the port sent arrived at {} within {DEADLINE:?}: {:#?}",
            observer.name(),
            sink.report().ports[0]
        );
        pfe.inject_frame(0, &frame)
            .expect("the engine takes the frame");
        pfe.drain();
        sent += 1;
        let after = sink.report().ports[0].clone();
        assert_eq!(
            after.tx_errors, before.tx_errors,
            "a send of the port failed: {after:#?}"
        );
        assert_eq!(
            (after.tx_frames + after.tx_kernel_drops) - (before.tx_frames + before.tx_kernel_drops),
            sent,
            "every frame sent or dropped by the interface: {after:#?}"
        );
        if observer.wait(Duration::from_millis(100)).unwrap_or(false) {
            arrived = matches!(observer.try_recv(&mut buf), Ok(Some(_)));
        }
    }
    let after = sink.report().ports[0].clone();
    assert!(
        after.tx_frames > before.tx_frames,
        "the frame that arrived is counted as sent: {after:#?}"
    );
    if sent > 1 {
        println!("note {test}: {sent} sends until the link carried one");
    }
    sent
}

/// Frames a port sends while its interface has no carrier (its veth peer is down) are
/// taken by the kernel (`sendmmsg` succeeds) and then dropped by the interface, which
/// counts them in its own `tx_dropped` and tells the sender nothing. The port counts them
/// as the interface's drops (`tx_kernel_drops`), not as sent: every frame the engine
/// handed the port is sent, refused or dropped, and the sent ones left. Without that,
/// `tx_frames` claimed every one of them had left.
#[test]
fn frames_sent_without_carrier_are_the_interfaces_drops_not_sent() {
    const TEST: &str = "frames_sent_without_carrier_are_the_interfaces_drops_not_sent";
    const FRAMES: u64 = 50;
    let Some((_lab, s0, p0)) = NetLab::with_veth_pair(TEST) else {
        return;
    };
    let on_s0 = RawSocket::open(&s0, true).expect("the observer on the port's peer");
    let cfg = PortsConfig::new(vec![PortSpec::interface(&format!("1={p0}")).expect("spec")]);
    let (sink, running, pfe) = filter_on_ports(&cfg);
    send_until_one_arrives(&pfe, &sink, &on_s0, TEST);

    ip(&["link", "set", &s0, "down"]).expect("sets the peer down");
    // Until the kernel has taken the link's queue away (asynchronously, once the carrier
    // is gone), the veth refuses a frame with ENOBUFS; from then on it drops them without
    // a word. One frame at a time until the first such drop.
    let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 64, 64);
    let send = |n: u64| {
        for _ in 0..n {
            pfe.inject_frame(0, &frame)
                .expect("the engine takes the frame");
        }
        pfe.drain();
    };
    wait_for(
        "the interface without carrier to drop a frame the port sent",
        || {
            send(1);
            sink.report().ports[0].tx_kernel_drops > 0
        },
        std::thread::sleep,
    );
    let before = sink.report().ports[0].clone();
    send(FRAMES);
    let after = sink.report().ports[0].clone();
    assert_eq!(
        (
            after.tx_frames,
            after.tx_kernel_drops - before.tx_kernel_drops
        ),
        (before.tx_frames, FRAMES),
        "the frames sent without carrier are the interface's drops, not sent: {after:#?}"
    );
    assert_eq!(after.tx_errors, before.tx_errors, "{after:#?}");
    assert_eq!(
        after.tx_frames + after.tx_dropped(),
        pfe.stats().frames_tx,
        "every frame the engine handed the port is sent or dropped: {after:#?}"
    );

    // With its carrier back the port sends again, and the count stays.
    ip(&["link", "set", &s0, "up"]).expect("sets the peer up");
    send_until_one_arrives(&pfe, &sink, &on_s0, TEST);
    let at_stop = running.stop().ports[0].clone();
    assert!(at_stop.tx_kernel_drops >= FRAMES, "{at_stop:#?}");
    assert_eq!(
        at_stop.tx_frames + at_stop.tx_dropped(),
        pfe.stats().frames_tx,
        "{at_stop:#?}"
    );
    drop(sink);
    let _ = Arc::try_unwrap(pfe)
        .unwrap_or_else(|_| panic!("the engine is still shared"))
        .shutdown();
}

/// An interface port's own interface going down and up again (a flap) is one receive
/// error, counted once by the port, and fails none of its sends: the kernel reports the
/// interface going down on the port's receiving socket (`SO_ERROR`), and the first to
/// read it takes it. The port sends through another socket, so a send after the flap
/// cannot take the report: without that, after the stop (when no RX thread polls the
/// socket) the first send after a flap failed with the stale `ENETDOWN`, its frame lost,
/// although the interface was up again.
#[test]
fn an_interface_flap_is_one_receive_error_and_fails_no_send() {
    const TEST: &str = "an_interface_flap_is_one_receive_error_and_fails_no_send";
    let Some((_lab, s0, p0)) = NetLab::with_veth_pair(TEST) else {
        return;
    };
    let on_s0 = RawSocket::open(&s0, true).expect("the observer on the port's peer");
    let cfg = PortsConfig::new(vec![PortSpec::interface(&format!("1={p0}")).expect("spec")]);
    let (sink, running, pfe) = filter_on_ports(&cfg);
    send_until_one_arrives(&pfe, &sink, &on_s0, TEST);

    // While the port runs: its RX thread counts the flap.
    ip(&["link", "set", &p0, "down"]).expect("sets the interface down");
    wait_for(
        "the port to count its interface going down",
        || running.report().ports[0].rx_errors >= 1,
        std::thread::sleep,
    );
    ip(&["link", "set", &p0, "up"]).expect("sets the interface up");
    send_until_one_arrives(&pfe, &sink, &on_s0, TEST);
    let at_stop = running.stop().ports[0].clone();
    assert_eq!(
        at_stop.rx_errors, 1,
        "one flap, one receive error: {at_stop:#?}"
    );
    assert!(at_stop.tx_errors.is_empty(), "{at_stop:#?}");

    // After the stop nothing polls the receiving socket: its report of a flap stays
    // pending there, and must not fail the port's next send.
    ip(&["link", "set", &p0, "down"]).expect("sets the interface down");
    ip(&["link", "set", &p0, "up"]).expect("sets the interface up");
    send_until_one_arrives(&pfe, &sink, &on_s0, TEST);
    let after = sink.report().ports[0].clone();
    assert!(after.tx_errors.is_empty(), "{after:#?}");
    assert_eq!(
        after.rx_errors, 1,
        "the stop's counts are final: {after:#?}"
    );

    drop(sink);
    let _ = Arc::try_unwrap(pfe)
        .unwrap_or_else(|_| panic!("the engine is still shared"))
        .shutdown();
}

/// The filter on an engine of one PPE thread between the ports of `cfg`, started: the
/// ports' sink (which the engine holds, so it outlives a stop), the running ports and the
/// engine.
fn filter_on_ports(
    cfg: &PortsConfig,
) -> (
    Arc<pfemu::lab::ports::PortSink>,
    pfemu::lab::ports::RunningPorts,
    Arc<pfemu::pfe::Pfe>,
) {
    use pfemu::lab::ports::LivePorts;
    use pfemu::mem::{MemConfig, SharedMemory};
    use pfemu::microcode::filter::Filter;
    use pfemu::pfe::Pfe;

    let ports = LivePorts::open(cfg).expect("the port binds");
    let sink = ports.sink();
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).expect("memory"));
    let filter = Filter::install(&mem).expect("the filter installs");
    let mut pfe = Pfe::builder()
        .ppe_threads(1)
        .sink(sink.clone())
        .program(filter.program())
        .memory(mem)
        .build()
        .expect("the engine builds");
    pfe.start().expect("the engine starts");
    let running = ports.start(Arc::new(pfe)).expect("the port starts");
    let pfe = Arc::clone(running.pfe());
    (sink, running, pfe)
}

/// A TAP device's own count `what` (`tx_packets`, `tx_dropped`, ...) from sysfs.
fn tap_count(tap: &str, what: &str) -> u64 {
    let path = format!("/sys/class/net/{tap}/statistics/{what}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A stopped TAP port takes no more frames, although its device stays open (for sending)
/// as long as the engine lives: the stop attaches a filter to the device that refuses
/// every frame, so what the host sends after it is dropped by the device and counted
/// there (its `tx_dropped`), not left in its queue in no counter. The port's count of what
/// the kernel handed it is the device's own (`tx_packets`: frames read from it), so the
/// stop's identity compares two counts. The filter is on the host's way to the port only:
/// the port still sends to the host after the stop.
#[test]
fn a_stopped_tap_port_takes_no_more_frames() {
    let Some(mut lab) = NetLab::new("a_stopped_tap_port_takes_no_more_frames") else {
        return;
    };
    let Some(tap) = lab.tap("a_stopped_tap_port_takes_no_more_frames") else {
        return;
    };
    const BEFORE: u64 = 200;
    const AFTER: u64 = 300;
    let (sink, running, pfe) =
        filter_on_ports(&PortsConfig::new(vec![
            PortSpec::tap(&format!("1={tap}")).expect("spec")
        ]));
    // The host sends on the TAP device: its frames go to the port.
    let host = RawSocket::open(&tap, false).expect("the host's socket");
    let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 64, 64);
    let (read0, dropped0) = (tap_count(&tap, "tx_packets"), tap_count(&tap, "tx_dropped"));

    send_exactly(&host, &frame, BEFORE);
    wait_for(
        &format!("port 1 to take the {BEFORE} frames sent before the stop"),
        || running.report().ports[0].rx_frames >= BEFORE,
        std::thread::sleep,
    );
    let at_stop = running.stop().ports[0].clone();
    assert!(at_stop.rx_accounted(), "{at_stop:#?}");
    assert_eq!(
        (
            at_stop.rx_kernel_frames,
            at_stop.rx_frames,
            at_stop.rx_kernel_drops
        ),
        (BEFORE, BEFORE, 0),
        "the device handed the port the frames sent, and it took them all: {at_stop:#?}"
    );
    assert_eq!(
        tap_count(&tap, "tx_packets") - read0,
        BEFORE,
        "the device's own count of the frames read from it"
    );

    // Frames the host sends now are refused by the device and counted there.
    let dropped = tap_count(&tap, "tx_dropped");
    send_exactly(&host, &frame, AFTER);
    wait_for(
        &format!(
            "{tap} to drop the {AFTER} frames sent after the stop (tx_dropped; without a \
             filter refusing them they wait in its queue, in no counter)"
        ),
        || tap_count(&tap, "tx_dropped") >= dropped + AFTER,
        std::thread::sleep,
    );
    assert_eq!(
        tap_count(&tap, "tx_dropped") - dropped0,
        AFTER + at_stop.rx_kernel_drops,
        "the device dropped the frames sent after the stop, and no other"
    );
    assert_eq!(
        tap_count(&tap, "tx_packets") - read0,
        BEFORE,
        "nothing read them"
    );
    let after = sink.report().ports[0].clone();
    assert_eq!(after, at_stop, "the counters after the stop are the stop's");

    // The filter is on the host's way to the port only: what the engine sends out of the
    // port after the stop still reaches the host.
    let on_host = RawSocket::open(&tap, true).expect("the host's observer");
    pfe.inject_frame(0, &frame)
        .expect("the engine takes the frame");
    pfe.drain();
    let sent = sink.report().ports[0].clone();
    assert_eq!(
        (sent.tx_frames, sent.tx_dropped()),
        (at_stop.tx_frames + 1, 0),
        "the port's send after the stop: {sent:#?}"
    );
    observe(&on_host, 1, "the frame the port sent after the stop");
    drop(sink);
    let engine = Arc::try_unwrap(pfe)
        .unwrap_or_else(|_| panic!("the engine is still shared"))
        .shutdown();
    assert_eq!(engine.packets_in, BEFORE + 1, "{engine:#?}");
}

/// A TAP device that outlives its port (made with `ip tuntap add`, so persistent) takes
/// frames again for the next port bound to it: the stop's filter refusing every frame is
/// the stopped port's alone. The kernel keeps a TAP filter in the device (`tun->fprog`,
/// for the queues attached later); here it goes with the descriptor that closes, and this
/// checks that it stays so.
#[test]
fn a_tap_device_takes_frames_again_for_the_next_port() {
    let Some(mut lab) = NetLab::new("a_tap_device_takes_frames_again_for_the_next_port") else {
        return;
    };
    let Some(tap) = lab.tap("a_tap_device_takes_frames_again_for_the_next_port") else {
        return;
    };
    const FRAMES: u64 = 50;
    let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 9], 64, 64);
    for run in 1..=2 {
        let cfg = LiveConfig {
            ppe_threads: 1,
            ..LiveConfig::new(
                LiveProgram::Filter,
                PortsConfig::new(vec![PortSpec::tap(&format!("0={tap}")).expect("spec")]),
            )
        };
        // The last run's descriptor of the device is closed, but a process another test
        // spawns meanwhile holds a copy of it until its `exec` (which closes it): the
        // device is busy until then.
        let end = Instant::now() + DEADLINE;
        let live = loop {
            match Live::start(&cfg) {
                Err(LiveError::Port(PortError::Io { source, .. }))
                    if source.kind() == std::io::ErrorKind::ResourceBusy
                        && Instant::now() < end =>
                {
                    std::thread::sleep(Duration::from_millis(5))
                }
                r => break r.unwrap_or_else(|e| panic!("run {run}: the port binds: {e}")),
            }
        };
        let host = RawSocket::open(&tap, false).expect("the host's socket");
        send_exactly(&host, &frame, FRAMES);
        wait_for_live(
            &live,
            &format!("port 0 of run {run} to take the {FRAMES} frames the host sent"),
            || live.report().ports.ports[0].rx_frames >= FRAMES,
            std::thread::sleep,
        );
        let r = live.stop().expect("stops");
        assert!(r.accounted(), "run {run}: {r:#?}");
        assert_eq!(r.ports.ports[0].rx_frames, FRAMES, "run {run}: {r:#?}");
    }
}

/// A TAP port needs `CAP_NET_ADMIN` alone (no packet socket): `pfemu run --tap` with just
/// that capability stops as it does as root, its device made to refuse frames at the stop
/// without a warning, and every frame accounted for.
#[test]
fn a_tap_port_stops_cleanly_with_cap_net_admin_alone() {
    let test = "a_tap_port_stops_cleanly_with_cap_net_admin_alone";
    let Some(mut lab) = NetLab::new(test) else {
        return;
    };
    let Some(tap) = lab.tap(test) else {
        return;
    };
    // `nobody`, with CAP_NET_ADMIN and nothing else (ambient, so pfemu keeps it).
    let out = match Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all,+net_admin",
            "--ambient-caps=-all,+net_admin",
            "--bounding-set=-all,+net_admin",
        ])
        .arg(env!("CARGO_BIN_EXE_pfemu"))
        .args([
            "run",
            "--program",
            "filter",
            "--tap",
            &format!("0={tap}"),
            "--duration",
            "0.2",
            "--json",
        ])
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            println!("skipped {test}: cannot run setpriv (util-linux): {e}");
            return;
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("setpriv:") {
        println!("skipped {test}: setpriv could not run pfemu with CAP_NET_ADMIN: {err}");
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    let warnings = r["ports"]["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("ports.warnings in {r}"));
    assert!(
        warnings
            .iter()
            .all(|w| !w.as_str().unwrap_or_default().contains(&tap)),
        "a warning about the TAP device: {warnings:#?}"
    );
}
