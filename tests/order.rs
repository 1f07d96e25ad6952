//! Per-flow order, after DPDK's `order_queue` test: many flows, every packet carrying its
//! flow's sequence number, PPE threads taking random time per packet; the sink checks that
//! each flow's packets arrive exactly in sequence.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pfemu::prelude::*;

use common::{flow_seq, udp_frame, Rng};

/// A program that forwards every packet after a delay derived from its bytes: every 150th
/// packet of a flow sleeps 2 ms (long enough for other threads to overtake it, on any number
/// of cores: a stalled engine wakes another PPE thread after 1 ms), others sleep briefly,
/// yield, or spin for a random while.
fn delaying_program() -> Program {
    let mut p = Program::builder("delay");
    let [work, out] = p.labels(["work", "out"]);
    p.instr(work, move |t| {
        let h = t.head(46)?;
        let seq = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as u64;
        let mut r = Rng(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        if seq.is_multiple_of(150) {
            std::thread::sleep(Duration::from_millis(2));
            return Ok(Goto(out));
        }
        match r.below(100) {
            0 => std::thread::sleep(Duration::from_micros(200)),
            1..=9 => std::thread::yield_now(),
            _ => {
                for _ in 0..r.below(2_000) {
                    std::hint::spin_loop();
                }
            }
        }
        Ok(Goto(out))
    });
    p.instr(out, |_t| Ok(Done(Verdict::Forward(0))));
    p.entry(Entry::Packet, work);
    p.build().unwrap()
}

struct OrderCheck {
    next: Mutex<HashMap<u32, u32>>,
    violations: Mutex<u64>,
}

/// Sends `flows * per_flow` packets, interleaving flows randomly; returns
/// (packets delivered, order violations seen at the sink).
fn run(threads: usize, reorder: bool, flows: u16, per_flow: u32, batch: usize) -> (u64, u64) {
    let check = Arc::new(OrderCheck {
        next: Mutex::new(HashMap::new()),
        violations: Mutex::new(0),
    });
    let c2 = check.clone();
    let delivered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let d2 = delivered.clone();
    let sink = FnSink(move |_port: Port, frame: &[u8]| {
        let (flow, seq) = flow_seq(frame);
        let mut next = c2.next.lock();
        let want = next.entry(flow).or_insert(0);
        if seq != *want {
            *c2.violations.lock() += 1;
        }
        *want = seq + 1;
        d2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let mut pfe = Pfe::builder()
        .program(delaying_program())
        .ppe_threads(threads)
        .reorder(reorder)
        .batch_size(batch)
        .capacity(4096)
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let mut seqs = vec![0u32; flows as usize];
    let mut rng = Rng(7);
    let mut left: Vec<u16> = (0..flows).collect();
    let mut frames = Vec::new();
    while !left.is_empty() {
        let i = rng.below(left.len() as u64) as usize;
        let flow = left[i];
        frames.push(udp_frame(flow, seqs[flow as usize], 64));
        seqs[flow as usize] += 1;
        if seqs[flow as usize] == per_flow {
            left.swap_remove(i);
        }
    }
    // Bursts of random length, so batches mix flows differently each time.
    let mut at = 0;
    while at < frames.len() {
        let n = (1 + rng.below(64) as usize).min(frames.len() - at);
        pfe.inject_burst(frames[at..at + n].iter().map(|f| (0, &f[..])))
            .unwrap();
        at += n;
    }
    pfe.drain();
    let stats = pfe.shutdown();
    assert!(stats.is_conserved(), "{stats:?}");
    assert_eq!(stats.packets_out, frames.len() as u64);
    let v = *check.violations.lock();
    (delivered.load(std::sync::atomic::Ordering::Relaxed), v)
}

#[test]
fn per_flow_order_holds_with_256_ppe_threads_and_random_delays() {
    let (delivered, violations) = run(256, true, 64, 300, 8);
    assert_eq!(delivered, 64 * 300);
    assert_eq!(violations, 0, "packets of a flow left out of order");
}

#[test]
fn per_flow_order_holds_with_single_packet_batches() {
    let (delivered, violations) = run(64, true, 16, 500, 1);
    assert_eq!(delivered, 16 * 500);
    assert_eq!(violations, 0);
}

#[test]
fn without_reordering_the_same_load_does_leave_out_of_order() {
    // Shows the check above can fail: the delays do reorder packets when nothing restores
    // the order.
    let (delivered, violations) = run(256, false, 64, 300, 1);
    assert_eq!(delivered, 64 * 300);
    assert!(
        violations > 0,
        "expected the random delays to reorder some packets"
    );
}
