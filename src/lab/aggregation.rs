//! An aggregation program (Trio-ML or FPISA) and its jobs, set up alike by `pfemu serve`
//! ([`crate::lab::serve`]) and `pfemu replay` ([`crate::lab::replay`]).

use std::net::Ipv4Addr;
use std::sync::Arc;

use serde::Serialize;

use crate::fpisa::Variant;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::trio_ml::wire::MAX_GRAD_CNT;
use crate::microcode::trio_ml::{
    JobConfig, Lanes, TrioMl, TrioMlConfig, TrioMlError, DEFAULT_HASH_CAPACITY, NO_BLOCK_TIMEOUT,
};
use crate::packet::Dest;
use crate::ConfigError;

/// What the gradients are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Aggregation {
    /// Trio-ML: 32-bit two's-complement integers.
    TrioMl,
    /// FPISA: FP32 floats, with the given variant.
    Fpisa(#[serde(skip)] Variant),
}

/// One job of the server: `job_id` with the sources `first..first + count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct JobSpec {
    /// The job id.
    pub job_id: u8,
    /// The first source id.
    pub first_src: u8,
    /// How many sources (consecutive ids from `first_src`).
    pub sources: u8,
}

impl std::str::FromStr for JobSpec {
    type Err = ConfigError;

    /// `JOB:N` (sources `0..N`) or `JOB:A..B` (sources `A..B`), e.g. `1:4` or `1:2..4`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let bad = |reason: String| {
            ConfigError::new(
                "job",
                format!("`{s}`: {reason} (expected JOB:N or JOB:FIRST..END, e.g. 1:4)"),
            )
        };
        let (job, srcs) = s.split_once(':').ok_or_else(|| bad("no `:`".into()))?;
        let job_id: u8 = job
            .trim()
            .parse()
            .map_err(|e| bad(format!("job id: {e}")))?;
        let (first, end) = match srcs.split_once("..") {
            Some((a, b)) => (
                a.trim().parse::<u16>().map_err(|e| bad(format!("{e}")))?,
                b.trim().parse::<u16>().map_err(|e| bad(format!("{e}")))?,
            ),
            None => (
                0,
                srcs.trim()
                    .parse::<u16>()
                    .map_err(|e| bad(format!("{e}")))?,
            ),
        };
        if first >= end || end > 256 {
            return Err(bad(format!(
                "sources {first}..{end}: need at least one, ids below 256"
            )));
        }
        Ok(JobSpec {
            job_id,
            first_src: first as u8,
            sources: u8::try_from(end - first).map_err(|_| bad("at most 255 sources".into()))?,
        })
    }
}

impl JobSpec {
    /// The jobs of a jobs file's text: one `JOB:N` or `JOB:FIRST..END` per line (as
    /// `--job` takes them); `#` starts a comment and blank lines are skipped. An error
    /// names the line.
    ///
    /// ```
    /// use pfemu::lab::aggregation::JobSpec;
    ///
    /// let jobs = JobSpec::parse_list("# two jobs\n1:4\n2:8..12   # sources 8 to 11\n")?;
    /// assert_eq!(jobs, ["1:4".parse()?, "2:8..12".parse()?]);
    /// assert!(JobSpec::parse_list("1:4\n2:\n").unwrap_err().to_string().contains("line 2"));
    /// # Ok::<(), pfemu::ConfigError>(())
    /// ```
    pub fn parse_list(text: &str) -> Result<Vec<JobSpec>, ConfigError> {
        let mut jobs = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            jobs.push(
                line.parse()
                    .map_err(|e| ConfigError::new("jobs_file", format!("line {}: {e}", n + 1)))?,
            );
        }
        Ok(jobs)
    }

    /// The jobs of the jobs file at `path` ([`JobSpec::parse_list`]).
    pub fn read_list(path: &std::path::Path) -> Result<Vec<JobSpec>, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("jobs_file", format!("reading {}: {e}", path.display()))
        })?;
        let jobs = JobSpec::parse_list(&text)?;
        if jobs.is_empty() {
            return Err(ConfigError::new(
                "jobs_file",
                format!("{} lists no job", path.display()),
            ));
        }
        Ok(jobs)
    }
}

