//! The fabric experiments (`pfemu experiment fabric-latency`, `fabric-loss`) and
//! `pfemu bench fabric`, on short runs: what they measure, that the sweep does not depend on
//! its threads, that the zero-loss search finds the edge, and that bad options are refused
//! by name.

#![cfg(feature = "lab")]

use pfemu::lab::bench::experiments::{ExperimentError, Figure};
use pfemu::lab::bench::fabric::{
    fabric_bench, fabric_chassis, fabric_latency, fabric_loss, FabricBenchConfig,
    FabricChassisConfig, FabricLatencyConfig, FabricLossConfig, SwitchSettings,
};

fn quiet(_: usize, _: usize) {}

fn short(threads: usize) -> SwitchSettings {
    SwitchSettings {
        ports: 8,
        cycles: 4_000,
        warmup: 500,
        threads,
        ..SwitchSettings::default()
    }
}

#[test]
fn latency_sweep_measures_every_point_the_same_on_any_number_of_threads() {
    let cfg = |threads| FabricLatencyConfig {
        switch: short(threads),
        loads: vec![0.3, 0.8],
    };
    let one = fabric_latency(&cfg(1), &quiet).unwrap();
    let three = fabric_latency(&cfg(3), &quiet).unwrap();
    // 3 traffic models x 2 rates x 12 architectures.
    assert_eq!(one.rows.len(), 72);
    assert!(one.verified && three.verified);
    for (a, b) in one.rows.iter().zip(&three.rows) {
        assert_eq!(
            (a.traffic, &a.architecture, &a.report),
            (b.traffic, &b.architecture, &b.report)
        );
    }
    for r in &one.rows {
        assert!(r.report.counters.conserved(), "{r:?}");
        assert_eq!(r.report.dropped, 0, "infinite FIFOs never drop: {r:?}");
        assert!(r.report.measured > 0, "{r:?}");
    }
    // CPRR and the OQ crossbar see the same arrivals and have the same mean (§5.5).
    for cprr in one.rows.iter().filter(|r| r.architecture == "CPRR") {
        let oq = one
            .rows
            .iter()
            .find(|r| {
                r.architecture == "OQ-xbar"
                    && r.traffic == cprr.traffic
                    && r.report.load == cprr.report.load
            })
            .unwrap();
        assert_eq!(cprr.report.measured, oq.report.measured);
        assert_eq!(cprr.report.mean_latency, oq.report.mean_latency);
    }
    // Every traffic model has its two claims, read at the top rate.
    assert_eq!(one.key.len(), 6, "{:?}", one.key);
    assert!(one.key[0].what.contains("r = 0.8"), "{:?}", one.key[0]);
    assert_eq!(one.csv_rows().len(), 72);
    assert!(
        one.table().contains("equation 7, up to r = 0.8"),
        "{}",
        one.table()
    );
    assert!(one.md1_deviation.is_some());
}

/// A point that delivers no measured cell has no latency: `-` in the table, null in JSON,
/// not a mean of 0.0 cycles that reads like a perfect switch. (One cycle at r = 0.01 on 4
/// ports: with this seed no traffic model brings a cell.)
#[test]
fn a_point_with_nothing_delivered_has_no_latency() {
    let r = fabric_latency(
        &FabricLatencyConfig {
            switch: SwitchSettings {
                ports: 4,
                cycles: 1,
                warmup: 0,
                ..short(1)
            },
            loads: vec![0.01],
        },
        &quiet,
    )
    .unwrap();
    for x in &r.rows {
        let p = &x.report;
        assert_eq!(p.delivered, 0, "{x:?}");
        assert_eq!(
            (p.mean_latency, p.avg_worst_latency, p.max_latency),
            (None, None, None)
        );
        let json = serde_json::to_value(x).unwrap();
        assert!(
            json["mean_latency"].is_null() && json["max_latency"].is_null(),
            "{json}"
        );
        // One key per field: the row's traffic name beside the run's traffic model.
        let text = serde_json::to_string(x).unwrap();
        assert_eq!(text.matches("\"traffic\":").count(), 1, "{text}");
        assert_eq!(json["traffic_name"], x.traffic, "{json}");
    }
    let table = r.table();
    let values: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("0.01"))
        .flat_map(|l| l.split_whitespace().skip(1))
        .collect();
    assert_eq!(values.len(), 36, "{table}");
    assert!(values.iter().all(|v| *v == "-"), "{table}");
}

