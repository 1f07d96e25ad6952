//! The program builder: labels, instructions, entry points and drop reasons, checked into a [`Program`].

use std::fmt;
use std::sync::Arc;

use super::sequencer::ProgramInner;
use super::*;

/// A program could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgramError {
    /// A label was declared (and maybe jumped to) but no instruction defines it.
    UndefinedLabel(String),
    /// Two instructions define the same label.
    DuplicateLabel(String),
    /// The program has no [`Entry::Packet`] entry point.
    NoPacketEntry,
    /// An entry point was set twice.
    DuplicateEntry(Entry),
    /// Too many labels or drop reasons for the program's index width.
    TooLarge(&'static str),
    /// A [`DropReasons`] enum's reason did not land at its variant's index (another drop
    /// reason was registered before the enum): the enum must be registered first.
    DropReasonOrder(&'static str),
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramError::UndefinedLabel(l) => {
                write!(f, "label `{l}` is used but no instruction defines it")
            }
            ProgramError::DuplicateLabel(l) => write!(f, "label `{l}` is defined twice"),
            ProgramError::NoPacketEntry => {
                write!(f, "the program has no Entry::Packet entry point")
            }
            ProgramError::DuplicateEntry(e) => write!(f, "entry point {e:?} is set twice"),
            ProgramError::TooLarge(what) => write!(f, "too many {what}"),
            ProgramError::DropReasonOrder(r) => write!(
                f,
                "drop reason `{r}` is not at its enum variant's index: register the \
                 drop_reasons! enum before any other drop reason"
            ),
        }
    }
}

impl std::error::Error for ProgramError {}

/// Builds a [`Program`]: declare labels, define instructions, set entry points.
pub struct ProgramBuilder {
    pub(super) name: String,
    pub(super) labels: Vec<String>,
    pub(super) instrs: Vec<Option<Instr>>,
    pub(super) duplicates: Vec<String>,
    pub(super) entries: Vec<(Entry, Label)>,
    pub(super) fault_entry: Option<Label>,
    pub(super) drop_reasons: Vec<&'static str>,
    pub(super) misplaced_reasons: Vec<&'static str>,
}

impl ProgramBuilder {
    /// Declares a label (or returns the one already declared with this name).
    pub fn label(&mut self, name: &str) -> Label {
        if let Some(i) = self.labels.iter().position(|l| l == name) {
            return Label(i as u32);
        }
        self.labels.push(name.to_owned());
        self.instrs.push(None);
        Label(self.labels.len() as u32 - 1)
    }

    /// Declares several labels at once: `let [a, b] = p.labels(["a", "b"]);`.
    pub fn labels<const N: usize>(&mut self, names: [&str; N]) -> [Label; N] {
        names.map(|n| self.label(n))
    }

    /// Defines the instruction at `label`.
    pub fn instr<F>(&mut self, label: Label, f: F) -> &mut Self
    where
        F: Fn(&mut Thread<'_>) -> InstrResult + Send + Sync + 'static,
    {
        let slot = &mut self.instrs[label.0 as usize];
        if slot.is_some() {
            self.duplicates.push(self.labels[label.0 as usize].clone());
        }
        *slot = Some(Box::new(f));
        self
    }

    /// Sets where threads start for an entry point.
    pub fn entry(&mut self, entry: Entry, label: Label) -> &mut Self {
        self.entries.push((entry, label));
        self
    }

    /// Sets the program's fault handler: a thread (packet or timer) that faults continues at
    /// `label` before its packet is dropped, with its registers, local memory and new tail
    /// as the fault left them, an empty call stack and a fresh instruction budget (the engine's,
    /// and at least [`DEFAULT_INSTRUCTION_BUDGET`], so that a budget set small to catch a
    /// runaway loop does not starve the clean-up). The packets the thread created before
    /// the fault are discarded, but for those it kept ([`Thread::keep_created`]); the
    /// handler's own are sent, unless it faults in turn (it is not handled again: then
    /// only those it kept are). Whatever the handler returns, the packet is dropped under
    /// the fault's reason; the engine counts handlers run and handlers that faulted
    /// ([`crate::pfe::Stats::fault_handlers`]).
    ///
    /// A program whose threads hold shared state across instructions (a lock, a count of
    /// threads in a section) gives it back here: the thread notes in a register what it
    /// holds, and the handler reads it. Setting it twice keeps the last label.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pfemu::prelude::*;
    /// use pfemu::program::{FaultKind, Harness};
    ///
    /// pfemu::registers! {
    ///     /// Set while the thread holds the lock word.
    ///     HOLDS: bool,
    /// }
    /// let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
    /// let lock = mem.alloc("lock", Region::Sram, 1)?;
    /// let mut p = Program::builder("spin");
    /// pfemu::labels!(p => take, spin, on_fault);
    /// p.instr(take, move |t| {
    ///     t.fetch_or(lock, 1)?;
    ///     t.set(HOLDS, true);
    ///     Ok(Goto(spin))
    /// });
    /// // A runaway loop: it faults once the budget runs out, holding the lock.
    /// p.instr(spin, move |_t| Ok(Goto(spin)));
    /// p.instr(on_fault, move |t| {
    ///     if t.get(HOLDS) {
    ///         t.fetch_clear(lock, 1)?;
    ///     }
    ///     Ok(Done(Verdict::Consume))
    /// });
    /// p.entry(Entry::Packet, take);
    /// p.on_fault(on_fault);
    /// let program = p.build()?;
    ///
    /// let mut h = Harness::new(mem.clone());
    /// h.set_budget(100);
    /// let out = h.run(&program, 0, &[0u8; 64]);
    /// assert_eq!(out.result.unwrap_err().kind(), FaultKind::InstructionBudget);
    /// assert_eq!(out.fault_handler, Some(Ok(())));
    /// assert_eq!(mem.read_u64(lock)?, 0, "the handler gave the lock back");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_fault(&mut self, label: Label) -> &mut Self {
        self.fault_entry = Some(label);
        self
    }

