//! FPISA floating-point addition on integer hardware (Yuan et al., NSDI 2022): the arithmetic
//! an aggregation program needs to sum FP32, FP16 or BF16 values in shared memory with only
//! integer shift-and-add engines.
//!
//! The module is pure arithmetic: no I/O, no allocation, no locks. It owns the accumulator
//! representation and the three steps the paper spreads over a pipeline (§3.2, Figure 2):
//!
//! ```text
//! wire value --decompose--> Decomposed { exp, man }        extract, implied 1 made explicit
//!            --Acc::add---> Acc { exp, man, flags }        align (right/left shift), add;
//!                                                          stored as one 64-bit memory word
//!            --Acc::value-> wire value                     sign-magnitude, LPM renormalize,
//!                                                          round, assemble
//! ```
//!
//! The accumulator is never renormalized in place (the paper's *delayed renormalization*):
//! `add` only aligns and adds, and `value` renormalizes a copy on the way out.
//!
//! # One accumulator for every format
//!
//! An [`Acc`] is an 8-bit exponent biased like FP32's (bias 127, [`ACC_BIAS`]) and a 32-bit
//! two's-complement mantissa with the implied 1 explicit at bit 23 ([`POINT`]), as the
//! paper's Figure 3 draws FP32:
//!
//! ```text
//!  31  30 ........ 24  23  22 .................... 0
//! [sign][ headroom  ][ 1 ][ fraction (FP32: 23 bits) ]     value = man * 2^(exp - 127 - 23)
//! ```
//!
//! FP16 and BF16 decompose into the same representation: their significands are shifted
//! left so the implied 1 also sits at bit 23 (FP16's 10 fraction bits land in bits 22..13,
//! BF16's 7 in bits 22..16) and their exponents are re-biased to 127 (FP16's -14..=15 become
//! 113..=142). We chose one representation rather than one per format because:
//!
//! * one accumulator layout, one memory word layout and one renormalization table
//!   ([`LPM_TABLE`]) serve every format, and values of different formats can be summed into
//!   one accumulator and read out in any format;
//! * the 16-bit formats get 13 (FP16) or 16 (BF16) bits below their own last place for free,
//!   which act as guard bits: alignment shifts lose bits far below the result's precision;
//! * the headroom stays the paper's 7 bits ([`HEADROOM`]) in every format, so the overflow
//!   and FPISA-A rules below do not depend on the format.
//!
//! # Addition: the two variants
//!
//! The incoming value is decomposed as the paper's MAU0 and MAU1 leave it: a sign bit and an
//! unsigned magnitude with the implied 1 (held as a signed `Decomposed::man` for convenience;
//! the alignment takes its magnitude apart again). Let `d = incoming.exp - stored.exp`. In
//! both variants an empty accumulator (mantissa 0, whatever its exponent: it holds the value
//! zero) simply takes the incoming value; that is exact and is not an event (the paper does
//! not say what exponent an empty register has).
//!
//! * [`Variant::Full`] is the paper's FPISA with the proposed read-shift-add-write memory unit
//!   (§4.2): the mantissa with the smaller exponent is right-shifted by `|d|`, whether it is the
//!   incoming (MAU3: its magnitude) or the stored one (MAU4: the two's-complement register),
//!   the stored exponent becomes the larger of the two, and MAU4 adds the incoming magnitude
//!   or subtracts it, by its sign bit.
//! * [`Variant::Approx`] is FPISA-A (§4.3), which never shifts the stored mantissa: if `d <= 0`
//!   the incoming magnitude is right-shifted by `-d`; if `0 < d <= 7` it is left-shifted by `d`
//!   into the headroom and the stored exponent is kept (a *left-shift event*); if `d > 7` the
//!   stored value is replaced by the incoming one (an *overwrite event*, which discards the
//!   stored sum).
//!
//! [`Acc::add`] reports events in [`Events`] so callers can count them.
//!
//! # Rounding: the paper's dataflow, bit for bit
//!
//! Bits are lost by right shifts in three places, each done on the operand the paper's
//! pipeline shifts, so each rounds the way that operand's representation does:
//!
//! 1. Alignment of the incoming value (`add`, both variants; MAU3): §3.2, "The right shift
//!    itself is performed for the metadata value by MAU3", and the metadata mantissa is the
//!    unsigned field MAU1 added the implied 1 to ("Depending on the sign bit, it either adds
//!    or subtracts the shifted mantissa value", MAU4). The magnitude is truncated: the value
//!    rounds **toward zero**, `sign * floor(|m| / 2^k)`; a value of either sign shifted past
//!    all its bits adds nothing.
//! 2. Alignment of the stored value (`add`, Full only, when the incoming exponent is larger;
//!    MAU4): the register holds the mantissa "in two's-complement signed representation"
//!    (§3.1), and nothing in §3.2 converts it before MAU4 shifts it, so the shift is
//!    arithmetic: **toward negative infinity**, `floor(m / 2^k)`; a negative sum shifted past
//!    all its bits becomes `-1` unit. This is the case §3.3 describes: "The combination of no
//!    guard digits and two's-complement representation provide round-toward-negative-infinity
//!    semantics." FPISA-A never shifts the stored value (§4.3): its left shifts of the
//!    incoming value are exact, and an overwrite stores the incoming value as it is.
//! 3. Narrowing (`value`; MAU5, MAU6): "The aggregated mantissa is first converted from its
//!    two's complement signed representation to unsigned value and sign (MAU5). FPISA then
//!    counts the number of leading zeros and shifts the mantissa value accordingly" (MAU6).
//!    The LPM table ([`renorm_shift`]) gives the shift placing the leading one at bit 23;
//!    `value` adds `23 - man_bits` for the output format and shifts the **magnitude** by the
//!    sum: the result is truncated **toward zero**, in every format, and never carries into
//!    the next binade.
//!
//! So §3.3's sentence holds for sums of positive values; a negative incoming value and a
//! negative sum read out round toward zero instead, as the dataflow the paper draws does.
//!
//! # Error bound (Full)
//!
//! Write `u(E) = 2^(E - 150)` for one unit of the accumulator mantissa at exponent `E` (for an
//! FP32 input that is exactly its ulp). Adding `x` to a non-empty accumulator is exact except
//! for the alignment shift, which loses less than one unit at the larger of the two exponents,
//! itself at most `E_max`, the largest input exponent; the loss is toward zero for a shifted
//! incoming value and toward negative infinity for a shifted stored one, so it can have either
//! sign. The first nonzero input is taken exactly. Narrowing truncates the magnitude: it loses
//! less than one ulp of the output (in the output format, at the output's exponent), toward
//! zero. So for `N` inputs with exact sum `S` (subnormal inputs counted as zero), with no
//! overflow and the result in range:
//!
//! ```text
//! |S - acc|        < (N - 1) * u(E_max)
//! |S - value(fmt)| < (N - 1) * u(E_max) + ulp_fmt(value(fmt)),   |value(fmt)| <= |acc|
//! ```
//!
//! For FP16 inputs `u(E_max)` is `2^-13` of an FP16 ulp, for BF16 `2^-16` of a BF16 ulp.
//! The result is deterministic: the same sequence of inputs always gives the same bits, also
//! when the accumulator round-trips through a memory word between additions (§3.3,
//! reproducibility); the order of the inputs can change the result, as with any FP sum.
//!
//! For [`Variant::Approx`], inputs with an exponent equal to or above the accumulator's (by at
//! most 7, left-shifted) are added exactly, and each input right-shifted into a non-empty
//! accumulator loses less than one unit at the accumulator's exponent at the time (which only
//! an overwrite or an empty accumulator changes), toward zero. An overwrite adds the
//! discarded sum `A` to the error: `|A| < |x|` for the incoming `x` that overwrote it, and
//! `|A| < 2^-7 |x|` if `A` had not grown into the headroom.
//!
//! # Special values and overflow
//!
//! | input / event | effect on the accumulator | `value(fmt)` |
//! |---|---|---|
//! | ±0 | none (the sign of zero is not kept) | +0 if the mantissa is 0 |
//! | subnormal | flushed to zero; sticky [`Acc::SUBNORMAL`] | unaffected |
//! | +Inf / -Inf | sticky [`Acc::POS_INF`] / [`Acc::NEG_INF`]; finite sum untouched | ±Inf |
//! | NaN (any payload) | sticky [`Acc::NAN`]; finite sum untouched | canonical quiet NaN |
//! | +Inf and -Inf both seen | both flags | canonical quiet NaN |
//! | mantissa sum beyond ±(2^31 - 1) | saturates to ±`i32::MAX`; sticky [`Acc::OVERFLOW`] | the saturated value, renormalized (finite) |
//! | exponent above the format's range after renormalization | none | ±Inf |
//! | exponent below the format's normal range | none | ±0 (sign kept, flush to zero) |
//!
//! NaN takes precedence over infinities, which take precedence over the finite sum. Exponent
//! overflow on output gives ±Inf in both signs so that an out-of-range result is never
//! mistaken for a finite one.
//!
//! ## Overflow of the mantissa
//!
//! With 7 bits of headroom, 128 additions of the largest mantissa (`0x00FF_FFFF`) at one
//! exponent fit; the 129th overflows (§3.3). The paper leaves the rest to the implementation:
//! "If overflow occurs, it can be detected and signaled to the user, who can handle it in an
//! application-specific way." Here an addition whose mantissa sum leaves `±(2^31 - 1)`:
//!
//! * stores the saturated mantissa `±(2^31 - 1)` ([`MAN_LIMIT`]) with the sum's sign, at the
//!   exponent the alignment chose (the range is symmetric, so both signs saturate alike);
//! * sets the sticky [`Acc::OVERFLOW`] flag, which no later addition clears (also when the
//!   sum comes back in range), and reports [`Events::overflow`] for that addition (each
//!   addition that goes past the limit again reports it again); the RMW engine counts these
//!   ([`FpisaCounts::overflows`]) and the FPISA aggregation program adds them to
//!   its overflow counter ([`crate::microcode::trio_ml::TrioMl::fpisa_events`]);
//! * reads out as a **finite** number: [`Acc::value`] renormalizes the saturated mantissa
//!   like any other, i.e. `±(2^31 - 1) * 2^(exp - 150)` with the magnitude truncated to the
//!   output format, `±(2^8 - 2^-16) * 2^(exp - 127)` in FP32 (at exponent 127, `±255.99998`,
//!   bits `0x437F_FFFF` / `0xC37F_FFFF`), or ±Inf if that exceeds the format's range. The
//!   value carries no mark of the overflow; the flag (in the word, and in the counts) is how
//!   the caller learns the sum is wrong. A Result built by [`fp32_values_be`] carries the
//!   saturated values; only the counters tell.
//!
//! # Memory word
//!
//! The shared memory's read-modify-write engine keeps one accumulator per 8-byte word
//! ([`Acc::to_word`], [`Acc::from_word`]):
//!
//! ```text
//! bits  0..32  mantissa (two's complement)
//! bits 32..40  exponent
//! bits 40..48  flags
//! bits 48..64  zero (ignored when read)
//! ```
//!
//! [`Acc::ZERO`] is the word 0, so untouched (zero-filled) memory holds empty accumulators.
//!
//! ```
//! use pfemu::fpisa::{Acc, Format, Variant};
//!
//! // The paper's Figure 4: 1.0 arrives at a register holding 3.0.
//! let mut acc = Acc::ZERO;
//! acc.add_bits(3.0f32.to_bits(), Format::Fp32, Variant::Full);
//! acc.add_bits(1.0f32.to_bits(), Format::Fp32, Variant::Full);
//! assert_eq!((acc.exp, acc.man), (128, 0x0100_0000)); // 0b10.0 x 2^1, not yet renormalized
//! assert_eq!(f32::from_bits(acc.value(Format::Fp32)), 4.0);
//! ```

