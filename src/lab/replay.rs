//! Replay a pcap or pcapng capture through the PFE and write what leaves it as pcap
//! captures.
//!
//! [`replay_file`] reads a capture (classic pcap or pcapng, link type Ethernet), runs every
//! packet through a shipped program ([`ReplayProgram`]: the filter, l3fwd, or Trio-ML /
//! FPISA aggregation) on a running [`Pfe`], and writes `OUT/port<N>.pcap` for every port
//! that sent anything and, when asked ([`ReplayConfig::write_drops`]), `OUT/dropped.pcap`.
//! [`replay`] does the same with writers of the caller's choice (in memory, a socket, ...).
//! `pfemu replay` is the CLI.
//!
//! # Input
//!
//! - Classic pcap (microsecond or nanosecond timestamps, either byte order) or pcapng
//!   (either byte order), told apart by the file's magic number.
//! - Link type Ethernet (1) only; any other is refused, naming the link type (and, in a
//!   pcapng capture, the interface).
//! - The whole capture is read and checked **before** the engine starts, so a bad or
//!   truncated file fails with nothing written; the capture must fit in memory.
//! - Packets captured shorter than they were on the wire (`caplen < len`, a snap length)
//!   are counted ([`ReplayReport::truncated_in`]) and replayed **as captured**: the program
//!   sees the captured bytes only (so e.g. l3fwd may drop them as `bad_length`).
//! - **Ingress ports.** Classic pcap records no interface, so every packet enters on
//!   [`ReplayConfig::port`] (0 by default). In a pcapng capture, a packet of interface `i`
//!   (the index of its Interface Description Block in its section; in a one-section
//!   capture, tshark's `frame.interface_id`) enters on port [`ReplayConfig::port`]` + i`;
//!   [`ReplayReport::packets_in_by_port`] counts them.
//!
//! pcapng details: every section must be of pcapng version 1.0, or 1.2, which some writers
//! wrote and which the pcapng specification has readers take for 1.0; a Section Header
//! Block of any other version is refused, naming it (another major version is another
//! format, and another minor version of 1 may hold what a reader of 1.0 cannot read).
//! Enhanced Packet Blocks are timed at their interface's resolution
//! (`if_tsresol`: `10^-n` or `2^-n` seconds, microseconds when absent) plus its
//! `if_tsoffset` seconds. Simple Packet Blocks belong to interface 0 (which must come
//! before them), carry `min(original length, the interface's snap length)` bytes (snap
//! length 0: no limit) and no timestamp: they take the timestamp of the packet before them
//! (the first timestamped packet's, before it).
//! Interface ids count from 0 again in each section, as pcapng defines them. The obsolete
//! Packet Block is refused (rewrite the file with `editcap`). Blocks that carry no packet
//! (name resolution, interface statistics, decryption secrets such as a TLS key log
//! injected with `editcap --inject-secrets`, systemd journal entries, custom and unknown
//! blocks) are skipped whatever their length: read past in bounded pieces, never held in
//! memory, and not parsed.
//!
//! pcapng errors name the block (counted from 1, the Section Header Block first, skipped
//! blocks included) and the complete packets before it. Each block is framed before it is
//! parsed: a file that ends inside a block (a skipped one included) is **truncated**; a
//! block whose length field cannot be right (not a multiple of 4, under 12 bytes, or, for
//! the Section Header, Interface Description and packet blocks that are parsed, over
//! [`MAX_PCAPNG_BLOCK_BYTES`]) is **corrupt**, with nothing allocated for it, and so is a
//! skipped block whose trailing length differs from its leading one; a parsed block whose
//! content does not parse (a field or an option running past its end, an option of the
//! wrong length, lengths that differ, ...) is **malformed**. A block's options end at
//! `opt_endofopt` or, where a writer left that out (pcapng allows it), at the block's end.
//! A Simple Packet Block holding fewer bytes than it must (see above) is corrupt: its
//! padding is not replayed as packet data.
//!
//! # Timing
//!
//! - [`Timing::AsFast`]: frames are injected in bursts as fast as the engine takes them.
//! - [`Timing::Capture`]: the replay runs **in capture time**. The engine's clock is a
//!   [`ManualClock`] that only the replay moves: before injecting a packet it moves the
//!   clock to the packet's timestamp minus the first packet's, one timer launch at a time,
//!   letting the engine drain before each move and each launch run to completion
//!   ([`Pfe::settle_timers`]) - so every packet is handled at its capture time, and every
//!   timer launch due before it (aggregation's straggler scan) has run, in order. Packets
//!   sharing a timestamp are injected together; a packet timestamped before an earlier one
//!   is injected at the clock's reading (time never goes back). No thread sleeps: a
//!   capture of an hour replays in the time the engine needs for its packets, and a gap in
//!   which no aggregation block or kept Result waits for a timer is crossed in one step.
//!   Nothing depends on the machine's speed: the same capture gives the same outputs,
//!   timestamps included, on any machine (only the order of frames that share a timestamp
//!   and a port may differ when several PPE threads run). It costs parallelism: the
//!   engine drains at every new timestamp.
//! - [`Timing::Recorded`]: frame `i` is injected `(ts_i - ts_0) / speed` after the first
//!   (a schedule longer than a week is refused as a `speed` error: more likely a corrupt
//!   timestamp than a capture to wait for),
//!   the thread sleeping in between (so precision is the OS's sleep granularity, some tens
//!   of microseconds); a capture whose timestamps go backwards injects such frames at once.
//!
//! # Output
//!
//! Each `port<N>.pcap` holds the frames that left port `N`, in the order they left it
//! (with per-flow reordering on, the engine keeps each flow's order; frames of different
//! flows may pass each other when several PPE threads run). Output captures are classic
//! pcap, link type Ethernet, nanosecond timestamps, snap length 262144.
//!
//! **Timestamps** of egress frames are the time they left the engine on the timeline of the
//! capture: the first input packet's timestamp plus the wall-clock time since the first
//! injection (times `speed` with [`Timing::Recorded`], so at any speed an output frame
//! lines up with the inputs around it; at speed 1 its timestamp minus its input's is the
//! latency through the emulator). With [`Timing::Capture`] it is the first input packet's
//! timestamp plus the replay's clock: a frame a packet caused carries that packet's
//! timestamp exactly (the emulator's latency reads as 0), a frame a timer sent (a partial
//! Result) the time of the timer launch that sent it. A rewritten frame cannot be matched to its input in
//! general, so input timestamps are not carried over. pcap timestamps end in 2106 (32-bit
//! seconds): input timestamps past that are refused when the capture is read, and egress
//! timestamps that a huge `speed` would push past it are clamped to its last nanosecond.
//!
//! # Aggregation (Trio-ML and FPISA)
//!
//! [`ReplayProgram::Aggregation`] installs Trio-ML ([`crate::microcode::trio_ml`]) with
//! 32-bit integer lanes, or FPISA's FP32 lanes, and the jobs of an [`AggregationSetup`],
//! as `pfemu serve` does ([`AggregationSetup::install`]: [`AggregationSetup::slots`] block slots per job,
//! the block timeout, at most `block_grad_max` gradients per packet). Aggregation packets are
//! Figure 7's frames (Ethernet + IPv4 + UDP to port 12000 + the 12-byte Trio-ML header +
//! the gradients) sent to the PFE's address 10.0.0.254; [`crate::lab::bench::trio_ml::generate`]
//! and [`crate::microcode::trio_ml::host::Worker`] make such frames. Each job's Results
//! leave on port `job_id`, so they land in `port<job_id>.pcap`; a kept Result answering a
//! retransmission (or a late source) leaves on the port the request came in on.
//!
//! Aggregation packets are *consumed* (counted in [`ReplayReport::consumed`]), not
//! forwarded and not dropped: a Result is a new frame (counted in
//! [`ReplayReport::created`]). Packets the program refuses are dropped with its reasons
//! (`unknown_source`, `unknown_job`, `bad_length`, `duplicate`, `late`, ...; see the
//! Trio-ML module docs); a retransmission answered with a kept Result counts as dropped
//! (`retransmit_answered`), its answer as created.
//!
//! **Order.** A worker sends a block id's next generation only once the previous one's
//! Result came back, and retransmits only what went unanswered, so in the capture a
//! block's generations follow each other. PPE threads take packets of different flows
//! (workers) in any order, so an as-fast replay could let a later generation overtake an
//! earlier one (which would then be dropped as `stale_gen`). The replay keeps that order:
//! a packet that starts another generation of a block id, or repeats a source of it, since
//! the engine last drained waits for the engine to drain first (about once per window of
//! packets in a worker's capture). Within one generation the sources' packets are still
//! added in any order: exact for integers, and for FPISA whenever the sums are exact, but
//! FPISA-A's result may depend on the order (`--ppe-threads 1` keeps the capture's).
//!
//! The straggler scan runs on its timer threads during the replay, on the engine's clock
//! (the wall clock, or the capture's with [`Timing::Capture`]): a
//! block that no packet touched for its job's `block_exp_ms` gets a partial Result
//! (`degraded`, `age_op = 1`, `src_cnt` = the sources that made it). **After the last
//! injection the replay keeps the engine running until every block is finished** - every
//! block still open then is missing a source, and times out between `block_exp_ms` and
//! `block_exp_ms` plus a scan period (1 ms) after its last packet - and only then drains
//! and shuts the engine down, so every partial Result is written too. It gives up when
//! the number of open blocks has not gone down for `block_exp_ms` + 1 s (a block left open
//! by a faulted thread never finishes) and reports those blocks in
//! [`ReplayReport::open_blocks`]. Because timeouts follow the wall clock, a block whose
//! packets reach the engine more than `block_exp_ms` apart times out even when every
//! source is in the capture: with [`Timing::Recorded`] that follows the capture's own
//! gaps (divided by the speed), and with [`Timing::AsFast`] it needs a stall that long.
//!
//! **In capture time** ([`Timing::Capture`]) the scan follows the capture's own timestamps
//! exactly: a block whose packets are more than `block_exp_ms` apart in the capture times
//! out, one whose packets are closer never does, whatever the machine, and a partial
//! Result carries the time of the scan that sent it: between `block_exp_ms` and
//! `block_exp_ms` plus a scan period after its last packet's timestamp. After the last
//! packet the replay moves the clock on one timer launch at a time until no block is open,
//! or until `block_exp_ms` + 1 s of capture time has passed (a block left open by a faulted
//! thread), reporting those in [`ReplayReport::open_blocks`]. This is the mode to use when
//! the outcome must be exact (tests, comparing runs); a timeout shorter than the capture's
//! gaps within a block splits it into partial Results, as a live `pfemu serve` with that
//! timeout would.
//!
//! # Dropped packets
//!
//! The engine counts drops by reason but does not hand dropped frames out, and programs
//! rewrite frames (l3fwd changes MACs, TTL and checksum), so drops cannot be found by
//! comparing bytes. With [`ReplayConfig::write_drops`] the replay is exact instead: it
//! injects **one packet at a time** and waits for the engine to drain before the next;
//! the difference of the engine's counters then says what became of that packet (left,
//! consumed, or dropped and why). A dropped packet is written to `dropped.pcap` as it was
//! captured (input timestamp and length), and listed in [`ReplayReport::drops`] with its
//! index in the capture, its ingress port and the drop reason. This is much slower than a
//! normal replay and keeps only one packet in flight, so use it to debug a program, not to
//! measure it. It works for every program: an aggregation packet that does not complete a
//! block is consumed, not dropped, so it is not listed.
//!
//! ```no_run
//! use std::path::Path;
//! use pfemu::lab::replay::{replay_file, ReplayConfig, ReplayProgram};
//! use pfemu::lab::aggregation::{Aggregation, AggregationSetup, JobSpec};
//!
//! // Job 1 with sources 0..4; its Results go to out/port1.pcap.
//! let job: JobSpec = "1:4".parse()?;
//! let cfg = ReplayConfig {
//!     program: ReplayProgram::Aggregation(AggregationSetup::new(Aggregation::TrioMl, vec![job])),
//!     write_drops: true,
//!     ..ReplayConfig::default()
//! };
//! let report = replay_file(&cfg, Path::new("in.pcapng"), Path::new("out"))?;
//! println!(
//!     "{} in: {} consumed, {} dropped; {} Results out by port {:?}",
//!     report.packets_in, report.consumed, report.dropped, report.created,
//!     report.packets_out_by_port
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};
use serde::Serialize;

