//! Routes added and removed while l3fwd forwards.
//!
//! [`LiveRoutes`] keeps the route table on the control side and changes the DIR-24-8 table
//! in shared memory in place, entry by entry, with the memory's word atomicity: a lookup
//! racing a change finds, for each address, the entry before the change or after it.
//!
//! - **A route of /24 or shorter** (`p/L`) sets the entries of the /24s it covers, except
//!   those covered by a more specific route of /24 or shorter (they keep theirs): to the
//!   route's next hop when added, to the best shorter route's (or none) when removed. A /24
//!   with a tbl8 group has its 256 entries recomputed.
//! - **A route longer than /24** lives in its /24's tbl8 group. The first one in a /24 takes
//!   a free group, fills all 256 entries, and only then points the tbl24 entry at it, so a
//!   lookup never follows a pointer to a group not yet written. When the last one goes, the
//!   tbl24 entry gets the /24's best shorter route back, and the group is freed.
//! - **Freed groups are retired, then reused after a grace period.** A lookup that read a
//!   tbl24 pointer just before its group was freed may still read the group: were the group
//!   given to another /24 meanwhile, it would find that /24's entries (a wrong port). So a
//!   freed group is retired, not free: it becomes free once every PPE thread has finished
//!   the packets it had begun when the group was unlinked ([`LiveRoutes::reclaim_retired`],
//!   which waits for the engine's grace period, [`Control::wait_quiescent`]; the control
//!   plane's `routes` target calls it after each removal). Free groups are then taken first
//!   in, first out. Without grace periods, retired groups are never reused, and a route that
//!   needs a group when none is free is refused, naming them.
//! - **Next hops** are written before any entry names them. The table's room for groups
//!   and next hops is fixed when l3fwd is installed ([`super::L3fwd::install_with_room`]);
//!   a change that needs more is refused, and changes nothing.
//!
//! Changes are serialised (one at a time); each costs a few memory writes per /24 it
//! covers (a /8: 65536 entries, 16384 word writes).

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;

use parking_lot::Mutex;

use pfemu::mem::{Addr, SharedMemory};
use pfemu::packet::Port;
use pfemu::pfe::{Control, Retired};

use super::{
    mask, write_next_hop, L3fwd, L3fwdError, Route, RouteTable, ENTRIES_PER_WORD, ENTRY_TBL8,
    TBL8_GROUP_ENTRIES, TBL8_GROUP_WORDS,
};

// What [`LiveRoutes::grace_ticket`] hands out: the groups retired before it.
pub use pfemu::pfe::GraceTicket;

/// The control side of l3fwd's routes while it runs: see the module doc.
#[derive(Debug)]
pub struct LiveRoutes {
    l3: L3fwd,
    mem: Arc<SharedMemory>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    routes: RouteTable,
    /// The tbl8 group of each /24 that has one.
    group_of: HashMap<u32, u16>,
    /// Groups not in use, the longest free first.
    free: VecDeque<u16>,
    /// Groups freed but maybe still read by a lookup: free once a grace period begun
    /// after they were unlinked has ended.
    retired: Retired<u16>,
    /// Next hops written to the table so far.
    next_hops_written: usize,
}

/// The `i`-th 16-bit entry of the table at `base`: its word and the bits it takes.
fn word_of(base: Addr, i: usize) -> (Addr, u32) {
    (
        base + (i / ENTRIES_PER_WORD) as u64,
        (3 - (i % ENTRIES_PER_WORD) as u32) * 16,
    )
}

impl LiveRoutes {
    /// Takes over the routes of `l3`, installed in `mem` from `routes` (the same table: the
    /// groups in use are read back from memory).
    pub fn new(
        l3: &L3fwd,
        mem: Arc<SharedMemory>,
        routes: RouteTable,
    ) -> Result<LiveRoutes, L3fwdError> {
        let mut group_of = HashMap::new();
        let words = super::TBL24_WORDS;
        for w in 0..words {
            let word = mem.read_u64(l3.tbl24_addr() + w)?;
            if word == 0 {
                continue;
            }
            for k in 0..ENTRIES_PER_WORD {
                let e = (word >> ((3 - k) * 16)) as u16;
                if e & ENTRY_TBL8 != 0 {
                    let i24 = w as u32 * ENTRIES_PER_WORD as u32 + k as u32;
                    group_of.insert(i24, e & !ENTRY_TBL8);
                }
            }
        }
        let used: std::collections::HashSet<u16> = group_of.values().copied().collect();
        let free = (0..l3.tbl8_capacity() as u16)
            .filter(|g| !used.contains(g))
            .collect();
        Ok(LiveRoutes {
            l3: l3.clone(),
            mem,
            state: Mutex::new(State {
                next_hops_written: routes.next_hops().len(),
                routes,
                group_of,
                free,
                retired: Retired::new(),
            }),
        })
    }

