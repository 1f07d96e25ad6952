//! The operand distributions of the paper's §V.A, as seeded samplers and as densities.
//!
//! Operands are integers in `0..RANGE` (the paper's domain `[0, 650000]`, read half-open so
//! that the histogram of Figure 5 has 325 bins of 2000): a continuous draw `x` truncated to
//! the domain (redrawn outside it) gives the operand `floor(x)`. The density of the same
//! truncated distribution, integrated over bins of [`HIST_BIN`], is the "true distribution"
//! Figure 5's bins are compared with ([`Dist::histogram`]).

use serde::Serialize;

use crate::rng::SplitMix64;

/// The operand domain of the paper's evaluation: operands lie in `0..RANGE`.
pub const RANGE: u32 = 650_000;

/// The paper's bin size: the true distribution is compared with the trie at this grain.
pub const HIST_BIN: u32 = 2000;

/// A distribution of real values, sampled and integrated.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Dist {
    /// Uniform on `[lo, hi)`.
    Uniform {
        /// Lower end.
        lo: f64,
        /// Upper end.
        hi: f64,
    },
    /// Exponential of mean `mean` (rate `1 / mean`).
    Exponential {
        /// The mean.
        mean: f64,
    },
    /// Gaussian of mean `mean` and standard deviation `sd`.
    Gaussian {
        /// The mean (the median).
        mean: f64,
        /// The standard deviation.
        sd: f64,
    },
    /// Fisher's F with `d1` and `d2` degrees of freedom, multiplied by `scale`.
    FisherF {
        /// Numerator degrees of freedom.
        d1: f64,
        /// Denominator degrees of freedom.
        d2: f64,
        /// The factor the F variate is multiplied by.
        scale: f64,
    },
    /// An equal mixture: each draw comes from one of the parts, chosen uniformly.
    Mixture {
        /// The parts.
        parts: Vec<Dist>,
    },
}

impl Dist {
    /// One real draw (not truncated to the domain).
    pub fn sample(&self, rng: &mut SplitMix64) -> f64 {
        match self {
            Dist::Uniform { lo, hi } => lo + (hi - lo) * rng.uniform(),
            Dist::Exponential { mean } => -mean * (1.0 - rng.uniform()).ln(),
            Dist::Gaussian { mean, sd } => mean + sd * normal(rng),
            Dist::FisherF { d1, d2, scale } => {
                // chi2(k) / k = Gamma(k/2, 1) / (k/2).
                let a = gamma(rng, d1 / 2.0) / (d1 / 2.0);
                let b = gamma(rng, d2 / 2.0) / (d2 / 2.0);
                scale * a / b
            }
            Dist::Mixture { parts } => {
                let i = rng.below(parts.len() as u64) as usize;
                parts[i].sample(rng)
            }
        }
    }

    /// The density at `x`.
    pub fn pdf(&self, x: f64) -> f64 {
        match self {
            Dist::Uniform { lo, hi } => {
                // Closed at both ends (a density's value at a point does not matter), so that
                // Simpson's rule integrates a bin that ends at `hi` exactly.
                if (*lo..=*hi).contains(&x) {
                    1.0 / (hi - lo)
                } else {
                    0.0
                }
            }
            Dist::Exponential { mean } => {
                if x < 0.0 {
                    0.0
                } else {
                    (-x / mean).exp() / mean
                }
            }
            Dist::Gaussian { mean, sd } => {
                let z = (x - mean) / sd;
                (-0.5 * z * z).exp() / (sd * (2.0 * std::f64::consts::PI).sqrt())
            }
            Dist::FisherF { d1, d2, scale } => {
                let y = x / scale;
                if y <= 0.0 {
                    return 0.0;
                }
                let ln = 0.5 * (d1 * (d1 * y).ln() + d2 * d2.ln() - (d1 + d2) * (d1 * y + d2).ln())
                    - y.ln()
                    - ln_beta(d1 / 2.0, d2 / 2.0);
                ln.exp() / scale
            }
            Dist::Mixture { parts } => {
                parts.iter().map(|p| p.pdf(x)).sum::<f64>() / parts.len() as f64
            }
        }
    }

