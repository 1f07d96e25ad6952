//! The shipped programs' tables as control-plane [`Target`]s: ternary match blocks, ADA's
//! operands, Nimble's rates, and Trio-ML's jobs. Each command's arguments and result are
//! JSON objects; each error names the argument at fault.

use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use serde_json::{json, Value};

use super::{opt_u64, MetricKind, Metrics, Target};
use crate::ada::block::{Ada, ControlPlane};
use crate::mem::tcam::{Tcam, TcamEntry};
use crate::mem::SharedMemory;
use crate::microcode::l3fwd::live::LiveRoutes;
use crate::microcode::nimble::Nimble;
use crate::microcode::trio_ml::{JobConfig, TrioMl};
use crate::packet::Dest;
use crate::pfe::Control;

/// A required `u64` argument.
fn need_u64(args: &Value, key: &str) -> Result<u64, String> {
    opt_u64(args, key)?.ok_or_else(|| format!("give `{key}`"))
}

/// A required argument that fits type `T`, named with its range in the error.
fn need<T: TryFrom<u64>>(args: &Value, key: &str, range: &str) -> Result<T, String> {
    let v = need_u64(args, key)?;
    T::try_from(v).map_err(|_| format!("invalid `{key}` {v}: must be {range}"))
}

/// Refuses arguments `command` does not take (anything but `takes`), naming the first, and
/// arguments that are not a JSON object: ignored, a misspelt argument would look accepted.
fn only_args(command: &str, args: &Value, takes: &[&str]) -> Result<(), String> {
    match args {
        Value::Null => Ok(()),
        Value::Object(m) => match m.keys().find(|k| !takes.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) if takes.is_empty() => {
                Err(format!("`{command}` takes no arguments: got `{k}`"))
            }
            Some(k) => Err(format!(
                "`{command}` takes {}: got `{k}`",
                takes
                    .iter()
                    .map(|t| format!("`{t}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
        other => Err(format!(
            "the arguments of `{command}` must be a JSON object, got {other}"
        )),
    }
}

fn entry_json(e: &TcamEntry) -> Value {
    json!({ "value": e.value, "mask": e.mask, "priority": e.priority, "result": e.result })
}

/// A ternary match block: its entries, its hit counters, and whole-table replacement.
pub struct TcamTarget {
    name: String,
    tcam: Arc<Tcam>,
}

impl TcamTarget {
    /// The block `tcam`, under `name`.
    pub fn new(name: impl Into<String>, tcam: Arc<Tcam>) -> TcamTarget {
        TcamTarget {
            name: name.into(),
            tcam,
        }
    }
}

impl Target for TcamTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn commands(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "entries",
                "{} -> the table's version and entries (value, mask, priority, result)",
            ),
            (
                "hits",
                "{} -> the table's version and each entry's hit counter",
            ),
            (
                "replace",
                "{\"entries\": [{\"value\", \"mask\", \"priority\", \"result\"}, ..]} -> installs \
                 the whole table at once (lookups see the old one or the new one); its version",
            ),
        ]
    }

    fn call(&self, command: &str, args: &Value) -> Result<Value, String> {
        match command {
            "entries" => {
                let (version, entries) = self.tcam.entries();
                let entries: Vec<Value> = entries.iter().map(entry_json).collect();
                Ok(
                    json!({ "version": version, "capacity": self.tcam.capacity(), "entries": entries }),
                )
            }
            "hits" => {
                let (version, hits) = self.tcam.hits();
                Ok(json!({ "version": version, "hits": hits }))
            }
            "replace" => {
                let Some(Value::Array(list)) = args.get("entries") else {
                    return Err(
                        "give `entries`, an array of {value, mask, priority, result}".into(),
                    );
                };
                let entries = list
                    .iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let field = |k: &str, range: &str| -> Result<u64, String> {
                            let v = need_u64(e, k).map_err(|m| format!("entry {i}: {m}"))?;
                            if range == "u32" && v > u64::from(u32::MAX) {
                                return Err(format!(
                                    "entry {i}: invalid `{k}` {v}: must be from 0 to 2^32 - 1"
                                ));
                            }
                            Ok(v)
                        };
                        Ok(TcamEntry {
                            value: field("value", "u32")? as u32,
                            mask: field("mask", "u32")? as u32,
                            priority: opt_u64(e, "priority")
                                .map_err(|m| format!("entry {i}: {m}"))?
                                .unwrap_or(0)
                                .try_into()
                                .map_err(|_| {
                                    format!("entry {i}: invalid `priority`: must be below 2^32")
                                })?,
                            result: field("result", "u64")?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let version = self.tcam.replace(entries).map_err(|e| e.to_string())?;
                Ok(json!({ "version": version }))
            }
            _ => Err(format!("no command `{command}`")),
        }
    }
}

/// One operand under ADA: its controller's counters, its bins and its table, an epoch run
/// from the control side, and its counters as metrics.
pub struct AdaTarget {
    name: String,
    ada: Arc<Ada>,
}

impl AdaTarget {
    /// The operand `ada`, under `name`.
    pub fn new(name: impl Into<String>, ada: Arc<Ada>) -> AdaTarget {
        AdaTarget {
            name: name.into(),
            ada,
        }
    }
}

impl Target for AdaTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn commands(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "stats",
                "{} -> epochs, re-populations, rebalances, expansions, reads, writes, bins",
            ),
            ("bins", "{} -> the monitoring bins, as ternary patterns"),
            (
                "entries",
                "{} -> the calculation table's entries (value, mask, representative)",
            ),
            (
                "epoch",
                "{} -> runs one controller epoch now, from the control side",
            ),
            (
                "lookup",
                "{\"x\": X} -> the calculation table's result for operand X (0 to 2^32 - 1), \
                 without counting it in the monitoring",
            ),
        ]
    }

    fn call(&self, command: &str, args: &Value) -> Result<Value, String> {
        let takes: &[&str] = match command {
            "stats" | "bins" | "entries" | "epoch" => &[],
            "lookup" => &["x"],
            _ => return Err(format!("no command `{command}`")),
        };
        only_args(command, args, takes)?;
        match command {
            "stats" => serde_json::to_value(self.ada.stats()).map_err(|e| e.to_string()),
            "bins" => Ok(json!(self.ada.bins().iter().map(|b| b.pattern()).collect::<Vec<_>>())),
            "entries" => Ok(json!(self
                .ada
                .entries()
                .iter()
                .map(|e| json!({ "value": e.value, "mask": e.mask, "representative": e.representative }))
                .collect::<Vec<_>>())),
            "epoch" => {
                let e = self.ada.epoch(&mut ControlPlane).map_err(|e| e.to_string())?;
                Ok(json!({
                    "hits": e.hits,
                    "repopulated": e.repopulated,
                    "update": format!("{:?}", e.update),
                    "reads": e.reads,
                    "writes": e.writes,
                }))
            }
            "lookup" => {
                let x: u32 = need(args, "x", "an operand from 0 to 2^32 - 1")?;
                Ok(json!({ "x": x, "result": self.ada.table().get(x) }))
            }
            _ => Err(format!("no command `{command}`")),
        }
    }

    fn metrics(&self, out: &mut Metrics) {
        let s = self.ada.stats();
        let label = [("operand", self.name.as_str())];
        for (name, help, v) in [
            ("pfemu_ada_epochs_total", "ADA controller epochs.", s.epochs),
            (
                "pfemu_ada_repopulations_total",
                "Calculation tables installed by ADA.",
                s.repopulations,
            ),
            (
                "pfemu_ada_reads_total",
                "Hit counters ADA's controller read.",
                s.reads,
            ),
            (
                "pfemu_ada_writes_total",
                "Entries ADA's controller wrote.",
                s.writes,
            ),
        ] {
            out.counter(name, help, &label, v);
        }
        out.gauge(
            "pfemu_ada_bins",
            "Monitoring bins of an ADA operand.",
            &label,
            s.bins as f64,
        );
    }
}

