//! # pfemu: an emulator of a Trio-like Packet Forwarding Engine
//!
//! pfemu runs Microcode-like programs, written as Rust closures, the way Juniper's Trio
//! chipset runs them (Yang et al., SIGCOMM 2022): to completion, one packet per thread, on
//! hundreds of threads that share a banked memory with read-modify-write engines.
//!
//! The crate is laid out in the order a packet meets the blocks:
//!
//! ```text
//! port --> ingress: split head (first 192 B) / tail (packet buffer), classify the flow,
//!          stamp a per-flow sequence number                         [pfe::Pfe::inject]
//!      --> dispatch: batches of heads to whichever PPE thread is free [pfe (dispatch)]
//!      --> PPE thread: the program runs to completion on the head in local memory,
//!          issuing XTXNs to shared memory and the tail               [program, mem]
//!      --> reorder engine: hold until earlier packets of the flow left [pfe (reorder)]
//!      --> egress: rejoin head and tail, per-port queues, sink        [pfe (egress)]
//! timers --> launcher on the engine's clock --> dispatch, ahead of packets
//!          --> a timer thread at the program's timer entry on any PPE thread [timer]
//! ```
//!
//! The engine, lowest layer first; each module depends only on those above it:
//!
//! - [`error`], [`duration`], [`limits`], [`rng`]: configuration errors, durations given as
//!   float seconds, sizes checked against the memory available, and the one seeded
//!   pseudo-random generator.
//! - [`wire`]: header views generated from Microcode-style bit-field structs.
//! - [`packet`]: frames, ports, destinations.
//! - [`fpisa`]: FPISA floating-point addition with integer shifts and adds (FP32, FP16,
//!   BF16), into exponent + mantissa accumulators that fit one memory word each.
//! - [`fabric`]: the switch fabric between PFEs as a cycle-level model: Hipernetch's
//!   combined parallel round-robin arbiter (CPRR), the output-queued crossbar and VOQ
//!   crossbars with PIM, RRM, iSLIP, DRRM and EDRRM; the paper's traffic models, latency
//!   equations and a seeded runner.
//! - [`pipeline`]: programs as operation dependency graphs for pipelines (RMT, dRMT), the
//!   architectures' parameters, the validators of dRMT schedules and RMT stage plans, the
//!   schedulers (heuristics, the paper's ILP), and a cycle-level simulator of both.
//! - [`mem`]: the shared memory system: SRAM/DRAM regions, banks, RMW engines, posted
//!   XTXNs, the hash engine ([`mem::hash`]) and the ternary match block ([`mem::tcam`]).
//! - [`timer`]: periodic timers (N staggered, each owning a slice of work) and a
//!   replaceable clock ([`timer::ManualClock`] for deterministic tests).
//! - [`program`]: the program model: labelled instructions, registers, local memory, faults.
//! - [`ada`]: ADA's lookup-table arithmetic: the binning trie that learns the operands'
//!   distribution (Algorithms 1-2), the TCAM population that follows it (Algorithm 3),
//!   square, sqrt, log2, mul and div by ternary lookup with the prior work's uniform
//!   population for comparison, and ADA as a PFE block: tables in ternary match blocks
//!   looked up as XTXNs, and the controller run by a program's timer entry.
//! - [`pfe`]: the engine: builder ([`pfe::Config`]), lifecycle, ingress, dispatch, PPE
//!   threads, reorder, egress ([`pfe::Sink`]), stats, timer threads, and a [`pfe::Chassis`]
//!   of PFEs joined by links. Every public type has one path, `pfe::Name`.
//!
//! On the engine:
//!
//! - [`microcode`]: the shipped programs, written against the public API only (CI compiles
//!   them as a crate of their own, `microcode/Cargo.toml`, as a user's program would be): the
//!   paper's packet filter, l3fwd, Trio-ML (in-network aggregation with straggler mitigation,
//!   and its end-host library) and FPISA aggregation.
//! - `lab` (the default feature `lab`): traffic generation, the benchmarks behind
//!   `pfemu bench`, the experiments behind `pfemu experiment`, plots, replay of captures and
//!   the UDP front end behind `pfemu serve`, and the `pfemu` command itself.
//!
//! ## Writing a program
//!
//! A program is labelled instructions, each a closure over the thread context that says
//! what the sequencer does next. Everything is named once: labels with
//! [`labels!`], registers with [`registers!`] (typed, no slot numbers), drop reasons with
//! [`drop_reasons!`] (an enum, counted by name), headers and shared-memory records with
//! [`header!`] (the view, its length and the word/shift/mask of every field for
//! read-modify-write XTXNs, from one description):
//!
//! ```
//! use std::sync::Arc;
//! use pfemu::prelude::*;
//! use pfemu::program::Harness;
//! use pfemu::wire::{Ether, Ipv4, ETHERTYPE_IPV4, ETHER_LEN};
//!
//! pfemu::header! {
//!     /// Per-port counters in shared memory: packets, then a bit set of TTLs seen.
//!     pub struct PortStats {
//!         packets: 32,
//!         _: 32,
//!         ttl_seen: [64; 4],
//!     }
//! }
//!
//! pfemu::registers! {
//!     /// The packet's TTL.
//!     TTL: u8,
//!     /// Its port's record.
//!     RECORD: Addr,
//! }
//!
//! pfemu::drop_reasons! {
//!     /// Why the program drops a packet.
//!     pub enum Why {
//!         /// Not IPv4.
//!         NotIp = "not_ip",
//!         /// The TTL ran out.
//!         Expired = "expired",
//!     }
//! }
//!
//! /// Words of a port's record (the records are back to back from `stats`).
//! const RECORD_WORDS: u64 = PORT_STATS_LEN as u64 / 8;
//!
//! fn ttl_counter(stats: Addr) -> Program {
//!     let mut p = Program::builder("ttl_counter");
//!     p.drop_reasons::<Why>();
//!     pfemu::labels!(p => parse, count);
//!     p.instr(parse, move |t| {
//!         if t.view::<Ether>(0)?.etype() != ETHERTYPE_IPV4 {
//!             return Ok(Done(Verdict::Drop(Why::NotIp.into())));
//!         }
//!         let ttl = t.view::<Ipv4>(ETHER_LEN)?.ttl();
//!         if ttl <= 1 {
//!             return Ok(Done(Verdict::Drop(Why::Expired.into())));
//!         }
//!         t.set(TTL, ttl);
//!         t.set(RECORD, stats + u64::from(t.port()) * RECORD_WORDS);
//!         Ok(Goto(count))
//!     });
//!     p.instr(count, move |t| {
//!         // Two RMW XTXNs on the record, at the words its layout says.
//!         const PACKETS: pfemu::wire::Field = PortStatsLayout::PACKETS;
//!         let rec = t.get(RECORD);
//!         t.fetch_add32(rec + PACKETS.word(), PACKETS.lane(), 1)?;
//!         let seen = PortStatsLayout::TTL_SEEN.bit(usize::from(t.get(TTL)));
//!         t.fetch_or(rec + seen.word(), seen.mask())?;
//!         Ok(Done(Verdict::Forward(1)))
//!     });
//!     p.entry(Entry::Packet, parse);
//!     p.build().expect("every label is defined")
//! }
//!
//! let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
//! let stats = mem.alloc("ttl_counter", Region::Sram, 4 * RECORD_WORDS)?;
//! let program = ttl_counter(stats);
//! let mut frame = vec![0u8; 64];
//! frame[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
//! frame[14] = 0x45;
//! frame[22] = 64; // TTL
//! let mut h = Harness::new(mem.clone());
//! assert_eq!(h.run(&program, 0, &frame).result, Ok(Verdict::Forward(1)));
//! assert_eq!(mem.read_u64(stats)? >> 32, 1);
//! // TTL 64 is bit 0 of `ttl_seen[1]`, the last bit of the record's word 2.
//! assert_eq!(mem.read_u64(stats + 2)?, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Features
//!
//! - `lab` (default): the lab and the `pfemu` binary, with their dependencies (clap, plotters,
//!   indicatif, pcap-file, socket2, ctrlc, serde_json). An embedder that only runs a `Pfe`
//!   turns it off: `pfemu = { version = "0.1", default-features = false }` builds the engine
//!   and the shipped programs with crossbeam, parking_lot, core_affinity, hashbrown, paste and
//!   hdrhistogram alone.
//! - `serde` (on with `lab`): `Serialize` for the engine's reports ([`Stats`] and the
//!   programs' counters).
//!
//! ## Embedding
//!
//! ```
//! use std::sync::Arc;
//! use pfemu::prelude::*;
//! use pfemu::microcode::filter::Filter;
//!
//! // Shared memory first, so the program can be built with the counters' address.
//! let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
//! let filter = Filter::install(&mem)?;
//! let sink = Arc::new(CountingSink::new(4));
//! let mut pfe = Pfe::builder()
//!     .program(filter.program())
//!     .memory(mem)
//!     .ppe_threads(4)
//!     .sink(sink.clone())
//!     .build()?;
//! pfe.start()?;
//!
//! // One plain IPv4 frame (forwarded) and one ARP frame (dropped and counted).
//! let mut ip = vec![0u8; 64];
//! ip[12..14].copy_from_slice(&[0x08, 0x00]);
//! ip[14] = 0x45;
//! let mut arp = vec![0u8; 60];
//! arp[12..14].copy_from_slice(&[0x08, 0x06]);
//! pfe.inject(Packet::new(0, ip))?;
//! pfe.inject(Packet::new(0, arp))?;
//! pfe.drain();
//!
//! assert_eq!(sink.total_packets(), 1);
//! assert_eq!(filter.counts(pfe.memory())?.non_ip, (1, 60));
//! let stats = pfe.shutdown();
//! assert!(stats.is_conserved());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod ada;
pub mod duration;
pub mod error;
pub mod fabric;
pub mod fpisa;
mod isa;
pub mod limits;
pub mod mem;
pub mod packet;
pub mod pfe;
pub mod pipeline;
pub mod program;
pub mod rng;
pub(crate) mod sync;
pub mod timer;
pub mod wire;