use crate::error::ConfigError;
use crate::lab::aggregation::{Aggregation, AggregationSetup};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::filter::Filter;
use crate::microcode::l3fwd::{Dir248, L3fwd, RouteTable};
use crate::microcode::trio_ml::wire::{self, GRAD_BYTES, HEADERS_LEN, MAX_GRAD_CNT, UDP_AT};
use crate::microcode::trio_ml::{TrioMl, TrioMlConfig};
use crate::packet::Port;
use crate::pfe::{default_ppe_threads, Frames, Pfe, Sink, StartError, Stats, DEFAULT_PORTS};
use crate::timer::{Clock, ManualClock};

/// Snap length of the captures written (tcpdump's largest).
pub const OUT_SNAPLEN: u32 = 262_144;
/// Largest packet record accepted in an input capture; a larger one means a corrupt file.
pub const MAX_RECORD_BYTES: u32 = 262_144;
/// Largest pcapng block replay reads whole to parse it (a Section Header, Interface
/// Description, Enhanced Packet, Simple Packet or obsolete Packet Block): a packet block of
/// [`MAX_RECORD_BYTES`] with room for its fields and options. A longer one means a corrupt
/// length field. Blocks that carry no packet (name resolution, interface statistics,
/// decryption secrets, journal entries, custom and unknown blocks) are skipped unread and
/// are not bounded by it: any length a pcapng block can have (a `u32`) is accepted for them.
pub const MAX_PCAPNG_BLOCK_BYTES: u32 = MAX_RECORD_BYTES + 65_536;
/// Frames per burst in [`Timing::AsFast`] replays.
const BURST: usize = 1024;
/// Most ports an engine has.
const MAX_PORTS: usize = 4096;

/// The program a capture is replayed through.
#[derive(Clone, Debug)]
pub enum ReplayProgram {
    /// The paper's packet filter ([`crate::microcode::filter`]): plain IPv4 packets leave
    /// on port 1 unchanged; others are dropped (`non_ip`, `ip_options`,
    /// `truncated`).
    Filter,
    /// IPv4 forwarding ([`crate::microcode::l3fwd`]) with these routes.
    L3fwd(Routes),
    /// Trio-ML or FPISA aggregation ([`crate::microcode::trio_ml`]) of these jobs; each
    /// job's Results leave on port `job_id` (see the module docs).
    Aggregation(AggregationSetup),
}

impl ReplayProgram {
    /// The program's name, as the CLI spells it.
    pub fn name(&self) -> &'static str {
        match self {
            ReplayProgram::Filter => "filter",
            ReplayProgram::L3fwd(_) => "l3fwd",
            ReplayProgram::Aggregation(a) => match a.aggregation {
                Aggregation::TrioMl => "trio-ml",
                Aggregation::Fpisa(crate::fpisa::Variant::Full) => "fpisa",
                Aggregation::Fpisa(crate::fpisa::Variant::Approx) => "fpisa-approx",
            },
        }
    }
}

/// Where l3fwd's routes come from.
#[derive(Clone, Debug)]
pub enum Routes {
    /// `count` random routes over ports `0..ports` ([`RouteTable::generate`]); real
    /// captures mostly miss random prefixes (`no_route`), so prefer a route file for them.
    Generated {
        /// Routes.
        count: usize,
        /// Egress ports they spread over.
        ports: u16,
        /// Seed.
        seed: u64,
    },
    /// A route file ([`RouteTable::parse`] describes the format).
    File(PathBuf),
    /// A table built by the caller.
    Table(RouteTable),
}

/// When frames are injected, and on which clock the engine runs. More ways may come, so
/// a `match` on it needs a wildcard arm outside this crate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub enum Timing {
    /// As fast as the engine takes them; the engine (its timers, the egress timestamps)
    /// runs on the wall clock.
    AsFast,
    /// In capture time: the engine runs on a clock the replay moves itself, to each
    /// packet's timestamp (relative to the first) before injecting it, with every timer
    /// launch due by then run first, in order; egress timestamps read that clock. The
    /// outcome (which aggregation blocks time out, every output timestamp) follows from the
    /// capture alone, on any machine, and the replay takes as long as the engine needs,
    /// not as long as the capture lasted. See the module documentation.
    Capture,
    /// At the capture's timestamps relative to the first packet, divided by `speed`
    /// (2.0 replays twice as fast as recorded). `speed` must be positive and finite.
    Recorded {
        /// Speed-up factor.
        speed: f64,
    },
}

/// A replay's settings.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// The program the PPE threads run.
    pub program: ReplayProgram,
    /// When frames are injected.
    pub timing: Timing,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Ingress port of every packet of a classic pcap capture (which records no
    /// interface); in a pcapng capture, the port of interface 0 (interface `i` enters on
    /// `port + i`).
    pub port: Port,
    /// Find the dropped packets exactly (one packet in flight at a time; see the module
    /// documentation) and write them to `dropped.pcap`.
    pub write_drops: bool,
}

impl Default for ReplayConfig {
    /// The filter, as fast as possible, on the available cores, ingress port 0, no drops
    /// file.
    fn default() -> Self {
        ReplayConfig {
            program: ReplayProgram::Filter,
            timing: Timing::AsFast,
            ppe_threads: default_ppe_threads(),
            port: 0,
            write_drops: false,
        }
    }
}

/// One dropped input packet (with [`ReplayConfig::write_drops`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DroppedPacket {
    /// Index of the packet in the input capture (0-based; tshark numbers frames from 1).
    pub index: u64,
    /// The port it entered on.
    pub port: Port,
    /// Why it was dropped, as in [`Stats::dropped_by_reason`].
    pub reason: String,
}

/// What a replay did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplayReport {
    /// The program's name.
    pub program: String,
    /// The input's format: `pcap` or `pcapng`.
    pub format: String,
    /// Packets read from the capture and injected.
    pub packets_in: u64,
    /// Packets injected per ingress port (see [`ReplayConfig::port`]).
    pub packets_in_by_port: BTreeMap<Port, u64>,
    /// Bytes injected (as captured).
    pub bytes_in: u64,
    /// Packets captured shorter than they were on the wire (replayed as captured).
    pub truncated_in: u64,
    /// Frames written per egress port (ports that sent nothing are absent): forwarded
    /// input packets and created frames.
    pub packets_out_by_port: BTreeMap<Port, u64>,
    /// Input packets that left the engine (forwarded, or multicast once per packet).
    pub forwarded: u64,
    /// Input packets the program consumed (aggregation packets, added to a block).
    pub consumed: u64,
    /// Input packets dropped. `packets_in == forwarded + consumed + dropped`.
    pub dropped: u64,
    /// Drops by reason.
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// Frames the program created (aggregation Results), counted in
    /// `packets_out_by_port` too.
    pub created: u64,
    /// Aggregation blocks still open when the replay stopped waiting for them after the
    /// last injection (see the module docs): their packets were consumed, but no Result
    /// left. 0 for the other programs, and for every aggregation replay short of a fault.
    pub open_blocks: u64,
    /// Every dropped packet and its reason, in capture order (with
    /// [`ReplayConfig::write_drops`] only; empty otherwise).
    pub drops: Vec<DroppedPacket>,
    /// The files written, sorted ([`replay_file`] only; [`replay`] leaves it empty).
    pub files: Vec<PathBuf>,
    /// Wall-clock seconds from the first injection until the engine drained (with
    /// aggregation, this includes the wait for the open blocks' timeouts, except with
    /// [`Timing::Capture`], which moves its clock past them without waiting).
    pub elapsed_s: f64,
    /// The engine's final counters.
    pub stats: Stats,
}

/// An output capture of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Output {
    /// The frames that left a port.
    Port(Port),
    /// The dropped input packets.
    Dropped,
}

impl Output {
    /// The file name [`replay_file`] uses: `port<N>.pcap` or `dropped.pcap`.
    pub fn file_name(&self) -> String {
        match self {
            Output::Port(p) => format!("port{p}.pcap"),
            Output::Dropped => "dropped.pcap".to_string(),
        }
    }
}

