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
//! let mut p = Program::builder("tiny");
//! let [start, done] = p.labels(["start", "done"]);
//! let too_short = p.drop_reason("too_short");
//! p.instr(start, move |t| {
//!     t.r[IR0] = t.pkt_len() as u64;
//!     Ok(if t.r[IR0] >= 64 { Goto(done) } else { Done(Verdict::Drop(too_short)) })
//! });
//! p.instr(done, |_t| Ok(Done(Verdict::Forward(1))));
//! p.entry(Entry::Packet, start);
//! let program = p.build().expect("every label is defined");
//! assert_eq!(program.name(), "tiny");
//! ```
//!
//! Labels are declared first (so instructions can jump forward) and resolved to indices when
//! the program is built; a label that is declared but never defined is a build error. Each
//! executed instruction is counted. Faults never take the engine down: an out-of-range
//! local-memory, tail or shared-memory access, a call deeper than [`MAX_CALL_DEPTH`], a
//! return with an empty call stack, a header that does not fit the bytes, a runaway loop
//! that exceeds the instruction budget, or a panic inside a closure ends the packet with a
//! [`Fault`]; the engine drops it with the fault's reason and goes on.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::mem::hash::{HashError, HashTable, Inserted, ScanAction};
use crate::mem::{Addr, Color, MemFault, Op, PostedOps, SharedMemory, XtxnKind};
use crate::packet::{Dest, GroupId, OutArena, Port};
use crate::timer::Launch;
use crate::wire::WireError;

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
pub struct Label(u32);

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

/// What the sequencer does after an instruction. Build it with [`Goto`], [`Call`],
/// [`Return`] and [`Done`]; read it with [`Next::step`].
///
/// It is packed into one word so that an instruction's [`InstrResult`] comes back in two
/// registers rather than through memory: the sequencer pays for it on every instruction.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Next(u64);

/// [`Next`] unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Continue at the label.
    Goto(Label),
    /// Call the first label as a subroutine; its `Return` continues at the second label.
    Call(Label, Label),
    /// Return from the current subroutine.
    Return,
    /// The thread is finished with the packet.
    Done(Verdict),
}

const STEP_SHIFT: u32 = 56;
const STEP_GOTO: u64 = 0;
const STEP_CALL: u64 = 1;
const STEP_RETURN: u64 = 2;
const STEP_DONE: u64 = 3;
/// Labels are 28-bit so a call's two labels fit one word.
const LABEL_BITS: u32 = 28;
const LABEL_MASK: u64 = (1 << LABEL_BITS) - 1;
/// Most labels a program may have.
pub const MAX_LABELS: usize = 1 << LABEL_BITS;

/// Continue at `label`.
#[allow(non_snake_case)]
#[inline(always)]
pub const fn Goto(label: Label) -> Next {
    Next(STEP_GOTO << STEP_SHIFT | label.0 as u64)
}

/// Call `target` as a subroutine; its `Return` continues at `ret`.
#[allow(non_snake_case)]
#[inline(always)]
pub const fn Call(target: Label, ret: Label) -> Next {
    Next(STEP_CALL << STEP_SHIFT | (ret.0 as u64) << LABEL_BITS | target.0 as u64)
}

/// Return from the current subroutine.
#[allow(non_upper_case_globals)]
pub const Return: Next = Next(STEP_RETURN << STEP_SHIFT);

/// The thread is finished with the packet.
#[allow(non_snake_case)]
#[inline(always)]
pub const fn Done(verdict: Verdict) -> Next {
    let (kind, value) = match verdict {
        Verdict::Forward(p) => (0u64, p),
        Verdict::Multicast(g) => (1, g),
        Verdict::Drop(r) => (2, r.0),
        Verdict::Consume => (3, 0),
    };
    Next(STEP_DONE << STEP_SHIFT | kind << 16 | value as u64)
}

impl Next {
    /// What the sequencer will do.
    #[inline(always)]
    pub const fn step(self) -> Step {
        let a = Label((self.0 & LABEL_MASK) as u32);
        match self.0 >> STEP_SHIFT {
            STEP_GOTO => Step::Goto(a),
            STEP_CALL => Step::Call(a, Label((self.0 >> LABEL_BITS & LABEL_MASK) as u32)),
            STEP_RETURN => Step::Return,
            _ => {
                let value = self.0 as u16;
                Step::Done(match (self.0 >> 16) & 3 {
                    0 => Verdict::Forward(value),
                    1 => Verdict::Multicast(value),
                    2 => Verdict::Drop(DropReason(value)),
                    _ => Verdict::Consume,
                })
            }
        }
    }
}

impl fmt::Debug for Next {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.step().fmt(f)
    }
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

type Instr = Box<dyn Fn(&mut Thread<'_>) -> InstrResult + Send + Sync>;

/// Why a program stopped abnormally. The packet is dropped under [`Fault::kind`]'s reason.
///
/// The details are boxed so that an instruction's result ([`InstrResult`]) stays two words
/// and comes back in registers: faults are rare, instructions are not.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault(Box<FaultDetail>);

/// What went wrong, in detail.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultDetail {
    /// A local-memory access outside the thread's 1.25 KB, or a head access past its end.
    LocalMemory {
        /// First byte asked for (relative to local memory).
        offset: usize,
        /// Bytes asked for.
        len: usize,
    },
    /// A shared-memory XTXN was refused.
    SharedMemory(MemFault),
    /// A tail access past the end of the tail.
    Tail {
        /// First tail byte asked for.
        offset: usize,
        /// Bytes asked for.
        len: usize,
    },
    /// A header view did not fit the bytes (a truncated or malformed packet).
    Header(WireError),
    /// `Call` nested deeper than [`MAX_CALL_DEPTH`].
    CallDepth,
    /// `Return` with an empty call stack.
    ReturnWithoutCall,
    /// The packet used more instructions than the budget (a runaway loop).
    InstructionBudget(u32),
    /// An instruction closure panicked.
    Panic(String),
    /// The program has no instruction for the entry point it was started at.
    NoEntry,
    /// A hash-engine XTXN was refused (a key too long, or an insert into a full table
    /// that the program did not handle).
    Hash(HashError),
}

