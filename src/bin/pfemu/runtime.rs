//! The options of a running engine shared by `pfemu run --iface` and `pfemu serve`: the
//! runtime control plane (`--control`) and the per-packet trace (`--trace*`).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use pfemu::lab::control::DEFAULT_ADDR;
use pfemu::lab::trace::{TraceFormat, TraceSpec};

/// `--control` and `--trace*`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RuntimeArgs {
    /// Serve the runtime control plane while running: HTTP with JSON (counters, memory,
    /// timers, the program's tables) and Prometheus metrics at /metrics, for `pfemu ctl` and
    /// dashboards. ADDR is HOST:PORT (port 0: any free port; the address is printed)
    /// [default when given without ADDR: 127.0.0.1:9477].
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = DEFAULT_ADDR)]
    pub control: Option<String>,
    /// Trace packets: for each, the instructions it ran by label, every XTXN with its address
    /// and value, the verdict and the reorder wait (to standard error; the first 1000
    /// packets unless --trace-limit says otherwise). The --trace-* options narrow it and
    /// imply it.
    #[arg(long)]
    pub trace: bool,
    /// Trace packets from this ingress port only (repeatable).
    #[arg(long = "trace-port", value_name = "PORT")]
    pub trace_ports: Vec<u16>,
    /// Trace IPv4 packets from or to this address only.
    #[arg(long, value_name = "A.B.C.D")]
    pub trace_host: Option<Ipv4Addr>,
    /// Trace one in every N of the packets the other filters select (1: every one).
    #[arg(long, value_name = "N")]
    pub trace_one_in: Option<u64>,
    /// Trace at most N packets (0: no limit) [default: 1000].
    #[arg(long, value_name = "N")]
    pub trace_limit: Option<u64>,
    /// Write trace records as JSON, one object per line.
    #[arg(long)]
    pub trace_json: bool,
    /// Write trace records to FILE instead of standard error.
    #[arg(long, value_name = "FILE")]
    pub trace_file: Option<PathBuf>,
}

impl RuntimeArgs {
    /// The trace asked for, if any (any --trace-* option turns it on).
    pub fn trace_spec(&self) -> Option<TraceSpec> {
        let on = self.trace
            || !self.trace_ports.is_empty()
            || self.trace_host.is_some()
            || self.trace_one_in.is_some()
            || self.trace_limit.is_some()
            || self.trace_json
            || self.trace_file.is_some();
        let d = TraceSpec::default();
        on.then(|| TraceSpec {
            ports: self.trace_ports.clone(),
            host: self.trace_host,
            one_in: self.trace_one_in.unwrap_or(d.one_in),
            limit: self.trace_limit.unwrap_or(d.limit),
            format: if self.trace_json {
                TraceFormat::Json
            } else {
                TraceFormat::Lines
            },
            path: self.trace_file.clone(),
        })
    }

    /// The first of these options given, if any (for commands that do not take them).
    pub fn given(&self) -> Option<&'static str> {
        if self.control.is_some() {
            Some("--control")
        } else if self.trace_spec().is_some() {
            Some("--trace")
        } else {
            None
        }
    }
}
