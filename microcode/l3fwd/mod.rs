//! l3fwd: the classic IPv4 forwarding workload. Validate the IPv4 header, look the
//! destination up in a longest-prefix-match table (DIR-24-8) in shared memory, decrement
//! the TTL with an incremental checksum update, rewrite the MAC addresses and forward to
//! the route's port.
//!
//! ```text
//! parse --valid, tbl24 entry is a next hop-------------------> rewrite --> Forward(port)
//!   |  \--valid, tbl24 entry points to a tbl8 group--> lookup_tbl8 --^
//!   |                                                      |
//!   +--> Drop(non_ipv4 | truncated | bad_version | bad_ihl |
//!            bad_length | bad_checksum | ttl_exceeded | no_route) <--+
//! ```
//!
//! # Validation (instruction `parse`)
//!
//! In order, each failure dropping the packet under its own reason (counted by name in the
//! engine's stats, see [`DROP_REASONS`]):
//!
//! | check | drop reason |
//! |---|---|
//! | the frame holds an Ethernet header and its EtherType is IPv4 (`0x0800`) | `non_ipv4` |
//! | the frame holds the 20-byte fixed IPv4 header | `truncated` |
//! | version is 4 | `bad_version` |
//! | IHL is at least 5 | `bad_ihl` |
//! | the head holds the whole `ihl * 4`-byte header | `truncated` |
//! | `ihl * 4 <= total_length <= frame length - 14` | `bad_length` |
//! | the header checksum is correct (RFC 1071 over `ihl * 4` bytes) | `bad_checksum` |
//! | TTL > 1 | `ttl_exceeded` |
//! | a route covers the destination | `no_route` |
//!
//! Options are allowed (and covered by the checksum); they are neither interpreted nor
//! removed. Fragments are forwarded like any other packet.
//!
//! # Table layout
//!
//! The route table is DIR-24-8 (Gupta, Lin & McKeown, 1998) with 16-bit entries packed
//! four to a 64-bit word, entry `i` of a word at bits `63 - 16 * (i % 4)` down (so the
//! bytes [`SharedMemory::read`] returns are the entries in order, big-endian):
//!
//! - **tbl24** ([`TBL24_REGION`], DRAM, [`TBL24_WORDS`] words = 32 MiB): one entry per /24,
//!   indexed by the top 24 bits of the destination.
//! - **tbl8** ([`TBL8_REGION`], DRAM, [`TBL8_GROUP_WORDS`] words = 512 bytes per group):
//!   groups of 256 entries, one per /24 that holds a route longer than /24, indexed by the
//!   low 8 bits of the destination.
//! - **next hops** ([`NEXT_HOP_REGION`], SRAM, [`NEXT_HOP_WORDS`] words each): word 0 is
//!   `port << 48 | destination MAC`, word 1 the source MAC (the egress port's own MAC,
//!   kept with the next hop so the rewrite needs one read).
//!
//! An entry is `0` for "no route"; with bit 15 ([`ENTRY_TBL8`]) clear, `n` in
//! `1..=0x7FFF` is next hop `n - 1`; with bit 15 set (tbl24 only), the low 15 bits are a
//! tbl8 group. So at most [`MAX_NEXT_HOPS`] next hops and [`MAX_TBL8_GROUPS`] groups.
//! A group is filled with the entry its /24 had before (the best route of length <= 24),
//! then the longer routes are written over it, shortest first: every address gets its
//! longest prefix whatever order the routes were added in ([`Dir248::build`]).
//!
//! # Memory
//!
//! tbl24 takes 32 MiB of DRAM and each tbl8 group 512 bytes, so the default
//! [`MemConfig`] (64 MiB of DRAM) holds tbl24 plus every group
//! the 15-bit index allows ([`MAX_TBL8_GROUPS`], 16 MiB); [`Dir248::dram_bytes`] says
//! what a table needs. DRAM is materialised lazily and only non-zero words are written,
//! so a small table costs little host memory. Next hops take 16 bytes of SRAM each.
//! [`L3fwd::install`] fails with [`L3fwdError::Memory`] naming the table and the bytes
//! it needs when a region is too small.
//!
//! # XTXNs per packet
//!
//! A forwarded packet whose best route is at most /24 long costs two instructions and two
//! read XTXNs: the 8-byte tbl24 word (`parse`) and the 16-byte next hop (`rewrite`). A
//! route longer than /24 adds one instruction and one read (`lookup_tbl8`). Drops before
//! the lookup cost one instruction and no XTXN.
//!
//! ```
//! use std::sync::Arc;
//! use pfemu::prelude::*;
//! use pfemu::program::Harness;
//! use pfemu::microcode::l3fwd::{L3fwd, RouteTable};
//!
//! let routes: RouteTable = "10.0.0.0/8 1\n10.1.2.128/25 2\n".parse()?;
//! let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
//! let l3fwd = L3fwd::install(&mem, &routes)?;
//! let program = l3fwd.program();
//!
//! let frame = pfemu::microcode::l3fwd::udp_frame([10, 1, 2, 200], 64, 64);
//! let mut h = Harness::new(mem);
//! let out = h.run(&program, 0, &frame);
//! assert_eq!(out.result, Ok(Verdict::Forward(2)));
//! assert_eq!(out.output.unwrap()[22], 63); // TTL decremented
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod live;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use pfemu::mem::{Addr, AllocError, MemFault, Region, SharedMemory, WORD_BYTES};
use pfemu::packet::Port;
use pfemu::prelude::*;
use pfemu::program::ProgramBuilder;
use pfemu::rng::SplitMix64;
use pfemu::wire::{
    checksum_update16, Ether, Ipv4, Udp, ETHERTYPE_IPV4, ETHER_LEN, IPPROTO_UDP, IPV4_LEN,
};

/// Name of the tbl24 region in the shared-memory allocator.
pub const TBL24_REGION: &str = "l3fwd.tbl24";
/// Name of the tbl8 region in the shared-memory allocator.
pub const TBL8_REGION: &str = "l3fwd.tbl8";
/// Name of the next-hop table in the shared-memory allocator.
pub const NEXT_HOP_REGION: &str = "l3fwd.next_hops";