/// The kind of a [`Fault`], for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// [`FaultDetail::LocalMemory`].
    LocalMemory,
    /// [`FaultDetail::SharedMemory`].
    SharedMemory,
    /// [`FaultDetail::Tail`].
    Tail,
    /// [`FaultDetail::Header`].
    Header,
    /// [`FaultDetail::CallDepth`].
    CallDepth,
    /// [`FaultDetail::ReturnWithoutCall`].
    ReturnWithoutCall,
    /// [`FaultDetail::InstructionBudget`].
    InstructionBudget,
    /// [`FaultDetail::Panic`].
    Panic,
    /// [`FaultDetail::NoEntry`].
    NoEntry,
    /// [`FaultDetail::Hash`].
    Hash,
}

impl FaultKind {
    /// Every kind, in counter order.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::LocalMemory,
        FaultKind::SharedMemory,
        FaultKind::Tail,
        FaultKind::Header,
        FaultKind::CallDepth,
        FaultKind::ReturnWithoutCall,
        FaultKind::InstructionBudget,
        FaultKind::Panic,
        FaultKind::NoEntry,
        FaultKind::Hash,
    ];
    /// Number of kinds.
    pub const COUNT: usize = Self::ALL.len();

    /// The counter name, e.g. `local_memory`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::LocalMemory => "local_memory",
            FaultKind::SharedMemory => "shared_memory",
            FaultKind::Tail => "tail",
            FaultKind::Header => "header",
            FaultKind::CallDepth => "call_depth",
            FaultKind::ReturnWithoutCall => "return_without_call",
            FaultKind::InstructionBudget => "instruction_budget",
            FaultKind::Panic => "panic",
            FaultKind::NoEntry => "no_entry",
            FaultKind::Hash => "hash",
        }
    }

    /// The drop reason a packet ending in this fault is counted under, e.g. `fault_panic`.
    pub fn drop_reason(self) -> &'static str {
        match self {
            FaultKind::LocalMemory => "fault_local_memory",
            FaultKind::SharedMemory => "fault_shared_memory",
            FaultKind::Tail => "fault_tail",
            FaultKind::Header => "fault_header",
            FaultKind::CallDepth => "fault_call_depth",
            FaultKind::ReturnWithoutCall => "fault_return_without_call",
            FaultKind::InstructionBudget => "fault_instruction_budget",
            FaultKind::Panic => "fault_panic",
            FaultKind::NoEntry => "fault_no_entry",
            FaultKind::Hash => "fault_hash",
        }
    }

    /// Position in [`FaultKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl Fault {
    /// The kind, for counting.
    pub fn kind(&self) -> FaultKind {
        self.0.kind()
    }

    /// The details.
    pub fn detail(&self) -> &FaultDetail {
        &self.0
    }
}

impl From<FaultDetail> for Fault {
    fn from(d: FaultDetail) -> Self {
        Fault(Box::new(d))
    }
}

impl FaultDetail {
    /// The kind, for counting.
    pub fn kind(&self) -> FaultKind {
        match self {
            FaultDetail::LocalMemory { .. } => FaultKind::LocalMemory,
            FaultDetail::SharedMemory(_) => FaultKind::SharedMemory,
            FaultDetail::Tail { .. } => FaultKind::Tail,
            FaultDetail::Header(_) => FaultKind::Header,
            FaultDetail::CallDepth => FaultKind::CallDepth,
            FaultDetail::ReturnWithoutCall => FaultKind::ReturnWithoutCall,
            FaultDetail::InstructionBudget(_) => FaultKind::InstructionBudget,
            FaultDetail::Panic(_) => FaultKind::Panic,
            FaultDetail::NoEntry => FaultKind::NoEntry,
            FaultDetail::Hash(_) => FaultKind::Hash,
        }
    }
}

impl fmt::Display for FaultDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultDetail::LocalMemory { offset, len } => write!(
                f,
                "local-memory access of {len} bytes at offset {offset} is outside the \
                 {LOCAL_MEMORY_BYTES}-byte local memory or the packet head"
            ),
            FaultDetail::SharedMemory(e) => write!(f, "shared-memory access refused: {e}"),
            FaultDetail::Tail { offset, len } => {
                write!(
                    f,
                    "tail access of {len} bytes at offset {offset} is past the tail's end"
                )
            }
            FaultDetail::Header(e) => write!(f, "header does not fit the packet: {e}"),
            FaultDetail::CallDepth => write!(f, "call nested deeper than {MAX_CALL_DEPTH} levels"),
            FaultDetail::ReturnWithoutCall => write!(f, "return with an empty call stack"),
            FaultDetail::InstructionBudget(b) => {
                write!(f, "packet exceeded its budget of {b} instructions")
            }
            FaultDetail::Panic(msg) => write!(f, "instruction panicked: {msg}"),
            FaultDetail::Hash(e) => write!(f, "hash XTXN refused: {e}"),
            FaultDetail::NoEntry => {
                write!(f, "the program has no instruction for this entry point")
            }
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Fault {}

impl From<MemFault> for Fault {
    fn from(e: MemFault) -> Self {
        FaultDetail::SharedMemory(e).into()
    }
}

impl From<HashError> for Fault {
    fn from(e: HashError) -> Self {
        FaultDetail::Hash(e).into()
    }
}

impl From<WireError> for Fault {
    fn from(e: WireError) -> Self {
        FaultDetail::Header(e).into()
    }
}

/// A program could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramError {
    /// A label was declared (and maybe jumped to) but no instruction defines it.
    UndefinedLabel(String),
    /// Two instructions define the same label.
    DuplicateLabel(String),
    /// The program has no [`Entry::Packet`] entry point.
    NoPacketEntry,
    /// An entry point was set twice.
    DuplicateEntry(Entry),
    /// Too many labels or drop reasons for the program's index width.
    TooLarge(&'static str),
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramError::UndefinedLabel(l) => {
                write!(f, "label `{l}` is used but no instruction defines it")
            }
            ProgramError::DuplicateLabel(l) => write!(f, "label `{l}` is defined twice"),
            ProgramError::NoPacketEntry => {
                write!(f, "the program has no Entry::Packet entry point")
            }
            ProgramError::DuplicateEntry(e) => write!(f, "entry point {e:?} is set twice"),
            ProgramError::TooLarge(what) => write!(f, "too many {what}"),
        }
    }
}

