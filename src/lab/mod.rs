//! The lab around the engine: what `pfemu`'s command runs, and what its tests and benchmarks
//! use. Behind the default feature `lab`, so that an embedder who only wants a `Pfe` does not
//! build it or its dependencies.
//!
//! - [`bench`](mod@bench): the traffic generator, the benchmarks behind `pfemu bench`, the Trio-ML demo,
//!   the experiments behind `pfemu experiment`, plots and reports.
//! - [`aggregation`]: a PFE set up with aggregation jobs (Trio-ML or FPISA), as `serve` and
//!   `replay` both run it.
//! - [`replay`]: capture files through a PFE (`pfemu replay`).
//! - [`serve`]: the UDP front end for real end hosts (`pfemu serve`, `pfemu worker`).
//! - [`ports`]: Linux interfaces (AF_PACKET rings, TAP devices) as PFE ports, and
//!   [`live`]: a shipped program on them (`pfemu run --iface`).
//! - [`control`]: the runtime control plane, HTTP with JSON and Prometheus metrics
//!   (`--control`, `pfemu ctl`).
//! - [`trace`]: per-packet traces written to a file or standard error (`--trace`).
//! - [`udp_batch`]: many UDP datagrams per system call, with GSO/GRO, for `serve`; like
//!   `ports`, a module of `unsafe` system calls.

pub mod aggregation;
pub mod bench;
pub mod control;
pub mod live;
pub mod ports;
pub mod replay;
pub mod serve;
pub mod trace;
pub mod udp_batch;
