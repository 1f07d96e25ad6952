//! The FPISA throughput benchmark (`pfemu bench fpisa`): Trio-ML's aggregation with FPISA
//! lanes (native FP32 gradients, the engine's shift-and-add) against the same workload with
//! Trio-ML's 32-bit integers, interleaved in one run so the ratio is measured under the same
//! machine conditions; and the end hosts' conversion cost per gradient in both cases
//! (Trio-ML scales floats to integers and back, FPISA sends the floats' bits as they are).
//!
//! The FPISA traffic is integer-valued floats of one binade (see
//! [`super::trio_ml::generate`]): FPISA adds them exactly in any order, so every Result is
//! checked bit for bit as Trio-ML's are.

use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;

use super::runs::{Median, Spread};
use super::trio_ml::{self, TrioMlBenchConfig, TrioMlBenchReport};
use crate::fpisa::Variant;
use crate::microcode::trio_ml::host::Scaling;
use crate::microcode::trio_ml::Lanes;

/// One `pfemu bench fpisa` run.
#[derive(Clone, Debug)]
pub struct FpisaBenchConfig {
    /// The workload and engine (its `lanes` is ignored: both kinds are run).
    pub base: TrioMlBenchConfig,
    /// Full FPISA (the shift-and-add unit) or FPISA-A.
    pub variant: Variant,
    /// Runs of each kind, interleaved; the report gives the medians, and every run of both
    /// kinds must pass its check ([`FpisaBenchReport::verified_all_runs`]).
    pub runs: usize,
}

/// End-host conversion cost, nanoseconds per gradient, on one thread.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct HostCost {
    /// FPISA: an `f32` gradient to its 4 wire bytes (its bits, network order).
    pub fpisa_send_ns: f64,
    /// FPISA: 4 wire bytes of a Result back to an `f32` mean (divided by `src_cnt`).
    pub fpisa_receive_ns: f64,
    /// Trio-ML: an `f32` gradient scaled to an `i32`, to its 4 wire bytes.
    pub trio_ml_send_ns: f64,
    /// Trio-ML: 4 wire bytes of a Result rescaled to an `f32` mean.
    pub trio_ml_receive_ns: f64,
}

/// What `pfemu bench fpisa` measured. The FPISA run's fields are those of
/// `pfemu bench trio-ml --json` (flattened), followed by the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct FpisaBenchReport {
    /// The FPISA run (median of the runs).
    #[serde(flatten)]
    pub fpisa: TrioMlBenchReport,
    /// `"full"` or `"approx"` (FPISA-A).
    pub variant: &'static str,
    /// The same workload with Trio-ML's integers (median of the interleaved runs).
    pub trio_ml_gradients_per_s: f64,
    /// `gradients_per_s / trio_ml_gradients_per_s`: FPISA's rate as a share of Trio-ML's.
    pub ratio_to_trio_ml: f64,
    /// The same share in each round (a Trio-ML run and the FPISA run after it), paired:
    /// a round's two runs share the machine's phase, which the medians of each kind's
    /// rates need not. `None` if a rate was not finite.
    pub ratio_to_trio_ml_of_rounds: Option<Spread>,
    /// The end hosts' conversion cost per gradient.
    pub host: HostCost,
    /// Every run of both kinds, FPISA's and Trio-ML's integers, passed its check (every
    /// Result arrived and its sums match); `verified` is the median FPISA run's alone.
    pub verified_all_runs: bool,
    /// The runs that failed their check, by kind ([`failed_runs`]); `None` when every run
    /// passed.
    #[serde(skip)]
    pub failed_runs: Option<String>,
}

/// The runs of either kind that failed their check, as text (`trio-ml run 2 of 3; fpisa
/// run 1 of 3`); `None` when every run of both kinds passed. The comparison is only as good
/// as both sides' results: a wrong Trio-ML sum fails the benchmark as a wrong FPISA one does.
pub fn failed_runs<A, B>(trio_ml: &Median<A>, fpisa: &Median<B>) -> Option<String> {
    let failed: Vec<String> = [
        ("trio-ml", trio_ml.failed_runs()),
        ("fpisa", fpisa.failed_runs()),
    ]
    .into_iter()
    .filter_map(|(kind, runs)| runs.map(|r| format!("{kind} {r}")))
    .collect();
    (!failed.is_empty()).then(|| failed.join("; "))
}

/// The median by rate, every run's check kept.
fn median(rs: Vec<TrioMlBenchReport>) -> Median<TrioMlBenchReport> {
    Median::of(rs, |r| r.gradients_per_s, |r| r.verified).expect("at least one run")
}

