//! The RFC 2544 throughput search and the latency sweep against simulated devices: a device
//! that carries at most `C` frames per second and drops the rest (deterministic, no sleeping:
//! a trial's counts are computed, not timed). Nothing here asserts on timing.

#![cfg(feature = "lab")]

use std::path::PathBuf;
use std::time::Duration;

use pfemu::lab::bench::linerate::{
    default_loads, latency_sweep, line_rate_pps, search, search_size, Device, DeviceError,
    InitialRate, LatencyReport, LatencySummary, LinerateConfig, LinerateError, LinerateReport,
    Progress, Trial, RFC2544_SIZES,
};

/// Carries at most `capacity_pps` (as a function of the frame size) and drops the rest; loses
/// `background_loss` of what it carries besides; can offer at most `generator_pps`. Reports a
/// latency that grows with the offered rate when `latency` is set.
struct Sim {
    capacity_pps: Box<dyn Fn(usize) -> f64>,
    background_loss: f64,
    generator_pps: f64,
    latency: bool,
    calls: Vec<(usize, f64, Duration)>,
}

impl Sim {
    fn new(capacity: impl Fn(usize) -> f64 + 'static) -> Self {
        Sim {
            capacity_pps: Box::new(capacity),
            background_loss: 0.0,
            generator_pps: f64::INFINITY,
            latency: false,
            calls: Vec::new(),
        }
    }

    /// A fixed capacity, the same for every frame size.
    fn capped(pps: f64) -> Self {
        Sim::new(move |_| pps)
    }
}

impl Device for Sim {
    fn trial(&mut self, size: usize, pps: f64, d: Duration) -> Result<Trial, DeviceError> {
        self.calls.push((size, pps, d));
        let secs = d.as_secs_f64();
        let offered = (pps.min(self.generator_pps) * secs).round() as u64;
        let cap = ((self.capacity_pps)(size) * secs).floor() as u64;
        let carried = offered.min(cap);
        let received = carried - (carried as f64 * self.background_loss).ceil() as u64;
        let latency = self.latency.then(|| {
            // Grows with the offered rate relative to the capacity, and jumps past it.
            let load = pps / (self.capacity_pps)(size);
            let p50 = 1_000 + (4_000.0 * load * load) as u64;
            let over = if load > 1.0 { 100_000 } else { 0 };
            LatencySummary {
                count: received,
                p50_ns: p50 + over,
                p99_ns: 2 * p50 + over,
                p999_ns: 3 * p50 + over,
                max_ns: 5 * p50 + over,
                mean_ns: (p50 + over) as f64 * 1.1,
            }
        });
        Ok(Trial {
            offered,
            received,
            latency,
        })
    }
}

