//! Policers: RFC 2697 single-rate three-colour markers (colour-blind), kept in shared memory.
//!
//! A policer occupies [`POLICER_WORDS`] consecutive words (allocate it 8-word aligned so it
//! sits in one 64-byte line and one bank):
//!
//! | word | content                                              |
//! |------|------------------------------------------------------|
//! | 0    | CIR, bytes per second                                |
//! | 1    | CBS, bytes                                           |
//! | 2    | EBS, bytes                                           |
//! | 3    | Tc, committed-bucket tokens (bytes)                  |
//! | 4    | Te, excess-bucket tokens (bytes)                     |
//! | 5    | time of the last update, ns                          |
//! | 6    | fractional token carry, in units of 1e-9 byte        |
//! | 7    | reserved (0)                                         |
//!
//! Every policer operation runs under the sequencer lock of the bank holding the policer's
//! first word, so the whole 8-word update is atomic with respect to other policer
//! operations. The current time is always passed in by the caller, never read here.
//!
//! Refill: `CIR * elapsed_ns / 1e9` tokens (exact integer arithmetic with a carried
//! remainder, in `u128` so nothing overflows) go to Tc up to CBS, the rest to Te up to EBS; the
//! remainder is dropped once both buckets are full. Time going backwards adds nothing and
//! does not move the last-update time back. Marking a packet of `B` bytes: if `Tc >= B` then
//! `Tc -= B`, green; else if `Te >= B` then `Te -= B`, yellow; else red.

use std::sync::atomic::Ordering;

use super::bank::Span;
use super::{Addr, MemFault, SharedMemory};

/// Words one policer occupies: 7 of config + state, rounded to a 64-byte line.
pub const POLICER_WORDS: u64 = 8;

const W_CIR: usize = 0;
const W_CBS: usize = 1;
const W_EBS: usize = 2;
const W_TC: usize = 3;
const W_TE: usize = 4;
const W_LAST: usize = 5;
const W_REM: usize = 6;
const W_RESERVED: usize = 7;

const NS_PER_SEC: u128 = 1_000_000_000;

/// Policer colour (RFC 2697 single-rate three-colour marker, colour-blind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Color {
    /// Within the committed burst.
    Green,
    /// Within the excess burst.
    Yellow,
    /// Out of profile.
    Red,
}

impl Color {
    /// Lower-case name (`"green"`, `"yellow"`, `"red"`).
    pub fn name(self) -> &'static str {
        match self {
            Color::Green => "green",
            Color::Yellow => "yellow",
            Color::Red => "red",
        }
    }
}

/// A policer's parameters (RFC 2697).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicerConfig {
    /// Committed information rate, bytes per second.
    pub cir_bytes_per_sec: u64,
    /// Committed burst size, bytes (capacity of the Tc bucket).
    pub cbs_bytes: u64,
    /// Excess burst size, bytes (capacity of the Te bucket).
    pub ebs_bytes: u64,
}

/// A snapshot of a policer, as read by [`SharedMemory::policer_state`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicerState {
    /// The parameters it was initialised with.
    pub config: PolicerConfig,
    /// Tokens in the committed bucket (Tc), bytes.
    pub committed_tokens: u64,
    /// Tokens in the excess bucket (Te), bytes.
    pub excess_tokens: u64,
    /// Time of the last refill, ns.
    pub last_ns: u64,
}

/// The policer's words, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Raw {
    cir: u64,
    cbs: u64,
    ebs: u64,
    tc: u64,
    te: u64,
    last: u64,
    rem: u64,
}

impl Raw {
    fn load(s: &Span<'_>) -> Raw {
        let w = |i: usize| s.at(i).load(Ordering::Acquire);
        Raw {
            cir: w(W_CIR),
            cbs: w(W_CBS),
            ebs: w(W_EBS),
            tc: w(W_TC),
            te: w(W_TE),
            last: w(W_LAST),
            rem: w(W_REM),
        }
    }

    fn new(cfg: PolicerConfig, now_ns: u64) -> Raw {
        Raw {
            cir: cfg.cir_bytes_per_sec,
            cbs: cfg.cbs_bytes,
            ebs: cfg.ebs_bytes,
            tc: cfg.cbs_bytes,
            te: cfg.ebs_bytes,
            last: now_ns,
            rem: 0,
        }
    }