/// Likewise a loss point that measured no cell has no loss ratio: an empty CSV field and
/// null in JSON, not 0.0% that reads like a switch that lost nothing; the claims say why.
/// (The cycle and seed of the test above: no traffic model brings a cell.)
#[test]
fn a_loss_point_with_nothing_measured_has_no_loss_ratio() {
    let r = fabric_loss(
        &FabricLossConfig {
            switch: SwitchSettings {
                ports: 4,
                cycles: 1,
                warmup: 0,
                ..short(1)
            },
            loads: vec![0.01],
            depths: vec![1],
            near_one: 0.01,
            max_depth: 2,
        },
        &quiet,
    )
    .unwrap();
    assert_eq!(r.rows.len(), 6);
    for x in &r.rows {
        assert_eq!((x.report.measured, x.report.loss_ratio), (0, None), "{x:?}");
        assert!(serde_json::to_value(x).unwrap()["loss_ratio"].is_null());
    }
    let col = r
        .csv_header()
        .iter()
        .position(|h| *h == "loss_ratio")
        .expect("a loss column");
    assert!(r.csv_rows().iter().all(|row| row[col].is_empty()));
    let claim = r
        .key
        .iter()
        .find(|c| c.what.contains("loss at depth 1"))
        .expect("the depth-1 claim");
    assert_eq!(
        claim.measured,
        "CPRR no cell measured, PIM no cell measured"
    );
}

/// Figure 9's claim is over the rates up to 0.9: a sweep with none says nothing of it
/// (absent in the report, no line in the table), rather than "within 0.0%".
#[test]
fn figure_9_is_claimed_only_over_rates_up_to_0_9() {
    let r = fabric_latency(
        &FabricLatencyConfig {
            switch: SwitchSettings {
                ports: 4,
                cycles: 500,
                warmup: 50,
                ..short(2)
            },
            loads: vec![0.95, 0.99],
        },
        &quiet,
    )
    .unwrap();
    assert_eq!(r.md1_deviation, None);
    assert!(!r.table().contains("Figure 9"), "{}", r.table());
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["md1_deviation"].is_null());
}

/// Above an architecture's saturation its infinite queues grow every cycle: a point whose
/// backlog passes `--max-backlog` stops there, holding no more than the bound and one
/// cycle's arrivals, and is reported saturated, with no latency (null in JSON, empty in
/// CSV, "saturated" in the table) rather than a number that looks like one.
#[test]
fn a_saturated_point_stops_at_its_backlog_bound_and_says_so() {
    let bound = 2_000;
    let cfg = FabricLatencyConfig {
        switch: SwitchSettings {
            max_backlog: bound,
            ..short(2)
        },
        loads: vec![0.2, 0.99],
    };
    let r = fabric_latency(&cfg, &quiet).unwrap();
    assert!(r.verified);
    let saturated: Vec<_> = r
        .rows
        .iter()
        .filter(|x| x.report.saturated_at.is_some())
        .collect();
    // RRM-1 and PIM-1 carry about 0.3 and 0.65 of an 8-port switch's line: at 0.99 their
    // queues grow by 3 cells a cycle and more, past 2,000 within the run's 4,500 cycles.
    for arch in ["PIM-1", "RRM-1"] {
        assert!(
            saturated
                .iter()
                .any(|x| x.architecture == arch && x.traffic == "uniform"),
            "{arch} at 0.99 is not saturated"
        );
    }
    for x in &saturated {
        assert_eq!(x.report.load, 0.99, "{x:?}");
        let queued = x.report.counters.queued;
        assert!(queued > bound && queued <= bound + 8, "{x:?}");
        assert_eq!((x.report.mean_latency, x.report.max_latency), (None, None));
        // The measured cells it stopped with are reported as such, so the row adds up.
        assert!(x.report.unfinished > 0 && x.report.accounted(), "{x:?}");
        let json = serde_json::to_value(x).unwrap();
        assert_eq!(json["unfinished"], x.report.unfinished, "{json}");
        assert!(json["mean_latency"].is_null() && json["avg_worst_latency"].is_null());
    }
    // Under uniform traffic CPRR carries 0.99 with a short queue and reports its latency.
    for x in r
        .rows
        .iter()
        .filter(|x| x.architecture == "CPRR" && x.traffic == "uniform")
    {
        assert!(x.report.saturated_at.is_none() && x.report.mean_latency.is_some());
    }
    let table = r.table();
    assert!(table.contains("saturated"), "{table}");
    let csv = r.csv_rows();
    let header = r.csv_header();
    let col = |name| header.iter().position(|h| *h == name).unwrap();
    let rrm = csv
        .iter()
        .find(|row| row[0] == "uniform" && row[1] == "RRM-1" && row[2] == "0.99")
        .unwrap();
    assert_eq!(
        (&rrm[col("mean_latency")][..], &rrm[col("saturated")][..]),
        ("", "true")
    );
    // A CSV reader sees every measured cell accounted for, as the JSON has it: the
    // saturated row's cells still queued are in `unfinished`.
    assert_eq!(
        header,
        [
            "traffic",
            "architecture",
            "load",
            "mean_latency",
            "avg_worst_latency",
            "max_latency",
            "throughput",
            "measured",
            "delivered",
            "dropped",
            "stranded",
            "unfinished",
            "saturated",
            "md1_eq7",
        ]
    );
    for row in &csv {
        let count = |name| row[col(name)].parse::<u64>().unwrap();
        assert_eq!(
            count("measured"),
            count("delivered") + count("dropped") + count("stranded") + count("unfinished"),
            "{row:?}"
        );
    }
    let unfinished: u64 = rrm[col("unfinished")].parse().unwrap();
    assert!(unfinished > 0, "{rrm:?}");
}