/// Why a replay failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReplayError {
    /// The capture could not be opened or read.
    Read {
        /// The capture.
        file: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The capture is not a valid pcap capture.
    Capture {
        /// The capture.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The capture's (or, in a pcapng capture, an interface's) link type is not Ethernet.
    LinkType {
        /// The capture.
        file: String,
        /// The pcapng interface (its index in its section, and its `if_name` if it has
        /// one); `None` for a classic pcap capture.
        interface: Option<(u32, Option<String>)>,
        /// The link type, as the pcap header or the Interface Description Block gives it.
        link_type: u32,
        /// Its name.
        name: String,
    },
    /// A setting was refused (program, routes, speed, PPE threads, ...).
    Config(ConfigError),
    /// An output capture could not be created or written.
    Write {
        /// The output (file name or path).
        output: String,
        /// The error.
        reason: String,
    },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Read { file, source } => write!(f, "cannot read capture {file}: {source}"),
            ReplayError::Capture { file, reason } => write!(f, "capture {file}: {reason}"),
            ReplayError::LinkType {
                file,
                interface: None,
                link_type,
                name,
            } => write!(
                f,
                "capture {file} has link type {link_type} ({name}); replay needs Ethernet (1)"
            ),
            ReplayError::LinkType {
                file,
                interface: Some((i, if_name)),
                link_type,
                name,
            } => {
                write!(f, "capture {file}: interface {i}")?;
                if let Some(n) = if_name {
                    write!(f, " ({n})")?;
                }
                write!(
                    f,
                    " has link type {link_type} ({name}) and packets; replay needs Ethernet (1)"
                )
            }
            ReplayError::Config(e) => e.fmt(f),
            ReplayError::Write { output, reason } => {
                write!(f, "cannot write output capture {output}: {reason}")
            }
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplayError::Read { source, .. } => Some(source),
            ReplayError::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for ReplayError {
    fn from(e: ConfigError) -> Self {
        ReplayError::Config(e)
    }
}

// ----- input -------------------------------------------------------------------------------

/// One packet of the input capture.
#[derive(Clone, Debug)]
struct InPacket {
    ts: Duration,
    orig_len: u32,
    /// Its pcapng interface (0 in a classic pcap capture): the ingress port's offset.
    interface: u32,
    data: Vec<u8>,
}

/// A whole input capture.
struct Capture {
    /// `pcap` or `pcapng`.
    format: &'static str,
    packets: Vec<InPacket>,
}

/// Reads and checks a whole capture (classic pcap or pcapng); `file` names it in errors.
fn read_capture<R: Read>(mut input: R, file: &str) -> Result<Capture, ReplayError> {
    let capture_err = |reason: String| ReplayError::Capture {
        file: file.to_string(),
        reason,
    };
    // Look at the magic number first, for errors that say what the file is.
    let mut magic = [0u8; 4];
    let got = read_up_to(&mut input, &mut magic).map_err(|source| ReplayError::Read {
        file: file.to_string(),
        source,
    })?;
    if got == 0 {
        return Err(capture_err("the file is empty, not a pcap capture".into()));
    }
    if got < 4 {
        return Err(capture_err(format!(
            "only {got} bytes long: not a pcap capture (the file header alone is 24 bytes)"
        )));
    }
    let input = io::Cursor::new(magic).chain(input);
    match u32::from_be_bytes(magic) {
        0xA1B2_C3D4 | 0xA1B2_3C4D | 0xD4C3_B2A1 | 0x4D3C_B2A1 => {
            let ended = std::rc::Rc::new(std::cell::Cell::new(false));
            let input = Ends {
                inner: input,
                ended: ended.clone(),
            };
            Ok(Capture {
                format: "pcap",
                packets: read_pcap(input, file, &ended)?,
            })
        }
        0x0A0D_0D0A => Ok(Capture {
            format: "pcapng",
            packets: read_pcapng(io::BufReader::new(input), file)?,
        }),
        m => Err(capture_err(format!(
            "not a pcap capture (magic number 0x{m:08x}; pcap starts with a1b2c3d4, \
             a1b23c4d or their byte swaps, pcapng with 0a0d0d0a)"
        ))),
    }
}

/// Reads into `buf` until it is full or the input ends; returns how many bytes it read.
fn read_up_to<R: Read>(input: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A classic pcap capture's reader that notes whether it reached the end of the file.
/// pcap-file's pcap reader reports a record it cannot take whole as an early end of file,
/// both when the file ends inside the record and when the record's length field claims more
/// than the reader takes at once (a corrupt length, the file going on after it); this tells
/// the two apart. (pcapng blocks are framed here instead: [`next_pcapng_block`].)
struct Ends<R> {
    inner: R,
    ended: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<R: Read> Read for Ends<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.ended.set(true);
        }
        Ok(n)
    }
}

/// The error of a failed read of a capture's record `what` (e.g. "packet record 3");
/// `ended`: the file's end was reached (see [`Ends`]).
fn record_err(
    file: &str,
    ended: &std::cell::Cell<bool>,
    e: PcapError,
    what: impl FnOnce() -> String,
) -> ReplayError {
    match e {
        PcapError::IoError(ref io) if io.kind() == io::ErrorKind::UnexpectedEof => {
            ReplayError::Capture {
                file: file.to_string(),
                reason: if ended.get() {
                    format!("truncated: the file ends inside {}", what())
                } else {
                    format!(
                        "{} is corrupt: its length runs past what a record can be, while the \
                         file goes on after it",
                        what()
                    )
                },
            }
        }
        PcapError::IoError(source) => ReplayError::Read {
            file: file.to_string(),
            source,
        },
        other => ReplayError::Capture {
            file: file.to_string(),
            reason: format!("{}: {other}", what()),
        },
    }
}

/// Checks a record's captured length; `n` is its packet number (1-based).
fn check_record_len(file: &str, n: usize, len: usize) -> Result<(), ReplayError> {
    if len > MAX_RECORD_BYTES as usize {
        return Err(ReplayError::Capture {
            file: file.to_string(),
            reason: format!(
                "packet record {n} claims {len} captured bytes (at most {MAX_RECORD_BYTES}): \
                 the file is corrupt"
            ),
        });
    }
    Ok(())
}

/// Reads the packets of a classic pcap capture.
fn read_pcap<R: Read>(
    input: R,
    file: &str,
    ended: &std::cell::Cell<bool>,
) -> Result<Vec<InPacket>, ReplayError> {
    let capture_err = |reason: String| ReplayError::Capture {
        file: file.to_string(),
        reason,
    };
    let mut reader = PcapReader::new(input)
        .map_err(|e| record_err(file, ended, e, || "its 24-byte header".into()))?;
    let header = reader.header();
    if header.datalink != DataLink::ETHERNET {
        return Err(ReplayError::LinkType {
            file: file.to_string(),
            interface: None,
            link_type: u32::from(header.datalink),
            name: format!("{:?}", header.datalink),
        });
    }
    let nanos = header.ts_resolution == TsResolution::NanoSecond;
    let mut packets = Vec::new();
    // Raw records: pcap-file's checked packets refuse `orig_len > snaplen`, which real
    // captures with a snap length have; the checks that matter are made here.
    while let Some(rec) = reader.next_raw_packet() {
        let n = packets.len();
        let rec = rec.map_err(|e| {
            record_err(file, ended, e, || {
                format!("packet record {} (after {n} complete packets)", n + 1)
            })
        })?;
        check_record_len(file, n + 1, rec.incl_len as usize)?;
        let frac_ns = if nanos {
            Some(rec.ts_frac)
        } else {
            rec.ts_frac.checked_mul(1000)
        };
        let Some(frac_ns) = frac_ns.filter(|&f| f < 1_000_000_000) else {
            return Err(capture_err(format!(
                "packet record {} has an invalid timestamp fraction {} ({})",
                n + 1,
                rec.ts_frac,
                if nanos { "ns" } else { "us" }
            )));
        };
        packets.push(InPacket {
            ts: Duration::new(u64::from(rec.ts_sec), frac_ns),
            orig_len: rec.orig_len.max(rec.incl_len),
            interface: 0,
            data: rec.data.into_owned(),
        });
    }
    Ok(packets)
}

/// A pcapng interface, as its Interface Description Block describes it.
struct Interface {
    link_type: DataLink,
    snaplen: u32,
    /// `if_tsresol` (6, microseconds, when absent).
    tsresol: u8,
    /// `if_tsoffset`, seconds (a signed 64-bit number in the file).
    tsoffset: i64,
    name: Option<String>,
}

/// The time `units` ticks of a pcapng timestamp at resolution `tsresol` stand for: bit 7
/// clear, ticks of `10^-n` s; set, of `2^-n` s (`n` the low 7 bits). Truncated to whole
/// nanoseconds (0 for resolutions too fine to count a 64-bit tick count in them).
fn pcapng_time(units: u64, tsresol: u8) -> Duration {
    let n = u32::from(tsresol & 0x7F);
    let per_sec = if tsresol & 0x80 == 0 {
        10u128.checked_pow(n)
    } else {
        1u128.checked_shl(n)
    };
    let Some(per_sec) = per_sec else {
        return Duration::ZERO;
    };
    let units = u128::from(units);
    // `units / per_sec <= units` fits u64; the fraction is below one second.
    Duration::new(
        (units / per_sec) as u64,
        (units % per_sec * 1_000_000_000 / per_sec) as u32,
    )
}

/// Type of a pcapng Section Header Block (the same in either byte order).
const SHB_TYPE: [u8; 4] = [0x0A, 0x0D, 0x0D, 0x0A];
/// [`SHB_TYPE`] as a number.
const SHB_TYPE_U32: u32 = 0x0A0D_0D0A;
/// The type of an Interface Description Block.
const IDB_TYPE: u32 = 1;
/// The type of the obsolete Packet Block.
const OBSOLETE_PB_TYPE: u32 = 2;
/// The type of a Simple Packet Block.
const SPB_TYPE: u32 = 3;
/// The type of an Enhanced Packet Block.
const EPB_TYPE: u32 = 6;

/// The name, with its article, of a pcapng block of type `type_` (read in its section's
/// byte order) that replay reads whole and parses: the Section Header and Interface
/// Description Blocks, which set the reader's state, and the blocks that carry a packet
/// (Enhanced and Simple Packet Blocks, and the obsolete Packet Block, refused with its own
/// message). `None` for any other block: it carries no packet and changes nothing the
/// reader keeps, so it is skipped unread.
fn parsed_pcapng_block(type_: u32) -> Option<&'static str> {
    match type_ {
        SHB_TYPE_U32 => Some("a Section Header Block"),
        IDB_TYPE => Some("an Interface Description Block"),
        OBSOLETE_PB_TYPE => Some("an obsolete Packet Block"),
        SPB_TYPE => Some("a Simple Packet Block"),
        EPB_TYPE => Some("an Enhanced Packet Block"),
        _ => None,
    }
}

/// What [`next_pcapng_block`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextBlock {
    /// The file ended cleanly, between blocks.
    End,
    /// A block to parse, read whole into the buffer.
    Read,
    /// A block that carries no packet, read past without being kept (the buffer is left as
    /// it was).
    Skipped,
}

