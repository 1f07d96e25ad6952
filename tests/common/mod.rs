//! Frame builders shared by the integration tests.
#![allow(dead_code)]

/// An Ethernet + IPv4 (no options) + UDP frame of `size` bytes whose UDP source port is
/// `flow` and whose payload starts with `flow` and `seq` (big-endian u32 each).
pub fn udp_frame(flow: u16, seq: u32, size: usize) -> Vec<u8> {
    assert!(size >= 50);
    let mut f = vec![0u8; size];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((size - 14) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let sum = pfemu::wire::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f[34..36].copy_from_slice(&flow.to_be_bytes());
    f[36..38].copy_from_slice(&5000u16.to_be_bytes());
    f[38..40].copy_from_slice(&((size - 34) as u16).to_be_bytes());
    f[42..46].copy_from_slice(&(flow as u32).to_be_bytes());
    f[46..50].copy_from_slice(&seq.to_be_bytes());
    f
}

/// `(flow, seq)` from a frame built by [`udp_frame`].
pub fn flow_seq(frame: &[u8]) -> (u32, u32) {
    (
        u32::from_be_bytes(frame[42..46].try_into().unwrap()),
        u32::from_be_bytes(frame[46..50].try_into().unwrap()),
    )
}

/// An Ethernet frame with the given EtherType and zero payload.
pub fn ether_frame(etype: u16, size: usize) -> Vec<u8> {
    let mut f = vec![0u8; size];
    f[12..14].copy_from_slice(&etype.to_be_bytes());
    f
}

/// A small deterministic PRNG (xorshift64*), so tests need no seed plumbing.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The addresses of Trio-ML worker `src` sending to the aggregator at `dst_addr:dst_port`
/// (the aggregator's MAC is the default configuration's).
pub fn worker_endpoints(
    src: u8,
    dst_addr: std::net::Ipv4Addr,
    dst_port: u16,
) -> pfemu::microcode::trio_ml::wire::Endpoints {
    pfemu::microcode::trio_ml::wire::Endpoints {
        src_mac: [2, 0, 0, 0, 1, src],
        dst_mac: pfemu::microcode::trio_ml::TrioMlConfig::default().local_mac,
        src_addr: std::net::Ipv4Addr::new(10, 0, 1, src),
        dst_addr,
        src_port: 40000 + u16::from(src),
        dst_port,
    }
}

/// A memory of 64 KiB of SRAM and DRAM, no accumulator region and 4 banks: enough for the
/// tests' counters and records, and quick to build.
pub fn small_mem() -> pfemu::mem::MemConfig {
    pfemu::mem::MemConfig {
        sram_bytes: 1 << 16,
        dram_bytes: 1 << 16,
        acc_bytes: 0,
        banks: 4,
    }
}

/// A [`small_mem`] memory, shared.
pub fn small_memory() -> std::sync::Arc<pfemu::mem::SharedMemory> {
    std::sync::Arc::new(pfemu::mem::SharedMemory::new(&small_mem()).expect("a small memory"))
}

/// The paper's filter installed in a [`small_memory`], and an engine builder that runs it
/// on that memory (the rest of the engine is the caller's to set).
pub fn filter_engine() -> (pfemu::pfe::PfeBuilder, pfemu::microcode::filter::Filter) {
    let mem = small_memory();
    let filter =
        pfemu::microcode::filter::Filter::install(&mem).expect("room for the filter's counters");
    let builder = pfemu::pfe::Pfe::builder()
        .program(filter.program())
        .memory(mem);
    (builder, filter)
}

/// A packet's (or a timer's) thread, held before an instruction until [`Held::release`]: a
/// PPE thread the host OS deschedules between two instructions, replayed deterministically.
pub struct Held {
    go: std::sync::mpsc::Sender<()>,
    at_label: std::sync::mpsc::Receiver<&'static str>,
    thread: std::thread::JoinHandle<pfemu::program::HarnessOutcome>,
}

/// How long a held packet's test waits for it to reach its instruction or to finish: a
/// deadline for a hang, not a measure of speed.
pub const HOLD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

impl Held {
    /// Lets the packet go on; its outcome once it has run to the end.
    pub fn release(self) -> pfemu::program::HarnessOutcome {
        // A thread that already ran to its end no longer waits.
        let _ = self.go.send(());
        self.thread.join().expect("the held packet's thread")
    }

    /// Lets the packet go on to the next of the labels it is held at
    /// ([`hold_before_each`]); returns once it is held there (true), or once it has run to
    /// its end without reaching it (false: [`Held::release`] gives its outcome).
    pub fn step(&mut self) -> bool {
        self.go.send(()).expect("the held packet's thread waits");
        match self.at_label.recv_timeout(HOLD_PATIENCE) {
            Ok(_) => true,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => false,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("the held thread neither reaches its next label nor ends")
            }
        }
    }
}

/// Runs `frame` (from port `port`, at time `now_ns`) through `program` on a thread of its
/// own ([`Harness::run_observed`](pfemu::program::Harness::run_observed)), held before the
/// first instruction labelled `label` until it is released; returns once it is held there.
pub fn hold_before(
    mem: &std::sync::Arc<pfemu::mem::SharedMemory>,
    program: &pfemu::program::Program,
    label: &'static str,
    at: (pfemu::packet::Port, u64),
    frame: Vec<u8>,
) -> Held {
    hold_before_each(mem, program, &[label], at, frame)
}

