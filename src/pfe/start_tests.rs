//! `Pfe::start` when the operating system refuses a thread: an error that says how many
//! threads started and why, and the started ones stopped again (issue 13). The refusal is
//! injected through `start_with`, so the tests do not depend on the machine's limits.

use std::io;
use std::sync::Arc;

use std::thread::JoinHandle;

use super::*;
use crate::packet::Packet;
use crate::program::{Done, Entry, Verdict};
use crate::timer::{ManualClock, TimerSpec};

fn program(with_timer: bool) -> Program {
    let mut p = Program::builder("forward");
    let a = p.label("a");
    p.instr(a, |_t| Ok(Done(Verdict::Forward(0))));
    p.entry(Entry::Packet, a);
    if with_timer {
        p.entry(Entry::Timer(0), a);
    }
    p.build().expect("a valid program")
}

/// Spawns the first `ok` threads for real, then refuses every other one as the kernel does
/// when it has no memory for a stack.
fn refusing_after(
    ok: usize,
) -> impl FnMut(std::thread::Builder, Box<dyn FnOnce() + Send>) -> io::Result<JoinHandle<()>> {
    let mut n = 0;
    move |builder, body| {
        n += 1;
        if n > ok {
            Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "Resource temporarily unavailable",
            ))
        } else {
            builder.spawn(body)
        }
    }
}

#[test]
fn a_refused_ppe_thread_is_an_error_and_the_started_ones_stop() {
    let mut pfe = Pfe::builder()
        .program(program(false))
        .ppe_threads(8)
        .build()
        .expect("build");
    let e = pfe.start_with(&mut refusing_after(3)).unwrap_err();
    match &e {
        StartError::Spawn {
            thread,
            started,
            ppe_threads,
            ..
        } => assert_eq!(
            (thread.as_str(), *started, *ppe_threads),
            ("pfemu-ppe-3", 3, 8)
        ),
        other => panic!("expected a spawn error, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("3 of 8 PPE threads"), "{msg}");
    assert!(msg.contains("Resource temporarily unavailable"), "{msg}");
    // The three started threads were joined; the engine is shut down.
    assert!(pfe.workers.lock().is_empty());
    assert_eq!(
        pfe.inject(Packet::new(0, vec![0; 64])),
        Err(InjectError::NotRunning)
    );
    assert!(matches!(pfe.start(), Err(StartError::Stopped)));
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
}

#[test]
fn a_refused_timer_launcher_is_an_error_and_the_ppe_threads_stop() {
    let mut pfe = Pfe::builder()
        .program(program(true))
        .ppe_threads(2)
        .clock(Arc::new(ManualClock::new()))
        .timers(TimerSpec::staggered(0, 1, 1_000_000, 0).expect("a timer"))
        .build()
        .expect("build");
    let e = pfe.start_with(&mut refusing_after(2)).unwrap_err();
    assert!(
        matches!(&e, StartError::Spawn { thread, started: 2, .. } if thread == "pfemu-timers"),
        "{e:?}"
    );
    assert!(pfe.workers.lock().is_empty());
    assert!(pfe.launcher.lock().is_none());
    drop(pfe);
}
