//! The system calls of the live ports: the crate's only unsafe code outside `src/isa.rs`.
//!
//! Everything that talks to the kernel through raw pointers is here, each `unsafe` block
//! with a `// SAFETY:` comment: AF_PACKET sockets ([`PacketSocket`]: open, options, bind,
//! `PACKET_STATISTICS`, `sendmmsg`, `recv`), the memory-mapped `TPACKET_V3` receive ring
//! ([`RxRing`]: `mmap`, handing blocks between the kernel and us), TAP devices ([`Tap`]:
//! `/dev/net/tun`, `TUNSETIFF`, interface flags), and `poll`. What the ring's blocks *hold*
//! is read by the safe, pure [`super::ring::parse_block`], which has unit tests on
//! synthetic blocks (they run under Miri too); nothing here interprets packet bytes.
//!
//! `libc` rather than `nix`: `libc` is already a dependency of the lab, and `nix` has no
//! wrappers for what most of this needs (`PACKET_RX_RING`, `tpacket_req3`,
//! `PACKET_STATISTICS`, the ring's block handover), so it would add a crate and still
//! leave the same raw calls.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// `ETH_P_ALL` in network byte order, as `bind` and `socket` take it.
const ETH_P_ALL_BE: u16 = (libc::ETH_P_ALL as u16).to_be();
/// `TPACKET_V3` of `enum tpacket_versions` (libc has it as an enum).
const TPACKET_V3: libc::c_int = 2;
/// Frames per `sendmmsg` call.
pub(crate) const SEND_BATCH: usize = 64;
/// Offset of `block_status` in a `tpacket_block_desc` (after `version` and
/// `offset_to_priv`).
const BLOCK_STATUS_AT: usize = 8;

/// The last OS error, with what was being done and to which interface.
fn os_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// An interface name as the kernel takes it: 1 to 15 bytes, no NUL, `/` or whitespace.
pub(crate) fn check_ifname(name: &str) -> Result<CString, String> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(format!(
            "`{name}` is not an interface name (1 to {} bytes)",
            libc::IFNAMSIZ - 1
        ));
    }
    if name
        .bytes()
        .any(|b| b == b'/' || b.is_ascii_whitespace() || b == 0)
    {
        return Err(format!(
            "`{name}` is not an interface name (no `/`, spaces or NUL)"
        ));
    }
    CString::new(name).map_err(|_| format!("`{name}` holds a NUL byte"))
}

/// The index of interface `name`, or `NotFound` when there is none.
pub(crate) fn if_index(name: &str) -> io::Result<i32> {
    let c = check_ifname(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a NUL-terminated string that lives across the call; the function only
    // reads it.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::last_os_error());
    }
    i32::try_from(i).map_err(|_| io::Error::other("interface index out of range"))
}

/// Calls `setsockopt(fd, level, name, value)`.
fn set_opt<T>(fd: &OwnedFd, level: i32, name: i32, value: &T, what: &str) -> io::Result<()> {
    // SAFETY: `value` points to a live, initialised `T` of `size_of::<T>()` bytes, which
    // the kernel only reads during the call; `fd` is an open descriptor we own.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(os_error(what));
    }
    Ok(())
}

/// Waits up to `timeout_ms` for `fd` to become readable; returns the `revents`.
fn poll_fd(fd: i32, timeout_ms: i32) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid `pollfd` that lives across the call (count 1).
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(p.revents)
}

/// Whether `revents` says the descriptor has an error pending.
pub(crate) fn has_error(revents: i16) -> bool {
    revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
}

/// The kernel's receive counters of a packet socket since the last read
/// (`PACKET_STATISTICS` resets them when read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelStats {
    /// Frames the socket took, including those it dropped.
    pub packets: u64,
    /// Frames dropped because the ring (or the receive buffer) was full.
    pub drops: u64,
    /// Times the ring was frozen full (TPACKET_V3).
    pub freezes: u64,
}

/// A classic BPF program of one instruction, `ret #0`: it takes no frame.
const DROP_ALL: libc::sock_filter = libc::sock_filter {
    code: (libc::BPF_RET | libc::BPF_K) as u16,
    jt: 0,
    jf: 0,
    k: 0,
};

/// `MEMBARRIER_CMD_GLOBAL` of `membarrier(2)`.
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

