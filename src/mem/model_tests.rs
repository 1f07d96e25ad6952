//! Property test: random single-threaded operation sequences on [`SharedMemory`] (and through
//! [`PostedOps`]) behave exactly like a plain `HashMap<Addr, u64>` model.

use std::collections::HashMap;

use proptest::prelude::*;

use super::{Addr, MemConfig, MemFault, Op, PostedOps, SharedMemory, DRAM_BASE};

const SRAM_WORDS: u64 = 512;
/// Just over one 1 MiB DRAM chunk, so accesses can straddle the chunk boundary.
const DRAM_WORDS: u64 = (1 << 17) + 64;
const POST_CAPACITY: usize = 3;

fn config() -> MemConfig {
    MemConfig {
        sram_bytes: SRAM_WORDS * 8,
        dram_bytes: DRAM_WORDS * 8,
        acc_bytes: 0,
        banks: 4,
    }
}

/// Independent statement of the address map.
fn mapped(addr: Addr, words: u64) -> bool {
    let words = words.max(1);
    let inside =
        |base: u64, len: u64| addr >= base && addr - base < len && addr - base + words <= len;
    inside(0, SRAM_WORDS) || inside(DRAM_BASE, DRAM_WORDS)
}

#[derive(Default)]
struct Model {
    words: HashMap<Addr, u64>,
    pending: Vec<Op>,
}

impl Model {
    fn get(&self, a: Addr) -> u64 {
        self.words.get(&a).copied().unwrap_or(0)
    }

    fn set(&mut self, a: Addr, v: u64) {
        self.words.insert(a, v);
    }

    fn range(addr: Addr, words: u64) -> Result<(), MemFault> {
        if mapped(addr, words) {
            Ok(())
        } else {
            Err(MemFault::OutOfRange { addr, words })
        }
    }

    /// Applies `f` to the word: returns the old value.
    fn rmw(&mut self, a: Addr, f: impl FnOnce(u64) -> u64) -> Result<u64, MemFault> {
        Self::range(a, 1)?;
        let old = self.get(a);
        self.set(a, f(old));
        Ok(old)
    }

    fn add32(&mut self, a: Addr, lane: u8, d: u32) -> Result<u32, MemFault> {
        if lane > 1 {
            return Err(MemFault::BadLane { lane });
        }
        let shift = if lane == 0 { 32 } else { 0 };
        let old = self.rmw(a, |w| {
            let l = ((w >> shift) as u32).wrapping_add(d);
            (w & !(0xFFFF_FFFFu64 << shift)) | (u64::from(l) << shift)
        })?;
        Ok((old >> shift) as u32)
    }

    fn read(&self, a: Addr, len: usize) -> Result<Vec<u8>, MemFault> {
        if len == 0 || len > 64 || !len.is_multiple_of(8) {
            return Err(MemFault::BadSize { bytes: len });
        }
        let n = len as u64 / 8;
        Self::range(a, n)?;
        Ok((0..n).flat_map(|i| self.get(a + i).to_be_bytes()).collect())
    }

    fn write(&mut self, a: Addr, data: &[u8]) -> Result<(), MemFault> {
        if data.is_empty() || data.len() > 64 || !data.len().is_multiple_of(8) {
            return Err(MemFault::BadSize { bytes: data.len() });
        }
        let n = data.len() as u64 / 8;
        Self::range(a, n)?;
        for (i, c) in data.chunks(8).enumerate() {
            self.set(a + i as u64, u64::from_be_bytes(c.try_into().unwrap()));
        }
        Ok(())
    }

