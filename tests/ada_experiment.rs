//! `pfemu experiment ada`: on small seeded configurations, ADA's population beats the prior
//! work's uniform one where its budget covers the skew, the monitoring table grows from two
//! bins (Figure 6), the tables follow a shifting distribution, errors propagate as Figure 7c
//! says, Nimble's rate limiter follows a rate change under ADA and not under its static
//! arithmetic (Figure 8), ADA on both operands costs the controller the most (Table II),
//! Figure 9's recovery is found at every table size, the report does not depend on the
//! threads, bad options are refused by name, and the command writes its files.

#![cfg(feature = "lab")]

use std::process::Command;

use pfemu::lab::bench::ada::{
    ada, AdaConfig, AdaReport, BudgetRow, Chain, NimbleRun, Variant, SHIFTING,
};
use pfemu::lab::bench::experiments::Figure;

/// Small enough for a debug build: short epochs, few samples, two budgets.
fn small() -> AdaConfig {
    AdaConfig {
        epoch_operands: 5000,
        budgets: vec![464, 896],
        samples: 3000,
        significant_bits: vec![0, 3, 6],
        chains: 300,
        shift_after: 6,
        shift_epochs: 6,
        shift_samples: 1000,
        nimble_table_entries: vec![32, 128],
        threads: 2,
        ..AdaConfig::default()
    }
}

fn run(cfg: &AdaConfig) -> AdaReport {
    ada(cfg, &|_, _| {}).expect("the experiment runs")
}

fn row<'a>(r: &'a AdaReport, dist: &str, op: &str, budget: u64) -> &'a BudgetRow {
    r.budgets
        .iter()
        .find(|b| b.distribution == dist && b.op == op && b.budget == budget)
        .unwrap_or_else(|| panic!("no row for {dist} {op} {budget}"))
}

/// The skewed distributions of Figure 5 (all but uniform).
const SKEWED: [&str; 4] = ["exponential", "fisher-f", "g1+g2", "exp+g"];

#[test]
fn ada_beats_uniform_where_its_budget_covers_the_skew() {
    let r = run(&small());
    assert!(r.verified(), "{:?}", r.checks);
    assert!(r.checks.lookups > 100_000 && r.checks.bound_checks > 50_000);
    for b in &r.binning {
        assert!(b.steady, "{} not steady", b.distribution);
        assert!(b.tv_steady < b.tv_initial / 4.0, "{b:?}");
    }
    // At the largest budget ADA's one-operand tables are better on every skewed
    // distribution. Smaller budgets are not asserted: there Algorithm 3 leaves entries
    // unused, gives each empty bin above the operands one, and leaves the bin holding 0,
    // which spans a dozen octaves, too few to refine it (the report's claims say so).
    for dist in SKEWED {
        for op in ["square", "sqrt", "log2"] {
            let b = row(&r, dist, op, 896);
            let ada = b.ada.expect("896 entries cover the bins");
            assert!(
                ada.mean < b.uniform.mean,
                "{dist} {op}: ADA {} vs uniform {}",
                ada.mean,
                b.uniform.mean
            );
            assert!(b.ada_entries.is_some_and(|n| n as u64 <= 896));
        }
    }
    // Every row's budget holds both populations.
    for b in &r.budgets {
        assert!(b.uniform_entries <= b.budget);
        assert!(b.ada_entries.is_none_or(|n| n as u64 <= b.budget));
    }
    assert!(r.budgets.iter().any(|b| b.distribution == SHIFTING));
}

