//! The control plane's jobs (`/targets/jobs/...`) on a running engine: removing and adding
//! jobs again and again reuses their memory once the engine is past them, so a control
//! plane driven while the engine runs does not wear it out.

#![cfg(feature = "lab")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use pfemu::lab::control::{Controller, JobsTarget, Response};
use pfemu::mem::{MemConfig, SharedMemory};
use pfemu::microcode::trio_ml::wire::{self, AggPacket, TrioMlHdrFields};
use pfemu::microcode::trio_ml::{TrioMl, TrioMlConfig};
use pfemu::prelude::*;

/// Source `src`'s packet of job 1's block `block`.
fn packet(block: u32, src: u8) -> Vec<u8> {
    let local = TrioMlConfig::default().local_addr;
    wire::agg_packet(&AggPacket {
        endpoints: common::worker_endpoints(src, local, wire::DEFAULT_UDP_PORT),
        hdr: TrioMlHdrFields {
            job_id: 1,
            block_id: block,
            gen_id: 0,
            src_id: src,
            grad_cnt: 4,
            ..Default::default()
        },
        gradients: &[1, 2, 3, 4],
    })
}

fn call(ctl: &Controller, command: &str, body: &Value) -> Response {
    ctl.handle(
        "POST",
        &format!("/targets/jobs/{command}"),
        body.to_string().as_bytes(),
    )
}

/// The reviewer's cycle: with the default memory and the default job, every removal and
/// add used to take a new region, and the 125th add found DRAM exhausted with no job
/// installed. Now each removal waits for the engine's grace periods and the next add of
/// the same shape takes the memory back: 300 cycles, while job 1's packets keep coming.
#[test]
fn removing_and_adding_a_job_300_times_on_a_running_engine_reuses_its_memory() {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(&mem, TrioMlConfig::default()).unwrap();
    let mut pfe = Pfe::builder()
        .program(trio.program())
        .memory(mem.clone())
        .ppe_threads(2)
        .timers(trio.timer_specs().unwrap())
        .build()
        .unwrap();
    pfe.start().unwrap();
    let ctl = Controller::new(pfe.control(), vec![Arc::new(JobsTarget::new(trio.clone()))]);
    let add = json!({ "job_id": 1, "sources": [0, 1] });
    let remove = json!({ "job_id": 1 });
    let r = call(&ctl, "add", &add);
    assert_eq!(r.status, 200, "{}", r.body);
    let regions = mem.allocations().len();

    let pfe = Arc::new(pfe);
    let stop = Arc::new(AtomicBool::new(false));
    let injector = {
        let (pfe, stop) = (pfe.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let _ = pfe.inject_frame((n % 2) as u16, &packet(n / 2 % 64, (n % 2) as u8));
                n = n.wrapping_add(1);
            }
        })
    };
    for cycle in 0..300 {
        let r = call(&ctl, "remove", &remove);
        assert_eq!(r.status, 200, "cycle {cycle}: {}", r.body);
        assert_eq!(
            r.json_body()["memory"],
            "reusable",
            "cycle {cycle}: {}",
            r.body
        );
        let r = call(&ctl, "add", &add);
        assert_eq!(r.status, 200, "cycle {cycle}: {}", r.body);
    }
    stop.store(true, Ordering::Relaxed);
    injector.join().unwrap();
    assert_eq!(
        mem.allocations().len(),
        regions,
        "every add after the first reused the removed job's regions"
    );
    assert_eq!(trio.retired_jobs(), (0, 0));
    let stats = Arc::try_unwrap(pfe).ok().unwrap().shutdown();
    assert!(stats.packets_in > 0, "the engine ran packets meanwhile");
}

/// A control plane without the engine (no [`Controller`]) cannot wait for grace periods:
/// a removed job's memory stays retired, never reused, and the removal says so.
#[test]
fn without_the_engine_a_removed_jobs_memory_stays_retired() {
    use pfemu::lab::control::Target;
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(&mem, TrioMlConfig::default()).unwrap();
    let jobs = JobsTarget::new(trio.clone());
    let add = json!({ "job_id": 1, "sources": [0, 1] });
    jobs.call("add", &add).unwrap();
    let r = jobs.call("remove", &json!({ "job_id": 1 })).unwrap();
    assert_eq!(r["memory"], "retired");
    let before = mem.allocations().len();
    jobs.call("add", &add).unwrap();
    assert!(
        mem.allocations().len() > before,
        "fresh memory, none reused"
    );
    assert_eq!(trio.retired_jobs(), (1, 0));
}
