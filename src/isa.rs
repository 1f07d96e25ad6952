//! The instruction-set builds of the lane kernels (`mem`'s packed-lane adds, `fpisa`'s
//! FP32 shift-and-add and renormalization) and the run-time choice among them.
//!
//! [`with_avx2!`] compiles a kernel three times: for the baseline `x86_64` instruction set,
//! with AVX2 (one byte shuffle swaps 32 bytes, where SSE2 needs a dozen instructions per 16;
//! variable shifts per lane, which FPISA's alignment needs) and with AVX-512 (16 lanes to a
//! register, masks, and a vector count of leading zeros). One is picked at run time from the
//! CPU's features; other architectures get the baseline build. Tests cap the choice per
//! thread ([`test_isa::capped`]), so they run every build the CPU has.
//!
//! The one `unsafe` of the engine is in the macro's expansion: the call of the AVX2 or
//! AVX-512 build, made only after the run-time check that the CPU has the features it was
//! compiled for (the standard library's `is_x86_feature_detected!`). Its kernels' tests also
//! run under Miri (`.ci/run`). (`wire::lanes::read_be_i32s_streaming` has the other
//! kernels with `unsafe`: its streaming stores, written with intrinsics. The lab's is
//! `lab::udp_batch`: UDP system calls.)
//!
//! [`prefetch`] is here too: a cache hint, whose intrinsic is `unsafe` to call although it
//! reads nothing and never faults.

/// Asks the cache for the line holding `*ptr` ahead of its use. A hint: it reads nothing the
/// program sees, never faults (any address will do, valid or not), and does nothing where
/// the target has no prefetch instruction or under Miri.
#[inline(always)]
pub(crate) fn prefetch<T>(ptr: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    #[allow(unsafe_code)]
    // SAFETY: `prefetcht0` only moves a line into the cache; it has no effect the program
    // can observe and does not fault on any address. SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = ptr;
}

/// [`prefetch`] of every cache line that holds part of the `len` elements from `ptr`.
#[inline(always)]
pub(crate) fn prefetch_range<T>(ptr: *const T, len: usize) {
    const LINE: usize = 64;
    let p = ptr.cast::<u8>();
    let skew = p.addr() % LINE;
    let span = len * std::mem::size_of::<T>() + skew;
    let first = p.wrapping_sub(skew);
    let mut at = 0;
    while at < span {
        prefetch(first.wrapping_add(at));
        at += LINE;
    }
}

/// The builds of a kernel, in the order the dispatch prefers them (last first).
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// The baseline `x86_64` instruction set (or another architecture's).
    Baseline,
    /// AVX2 and LZCNT.
    Avx2,
    /// AVX-512 F, VL, BW, DQ and CD.
    Avx512,
}

/// Whether the dispatch may pick the `isa` build: always, outside tests.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn allowed(_: Isa) -> bool {
    true
}

#[cfg(test)]
pub(crate) use test_isa::allowed;

/// Defines `$name` as a safe function running `$body` compiled with AVX-512 (F, VL, BW, DQ,
/// CD) or else AVX2 (with LZCNT) when the CPU has them (checked at run time, the answer
/// cached by the standard library), and for the baseline instruction set otherwise.
macro_rules! with_avx2 {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        #[allow(unsafe_code)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn kernel($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512cd")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    kernel($($arg),*)
                }
                #[target_feature(enable = "avx2,lzcnt")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    kernel($($arg),*)
                }
                if $crate::isa::allowed($crate::isa::Isa::Avx512)
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512cd")
                {
                    // SAFETY: `avx512` only needs those AVX-512 subsets, checked just above.
                    return unsafe { avx512($($arg),*) };
                }
                if $crate::isa::allowed($crate::isa::Isa::Avx2)
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("lzcnt")
                {
                    // SAFETY: `avx2` only needs the CPU to support AVX2 and LZCNT, checked
                    // just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            kernel($($arg),*)
        }
    };
}

pub(crate) use with_avx2;

/// Tests run every build of a kernel on one CPU by capping, per thread, the builds the
/// dispatch may pick ([`test_isa::capped`]).
#[cfg(test)]
pub(crate) mod test_isa {
    use super::Isa;
    use std::cell::Cell;

    /// Every build, baseline first.
    pub(crate) const ALL: [Isa; 3] = [Isa::Baseline, Isa::Avx2, Isa::Avx512];

    thread_local! {
        static CAP: Cell<Isa> = const { Cell::new(Isa::Avx512) };
    }

    pub(crate) fn allowed(isa: Isa) -> bool {
        CAP.with(|c| isa <= c.get())
    }

    /// Runs `f` with the kernels called on this thread limited to `cap` and the builds
    /// below it (where the CPU has `cap`'s features; else the best it has below).
    pub(crate) fn capped<R>(cap: Isa, f: impl FnOnce() -> R) -> R {
        struct Restore(Isa);
        impl Drop for Restore {
            fn drop(&mut self) {
                CAP.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CAP.with(|c| c.replace(cap)));
        f()
    }
}
