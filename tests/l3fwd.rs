//! l3fwd against the reference longest-prefix match: egress ports, rewritten MACs, TTL and
//! checksum, every drop class, the DIR-24-8 table against the reference on overlapping
//! routes inserted in random order, route-file parsing and memory sizing.

use std::sync::Arc;

use pfemu::microcode::l3fwd::{
    mask, udp_frame, write_udp_frame, Dir248, L3fwd, L3fwdError, NextHop, RouteTable, DROP_REASONS,
};
use pfemu::prelude::*;
use pfemu::program::Harness;
use pfemu::rng::SplitMix64;
use pfemu::wire::{checksum, Ipv4};
use proptest::prelude::*;

fn mem() -> Arc<SharedMemory> {
    Arc::new(SharedMemory::new(&MemConfig::default()).expect("default memory"))
}

/// Overlapping routes: the generated table plus, inside some of its prefixes, longer and
/// shorter ones (so /25-/32 routes sit inside /24s and /16s that have routes too).
fn overlapping_table(seed: u64, n: usize, ports: u16) -> RouteTable {
    let mut t = RouteTable::generate(n, ports, seed).expect("generate");
    let mut rng = SplitMix64::new(seed ^ 0xABCD);
    let routes = t.routes();
    for _ in 0..n / 4 {
        let r = routes[rng.below(routes.len() as u64) as usize];
        let len = (r.len as u64 + 1 + rng.below(33 - r.len as u64)).min(32) as u8;
        let addr = (r.prefix | (rng.next_u64() as u32 & !mask(r.len))) & mask(len);
        let port = rng.below(u64::from(ports)) as u16;
        t.insert_port(addr, len, port).expect("insert");
        let shorter = rng.below(u64::from(r.len) + 1) as u8;
        if shorter >= 8 {
            let port = rng.below(u64::from(ports)) as u16;
            t.insert_port(r.prefix & mask(shorter), shorter, port)
                .expect("insert");
        }
    }
    t
}

/// A destination: mostly inside a random route, sometimes anywhere.
fn pick_dst(rng: &mut SplitMix64, routes: &[pfemu::microcode::l3fwd::Route]) -> u32 {
    if rng.below(10) == 0 {
        return rng.next_u64() as u32;
    }
    let r = routes[rng.below(routes.len() as u64) as usize];
    r.prefix | (rng.next_u64() as u32 & !mask(r.len))
}

#[test]
fn forwards_as_the_reference_lpm_says_and_rewrites_the_header() {
    for seed in [1u64, 2, 3] {
        let table = overlapping_table(seed, 3_000, 8);
        let mem = mem();
        let l3fwd = L3fwd::install(&mem, &table).expect("install");
        assert!(l3fwd.tbl8_groups() > 0, "the table exercises tbl8");
        let program = l3fwd.program();
        let mut h = Harness::new(mem);
        let routes = table.routes();
        let mut rng = SplitMix64::new(seed);
        let (mut forwarded, mut via_tbl8, mut unrouted) = (0, 0, 0);
        for i in 0..4_000 {
            let dst = pick_dst(&mut rng, &routes);
            let size = [64, 100, 191, 192, 600][i % 5];
            let ttl = 2 + rng.below(254) as u8;
            let mut frame = vec![0u8; size];
            let src = rng.next_u64() as u32;
            write_udp_frame(&mut frame, dst, src, 1000 + i as u16, ttl);
            // Vary the other header fields so the checksum update meets many sums.
            {
                let mut ip = Ipv4::new_unchecked(&mut frame[14..]);
                ip.set_ident(rng.next_u64() as u16);
                ip.set_dscp(rng.below(64) as u8);
                ip.set_checksum(0);
                ip.fill_checksum();
            }
            for (j, b) in frame[42..].iter_mut().enumerate() {
                *b = (i * 7 + j) as u8;
            }
            let out = h.run(&program, 0, &frame);
            let Some(nh) = table.lookup(dst) else {
                assert_eq!(
                    out.result.map(|v| match v {
                        Verdict::Drop(r) => program.drop_reason_name(r),
                        _ => "not a drop",
                    }),
                    Ok("no_route"),
                    "dst {dst:#x}"
                );
                unrouted += 1;
                continue;
            };
            let hop: NextHop = table.next_hops()[usize::from(nh)];
            assert_eq!(out.result, Ok(Verdict::Forward(hop.port)), "dst {dst:#x}");
            let o = out.output.expect("forwarded packets have output");
            assert_eq!(o.len(), frame.len());
            assert_eq!(&o[0..6], &hop.dst_mac.to_be_bytes()[2..8], "dst MAC");
            assert_eq!(&o[6..12], &hop.src_mac.to_be_bytes()[2..8], "src MAC");
            let ip = Ipv4::new_checked(&o[14..]).expect("ipv4");
            assert_eq!(ip.ttl(), ttl - 1);
            assert_eq!(
                ip.checksum(),
                ip.compute_checksum(),
                "incremental checksum equals a full recomputation (ttl {ttl})"
            );
            assert_eq!(checksum(&o[14..34]), 0);
            // Nothing else changed.
            assert_eq!(&o[12..22], &frame[12..22]);
            assert_eq!(&o[23..24], &frame[23..24]);
            assert_eq!(&o[26..], &frame[26..]);
            forwarded += 1;
            if routes
                .iter()
                .any(|r| r.len > 24 && r.prefix >> 8 == dst >> 8)
            {
                via_tbl8 += 1;
                assert_eq!(out.instructions, 3, "parse, lookup_tbl8, rewrite");
            }
        }
        assert!(
            forwarded > 3_000 && via_tbl8 > 0 && unrouted > 0,
            "{forwarded} {via_tbl8} {unrouted}"
        );
    }
}