    /// Adds (or replaces) the route `prefix/len` via `port`'s next hop
    /// ([`super::NextHop::for_port`]). Refuses a bad prefix, and a route that needs a next hop
    /// or a tbl8 group the installed table has no room for, changing nothing.
    pub fn add(&self, prefix: u32, len: u8, port: Port) -> Result<(), L3fwdError> {
        let mut st = self.state.lock();
        // Check everything before changing anything.
        let mut probe = RouteTable::new();
        probe.insert_port(prefix, len, port)?;
        let new_hop = st.routes.port_next_hop_index(port).is_none();
        if new_hop && st.routes.next_hops().len() >= self.l3.next_hop_capacity() {
            return Err(L3fwdError::BadRoute(format!(
                "{}/{len} via port {port} needs a new next hop, and the installed table holds \
                 {} (install with more Room::next_hops)",
                Ipv4Addr::from(prefix),
                self.l3.next_hop_capacity()
            )));
        }
        let i24 = prefix >> 8;
        if len > 24 && !st.group_of.contains_key(&i24) && st.free.is_empty() {
            let waiting = match st.retired.len() {
                0 => String::new(),
                n => format!(
                    ", {n} of them freed and waiting for a grace period \
                     (LiveRoutes::reclaim_retired)"
                ),
            };
            return Err(L3fwdError::BadRoute(format!(
                "{}/{len} needs a tbl8 group, and all {} are in use{waiting} (install with \
                 more Room::tbl8_groups)",
                Ipv4Addr::from(prefix),
                self.l3.tbl8_capacity()
            )));
        }
        st.routes.insert_port(prefix, len, port)?;
        while st.next_hops_written < st.routes.next_hops().len() {
            let i = st.next_hops_written;
            write_next_hop(
                &self.mem,
                self.l3.next_hop_addr(),
                i,
                &st.routes.next_hops()[i],
            )?;
            st.next_hops_written += 1;
        }
        self.refresh(&mut st, prefix, len)
    }

    /// Removes the route `prefix/len`; whether there was one.
    pub fn remove(&self, prefix: u32, len: u8) -> Result<bool, L3fwdError> {
        let mut st = self.state.lock();
        if prefix & !mask(len) != 0 || len > 32 {
            return Err(L3fwdError::BadRoute(format!(
                "{}/{len} is not a prefix",
                Ipv4Addr::from(prefix)
            )));
        }
        if st.routes.remove(prefix, len).is_none() {
            return Ok(false);
        }
        self.refresh(&mut st, prefix, len)?;
        Ok(true)
    }

    /// Every route, sorted by length then prefix, with its egress port.
    pub fn routes(&self) -> Vec<(Route, Port)> {
        let st = self.state.lock();
        let hops = st.routes.next_hops();
        st.routes
            .routes()
            .into_iter()
            .map(|r| (r, hops[usize::from(r.next_hop)].port))
            .collect()
    }

    /// The egress port the reference longest-prefix match gives `addr` now.
    pub fn lookup_port(&self, addr: u32) -> Option<Port> {
        self.state.lock().routes.lookup_port(addr)
    }

    /// tbl8 groups free now.
    pub fn free_groups(&self) -> usize {
        self.state.lock().free.len()
    }

    /// tbl8 groups freed and not free yet: a lookup may still read them (see the module
    /// doc).
    pub fn retired_groups(&self) -> usize {
        self.state.lock().retired.len()
    }

    /// A ticket for the groups retired so far: once a grace period begun after this call
    /// has ended (no PPE thread still runs a packet it began before), give it to
    /// [`LiveRoutes::release_retired`].
    pub fn grace_ticket(&self) -> GraceTicket {
        self.state.lock().retired.ticket()
    }

    /// Frees the groups retired before `ticket` was taken (the caller's promise: a grace
    /// period begun after that has ended). Returns how many became free.
    pub fn release_retired(&self, ticket: GraceTicket) -> usize {
        let mut st = self.state.lock();
        let st = &mut *st;
        st.retired.release(ticket, |g| st.free.push_back(g))
    }

    /// Waits for `engine`'s grace period (until `deadline`), then frees the groups retired
    /// before it ([`LiveRoutes::grace_ticket`], [`Control::wait_quiescent`],
    /// [`LiveRoutes::release_retired`]). Returns how many became free; past the deadline
    /// they stay retired, for a later call.
    pub fn reclaim_retired(
        &self,
        engine: &Control,
        deadline: std::time::Instant,
    ) -> Result<usize, L3fwdError> {
        let ticket = self.grace_ticket();
        engine.wait_quiescent(deadline).map_err(L3fwdError::Grace)?;
        Ok(self.release_retired(ticket))
    }

    /// The entry a /24 of no group gets: the best route of /24 or shorter containing
    /// `addr`, or 0 (no route).
    fn entry24(routes: &RouteTable, addr: u32) -> u16 {
        routes.lookup_upto(addr, 24).map_or(0, |(_, nh)| nh + 1)
    }

