//! The node agent: source -> model -> plan -> diff -> maps, again on every change.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::sync::mpsc;

use crate::{
    datapath::{self, Desired, MapWriter, Reconciler},
    model::{EndpointSlice, Model, NodeInfo, ObjKey, Service},
    plan,
    source::{
        Changes, ModelSource,
        manifests::{Diagnostic, ManifestDir, Object, Severity},
    },
};

/// What one reload did, for logs and tests.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub node: Option<NodeInfo>,
    pub frontends: usize,
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    /// Services planned in this sync: those a change touched, or all of them.
    pub replanned: usize,
    pub errors: Vec<String>,
    pub diagnostics: Vec<Diagnostic>,
    pub stale_files: Vec<PathBuf>,
    /// Services whose slices carried no hints and got the controller's.
    pub hints_filled: Vec<String>,
    /// Those of them not reported by an earlier sync.
    pub hints_newly_filled: Vec<String>,
    /// `healthCheckNodePort` -> the Service's local endpoints (Services with externalTrafficPolicy Local).
    pub health_ports: std::collections::BTreeMap<u16, crate::server::ServiceHealth>,
    pub duration: Duration,
}

/// The agent's logic without the kernel or the async runtime: refresh the source and apply the plan of what
/// changed.
pub struct AgentCore<W: MapWriter> {
    node_name: String,
    zone_flag: Option<String>,
    source: Box<dyn ModelSource>,
    reconciler: Reconciler<W>,
    /// The model as the source delivered it (without filled-in hints).
    model: Model,
    /// The node as of the last sync; a different one (zone label changed) replans every Service.
    node: Option<NodeInfo>,
    /// How many frontends the last plan of each Service wants, and their sum (kept up to date, so a sync
    /// that replans one Service does not walk them all).
    planned: BTreeMap<ObjKey, usize>,
    frontends: usize,
    /// Services planned with the controller's hints filled in.
    hints_filled: BTreeSet<ObjKey>,
    /// `healthCheckNodePort` and local endpoints of the Services with externalTrafficPolicy Local.
    health: BTreeMap<ObjKey, (u16, crate::server::ServiceHealth)>,
    /// Services whose frontends failed to apply: tried again on the next sync, as a full diff would.
    failed: BTreeSet<ObjKey>,
    hints_reported: std::collections::BTreeSet<String>,
}

