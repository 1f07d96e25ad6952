//! The reorder engine against its contract, on batches stamped as ingress stamps them and
//! completed in shuffled orders: every packet leaves exactly once, each context's packets
//! leave in sequence order, every batch is retired exactly once and only once all its
//! packets have left, and what the engine reports held is what waited.

#![allow(clippy::vec_box)] // batches travel boxed, as the engine moves them

use std::sync::Mutex;

use proptest::prelude::*;

use super::batch::{packet_id, Batch, Completion, FrameAt, Slot};
use super::egress::{Frames, PortQueues, Sink, TxCounters};
use super::ingress::IngressState;
use super::reorder::{Outlet, ReorderStage};
use crate::packet::{Dest, Port};

/// Records every frame it is given: (context, sequence number) read back from the frame.
#[derive(Default)]
struct Recorder(Mutex<Vec<(u32, u32)>>);

impl Sink for Recorder {
    fn deliver(&self, _port: Port, frames: Frames<'_>) {
        let mut seen = self.0.lock().unwrap();
        for f in frames.iter() {
            let ctx = u32::from_le_bytes(f[0..4].try_into().unwrap());
            let seq = u32::from_le_bytes(f[4..8].try_into().unwrap());
            seen.push((ctx, seq));
        }
    }
}

/// Batches of the given sizes over `contexts` contexts, stamped as ingress does, each
/// packet finished by a "program" that forwards it (its frame: context and sequence
/// number) or, when `dropped` says so, drops it.
fn stamped(sizes: &[usize], ctxs: &[u32], dropped: &[bool], contexts: usize) -> Vec<Box<Batch>> {
    let mut ing = IngressState::new(contexts);
    let mut k = 0;
    let mut batches = Vec::new();
    for &n in sizes {
        let mut b = Box::new(Batch::with_capacity(n));
        ing.last_batch += 1;
        b.seq = ing.last_batch;
        for i in 0..n {
            let ctx = ctxs[k % ctxs.len()] % contexts as u32;
            let seq = ing.next_seq[ctx as usize];
            ing.next_seq[ctx as usize] += 1;
            let pred = ing.last[ctx as usize];
            ing.last[ctx as usize] = packet_id(b.seq, i);
            let off = b.frames.len() as u32;
            b.frames.extend_from_slice(&ctx.to_le_bytes());
            b.frames.extend_from_slice(&seq.to_le_bytes());
            b.slots.push(Slot {
                pred,
                at: FrameAt::copied(off as usize),
                len: 8,
                port: 0,
            });
            b.flows.push((ctx, seq));
            let outs_start = b.out.recs.len() as u32;
            let own = !dropped[k % dropped.len()];
            if own {
                b.out.push_in_place(Dest::Port(0), off, 8);
            }
            b.done.push(Completion {
                pred,
                outs_start,
                outs_end: b.out.recs.len() as u32,
                own,
                released: false,
            });
            k += 1;
        }
        batches.push(b);
    }
    batches
}

/// Completes `batches` in the order `order` gives (a permutation), checks the contract,
/// and returns how many packets were held. With `hint`, each batch says after which batch
/// it may leave whole ([`Batch::whole_after`]), as a PPE thread does.
fn complete_all(batches: Vec<Box<Batch>>, order: &[usize], hint: bool) -> u64 {
    let total: usize = batches.iter().map(|b| b.slots.len()).sum();
    let forwarded: Vec<(u32, u32)> = batches
        .iter()
        .flat_map(|b| {
            b.flows
                .iter()
                .zip(&b.done)
                .filter(|(_, c)| c.own)
                .map(|(&flow, _)| flow)
                .collect::<Vec<_>>()
        })
        .collect();
    let sizes: Vec<usize> = batches.iter().map(|b| b.slots.len()).collect();
    let mut slots: Vec<Option<Box<Batch>>> = batches.into_iter().map(Some).collect();
    let stage = ReorderStage::new(64);
    let sink = Recorder::default();
    let tx = TxCounters::new(1, 1);
    let out = Outlet::plain(&sink, &tx);
    let mut retired = vec![false; sizes.len()];
    let mut released = 0u64;
    let mut queues = PortQueues::new(1);
    for &i in order {
        let mut b = slots[i].take().expect("each batch completed once");
        if hint {
            b.whole_after = Some(b.latest_pred_batch());
        }
        stage.finish(b, out, &mut queues, |b, n| {
            released += n;
            if let Some(b) = b {
                let i = (b.seq - 1) as usize;
                assert!(!retired[i], "batch {} retired twice", b.seq);
                // A batch that left whole was not walked, so its packets carry no flag.
                assert!(
                    b.whole_after.is_some() || b.done.iter().all(|c| c.released),
                    "batch {} retired early",
                    b.seq
                );
                retired[i] = true;
            }
        });
    }
    assert_eq!(released, total as u64, "every packet released once");
    assert!(retired.iter().all(|&r| r), "every batch retired");
    let seen = sink.0.into_inner().unwrap();
    let mut want = forwarded.clone();
    want.sort_unstable();
    let mut got = seen.clone();
    got.sort_unstable();
    assert_eq!(got, want, "every forwarded packet left exactly once");
    // Per context, in sequence order.
    let mut last = std::collections::HashMap::new();
    for (ctx, seq) in seen {
        if let Some(prev) = last.insert(ctx, seq) {
            assert!(seq > prev, "context {ctx}: {seq} left after {prev}");
        }
    }
    stage.held_total()
}

