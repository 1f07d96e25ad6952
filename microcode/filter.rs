//! The paper's packet filter (§3.2, Figures 5 and 6): forward IPv4 packets without options;
//! drop non-IP packets and IPv4 packets with options, counting each class on a 16-byte
//! packet/byte counter in shared memory.
//!
//! ```text
//! process_ether --etype == 0x0800--> process_ip --ver 4, ihl 5--> forward_packet
//!       | REASON = NonIp                  | REASON = IpOptions (or Truncated)
//!       +-------------> count_dropped <---+
//!                            | CounterIncPhys(DROP_CNT_BASE + REASON * 2, pkt_len)
//!                            v
//!                       drop_packet
//! ```
//!
//! Counter layout (Figure 6): the non-IP counter at `DROP_CNT_BASE` (packets, then bytes),
//! the IP-options counter at `DROP_CNT_BASE + 2`; addresses are in 8-byte words. The
//! register `REASON` plays the paper's `ir0`: it holds the [`FilterDrop`] reason, whose
//! index picks the counter.
//!
//! One addition to the paper: a frame whose EtherType says IPv4 but which is too short to
//! hold the 20-byte IPv4 header (14 to 33 bytes; shorter ones are runts at ingress) has no
//! Version or IHL to read. The paper does not say what happens to it; here `process_ip`
//! drops it as [`FilterDrop::Truncated`] on a third counter at `DROP_CNT_BASE + 4`, so a
//! malformed frame is counted like the other drops instead of faulting the thread.

use pfemu::mem::{Addr, AllocError, MemFault, Op, Region, SharedMemory};
use pfemu::packet::Port;
use pfemu::prelude::*;
use pfemu::program::ProgramBuilder;
use pfemu::wire::{Ether, Ipv4, ETHERTYPE_IPV4, ETHER_LEN};

/// Name of the filter's counter region in the shared-memory allocator.
pub const COUNTER_REGION: &str = "filter.drop_counters";
/// Words the three packet/byte counters take (the paper's two, then `truncated`).
pub const COUNTER_WORDS: u64 = 6;
/// Port the filter forwards to by default.
pub const DEFAULT_OUT_PORT: Port = 1;

/// The filter's counters, as (packets, bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FilterCounts {
    /// Non-IP packets dropped (counter at `DROP_CNT_BASE`).
    pub non_ip: (u64, u64),
    /// IPv4 packets with options dropped (counter at `DROP_CNT_BASE + 2`).
    pub ip_options: (u64, u64),
    /// IPv4 frames too short for the IPv4 header dropped (counter at `DROP_CNT_BASE + 4`;
    /// not in the paper, see the module doc).
    pub truncated: (u64, u64),
}

/// The filter program bound to its counters' address.
#[derive(Clone, Debug)]
pub struct Filter {
    drop_cnt_base: Addr,
    out_port: Port,
}

impl Filter {
    /// Allocates the counters in `mem`'s SRAM and returns the filter using them.
    pub fn install(mem: &SharedMemory) -> Result<Filter, AllocError> {
        let base = mem.alloc(COUNTER_REGION, Region::Sram, COUNTER_WORDS)?;
        Ok(Filter::at(base))
    }

    /// The filter with its counters at `drop_cnt_base` ([`COUNTER_WORDS`] words the caller
    /// owns).
    pub fn at(drop_cnt_base: Addr) -> Filter {
        Filter {
            drop_cnt_base,
            out_port: DEFAULT_OUT_PORT,
        }
    }

    /// Forward accepted packets to `port` instead of [`DEFAULT_OUT_PORT`].
    pub fn out_port(mut self, port: Port) -> Self {
        self.out_port = port;
        self
    }

    /// Where the counters are (the paper's `DROP_CNT_BASE`).
    pub fn drop_cnt_base(&self) -> Addr {
        self.drop_cnt_base
    }

    /// Reads both counters.
    pub fn counts(&self, mem: &SharedMemory) -> Result<FilterCounts, MemFault> {
        Ok(FilterCounts {
            non_ip: mem.counter_read(self.drop_cnt_base)?,
            ip_options: mem.counter_read(self.drop_cnt_base + 2)?,
            truncated: mem.counter_read(self.drop_cnt_base + 4)?,
        })
    }

    /// Builds the Microcode program.
    pub fn program(&self) -> Program {
        self.builder()
            .build()
            .expect("the filter defines every label it declares")
    }

    /// The filter's instructions and packet entry in a builder, for a program that adds
    /// its own (e.g. a timer entry).
    pub fn builder(&self) -> ProgramBuilder {
        let drop_cnt_base = self.drop_cnt_base;
        let out_port = self.out_port;
        let mut p = Program::builder("filter");
        p.drop_reasons::<FilterDrop>();
        pfemu::labels!(p => process_ether, process_ip, count_dropped, forward_packet, drop_packet);

        p.instr(process_ether, move |t| {
            t.set(REASON, FilterDrop::NonIp.into());
            let ether = t.view::<Ether>(0)?;
            if ether.etype() == ETHERTYPE_IPV4 {
                return Ok(Goto(process_ip));
            }
            Ok(Goto(count_dropped))
        });
        p.instr(process_ip, move |t| {
            // No IPv4 header to read: a malformed frame, dropped and counted, not a fault.
            let Ok(ipv4) = t.view::<Ipv4>(ETHER_LEN) else {
                return Ok(truncated(t, count_dropped));
            };
            let plain = ipv4.ver() == 4 && ipv4.ihl() == 5;
            t.set(REASON, FilterDrop::IpOptions.into());
            if plain {
                return Ok(Goto(forward_packet));
            }
            Ok(Goto(count_dropped))
        });
        p.instr(count_dropped, move |t| {
            // The counters sit in reason order, two words (packets, bytes) each.
            let addr = drop_cnt_base + t.get(REASON).index() as u64 * 2;
            // CounterIncPhys as an asynchronous XTXN: the thread does not wait for it.
            t.post(Op::CounterInc {
                addr,
                bytes: t.pkt_len() as u64,
            })?;
            Ok(Goto(drop_packet))
        });
        p.instr(forward_packet, move |_t| {
            Ok(Done(Verdict::Forward(out_port)))
        });
        p.instr(drop_packet, move |t| Ok(Done(Verdict::Drop(t.get(REASON)))));
        p.entry(Entry::Packet, process_ether);
        p
    }
}

/// `process_ip`'s way out for a frame too short for its IPv4 header: out of line, so that
/// the packets with one do not pay for it.
#[cold]
#[inline(never)]
fn truncated(t: &mut Thread<'_>, count_dropped: Label) -> Next {
    t.set(REASON, FilterDrop::Truncated.into());
    Goto(count_dropped)
}

pfemu::drop_reasons! {
    /// Why the filter drops a packet; each has its counter (Figure 6).
    pub enum FilterDrop {
        /// Not IPv4 (the counter at `DROP_CNT_BASE`).
        NonIp = "non_ip",
        /// IPv4 with options (the counter at `DROP_CNT_BASE + 2`).
        IpOptions = "ip_options",
        /// An IPv4 EtherType on a frame too short for the IPv4 header (the counter at
        /// `DROP_CNT_BASE + 4`; not in the paper).
        Truncated = "truncated",
    }
}

pfemu::registers! {
    /// Why the packet is being dropped (the paper's `ir0`); it also picks the counter.
    REASON: DropReason,
}
