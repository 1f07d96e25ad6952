//! Benchmark support: the traffic generator and the benchmarks behind `pfemu bench`.

pub mod filter;
pub mod timers;
pub mod traffic;
