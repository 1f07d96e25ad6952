//! The thread context an instruction sees: registers, local memory with the packet head, the
//! tail, created packets and the shared-memory XTXNs (counted per kind).

use crate::mem::hash::{HashError, HashTable, Inserted, ScanAction};
use crate::mem::tcam::{Tcam, TcamCache, TcamEntry, TcamError, TcamHit};
use crate::mem::{Addr, Color, Op, PostedOps, SharedMemory, XtxnKind};
use crate::packet::{Dest, OutArena, Port};
use crate::timer::Launch;
use crate::wire::Header;

use super::*;

/// One XTXN of a traced packet (the engine's per-packet trace, `pfe::TraceConfig`): its
/// kind, the address it named (a word address; the key of a ternary lookup; the first 8
/// bytes of a hash key; a tail offset), and the value that came back or went out (a read's
/// word, a fetch-op's old value, a policer's colour, a lookup's result; for a write, the
/// word written), if it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct XtxnEvent {
    /// The kind's name ([`XtxnKind::name`]).
    pub kind: &'static str,
    /// The address (or key) it named.
    pub addr: u64,
    /// The value, if it has one.
    pub value: Option<u64>,
}

/// What one PPE thread owns for its whole life: local memory, the new-tail scratch buffer,
/// its posted XTXNs and per-packet XTXN counts. Never shared.
pub(crate) struct ThreadCore {
    pub lm: Box<[u8; LOCAL_MEMORY_BYTES]>,
    pub new_tail: Vec<u8>,
    pub new_tail_set: bool,
    pub posted: PostedOps,
    pub xtxns: [u64; XtxnKind::COUNT],
    /// `Yield` steps taken since the engine last collected them (with the XTXN counts).
    pub yields: u64,
    /// The ternary match blocks' tables this thread looked up last.
    pub tcams: TcamCache,
    /// The XTXNs of the packet being traced (`None`: not tracing, the usual case).
    pub trace: Option<Vec<XtxnEvent>>,
    /// The running thread's posted add of tail chunks not applied yet
    /// ([`Thread::read_tail_post_vadd32_be`]): a range of that thread's tail, so always
    /// empty between threads ([`Thread::end`] applies it). Kept here rather than in the
    /// `Thread` so that a thread's start does not have to clear it.
    tail_add: Option<TailSpan>,
    /// The outcome of the last packet thread that faulted ([`Program::run_packet`]
    /// returned no verdict), which the PPE loop reads to count the fault; the next fault
    /// replaces it.
    pub faulted: Option<super::RunOutcome>,
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
        crate::mem::copy_lines(
            &mut self.lm[DEFAULT_HEAD_OFFSET..DEFAULT_HEAD_OFFSET + head_len],
            head,
        );
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
            yields: 0,
            tcams: TcamCache::new(),
            trace: None,
            tail_add: None,
            faulted: None,
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
    pub(super) core: &'a mut ThreadCore,
    mem: &'a SharedMemory,
    out: &'a mut OutArena,
    meta: PacketMeta<'a>,
    /// Local memory was written (so the head must be unloaded, not reused as it came).
    lm_written: bool,
    /// The output arena's records below this index survive a fault: those there before
    /// the thread started, and its own created packets up to its last
    /// [`Thread::keep_created`].
    kept_created: usize,
}

/// A posted add whose lanes are still in the packet's tail: the chunks that
/// [`Thread::read_tail_post_vadd32_be`] (or its FPISA twin) posted one after another, kept
/// as a range of the tail rather than copied, and applied from the tail in one request. It
/// belongs to the thread's posted XTXNs: it is applied before any later post, by
/// [`Thread::wait_posted`], and at the latest when the thread ends ([`Thread::end`]), while
/// the tail it names is still there.
struct TailSpan {
    /// Its first shared-memory word.
    addr: Addr,
    /// Where its lanes start in the tail, and how many bytes.
    offset: usize,
    len: usize,
    add: TailAdd,
}

/// The posted XTXN of a [`TailSpan`]: the add [`Thread::read_tail_post_vadd32_be`] and its
/// FPISA twin make, or the write [`Thread::read_tail_post_write`] (or its FPISA twin) makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TailAdd {
    Vadd32,
    Fpisa(crate::fpisa::Format, crate::fpisa::Variant),
    /// Not an add: the chunks written over the words ([`SharedMemory::write_lines`]).
    Write,
    /// Not an add: the accumulators the lanes make, written over the words
    /// ([`SharedMemory::fpisa_write_be`]).
    FpisaWrite(crate::fpisa::Format, crate::fpisa::Variant),
}