impl std::error::Error for ProgramError {}

/// Builds a [`Program`]: declare labels, define instructions, set entry points.
pub struct ProgramBuilder {
    name: String,
    labels: Vec<String>,
    instrs: Vec<Option<Instr>>,
    duplicates: Vec<String>,
    entries: Vec<(Entry, Label)>,
    drop_reasons: Vec<&'static str>,
}

impl ProgramBuilder {
    /// Declares a label (or returns the one already declared with this name).
    pub fn label(&mut self, name: &str) -> Label {
        if let Some(i) = self.labels.iter().position(|l| l == name) {
            return Label(i as u32);
        }
        self.labels.push(name.to_owned());
        self.instrs.push(None);
        Label(self.labels.len() as u32 - 1)
    }

    /// Declares several labels at once: `let [a, b] = p.labels(["a", "b"]);`.
    pub fn labels<const N: usize>(&mut self, names: [&str; N]) -> [Label; N] {
        names.map(|n| self.label(n))
    }

    /// Defines the instruction at `label`.
    pub fn instr<F>(&mut self, label: Label, f: F) -> &mut Self
    where
        F: Fn(&mut Thread<'_>) -> InstrResult + Send + Sync + 'static,
    {
        let slot = &mut self.instrs[label.0 as usize];
        if slot.is_some() {
            self.duplicates.push(self.labels[label.0 as usize].clone());
        }
        *slot = Some(Box::new(f));
        self
    }

    /// Sets where threads start for an entry point.
    pub fn entry(&mut self, entry: Entry, label: Label) -> &mut Self {
        self.entries.push((entry, label));
        self
    }

    /// Registers a drop reason, counted by `name` in the engine's stats.
    pub fn drop_reason(&mut self, name: &'static str) -> DropReason {
        if let Some(i) = self.drop_reasons.iter().position(|r| *r == name) {
            return DropReason(i as u16);
        }
        self.drop_reasons.push(name);
        DropReason(self.drop_reasons.len() as u16 - 1)
    }

    /// Resolves labels and checks the program.
    pub fn build(self) -> Result<Program, ProgramError> {
        if let Some(d) = self.duplicates.into_iter().next() {
            return Err(ProgramError::DuplicateLabel(d));
        }
        if self.labels.len() > MAX_LABELS {
            return Err(ProgramError::TooLarge("labels"));
        }
        if self.drop_reasons.len() > u16::MAX as usize {
            return Err(ProgramError::TooLarge("drop reasons"));
        }
        let mut instrs = Vec::with_capacity(self.instrs.len());
        for (i, slot) in self.instrs.into_iter().enumerate() {
            match slot {
                Some(f) => instrs.push(f),
                None => return Err(ProgramError::UndefinedLabel(self.labels[i].clone())),
            }
        }
        let mut packet_entry = None;
        let mut timer_entries: Vec<(u16, Label)> = Vec::new();
        for (e, l) in self.entries {
            match e {
                Entry::Packet if packet_entry.is_some() => {
                    return Err(ProgramError::DuplicateEntry(e))
                }
                Entry::Packet => packet_entry = Some(l),
                Entry::Timer(n) if timer_entries.iter().any(|(m, _)| *m == n) => {
                    return Err(ProgramError::DuplicateEntry(e))
                }
                Entry::Timer(n) => timer_entries.push((n, l)),
            }
        }
        let packet_entry = packet_entry.ok_or(ProgramError::NoPacketEntry)?;
        Ok(Program {
            inner: Arc::new(ProgramInner {
                name: self.name,
                labels: self.labels,
                instrs,
                packet_entry,
                timer_entries,
                drop_reasons: self.drop_reasons,
            }),
        })
    }
}

struct ProgramInner {
    name: String,
    labels: Vec<String>,
    instrs: Vec<Instr>,
    packet_entry: Label,
    timer_entries: Vec<(u16, Label)>,
    drop_reasons: Vec<&'static str>,
}

/// A built Microcode program; cheap to clone (shared by every PPE thread).
#[derive(Clone)]
pub struct Program {
    inner: Arc<ProgramInner>,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.inner.name)
            .field("instructions", &self.inner.labels)
            .field("drop_reasons", &self.inner.drop_reasons)
            .finish()
    }
}

/// How one run of a program ended.
#[derive(Debug)]
pub(crate) struct RunOutcome {
    pub result: Result<Verdict, Fault>,
    pub instructions: u32,
}

impl Program {
    /// Starts building a program called `name`.
    pub fn builder(name: &str) -> ProgramBuilder {
        ProgramBuilder {
            name: name.to_owned(),
            labels: Vec::new(),
            instrs: Vec::new(),
            duplicates: Vec::new(),
            entries: Vec::new(),
            drop_reasons: Vec::new(),
        }
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Instruction names, in label order.
    pub fn instruction_names(&self) -> &[String] {
        &self.inner.labels
    }

    /// The drop reasons the program registered, in [`DropReason`] order.
    pub fn drop_reasons(&self) -> &[&'static str] {
        &self.inner.drop_reasons
    }

    /// The name of a drop reason of this program.
    pub fn drop_reason_name(&self, r: DropReason) -> &'static str {
        self.inner
            .drop_reasons
            .get(r.0 as usize)
            .copied()
            .unwrap_or("unknown")
    }

    /// Timer entry points, as (timer number, label name).
    pub fn timer_entries(&self) -> impl Iterator<Item = (u16, &str)> {
        self.inner
            .timer_entries
            .iter()
            .map(|(n, l)| (*n, self.inner.labels[l.0 as usize].as_str()))
    }

    fn entry_label(&self, entry: Entry) -> Option<Label> {
        match entry {
            Entry::Packet => Some(self.inner.packet_entry),
            Entry::Timer(n) => self
                .inner
                .timer_entries
                .iter()
                .find(|(m, _)| *m == n)
                .map(|(_, l)| *l),
        }
    }

    /// Runs the thread from `entry` to completion (or a fault), counting instructions.
    pub(crate) fn run(&self, entry: Entry, t: &mut Thread<'_>, budget: u32) -> RunOutcome {
        self.run_observed(entry, t, budget, |_| {})
    }

