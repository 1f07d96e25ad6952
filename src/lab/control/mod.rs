//! The runtime control plane: a running PFE's counters, memory, timers and program tables
//! over HTTP with JSON, and its counters in the Prometheus text format, on one endpoint.
//!
//! Why HTTP with JSON rather than a Unix socket: Prometheus scrapes metrics over HTTP, so
//! one listener serves the dashboards and the operator alike; every language and `curl`
//! speak it; and it works the same for a PFE in another network namespace or container
//! (`--control` takes any address; the default, loopback, keeps it local). The server is
//! deliberately small: HTTP/1.1, one request per connection (`Connection: close`),
//! `Content-Length` bodies of at most [`MAX_BODY`], headers of at most [`MAX_HEAD`], and a
//! deadline for the whole request ([`READ_TIMEOUT`], however the client trickles its
//! bytes), so a slow or malformed client gets a clear error and never stalls it for long;
//! stopping the server cuts off the client it is serving. Requests are served one at a time
//! on the server's own thread, never on a PPE thread: control never slows the data path
//! beyond the XTXNs it makes.
//!
//! | request | what |
//! | --- | --- |
//! | `GET /metrics` | the counters in the Prometheus text format (version 0.0.4) |
//! | `GET /stats` | the counters as JSON ([`crate::pfe::Stats`]) |
//! | `GET /memory/regions` | the named regions programs allocated |
//! | `GET /memory?addr=A&words=N` or `?region=R&offset=O&words=N` | read words |
//! | `POST /memory` `{"addr": A, "words": [..]}` or `{"region": R, "offset": O, ..}` | write words |
//! | `GET /timers` | every timer, with its period and next launch |
//! | `POST /timers/I` `{"period_ns": P}` and/or `{"enabled": B}` | change timer I |
//! | `GET /targets` | the program's tables and their commands |
//! | `POST /targets/T/C` `{..}` | run command C of target T ([`Target`]) |
//!
//! Path segments and query values are percent-decoded (`%2F` is a `/` inside a name; see
//! [`percent_encode`]). Numbers are JSON numbers; addresses and words are `u64` (a word
//! beyond 2^53 comes back exact, as JSON numbers are read by this server, but some clients
//! round them). Every
//! error is a JSON `{"error": ".."}` with status 400 (a bad request, naming what is wrong),
//! 404 (no such path, target or command) or 405 (a method the path does not take).
//!
//! Programs expose their tables as [`Target`]s: routes, jobs, ternary match blocks, rates.
//! The library API is the same without HTTP: [`Controller::handle`] takes a request and
//! returns the response an HTTP client would get.

mod metrics;
mod targets;

pub use metrics::{MetricKind, Metrics};
pub use targets::{AdaTarget, JobsTarget, NimbleTarget, RoutesTarget, TcamTarget, GRACE_DEADLINE};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use serde_json::{json, Value};

use crate::mem::Region;
use crate::pfe::Control;

/// Largest request body the server reads.
pub const MAX_BODY: usize = 1 << 20;
/// Largest request line and headers the server reads.
pub const MAX_HEAD: usize = 16 << 10;
/// Most words one memory read or write may cover.
pub const MAX_WORDS: u64 = 4096;
/// How long the server waits for a client's whole request (its line, headers and body,
/// however they trickle in) before answering 408; its answer, too, must be taken within
/// as long. The default of [`ServerLimits::request_deadline`].
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The address `--control` listens on by default (loopback only).
pub const DEFAULT_ADDR: &str = "127.0.0.1:9477";

