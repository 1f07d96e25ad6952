//! The [`header!`](crate::header) macro and the bit-field helpers it expands to.
//!
//! Trio's Microcode describes packet headers as C-like structs of bit fields
//! (`struct ether_t { dmac : 48; smac : 48; etype : 16; };`). [`header!`](crate::header)
//! turns the same description into a zero-copy view over a byte buffer, in the style of
//! smoltcp's `wire` module:
//!
//! ```
//! pfemu::header! {
//!     /// Ethernet II header (the paper's `ether_t`).
//!     pub struct MyEther {
//!         /// Destination MAC.
//!         dmac: 48,
//!         /// Source MAC.
//!         smac: 48,
//!         /// EtherType.
//!         etype: 16,
//!     }
//! }
//!
//! let bytes = [0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
//! let eth = MyEther::new_checked(&bytes[..]).unwrap();
//! assert_eq!(eth.dmac(), 0x02_00_00_00_00_01);
//! assert_eq!(eth.etype(), 0x0800_u16);
//! assert_eq!(MyEther::<&[u8]>::LEN, 14);
//! ```
//!
//! Bits are numbered in network order: the first field starts at the most significant bit
//! of byte 0, and a field's own most significant bit comes first.

/// Type-level field width, used to pick a getter's return type: `Width<W>` implements
/// [`FieldWidth`] for every `W` in `1..=128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Width<const W: usize>;

/// Maps a field width to the smallest Rust type that holds it: width 1 is `bool`,
/// `2..=8` is `u8`, `9..=16` is `u16`, `17..=32` is `u32`, `33..=64` is `u64` and
/// `65..=128` is `u128`.
pub trait FieldWidth {
    /// The getter/setter type for a field of this width.
    type Type: FieldValue;
}

/// A value that can be read from / written to a bit field of a byte buffer.
pub trait FieldValue: Copy {
    /// Reads the `width`-bit field starting `bit_off` bits into `buf`.
    ///
    /// # Panics
    /// If the field does not lie inside `buf`.
    fn read(buf: &[u8], bit_off: usize, width: usize) -> Self;

    /// Writes `self`, truncated to its low `width` bits, to the field starting `bit_off`
    /// bits into `buf`; every other bit of `buf` is left unchanged.
    ///
    /// # Panics
    /// If the field does not lie inside `buf`.
    fn write(self, buf: &mut [u8], bit_off: usize, width: usize);
}

impl FieldValue for bool {
    #[inline(always)]
    fn read(buf: &[u8], bit_off: usize, width: usize) -> Self {
        get_bits64(buf, bit_off, width) != 0
    }

    #[inline(always)]
    fn write(self, buf: &mut [u8], bit_off: usize, width: usize) {
        set_bits64(buf, bit_off, width, u64::from(self))
    }
}

macro_rules! impl_field_value_u64 {
    ($($ty:ty)*) => {$(
        impl FieldValue for $ty {
            #[inline(always)]
            fn read(buf: &[u8], bit_off: usize, width: usize) -> Self {
                get_bits64(buf, bit_off, width) as $ty
            }

            #[inline(always)]
            fn write(self, buf: &mut [u8], bit_off: usize, width: usize) {
                set_bits64(buf, bit_off, width, u64::from(self))
            }
        }
    )*};
}

impl_field_value_u64!(u8 u16 u32 u64);

impl FieldValue for u128 {
    #[inline(always)]
    fn read(buf: &[u8], bit_off: usize, width: usize) -> Self {
        get_bits(buf, bit_off, width)
    }

    #[inline(always)]
    fn write(self, buf: &mut [u8], bit_off: usize, width: usize) {
        set_bits(buf, bit_off, width, self)
    }
}

macro_rules! impl_widths {
    ($ty:ty => $($w:literal)*) => {$(
        impl FieldWidth for Width<$w> {
            type Type = $ty;
        }
    )*};
}

impl_widths!(bool => 1);
impl_widths!(u8 => 2 3 4 5 6 7 8);
impl_widths!(u16 => 9 10 11 12 13 14 15 16);
impl_widths!(u32 => 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
impl_widths!(u64 =>
    33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62
    63 64);
impl_widths!(u128 =>
    65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94
    95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117
    118 119 120 121 122 123 124 125 126 127 128);

/// Where a field of a [`header!`](crate::header) record lies, for the read-modify-write
/// XTXNs that update one field of a record in shared memory without reading it into local
/// memory. Shared memory maps each 8-byte word of a record to a `u64` read big-endian, so
/// a field that lies inside one word is [`Field::mask`] of word [`Field::word`], its value
/// `(word & mask) >> shift`. The macro generates one per field (`JobCtx::SRC_CNT`); the
/// word, shift and mask of a field that straddles two words do not exist, and asking for
/// them in a constant is a compile-time error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Field {
    /// Bit offset from the start of the record (bit 0 is the top bit of byte 0).
    pub bit: usize,
    /// Width in bits.
    pub width: usize,
}

impl Field {
    /// The field `width` bits wide at bit offset `bit`.
    pub const fn new(bit: usize, width: usize) -> Field {
        Field { bit, width }
    }

    /// Whether the field lies inside one 8-byte word.
    pub const fn in_one_word(self) -> bool {
        self.width >= 1 && self.width <= 64 && self.bit % 64 + self.width <= 64
    }

    /// The index of the 8-byte word of the record holding the field.
    ///
    /// # Panics
    /// If the field straddles two words (at compile time, in a constant).
    pub const fn word(self) -> u64 {
        assert!(self.in_one_word(), "the field straddles two 8-byte words");
        (self.bit / 64) as u64
    }

    /// The shift of the field's least significant bit in its word.
    ///
    /// # Panics
    /// If the field straddles two words.
    pub const fn shift(self) -> u32 {
        assert!(self.in_one_word(), "the field straddles two 8-byte words");
        (64 - self.bit % 64 - self.width) as u32
    }

    /// The field's bits in its word.
    ///
    /// # Panics
    /// If the field straddles two words.
    pub const fn mask(self) -> u64 {
        mask64(self.width) << self.shift()
    }

    /// The field's value in its word.
    #[inline]
    pub const fn get(self, word: u64) -> u64 {
        (word & self.mask()) >> self.shift()
    }

    /// The index of the first 8-byte word holding any bit of the field: for a field that
    /// straddles two words, read it and the next with [`Field::get_across`].
    pub const fn first_word(self) -> u64 {
        (self.bit / 64) as u64
    }

    /// The value of a field of at most 64 bits that may straddle two words, from the word
    /// at [`Field::first_word`] and the one after it (a field in one word ignores `next`).
    ///
    /// # Panics
    /// If the field is wider than 64 bits.
    #[inline]
    pub const fn get_across(self, first: u64, next: u64) -> u64 {
        assert!(
            self.width >= 1 && self.width <= 64,
            "the field is wider than 64 bits"
        );
        let both = (first as u128) << 64 | next as u128;
        let shift = 128 - self.bit % 64 - self.width;
        (both >> shift) as u64 & mask64(self.width)
    }