/// Waits until every frame the kernel is handing to interface `ifindex` at the call has
/// been handed over: the kernel hands frames over inside RCU read-side sections, and
/// rebinding a packet socket hooked to the interface waits for all of them to end
/// (`synchronize_net`). A socket of its own, bound to two protocols no frame carries, so it
/// receives nothing meanwhile. An interface that is down or gone hands nothing over:
/// nothing to wait for.
///
/// A packet socket needs `CAP_NET_RAW`, which a TAP port does not otherwise need; without
/// it, `membarrier(MEMBARRIER_CMD_GLOBAL)`, which needs no privilege and returns after an
/// RCU grace period (`synchronize_rcu`, the same wait on a kernel since 4.20).
pub(crate) fn wait_for_deliveries(ifindex: i32) -> io::Result<()> {
    let sock = match PacketSocket::new() {
        Ok(sock) => sock,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            // SAFETY: plain system call with constant arguments.
            let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
            if r != 0 {
                return Err(os_error(
                    "membarrier(MEMBARRIER_CMD_GLOBAL), to wait for frames on their way in \
                     without CAP_NET_RAW",
                ));
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    match sock
        .bind_protocol(ifindex, (libc::ETH_P_802_3 as u16).to_be())
        .and_then(|()| sock.bind_protocol(ifindex, (libc::ETH_P_802_2 as u16).to_be()))
    {
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("rebinding a packet socket to wait for frames on their way in: {e}"),
        )),
        Ok(()) => Ok(()),
    }
}

