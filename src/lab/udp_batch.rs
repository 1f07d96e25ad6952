//! Batched UDP for the front end ([`serve`](super::serve)): many datagrams per system call,
//! and UDP segmentation offload where the kernel has it.
//!
//! - **Receiving.** [`RecvBatch::recv`] takes up to its capacity of messages with one
//!   `recvmmsg`: it waits for the first (the socket's read timeout applies) and takes the
//!   ones already queued behind it (`MSG_WAITFORONE`). With GRO on ([`enable_gro`]) the
//!   kernel may hand several datagrams of one sender over as one message, with their size in
//!   a `UDP_GRO` control message; [`RecvBatch::datagrams`] cuts them apart again, so callers
//!   see the datagrams exactly as they were sent. With drop counting on
//!   ([`enable_drop_count`], `SO_RXQ_OVFL`) each message carries the socket's count of
//!   datagrams the kernel dropped so far (its receive buffer was full), which
//!   [`RecvBatch::kernel_dropped`] keeps; [`socket_drops`] reads the count now
//!   (`SO_MEMINFO`), drops after the last message received included.
//! - **Sending.** A [`SendBatch`] collects datagrams, each for a destination (or for the
//!   socket's connected peer), and [`SendBatch::send`] sends them with `sendmmsg`. With GSO
//!   on ([`Gso`]) consecutive datagrams for one destination travel as one message with a
//!   `UDP_SEGMENT` control message when they have the same size (the last may be shorter)
//!   and fit one UDP payload: the kernel cuts it into those datagrams, and on loopback hands
//!   it whole to a receiver with GRO on. A send the kernel stops at a message is continued
//!   after it; a message it refuses is counted as failed and the others still go; a GSO
//!   message it refuses (it cannot segment for that route, e.g. datagrams larger than the
//!   path's MTU) is sent again as single datagrams, and GSO is off from then on for that
//!   [`Gso`].
//!
//! Order: a destination's datagrams leave in the order they were pushed; datagrams for
//! different destinations are not ordered with each other.
//!
//! # Unsafe
//!
//! The crate denies `unsafe`; this module allows it for the system calls alone (`recvmmsg`,
//! `sendmmsg`, `setsockopt`, `getsockopt`) and the `CMSG_*` accessors of their control
//! messages, each block with its `SAFETY` argument. The headers those calls read are built
//! in the same function from buffers that outlive the call. Not `nix`: its `MultiHeaders`
//! does not reset `msg_controllen` between `recvmmsg` calls (after a message without a GRO
//! control message, the next one's segment size is lost), and its `sendmmsg` gives every
//! message the same control messages. Miri cannot run system calls, so the tests of this
//! module are skipped under it; they run on loopback sockets.
//!
//! Elsewhere than Linux the same API sends and receives one datagram per call through
//! `std`, without offload.

#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};

/// Largest UDP payload over IPv4 (65535 less the IPv4 and UDP headers): a GSO message and a
/// GRO message are at most this long.
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// Most datagrams in one GSO message: the kernel's `UDP_MAX_SEGMENTS` before Linux 6.15
/// (later kernels take 128).
pub const MAX_GSO_SEGMENTS: usize = 64;

/// Bytes of a receive buffer per message: a GRO message or any UDP datagram fits.
const RECV_SLOT: usize = 1 << 16;

/// Messages per `sendmmsg` at most (the kernel's `UIO_MAXIOV` caps `vlen`).
const MAX_MESSAGES_PER_CALL: usize = 1024;

/// Turns GRO on for `socket`: the kernel may then deliver several datagrams of one sender
/// as one message ([`RecvBatch`] cuts them apart). `false` when the kernel does not have it
/// (before Linux 5.0, or not Linux).
pub fn enable_gro(socket: &UdpSocket) -> bool {
    sys::set_udp_option(socket, sys::UDP_GRO, 1).is_ok()
}

/// Turns on the kernel's drop count for `socket` (`SO_RXQ_OVFL`): every message received
/// from then on carries the number of datagrams the kernel dropped on the socket so far
/// because its receive buffer was full ([`RecvBatch::kernel_dropped`]). `false` when the
/// kernel does not have it (not Linux).
pub fn enable_drop_count(socket: &UdpSocket) -> bool {
    sys::set_socket_option(socket, sys::SO_RXQ_OVFL, 1).is_ok()
}

/// The datagrams the kernel has dropped on `socket` so far, now (`SO_MEMINFO`, Linux 4.6
/// and later; `None` without it): as [`RecvBatch::kernel_dropped`] counts them, and also
/// those dropped after the last message received. The kernel counts in 32 bits: the count
/// wraps at 2^32.
pub fn socket_drops(socket: &UdpSocket) -> Option<u32> {
    sys::socket_drops(socket)
}

/// Whether a socket's sends use GSO: asked for and found in the kernel when made, and
/// turned off for good the first time the kernel refuses a GSO message. Shared by the
/// threads sending on one socket.
#[derive(Debug)]
pub struct Gso(AtomicBool);