#[test]
fn a_24_or_shorter_route_costs_two_instructions() {
    let table: RouteTable = "10.0.0.0/8 3\n".parse().expect("parse");
    let mem = mem();
    let program = L3fwd::install(&mem, &table).expect("install").program();
    let out = Harness::new(mem).run(&program, 0, &udp_frame([10, 9, 9, 9], 64, 64));
    assert_eq!(out.result, Ok(Verdict::Forward(3)));
    assert_eq!(out.instructions, 2);
}

/// A valid frame to a routed destination, then `f` applied to it.
fn broken(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut frame = udp_frame([10, 1, 2, 3], 64, 64);
    f(&mut frame);
    frame
}

fn refill(frame: &mut [u8]) {
    let mut ip = Ipv4::new_unchecked(&mut frame[14..]);
    ip.set_checksum(0);
    ip.fill_checksum();
}

fn invalid_cases() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "non_ipv4",
            broken(|f| f[12..14].copy_from_slice(&[0x08, 0x06])),
        ),
        (
            "non_ipv4",
            broken(|f| f[12..14].copy_from_slice(&[0x86, 0xDD])),
        ),
        ("truncated", udp_frame([10, 1, 2, 3], 64, 64)[..30].to_vec()),
        (
            "bad_version",
            broken(|f| {
                f[14] = 0x65;
                refill(f);
            }),
        ),
        (
            "bad_ihl",
            broken(|f| {
                f[14] = 0x44;
                refill(f);
            }),
        ),
        (
            "truncated",
            // ihl 15 (60 bytes) in a 64-byte frame: the header runs past the frame.
            broken(|f| f[14] = 0x4F),
        ),
        (
            "bad_length",
            broken(|f| {
                Ipv4::new_unchecked(&mut f[14..]).set_total_len(51);
                refill(f);
            }),
        ),
        (
            "bad_length",
            broken(|f| {
                Ipv4::new_unchecked(&mut f[14..]).set_total_len(19);
                refill(f);
            }),
        ),
        ("bad_checksum", broken(|f| f[24] ^= 0x40)),
        ("bad_checksum", broken(|f| f[30] ^= 0x01)),
        (
            "ttl_exceeded",
            broken(|f| {
                f[22] = 1;
                refill(f);
            }),
        ),
        (
            "ttl_exceeded",
            broken(|f| {
                f[22] = 0;
                refill(f);
            }),
        ),
        ("no_route", udp_frame([11, 1, 2, 3], 64, 64)),
        ("no_route", udp_frame([10, 1, 3, 3], 64, 64)),
    ]
}

fn invalid_table() -> RouteTable {
    // 11.1.2.3 misses in tbl24; 10.1.3.3 misses in the tbl8 group of 10.1.3.0/24, which
    // holds only 10.1.3.128/25.
    "10.1.2.0/24 1\n10.1.3.128/25 2\n".parse().expect("parse")
}