fn cfg(sizes: &[usize]) -> LinerateConfig {
    LinerateConfig {
        sizes: sizes.to_vec(),
        ..LinerateConfig::default()
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pfemu-linerate-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One frame per trial, in frames per second: the rounding of the simulated counts.
fn frame_slack(c: &LinerateConfig) -> f64 {
    1.0 / c.trial_duration.as_secs_f64()
}

#[test]
fn the_search_finds_the_capacity_within_the_resolution() {
    for policy in [InitialRate::Measured, InitialRate::Bisect] {
        for gbps in [1.0, 10.0, 100.0] {
            for &size in &[64, 512, 1518] {
                for frac in [0.013, 0.37, 0.5, 0.81, 0.999] {
                    let c = LinerateConfig {
                        line_rate_gbps: gbps,
                        initial_rate: policy,
                        max_trials_per_size: 16,
                        ..cfg(&[size])
                    };
                    let line = line_rate_pps(gbps, size);
                    let cap = frac * line;
                    let mut dev = Sim::capped(cap);
                    let row = search_size(&mut dev, &c, size, &mut |_| {}).unwrap();
                    let ctx = format!("{policy:?} {gbps} Gb/s {size} B at {frac}: {row:#?}");
                    assert!(row.resolved, "{ctx}");
                    assert!(row.throughput_pps <= cap + frame_slack(&c), "{ctx}");
                    assert!(
                        row.throughput_pps >= cap - c.resolution * line - frame_slack(&c),
                        "{ctx}"
                    );
                    let failed = row.lowest_failed_pps.unwrap();
                    assert!(failed - row.throughput_pps <= c.resolution * line * 1.000001);
                    assert_eq!(row.loss_at_result, Some(0.0), "{ctx}");
                    assert_eq!(
                        row.trials[0].rate_pps, line,
                        "the first trial is at line rate"
                    );
                    assert!(dev
                        .calls
                        .iter()
                        .all(|&(s, _, d)| s == size && d == c.trial_duration));
                    assert_eq!(dev.calls.len(), row.trials.len());
                }
            }
        }
    }
}

#[test]
fn a_capacity_above_line_rate_gives_line_rate_in_one_trial() {
    let c = cfg(&RFC2544_SIZES);
    let mut dev = Sim::capped(1e12);
    let report = search(&mut dev, &c, |_| {}).unwrap();
    assert_eq!(report.rows.len(), RFC2544_SIZES.len());
    for row in &report.rows {
        assert_eq!(row.trials.len(), 1);
        assert_eq!(row.throughput_pps, row.line_rate_pps);
        assert!((row.percent_of_line_rate - 100.0).abs() < 1e-9);
        assert!((row.gbps_l1 - 10.0).abs() < 1e-9);
        assert!(row.gbps_l2 < row.gbps_l1);
        assert!(row.resolved);
        assert_eq!(row.lowest_failed_pps, None);
        assert_eq!(row.loss_at_result, Some(0.0));
    }
    assert_eq!(report.rows[0].frame_size, 64);
    assert_eq!(report.rows[0].mpps.mul_add(1e6, 0.0).round(), 14_880_952.0);
}

#[test]
fn a_tiny_capacity_is_found_by_the_measured_policy_and_bisection_reports_zero() {
    let c = cfg(&[64]);
    let mut dev = Sim::capped(1_000.0);
    let row = search_size(&mut dev, &c, 64, &mut |_| {}).unwrap();
    assert!(row.resolved, "{row:#?}");
    assert!(row.throughput_pps <= 1_000.0 + frame_slack(&c));
    assert!(row.throughput_pps > 0.0);

    // Bisection halves 14.88 Mpps eight times at most: 58 kpps is still far above 1 kpps,
    // so nothing passed and the throughput is 0, unresolved.
    let c = LinerateConfig {
        initial_rate: InitialRate::Bisect,
        ..c
    };
    let row = search_size(&mut Sim::capped(1_000.0), &c, 64, &mut |_| {}).unwrap();
    assert_eq!(row.trials.len(), c.max_trials_per_size as usize);
    assert!(!row.resolved);
    assert_eq!(row.throughput_pps, 0.0);
    assert_eq!(row.mpps, 0.0);
    assert_eq!(row.loss_at_result, None);
    assert_eq!(row.latency, None);
    let lowest = row
        .trials
        .iter()
        .map(|t| t.rate_pps)
        .fold(f64::MAX, f64::min);
    assert_eq!(row.lowest_failed_pps, Some(lowest));
    assert!(row.trials.iter().all(|t| !t.pass));

    // A device that carries nothing: 0 under either policy.
    for policy in [InitialRate::Measured, InitialRate::Bisect] {
        let c = LinerateConfig {
            initial_rate: policy,
            ..cfg(&[1518])
        };
        let row = search_size(&mut Sim::capped(0.0), &c, 1518, &mut |_| {}).unwrap();
        assert_eq!(row.throughput_pps, 0.0, "{policy:?}");
        assert!(row.trials.len() <= c.max_trials_per_size as usize);
    }
}

#[test]
fn a_loss_tolerance_accepts_a_rate_whose_loss_is_within_it() {
    // Loses 0.05% of everything, at any rate.
    let mut dev = Sim::capped(1e12);
    dev.background_loss = 0.0005;
    let strict = cfg(&[64]);
    let row = search_size(&mut dev, &strict, 64, &mut |_| {}).unwrap();
    assert_eq!(row.throughput_pps, 0.0, "zero loss never happens: {row:#?}");
    let tolerant = LinerateConfig {
        loss_tolerance: 0.001,
        ..strict
    };
    let row = search_size(&mut dev, &tolerant, 64, &mut |_| {}).unwrap();
    assert_eq!(row.trials.len(), 1);
    assert_eq!(row.throughput_pps, row.line_rate_pps);
    let loss = row.loss_at_result.unwrap();
    assert!(loss > 0.0 && loss <= 0.001, "{loss}");

    // A drop-tail device at C with 2% tolerance passes up to C / 0.98.
    let line = line_rate_pps(10.0, 256);
    let cap = 0.6 * line;
    for policy in [InitialRate::Measured, InitialRate::Bisect] {
        let c = LinerateConfig {
            loss_tolerance: 0.02,
            initial_rate: policy,
            max_trials_per_size: 16,
            ..cfg(&[256])
        };
        let row = search_size(&mut Sim::capped(cap), &c, 256, &mut |_| {}).unwrap();
        let best = cap / 0.98;
        assert!(row.resolved, "{policy:?}: {row:#?}");
        assert!(row.throughput_pps > cap, "{policy:?}: {row:#?}");
        assert!(row.throughput_pps <= best + frame_slack(&c));
        assert!(row.throughput_pps >= best - c.resolution * line - frame_slack(&c));
        let loss = row.loss_at_result.unwrap();
        assert!(loss > 0.0 && loss <= 0.02, "{loss}");
    }
}

#[test]
fn a_rate_the_device_cannot_be_offered_does_not_pass() {
    // The generator (or the device's input) tops out at 2 Mpps: nothing is lost, but the
    // rates above 2 Mpps were not sustained.
    let mut dev = Sim::capped(1e12);
    dev.generator_pps = 2e6;
    let c = cfg(&[64]);
    let row = search_size(&mut dev, &c, 64, &mut |_| {}).unwrap();
    assert!(row.resolved);
    assert!(row.throughput_pps <= 2e6 + frame_slack(&c), "{row:#?}");
    assert!(row.throughput_pps >= 2e6 - c.resolution * row.line_rate_pps);
    assert!(!row.trials[0].pass && row.trials[0].loss == 0.0);
}

#[test]
fn the_trial_count_is_bounded_and_every_trial_is_reported() {
    for max in [1, 2, 5, 8] {
        for policy in [InitialRate::Measured, InitialRate::Bisect] {
            let c = LinerateConfig {
                max_trials_per_size: max,
                initial_rate: policy,
                ..cfg(&RFC2544_SIZES)
            };
            // A capacity awkward for both policies: a different fraction per size.
            let mut dev = Sim::new(|size| line_rate_pps(10.0, size) * (size % 97) as f64 / 97.0);
            let (mut trials, mut done) = (0, 0);
            let report = search(&mut dev, &c, |p| match p {
                Progress::Trial { index, .. } => {
                    trials += 1;
                    assert!(index >= 1 && index <= max);
                }
                Progress::SizeDone(_) => done += 1,
            })
            .unwrap();
            assert_eq!(done, RFC2544_SIZES.len());
            let total: usize = report.rows.iter().map(|r| r.trials.len()).sum();
            assert_eq!(trials, total);
            assert_eq!(dev.calls.len(), total);
            for row in &report.rows {
                assert!(
                    row.trials.len() <= max as usize,
                    "{policy:?} {max}: {row:#?}"
                );
            }
        }
    }
    // With the defaults, the measured policy resolves a drop-tail device in 3 trials.
    let mut dev = Sim::new(|size| line_rate_pps(10.0, size) * 0.42);
    let report = search(&mut dev, &LinerateConfig::default(), |_| {}).unwrap();
    for row in &report.rows {
        assert!(row.resolved && row.trials.len() <= 3, "{row:#?}");
    }
}

#[test]
fn a_noisy_device_gets_a_rate_that_passed_near_its_capacity() {
    // The capacity jitters by up to +-2% from trial to trial, deterministically.
    let line = line_rate_pps(10.0, 128);
    let nominal = 0.55 * line;
    let counter = std::cell::Cell::new(0u64);
    let mut dev = Sim::new(move |_| {
        let n = counter.get();
        counter.set(n + 1);
        let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
        let u = h as f64 / (1u64 << 53) as f64; // [0, 1)
        nominal * (1.0 + 0.04 * (u - 0.5))
    });
    for policy in [InitialRate::Measured, InitialRate::Bisect] {
        let c = LinerateConfig {
            initial_rate: policy,
            ..cfg(&[128, 128, 128])
        };
        let report = search(&mut dev, &c, |_| {}).unwrap();
        for row in &report.rows {
            let ctx = format!("{policy:?}: {row:#?}");
            assert!(row.trials.len() <= c.max_trials_per_size as usize, "{ctx}");
            let at = row
                .trials
                .iter()
                .find(|t| t.rate_pps == row.throughput_pps)
                .expect("the throughput is a rate that was tried");
            assert!(at.pass && at.loss == 0.0, "{ctx}");
            assert!(
                row.throughput_pps <= nominal * 1.02 + frame_slack(&c),
                "{ctx}"
            );
            assert!(
                row.throughput_pps >= nominal * 0.98 - 2.0 * c.resolution * line,
                "{ctx}"
            );
        }
    }
}

#[test]
fn the_report_writes_a_csv_per_size_and_per_trial_and_an_svg() {
    let c = cfg(&RFC2544_SIZES);
    let mut dev = Sim::new(|size| (line_rate_pps(10.0, size) * 1.001).min(4e6));
    dev.latency = true;
    let report = search(&mut dev, &c, |_| {}).unwrap();
    let dir = temp_dir("report");
    let written = report.write_files(&dir).unwrap();
    assert_eq!(written.csv, dir.join("linerate.csv"));

    let csv = std::fs::read_to_string(&written.csv).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    let header = LinerateReport::csv_header().join(",");
    assert_eq!(lines[0], header);
    assert!(header.starts_with("frame_size,line_rate_mpps,mpps,gbps_l1,gbps_l2"));
    assert_eq!(lines.len(), 1 + RFC2544_SIZES.len(), "{csv}");
    let columns = header.split(',').count();
    for (line, size) in lines[1..].iter().zip(RFC2544_SIZES) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), columns, "{line}");
        assert_eq!(cells[0], size.to_string());
    }
    // 64 B frames: 4 Mpps of 14.88.
    let first: Vec<&str> = lines[1].split(',').collect();
    let mpps: f64 = first[2].parse().unwrap();
    assert!(mpps <= 4.0 && mpps > 3.9, "{mpps}");
    // Large frames: line rate.
    assert!(lines[7].contains(",100.000,"), "{}", lines[7]);

    let trials = std::fs::read_to_string(written.trials_csv.as_ref().unwrap()).unwrap();
    let total: usize = report.rows.iter().map(|r| r.trials.len()).sum();
    assert_eq!(trials.lines().count(), 1 + total);
    assert_eq!(
        trials.lines().next().unwrap(),
        LinerateReport::trials_csv_header().join(",")
    );

    let svg = std::fs::read_to_string(&written.svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
    assert!(svg.contains("line rate"));

    let table = report.table();
    assert!(
        table.contains("1518") && table.contains("100.00%"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 2 + RFC2544_SIZES.len(), "{table}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unresolved_size_is_marked_in_the_table() {
    let c = LinerateConfig {
        max_trials_per_size: 2,
        initial_rate: InitialRate::Bisect,
        ..cfg(&[64])
    };
    let report = search(&mut Sim::capped(1e6), &c, |_| {}).unwrap();
    assert!(!report.rows[0].resolved);
    assert!(report.table().contains("ran out of trials"));
}

#[test]
fn the_report_json_has_the_documented_fields() {
    let mut dev = Sim::capped(3e6);
    dev.latency = true;
    let report = search(&mut dev, &cfg(&[64, 1518]), |_| {}).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&serde_json::to_string_pretty(&report).unwrap()).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    // The documented keys, as a list of words.
    let sorted = |k: &str| {
        let mut k: Vec<String> = k.split_whitespace().map(str::to_string).collect();
        k.sort();
        k
    };
    assert_eq!(keys(&v), sorted("config rows"));
    assert_eq!(
        keys(&v["config"]),
        sorted(
            "sizes loss_tolerance offered_tolerance trial_duration_s resolution \
             line_rate_gbps max_trials_per_size initial_rate"
        )
    );
    assert_eq!(v["config"]["trial_duration_s"], 0.5);
    assert_eq!(v["config"]["initial_rate"], "measured");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        keys(&rows[0]),
        sorted(
            "frame_size line_rate_pps throughput_pps mpps gbps_l1 gbps_l2 \
             percent_of_line_rate resolved lowest_failed_pps loss_at_result latency trials"
        )
    );
    assert_eq!(rows[0]["frame_size"], 64);
    assert_eq!(
        keys(&rows[0]["latency"]),
        sorted("count p50_ns p99_ns p999_ns max_ns mean_ns")
    );
    assert_eq!(
        keys(&rows[0]["trials"][0]),
        sorted("rate_pps expected offered received loss achieved_pps pass latency")
    );
    // 1518 B at 10 GbE is 0.81 Mpps, below the capacity: line rate, nothing failed.
    assert!(rows[1]["lowest_failed_pps"].is_null());
    assert_eq!(rows[1]["trials"].as_array().unwrap().len(), 1);
}

