//! Linux interfaces as PFE ports: what arrives on an interface enters the engine on its
//! port, and what the engine sends out of a port leaves on its interface, so real hosts
//! (network namespaces, VMs, containers) talk through a running [`Pfe`] as they would
//! through bmv2's `simple_switch -i 0@veth0`.
//!
//! ```text
//!  interface --kernel--> TPACKET_V3 ring (mmap) --RX thread: parse block, complete
//!     ^                   offloaded checksums, put VLAN tags back--> Pfe::inject_burst(port)
//!     |                                                                   |
//!     +-- sendmmsg (one call per burst) <-- PortSink::deliver(port) <-- egress (PPE threads)
//! ```
//!
//! - [`LivePorts::open`] binds each [`PortSpec`]: an **interface** (`0=veth0`) gets an
//!   AF_PACKET socket, promiscuous, bound to it alone (protocol 0 until the ring exists,
//!   so no frame of another interface gets in), with a memory-mapped `TPACKET_V3`
//!   receive ring ([`RingConfig`]) and `PACKET_IGNORE_OUTGOING` (a port receives what
//!   arrives, not what the engine or the host sends), and a second socket bound to it to
//!   send, which receives nothing; a **TAP** port (`2=tap0`) opens (or
//!   creates) the TAP device and brings it up, for a port on the host's own stack.
//! - [`LivePorts::sink`] is the egress side, a [`Sink`] to build the engine with: each
//!   burst the engine hands a port is sent from the PPE thread that released it, with
//!   one `sendmmsg` per up to 64 frames, the kernel reading the frames where the engine
//!   holds them (TAP: one `write` per frame). sendmmsg rather than a TX ring: the engine
//!   already hands bursts per port, so a ring saves no system call (a ring still needs a
//!   `send` to kick it) but adds a copy into the ring and shared-memory bookkeeping.
//! - [`LivePorts::start`] starts one RX thread per port, which waits in `poll` for the
//!   kernel to hand over a block (full, or after [`RingConfig::block_timeout_ms`]) and
//!   injects its frames in one burst. When the engine is full the thread waits, the ring
//!   fills up, and the kernel drops and counts (`PACKET_STATISTICS`), as a NIC's RX ring
//!   overflows.
//!
//! # Threads and parameters
//!
//! One RX thread per port (`pfemu-rx<port>`), nothing else: transmission runs on the PPE
//! thread that releases a burst (with reordering on, the engine serialises these calls),
//! so no queue or copy sits between egress and the socket; a send that finds the socket's
//! buffer full waits, which is backpressure on the engine, for at most [`SEND_TIMEOUT`].
//! The ring defaults to 64 blocks of 256 KiB (16 MiB per port, about 100 000 small frames)
//! with a 1 ms block timeout: big blocks amortise the handover at load, and the timeout
//! bounds what a lone frame (a ping) waits. An RX thread looks at the stop flag before every
//! block (or TAP burst) it takes, and every [`PortsConfig::poll_ms`] (20 ms) while idle. Once
//! it is up, an interface port's thread first stops the kernel's delivery to its socket (a
//! classic BPF filter that takes no frame, then a rebinding that waits for the frames on
//! their way in), so nothing more enters the ring however fast frames keep arriving, and
//! then takes every frame the ring holds (the kernel's count says how many), the block in
//! progress included: the kernel's count is final, and every frame in it is taken or counted
//! as dropped. A TAP port's thread likewise first makes its device refuse every frame the
//! host sends (a filter that takes none, which the device runs before its queue, dropping
//! and counting a refused frame in its own `tx_dropped`), then takes what the queue holds.
//!
//! # Nothing silently lost
//!
//! Every frame the kernel hands a port (`rx_kernel_frames`) is counted once somewhere
//! ([`PortStats`], [`PortStats::rx_accounted`]): received and injected (`rx_frames`,
//! which add up to the engine's `packets_in`), dropped by the kernel because the ring was
//! full (`rx_kernel_drops`), cut short by the ring (`rx_truncated`: longer than a block),
//! in a block that did not parse (`rx_bad_block_frames`), or still in the ring (or a TAP
//! device's queue) when the port stopped (`rx_unread`). The kernel's count is the kernel's
//! own: an interface socket's `PACKET_STATISTICS`, a TAP device's statistics (frames read
//! from it, `tx_packets`, and those it dropped, `tx_dropped`), so the identity compares
//! two counts kept apart. A stopped port takes no more frames (they arrive at the
//! interface, and the host counts them there; a TAP device drops them and counts them in
//! its `tx_dropped`), so the counts of [`RunningPorts::stop`] are final although the socket
//! (or device) stays open, for sending, until the engine shuts down. Out: sent
//! (`tx_frames`), refused by the kernel (`tx_errors`, by error: `EMSGSIZE` for a frame
//! longer than the interface's MTU, `ENETDOWN`, `ENOBUFS`, ...), taken by the kernel and
//! then dropped by the interface without a word to the sender because it had no carrier
//! (`tx_kernel_drops`: the interface's own count, as a TAP port's receive count is its
//! device's), and frames for a port no interface is bound to
//! ([`PortsReport::tx_unbound`]).
//!
//! An interface going down is one receive error (`rx_errors`): the kernel reports it to
//! the port's receiving socket (`SO_ERROR`), which only the RX thread (and the stop) reads.
//! The port sends through a socket of its own, to which the kernel reports nothing, so a
//! send fails for its own reason only (`ENETDOWN` while the interface is down), never with
//! a report left over from an interface that went down and came back.
//!
//! # Frames as a wire carries them
//!
//! A virtual interface can hand over frames whose sender left work to a NIC that does not
//! exist ([`fix`]): TCP/UDP checksums still to be summed (completed here, counted in
//! `rx_checksums_completed`) and VLAN tags taken out (put back, `rx_vlan_restored`).
//! Segmentation offload cannot be undone here: a host that sends TCP through a veth with
//! TSO on hands over frames of up to 64 KB. Those longer than the engine takes
//! ([`crate::pfe::DEFAULT_MAX_FRAME_BYTES`], 9216 bytes, by default) are dropped as they
//! arrive (`oversize` among the engine's drops, with a warning in the live report); the
//! shorter ones that exceed the MTU of the interface they leave by are refused there
//! (`EMSGSIZE` transmit errors, with a warning). Turn it off on the hosts' interfaces
//! (`ip link set dev X gso_max_segs 1`, or `ethtool -K X tso off gso off`).
//!
//! All unsafe code (sockets, the ring's mapping and handover, ioctls) is in `ports/sys.rs`; the
//! ring's blocks are read by the safe [`ring::parse_block`].

pub mod fix;
pub mod ring;
mod sys;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use serde::Serialize;

use crate::error::ConfigError;
use crate::packet::Port;
use crate::pfe::{Frames, Pfe, Sink};

use self::ring::{parse_block, RxFrame, PACKET_OUTGOING};
use self::sys::{PacketSocket, RingLayout, RxRing, Tap};

/// The longest a PPE thread waits for room in a port's send buffer; frames that find none
/// by then are counted as `EAGAIN` transmit errors.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// What a port is bound to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "lowercase")]
pub enum PortKind {
    /// An existing interface (veth, a NIC, ...), through an AF_PACKET socket.
    Interface(String),
    /// A TAP device, created if it does not exist.
    Tap(String),
}

impl PortKind {
    /// The interface's name.
    pub fn name(&self) -> &str {
        match self {
            PortKind::Interface(n) | PortKind::Tap(n) => n,
        }
    }
}

impl fmt::Display for PortKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortKind::Interface(n) => write!(f, "interface {n}"),
            PortKind::Tap(n) => write!(f, "TAP {n}"),
        }
    }
}

/// A PFE port and what it is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// The PFE port.
    pub port: Port,
    /// Its interface.
    pub kind: PortKind,
}