/// Entries in tbl24 (one per /24).
pub const TBL24_ENTRIES: usize = 1 << 24;
/// 16-bit entries per 64-bit word.
pub const ENTRIES_PER_WORD: usize = 4;
/// Words tbl24 takes (2^24 entries of 16 bits: 32 MiB).
pub const TBL24_WORDS: u64 = (TBL24_ENTRIES / ENTRIES_PER_WORD) as u64;
/// Entries in a tbl8 group (one per address of a /24).
pub const TBL8_GROUP_ENTRIES: usize = 256;
/// Words a tbl8 group takes (512 bytes).
pub const TBL8_GROUP_WORDS: u64 = (TBL8_GROUP_ENTRIES / ENTRIES_PER_WORD) as u64;
/// Bit 15 of a tbl24 entry: the low 15 bits are a tbl8 group, not a next hop.
pub const ENTRY_TBL8: u16 = 0x8000;
/// Most tbl8 groups (a 15-bit group index).
pub const MAX_TBL8_GROUPS: usize = 1 << 15;
/// Most routes [`RouteTable::generate`] draws: about 5% are longer than /24 and need a tbl8
/// group each, so this keeps them below [`MAX_TBL8_GROUPS`] with a margin.
pub const MAX_GENERATED_ROUTES: usize = 600_000;
/// Most next hops (entries `1..=0x7FFF` name next hops `0..0x7FFF`).
pub const MAX_NEXT_HOPS: usize = (1 << 15) - 1;
/// Words one next hop takes in SRAM.
pub const NEXT_HOP_WORDS: u64 = 2;
/// Bytes of DRAM tbl24 needs (32 MiB).
pub const TBL24_BYTES: u64 = TBL24_WORDS * WORD_BYTES as u64;

/// Where `rewrite` reads the next hop into local memory (below the packet head).
const SCRATCH_LM: usize = 0;

pfemu::drop_reasons! {
    /// Why l3fwd drops a packet, in the order the checks run (see the module doc).
    pub enum L3Drop {
        /// Not an Ethernet frame carrying IPv4.
        NonIpv4 = "non_ipv4",
        /// The head ends inside the IPv4 header.
        Truncated = "truncated",
        /// The IPv4 version is not 4.
        BadVersion = "bad_version",
        /// The IHL is below 5.
        BadIhl = "bad_ihl",
        /// The total length disagrees with the header or the frame.
        BadLength = "bad_length",
        /// The header checksum is wrong.
        BadChecksum = "bad_checksum",
        /// TTL 1 or 0: the packet may not be forwarded.
        TtlExceeded = "ttl_exceeded",
        /// No route covers the destination.
        NoRoute = "no_route",
    }
}

/// The program's drop reasons, in registration order ([`L3Drop`]'s names).
pub const DROP_REASONS: [&str; L3Drop::NAMES.len()] = L3Drop::NAMES;

pfemu::header! {
    /// A next hop in SRAM ([`NEXT_HOP_WORDS`] words), as `rewrite` reads it.
    pub struct NextHopRec {
        /// The egress port.
        port: 16,
        /// The next hop's MAC.
        dst_mac: 48,
        _: 16,
        /// The egress port's own MAC.
        src_mac: 48,
    }
}

pfemu::registers! {
    /// The IPv4 destination, from `parse` to `lookup_tbl8`.
    DST: u32,
    /// The tbl8 group of the destination's /24, from `parse` to `lookup_tbl8`.
    GROUP: u16,
    /// The next hop, to `rewrite`.
    HOP: u16,
}

// ----- errors ------------------------------------------------------------------------------

/// Why a route table could not be read or built, or the program installed.
#[derive(Debug)]
#[non_exhaustive]
pub enum L3fwdError {
    /// A line of a route file is malformed.
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A route file cannot be read.
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A route is impossible (prefix length above 32, host bits set, unknown next hop).
    BadRoute(String),
    /// More next hops than entries can name ([`MAX_NEXT_HOPS`]).
    TooManyNextHops(usize),
    /// More /24s hold routes longer than /24 than tbl8 groups can be indexed
    /// ([`MAX_TBL8_GROUPS`]).
    TooManyTbl8Groups(usize),
    /// Shared memory is too small for a table.
    Memory {
        /// The table (`tbl24`, `tbl8` or `next hops`).
        table: &'static str,
        /// Bytes it needs.
        bytes: u64,
        /// The allocator's refusal.
        source: AllocError,
    },
    /// Writing a table to shared memory failed.
    Fault(MemFault),
    /// A grace period ([`live::LiveRoutes::reclaim_retired`]) did not end by its deadline:
    /// the tbl8 groups freed stay retired, for a later grace period.
    Grace(pfemu::pfe::ControlError),
}

impl fmt::Display for L3fwdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            L3fwdError::Parse { line, reason } => write!(f, "route file line {line}: {reason}"),
            L3fwdError::Read { path, source } => {
                write!(f, "cannot read route file {}: {source}", path.display())
            }
            L3fwdError::BadRoute(r) => write!(f, "bad route: {r}"),
            L3fwdError::TooManyNextHops(n) => {
                write!(f, "{n} next hops; DIR-24-8 entries name at most {MAX_NEXT_HOPS}")
            }
            L3fwdError::TooManyTbl8Groups(n) => write!(
                f,
                "routes longer than /24 fall in {n} distinct /24s; DIR-24-8 holds at most {MAX_TBL8_GROUPS} tbl8 groups"
            ),
            L3fwdError::Memory {
                table,
                bytes,
                source,
            } => {
                let (region, setting) = if *table == "next hops" {
                    ("SRAM", "sram_bytes")
                } else {
                    ("DRAM", "dram_bytes")
                };
                write!(
                    f,
                    "l3fwd's {table} needs {bytes} bytes of {region} ({source}); \
                     raise MemConfig::{setting} (tbl24 alone takes {TBL24_BYTES} bytes, 32 MiB, \
                     each tbl8 group 512 bytes)"
                )
            }
            L3fwdError::Fault(e) => write!(f, "writing the route table: {e}"),
            L3fwdError::Grace(e) => write!(
                f,
                "freed tbl8 groups stay retired (a lookup may still read them): {e}"
            ),
        }
    }
}

impl std::error::Error for L3fwdError {
    /// The I/O error of [`L3fwdError::Read`], the allocator's refusal of
    /// [`L3fwdError::Memory`], the memory fault of [`L3fwdError::Fault`].
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            L3fwdError::Read { source, .. } => Some(source),
            L3fwdError::Memory { source, .. } => Some(source),
            L3fwdError::Fault(e) => Some(e),
            L3fwdError::Grace(e) => Some(e),
            _ => None,
        }
    }
}

