//! The paper's Trio-ML experiments (Figures 13-16) with tiny parameters: each writes its
//! CSV (header, one row per point) and SVG, every Result arrives with the right sums, fig14's
//! Results are partial without the straggler, and fig13's straggler-aware mode gives up on
//! stragglers while wait-for-all never does. Nothing here asserts on timing.

#![cfg(feature = "lab")]

use std::path::{Path, PathBuf};
use std::process::Command;

use pfemu::lab::bench::experiments::{
    self, ExperimentError, Fig13Config, Fig14Config, Fig15Config, Fig16Config, Figure, RateJob,
};

/// A fresh directory under the system's temporary one.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pfemu-exp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Writes `report`'s files into `dir` and checks them: the CSV's header and one row per
/// point, an SVG.
fn check_files<F: Figure>(report: &F, dir: &Path, header: &str, points: usize) {
    let written = experiments::write_files(report, dir).unwrap();
    assert_eq!(written.csv, dir.join(format!("{}.csv", report.name())));
    let csv = std::fs::read_to_string(&written.csv).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], header);
    assert_eq!(lines.len(), 1 + points, "{csv}");
    let columns = header.split(',').count();
    assert!(lines.iter().all(|l| l.split(',').count() == columns));
    let svg = std::fs::read_to_string(&written.svg).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    assert!(svg.contains("</svg>"));
    assert!(!report.table().is_empty());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn fig14_partial_results_leave_out_the_straggler_and_have_the_senders_sums() {
    let cfg = Fig14Config {
        timeouts_ms: vec![2, 5],
        workers: 4,
        blocks: 4,
        grads: 64,
        timers: 10,
        virtual_time: true,
        ..Fig14Config::default()
    };
    let r = experiments::fig14(&cfg).unwrap();
    assert!(r.verified, "{r:#?}");
    assert!(r.all_p50_within && r.all_max_within, "{r:#?}");
    assert_eq!(r.rows.len(), 2);
    let scan_ms = cfg.scan_period_ns as f64 / 1e6;
    for row in &r.rows {
        assert!(row.verified);
        // Three senders, four blocks each: every Result partial, summing the three.
        assert_eq!(row.results, 12);
        assert_eq!(row.partial_results, 12, "degraded with src_cnt 3");
        assert_eq!(row.samples, 12, "one per block and sender");
        assert!(row.min_ms <= row.p50_ms && row.p50_ms <= row.max_ms);
        let t = f64::from(row.timeout_ms);
        // On the virtual clock a block ages between T and T + one scan period after its
        // last packet, and nothing else takes time.
        assert!(
            t <= row.min_ms && row.max_ms <= t + scan_ms,
            "T = {t} ms, scan {scan_ms} ms: {row:?}"
        );
        assert_eq!((row.timer_overruns, row.timer_missed), (0, 0));
        assert_eq!(row.paper_2x_ms, 2.0 * t);
        assert!(
            (row.bound_ms - (1.1 * t + 1.0)).abs() < 1e-9,
            "(1 + 1/N) T + 1 ms"
        );
    }
    // The same run gives the same times.
    let again = experiments::fig14(&cfg).unwrap();
    let times = |r: &experiments::Fig14Report| {
        r.rows
            .iter()
            .map(|w| (w.min_ms, w.p50_ms, w.mean_ms, w.max_ms))
            .collect::<Vec<_>>()
    };
    assert_eq!(times(&r), times(&again));
    check_files(
        &r,
        &temp_dir("fig14"),
        "timeout_ms,samples,p50_ms,mean_ms,min_ms,max_ms,bound_ms,paper_2x_ms,p50_within,\
         max_within,results,partial_results,timer_overruns,timer_missed,verified",
        2,
    );
}

/// On the system clock the figure also runs to the end with a sample per block and
/// sender; whether every block had all its senders in before its timeout depends on how
/// busy the machine is (a sender held up past it misses its block), so only the virtual
/// clock's test above checks the sums.
#[test]
fn fig14_on_the_system_clock_times_every_block() {
    let cfg = Fig14Config {
        timeouts_ms: vec![20],
        workers: 3,
        blocks: 2,
        grads: 64,
        timers: 10,
        ..Fig14Config::default()
    };
    let r = experiments::fig14(&cfg).unwrap();
    assert_eq!(r.rows.len(), 1);
    let row = &r.rows[0];
    assert_eq!(row.samples, 4, "one per block and sender: {row:?}");
    assert!(row.min_ms <= row.p50_ms && row.p50_ms <= row.max_ms);
    assert!(row.results >= 4, "{row:?}");
}