impl PortSpec {
    /// `PORT=NAME` as a port bound to interface `NAME` (`--iface 0=veth0`).
    pub fn interface(s: &str) -> Result<PortSpec, ConfigError> {
        let (port, name) = split_spec(s, "iface")?;
        Ok(PortSpec {
            port,
            kind: PortKind::Interface(name),
        })
    }

    /// `PORT=NAME` as a port bound to TAP device `NAME` (`--tap 2=tap0`).
    pub fn tap(s: &str) -> Result<PortSpec, ConfigError> {
        let (port, name) = split_spec(s, "tap")?;
        Ok(PortSpec {
            port,
            kind: PortKind::Tap(name),
        })
    }
}

impl FromStr for PortSpec {
    type Err = ConfigError;

    /// `PORT=NAME`: an interface ([`PortSpec::interface`]).
    fn from_str(s: &str) -> Result<PortSpec, ConfigError> {
        PortSpec::interface(s)
    }
}

fn split_spec(s: &str, setting: &'static str) -> Result<(Port, String), ConfigError> {
    let bad = |why: String| {
        ConfigError::new(
            setting,
            format!("`{s}`: {why} (expected PORT=NAME, e.g. 0=veth0)"),
        )
    };
    let (port, name) = s.split_once('=').ok_or_else(|| bad("no `=`".into()))?;
    let port: Port = port
        .trim()
        .parse()
        .map_err(|_| bad(format!("port `{port}` is not a number from 0 to 65535")))?;
    let name = name.trim();
    sys::check_ifname(name).map_err(bad)?;
    Ok((port, name.to_string()))
}

/// The receive ring of an interface port (`TPACKET_V3`): `blocks` blocks of
/// `block_bytes`, each handed to the RX thread when full or `block_timeout_ms` after its
/// first frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RingConfig {
    /// Bytes per block: a multiple of 4096 and of `frame_bytes`; a frame longer than a
    /// block (less its headers) is cut and counted as `rx_truncated`.
    pub block_bytes: u32,
    /// Blocks in the ring (the ring holds `block_bytes * blocks`).
    pub blocks: u32,
    /// The kernel's frame size (V3 packs frames at their own length; this only sizes its
    /// frame count).
    pub frame_bytes: u32,
    /// Milliseconds after which a block that is not full is handed over (the latency a
    /// lone frame waits at most; 1 is the smallest).
    pub block_timeout_ms: u32,
}

impl Default for RingConfig {
    /// 64 blocks of 256 KiB (16 MiB: about 100 000 64-byte frames, or 10 000 1500-byte
    /// ones), 2048-byte frames, blocks handed over after 1 ms.
    fn default() -> Self {
        RingConfig {
            block_bytes: 256 * 1024,
            blocks: 64,
            frame_bytes: 2048,
            block_timeout_ms: 1,
        }
    }
}

impl RingConfig {
    /// Checks the layout, naming the setting at fault.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.block_bytes < 4096
            || !self.block_bytes.is_multiple_of(4096)
            || self.block_bytes > 1 << 26
        {
            return Err(ConfigError::new(
                "ring_block_bytes",
                format!(
                    "{}: a multiple of 4096 from 4096 to 64 MiB",
                    self.block_bytes
                ),
            ));
        }
        if self.frame_bytes < 128 || !self.block_bytes.is_multiple_of(self.frame_bytes) {
            return Err(ConfigError::new(
                "ring_frame_bytes",
                format!(
                    "{}: at least 128 and a divisor of the block size {}",
                    self.frame_bytes, self.block_bytes
                ),
            ));
        }
        if self.blocks == 0 || u64::from(self.blocks) * u64::from(self.block_bytes) > 1 << 32 {
            return Err(ConfigError::new(
                "ring_blocks",
                format!("{}: at least 1, and the ring at most 4 GiB", self.blocks),
            ));
        }
        if !(1..=1000).contains(&self.block_timeout_ms) {
            return Err(ConfigError::new(
                "ring_block_timeout_ms",
                format!("{}: from 1 to 1000 ms", self.block_timeout_ms),
            ));
        }
        Ok(())
    }

    fn layout(&self) -> RingLayout {
        RingLayout {
            block_bytes: self.block_bytes,
            blocks: self.blocks,
            frame_bytes: self.frame_bytes,
            block_timeout_ms: self.block_timeout_ms,
        }
    }
}

/// The ports to bind and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortsConfig {
    /// The ports (at least one; each port and each interface once).
    pub ports: Vec<PortSpec>,
    /// The receive ring of each interface port.
    pub ring: RingConfig,
    /// How long an idle RX thread waits in `poll` before it looks at the stop flag again,
    /// ms (how long [`RunningPorts::stop`] may wait for an idle port).
    pub poll_ms: u32,
    /// Send buffer of each interface's socket, bytes (a full buffer makes the PPE thread
    /// sending wait, as a full TX queue backs up a NIC).
    pub send_buffer_bytes: usize,
}

impl PortsConfig {
    /// `ports` with the default ring, a 20 ms poll and a 4 MiB send buffer.
    pub fn new(ports: Vec<PortSpec>) -> Self {
        PortsConfig {
            ports,
            ring: RingConfig::default(),
            poll_ms: 20,
            send_buffer_bytes: 4 << 20,
        }
    }
}

/// Why the ports could not be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum PortError {
    /// A setting was refused.
    Config(ConfigError),
    /// The interface does not exist.
    NoSuchInterface {
        /// The port.
        port: Port,
        /// The interface.
        name: String,
    },
    /// The process may not open the port (AF_PACKET and TAP need `CAP_NET_RAW` /
    /// `CAP_NET_ADMIN`: root).
    Permission {
        /// The port.
        port: Port,
        /// What it is bound to.
        kind: PortKind,
        /// What was refused.
        what: String,
    },
    /// Another system call failed.
    Io {
        /// The port.
        port: Port,
        /// What it is bound to.
        kind: PortKind,
        /// The error, with what was being done.
        source: io::Error,
    },
}

impl fmt::Display for PortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortError::Config(e) => e.fmt(f),
            PortError::NoSuchInterface { port, name } => write!(
                f,
                "port {port}: interface `{name}` does not exist (`ip link show` lists them; \
                 a veth pair: `ip link add {name} type veth peer name {name}p`)"
            ),
            PortError::Permission { port, kind, what } => write!(
                f,
                "port {port}: {kind}: permission denied ({what}); binding an interface needs \
                 CAP_NET_RAW and a TAP device CAP_NET_ADMIN: run as root (or `setcap \
                 cap_net_raw,cap_net_admin+ep` on the binary)"
            ),
            PortError::Io { port, kind, source } => write!(f, "port {port}: {kind}: {source}"),
        }
    }
}

impl std::error::Error for PortError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PortError::Config(e) => Some(e),
            PortError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<ConfigError> for PortError {
    fn from(e: ConfigError) -> Self {
        PortError::Config(e)
    }
}

/// One port's counters, shared by its RX thread, the sink (PPE threads) and readers.
#[derive(Debug, Default)]
struct Counters {
    rx_frames: CachePadded<AtomicU64>,
    rx_bytes: AtomicU64,
    rx_outgoing: AtomicU64,
    rx_truncated: AtomicU64,
    rx_checksums_completed: AtomicU64,
    rx_checksums_left: AtomicU64,
    rx_vlan_restored: AtomicU64,
    rx_bad_blocks: AtomicU64,
    rx_bad_block_frames: AtomicU64,
    rx_engine_stopped: AtomicU64,
    rx_errors: AtomicU64,
    /// Frames the RX thread took from the ring, whatever became of them.
    rx_seen: AtomicU64,
    /// Frames left untaken at the stop (set once, by [`RunningPorts::stop`]).
    rx_unread: AtomicU64,
    /// Whether the kernel's delivery to the port was stopped ([`Bound::stop_delivery`]).
    rx_closed: AtomicBool,
    /// Frames the kernel took from the port's sends (`tx_frames` and `tx_kernel_drops`).
    tx_frames: CachePadded<AtomicU64>,
    tx_bytes: AtomicU64,
    /// The interface's drops since the port opened as last read ([`Bound::tx_kernel_drops`]),
    /// kept for when they can no longer be read (the interface was deleted).
    tx_kernel_drops: AtomicU64,
    tx_errors: Mutex<BTreeMap<String, u64>>,
    /// `PACKET_STATISTICS`, accumulated (each read resets the kernel's).
    kernel: Mutex<sys::KernelStats>,
    /// A TAP port's device counts at the stop ([`Bound::freeze`]), which its counters
    /// keep from then on.
    tap_final: Mutex<Option<TapCounts>>,
    /// The last receive error, for the report.
    last_error: Mutex<Option<String>>,
}