impl<W: MapWriter> AgentCore<W> {
    pub fn new(
        node_name: impl Into<String>,
        zone_flag: Option<String>,
        source: Box<dyn ModelSource>,
        writer: W,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            zone_flag,
            source,
            reconciler: Reconciler::new(writer),
            model: Model::default(),
            node: None,
            planned: BTreeMap::new(),
            frontends: 0,
            hints_filled: BTreeSet::new(),
            health: BTreeMap::new(),
            failed: BTreeSet::new(),
            hints_reported: std::collections::BTreeSet::new(),
        }
    }

    pub fn reconciler(&self) -> &Reconciler<W> {
        &self.reconciler
    }

    pub fn reconciler_mut(&mut self) -> &mut Reconciler<W> {
        &mut self.reconciler
    }

    /// Refresh the source and apply the plan. Only the Services an object change touches are planned and
    /// written again; a new model from the source, a Node change or a new zone replans every Service. The
    /// maps keep their last good state for whatever fails.
    pub fn sync(&mut self, now: Instant) -> std::io::Result<SyncReport> {
        let started = Instant::now();
        let refresh = self.source.refresh()?;
        let mut touched = std::mem::take(&mut self.failed);
        let mut everything = false;
        match refresh.changes {
            Changes::All(model) => {
                self.model = model;
                everything = true;
            }
            Changes::Objects { removed, upserted } => {
                for o in removed {
                    everything |= self.remove_object(&o, &mut touched);
                }
                for o in upserted {
                    everything |= self.upsert_object(o, &mut touched);
                }
            }
        }
        let node = NodeInfo::resolve(&self.node_name, self.zone_flag.as_deref(), &self.model);
        everything |= self.node.as_ref() != Some(&node);
        let replanned;
        let applied = if everything {
            self.planned.clear();
            self.frontends = 0;
            self.hints_filled.clear();
            self.health.clear();
            let keys: Vec<ObjKey> = self.model.services.keys().cloned().collect();
            replanned = keys.len();
            let desired = self.plan_services(&keys, &node);
            self.reconciler.apply(&desired, now)
        } else {
            let keys: Vec<ObjKey> = touched.into_iter().collect();
            replanned = keys.len();
            let desired = self.plan_services(&keys, &node);
            let labels: Vec<String> = keys.iter().map(ToString::to_string).collect();
            self.reconciler.apply_services(labels.iter().map(String::as_str), &desired, now)
        };
        self.node = Some(node.clone());
        self.failed = applied.errors.iter().filter_map(|e| e.service.parse().ok()).collect();
        let hints_filled: Vec<String> = self.hints_filled.iter().map(ToString::to_string).collect();
        let hints_newly_filled =
            hints_filled.iter().filter(|s| !self.hints_reported.contains(*s)).cloned().collect();
        self.hints_reported = hints_filled.iter().cloned().collect();
        let mut health_ports = BTreeMap::new();
        for (port, h) in self.health.values() {
            let entry: &mut crate::server::ServiceHealth =
                health_ports.entry(*port).or_insert_with(|| h.clone());
            entry.local_endpoints = entry.local_endpoints.max(h.local_endpoints);
        }
        Ok(SyncReport {
            node: Some(node),
            frontends: self.frontends,
            added: applied.added,
            updated: applied.updated,
            removed: applied.removed,
            replanned,
            errors: applied.errors.iter().map(ToString::to_string).collect(),
            diagnostics: refresh.diagnostics,
            stale_files: refresh.stale_files,
            hints_filled,
            hints_newly_filled,
            health_ports,
            duration: started.elapsed(),
        })
    }

    /// Take a removed object out of the model; true when every Service must be replanned.
    fn remove_object(&mut self, o: &Object, touched: &mut BTreeSet<ObjKey>) -> bool {
        match o {
            Object::Service(s) => {
                self.model.services.remove(&s.key);
                touched.insert(s.key.clone());
            }
            Object::EndpointSlice(s) => {
                if let Some(old) = self.model.slices.remove(&s.key) {
                    touched.extend(old.owner());
                }
                touched.extend(s.owner());
            }
            Object::Node(n) => {
                self.model.nodes.remove(&n.name);
                return true;
            }
        }
        false
    }

    /// Put a new or changed object into the model; true when every Service must be replanned.
    fn upsert_object(&mut self, o: Object, touched: &mut BTreeSet<ObjKey>) -> bool {
        match o {
            Object::Service(s) => {
                touched.insert(s.key.clone());
                self.model.services.insert(s.key.clone(), s);
            }
            Object::EndpointSlice(s) => {
                touched.extend(s.owner());
                if let Some(old) = self.model.slices.insert_shared(s.key.clone(), s) {
                    touched.extend(old.owner());
                }
            }
            Object::Node(n) => {
                self.model.nodes.insert(n.name.clone(), n);
                return true;
            }
        }
        false
    }

    /// Plan these Services (with the controller's hints where their slices carry none) and return the
    /// frontends they want; a Service no longer in the model wants none.
    fn plan_services(&mut self, keys: &[ObjKey], node: &NodeInfo) -> Desired {
        let mut desired = Desired::new();
        for key in keys {
            self.forget(key);
            let Some(svc) = self.model.services.get(key) else { continue };
            let filled = crate::hints::fill_for(&self.model, svc);
            let slices: Vec<&EndpointSlice> = match &filled {
                Some(owned) => owned.iter().collect(),
                None => self.model.slices_of(key).collect(),
            };
            let plans = plan::plan_service(svc, &slices, node);
            if filled.is_some() {
                self.hints_filled.insert(key.clone());
            }
            for (port, h) in plans.iter().filter_map(|p| health_port(svc, p)) {
                let seen = self.health.entry(key.clone()).or_insert((port, h.clone()));
                seen.1.local_endpoints = seen.1.local_endpoints.max(h.local_endpoints);
            }
            let mine = datapath::desired_of(&plans);
            self.frontends += mine.len();
            self.planned.insert(key.clone(), mine.len());
            desired.extend(mine);
        }
        desired
    }

    /// Drop what the last plan of this Service contributed.
    fn forget(&mut self, key: &ObjKey) {
        self.frontends -= self.planned.remove(key).unwrap_or(0);
        self.hints_filled.remove(key);
        self.health.remove(key);
    }

    pub fn collect_garbage(&mut self, now: Instant) {
        self.reconciler.collect_garbage(now);
    }
}

