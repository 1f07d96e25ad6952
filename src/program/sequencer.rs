//! A built program and the sequencer that runs a thread through it.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::*;

pub(super) struct ProgramInner {
    pub(super) name: String,
    pub(super) labels: Vec<String>,
    pub(super) instrs: Vec<Instr>,
    pub(super) packet_entry: Label,
    pub(super) timer_entries: Vec<(u16, Label)>,
    /// Where a faulting thread goes before its packet is dropped
    /// ([`ProgramBuilder::on_fault`]).
    pub(super) fault_entry: Option<Label>,
    pub(super) drop_reasons: Vec<&'static str>,
}

/// A built Microcode program; cheap to clone (shared by every PPE thread).
#[derive(Clone)]
pub struct Program {
    pub(super) inner: Arc<ProgramInner>,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.inner.name)
            .field("instructions", &self.inner.labels)
            .field("drop_reasons", &self.inner.drop_reasons)
            .finish()
    }
}

/// How a packet thread's run ended ([`Program::run_packet`]), in one word.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PacketRun {
    /// The verdict; `None` when the thread faulted (its outcome is in its core's
    /// `faulted`).
    pub verdict: Option<Verdict>,
    /// The instructions it executed, its fault handler's included.
    pub instructions: u32,
}

/// How one run of a program ended.
#[derive(Debug)]
pub(crate) struct RunOutcome {
    pub result: Result<Verdict, Fault>,
    pub instructions: u32,
    /// [`Yield`](super::Yield) steps taken.
    pub waits: u32,
    /// How the program's fault handler ([`ProgramBuilder::on_fault`]) ended, when the
    /// thread faulted and the program has one: `Ok` if it ran to completion (whatever its
    /// verdict), else its own fault.
    pub fault_handler: Option<Result<(), Fault>>,
}

impl Program {
    /// Starts building a program called `name`.
    pub fn builder(name: &str) -> ProgramBuilder {
        ProgramBuilder {
            name: name.to_owned(),
            labels: Vec::new(),
            instrs: Vec::new(),
            duplicates: Vec::new(),
            entries: Vec::new(),
            fault_entry: None,
            drop_reasons: Vec::new(),
            misplaced_reasons: Vec::new(),
        }
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Instruction names, in label order.
    pub fn instruction_names(&self) -> &[String] {
        &self.inner.labels
    }

    /// The drop reasons the program registered, in [`DropReason`] order.
    pub fn drop_reasons(&self) -> &[&'static str] {
        &self.inner.drop_reasons
    }

    /// The name of a drop reason of this program.
    pub fn drop_reason_name(&self, r: DropReason) -> &'static str {
        self.inner
            .drop_reasons
            .get(r.0 as usize)
            .copied()
            .unwrap_or("unknown")
    }

    /// Timer entry points, as (timer number, label name).
    pub fn timer_entries(&self) -> impl Iterator<Item = (u16, &str)> {
        self.inner
            .timer_entries
            .iter()
            .map(|(n, l)| (*n, self.inner.labels[l.0 as usize].as_str()))
    }

    fn entry_label(&self, entry: Entry) -> Option<Label> {
        match entry {
            Entry::Packet => Some(self.inner.packet_entry),
            Entry::Timer(n) => self
                .inner
                .timer_entries
                .iter()
                .find(|(m, _)| *m == n)
                .map(|(_, l)| *l),
        }
    }

    /// Runs the thread from `entry` to completion (or a fault), counting instructions.
    #[inline]
    pub(crate) fn run(&self, entry: Entry, t: &mut Thread<'_>, budget: u32) -> RunOutcome {
        self.run_observed(entry, t, budget, |_| {})
    }

    /// The label a faulting thread continues at ([`ProgramBuilder::on_fault`]), if any.
    pub fn fault_entry(&self) -> Option<&str> {
        self.inner
            .fault_entry
            .map(|l| self.inner.labels[l.0 as usize].as_str())
    }

    /// [`Program::run`] from the packet entry, for the PPE loop. What it returns fits one
    /// register, where a [`RunOutcome`] comes back through memory (see `src/pfe/README.md`).
    /// A thread that faults leaves its outcome in its core's `faulted`.
    #[inline(never)]
    pub(crate) fn run_packet(&self, t: &mut Thread<'_>, budget: u32) -> PacketRun {
        let start = self.inner.packet_entry;
        let mut executed = 0u32;
        let mut waits = 0u32;
        match self.execute::<false>(start, t, budget, &mut executed, &mut waits, &mut |_| {}) {
            Ok(v) => PacketRun {
                verdict: Some(v),
                instructions: executed,
            },
            Err(fault) => {
                let outcome = self.after_fault(fault, t, budget, executed, waits, &mut |_| {});
                let instructions = outcome.instructions;
                t.core.faulted = Some(outcome);
                PacketRun {
                    verdict: None,
                    instructions,
                }
            }
        }
    }

    /// The outcome of a thread that faulted: its created packets discarded, and the
    /// program's fault handler run, if it has one.
    #[cold]
    #[inline(never)]
    fn after_fault(
        &self,
        fault: Fault,
        t: &mut Thread<'_>,
        budget: u32,
        mut executed: u32,
        mut waits: u32,
        before: &mut impl FnMut(Label),
    ) -> RunOutcome {
        // The thread's work is abandoned, packets it created included (but for those it
        // kept: `Thread::keep_created`).
        t.discard_created();
        let mut fault_handler = None;
        if let Some(handler) = self.inner.fault_entry {
            let (ran, handled) = self.run_fault_handler(handler, t, budget, &mut waits, before);
            executed = executed.saturating_add(ran);
            fault_handler = Some(handled);
        }
        RunOutcome {
            result: Err(fault),
            instructions: executed,
            waits,
            fault_handler,
        }
    }

