//! Posted (asynchronous) XTXNs: a PPE thread's fire-and-forget buffer. Crate-private: a
//! program posts through its `Thread` (`Thread::post`, `Thread::post_vadd32_be`,
//! `Thread::post_fpisa_add_be`), which counts the XTXNs.

use super::{Addr, MemFault, Op, SharedMemory, MAX_FPISA_LANES, MAX_VADD_BYTES, WORD_BYTES};
use crate::fpisa::{Format, FpisaCounts, Variant};

/// `(addr, packets, bytes)` of a counter addition.
pub(crate) fn counter_delta(op: &Op) -> Option<(Addr, u64, u64)> {
    match *op {
        Op::CounterInc { addr, bytes } => Some((addr, 1, bytes)),
        Op::CounterAdd {
            addr,
            packets,
            bytes,
        } => Some((addr, packets, bytes)),
        _ => None,
    }
}

/// A PPE thread's buffer of posted (asynchronous) XTXNs: fire and forget, applied exactly once.
///
/// Owned by one thread, not shared. [`PostedOps::post`] validates the operation against the
/// memory immediately, so a bad address faults the posting program at post time, then buffers
/// it; the buffered operations are applied in posting order by [`PostedOps::flush`], which
/// `post` also calls when the buffer is full. Flush before dropping the buffer (e.g. at the end
/// of every packet): operations still buffered at drop are discarded.
/// Operations are validated against the memory passed to `post`; flush into the same memory.
///
/// Posted vector adds ([`PostedOps::post_vadd32_be`]) are kept apart, as one pending span of
/// big-endian lanes: a vector add that continues the pending span (its first word is the
/// word after the span's last) is appended to it, up to [`MAX_VADD_BYTES`], so the 64 posted
/// line adds of a 4 KB packet reach the engine as one 4 KB vector add. Posting order is
/// kept: posting an [`Op`] applies the pending span first, and posting a vector add applies
/// the buffered operations first.
#[derive(Debug)]
pub(crate) struct PostedOps {
    buf: Vec<Op>,
    capacity: usize,
    /// First word of the pending vector add (meaningless while `vadd_len` is 0).
    vadd_addr: Addr,
    /// Bytes of the pending vector add, in `vadd[..vadd_len]`.
    vadd_len: usize,
    /// The pending vector add's big-endian lanes, as posted (the engine converts them as it
    /// adds, in one pass over the whole span).
    vadd: Box<[u8; MAX_VADD_BYTES]>,
    /// The pending FPISA add: its first word, its lanes' format and variant, and its
    /// big-endian lanes in `fpisa[..fpisa_len]` (one accumulator word per lane).
    fpisa_addr: Addr,
    fpisa_kind: (Format, Variant),
    fpisa_len: usize,
    fpisa: Box<[u8; MAX_FPISA_BYTES]>,
    /// What the applied FPISA adds did, since [`PostedOps::take_fpisa_counts`].
    fpisa_counts: FpisaCounts,
}

/// Bytes of the largest pending FPISA add: [`MAX_FPISA_LANES`] FP32 lanes.
const MAX_FPISA_BYTES: usize = MAX_FPISA_LANES * 4;