/// Runs both kinds `cfg.runs` times, interleaved, and measures the hosts' conversions.
/// `progress` is called after every run with (run, kind, report).
pub fn run(
    cfg: &FpisaBenchConfig,
    mut progress: impl FnMut(usize, &str, &TrioMlBenchReport),
) -> Result<FpisaBenchReport, super::BenchError> {
    if cfg.runs == 0 {
        return Err(crate::ConfigError::new("runs", "must be at least 1").into());
    }
    let int_cfg = TrioMlBenchConfig {
        lanes: Lanes::Int32,
        ..cfg.base.clone()
    };
    let fp_cfg = TrioMlBenchConfig {
        lanes: Lanes::Fpisa(cfg.variant),
        ..cfg.base.clone()
    };
    let mut int_traffic = trio_ml::generate(&int_cfg);
    let mut fp_traffic = trio_ml::generate(&fp_cfg);
    let (mut ints, mut fps) = (Vec::new(), Vec::new());
    for run in 0..cfg.runs {
        let r = trio_ml::run_on(&int_cfg, &mut int_traffic)?;
        progress(run, "trio-ml", &r);
        ints.push(r);
        let r = trio_ml::run_on(&fp_cfg, &mut fp_traffic)?;
        progress(run, "fpisa", &r);
        fps.push(r);
    }
    let rounds = Spread::of(
        ints.iter()
            .zip(&fps)
            .map(|(i, f)| f.gradients_per_s / i.gradients_per_s),
    );
    let (int, fp) = (median(ints), median(fps));
    let failed = failed_runs(&int, &fp);
    let (int, fp) = (int.median, fp.median);
    Ok(FpisaBenchReport {
        variant: match cfg.variant {
            Variant::Full => "full",
            Variant::Approx => "approx",
        },
        trio_ml_gradients_per_s: int.gradients_per_s,
        ratio_to_trio_ml: fp.gradients_per_s / int.gradients_per_s,
        ratio_to_trio_ml_of_rounds: rounds,
        host: host_cost(1 << 22),
        fpisa: fp,
        verified_all_runs: failed.is_none(),
        failed_runs: failed,
    })
}

/// Times the hosts' conversions over `n` gradients (the best of three passes each).
pub fn host_cost(n: usize) -> HostCost {
    let grads: Vec<f32> = (0..n).map(|i| (i as f32 * 0.618).sin() * 3.0).collect();
    let mut wire = vec![0u8; n * 4];
    let scaling = Scaling::for_range(4.0, 4);
    let src_cnt = 4.0f32;
    let per = |f: &mut dyn FnMut()| {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e9 / n as f64
            })
            .fold(f64::INFINITY, f64::min)
    };
    let trio_ml_send_ns = per(&mut || {
        for (w, g) in wire.chunks_exact_mut(4).zip(&grads) {
            w.copy_from_slice(&scaling.to_int(*g).to_be_bytes());
        }
        black_box(&wire);
    });
    let mut out = vec![0f32; n];
    let trio_ml_receive_ns = per(&mut || {
        for (o, w) in out.iter_mut().zip(wire.chunks_exact(4)) {
            let v = i32::from_be_bytes([w[0], w[1], w[2], w[3]]);
            *o = scaling.to_float(v) / src_cnt;
        }
        black_box(&out);
    });
    let fpisa_send_ns = per(&mut || {
        for (w, g) in wire.chunks_exact_mut(4).zip(&grads) {
            w.copy_from_slice(&g.to_bits().to_be_bytes());
        }
        black_box(&wire);
    });
    let fpisa_receive_ns = per(&mut || {
        for (o, w) in out.iter_mut().zip(wire.chunks_exact(4)) {
            *o = f32::from_bits(u32::from_be_bytes([w[0], w[1], w[2], w[3]])) / src_cnt;
        }
        black_box(&out);
    });
    HostCost {
        fpisa_send_ns,
        fpisa_receive_ns,
        trio_ml_send_ns,
        trio_ml_receive_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fake runs: (gradients per second, verified).
    fn runs(rs: &[(f64, bool)]) -> Median<(f64, bool)> {
        Median::of(rs.to_vec(), |r| r.0, |r| r.1).expect("runs")
    }

    #[test]
    fn every_run_of_both_kinds_must_pass() {
        let good = runs(&[(1.0, true), (2.0, true), (3.0, true)]);
        assert_eq!(failed_runs(&good, &good), None);
        // A wrong Trio-ML sum fails the benchmark, even in a single run.
        assert_eq!(
            failed_runs(&runs(&[(1.0, false)]), &runs(&[(1.0, true)])).as_deref(),
            Some("trio-ml run 1 of 1")
        );
        // A failed FPISA run other than the median (2.0) fails it too.
        let fp = runs(&[(1.0, true), (2.0, true), (3.0, false)]);
        assert!(fp.median.1);
        assert_eq!(failed_runs(&good, &fp).as_deref(), Some("fpisa run 3 of 3"));
        let int = runs(&[(1.0, false), (2.0, true), (3.0, true)]);
        assert_eq!(
            failed_runs(&int, &fp).as_deref(),
            Some("trio-ml run 1 of 3; fpisa run 3 of 3")
        );
    }
}