impl From<MemFault> for L3fwdError {
    fn from(e: MemFault) -> Self {
        L3fwdError::Fault(e)
    }
}

// ----- routes ------------------------------------------------------------------------------

/// Where a route sends packets: the egress port and the MAC addresses of the rewrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct NextHop {
    /// Egress port.
    pub port: Port,
    /// Destination MAC written into forwarded frames (the neighbour's), 48 bits.
    pub dst_mac: u64,
    /// Source MAC written into forwarded frames (the egress port's own), 48 bits.
    pub src_mac: u64,
}

impl NextHop {
    /// The default next hop of `port`: neighbour MAC `02:00:00:01:pp:pp`, port MAC
    /// `02:00:00:00:pp:pp` (`pppp` the port number).
    pub fn for_port(port: Port) -> NextHop {
        NextHop {
            port,
            dst_mac: 0x0200_0001_0000 | u64::from(port),
            src_mac: 0x0200_0000_0000 | u64::from(port),
        }
    }
}

/// One route: a prefix and the index of its next hop in its [`RouteTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The prefix's address (host bits zero).
    pub prefix: u32,
    /// Prefix length, 0 to 32.
    pub len: u8,
    /// Index into [`RouteTable::next_hops`].
    pub next_hop: u16,
}

impl Route {
    /// Whether `addr` is inside the prefix.
    pub fn contains(&self, addr: u32) -> bool {
        addr & mask(self.len) == self.prefix
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} via next hop {}",
            Ipv4Addr::from(self.prefix),
            self.len,
            self.next_hop
        )
    }
}

/// The netmask of a prefix length (`len <= 32`).
pub fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

/// A set of routes with their next hops, and the reference longest-prefix match
/// ([`RouteTable::lookup`]) the DIR-24-8 table is tested against. Adding a prefix that is
/// already present replaces its next hop (not in the text form: a file gives each prefix
/// once).
///
/// Text form ([`FromStr`], [`RouteTable::parse`]): one route per line,
/// `A.B.C.D/LEN PORT`; `#` starts a comment; blank lines are ignored; a prefix takes one
/// line (a second is refused). Each distinct port gets the next hop
/// [`NextHop::for_port`].
///
/// ```
/// use pfemu::microcode::l3fwd::RouteTable;
///
/// let t: RouteTable = "# core\n10.0.0.0/8 1\n10.1.0.0/16 2  # more specific\n".parse()?;
/// assert_eq!(t.lookup_port(u32::from_be_bytes([10, 1, 9, 9])), Some(2));
/// assert_eq!(t.lookup_port(u32::from_be_bytes([10, 2, 0, 1])), Some(1));
/// assert_eq!(t.lookup_port(u32::from_be_bytes([11, 0, 0, 1])), None);
///
/// let err = "10.0.0.0/33 1".parse::<RouteTable>().unwrap_err();
/// assert!(err.to_string().starts_with("route file line 1:"));
/// # Ok::<(), pfemu::microcode::l3fwd::L3fwdError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct RouteTable {
    next_hops: Vec<NextHop>,
    port_next_hop: HashMap<Port, u16>,
    /// Prefix -> next hop, by prefix length.
    by_len: Vec<HashMap<u32, u16>>,
    /// Prefix lengths that hold routes, longest first.
    lens: Vec<u8>,
    /// Routes longer than /24 in each /24 that has any (by the /24's index, `prefix >> 8`).
    long_per_24: HashMap<u32, u32>,
}

impl RouteTable {
    /// An empty table.
    pub fn new() -> Self {
        RouteTable {
            by_len: vec![HashMap::new(); 33],
            ..Default::default()
        }
    }

    /// Adds a next hop; returns its index.
    pub fn add_next_hop(&mut self, nh: NextHop) -> Result<u16, L3fwdError> {
        if self.next_hops.len() >= MAX_NEXT_HOPS {
            return Err(L3fwdError::TooManyNextHops(self.next_hops.len() + 1));
        }
        self.next_hops.push(nh);
        Ok((self.next_hops.len() - 1) as u16)
    }

    /// The next hop [`NextHop::for_port`]`(port)`, added on first use.
    pub fn port_next_hop(&mut self, port: Port) -> Result<u16, L3fwdError> {
        if let Some(&i) = self.port_next_hop.get(&port) {
            return Ok(i);
        }
        let i = self.add_next_hop(NextHop::for_port(port))?;
        self.port_next_hop.insert(port, i);
        Ok(i)
    }

    /// Adds (or replaces) the route `prefix/len` via next hop `next_hop`. Refuses a length
    /// above 32, host bits set past the length, and an unknown next hop.
    pub fn insert(&mut self, prefix: u32, len: u8, next_hop: u16) -> Result<(), L3fwdError> {
        if len > 32 {
            return Err(L3fwdError::BadRoute(format!(
                "prefix length /{len} is above 32"
            )));
        }
        if prefix & !mask(len) != 0 {
            return Err(L3fwdError::BadRoute(format!(
                "{}/{len} has host bits set (did you mean {}/{len}?)",
                Ipv4Addr::from(prefix),
                Ipv4Addr::from(prefix & mask(len))
            )));
        }
        if usize::from(next_hop) >= self.next_hops.len() {
            return Err(L3fwdError::BadRoute(format!(
                "{}/{len} uses next hop {next_hop}, but only {} are defined",
                Ipv4Addr::from(prefix),
                self.next_hops.len()
            )));
        }
        if self.by_len.is_empty() {
            self.by_len = vec![HashMap::new(); 33];
        }
        let new = self.by_len[usize::from(len)]
            .insert(prefix, next_hop)
            .is_none();
        if new && len > 24 {
            *self.long_per_24.entry(prefix >> 8).or_default() += 1;
        }
        if !self.lens.contains(&len) {
            self.lens.push(len);
            self.lens.sort_unstable_by(|a, b| b.cmp(a));
        }
        Ok(())
    }

    /// Removes the route `prefix/len`; its next hop, or `None` if there was no such route.
    /// (The next hop stays defined: other routes, or a later one, may use it.)
    pub fn remove(&mut self, prefix: u32, len: u8) -> Option<u16> {
        let map = self.by_len.get_mut(usize::from(len))?;
        let nh = map.remove(&prefix)?;
        if map.is_empty() {
            self.lens.retain(|&l| l != len);
        }
        if len > 24 {
            if let Some(n) = self.long_per_24.get_mut(&(prefix >> 8)) {
                *n -= 1;
                if *n == 0 {
                    self.long_per_24.remove(&(prefix >> 8));
                }
            }
        }
        Some(nh)
    }

