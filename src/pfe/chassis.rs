//! A chassis: several PFEs joined by an interconnect, as in a multi-PFE router (paper §4,
//! hierarchical aggregation; §6.1, Figure 11(b)).
//!
//! A link joins port `a` of one PFE to port `b` of another, both ways: a frame leaving
//! one end enters the other PFE on the other end's port. Frames leaving any other port go
//! to the chassis' sink, tagged with the PFE they left. Nothing about a PFE changes when
//! it sits in a chassis: its program, memory and configuration are its own, so a
//! hierarchy is set up by configuration alone.
//!
//! Each link direction is a queue and a forwarding thread that injects into the far PFE.
//! The queues are unbounded on purpose: a PPE thread handing a frame to a link never
//! waits, so two PFEs that send to each other cannot deadlock by each waiting for the
//! other to make room; the far PFE's own capacity still applies at injection.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

use parking_lot::Mutex;

use super::egress::{Frames, Sink};
use super::interconnect::{self, ChassisFabric, Crossing, FabricRunner, FabricStats};
use super::{Pfe, PfeBuilder, StartError, Stats};
use crate::error::ConfigError;
use crate::packet::Port;

/// Why [`ChassisBuilder::start`] failed. Whatever had started is stopped again.
#[derive(Debug)]
#[non_exhaustive]
pub enum ChassisError {
    /// A setting of the chassis (`chassis`, `link`) or of one of its PFEs was refused.
    Config(ConfigError),
    /// A PFE was built but could not start.
    Start {
        /// The PFE's name.
        pfe: String,
        /// Why it could not start.
        source: StartError,
    },
    /// The operating system refused the forwarding thread of a link.
    Spawn {
        /// The link direction, `pfemu-link-PFE.PORT` (the far end).
        thread: String,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl ChassisError {
    /// The setting at fault, when a setting was refused.
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            ChassisError::Config(e) => Some(e.setting),
            ChassisError::Start { .. } | ChassisError::Spawn { .. } => None,
        }
    }
}

impl From<ConfigError> for ChassisError {
    fn from(e: ConfigError) -> Self {
        ChassisError::Config(e)
    }
}

impl fmt::Display for ChassisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChassisError::Config(e) => e.fmt(f),
            ChassisError::Start { pfe, source } => write!(f, "PFE `{pfe}` cannot start: {source}"),
            ChassisError::Spawn { thread, source } => {
                write!(f, "cannot spawn the link forwarder {thread}: {source}")
            }
        }
    }
}

impl std::error::Error for ChassisError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChassisError::Config(e) => Some(e),
            ChassisError::Start { source, .. } => Some(source),
            ChassisError::Spawn { source, .. } => Some(source),
        }
    }
}

