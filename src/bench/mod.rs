//! Benchmark support: the traffic generator and the filter benchmark behind `pfemu bench`.

pub mod filter;
pub mod traffic;
