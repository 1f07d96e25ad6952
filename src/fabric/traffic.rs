//! The traffic models of §6.1, one cell per input per cycle at most.
//!
//! - [`Traffic::Bernoulli`], (a): each input sends a cell with probability r each cycle, to
//!   an output drawn uniformly.
//! - [`Traffic::Bursty`], (b): each input runs its own three-state Markov chain, Off, New
//!   and On (Figure 10). Off sends nothing; New sends a cell to a newly drawn uniform output;
//!   On sends to the previous cell's output. A burst is a New followed by its Ons.
//! - [`Traffic::Nonuniform`], (c): each input sends with probability r, to the output with
//!   its own index ("the same as the source") with probability p, else to one of the other
//!   P - 1 uniformly, `(1 - p) / (P - 1)` each.
//!
//! # The bursty chain's transition probabilities
//!
//! Figure 10 only draws them; these give mean rate r and mean burst s (at least 1). Let
//! `q = 1 - 1/s` and `n = r / (r + s (1 - r))`:
//!
//! ```text
//!            to New           to On    to Off
//! from Off   n                0        1 - n
//! from New   (1 - q) n        q        (1 - q)(1 - n)
//! from On    (1 - q) n        q        (1 - q)(1 - n)
//! ```
//!
//! Derivation. A burst continues into On with probability q each cycle, so its length is
//! geometric with mean `1 / (1 - q) = s`. When it ends, and in every Off cycle, a new burst
//! starts with probability n, the same chance in both places; so the idle time between two
//! bursts is 0 with probability n and otherwise geometric with mean `1 / n`: on average
//! `(1 - n) / n`. The rate is busy time over busy plus idle, `r = s / (s + (1 - n) / n)`,
//! which solved for n gives the n above. At r = 1, n = 1: bursts follow each other with no
//! idle cycle, which is why the chain is not limited to `1 - 1/(s + 1)` as the two-state
//! On/Off model is (§6.1). With s = 1 it is Bernoulli traffic.
//!
//! s is at most [`MAX_BURST`], 10^9 cells: from s = 2^53 (about 9 x 10^15) on, `1 - 1/s`
//! rounds to the largest draw in [0, 1) or to 1, so a burst would never end, and well
//! before that q loses the precision that makes the mean burst s.

use super::Cell;
use crate::error::ConfigError;
use crate::rng::SplitMix64;

/// The longest mean burst [`Traffic::Bursty`] takes, in cells (see the module's doc).
pub const MAX_BURST: f64 = 1e9;

/// A traffic model of §6.1.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Traffic {
    /// (a) Uniform Bernoulli arrivals.
    Bernoulli,
    /// (b) Uniform bursty arrivals with mean burst `burst` (the paper's s, 1 to
    /// [`MAX_BURST`]).
    Bursty {
        /// The mean burst length in cells.
        burst: f64,
    },
    /// (c) Nonuniform: to the output of the input's own index with probability `same`.
    Nonuniform {
        /// The paper's p, in [0, 1].
        same: f64,
    },
}

impl Traffic {
    /// The paper's three, with its defaults: s = 32, p = 0.5.
    pub const PAPER: [Traffic; 3] = [
        Traffic::Bernoulli,
        Traffic::Bursty { burst: 32.0 },
        Traffic::Nonuniform { same: 0.5 },
    ];

    /// A short name for reports: `uniform`, `bursty`, `nonuniform`.
    pub fn name(self) -> &'static str {
        match self {
            Traffic::Bernoulli => "uniform",
            Traffic::Bursty { .. } => "bursty",
            Traffic::Nonuniform { .. } => "nonuniform",
        }
    }

    /// Checks the model's parameter, naming it.
    pub fn validate(self) -> Result<(), ConfigError> {
        match self {
            Traffic::Bernoulli => Ok(()),
            Traffic::Bursty { burst } if (1.0..=MAX_BURST).contains(&burst) => Ok(()),
            Traffic::Bursty { burst } => Err(ConfigError::new(
                "burst",
                format!(
                    "{burst}: the mean burst is 1 to {MAX_BURST:e} cells (near 2^53 and beyond, \
                     1 - 1/s rounds to 1 and a burst would not end)"
                ),
            )),
            Traffic::Nonuniform { same } if (0.0..=1.0).contains(&same) => Ok(()),
            Traffic::Nonuniform { same } => Err(ConfigError::new(
                "same",
                format!("{same}: a probability, in [0, 1]"),
            )),
        }
    }
}

