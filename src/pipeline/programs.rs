//! The shipped programs (`microcode/`) as operation dependency graphs, and what the same
//! programs cost on pfemu's run-to-completion PFE ([`PfeProfile`]).
//!
//! Each graph is read off what the program does to one packet, by these rules:
//!
//! - **A match** per shared-memory access whose result the program goes on with: a hash
//!   lookup, a route lookup, a read of a record the next step depends on. Its key is what
//!   indexes the table (the bits of the hash key, or of the index the read's address is
//!   computed from) and its entries the table's size.
//! - **An action** per write the program makes: a write, counter update or read-modify-write
//!   XTXN (a stateful ALU's work in a pipeline), a header rewrite, the verdict (the egress
//!   port, or dropping the packet). Its fields are the fields it modifies.
//! - **Edges** are the program's data and control dependencies, each on a result, the dRMT
//!   paper's τ(u, v) of ΔM or ΔA (§3.3): a match feeding a later match's key or predicating
//!   an action (waiting ΔM), an action whose result a later operation reads, is predicated
//!   on, or must see completed (waiting ΔA). None is an ordering alone, such as a read that
//!   must precede a later write (a reverse-match or successor dependency, of latency 0:
//!   [`EdgeKind::Order`](super::EdgeKind::Order)).
//! - **Conditions** (branches on header fields, or on a value read) take no match or action
//!   resources and are contracted, as the paper's generator does ([`super::examples::random`]):
//!   their predecessors become their successors' predecessors. Registers that only carry a
//!   value from one instruction to the next are the packet header vector itself, not nodes.
//!
//! A pipeline executes every node of the graph for every packet (predicated off where the
//! program would not take the branch); a graph here is therefore the union of the program's
//! paths, and its longest path (every match, every memory write) is the one the PFE profile
//! and the agreement test (`tests/pipeline_programs.rs`) run. The pipeline module sits below
//! the engine, so the tables' sizes are restated here; the agreement test checks them
//! against the programs' own constants.

/// Entries of l3fwd's tbl24: one per /24 (`l3fwd::TBL24_ENTRIES`).
pub const L3FWD_TBL24_ENTRIES: u64 = 1 << 24;
/// Entries of one tbl8 group: one per address of a /24 (`l3fwd::TBL8_GROUP_ENTRIES`).
pub const L3FWD_TBL8_GROUP_ENTRIES: u64 = 256;
/// Most tbl8 groups: a 15-bit group index (`l3fwd::MAX_TBL8_GROUPS`).
pub const L3FWD_MAX_TBL8_GROUPS: u64 = 1 << 15;
/// Most next hops: a 15-bit index (`l3fwd::MAX_NEXT_HOPS`).
pub const L3FWD_MAX_NEXT_HOPS: u64 = (1 << 15) - 1;
/// One route in this many is longer than /24 and takes a tbl8 group of its own in the
/// tables `RouteTable::generate` draws (about 5%).
pub const L3FWD_ROUTES_PER_TBL8_GROUP: u64 = 20;

/// Gradients per packet of [`trio_ml_aggregation`]: two 64-byte chunks, which lie wholly
/// in the PFE's 192-byte head (gradients start at byte 54) and fit a pipeline's packet
/// header vector, as SwitchML packs 32 values per packet on Tofino.
pub const TRIO_ML_GRADIENTS: u32 = 32;
/// Gradients one 16-lane vector add takes (a 64-byte line).
pub const TRIO_ML_CHUNK_GRADIENTS: u32 = 16;
/// Records of Trio-ML's active-block table (`trio_ml::DEFAULT_HASH_CAPACITY`): each may
/// hold a block, so it is also the number of block records.
pub const TRIO_ML_BLOCK_RECORDS: u64 = 1 << 16;
/// Trio-ML's jobs: an 8-bit job id.
pub const TRIO_ML_JOBS: u64 = 256;

