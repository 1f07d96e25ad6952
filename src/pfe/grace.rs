//! Memory a program's control side unlinked while the PPE threads run, kept until grace
//! periods ([`Control::wait_quiescent`](super::Control::wait_quiescent)) say that no
//! thread can still touch it.
//!
//! A control-side API that removes something a packet may be looking up at that moment (a
//! route's tbl8 group, a removed job's region) cannot free it at once: a packet that read
//! the pointer before the removal may still read or write it. It **retires** the memory
//! into a [`Retired`] list instead, and later:
//! 1. takes a [`GraceTicket`]: it covers everything retired before it was taken;
//! 2. waits for a grace period begun after that (`Control::wait_quiescent`);
//! 3. **releases** what the ticket covers, for reuse.
//!
//! Something that needs more than one grace period (Trio-ML's removed job: its blocks are
//! swept after the packets that saw the job end, then again after the timer threads that
//! saw those blocks end) is retired again as it is released ([`Release::Again`]), so that
//! only a later ticket covers it. Memory never released stays retired: never reused, and
//! never reused wrongly.
//!
//! ```
//! use pfemu::pfe::Retired;
//!
//! let mut groups = Retired::new();
//! groups.retire(7u16); // unlinked, but a lookup may still read it
//! let ticket = groups.ticket();
//! groups.retire(8); // after the ticket: not covered by it
//! // ... a grace period begun after the ticket ends (`Control::wait_quiescent`) ...
//! let mut free = Vec::new();
//! groups.release(ticket, |g| free.push(g));
//! assert_eq!((free, groups.len()), (vec![7], 1));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

/// What a grace period begun after this was taken covers: everything retired before it
/// into the list that gave it ([`Retired::ticket`]). Given to another list, it covers
/// nothing there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraceTicket {
    /// The list that gave it ([`Retired::id`]).
    list: u64,
    /// The list's sequence number then: the retirements below it are covered.
    seq: u64,
}

/// The next [`Retired`] list's id.
static NEXT_LIST: AtomicU64 = AtomicU64::new(0);

/// What [`Retired::release_with`] does with a retired item its ticket covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Free it: it leaves the list, handed to the caller.
    Free,
    /// Not yet: it stays, as it was retired (the same tickets cover it).
    Keep,
    /// One more grace period: it stays, retired again now, so that only a ticket taken from
    /// now on covers it.
    Again,
}

/// Items retired, each with the order it was retired in: see the module doc. Not `Clone`:
/// two lists holding the same memory would each free it.
#[derive(Debug)]
pub struct Retired<T> {
    /// This list's own, so that a ticket of another list covers nothing here.
    id: u64,
    /// Each item with its sequence number: a ticket above it covers it.
    items: Vec<(T, u64)>,
    /// The sequence number of the next retirement (and the ticket taken now).
    next: u64,
}

impl<T> Default for Retired<T> {
    fn default() -> Self {
        Retired::new()
    }
}

impl<T> Retired<T> {
    /// An empty list.
    pub fn new() -> Self {
        Retired {
            id: NEXT_LIST.fetch_add(1, Ordering::Relaxed),
            items: Vec::new(),
            next: 0,
        }
    }

    /// Retires `item`: unlinked, but maybe still in a PPE thread's hands.
    pub fn retire(&mut self, item: T) {
        self.items.push((item, self.next));
        self.next += 1;
    }

    /// A ticket for everything retired so far: once a grace period begun after this call
    /// has ended, give it to [`Retired::release`].
    pub fn ticket(&self) -> GraceTicket {
        GraceTicket {
            list: self.id,
            seq: self.next,
        }
    }

