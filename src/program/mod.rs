//! The Microcode program model: labelled instructions written as Rust closures.
//!
//! Trio Microcode is C-like with explicit instruction boundaries, labels, gotos and
//! call/return nested up to eight deep (paper §2.2, §3.1). Here a program is a list of
//! *instructions*, each a closure that receives the thread context ([`Thread`]) and returns
//! what the sequencer does next ([`Next`]):
//!
//! ```
//! use pfemu::prelude::*;
//!
//! pfemu::registers! {
//!     /// The packet's length.
//!     LEN: usize,
//! }
//! pfemu::drop_reasons! {
//!     /// Why `tiny` drops a packet.
//!     enum TinyDrop {
//!         /// Shorter than a minimum Ethernet frame.
//!         TooShort = "too_short",
//!     }
//! }
//!
//! let mut p = Program::builder("tiny");
//! p.drop_reasons::<TinyDrop>();
//! pfemu::labels!(p => start, done);
//! p.instr(start, move |t| {
//!     t.set(LEN, t.pkt_len());
//!     Ok(if t.get(LEN) >= 64 { Goto(done) } else { Done(Verdict::Drop(TinyDrop::TooShort.into())) })
//! });
//! p.instr(done, |_t| Ok(Done(Verdict::Forward(1))));
//! p.entry(Entry::Packet, start);
//! let program = p.build().expect("every label is defined");
//! assert_eq!(program.name(), "tiny");
//! ```
//!
//! The authoring macros ([`labels!`](crate::labels), [`registers!`](crate::registers),
//! [`drop_reasons!`](crate::drop_reasons)) name everything once; the crate's top doc has
//! a whole program written with them. The raw forms remain: [`Thread::r`] and
//! [`IR0`]..[`IR7`], [`ProgramBuilder::label`], [`ProgramBuilder::drop_reason`].
//!
//! Labels are declared first (so instructions can jump forward) and resolved to indices when
//! the program is built; a label that is declared but never defined is a build error. Each
//! executed instruction is counted. Faults never take the engine down: an out-of-range
//! local-memory, tail or shared-memory access, a call deeper than [`MAX_CALL_DEPTH`], a
//! return with an empty call stack, a header that does not fit the bytes, a runaway loop
//! that exceeds the instruction budget, or a panic inside a closure ends the packet with a
//! [`Fault`]; the engine drops it with the fault's reason, discards the packets the thread
//! created (but for those it kept: [`Thread::keep_created`]) and goes on. A program whose
//! threads hold shared state across instructions can give it back first, in a fault handler
//! ([`ProgramBuilder::on_fault`]) that the faulting thread runs with its registers and local
//! memory.
//!
//! A program never waits by itself: an instruction that finds something another thread
//! holds for a few XTXNs (a record being created, a lock) returns [`Yield`]`(label)`, and the
//! sequencer lets the other threads run before it runs `label` again, within the budget.
//!
//! The module's parts: `next` (the packed [`Next`] step), `fault` ([`Fault`] and its
//! kinds), `builder` ([`ProgramBuilder`]), `sequencer` ([`Program`] and the loop that runs
//! a thread through it), `thread` (the [`Thread`] context), `harness` ([`Harness`]) and
//! `author` (the authoring macros' types: [`Reg`], [`RegValue`], [`DropReasons`]).

mod author;
mod builder;
mod fault;
mod harness;
mod next;
mod sequencer;
mod thread;

pub use author::{DropReasons, Reg, RegValue};
pub use builder::{ProgramBuilder, ProgramError};
pub use fault::{Fault, FaultDetail, FaultKind};
pub use harness::{Harness, HarnessOutcome};
pub use next::{Call, Done, Goto, Next, Return, Step, Yield, MAX_LABELS};
pub use sequencer::Program;
pub(crate) use sequencer::{panic_message, PacketRun, RunOutcome};
pub(crate) use thread::{PacketMeta, ThreadCore};
pub use thread::{Thread, XtxnEvent};

use crate::packet::{GroupId, Port};

/// Bytes of local memory per thread (the paper: 1.25 KB).
pub const LOCAL_MEMORY_BYTES: usize = 1280;
/// General-purpose 64-bit registers per thread.
pub const REGISTERS: usize = 32;
/// Deepest nesting of `Call` (the paper: "nested up to eight levels deep").
pub const MAX_CALL_DEPTH: usize = 8;
/// Where the packet head starts in local memory by default; the bytes before it leave room
/// for a program to prepend headers with [`Thread::adjust_head`].
pub const DEFAULT_HEAD_OFFSET: usize = 64;
/// Default per-packet instruction budget (a runaway loop faults after this many).
pub const DEFAULT_INSTRUCTION_BUDGET: u32 = 10_000;
/// [`Yield`] steps of a packet that only yield the host core; later ones sleep.
pub const YIELDS_BEFORE_SLEEP: u32 = 64;
/// The sleep of a [`Yield`] step after the first [`YIELDS_BEFORE_SLEEP`]: with the default
/// instruction budget a packet waits about 0.5 s for a descheduled holder before it faults.
pub const WAIT_SLEEP: std::time::Duration = std::time::Duration::from_micros(50);

/// Register indices with the paper's names for intermediate registers (`ir0`..`ir7`).
pub const IR0: usize = 0;
/// Intermediate register 1.
pub const IR1: usize = 1;
/// Intermediate register 2.
pub const IR2: usize = 2;
/// Intermediate register 3.
pub const IR3: usize = 3;
/// Intermediate register 4.
pub const IR4: usize = 4;
/// Intermediate register 5.
pub const IR5: usize = 5;
/// Intermediate register 6.
pub const IR6: usize = 6;
/// Intermediate register 7.
pub const IR7: usize = 7;

/// A label: the name of an instruction, resolved to its index when the program is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Label(pub(crate) u32);

/// A drop reason registered with [`ProgramBuilder::drop_reason`]; counted by name in the stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropReason(pub(crate) u16);

/// What happens to the packet when its thread finishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Send the (possibly rewritten) packet out of one port.
    Forward(Port),
    /// Send a copy to every port of a multicast group.
    Multicast(GroupId),
    /// Drop the packet, counting it under the reason.
    Drop(DropReason),
    /// The program used the packet up (e.g. an aggregation packet absorbed into a sum).
    Consume,
}

/// The entry points a program can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// Where a thread starts for each packet head dispatched to it.
    Packet,
    /// Where a thread launched by a timer with entry `n` starts (see [`crate::timer`]). It
    /// has no packet: [`Thread::timer`] says which launch it is.
    Timer(u16),
}

/// What an instruction returns: the next step, or a fault that ends the packet.
pub type InstrResult = Result<Next, Fault>;

pub(crate) type Instr = Box<dyn Fn(&mut Thread<'_>) -> InstrResult + Send + Sync>;