impl Counters {
    fn tx_failed(&self, e: &io::Error) {
        let name = errno_name(e);
        *self.tx_errors.lock().entry(name).or_insert(0) += 1;
    }

    fn rx_error(&self, what: String) {
        self.rx_errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(what);
    }
}

/// A short name of an I/O error for counters (`EMSGSIZE`, `ENETDOWN`, ...).
fn errno_name(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EMSGSIZE) => "EMSGSIZE",
        Some(libc::ENETDOWN) => "ENETDOWN",
        Some(libc::ENOBUFS) => "ENOBUFS",
        Some(libc::EAGAIN) => "EAGAIN",
        Some(libc::ENXIO) => "ENXIO",
        Some(libc::ENODEV) => "ENODEV",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::EIO) => "EIO",
        Some(libc::EPERM) => "EPERM",
        Some(libc::EFAULT) => "EFAULT",
        Some(n) => return format!("errno {n}"),
        None => return e.kind().to_string(),
    };
    name.to_string()
}

/// A port's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PortStats {
    /// The PFE port.
    pub port: Port,
    /// What it is bound to.
    pub binding: Option<PortKind>,
    /// Frames injected into the engine.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames the kernel handed to the port: an interface's `PACKET_STATISTICS`
    /// `tp_packets` (the frames it stored in the ring and those it dropped because the ring
    /// was full); a TAP device's own statistics since the port opened, `tx_packets` (the
    /// frames read from it: the kernel counts each as it hands it to a read, and the port
    /// is the device's only reader) plus `tx_dropped` ([`PortStats::rx_kernel_drops`]). Once
    /// the port has stopped, every one of them is in exactly one other counter:
    /// `rx_frames + rx_dropped() + rx_outgoing_skipped` ([`PortStats::rx_accounted`]). A
    /// stopped port takes no more frames, so this count does not grow after
    /// [`RunningPorts::stop`]. A TAP device whose statistics cannot be read (`/sys` of
    /// another network namespace; a warning says so at the open) or that was deleted: the
    /// frames the port read, and then the identity checks nothing.
    pub rx_kernel_frames: u64,
    /// Frames dropped by the kernel because the receive ring was full (`PACKET_STATISTICS`
    /// `tp_drops`). A TAP port: the device's `tx_dropped` up to the stop (its queue was
    /// full; at the stop also the frames its filter refused until the count was read,
    /// which then stays as it was: the device counts what it refuses after the stop, not
    /// the port).
    pub rx_kernel_drops: u64,
    /// Times the ring was full (`tp_freeze_q_cnt`).
    pub rx_ring_full_events: u64,
    /// Frames longer than a ring block, cut by the kernel and dropped here.
    pub rx_truncated: u64,
    /// Frames of blocks that did not parse (dropped; should never happen).
    pub rx_bad_block_frames: u64,
    /// Blocks that did not parse.
    pub rx_bad_blocks: u64,
    /// Frames the interface sent, seen on a kernel without `PACKET_IGNORE_OUTGOING`
    /// (before 4.20) and skipped: not received traffic.
    pub rx_outgoing_skipped: u64,
    /// Frames the RX thread could not inject because the engine had stopped.
    pub rx_engine_stopped: u64,
    /// Frames the kernel had handed to the port and that were not taken when it stopped
    /// (counted at [`RunningPorts::stop`] only: a running ring always holds some). An
    /// interface port takes everything its ring holds at the stop, so this stays 0 unless
    /// the kernel failed to hand over a block in time; a TAP port likewise takes everything
    /// its device's queue holds at the stop, and this counts frames left in it (read and
    /// discarded then) when its RX thread ended early or the device could not be made to
    /// refuse frames.
    pub rx_unread: u64,
    /// Frames whose offloaded TCP/UDP checksum was completed.
    pub rx_checksums_completed: u64,
    /// Frames with an offloaded checksum that could not be completed (not TCP/UDP over
    /// IPv4 or plain IPv6), injected as they were.
    pub rx_checksums_left: u64,
    /// Frames whose VLAN tag the kernel had taken out and that got it back.
    pub rx_vlan_restored: u64,
    /// Receive errors (the socket's pending error, a failed read). A TAP port whose read
    /// or poll fails (its device was deleted) counts one, warns, and receives no more.
    pub rx_errors: u64,
    /// The last receive error.
    pub last_rx_error: Option<String>,
    /// Frames sent out of the interface: those the kernel took from the port's sends,
    /// less [`PortStats::tx_kernel_drops`] (both read one after the other: exact while the
    /// engine sends nothing to the port).
    pub tx_frames: u64,
    /// The bytes the kernel took from the port's sends (the interface's drop count has no
    /// bytes: `tx_kernel_drops` frames' bytes are in it too).
    pub tx_bytes: u64,
    /// Frames the kernel refused, by error.
    pub tx_errors: BTreeMap<String, u64>,
    /// Frames the kernel took from the port's sends and the interface then dropped without
    /// telling the sender: it had no carrier (a veth whose peer is down or has just come
    /// up, a NIC without a link), so the kernel's queueing layer dropped them. The
    /// interface's own count since the port opened (`/sys/class/net/NAME/statistics/
    /// tx_dropped`) less the frames the port saw refused with `ENOBUFS`, which a veth
    /// counts there too (its peer's backlog was full). Exact when the port is the
    /// interface's only sender, as it is its only receiver: what else sends on the
    /// interface and is dropped is counted too (but never more than the frames the kernel
    /// took from the port); an interface whose queueing discipline
    /// refuses frames with `ENOBUFS` (it does not count those there) makes this low by as
    /// many when both happen. 0 for a TAP port, whose writes fail rather than drop, and
    /// when the interface's statistics cannot be read (a warning says so at the open).
    pub tx_kernel_drops: u64,
}

impl PortStats {
    /// Whether every frame the kernel handed to the port is in one of its counters: taken
    /// (injected, skipped as outgoing) or dropped ([`PortStats::rx_dropped`]). Exact once
    /// the port has stopped; while it runs, the counters are read one after another.
    pub fn rx_accounted(&self) -> bool {
        self.rx_kernel_frames == self.rx_frames + self.rx_dropped() + self.rx_outgoing_skipped
    }

    /// Frames that arrived and were lost before the engine: kernel drops, cut frames, bad
    /// blocks, frames offered to a stopped engine, frames left unread.
    pub fn rx_dropped(&self) -> u64 {
        self.rx_kernel_drops
            + self.rx_truncated
            + self.rx_bad_block_frames
            + self.rx_engine_stopped
            + self.rx_unread
    }

    /// Frames the engine sent out of the port that did not leave it: refused by the
    /// kernel (`tx_errors`) or dropped by the interface (`tx_kernel_drops`).
    pub fn tx_dropped(&self) -> u64 {
        self.tx_errors.values().sum::<u64>() + self.tx_kernel_drops
    }
}

