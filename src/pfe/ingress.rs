//! Ingress: validates frames, classifies them into flows and stamps per-flow sequence
//! numbers, which the reorder engine uses to restore each flow's arrival order.

use std::fmt;
use std::sync::Arc;

use crate::packet::Port;
use crate::wire::{Ether, Ipv4, ETHERTYPE_IPV4, IPPROTO_TCP, IPPROTO_UDP};

/// A user-supplied flow key function: ingress port and frame in, flow key out.
pub type FlowKeyFn = dyn Fn(Port, &[u8]) -> u64 + Send + Sync;

/// How ingress decides which packets belong to one flow (and so must leave in order).
#[derive(Clone, Default)]
pub enum FlowClassifier {
    /// IPv4 5-tuple (addresses, protocol, and TCP/UDP ports of unfragmented packets);
    /// other IPv4 packets by addresses and protocol; non-IPv4 frames by ingress port.
    #[default]
    FiveTuple,
    /// All packets of one ingress port are one flow.
    IngressPort,
    /// A function of the ingress port and frame returning a flow key.
    Custom(Arc<FlowKeyFn>),
}

impl fmt::Debug for FlowClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowClassifier::FiveTuple => f.write_str("FiveTuple"),
            FlowClassifier::IngressPort => f.write_str("IngressPort"),
            FlowClassifier::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

#[inline]
fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser: cheap and spreads every input bit over the result.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl FlowClassifier {
    /// The flow key of a frame.
    pub fn flow_key(&self, port: Port, frame: &[u8]) -> u64 {
        match self {
            FlowClassifier::FiveTuple => five_tuple_key(port, frame),
            FlowClassifier::IngressPort => mix(port as u64 | 1 << 63),
            FlowClassifier::Custom(f) => f(port, frame),
        }
    }
}

fn five_tuple_key(port: Port, frame: &[u8]) -> u64 {
    let port_key = || mix(port as u64 | 1 << 63);
    let Ok(eth) = Ether::new_checked(frame) else {
        return port_key();
    };
    if eth.etype() != ETHERTYPE_IPV4 {
        return port_key();
    }
    let l3 = &frame[Ether::<&[u8]>::LEN..];
    let Ok(ip) = Ipv4::new_checked(l3) else {
        return port_key();
    };
    let addrs = (ip.src() as u64) << 32 | ip.dst() as u64;
    let proto = ip.proto();
    let ihl = ip.ihl() as usize * 4;
    let mut ports = 0u64;
    if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
        && ip.frag_off() == 0
        && !ip.mf()
        && l3.len() >= ihl + 4
    {
        ports = u32::from_be_bytes([l3[ihl], l3[ihl + 1], l3[ihl + 2], l3[ihl + 3]]) as u64;
    }
    mix(mix(addrs) ^ (ports << 8 | proto as u64))
}

/// Per-context sequence numbers; owned by whoever holds the ingress lock.
pub(crate) struct IngressState {
    pub next_seq: Vec<u32>,
}
