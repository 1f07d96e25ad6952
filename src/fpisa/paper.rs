//! FPISA's addition of FP32 values written from the paper alone (Yuan et al., "Unlocking the
//! Power of Inline Floating-Point Operations on Programmable Switches", NSDI 2022): §3.1 for
//! the representation, §3.2 and Figure 2 for the dataflow, one function per match-action unit
//! (MAU0 to MAU8), §3.3 for overflow and rounding, §4.3 for FPISA-A. It shares no code with
//! `src/fpisa.rs` or the lane kernels; tests compare them with it bit for bit.
//!
//! ```text
//! packet --MAU0/1 extract--> Metadata { negative, exp, man }    man: unsigned, implied 1 added
//!        --MAU2 compare----> which mantissa is shifted, by how much; exponent register updated
//!        --MAU3------------> metadata mantissa shifted (right, or left for FPISA-A): unsigned
//!        --MAU4------------> stored mantissa shifted right (two's complement, Full only), then
//!                            incoming added or subtracted by the sign bit; stored back
//! read   --MAU5 to MAU8----> sign and magnitude, LPM shift of the magnitude, exponent, assemble
//! ```
//!
//! Where the paper is silent, the rules are pfemu's (documented in `src/fpisa.rs`), and each
//! is marked *not in the paper*: zeros (the paper's MAU1 would add an implied 1 to them),
//! subnormals, infinities and NaNs (not handled here: the reference takes normals and zeros),
//! an empty register, what an overflowed register holds, and exponents out of FP32's range on
//! output.
//!
//! Compiled into the library's tests (`crate::fpisa::paper`) and into `tests/fpisa.rs` (by
//! `#[path]`), so it uses nothing but `core`.

/// One value's state in the switch (§3.1, Figure 3): "The exponent field is stored in an
/// 8-bit-wide register array. The 23-bit mantissa is stored, right-aligned, in a 32-bit
/// register. To unify signs and addition/subtraction operations, we store the mantissa in
/// two's-complement signed representation." The implied 1 is bit 23, so the value is
/// `man * 2^(exp - 127 - 23)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Register {
    /// The exponent register (MAU2's), FP32's bias.
    pub exp: u8,
    /// The mantissa register (MAU4's), two's complement.
    pub man: i32,
}

/// The packet's value after MAU0 and MAU1, in metadata: the sign bit, the exponent and the
/// mantissa field with the implied 1 added, an unsigned magnitude below `2^24`. The sign stays
/// a separate bit until MAU4 uses it ("Depending on the sign bit, it either adds or
/// subtracts the shifted mantissa value").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// The sign bit.
    pub negative: bool,
    /// The exponent field.
    pub exp: u8,
    /// The mantissa field with the implied 1 (bit 23) added.
    pub man: u32,
}

/// Which FPISA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// §3.2 with §4.2's read-shift-add-write unit: the smaller operand is right-shifted,
    /// in metadata (MAU3) or in memory (MAU4).
    Full,
    /// FPISA-A (§4.3): only the metadata mantissa is shifted.
    Approx,
}

/// What one addition did, for comparison with pfemu's event counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// FPISA-A replaced the in-memory value (§4.3).
    pub overwrite: bool,
    /// FPISA-A left-shifted the metadata mantissa (§4.3).
    pub left_shift: bool,
    /// The mantissa sum left the 32-bit register's range (§3.3).
    pub overflow: bool,
}

/// MAU0 and MAU1, §3.2 Extract: "The first stages extract the exponent and mantissa from a
/// FP32 value in the input packet into separate metadata registers (MAU0), then add the
/// implied "1" to the extracted mantissa field (MAU1)." `None` for ±0, which adds nothing
/// (*not in the paper*).
///
/// # Panics
/// On a subnormal, infinity or NaN: the paper gives them no dataflow, and the reference does
/// not cover pfemu's rules for them.
pub fn extract(bits: u32) -> Option<Metadata> {
    // MAU0: the three fields.
    let negative = bits >> 31 != 0;
    let exp = ((bits >> 23) & 0xFF) as u8;
    let field = bits & 0x7F_FFFF;
    if exp == 0 && field == 0 {
        return None;
    }
    assert!(exp != 0 && exp != 0xFF, "{bits:#010x} is not normal");
    // MAU1: the implied 1.
    Some(Metadata {
        negative,
        exp,
        man: field | 1 << 23,
    })
}

/// MAU2's decision, §3.2 Align: "FPISA then compares the provided exponent value with the one
/// stored in memory in MAU2. This updates the exponent and determines which of the two
/// operands's mantissa must be right-shifted and by how much."
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alignment {
    /// Right-shift the metadata mantissa (MAU3) by this much (0: no shift).
    ShiftIncoming(u32),
    /// Right-shift the stored mantissa (MAU4) by this much; Full only.
    ShiftStored(u32),
    /// FPISA-A, incoming larger by at most the headroom: "we keep the exponent unchanged and
    /// left-shift the in-metadata mantissa".
    LeftShiftIncoming(u32),
    /// FPISA-A, incoming larger by more: "replace the in-memory value entirely with the
    /// in-metadata one".
    Overwrite,
    /// The register holds zero (mantissa 0): it takes the value as extracted, whatever its
    /// exponent (*not in the paper*, which never says what exponent an empty register has).
    Empty,
}

