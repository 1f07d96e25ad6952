//! Runs a program on single frames in the calling thread, without an engine.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::mem::{SharedMemory, XtxnKind};
use crate::packet::{Dest, OutArena, Port};
use crate::timer::Launch;

use super::*;

/// What [`Harness::run`] saw.
#[derive(Debug)]
pub struct HarnessOutcome {
    /// The verdict, or the fault that ended the thread.
    pub result: Result<Verdict, Fault>,
    /// Instructions executed (a fault handler's included).
    pub instructions: u32,
    /// [`Yield`](super::Yield) steps taken (waits for other threads).
    pub waits: u32,
    /// The packet as it would leave (head as the program left it, then the tail), when the
    /// program forwarded or multicast it.
    pub output: Option<Vec<u8>>,
    /// Packets the program created, with their destinations (of a thread that faulted,
    /// only those its fault handler created).
    pub created: Vec<(Dest, Vec<u8>)>,
    /// How the program's fault handler ended, when the thread faulted and the program has
    /// one ([`ProgramBuilder::on_fault`]): `Ok` if it ran to completion, else its own fault.
    pub fault_handler: Option<Result<(), Fault>>,
    /// The XTXNs the thread issued, by kind ([`XtxnKind::name`]), as in the engine's
    /// [`crate::pfe::Stats::xtxns`]; kinds it did not issue are left out.
    pub xtxns: BTreeMap<String, u64>,
}

/// Runs a program on single frames in the calling thread, without an engine: for unit
/// tests of a program and for measuring what its instructions cost. Posted XTXNs are
/// applied before [`Harness::run`] returns.
///
/// ```
/// use std::sync::Arc;
/// use pfemu::prelude::*;
/// use pfemu::program::Harness;
///
/// let mut p = Program::builder("count");
/// let a = p.label("a");
/// p.instr(a, |t| Ok(Done(Verdict::Forward(t.pkt_len() as u16 % 4))));
/// p.entry(Entry::Packet, a);
/// let program = p.build()?;
///
/// let mut h = Harness::new(Arc::new(SharedMemory::new(&MemConfig::default())?));
/// let out = h.run(&program, 0, &[0u8; 66]);
/// assert_eq!(out.result, Ok(Verdict::Forward(2)));
/// assert_eq!(out.instructions, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Harness {
    core: ThreadCore,
    mem: Arc<SharedMemory>,
    out: OutArena,
    head_bytes: usize,
    budget: u32,
    now_ns: u64,
}

impl Harness {
    /// A harness on `mem`, with the engine's default head size and instruction budget.
    pub fn new(mem: Arc<SharedMemory>) -> Self {
        Harness {
            core: ThreadCore::new(),
            mem,
            out: OutArena::default(),
            head_bytes: crate::packet::DEFAULT_HEAD_BYTES,
            budget: DEFAULT_INSTRUCTION_BUDGET,
            now_ns: 0,
        }
    }

    /// Sets the time [`Thread::now_ns`] reports to the threads run from now on (0 at
    /// first): tests of time-dependent programs drive the clock by hand.
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    /// Sets the instruction budget of each run.
    pub fn set_budget(&mut self, budget: u32) {
        self.budget = budget;
    }

    /// The shared memory the harness runs against.
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.mem
    }

    /// Runs `program` from its packet entry on `frame`, arriving on `port`.
    pub fn run(&mut self, program: &Program, port: Port, frame: &[u8]) -> HarnessOutcome {
        self.run_observed(program, port, frame, |_| {})
    }

    /// [`Harness::run`], calling `before` with the name of each instruction's label just
    /// before the instruction runs. A test can block in `before` to hold the thread at a
    /// chosen instruction while other threads run, and so replay an interleaving of
    /// run-to-completion threads deterministically (a PPE thread the host OS deschedules
    /// between two instructions).
    pub fn run_observed(
        &mut self,
        program: &Program,
        port: Port,
        frame: &[u8],
        mut before: impl FnMut(&str),
    ) -> HarnessOutcome {
        self.out.clear();
        let meta = self.core.load(port, frame, self.head_bytes, self.now_ns);
        let tail = meta.tail;
        let mut t = Thread::new(&mut self.core, &self.mem, &mut self.out, meta);
        let names = program.instruction_names();
        let run = program.run_observed(Entry::Packet, &mut t, self.budget, |l| {
            before(&names[l.0 as usize])
        });
        let (hs, hl, _) = t.end();
        self.finish(run, Some((hs, hl, tail)))
    }

    /// Runs `program` from the timer entry `launch.entry`, as the engine does when a timer
    /// fires: the thread has no packet and sees `launch` through [`Thread::timer`].
    pub fn run_timer(&mut self, program: &Program, launch: Launch) -> HarnessOutcome {
        self.run_timer_observed(program, launch, |_| {})
    }

    /// [`Harness::run_timer`], calling `before` with the name of each instruction's label
    /// just before the instruction runs, as [`Harness::run_observed`] does for a packet: a
    /// test can hold a timer thread between two instructions while packets run.
    pub fn run_timer_observed(
        &mut self,
        program: &Program,
        launch: Launch,
        mut before: impl FnMut(&str),
    ) -> HarnessOutcome {
        self.out.clear();
        let meta = PacketMeta::timer(launch, self.now_ns);
        let mut t = Thread::new(&mut self.core, &self.mem, &mut self.out, meta);
        let names = program.instruction_names();
        let run = program.run_observed(Entry::Timer(launch.entry), &mut t, self.budget, |l| {
            before(&names[l.0 as usize])
        });
        t.end();
        self.finish(run, None)
    }

    /// Applies posted XTXNs and collects what the thread produced.
    fn finish(&mut self, run: RunOutcome, head: Option<(usize, usize, &[u8])>) -> HarnessOutcome {
        self.core.posted.flush(&self.mem);
        let xtxns = XtxnKind::named(&self.core.xtxns)
            .map(|(name, n)| (name.to_string(), n))
            .collect();
        self.core.xtxns = [0; XtxnKind::COUNT];
        let output = match (&run.result, head) {
            (Ok(Verdict::Forward(_)) | Ok(Verdict::Multicast(_)), Some((hs, hl, tail))) => {
                let mut o = self.core.lm[hs..hs + hl].to_vec();
                o.extend_from_slice(if self.core.new_tail_set {
                    &self.core.new_tail
                } else {
                    tail
                });
                Some(o)
            }
            _ => None,
        };
        let created = self
            .out
            .recs
            .iter()
            .map(|r| {
                (
                    r.dest,
                    self.out.bytes[r.off as usize..(r.off + r.len) as usize].to_vec(),
                )
            })
            .collect();
        HarnessOutcome {
            result: run.result,
            instructions: run.instructions,
            waits: run.waits,
            output,
            created,
            xtxns,
            fault_handler: run.fault_handler,
        }
    }

    /// Runs `program` on every frame and returns how many it forwarded; no per-packet
    /// results are kept (the loop a benchmark times).
    pub fn run_all<'f>(
        &mut self,
        program: &Program,
        frames: impl IntoIterator<Item = &'f [u8]>,
    ) -> u64 {
        let mut forwarded = 0;
        for frame in frames {
            self.out.clear();
            let meta = self.core.load(0, frame, self.head_bytes, 0);
            let mut t = Thread::new(&mut self.core, &self.mem, &mut self.out, meta);
            let run = program.run(Entry::Packet, &mut t, self.budget);
            t.end();
            if let Ok(Verdict::Forward(_)) = run.result {
                forwarded += 1;
            }
        }
        self.core.posted.flush(&self.mem);
        forwarded
    }
}
