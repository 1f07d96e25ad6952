//! l3fwd's routes changed while it runs (`l3fwd::live::LiveRoutes`): after every add and
//! remove, the DIR-24-8 table in shared memory answers every address as the reference
//! longest-prefix match does; a change that needs room the table lacks is refused and
//! changes nothing; and a route added mid-stream takes effect for the packets after it.

mod common;

use std::sync::Arc;

use pfemu::mem::SharedMemory;
use pfemu::microcode::l3fwd::live::LiveRoutes;
use pfemu::microcode::l3fwd::{
    mask, udp_frame, L3fwd, Room, RouteTable, ENTRIES_PER_WORD, ENTRY_TBL8, TBL8_GROUP_WORDS,
};
use pfemu::prelude::*;
use pfemu::program::Harness;
use pfemu::rng::SplitMix64;

/// The port the table in memory forwards `addr` to (`None`: no route), read as the
/// program reads it: tbl24, perhaps tbl8, then the next hop's record.
fn port_in_memory(mem: &SharedMemory, l3: &L3fwd, addr: u32) -> Option<u16> {
    let entry = |base: u64, i: usize| -> u16 {
        let w = mem
            .read_u64(base + (i / ENTRIES_PER_WORD) as u64)
            .expect("in range");
        (w >> ((3 - i % ENTRIES_PER_WORD) * 16)) as u16
    };
    let mut e = entry(l3.tbl24_addr(), (addr >> 8) as usize);
    if e & ENTRY_TBL8 != 0 {
        let g = u64::from(e & !ENTRY_TBL8);
        e = entry(
            l3.tbl8_addr() + g * TBL8_GROUP_WORDS,
            (addr & 0xFF) as usize,
        );
    }
    let nh = e.checked_sub(1)?;
    let rec = mem
        .read_u64(l3.next_hop_addr() + 2 * u64::from(nh))
        .expect("a next hop");
    Some((rec >> 48) as u16)
}

/// Every route's first and last address and their neighbours, and random addresses in
/// the space the routes are drawn from.
fn probes(live: &LiveRoutes, rng: &mut SplitMix64) -> Vec<u32> {
    let mut out: Vec<u32> = (0..200)
        .map(|_| 0x0A00_0000 | rng.below(1 << 20) as u32)
        .collect();
    for (r, _) in live.routes() {
        let last = r.prefix | !mask(r.len);
        out.extend([
            r.prefix,
            last,
            r.prefix.wrapping_sub(1),
            last.wrapping_add(1),
        ]);
    }
    out
}

fn mem() -> Arc<SharedMemory> {
    Arc::new(SharedMemory::new(&MemConfig::default()).expect("the default memory"))
}

/// A random route in 10.0.0.0/12, of any length from /8 to /32, on ports 0-5.
fn random_route(rng: &mut SplitMix64) -> (u32, u8, u16) {
    let len = [8, 12, 16, 20, 22, 23, 24, 24, 25, 26, 28, 30, 32][rng.below(13) as usize];
    let addr = (0x0A00_0000 | rng.below(1 << 20) as u32) & mask(len);
    (addr, len, rng.below(6) as u16)
}

#[test]
fn every_change_leaves_the_table_equal_to_the_reference() {
    let mem = mem();
    let routes: RouteTable = "10.0.0.0/8 1\n10.1.0.0/16 2\n10.1.2.128/25 3\n"
        .parse()
        .expect("routes");
    let room = Room {
        tbl8_groups: 64,
        next_hops: 8,
    };
    let l3 = L3fwd::install_with_room(&mem, &routes, room).expect("installs");
    let live = LiveRoutes::new(&l3, Arc::clone(&mem), routes).expect("takes over");
    let mut rng = SplitMix64::new(7);
    let mut added = Vec::new();
    for step in 0..400 {
        // No packet runs here: every grace period is over at once. Groups freed come back
        // only with one, taken now and then.
        if step % 10 == 0 {
            live.release_retired(live.grace_ticket());
        }
        let remove = !added.is_empty() && rng.below(3) == 0;
        if remove {
            let (p, l) = added.swap_remove(rng.below(added.len() as u64) as usize);
            live.remove(p, l).expect("a valid prefix");
        } else {
            let (p, l, port) = random_route(&mut rng);
            match live.add(p, l, port) {
                Ok(()) => added.push((p, l)),
                // The room ran out: refused, and nothing changed (checked below).
                Err(e) => assert!(e.to_string().contains("tbl8 group"), "{e}"),
            }
        }
        for a in probes(&live, &mut rng) {
            assert_eq!(
                port_in_memory(&mem, &l3, a),
                live.lookup_port(a),
                "step {step}: {}",
                std::net::Ipv4Addr::from(a)
            );
        }
    }
    // Removing everything leaves only what was there and frees the groups it took.
    for (p, l) in added {
        live.remove(p, l).expect("a valid prefix");
    }
    let mut rng = SplitMix64::new(8);
    for a in probes(&live, &mut rng) {
        assert_eq!(port_in_memory(&mem, &l3, a), live.lookup_port(a));
    }
    let cap = l3.tbl8_capacity();
    assert_eq!(
        live.free_groups() + live.retired_groups(),
        cap - 1,
        "only 10.1.2.0/24's group in use"
    );
    live.release_retired(live.grace_ticket());
    assert_eq!((live.free_groups(), live.retired_groups()), (cap - 1, 0));
}

