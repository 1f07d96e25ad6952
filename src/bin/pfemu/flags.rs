//! Errors name the option the user typed: a [`ConfigError`] from the library names the
//! setting behind an option (`frame_size` for `--size`, `line_rate_gbps` for
//! `--line-rate`); at the command line's boundary it is restated with the option of the
//! command that ran, found in the command's own clap definition.

use std::error::Error;

use clap::{ArgMatches, Command, CommandFactory};
use pfemu::lab::bench::linerate::LinerateError;
use pfemu::lab::bench::BenchError;
use pfemu::microcode::trio_ml::TrioMlError;
use pfemu::ConfigError;

use super::Cli;

/// Settings whose option is spelt differently, with the options to try, in order (an
/// option is tried by its long name and by the field it sets).
const ALIASES: &[(&str, &[&str])] = &[
    ("frame_size", &["size", "sizes"]),
    ("sizes", &["sizes", "size"]),
    ("duration", &["duration"]),
    ("line_rate_gbps", &["line-rate"]),
    ("loss_tolerance", &["loss"]),
    ("trial_duration", &["trial-ms"]),
    ("max_trials_per_size", &["max-trials"]),
    ("initial_rate", &["initial"]),
    ("reference_pps", &["reference-mpps"]),
    ("block_grad_max", &["grads"]),
    ("block_exp", &["block-exp-ms"]),
    ("ports", &["iface", "ports"]),
    ("route_file", &["route-file", "routes"]),
    ("timer_period", &["period-ms", "scan-period-ms"]),
    ("trace_one_in", &["trace-one-in"]),
    ("trace_file", &["trace-file"]),
];

/// The subcommand that ran (`pfemu bench filter` is `bench`'s `filter`), from its matches.
pub fn invoked(matches: &ArgMatches) -> Command {
    let mut cmd = Cli::command();
    let mut m = matches;
    while let Some((name, sub)) = m.subcommand() {
        match cmd.find_subcommand(name) {
            Some(c) => cmd = c.clone(),
            None => break,
        }
        m = sub;
    }
    cmd
}

/// The commands whose errors are restated: the lab's benches and experiments (`serve`,
/// `worker` and `replay` name their options themselves).
const RESTATED: &[&str] = &["demo", "run", "bench", "experiment", "linerate", "latency"];

/// `e` restated as `invalid option `--flag`: reason` when it is (or wraps) a refused
/// setting that `cmd` has an option for; `None` otherwise, and for commands outside
/// [`RESTATED`]. `top` is the command typed after `pfemu`.
pub fn refused_option(
    e: &(dyn Error + 'static),
    top: Option<&str>,
    cmd: &Command,
) -> Option<String> {
    if !top.is_some_and(|t| RESTATED.contains(&t)) {
        return None;
    }
    let config = config_error(e)?;
    let flag = flag_of(config.setting, cmd)?;
    Some(format!("invalid option `--{flag}`: {}", config.reason))
}

/// The [`ConfigError`] `e` is or wraps, if any.
fn config_error<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a ConfigError> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(c) = e.downcast_ref::<ConfigError>() {
            return Some(c);
        }
        // TrioMlError does not expose what it wraps as its source.
        if let Some(BenchError::TrioMl(TrioMlError::Config(c))) = e.downcast_ref::<BenchError>() {
            return Some(c);
        }
        if let Some(TrioMlError::Config(c)) = e.downcast_ref::<TrioMlError>() {
            return Some(c);
        }
        if let Some(LinerateError::Config(c)) = e.downcast_ref::<LinerateError>() {
            return Some(c);
        }
        cur = e.source();
    }
    None
}

/// The long name of `cmd`'s option for `setting`: its alias, or the option spelt as the
/// setting (`reorder_contexts` is `--reorder-contexts`), or the option that sets the field
/// named `setting` (`batch_size` is `--batch`).
fn flag_of(setting: &str, cmd: &Command) -> Option<String> {
    let spelt = setting.replace('_', "-");
    let candidates: Vec<&str> = ALIASES
        .iter()
        .find(|(s, _)| *s == setting)
        .map_or_else(|| vec![spelt.as_str()], |(_, c)| c.to_vec());
    for c in candidates {
        let by_long = cmd.get_arguments().find(|a| a.get_long() == Some(c));
        let by_id = cmd
            .get_arguments()
            .find(|a| a.get_id().as_str() == c.replace('-', "_"));
        if let Some(long) = by_long.or(by_id).and_then(|a| a.get_long()) {
            return Some(long.to_string());
        }
    }
    None
}