    /// The route `prefix/len`'s next hop, if the table has that route.
    pub fn get(&self, prefix: u32, len: u8) -> Option<u16> {
        self.by_len.get(usize::from(len))?.get(&prefix).copied()
    }

    /// The longest prefix of at most `max_len` bits that contains `addr`: its length and
    /// next hop.
    pub fn lookup_upto(&self, addr: u32, max_len: u8) -> Option<(u8, u16)> {
        self.lens.iter().filter(|&&l| l <= max_len).find_map(|&l| {
            let nh = self.by_len[usize::from(l)].get(&(addr & mask(l)))?;
            Some((l, *nh))
        })
    }

    /// How many routes longer than /24 lie in the /24 of index `i24` (`address >> 8`).
    pub fn long_routes_in(&self, i24: u32) -> u32 {
        self.long_per_24.get(&i24).copied().unwrap_or(0)
    }

    /// The routes of lengths `len + 1 ..= upto` inside `prefix/len`.
    pub fn more_specific(&self, prefix: u32, len: u8, upto: u8) -> Vec<Route> {
        let m = mask(len);
        (len.saturating_add(1)..=upto.min(32))
            .filter(|l| self.lens.contains(l))
            .flat_map(|l| {
                self.by_len[usize::from(l)]
                    .iter()
                    .filter(move |(&p, _)| p & m == prefix)
                    .map(move |(&p, &nh)| Route {
                        prefix: p,
                        len: l,
                        next_hop: nh,
                    })
            })
            .collect()
    }

    /// The index of [`NextHop::for_port`]`(port)` if the table has it already.
    pub fn port_next_hop_index(&self, port: Port) -> Option<u16> {
        self.port_next_hop.get(&port).copied()
    }

    /// Adds (or replaces) `prefix/len` via the default next hop of `port`.
    pub fn insert_port(&mut self, prefix: u32, len: u8, port: Port) -> Result<(), L3fwdError> {
        let nh = self.port_next_hop(port)?;
        self.insert(prefix, len, nh)
    }

    /// Reads the text form (see the type's documentation); errors name the 1-based line.
    /// A prefix given on two lines is refused, naming both: in a file a repeated prefix is
    /// a mistake, and taking either line silently would route its traffic where the other
    /// line says it does not go.
    pub fn parse(text: &str) -> Result<RouteTable, L3fwdError> {
        let mut t = RouteTable::new();
        let mut line_of: HashMap<(u32, u8), usize> = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |reason: String| L3fwdError::Parse { line, reason };
            let body = raw.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            let mut fields = body.split_whitespace();
            let (Some(net), Some(port), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(err(format!("expected `A.B.C.D/LEN PORT`, got `{body}`")));
            };
            let Some((addr, len)) = net.split_once('/') else {
                return Err(err(format!("`{net}` has no `/LEN` prefix length")));
            };
            let addr: Ipv4Addr = addr
                .parse()
                .map_err(|_| err(format!("`{addr}` is not an IPv4 address")))?;
            let len: u8 = len.parse().ok().filter(|l| *l <= 32).ok_or_else(|| {
                err(format!(
                    "prefix length `{len}` is not a number from 0 to 32"
                ))
            })?;
            let port: Port = port
                .parse()
                .map_err(|_| err(format!("port `{port}` is not a number from 0 to 65535")))?;
            t.insert_port(u32::from(addr), len, port)
                .map_err(|e| match e {
                    L3fwdError::BadRoute(r) => err(r),
                    other => err(other.to_string()),
                })?;
            if let Some(first) = line_of.insert((u32::from(addr), len), line) {
                return Err(err(format!(
                    "{addr}/{len} is routed on line {first} already (one line per prefix)"
                )));
            }
        }
        Ok(t)
    }

    /// Reads a route file (see [`RouteTable::parse`]).
    pub fn from_file(path: &std::path::Path) -> Result<RouteTable, L3fwdError> {
        let text = std::fs::read_to_string(path).map_err(|source| L3fwdError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        RouteTable::parse(&text)
    }

    /// `n` distinct random routes over ports `0..ports` (one next hop per port), from
    /// `seed`: about 60% /24, 35% /16 to /23 and 5% /25 to /32, prefixes in
    /// `1.0.0.0`-`223.255.255.255` outside `127.0.0.0/8`. Deterministic.
    pub fn generate(n: usize, ports: u16, seed: u64) -> Result<RouteTable, L3fwdError> {
        Self::check_generated_count(n)?;
        if ports == 0 {
            return Err(L3fwdError::BadRoute("routes need at least one port".into()));
        }
        let mut t = RouteTable::new();
        for p in 0..ports {
            t.port_next_hop(p)?;
        }
        let mut rng = SplitMix64::new(seed);
        let mut attempts = 0usize;
        while t.len() < n {
            attempts += 1;
            if attempts > n.saturating_mul(20).max(1000) {
                return Err(L3fwdError::BadRoute(format!(
                    "could not draw {n} distinct prefixes"
                )));
            }
            let r = rng.below(100);
            let len = if r < 5 {
                25 + rng.below(8) as u8
            } else if r < 40 {
                16 + rng.below(8) as u8
            } else {
                24
            };
            let first = loop {
                let a = 1 + rng.below(223) as u32;
                if a != 127 {
                    break a;
                }
            };
            let addr = (first << 24 | (rng.next_u64() as u32 & 0x00FF_FFFF)) & mask(len);
            if t.by_len[usize::from(len)].contains_key(&addr) {
                continue;
            }
            let nh = rng.below(u64::from(ports)) as u16;
            t.insert(addr, len, nh)?;
        }
        Ok(t)
    }

    /// Refuses a count [`RouteTable::generate`] cannot fit in a DIR-24-8 table: about 5% of
    /// generated routes are longer than /24, nearly each in its own /24, which needs one of
    /// the [`MAX_TBL8_GROUPS`] tbl8 groups; so at most [`MAX_GENERATED_ROUTES`]. (Checked
    /// before drawing anything: drawing that many would take minutes, then fail.)
    pub fn check_generated_count(n: usize) -> Result<(), L3fwdError> {
        if n > MAX_GENERATED_ROUTES {
            return Err(L3fwdError::BadRoute(format!(
                "{n} generated routes cannot fit the DIR-24-8 table's tbl8 memory (about 5% \
                 of them are longer than /24 and each needs one of its {MAX_TBL8_GROUPS} tbl8 \
                 groups); at most {MAX_GENERATED_ROUTES} (or load a route file)"
            )));
        }
        Ok(())
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.by_len.iter().map(HashMap::len).sum()
    }

    /// Whether the table has no route.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next hops, by index.
    pub fn next_hops(&self) -> &[NextHop] {
        &self.next_hops
    }

    /// Every route, sorted by length then prefix.
    pub fn routes(&self) -> Vec<Route> {
        let mut v: Vec<Route> = self
            .by_len
            .iter()
            .enumerate()
            .flat_map(|(len, m)| {
                m.iter().map(move |(&prefix, &next_hop)| Route {
                    prefix,
                    len: len as u8,
                    next_hop,
                })
            })
            .collect();
        v.sort_unstable_by_key(|r| (r.len, r.prefix));
        v
    }

    /// Routes per prefix length (lengths with routes only).
    pub fn length_histogram(&self) -> BTreeMap<u8, usize> {
        self.lens
            .iter()
            .map(|&l| (l, self.by_len[usize::from(l)].len()))
            .collect()
    }

    /// The reference longest-prefix match: the next hop index of the longest prefix that
    /// contains `addr`, by trying each length that holds routes, longest first.
    pub fn lookup(&self, addr: u32) -> Option<u16> {
        self.lens
            .iter()
            .find_map(|&l| self.by_len[usize::from(l)].get(&(addr & mask(l))).copied())
    }

    /// The egress port [`RouteTable::lookup`] leads to.
    pub fn lookup_port(&self, addr: u32) -> Option<Port> {
        self.lookup(addr)
            .map(|nh| self.next_hops[usize::from(nh)].port)
    }
}