impl PostedOps {
    /// A buffer holding up to `capacity` operations (0 is treated as 1: every post of a new
    /// operation flushes the previous one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        PostedOps {
            buf: Vec::with_capacity(capacity),
            capacity,
            vadd_addr: 0,
            vadd_len: 0,
            vadd: Box::new([0; MAX_VADD_BYTES]),
            fpisa_addr: 0,
            fpisa_kind: (Format::Fp32, Variant::Full),
            fpisa_len: 0,
            fpisa: Box::new([0; MAX_FPISA_BYTES]),
            fpisa_counts: FpisaCounts::default(),
        }
    }

    /// How many operations the buffer holds before a post flushes it (only the tests look).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Validates `op` against `mem` (range and lane; a fault is returned now and nothing is
    /// buffered), flushes if the buffer is full, then buffers `op`.
    pub fn post(&mut self, mem: &SharedMemory, op: Op) -> Result<(), MemFault> {
        mem.check_op(&op)?;
        self.apply_vadd(mem);
        self.apply_fpisa(mem);
        if let Some((addr, packets, bytes)) = counter_delta(&op) {
            if self.coalesce(addr, packets, bytes) {
                return Ok(());
            }
        }
        if self.buf.len() >= self.capacity {
            self.flush(mem);
        }
        self.buf.push(op);
        Ok(())
    }

    /// Merges a counter addition into the latest buffered one of the same counter, unless an
    /// operation in between touches the counter's words. True if merged.
    fn coalesce(&mut self, addr: Addr, packets: u64, bytes: u64) -> bool {
        for earlier in self.buf.iter_mut().rev() {
            if let Some((a, p, b)) = counter_delta(earlier) {
                if a == addr {
                    *earlier = Op::CounterAdd {
                        addr,
                        packets: p.wrapping_add(packets),
                        bytes: b.wrapping_add(bytes),
                    };
                    return true;
                }
            }
            let (start, end) = (earlier.addr(), earlier.addr() + earlier.words());
            if start < addr + 2 && addr < end {
                return false;
            }
        }
        false
    }

    /// Posts a vector add of big-endian lanes, [`SharedMemory::vadd32_be`]`(addr, data)`:
    /// validates the size and range now (a fault is returned and nothing is posted), then
    /// appends `data` to the pending vector add when it continues it and the sum fits in
    /// [`MAX_VADD_BYTES`]; otherwise applies the pending one and starts a new one. Applied
    /// exactly once, at the latest by the next [`PostedOps::flush`].
    #[inline]
    pub fn post_vadd32_be(
        &mut self,
        mem: &SharedMemory,
        addr: Addr,
        data: &[u8],
    ) -> Result<(), MemFault> {
        let bytes = data.len();
        mem.check(addr, super::bank::line_request_words(bytes)?)?;
        if !self.buf.is_empty() {
            self.apply_ops(mem);
        }
        self.apply_fpisa(mem);
        // Regions are never adjacent, so a span continued word by word stays in one region.
        let n = self.vadd_len;
        let end = self.vadd_addr + (n / WORD_BYTES) as u64;
        if n > 0 && (addr != end || n + bytes > MAX_VADD_BYTES) {
            self.apply_vadd(mem);
        }
        if self.vadd_len == 0 {
            self.vadd_addr = addr;
        }
        super::copy_bytes(&mut self.vadd[self.vadd_len..self.vadd_len + bytes], data);
        self.vadd_len += bytes;
        Ok(())
    }

    /// Posts an FPISA add of big-endian lanes, [`SharedMemory::fpisa_add_be`]`(addr, data,
    /// fmt, variant)`: validates the size and range now (a fault is returned and nothing is
    /// posted), then appends `data` to the pending FPISA add when it continues it (the same
    /// format and variant, its first lane's word right after the pending one's last) and the
    /// whole fits [`MAX_FPISA_LANES`]; otherwise applies the pending one first. A packet's
    /// chunks so reach the engine as one request, under one stripe lock. The events of the
    /// applied adds accumulate for [`PostedOps::take_fpisa_counts`].
    #[inline]
    pub fn post_fpisa_add_be(
        &mut self,
        mem: &SharedMemory,
        addr: Addr,
        data: &[u8],
        fmt: Format,
        variant: Variant,
    ) -> Result<(), MemFault> {
        let width = (fmt.width() / 8) as usize;
        let bytes = data.len();
        let lanes = bytes / width;
        if bytes == 0 || !bytes.is_multiple_of(width) || lanes > MAX_FPISA_LANES {
            return Err(MemFault::BadSize { bytes });
        }
        mem.check(addr, lanes as u64)?;
        if !self.buf.is_empty() {
            self.apply_ops(mem);
        }
        self.apply_vadd(mem);
        let n = self.fpisa_len;
        let pending = n / (self.fpisa_kind.0.width() / 8) as usize;
        let continues = addr == self.fpisa_addr + pending as u64
            && self.fpisa_kind == (fmt, variant)
            && pending + lanes <= MAX_FPISA_LANES;
        if n > 0 && !continues {
            self.apply_fpisa(mem);
        }
        if self.fpisa_len == 0 {
            self.fpisa_addr = addr;
            self.fpisa_kind = (fmt, variant);
        }
        super::copy_bytes(
            &mut self.fpisa[self.fpisa_len..self.fpisa_len + bytes],
            data,
        );
        self.fpisa_len += bytes;
        Ok(())
    }

    /// Applies the pending FPISA add, if any.
    #[inline(never)]
    fn apply_fpisa(&mut self, mem: &SharedMemory) {
        if self.fpisa_len == 0 {
            return;
        }
        let (fmt, variant) = self.fpisa_kind;
        // Validated piece by piece at post time, contiguous in one region: cannot fault.
        match mem.fpisa_add_be(self.fpisa_addr, &self.fpisa[..self.fpisa_len], fmt, variant) {
            Ok(c) => self.fpisa_counts.merge(&c),
            Err(e) => debug_assert!(false, "posted FPISA add faulted at flush: {e:?}"),
        }
        self.fpisa_len = 0;
    }

    /// Counts the events of an FPISA add applied on the poster's behalf (a thread's add of
    /// tail chunks, applied from the tail rather than from this buffer).
    pub fn note_fpisa_counts(&mut self, c: &FpisaCounts) {
        self.fpisa_counts.merge(c);
    }

    /// The events of the FPISA adds applied since the last call (overwrites, left shifts,
    /// overflows, and the additions made), and starts counting afresh.
    pub fn take_fpisa_counts(&mut self) -> FpisaCounts {
        std::mem::take(&mut self.fpisa_counts)
    }

    /// Applies the pending vector add, if any.
    #[inline(never)]
    fn apply_vadd(&mut self, mem: &SharedMemory) {
        if self.vadd_len == 0 {
            return;
        }
        // Validated piece by piece at post time, and contiguous in one region: cannot fault.
        let applied = mem.vadd32_be(self.vadd_addr, &self.vadd[..self.vadd_len]);
        debug_assert!(
            applied.is_ok(),
            "posted vector add at {:#x} faulted at flush: {applied:?}",
            self.vadd_addr
        );
        self.vadd_len = 0;
    }

    /// Applies every buffered operation and the pending vector add to `mem`, in posting
    /// order, exactly once, and empties the buffer.
    pub fn flush(&mut self, mem: &SharedMemory) {
        // At most one of the three is non-empty: posting any kind applies the others.
        self.apply_ops(mem);
        self.apply_vadd(mem);
        self.apply_fpisa(mem);
    }

    /// Applies the buffered operations (not the pending vector add).
    #[inline(never)]
    fn apply_ops(&mut self, mem: &SharedMemory) {
        for op in self.buf.drain(..) {
            // Validated at post time against this memory: cannot fault.
            let applied = mem.apply(&op);
            debug_assert!(
                applied.is_ok(),
                "posted {op:?} faulted at flush: {applied:?}"
            );
        }
    }

    /// Number of buffered (not yet applied) operations; a pending vector add counts as one
    /// (only the tests look).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.buf.len() + usize::from(self.vadd_len > 0) + usize::from(self.fpisa_len > 0)
    }

    /// `true` when nothing is buffered (only the tests look).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.vadd_len == 0 && self.fpisa_len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MemConfig, DRAM_BASE};
    use super::*;

    fn mem() -> SharedMemory {
        SharedMemory::new(&MemConfig {
            sram_bytes: 1024,
            dram_bytes: 1024,
            acc_bytes: 0,
            banks: 2,
        })
        .unwrap()
    }

    #[test]
    fn buffered_until_flush_then_applied_in_order_once() {
        let m = mem();
        let mut p = PostedOps::new(8);
        assert!(p.is_empty());
        p.post(
            &m,
            Op::WriteU64 {
                addr: 3,
                value: 0xF0,
            },
        )
        .unwrap();
        p.post(
            &m,
            Op::FetchOr {
                addr: 3,
                mask: 0x0F,
            },
        )
        .unwrap();
        p.post(
            &m,
            Op::FetchClear {
                addr: 3,
                mask: 0x80,
            },
        )
        .unwrap();
        p.post(
            &m,
            Op::CounterInc {
                addr: DRAM_BASE,
                bytes: 60,
            },
        )
        .unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(m.read_u64(3), Ok(0));
        assert_eq!(m.counter_read(DRAM_BASE), Ok((0, 0)));
        p.flush(&m);
        assert!(p.is_empty());
        assert_eq!(m.read_u64(3), Ok(0x7F));
        assert_eq!(m.counter_read(DRAM_BASE), Ok((1, 60)));
        p.flush(&m);
        assert_eq!(m.counter_read(DRAM_BASE), Ok((1, 60)));
    }

    #[test]
    fn faults_at_post_time() {
        let m = mem();
        let mut p = PostedOps::new(4);
        p.post(&m, Op::CounterInc { addr: 0, bytes: 1 }).unwrap();
        let last = m.region(super::super::Region::Sram).end - 1;
        assert_eq!(
            p.post(
                &m,
                Op::CounterInc {
                    addr: last,
                    bytes: 1
                }
            ),
            Err(MemFault::OutOfRange {
                addr: last,
                words: 2
            })
        );
        assert_eq!(
            p.post(
                &m,
                Op::FetchAdd32 {
                    addr: 0,
                    lane: 2,
                    delta: 1
                }
            ),
            Err(MemFault::BadLane { lane: 2 })
        );
        assert_eq!(
            p.post(
                &m,
                Op::Vadd32x16 {
                    addr: DRAM_BASE - 4,
                    deltas: [1; 16]
                }
            ),
            Err(MemFault::OutOfRange {
                addr: DRAM_BASE - 4,
                words: 8
            })
        );
        assert_eq!(p.len(), 1);
        p.flush(&m);
        assert_eq!(m.counter_read(0), Ok((1, 1)));
        assert_eq!(m.read_u64(last), Ok(0));
    }

    #[test]
    fn full_buffer_flushes_first() {
        let m = mem();
        let mut p = PostedOps::new(2);
        for i in 0..5u32 {
            p.post(
                &m,
                Op::FetchAdd32 {
                    addr: 1,
                    lane: 1,
                    delta: 1 << i,
                },
            )
            .unwrap();
            // after posting op i, ops 0..i rounded down to a multiple of 2 are applied
            let applied = (i / 2) * 2;
            assert_eq!(m.read_u64(1), Ok((1u64 << applied) - 1), "after op {i}");
            assert_eq!(p.len() as u32, i + 1 - applied);
        }
        p.flush(&m);
        assert_eq!(m.read_u64(1), Ok(0b11111));
    }

    #[test]
    fn zero_capacity_means_one() {
        let m = mem();
        let mut p = PostedOps::new(0);
        assert_eq!(p.capacity(), 1);
        p.post(&m, Op::FetchSwap { addr: 0, value: 1 }).unwrap();
        assert_eq!(m.read_u64(0), Ok(0));
        p.post(&m, Op::FetchSwap { addr: 0, value: 2 }).unwrap();
        assert_eq!(m.read_u64(0), Ok(1));
        assert_eq!(p.len(), 1);
        p.flush(&m);
        assert_eq!(m.read_u64(0), Ok(2));
    }

    #[test]
    fn counter_increments_coalesce_unless_something_touches_the_counter_between() {
        let m = mem();
        let mut p = PostedOps::new(8);
        for i in 0..100u64 {
            p.post(&m, Op::CounterInc { addr: 0, bytes: i }).unwrap();
            p.post(&m, Op::CounterInc { addr: 2, bytes: 1 }).unwrap();
        }
        assert_eq!(p.len(), 2, "two counters, one buffered addition each");
        // A write to the byte word of counter 0 must not be reordered with increments.
        p.post(
            &m,
            Op::WriteU64 {
                addr: 1,
                value: 1000,
            },
        )
        .unwrap();
        p.post(&m, Op::CounterInc { addr: 0, bytes: 5 }).unwrap();
        assert_eq!(p.len(), 4);
        p.flush(&m);
        assert_eq!(m.counter_read(0), Ok((101, 1005)));
        assert_eq!(m.counter_read(2), Ok((100, 100)));
    }

    proptest::proptest! {
        /// Posting then flushing equals applying each operation in order, whatever
        /// coalescing does, on a window of a few words where operations collide.
        #[test]
        fn posted_equals_sequential(ops in proptest::collection::vec((0u8..6, 0u64..6, 0u64..1000), 1..200)) {
            let (posted, direct) = (mem(), mem());
            let mut p = PostedOps::new(16);
            for (kind, addr, v) in ops {
                let op = match kind {
                    0 => Op::CounterInc { addr, bytes: v },
                    1 => Op::CounterAdd { addr, packets: v % 7, bytes: v },
                    2 => Op::WriteU64 { addr, value: v },
                    3 => Op::FetchXor { addr, mask: v },
                    4 => Op::FetchAdd32 { addr, lane: (v % 2) as u8, delta: v as u32 },
                    _ => Op::MaskedWrite { addr, value: v, mask: 0xff00 },
                };
                p.post(&posted, op).unwrap();
                direct.apply(&op).unwrap();
            }
            p.flush(&posted);
            for a in 0..8 {
                proptest::prop_assert_eq!(posted.read_u64(a), direct.read_u64(a), "word {}", a);
            }
        }
    }
}