use std::fmt;
use std::net::Ipv4Addr;

pub(crate) mod lanes;
#[cfg(test)]
pub(crate) mod paper;

/// Bit position of the explicit leading one in an accumulator mantissa (Figure 3).
pub const POINT: u32 = 23;

/// Bits between the leading one and the sign bit: room for the sum to grow (§3.3), and the
/// largest left shift FPISA-A applies to an incoming mantissa (§4.3).
pub const HEADROOM: u32 = 7;

/// Exponent bias of the accumulator (FP32's, whatever the input format).
pub const ACC_BIAS: i32 = 127;

/// Largest mantissa magnitude an accumulator holds; a sum beyond `±MAN_LIMIT` overflows.
/// The range is symmetric (`i32::MIN` is excluded) so that every magnitude fits in 31 bits,
/// the bits Figure 5's table covers.
pub const MAN_LIMIT: i32 = i32::MAX;

/// A floating-point wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// IEEE 754 binary32: 8 exponent bits, 23 fraction bits, bias 127.
    Fp32,
    /// IEEE 754 binary16: 5 exponent bits, 10 fraction bits, bias 15.
    Fp16,
    /// bfloat16: 8 exponent bits, 7 fraction bits, bias 127 (FP32's top half).
    Bf16,
}

impl Format {
    /// Every format.
    pub const ALL: [Format; 3] = [Format::Fp32, Format::Fp16, Format::Bf16];

    /// Bits in a value: 32 or 16 (16-bit values sit in the low bits of a `u32`).
    pub const fn width(self) -> u32 {
        match self {
            Format::Fp32 => 32,
            Format::Fp16 | Format::Bf16 => 16,
        }
    }

    /// Bits in the exponent field.
    pub const fn exp_bits(self) -> u32 {
        match self {
            Format::Fp32 | Format::Bf16 => 8,
            Format::Fp16 => 5,
        }
    }

    /// Bits in the fraction field (the significand without its implied 1).
    pub const fn man_bits(self) -> u32 {
        match self {
            Format::Fp32 => 23,
            Format::Fp16 => 10,
            Format::Bf16 => 7,
        }
    }

    /// Exponent bias.
    pub const fn bias(self) -> i32 {
        match self {
            Format::Fp32 | Format::Bf16 => 127,
            Format::Fp16 => 15,
        }
    }

    /// The all-ones exponent field (infinities and NaNs).
    const fn exp_field_max(self) -> u32 {
        (1 << self.exp_bits()) - 1
    }

    /// The sign bit.
    const fn sign_bit(self) -> u32 {
        1 << (self.width() - 1)
    }

    /// The canonical quiet NaN: positive, top fraction bit set, no payload.
    pub const fn nan(self) -> u32 {
        (self.exp_field_max() << self.man_bits()) | (1 << (self.man_bits() - 1))
    }

    /// Positive or negative infinity.
    pub const fn infinity(self, negative: bool) -> u32 {
        let sign = if negative { self.sign_bit() } else { 0 };
        sign | (self.exp_field_max() << self.man_bits())
    }
}

/// What kind of value a wire value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// +0 or -0.
    Zero,
    /// A normal number: the only class whose `exp` and `man` are used.
    Normal,
    /// A subnormal number, flushed to zero.
    Subnormal,
    /// An infinity.
    Infinite {
        /// Whether it is -Inf.
        negative: bool,
    },
    /// Not a number (any payload, quiet or signalling).
    Nan,
}

/// A wire value split into the accumulator's representation (the paper's MAU0 and MAU1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decomposed {
    /// Exponent, re-biased to [`ACC_BIAS`]; 0 unless the class is [`Class::Normal`].
    pub exp: u8,
    /// Signed significand with the implied 1 at bit [`POINT`] (so `|man| < 2^24` for a
    /// decomposed normal); 0 unless the class is [`Class::Normal`].
    pub man: i32,
    /// The kind of value.
    pub class: Class,
}

/// Splits `bits` (a value of `fmt`; for 16-bit formats the low 16 bits, the high ones are
/// ignored) into exponent, signed mantissa and class. Normals are exact:
/// `value = man * 2^(exp - 150)`. Zeros, subnormals (flushed), infinities and NaNs have
/// `exp = 0` and `man = 0`.
#[inline]
pub fn decompose(bits: u32, fmt: Format) -> Decomposed {
    let bits = if fmt.width() == 32 {
        bits
    } else {
        bits & 0xFFFF
    };
    let m = fmt.man_bits();
    let fraction = bits & ((1 << m) - 1);
    let exp_field = (bits >> m) & fmt.exp_field_max();
    let negative = bits & fmt.sign_bit() != 0;
    let special = |class| Decomposed {
        exp: 0,
        man: 0,
        class,
    };
    if exp_field == 0 {
        return special(if fraction == 0 {
            Class::Zero
        } else {
            Class::Subnormal
        });
    }
    if exp_field == fmt.exp_field_max() {
        return special(if fraction == 0 {
            Class::Infinite { negative }
        } else {
            Class::Nan
        });
    }
    // < 2^24, so the cast and the negation cannot overflow.
    let significand = (((1 << m) | fraction) << (POINT - m)) as i32;
    Decomposed {
        // Normal exponents re-bias into 1..=254 (FP16: 113..=142).
        exp: (exp_field as i32 - fmt.bias() + ACC_BIAS) as u8,
        man: if negative { -significand } else { significand },
        class: Class::Normal,
    }
}

/// Which addition algorithm [`Acc::add`] runs (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum Variant {
    /// FPISA with a read-shift-add-write memory unit: the smaller operand is right-shifted,
    /// stored or incoming.
    Full,
    /// FPISA-A: only the incoming mantissa is shifted, left by at most [`HEADROOM`]; a larger
    /// gap overwrites the stored value.
    Approx,
}

/// What happened during one [`Acc::add`], for callers that count events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Events {
    /// FPISA-A replaced the stored value: the incoming exponent exceeded the stored one by
    /// more than [`HEADROOM`].
    pub overwrite: bool,
    /// FPISA-A left-shifted the incoming mantissa into the headroom (by 1 to 7 bits).
    pub left_shift: bool,
    /// The mantissa sum of this addition left `±`[`MAN_LIMIT`] and saturated
    /// ([`Acc::OVERFLOW`] is set, and stays set; a saturated accumulator reports the event
    /// again on each addition that pushes it past the limit).
    pub overflow: bool,
}

impl Events {
    /// Nothing happened.
    pub const NONE: Events = Events {
        overwrite: false,
        left_shift: false,
        overflow: false,
    };
}

