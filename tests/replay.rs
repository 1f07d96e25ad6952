//! pcap replay: captures built here go through the filter, l3fwd, Trio-ML and FPISA, and the
//! output captures are read back and compared with references computed here (per port, per
//! flow order, rewritten bytes, aggregated sums, partial Results of stragglers, the exact
//! dropped packets and their reasons); pcapng input enters on one port per interface; bad
//! captures give clear errors; the CLI writes what it reports.

#![cfg(feature = "lab")]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::simple_packet::SimplePacketBlock;
use pcap_file::pcapng::{Block, PcapNgWriter};
use pcap_file::{DataLink, Endianness};
use pfemu::fpisa::{Acc, Format, Variant};
use pfemu::lab::aggregation::{Aggregation, AggregationSetup, JobSpec};
use pfemu::lab::bench::traffic::{FrameClass, Mix, Traffic, TrafficSpec};
use pfemu::lab::replay::{
    replay_file, ReplayConfig, ReplayError, ReplayProgram, ReplayReport, Routes, Timing,
    MAX_PCAPNG_BLOCK_BYTES,
};
use pfemu::microcode::filter::DEFAULT_OUT_PORT;
use pfemu::microcode::l3fwd::{udp_frame, write_udp_frame, RouteTable};
use pfemu::microcode::trio_ml::{wire, TrioMlConfig};
use pfemu::rng::SplitMix64;

/// A fresh directory under the target dir for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("replay-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Writes `frames` as a classic pcap, frame `i` at 1000 s + `i` ms (or the given times).
fn write_capture(path: &Path, frames: &[Vec<u8>], times: Option<&[Duration]>) {
    let mut w = PcapWriter::new(Vec::new()).expect("pcap writer");
    for (i, f) in frames.iter().enumerate() {
        let ts = times.map_or(
            Duration::from_secs(1000) + Duration::from_millis(i as u64),
            |t| t[i],
        );
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
            .expect("write packet");
    }
    std::fs::write(path, w.into_writer()).expect("write capture");
}

/// Reads a capture back: (timestamp, original length, bytes) per packet.
fn read_capture(path: &Path) -> Vec<(Duration, u32, Vec<u8>)> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = PcapReader::new(f).expect("output is a pcap capture");
    assert_eq!(r.header().datalink, DataLink::ETHERNET);
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.expect("valid packet record");
        out.push((p.timestamp, p.orig_len, p.data.into_owned()));
    }
    out
}

fn frames_of(path: &Path) -> Vec<Vec<u8>> {
    read_capture(path).into_iter().map(|(_, _, d)| d).collect()
}

/// A frame's flow for ordering: its IPv4 addresses and UDP ports (bytes 26..38).
fn flow_of(frame: &[u8]) -> Vec<u8> {
    frame[26..38].to_vec()
}

/// Per flow, in order.
fn by_flow(frames: &[Vec<u8>]) -> BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    let mut m: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for f in frames {
        m.entry(flow_of(f)).or_default().push(f.clone());
    }
    m
}

/// Runs `tshark -r` on every file if tshark is installed: it must read each without an
/// error and decode every frame in it (one summary line per frame).
fn tshark_reads(files: &[PathBuf]) {
    if !have("tshark") {
        println!("skipped: tshark not installed");
        return;
    }
    for f in files {
        let out = std::process::Command::new("tshark")
            .arg("-r")
            .arg(f)
            .output()
            .expect("run tshark");
        assert!(
            out.status.success(),
            "tshark -r {}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).lines().count(),
            read_capture(f).len(),
            "tshark -r {}: one line per frame",
            f.display()
        );
    }
}

fn filter_traffic(packets: usize) -> Traffic {
    Traffic::generate(&TrafficSpec {
        packets,
        frame_size: 128,
        flows: 64,
        mix: Mix {
            ipv4: 55,
            ipv4_options: 15,
            ipv6: 15,
            non_ip: 15,
        },
        seed: 7,
        ..TrafficSpec::default()
    })
    .expect("traffic")
}

#[test]
fn filter_round_trip_writes_exactly_the_plain_ipv4_frames_on_port_1() {
    let dir = scratch("filter");
    let traffic = filter_traffic(5000);
    let frames: Vec<Vec<u8>> = traffic.iter().map(<[u8]>::to_vec).collect();
    let input = dir.join("in.pcap");
    write_capture(&input, &frames, None);
    let expected: Vec<Vec<u8>> = (0..traffic.len())
        .filter(|&i| traffic.class(i) == FrameClass::Ipv4)
        .map(|i| frames[i].clone())
        .collect();
    assert!(!expected.is_empty() && expected.len() < frames.len());

    // One PPE thread: the output is exactly the plain IPv4 frames in input order.
    let cfg = ReplayConfig {
        ppe_threads: 1,
        ..ReplayConfig::default()
    };
    let out = dir.join("one");
    let r = replay_file(&cfg, &input, &out).expect("replay");
    let port1 = out.join(format!("port{DEFAULT_OUT_PORT}.pcap"));
    assert_eq!(r.files, vec![port1.clone()]);
    assert_eq!(r.packets_in, 5000);
    assert_eq!(
        r.packets_out_by_port.get(&1),
        Some(&(expected.len() as u64))
    );
    assert_eq!(frames_of(&port1), expected);
    assert_eq!(
        r.dropped_by_reason.get("non_ip"),
        Some(&(traffic.count(FrameClass::NonIp).0 + traffic.count(FrameClass::Ipv6).0))
    );
    assert_eq!(
        r.dropped_by_reason.get("ip_options"),
        Some(&traffic.count(FrameClass::Ipv4Options).0)
    );
    assert!(r.drops.is_empty());
    // Egress timestamps are on the capture's timeline, in order.
    let got = read_capture(&port1);
    assert!(got
        .iter()
        .all(|(ts, _, _)| *ts >= Duration::from_secs(1000)));
    assert!(got.windows(2).all(|w| w[0].0 <= w[1].0));
    tshark_reads(&r.files);

    // Several PPE threads: the same frames, each flow in order.
    let cfg = ReplayConfig {
        ppe_threads: 3,
        ..ReplayConfig::default()
    };
    let out = dir.join("three");
    let r = replay_file(&cfg, &input, &out).expect("replay");
    assert_eq!(r.files, vec![out.join("port1.pcap")]);
    assert_eq!(by_flow(&frames_of(&r.files[0])), by_flow(&expected));
}

/// The reference of l3fwd: (port, rewritten frame) or the drop reason.
fn l3fwd_reference(routes: &RouteTable, frame: &[u8]) -> Result<(u16, Vec<u8>), &'static str> {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] {
        return Err("non_ipv4");
    }
    let ip = &frame[14..34];
    let sum = |h: &[u8]| {
        let mut s: u32 = h
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while s > 0xFFFF {
            s = (s & 0xFFFF) + (s >> 16);
        }
        s as u16
    };
    if sum(ip) != 0xFFFF {
        return Err("bad_checksum");
    }
    if ip[8] <= 1 {
        return Err("ttl_exceeded");
    }
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let Some(nh) = routes.lookup(dst) else {
        return Err("no_route");
    };
    let nh = routes.next_hops()[usize::from(nh)];
    let mut out = frame.to_vec();
    out[0..6].copy_from_slice(&nh.dst_mac.to_be_bytes()[2..]);
    out[6..12].copy_from_slice(&nh.src_mac.to_be_bytes()[2..]);
    out[22] -= 1;
    out[24..26].copy_from_slice(&[0, 0]);
    let c = !sum(&out[14..34]);
    out[24..26].copy_from_slice(&c.to_be_bytes());
    Ok((nh.port, out))
}

const ROUTES: &str = "10.0.0.0/8 1\n10.1.0.0/16 2\n10.1.2.128/25 3\n192.168.0.0/16 4\n";

/// l3fwd frames over several flows, with every fifth one made invalid in turn.
fn l3fwd_frames(n: usize) -> Vec<Vec<u8>> {
    let dsts: [[u8; 4]; 6] = [
        [10, 9, 9, 9],
        [10, 1, 7, 7],
        [10, 1, 2, 200],
        [192, 168, 3, 4],
        [172, 16, 0, 1],
        [10, 1, 2, 5],
    ];
    (0..n)
        .map(|i| {
            let dst = dsts[i % dsts.len()];
            let mut f = vec![0u8; 64 + (i % 7) * 50];
            write_udp_frame(
                &mut f,
                u32::from_be_bytes(dst),
                0x0A00_0100 + (i % 5) as u32,
                1024 + (i % 3) as u16,
                64,
            );
            for (j, b) in f[42..].iter_mut().enumerate() {
                *b = (i + j) as u8;
            }
            match i % 10 {
                5 => f[24] ^= 0xFF,                            // bad checksum
                7 => f = udp_frame(dst, 64, 1),                // TTL exceeded
                9 => f[12..14].copy_from_slice(&[0x86, 0xDD]), // not IPv4
                _ => {}
            }
            f
        })
        .collect()
}

#[test]
fn l3fwd_round_trip_matches_the_reference_per_port_and_the_drops_exactly() {
    let dir = scratch("l3fwd");
    let routes: RouteTable = ROUTES.parse().expect("routes");
    let frames = l3fwd_frames(3000);
    let input = dir.join("in.pcap");
    write_capture(&input, &frames, None);

    let mut expected: BTreeMap<u16, Vec<Vec<u8>>> = BTreeMap::new();
    let mut expected_drops: Vec<(u64, &str)> = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        match l3fwd_reference(&routes, f) {
            Ok((port, out)) => expected.entry(port).or_default().push(out),
            Err(reason) => expected_drops.push((i as u64, reason)),
        }
    }
    let reasons: std::collections::BTreeSet<&str> =
        expected_drops.iter().map(|&(_, r)| r).collect();
    assert_eq!(
        reasons.len(),
        4,
        "every drop class is exercised: {reasons:?}"
    );

    // Fast, two PPE threads: per port, the rewritten frames, each flow in order.
    let cfg = ReplayConfig {
        program: ReplayProgram::L3fwd(Routes::Table(routes.clone())),
        ppe_threads: 2,
        ..ReplayConfig::default()
    };
    let out = dir.join("fast");
    let r = replay_file(&cfg, &input, &out).expect("replay");
    let want_files: Vec<PathBuf> = expected
        .keys()
        .map(|p| out.join(format!("port{p}.pcap")))
        .collect();
    assert_eq!(r.files, want_files);
    for (port, want) in &expected {
        let got = frames_of(&out.join(format!("port{port}.pcap")));
        assert_eq!(got.len(), want.len(), "port {port}");
        assert_eq!(by_flow(&got), by_flow(want), "port {port}");
        assert_eq!(r.packets_out_by_port[port], want.len() as u64);
    }
    assert_eq!(r.dropped, expected_drops.len() as u64);
    tshark_reads(&r.files);

    // --drops: exact order, and dropped.pcap holds exactly the dropped inputs.
    let cfg = ReplayConfig {
        write_drops: true,
        ..cfg
    };
    let out = dir.join("drops");
    let r = replay_file(&cfg, &input, &out).expect("replay with drops");
    assert!(r.files.contains(&out.join("dropped.pcap")));
    for (port, want) in &expected {
        assert_eq!(&frames_of(&out.join(format!("port{port}.pcap"))), want);
    }
    let got: Vec<(u64, &str)> = r
        .drops
        .iter()
        .map(|d| (d.index, d.reason.as_str()))
        .collect();
    assert_eq!(got, expected_drops);
    let dropped = read_capture(&out.join("dropped.pcap"));
    assert_eq!(dropped.len(), expected_drops.len());
    for ((ts, len, data), &(i, _)) in dropped.iter().zip(&expected_drops) {
        let i = i as usize;
        assert_eq!(data, &frames[i], "dropped packet {i}");
        assert_eq!(*len as usize, frames[i].len());
        assert_eq!(
            *ts,
            Duration::from_secs(1000) + Duration::from_millis(i as u64)
        );
    }
    tshark_reads(&r.files);
}

