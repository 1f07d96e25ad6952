//! A few arbitrary frames through a running `Pfe` with the filter, then `drain`: every
//! packet in is accounted for (`Stats::is_conserved`) and nothing stays in flight.
//!
//! Input: a sequence of records `[port, len, len bytes of frame]` (the last may be short).
//! The engine is built and started once per process; its counters only grow.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use pfemu::microcode::filter::Filter;
use pfemu::prelude::*;

fn pfe() -> &'static Mutex<Pfe> {
    static PFE: OnceLock<Mutex<Pfe>> = OnceLock::new();
    PFE.get_or_init(|| {
        let mem = Arc::new(
            SharedMemory::new(&MemConfig {
                sram_bytes: 1 << 20,
                dram_bytes: 1 << 20,
                acc_bytes: 0,
                banks: 16,
            })
            .expect("memory"),
        );
        let filter = Filter::install(&mem).expect("filter");
        let mut pfe = Pfe::builder()
            .program(filter.program())
            .memory(mem)
            .ppe_threads(2)
            .pin_threads(false)
            .sink(Arc::new(Discard))
            .build()
            .expect("pfe");
        pfe.start().expect("start");
        Mutex::new(pfe)
    })
}

fuzz_target!(|data: &[u8]| {
    let pfe = pfe().lock().unwrap();
    let mut rest = data;
    let mut frames = 0;
    while let [port, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (frame, next) = tail.split_at(n);
        // Refusals (an empty or oversized frame, a bad port) are errors, not panics.
        let _ = pfe.inject_frame(Port::from(*port % 8), frame);
        rest = next;
        frames += 1;
        if frames == 16 {
            break;
        }
    }
    pfe.drain();
    let stats = pfe.stats();
    assert!(stats.is_conserved(), "not conserved: {stats:?}");
    assert_eq!(
        stats.in_flight, 0,
        "drain left packets in flight: {stats:?}"
    );
});