/// Receives the frames leaving a chassis on ports that are not interconnect links.
pub trait ChassisSink: Send + Sync {
    /// Takes a burst of frames leaving `port` of PFE `pfe` (its index in the chassis).
    fn deliver(&self, pfe: usize, port: Port, frames: Frames<'_>);
}

impl<F> ChassisSink for F
where
    F: Fn(usize, Port, Frames<'_>) + Send + Sync,
{
    fn deliver(&self, pfe: usize, port: Port, frames: Frames<'_>) {
        self(pfe, port, frames)
    }
}

/// One direction of a link: where frames leaving a linked port go.
enum Hop {
    /// Straight to the link's forwarder, which injects them at the far end.
    Direct {
        tx: Sender<Vec<u8>>,
        /// Frames handed to the link and not yet injected at the far end.
        pending: Arc<AtomicU64>,
    },
    /// Through the chassis' fabric, from PFE `from` to port `to_port` of PFE `to`.
    Fabric {
        tx: Sender<Crossing>,
        /// Frames handed to the fabric and not yet injected or dropped.
        pending: Arc<AtomicU64>,
        from: usize,
        to: usize,
        to_port: Port,
    },
}

/// The sink a PFE in a chassis delivers to: link ports go to their hop, others out.
struct PortMap {
    pfe: usize,
    hops: Vec<Option<Hop>>,
    out: Arc<dyn ChassisSink>,
}

impl Sink for PortMap {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        match self.hops.get(port as usize).and_then(Option::as_ref) {
            // The receivers live as long as the chassis' forwarders and fabric; after
            // shutdown nothing delivers any more.
            Some(Hop::Direct { tx, pending }) => {
                for f in frames.iter() {
                    pending.fetch_add(1, Ordering::AcqRel);
                    let _ = tx.send(f.to_vec());
                }
            }
            Some(Hop::Fabric {
                tx,
                pending,
                from,
                to,
                to_port,
            }) => {
                for f in frames.iter() {
                    pending.fetch_add(1, Ordering::AcqRel);
                    let _ = tx.send(Crossing {
                        from: *from,
                        to: *to,
                        to_port: *to_port,
                        frame: f.to_vec(),
                    });
                }
            }
            None => self.out.deliver(self.pfe, port, frames),
        }
    }
}

/// Configures a [`Chassis`].
pub struct ChassisBuilder {
    pfes: Vec<(String, PfeBuilder)>,
    links: Vec<((usize, Port), (usize, Port))>,
    sink: Option<Arc<dyn ChassisSink>>,
    fabric: Option<ChassisFabric>,
}

impl fmt::Debug for ChassisBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChassisBuilder")
            .field(
                "pfes",
                &self.pfes.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("links", &self.links)
            .field("fabric", &self.fabric)
            .finish_non_exhaustive()
    }
}

impl ChassisBuilder {
    /// Adds a PFE (configured like any other; its own sink, if any, is replaced by the
    /// chassis'). Returns its index, which [`ChassisBuilder::link`] and the sink use.
    pub fn pfe(&mut self, name: &str, builder: PfeBuilder) -> usize {
        self.pfes.push((name.to_owned(), builder));
        self.pfes.len() - 1
    }

    /// Joins port `a.1` of PFE `a.0` and port `b.1` of PFE `b.0`, both ways.
    pub fn link(&mut self, a: (usize, Port), b: (usize, Port)) -> &mut Self {
        self.links.push((a, b));
        self
    }

    /// Where frames leaving non-link ports go (default: discarded).
    pub fn sink(&mut self, sink: Arc<dyn ChassisSink>) -> &mut Self {
        self.sink = Some(sink);
        self
    }

    /// Sends every link through a switch fabric ([`ChassisFabric`]: its architecture,
    /// cell size, FIFO depth and background traffic) instead of an ideal wire: frames
    /// between PFEs are cut into cells, meet the fabric's contention and are reassembled
    /// (see [`ChassisFabric`]). Frames keep their order between two PFEs except through
    /// CPRR with finite FIFOs once a cell has dropped (see [`ChassisFabric`]).
    pub fn fabric(&mut self, fabric: ChassisFabric) -> &mut Self {
        self.fabric = Some(fabric);
        self
    }

