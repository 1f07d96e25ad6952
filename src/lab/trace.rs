//! Per-packet traces written out: what `--trace` does on `pfemu run` and `pfemu serve`.
//!
//! A [`TraceSpec`] says which packets (ingress ports, an IPv4 host as source or
//! destination, one in every `n`, at most `limit`) and where their records go (standard
//! error or a file, as text blocks or one JSON object per line). [`TraceSpec::start`] gives
//! the engine's [`TraceConfig`] (for [`PfeBuilder::trace`](crate::pfe::PfeBuilder::trace))
//! and a [`TraceOutput`], a thread that writes the records as they come; the PPE threads
//! only queue them ([`ChannelTraceSink`]), so a slow terminal never slows the engine: when
//! the queue is full a record is dropped and counted ([`TraceSummary::lost`]).
//!
//! ```
//! use pfemu::lab::trace::{TraceFormat, TraceSpec};
//!
//! let spec = TraceSpec {
//!     ports: vec![0],
//!     host: Some("10.0.2.1".parse()?),
//!     limit: 10,
//!     format: TraceFormat::Json,
//!     ..TraceSpec::default()
//! };
//! let (trace, output) = spec.start()?;
//! // Pfe::builder().trace(trace) ... run ... shut down ...
//! # drop(trace);
//! let summary = output.finish()?;
//! assert_eq!(summary.written, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::error::ConfigError;
use crate::packet::Port;
use crate::pfe::{ChannelTraceSink, PfeBuilder, TraceConfig, TraceRecord};

/// Records queued for the writer at most; beyond them records are dropped and counted.
pub const QUEUE_RECORDS: usize = 4096;

/// How records are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// [`TraceRecord`]'s text form: a block of lines per packet, a blank line between.
    #[default]
    Lines,
    /// One JSON object per packet, one per line.
    Json,
}

impl FromStr for TraceFormat {
    type Err = ConfigError;

    /// `lines` or `json`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "lines" => Ok(TraceFormat::Lines),
            "json" => Ok(TraceFormat::Json),
            _ => Err(ConfigError::new(
                "trace_format",
                format!("`{s}` is not one of `lines`, `json`"),
            )),
        }
    }
}

/// Which packets are traced and where their records go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceSpec {
    /// Only packets from these ingress ports (empty: every port).
    pub ports: Vec<Port>,
    /// Only IPv4 packets from or to this address (`None`: every packet).
    pub host: Option<Ipv4Addr>,
    /// One in every `one_in` of the packets the filters let through (1: every one).
    pub one_in: u64,
    /// At most this many records (0: no limit).
    pub limit: u64,
    /// Text blocks or JSON lines.
    pub format: TraceFormat,
    /// The file to write (created or truncated); `None`: standard error.
    pub path: Option<PathBuf>,
}

impl Default for TraceSpec {
    /// Every packet of every port, the first 1000, as text to standard error.
    fn default() -> Self {
        TraceSpec {
            ports: Vec::new(),
            host: None,
            one_in: 1,
            limit: 1000,
            format: TraceFormat::Lines,
            path: None,
        }
    }
}

/// Whether `frame` is an IPv4 packet (behind up to two VLAN tags) from or to `host`.
pub fn ipv4_host_matches(frame: &[u8], host: Ipv4Addr) -> bool {
    let mut at = 12;
    loop {
        let Some(t) = frame.get(at..at + 2) else {
            return false;
        };
        match u16::from_be_bytes([t[0], t[1]]) {
            0x8100 | 0x88a8 if at < 20 => at += 4,
            0x0800 => break,
            _ => return false,
        }
    }
    let ip = at + 2;
    let (Some(src), Some(dst)) = (frame.get(ip + 12..ip + 16), frame.get(ip + 16..ip + 20)) else {
        return false;
    };
    let h = host.octets();
    src == h || dst == h
}

impl TraceSpec {
    /// Refuses a spec that would trace nothing by mistake.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.one_in == 0 {
            return Err(ConfigError::new(
                "trace_one_in",
                "0: trace one in every N packets with N at least 1",
            ));
        }
        Ok(())
    }

    /// Opens the output and starts its writer; returns the engine's trace settings and the
    /// writer. Fails when the spec is refused or the file cannot be created (naming it).
    pub fn start(&self) -> Result<(TraceConfig, TraceOutput), ConfigError> {
        self.validate()?;
        let out: Box<dyn Write + Send> = match &self.path {
            Some(p) => Box::new(BufWriter::new(File::create(p).map_err(|e| {
                ConfigError::new(
                    "trace_file",
                    format!("cannot create `{}`: {e}", p.display()),
                )
            })?)),
            None => Box::new(io::stderr()),
        };
        let (sink, rx) = ChannelTraceSink::new(QUEUE_RECORDS);
        let sink = Arc::new(sink);
        let mut cfg = TraceConfig::new(sink.clone());
        cfg.ports = self.ports.clone();
        cfg.one_in = self.one_in;
        cfg.limit = self.limit;
        if let Some(host) = self.host {
            cfg.select = Some(Arc::new(move |_, frame: &[u8]| {
                ipv4_host_matches(frame, host)
            }));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let (flag, count) = (Arc::clone(&stop), Arc::clone(&written));
        let format = self.format;
        let thread = std::thread::Builder::new()
            .name("pfemu-trace".into())
            .spawn(move || write_records(&rx, out, format, &flag, &count))
            .map_err(|e| ConfigError::new("trace", format!("cannot start its writer: {e}")))?;
        Ok((
            cfg,
            TraceOutput {
                sink,
                stop,
                written,
                thread: Some(thread),
            },
        ))
    }
}