/// A program's table (routes, jobs, a ternary match block, rates) that the control plane
/// reads and changes by name while the program runs.
pub trait Target: Send + Sync {
    /// The name requests use (`routes`, `jobs`, `rate_table`, ...).
    fn name(&self) -> &str;
    /// The commands it takes, each with a line of help (its arguments and what it does).
    fn commands(&self) -> Vec<(&'static str, &'static str)>;
    /// Runs `command` with its JSON arguments; the JSON result, or an error message that
    /// says what is wrong (answered with status 400).
    fn call(&self, command: &str, args: &Value) -> Result<Value, String>;
    /// Adds the target's own metric samples, if it has any. Targets of one kind share
    /// families (ADA on the rate and on the time both add to `pfemu_ada_epochs_total`): a
    /// target tells its samples apart by a label with its name, and [`Metrics`] writes each
    /// family's `# HELP` and `# TYPE` once.
    fn metrics(&self, _out: &mut Metrics) {}
    /// Given the engine's control handle when the [`Controller`] is made: for a target
    /// whose changes need the engine itself (the jobs' grace periods, [`JobsTarget`]).
    fn attach(&self, _engine: &Control) {}
}

/// A response: an HTTP status, a content type and a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// 200, 400, 404, 405, 408 or 413.
    pub status: u16,
    /// `application/json` or the Prometheus text type.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Response {
    fn json(status: u16, v: &Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: format!("{v}\n"),
        }
    }

    fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(status, &json!({ "error": message.into() }))
    }

    /// The body as JSON (`Value::Null` for a body that is not).
    pub fn json_body(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// The control plane of one engine: its [`Control`] handle and the program's targets.
pub struct Controller {
    ctl: Control,
    targets: BTreeMap<String, Arc<dyn Target>>,
    requests: AtomicU64,
    errors: AtomicU64,
}

impl Controller {
    /// A controller for `ctl`'s engine and `targets` (the last of two with one name wins).
    pub fn new(ctl: Control, targets: Vec<Arc<dyn Target>>) -> Controller {
        for t in &targets {
            t.attach(&ctl);
        }
        Controller {
            ctl,
            targets: targets
                .into_iter()
                .map(|t| (t.name().to_string(), t))
                .collect(),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// Answers one request: `method` (`GET`, `POST`), `target` (the path with its query)
    /// and the body (empty for a GET). The same answers the HTTP server gives.
    pub fn handle(&self, method: &str, target: &str, body: &[u8]) -> Response {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let r = self.route(method, target, body);
        if r.status != 200 {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn route(&self, method: &str, target: &str, body: &[u8]) -> Response {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let query = match parse_query(query) {
            Ok(q) => q,
            Err(e) => return Response::error(400, e),
        };
        let args = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice::<Value>(body) {
                Ok(v) => v,
                Err(e) => return Response::error(400, format!("the body is not JSON: {e}")),
            }
        };
        let decoded = match path
            .trim_matches('/')
            .split('/')
            .map(|p| percent_decode(p, "the path"))
            .collect::<Result<Vec<String>, String>>()
        {
            Ok(d) => d,
            Err(e) => return Response::error(400, e),
        };
        let parts: Vec<&str> = decoded.iter().map(String::as_str).collect();
        let result = match (method, parts.as_slice()) {
            ("GET", ["metrics"]) => {
                return Response {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: self.metrics(),
                }
            }
            ("GET", ["stats"]) => serde_json::to_value(self.ctl.stats()).map_err(|e| e.to_string()),
            ("GET", ["memory", "regions"]) => Ok(self.regions()),
            ("GET", ["memory"]) => self.read_memory(&query),
            ("POST", ["memory"]) => self.write_memory(&args),
            ("GET", ["timers"]) => Ok(json!(self.ctl.timers())),
            ("POST", ["timers", i]) => self.change_timer(i, &args),
            ("GET", ["targets"]) => Ok(self.list_targets()),
            ("POST", ["targets", t, c]) => match self.targets.get(*t) {
                None => {
                    return Response::error(
                        404,
                        format!("no target `{t}`: {}", self.target_names()),
                    )
                }
                Some(target) => {
                    if !target.commands().iter().any(|(name, _)| name == c) {
                        let names: Vec<&str> = target.commands().iter().map(|(n, _)| *n).collect();
                        return Response::error(
                            404,
                            format!(
                                "target `{t}` has no command `{c}` (it has {})",
                                names.join(", ")
                            ),
                        );
                    }
                    target.call(c, &args)
                }
            },
            (_, ["metrics" | "stats" | "timers" | "targets" | "memory", ..]) => {
                return Response::error(405, format!("{method} is not a method of {path}"))
            }
            _ => {
                return Response::error(
                    404,
                    format!("no such path: {path} (see GET /targets and the module doc)"),
                )
            }
        };
        match result {
            Ok(v) => Response::json(200, &v),
            Err(e) => Response::error(400, e),
        }
    }

    fn target_names(&self) -> String {
        let names: Vec<&str> = self.targets.keys().map(String::as_str).collect();
        if names.is_empty() {
            "the program has none".into()
        } else {
            format!("there are {}", names.join(", "))
        }
    }

    fn list_targets(&self) -> Value {
        let mut out = serde_json::Map::new();
        for (name, t) in &self.targets {
            let commands: serde_json::Map<String, Value> = t
                .commands()
                .into_iter()
                .map(|(c, help)| (c.to_string(), json!(help)))
                .collect();
            out.insert(name.clone(), Value::Object(commands));
        }
        Value::Object(out)
    }

    fn regions(&self) -> Value {
        let regions: Vec<Value> = self
            .ctl
            .memory()
            .allocations()
            .into_iter()
            .map(|a| {
                json!({
                    "name": a.name,
                    "region": region_name(a.region),
                    "addr": a.addr,
                    "words": a.words,
                })
            })
            .collect();
        json!(regions)
    }

    /// The first word a request names: `addr`, or `region` (a named region) and `offset`
    /// (words into it, 0 by default), checked to leave room for `words` words in the named
    /// region, and all `words` words to lie in one mapped memory region (so a read or write
    /// past one is refused whole, before any word is touched).
    fn resolve(
        &self,
        addr: Option<u64>,
        region: Option<&str>,
        offset: u64,
        words: u64,
    ) -> Result<u64, String> {
        if words == 0 || words > MAX_WORDS {
            return Err(format!(
                "invalid `words`: {words}, must be from 1 to {MAX_WORDS}"
            ));
        }
        let start = match (addr, region) {
            (Some(a), None) => {
                if a.checked_add(words).is_none() {
                    return Err(format!(
                        "invalid `addr` {a:#x}: {words} words from it run past the last word \
                         address (2^64 - 1)"
                    ));
                }
                a
            }
            (None, Some(name)) => {
                let a = self.ctl.memory().allocation(name).ok_or_else(|| {
                    let names: Vec<String> = self
                        .ctl
                        .memory()
                        .allocations()
                        .into_iter()
                        .map(|a| a.name)
                        .collect();
                    format!("no region `{name}` (there are: {})", names.join(", "))
                })?;
                let end = offset.checked_add(words).filter(|&e| e <= a.words);
                if end.is_none() {
                    return Err(format!(
                        "`offset` {offset} and `words` {words} run past region `{name}` ({} words)",
                        a.words
                    ));
                }
                a.addr + offset
            }
            (Some(_), Some(_)) => return Err("give `addr` or `region`, not both".into()),
            (None, None) => {
                return Err("give `addr` (a word address) or `region` (a region's name)".into())
            }
        };
        self.ctl
            .memory()
            .check(start, words)
            .map_err(|e| format!("invalid `addr` {start:#x} with `words` {words}: {e}"))?;
        Ok(start)
    }

    fn read_memory(&self, q: &BTreeMap<String, String>) -> Result<Value, String> {
        let num = |k: &str| -> Result<Option<u64>, String> {
            q.get(k)
                .map(|v| parse_u64(v).map_err(|e| format!("invalid `{k}`: {e}")))
                .transpose()
        };
        let words = num("words")?.unwrap_or(1);
        let start = self.resolve(
            num("addr")?,
            q.get("region").map(String::as_str),
            num("offset")?.unwrap_or(0),
            words,
        )?;
        let mem = self.ctl.memory();
        let values = (start..start + words)
            .map(|a| mem.read_u64(a).map_err(|e| format!("word {a}: {e}")))
            .collect::<Result<Vec<u64>, String>>()?;
        Ok(json!({ "addr": start, "words": values }))
    }

    fn write_memory(&self, args: &Value) -> Result<Value, String> {
        let words: Vec<u64> = match args.get("words") {
            Some(Value::Array(ws)) => ws
                .iter()
                .map(|w| {
                    w.as_u64().ok_or_else(|| {
                        format!("invalid word {w}: must be a number from 0 to 2^64 - 1")
                    })
                })
                .collect::<Result<_, _>>()?,
            _ => return Err("give `words`, an array of numbers".into()),
        };
        let addr = opt_u64(args, "addr")?;
        let region = args
            .get("region")
            .map(|r| r.as_str().ok_or("`region` must be a string"))
            .transpose()?;
        let offset = opt_u64(args, "offset")?.unwrap_or(0);
        // The whole range is checked first, so a bad address writes nothing.
        let start = self.resolve(addr, region, offset, words.len() as u64)?;
        let mem = self.ctl.memory();
        for (i, &w) in words.iter().enumerate() {
            let a = start + i as u64;
            mem.write_u64(a, w).map_err(|e| format!("word {a}: {e}"))?;
        }
        Ok(json!({ "addr": start, "written": words.len() }))
    }

    fn change_timer(&self, index: &str, args: &Value) -> Result<Value, String> {
        let timer: usize = index.parse().map_err(|_| {
            format!("invalid timer `{index}`: must be a timer's index (GET /timers)")
        })?;
        let period = opt_u64(args, "period_ns")?;
        let enabled = match args.get("enabled") {
            None => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => return Err(format!("invalid `enabled` {v}: must be true or false")),
        };
        if period.is_none() && enabled.is_none() {
            return Err("give `period_ns` and/or `enabled`".into());
        }
        let mut status = None;
        if let Some(p) = period {
            status = Some(
                self.ctl
                    .set_timer_period(timer, p)
                    .map_err(|e| e.to_string())?,
            );
        }
        if let Some(on) = enabled {
            status = Some(
                self.ctl
                    .set_timer_enabled(timer, on)
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(json!(status))
    }

    /// The counters in the Prometheus text format (version 0.0.4): the engine's, then the
    /// targets', each family once ([`Metrics`]).
    pub fn metrics(&self) -> String {
        let s = self.ctl.stats();
        let mut m = Metrics::new();
        let mut one = |name: &str, help: &str, v: u64| m.counter(name, help, &[], v);
        one(
            "pfemu_packets_in_total",
            "Frames injected, those dropped at ingress included.",
            s.packets_in,
        );
        one(
            "pfemu_packets_out_total",
            "Ingress packets that left the engine.",
            s.packets_out,
        );
        one(
            "pfemu_packets_consumed_total",
            "Ingress packets a program consumed.",
            s.consumed,
        );
        one(
            "pfemu_packets_created_total",
            "Packets created by programs.",
            s.created,
        );
        let mut by = |name: &str, help: &str, label: &str, map: &BTreeMap<String, u64>| {
            if map.is_empty() {
                // A family without samples still says what it is.
                m.declare(name, help, MetricKind::Counter);
            }
            for (k, &v) in map {
                m.counter(name, help, &[(label, k)], v);
            }
        };
        by(
            "pfemu_packets_dropped_total",
            "Ingress packets dropped, by reason.",
            "reason",
            &s.dropped_by_reason,
        );
        by(
            "pfemu_faults_total",
            "Program faults, by kind.",
            "kind",
            &s.faults,
        );
        by(
            "pfemu_xtxns_total",
            "External transactions, by kind.",
            "kind",
            &s.xtxns,
        );
        m.counter(
            "pfemu_instructions_total",
            "Instructions executed by packet threads.",
            &[],
            s.instructions,
        );
        let (frames, bytes) = (
            ("pfemu_frames_tx_total", "Frames handed to sinks, by port."),
            ("pfemu_bytes_tx_total", "Bytes handed to sinks, by port."),
        );
        if s.tx_by_port.is_empty() {
            m.declare(frames.0, frames.1, MetricKind::Counter);
            m.declare(bytes.0, bytes.1, MetricKind::Counter);
        }
        for (p, (f, _)) in &s.tx_by_port {
            m.counter(frames.0, frames.1, &[("port", &p.to_string())], *f);
        }
        for (p, (_, b)) in &s.tx_by_port {
            m.counter(bytes.0, bytes.1, &[("port", &p.to_string())], *b);
        }
        let mut one = |name: &str, help: &str, v: u64| m.counter(name, help, &[], v);
        one(
            "pfemu_timer_launches_total",
            "Timer threads launched.",
            s.timer_launches,
        );
        one(
            "pfemu_timer_overruns_total",
            "Timer launches skipped: the last had not finished.",
            s.timer_overruns,
        );
        one(
            "pfemu_control_requests_total",
            "Requests the control plane answered (errors included).",
            self.requests.load(Ordering::Relaxed),
        );
        one(
            "pfemu_control_errors_total",
            "Requests the control plane refused.",
            self.errors.load(Ordering::Relaxed),
        );
        m.gauge(
            "pfemu_in_flight",
            "Packets accepted and not yet released.",
            &[],
            s.in_flight as f64,
        );
        if let Some(l) = &s.latency {
            let (name, help) = ("pfemu_latency_seconds", "Time from ingress to egress.");
            for (q, v) in [
                ("0.5", l.p50_ns),
                ("0.9", l.p90_ns),
                ("0.99", l.p99_ns),
                ("0.999", l.p999_ns),
            ] {
                let v = (v as f64 / 1e9).to_string();
                m.sample(name, help, MetricKind::Summary, "", &[("quantile", q)], v);
            }
            let sum = (l.mean_ns * l.count as f64 / 1e9).to_string();
            m.sample(name, help, MetricKind::Summary, "_sum", &[], sum);
            let count = l.count.to_string();
            m.sample(name, help, MetricKind::Summary, "_count", &[], count);
        }
        for t in self.targets.values() {
            t.metrics(&mut m);
        }
        m.render()
    }
}

fn region_name(r: Region) -> &'static str {
    match r {
        Region::Sram => "sram",
        Region::Dram => "dram",
        Region::Acc => "acc",
    }
}

/// A label value escaped as the text format requires (backslash, quote, newline).
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A number in decimal or with a `0x` prefix.
fn parse_u64(v: &str) -> Result<u64, String> {
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    r.map_err(|_| format!("`{v}` is not a number from 0 to 2^64 - 1"))
}

/// An optional `u64` argument of a JSON object, named in the error when it is not one.
pub fn opt_u64(args: &Value, key: &str) -> Result<Option<u64>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("invalid `{key}` {v}: must be a number from 0 to 2^64 - 1")),
    }
}

fn parse_query(q: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("invalid query parameter `{k}`"));
        }
        out.insert(k.to_string(), percent_decode(v, &format!("`{k}`"))?);
    }
    Ok(out)
}