/// Reads the next pcapng block: whole into `buf` (its type, lengths and body) when replay
/// parses it ([`NextBlock::Read`]); past it, in bounded pieces and whatever its length, when
/// it carries no packet ([`NextBlock::Skipped`], see [`parsed_pcapng_block`]);
/// [`NextBlock::End`] when the file ends cleanly before it. `section` is the byte order of
/// the section it is in (`None` for the first block, a Section Header Block, which tells its
/// own); `what` names the block in errors. The length field is checked before anything is
/// allocated for it, so a corrupt length is reported as such and a file that ends inside a
/// block as truncated; a skipped block's trailing length is checked against its leading
/// one here, a parsed block's content is left to the caller ([`parse_shb`], [`parse_idb`],
/// [`parse_epb`], [`parse_spb`]), which sees it whole.
fn next_pcapng_block<R: Read>(
    input: &mut R,
    buf: &mut Vec<u8>,
    section: Option<Endianness>,
    file: &str,
    what: &dyn Fn() -> String,
) -> Result<NextBlock, ReplayError> {
    let capture_err = |reason: String| ReplayError::Capture {
        file: file.to_string(),
        reason,
    };
    let read_err = |source| ReplayError::Read {
        file: file.to_string(),
        source,
    };
    let truncated = || capture_err(format!("truncated: the file ends inside {}", what()));
    // The type and the length, and for a Section Header Block its byte-order magic.
    let mut head = [0u8; 12];
    let got = read_up_to(input, &mut head[..8]).map_err(read_err)?;
    if got == 0 && section.is_some() {
        return Ok(NextBlock::End);
    }
    if got < 8 {
        return Err(truncated());
    }
    let shb = head[..4] == SHB_TYPE;
    let endianness = if shb {
        if read_up_to(input, &mut head[8..]).map_err(read_err)? < 4 {
            return Err(truncated());
        }
        match u32::from_be_bytes([head[8], head[9], head[10], head[11]]) {
            0x1A2B_3C4D => Endianness::Big,
            0x4D3C_2B1A => Endianness::Little,
            m => {
                return Err(capture_err(format!(
                    "{}: its byte-order magic is 0x{m:08x}, not a Section Header Block's \
                     (1a2b3c4d or its byte swap): the file is corrupt",
                    what()
                )))
            }
        }
    } else {
        // Only the first block has no section, and it starts with the SHB's type.
        section.unwrap_or(Endianness::Little)
    };
    let u32_of = |b: [u8; 4]| match endianness {
        Endianness::Big => u32::from_be_bytes(b),
        Endianness::Little => u32::from_le_bytes(b),
    };
    let type_ = u32_of([head[0], head[1], head[2], head[3]]);
    let len = u32_of([head[4], head[5], head[6], head[7]]);
    let parsed = parsed_pcapng_block(type_);
    let bad_len = if len % 4 != 0 {
        Some(format!("has length {len}, not a multiple of 4"))
    } else if len < 12 {
        Some(format!(
            "has length {len}, less than the 12 bytes of a block's type and lengths"
        ))
    } else {
        match parsed {
            Some(name) if len > MAX_PCAPNG_BLOCK_BYTES => Some(format!(
                "claims {len} bytes, more than {name} can be (at most \
                 {MAX_PCAPNG_BLOCK_BYTES}: a packet of {MAX_RECORD_BYTES} bytes and room for \
                 its fields and options)"
            )),
            _ => None,
        }
    };
    if let Some(why) = bad_len {
        return Err(capture_err(format!(
            "{} {why}: the file is corrupt",
            what()
        )));
    }
    if parsed.is_none() {
        // No packet and nothing the reader keeps: the body is read and dropped a piece at a
        // time, however long it is, then the trailing length is checked.
        let body = u64::from(len) - 12;
        let skipped = io::copy(&mut (&mut *input).take(body), &mut io::sink()).map_err(read_err)?;
        let mut trailer = [0u8; 4];
        if skipped < body || read_up_to(input, &mut trailer).map_err(read_err)? < 4 {
            return Err(truncated());
        }
        let trailing = u32_of(trailer);
        if trailing != len {
            return Err(capture_err(format!(
                "{} (type 0x{type_:08x}, no packet, skipped) has length {len} but trailing \
                 length {trailing}: the file is corrupt",
                what()
            )));
        }
        return Ok(NextBlock::Skipped);
    }
    let head_len = if shb { 12 } else { 8 };
    buf.clear();
    buf.extend_from_slice(&head[..head_len]);
    buf.resize(len as usize, 0);
    if read_up_to(input, &mut buf[head_len..]).map_err(read_err)? < len as usize - head_len {
        return Err(truncated());
    }
    Ok(NextBlock::Read)
}

/// A pcapng block read whole (its type, lengths and body) in its section's byte order, as
/// [`next_pcapng_block`] framed it. Replay parses the blocks it reads itself rather than with
/// pcap-file's parser, which refuses a correct 4-byte `if_tzone` and any option list that
/// ends at the block's end without `opt_endofopt`, which the pcapng specification lets a
/// writer leave out.
struct NgBlock<'a> {
    bytes: &'a [u8],
    endianness: Endianness,
}

impl NgBlock<'_> {
    fn u16_at(&self, at: usize) -> u16 {
        let b = [self.bytes[at], self.bytes[at + 1]];
        match self.endianness {
            Endianness::Big => u16::from_be_bytes(b),
            Endianness::Little => u16::from_le_bytes(b),
        }
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b: [u8; 4] = self.bytes[at..at + 4].try_into().expect("4 bytes");
        match self.endianness {
            Endianness::Big => u32::from_be_bytes(b),
            Endianness::Little => u32::from_le_bytes(b),
        }
    }

    /// Where the body ends (the trailing length's offset), once the trailing length is
    /// checked against the length, and the body holds at least `fixed` bytes of fields
    /// (`fields` names them).
    fn body_end(&self, fixed: usize, fields: &str) -> Result<usize, String> {
        // Type and length, the body, the trailing length (the framing checked the length).
        let end = self.bytes.len() - 4;
        if self.u32_at(end) as usize != self.bytes.len() {
            return Err(format!(
                "its trailing length {} is not its length {}",
                self.u32_at(end),
                self.bytes.len()
            ));
        }
        if end < 8 + fixed {
            return Err(format!("it is shorter than its {fields} ({fixed} bytes)"));
        }
        Ok(end)
    }

    /// Walks the options from `at` to the body's `end`, calling `each` with every option's
    /// code and value: up to `opt_endofopt` (anything after it is padding) or, where a
    /// writer left that out, the block's end. Every option must end inside the block, and a
    /// custom option must hold its 4-byte Private Enterprise Number.
    fn options(
        &self,
        mut at: usize,
        end: usize,
        mut each: impl FnMut(u16, &[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        while at < end {
            if end - at < 4 {
                return Err(format!(
                    "an option's code and length run past the block's end ({} bytes left)",
                    end - at
                ));
            }
            let (code, len) = (self.u16_at(at), usize::from(self.u16_at(at + 2)));
            if code == 0 {
                // opt_endofopt.
                return Ok(());
            }
            let value_at = at + 4;
            if len.next_multiple_of(4) > end - value_at {
                return Err(format!(
                    "option {code} ({len} bytes and its padding) runs past the block's end"
                ));
            }
            if matches!(code, 2988 | 2989 | 19372 | 19373) && len < 4 {
                return Err(format!(
                    "custom option {code} holds {len} bytes, less than its 4-byte Private \
                     Enterprise Number"
                ));
            }
            each(code, &self.bytes[value_at..value_at + len])?;
            at = value_at + len.next_multiple_of(4);
        }
        Ok(())
    }
}

/// An option of fixed size: `Ok` when `value` is `want` bytes, else the error naming it.
fn sized(name: &str, value: &[u8], want: usize) -> Result<(), String> {
    if value.len() == want {
        Ok(())
    } else {
        Err(format!("{name} of {} bytes (it is {want})", value.len()))
    }
}

/// Why a Section Header Block was refused ([`parse_shb`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum ShbError {
    /// Its content does not parse (what is wrong).
    Malformed(String),
    /// It is of a pcapng version replay does not read: its major and minor version.
    Version(u16, u16),
}

impl From<String> for ShbError {
    fn from(why: String) -> Self {
        ShbError::Malformed(why)
    }
}

/// Whether replay reads a section of pcapng version `major.minor`: version 1.0, and 1.2,
/// which some writers wrote and which the pcapng specification has readers take for 1.0
/// (only block types were added). Another major version is another format (its blocks
/// need not be laid out as 1's), and another minor version of 1 may hold what a reader of
/// 1.0 cannot read; libpcap refuses both too.
fn pcapng_version_read(major: u16, minor: u16) -> bool {
    major == 1 && matches!(minor, 0 | 2)
}

/// The Section Header Block read whole into `block`: the byte order of its section, once
/// its version is one replay reads ([`pcapng_version_read`]). Its options are walked (none
/// is used), ending at `opt_endofopt` or the block's end.
fn parse_shb(block: &[u8]) -> Result<Endianness, ShbError> {
    // The framing read the byte-order magic (and refused any other).
    let endianness = match u32::from_be_bytes(block[8..12].try_into().expect("4 bytes")) {
        0x1A2B_3C4D => Endianness::Big,
        _ => Endianness::Little,
    };
    let b = NgBlock {
        bytes: block,
        endianness,
    };
    // Byte-order magic, major and minor version, section length.
    let end = b.body_end(16, "byte-order magic, versions and section length")?;
    // Before the options: a section of another version may lay them out otherwise.
    let (major, minor) = (b.u16_at(12), b.u16_at(14));
    if !pcapng_version_read(major, minor) {
        return Err(ShbError::Version(major, minor));
    }
    b.options(24, end, |_, _| Ok(()))?;
    Ok(endianness)
}

/// The error for a Section Header Block (`what` names it) that [`parse_shb`] refused.
fn shb_err(file: &str, what: String, e: ShbError) -> ReplayError {
    let reason = match e {
        ShbError::Malformed(why) => format!("{what} is malformed: {why}"),
        ShbError::Version(major, minor) => format!(
            "{what} says pcapng version {major}.{minor}; replay reads version 1.0 (and 1.2, \
             which the pcapng specification has readers take for 1.0){}",
            if major == 1 {
                ": a later minor version may hold what a reader of 1.0 cannot read"
            } else {
                ": another major version is another format"
            }
        ),
    };
    ReplayError::Capture {
        file: file.to_string(),
        reason,
    }
}

/// An Enhanced Packet Block's fields.
struct Epb<'a> {
    interface: u32,
    /// The timestamp's 64-bit tick count (of the interface's resolution).
    ticks: u64,
    orig_len: u32,
    data: &'a [u8],
}

