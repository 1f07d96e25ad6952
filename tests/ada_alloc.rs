//! ADA's block constructors refuse a table too large for a ternary match block before they
//! build it: the refusal itself is the same error either way (`tests/ada_block.rs`), so a
//! counting allocator checks that almost nothing was allocated on the way to it. Without
//! the check first, `LookupTable::uniform(op, 32)` would build 2^32 entries (96 GiB).
//!
//! A test binary of its own, so that the counting allocator is nobody else's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pfemu::ada::arith::{ArithTable, Op};
use pfemu::ada::block::{AntilogTable, LookupTable};
use pfemu::ada::trie::BinningTrie;
use pfemu::ada::AdaError;
use pfemu::mem::tcam::TcamError;

/// [`System`], counting the bytes each thread asks for.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: a thread's last deallocations may come after its locals are gone.
    let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(bytes as u64)));
}

// SAFETY: every call is passed to `System` unchanged; counting touches only a
// thread-local `Cell` (const-initialised, no destructor, so it never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size.saturating_sub(layout.size()));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What `f` returns and the bytes it allocated on this thread.
fn allocated<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

/// Far below any table refused here (163 840 entries at least, 24 bytes each to build).
const LITTLE: u64 = 64 << 10;

fn too_large(capacity_entries: usize) -> Result<(), AdaError> {
    Err(AdaError::Tcam(TcamError::BadCapacity { capacity_entries }))
}

#[test]
fn uniform_tables_too_large_for_a_block_are_refused_before_they_are_built() {
    // The smallest cases first: without the count they are built (a few MB), and this
    // fails here rather than at s = 32.
    for (s, n) in [(12, 86_016), (13, 163_840)] {
        let (r, bytes) = allocated(|| LookupTable::uniform(Op::Mul, s).map(drop));
        assert_eq!(r, too_large(n));
        assert!(bytes < LITTLE, "s = {s}: {bytes} bytes allocated");
    }
    let (r, bytes) = allocated(|| LookupTable::uniform(Op::Sqrt, 32).map(drop));
    assert_eq!(r, too_large(1 << 32));
    assert!(bytes < LITTLE, "s = 32: {bytes} bytes allocated");
}

#[test]
fn antilog_tables_too_large_for_a_block_are_refused_before_they_are_built() {
    let (r, bytes) = allocated(|| AntilogTable::new(Op::Mul, 7).map(drop));
    assert_eq!(r, too_large(90_112));
    assert!(bytes < LITTLE, "s = 7: {bytes} bytes allocated");
    // 23 significant bits: 2^23 entries.
    let (r, bytes) = allocated(|| AntilogTable::new(Op::Div, 32).map(drop));
    assert_eq!(r, too_large(1 << 23));
    assert!(bytes < LITTLE, "s = 32: {bytes} bytes allocated");
}

/// The software tables and the monitoring trie, whose refusals are new (their own tests are
/// in `src/ada`): nothing built either.
#[test]
fn software_tables_and_tries_too_large_allocate_nothing() {
    let (r, bytes) = allocated(|| ArithTable::uniform(Op::Mul, 21).map(drop));
    assert!(matches!(r, Err(AdaError::TableTooLarge { .. })), "{r:?}");
    assert!(bytes < LITTLE, "{bytes} bytes allocated");
    let (r, bytes) = allocated(|| BinningTrie::new(65_537, 32).map(drop));
    assert!(
        matches!(r, Err(AdaError::MonitoringEntries { .. })),
        "{r:?}"
    );
    assert!(bytes < LITTLE, "{bytes} bytes allocated");
}