#[test]
fn recorded_timing_follows_the_capture_scaled_by_speed() {
    let dir = scratch("recorded");
    let frames: Vec<Vec<u8>> = (0..5).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
    let t0 = Duration::from_secs(1_700_000_000);
    let times: Vec<Duration> = (0..5).map(|i| t0 + Duration::from_millis(50 * i)).collect();
    let input = dir.join("in.pcap");
    write_capture(&input, &frames, Some(&times));
    let cfg = ReplayConfig {
        timing: Timing::Recorded { speed: 2.0 },
        ppe_threads: 1,
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &input, &dir.join("out")).expect("replay");
    // 200 ms of capture at twice the speed.
    assert!(r.elapsed_s >= 0.095, "elapsed {}", r.elapsed_s);
    let got = read_capture(&dir.join("out/port1.pcap"));
    assert_eq!(got.len(), 5);
    for ((ts, _, _), want) in got.iter().zip(&times) {
        // On the capture's timeline: not before the input, and within a generous bound.
        assert!(
            *ts + Duration::from_millis(2) >= *want,
            "{ts:?} vs {want:?}"
        );
        assert!(*ts < *want + Duration::from_secs(2), "{ts:?} vs {want:?}");
    }

    let bad = ReplayConfig {
        timing: Timing::Recorded { speed: 0.0 },
        ..ReplayConfig::default()
    };
    let e = replay_file(&bad, &input, &dir.join("bad")).unwrap_err();
    assert!(e.to_string().contains("`speed`"), "{e}");
}

/// In capture time each output frame carries the capture time of the packet that caused
/// it, exactly, whatever the gaps (here 50 ms, and 1000 s that nothing waits for); a packet
/// timestamped before the one before it goes in at the clock's reading.
#[test]
fn capture_timing_stamps_each_frame_with_its_packets_capture_time() {
    let dir = scratch("capture-time");
    let frames: Vec<Vec<u8>> = (0..6).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
    let t0 = Duration::from_secs(1_700_000_000);
    let ms = Duration::from_millis;
    let times = [
        t0,
        t0 + ms(50),
        t0 + ms(100),
        t0 + ms(60), // backwards: at the clock's reading, t0 + 100 ms
        t0 + ms(150),
        t0 + Duration::from_secs(1000),
    ];
    let input = dir.join("in.pcap");
    write_capture(&input, &frames, Some(&times));
    let cfg = ReplayConfig {
        timing: Timing::Capture,
        ppe_threads: 2,
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &input, &dir.join("out")).expect("replay");
    assert_eq!(r.packets_out_by_port.get(&DEFAULT_OUT_PORT), Some(&6));
    let mut got: Vec<(Duration, Vec<u8>)> = read_capture(&dir.join("out/port1.pcap"))
        .into_iter()
        .map(|(ts, _, f)| (ts, f))
        .collect();
    got.sort();
    let mut want: Vec<(Duration, Vec<u8>)> = times
        .iter()
        .enumerate()
        .map(|(i, &t)| (if i == 3 { t0 + ms(100) } else { t }, frames[i].clone()))
        .collect();
    want.sort();
    assert_eq!(got, want);
    tshark_reads(&r.files);
}

#[test]
fn packets_captured_short_are_counted_and_replayed_as_captured() {
    let dir = scratch("snaplen");
    let full = udp_frame([10, 0, 0, 1], 1500, 64);
    let mut w = PcapWriter::with_header(
        Vec::new(),
        PcapHeader {
            snaplen: 96,
            ..PcapHeader::default()
        },
    )
    .expect("writer");
    w.write_packet(&PcapPacket::new(Duration::from_secs(1), 1500, &full[..96]))
        .expect("write");
    w.write_packet(&PcapPacket::new(Duration::from_secs(2), 64, &full[..64]))
        .expect("write");
    let input = dir.join("in.pcap");
    std::fs::write(&input, w.into_writer()).expect("write");
    let r = replay_file(&ReplayConfig::default(), &input, &dir.join("out")).expect("replay");
    assert_eq!((r.packets_in, r.truncated_in, r.bytes_in), (2, 1, 160));
    // The filter forwards them unchanged, as captured.
    assert_eq!(
        frames_of(&dir.join("out/port1.pcap")),
        vec![full[..96].to_vec(), full[..64].to_vec()]
    );
}

#[test]
fn bad_captures_fail_with_clear_errors() {
    let dir = scratch("bad");
    let out = dir.join("out");
    let cfg = ReplayConfig::default();
    let err = |name: &str, bytes: &[u8]| -> ReplayError {
        let p = dir.join(name);
        std::fs::write(&p, bytes).expect("write");
        let e = replay_file(&cfg, &p, &out).expect_err(name);
        assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        e
    };

    let e = err("text.pcap", b"this is not a capture at all\n");
    assert!(e.to_string().contains("not a pcap capture"), "{e}");
    let e = err("empty.pcap", b"");
    assert!(e.to_string().contains("empty"), "{e}");
    let e = err("ng.pcap", &[0x0A, 0x0D, 0x0D, 0x0A, 0, 0, 0, 0]);
    assert!(
        e.to_string().contains("pcapng") && e.to_string().contains("truncated"),
        "{e}"
    );

    // A good capture cut short: in its header, and in a packet record.
    let good = dir.join("good.pcap");
    write_capture(
        &good,
        &[
            udp_frame([10, 0, 0, 1], 100, 64),
            udp_frame([10, 0, 0, 2], 100, 64),
        ],
        None,
    );
    let bytes = std::fs::read(&good).expect("read");
    let e = err("short_header.pcap", &bytes[..10]);
    assert!(e.to_string().contains("truncated"), "{e}");
    let e = err("short_record.pcap", &bytes[..bytes.len() - 30]);
    assert!(
        e.to_string().contains("truncated") && e.to_string().contains("record 2"),
        "{e}"
    );
    assert!(!out.join("port1.pcap").exists(), "nothing written on error");
    // A record whose length field claims 32 MiB with 9 MiB of the file after it: the
    // length is corrupt, the file is not cut short.
    let mut corrupt = bytes[..bytes.len() - 30].to_vec();
    let second = corrupt.len() - (100 - 30) - 16;
    corrupt[second + 8..second + 12].copy_from_slice(&(32u32 << 20).to_le_bytes());
    corrupt.resize(corrupt.len() + (9 << 20), 0);
    let e = err("corrupt_length.pcap", &corrupt).to_string();
    assert!(
        e.contains("record 2") && e.contains("corrupt") && !e.contains("truncated"),
        "{e}"
    );

    // Not Ethernet.
    let mut w = PcapWriter::with_header(
        Vec::new(),
        PcapHeader {
            datalink: DataLink::RAW,
            ..PcapHeader::default()
        },
    )
    .expect("writer");
    w.write_packet(&PcapPacket::new(Duration::ZERO, 20, &[0x45; 20]))
        .expect("write");
    let e = err("raw.pcap", &w.into_writer());
    assert!(matches!(e, ReplayError::LinkType { .. }), "{e}");
    assert!(e.to_string().contains("Ethernet"), "{e}");

    // A missing file.
    let e = replay_file(&cfg, &dir.join("missing.pcap"), &out).unwrap_err();
    assert!(e.to_string().contains("missing.pcap"), "{e}");
}

#[test]
fn cli_replays_a_capture_and_reports_json() {
    let dir = scratch("cli");
    let traffic = filter_traffic(200);
    let frames: Vec<Vec<u8>> = traffic.iter().map(<[u8]>::to_vec).collect();
    let input = dir.join("in.pcap");
    write_capture(&input, &frames, None);
    let out = dir.join("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(["replay", "--pcap"])
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .args(["--drops", "--ppe-threads", "2", "--json"])
        .output()
        .expect("run pfemu");
    assert!(
        o.status.success(),
        "pfemu replay: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["packets_in"], 200);
    let plain = traffic.count(FrameClass::Ipv4).0;
    assert_eq!(v["packets_out_by_port"]["1"], plain);
    assert_eq!(
        v["drops"].as_array().map(Vec::len),
        Some(200 - plain as usize)
    );
    assert_eq!(frames_of(&out.join("port1.pcap")).len() as u64, plain);
    assert_eq!(
        frames_of(&out.join("dropped.pcap")).len() as u64,
        200 - plain
    );

    // A bad capture: exit status 2 and the file named on stderr.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pfemu"))
        .args(["replay", "--pcap", "Cargo.toml", "--out"])
        .arg(&out)
        .output()
        .expect("run pfemu");
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("Cargo.toml") && stderr.contains("not a pcap"),
        "{stderr}"
    );
}

// ----- aggregation: Trio-ML and FPISA --------------------------------------------------------

/// A frame of job `job`, block `block`, generation `gen` from source `src` (Figure 7), from
/// the worker's own addresses to the PFE (10.0.0.254, UDP 12000).
fn agg_frame(job: u8, block: u32, gen: u16, src: u8, grads: &[i32]) -> Vec<u8> {
    wire::agg_packet(&wire::AggPacket {
        endpoints: wire::Endpoints {
            src_mac: [2, 0, 0, 0, job, src],
            dst_mac: [2, 0, 0, 0, 0, 0xFE],
            src_addr: Ipv4Addr::new(10, 0, job, src + 1),
            dst_addr: TrioMlConfig::default().local_addr,
            src_port: wire::DEFAULT_UDP_PORT,
            dst_port: wire::DEFAULT_UDP_PORT,
        },
        hdr: wire::TrioMlHdrFields {
            job_id: job,
            block_id: block,
            src_id: src,
            gen_id: gen,
            grad_cnt: grads.len() as u16,
            ..Default::default()
        },
        gradients: grads,
    })
}

/// One expected Result: sources in it, degraded or not, its sums (gradient words).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Expected {
    src_cnt: u8,
    degraded: bool,
    sums: Vec<i32>,
}

/// The Results of a port's capture, by (job, block, generation).
fn results_of(path: &Path) -> BTreeMap<(u8, u32, u16), Expected> {
    let mut out = BTreeMap::new();
    for f in frames_of(path) {
        let (h, g) = wire::parse(&f).expect("a Result is a Trio-ML frame");
        let r = Expected {
            src_cnt: h.src_cnt,
            degraded: h.degraded,
            sums: wire::gradients(g),
        };
        assert_eq!(
            h.age_op != 0,
            h.degraded,
            "age_op and degraded agree (no lower level)"
        );
        assert!(
            out.insert((h.job_id, h.block_id, h.gen_id), r).is_none(),
            "one Result per block"
        );
    }
    out
}

/// Traffic of the jobs of an aggregation test: frames in capture order, the Results they
/// must produce per job, and the packets that must be dropped (index, reason).
#[derive(Default)]
struct AggCapture {
    frames: Vec<Vec<u8>>,
    results: BTreeMap<u8, BTreeMap<(u8, u32, u16), Expected>>,
    drops: Vec<(u64, &'static str)>,
    /// Kept Results sent back to a retransmission, on ingress port 0.
    answered: BTreeMap<(u8, u32, u16), Expected>,
}

impl AggCapture {
    /// Adds chunk `chunk` of a job whose workers send `window` block ids round-robin
    /// (block `chunk % window`, generation `chunk / window`): one frame per source in
    /// `sources` (the sources of the job that send it: `all` of them unless one is missing),
    /// each with its gradient words from `grads(src)`; `sum` folds the words of one
    /// gradient over the sources present into the expected Result's word.
    #[allow(clippy::too_many_arguments)]
    fn chunk(
        &mut self,
        job: u8,
        window: u32,
        chunk: u32,
        all: &[u8],
        sending: &[u8],
        grads: impl Fn(u8) -> Vec<i32>,
        sum: impl Fn(&[Vec<i32>], usize) -> i32,
    ) {
        let (block, gen) = (chunk % window, (chunk / window) as u16);
        let vectors: Vec<Vec<i32>> = sending.iter().map(|&s| grads(s)).collect();
        for (&s, v) in sending.iter().zip(&vectors) {
            self.frames.push(agg_frame(job, block, gen, s, v));
        }
        let sums = (0..vectors[0].len()).map(|i| sum(&vectors, i)).collect();
        self.results.entry(job).or_default().insert(
            (job, block, gen),
            Expected {
                src_cnt: sending.len() as u8,
                degraded: sending.len() < all.len(),
                sums,
            },
        );
    }

