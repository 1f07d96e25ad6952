//! Faults: why a thread stopped abnormally, and how they map to drop reasons.

use std::fmt;

use crate::mem::hash::HashError;
use crate::mem::tcam::TcamError;
use crate::mem::MemFault;
use crate::wire::WireError;

use super::{LOCAL_MEMORY_BYTES, MAX_CALL_DEPTH};

/// Why a program stopped abnormally. The packet is dropped under [`Fault::kind`]'s reason.
///
/// The details are boxed so that an instruction's result ([`InstrResult`](super::InstrResult)) stays two words
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
    /// A ternary-match-block XTXN was refused (a table larger than the block).
    Tcam(TcamError),
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
    /// [`FaultDetail::Tcam`].
    Tcam,
}

impl FaultKind {
    /// Every kind, in counter order.
    pub const ALL: [FaultKind; 11] = [
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
        FaultKind::Tcam,
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
            FaultKind::Tcam => "tcam",
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
            FaultKind::Tcam => "fault_tcam",
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
            FaultDetail::Tcam(_) => FaultKind::Tcam,
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
            FaultDetail::Tcam(e) => write!(f, "ternary match block XTXN refused: {e}"),
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

impl std::error::Error for Fault {
    /// The memory, header, hash-engine or ternary-match-block error behind a fault of those
    /// kinds.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.0 {
            FaultDetail::SharedMemory(e) => Some(e),
            FaultDetail::Header(e) => Some(e),
            FaultDetail::Hash(e) => Some(e),
            FaultDetail::Tcam(e) => Some(e),
            _ => None,
        }
    }
}

impl From<MemFault> for Fault {
    fn from(e: MemFault) -> Self {
        FaultDetail::SharedMemory(e).into()
    }
}

impl From<TcamError> for Fault {
    fn from(e: TcamError) -> Self {
        FaultDetail::Tcam(e).into()
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

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn a_fault_that_wraps_an_error_gives_it_as_its_source() {
        let f = Fault::from(MemFault::BadSize { bytes: 3 });
        let src = f.source().expect("a source");
        assert_eq!(src.to_string(), MemFault::BadSize { bytes: 3 }.to_string());
        assert!(Fault::from(FaultDetail::CallDepth).source().is_none());
    }
}