/// Draws a traffic model's arrivals cycle by cycle, for all inputs.
#[derive(Clone, Debug)]
pub struct TrafficGen {
    traffic: Traffic,
    ports: usize,
    load: f64,
    /// Bursty: the chance a burst goes on (q) and that one starts (n).
    go_on: f64,
    start: f64,
    /// Bursty: per input, the output of the burst under way, if one is.
    burst_to: Vec<Option<u16>>,
    bursts: u64,
    sent: u64,
    rng: SplitMix64,
}

impl TrafficGen {
    /// A generator of `traffic` for `ports` inputs at rate `load` (r, in [0, 1]) seeded
    /// with `seed`.
    pub fn new(
        traffic: Traffic,
        ports: usize,
        load: f64,
        seed: u64,
    ) -> Result<TrafficGen, ConfigError> {
        traffic.validate()?;
        if !(0.0..=1.0).contains(&load) {
            return Err(ConfigError::new(
                "load",
                format!("{load}: the input rate r is a probability, in [0, 1]"),
            ));
        }
        if !(2..=super::MAX_PORTS).contains(&ports) {
            return Err(ConfigError::new(
                "ports",
                format!("{ports}: 2..={}", super::MAX_PORTS),
            ));
        }
        let (go_on, start) = match traffic {
            Traffic::Bursty { burst } => {
                let start = if load >= 1.0 {
                    1.0
                } else {
                    load / (load + burst * (1.0 - load))
                };
                (1.0 - 1.0 / burst, start)
            }
            _ => (0.0, load),
        };
        Ok(TrafficGen {
            traffic,
            ports,
            load,
            go_on,
            start,
            burst_to: vec![None; ports],
            bursts: 0,
            sent: 0,
            rng: SplitMix64::new(seed),
        })
    }

    /// Bursts started so far (bursty traffic; every cell starts one otherwise).
    pub fn bursts(&self) -> u64 {
        self.bursts
    }

    /// Cells drawn so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The rate it was built for.
    pub fn load(&self) -> f64 {
        self.load
    }

    /// Replaces `out` with one cycle's arrivals, each tagged with its number in the run.
    pub fn generate(&mut self, out: &mut Vec<Cell>) {
        out.clear();
        let p = self.ports as u64;
        for i in 0..self.ports {
            let src = i as u16;
            let dst = match self.traffic {
                Traffic::Bernoulli => {
                    if self.rng.uniform() >= self.load {
                        continue;
                    }
                    self.bursts += 1;
                    self.rng.below(p) as u16
                }
                Traffic::Nonuniform { same } => {
                    if self.rng.uniform() >= self.load {
                        continue;
                    }
                    self.bursts += 1;
                    if self.rng.uniform() < same {
                        src
                    } else {
                        let d = self.rng.below(p - 1) as u16;
                        if d >= src {
                            d + 1
                        } else {
                            d
                        }
                    }
                }
                Traffic::Bursty { .. } => {
                    if let Some(d) = self.burst_to[i] {
                        if self.rng.uniform() < self.go_on {
                            self.emit(out, src, d);
                            continue;
                        }
                    }
                    // The burst ended (or none was under way): New with chance n, else Off.
                    if self.rng.uniform() >= self.start {
                        self.burst_to[i] = None;
                        continue;
                    }
                    let d = self.rng.below(p) as u16;
                    self.burst_to[i] = Some(d);
                    self.bursts += 1;
                    d
                }
            };
            self.emit(out, src, dst);
        }
    }

