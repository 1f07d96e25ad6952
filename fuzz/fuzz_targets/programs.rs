//! Arbitrary bytes as a frame through every shipped program, on the single-thread
//! `Harness`. The first input byte picks the program (bits 0-2, modulo the five), the
//! ingress port (bits 3-6) and whether to fix the frame up (bit 7: make it Ethernet + IPv4
//! + UDP with consistent lengths and a valid header checksum, addressed to Trio-ML, so that
//! the fuzzer gets past the programs' parsers); the remaining bytes are the frame. A fault
//! is a verdict like any other; only a panic is a bug. The memories and programs are built
//! once per process: their state (counters, Trio-ML blocks, Nimble's buckets and ADA's
//! tables) carries over from input to input, as in a running PFE. Nimble's clock moves by
//! an amount the frame decides, and its ADA controller runs every 64 inputs.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use pfemu::fpisa::Variant;
use pfemu::microcode::filter::Filter;
use pfemu::microcode::fpisa;
use pfemu::microcode::l3fwd::{L3fwd, RouteTable};
use pfemu::microcode::nimble::{Nimble, NimbleConfig};
use pfemu::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig};
use pfemu::prelude::*;
use pfemu::program::Harness;
use pfemu::timer::Launch;
use pfemu::wire::{Ether, Ipv4, Udp, ETHERTYPE_IPV4, IPPROTO_UDP};

const MIB: u64 = 1 << 20;

struct Rig {
    program: Program,
    harness: Harness,
    // Keeps Trio-ML's control plane (and its tables) alive with the program.
    _trio: Option<TrioMl>,
    /// For a program that reads the clock (Nimble): the time and the inputs run so far.
    clock: Option<(u64, u64)>,
}

fn memory(cfg: MemConfig) -> Arc<SharedMemory> {
    Arc::new(SharedMemory::new(&cfg).expect("memory config"))
}

fn job(trio: &TrioMl) {
    trio.add_job(&JobConfig {
        job_id: 1,
        sources: vec![0, 1, 2, 3],
        ..Default::default()
    })
    .expect("add job");
}

fn rigs() -> &'static [Mutex<Rig>; 5] {
    static RIGS: OnceLock<[Mutex<Rig>; 5]> = OnceLock::new();
    RIGS.get_or_init(|| {
        let small = MemConfig {
            sram_bytes: MIB,
            dram_bytes: MIB,
            acc_bytes: 0,
            banks: 16,
        };
        let mem = memory(small.clone());
        let filter = Rig {
            program: Filter::install(&mem).expect("filter").program(),
            harness: Harness::new(mem),
            _trio: None,
            clock: None,
        };

        // tbl24 is 32 MiB of DRAM, plus room for the tbl8 groups.
        let mem = memory(MemConfig {
            dram_bytes: 40 * MIB,
            ..small
        });
        let routes = RouteTable::generate(256, 4, 1).expect("routes");
        let l3fwd = Rig {
            program: L3fwd::install(&mem, &routes).expect("l3fwd").program(),
            harness: Harness::new(mem),
            _trio: None,
            clock: None,
        };

        let mem = memory(MemConfig::default());
        let trio = TrioMl::install(&mem, TrioMlConfig::default()).expect("trio-ml");
        job(&trio);
        let trio_ml = Rig {
            program: trio.program(),
            harness: Harness::new(mem),
            _trio: Some(trio),
            clock: None,
        };

        let mem = memory(MemConfig::default());
        let trio = fpisa::install(&mem, Variant::Full).expect("fpisa");
        job(&trio);
        let fpisa = Rig {
            program: trio.program(),
            harness: Harness::new(mem),
            _trio: Some(trio),
            clock: None,
        };

        // Four classes (ports 0-3) at 1 to 40 Gbit/s, ADA on the rate and on the time.
        let mem = memory(small);
        let nimble = Nimble::install(
            &mem,
            NimbleConfig {
                rates_bps: vec![1_000_000_000, 10_000_000_000, 24_000_000_000, 40_000_000_000],
                dt_ada: Some(pfemu::ada::block::AdaConfig::new(pfemu::ada::arith::Op::Mul)),
                ..NimbleConfig::default()
            },
        )
        .expect("nimble");
        let nimble = Rig {
            program: nimble.program(),
            harness: Harness::new(mem),
            _trio: None,
            clock: Some((0, 0)),
        };

        [
            Mutex::new(filter),
            Mutex::new(l3fwd),
            Mutex::new(trio_ml),
            Mutex::new(fpisa),
            Mutex::new(nimble),
        ]
    })
}

/// Ethernet + IPv4 (no options) + UDP to Trio-ML's address and port, lengths from the
/// frame's size, header checksum filled in; the rest of the bytes stay as the fuzzer chose.
fn fix_up(frame: &mut Vec<u8>) {
    const IP_AT: usize = 14;
    const UDP_AT: usize = IP_AT + 20;
    if frame.len() < UDP_AT + 8 {
        frame.resize(UDP_AT + 8, 0);
    }
    let len = frame.len();
    let cfg = TrioMlConfig::default();
    let mut eth = Ether::new_checked(&mut frame[..]).expect("long enough");
    eth.set_etype(ETHERTYPE_IPV4);
    let mut ip = Ipv4::new_checked(&mut frame[IP_AT..]).expect("long enough");
    ip.set_ver(4);
    ip.set_ihl(5);
    ip.set_total_len((len - IP_AT).min(0xFFFF) as u16);
    ip.set_frag_off(0);
    ip.set_mf(false);
    if ip.ttl() == 0 {
        ip.set_ttl(64);
    }
    ip.set_proto(IPPROTO_UDP);
    // Every other frame goes to Trio-ML's address; the others keep a fuzzed destination
    // (for l3fwd's lookup).
    if ip.ident() & 1 == 0 {
        ip.set_dst_addr(cfg.local_addr);
    }
    ip.fill_checksum();
    let mut udp = Udp::new_checked(&mut frame[UDP_AT..]).expect("long enough");
    udp.set_dst_port(cfg.udp_port);
    udp.set_len((len - UDP_AT).min(0xFFFF) as u16);
    udp.set_checksum(0);
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, frame)) = data.split_first() else {
        return;
    };
    let port = Port::from((sel >> 3) & 0xF);
    let mut owned;
    let mut frame = frame;
    if sel & 0x80 != 0 {
        owned = frame.to_vec();
        fix_up(&mut owned);
        frame = &owned;
    }
    let mut rig = rigs()[usize::from(sel & 7) % 5].lock().unwrap();
    let Rig {
        program,
        harness,
        clock,
        ..
    } = &mut *rig;
    if let Some((now, inputs)) = clock {
        // Forward by the frame's first bytes' worth of nanoseconds (zero included: packets
        // of one batch share a reading), and the controller every 64 inputs.
        let step = frame.iter().take(3).fold(0u64, |a, &b| a << 8 | u64::from(b));
        *now += step;
        *inputs += 1;
        harness.set_now(*now);
        if *inputs % 64 == 0 {
            let launch = Launch {
                timer: 0,
                entry: 0,
                slice: 0,
                slices: 1,
                scheduled_ns: *now,
                missed: 0,
            };
            std::hint::black_box(harness.run_timer(program, launch));
        }
    }
    let out = harness.run(program, port, frame);
    std::hint::black_box(out);
});
