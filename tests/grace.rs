//! Grace periods ([`Control::wait_quiescent`]): they wait for every PPE thread still running
//! work taken before them, and for nothing else (idle threads, a stopped engine).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pfemu::pfe::{Control, ControlError};
use pfemu::prelude::*;

use common::{small_mem, udp_frame};

/// How long a test waits for something that must happen: a deadline for a hang, not a
/// measure of speed.
const PATIENCE: Duration = Duration::from_secs(30);

fn patience() -> Instant {
    Instant::now() + PATIENCE
}

/// A program whose packets of flow 1 stop at the first instruction until the test sends
/// on the returned channel (telling it first on the other); other packets forward.
/// A packet reads `job` first and, if it is set, sets `block` after being let go: a
/// packet that looked a job up before its removal and creates a block after it.
struct Holding {
    program: Program,
    go: mpsc::Sender<()>,
    held: mpsc::Receiver<()>,
    job: Arc<AtomicU64>,
    block: Arc<AtomicU64>,
}

fn holding() -> Holding {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (go_rx, held_tx) = (Mutex::new(go_rx), Mutex::new(held_tx));
    let job = Arc::new(AtomicU64::new(1));
    let block = Arc::new(AtomicU64::new(0));
    let mut p = Program::builder("holding");
    let [pkt] = p.labels(["packet"]);
    {
        let (job, block) = (job.clone(), block.clone());
        p.instr(pkt, move |t| {
            let saw_job = job.load(Ordering::Relaxed) == 1;
            if common::flow_seq(t.head(0)?).0 == 1 {
                held_tx.lock().send(()).unwrap();
                go_rx
                    .lock()
                    .recv_timeout(PATIENCE)
                    .expect("the test lets the held packet go on");
            }
            if saw_job {
                block.store(1, Ordering::Relaxed);
            }
            Ok(Done(Verdict::Forward(1)))
        });
    }
    p.entry(Entry::Packet, pkt);
    Holding {
        program: p.build().unwrap(),
        go: go_tx,
        held: held_rx,
        job,
        block,
    }
}

fn engine(program: Program, threads: usize) -> Pfe {
    Pfe::builder()
        .program(program)
        .ppe_threads(threads)
        .batch_size(1)
        .mem_config(small_mem())
        .build()
        .unwrap()
}

#[test]
fn an_engine_not_started_or_stopped_is_quiescent_at_once() {
    let pfe = engine(holding().program, 4);
    let control = pfe.control();
    // A deadline already passed: only an answer without waiting passes.
    assert_eq!(control.wait_quiescent(Instant::now()), Ok(()));
    let mut pfe = pfe;
    pfe.start().unwrap();
    pfe.shutdown();
    assert_eq!(control.wait_quiescent(Instant::now()), Ok(()));
}

#[test]
fn idle_threads_end_a_grace_period() {
    let mut pfe = engine(holding().program, 8);
    pfe.start().unwrap();
    for seq in 0..64 {
        pfe.inject_frame(0, &udp_frame(7, seq, 64)).unwrap();
    }
    pfe.drain();
    let control = pfe.control();
    // Every thread goes idle (or never took work): each grace period ends.
    for _ in 0..100 {
        control
            .wait_quiescent(patience())
            .expect("a grace period of an idle engine ends");
    }
    pfe.shutdown();
}

#[test]
fn busy_threads_end_a_grace_period_by_taking_new_work() {
    let mut pfe = engine(holding().program, 4);
    pfe.start().unwrap();
    let control = pfe.control();
    let pfe = Arc::new(pfe);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let injector = {
        let (pfe, stop) = (pfe.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                pfe.inject_frame(0, &udp_frame(7, seq, 64)).unwrap();
                seq += 1;
            }
        })
    };
    for _ in 0..200 {
        control
            .wait_quiescent(patience())
            .expect("a grace period of a busy engine ends");
    }
    stop.store(true, Ordering::Relaxed);
    injector.join().unwrap();
    Arc::try_unwrap(pfe).ok().unwrap().shutdown();
}

