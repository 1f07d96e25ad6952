//! Benchmark support: the traffic generator and the benchmarks behind `pfemu bench`.

pub mod ada;
pub mod demo;
pub mod error;
pub mod experiments;
pub mod fabric;
pub mod filter;
pub mod fpisa;
pub mod fpisa_accuracy;
pub mod l3fwd;
pub mod linerate;
pub mod linerate_pfe;
pub mod nimble;
pub mod pipelines;
pub mod plot;
pub mod report;
pub mod runs;
pub mod settings;
pub mod timers;
pub mod traffic;
pub mod trio_ml;

pub use error::{BenchError, PlotError};
pub use settings::{EngineChoice, EngineSettings, EngineSweep, ReorderSweep};
