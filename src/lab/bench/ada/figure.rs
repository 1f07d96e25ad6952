//! The report's claims, CSV, chart and table.

use std::fmt::Write as _;
use std::path::Path;

use super::binning::GROWTH_VIEW;
use super::dist::{HIST_BIN, RANGE};
use super::lookup::{op_name, BudgetRow, Chain, ErrorStats};
use super::nimble::{NimbleRun, Variant, EXACT_TOLERANCE, PAPER_STAGES, PAPER_TABLE_II, TABLE_II};
use super::shift::SHIFTING;
use super::AdaReport;
use crate::ada::arith::Op;
use crate::lab::bench::experiments::Claim;
use crate::lab::bench::plot::{self, Line, Panel, Panels, Series};
use crate::lab::bench::PlotError;

/// A number as the table and claims print it: three significant digits.
fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if !x.is_finite() {
        format!("{x}")
    } else if (1e-2..1e4).contains(&x.abs()) {
        let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}")
    } else {
        format!("{x:.2e}")
    }
}

/// A relative error as a percentage.
fn pct(x: f64) -> String {
    format!("{}%", sci(100.0 * x))
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

// ----- claims ---------------------------------------------------------------------------------

pub(super) fn claims(r: &AdaReport) -> Vec<Claim> {
    let mut out = vec![fig5_claim(r), fig6_claim(r)];
    out.extend(budget_claims(r));
    out.push(entries_claim(r));
    out.extend(fig7_claims(r));
    out.push(shift_claim(r));
    out.extend(nimble_claims(r));
    out
}

fn fig5_claim(r: &AdaReport) -> Claim {
    let rows: Vec<String> = r
        .binning
        .iter()
        .map(|b| {
            format!(
                "{} {} ({} of it from hits spread beyond 650000; Algorithm 1's bins {}, \
                 equal-width bins over the known range {}), {} bins, {}",
                b.distribution,
                sci(b.tv_steady),
                sci(b.tv_steady_outside),
                sci(b.tv_initial),
                sci(b.tv_equal_width),
                b.bins_steady,
                if b.steady {
                    format!("last change in epoch {}", b.last_change_epoch)
                } else {
                    format!("not steady in {} epochs", b.epochs_run)
                }
            )
        })
        .collect();
    Claim {
        what: "Figure 5: the steady trie against the true distribution (total variation \
               distance, bins of 2000 over [0, 650000))"
            .into(),
        paper: "\"the bins can estimate the uniform distribution accurately\"; \"ADA can \
                accurately distribute the bins to model the targeted distribution\" (§V.A.1)"
            .into(),
        measured: rows.join("; "),
    }
}

fn fig6_claim(r: &AdaReport) -> Claim {
    let runs: Vec<String> = r
        .growth
        .iter()
        .map(|g| {
            let bins: Vec<String> = g.steps.iter().map(|s| s.bins.to_string()).collect();
            format!(
                "{}-bit operands: {} bins in {} changes{}",
                g.operand_bits,
                bins.join(" -> "),
                g.steps.len() - 1,
                if g.steady { "" } else { " (not steady)" }
            )
        })
        .collect();
    Claim {
        what: "Figure 6: bins after each change from b = 1, Gaussian of median 4000 and \
               variance 32500"
            .into(),
        paper: "\"Initially, there are two bins ... Iterations continue to the fifth iteration \
                where there are a total of 6 bins\"; \"Bins are completely matched after the \
                fourth iteration\" (§V.A.2)"
            .into(),
        measured: runs.join("; "),
    }
}

fn budget_summary(rows: &[&BudgetRow]) -> String {
    let with: Vec<&&BudgetRow> = rows.iter().filter(|r| r.ada.is_some()).collect();
    let below = with
        .iter()
        .filter(|r| r.ada.is_some_and(|a| a.mean < r.uniform.mean))
        .count();
    let p99_below = with
        .iter()
        .filter(|r| r.ada.is_some_and(|a| a.p99 < r.uniform.p99))
        .count();
    let gains: Vec<f64> = with.iter().filter_map(|r| r.gain()).collect();
    let lo = gains.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = gains.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let missing = rows.len() - with.len();
    let mut s = format!(
        "ADA's mean error below uniform's at {below} of {} points, its p99 at {p99_below}; \
         uniform's mean over ADA's: median {}x (from {}x to {}x)",
        with.len(),
        sci(median(gains)),
        sci(lo),
        sci(hi)
    );
    if missing > 0 {
        let _ = write!(
            s,
            "; no ADA population at {missing} points (the budget is below the trie's bins)"
        );
    }
    s
}

/// At each budget, at how many of `rows` ADA's mean error is below uniform's.
fn by_budget(rows: &[&BudgetRow]) -> String {
    let mut budgets: Vec<u64> = rows.iter().map(|b| b.budget).collect();
    budgets.sort_unstable();
    budgets.dedup();
    budgets
        .iter()
        .map(|&budget| {
            let at: Vec<&&BudgetRow> = rows.iter().filter(|b| b.budget == budget).collect();
            let below = at
                .iter()
                .filter(|b| b.ada.is_some_and(|a| a.mean < b.uniform.mean))
                .count();
            format!("{budget}: {below} of {}", at.len())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// How much of each budget Algorithm 3 fills, over Figure 5's distributions.
fn entries_claim(r: &AdaReport) -> Claim {
    let mut budgets: Vec<u64> = r.budgets.iter().map(|b| b.budget).collect();
    budgets.sort_unstable();
    budgets.dedup();
    let names: Vec<&str> = r.binning.iter().map(|b| b.distribution.as_str()).collect();
    let used: Vec<String> = budgets
        .iter()
        .map(|&budget| {
            // The population is the same for every operation: take square's rows.
            let n: Vec<f64> = r
                .budgets
                .iter()
                .filter(|b| b.budget == budget && b.op == "square")
                .filter(|b| names.contains(&b.distribution.as_str()))
                .filter_map(|b| b.ada_entries.map(|n| n as f64))
                .collect();
            let mean = n.iter().sum::<f64>() / n.len().max(1) as f64;
            format!(
                "{budget}: {} ({}%)",
                sci(mean),
                sci(100.0 * mean / budget as f64)
            )
        })
        .collect();
    let empty: Vec<String> = r
        .binning
        .iter()
        .map(|b| format!("{} {} of {}", b.distribution, b.empty_bins, b.bins_steady))
        .collect();
    Claim {
        what: "operand-table entries ADA's population uses of each budget (mean over Figure \
               5's distributions), and the steady tries' bins without hits (each gets one \
               entry)"
            .into(),
        paper: "ADA \"saves TCAM space for other applications by aggregating entries that are \
                unused or less popular\" (§I)"
            .into(),
        measured: format!("{}; empty bins: {}", used.join(", "), empty.join(", ")),
    }
}

fn budget_claims(r: &AdaReport) -> Vec<Claim> {
    let skewed: Vec<&BudgetRow> = r
        .budgets
        .iter()
        .filter(|b| b.distribution != "uniform")
        .collect();
    let uniform: Vec<&BudgetRow> = r
        .budgets
        .iter()
        .filter(|b| b.distribution == "uniform")
        .collect();
    let per_dist: Vec<String> = r
        .binning
        .iter()
        .map(|b| b.distribution.as_str())
        .chain([SHIFTING])
        .filter(|d| *d != "uniform")
        .map(|d| {
            let g: Vec<f64> = skewed
                .iter()
                .filter(|b| b.distribution == d)
                .filter_map(|b| b.gain())
                .collect();
            format!("{d} {}x", sci(median(g)))
        })
        .collect();
    vec![
        Claim {
            what: "mean error at the same operand-table budget, ADA against the uniform \
                   population, skewed distributions (all but uniform; every operation and \
                   budget)"
                .into(),
            paper: "ADA \"reduces average error by assigning more TCAM entries to intervals \
                    with a higher probability of occurrence\" (§I); \"ADA decreases the error \
                    propagation and the average error\" (§V.A.3)"
                .into(),
            measured: format!(
                "{}; median gain per distribution: {}; ADA below uniform by budget: {}",
                budget_summary(&skewed),
                per_dist.join(", "),
                by_budget(&skewed)
            ),
        },
        Claim {
            what: "the same on uniform operands over [0, 650000)".into(),
            paper: "the gain comes from skew and range; the paper plots no uniform case".into(),
            measured: budget_summary(&uniform),
        },
    ]
}

fn fig7_claims(r: &AdaReport) -> Vec<Claim> {
    let mut out = Vec::new();
    let bits: Vec<u32> = {
        let mut b = r.config.significant_bits.clone();
        b.sort_unstable();
        b.dedup();
        b
    };
    let (lo, hi) = (bits.first().copied(), bits.last().copied());
    let at = |op: &str, case: &str, s: u32| -> Option<f64> {
        r.significant_bits
            .iter()
            .find(|x| x.op == op && x.operands == case && x.s == s)
            .map(|x| x.error.mean)
    };
    if let (Some(lo), Some(hi)) = (lo, hi) {
        let cases: Vec<String> = ["GxG", "UxU", "UxG"]
            .iter()
            .filter_map(|&c| {
                Some(format!(
                    "{c} {} -> {}",
                    pct(at("mul", c, lo)?),
                    pct(at("mul", c, hi)?)
                ))
            })
            .collect();
        let gg_max = bits
            .iter()
            .filter(|&&s| {
                let gg = at("mul", "GxG", s).unwrap_or(f64::NAN);
                ["UxU", "UxG"]
                    .iter()
                    .all(|c| at("mul", c, s).is_some_and(|e| gg >= e))
            })
            .count();
        let decreasing = r
            .significant_bits
            .iter()
            .filter(|x| x.s == lo)
            .filter(|x| {
                at(x.op, x.operands, hi).is_some_and(|e| e < x.error.mean || x.error.mean == 0.0)
            })
            .count();
        let cases_n = r.significant_bits.iter().filter(|x| x.s == lo).count();
        out.push(Claim {
            what: format!(
                "Figure 7a: the uniform population's mean error against its significant bits \
                 (s = {lo} to {hi})"
            ),
            paper: "\"In all cases, when the significant bit increases, the error reduces \
                    significantly. When both variables are Gaussian the error is the maximum \
                    regardless of the number of significant bits\""
                .into(),
            measured: format!(
                "mul, s = {lo} -> {hi}: {}; lower at s = {hi} than at s = {lo} in {decreasing} \
                 of {cases_n} (operation, operands) cases; GxG the largest of the three at \
                 {gg_max} of {} values of s",
                cases.join(", "),
                bits.len()
            ),
        });
        let sizes: Vec<String> = bits
            .iter()
            .filter_map(|&s| {
                r.significant_bits
                    .iter()
                    .find(|x| x.op == "mul" && x.s == s)
                    .map(|x| format!("{s}: {} + {}", x.entries, x.antilog_entries))
            })
            .collect();
        out.push(Claim {
            what: "Figure 7b: table size against significant bits (mul: log table + antilog \
                   table entries)"
                .into(),
            paper: "\"the table size increases exponentially by the number of significant \
                    bits\""
                .into(),
            measured: format!("{} (the log table is 2^s (33 - s))", sizes.join(", ")),
        });
    }
    let last = |c: Chain, m: &str| {
        r.propagation
            .iter()
            .find(|p| p.function == c)
            .and_then(|p| {
                p.rows
                    .iter()
                    .filter(|x| x.method == m)
                    .max_by_key(|x| x.iteration)
            })
            .map(|x| x.error.mean)
    };
    let n = r.config.iterations;
    let (sq_u, sq_a, d_u, d_a) = (
        last(Chain::Square, "uniform"),
        last(Chain::Square, "ADA"),
        last(Chain::Double, "uniform"),
        last(Chain::Double, "ADA"),
    );
    let fmt = |x: Option<f64>| x.map_or("n/a".into(), pct);
    // Whether x^2 errs more than 2x through one kind of table.
    let order = |sq: Option<f64>, d: Option<f64>| match (sq, d) {
        (Some(sq), Some(d)) if sq > d => "yes",
        (Some(_), Some(_)) => "NO",
        _ => "n/a",
    };
    out.push(Claim {
        what: format!(
            "Figure 7c: mean relative error after {n} iterations from a Gaussian of median 10 \
             and variance 100 ({}-entry tables)",
            r.config.propagation_budget
        ),
        paper: "\"At the end of 10 iterations, x^2 shows 10813% and 70482% errors for the f(x) \
                without ADA and f(x) with ADA respectively, while these errors for 2x is only 7% \
                and 21%\""
            .into(),
        measured: format!(
            "x^2: uniform {}, ADA {}; 2x: uniform {}, ADA {}; x^2 errs more than 2x: with \
             the uniform tables {}, with ADA's {}",
            fmt(sq_u),
            fmt(sq_a),
            fmt(d_u),
            fmt(d_a),
            order(sq_u, d_u),
            order(sq_a, d_a)
        ),
    });
    out
}

fn shift_claim(r: &AdaReport) -> Claim {
    let s = &r.shift;
    let missing = s.epochs.iter().filter(|e| e.ada.is_none()).count();
    let first_after = s
        .epochs
        .get(s.shift_after as usize)
        .and_then(|e| e.ada)
        .map_or("n/a".into(), |a| sci(a.mean));
    let recovered = match (
        s.recovered_after,
        s.repopulations_to_recover,
        s.entries_rewritten_to_recover,
    ) {
        (Some(n), Some(t), Some(e)) => format!(
            "back within {}x of it after {n} epoch(s) ({t} table rewrite(s), {e} entries \
             written)",
            s.recovery_factor
        ),
        _ => format!(
            "not back within {}x of it in {} epochs",
            s.recovery_factor,
            s.epochs.len() - s.shift_after as usize
        ),
    };
    Claim {
        what: format!(
            "the shift: exponential operands for {} epochs (from a steady trie), then \
             Gaussian(300000, 10000); {} at {} entries, tables re-populated every epoch",
            s.shift_after, s.op, s.budget
        ),
        paper: "\"Nimble with ADA detects the new value in rate after a few iterations and \
                updates the TCAM from the control plane\" (§V.B.1); \"ADA dynamically adapts to \
                changes in the operands' range and distribution\" (§VII)"
            .into(),
        measured: if missing > 0 {
            format!(
                "ADA had no population in {missing} of {} epochs: {} entries cannot cover the \
                 trie's bins; uniform's mean error after the shift {}",
                s.epochs.len(),
                s.budget,
                sci(s.after_shift_mean.uniform)
            )
        } else {
            format!(
                "ADA's mean error {} before the shift, {} in the first epoch after it, {}; mean \
                 after the shift: ADA {}, ADA frozen at the shift {}, uniform {}; {} rewrites in {} \
                 epochs",
                sci(s.pre_shift_error),
                first_after,
                recovered,
                sci(s.after_shift_mean.ada),
                sci(s.after_shift_mean.frozen),
                sci(s.after_shift_mean.uniform),
                s.repopulations,
                s.epochs.len()
            )
        },
    }
}

/// A signed relative error as a percentage.
fn signed_pct(x: f64) -> String {
    format!("{}{}", if x >= 0.0 { "+" } else { "" }, pct(x))
}

fn gbps(x: f64) -> String {
    format!("{x:.2}")
}

/// "after N epoch(s) (T µs of controller periods), from window k", or why not.
fn recovery_text(run: &NimbleRun, tolerance: f64, after_windows: usize) -> String {
    match run.recovery {
        Some(rec) => format!(
            "within {} from window {} on, after {} controller epoch(s) ({} µs of controller \
             periods)",
            pct(tolerance),
            rec.window,
            rec.epochs,
            sci(rec.epochs_us)
        ),
        None => format!(
            "not within {} in the first half of the {after_windows} windows after the change",
            pct(tolerance)
        ),
    }
}

fn nimble_claims(r: &AdaReport) -> Vec<Claim> {
    let n = &r.nimble;
    let c = &r.config;
    let s = c.nimble_scenario();
    let find = |v: Variant| n.fig8.iter().find(|x| x.variant == v);
    let after_windows = s.full_windows() - s.after_start();
    let mut out = Vec::new();
    let (from, to) = (c.nimble_rate_gbps, c.nimble_rate_after_gbps);
    let setting = format!(
        "{from} then {to} Gbit/s from {} µs, {} Gbit/s of {}-byte frames offered (Poisson), \
         windows of {} µs, controller every {} µs",
        c.nimble_change_us,
        c.nimble_offered_gbps,
        c.nimble_frame_bytes,
        c.nimble_window_us,
        c.nimble_controller_us
    );
    if let Some(st) = find(Variant::Static) {
        out.push(Claim {
            what: format!(
                "Figure 8: Nimble's static arithmetic (the rate baked in by the control plane) \
                 when the data plane changes the rate ({setting})"
            ),
            paper: "\"When the rate changes, Nimble generates the result of the multiplication \
                    with an extremely large error, which causes Nimble to drop packets \
                    incorrectly\" (§V.B.1)"
                .into(),
            measured: format!(
                "mean admitted {} Gbit/s after the change, {} of the new rate (before it: {}); \
                 the bucket still refills at the rate the control plane baked in, so here the \
                 error admits too much rather than dropping",
                gbps(st.mean_after_gbps),
                signed_pct(st.errors(&s).1),
                gbps(st.mean_before_gbps)
            ),
        });
    }
    if let Some(ada) = find(Variant::AdaR) {
        let first = ada
            .admitted_gbps
            .get(s.after_start())
            .copied()
            .unwrap_or(f64::NAN);
        let (before, after) = ada.errors(&s);
        let repops = ada.cost.as_ref().map_or(0, |k| {
            k.operands.iter().map(|o| o.repopulations).sum::<u64>()
        });
        out.push(Claim {
            what: format!(
                "Figure 8: Nimble with ADA on the rate ({} calculation entries, 8 to 12 \
                 monitoring, primed on the first rate) after the change",
                ada.rate_table_entries.unwrap_or(0)
            ),
            paper: "\"Nimble with ADA detects the new value in rate after a few iterations and \
                    updates the TCAM from the control plane\" (§V.B.1)"
                .into(),
            measured: format!(
                "first window after the change {} Gbit/s ({}); {}; mean after the change {} \
                 ({}), before it {} ({}); {repops} table rewrites during traffic",
                gbps(first),
                signed_pct(first / to - 1.0),
                recovery_text(ada, c.nimble_tolerance, after_windows),
                gbps(ada.mean_after_gbps),
                signed_pct(after),
                gbps(ada.mean_before_gbps),
                signed_pct(before)
            ),
        });
    }
    if let (Some(u), Some(e)) = (find(Variant::Uniform), find(Variant::Exact)) {
        let (ub, ua) = u.errors(&s);
        let (eb, ea) = e.errors(&s);
        out.push(Claim {
            what: "Figure 8: the prior work's uniform population of the rate's table (2 \
                   significant bits, 124 entries) and an exact multiplication, mean admitted \
                   rate against the rate set"
                .into(),
            paper: "the paper plots Nimble with and without ADA only; the ideal it compares \
                    ADA with is an exact calculation (\"ADA's performance is close to ideal\", \
                    §V.C)"
                .into(),
            measured: format!(
                "uniform {} before the change, {} after ({}: its entry for each rate is off by \
                 that much, whatever the controller); exact {} and {} (verified within {})",
                signed_pct(ub),
                signed_pct(ua),
                recovery_text(u, c.nimble_tolerance, after_windows),
                signed_pct(eb),
                signed_pct(ea),
                pct(EXACT_TOLERANCE)
            ),
        });
    }
    out.extend(table2_claims(r));
    out.push(fig9_claim(r));
    out
}

fn table2_claims(r: &AdaReport) -> Vec<Claim> {
    let n = &r.nimble;
    let c = &r.config;
    let row = |v: Variant| n.table2.iter().find(|x| x.variant == v);
    let cost = |v: Variant| row(v).and_then(|x| x.cost.clone());
    let rw = |v: Variant| cost(v).map(|k| (k.reads_per_update, k.writes_per_update));
    let mut ours = Vec::new();
    let mut ratios = Vec::new();
    for (v, reads, writes) in PAPER_TABLE_II {
        let Some(k) = cost(v) else { continue };
        let bins: Vec<String> = k
            .operands
            .iter()
            .map(|o| {
                format!(
                    "{} {} -> {} bins, {} of {} updates re-populated",
                    o.operand, o.bins_start, o.bins_end, o.repopulations, o.epochs
                )
            })
            .collect();
        ours.push(format!(
            "{} {} reads, {} writes ({})",
            v.label(),
            sci(k.reads_per_update),
            sci(k.writes_per_update),
            bins.join("; ")
        ));
        ratios.push(format!(
            "{} {}x, {}x",
            v.label(),
            sci(k.reads_per_update / reads),
            sci(k.writes_per_update / writes)
        ));
    }
    let yes = |b: Option<bool>| match b {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "n/a",
    };
    let (r_, dt, both) = (rw(Variant::AdaR), rw(Variant::AdaDt), rw(Variant::AdaDtR));
    let most =
        |f: fn((f64, f64)) -> f64| -> Option<bool> { Some(f(both?) > f(r_?) && f(both?) > f(dt?)) };
    let r_over_dt = |f: fn((f64, f64)) -> f64| -> Option<bool> { Some(f(r_?) > f(dt?)) };
    let primed = n
        .fig8
        .iter()
        .find(|x| x.variant == Variant::AdaR)
        .and_then(|x| x.cost.clone())
        .map_or("n/a".into(), |k| {
            format!(
                "{} reads, {} writes",
                sci(k.reads_per_update),
                sci(k.writes_per_update)
            )
        });
    let updates = cost(Variant::AdaR).map_or(0, |k| k.updates);
    // Why ADA on the time may cost more than on the rate, where the paper has it cost less.
    let why = if r_over_dt(|x| x.0) == Some(false) || r_over_dt(|x| x.1) == Some(false) {
        format!(
            " (the inter-arrival times sit 24 octaves below the key's top, so their trie \
             zooms in through a chain of bins, about one per octave, beyond the paper's 12 \
             (here up to {}), and their spread hits change Algorithm 3's population at \
             nearly every update, where the one rate's rarely do)",
            c.nimble_dt_monitor_entries
        )
    } else {
        String::new()
    };
    let mut out = vec![Claim {
        what: format!(
            "Table II: the controller's reads and writes per update ({updates} updates, one \
             every {} µs, over Figure 8's run; every operand's monitoring from 8 entries, \
             unprimed; the rate's up to 12, the time's up to {})",
            c.nimble_controller_us, c.nimble_dt_monitor_entries
        ),
        paper: "ADA(R) 12.32 reads, 73.31 writes; ADA(dT) 9.27, 32.63; ADA(dT, R) 24.54, 98.43. \
                \"The average number of writes for ADA(ΔT, R) is the most\"; reads and writes \
                \"always more for ADA(R) than ADA(ΔT)\" (§V.B.2)"
            .into(),
        measured: format!(
            "{}; ours over the paper's: {}; ADA(dT, R) the most reads: {}, writes: {}; ADA(R) \
             above ADA(dT): reads {}, writes {}{why}; Figure 8's ADA(R), primed on the rate: \
             {primed}",
            ours.join("; "),
            ratios.join("; "),
            yes(most(|x| x.0)),
            yes(most(|x| x.1)),
            yes(r_over_dt(|x| x.0)),
            yes(r_over_dt(|x| x.1)),
        ),
    }];
    let lookups: Vec<String> = TABLE_II
        .iter()
        .filter_map(|&v| {
            let k = cost(v)?;
            Some(format!(
                "{} {} ({} monitoring + {} calculation)",
                v.label(),
                sci(k.tcam_lookups_per_packet),
                sci(k.monitoring_lookups_per_packet),
                sci(k.calculation_lookups_per_packet)
            ))
        })
        .collect();
    out.push(Claim {
        what: "Table II's \"No. of stages\" as a PFE's cost: TCAM lookups per packet \
               (monitoring and calculation; a PFE has no pipeline stages, its thread runs the \
               lookups one after another as XTXNs)"
            .into(),
        paper: format!(
            "{}: \"ADA needs fewer stages when only one variable needs to be monitored\" \
             (§V.B.2)",
            PAPER_STAGES
                .iter()
                .map(|(v, n)| format!("{} {n} stages", v.label()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        measured: format!(
            "{}; without ADA 3 (uniform: the rate's, the time's and the antilog table), 2 \
             (static: the time's and the antilog), 0 (exact); each monitored operand adds one \
             lookup a packet (ADA's blocks measured by their hit counters, the fixed tables \
             counted once per refill)",
            lookups.join("; ")
        ),
    });
    out
}

fn fig9_claim(r: &AdaReport) -> Claim {
    let n = &r.nimble;
    let c = &r.config;
    let rows: Vec<String> = n
        .fig9
        .iter()
        .map(|x| {
            let writes = x.cost.as_ref().map_or(0.0, |k| k.writes_per_update);
            let rec = x.recovery.map_or("not within".into(), |rec| {
                format!("{} epoch(s), {} µs", rec.epochs, sci(rec.epochs_us))
            });
            format!(
                "{}: {rec} ({} writes per update)",
                x.rate_table_entries.unwrap_or(0),
                sci(writes)
            )
        })
        .collect();
    Claim {
        what: format!(
            "Figure 9: the control plane's delay after the rate halves, ADA(R) by calculation \
             entries: controller epochs until the admitted rate is within {} of {} Gbit/s",
            pct(c.nimble_tolerance),
            c.nimble_rate_after_gbps
        ),
        paper: "\"The delay for 128 entries is about 3.15 ms\" (§V.B.2), growing with the \
                entries (its controller's own computation and switch writes included)"
            .into(),
        measured: format!(
            "{}; counted in controller periods of {} µs: the emulated controller takes no time \
             of its own, so the delay is the epochs it needs, and a larger table only costs \
             more writes per update",
            rows.join("; "),
            c.nimble_controller_us
        ),
    }
}

// ----- CSV ------------------------------------------------------------------------------------

/// One row per measured value (long form): the part, what was measured, the x axis and the
/// value.
pub(super) const CSV_HEADER: [&str; 8] = [
    "part",
    "distribution",
    "op",
    "method",
    "x_name",
    "x",
    "metric",
    "value",
];

/// Where a CSV row's values were measured: every column but the metric and the value.
struct At<'a> {
    part: &'a str,
    dist: &'a str,
    op: &'a str,
    method: &'a str,
    x_name: &'a str,
    x: String,
}

impl At<'_> {
    /// One row per `(metric, value)`, at this point.
    fn rows<V: ToString>(&self, out: &mut Vec<Vec<String>>, metrics: &[(&str, V)]) {
        for (metric, value) in metrics {
            out.push(vec![
                self.part.into(),
                self.dist.into(),
                self.op.into(),
                self.method.into(),
                self.x_name.into(),
                self.x.clone(),
                (*metric).into(),
                value.to_string(),
            ]);
        }
    }
}

pub(super) fn csv_rows(r: &AdaReport) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let errors = |e: &ErrorStats| [("mean_error", e.mean), ("p99_error", e.p99)];
    for b in &r.binning {
        let at = |method, x: usize| At {
            part: "fig5",
            dist: &b.distribution,
            op: "",
            method,
            x_name: "bins",
            x: x.to_string(),
        };
        for (method, bins, tv) in [
            ("initial", b.bins_initial, b.tv_initial),
            ("steady", b.bins_steady, b.tv_steady),
            ("equal-width", b.bins_steady, b.tv_equal_width),
        ] {
            at(method, bins).rows(&mut out, &[("tv", tv)]);
        }
        at("steady", b.bins_steady).rows(
            &mut out,
            &[
                ("epochs_run", b.epochs_run as usize),
                ("last_change_epoch", b.last_change_epoch as usize),
                ("changes", b.changes),
                ("expansions", b.expansions),
                ("steady", usize::from(b.steady)),
            ],
        );
    }
    for g in &r.growth {
        let method = format!("{}-bit", g.operand_bits);
        for s in &g.steps {
            let at = At {
                part: "fig6",
                dist: "gaussian-4000",
                op: "",
                method: &method,
                x_name: "change",
                x: s.change.to_string(),
            };
            at.rows(&mut out, &[("bins", s.bins)]);
        }
    }
    for b in &r.budgets {
        let stats = [
            ("uniform", Some(b.uniform), Some(b.uniform_entries as usize)),
            ("ADA", b.ada, b.ada_entries),
        ];
        for (method, e, entries) in stats {
            let Some(e) = e else { continue };
            let at = At {
                part: "budget",
                dist: &b.distribution,
                op: b.op,
                method,
                x_name: "budget",
                x: b.budget.to_string(),
            };
            at.rows(&mut out, &errors(&e));
            at.rows(&mut out, &[("entries", entries.unwrap_or(0))]);
        }
    }
    for s in &r.significant_bits {
        let at = At {
            part: "fig7ab",
            dist: s.operands,
            op: s.op,
            method: "uniform",
            x_name: "s",
            x: s.s.to_string(),
        };
        at.rows(&mut out, &errors(&s.error));
        at.rows(
            &mut out,
            &[
                ("entries", s.entries as usize),
                ("antilog_entries", s.antilog_entries),
            ],
        );
    }
    for p in &r.propagation {
        for x in &p.rows {
            let at = At {
                part: "fig7c",
                dist: "gaussian-10",
                op: p.function.name(),
                method: x.method,
                x_name: "iteration",
                x: x.iteration.to_string(),
            };
            at.rows(&mut out, &errors(&x.error));
        }
    }
    let s = &r.shift;
    for e in &s.epochs {
        let at = |method| At {
            part: "shift",
            dist: SHIFTING,
            op: s.op,
            method,
            x_name: "epoch",
            x: e.epoch.to_string(),
        };
        for (method, st) in [
            ("ADA", e.ada),
            ("static", e.frozen),
            ("uniform", Some(e.uniform)),
        ] {
            if let Some(st) = st {
                at(method).rows(&mut out, &errors(&st));
            }
        }
        at("ADA").rows(
            &mut out,
            &[
                ("bins", e.bins),
                ("ada_entries", e.ada_entries),
                ("repopulated", usize::from(e.repopulated)),
                ("entries_rewritten", e.entries_rewritten),
            ],
        );
    }
    nimble_csv_rows(r, &mut out);
    out
}

/// §V.B's rows: Figure 8's windows and each run's figures; `distribution` is the arrivals
/// (`poisson`), `op` mul, `method` the run's variant.
fn nimble_csv_rows(r: &AdaReport, out: &mut Vec<Vec<String>>) {
    let n = &r.nimble;
    let mut row =
        |part: &str, run: &NimbleRun, x_name: &str, x: String, metric: &str, v: String| {
            out.push(vec![
                part.into(),
                "poisson".into(),
                "mul".into(),
                run.variant.slug().into(),
                x_name.into(),
                x,
                metric.into(),
                v,
            ]);
        };
    for run in &n.fig8 {
        for (i, g) in run.admitted_gbps.iter().enumerate() {
            let x = (i as f64 * n.window_us).to_string();
            row(
                "fig8",
                run,
                "window_start_us",
                x,
                "admitted_gbps",
                g.to_string(),
            );
        }
    }
    let parts = [("fig8", &n.fig8), ("table2", &n.table2), ("fig9", &n.fig9)];
    for (part, runs) in parts {
        for run in runs {
            let (x_name, x) = match (part, run.rate_table_entries) {
                ("fig9", Some(e)) => ("table_entries", e.to_string()),
                _ => ("run", String::new()),
            };
            let mut metrics = vec![
                ("mean_before_gbps", run.mean_before_gbps.to_string()),
                ("mean_after_gbps", run.mean_after_gbps.to_string()),
                ("offered", run.offered.to_string()),
                ("admitted", run.admitted.to_string()),
                ("dropped", run.dropped.to_string()),
                ("accounted", u8::from(run.accounted).to_string()),
            ];
            if let Some(rec) = run.recovery {
                metrics.push(("recovery_window", rec.window.to_string()));
                metrics.push(("recovery_epochs", rec.epochs.to_string()));
                metrics.push(("recovery_us", rec.epochs_us.to_string()));
            }
            if let Some(k) = &run.cost {
                metrics.extend([
                    ("updates", k.updates.to_string()),
                    ("reads_per_update", k.reads_per_update.to_string()),
                    ("writes_per_update", k.writes_per_update.to_string()),
                    (
                        "monitoring_lookups_per_packet",
                        k.monitoring_lookups_per_packet.to_string(),
                    ),
                    (
                        "calculation_lookups_per_packet",
                        k.calculation_lookups_per_packet.to_string(),
                    ),
                    (
                        "tcam_lookups_per_packet",
                        k.tcam_lookups_per_packet.to_string(),
                    ),
                ]);
                for o in &k.operands {
                    metrics.extend([
                        (bins_metric(o.operand), o.bins_end.to_string()),
                        (repops_metric(o.operand), o.repopulations.to_string()),
                    ]);
                }
            }
            for (metric, v) in metrics {
                row(part, run, x_name, x.clone(), metric, v);
            }
        }
    }
}

fn bins_metric(operand: &str) -> &'static str {
    if operand == "dt" {
        "dt_bins_end"
    } else {
        "rate_bins_end"
    }
}

fn repops_metric(operand: &str) -> &'static str {
    if operand == "dt" {
        "dt_repopulations"
    } else {
        "rate_repopulations"
    }
}

// ----- chart ----------------------------------------------------------------------------------

/// Colours by index: the operations 0 to 4, then the rest.
fn op_color(op: &str) -> usize {
    Op::ALL.iter().position(|&o| op_name(o) == op).unwrap_or(0)
}
const TRUTH: usize = 8;
const TRIE: usize = 5;
const ANTILOG: usize = 9;

fn line(name: String, color: usize, dashed: bool, points: Vec<(f64, f64)>) -> Line {
    Line {
        series: Series { name, points },
        color,
        dashed,
    }
}

fn panel(title: String, x: &str, y: &str, y_log: bool, x_log2: bool, lines: Vec<Line>) -> Panel {
    Panel {
        title,
        x_label: x.into(),
        y_label: y.into(),
        y_log,
        x_log2,
        lines,
    }
}

pub(super) fn draw(r: &AdaReport, path: &Path) -> Result<(), PlotError> {
    let mut panels = Vec::new();
    // Figure 5: the true density against the steady trie's, per 2000 operands.
    for (i, b) in r.binning.iter().enumerate() {
        let truth = b
            .truth
            .iter()
            .enumerate()
            .map(|(k, p)| ((k as f64 + 0.5) * f64::from(HIST_BIN) / 1000.0, 100.0 * p))
            .collect();
        let mut steps = Vec::new();
        for bin in &b.bins {
            let end = (bin.last + 1).min(u64::from(RANGE));
            let width = (bin.last + 1 - bin.first) as f64;
            let d = 100.0 * bin.share * f64::from(HIST_BIN) / width;
            steps.push((bin.first as f64 / 1000.0, d));
            steps.push((end as f64 / 1000.0, d));
        }
        panels.push(panel(
            format!(
                "Fig 5{} {}: {} bins",
                (b'a' + i as u8) as char,
                b.distribution,
                b.bins_steady
            ),
            "operand (thousands)",
            "% of operands per 2000",
            false,
            false,
            vec![
                line("true distribution".into(), TRUTH, true, truth),
                line("steady trie".into(), TRIE, false, steps),
            ],
        ));
    }
    // Error against the budget, per distribution.
    let mut dists: Vec<&str> = Vec::new();
    for b in &r.budgets {
        if !dists.contains(&b.distribution.as_str()) {
            dists.push(&b.distribution);
        }
    }
    for d in dists {
        let mut lines = Vec::new();
        for op in Op::ALL.map(op_name) {
            let rows: Vec<&BudgetRow> = r
                .budgets
                .iter()
                .filter(|b| b.distribution == d && b.op == op)
                .collect();
            let pts = |f: &dyn Fn(&BudgetRow) -> Option<ErrorStats>| -> Vec<(f64, f64)> {
                rows.iter()
                    .filter_map(|b| Some((b.budget as f64, f(b)?.mean)))
                    .collect()
            };
            lines.push(line(
                format!("{op} ADA"),
                op_color(op),
                false,
                pts(&|b| b.ada),
            ));
            lines.push(line(
                format!("{op} uniform"),
                op_color(op),
                true,
                pts(&|b| Some(b.uniform)),
            ));
        }
        panels.push(panel(
            format!("{d}: mean error vs budget"),
            "operand-table entries",
            "mean error (log2: absolute)",
            true,
            true,
            lines,
        ));
    }
    // Figure 7a: the uniform population against s.
    for (case, title) in [("G", "Gaussian"), ("U", "uniform")] {
        let lines = Op::ALL
            .map(op_name)
            .iter()
            .map(|&op| {
                let want = if matches!(op, "mul" | "div") {
                    format!("{case}x{case}")
                } else {
                    case.to_string()
                };
                let pts = r
                    .significant_bits
                    .iter()
                    .filter(|x| x.op == op && x.operands == want)
                    .map(|x| (f64::from(x.s), x.error.mean))
                    .collect();
                line(format!("{op} uniform"), op_color(op), true, pts)
            })
            .collect();
        panels.push(panel(
            format!("Fig 7a: {title} operands, uniform population"),
            "significant bits s",
            "mean error",
            true,
            false,
            lines,
        ));
    }
    // Figure 7b: table size.
    let size = |f: &dyn Fn(&super::SigBitsRow) -> f64| -> Vec<(f64, f64)> {
        r.significant_bits
            .iter()
            .filter(|x| x.op == "mul" && x.operands == "GxG")
            .map(|x| (f64::from(x.s), f(x)))
            .collect()
    };
    panels.push(panel(
        "Fig 7b: table size vs significant bits".into(),
        "significant bits s",
        "entries",
        true,
        false,
        vec![
            line(
                "log (operand) table".into(),
                TRUTH,
                false,
                size(&|x| x.entries as f64),
            ),
            line(
                "antilog table (mul, div)".into(),
                ANTILOG,
                false,
                size(&|x| x.antilog_entries as f64),
            ),
        ],
    ));
    // Figure 7c.
    let mut lines = Vec::new();
    for p in &r.propagation {
        let color = if p.function == Chain::Square { 6 } else { 7 };
        for (method, dashed) in [("ADA", false), ("uniform", true)] {
            let pts = p
                .rows
                .iter()
                .filter(|x| x.method == method)
                .map(|x| (f64::from(x.iteration), x.error.mean))
                .collect();
            lines.push(line(
                format!("{} {method}", p.function.name()),
                color,
                dashed,
                pts,
            ));
        }
    }
    panels.push(panel(
        format!(
            "Fig 7c: error propagation, {} entries",
            r.config.propagation_budget
        ),
        "iteration",
        "mean relative error",
        true,
        false,
        lines,
    ));
    // Figure 6.
    let lines = r
        .growth
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let pts = g
                .steps
                .iter()
                .map(|s| (s.change as f64, s.bins as f64))
                .collect();
            line(
                format!("{}-bit operands", g.operand_bits),
                6 + (i % 4),
                false,
                pts,
            )
        })
        .collect();
    panels.push(panel(
        format!("Fig 6: bins per change from b = 1 (view [0, {GROWTH_VIEW}))"),
        "change",
        "bins",
        false,
        false,
        lines,
    ));
    // The shift.
    let s = &r.shift;
    let series = |f: &dyn Fn(&super::ShiftEpoch) -> Option<ErrorStats>| -> Vec<(f64, f64)> {
        s.epochs
            .iter()
            .filter_map(|e| Some((f64::from(e.epoch), f(e)?.mean)))
            .collect()
    };
    panels.push(panel(
        format!(
            "shift after epoch {}: {} at {} entries",
            s.shift_after, s.op, s.budget
        ),
        "epoch",
        "mean error",
        true,
        false,
        vec![
            line("ADA, re-populated".into(), TRIE, false, series(&|e| e.ada)),
            line(
                "ADA frozen at the shift".into(),
                ANTILOG,
                true,
                series(&|e| e.frozen),
            ),
            line(
                "uniform (shift)".into(),
                TRUTH,
                true,
                series(&|e| Some(e.uniform)),
            ),
        ],
    ));
    panels.extend(nimble_panels(r));
    plot::svg_panels(
        path,
        &Panels {
            title: "ADA (§V.A): bins, error vs budget and significant bits, propagation, shift; \
                    (§V.B) Nimble's Figures 8 and 9",
            columns: 4,
            panels,
        },
    )
}