use super::odg::{Edge, Node, Odg, Op};

/// A graph under construction, edges by name.
struct Builder {
    nodes: Vec<Node>,
    edges: Vec<Edge>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            nodes: Vec::new(),
            edges: Vec::new(),
        }
    }

    fn index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("`{name}` is added before its edges"))
    }

    /// A match on a key of `key_bits` bits into a table of `entries`, after `after`.
    fn matches(&mut self, name: &str, key_bits: u32, entries: u64, after: &[&str]) {
        self.node(name, Op::Match { key_bits, entries }, after);
    }

    /// An action modifying `fields` fields, after `after`.
    fn action(&mut self, name: &str, fields: u32, after: &[&str]) {
        self.node(name, Op::Action { fields }, after);
    }

    fn node(&mut self, name: &str, op: Op, after: &[&str]) {
        let to = self.nodes.len();
        let from: Vec<usize> = after.iter().map(|a| self.index(a)).collect();
        self.nodes.push(Node {
            name: name.into(),
            op,
        });
        self.edges
            .extend(from.into_iter().map(|from| Edge::result(from, to)));
    }

    fn build(self) -> Odg {
        Odg::new(self.nodes, self.edges).expect("a shipped program's graph is valid")
    }
}

/// The packet filter (`microcode/filter.rs`): no lookup at all. Its two conditions
/// (`process_ether`: EtherType IPv4?; `process_ip`: version 4 and IHL 5?) read header fields
/// only and are contracted, and `REASON` only carries the drop reason to the counter's
/// index, so its three actions depend on nothing:
///
/// - `count_dropped` (2 fields: the counter's packets and bytes): `count_dropped`'s
///   `t.post(Op::CounterInc { addr: drop_cnt_base + REASON * 2, bytes: pkt_len })`;
/// - `forward_packet` (1 field, the egress port): `Done(Verdict::Forward(out_port))`;
/// - `drop_packet` (1 field, the drop reason): `Done(Verdict::Drop(t.get(REASON)))`.
///
/// Its longest path is a dropped packet's: `count_dropped` and `drop_packet`.
pub fn filter() -> Odg {
    let mut g = Builder::new();
    g.action("count_dropped", 2, &[]);
    g.action("forward_packet", 1, &[]);
    g.action("drop_packet", 1, &[]);
    g.build()
}

/// l3fwd (`microcode/l3fwd.rs`) with a table of `routes` routes, as DIR-24-8 looks it up:
///
/// - `tbl24` (24-bit key, 2^24 entries): `parse`'s `t.read_u64(tbl24 + slot / 4)`, the
///   entry of the destination's /24 (`slot = dst >> 8`); the IPv4 checks before it are
///   conditions on the header.
/// - `tbl8` (23-bit key: the 15-bit group and the address's low 8 bits; 256 entries per
///   group): `lookup_tbl8`'s `t.read_u64(tbl8 + slot / 4)`, only for a route longer than
///   /24, whose group `tbl24` gave. Groups are estimated as one per
///   [`L3FWD_ROUTES_PER_TBL8_GROUP`] routes (generated tables put 5% of their routes there,
///   nearly each in a /24 of its own), at least one, at most [`L3FWD_MAX_TBL8_GROUPS`].
/// - `next_hop` (15-bit key, [`L3FWD_MAX_NEXT_HOPS`] entries): `rewrite`'s
///   `t.mem_read(at, SCRATCH_LM, NEXT_HOP_REC_LEN)`, at the hop `tbl24` or `tbl8` gave.
/// - `set_next_hop` (3 fields: destination MAC, source MAC, egress port): `rewrite_head`'s
///   MAC writes and `Done(Verdict::Forward(port))`, from the next hop's record.
/// - `decrement_ttl` (2 fields: TTL, header checksum): `rewrite_head`'s TTL - 1 with the
///   checksum updated (RFC 1624); it reads the header only, so it waits for nothing.
///
/// The longest path is a packet whose route is longer than /24 (three reads); a shorter
/// route skips `tbl8`.
pub fn l3fwd(routes: u64) -> Odg {
    let groups = routes
        .div_ceil(L3FWD_ROUTES_PER_TBL8_GROUP)
        .clamp(1, L3FWD_MAX_TBL8_GROUPS);
    let mut g = Builder::new();
    g.matches("tbl24", 24, L3FWD_TBL24_ENTRIES, &[]);
    g.matches(
        "tbl8",
        15 + 8,
        groups * L3FWD_TBL8_GROUP_ENTRIES,
        &["tbl24"],
    );
    g.matches("next_hop", 15, L3FWD_MAX_NEXT_HOPS, &["tbl24", "tbl8"]);
    g.action("set_next_hop", 3, &["next_hop"]);
    g.action("decrement_ttl", 2, &[]);
    g.build()
}