impl Gso {
    /// GSO for `socket` if `wanted` and the kernel has it (Linux 4.18 and later).
    pub fn probe(socket: &UdpSocket, wanted: bool) -> Gso {
        Gso(AtomicBool::new(wanted && sys::gso_supported(socket)))
    }

    /// GSO off: one datagram per message.
    pub fn off() -> Gso {
        Gso(AtomicBool::new(false))
    }

    /// GSO is in use.
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The kernel refused a GSO message: no more.
    fn refused(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// One datagram of a [`RecvBatch`].
#[derive(Clone, Copy, Debug)]
pub struct Datagram<'a> {
    /// Its UDP payload.
    pub payload: &'a [u8],
    /// Its sender (`None` if the kernel gave no IPv4 or IPv6 address).
    pub from: Option<SocketAddr>,
    /// It did not fit the buffer and was cut short (the payload is its beginning only).
    pub truncated: bool,
}

/// A received message: one datagram, or with GRO several of one sender.
#[derive(Clone, Copy, Debug, Default)]
struct Message {
    /// Bytes received.
    len: usize,
    from: Option<SocketAddr>,
    /// The size of its datagrams but the last (GRO); `None`: one datagram.
    segment: Option<usize>,
    truncated: bool,
    /// The socket's drop count when the message was queued (`SO_RXQ_OVFL`; the kernel
    /// leaves it out while the count is 0).
    drops: Option<u32>,
}

/// Buffers for receiving many messages with one system call (see the module docs).
pub struct RecvBatch {
    /// `capacity` slots of [`RECV_SLOT`] bytes.
    buf: Vec<u8>,
    /// The messages of the last [`RecvBatch::recv`].
    messages: Vec<Message>,
    capacity: usize,
    /// The last drop count a message carried (the kernel's 32 bits), and the count with
    /// its wraps.
    drops: Option<u32>,
    kernel_dropped: u64,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("capacity", &self.capacity)
            .field("messages", &self.messages.len())
            .field("kernel_dropped", &self.kernel_dropped)
            .finish()
    }
}

impl RecvBatch {
    /// Room for `messages` messages (at least 1) of up to 64 KiB each.
    pub fn new(messages: usize) -> Self {
        let capacity = messages.max(1);
        RecvBatch {
            buf: vec![0u8; capacity * RECV_SLOT],
            messages: Vec::with_capacity(capacity),
            capacity,
            drops: None,
            kernel_dropped: 0,
        }
    }

    /// Datagrams the kernel dropped on the socket because its receive buffer was full, as
    /// of the last message received that said so (drop counting must be on:
    /// [`enable_drop_count`]; 0 otherwise). The kernel gives a count per socket since it was
    /// made, so this is the socket's count when the batch received all that was received on
    /// it. Drops after the last message received show in the next one, or in
    /// [`socket_drops`]. A sender's GSO message that reaches a GRO socket (loopback) is
    /// one buffer to the kernel: dropped whole, it may count once.
    pub fn kernel_dropped(&self) -> u64 {
        self.kernel_dropped
    }

    /// Receives what is queued on `socket`: waits for the first message as a `recv` would
    /// (the socket's read timeout applies: `WouldBlock` or `TimedOut` after it), then takes
    /// the others already there, up to the capacity. Returns the messages received (at
    /// least 1); [`RecvBatch::datagrams`] gives their datagrams.
    pub fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        self.messages.clear();
        let got = sys::recv_batch(socket, &mut self.buf, self.capacity, &mut self.messages)?;
        for m in &self.messages {
            if let Some(now) = m.drops {
                // The kernel's count is cumulative and wraps at 2^32; messages come in the
                // order they were queued, so the count never goes back.
                let since = now.wrapping_sub(self.drops.unwrap_or(0));
                self.kernel_dropped += u64::from(since);
                self.drops = Some(now);
            }
        }
        Ok(got)
    }

    /// The datagrams of the messages the last [`RecvBatch::recv`] took, in order: a GRO
    /// message gives each of its datagrams.
    pub fn datagrams(&self) -> impl Iterator<Item = Datagram<'_>> + '_ {
        self.messages.iter().enumerate().flat_map(move |(i, m)| {
            let bytes = &self.buf[i * RECV_SLOT..i * RECV_SLOT + m.len];
            // A GRO message's datagrams are `segment` bytes each, the last maybe fewer.
            let step = m.segment.filter(|&s| s > 0).unwrap_or(bytes.len().max(1));
            let parts = if bytes.is_empty() {
                1
            } else {
                bytes.len().div_ceil(step)
            };
            (0..parts).map(move |k| Datagram {
                payload: &bytes[(k * step).min(bytes.len())..((k + 1) * step).min(bytes.len())],
                from: m.from,
                truncated: m.truncated,
            })
        })
    }
}