#[test]
fn loss_search_finds_the_smallest_depth_without_loss() {
    let cfg = FabricLossConfig {
        switch: short(2),
        loads: vec![0.9],
        depths: vec![1, 2, 4, 8],
        near_one: 0.95,
        max_depth: 64,
    };
    let r = fabric_loss(&cfg, &quiet).unwrap();
    assert!(r.verified);
    // 3 traffic models x 2 architectures x 1 rate x 4 depths.
    assert_eq!(r.rows.len(), 24);
    assert_eq!(r.zero_loss.len(), 6);
    let found = r.zero_loss.iter().filter(|z| z.depth.is_some()).count();
    assert!(
        found >= 3,
        "the search found too few edges to check: {:?}",
        r.zero_loss
    );
    for z in &r.zero_loss {
        let Some(d) = z.depth else { continue };
        // The edge, checked by running its two sides at the same rate and seed.
        let sides: Vec<usize> = if d > 1 { vec![d - 1, d] } else { vec![d] };
        let check = fabric_loss(
            &FabricLossConfig {
                loads: vec![cfg.near_one],
                depths: sides.clone(),
                ..cfg.clone()
            },
            &quiet,
        )
        .unwrap();
        // Cells lost in the whole run, warm-up included, or stranded: the search's measure.
        let loss = |depth: usize| {
            let r = &check
                .rows
                .iter()
                .find(|x| {
                    x.traffic == z.traffic && x.architecture == z.architecture && x.depth == depth
                })
                .unwrap()
                .report;
            r.counters.dropped_total() + r.stranded
        };
        assert_eq!(loss(d), 0, "{z:?}");
        if d > 1 {
            assert!(
                loss(d - 1) > 0,
                "{z:?}: depth {} loses nothing either",
                d - 1
            );
        }
    }
    // Depth 1 loses at 0.95 in every model, and at 0.9 the loss falls with the depth: it
    // never grows from one depth to the next, and the deepest loses less than depth 1.
    for z in &r.zero_loss {
        assert!(z.loss_at_depth_1.is_some_and(|l| l > 0.0), "{z:?}");
        let by_depth: Vec<f64> = r
            .rows
            .iter()
            .filter(|x| x.traffic == z.traffic && x.architecture == z.architecture)
            .map(|x| {
                x.report
                    .loss_ratio
                    .expect("finite FIFOs do not saturate here")
            })
            .collect();
        assert_eq!(by_depth.len(), cfg.depths.len());
        assert!(
            by_depth.windows(2).all(|w| w[1] <= w[0]),
            "{} {}: {by_depth:?}",
            z.traffic,
            z.architecture
        );
        assert!(by_depth[by_depth.len() - 1] < by_depth[0], "{by_depth:?}");
    }
    assert_eq!(r.key.len(), 4, "{:?}", r.key);
}