    /// Registers a drop reason, counted by `name` in the engine's stats.
    pub fn drop_reason(&mut self, name: &'static str) -> DropReason {
        if let Some(i) = self.drop_reasons.iter().position(|r| *r == name) {
            return DropReason(i as u16);
        }
        self.drop_reasons.push(name);
        DropReason(self.drop_reasons.len() as u16 - 1)
    }

    /// Registers the drop reasons of a [`drop_reasons!`](crate::drop_reasons) enum, so that
    /// `Verdict::Drop(E::Variant.into())` is counted under the variant's name. Register it
    /// before any other drop reason (a variant's index is its place in the table);
    /// otherwise [`ProgramBuilder::build`] fails with [`ProgramError::DropReasonOrder`].
    pub fn drop_reasons<E: DropReasons>(&mut self) -> &mut Self {
        for (i, name) in E::NAMES.iter().enumerate() {
            if self.drop_reason(name).index() != i {
                self.misplaced_reasons.push(name);
            }
        }
        self
    }

    /// Resolves labels and checks the program.
    pub fn build(self) -> Result<Program, ProgramError> {
        if let Some(r) = self.misplaced_reasons.into_iter().next() {
            return Err(ProgramError::DropReasonOrder(r));
        }
        if let Some(d) = self.duplicates.into_iter().next() {
            return Err(ProgramError::DuplicateLabel(d));
        }
        if self.labels.len() > MAX_LABELS {
            return Err(ProgramError::TooLarge("labels"));
        }
        if self.drop_reasons.len() > u16::MAX as usize {
            return Err(ProgramError::TooLarge("drop reasons"));
        }
        let mut instrs = Vec::with_capacity(self.instrs.len());
        for (i, slot) in self.instrs.into_iter().enumerate() {
            match slot {
                Some(f) => instrs.push(f),
                None => return Err(ProgramError::UndefinedLabel(self.labels[i].clone())),
            }
        }
        let mut packet_entry = None;
        let mut timer_entries: Vec<(u16, Label)> = Vec::new();
        for (e, l) in self.entries {
            match e {
                Entry::Packet if packet_entry.is_some() => {
                    return Err(ProgramError::DuplicateEntry(e))
                }
                Entry::Packet => packet_entry = Some(l),
                Entry::Timer(n) if timer_entries.iter().any(|(m, _)| *m == n) => {
                    return Err(ProgramError::DuplicateEntry(e))
                }
                Entry::Timer(n) => timer_entries.push((n, l)),
            }
        }
        let packet_entry = packet_entry.ok_or(ProgramError::NoPacketEntry)?;
        Ok(Program {
            inner: Arc::new(ProgramInner {
                name: self.name,
                labels: self.labels,
                instrs,
                packet_entry,
                timer_entries,
                fault_entry: self.fault_entry,
                drop_reasons: self.drop_reasons,
            }),
        })
    }
}
