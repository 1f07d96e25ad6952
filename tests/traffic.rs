//! The traffic generator: sizes, flow distributions, protocol mix, rate arithmetic, pacing
//! schedule and text forms. Every check is on counts or bytes, never on wall-clock time.

#![cfg(feature = "lab")]

use std::collections::HashMap;
use std::net::Ipv6Addr;

use pfemu::lab::bench::filter::{run_on, FilterBenchConfig};
use pfemu::lab::bench::traffic::{
    gbps_l2_of, gbps_of, line_rate_pps, FlowDist, FlowKey, FrameClass, FrameSizes, Mix, Pacer,
    Rate, Traffic, TrafficSpec, Zipf, IMIX_PATTERN, L1_OVERHEAD_BYTES, MAX_FLOWS,
};
use pfemu::rng::SplitMix64;
use pfemu::wire::{checksum, Ether, Ipv4, Udp, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPPROTO_UDP};

fn fnv(t: &Traffic) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in t.iter() {
        for &b in f {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn generate(spec: TrafficSpec) -> Traffic {
    Traffic::generate(&spec).unwrap()
}

/// `sum_{k=1}^{n} k^-s`.
fn harmonic(n: u64, s: f64) -> f64 {
    (1..=n).map(|k| (k as f64).powf(-s)).sum()
}

#[test]
fn default_spec_bytes_are_unchanged() {
    // Hashes of the generator's output before sizes, flow distributions and IPv6 existed:
    // the filter bench's traffic must not change.
    let a = generate(TrafficSpec {
        packets: 100_000,
        ..Default::default()
    });
    assert_eq!(fnv(&a), 0xa2b2_5f31_d77a_db30);
    let b = generate(TrafficSpec {
        packets: 20_000,
        frame_size: 1500,
        flows: 64,
        seed: 9,
        ports: 3,
        ..Default::default()
    });
    assert_eq!(fnv(&b), 0xfdbd_af1e_019f_3533);
    // Spelling the defaults out explicitly changes nothing.
    let c = generate(TrafficSpec {
        packets: 100_000,
        sizes: Some(FrameSizes::Fixed(64)),
        flow_dist: FlowDist::Uniform,
        mix: "ipv4=90,ipv4opt=5,ipv6=0,nonip=5".parse().unwrap(),
        ..Default::default()
    });
    assert_eq!(fnv(&c), fnv(&a));
}

#[test]
fn same_spec_same_bytes() {
    let spec = TrafficSpec {
        packets: 20_000,
        sizes: Some(FrameSizes::Imix),
        flows: 1 << 20,
        flow_dist: FlowDist::Zipf(1.1),
        mix: "ipv4=50,ipv4opt=10,ipv6=30,nonip=10".parse().unwrap(),
        seed: 77,
        ports: 4,
        ..Default::default()
    };
    let a = generate(spec.clone());
    let b = generate(spec.clone());
    assert_eq!(fnv(&a), fnv(&b));
    assert!(a.iter().eq(b.iter()));
    assert!((0..a.len()).all(|i| a.flow(i) == b.flow(i) && a.class(i) == b.class(i)));
    let c = generate(TrafficSpec { seed: 78, ..spec });
    assert_ne!(fnv(&a), fnv(&c));
}

#[test]
fn imix_is_7_4_1_in_every_12_frames() {
    let t = generate(TrafficSpec {
        packets: 12 * 1000 + 5,
        sizes: Some(FrameSizes::Imix),
        ..Default::default()
    });
    let lens: Vec<usize> = t.iter().map(<[u8]>::len).collect();
    for window in lens.windows(12) {
        let count = |n| window.iter().filter(|&&l| l == n).count();
        assert_eq!((count(64), count(594), count(1518)), (7, 4, 1));
    }
    for (i, &l) in lens.iter().enumerate() {
        assert_eq!(l, IMIX_PATTERN[i % 12]);
    }
    let expected: u64 = lens.iter().map(|&l| l as u64).sum();
    assert_eq!(t.total_bytes(), expected);
    assert_eq!(FrameSizes::Imix.total_bytes(t.len()), u128::from(expected));
    assert!((FrameSizes::Imix.mean() - 4342.0 / 12.0).abs() < 1e-9);
    // Byte counts per class add up to the total.
    let by_class: u64 = FrameClass::ALL.iter().map(|&c| t.count(c).1).sum();
    assert_eq!(by_class, t.total_bytes());
}

#[test]
fn lists_cycle_in_order_and_fixed_sizes_stay_fixed() {
    let sizes: FrameSizes = "64,128,1518".parse().unwrap();
    let t = generate(TrafficSpec {
        packets: 1000,
        sizes: Some(sizes.clone()),
        mix: "ipv4=40,ipv4opt=20,ipv6=20,nonip=20".parse().unwrap(),
        ..Default::default()
    });
    for (i, f) in t.iter().enumerate() {
        assert_eq!(f.len(), [64, 128, 1518][i % 3]);
        assert_eq!(f.len(), sizes.size_of(i));
    }
    assert_eq!(sizes.mean(), (64.0 + 128.0 + 1518.0) / 3.0);
    assert_eq!((sizes.min(), sizes.max()), (64, 1518));
    assert_eq!(t.total_bytes() as u128, sizes.total_bytes(1000));

    // `sizes` takes precedence over `frame_size`.
    let t = generate(TrafficSpec {
        packets: 10,
        frame_size: 1500,
        sizes: Some(FrameSizes::Fixed(256)),
        ..Default::default()
    });
    assert!(t.iter().all(|f| f.len() == 256));
    assert_eq!(t.mean_frame_size(), 256.0);
}

#[test]
fn frame_sizes_text_form() {
    assert_eq!("64".parse::<FrameSizes>().unwrap(), FrameSizes::Fixed(64));
    assert_eq!(
        " 64, 512 ,1518 ".parse::<FrameSizes>().unwrap(),
        FrameSizes::List(vec![64, 512, 1518])
    );
    assert_eq!("IMIX".parse::<FrameSizes>().unwrap(), FrameSizes::Imix);
    for sizes in [
        FrameSizes::Fixed(9216),
        FrameSizes::List(vec![64, 1500]),
        FrameSizes::Imix,
    ] {
        assert_eq!(sizes.to_string().parse::<FrameSizes>().unwrap(), sizes);
    }
    for bad in ["", "63", "9217", "64,", "64,abc", "big", "-64", "64;128"] {
        let err = bad.parse::<FrameSizes>().unwrap_err();
        assert_eq!(err.setting, "sizes", "{bad}");
    }
    let err = "64,20".parse::<FrameSizes>().unwrap_err();
    assert!(
        err.reason.contains("64..=9216") && err.reason.contains("20"),
        "{err}"
    );
    let err = "sixty".parse::<FrameSizes>().unwrap_err();
    assert!(
        err.reason.contains("`sixty`") && err.reason.contains("imix"),
        "{err}"
    );
}

#[test]
fn zipf_sampler_follows_one_over_k_to_the_s() {
    let samples = 1_000_000u64;
    for (n, s) in [(1000u64, 1.1), (1000, 1.0), (100, 0.6), (50, 2.0)] {
        let z = Zipf::new(n, s).unwrap();
        let mut rng = SplitMix64::new(5);
        let mut counts = vec![0u64; n as usize + 1];
        for _ in 0..samples {
            let k = z.sample(&mut rng);
            assert!((1..=n).contains(&k));
            counts[k as usize] += 1;
        }
        let h = harmonic(n, s);
        // Every rank within 5 standard deviations of its binomial expectation.
        let mut chi2 = 0.0;
        for k in 1..=n {
            let p = (k as f64).powf(-s) / h;
            let want = samples as f64 * p;
            let sd = (samples as f64 * p * (1.0 - p)).sqrt();
            let got = counts[k as usize] as f64;
            assert!(
                (got - want).abs() <= 5.0 * sd + 1.0,
                "n {n} s {s} rank {k}: {got} vs {want:.1} (sd {sd:.1})"
            );
            chi2 += (got - want).powi(2) / want;
        }
        // Chi-square with n - 1 degrees of freedom: mean n - 1, sd sqrt(2(n - 1)).
        let df = (n - 1) as f64;
        assert!(
            chi2 < df + 6.0 * (2.0 * df).sqrt(),
            "n {n} s {s}: chi2 {chi2}"
        );
        // Flow 1 vs flow 2: 2^s.
        let ratio = counts[1] as f64 / counts[2] as f64;
        assert!(
            (ratio / 2f64.powf(s) - 1.0).abs() < 0.03,
            "n {n} s {s}: ratio {ratio}"
        );
        // Top share: 1 / H(n, s).
        let top = counts[1] as f64 / samples as f64;
        assert!((top * h - 1.0).abs() < 0.01, "n {n} s {s}: top {top}");
    }
}

#[test]
fn zipf_over_the_largest_flow_count_needs_no_table() {
    let n = u64::from(MAX_FLOWS);
    let s = 1.0;
    let z = Zipf::new(n, s).unwrap();
    let samples = 500_000u64;
    let mut rng = SplitMix64::new(11);
    let mut head = [0u64; 11];
    let mut beyond_million = 0u64;
    for _ in 0..samples {
        let k = z.sample(&mut rng);
        assert!((1..=n).contains(&k));
        if k <= 10 {
            head[k as usize] += 1;
        }
        if k > 1 << 20 {
            beyond_million += 1;
        }
    }
    let h = harmonic(n, s);
    for (k, &got) in head.iter().enumerate().skip(1) {
        let p = (k as f64).powf(-s) / h;
        let want = samples as f64 * p;
        let sd = (want * (1.0 - p)).sqrt();
        assert!(
            (got as f64 - want).abs() <= 5.0 * sd,
            "rank {k}: {got} vs {want:.1}"
        );
    }
    // P(k > 2^20) = (H(2^24) - H(2^20)) / H(2^24) ~ ln(16) / 17.2 ~ 16%.
    let p_tail = (h - harmonic(1 << 20, s)) / h;
    let want = samples as f64 * p_tail;
    let sd = (want * (1.0 - p_tail)).sqrt();
    assert!(
        (beyond_million as f64 - want).abs() <= 5.0 * sd,
        "tail {beyond_million} vs {want:.1}"
    );
}

#[test]
fn zipf_degenerate_and_invalid() {
    let one = Zipf::new(1, 1.0).unwrap();
    let mut rng = SplitMix64::new(1);
    assert!((0..1000).all(|_| one.sample(&mut rng) == 1));
    let steep = Zipf::new(1000, 20.0).unwrap();
    let ones = (0..10_000).filter(|_| steep.sample(&mut rng) == 1).count();
    assert!(ones > 9_990, "{ones}");
    assert_eq!(Zipf::new(0, 1.0).unwrap_err().setting, "flows");
    for s in [0.0, -1.0, f64::NAN, f64::INFINITY, 20.5] {
        assert_eq!(Zipf::new(10, s).unwrap_err().setting, "flow_dist", "{s}");
    }
}

#[test]
fn zipf_traffic_puts_flow_zero_first() {
    let n = 200_000;
    let t = generate(TrafficSpec {
        packets: n,
        flows: 10_000,
        flow_dist: FlowDist::Zipf(1.2),
        ports: 4,
        ..Default::default()
    });
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for i in 0..t.len() {
        *counts.entry(t.flow(i)).or_default() += 1;
        assert_eq!(u32::from(t.port(i)), t.flow(i) % 4);
    }
    let c = |f| counts.get(&f).copied().unwrap_or(0) as f64;
    let top = counts.iter().max_by_key(|(_, &c)| c).map(|(&f, _)| f);
    assert_eq!(top, Some(0));
    assert!((c(0) / c(1) / 2f64.powf(1.2) - 1.0).abs() < 0.05);
    let share = c(0) / n as f64 * harmonic(10_000, 1.2);
    assert!((share - 1.0).abs() < 0.02, "{share}");
    assert!(counts.keys().all(|&f| f < 10_000));
}

#[test]
fn uniform_flows_are_flat() {
    let n = 400_000usize;
    let flows = 1024u32;
    let t = generate(TrafficSpec {
        packets: n,
        flows,
        ..Default::default()
    });
    let mut counts = vec![0u64; flows as usize];
    for i in 0..t.len() {
        counts[t.flow(i) as usize] += 1;
    }
    let want = n as f64 / f64::from(flows);
    let chi2: f64 = counts
        .iter()
        .map(|&c| (c as f64 - want).powi(2) / want)
        .sum();
    let df = f64::from(flows - 1);
    assert!(chi2 < df + 6.0 * (2.0 * df).sqrt(), "chi2 {chi2}");
    assert!(counts
        .iter()
        .all(|&c| (c as f64 - want).abs() < 6.0 * want.sqrt()));
}

#[test]
fn class_shares_follow_the_mix() {
    let n = 200_000;
    let mix: Mix = "ipv4=40,ipv4opt=15,ipv6=35,nonip=10".parse().unwrap();
    let t = generate(TrafficSpec {
        packets: n,
        mix,
        sizes: Some(FrameSizes::Imix),
        ..Default::default()
    });
    let mut total = 0;
    for class in FrameClass::ALL {
        let (packets, _) = t.count(class);
        let want = n as f64 * f64::from(mix.share(class)) / 100.0;
        // Binomial sd <= sqrt(n / 4) ~ 224 packets.
        assert!(
            (packets as f64 - want).abs() < 1_200.0,
            "{class:?}: {packets} vs {want}"
        );
        assert_eq!(
            (0..t.len()).filter(|&i| t.class(i) == class).count() as u64,
            packets
        );
        total += packets;
    }
    assert_eq!(total, n as u64);
    // A class with share 0 never appears; one with share 100 is all there is.
    let only_v6 = generate(TrafficSpec {
        packets: 1000,
        mix: "ipv6=100".parse().unwrap(),
        ..Default::default()
    });
    assert_eq!(only_v6.count(FrameClass::Ipv6).0, 1000);
}

/// Checks an IPv6/UDP frame of flow `flow` and returns its UDP payload length.
fn check_ipv6(frame: &[u8], flow: u32) -> usize {
    let eth = Ether::new_checked(frame).unwrap();
    assert_eq!(eth.etype(), ETHERTYPE_IPV6);
    let ip = eth.payload();
    assert_eq!(ip[0] >> 4, 6, "version");
    let label = u32::from_be_bytes([0, ip[1] & 0x0F, ip[2], ip[3]]);
    assert_eq!(label, flow & 0xF_FFFF);
    let payload_len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    assert_eq!(payload_len, frame.len() - 14 - 40);
    assert_eq!(ip[6], IPPROTO_UDP);
    assert_eq!(ip[7], 64);
    let key = FlowKey::of(flow);
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
    assert_eq!(src, key.src_v6());
    assert_eq!(dst, key.dst_v6());
    assert_eq!(dst, "fd00::c0a8:1".parse::<Ipv6Addr>().unwrap());
    let seg = &ip[40..];
    let udp = Udp::new_checked(seg).unwrap();
    assert_eq!(usize::from(udp.len()), payload_len);
    assert_eq!(udp.src_port(), key.src_port);
    assert_eq!(udp.dst_port(), key.dst_port);
    assert_ne!(udp.checksum(), 0, "IPv6 requires a UDP checksum");
    // The checksum over pseudo-header and segment verifies to 0.
    let mut covered = Vec::with_capacity(40 + seg.len());
    covered.extend_from_slice(&ip[8..40]);
    covered.extend_from_slice(&(payload_len as u32).to_be_bytes());
    covered.extend_from_slice(&[0, 0, 0, IPPROTO_UDP]);
    covered.extend_from_slice(seg);
    assert_eq!(checksum(&covered), 0);
    payload_len
}

#[test]
fn ipv6_and_ipv4_frames_are_well_formed() {
    let t = generate(TrafficSpec {
        packets: 6000,
        sizes: Some("64,65,594,1518,9216".parse().unwrap()),
        flows: 300_000,
        mix: "ipv4=30,ipv4opt=20,ipv6=40,nonip=10".parse().unwrap(),
        seed: 3,
        ..Default::default()
    });
    let mut seen = [0; 4];
    for (i, frame) in t.iter().enumerate() {
        match t.class(i) {
            FrameClass::Ipv6 => {
                check_ipv6(frame, t.flow(i));
                seen[2] += 1;
            }
            FrameClass::Ipv4 | FrameClass::Ipv4Options => {
                let eth = Ether::new_checked(frame).unwrap();
                assert_eq!(eth.etype(), ETHERTYPE_IPV4);
                let ip = Ipv4::new_checked_full(eth.payload()).unwrap();
                assert!(ip.verify_checksum(), "frame {i}");
                assert_eq!(usize::from(ip.total_len()), frame.len() - 14);
                let options = t.class(i) == FrameClass::Ipv4Options;
                assert_eq!(ip.ihl(), if options { 6 } else { 5 });
                assert_eq!(ip.src_addr(), FlowKey::of(t.flow(i)).src);
                seen[usize::from(options)] += 1;
            }
            FrameClass::NonIp => seen[3] += 1,
        }
    }
    assert!(seen.iter().all(|&c| c > 0), "{seen:?}");
    assert_eq!(
        FlowKey::of(258).src_v6(),
        "fd00::a00:102".parse::<Ipv6Addr>().unwrap()
    );
}

#[test]
fn mix_text_form() {
    let m: Mix = "ipv4=90,ipv4opt=5,ipv6=0,nonip=5".parse().unwrap();
    assert_eq!(m, Mix::FILTER_DEFAULT);
    assert_eq!(m.to_string(), "ipv4=90,ipv4opt=5,ipv6=0,nonip=5");
    let m: Mix = " IPv6 = 60 , ipv4=40 ".parse().unwrap();
    assert_eq!(
        m,
        Mix {
            ipv4: 40,
            ipv4_options: 0,
            ipv6: 60,
            non_ip: 0
        }
    );
    assert_eq!(m.to_string().parse::<Mix>().unwrap(), m);
    assert_eq!(
        "ipv4_options=50,non-ip=50".parse::<Mix>().unwrap(),
        "ipv4opt=50,nonip=50".parse::<Mix>().unwrap()
    );
    for (bad, needle) in [
        ("", "empty"),
        ("ipv4=90", "sum to 100"),
        ("ipv4=90,ipv4opt=5,nonip=6", "sum to 100"),
        ("ipv4=50,ipv4=50", "twice"),
        ("ipx=100", "unknown class `ipx`"),
        ("ipv4:100", "not class=share"),
        ("ipv4=1e2", "whole number"),
        ("ipv4=-5,nonip=105", "whole number"),
    ] {
        let err = bad.parse::<Mix>().unwrap_err();
        assert_eq!(err.setting, "mix", "{bad}");
        assert!(err.reason.contains(needle), "{bad}: {err}");
    }
}

#[test]
fn flow_dist_text_form() {
    assert_eq!("uniform".parse::<FlowDist>().unwrap(), FlowDist::Uniform);
    assert_eq!("zipf".parse::<FlowDist>().unwrap(), FlowDist::Zipf(1.0));
    assert_eq!("Zipf:1.1".parse::<FlowDist>().unwrap(), FlowDist::Zipf(1.1));
    for d in [FlowDist::Uniform, FlowDist::Zipf(1.0), FlowDist::Zipf(0.75)] {
        assert_eq!(d.to_string().parse::<FlowDist>().unwrap(), d);
    }
    for bad in [
        "", "zipf:", "zipf:x", "zipf:0", "zipf:-1", "zipf:inf", "pareto", "zipf:30",
    ] {
        assert_eq!(
            bad.parse::<FlowDist>().unwrap_err().setting,
            "flow_dist",
            "{bad}"
        );
    }
    assert!("normal"
        .parse::<FlowDist>()
        .unwrap_err()
        .reason
        .contains("`uniform`"));
}

#[test]
fn line_rate_arithmetic() {
    assert_eq!(L1_OVERHEAD_BYTES, 20);
    assert!((line_rate_pps(10.0, 64.0) - 14_880_952.38).abs() < 0.01);
    assert!((line_rate_pps(10.0, 1518.0) - 812_743.8).abs() < 0.05);
    assert!((line_rate_pps(100.0, 64.0) - 148_809_523.8).abs() < 0.1);
    assert!((gbps_of(14_880_952.380_952_38, 64.0) - 10.0).abs() < 1e-9);
    assert!((gbps_of(812_743.823_146_944, 1518.0) - 10.0).abs() < 1e-9);
    // L2 counts frame bytes only: 64/84 of the line.
    assert!((gbps_l2_of(14_880_952.380_952_38, 64.0) - 10.0 * 64.0 / 84.0).abs() < 1e-9);
    assert!((gbps_l2_of(1e6, 1500.0) - 12.0).abs() < 1e-12);

    let r = Rate::Gbps(10.0);
    assert!((r.pps_for(64.0) - 14_880_952.38).abs() < 0.01);
    assert_eq!(r.gbps_for(1518.0), 10.0);
    let imix = FrameSizes::Imix.mean();
    assert!((r.pps_for(imix) - 1e10 / ((imix + 20.0) * 8.0)).abs() < 1e-6);
    assert_eq!(Rate::Pps(1e6).pps_for(1518.0), 1e6);
    assert!((Rate::Pps(1e6).gbps_for(64.0) - 0.672).abs() < 1e-12);
}

#[test]
fn rate_text_form() {
    let cases: [(&str, Rate); 10] = [
        ("10mpps", Rate::Pps(10e6)),
        ("500kpps", Rate::Pps(500e3)),
        ("14880952pps", Rate::Pps(14_880_952.0)),
        ("14_880_952 pps", Rate::Pps(14_880_952.0)),
        ("1.5Mpps", Rate::Pps(1.5e6)),
        ("10gbps", Rate::Gbps(10.0)),
        ("25g", Rate::Gbps(25.0)),
        ("100Gbit/s", Rate::Gbps(100.0)),
        ("400mbps", Rate::Gbps(0.4)),
        (" 2.5 G ", Rate::Gbps(2.5)),
    ];
    for (text, want) in cases {
        let got: Rate = text.parse().unwrap();
        assert_eq!(got, want, "{text}");
        assert_eq!(got.to_string().parse::<Rate>().unwrap(), got, "{text}");
    }
    for (bad, needle) in [
        ("10", "no unit"),
        ("mpps", "does not start with a number"),
        ("10furlongs", "unknown unit `furlongs`"),
        ("0pps", "positive"),
        ("1.2.3mpps", "not a number"),
        ("-5mpps", "does not start with a number"),
        ("100%", "no line rate"),
    ] {
        let err = bad.parse::<Rate>().unwrap_err();
        assert_eq!(err.setting, "rate", "{bad}");
        assert!(err.reason.contains(needle), "{bad}: {err}");
    }
    assert_eq!(
        Rate::parse_with_line("100%", Some(10.0)).unwrap(),
        Rate::Gbps(10.0)
    );
    assert_eq!(
        Rate::parse_with_line("50 %", Some(25.0)).unwrap(),
        Rate::Gbps(12.5)
    );
    assert_eq!(
        Rate::parse_with_line("3mpps", Some(10.0)).unwrap(),
        Rate::Pps(3e6)
    );
    assert!(Rate::parse_with_line("100%", None).is_err());
    assert!(Rate::parse_with_line("150%", Some(10.0)).is_err());
    assert!(Rate::parse_with_line("0%", Some(10.0)).is_err());
    assert!(Rate::parse_with_line("50%", Some(0.0)).is_err());
}

#[test]
fn pacer_schedule_on_a_virtual_clock() {
    // 1 Mpps in bursts of 32: a burst every 32 us.
    let mut p = Pacer::new(1e6, 32).unwrap();
    assert_eq!(p.deadline_ns(0), 0);
    assert_eq!(p.deadline_ns(1), 32_000);
    assert_eq!(p.deadline_ns(31), 992_000);
    assert_eq!(p.bursts_due(0), 1);
    assert_eq!(p.bursts_due(31_999), 1);
    assert_eq!(p.bursts_due(32_000), 2);
    // After 1 ms, 31.25 burst intervals (1000 frames' worth) have passed: bursts 0..=31
    // are due, i.e. 32 bursts of 32 frames.
    assert_eq!(p.bursts_due(1_000_000), 32);
    assert_eq!(p.frames_due(1_000_000), 1024);
    // Over 1 s the rate is exact: bursts at 0, 32 us, ..., 999_968 us.
    assert_eq!(p.bursts_due(999_999_999), 31_250);
    assert_eq!(p.frames_due(999_999_999), 1_000_000);
    assert_eq!(p.bursts_due(1_000_000_000), 31_251);

    // poll releases each burst exactly once, however the clock advances.
    let mut released = 0;
    let mut now = 0;
    while now <= 10_000_000 {
        released += p.poll(now);
        now += 7_777;
    }
    assert_eq!(released, p.bursts_due(now - 7_777));
    assert_eq!(p.next_burst(), released);
    assert_eq!(p.poll(now - 7_777), 0, "nothing new at the same time");

    // A rate that is not a whole number of ns per burst: 64 B at 10 GbE, bursts of 1.
    let p = Pacer::for_rate(Rate::Gbps(10.0), 64.0, 1).unwrap();
    assert_eq!(p.deadline_ns(1), 67); // 67.2 ns
    assert_eq!(p.deadline_ns(14_880_952), 999_999_974); // 999_999_974.4
    assert_eq!(p.bursts_due(1_000_000_000), 14_880_953);
    for now in [0, 1, 66, 67, 68, 1_000, 123_456_789, 999_999_999] {
        let due = p.bursts_due(now);
        assert!(
            p.deadline_ns(due - 1) <= now && p.deadline_ns(due) > now,
            "{now}"
        );
    }

    assert_eq!(Pacer::new(0.0, 32).unwrap_err().setting, "rate");
    assert_eq!(Pacer::new(f64::NAN, 32).unwrap_err().setting, "rate");
    assert_eq!(Pacer::new(1e6, 0).unwrap_err().setting, "burst");
}

#[test]
fn pacer_real_time_releases_bursts_in_order() {
    // No timing assertions: only that the real-time wait hands out bursts in order.
    let mut p = Pacer::new(1e7, 8).unwrap();
    for k in 0..5 {
        assert_eq!(p.wait_for_next(), k);
    }
    assert_eq!(p.next_burst(), 5);
    p.start();
    assert_eq!(p.wait_for_next(), 0);
}

#[test]
fn validate_names_the_new_settings() {
    let bad = |spec: TrafficSpec| Traffic::generate(&spec).unwrap_err().setting;
    let base = TrafficSpec {
        packets: 10,
        ..Default::default()
    };
    assert_eq!(
        bad(TrafficSpec {
            sizes: Some(FrameSizes::List(vec![])),
            ..base.clone()
        }),
        "sizes"
    );
    assert_eq!(
        bad(TrafficSpec {
            sizes: Some(FrameSizes::List(vec![64, 10_000])),
            ..base.clone()
        }),
        "sizes"
    );
    assert_eq!(
        bad(TrafficSpec {
            frame_size: 10,
            ..base.clone()
        }),
        "frame_size"
    );
    assert_eq!(
        bad(TrafficSpec {
            flow_dist: FlowDist::Zipf(0.0),
            ..base.clone()
        }),
        "flow_dist"
    );
    assert_eq!(
        bad(TrafficSpec {
            mix: Mix {
                ipv4: 90,
                ipv4_options: 5,
                ipv6: 10,
                non_ip: 5
            },
            ..base.clone()
        }),
        "mix"
    );
    // The arena limit counts the real sizes: 4M IMIX frames (~1.45 GB) fit, 4M jumbo
    // frames do not.
    let imix = TrafficSpec {
        packets: 4_000_000,
        sizes: Some(FrameSizes::Imix),
        ..Default::default()
    };
    imix.validate().unwrap();
    assert_eq!(
        TrafficSpec {
            sizes: Some(FrameSizes::Fixed(9216)),
            ..imix
        }
        .validate()
        .unwrap_err()
        .setting,
        "packets"
    );
}

#[test]
fn filter_bench_verifies_any_mix() {
    // The filter counts IPv6 as non-IP; the bench's verification must agree, for mixed
    // sizes too, and across a replay that ends mid-pool.
    let traffic = generate(TrafficSpec {
        packets: 3000,
        sizes: Some(FrameSizes::Imix),
        flows: 256,
        flow_dist: FlowDist::Zipf(1.0),
        mix: "ipv4=40,ipv4opt=15,ipv6=30,nonip=15".parse().unwrap(),
        seed: 4,
        ..Default::default()
    });
    let cfg = FilterBenchConfig {
        engine: pfemu::lab::bench::EngineSettings {
            ppe_threads: 2,
            ..Default::default()
        },
        packets: 7_500,
        size: 64,
        flows: 256,
        seed: 4,
        ..FilterBenchConfig::default()
    };
    let report = run_on(&cfg, &traffic).unwrap();
    assert!(report.verified, "{report:?}");
    let (v6, _) = traffic.count(FrameClass::Ipv6);
    let (arp, _) = traffic.count(FrameClass::NonIp);
    // Two full rounds and a 1500-frame prefix.
    let prefix = (0..1500)
        .filter(|&i| matches!(traffic.class(i), FrameClass::Ipv6 | FrameClass::NonIp))
        .count() as u64;
    assert_eq!(report.counters.non_ip.0, 2 * (v6 + arp) + prefix);
    assert_eq!(report.stats.packets_in, 7_500);
    assert_eq!(
        report.pool_frames, 3000,
        "the report names the pool it replayed"
    );
}