/// Where a datagram of a [`SendBatch`] is: borrowed from the caller, or copied into the
/// batch.
#[derive(Clone, Copy, Debug)]
enum Bytes<'a> {
    Borrowed(&'a [u8]),
    Copied { at: usize, len: usize },
}

/// What [`SendBatch::send`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Datagrams the kernel took.
    pub datagrams: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Datagrams the kernel refused (e.g. an unreachable destination).
    pub failed: u64,
    /// System calls made.
    pub calls: u64,
    /// GSO messages the kernel refused, sent again as single datagrams (GSO is then off).
    pub gso_refused: u64,
}

impl std::ops::AddAssign for SendReport {
    fn add_assign(&mut self, o: SendReport) {
        self.datagrams += o.datagrams;
        self.bytes += o.bytes;
        self.failed += o.failed;
        self.calls += o.calls;
        self.gso_refused += o.gso_refused;
    }
}

/// Datagrams to send together (see the module docs).
#[derive(Debug, Default)]
pub struct SendBatch<'a> {
    /// Destination (`None`: the connected peer) and bytes of each datagram, in push order.
    datagrams: Vec<(Option<SocketAddr>, Bytes<'a>)>,
    /// The bytes of the copied datagrams.
    copies: Vec<u8>,
}

/// A message to send: datagrams `first..first + count` of the grouped order, one
/// destination; `segment` set for a GSO message of more than one datagram.
#[derive(Clone, Copy, Debug)]
struct Planned {
    to: Option<SocketAddr>,
    first: usize,
    count: usize,
    segment: Option<u16>,
}

impl<'a> SendBatch<'a> {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Datagrams in the batch.
    pub fn len(&self) -> usize {
        self.datagrams.len()
    }

    /// No datagram in the batch.
    pub fn is_empty(&self) -> bool {
        self.datagrams.is_empty()
    }

    /// Adds `payload` for `to` (`None`: the peer the socket is connected to).
    pub fn push(&mut self, to: Option<SocketAddr>, payload: &'a [u8]) {
        self.datagrams.push((to, Bytes::Borrowed(payload)));
    }

    /// Adds a copy of `payload` for `to` and returns the copy (to change it in place).
    pub fn push_copy(&mut self, to: Option<SocketAddr>, payload: &[u8]) -> &mut [u8] {
        let at = self.copies.len();
        self.copies.extend_from_slice(payload);
        self.datagrams.push((
            to,
            Bytes::Copied {
                at,
                len: payload.len(),
            },
        ));
        &mut self.copies[at..]
    }

    /// Adds the last datagram pushed again, for `to` (one copy fanned out); `false` on an
    /// empty batch.
    pub fn push_last_again(&mut self, to: Option<SocketAddr>) -> bool {
        let Some(&(_, b)) = self.datagrams.last() else {
            return false;
        };
        self.datagrams.push((to, b));
        true
    }

    fn bytes(&self, b: Bytes<'a>) -> &[u8] {
        match b {
            Bytes::Borrowed(p) => p,
            Bytes::Copied { at, len } => &self.copies[at..at + len],
        }
    }

    /// The datagrams grouped by destination (first seen first, push order within one), and
    /// the messages that carry them: with `gso`, runs of equal-sized datagrams (the last
    /// may be shorter) up to [`MAX_GSO_SEGMENTS`] and [`MAX_UDP_PAYLOAD`] bytes; the
    /// destinations' messages taken in turn.
    fn plan(&self, gso: bool, max_segments: usize) -> (Vec<&[u8]>, Vec<Planned>) {
        let mut dests: Vec<Option<SocketAddr>> = Vec::new();
        for (to, _) in &self.datagrams {
            if !dests.contains(to) {
                dests.push(*to);
            }
        }
        let mut order = Vec::with_capacity(self.datagrams.len());
        let mut per_dest: Vec<Vec<Planned>> = Vec::with_capacity(dests.len());
        for to in dests {
            let mut plan = Vec::new();
            let mut open: Option<Planned> = None;
            for &(d, b) in &self.datagrams {
                if d != to {
                    continue;
                }
                let p = self.bytes(b);
                let i = order.len();
                order.push(p);
                if let Some(m) = open.as_mut() {
                    let seg = order[m.first].len();
                    let last = order[m.first + m.count - 1].len();
                    let fits = gso
                        && seg <= usize::from(u16::MAX)
                        && last == seg
                        && p.len() <= seg
                        && !p.is_empty()
                        && m.count < max_segments
                        && seg * m.count + p.len() <= MAX_UDP_PAYLOAD;
                    if fits {
                        m.count += 1;
                        m.segment = Some(seg as u16);
                        continue;
                    }
                    plan.push(*m);
                }
                open = Some(Planned {
                    to,
                    first: i,
                    count: 1,
                    segment: None,
                });
            }
            plan.extend(open);
            per_dest.push(plan);
        }
        // Each destination's first message, then each one's second, ...: a fan-out reaches
        // every member early, instead of the last member waiting for the others' whole
        // bursts (with single datagrams, dozens of sends).
        let most = per_dest.iter().map(Vec::len).max().unwrap_or(0);
        let plan = (0..most)
            .flat_map(|k| per_dest.iter().filter_map(move |p| p.get(k).copied()))
            .collect();
        (order, plan)
    }