/// `s` as a path segment or query value: every byte but the unreserved ones (`A-Z`, `a-z`,
/// `0-9`, `-`, `.`, `_`, `~`) as `%XX`, so a name with `/`, `&`, `?` or a space stays one
/// segment or value (the server decodes it). What `pfemu ctl` puts in its URLs.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `s` with its `%XX` escapes decoded; refuses a malformed escape or bytes that are not
/// UTF-8, naming `what` (the path, a query parameter).
fn percent_decode(s: &str, what: &str) -> Result<String, String> {
    if !s.contains('%') {
        return Ok(s.to_string());
    }
    let bad = || format!("invalid percent-encoding in {what}: `{s}`");
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let digit = |k: usize| {
                bytes
                    .get(k)
                    .and_then(|&c| char::from(c).to_digit(16))
                    .ok_or_else(bad)
            };
            out.push((digit(i + 1)? * 16 + digit(i + 2)?) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

// ----- the HTTP server -----------------------------------------------------------------------

/// How long a client may hold the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// The most a request may take to arrive, all of it, and then its answer to be taken:
    /// past it the client gets 408 (or is cut off). [`READ_TIMEOUT`] by default.
    pub request_deadline: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            request_deadline: READ_TIMEOUT,
        }
    }
}

/// A control server on its own thread; stops (and frees its address) when dropped.
pub struct ControlServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// The connection being served, shut down by the drop so the thread ends at once.
    serving: Arc<Mutex<Option<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `addr` (port 0: any free port, see [`ControlServer::addr`]) and serves
    /// `controller` until dropped. Refuses an address it cannot bind, naming it.
    pub fn start(addr: &str, controller: Controller) -> io::Result<ControlServer> {
        ControlServer::start_with_limits(addr, controller, ServerLimits::default())
    }

    /// [`ControlServer::start`] with `limits` on each client.
    pub fn start_with_limits(
        addr: &str,
        controller: Controller,
        limits: ServerLimits,
    ) -> io::Result<ControlServer> {
        if limits.request_deadline.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the control server's request_deadline must be more than 0",
            ));
        }
        let listener = TcpListener::bind(addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on the control address `{addr}`: {e}"),
            )
        })?;
        let bound = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Arc::new(Mutex::new(None));
        let server = Server {
            controller,
            limits,
            stop: Arc::clone(&stop),
            serving: Arc::clone(&serving),
        };
        let thread = std::thread::Builder::new()
            .name("pfemu-control".into())
            .spawn(move || server.serve(listener))?;
        Ok(ControlServer {
            addr: bound,
            stop,
            serving,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Cut off the client being served (its read or write returns at once), so a slow
        // or idle one does not hold the stop for its deadline.
        if let Some(s) = self.serving.lock().take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        // Wake the blocking accept; it sees the flag and returns.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The server's thread.
struct Server {
    controller: Controller,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
    serving: Arc<Mutex<Option<TcpStream>>>,
}

impl Server {
    fn serve(self, listener: TcpListener) {
        for stream in listener.incoming() {
            // A connection that fails before a request is the client's problem, not ours.
            let Ok(stream) = stream else {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                continue;
            };
            {
                // Under the lock, so the drop either sees this connection or we see its
                // flag.
                let mut serving = self.serving.lock();
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                *serving = stream.try_clone().ok();
            }
            let _ = answer(&stream, &self.controller, self.limits);
            self.serving.lock().take();
        }
    }
}

/// A connection whose reads and writes all end by `deadline`: each waits at most the time
/// left, so a client that trickles its bytes gains nothing by it.
struct Timed<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Timed<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request's deadline passed",
            ));
        }
        Ok(left)
    }
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        (&mut &*self.stream).read(buf)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        (&mut &*self.stream).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&mut &*self.stream).flush()
    }
}