#[test]
fn changes_beyond_the_room_are_refused_and_change_nothing() {
    let mem = mem();
    let routes: RouteTable = "10.0.0.0/8 1\n".parse().expect("routes");
    let l3 = L3fwd::install_with_room(
        &mem,
        &routes,
        Room {
            tbl8_groups: 1,
            next_hops: 1,
        },
    )
    .expect("installs");
    let live = LiveRoutes::new(&l3, Arc::clone(&mem), routes).expect("takes over");
    let a = u32::from_be_bytes([10, 0, 1, 7]);
    // One group and one more next hop: a /25 on a new port fits.
    live.add(u32::from_be_bytes([10, 0, 1, 0]), 25, 2)
        .expect("room for one");
    assert_eq!(port_in_memory(&mem, &l3, a), Some(2));
    let e = live
        .add(u32::from_be_bytes([10, 0, 9, 0]), 25, 1)
        .expect_err("no group left");
    assert!(e.to_string().contains("tbl8 group"), "{e}");
    let e = live
        .add(u32::from_be_bytes([10, 5, 0, 0]), 16, 3)
        .expect_err("no next hop left");
    assert!(e.to_string().contains("next hop"), "{e}");
    assert_eq!(live.routes().len(), 2, "the refused routes were not added");
    assert_eq!(
        port_in_memory(&mem, &l3, u32::from_be_bytes([10, 5, 0, 1])),
        Some(1)
    );
    let e = live
        .add(u32::from_be_bytes([10, 0, 0, 1]), 8, 1)
        .expect_err("host bits");
    assert!(e.to_string().contains("host bits"), "{e}");
    // Removing the /25 retires its group: a lookup that read 10.0.1.0/24's pointer just
    // before may still read it, so another /24 may not take it yet.
    let early = live.grace_ticket();
    assert!(live
        .remove(u32::from_be_bytes([10, 0, 1, 0]), 25)
        .expect("valid"));
    assert!(!live
        .remove(u32::from_be_bytes([10, 0, 1, 0]), 25)
        .expect("valid"));
    assert_eq!((live.free_groups(), live.retired_groups()), (0, 1));
    assert_eq!(port_in_memory(&mem, &l3, a), Some(1), "unlinked at once");
    let nine = u32::from_be_bytes([10, 0, 9, 0]);
    let e = live.add(nine, 25, 2).expect_err("the group is retired");
    assert!(e.to_string().contains("waiting for a grace period"), "{e}");
    // A grace period begun before the removal does not free it; one begun after does.
    assert_eq!(live.release_retired(early), 0);
    assert_eq!(live.release_retired(live.grace_ticket()), 1);
    live.add(nine, 25, 2).expect("the group is free again");
    assert_eq!(port_in_memory(&mem, &l3, a), Some(1));
    assert_eq!(
        port_in_memory(&mem, &l3, u32::from_be_bytes([10, 0, 9, 7])),
        Some(2)
    );
}