/// Every port's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PortsReport {
    /// Per port, in port order.
    pub ports: Vec<PortStats>,
    /// Frames the engine sent to a port below the highest bound one that no interface is
    /// bound to (dropped).
    pub tx_unbound: u64,
    /// Things the user should know (an interface that is down, a kernel without
    /// `PACKET_IGNORE_OUTGOING`, frames larger than an MTU, ...).
    pub warnings: Vec<String>,
}

impl PortsReport {
    /// Frames injected over all ports (the engine's `packets_in` counts the same frames).
    pub fn rx_frames(&self) -> u64 {
        self.ports.iter().map(|p| p.rx_frames).sum()
    }

    /// Whether every port accounts for every frame the kernel handed it
    /// ([`PortStats::rx_accounted`]; exact once the ports have stopped).
    pub fn rx_accounted(&self) -> bool {
        self.ports.iter().all(PortStats::rx_accounted)
    }

    /// Frames lost on reception over all ports ([`PortStats::rx_dropped`]).
    pub fn rx_dropped(&self) -> u64 {
        self.ports.iter().map(PortStats::rx_dropped).sum()
    }

    /// Frames sent over all ports.
    pub fn tx_frames(&self) -> u64 {
        self.ports.iter().map(|p| p.tx_frames).sum()
    }

    /// Frames lost on transmission: refused by the kernel, or for unbound ports.
    pub fn tx_dropped(&self) -> u64 {
        self.ports.iter().map(PortStats::tx_dropped).sum::<u64>() + self.tx_unbound
    }
}

/// How a port does its I/O.
#[derive(Debug)]
enum PortIo {
    /// An interface: a socket that receives (the ring's, which alone owns the kernel's
    /// error reports: `SO_ERROR`) and one that sends, which the kernel never gives an
    /// error to report ([`PacketSocket::bind_sender`]).
    Packet {
        rx: PacketSocket,
        tx: PacketSocket,
    },
    Tap(Tap),
}

/// One bound port.
#[derive(Debug)]
struct Bound {
    port: Port,
    kind: PortKind,
    /// The interface's (or TAP device's) index.
    ifindex: i32,
    io: PortIo,
    /// A TAP device's counts when the port opened (`None` for an interface, or when they
    /// cannot be read).
    tap_base: Option<TapCounts>,
    /// An interface's `tx_dropped` when the port opened (`None` for a TAP device, or when
    /// it cannot be read).
    tx_dropped_base: Option<u64>,
    counters: Counters,
}

impl Bound {
    /// The kernel's receive statistics since the port opened: reads (and so resets) the
    /// kernel's, adding them to those read before, under the lock so that no reader sees
    /// a read not yet added.
    fn kernel_stats(&self) -> sys::KernelStats {
        let mut acc = self.counters.kernel.lock();
        if let PortIo::Packet { rx, .. } = &self.io {
            match rx.take_stats() {
                Ok(k) => {
                    acc.packets += k.packets;
                    acc.drops += k.drops;
                    acc.freezes += k.freezes;
                }
                // The kernel's counts are then short of what it handed the port, which the
                // accounting would show unexplained: the error says why.
                Err(e) => self
                    .counters
                    .rx_error(format!("reading the kernel's receive statistics: {e}")),
            }
        }
        *acc
    }

    /// Stops the kernel's delivery of frames to the port, once: an interface port's
    /// socket ([`PacketSocket::stop_receiving`]), a TAP device ([`Tap::stop_receiving`]);
    /// a warning says so when it cannot.
    fn stop_delivery(&self, warnings: &Mutex<Vec<String>>) {
        if self.counters.rx_closed.swap(true, Ordering::Relaxed) {
            return;
        }
        let sock = match &self.io {
            PortIo::Packet { rx, .. } => rx,
            PortIo::Tap(tap) => {
                if let Err(e) = tap.stop_receiving(self.ifindex) {
                    // The queue keeps filling: the stop reads and discards a queue's worth
                    // (`rx_unread`), but what the host sends after waits in it, in no
                    // counter.
                    warnings.lock().push(format!(
                        "port {}: {}: could not make the device refuse frames at the stop \
                         ({e}): frames the host sends after the stop may be in no counter",
                        self.port, self.kind
                    ));
                }
                return;
            }
        };
        // The port sends through another socket, which the rebinding leaves as it is.
        match sock.stop_receiving(self.ifindex) {
            // Errors the socket had pending when the stop came: real, and counted as the
            // RX thread would have.
            Ok(pending) => {
                for e in pending {
                    self.counters.rx_error(e.to_string());
                }
            }
            Err(e) => {
                // Without the filter the ring keeps filling: what arrives until the stop's
                // count is counted as unread, but frames arriving after it are in no
                // counter.
                warnings.lock().push(format!(
                    "port {}: {}: could not stop the kernel's delivery at the stop ({e}): \
                     frames arriving until the port closes may be in no counter",
                    self.port, self.kind
                ));
            }
        }
    }

    /// The counters now; polls the kernel's receive statistics first.
    fn stats(&self) -> PortStats {
        let c = &self.counters;
        let k = self.kernel_stats();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rx_unread = get(&c.rx_unread);
        // What the kernel took first: a frame it drops is counted there before the send
        // that gave it returns.
        let tx_taken = get(&c.tx_frames);
        let tx_errors = c.tx_errors.lock().clone();
        // No more of the port's frames than the kernel took from it: drops of another
        // sender on the interface beyond that are not the port's.
        let tx_kernel_drops = self.tx_kernel_drops(&tx_errors).min(tx_taken);
        // A TAP port: the device's own counts, when it has them (see `PortStats`).
        let tap = match (&self.io, self.tap_base) {
            (PortIo::Tap(_), Some(base)) => c
                .tap_final
                .lock()
                .or_else(|| TapCounts::read(self.kind.name(), self.ifindex))
                .map(|now| now.since(base)),
            _ => None,
        };
        PortStats {
            port: self.port,
            binding: Some(self.kind.clone()),
            rx_frames: get(&c.rx_frames),
            rx_bytes: get(&c.rx_bytes),
            rx_kernel_frames: match (&self.io, tap) {
                (PortIo::Packet { .. }, _) => k.packets,
                (PortIo::Tap(_), Some(t)) => t.read + t.dropped,
                (PortIo::Tap(_), None) => get(&c.rx_seen) + rx_unread,
            },
            rx_kernel_drops: match tap {
                Some(t) => t.dropped,
                None => k.drops,
            },
            rx_ring_full_events: k.freezes,
            rx_truncated: get(&c.rx_truncated),
            rx_bad_block_frames: get(&c.rx_bad_block_frames),
            rx_bad_blocks: get(&c.rx_bad_blocks),
            rx_outgoing_skipped: get(&c.rx_outgoing),
            rx_engine_stopped: get(&c.rx_engine_stopped),
            rx_unread,
            rx_checksums_completed: get(&c.rx_checksums_completed),
            rx_checksums_left: get(&c.rx_checksums_left),
            rx_vlan_restored: get(&c.rx_vlan_restored),
            rx_errors: get(&c.rx_errors),
            last_rx_error: c.last_error.lock().clone(),
            tx_frames: tx_taken.saturating_sub(tx_kernel_drops),
            tx_bytes: get(&c.tx_bytes),
            tx_errors,
            tx_kernel_drops,
        }
    }

    /// Frames the interface dropped without telling the port (see
    /// [`PortStats::tx_kernel_drops`]), given the port's transmit errors: its `tx_dropped`
    /// since the port opened, read now, less the `ENOBUFS` refusals it counts there too;
    /// the last count read when it cannot be read now.
    fn tx_kernel_drops(&self, tx_errors: &BTreeMap<String, u64>) -> u64 {
        let last = &self.counters.tx_kernel_drops;
        let Some(base) = self.tx_dropped_base else {
            return 0;
        };
        if let Some(now) = if_dropped(self.kind.name(), self.ifindex) {
            let refused = tx_errors.get("ENOBUFS").copied().unwrap_or(0);
            let drops = now.saturating_sub(base).saturating_sub(refused);
            // The latest, not the largest: an ENOBUFS refusal counted by the interface but
            // not yet by the port makes one read high until the next.
            last.store(drops, Ordering::Relaxed);
        }
        last.load(Ordering::Relaxed)
    }

