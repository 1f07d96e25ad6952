//! `pfemu experiment pipelines`: the evaluation's rows hold what each architecture's own
//! checks promise, the simulated throughput curves are exact, a user's JSON program is read
//! like a shipped one, and bad options are refused by name. The ILP runs only where a test
//! is about it (`tests/pipeline_ilp.rs` tests it on graphs it proves): its default budget is
//! counted in branch-and-bound nodes, so its rows repeat on any machine.

#![cfg(feature = "lab")]

use std::process::Command;

use pfemu::lab::bench::experiments::Figure;
use pfemu::lab::bench::pipelines::{
    pipelines, Architecture, PipelinesConfig, MAX_CURVE_PROCESSORS, MAX_ODG_BYTES, MAX_ODG_NODES,
};

fn small() -> PipelinesConfig {
    PipelinesConfig {
        graphs: 6,
        ilp_node_limit: 0,
        sim_cycles: 500,
        threads: 2,
        ..PipelinesConfig::default()
    }
}

#[test]
fn rows_and_curves_hold_what_the_architectures_promise() {
    let r = pipelines(&small(), &|_, _| {}).expect("the experiment runs");
    assert!(r.verified(), "every schedule valid, every curve exact");
    assert_eq!(r.rows.len(), 3 + 6, "three programs, six random graphs");
    for row in &r.rows {
        let at = |a: Architecture| {
            row.placements
                .iter()
                .find(|p| p.architecture == a)
                .and_then(|p| p.processors)
                .unwrap_or_else(|| panic!("{}: no {} placement", row.graph, a.name()))
        };
        // The bound is dRMT's (Table 1's processor); RMT's stages have other parameters.
        let bound = at(Architecture::DrmtBound);
        for a in [Architecture::Drmt1, Architecture::Drmt2] {
            assert!(
                at(a) >= bound,
                "{}: {} beats the bound",
                row.graph,
                a.name()
            );
        }
        assert!(
            at(Architecture::RmtFine) <= at(Architecture::Rmt),
            "{}",
            row.graph
        );
        assert_eq!(row.pfe.is_some(), row.kind == "program", "{}", row.graph);
    }
    // RMT can beat dRMT's bound: l3fwd's three stages of 18 + 2 cycles against three matches
    // of 22 and an action of 2. The column says whose bound it is.
    let l3fwd = r.rows.iter().find(|r| r.graph == "l3fwd").expect("l3fwd");
    let latency = |a: Architecture| {
        l3fwd
            .placements
            .iter()
            .find(|p| p.architecture == a)
            .and_then(|p| p.latency)
    };
    assert_eq!(latency(Architecture::Rmt), Some(60));
    assert_eq!(latency(Architecture::DrmtBound), Some(68));
    assert_eq!(Architecture::DrmtBound.name(), "dRMT bound");
    assert!(r.table().contains("dRMT bound"), "{}", r.table());
    // The curves: RMT's cliff and dRMT's decline, point by point as the placements promise.
    let trio: Vec<_> = r
        .throughput
        .iter()
        .filter(|p| p.graph == "trio-ml")
        .collect();
    assert!(!trio.is_empty());
    for p in &trio {
        assert_eq!(p.conflicts, 0, "{p:?}");
        assert!((p.measured - p.expected).abs() < 1e-9, "{p:?}");
    }
    let measured = |a: Architecture, n: u64| {
        trio.iter()
            .find(|p| p.architecture == a && p.processors == n)
            .map(|p| p.measured)
            .expect("a point per processor count")
    };
    // One processor fewer than RMT's stages halves RMT; dRMT loses far less.
    let stages = trio
        .iter()
        .filter(|p| p.architecture == Architecture::Rmt)
        .map(|p| p.processors)
        .max()
        .expect("points");
    assert_eq!(measured(Architecture::Rmt, stages), 1.0);
    assert!(measured(Architecture::Rmt, stages - 1) <= 0.5);
    assert!(measured(Architecture::Drmt1, stages - 1) > 0.8);
    // The CSV has a row per graph and architecture.
    assert_eq!(r.csv_rows().len(), r.rows.len() * Architecture::ALL.len());
}