    fn refill(&mut self, now_ns: u64) {
        if now_ns <= self.last {
            return;
        }
        let elapsed = now_ns - self.last;
        self.last = now_ns;
        let total = u128::from(self.cir) * u128::from(elapsed) + u128::from(self.rem);
        let mut add = total / NS_PER_SEC;
        self.rem = (total % NS_PER_SEC) as u64;
        let to_c = add.min(u128::from(self.cbs.saturating_sub(self.tc)));
        self.tc += to_c as u64;
        add -= to_c;
        let to_e = add.min(u128::from(self.ebs.saturating_sub(self.te)));
        self.te += to_e as u64;
        if self.tc >= self.cbs && self.te >= self.ebs {
            self.rem = 0;
        }
    }

    fn police(&mut self, bytes: u64, now_ns: u64) -> Color {
        self.refill(now_ns);
        if self.tc >= bytes {
            self.tc -= bytes;
            Color::Green
        } else if self.te >= bytes {
            self.te -= bytes;
            Color::Yellow
        } else {
            Color::Red
        }
    }

    fn state(&self) -> PolicerState {
        PolicerState {
            config: PolicerConfig {
                cir_bytes_per_sec: self.cir,
                cbs_bytes: self.cbs,
                ebs_bytes: self.ebs,
            },
            committed_tokens: self.tc,
            excess_tokens: self.te,
            last_ns: self.last,
        }
    }
}

impl SharedMemory {
    /// Writes a policer's config and state into the [`POLICER_WORDS`] words at `addr`: both
    /// buckets start full and the clock starts at `now_ns`.
    pub fn policer_init(
        &self,
        addr: Addr,
        cfg: PolicerConfig,
        now_ns: u64,
    ) -> Result<(), MemFault> {
        let s = self.span(addr, POLICER_WORDS)?;
        let r = Raw::new(cfg, now_ns);
        let _engine = self.bank_lock(addr);
        let st = |i: usize, v: u64| s.at(i).store(v, Ordering::Release);
        st(W_CIR, r.cir);
        st(W_CBS, r.cbs);
        st(W_EBS, r.ebs);
        st(W_TC, r.tc);
        st(W_TE, r.te);
        st(W_LAST, r.last);
        st(W_REM, r.rem);
        st(W_RESERVED, 0);
        Ok(())
    }

    /// Marks a packet of `bytes` bytes at time `now_ns` with the policer at `addr` (refilling
    /// first), updating its buckets atomically. A never-initialised policer (all zero) marks
    /// every non-empty packet red.
    pub fn police(&self, addr: Addr, bytes: u64, now_ns: u64) -> Result<Color, MemFault> {
        let s = self.span(addr, POLICER_WORDS)?;
        let _engine = self.bank_lock(addr);
        let mut r = Raw::load(&s);
        let color = r.police(bytes, now_ns);
        let st = |i: usize, v: u64| s.at(i).store(v, Ordering::Release);
        st(W_TC, r.tc);
        st(W_TE, r.te);
        st(W_LAST, r.last);
        st(W_REM, r.rem);
        Ok(color)
    }

    /// A consistent snapshot of the policer at `addr` (without refilling it).
    pub fn policer_state(&self, addr: Addr) -> Result<PolicerState, MemFault> {
        let s = self.span_ro(addr, POLICER_WORDS)?;
        let _engine = self.bank_lock(addr);
        Ok(Raw::load(&s).state())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MemConfig, Region, DRAM_BASE};
    use super::*;

    const MS: u64 = 1_000_000;

    fn mem() -> SharedMemory {
        SharedMemory::new(&MemConfig {
            sram_bytes: 4096,
            dram_bytes: 4096,
            acc_bytes: 0,
            banks: 4,
        })
        .unwrap()
    }

    fn cfg(cir: u64, cbs: u64, ebs: u64) -> PolicerConfig {
        PolicerConfig {
            cir_bytes_per_sec: cir,
            cbs_bytes: cbs,
            ebs_bytes: ebs,
        }
    }