#[test]
fn every_invalid_class_is_dropped_with_its_reason() {
    let mem = mem();
    let program = L3fwd::install(&mem, &invalid_table())
        .expect("install")
        .program();
    assert_eq!(program.drop_reasons(), &DROP_REASONS[..]);
    let mut h = Harness::new(mem);
    // The valid frame is forwarded, so each case fails only through its own change.
    assert_eq!(
        h.run(&program, 0, &udp_frame([10, 1, 2, 3], 64, 64)).result,
        Ok(Verdict::Forward(1))
    );
    for (reason, frame) in invalid_cases() {
        let out = h.run(&program, 0, &frame);
        match out.result {
            Ok(Verdict::Drop(r)) => assert_eq!(program.drop_reason_name(r), reason),
            other => panic!("{reason}: got {other:?}"),
        }
        assert!(out.output.is_none());
    }
}

#[test]
fn full_pfe_counts_drops_by_reason_and_forwards_per_port() {
    let table = overlapping_table(7, 2_000, 4);
    let mem = mem();
    let program = L3fwd::install(&mem, &table).expect("install").program();
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = Pfe::builder()
        .program(program)
        .memory(mem)
        .ppe_threads(2)
        .ports(4)
        .sink(sink.clone())
        .build()
        .expect("build");
    pfe.start().expect("start");
    let mut rng = SplitMix64::new(99);
    let routes = table.routes();
    let mut expect_port = [0u64; 4];
    let mut frames = Vec::new();
    for i in 0..20_000u32 {
        let dst = pick_dst(&mut rng, &routes);
        let mut f = vec![0u8; 64];
        write_udp_frame(&mut f, dst, i, (i % 60_000) as u16, 64);
        if let Some(p) = table.lookup_port(dst) {
            expect_port[usize::from(p)] += 1;
        }
        frames.push(f);
    }
    let routed: u64 = expect_port.iter().sum();
    // The invalid cases use 10.1.x.x, which this table may route: only count them by
    // reason where the destination cannot matter (everything before the lookup).
    let invalid: Vec<(&str, Vec<u8>)> = invalid_cases()
        .into_iter()
        .filter(|(r, _)| *r != "no_route")
        .collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .expect("inject");
    for _ in 0..10 {
        pfe.inject_burst(invalid.iter().map(|(_, f)| (1, &f[..])))
            .expect("inject");
    }
    pfe.drain();
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    assert_eq!(stats.packets_out, routed);
    for p in 0..4u16 {
        assert_eq!(sink.packets(p), expect_port[usize::from(p)], "port {p}");
    }
    assert_eq!(stats.drops("no_route"), 20_000 - routed);
    for reason in DROP_REASONS.iter().filter(|r| **r != "no_route") {
        let n = invalid.iter().filter(|(r, _)| r == reason).count() as u64 * 10;
        assert_eq!(stats.drops(reason), n, "{reason}");
    }
}