/// Nimble's classes: their rates (set from the control plane, as Nimble's controller
/// does, or as a data-plane change the control plane does not see) and what each admitted.
pub struct NimbleTarget {
    nimble: Nimble,
    mem: Arc<SharedMemory>,
}

impl NimbleTarget {
    /// The limiter `nimble`, installed in `mem`.
    pub fn new(nimble: Nimble, mem: Arc<SharedMemory>) -> NimbleTarget {
        NimbleTarget { nimble, mem }
    }

    fn classes(&self) -> usize {
        self.nimble.config().rates_bps.len()
    }
}

impl Target for NimbleTarget {
    fn name(&self) -> &str {
        "classes"
    }

    fn commands(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "list",
                "{} -> each class's rate (bit/s), admitted packets and bytes, tokens",
            ),
            (
                "set_rate",
                "{\"class\": C, \"bps\": R, \"data_plane\": false} -> the control plane sets \
                 class C's rate (with data_plane: true, only the rate word, as a data-plane \
                 change the static arithmetic does not see)",
            ),
        ]
    }

    fn call(&self, command: &str, args: &Value) -> Result<Value, String> {
        match command {
            "list" => (0..self.classes())
                .map(|c| {
                    let counts = self.nimble.counts(&self.mem, c).map_err(|e| e.to_string())?;
                    Ok(json!({
                        "class": c,
                        "rate_bps": self.nimble.rate(&self.mem, c).map_err(|e| e.to_string())?,
                        "admitted_packets": counts.packets,
                        "admitted_bytes": counts.bytes,
                        "tokens_bytes": self.nimble.tokens(&self.mem, c).map_err(|e| e.to_string())?,
                    }))
                })
                .collect::<Result<Vec<Value>, String>>()
                .map(Value::Array),
            "set_rate" => {
                let class: usize = need(args, "class", &format!("a class from 0 to {}", self.classes().saturating_sub(1)))?;
                let bps = need_u64(args, "bps")?;
                let data_plane = match args.get("data_plane") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => return Err(format!("invalid `data_plane` {v}: must be true or false")),
                };
                let set = if data_plane {
                    self.nimble.set_rate(&self.mem, class, bps)
                } else {
                    self.nimble.configure_rate(&self.mem, class, bps)
                };
                set.map_err(|e| e.to_string())?;
                Ok(json!({ "class": class, "rate_bps": bps, "data_plane": data_plane }))
            }
            _ => Err(format!("no command `{command}`")),
        }
    }

    fn metrics(&self, out: &mut Metrics) {
        let (name, help) = (
            "pfemu_nimble_admitted_bytes_total",
            "Bytes a class admitted.",
        );
        out.declare(name, help, MetricKind::Counter);
        for c in 0..self.classes() {
            if let Ok(counts) = self.nimble.counts(&self.mem, c) {
                out.counter(name, help, &[("class", &c.to_string())], counts.bytes);
            }
        }
    }
}