/// An FPISA accumulator: an exponent and a denormalized two's-complement mantissa, plus sticky
/// flags. `value = man * 2^(exp - 150)` while no special flag is set. Fits one memory word
/// ([`Acc::to_word`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Acc {
    /// Exponent, biased by [`ACC_BIAS`]: the exponent of the last alignment.
    pub exp: u8,
    /// Mantissa, unit `2^(exp - 150)`; within `±`[`MAN_LIMIT`] (`add` never stores
    /// `i32::MIN`; `value` reads it as `-MAN_LIMIT`).
    pub man: i32,
    /// Sticky flags: [`Acc::OVERFLOW`], [`Acc::NAN`], [`Acc::POS_INF`], [`Acc::NEG_INF`],
    /// [`Acc::SUBNORMAL`].
    pub flags: u8,
}

/// The operands after alignment, before the add (MAU2 to MAU4 of Figure 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Aligned {
    /// The exponent the sum is stored with (MAU2).
    exp: u8,
    /// The stored two's-complement mantissa, shifted right arithmetically (Full, MAU4) or
    /// dropped (FPISA-A overwrite).
    stored: i64,
    /// The incoming mantissa's magnitude (MAU1's unsigned value), shifted (MAU3).
    incoming: u32,
    /// The incoming sign bit: MAU4 subtracts `incoming` instead of adding it.
    negative: bool,
    /// Overwrite or left-shift events.
    events: Events,
}

/// Arithmetic right shift (floor of `v / 2^n`) for any `n`; values of `i32` range shifted by
/// 32 or more become 0 or -1.
#[inline]
fn asr(v: i64, n: u32) -> i64 {
    v >> n.min(63)
}

/// Aligns a non-empty stored value and a nonzero incoming one: MAU2 compares the exponents,
/// MAU3 shifts the incoming magnitude, MAU4 (Full) shifts the stored two's-complement value.
#[inline]
fn align(exp: u8, man: i32, x: Decomposed, variant: Variant) -> Aligned {
    let d = i32::from(x.exp) - i32::from(exp);
    let stored = i64::from(man);
    // MAU1's metadata: sign bit and unsigned magnitude (below 2^24).
    let (negative, magnitude) = (x.man < 0, x.man.unsigned_abs());
    let aligned = |exp, stored, incoming, events| Aligned {
        exp,
        stored,
        incoming,
        negative,
        events,
    };
    if d <= 0 {
        // Both variants: the incoming value is the smaller; MAU3 shifts its magnitude right,
        // which truncates it (a 24-bit magnitude shifted by 31 is 0).
        let incoming = magnitude >> d.unsigned_abs().min(31);
        return aligned(exp, stored, incoming, Events::NONE);
    }
    let d = d as u32;
    match variant {
        Variant::Full => aligned(x.exp, asr(stored, d), magnitude, Events::NONE),
        Variant::Approx if d <= HEADROOM => {
            let events = Events {
                left_shift: true,
                ..Events::NONE
            };
            aligned(exp, stored, magnitude << d, events)
        }
        Variant::Approx => {
            let events = Events {
                overwrite: true,
                ..Events::NONE
            };
            aligned(x.exp, 0, magnitude, events)
        }
    }
}

impl Acc {
    /// The empty accumulator (the value zero, no flags); its memory word is 0.
    pub const ZERO: Acc = Acc {
        exp: 0,
        man: 0,
        flags: 0,
    };

    /// Sticky flag: a mantissa sum overflowed the headroom and saturated.
    pub const OVERFLOW: u8 = 0x01;
    /// Sticky flag: a NaN was added.
    pub const NAN: u8 = 0x02;
    /// Sticky flag: +Inf was added.
    pub const POS_INF: u8 = 0x04;
    /// Sticky flag: -Inf was added.
    pub const NEG_INF: u8 = 0x08;
    /// Sticky flag: a subnormal was added and flushed to zero.
    pub const SUBNORMAL: u8 = 0x10;

    /// Whether the finite part is zero (mantissa 0); the next nonzero input is taken as is.
    pub const fn is_empty(self) -> bool {
        self.man == 0
    }

    /// Adds a decomposed value (align, then add; no renormalization) and says what happened.
    /// Specials only set their sticky flags; see the module docs for the rules.
    #[inline]
    pub fn add(&mut self, x: Decomposed, variant: Variant) -> Events {
        if matches!(x.class, Class::Normal) {
            self.add_normal(x, variant)
        } else {
            self.add_special(x)
        }
    }

    /// [`Acc::add`] of a value that is not normal: zeros add nothing, the others set flags.
    #[cold]
    fn add_special(&mut self, x: Decomposed) -> Events {
        match x.class {
            Class::Normal => unreachable!("normal values take add_normal"),
            Class::Zero => {}
            Class::Subnormal => self.flags |= Acc::SUBNORMAL,
            Class::Infinite { negative } => {
                self.flags |= if negative { Acc::NEG_INF } else { Acc::POS_INF };
            }
            Class::Nan => self.flags |= Acc::NAN,
        }
        Events::NONE
    }

    /// [`Acc::add`] of a normal value: align, add, saturate on overflow.
    #[inline]
    fn add_normal(&mut self, x: Decomposed, variant: Variant) -> Events {
        if x.man == 0 {
            return Events::NONE;
        }
        if self.man == 0 {
            // Empty: 0 + x is x, exactly, in both variants.
            self.exp = x.exp;
            self.man = x.man;
            return Events::NONE;
        }
        let a = align(self.exp, self.man, x, variant);
        let mut events = a.events;
        // MAU4: add or subtract by the sign bit.
        let incoming = i64::from(a.incoming);
        let sum = if a.negative {
            a.stored - incoming
        } else {
            a.stored + incoming
        };
        let limit = i64::from(MAN_LIMIT);
        self.exp = a.exp;
        self.man = if sum > limit {
            events.overflow = true;
            MAN_LIMIT
        } else if sum < -limit {
            events.overflow = true;
            -MAN_LIMIT
        } else {
            sum as i32
        };
        if events.overflow {
            self.flags |= Acc::OVERFLOW;
        }
        events
    }

    /// Decomposes `bits` (a value of `fmt`) and adds it.
    #[inline]
    pub fn add_bits(&mut self, bits: u32, fmt: Format, variant: Variant) -> Events {
        self.add(decompose(bits, fmt), variant)
    }

    /// The memory word holding this accumulator: mantissa in bits 0..32, exponent in 32..40,
    /// flags in 40..48, zeros above.
    pub const fn to_word(self) -> u64 {
        (self.man as u32 as u64) | ((self.exp as u64) << 32) | ((self.flags as u64) << 40)
    }

    /// The accumulator a memory word holds (bits 48..64 are ignored).
    pub const fn from_word(word: u64) -> Acc {
        Acc {
            man: word as u32 as i32,
            exp: (word >> 32) as u8,
            flags: (word >> 40) as u8,
        }
    }

    /// The accumulated value in `fmt` (for 16-bit formats in the low bits): renormalized with
    /// the LPM table, the magnitude truncated (toward zero), assembled (the paper's MAU5 to MAU8).
    /// Any format can be read, whatever formats were added. The stored value is not changed.
    /// Specials, exponent overflow (±Inf) and underflow (±0) follow the module docs.
    #[inline]
    pub fn value(self, fmt: Format) -> u32 {
        let both_inf = Acc::POS_INF | Acc::NEG_INF;
        if self.flags & Acc::NAN != 0 || self.flags & both_inf == both_inf {
            return fmt.nan();
        }
        if self.flags & Acc::POS_INF != 0 {
            return fmt.infinity(false);
        }
        if self.flags & Acc::NEG_INF != 0 {
            return fmt.infinity(true);
        }
        if self.man == 0 {
            return 0;
        }
        // i32::MIN's magnitude needs bit 31, which the table does not cover; it reads as
        // -(2^31 - 1) (`add` never stores it).
        let man = self.man.max(-MAN_LIMIT);
        // MAU5: sign and magnitude.
        let negative = man < 0;
        let magnitude = man.unsigned_abs();
        // MAU6: the LPM shift puts the leading one at bit POINT, and narrowing to `fmt` moves
        // it on to bit `m`: one shift of the magnitude, which truncates (toward zero).
        let shift = leading_one_shift(magnitude);
        let m = fmt.man_bits();
        let right = shift + (POINT - m) as i32;
        let significand = if right >= 0 {
            magnitude >> right
        } else {
            magnitude << right.unsigned_abs()
        };
        // MAU7: the exponent, re-biased to the output format.
        let exp = i32::from(self.exp) + shift - ACC_BIAS + fmt.bias();
        // MAU8: assemble.
        let sign = if negative { fmt.sign_bit() } else { 0 };
        if exp >= fmt.exp_field_max() as i32 {
            return fmt.infinity(negative);
        }
        if exp <= 0 {
            return sign;
        }
        sign | ((exp as u32) << m) | (significand & ((1 << m) - 1))
    }
}

/// One entry of the renormalization LPM table (the paper's Figure 5, MAU6): a magnitude whose
/// first `prefix_len` bits equal `prefix`'s is shifted by `shift`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LpmEntry {
    /// The prefix, as a 32-bit key (an IPv4 address in the paper's notation).
    pub prefix: u32,
    /// How many leading bits must match (the netmask length).
    pub prefix_len: u8,
    /// Shift that puts the leading one at bit [`POINT`]: positive shifts right, negative
    /// left, 0 does nothing.
    pub shift: i8,
}