    /// Builds and starts every PFE and the link forwarders (or the fabric).
    pub fn start(self) -> Result<Chassis, ChassisError> {
        let ChassisBuilder {
            pfes,
            links,
            sink,
            fabric,
        } = self;
        let n = pfes.len();
        if n == 0 {
            return Err(ConfigError::new("chassis", "a chassis needs at least one PFE").into());
        }
        let fabric = match fabric {
            Some(f) => {
                let (tx, rx) = unbounded();
                // Any of the fabric's settings is the chassis' `fabric` setting.
                let runner = FabricRunner::new(f, n).map_err(|e| {
                    ConfigError::new("fabric", format!("{}: {}", e.setting, e.reason))
                })?;
                Some((runner, tx, rx, Arc::new(AtomicU64::new(0))))
            }
            None => None,
        };
        let out: Arc<dyn ChassisSink> =
            sink.unwrap_or_else(|| Arc::new(|_: usize, _: Port, _: Frames<'_>| {}));
        // Every link end, checked: the PFE exists and the port is linked once.
        let mut ends: Vec<(usize, Port, usize, Port)> = Vec::new();
        for &(a, b) in &links {
            for (x, y) in [(a, b), (b, a)] {
                if x.0 >= n {
                    return Err(ConfigError::new(
                        "link",
                        format!("PFE index {} does not exist (the chassis has {n})", x.0),
                    )
                    .into());
                }
                if ends.iter().any(|e| (e.0, e.1) == x) {
                    return Err(ConfigError::new(
                        "link",
                        format!("port {} of PFE `{}` is linked twice", x.1, pfes[x.0].0),
                    )
                    .into());
                }
                ends.push((x.0, x.1, y.0, y.1));
            }
        }
        let mut maps: Vec<PortMap> = (0..n)
            .map(|pfe| PortMap {
                pfe,
                hops: Vec::new(),
                out: out.clone(),
            })
            .collect();
        let mut forwarders = Vec::new();
        for &(from, from_port, to, to_port) in &ends {
            let hop = match &fabric {
                Some((_, tx, _, pending)) => Hop::Fabric {
                    tx: tx.clone(),
                    pending: pending.clone(),
                    from,
                    to,
                    to_port,
                },
                None => {
                    let (tx, rx) = unbounded();
                    let pending = Arc::new(AtomicU64::new(0));
                    forwarders.push((rx, pending.clone(), to, to_port));
                    Hop::Direct { tx, pending }
                }
            };
            let hops = &mut maps[from].hops;
            if hops.len() <= from_port as usize {
                hops.resize_with(from_port as usize + 1, || None);
            }
            hops[from_port as usize] = Some(hop);
        }
        let mut names = Vec::with_capacity(n);
        let mut built = Vec::with_capacity(n);
        for ((name, builder), map) in pfes.into_iter().zip(maps) {
            let mut pfe = builder
                .sink(Arc::new(map))
                .build()
                .map_err(|e| ConfigError::new(e.setting, format!("PFE `{name}`: {}", e.reason)))?;
            if let Some(port) = ends
                .iter()
                .filter(|e| e.0 == names.len())
                .map(|e| e.1)
                .find(|p| *p as usize >= pfe.config().ports)
            {
                return Err(ConfigError::new(
                    "link",
                    format!(
                        "PFE `{name}` has ports 0..{}, so port {port} cannot be linked",
                        pfe.config().ports
                    ),
                )
                .into());
            }
            if let Err(source) = pfe.start() {
                return Err(ChassisError::Start { pfe: name, source });
            }
            names.push(name);
            built.push(Arc::new(pfe));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut links = Vec::new();
        let mut threads = Vec::new();
        for (rx, pending, to, to_port) in forwarders {
            let far = built[to].clone();
            let stop_link = stop.clone();
            links.push(pending.clone());
            let thread = format!("pfemu-link-{to}.{to_port}");
            let spawned = std::thread::Builder::new()
                .name(thread.clone())
                .spawn(move || forward(rx, &far, to_port, &pending, &stop_link));
            match spawned {
                Ok(h) => threads.push(h),
                Err(source) => {
                    // Stop the forwarders already started; the PFEs stop when dropped.
                    stop_forwarders(&stop, threads);
                    return Err(ChassisError::Spawn { thread, source });
                }
            }
        }
        let mut fabric_stats = None;
        if let Some((runner, tx, rx, pending)) = fabric {
            // The PFEs' sinks hold the senders; this one is not needed.
            drop(tx);
            let stats = Arc::new(Mutex::new(FabricStats::default()));
            fabric_stats = Some(stats.clone());
            links.push(pending.clone());
            let (pfes, stop_fabric) = (built.clone(), stop.clone());
            let thread = "pfemu-fabric".to_string();
            let spawned = std::thread::Builder::new()
                .name(thread.clone())
                .spawn(move || interconnect::run(runner, rx, pfes, pending, stats, stop_fabric));
            match spawned {
                Ok(h) => threads.push(h),
                Err(source) => {
                    stop_forwarders(&stop, threads);
                    return Err(ChassisError::Spawn { thread, source });
                }
            }
        }
        Ok(Chassis {
            names,
            pfes: built,
            links,
            threads,
            stop,
            fabric: fabric_stats,
        })
    }
}

/// Stops and joins link forwarders (a forwarder exits once `stop` is set and its link is
/// idle).
fn stop_forwarders(stop: &AtomicBool, threads: Vec<JoinHandle<()>>) {
    stop.store(true, Ordering::Release);
    for h in threads {
        let _ = h.join();
    }
}

/// Injects what arrives on a link into the far PFE, in bursts, until the chassis stops.
fn forward(rx: Receiver<Vec<u8>>, far: &Pfe, port: Port, pending: &AtomicU64, stop: &AtomicBool) {
    let mut burst: Vec<Vec<u8>> = Vec::with_capacity(64);
    loop {
        let first = match rx.recv_timeout(Duration::from_millis(1)) {
            Ok(f) => f,
            Err(RecvTimeoutError::Timeout) if !stop.load(Ordering::Acquire) => continue,
            Err(_) => return,
        };
        burst.push(first);
        burst.extend(rx.try_iter().take(255));
        // The far PFE runs until every forwarder has exited (the chassis stops them
        // first), so this cannot fail.
        let _ = far.inject_burst(burst.iter().map(|f| (port, &f[..])));
        pending.fetch_sub(burst.len() as u64, Ordering::AcqRel);
        burst.clear();
    }
}

/// Several PFEs and the links between them, running.
pub struct Chassis {
    names: Vec<String>,
    pfes: Vec<Arc<Pfe>>,
    links: Vec<Arc<AtomicU64>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The fabric's counters, when the links cross one.
    fabric: Option<Arc<Mutex<FabricStats>>>,
}

impl fmt::Debug for Chassis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chassis")
            .field("pfes", &self.names)
            .field("links", &self.links.len())
            .finish()
    }
}

impl Chassis {
    /// Starts configuring a chassis.
    pub fn builder() -> ChassisBuilder {
        ChassisBuilder {
            pfes: Vec::new(),
            links: Vec::new(),
            sink: None,
            fabric: None,
        }
    }

