//! The runs of one benchmark configuration (`--runs N`): the report gives the median run's
//! figures, but every run must pass its check. A wrong result in a run that happened not to
//! be the median is still a wrong result.

/// A configuration's runs: the median by a measure (e.g. Mpps), the others, and which runs
/// failed their check.
#[derive(Clone, Debug)]
pub struct Median<R> {
    /// The run of the median measure (the upper one of an even count).
    pub median: R,
    /// The other runs, in order of their measure.
    pub others: Vec<R>,
    /// Every run's measure, in run order.
    pub measures: Vec<f64>,
    /// The runs (counted from 1, in run order) that failed their check.
    pub failed: Vec<usize>,
}

impl<R> Median<R> {
    /// `runs` (in run order), their median by `measure` and the runs `verified` says failed.
    /// `None` when there are no runs.
    pub fn of(
        mut runs: Vec<R>,
        measure: impl Fn(&R) -> f64,
        verified: impl Fn(&R) -> bool,
    ) -> Option<Self> {
        if runs.is_empty() {
            return None;
        }
        let measures: Vec<f64> = runs.iter().map(&measure).collect();
        let failed: Vec<usize> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| !verified(r))
            .map(|(i, _)| i + 1)
            .collect();
        runs.sort_by(|x, y| measure(x).total_cmp(&measure(y)));
        let median = runs.remove(runs.len() / 2);
        Some(Median {
            median,
            others: runs,
            measures,
            failed,
        })
    }

    /// The spread of another figure of every run (`f`), e.g. each run's ratio to a
    /// baseline it measured itself: the median run by the set's measure need not be the
    /// run of the median ratio. `None` if a run's figure is not finite.
    pub fn spread_of(&self, f: impl Fn(&R) -> f64) -> Option<Spread> {
        Spread::of(std::iter::once(&self.median).chain(&self.others).map(f))
    }

    /// How many runs there were.
    pub fn runs(&self) -> usize {
        self.measures.len()
    }

    /// Every run passed its check (the median's alone is not enough).
    pub fn verified_all_runs(&self) -> bool {
        self.failed.is_empty()
    }

    /// Which runs failed, as text (`run 2 of 3`, `runs 1, 3 of 3`); `None` when every run
    /// passed.
    pub fn failed_runs(&self) -> Option<String> {
        match self.failed.as_slice() {
            [] => None,
            [one] => Some(format!("run {one} of {}", self.runs())),
            many => {
                let list: Vec<String> = many.iter().map(usize::to_string).collect();
                Some(format!("runs {} of {}", list.join(", "), self.runs()))
            }
        }
    }
}

/// Figures of several runs: their median (the upper one of an even count, as
/// [`Median`]'s), least and greatest.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Spread {
    /// The median figure.
    pub median: f64,
    /// The least.
    pub min: f64,
    /// The greatest.
    pub max: f64,
}

impl Spread {
    /// The spread of `figures`; `None` if there are none or one is not finite.
    pub fn of(figures: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = figures.into_iter().collect();
        if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Spread {
            median: v[v.len() / 2],
            min: v[0],
            max: v[v.len() - 1],
        })
    }

    /// The spread of `count` ratios as a report prints it, with `decimals` digits:
    /// `median 0.922x (0.733-1.033x over 9 runs)` (`of` naming what was counted).
    pub fn text(&self, decimals: usize, count: usize, of: &str) -> String {
        format!(
            "median {:.d$}x ({:.d$}-{:.d$}x over {count} {of})",
            self.median,
            self.min,
            self.max,
            d = decimals
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake report: (measure, verified).
    fn of(runs: &[(f64, bool)]) -> Median<(f64, bool)> {
        Median::of(runs.to_vec(), |r| r.0, |r| r.1).expect("runs")
    }

    #[test]
    fn a_failed_run_other_than_the_median_fails_the_set() {
        // The median (2.0, run 3) passed; run 1 (the slowest) did not.
        let m = of(&[(1.0, false), (3.0, true), (2.0, true)]);
        assert_eq!(m.median, (2.0, true));
        assert!(m.median.1, "the median alone passed");
        assert!(!m.verified_all_runs());
        assert_eq!(m.failed, vec![1]);
        assert_eq!(m.failed_runs().as_deref(), Some("run 1 of 3"));
        assert_eq!(m.measures, vec![1.0, 3.0, 2.0], "in run order");
        assert_eq!(m.others.len(), 2);
    }

    #[test]
    fn every_failed_run_is_named() {
        let m = of(&[(1.0, false), (2.0, true), (3.0, false), (4.0, true)]);
        assert_eq!(m.median, (3.0, false));
        assert_eq!(m.failed, vec![1, 3]);
        assert_eq!(m.failed_runs().as_deref(), Some("runs 1, 3 of 4"));
    }

    #[test]
    fn every_run_passing_passes() {
        let m = of(&[(2.0, true), (1.0, true)]);
        assert!(m.verified_all_runs());
        assert_eq!(m.failed_runs(), None);
        assert_eq!(m.median, (2.0, true));
        assert_eq!(m.runs(), 2);
    }

    /// Each run's own figure, not the median run's: the run of median rate here has the
    /// least ratio.
    #[test]
    fn the_spread_of_another_figure_takes_every_run() {
        // (rate, ratio) of three runs.
        let runs = vec![(1.0, 0.9), (2.0, 0.5), (3.0, 0.8)];
        let m = Median::of(runs, |r| r.0, |_| true).expect("runs");
        assert_eq!(m.median.1, 0.5);
        let s = m.spread_of(|r| r.1).expect("finite");
        assert_eq!((s.median, s.min, s.max), (0.8, 0.5, 0.9));
        assert_eq!(
            m.spread_of(|r| r.1 / (r.0 - 2.0)),
            None,
            "an infinite figure"
        );
        let even = Spread::of([4.0, 1.0, 3.0, 2.0]).expect("finite");
        assert_eq!(even.median, 3.0, "the upper of the two");
        assert_eq!(
            even.text(2, 4, "runs"),
            "median 3.00x (1.00-4.00x over 4 runs)"
        );
        assert_eq!(Spread::of([]), None);
        assert_eq!(Spread::of([f64::NAN]), None);
    }

    #[test]
    fn a_single_failed_run_fails() {
        let m = of(&[(1.0, false)]);
        assert!(!m.verified_all_runs());
        assert_eq!(m.failed_runs().as_deref(), Some("run 1 of 1"));
        assert!(Median::of(Vec::<(f64, bool)>::new(), |r| r.0, |r| r.1).is_none());
    }
}