/// A packet held inside its program across a removal holds the grace period up (a
/// deadline reached is an error naming it, not a hang), and its late write is visible
/// once the grace period ends, so a sweep after it catches it.
#[test]
fn a_packet_in_flight_holds_the_grace_period_up() {
    let h = holding();
    let mut pfe = engine(h.program, 4);
    pfe.start().unwrap();
    let control: Control = pfe.control();
    pfe.inject_frame(0, &udp_frame(1, 0, 64)).unwrap();
    h.held
        .recv_timeout(PATIENCE)
        .expect("the packet of flow 1 reaches its program");
    // The job goes away while the packet that looked it up is held.
    h.job.store(0, Ordering::Relaxed);
    // Each grace period with its deadline already passed reports the threads still busy:
    // the others go idle (no work), the held one never does while held.
    let give_up = patience();
    loop {
        match control.wait_quiescent(Instant::now()) {
            Err(ControlError::GraceTimeout {
                busy: 1,
                threads: 4,
            }) => break,
            Err(ControlError::GraceTimeout { busy, threads: 4 }) if busy > 1 => {
                assert!(Instant::now() < give_up, "the idle threads never park");
                std::thread::yield_now();
            }
            other => panic!("the held packet must hold the grace period up, got {other:?}"),
        }
    }
    let err = control.wait_quiescent(Instant::now()).unwrap_err();
    assert!(err.to_string().contains("1 of 4 PPE threads"), "{err}");
    // Other packets (taken after the removal) do not see the job.
    for seq in 0..16 {
        pfe.inject_frame(0, &udp_frame(2, seq, 64)).unwrap();
    }
    h.go.send(()).unwrap();
    control
        .wait_quiescent(patience())
        .expect("the grace period ends once the held packet is done");
    // The held packet's block is there for the sweep to find.
    assert_eq!(h.block.load(Ordering::Relaxed), 1);
    h.block.store(0, Ordering::Relaxed);
    pfe.drain();
    assert_eq!(
        h.block.load(Ordering::Relaxed),
        0,
        "a packet taken after the removal saw the job"
    );
    pfe.shutdown();
}

/// Many PPE threads, two injectors and several waiters at once: every grace period ends,
/// and when the checking waiter's ends, no packet that read the generation it retired is
/// still running (each packet counts itself in and out under the generation it read).
#[test]
fn many_threads_and_waiters_agree_no_packet_of_a_retired_generation_runs() {
    const RING: usize = 64;
    let generation = Arc::new(AtomicU64::new(0));
    let running: Arc<Vec<AtomicU64>> = Arc::new((0..RING).map(|_| AtomicU64::new(0)).collect());
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..RING).map(|_| AtomicU64::new(0)).collect());
    let mut p = Program::builder("counting");
    let [pkt] = p.labels(["packet"]);
    {
        let (generation, running) = (generation.clone(), running.clone());
        let started = started.clone();
        p.instr(pkt, move |_| {
            let g = generation.load(Ordering::Relaxed) as usize % RING;
            running[g].fetch_add(1, Ordering::Relaxed);
            started[g].fetch_add(1, Ordering::Relaxed);
            // Some work, so that packets overlap the waiters' looks.
            let mut x = 0u64;
            for i in 0..2000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            std::hint::black_box(x);
            running[g].fetch_sub(1, Ordering::Release);
            Ok(Done(Verdict::Forward(1)))
        });
    }
    p.entry(Entry::Packet, pkt);
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(16)
        .batch_size(4)
        .mem_config(small_mem())
        .build()
        .unwrap();
    pfe.start().unwrap();
    let control = pfe.control();
    let pfe = Arc::new(pfe);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let injectors: Vec<_> = (0..2u16)
        .map(|port| {
            let (pfe, stop) = (pfe.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    pfe.inject_frame(port, &udp_frame(7, seq, 64)).unwrap();
                    seq += 1;
                }
            })
        })
        .collect();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let control = control.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    control
                        .wait_quiescent(patience())
                        .expect("a grace period among others ends");
                }
            })
        })
        .collect();
    for round in 0..200u64 {
        // Retire a generation only once packets run under it, so that some may be in
        // flight when it is retired.
        let current = generation.load(Ordering::SeqCst) as usize % RING;
        let give_up = patience();
        while started[current].load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < give_up, "round {round}: no packet runs");
            std::thread::yield_now();
        }
        started[(current + 1) % RING].store(0, Ordering::Relaxed);
        let retired = generation.fetch_add(1, Ordering::SeqCst) as usize % RING;
        control
            .wait_quiescent(patience())
            .expect("the checking waiter's grace period ends");
        assert_eq!(
            running[retired].load(Ordering::Acquire),
            0,
            "round {round}: a packet of the retired generation still runs"
        );
    }
    for w in waiters {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for i in injectors {
        i.join().unwrap();
    }
    let stats = Arc::try_unwrap(pfe).ok().unwrap().shutdown();
    assert!(stats.packets_in > 0);
}