    fn emit(&mut self, out: &mut Vec<Cell>, src: u16, dst: u16) {
        out.push(Cell::new(src, dst, self.sent));
        self.sent += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(traffic: Traffic, ports: usize, load: f64, cycles: u64) -> (TrafficGen, Vec<Vec<Cell>>) {
        let mut g = TrafficGen::new(traffic, ports, load, 5).unwrap();
        let mut all = Vec::new();
        let mut cycle = Vec::new();
        for _ in 0..cycles {
            g.generate(&mut cycle);
            all.push(cycle.clone());
        }
        (g, all)
    }

    #[test]
    fn bernoulli_rate_and_uniform_destinations() {
        let (g, all) = run(Traffic::Bernoulli, 8, 0.3, 50_000);
        let rate = g.sent() as f64 / (8.0 * 50_000.0);
        assert!((rate - 0.3).abs() < 0.005, "{rate}");
        let mut per_dst = [0u64; 8];
        for c in all.iter().flatten() {
            per_dst[usize::from(c.dst)] += 1;
        }
        for n in per_dst {
            let share = n as f64 / g.sent() as f64;
            assert!((share - 0.125).abs() < 0.005, "{share}");
        }
    }

    /// The derived chain gives the rate r and the mean burst s it was built for, including
    /// r = 1 (back-to-back bursts), and bursts keep one destination.
    #[test]
    fn bursty_rate_and_burst_length() {
        for load in [0.2, 0.6, 0.95, 1.0] {
            let (g, all) = run(Traffic::Bursty { burst: 32.0 }, 4, load, 200_000);
            let rate = g.sent() as f64 / (4.0 * 200_000.0);
            let burst = g.sent() as f64 / g.bursts() as f64;
            assert!((rate - load).abs() < 0.02, "load {load}: rate {rate}");
            assert!((burst - 32.0).abs() < 1.5, "load {load}: burst {burst}");
            // Within a burst the destination stays: consecutive cells of an input change
            // destination at most once per burst.
            let mut last = [None; 4];
            let mut changes = 0u64;
            for c in all.iter().flatten() {
                let i = usize::from(c.src);
                if last[i].is_some_and(|d| d != c.dst) {
                    changes += 1;
                }
                last[i] = Some(c.dst);
            }
            assert!(changes <= g.bursts());
        }
    }

    #[test]
    fn nonuniform_sends_half_to_the_same_port() {
        let (g, all) = run(Traffic::Nonuniform { same: 0.5 }, 16, 0.8, 20_000);
        let same = all.iter().flatten().filter(|c| c.src == c.dst).count() as f64;
        let share = same / g.sent() as f64;
        assert!((share - 0.5).abs() < 0.01, "{share}");
        let to_3_from_0 = all
            .iter()
            .flatten()
            .filter(|c| c.src == 0 && c.dst == 3)
            .count() as f64;
        let from_0 = all.iter().flatten().filter(|c| c.src == 0).count() as f64;
        assert!((to_3_from_0 / from_0 - 0.5 / 15.0).abs() < 0.01);
    }

    /// Why bursts are bounded: a burst goes on while a draw in [0, 1) is below q = 1 - 1/s.
    /// At s = 10^16, q is the largest draw, 1 - 2^-53, and at 10^17 it is 1: the burst
    /// would not end. At the bound q is some 10^7 draws below the largest.
    #[test]
    fn the_longest_burst_still_ends() {
        let q = |s: f64| 1.0 - 1.0 / s;
        let largest_draw = 1.0 - f64::EPSILON / 2.0;
        assert_eq!((q(1e16), q(1e17)), (largest_draw, 1.0));
        assert!(q(MAX_BURST) < largest_draw);
        assert!(TrafficGen::new(Traffic::Bursty { burst: MAX_BURST }, 4, 0.5, 1).is_ok());
    }

    #[test]
    fn parameters_are_checked() {
        let bad = [
            (Traffic::Bernoulli, 1.5, "load"),
            (Traffic::Bursty { burst: 0.5 }, 0.5, "burst"),
            (Traffic::Bursty { burst: f64::NAN }, 0.5, "burst"),
            (Traffic::Bursty { burst: 1e16 }, 0.5, "burst"),
            (
                Traffic::Bursty {
                    burst: MAX_BURST * 2.0,
                },
                0.5,
                "burst",
            ),
            (Traffic::Nonuniform { same: 2.0 }, 0.5, "same"),
        ];
        for (traffic, load, setting) in bad {
            assert_eq!(
                TrafficGen::new(traffic, 4, load, 1).unwrap_err().setting,
                setting
            );
        }
    }
}
