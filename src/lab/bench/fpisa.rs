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
    /// Runs of each kind, interleaved; the report gives the medians.
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
    /// The end hosts' conversion cost per gradient.
    pub host: HostCost,
}

fn median(mut rs: Vec<TrioMlBenchReport>) -> TrioMlBenchReport {
    rs.sort_by(|x, y| x.gradients_per_s.total_cmp(&y.gradients_per_s));
    rs.swap_remove(rs.len() / 2)
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
    let (int, fp) = (median(ints), median(fps));
    Ok(FpisaBenchReport {
        variant: match cfg.variant {
            Variant::Full => "full",
            Variant::Approx => "approx",
        },
        trio_ml_gradients_per_s: int.gradients_per_s,
        ratio_to_trio_ml: fp.gradients_per_s / int.gradients_per_s,
        host: host_cost(1 << 22),
        fpisa: fp,
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
