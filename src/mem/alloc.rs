//! The control plane's named-region allocator.
//!
//! A bump pointer per region hands out 64-byte-aligned (8-word-aligned) blocks, so every
//! allocation starts on a line of its own and, when it is at most 8 words long, stays in one
//! bank. Names are unique across all three regions. Nothing is ever freed: the control plane lays
//! out counters, policers and tables once, at configuration time. All of it sits behind a
//! mutex (allocation is never on the packet path).

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use super::{Addr, Region, SharedMemory, LINE_WORDS};

/// A named block handed out by [`SharedMemory::alloc`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// The name it was allocated under.
    pub name: String,
    /// The region it lives in.
    pub region: Region,
    /// Its first word (a multiple of 8).
    pub addr: Addr,
    /// Its length in words, as requested.
    pub words: u64,
}

impl Allocation {
    /// The words it covers.
    pub fn range(&self) -> Range<Addr> {
        self.addr..self.addr + self.words
    }
}

/// Why [`SharedMemory::alloc`] refused a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// The region has fewer than `requested` words left after alignment.
    Exhausted {
        /// The region asked for.
        region: Region,
        /// Words requested.
        requested: u64,
        /// Words still available (from the next aligned address to the end of the region).
        available: u64,
    },
    /// The name is already allocated.
    Duplicate(String),
    /// A request for zero words.
    ZeroSize,
    /// No allocation starts at this word (see [`SharedMemory::rename`]).
    NotAllocated(Addr),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::Exhausted {
                region,
                requested,
                available,
            } => write!(
                f,
                "{region} exhausted: {requested} words requested, {available} available"
            ),
            AllocError::Duplicate(name) => write!(f, "a region named `{name}` already exists"),
            AllocError::ZeroSize => f.write_str("cannot allocate a zero-sized region"),
            AllocError::NotAllocated(addr) => write!(f, "no region starts at word {addr:#x}"),
        }
    }
}

impl std::error::Error for AllocError {}

/// The allocator's bookkeeping (inside the memory's mutex).
#[derive(Debug)]
pub(super) struct AllocState {
    /// Next free word and end, per region (index 0 = SRAM, 1 = DRAM, 2 = ACC).
    free: [Range<Addr>; 3],
    list: Vec<Allocation>,
    by_name: HashMap<String, usize>,
}

fn slot(r: Region) -> usize {
    match r {
        Region::Sram => 0,
        Region::Dram => 1,
        Region::Acc => 2,
    }
}

impl AllocState {
    pub(super) fn new(sram: Range<Addr>, dram: Range<Addr>, acc: Range<Addr>) -> AllocState {
        AllocState {
            free: [sram, dram, acc],
            list: Vec::new(),
            by_name: HashMap::new(),
        }
    }

    fn alloc(&mut self, name: &str, region: Region, words: u64) -> Result<Addr, AllocError> {
        if words == 0 {
            return Err(AllocError::ZeroSize);
        }
        if self.by_name.contains_key(name) {
            return Err(AllocError::Duplicate(name.to_owned()));
        }
        let free = &mut self.free[slot(region)];
        // Region starts are line-aligned, so aligning up can only overflow past the end.
        let start = free
            .start
            .checked_next_multiple_of(LINE_WORDS)
            .unwrap_or(Addr::MAX)
            .min(free.end);
        let available = free.end - start;
        if words > available {
            return Err(AllocError::Exhausted {
                region,
                requested: words,
                available,
            });
        }
        free.start = start + words;
        self.by_name.insert(name.to_owned(), self.list.len());
        self.list.push(Allocation {
            name: name.to_owned(),
            region,
            addr: start,
            words,
        });
        Ok(start)
    }

    fn rename(&mut self, addr: Addr, name: &str) -> Result<(), AllocError> {
        let i = self
            .list
            .iter()
            .position(|a| a.addr == addr)
            .ok_or(AllocError::NotAllocated(addr))?;
        if self.list[i].name == name {
            return Ok(());
        }
        if self.by_name.contains_key(name) {
            return Err(AllocError::Duplicate(name.to_owned()));
        }
        let old = std::mem::replace(&mut self.list[i].name, name.to_owned());
        self.by_name.remove(&old);
        self.by_name.insert(name.to_owned(), i);
        Ok(())
    }