#[test]
fn install_needs_room_for_tbl24() {
    let small = SharedMemory::new(&MemConfig {
        dram_bytes: 16 << 20,
        ..MemConfig::default()
    })
    .expect("memory");
    let table: RouteTable = "10.0.0.0/8 1\n".parse().expect("parse");
    let err = L3fwd::install(&small, &table).expect_err("16 MiB of DRAM is too small");
    assert!(matches!(err, L3fwdError::Memory { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("dram_bytes") && msg.contains("33554432"),
        "{msg}"
    );
    // Installing twice in one memory is refused by name, with the table named.
    let mem = mem();
    L3fwd::install(&mem, &table).expect("first install");
    let err = L3fwd::install(&mem, &table).expect_err("second install");
    assert!(err.to_string().contains("tbl24"), "{err}");
}

#[test]
fn route_file_parses_comments_blank_lines_and_lengths() {
    let text = "\
# a route file
10.0.0.0/8 1

10.1.0.0/16   2   # more specific
0.0.0.0/0 0
192.168.1.7/32 3
10.0.0.0/9 4
";
    let t: RouteTable = text.parse().expect("parse");
    assert_eq!(t.len(), 5);
    let port = |a: [u8; 4]| t.lookup_port(u32::from_be_bytes(a));
    assert_eq!(port([10, 1, 200, 1]), Some(2));
    assert_eq!(port([10, 2, 0, 1]), Some(4));
    assert_eq!(port([10, 200, 0, 1]), Some(1));
    assert_eq!(port([192, 168, 1, 7]), Some(3));
    assert_eq!(port([192, 168, 1, 8]), Some(0));
    assert_eq!(t.next_hops().len(), 5);
    let dir = Dir248::build(&t).expect("build");
    for a in [
        [10, 1, 200, 1],
        [10, 2, 0, 1],
        [192, 168, 1, 7],
        [192, 168, 1, 8],
    ] {
        let a = u32::from_be_bytes(a);
        assert_eq!(dir.lookup(a), t.lookup(a));
    }
}

#[test]
fn route_file_errors_name_the_line_and_the_problem() {
    let cases = [
        ("10.0.0.0/8 1\n10.0.0/8 1\n", 2, "not an IPv4 address"),
        ("\n\n10.0.0.0 1\n", 3, "no `/LEN`"),
        ("10.0.0.0/33 1", 1, "0 to 32"),
        ("10.0.0.0/x 1", 1, "0 to 32"),
        ("# c\n10.0.0.0/8\n", 2, "expected `A.B.C.D/LEN PORT`"),
        ("10.0.0.0/8 1 2\n", 1, "expected `A.B.C.D/LEN PORT`"),
        ("10.0.0.0/8 70000\n", 1, "port `70000`"),
        ("10.0.0.0/8 -1\n", 1, "port `-1`"),
        ("1.1.1.1/8 1\n1.2.3.4/24 1\n", 1, "host bits"),
        // A prefix on two lines, with another port or the same.
        (
            "10.0.0.0/8 1\n# x\n10.0.0.0/8 4\n",
            3,
            "10.0.0.0/8 is routed on line 1 already",
        ),
        ("0.0.0.0/0 2\n0.0.0.0/0 2\n", 2, "on line 1 already"),
    ];
    for (text, line, needle) in cases {
        match text.parse::<RouteTable>() {
            Err(e @ L3fwdError::Parse { line: l, .. }) => {
                assert_eq!(l, line, "{text:?}: {e}");
                let msg = e.to_string();
                assert!(
                    msg.starts_with(&format!("route file line {line}: ")),
                    "{msg}"
                );
                assert!(msg.contains(needle), "{text:?}: {msg}");
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    let missing = RouteTable::from_file(std::path::Path::new("/nonexistent/routes.txt"))
        .expect_err("no such file");
    assert!(missing.to_string().contains("/nonexistent/routes.txt"));
    assert!(!missing.to_string().contains("line 0"), "{missing}");
    let io = std::error::Error::source(&missing)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .expect("an unreadable file's error is the I/O error's");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn generated_routes_are_deterministic_and_mostly_24() {
    let a = RouteTable::generate(20_000, 8, 5).expect("generate");
    let b = RouteTable::generate(20_000, 8, 5).expect("generate");
    assert_eq!(a.len(), 20_000);
    assert_eq!(a.routes(), b.routes());
    let hist = a.length_histogram();
    let count = |r: std::ops::RangeInclusive<u8>| -> usize {
        hist.iter()
            .filter(|(l, _)| r.contains(l))
            .map(|(_, n)| n)
            .sum()
    };
    assert!(count(24..=24) > 10_000, "{hist:?}");
    assert!(count(16..=23) > 5_000, "{hist:?}");
    assert!((500..2_000).contains(&count(25..=32)), "{hist:?}");
    assert_eq!(count(0..=15), 0);
    assert!(a.next_hops().iter().all(|nh| usize::from(nh.port) < 8));
    assert_ne!(
        RouteTable::generate(100, 8, 6).expect("generate").routes(),
        RouteTable::generate(100, 8, 5).expect("generate").routes()
    );
}

fn route_strategy() -> impl Strategy<Value = (u32, u8, u16)> {
    // Prefixes clustered in 10.0.0.0/14 so that routes overlap, lengths 6 to 32 with
    // many above 24.
    (
        0u32..(1 << 18),
        prop_oneof![6u8..=24, 20u8..=32, 25u8..=32],
        0u16..6,
    )
        .prop_map(|(low, len, port)| {
            (
                (0x0A00_0000 | (low << 6) | (low % 64)) & mask(len),
                len,
                port,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn dir248_matches_the_reference_in_any_insertion_order(
        routes in prop::collection::vec(route_strategy(), 1..120),
        probes in prop::collection::vec(any::<u32>(), 200),
        shuffle in any::<u64>(),
    ) {
        let mut t = RouteTable::new();
        for &(prefix, len, port) in &routes {
            t.insert_port(prefix, len, port).expect("insert");
        }
        // The same routes in another order give the same table.
        let mut order: Vec<_> = routes.clone();
        let mut rng = SplitMix64::new(shuffle);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let dir = Dir248::build(&t).expect("build");
        let mut t2 = RouteTable::new();
        for &(_, _, port) in &routes {
            t2.port_next_hop(port).expect("next hop");
        }
        // Equal prefixes with different ports: keep the last one in both tables.
        let mut last = std::collections::HashMap::new();
        for &(prefix, len, port) in &routes {
            last.insert((prefix, len), port);
        }
        for &(prefix, len, _) in &order {
            t2.insert_port(prefix, len, last[&(prefix, len)]).expect("insert");
        }
        let dir2 = Dir248::build(&t2).expect("build");
        let mut addrs: Vec<u32> = probes.iter().map(|p| 0x0A00_0000 | (p & 0x00FF_FFFF)).collect();
        addrs.extend_from_slice(&probes);
        for &(prefix, len, _) in &routes {
            let last_addr = prefix | !mask(len);
            addrs.extend([prefix, last_addr, prefix.wrapping_sub(1), last_addr.wrapping_add(1)]);
        }
        for a in addrs {
            let want = t.lookup_port(a);
            let port = |d: &Dir248| d.lookup(a).map(|nh| d.next_hops()[usize::from(nh)].port);
            prop_assert_eq!(port(&dir), want, "addr {:#x}", a);
            prop_assert_eq!(port(&dir2), want, "addr {:#x} (shuffled)", a);
            prop_assert_eq!(t2.lookup_port(a), want);
        }
    }
}

/// What the module doc promises for packets that are valid but not plain: IPv4 options are
/// covered by the checksum and forwarded untouched (TTL and checksum still updated), and
/// fragments, first or later, are forwarded like any other packet.
#[test]
fn options_and_fragments_are_forwarded_and_options_are_checksummed() {
    let mem = mem();
    let program = L3fwd::install(&mem, &invalid_table())
        .expect("install")
        .program();
    let mut h = Harness::new(mem);
    // IHL 6: four option bytes (NOP, NOP, NOP, EOL) after the fixed header.
    let with_options = |corrupt_option: bool| {
        let plain = udp_frame([10, 1, 2, 3], 64, 64);
        let mut f = plain[..34].to_vec();
        f.extend_from_slice(&[1, 1, 1, 0]);
        f.extend_from_slice(&plain[34..60]);
        f[14] = 0x46;
        let mut ip = Ipv4::new_unchecked(&mut f[14..]);
        ip.set_total_len(50);
        ip.set_checksum(0);
        let sum = checksum(&f[14..38]);
        f[24..26].copy_from_slice(&sum.to_be_bytes());
        if corrupt_option {
            f[36] ^= 0x02;
        }
        f
    };
    let frame = with_options(false);
    let out = h.run(&program, 0, &frame);
    assert_eq!(out.result, Ok(Verdict::Forward(1)));
    let fwd = out.output.expect("forwarded bytes");
    assert_eq!(fwd[22], 63, "TTL decremented");
    assert_eq!(&fwd[34..38], &[1, 1, 1, 0], "options untouched");
    assert_eq!(
        checksum(&fwd[14..38]),
        0,
        "checksum over the options still valid"
    );
    let out = h.run(&program, 0, &with_options(true));
    match out.result {
        Ok(Verdict::Drop(r)) => assert_eq!(program.drop_reason_name(r), "bad_checksum"),
        other => panic!("a corrupted option byte: {other:?}"),
    }
    // Fragments: MF set at offset 0, and a later fragment (offset 185 * 8, MF clear).
    for (flags_offset, what) in [(0x2000u16, "first fragment"), (0x00B9, "last fragment")] {
        let frame = broken(|f| {
            f[20..22].copy_from_slice(&flags_offset.to_be_bytes());
            refill(f);
        });
        let out = h.run(&program, 0, &frame);
        assert_eq!(out.result, Ok(Verdict::Forward(1)), "{what}");
        let fwd = out.output.expect("forwarded bytes");
        assert_eq!(&fwd[20..22], &flags_offset.to_be_bytes(), "{what}");
        assert_eq!(checksum(&fwd[14..34]), 0, "{what}");
    }
}
