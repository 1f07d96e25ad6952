//! `pfemu experiment ada`: on small seeded configurations, ADA's population beats the prior
//! work's uniform one where its budget covers the skew, the monitoring table grows from two
//! bins (Figure 6), the tables follow a shifting distribution, errors propagate as Figure 7c
//! says, the report does not depend on the threads, bad options are refused by name, and the
//! command writes its files.

#![cfg(feature = "lab")]

use std::process::Command;

use pfemu::lab::bench::ada::{ada, AdaConfig, AdaReport, BudgetRow, Chain, SHIFTING};
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
    // And on the command line, before anything runs.
    let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(["experiment", "ada", "--th-balance=-1", "--out"])
        .arg(std::env::temp_dir().join(format!("pfemu-ada-bad-{}", std::process::id())))
        .output()
        .expect("pfemu runs");
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
        .args(["--json", "--out"])
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
    let svg = std::fs::read_to_string(dir.join("ada.svg")).expect("the SVG");
    assert!(svg.starts_with("<svg") && svg.contains("Fig 7c"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The test: ADA's error no worse than the uniform population's at every budget on
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