    /// Items retired and not released.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Nothing is retired.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items retired and not released, oldest retirement first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter().map(|(item, _)| item)
    }

    /// Hands `free` every item `ticket` covers, in the order they were retired (the
    /// caller's promise: a grace period begun after the ticket was taken has ended).
    /// Returns how many. A ticket another list gave covers nothing: its items stay
    /// retired (never reused wrongly).
    pub fn release(&mut self, ticket: GraceTicket, mut free: impl FnMut(T)) -> usize {
        let always = |_: &mut T| Ok::<_, std::convert::Infallible>(Release::Free);
        let Ok(n) = self.release_with(ticket, always, &mut free);
        n
    }

    /// As [`Retired::release`], asking `decide` first what becomes of each item `ticket`
    /// covers (it may change the item: count a sweep made). Items freed go to `free`, in
    /// the order they were retired; returns how many. An error from `decide` stops the
    /// walk: its item stays as it was, and those already freed stay freed.
    pub fn release_with<E>(
        &mut self,
        ticket: GraceTicket,
        mut decide: impl FnMut(&mut T) -> Result<Release, E>,
        mut free: impl FnMut(T),
    ) -> Result<usize, E> {
        let (id, mut next) = (self.id, self.next);
        let mut failed = None;
        let covered = |seq: u64| ticket.list == id && seq < ticket.seq;
        let mut freed = 0;
        let released = self.items.extract_if(.., |(item, seq)| {
            if failed.is_some() || !covered(*seq) {
                return false;
            }
            match decide(item) {
                Ok(Release::Free) => true,
                Ok(Release::Keep) => false,
                Ok(Release::Again) => {
                    *seq = next;
                    next += 1;
                    false
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        });
        for (item, _) in released {
            free(item);
            freed += 1;
        }
        self.next = next;
        match failed {
            Some(e) => Err(e),
            None => Ok(freed),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An operation on a list of item ids.
    #[derive(Clone, Debug)]
    enum Op {
        Retire,
        Ticket,
        /// Release with the `n`-th ticket taken (modulo how many), each item covered
        /// deciding by `(id + salt) % 3`: free, keep, again.
        Release(usize, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Retire),
            Just(Op::Ticket),
            (any::<usize>(), any::<u8>()).prop_map(|(n, salt)| Op::Release(n, salt)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 8 } else { 500 }))]

        /// Against a model that stamps each retirement and each ticket with the step it was
        /// made at: a release frees exactly the items whose last retirement came before
        /// its ticket and that were told to go, once each, oldest first; Again stamps an
        /// item anew; nothing is lost.
        #[test]
        fn a_release_frees_exactly_what_its_ticket_covers(ops in prop::collection::vec(op(), 1..80)) {
            let mut r = Retired::new();
            let mut tickets: Vec<(GraceTicket, usize)> = Vec::new();
            // The model: each item retired and not freed, with the step it was last retired at.
            let mut model: Vec<(u32, usize)> = Vec::new();
            let mut next_id = 0u32;
            let mut freed_ever = std::collections::HashSet::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Retire => {
                        r.retire(next_id);
                        model.push((next_id, step));
                        next_id += 1;
                    }
                    Op::Ticket => tickets.push((r.ticket(), step)),
                    Op::Release(_, _) if tickets.is_empty() => {}
                    Op::Release(n, salt) => {
                        let (ticket, at) = tickets[n % tickets.len()];
                        let decide = |id: u32| match (id + u32::from(salt)) % 3 {
                            0 => Release::Free,
                            1 => Release::Keep,
                            _ => Release::Again,
                        };
                        let mut want = Vec::new();
                        let mut kept = Vec::new();
                        for &(id, retired_at) in &model {
                            match (retired_at < at, decide(id)) {
                                (true, Release::Free) => want.push(id),
                                (true, Release::Again) => kept.push((id, step)),
                                _ => kept.push((id, retired_at)),
                            }
                        }
                        model = kept;
                        let mut got = Vec::new();
                        let n = r
                            .release_with(ticket, |&mut id| Ok::<_, ()>(decide(id)), |id| got.push(id))
                            .unwrap();
                        prop_assert_eq!(n, got.len());
                        prop_assert_eq!(&got, &want);
                        for id in got {
                            prop_assert!(freed_ever.insert(id), "{} freed twice", id);
                        }
                    }
                }
                let mut left: Vec<u32> = r.iter().copied().collect();
                let mut expect: Vec<u32> = model.iter().map(|&(id, _)| id).collect();
                left.sort_unstable();
                expect.sort_unstable();
                prop_assert_eq!(left, expect);
                prop_assert_eq!(r.len() + freed_ever.len(), next_id as usize);
            }
        }
    }

    #[test]
    fn a_ticket_covers_what_was_retired_before_it_and_nothing_after() {
        let mut r = Retired::new();
        let empty = r.ticket();
        r.retire('a');
        r.retire('b');
        let t = r.ticket();
        r.retire('c');
        let mut free = Vec::new();
        assert_eq!(r.release(empty, |x| free.push(x)), 0);
        assert_eq!(r.release(t, |x| free.push(x)), 2);
        assert_eq!(free, ['a', 'b']);
        assert_eq!(r.iter().collect::<Vec<_>>(), [&'c']);
        // An old ticket covers nothing retired since; a new one does.
        assert_eq!(r.release(t, |x| free.push(x)), 0);
        assert_eq!(r.release(r.ticket(), |x| free.push(x)), 1);
        assert!(r.is_empty());
    }

    #[test]
    fn an_item_released_again_waits_for_a_later_ticket_and_keep_leaves_it_as_it_was() {
        // Each item: (name, grace periods it still needs).
        let mut r = Retired::new();
        r.retire(("twice", 2));
        r.retire(("kept", 1));
        let t1 = r.ticket();
        let step = |t: GraceTicket, r: &mut Retired<(&'static str, u32)>, keep: bool| {
            let mut free = Vec::new();
            let n = r
                .release_with(
                    t,
                    |(name, left)| {
                        Ok::<_, ()>(if *name == "kept" && keep {
                            Release::Keep
                        } else if *left > 1 {
                            *left -= 1;
                            Release::Again
                        } else {
                            Release::Free
                        })
                    },
                    |(name, _)| free.push(name),
                )
                .unwrap();
            assert_eq!(n, free.len());
            free
        };
        assert!(step(t1, &mut r, true).is_empty());
        // The same ticket again: "twice" was retired again after it, "kept" was not.
        assert_eq!(step(t1, &mut r, false), ["kept"]);
        assert_eq!(step(r.ticket(), &mut r, false), ["twice"]);
        assert!(r.is_empty());
    }

    #[test]
    fn a_ticket_of_another_list_covers_nothing() {
        let (mut a, mut b) = (Retired::new(), Retired::new());
        a.retire(1);
        b.retire(2);
        b.retire(3);
        let from_a = a.ticket();
        assert_eq!(b.release(from_a, |_| panic!("freed with a's ticket")), 0);
        assert_eq!(b.len(), 2);
        assert_eq!(a.release(from_a, drop), 1);
    }

    #[test]
    fn an_error_stops_the_walk_and_loses_nothing() {
        let mut r = Retired::new();
        for i in 0..4 {
            r.retire(i);
        }
        let mut free = Vec::new();
        let e = r.release_with(
            r.ticket(),
            |&mut i| if i == 2 { Err("no") } else { Ok(Release::Free) },
            |i| free.push(i),
        );
        assert_eq!((e, &free[..]), (Err("no"), &[0, 1][..]));
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), [2, 3]);
        // Both still covered by a ticket taken before their (unchanged) retirement.
        assert_eq!(r.release(r.ticket(), |i| free.push(i)), 2);
        assert_eq!(free, [0, 1, 2, 3]);
    }
}
