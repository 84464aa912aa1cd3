//! The agent process: start the source, load and attach the programs, serve health and metrics, and sync on
//! every change until SIGINT or SIGTERM. The ordering rules are stated in the module doc of `agent`.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    AgentCore, AgentOptions, Source, SyncReport, memory,
    report::{log_destroyed, log_health, log_retry, log_sweep, log_sync},
};
use crate::{
    datapath::{
        MapWriter, Reconciler, destroy,
        ebpf::{KernelMaps, Loaded, PROGRAMS},
        pins,
    },
    metrics::{AgentStats, KernelCounters, ReadCounters, Snapshot},
    server::{self, MetricsSource, ServiceHealthServers, SharedHealth},
    source::{ModelSource, Severity, kube::KubeSource, manifests::ManifestDir},
};

/// What `start_source` opened: the source, the guard that keeps a file watcher alive, and the API server's
/// addresses (with `--kube`), which no frontend may take.
type Opened = (Box<dyn ModelSource>, Option<notify::RecommendedWatcher>, Vec<SocketAddr>);

/// Open the source; every change it sees is signalled on `changed`.
async fn start_source(opts: &AgentOptions, changed: mpsc::UnboundedSender<()>) -> anyhow::Result<Opened> {
    match &opts.source {
        Source::Manifests(dir) => {
            anyhow::ensure!(
                dir.is_dir(),
                "--manifests {}: not a directory (it should hold Service, EndpointSlice and Node YAML files)",
                dir.display()
            );
            // Only events on files the loader reads (or on the directory itself, or the kubelet's swap of a
            // ConfigMap volume's `..data`) trigger a reload, of the files they name: a log, an editor's swap
            // file or a temporary file written in the directory would otherwise resync on each write. A
            // rename into place names the new file, which counts.
            let watched_dir = dir.clone();
            let (source, seen) = ManifestDir::watched(dir);
            let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                let Ok(ev) = res else {
                    seen.everything();
                    let _ = changed.send(());
                    return;
                };
                if ev.kind.is_access() && !ev.need_rescan() {
                    return;
                }
                let relevant = if ev.need_rescan() || ev.paths.is_empty() {
                    seen.everything();
                    true
                } else {
                    ev.paths.iter().fold(false, |any, p| seen.saw(&watched_dir, p) | any)
                };
                if relevant {
                    let _ = changed.send(());
                }
            })
            .context("starting the file watcher (inotify)")?;
            notify::Watcher::watch(&mut w, dir, notify::RecursiveMode::NonRecursive)
                .with_context(|| format!("watching {}", dir.display()))?;
            Ok((Box::new(source), Some(w), Vec::new()))
        }
        Source::Kube => {
            let config = kube::Config::infer()
                .await
                .context("--kube: no cluster configuration (in-cluster service account or KUBECONFIG)")?;
            let api_server = crate::source::kube::api_server_addresses(&config).await;
            let client =
                crate::source::kube::client(config).context("--kube: cannot build the API client")?;
            let ks = KubeSource::start_with_timeout(
                client,
                &opts.node,
                changed,
                Duration::from_mins(1),
                opts.watch_timeout,
            )
            .await?;
            Ok((Box::new(ks), None, api_server))
        }
    }
}

fn bind(addr: SocketAddr, flag: &str) -> anyhow::Result<tokio::net::TcpListener> {
    server::listen(addr)
        .with_context(|| format!("{flag} {addr}: cannot listen (port in use? pass another address or `off`)"))
}