    /// Adds a frame the program must drop for `reason`.
    fn bad(&mut self, frame: Vec<u8>, reason: &'static str) {
        self.drops.push((self.frames.len() as u64, reason));
        self.frames.push(frame);
    }

    fn aggregated(&self) -> u64 {
        (self.frames.len() - self.drops.len()) as u64
    }

    fn results(&self) -> u64 {
        self.results.values().map(|r| r.len() as u64).sum::<u64>() + self.answered.len() as u64
    }
}

fn wrapping_sum(v: &[Vec<i32>], i: usize) -> i32 {
    v.iter().fold(0i32, |a, g| a.wrapping_add(g[i]))
}

/// Random gradient words over the whole `i32` range, so sums wrap.
fn random_words(seed: u64, n: usize) -> Vec<i32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| r.next_u64() as i32).collect()
}

fn trio_ml_capture() -> AggCapture {
    let mut c = AggCapture::default();
    let job1: Vec<u8> = (0..4).collect();
    let job2: Vec<u8> = vec![3, 4];
    // Job 1: 42 chunks of 50 gradients over 4 block ids (generations 0 to 10); job 2 (sources
    // 3 and 4): 3 chunks of 20, interleaved. The bad packets come in between.
    for chunk in 0..42u32 {
        c.chunk(
            1,
            4,
            chunk,
            &job1,
            &job1,
            |s| random_words(u64::from(chunk) << 8 | u64::from(s), 50),
            wrapping_sum,
        );
        if chunk < 3 {
            c.chunk(
                2,
                64,
                chunk,
                &job2,
                &job2,
                |s| random_words(1 << 20 | u64::from(chunk) << 8 | u64::from(s), 20),
                wrapping_sum,
            );
        }
        match chunk {
            1 => c.bad(agg_frame(1, 1, 0, 7, &[1; 50]), "unknown_source"),
            2 => c.bad(agg_frame(9, 0, 0, 0, &[1; 50]), "unknown_job"),
            4 => {
                // grad_cnt says 50, the frame carries 49.
                let mut f = agg_frame(1, 0, 1, 0, &[1; 49]);
                let mut h = wire::TrioMlHdr::new_checked(&mut f[wire::TRIO_ML_HDR_AT..]).unwrap();
                h.set_grad_cnt(50);
                c.bad(f, "bad_length");
            }
            6 => {
                let mut arp = udp_frame([10, 0, 0, 254], 64, 64);
                arp[12..14].copy_from_slice(&[0x08, 0x06]);
                c.bad(arp, "not_ipv4");
            }
            8 => c.bad(udp_frame([10, 9, 9, 9], 100, 64), "no_route"),
            _ => {}
        }
    }
    // Worker 0 sends its last chunk again (block 1, generation 10): the block is finished,
    // so the kept Result answers it on the port it came in on.
    c.bad(
        agg_frame(1, 1, 10, 0, &random_words(41 << 8, 50)),
        "retransmit_answered",
    );
    let kept = c.results[&1][&(1, 1, 10)].clone();
    c.answered.insert((1, 1, 10), kept);
    c
}

/// An aggregation program with the default window (64, so 128 slots per job: an as-fast
/// replay never runs a job out of slots, though it ignores the workers' windows).
fn aggregation(aggregation: Aggregation, jobs: &[&str], block_exp_ms: u8) -> ReplayProgram {
    ReplayProgram::Aggregation(AggregationSetup {
        block_exp_ms,
        ..AggregationSetup::new(
            aggregation,
            jobs.iter()
                .map(|j| j.parse::<JobSpec>().expect("job"))
                .collect(),
        )
    })
}

/// Checks a replay's Results (one capture per job port) and counters against `c`.
fn check_aggregation(c: &AggCapture, r: &ReplayReport, out: &Path) {
    for (job, want) in &c.results {
        let path = out.join(format!("port{job}.pcap"));
        assert_eq!(&results_of(&path), want, "job {job}'s Results");
        assert_eq!(r.packets_out_by_port[&u16::from(*job)], want.len() as u64);
    }
    if !c.answered.is_empty() {
        assert_eq!(results_of(&out.join("port0.pcap")), c.answered, "answers");
    }
    assert_eq!(r.packets_in, c.frames.len() as u64);
    assert_eq!(
        (r.forwarded, r.consumed, r.dropped, r.created, r.open_blocks),
        (0, c.aggregated(), c.drops.len() as u64, c.results(), 0)
    );
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    for &(_, reason) in &c.drops {
        *reasons.entry(reason.to_string()).or_default() += 1;
    }
    assert_eq!(r.dropped_by_reason, reasons);
}

#[test]
fn trio_ml_replay_writes_each_jobs_results_with_exact_sums_and_names_the_bad_packets() {
    let dir = scratch("trio-ml");
    let c = trio_ml_capture();
    let input = dir.join("in.pcap");
    write_capture(&input, &c.frames, None);
    // In capture time, with a block timeout beyond the capture's gaps (a block's packets are
    // at most 9 ms apart): every complete block completes, on any machine.
    let cfg = ReplayConfig {
        program: aggregation(Aggregation::TrioMl, &["1:4", "2:3..5"], 255),
        timing: Timing::Capture,
        ppe_threads: 2,
        ..ReplayConfig::default()
    };
    let out = dir.join("capture");
    let r = replay_file(&cfg, &input, &out).expect("replay");
    assert_eq!(r.program, "trio-ml");
    assert_eq!(
        r.files,
        ["port0.pcap", "port1.pcap", "port2.pcap"].map(|f| out.join(f))
    );
    check_aggregation(&c, &r, &out);
    tshark_reads(&r.files);

    // --drops: the same Results, and exactly the bad packets, as captured.
    let cfg = ReplayConfig {
        write_drops: true,
        ..cfg
    };
    let out = dir.join("drops");
    let r = replay_file(&cfg, &input, &out).expect("replay with drops");
    check_aggregation(&c, &r, &out);
    let got: Vec<(u64, u16, &str)> = r
        .drops
        .iter()
        .map(|d| (d.index, d.port, d.reason.as_str()))
        .collect();
    let want: Vec<(u64, u16, &str)> = c.drops.iter().map(|&(i, why)| (i, 0, why)).collect();
    assert_eq!(got, want);
    let dropped = frames_of(&out.join("dropped.pcap"));
    let want: Vec<Vec<u8>> = c
        .drops
        .iter()
        .map(|&(i, _)| c.frames[i as usize].clone())
        .collect();
    assert_eq!(dropped, want);
    tshark_reads(&r.files);
}

/// FP32 gradients through FPISA, checked bit for bit against `pfemu::fpisa`'s accumulator
/// (in capture order) and, the values being integers of few bits, against exact sums.
#[test]
fn fpisa_replay_sums_match_the_fpisa_reference_bit_for_bit() {
    let dir = scratch("fpisa");
    for (variant, name) in [(Variant::Full, "fpisa"), (Variant::Approx, "fpisa-approx")] {
        let workers: Vec<u8> = (0..4).collect();
        let mut c = AggCapture::default();
        for chunk in 0..6u32 {
            let grads = |s: u8| -> Vec<i32> {
                let mut r = SplitMix64::new(u64::from(chunk) << 8 | u64::from(s));
                (0..64)
                    .map(|_| {
                        let v = match variant {
                            // Integers in -1024..=1024: exact in FPISA's full variant.
                            Variant::Full => r.below(2049) as f32 - 1024.0,
                            // One binade, +-[2^20, 2^21): FPISA-A never shifts, so exact.
                            Variant::Approx => {
                                let m = ((1u64 << 20) + r.below(1 << 20)) as f32;
                                if r.next_u64() & 1 == 0 {
                                    m
                                } else {
                                    -m
                                }
                            }
                        };
                        v.to_bits() as i32
                    })
                    .collect()
            };
            c.chunk(1, 4, chunk, &workers, &workers, grads, |v, i| {
                let mut acc = Acc::ZERO;
                let mut exact = 0f64;
                for g in v {
                    acc.add_bits(g[i] as u32, Format::Fp32, variant);
                    exact += f64::from(f32::from_bits(g[i] as u32));
                }
                let bits = acc.value(Format::Fp32);
                assert_eq!(f32::from_bits(bits), exact as f32, "the reference is exact");
                bits as i32
            });
        }
        let input = dir.join(format!("{name}.pcap"));
        write_capture(&input, &c.frames, None);
        let cfg = ReplayConfig {
            program: aggregation(Aggregation::Fpisa(variant), &["1:4"], 255),
            timing: Timing::Capture,
            ppe_threads: 2,
            ..ReplayConfig::default()
        };
        let out = dir.join(name);
        let r = replay_file(&cfg, &input, &out).expect("replay");
        assert_eq!(r.program, name);
        check_aggregation(&c, &r, &out);
        tshark_reads(&r.files);
    }
}

/// Three chunks of job 1 (sources 0..4), frame `i` at 1000 s + `i` ms: worker 2 sends
/// nothing for chunk 1 (block 1), whose last packet is frame 6.
fn straggler_capture() -> AggCapture {
    let workers: Vec<u8> = (0..4).collect();
    let mut c = AggCapture::default();
    for chunk in 0..3u32 {
        let sending: Vec<u8> = if chunk == 1 {
            vec![0, 1, 3]
        } else {
            workers.clone()
        };
        c.chunk(
            1,
            4,
            chunk,
            &workers,
            &sending,
            |s| (0..30).map(|i| i * 10 + i32::from(s) - 100).collect(),
            wrapping_sum,
        );
    }
    c
}

/// A Result as it left: its (job, block, generation), sources, degraded flag, timestamp.
type TimedResult = ((u8, u32, u16), u8, bool, Duration);

/// The Results of a port's capture with their timestamps, in the order they left.
fn timed_results(path: &Path) -> Vec<TimedResult> {
    read_capture(path)
        .into_iter()
        .map(|(ts, _, f)| {
            let (h, _) = wire::parse(&f).expect("a Result is a Trio-ML frame");
            ((h.job_id, h.block_id, h.gen_id), h.src_cnt, h.degraded, ts)
        })
        .collect()
}

/// In capture time the straggler scan follows the capture's clock: the block missing a
/// worker times out exactly `block_exp` to `block_exp` + a scan period after its last
/// packet's timestamp, the full blocks' Results carry their last packet's timestamp, and a
/// host stall cannot split a block (the 50 ms timeout used to be on the wall clock, so a
/// PPE or replay thread held 50 ms between two packets of a chunk made a full block partial).
#[test]
fn a_block_missing_a_worker_times_out_and_its_partial_result_is_written() {
    let dir = scratch("straggler");
    let c = straggler_capture();
    let input = dir.join("in.pcap");
    write_capture(&input, &c.frames, None);
    let base = Duration::from_secs(1000);
    let ms = Duration::from_millis;
    let block_exp = ms(50);
    let scan = Duration::from_nanos(TrioMlConfig::default().scan_period_ns);
    let mut runs = Vec::new();
    for (write_drops, out) in [(false, "capture"), (true, "drops")] {
        let cfg = ReplayConfig {
            program: aggregation(Aggregation::TrioMl, &["1:4"], 50),
            timing: Timing::Capture,
            ppe_threads: 2,
            write_drops,
            ..ReplayConfig::default()
        };
        let out = dir.join(out);
        let r = replay_file(&cfg, &input, &out).expect("replay");
        // Two full Results and the partial one: 3 sources, degraded, their sums.
        check_aggregation(&c, &r, &out);
        assert!(r.drops.is_empty());
        let partial = results_of(&out.join("port1.pcap"))[&(1, 1, 0)].clone();
        assert_eq!((partial.src_cnt, partial.degraded), (3, true));
        let timed = timed_results(&out.join("port1.pcap"));
        let ts_of = |block: u32| {
            timed
                .iter()
                .find(|(k, ..)| k.1 == block)
                .map(|t| t.3)
                .expect("a Result of the block")
        };
        // The full Results leave with their last packets (frames 3 and 10).
        assert_eq!(ts_of(0), base + ms(3));
        assert_eq!(ts_of(2), base + ms(10));
        // The partial one: block_exp to block_exp + a scan period after frame 6.
        let last = base + ms(6);
        let ts = ts_of(1);
        assert!(
            ts >= last + block_exp && ts <= last + block_exp + scan,
            "the partial Result at {ts:?}, its last packet at {last:?}"
        );
        tshark_reads(&r.files);
        runs.push(timed);
    }
    // The same capture, the same Results at the same times, one packet at a time or not
    // (the Results of one port leave in time order: a drain comes before every clock move).
    assert_eq!(runs[0], runs[1]);
}