    /// PFE `i`.
    pub fn pfe(&self, i: usize) -> &Pfe {
        &self.pfes[i]
    }

    /// The PFEs' names, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Frames on links, not yet injected at their far end.
    pub fn in_transit(&self) -> u64 {
        self.links.iter().map(|l| l.load(Ordering::Acquire)).sum()
    }

    /// Waits until every PFE is drained and nothing is on a link (a frame crossing a link
    /// makes its far PFE busy again, so this loops until all are quiet at once).
    pub fn drain(&self) {
        loop {
            for p in &self.pfes {
                p.drain();
            }
            if self.in_transit() == 0 && self.pfes.iter().all(|p| p.in_flight() == 0) {
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The fabric's counters (`None` when the links are ideal wires): updated as it runs,
    /// final once [`Chassis::drain`] returns.
    pub fn fabric_stats(&self) -> Option<FabricStats> {
        self.fabric.as_ref().map(|s| s.lock().clone())
    }

    /// Snapshots of every PFE's counters, by index.
    pub fn stats(&self) -> Vec<Stats> {
        self.pfes.iter().map(|p| p.stats()).collect()
    }

    /// Drains, stops the links and every PFE, and returns each PFE's final counters.
    pub fn shutdown(mut self) -> Vec<Stats> {
        self.stop_links();
        let pfes = std::mem::take(&mut self.pfes);
        pfes.into_iter()
            .map(|p| match Arc::try_unwrap(p) {
                Ok(pfe) => pfe.shutdown(),
                Err(p) => p.stats(),
            })
            .collect()
    }

    /// Drains, then stops the forwarders (they hold references to the far PFEs).
    fn stop_links(&mut self) {
        if self.threads.is_empty() && self.stop.load(Ordering::Acquire) {
            return;
        }
        self.drain();
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
        }
    }
}

impl Drop for Chassis {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.stop_links();
        }
    }
}
