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

/// A library caller gets the settings the CLI refuses refused too, before anything runs:
/// a straggler late by years used to be waited for.
#[test]
fn settings_no_demo_can_run_are_refused_before_it_starts() {
    let base = DemoConfig {
        gradients: 5_000,
        ppe_threads: 2,
        ..DemoConfig::default()
    };
    let cases = [
        (
            DemoConfig {
                straggle_ms: u64::MAX,
                ..base.clone()
            },
            "straggle_ms",
        ),
        (
            DemoConfig {
                straggle_ms: 10,
                ..base.clone()
            },
            "straggle_ms",
        ),
        (
            DemoConfig {
                workers: 1,
                ..base.clone()
            },
            "workers",
        ),
        (
            DemoConfig {
                block_exp_ms: 0,
                ..base.clone()
            },
            "block_exp_ms",
        ),
        (
            DemoConfig {
                gradients: 0,
                ..base.clone()
            },
            "gradients",
        ),
        (
            DemoConfig {
                window: 40_000,
                ..base.clone()
            },
            "window",
        ),
        // Within 16 bits, but more slots than a job has.
        (
            DemoConfig {
                window: 3_000,
                ..base.clone()
            },
            "window",
        ),
        (
            DemoConfig {
                grads_per_packet: 0,
                ..base.clone()
            },
            "grads_per_packet",
        ),
        (
            DemoConfig {
                grads_per_packet: 5_000,
                ..base.clone()
            },
            "grads_per_packet",
        ),
        (
            DemoConfig {
                window: 4,
                manual_clock: true,
                ..base.clone()
            },
            "window",
        ),
    ];
    for (cfg, setting) in cases {
        assert_eq!(cfg.check().unwrap_err().setting, setting, "{cfg:?}");
        // run refuses it too, at once (on a thread, so that a demo that ran would fail the
        // deadline rather than hang the test).
        let (tx, rx) = std::sync::mpsc::channel();
        let c = cfg.clone();
        std::thread::spawn(move || tx.send(run(&c).map(|_| ()).map_err(|e| e.to_string())));
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("run refuses a setting without running")
            .unwrap_err();
        assert!(err.contains(setting), "{err}");
    }
    // With the manual clock the straggler's delay is not used: a short one runs.
    assert!(DemoConfig {
        straggle_ms: 0,
        manual_clock: true,
        ..base
    }
    .check()
    .is_ok());
}
