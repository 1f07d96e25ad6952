//! The shipped programs' operation dependency graphs (`pipeline::programs`) agree with what
//! the programs do per packet on a real `Pfe`, as its stats record it.
//!
//! The mapping, node by node (the rules are `pipeline::programs`'s top doc):
//!
//! - each **match** node stands for exactly one lookup XTXN (`read` or `hash_lookup`): the
//!   table read whose result the program goes on with;
//! - each **action** node stands for at most one XTXN that writes shared memory (a counter
//!   update, a read-modify-write, a vector add), or for none (a header rewrite, the verdict);
//! - the graph is the union of the program's paths (a pipeline runs every node, predicated),
//!   so a packet runs a subset of its nodes, named per path below.
//!
//! For every path, packets that take it go through a PFE and the XTXNs they cost, by kind,
//! must equal those of the path's nodes exactly; the longest path runs every match, so the
//! graph's matches equal the lookups per packet, and its memory-writing actions the other
//! XTXNs. Every node must be named in the mapping and be on some path. So a graph that gains
//! or loses a match or a memory write fails here, and so does a program that changes its
//! memory accesses. The graphs' table sizes are checked against the programs' constants.

mod common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use pfemu::mem::XtxnKind;
use pfemu::microcode::filter::Filter;
use pfemu::microcode::l3fwd::{self, Dir248, L3fwd, RouteTable};
use pfemu::microcode::trio_ml::wire::{self, AggPacket, TrioMlHdrFields};
use pfemu::microcode::trio_ml::{self, JobConfig, TrioMl, TrioMlConfig};
use pfemu::pipeline::{programs, Odg, Op};
use pfemu::prelude::*;
use pfemu::program::Program;

/// The XTXNs one node stands for.
type Mapping = &'static [(&'static str, Option<XtxnKind>)];

/// XTXN kinds that are lookups (a match's).
const LOOKUPS: [XtxnKind; 2] = [XtxnKind::Read, XtxnKind::HashLookup];

/// What the packets of one path cost, per packet.
#[derive(Debug, PartialEq)]
struct PerPacket {
    instructions: u64,
    xtxns: BTreeMap<String, u64>,
}

/// A running PFE with one program.
struct Engine {
    pfe: Pfe,
}

impl Engine {
    fn new(program: Program, mem: Arc<SharedMemory>) -> Engine {
        let mut pfe = Pfe::builder()
            .program(program)
            .memory(mem)
            .ppe_threads(4)
            .sink(Arc::new(CountingSink::new(4)))
            .build()
            .expect("a PFE");
        pfe.start().expect("started");
        Engine { pfe }
    }

    /// Runs `frames` (each taking the same path) and returns their cost per packet: the
    /// totals divide exactly, or some packet took another path.
    fn run(&self, frames: &[Vec<u8>]) -> PerPacket {
        let before = self.pfe.stats();
        for f in frames {
            self.pfe
                .inject(Packet::new(0, f.clone()))
                .expect("injected");
        }
        self.pfe.drain();
        let after = self.pfe.stats();
        let n = frames.len() as u64;
        let per = |what: &str, total: u64| {
            assert_eq!(total % n, 0, "{what}: {total} over {n} packets");
            total / n
        };
        let mut xtxns = BTreeMap::new();
        for (kind, &count) in &after.xtxns {
            let delta = count - before.xtxns.get(kind).copied().unwrap_or(0);
            if delta > 0 {
                xtxns.insert(kind.clone(), per(kind, delta));
            }
        }
        PerPacket {
            instructions: per("instructions", after.instructions - before.instructions),
            xtxns,
        }
    }
}

