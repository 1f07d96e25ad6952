//! The errors of the benchmarks behind `pfemu bench` and `pfemu demo`, and of their plots.

use std::error::Error;
use std::fmt;

use crate::microcode::trio_ml::host::HostError;
use crate::microcode::trio_ml::TrioMlError;
use crate::pfe::{InjectError, StartError};
use crate::ConfigError;

/// Why a benchmark (or the demo) could not run or finish.
#[derive(Debug)]
#[non_exhaustive]
pub enum BenchError {
    /// A setting was refused (by the benchmark, the engine's builder or its memory).
    Config(ConfigError),
    /// Trio-ML (or FPISA) could not be installed or given its job.
    TrioMl(TrioMlError),
    /// The engine would not start.
    Start(StartError),
    /// The engine refused frames (it stopped while the benchmark ran).
    Inject(InjectError),
    /// An end host failed (for instance it gave up waiting for its Results).
    Host(HostError),
    /// A run went wrong in a way no setting explains (a worker thread panicked, the engine
    /// refused a frame while running).
    Run(String),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Config(e) => write!(f, "{e}"),
            BenchError::TrioMl(e) => write!(f, "setting up Trio-ML: {e}"),
            BenchError::Start(e) => write!(f, "starting the PFE: {e}"),
            BenchError::Inject(e) => write!(f, "injecting frames: {e}"),
            BenchError::Host(e) => write!(f, "a worker failed: {e}"),
            BenchError::Run(e) => write!(f, "{e}"),
        }
    }
}

impl Error for BenchError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            BenchError::Config(e) => Some(e),
            BenchError::TrioMl(e) => Some(e),
            BenchError::Start(e) => Some(e),
            BenchError::Inject(e) => Some(e),
            BenchError::Host(e) => Some(e),
            BenchError::Run(_) => None,
        }
    }
}

impl From<ConfigError> for BenchError {
    fn from(e: ConfigError) -> Self {
        BenchError::Config(e)
    }
}

impl From<TrioMlError> for BenchError {
    fn from(e: TrioMlError) -> Self {
        BenchError::TrioMl(e)
    }
}

impl From<StartError> for BenchError {
    fn from(e: StartError) -> Self {
        BenchError::Start(e)
    }
}

impl From<InjectError> for BenchError {
    fn from(e: InjectError) -> Self {
        BenchError::Inject(e)
    }
}

impl From<HostError> for BenchError {
    fn from(e: HostError) -> Self {
        BenchError::Host(e)
    }
}

/// A chart could not be drawn or its file written: what the plotting library said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotError(pub String);

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "drawing the chart: {}", self.0)
    }
}

impl Error for PlotError {}

impl<E: Error + Send + Sync> From<plotters::drawing::DrawingAreaErrorKind<E>> for PlotError {
    fn from(e: plotters::drawing::DrawingAreaErrorKind<E>) -> Self {
        PlotError(e.to_string())
    }
}