    /// [`Program::run`], calling `before` with each instruction's label before it runs.
    #[inline]
    fn run_observed(
        &self,
        entry: Entry,
        t: &mut Thread<'_>,
        budget: u32,
        mut before: impl FnMut(Label),
    ) -> RunOutcome {
        let Some(start) = self.entry_label(entry) else {
            return RunOutcome {
                result: Err(FaultDetail::NoEntry.into()),
                instructions: 0,
            };
        };
        let mut executed = 0u32;
        let result = catch_unwind(AssertUnwindSafe(|| {
            let instrs = &self.inner.instrs;
            let mut pc = start.0 as usize;
            let mut stack = [0u32; MAX_CALL_DEPTH];
            let mut depth = 0usize;
            loop {
                if executed >= budget {
                    return Err(FaultDetail::InstructionBudget(budget).into());
                }
                executed += 1;
                before(Label(pc as u32));
                match (instrs[pc])(t)?.step() {
                    Step::Goto(l) => pc = l.0 as usize,
                    Step::Call(l, ret) => {
                        if depth == MAX_CALL_DEPTH {
                            return Err(FaultDetail::CallDepth.into());
                        }
                        stack[depth] = ret.0;
                        depth += 1;
                        pc = l.0 as usize;
                    }
                    Step::Return => {
                        if depth == 0 {
                            return Err(FaultDetail::ReturnWithoutCall.into());
                        }
                        depth -= 1;
                        pc = stack[depth] as usize;
                    }
                    Step::Done(v) => return Ok(v),
                }
            }
        }));
        let result = match result {
            Ok(r) => r,
            Err(payload) => Err(FaultDetail::Panic(panic_message(payload.as_ref())).into()),
        };
        RunOutcome {
            result,
            instructions: executed,
        }
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// What one PPE thread owns for its whole life: local memory, the new-tail scratch buffer,
/// its posted XTXNs and per-packet XTXN counts. Never shared.
pub(crate) struct ThreadCore {
    pub lm: Box<[u8; LOCAL_MEMORY_BYTES]>,
    pub new_tail: Vec<u8>,
    pub new_tail_set: bool,
    pub posted: PostedOps,
    pub xtxns: [u64; XtxnKind::COUNT],
}

impl ThreadCore {
    /// Loads `frame`'s head (its first `head_bytes`) into local memory at
    /// [`DEFAULT_HEAD_OFFSET`] and describes the packet for a [`Thread`].
    pub fn load<'f>(
        &mut self,
        port: Port,
        frame: &'f [u8],
        head_bytes: usize,
        now_ns: u64,
    ) -> PacketMeta<'f> {
        let head_len = frame.len().min(head_bytes);
        let (head, tail) = frame.split_at(head_len);
        self.lm[DEFAULT_HEAD_OFFSET..DEFAULT_HEAD_OFFSET + head_len].copy_from_slice(head);
        PacketMeta {
            port,
            pkt_len: frame.len(),
            head_start: DEFAULT_HEAD_OFFSET,
            head_len,
            tail,
            now_ns,
            timer: None,
        }
    }

    pub fn new() -> Self {
        ThreadCore {
            lm: Box::new([0; LOCAL_MEMORY_BYTES]),
            new_tail: Vec::new(),
            new_tail_set: false,
            posted: PostedOps::new(64),
            xtxns: [0; XtxnKind::COUNT],
        }
    }
}

/// Per-packet facts the thread context exposes.
pub(crate) struct PacketMeta<'a> {
    pub port: Port,
    pub pkt_len: usize,
    pub head_start: usize,
    pub head_len: usize,
    pub tail: &'a [u8],
    pub now_ns: u64,
    /// The launch that started a timer thread (`None` for a packet thread).
    pub timer: Option<Launch>,
}

impl PacketMeta<'static> {
    /// What a timer thread sees: no packet (length 0, an empty head at the default
    /// offset, no tail) and its launch.
    pub fn timer(launch: Launch, now_ns: u64) -> Self {
        PacketMeta {
            port: 0,
            pkt_len: 0,
            head_start: DEFAULT_HEAD_OFFSET,
            head_len: 0,
            tail: &[],
            now_ns,
            timer: Some(launch),
        }
    }
}

/// The context of one PPE thread working on one packet: registers, local memory holding the
/// packet head, the packet's tail (reached through XTXNs), and the shared memory system.
pub struct Thread<'a> {
    /// The 32 general-purpose 64-bit registers, zeroed when the thread starts.
    pub r: [u64; REGISTERS],
    core: &'a mut ThreadCore,
    mem: &'a SharedMemory,
    out: &'a mut OutArena,
    meta: PacketMeta<'a>,
    /// Local memory was written (so the head must be unloaded, not reused as it came).
    lm_written: bool,
}

#[inline]
fn lm_range(offset: usize, len: usize) -> Result<std::ops::Range<usize>, Fault> {
    match offset.checked_add(len) {
        Some(end) if end <= LOCAL_MEMORY_BYTES => Ok(offset..end),
        _ => Err(FaultDetail::LocalMemory { offset, len }.into()),
    }
}

impl<'a> Thread<'a> {
    pub(crate) fn new(
        core: &'a mut ThreadCore,
        mem: &'a SharedMemory,
        out: &'a mut OutArena,
        meta: PacketMeta<'a>,
    ) -> Self {
        core.new_tail.clear();
        core.new_tail_set = false;
        Thread {
            r: [0; REGISTERS],
            core,
            mem,
            out,
            meta,
            lm_written: false,
        }
    }

    /// Where the head ended up in local memory, and whether local memory was written.
    pub(crate) fn head_window(&self) -> (usize, usize, bool) {
        (self.meta.head_start, self.meta.head_len, self.lm_written)
    }

    // ----- packet facts -------------------------------------------------------------------

    /// Length of the packet as it arrived (the paper's `r_work.pkt_len`).
    #[inline]
    pub fn pkt_len(&self) -> usize {
        self.meta.pkt_len
    }

    /// Port the packet arrived on.
    #[inline]
    pub fn port(&self) -> Port {
        self.meta.port
    }