    /// The field's value as a `u8`, for a field of at most 8 bits.
    ///
    /// # Panics
    /// If the field is wider (at compile time for a constant field).
    #[inline]
    pub const fn get_u8(self, word: u64) -> u8 {
        assert!(self.width <= 8, "the field is wider than a u8");
        self.get(word) as u8
    }

    /// The field's value as a `u16`, for a field of at most 16 bits.
    ///
    /// # Panics
    /// If the field is wider.
    #[inline]
    pub const fn get_u16(self, word: u64) -> u16 {
        assert!(self.width <= 16, "the field is wider than a u16");
        self.get(word) as u16
    }

    /// The field's value as a `u32`, for a field of at most 32 bits.
    ///
    /// # Panics
    /// If the field is wider.
    #[inline]
    pub const fn get_u32(self, word: u64) -> u32 {
        assert!(self.width <= 32, "the field is wider than a u32");
        self.get(word) as u32
    }

    /// `value` placed in the field's bits (the bits beyond its width dropped): the value
    /// of a masked write or the delta of a wrapping add that changes only this field.
    #[inline]
    pub const fn place(self, value: u64) -> u64 {
        (value << self.shift()) & self.mask()
    }

    /// The 32-bit lane of the word holding the field, as `fetch_add32` numbers them (0:
    /// the first 4 bytes, the word's high half).
    ///
    /// # Panics
    /// If the field straddles two lanes.
    pub const fn lane(self) -> u8 {
        assert!(
            self.bit % 32 + self.width <= 32,
            "the field straddles two 32-bit lanes"
        );
        ((self.bit % 64) / 32) as u8
    }

    /// The shift of the field's least significant bit in its 32-bit lane.
    ///
    /// # Panics
    /// If the field straddles two lanes.
    pub const fn lane_shift(self) -> u32 {
        let _ = self.lane();
        (32 - self.bit % 32 - self.width) as u32
    }

    /// The byte of the record the field starts at.
    ///
    /// # Panics
    /// If the field does not start on a byte boundary.
    pub const fn byte(self) -> usize {
        assert!(
            self.bit.is_multiple_of(8),
            "the field does not start on a byte"
        );
        self.bit / 8
    }

    /// Bit `i` of the field's value (bit 0 the least significant), as a 1-bit field.
    ///
    /// # Panics
    /// If `i` is not below the width.
    pub const fn bit(self, i: usize) -> Field {
        assert!(i < self.width, "bit index beyond the field's width");
        Field::new(self.bit + self.width - 1 - i, 1)
    }
}

/// An array field of a [`header!`](crate::header) record (`src_mask: [64; 4]`): `len`
/// fields of `width` bits each, back to back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldArray {
    /// The first element.
    pub first: Field,
    /// Elements in the array.
    pub len: usize,
}

impl FieldArray {
    /// `len` fields of `width` bits from bit offset `bit`.
    pub const fn new(bit: usize, width: usize, len: usize) -> FieldArray {
        FieldArray {
            first: Field::new(bit, width),
            len,
        }
    }

    /// Element `i`.
    ///
    /// # Panics
    /// If `i` is not below [`FieldArray::len`].
    pub const fn at(self, i: usize) -> Field {
        assert!(i < self.len, "index beyond the array field's length");
        Field::new(self.first.bit + i * self.first.width, self.first.width)
    }

    /// Bit `i` of the array read as one little-endian bit set: bit `i % width` of element
    /// `i / width` (Trio-ML's source masks: source `s` is bit `s % 64` of mask `s / 64`).
    pub const fn bit(self, i: usize) -> Field {
        self.at(i / self.first.width).bit(i % self.first.width)
    }
}

/// Identity, used by [`header!`](crate::header) to pass a width expression as a const
/// generic argument.
#[doc(hidden)]
pub const fn width(w: usize) -> usize {
    w
}

/// The low `width` bits set (`width` in `0..=64`).
#[inline(always)]
const fn mask64(width: usize) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// The low `width` bits set (`width` in `0..=128`).
#[inline(always)]
const fn mask128(width: usize) -> u128 {
    if width >= 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    }
}

/// Reads the `width`-bit big-endian field (`width` in `1..=64`) that starts `bit_off` bits
/// into `buf` (bit 0 is the most significant bit of `buf[0]`).
///
/// This is the hot path behind every generated getter of at most 64 bits: it touches at
/// most 9 bytes, and byte-aligned 8/16/32/64-bit fields are a plain big-endian load. With
/// constant `bit_off` and `width` (as in generated getters) the branches fold away.
///
/// # Panics
/// If `width` is 0 or above 64, or the field does not lie inside `buf`.
#[inline(always)]
pub fn get_bits64(buf: &[u8], bit_off: usize, width: usize) -> u64 {
    assert!(
        (1..=64).contains(&width),
        "bit field width must be in 1..=64"
    );
    let first = bit_off / 8;
    let lead = bit_off % 8;
    let nbytes = (lead + width).div_ceil(8);
    let bytes = &buf[first..first + nbytes];
    if lead == 0 {
        match width {
            8 => return u64::from(bytes[0]),
            16 => return u64::from(u16::from_be_bytes([bytes[0], bytes[1]])),
            32 => return u64::from(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
            64 => {
                return u64::from_be_bytes([
                    bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                ])
            }
            _ => {}
        }
    }
    if nbytes <= 8 {
        // One big-endian load of the 8 bytes from the field's first, where the buffer
        // holds them (most fields: a header's last few bytes take the loop below).
        if let Some(word) = buf.get(first..first + 8) {
            let word = u64::from_be_bytes(word.try_into().expect("8 bytes"));
            return (word >> (64 - lead - width)) & mask64(width);
        }
    }
    // Bits after the field in its last byte.
    let trail = nbytes * 8 - lead - width;
    if nbytes <= 8 {
        let mut acc = 0u64;
        for &b in bytes {
            acc = (acc << 8) | u64::from(b);
        }
        (acc >> trail) & mask64(width)
    } else {
        let mut acc = 0u128;
        for &b in bytes {
            acc = (acc << 8) | u128::from(b);
        }
        ((acc >> trail) as u64) & mask64(width)
    }
}

/// Writes the low `width` bits of `value` (`width` in `1..=64`) to the big-endian field
/// that starts `bit_off` bits into `buf`; higher bits of `value` are dropped (the hardware
/// truncates too) and every bit of `buf` outside the field is left unchanged.
///
/// # Panics
/// If `width` is 0 or above 64, or the field does not lie inside `buf`.
#[inline(always)]
pub fn set_bits64(buf: &mut [u8], bit_off: usize, width: usize, value: u64) {
    assert!(
        (1..=64).contains(&width),
        "bit field width must be in 1..=64"
    );
    let value = value & mask64(width);
    let first = bit_off / 8;
    let lead = bit_off % 8;
    let nbytes = (lead + width).div_ceil(8);
    let bytes = &mut buf[first..first + nbytes];
    if lead == 0 {
        match width {
            8 => {
                bytes[0] = value as u8;
                return;
            }
            16 => {
                bytes.copy_from_slice(&(value as u16).to_be_bytes());
                return;
            }
            32 => {
                bytes.copy_from_slice(&(value as u32).to_be_bytes());
                return;
            }
            64 => {
                bytes.copy_from_slice(&value.to_be_bytes());
                return;
            }
            _ => {}
        }
    }
    let trail = nbytes * 8 - lead - width;
    let mut acc = 0u128;
    for &b in bytes.iter() {
        acc = (acc << 8) | u128::from(b);
    }
    let field_mask = u128::from(mask64(width)) << trail;
    acc = (acc & !field_mask) | (u128::from(value) << trail);
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (acc >> (8 * (nbytes - 1 - i))) as u8;
    }
}