/// Figure 8's admitted rate per window, and Figure 9's epochs by table size.
fn nimble_panels(r: &AdaReport) -> Vec<Panel> {
    let n = &r.nimble;
    let c = &r.config;
    let ms = n.window_us / 1e3;
    let mut lines: Vec<Line> = n
        .fig8
        .iter()
        .map(|run| {
            let (name, color) = match run.variant {
                Variant::Exact => ("exact", TRUTH),
                Variant::Uniform => ("uniform (rate table)", 1),
                Variant::Static => ("static (Nimble)", 3),
                _ => ("ADA", TRIE),
            };
            let pts = (run.admitted_gbps.iter().enumerate())
                .map(|(i, &g)| ((i as f64 + 0.5) * ms, g))
                .collect();
            line(name.into(), color, false, pts)
        })
        .collect();
    let change = c.nimble_change_us as f64 / 1e3;
    let end = c.nimble_duration_us as f64 / 1e3;
    lines.push(line(
        "rate set".into(),
        ANTILOG,
        true,
        vec![
            (0.0, c.nimble_rate_gbps),
            (change, c.nimble_rate_gbps),
            (change, c.nimble_rate_after_gbps),
            (end, c.nimble_rate_after_gbps),
        ],
    ));
    let fig8 = panel(
        format!(
            "Fig 8: admitted per {} µs, rate {} -> {} Gbit/s",
            n.window_us, c.nimble_rate_gbps, c.nimble_rate_after_gbps
        ),
        "time (ms)",
        "admitted Gbit/s",
        false,
        false,
        lines,
    );
    let epochs = n
        .fig9
        .iter()
        .filter_map(|x| Some((x.rate_table_entries? as f64, x.recovery?.epochs as f64)))
        .collect();
    let fig9 = panel(
        format!(
            "Fig 9: epochs of {} µs to within {} of the new rate",
            c.nimble_controller_us,
            pct(c.nimble_tolerance)
        ),
        "calculation table entries",
        "controller epochs",
        false,
        false,
        vec![line("ADA(R) recovery".into(), TRIE, false, epochs)],
    );
    vec![fig8, fig9]
}