/// The headroom, §4.3: "This gives 7 bits of headroom, after accounting for the implicit
/// 1-bit and the sign bit."
const HEADROOM: u32 = 7;

/// MAU2: compares the exponents, updates the exponent register, says what to shift.
fn mau2(reg: &mut Register, x: Metadata, variant: Variant) -> Alignment {
    if reg.man == 0 {
        reg.exp = x.exp;
        return Alignment::Empty;
    }
    if x.exp <= reg.exp {
        // "only the smaller of the two is right shifted" (§4.3), in both variants.
        return Alignment::ShiftIncoming(u32::from(reg.exp - x.exp));
    }
    let d = u32::from(x.exp - reg.exp);
    match variant {
        Variant::Full => {
            reg.exp = x.exp;
            Alignment::ShiftStored(d)
        }
        Variant::Approx if d <= HEADROOM => Alignment::LeftShiftIncoming(d),
        Variant::Approx => {
            reg.exp = x.exp;
            Alignment::Overwrite
        }
    }
}

/// MAU3: "The right shift itself is performed for the metadata value by MAU3": the metadata
/// mantissa is the unsigned magnitude MAU1 made, so the shift drops its low bits: the
/// magnitude is truncated (toward zero, whatever the sign bit says). FPISA-A's left shift
/// happens here too (§4.3), exactly (at most 7 bits into a 32-bit field).
fn mau3(x: Metadata, a: Alignment) -> u32 {
    match a {
        // A 32-bit shifter: shifting by 32 or more leaves nothing.
        Alignment::ShiftIncoming(k) => x.man.checked_shr(k).unwrap_or(0),
        Alignment::LeftShiftIncoming(k) => x.man << k,
        Alignment::ShiftStored(_) | Alignment::Overwrite | Alignment::Empty => x.man,
    }
}

/// MAU4, §3.2 Add: "In addition to shifting the mantissa of the in-memory value, MAU4
/// performs the mantissa addition itself. Depending on the sign bit, it either adds or
/// subtracts the shifted mantissa value generated in the previous stage from the stored
/// mantissa value. The resulting mantissa value replaces the previous stored mantissa."
///
/// The stored mantissa is two's complement (§3.1), so its right shift is arithmetic: it
/// floors, which is what §3.3 means by "The combination of no guard digits and two's-complement
/// representation provide round-toward-negative-infinity semantics."
///
/// Overflow, §3.3: "If overflow occurs, it can be detected and signaled to the user". How the
/// register is left is *not in the paper*: here it saturates to `±(2^31 - 1)`.
fn mau4(reg: &mut Register, negative: bool, shifted: u32, a: Alignment) -> bool {
    let stored = match a {
        // A 32-bit arithmetic shifter: by 31 or more only copies of the sign bit are left.
        Alignment::ShiftStored(k) => reg.man >> k.min(31),
        Alignment::ShiftIncoming(_) | Alignment::LeftShiftIncoming(_) => reg.man,
        // The in-memory value is replaced, or is zero.
        Alignment::Overwrite | Alignment::Empty => 0,
    };
    let (stored, shifted) = (i64::from(stored), i64::from(shifted));
    let sum = if negative {
        stored - shifted
    } else {
        stored + shifted
    };
    let limit = i64::from(i32::MAX);
    reg.man = sum.clamp(-limit, limit) as i32;
    sum.abs() > limit
}

/// Adds FP32 `bits` (normal or zero) to `reg`: MAU0 to MAU4.
pub fn add(reg: &mut Register, bits: u32, variant: Variant) -> Outcome {
    let Some(x) = extract(bits) else {
        return Outcome::default();
    };
    let a = mau2(reg, x, variant);
    let shifted = mau3(x, a);
    let overflow = mau4(reg, x.negative, shifted, a);
    Outcome {
        overwrite: a == Alignment::Overwrite,
        left_shift: matches!(a, Alignment::LeftShiftIncoming(_)),
        overflow,
    }
}

/// The Figure 5 table's answer for a magnitude, found the way the paper builds the table:
/// "we construct a LPM table where each entry has an IP address with only the i th bit set,
/// and a netmask that matches the first i bits. A match indicates that the mantissa has
/// i - 1 leading zeros." Figure 5's entries run from `64.0.0.0/2` (right-shift 7) to
/// `0.0.0.1/32` (left-shift 23), then `Default: Do nothing`. Returns the right shift
/// (negative: left) that puts the leading one at bit 23.
fn lpm_shift(magnitude: u32) -> i32 {
    // The default.
    let mut shift = 0;
    // Shortest prefix first, so the longest match is the one left.
    for i in 2..=32u32 {
        let address = 1u32 << (32 - i);
        let netmask = u32::MAX << (32 - i);
        if magnitude & netmask == address {
            let leading_zeros = i as i32 - 1;
            shift = 8 - leading_zeros;
        }
    }
    shift
}