/// Reads the `width`-bit big-endian field (`width` in `0..=128`) that starts `bit_off`
/// bits into `buf`. The general (slow) path, used for fields wider than 64 bits such as
/// IPv6 addresses; width 0 reads as 0.
///
/// # Panics
/// If `width` is above 128 or the field does not lie inside `buf`.
pub fn get_bits(buf: &[u8], bit_off: usize, width: usize) -> u128 {
    assert!(width <= 128, "bit field width must be in 0..=128");
    let end = bit_off + width;
    let mut acc = 0u128;
    let mut bit = bit_off;
    while bit < end {
        let lead = bit % 8;
        let take = (8 - lead).min(end - bit);
        let chunk = (u32::from(buf[bit / 8]) >> (8 - lead - take)) & ((1u32 << take) - 1);
        acc = (acc << take) | u128::from(chunk);
        bit += take;
    }
    acc
}

/// Writes the low `width` bits of `value` (`width` in `0..=128`) to the big-endian field
/// that starts `bit_off` bits into `buf`; higher bits of `value` are dropped and every bit
/// of `buf` outside the field is left unchanged.
///
/// # Panics
/// If `width` is above 128 or the field does not lie inside `buf`.
pub fn set_bits(buf: &mut [u8], bit_off: usize, width: usize, value: u128) {
    assert!(width <= 128, "bit field width must be in 0..=128");
    let value = value & mask128(width);
    let end = bit_off + width;
    let mut bit = bit_off;
    while bit < end {
        let lead = bit % 8;
        let take = (8 - lead).min(end - bit);
        // Bits of `value` still to write after this chunk.
        let below = end - bit - take;
        let chunk = ((value >> below) as u32) & ((1u32 << take) - 1);
        let shift = 8 - lead - take;
        let mask = (((1u32 << take) - 1) << shift) as u8;
        let byte = &mut buf[bit / 8];
        *byte = (*byte & !mask) | ((chunk << shift) as u8);
        bit += take;
    }
}