/// Says why a job cannot be added, if it cannot ([`JobsTarget::check_add`]).
type AddCheck = Box<dyn Fn(&JobConfig) -> Result<(), String> + Send + Sync>;

/// How long a removal waits for each of its grace periods (a job's,
/// [`TrioMl::reclaim_retired`]; a route's tbl8 group's, [`LiveRoutes::reclaim_retired`])
/// before it leaves the memory retired (for the next add or removal to bring back).
pub const GRACE_DEADLINE: Duration = Duration::from_secs(2);

/// Trio-ML's (or FPISA's) jobs: list, add and remove while aggregation runs.
///
/// A removed job's memory is brought back to use for a later job of the same shape once no
/// packet or timer thread that could have seen the job still runs
/// ([`TrioMl::remove_job`]): the removal waits for the engine's grace periods (up to
/// [`GRACE_DEADLINE`] each) when the target knows the engine ([`Target::attach`],
/// which [`Controller::new`](super::Controller::new) calls, or [`JobsTarget::engine`]), so
/// that removing and adding jobs forever does not wear the memory out. Without the engine,
/// removed jobs' memory stays retired (never reused).
pub struct JobsTarget {
    trio: TrioMl,
    template: Box<dyn Fn(u8) -> JobConfig + Send + Sync>,
    on_change: Box<dyn Fn(u8) + Send + Sync>,
    check_add: AddCheck,
    engine: OnceLock<Control>,
    /// Held by adds and removals: a job id is not added back while its removal sweeps.
    changing: Mutex<()>,
}