// ----- table ----------------------------------------------------------------------------------

pub(super) fn table(r: &AdaReport) -> String {
    let mut t = String::new();
    let c = &r.config;
    let _ = writeln!(
        t,
        "Figure 5: Algorithms 1-2 to a steady trie (M = {}, 32-bit operands, {} per epoch, \
         th_balance {}, th_expansion {}); total variation distance to the true distribution",
        c.monitor_entries, c.epoch_operands, c.th_balance, c.th_expansion
    );
    let _ = writeln!(
        t,
        "{:<13}{:>6}{:>7}{:>8}{:>9}{:>6}{:>11}{:>11}{:>10}{:>13}",
        "distribution",
        "bins",
        "depth",
        "epochs",
        "changes",
        "exp",
        "TV Alg.1",
        "TV steady",
        "(beyond)",
        "TV eq-width"
    );
    for b in &r.binning {
        let epochs = if b.steady {
            b.last_change_epoch.to_string()
        } else {
            format!(">{}", b.epochs_run)
        };
        let _ = writeln!(
            t,
            "{:<13}{:>6}{:>7}{:>8}{:>9}{:>6}{:>11}{:>11}{:>10}{:>13}",
            b.distribution,
            b.bins_steady,
            b.depth,
            epochs,
            b.changes,
            b.expansions,
            sci(b.tv_initial),
            sci(b.tv_steady),
            sci(b.tv_steady_outside),
            sci(b.tv_equal_width)
        );
    }
    let _ = writeln!(
        t,
        "\nFigure 6: bins after each change from b = 1 (Gaussian 4000, variance 32500)"
    );
    for g in &r.growth {
        let bins: Vec<String> = g.steps.iter().map(|s| s.bins.to_string()).collect();
        let _ = writeln!(
            t,
            "  {}-bit: {} ({} changes in {} epochs{})",
            g.operand_bits,
            bins.join(" "),
            g.steps.len() - 1,
            g.epochs_run,
            if g.steady { ", steady" } else { ", not steady" }
        );
        if let Some(last) = g.steps.last() {
            let view: Vec<String> = last
                .in_view
                .iter()
                .map(|(a, b)| format!("{a}-{b}"))
                .collect();
            let _ = writeln!(
                t,
                "    bins in [0, {GROWTH_VIEW}) at the end: {}",
                view.join(" ")
            );
        }
    }
    let budgets = c.sorted_budgets();
    let _ = writeln!(
        t,
        "\nMean error by entry budget, uniform / ADA (relative; log2 absolute), {} pairs",
        c.samples
    );
    let _ = write!(t, "{:<13}{:<8}", "distribution", "op");
    for b in &budgets {
        let _ = write!(t, "{:>19}", b);
    }
    t.push('\n');
    let mut last = String::new();
    for row in r.budgets.iter().filter(|b| b.budget == budgets[0]) {
        if row.distribution != last {
            let _ = write!(t, "{:<21}", format!("{} ADA entries", row.distribution));
            for b in &budgets {
                let e = r
                    .budgets
                    .iter()
                    .find(|x| x.distribution == row.distribution && x.budget == *b)
                    .and_then(|x| x.ada_entries)
                    .map_or("-".into(), |n| n.to_string());
                let _ = write!(t, "{e:>19}");
            }
            t.push('\n');
            last.clone_from(&row.distribution);
        }
        let _ = write!(t, "{:<13}{:<8}", "", row.op);
        for b in &budgets {
            let cell = r
                .budgets
                .iter()
                .find(|x| x.distribution == row.distribution && x.op == row.op && x.budget == *b)
                .map_or("-".into(), |x| {
                    format!(
                        "{}/{}",
                        sci(x.uniform.mean),
                        x.ada.map_or("-".into(), |a| sci(a.mean))
                    )
                });
            let _ = write!(t, "{cell:>19}");
        }
        t.push('\n');
    }
    let mut bits = c.significant_bits.clone();
    bits.sort_unstable();
    bits.dedup();
    let _ = writeln!(
        t,
        "\nFigure 7a-b: the uniform population's mean error by significant bits"
    );
    let _ = write!(t, "{:<8}{:<6}", "op", "ops");
    for s in &bits {
        let _ = write!(t, "{:>10}", format!("s={s}"));
    }
    t.push('\n');
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for x in &r.significant_bits {
        if seen.contains(&(x.op, x.operands)) {
            continue;
        }
        seen.push((x.op, x.operands));
        let _ = write!(t, "{:<8}{:<6}", x.op, x.operands);
        for s in &bits {
            let e = r
                .significant_bits
                .iter()
                .find(|y| y.op == x.op && y.operands == x.operands && y.s == *s)
                .map_or("-".into(), |y| sci(y.error.mean));
            let _ = write!(t, "{e:>10}");
        }
        t.push('\n');
    }
    let _ = write!(t, "{:<14}", "log entries");
    for s in &bits {
        let _ = write!(t, "{:>10}", super::lookup::uniform_entries(*s));
    }
    t.push('\n');
    let _ = write!(t, "{:<14}", "antilog (mul)");
    for s in &bits {
        let e = r
            .significant_bits
            .iter()
            .find(|y| y.op == "mul" && y.s == *s)
            .map_or("-".into(), |y| y.antilog_entries.to_string());
        let _ = write!(t, "{e:>10}");
    }
    t.push('\n');
    let _ = writeln!(
        t,
        "\nFigure 7c: mean relative error after each iteration ({}-entry tables, {} chains)",
        c.propagation_budget, c.chains
    );
    let cols: Vec<(Chain, &str)> = r
        .propagation
        .iter()
        .flat_map(|p| [(p.function, "uniform"), (p.function, "ADA")])
        .collect();
    let _ = write!(t, "{:<6}", "iter");
    for (f, m) in &cols {
        let _ = write!(t, "{:>14}", format!("{} {m}", f.name()));
    }
    t.push('\n');
    for i in 1..=c.iterations {
        let _ = write!(t, "{i:<6}");
        for (f, m) in &cols {
            let e = r
                .propagation
                .iter()
                .find(|p| p.function == *f)
                .and_then(|p| p.rows.iter().find(|x| x.method == *m && x.iteration == i))
                .map_or("-".into(), |x| pct(x.error.mean));
            let _ = write!(t, "{e:>14}");
        }
        t.push('\n');
    }
    let s = &r.shift;
    let _ = writeln!(
        t,
        "\nThe shift after epoch {} (after {} unmeasured epochs to a steady trie): {} at {} \
         entries, mean error per epoch",
        s.shift_after, s.warmup_epochs, s.op, s.budget
    );
    let _ = writeln!(
        t,
        "{:<7}{:>11}{:>11}{:>11}{:>6}{:>9}{:>10}",
        "epoch", "ADA", "static", "uniform", "bins", "entries", "rewritten"
    );
    let k = s.shift_after as usize;
    let shown = |i: usize| (i + 3 >= k && i <= k + 10) || i + 1 == s.epochs.len() || i == 0;
    for (_, e) in s.epochs.iter().enumerate().filter(|(i, _)| shown(*i)) {
        let f = |x: Option<ErrorStats>| x.map_or("-".into(), |a| sci(a.mean));
        let _ = writeln!(
            t,
            "{:<7}{:>11}{:>11}{:>11}{:>6}{:>9}{:>10}",
            e.epoch,
            f(e.ada),
            f(e.frozen),
            sci(e.uniform.mean),
            e.bins,
            e.ada_entries,
            e.entries_rewritten
        );
    }
    t.push('\n');
    nimble_table(r, &mut t);
    t.push('\n');
    for c in &r.claims {
        let _ = writeln!(
            t,
            "{}:\n  paper: {}\n  measured: {}",
            c.what, c.paper, c.measured
        );
    }
    let k = &r.checks;
    let _ = write!(
        t,
        "\n{} lookups, {} without an entry; {} uniform results checked against their bound, \
         {} outside it. Wall time {:.1} s (information only).",
        k.lookups, k.misses, k.bound_checks, k.bound_violations, r.seconds
    );
    t
}