impl FromStr for RouteTable {
    type Err = L3fwdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RouteTable::parse(s)
    }
}

// ----- DIR-24-8 ------------------------------------------------------------------------------

/// A DIR-24-8 table in plain host memory, with the exact word layout [`L3fwd::install`]
/// writes to shared memory (see the module documentation); also the table the
/// benchmark's plain loop looks up.
#[derive(Clone)]
pub struct Dir248 {
    tbl24: Vec<u64>,
    tbl8: Vec<u64>,
    groups: usize,
    next_hops: Vec<NextHop>,
}

impl fmt::Debug for Dir248 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dir248")
            .field("tbl8_groups", &self.groups)
            .field("next_hops", &self.next_hops.len())
            .finish_non_exhaustive()
    }
}

#[inline(always)]
fn entry_at(words: &[u64], index: usize) -> u16 {
    (words[index / ENTRIES_PER_WORD] >> ((3 - index % ENTRIES_PER_WORD) * 16)) as u16
}

#[inline(always)]
fn set_entry(words: &mut [u64], index: usize, e: u16) {
    let shift = (3 - index % ENTRIES_PER_WORD) * 16;
    let w = &mut words[index / ENTRIES_PER_WORD];
    *w = (*w & !(0xFFFF << shift)) | (u64::from(e) << shift);
}

/// Sets entries `range` to `e`, whole words at a time where the range covers them.
fn fill(words: &mut [u64], range: std::ops::Range<usize>, e: u16) {
    let mut i = range.start;
    while i < range.end && !i.is_multiple_of(ENTRIES_PER_WORD) {
        set_entry(words, i, e);
        i += 1;
    }
    let whole = u64::from(e) * 0x0001_0001_0001_0001;
    while i + ENTRIES_PER_WORD <= range.end {
        words[i / ENTRIES_PER_WORD] = whole;
        i += ENTRIES_PER_WORD;
    }
    while i < range.end {
        set_entry(words, i, e);
        i += 1;
    }
}

impl Dir248 {
    /// Builds the table of `routes`. Routes are written shortest first, so a longer prefix
    /// overrides a shorter one inside its range whatever order they were added in.
    pub fn build(routes: &RouteTable) -> Result<Dir248, L3fwdError> {
        if routes.next_hops.len() > MAX_NEXT_HOPS {
            return Err(L3fwdError::TooManyNextHops(routes.next_hops.len()));
        }
        let mut tbl24 = vec![0u64; TBL24_WORDS as usize];
        let mut tbl8: Vec<u64> = Vec::new();
        let mut groups = 0usize;
        // routes() is sorted by length: every route of /24 or less is in tbl24 before the
        // first tbl8 group is made from it.
        for r in routes.routes() {
            let e = r.next_hop + 1;
            if r.len <= 24 {
                let first = (r.prefix >> 8) as usize;
                let count = 1usize << (24 - r.len);
                fill(&mut tbl24, first..first + count, e);
                continue;
            }
            let i24 = (r.prefix >> 8) as usize;
            let mut cur = entry_at(&tbl24, i24);
            if cur & ENTRY_TBL8 == 0 {
                if groups == MAX_TBL8_GROUPS {
                    let more = routes
                        .routes()
                        .iter()
                        .filter(|r| r.len > 24)
                        .map(|r| r.prefix >> 8)
                        .collect::<std::collections::HashSet<_>>()
                        .len();
                    return Err(L3fwdError::TooManyTbl8Groups(more));
                }
                let g = groups;
                groups += 1;
                tbl8.resize(groups * TBL8_GROUP_WORDS as usize, 0);
                let base = g * TBL8_GROUP_ENTRIES;
                fill(&mut tbl8, base..base + TBL8_GROUP_ENTRIES, cur);
                cur = ENTRY_TBL8 | g as u16;
                set_entry(&mut tbl24, i24, cur);
            }
            let g = usize::from(cur & !ENTRY_TBL8);
            let first = g * TBL8_GROUP_ENTRIES + (r.prefix & 0xFF) as usize;
            fill(&mut tbl8, first..first + (1 << (32 - r.len)), e);
        }
        Ok(Dir248 {
            tbl24,
            tbl8,
            groups,
            next_hops: routes.next_hops.clone(),
        })
    }

    /// The next hop index for `addr`, as the program finds it (one or two entry reads).
    #[inline]
    pub fn lookup(&self, addr: u32) -> Option<u16> {
        let e = entry_at(&self.tbl24, (addr >> 8) as usize);
        let e = if e & ENTRY_TBL8 != 0 {
            entry_at(
                &self.tbl8,
                usize::from(e & !ENTRY_TBL8) * TBL8_GROUP_ENTRIES + (addr & 0xFF) as usize,
            )
        } else {
            e
        };
        e.checked_sub(1)
    }