    /// The engine's clock (its [`crate::timer::Clock`]), in nanoseconds, read when the
    /// thread's batch (or timer launch) started.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.meta.now_ns
    }

    /// For a thread a timer launched: which timer, the slice of work it owns and when it
    /// was due. `None` for a packet thread.
    #[inline]
    pub fn timer(&self) -> Option<&Launch> {
        self.meta.timer.as_ref()
    }

    // ----- local memory and the head ------------------------------------------------------

    /// The whole local memory.
    #[inline]
    pub fn lm(&self) -> &[u8; LOCAL_MEMORY_BYTES] {
        &self.core.lm
    }

    /// The whole local memory, writable.
    #[inline]
    pub fn lm_mut(&mut self) -> &mut [u8; LOCAL_MEMORY_BYTES] {
        self.lm_written = true;
        &mut self.core.lm
    }

    /// `len` bytes of local memory at `offset`.
    #[inline]
    pub fn lm_bytes(&self, offset: usize, len: usize) -> Result<&[u8], Fault> {
        Ok(&self.core.lm[lm_range(offset, len)?])
    }

    /// `len` writable bytes of local memory at `offset`.
    #[inline]
    pub fn lm_bytes_mut(&mut self, offset: usize, len: usize) -> Result<&mut [u8], Fault> {
        self.lm_written = true;
        Ok(&mut self.core.lm[lm_range(offset, len)?])
    }

    /// Where the head starts in local memory.
    #[inline]
    pub fn head_offset(&self) -> usize {
        self.meta.head_start
    }

    /// Bytes in the head.
    #[inline]
    pub fn head_len(&self) -> usize {
        self.meta.head_len
    }

    /// The head from byte `offset` to its end (wrap it in a header view:
    /// `Ether::new_checked(t.head(0)?)?`).
    #[inline]
    pub fn head(&self, offset: usize) -> Result<&[u8], Fault> {
        if offset > self.meta.head_len {
            return Err(FaultDetail::LocalMemory {
                offset: self.meta.head_start + offset,
                len: 0,
            }
            .into());
        }
        Ok(&self.core.lm[self.meta.head_start + offset..self.meta.head_start + self.meta.head_len])
    }

    /// The head from byte `offset` to its end, writable.
    #[inline]
    pub fn head_mut(&mut self, offset: usize) -> Result<&mut [u8], Fault> {
        if offset > self.meta.head_len {
            return Err(FaultDetail::LocalMemory {
                offset: self.meta.head_start + offset,
                len: 0,
            }
            .into());
        }
        self.lm_written = true;
        Ok(&mut self.core.lm
            [self.meta.head_start + offset..self.meta.head_start + self.meta.head_len])
    }

    /// Moves the start of the head: a positive `delta` strips that many bytes from the
    /// front (pop a header), a negative one prepends room (push a header; the new bytes are
    /// whatever local memory holds there, so write them).
    pub fn adjust_head(&mut self, delta: isize) -> Result<(), Fault> {
        let start = self.meta.head_start as isize + delta;
        let len = self.meta.head_len as isize - delta;
        if start < 0 || len < 0 || (start + len) as usize > LOCAL_MEMORY_BYTES {
            return Err(FaultDetail::LocalMemory {
                offset: start.max(0) as usize,
                len: len.max(0) as usize,
            }
            .into());
        }
        self.lm_written = true;
        self.meta.head_start = start as usize;
        self.meta.head_len = len as usize;
        Ok(())
    }

    /// Sets the head's length (trim, or grow into local memory after it).
    pub fn set_head_len(&mut self, len: usize) -> Result<(), Fault> {
        lm_range(self.meta.head_start, len)?;
        self.lm_written = true;
        self.meta.head_len = len;
        Ok(())
    }

    // ----- the tail -----------------------------------------------------------------------

    /// Bytes in the packet's original tail (0 for packets no longer than the head).
    #[inline]
    pub fn tail_len(&self) -> usize {
        self.meta.tail.len()
    }

    /// Copies `len` bytes of the tail at `tail_offset` into local memory at `lm_offset`
    /// (an XTXN to the packet buffer).
    #[inline]
    pub fn read_tail(
        &mut self,
        tail_offset: usize,
        lm_offset: usize,
        len: usize,
    ) -> Result<(), Fault> {
        let src = tail_offset
            .checked_add(len)
            .filter(|end| *end <= self.meta.tail.len())
            .map(|end| &self.meta.tail[tail_offset..end])
            .ok_or_else(|| {
                Fault::from(FaultDetail::Tail {
                    offset: tail_offset,
                    len,
                })
            })?;
        crate::mem::copy_bytes(&mut self.core.lm[lm_range(lm_offset, len)?], src);
        self.lm_written = true;
        self.core.xtxns[XtxnKind::TailRead.index()] += 1;
        Ok(())
    }

    /// Appends `len` bytes of local memory at `lm_offset` to the packet's *new* tail. The
    /// first call replaces the original tail in the output; the new tail is also what
    /// [`Thread::emit`] attaches to a created packet.
    pub fn write_tail(&mut self, lm_offset: usize, len: usize) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.core.new_tail_set = true;
        self.core.new_tail.extend_from_slice(&self.core.lm[range]);
        self.core.xtxns[XtxnKind::TailWrite.index()] += 1;
        Ok(())
    }

    /// Makes the output carry no tail (an empty new tail).
    pub fn clear_tail(&mut self) {
        self.core.new_tail_set = true;
        self.core.new_tail.clear();
    }

    // ----- created packets ----------------------------------------------------------------

    /// Creates a new packet from `len` bytes of local memory at `lm_offset`, followed by the
    /// new tail if one was written (which is then consumed). It leaves the engine right
    /// after the packet that created it, in creation order.
    pub fn emit(&mut self, dest: Dest, lm_offset: usize, len: usize) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        let tail: &[u8] = if self.core.new_tail_set {
            &self.core.new_tail
        } else {
            &[]
        };
        self.out.push(dest, &[&self.core.lm[range], tail]);
        self.core.new_tail.clear();
        self.core.new_tail_set = false;
        Ok(())
    }

    // ----- shared memory XTXNs (synchronous unless noted) ---------------------------------

    #[inline]
    fn count(&mut self, kind: XtxnKind) {
        self.core.xtxns[kind.index()] += 1;
    }

    /// The shared memory system, for reads outside XTXN accounting (e.g. in tests).
    pub fn shared_memory(&self) -> &SharedMemory {
        self.mem
    }

    /// Reads 8..=64 bytes (a multiple of 8) at `addr` into local memory at `lm_offset`.
    pub fn mem_read(&mut self, addr: Addr, lm_offset: usize, len: usize) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.count(XtxnKind::Read);
        self.lm_written = true;
        self.mem.read(addr, &mut self.core.lm[range])?;
        Ok(())
    }

    /// Reads `len` bytes of whole 64-byte lines (64 to 4096) at `addr` into local memory at
    /// `lm_offset`: one 64-byte read per line issued back to back, counted as that many
    /// reads (e.g. the Result builder's 256-byte pulls of sums); see
    /// [`SharedMemory::read_lines`].
    pub fn mem_read_lines(
        &mut self,
        addr: Addr,
        lm_offset: usize,
        len: usize,
    ) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.mem.read_lines(addr, &mut self.core.lm[range])?;
        self.core.xtxns[XtxnKind::Read.index()] += (len / 64) as u64;
        self.lm_written = true;
        Ok(())
    }

    /// Writes 8..=64 bytes (a multiple of 8) of local memory at `lm_offset` to `addr`.
    pub fn mem_write(&mut self, addr: Addr, lm_offset: usize, len: usize) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.count(XtxnKind::Write);
        self.mem.write(addr, &self.core.lm[range])?;
        Ok(())
    }

    /// Reads one 8-byte word.
    pub fn read_u64(&mut self, addr: Addr) -> Result<u64, Fault> {
        self.count(XtxnKind::Read);
        Ok(self.mem.read_u64(addr)?)
    }

    /// Writes one 8-byte word.
    pub fn write_u64(&mut self, addr: Addr, value: u64) -> Result<(), Fault> {
        self.count(XtxnKind::Write);
        Ok(self.mem.write_u64(addr, value)?)
    }

    /// The paper's `CounterIncPhys`: +1 packet and +`bytes` on the 16-byte counter at `addr`.
    pub fn counter_inc(&mut self, addr: Addr, bytes: u64) -> Result<(), Fault> {
        self.count(XtxnKind::CounterInc);
        Ok(self.mem.counter_inc(addr, bytes)?)
    }

    /// Runs `bytes` through the policer at `addr` (time is the engine clock).
    pub fn police(&mut self, addr: Addr, bytes: u64) -> Result<Color, Fault> {
        self.count(XtxnKind::Police);
        Ok(self.mem.police(addr, bytes, self.meta.now_ns)?)
    }

    /// Fetch-and-AND; returns the old value.
    pub fn fetch_and(&mut self, addr: Addr, mask: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::FetchAnd);
        Ok(self.mem.fetch_and(addr, mask)?)
    }

    /// Fetch-and-OR; returns the old value.
    pub fn fetch_or(&mut self, addr: Addr, mask: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::FetchOr);
        Ok(self.mem.fetch_or(addr, mask)?)
    }

    /// Fetch-and-XOR; returns the old value.
    pub fn fetch_xor(&mut self, addr: Addr, mask: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::FetchXor);
        Ok(self.mem.fetch_xor(addr, mask)?)
    }

    /// Fetch-and-clear (clears the mask's bits); returns the old value.
    pub fn fetch_clear(&mut self, addr: Addr, mask: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::FetchClear);
        Ok(self.mem.fetch_clear(addr, mask)?)
    }

    /// Fetch-and-swap; returns the old value.
    pub fn fetch_swap(&mut self, addr: Addr, value: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::FetchSwap);
        Ok(self.mem.fetch_swap(addr, value)?)
    }

    /// 64-bit wrapping fetch-and-add; returns the old value.
    pub fn fetch_add(&mut self, addr: Addr, delta: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::FetchAdd);
        Ok(self.mem.fetch_add(addr, delta)?)
    }

    /// Writes the mask's bits of `value`; returns the old word.
    pub fn masked_write(&mut self, addr: Addr, value: u64, mask: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::MaskedWrite);
        Ok(self.mem.masked_write(addr, value, mask)?)
    }

    /// 32-bit wrapping add to lane 0 (the word's first 4 bytes in network order, its high
    /// half) or lane 1 (the low half); returns the old lane. See
    /// [`SharedMemory::fetch_add32`].
    pub fn fetch_add32(&mut self, addr: Addr, lane: u8, delta: u32) -> Result<u32, Fault> {
        self.count(XtxnKind::Add32);
        Ok(self.mem.fetch_add32(addr, lane, delta)?)
    }

    /// Adds 16 32-bit lanes (a 64-byte chunk of gradients) at `addr`.
    pub fn vadd32x16(&mut self, addr: Addr, deltas: &[u32; 16]) -> Result<(), Fault> {
        self.count(XtxnKind::VAdd32x16);
        Ok(self.mem.vadd32x16(addr, deltas)?)
    }

    /// Zeroes `bytes` bytes of shared memory from `addr` (64 to 4096, whole lines) in one
    /// XTXN (counted as a write); see [`SharedMemory::zero`].
    pub fn mem_zero(&mut self, addr: Addr, bytes: usize) -> Result<(), Fault> {
        self.count(XtxnKind::Write);
        Ok(self.mem.zero(addr, bytes)?)
    }

    /// Adds the big-endian 32-bit lanes in `len` bytes of local memory at `lm_offset` (whole
    /// 64-byte chunks, e.g. gradients just read from the packet) lane-wise to the words from
    /// `addr`; see [`SharedMemory::vadd32_be`]. Counted as one `vadd32x16` XTXN per chunk.
    pub fn vadd32_be(&mut self, addr: Addr, lm_offset: usize, len: usize) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.core.xtxns[XtxnKind::VAdd32x16.index()] += (len / 64) as u64;
        Ok(self.mem.vadd32_be(addr, &self.core.lm[range])?)
    }

    /// FPISA shift-and-add ([`SharedMemory::fpisa_add_be`]) of the big-endian `fmt` lanes in
    /// `len` bytes of local memory at `lm_offset` into the accumulator words from `addr`, one
    /// word per lane, each atomically, in `variant`. Counted as one `fpisa_add16` XTXN per
    /// 16 lanes or part of them (a 64-byte chunk of FP32 values). Returns the additions'
    /// events, counted (FPISA-A overwrites and left shifts, headroom overflows).
    pub fn fpisa_add_be(
        &mut self,
        addr: Addr,
        lm_offset: usize,
        len: usize,
        fmt: crate::fpisa::Format,
        variant: crate::fpisa::Variant,
    ) -> Result<crate::fpisa::FpisaCounts, Fault> {
        let range = lm_range(lm_offset, len)?;
        let counts = self
            .mem
            .fpisa_add_be(addr, &self.core.lm[range], fmt, variant)?;
        self.core.xtxns[XtxnKind::FpisaAdd16.index()] += counts.adds.div_ceil(16);
        Ok(counts)
    }

    /// Posts [`Thread::fpisa_add_be`] as an asynchronous XTXN, as gradient adds are: the
    /// lanes are copied out of local memory now, the size and address are checked now, and
    /// the add is applied exactly once, no later than [`Thread::wait_posted`] or the end of
    /// the batch. Posted adds that continue one another reach the engine as one request.
    /// The events of applied adds are collected by [`Thread::take_fpisa_events`]. Counted
    /// as one `fpisa_add16` XTXN per 16 lanes or part of them.
    #[inline]
    pub fn post_fpisa_add_be(
        &mut self,
        addr: Addr,
        lm_offset: usize,
        len: usize,
        fmt: crate::fpisa::Format,
        variant: crate::fpisa::Variant,
    ) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        let lanes = len / (fmt.width() / 8) as usize;
        self.core.xtxns[XtxnKind::FpisaAdd16.index()] += lanes.div_ceil(16) as u64;
        self.core
            .posted
            .post_fpisa_add_be(self.mem, addr, &self.core.lm[range], fmt, variant)?;
        Ok(())
    }

    /// The events of this thread's posted FPISA adds applied since the last call (after
    /// [`Thread::wait_posted`], all of them so far).
    pub fn take_fpisa_events(&mut self) -> crate::fpisa::FpisaCounts {
        self.core.posted.take_fpisa_counts()
    }

    // ----- hash engine XTXNs ---------------------------------------------------------------

    /// Looks `key` up in a hash table; a found record is marked referenced.
    pub fn hash_lookup(&mut self, table: &HashTable, key: &[u8]) -> Result<Option<u64>, Fault> {
        self.count(XtxnKind::HashLookup);
        Ok(table.lookup(key)?)
    }

    /// Looks `key` up in a hash table without marking it referenced: for a look that must
    /// not keep a record alive (a scan that ages records by their REF flags would otherwise
    /// never see it idle). Counted as a lookup.
    pub fn hash_peek(&mut self, table: &HashTable, key: &[u8]) -> Result<Option<u64>, Fault> {
        self.count(XtxnKind::HashLookup);
        Ok(table.peek(key)?)
    }

    /// Creates a record unless one with `key` exists (then its value comes back as
    /// [`Inserted::Existing`]). A full table is an `Err` the program can handle (for example
    /// by dropping the packet with a counted reason); `?` turns it into a fault.
    pub fn hash_insert(
        &mut self,
        table: &HashTable,
        key: &[u8],
        value: u64,
    ) -> Result<Inserted, HashError> {
        self.count(XtxnKind::HashInsert);
        table.insert(key, value)
    }

    /// Replaces an existing record's value; the old value, or `None` if there is none.
    pub fn hash_update(
        &mut self,
        table: &HashTable,
        key: &[u8],
        value: u64,
    ) -> Result<Option<u64>, Fault> {
        self.count(XtxnKind::HashUpdate);
        Ok(table.update(key, value)?)
    }

    /// Deletes a record; its value, or `None` if there was none.
    pub fn hash_delete(&mut self, table: &HashTable, key: &[u8]) -> Result<Option<u64>, Fault> {
        self.count(XtxnKind::HashDelete);
        Ok(table.delete(key)?)
    }

    /// Scans slice `slice` of `slices` of a hash table, testing and clearing each record's
    /// REF flag; see [`HashTable::scan`]. `visit` runs under the shard's lock: it must not
    /// issue hash XTXNs on the same table (collect what to do, then do it).
    pub fn hash_scan(
        &mut self,
        table: &HashTable,
        slice: usize,
        slices: usize,
        visit: impl FnMut(&[u8], u64, bool) -> ScanAction,
    ) -> usize {
        self.count(XtxnKind::HashScan);
        table.scan(slice, slices, visit)
    }

    /// Posts an asynchronous XTXN: the thread does not wait for it; it is applied exactly
    /// once, no later than the end of the batch the packet belongs to, so it is visible
    /// after [`crate::Pfe::drain`]. The address is checked now.
    pub fn post(&mut self, op: Op) -> Result<(), Fault> {
        self.count(op.kind());
        self.core.posted.post(self.mem, op)?;
        Ok(())
    }

    /// Posts [`Thread::vadd32_be`] as an asynchronous (fire-and-forget) XTXN, as the paper
    /// issues gradient adds: the lanes are copied out of local memory now (so the scratch
    /// area may be reused at once), the size and address are checked now, and the add is
    /// applied exactly once, no later than [`Thread::wait_posted`] or the end of the batch.
    /// Posted adds that continue one another (each starting at the word after the previous
    /// one's last) reach the engine as one vector add of up to 4 KB.
    /// Counted as one `vadd32x16` XTXN per 64-byte chunk.
    #[inline]
    pub fn post_vadd32_be(
        &mut self,
        addr: Addr,
        lm_offset: usize,
        len: usize,
    ) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.core.xtxns[XtxnKind::VAdd32x16.index()] += (len / 64) as u64;
        self.core
            .posted
            .post_vadd32_be(self.mem, addr, &self.core.lm[range])?;
        Ok(())
    }

    /// Waits for the replies of every outstanding posted XTXN of this thread
    /// ([`Thread::post`], [`Thread::post_vadd32_be`]): when it returns, all of them have been
    /// applied, and are visible to any thread that observes a later XTXN of this one. Call
    /// it before an XTXN that tells other threads the posted work is done (Trio-ML waits
    /// for its gradient adds before it counts its source in the block).
    pub fn wait_posted(&mut self) {
        self.core.posted.flush(self.mem);
    }
}