/// `builder` tracing what `spec` asks for, and the writer of its records (`None`, and
/// `builder` as it was, without a spec).
pub fn attach(
    spec: Option<&TraceSpec>,
    builder: PfeBuilder,
) -> Result<(PfeBuilder, Option<TraceOutput>), ConfigError> {
    match spec {
        Some(spec) => {
            let (trace, output) = spec.start()?;
            Ok((builder.trace(trace), Some(output)))
        }
        None => Ok((builder, None)),
    }
}

/// Writes records from `rx` until `stop` is set and the queue is empty, counting them in
/// `written`; returns how many.
fn write_records(
    rx: &crossbeam_channel::Receiver<TraceRecord>,
    mut out: Box<dyn Write + Send>,
    format: TraceFormat,
    stop: &AtomicBool,
    count: &AtomicU64,
) -> io::Result<u64> {
    let mut written = 0u64;
    loop {
        let r = match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                out.flush()?;
                if stop.load(Ordering::Acquire) && rx.is_empty() {
                    return Ok(written);
                }
                continue;
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                out.flush()?;
                return Ok(written);
            }
        };
        match format {
            TraceFormat::Lines => writeln!(out, "{r}\n")?,
            TraceFormat::Json => {
                serde_json::to_writer(&mut out, &r)?;
                writeln!(out)?;
            }
        }
        written += 1;
        count.store(written, Ordering::Relaxed);
    }
}

/// The thread writing a trace's records: see the module doc.
pub struct TraceOutput {
    sink: Arc<ChannelTraceSink>,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    thread: Option<JoinHandle<io::Result<u64>>>,
}

impl fmt::Debug for TraceOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceOutput")
            .field("lost", &self.sink.lost())
            .finish_non_exhaustive()
    }
}

/// What a trace wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TraceSummary {
    /// Records written.
    pub written: u64,
    /// Records dropped because the writer fell behind (the queue held
    /// [`QUEUE_RECORDS`]).
    pub lost: u64,
}

impl TraceOutput {
    /// Records dropped so far because the writer fell behind.
    pub fn lost(&self) -> u64 {
        self.sink.lost()
    }

    /// What it wrote and lost so far.
    pub fn summary(&self) -> TraceSummary {
        TraceSummary {
            written: self.written.load(Ordering::Relaxed),
            lost: self.sink.lost(),
        }
    }

    /// Writes what is queued and stops the writer. Call it once the engine has drained
    /// (records of packets still in flight would be lost). Fails when writing failed.
    pub fn finish(mut self) -> io::Result<TraceSummary> {
        self.stop.store(true, Ordering::Release);
        let written = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => return Err(io::Error::other("the trace writer panicked")),
            None => 0,
        };
        Ok(TraceSummary {
            written,
            lost: self.sink.lost(),
        })
    }
}

impl Drop for TraceOutput {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4(src: [u8; 4], dst: [u8; 4], vlan: bool) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0, 5]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0u8; 20];
        ip[0] = 0x45;
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        f.extend_from_slice(&ip);
        f
    }

    #[test]
    fn the_host_filter_matches_either_address_behind_a_vlan_tag_and_nothing_short() {
        let h = Ipv4Addr::new(10, 0, 2, 1);
        for vlan in [false, true] {
            assert!(ipv4_host_matches(
                &ipv4([10, 0, 2, 1], [1, 1, 1, 1], vlan),
                h
            ));
            assert!(ipv4_host_matches(
                &ipv4([1, 1, 1, 1], [10, 0, 2, 1], vlan),
                h
            ));
            assert!(!ipv4_host_matches(
                &ipv4([1, 1, 1, 1], [2, 2, 2, 2], vlan),
                h
            ));
        }
        let mut ipv6 = ipv4([10, 0, 2, 1], [10, 0, 2, 1], false);
        ipv6[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert!(!ipv4_host_matches(&ipv6, h));
        let full = ipv4([10, 0, 2, 1], [1, 1, 1, 1], false);
        for cut in 0..full.len() - 4 {
            assert!(!ipv4_host_matches(&full[..cut], h), "cut at {cut}");
        }
    }

    #[test]
    fn one_in_zero_is_refused_by_name() {
        let e = TraceSpec {
            one_in: 0,
            ..TraceSpec::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("trace_one_in"), "{e}");
    }
}