    /// tbl24's words.
    pub fn tbl24_words(&self) -> &[u64] {
        &self.tbl24
    }

    /// tbl8's words (groups one after the other).
    pub fn tbl8_words(&self) -> &[u64] {
        &self.tbl8
    }

    /// tbl8 groups in use.
    pub fn tbl8_groups(&self) -> usize {
        self.groups
    }

    /// The next hops, by index.
    pub fn next_hops(&self) -> &[NextHop] {
        &self.next_hops
    }

    /// Bytes of DRAM the table needs: tbl24 plus its tbl8 groups.
    pub fn dram_bytes(&self) -> u64 {
        TBL24_BYTES + self.groups as u64 * TBL8_GROUP_WORDS * WORD_BYTES as u64
    }

    /// Bytes of SRAM the next hops need.
    pub fn sram_bytes(&self) -> u64 {
        self.next_hops.len() as u64 * NEXT_HOP_WORDS * WORD_BYTES as u64
    }
}

/// Writes next hop `i` into the next-hop table at `table`.
fn write_next_hop(mem: &SharedMemory, table: Addr, i: usize, nh: &NextHop) -> Result<(), MemFault> {
    let a = table + i as u64 * NEXT_HOP_WORDS;
    mem.write_u64(a, u64::from(nh.port) << 48 | (nh.dst_mac & MAC_MASK))?;
    mem.write_u64(a + 1, nh.src_mac & MAC_MASK)
}

// ----- the program ---------------------------------------------------------------------------

/// The l3fwd program bound to its tables in shared memory.
#[derive(Clone, Debug)]
pub struct L3fwd {
    tbl24: Addr,
    tbl8: Addr,
    next_hops: Addr,
    tbl8_groups: usize,
    next_hop_count: usize,
    tbl8_capacity: usize,
    next_hop_capacity: usize,
}

/// Room to leave in l3fwd's tables for routes added while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Room {
    /// tbl8 groups beyond those the routes use (each 512 bytes of DRAM).
    pub tbl8_groups: usize,
    /// Next hops beyond those the routes use (each 16 bytes of SRAM).
    pub next_hops: usize,
}

impl L3fwd {
    /// Builds the DIR-24-8 table of `routes` and installs it (see [`L3fwd::install_table`]).
    pub fn install(mem: &SharedMemory, routes: &RouteTable) -> Result<L3fwd, L3fwdError> {
        L3fwd::install_table(mem, &Dir248::build(routes)?)
    }

    /// [`L3fwd::install`] with room for `room` more tbl8 groups and next hops than the
    /// routes need now, for routes added while the program runs ([`live::LiveRoutes`]).
    pub fn install_with_room(
        mem: &SharedMemory,
        routes: &RouteTable,
        room: Room,
    ) -> Result<L3fwd, L3fwdError> {
        L3fwd::install_table_with_room(mem, &Dir248::build(routes)?, room)
    }

    /// Allocates tbl24 and tbl8 in `mem`'s DRAM and the next hops in its SRAM (under
    /// [`TBL24_REGION`], [`TBL8_REGION`] and [`NEXT_HOP_REGION`], so once per memory) and
    /// writes `table` there. Fails with [`L3fwdError::Memory`] when a region is too small.
    pub fn install_table(mem: &SharedMemory, table: &Dir248) -> Result<L3fwd, L3fwdError> {
        L3fwd::install_table_with_room(mem, table, Room::default())
    }

    /// [`L3fwd::install_table`] with `room` to spare in tbl8 and the next hops.
    pub fn install_table_with_room(
        mem: &SharedMemory,
        table: &Dir248,
        room: Room,
    ) -> Result<L3fwd, L3fwdError> {
        if room.tbl8_groups > MAX_TBL8_GROUPS || room.next_hops > MAX_NEXT_HOPS {
            return Err(L3fwdError::BadRoute(format!(
                "room for {} tbl8 groups and {} next hops: at most {MAX_TBL8_GROUPS} and \
                 {MAX_NEXT_HOPS}",
                room.tbl8_groups, room.next_hops
            )));
        }
        let groups = (table.groups + room.tbl8_groups).min(MAX_TBL8_GROUPS);
        let hops = (table.next_hops.len() + room.next_hops).min(MAX_NEXT_HOPS);
        let dram = mem.region(Region::Dram);
        let have = (dram.end - dram.start) * WORD_BYTES as u64;
        let need = TBL24_BYTES + groups as u64 * TBL8_GROUP_WORDS * WORD_BYTES as u64;
        if have < need {
            return Err(L3fwdError::Memory {
                table: "tbl24 + tbl8",
                bytes: need,
                source: AllocError::Exhausted {
                    region: Region::Dram,
                    requested: need / WORD_BYTES as u64,
                    available: have / WORD_BYTES as u64,
                },
            });
        }
        let tbl24 = mem
            .alloc(TBL24_REGION, Region::Dram, TBL24_WORDS)
            .map_err(|source| L3fwdError::Memory {
                table: "tbl24",
                bytes: TBL24_BYTES,
                source,
            })?;
        // One group at least, so the region exists even without routes longer than /24.
        let tbl8_words = (groups as u64 * TBL8_GROUP_WORDS).max(TBL8_GROUP_WORDS);
        let tbl8 = mem
            .alloc(TBL8_REGION, Region::Dram, tbl8_words)
            .map_err(|source| L3fwdError::Memory {
                table: "tbl8",
                bytes: tbl8_words * WORD_BYTES as u64,
                source,
            })?;
        let nh_words = (hops as u64 * NEXT_HOP_WORDS).max(NEXT_HOP_WORDS);
        let next_hops = mem
            .alloc(NEXT_HOP_REGION, Region::Sram, nh_words)
            .map_err(|source| L3fwdError::Memory {
                table: "next hops",
                bytes: nh_words * WORD_BYTES as u64,
                source,
            })?;
        // Fresh DRAM reads as zero: write only the words that hold entries.
        for (i, &w) in table.tbl24.iter().enumerate() {
            if w != 0 {
                mem.write_u64(tbl24 + i as u64, w)?;
            }
        }
        for (i, &w) in table.tbl8.iter().enumerate() {
            if w != 0 {
                mem.write_u64(tbl8 + i as u64, w)?;
            }
        }
        for (i, nh) in table.next_hops.iter().enumerate() {
            write_next_hop(mem, next_hops, i, nh)?;
        }
        Ok(L3fwd {
            tbl24,
            tbl8,
            next_hops,
            tbl8_groups: table.groups,
            next_hop_count: table.next_hops.len(),
            tbl8_capacity: (tbl8_words / TBL8_GROUP_WORDS) as usize,
            next_hop_capacity: (nh_words / NEXT_HOP_WORDS) as usize,
        })
    }