/// The Enhanced Packet Block read whole into `block`, in a section of byte order
/// `endianness`; the error says what is malformed. Its options are walked (none is used;
/// those of a fixed size must have it), ending at `opt_endofopt` or the block's end.
fn parse_epb(block: &[u8], endianness: Endianness) -> Result<Epb<'_>, String> {
    let b = NgBlock {
        bytes: block,
        endianness,
    };
    let end = b.body_end(20, "interface id, timestamp, captured and original lengths")?;
    let caplen = b.u32_at(20) as usize;
    let data_at = 28;
    if caplen.next_multiple_of(4) > end - data_at {
        return Err(format!(
            "its captured_len {caplen} (and its padding) runs past the block's end ({} bytes \
             for the packet)",
            end - data_at
        ));
    }
    b.options(
        data_at + caplen.next_multiple_of(4),
        end,
        |code, value| match code {
            2 => sized("epb_flags", value, 4),
            4 => sized("epb_dropcount", value, 8),
            5 => sized("epb_packetid", value, 8),
            6 => sized("epb_queue", value, 4),
            _ => Ok(()),
        },
    )?;
    Ok(Epb {
        interface: b.u32_at(8),
        ticks: (u64::from(b.u32_at(12)) << 32) | u64::from(b.u32_at(16)),
        orig_len: b.u32_at(24),
        data: &block[data_at..data_at + caplen],
    })
}

/// The Simple Packet Block read whole into `block`: its original length and the bytes it
/// holds (the packet and its padding).
fn parse_spb(block: &[u8], endianness: Endianness) -> Result<(u32, &[u8]), String> {
    let b = NgBlock {
        bytes: block,
        endianness,
    };
    let end = b.body_end(4, "original length")?;
    Ok((b.u32_at(8), &block[12..end]))
}

/// The Interface Description Block read whole into `block` (type, lengths and body), in a
/// section of byte order `endianness`; the error says what is malformed. The fields replay
/// uses (link type, snap length, `if_name`, `if_tsresol`, `if_tsoffset`) are checked, other
/// options are walked past ([`NgBlock::options`]).
fn parse_idb(block: &[u8], endianness: Endianness) -> Result<Interface, String> {
    let b = NgBlock {
        bytes: block,
        endianness,
    };
    let end = b.body_end(8, "link type, reserved field and snap length")?;
    let mut i = Interface {
        link_type: DataLink::from(u32::from(b.u16_at(8))),
        snaplen: b.u32_at(12),
        tsresol: 6,
        tsoffset: 0,
        name: None,
    };
    b.options(16, end, |code, value| {
        match code {
            2 => match std::str::from_utf8(value) {
                Ok(name) => i.name = Some(name.to_string()),
                Err(e) => return Err(format!("if_name is not UTF-8 ({e})")),
            },
            9 => {
                sized("if_tsresol", value, 1)?;
                i.tsresol = value[0];
            }
            14 => {
                sized("if_tsoffset", value, 8)?;
                let v: [u8; 8] = value.try_into().expect("8 bytes");
                i.tsoffset = match endianness {
                    Endianness::Big => i64::from_be_bytes(v),
                    Endianness::Little => i64::from_le_bytes(v),
                };
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(i)
}

/// Reads the packets of a pcapng capture (see the module docs).
fn read_pcapng<R: Read>(mut input: R, file: &str) -> Result<Vec<InPacket>, ReplayError> {
    let capture_err = |reason: String| ReplayError::Capture {
        file: file.to_string(),
        reason,
    };
    let malformed = |what: String, why: String| capture_err(format!("{what} is malformed: {why}"));
    // Blocks are framed here and parsed whole (see `next_pcapng_block`).
    let mut buf = Vec::new();
    let first = || "its first pcapng block (the Section Header Block)".to_string();
    // The file starts with a Section Header Block's type (its magic number): read whole.
    next_pcapng_block(&mut input, &mut buf, None, file, &first)?;
    let mut section = parse_shb(&buf).map_err(|e| shb_err(file, first(), e))?;
    let mut interfaces: Vec<Interface> = Vec::new();
    let mut packets: Vec<InPacket> = Vec::new();
    // Simple Packet Blocks have no timestamp: the indices of those waiting for one.
    let mut untimed: Vec<usize> = Vec::new();
    let mut blocks = 1usize;
    loop {
        blocks += 1;
        let n = packets.len();
        let what = || format!("pcapng block {blocks} (after {n} complete packets)");
        match next_pcapng_block(&mut input, &mut buf, Some(section), file, &what)? {
            NextBlock::End => break,
            // No packet, and nothing the reader keeps (its section and interfaces). It still
            // counts in the blocks' numbering.
            NextBlock::Skipped => continue,
            NextBlock::Read => {}
        }
        let block_type = match section {
            Endianness::Big => u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]),
            Endianness::Little => u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]),
        };
        let no_interface = |interface: u32, interfaces: &[Interface]| {
            capture_err(format!(
                "packet record {} (block {blocks}) is on interface {interface}, but the \
                 section describes {} interfaces",
                n + 1,
                interfaces.len()
            ))
        };
        let (interface, ts, orig_len, data) = match block_type {
            SHB_TYPE_U32 => {
                section = parse_shb(&buf).map_err(|e| shb_err(file, what(), e))?;
                interfaces.clear();
                continue;
            }
            IDB_TYPE => {
                let i = parse_idb(&buf, section).map_err(|why| malformed(what(), why))?;
                interfaces.push(i);
                continue;
            }
            EPB_TYPE => {
                let epb = parse_epb(&buf, section).map_err(|why| malformed(what(), why))?;
                (
                    epb.interface,
                    Some(epb.ticks),
                    epb.orig_len,
                    epb.data.to_vec(),
                )
            }
            SPB_TYPE => {
                let (orig_len, held) =
                    parse_spb(&buf, section).map_err(|why| malformed(what(), why))?;
                let Some(iface) = interfaces.first() else {
                    return Err(no_interface(0, &interfaces));
                };
                // The block holds min(original length, snap length) bytes (snap length 0:
                // no limit), padded to 4 bytes: keep the captured length only.
                let snaplen = iface.snaplen;
                let caplen = if snaplen == 0 {
                    orig_len
                } else {
                    orig_len.min(snaplen)
                };
                if held.len() < caplen as usize {
                    return Err(capture_err(format!(
                        "packet record {} (block {blocks}): a Simple Packet Block holding \
                         {} bytes where its original length {orig_len} and interface 0's \
                         snaplen {snaplen} call for {caplen}: the file is corrupt",
                        n + 1,
                        held.len()
                    )));
                }
                (0, None, orig_len, held[..caplen as usize].to_vec())
            }
            OBSOLETE_PB_TYPE => {
                return Err(capture_err(format!(
                    "block {blocks} is an obsolete Packet Block, which replay does not read \
                     (rewrite the file with `editcap IN OUT.pcapng`)"
                )))
            }
            // Not reached: blocks of any other type (name resolution, interface statistics,
            // decryption secrets, journal entries, custom and unknown blocks) carry no packet
            // and are skipped unread by `next_pcapng_block`.
            _ => unreachable!("only the blocks parsed_pcapng_block names are read"),
        };
        check_record_len(file, n + 1, data.len())?;
        let Some(iface) = interfaces.get(interface as usize) else {
            return Err(no_interface(interface, &interfaces));
        };
        if iface.link_type != DataLink::ETHERNET {
            return Err(ReplayError::LinkType {
                file: file.to_string(),
                interface: Some((interface, iface.name.clone())),
                link_type: u32::from(iface.link_type),
                name: format!("{:?}", iface.link_type),
            });
        }
        let ts = match ts {
            Some(units) => {
                let t = pcapng_time(units, iface.tsresol);
                let secs = i128::from(t.as_secs()) + i128::from(iface.tsoffset);
                let Ok(secs) = u64::try_from(secs) else {
                    return Err(capture_err(format!(
                        "packet record {}: its timestamp plus interface {interface}'s \
                         if_tsoffset ({} s) is before 1970",
                        n + 1,
                        iface.tsoffset
                    )));
                };
                if secs > u64::from(u32::MAX) {
                    // Checked here, once: every output (and dropped.pcap, which keeps input
                    // timestamps) is classic pcap, whose seconds are 32 bits.
                    return Err(capture_err(format!(
                        "packet record {}: its timestamp, {secs} s after 1970, is past \
                         2106-02-07 06:28:15 UTC ({} s), the last time a pcap capture can \
                         hold",
                        n + 1,
                        u32::MAX
                    )));
                }
                let t = Duration::new(secs, t.subsec_nanos());
                for i in untimed.drain(..) {
                    packets[i].ts = t;
                }
                t
            }
            None => match packets.last() {
                Some(p) if untimed.is_empty() => p.ts,
                _ => {
                    untimed.push(n);
                    Duration::ZERO
                }
            },
        };
        packets.push(InPacket {
            ts,
            orig_len: orig_len.max(data.len() as u32),
            interface,
            data,
        });
    }
    Ok(packets)
}

// ----- output ------------------------------------------------------------------------------

/// Opens the writer of an output capture; called once per output, on first use.
pub type Opener = Box<dyn FnMut(Output) -> io::Result<Box<dyn Write + Send>> + Send>;

type Writer = PcapWriter<Box<dyn Write + Send>>;

fn pcap_header() -> PcapHeader {
    PcapHeader {
        snaplen: OUT_SNAPLEN,
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness: Endianness::native(),
        ..PcapHeader::default()
    }
}

fn write_err(out: Output, e: impl fmt::Display) -> ReplayError {
    ReplayError::Write {
        output: out.file_name(),
        reason: e.to_string(),
    }
}

/// The writers, shared by the sink (PPE threads) and the replaying thread.
struct Outputs {
    open: Opener,
    ports: BTreeMap<Port, (Writer, u64)>,
    dropped: Option<Writer>,
    /// The first write error; later frames are not written.
    error: Option<ReplayError>,
    /// When the first frame was injected.
    start: Instant,
}

impl Outputs {
    fn open(&mut self, out: Output) -> Result<Writer, ReplayError> {
        let w = (self.open)(out).map_err(|e| write_err(out, e))?;
        PcapWriter::with_header(w, pcap_header()).map_err(|e| write_err(out, e))
    }
}

/// The sink that writes each port's frames to its capture.
struct PcapSink {
    outputs: Mutex<Outputs>,
    /// Timestamp of the first input packet.
    base: Duration,
    /// Capture time per wall-clock time (the replay's speed).
    scale: f64,
    /// The engine's clock in capture time ([`Timing::Capture`]): timestamps read it rather
    /// than the wall clock.
    capture_clock: Option<Arc<ManualClock>>,
}