/// On the wall clock (`Timing::AsFast`) the outcome depends on the host's speed (a stall
/// of `block_exp` between two packets of a block splits it); what holds at any speed:
/// every packet is accounted for, no block stays open, the block missing a worker is
/// degraded, and its partial Result leaves at least `block_exp` after the first injection
/// on the capture's timeline.
#[test]
fn a_wall_clock_aggregation_replay_keeps_what_holds_at_any_speed() {
    let dir = scratch("straggler-wall");
    let c = straggler_capture();
    let input = dir.join("in.pcap");
    write_capture(&input, &c.frames, None);
    let cfg = ReplayConfig {
        program: aggregation(Aggregation::TrioMl, &["1:4"], 50),
        ppe_threads: 2,
        ..ReplayConfig::default()
    };
    let out = dir.join("fast");
    let r = replay_file(&cfg, &input, &out).expect("replay");
    assert_eq!(r.packets_in, c.frames.len() as u64);
    assert_eq!(
        r.forwarded + r.consumed + r.dropped,
        r.packets_in,
        "every packet accounted for"
    );
    assert_eq!(r.open_blocks, 0);
    let timed = timed_results(&out.join("port1.pcap"));
    let block1: Vec<_> = timed.iter().filter(|(k, ..)| *k == (1, 1, 0)).collect();
    assert!(!block1.is_empty(), "block 1 has a Result: {timed:?}");
    for &&(_, src_cnt, degraded, ts) in &block1 {
        assert!(degraded && src_cnt <= 3, "{timed:?}");
        assert!(
            ts >= Duration::from_secs(1000) + Duration::from_millis(50),
            "{ts:?}"
        );
    }
    for (key, want) in &c.results[&1] {
        let sources: u32 = (timed.iter())
            .filter(|(k, ..)| k == key)
            .map(|t| u32::from(t.1))
            .sum();
        assert!(
            sources <= u32::from(want.src_cnt),
            "{key:?}: {sources} sources in its Results"
        );
    }
    tshark_reads(&r.files);
}

#[test]
fn aggregation_settings_are_checked_and_named() {
    let dir = scratch("agg-config");
    let input = dir.join("in.pcap");
    write_capture(&input, &[agg_frame(1, 0, 0, 0, &[1])], None);
    let bad = |program: ReplayProgram, setting: &str| {
        let cfg = ReplayConfig {
            program,
            ..ReplayConfig::default()
        };
        let e = replay_file(&cfg, &input, &dir.join("out")).expect_err(setting);
        assert!(e.to_string().contains(&format!("`{setting}`")), "{e}");
    };
    let with = |f: &dyn Fn(&mut AggregationSetup)| {
        let mut a = AggregationSetup::new(Aggregation::TrioMl, vec!["1:4".parse().unwrap()]);
        f(&mut a);
        ReplayProgram::Aggregation(a)
    };
    bad(with(&|a| a.jobs.clear()), "jobs");
    bad(with(&|a| a.jobs.push("1:2".parse().unwrap())), "jobs");
    bad(with(&|a| a.window = 0), "window");
    bad(with(&|a| a.window = 2048), "window");
    bad(with(&|a| a.block_exp_ms = 0), "block_exp_ms");
    bad(with(&|a| a.block_grad_max = 4096), "block_grad_max");
}

#[test]
fn cli_replays_trio_ml_jobs_and_reports_json() {
    let dir = scratch("cli-trio-ml");
    let c = trio_ml_capture();
    let input = dir.join("in.pcap");
    write_capture(&input, &c.frames, None);
    let out = dir.join("out");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_pfemu"))
            .args(["replay", "--pcap"])
            .arg(&input)
            .arg("--out")
            .arg(&out)
            .args(args)
            .output()
            .expect("run pfemu")
    };
    // Job 2 comes from a jobs file.
    let jobs = dir.join("jobs.txt");
    std::fs::write(&jobs, "2:3..5  # the second job\n").unwrap();
    let o = run(&[
        "--program",
        "trio-ml",
        "--job",
        "1:4",
        "--jobs-file",
        jobs.to_str().unwrap(),
        "--block-exp-ms",
        "255",
        "--timing",
        "capture",
        "--window",
        "16",
        "--ppe-threads",
        "2",
        "--json",
    ]);
    assert!(
        o.status.success(),
        "pfemu replay: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["program"], "trio-ml");
    assert_eq!(v["packets_in"], c.frames.len() as u64);
    assert_eq!(v["consumed"], c.aggregated());
    assert_eq!(v["dropped"], c.drops.len() as u64);
    assert_eq!(v["created"], c.results());
    assert_eq!(v["open_blocks"], 0);
    assert_eq!(v["packets_out_by_port"]["1"], c.results[&1].len() as u64);
    assert_eq!(v["dropped_by_reason"]["unknown_source"], 1);
    assert_eq!(results_of(&out.join("port1.pcap")), c.results[&1]);
    assert_eq!(results_of(&out.join("port2.pcap")), c.results[&2]);

    // An aggregation program without jobs, and jobs without one: errors naming `--job`.
    for args in [
        &["--program", "trio-ml"][..],
        &["--program", "fpisa"][..],
        &["--job", "1:4"][..],
    ] {
        let o = run(args);
        assert!(!o.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains("`--job`"), "{args:?}: {stderr}");
    }
}

// ----- pcapng input ----------------------------------------------------------------------------

/// A pcapng interface for the writer: Ethernet, with `if_tsresol` when given and `if_name`.
fn idb(link: DataLink, tsresol: Option<u8>, name: &str) -> Block<'static> {
    let mut options = vec![InterfaceDescriptionOption::IfName(name.to_string().into())];
    if let Some(r) = tsresol {
        options.push(InterfaceDescriptionOption::IfTsResol(r));
    }
    Block::InterfaceDescription(InterfaceDescriptionBlock {
        linktype: link,
        snaplen: 0,
        options,
    })
}

/// An Enhanced Packet Block of `interface` whose timestamp field holds `ticks` (pcap-file
/// writes a `Duration`'s nanoseconds there, whatever the interface's resolution).
fn epb(interface: u32, ticks: u64, data: &[u8]) -> Block<'_> {
    Block::EnhancedPacket(EnhancedPacketBlock {
        interface_id: interface,
        timestamp: Duration::from_nanos(ticks),
        original_len: data.len() as u32,
        data: data.into(),
        options: vec![],
    })
}

#[test]
fn pcapng_interfaces_enter_on_consecutive_ports_at_their_own_timestamp_resolution() {
    let dir = scratch("pcapng");
    // Interface 0 counts nanoseconds (if_tsresol 9), interface 1 microseconds (no option).
    let t0 = Duration::new(1_700_000_000, 123_456_789);
    let ipv4 = |i: u8| udp_frame([10, 0, 0, i], 100 + usize::from(i), 64);
    let non_ip = |i: u8, len: usize| {
        let mut f = udp_frame([10, 0, 0, i], len, 64);
        f[12..14].copy_from_slice(&[0x86, 0xDD]);
        f
    };
    // (interface, time after t0 in us, frame)
    let packets: Vec<(u32, u64, Vec<u8>)> = vec![
        (0, 0, ipv4(1)),
        (1, 10, ipv4(2)),
        (1, 20, non_ip(3, 80)),
        (0, 30, non_ip(4, 90)),
        (0, 40, ipv4(5)),
        (1, 50, ipv4(6)),
    ];
    let mut w = PcapNgWriter::new(Vec::new()).expect("pcapng writer");
    w.write_block(&idb(DataLink::ETHERNET, Some(9), "eth0"))
        .expect("idb");
    w.write_block(&idb(DataLink::ETHERNET, None, "eth1"))
        .expect("idb");
    for (iface, us, f) in &packets {
        let t = t0 + Duration::from_micros(*us);
        let ticks = if *iface == 0 {
            t.as_nanos() as u64
        } else {
            t.as_micros() as u64
        };
        w.write_block(&epb(*iface, ticks, f)).expect("epb");
    }
    // A Simple Packet Block (interface 0, no timestamp) of 61 bytes: padded to 64 in the file.
    let spb = non_ip(7, 61);
    w.write_block(&Block::SimplePacket(SimplePacketBlock {
        original_len: 61,
        data: spb.clone().into(),
    }))
    .expect("spb");
    let input = dir.join("in.pcapng");
    std::fs::write(&input, w.into_inner()).expect("write");

    let cfg = ReplayConfig {
        ppe_threads: 1,
        port: 5,
        write_drops: true,
        ..ReplayConfig::default()
    };
    let out = dir.join("out");
    let r = replay_file(&cfg, &input, &out).expect("replay");
    assert_eq!(r.format, "pcapng");
    assert_eq!(r.packets_in, 7);
    assert_eq!(r.packets_in_by_port, BTreeMap::from([(5, 4), (6, 3)]));
    // The filter forwards the IPv4 frames on port 1, in order, and drops the others.
    assert_eq!(
        frames_of(&out.join("port1.pcap")),
        vec![ipv4(1), ipv4(2), ipv4(5), ipv4(6)]
    );
    let got: Vec<(u64, u16, &str)> = r
        .drops
        .iter()
        .map(|d| (d.index, d.port, d.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![(2, 6, "non_ip"), (3, 5, "non_ip"), (6, 5, "non_ip")]
    );
    // Dropped packets keep their input timestamps: microsecond and nanosecond interfaces
    // alike, and the untimed Simple Packet Block takes the one before it. Its padding is
    // not part of the packet.
    let dropped = read_capture(&out.join("dropped.pcap"));
    let want: Vec<(Duration, u32, Vec<u8>)> = vec![
        (Duration::new(1_700_000_000, 123_476_000), 80, non_ip(3, 80)),
        (t0 + Duration::from_micros(30), 90, non_ip(4, 90)),
        // The packet before it is interface 1's at t0 + 50 us, read in microseconds.
        (Duration::new(1_700_000_000, 123_506_000), 61, spb),
    ];
    assert_eq!(dropped, want);
    tshark_reads(&r.files);

    // A non-Ethernet interface is refused when a packet arrives on it, naming it.
    let mut w = PcapNgWriter::new(Vec::new()).expect("pcapng writer");
    w.write_block(&idb(DataLink::ETHERNET, None, "eth0"))
        .expect("idb");
    w.write_block(&idb(DataLink::RAW, None, "tun0"))
        .expect("idb");
    w.write_block(&epb(0, 1, &ipv4(1))).expect("epb");
    w.write_block(&epb(1, 2, &[0x45; 20])).expect("epb");
    let raw = dir.join("raw.pcapng");
    std::fs::write(&raw, w.into_inner()).expect("write");
    let e = replay_file(&ReplayConfig::default(), &raw, &dir.join("raw")).unwrap_err();
    assert!(matches!(e, ReplayError::LinkType { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("interface 1 (tun0)")
            && msg.contains("Ethernet")
            && msg.contains("raw.pcapng"),
        "{msg}"
    );

    // A capture cut inside a block.
    let bytes = std::fs::read(&input).expect("read");
    let cut = dir.join("cut.pcapng");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).expect("write");
    let e = replay_file(&ReplayConfig::default(), &cut, &dir.join("cut")).unwrap_err();
    assert!(
        e.to_string().contains("truncated") && e.to_string().contains("pcapng block"),
        "{e}"
    );
}

/// Whether a Wireshark command-line tool is installed.
fn have(tool: &str) -> bool {
    std::process::Command::new("which")
        .arg(tool)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A pcapng written by Wireshark's own tools (mergecap: one interface per input file, at
/// each file's timestamp resolution) enters on the ports and at the times tshark reads.
#[test]
fn pcapng_from_mergecap_matches_tshark_interfaces_and_times() {
    if !have("mergecap") || !have("tshark") {
        println!("skipped: mergecap or tshark not installed");
        return;
    }
    let dir = scratch("mergecap");
    // Two classic captures of non-IP frames (all dropped by the filter, so --drops lists
    // each with its port and writes its input timestamp): microseconds and nanoseconds.
    let frames = |first: u8, n: u8| -> Vec<Vec<u8>> {
        (first..first + n)
            .map(|i| {
                let mut f = udp_frame([10, 0, 0, i], 60 + usize::from(i), 64);
                f[12..14].copy_from_slice(&[0x86, 0xDD]);
                f
            })
            .collect()
    };
    let (a, b) = (frames(0, 5), frames(10, 4));
    let write = |path: &Path, frames: &[Vec<u8>], nanos: bool, t0: Duration, step: Duration| {
        let mut w = PcapWriter::with_header(
            Vec::new(),
            PcapHeader {
                ts_resolution: if nanos {
                    pcap_file::TsResolution::NanoSecond
                } else {
                    pcap_file::TsResolution::MicroSecond
                },
                ..PcapHeader::default()
            },
        )
        .expect("writer");
        for (i, f) in frames.iter().enumerate() {
            let ts = t0 + step * i as u32;
            w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
                .expect("write");
        }
        std::fs::write(path, w.into_writer()).expect("write");
    };
    let t0 = Duration::new(1_600_000_000, 0);
    write(
        &dir.join("a.pcap"),
        &a,
        false,
        t0 + Duration::from_micros(7),
        Duration::from_micros(1000),
    );
    write(
        &dir.join("b.pcap"),
        &b,
        true,
        t0 + Duration::from_nanos(500_123),
        Duration::from_nanos(1_000_001),
    );
    let merged = dir.join("merged.pcapng");
    let o = std::process::Command::new("mergecap")
        .args(["-I", "none", "-F", "pcapng", "-w"])
        .arg(&merged)
        .arg(dir.join("a.pcap"))
        .arg(dir.join("b.pcap"))
        .output()
        .expect("run mergecap");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let cfg = ReplayConfig {
        port: 3,
        write_drops: true,
        ..ReplayConfig::default()
    };
    let out = dir.join("out");
    let r = replay_file(&cfg, &merged, &out).expect("replay");
    assert_eq!(r.format, "pcapng");
    assert_eq!(r.packets_in_by_port, BTreeMap::from([(3, 5), (4, 4)]));
    // tshark's view of the same file: interface and time of every frame, in order.
    let o = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&merged)
        .args([
            "-T",
            "fields",
            "-e",
            "frame.interface_id",
            "-e",
            "frame.time_epoch",
        ])
        .output()
        .expect("run tshark");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tshark: Vec<(u16, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let (i, t) = l.split_once('\t').expect("two fields");
            (3 + i.parse::<u16>().expect("interface id"), t.to_string())
        })
        .collect();
    assert_eq!(tshark.len(), 9);
    let ports: Vec<u16> = r.drops.iter().map(|d| d.port).collect();
    assert_eq!(
        ports,
        tshark.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        "ports"
    );
    let dropped = read_capture(&out.join("dropped.pcap"));
    let times: Vec<String> = dropped
        .iter()
        .map(|(ts, _, _)| format!("{}.{:09}", ts.as_secs(), ts.subsec_nanos()))
        .collect();
    assert_eq!(
        times,
        tshark.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>(),
        "times"
    );
    // And the bytes are the inputs', merged in time order.
    let mut want: Vec<(Duration, Vec<u8>)> = a
        .iter()
        .enumerate()
        .map(|(i, f)| (t0 + Duration::from_micros(7 + 1000 * i as u64), f.clone()))
        .chain(b.iter().enumerate().map(|(i, f)| {
            (
                t0 + Duration::from_nanos(500_123 + 1_000_001 * i as u64),
                f.clone(),
            )
        }))
        .collect();
    want.sort();
    assert_eq!(
        dropped
            .into_iter()
            .map(|(ts, _, f)| (ts, f))
            .collect::<Vec<_>>(),
        want
    );
}

// ----- timestamps and speeds at the edges (issue 13) --------------------------------------------

/// Runs `f` on its own thread and waits for it until a deadline: a replay that hangs fails
/// the test, naming `what`, instead of hanging it.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{what} did not finish within 120 s ({e}): it hangs"))
}

