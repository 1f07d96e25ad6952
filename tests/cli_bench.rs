//! `pfemu bench l3fwd`, `pfemu bench nimble`, `pfemu linerate` and `pfemu latency` from the
//! command line: small runs that check the report's shape and the files, not the speed; and
//! every bench and experiment command naming the option behind a refused value.

#![cfg(feature = "lab")]

use std::path::PathBuf;
use std::process::Command;

fn pfemu(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(args)
        .output()
        .unwrap()
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

/// Runs `pfemu args... --profile`, checks it succeeded, and returns the profile table that
/// ends its report, checked to have a row for each of `rows` (`what` names the run in
/// failures).
fn profile_table(what: &str, args: &[&str], rows: &[&str]) -> String {
    let out = pfemu(&[args, &["--profile"]].concat());
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let table = text
        .find("Where the time went")
        .map(|at| text[at..].to_string())
        .unwrap_or_else(|| panic!("{what}: no profile table in\n{text}"));
    for row in rows {
        assert!(
            table.lines().any(|l| l.trim_start().starts_with(row)),
            "{what}: no {row:?} row in\n{table}"
        );
    }
    table
}

/// The stages of a `--json` report's per-packet profile (`summary.profile`), in order.
fn profile_stages(summary_profile: &serde_json::Value) -> Vec<String> {
    summary_profile["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["stage"].as_str().expect("a stage's name").to_string())
        .collect()
}

/// The stages a profile lists, in order.
const STAGES: [&str; 7] = [
    "ingress", "dispatch", "program", "reorder", "sink", "egress", "timers",
];

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pfemu-cli-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn bench_l3fwd_reports_mpps_and_the_common_summary() {
    let v = json_of(&pfemu(&[
        "bench",
        "l3fwd",
        "--packets",
        "20000",
        "--routes",
        "2000",
        "--ppe-threads",
        "2",
        "--invalid-percent",
        "10",
        "--json",
    ]));
    assert!(v["mpps"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["verified"], true);
    assert_eq!(
        v["verified_all_runs"], true,
        "every run's check, beside the median's"
    );
    assert_eq!(v["packets_in"], 20000);
    let s = &v["summary"];
    for key in [
        "mpps_in",
        "mpps_out",
        "gbps_in",
        "gbps_out",
        "dropped_by_reason",
        "latency",
        "per_ppe_packets",
        "instructions_per_packet",
        "xtxns_per_packet",
        "plain_loop_mpps",
        "overhead_ratio",
    ] {
        assert!(s.get(key).is_some(), "summary lacks {key}: {s}");
    }
    assert!(s["overhead_ratio"].as_f64().unwrap() > 0.0);
    assert!(s["latency"]["count"].as_u64().unwrap() > 0);
    // 10% invalid frames, dropped with their reasons.
    assert!(
        s["dropped_by_reason"].as_object().unwrap().len() >= 2,
        "{s}"
    );
}

/// Each arithmetic of the rate limiter, on a rate and bucket small enough that both
/// verdicts run: verified, its verdicts adding up, and the report's fields there.
#[test]
fn bench_nimble_verifies_with_every_arithmetic() {
    for arithmetic in ["exact", "uniform", "static", "ada"] {
        let v = json_of(&pfemu(&[
            "bench",
            "nimble",
            "--arithmetic",
            arithmetic,
            "--packets",
            "20000",
            "--rate-gbps",
            "0.01",
            "--burst-bytes",
            "6400",
            "--ppe-threads",
            "2",
            "--json",
        ]));
        assert_eq!(v["verified"], true, "{arithmetic}: {v}");
        assert_eq!(v["arithmetic"], arithmetic);
        assert_eq!(v["packets_in"], 20000);
        let count = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
        assert_eq!(
            count("admitted") + count("rate_exceeded") + count("no_class"),
            20000
        );
        assert!(count("admitted") > 0 && count("rate_exceeded") > 0, "{v}");
        for key in [
            "mpps",
            "gbps",
            "admitted_share",
            "admitted_gbps",
            "max_overshoot_share",
            "instructions_per_packet",
            "xtxns_per_packet",
            "tcam_lookups_per_packet",
            "baseline_mpps",
            "ratio_to_baseline",
        ] {
            assert!(v[key].as_f64().is_some(), "{arithmetic} lacks {key}: {v}");
        }
        let classes = v["classes"].as_array().unwrap();
        assert_eq!(classes.len(), 4);
        for c in classes {
            assert_eq!(c["within"], true, "{c}");
            assert!(c["admitted_bytes"].as_f64() <= c["allowed_bytes"].as_f64());
        }
        assert_eq!(v["plain_loop"]["verified"], true);
        let tcam = v["tcam_lookups_per_packet"].as_f64().unwrap();
        assert_eq!(tcam > 0.0, arithmetic != "exact", "{arithmetic}: {tcam}");
        // ADA's controller stats under `ada` only, where it ran during the run.
        let ada = &v["ada"];
        assert_eq!(ada.is_null(), arithmetic != "ada", "{v}");
        if arithmetic == "ada" {
            let epochs = |s: &serde_json::Value| s["epochs"].as_u64().unwrap();
            assert!(epochs(ada) > epochs(&v["ada_at_start"]), "{v}");
        }
        for key in ["plain_loop_mpps", "overhead_ratio", "xtxns_per_packet"] {
            assert!(v["summary"].get(key).is_some(), "summary lacks {key}");
        }
    }
}

#[test]
fn bench_filter_takes_generator_options_and_prints_the_summary() {
    let out = pfemu(&[
        "bench",
        "filter",
        "--packets",
        "30000",
        "--sizes",
        "imix",
        "--flow-dist",
        "zipf:1.1",
        "--mix",
        "ipv4=80,ipv4opt=5,ipv6=10,nonip=5",
        "--ppe-threads",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["RX-packets: 30000", "Latency:", "Plain loop:", "overhead"] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }
    let bad = pfemu(&["bench", "filter", "--mix", "ipv4=50"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("mix"));
}

/// `--profile` adds the table of where the time went to the text and to `--json`: every
/// stage there, the packets counted those processed. Structure only, never a speed.
#[test]
fn bench_filter_profile_prints_where_the_time_went() {
    let args = [
        "bench",
        "filter",
        "--packets",
        "100000",
        "--ppe-threads",
        "2",
    ];
    let table = profile_table(
        "bench filter",
        &args,
        &[
            "stage", "ingress", "dispatch", "program", "reorder", "sink", "egress", "total",
        ],
    );
    assert!(table.contains("waiting, not in the total"), "{table}");

    let v = json_of(&pfemu(&[&args[..], &["--profile", "--json"]].concat()));
    assert_eq!(v["config"]["profile"], true);
    assert_eq!(v["profile"]["packets"], 100000, "{}", v["profile"]);
    let p = &v["summary"]["profile"];
    assert_eq!(profile_stages(p), STAGES);
    assert!(p["busy_ns_per_packet"].as_f64().unwrap() > 0.0, "{p}");

    // Without the flag, no table and no profile.
    let plain = pfemu(&args);
    assert!(plain.status.success());
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("Where the time went"));
    let v = json_of(&pfemu(&[&args[..], &["--json"]].concat()));
    assert!(
        v["profile"].is_null() && v["summary"]["profile"].is_null(),
        "{v}"
    );
}

/// A small aggregation job for `bench trio-ml` and `bench fpisa` (add `--generations`).
const SMALL_AGGREGATION: [&str; 8] = [
    "--workers",
    "2",
    "--grads",
    "64",
    "--window",
    "8",
    "--ppe-threads",
    "2",
];

/// With several runs, `bench trio-ml` and `bench fpisa` also give each run's own ratio
/// (to its plain loop; FPISA's to the Trio-ML run of its round), as a spread whose median
/// need not be the median run's. Structure only, never a speed.
#[test]
fn bench_trio_ml_and_fpisa_give_each_runs_own_ratio() {
    let small = [
        &SMALL_AGGREGATION[..],
        &["--generations", "1", "--runs", "3"],
    ]
    .concat();
    for (bench, key, row, line) in [
        (
            "trio-ml",
            "ratio_to_baseline_of_runs",
            "ratio_to_baseline",
            "ratio, each run to its own plain loop (2 PPE threads): median ",
        ),
        (
            "fpisa",
            "ratio_to_trio_ml_of_rounds",
            "ratio_to_trio_ml",
            "FPISA / Trio-ML, each round's two runs: median ",
        ),
    ] {
        let args = [&["bench", bench][..], &small[..]].concat();
        let out = pfemu(&args);
        assert!(out.status.success(), "{bench}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(line) && text.contains("over 3 "),
            "{bench}: {text}"
        );
        let v = json_of(&pfemu(&[&args[..], &["--json"]].concat()));
        let s = &v[key];
        let f = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{bench}: {k}: {v}"));
        assert!(
            0.0 < f("min") && f("min") <= f("median") && f("median") <= f("max"),
            "{bench}: {s}"
        );
        assert!(v[row].as_f64().is_some(), "{bench}: {v}");
    }
}

/// With several runs, the packet benchmarks with a plain loop (`bench filter`, `bench
/// l3fwd`, `bench nimble`) also give each run's overhead against the plain loop measured
/// in that run, as a spread; one run has none. Structure only, never a speed.
#[test]
fn packet_benchmarks_give_each_runs_own_overhead() {
    let small = ["--packets", "20000", "--ppe-threads", "2"];
    for (bench, extra) in [
        ("filter", &[][..]),
        ("l3fwd", &["--routes", "2000"][..]),
        (
            "nimble",
            &["--rate-gbps", "0.01", "--burst-bytes", "6400"][..],
        ),
    ] {
        let args = [&["bench", bench][..], &small[..], extra].concat();
        let three = [&args[..], &["--runs", "3"]].concat();
        let out = pfemu(&three);
        assert!(out.status.success(), "{bench}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Overhead by run: median ") && text.contains("over 3 runs"),
            "{bench}: {text}"
        );
        let v = json_of(&pfemu(&[&three[..], &["--json"]].concat()));
        let s = &v["overhead_of_runs"];
        let f = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{bench}: {k}: {v}"));
        assert!(
            0.0 < f("min") && f("min") <= f("median") && f("median") <= f("max"),
            "{bench}: {s}"
        );
        // The median run's own overhead is one of the runs'.
        let own = v["summary"]["overhead_ratio"].as_f64().expect("overhead");
        assert!(f("min") <= own && own <= f("max"), "{bench}: {own} {s}");
        let one = json_of(&pfemu(&[&args[..], &["--json"]].concat()));
        assert!(one["overhead_of_runs"].is_null(), "{bench}: {one}");
        let text = String::from_utf8_lossy(&pfemu(&args).stdout).to_string();
        assert!(!text.contains("Overhead by run"), "{bench}: {text}");
    }
    // A sweep names each configuration's line.
    let out = pfemu(&[
        "bench",
        "filter",
        "--packets",
        "20000",
        "--ppe-threads",
        "1,2",
        "--runs",
        "2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    for of in ["(1 PPE threads, reorder on)", "(2 PPE threads, reorder on)"] {
        assert!(
            text.contains(&format!("Overhead by run {of}: median ")),
            "{text}"
        );
    }
}

/// `bench trio-ml` and `bench fpisa` take `--profile` too: the table after the summary,
/// and in `--json` the profile of the aggregation packets the PPE threads processed, with
/// the timer threads' stage (their straggler scans run meanwhile). Structure only, never a
/// speed.
#[test]
fn bench_trio_ml_and_fpisa_profile_print_where_the_time_went() {
    let small = [&SMALL_AGGREGATION[..], &["--generations", "2"]].concat();
    for bench in ["trio-ml", "fpisa"] {
        let args = [&["bench", bench][..], &small[..]].concat();
        // The timers' row shows when a scan ran, which depends on how long the run took.
        profile_table(
            bench,
            &args,
            &["ingress", "dispatch", "program", "egress", "total"],
        );

        let v = json_of(&pfemu(&[&args[..], &["--profile", "--json"]].concat()));
        assert_eq!(v["config"]["profile"], true, "{bench}");
        // 2 workers x 8 blocks x 2 generations.
        assert_eq!(v["profile"]["packets"], 32, "{bench}: {}", v["profile"]);
        let p = &v["summary"]["profile"];
        assert!(
            p["busy_ns_per_packet"].as_f64().unwrap() > 0.0,
            "{bench}: {p}"
        );
        assert_eq!(profile_stages(p), STAGES, "{bench}");

        let v = json_of(&pfemu(&[&args[..], &["--json"]].concat()));
        assert!(
            v["profile"].is_null() && v["summary"]["profile"].is_null(),
            "{bench}: profiled without --profile: {v}"
        );
        // The straggler scan runs on the system clock (a 100 ms block timeout), so a busy
        // machine may leave blocks partial: the check still holds every complete Result to
        // its exact sums and every partial one to the sums of the sources it holds, and
        // the report accounts for each late packet (answered with its block's Result, then
        // dropped) and nothing else dropped.
        assert_eq!(v["verified_all_runs"], true, "{bench}: {v}");
        let late = v["late"].as_u64().unwrap();
        assert!(v["degraded"].as_u64().unwrap() <= 8, "{bench}: {v}");
        assert_eq!(v["dropped"].as_u64(), Some(late), "{bench}: {v}");
        // 8 blocks x 2 generations, and an answer per late packet.
        assert_eq!(v["created"].as_u64(), Some(16 + late), "{bench}: {v}");
    }
}

/// `pfemu run` profiles the filter on generated traffic, and refuses `--profile` on
/// interfaces (whose engine it does not profile) before touching any.
#[test]
fn run_profiles_generated_traffic_only() {
    let out = pfemu(&[
        "run",
        "--packets",
        "20000",
        "--ppe-threads",
        "2",
        "--profile",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Where the time went"));
    let live = pfemu(&["run", "--iface", "0=pfemu-noif", "--profile"]);
    assert!(!live.status.success());
    let err = String::from_utf8_lossy(&live.stderr);
    assert!(err.contains("invalid option `--profile`"), "{err}");
}

#[test]
fn linerate_writes_its_table_csv_and_plot() {
    let dir = temp_dir("linerate");
    let v = json_of(&pfemu(&[
        "linerate",
        "--sizes",
        "64,1518",
        "--trial-ms",
        "40",
        // Slow enough for a loaded machine to pass a rate.
        "--line-rate",
        "0.1",
        "--ppe-threads",
        "2",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    // What rate passes depends on the machine's speed (a generator that falls behind on a
    // loaded machine offers less than it must, and fails its trial): the search itself is
    // tested against simulated devices in tests/linerate.rs. Here: every row is a search
    // that ran and reports consistently.
    for (row, size) in rows.iter().zip([64, 1518]) {
        assert_eq!(row["frame_size"], size);
        assert!(!row["trials"].as_array().unwrap().is_empty(), "{row}");
        let mpps = row["mpps"].as_f64().unwrap();
        assert_eq!(
            mpps > 0.0,
            row["throughput_pps"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        assert!((0.0..=100.0).contains(&row["percent_of_line_rate"].as_f64().unwrap()));
    }
    let csv = std::fs::read_to_string(dir.join("linerate.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(std::fs::read_to_string(dir.join("linerate.svg"))
        .unwrap()
        .contains("<svg"));
    let bad = pfemu(&["linerate", "--sizes", "10"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("sizes"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn latency_sweeps_the_loads_it_is_given() {
    let dir = temp_dir("latency");
    let v = json_of(&pfemu(&[
        "latency",
        "--program",
        "l3fwd",
        "--routes",
        "1000",
        "--reference-mpps",
        "0.2",
        "--loads",
        "0.25,1",
        "--trial-ms",
        "40",
        "--ppe-threads",
        "2",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r["latency"]["p50_ns"].as_u64().unwrap() > 0),
        "{v}"
    );
    assert!(dir.join("latency_64.csv").exists() && dir.join("latency_64.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every bench and experiment command names the option the user typed when a value is
/// refused, not the library setting behind it (`frame_size` for `--size`, ...).
#[test]
fn refused_values_name_the_option_typed() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "filter", "--size", "63"], "`--size`"),
        (
            &["bench", "filter", "--packets", "100", "--batch", "0"],
            "`--batch`",
        ),
        (
            &[
                "bench",
                "filter",
                "--packets",
                "100",
                "--reorder-contexts",
                "3",
            ],
            "`--reorder-contexts`",
        ),
        (
            &["bench", "l3fwd", "--packets", "100", "--size", "10"],
            "`--size`",
        ),
        (
            &[
                "bench",
                "l3fwd",
                "--packets",
                "100",
                "--invalid-percent",
                "200",
            ],
            "`--invalid-percent`",
        ),
        (&["bench", "nimble", "--classes", "0"], "`--classes`"),
        (&["bench", "nimble", "--rate-gbps", "0"], "`--rate-gbps`"),
        (
            &["bench", "nimble", "--burst-bytes", "0"],
            "`--burst-bytes`",
        ),
        (&["bench", "nimble", "--size", "10"], "`--size`"),
        (&["bench", "nimble", "--flows", "2"], "`--flows`"),
        (&["bench", "trio-ml", "--grads", "5000"], "`--grads`"),
        (&["bench", "trio-ml", "--workers", "0"], "`--workers`"),
        (&["bench", "fpisa", "--grads", "5000"], "`--grads`"),
        (&["bench", "timers", "--timers", "0"], "`--timers`"),
        (&["linerate", "--line-rate", "0"], "`--line-rate`"),
        (&["linerate", "--loss", "200"], "`--loss`"),
        (
            &["latency", "--size", "10", "--reference-mpps", "1"],
            "`--size`",
        ),
        (
            &["latency", "--loads", "0", "--reference-mpps", "1"],
            "`--loads`",
        ),
        (&["demo", "--block-exp-ms", "0"], "`--block-exp-ms`"),
        (&["experiment", "fig14", "--timeouts", "0"], "`--timeouts`"),
        (
            &["experiment", "fpisa-accuracy", "--lanes", "0"],
            "`--lanes`",
        ),
    ];
    // An arithmetic there is none of: clap's refusal names the option too.
    let out = pfemu(&["bench", "nimble", "--arithmetic", "fast"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--arithmetic"));
    for (args, flag) in cases {
        let out = pfemu(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?} should name {flag}: {err}");
        assert!(
            !err.contains("invalid configuration"),
            "{args:?} names a library setting: {err}"
        );
    }
}

/// `--help` shows the library configurations' defaults, list defaults as they are typed,
/// and the one reorder flag.
#[test]
fn help_shows_the_configs_defaults_as_typed() {
    let help = |args: &[&str]| {
        let out = pfemu(args);
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let filter = help(&["bench", "filter", "--help"]);
    let d = pfemu::lab::bench::filter::FilterBenchConfig::default();
    assert!(
        filter.contains(&format!("[default: {}]", d.packets)),
        "{filter}"
    );
    assert!(filter.contains("--reorder") && !filter.contains("--no-reorder"));
    // The help names the pool's real cap, which the overhead ratio depends on.
    let pool = pfemu::lab::bench::filter::POOL_MAX;
    assert!(
        filter.contains(&format!("at most {pool} distinct frames")),
        "{filter}"
    );
    let fig14 = help(&["experiment", "fig14", "--help"]);
    assert!(fig14.contains("[default: 2,5,10,20,50]"), "{fig14}");
    assert!(
        fig14.contains("[default: 0.5]"),
        "fig14 scans every 0.5 ms: {fig14}"
    );
    let top = help(&["--help"]);
    assert!(top.contains("pfemu <COMMAND> --help"), "{top}");
}

/// Every command's `--help`, reached by walking the "Commands:" lists from the top, reads
/// as text for users: no rustdoc link syntax or Rust values leaked from the doc comments
/// clap takes option help from.
#[test]
fn no_help_text_leaks_rustdoc_syntax() {
    let help = |path: &[String]| {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = pfemu(&args);
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    let mut seen = 0;
    while let Some(path) = todo.pop() {
        let text = help(&path);
        seen += 1;
        for leak in ["[`", "`]", "`None`", "`Some"] {
            assert!(
                !text.contains(leak),
                "`pfemu {} --help` shows {leak:?}:\n{text}",
                path.join(" ")
            );
        }
        let commands = text
            .lines()
            .skip_while(|l| l.trim() != "Commands:")
            .skip(1)
            .take_while(|l| !l.trim().is_empty());
        for line in commands {
            let name = line.split_whitespace().next().expect("a command's name");
            if name != "help" {
                todo.push(path.iter().cloned().chain([name.to_string()]).collect());
            }
        }
    }
    assert!(seen > 20, "walked only {seen} commands");
}