    #[test]
    fn burst_goes_green_yellow_red_and_refills() {
        let m = mem();
        for p in [64, DRAM_BASE + 8] {
            // 1 MB/s = 1 byte per 1000 ns
            m.policer_init(p, cfg(1_000_000, 3000, 2000), 10 * MS)
                .unwrap();
            let t = 10 * MS;
            let colours: Vec<Color> = (0..7).map(|_| m.police(p, 1000, t).unwrap()).collect();
            use Color::*;
            assert_eq!(colours, [Green, Green, Green, Yellow, Yellow, Red, Red]);
            let s = m.policer_state(p).unwrap();
            assert_eq!((s.committed_tokens, s.excess_tokens), (0, 0));
            // 1 ms later: 1000 bytes of tokens, all in Tc
            assert_eq!(m.police(p, 1000, t + MS), Ok(Green));
            assert_eq!(m.police(p, 1, t + MS), Ok(Red));
            // 4 ms later: 4000 tokens fill Tc (3000) and then Te (1000)
            assert_eq!(m.police(p, 0, t + 5 * MS), Ok(Green));
            let s = m.policer_state(p).unwrap();
            assert_eq!((s.committed_tokens, s.excess_tokens), (3000, 1000));
            assert_eq!(s.last_ns, t + 5 * MS);
            assert_eq!(s.config, cfg(1_000_000, 3000, 2000));
        }
    }

    #[test]
    fn exact_token_arithmetic_with_carry() {
        let m = mem();
        m.policer_init(0, cfg(1_000_000, 100, 100), 0).unwrap();
        assert_eq!(m.police(0, 100, 0), Ok(Color::Green));
        assert_eq!(m.police(0, 100, 0), Ok(Color::Yellow));
        // 1500 ns at 1 byte/us = 1.5 bytes: 1 token now, half a token carried
        assert_eq!(m.police(0, 0, 1500), Ok(Color::Green));
        assert_eq!(m.policer_state(0).unwrap().committed_tokens, 1);
        // another 500 ns completes the second byte
        m.police(0, 0, 2000).unwrap();
        assert_eq!(m.policer_state(0).unwrap().committed_tokens, 2);
        // 999 ns adds nothing visible; 1 ns more adds the third byte
        m.police(0, 0, 2999).unwrap();
        assert_eq!(m.policer_state(0).unwrap().committed_tokens, 2);
        m.police(0, 0, 3000).unwrap();
        assert_eq!(m.policer_state(0).unwrap().committed_tokens, 3);
        assert_eq!(m.police(0, 3, 3000), Ok(Color::Green));
        assert_eq!(m.police(0, 1, 3000), Ok(Color::Red));
        // many tiny steps add up exactly: 1000 steps of 7 ns = 7 bytes
        for i in 1..=1000u64 {
            m.police(0, 0, 3000 + 7 * i).unwrap();
        }
        assert_eq!(m.policer_state(0).unwrap().committed_tokens, 7);
    }

    #[test]
    fn time_going_backwards_adds_nothing() {
        let m = mem();
        m.policer_init(8, cfg(1_000_000_000, 1000, 0), 5000)
            .unwrap();
        assert_eq!(m.police(8, 1000, 5000), Ok(Color::Green));
        assert_eq!(m.police(8, 1, 1000), Ok(Color::Red));
        assert_eq!(m.police(8, 1, 0), Ok(Color::Red));
        assert_eq!(m.policer_state(8).unwrap().last_ns, 5000);
        // 1 GB/s = 1 byte/ns: 10 ns after the *latest* time gives 10 bytes
        assert_eq!(m.police(8, 10, 5010), Ok(Color::Green));
        assert_eq!(m.police(8, 1, 5010), Ok(Color::Red));
    }

    #[test]
    fn colour_blind_sizes() {
        let m = mem();
        m.policer_init(16, cfg(0, 100, 500), 0).unwrap();
        // larger than CBS but within EBS: yellow although Tc is full
        assert_eq!(m.police(16, 300, 0), Ok(Color::Yellow));
        assert_eq!(m.police(16, 100, 0), Ok(Color::Green));
        assert_eq!(m.police(16, 201, 0), Ok(Color::Red));
        assert_eq!(m.police(16, 200, 0), Ok(Color::Yellow));
        assert_eq!(m.police(16, 0, 0), Ok(Color::Green));
        // CIR 0 never refills
        assert_eq!(m.police(16, 1, u64::MAX), Ok(Color::Red));
    }

