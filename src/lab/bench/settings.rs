//! The engine settings every packet-program benchmark takes, and the command-line options
//! they are set by.
//!
//! The settings are written once: each field of a lab configuration carries its clap
//! option, and the option's default is the configuration's [`Default`] (so `--help` shows
//! what a library user gets). The CLI flattens these configurations into its commands.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;
use serde::Serialize;

use crate::pfe::{
    default_ppe_threads, PfeBuilder, DEFAULT_BATCH_SIZE, DEFAULT_CAPACITY, DEFAULT_REORDER_CONTEXTS,
};

/// How a benchmark's engine is built: the settings of [`PfeBuilder`] a benchmark varies.
///
/// As command-line options (flattened into a command), the settings a run does not sweep:
/// `--batch`, `--max-batch`, `--capacity`, `--reorder-contexts`, `--pin`, `--no-latency` and
/// `--profile`.
/// The PPE threads and the reordering are the command's own options ([`EngineChoice`] for
/// one configuration, [`EngineSweep`] for several measured interleaved).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, clap::Args)]
pub struct EngineSettings {
    /// PPE threads.
    #[arg(skip = default_ppe_threads())]
    pub ppe_threads: usize,
    /// Per-flow reordering.
    #[arg(skip = true)]
    pub reorder: bool,
    /// Packets per dispatch batch while the PPE threads keep up.
    #[arg(long = "batch", value_name = "N", default_value_t = DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Packets per dispatch batch at most while a backlog waits for the PPE threads; equal
    /// to `--batch` for batches of one size [default: 8 x `--batch`, within `--capacity`
    /// and 1024].
    #[arg(long = "max-batch", value_name = "N")]
    pub max_batch_size: Option<usize>,
    /// Packets in flight at most.
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    pub capacity: usize,
    /// Reorder contexts flows are folded into (a power of two).
    #[arg(long, default_value_t = DEFAULT_REORDER_CONTEXTS)]
    pub reorder_contexts: usize,
    /// Pin PPE threads to cores.
    #[arg(long)]
    pub pin: bool,
    /// Measure ingress-to-egress latency (two clock reads per batch); `--no-latency` saves
    /// them.
    #[arg(long = "no-latency", action = clap::ArgAction::SetFalse,
          help = "Do not measure latency (saves two clock reads per batch)")]
    pub latency: bool,
    /// Print where the time went per stage: ingress, dispatch, program, reorder, egress, sink
    #[arg(long)]
    pub profile: bool,
}

impl Default for EngineSettings {
    /// PPE threads = cores, reordering on, the engine's default batch size, capacity and
    /// reorder contexts, not pinned, latency measured, not profiled.
    fn default() -> Self {
        EngineSettings {
            ppe_threads: default_ppe_threads(),
            reorder: true,
            batch_size: DEFAULT_BATCH_SIZE,
            max_batch_size: None,
            capacity: DEFAULT_CAPACITY,
            reorder_contexts: DEFAULT_REORDER_CONTEXTS,
            pin: false,
            latency: true,
            profile: false,
        }
    }
}

impl EngineSettings {
    /// `builder` with these settings.
    pub fn apply(&self, builder: PfeBuilder) -> PfeBuilder {
        let builder = builder
            .ppe_threads(self.ppe_threads)
            .reorder(self.reorder)
            .batch_size(self.batch_size)
            .capacity(self.capacity)
            .reorder_contexts(self.reorder_contexts)
            .pin_threads(self.pin)
            .latency(self.latency)
            .profile(self.profile);
        match self.max_batch_size {
            Some(n) => builder.max_batch_size(n),
            None => builder,
        }
    }
}

/// The PPE threads and the reordering of a command that measures one configuration
/// (`--ppe-threads N`, `--reorder on|off`).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct EngineChoice {
    /// PPE threads [default: available cores].
    #[arg(long, default_value_t = default_ppe_threads(), hide_default_value = true)]
    pub ppe_threads: usize,
    /// Per-flow reordering: `on` or `off` (off measures the reorder engine's cost).
    #[arg(
        long,
        action = clap::ArgAction::Set,
        default_value = "on",
        value_parser = PossibleValuesParser::new(["on", "off"]).map(|v| v == "on"),
        value_name = "on|off"
    )]
    pub reorder: bool,
}

