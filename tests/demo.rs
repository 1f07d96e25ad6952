//! The default job: the Trio-ML demo's checks hold on a small configuration.

use pfemu::bench::demo::{run, DemoConfig};

#[test]
fn the_demo_sums_exactly_and_leaves_the_straggler_out_of_round_two_only() {
    let r = run(&DemoConfig {
        gradients: 5_000,
        // Generous: a busy machine must not delay an on-time worker past the timeout.
        block_exp_ms: 60,
        straggle_ms: 300,
        ppe_threads: 16,
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