/// Reads one request from `stream` within the deadline, answers it within as long, and
/// closes the connection.
fn answer(stream: &TcpStream, controller: &Controller, limits: ServerLimits) -> io::Result<()> {
    let mut reader = BufReader::new(Timed {
        stream,
        deadline: Instant::now() + limits.request_deadline,
    });
    let response = match read_request(&mut reader) {
        Ok((method, target, body)) => controller.handle(&method, &target, &body),
        Err(r) => r,
    };
    write_response(
        &mut Timed {
            stream,
            deadline: Instant::now() + limits.request_deadline,
        },
        &response,
    )?;
    // A refused request may have left bytes unread; closing on them would reset the
    // connection and lose the answer at the client. Close our side, then read and discard
    // a little for a moment, as HTTP servers do.
    stream.shutdown(std::net::Shutdown::Write)?;
    reader.get_mut().deadline = Instant::now() + LINGER;
    let _ = io::copy(&mut reader.take(LINGER_BYTES), &mut io::sink());
    Ok(())
}

/// How long a closing connection's unread bytes are drained.
const LINGER: Duration = Duration::from_millis(200);
/// How many of them at most.
const LINGER_BYTES: u64 = 4 << 20;

/// The request's method, target and body, or the error response to give instead.
fn read_request(r: &mut impl BufRead) -> Result<(String, String, Vec<u8>), Response> {
    let timeout = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            Response::error(408, "the request did not arrive in time")
        }
        _ => Response::error(400, format!("reading the request: {e}")),
    };
    let mut head = Vec::new();
    let mut line = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    loop {
        line.clear();
        let n = r
            .by_ref()
            .take((MAX_HEAD - head.len().min(MAX_HEAD)) as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(timeout)?;
        head.extend_from_slice(&line);
        if head.len() > MAX_HEAD {
            return Err(Response::error(
                413,
                format!("request headers over {MAX_HEAD} bytes"),
            ));
        }
        if n == 0 {
            return Err(Response::error(
                400,
                "the connection closed before the request ended",
            ));
        }
        let text = String::from_utf8_lossy(&line)
            .trim_end_matches(['\r', '\n'])
            .to_string();
        if text.is_empty() {
            break;
        }
        lines.push(text);
    }
    let mut first = lines
        .first()
        .map(|l| l.split(' '))
        .ok_or_else(|| Response::error(400, "no request line"))?;
    let (Some(method), Some(target), Some(version)) = (first.next(), first.next(), first.next())
    else {
        return Err(Response::error(
            400,
            "a request line is `METHOD /path HTTP/1.1`",
        ));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(Response::error(
            400,
            format!("unsupported protocol `{version}`"),
        ));
    }
    let mut length = 0usize;
    for h in &lines[1..] {
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().map_err(|_| {
                    Response::error(400, format!("invalid Content-Length `{}`", v.trim()))
                })?;
            }
            if k.trim().eq_ignore_ascii_case("transfer-encoding") {
                return Err(Response::error(
                    400,
                    "send the body with a Content-Length, not chunked",
                ));
            }
        }
    }
    if length > MAX_BODY {
        return Err(Response::error(
            413,
            format!("request body of {length} bytes: at most {MAX_BODY}"),
        ));
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).map_err(timeout)?;
    Ok((method.to_string(), target.to_string(), body))
}

fn write_response(stream: &mut impl Write, r: &Response) -> io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        _ => "Error",
    };
    // One buffer, one write (or a few, for a large body): each write looks at the deadline.
    let reply = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        r.status,
        r.content_type,
        r.body.len(),
        r.body
    );
    stream.write_all(reply.as_bytes())?;
    stream.flush()
}

// ----- the client ----------------------------------------------------------------------------

/// Sends one request to a control server at `addr` and returns its status and body: what
/// `pfemu ctl` does. Errors name the address.
pub fn request(
    addr: &str,
    method: &str,
    target: &str,
    body: Option<&Value>,
) -> io::Result<(u16, String)> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("control server at `{addr}`: {e}"));
    let mut stream = TcpStream::connect(addr).map_err(named)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(named)?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        stream,
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(named)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(named)?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or_else(|| {
        named(io::Error::new(
            io::ErrorKind::InvalidData,
            "a reply without headers",
        ))
    })?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            named(io::Error::new(
                io::ErrorKind::InvalidData,
                "a reply without a status",
            ))
        })?;
    Ok((status, body.to_string()))
}