#[inline]
fn lm_range(offset: usize, len: usize) -> Result<std::ops::Range<usize>, Fault> {
    match offset.checked_add(len) {
        Some(end) if end <= LOCAL_MEMORY_BYTES => Ok(offset..end),
        _ => Err(FaultDetail::LocalMemory { offset, len }.into()),
    }
}

/// The one-word fetch-and-op XTXNs: each counts itself, applies the op to the 64-bit word at
/// `addr` near the memory and returns the word's old value.
macro_rules! fetch_ops {
    ($($(#[$doc:meta])* $name:ident($operand:ident) = $kind:ident;)*) => {$(
        $(#[$doc])*
        #[inline]
        pub fn $name(&mut self, addr: Addr, $operand: u64) -> Result<u64, Fault> {
            self.count(XtxnKind::$kind);
            let old = self.mem.$name(addr, $operand)?;
            self.note(XtxnKind::$kind, addr, Some(old));
            Ok(old)
        }
    )*};
}

/// The hash XTXNs that take a key and give back the record's value, if any: each counts
/// itself as `$kind` and calls the table's `$op`.
macro_rules! keyed_hash_ops {
    ($($(#[$doc:meta])* $name:ident = $op:ident, $kind:ident;)*) => {$(
        $(#[$doc])*
        #[inline]
        pub fn $name(&mut self, table: &HashTable, key: &[u8]) -> Result<Option<u64>, Fault> {
            self.count(XtxnKind::$kind);
            let value = table.$op(key)?;
            self.note_key(XtxnKind::$kind, key, value);
            Ok(value)
        }
    )*};
}

impl<'a> Thread<'a> {
    /// A new thread context for the packet or timer launch `meta` describes. Whoever makes
    /// one ends it with [`Thread::end`].
    pub(crate) fn new(
        core: &'a mut ThreadCore,
        mem: &'a SharedMemory,
        out: &'a mut OutArena,
        meta: PacketMeta<'a>,
    ) -> Self {
        debug_assert!(core.tail_add.is_none(), "the last thread was not ended");
        core.new_tail.clear();
        core.new_tail_set = false;
        let kept_created = out.recs.len();
        Thread {
            r: [0; REGISTERS],
            core,
            mem,
            out,
            meta,
            lm_written: false,
            kept_created,
        }
    }

    /// Ends the thread: applies its pending add of tail chunks while the tail is there
    /// (see [`TailSpan`]; its other posted XTXNs stay in the core's buffer). Returns where
    /// the head ended up in local memory (start, length), and whether local memory was
    /// written.
    #[inline]
    pub(crate) fn end(&mut self) -> (usize, usize, bool) {
        self.apply_tail_add();
        (self.meta.head_start, self.meta.head_len, self.lm_written)
    }

    /// Keeps the outcome of this thread's run, which faulted, in its core's `faulted`
    /// (where [`Program::run_packet`](super::Program) leaves its own).
    pub(crate) fn keep_fault(&mut self, outcome: super::RunOutcome) {
        self.core.faulted = Some(outcome);
    }

    /// The value of a named register (see [`registers!`](crate::registers)).
    #[inline(always)]
    pub fn get<T: RegValue>(&self, reg: Reg<T>) -> T {
        T::from_reg(self.r[reg.slot()])
    }

    /// Sets a named register (see [`registers!`](crate::registers)).
    #[inline(always)]
    pub fn set<T: RegValue>(&mut self, reg: Reg<T>, value: T) {
        self.r[reg.slot()] = value.to_reg();
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

    /// The head at byte `offset` viewed as header `H`: `t.view::<Ipv4>(ETHER_LEN)?`. Faults
    /// (like [`Thread::head`]) when the head holds fewer than `H::LEN` bytes there.
    #[inline]
    pub fn view<H: Header>(&self, offset: usize) -> Result<H::View<'_>, Fault> {
        Ok(H::view(self.head(offset)?)?)
    }

    /// The head at byte `offset` viewed as header `H`, writable.
    #[inline]
    pub fn view_mut<H: Header>(&mut self, offset: usize) -> Result<H::ViewMut<'_>, Fault> {
        Ok(H::view_mut(self.head_mut(offset)?)?)
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

    /// Keeps the packets this thread has created so far ([`Thread::emit`]): they leave even
    /// if the thread faults later, in creation order and once, as if it had not faulted.
    /// Those it creates after the call are discarded on a fault as before (the engine's
    /// rule: a faulting thread's work is abandoned, packets it created included; see
    /// [`ProgramBuilder::on_fault`]). Call it once a created packet stands on its own and
    /// losing it to a later fault would cost more than sending it: Trio-ML's finisher
    /// keeps each Result it sent, since nothing else would send it again. In a fault
    /// handler it keeps the handler's packets from a fault of the handler itself.
    ///
    /// It issues no XTXN and is not counted; a program that never calls it runs as before.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pfemu::prelude::*;
    /// use pfemu::program::{FaultKind, Harness};
    ///
    /// let mut p = Program::builder("keep");
    /// pfemu::labels!(p => send, spin);
    /// p.instr(send, move |t| {
    ///     t.lm_bytes_mut(0, 64)?.fill(1);
    ///     t.emit(Dest::Port(1), 0, 64)?;
    ///     t.keep_created();
    ///     t.emit(Dest::Port(2), 0, 64)?;
    ///     Ok(Goto(spin))
    /// });
    /// // A runaway loop: the thread faults once its budget runs out.
    /// p.instr(spin, move |_t| Ok(Goto(spin)));
    /// p.entry(Entry::Packet, send);
    /// let program = p.build()?;
    ///
    /// let mut h = Harness::new(Arc::new(SharedMemory::new(&MemConfig::default())?));
    /// h.set_budget(100);
    /// let out = h.run(&program, 0, &[0u8; 64]);
    /// assert_eq!(out.result.unwrap_err().kind(), FaultKind::InstructionBudget);
    /// let dests: Vec<Dest> = out.created.iter().map(|(d, _)| *d).collect();
    /// assert_eq!(dests, [Dest::Port(1)], "the kept packet leaves, the later one does not");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn keep_created(&mut self) {
        self.kept_created = self.out.recs.len();
    }

    /// Discards the packets the thread created since it started or last kept them
    /// ([`Thread::keep_created`]): what the sequencer does to a thread that faults.
    pub(super) fn discard_created(&mut self) {
        self.out.recs.truncate(self.kept_created);
    }

    // ----- shared memory XTXNs (synchronous unless noted) ---------------------------------

    #[inline]
    fn count(&mut self, kind: XtxnKind) {
        self.core.xtxns[kind.index()] += 1;
    }

    /// Notes an XTXN in the packet's trace, when the packet is traced: one predictable
    /// branch otherwise.
    #[inline(always)]
    fn note(&mut self, kind: XtxnKind, addr: u64, value: Option<u64>) {
        if self.core.trace.is_some() {
            self.note_traced(kind, addr, value);
        }
    }

    /// [`Thread::note`]'s work, kept out of the XTXNs' own code.
    #[cold]
    #[inline(never)]
    fn note_traced(&mut self, kind: XtxnKind, addr: u64, value: Option<u64>) {
        if let Some(t) = self.core.trace.as_mut() {
            t.push(XtxnEvent {
                kind: kind.name(),
                addr,
                value,
            });
        }
    }

    /// [`Thread::note`] of a hash XTXN: the key's first 8 bytes as its address.
    fn note_key(&mut self, kind: XtxnKind, key: &[u8], value: Option<u64>) {
        if self.core.trace.is_some() {
            let mut k = [0u8; 8];
            let n = key.len().min(8);
            k[..n].copy_from_slice(&key[..n]);
            self.note(kind, u64::from_be_bytes(k), value);
        }
    }

    /// Reads 8..=64 bytes (a multiple of 8) at `addr` into local memory at `lm_offset`.
    #[inline]
    pub fn mem_read(&mut self, addr: Addr, lm_offset: usize, len: usize) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.count(XtxnKind::Read);
        self.lm_written = true;
        self.mem.read(addr, &mut self.core.lm[range.clone()])?;
        if self.core.trace.is_some() {
            // The first word read, as the trace's value.
            let first = self.core.lm[range.start..range.start + 8]
                .try_into()
                .map(u64::from_be_bytes)
                .ok();
            self.note_traced(XtxnKind::Read, addr, first);
        }
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

    /// Reads the `lanes` FPISA accumulator words from `addr` and leaves their FP32 values,
    /// in network order, at `lm_offset` in local memory (`4 * lanes` bytes): what
    /// [`Thread::mem_read_lines`] of the words' lines and the thread's renormalization of
    /// them ([`crate::fpisa::fp32_values_be_in_place`], the paper's MAU5 to MAU8) leave,
    /// without the words' copy through local memory ([`SharedMemory::fpisa_read_fp32_be`]).
    /// Counted as those line reads: one `read` XTXN per 8 words (64 bytes) or part of them.
    /// 1 to [`crate::mem::MAX_FPISA_LANES`] lanes.
    pub fn fpisa_read_fp32_be(
        &mut self,
        addr: Addr,
        lm_offset: usize,
        lanes: usize,
    ) -> Result<(), Fault> {
        let range = lm_range(lm_offset, lanes.saturating_mul(4))?;
        self.mem
            .fpisa_read_fp32_be(addr, &mut self.core.lm[range])?;
        self.core.xtxns[XtxnKind::Read.index()] += lanes.div_ceil(8) as u64;
        self.lm_written = true;
        Ok(())
    }

    /// Writes 8..=64 bytes (a multiple of 8) of local memory at `lm_offset` to `addr`.
    #[inline]
    pub fn mem_write(&mut self, addr: Addr, lm_offset: usize, len: usize) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        self.count(XtxnKind::Write);
        self.mem.write(addr, &self.core.lm[range])?;
        self.note(XtxnKind::Write, addr, None);
        Ok(())
    }

    /// Reads one 8-byte word.
    #[inline]
    pub fn read_u64(&mut self, addr: Addr) -> Result<u64, Fault> {
        self.count(XtxnKind::Read);
        let v = self.mem.read_u64(addr)?;
        self.note(XtxnKind::Read, addr, Some(v));
        Ok(v)
    }

    /// Writes one 8-byte word.
    #[inline]
    pub fn write_u64(&mut self, addr: Addr, value: u64) -> Result<(), Fault> {
        self.count(XtxnKind::Write);
        self.mem.write_u64(addr, value)?;
        self.note(XtxnKind::Write, addr, Some(value));
        Ok(())
    }

    /// The paper's `CounterIncPhys`: +1 packet and +`bytes` on the 16-byte counter at `addr`.
    #[inline]
    pub fn counter_inc(&mut self, addr: Addr, bytes: u64) -> Result<(), Fault> {
        self.count(XtxnKind::CounterInc);
        self.mem.counter_inc(addr, bytes)?;
        self.note(XtxnKind::CounterInc, addr, Some(bytes));
        Ok(())
    }

    /// Runs `bytes` through the policer at `addr` (time is the engine clock).
    #[inline]
    pub fn police(&mut self, addr: Addr, bytes: u64) -> Result<Color, Fault> {
        self.count(XtxnKind::Police);
        let c = self.mem.police(addr, bytes, self.meta.now_ns)?;
        self.note(XtxnKind::Police, addr, Some(c as u64));
        Ok(c)
    }

    fetch_ops! {
        /// Fetch-and-AND; returns the old value.
        fetch_and(mask) = FetchAnd;
        /// Fetch-and-OR; returns the old value.
        fetch_or(mask) = FetchOr;
        /// Fetch-and-XOR; returns the old value.
        fetch_xor(mask) = FetchXor;
        /// Fetch-and-clear (clears the mask's bits); returns the old value.
        fetch_clear(mask) = FetchClear;
        /// Fetch-and-swap; returns the old value.
        fetch_swap(value) = FetchSwap;
        /// 64-bit wrapping fetch-and-add; returns the old value.
        fetch_add(delta) = FetchAdd;
        /// Fetch-and-max (unsigned): raises the word to `value` if it is below; returns the
        /// old value.
        fetch_max(value) = FetchMax;
    }

    /// Writes the mask's bits of `value`; returns the old word.
    #[inline]
    pub fn masked_write(&mut self, addr: Addr, value: u64, mask: u64) -> Result<u64, Fault> {
        self.count(XtxnKind::MaskedWrite);
        let old = self.mem.masked_write(addr, value, mask)?;
        self.note(XtxnKind::MaskedWrite, addr, Some(old));
        Ok(old)
    }

    /// 32-bit wrapping add to lane 0 (the word's first 4 bytes in network order, its high
    /// half) or lane 1 (the low half); returns the old lane. See
    /// [`SharedMemory::fetch_add32`].
    #[inline]
    pub fn fetch_add32(&mut self, addr: Addr, lane: u8, delta: u32) -> Result<u32, Fault> {
        self.count(XtxnKind::Add32);
        let old = self.mem.fetch_add32(addr, lane, delta)?;
        self.note(XtxnKind::Add32, addr, Some(u64::from(old)));
        Ok(old)
    }

    /// Adds 16 32-bit lanes (a 64-byte chunk of gradients) at `addr`.
    #[inline]
    pub fn vadd32x16(&mut self, addr: Addr, deltas: &[u32; 16]) -> Result<(), Fault> {
        self.count(XtxnKind::VAdd32x16);
        self.mem.vadd32x16(addr, deltas)?;
        self.note(XtxnKind::VAdd32x16, addr, None);
        Ok(())
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
        self.mem.vadd32_be(addr, &self.core.lm[range])?;
        self.note(XtxnKind::VAdd32x16, addr, None);
        Ok(())
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
    /// The events of applied adds are collected by [`Thread::take_fpisa_counts`]. Counted
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
        self.apply_tail_add();
        self.core.xtxns[XtxnKind::FpisaAdd16.index()] += lanes.div_ceil(16) as u64;
        self.core
            .posted
            .post_fpisa_add_be(self.mem, addr, &self.core.lm[range], fmt, variant)?;
        Ok(())
    }

    /// Writes the FPISA accumulator words that adding the big-endian `fmt` lanes in `len`
    /// bytes of local memory at `lm_offset` into empty accumulators leaves, one word per
    /// lane from `addr`, whatever the words held ([`SharedMemory::fpisa_write_be`]): a
    /// buffer's first contents without zeroing it first. Counted as one `write` XTXN per
    /// 64 bytes of words (8 lanes) or part of them: splitting a float into an empty
    /// accumulator is the thread's own shifts and masks. Its events (special lanes only) are
    /// collected with the posted adds' by [`Thread::take_fpisa_counts`].
    pub fn fpisa_write_be(
        &mut self,
        addr: Addr,
        lm_offset: usize,
        len: usize,
        fmt: crate::fpisa::Format,
        variant: crate::fpisa::Variant,
    ) -> Result<(), Fault> {
        let range = lm_range(lm_offset, len)?;
        let counts = self
            .mem
            .fpisa_write_be(addr, &self.core.lm[range], fmt, variant)?;
        self.core.xtxns[XtxnKind::Write.index()] += counts.adds.div_ceil(8);
        self.core.posted.note_fpisa_counts(&counts);
        Ok(())
    }

    /// The events of this thread's posted FPISA adds (and its FPISA writes) applied since
    /// the last call (after [`Thread::wait_posted`], all of them so far).
    pub fn take_fpisa_counts(&mut self) -> crate::fpisa::FpisaCounts {
        self.core.posted.take_fpisa_counts()
    }

    // ----- hash engine XTXNs ---------------------------------------------------------------

    keyed_hash_ops! {
        /// Looks `key` up in a hash table; a found record is marked referenced.
        hash_lookup = lookup, HashLookup;
        /// Looks `key` up in a hash table without marking it referenced: for a look that
        /// must not keep a record alive (a scan that ages records by their REF flags would
        /// otherwise never see it idle). Counted as a lookup.
        hash_peek = peek, HashLookup;
        /// Deletes a record; its value, or `None` if there was none.
        hash_delete = delete, HashDelete;
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
        let r = table.insert(key, value);
        self.note_key(XtxnKind::HashInsert, key, Some(value));
        r
    }

    /// Replaces an existing record's value; the old value, or `None` if there is none.
    pub fn hash_update(
        &mut self,
        table: &HashTable,
        key: &[u8],
        value: u64,
    ) -> Result<Option<u64>, Fault> {
        self.count(XtxnKind::HashUpdate);
        let old = table.update(key, value)?;
        self.note_key(XtxnKind::HashUpdate, key, old);
        Ok(old)
    }

    /// Replaces an existing record's value if it is still `expected`: the value found, or
    /// `None` if there is none (the record holds `value` now exactly when that is
    /// `Some(expected)`). See [`HashTable::compare_update`]. Counted as a `hash_update`.
    pub fn hash_compare_update(
        &mut self,
        table: &HashTable,
        key: &[u8],
        expected: u64,
        value: u64,
    ) -> Result<Option<u64>, Fault> {
        self.count(XtxnKind::HashUpdate);
        let found = table.compare_update(key, expected, value)?;
        self.note_key(XtxnKind::HashUpdate, key, found);
        Ok(found)
    }

    /// Deletes a record if its value is still `expected`: the value found, or `None` if there
    /// is none (the record is gone exactly when that is `Some(expected)`). See
    /// [`HashTable::compare_delete`]. Counted as a `hash_delete`.
    pub fn hash_compare_delete(
        &mut self,
        table: &HashTable,
        key: &[u8],
        expected: u64,
    ) -> Result<Option<u64>, Fault> {
        self.count(XtxnKind::HashDelete);
        let found = table.compare_delete(key, expected)?;
        self.note_key(XtxnKind::HashDelete, key, found);
        Ok(found)
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

    // ----- ternary match block XTXNs -------------------------------------------------------

    /// Looks `key` up in a ternary match block: the winning entry and its result, or `None`
    /// when no entry matches. The winner's hit counter counts the lookup. See
    /// [`Tcam::lookup`].
    #[inline]
    pub fn tcam_lookup(&mut self, tcam: &Tcam, key: u32) -> Option<TcamHit> {
        self.count(XtxnKind::TcamLookup);
        let hit = self.core.tcams.lookup(tcam, key);
        self.note(XtxnKind::TcamLookup, u64::from(key), hit.map(|h| h.result));
        hit
    }

    /// Reads the hit counters of a ternary match block's current table, with the table's
    /// version (a controller's read of its monitoring bins): one `tcam_read` XTXN per
    /// counter. See [`Tcam::hits`].
    pub fn tcam_hits(&mut self, tcam: &Tcam) -> (u64, Vec<u64>) {
        let (version, hits) = tcam.hits();
        self.core.xtxns[XtxnKind::TcamRead.index()] += hits.len() as u64;
        (version, hits)
    }

    /// Installs `entries` as a ternary match block's whole new table (lookups see the old
    /// table or the new one, never a mix) and returns its version: one `tcam_write` XTXN
    /// per entry. A table too large for the block is refused, the old one kept, and
    /// nothing counted. See [`Tcam::replace`].
    pub fn tcam_replace(&mut self, tcam: &Tcam, entries: Vec<TcamEntry>) -> Result<u64, TcamError> {
        let n = entries.len() as u64;
        let version = tcam.replace(entries)?;
        self.core.xtxns[XtxnKind::TcamWrite.index()] += n;
        Ok(version)
    }

    /// Posts an asynchronous XTXN: the thread does not wait for it; it is applied exactly
    /// once, no later than the end of the batch the packet belongs to, so it is visible
    /// after [`crate::Pfe::drain`]. The address is checked now.
    #[inline(always)]
    pub fn post(&mut self, op: Op) -> Result<(), Fault> {
        self.apply_tail_add();
        self.count(op.kind());
        self.core.posted.post(self.mem, op)?;
        self.note(op.kind(), op.addr(), None);
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
        self.apply_tail_add();
        self.core.xtxns[XtxnKind::VAdd32x16.index()] += (len / 64) as u64;
        self.core
            .posted
            .post_vadd32_be(self.mem, addr, &self.core.lm[range])?;
        Ok(())
    }

    /// Reads `len` bytes of the tail at `tail_offset` and posts them as a vector add of
    /// big-endian 32-bit lanes at `addr`: exactly what reading each 64-byte chunk into local
    /// memory at `lm_offset` ([`Thread::read_tail`]) and posting it from there
    /// ([`Thread::post_vadd32_be`]) does, chunk after chunk, and counted the same (a
    /// `tail_read` and a `vadd32x16` XTXN per chunk), with local memory left as that
    /// sequence leaves it (the last chunk at `lm_offset`); a fault comes at the chunk it
    /// would have come at, after the chunks before it were posted. It saves the emulator
    /// the copy through local memory, the per-chunk checks and any copy of the lanes: the
    /// add stays pending as a range of the tail, continued by the next such call that
    /// starts where it ends, and is applied from the tail itself (before any later post, by
    /// [`Thread::wait_posted`], or when the thread ends). A program's meaning does not
    /// change.
    pub fn read_tail_post_vadd32_be(
        &mut self,
        addr: Addr,
        tail_offset: usize,
        lm_offset: usize,
        len: usize,
    ) -> Result<(), Fault> {
        self.read_tail_post(addr, tail_offset, lm_offset, len, TailAdd::Vadd32)
    }

    /// [`Thread::read_tail_post_vadd32_be`] with writes for adds: the tail's 64-byte chunks
    /// read through local memory at `lm_offset` and each written to its line from `addr`
    /// ([`Thread::mem_write`] of 64 bytes, one `write` XTXN per chunk), posted like the
    /// adds and with the same faults and local memory. For a buffer's first contents, e.g.
    /// the gradients of a block's first packet: the words a vector add of the lanes into
    /// zeros would leave, without zeroing the buffer first.
    pub fn read_tail_post_write(
        &mut self,
        addr: Addr,
        tail_offset: usize,
        lm_offset: usize,
        len: usize,
    ) -> Result<(), Fault> {
        self.read_tail_post(addr, tail_offset, lm_offset, len, TailAdd::Write)
    }

    /// [`Thread::read_tail_post_vadd32_be`] for FPISA adds: the tail's 64-byte chunks read
    /// through local memory at `lm_offset` and posted by [`Thread::post_fpisa_add_be`] one
    /// after another, in one call, with the same XTXNs, faults and local memory.
    pub fn read_tail_post_fpisa_add_be(
        &mut self,
        addr: Addr,
        tail_offset: usize,
        lm_offset: usize,
        len: usize,
        fmt: crate::fpisa::Format,
        variant: crate::fpisa::Variant,
    ) -> Result<(), Fault> {
        let add = TailAdd::Fpisa(fmt, variant);
        self.read_tail_post(addr, tail_offset, lm_offset, len, add)
    }

    /// [`Thread::read_tail_post_fpisa_add_be`] with writes for adds: the tail's 64-byte
    /// chunks read through local memory at `lm_offset` and each written as accumulators from
    /// `addr` ([`Thread::fpisa_write_be`]; an FP32 chunk is two lines of words, two `write`
    /// XTXNs), posted like the adds and with the same faults and local memory. For an FPISA
    /// buffer's first contents: the words adding the lanes into zeros would leave.
    pub fn read_tail_post_fpisa_write_be(
        &mut self,
        addr: Addr,
        tail_offset: usize,
        lm_offset: usize,
        len: usize,
        fmt: crate::fpisa::Format,
        variant: crate::fpisa::Variant,
    ) -> Result<(), Fault> {
        let add = TailAdd::FpisaWrite(fmt, variant);
        self.read_tail_post(addr, tail_offset, lm_offset, len, add)
    }

    fn read_tail_post(
        &mut self,
        addr: Addr,
        tail_offset: usize,
        lm_offset: usize,
        len: usize,
        add: TailAdd,
    ) -> Result<(), Fault> {
        const CHUNK: usize = 64;
        // Shared-memory words a chunk adds into (or writes), the whole request's size limit,
        // and the XTXN kind with how many a chunk counts as.
        let (chunk_words, max_bytes, kind, per_chunk) = match add {
            TailAdd::Write => (
                CHUNK / crate::mem::WORD_BYTES,
                crate::mem::MAX_VADD_BYTES,
                XtxnKind::Write,
                1,
            ),
            TailAdd::Vadd32 => (
                CHUNK / crate::mem::WORD_BYTES,
                crate::mem::MAX_VADD_BYTES,
                XtxnKind::VAdd32x16,
                1,
            ),
            TailAdd::Fpisa(fmt, _) | TailAdd::FpisaWrite(fmt, _) => {
                let width = (fmt.width() / 8) as usize;
                let lanes = CHUNK / width;
                let (kind, per_chunk) = match add {
                    TailAdd::FpisaWrite(..) => (XtxnKind::Write, lanes.div_ceil(8)),
                    _ => (XtxnKind::FpisaAdd16, lanes.div_ceil(16)),
                };
                (
                    lanes,
                    crate::mem::MAX_FPISA_LANES * width,
                    kind,
                    per_chunk as u64,
                )
            }
        };
        let chunks = len / CHUNK;
        let fits = len > 0
            && len.is_multiple_of(CHUNK)
            && len <= max_bytes
            && (tail_offset.checked_add(len)).is_some_and(|end| end <= self.meta.tail.len())
            && lm_range(lm_offset, CHUNK).is_ok()
            && self.mem.check(addr, (chunks * chunk_words) as u64).is_ok();
        if !fits {
            // Some chunk faults (or the request is odd): chunk by chunk, as the program
            // would, so that the fault comes where it would have.
            for k in 0..len.div_ceil(CHUNK) {
                let bytes = CHUNK.min(len - k * CHUNK);
                self.read_tail(tail_offset + k * CHUNK, lm_offset, bytes)?;
                let at = addr + (k * chunk_words) as u64;
                match add {
                    TailAdd::Write => {
                        // Posting order: whatever was posted before goes first.
                        self.wait_posted();
                        self.mem_write(at, lm_offset, bytes)?
                    }
                    TailAdd::Vadd32 => self.post_vadd32_be(at, lm_offset, bytes)?,
                    TailAdd::Fpisa(fmt, variant) => {
                        self.post_fpisa_add_be(at, lm_offset, bytes, fmt, variant)?
                    }
                    TailAdd::FpisaWrite(fmt, variant) => {
                        self.wait_posted();
                        self.fpisa_write_be(at, lm_offset, bytes, fmt, variant)?
                    }
                }
            }
            return Ok(());
        }
        // Posted as a range of the tail, not copied: the lanes are applied from the tail
        // itself, all of a packet's chunks in one request when they continue one another.
        let pending = match &mut self.core.tail_add {
            Some(p)
                if p.add == add
                    && p.offset + p.len == tail_offset
                    && p.addr + (p.len / CHUNK * chunk_words) as u64 == addr
                    && p.len + len <= max_bytes =>
            {
                p.len += len;
                p.len
            }
            _ => {
                // Posting order: whatever was posted before goes first.
                self.apply_tail_add();
                self.core.posted.flush(self.mem);
                self.core.tail_add = Some(TailSpan {
                    addr,
                    offset: tail_offset,
                    len,
                    add,
                });
                len
            }
        };
        // A range that ends at the tail's end or has reached the size limit can be continued
        // by no later call: apply it now, and the chunk copied into local memory below comes
        // from lines the add has just read instead of costing a miss of its own.
        let end = tail_offset + len;
        if end == self.meta.tail.len() || pending == max_bytes {
            self.apply_pending_tail_add();
        }
        let last = end - CHUNK;
        crate::mem::copy_bytes(
            &mut self.core.lm[lm_offset..lm_offset + CHUNK],
            &self.meta.tail[last..last + CHUNK],
        );
        self.lm_written = true;
        self.core.xtxns[XtxnKind::TailRead.index()] += chunks as u64;
        self.core.xtxns[kind.index()] += chunks as u64 * per_chunk;
        Ok(())
    }

    /// Waits for the replies of every outstanding posted XTXN of this thread
    /// ([`Thread::post`], [`Thread::post_vadd32_be`]): when it returns, all of them have been
    /// applied, and are visible to any thread that observes a later XTXN of this one. Call
    /// it before an XTXN that tells other threads the posted work is done (Trio-ML waits
    /// for its gradient adds before it counts its source in the block).
    pub fn wait_posted(&mut self) {
        self.apply_tail_add();
        self.core.posted.flush(self.mem);
    }

    /// Applies the pending add of tail chunks, if any (see [`TailSpan`]).
    #[inline(always)]
    fn apply_tail_add(&mut self) {
        // Only the test on the common path (no pending add): the rest out of line.
        if self.core.tail_add.is_some() {
            self.apply_pending_tail_add();
        }
    }

    #[inline(never)]
    fn apply_pending_tail_add(&mut self) {
        let Some(TailSpan {
            addr,
            offset,
            len,
            add,
        }) = self.core.tail_add.take()
        else {
            return;
        };
        let data = &self.meta.tail[offset..offset + len];
        // Checked chunk by chunk when posted, contiguous in one region: cannot fault.
        let applied = match add {
            TailAdd::Write => self.mem.write_lines(addr, data),
            TailAdd::Vadd32 => self.mem.vadd32_be(addr, data),
            TailAdd::Fpisa(fmt, variant) => self
                .mem
                .fpisa_add_be(addr, data, fmt, variant)
                .map(|c| self.core.posted.note_fpisa_counts(&c)),
            TailAdd::FpisaWrite(fmt, variant) => self
                .mem
                .fpisa_write_be(addr, data, fmt, variant)
                .map(|c| self.core.posted.note_fpisa_counts(&c)),
        };
        debug_assert!(
            applied.is_ok(),
            "posted add of the tail at {addr:#x} faulted when applied: {applied:?}"
        );
    }
}
