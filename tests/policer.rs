//! The read-modify-write engines' policer (RFC 2697 srTCM) through a program on a running
//! engine: `Thread::police` marks each packet at the engine's clock, so a manual clock
//! decides every refill, and the colours come out exact however many PPE threads share the
//! policer.

mod common;

use std::sync::Arc;

use pfemu::prelude::*;
use pfemu::timer::ManualClock;

use common::{small_memory, udp_frame};

const MS: u64 = 1_000_000;

/// 100-byte frames: each takes 100 tokens.
const FRAME: usize = 100;

/// Polices every packet by its length with the policer at `at`: green to port 0, yellow to
/// port 1, red dropped as `red`.
fn policing_program(at: Addr) -> Program {
    let mut p = Program::builder("police");
    let police = p.label("police");
    let red = p.drop_reason("red");
    p.instr(police, move |t| {
        let bytes = t.pkt_len() as u64;
        Ok(Done(match t.police(at, bytes)? {
            Color::Green => Verdict::Forward(0),
            Color::Yellow => Verdict::Forward(1),
            Color::Red => Verdict::Drop(red),
        }))
    });
    p.entry(Entry::Packet, police);
    p.build().expect("builds")
}

/// `n` frames of `FRAME` bytes over 64 flows, in one burst, then a drain.
fn offer(pfe: &Pfe, n: u32) {
    let frames: Vec<Vec<u8>> = (0..n)
        .map(|i| udp_frame((i % 64) as u16, i, FRAME))
        .collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .expect("taken");
    pfe.drain();
}

/// What the engine did with every packet so far: (green, yellow, red).
fn colours(pfe: &Pfe, sink: &CountingSink) -> (u64, u64, u64) {
    let stats = pfe.stats();
    assert!(stats.is_conserved(), "{stats:?}");
    let red = stats.dropped_by_reason.get("red").copied().unwrap_or(0);
    (sink.packets(0), sink.packets(1), red)
}

#[test]
fn a_program_polices_at_the_engine_clock_exactly_on_any_number_of_threads() {
    // 1 MB/s, a committed burst of 100 frames and an excess burst of 50.
    let cfg = PolicerConfig {
        cir_bytes_per_sec: 1_000_000,
        cbs_bytes: 100 * FRAME as u64,
        ebs_bytes: 50 * FRAME as u64,
    };
    for threads in [1, 8] {
        let mem = small_memory();
        let at = mem
            .alloc("policer", Region::Sram, pfemu::mem::POLICER_WORDS)
            .expect("room for a policer");
        mem.policer_init(at, cfg, 0).expect("in range");
        let clock = Arc::new(ManualClock::new());
        let sink = Arc::new(CountingSink::new(2));
        let mut pfe = Pfe::builder()
            .program(policing_program(at))
            .memory(mem.clone())
            .clock(clock.clone())
            .ppe_threads(threads)
            .sink(sink.clone())
            .build()
            .expect("builds");
        pfe.start().expect("starts");

        // At 0 both buckets are full: 100 frames fit the committed one, 50 the excess one,
        // and nothing refills while the clock stands, whichever thread asks first.
        offer(&pfe, 2_000);
        assert_eq!(colours(&pfe, &sink), (100, 50, 1_850), "{threads} threads");

        // 5 ms at 1 MB/s: 5 000 bytes, all into the committed bucket (below its size).
        clock.set(5 * MS);
        offer(&pfe, 100);
        assert_eq!(colours(&pfe, &sink), (150, 50, 1_900), "{threads} threads");

        // A second later both buckets are full again, the rest of the refill dropped.
        clock.set(1_005 * MS);
        offer(&pfe, 160);
        assert_eq!(colours(&pfe, &sink), (250, 100, 1_910), "{threads} threads");

        let state = mem.policer_state(at).expect("in range");
        assert_eq!(
            (state.committed_tokens, state.excess_tokens, state.last_ns),
            (0, 0, 1_005 * MS),
            "{threads} threads: {state:?}"
        );
        let stats = pfe.stats();
        assert_eq!(stats.xtxns.get("police"), Some(&2_260), "{stats:?}");
        pfe.shutdown();
    }
}
