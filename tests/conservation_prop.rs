//! Property test: random frames through the whole engine. A program whose verdict depends
//! on the frame's bytes sends each to a different fate; the test computes what must happen
//! to every frame on its own and checks the engine's counters and the sink against it.

use std::sync::Arc;

use proptest::prelude::*;

use pfemu::prelude::*;

const PORTS: usize = 4;
const MAX_FRAME: usize = 1518;

/// The fate the program chooses from a frame's byte 14 (frames of 14 bytes or more).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Forward(u16),
    BadPort,
    Drop,
    Consume,
    Multicast,
    BadGroup,
    Fault,
    ForwardAndCreate,
}

fn fate(frame: &[u8]) -> Fate {
    let b = frame.get(14).copied().unwrap_or(0);
    match b % 8 {
        0 => Fate::Forward(b as u16 / 8 % PORTS as u16),
        1 => Fate::BadPort,
        2 => Fate::Drop,
        3 => Fate::Consume,
        4 => Fate::Multicast,
        5 => Fate::BadGroup,
        6 => Fate::Fault,
        _ => Fate::ForwardAndCreate,
    }
}

fn program() -> Program {
    let mut p = Program::builder("fates");
    let a = p.label("a");
    let chosen = p.drop_reason("chosen");
    p.instr(a, move |t| {
        // Reads byte 14 from the head when there is one (frames of exactly 14 bytes have
        // an empty rest: `fate` sees 0 for them too).
        let b = t.head(0)?.get(14).copied().unwrap_or(0);
        Ok(Done(match b % 8 {
            0 => Verdict::Forward(b as u16 / 8 % PORTS as u16),
            1 => Verdict::Forward(PORTS as u16 + 1),
            2 => Verdict::Drop(chosen),
            3 => Verdict::Consume,
            4 => Verdict::Multicast(1),
            5 => Verdict::Multicast(9),
            6 => return Err(FaultDetail::InstructionBudget(0).into()),
            _ => {
                t.emit(Dest::Port(0), t.head_offset(), 14)?;
                Verdict::Forward(3)
            }
        }))
    });
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

fn frame_strategy() -> impl Strategy<Value = (u16, Vec<u8>)> {
    let len = prop_oneof![
        0usize..14,
        14usize..200,
        200usize..MAX_FRAME + 1,
        Just(MAX_FRAME + 1)
    ];
    (0u16..PORTS as u16, len, any::<u8>()).prop_map(|(port, len, b)| {
        let mut f = vec![0x5a; len];
        if len > 14 {
            f[14] = b;
        }
        (port, f)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_frame_is_accounted_for(
        frames in proptest::collection::vec(frame_strategy(), 1..600),
        threads in 1usize..48,
        reorder in any::<bool>(),
        batch in 1usize..64,
    ) {
        let sink = Arc::new(CountingSink::new(PORTS));
        let mut pfe = Pfe::builder()
            .program(program())
            .ppe_threads(threads)
            .reorder(reorder)
            .batch_size(batch)
            .capacity(256.max(batch))
            .ports(PORTS)
            .multicast_group(1, vec![0, 2])
            .max_frame_bytes(MAX_FRAME)
            .sink(sink.clone())
            .build()
            .unwrap();
        pfe.start().unwrap();
        pfe.inject_burst(frames.iter().map(|(p, f)| (*p, &f[..]))).unwrap();
        let s = pfe.shutdown();

        // What must have happened, frame by frame.
        let (mut runt, mut oversize, mut out, mut mcast, mut consumed) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut chosen, mut bad_port, mut bad_group, mut faults, mut created) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut tx = [0u64; PORTS];
        for (_, f) in &frames {
            if f.len() < 14 { runt += 1; continue; }
            if f.len() > MAX_FRAME { oversize += 1; continue; }
            match fate(f) {
                Fate::Forward(p) => { out += 1; tx[p as usize] += 1; }
                Fate::BadPort => bad_port += 1,
                Fate::Drop => chosen += 1,
                Fate::Consume => consumed += 1,
                Fate::Multicast => { out += 1; mcast += 1; tx[0] += 1; tx[2] += 1; }
                Fate::BadGroup => bad_group += 1,
                Fate::Fault => faults += 1,
                Fate::ForwardAndCreate => { out += 1; created += 1; tx[3] += 1; tx[0] += 1; }
            }
        }
        prop_assert_eq!(s.packets_in, frames.len() as u64);
        prop_assert!(s.is_conserved(), "{:?}", s);
        prop_assert_eq!(s.in_flight, 0);
        prop_assert_eq!(s.packets_out, out);
        prop_assert_eq!(s.multicast, mcast);
        prop_assert_eq!(s.consumed, consumed);
        prop_assert_eq!(s.drops("runt"), runt);
        prop_assert_eq!(s.drops("oversize"), oversize);
        prop_assert_eq!(s.drops("chosen"), chosen);
        prop_assert_eq!(s.drops("no_such_port"), bad_port);
        prop_assert_eq!(s.drops("no_such_group"), bad_group);
        prop_assert_eq!(s.faults_of(FaultKind::InstructionBudget), faults);
        prop_assert_eq!(s.created, created);
        for (port, &n) in tx.iter().enumerate() {
            prop_assert_eq!(sink.packets(port as u16), n, "port {}", port);
        }
        prop_assert_eq!(s.frames_tx, tx.iter().sum::<u64>());
    }
}
