//! `pfemu ctl`: the client of a running PFE's control plane (`pfemu::lab::control`).

use serde_json::{json, Value};

use pfemu::lab::control::{percent_encode, request, DEFAULT_ADDR};

use super::CliResult;

pub const HELP: &str = "Examples:
  pfemu ctl stats
  pfemu ctl metrics                                  # the Prometheus text format
  pfemu ctl regions
  pfemu ctl read --region nimble.classes --words 7
  pfemu ctl write --addr 0x40 7 8 9
  pfemu ctl timers
  pfemu ctl timer 0 --period-ms 5
  pfemu ctl timer 0 --off
  pfemu ctl targets
  pfemu ctl call classes set_rate '{\"class\": 0, \"bps\": 12000000000}'
  pfemu ctl --control 10.0.0.1:9477 call jobs list

Talks to the control plane of a pfemu that runs with --control (run, serve), or of a
program that embeds pfemu::lab::control::ControlServer: HTTP with JSON on --control's
address (127.0.0.1:9477 by default). Prints the answer (JSON, or the metrics' text); exit
status 1 with the server's message when it refuses a request. The same requests work with
curl: `curl -s localhost:9477/stats`, `curl -s -d '{\"enabled\": false}'
localhost:9477/timers/0`.";

#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// The control plane's address (HOST:PORT).
    #[arg(long = "control", default_value = DEFAULT_ADDR)]
    addr: String,
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand, Debug)]
enum What {
    /// The engine's counters (JSON).
    Stats,
    /// The engine's counters in the Prometheus text format.
    Metrics,
    /// The shared memory's named regions.
    Regions,
    /// Reads words of shared memory: at --addr, or --offset words into --region.
    Read {
        #[command(flatten)]
        at: At,
        /// Words to read (1 to 4096).
        #[arg(long, default_value_t = 1)]
        words: u64,
    },
    /// Writes words (decimal or 0x-hex) to shared memory: at --addr, or into --region.
    Write {
        #[command(flatten)]
        at: At,
        /// The words.
        #[arg(required = true, value_parser = parse_word)]
        words: Vec<u64>,
    },
    /// The timers: period, next launch, on or off.
    Timers,
    /// Changes a timer: a new period from its next launch, and/or off or on.
    Timer {
        /// The timer's index (see `pfemu ctl timers`).
        index: usize,
        /// The new period, milliseconds (fractions allowed).
        #[arg(long = "period-ms", value_name = "MS")]
        period_ms: Option<f64>,
        /// Switch it off.
        #[arg(long, conflicts_with = "on")]
        off: bool,
        /// Switch it on.
        #[arg(long)]
        on: bool,
    },
    /// The program's tables and their commands.
    Targets,
    /// Runs a command of a program's table: `call TARGET COMMAND [JSON]`.
    Call {
        /// The table (see `pfemu ctl targets`).
        target: String,
        /// The command.
        command: String,
        /// Its arguments, a JSON object ({} if omitted).
        args: Option<String>,
    },
}

#[derive(clap::Args, Debug)]
struct At {
    /// A word address (decimal or 0x-hex).
    #[arg(long, value_parser = parse_word, conflicts_with = "region")]
    addr: Option<u64>,
    /// A named region (see `pfemu ctl regions`).
    #[arg(long)]
    region: Option<String>,
    /// Words into the region.
    #[arg(long, default_value_t = 0, requires = "region")]
    offset: u64,
}

fn parse_word(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("`{s}` is not a number from 0 to 2^64 - 1 (decimal or 0x-hex)"))
}

impl At {
    fn query(&self) -> Result<String, String> {
        match (&self.addr, &self.region) {
            (Some(a), None) => Ok(format!("addr={a}")),
            (None, Some(r)) => Ok(format!(
                "region={}&offset={}",
                percent_encode(r),
                self.offset
            )),
            _ => Err("give --addr or --region".into()),
        }
    }

    fn json(&self) -> Result<Value, String> {
        match (&self.addr, &self.region) {
            (Some(a), None) => Ok(json!({ "addr": a })),
            (None, Some(r)) => Ok(json!({ "region": r, "offset": self.offset })),
            _ => Err("give --addr or --region".into()),
        }
    }
}

pub fn ctl(a: &CtlArgs) -> CliResult {
    let (method, path, body) = match &a.what {
        What::Stats => ("GET", "/stats".to_string(), None),
        What::Metrics => ("GET", "/metrics".to_string(), None),
        What::Regions => ("GET", "/memory/regions".to_string(), None),
        What::Read { at, words } => (
            "GET",
            format!("/memory?{}&words={words}", at.query()?),
            None,
        ),
        What::Write { at, words } => {
            let mut b = at.json()?;
            b["words"] = json!(words);
            ("POST", "/memory".to_string(), Some(b))
        }
        What::Timers => ("GET", "/timers".to_string(), None),
        What::Timer {
            index,
            period_ms,
            off,
            on,
        } => {
            let mut b = json!({});
            if let Some(ms) = period_ms {
                let ns = ms * 1e6;
                if !(ns.is_finite() && (1.0..=1e18).contains(&ns)) {
                    return Err(
                        format!("invalid option `--period-ms`: {ms} (1 ns to 10^12 ms)").into(),
                    );
                }
                b["period_ns"] = json!(ns.round() as u64);
            }
            if *off || *on {
                b["enabled"] = json!(*on);
            }
            if b.as_object().is_some_and(|o| o.is_empty()) {
                return Err("give --period-ms, --off or --on".into());
            }
            ("POST", format!("/timers/{index}"), Some(b))
        }
        What::Targets => ("GET", "/targets".to_string(), None),
        What::Call {
            target,
            command,
            args,
        } => {
            let b: Value = match args {
                Some(text) => serde_json::from_str(text)
                    .map_err(|e| format!("the arguments are not JSON ({e}): {text}"))?,
                None => json!({}),
            };
            (
                "POST",
                format!(
                    "/targets/{}/{}",
                    percent_encode(target),
                    percent_encode(command)
                ),
                Some(b),
            )
        }
    };
    let (status, text) = request(&a.addr, method, &path, body.as_ref())?;
    if status != 200 {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let msg = v["error"].as_str().map_or(text.clone(), str::to_string);
        return Err(format!("the control plane refused {method} {path} ({status}): {msg}").into());
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(v) => println!("{}", serde_json::to_string_pretty(&v)?),
        Err(_) => print!("{text}"),
    }
    Ok(())
}