#[test]
fn the_monitoring_table_grows_from_two_bins() {
    let r = run(&AdaConfig {
        budgets: vec![896],
        ..small()
    });
    assert_eq!(r.growth.len(), 2);
    for g in &r.growth {
        let bins: Vec<usize> = g.steps.iter().map(|s| s.bins).collect();
        assert_eq!(bins[0], 2, "b = 1: two bins");
        assert!(bins.windows(2).all(|w| w[1] >= w[0]), "{bins:?}");
        assert!(g.steady, "{}-bit: {bins:?}", g.operand_bits);
        // The bin holding the median has come down to a few hundred operands.
        let last = g.steps.last().expect("steps");
        let (first, end) = last
            .in_view
            .iter()
            .find(|(a, b)| (*a..=*b).contains(&4000))
            .copied()
            .expect("a bin holds 4000");
        assert!(end - first < 512, "{}-bit: {first}..{end}", g.operand_bits);
    }
    // Over 13 bits, as in the paper's Figure 6: two bins to six or so in about five changes.
    let narrow = r
        .growth
        .iter()
        .find(|g| g.operand_bits == 13)
        .expect("13-bit");
    let bins = narrow.steps.last().map(|s| s.bins).unwrap_or(0);
    assert!((5..=9).contains(&bins), "{bins}");
    assert!((3..=8).contains(&(narrow.steps.len() - 1)));
}

#[test]
fn the_tables_follow_a_shifting_distribution() {
    let r = run(&small());
    let s = &r.shift;
    assert_eq!(s.epochs.len(), 12);
    let first_after = s.epochs[6].ada.expect("a population").mean;
    assert!(
        first_after > 5.0 * s.pre_shift_error,
        "the table learnt before the shift misses it: {first_after} vs {}",
        s.pre_shift_error
    );
    let n = s.recovered_after.expect("ADA re-adapts");
    assert!(n <= 3, "recovered after {n} epochs");
    assert!(s.repopulations_to_recover.is_some_and(|t| t >= 1));
    // Frozen at the shift, ADA's table stays wrong; re-populated, it is better than the
    // uniform population on the narrow Gaussian.
    assert!(s.after_shift_mean.frozen > 5.0 * s.final_error);
    assert!(s.final_error < s.after_shift_mean.uniform);
}

#[test]
fn errors_propagate_more_through_squares_than_doublings() {
    let r = run(&AdaConfig {
        budgets: vec![896],
        ..small()
    });
    let last = |c: Chain, m: &str| {
        r.propagation
            .iter()
            .find(|p| p.function == c)
            .and_then(|p| p.rows.iter().find(|x| x.method == m && x.iteration == 10))
            .map(|x| x.error.mean)
            .expect("10 iterations")
    };
    for m in ["uniform", "ADA"] {
        assert!(
            last(Chain::Square, m) > 10.0 * last(Chain::Double, m),
            "{m}"
        );
    }
    // Figure 7a-b: more significant bits, less error, many more entries.
    for x in r.significant_bits.iter().filter(|x| x.s == 0) {
        let at6 = r
            .significant_bits
            .iter()
            .find(|y| y.op == x.op && y.operands == x.operands && y.s == 6)
            .expect("s = 6");
        assert!(at6.error.mean < x.error.mean / 8.0, "{x:?}");
        assert!(at6.entries > 30 * x.entries);
    }
}

#[test]
fn the_report_does_not_depend_on_the_threads() {
    let cfg = AdaConfig {
        budgets: vec![464],
        significant_bits: vec![2],
        ..small()
    };
    let one = run(&AdaConfig {
        threads: 1,
        ..cfg.clone()
    });
    let two = run(&AdaConfig { threads: 2, ..cfg });
    let json = |r: &AdaReport| {
        let mut v = serde_json::to_value(r).expect("serialises");
        v["config"]["threads"] = serde_json::Value::Null;
        v.to_string()
    };
    assert_eq!(json(&one), json(&two));
    assert_eq!(one.csv_rows(), two.csv_rows());
}

/// Puts one bad value in a configuration.
type Spoil = fn(&mut AdaConfig);

