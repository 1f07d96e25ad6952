//! Packets as the outside world sees them, and where a program sends them.
//!
//! Inside the engine a packet is split at ingress into a *head* (the first
//! [`DEFAULT_HEAD_BYTES`] bytes, configurable), which is loaded into a PPE thread's local
//! memory, and a *tail*, which stays in the packet buffer of its batch until egress rejoins
//! the two. Users never see that split: they inject whole frames and receive whole frames.

/// An ingress or egress port number.
pub type Port = u16;

/// A multicast group number, configured with [`crate::PfeBuilder::multicast_group`].
pub type GroupId = u16;

/// Bytes of a packet that ingress hands to a PPE thread as the head (the paper: "typically
/// around 200 bytes"; Trio-ML's packet format assumes 192).
pub const DEFAULT_HEAD_BYTES: usize = 192;

/// Frames shorter than this are dropped at ingress as `runt` (an Ethernet header).
pub const MIN_FRAME_BYTES: usize = 14;

/// An owned frame with the port it arrived on or leaves by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Ingress port (when injected) or egress port (when delivered).
    pub port: Port,
    /// The whole frame, starting with the Ethernet header.
    pub data: Vec<u8>,
}

impl Packet {
    /// A frame arriving on `port`.
    pub fn new(port: Port, data: impl Into<Vec<u8>>) -> Self {
        Packet {
            port,
            data: data.into(),
        }
    }
}

/// Where an output packet goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dest {
    /// One egress port.
    Port(Port),
    /// Every port of a multicast group; egress makes one copy per member port.
    Group(GroupId),
}

/// Which buffer of a batch an output packet's bytes are in.
pub(crate) const SRC_FRAMES: u32 = 0;
/// The batch's output arena.
pub(crate) const SRC_OUT: u32 = 1;

/// One output packet of a batch: where it goes and which bytes it is. Packets whose head
/// kept its size are unloaded back in place in the packet buffer (`SRC_FRAMES`), so their
/// tail is never copied; rewritten or created packets live in the output arena (`SRC_OUT`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutRec {
    pub dest: Dest,
    pub src: u32,
    pub off: u32,
    pub len: u32,
}

/// Output packets written by PPE threads, back to back in one buffer that is reused from
/// batch to batch (no allocation per packet).
#[derive(Default, Debug)]
pub(crate) struct OutArena {
    pub bytes: Vec<u8>,
    pub recs: Vec<OutRec>,
}

impl OutArena {
    /// Appends one packet made of `parts` concatenated.
    #[inline]
    pub fn push(&mut self, dest: Dest, parts: &[&[u8]]) {
        let off = self.bytes.len();
        for p in parts {
            self.bytes.extend_from_slice(p);
        }
        self.recs.push(OutRec {
            dest,
            src: SRC_OUT,
            off: off as u32,
            len: (self.bytes.len() - off) as u32,
        });
    }

    /// Records a packet whose bytes are in the batch's packet buffer.
    #[inline]
    pub fn push_in_place(&mut self, dest: Dest, off: u32, len: u32) {
        self.recs.push(OutRec {
            dest,
            src: SRC_FRAMES,
            off,
            len,
        });
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.recs.clear();
    }
}