/// Reads `reg` as FP32: MAU5 to MAU8 (§3.2, Renormalize and Assemble). `reg.man` must not be
/// `i32::MIN` (a register [`add`] never makes; Figure 5 has no entry for its magnitude).
pub fn read(reg: Register) -> u32 {
    // Not in the paper: a zero mantissa is +0 (the table's default would leave no leading 1).
    if reg.man == 0 {
        return 0;
    }
    assert_ne!(reg.man, i32::MIN, "no Figure 5 entry for 2^31");
    // MAU5: "The aggregated mantissa is first converted from its two's complement signed
    // representation to unsigned value and sign".
    let negative = reg.man < 0;
    let magnitude = reg.man.unsigned_abs();
    // MAU6: "counts the number of leading zeros and shifts the mantissa value accordingly, in
    // order to place the leading "1" bit in the right location": the unsigned value is
    // shifted, so a right shift truncates it.
    let shift = lpm_shift(magnitude);
    let normalized = if shift >= 0 {
        magnitude >> shift
    } else {
        magnitude << -shift
    };
    // MAU7: "The exponent is adjusted also according to the leading zeros' count".
    let exp = i32::from(reg.exp) + shift;
    // MAU8: "merge the sign, exponent, and lower 23 bit of the 32-bit mantissa fields".
    let sign = u32::from(negative) << 31;
    // Not in the paper: out of FP32's normal range, ±Inf above and ±0 below.
    if exp >= 0xFF {
        return sign | 0x7F80_0000;
    }
    if exp <= 0 {
        return sign;
    }
    sign | (exp as u32) << 23 | (normalized & 0x7F_FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figure 4 step by step: 1.0 arrives at a register holding 3.0.
    #[test]
    fn figure_4() {
        let mut reg = Register::default();
        add(&mut reg, 3.0f32.to_bits(), Variant::Full);
        assert_eq!(
            reg,
            Register {
                exp: 128,
                man: 0x00C0_0000
            }
        );
        let one = extract(1.0f32.to_bits()).unwrap();
        let mut r = reg;
        let a = mau2(&mut r, one, Variant::Full);
        assert_eq!(a, Alignment::ShiftIncoming(1));
        assert_eq!(mau3(one, a), 0x0040_0000, "(2) 0b0.1 x 2^1");
        add(&mut reg, 1.0f32.to_bits(), Variant::Full);
        assert_eq!(
            reg,
            Register {
                exp: 128,
                man: 0x0100_0000
            },
            "(4)"
        );
        assert_eq!(lpm_shift(0x0100_0000), 1, "(5) right shift 1");
        assert_eq!(read(reg), 4.0f32.to_bits(), "(6)");
    }

    /// §4.3: FPISA-A left-shifts a larger arrival within the headroom, and past it replaces
    /// the in-memory value.
    #[test]
    fn fpisa_a_left_shift_and_overwrite() {
        let mut reg = Register::default();
        add(&mut reg, 1.0f32.to_bits(), Variant::Approx);
        let o = add(&mut reg, 4.0f32.to_bits(), Variant::Approx);
        assert!(o.left_shift && !o.overwrite);
        assert_eq!(
            reg,
            Register {
                exp: 127,
                man: 0x0280_0000
            }
        );
        let o = add(&mut reg, 1024.0f32.to_bits(), Variant::Approx);
        assert!(o.overwrite && !o.left_shift);
        assert_eq!(
            reg,
            Register {
                exp: 137,
                man: 0x0080_0000
            }
        );
    }

    /// MAU3 truncates the incoming magnitude, MAU4 floors the stored two's-complement
    /// value, MAU5 and MAU6 truncate the sum's magnitude.
    #[test]
    fn where_bits_are_lost() {
        // -(1 + 2^-23) * 2^-1 into 1.0: 0x800001 >> 1 = 0x400000, subtracted.
        let mut reg = Register {
            exp: 127,
            man: 0x0080_0000,
        };
        add(&mut reg, 0xBF00_0001, Variant::Full);
        assert_eq!(
            reg,
            Register {
                exp: 127,
                man: 0x0040_0000
            }
        );
        // 2.0 into -(1 + 3 * 2^-23): -0x800003 >> 1 = -0x400002.
        let mut reg = Register {
            exp: 127,
            man: -0x0080_0003,
        };
        add(&mut reg, 2.0f32.to_bits(), Variant::Full);
        assert_eq!(
            reg,
            Register {
                exp: 128,
                man: 0x003F_FFFE
            }
        );
        // -0x1000003 units at 2^0 read as -(2 + 2^-22): the odd last bit is truncated.
        assert_eq!(
            read(Register {
                exp: 127,
                man: -0x0100_0003
            }),
            0xC000_0001
        );
    }

    #[test]
    fn figure_5_entries() {
        assert_eq!(lpm_shift(0x4000_0000), 7);
        assert_eq!(lpm_shift(0x0100_0000), 1);
        assert_eq!(lpm_shift(0x0080_0000), 0);
        assert_eq!(lpm_shift(0x0040_0000), -1);
        assert_eq!(lpm_shift(1), -23);
        assert_eq!(lpm_shift(0x8000_0000), 0, "no /1 entry: the default");
    }
}