    /// tbl8 groups the installed region holds (those in use and the room left).
    pub fn tbl8_capacity(&self) -> usize {
        self.tbl8_capacity
    }

    /// Next hops the installed region holds.
    pub fn next_hop_capacity(&self) -> usize {
        self.next_hop_capacity
    }

    /// Where tbl24 starts.
    pub fn tbl24_addr(&self) -> Addr {
        self.tbl24
    }

    /// Where tbl8 starts.
    pub fn tbl8_addr(&self) -> Addr {
        self.tbl8
    }

    /// Where the next-hop table starts.
    pub fn next_hop_addr(&self) -> Addr {
        self.next_hops
    }

    /// tbl8 groups installed.
    pub fn tbl8_groups(&self) -> usize {
        self.tbl8_groups
    }

    /// Next hops installed.
    pub fn next_hop_count(&self) -> usize {
        self.next_hop_count
    }

    /// Builds the Microcode program.
    pub fn program(&self) -> Program {
        self.builder()
            .build()
            .expect("l3fwd defines every label it declares")
    }

    /// The program's instructions and packet entry in a builder, for a program that adds
    /// its own.
    pub fn builder(&self) -> ProgramBuilder {
        let (tbl24, tbl8, nh_base) = (self.tbl24, self.tbl8, self.next_hops);
        let mut p = Program::builder("l3fwd");
        p.drop_reasons::<L3Drop>();
        pfemu::labels!(p => parse, lookup_tbl8, rewrite);

        // Validate Ethernet/IPv4 and read the destination's tbl24 word.
        p.instr(parse, move |t| {
            let dst = match check_ipv4(t.head(0)?, t.pkt_len()) {
                Ok(dst) => dst,
                Err(reason) => return drop_as(reason),
            };
            let slot = u64::from(dst >> 8);
            let e = entry_in_word(t.read_u64(tbl24 + slot / 4)?, slot);
            t.set(DST, dst);
            if e & ENTRY_TBL8 != 0 {
                t.set(GROUP, e & !ENTRY_TBL8);
                return Ok(Goto(lookup_tbl8));
            }
            if e == 0 {
                return drop_as(L3Drop::NoRoute);
            }
            t.set(HOP, e - 1);
            Ok(Goto(rewrite))
        });

        // A route longer than /24: the entry for the low 8 bits in the /24's group.
        p.instr(lookup_tbl8, move |t| {
            let slot = u64::from(t.get(GROUP)) << 8 | u64::from(t.get(DST) & 0xFF);
            let e = entry_in_word(t.read_u64(tbl8 + slot / 4)?, slot);
            if e == 0 {
                return drop_as(L3Drop::NoRoute);
            }
            t.set(HOP, e - 1);
            Ok(Goto(rewrite))
        });

        // Read the next hop; TTL - 1 with the checksum updated (RFC 1624); MACs; forward.
        p.instr(rewrite, move |t| {
            let at = nh_base + u64::from(t.get(HOP)) * NEXT_HOP_WORDS;
            t.mem_read(at, SCRATCH_LM, NEXT_HOP_REC_LEN)?;
            let nh = NextHopRec::new_checked(t.lm_bytes(SCRATCH_LM, NEXT_HOP_REC_LEN)?)?;
            let (port, dst_mac, src_mac) = (nh.port(), nh.dst_mac(), nh.src_mac());
            rewrite_head(
                t.head_mut(0)?,
                &dst_mac.to_be_bytes()[2..],
                &src_mac.to_be_bytes()[2..],
            );
            Ok(Done(Verdict::Forward(port)))
        });
        p.entry(Entry::Packet, parse);
        p
    }
}

/// Entry `slot % 4` of a table word (entries are packed big-endian, four to a word).
#[inline(always)]
fn entry_in_word(word: u64, slot: u64) -> u16 {
    // The shift leaves the entry in the low 16 bits; the cast keeps exactly them.
    (word >> ((3 - slot % 4) * 16)) as u16
}

/// l3fwd's checks before the lookup, in order, on a head (`h`, from the Ethernet header) of
/// a frame of `pkt_len` bytes: the IPv4 destination, or the reason of the first check that
/// failed. The program runs it; so does any plain re-implementation (the benchmark's
/// baseline loop), so both drop for the same reasons.
#[inline]
pub fn check_ipv4(h: &[u8], pkt_len: usize) -> Result<u32, L3Drop> {
    let Ok(eth) = Ether::new_checked(h) else {
        return Err(L3Drop::NonIpv4);
    };
    if eth.etype() != ETHERTYPE_IPV4 {
        return Err(L3Drop::NonIpv4);
    }
    let Ok(ip) = Ipv4::new_checked(eth.rest()) else {
        return Err(L3Drop::Truncated);
    };
    if ip.ver() != 4 {
        return Err(L3Drop::BadVersion);
    }
    let hl = ip.header_len();
    if hl < IPV4_LEN {
        return Err(L3Drop::BadIhl);
    }
    if ETHER_LEN + hl > h.len() {
        return Err(L3Drop::Truncated);
    }
    let total = usize::from(ip.total_len());
    if total < hl || total > pkt_len - ETHER_LEN {
        return Err(L3Drop::BadLength);
    }
    if !header_checksum_ok(&h[ETHER_LEN..ETHER_LEN + hl]) {
        return Err(L3Drop::BadChecksum);
    }
    if ip.ttl() <= 1 {
        return Err(L3Drop::TtlExceeded);
    }
    Ok(ip.dst())
}

/// The forwarding rewrite of a head that passed [`check_ipv4`]: destination and source MAC,
/// TTL - 1 with the header checksum updated incrementally (RFC 1624).
#[inline]
pub fn rewrite_head(h: &mut [u8], dst_mac: &[u8], src_mac: &[u8]) {
    h[0..6].copy_from_slice(dst_mac);
    h[6..12].copy_from_slice(src_mac);
    let ip = &mut h[ETHER_LEN..];
    let old = u16::from_be_bytes([ip[8], ip[9]]);
    ip[8] -= 1;
    let new = u16::from_be_bytes([ip[8], ip[9]]);
    let sum = checksum_update16(u16::from_be_bytes([ip[10], ip[11]]), old, new);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
}