impl Sink for PcapSink {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        let mut o = self.outputs.lock();
        if o.error.is_some() {
            return;
        }
        let ts = match &self.capture_clock {
            Some(c) => egress_ts(self.base, Duration::from_nanos(c.now_ns()), 1.0),
            None => egress_ts(self.base, o.start.elapsed(), self.scale),
        };
        if !o.ports.contains_key(&port) {
            match o.open(Output::Port(port)) {
                Ok(w) => {
                    o.ports.insert(port, (w, 0));
                }
                Err(e) => {
                    o.error = Some(e);
                    return;
                }
            }
        }
        let mut failed = None;
        if let Some((w, count)) = o.ports.get_mut(&port) {
            for f in frames.iter() {
                let pkt = PcapPacket::new(ts, f.len() as u32, f);
                if let Err(e) = w.write_packet(&pkt) {
                    failed = Some(write_err(Output::Port(port), e));
                    break;
                }
                *count += 1;
            }
        }
        if failed.is_some() {
            o.error = failed;
        }
    }
}

/// The last time a pcap capture can hold: 2^32 - 1 s after 1970 (2106-02-07 06:28:15 UTC)
/// and 999 999 999 ns.
const LAST_PCAP_TS: Duration = Duration::new(u32::MAX as u64, 999_999_999);

/// The timestamp of a frame leaving `elapsed` after the first injection: `base` plus the
/// elapsed time times `scale` on the capture's timeline, clamped to [`LAST_PCAP_TS`] (a huge
/// speed-up would pass it at once).
fn egress_ts(base: Duration, elapsed: Duration, scale: f64) -> Duration {
    let since = Duration::try_from_secs_f64(elapsed.as_secs_f64() * scale).unwrap_or(Duration::MAX);
    base.saturating_add(since).min(LAST_PCAP_TS)
}

// ----- the replay --------------------------------------------------------------------------

/// A built engine, and the aggregation program's control plane when it runs one.
struct Engine {
    pfe: Pfe,
    /// The aggregation program and its setup, to wait for its open blocks at the end.
    aggregation: Option<(TrioMl, AggregationSetup)>,
}

/// Builds the program's engine around `sink` (not started), with at least `ports` ports
/// (so frames can leave on every ingress port: aggregation answers retransmissions there).
fn build_engine(
    cfg: &ReplayConfig,
    sink: Arc<PcapSink>,
    ports: usize,
) -> Result<Engine, ReplayError> {
    let mut builder = Pfe::builder()
        .ppe_threads(cfg.ppe_threads)
        .sink(sink.clone());
    if let Some(c) = &sink.capture_clock {
        builder = builder.clock(c.clone());
    }
    let ports = ports.max(DEFAULT_PORTS);
    let pfe = match &cfg.program {
        ReplayProgram::Filter => {
            let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
            let filter = Filter::install(&mem)
                .map_err(|e| ConfigError::new("program", format!("installing filter: {e}")))?;
            builder
                .program(filter.program())
                .memory(mem)
                .ports(ports)
                .build()?
        }
        ReplayProgram::L3fwd(routes) => {
            let table = load_routes(routes)?;
            let ports = table
                .next_hops()
                .iter()
                .map(|nh| usize::from(nh.port) + 1)
                .max()
                .unwrap_or(0)
                .max(ports);
            let dir =
                Dir248::build(&table).map_err(|e| ConfigError::new("routes", e.to_string()))?;
            let mem = Arc::new(SharedMemory::new(&l3fwd_memory(&dir))?);
            let l3fwd = L3fwd::install_table(&mem, &dir)
                .map_err(|e| ConfigError::new("memory", e.to_string()))?;
            builder
                .program(l3fwd.program())
                .memory(mem)
                .ports(ports)
                .build()?
        }
        ReplayProgram::Aggregation(a) => {
            let (pfe, trio) = build_aggregation(a, builder, ports)?;
            return Ok(Engine {
                pfe,
                aggregation: Some((trio, a.clone())),
            });
        }
    };
    Ok(Engine {
        pfe,
        aggregation: None,
    })
}

/// The route table `routes` describes: generated, read from its file (an error names the
/// file and, for a parse error, the line), or the caller's; refuses an empty table.
pub(crate) fn load_routes(routes: &Routes) -> Result<RouteTable, ConfigError> {
    let table = match routes {
        Routes::Generated { count, ports, seed } => RouteTable::generate(*count, *ports, *seed)
            .map_err(|e| ConfigError::new("routes", e.to_string()))?,
        // Read here rather than with `RouteTable::from_file`, whose read error names line
        // 0: only the parse errors have a line.
        Routes::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::new("route_file", format!("cannot read {}: {e}", path.display()))
            })?;
            RouteTable::parse(&text)
                .map_err(|e| ConfigError::new("route_file", format!("{}: {e}", path.display())))?
        }
        Routes::Table(t) => t.clone(),
    };
    if table.is_empty() {
        return Err(ConfigError::new("routes", "l3fwd needs at least one route"));
    }
    Ok(table)
}

/// Shared memory for l3fwd with table `dir`: the default, grown to hold it.
pub(crate) fn l3fwd_memory(dir: &Dir248) -> MemConfig {
    let defaults = MemConfig::default();
    MemConfig {
        dram_bytes: defaults
            .dram_bytes
            .max(dir.dram_bytes().next_multiple_of(64)),
        sram_bytes: defaults
            .sram_bytes
            .max((dir.sram_bytes() + 64).next_multiple_of(64)),
        ..defaults
    }
}

/// Installs Trio-ML (integer or FPISA lanes) with the jobs of `a`, as `pfemu serve` does.
fn build_aggregation(
    a: &AggregationSetup,
    builder: crate::pfe::PfeBuilder,
    ports: usize,
) -> Result<(Pfe, TrioMl), ReplayError> {
    if a.block_timeout().is_none() {
        // The replay ends by timing out the blocks its capture left open, so that their
        // partial Results are written: without a timeout they would be lost unwritten.
        return Err(ConfigError::new(
            "block_exp_ms",
            "0 is no block timeout, which a replay does not take: it times out the blocks \
             the capture leaves open to write their partial Results; give 1..=255 ms",
        )
        .into());
    }
    let mem = Arc::new(SharedMemory::new(&a.mem_config())?);
    let trio = a.install(&mem, TrioMlConfig::default().local_addr)?;
    let timers = trio.timer_specs()?;
    let pfe = builder
        .program(trio.program())
        .memory(mem)
        .ports(ports.max(a.job_ports()))
        .max_frame_bytes(HEADERS_LEN + usize::from(MAX_GRAD_CNT) * GRAD_BYTES)
        .timers(timers)
        .build()?;
    Ok((pfe, trio))
}

/// Keeps an aggregation replay in the order the protocol guarantees. A worker sends a block
/// id's next generation only after the Result of the previous one came back, and a
/// retransmission only after the first copy went unanswered; PPE threads take packets of
/// different flows (workers) in any order, so a replay injecting as fast as it can could
/// let a later generation overtake an earlier one (which then drops as `stale_gen`). So a
/// packet that starts another generation of a block id, or repeats a source of it, since
/// the engine last drained waits until it has drained.
struct GenerationBarrier {
    udp_port: u16,
    /// Per (job, block id): the generation, and the sources seen, since the last drain.
    since_drain: HashMap<(u8, u32), (u16, [u64; 4])>,
}

impl GenerationBarrier {
    fn new(udp_port: u16) -> Self {
        GenerationBarrier {
            udp_port,
            since_drain: HashMap::new(),
        }
    }

    /// Whether `frame` must wait until the engine drained (the caller drains, then injects
    /// it); counts it as injected either way.
    fn must_wait(&mut self, frame: &[u8]) -> bool {
        let Ok((h, _)) = wire::parse(frame) else {
            return false;
        };
        if frame[UDP_AT + 2..UDP_AT + 4] != self.udp_port.to_be_bytes() {
            return false;
        }
        let (word, bit) = (usize::from(h.src_id / 64), 1u64 << (h.src_id % 64));
        let key = (h.job_id, h.block_id);
        match self.since_drain.get_mut(&key) {
            Some((gen, mask)) if *gen == h.gen_id && mask[word] & bit == 0 => {
                mask[word] |= bit;
                false
            }
            Some(_) => {
                self.since_drain.clear();
                self.since_drain
                    .insert(key, (h.gen_id, new_mask(word, bit)));
                true
            }
            None => {
                self.since_drain
                    .insert(key, (h.gen_id, new_mask(word, bit)));
                false
            }
        }
    }
}

fn new_mask(word: usize, bit: u64) -> [u64; 4] {
    let mut m = [0; 4];
    m[word] = bit;
    m
}

/// The engine stopped under the replay (it does not, short of a bug).
fn engine_err(e: impl fmt::Display) -> ReplayError {
    ReplayError::Config(ConfigError::new("engine", e.to_string()))
}

/// The speed-up factor of `timing` (1 as fast as possible), refused unless positive and
/// finite.
fn speed_of(timing: Timing) -> Result<f64, ReplayError> {
    match timing {
        Timing::AsFast | Timing::Capture => Ok(1.0),
        Timing::Recorded { speed } => {
            if !(speed.is_finite() && speed > 0.0) {
                return Err(ConfigError::new(
                    "speed",
                    format!("{speed} is not a positive, finite speed-up factor"),
                )
                .into());
            }
            Ok(speed)
        }
    }
}