/// An aggregation program and its jobs, set up alike by a server
/// ([`crate::lab::serve::Server`], `pfemu serve`) and by a replay ([`crate::lab::replay`], `pfemu replay --program trio-ml`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggregationSetup {
    /// Integer (Trio-ML) or floating-point (FPISA, either variant) gradients.
    pub aggregation: Aggregation,
    /// The jobs (at least one): job `job_id` with its sources; its Results leave on port
    /// `job_id`.
    pub jobs: Vec<JobSpec>,
    /// Block timeout of every job, in milliseconds (1..=255): a block that no packet
    /// touched for this long gets a partial Result. [`NO_BLOCK_TIMEOUT`] (0): none, every
    /// block waits for all its sources however late one comes (no partial Results; `pfemu
    /// serve --block-exp-ms off`).
    pub block_exp_ms: u8,
    /// A kept Result nobody asked for during this long is dropped and its slot freed, in
    /// milliseconds (0: kept until the next generation of its block id replaces it; at
    /// most 1000 s). Make it longer than the workers' retransmission timeout.
    pub keep_result_ms: u32,
    /// The largest worker window (block ids a worker has in flight, 1..=2047): every job
    /// needs at least `2 * window` block slots (a block id's kept Result and its next
    /// generation).
    pub window: usize,
    /// Block slots per job (`block_cnt_max`: active blocks and kept Results, 1..=4095, at
    /// least `2 * window`). `None`: the paper's 4095 (its 12-bit field) where memory allows
    /// ([`SLOT_MEMORY_BYTES`] over all jobs), never fewer than `2 * window`. See
    /// [`AggregationSetup::slots`].
    pub block_cnt_max: Option<u16>,
    /// Most gradients per packet (1..=4095).
    pub block_grad_max: u16,
    /// Timer threads sharing the straggler scan (1 ms per whole scan).
    pub timers: u32,
}

impl Default for AggregationSetup {
    /// Trio-ML, no jobs (give some), a 20 ms block timeout, Results kept 1 s, window 64,
    /// 1024 gradients per packet, 4 timers.
    fn default() -> Self {
        AggregationSetup {
            aggregation: Aggregation::TrioMl,
            jobs: Vec::new(),
            block_exp_ms: 20,
            keep_result_ms: 1000,
            window: 64,
            block_cnt_max: None,
            block_grad_max: 1024,
            timers: 4,
        }
    }
}

/// Memory the jobs' block slots may take together when [`AggregationSetup::block_cnt_max`]
/// is not given (1 GiB): each job gets the paper's 4095 slots, or as many as fit.
pub const SLOT_MEMORY_BYTES: u64 = 1 << 30;

impl AggregationSetup {
    /// `jobs` aggregated as `aggregation`, with the defaults of the other settings.
    pub fn new(aggregation: Aggregation, jobs: Vec<JobSpec>) -> Self {
        AggregationSetup {
            aggregation,
            jobs,
            ..AggregationSetup::default()
        }
    }

    /// Block slots per job: [`AggregationSetup::block_cnt_max`], or the paper's 4095 where
    /// [`SLOT_MEMORY_BYTES`] holds them for every job, never fewer than `2 * window`.
    pub fn slots(&self) -> u16 {
        if let Some(n) = self.block_cnt_max {
            return n;
        }
        let jobs = self.jobs.len().max(1) as u64;
        let fit = SLOT_MEMORY_BYTES / (jobs * self.slot_bytes());
        (fit.min(4095) as u16).max((2 * self.window).min(4095) as u16)
    }

    /// Bytes of one block slot: its record line, and its buffer twice over (the job's
    /// region keeps room for it beside the record; the accumulator region holds it when
    /// there is room).
    fn slot_bytes(&self) -> u64 {
        let per_grad = match self.aggregation {
            Aggregation::TrioMl => 4,
            Aggregation::Fpisa(_) => 8,
        };
        let buffer = (u64::from(self.block_grad_max) * per_grad).next_multiple_of(64);
        64 + 2 * buffer
    }

    /// Shared memory sized for the jobs' regions ([`MemConfig::default`], grown to hold
    /// every job's slots, buffers and records).
    pub fn mem_config(&self) -> MemConfig {
        let d = MemConfig::default();
        let jobs = self.jobs.len() as u64;
        let buffer = (self.slot_bytes() - 64) / 2;
        let slots = u64::from(self.slots());
        // Record, join words and bitmap: under 3 KiB a job; the tables and routes live in
        // SRAM.
        let regions = jobs * (4096 + slots * (64 + buffer));
        MemConfig {
            dram_bytes: d.dram_bytes.max((regions + (8 << 20)).next_multiple_of(64)),
            acc_bytes: d
                .acc_bytes
                .max((jobs * slots * buffer + (1 << 20)).next_multiple_of(64)),
            ..d
        }
    }

    /// The jobs' block timeout; `None` without one ([`NO_BLOCK_TIMEOUT`]).
    pub fn block_timeout(&self) -> Option<std::time::Duration> {
        (self.block_exp_ms != NO_BLOCK_TIMEOUT)
            .then(|| std::time::Duration::from_millis(u64::from(self.block_exp_ms)))
    }

    /// Sources over all jobs.
    pub fn sources(&self) -> usize {
        self.jobs.iter().map(|j| usize::from(j.sources)).sum()
    }

    /// The largest job id plus one (0 without jobs): the ports the jobs' Results need.
    pub fn job_ports(&self) -> usize {
        self.jobs
            .iter()
            .map(|j| usize::from(j.job_id) + 1)
            .max()
            .unwrap_or(0)
    }