    /// Sends the datagrams on `socket`, GSO as `gso` says (see the module docs). Never
    /// fails as a whole: what the kernel refused is counted in the report.
    pub fn send(&self, socket: &UdpSocket, gso: &Gso) -> SendReport {
        self.send_planned(socket, gso, MAX_GSO_SEGMENTS)
    }

    /// [`SendBatch::send`] with GSO messages of up to `max_segments` datagrams (a test
    /// asks for more than the kernel takes, to see a refusal).
    fn send_planned(&self, socket: &UdpSocket, gso: &Gso, max_segments: usize) -> SendReport {
        let mut report = SendReport::default();
        if self.datagrams.is_empty() {
            return report;
        }
        let (order, plan) = self.plan(gso.is_on(), max_segments);
        let mut i = 0;
        while i < plan.len() {
            let end = plan.len().min(i + MAX_MESSAGES_PER_CALL);
            report.calls += 1;
            match sys::send_batch(socket, &order, &plan[i..end]) {
                Ok(n) => {
                    for m in &plan[i..i + n] {
                        report.datagrams += m.count as u64;
                        report.bytes += order[m.first..m.first + m.count]
                            .iter()
                            .map(|p| p.len() as u64)
                            .sum::<u64>();
                    }
                    i += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The kernel refused message `i` (the first of the call).
                    let m = plan[i];
                    if m.segment.is_some() && sys::is_gso_refusal(&e) {
                        gso.refused();
                        report.gso_refused += 1;
                        for p in &order[m.first..m.first + m.count] {
                            report.calls += 1;
                            match sys::send_one(socket, p, m.to) {
                                Ok(()) => {
                                    report.datagrams += 1;
                                    report.bytes += p.len() as u64;
                                }
                                Err(_) => report.failed += 1,
                            }
                        }
                    } else {
                        report.failed += m.count as u64;
                    }
                    i += 1;
                }
            }
        }
        report
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use super::*;
    use std::io::IoSlice;
    use std::mem::{size_of, zeroed};
    use std::os::fd::AsRawFd;

    pub(super) use libc::{SO_RXQ_OVFL, UDP_GRO};

    /// Control-message room for two messages of an `int` or `u32` each (GRO's segment size
    /// and `SO_RXQ_OVFL`'s drop count; GSO's `u16`), aligned as `cmsghdr`.
    #[derive(Clone, Copy)]
    #[repr(C, align(8))]
    struct Cmsg([u8; 64]);

    /// `CMSG_SPACE` of a value of `len` bytes.
    fn cmsg_space(len: usize) -> usize {
        // SAFETY: CMSG_SPACE is arithmetic on its argument.
        unsafe { libc::CMSG_SPACE(len as u32) as usize }
    }

    pub(super) fn set_udp_option(socket: &UdpSocket, name: i32, value: i32) -> io::Result<()> {
        set_option(socket, libc::SOL_UDP, name, value)
    }

    pub(super) fn set_socket_option(socket: &UdpSocket, name: i32, value: i32) -> io::Result<()> {
        set_option(socket, libc::SOL_SOCKET, name, value)
    }

    fn set_option(socket: &UdpSocket, level: i32, name: i32, value: i32) -> io::Result<()> {
        // SAFETY: `value` is a live `c_int` and its size is passed with it; the descriptor is
        // `socket`'s, open for the call.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                level,
                name,
                (&value as *const i32).cast(),
                size_of::<i32>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The socket's drop count from `SO_MEMINFO` (an array of `u32`, the drops at
    /// `SK_MEMINFO_DROPS`).
    pub(super) fn socket_drops(socket: &UdpSocket) -> Option<u32> {
        // `SK_MEMINFO_VARS` is 10 in Linux 6.x; the kernel writes what fits.
        let mut info = [0u32; 16];
        let mut len = size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` and `len` are live and `len` is `info`'s size; the kernel writes at
        // most `len` bytes and sets `len` to what it wrote.
        let r = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let at = libc::SK_MEMINFO_DROPS as usize;
        (r == 0 && len as usize >= (at + 1) * size_of::<u32>()).then(|| info[at])
    }

    /// The kernel knows `UDP_SEGMENT` (reading it succeeds).
    pub(super) fn gso_supported(socket: &UdpSocket) -> bool {
        let mut value: i32 = 0;
        let mut len = size_of::<i32>() as libc::socklen_t;
        // SAFETY: `value` and `len` are live and `len` is `value`'s size; the kernel writes
        // at most `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_SEGMENT,
                (&mut value as *mut i32).cast(),
                &mut len,
            )
        };
        r == 0
    }

