//! The PFE beside the pipelines: a shipped program run through a [`Pfe`] on the packets of
//! the path its operation dependency graph ([`crate::pipeline::programs`]) describes in
//! full, its instructions and XTXNs per packet read off the engine's stats.
//!
//! The paths: for the filter, IPv4 packets with options (dropped and counted: every
//! instruction and the counter update); for l3fwd, packets whose route is longer than /24
//! (tbl24, tbl8 and the next hop); for Trio-ML, packets that join an active block they
//! neither create nor complete (the blocks are created first, by another source, and that
//! run is not counted). `tests/pipeline_programs.rs` checks these against the graphs.

use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::lab::bench::experiments::ExperimentError;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::filter::Filter;
use crate::microcode::l3fwd::{self, L3fwd, RouteTable};
use crate::microcode::trio_ml::wire::{self, AggPacket, Endpoints, TrioMlHdrFields};
use crate::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig};
use crate::packet::{Dest, Packet};
use crate::pfe::{CountingSink, Pfe};
use crate::pipeline::programs::TRIO_ML_GRADIENTS;
pub use crate::pipeline::PfeProfile;
use crate::program::Program;

/// Packets measured per program.
const PACKETS: usize = 64;
/// Trio-ML's blocks: each gets a creating packet (not measured), then two measured ones.
const TRIO_ML_BLOCKS: u32 = PACKETS as u32 / 2;
/// The aggregator's address in the Trio-ML run.
const TRIO_ML_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);

/// `program`'s cost per packet on a PFE: `"filter"`, `"l3fwd"` or `"trio-ml"`.
pub fn pfe_profile(program: &str) -> Result<PfeProfile, ExperimentError> {
    let setup = |e: &dyn std::fmt::Display| ExperimentError::Setup(format!("{program}: {e}"));
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).map_err(|e| setup(&e))?);
    match program {
        "filter" => {
            let filter = Filter::install(&mem).map_err(|e| setup(&e))?;
            let engine = Engine::start(filter.program(), mem)?;
            // IHL 6: IPv4 with one word of options.
            let frame = {
                let mut f = vec![0u8; 64];
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14] = 0x46;
                f
            };
            engine.profile(&vec![frame; PACKETS])
        }
        "l3fwd" => {
            let routes: RouteTable = "10.0.0.0/8 1\n10.1.2.128/25 2\n"
                .parse()
                .map_err(|e| setup(&e))?;
            let l3 = L3fwd::install(&mem, &routes).map_err(|e| setup(&e))?;
            let engine = Engine::start(l3.program(), mem)?;
            // Inside 10.1.2.128/25: tbl24 points to a tbl8 group.
            let frames: Vec<Vec<u8>> = (0..PACKETS)
                .map(|i| l3fwd::udp_frame([10, 1, 2, 128 + (i % 128) as u8], 64, 64))
                .collect();
            engine.profile(&frames)
        }
        "trio-ml" => {
            let cfg = TrioMlConfig {
                local_addr: TRIO_ML_ADDR,
                ..TrioMlConfig::default()
            };
            let trio = TrioMl::install(&mem, cfg).map_err(|e| setup(&e))?;
            // Source 3 never sends, so no block completes.
            trio.add_job(&JobConfig {
                job_id: 1,
                sources: vec![0, 1, 2, 3],
                out_dest: Dest::Port(1),
                ..JobConfig::default()
            })
            .map_err(|e| setup(&e))?;
            let engine = Engine::start(trio.program(), mem)?;
            let creators: Vec<Vec<u8>> =
                (0..TRIO_ML_BLOCKS).map(|b| trio_ml_packet(b, 0)).collect();
            engine.profile(&creators)?;
            let joining: Vec<Vec<u8>> = (0..TRIO_ML_BLOCKS)
                .flat_map(|b| [trio_ml_packet(b, 1), trio_ml_packet(b, 2)])
                .collect();
            engine.profile(&joining)
        }
        other => Err(ExperimentError::Setup(format!(
            "no shipped program `{other}`: filter, l3fwd or trio-ml"
        ))),
    }
}

/// Source `src`'s packet of [`TRIO_ML_GRADIENTS`] gradients for block `block` of job 1.
fn trio_ml_packet(block: u32, src: u8) -> Vec<u8> {
    let grads: Vec<i32> = (0..TRIO_ML_GRADIENTS as i32).collect();
    wire::agg_packet(&AggPacket {
        endpoints: Endpoints {
            src_mac: [2, 0, 0, 0, 1, src],
            dst_mac: TrioMlConfig::default().local_mac,
            src_addr: Ipv4Addr::new(10, 0, 1, src),
            dst_addr: TRIO_ML_ADDR,
            src_port: 40000 + u16::from(src),
            dst_port: wire::DEFAULT_UDP_PORT,
        },
        hdr: TrioMlHdrFields {
            job_id: 1,
            block_id: block,
            src_id: src,
            grad_cnt: TRIO_ML_GRADIENTS as u16,
            ..TrioMlHdrFields::default()
        },
        gradients: &grads,
    })
}

/// A running PFE with one program; shut down when dropped.
struct Engine {
    pfe: Pfe,
}

impl Engine {
    fn start(program: Program, mem: Arc<SharedMemory>) -> Result<Engine, ExperimentError> {
        let setup = |e: &dyn std::fmt::Display| ExperimentError::Setup(e.to_string());
        let mut pfe = Pfe::builder()
            .program(program)
            .memory(mem)
            .ppe_threads(4)
            .sink(Arc::new(CountingSink::new(4)))
            .build()
            .map_err(|e| setup(&e))?;
        pfe.start().map_err(|e| setup(&e))?;
        Ok(Engine { pfe })
    }

    /// Runs `frames` through the engine and returns their mean cost.
    fn profile(&self, frames: &[Vec<u8>]) -> Result<PfeProfile, ExperimentError> {
        let before = self.pfe.stats();
        for f in frames {
            self.pfe
                .inject(Packet::new(0, f.clone()))
                .map_err(|e| ExperimentError::Run(format!("injecting: {e}")))?;
        }
        self.pfe.drain();
        let after = self.pfe.stats();
        let n = frames.len().max(1) as f64;
        let xtxns = |s: &crate::pfe::Stats| s.xtxns.values().sum::<u64>();
        Ok(PfeProfile {
            instructions: (after.instructions - before.instructions) as f64 / n,
            xtxns: (xtxns(&after) - xtxns(&before)) as f64 / n,
        })
    }
}