    /// An operand in `0..range`: a draw truncated to `[0, range)`, rounded down. Draws
    /// outside are redrawn; after 10000 misses in a row (a distribution far outside the
    /// domain) the last is clamped into it.
    pub fn operand(&self, rng: &mut SplitMix64, range: u32) -> u32 {
        let mut x = 0.0;
        for _ in 0..10_000 {
            x = self.sample(rng);
            if x >= 0.0 && x < f64::from(range) {
                return x as u32;
            }
        }
        x.clamp(0.0, f64::from(range - 1)) as u32
    }

    /// A non-zero operand in `1..range` (the error measurements leave 0 to the program's
    /// branch, see the module doc of [`super`]).
    pub fn nonzero_operand(&self, rng: &mut SplitMix64, range: u32) -> u32 {
        for _ in 0..10_000 {
            let x = self.operand(rng, range);
            if x != 0 {
                return x;
            }
        }
        1
    }

    /// The probability of each bin `[i * bin, (i + 1) * bin)` of `[0, range)` under the
    /// distribution truncated to `[0, range)`: the density integrated by Simpson's rule.
    pub fn histogram(&self, range: u32, bin: u32) -> Vec<f64> {
        const STEPS: u32 = 32;
        let bins = range.div_ceil(bin);
        let mass: Vec<f64> = (0..bins)
            .map(|i| {
                let lo = f64::from(i * bin);
                let hi = f64::from(((i + 1) * bin).min(range));
                let h = (hi - lo) / f64::from(STEPS);
                let inner: f64 = (1..STEPS)
                    .map(|k| {
                        let w = if k % 2 == 1 { 4.0 } else { 2.0 };
                        w * self.pdf(lo + h * f64::from(k))
                    })
                    .sum();
                (self.pdf(lo) + inner + self.pdf(hi)) * h / 3.0
            })
            .collect();
        let total: f64 = mass.iter().sum();
        if total > 0.0 {
            mass.iter().map(|m| m / total).collect()
        } else {
            mass
        }
    }
}

/// A standard normal draw (Box-Muller).
pub fn normal(rng: &mut SplitMix64) -> f64 {
    let u1 = 1.0 - rng.uniform(); // (0, 1]
    let u2 = rng.uniform();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A Gamma(`k`, 1) draw, `k >= 1` (Marsaglia and Tsang).
fn gamma(rng: &mut SplitMix64, k: f64) -> f64 {
    let d = k - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = 1.0 - rng.uniform();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// `ln Gamma(x)` for `x > 0` (Lanczos, g = 7, nine terms; about 15 digits).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let a = G[1..]
        .iter()
        .enumerate()
        .fold(G[0], |a, (i, g)| a + g / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

fn ln_beta(a: f64, b: f64) -> f64 {
    ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_matches_factorials() {
        for n in 1..15u32 {
            let fact: f64 = (1..n).map(f64::from).product();
            assert!((ln_gamma(f64::from(n)) - fact.ln()).abs() < 1e-10, "{n}");
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-10);
    }

    #[test]
    fn densities_integrate_to_one_and_match_samples() {
        let dists = [
            Dist::Exponential { mean: 20_000.0 },
            Dist::FisherF {
                d1: 100.0,
                d2: 20.0,
                scale: 100_000.0,
            },
            Dist::Mixture {
                parts: vec![
                    Dist::Gaussian {
                        mean: 16_000.0,
                        sd: 10_000.0,
                    },
                    Dist::Gaussian {
                        mean: 48_000.0,
                        sd: 10_000.0,
                    },
                ],
            },
        ];
        for d in dists {
            let h = d.histogram(RANGE, HIST_BIN);
            assert_eq!(h.len(), 325);
            assert!((h.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            // The sampled mean agrees with the density's.
            let mut rng = SplitMix64::new(9);
            let n = 40_000;
            let sampled: f64 = (0..n)
                .map(|_| f64::from(d.operand(&mut rng, RANGE)))
                .sum::<f64>()
                / n as f64;
            let integrated: f64 = h
                .iter()
                .enumerate()
                .map(|(i, p)| p * (f64::from(HIST_BIN) * (i as f64 + 0.5)))
                .sum();
            assert!(
                (sampled - integrated).abs() < 0.02 * integrated,
                "{d:?}: {sampled} vs {integrated}"
            );
        }
    }
}