/// A recorded replay whose schedule is longer than a week is refused up front, naming
/// `speed`: a gap of 2^32 - 1 s at speed 1e-10 (it used to panic in `div_f64`), and one
/// corrupt timestamp 900 000 000 s after the first at speed 1 (it used to wait 28 years).
#[test]
fn a_recorded_schedule_too_long_for_the_speed_is_refused() {
    for (speed, gap) in [(1e-10, u64::from(u32::MAX)), (1.0, 900_000_000)] {
        let dir = scratch("slow-speed");
        let frames: Vec<Vec<u8>> = (0..2).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
        let input = dir.join("in.pcap");
        let times = [Duration::ZERO, Duration::from_secs(gap)];
        write_capture(&input, &frames, Some(&times));
        let cfg = ReplayConfig {
            timing: Timing::Recorded { speed },
            ppe_threads: 1,
            ..ReplayConfig::default()
        };
        let out = dir.join("out");
        let e = within(&format!("a replay at speed {speed}"), move || {
            replay_file(&cfg, &input, &out)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .unwrap_err();
        assert!(e.contains("`speed`") && e.contains("too long"), "{e}");
        assert!(
            !dir.join("out").exists(),
            "nothing written, not even the directory"
        );
    }
}

/// A capture that is refused (empty, truncated) leaves the outputs of the replay before it
/// in the directory as they were: they used to be removed before the capture was read.
#[test]
fn a_refused_capture_leaves_the_earlier_outputs() {
    let dir = scratch("refused-keeps");
    let frames: Vec<Vec<u8>> = (0..4).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
    let good = dir.join("good.pcap");
    write_capture(&good, &frames, None);
    let out = dir.join("out");
    let cfg = ReplayConfig {
        ppe_threads: 1,
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &good, &out).unwrap();
    assert!(!r.files.is_empty(), "the good capture wrote outputs");
    let before: Vec<(PathBuf, Vec<u8>)> = r
        .files
        .iter()
        .map(|f| (f.clone(), std::fs::read(f).unwrap()))
        .collect();
    let bytes = std::fs::read(&good).unwrap();
    let capture = |name: &str, bad: &[u8]| {
        let path = dir.join(format!("{name}.pcap"));
        std::fs::write(&path, bad).unwrap();
        path
    };
    // Settings checked only in building the engine are refused before the outputs go too.
    let zero_threads = ReplayConfig {
        ppe_threads: 0,
        ..ReplayConfig::default()
    };
    let no_route_file = ReplayConfig {
        program: ReplayProgram::L3fwd(Routes::File(dir.join("no-such-routes.txt"))),
        ..cfg.clone()
    };
    for (name, path, cfg, says) in [
        ("empty", capture("empty", &bytes[..0]), &cfg, "empty"),
        (
            "truncated",
            capture("truncated", &bytes[..bytes.len() - 10]),
            &cfg,
            "truncated",
        ),
        ("ppe_threads 0", good.clone(), &zero_threads, "ppe_threads"),
        (
            "a missing route file",
            good.clone(),
            &no_route_file,
            "no-such-routes.txt",
        ),
    ] {
        let e = replay_file(cfg, &path, &out).expect_err(name).to_string();
        assert!(e.contains(says), "{name}: {e}");
        for (f, content) in &before {
            assert_eq!(
                std::fs::read(f).ok().as_ref(),
                Some(content),
                "{name}: {} is as the good replay left it",
                f.display()
            );
        }
    }
}

/// At a huge speed the egress timestamps (first input + wall time x speed) would pass the
/// last time a pcap capture can hold: they are clamped to it. This used to panic in
/// `mul_f64` on a PPE thread (in the sink) and hang the replay.
#[test]
fn a_huge_speed_clamps_egress_timestamps_and_never_hangs() {
    for drops in [false, true] {
        let dir = scratch(&format!("fast-speed-{drops}"));
        let frames: Vec<Vec<u8>> = (0..3).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
        let input = dir.join("in.pcap");
        write_capture(&input, &frames, None);
        let cfg = ReplayConfig {
            timing: Timing::Recorded { speed: 1e300 },
            ppe_threads: 1,
            write_drops: drops,
            ..ReplayConfig::default()
        };
        let out = dir.join("out");
        let r = within("a replay at speed 1e300", move || {
            replay_file(&cfg, &input, &out).map_err(|e| e.to_string())
        })
        .expect("replay");
        assert_eq!(r.forwarded, 3);
        assert_eq!(r.dropped, 0, "{:?}", r.dropped_by_reason);
        let last = Duration::new(u64::from(u32::MAX), 999_999_999);
        for (ts, _, _) in read_capture(&dir.join("out/port1.pcap")) {
            assert!(ts <= last, "{ts:?}");
        }
    }
}

/// pcapng timestamps past the last one a pcap output can hold (2106-02-07, 2^32 s after
/// 1970) are refused when the capture is read, with nothing written; they used to pass and
/// fail when the output was written.
#[test]
fn pcapng_timestamps_past_2106_are_refused_on_input() {
    let dir = scratch("pcapng-2106");
    let frame = udp_frame([10, 0, 0, 1], 64, 64);
    let mut w = PcapNgWriter::new(Vec::new()).expect("pcapng writer");
    w.write_block(&idb(DataLink::ETHERNET, Some(0), "eth0"))
        .expect("idb");
    // Resolution 1 s: ticks are seconds.
    w.write_block(&epb(0, 1_000, &frame)).expect("epb");
    w.write_block(&epb(0, 1 << 32, &frame)).expect("epb");
    let input = dir.join("in.pcapng");
    std::fs::write(&input, w.into_inner()).expect("write");
    let e = replay_file(&ReplayConfig::default(), &input, &dir.join("out")).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ReplayError::Capture { .. }), "{msg}");
    assert!(
        msg.contains("packet record 2") && msg.contains("2106"),
        "{msg}"
    );
    assert!(!dir.join("out/port1.pcap").exists(), "nothing written");
}

/// A pcapng block as raw little-endian bytes: `type_`, its total length, `body` padded to 4
/// bytes, the total length again.
fn raw_block(type_: u32, body: &[u8]) -> Vec<u8> {
    raw_block_in(Endianness::Little, type_, body)
}

/// A pcapng block as raw bytes of the byte order `endianness` (see [`raw_block`]).
fn raw_block_in(endianness: Endianness, type_: u32, body: &[u8]) -> Vec<u8> {
    let word = |v: u32| match endianness {
        Endianness::Big => v.to_be_bytes(),
        Endianness::Little => v.to_le_bytes(),
    };
    let len = (12 + body.len().next_multiple_of(4)) as u32;
    let mut b = Vec::with_capacity(len as usize);
    b.extend_from_slice(&word(type_));
    b.extend_from_slice(&word(len));
    b.extend_from_slice(body);
    b.resize(len as usize - 4, 0);
    b.extend_from_slice(&word(len));
    b
}

/// Where each block of a little-endian pcapng capture lies in `bytes`.
fn ng_blocks(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut blocks = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        blocks.push(at..at + len);
        at += len;
    }
    blocks
}

/// A little-endian pcapng capture: its Section Header Block, an Ethernet interface (block 2,
/// snap length `snaplen`) and an Enhanced Packet Block per frame (blocks 3, 4, ...).
fn ng_capture(snaplen: u32, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut w = PcapNgWriter::with_endianness(Vec::new(), Endianness::Little).expect("writer");
    w.write_block(&Block::InterfaceDescription(InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen,
        options: vec![],
    }))
    .expect("idb");
    for (i, f) in frames.iter().enumerate() {
        w.write_block(&epb(0, 1_000_000 * (i as u64 + 1), f))
            .expect("epb");
    }
    w.into_inner()
}

/// `bytes` with `block` inserted before its block `index` (0-based).
fn insert_block(bytes: &[u8], index: usize, block: &[u8]) -> Vec<u8> {
    let at = ng_blocks(bytes)[index].start;
    [&bytes[..at], block, &bytes[at..]].concat()
}

