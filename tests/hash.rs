//! The hash engine reached from programs: records created once per key by hundreds of PPE
//! threads, REF flags seen by a scan, a full table handled by the program, and a bad key a
//! counted fault.

mod common;

use std::sync::Arc;

use pfemu::mem::hash::{HashError, HashTable, Inserted, ScanAction};
use pfemu::prelude::*;

use common::udp_frame;

/// Inserts the packet's flow (UDP source port) as a key; forwards the first packet of a
/// flow to port 1 and the others to port 2 after a lookup; drops when the table is full.
fn flows_program(table: Arc<HashTable>) -> Program {
    let mut p = Program::builder("flows");
    let a = p.label("a");
    let full = p.drop_reason("table_full");
    p.instr(a, move |t| {
        let key: [u8; 2] = t.head(34)?[..2].try_into().unwrap();
        match t.hash_insert(&table, &key, u16::from_be_bytes(key) as u64 * 10) {
            Ok(Inserted::New) => Ok(Done(Verdict::Forward(1))),
            Ok(Inserted::Existing(v)) => {
                assert_eq!(v, u16::from_be_bytes(key) as u64 * 10);
                assert_eq!(t.hash_lookup(&table, &key)?, Some(v));
                Ok(Done(Verdict::Forward(2)))
            }
            Err(HashError::Full { .. }) => Ok(Done(Verdict::Drop(full))),
            Err(e) => Err(e.into()),
        }
    });
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

#[test]
fn each_flow_is_created_once_by_256_threads_and_scans_see_ref_flags() {
    let table = Arc::new(HashTable::new(10_000, 256).unwrap());
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = Pfe::builder()
        .program(flows_program(table.clone()))
        .ppe_threads(256)
        .sink(sink.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    let frames: Vec<Vec<u8>> = (0..20_000u32)
        .map(|i| udp_frame((i % 500) as u16, i, 64))
        .collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    let s = pfe.shutdown();
    assert_eq!(sink.packets(1), 500, "one creation per flow");
    assert_eq!(sink.packets(2), 19_500);
    assert_eq!(table.len(), 500);
    assert_eq!(s.xtxns["hash_insert"], 20_000);
    assert_eq!(s.xtxns["hash_lookup"], 19_500);

    // Every record was referenced; after one scan clears the flags, a second sees none.
    let mut referenced = 0;
    for slice in 0..8 {
        table.scan(slice, 8, |_, _, was| {
            referenced += was as u32;
            ScanAction::Keep
        });
    }
    assert_eq!(referenced, 500);
    let mut idle = 0;
    table.scan(0, 1, |_, _, was| {
        idle += !was as u32;
        ScanAction::Delete
    });
    assert_eq!(idle, 500);
    assert!(table.is_empty());
}

#[test]
fn a_full_table_is_handled_by_the_program_and_a_long_key_faults() {
    let table = Arc::new(HashTable::new(10, 4).unwrap());
    let mut pfe = Pfe::builder()
        .program(flows_program(table.clone()))
        .ppe_threads(4)
        .build()
        .unwrap();
    pfe.start().unwrap();
    let frames: Vec<Vec<u8>> = (0..30u32).map(|i| udp_frame(i as u16, i, 64)).collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    let s = pfe.shutdown();
    assert_eq!(s.drops("table_full"), 20);
    assert_eq!(s.packets_out, 10);

    let mut p = Program::builder("long_key");
    let a = p.label("a");
    let t2 = table.clone();
    p.instr(a, move |t| {
        t.hash_lookup(&t2, &[0u8; 40])?;
        Ok(Done(Verdict::Forward(0)))
    });
    p.entry(Entry::Packet, a);
    let mut pfe = Pfe::builder().program(p.build().unwrap()).build().unwrap();
    pfe.start().unwrap();
    pfe.inject(Packet::new(0, udp_frame(1, 1, 64))).unwrap();
    let s = pfe.shutdown();
    assert_eq!(s.faults_of(FaultKind::Hash), 1);
    assert_eq!(s.drops("fault_hash"), 1);
}