#[test]
fn latency_grows_with_load_in_the_sweep() {
    let cap = 5e6;
    let mut dev = Sim::capped(cap);
    dev.latency = true;
    let mut loads = default_loads();
    assert_eq!(loads.len(), 10);
    loads.push(1.2); // past the capacity: loss, and a latency jump
    let report = latency_sweep(&mut dev, 64, &loads, cap, Duration::from_millis(250)).unwrap();
    assert_eq!(report.rows.len(), loads.len());
    for w in report.rows.windows(2) {
        let (a, b) = (w[0].latency.unwrap(), w[1].latency.unwrap());
        assert!(w[0].offered_pps < w[1].offered_pps);
        assert!(a.p50_ns <= b.p50_ns && a.p99_ns <= b.p99_ns && a.p999_ns <= b.p999_ns);
        assert!(a.max_ns <= b.max_ns);
    }
    for r in &report.rows[..10] {
        assert_eq!(r.loss, 0.0);
        assert!((r.achieved_pps - r.offered_pps).abs() <= 4.0);
    }
    let over = report.rows[10];
    assert!(over.loss > 0.15 && over.achieved_pps <= cap);
    assert_eq!(
        dev.calls.iter().map(|c| c.1).collect::<Vec<_>>(),
        loads.iter().map(|l| l * cap).collect::<Vec<_>>()
    );

    let dir = temp_dir("latency");
    let written = report.write_files(&dir).unwrap();
    assert_eq!(written.csv, dir.join("latency_64.csv"));
    let csv = std::fs::read_to_string(&written.csv).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], LatencyReport::csv_header().join(","));
    assert!(lines[0].contains("p50_ns") && lines[0].contains("p999_ns"));
    assert_eq!(lines.len(), 1 + loads.len());
    let svg = std::fs::read_to_string(&written.svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("p99"));
    assert_eq!(report.table().lines().count(), 2 + loads.len());
    let v = serde_json::to_value(&report).unwrap();
    assert!(v["rows"][0]["latency"]["p99_ns"].is_u64());
    std::fs::remove_dir_all(&dir).unwrap();

    // A device without latencies: empty cells, and a chart without points.
    let report = latency_sweep(
        &mut Sim::capped(cap),
        64,
        &[0.5, 1.0],
        cap,
        Duration::from_millis(100),
    )
    .unwrap();
    assert!(report.rows.iter().all(|r| r.latency.is_none()));
    assert!(report.csv_rows()[0].last().unwrap().is_empty());
    let dir = temp_dir("latency-none");
    report.write_files(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

fn refused(c: LinerateConfig) -> &'static str {
    let e = c.validate().unwrap_err();
    assert!(!e.reason.is_empty());
    match search(&mut Sim::capped(1e6), &c, |_| {}) {
        Err(LinerateError::Config(e2)) => assert_eq!(e2, e),
        other => panic!("search accepted a bad config: {other:?}"),
    }
    e.setting
}