/// `bytes` with its block `index` (0-based) replaced by `with`.
fn replace_block(bytes: &[u8], index: usize, with: &[u8]) -> Vec<u8> {
    let r = ng_blocks(bytes)[index].clone();
    [&bytes[..r.start], with, &bytes[r.end..]].concat()
}

/// An Interface Description Block's body: Ethernet, snap length 0, then `options` (raw
/// bytes, each option's code and length included) and the end of options.
fn idb_body(options: &[u8]) -> Vec<u8> {
    let mut body = vec![1, 0, 0, 0, 0, 0, 0, 0];
    body.extend_from_slice(options);
    body.extend_from_slice(&[0; 4]);
    body
}

/// The error replaying `bytes` (written to `dir/name`) gives, as text.
fn replay_err(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    let e = replay_file(&ReplayConfig::default(), &p, &dir.join("out"))
        .expect_err(name)
        .to_string();
    assert!(e.contains(name), "{e}");
    assert!(!dir.join("out").exists(), "{name}: nothing written");
    e
}

/// A block whose content is malformed (an option or a field running past the block's end, an
/// option of the wrong length) is reported as malformed, naming the block. pcap-file's
/// streaming reader used to take a field running past its slice (its "need more bytes") for
/// a block the file had not given whole yet, read on, and report the file as truncated.
#[test]
fn a_malformed_pcapng_block_is_malformed_not_truncated() {
    let dir = scratch("pcapng-malformed");
    let frames: Vec<Vec<u8>> = (0..3).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
    let good = ng_capture(0, &frames);
    let le = |v: u16| v.to_le_bytes();
    let opt = |code: u16, len: u16, value: &[u8]| -> Vec<u8> {
        let mut o = [le(code), le(len)].concat();
        o.extend_from_slice(value);
        o.resize(4 + value.len().next_multiple_of(4), 0);
        o
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        // if_tsresol of length 0 (it is one byte).
        (
            "tsresol0",
            replace_block(&good, 1, &raw_block(1, &idb_body(&opt(9, 0, &[])))),
            "if_tsresol of 0 bytes (it is 1)",
        ),
        // A custom option (code 2989) too short for its 4-byte Private Enterprise Number.
        (
            "custom2",
            replace_block(&good, 1, &raw_block(1, &idb_body(&opt(2989, 2, &[1, 2])))),
            "custom option 2989 holds 2 bytes, less than its 4-byte Private Enterprise Number",
        ),
        // if_name not UTF-8.
        (
            "name",
            replace_block(
                &good,
                1,
                &raw_block(1, &idb_body(&opt(2, 2, &[0xff, 0xfe]))),
            ),
            "if_name is not UTF-8",
        ),
        // An option whose length runs past the block's end.
        (
            "optlen",
            replace_block(
                &good,
                1,
                &raw_block(
                    1,
                    &[&[1, 0, 0, 0, 0, 0, 0, 0][..], &opt(2, 200, &[])].concat(),
                ),
            ),
            "option 2 (200 bytes and its padding) runs past the block's end",
        ),
    ];
    for (name, bytes, why) in &cases {
        let e = replay_err(&dir, &format!("{name}.pcapng"), bytes);
        assert!(
            e.contains("pcapng block 2 (after 0 complete packets) is malformed")
                && e.contains(why)
                && !e.contains("truncated"),
            "{name}: {e}"
        );
    }

    // An Enhanced Packet Block whose captured length runs past the block's end (block 4,
    // after one good packet).
    let blocks = ng_blocks(&good);
    let mut bad = good.clone();
    let caplen = blocks[3].start + 20;
    bad[caplen..caplen + 4].copy_from_slice(&1000u32.to_le_bytes());
    let e = replay_err(&dir, "caplen.pcapng", &bad);
    assert!(
        e.contains("pcapng block 4 (after 1 complete packets) is malformed")
            && e.contains("captured_len")
            && !e.contains("truncated"),
        "{e}"
    );
    // A block whose two length fields differ.
    let mut bad = good.clone();
    let trailer = blocks[2].end - 4;
    bad[trailer..trailer + 4].copy_from_slice(&12u32.to_le_bytes());
    let e = replay_err(&dir, "trailer.pcapng", &bad);
    assert!(
        e.contains("pcapng block 3 (after 0 complete packets) is malformed")
            && !e.contains("truncated"),
        "{e}"
    );
    // The Section Header Block is named as such.
    let mut bad = good.clone();
    bad[27] = 1; // its trailing length no longer matches (28)
    let e = replay_err(&dir, "shb.pcapng", &bad);
    assert!(
        e.contains("its first pcapng block (the Section Header Block) is malformed"),
        "{e}"
    );
}

/// An interface's options as capture tools write them are read: `if_tzone` (4 bytes, which
/// pcap-file's parser refused), options replay does not know, and the ones it uses
/// (`if_tsresol`, `if_tsoffset`) applied to the packets' times.
#[test]
fn pcapng_interface_options_are_read_whatever_else_they_hold() {
    let dir = scratch("pcapng-idb-options");
    let opt = |code: u16, value: &[u8]| -> Vec<u8> {
        let mut o = [code.to_le_bytes(), (value.len() as u16).to_le_bytes()].concat();
        o.extend_from_slice(value);
        o.resize(4 + value.len().next_multiple_of(4), 0);
        o
    };
    let options = [
        opt(10, &[0, 0, 0, 0]),          // if_tzone
        opt(9, &[9]),                    // if_tsresol: nanoseconds
        opt(14, &1000i64.to_le_bytes()), // if_tsoffset: 1000 s
        opt(0x7777, &[1, 2, 3]),         // unknown to replay
        opt(2, b"eth9"),                 // if_name
    ]
    .concat();
    let mut non_ip = udp_frame([10, 0, 0, 1], 80, 64);
    non_ip[12..14].copy_from_slice(&[0x86, 0xDD]);
    let good = ng_capture(0, &[non_ip.clone()]);
    let bytes = replace_block(&good, 1, &raw_block(1, &idb_body(&options)));
    let input = dir.join("in.pcapng");
    std::fs::write(&input, bytes).expect("write");
    let cfg = ReplayConfig {
        write_drops: true,
        ..ReplayConfig::default()
    };
    let out = dir.join("out");
    let r = replay_file(&cfg, &input, &out).expect("replay");
    assert_eq!(r.packets_in, 1);
    // ng_capture's packet is at 1_000_000 ticks: 1 ms in nanoseconds, after the offset.
    let dropped = read_capture(&out.join("dropped.pcap"));
    assert_eq!(
        dropped,
        [(Duration::new(1000, 1_000_000), 80, non_ip)],
        "the packet's time"
    );
}

/// A little-endian Enhanced Packet Block of interface 0 at `ticks` holding `frame`, then
/// `options` (raw bytes, each option's code and length included; no end of options added).
fn raw_epb(ticks: u64, frame: &[u8], options: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for v in [
        0,
        (ticks >> 32) as u32,
        ticks as u32,
        frame.len() as u32,
        frame.len() as u32,
    ] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.extend_from_slice(frame);
    body.resize(body.len().next_multiple_of(4), 0);
    body.extend_from_slice(options);
    raw_block(6, &body)
}

/// A little-endian Section Header Block (version 1.0, section length unknown) with
/// `options` (raw bytes; no end of options added).
fn raw_shb(options: &[u8]) -> Vec<u8> {
    let mut body = vec![0x4D, 0x3C, 0x2B, 0x1A, 1, 0, 0, 0];
    body.extend_from_slice(&(-1i64).to_le_bytes());
    body.extend_from_slice(options);
    raw_block(0x0A0D_0D0A, &body)
}

/// A Section Header Block of pcapng version `major.minor` (little-endian, section length
/// unknown, no options).
fn raw_shb_version(major: u16, minor: u16) -> Vec<u8> {
    let mut body = vec![0x4D, 0x3C, 0x2B, 0x1A];
    body.extend_from_slice(&major.to_le_bytes());
    body.extend_from_slice(&minor.to_le_bytes());
    body.extend_from_slice(&(-1i64).to_le_bytes());
    raw_block(0x0A0D_0D0A, &body)
}

/// Replay reads sections of pcapng version 1.0, and 1.2, which some writers wrote and the
/// pcapng specification has readers take for 1.0. A Section Header Block of another version
/// (another major version is another format; another minor version of 1 may hold what a
/// reader of 1.0 cannot read) is refused, naming the block and the version: it used to be
/// read as 1.0 whatever its version said.
#[test]
fn pcapng_sections_of_another_version_are_refused() {
    let dir = scratch("pcapng-version");
    let frame = udp_frame([10, 0, 0, 1], 64, 64);
    let good = ng_capture(0, std::slice::from_ref(&frame));
    // The Section Header Block is block 0, the interface block 1, the packet block 2.
    let with_version =
        |major: u16, minor: u16| replace_block(&good, 0, &raw_shb_version(major, minor));
    let second_section = |major: u16, minor: u16| {
        [
            &good[..],
            &raw_shb_version(major, minor),
            &good[ng_blocks(&good)[1].start..],
        ]
        .concat()
    };
    for (name, bytes, packets) in [
        ("v1.0", with_version(1, 0), 1),
        ("v1.2", with_version(1, 2), 1),
        ("second-v1.2", second_section(1, 2), 2),
    ] {
        let input = dir.join(format!("{name}.pcapng"));
        std::fs::write(&input, &bytes).expect("write");
        let r = replay_file(&ReplayConfig::default(), &input, &dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.packets_in, packets, "{name}");
    }
    for (name, bytes, says) in [
        (
            "v2.0",
            with_version(2, 0),
            "its first pcapng block (the Section Header Block) says pcapng version 2.0; \
             replay reads version 1.0 (and 1.2, which the pcapng specification has readers \
             take for 1.0): another major version is another format",
        ),
        ("v0.0", with_version(0, 0), "says pcapng version 0.0"),
        (
            "v65535.0",
            with_version(u16::MAX, 0),
            "says pcapng version 65535.0",
        ),
        (
            "v1.1",
            with_version(1, 1),
            "says pcapng version 1.1; replay reads version 1.0 (and 1.2, which the pcapng \
             specification has readers take for 1.0): a later minor version may hold what a \
             reader of 1.0 cannot read",
        ),
        ("v1.3", with_version(1, 3), "says pcapng version 1.3"),
        (
            "second-v2.0",
            second_section(2, 0),
            "pcapng block 4 (after 1 complete packets) says pcapng version 2.0",
        ),
    ] {
        let e = replay_err(&dir, &format!("{name}.pcapng"), &bytes);
        assert!(e.contains(says), "{name}: {e}");
        assert!(!e.contains("malformed"), "{name}: {e}");
    }
}