const MAC_MASK: u64 = (1 << 48) - 1;

/// Whether an IPv4 header (`header.len()` a multiple of 4, the whole `ihl * 4` bytes)
/// carries a correct checksum: the ones-complement sum of its 16-bit words, taken 32 bits
/// at a time and folded (RFC 1071 section 2(B)), is `0xFFFF`. The same answer as
/// [`checksum`](pfemu::wire::checksum)`(header) == 0`, in fewer steps.
///
/// ```
/// let frame = pfemu::microcode::l3fwd::udp_frame([10, 0, 0, 1], 64, 64);
/// assert!(pfemu::microcode::l3fwd::header_checksum_ok(&frame[14..34]));
/// ```
#[inline]
pub fn header_checksum_ok(header: &[u8]) -> bool {
    let mut sum: u64 = header
        .chunks_exact(4)
        .map(|w| u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
        .sum();
    sum = (sum & 0xFFFF_FFFF) + (sum >> 32);
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum == 0xFFFF && header.len().is_multiple_of(4) && !header.is_empty()
}

#[inline(always)]
fn drop_as(reason: L3Drop) -> InstrResult {
    Ok(Done(Verdict::Drop(reason.into())))
}

/// A valid Ethernet/IPv4/UDP frame of `size` bytes (at least 42) to `dst` with TTL `ttl`,
/// from `10.0.0.1` port 1024 to port 5000, header checksum filled: for examples and tests.
///
/// # Panics
/// If `size < 42`.
pub fn udp_frame(dst: [u8; 4], size: usize, ttl: u8) -> Vec<u8> {
    let mut f = vec![0u8; size];
    write_udp_frame(&mut f, u32::from_be_bytes(dst), 0x0A00_0001, 1024, ttl);
    f
}

/// Writes an Ethernet/IPv4/UDP frame filling `frame` (at least 42 bytes) to `dst` from
/// `src`/`src_port` to port 5000 with TTL `ttl` and a correct header checksum; the payload
/// bytes are left as they are.
///
/// # Panics
/// If the frame is shorter than 42 bytes.
pub fn write_udp_frame(frame: &mut [u8], dst: u32, src: u32, src_port: u16, ttl: u8) {
    let size = frame.len();
    frame[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    frame[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let mut ip = Ipv4::new_unchecked(&mut frame[ETHER_LEN..]);
    ip.set_ver(4);
    ip.set_ihl(5);
    ip.set_total_len((size - ETHER_LEN) as u16);
    ip.set_df(true);
    ip.set_ttl(ttl);
    ip.set_proto(IPPROTO_UDP);
    ip.set_src(src);
    ip.set_dst(dst);
    ip.set_checksum(0);
    ip.fill_checksum();
    let mut udp = Udp::new_unchecked(&mut frame[ETHER_LEN + IPV4_LEN..]);
    udp.set_src_port(src_port);
    udp.set_dst_port(5000);
    udp.set_len((size - ETHER_LEN - IPV4_LEN) as u16);
    udp.set_checksum(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfemu::wire::checksum;

    #[test]
    fn mask_and_contains() {
        assert_eq!(mask(0), 0);
        assert_eq!(mask(8), 0xFF00_0000);
        assert_eq!(mask(32), u32::MAX);
        let r = Route {
            prefix: 0x0A01_0200,
            len: 24,
            next_hop: 0,
        };
        assert!(r.contains(0x0A01_02FF) && !r.contains(0x0A01_0300));
    }

    #[test]
    fn fill_sets_exactly_the_range() {
        for start in 0..9 {
            for end in start..13 {
                let mut w = vec![0u64; 4];
                fill(&mut w, start..end, 0xABCD);
                for i in 0..16 {
                    let want = if (start..end).contains(&i) { 0xABCD } else { 0 };
                    assert_eq!(entry_at(&w, i), want, "{start}..{end} at {i}");
                }
            }
        }
    }

    #[test]
    fn entries_are_big_endian_in_their_word() {
        let mut w = vec![0u64; 1];
        set_entry(&mut w, 0, 0x1122);
        set_entry(&mut w, 3, 0x7788);
        assert_eq!(w[0], 0x1122_0000_0000_7788);
    }

    #[test]
    fn fast_checksum_check_agrees_with_rfc1071() {
        let mut rng = SplitMix64::new(3);
        for i in 0..20_000 {
            let len = 20 + 4 * (i % 11);
            let mut h: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if i % 2 == 0 {
                // Make it valid.
                h[10] = 0;
                h[11] = 0;
                let c = checksum(&h);
                h[10..12].copy_from_slice(&c.to_be_bytes());
            }
            assert_eq!(header_checksum_ok(&h), checksum(&h) == 0, "{h:?}");
        }
        assert!(!header_checksum_ok(&[0u8; 20]));
        assert!(header_checksum_ok(&[0xFFu8; 20]) == (checksum(&[0xFFu8; 20]) == 0));
    }

    #[test]
    fn groups_inherit_the_covering_route_whatever_the_order() {
        let mut t = RouteTable::new();
        t.insert_port(0x0A01_0280, 25, 2).unwrap();
        t.insert_port(0x0A00_0000, 8, 1).unwrap();
        t.insert_port(0x0A01_0200, 24, 3).unwrap();
        let d = Dir248::build(&t).unwrap();
        assert_eq!(d.tbl8_groups(), 1);
        let port = |a: u32| d.lookup(a).map(|nh| d.next_hops()[usize::from(nh)].port);
        assert_eq!(port(0x0A01_0281), Some(2));
        assert_eq!(port(0x0A01_027F), Some(3));
        assert_eq!(port(0x0A01_0300), Some(1));
        assert_eq!(port(0x0B00_0000), None);
        assert_eq!(d.dram_bytes(), TBL24_BYTES + 512);
    }

    #[test]
    fn insert_refuses_impossible_routes() {
        let mut t = RouteTable::new();
        assert!(matches!(t.insert(0, 33, 0), Err(L3fwdError::BadRoute(_))));
        assert!(matches!(t.insert(0, 8, 0), Err(L3fwdError::BadRoute(_))));
        let nh = t.port_next_hop(4).unwrap();
        assert_eq!(t.port_next_hop(4).unwrap(), nh);
        let e = t.insert(0x0A00_0001, 8, nh).unwrap_err();
        assert!(e.to_string().contains("10.0.0.0/8"), "{e}");
    }
}