/// What [`Harness::run`] saw.
#[derive(Debug)]
pub struct HarnessOutcome {
    /// The verdict, or the fault that ended the thread.
    pub result: Result<Verdict, Fault>,
    /// Instructions executed.
    pub instructions: u32,
    /// The packet as it would leave (head as the program left it, then the tail), when the
    /// program forwarded or multicast it.
    pub output: Option<Vec<u8>>,
    /// Packets the program created, with their destinations.
    pub created: Vec<(Dest, Vec<u8>)>,
}

/// Runs a program on single frames in the calling thread, without an engine: for unit
/// tests of a program and for measuring what its instructions cost. Posted XTXNs are
/// applied before [`Harness::run`] returns.
///
/// ```
/// use std::sync::Arc;
/// use pfemu::prelude::*;
/// use pfemu::program::Harness;
///
/// let mut p = Program::builder("count");
/// let a = p.label("a");
/// p.instr(a, |t| Ok(Done(Verdict::Forward(t.pkt_len() as u16 % 4))));
/// p.entry(Entry::Packet, a);
/// let program = p.build()?;
///
/// let mut h = Harness::new(Arc::new(SharedMemory::new(&MemConfig::default())?));
/// let out = h.run(&program, 0, &[0u8; 66]);
/// assert_eq!(out.result, Ok(Verdict::Forward(2)));
/// assert_eq!(out.instructions, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Harness {
    core: ThreadCore,
    mem: Arc<SharedMemory>,
    out: OutArena,
    head_bytes: usize,
    budget: u32,
    now_ns: u64,
}

