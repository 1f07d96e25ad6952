//! The paper's latency arithmetic: CPRR's pipeline length (§5.1-5.3, equations 1-4 and
//! Table 1), the port-to-port latency and throughput of an implementation (§7.3), and the
//! queueing delay of an output queue (§5.5, equation 7).
//!
//! The pipeline equations are in terms of `l = log2(P)`; P is a power of two. The raw
//! equations take any `l` without panicking (their arithmetic saturates far beyond any
//! switch, `l` above 90 000), and [`latency_opt`] refuses an `s` of 0 or an index past the
//! pipeline's end; [`pipeline`] checks P and S and names the one at fault.
//!
//! ```
//! use pfemu::fabric::latency::{pipeline, port_to_port_ns, throughput_gbps};
//! // §7.3: the 16-port, 512-bit, S = 2 design at 105.5 Gbit/s per port has a 39 ns latency.
//! let f_clk = 105.5e9 / 512.0;
//! let p = pipeline(16, 2)?;
//! assert_eq!(p.latency_opt, 7);
//! assert_eq!(port_to_port_ns(p.latency_opt, f_clk).round(), 39.0);
//! assert!((throughput_gbps(512, f_clk) - 105.5).abs() < 1e-9);
//! # Ok::<(), pfemu::ConfigError>(())
//! ```

use crate::error::ConfigError;

/// The sorting network's stages, `l (l + 1) / 2` (§4.2, Batcher's odd-even merge sort).
pub fn latency_sorting_network(l: u32) -> u32 {
    let stages = u64::from(l) * (u64::from(l) + 1) / 2;
    u32::try_from(stages).unwrap_or(u32::MAX)
}

/// The offsets pipeline's stages, `2 l + 1` (adder trees, prefix sum, subtractors).
pub fn latency_offsets(l: u32) -> u32 {
    l.saturating_mul(2).saturating_add(1)
}

/// Equation 1: the pipeline length, `l + max(l (l + 1) / 2, 2 l + 1)`: the barrel shifter's
/// `l` stages after the longer of the two pipelines.
pub fn pipeline_length(l: u32) -> u32 {
    l.saturating_add(latency_sorting_network(l).max(latency_offsets(l)))
}

/// Equation 2: the compulsory register's index (the offset counters' feedback) before
/// §5.3's synchronisation optimisation, `l`.
pub fn index_comp(l: u32) -> u32 {
    l
}

/// Equation 4: the compulsory register's index once the offsets pipeline starts late (§5.3),
/// `max(l (l + 1) / 2, 2 l + 1) - 1 - l`. Table 1 uses this one.
pub fn index_comp_synchronised(l: u32) -> u32 {
    // The longer pipeline is at least 2 l + 1 stages, so this never goes below 0.
    latency_sorting_network(l)
        .max(latency_offsets(l))
        .saturating_sub(1 + l.min(u32::MAX - 1))
}

/// Equation 3: the pipeline latency after keeping only every `s`-th stage's registers and
/// the compulsory one at `index_comp`:
/// `ceil((latency - index_comp) / s) + ceil((1 + index_comp) / s) - 1`.
/// `None` when `s` is 0 or `index_comp` is past `latency`: the equation has no value there.
pub fn latency_opt(latency: u32, index_comp: u32, s: u32) -> Option<u32> {
    if s == 0 || index_comp > latency {
        return None;
    }
    let (latency, index_comp, s) = (u64::from(latency), u64::from(index_comp), u64::from(s));
    let stages = (latency - index_comp).div_ceil(s) + (1 + index_comp).div_ceil(s) - 1;
    Some(u32::try_from(stages).unwrap_or(u32::MAX))
}

/// One column of Table 1: a P-port CPRR's pipeline with register reduction `s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipeline {
    /// Equation 1, "Pipeline length".
    pub length: u32,
    /// Equation 4, "Compulsory reg. index".
    pub index_comp: u32,
    /// Equation 3 with equation 4's index, "Pipeline latency".
    pub latency_opt: u32,
}

/// Table 1's column for `ports` (a power of two, at least 2) and `s` (at least 1).
pub fn pipeline(ports: usize, s: u32) -> Result<Pipeline, ConfigError> {
    if ports < 2 || !ports.is_power_of_two() {
        return Err(ConfigError::new(
            "ports",
            format!("{ports}: the pipeline equations take a power of two, at least 2"),
        ));
    }
    if s == 0 {
        return Err(ConfigError::new(
            "s",
            "S divides the pipeline stages: at least 1",
        ));
    }
    let l = ports.trailing_zeros();
    let length = pipeline_length(l);
    let index_comp = index_comp_synchronised(l);
    // Equation 4's index is at most equation 1's length less l + 1, and s is at least 1.
    let latency_opt = latency_opt(length, index_comp, s).unwrap_or(length);
    Ok(Pipeline {
        length,
        index_comp,
        latency_opt,
    })
}

/// §7.3: the port-to-port latency in ns, `(latency_opt + 1) / f_clk` (one more cycle to
/// read the queues), at `f_clk_hz`.
pub fn port_to_port_ns(latency_opt: u32, f_clk_hz: f64) -> f64 {
    (f64::from(latency_opt) + 1.0) / f_clk_hz * 1e9
}

/// §7.3: a port's throughput in Gbit/s, `width x f_clk`, for `width_bits`-bit cells.
pub fn throughput_gbps(width_bits: u32, f_clk_hz: f64) -> f64 {
    f64::from(width_bits) * f_clk_hz / 1e9
}