#[path = "../microcode/mod.rs"]
pub mod microcode;

#[cfg(feature = "lab")]
pub mod lab;

// The shipped programs name the engine `pfemu::...`, as a user's program does, so that the same
// files compile inside this crate and as a crate of their own against the public API alone.
extern crate self as pfemu;

pub use error::ConfigError;
pub use packet::{Dest, GroupId, Packet, Port};
pub use pfe::{Pfe, PfeBuilder, Stats};
pub use program::{Program, Thread};

/// Everything a program or an embedding application usually needs.
pub mod prelude {
    pub use crate::mem::hash::HashTable;
    pub use crate::mem::{Addr, Color, MemConfig, Op, PolicerConfig, Region, SharedMemory};
    pub use crate::packet::{Dest, GroupId, Packet, Port};
    pub use crate::pfe::{
        ChannelSink, CountingSink, Discard, FlowClassifier, FnSink, Frames, Pfe, Sink, Stats,
    };
    pub use crate::program::{
        Call, Done, DropReason, DropReasons, Entry, Fault, FaultDetail, FaultKind, Goto,
        InstrResult, Label, Next, Program, Reg, Return, Step, Thread, Verdict, Yield, IR0, IR1,
        IR2, IR3, IR4, IR5, IR6, IR7,
    };
    pub use crate::wire::Header;
    pub use crate::ConfigError;
}

/// The README's examples, compiled and run as doc tests.
#[cfg(all(doctest, feature = "lab"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