/// A depth counts as without loss only if its run drops nothing at all: with a short window
/// after a long warm-up, the window's few cells often get through at a depth whose warm-up
/// still drops (or leaves cells stranded), and such a depth is not the answer.
#[test]
fn the_zero_loss_depth_drops_nothing_in_the_warm_up_either() {
    let cfg = FabricLossConfig {
        switch: SwitchSettings {
            cycles: 50,
            warmup: 2_000,
            ..short(2)
        },
        loads: vec![0.95],
        depths: vec![1],
        near_one: 0.95,
        max_depth: 64,
    };
    let r = fabric_loss(&cfg, &quiet).unwrap();
    let found: Vec<_> = r
        .zero_loss
        .iter()
        .filter_map(|z| Some((z, z.depth?)))
        .collect();
    assert!(found.len() >= 3, "{:?}", r.zero_loss);
    for (z, d) in found {
        let check = fabric_loss(
            &FabricLossConfig {
                depths: vec![d],
                ..cfg.clone()
            },
            &quiet,
        )
        .unwrap();
        let run = &check
            .rows
            .iter()
            .find(|x| x.traffic == z.traffic && x.architecture == z.architecture)
            .unwrap()
            .report;
        assert_eq!(
            (run.counters.dropped_total(), run.stranded),
            (0, 0),
            "{z:?}: {run:?}"
        );
    }
}

#[test]
fn bad_options_are_refused_by_name() {
    let option = |e: ExperimentError| match e {
        ExperimentError::Option { option, .. } => option,
        other => panic!("not an option error: {other}"),
    };
    let lat = |f: &dyn Fn(&mut FabricLatencyConfig)| {
        let mut c = FabricLatencyConfig {
            switch: short(1),
            loads: vec![0.5],
        };
        f(&mut c);
        option(fabric_latency(&c, &quiet).unwrap_err())
    };
    assert_eq!(lat(&|c| c.loads = vec![0.0]), "--loads");
    assert_eq!(lat(&|c| c.loads = vec![1.5]), "--loads");
    assert_eq!(lat(&|c| c.loads = vec![f64::NAN]), "--loads");
    assert_eq!(lat(&|c| c.loads = vec![]), "--loads");
    assert_eq!(lat(&|c| c.switch.ports = 1), "--ports");
    assert_eq!(lat(&|c| c.switch.ports = 65), "--ports");
    assert_eq!(lat(&|c| c.switch.threads = 0), "--threads");
    assert_eq!(lat(&|c| c.switch.cycles = 0), "--cycles");
    assert_eq!(lat(&|c| c.switch.burst = 0.5), "--burst");
    assert_eq!(lat(&|c| c.switch.burst = f64::INFINITY), "--burst");
    assert_eq!(lat(&|c| c.switch.burst = 1e16), "--burst");
    assert_eq!(lat(&|c| c.switch.same = -0.1), "--same");
    assert_eq!(lat(&|c| c.switch.max_backlog = 0), "--max-backlog");
    assert_eq!(lat(&|c| c.switch.max_backlog = u64::MAX), "--max-backlog");
    // Each within its cap, together over the memory budget: refused before any point runs,
    // naming both and the total. The default backlog fits 256 threads, not 1024.
    let heavy = |threads: usize, max_backlog: u64| {
        let mut c = FabricLatencyConfig {
            switch: short(threads),
            loads: vec![0.5],
        };
        c.switch.max_backlog = max_backlog;
        fabric_latency(&c, &quiet)
    };
    let default_backlog = SwitchSettings::default().max_backlog;
    match heavy(1024, default_backlog).unwrap_err() {
        ExperimentError::Option { option, reason } => {
            assert_eq!(option, "--threads x --max-backlog");
            assert!(
                reason.starts_with("1024 threads x 4000000 cells x 48 bytes a cell = 183.1 GiB"),
                "{reason}"
            );
            assert!(reason.contains("budget of 64 GiB"), "{reason}");
        }
        other => panic!("not an option error: {other}"),
    }
    assert_eq!(
        option(heavy(2, 1_000_000_000).unwrap_err()),
        "--threads x --max-backlog"
    );
    // At the budget's edge a sweep runs (a short one: its backlog never grows near it).
    let r = heavy(256, default_backlog).unwrap();
    assert!(r.verified);
    let one = heavy(1, 1_000_000_000).unwrap();
    assert!(one.verified);
    let loss = |f: &dyn Fn(&mut FabricLossConfig)| {
        let mut c = FabricLossConfig {
            switch: short(1),
            ..FabricLossConfig::default()
        };
        f(&mut c);
        option(fabric_loss(&c, &quiet).unwrap_err())
    };
    assert_eq!(loss(&|c| c.depths = vec![0, 4]), "--depths");
    assert_eq!(loss(&|c| c.depths = vec![4, (1 << 20) + 1]), "--depths");
    assert_eq!(loss(&|c| c.depths = vec![]), "--depths");
    assert_eq!(loss(&|c| c.near_one = 1.01), "--near-one");
    assert_eq!(loss(&|c| c.max_depth = 0), "--max-depth");
    let bench = |f: &dyn Fn(&mut FabricBenchConfig)| {
        let mut c = FabricBenchConfig::default();
        f(&mut c);
        option(fabric_bench(&c).unwrap_err())
    };
    assert_eq!(bench(&|c| c.load = f64::NAN), "--load");
    assert_eq!(bench(&|c| c.ports = 0), "--ports");
    assert_eq!(bench(&|c| c.cycles = 0), "--cycles");
}