/// Trio-ML's aggregation step (`microcode/trio_ml/program.rs`, Figure 10's steps 2 and 4-6)
/// for a packet of [`TRIO_ML_GRADIENTS`] gradients that joins an active block it neither
/// creates nor completes (the block's first packet also creates it, and its last builds the
/// Result: work per block, not per packet). `parse`'s checks are conditions on the header.
///
/// - `active_block` (64-bit key: job, run, block, generation; [`TRIO_ML_BLOCK_RECORDS`]
///   entries): `lookup_block`'s `t.hash_lookup(&active, &key)`, the block's record and its
///   slot's tag.
/// - `block_job_word`, `block_gate_word` (16-bit key, the record's slot;
///   [`TRIO_ML_BLOCK_RECORDS`] entries): `check_source`'s `t.read_u64(rec + BLOCK_W_JOB)` (the
///   job record's and the buffer's address) and `t.read_u64(rec + BLOCK_W_GATE)` (the
///   buffer's address, the block's gradient count, the slot's tag).
/// - `job_src_mask`, `job_run_word` (8-bit key, the job; [`TRIO_ML_JOBS`] entries):
///   `check_source`'s `t.read_u64(job + word)` (is the source a member?) and
///   `t.read_u64(job + JOB_W_SRC_CNT)` (the job's sources and run), at the job
///   `block_job_word` gave.
/// - `enter_gate` (1 field, the gate's count in flight): `join_block`'s
///   `t.fetch_add(rec + GATE_W, GATE_ENTER)`, predicated on the checks (its slot tag is
///   compared with the one `active_block` gave).
/// - `mark_received` (1 field, the source's bit): `join_block`'s
///   `t.fetch_or(rec + bit.word(), bit.mask())`, unless the gate was closed.
/// - `add_chunk_0`, `add_chunk_1` (16 fields, one 32-bit lane each): `aggregate_head`'s
///   `add_chunk` (a posted 16-lane vector add into buffer line `c`), unless the source was
///   already received.
/// - `count_source` (2 fields: `rcvd_cnt`, the contributors): `complete_check`'s
///   `t.fetch_add32(rec + BLOCK_W_RCVD_CNT, ..)`, after `t.wait_posted()` saw both adds land.
/// - `leave_gate` (1 field): `leave_block`'s `t.fetch_add(rec + GATE_W, GATE_LEAVE)`.
/// - `consume` (1 field, the verdict): `Done(Verdict::Consume)`, once `leave_gate` showed the
///   packet is not the last out of a closed block.
pub fn trio_ml_aggregation() -> Odg {
    let mut g = Builder::new();
    g.matches("active_block", 64, TRIO_ML_BLOCK_RECORDS, &[]);
    g.matches(
        "block_job_word",
        16,
        TRIO_ML_BLOCK_RECORDS,
        &["active_block"],
    );
    g.matches(
        "block_gate_word",
        16,
        TRIO_ML_BLOCK_RECORDS,
        &["active_block"],
    );
    g.matches("job_src_mask", 8, TRIO_ML_JOBS, &["block_job_word"]);
    g.matches("job_run_word", 8, TRIO_ML_JOBS, &["block_job_word"]);
    g.action(
        "enter_gate",
        1,
        &["block_gate_word", "job_src_mask", "job_run_word"],
    );
    g.action("mark_received", 1, &["enter_gate"]);
    let chunks: Vec<String> = (0..TRIO_ML_GRADIENTS / TRIO_ML_CHUNK_GRADIENTS)
        .map(|c| format!("add_chunk_{c}"))
        .collect();
    for c in &chunks {
        g.action(c, TRIO_ML_CHUNK_GRADIENTS, &["mark_received"]);
    }
    let chunk_names: Vec<&str> = chunks.iter().map(String::as_str).collect();
    g.action("count_source", 2, &chunk_names);
    g.action("leave_gate", 1, &["count_source"]);
    g.action("consume", 1, &["leave_gate"]);
    g.build()
}