/// Equation 7: the mean wait of an M/D/1 queue with service rate 1, `λ / (2 (1 - λ))`, at
/// arrival rate `load` (infinite at 1 and above).
pub fn md1_wait(load: f64) -> f64 {
    if load >= 1.0 {
        return f64::INFINITY;
    }
    load / (2.0 * (1.0 - load))
}

/// The exact mean wait of a P-port output queue under uniform Bernoulli arrivals at `load`
/// (Karol, Hluchyj & Morgan, "Input versus output queueing on a space-division packet
/// switch", IEEE Trans. Commun. 35(12), 1987): `(P - 1) / P` of equation 7. A cycle brings
/// a binomial, not Poisson, number of cells to an output, at most P; equation 7 is its
/// limit for large P. At P = 16 the two differ by 1/16 = 6.25%.
pub fn oq_bernoulli_wait(ports: usize, load: f64) -> f64 {
    let p = ports as f64;
    (p - 1.0) / p * md1_wait(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1, every cell: P = 2..256, length, compulsory index, S = 1, 2, 4, 8.
    #[test]
    fn table_1() {
        let ports = [2, 4, 8, 16, 32, 64, 128, 256];
        let length = [4, 7, 10, 14, 20, 27, 35, 44];
        let index = [1, 2, 3, 5, 9, 14, 20, 27];
        let by_s: [(u32, [u32; 8]); 4] = [
            (1, [4, 7, 10, 14, 20, 27, 35, 44]),
            (2, [2, 4, 5, 7, 10, 14, 18, 22]),
            (4, [1, 2, 2, 4, 5, 7, 9, 11]),
            (8, [1, 1, 1, 2, 3, 3, 4, 6]),
        ];
        for (k, &p) in ports.iter().enumerate() {
            for &(s, row) in &by_s {
                let col = pipeline(p, s).unwrap();
                assert_eq!(col.length, length[k], "length, P = {p}");
                assert_eq!(col.index_comp, index[k], "index, P = {p}");
                assert_eq!(col.latency_opt, row[k], "S = {s}, P = {p}");
            }
        }
    }

    /// Table 1's last row: (latency_opt + 1) / 150 MHz with S = 4, as printed (truncated
    /// to one decimal: 66.6 for 66.67).
    #[test]
    fn table_1_nanoseconds() {
        let printed = [13.3, 20.0, 20.0, 33.3, 40.0, 53.3, 66.6, 80.0];
        for (k, p) in [2, 4, 8, 16, 32, 64, 128, 256].into_iter().enumerate() {
            let ns = port_to_port_ns(pipeline(p, 4).unwrap().latency_opt, 150e6);
            assert!((ns - printed[k]).abs() < 0.1, "P = {p}: {ns}");
        }
    }

    /// Equation 2's index is the one before §5.3's optimisation: with it, three cells of
    /// Table 1 would differ (P = 32, S = 8: 2 for 3; P = 128, S = 2 and 4: 17 and 8 for 18
    /// and 9), so the table was computed with equation 4's.
    #[test]
    fn equation_2_would_not_give_table_1() {
        let eq2 = |l: u32, s: u32| latency_opt(pipeline_length(l), index_comp(l), s).unwrap();
        assert_eq!(index_comp(4), 4);
        assert_eq!((eq2(5, 8), eq2(7, 2), eq2(7, 4)), (2, 17, 8));
        assert_eq!(pipeline(32, 8).unwrap().latency_opt, 3);
        assert_eq!(pipeline(128, 2).unwrap().latency_opt, 18);
    }

    #[test]
    fn section_7_3() {
        let f_clk = 105.5e9 / 512.0;
        let p = pipeline(16, 2).unwrap();
        let ns = port_to_port_ns(p.latency_opt, f_clk);
        assert!((ns - 39.0).abs() < 0.5, "{ns}");
        assert!((throughput_gbps(512, f_clk) * 16.0 / 1000.0 - 1.7).abs() < 0.05);
    }

    /// The raw equations take any argument without panicking: equation 3 has no value for
    /// `s` = 0 or an index past the pipeline, and absurd `l` saturate.
    #[test]
    fn the_equations_never_panic() {
        assert_eq!(latency_opt(14, 5, 0), None);
        assert_eq!(latency_opt(5, 14, 1), None);
        assert_eq!(latency_opt(14, 5, 4), Some(4));
        assert_eq!(latency_opt(u32::MAX, 0, 1), Some(u32::MAX));
        assert_eq!(latency_sorting_network(u32::MAX), u32::MAX);
        assert_eq!(latency_offsets(u32::MAX), u32::MAX);
        assert_eq!(pipeline_length(u32::MAX), u32::MAX);
        assert_eq!(index_comp_synchronised(u32::MAX), 0);
        assert_eq!(index_comp_synchronised(0), 0);
        assert!(port_to_port_ns(u32::MAX, 1e9).is_finite());
    }

    #[test]
    fn bad_pipelines_are_refused() {
        assert_eq!(pipeline(12, 1).unwrap_err().setting, "ports");
        assert_eq!(pipeline(1, 1).unwrap_err().setting, "ports");
        assert_eq!(pipeline(16, 0).unwrap_err().setting, "s");
    }

    #[test]
    fn equation_7() {
        assert_eq!(md1_wait(0.0), 0.0);
        assert!((md1_wait(0.5) - 0.5).abs() < 1e-12);
        assert!((md1_wait(0.9) - 4.5).abs() < 1e-12);
        assert!(md1_wait(1.0).is_infinite());
        assert!((oq_bernoulli_wait(16, 0.5) - 0.46875).abs() < 1e-12);
    }
}