impl Harness {
    /// A harness on `mem`, with the engine's default head size and instruction budget.
    pub fn new(mem: Arc<SharedMemory>) -> Self {
        Harness {
            core: ThreadCore::new(),
            mem,
            out: OutArena::default(),
            head_bytes: crate::packet::DEFAULT_HEAD_BYTES,
            budget: DEFAULT_INSTRUCTION_BUDGET,
            now_ns: 0,
        }
    }

    /// Sets the time [`Thread::now_ns`] reports to the threads run from now on (0 at
    /// first): tests of time-dependent programs drive the clock by hand.
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    /// Sets the instruction budget of each run.
    pub fn set_budget(&mut self, budget: u32) {
        self.budget = budget;
    }

    /// The shared memory the harness runs against.
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.mem
    }

    /// Runs `program` from its packet entry on `frame`, arriving on `port`.
    pub fn run(&mut self, program: &Program, port: Port, frame: &[u8]) -> HarnessOutcome {
        self.run_observed(program, port, frame, |_| {})
    }

    /// [`Harness::run`], calling `before` with the name of each instruction's label just
    /// before the instruction runs. A test can block in `before` to hold the thread at a
    /// chosen instruction while other threads run, and so replay an interleaving of
    /// run-to-completion threads deterministically (a PPE thread the host OS deschedules
    /// between two instructions).
    pub fn run_observed(
        &mut self,
        program: &Program,
        port: Port,
        frame: &[u8],
        mut before: impl FnMut(&str),
    ) -> HarnessOutcome {
        self.out.clear();
        let meta = self.core.load(port, frame, self.head_bytes, self.now_ns);
        let tail = meta.tail;
        let mut t = Thread::new(&mut self.core, &self.mem, &mut self.out, meta);
        let names = program.instruction_names();
        let run = program.run_observed(Entry::Packet, &mut t, self.budget, |l| {
            before(&names[l.0 as usize])
        });
        let (hs, hl, _) = t.head_window();
        self.finish(run, Some((hs, hl, tail)))
    }

    /// Runs `program` from the timer entry `launch.entry`, as the engine does when a timer
    /// fires: the thread has no packet and sees `launch` through [`Thread::timer`].
    pub fn run_timer(&mut self, program: &Program, launch: Launch) -> HarnessOutcome {
        self.out.clear();
        let meta = PacketMeta::timer(launch, self.now_ns);
        let mut t = Thread::new(&mut self.core, &self.mem, &mut self.out, meta);
        let run = program.run(Entry::Timer(launch.entry), &mut t, self.budget);
        self.finish(run, None)
    }

    /// Applies posted XTXNs and collects what the thread produced.
    fn finish(&mut self, run: RunOutcome, head: Option<(usize, usize, &[u8])>) -> HarnessOutcome {
        self.core.posted.flush(&self.mem);
        self.core.xtxns = [0; XtxnKind::COUNT];
        let output = match (&run.result, head) {
            (Ok(Verdict::Forward(_)) | Ok(Verdict::Multicast(_)), Some((hs, hl, tail))) => {
                let mut o = self.core.lm[hs..hs + hl].to_vec();
                o.extend_from_slice(if self.core.new_tail_set {
                    &self.core.new_tail
                } else {
                    tail
                });
                Some(o)
            }
            _ => None,
        };
        let created = self
            .out
            .recs
            .iter()
            .map(|r| {
                (
                    r.dest,
                    self.out.bytes[r.off as usize..(r.off + r.len) as usize].to_vec(),
                )
            })
            .collect();
        HarnessOutcome {
            result: run.result,
            instructions: run.instructions,
            output,
            created,
        }
    }

    /// Runs `program` on every frame and returns how many it forwarded; no per-packet
    /// results are kept (the loop a benchmark times).
    pub fn run_all<'f>(
        &mut self,
        program: &Program,
        frames: impl IntoIterator<Item = &'f [u8]>,
    ) -> u64 {
        let mut forwarded = 0;
        for frame in frames {
            self.out.clear();
            let meta = self.core.load(0, frame, self.head_bytes, 0);
            let mut t = Thread::new(&mut self.core, &self.mem, &mut self.out, meta);
            if let Ok(Verdict::Forward(_)) = program.run(Entry::Packet, &mut t, self.budget).result
            {
                forwarded += 1;
            }
        }
        self.core.posted.flush(&self.mem);
        forwarded
    }
}