/// Checks `odg` against `mapping` and the paths' measured costs; the first path is the
/// longest (every match). Returns the longest path's cost.
fn agree(odg: &Odg, mapping: Mapping, paths: &[(&str, &[&str], PerPacket)]) -> PerPacket {
    let mut names: Vec<&str> = odg.nodes().iter().map(|n| n.name.as_str()).collect();
    let mut mapped: Vec<&str> = mapping.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    mapped.sort_unstable();
    assert_eq!(names, mapped, "every node is mapped, and only nodes are");
    for node in odg.nodes() {
        let kind = mapping
            .iter()
            .find(|(n, _)| *n == node.name)
            .and_then(|(_, k)| *k);
        match node.op {
            Op::Match { .. } => assert!(
                kind.is_some_and(|k| LOOKUPS.contains(&k)),
                "match `{}` is one lookup",
                node.name
            ),
            Op::Action { .. } => assert!(
                kind.is_none_or(|k| !LOOKUPS.contains(&k)),
                "action `{}` looks nothing up",
                node.name
            ),
        }
        assert!(
            paths
                .iter()
                .any(|(_, nodes, _)| nodes.contains(&&*node.name)),
            "`{}` is on some path",
            node.name
        );
    }
    for (path, nodes, measured) in paths {
        let mut expected: BTreeMap<String, u64> = BTreeMap::new();
        for node in *nodes {
            let (_, kind) = mapping
                .iter()
                .find(|(n, _)| n == node)
                .unwrap_or_else(|| panic!("{path}: `{node}` is not a node"));
            if let Some(k) = kind {
                *expected.entry(k.name().to_string()).or_default() += 1;
            }
        }
        assert_eq!(
            measured.xtxns, expected,
            "{path}: the XTXNs per packet are its nodes'"
        );
    }
    let (_, longest, measured) = &paths[0];
    let matches = odg
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Match { .. }))
        .count() as u64;
    let lookups: u64 = LOOKUPS
        .iter()
        .map(|k| measured.xtxns.get(k.name()).copied().unwrap_or(0))
        .sum();
    assert_eq!(matches, lookups, "the graph's matches are the lookups");
    assert!(
        odg.nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Match { .. }))
            .all(|n| longest.contains(&&*n.name)),
        "the first path is the longest"
    );
    let writes = measured.xtxns.values().sum::<u64>() - lookups;
    let writing_actions = mapping
        .iter()
        .filter(|(n, k)| k.is_some_and(|k| !LOOKUPS.contains(&k)) && longest.contains(n))
        .count() as u64;
    assert_eq!(writes, writing_actions, "the memory writes are actions");
    PerPacket {
        instructions: measured.instructions,
        xtxns: measured.xtxns.clone(),
    }
}

fn entries(odg: &Odg, name: &str) -> (u32, u64) {
    let i = odg.index_of(name).expect("a node");
    match odg.nodes()[i].op {
        Op::Match { key_bits, entries } => (key_bits, entries),
        Op::Action { .. } => panic!("`{name}` is a match"),
    }
}

/// The filter's graph, checked.
fn filter_agrees() -> PerPacket {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).expect("memory"));
    let filter = Filter::install(&mem).expect("installed");
    let engine = Engine::new(filter.program(), mem);
    let plain: Vec<Vec<u8>> = (0..64).map(|i| common::udp_frame(i, 0, 64)).collect();
    let options: Vec<Vec<u8>> = plain
        .iter()
        .map(|f| {
            let mut f = f.clone();
            f[14] = 0x46; // IHL 6: one word of options
            f
        })
        .collect();
    let non_ip: Vec<Vec<u8>> = (0..64).map(|_| common::ether_frame(0x0806, 60)).collect();
    const MAPPING: Mapping = &[
        ("count_dropped", Some(XtxnKind::CounterInc)),
        ("forward_packet", None),
        ("drop_packet", None),
    ];
    let dropped: &[&str] = &["count_dropped", "drop_packet"];
    agree(
        &programs::filter(),
        MAPPING,
        &[
            ("IPv4 with options, dropped", dropped, engine.run(&options)),
            ("not IP, dropped", dropped, engine.run(&non_ip)),
            (
                "plain IPv4, forwarded",
                &["forward_packet"],
                engine.run(&plain),
            ),
        ],
    )
}

#[test]
fn the_filters_graph_is_what_it_does_per_packet() {
    let longest = filter_agrees();
    // process_ether, process_ip, count_dropped, drop_packet.
    assert_eq!(longest.instructions, 4);
}

fn l3fwd_agrees() -> PerPacket {
    // 10.1.2.128/25 is longer than /24: its addresses take tbl8.
    let routes: RouteTable = "10.0.0.0/8 1\n10.1.2.128/25 2\n".parse().expect("routes");
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).expect("memory"));
    let l3 = L3fwd::install(&mem, &routes).expect("installed");
    let engine = Engine::new(l3.program(), mem);
    let frames = |dst: [u8; 3]| -> Vec<Vec<u8>> {
        (0..64u8)
            .map(|i| l3fwd::udp_frame([dst[0], dst[1], dst[2], 128 + i], 64, 64))
            .collect()
    };
    const MAPPING: Mapping = &[
        ("tbl24", Some(XtxnKind::Read)),
        ("tbl8", Some(XtxnKind::Read)),
        ("next_hop", Some(XtxnKind::Read)),
        ("set_next_hop", None),
        ("decrement_ttl", None),
    ];
    let odg = programs::l3fwd(routes.len() as u64);
    agree(
        &odg,
        MAPPING,
        &[
            (
                "a route longer than /24",
                &["tbl24", "tbl8", "next_hop", "set_next_hop", "decrement_ttl"],
                engine.run(&frames([10, 1, 2])),
            ),
            (
                "a route of /24 or shorter",
                &["tbl24", "next_hop", "set_next_hop", "decrement_ttl"],
                engine.run(&frames([10, 9, 9])),
            ),
        ],
    )
}

