//! The default job: the Trio-ML demo's checks hold on a small configuration.

#![cfg(feature = "lab")]

use pfemu::lab::bench::demo::{run, DemoConfig};

/// On a manual clock that moves with the demo's progress, not with the machine's speed: no
/// on-time worker can be late for the timeout, and the straggler is always late.
#[test]
fn the_demo_sums_exactly_and_leaves_the_straggler_out_of_round_two_only() {
    let r = run(&DemoConfig {
        gradients: 5_000,
        ppe_threads: 16,
        manual_clock: true,
        ..DemoConfig::default()
    })
    .unwrap();
    assert!(r.ok(), "{r:#?}");
    assert_eq!(r.all_in.src_cnt, [4]);
    assert_eq!(r.all_in.degraded, 0);
    assert_eq!(r.with_straggler.src_cnt, [3]);
    let chunks = 5_000u64.div_ceil(1024);
    assert_eq!(r.with_straggler.degraded, 3 * chunks);
    assert!(r.all_in.max_abs_error < 1e-6);
    assert!(r.stats.timer_runs > 0);
    assert_eq!(r.stats.drops("late") + r.stats.drops("stale_gen"), chunks);
}

#[test]
fn the_manual_clock_needs_every_packet_in_flight_at_once() {
    let err = run(&DemoConfig {
        gradients: 5_000,
        window: 4,
        ppe_threads: 2,
        manual_clock: true,
        ..DemoConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("window"), "{err}");
}