/// [`hold_before`] at each of `labels` in turn: held before the first instruction labelled
/// `labels[0]`, then ([`Held::step`]) before the next instruction labelled `labels[1]`, and
/// so on.
pub fn hold_before_each(
    mem: &std::sync::Arc<pfemu::mem::SharedMemory>,
    program: &pfemu::program::Program,
    labels: &[&'static str],
    (port, now_ns): (pfemu::packet::Port, u64),
    frame: Vec<u8>,
) -> Held {
    hold_thread_before(mem, now_ns, labels, {
        let program = program.clone();
        move |h, before| h.run_observed(&program, port, &frame, before)
    })
}

/// [`hold_before`] for the timer thread of `launch`
/// ([`Harness::run_timer_observed`](pfemu::program::Harness::run_timer_observed)).
pub fn hold_timer_before(
    mem: &std::sync::Arc<pfemu::mem::SharedMemory>,
    program: &pfemu::program::Program,
    label: &'static str,
    now_ns: u64,
    launch: pfemu::timer::Launch,
) -> Held {
    hold_thread_before(mem, now_ns, &[label], {
        let program = program.clone();
        move |h, before| h.run_timer_observed(&program, launch, before)
    })
}

/// Runs `run` on a harness of its own thread (at time `now_ns`), held before the first
/// instruction labelled `labels[0]` until it is let go on, then before the next labelled
/// `labels[1]`, and so on; returns once it is held at the first.
fn hold_thread_before(
    mem: &std::sync::Arc<pfemu::mem::SharedMemory>,
    now_ns: u64,
    labels: &[&'static str],
    run: impl FnOnce(&mut pfemu::program::Harness, &mut dyn FnMut(&str)) -> pfemu::program::HarnessOutcome
        + Send
        + 'static,
) -> Held {
    use std::sync::mpsc;
    let (at_label_tx, at_label) = mpsc::channel::<&'static str>();
    let (go, go_rx) = mpsc::channel::<()>();
    let mut waiting = Vec::from(labels).into_iter().peekable();
    let thread = {
        let mem = mem.clone();
        std::thread::spawn(move || {
            let mut h = pfemu::program::Harness::new(mem);
            h.set_now(now_ns);
            run(&mut h, &mut |l: &str| {
                if let Some(label) = waiting.next_if(|w| *w == l) {
                    at_label_tx
                        .send(label)
                        .expect("the test waits for the thread");
                    go_rx
                        .recv_timeout(HOLD_PATIENCE)
                        .expect("the test lets the thread go on");
                }
            })
        })
    };
    let first = labels.first().expect("a label to hold at");
    at_label
        .recv_timeout(HOLD_PATIENCE)
        .unwrap_or_else(|_| panic!("the held thread reaches {first}"));
    Held {
        go,
        at_label,
        thread,
    }
}

/// The launch of Trio-ML's one timer, owning the whole table, at `now`.
pub fn trio_ml_launch(now: u64) -> pfemu::timer::Launch {
    pfemu::timer::Launch {
        timer: 0,
        entry: pfemu::microcode::trio_ml::TIMER_ENTRY,
        slice: 0,
        slices: 1,
        scheduled_ns: now,
        missed: 0,
    }
}

/// One Trio-ML scan period at `now` (one timer owning the whole table); the packets it
/// created.
pub fn trio_ml_scan(
    h: &mut pfemu::program::Harness,
    program: &pfemu::program::Program,
    now: u64,
) -> Vec<(pfemu::packet::Dest, Vec<u8>)> {
    let out = trio_ml_scan_observed(h, program, now, |_| {});
    assert_eq!(out.result, Ok(pfemu::program::Verdict::Consume));
    out.created
}

/// [`trio_ml_scan`], calling `before` with the name of each instruction's label just
/// before it runs
/// ([`Harness::run_timer_observed`](pfemu::program::Harness::run_timer_observed)), however
/// the timer thread ends.
pub fn trio_ml_scan_observed(
    h: &mut pfemu::program::Harness,
    program: &pfemu::program::Program,
    now: u64,
    before: impl FnMut(&str),
) -> pfemu::program::HarnessOutcome {
    h.set_now(now);
    h.run_timer_observed(program, trio_ml_launch(now), before)
}

/// Drives Trio-ML `workers` (each on the port of its source, its Results on `rxs[src]`)
/// against `pfe`, whose clock is `clock` and which only this function moves, all on the
/// calling thread: at each reading every worker sends what it may, the engine drains, each
/// worker takes the frames that came out at that reading, and the clock moves on by
/// `step_ns` with the timer launches due by then run to completion. The times the workers
/// record are the timer logic's alone, the same on any machine. Fails the test if a worker
/// is not done when the clock reaches `limit_ns`.
pub fn trio_ml_on_manual_clock(
    pfe: &pfemu::pfe::Pfe,
    rxs: &[crossbeam_channel::Receiver<Vec<u8>>],
    clock: &pfemu::timer::ManualClock,
    mut workers: Vec<pfemu::microcode::trio_ml::host::Worker>,
    step_ns: u64,
    limit_ns: u64,
) -> Vec<pfemu::microcode::trio_ml::host::Worker> {
    use pfemu::timer::Clock;
    let mut out = Vec::new();
    loop {
        let now = clock.now_ns();
        for w in &mut workers {
            w.poll(now, &mut out);
            for p in out.drain(..) {
                pfe.inject_frame(u16::from(w.config().src_id), &p).unwrap();
            }
        }
        pfe.drain();
        for w in &mut workers {
            for frame in rxs[usize::from(w.config().src_id)].try_iter() {
                w.on_frame_at(&frame, now).unwrap();
            }
        }
        if workers.iter().all(|w| w.is_done()) {
            return workers;
        }
        let missing: Vec<usize> = workers.iter().map(|w| w.missing()).collect();
        assert!(
            now < limit_ns,
            "at {now} ns on the manual clock, chunks still missing per worker: {missing:?}"
        );
        clock.advance(step_ns);
        pfe.settle_timers();
    }
}