impl LpmEntry {
    /// The netmask: the first `prefix_len` bits set.
    pub const fn mask(self) -> u32 {
        if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix_len as u32)
        }
    }

    /// Whether `key` falls under this prefix.
    pub const fn matches(self, key: u32) -> bool {
        key & self.mask() == self.prefix
    }
}

impl fmt::Display for LpmEntry {
    /// Figure 5's notation, e.g. `64.0.0.0/2 -> right-shift 7`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} -> ", Ipv4Addr::from(self.prefix), self.prefix_len)?;
        match self.shift {
            0 => write!(f, "do nothing"),
            s if s > 0 => write!(f, "right-shift {s}"),
            s => write!(f, "left-shift {}", s.unsigned_abs()),
        }
    }
}

/// The renormalization table, Figure 5: entry `i` has only bit `30 - i` set and matches the
/// first `i + 2` bits, so it matches exactly the magnitudes whose leading one is bit `30 - i`,
/// and shifts by `7 - i` (`64.0.0.0/2 -> right-shift 7`, ..., `1.0.0.0/8 -> right-shift 1`,
/// `0.128.0.0/9 -> do nothing`, `0.64.0.0/10 -> left-shift 1`, ...,
/// `0.0.0.1/32 -> left-shift 23`). The last entry, `0.0.0.0/0 -> do nothing`, is the default.
/// Bit 31 is never set in a magnitude (see [`MAN_LIMIT`]), so no entry starts there.
pub const LPM_TABLE: [LpmEntry; 32] = build_lpm_table();

const fn build_lpm_table() -> [LpmEntry; 32] {
    let mut table = [LpmEntry {
        prefix: 0,
        prefix_len: 0,
        shift: 0,
    }; 32];
    let mut i = 0;
    while i < 31 {
        table[i] = LpmEntry {
            prefix: 1 << (30 - i),
            prefix_len: i as u8 + 2,
            shift: 7 - i as i8,
        };
        i += 1;
    }
    table
}

/// What the additions of one request did, lane by lane, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FpisaCounts {
    /// Additions made.
    pub adds: u64,
    /// FPISA-A overwrites (the incoming value replaced the stored one).
    pub overwrites: u64,
    /// FPISA-A left shifts of the incoming mantissa into the headroom.
    pub left_shifts: u64,
    /// Additions that overflowed the headroom (the accumulator saturated and flagged it).
    pub overflows: u64,
}

impl FpisaCounts {
    /// Counts one addition's events.
    #[inline]
    pub fn record(&mut self, e: Events) {
        self.adds += 1;
        self.overwrites += u64::from(e.overwrite);
        self.left_shifts += u64::from(e.left_shift);
        self.overflows += u64::from(e.overflow);
    }

    /// Adds another request's counts.
    pub fn merge(&mut self, o: &FpisaCounts) {
        self.adds += o.adds;
        self.overwrites += o.overwrites;
        self.left_shifts += o.left_shifts;
        self.overflows += o.overflows;
    }
}

/// [`Acc::add_bits`] of FP32 lanes in bulk: lane `i` of `src` (network order, 4 bytes each)
/// is added to the accumulator word `words[i]` ([`Acc::to_word`]'s layout), in `variant`;
/// returns the additions' events. The RMW engine's shift-and-add of
/// [`crate::mem::SharedMemory::fpisa_add_be`] runs this same code, vectorised; here it is
/// for plain memory (a host's reference, a baseline loop).
///
/// # Panics
/// If `src.len() != 4 * words.len()`.
pub fn add_fp32_be(words: &mut [u64], src: &[u8], variant: Variant) -> FpisaCounts {
    assert_eq!(src.len(), 4 * words.len(), "4 bytes per FP32 lane");
    let mut counts = FpisaCounts::default();
    lanes::add_fp32_words(words, src, variant, lanes::AddTo::Sums, &mut counts);
    counts
}

/// [`Acc::value`] in FP32 of a run of accumulator words, in bulk: `src` holds the words in
/// network order (8 bytes each, as a read of accumulator memory into local memory leaves
/// them), `dst` receives the FP32 values in network order (4 bytes each). This is the step a
/// Result builder runs before sending sums (the paper's MAU5 to MAU8), vectorised.
///
/// # Panics
/// If `src.len() != 2 * dst.len()` or `dst.len()` is not a multiple of 4.
pub fn fp32_values_be(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len() % 4, 0, "4 bytes per FP32 lane");
    lanes::fpisa_fp32_values_be(dst, src);
}

/// [`fp32_values_be`] where the words lie: `buf` holds a run of accumulator words in network
/// order (8 bytes each), and their FP32 values (network order, 4 bytes each) are left in its
/// first half, the same values [`fp32_values_be`] makes. For a Result builder that pulled the
/// words into local memory: no copy of them to renormalize from.
///
/// # Panics
/// If `buf.len()` is not a multiple of 8.
pub fn fp32_values_be_in_place(buf: &mut [u8]) {
    lanes::fpisa_fp32_values_be_in_place(buf);
}

/// [`renorm_shift`] computed with the CPU's count of leading zeros, as [`Acc::value`] uses it:
/// the table's answer for every magnitude below 2^31 (a test checks each bit position), in
/// one instruction instead of a scan of 32 entries. (`Acc::value` never asks about bit 31.)
#[inline]
pub fn leading_one_shift(magnitude: u32) -> i32 {
    if magnitude == 0 {
        0
    } else {
        31 - magnitude.leading_zeros() as i32 - POINT as i32
    }
}