/// What one packet costs a shipped program on pfemu's run-to-completion PFE, measured by
/// running it through a `Pfe` (the lab's `pfe_profile`), on the packets of the path its
/// graph describes in full.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PfeProfile {
    /// Microcode instructions per packet.
    pub instructions: f64,
    /// XTXNs per packet.
    pub xtxns: f64,
}

impl PfeProfile {
    /// The PPE threads a PFE keeps busy at one packet per cycle: the per-packet latency in
    /// cycles, by a simple cost model of one cycle per instruction and `xtxn_latency` cycles
    /// per XTXN the thread waits on (every XTXN counted as waited on, posted ones too: an
    /// upper bound), rounded up. A thread holds its packet from start to finish, so by
    /// Little's law the threads in use at one packet per cycle equal the latency: the
    /// dRMT paper's point that a run-to-completion design needs as many threads as a packet
    /// takes cycles.
    pub fn threads_at_line_rate(&self, xtxn_latency: u64) -> u64 {
        let cycles = self.instructions + self.xtxns * xtxn_latency as f64;
        // Non-negative and finite for a measured profile; a NaN saturates to 0.
        cycles.max(0.0).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{lower_bound, Arch};

    fn counts(odg: &Odg) -> (usize, usize) {
        let m = odg
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Match { .. }))
            .count();
        (m, odg.nodes().len() - m)
    }

    #[test]
    fn the_graphs_have_their_programs_shape() {
        assert_eq!(counts(&filter()), (0, 3));
        assert!(filter().edges().is_empty());
        assert_eq!(counts(&l3fwd(100_000)), (3, 2));
        assert_eq!(counts(&trio_ml_aggregation()), (5, 7));
        // tbl24 -> tbl8 -> next_hop -> set_next_hop: three matches and an action.
        let dep = Arch::DRMT.match_latency * 3 + Arch::DRMT.action_latency;
        assert_eq!(lower_bound(&l3fwd(100_000), &Arch::DRMT).latency, dep);
    }

    #[test]
    fn l3fwds_tbl8_grows_with_the_routes_within_its_index() {
        let tbl8 = |routes| match l3fwd(routes).nodes()[1].op {
            Op::Match { entries, .. } => entries,
            Op::Action { .. } => unreachable!("tbl8 is a match"),
        };
        assert_eq!(tbl8(0), 256);
        assert_eq!(tbl8(100_000), 5_000 * 256);
        assert_eq!(tbl8(u64::MAX), L3FWD_MAX_TBL8_GROUPS * 256);
    }

    #[test]
    fn threads_at_line_rate_are_the_latency() {
        let p = PfeProfile {
            instructions: 3.5,
            xtxns: 2.0,
        };
        assert_eq!(p.threads_at_line_rate(0), 4);
        assert_eq!(p.threads_at_line_rate(100), 204);
    }
}