    /// The settings of job `job_id` as [`AggregationSetup::install`] adds it, without its
    /// sources: [`AggregationSetup::slots`] slots, Results from `out_src_addr` to
    /// `239.0.0.<job_id>`, out of port `job_id`. A job added while the program runs (the
    /// control plane's `jobs add`) starts from these.
    pub fn job_config(&self, job_id: u8, out_src_addr: Ipv4Addr) -> JobConfig {
        JobConfig {
            job_id,
            sources: Vec::new(),
            block_cnt_max: self.slots(),
            block_grad_max: self.block_grad_max,
            block_exp_ms: self.block_exp_ms,
            out_src_addr,
            out_dst_addr: Ipv4Addr::new(239, 0, 0, job_id),
            out_dest: Dest::Port(u16::from(job_id)),
        }
    }

    /// Checks the settings and installs the program in `mem` (sized by
    /// [`AggregationSetup::mem_config`]) with every job: [`AggregationSetup::slots`] slots
    /// each, Results from `out_src_addr` (its low byte is their `src_id`) to
    /// `239.0.0.<job_id>`, out of port `job_id`. The refusal names the setting.
    pub fn install(
        &self,
        mem: &Arc<SharedMemory>,
        out_src_addr: Ipv4Addr,
    ) -> Result<TrioMl, ConfigError> {
        if self.jobs.is_empty() {
            return Err(ConfigError::new(
                "jobs",
                "no aggregation jobs: give at least one as JOB:N (sources 0..N) or \
                 JOB:FIRST..END, e.g. 1:4 (`--job 1:4`)",
            ));
        }
        if !(1..=2047).contains(&self.window) {
            return Err(ConfigError::new(
                "window",
                format!(
                    "{} is not in 1..=2047 (each job needs 2 * window block slots, at most 4095)",
                    self.window
                ),
            ));
        }
        if let Some(n) = self.block_cnt_max {
            if !(1..=4095).contains(&n) || usize::from(n) < 2 * self.window {
                return Err(ConfigError::new(
                    "block_cnt_max",
                    format!(
                        "{n} is not in {}..=4095: a job needs 2 * window block slots (window {})",
                        2 * self.window,
                        self.window
                    ),
                ));
            }
        }
        if !(1..=MAX_GRAD_CNT).contains(&self.block_grad_max) {
            return Err(ConfigError::new(
                "block_grad_max",
                format!("{} is not in 1..={MAX_GRAD_CNT}", self.block_grad_max),
            ));
        }
        if self.keep_result_ms > 1_000_000 {
            return Err(ConfigError::new(
                "keep_result_ms",
                format!("{} ms is more than 1000 s", self.keep_result_ms),
            ));
        }
        let slots = usize::from(self.slots());
        let tcfg = TrioMlConfig {
            lanes: match self.aggregation {
                Aggregation::TrioMl => Lanes::Int32,
                Aggregation::Fpisa(v) => Lanes::Fpisa(v),
            },
            timers: self.timers,
            keep_result_ns: u64::from(self.keep_result_ms) * 1_000_000,
            // Room for every slot of every job (a full table refuses blocks as
            // `table_full`).
            hash_capacity: (slots * self.jobs.len()).max(DEFAULT_HASH_CAPACITY),
            ..TrioMlConfig::default()
        };
        let trio = TrioMl::install(mem, tcfg).map_err(|e| match e {
            TrioMlError::Config(c) => c,
            e => ConfigError::new("aggregation", format!("installing the program: {e}")),
        })?;
        let mut seen = [false; 256];
        for j in &self.jobs {
            if std::mem::replace(&mut seen[usize::from(j.job_id)], true) {
                return Err(ConfigError::new(
                    "jobs",
                    format!("job {} is given twice", j.job_id),
                ));
            }
            trio.add_job(&JobConfig {
                sources: (0..j.sources).map(|s| j.first_src + s).collect(),
                ..self.job_config(j.job_id, out_src_addr)
            })
            .map_err(|e| match e {
                TrioMlError::Config(c) => c,
                e => ConfigError::new("jobs", format!("job {}: {e}", j.job_id)),
            })?;
        }
        Ok(trio)
    }
}

#[cfg(test)]
mod tests {
    use super::JobSpec;

    #[test]
    fn job_specs_parse() {
        let j: JobSpec = "1:4".parse().unwrap();
        assert_eq!((j.job_id, j.first_src, j.sources), (1, 0, 4));
        let j: JobSpec = "7:2..4".parse().unwrap();
        assert_eq!((j.job_id, j.first_src, j.sources), (7, 2, 2));
        for bad in ["1", "x:4", "1:0", "1:4..2", "300:1", "1:0..257"] {
            assert!(bad.parse::<JobSpec>().is_err(), "{bad}");
        }
    }
}