    /// Frames that arrived and were not taken by the time the port stopped (its RX thread
    /// has ended, having stopped the kernel's delivery). An interface: those in the ring,
    /// the kernel's final count less those the RX thread took. A TAP device: those in its
    /// queue, read here and discarded, at most a queue's worth (the device refuses frames
    /// from the stop on, so none refill it; if it could not be made to, a host that keeps
    /// sending refills it, and what is still queued when the port closes is in no counter).
    fn unread(&self) -> u64 {
        match &self.io {
            PortIo::Packet { .. } => {
                let k = self.kernel_stats();
                (k.packets.saturating_sub(k.drops))
                    .saturating_sub(self.counters.rx_seen.load(Ordering::Relaxed))
            }
            PortIo::Tap(tap) => {
                let mut buf = vec![0u8; 65_536];
                let (mut n, most) = (0, self.tap_queue_len());
                while n < most {
                    match tap.try_read(&mut buf) {
                        Ok(Some(_)) => n += 1,
                        Ok(None) => break,
                        // A device deleted meanwhile has no queue left (its receive thread
                        // counted the failure when it found it).
                        Err(e) if matches!(e.raw_os_error(), Some(libc::EBADFD | libc::ENODEV)) => {
                            break
                        }
                        // What the queue still holds is then in no counter: the error says so.
                        Err(e) => {
                            self.counters
                                .rx_error(format!("draining the TAP queue at the stop: {e}"));
                            break;
                        }
                    }
                }
                n as u64
            }
        }
    }

    /// Keeps a TAP port's device counts as they are now (after [`Bound::unread`]): the
    /// device keeps counting frames it refuses after the stop, which are not the port's.
    fn freeze(&self) {
        if let (PortIo::Tap(_), Some(_)) = (&self.io, self.tap_base) {
            let now = TapCounts::read(self.kind.name(), self.ifindex);
            *self.counters.tap_final.lock() = now;
        }
    }

    /// How many frames a TAP device queues for the port at most (its `txqueuelen`,
    /// [`TAP_QUEUE_DEFAULT`] when it cannot be read).
    fn tap_queue_len(&self) -> usize {
        std::fs::read_to_string(format!("/sys/class/net/{}/tx_queue_len", self.kind.name()))
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(TAP_QUEUE_DEFAULT)
            .max(1)
    }
}

/// The queue of a TAP device whose `txqueuelen` cannot be read: the kernel's default.
const TAP_QUEUE_DEFAULT: usize = 1000;

/// A TAP device's own counts of the frames the host sent to its reader (the port: a
/// single-queue TAP device has one), from `/sys/class/net/NAME/statistics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TapCounts {
    /// `tx_packets`: frames read from the device (the kernel counts each as it hands it to
    /// a read).
    read: u64,
    /// `tx_dropped`: frames the device dropped (its queue was full, or its filter refused
    /// them).
    dropped: u64,
}