/// An AF_PACKET raw socket bound to one interface.
#[derive(Debug)]
pub(crate) struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// A raw packet socket that receives nothing yet (protocol 0): options and the ring are
    /// set before [`PacketSocket::bind`], so no frame of another interface gets in first.
    pub fn new() -> io::Result<PacketSocket> {
        // SAFETY: plain system call with constant arguments; it returns a new descriptor
        // or -1.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(PacketSocket {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Selects `TPACKET_V3` for the receive ring.
    pub fn set_tpacket_v3(&self) -> io::Result<()> {
        let v: libc::c_int = TPACKET_V3;
        set_opt(
            &self.fd,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &v,
            "PACKET_VERSION TPACKET_V3",
        )
    }

    /// Stops the socket from seeing frames sent on its interface (by anyone, this socket
    /// included): a port receives what arrives, not what leaves. `Unsupported` before
    /// Linux 4.20 (the caller then filters them by packet type).
    pub fn ignore_outgoing(&self) -> io::Result<()> {
        let one: libc::c_int = 1;
        set_opt(
            &self.fd,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &one,
            "PACKET_IGNORE_OUTGOING",
        )
    }

    /// Sets the send buffer (bytes; the kernel doubles it and caps it without
    /// `SO_SNDBUFFORCE`).
    pub fn set_send_buffer(&self, bytes: usize) -> io::Result<()> {
        let b = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        set_opt(&self.fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &b, "SO_SNDBUF")
    }

    /// Bounds how long a send may wait for room in the send buffer; past it the frames
    /// are refused with `EAGAIN` (counted), so a PPE thread never waits forever on an
    /// interface that stopped draining.
    pub fn set_send_timeout(&self, timeout: std::time::Duration) -> io::Result<()> {
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
        };
        set_opt(
            &self.fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &tv,
            "SO_SNDTIMEO",
        )
    }

    /// Sets the receive buffer (bytes) of a socket without a ring.
    pub fn set_recv_buffer(&self, bytes: usize) -> io::Result<()> {
        let b = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        set_opt(&self.fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &b, "SO_RCVBUF")
    }

    /// Binds the socket to interface `ifindex`, all protocols: from now on it receives the
    /// interface's frames and sends out of it.
    pub fn bind(&self, ifindex: i32) -> io::Result<()> {
        self.bind_protocol(ifindex, ETH_P_ALL_BE)
            .map_err(|e| io::Error::new(e.kind(), format!("bind: {e}")))
    }

    /// Binds a socket made by [`PacketSocket::new`] (protocol 0) to interface `ifindex`
    /// for sending only: it keeps protocol 0, so the kernel never hooks it to the
    /// interface's receive path. Such a socket receives nothing and never has an error
    /// pending (`SO_ERROR`): the kernel reports an interface going down only to the sockets
    /// hooked to it, and the first send (or poll) to find that report takes it. A port
    /// sends through one of these, so its receiving socket alone owns that report.
    pub fn bind_sender(&self, ifindex: i32) -> io::Result<()> {
        self.bind_protocol(ifindex, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("bind (for sending): {e}")))
    }

    /// Binds the socket to interface `ifindex` and protocol `protocol_be` (network byte
    /// order; 0 keeps the current one). The error is the OS error as it is.
    fn bind_protocol(&self, ifindex: i32, protocol_be: u16) -> io::Result<()> {
        // SAFETY: `sockaddr_ll` is plain data for which all-zero bytes are valid.
        let mut sll: libc::sockaddr_ll = unsafe { MaybeUninit::zeroed().assume_init() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = protocol_be;
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` is a valid `sockaddr_ll` living across the call, and the length
        // given is its size.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops the kernel's delivery of frames to the socket for good, sending being
    /// unchanged: once this returns, no frame enters the socket (its receive ring), nor is
    /// one still on its way in, so what the ring holds and `PACKET_STATISTICS` counts are
    /// final.
    ///
    /// First a classic BPF filter that takes no frame (`ret #0`; the kernel runs it before
    /// it counts or stores a frame, so a refused frame is in none of the socket's counters).
    /// A receive path that passed the old (absent) filter just before may still be storing
    /// its frame, so then the socket is bound to another protocol and back
    /// (`ifindex` being the interface it is bound to): each rebinding takes the socket off
    /// the interface and waits for every receive in progress to end (the kernel's
    /// `synchronize_net`). A port sends through another socket
    /// ([`PacketSocket::bind_sender`]), which the rebinding leaves as it is.
    ///
    /// An `ENODEV` from the rebinding means the interface is gone, and with it any frame
    /// to come: not an error.
    ///
    /// The socket's pending error (`SO_ERROR`) is read before and cleared after: the one
    /// found before is real (the interface went down or away while the port ran, and the
    /// RX thread had not polled it yet) and is returned, for the caller to count. On an
    /// interface that is down, each rebinding succeeds but leaves `ENETDOWN` pending (the
    /// kernel cannot hook the socket to a down interface: `packet_do_bind`); that one is
    /// the stop's own, and left pending it would be counted as a receive error by the
    /// stop's last poll. The
    /// interface going down or away during the rebinding leaves the same `ENETDOWN` or
    /// `ENODEV`, which are cleared too: the filter already refuses every frame, so nothing
    /// is lost by it. Any other error found after is returned.
    pub fn stop_receiving(&self, ifindex: i32) -> io::Result<Vec<io::Error>> {
        let mut pending: Vec<io::Error> = self.take_error().into_iter().collect();
        let mut drop_all = DROP_ALL;
        let prog = libc::sock_fprog {
            len: 1,
            filter: &mut drop_all,
        };
        // `prog` points to `drop_all`, which lives across the call; the kernel copies the
        // program in (see `set_opt` for the rest).
        set_opt(
            &self.fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &prog,
            "SO_ATTACH_FILTER (a filter that takes no frame)",
        )?;
        let fence = (libc::ETH_P_802_3 as u16).to_be();
        match self
            .bind_protocol(ifindex, fence)
            .and_then(|()| self.bind_protocol(ifindex, ETH_P_ALL_BE))
        {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("rebinding to wait for frames on their way in: {e}"),
                ))
            }
            Ok(()) => {}
        }
        match self.take_error() {
            Some(e) if matches!(e.raw_os_error(), Some(libc::ENETDOWN | libc::ENODEV)) => {}
            Some(e) => pending.push(e),
            None => {}
        }
        Ok(pending)
    }

    /// Puts the interface in promiscuous mode for as long as this socket lives (the kernel
    /// counts such requests per interface and undoes them when the socket closes).
    pub fn promiscuous(&self, ifindex: i32) -> io::Result<()> {
        // SAFETY: `packet_mreq` is plain data for which all-zero bytes are valid.
        let mut mr: libc::packet_mreq = unsafe { MaybeUninit::zeroed().assume_init() };
        mr.mr_ifindex = ifindex;
        mr.mr_type = libc::PACKET_MR_PROMISC as u16;
        set_opt(
            &self.fd,
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mr,
            "PACKET_ADD_MEMBERSHIP PACKET_MR_PROMISC",
        )
    }

    /// The kernel's receive counters since the last call (they reset when read).
    pub fn take_stats(&self) -> io::Result<KernelStats> {
        // SAFETY: `tpacket_stats_v3` is plain data for which all-zero bytes are valid.
        let mut st: libc::tpacket_stats_v3 = unsafe { MaybeUninit::zeroed().assume_init() };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: `st` is writable for `len` bytes and `len` is a valid in/out length; the
        // kernel writes at most `len` bytes (fewer for a socket without TPACKET_V3, which
        // leaves the rest zero).
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(os_error("PACKET_STATISTICS"));
        }
        Ok(KernelStats {
            packets: u64::from(st.tp_packets),
            drops: u64::from(st.tp_drops),
            freezes: if len as usize >= size_of::<libc::tpacket_stats_v3>() {
                u64::from(st.tp_freeze_q_cnt)
            } else {
                0
            },
        })
    }

    /// The socket's pending error (`SO_ERROR`, which reading clears), if any.
    pub fn take_error(&self) -> Option<io::Error> {
        let mut e: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `e` is a writable `c_int` and `len` its size.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut e as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0 && e != 0).then(|| io::Error::from_raw_os_error(e))
    }

    /// Waits up to `timeout_ms` for frames (or an error); returns the `revents`.
    pub fn poll(&self, timeout_ms: i32) -> io::Result<i16> {
        poll_fd(self.fd.as_raw_fd(), timeout_ms)
    }

    /// Sends `frames` out of the bound interface with `sendmmsg`, up to [`SEND_BATCH`] per
    /// call, the kernel reading each frame where it is (one copy, into its buffer). A
    /// frame the kernel refuses is counted through `failed` with its error and skipped;
    /// the others go on, but after a send timeout (`EAGAIN`) the rest of the frames are
    /// refused at once. Returns the frames and bytes sent.
    pub fn send_batch<'a>(
        &self,
        frames: &mut dyn Iterator<Item = &'a [u8]>,
        failed: &mut dyn FnMut(&'a [u8], io::Error),
    ) -> (u64, u64) {
        let (mut sent, mut bytes) = (0u64, 0u64);
        let mut chunk: [&'a [u8]; SEND_BATCH] = [&[]; SEND_BATCH];
        loop {
            let mut len = 0;
            for f in (&mut *frames).take(SEND_BATCH) {
                chunk[len] = f;
                len += 1;
            }
            if len == 0 {
                return (sent, bytes);
            }
            let chunk = &chunk[..len];
            let mut at = 0;
            while at < chunk.len() {
                match self.sendmmsg(&chunk[at..]) {
                    Ok(n) => {
                        sent += n as u64;
                        bytes += chunk[at..at + n]
                            .iter()
                            .map(|f| f.len() as u64)
                            .sum::<u64>();
                        at += n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // No room for the send timeout: the interface stopped draining, so
                        // the rest of the burst would wait as long, each. Refuse it all.
                        for f in chunk[at..].iter().copied().chain(&mut *frames) {
                            failed(f, io::Error::from_raw_os_error(libc::EAGAIN));
                        }
                        return (sent, bytes);
                    }
                    Err(e) => {
                        // The first frame of the rest was refused; skip it and go on.
                        failed(chunk[at], e);
                        at += 1;
                    }
                }
            }
        }
    }

    /// One `sendmmsg` call over `frames` (at most [`SEND_BATCH`]): how many were sent
    /// (at least 1), or the error of the first.
    fn sendmmsg(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let n = frames.len().min(SEND_BATCH);
        // SAFETY: all-zero bytes are valid for `iovec` and `mmsghdr` (null pointers, zero
        // lengths).
        let mut iov: [libc::iovec; SEND_BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; SEND_BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
        for (i, f) in frames[..n].iter().enumerate() {
            iov[i].iov_base = f.as_ptr() as *mut libc::c_void;
            iov[i].iov_len = f.len();
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` are valid headers, each pointing to one `iovec` of `iov`,
        // which points to a frame borrowed for the whole call; the kernel only reads the
        // frames (and writes `msg_len` into `msgs`). No address is given: the socket is
        // bound to its interface.
        let r = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if r == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "sendmmsg sent nothing",
            ));
        }
        Ok((r as usize).min(n))
    }

    /// Receives one frame into `buf` without waiting (for a socket without a ring);
    /// `Ok(None)` when none is queued. Returns the frame's length (it was cut to `buf`'s
    /// length if longer) and its packet type (`PACKET_HOST`, `PACKET_OUTGOING`, ...).
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, u8)>> {
        // SAFETY: all-zero bytes are a valid `sockaddr_ll`.
        let mut from: libc::sockaddr_ll = unsafe { MaybeUninit::zeroed().assume_init() };
        let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `buf` is writable for `buf.len()` bytes and `from` for `len` bytes; both
        // live across the call.
        let r = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(((r as usize).min(buf.len()), from.sll_pkttype)))
    }
}

/// The layout of a `TPACKET_V3` receive ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingLayout {
    /// Bytes per block (a multiple of the page size).
    pub block_bytes: u32,
    /// Blocks.
    pub blocks: u32,
    /// The frame size the kernel sizes its frame count by (frames are packed in a block
    /// at their own length in V3).
    pub frame_bytes: u32,
    /// Milliseconds after which the kernel hands over a block that is not full.
    pub block_timeout_ms: u32,
}

/// The memory-mapped `TPACKET_V3` receive ring of a [`PacketSocket`]: `blocks` blocks of
/// `block_bytes`, each owned in turn by the kernel (which fills it) and by us (once its
/// status says `TP_STATUS_USER`, until we write `TP_STATUS_KERNEL` back).
#[derive(Debug)]
pub(crate) struct RxRing {
    base: NonNull<u8>,
    len: usize,
    block_bytes: usize,
    blocks: usize,
    /// The block the kernel fills next, in order.
    next: usize,
}

// SAFETY: the mapping belongs to this value alone (no copy of `base` escapes), so moving it
// to another thread moves the only access to it; every access goes through `&mut self`.
unsafe impl Send for RxRing {}

impl RxRing {
    /// Sets up the ring on `sock` (which must have selected `TPACKET_V3` and not be bound
    /// yet) and maps it.
    pub fn new(sock: &PacketSocket, layout: RingLayout) -> io::Result<RxRing> {
        let page = 4096u32;
        if layout.block_bytes == 0
            || !layout.block_bytes.is_multiple_of(page)
            || layout.blocks == 0
            || layout.frame_bytes == 0
            || !layout.block_bytes.is_multiple_of(layout.frame_bytes)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring layout {layout:?}: block size a multiple of 4096 and of the frame size, at least one block"),
            ));
        }
        let frames = (layout.block_bytes / layout.frame_bytes)
            .checked_mul(layout.blocks)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "ring too large"))?;
        // SAFETY: plain data; all-zero bytes are valid.
        let mut req: libc::tpacket_req3 = unsafe { MaybeUninit::zeroed().assume_init() };
        req.tp_block_size = layout.block_bytes;
        req.tp_block_nr = layout.blocks;
        req.tp_frame_size = layout.frame_bytes;
        req.tp_frame_nr = frames;
        req.tp_retire_blk_tov = layout.block_timeout_ms;
        req.tp_sizeof_priv = 0;
        req.tp_feature_req_word = 0;
        set_opt(
            &sock.fd,
            libc::SOL_PACKET,
            libc::PACKET_RX_RING,
            &req,
            "PACKET_RX_RING",
        )?;
        let len = layout.block_bytes as usize * layout.blocks as usize;
        // SAFETY: maps the ring the kernel just allocated for this socket (offset 0,
        // exactly its length), shared and read-write as the packet socket requires; the
        // result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_LOCKED,
                sock.fd.as_raw_fd(),
                0,
            )
        };
        let p = if p == libc::MAP_FAILED {
            // MAP_LOCKED fails under a low RLIMIT_MEMLOCK; the ring works unlocked too.
            // SAFETY: as above, without MAP_LOCKED.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    sock.fd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(os_error("mmap of the receive ring"));
            }
            p
        } else {
            p
        };
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(RxRing {
            base,
            len,
            block_bytes: layout.block_bytes as usize,
            blocks: layout.blocks as usize,
            next: 0,
        })
    }

    /// The status word of block `i`.
    fn status(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < self.blocks);
        // SAFETY: block `i` starts at `i * block_bytes` inside the mapping (i < blocks);
        // `block_status` is at byte 8 of the block, 4-byte aligned (the mapping is page
        // aligned and blocks are multiples of a page), and lives as long as `self`. The
        // kernel writes it concurrently, hence the atomic.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(i * self.block_bytes + BLOCK_STATUS_AT)
                .cast::<AtomicU32>()
        }
    }

    /// If the next block is ours (the kernel retired it), runs `f` on its bytes and hands
    /// it back to the kernel; `None` when the kernel still fills it.
    pub fn with_ready_block<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let i = self.next;
        // Acquire: the kernel's writes of the block happen before it set TP_STATUS_USER.
        if self.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: the block lies inside the mapping; while its status says
        // TP_STATUS_USER the kernel does not touch it, and `&mut self` makes this the only
        // reference into the ring until `f` returns.
        let block = unsafe {
            std::slice::from_raw_parts_mut(
                self.base.as_ptr().add(i * self.block_bytes),
                self.block_bytes,
            )
        };
        let r = f(block);
        // Release: our reads and writes of the block happen before the kernel reuses it.
        self.status(i)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.next = (i + 1) % self.blocks;
        Some(r)
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no reference into it outlives
        // `self` (blocks are lent to closures only).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// A TAP device: frames the host sends on the interface are read here, frames written
/// here arrive at the host. Non-blocking.
#[derive(Debug)]
pub(crate) struct Tap {
    fd: OwnedFd,
}

impl Tap {
    /// Opens (creating it if there is none) the TAP device `name`, without packet
    /// information headers, and brings it up.
    pub fn open(name: &str) -> io::Result<Tap> {
        let c = check_ifname(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the path is a NUL-terminated literal; the call returns a new descriptor
        // or -1.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(os_error("opening /dev/net/tun"));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut req = ifreq(&c);
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: `req` is a valid `ifreq` (name and flags set) living across the call;
        // TUNSETIFF reads it and writes the name back.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if r < 0 {
            return Err(os_error("TUNSETIFF"));
        }
        set_up(&c)?;
        Ok(Tap { fd })
    }

    /// Reads one frame into `buf` without waiting; `Ok(None)` when none is queued.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buf` is writable for `buf.len()` bytes across the call.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(r as usize))
    }

    /// Makes the device refuse every frame the host sends it from now on, reading being
    /// unchanged: once this returns, no frame enters the device's queue, nor is one still
    /// on its way in, so what the queue holds is all the port can still read.
    ///
    /// A classic BPF filter that takes no frame (`TUNATTACHFILTER`): the device runs it on
    /// each frame before it queues it, and drops a refused frame counting it in its
    /// `tx_dropped`. A frame that passed the old (absent) filter just before may still be
    /// on its way into the queue: [`wait_for_deliveries`] on the device (`ifindex`) waits
    /// for it. A device that was deleted takes no more frames: not an error.
    pub fn stop_receiving(&self, ifindex: i32) -> io::Result<()> {
        let mut drop_all = DROP_ALL;
        let prog = libc::sock_fprog {
            len: 1,
            filter: &mut drop_all,
        };
        // SAFETY: `prog` is a valid `sock_fprog` pointing to one instruction, both living
        // across the call; the kernel copies the program in and only reads them.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TUNATTACHFILTER, &prog) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // EBADFD: the device was deleted (the descriptor is detached from it), and
            // with it any frame to come: nothing to refuse.
            if e.raw_os_error() == Some(libc::EBADFD) {
                return Ok(());
            }
            return Err(io::Error::new(
                e.kind(),
                format!("TUNATTACHFILTER (a filter that takes no frame): {e}"),
            ));
        }
        wait_for_deliveries(ifindex)
    }

    /// Writes one frame (the host receives it).
    pub fn write(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: `frame` is readable for its length across the call.
            let r = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Waits up to `timeout_ms` for a frame; returns the `revents`.
    pub fn poll(&self, timeout_ms: i32) -> io::Result<i16> {
        poll_fd(self.fd.as_raw_fd(), timeout_ms)
    }
}

/// An `ifreq` naming `name` (which fits: [`check_ifname`] checked it), all else zero.
fn ifreq(name: &CString) -> libc::ifreq {
    // SAFETY: `ifreq` is plain data (a name array and a union of plain data); all-zero
    // bytes are valid.
    let mut req: libc::ifreq = unsafe { MaybeUninit::zeroed().assume_init() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    req
}

/// Sets `IFF_UP` on interface `name`.
fn set_up(name: &CString) -> io::Result<()> {
    // SAFETY: plain system call; returns a new descriptor or -1.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(os_error("socket for SIOCSIFFLAGS"));
    }
    // SAFETY: `s` is a fresh descriptor that nothing else owns.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let mut req = ifreq(name);
    // SAFETY: `req` is a valid `ifreq` naming the interface; SIOCGIFFLAGS writes its flags
    // into the union.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(os_error("SIOCGIFFLAGS"));
    }
    // SAFETY: SIOCGIFFLAGS filled `ifru_flags`, the union's field being read.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: as for SIOCGIFFLAGS; SIOCSIFFLAGS reads the request.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) } < 0 {
        return Err(os_error("SIOCSIFFLAGS (bringing the TAP device up)"));
    }
    Ok(())
}