    /// Every request of `requests` or none: on the first refusal, the ones already made
    /// are taken back (a bump allocator can: nothing was allocated after them).
    fn alloc_all(&mut self, requests: &[(&str, Region, u64)]) -> Result<Vec<Addr>, AllocError> {
        let (free, made) = (self.free.clone(), self.list.len());
        let mut addrs = Vec::with_capacity(requests.len());
        for &(name, region, words) in requests {
            match self.alloc(name, region, words) {
                Ok(addr) => addrs.push(addr),
                Err(e) => {
                    for a in self.list.drain(made..) {
                        self.by_name.remove(&a.name);
                    }
                    self.free = free;
                    return Err(e);
                }
            }
        }
        Ok(addrs)
    }
}

impl SharedMemory {
    /// Allocates `words` words named `name` in `region`, 64-byte aligned; returns the first
    /// word. Names are unique across regions.
    pub fn alloc(&self, name: &str, region: Region, words: u64) -> Result<Addr, AllocError> {
        self.allocs.lock().alloc(name, region, words)
    }

    /// Makes every allocation of `requests` (name, region, words, as [`SharedMemory::alloc`]
    /// takes them), in order, or none: the first refusal is returned and nothing is left
    /// allocated. For a layout whose parts depend on each other (a table in one region
    /// whose shape depends on whether its buffers fit in another).
    pub fn alloc_all(&self, requests: &[(&str, Region, u64)]) -> Result<Vec<Addr>, AllocError> {
        self.allocs.lock().alloc_all(requests)
    }

    /// Renames the allocation that starts at word `addr`, for a block the control plane
    /// hands to a new owner (a removed job's memory taken by the next job): the memory
    /// map then names what uses it now. Refused if no allocation starts there or another
    /// one has the name.
    pub fn rename(&self, addr: Addr, name: &str) -> Result<(), AllocError> {
        self.allocs.lock().rename(addr, name)
    }

    /// The allocation named `name`, if any.
    pub fn allocation(&self, name: &str) -> Option<Allocation> {
        let st = self.allocs.lock();
        st.by_name.get(name).map(|&i| st.list[i].clone())
    }

    /// Every allocation, in the order they were made.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.allocs.lock().list.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MemConfig, DRAM_BASE};
    use super::*;

    fn mem(sram_bytes: u64, dram_bytes: u64) -> SharedMemory {
        SharedMemory::new(&MemConfig {
            sram_bytes,
            dram_bytes,
            acc_bytes: 4096,
            banks: 8,
        })
        .unwrap()
    }

    #[test]
    fn rename_moves_the_name_and_keeps_names_unique() {
        let m = mem(1024, 1024);
        let a = m.alloc("a", Region::Sram, 3).unwrap();
        let b = m.alloc("b", Region::Dram, 8).unwrap();
        m.rename(a, "c").unwrap();
        assert_eq!(m.allocation("a"), None);
        let c = m.allocation("c").unwrap();
        assert_eq!((c.addr, c.region, c.words), (a, Region::Sram, 3));
        assert_eq!(m.allocations()[0].name, "c");
        // The old name is free again; a taken one is refused; renaming to itself is a no-op.
        assert_eq!(m.alloc("a", Region::Sram, 1), Ok(8));
        assert_eq!(m.rename(b, "c"), Err(AllocError::Duplicate("c".into())));
        assert_eq!(m.rename(b, "b"), Ok(()));
        assert_eq!(m.allocation("b").unwrap().addr, b);
        // Only an allocation's first word names it.
        assert_eq!(m.rename(a + 1, "d"), Err(AllocError::NotAllocated(a + 1)));
        assert_eq!(m.allocations().len(), 3);
    }