/// §V.B's part of the table.
fn nimble_table(r: &AdaReport, t: &mut String) {
    let n = &r.nimble;
    let c = &r.config;
    let s = c.nimble_scenario();
    let rec = |x: &NimbleRun| {
        x.recovery.map_or("-".into(), |rec| {
            format!("{} ({} ep)", rec.window, rec.epochs)
        })
    };
    let _ = writeln!(
        t,
        "§V.B Figure 8: one class offered {} Gbit/s of {}-byte frames (Poisson), rate {} then \
         {} Gbit/s from {} µs of {}, windows of {} µs, controller every {} µs",
        c.nimble_offered_gbps,
        c.nimble_frame_bytes,
        c.nimble_rate_gbps,
        c.nimble_rate_after_gbps,
        c.nimble_change_us,
        c.nimble_duration_us,
        c.nimble_window_us,
        c.nimble_controller_us
    );
    let _ = writeln!(
        t,
        "{:<12}{:>10}{:>9}{:>10}{:>9}{:>20}{:>9}{:>10}{:>9}",
        "arithmetic",
        "before",
        "error",
        "after",
        "error",
        "recovered (epochs)",
        "offered",
        "admitted",
        "dropped"
    );
    for x in &n.fig8 {
        let (eb, ea) = x.errors(&s);
        let _ = writeln!(
            t,
            "{:<12}{:>10}{:>9}{:>10}{:>9}{:>20}{:>9}{:>10}{:>9}",
            x.variant.label(),
            gbps(x.mean_before_gbps),
            signed_pct(eb),
            gbps(x.mean_after_gbps),
            signed_pct(ea),
            rec(x),
            x.offered,
            x.admitted,
            x.dropped
        );
    }
    let _ = write!(t, "admitted Gbit/s by window start (µs):\n{:>8}", "");
    for x in &n.fig8 {
        let _ = write!(t, "{:>10}", x.variant.label());
    }
    t.push('\n');
    let k = n.after_start;
    let windows = n.fig8.first().map_or(0, |x| x.admitted_gbps.len());
    let shown = |i: usize| i == 0 || i + 1 == windows || (i + 3 >= k && i <= k + 6);
    for i in (0..windows).filter(|&i| shown(i)) {
        let _ = write!(t, "{:>8}", sci(i as f64 * n.window_us));
        for x in &n.fig8 {
            let _ = write!(t, "{:>10}", gbps(x.admitted_gbps[i]));
        }
        t.push('\n');
    }
    let _ = writeln!(
        t,
        "\nTable II: per controller update over the same run, each operand's monitoring from \
         8 entries (unprimed); the time's up to {}; paper's figures in brackets",
        c.nimble_dt_monitor_entries
    );
    let _ = writeln!(
        t,
        "{:<12}{:>8}{:>18}{:>18}{:>14}{:>16}{:>15}{:>10}",
        "variant",
        "updates",
        "reads/update",
        "writes/update",
        "bins (end)",
        "repopulations",
        "lookups/pkt",
        "[stages]"
    );
    for x in &n.table2 {
        let Some(k) = &x.cost else { continue };
        let (pr, pw) = PAPER_TABLE_II
            .iter()
            .find(|p| p.0 == x.variant)
            .map_or((f64::NAN, f64::NAN), |p| (p.1, p.2));
        let bins: Vec<String> = k.operands.iter().map(|o| o.bins_end.to_string()).collect();
        let repops: Vec<String> = k
            .operands
            .iter()
            .map(|o| o.repopulations.to_string())
            .collect();
        let _ = writeln!(
            t,
            "{:<12}{:>8}{:>18}{:>18}{:>14}{:>16}{:>15}{:>10}",
            x.variant.label(),
            k.updates,
            format!("{} [{}]", sci(k.reads_per_update), pr),
            format!("{} [{}]", sci(k.writes_per_update), pw),
            bins.join("+"),
            repops.join("+"),
            sci(k.tcam_lookups_per_packet),
            PAPER_STAGES
                .iter()
                .find(|p| p.0 == x.variant)
                .map_or("-".into(), |p| format!("[{}]", p.1))
        );
    }
    let _ = writeln!(
        t,
        "(lookups/pkt: TCAM lookups per packet, monitoring + calculation, the PFE's cost in \
         place of the paper's RMT stages)"
    );
    let _ = writeln!(
        t,
        "\nFigure 9: ADA(R) after the rate halves, by calculation entries: epochs of {} µs \
         until within {} of {} Gbit/s (the paper: about 3.15 ms at 128 entries)",
        c.nimble_controller_us,
        pct(c.nimble_tolerance),
        c.nimble_rate_after_gbps
    );
    let _ = writeln!(
        t,
        "{:<9}{:>8}{:>13}{:>15}{:>12}{:>9}",
        "entries", "epochs", "emulated µs", "writes/update", "after", "error"
    );
    for x in &n.fig9 {
        let (epochs, us) = x.recovery.map_or(("-".into(), "-".into()), |rec| {
            (rec.epochs.to_string(), sci(rec.epochs_us))
        });
        let _ = writeln!(
            t,
            "{:<9}{:>8}{:>13}{:>15}{:>12}{:>9}",
            x.rate_table_entries.unwrap_or(0),
            epochs,
            us,
            x.cost
                .as_ref()
                .map_or("-".into(), |k| sci(k.writes_per_update)),
            gbps(x.mean_after_gbps),
            signed_pct(x.errors(&s).1)
        );
    }
    let accounted = n.fig8.iter().chain(&n.table2).chain(&n.fig9);
    let runs = accounted.clone().count();
    let ok = accounted.filter(|x| x.accounted).count();
    let exact = n
        .fig8
        .iter()
        .find(|x| x.variant == Variant::Exact)
        .map(|x| {
            let (b, a) = x.errors(&s);
            b.abs().max(a.abs()) <= EXACT_TOLERANCE
        });
    let _ = writeln!(
        t,
        "{ok} of {runs} runs with every frame accounted for; exact within {} of its rates \
         before and after the change: {}",
        pct(EXACT_TOLERANCE),
        match exact {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "n/a",
        }
    );
}