#[test]
fn l3fwds_graph_is_what_it_does_per_packet() {
    let longest = l3fwd_agrees();
    // parse, lookup_tbl8, rewrite.
    assert_eq!(longest.instructions, 3);
}

#[test]
fn l3fwds_tables_are_the_programs() {
    assert_eq!(programs::L3FWD_TBL24_ENTRIES, l3fwd::TBL24_ENTRIES as u64);
    assert_eq!(
        programs::L3FWD_TBL8_GROUP_ENTRIES,
        l3fwd::TBL8_GROUP_ENTRIES as u64
    );
    assert_eq!(
        programs::L3FWD_MAX_TBL8_GROUPS,
        l3fwd::MAX_TBL8_GROUPS as u64
    );
    assert_eq!(programs::L3FWD_MAX_NEXT_HOPS, l3fwd::MAX_NEXT_HOPS as u64);
    // Keys: the /24 (tbl24), the 15-bit group and 8 low bits (tbl8), the 15-bit hop.
    let odg = programs::l3fwd(20_000);
    assert_eq!(entries(&odg, "tbl24"), (24, 1 << 24));
    assert_eq!(entries(&odg, "next_hop").0, 15);
    assert_eq!(
        1u64 << entries(&odg, "next_hop").0,
        l3fwd::MAX_NEXT_HOPS as u64 + 1
    );
    assert_eq!(
        1u64 << (entries(&odg, "tbl8").0 - 8),
        l3fwd::MAX_TBL8_GROUPS as u64
    );
    // The tbl8 estimate is near what a generated table of as many routes needs.
    let table =
        Dir248::build(&RouteTable::generate(20_000, 8, 1).expect("routes")).expect("a table");
    let built = (table.tbl8_groups() * l3fwd::TBL8_GROUP_ENTRIES) as f64;
    let estimate = entries(&odg, "tbl8").1 as f64;
    assert!(
        (0.75..=1.25).contains(&(estimate / built)),
        "tbl8: {estimate} entries estimated, {built} built"
    );
}

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const JOB: u8 = 1;
/// Blocks aggregated at once.
const BLOCKS: u32 = 16;

fn trio_ml_packet(block: u32, src: u8) -> Vec<u8> {
    let grads: Vec<i32> = (0..programs::TRIO_ML_GRADIENTS as i32).collect();
    wire::agg_packet(&AggPacket {
        endpoints: common::worker_endpoints(src, LOCAL, wire::DEFAULT_UDP_PORT),
        hdr: TrioMlHdrFields {
            job_id: JOB,
            block_id: block,
            src_id: src,
            grad_cnt: grads.len() as u16,
            ..Default::default()
        },
        gradients: &grads,
    })
}

fn trio_ml_agrees() -> PerPacket {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).expect("memory"));
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            local_addr: LOCAL,
            ..TrioMlConfig::default()
        },
    )
    .expect("installed");
    // Four sources: the first creates each block, the last (never sent) would complete it.
    trio.add_job(&JobConfig {
        job_id: JOB,
        sources: vec![0, 1, 2, 3],
        out_dest: Dest::Port(1),
        ..JobConfig::default()
    })
    .expect("a job");
    let engine = Engine::new(trio.program(), mem);
    let creators: Vec<Vec<u8>> = (0..BLOCKS).map(|b| trio_ml_packet(b, 0)).collect();
    let created = engine.run(&creators);
    let middle: Vec<Vec<u8>> = (0..BLOCKS)
        .flat_map(|b| [trio_ml_packet(b, 1), trio_ml_packet(b, 2)])
        .collect();
    let joined = engine.run(&middle);
    assert!(
        created.xtxns.values().sum::<u64>() > joined.xtxns.values().sum::<u64>(),
        "creating a block costs more than joining it"
    );
    const MAPPING: Mapping = &[
        ("active_block", Some(XtxnKind::HashLookup)),
        ("block_job_word", Some(XtxnKind::Read)),
        ("block_gate_word", Some(XtxnKind::Read)),
        ("job_src_mask", Some(XtxnKind::Read)),
        ("job_run_word", Some(XtxnKind::Read)),
        ("enter_gate", Some(XtxnKind::FetchAdd)),
        ("mark_received", Some(XtxnKind::FetchOr)),
        ("add_chunk_0", Some(XtxnKind::VAdd32x16)),
        ("add_chunk_1", Some(XtxnKind::VAdd32x16)),
        ("count_source", Some(XtxnKind::Add32)),
        ("leave_gate", Some(XtxnKind::FetchAdd)),
        ("consume", None),
    ];
    let all: Vec<&str> = MAPPING.iter().map(|(n, _)| *n).collect();
    let stats = engine.pfe.stats();
    assert_eq!((stats.consumed, stats.dropped), (3 * u64::from(BLOCKS), 0));
    agree(
        &programs::trio_ml_aggregation(),
        MAPPING,
        &[("joining an active block", &all, joined)],
    )
}