/// Each packet's ingress port (interface `i` enters on `cfg.port + i`), and how many
/// ports the engine needs for them.
fn ingress_ports(
    cfg: &ReplayConfig,
    packets: &[InPacket],
) -> Result<(Vec<Port>, usize), ReplayError> {
    let ports: Vec<Port> = packets
        .iter()
        .map(|p| {
            u32::from(cfg.port)
                .checked_add(p.interface)
                .and_then(|n| Port::try_from(n).ok())
                .ok_or_else(|| {
                    ConfigError::new(
                        "port",
                        format!(
                            "{} + interface {} of the capture is beyond the largest port, {}",
                            cfg.port,
                            p.interface,
                            Port::MAX
                        ),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let ports_needed = ports.iter().map(|&p| usize::from(p) + 1).max().unwrap_or(0);
    if matches!(cfg.program, ReplayProgram::Aggregation(_)) && ports_needed > MAX_PORTS {
        // Kept Results answering a retransmission leave on the ingress port.
        return Err(ConfigError::new(
            "port",
            format!(
                "packets enter on port {}, but the engine has at most {MAX_PORTS} ports and \
                 aggregation answers retransmissions on the ingress port",
                ports_needed - 1
            ),
        )
        .into());
    }
    Ok((ports, ports_needed))
}

/// When each packet is injected: as fast as possible, or at its capture time (from the
/// first packet's, `base`) divided by `speed`, from `start`.
struct Schedule {
    timing: Timing,
    base: Duration,
    speed: f64,
    start: Instant,
}

/// The longest a replay at recorded times may take, in seconds: a week. A longer schedule is
/// more likely a corrupt timestamp than a capture someone wants to wait for.
const MAX_RECORDED_SECS: f64 = 7.0 * 24.0 * 3600.0;

impl Schedule {
    /// Refuses a recorded-time schedule longer than [`MAX_RECORDED_SECS`]: the last
    /// injection is due (longest gap) / speed after the first. Checked before anything
    /// starts.
    fn check(timing: Timing, packets: &[InPacket], base: Duration) -> Result<(), ReplayError> {
        let Timing::Recorded { speed } = timing else {
            return Ok(());
        };
        let gap = packets
            .iter()
            .map(|p| p.ts.saturating_sub(base))
            .max()
            .unwrap_or(Duration::ZERO);
        let secs = gap.as_secs_f64() / speed;
        if secs > MAX_RECORDED_SECS {
            return Err(ConfigError::new(
                "speed",
                format!(
                    "at speed {speed} the capture's {} s (its first packet to its latest) would \
                     take {secs:e} s to replay, too long: at most {MAX_RECORDED_SECS} s (a \
                     week). A timestamp far from the others is likely corrupt; --timing fast \
                     replays without waiting",
                    gap.as_secs_f64(),
                ),
            )
            .into());
        }
        Ok(())
    }

    /// When packet `p` is due, relative to `start` (`None`: now).
    fn due(&self, p: &InPacket) -> Option<Duration> {
        match self.timing {
            // Capture time moves the engine's clock instead ([`CaptureClock`]).
            Timing::AsFast | Timing::Capture => None,
            // At most MAX_RECORDED_SECS (checked before the start): the conversion cannot fail.
            Timing::Recorded { .. } => Some(
                Duration::try_from_secs_f64(
                    p.ts.saturating_sub(self.base).as_secs_f64() / self.speed,
                )
                .unwrap_or(Duration::MAX),
            ),
        }
    }

    /// Waits until packet `p` is due.
    fn wait_for(&self, p: &InPacket) {
        if let Some(at) = self.due(p) {
            let now = self.start.elapsed();
            if at > now {
                std::thread::sleep(at - now);
            }
        }
    }
}

/// The engine's clock in capture time ([`Timing::Capture`]), moved by the replaying thread
/// alone: reading 0 is the first packet's timestamp, `base`.
struct CaptureClock {
    clock: Arc<ManualClock>,
    base: Duration,
}

impl CaptureClock {
    /// The reading at capture timestamp `ts` (0 before the first packet's; saturating).
    fn reading(&self, ts: Duration) -> u64 {
        u64::try_from(ts.saturating_sub(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves the clock to `target` (not back): one timer launch at a time, the engine
    /// drained before each move so what was injected is handled at the time it was injected
    /// at, and each launch run to completion, so the launches due by `target` run in order.
    /// `quiet` says that no timer has anything to do (no aggregation block open, no Result
    /// kept): the clock then jumps to `target` at once (a launch that finds nothing to do
    /// changes nothing, so skipping them is exact).
    fn advance_to(&self, pfe: &Pfe, target: u64, quiet: &dyn Fn() -> bool) {
        loop {
            let now = self.clock.now_ns();
            let next = pfe
                .control()
                .timers()
                .iter()
                .filter_map(|t| t.next_due_ns)
                .min();
            match next {
                Some(due) if due > now && due <= target && !quiet() => {
                    pfe.drain();
                    self.clock.set(due);
                    pfe.settle_timers();
                }
                _ => break,
            }
        }
        if target > self.clock.now_ns() {
            pfe.drain();
            self.clock.set(target);
            pfe.settle_timers();
        }
    }

    /// The next timer launch's time after now, if any, but at most `bound`: where
    /// [`CaptureClock::finish`] moves the clock next.
    fn next_step(&self, pfe: &Pfe, bound: u64) -> u64 {
        let now = self.clock.now_ns();
        (pfe.control().timers().iter().filter_map(|t| t.next_due_ns))
            .filter(|&due| due > now)
            .min()
            .unwrap_or(bound)
            .min(bound)
    }

    /// After the last packet: moves the clock on, one timer launch at a time, until no
    /// aggregation block is open or the clock passes `patience` from now; returns the blocks
    /// still open.
    fn finish(&self, pfe: &Pfe, trio: &TrioMl, patience: Duration) -> Result<u64, ReplayError> {
        let patience = u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX);
        let bound = self.clock.now_ns().saturating_add(patience);
        loop {
            pfe.drain();
            if trio.active_records() == 0 || self.clock.now_ns() >= bound {
                break;
            }
            let step = self.next_step(pfe, bound);
            self.clock.set(step);
            pfe.settle_timers();
        }
        let open = trio
            .active_blocks()
            .map_err(|e| engine_err(format!("reading the open blocks: {e}")))?;
        Ok(open.len() as u64)
    }
}

/// What a replay's report says of its input, before the run.
fn input_report(
    cfg: &ReplayConfig,
    format: &str,
    packets: &[InPacket],
    ports: &[Port],
) -> ReplayReport {
    let mut packets_in_by_port = BTreeMap::new();
    for &p in ports {
        *packets_in_by_port.entry(p).or_insert(0) += 1;
    }
    ReplayReport {
        program: cfg.program.name().to_string(),
        format: format.to_string(),
        packets_in: packets.len() as u64,
        packets_in_by_port,
        bytes_in: packets.iter().map(|p| p.data.len() as u64).sum(),
        truncated_in: packets
            .iter()
            .filter(|p| (p.data.len() as u64) < u64::from(p.orig_len))
            .count() as u64,
        ..ReplayReport::default()
    }
}

/// Replays the pcap capture read from `input` (named `name` in errors) through the program
/// of `cfg`, writing each output capture to the writer `open` returns for it (called once
/// per output, on first use, possibly from a PPE thread). See the module documentation.
/// [`ReplayReport::files`] is left empty.
pub fn replay<R: Read>(
    cfg: &ReplayConfig,
    input: R,
    name: &str,
    open: Opener,
) -> Result<ReplayReport, ReplayError> {
    replay_checked(cfg, input, name, open, || Ok(()), Pfe::start)
}

/// Starts a built engine: [`Pfe::start`], or a test's stand-in that fails it.
type StartFn<'a> = &'a mut dyn FnMut(&mut Pfe) -> Result<(), StartError>;

/// [`replay`], calling `checked` once the capture and the configuration have passed every
/// check (the engine built: PPE threads, routes, DIR-24-8 table, aggregation jobs) and the
/// engine has started (with `start`), before the first packet is injected: a refused
/// capture or setting, or an engine that cannot start (the system refused a thread), leaves
/// what `checked` would change (an earlier replay's outputs) as it was.
fn replay_checked<R: Read>(
    cfg: &ReplayConfig,
    input: R,
    name: &str,
    open: Opener,
    checked: impl FnOnce() -> Result<(), ReplayError>,
    mut start: impl FnMut(&mut Pfe) -> Result<(), StartError>,
) -> Result<ReplayReport, ReplayError> {
    let speed = speed_of(cfg.timing)?;
    let Capture { format, packets } = read_capture(input, name)?;
    let (ports, ports_needed) = ingress_ports(cfg, &packets)?;
    let base = packets.first().map_or(Duration::ZERO, |p| p.ts);
    Schedule::check(cfg.timing, &packets, base)?;
    let capture_clock = (cfg.timing == Timing::Capture).then(|| CaptureClock {
        clock: Arc::new(ManualClock::new()),
        base,
    });
    let sink = Arc::new(PcapSink {
        outputs: Mutex::new(Outputs {
            open,
            ports: BTreeMap::new(),
            dropped: None,
            error: None,
            start: Instant::now(),
        }),
        base,
        scale: speed,
        capture_clock: capture_clock.as_ref().map(|c| c.clock.clone()),
    });
    let Engine {
        mut pfe,
        aggregation,
    } = build_engine(cfg, sink.clone(), ports_needed.min(MAX_PORTS))?;
    // Every setting is checked by now (some only in building the engine), and the engine
    // runs: nothing can fail before the first injection any more but `checked` itself, and
    // an engine that nothing was injected into shuts down at once.
    start(&mut pfe).map_err(engine_err)?;
    if let Err(e) = checked() {
        pfe.shutdown();
        return Err(e);
    }

    let mut report = input_report(cfg, format, &packets, &ports);
    let start = Instant::now();
    sink.outputs.lock().start = start;
    let schedule = Schedule {
        timing: cfg.timing,
        base,
        speed,
        start,
    };
    // Aggregation keeps each block's generations in capture order (see the module docs).
    let barrier = aggregation
        .as_ref()
        .map(|(trio, _)| GenerationBarrier::new(trio.config().udp_port));
    // In capture time, whether the timers have nothing to do (see `CaptureClock`).
    let quiet = || {
        aggregation
            .as_ref()
            .is_none_or(|(trio, _)| trio.active_records() == 0 && trio.kept_records() == 0)
    };
    let result = if cfg.write_drops {
        // One packet at a time: in capture order already.
        replay_one_by_one(
            &pfe,
            &sink,
            &packets,
            &ports,
            &mut report,
            |p| match &capture_clock {
                Some(c) => c.advance_to(&pfe, c.reading(p.ts), &quiet),
                None => schedule.wait_for(p),
            },
        )
    } else if let Some(c) = &capture_clock {
        inject_in_capture_time(&pfe, &packets, &ports, c, barrier, &quiet)
    } else {
        inject(&pfe, &packets, &ports, &schedule, barrier)
    };
    // Aggregation: every block still open is waiting for a source that will not come; let
    // the straggler scan time it out, so its partial Result is written too.
    let result = result.and_then(|()| match &aggregation {
        Some((trio, a)) => {
            // Every block still open is missing a source: let it time out.
            let patience =
                Duration::from_millis(u64::from(a.block_exp_ms)) + Duration::from_secs(1);
            report.open_blocks = match &capture_clock {
                Some(c) => c.finish(&pfe, trio, patience)?,
                None => trio
                    .finish_open_blocks(&pfe, patience)
                    .map_err(|e| engine_err(format!("reading the open blocks: {e}")))?,
            };
            Ok(())
        }
        None => Ok(()),
    });
    pfe.drain();
    report.elapsed_s = start.elapsed().as_secs_f64();
    let stats = pfe.shutdown();
    result?;
    flush_outputs(&sink, &mut report)?;
    report.forwarded = stats.packets_out;
    report.consumed = stats.consumed;
    report.dropped = stats.dropped;
    report.created = stats.created;
    report.dropped_by_reason = stats.dropped_by_reason.clone();
    report.stats = stats;
    Ok(report)
}

/// Injects every packet on its port as `schedule` says: as fast as possible in bursts of up
/// to [`BURST`] frames, cut (and the engine drained) where `barrier` says a packet must
/// wait; or each at its time, the engine drained first where it must wait.
fn inject(
    pfe: &Pfe,
    packets: &[InPacket],
    ports: &[Port],
    schedule: &Schedule,
    mut barrier: Option<GenerationBarrier>,
) -> Result<(), ReplayError> {
    let mut must_wait = |p: &InPacket| barrier.as_mut().is_some_and(|b| b.must_wait(&p.data));
    match schedule.timing {
        Timing::AsFast => {
            let inject = |range: std::ops::Range<usize>| {
                pfe.inject_burst(
                    ports[range.clone()]
                        .iter()
                        .zip(&packets[range])
                        .map(|(&port, p)| (port, p.data.as_slice())),
                )
                .map(|_| ())
                .map_err(engine_err)
            };
            // Bursts of up to BURST frames, cut where a packet must wait.
            let mut from = 0;
            for (i, p) in packets.iter().enumerate() {
                let wait = must_wait(p);
                if wait || i - from == BURST {
                    inject(from..i)?;
                    if wait {
                        pfe.drain();
                    }
                    from = i;
                }
            }
            inject(from..packets.len())
        }
        // Capture time goes through `inject_in_capture_time`; here it would inject at once.
        Timing::Recorded { .. } | Timing::Capture => {
            packets.iter().zip(ports).try_for_each(|(p, &port)| {
                schedule.wait_for(p);
                if must_wait(p) {
                    pfe.drain();
                }
                pfe.inject_frame(port, &p.data).map_err(engine_err)
            })
        }
    }
}

/// Injects every packet in capture time: the clock moved to its timestamp first
/// ([`CaptureClock::advance_to`], which drains the engine before it moves), the engine
/// drained first where `barrier` says the packet must wait.
fn inject_in_capture_time(
    pfe: &Pfe,
    packets: &[InPacket],
    ports: &[Port],
    clock: &CaptureClock,
    mut barrier: Option<GenerationBarrier>,
    quiet: &dyn Fn() -> bool,
) -> Result<(), ReplayError> {
    packets.iter().zip(ports).try_for_each(|(p, &port)| {
        clock.advance_to(pfe, clock.reading(p.ts), quiet);
        if barrier.as_mut().is_some_and(|b| b.must_wait(&p.data)) {
            pfe.drain();
        }
        pfe.inject_frame(port, &p.data).map_err(engine_err)
    })
}

/// Ends the outputs after the run: the first error a write met, or each capture flushed
/// and counted in `report`.
fn flush_outputs(sink: &PcapSink, report: &mut ReplayReport) -> Result<(), ReplayError> {
    let mut o = sink.outputs.lock();
    if let Some(e) = o.error.take() {
        return Err(e);
    }
    for (p, (w, n)) in std::mem::take(&mut o.ports) {
        w.into_writer()
            .flush()
            .map_err(|e| write_err(Output::Port(p), e))?;
        report.packets_out_by_port.insert(p, n);
    }
    if let Some(w) = o.dropped.take() {
        w.into_writer()
            .flush()
            .map_err(|e| write_err(Output::Dropped, e))?;
    }
    Ok(())
}

/// The exact mode: one packet in flight at a time, its fate read from the counters.
fn replay_one_by_one(
    pfe: &Pfe,
    sink: &PcapSink,
    packets: &[InPacket],
    ports: &[Port],
    report: &mut ReplayReport,
    mut wait: impl FnMut(&InPacket),
) -> Result<(), ReplayError> {
    let mut before = pfe.stats();
    for (i, (p, &port)) in packets.iter().zip(ports).enumerate() {
        wait(p);
        pfe.inject_frame(port, &p.data).map_err(engine_err)?;
        pfe.drain();
        let after = pfe.stats();
        if after.dropped > before.dropped {
            let reason = after
                .dropped_by_reason
                .iter()
                .filter(|(k, &n)| n > before.drops(k))
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join("+");
            report.drops.push(DroppedPacket {
                index: i as u64,
                port,
                reason,
            });
            let mut o = sink.outputs.lock();
            if o.dropped.is_none() {
                let w = o.open(Output::Dropped)?;
                o.dropped = Some(w);
            }
            if let Some(w) = o.dropped.as_mut() {
                let pkt = PcapPacket::new(p.ts, p.orig_len, &p.data);
                w.write_packet(&pkt)
                    .map_err(|e| write_err(Output::Dropped, e))?;
            }
        }
        before = after;
    }
    Ok(())
}

/// Replays the capture at `pcap` (see [`replay`]) and writes `out_dir/port<N>.pcap` for
/// every port that sent anything and, with [`ReplayConfig::write_drops`],
/// `out_dir/dropped.pcap` (when anything was dropped). Creates `out_dir` if needed.
/// Output captures of an earlier replay into `out_dir` (files named `port<N>.pcap` and
/// `dropped.pcap`) are removed once the capture and the settings have passed their checks
/// and the engine has started, so the directory holds this replay's outputs only; other
/// files are left alone. A capture or a setting refused, or an engine that cannot start
/// (the system refused one of its threads), leaves the directory as it was.
pub fn replay_file(
    cfg: &ReplayConfig,
    pcap: &Path,
    out_dir: &Path,
) -> Result<ReplayReport, ReplayError> {
    replay_file_with(cfg, pcap, out_dir, &mut Pfe::start)
}

/// [`replay_file`], the engine started by `start`.
fn replay_file_with(
    cfg: &ReplayConfig,
    pcap: &Path,
    out_dir: &Path,
    start: StartFn<'_>,
) -> Result<ReplayReport, ReplayError> {
    let name = pcap.display().to_string();
    let file = std::fs::File::open(pcap).map_err(|source| ReplayError::Read {
        file: name.clone(),
        source,
    })?;
    // Only once the capture and the settings passed their checks and the engine runs: a
    // bad capture or setting, or an engine that cannot start, leaves the directory as it
    // was.
    let prepare = || {
        std::fs::create_dir_all(out_dir).map_err(|e| ReplayError::Write {
            output: out_dir.display().to_string(),
            reason: format!("cannot create the output directory: {e}"),
        })?;
        remove_stale_outputs(out_dir)
    };
    let created = Arc::new(Mutex::new(Vec::new()));
    let dir = out_dir.to_path_buf();
    let log = created.clone();
    let open: Opener = Box::new(move |out: Output| {
        let path = dir.join(out.file_name());
        let f = std::fs::File::create(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        log.lock().push(path);
        Ok(Box::new(io::BufWriter::new(f)) as Box<dyn Write + Send>)
    });
    let mut report = replay_checked(cfg, io::BufReader::new(file), &name, open, prepare, start)?;
    let mut files = std::mem::take(&mut *created.lock());
    files.sort();
    report.files = files;
    Ok(report)
}

/// Removes `port<N>.pcap` and `dropped.pcap` from `dir`.
fn remove_stale_outputs(dir: &Path) -> Result<(), ReplayError> {
    let err = |e: io::Error| ReplayError::Write {
        output: dir.display().to_string(),
        reason: format!("cannot clear earlier outputs: {e}"),
    };
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ours = name == "dropped.pcap"
            || name
                .strip_prefix("port")
                .and_then(|r| r.strip_suffix(".pcap"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if ours && entry.file_type().map_err(err)?.is_file() {
            std::fs::remove_file(entry.path()).map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine that cannot start (here the system refuses its second PPE thread, as it
    /// does without memory for a stack or over a thread limit) fails the replay, naming the
    /// thread, and leaves the earlier replay's outputs as they were: they used to be
    /// removed before the engine started, so a replay that never ran lost them.
    #[test]
    fn a_replay_whose_engine_cannot_start_leaves_the_earlier_outputs() {
        let dir =
            std::env::temp_dir().join(format!("pfemu-replay-start-error-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let mut w = PcapWriter::new(Vec::new()).expect("pcap writer");
        for i in 0..4u8 {
            let f = crate::microcode::l3fwd::udp_frame([10, 0, 0, i], 64, 64);
            let ts = Duration::from_secs(1000) + Duration::from_millis(u64::from(i));
            w.write_packet(&PcapPacket::new(ts, f.len() as u32, &f))
                .expect("packet");
        }
        let pcap = dir.join("in.pcap");
        std::fs::write(&pcap, w.into_writer()).expect("capture");
        let out = dir.join("out");
        let cfg = ReplayConfig {
            ppe_threads: 2,
            ..ReplayConfig::default()
        };
        let first = replay_file(&cfg, &pcap, &out).expect("the first replay");
        assert!(!first.files.is_empty(), "the first replay wrote outputs");
        let before: Vec<(PathBuf, Vec<u8>)> = (first.files.iter())
            .map(|f| (f.clone(), std::fs::read(f).expect("an output")))
            .collect();
        let mut spawned = 0;
        let mut refuse_second = |pfe: &mut Pfe| {
            pfe.start_with(&mut |builder: std::thread::Builder, body| {
                spawned += 1;
                if spawned > 1 {
                    Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        "Resource temporarily unavailable",
                    ))
                } else {
                    builder.spawn(body)
                }
            })
        };
        let e = replay_file_with(&cfg, &pcap, &out, &mut refuse_second)
            .expect_err("the engine cannot start")
            .to_string();
        assert!(e.contains("cannot spawn thread pfemu-ppe-1"), "{e}");
        for (f, content) in &before {
            assert!(
                std::fs::read(f).ok().as_ref() == Some(content),
                "{} is as the first replay left it",
                f.display()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pcapng_timestamps_follow_if_tsresol() {
        let s = Duration::from_secs_f64;
        // Absent: microseconds (the default the reader passes).
        assert_eq!(pcapng_time(1_500_000, 6), s(1.5));
        assert_eq!(pcapng_time(1_500_000_001, 9), Duration::new(1, 500_000_001));
        assert_eq!(pcapng_time(15, 1), s(1.5));
        assert_eq!(pcapng_time(7, 0), s(7.0));
        // Powers of two: 2^-1 and 2^-10 s.
        assert_eq!(pcapng_time(3, 0x81), s(1.5));
        assert_eq!(pcapng_time(1024 + 512, 0x8A), s(1.5));
        // Finer than nanoseconds: truncated.
        assert_eq!(pcapng_time(1_999, 12), Duration::from_nanos(1));
        assert_eq!(pcapng_time(u64::MAX, 0x80 | 127), Duration::ZERO);
        assert_eq!(pcapng_time(u64::MAX, 127), Duration::ZERO);
        assert_eq!(pcapng_time(u64::MAX, 0), Duration::from_secs(u64::MAX));
    }
}
