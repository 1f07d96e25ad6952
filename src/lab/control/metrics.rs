//! The `/metrics` answer, gathered by family before it is written.
//!
//! The Prometheus text format (version 0.0.4) wants each metric family once: one `# HELP`
//! and one `# TYPE` line, then all its samples together, told apart by their labels. The
//! engine and every [`Target`](super::Target) add samples to one [`Metrics`]; two targets
//! of one kind (ADA on the rate and on the time, say) add to the same families, and the
//! families are written once each when every sample is in.

use std::fmt::Write as _;

use super::escape_label;

/// A metric family's type, as its `# TYPE` line gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only grows (its name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Quantiles, with a `_sum` and a `_count` sample.
    Summary,
}

impl MetricKind {
    fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Summary => "summary",
        }
    }
}

/// One family: its help, its type and its samples, in the order they were added.
#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    kind: MetricKind,
    /// (the suffix after the family's name, `_sum` say; the rendered labels; the value).
    samples: Vec<(&'static str, String, String)>,
}

/// Metric families being gathered for one `/metrics` answer (module doc). Families are
/// written in the order they were first added; the first `help` and type given for a name
/// are the family's.
#[derive(Debug, Default)]
pub struct Metrics {
    families: Vec<Family>,
}

impl Metrics {
    /// No families yet.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Family `name` with no samples yet: written with its `# HELP` and `# TYPE` even if
    /// none is added (a counter by reason before anything happened, say).
    pub fn declare(&mut self, name: &str, help: &str, kind: MetricKind) {
        self.family(name, help, kind);
    }

    /// A counter sample of family `name` (`pfemu_packets_in_total`) with `labels`
    /// (name, value; values are escaped here).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        self.sample(
            name,
            help,
            MetricKind::Counter,
            "",
            labels,
            value.to_string(),
        );
    }

    /// A gauge sample of family `name` with `labels`.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.sample(name, help, MetricKind::Gauge, "", labels, value.to_string());
    }

    /// A sample of family `name` of type `kind`, written as `name` + `suffix` (`_sum` and
    /// `_count` of a summary; `""` otherwise) with `labels` and `value`.
    pub fn sample(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricKind,
        suffix: &'static str,
        labels: &[(&str, &str)],
        value: String,
    ) {
        let rendered = if labels.is_empty() {
            String::new()
        } else {
            let inner: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        };
        let i = self.family(name, help, kind);
        self.families[i].samples.push((suffix, rendered, value));
    }

    /// The index of family `name`, added if it is new.
    fn family(&mut self, name: &str, help: &str, kind: MetricKind) -> usize {
        match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        }
    }

    /// The families in the text format: each one's `# HELP` and `# TYPE` once, then its
    /// samples.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
            for (suffix, labels, value) in &f.samples {
                let _ = writeln!(out, "{}{suffix}{labels} {value}", f.name);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_help_and_type_per_family_samples_together() {
        let mut m = Metrics::new();
        m.counter("x_total", "X.", &[("operand", "rate")], 1);
        m.gauge("g", "G.", &[], 2.5);
        m.counter("x_total", "X again.", &[("operand", "dt")], 2);
        let text = m.render();
        assert_eq!(
            text,
            "# HELP x_total X.\n# TYPE x_total counter\nx_total{operand=\"rate\"} 1\n\
             x_total{operand=\"dt\"} 2\n# HELP g G.\n# TYPE g gauge\ng 2.5\n"
        );
    }

    #[test]
    fn labels_are_escaped_and_joined() {
        let mut m = Metrics::new();
        m.counter("c_total", "C.", &[("a", "q\"b\\"), ("b", "x\ny")], 7);
        assert!(m
            .render()
            .contains("c_total{a=\"q\\\"b\\\\\",b=\"x\\ny\"} 7\n"));
    }
}