    #[test]
    fn uninitialised_policer_is_red() {
        let m = mem();
        assert_eq!(m.police(24, 1, 1_000_000), Ok(Color::Red));
        assert_eq!(m.police(24, 0, 1_000_000), Ok(Color::Green));
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let mut r = Raw::new(cfg(u64::MAX, u64::MAX, u64::MAX), 0);
        assert_eq!(r.police(u64::MAX, 0), Color::Green);
        assert_eq!(r.police(u64::MAX, 0), Color::Yellow);
        assert_eq!(r.police(1, 0), Color::Red);
        assert_eq!(r.police(u64::MAX, u64::MAX), Color::Green);
        assert_eq!(r.tc, 0);
        assert_eq!(r.te, u64::MAX);
        assert_eq!(r.rem, 0);
        let mut r = Raw::new(cfg(3, 10, 10), 0);
        r.tc = 0;
        r.refill(1); // 3e-9 bytes carried
        assert_eq!((r.tc, r.rem), (0, 3));
        r.refill(2);
        assert_eq!((r.tc, r.rem), (0, 6));
    }

    #[test]
    fn carry_dropped_when_buckets_full() {
        let mut r = Raw::new(cfg(1_000_000, 10, 10), 0);
        r.refill(1500);
        assert_eq!((r.tc, r.te, r.rem), (10, 10, 0));
        r.tc = 9;
        r.refill(2000); // 0.5 byte
        assert_eq!((r.tc, r.rem), (9, 500_000_000));
        r.refill(2500); // completes a byte; bucket full again
        assert_eq!((r.tc, r.te, r.rem), (10, 10, 0));
    }

    #[test]
    fn layout_in_shared_memory() {
        let m = mem();
        m.write_u64(32 + 7, 99).unwrap();
        m.policer_init(32, cfg(11, 22, 33), 44).unwrap();
        let words: Vec<u64> = (32..40).map(|a| m.read_u64(a).unwrap()).collect();
        assert_eq!(words, [11, 22, 33, 22, 33, 44, 0, 0]);
        m.police(32, 5, 44).unwrap();
        assert_eq!(m.read_u64(32 + 3), Ok(17));
        assert_eq!(m.read_u64(40), Ok(0));
    }

    #[test]
    fn unaligned_policer_spanning_two_lines() {
        let m = mem();
        m.policer_init(4, cfg(0, 10, 0), 0).unwrap();
        assert_ne!(m.bank_of(4), m.bank_of(4 + 7));
        assert_eq!(m.police(4, 10, 0), Ok(Color::Green));
        assert_eq!(m.police(4, 1, 0), Ok(Color::Red));
        assert_eq!(m.read_u64(4 + 3), Ok(0));
    }

    #[test]
    fn range_checks() {
        let m = mem();
        let sram_end = m.region(Region::Sram).end;
        let dram_end = m.region(Region::Dram).end;
        for end in [sram_end, dram_end] {
            let ok = end - POLICER_WORDS;
            m.policer_init(ok, cfg(1, 1, 1), 0).unwrap();
            assert_eq!(m.police(ok, 1, 0), Ok(Color::Green));
            let bad = ok + 1;
            let f = Err(MemFault::OutOfRange {
                addr: bad,
                words: POLICER_WORDS,
            });
            assert_eq!(m.policer_init(bad, cfg(1, 1, 1), 0), f);
            assert_eq!(m.police(bad, 1, 0).map(|_| ()), f);
            assert_eq!(m.policer_state(bad).map(|_| ()), f);
        }
        for bad in [DRAM_BASE - 1, DRAM_BASE - 8, sram_end, u64::MAX] {
            let f = Err(MemFault::OutOfRange {
                addr: bad,
                words: POLICER_WORDS,
            });
            assert_eq!(m.police(bad, 1, 0).map(|_| ()), f);
        }
    }

    #[test]
    fn colour_names() {
        assert_eq!(Color::Green.name(), "green");
        assert_eq!(Color::Yellow.name(), "yellow");
        assert_eq!(Color::Red.name(), "red");
    }
}