#[test]
fn fig13_straggler_aware_gives_up_on_stragglers_and_wait_for_all_never_does() {
    let cfg = Fig13Config {
        probabilities_pct: vec![0.0, 60.0],
        workers: 4,
        iterations: 4,
        compute_ms: 20.0,
        block_exp_ms: 2,
        model_gradients: 2048 + 100,
        grads: 256,
        timers: 10,
        ..Fig13Config::default()
    };
    let r = experiments::fig13(&cfg).unwrap();
    assert!(r.verified, "{r:#?}");
    assert_eq!(r.rows.len(), 2);
    assert!(r.typical_iteration_ms > 0.0);
    assert_eq!(r.max_p_pct, 60.0);
    let chunks = 9u64; // 2148 gradients in packets of 256
    let (calm, stormy) = (&r.rows[0], &r.rows[1]);
    assert_eq!(calm.events, 0);
    assert!(stormy.events > 0, "the seeded schedule has stragglers");
    for row in &r.rows {
        let (a, w) = (&row.straggler_aware, &row.wait_for_all);
        assert!(a.verified && w.verified);
        // Wait-for-all: every worker gets every iteration's complete Results.
        assert_eq!(w.degraded, 0, "p = {}", row.p_pct);
        assert_eq!(w.results, 4 * 4 * chunks);
        assert_eq!((w.resyncs, w.skipped_iterations), (0, 0));
        assert_eq!(w.straggles, row.events, "every straggle happens");
        assert_eq!((w.stale_gen, w.lost), (0, 0), "no block ages out");
        // Straggler aware: each allreduce a worker took part in settled every chunk, with
        // a Result or told its generation was gone; the iterations it skipped to catch up
        // it sent nothing for. How many Results were partial, or how many chunks a worker
        // held up past a whole iteration (by a busy machine, after its last look at the
        // others' progress) lost, depends on the machine's speed; that they add up does not.
        assert_eq!(
            a.results + a.lost,
            (4 * 4 - a.skipped_iterations) * chunks,
            "p = {}: {a:?}",
            row.p_pct
        );
        assert!(
            a.lost <= a.stale_gen,
            "every lost chunk was a stale packet: {a:?}"
        );
        assert!(row.speedup > 0.0);
    }
    // Each straggle sleeps at least half a typical iteration (measured on this machine, as
    // busy as the run), many times the 2 ms timeout, while the others send; a worker that
    // resynchronised instead was behind because the others had finished without it.
    let a = &stormy.straggler_aware;
    assert!(
        a.degraded > 0,
        "partial Results when workers straggle: {a:?}"
    );
    // A scheduled straggle happens unless its worker, behind, skipped past it to catch
    // up (which a busy machine alone can make it do): never more straggles than events,
    // and none only if some worker resynchronised.
    assert!(a.straggles <= stormy.events, "{a:?}");
    assert!(a.straggles > 0 || a.resyncs > 0, "{a:?}");
    check_files(
        &r,
        &temp_dir("fig13"),
        "p_pct,events,straggler_aware_ms,wait_for_all_ms,ideal_ms,speedup,aware_degraded,\
         aware_results,aware_resyncs,wait_degraded,wait_results,verified",
        2,
    );
}

const RATE_HEADER: &str = "grads,window,blocks,results,degraded,lost,latency_mean_us,\
                           latency_p50_us,latency_p99_us,rate_mgps,elapsed_s,verified";

#[test]
fn fig15_every_size_aggregates_exactly() {
    let cfg = Fig15Config {
        sizes: vec![64, 1000],
        job: RateJob {
            workers: 4,
            blocks: 30,
            scan_timers: 10,
            ..Fig15Config::default().job
        },
    };
    // The scan timers run on the system clock with the figure's 250 ms block timeout: a
    // worker or PPE thread held up that long on a busy machine leaves a block partial. So
    // `verified` is what must hold on any machine: every chunk settled, every complete
    // Result with exactly every worker's sums, every partial one with exactly the sums of
    // as many sources as it says (`degraded` and `lost` count them, the machine's figure).
    let r = experiments::fig15(&cfg).unwrap();
    assert!(r.verified, "{r:#?}");
    let sizes: Vec<u16> = r.rows.iter().map(|p| p.grads).collect();
    assert_eq!(sizes, [64, 1000]);
    for p in &r.rows {
        assert!(p.verified);
        assert_eq!((p.window, p.blocks, p.results + p.lost), (1, 30, 120));
        assert!(p.degraded <= p.results, "{p:?}");
        assert!(p.latency_mean_us > 0.0 && p.rate_mgps > 0.0);
        assert!(p.latency_p50_us <= p.latency_p99_us);
    }
    check_files(&r, &temp_dir("fig15"), RATE_HEADER, 2);

    // The shortest scan period makes the block timeout 2 ms, which a debug build on a busy
    // machine outlives often: whatever the partial Results, each must hold its sources'
    // exact sums, and every chunk must settle.
    let short = Fig15Config {
        sizes: vec![64],
        job: RateJob {
            scan_period_ns: 10_000,
            ..cfg.job.clone()
        },
    };
    let r = experiments::fig15(&short).unwrap();
    assert!(r.verified, "{r:#?}");
    let p = &r.rows[0];
    assert_eq!(p.results + p.lost, 120, "{p:?}");
    assert!(p.degraded <= p.results, "{p:?}");
}