impl EngineChoice {
    /// `settings` with this choice of PPE threads and reordering.
    pub fn apply(&self, settings: &EngineSettings) -> EngineSettings {
        EngineSettings {
            ppe_threads: self.ppe_threads,
            reorder: self.reorder,
            ..settings.clone()
        }
    }
}

/// Whether to reorder, for a command that can measure both interleaved.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReorderSweep {
    /// Per-flow reordering on.
    On,
    /// Per-flow reordering off.
    Off,
    /// Both, measured interleaved in one run.
    Both,
}

/// The PPE threads and the reordering of a command that measures several configurations
/// interleaved (`--ppe-threads 2,256`, `--reorder both`).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct EngineSweep {
    /// PPE threads; a comma-separated list measures each, interleaved (e.g. `2,256`)
    /// [default: available cores].
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]")]
    pub ppe_threads: Vec<usize>,
    /// Per-flow reordering: on, off, or both (measured interleaved in one run).
    #[arg(long, value_enum, default_value_t = ReorderSweep::On)]
    pub reorder: ReorderSweep,
}

impl EngineSweep {
    /// Every configuration to measure, `settings` with each PPE thread count and each
    /// reordering, thread counts outermost.
    pub fn points(&self, settings: &EngineSettings) -> Vec<EngineSettings> {
        let threads = if self.ppe_threads.is_empty() {
            vec![default_ppe_threads()]
        } else {
            self.ppe_threads.clone()
        };
        let reorders: &[bool] = match self.reorder {
            ReorderSweep::On => &[true],
            ReorderSweep::Off => &[false],
            ReorderSweep::Both => &[true, false],
        };
        threads
            .iter()
            .flat_map(|&t| {
                reorders.iter().map(move |&r| EngineSettings {
                    ppe_threads: t,
                    reorder: r,
                    ..settings.clone()
                })
            })
            .collect()
    }
}

/// clap's parser of an option given in seconds as a float: a positive, finite number up to
/// [`crate::duration::MAX_SECS`] (anything else is refused where it enters, and clap's
/// error names the option).
pub fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    crate::duration::secs(v).map_err(|e| e.to_string())?;
    Ok(v)
}

/// [`parse_secs`] for options given in milliseconds.
pub fn parse_millis(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of milliseconds"))?;
    crate::duration::millis(v).map_err(|e| e.to_string())?;
    Ok(v)
}

/// [`parse_millis`] as whole nanoseconds, for settings kept in nanoseconds but typed in
/// milliseconds (`--scan-period-ms`).
pub fn parse_millis_as_ns(s: &str) -> Result<u64, String> {
    let ms = parse_millis(s)?;
    let d = crate::duration::millis(ms).map_err(|e| e.to_string())?;
    Ok(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `ns` nanoseconds as the milliseconds `--help` shows for a default (`1000000` is `1`,
/// `500000` is `0.5`). The text lives as long as the program, as clap's own defaults do.
pub fn ns_as_millis_text(ns: u64) -> &'static str {
    Box::leak((ns as f64 / 1e6).to_string().into_boxed_str())
}

/// [`parse_secs`] as whole milliseconds, for settings kept in milliseconds but typed in
/// seconds (`--seconds`).
pub fn parse_secs_as_ms(s: &str) -> Result<u64, String> {
    let secs = parse_secs(s)?;
    let d = crate::duration::secs(secs).map_err(|e| e.to_string())?;
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `ms` milliseconds as the seconds `--help` shows for a default (`2000` is `2`).
pub fn ms_as_secs_text(ms: u64) -> &'static str {
    Box::leak((ms as f64 / 1e3).to_string().into_boxed_str())
}

/// A list default as it is typed, comma-separated (`0,4,8,16`), for `--help`; clap would
/// show it space-separated. The text lives as long as the program, as clap's own defaults
/// do.
pub fn list_text<T: std::fmt::Display>(values: &[T]) -> &'static str {
    let parts: Vec<String> = values.iter().map(T::to_string).collect();
    Box::leak(parts.join(",").into_boxed_str())
}