#[test]
fn bad_settings_are_refused_by_name() {
    let d = LinerateConfig::default;
    assert_eq!(
        refused(LinerateConfig {
            sizes: vec![],
            ..d()
        }),
        "sizes"
    );
    assert_eq!(
        refused(LinerateConfig {
            sizes: vec![64, 63],
            ..d()
        }),
        "sizes"
    );
    assert_eq!(
        refused(LinerateConfig {
            sizes: vec![9217],
            ..d()
        }),
        "sizes"
    );
    for bad in [-0.1, 1.0, f64::NAN] {
        let c = LinerateConfig {
            loss_tolerance: bad,
            ..d()
        };
        assert_eq!(refused(c), "loss_tolerance");
        let c = LinerateConfig {
            offered_tolerance: bad,
            ..d()
        };
        assert_eq!(refused(c), "offered_tolerance");
    }
    for bad in [0.0, -10.0, f64::INFINITY, f64::NAN] {
        let c = LinerateConfig {
            line_rate_gbps: bad,
            ..d()
        };
        assert_eq!(refused(c), "line_rate_gbps");
    }
    for bad in [0.0, 1.5, f64::NAN] {
        let c = LinerateConfig {
            resolution: bad,
            ..d()
        };
        assert_eq!(refused(c), "resolution");
    }
    for bad in [0, 65] {
        let c = LinerateConfig {
            max_trials_per_size: bad,
            ..d()
        };
        assert_eq!(refused(c), "max_trials_per_size");
    }
    for bad in [
        Duration::ZERO,
        Duration::from_secs(601),
        Duration::from_micros(10),
    ] {
        let c = LinerateConfig {
            trial_duration: bad,
            ..d()
        };
        assert_eq!(refused(c), "trial_duration");
    }
    let e = LinerateConfig {
        resolution: 2.0,
        ..d()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("`resolution`"), "{e}");
    // Every standard line rate is fine with the defaults.
    for gbps in pfemu::lab::bench::linerate::STANDARD_LINE_RATES_GBPS {
        LinerateConfig {
            line_rate_gbps: gbps,
            ..d()
        }
        .validate()
        .unwrap();
    }
}