#[test]
fn the_bench_times_every_architecture_against_the_traffic_alone() {
    let r = fabric_bench(&FabricBenchConfig {
        ports: 8,
        load: 0.5,
        cycles: 2_000,
    })
    .unwrap();
    assert_eq!(r.rows.len(), 12);
    assert!(r.rows.iter().all(|x| x.port_cycles_per_s > 0.0));
    assert!(r.port_cycles_per_s > 0.0 && r.traffic_only_port_cycles_per_s > 0.0);
    assert!(r.table().contains("iSLIP-1"));
}

/// Runs `pfemu ARGS`; its output.
fn pfemu(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(args)
        .output()
        .expect("run pfemu")
}

/// Runs `pfemu ARGS`, which must succeed and print one JSON object; that object.
fn pfemu_json(args: &[&str]) -> serde_json::Value {
    let out = pfemu(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pfemu {args:?}: {err}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn the_commands_write_their_files_and_json() {
    let dir = std::env::temp_dir().join(format!("pfemu-fabric-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().expect("a UTF-8 temporary directory");
    let v = pfemu_json(&[
        "experiment",
        "fabric-latency",
        "--ports",
        "4",
        "--cycles",
        "500",
        "--warmup",
        "50",
        "--loads",
        "0.5",
        "--threads",
        "2",
        "--json",
        "--out",
        out,
    ]);
    assert_eq!(v["experiment"], "fabric-latency");
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(36), "{v}");
    assert_eq!(v["verified"], true);
    assert!(dir.join("fabric-latency.csv").exists() && dir.join("fabric-latency.svg").exists());

    let v = pfemu_json(&[
        "bench", "fabric", "--ports", "4", "--cycles", "500", "--json",
    ]);
    let speed = v["port_cycles_per_s"].as_f64();
    assert!(speed.is_some_and(|x| x > 0.0), "{v}");

    let refused = pfemu(&["experiment", "fabric-loss", "--depths", "0", "--out", out]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("--depths"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn aggregation_through_the_chassis_fabric_is_exact_under_background_load() {
    let cfg = FabricChassisConfig {
        backgrounds: vec![0.0, 0.6],
        gradients: 4 * 1024 + 17,
        window: 4,
        ppe_threads: 4,
        ..FabricChassisConfig::default()
    };
    let r = fabric_chassis(&cfg, &quiet).unwrap();
    assert!(r.verified, "{r:?}");
    assert_eq!(r.rows.len(), 8);
    for row in &r.rows {
        assert!(row.sums_exact, "{row:?}");
        // 5 blocks up from each of two leaves, each Result down to both: 20 frames.
        assert_eq!(row.fabric.frames_out, 20, "{row:?}");
        assert_eq!(row.fabric.dropped(), 0);
        // Drained: nothing left in flight, every frame accounted for.
        assert_eq!(row.fabric.frames_in_flight, 0, "{row:?}");
        assert!(row.fabric.accounted(), "{row:?}");
        assert_eq!(
            row.background == 0.0,
            row.fabric.background_cells == 0,
            "{row:?}"
        );
        assert!(
            row.fabric.mean_frame_cycles.is_some_and(|m| m > 0.0),
            "{row:?}"
        );
    }
    let bad = |f: &dyn Fn(&mut FabricChassisConfig)| {
        let mut c = cfg.clone();
        f(&mut c);
        match fabric_chassis(&c, &quiet).unwrap_err() {
            ExperimentError::Option { option, .. } => option,
            other => panic!("not an option error: {other}"),
        }
    };
    assert_eq!(bad(&|c| c.backgrounds = vec![1.0]), "--backgrounds");
    assert_eq!(bad(&|c| c.backgrounds = vec![]), "--backgrounds");
    // The value at fault is named, so a user sees which of the list it was.
    let err = fabric_chassis(
        &FabricChassisConfig {
            backgrounds: vec![0.3, f64::NAN],
            ..cfg.clone()
        },
        &quiet,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--backgrounds") && err.contains("NaN"),
        "{err}"
    );
    assert_eq!(bad(&|c| c.gradients = 0), "--gradients");
    assert_eq!(bad(&|c| c.window = 0), "--window");
    assert_eq!(bad(&|c| c.cell_bytes = 0), "--cell-bytes");
    assert_eq!(bad(&|c| c.cycles_per_us = f64::NAN), "--cycles-per-us");
}

/// A chassis row whose fabric delivered no frame has no mean or largest time in it and no
/// span: `-` in the table, empty CSV fields, null in JSON, no point drawn; not 0 cycles
/// that read like an instant fabric. The row beside it, with frames, prints its numbers.
#[test]
fn a_chassis_row_with_nothing_delivered_has_no_mean_frame_time() {
    use pfemu::lab::bench::fabric::{ChassisRow, FabricChassisReport};
    use pfemu::pfe::FabricStats;
    let row = |architecture: &str, fabric: FabricStats| ChassisRow {
        architecture: architecture.into(),
        background: 0.0,
        span_cycles: fabric.span_cycles(),
        seconds: 0.5,
        fabric,
        sums_exact: false,
    };
    let r = FabricChassisReport {
        config: FabricChassisConfig::default(),
        rows: vec![
            // What a fabric that saw no frame reports.
            row("CPRR", FabricStats::default()),
            row(
                "OQ-xbar",
                FabricStats {
                    frames_in: 4,
                    frames_out: 4,
                    mean_frame_cycles: Some(12.5),
                    max_frame_cycles: Some(20),
                    first_frame_cycle: Some(0),
                    last_frame_cycle: Some(40),
                    ..FabricStats::default()
                },
            ),
        ],
        verified: false,
    };
    assert_eq!(r.rows[0].fabric.mean_frame_cycles, None);
    let table = r.table();
    let columns = |name: &str| -> Vec<String> {
        let line = table.lines().find(|l| l.starts_with(name)).expect(name);
        line.split_whitespace().map(String::from).collect()
    };
    // architecture, background, span, seconds, frames, mean, max
    assert_eq!(columns("CPRR")[2], "-", "{table}");
    assert_eq!(columns("CPRR")[4..], ["0", "-", "-"], "{table}");
    assert_eq!(columns("OQ-xbar")[2], "40", "{table}");
    assert_eq!(columns("OQ-xbar")[4..], ["4", "12.5", "20"], "{table}");
    let mean = r
        .csv_header()
        .iter()
        .position(|h| *h == "mean_frame_cycles")
        .expect("a mean column");
    let csv = r.csv_rows();
    assert_eq!(
        (csv[0][mean].as_str(), csv[1][mean].as_str()),
        ("", "12.50")
    );
    // The span and the largest frame time likewise: empty, not 0.
    for (name, with) in [("span_cycles", "40"), ("max_frame_cycles", "20")] {
        let col = r.csv_header().iter().position(|h| *h == name).expect(name);
        assert_eq!((csv[0][col].as_str(), csv[1][col].as_str()), ("", with));
    }
    let json = serde_json::to_value(&r).unwrap();
    assert!(
        json["rows"][0]["fabric"]["mean_frame_cycles"].is_null(),
        "{json}"
    );
    assert_eq!(json["rows"][1]["fabric"]["mean_frame_cycles"], 12.5);
    assert!(json["rows"][0]["span_cycles"].is_null(), "{json}");
    assert!(json["rows"][0]["fabric"]["max_frame_cycles"].is_null());
    assert_eq!(json["rows"][1]["span_cycles"], 40);
    let dir = std::env::temp_dir().join(format!("pfemu-chassis-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let svg = dir.join("chassis.svg");
    r.draw(&svg).expect("drawn without the missing point");
    let _ = std::fs::remove_dir_all(&dir);
}