    /// The errors with which the kernel refuses to segment a message (`udp_send_skb`:
    /// a segment over the route's MTU, too many segments, checksums off; `EIO` for
    /// routes that cannot offload), or a kernel without `UDP_SEGMENT`.
    pub(super) fn is_gso_refusal(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
        )
    }

    pub(super) fn recv_batch(
        socket: &UdpSocket,
        buf: &mut [u8],
        capacity: usize,
        out: &mut Vec<Message>,
    ) -> io::Result<usize> {
        let n = capacity.min(buf.len() / RECV_SLOT);
        // SAFETY: all-zero is a valid `sockaddr_storage` (plain integers).
        let mut names: Vec<libc::sockaddr_storage> = vec![unsafe { zeroed() }; n];
        let mut cmsgs = vec![Cmsg([0; 64]); n];
        let mut iovs: Vec<io::IoSliceMut<'_>> = buf
            .chunks_mut(RECV_SLOT)
            .take(n)
            .map(io::IoSliceMut::new)
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = (0..n)
            .map(|i| {
                // SAFETY: all-zero is a valid `mmsghdr` (null pointers, zero lengths).
                let mut h: libc::mmsghdr = unsafe { zeroed() };
                h.msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                // `IoSliceMut` is ABI-compatible with `iovec` (std's guarantee on Unix).
                h.msg_hdr.msg_iov = (&mut iovs[i] as *mut io::IoSliceMut<'_>).cast();
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_control = cmsgs[i].0.as_mut_ptr().cast();
                // Room for the GRO segment size and the drop count.
                h.msg_hdr.msg_controllen = (2 * cmsg_space(size_of::<i32>())) as _;
                h
            })
            .collect();
        // SAFETY: `hdrs` holds `n` headers whose name, iovec and control pointers point into
        // `names`, `iovs` (into `buf`) and `cmsgs`, all alive and unmoved until the call
        // returns, with their true sizes; the kernel writes within them.
        let r = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = r as usize;
        for (h, name) in hdrs.iter().zip(&names).take(got) {
            let m = &h.msg_hdr;
            let mut segment = None;
            let mut drops = None;
            // SAFETY: `m` is a header the kernel filled: its control pointer and length
            // describe the part of the control buffer it wrote, which is alive.
            let mut c = unsafe { libc::CMSG_FIRSTHDR(m) };
            while !c.is_null() {
                // SAFETY: `c` is non-null and was given by CMSG_FIRSTHDR/CMSG_NXTHDR, so it
                // points to a whole `cmsghdr` within the control buffer.
                let (level, kind, len) =
                    unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize) };
                if level == libc::SOL_UDP && kind == libc::UDP_GRO && len >= cmsg_len_of_int() {
                    // SAFETY: the message's length covers an `int` after its header
                    // (checked just above); it may be unaligned, hence read_unaligned.
                    let seg = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>()) };
                    segment = usize::try_from(seg).ok().filter(|&s| s > 0);
                }
                if level == libc::SOL_SOCKET && kind == SO_RXQ_OVFL && len >= cmsg_len_of_int() {
                    // SAFETY: as for the segment size: a `u32` after the header, checked.
                    drops = Some(unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) });
                }
                // SAFETY: as for CMSG_FIRSTHDR; CMSG_NXTHDR returns null past the end.
                c = unsafe { libc::CMSG_NXTHDR(m, c) };
            }
            // SAFETY: the kernel wrote a socket address of `msg_namelen` bytes into `name`.
            let addr = unsafe { socket2::SockAddr::new(*name, m.msg_namelen) };
            out.push(Message {
                len: (h.msg_len as usize).min(RECV_SLOT),
                from: addr.as_socket(),
                segment,
                truncated: m.msg_flags & libc::MSG_TRUNC != 0,
                drops,
            });
        }
        Ok(got)
    }

    fn cmsg_len_of_int() -> usize {
        // SAFETY: CMSG_LEN is arithmetic on its argument.
        unsafe { libc::CMSG_LEN(size_of::<i32>() as u32) as usize }
    }

    /// Sends `plan`'s messages (datagrams of `order`) with one `sendmmsg`; returns how many
    /// messages the kernel took (at least 1), or the error of the first.
    pub(super) fn send_batch(
        socket: &UdpSocket,
        order: &[&[u8]],
        plan: &[Planned],
    ) -> io::Result<usize> {
        let iovs: Vec<IoSlice<'_>> = order.iter().map(|p| IoSlice::new(p)).collect();
        let names: Vec<Option<socket2::SockAddr>> = plan
            .iter()
            .map(|m| m.to.map(socket2::SockAddr::from))
            .collect();
        let mut cmsgs = vec![Cmsg([0; 64]); plan.len()];
        let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(plan.len());
        for ((m, name), cmsg) in plan.iter().zip(&names).zip(cmsgs.iter_mut()) {
            // SAFETY: all-zero is a valid `mmsghdr` (null pointers, zero lengths).
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            if let Some(a) = name {
                h.msg_hdr.msg_name = a.as_ptr().cast_mut().cast();
                h.msg_hdr.msg_namelen = a.len();
            }
            // `IoSlice` is ABI-compatible with `iovec` (std's guarantee on Unix); the kernel
            // only reads through it.
            h.msg_hdr.msg_iov = iovs[m.first..m.first + m.count].as_ptr().cast_mut().cast();
            h.msg_hdr.msg_iovlen = m.count as _;
            if let Some(seg) = m.segment {
                h.msg_hdr.msg_control = cmsg.0.as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = cmsg_space(size_of::<u16>()) as _;
                // SAFETY: the header's control buffer is `cmsg` (64 bytes, aligned as
                // `cmsghdr`), at least CMSG_SPACE(2) long, so CMSG_FIRSTHDR is a whole
                // header in it and CMSG_DATA has room for the `u16` after it.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
                }
            }
            hdrs.push(h);
        }
        // SAFETY: `hdrs` holds `plan.len()` headers whose pointers point into `names`,
        // `iovs` (into the caller's datagrams) and `cmsgs`, all alive and unmoved until the
        // call returns, with their true lengths; the kernel only writes `msg_len`.
        let r =
            unsafe { libc::sendmmsg(socket.as_raw_fd(), hdrs.as_mut_ptr(), plan.len() as u32, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    pub(super) fn send_one(socket: &UdpSocket, p: &[u8], to: Option<SocketAddr>) -> io::Result<()> {
        match to {
            Some(to) => socket.send_to(p, to),
            None => socket.send(p),
        }
        .map(|_| ())
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    //! One datagram per call through `std`, without offload.
    use super::*;

    pub(super) const UDP_GRO: i32 = 0;
    pub(super) const SO_RXQ_OVFL: i32 = 0;

    pub(super) fn set_udp_option(_: &UdpSocket, _: i32, _: i32) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub(super) fn set_socket_option(_: &UdpSocket, _: i32, _: i32) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub(super) fn socket_drops(_: &UdpSocket) -> Option<u32> {
        None
    }

    pub(super) fn gso_supported(_: &UdpSocket) -> bool {
        false
    }

    pub(super) fn is_gso_refusal(_: &io::Error) -> bool {
        false
    }

    pub(super) fn recv_batch(
        socket: &UdpSocket,
        buf: &mut [u8],
        _capacity: usize,
        out: &mut Vec<Message>,
    ) -> io::Result<usize> {
        let (n, from) = socket.recv_from(&mut buf[..RECV_SLOT])?;
        out.push(Message {
            len: n,
            from: Some(from),
            segment: None,
            truncated: false,
            drops: None,
        });
        Ok(1)
    }

    pub(super) fn send_batch(
        socket: &UdpSocket,
        order: &[&[u8]],
        plan: &[Planned],
    ) -> io::Result<usize> {
        let m = plan[0];
        for p in &order[m.first..m.first + m.count] {
            send_one(socket, p, m.to)?;
        }
        Ok(1)
    }

    pub(super) fn send_one(socket: &UdpSocket, p: &[u8], to: Option<SocketAddr>) -> io::Result<()> {
        match to {
            Some(to) => socket.send_to(p, to),
            None => socket.send(p),
        }
        .map(|_| ())
    }
}

#[cfg(all(test, target_os = "linux", not(miri)))]
mod tests {
    use super::*;
    use std::time::Duration;

    fn loopback() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    /// Datagram `i` of `len` bytes: its index in the first two bytes, then a pattern.
    fn datagram(i: u16, len: usize) -> Vec<u8> {
        let mut d: Vec<u8> = (0..len).map(|k| (k * 7 + usize::from(i)) as u8).collect();
        d[..2].copy_from_slice(&i.to_be_bytes());
        d
    }

    /// Receives until `n` datagrams came (each `recv` waits at most 5 s); returns them and
    /// the messages they came in.
    fn receive(rx: &mut RecvBatch, s: &UdpSocket, n: usize) -> (Vec<Vec<u8>>, usize) {
        let mut got = Vec::new();
        let mut messages = 0;
        while got.len() < n {
            messages += rx.recv(s).expect("the datagrams within 5 s");
            got.extend(rx.datagrams().map(|d| {
                assert!(!d.truncated);
                d.payload.to_vec()
            }));
        }
        (got, messages)
    }

    #[test]
    fn a_batch_of_many_datagrams_arrives_whole_and_in_order() {
        let (a, b) = (loopback(), loopback());
        let to = b.local_addr().unwrap();
        let sent: Vec<Vec<u8>> = (0..40).map(|i| datagram(i, 100 + usize::from(i))).collect();
        let mut batch = SendBatch::new();
        for d in &sent {
            batch.push(Some(to), d);
        }
        let r = batch.send(&a, &Gso::off());
        assert_eq!(r.datagrams, 40);
        assert_eq!(r.failed, 0);
        assert_eq!(r.calls, 1, "one sendmmsg");
        let mut rx = RecvBatch::new(64);
        let (got, messages) = receive(&mut rx, &b, 40);
        assert_eq!(got, sent);
        assert_eq!(messages, 40, "no GRO asked for: a datagram per message");
        assert!(rx
            .datagrams()
            .all(|d| d.from == Some(a.local_addr().unwrap())));
    }

    #[test]
    fn gso_segments_arrive_as_the_datagrams_sent_with_or_without_gro() {
        for gro in [true, false] {
            let (a, b) = (loopback(), loopback());
            let gro_on = gro && enable_gro(&b);
            let gso = Gso::probe(&a, true);
            let to = b.local_addr().unwrap();
            // 40 datagrams of 1000 bytes and a short last one, then one of another size.
            let mut sent: Vec<Vec<u8>> = (0..40).map(|i| datagram(i, 1000)).collect();
            sent.push(datagram(40, 300));
            sent.push(datagram(41, 1200));
            let mut batch = SendBatch::new();
            for d in &sent {
                batch.push(Some(to), d);
            }
            let r = batch.send(&a, &gso);
            assert_eq!((r.datagrams, r.failed, r.gso_refused), (42, 0, 0));
            let mut rx = RecvBatch::new(8);
            let (got, messages) = receive(&mut rx, &b, 42);
            assert_eq!(got, sent, "gro {gro_on}, gso {}", gso.is_on());
            if gso.is_on() {
                // One GSO message (the 40 and the short one after them) and a single
                // datagram, in one call.
                assert_eq!(r.calls, 1);
            }
            if gso.is_on() && gro_on {
                // On loopback a GSO message reaches a GRO socket whole.
                assert_eq!(messages, 2, "the GSO messages arrive as sent");
            } else {
                assert_eq!(messages, 42);
            }
        }
    }

    #[test]
    fn one_gso_message_is_cut_where_the_payload_limit_is() {
        let (a, b) = (loopback(), loopback());
        enable_gro(&b);
        let gso = Gso::probe(&a, true);
        let to = b.local_addr().unwrap();
        // 4108-byte datagrams (a Trio-ML packet of 1024 gradients): 15 fit one message.
        let sent: Vec<Vec<u8>> = (0..31).map(|i| datagram(i, 4108)).collect();
        let mut batch = SendBatch::new();
        for d in &sent {
            batch.push(Some(to), d);
        }
        let (_, plan) = batch.plan(true, MAX_GSO_SEGMENTS);
        assert_eq!(
            plan.iter().map(|m| m.count).collect::<Vec<_>>(),
            [15, 15, 1]
        );
        assert_eq!(batch.send(&a, &gso).datagrams, 31);
        let mut rx = RecvBatch::new(8);
        assert_eq!(receive(&mut rx, &b, 31).0, sent);
    }

    #[test]
    fn datagrams_for_several_destinations_each_arrive_in_order() {
        let a = loopback();
        let dests = [loopback(), loopback(), loopback()];
        let gso = Gso::probe(&a, true);
        let results: Vec<Vec<u8>> = (0..20).map(|i| datagram(i, 4108)).collect();
        let mut batch = SendBatch::new();
        // As the front end fans Results out: each Result to every member in turn.
        for r in &results {
            for d in &dests {
                batch.push(Some(d.local_addr().unwrap()), r);
            }
        }
        let r = batch.send(&a, &gso);
        assert_eq!((r.datagrams, r.failed), (60, 0));
        for d in &dests {
            enable_gro(d);
            let mut rx = RecvBatch::new(8);
            assert_eq!(receive(&mut rx, d, 20).0, results);
        }
    }

    #[test]
    fn a_refused_message_in_the_middle_is_counted_and_the_rest_still_go() {
        let (a, b, c) = (loopback(), loopback(), loopback());
        // A broadcast address without SO_BROADCAST: the kernel refuses it, so sendmmsg
        // stops after the first message (a partial send) and the batch goes on after the
        // refused one.
        let refused: SocketAddr = "255.255.255.255:9".parse().unwrap();
        let (d0, d1, d2) = (datagram(0, 50), datagram(1, 50), datagram(2, 60));
        let mut batch = SendBatch::new();
        batch.push(Some(b.local_addr().unwrap()), &d0);
        batch.push(Some(refused), &d1);
        batch.push(Some(c.local_addr().unwrap()), &d2);
        let r = batch.send(&a, &Gso::probe(&a, true));
        assert_eq!((r.datagrams, r.failed, r.calls), (2, 1, 3));
        let mut rx = RecvBatch::new(8);
        assert_eq!(receive(&mut rx, &b, 1).0, [d0]);
        assert_eq!(receive(&mut rx, &c, 1).0, [d2]);
    }

    #[test]
    fn a_gso_message_the_kernel_refuses_goes_as_single_datagrams_and_gso_turns_off() {
        let (a, b) = (loopback(), loopback());
        enable_gro(&b);
        let gso = Gso::probe(&a, true);
        if !gso.is_on() {
            eprintln!("the kernel has no UDP GSO: nothing to refuse");
            return;
        }
        let to = b.local_addr().unwrap();
        // More segments in one message than any kernel takes (UDP_MAX_SEGMENTS is 64 or
        // 128): the kernel refuses the message (EINVAL), and the batch falls back.
        let many: Vec<Vec<u8>> = (0..200).map(|i| datagram(i, 20)).collect();
        let mut batch = SendBatch::new();
        for d in &many {
            batch.push(Some(to), d);
        }
        let r = batch.send_planned(&a, &gso, 1000);
        assert_eq!((r.datagrams, r.failed, r.gso_refused), (200, 0, 1));
        assert!(!gso.is_on(), "GSO is off after a refusal");
        let mut rx = RecvBatch::new(64);
        assert_eq!(receive(&mut rx, &b, 200).0, many);
        // Later batches go without GSO from the start.
        let r = batch.send_planned(&a, &gso, 1000);
        assert_eq!((r.datagrams, r.gso_refused, r.calls), (200, 0, 1));
        assert_eq!(receive(&mut rx, &b, 200).0, many);
    }

    #[test]
    fn the_datagrams_the_kernel_drops_for_a_full_buffer_are_counted() {
        // The smallest receive buffer the kernel grants (a few KiB), and a burst of 200
        // datagrams of 1000 bytes sent before anything is read: most cannot be queued.
        let s = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        s.set_recv_buffer_size(1).unwrap();
        s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let b: UdpSocket = s.into();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert!(enable_drop_count(&b), "Linux has SO_RXQ_OVFL");
        let a = loopback();
        let to = b.local_addr().unwrap();
        let sent = 200u64;
        for i in 0..sent {
            a.send_to(&datagram(i as u16, 1000), to).unwrap();
        }
        let mut rx = RecvBatch::new(64);
        let mut received = 0u64;
        // Until every datagram sent was received or dropped, by the kernel's own count now
        // (loopback may hand datagrams over a little after the send returned).
        let drops = || u64::from(socket_drops(&b).expect("Linux has SO_MEMINFO"));
        let t0 = std::time::Instant::now();
        while received + drops() < sent {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{received} received and {} dropped of {sent}",
                drops()
            );
            if rx.recv(&b).is_ok() {
                received += rx.datagrams().count() as u64;
            }
        }
        assert_eq!(received + drops(), sent);
        assert!(
            received < sent,
            "{received} of {sent} fitted a buffer of a few KiB"
        );
        // Each message carries the count when it was queued: the last drops show in the
        // next message (the buffer is empty now, so it is queued).
        a.send_to(&datagram(999, 10), to).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        rx.recv(&b).expect("the last datagram");
        assert_eq!(rx.kernel_dropped(), sent - received);
    }

    #[test]
    fn a_receive_times_out_as_a_recv_does() {
        let s = loopback();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let e = RecvBatch::new(4).recv(&s).unwrap_err();
        assert!(matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ));
    }

    #[test]
    fn the_plan_groups_by_destination_and_cuts_on_size_changes() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let (big, small) = (vec![1u8; 100], vec![2u8; 50]);
        let mut batch = SendBatch::new();
        for (to, p) in [
            (a, &big),
            (b, &big),
            (a, &big),
            (a, &small),
            (a, &big),
            (b, &big),
        ] {
            batch.push(Some(to), p);
        }
        let (order, plan) = batch.plan(true, MAX_GSO_SEGMENTS);
        let shape: Vec<_> = plan.iter().map(|m| (m.to, m.count, m.segment)).collect();
        assert_eq!(
            shape,
            [
                (Some(a), 3, Some(100)), // big, big, small (a shorter last one)
                (Some(b), 2, Some(100)), // each destination's first message first
                (Some(a), 1, None),      // big after a short one starts again
            ]
        );
        assert_eq!(order.len(), 6);
        let (order, plain) = batch.plan(false, MAX_GSO_SEGMENTS);
        assert!(plain.iter().all(|m| m.count == 1 && m.segment.is_none()));
        // Without GSO the fan-out alternates: a, b, a, b, a, a.
        let to: Vec<_> = plain.iter().map(|m| m.to).collect();
        let (sa, sb) = (Some(a), Some(b));
        assert_eq!(to, [sa, sb, sa, sb, sa, sa]);
        assert_eq!(order[plain[4].first], &small[..]);
        // A copy is sent as pushed, and may be changed in place.
        let mut batch = SendBatch::new();
        batch.push_copy(Some(a), &big)[0] = 9;
        let (order, _) = batch.plan(true, MAX_GSO_SEGMENTS);
        assert_eq!(order[0][0], 9);
    }
}