#[test]
fn a_users_json_program_is_evaluated_like_the_shipped_one() {
    let cfg = PipelinesConfig {
        graphs: 0,
        odg: vec![concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pipelines/l3fwd.json").into()],
        ..small()
    };
    let r = pipelines(&cfg, &|_, _| {}).expect("the experiment runs");
    let shipped = r.rows.iter().find(|r| r.graph == "l3fwd").expect("l3fwd");
    let user = r
        .rows
        .iter()
        .find(|r| r.graph.ends_with("l3fwd.json"))
        .expect("the file's row");
    let columns = |row: &pfemu::lab::bench::pipelines::GraphRow| {
        row.placements
            .iter()
            .map(|p| (p.processors, p.latency))
            .collect::<Vec<_>>()
    };
    assert_eq!(columns(shipped), columns(user));
    assert!(user.pfe.is_none(), "a described program has no PFE column");
}

#[test]
fn an_ilp_node_limit_gives_the_same_rows_on_every_run() {
    // By default the ILP has no wall-clock limit: only the node budget can stop a solve, so
    // what the ILP finds is counted in work, and two runs agree on everything but the seconds.
    let default = PipelinesConfig::default();
    assert_eq!(default.ilp_time_limit, None, "no wall clock by default");
    assert_eq!(default.ilp_node_limit, pfemu::pipeline::DEFAULT_NODE_LIMIT);
    let cfg = PipelinesConfig {
        graphs: 2,
        ilp_graphs: 2,
        ilp_node_limit: 20,
        ..small()
    };
    let run = || {
        let r = pipelines(&cfg, &|_, _| {}).expect("the experiment runs");
        assert!(r.verified());
        r.rows
            .iter()
            .flat_map(|row| {
                row.placements.iter().map(move |p| {
                    (
                        row.graph.clone(),
                        p.processors,
                        p.latency,
                        p.ilp,
                        p.ilp_proven_fewest,
                        p.ilp_stopped_by,
                    )
                })
            })
            .collect::<Vec<_>>()
    };
    let first = run();
    // The budget binds somewhere (so the agreement is the node count's doing), and the
    // output names it, never the wall clock.
    assert!(first.iter().any(|p| p.3 == Some("node limit")), "{first:?}");
    assert!(first.iter().any(|p| p.5 == Some("node limit")), "{first:?}");
    assert!(first.iter().all(|p| p.5 != Some("time limit")), "{first:?}");
    assert_eq!(run(), first);
}

#[test]
fn bad_options_and_files_are_refused_by_name() {
    let refused = |cfg: PipelinesConfig, option: &str| {
        let e = pipelines(&cfg, &|_, _| {}).expect_err("refused");
        assert!(e.to_string().contains(option), "{e}");
    };
    refused(
        PipelinesConfig {
            graphs: 20_000,
            ..small()
        },
        "--graphs",
    );
    refused(
        PipelinesConfig {
            ilp_time_limit: Some(f64::NAN),
            ..small()
        },
        "--ilp-time-limit",
    );
    refused(
        PipelinesConfig {
            ilp_time_limit: Some(0.0),
            ..small()
        },
        "--ilp-time-limit",
    );
    refused(
        PipelinesConfig {
            ilp_node_limit: 2_000_000_000,
            ..small()
        },
        "--ilp-node-limit",
    );
    refused(
        PipelinesConfig {
            slots: 1,
            ..small()
        },
        "--slots",
    );
    let dir = std::env::temp_dir().join(format!("pfemu-odg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"name": "x", "nodes": [{"name": "a", "action": {"fields": 1}}], "edges": [["a", "b"]]}"#,
    )
    .expect("write");
    // A valid description padded past MAX_ODG_BYTES: refused for its size, before parsing.
    let huge = dir.join("huge.json");
    let mut padded =
        r#"{"name": "x", "nodes": [{"name": "a", "action": {"fields": 1}}]}"#.to_string();
    padded.push_str(&" ".repeat(MAX_ODG_BYTES as usize + 1 - padded.len()));
    std::fs::write(&huge, padded).expect("write");
    let too_large = format!("larger than {MAX_ODG_BYTES} bytes");
    // An ordering naming no node is named as such.
    let bad_order = dir.join("bad-order.json");
    std::fs::write(
        &bad_order,
        r#"{"name": "x", "nodes": [{"name": "a", "action": {"fields": 1}}], "orderings": [["a", "c"]]}"#,
    )
    .expect("write");
    // A graph of no node: nothing to place, said so (not a simulator's complaint).
    let empty = dir.join("empty.json");
    std::fs::write(&empty, r#"{"name": "nothing", "nodes": []}"#).expect("write");
    // Each file its own run, so that each refusal is reached.
    for (file, why) in [
        (bad, "edge 0 names `b`, which no node is called"),
        (empty, "the graph has no nodes: nothing to place"),
        (bad_order, "ordering 0 names `c`, which no node is called"),
        (huge, too_large.as_str()),
        (dir.join("missing.json"), "cannot read"),
    ] {
        let e = pipelines(
            &PipelinesConfig {
                graphs: 0,
                odg: vec![file.clone()],
                ..small()
            },
            &|_, _| {},
        )
        .expect_err(why);
        let text = e.to_string();
        assert!(
            text.contains("--odg")
                && text.contains(&file.display().to_string())
                && text.contains(why),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A JSON chain of `tables` tables, each matching on what the previous one's action wrote.
fn chain(tables: usize) -> String {
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for t in 0..tables {
        nodes.push(format!(
            r#"{{"name": "m{t}", "match": {{"key_bits": 32, "entries": 16}}}}"#
        ));
        nodes.push(format!(r#"{{"name": "a{t}", "action": {{"fields": 1}}}}"#));
        edges.push(format!(r#"["m{t}", "a{t}"]"#));
        if t > 0 {
            edges.push(format!(r#"["a{}", "m{t}"]"#, t - 1));
        }
    }
    format!(
        r#"{{"name": "chain", "nodes": [{}], "edges": [{}]}}"#,
        nodes.join(", "),
        edges.join(", ")
    )
}

#[test]
fn a_large_odg_is_refused_and_a_long_curve_is_cut_with_a_note() {
    let dir = std::env::temp_dir().join(format!("pfemu-odg-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // One table more than the limit allows nodes for.
    let big = dir.join("big.json");
    std::fs::write(&big, chain(MAX_ODG_NODES / 2 + 1)).expect("write");
    let e = pipelines(
        &PipelinesConfig {
            graphs: 0,
            odg: vec![big],
            ..small()
        },
        &|_, _| {},
    )
    .expect_err("too many nodes");
    let text = e.to_string();
    assert!(
        text.contains("--odg")
            && text.contains("big.json")
            && text.contains(&format!(
                "{} nodes: a graph may have at most {MAX_ODG_NODES}",
                MAX_ODG_NODES + 2
            )),
        "{text}"
    );
    // A chain needing more stages than the curve simulates: cut there, and said so.
    let long = dir.join("long.json");
    let tables = MAX_CURVE_PROCESSORS as usize + 4;
    std::fs::write(&long, chain(tables)).expect("write");
    let r = pipelines(
        &PipelinesConfig {
            graphs: 0,
            odg: vec![long],
            // dRMT at IPC 1 starts the chain's matches at distinct times: a class each.
            max_processors: 2 * tables as u64,
            ..small()
        },
        &|_, _| {},
    )
    .expect("a long chain within the limits runs");
    let row = r
        .rows
        .iter()
        .find(|r| r.graph.ends_with("long.json"))
        .expect("its row");
    assert_eq!(
        row.placements[0].processors,
        Some(tables as u64),
        "a stage per table"
    );
    let points: Vec<_> = r
        .throughput
        .iter()
        .filter(|p| p.graph == row.graph)
        .collect();
    assert_eq!(
        points.iter().map(|p| p.processors).max(),
        Some(MAX_CURVE_PROCESSORS)
    );
    assert!(
        r.notes.iter().any(|n| n.contains("long.json")
            && n.contains(&format!("up to {MAX_CURVE_PROCESSORS} processors only"))),
        "{:?}",
        r.notes
    );
    assert!(r.table().contains("note: "), "{}", r.table());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_wider_than_a_stage_or_a_processor_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("pfemu-odg-wide-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // 300 fields fit neither an RMT stage (A = 224) nor a dRMT processor (A = 32); 40 fit
    // the stage only; a 641-bit key takes 9 match units of 80 bits, one more than M = 8.
    for (file, node, want) in [
        (
            "fat.json",
            r#"{"name": "fat", "action": {"fields": 300}}"#,
            "`fat` modifies 300 fields, more than a stage's A = 224 (Table 1's RMT)",
        ),
        (
            "forty.json",
            r#"{"name": "forty", "action": {"fields": 40}}"#,
            "`forty` modifies 40 fields, more than a processor's A = 32 (Table 1's dRMT)",
        ),
        (
            "key.json",
            r#"{"name": "key", "match": {"key_bits": 641, "entries": 1}}"#,
            "`key` needs 9 match units, more than a stage's M = 8",
        ),
    ] {
        let path = dir.join(file);
        std::fs::write(
            &path,
            format!(r#"{{"name": "p", "nodes": [{node}], "edges": []}}"#),
        )
        .expect("write");
        let e = pipelines(
            &PipelinesConfig {
                graphs: 0,
                odg: vec![path],
                ..small()
            },
            &|_, _| {},
        )
        .expect_err(file);
        let text = e.to_string();
        assert!(
            text.contains("--odg") && text.contains(file) && text.contains(want),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A graph whose heuristics find a schedule at 4 processors and at 6 (RMT's stages and
/// more: the stage layout) but not at 5, where the list scheduler's greedy placement fails.
const GAP: &str = r#"{"name": "gap", "nodes": [
    {"name": "n0", "action": {"fields": 20}}, {"name": "n1", "match": {"key_bits": 320, "entries": 1}},
    {"name": "n2", "action": {"fields": 25}}, {"name": "n3", "action": {"fields": 5}},
    {"name": "n4", "match": {"key_bits": 80, "entries": 1}}, {"name": "n5", "match": {"key_bits": 400, "entries": 1}},
    {"name": "n6", "action": {"fields": 25}}, {"name": "n7", "action": {"fields": 9}},
    {"name": "n8", "action": {"fields": 10}}, {"name": "n9", "match": {"key_bits": 320, "entries": 1}},
    {"name": "n10", "match": {"key_bits": 80, "entries": 1}}, {"name": "n11", "match": {"key_bits": 400, "entries": 1}},
    {"name": "n12", "match": {"key_bits": 80, "entries": 1}}],
  "edges": [["n1", "n2"], ["n0", "n3"], ["n2", "n3"], ["n3", "n4"], ["n0", "n5"], ["n3", "n5"],
    ["n1", "n6"], ["n0", "n7"], ["n0", "n8"], ["n1", "n8"], ["n6", "n8"], ["n2", "n9"], ["n5", "n9"],
    ["n6", "n9"], ["n7", "n9"], ["n2", "n10"], ["n4", "n10"], ["n6", "n10"], ["n7", "n10"],
    ["n9", "n10"], ["n3", "n11"], ["n6", "n11"], ["n2", "n12"], ["n4", "n12"], ["n7", "n12"]]}"#;

#[test]
fn a_curve_point_without_a_drmt_schedule_is_noted() {
    let dir = std::env::temp_dir().join(format!("pfemu-odg-gap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("gap.json");
    std::fs::write(&path, GAP).expect("write");
    let r = pipelines(
        &PipelinesConfig {
            graphs: 0,
            odg: vec![path],
            ..small()
        },
        &|_, _| {},
    )
    .expect("runs");
    let graph = r
        .rows
        .iter()
        .find(|r| r.graph.ends_with("gap.json"))
        .expect("its row")
        .graph
        .clone();
    let at = |a: Architecture, n: u64| {
        r.throughput
            .iter()
            .any(|p| p.graph == graph && p.architecture == a && p.processors == n)
    };
    assert!(at(Architecture::Rmt, 5) && !at(Architecture::Drmt1, 5));
    assert!(at(Architecture::Drmt1, 4));
    assert!(
        r.notes
            .iter()
            .any(|n| n.starts_with(&graph) && n.contains("no dRMT (IPC 1) point at [5] processors")),
        "{:?}",
        r.notes
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_command_writes_its_files_and_json() {
    let dir = std::env::temp_dir().join(format!("pfemu-pipelines-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args([
            "experiment",
            "pipelines",
            "--graphs",
            "2",
            "--ilp-node-limit",
            "0",
        ])
        .args(["--sim-cycles", "200", "--json", "--out"])
        .arg(&dir)
        .output()
        .expect("pfemu runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["experiment"], "pipelines");
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(5));
    assert!(dir.join("pipelines.csv").exists() && dir.join("pipelines.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