    /// `vadd32_be`: whole lines of big-endian lanes, lane `l` into lane `l % 2` of word `l / 2`.
    fn vadd32_be(&mut self, a: Addr, data: &[u8]) -> Result<(), MemFault> {
        if data.is_empty() || data.len() > 4096 || !data.len().is_multiple_of(64) {
            return Err(MemFault::BadSize { bytes: data.len() });
        }
        Self::range(a, data.len() as u64 / 8)?;
        for (l, c) in data.chunks(4).enumerate() {
            let d = u32::from_be_bytes(c.try_into().unwrap());
            self.add32(a + l as u64 / 2, (l % 2) as u8, d)?;
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), MemFault> {
        match *op {
            Op::WriteU64 { addr, value } => self.rmw(addr, |_| value).map(drop),
            Op::CounterInc { addr, bytes } => {
                Self::range(addr, 2)?;
                let (p, b) = (self.get(addr), self.get(addr + 1));
                self.set(addr, p.wrapping_add(1));
                self.set(addr + 1, b.wrapping_add(bytes));
                Ok(())
            }
            Op::CounterAdd {
                addr,
                packets,
                bytes,
            } => {
                Self::range(addr, 2)?;
                let (p, b) = (self.get(addr), self.get(addr + 1));
                self.set(addr, p.wrapping_add(packets));
                self.set(addr + 1, b.wrapping_add(bytes));
                Ok(())
            }
            Op::FetchAnd { addr, mask } => self.rmw(addr, |w| w & mask).map(drop),
            Op::FetchOr { addr, mask } => self.rmw(addr, |w| w | mask).map(drop),
            Op::FetchXor { addr, mask } => self.rmw(addr, |w| w ^ mask).map(drop),
            Op::FetchClear { addr, mask } => self.rmw(addr, |w| w & !mask).map(drop),
            Op::FetchSwap { addr, value } => self.rmw(addr, |_| value).map(drop),
            Op::FetchAdd { addr, delta } => self.rmw(addr, |w| w.wrapping_add(delta)).map(drop),
            Op::FetchMax { addr, value } => self.rmw(addr, |w| w.max(value)).map(drop),
            Op::MaskedWrite { addr, value, mask } => {
                self.rmw(addr, |w| (w & !mask) | (value & mask)).map(drop)
            }
            Op::FetchAdd32 { addr, lane, delta } => self.add32(addr, lane, delta).map(drop),
            Op::Vadd32x16 { addr, deltas } => {
                Self::range(addr, 8)?;
                for i in 0..8u64 {
                    self.add32(addr + i, 0, deltas[2 * i as usize])?;
                    self.add32(addr + i, 1, deltas[2 * i as usize + 1])?;
                }
                Ok(())
            }
        }
    }

    fn check_op(op: &Op) -> Result<(), MemFault> {
        if let Op::FetchAdd32 { lane, .. } = *op {
            if lane > 1 {
                return Err(MemFault::BadLane { lane });
            }
        }
        Self::range(op.addr(), op.words())
    }

    /// Posting as `PostedOps` documents it: a counter addition merges into the latest
    /// pending addition of the same counter unless a pending op in between touches the
    /// counter's two words; otherwise the op is buffered, flushing first when full.
    fn post(&mut self, op: Op) -> Result<(), MemFault> {
        Self::check_op(&op)?;
        let delta = super::posted::counter_delta;
        if let Some((addr, packets, bytes)) = delta(&op) {
            for earlier in self.pending.iter_mut().rev() {
                if let Some((a, p, b)) = delta(earlier) {
                    if a == addr {
                        *earlier = Op::CounterAdd {
                            addr,
                            packets: p.wrapping_add(packets),
                            bytes: b.wrapping_add(bytes),
                        };
                        return Ok(());
                    }
                }
                if earlier.addr() < addr + 2 && addr < earlier.addr() + earlier.words() {
                    break;
                }
            }
        }
        if self.pending.len() >= POST_CAPACITY {
            self.flush();
        }
        self.pending.push(op);
        Ok(())
    }

    fn flush(&mut self) {
        for op in std::mem::take(&mut self.pending) {
            self.apply(&op).unwrap();
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Read(Addr, usize),
    Write(Addr, Vec<u8>),
    VAdd(Addr, Vec<u8>),
    ReadU64(Addr),
    CounterRead(Addr),
    Sync(Op),
    Post(Op),
    Flush,
}

fn addr() -> BoxedStrategy<Addr> {
    let near = |base: u64| (0u64..12).prop_map(move |d| base.wrapping_add(d));
    prop_oneof![
        3 => near(0),
        2 => near(SRAM_WORDS - 9),
        1 => near(DRAM_BASE - 6),
        2 => near(DRAM_BASE + (1 << 17) - 6),
        2 => near(DRAM_BASE + DRAM_WORDS - 9),
        1 => any::<u64>(),
    ]
    .boxed()
}

fn op() -> BoxedStrategy<Op> {
    let small = prop_oneof![
        any::<u64>(),
        Just(0u64),
        Just(u64::MAX),
        0u64..16,
        Just(0xFFFF_FFFF)
    ];
    let lane32 = prop_oneof![any::<u32>(), Just(1u32), Just(u32::MAX), 0u32..4];
    prop_oneof![
        (addr(), small.clone()).prop_map(|(addr, value)| Op::WriteU64 { addr, value }),
        (addr(), small.clone()).prop_map(|(addr, bytes)| Op::CounterInc { addr, bytes }),
        (addr(), small.clone(), small.clone()).prop_map(|(addr, packets, bytes)| Op::CounterAdd {
            addr,
            packets,
            bytes
        }),
        (addr(), small.clone()).prop_map(|(addr, mask)| Op::FetchAnd { addr, mask }),
        (addr(), small.clone()).prop_map(|(addr, mask)| Op::FetchOr { addr, mask }),
        (addr(), small.clone()).prop_map(|(addr, mask)| Op::FetchXor { addr, mask }),
        (addr(), small.clone()).prop_map(|(addr, mask)| Op::FetchClear { addr, mask }),
        (addr(), small.clone()).prop_map(|(addr, value)| Op::FetchSwap { addr, value }),
        (addr(), small.clone()).prop_map(|(addr, delta)| Op::FetchAdd { addr, delta }),
        (addr(), small.clone()).prop_map(|(addr, value)| Op::FetchMax { addr, value }),
        (addr(), small.clone(), small.clone()).prop_map(|(addr, value, mask)| Op::MaskedWrite {
            addr,
            value,
            mask
        }),
        (addr(), 0u8..3, lane32.clone()).prop_map(|(addr, lane, delta)| Op::FetchAdd32 {
            addr,
            lane,
            delta
        }),
        (addr(), proptest::array::uniform16(lane32))
            .prop_map(|(addr, deltas)| Op::Vadd32x16 { addr, deltas }),
    ]
    .boxed()
}

/// Sizes of a `vadd32_be`: mostly whole lines (1 to 8, or all 64), sometimes anything.
fn vadd_size() -> BoxedStrategy<usize> {
    prop_oneof![
        6 => (1usize..=8).prop_map(|l| l * 64),
        1 => Just(4096),
        1 => prop_oneof![0usize..130, Just(4096 + 64)],
    ]
    .boxed()
}

/// `n` bytes of lanes, biased towards the values that carry: 0, 1 and `0xFFFF_FFFF`.
fn vadd_data(n: usize) -> BoxedStrategy<Vec<u8>> {
    let lane = prop_oneof![any::<u32>(), Just(0u32), Just(1), Just(u32::MAX)];
    proptest::collection::vec(lane, n.div_ceil(4))
        .prop_map(move |lanes| {
            let mut b: Vec<u8> = lanes.iter().flat_map(|l| l.to_be_bytes()).collect();
            b.truncate(n);
            b
        })
        .boxed()
}

fn step() -> BoxedStrategy<Step> {
    let size = prop_oneof![
        8 => (1usize..=8).prop_map(|w| w * 8),
        1 => 0usize..72,
    ];
    prop_oneof![
        2 => (addr(), size.clone()).prop_map(|(a, n)| Step::Read(a, n)),
        2 => (addr(), size.prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n)))
            .prop_map(|(a, d)| Step::Write(a, d)),
        2 => (addr(), vadd_size().prop_flat_map(vadd_data)).prop_map(|(a, d)| Step::VAdd(a, d)),
        2 => addr().prop_map(Step::ReadU64),
        1 => addr().prop_map(Step::CounterRead),
        8 => op().prop_map(Step::Sync),
        3 => op().prop_map(Step::Post),
        1 => Just(Step::Flush),
    ]
    .boxed()
}

/// Runs the synchronous form of `op` on both and compares the replies.
fn sync_op(mem: &SharedMemory, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match *op {
        Op::WriteU64 { addr, value } => {
            prop_assert_eq!(mem.write_u64(addr, value), model.apply(op));
        }
        Op::CounterInc { addr, bytes } => {
            prop_assert_eq!(mem.counter_inc(addr, bytes), model.apply(op));
        }
        Op::CounterAdd {
            addr,
            packets,
            bytes,
        } => {
            prop_assert_eq!(mem.counter_add(addr, packets, bytes), model.apply(op));
        }
        Op::FetchAnd { addr, mask } => {
            prop_assert_eq!(mem.fetch_and(addr, mask), model.rmw(addr, |w| w & mask));
        }
        Op::FetchOr { addr, mask } => {
            prop_assert_eq!(mem.fetch_or(addr, mask), model.rmw(addr, |w| w | mask));
        }
        Op::FetchXor { addr, mask } => {
            prop_assert_eq!(mem.fetch_xor(addr, mask), model.rmw(addr, |w| w ^ mask));
        }
        Op::FetchClear { addr, mask } => {
            prop_assert_eq!(mem.fetch_clear(addr, mask), model.rmw(addr, |w| w & !mask));
        }
        Op::FetchSwap { addr, value } => {
            prop_assert_eq!(mem.fetch_swap(addr, value), model.rmw(addr, |_| value));
        }
        Op::FetchAdd { addr, delta } => {
            prop_assert_eq!(
                mem.fetch_add(addr, delta),
                model.rmw(addr, |w| w.wrapping_add(delta))
            );
        }
        Op::FetchMax { addr, value } => {
            prop_assert_eq!(
                mem.fetch_max(addr, value),
                model.rmw(addr, |w| w.max(value))
            );
        }
        Op::MaskedWrite { addr, value, mask } => {
            prop_assert_eq!(
                mem.masked_write(addr, value, mask),
                model.rmw(addr, |w| (w & !mask) | (value & mask))
            );
        }
        Op::FetchAdd32 { addr, lane, delta } => {
            prop_assert_eq!(
                mem.fetch_add32(addr, lane, delta),
                model.add32(addr, lane, delta)
            );
        }
        Op::Vadd32x16 { addr, ref deltas } => {
            prop_assert_eq!(mem.vadd32x16(addr, deltas), model.apply(op));
        }
    }
    // the validation used by posted ops agrees with the model
    prop_assert_eq!(mem.check_op(op), Model::check_op(op));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 96 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sequences_match_hashmap_model(steps in proptest::collection::vec(step(), 1..120)) {
        let mem = SharedMemory::new(&config()).unwrap();
        let mut model = Model::default();
        let mut posted = PostedOps::new(POST_CAPACITY);
        for s in &steps {
            match s {
                Step::Read(a, n) => {
                    let mut buf = vec![0u8; *n];
                    let got = mem.read(*a, &mut buf).map(|()| buf);
                    prop_assert_eq!(got, model.read(*a, *n), "{:?}", s);
                }
                Step::Write(a, d) => {
                    prop_assert_eq!(mem.write(*a, d), model.write(*a, d), "{:?}", s);
                }
                Step::VAdd(a, d) => {
                    prop_assert_eq!(mem.vadd32_be(*a, d), model.vadd32_be(*a, d), "vadd {:#x} {}", a, d.len());
                }
                Step::ReadU64(a) => {
                    let want = Model::range(*a, 1).map(|()| model.get(*a));
                    prop_assert_eq!(mem.read_u64(*a), want);
                }
                Step::CounterRead(a) => {
                    let want = Model::range(*a, 2).map(|()| (model.get(*a), model.get(a + 1)));
                    prop_assert_eq!(mem.counter_read(*a), want);
                }
                Step::Sync(op) => sync_op(&mem, &mut model, op)?,
                Step::Post(op) => {
                    prop_assert_eq!(posted.post(&mem, *op), model.post(*op), "{:?}", op);
                    prop_assert_eq!(posted.len(), model.pending.len());
                }
                Step::Flush => {
                    posted.flush(&mem);
                    model.flush();
                }
            }
        }
        posted.flush(&mem);
        model.flush();
        for (&a, &v) in &model.words {
            prop_assert_eq!(mem.read_u64(a), Ok(v), "word {:#x}", a);
        }
        for a in (0..SRAM_WORDS).chain(DRAM_BASE + (1 << 17) - 16..DRAM_BASE + DRAM_WORDS) {
            prop_assert_eq!(mem.read_u64(a), Ok(model.get(a)), "word {:#x}", a);
        }
    }

    #[test]
    fn apply_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mem = SharedMemory::new(&config()).unwrap();
        let mut model = Model::default();
        for op in &ops {
            prop_assert_eq!(mem.apply(op), model.apply(op), "{:?}", op);
        }
        for (&a, &v) in &model.words {
            prop_assert_eq!(mem.read_u64(a), Ok(v), "word {:#x}", a);
        }
    }
}