impl JobsTarget {
    /// The jobs of `trio`. A job added without a setting takes [`JobConfig::default`]'s.
    pub fn new(trio: TrioMl) -> JobsTarget {
        JobsTarget {
            trio,
            template: Box::new(|_| JobConfig::default()),
            on_change: Box::new(|_| {}),
            check_add: Box::new(|_| Ok(())),
            engine: OnceLock::new(),
            changing: Mutex::new(()),
        }
    }

    /// The engine that runs `trio`'s program, whose grace periods a removal waits for
    /// (as [`Target::attach`]; the first handle given is kept).
    pub fn engine(self, engine: Control) -> JobsTarget {
        let _ = self.engine.set(engine);
        self
    }

    /// Brings removed jobs' memory back to use, if the engine is known: `None` without
    /// it, else how many jobs' memory became free, or why it stays retired.
    fn reclaim(&self) -> Option<Result<usize, String>> {
        let engine = self.engine.get()?;
        let deadline = Instant::now() + GRACE_DEADLINE;
        Some(
            self.trio
                .reclaim_retired(engine, deadline)
                .map_err(|e| e.to_string()),
        )
    }

    /// Refuses a job to add when `check` says why: for an embedder that cannot serve some
    /// jobs (`pfemu serve` knows its members, the jobs' sources, only from its start).
    pub fn check_add(
        mut self,
        check: impl Fn(&JobConfig) -> Result<(), String> + Send + Sync + 'static,
    ) -> JobsTarget {
        self.check_add = Box::new(check);
        self
    }

    /// A job added with id `job_id` takes the settings it is not given from `template(job_id)`
    /// (its `job_id` and `sources` are always the request's): for an embedder whose jobs
    /// need its own settings, such as the Results' source address and port
    /// ([`AggregationSetup::job_config`](crate::lab::aggregation::AggregationSetup::job_config)).
    pub fn template(
        mut self,
        template: impl Fn(u8) -> JobConfig + Send + Sync + 'static,
    ) -> JobsTarget {
        self.template = Box::new(template);
        self
    }

    /// Calls `f` with the job's id once this target has added or removed a job: for state
    /// an embedder keeps per job beside the engine, which a job added again must not
    /// inherit (`pfemu serve --upstream` forgets the job's run above).
    pub fn on_change(mut self, f: impl Fn(u8) + Send + Sync + 'static) -> JobsTarget {
        self.on_change = Box::new(f);
        self
    }
}

impl Target for JobsTarget {
    fn name(&self) -> &str {
        "jobs"
    }