/// pcapng lets a writer end a block's options at the block's end without `opt_endofopt`
/// ("readers must not assume it"); pcap-file's parser refused such an Enhanced Packet or
/// Section Header Block as "malformed: Invalid option". Replay reads them, and still names
/// an option of the wrong size or running past the block's end.
#[test]
fn pcapng_options_may_end_at_the_blocks_end_without_an_end_marker() {
    let dir = scratch("pcapng-no-endofopt");
    let frame = udp_frame([10, 0, 0, 1], 64, 64);
    let good = ng_capture(0, std::slice::from_ref(&frame));
    let epb_flags = [2, 0, 4, 0, 0, 0, 0, 0];
    // shb_userappl "pfemu" (5 bytes and 3 of padding).
    let userappl = [&[4, 0, 5, 0][..], b"pfemu", &[0, 0, 0]].concat();
    let cases = [
        (
            "epb",
            replace_block(&good, 2, &raw_epb(1_000_000, &frame, &epb_flags)),
        ),
        ("shb", replace_block(&good, 0, &raw_shb(&userappl))),
        (
            "both",
            replace_block(
                &replace_block(&good, 2, &raw_epb(1_000_000, &frame, &epb_flags)),
                0,
                &raw_shb(&userappl),
            ),
        ),
        // With the end marker and padding after it, as before.
        (
            "marked",
            replace_block(
                &good,
                2,
                &raw_epb(1_000_000, &frame, &[&epb_flags[..], &[0; 8]].concat()),
            ),
        ),
        // A second section whose header has no end marker either.
        (
            "second-section",
            [&good[..], &raw_shb(&userappl), &good[28..]].concat(),
        ),
    ];
    for (name, bytes) in &cases {
        let input = dir.join(format!("{name}.pcapng"));
        std::fs::write(&input, bytes).expect("write");
        let r = replay_file(&ReplayConfig::default(), &input, &dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = if *name == "second-section" { 2 } else { 1 };
        assert_eq!(
            (r.format.as_str(), r.packets_in),
            ("pcapng", want),
            "{name}"
        );
    }

    // Options are still checked, naming the field.
    for (name, bytes, why) in [
        (
            "flags2",
            replace_block(&good, 2, &raw_epb(1_000_000, &frame, &[2, 0, 2, 0, 0, 0, 0, 0])),
            "pcapng block 3 (after 0 complete packets) is malformed: epb_flags of 2 bytes (it is 4)",
        ),
        (
            "flagslong",
            replace_block(&good, 2, &raw_epb(1_000_000, &frame, &[2, 0, 8, 0, 0, 0, 0, 0])),
            "pcapng block 3 (after 0 complete packets) is malformed: option 2 (8 bytes and its \
             padding) runs past the block's end",
        ),
        (
            "shbopt",
            replace_block(&good, 0, &raw_shb(&[4, 0, 9, 0, b'p', b'f', 0, 0])),
            "its first pcapng block (the Section Header Block) is malformed: option 4 (9 bytes \
             and its padding) runs past the block's end",
        ),
    ] {
        let e = replay_err(&dir, &format!("{name}.pcapng"), &bytes);
        assert!(e.contains(why), "{name}: {e}");
    }
}

/// A capture cut inside a block is truncated (inside a block's header or body, the block
/// named); one that ends between blocks is read to its end; a block whose length field is
/// impossible is corrupt, also when the file goes on after it, and nothing is allocated for
/// the length it claims.
#[test]
fn pcapng_blocks_are_framed_before_they_are_parsed() {
    let dir = scratch("pcapng-framing");
    let frames: Vec<Vec<u8>> = (0..3).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
    let good = ng_capture(0, &frames);
    let blocks = ng_blocks(&good);
    assert_eq!(blocks.len(), 5);

    for (name, cut) in [
        ("cut_body", blocks[3].start + 40),
        ("cut_header", blocks[3].start + 5),
        ("cut_trailer", blocks[3].end - 1),
    ] {
        let e = replay_err(&dir, &format!("{name}.pcapng"), &good[..cut]);
        assert!(
            e.contains("truncated: the file ends inside pcapng block 4 (after 1 complete packets)"),
            "{name}: {e}"
        );
    }
    let e = replay_err(&dir, "cut_shb.pcapng", &good[..20]);
    assert!(
        e.contains(
            "truncated: the file ends inside its first pcapng block (the Section Header Block)"
        ),
        "{e}"
    );
    // Cut between blocks: the two packets before the cut.
    let p = dir.join("two.pcapng");
    std::fs::write(&p, &good[..blocks[3].end]).expect("write");
    let cfg = ReplayConfig {
        ppe_threads: 1,
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &p, &dir.join("two")).expect("replay");
    assert_eq!((r.format.as_str(), r.packets_in), ("pcapng", 2));

    // Block 3's length field: 2 GiB - 16 with the rest of the file (two blocks) after it,
    // not a multiple of 4, below the 12 bytes of a block's frame.
    for (len, says) in [
        (0x7fff_fff0u32, "claims 2147483632 bytes"),
        (0x0000_0102, "length 258, not a multiple of 4"),
        (8, "length 8, less than the 12 bytes"),
    ] {
        let mut bad = good.clone();
        let at = blocks[2].start + 4;
        bad[at..at + 4].copy_from_slice(&len.to_le_bytes());
        let e = replay_err(&dir, &format!("len{len}.pcapng"), &bad);
        assert!(
            e.contains("pcapng block 3 (after 0 complete packets)")
                && e.contains(says)
                && e.contains("the file is corrupt")
                && !e.contains("truncated"),
            "{e}"
        );
    }
    // A block with a Section Header Block's type but no byte-order magic: the byte order
    // of its length is unknown.
    let mut bad = good.clone();
    bad[blocks[2].start..blocks[2].start + 4].copy_from_slice(&[0x0A, 0x0D, 0x0D, 0x0A]);
    let e = replay_err(&dir, "magic.pcapng", &bad);
    assert!(
        e.contains("pcapng block 3 (after 0 complete packets): its byte-order magic is 0x00000000")
            && e.contains("the file is corrupt"),
        "{e}"
    );
}

/// A Simple Packet Block carries min(original length, interface 0's snap length) bytes; one
/// holding fewer is refused (its padding used to be replayed as packet data), and one
/// before any Interface Description Block names the missing interface.
#[test]
fn a_simple_packet_block_shorter_than_its_captured_length_is_refused() {
    let dir = scratch("pcapng-short-spb");
    let spb = |original_len: u32, data: &[u8]| {
        let mut body = original_len.to_le_bytes().to_vec();
        body.extend_from_slice(data);
        raw_block(3, &body)
    };
    let frame = udp_frame([10, 0, 0, 1], 100, 64);
    for (snaplen, calls_for) in [(0u32, 100), (80, 80)] {
        // 61 bytes, padded to 64 in the block.
        let bytes = [ng_capture(snaplen, &[]), spb(100, &frame[..61])].concat();
        let e = replay_err(&dir, &format!("short{snaplen}.pcapng"), &bytes);
        assert!(
            e.contains(&format!(
                "packet record 1 (block 3): a Simple Packet Block holding 64 bytes where its \
                 original length 100 and interface 0's snaplen {snaplen} call for {calls_for}: \
                 the file is corrupt"
            )),
            "{e}"
        );
    }
    // Snap length 80: 80 bytes of the 100 are the whole packet as captured.
    let p = dir.join("snap80.pcapng");
    std::fs::write(&p, [ng_capture(80, &[]), spb(100, &frame[..80])].concat()).expect("write");
    let cfg = ReplayConfig {
        ppe_threads: 1,
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &p, &dir.join("snap80")).expect("replay");
    assert_eq!((r.packets_in, r.bytes_in, r.truncated_in), (1, 80, 1));

    // No interface before it.
    let shb = &ng_capture(0, &[])[..28];
    let e = replay_err(
        &dir,
        "noidb.pcapng",
        &[shb, &spb(64, &frame[..64])].concat(),
    );
    assert!(
        e.contains(
            "packet record 1 (block 2) is on interface 0, but the section describes 0 interfaces"
        ),
        "{e}"
    );
}

/// A Decryption Secrets Block's body in the byte order `endianness`: a TLS key log
/// (secrets type "TLSK") of `len` bytes, as `editcap --inject-secrets tls,KEYLOG` writes it.
fn dsb_body(endianness: Endianness, len: usize) -> Vec<u8> {
    let word = |v: u32| match endianness {
        Endianness::Big => v.to_be_bytes(),
        Endianness::Little => v.to_le_bytes(),
    };
    let mut body = [word(0x544C_534B), word(len as u32)].concat();
    body.extend(std::iter::repeat_n(b'k', len));
    body
}

/// Type of a pcapng Decryption Secrets Block.
const DSB: u32 = 0x0000_000A;
/// Type of a pcapng custom block (that may not be copied).
const CUSTOM: u32 = 0x4000_0BAD;

/// The three frames of [`ng_capture`] with blocks that carry no packet between them, larger
/// than any block replay parses: SHB, IDB, a 1 MiB Decryption Secrets Block (block 3), EPB,
/// a 400 KiB custom block (block 5), EPB, a block of a type pcapng does not define
/// (block 7), EPB (block 8).
fn ng_capture_with_skipped_blocks(frames: &[Vec<u8>]) -> Vec<u8> {
    let dsb = raw_block(DSB, &dsb_body(Endianness::Little, 1 << 20));
    assert!(dsb.len() > MAX_PCAPNG_BLOCK_BYTES as usize);
    let custom_body = [&32473u32.to_le_bytes()[..], &vec![7; 400 << 10]].concat();
    let custom = raw_block(CUSTOM, &custom_body);
    assert!(custom.len() > MAX_PCAPNG_BLOCK_BYTES as usize);
    let unknown = raw_block(0x0000_0FFF, &[1, 2, 3, 4, 5]);
    let bytes = ng_capture(0, frames);
    let bytes = insert_block(&bytes, 4, &unknown);
    let bytes = insert_block(&bytes, 3, &custom);
    insert_block(&bytes, 2, &dsb)
}

/// Blocks that carry no packet (decryption secrets, custom, unknown, ...) are skipped
/// whatever their length, in either byte order, and still count in the blocks' numbering; a
/// block replay parses is still bounded by `MAX_PCAPNG_BLOCK_BYTES`.
#[test]
fn pcapng_blocks_without_packets_are_skipped_whatever_their_length() {
    let dir = scratch("pcapng-skip");
    let frames: Vec<Vec<u8>> = (0..4).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
    let le = ng_capture_with_skipped_blocks(&frames[..3]);
    assert_eq!(ng_blocks(&le).len(), 8);
    // A big-endian section after it: IDB, a 1 MiB Decryption Secrets Block, EPB.
    let mut w = PcapNgWriter::with_endianness(Vec::new(), Endianness::Big).expect("writer");
    w.write_block(&idb(DataLink::ETHERNET, None, "eth0"))
        .expect("idb");
    w.get_mut().extend(raw_block_in(
        Endianness::Big,
        DSB,
        &dsb_body(Endianness::Big, 1 << 20),
    ));
    w.write_block(&epb(0, 4_000_000, &frames[3])).expect("epb");
    let bytes = [le.clone(), w.into_inner()].concat();

    let p = dir.join("in.pcapng");
    std::fs::write(&p, &bytes).expect("write");
    let cfg = ReplayConfig {
        ppe_threads: 1,
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &p, &dir.join("ok")).expect("replay");
    assert_eq!((r.format.as_str(), r.packets_in), ("pcapng", 4));
    assert_eq!(frames_of(&dir.join("ok/port1.pcap")), frames);

    // Blocks after skipped ones are numbered as they lie in the file: a corrupt length in
    // the last packet block of the first section (block 8, after 2 packets), over the bound
    // of a block that is parsed.
    let blocks = ng_blocks(&le);
    let mut bad = le.clone();
    let at = blocks[7].start + 4;
    bad[at..at + 4].copy_from_slice(&(MAX_PCAPNG_BLOCK_BYTES + 4).to_le_bytes());
    let e = replay_err(&dir, "bound.pcapng", &bad);
    assert!(
        e.contains("pcapng block 8 (after 2 complete packets) claims")
            && e.contains("more than an Enhanced Packet Block can be")
            && e.contains("the file is corrupt")
            && !e.contains("truncated"),
        "{e}"
    );
}

/// A file that ends inside a skipped block (its length field claiming more than the file
/// holds included) is truncated; a skipped block whose trailing length differs from its
/// leading one, or whose length cannot be right, is corrupt.
#[test]
fn a_skipped_pcapng_block_is_framed_like_any_other() {
    let dir = scratch("pcapng-skip-errors");
    let frames: Vec<Vec<u8>> = (0..3).map(|i| udp_frame([10, 0, 0, i], 64, 64)).collect();
    let good = ng_capture_with_skipped_blocks(&frames);
    let blocks = ng_blocks(&good);

    // Cut inside the secrets' body, inside the custom block's trailer, inside the unknown
    // block's header.
    for (name, cut, says) in [
        (
            "cut_dsb",
            blocks[2].start + 1000,
            "block 3 (after 0 complete",
        ),
        ("cut_custom", blocks[4].end - 2, "block 5 (after 1 complete"),
        (
            "cut_unknown",
            blocks[6].start + 6,
            "block 7 (after 2 complete",
        ),
    ] {
        let e = replay_err(&dir, &format!("{name}.pcapng"), &good[..cut]);
        assert!(
            e.contains(&format!("truncated: the file ends inside pcapng {says}")),
            "{name}: {e}"
        );
    }
    // The secrets' length field claiming more than the file holds, the file going on after
    // it: truncated, whatever the length (no bound for a skipped block but a u32's).
    for len in [0x7fff_fff0u32, 0xffff_fffc] {
        let mut bad = good.clone();
        let at = blocks[2].start + 4;
        bad[at..at + 4].copy_from_slice(&len.to_le_bytes());
        let e = replay_err(&dir, &format!("long{len}.pcapng"), &bad);
        assert!(
            e.contains("truncated: the file ends inside pcapng block 3 (after 0 complete"),
            "{e}"
        );
    }
    // The custom block's trailing length differs from its leading one.
    let mut bad = good.clone();
    let at = blocks[4].end - 4;
    bad[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
    let e = replay_err(&dir, "trailer.pcapng", &bad);
    let len = blocks[4].len();
    assert!(
        e.contains(&format!(
            "pcapng block 5 (after 1 complete packets) (type 0x40000bad, no packet, skipped) \
             has length {len} but trailing length 16: the file is corrupt"
        )) && !e.contains("truncated"),
        "{e}"
    );
    // A length that is no multiple of 4, or under 12 bytes.
    for (len, says) in [
        (1_048_590u32, "not a multiple of 4"),
        (8, "less than the 12"),
    ] {
        let mut bad = good.clone();
        let at = blocks[6].start + 4;
        bad[at..at + 4].copy_from_slice(&len.to_le_bytes());
        let e = replay_err(&dir, &format!("len{len}.pcapng"), &bad);
        assert!(
            e.contains(&format!(
                "pcapng block 7 (after 2 complete packets) has length {len}"
            )) && e.contains(says)
                && e.contains("the file is corrupt"),
            "{e}"
        );
    }
}

/// Sections of either byte order follow each other; each numbers its interfaces from 0 and
/// has its own timestamp resolutions.
#[test]
fn pcapng_sections_of_both_byte_orders_follow_each_other() {
    let dir = scratch("pcapng-sections");
    let frame = |i: u8| udp_frame([10, 0, 0, i], 64, 64);
    // A section of `interfaces` interfaces (nanosecond ticks) and one packet on `on`.
    let section = |endianness: Endianness, interfaces: u32, on: u32, secs: u64, f: &[u8]| {
        let mut w = PcapNgWriter::with_endianness(Vec::new(), endianness).expect("writer");
        for i in 0..interfaces {
            w.write_block(&idb(DataLink::ETHERNET, Some(9), &format!("eth{i}")))
                .expect("idb");
        }
        w.write_block(&epb(on, secs * 1_000_000_000, f))
            .expect("epb");
        w.into_inner()
    };
    let bytes = [
        section(Endianness::Big, 1, 0, 1, &frame(1)),
        section(Endianness::Little, 2, 1, 2, &frame(2)),
        section(Endianness::Big, 1, 0, 3, &frame(3)),
    ]
    .concat();
    let p = dir.join("in.pcapng");
    std::fs::write(&p, bytes).expect("write");
    let cfg = ReplayConfig {
        ppe_threads: 1,
        write_drops: true,
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &p, &dir.join("out")).expect("replay");
    assert_eq!(r.packets_in, 3);
    assert_eq!(r.packets_in_by_port, BTreeMap::from([(0, 2), (1, 1)]));
    assert_eq!(
        frames_of(&dir.join("out/port1.pcap")),
        vec![frame(1), frame(2), frame(3)]
    );
}

// ----- the sample captures the README replays -----------------------------------------------

/// Where the sample captures are shipped.
const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/captures");

/// The l3fwd sample's route file.
const SAMPLE_ROUTES: &str =
    "# l3fwd routes for l3fwd.pcap: A.B.C.D/LEN PORT, longest prefix wins\n\
    10.0.0.0/8 1\n10.1.0.0/16 2\n10.1.2.128/25 3\n192.168.0.0/16 4\n";

/// The filter sample: 100 frames of 64 bytes from the traffic generator, a mix the filter
/// forwards (plain IPv4) and drops (IPv4 with options, IPv6, not IP).
fn sample_filter_traffic() -> Traffic {
    Traffic::generate(&TrafficSpec {
        packets: 100,
        frame_size: 64,
        flows: 16,
        mix: Mix {
            ipv4: 70,
            ipv4_options: 10,
            ipv6: 10,
            non_ip: 10,
        },
        seed: 14,
        ..TrafficSpec::default()
    })
    .expect("traffic")
}

/// Gradient `i` of chunk `c` of worker `w` in the Trio-ML sample: small numbers whose sums
/// read easily (the sum over the four workers is 10x worker 0's).
fn sample_gradient(w: u8, c: u32, i: usize) -> i32 {
    (c as i32 * 64 + i as i32 - 100) * (i32::from(w) + 1)
}

/// Expected Results by (job, block, generation).
type ResultsByBlock = BTreeMap<(u8, u32, u16), Expected>;

/// The Trio-ML sample: four workers of job 1 (sources 0-3), each captured on its own
/// pcapng interface (so each enters on its own port), six chunks of 64 gradients over a
/// window of 4 block ids; worker 3 never sends its last chunk, so that block ends in a
/// partial Result after the block timeout. Returns the capture and its expected Results.
fn sample_trio_ml() -> (Vec<u8>, ResultsByBlock) {
    let t0 = Duration::from_secs(1_700_000_000);
    let mut w = PcapNgWriter::new(Vec::new()).expect("pcapng writer");
    for worker in 0..4 {
        w.write_block(&idb(
            DataLink::ETHERNET,
            Some(9),
            &format!("worker{worker}"),
        ))
        .expect("idb");
    }
    let mut expected = BTreeMap::new();
    for c in 0..6u32 {
        let (block, gen) = (c % 4, (c / 4) as u16);
        let sending: Vec<u8> = (0..4).filter(|&s| !(s == 3 && c == 5)).collect();
        let mut vectors = Vec::new();
        for &s in &sending {
            let grads: Vec<i32> = (0..64).map(|i| sample_gradient(s, c, i)).collect();
            let frame = agg_frame(1, block, gen, s, &grads);
            let t =
                t0 + Duration::from_millis(u64::from(c)) + Duration::from_micros(u64::from(s) * 10);
            w.write_block(&epb(u32::from(s), t.as_nanos() as u64, &frame))
                .expect("epb");
            vectors.push(grads);
        }
        expected.insert(
            (1, block, gen),
            Expected {
                src_cnt: sending.len() as u8,
                degraded: sending.len() < 4,
                sums: (0..64).map(|i| wrapping_sum(&vectors, i)).collect(),
            },
        );
    }
    (w.into_inner(), expected)
}

/// The pcap bytes of `frames` as [`write_capture`] writes them.
fn capture_bytes(frames: &[Vec<u8>]) -> Vec<u8> {
    let dir = scratch("sample-bytes");
    let p = dir.join("c.pcap");
    write_capture(&p, frames, None);
    std::fs::read(&p).expect("read")
}

/// Every sample file: (name, bytes), as the generators above write them.
fn sample_files() -> Vec<(&'static str, Vec<u8>)> {
    let filter: Vec<Vec<u8>> = sample_filter_traffic().iter().map(<[u8]>::to_vec).collect();
    vec![
        ("filter-mix.pcap", capture_bytes(&filter)),
        ("l3fwd.pcap", capture_bytes(&l3fwd_frames(60))),
        ("l3fwd-routes.txt", SAMPLE_ROUTES.as_bytes().to_vec()),
        ("trio-ml-workers.pcapng", sample_trio_ml().0),
    ]
}

/// The samples in `examples/captures` are what the generators write (run with
/// `PFEMU_WRITE_SAMPLES=1` to write them again after a generator changed), and each replays
/// as the README says: the filter forwards the plain IPv4 frames on port 1, l3fwd matches
/// its reference per port, and job 1's Results (one partial: worker 3 misses the last
/// chunk) land in port1.pcap with exact sums.
#[test]
fn sample_captures_are_the_generators_and_replay_as_documented() {
    let dir = Path::new(SAMPLES);
    if std::env::var_os("PFEMU_WRITE_SAMPLES").is_some() {
        std::fs::create_dir_all(dir).expect("samples dir");
        for (name, bytes) in sample_files() {
            std::fs::write(dir.join(name), bytes).expect("write sample");
        }
    }
    for (name, bytes) in sample_files() {
        let shipped = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("examples/captures/{name}: {e}"));
        assert!(
            shipped == bytes,
            "examples/captures/{name} is not what the generator writes now: run \
             `PFEMU_WRITE_SAMPLES=1 cargo test --test replay sample_captures` to write it again"
        );
    }
    let out = scratch("samples");

    let traffic = sample_filter_traffic();
    let r = replay_file(
        &ReplayConfig::default(),
        &dir.join("filter-mix.pcap"),
        &out.join("filter"),
    )
    .expect("filter sample");
    let plain = traffic.count(FrameClass::Ipv4).0;
    assert!(plain > 0 && plain < 100, "a mix: {plain} plain IPv4");
    assert_eq!(
        r.packets_out_by_port.get(&DEFAULT_OUT_PORT).copied(),
        Some(plain)
    );
    assert_eq!(r.dropped, 100 - plain);

    let routes: RouteTable = SAMPLE_ROUTES.parse().expect("routes");
    let cfg = ReplayConfig {
        program: ReplayProgram::L3fwd(Routes::File(dir.join("l3fwd-routes.txt"))),
        ..ReplayConfig::default()
    };
    let r = replay_file(&cfg, &dir.join("l3fwd.pcap"), &out.join("l3fwd")).expect("l3fwd sample");
    let mut want: BTreeMap<u16, u64> = BTreeMap::new();
    for f in l3fwd_frames(60) {
        if let Ok((port, _)) = l3fwd_reference(&routes, &f) {
            *want.entry(port).or_default() += 1;
        }
    }
    assert_eq!(r.packets_out_by_port, want);
    assert!(r.dropped > 0, "the sample shows drops too");

    let cfg = ReplayConfig {
        // In capture time: the sample's chunks are 1 ms apart, so only the chunk worker 3
        // never sends times out, on any machine.
        program: aggregation(Aggregation::TrioMl, &["1:4"], 20),
        timing: Timing::Capture,
        ..ReplayConfig::default()
    };
    let trio_out = out.join("trio-ml");
    let r =
        replay_file(&cfg, &dir.join("trio-ml-workers.pcapng"), &trio_out).expect("trio-ml sample");
    assert_eq!(r.packets_in, 23);
    assert_eq!(r.open_blocks, 0);
    let want = sample_trio_ml().1;
    assert_eq!(want.values().filter(|e| e.degraded).count(), 1);
    assert_eq!(results_of(&trio_out.join("port1.pcap")), want);
}

/// Each `pfemu replay` command of the README runs as written, from the repository's root
/// (a copy of `examples/captures` in a scratch directory), and writes captures.
#[test]
fn readme_replay_commands_run_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let commands: Vec<Vec<&str>> = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("cargo run --release -- replay "))
        .map(|l| {
            l.split(" #")
                .next()
                .unwrap_or(l)
                .split_whitespace()
                .collect()
        })
        .collect();
    assert!(
        commands.len() >= 3,
        "the README replays its samples: {commands:?}"
    );
    let root = scratch("readme");
    let samples = root.join("examples/captures");
    std::fs::create_dir_all(&samples).expect("samples dir");
    for e in std::fs::read_dir(SAMPLES).expect("examples/captures") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), samples.join(e.file_name())).expect("copy sample");
    }
    for args in commands {
        let out_dir = root.join("replay-out");
        let _ = std::fs::remove_dir_all(&out_dir);
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_pfemu"))
            .arg("replay")
            .args(&args)
            .current_dir(&root)
            .output()
            .expect("run pfemu");
        assert!(
            o.status.success(),
            "pfemu replay {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        );
        let written = std::fs::read_dir(&out_dir).map(|d| d.count()).unwrap_or(0);
        assert!(
            written > 0,
            "pfemu replay {}: nothing written",
            args.join(" ")
        );
    }
}