    /// [`Program::run`], calling `before` with each instruction's label before it runs.
    ///
    /// A thread that faults has the packets it created discarded, but for those it kept
    /// ([`Thread::keep_created`]); then, if the program has a fault handler
    /// ([`ProgramBuilder::on_fault`]), the thread runs it from its label with its registers
    /// and local memory as the fault left them, an empty call stack and a fresh budget
    /// (`budget`, and at least [`DEFAULT_INSTRUCTION_BUDGET`]). The outcome stays the fault;
    /// the handler's instructions and waits are counted with the thread's.
    #[inline]
    pub(crate) fn run_observed(
        &self,
        entry: Entry,
        t: &mut Thread<'_>,
        budget: u32,
        mut before: impl FnMut(Label),
    ) -> RunOutcome {
        let Some(start) = self.entry_label(entry) else {
            return RunOutcome {
                result: Err(FaultDetail::NoEntry.into()),
                instructions: 0,
                waits: 0,
                fault_handler: None,
            };
        };
        let mut executed = 0u32;
        let mut waits = 0u32;
        match self.execute::<false>(start, t, budget, &mut executed, &mut waits, &mut before) {
            Ok(v) => RunOutcome {
                result: Ok(v),
                instructions: executed,
                waits,
                fault_handler: None,
            },
            Err(fault) => self.after_fault(fault, t, budget, executed, waits, &mut before),
        }
    }

    /// Runs the fault handler `handler` on the thread that faulted (see
    /// [`Program::run_observed`]); returns its instructions and how it ended. Out of line
    /// and its own instance of [`Program::execute`]: the packet path's instance keeps its
    /// closure inlined into `catch_unwind`, with no frame set up per packet.
    #[cold]
    #[inline(never)]
    fn run_fault_handler(
        &self,
        handler: Label,
        t: &mut Thread<'_>,
        budget: u32,
        waits: &mut u32,
        before: &mut impl FnMut(Label),
    ) -> (u32, Result<(), Fault>) {
        let mut ran = 0u32;
        let handled = self.execute::<true>(
            handler,
            t,
            budget.max(DEFAULT_INSTRUCTION_BUDGET),
            &mut ran,
            waits,
            before,
        );
        if handled.is_err() {
            // A handler that faults is abandoned in turn (the packets it kept, and those
            // the thread kept before its fault, stay).
            t.discard_created();
        }
        (ran, handled.map(|_| ()))
    }

    /// Runs the thread from `start` until it is done or faults, within `budget`
    /// instructions, counting them in `executed` and its waits in `waits`. `HANDLER` only
    /// makes the fault handler's instance a type of its own (see
    /// [`Program::run_fault_handler`]).
    #[inline(always)]
    fn execute<const HANDLER: bool>(
        &self,
        start: Label,
        t: &mut Thread<'_>,
        budget: u32,
        executed: &mut u32,
        waits: &mut u32,
        before: &mut impl FnMut(Label),
    ) -> Result<Verdict, Fault> {
        let result = catch_unwind(AssertUnwindSafe(|| {
            let instrs = &self.inner.instrs;
            let mut pc = start.0 as usize;
            let mut stack = [0u32; MAX_CALL_DEPTH];
            let mut depth = 0usize;
            loop {
                if *executed >= budget {
                    return Err(FaultDetail::InstructionBudget(budget).into());
                }
                *executed += 1;
                before(Label(pc as u32));
                let next = (instrs[pc])(t)?;
                if let Some(l) = next.goto_label() {
                    pc = l.0 as usize;
                    continue;
                }
                match next.step() {
                    Step::Goto(l) => pc = l.0 as usize,
                    Step::Call(l, ret) => {
                        if depth == MAX_CALL_DEPTH {
                            return Err(FaultDetail::CallDepth.into());
                        }
                        stack[depth] = ret.0;
                        depth += 1;
                        pc = l.0 as usize;
                    }
                    Step::Return => {
                        if depth == 0 {
                            return Err(FaultDetail::ReturnWithoutCall.into());
                        }
                        depth -= 1;
                        pc = stack[depth] as usize;
                    }
                    Step::Done(Verdict::Drop(r)) if r.index() >= self.inner.drop_reasons.len() => {
                        // A reason the program never registered has no counter to land in.
                        return Err(FaultDetail::Panic(format!(
                            "drop reason {} is not registered with the program",
                            r.index()
                        ))
                        .into());
                    }
                    Step::Done(v) => return Ok(v),
                    Step::Yield(l) => {
                        *waits += 1;
                        t.core.yields += 1;
                        wait_for_others(*waits);
                        pc = l.0 as usize;
                    }
                }
            }
        }));
        match result {
            Ok(r) => r,
            Err(payload) => Err(FaultDetail::Panic(panic_message(payload.as_ref())).into()),
        }
    }
}

/// One wait of a thread that yielded (its `waits`-th): let the other host threads run. The
/// first waits only yield the core (the holder may share it); later ones sleep, so a
/// holder the host OS descheduled (more PPE threads than cores) is waited for without the
/// waiter running out of instructions.
#[cold]
fn wait_for_others(waits: u32) {
    if waits <= YIELDS_BEFORE_SLEEP {
        std::thread::yield_now();
    } else {
        std::thread::sleep(WAIT_SLEEP);
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