    fn commands(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "list",
                "{} -> every job's record: sources, slots, timeout (block_exp_ms; 0: none, \
                 blocks wait for every source), Results' addresses",
            ),
            (
                "add",
                "{\"job_id\": J, \"sources\": [..], \"block_cnt_max\"?, \"block_grad_max\"?, \
                 \"block_exp_ms\"?, \"out_dst_addr\"?: \"a.b.c.d\", \"out_group\"? | \
                 \"out_port\"?} -> adds job J; a setting not given is as this program's jobs \
                 have it",
            ),
            (
                "remove",
                "{\"job_id\": J} -> removes job J (its blocks are discarded); `memory`: \
                 \"reusable\" once no PPE thread can still be using it (a later job of the \
                 same shape takes it), or \"retired\" and why",
            ),
        ]
    }

    fn attach(&self, engine: &Control) {
        let _ = self.engine.set(engine.clone());
    }

    fn call(&self, command: &str, args: &Value) -> Result<Value, String> {
        match command {
            "list" => self
                .trio
                .jobs()
                .into_iter()
                .map(|j| {
                    let s = self.trio.job_state(j).map_err(|e| e.to_string())?;
                    Ok(json!({
                        "job_id": j,
                        "sources": s.sources,
                        "block_cnt_max": s.block_cnt_max,
                        "block_grad_max": s.block_grad_max,
                        "block_exp_ms": s.block_exp_ms,
                        "block_curr_cnt": s.block_curr_cnt,
                        "out_src_addr": s.out_src_addr.to_string(),
                        "out_dst_addr": s.out_dst_addr.to_string(),
                        "out_dest": format!("{:?}", s.out_dest),
                    }))
                })
                .collect::<Result<Vec<Value>, String>>()
                .map(Value::Array),
            "add" => {
                let job_id: u8 = need(args, "job_id", "from 0 to 255")?;
                let d = (self.template)(job_id);
                let sources = match args.get("sources") {
                    Some(Value::Array(s)) => s
                        .iter()
                        .map(|v| {
                            v.as_u64()
                                .and_then(|v| u8::try_from(v).ok())
                                .ok_or_else(|| format!("invalid source {v}: must be from 0 to 255"))
                        })
                        .collect::<Result<Vec<u8>, String>>()?,
                    _ => return Err("give `sources`, an array of source ids".into()),
                };
                let small = |k: &str, default: u64, max: u64| -> Result<u64, String> {
                    let v = opt_u64(args, k)?.unwrap_or(default);
                    if v > max {
                        return Err(format!("invalid `{k}` {v}: at most {max}"));
                    }
                    Ok(v)
                };
                let out_dst_addr = match args.get("out_dst_addr") {
                    None => d.out_dst_addr,
                    Some(v) => v
                        .as_str()
                        .and_then(|s| s.parse::<Ipv4Addr>().ok())
                        .ok_or_else(|| {
                            format!(
                                "invalid `out_dst_addr` {v}: an IPv4 address like \"239.0.0.1\""
                            )
                        })?,
                };
                let out_dest = match (opt_u64(args, "out_group")?, opt_u64(args, "out_port")?) {
                    (Some(_), Some(_)) => {
                        return Err("give `out_group` or `out_port`, not both".into())
                    }
                    (Some(g), None) => Dest::Group(
                        u16::try_from(g).map_err(|_| format!("invalid `out_group` {g}"))?,
                    ),
                    (None, Some(p)) => {
                        Dest::Port(u16::try_from(p).map_err(|_| format!("invalid `out_port` {p}"))?)
                    }
                    (None, None) => d.out_dest,
                };
                let job = JobConfig {
                    job_id,
                    sources,
                    block_cnt_max: small("block_cnt_max", d.block_cnt_max.into(), 4095)? as u16,
                    block_grad_max: small("block_grad_max", d.block_grad_max.into(), 4095)? as u16,
                    block_exp_ms: small("block_exp_ms", d.block_exp_ms.into(), 255)? as u8,
                    out_dst_addr,
                    out_dest,
                    ..d
                };
                (self.check_add)(&job)?;
                let _changing = self.changing.lock();
                if self.trio.retired_jobs().0 > 0 {
                    // A removal whose grace period ran out left memory retired: another
                    // try. Still busy, the add goes on without it (fresh memory).
                    let _ = self.reclaim();
                }
                self.trio.add_job(&job).map_err(|e| e.to_string())?;
                (self.on_change)(job_id);
                Ok(json!({ "job_id": job_id, "added": true }))
            }
            "remove" => {
                let job_id: u8 = need(args, "job_id", "from 0 to 255")?;
                let _changing = self.changing.lock();
                self.trio.remove_job(job_id).map_err(|e| e.to_string())?;
                (self.on_change)(job_id);
                // The job is gone either way; its memory is reusable only after the grace
                // periods, which a blocked PPE thread can hold up.
                let memory = match self.reclaim() {
                    None => json!("retired"),
                    Some(Ok(_)) => json!("reusable"),
                    Some(Err(e)) => json!(format!("retired: {e}")),
                };
                Ok(json!({ "job_id": job_id, "removed": true, "memory": memory }))
            }
            _ => Err(format!("no command `{command}`")),
        }
    }
}

/// l3fwd's routes while it forwards ([`LiveRoutes`]): list, add, remove, look up.
///
/// The tbl8 group a removal frees is reused only once no packet that could have read it
/// still runs: the removal waits for the engine's grace period (up to [`GRACE_DEADLINE`])
/// when the target knows the engine ([`Target::attach`], which
/// [`Controller::new`](super::Controller::new) calls, or [`RoutesTarget::engine`]), and an
/// add that needs a group tries again first. Without the engine, freed groups stay retired.
pub struct RoutesTarget {
    live: Arc<LiveRoutes>,
    engine: OnceLock<Control>,
}

