//! What the sequencer does after an instruction, packed into one word.

use std::fmt;

use super::{DropReason, Label, Verdict};

/// What the sequencer does after an instruction. Build it with [`Goto`], [`Call`],
/// [`Return`], [`Yield`] and [`Done`]; read it with [`Next::step`].
///
/// It is packed into one word so that an instruction's [`InstrResult`](super::InstrResult) comes back in two
/// registers rather than through memory: the sequencer pays for it on every instruction.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Next(u64);

/// [`Next`] unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Continue at the label.
    Goto(Label),
    /// Call the first label as a subroutine; its `Return` continues at the second label.
    Call(Label, Label),
    /// Return from the current subroutine.
    Return,
    /// The thread is finished with the packet.
    Done(Verdict),
    /// Wait for another thread, then continue at the label (see [`Yield`]).
    Yield(Label),
}

const STEP_SHIFT: u32 = 56;
const STEP_GOTO: u64 = 0;
const STEP_CALL: u64 = 1;
const STEP_RETURN: u64 = 2;
const STEP_DONE: u64 = 3;
const STEP_YIELD: u64 = 4;
/// Labels are 28-bit so a call's two labels fit one word.
const LABEL_BITS: u32 = 28;
const LABEL_MASK: u64 = (1 << LABEL_BITS) - 1;
/// Most labels a program may have.
pub const MAX_LABELS: usize = 1 << LABEL_BITS;

/// Continue at `label`.
#[allow(non_snake_case)]
#[inline(always)]
pub const fn Goto(label: Label) -> Next {
    Next(STEP_GOTO << STEP_SHIFT | label.0 as u64)
}

/// Call `target` as a subroutine; its `Return` continues at `ret`.
#[allow(non_snake_case)]
#[inline(always)]
pub const fn Call(target: Label, ret: Label) -> Next {
    Next(STEP_CALL << STEP_SHIFT | (ret.0 as u64) << LABEL_BITS | target.0 as u64)
}

/// Return from the current subroutine.
#[allow(non_upper_case_globals)]
pub const Return: Next = Next(STEP_RETURN << STEP_SHIFT);

/// Wait for another thread, then continue at `label`: for a thread that found something
/// another thread holds for a few XTXNs (a record it is creating, a lock). The sequencer
/// lets the other threads run (it yields the host core, and after
/// [`YIELDS_BEFORE_SLEEP`](super::YIELDS_BEFORE_SLEEP) waits of the packet sleeps
/// [`WAIT_SLEEP`](super::WAIT_SLEEP) between looks, so a holder the host descheduled is
/// waited for) and then runs `label`, which counts as an instruction: the instruction
/// budget bounds the wait. Programs never sleep themselves.
#[allow(non_snake_case)]
#[inline(always)]
pub const fn Yield(label: Label) -> Next {
    Next(STEP_YIELD << STEP_SHIFT | label.0 as u64)
}

/// The thread is finished with the packet.
#[allow(non_snake_case)]
#[inline(always)]
pub const fn Done(verdict: Verdict) -> Next {
    let (kind, value) = match verdict {
        Verdict::Forward(p) => (0u64, p),
        Verdict::Multicast(g) => (1, g),
        Verdict::Drop(r) => (2, r.0),
        Verdict::Consume => (3, 0),
    };
    Next(STEP_DONE << STEP_SHIFT | kind << 16 | value as u64)
}

impl Next {
    /// The label of a [`Goto`], the most common step: one comparison, not
    /// [`Next::step`]'s full decode.
    #[inline(always)]
    pub(crate) const fn goto_label(self) -> Option<Label> {
        // A goto is its label alone: the step kind's bits are zero.
        if self.0 >> STEP_SHIFT == STEP_GOTO {
            Some(Label(self.0 as u32))
        } else {
            None
        }
    }

    /// What the sequencer will do.
    #[inline(always)]
    pub const fn step(self) -> Step {
        let a = Label((self.0 & LABEL_MASK) as u32);
        match self.0 >> STEP_SHIFT {
            STEP_GOTO => Step::Goto(a),
            STEP_CALL => Step::Call(a, Label((self.0 >> LABEL_BITS & LABEL_MASK) as u32)),
            STEP_RETURN => Step::Return,
            STEP_YIELD => Step::Yield(a),
            _ => {
                let value = self.0 as u16;
                Step::Done(match (self.0 >> 16) & 3 {
                    0 => Verdict::Forward(value),
                    1 => Verdict::Multicast(value),
                    2 => Verdict::Drop(DropReason(value)),
                    _ => Verdict::Consume,
                })
            }
        }
    }
}

impl fmt::Debug for Next {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.step().fmt(f)
    }
}