    #[test]
    fn aligned_bump_allocation() {
        let m = mem(1024, 1024); // 128 words each
        assert_eq!(m.alloc("a", Region::Sram, 3), Ok(0));
        assert_eq!(m.alloc("b", Region::Sram, 8), Ok(8));
        assert_eq!(m.alloc("c", Region::Sram, 9), Ok(16));
        assert_eq!(m.alloc("d", Region::Sram, 1), Ok(32));
        assert_eq!(m.alloc("x", Region::Dram, 2), Ok(DRAM_BASE));
        assert_eq!(m.alloc("y", Region::Dram, 2), Ok(DRAM_BASE + 8));
        assert_eq!(m.alloc("acc", Region::Acc, 9), Ok(super::super::ACC_BASE));
        assert_eq!(
            m.alloc("acc2", Region::Acc, 1),
            Ok(super::super::ACC_BASE + 16)
        );
        for a in m.allocations() {
            assert_eq!(a.addr % 8, 0, "{a:?}");
            assert_eq!(m.check(a.addr, a.words), Ok(()));
        }
        // distinct allocations never overlap
        let all = m.allocations();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(a.range().end <= b.range().start || b.range().end <= a.range().start);
            }
        }
        assert_eq!(
            m.allocation("c"),
            Some(Allocation {
                name: "c".into(),
                region: Region::Sram,
                addr: 16,
                words: 9
            })
        );
        assert_eq!(m.allocation("zzz"), None);
        let names: Vec<String> = m.allocations().into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["a", "b", "c", "d", "x", "y", "acc", "acc2"]);
    }

    #[test]
    fn exhaustion_duplicate_zero() {
        let m = mem(1024, 0);
        assert_eq!(m.alloc("z", Region::Sram, 0), Err(AllocError::ZeroSize));
        assert_eq!(m.alloc("a", Region::Sram, 100), Ok(0));
        // next aligned word is 104: 24 words left
        assert_eq!(
            m.alloc("b", Region::Sram, 25),
            Err(AllocError::Exhausted {
                region: Region::Sram,
                requested: 25,
                available: 24
            })
        );
        assert_eq!(
            m.alloc("a", Region::Sram, 1),
            Err(AllocError::Duplicate("a".into()))
        );
        assert_eq!(
            m.alloc("a", Region::Dram, 1),
            Err(AllocError::Duplicate("a".into()))
        );
        assert_eq!(m.alloc("b", Region::Sram, 24), Ok(104));
        assert_eq!(
            m.alloc("c", Region::Sram, 1),
            Err(AllocError::Exhausted {
                region: Region::Sram,
                requested: 1,
                available: 0
            })
        );
        assert_eq!(
            m.alloc("d", Region::Dram, 1),
            Err(AllocError::Exhausted {
                region: Region::Dram,
                requested: 1,
                available: 0
            })
        );
        assert_eq!(
            m.alloc("e", Region::Sram, u64::MAX),
            Err(AllocError::Exhausted {
                region: Region::Sram,
                requested: u64::MAX,
                available: 0
            })
        );
        // failed requests recorded nothing
        assert_eq!(m.allocations().len(), 2);
    }

    #[test]
    fn alloc_all_makes_every_allocation_or_none() {
        let m = mem(1024, 1024); // 128 words each
        assert_eq!(m.alloc("first", Region::Sram, 3), Ok(0));
        // The second request does not fit: the first is taken back, names and space.
        assert_eq!(
            m.alloc_all(&[("a", Region::Dram, 16), ("b", Region::Sram, 121)]),
            Err(AllocError::Exhausted {
                region: Region::Sram,
                requested: 121,
                available: 120
            })
        );
        assert_eq!(m.allocation("a"), None);
        assert_eq!(m.allocations().len(), 1);
        // A duplicate name within the requests is refused the same way.
        assert_eq!(
            m.alloc_all(&[("a", Region::Dram, 16), ("a", Region::Sram, 1)]),
            Err(AllocError::Duplicate("a".into()))
        );
        assert_eq!(m.allocations().len(), 1);
        // Nothing was consumed: both fit now, where the failed calls would have put them.
        assert_eq!(
            m.alloc_all(&[("a", Region::Dram, 16), ("b", Region::Sram, 120)]),
            Ok(vec![DRAM_BASE, 8])
        );
        let names: Vec<String> = m.allocations().into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["first", "a", "b"]);
        assert_eq!(m.alloc_all(&[]), Ok(vec![]));
    }

    #[test]
    fn alignment_padding_counts_against_the_region() {
        let m = mem(128, 128); // 16 words each
        assert_eq!(m.alloc("a", Region::Sram, 3), Ok(0));
        assert_eq!(m.alloc("b", Region::Sram, 8), Ok(8));
        assert_eq!(
            m.alloc("c", Region::Sram, 1),
            Err(AllocError::Exhausted {
                region: Region::Sram,
                requested: 1,
                available: 0
            })
        );
        assert_eq!(m.alloc("d", Region::Dram, 16), Ok(DRAM_BASE));
    }

    #[test]
    fn messages() {
        let e = AllocError::Exhausted {
            region: Region::Dram,
            requested: 5,
            available: 2,
        };
        assert_eq!(
            e.to_string(),
            "dram exhausted: 5 words requested, 2 available"
        );
        assert!(AllocError::Duplicate("ctr".into())
            .to_string()
            .contains("`ctr`"));
        assert!(AllocError::ZeroSize.to_string().contains("zero"));
    }

    #[test]
    fn concurrent_allocations_are_disjoint() {
        let m = std::sync::Arc::new(mem(64 * 1024, 0));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    (0..20)
                        .map(|i| m.alloc(&format!("t{t}-{i}"), Region::Sram, 5).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut addrs: Vec<Addr> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), 80);
        assert_eq!(addrs, (0..80).map(|i| i * 8).collect::<Vec<_>>());
    }
}