/// The renormalizing shift for a mantissa magnitude, found by longest-prefix match in
/// [`LPM_TABLE`] (the way a switch without count-leading-zeros finds it): positive shifts
/// right, negative left, so that the leading one lands at bit [`POINT`]. For a magnitude in
/// `1..2^31` this is `8 - magnitude.leading_zeros()`; 0 (and, outside the table's range, a
/// magnitude with bit 31 set) falls to the default, 0.
pub fn renorm_shift(magnitude: u32) -> i32 {
    let mut best = LPM_TABLE[LPM_TABLE.len() - 1];
    for entry in LPM_TABLE {
        if entry.matches(magnitude) && entry.prefix_len > best.prefix_len {
            best = entry;
        }
    }
    i32::from(best.shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ONE: u32 = 0x3F80_0000;

    /// An accumulator after adding `values` (FP32 bits) in order.
    fn sum32(values: &[u32], variant: Variant) -> Acc {
        let mut acc = Acc::ZERO;
        for &v in values {
            acc.add_bits(v, Format::Fp32, variant);
        }
        acc
    }

    /// The exact value of the finite part of an accumulator (53 bits suffice for `i32`).
    fn exact(acc: Acc) -> f64 {
        f64::from(acc.man) * 2f64.powi(i32::from(acc.exp) - 150)
    }

    /// A reference decoder, written independently of `decompose`: subnormals decode to their
    /// real value here.
    fn to_f64(bits: u32, fmt: Format) -> f64 {
        match fmt {
            Format::Fp32 => f64::from(f32::from_bits(bits)),
            Format::Bf16 => f64::from(f32::from_bits((bits & 0xFFFF) << 16)),
            Format::Fp16 => {
                let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
                let e = ((bits >> 10) & 0x1F) as i32;
                let f = f64::from(bits & 0x3FF);
                sign * match e {
                    0 => f * 2f64.powi(-24),
                    31 if f == 0.0 => f64::INFINITY,
                    31 => f64::NAN,
                    _ => (1.0 + f / 1024.0) * 2f64.powi(e - 15),
                }
            }
        }
    }

    /// One ulp of a finite nonzero normal value of `fmt`.
    fn ulp(bits: u32, fmt: Format) -> f64 {
        let e = ((bits >> fmt.man_bits()) & ((1 << fmt.exp_bits()) - 1)) as i32;
        2f64.powi(e - fmt.bias() - fmt.man_bits() as i32)
    }

    /// Checks the narrowing of `acc` to `fmt` against the exact value: the magnitude truncated
    /// (toward zero) to one ulp, or a flush to zero below the normal range.
    fn check_narrowing(acc: Acc, fmt: Format) -> Result<(), TestCaseError> {
        let a = exact(acc);
        let out = acc.value(fmt);
        let v = to_f64(out, fmt);
        if v == 0.0 {
            let min_normal = 2f64.powi(1 - fmt.bias());
            prop_assert!(a.abs() < min_normal, "{a} read as 0 in {fmt:?}");
        } else {
            prop_assert!(v.is_finite());
            prop_assert!(
                v.signum() == a.signum()
                    && a.abs() - v.abs() >= 0.0
                    && a.abs() - v.abs() < ulp(out, fmt),
                "{a} -> {v} in {fmt:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn format_widths_and_biases() {
        let f = |fmt: Format| (fmt.width(), fmt.exp_bits(), fmt.man_bits(), fmt.bias());
        assert_eq!(f(Format::Fp32), (32, 8, 23, 127));
        assert_eq!(f(Format::Fp16), (16, 5, 10, 15));
        assert_eq!(f(Format::Bf16), (16, 8, 7, 127));
        assert_eq!(Format::Fp32.nan(), 0x7FC0_0000);
        assert_eq!(Format::Fp16.nan(), 0x7E00);
        assert_eq!(Format::Bf16.nan(), 0x7FC0);
        assert_eq!(Format::Fp32.infinity(true), 0xFF80_0000);
        assert_eq!(Format::Fp16.infinity(false), 0x7C00);
        assert_eq!(Format::Bf16.infinity(true), 0xFF80);
    }

    #[test]
    fn decompose_places_every_format_at_bit_23() {
        let one = |fmt, bits| decompose(bits, fmt);
        let expect = Decomposed {
            exp: 127,
            man: 0x0080_0000,
            class: Class::Normal,
        };
        assert_eq!(one(Format::Fp32, ONE), expect);
        assert_eq!(one(Format::Fp16, 0x3C00), expect);
        assert_eq!(one(Format::Bf16, 0x3F80), expect);
        // -1.5 in FP16: fraction 0x200 lands at bit 22; the high 16 bits are ignored.
        let d = decompose(0xABCD_BE00, Format::Fp16);
        assert_eq!((d.exp, d.man), (127, -0x00C0_0000));
        // FP16's extreme normal exponents re-bias into 113..=142.
        assert_eq!(decompose(0x0400, Format::Fp16).exp, 113);
        assert_eq!(decompose(0x7BFF, Format::Fp16).exp, 142);
        assert_eq!(decompose(0x7BFF, Format::Fp16).man, 0x00FF_E000);
        assert_eq!(decompose(0x8000_0000, Format::Fp32).class, Class::Zero);
        assert_eq!(decompose(0x8000, Format::Fp16).class, Class::Zero);
        assert_eq!(decompose(0x0000_0001, Format::Fp32).class, Class::Subnormal);
        assert_eq!(decompose(0x03FF, Format::Fp16).class, Class::Subnormal);
        assert_eq!(
            decompose(0xFC00, Format::Fp16).class,
            Class::Infinite { negative: true }
        );
        assert_eq!(decompose(0x7F81, Format::Bf16).class, Class::Nan);
        for d in [
            decompose(0xFFC0_0001, Format::Fp32),
            decompose(0x8001, Format::Bf16),
        ] {
            assert_eq!((d.exp, d.man), (0, 0));
        }
    }

    /// Figure 4, bit for bit: 1.0 arrives at a register holding 3.0.
    #[test]
    fn figure_4_three_plus_one() {
        let three = decompose(3.0f32.to_bits(), Format::Fp32);
        let one = decompose(1.0f32.to_bits(), Format::Fp32);
        // (1) extract: 0b1.1 x 2^1 and 0b1.0 x 2^0.
        assert_eq!((three.exp, three.man), (128, 0x00C0_0000));
        assert_eq!((one.exp, one.man), (127, 0x0080_0000));

        let mut acc = Acc::ZERO;
        assert_eq!(acc.add(three, Variant::Full), Events::NONE);
        assert_eq!(
            acc,
            Acc {
                exp: 128,
                man: 0x00C0_0000,
                flags: 0
            }
        );
        // (2) shift: the arriving 1.0 becomes 0b0.1 x 2^1.
        for variant in [Variant::Full, Variant::Approx] {
            let a = align(acc.exp, acc.man, one, variant);
            assert_eq!(
                (a.exp, a.stored, a.incoming),
                (128, 0x00C0_0000, 0x0040_0000)
            );
        }
        // (3)-(4) add: 0b10.0 x 2^1, stored denormalized.
        assert_eq!(acc.add(one, Variant::Full), Events::NONE);
        assert_eq!(
            acc,
            Acc {
                exp: 128,
                man: 0x0100_0000,
                flags: 0
            }
        );
        // (5) renormalize: the magnitude matches 1.0.0.0/8 -> right-shift 1 (the paper's text
        // names 0.128.0.0/9, but 0x01000000 is 1.0.0.0 and Figure 5 shifts it right by 1).
        assert_eq!(renorm_shift(0x0100_0000), 1);
        let best = LPM_TABLE
            .iter()
            .filter(|e| e.matches(0x0100_0000))
            .max_by_key(|e| e.prefix_len)
            .unwrap();
        assert_eq!(best.to_string(), "1.0.0.0/8 -> right-shift 1");
        // (6) normalized: 0b1.0 x 2^2 = 4.0.
        assert_eq!(acc.value(Format::Fp32), 0x4080_0000);
        assert_eq!(acc.value(Format::Fp16), 0x4400);
        assert_eq!(acc.value(Format::Bf16), 0x4080);
        // Delayed renormalization: reading does not change the accumulator.
        assert_eq!(acc.man, 0x0100_0000);
    }

    #[test]
    fn figure_5_table_entries() {
        let text: Vec<String> = LPM_TABLE.iter().map(|e| e.to_string()).collect();
        assert_eq!(text[0], "64.0.0.0/2 -> right-shift 7");
        assert_eq!(text[6], "1.0.0.0/8 -> right-shift 1");
        assert_eq!(text[7], "0.128.0.0/9 -> do nothing");
        assert_eq!(text[8], "0.64.0.0/10 -> left-shift 1");
        assert_eq!(text[30], "0.0.0.1/32 -> left-shift 23");
        assert_eq!(text[31], "0.0.0.0/0 -> do nothing");
        assert_eq!(
            LPM_TABLE[0],
            LpmEntry {
                prefix: 0x4000_0000,
                prefix_len: 2,
                shift: 7
            }
        );
        assert_eq!(
            LPM_TABLE[30],
            LpmEntry {
                prefix: 1,
                prefix_len: 32,
                shift: -23
            }
        );
        assert_eq!(LPM_TABLE[31].mask(), 0);
        assert_eq!(LPM_TABLE[7].mask(), 0xFF80_0000);
    }

    #[test]
    fn table_shift_equals_leading_zeros_at_every_bit() {
        assert_eq!(renorm_shift(0), 0, "zero falls to the default");
        for bit in 0..31 {
            let lowest = 1u32 << bit;
            let highest = lowest | (lowest - 1);
            for mag in [lowest, highest, lowest | (0x5555_5555 & (lowest - 1))] {
                let expect = 8 - mag.leading_zeros() as i32;
                assert_eq!(renorm_shift(mag), expect, "magnitude {mag:#x}");
                // Exactly one non-default entry matches: the table is unambiguous.
                assert_eq!(LPM_TABLE[..31].iter().filter(|e| e.matches(mag)).count(), 1);
                // And the shift does put the leading one at bit 23.
                let placed = if expect >= 0 {
                    mag >> expect
                } else {
                    mag << -expect
                };
                assert_eq!(31 - placed.leading_zeros(), POINT);
            }
        }
    }

    /// §3.3: 7 bits of headroom hold 128 additions of the largest mantissa; the 129th
    /// overflows, saturates and is flagged. Both signs, both variants.
    #[test]
    fn headroom_holds_128_largest_mantissas() {
        for variant in [Variant::Full, Variant::Approx] {
            for (bits, sign) in [(0x3FFF_FFFFu32, 1), (0xBFFF_FFFF, -1)] {
                assert_eq!(decompose(bits, Format::Fp32).man, sign * 0x00FF_FFFF);
                let mut acc = Acc::ZERO;
                for _ in 0..128 {
                    assert_eq!(acc.add_bits(bits, Format::Fp32, variant), Events::NONE);
                }
                assert_eq!((acc.exp, acc.man, acc.flags), (127, sign * 0x7FFF_FF80, 0));
                let events = acc.add_bits(bits, Format::Fp32, variant);
                assert!(events.overflow);
                assert_eq!(acc.man, sign * MAN_LIMIT);
                assert_eq!(acc.flags, Acc::OVERFLOW);
                // The saturated value reads as a finite number; the flag stays set.
                let expect = if sign > 0 { 0x437F_FFFF } else { 0xC37F_FFFF };
                assert_eq!(acc.value(Format::Fp32), expect);
                // Pushing past the limit again is reported again; coming back is not, and the
                // flag stays set.
                assert!(acc.add_bits(bits, Format::Fp32, variant).overflow);
                let back = acc.add_bits(bits ^ 0x8000_0000, Format::Fp32, variant);
                assert!(!back.overflow);
                assert_eq!(acc.man, sign * (MAN_LIMIT - 0x00FF_FFFF));
                assert_eq!(acc.flags, Acc::OVERFLOW);
            }
        }
    }

    /// An FPISA-A left shift can reach the headroom too.
    #[test]
    fn approx_left_shift_can_overflow() {
        let mut acc = Acc::ZERO;
        for _ in 0..64 {
            acc.add_bits(0x3FFF_FFFF, Format::Fp32, Variant::Approx);
        }
        // 255.99998 has exponent 134 = 127 + 7: shifted left by 7, into a full register.
        let events = acc.add_bits(0x437F_FFFF, Format::Fp32, Variant::Approx);
        assert_eq!(
            events,
            Events {
                left_shift: true,
                overflow: true,
                overwrite: false
            }
        );
        assert_eq!(acc.man, MAN_LIMIT);
    }

    #[test]
    fn i32_min_reads_like_the_negative_limit() {
        for exp in [1u8, 100, 127, 200] {
            let min = Acc {
                exp,
                man: i32::MIN,
                flags: 0,
            };
            let limit = Acc {
                man: -MAN_LIMIT,
                ..min
            };
            for fmt in Format::ALL {
                assert_eq!(min.value(fmt), limit.value(fmt));
            }
        }
        let min = Acc {
            exp: 127,
            man: i32::MIN,
            flags: 0,
        };
        assert_eq!(min.value(Format::Fp32), 0xC37F_FFFF, "-(256 - 2^-16)");
    }

    #[test]
    fn approx_left_shift_and_overwrite_events() {
        let four = 4.0f32.to_bits();
        let mut acc = sum32(&[ONE], Variant::Approx);
        let events = acc.add_bits(four, Format::Fp32, Variant::Approx);
        assert_eq!(
            events,
            Events {
                left_shift: true,
                ..Events::NONE
            }
        );
        assert_eq!((acc.exp, acc.man), (127, 0x0280_0000));
        assert_eq!(f32::from_bits(acc.value(Format::Fp32)), 5.0);

        // A gap of exactly 7 still fits the headroom.
        let mut acc = sum32(&[ONE], Variant::Approx);
        assert!(
            acc.add_bits(128f32.to_bits(), Format::Fp32, Variant::Approx)
                .left_shift
        );
        assert_eq!(f32::from_bits(acc.value(Format::Fp32)), 129.0);

        // A gap of 8 overwrites: 1.0 + 256.0 is 256.0 in FPISA-A, 257.0 in full FPISA.
        let mut acc = sum32(&[ONE], Variant::Approx);
        let events = acc.add_bits(256f32.to_bits(), Format::Fp32, Variant::Approx);
        assert_eq!(
            events,
            Events {
                overwrite: true,
                ..Events::NONE
            }
        );
        assert_eq!((acc.exp, acc.man), (135, 0x0080_0000));
        assert_eq!(f32::from_bits(acc.value(Format::Fp32)), 256.0);
        let full = sum32(&[ONE, 256f32.to_bits()], Variant::Full);
        assert_eq!(f32::from_bits(full.value(Format::Fp32)), 257.0);

        // An empty accumulator (never written, or cancelled to 0) takes any value, no event.
        for start in [&[][..], &[ONE, ONE | 0x8000_0000][..]] {
            let mut acc = sum32(start, Variant::Approx);
            assert!(acc.is_empty());
            assert_eq!(
                acc.add_bits(1e30f32.to_bits(), Format::Fp32, Variant::Approx),
                Events::NONE
            );
            assert_eq!(f32::from_bits(acc.value(Format::Fp32)), 1e30);
        }
    }

    /// Where bits are lost (see the module docs): MAU3's shift of the incoming magnitude and
    /// MAU6's shift of the sum's magnitude truncate toward zero; MAU4's shift of the stored
    /// two's-complement mantissa floors.
    #[test]
    fn shifts_round_as_the_papers_dataflow_does() {
        let tiny = 2f32.powi(-24).to_bits();
        // Alignment: +2^-24 is shifted out of 1.0's last place and lost, and so is -2^-24.
        assert_eq!(sum32(&[ONE, tiny], Variant::Full).value(Format::Fp32), ONE);
        let neg = sum32(&[ONE | 0x8000_0000, tiny | 0x8000_0000], Variant::Full);
        assert_eq!(neg.man, -0x0080_0000);
        assert_eq!(neg.value(Format::Fp32), 0xBF80_0000);
        // A stored value shifted by a larger arrival floors: -2^-24 stored, then 1.0 arrives,
        // 24 binades up: -0x800000 >> 24 is -1 unit.
        let acc = sum32(&[tiny | 0x8000_0000, ONE], Variant::Full);
        assert_eq!((acc.exp, acc.man), (127, 0x007F_FFFF));
        let acc = sum32(&[tiny, ONE], Variant::Full);
        assert_eq!((acc.exp, acc.man), (127, 0x0080_0000));

        // Narrowing: 1 + 2^-11 is between two FP16 (and BF16) values; both signs truncate.
        let x = 0x3F80_1000;
        assert_eq!(f32::from_bits(x), 1.0 + 2f32.powi(-11));
        let pos = sum32(&[x], Variant::Full);
        let neg = sum32(&[x | 0x8000_0000], Variant::Full);
        assert_eq!(pos.value(Format::Fp16), 0x3C00);
        assert_eq!(neg.value(Format::Fp16), 0xBC00);
        assert_eq!(pos.value(Format::Bf16), 0x3F80);
        assert_eq!(neg.value(Format::Bf16), 0xBF80);

        // Truncating a magnitude never carries into the next binade: -(2 - 2^-23) stays in
        // its own.
        let pos = sum32(&[0x3FFF_FFFF], Variant::Full);
        let neg = sum32(&[0xBFFF_FFFF], Variant::Full);
        assert_eq!(pos.value(Format::Fp16), 0x3FFF);
        assert_eq!(neg.value(Format::Fp16), 0xBFFF);
        assert_eq!(pos.value(Format::Bf16), 0x3FFF);
        assert_eq!(neg.value(Format::Bf16), 0xBFFF);
        assert_eq!(neg.value(Format::Fp32), 0xBFFF_FFFF);
        // A sum in the headroom loses its low bits on the way out, by magnitude too:
        // -(1 + 2^-23) twice is -0x1000002 units, read as -(2 + 2^-22).
        let neg = sum32(&[0xBF80_0001, 0xBF80_0001], Variant::Full);
        assert_eq!(neg.man, -0x0100_0002);
        assert_eq!(neg.value(Format::Fp32), 0xC000_0001);
        let neg = sum32(&[0xBF80_0001, 0xBF80_0002], Variant::Full);
        assert_eq!(neg.man, -0x0100_0003);
        assert_eq!(
            neg.value(Format::Fp32),
            0xC000_0001,
            "the odd last bit truncated"
        );
    }

    #[test]
    fn exponent_overflow_gives_infinity_and_underflow_flushes() {
        let max = f32::MAX.to_bits();
        assert_eq!(
            sum32(&[max, max], Variant::Full).value(Format::Fp32),
            0x7F80_0000
        );
        let neg = max | 0x8000_0000;
        assert_eq!(
            sum32(&[neg, neg], Variant::Full).value(Format::Fp32),
            0xFF80_0000
        );
        for variant in [Variant::Full, Variant::Approx] {
            let mut acc = Acc::ZERO;
            acc.add_bits(0x7BFF, Format::Fp16, variant); // 65504
            acc.add_bits(0x7BFF, Format::Fp16, variant);
            assert_eq!(acc.value(Format::Fp16), 0x7C00);
            assert_eq!(f32::from_bits(acc.value(Format::Fp32)), 131008.0);
            assert_eq!(acc.flags, 0, "only the output format overflows");
        }
        // Below FP16's normal range (2^-14): flushed, sign kept.
        let small = sum32(&[2f32.powi(-20).to_bits()], Variant::Full);
        assert_eq!(small.value(Format::Fp16), 0x0000);
        let small = sum32(&[2f32.powi(-20).to_bits() | 0x8000_0000], Variant::Full);
        assert_eq!(small.value(Format::Fp16), 0x8000);
        // Truncation never lifts a value just below the range into it.
        let just_below = sum32(&[0xB87F_FFFF], Variant::Full); // -(2^-14 - 2^-38)
        assert_eq!(just_below.value(Format::Fp16), 0x8000);
        // An FP32 sum below FP32's normal range flushes too.
        let mut acc = sum32(&[0x0100_0000], Variant::Full); // 2^-125
        acc.add_bits(0x8180_0000, Format::Fp32, Variant::Full); // -2^-124
        assert_eq!(acc.value(Format::Fp32), 0x8100_0000); // -2^-125, still normal
        let mut acc = sum32(&[0x0100_0000], Variant::Full);
        acc.add_bits(0x80C0_0000, Format::Fp32, Variant::Full); // -1.5 * 2^-126
        assert_eq!(exact(acc), 2f64.powi(-125) - 1.5 * 2f64.powi(-126));
        assert_eq!(acc.value(Format::Fp32), 0);
    }

    #[test]
    fn specials_set_sticky_flags_and_leave_the_sum_alone() {
        for fmt in Format::ALL {
            let one = match fmt {
                Format::Fp32 => ONE,
                Format::Fp16 => 0x3C00,
                Format::Bf16 => 0x3F80,
            };
            let inf = fmt.infinity(false);
            let ninf = fmt.infinity(true);
            let nan = fmt.nan() | 1; // a payload, lost on output
            let subnormal = 1;
            for variant in [Variant::Full, Variant::Approx] {
                let run = |inputs: &[u32]| {
                    let mut acc = Acc::ZERO;
                    for &b in inputs {
                        assert_eq!(acc.add_bits(b, fmt, variant), Events::NONE);
                    }
                    acc
                };
                let acc = run(&[one, nan, one]);
                assert_eq!((acc.man, acc.flags), (0x0100_0000, Acc::NAN));
                assert_eq!(acc.value(fmt), fmt.nan());
                let acc = run(&[one, inf]);
                assert_eq!(acc.value(fmt), inf);
                assert_eq!(acc.man, 0x0080_0000);
                assert_eq!(run(&[ninf, one]).value(fmt), ninf);
                let acc = run(&[inf, one, ninf]);
                assert_eq!(acc.flags, Acc::POS_INF | Acc::NEG_INF);
                assert_eq!(acc.value(fmt), fmt.nan());
                assert_eq!(run(&[nan, inf]).value(fmt), fmt.nan());
                let acc = run(&[one, subnormal, subnormal | fmt.sign_bit()]);
                assert_eq!(acc.flags, Acc::SUBNORMAL);
                assert_eq!(acc.value(fmt), one);
                assert_eq!(run(&[subnormal]).value(fmt), 0);
                // Zero and negative zero add nothing; a zero sum is +0.
                let acc = run(&[fmt.sign_bit(), 0]);
                assert_eq!(acc, Acc::ZERO);
                assert_eq!(acc.value(fmt), 0);
                assert_eq!(run(&[one, one | fmt.sign_bit()]).value(fmt), 0);
                assert_eq!(run(&[one | fmt.sign_bit(), one]).value(fmt), 0);
            }
        }
    }

    #[test]
    fn word_layout() {
        let acc = Acc {
            exp: 0x81,
            man: -2,
            flags: Acc::NAN | Acc::POS_INF,
        };
        assert_eq!(acc.to_word(), 0x0000_0681_FFFF_FFFE);
        assert_eq!(Acc::from_word(0xABCD_0681_FFFF_FFFE), acc);
        assert_eq!(Acc::ZERO.to_word(), 0);
        assert_eq!(Acc::from_word(0), Acc::ZERO);
        assert_eq!(Acc::default(), Acc::ZERO);
    }

    /// Every FP16 and BF16 bit pattern: normals round-trip exactly (and widen exactly to
    /// FP32), and the other classes behave as documented.
    #[test]
    fn sixteen_bit_formats_exhaustively() {
        for fmt in [Format::Fp16, Format::Bf16] {
            for bits in 0..=0xFFFFu32 {
                let reference = to_f64(bits, fmt);
                let mut acc = Acc::ZERO;
                acc.add_bits(bits, fmt, Variant::Full);
                match decompose(bits, fmt).class {
                    Class::Normal => {
                        assert_eq!(acc.value(fmt), bits, "{fmt:?} {bits:#06x}");
                        let wide = acc.value(Format::Fp32);
                        assert_eq!(f64::from(f32::from_bits(wide)), reference);
                        assert_eq!(acc.flags, 0);
                    }
                    Class::Zero => {
                        assert_eq!(reference, 0.0);
                        assert_eq!(acc, Acc::ZERO);
                        assert_eq!(acc.value(fmt), 0);
                    }
                    Class::Subnormal => {
                        assert!(reference != 0.0 && reference.abs() < 2f64.powi(1 - fmt.bias()));
                        assert_eq!(acc.flags, Acc::SUBNORMAL);
                        assert_eq!(acc.value(fmt), 0);
                    }
                    Class::Infinite { negative } => {
                        assert!(reference.is_infinite());
                        assert_eq!(negative, reference < 0.0);
                        assert_eq!(acc.value(fmt), bits);
                    }
                    Class::Nan => {
                        assert!(reference.is_nan());
                        assert_eq!(acc.value(fmt), fmt.nan());
                    }
                }
            }
        }
    }

    /// Issue 13 item 9: a negative incoming value that needs a right shift. MAU3 shifts the
    /// metadata mantissa as an unsigned magnitude, so its lost bits are truncated toward
    /// zero; MAU4 then subtracts it. `1.0 + -(1 + 2^-23) * 2^-1`: the magnitude `0x800001`
    /// shifted right by 1 is `0x400000`, and the sum is exactly 0.5 (an arithmetic shift of
    /// `-0x800001` would floor to `-0x400001` and give `0.5 - 2^-24`).
    #[test]
    fn a_negative_incoming_value_is_shifted_as_a_magnitude() {
        let x = 0xBF00_0001; // -(1 + 2^-23) * 2^-1
        for variant in [Variant::Full, Variant::Approx] {
            let acc = sum32(&[ONE, x], variant);
            assert_eq!((acc.exp, acc.man), (127, 0x0040_0000), "{variant:?}");
            assert_eq!(acc.value(Format::Fp32), 0.5f32.to_bits());
            let mut reg = paper::Register::default();
            for b in [ONE, x] {
                paper::add(&mut reg, b, paper_variant(variant));
            }
            assert_eq!((reg.exp, reg.man), (acc.exp, acc.man));
        }
        // A negative value shifted past all its bits is lost, like a positive one.
        let neg_tiny = 2f32.powi(-100).to_bits() | 0x8000_0000;
        assert_eq!(sum32(&[ONE, neg_tiny], Variant::Full).man, 0x0080_0000);
    }

    /// The other direction (Full only): the incoming exponent is larger, so MAU4 shifts the
    /// stored mantissa, a two's-complement register, arithmetically: it floors.
    /// `-(1 + 3 * 2^-23) + 2.0`: `-0x800003 >> 1 = -0x400002`, plus `0x800000` is `0x3FFFFE`
    /// at exponent 128, `1 - 2^-21`, below the exact `1 - 3 * 2^-23`.
    #[test]
    fn a_negative_stored_value_is_shifted_arithmetically() {
        let stored = 0xBF80_0003; // -(1 + 3 * 2^-23)
        let acc = sum32(&[stored, 2f32.to_bits()], Variant::Full);
        assert_eq!((acc.exp, acc.man), (128, 0x0080_0000 - 0x0040_0002));
        assert_eq!(
            f64::from(f32::from_bits(acc.value(Format::Fp32))),
            1.0 - 2f64.powi(-21)
        );
        // FPISA-A never shifts the stored value: 2.0 is left-shifted by 1 instead, exactly.
        let acc = sum32(&[stored, 2f32.to_bits()], Variant::Approx);
        assert_eq!((acc.exp, acc.man), (127, 0x0100_0000 - 0x0080_0003));
        assert_eq!(
            f64::from(f32::from_bits(acc.value(Format::Fp32))),
            1.0 - 3.0 * 2f64.powi(-23)
        );
    }

    fn paper_variant(v: Variant) -> paper::Variant {
        match v {
            Variant::Full => paper::Variant::Full,
            Variant::Approx => paper::Variant::Approx,
        }
    }

    /// Gradient-like FP32 lanes: either sign, exponents in `lo..=hi`, now and then zero.
    fn gradient_lanes(lo: u32, hi: u32, n: usize) -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(
            (any::<bool>(), lo..=hi, 0..1u32 << 23, 0..16u8).prop_map(|(neg, e, f, z)| {
                let sign = u32::from(neg) << 31;
                if z == 0 {
                    sign
                } else {
                    sign | (e << 23) | f
                }
            }),
            1..=n,
        )
    }

    proptest! {
        /// `Acc::add` and `Acc::value` are the paper's dataflow (`paper.rs`, written from the
        /// paper alone), bit for bit and event for event, after every addition: from an
        /// empty accumulator or any valid one, with incoming values that are right-shifted
        /// (both signs), shift the stored value (both signs, Full), are left-shifted or
        /// overwrite (FPISA-A), overflow.
        #[test]
        fn acc_is_the_papers_dataflow(
            start in prop_oneof![
                Just((0u8, 0i32)),
                (100u8..=160, -MAN_LIMIT..=MAN_LIMIT),
                (100u8..=160, -0x0100_0000..=0x0100_0000i32),
            ],
            values in (0u32..=30).prop_flat_map(|span| gradient_lanes(115, 115 + span, 64)),
            approx in any::<bool>(),
        ) {
            let variant = if approx { Variant::Approx } else { Variant::Full };
            let mut acc = Acc { exp: start.0, man: start.1, flags: 0 };
            let mut reg = paper::Register { exp: start.0, man: start.1 };
            for &b in &values {
                let e = acc.add_bits(b, Format::Fp32, variant);
                let o = paper::add(&mut reg, b, paper_variant(variant));
                prop_assert_eq!((acc.exp, acc.man), (reg.exp, reg.man), "adding {:#010x}", b);
                prop_assert_eq!(
                    (e.overwrite, e.left_shift, e.overflow),
                    (o.overwrite, o.left_shift, o.overflow)
                );
                prop_assert_eq!(acc.value(Format::Fp32), paper::read(reg));
            }
        }
    }

    /// A vector of FP32 values with exponents in `lo..=hi` (FP32-biased), either sign.
    fn fp32_values(lo: u32, hi: u32, n: usize) -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(
            (any::<bool>(), lo..=hi, 0..1u32 << 23)
                .prop_map(|(neg, e, f)| (u32::from(neg) << 31) | (e << 23) | f),
            1..=n,
        )
    }

    proptest! {
        /// The bulk add is `Acc::add_bits` lane by lane, specials (subnormals, infinities,
        /// NaNs) included, and counts every addition's events; the bulk read is `Acc::value`.
        #[test]
        fn bulk_add_and_read_are_lane_by_lane(
            lanes in proptest::collection::vec((any::<u32>(), 0u32..8), 1..100),
            approx in any::<bool>(),
        ) {
            let variant = if approx { Variant::Approx } else { Variant::Full };
            // Most lanes near one exponent, so that sums build up; some special.
            let bits: Vec<u32> = lanes.iter().map(|&(b, kind)| match kind {
                0 => b & 0x807F_FFFF,                          // zero or subnormal
                1 => b | 0x7F80_0000,                          // infinity or NaN
                _ => (b & 0x83FF_FFFF) | 0x3C00_0000,          // normal, exponents 120..127
            }).collect();
            let src: Vec<u8> = bits.iter().flat_map(|b| b.to_be_bytes()).collect();
            let mut words = vec![0u64; bits.len()];
            let mut want = vec![Acc::ZERO; bits.len()];
            let mut want_events = [0u64; 3];
            for _ in 0..3 {
                let c = add_fp32_be(&mut words, &src, variant);
                prop_assert_eq!(c.adds, bits.len() as u64);
                for (a, &b) in want.iter_mut().zip(&bits) {
                    let e = a.add_bits(b, Format::Fp32, variant);
                    want_events[0] += u64::from(e.overwrite);
                    want_events[1] += u64::from(e.left_shift);
                    want_events[2] += u64::from(e.overflow);
                }
                prop_assert_eq!(
                    [c.overwrites, c.left_shifts, c.overflows],
                    std::mem::take(&mut want_events)
                );
            }
            let want_words: Vec<u64> = want.iter().map(|a| a.to_word()).collect();
            prop_assert_eq!(&words, &want_words);
            let be: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            let mut values = vec![0u8; 4 * words.len()];
            fp32_values_be(&mut values, &be);
            let want_values: Vec<u8> =
                want.iter().flat_map(|a| a.value(Format::Fp32).to_be_bytes()).collect();
            prop_assert_eq!(values, want_values);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            ..ProptestConfig::default()
        })]

        #[test]
        fn fp32_round_trip_and_classes(bits in any::<u32>()) {
            let d = decompose(bits, Format::Fp32);
            let f = f32::from_bits(bits);
            let acc = { let mut a = Acc::ZERO; a.add(d, Variant::Full); a };
            match f.classify() {
                std::num::FpCategory::Normal => {
                    prop_assert_eq!(d.class, Class::Normal);
                    prop_assert_eq!(exact(acc), f64::from(f));
                    prop_assert_eq!(acc.value(Format::Fp32), bits);
                }
                std::num::FpCategory::Zero => prop_assert_eq!(d.class, Class::Zero),
                std::num::FpCategory::Subnormal => prop_assert_eq!(d.class, Class::Subnormal),
                std::num::FpCategory::Infinite => prop_assert_eq!(
                    d.class, Class::Infinite { negative: f < 0.0 }),
                std::num::FpCategory::Nan => prop_assert_eq!(d.class, Class::Nan),
            }
        }

        /// The documented bound for Full sums of FP32 values. Exponents within 15 of each
        /// other and N <= 64 keep the f64 sum exact (24 + 15 + 6 bits < 53), so it is the
        /// true sum S.
        #[test]
        fn full_sum_within_bound_of_f64(values in fp32_values(118, 133, 64)) {
            let exact_sum: f64 = values.iter().map(|&b| f64::from(f32::from_bits(b))).sum();
            let acc = sum32(&values, Variant::Full);
            prop_assert_eq!(acc.flags, 0);
            let e_max = values.iter().map(|&b| (b >> 23) & 0xFF).max().unwrap() as i32;
            let bound = (values.len() - 1) as f64 * 2f64.powi(e_max - 150);
            let err = exact_sum - exact(acc);
            prop_assert!(err == 0.0 || err.abs() < bound,
                "S - acc = {} not in (-{}, {})", err, bound, bound);
            for fmt in [Format::Fp32, Format::Bf16] {
                check_narrowing(acc, fmt)?;
                let out = acc.value(fmt);
                let v = to_f64(out, fmt);
                if v != 0.0 {
                    prop_assert!((exact_sum - v).abs() < bound + ulp(out, fmt));
                }
            }
        }

        /// The same bound for FP16 inputs, read back as FP16 (with flush-to-zero of results
        /// below FP16's normal range) and as FP32.
        #[test]
        fn full_fp16_sum_within_bound(
            values in proptest::collection::vec(
                (any::<bool>(), 8..=22u32, 0..1u32 << 10)
                    .prop_map(|(neg, e, f)| (u32::from(neg) << 15) | (e << 10) | f),
                1..=64)
        ) {
            let exact_sum: f64 = values.iter().map(|&b| to_f64(b, Format::Fp16)).sum();
            let mut acc = Acc::ZERO;
            for &b in &values {
                acc.add_bits(b, Format::Fp16, Variant::Full);
            }
            let e_max = values.iter().map(|&b| (b >> 10) & 0x1F).max().unwrap() as i32 + 112;
            let bound = (values.len() - 1) as f64 * 2f64.powi(e_max - 150);
            let err = exact_sum - exact(acc);
            prop_assert!(err == 0.0 || err.abs() < bound);
            check_narrowing(acc, Format::Fp16)?;
            check_narrowing(acc, Format::Fp32)?;
        }

        /// Reproducibility: the same sequence gives the same bits, also when the accumulator
        /// lives in a memory word between additions.
        #[test]
        fn same_sequence_same_bits(values in fp32_values(100, 160, 64), approx in any::<bool>()) {
            let variant = if approx { Variant::Approx } else { Variant::Full };
            let direct = sum32(&values, variant);
            let mut word = 0u64;
            for &b in &values {
                let mut acc = Acc::from_word(word);
                acc.add_bits(b, Format::Fp32, variant);
                word = acc.to_word();
            }
            prop_assert_eq!(Acc::from_word(word), direct);
            prop_assert_eq!(sum32(&values, variant), direct);
            for fmt in Format::ALL {
                prop_assert_eq!(Acc::from_word(word).value(fmt), direct.value(fmt));
            }
        }

        #[test]
        fn word_round_trip(exp in any::<u8>(), man in any::<i32>(), flags in any::<u8>()) {
            let acc = Acc { exp, man, flags };
            prop_assert_eq!(Acc::from_word(acc.to_word()), acc);
            prop_assert_eq!(acc.to_word() >> 48, 0);
        }

        /// With one exponent nothing is shifted, so FPISA-A is FPISA.
        #[test]
        fn approx_equals_full_at_one_exponent(
            exp in 1..=254u32,
            values in proptest::collection::vec((any::<bool>(), 0..1u32 << 23), 1..=64)
        ) {
            let bits: Vec<u32> = values.iter()
                .map(|&(neg, f)| (u32::from(neg) << 31) | (exp << 23) | f)
                .collect();
            let full = sum32(&bits, Variant::Full);
            let approx = sum32(&bits, Variant::Approx);
            prop_assert_eq!(full, approx);
            prop_assert_eq!(full.flags, 0);
        }

        /// FPISA-A's events follow exactly from the exponent gap; full FPISA has none. Without
        /// overwrites the error is below one unit at the accumulator's exponent per
        /// right-shifted input; an overwrite discards less than the incoming value. Exponents
        /// span up to 60 binades here, too many for an f64 sum: sums are exact integers in
        /// units of 2^(e_min - 150) (at most 24 + 60 + 6 bits).
        #[test]
        fn approx_events_follow_the_exponent_gap(
            values in (0u32..=60).prop_flat_map(|span| fp32_values(100, 100 + span, 64))
        ) {
            let e_min = values.iter().map(|&b| decompose(b, Format::Fp32).exp).min().unwrap();
            let units = |exp: u8, man: i32| i128::from(man) << (exp - e_min);
            let mut acc = Acc::ZERO;
            let mut full = Acc::ZERO;
            let mut exact_sum = 0i128;
            let mut bound = 0i128;
            let mut overwrites = 0;
            let mut overflowed = false;
            for &b in &values {
                let x = decompose(b, Format::Fp32);
                exact_sum += units(x.exp, x.man);
                let gap = i32::from(x.exp) - i32::from(acc.exp);
                let before = acc;
                let events = acc.add(x, Variant::Approx);
                let nonempty = !before.is_empty();
                prop_assert_eq!(events.overwrite, nonempty && gap > HEADROOM as i32);
                prop_assert_eq!(events.left_shift, nonempty && gap > 0 && gap <= HEADROOM as i32);
                // Left shifts can fill the headroom; then the bound below does not apply.
                prop_assert!(!events.overflow || acc.flags & Acc::OVERFLOW != 0);
                overflowed |= events.overflow;
                if events.overwrite {
                    overwrites += 1;
                    prop_assert_eq!((acc.exp, acc.man), (x.exp, x.man));
                    prop_assert!(exact(before).abs() < exact(acc).abs());
                } else if nonempty {
                    prop_assert_eq!(acc.exp, before.exp);
                    if gap < 0 {
                        bound += units(acc.exp, 1);
                    }
                }
                let full_events = full.add(x, Variant::Full);
                prop_assert!(!full_events.overwrite && !full_events.left_shift);
            }
            if overwrites == 0 && !overflowed {
                let err = exact_sum - units(acc.exp, acc.man);
                prop_assert!(err == 0 || err.abs() < bound, "{} vs {}", err, bound);
            }
        }

        #[test]
        fn renorm_shift_agrees_with_leading_zeros(mag in 1..1u32 << 31) {
            prop_assert_eq!(renorm_shift(mag), 8 - mag.leading_zeros() as i32);
            prop_assert_eq!(leading_one_shift(mag), renorm_shift(mag));
        }
    }
}
