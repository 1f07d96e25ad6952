//! The FPISA accuracy report (`pfemu experiment fpisa-accuracy`): reproducible, FPISA within
//! the bound `src/fpisa.rs` documents on every lane (checked here exactly, in integers),
//! FPISA-A equal to FPISA where it has no events, events counted and shared correctly, the
//! CSV and SVG written, and the CLI's options.

#![cfg(feature = "lab")]

use std::path::PathBuf;
use std::process::Command;

use pfemu::fpisa::{decompose, Acc, Class, Format, Variant};
use pfemu::lab::bench::experiments::{self, ExperimentError, Figure};
use pfemu::lab::bench::fpisa_accuracy::{
    fpisa_accuracy, gradients, measure, sum_lanes, AccuracyConfig, Method, CSV_HEADER,
};

fn small(workers: &[usize], lanes: usize) -> AccuracyConfig {
    AccuracyConfig {
        workers: workers.to_vec(),
        lanes,
        ..AccuracyConfig::default()
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pfemu-acc-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn the_same_seed_gives_the_same_report_and_another_seed_another() {
    let cfg = small(&[2, 8], 2000);
    let a = fpisa_accuracy(&cfg).unwrap();
    assert_eq!(a, fpisa_accuracy(&cfg).unwrap());
    assert_eq!(gradients(&cfg, 8), gradients(&cfg, 8));
    let b = fpisa_accuracy(&AccuracyConfig { seed: 2, ..cfg }).unwrap();
    assert_ne!(a.rows, b.rows);
}

/// Value of an FP32 normal or zero as `(mantissa, exponent)` with `value = m * 2^(e - 150)`.
fn parts(x: f32) -> (i128, i32) {
    let d = decompose(x.to_bits(), Format::Fp32);
    match d.class {
        Class::Normal => (i128::from(d.man), i32::from(d.exp)),
        Class::Zero => (0, 0),
        other => panic!("unexpected {other:?} in the data"),
    }
}

#[test]
fn fpisa_is_within_its_documented_bound_on_every_lane_exactly() {
    // src/fpisa.rs: |S - value(Fp32)| < (N - 1) u(E_max) + ulp(value), S the exact sum,
    // u(E) = 2^(E - 150). Checked in integers, in units of the smallest exponent in play.
    let cfg = small(&[2, 8, 64, 128], 3000);
    for &w in &cfg.workers {
        let values = gradients(&cfg, w);
        assert_eq!(values.len(), w);
        for lane in 0..cfg.lanes {
            let xs: Vec<(i128, i32)> = values.iter().map(|v| parts(v[lane])).collect();
            let mut acc = Acc::ZERO;
            for v in &values {
                acc.add_bits(v[lane].to_bits(), Format::Fp32, Variant::Full);
            }
            assert_eq!(acc.flags, 0, "no overflow with at most 128 workers");
            let (vm, ve) = parts(f32::from_bits(acc.value(Format::Fp32)));
            let nonzero = xs.iter().filter(|x| x.0 != 0);
            let e_max = nonzero.clone().map(|x| x.1).max().unwrap();
            let unit = nonzero
                .map(|x| x.1)
                .chain((vm != 0).then_some(ve))
                .min()
                .unwrap();
            assert!(e_max - unit < 80, "fits an i128");
            let at = |(m, e): (i128, i32)| if m == 0 { 0 } else { m << (e - unit) };
            let exact: i128 = xs.iter().map(|&x| at(x)).sum();
            let value = at((vm, ve));
            let ulp = if vm == 0 { 0 } else { 1i128 << (ve - unit) };
            let bound = (w as i128 - 1) * (1i128 << (e_max - unit)) + ulp;
            let below = exact - value;
            assert!(
                below.abs() < bound || (below == 0 && bound == 0),
                "{w} workers, lane {lane}: S - value = {below} units, bound {bound}"
            );
        }
    }
    let r = fpisa_accuracy(&cfg).unwrap();
    assert_eq!(r.bound_violations, 0);
    assert!(r.verified);
    for row in r.rows.iter().filter(|r| r.method == Method::Fpisa) {
        assert_eq!(row.bound_violations, Some(0));
        assert_eq!(row.share_beyond_bound, 0.0);
        assert_eq!(row.overflows, 0);
    }
}

#[test]
fn fpisa_a_equals_fpisa_where_it_has_no_events() {
    // Positive values of one exponent: the sum only grows, so no arrival is ever larger
    // than the stored exponent: no left shift, no overwrite, and the same bits as Full.
    let w = 16;
    let mut rng = pfemu::rng::SplitMix64::new(9);
    let values: Vec<Vec<f32>> = (0..w)
        .map(|_| {
            (0..5000)
                .map(|_| (1.0 + rng.uniform()) as f32 * 0.125)
                .collect()
        })
        .collect();
    let s = sum_lanes(&values);
    assert_eq!(s.fpisa_a, s.fpisa, "bit for bit");
    assert_eq!(s.fpisa_a_counts.adds, (w * 5000) as u64);
    assert_eq!(
        (s.fpisa_a_counts.overwrites, s.fpisa_a_counts.left_shifts),
        (0, 0)
    );
    let rows = measure(&s);
    let (full, approx) = (&rows[0], &rows[1]);
    assert_eq!(
        (full.method, approx.method),
        (Method::Fpisa, Method::FpisaA)
    );
    assert_eq!(approx.overwrite_share, 0.0);
    assert_eq!(approx.left_shift_share, 0.0);
    assert_eq!(approx.abs_max, full.abs_max);
    assert_eq!(approx.share_ratio_below_128, 1.0, "every input within 2x");

    // Gradient-like data, every worker at the same scale: lane by lane, wherever FPISA-A
    // had no event it agrees with FPISA bit for bit.
    let cfg = AccuracyConfig {
        sigma_decades: 0.0,
        ..small(&[8], 4000)
    };
    let values = gradients(&cfg, 8);
    let s = sum_lanes(&values);
    let (mut quiet, mut eventful) = (0, 0);
    for lane in 0..cfg.lanes {
        let mut acc = Acc::ZERO;
        let mut any = false;
        for v in &values {
            let e = acc.add_bits(v[lane].to_bits(), Format::Fp32, Variant::Approx);
            any |= e.overwrite || e.left_shift || e.overflow;
        }
        assert_eq!(f32::from_bits(acc.value(Format::Fp32)), s.fpisa_a[lane]);
        if any {
            eventful += 1;
        } else {
            quiet += 1;
            assert_eq!(
                s.fpisa_a[lane].to_bits(),
                s.fpisa[lane].to_bits(),
                "lane {lane}"
            );
        }
    }
    assert!(
        quiet > 0 && eventful > 0,
        "{quiet} quiet, {eventful} eventful"
    );
}

#[test]
fn an_overwrite_is_counted_and_its_damage_is_beyond_the_rounding_bound() {
    // 2^-20 then 1.0: the arrival is 2^20 times the stored value, past FPISA-A's 2^7
    // headroom, so it overwrites; FPISA keeps the small value's bits (2^-20 needs 21 bits
    // below 1.0, within FP32's 23) and is exact.
    let values = vec![vec![2f32.powi(-20)], vec![1.0]];
    let s = sum_lanes(&values);
    assert_eq!(s.fpisa[0], 1.0 + 2f32.powi(-20));
    assert_eq!(s.fpisa_a[0], 1.0);
    assert_eq!(s.fpisa_a_counts.overwrites, 1);
    assert_eq!(s.fpisa_a_overwritten_lanes, 1);
    let rows = measure(&s);
    let approx = &rows[1];
    assert_eq!(approx.overwrite_share, 0.5, "one of two additions");
    assert_eq!(approx.abs_max, 2f64.powi(-20));
    assert_eq!(approx.share_beyond_bound, 1.0);
    assert_eq!(approx.share_1e8_1e6, 1.0, "2^-20 is about 9.5e-7");
    assert_eq!(rows[0].abs_max, 0.0);
    assert_eq!(rows[0].share_below_1e12, 1.0);
    assert_eq!(rows[2].abs_max, 0.0, "f32 holds 1 + 2^-20 exactly");
}

#[test]
fn rows_are_consistent_and_event_shares_are_shares() {
    let cfg = small(&[1, 4, 32], 3000);
    let r = fpisa_accuracy(&cfg).unwrap();
    assert_eq!(r.rows.len(), 3 * 3);
    assert_eq!(r.key_workers, 1, "no 8 in the list: the first");
    for (i, row) in r.rows.iter().enumerate() {
        assert_eq!(row.workers, cfg.workers[i / 3]);
        assert_eq!(row.method, Method::ALL[i % 3]);
        assert_eq!(row.lanes, 3000);
        let bins = [
            row.share_below_1e12,
            row.share_1e12_1e10,
            row.share_1e10_1e8,
            row.share_1e8_1e6,
            row.share_from_1e6,
        ];
        assert!((bins.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{row:?}");
        assert!((bins[..3].iter().sum::<f64>() - row.share_below_1e8).abs() < 1e-12);
        assert!(row.abs_median <= row.abs_p99 && row.abs_p99 <= row.abs_max);
        assert!(row.rel_median <= row.rel_max && row.vs_f32_median <= row.vs_f32_max);
        for share in [
            row.overwrite_share,
            row.left_shift_share,
            row.share_beyond_bound,
            row.share_ratio_below_128,
        ] {
            assert!((0.0..=1.0).contains(&share), "{row:?}");
        }
        assert!(row.overwritten_lanes <= row.overwrites && row.overflowed_lanes <= row.overflows);
        match row.method {
            Method::Fpisa | Method::FpisaA => {
                assert_eq!(row.additions, (row.workers * row.lanes) as u64);
                assert_eq!(
                    row.overwrite_share,
                    row.overwrites as f64 / row.additions as f64
                );
            }
            Method::F32Sequential => {
                assert_eq!(row.additions, 0);
                assert_eq!((row.vs_f32_median, row.vs_f32_max), (0.0, 0.0));
            }
        }
        if row.method != Method::FpisaA {
            assert_eq!((row.overwrites, row.left_shifts), (0, 0));
        }
        if row.workers == 1 {
            // One value: every method returns it exactly, nothing is an event.
            assert_eq!(row.abs_max, 0.0);
            assert_eq!((row.overwrites, row.left_shifts), (0, 0));
        }
    }
    // 32 workers with scales a decade apart: FPISA-A left-shifts, and overwrites some.
    let a32 = r.row(32, Method::FpisaA).unwrap();
    assert!(a32.left_shift_share > 0.0 && a32.overwrites > 0, "{a32:?}");

    // Narrower scales, more lanes within 2^7 (the paper's Figure 7 statistic).
    let spread = |d: f64| {
        fpisa_accuracy(&AccuracyConfig {
            sigma_decades: d,
            ..small(&[8], 3000)
        })
        .unwrap()
        .rows[0]
            .share_ratio_below_128
    };
    assert!(spread(0.0) > spread(1.0) && spread(1.0) > spread(2.0));
}

#[test]
fn the_csv_has_a_row_per_workers_and_method_and_the_svg_is_drawn() {
    let r = fpisa_accuracy(&small(&[2, 8], 1000)).unwrap();
    assert_eq!(r.key_workers, 8);
    let dir = temp_dir("files");
    let written = experiments::write_files(&r, &dir).unwrap();
    assert_eq!(written.csv, dir.join("fpisa-accuracy.csv"));
    let csv = std::fs::read_to_string(&written.csv).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], CSV_HEADER.join(","));
    assert!(lines[0].starts_with("workers,method,lanes,"));
    assert_eq!(lines.len(), 1 + 2 * 3);
    assert!(lines
        .iter()
        .all(|l| l.split(',').count() == CSV_HEADER.len()));
    assert!(lines[1].starts_with("2,fpisa,1000,"));
    assert!(lines[2].starts_with("2,fpisa_a,1000,"));
    assert!(lines[6].starts_with("8,f32_sequential,1000,"));
    let svg = std::fs::read_to_string(&written.svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
    assert!(svg.contains("fpisa_a, median"));
    let table = r.table();
    assert!(table.contains("key: 8 workers"), "{table}");
    assert!(table.contains("every lane: yes"));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn option_of(e: ExperimentError) -> &'static str {
    match e {
        ExperimentError::Option { option, .. } => option,
        other => panic!("not an option error: {other}"),
    }
}

#[test]
fn bad_settings_are_refused_by_name() {
    for workers in [vec![], vec![0], vec![2, 129]] {
        let e = fpisa_accuracy(&small(&workers, 10)).unwrap_err();
        assert_eq!(option_of(e), "--workers-list");
    }
    let e = fpisa_accuracy(&small(&[2], 0)).unwrap_err();
    assert_eq!(option_of(e), "--lanes");
    let e = fpisa_accuracy(&small(&[2], (1 << 20) + 1)).unwrap_err();
    assert_eq!(option_of(e), "--lanes");
    let e = fpisa_accuracy(&AccuracyConfig {
        sigma_decades: f64::NAN,
        ..small(&[2], 10)
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--sigma-decades");
}

fn pfemu(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_cli_runs_it_writes_the_files_and_refuses_options_that_do_not_apply() {
    let dir = temp_dir("cli");
    let out = pfemu(&[
        "experiment",
        "fpisa-accuracy",
        "--workers-list",
        "2,8",
        "--lanes",
        "500",
        "--seed",
        "3",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["experiment"], "fpisa-accuracy");
    assert_eq!(v["verified"], true);
    assert_eq!(v["config"]["seed"], 3);
    assert_eq!(v["rows"].as_array().unwrap().len(), 6);
    assert_eq!(v["rows"][1]["method"], "fpisa_a");
    assert!(dir.join("fpisa-accuracy.csv").exists() && dir.join("fpisa-accuracy.svg").exists());

    let out = pfemu(&[
        "experiment",
        "fpisa-accuracy",
        "--workers-list",
        "4",
        "--lanes",
        "100",
        "--sigma-decades",
        "0",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("key: 4 workers") && table.contains("fpisa-accuracy.svg"));
    std::fs::remove_dir_all(&dir).unwrap();

    let refused = |args: &[&str], needles: &[&str]| {
        let out = pfemu(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err}");
        }
    };
    refused(
        &["experiment", "fpisa-accuracy", "--workers", "4"],
        &["`--workers`", "--workers-list"],
    );
    refused(
        &["experiment", "fpisa-accuracy", "--ppe-threads", "4"],
        &["`--ppe-threads`", "fig13"],
    );
    refused(
        &["experiment", "fig14", "--lanes", "10"],
        &["`--lanes`", "fpisa-accuracy"],
    );
    refused(
        &["experiment", "all", "--workers-list", "2"],
        &["`--workers-list`", "fpisa-accuracy"],
    );
    refused(
        &["experiment", "fpisa-accuracy", "--workers-list", "2,200"],
        &["`--workers-list`", "1..=128"],
    );
    let out = pfemu(&["experiment", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("fpisa-accuracy") && help.contains("--workers-list"));
}