#[test]
fn trio_mls_graph_is_what_its_aggregation_step_does_per_packet() {
    let longest = trio_ml_agrees();
    // parse, lookup_block, check_source, join_block, aggregate_head, complete_check,
    // leave_block, consume.
    assert_eq!(longest.instructions, 8);
}

#[test]
fn trio_mls_tables_are_the_programs() {
    assert_eq!(
        programs::TRIO_ML_BLOCK_RECORDS,
        trio_ml::DEFAULT_HASH_CAPACITY as u64
    );
    let odg = programs::trio_ml_aggregation();
    // The record's slot among the table's records; the 8-bit job id.
    assert_eq!(
        1u64 << entries(&odg, "block_job_word").0,
        programs::TRIO_ML_BLOCK_RECORDS
    );
    assert_eq!(
        1u64 << entries(&odg, "job_src_mask").0,
        programs::TRIO_ML_JOBS
    );
    assert_eq!(programs::TRIO_ML_JOBS, u64::from(u8::MAX) + 1);
    // Every gradient of a packet lies in the head: no tail read.
    assert!(
        wire::GRADS_AT + programs::TRIO_ML_GRADIENTS as usize * 4
            <= pfemu::packet::DEFAULT_HEAD_BYTES
    );
}

/// The lab's profile of each program is the longest path measured here.
#[cfg(feature = "lab")]
#[test]
fn the_labs_pfe_profiles_are_the_longest_paths() {
    use pfemu::lab::bench::pipelines::pfe_profile;
    for (name, longest) in [
        ("filter", filter_agrees()),
        ("l3fwd", l3fwd_agrees()),
        ("trio-ml", trio_ml_agrees()),
    ] {
        let p = pfe_profile(name).expect("a shipped program");
        assert_eq!(p.instructions, longest.instructions as f64, "{name}");
        assert_eq!(
            p.xtxns,
            longest.xtxns.values().sum::<u64>() as f64,
            "{name}"
        );
    }
    assert!(pfe_profile("nat").is_err());
}

/// The shipped programs' graphs as `examples/pipelines/*.json`: (file, graph).
#[cfg(feature = "serde")]
fn example_files() -> Vec<(&'static str, Odg)> {
    vec![
        ("filter.json", programs::filter()),
        ("l3fwd.json", programs::l3fwd(100_000)),
        ("trio-ml.json", programs::trio_ml_aggregation()),
    ]
}

/// A description as a person would write it: one node or edge a line.
#[cfg(feature = "serde")]
fn describe_json(d: &pfemu::pipeline::Description) -> String {
    fn compact<T: serde::Serialize>(v: &T) -> String {
        let json = serde_json::to_string(v).expect("serializable");
        json.replace("\":", "\": ").replace(",\"", ", \"")
    }
    fn list<T: serde::Serialize>(items: &[T]) -> String {
        if items.is_empty() {
            return "[]".into();
        }
        let items: Vec<String> = items.iter().map(compact).collect();
        format!("[\n    {}\n  ]", items.join(",\n    "))
    }
    format!(
        "{{\n  \"name\": {},\n  \"nodes\": {},\n  \"edges\": {}\n}}\n",
        compact(&d.name),
        list(&d.nodes),
        list(&d.edges),
    )
}

/// The files in `examples/pipelines` are what the functions build (run with
/// `PFEMU_WRITE_PIPELINES=1` to write them again after a graph changed), and each reads back
/// as its graph.
#[cfg(feature = "serde")]
#[test]
fn the_example_descriptions_are_the_programs_graphs() {
    use pfemu::pipeline::Description;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pipelines");
    let text = |file: &str, odg: &Odg| describe_json(&odg.describe(file.trim_end_matches(".json")));
    if std::env::var_os("PFEMU_WRITE_PIPELINES").is_some() {
        std::fs::create_dir_all(&dir).expect("examples/pipelines");
        for (file, odg) in example_files() {
            std::fs::write(dir.join(file), text(file, &odg)).expect("written");
        }
    }
    for (file, odg) in example_files() {
        let shipped = std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|e| panic!("examples/pipelines/{file}: {e}"));
        assert!(
            shipped == text(file, &odg),
            "examples/pipelines/{file} is not what the program's graph writes now: run \
             `PFEMU_WRITE_PIPELINES=1 cargo test --test pipeline_programs example` to write it again"
        );
        let read: Description = serde_json::from_str(&shipped).expect("a description");
        assert_eq!(read.to_odg().expect("a graph"), odg, "{file}");
    }
}