/// kube-proxy's service health server data: for a Service with externalTrafficPolicy Local and a
/// `healthCheckNodePort`, how many local endpoints its external traffic has on this node (the most over its
/// ports).
fn health_port(svc: &Service, p: &plan::PortPlan) -> Option<(u16, crate::server::ServiceHealth)> {
    let (Some(port), Some(ext)) = (svc.health_check_node_port, &p.external) else { return None };
    if ext.policy != crate::model::Policy::Local {
        return None;
    }
    Some((
        port,
        crate::server::ServiceHealth {
            namespace: svc.key.namespace.clone(),
            name: svc.key.name.clone(),
            local_endpoints: ext.endpoints.len(),
        },
    ))
}

fn log_report(r: &SyncReport) {
    for d in &r.diagnostics {
        match d.severity {
            Severity::Error => tracing::error!(file = %d.file.display(), "{d}"),
            Severity::Warning => tracing::warn!(file = %d.file.display(), "{d}"),
        }
    }
    for f in &r.stale_files {
        tracing::warn!(file = %f.display(), "file has errors: keeping the objects of its last good version");
    }
    for e in &r.errors {
        tracing::error!("{e}");
    }
    for s in &r.hints_newly_filled {
        tracing::info!(service = %s, "EndpointSlices carry no hints: using the hints the EndpointSlice controller would write");
    }
    let zone = r.node.as_ref().and_then(|n| n.zone.clone()).unwrap_or_else(|| "-".into());
    tracing::info!(
        frontends = r.frontends,
        hints_filled = r.hints_filled.len(),
        added = r.added,
        updated = r.updated,
        removed = r.removed,
        replanned = r.replanned,
        errors = r.errors.len(),
        zone = %zone,
        took_us = r.duration.as_micros() as u64,
        "synced"
    );
}

/// Where the agent reads Services, EndpointSlices and Nodes.
#[derive(Debug, Clone)]
pub enum Source {
    Manifests(PathBuf),
    /// In-cluster configuration or KUBECONFIG.
    Kube,
}

impl AgentCore<datapath::ebpf::KernelMaps> {
    /// Destroy connected UDP sockets whose backend is no longer in any tier of their Service (or is marked
    /// down), using the data path's reverse entries.
    pub fn destroy_stale_udp(
        &mut self,
        finder: &mut datapath::destroy::NetnsFinder,
    ) -> datapath::destroy::DestroyReport {
        use std::collections::{BTreeMap, BTreeSet};
        // Only UDP frontends have sockets to end (and building sets for every TCP one cost milliseconds
        // per change at 10,000 Services).
        let current: BTreeMap<lb_common::FrontendKey, BTreeSet<lb_common::Backend>> = self
            .reconciler
            .applied()
            .filter(|(k, _, _)| k.proto == lb_common::PROTO_UDP)
            .map(|(k, _, d)| (*k, d.tiers.iter().flatten().copied().collect()))
            .collect();
        let down: BTreeSet<lb_common::Backend> =
            self.reconciler.writer().backends_down().unwrap_or_default().into_iter().collect();
        datapath::destroy::destroy_udp_sockets(self.reconciler.writer_mut(), finder, |fe, b| {
            down.contains(b) || !current.get(fe).is_some_and(|set| set.contains(b))
        })
    }
}

fn log_destroyed(r: &datapath::destroy::DestroyReport) {
    if r.destroyed > 0 {
        tracing::info!(
            sockets = r.destroyed,
            "destroyed connected UDP sockets whose backend left their Service"
        );
    }
    for e in &r.errors {
        tracing::warn!("{e}");
    }
}

/// `tierlb agent` options.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub node: String,
    pub zone: Option<String>,
    pub source: Source,
    pub cgroup: Option<PathBuf>,
    pub allow_root_cgroup: bool,
    pub bpffs: Option<PathBuf>,
    /// Name of the pin directory under `bpffs`; default: the node name.
    pub instance: Option<String>,
    pub capacities: datapath::ebpf::Capacities,
    /// `/healthz` and `/livez`; `None`: off.
    pub healthz_addr: Option<std::net::SocketAddr>,
    /// `/metrics`; `None`: off.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Address the `healthCheckNodePort` listeners bind; `None`: off.
    pub service_health_bind: Option<std::net::IpAddr>,
}

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