/// A permutation of `0..n` that moves each index at most `spread` places back or so: PPE
/// threads finish batches out of order, not arbitrarily far apart (any order is allowed;
/// the spread only makes chains of waiters likely).
fn shuffled(n: usize, keys: &[u32], spread: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| i + (keys[i % keys.len()] as usize % (spread + 1)));
    order
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_packet_leaves_once_in_context_order(
        sizes in prop::collection::vec(1usize..12, 1..40),
        ctxs in prop::collection::vec(0u32..64, 1..50),
        contexts in prop::sample::select(vec![1usize, 2, 4, 64]),
        dropped in prop::collection::vec(prop::bool::weighted(0.2), 1..10),
        keys in prop::collection::vec(0u32..1000, 1..50),
        spread in 0usize..12,
    ) {
        let batches = stamped(&sizes, &ctxs, &dropped, contexts);
        let order = shuffled(batches.len(), &keys, spread);
        let held = complete_all(batches, &order, false);
        // The same, each batch saying after which batch it may leave whole, as a PPE
        // thread does: the same packets wait.
        let batches = stamped(&sizes, &ctxs, &dropped, contexts);
        prop_assert_eq!(complete_all(batches, &order, true), held);
    }
}

/// In order, nothing waits; in reverse, every packet of a context seen earlier waits, and
/// a packet waits for the one just before it in its own batch when that one waits.
#[test]
fn completed_in_order_nothing_waits_and_in_reverse_every_later_packet_does() {
    let sizes = [4, 4, 4];
    // One context for all: a single chain through the three batches.
    let in_order = complete_all(stamped(&sizes, &[0], &[false], 1), &[0, 1, 2], false);
    assert_eq!(in_order, 0);
    let reverse = complete_all(stamped(&sizes, &[0], &[false], 1), &[2, 1, 0], false);
    assert_eq!(reverse, 8, "batches 3 and 2 wait whole for batch 1");
    // Two contexts alternating, batch 2 first: its packets wait for batch 1's.
    let two = complete_all(stamped(&[2, 2], &[0, 1], &[false], 2), &[1, 0], false);
    assert_eq!(two, 2);
    // Contexts of batch 2 that batch 1 never had leave at once.
    let apart = complete_all(stamped(&[2, 2], &[0, 1, 2, 3], &[false], 4), &[1, 0], false);
    assert_eq!(apart, 0);
}

/// One completion that frees held packets of many earlier-completed batches hands all of
/// their frames to the sink, in order: here batch 1, completed last, frees a chain through
/// the 19 batches after it (more than the egress flush lists without allocating), and with
/// 5 batches (fewer) the same holds.
#[test]
fn a_completion_that_frees_many_batches_delivers_them_all_in_order() {
    for n in [5usize, 20] {
        let sizes = vec![3; n];
        let reverse: Vec<usize> = (0..n).rev().collect();
        let held = complete_all(stamped(&sizes, &[0], &[false], 1), &reverse, false);
        assert_eq!(
            held,
            3 * (n as u64 - 1),
            "every batch but the first waits whole"
        );
    }
}