/// A number in `/sys/class/net/NAME/FILE`.
fn if_file(name: &str, file: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/{file}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether interface `name` is still the one of index `ifindex` (not deleted, nor another
/// made under its name).
fn if_is(name: &str, ifindex: i32) -> Option<()> {
    (if_file(name, "ifindex")? == u64::try_from(ifindex).ok()?).then_some(())
}

/// Interface `name`'s own count of the frames it dropped on their way out (`tx_dropped`),
/// if it is still the interface of index `ifindex`.
fn if_dropped(name: &str, ifindex: i32) -> Option<u64> {
    let n = if_file(name, "statistics/tx_dropped")?;
    if_is(name, ifindex).map(|()| n)
}

impl TapCounts {
    /// The counts of device `name` now, if it is still the device of index `ifindex` (not
    /// deleted, nor another made under its name); `None` otherwise.
    fn read(name: &str, ifindex: i32) -> Option<TapCounts> {
        let counts = TapCounts {
            read: if_file(name, "statistics/tx_packets")?,
            dropped: if_file(name, "statistics/tx_dropped")?,
        };
        if_is(name, ifindex).map(|()| counts)
    }

    /// What was counted since `base`.
    fn since(self, base: TapCounts) -> TapCounts {
        TapCounts {
            read: self.read.saturating_sub(base.read),
            dropped: self.dropped.saturating_sub(base.dropped),
        }
    }
}

/// What the sink, the RX threads and the handles share.
#[derive(Debug)]
struct Shared {
    bound: Vec<Bound>,
    /// Index into `bound` by port, up to the highest bound port.
    by_port: Vec<Option<usize>>,
    tx_unbound: AtomicU64,
    warnings: Mutex<Vec<String>>,
}

impl Shared {
    fn report(&self) -> PortsReport {
        let mut ports: Vec<PortStats> = self.bound.iter().map(Bound::stats).collect();
        ports.sort_by_key(|p| p.port);
        let mut warnings = self.warnings.lock().clone();
        for p in &ports {
            if p.tx_errors.contains_key("EMSGSIZE") {
                warnings.push(format!(
                    "port {}: frames longer than {}'s MTU were refused (EMSGSIZE); if a host \
                     sends TCP through a veth, turn its segmentation offload off \
                     (`ip link set dev IFACE gso_max_segs 1`)",
                    p.port,
                    p.binding.as_ref().map_or("the interface", |b| b.name())
                ));
            }
        }
        PortsReport {
            ports,
            tx_unbound: self.tx_unbound.load(Ordering::Relaxed),
            warnings,
        }
    }
}

/// The egress side of live ports: a [`Sink`] that sends each port's frames out of its
/// interface. Its [`Sink::ports`] is the highest bound port plus one, so an engine built
/// with it drops frames for ports above that as `no_such_port`; frames for an unbound port
/// below it are counted in [`PortsReport::tx_unbound`].
#[derive(Debug, Clone)]
pub struct PortSink {
    shared: Arc<Shared>,
}

impl Sink for PortSink {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        let sh = &*self.shared;
        let Some(b) = sh
            .by_port
            .get(usize::from(port))
            .copied()
            .flatten()
            .map(|i| &sh.bound[i])
        else {
            sh.tx_unbound
                .fetch_add(frames.len() as u64, Ordering::Relaxed);
            return;
        };
        let c = &b.counters;
        let (sent, bytes) = match &b.io {
            PortIo::Packet { tx, .. } => {
                tx.send_batch(&mut frames.iter(), &mut |_, e| c.tx_failed(&e))
            }
            PortIo::Tap(t) => {
                let (mut n, mut bytes) = (0, 0);
                for f in frames.iter() {
                    match t.write(f) {
                        Ok(()) => {
                            n += 1;
                            bytes += f.len() as u64;
                        }
                        Err(e) => c.tx_failed(&e),
                    }
                }
                (n, bytes)
            }
        };
        c.tx_frames.fetch_add(sent, Ordering::Relaxed);
        c.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn ports(&self) -> Option<usize> {
        Some(self.shared.by_port.len())
    }
}

impl PortSink {
    /// The ports' counters now. The sink lives as long as the engine built with it, and
    /// the interfaces stay bound (for sending) until then, so this reads them after
    /// [`RunningPorts::stop`] too: a stopped port takes no more frames, and its counters
    /// stay as the stop's report gave them (but for what the engine still sends).
    pub fn report(&self) -> PortsReport {
        self.shared.report()
    }
}

/// Ports bound to interfaces, not yet receiving (see the module docs).
#[derive(Debug)]
pub struct LivePorts {
    shared: Arc<Shared>,
    /// The interface ports' rings, in `shared.bound` order (`None` for TAP ports).
    rings: Vec<Option<RxRing>>,
    poll_ms: u32,
    ring: RingConfig,
}

impl LivePorts {
    /// Binds every port of `cfg` (see the module docs). Fails on the first port that
    /// cannot be bound, naming it and its interface.
    pub fn open(cfg: &PortsConfig) -> Result<LivePorts, PortError> {
        if cfg.ports.is_empty() {
            return Err(ConfigError::new(
                "ports",
                "no ports: bind at least one (`--iface 0=veth0` or `--tap 0=tap0`)",
            )
            .into());
        }
        cfg.ring.check()?;
        if !(1..=1000).contains(&cfg.poll_ms) {
            return Err(
                ConfigError::new("poll_ms", format!("{}: from 1 to 1000 ms", cfg.poll_ms)).into(),
            );
        }
        let mut ports: Vec<Port> = Vec::new();
        let mut names: Vec<&str> = Vec::new();
        for s in &cfg.ports {
            if ports.contains(&s.port) {
                return Err(
                    ConfigError::new("ports", format!("port {} is bound twice", s.port)).into(),
                );
            }
            if names.contains(&s.kind.name()) {
                return Err(ConfigError::new(
                    "ports",
                    format!(
                        "interface `{}` is bound to two ports (each would receive every \
                         frame)",
                        s.kind.name()
                    ),
                )
                .into());
            }
            ports.push(s.port);
            names.push(s.kind.name());
        }
        let mut bound = Vec::new();
        let mut rings = Vec::new();
        let mut warnings = Vec::new();
        for s in &cfg.ports {
            let (io, ifindex, ring) = open_port(s, cfg, &mut warnings)?;
            // Read before the port reads anything (it is the device's only reader).
            let tap_base = match (&io, &s.kind) {
                (PortIo::Tap(_), PortKind::Tap(name)) => {
                    let base = TapCounts::read(name, ifindex);
                    if base.is_none() {
                        warnings.push(format!(
                            "port {}: TAP {name}: its statistics cannot be read \
                             (/sys/class/net/{name}/statistics: is /sys of another network \
                             namespace?): the port's count of the frames the kernel handed \
                             it is its own, so rx_accounted checks nothing for it",
                            s.port
                        ));
                    }
                    base
                }
                _ => None,
            };
            let tx_dropped_base = match &io {
                PortIo::Packet { .. } => {
                    let base = if_dropped(s.kind.name(), ifindex);
                    if base.is_none() {
                        warnings.push(format!(
                            "port {}: {}: its statistics cannot be read \
                             (/sys/class/net/{}/statistics: is /sys of another network \
                             namespace?): frames it drops without a word to the port (no \
                             carrier) are counted as sent",
                            s.port,
                            s.kind,
                            s.kind.name()
                        ));
                    }
                    base
                }
                PortIo::Tap(_) => None,
            };
            bound.push(Bound {
                port: s.port,
                kind: s.kind.clone(),
                ifindex,
                io,
                tap_base,
                tx_dropped_base,
                counters: Counters::default(),
            });
            rings.push(ring);
        }
        let max = ports.iter().copied().max().map_or(0, usize::from);
        let mut by_port = vec![None; max + 1];
        for (i, b) in bound.iter().enumerate() {
            by_port[usize::from(b.port)] = Some(i);
        }
        Ok(LivePorts {
            shared: Arc::new(Shared {
                bound,
                by_port,
                tx_unbound: AtomicU64::new(0),
                warnings: Mutex::new(warnings),
            }),
            rings,
            poll_ms: cfg.poll_ms,
            ring: cfg.ring,
        })
    }

    /// The egress side, to build the engine with ([`crate::pfe::PfeBuilder::sink`]).
    pub fn sink(&self) -> Arc<PortSink> {
        Arc::new(PortSink {
            shared: self.shared.clone(),
        })
    }

    /// The counters now (nothing is received before [`LivePorts::start`]).
    pub fn report(&self) -> PortsReport {
        self.shared.report()
    }

    /// Starts one RX thread per port, injecting what arrives into `pfe` (running, and
    /// built with [`LivePorts::sink`]).
    pub fn start(self, pfe: Arc<Pfe>) -> Result<RunningPorts, PortError> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (i, ring) in self.rings.into_iter().enumerate() {
            let rx = RxThread {
                shared: self.shared.clone(),
                index: i,
                pfe: pfe.clone(),
                stop: stop.clone(),
                poll_ms: self.poll_ms as i32,
                block_timeout_ms: self.ring.block_timeout_ms as i32,
            };
            let b = &self.shared.bound[i];
            let name = format!("pfemu-rx{}", b.port);
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || match ring {
                    Some(ring) => rx.run_ring(ring),
                    None => rx.run_tap(),
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(source) => {
                    stop.store(true, Ordering::Relaxed);
                    for h in threads {
                        let _ = h.join();
                    }
                    return Err(PortError::Io {
                        port: b.port,
                        kind: b.kind.clone(),
                        source,
                    });
                }
            }
        }
        Ok(RunningPorts {
            shared: self.shared,
            pfe,
            stop,
            threads,
            started: Instant::now(),
        })
    }
}

/// Opens one port: its I/O, and for an interface its index and ring.
fn open_port(
    s: &PortSpec,
    cfg: &PortsConfig,
    warnings: &mut Vec<String>,
) -> Result<(PortIo, i32, Option<RxRing>), PortError> {
    let err = |source: io::Error| match source.kind() {
        io::ErrorKind::PermissionDenied => PortError::Permission {
            port: s.port,
            kind: s.kind.clone(),
            what: source.to_string(),
        },
        _ => PortError::Io {
            port: s.port,
            kind: s.kind.clone(),
            source,
        },
    };
    match &s.kind {
        PortKind::Tap(name) => {
            let tap = Tap::open(name).map_err(err)?;
            let ifindex = sys::if_index(name).map_err(|e| {
                err(io::Error::new(
                    e.kind(),
                    format!("the index of the TAP device just opened: {e}"),
                ))
            })?;
            Ok((PortIo::Tap(tap), ifindex, None))
        }
        PortKind::Interface(name) => {
            let ifindex = sys::if_index(name).map_err(|e| {
                if e.raw_os_error() == Some(libc::ENODEV) || e.kind() == io::ErrorKind::NotFound {
                    PortError::NoSuchInterface {
                        port: s.port,
                        name: name.clone(),
                    }
                } else {
                    err(e)
                }
            })?;
            let sock = PacketSocket::new().map_err(|e| {
                err(io::Error::new(
                    e.kind(),
                    format!("opening an AF_PACKET socket: {e}"),
                ))
            })?;
            sock.set_tpacket_v3().map_err(err)?;
            if let Err(e) = sock.ignore_outgoing() {
                warnings.push(format!(
                    "port {}: {name}: {e}; this kernel (before 4.20?) shows the port the \
                     frames it sends, which are skipped and counted as rx_outgoing_skipped",
                    s.port
                ));
            }
            let ring = RxRing::new(&sock, cfg.ring.layout()).map_err(err)?;
            sock.bind(ifindex).map_err(err)?;
            sock.promiscuous(ifindex).map_err(err)?;
            // Sends go through a socket of their own: an error the kernel reports on the
            // receiving socket (the interface went down) is then the receive thread's to
            // count, once, and no later send fails with it once the interface is back.
            let tx = PacketSocket::new().map_err(|e| {
                err(io::Error::new(
                    e.kind(),
                    format!("opening an AF_PACKET socket to send: {e}"),
                ))
            })?;
            tx.set_send_buffer(cfg.send_buffer_bytes).map_err(err)?;
            tx.set_send_timeout(SEND_TIMEOUT).map_err(err)?;
            tx.bind_sender(ifindex).map_err(err)?;
            if !interface_is_up(name) {
                warnings.push(format!(
                    "port {}: interface {name} is down: nothing arrives and sending fails \
                     (ENETDOWN) until `ip link set {name} up`",
                    s.port
                ));
            }
            Ok((PortIo::Packet { rx: sock, tx }, ifindex, Some(ring)))
        }
    }
}

/// Whether `/sys/class/net/NAME/flags` has `IFF_UP` (true when it cannot be read).
fn interface_is_up(name: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{name}/flags"))
        .ok()
        .and_then(|s| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .is_none_or(|f| f & 1 != 0)
}

/// Ports receiving into a running engine.
#[derive(Debug)]
pub struct RunningPorts {
    shared: Arc<Shared>,
    pfe: Arc<Pfe>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

impl RunningPorts {
    /// The counters now.
    pub fn report(&self) -> PortsReport {
        self.shared.report()
    }

    /// Time since [`LivePorts::start`].
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The engine the ports feed.
    pub fn pfe(&self) -> &Arc<Pfe> {
        &self.pfe
    }

    /// Stops receiving (each interface port stops the kernel's delivery to its socket, then
    /// takes every frame the kernel had stored in its ring; a TAP port makes its device
    /// refuse frames, then takes what its queue holds; no more, however fast frames keep
    /// arriving: frames that arrive after are counted by the host, a TAP device's in its
    /// `tx_dropped`, not by the port), drains the engine
    /// so everything in flight leaves through the ports, and returns the final counters,
    /// with the frames still unread counted in [`PortStats::rx_unread`]. The engine keeps
    /// running (shut it down after); the ports take no more frames.
    pub fn stop(mut self) -> PortsReport {
        self.stop_threads();
        self.pfe.drain();
        for b in &self.shared.bound {
            // Done by its RX thread, unless that ended early (an error).
            b.stop_delivery(&self.shared.warnings);
            b.counters.rx_unread.store(b.unread(), Ordering::Relaxed);
            b.freeze();
        }
        self.shared.report()
    }

    /// Sets the stop flag and joins the RX threads (each within a poll, and the frames its
    /// ring held when it saw the flag).
    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in std::mem::take(&mut self.threads) {
            if h.join().is_err() {
                self.shared
                    .warnings
                    .lock()
                    .push("an RX thread panicked".to_string());
            }
        }
    }
}

impl Drop for RunningPorts {
    /// Stops the RX threads (they hold the engine), as [`RunningPorts::stop`] does,
    /// without draining: ports dropped on a panic do not keep receiving.
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// How long a stopping interface port waits for the kernel to hand over the frames it had
/// stored: the block in progress is handed over within two block timeouts, and a second
/// more allows for a loaded machine.
fn stop_wait(block_timeout_ms: i32) -> Duration {
    Duration::from_millis(2 * u64::try_from(block_timeout_ms).unwrap_or(0) + 1000)
}

/// Where a frame to inject is: in the ring block, or in the scratch buffer (a frame that
/// got its VLAN tag back).
#[derive(Clone, Debug)]
enum Src {
    Ring(std::ops::Range<usize>),
    Scratch(std::ops::Range<usize>),
}

/// One port's receive loop.
struct RxThread {
    shared: Arc<Shared>,
    index: usize,
    pfe: Arc<Pfe>,
    stop: Arc<AtomicBool>,
    poll_ms: i32,
    block_timeout_ms: i32,
}

/// What one block or read burst added to a port's counters, published at once.
#[derive(Default)]
struct Tally {
    seen: u64,
    frames: u64,
    bytes: u64,
    outgoing: u64,
    truncated: u64,
    completed: u64,
    left: u64,
    vlan: u64,
    stopped: u64,
}

impl RxThread {
    fn bound(&self) -> &Bound {
        &self.shared.bound[self.index]
    }

    fn publish(&self, t: &Tally) {
        let c = &self.bound().counters;
        for (a, v) in [
            (&c.rx_seen, t.seen),
            (&*c.rx_frames, t.frames),
            (&c.rx_bytes, t.bytes),
            (&c.rx_outgoing, t.outgoing),
            (&c.rx_truncated, t.truncated),
            (&c.rx_checksums_completed, t.completed),
            (&c.rx_checksums_left, t.left),
            (&c.rx_vlan_restored, t.vlan),
            (&c.rx_engine_stopped, t.stopped),
        ] {
            if v != 0 {
                a.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// Injects `srcs` (resolved in `block` and `scratch`) as one burst.
    fn inject(&self, block: &[u8], scratch: &[u8], srcs: &[Src], t: &mut Tally) {
        if srcs.is_empty() {
            return;
        }
        let port = self.bound().port;
        let frame = |s: &Src| match s {
            Src::Ring(r) => &block[r.clone()],
            Src::Scratch(r) => &scratch[r.clone()],
        };
        let bytes: u64 = srcs.iter().map(|s| frame(s).len() as u64).sum();
        match self.pfe.inject_burst(srcs.iter().map(|s| (port, frame(s)))) {
            Ok(_) => {
                t.frames += srcs.len() as u64;
                t.bytes += bytes;
            }
            Err(_) => t.stopped += srcs.len() as u64,
        }
    }

    /// An interface port: blocks of the ring, in order.
    fn run_ring(self, mut ring: RxRing) {
        let PortIo::Packet { rx: sock, .. } = &self.bound().io else {
            return;
        };
        let mut frames: Vec<RxFrame> = Vec::new();
        let mut srcs: Vec<Src> = Vec::new();
        let mut scratch: Vec<u8> = Vec::new();
        loop {
            // Under a flood a block is always ready, so the flag is looked at before every
            // block.
            if self.stop.load(Ordering::Relaxed) {
                return self.finish_ring(sock, &mut ring, &mut frames, &mut srcs, &mut scratch);
            }
            let took = ring.with_ready_block(|block| {
                self.take_block(block, &mut frames, &mut srcs, &mut scratch)
            });
            if took.is_some() {
                continue;
            }
            match sock.poll(self.poll_ms) {
                Ok(ev) if sys::has_error(ev) => {
                    if let Some(e) = sock.take_error() {
                        self.bound().counters.rx_error(e.to_string());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    self.bound().counters.rx_error(format!("poll: {e}"));
                    return;
                }
            }
        }
    }

    /// The end of an interface port's receiving: stops the kernel's delivery to the socket
    /// (after which nothing enters the ring, nor is anything on its way in), then takes
    /// every frame the kernel had stored, the block it was filling included (handed over
    /// within a block timeout). The kernel's count says how many that is, so the work is
    /// bounded by the ring's size however fast frames keep arriving; what is not taken by
    /// [`stop_wait`] (the kernel did not hand the block over) is counted as `rx_unread`.
    fn finish_ring(
        &self,
        sock: &PacketSocket,
        ring: &mut RxRing,
        frames: &mut Vec<RxFrame>,
        srcs: &mut Vec<Src>,
        scratch: &mut Vec<u8>,
    ) {
        let b = self.bound();
        b.stop_delivery(&self.shared.warnings);
        let k = b.kernel_stats();
        let stored = k.packets.saturating_sub(k.drops);
        let deadline = Instant::now() + stop_wait(self.block_timeout_ms);
        loop {
            while ring
                .with_ready_block(|block| self.take_block(block, frames, srcs, scratch))
                .is_some()
            {}
            if b.counters.rx_seen.load(Ordering::Relaxed) >= stored {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            match sock.poll(ms) {
                Ok(ev) if sys::has_error(ev) => {
                    if let Some(e) = sock.take_error() {
                        b.counters.rx_error(e.to_string());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    b.counters.rx_error(format!("poll: {e}"));
                    return;
                }
            }
        }
    }

    /// Takes one block: checks it, finishes its frames, injects them.
    fn take_block(
        &self,
        block: &mut [u8],
        frames: &mut Vec<RxFrame>,
        srcs: &mut Vec<Src>,
        scratch: &mut Vec<u8>,
    ) {
        let c = &self.bound().counters;
        if let Err(e) = parse_block(block, frames) {
            // The frames listed before the error are lost with the rest: the block cannot be
            // trusted. The header's count says how many.
            let n = u32::from_ne_bytes([block[12], block[13], block[14], block[15]]);
            c.rx_bad_blocks.fetch_add(1, Ordering::Relaxed);
            c.rx_bad_block_frames
                .fetch_add(u64::from(n), Ordering::Relaxed);
            c.rx_seen.fetch_add(u64::from(n), Ordering::Relaxed);
            *c.last_error.lock() = Some(e.to_string());
            return;
        }
        let mut t = Tally {
            seen: frames.len() as u64,
            ..Tally::default()
        };
        srcs.clear();
        scratch.clear();
        for f in frames.iter() {
            if f.pkttype == PACKET_OUTGOING {
                t.outgoing += 1;
                continue;
            }
            if f.is_truncated() {
                t.truncated += 1;
                continue;
            }
            if f.checksum_not_ready() {
                match fix::complete_checksum(&mut block[f.data.clone()]) {
                    Ok(_) => t.completed += 1,
                    Err(_) => t.left += 1,
                }
            }
            match f.vlan {
                Some(tag) => {
                    let at = scratch.len();
                    fix::insert_vlan_tag(&block[f.data.clone()], tag, scratch);
                    srcs.push(Src::Scratch(at..scratch.len()));
                    t.vlan += 1;
                }
                None => srcs.push(Src::Ring(f.data.clone())),
            }
        }
        self.inject(block, scratch, srcs, &mut t);
        self.publish(&t);
    }

    /// A TAP port: frames read one by one, injected in bursts.
    fn run_tap(self) {
        const SLOTS: usize = 32;
        const SLOT: usize = 65_536;
        let PortIo::Tap(tap) = &self.bound().io else {
            return;
        };
        let mut arena = vec![0u8; SLOTS * SLOT];
        let mut srcs: Vec<Src> = Vec::with_capacity(SLOTS);
        // Once the stop flag is up, the device refuses every frame the host sends, and
        // the frames still to take are what its queue holds: at most a queue's worth.
        // Under a flood a frame is always waiting, so the flag is looked at before every
        // burst.
        let mut left: Option<usize> = None;
        loop {
            if left.is_none() && self.stop.load(Ordering::Relaxed) {
                self.bound().stop_delivery(&self.shared.warnings);
                left = Some(self.bound().tap_queue_len());
            }
            let room = left.map_or(SLOTS, |n| n.min(SLOTS));
            srcs.clear();
            let mut failed = None;
            while srcs.len() < room {
                let at = srcs.len() * SLOT;
                match tap.try_read(&mut arena[at..at + SLOT]) {
                    Ok(Some(n)) => srcs.push(Src::Ring(at..at + n)),
                    Ok(None) => break,
                    Err(e) => {
                        failed = Some(format!("read: {e}"));
                        break;
                    }
                }
            }
            if !srcs.is_empty() {
                let mut t = Tally {
                    seen: srcs.len() as u64,
                    ..Tally::default()
                };
                self.inject(&arena, &[], &srcs, &mut t);
                self.publish(&t);
                if let Some(n) = &mut left {
                    *n -= srcs.len();
                }
            }
            if let Some(why) = failed {
                return self.tap_failed(&why);
            }
            if left.is_some() && (srcs.len() < room || left == Some(0)) {
                return;
            }
            if !srcs.is_empty() {
                continue;
            }
            match tap.poll(self.poll_ms) {
                // A TAP descriptor signals an error only once its device is gone; it
                // would signal it at once on every poll.
                Ok(ev) if sys::has_error(ev) => {
                    return self.tap_failed("poll: the device reports an error")
                }
                Ok(_) => {}
                Err(e) => {
                    self.bound().counters.rx_error(format!("poll: {e}"));
                    return;
                }
            }
        }
    }

    /// Ends a TAP port's receiving after a read or poll failed (the device was deleted:
    /// `EBADFD`, and every later read or poll fails at once): counts the error once and
    /// warns, rather than retrying at full speed.
    fn tap_failed(&self, why: &str) {
        let b = self.bound();
        b.counters
            .rx_error(format!("{why}; the port reads no more from it"));
        self.shared.warnings.lock().push(format!(
            "port {}: {}: {why}: the port receives no more from it (was the device deleted?)",
            b.port, b.kind
        ));
    }
}

/// An AF_PACKET socket bound to one interface without a ring, to offer frames to a port
/// from outside (a test, a traffic generator: `pfemu bench ports`) and to read what
/// a port sent. Needs `CAP_NET_RAW`.
#[derive(Debug)]
pub struct RawSocket {
    sock: PacketSocket,
    name: String,
}

impl RawSocket {
    /// Binds to interface `name`; `promiscuous` to receive frames for any MAC address.
    /// The socket does not see what it sends itself, nor anything else leaving `name`
    /// (`PACKET_IGNORE_OUTGOING`; frames of type `PACKET_OUTGOING` are skipped by
    /// [`RawSocket::try_recv`] on older kernels).
    pub fn open(name: &str, promiscuous: bool) -> Result<RawSocket, PortError> {
        let spec = PortSpec {
            port: 0,
            kind: PortKind::Interface(name.to_string()),
        };
        let err = |source: io::Error| match source.kind() {
            io::ErrorKind::PermissionDenied => PortError::Permission {
                port: 0,
                kind: spec.kind.clone(),
                what: source.to_string(),
            },
            _ => PortError::Io {
                port: 0,
                kind: spec.kind.clone(),
                source,
            },
        };
        let ifindex = sys::if_index(name).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENODEV) {
                PortError::NoSuchInterface {
                    port: 0,
                    name: name.to_string(),
                }
            } else {
                err(e)
            }
        })?;
        let sock = PacketSocket::new().map_err(err)?;
        let _ = sock.ignore_outgoing();
        sock.set_send_buffer(4 << 20).map_err(err)?;
        sock.set_recv_buffer(16 << 20).map_err(err)?;
        sock.bind(ifindex).map_err(err)?;
        if promiscuous {
            sock.promiscuous(ifindex).map_err(err)?;
        }
        Ok(RawSocket {
            sock,
            name: name.to_string(),
        })
    }

    /// The interface.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `frames` (with `sendmmsg`, 64 per call); returns how many were sent and the
    /// first error of those that were not.
    pub fn send<'a>(&self, frames: impl IntoIterator<Item = &'a [u8]>) -> (u64, Option<io::Error>) {
        let mut first = None;
        let (sent, _) = self.sock.send_batch(&mut frames.into_iter(), &mut |_, e| {
            first.get_or_insert(e);
        });
        (sent, first)
    }

    /// Sends `frames` as [`RawSocket::send`] does; returns how many were sent and the
    /// error of each frame that was not (a veth whose peer's backlog is full refuses a
    /// frame with `ENOBUFS`: it was dropped on the veth).
    pub fn send_counting<'a>(
        &self,
        frames: impl IntoIterator<Item = &'a [u8]>,
    ) -> (u64, Vec<io::Error>) {
        let mut errors = Vec::new();
        let (sent, _) = self
            .sock
            .send_batch(&mut frames.into_iter(), &mut |_, e| errors.push(e));
        (sent, errors)
    }

    /// Receives one frame into `buf` if one is queued (`Ok(None)` otherwise), skipping
    /// frames this host sent. Returns its length (cut to `buf`).
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match self.sock.try_recv(buf)? {
                Some((_, PACKET_OUTGOING)) => continue,
                Some((n, _)) => return Ok(Some(n)),
                None => return Ok(None),
            }
        }
    }

    /// Waits up to `timeout` for a frame to receive; true when one is queued.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        Ok(self.sock.poll(ms)? & libc::POLLIN != 0)
    }

    /// The kernel's count of frames it dropped for this socket (its receive buffer was
    /// full) since the last call.
    pub fn take_drops(&self) -> io::Result<u64> {
        Ok(self.sock.take_stats()?.drops)
    }
}