fn check_bpffs(dir: &Path) -> anyhow::Result<()> {
    let fs = nix::sys::statfs::statfs(dir).with_context(|| {
        format!(
            "--bpffs {}: cannot read it; create it and mount bpffs there (`mount -t bpf bpf DIR`)",
            dir.display()
        )
    })?;
    #[expect(clippy::useless_conversion, reason = "the magic's integer type differs between libc targets")]
    let magic = i64::from(fs.filesystem_type().0);
    anyhow::ensure!(
        magic == BPF_FS_MAGIC,
        "--bpffs {}: not a bpf filesystem; mount one there (`mount -t bpf bpf {}`) or use a directory under /sys/fs/bpf",
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// The directory an agent instance pins its maps and links in: `BPFFS/<instance>`.
pub fn instance_dir(bpffs: &Path, instance: &str) -> PathBuf {
    bpffs.join(instance)
}

/// `tierlb agent --cleanup`: detach the instance's programs and remove its maps.
pub fn cleanup(bpffs: &Path, instance: &str) -> anyhow::Result<String> {
    check_bpffs(bpffs)?;
    let dir = instance_dir(bpffs, instance);
    let removed = datapath::ebpf::cleanup(&dir).with_context(|| format!("cleaning up {}", dir.display()))?;
    Ok(if removed.is_empty() {
        format!("nothing pinned in {}\n", dir.display())
    } else {
        format!("removed {} pins in {} (programs detached, maps freed)\n", removed.len(), dir.display())
    })
}

async fn bind(addr: std::net::SocketAddr, flag: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("{flag} {addr}: cannot listen (port in use? pass another address or `off`)"))
}

/// After a sync: health is fresh again, statistics counted.
fn record(health: &crate::server::SharedHealth, stats: &mut crate::metrics::AgentStats, r: &SyncReport) {
    let mut h = health.lock().expect("health lock");
    h.last_updated = Some(std::time::SystemTime::now());
    h.pending_since = None;
    stats.syncs.inc();
    stats.sync_duration.observe(r.duration.as_secs_f64());
    stats.apply_errors.inc_by(r.errors.len() as u64);
    let errors = r.diagnostics.iter().filter(|d| d.severity == Severity::Error).count();
    stats.reload_errors.inc_by(errors as u64);
}

/// Run the agent until SIGINT or SIGTERM; detaches on the way out.
pub async fn run(opts: AgentOptions) -> anyhow::Result<()> {
    // Listen before doing anything slow: a signal that arrives while no listener exists would be lost.
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let cgroup = match &opts.cgroup {
        Some(p) => p.clone(),
        None => crate::cgroup::default_root()?,
    };
    let cgroup = crate::cgroup::check(&cgroup, opts.allow_root_cgroup)?;
    // Every change the source sees wakes the loop below.
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut file_watcher = None;
    let source: Box<dyn ModelSource> = match &opts.source {
        Source::Manifests(dir) => {
            anyhow::ensure!(
                dir.is_dir(),
                "--manifests {}: not a directory (it should hold Service, EndpointSlice and Node YAML files)",
                dir.display()
            );
            let tx = tx.clone();
            let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                if res.is_ok_and(|ev| !ev.kind.is_access()) {
                    let _ = tx.send(());
                }
            })
            .context("starting the file watcher (inotify)")?;
            notify::Watcher::watch(&mut w, dir, notify::RecursiveMode::NonRecursive)
                .with_context(|| format!("watching {}", dir.display()))?;
            file_watcher = Some(w);
            Box::new(ManifestDir::new(dir))
        }
        Source::Kube => {
            let client = kube::Client::try_default()
                .await
                .context("--kube: no cluster configuration (in-cluster service account or KUBECONFIG)")?;
            let ks = crate::source::kube::KubeSource::start_with_timeout(
                client,
                &opts.node,
                tx.clone(),
                Duration::from_secs(60),
            )
            .await?;
            Box::new(ks)
        }
    };
    let source_name = source.describe();
    let pin_dir = match &opts.bpffs {
        Some(base) => {
            check_bpffs(base)?;
            let dir = instance_dir(base, opts.instance.as_deref().unwrap_or(&opts.node));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            Some(dir)
        }
        None => None,
    };
    let datapath::ebpf::Loaded { mut programs, maps } =
        datapath::ebpf::Loaded::load(opts.capacities, pin_dir.as_deref())?;
    let mut core = AgentCore::new(opts.node.clone(), opts.zone.clone(), source, maps);
    if pin_dir.is_some() {
        // A previous agent's maps (if any) keep serving connects while we start; take over what they hold.
        let adopted = core.reconciler_mut().adopt().context("adopting the pinned maps")?;
        if adopted.frontends > 0 {
            tracing::info!(
                frontends = adopted.frontends,
                orphan_slots_removed = adopted.orphan_slots_removed,
                "adopted the maps of a previous agent"
            );
        }
    }
    // Maps are filled before the programs are attached, so the first connect already sees the full plan.
    let report = core.sync(Instant::now()).with_context(|| format!("reading {source_name}"))?;
    log_report(&report);
    programs.attach(&cgroup, pin_dir.as_deref())?;

    let health = crate::server::SharedHealth::default();
    let mut stats = crate::metrics::AgentStats::default();
    record(&health, &mut stats, &report);
    let _healthz = match opts.healthz_addr {
        Some(a) => Some(crate::server::start_health(bind(a, "--healthz-addr").await?, health.clone())),
        None => None,
    };
    let (metrics_tx, mut metrics_rx) = mpsc::channel::<crate::server::MetricsRequest>(4);
    let _metrics = match opts.metrics_addr {
        Some(a) => Some(crate::server::start_metrics(bind(a, "--metrics-addr").await?, metrics_tx)),
        None => None,
    };
    let mut service_health = opts.service_health_bind.map(crate::server::ServiceHealthServers::new);
    if let Some(sh) = service_health.as_mut() {
        for (port, e) in sh.sync(&report.health_ports).await {
            stats.health_port_errors.inc();
            tracing::error!(port, error = %e, "cannot listen on healthCheckNodePort");
        }
    }

    drop(tx);
    // Last: everything (programs, servers, listeners) is up when this line appears.
    tracing::info!(node = %opts.node, cgroup = %cgroup.display(), programs = ?datapath::ebpf::PROGRAMS, "tierlb agent ready");
    let mut finder = datapath::destroy::NetnsFinder::default();
    match datapath::destroy::probe() {
        Ok(()) => tracing::debug!("socket destruction available"),
        Err(why) => tracing::warn!(
            "{why}: connected UDP sockets to backends that leave a Service will not be ended (they reconnect only \
             when the application notices)"
        ),
    }
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    loop {
        tokio::select! {
            _ = sigint.recv() => { tracing::info!("SIGINT: detaching and exiting"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: detaching and exiting"); break; }
            Some(()) = rx.recv() => {
                // Debounce: an editor's save is several events; take them all, then reload once.
                tokio::time::sleep(Duration::from_millis(5)).await;
                while rx.try_recv().is_ok() {}
                health.lock().expect("health lock").pending_since.get_or_insert_with(std::time::Instant::now);
                match core.sync(Instant::now()) {
                    Ok(r) => {
                        // Everything a sync changes happens before its "synced" line (tests wait for it).
                        if let Some(sh) = service_health.as_mut() {
                            for (port, e) in sh.sync(&r.health_ports).await {
                                stats.health_port_errors.inc();
                                tracing::error!(port, error = %e, "cannot listen on healthCheckNodePort");
                            }
                        }
                        if r.updated + r.removed > 0 {
                            log_destroyed(&core.destroy_stale_udp(&mut finder));
                        }
                        record(&health, &mut stats, &r);
                        log_report(&r);
                    }
                    Err(e) => tracing::error!(source = %source_name, error = %e, "cannot read the source; keeping the current maps"),
                }
            }
            Some(reply) = metrics_rx.recv() => {
                let _ = reply.send(crate::metrics::encode_text(core.reconciler(), &stats, opts.capacities.slots));
            }
            _ = tick.tick() => core.collect_garbage(Instant::now()),
        }
    }
    drop(file_watcher);
    if let Some(dir) = &pin_dir {
        tracing::info!(
            dir = %dir.display(),
            "leaving the programs attached and the maps pinned for the next agent (`tierlb agent --cleanup` removes them)"
        );
    }
    // Without pins this detaches the programs; pinned links stay.
    drop(programs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::datapath::fake::FakeMaps;
    use lb_testkit::{
        manifests::{Ep, Svc, node, to_yaml, write_atomic, write_service},
        sandbox::TempDir,
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn core(dir: &Path) -> AgentCore<FakeMaps> {
        AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), FakeMaps::new(64, 1024))
    }

    /// What the data path sees, without service ids and generations: frontend -> (label, tiers, flags).
    fn maps(
        c: &AgentCore<FakeMaps>,
    ) -> BTreeMap<lb_common::FrontendKey, (String, [Vec<lb_common::Backend>; 3], u32)> {
        let w = c.reconciler().writer();
        datapath::read_back(w)
            .unwrap()
            .into_iter()
            .map(|(k, rb)| {
                (k, (w.name(rb.value.svc_id).unwrap().unwrap_or_default(), rb.tiers, rb.value.flags))
            })
            .collect()
    }

    type Edit = Box<dyn Fn(&Path)>;

    fn web() -> Svc {
        let mut s = Svc::new("web", ip("10.96.0.10"), 80, 8080);
        s.traffic_distribution = Some("PreferSameNode".into());
        s
    }

    fn ep(addr: &str, node: &str, zone: &str) -> Ep {
        Ep::ready(ip(addr), node).zone(zone)
    }

    fn nodes(zone_of_node_1: &str) -> String {
        to_yaml(&[node("node-1", Some(zone_of_node_1)), node("node-2", Some("b"))])
    }

    #[test]
    fn a_service_that_did_not_fit_is_tried_again_on_the_next_sync() {
        let tmp = TempDir::new("agent-retry").unwrap();
        let dir = tmp.path();
        let two = [ep("10.0.0.1", "node-1", "a"), ep("10.0.0.2", "node-2", "b")];
        write_service(dir, &Svc::new("alpha", ip("10.96.0.11"), 80, 8080), &two).unwrap();
        write_service(dir, &Svc::new("beta", ip("10.96.0.12"), 80, 8080), &two).unwrap();
        // Room for three slots: alpha fits, beta does not.
        let mut agent = AgentCore::new("node-1", None, Box::new(ManifestDir::new(dir)), FakeMaps::new(64, 3));
        let r = agent.sync(Instant::now()).unwrap();
        assert_eq!((r.added, r.errors.len()), (1, 1), "{:?}", r.errors);
        // alpha goes away (after its grace period its slots are free); beta's file is untouched.
        std::fs::remove_file(dir.join("alpha.yaml")).unwrap();
        let later = Instant::now() + datapath::DEFAULT_GRACE * 2;
        agent.collect_garbage(later);
        let r = agent.sync(later).unwrap();
        assert_eq!(r.removed, 1);
        agent.collect_garbage(later + datapath::DEFAULT_GRACE * 2);
        let r = agent.sync(later + datapath::DEFAULT_GRACE * 2).unwrap();
        assert_eq!((r.added, r.errors.len()), (1, 0), "beta tried again: {:?}", r.errors);
        assert_eq!(
            maps(&agent).values().map(|(label, ..)| label.as_str()).collect::<Vec<_>>(),
            ["default/beta:main"]
        );
    }

    #[test]
    fn incremental_syncs_program_exactly_what_a_full_sync_would() {
        let tmp = TempDir::new("agent-incremental").unwrap();
        let dir = tmp.path();
        write_service(dir, &web(), &[ep("10.0.0.1", "node-1", "a"), ep("10.0.0.2", "node-2", "b")]).unwrap();
        let mut db = Svc::new("db", ip("10.96.0.11"), 5432, 5432);
        db.internal_traffic_policy = Some("Local");
        write_service(dir, &db, &[ep("10.0.1.1", "node-1", "a")]).unwrap();
        let mut lb = Svc::new("lb", ip("10.96.0.12"), 443, 8443);
        lb.health_check_node_port = Some(32000);
        write_service(dir, &lb, &[ep("10.0.2.1", "node-1", "a"), ep("10.0.2.2", "node-2", "b")]).unwrap();
        write_atomic(dir, "nodes.yaml", &nodes("a")).unwrap();
        let slice_of = |svc: &Svc, name: &str, eps: &[Ep]| {
            let mut v = svc.slices(eps).remove(0);
            v["metadata"]["name"] = name.into();
            to_yaml(&[v])
        };

        let mut agent = core(dir);
        let first = agent.sync(Instant::now()).unwrap();
        assert_eq!((first.replanned, first.added, first.frontends), (3, 3, 3));

        // (what, the edit, Services it replans); after each, the maps equal a fresh agent's on the same files
        // (but while a file is broken, when they stay as they were: a fresh agent has no last good version).
        let steps: Vec<(&str, Edit, usize)> = vec![
            (
                "one EndpointSlice edited",
                Box::new(|d| {
                    write_service(d, &web(), &[ep("10.0.0.2", "node-2", "b")]).unwrap();
                }),
                1,
            ),
            (
                "a slice of its own file added to a Service",
                Box::new(move |d| {
                    write_atomic(
                        d,
                        "extra.yaml",
                        &slice_of(&web(), "web-extra", &[ep("10.0.0.3", "node-1", "a")]),
                    )
                    .unwrap();
                }),
                1,
            ),
            (
                "the slice relabelled to another Service (both replanned)",
                Box::new(move |d| {
                    let mut db = Svc::new("db", ip("10.96.0.11"), 5432, 5432);
                    db.target_port = 8080;
                    write_atomic(
                        d,
                        "extra.yaml",
                        &slice_of(&db, "web-extra", &[ep("10.0.0.3", "node-1", "a")]),
                    )
                    .unwrap();
                }),
                2,
            ),
            ("a Service deleted", Box::new(|d| std::fs::remove_file(d.join("db.yaml")).unwrap()), 1),
            (
                "a Service added",
                Box::new(|d| {
                    write_service(
                        d,
                        &Svc::new("cache", ip("10.96.0.13"), 6379, 6379),
                        &[ep("10.0.3.1", "node-2", "b")],
                    )
                    .unwrap();
                }),
                1,
            ),
            (
                "a broken file keeps its last good objects",
                Box::new(|d| {
                    write_atomic(d, "web.yaml", "kind: Service\nmetadata: [").unwrap();
                }),
                0,
            ),
            (
                "the broken file mended",
                Box::new(|d| {
                    write_service(d, &web(), &[ep("10.0.0.4", "node-1", "a")]).unwrap();
                }),
                1,
            ),
            (
                "a slice moved to another file unchanged",
                Box::new(|d| {
                    let text = std::fs::read_to_string(d.join("lb.yaml")).unwrap();
                    let (svc, slice) = text.split_once("---\n").unwrap();
                    write_atomic(d, "z-lb-slice.yaml", slice).unwrap();
                    write_atomic(d, "lb.yaml", svc).unwrap();
                }),
                1,
            ),
            (
                "a duplicate in an earlier file wins: everything is replanned",
                Box::new(|d| {
                    let mut docs = vec![web().service()];
                    docs.extend(web().slices(&[ep("10.0.0.9", "node-2", "b")]));
                    write_atomic(d, "a-web.yaml", &to_yaml(&docs)).unwrap();
                }),
                3,
            ),
            ("the duplicate removed", Box::new(|d| std::fs::remove_file(d.join("a-web.yaml")).unwrap()), 3),
            (
                "this node's zone label changes: everything is replanned",
                Box::new(|d| {
                    write_atomic(d, "nodes.yaml", &nodes("b")).unwrap();
                }),
                3,
            ),
        ];
        for (what, edit, replanned) in steps {
            let before = maps(&agent);
            edit(dir);
            let r = agent.sync(Instant::now()).unwrap();
            if !r.stale_files.is_empty() {
                assert_eq!((r.replanned, maps(&agent)), (replanned, before), "{what}");
                continue;
            }
            let mut fresh = core(dir);
            let full = fresh.sync(Instant::now()).unwrap();
            assert_eq!(r.replanned, replanned, "{what}: Services planned");
            assert_eq!(maps(&agent), maps(&fresh), "{what}: maps");
            assert_eq!(
                (r.frontends, &r.hints_filled, &r.health_ports, r.stale_files.len(), r.diagnostics.len()),
                (
                    full.frontends,
                    &full.hints_filled,
                    &full.health_ports,
                    full.stale_files.len(),
                    full.diagnostics.len()
                ),
                "{what}: report"
            );
        }
        let again = agent.sync(Instant::now()).unwrap();
        assert_eq!((again.replanned, again.added + again.updated + again.removed), (0, 0), "nothing changed");
    }
}