#[test]
fn bad_options_are_refused_by_name() {
    let refused = |cfg: AdaConfig, option: &str| {
        let e = ada(&cfg, &|_, _| {}).expect_err("refused");
        assert!(e.to_string().contains(option), "{option}: {e}");
    };
    refused(
        AdaConfig {
            epoch_operands: 0,
            ..small()
        },
        "--epoch-operands",
    );
    refused(
        AdaConfig {
            epoch_operands: 1 << 40,
            ..small()
        },
        "--epoch-operands",
    );
    refused(
        AdaConfig {
            monitor_entries: 0,
            ..small()
        },
        "--monitor-entries",
    );
    // One bin never adapts.
    refused(
        AdaConfig {
            monitor_entries: 1,
            ..small()
        },
        "--monitor-entries",
    );
    refused(
        AdaConfig {
            th_balance: f64::NAN,
            ..small()
        },
        "--th-balance",
    );
    refused(
        AdaConfig {
            th_balance: -0.2,
            ..small()
        },
        "--th-balance",
    );
    refused(
        AdaConfig {
            th_balance: 0.0,
            ..small()
        },
        "--th-balance",
    );
    refused(
        AdaConfig {
            th_expansion: 40,
            ..small()
        },
        "--th-expansion",
    );
    refused(
        AdaConfig {
            max_epochs: 0,
            ..small()
        },
        "--max-epochs",
    );
    refused(
        AdaConfig {
            steady_epochs: 0,
            ..small()
        },
        "--steady-epochs",
    );
    refused(
        AdaConfig {
            budgets: vec![],
            ..small()
        },
        "--budgets",
    );
    refused(
        AdaConfig {
            budgets: vec![0],
            ..small()
        },
        "--budgets",
    );
    refused(
        AdaConfig {
            budgets: vec![64, 1 << 30],
            ..small()
        },
        "--budgets",
    );
    refused(
        AdaConfig {
            samples: 0,
            ..small()
        },
        "--samples",
    );
    refused(
        AdaConfig {
            significant_bits: vec![40],
            ..small()
        },
        "--significant-bits",
    );
    refused(
        AdaConfig {
            propagation_budget: 10,
            ..small()
        },
        "--propagation-budget",
    );
    refused(
        AdaConfig {
            iterations: 0,
            ..small()
        },
        "--iterations",
    );
    refused(
        AdaConfig {
            chains: 0,
            ..small()
        },
        "--chains",
    );
    refused(
        AdaConfig {
            shift_after: 0,
            ..small()
        },
        "--shift-after",
    );
    refused(
        AdaConfig {
            shift_epochs: 0,
            ..small()
        },
        "--shift-epochs",
    );
    refused(
        AdaConfig {
            shift_budget: u64::MAX,
            ..small()
        },
        "--shift-budget",
    );
    refused(
        AdaConfig {
            shift_samples: 0,
            ..small()
        },
        "--shift-samples",
    );
    refused(
        AdaConfig {
            recovery_factor: f64::NAN,
            ..small()
        },
        "--recovery-factor",
    );
    refused(
        AdaConfig {
            recovery_factor: -2.0,
            ..small()
        },
        "--recovery-factor",
    );
    refused(
        AdaConfig {
            fig6_bits: vec![8],
            ..small()
        },
        "--fig6-bits",
    );
    refused(
        AdaConfig {
            threads: 0,
            ..small()
        },
        "--threads",
    );
    let nimble: [(&str, Spoil); 19] = [
        ("--nimble-rate-gbps", |c| c.nimble_rate_gbps = 0.0),
        ("--nimble-rate-gbps", |c| c.nimble_rate_gbps = f64::NAN),
        ("--nimble-rate-after-gbps", |c| {
            c.nimble_rate_after_gbps = 500.0
        }),
        ("--nimble-duration-us", |c| c.nimble_duration_us = 0),
        ("--nimble-duration-us", |c| c.nimble_duration_us = 2_000_000),
        ("--nimble-duration-us", |c| {
            // 33 million frames.
            c.nimble_duration_us = 1_000_000;
            c.nimble_offered_gbps = 400.0;
        }),
        ("--nimble-frame-bytes", |c| c.nimble_frame_bytes = 20),
        ("--nimble-offered-gbps", |c| c.nimble_offered_gbps = -1.0),
        ("--nimble-window-us", |c| c.nimble_window_us = 0),
        ("--nimble-window-us", |c| c.nimble_window_us = 7000),
        ("--nimble-controller-us", |c| c.nimble_controller_us = 0),
        ("--nimble-change-us", |c| c.nimble_change_us = 100),
        ("--nimble-change-us", |c| c.nimble_change_us = 5900),
        // An add that wrapped took this for a time inside the run.
        ("--nimble-change-us", |c| {
            c.nimble_change_us = u64::MAX - 100
        }),
        ("--nimble-dt-monitor-entries", |c| {
            c.nimble_dt_monitor_entries = 4
        }),
        ("--nimble-table-entries", |c| {
            c.nimble_table_entries = vec![]
        }),
        ("--nimble-table-entries", |c| {
            c.nimble_table_entries = vec![128, 8]
        }),
        ("--nimble-tolerance", |c| c.nimble_tolerance = 0.0),
        ("--nimble-tolerance", |c| c.nimble_tolerance = f64::NAN),
    ];
    for (option, spoil) in nimble {
        let mut cfg = small();
        spoil(&mut cfg);
        refused(cfg, option);
    }
    // And on the command line, before anything runs.
    let dir = std::env::temp_dir().join(format!("pfemu-ada-bad-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(["experiment", "ada", "--th-balance=-1", "--out"])
        .arg(&dir)
        .output()
        .expect("pfemu runs");
    // The output directory is made before the options are checked; nothing is written in it.
    let written = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(written, 0, "a refused run wrote into {}", dir.display());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--th-balance"), "{stderr}");
}

#[test]
fn the_command_writes_its_csv_svg_and_json() {
    let dir = std::env::temp_dir().join(format!("pfemu-ada-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args([
            "experiment",
            "ada",
            "--epoch-operands",
            "4000",
            "--budgets",
            "240,896",
        ])
        .args([
            "--samples",
            "1000",
            "--significant-bits",
            "0,4",
            "--chains",
            "100",
        ])
        .args([
            "--shift-after",
            "4",
            "--shift-epochs",
            "4",
            "--shift-samples",
            "300",
        ])
        .args(["--nimble-table-entries", "16,64", "--json", "--out"])
        .arg(&dir)
        .output()
        .expect("pfemu runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["experiment"], "ada");
    assert_eq!(v["verified"], true);
    let claims = v["claims"].as_array().expect("claims");
    assert!(claims.len() >= 6);
    assert!(claims
        .iter()
        .all(|c| c["paper"].is_string() && c["measured"].is_string()));
    assert_eq!(v["binning"].as_array().map(Vec::len), Some(5));
    let csv = std::fs::read_to_string(dir.join("ada.csv")).expect("the CSV");
    assert!(csv.starts_with("part,distribution,op,method,x_name,x,metric,value\n"));
    assert!(csv.contains("\nbudget,exponential,mul,ADA,budget,896,mean_error,"));
    assert!(csv.contains("\nfig8,poisson,mul,ada-r,window_start_us,3000,admitted_gbps,"));
    assert!(csv.contains("\ntable2,poisson,mul,ada-dt-r,run,,writes_per_update,"));
    assert!(csv.contains("\nfig9,poisson,mul,ada-r,table_entries,16,recovery_epochs,"));
    assert_eq!(v["nimble"]["fig8"].as_array().map(Vec::len), Some(4));
    assert_eq!(v["nimble"]["table2"][2]["variant"], "ada-dt-r");
    assert_eq!(v["nimble"]["verified"], true);
    let svg = std::fs::read_to_string(dir.join("ada.svg")).expect("the SVG");
    assert!(svg.starts_with("<svg") && svg.contains("Fig 7c"));
    assert!(svg.contains("Fig 8") && svg.contains("Fig 9"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The issue's test: ADA's error no worse than the uniform population's at every budget on
/// skewed operands, and better at every budget above the prior work's coarsest table. At
/// 33 entries (the uniform population with 0 significant bits) a steady trie's ~20 bins
/// and the octaves of the bin reaching 0 take every entry, and ADA's table can come out
/// the same as the uniform one (it does on exponential operands).
#[test]
fn ada_beats_uniform_at_every_budget_on_skewed_operands() {
    let r = run(&AdaConfig {
        budgets: vec![33, 64, 124, 240, 464, 896],
        ..small()
    });
    let skewed = || (r.budgets.iter()).filter(|b| SKEWED.contains(&b.distribution.as_str()));
    let name = |b: &BudgetRow| format!("{} {} {}", b.distribution, b.op, b.budget);
    let worse: Vec<String> = skewed()
        .filter(|b| {
            b.ada
                .is_none_or(|a| a.mean > b.uniform.mean * (1.0 + 1e-12))
        })
        .map(name)
        .collect();
    assert!(worse.is_empty(), "ADA worse at: {}", worse.join(", "));
    let not_better: Vec<String> = skewed()
        .filter(|b| b.budget > 33)
        .filter(|b| b.ada.is_none_or(|a| a.mean >= b.uniform.mean))
        .map(name)
        .collect();
    assert!(
        not_better.is_empty(),
        "ADA no better at: {}",
        not_better.join(", ")
    );
}

/// §V.B alone: the rest of the report as small as it goes.
fn nimble_only(table_entries: Vec<usize>) -> AdaReport {
    run(&AdaConfig {
        epoch_operands: 1000,
        budgets: vec![240],
        samples: 200,
        significant_bits: vec![2],
        iterations: 2,
        chains: 20,
        shift_after: 2,
        shift_epochs: 2,
        shift_samples: 100,
        fig6_bits: vec![13],
        nimble_table_entries: table_entries,
        ..small()
    })
}

fn fig8_run(r: &AdaReport, v: Variant) -> &NimbleRun {
    r.nimble
        .fig8
        .iter()
        .find(|x| x.variant == v)
        .unwrap_or_else(|| panic!("no Figure 8 run for {v:?}"))
}

/// Figure 8: the rate halves from 24 to 12 Gbit/s at 3 ms by the data plane.
#[test]
fn figure_8_ada_follows_the_rate_change_that_the_static_arithmetic_misses() {
    let r = nimble_only(vec![128]);
    assert!(r.verified(), "{:?}", r.nimble);
    let n = &r.nimble;
    let variants: Vec<Variant> = n.fig8.iter().map(|x| x.variant).collect();
    assert_eq!(variants, Variant::FIGURE_8);
    for x in n.fig8.iter().chain(&n.table2).chain(&n.fig9) {
        assert!(x.accounted, "{:?}", x.variant);
        assert_eq!(x.admitted + x.dropped, x.offered);
        assert_eq!(x.admitted_gbps.len(), 60);
    }
    // Exact: the rates, within half a percent, after the first window's full bucket.
    let exact = fig8_run(&r, Variant::Exact);
    assert!((exact.mean_before_gbps / 24.0 - 1.0).abs() < 0.005);
    assert!((exact.mean_after_gbps / 12.0 - 1.0).abs() < 0.005);
    // Static: the rate baked in by the control plane, still 24 after the change.
    let fixed = fig8_run(&r, Variant::Static);
    assert!(
        (fixed.mean_after_gbps / 24.0 - 1.0).abs() < 0.01,
        "{fixed:?}"
    );
    assert!(fixed.recovery.is_none());
    // ADA: within 1% of 12 within a few epochs, and on average after the change.
    let ada = fig8_run(&r, Variant::AdaR);
    let rec = ada.recovery.expect("ADA recovers");
    assert!((1..=3).contains(&rec.epochs), "{rec:?}");
    assert_eq!(rec.epochs_us, 100.0 * rec.epochs as f64);
    assert!((ada.mean_after_gbps / 12.0 - 1.0).abs() < 0.01, "{ada:?}");
    assert!((ada.mean_before_gbps / 24.0 - 1.0).abs() < 0.01, "{ada:?}");
    // The first window after the change still has the old table: off by more than 1%.
    assert!(
        ada.admitted_gbps[30] > 12.0 * 1.02,
        "{:?}",
        ada.admitted_gbps
    );
    // Uniform: off by its table's error, within its bound, the same before and after.
    let uniform = fig8_run(&r, Variant::Uniform);
    let (before, after) = uniform.errors(&r.config.nimble_scenario());
    assert!(before.abs() > 0.01 && before.abs() < 0.125, "{before}");
    assert!((before - after).abs() < 0.01, "{before} {after}");
}

/// Table II: each operand's monitoring from 8 entries; ADA on both operands reads and
/// writes the most, and looks up the most per packet.
#[test]
fn table_ii_ada_on_both_operands_costs_the_controller_the_most() {
    let r = nimble_only(vec![128]);
    let rows: Vec<(Variant, f64, f64, f64)> = r
        .nimble
        .table2
        .iter()
        .map(|x| {
            let k = x.cost.as_ref().expect("a controller");
            for o in &k.operands {
                assert_eq!(o.bins_start, 8, "{:?} {}", x.variant, o.operand);
                assert!(o.bins_end > 8, "{:?} {}: {o:?}", x.variant, o.operand);
                assert_eq!(o.epochs, k.updates);
            }
            assert_eq!(k.updates, 59);
            (
                x.variant,
                k.reads_per_update,
                k.writes_per_update,
                k.tcam_lookups_per_packet,
            )
        })
        .collect();
    let variants: Vec<Variant> = rows.iter().map(|x| x.0).collect();
    assert_eq!(variants, [Variant::AdaR, Variant::AdaDt, Variant::AdaDtR]);
    let (rate, dt, both) = (rows[0], rows[1], rows[2]);
    assert!(both.1 > rate.1 && both.1 > dt.1, "reads: {rows:?}");
    assert!(both.2 > rate.2 && both.2 > dt.2, "writes: {rows:?}");
    // Reads: a hit counter per bin, and the bins grow from 8.
    assert!(rate.1 > 8.0 && dt.1 > 8.0 && both.1 > 16.0, "{rows:?}");
    // Four lookups a packet with one monitored operand, five with two (a frame at the
    // same nanosecond as the last refills nothing: a hair fewer).
    for (x, want) in [(rate, 4.0), (dt, 4.0), (both, 5.0)] {
        assert!(x.3 <= want && x.3 > want - 0.02, "{x:?}");
    }
}

/// Figure 9: the epochs ADA needs after the rate halves, at every table size.
#[test]
fn figure_9_reports_the_recovery_at_every_table_size() {
    let sizes = vec![16, 48, 80, 128];
    let r = nimble_only(sizes.clone());
    let got: Vec<Option<usize>> = r.nimble.fig9.iter().map(|x| x.rate_table_entries).collect();
    assert_eq!(got, sizes.iter().map(|&n| Some(n)).collect::<Vec<_>>());
    let mut writes = Vec::new();
    for x in &r.nimble.fig9 {
        let rec = x.recovery.unwrap_or_else(|| panic!("{x:?}"));
        assert!(rec.epochs <= 10, "{:?}: {rec:?}", x.rate_table_entries);
        assert_eq!(rec.epochs_us, 100.0 * rec.epochs as f64);
        writes.push(x.cost.as_ref().expect("a controller").writes_per_update);
    }
    // A larger table costs more writes each time it is re-populated.
    assert!(writes.windows(2).all(|w| w[1] > w[0]), "{writes:?}");
    // 128 entries, primed: Figure 8's ADA run, the same arrivals and verdicts.
    let fig8 = fig8_run(&r, Variant::AdaR);
    assert_eq!(r.nimble.fig9[3].admitted_gbps, fig8.admitted_gbps);
}