impl RoutesTarget {
    /// The routes `live` keeps.
    pub fn new(live: Arc<LiveRoutes>) -> RoutesTarget {
        RoutesTarget {
            live,
            engine: OnceLock::new(),
        }
    }

    /// The engine that runs l3fwd, whose grace periods a removal waits for (as
    /// [`Target::attach`]; the first handle given is kept).
    pub fn engine(self, engine: Control) -> RoutesTarget {
        let _ = self.engine.set(engine);
        self
    }

    /// Frees the retired tbl8 groups, if the engine is known and there are any: `None`
    /// when nothing was done, else how many became free or why they stay retired.
    fn reclaim(&self) -> Option<Result<usize, String>> {
        let engine = self.engine.get()?;
        if self.live.retired_groups() == 0 {
            return None;
        }
        let deadline = Instant::now() + GRACE_DEADLINE;
        Some(
            self.live
                .reclaim_retired(engine, deadline)
                .map_err(|e| e.to_string()),
        )
    }
}

/// `A.B.C.D/LEN` as a prefix and length.
fn parse_prefix(v: Option<&Value>) -> Result<(u32, u8), String> {
    let text = v
        .and_then(Value::as_str)
        .ok_or("give `route`, a prefix like \"10.0.0.0/8\"")?;
    let (addr, len) = text
        .split_once('/')
        .ok_or_else(|| format!("invalid `route` `{text}`: a prefix like \"10.0.0.0/8\""))?;
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|_| format!("invalid `route` `{text}`: `{addr}` is not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| format!("invalid `route` `{text}`: the length must be 0 to 32"))?;
    Ok((u32::from(addr), len))
}

impl Target for RoutesTarget {
    fn name(&self) -> &str {
        "routes"
    }

    fn commands(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("list", "{} -> every route and its port"),
            (
                "add",
                "{\"route\": \"10.1.0.0/16\", \"port\": P} -> adds (or replaces) the route; \
                 packets after it take it",
            ),
            (
                "remove",
                "{\"route\": \"10.1.0.0/16\"} -> removes the route; whether there was one, \
                 and `retired_groups`: tbl8 groups freed that a packet may still read (0 once \
                 the engine's grace period ended)",
            ),
            (
                "lookup",
                "{\"addr\": \"10.1.2.3\"} -> the port the table forwards it to (null: none)",
            ),
        ]
    }

    fn attach(&self, engine: &Control) {
        let _ = self.engine.set(engine.clone());
    }

    fn call(&self, command: &str, args: &Value) -> Result<Value, String> {
        match command {
            "list" => Ok(json!(self
                .live
                .routes()
                .into_iter()
                .map(|(r, port)| json!({
                    "route": format!("{}/{}", Ipv4Addr::from(r.prefix), r.len),
                    "port": port,
                }))
                .collect::<Vec<_>>())),
            "add" => {
                let (prefix, len) = parse_prefix(args.get("route"))?;
                let port: u16 = need(args, "port", "a port from 0 to 65535")?;
                // Groups an earlier removal left retired (its grace period timed out)
                // may be free by now, for a route that needs one.
                if self.live.free_groups() == 0 {
                    let _ = self.reclaim();
                }
                self.live
                    .add(prefix, len, port)
                    .map_err(|e| e.to_string())?;
                Ok(json!({ "added": true }))
            }
            "remove" => {
                let (prefix, len) = parse_prefix(args.get("route"))?;
                let removed = self.live.remove(prefix, len).map_err(|e| e.to_string())?;
                // The route is gone either way; a group it freed is reusable only after
                // the grace period, which a blocked PPE thread can hold up.
                let mut answer = json!({ "removed": removed });
                if let Some(Err(e)) = self.reclaim() {
                    answer["why_retired"] = json!(e);
                }
                answer["retired_groups"] = json!(self.live.retired_groups());
                Ok(answer)
            }
            "lookup" => {
                let addr: Ipv4Addr = args
                    .get("addr")
                    .and_then(Value::as_str)
                    .and_then(|a| a.parse().ok())
                    .ok_or("give `addr`, an IPv4 address like \"10.1.2.3\"")?;
                Ok(json!({ "port": self.live.lookup_port(u32::from(addr)) }))
            }
            _ => Err(format!("no command `{command}`")),
        }
    }
}