/// Through the program: packets to 10.9.0.1 are dropped as `no_route` until the route is
/// added, between two packets, and forwarded after; removed, dropped again.
#[test]
fn a_route_added_mid_stream_takes_effect() {
    let mem = mem();
    let routes: RouteTable = "10.0.0.0/16 1\n".parse().expect("routes");
    let l3 = L3fwd::install_with_room(
        &mem,
        &routes,
        Room {
            tbl8_groups: 4,
            next_hops: 4,
        },
    )
    .expect("installs");
    let live = LiveRoutes::new(&l3, Arc::clone(&mem), routes).expect("takes over");
    let program = l3.program();
    let mut h = Harness::new(Arc::clone(&mem));
    let frame = udp_frame([10, 9, 0, 1], 64, 64);
    let verdict = |h: &mut Harness| h.run(&program, 0, &frame).result;
    assert!(matches!(verdict(&mut h), Ok(Verdict::Drop(_))));
    live.add(u32::from_be_bytes([10, 9, 0, 0]), 16, 3)
        .expect("added");
    assert_eq!(verdict(&mut h), Ok(Verdict::Forward(3)));
    live.add(u32::from_be_bytes([10, 9, 0, 0]), 31, 2)
        .expect("added");
    assert_eq!(verdict(&mut h), Ok(Verdict::Forward(2)));
    live.remove(u32::from_be_bytes([10, 9, 0, 0]), 31)
        .expect("removed");
    assert_eq!(verdict(&mut h), Ok(Verdict::Forward(3)));
    live.remove(u32::from_be_bytes([10, 9, 0, 0]), 16)
        .expect("removed");
    assert!(matches!(verdict(&mut h), Ok(Verdict::Drop(_))));
}

/// The edges of prefix length and overlap, each checked against the reference over every
/// probe: a default route /0, host routes /32 at both ends of the address space, the same
/// route added twice (the second replaces the first), and removing a route that covers
/// others (the ones inside keep theirs, the rest fall back to the route around it).
#[test]
fn default_and_host_routes_duplicates_and_removing_a_covering_route() {
    let mem = mem();
    let routes: RouteTable = "10.0.0.0/8 1\n".parse().expect("routes");
    let room = Room {
        tbl8_groups: 8,
        next_hops: 8,
    };
    let l3 = L3fwd::install_with_room(&mem, &routes, room).expect("installs");
    let live = LiveRoutes::new(&l3, Arc::clone(&mem), routes).expect("takes over");
    let ip = |a: [u8; 4]| u32::from_be_bytes(a);
    let check = |what: &str| {
        let mut rng = SplitMix64::new(11);
        let mut addrs = probes(&live, &mut rng);
        addrs.extend([
            0,
            1,
            u32::MAX,
            u32::MAX - 1,
            ip([11, 0, 0, 0]),
            ip([9, 255, 255, 255]),
        ]);
        for a in addrs {
            assert_eq!(
                port_in_memory(&mem, &l3, a),
                live.lookup_port(a),
                "{what}: {}",
                std::net::Ipv4Addr::from(a)
            );
        }
    };
    live.add(0, 0, 5).expect("a default route");
    assert_eq!(port_in_memory(&mem, &l3, ip([200, 1, 2, 3])), Some(5));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 1, 2, 3])), Some(1));
    check("after /0");
    live.add(0, 32, 2).expect("host route 0.0.0.0/32");
    live.add(u32::MAX, 32, 3)
        .expect("host route 255.255.255.255/32");
    live.add(ip([10, 1, 2, 3]), 32, 4)
        .expect("host route inside 10/8");
    assert_eq!(port_in_memory(&mem, &l3, 0), Some(2));
    assert_eq!(port_in_memory(&mem, &l3, 1), Some(5));
    assert_eq!(port_in_memory(&mem, &l3, u32::MAX), Some(3));
    assert_eq!(port_in_memory(&mem, &l3, u32::MAX - 1), Some(5));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 1, 2, 3])), Some(4));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 1, 2, 4])), Some(1));
    check("after the /32s");
    // The same route twice: the second replaces the first, one route is kept.
    let before = live.routes().len();
    live.add(ip([10, 1, 0, 0]), 16, 2).expect("added");
    live.add(ip([10, 1, 0, 0]), 16, 3).expect("replaced");
    assert_eq!(live.routes().len(), before + 1);
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 1, 9, 9])), Some(3));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 1, 2, 3])), Some(4));
    check("after the duplicate");
    // Remove 10.0.0.0/8, which covers 10.1.0.0/16 and 10.1.2.3/32: those keep theirs, the
    // rest of 10/8 falls back to the default route.
    assert!(live.remove(ip([10, 0, 0, 0]), 8).expect("valid"));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 2, 0, 1])), Some(5));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 1, 9, 9])), Some(3));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 1, 2, 3])), Some(4));
    check("after removing the /8");
    // And the default route, which covers everything.
    assert!(live.remove(0, 0).expect("valid"));
    assert_eq!(port_in_memory(&mem, &l3, ip([10, 2, 0, 1])), None);
    assert_eq!(port_in_memory(&mem, &l3, 1), None);
    assert_eq!(port_in_memory(&mem, &l3, 0), Some(2));
    check("after removing the /0");
}