#[test]
fn fig16_every_window_aggregates_exactly_without_timers_too() {
    let cfg = Fig16Config {
        windows: vec![1, 8],
        grads: 256,
        job: RateJob {
            workers: 3,
            blocks: 24,
            timers: false,
            ..Fig16Config::default().job
        },
    };
    let r = experiments::fig16(&cfg).unwrap();
    assert!(r.verified, "{r:#?}");
    let windows: Vec<usize> = r.rows.iter().map(|p| p.window).collect();
    assert_eq!(windows, [1, 8]);
    // No timers, so no block is ever given up on: every Result is complete and exact.
    assert!(r
        .rows
        .iter()
        .all(|p| (p.results, p.degraded, p.lost) == (72, 0, 0) && p.verified));
    assert!(windows.contains(&r.best_window));
    check_files(&r, &temp_dir("fig16"), RATE_HEADER, 2);
}

fn option_of(e: ExperimentError) -> &'static str {
    match e {
        ExperimentError::Option { option, .. } => option,
        other => panic!("not an option error: {other}"),
    }
}

#[test]
fn bad_options_are_refused_by_name_before_anything_runs() {
    let e = experiments::fig14(&Fig14Config {
        timeouts_ms: vec![5, 0],
        ..Fig14Config::default()
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--timeouts");
    let e = experiments::fig14(&Fig14Config {
        workers: 1,
        ..Fig14Config::default()
    })
    .unwrap_err();
    assert_eq!(
        option_of(e),
        "--workers",
        "fig14 needs a straggler and a sender"
    );
    let e = experiments::fig13(&Fig13Config {
        model_gradients: 2048 * 256 + 1,
        ..Fig13Config::default()
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--model-gradients");
    let e = experiments::fig13(&Fig13Config {
        probabilities_pct: vec![f64::NAN],
        ..Fig13Config::default()
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--probabilities");
    let e = experiments::fig13(&Fig13Config {
        scan_period_ns: 0,
        ..Fig13Config::default()
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--scan-period-ms");
    let e = experiments::fig15(&Fig15Config {
        sizes: vec![64, 4096],
        ..Fig15Config::default()
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--sizes");
    let e = experiments::fig16(&Fig16Config {
        windows: vec![2048],
        ..Fig16Config::default()
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--windows");
    let e = experiments::fig16(&Fig16Config {
        windows: vec![64],
        job: RateJob {
            blocks: 10,
            ..Fig16Config::default().job
        },
        ..Fig16Config::default()
    })
    .unwrap_err();
    assert_eq!(option_of(e), "--blocks");
    let msg = experiments::fig16(&Fig16Config {
        windows: vec![],
        ..Fig16Config::default()
    })
    .unwrap_err()
    .to_string();
    assert!(msg.starts_with("invalid option `--windows`"), "{msg}");
}

fn pfemu(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_cli_writes_the_files_and_prints_one_json_object() {
    let dir = temp_dir("cli");
    let out = pfemu(&[
        "experiment",
        "fig14",
        "--timeouts",
        "2",
        "--blocks",
        "2",
        "--timers",
        "10",
        "--virtual-time",
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
    assert_eq!(v["experiment"], "fig14");
    assert_eq!(v["verified"], true);
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    assert!(v["all_p50_within"].is_boolean());
    assert!(dir.join("fig14.csv").exists() && dir.join("fig14.svg").exists());
    std::fs::remove_dir_all(&dir).unwrap();

    // An option that does not apply, and one out of range: exit status 2, named.
    let out = pfemu(&["experiment", "fig13", "--timeouts", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`--timeouts`") && err.contains("fig14"),
        "{err}"
    );
    let out = pfemu(&["experiment", "fig16", "--windows", "1,5000"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`--windows`"));
    let out = pfemu(&["experiment", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for name in ["fig13", "fig14", "fig15", "fig16", "Examples"] {
        assert!(help.contains(name), "{name} in --help");
    }
}