#[test]
fn bad_sweeps_are_refused_by_name() {
    let ms = Duration::from_millis(100);
    let setting = |r: Result<LatencyReport, LinerateError>| match r {
        Err(LinerateError::Config(e)) => e.setting,
        other => panic!("accepted: {other:?}"),
    };
    let mut dev = Sim::capped(1e6);
    assert_eq!(
        setting(latency_sweep(&mut dev, 32, &[0.5], 1e6, ms)),
        "frame_size"
    );
    assert_eq!(setting(latency_sweep(&mut dev, 64, &[], 1e6, ms)), "loads");
    assert_eq!(
        setting(latency_sweep(&mut dev, 64, &[0.5, 0.0], 1e6, ms)),
        "loads"
    );
    assert_eq!(
        setting(latency_sweep(&mut dev, 64, &[f64::NAN], 1e6, ms)),
        "loads"
    );
    assert_eq!(
        setting(latency_sweep(&mut dev, 64, &[0.5], -1.0, ms)),
        "reference_pps"
    );
    assert_eq!(
        setting(latency_sweep(&mut dev, 64, &[0.5], 1e6, Duration::ZERO)),
        "duration"
    );
    assert!(dev.calls.is_empty());
}

struct Broken;

impl Device for Broken {
    fn trial(&mut self, _: usize, _: f64, _: Duration) -> Result<Trial, DeviceError> {
        Err("the engine stopped".into())
    }
}

