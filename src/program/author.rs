//! The authoring layer: what lets a program read like the paper's listings, with names
//! written once. [`labels!`](crate::labels) declares labels, [`registers!`](crate::registers)
//! gives registers typed names ([`Reg`], read with [`Thread::get`](super::Thread::get)), and
//! [`drop_reasons!`](crate::drop_reasons) declares a program's drop reasons as an enum
//! ([`DropReasons`], registered with
//! [`ProgramBuilder::drop_reasons`](super::ProgramBuilder::drop_reasons)).
//!
//! None of it costs anything at run time: a [`Reg`] is its slot number, checked below
//! [`REGISTERS`] when the constant is evaluated, and a drop-reason variant is its index.

use std::fmt;
use std::marker::PhantomData;

use super::{DropReason, REGISTERS};

/// A register with a name and a type, made by [`registers!`](crate::registers): read it
/// with [`Thread::get`](super::Thread::get), write it with
/// [`Thread::set`](super::Thread::set). The value lives in the thread's 64-bit register
/// `slot`, converted by [`RegValue`].
pub struct Reg<T> {
    slot: u8,
    _ty: PhantomData<fn() -> T>,
}

impl<T> Reg<T> {
    /// The register in `slot`. Evaluated in a constant (as [`registers!`](crate::registers)
    /// does), a slot of [`REGISTERS`] or more is a compile-time error.
    pub const fn new(slot: usize) -> Self {
        assert!(
            slot < REGISTERS,
            "more registers than the thread has (32): drop some or keep values in local memory"
        );
        Reg {
            slot: slot as u8,
            _ty: PhantomData,
        }
    }

    /// The register's slot in [`Thread::r`](super::Thread::r).
    #[inline(always)]
    pub const fn slot(self) -> usize {
        // The mask is free and lets the compiler drop the bounds check on `Thread::r`.
        self.slot as usize & (REGISTERS - 1)
    }
}

// Derives would bound `T`; a register handle is a number whatever its type.
impl<T> Clone for Reg<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Reg<T> {}
impl<T> PartialEq for Reg<T> {
    fn eq(&self, other: &Self) -> bool {
        self.slot == other.slot
    }
}
impl<T> Eq for Reg<T> {}
impl<T> fmt::Debug for Reg<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reg({}: {})", self.slot, std::any::type_name::<T>())
    }
}

/// A type a register holds: converted to and from the 64-bit register without loss for
/// every value of the type.
pub trait RegValue: Copy {
    /// The register's bits for `self`.
    fn to_reg(self) -> u64;
    /// The value from the register's bits (the low bits, for a narrower type).
    fn from_reg(bits: u64) -> Self;
}

macro_rules! reg_value_uint {
    ($($t:ty)*) => {$(
        impl RegValue for $t {
            #[inline(always)]
            fn to_reg(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn from_reg(bits: u64) -> Self {
                // The register was written from this type, so the high bits are zero.
                bits as $t
            }
        }
    )*};
}
reg_value_uint!(u8 u16 u32 u64 usize);

impl RegValue for bool {
    #[inline(always)]
    fn to_reg(self) -> u64 {
        u64::from(self)
    }
    #[inline(always)]
    fn from_reg(bits: u64) -> Self {
        bits != 0
    }
}

impl RegValue for DropReason {
    #[inline(always)]
    fn to_reg(self) -> u64 {
        u64::from(self.0)
    }
    #[inline(always)]
    fn from_reg(bits: u64) -> Self {
        // A reason the program did not register faults when the thread drops with it.
        DropReason(bits as u16)
    }
}

/// A program's drop reasons as an enum, declared with
/// [`drop_reasons!`](crate::drop_reasons): each variant is counted in the engine's stats
/// under its name in [`DropReasons::NAMES`]. Register the enum with
/// [`ProgramBuilder::drop_reasons`](super::ProgramBuilder::drop_reasons) and drop with
/// `Verdict::Drop(MyDrop::Variant.into())`.
pub trait DropReasons: Copy + Into<DropReason> + 'static {
    /// The names, in variant order.
    const NAMES: &'static [&'static str];
}

impl DropReason {
    /// The drop reason at `index` of the program's table. For
    /// [`drop_reasons!`](crate::drop_reasons); a program names reasons by its enum.
    #[doc(hidden)]
    pub const fn from_index(index: u16) -> Self {
        DropReason(index)
    }