    /// Brings the table in memory up to date after the route `prefix/len` changed.
    fn refresh(&self, st: &mut State, prefix: u32, len: u8) -> Result<(), L3fwdError> {
        if len > 24 {
            let i24 = prefix >> 8;
            if st.routes.long_routes_in(i24) > 0 {
                self.write_group(st, i24)?;
            } else if let Some(g) = st.group_of.remove(&i24) {
                self.set24(i24, Self::entry24(&st.routes, i24 << 8))?;
                // Unlinked now, but a lookup that read the pointer before may still read
                // it: retired until a grace period ends.
                st.retired.retire(g);
            }
            return Ok(());
        }
        // The /24s of the route, less those a more specific route of /24 or shorter keeps
        // (indices below 2^24, so `end` fits).
        let first = prefix >> 8;
        let end = first + (1u32 << (24 - len));
        let mut kept: Vec<(u32, u32)> = st
            .routes
            .more_specific(prefix, len, 24)
            .into_iter()
            .map(|r| (r.prefix >> 8, (r.prefix >> 8) + (1u32 << (24 - r.len))))
            .collect();
        kept.sort_unstable();
        // What the /24s not kept by a more specific route get: the route itself when added,
        // the best shorter one when removed (no longer: those are kept).
        let entry = st
            .routes
            .lookup_upto(prefix, len)
            .map_or(0, |(_, nh)| nh + 1);
        let mut at = first;
        // Kept ranges may nest or overlap: fill each gap before one, then skip past it.
        for (s, e) in kept.into_iter().chain(std::iter::once((end, end))) {
            if s > at {
                self.fill24(st, at, s, entry)?;
            }
            at = at.max(e);
        }
        Ok(())
    }

    /// Sets tbl24 entries `from..to` to `entry`, whole words at a time, but for the /24s
    /// with a tbl8 group, whose groups are recomputed instead.
    fn fill24(&self, st: &mut State, from: u32, to: u32, entry: u16) -> Result<(), L3fwdError> {
        let mut grouped: Vec<u32> = st
            .group_of
            .keys()
            .copied()
            .filter(|&i| (from..to).contains(&i))
            .collect();
        grouped.sort_unstable();
        let mut i = from;
        for g in grouped.iter().copied().chain(std::iter::once(to)) {
            while i < g {
                let word_start = i - i % ENTRIES_PER_WORD as u32;
                if i == word_start && i + ENTRIES_PER_WORD as u32 <= g {
                    let whole = u64::from(entry) * 0x0001_0001_0001_0001;
                    let (w, _) = word_of(self.l3.tbl24_addr(), i as usize);
                    self.mem.write_u64(w, whole)?;
                    i += ENTRIES_PER_WORD as u32;
                } else {
                    self.set24(i, entry)?;
                    i += 1;
                }
            }
            if g < to {
                self.write_group(st, g)?;
                i = g + 1;
            }
        }
        Ok(())
    }

    /// Sets tbl24 entry `i24` (the other entries of its word untouched).
    fn set24(&self, i24: u32, entry: u16) -> Result<(), L3fwdError> {
        let (w, shift) = word_of(self.l3.tbl24_addr(), i24 as usize);
        self.mem
            .masked_write(w, u64::from(entry) << shift, 0xFFFF << shift)?;
        Ok(())
    }

    /// Writes the /24 `i24`'s tbl8 group from the routes (taking a free group first if it
    /// has none, and pointing tbl24 at it only once it is written).
    fn write_group(&self, st: &mut State, i24: u32) -> Result<(), L3fwdError> {
        let (g, new) = match st.group_of.get(&i24) {
            Some(&g) => (g, false),
            None => {
                let g = st.free.pop_front().ok_or_else(|| {
                    L3fwdError::BadRoute(format!(
                        "no tbl8 group free for the /24 {}",
                        Ipv4Addr::from(i24 << 8)
                    ))
                })?;
                (g, true)
            }
        };
        let base = self.l3.tbl8_addr() + u64::from(g) * TBL8_GROUP_WORDS;
        for w in 0..TBL8_GROUP_WORDS {
            let mut word = 0u64;
            for k in 0..ENTRIES_PER_WORD as u32 {
                let addr = i24 << 8 | (w as u32 * ENTRIES_PER_WORD as u32 + k);
                let e = st.routes.lookup(addr).map_or(0, |nh| nh + 1);
                word |= u64::from(e) << ((3 - k) * 16);
            }
            if new || self.mem.read_u64(base + w)? != word {
                self.mem.write_u64(base + w, word)?;
            }
        }
        if new {
            st.group_of.insert(i24, g);
            self.set24(i24, ENTRY_TBL8 | g)?;
        }
        debug_assert_eq!(TBL8_GROUP_ENTRIES, 256);
        Ok(())
    }
}