#[test]
fn a_device_error_names_the_trial() {
    let e = search(&mut Broken, &cfg(&[256]), |_| {}).unwrap_err();
    match &e {
        LinerateError::Device {
            frame_size,
            rate_pps,
            ..
        } => {
            assert_eq!(*frame_size, 256);
            assert_eq!(*rate_pps, line_rate_pps(10.0, 256));
        }
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("256 B") && text.contains("the engine stopped"),
        "{text}"
    );
    assert!(std::error::Error::source(&e).is_some());
    // Through a trait object too.
    let dev: &mut dyn Device = &mut Broken;
    assert!(latency_sweep(dev, 64, &[0.5], 1e6, Duration::from_millis(100)).is_err());
}

/// A device whose capacity drops after its first trial (a shared machine's slow phase):
/// the measured search follows what it carries instead of walking down from the line rate
/// by doubling steps, and finds the new capacity within the trial budget.
#[test]
fn a_capacity_that_drops_midway_is_followed() {
    use pfemu::lab::bench::linerate::{search, Device, DeviceError, LinerateConfig, Trial};
    use std::time::Duration;
    struct Dropping {
        trials: u32,
    }
    impl Device for Dropping {
        fn trial(&mut self, _: usize, pps: f64, d: Duration) -> Result<Trial, DeviceError> {
            self.trials += 1;
            // 99% of line rate for the first trial, then 55%.
            let cap = if self.trials == 1 {
                14_730_000.0
            } else {
                8_200_000.0
            };
            let secs = d.as_secs_f64();
            let offered = (pps * secs).round() as u64;
            let received = offered.min((cap * secs) as u64);
            Ok(Trial {
                offered,
                received,
                latency: None,
            })
        }
    }
    let cfg = LinerateConfig {
        sizes: vec![64],
        ..LinerateConfig::default()
    };
    let r = search(&mut Dropping { trials: 0 }, &cfg, |_| {}).unwrap();
    let row = &r.rows[0];
    assert!(
        row.throughput_pps > 8_200_000.0 * 0.99 && row.throughput_pps <= 8_200_000.0,
        "{row:?}"
    );
}