    /// Its index in the program's table ([`Program::drop_reasons`](super::Program::drop_reasons)).
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// Declares labels on a [`ProgramBuilder`](crate::program::ProgramBuilder), each named once:
/// `labels!(p => parse, check, out);` is
/// `let [parse, check, out] = p.labels(["parse", "check", "out"]);`.
///
/// A program split into functions (one per phase) declares its labels as a struct
/// instead, `labels!(struct Labels { parse, check, out });`, and passes it around:
/// `Labels::declare(&mut p)` declares them all, `l.parse` names one.
///
/// ```
/// use pfemu::prelude::*;
///
/// let mut p = Program::builder("two");
/// pfemu::labels!(p => first, second);
/// p.instr(first, move |_t| Ok(Goto(second)));
/// p.instr(second, |_t| Ok(Done(Verdict::Forward(0))));
/// p.entry(Entry::Packet, first);
/// assert_eq!(p.build()?.instruction_names(), ["first", "second"]);
///
/// pfemu::labels!(struct Phases { parse, count });
/// let mut p = Program::builder("phases");
/// let l = Phases::declare(&mut p);
/// p.instr(l.parse, move |_t| Ok(Goto(l.count)));
/// p.instr(l.count, |_t| Ok(Done(Verdict::Forward(0))));
/// p.entry(Entry::Packet, l.parse);
/// assert_eq!(p.build()?.instruction_names(), ["parse", "count"]);
/// # Ok::<(), pfemu::program::ProgramError>(())
/// ```
#[macro_export]
macro_rules! labels {
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident { $($label:ident),+ $(,)? }
    ) => {
        $(#[$attr])*
        #[derive(Clone, Copy, Debug)]
        $vis struct $name {
            $(
                #[doc = ::core::concat!("Label `", ::core::stringify!($label), "`.")]
                $vis $label: $crate::program::Label,
            )+
        }

        impl $name {
            /// Declares every label on the builder, in order.
            $vis fn declare(p: &mut $crate::program::ProgramBuilder) -> Self {
                $name {
                    $($label: p.label(::core::stringify!($label)),)+
                }
            }
        }
    };
    ($p:expr => $($label:ident),+ $(,)?) => {
        let [$($label),+] = $p.labels([$(::core::stringify!($label)),+]);
    };
}

/// Declares named, typed registers, numbered in order from slot 0; each is a constant
/// [`Reg`](crate::program::Reg) read with [`Thread::get`](crate::program::Thread::get) and
/// written with [`Thread::set`](crate::program::Thread::set). Types are those of
/// [`RegValue`](crate::program::RegValue) (`u8`..`u64`, `usize`, `bool`, and so
/// [`Addr`](crate::mem::Addr)).
///
/// ```
/// pfemu::registers! {
///     /// The job the packet belongs to.
///     JOB: u8,
///     /// Where its record is.
///     pub(crate) RECORD: pfemu::mem::Addr,
///     LAST: bool,
/// }
/// assert_eq!((JOB.slot(), RECORD.slot(), LAST.slot()), (0, 1, 2));
/// ```
///
/// A thread has 32 registers; a 33rd does not compile:
///
/// ```compile_fail
/// pfemu::registers! {
///     R0: u8, R1: u8, R2: u8, R3: u8, R4: u8, R5: u8, R6: u8, R7: u8, R8: u8, R9: u8,
///     R10: u8, R11: u8, R12: u8, R13: u8, R14: u8, R15: u8, R16: u8, R17: u8, R18: u8,
///     R19: u8, R20: u8, R21: u8, R22: u8, R23: u8, R24: u8, R25: u8, R26: u8, R27: u8,
///     R28: u8, R29: u8, R30: u8, R31: u8, R32: u8,
/// }
/// let _ = R32;
/// ```
#[macro_export]
macro_rules! registers {
    (@at ($n:expr);) => {};
    (@at ($n:expr); $(#[$m:meta])* $vis:vis $name:ident : $ty:ty $(, $($rest:tt)*)?) => {
        $(#[$m])*
        $vis const $name: $crate::program::Reg<$ty> = $crate::program::Reg::new($n);
        $crate::registers!(@at ($n + 1); $($($rest)*)?);
    };
    ($($body:tt)*) => {
        $crate::registers!(@at (0usize); $($body)*);
    };
}

/// Declares a program's drop reasons as an enum, each variant with the name the engine's
/// stats count it under. Register it with
/// [`ProgramBuilder::drop_reasons`](crate::program::ProgramBuilder::drop_reasons) before
/// any other drop reason, then drop with `Verdict::Drop(MyDrop::Variant.into())`.
///
/// ```
/// use pfemu::prelude::*;
///
/// pfemu::drop_reasons! {
///     /// Why `tiny` drops a packet.
///     pub enum TinyDrop {
///         /// Shorter than a minimum Ethernet frame.
///         TooShort = "too_short",
///     }
/// }
///
/// let mut p = Program::builder("tiny");
/// p.drop_reasons::<TinyDrop>();
/// pfemu::labels!(p => start);
/// p.instr(start, |_t| Ok(Done(Verdict::Drop(TinyDrop::TooShort.into()))));
/// p.entry(Entry::Packet, start);
/// assert_eq!(p.build()?.drop_reasons(), ["too_short"]);
/// assert_eq!((TinyDrop::TooShort.index(), TinyDrop::TooShort.name()), (0, "too_short"));
/// assert_eq!(TinyDrop::ALL, [TinyDrop::TooShort]);
/// # Ok::<(), pfemu::program::ProgramError>(())
/// ```
#[macro_export]
macro_rules! drop_reasons {
    (
        $(#[$attr:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vm:meta])* $variant:ident = $reason:literal),+ $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u16)]
        $vis enum $name {
            $($(#[$vm])* $variant),+
        }

        impl $name {
            /// The reasons' names, in variant order (the stats count each under its name).
            #[allow(dead_code)]
            pub const NAMES: [&'static str; [$(::core::stringify!($variant)),+].len()] =
                [$($reason),+];

            /// Every reason, in variant order.
            #[allow(dead_code)]
            pub const ALL: [$name; [$(::core::stringify!($variant)),+].len()] =
                [$($name::$variant),+];

            /// The reason's position in the program's reasons (and in [`Self::NAMES`]).
            #[allow(dead_code)]
            pub const fn index(self) -> usize {
                self as usize
            }

            /// The name the stats count it under.
            #[allow(dead_code)]
            pub const fn name(self) -> &'static str {
                Self::NAMES[self as usize]
            }
        }

        impl $crate::program::DropReasons for $name {
            const NAMES: &'static [&'static str] = &<$name>::NAMES;
        }

        impl ::core::convert::From<$name> for $crate::program::DropReason {
            #[inline(always)]
            fn from(r: $name) -> Self {
                $crate::program::DropReason::from_index(r as u16)
            }
        }
    };
}