/// `name` without a leading `r#` (so the raw identifier `r#final` lists as `"final"` in a
/// header's `FIELDS`).
pub const fn strip_raw(name: &'static str) -> &'static str {
    let bytes = name.as_bytes();
    if bytes.len() > 2 && bytes[0] == b'r' && bytes[1] == b'#' {
        let (_, rest) = bytes.split_at(2);
        match core::str::from_utf8(rest) {
            Ok(s) => s,
            Err(_) => name,
        }
    } else {
        name
    }
}

/// The getter/setter type of a field `width` bits wide (see [`FieldWidth`]); an internal
/// helper of [`header!`](crate::header), spelled out for integer literals so that rustdoc
/// shows the plain type.
#[doc(hidden)]
#[macro_export]
#[allow(clippy::deprecated_cfg_attr)] // `#[rustfmt::skip]` would make this macro "macro-expanded"
#[cfg_attr(rustfmt, rustfmt::skip)]
macro_rules! __header_field_type {
    (1) => { bool }; (2) => { u8 }; (3) => { u8 }; (4) => { u8 }; (5) => { u8 }; (6) => { u8 };
    (7) => { u8 }; (8) => { u8 }; (9) => { u16 }; (10) => { u16 }; (11) => { u16 };
    (12) => { u16 }; (13) => { u16 }; (14) => { u16 }; (15) => { u16 }; (16) => { u16 };
    (17) => { u32 }; (18) => { u32 }; (19) => { u32 }; (20) => { u32 }; (21) => { u32 };
    (22) => { u32 }; (23) => { u32 }; (24) => { u32 }; (25) => { u32 }; (26) => { u32 };
    (27) => { u32 }; (28) => { u32 }; (29) => { u32 }; (30) => { u32 }; (31) => { u32 };
    (32) => { u32 }; (33) => { u64 }; (34) => { u64 }; (35) => { u64 }; (36) => { u64 };
    (37) => { u64 }; (38) => { u64 }; (39) => { u64 }; (40) => { u64 }; (41) => { u64 };
    (42) => { u64 }; (43) => { u64 }; (44) => { u64 }; (45) => { u64 }; (46) => { u64 };
    (47) => { u64 }; (48) => { u64 }; (49) => { u64 }; (50) => { u64 }; (51) => { u64 };
    (52) => { u64 }; (53) => { u64 }; (54) => { u64 }; (55) => { u64 }; (56) => { u64 };
    (57) => { u64 }; (58) => { u64 }; (59) => { u64 }; (60) => { u64 }; (61) => { u64 };
    (62) => { u64 }; (63) => { u64 }; (64) => { u64 }; (65) => { u128 }; (66) => { u128 };
    (67) => { u128 }; (68) => { u128 }; (69) => { u128 }; (70) => { u128 }; (71) => { u128 };
    (72) => { u128 }; (73) => { u128 }; (74) => { u128 }; (75) => { u128 }; (76) => { u128 };
    (77) => { u128 }; (78) => { u128 }; (79) => { u128 }; (80) => { u128 }; (81) => { u128 };
    (82) => { u128 }; (83) => { u128 }; (84) => { u128 }; (85) => { u128 }; (86) => { u128 };
    (87) => { u128 }; (88) => { u128 }; (89) => { u128 }; (90) => { u128 }; (91) => { u128 };
    (92) => { u128 }; (93) => { u128 }; (94) => { u128 }; (95) => { u128 }; (96) => { u128 };
    (97) => { u128 }; (98) => { u128 }; (99) => { u128 }; (100) => { u128 }; (101) => { u128 };
    (102) => { u128 }; (103) => { u128 }; (104) => { u128 }; (105) => { u128 };
    (106) => { u128 }; (107) => { u128 }; (108) => { u128 }; (109) => { u128 };
    (110) => { u128 }; (111) => { u128 }; (112) => { u128 }; (113) => { u128 };
    (114) => { u128 }; (115) => { u128 }; (116) => { u128 }; (117) => { u128 };
    (118) => { u128 }; (119) => { u128 }; (120) => { u128 }; (121) => { u128 };
    (122) => { u128 }; (123) => { u128 }; (124) => { u128 }; (125) => { u128 };
    (126) => { u128 }; (127) => { u128 }; (128) => { u128 };
    (($($e:tt)*)) => {
        <$crate::wire::__private::Width<{ $crate::wire::__private::width($($e)*) }>
            as $crate::wire::__private::FieldWidth>::Type
    };
    ({$($e:tt)*}) => {
        <$crate::wire::__private::Width<{ $crate::wire::__private::width($($e)*) }>
            as $crate::wire::__private::FieldWidth>::Type
    };
    ($w:tt) => {
        <$crate::wire::__private::Width<{ $crate::wire::__private::width($w) }>
            as $crate::wire::__private::FieldWidth>::Type
    };
}

/// Declares a zero-copy header view from a Microcode-style bit-field struct.
///
/// ```
/// pfemu::header! {
///     /// The paper's `trio_ml_hdr_t` (12 bytes).
///     pub struct MlHdr {
///         /// Job id.
///         job_id: 8,
///         block_id: 32,
///         age_op: 4,
///         r#final: 1,
///         degraded: 1,
///         _: 2, // unused
///         src_id: 8,
///         src_cnt: 8,
///         gen_id: 16,
///         _: 4,
///         grad_cnt: 12,
///     }
/// }
///
/// let mut buf = [0u8; 12];
/// let mut h = MlHdr::new_checked(&mut buf[..]).unwrap();
/// h.set_final(true);
/// h.set_grad_cnt(0x123);
/// assert!(h.r#final());
/// assert_eq!(h.grad_cnt(), 0x123_u16);
/// assert_eq!(MlHdr::<&[u8]>::LEN, 12);
/// assert_eq!(buf[5], 0x08); // age_op:4, then final
/// ```
///
/// Fields are `name: width` separated by commas; `name: [width; len]` is an array of `len`
/// fields of `width` bits (a record's bit sets, say); `_: width` is unnamed padding; raw
/// identifiers (`r#final`) are accepted and doc comments / attributes may precede the
/// struct and each field. A width is an integer literal or a parenthesised constant
/// expression (`(2 * 8)`); named fields must be `1..=128` bits wide and the total must be
/// a whole number of bytes, both checked at compile time:
///
/// ```compile_fail
/// pfemu::header! {
///     /// 7 bits: not a whole number of bytes.
///     struct Bad { a: 3, b: 4 }
/// }
/// ```
///
/// For `pub struct Name { .. }` the macro generates `pub struct Name<T: AsRef<[u8]>>`
/// (deriving `Debug, Clone, Copy, PartialEq, Eq, Hash` where `T` does) with:
///
/// - `LEN` (bytes), `BITS` and `FIELDS` (`(name, bit offset, width)` of each named scalar
///   field);
/// - `new_unchecked`, `new_checked` (fails with
///   [`WireError::Truncated`](crate::wire::WireError) if the buffer is shorter than
///   `LEN`), `check_len`, `into_inner`, `as_bytes` (the first `LEN` bytes) and `rest`
///   (the bytes after them); with `T: AsMut<[u8]>` also `as_bytes_mut` and `rest_mut`;
/// - a getter `name()` per named field returning the smallest type holding the width
///   (`bool`, `u8`, `u16`, `u32`, `u64`, `u128`, per the width);
/// - with `T: AsMut<[u8]>`, a setter `set_name(v)` of the same type that keeps only the
///   low `width` bits of `v` (the hardware truncates too).
///
/// - for an array field, a getter `name(i)` and a setter `set_name(i, v)` of element `i`
///   (panicking when `i` is past the end, like a slice);
/// - a constant `NAME_LEN` (the name in snake-case capitals: `Ipv4` gives `IPV4_LEN`,
///   `MlHdr` gives `ML_HDR_LEN`), the length without naming a buffer type;
/// - an implementation of [`Header`](crate::wire::Header) for `Name` (the buffer type
///   defaults to `&'static [u8]`), so that a program views its head with
///   `t.view::<Name>(offset)?`;
/// - a unit struct `NameLayout` with one [`Field`](crate::wire::Field) constant per named
///   field and one [`FieldArray`](crate::wire::FieldArray) per array field, named like the
///   field in capitals (`MlHdrLayout::GRAD_CNT`): the word, shift, mask and lane of each
///   field for read-modify-write XTXNs on a record in shared memory, from the same
///   description as the view (so the two cannot disagree).
///
/// ```
/// pfemu::header! {
///     /// A record in shared memory.
///     pub struct Slot {
///         count: 16,
///         _: 48,
///         seen: [64; 2],
///     }
/// }
/// use pfemu::wire::Field;
/// assert_eq!(SLOT_LEN, 24);
/// // `count` is the top 16 bits of word 0, the top half of its 32-bit lane 0.
/// const COUNT: Field = SlotLayout::COUNT;
/// assert_eq!((COUNT.word(), COUNT.shift(), COUNT.mask()), (0, 48, 0xFFFF << 48));
/// assert_eq!((COUNT.lane(), COUNT.lane_shift()), (0, 16));
/// // Bit 70 of the `seen` set: bit 6 of element 1, which is word 2.
/// let bit = SlotLayout::SEEN.bit(70);
/// assert_eq!((bit.word(), bit.mask()), (2, 1 << 6));
/// ```
///
/// After `new_checked` no getter or setter of a scalar field panics. A view made with `new_unchecked` over
/// a buffer shorter than `LEN` panics when a field beyond the buffer's end is accessed.
#[macro_export]
macro_rules! header {
    // Internal: unnamed padding.
    (@norm $meta:tt $name:ident; offset: ($off:expr); fields: [$($done:tt)*];
        arrays: [$($adone:tt)*]; $(#[$fm:meta])* _ : $w:tt $(, $($rest:tt)*)?
    ) => {
        $crate::header!(@norm $meta $name; offset: ($off + $w); fields: [$($done)*];
            arrays: [$($adone)*]; $($($rest)*)?);
    };
    // Internal: an array field, `name: [width; len]`.
    (@norm $meta:tt $name:ident; offset: ($off:expr); fields: [$($done:tt)*];
        arrays: [$($adone:tt)*]; $(#[$fm:meta])* $f:ident : [$w:tt ; $n:tt] $(, $($rest:tt)*)?
    ) => {
        $crate::header!(@norm $meta $name; offset: ($off + $w * $n); fields: [$($done)*];
            arrays: [$($adone)* { [$(#[$fm])*] $f; ($off); ($w); ($n) }];
            $($($rest)*)?);
    };
    // Internal: a named field.
    (@norm $meta:tt $name:ident; offset: ($off:expr); fields: [$($done:tt)*];
        arrays: [$($adone:tt)*]; $(#[$fm:meta])* $f:ident : $w:tt $(, $($rest:tt)*)?
    ) => {
        $crate::header!(@norm $meta $name; offset: ($off + $w);
            fields: [$($done)* { [$(#[$fm])*] $f; ($off); ($w) }];
            arrays: [$($adone)*]; $($($rest)*)?);
    };
    // Internal: all fields seen.
    (@norm $meta:tt $name:ident; offset: ($off:expr); fields: [$($done:tt)*];
        arrays: [$($adone:tt)*];) => {
        $crate::header!(@emit $meta $name; ($off); [$($done)*]; [$($adone)*]);
    };
    // Internal: generate the view.
    (@emit [[$(#[$attr:meta])*] [$vis:vis]] $name:ident; ($bits:expr);
        [$({ [$(#[$fm:meta])*] $f:ident; ($off:expr); ($w:tt) })*];
        [$({ [$(#[$am:meta])*] $a:ident; ($aoff:expr); ($aw:tt); ($an:tt) })*]
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis struct $name<T: ::core::convert::AsRef<[u8]> = &'static [u8]> {
            buffer: T,
        }

        $crate::wire::__private::paste::paste! {
            #[doc = ::core::concat!(
                "Bytes in a [`", ::core::stringify!($name), "`] header (its `LEN`, without ",
                "naming the buffer type)."
            )]
            #[allow(dead_code)]
            $vis const [<$name:snake:upper _LEN>]: usize = <$name>::LEN;
        }

        $crate::wire::__private::paste::paste! {
            #[doc = ::core::concat!(
                "Where each field of [`", ::core::stringify!($name), "`] lies in the record, ",
                "as a [`Field`](", ::core::stringify!($crate), "::wire::Field) named like the ",
                "field in capitals: for read-modify-write XTXNs on a record in shared memory."
            )]
            #[derive(Debug, Clone, Copy)]
            #[allow(dead_code)]
            $vis struct [<$name Layout>];

            // Where each field lies, for RMW XTXNs on a record in shared memory.
            #[allow(dead_code, clippy::identity_op, clippy::erasing_op)]
            impl [<$name Layout>] {
                $(
                    #[doc = ::core::concat!(
                        "Where field `", ::core::stringify!($f), "` lies (see ",
                        "[`Field`](", ::core::stringify!($crate), "::wire::Field))."
                    )]
                    pub const [<$f:upper>]: $crate::wire::Field =
                        $crate::wire::Field::new($off, $w);
                )*
                $(
                    #[doc = ::core::concat!(
                        "Where array field `", ::core::stringify!($a), "` lies (see ",
                        "[`FieldArray`](", ::core::stringify!($crate), "::wire::FieldArray))."
                    )]
                    pub const [<$a:upper>]: $crate::wire::FieldArray =
                        $crate::wire::FieldArray::new($aoff, $aw, $an);
                )*
            }
        }

        impl $crate::wire::Header for $name {
            const LEN: usize = <$name>::LEN;
            type View<'a> = $name<&'a [u8]>;
            type ViewMut<'a> = $name<&'a mut [u8]>;

            #[inline]
            fn view(buf: &[u8]) -> ::core::result::Result<$name<&[u8]>, $crate::wire::WireError> {
                $name::new_checked(buf)
            }

            #[inline]
            fn view_mut(
                buf: &mut [u8],
            ) -> ::core::result::Result<$name<&mut [u8]>, $crate::wire::WireError> {
                $name::new_checked(buf)
            }
        }

        const _: () = ::core::assert!(
            <$name<&'static [u8]>>::BITS % 8 == 0,
            ::core::concat!(
                "header `",
                ::core::stringify!($name),
                "`: field widths must add up to a whole number of bytes"
            )
        );

        // A header declares every field; a private view need not use them all.
        #[allow(
            dead_code,
            clippy::identity_op,
            clippy::erasing_op,
            clippy::len_without_is_empty
        )]
        impl<T: ::core::convert::AsRef<[u8]>> $name<T> {
            /// Header length in bits (all fields, padding included).
            pub const BITS: usize = $bits;

            /// Header length in bytes.
            pub const LEN: usize = Self::BITS / 8;

            /// The named fields as `(name, bit offset, width in bits)`, in order.
            pub const FIELDS: &'static [(&'static str, usize, usize)] = &[
                $(($crate::wire::__private::strip_raw(::core::stringify!($f)), $off, $w)),*
            ];

            /// Wraps `buffer` without checking its length: accessing a field that lies
            /// beyond the end of a short buffer panics.
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps `buffer` after checking that it holds at least `LEN` bytes; after
            /// this no accessor panics.
            #[inline]
            pub fn new_checked(buffer: T) -> ::core::result::Result<Self, $crate::wire::WireError> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                ::core::result::Result::Ok(view)
            }

            /// Fails with `WireError::Truncated` if
            /// the buffer is shorter than `LEN` bytes.
            #[inline]
            pub fn check_len(&self) -> ::core::result::Result<(), $crate::wire::WireError> {
                let have = self.buffer.as_ref().len();
                if have < Self::LEN {
                    ::core::result::Result::Err($crate::wire::WireError::Truncated {
                        header: ::core::stringify!($name),
                        need: Self::LEN,
                        have,
                    })
                } else {
                    ::core::result::Result::Ok(())
                }
            }

            /// The underlying buffer.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's bytes (the first `LEN` bytes of the buffer).
            #[inline]
            pub fn as_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..Self::LEN]
            }

            /// The bytes following the fixed `LEN`-byte header.
            #[inline]
            pub fn rest(&self) -> &[u8] {
                &self.buffer.as_ref()[Self::LEN..]
            }

            $(
                $(#[$fm])*
                #[doc = ""]
                #[doc = ::core::concat!(
                    "Reads field `", ::core::stringify!($f), "` (", ::core::stringify!($w),
                    " bits)."
                )]
                #[inline]
                pub fn $f(&self) -> $crate::__header_field_type!($w) {
                    <$crate::__header_field_type!($w) as $crate::wire::__private::FieldValue>::read(
                        self.buffer.as_ref(),
                        $off,
                        $w,
                    )
                }
            )*

            $(
                $(#[$am])*
                #[doc = ""]
                #[doc = ::core::concat!(
                    "Reads element `i` of array field `", ::core::stringify!($a), "` (",
                    ::core::stringify!($an), " elements of ", ::core::stringify!($aw),
                    " bits).\n\n# Panics\nIf `i` is not below ", ::core::stringify!($an), "."
                )]
                #[inline]
                pub fn $a(&self, i: usize) -> $crate::__header_field_type!($aw) {
                    ::core::assert!(i < $an, "array field index out of range");
                    <$crate::__header_field_type!($aw) as $crate::wire::__private::FieldValue>::read(
                        self.buffer.as_ref(),
                        $aoff + i * $aw,
                        $aw,
                    )
                }
            )*
        }

        // A header declares every field; a private view need not use them all.
        #[allow(
            dead_code,
            clippy::identity_op,
            clippy::erasing_op,
            clippy::len_without_is_empty
        )]
        impl<T: ::core::convert::AsRef<[u8]> + ::core::convert::AsMut<[u8]>> $name<T> {
            /// The header's bytes, mutably (the first `LEN` bytes of the buffer).
            #[inline]
            pub fn as_bytes_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[..Self::LEN]
            }

            /// The bytes following the fixed `LEN`-byte header, mutably.
            #[inline]
            pub fn rest_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[Self::LEN..]
            }

            $crate::wire::__private::paste::paste! {$(
                $(#[$fm])*
                #[doc = ""]
                #[doc = ::core::concat!(
                    "Writes field `", ::core::stringify!($f), "` (", ::core::stringify!($w),
                    " bits); bits of `value` beyond the width are dropped, as the hardware ",
                    "truncates."
                )]
                #[inline]
                pub fn [<set_ $f>](
                    &mut self,
                    value: $crate::__header_field_type!($w),
                ) {
                    $crate::wire::__private::FieldValue::write(value, self.buffer.as_mut(), $off, $w)
                }
            )*
            $(
                $(#[$am])*
                #[doc = ""]
                #[doc = ::core::concat!(
                    "Writes element `i` of array field `", ::core::stringify!($a), "`; bits ",
                    "beyond the width are dropped.\n\n# Panics\nIf `i` is not below ",
                    ::core::stringify!($an), "."
                )]
                #[inline]
                pub fn [<set_ $a>](
                    &mut self,
                    i: usize,
                    value: $crate::__header_field_type!($aw),
                ) {
                    ::core::assert!(i < $an, "array field index out of range");
                    $crate::wire::__private::FieldValue::write(
                        value,
                        self.buffer.as_mut(),
                        $aoff + i * $aw,
                        $aw,
                    )
                }
            )*}
        }
    };
    // Entry point.
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident {
            $($body:tt)*
        }
    ) => {
        $crate::header!(@norm [[$(#[$attr])*] [$vis]] $name; offset: (0usize); fields: [];
            arrays: []; $($body)*);
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn typed_getters_give_the_field_and_refuse_a_wider_one() {
        let w = 0xABCD_EF01_2345_6789u64;
        // Bits 8..24 of the word from its top: 0xCDEF.
        assert_eq!(Field::new(8, 16).get_u16(w), 0xCDEF);
        assert_eq!(Field::new(8, 8).get_u8(w), 0xCD);
        assert_eq!(Field::new(32, 32).get_u32(w), 0x2345_6789);
        assert_eq!(Field::new(60, 4).get_u8(w), 0x9);
        let wide = Field::new(0, 9);
        assert!(std::panic::catch_unwind(|| wide.get_u8(w)).is_err());
        assert!(std::panic::catch_unwind(|| Field::new(0, 17).get_u16(w)).is_err());
        assert!(std::panic::catch_unwind(|| Field::new(0, 33).get_u32(w)).is_err());
        // Across two words: the low 16 bits of the first, the top 16 of the next.
        let across = Field::new(64 + 48, 32);
        assert_eq!(across.first_word(), 1);
        assert_eq!(across.get_across(w, 0x1122_3344_5566_7788), 0x6789_1122);
        // A field in one word reads the same either way.
        assert_eq!(Field::new(8, 16).get_across(w, !0), 0xCDEF);
        assert_eq!(Field::new(0, 64).get_across(w, 0), w);
    }

    proptest! {
        #[test]
        fn get_across_agrees_with_the_bytes(
            words in any::<[u64; 2]>(), bit in 0usize..64, width in 1usize..=64,
        ) {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            let f = Field::new(bit, width);
            prop_assert_eq!(f.get_across(words[0], words[1]), get_bits64(&bytes, bit, width));
        }
    }

    crate::header! {
        /// The paper's `trio_ml_hdr_t` (12 bytes).
        struct TrioMlHdr {
            job_id: 8,
            block_id: 32,
            age_op: 4,
            r#final: 1,
            degraded: 1,
            /// unused
            _: 2,
            src_id: 8,
            src_cnt: 8,
            gen_id: 16,
            _: 4,
            grad_cnt: 12,
        }
    }

    // job_id   = 0x12        bits   0..8    -> byte 0 = 0x12
    // block_id = 0x3456789A  bits   8..40   -> bytes 1..5 = 34 56 78 9A
    // byte 5 = age_op(4) | final(1) | degraded(1) | pad(2)
    //        = 1011 | 1 | 0 | 00 = 0b1011_1000 = 0xB8
    // src_id   = 0xCD        bits  48..56   -> byte 6 = 0xCD
    // src_cnt  = 0x05        bits  56..64   -> byte 7 = 0x05
    // gen_id   = 0xBEEF      bits  64..80   -> bytes 8..10 = BE EF
    // bytes 10..12 = pad(4) | grad_cnt(12) = 0000 | 0001 0010 0011 = 0x01 0x23
    static ML_BYTES: [u8; 12] = [
        0x12, 0x34, 0x56, 0x78, 0x9A, 0xB8, 0xCD, 0x05, 0xBE, 0xEF, 0x01, 0x23,
    ];

    crate::header! {
        /// A record with an array field straddling words, like Trio-ML's source masks.
        struct Rec {
            count: 16,
            lane_lo: 8,
            _: 8,
            low: 32,
            flags: [1; 3],
            _: 5,
            masks: [64; 2],
            tail: 8,
        }
    }

    /// Writes a distinct pattern to `field` through `set_bits64` and checks that the view's
    /// getter agreed (done by the caller) and that `Field` finds the same value in the
    /// record's big-endian words.
    fn check_field_in_words(buf: &[u8], field: Field, value: u64) {
        if !field.in_one_word() {
            return;
        }
        let w = field.word() as usize;
        let mut word = [0u8; 8];
        let have = buf.len().saturating_sub(w * 8).min(8);
        word[..have].copy_from_slice(&buf[w * 8..w * 8 + have]);
        assert_eq!(field.get(u64::from_be_bytes(word)), value, "{field:?}");
        assert_eq!(field.place(value) >> field.shift(), value);
    }

    #[test]
    fn layout_constants_agree_with_the_view_for_every_field() {
        assert_eq!(RecLayout::COUNT, Field::new(0, 16));
        assert_eq!(TrioMlHdrLayout::FINAL, Field::new(44, 1));
        let fields = [
            ("count", RecLayout::COUNT),
            ("lane_lo", RecLayout::LANE_LO),
            ("low", RecLayout::LOW),
            ("tail", RecLayout::TAIL),
        ];
        for (name, f) in fields {
            let (_, off, w) = *Rec::<&[u8]>::FIELDS
                .iter()
                .find(|(n, _, _)| *n == name)
                .unwrap();
            assert_eq!((f.bit, f.width), (off, w), "{name}");
        }
        let mut buf = [0u8; <Rec>::LEN + 8];
        let mut r = Rec::new_checked(&mut buf[..]).unwrap();
        r.set_count(0xBEEF);
        r.set_lane_lo(0x5A);
        r.set_low(0xDEAD_BEEF);
        r.set_flags(1, true);
        r.set_masks(0, 0x0123_4567_89AB_CDEF);
        r.set_masks(1, 0xFEDC_BA98_7654_3210);
        r.set_tail(0x77);
        let r = Rec::new_checked(&buf[..]).unwrap();
        assert_eq!((r.flags(0), r.flags(1), r.flags(2)), (false, true, false));
        assert_eq!(r.masks(1), 0xFEDC_BA98_7654_3210);
        check_field_in_words(&buf, RecLayout::COUNT, 0xBEEF);
        check_field_in_words(&buf, RecLayout::LANE_LO, 0x5A);
        check_field_in_words(&buf, RecLayout::LOW, 0xDEAD_BEEF);
        check_field_in_words(&buf, RecLayout::FLAGS.at(1), 1);
        check_field_in_words(&buf, RecLayout::TAIL, 0x77);
        // Every bit of the masks, one at a time, through the array's bit numbering.
        let masks = [0x0123_4567_89AB_CDEF_u64, 0xFEDC_BA98_7654_3210];
        for i in 0..128 {
            let want = masks[i / 64] >> (i % 64) & 1;
            check_field_in_words(&buf, RecLayout::MASKS.bit(i), want);
            let f = RecLayout::MASKS.bit(i);
            assert_eq!(get_bits64(&buf, f.bit, 1), want, "bit {i}");
        }
        // Lanes for 32-bit adds: `count` is the top of lane 0, `low` all of lane 1.
        assert_eq!(
            (RecLayout::COUNT.lane(), RecLayout::COUNT.lane_shift()),
            (0, 16)
        );
        assert_eq!((RecLayout::LOW.lane(), RecLayout::LOW.lane_shift()), (1, 0));
        assert_eq!(RecLayout::LOW.mask(), 0xFFFF_FFFF);
        assert_eq!(RecLayout::TAIL.byte(), 8 + 16 + 1);
        assert!(!RecLayout::MASKS.at(0).in_one_word());
    }

    #[test]
    #[should_panic(expected = "array field index out of range")]
    fn array_index_past_the_end_panics() {
        let buf = [0u8; <Rec>::LEN];
        let _ = Rec::new_checked(&buf[..]).unwrap().masks(2);
    }

    #[test]
    fn named_lengths_and_header_views() {
        assert_eq!(REC_LEN, <Rec>::LEN);
        assert_eq!(TRIO_ML_HDR_LEN, 12);
        assert_eq!(<TrioMlHdr as crate::wire::Header>::LEN, 12);
        let v = <TrioMlHdr as crate::wire::Header>::view(&ML_BYTES[..]).unwrap();
        assert_eq!(v.grad_cnt(), 0x123);
        assert!(<TrioMlHdr as crate::wire::Header>::view(&ML_BYTES[..11]).is_err());
    }

    #[test]
    fn ml_hdr_layout() {
        assert_eq!(TrioMlHdr::<&[u8]>::LEN, 12);
        assert_eq!(TrioMlHdr::<&[u8]>::BITS, 96);
        assert_eq!(
            TrioMlHdr::<&[u8]>::FIELDS,
            &[
                ("job_id", 0, 8),
                ("block_id", 8, 32),
                ("age_op", 40, 4),
                ("final", 44, 1),
                ("degraded", 45, 1),
                ("src_id", 48, 8),
                ("src_cnt", 56, 8),
                ("gen_id", 64, 16),
                ("grad_cnt", 84, 12),
            ]
        );
    }

    #[test]
    fn ml_hdr_deconstruct() {
        let h = TrioMlHdr::new_checked(&ML_BYTES[..]).unwrap();
        assert_eq!(h.job_id(), 0x12u8);
        assert_eq!(h.block_id(), 0x3456_789Au32);
        assert_eq!(h.age_op(), 0xBu8);
        assert!(h.r#final());
        assert!(!h.degraded());
        assert_eq!(h.src_id(), 0xCDu8);
        assert_eq!(h.src_cnt(), 0x05u8);
        assert_eq!(h.gen_id(), 0xBEEFu16);
        assert_eq!(h.grad_cnt(), 0x123u16);
        assert_eq!(h.as_bytes(), &ML_BYTES[..]);
        assert!(h.rest().is_empty());
    }

    #[test]
    fn ml_hdr_construct() {
        let mut buf = [0u8; 12];
        let mut h = TrioMlHdr::new_unchecked(&mut buf[..]);
        h.set_job_id(0x12);
        h.set_block_id(0x3456_789A);
        h.set_age_op(0xB);
        h.set_final(true);
        h.set_degraded(false);
        h.set_src_id(0xCD);
        h.set_src_cnt(0x05);
        h.set_gen_id(0xBEEF);
        h.set_grad_cnt(0x123);
        assert_eq!(buf, ML_BYTES);
    }

    #[test]
    fn setters_mask_and_keep_padding() {
        let mut buf = [0xFFu8; 12];
        let mut h = TrioMlHdr::new_checked(&mut buf[..]).unwrap();
        // age_op is 4 bits wide: the high nibble of 0xF3 is dropped.
        h.set_age_op(0xF3);
        assert_eq!(h.age_op(), 0x3);
        // grad_cnt is 12 bits wide.
        h.set_grad_cnt(0xFABC);
        assert_eq!(h.grad_cnt(), 0xABC);
        h.set_degraded(false);
        // Padding bits and neighbours are untouched.
        assert_eq!(buf[5], 0b0011_1011);
        assert_eq!(&buf[10..12], &[0xFA, 0xBC]);
        assert_eq!(buf[4], 0xFF);
        assert_eq!(buf[6], 0xFF);
    }

    #[test]
    fn new_checked_rejects_short_buffer() {
        let err = TrioMlHdr::new_checked(&ML_BYTES[..11]).unwrap_err();
        assert_eq!(
            err,
            crate::wire::WireError::Truncated {
                header: "TrioMlHdr",
                need: 12,
                have: 11
            }
        );
        assert!(TrioMlHdr::new_checked(&[][..]).is_err());
        // A longer buffer is fine and the extra bytes are `rest`.
        let long = [0u8; 20];
        let h = TrioMlHdr::new_checked(&long[..]).unwrap();
        assert_eq!(h.rest().len(), 8);
        assert_eq!(h.into_inner().len(), 20);
    }

    #[test]
    #[should_panic]
    fn unchecked_short_buffer_panics_on_access() {
        let h = TrioMlHdr::new_unchecked(&ML_BYTES[..4]);
        let _ = h.gen_id();
    }

    crate::header! {
        /// Odd offsets: fields that straddle byte boundaries.
        struct Odd {
            a: 3,
            b: 11,
            c: 7,
            d: 33,
            e: 64,
            f: 1,
            _: 1,
            wide: 120,
            g: 16,
        }
    }

    #[test]
    fn straddling_fields() {
        assert_eq!(Odd::<&[u8]>::BITS, 256);
        let mut buf = [0u8; 32];
        let mut o = Odd::new_checked(&mut buf[..]).unwrap();
        o.set_a(0b101);
        o.set_b(0x5A5);
        o.set_c(0x7F);
        o.set_d(0x1_2345_6789);
        o.set_e(0xDEAD_BEEF_0123_4567);
        o.set_f(true);
        o.set_wide(0x00AB_CDEF_0123_4567_89AB_CDEF_0123_4567);
        o.set_g(0xC0DE);
        let d: u64 = o.d();
        let wide: u128 = o.wide();
        assert_eq!(o.a(), 0b101u8);
        assert_eq!(o.b(), 0x5A5u16);
        assert_eq!(o.c(), 0x7Fu8);
        assert_eq!(d, 0x1_2345_6789);
        assert_eq!(o.e(), 0xDEAD_BEEF_0123_4567u64);
        assert!(o.f());
        assert_eq!(wide, 0x00AB_CDEF_0123_4567_89AB_CDEF_0123_4567);
        assert_eq!(o.g(), 0xC0DEu16);
        // a=101, b=101 1010 0101 -> 1011 0110 1001 01.. : byte0 = 1011_0110 = 0xB6,
        // byte1 = 1001_01 then c's first two bits 11 -> 0x97.
        assert_eq!(buf[0], 0xB6);
        assert_eq!(buf[1], 0x97);
        // g is the last 16 bits (byte aligned).
        assert_eq!(&buf[30..], &[0xC0, 0xDE]);
    }

    crate::header! {
        /// Widths given as constant expressions.
        pub(crate) struct Exprs {
            a: (2 * 4),
            _: (3 + 5),
            b: { 16 },
        }
    }

    #[test]
    fn expression_widths() {
        assert_eq!(Exprs::<&[u8]>::LEN, 4);
        assert_eq!(Exprs::<&[u8]>::FIELDS, &[("a", 0, 8), ("b", 16, 16)]);
        let bytes = [0xAB, 0xFF, 0x12, 0x34];
        let e = Exprs::new_checked(&bytes[..]).unwrap();
        let a: u8 = e.a();
        let b: u16 = e.b();
        assert_eq!((a, b), (0xAB, 0x1234));
    }

    #[test]
    fn aligned_fast_paths() {
        let buf = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09];
        assert_eq!(get_bits64(&buf, 8, 8), 0x02);
        assert_eq!(get_bits64(&buf, 8, 16), 0x0203);
        assert_eq!(get_bits64(&buf, 8, 32), 0x0203_0405);
        assert_eq!(get_bits64(&buf, 8, 64), 0x0203_0405_0607_0809);
        // 64 bits at bit offset 4 spans 9 bytes.
        assert_eq!(get_bits64(&buf, 4, 64), 0x1020_3040_5060_7080);
        assert_eq!(get_bits(&buf, 4, 64), 0x1020_3040_5060_7080);
        assert_eq!(get_bits(&buf, 0, 72), 0x01_0203_0405_0607_0809);
        assert_eq!(get_bits(&buf, 3, 0), 0);
    }

    #[test]
    fn strip_raw_names() {
        assert_eq!(strip_raw("r#final"), "final");
        assert_eq!(strip_raw("rx"), "rx");
        assert_eq!(strip_raw("r#"), "r#");
    }

    fn field_mask(len: usize, off: usize, width: usize) -> Vec<bool> {
        (0..len * 8).map(|b| b >= off && b < off + width).collect()
    }

    fn bit(buf: &[u8], b: usize) -> bool {
        buf[b / 8] & (0x80 >> (b % 8)) != 0
    }

    proptest! {
        #[test]
        fn set_get_bits64_roundtrip(
            init in proptest::collection::vec(any::<u8>(), 24),
            off in 0usize..120,
            width in 1usize..=64,
            value in any::<u64>(),
        ) {
            let mut buf = init.clone();
            set_bits64(&mut buf, off, width, value);
            let expect = value & mask64(width);
            prop_assert_eq!(get_bits64(&buf, off, width), expect);
            prop_assert_eq!(get_bits(&buf, off, width), u128::from(expect));
            let inside = field_mask(buf.len(), off, width);
            for (b, &is_field) in inside.iter().enumerate() {
                if !is_field {
                    prop_assert_eq!(bit(&buf, b), bit(&init, b), "bit {} changed", b);
                }
            }
            // The general setter writes the same bits.
            let mut slow = init.clone();
            set_bits(&mut slow, off, width, u128::from(value));
            prop_assert_eq!(slow, buf);
        }

        /// A field read bit by bit, wherever it sits: at the buffer's end (read byte by
        /// byte) as well as with 8 bytes to spare from its first byte (one 8-byte load).
        #[test]
        fn get_bits64_reads_the_fields_bits(
            buf in proptest::collection::vec(any::<u8>(), 1..24),
            width in 1usize..=64,
            from_end in 0usize..80,
        ) {
            let bits = buf.len() * 8;
            prop_assume!(width + from_end <= bits);
            let off = bits - width - from_end;
            let want = (off..off + width).fold(0u64, |acc, b| acc << 1 | u64::from(bit(&buf, b)));
            prop_assert_eq!(get_bits64(&buf, off, width), want);
        }

        #[test]
        fn set_get_bits_roundtrip(
            init in proptest::collection::vec(any::<u8>(), 24),
            off in 0usize..64,
            width in 0usize..=128,
            value in any::<u128>(),
        ) {
            let mut buf = init.clone();
            set_bits(&mut buf, off, width, value);
            prop_assert_eq!(get_bits(&buf, off, width), value & mask128(width));
            let inside = field_mask(buf.len(), off, width);
            for (b, &is_field) in inside.iter().enumerate() {
                if !is_field {
                    prop_assert_eq!(bit(&buf, b), bit(&init, b), "bit {} changed", b);
                }
            }
        }
    }
}
