//! Packet headers as zero-copy views over byte buffers.
//!
//! Headers are declared with the [`header!`](crate::header) macro from a Microcode-style
//! bit-field description (see the macro for the generated API). In the
//! style of smoltcp's `wire` module, a view is made with `new_checked` (which validates the
//! buffer length once, after which no accessor panics) or `new_unchecked`; getters need
//! `T: AsRef<[u8]>` and setters `T: AsMut<[u8]>`.
//!
//! The macro also gives each header a length constant (`ETHER_LEN`), a [`Header`]
//! implementation (so a program views its head with `t.view::<Ipv4>(ETHER_LEN)?`) and a
//! `NameLayout` of [`Field`]s: where each field of a record in shared memory lies, for
//! read-modify-write XTXNs, from the same description as the view.
//!
//! Provided headers: [`Ether`], [`Ipv4`], [`Udp`], [`Tcp`], plus the Internet checksum
//! helpers [`checksum`] and [`checksum_update16`]; [`lanes`] moves arrays of 32-bit lanes
//! to and from network byte order in bulk.

use std::fmt;

mod checksum;
mod ethernet;
mod header;
mod ipv4;
pub mod lanes;
mod tcp;
mod udp;

pub use checksum::{checksum, checksum_update16};
pub use ethernet::{
    Ether, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN, ETHER_LEN,
};
pub use header::{Field, FieldArray};
pub use ipv4::{Ipv4, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, IPV4_LEN};
pub use tcp::{
    Tcp, TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_LEN, TCP_NS, TCP_PSH, TCP_RST, TCP_SYN, TCP_URG,
};
pub use udp::{Udp, UDP_LEN};

/// What the [`header!`](crate::header) macro expands to: the bit-field helpers and `paste`
/// (for setter and constant names). Not part of the API; only the macro names them.
#[doc(hidden)]
pub mod __private {
    pub use super::header::{
        get_bits, get_bits64, set_bits, set_bits64, strip_raw, width, FieldValue, FieldWidth, Width,
    };
    pub use ::paste;
}

/// A header declared with [`header!`](crate::header), named without its buffer type: what
/// [`Thread::view`](crate::program::Thread::view) takes (`t.view::<Ipv4>(ETHER_LEN)?`).
pub trait Header {
    /// Bytes in the header.
    const LEN: usize;
    /// The read-only view over a borrowed buffer.
    type View<'a>;
    /// The writable view over a borrowed buffer.
    type ViewMut<'a>;
    /// Views the front of `buf`; fails with [`WireError::Truncated`] if it is shorter than
    /// [`Header::LEN`].
    fn view(buf: &[u8]) -> Result<Self::View<'_>, WireError>;
    /// Views the front of `buf` writably, checked like [`Header::view`].
    fn view_mut(buf: &mut [u8]) -> Result<Self::ViewMut<'_>, WireError>;
}

/// Why a buffer could not be viewed as a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the header.
    Truncated {
        /// The header type (e.g. `"Ipv4"`).
        header: &'static str,
        /// Bytes the header needs.
        need: usize,
        /// Bytes the buffer holds.
        have: usize,
    },
    /// The buffer is long enough but a field holds an impossible value.
    Malformed {
        /// The header type (e.g. `"Ipv4"`).
        header: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated { header, need, have } => {
                write!(
                    f,
                    "truncated {header} header: need {need} bytes, have {have}"
                )
            }
            WireError::Malformed { header, reason } => {
                write!(f, "malformed {header} header: {reason}")
            }
        }
    }
}

impl std::error::Error for WireError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_error_display() {
        let t = WireError::Truncated {
            header: "Ipv4",
            need: 20,
            have: 3,
        };
        assert_eq!(
            t.to_string(),
            "truncated Ipv4 header: need 20 bytes, have 3"
        );
        let m = WireError::Malformed {
            header: "Ipv4",
            reason: "version is not 4",
        };
        assert_eq!(m.to_string(), "malformed Ipv4 header: version is not 4");
        let _: &dyn std::error::Error = &m;
    }
}
