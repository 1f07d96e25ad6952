//! The engine settings every packet-program benchmark takes.

use serde::Serialize;

use crate::pfe::{
    default_ppe_threads, PfeBuilder, DEFAULT_BATCH_SIZE, DEFAULT_CAPACITY, DEFAULT_REORDER_CONTEXTS,
};

/// How a benchmark's engine is built: the settings of [`PfeBuilder`] a benchmark varies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EngineSettings {
    /// PPE threads.
    pub ppe_threads: usize,
    /// Per-flow reordering.
    pub reorder: bool,
    /// Packets per dispatch batch.
    pub batch_size: usize,
    /// In-flight capacity.
    pub capacity: usize,
    /// Reorder contexts flows are folded into.
    pub reorder_contexts: usize,
    /// Pin PPE threads to cores.
    pub pin: bool,
    /// Measure ingress-to-egress latency (two clock reads per batch).
    pub latency: bool,
}

impl Default for EngineSettings {
    /// PPE threads = cores, reordering on, the engine's default batch size, capacity and
    /// reorder contexts, not pinned, latency measured.
    fn default() -> Self {
        EngineSettings {
            ppe_threads: default_ppe_threads(),
            reorder: true,
            batch_size: DEFAULT_BATCH_SIZE,
            capacity: DEFAULT_CAPACITY,
            reorder_contexts: DEFAULT_REORDER_CONTEXTS,
            pin: false,
            latency: true,
        }
    }
}

impl EngineSettings {
    /// `builder` with these settings.
    pub fn apply(&self, builder: PfeBuilder) -> PfeBuilder {
        builder
            .ppe_threads(self.ppe_threads)
            .reorder(self.reorder)
            .batch_size(self.batch_size)
            .capacity(self.capacity)
            .reorder_contexts(self.reorder_contexts)
            .pin_threads(self.pin)
            .latency(self.latency)
    }
}
