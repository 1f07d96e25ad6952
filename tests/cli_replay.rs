//! `pfemu replay`'s options: a value that is wrong is named as wrong, and an option that
//! does not apply to the replay asked for is refused by name rather than ignored.

#![cfg(feature = "lab")]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_pfemu");

/// A fresh output directory for one test.
fn out_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-replay-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `pfemu replay --pcap CAPTURE --out OUT ARGS`.
fn replay(capture: &str, out: &std::path::Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["replay", "--pcap", capture, "--out"])
        .arg(out)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run pfemu")
}

/// The replay fails (exit status 2) before writing anything, its error containing every
/// one of `says`; returns the error.
fn refused(capture: &str, name: &str, args: &[&str], says: &[&str]) -> String {
    let out = out_dir(name);
    let o = replay(capture, &out, args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{args:?} was not refused:\n{err}");
    assert!(!err.contains("panicked"), "{args:?}:\n{err}");
    for s in says {
        assert!(err.contains(s), "{args:?}: {s:?} missing from:\n{err}");
    }
    assert!(!out.exists(), "{args:?}: nothing written");
    err
}

const FILTER: &str = "examples/captures/filter-mix.pcap";
const L3FWD: &str = "examples/captures/l3fwd.pcap";
const ROUTES: &str = "examples/captures/l3fwd-routes.txt";

/// A speed that is no speed is named as such, whatever the timing: `--timing fast --speed
/// nan` used to be told the option applies to `--timing recorded` only.
#[test]
fn an_invalid_speed_is_named_as_invalid_whatever_the_timing() {
    for (name, args) in [
        ("fast-nan", &["--timing", "fast", "--speed", "nan"][..]),
        ("default-nan", &["--speed", "nan"]),
        ("fast-inf", &["--timing", "fast", "--speed", "inf"]),
        ("fast-zero", &["--timing", "fast", "--speed", "0"]),
        ("recorded-nan", &["--timing", "recorded", "--speed", "nan"]),
    ] {
        let err = refused(
            FILTER,
            name,
            args,
            &[
                "invalid option `--speed`",
                "is not a positive, finite speed-up factor",
            ],
        );
        assert!(!err.contains("applies to"), "{name}: {err}");
    }
    // A valid speed with the fast or capture timing: it applies to recorded timing only.
    for (name, args) in [
        ("fast-2", &["--timing", "fast", "--speed", "2"][..]),
        ("fast-1", &["--speed", "1"]),
        ("capture-2", &["--timing", "capture", "--speed", "2"]),
    ] {
        refused(
            FILTER,
            name,
            args,
            &["invalid option `--speed`: applies to `--timing recorded` only"],
        );
    }
}

/// `--routes` and `--route-ports` shape generated l3fwd routes: with a route file, or with
/// another program, they used to be ignored without a word.
#[test]
fn route_options_are_refused_where_no_routes_are_generated() {
    for flag in ["--routes", "--route-ports"] {
        refused(
            L3FWD,
            "with-file",
            &["--program", "l3fwd", "--route-file", ROUTES, flag, "8"],
            &[&format!("invalid option `{flag}`"), "--route-file replaces"],
        );
        for program in [
            &["--program", "filter"][..],
            &[],
            &["--program", "trio-ml", "--job", "1:4"],
        ] {
            let args: Vec<&str> = program.iter().copied().chain([flag, "8"]).collect();
            refused(
                FILTER,
                "other-program",
                &args,
                &[&format!(
                    "invalid option `{flag}`: applies to `--program l3fwd` only"
                )],
            );
        }
    }
}

/// The options still work where they apply: generated routes take them, a route file
/// alone is read.
#[test]
fn route_options_apply_to_generated_routes() {
    for (name, args) in [
        (
            "generated",
            &["--program", "l3fwd", "--routes", "50", "--route-ports", "4"][..],
        ),
        ("file", &["--program", "l3fwd", "--route-file", ROUTES]),
    ] {
        let out = out_dir(name);
        let o = replay(
            L3FWD,
            &out,
            &[args, &["--ppe-threads", "1", "--json"]].concat(),
        );
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
        assert!(v["packets_in"].as_u64().unwrap() > 0, "{name}: {v}");
    }
}
