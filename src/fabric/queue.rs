//! A bounded (or unbounded) FIFO of cells, the one queue every architecture is built of.

use std::collections::VecDeque;

use super::{Cell, Depth};

/// A FIFO of at most `limit` cells. Storage grows to the largest occupancy seen and is kept,
/// so a run in steady state does not allocate.
#[derive(Clone, Debug)]
pub(super) struct Fifo {
    cells: VecDeque<Cell>,
    /// The most cells it holds; `usize::MAX` when infinite.
    limit: usize,
}

impl Fifo {
    pub(super) fn new(depth: Depth) -> Self {
        Fifo {
            cells: VecDeque::new(),
            limit: depth.cells(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.cells.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Room for this many more cells (`usize::MAX` and below when infinite).
    pub(super) fn room(&self) -> usize {
        self.limit - self.cells.len()
    }

    /// Appends `cell`, or hands it back when full.
    pub(super) fn push(&mut self, cell: Cell) -> Result<(), Cell> {
        if self.cells.len() >= self.limit {
            return Err(cell);
        }
        self.cells.push_back(cell);
        Ok(())
    }

    pub(super) fn pop(&mut self) -> Option<Cell> {
        self.cells.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_fifo_hands_the_cell_back() {
        let mut f = Fifo::new(Depth::Finite(2));
        assert!(f.push(Cell::new(0, 0, 1)).is_ok());
        assert!(f.push(Cell::new(0, 0, 2)).is_ok());
        assert_eq!(f.room(), 0);
        assert_eq!(f.push(Cell::new(0, 0, 3)).unwrap_err().tag, 3);
        assert_eq!(f.pop().map(|c| c.tag), Some(1));
        assert_eq!(f.len(), 1);
        assert!(!f.is_empty());
        let mut inf = Fifo::new(Depth::Infinite);
        for t in 0..1000 {
            assert!(inf.push(Cell::new(0, 0, t)).is_ok());
        }
    }
}
