//! Every text a user hands pfemu (route files, jobs files, option values) and every block
//! of bytes a parser reads from outside (TPACKET_V3 ring blocks, Trio-ML datagrams) is
//! answered with a value or an error, never a panic or a hang. Inputs are built from the
//! grammars' own tokens, so that the parsers get past their first check, and from
//! arbitrary characters and bytes.

#![cfg(feature = "lab")]

use proptest::prelude::*;

use pfemu::lab::aggregation::JobSpec;
use pfemu::lab::bench::linerate::InitialRate;
use pfemu::lab::bench::settings::{parse_millis, parse_millis_as_ns, parse_secs, parse_secs_as_ms};
use pfemu::lab::bench::traffic::{FlowDist, FrameSizes, Mix, Rate};
use pfemu::lab::ports::ring::{parse_block, BlockBuilder, SyntheticFrame};
use pfemu::lab::ports::PortSpec;
use pfemu::lab::trace::TraceFormat;
use pfemu::microcode::l3fwd::RouteTable;
use pfemu::microcode::trio_ml::wire;

/// Pieces of the route file's, the jobs file's and the options' grammars, with values at
/// and past their limits, numbers that do not fit, and separators.
const TOKENS: &[&str] = &[
    "0",
    "1",
    "7",
    "8",
    "24",
    "32",
    "33",
    "255",
    "256",
    "65535",
    "65536",
    "4294967296",
    "-1",
    "+1",
    "1e309",
    "NaN",
    "inf",
    "-inf",
    "0.0",
    "1.1",
    "1e-9",
    "18446744073709551616",
    "10.0.0.0",
    "10.1.2.3",
    "0.0.0.0",
    "255.255.255.255",
    "256.1.1.1",
    "1.2.3",
    "::1",
    "/",
    "/8",
    "/24",
    "/32",
    "/33",
    "/",
    ":",
    "..",
    ".",
    ",",
    "=",
    "#",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "x",
    "é",
    "imix",
    "uniform",
    "zipf",
    "zipf:",
    "mpps",
    "kpps",
    "pps",
    "gbps",
    "mbps",
    "g",
    "%",
    "ipv4",
    "ipv4opt",
    "ipv6",
    "nonip",
    "bisect",
    "measured",
    "lines",
    "json",
    "tap",
    "pfe0",
    "eth0",
    "ms",
    "s",
];

/// A text made of grammar tokens.
fn token_text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..max).prop_map(|t| t.concat())
}

/// Token texts and arbitrary ones.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![token_text(24), ".{0,40}"]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A route file: a table whose every route came from a line of the text, or an error
    /// naming a line of it.
    #[test]
    fn route_files_are_read_or_refused_naming_a_line(text in prop_oneof![token_text(60), ".{0,80}"]) {
        match RouteTable::parse(&text) {
            Ok(t) => prop_assert!(t.len() <= text.lines().count(), "{} routes", t.len()),
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("line "), "{msg}");
            }
        }
    }

    /// A jobs file: one job per line at most, or an error naming the line.
    #[test]
    fn jobs_files_are_read_or_refused_naming_a_line(text in prop_oneof![token_text(40), ".{0,60}"]) {
        match JobSpec::parse_list(&text) {
            Ok(jobs) => prop_assert!(jobs.len() <= text.lines().count()),
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("line "), "{msg}");
            }
        }
    }

    /// Every option value type: parsed, or refused with a message.
    #[test]
    fn option_values_are_parsed_or_refused_with_a_message(s in any_text()) {
        fn said<T, E: std::fmt::Display>(r: Result<T, E>) -> bool {
            r.err().is_none_or(|e| !e.to_string().is_empty())
        }
        prop_assert!(said(s.parse::<JobSpec>()));
        prop_assert!(said(s.parse::<FrameSizes>()));
        prop_assert!(said(s.parse::<FlowDist>()));
        prop_assert!(said(s.parse::<Rate>()));
        prop_assert!(said(Rate::parse_with_line(&s, Some(10.0))));
        prop_assert!(said(s.parse::<Mix>()));
        prop_assert!(said(s.parse::<InitialRate>()));
        prop_assert!(said(s.parse::<PortSpec>()));
        prop_assert!(said(s.parse::<TraceFormat>()));
        prop_assert!(said(parse_secs(&s)));
        prop_assert!(said(parse_millis(&s)));
        prop_assert!(said(parse_millis_as_ns(&s)));
        prop_assert!(said(parse_secs_as_ms(&s)));
    }

    /// A durations' parser never gives a value it was not given: a number that is not
    /// finite and non-negative is refused.
    #[test]
    fn durations_are_finite_and_not_negative(s in any_text()) {
        for v in [parse_secs(&s), parse_millis(&s)].into_iter().flatten() {
            prop_assert!(v.is_finite() && v >= 0.0, "{s:?} gave {v}");
        }
    }

    /// A ring block of any bytes, and a well-formed block with bytes changed: its frames,
    /// each within the block, or an error.
    #[test]
    fn ring_blocks_of_any_bytes_are_read_within_the_block(
        block in prop::collection::vec(any::<u8>(), 0..512),
        frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..80), 1..5),
        changes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut built = frames
            .into_iter()
            .fold(BlockBuilder::new(), |b, data| b.frame(SyntheticFrame { data, ..SyntheticFrame::default() }))
            .build(1024);
        for (at, value) in changes {
            let i = at.index(built.len());
            built[i] = value;
        }
        for bytes in [&block, &built] {
            let mut frames = Vec::new();
            let _ = parse_block(bytes, &mut frames);
            for f in &frames {
                prop_assert!(f.data.start <= f.data.end && f.data.end <= bytes.len(), "{f:?}");
            }
        }
    }

    /// A Trio-ML datagram of any bytes: its header and gradients, within the datagram, or an
    /// error.
    #[test]
    fn aggregation_datagrams_of_any_bytes_are_read_within_them(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        if let Ok((_, grads)) = wire::parse_payload(&bytes) {
            prop_assert!(grads.len() <= bytes.len());
        }
        if let Ok((_, grads)) = wire::parse(&bytes) {
            prop_assert!(grads.len() <= bytes.len());
        }
    }
}