/// Route changes while lookups run on other threads: each lookup, made as the program
/// makes it (tbl24, then perhaps tbl8, then the next hop), gives the port of the table as
/// it was before or after some change that overlapped the lookup, never a mix of entries
/// that no table state had. The writer publishes how many changes it has finished; a
/// lookup that saw `s0` finished before it started and `s1` after it ended may answer as
/// any state from `s0` to `s1 + 1` (the change under way when `s1` was read).
#[test]
fn lookups_racing_route_changes_see_a_state_before_or_after_each_change() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let mem = mem();
    let routes: RouteTable = "10.0.0.0/8 1\n10.1.0.0/16 2\n10.1.2.128/25 3\n"
        .parse()
        .expect("routes");
    let room = Room {
        tbl8_groups: 256,
        next_hops: 8,
    };
    let l3 = L3fwd::install_with_room(&mem, &routes, room).expect("installs");
    // The script of changes and the reference answer of every probe after each one.
    let mut rng = SplitMix64::new(21);
    let probes: Vec<u32> = (0..256)
        .map(|i| {
            if i % 2 == 0 {
                0x0A01_0200 | rng.below(1 << 10) as u32
            } else {
                0x0A00_0000 | rng.below(1 << 20) as u32
            }
        })
        .collect();
    let mut reference = routes.clone();
    let mut script = Vec::new();
    let mut present: Vec<(u32, u8)> = Vec::new();
    let mut expected = vec![probes
        .iter()
        .map(|&a| reference.lookup_port(a))
        .collect::<Vec<_>>()];
    for _ in 0..300 {
        if !present.is_empty() && rng.below(3) == 0 {
            let (p, l) = present.swap_remove(rng.below(present.len() as u64) as usize);
            reference.remove(p, l);
            script.push((p, l, None));
        } else {
            // Often inside 10.1.2.0/22, where the /25 and the groups are.
            let (mut p, l, port) = random_route(&mut rng);
            if rng.below(2) == 0 {
                p = (0x0A01_0200 | (p & 0x3FF)) & mask(l);
            }
            reference.insert_port(p, l, port).expect("a valid route");
            present.retain(|&r| r != (p, l));
            present.push((p, l));
            script.push((p, l, Some(port)));
        }
        expected.push(probes.iter().map(|&a| reference.lookup_port(a)).collect());
    }
    let live = LiveRoutes::new(&l3, Arc::clone(&mem), routes).expect("takes over");
    let done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let lookups = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for r in 0..3 {
            let (mem, l3, probes, expected) = (&mem, &l3, &probes, &expected);
            let (done, stop, lookups) = (&done, &stop, &lookups);
            s.spawn(move || {
                let mut i = r;
                while !stop.load(Ordering::Acquire) {
                    let k = i % probes.len();
                    let s0 = done.load(Ordering::Acquire);
                    let got = port_in_memory(mem, l3, probes[k]);
                    let s1 = done.load(Ordering::Acquire);
                    let last = (s1 + 1).min(expected.len() - 1);
                    assert!(
                        (s0..=last).any(|st| expected[st][k] == got),
                        "{} gave {got:?}, which no state from {s0} to {last} gives",
                        std::net::Ipv4Addr::from(probes[k])
                    );
                    lookups.fetch_add(1, Ordering::Relaxed);
                    i += 7;
                }
            });
        }
        for (n, &(p, l, port)) in script.iter().enumerate() {
            match port {
                Some(port) => live.add(p, l, port).expect("room for every change"),
                None => assert!(live.remove(p, l).expect("valid")),
            }
            done.store(n + 1, Ordering::Release);
            // Let the readers run between changes on a 2-core machine.
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Release);
    });
    assert!(lookups.load(Ordering::Relaxed) > 0, "the readers ran");
    // And the table ends as the reference says.
    for (k, &a) in probes.iter().enumerate() {
        assert_eq!(port_in_memory(&mem, &l3, a), expected[script.len()][k]);
    }
}