/// Before attaching: programs with the names of the agent's on its cgroup that this instance did not pin
/// (another `--instance` or `--bpffs`, left attached) would run beside the new ones with their own, stale,
/// maps. The agent refuses to start, naming them.
fn refuse_other_instances(cgroup: &std::path::Path, pin_dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    let allowed = pin_dir.map(pins::pinned_program_ids).unwrap_or_default();
    let names: Vec<(&'static str, Option<u32>)> = PROGRAMS.iter().map(|p| (*p, None)).collect();
    let found = crate::datapath::attached::check(cgroup, &names, &allowed)?;
    if found.foreign.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = found.foreign.iter().map(|(n, id)| format!("{n} (program id {id})")).collect();
    anyhow::bail!(
        "programs of another tierlb instance are attached to {}: {}; they were attached by an agent with another \
         --instance or --bpffs and would translate with stale maps beside this one. Remove them: `tierlb agent \
         --cleanup --bpffs DIR --instance NAME` with that agent's settings, or `bpftool cgroup detach {} <type> id \
         <id>` for each",
        cgroup.display(),
        list.join(", "),
        cgroup.display()
    )
}

/// Every second, whether the agent's programs are still attached to its cgroup (a removed link pin or
/// `bpftool cgroup detach` takes them off while the agent runs): if not, they are attached again (as
/// kube-proxy rewrites its rules when its canary chain is flushed), logged and counted in `/healthz`, which
/// fails while they cannot be attached.
struct Watchdog {
    ours: Vec<(&'static str, Option<u32>)>,
    last: Instant,
    /// Another agent of this instance replaced the pinned links (both running at once): it owns the
    /// cgroup now, and this one stops watching rather than take it back every second.
    superseded: bool,
}

impl Watchdog {
    fn check(
        &mut self,
        programs: &mut crate::datapath::ebpf::Programs,
        cgroup: &std::path::Path,
        pin_dir: Option<&std::path::Path>,
        health: &SharedHealth,
    ) {
        if self.superseded || self.last.elapsed() < SWEEP_EVERY {
            return;
        }
        self.last = Instant::now();
        let missing = match crate::datapath::attached::check(cgroup, &self.ours, &[]) {
            Ok(a) if a.missing.is_empty() => return,
            Ok(a) => a.missing,
            Err(e) => {
                tracing::warn!(error = %e, "cannot query what is attached to the cgroup");
                return;
            }
        };
        if let Some(dir) = pin_dir
            && pins::pinned_program_ids(dir).len() == PROGRAMS.len()
        {
            tracing::warn!(dir = %dir.display(), "another agent of this instance replaced the programs: leaving them to it");
            self.superseded = true;
            return;
        }
        let what = format!(
            "{} not attached to {} (link pins removed, or detached by hand)",
            missing.join(", "),
            cgroup.display()
        );
        tracing::error!(programs = ?missing, cgroup = %cgroup.display(), "programs found detached: attaching them again");
        let result = programs.attach(cgroup, pin_dir);
        let mut h = health.lock().expect("health lock");
        match result {
            Ok(()) => {
                h.detached = None;
                h.reattached += 1;
                tracing::info!(cgroup = %cgroup.display(), "programs attached again");
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot attach the programs again");
                h.detached = Some(format!("{what}; attaching them again failed: {e}"));
            }
        }
    }
}

/// After a sync (or a retry): health is fresh again and names what is not programmed, statistics counted.
fn record(health: &SharedHealth, stats: &mut AgentStats, r: &SyncReport, core: &AgentCore<KernelMaps>) {
    let unprogrammed = core.unprogrammed();
    stats.services_unprogrammed.set(crate::metrics::gauge(unprogrammed.len()));
    let mut h = health.lock().expect("health lock");
    h.last_updated = Some(std::time::SystemTime::now());
    h.pending_since = None;
    h.unprogrammed = unprogrammed;
    let not_eligible = match core.model().nodes.get(core.node_name()) {
        Some(node) => node.not_eligible.map(str::to_owned),
        None if h.node_required => Some(format!("the API server holds no Node {}", core.node_name())),
        None => None,
    };
    if not_eligible != h.not_eligible {
        if let Some(why) = &not_eligible {
            tracing::warn!(reason = %why, "this node is not eligible for load balancer traffic: /healthz says 503");
        } else {
            tracing::info!("this node is eligible for load balancer traffic again");
        }
        h.not_eligible = not_eligible;
    }
    stats.syncs.inc();
    stats.sync_duration.observe(r.duration.as_secs_f64());
    // kube-proxy's families (metrics::kube_proxy says what each measures here): the maps are written now.
    let kp = &stats.kube_proxy;
    let now = std::time::SystemTime::now();
    kp.synced(r.duration, now, r.errors.is_empty());
    kp.changes(r.taken.services, r.taken.endpoint_slices);
    if r.errors.is_empty() {
        kp.programmed(&r.taken.triggers, now);
    }
    for (family, traffic, count) in r.no_local.iter() {
        kp.no_local_endpoints(family, traffic.as_str(), count);
    }
    stats.apply_errors.inc_by(r.errors.len() as u64);
    let errors = r.diagnostics.iter().filter(|d| d.severity == Severity::Error).count();
    stats.reload_errors.inc_by(errors as u64);
}

/// After a sync that changed what is applied (every change counts as added, updated or removed) or a Service
/// port's topology: a new metrics snapshot. Scrapes read it; nothing is computed in the loop for a scrape.
/// With `/metrics` off nothing reads them, and none is built (a snapshot is a copy per frontend).
fn publish<W: MapWriter>(snapshots: &watch::Sender<Arc<Snapshot>>, core: &mut AgentCore<W>) {
    if snapshots.receiver_count() == 0 {
        return;
    }
    let slot_capacity = snapshots.borrow().slot_capacity;
    let topology = core.topology();
    snapshots.send_replace(Arc::new(Snapshot::of(core.reconciler(), slot_capacity).with_topology(topology)));
}

/// How often at most the metrics snapshot is rebuilt: a snapshot costs one copy per frontend, so it is not
/// taken on every sync (a burst of edits at 10,000 Services would pay it each time), but on the loop's tick
/// once the maps changed and this much time passed. Scrapes (every 15 s or more) see the maps as of at most
/// this long ago.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);

/// Serve `/metrics` from the snapshots the loop publishes and the statistics it counts into. The counters
/// are read through a descriptor of the server's own (`KernelCounters`), so the maps must be loaded by now.
fn start_metrics(
    listener: tokio::net::TcpListener,
    snapshots: &watch::Sender<Arc<Snapshot>>,
    stats: &AgentStats,
    maps: &KernelMaps,
    ns: Option<aya::maps::PerCpuArray<aya::maps::MapData, u64>>,
) -> JoinHandle<()> {
    let counters = match maps.counters_reader() {
        Ok(c) => Some(Arc::new(KernelCounters(c, ns)) as Arc<dyn ReadCounters>),
        Err(e) => {
            tracing::error!(error = %e, "/metrics will have no per-Service connection counters");
            None
        }
    };
    let source = MetricsSource { snapshot: snapshots.subscribe(), stats: stats.clone(), counters };
    server::start_metrics(listener, source)
}

/// Say at start when connected UDP sockets to departed backends cannot be ended: the kernel cannot destroy
/// sockets, or no pod's network namespace is visible to the agent.
fn warn_unless_destruction_works(finder: &destroy::NetnsFinder) {
    match destroy::probe() {
        Ok(()) if finder.visible() > 1 => tracing::debug!("socket destruction available"),
        Ok(()) => tracing::warn!(
            dirs = ?finder.dirs,
            proc = ?finder.proc_root,
            "no pod network namespace is visible: connected UDP sockets to backends that leave a Service cannot be \
             ended; mount the host's /run/netns (HostToContainer), or the host's /proc with --host-proc"
        ),
        Err(why) => tracing::warn!(
            "{why}: connected UDP sockets to backends that leave a Service will not be ended (they reconnect only \
             when the application notices)"
        ),
    }
}

/// End connected UDP sockets whose backend left (after a sync that updated or removed frontends): logged and
/// counted, also those it could not reach.
fn end_departed_sockets(rec: &mut Reconciler<KernelMaps>, finder: &destroy::NetnsFinder, stats: &AgentStats) {
    let r = destroy::destroy_departed(rec, finder);
    stats.udp_sockets_destroyed.inc_by(r.destroyed as u64);
    stats.udp_sockets_unreached.inc_by(r.netns_not_found as u64);
    log_destroyed(&r);
}

/// Rule 7: try again the Services whose backoff is due, without a source event; true if the maps changed.
fn retry_due(
    core: &mut AgentCore<KernelMaps>,
    (north_south, programs): (&mut super::north_south::NorthSouth, &mut crate::datapath::ebpf::Programs),
    service_health: Option<&mut ServiceHealthServers>,
    stats: &mut AgentStats,
    health: &SharedHealth,
    finder: &destroy::NetnsFinder,
) -> bool {
    let Some(r) = core.retry_due(Instant::now()) else { return false };
    sync_service_health(service_health, stats, &r);
    north_south.after_sync(programs, &r, core);
    if r.updated + r.removed > 0 {
        end_departed_sockets(core.reconciler_mut(), finder, stats);
    }
    record(health, stats, &r, core);
    log_retry(&r);
    r.added + r.updated + r.removed > 0
}

/// How often the tick sweeps backend marks when no sync did.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Rule 8: sweeps of the backend marks.
struct Sweeper {
    last: Instant,
    /// Backends passive health held at the last sweep, with their hold's start (what the log reports).
    held: BTreeMap<lb_common::Backend, u64>,
}

impl Sweeper {
    /// After frontends changed (`changed`): delete expired backend marks and marks and passive health of
    /// backends that left every Service. Otherwise, once the last sweep is `SWEEP_EVERY` old: expired marks
    /// and healthy entries only (and report new holds and recoveries).
    fn sweep(&mut self, core: &mut AgentCore<KernelMaps>, stats: &AgentStats, changed: bool) {
        if !changed && self.last.elapsed() < SWEEP_EVERY {
            return;
        }
        self.last = Instant::now();
        match core.sweep_marks(crate::datapath::marks::boottime_ns(), changed) {
            Ok(r) => {
                stats.marks_cleared.inc_by(r.departed.len() as u64);
                log_sweep(&r);
            }
            Err(e) => tracing::warn!(error = %e, "cannot sweep the backend marks"),
        }
        match core.sweep_health(&mut self.held, changed) {
            Ok(r) => log_health(&r),
            Err(e) => tracing::warn!(error = %e, "cannot sweep the passive health map"),
        }
    }
}

/// Open or close the `healthCheckNodePort` listeners a sync asks for.
fn sync_service_health(sh: Option<&mut ServiceHealthServers>, stats: &mut AgentStats, r: &SyncReport) {
    let Some(sh) = sh else { return };
    for (port, e) in sh.sync(&r.health_ports) {
        stats.health_port_errors.inc();
        tracing::error!(port, error = %e, "cannot listen on healthCheckNodePort");
    }
}

/// Rule 2: a previous agent's maps keep serving connects while we start; take over what they hold, so the
/// first sync rewrites only what changed.
fn adopt(core: &mut AgentCore<KernelMaps>) -> anyhow::Result<()> {
    let adopted = core.reconciler_mut().adopt().context("adopting the pinned maps")?;
    if adopted.frontends > 0 {
        tracing::info!(
            frontends = adopted.frontends,
            orphan_slots_removed = adopted.orphan_slots_removed,
            orphan_names_removed = adopted.orphan_names_removed,
            orphan_members_removed = adopted.orphan_members_removed,
            unnamed = adopted.unnamed,
            "adopted the maps of a previous agent"
        );
    }
    Ok(())
}

/// The last pass of a migration from the previous map layout, once every program runs with the new maps.
fn finish_migration(migration: crate::datapath::migrate::Plan) -> anyhow::Result<()> {
    for stale in &migration.stale {
        tracing::info!(pin = %stale.display(), "removed a pin no attached program uses (left for or by a rollback)");
    }
    for (map, from, entries) in migration.finish().context("migrating the pinned maps")? {
        tracing::info!(
            map,
            from_layout = from,
            to_layout = crate::datapath::MAP_LAYOUT,
            entries,
            "migrated a pinned map in place"
        );
    }
    Ok(())
}

/// For a rollback: the maps this layout changed, pinned in the previous layout too (`migrate`). A failure is
/// logged: this agent's own pins stay as they are.
fn leave_for_previous(dir: &std::path::Path) {
    match crate::datapath::migrate::leave_for_previous(dir) {
        Ok(pins) => {
            for pin in pins {
                tracing::info!(pin = %pin.display(), from_layout = crate::datapath::MAP_LAYOUT, "left the previous map layout's pin for a rollback");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot leave the previous map layout's pins: a rollback starts their counts at 0");
        }
    }
}

/// Run the agent until SIGINT or SIGTERM; detaches on the way out (unless pinned).
#[expect(
    clippy::too_many_lines,
    reason = "the module's ordering rules read top to bottom in this one function"
)]
pub async fn run(opts: AgentOptions) -> anyhow::Result<()> {
    // Rule 1: listen for signals before doing anything slow (a signal with no listener would be lost).
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let cgroup = match &opts.cgroup {
        Some(p) => p.clone(),
        None => crate::cgroup::default_root()?,
    };
    let cgroup = crate::cgroup::check(&cgroup, opts.allow_root_cgroup)?;
    // Rule 6: the health server answers before anything slow (the source's first lists, the load, the first
    // sync): `/livez` 200, `/healthz` 503 until the first sync. The metrics port is bound now too (a port in
    // use fails the start at once) and served once the maps are loaded.
    let health = SharedHealth::default();
    // Reading the API server, this node's Node object is always there to read: without it (the node removed
    // from the cluster) the node is not eligible, as for kube-proxy. A manifests directory need not hold one.
    health.lock().expect("health lock").node_required = matches!(opts.source, Source::Kube);
    let _healthz = match opts.healthz_addr {
        Some(a) => Some(server::start_health(bind(a, "--healthz-addr")?, health.clone())),
        None => None,
    };
    let metrics_listener =
        if let Some(a) = opts.metrics_addr { Some(bind(a, "--metrics-addr")?) } else { None };
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let started = Instant::now();
    let pin_dir = match &opts.bpffs {
        Some(base) => Some(pins::prepare(base, opts.instance.as_deref().unwrap_or(&opts.node))?),
        None => None,
    };
    // The programs are verified and the maps made while the source starts (with --kube, its lists): the
    // two take seconds each at 100,000 Services and need nothing of each other.
    // Whichever fails first fails the start at once (a missing permission is not reported a minute later,
    // once the API server answered).
    let loading = {
        let (capacities, pin_dir) = (opts.capacities, pin_dir.clone());
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            Loaded::load(capacities, pin_dir.as_deref()).map(|l| (l, t.elapsed()))
        })
    };
    let source = async {
        let opened = start_source(&opts, tx.clone()).await?;
        anyhow::Ok((opened, started.elapsed()))
    };
    let loading = async { anyhow::Ok(loading.await.context("loading the programs")??) };
    let (
        ((source, file_watcher, api_server), source_ready),
        (Loaded { mut programs, maps, mut ns, migration }, load),
    ) = tokio::try_join!(source, loading)?;
    let mut external = opts.external.clone();
    for addr in api_server {
        tracing::info!(%addr, "the API server's address: no Service frontend may take it");
        external.protected.push(addr);
    }
    let source_name = source.describe();
    let pending = source.pending();
    ns.set_dsr(opts.dsr);
    let mut north_south = super::north_south::NorthSouth::new(
        ns,
        opts.devices.clone(),
        pin_dir.as_deref(),
        opts.node_port_range,
    );
    let mut core = AgentCore::new(opts.node.clone(), opts.zone.clone(), source, maps)
        .with_external(external)
        .with_limits(opts.limits)
        .with_lb_algorithm(opts.lb_algorithm)
        .with_dsr(opts.dsr);
    if pin_dir.is_some() {
        adopt(&mut core)?;
    }
    // Before the programs are attached (a restarted agent's flags replace the previous settings at once).
    core.reconciler_mut()
        .writer_mut()
        .set_health_config(opts.health.config())
        .context("writing the passive health settings")?;
    // Which node these maps serve, for `tierlb status` (and `tierlb study --clients` merging nodes' counters).
    core.reconciler_mut().writer_mut().put_node_name(&opts.node).context("writing the node's name")?;
    // Until the first sync, scrapes see what the reconciler has now (adopted from pins, or nothing).
    let mut stats = AgentStats::default();
    stats.kube_proxy.pending = pending;
    let snapshots = watch::Sender::new(Arc::new(Snapshot::of(core.reconciler(), opts.capacities.slots)));
    let ns_counters = north_south.counters_reader();
    let _metrics = metrics_listener
        .map(|l| start_metrics(l, &snapshots, &stats, core.reconciler().writer(), ns_counters));
    // Rule 3: the maps are filled before the programs are attached, so the first connect sees the full plan.
    let report = core.sync(Instant::now()).with_context(|| format!("reading {source_name}"))?;
    let synced = Instant::now();
    log_sync(&report);
    memory::check_limit(core.model().services.len(), opts.metrics_addr.is_some());
    refuse_other_instances(&cgroup, pin_dir.as_deref())?;
    programs.attach(&cgroup, pin_dir.as_deref())?;
    let mut watchdog = Watchdog { ours: programs.ids()?, last: Instant::now(), superseded: false };
    north_south.after_sync(&mut programs, &report, &core);
    // Every program now runs with this layout's maps: the previous layout's, migrated, are let go.
    finish_migration(migration)?;
    let mut sweeper = Sweeper { last: Instant::now(), held: BTreeMap::new() };
    sweeper.sweep(&mut core, &stats, true);
    record(&health, &mut stats, &report, &core);
    publish(&snapshots, &mut core);
    let mut service_health = opts.service_health_bind.map(ServiceHealthServers::new);
    sync_service_health(service_health.as_mut(), &mut stats, &report);

    drop(tx);
    // Rule 4: last, everything (programs, servers, listeners) is up when this line appears.
    let devices = north_south.devices();
    // Start to ready, by phase: the source's start (with --kube its lists, converted as they arrive) and, at
    // the same time, loading the programs and maps; then the first sync's reading of the source (with
    // manifests: every file), plan and map writes; then attaching the programs, the north-south maps, the
    // first sweep and metrics snapshot (`attach_ms`).
    let ms = |d: Duration| d.as_millis() as u64;
    tracing::info!(
        node = %opts.node,
        cgroup = %cgroup.display(),
        programs = ?PROGRAMS,
        ?devices,
        start_ms = ms(started.elapsed()),
        source_ms = ms(source_ready),
        load_ms = ms(load),
        read_ms = ms(report.read),
        plan_ms = ms(report.duration.saturating_sub(report.read + report.program)),
        program_ms = ms(report.program),
        attach_ms = ms(synced.elapsed()),
        "tierlb agent ready"
    );
    // Memory housekeeping after the first sync (repacking every map, handing free pages back) waits until the
    // node is served.
    memory::trim_after(&report, &mut core, &mut north_south);
    let finder = destroy::NetnsFinder::new(opts.host_proc.clone());
    warn_unless_destruction_works(&finder);
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    let (mut snapshot_stale, mut last_snapshot) = (false, Instant::now());
    loop {
        tokio::select! {
            _ = sigint.recv() => { tracing::info!("SIGINT: detaching and exiting"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: detaching and exiting"); break; }
            Some(()) = rx.recv() => {
                // Debounce: an editor's save is several events; take them all, then reload once.
                tokio::time::sleep(Duration::from_millis(5)).await;
                while rx.try_recv().is_ok() {}
                health.lock().expect("health lock").pending_since.get_or_insert_with(Instant::now);
                match core.sync(Instant::now()) {
                    Ok(r) => {
                        // Rule 5: everything a sync changes happens before its "synced" line (tests wait for it).
                        sync_service_health(service_health.as_mut(), &mut stats, &r);
                        north_south.after_sync(&mut programs, &r, &core);
                        if r.updated + r.removed > 0 {
                            end_departed_sockets(core.reconciler_mut(), &finder, &stats);
                            sweeper.sweep(&mut core, &stats, true);
                        }
                        record(&health, &mut stats, &r, &core);
                        snapshot_stale |= r.added + r.updated + r.removed > 0 || core.topology_changed();
                        memory::trim_after(&r, &mut core, &mut north_south);
                        log_sync(&r);
                    }
                    Err(e) => tracing::error!(source = %source_name, error = %e, "cannot read the source; keeping the current maps"),
                }
            }
            _ = tick.tick() => {
                core.collect_garbage(Instant::now());
                let retried = retry_due(
                    &mut core,
                    (&mut north_south, &mut programs),
                    service_health.as_mut(),
                    &mut stats,
                    &health,
                    &finder,
                );
                snapshot_stale |= retried;
                sweeper.sweep(&mut core, &stats, retried);
                if opts.metrics_addr.is_some() {
                    // A walk of the conntrack tables, for /metrics alone (`status` reads them itself).
                    north_south.observe(&stats);
                }
                north_south.rescan(&mut programs);
                watchdog.check(&mut programs, &cgroup, pin_dir.as_deref(), &health);
                if snapshot_stale && last_snapshot.elapsed() >= SNAPSHOT_EVERY {
                    publish(&snapshots, &mut core);
                    (snapshot_stale, last_snapshot) = (false, Instant::now());
                }
            }
        }
    }
    drop(file_watcher);
    if let Some(dir) = &pin_dir {
        leave_for_previous(dir);
        tracing::info!(
            dir = %dir.display(),
            "leaving the programs attached and the maps pinned for the next agent (`tierlb agent --cleanup` removes them)"
        );
    }
    // Without pins this detaches the programs; pinned links stay.
    drop(programs);
    Ok(())
}
