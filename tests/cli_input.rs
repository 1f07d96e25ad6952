//! What the command line refuses, and how: every option that comes from the user is checked
//! where it enters, with an error that names it, and nothing it is given makes pfemu panic
//! or hang (issue 13).

#![cfg(feature = "lab")]

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pfemu");

/// How long a refused command may take: they all fail before any real work.
const DEADLINE: Duration = Duration::from_secs(120);

/// Waits for `child` until `deadline`, reading its output meanwhile; a child still running
/// then is killed and the test fails, naming `what`.
fn wait_within(mut child: Child, deadline: Duration, what: &str) -> Output {
    let take = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = take(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = take(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`pfemu {what}` did not exit within {deadline:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// Runs `pfemu ARGS` to completion (within [`DEADLINE`]).
fn pfemu(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pfemu");
    wait_within(child, DEADLINE, &args.join(" "))
}

/// `pfemu ARGS` fails (exit status 2) with an error naming `option`, without a panic.
fn refused(args: &[&str], option: &str) -> String {
    let o = pfemu(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !err.contains("panicked"),
        "`pfemu {}` panicked:\n{err}",
        args.join(" ")
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "`pfemu {}` should fail: {err}",
        args.join(" ")
    );
    assert!(
        err.contains(option),
        "`pfemu {}`: the error does not name {option}:\n{err}",
        args.join(" ")
    );
    err
}

/// Durations given in seconds as floats: too large, zero, negative, NaN and infinite values
/// are refused where they enter, naming the option (they used to panic in
/// `Duration::from_secs_f64`, or print `NaNx` for `--duration 0`).
#[test]
fn float_durations_out_of_range_are_refused_naming_the_option() {
    let commands: [(&[&str], &str); 6] = [
        (&["bench", "filter", "--packets", "1000"], "--duration"),
        (&["bench", "l3fwd", "--routes", "100"], "--duration"),
        (&["run", "filter", "--packets", "1000"], "--duration"),
        (
            &["serve", "--listen", "127.0.0.1:0", "--job", "1:1"],
            "--seconds",
        ),
        (
            &["worker", "--server", "127.0.0.1:9", "--src", "0"],
            "--give-up-s",
        ),
        (&["bench", "timers"], "--seconds"),
    ];
    for (base, option) in commands {
        for value in ["1e300", "0", "-1", "NaN", "inf"] {
            let arg = format!("{option}={value}");
            let mut args = base.to_vec();
            args.push(&arg);
            let err = refused(&args, option);
            if value == "1e300" {
                assert!(err.contains("too large"), "{err}");
            }
        }
    }
    // Milliseconds as floats, likewise.
    let out = std::env::temp_dir().join(format!("pfemu-cli-input-{}", std::process::id()));
    let out = out.to_str().expect("a UTF-8 temp dir");
    let all: &[&str] = &["1e300", "0", "-1", "NaN", "inf"];
    for (base, option, values) in [
        (&["bench", "timers"][..], "--period-ms", all),
        (&["bench", "trio-ml"][..], "--scan-period-ms", all),
        (
            &["experiment", "fig14", "--out", out][..],
            "--scan-period-ms",
            all,
        ),
        // No compute at all is a valid emulated training.
        (
            &["experiment", "fig13", "--out", out][..],
            "--compute-ms",
            &["1e300", "-1", "NaN", "inf"][..],
        ),
    ] {
        for value in values {
            let arg = format!("{option}={value}");
            let mut args = base.to_vec();
            args.push(&arg);
            refused(&args, option);
        }
    }
    let _ = std::fs::remove_dir_all(out);
}

/// Sizes that cannot fit in memory are refused before anything is allocated, naming the
/// option (`demo --gradients 1000000000` used to abort on allocation, `bench l3fwd --routes
/// 100000000` to run for minutes).
#[test]
fn what_cannot_fit_in_memory_is_refused_naming_the_option() {
    for (args, option) in [
        (&["demo", "--gradients", "1000000000000"][..], "--gradients"),
        (
            &["bench", "l3fwd", "--routes", "100000000000"][..],
            "--routes",
        ),
        (
            &[
                "worker",
                "--server",
                "127.0.0.1:9",
                "--src",
                "0",
                "--gradients",
                "1000000000000",
            ][..],
            "--gradients",
        ),
        // Each worker's vector is --blocks packets of the largest --sizes.
        (
            &[
                "experiment",
                "--out",
                std::env::temp_dir().to_str().expect("UTF-8"),
                "fig15",
                "--sizes",
                "4095",
                "--blocks",
                "1000000",
            ][..],
            "--blocks",
        ),
    ] {
        let err = refused(args, option);
        assert!(err.contains("memory"), "{err}");
    }
}

/// `bench filter`'s heading says what was run: the sizes given (`imix`), and a duration
/// instead of a packet count when the run is timed.
#[test]
fn bench_filter_heading_describes_the_run() {
    let o = pfemu(&[
        "bench",
        "filter",
        "--packets",
        "3000",
        "--sizes",
        "imix",
        "--ppe-threads",
        "1",
    ]);
    let heading = filter_heading(&o);
    assert!(heading.contains("imix"), "{heading}");
    assert!(!heading.contains("64-byte"), "{heading}");
    assert!(heading.contains("3000 packets per run"), "{heading}");
    assert!(
        heading.contains("3000 distinct frames replayed"),
        "{heading}"
    );

    let o = pfemu(&[
        "bench",
        "filter",
        "--duration",
        "0.05",
        "--ppe-threads",
        "1",
    ]);
    let heading = filter_heading(&o);
    assert!(heading.contains("64-byte"), "{heading}");
    assert!(heading.contains("0.05 s per run"), "{heading}");
    assert!(!heading.contains("10000000"), "{heading}");
    // The pool is capped: a run by duration replays at most this many frames.
    assert!(
        heading.contains("1048576 distinct frames replayed"),
        "{heading}"
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("NaN"), "{text}");
}

/// `pfemu serve --json > serve.json` writes one JSON object: the `listening` line goes to
/// standard error with `--json`.
#[test]
fn serve_json_writes_only_json_on_stdout() {
    let child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--job",
            "1:1",
            "--seconds",
            "0.1",
            "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pfemu serve");
    let o = wait_within(child, DEADLINE, "serve --json");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.starts_with("listening 127.0.0.1:"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}):\n{}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    assert!(v["engine"].is_object(), "{v}");
}

/// The heading line of a successful `pfemu bench filter` run.
fn filter_heading(o: &Output) -> String {
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    text.lines()
        .find(|l| l.starts_with("filter,"))
        .unwrap_or_else(|| panic!("no heading in\n{text}"))
        .to_string()
}

/// Errors of `pfemu serve` and `pfemu worker` name the option the user typed, never the
/// library field behind it (`block_grad_max` for `--block-grad-max`, "invalid `values`:
/// nothing to aggregate" for `worker --gradients 0`; issue 14).
#[test]
fn serve_and_worker_errors_name_the_option_typed() {
    let serve = ["serve", "--listen", "127.0.0.1:0", "--job", "1:1"];
    let worker = ["worker", "--server", "127.0.0.1:9", "--src", "0"];
    // Two hours from now, in Unix milliseconds.
    let later = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        + 7_200_000)
        .to_string();
    let cases: [(&[&str], &[&str], &str, &str); 12] = [
        (
            &serve,
            &["--ppe-threads", "0"],
            "--ppe-threads",
            "ppe_threads",
        ),
        (
            &serve,
            &["--block-grad-max", "5000"],
            "--block-grad-max",
            "block_grad_max",
        ),
        (&serve, &["--window", "0"], "--window", "window"),
        (
            &serve,
            &["--block-exp-ms", "0"],
            "--block-exp-ms",
            "block_exp_ms",
        ),
        (
            &serve,
            &["--keep-result-ms", "2000000"],
            "--keep-result-ms",
            "keep_result_ms",
        ),
        (
            &serve,
            &["--block-cnt-max", "10"],
            "--block-cnt-max",
            "block_cnt_max",
        ),
        (&serve, &["--job", "1:2"], "--job", "jobs"),
        (&worker, &["--gradients", "0"], "--gradients", "values"),
        (
            &worker,
            &["--grads-per-packet", "0"],
            "--grads-per-packet",
            "grads_per_packet",
        ),
        (&worker, &["--window", "0"], "--window", "window"),
        (
            &worker,
            &["--start-at-ms", &later],
            "--start-at-ms",
            "start_at_ms",
        ),
        (
            &worker,
            &["--recv-buffer-kb", "4194304"],
            "--recv-buffer-kb",
            "recv_buffer_bytes",
        ),
    ];
    for (base, extra, option, field) in cases {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let err = refused(&args, &format!("invalid option `{option}`"));
        assert!(!err.contains(&format!("`{field}`")), "{err}");
    }
}

/// Errors of `pfemu replay` name the option typed too, and a route file's lines count from
/// 1: a file that cannot be read names no line ("route file line 0" before; issue 14).
#[test]
fn replay_errors_name_the_option_typed() {
    let dir = std::env::temp_dir().join(format!("pfemu-cli-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let out = dir.join("out");
    let out = out.to_str().expect("a UTF-8 temp dir");
    let trio = [
        "replay",
        "--pcap",
        "examples/captures/trio-ml-workers.pcapng",
        "--program",
        "trio-ml",
        "--job",
        "1:4",
        "--out",
        out,
    ];
    for (extra, option, field) in [
        (
            &["--block-grad-max", "5000"][..],
            "--block-grad-max",
            "block_grad_max",
        ),
        (&["--window", "0"], "--window", "window"),
        (&["--block-exp-ms", "0"], "--block-exp-ms", "block_exp_ms"),
        (
            &["--timing", "recorded", "--speed", "0"],
            "--speed",
            "speed",
        ),
        (&["--ppe-threads", "0"], "--ppe-threads", "ppe_threads"),
    ] {
        let args: Vec<&str> = trio.iter().chain(extra).copied().collect();
        let err = refused(&args, &format!("invalid option `{option}`"));
        assert!(!err.contains(&format!("`{field}`")), "{err}");
    }

    let l3fwd = |routes: &str| {
        let args = [
            "replay",
            "--pcap",
            "examples/captures/l3fwd.pcap",
            "--program",
            "l3fwd",
            "--route-file",
            routes,
            "--out",
            out,
        ];
        refused(&args, "invalid option `--route-file`")
    };
    let args = [
        "replay",
        "--pcap",
        "examples/captures/l3fwd.pcap",
        "--program",
        "l3fwd",
        "--route-ports",
        "0",
        "--out",
        out,
    ];
    refused(&args, "invalid option `--route-ports`");
    let missing = dir.join("no-such-routes.txt");
    let err = l3fwd(missing.to_str().expect("UTF-8"));
    assert!(
        err.contains("cannot read") && !err.contains("line 0"),
        "{err}"
    );
    let bad = dir.join("bad-routes.txt");
    std::fs::write(&bad, "10.0.0.0/33 1\n").expect("write routes");
    let err = l3fwd(bad.to_str().expect("UTF-8"));
    assert!(err.contains("route file line 1:"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader that goes away (`pfemu ... | head`) ends the command quietly, as it ends Unix
/// filters (by SIGPIPE), never with a panic about a failed print.
#[cfg(unix)]
#[test]
fn a_closed_output_pipe_ends_commands_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    for args in [
        &["--help"][..],
        &["demo", "--json"],
        &["bench", "filter", "--help"],
    ] {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pfemu");
        // Close our end of its stdout before it writes anything.
        drop(child.stdout.take());
        let o = wait_within(child, DEADLINE, &args.join(" "));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "pfemu {args:?}: {err}");
        assert!(
            o.status.success() || o.status.signal() == Some(13),
            "pfemu {args:?} ended with {:?}: {err}",
            o.status
        );
    }
}

/// Values no run can use are refused before anything runs, naming the option: a straggler
/// late by years, a timer count past what the bench allocates, a line rate, burst, reference
/// rate or load out of any link's range (they used to hang, abort on allocation, or run
/// and report 0 Mpps).
#[test]
fn values_no_run_can_use_are_refused_naming_the_option() {
    let cases: [(&[&str], &str); 13] = [
        (&["demo", "--straggle-ms", "100000000000"], "--straggle-ms"),
        (&["bench", "timers", "--timers", "4294967295"], "--timers"),
        (&["bench", "timers", "--timers", "100000000"], "--timers"),
        (
            &["bench", "timers", "--period-ms", "0.0000001"],
            "--period-ms",
        ),
        (&["linerate", "--line-rate", "1e30"], "--line-rate"),
        (&["latency", "--line-rate", "1e30"], "--line-rate"),
        (&["linerate", "--burst", "4294967296"], "--burst"),
        (&["latency", "--burst", "100000000"], "--burst"),
        (
            &["latency", "--reference-mpps", "1e-30"],
            "--reference-mpps",
        ),
        (&["latency", "--reference-mpps", "1e30"], "--reference-mpps"),
        (
            &["latency", "--loads", "1e30", "--reference-mpps", "1"],
            "--loads",
        ),
        (&["latency", "--loads", "0"], "--loads"),
        (&["latency", "--loads", "NaN"], "--loads"),
    ];
    for (args, option) in cases {
        refused(args, option);
    }
    // `--stats-every` is checked before any interface is opened.
    let err = refused(
        &[
            "run",
            "filter",
            "--iface",
            "0=pfemu-none0",
            "--stats-every",
            "1e20",
        ],
        "--stats-every",
    );
    assert!(err.contains("too large"), "{err}");
    refused(
        &["bench", "l3fwd", "--route-file", "/nonexistent/routes.txt"],
        "--route-file",
    );
}

/// `--reorder on|off` takes its value wherever the help offers it (it used to be a flag
/// that refused `off`, so reordering could not be switched off).
#[test]
fn reorder_takes_on_and_off() {
    for (command, off_says) in [
        ("run filter --packets 1000 --reorder off", "reordering off"),
        (
            "bench l3fwd --routes 100 --duration 0.05 --reorder off --json",
            "\"reorder\": false",
        ),
        (
            "bench nimble --duration 0.05 --reorder off --json",
            "\"reorder\": false",
        ),
    ] {
        let o = pfemu(&command.split(' ').collect::<Vec<_>>());
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "pfemu {command}: {all}");
        assert!(all.contains(off_says), "pfemu {command}: {all}");
    }
    refused(&["bench", "l3fwd", "--reorder", "maybe"], "--reorder");
}
