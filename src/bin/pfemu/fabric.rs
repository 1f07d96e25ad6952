//! `pfemu experiment fabric-latency`, `fabric-loss` and `pfemu bench fabric`: Hipernetch's
//! single-switch evaluation on the fabric models, and `pfemu experiment pipelines` and `ada`,
//! with a progress bar.

use pfemu::lab::bench::ada::{AdaConfig, AdaReport};
use pfemu::lab::bench::experiments::ExperimentError;
use pfemu::lab::bench::fabric::{
    self, FabricBenchConfig, FabricChassisConfig, FabricChassisReport, FabricLatencyConfig,
    FabricLatencyReport, FabricLossConfig, FabricLossReport,
};
use pfemu::lab::bench::pipelines::{PipelinesConfig, PipelinesReport};
use pfemu::lab::bench::report::Progress;

use crate::CliResult;

/// The options of `pfemu bench fabric`.
#[derive(clap::Args, Debug)]
pub struct FabricBenchArgs {
    #[command(flatten)]
    cfg: FabricBenchConfig,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Runs `f` with a progress bar labelled `label` fed by its (done, total) calls.
fn with_progress<T>(
    label: &str,
    quiet: bool,
    f: impl FnOnce(&(dyn Fn(usize, usize) + Sync)) -> T,
) -> T {
    let bar = Progress::new(label, quiet);
    let out = f(&|done, total| {
        bar.set(
            done as f64 / total.max(1) as f64,
            format!("{done}/{total} points"),
        )
    });
    bar.finish();
    out
}

/// Figures 9, 11 and 12.
pub fn latency(
    cfg: &FabricLatencyConfig,
    quiet: bool,
) -> Result<FabricLatencyReport, ExperimentError> {
    with_progress("fabric-latency", quiet, |p| fabric::fabric_latency(cfg, p))
}

/// Figure 13.
pub fn loss(cfg: &FabricLossConfig, quiet: bool) -> Result<FabricLossReport, ExperimentError> {
    with_progress("fabric-loss", quiet, |p| fabric::fabric_loss(cfg, p))
}

/// The chassis experiment.
pub fn chassis(
    cfg: &FabricChassisConfig,
    quiet: bool,
) -> Result<FabricChassisReport, ExperimentError> {
    with_progress("fabric-chassis", quiet, |p| fabric::fabric_chassis(cfg, p))
}

/// The pipelines experiment.
pub fn pipelines(cfg: &PipelinesConfig, quiet: bool) -> Result<PipelinesReport, ExperimentError> {
    with_progress("pipelines", quiet, |p| {
        pfemu::lab::bench::pipelines::pipelines(cfg, p)
    })
}

/// The ADA experiment.
pub fn ada(cfg: &AdaConfig, quiet: bool) -> Result<AdaReport, ExperimentError> {
    with_progress("ada", quiet, |p| pfemu::lab::bench::ada::ada(cfg, p))
}

/// `pfemu bench fabric`.
pub fn bench(a: &FabricBenchArgs) -> CliResult {
    let r = fabric::fabric_bench(&a.cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{}", r.table());
    }
    Ok(())
}
