//! One sync: refresh the source, track what changed, plan the touched Services, lower the plans to map
//! contents and apply the difference. No kernel and no async runtime here (the run loop drives it), so the
//! whole agent logic runs in unit tests against the in-memory maps.
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Instant,
};

use super::{
    ServiceHealth, SyncReport, Unprogrammed, VipConflict,
    claims::{self, Claims},
    limits::{Refused, ServiceLimits},
    lower::{self, Frontends},
    no_local::NoLocal,
    retry::{Retries, Tried},
    topology::Topology,
    tracker::{ChangeTracker, Touched},
};
use crate::{
    datapath::{
        Desired, MapWriter, Reconciler, addr,
        marks::{self, SweepReport},
    },
    hints,
    model::{EndpointSlice, NodeInfo, ObjKey, Service, node_addresses::ExternalConfig, proto_name},
    plan,
    source::ModelSource,
};

/// The agent's logic without the kernel or the async runtime: refresh the source and apply the plan of what
/// changed.
pub struct AgentCore<W: MapWriter> {
    node_name: String,
    zone_flag: Option<String>,
    /// `--nodeport-addresses` and `--external-ip-cidrs`, resolved into the node at every sync.
    external: ExternalConfig,
    source: Box<dyn ModelSource>,
    tracker: ChangeTracker,
    reconciler: Reconciler<W>,
    /// The node as of the last sync; a different one (zone label changed) replans every Service.
    node: Option<NodeInfo>,
    /// What the last plan of each Service contributed, kept up to date Service by Service, so that a sync
    /// that replans one Service walks nothing else (at 10,000 Services a walk with a copy per Service per
    /// sync costs more than the change): its frontend count (and their sum), whether its slices got the
    /// controller's hints, its `healthCheckNodePort` (externalTrafficPolicy Local only).
    planned: BTreeMap<ObjKey, usize>,
    frontends: usize,
    hints_filled: BTreeSet<ObjKey>,
    health: BTreeMap<ObjKey, (u16, ServiceHealth)>,
    /// Services whose frontends failed to apply, and when to try them again.
    retries: Retries,
    /// Which Service programs a frontend several claim.
    claims: Claims,
    /// Service ports kube-proxy would DROP for want of a local endpoint, per Service.
    no_local: NoLocal,
    /// Each planned Service port's topology, for `/metrics`.
    topology: Topology,
    /// What one Service may take (`--max-*-per-service`), and the Services over it now.
    limits: ServiceLimits,
    refused: Refused,
    /// `--lb-algorithm`: how the tc programs choose within a tier for traffic from outside.
    lb_algorithm: super::LbAlgorithm,
    /// `--dsr`: outside frontends under externalTrafficPolicy Cluster get `FLAG_DSR`.
    dsr: bool,
}

impl<W: MapWriter> AgentCore<W> {
    /// An agent for node `node_name` (zone: `zone_flag`, else the Node object's label) reading `source` and
    /// writing `writer`'s maps.
    pub fn new(
        node_name: impl Into<String>,
        zone_flag: Option<String>,
        source: Box<dyn ModelSource>,
        writer: W,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            zone_flag,
            external: ExternalConfig::default(),
            source,
            tracker: ChangeTracker::default(),
            reconciler: Reconciler::new(writer),
            node: None,
            planned: BTreeMap::new(),
            frontends: 0,
            hints_filled: BTreeSet::new(),
            health: BTreeMap::new(),
            retries: Retries::default(),
            claims: Claims::default(),
            no_local: NoLocal::default(),
            topology: Topology::default(),
            limits: ServiceLimits::default(),
            refused: Refused::default(),
            lb_algorithm: super::LbAlgorithm::Random,
            dsr: false,
        }
    }

    /// Direct server return for traffic from outside (`--dsr`; default: off).
    #[must_use]
    pub fn with_dsr(self, dsr: bool) -> Self {
        Self { dsr, ..self }
    }

    /// Choose within a tier for traffic from outside by `algorithm` (default: random).
    #[must_use]
    pub fn with_lb_algorithm(self, lb_algorithm: super::LbAlgorithm) -> Self {
        Self { lb_algorithm, ..self }
    }

    /// Use `limits` for what one Service may take (default: `DEFAULT_LIMITS`).
    #[must_use]
    pub fn with_limits(self, limits: ServiceLimits) -> Self {
        Self { limits, ..self }
    }

    /// Use `external` for NodePort addresses and externalIP limits (default: Node addresses, no limit).
    #[must_use]
    pub fn with_external(self, external: ExternalConfig) -> Self {
        Self { external, ..self }
    }

    /// Rebuild every map kept per Service or per frontend (the source's, the model's, the plans' records, the
    /// reconciler's) with full nodes (`model::compact::repack`): after a sync that inserted many in key order,
    /// their nodes are a little over half full.
    pub fn repack(&mut self) {
        use crate::model::compact::{repack, repack_set};
        self.source.repack();
        self.tracker.repack();
        self.reconciler.repack();
        repack(&mut self.planned);
        repack_set(&mut self.hints_filled);
        repack(&mut self.health);
        self.claims.repack();
        self.no_local.repack();
        self.topology.repack();
    }

    /// The node this agent programs.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The model as the source has it now.
    pub fn model(&self) -> &crate::model::Model {
        self.tracker.model()
    }

    /// The reconciler (and through it the maps).
    pub fn reconciler(&self) -> &Reconciler<W> {
        &self.reconciler
    }

    /// The reconciler, for adoption, garbage collection and socket destruction.
    pub fn reconciler_mut(&mut self) -> &mut Reconciler<W> {
        &mut self.reconciler
    }

    /// Refresh the source and apply the plan. Only the Services an object change touches are planned and
    /// written again (with the failed Services whose retry is due); a new model from the source, a Node
    /// change or a new zone replans every Service. The maps keep their last good state for whatever fails.
    pub fn sync(&mut self, now: Instant) -> std::io::Result<SyncReport> {
        let started = Instant::now();
        let refresh = self.source.refresh()?;
        let touched = self.tracker.apply(refresh.changes);
        let read = started.elapsed();
        let (name, zone) = (&self.node_name, self.zone_flag.as_deref());
        let node = NodeInfo::resolve_with(name, zone, self.tracker.model(), &self.external);
        let mut report = self.plan_and_apply(touched, node, now);
        report.taken = self.tracker.taken().clone();
        report.diagnostics = refresh.diagnostics;
        report.stale = refresh.stale;
        report.duration = started.elapsed();
        report.read = read;
        Ok(report)
    }

    /// Try again the Services that failed to apply and whose retry is due, without reading the source (the
    /// run loop calls it on its tick). `None` when none is due.
    pub fn retry_due(&mut self, now: Instant) -> Option<SyncReport> {
        let node = self.node.clone()?;
        if self.retries.due(now).is_empty() {
            return None;
        }
        let started = Instant::now();
        let mut report = self.plan_and_apply(Touched::Services(BTreeSet::new()), node, now);
        report.duration = started.elapsed();
        Some(report)
    }

    fn plan_and_apply(&mut self, touched: Touched, node: NodeInfo, now: Instant) -> SyncReport {
        let mut newly_filled = Vec::new();
        let mut conflicted = BTreeSet::new();
        let program;
        let (tried, applied) = match touched {
            Touched::Services(mut keys) if self.node.as_ref() == Some(&node) => {
                keys.extend(self.retries.due(now));
                let mut planned = self.plan_services(keys.iter(), &node, &BTreeSet::new(), &mut newly_filled);
                for (svc, mine) in &planned {
                    conflicted.extend(self.claims.set(
                        svc,
                        claims::created(self.tracker.model(), svc),
                        claims::claimed(self.tracker.model(), svc, mine),
                    ));
                }
                // A frontend whose winner changed to a Service not planned now (the old winner left it): plan
                // that Service too, so its frontend is programmed.
                let heirs: BTreeSet<ObjKey> = conflicted
                    .iter()
                    .filter_map(|k| self.claims.winner(k))
                    .filter(|w| !keys.contains(*w))
                    .cloned()
                    .collect();
                planned.extend(self.plan_services(heirs.iter(), &node, &BTreeSet::new(), &mut newly_filled));
                keys.extend(heirs);
                let desired = self.winners(planned);
                let programming = Instant::now();
                let applied = self.reconciler.apply_services(&keys, &desired, now);
                program = programming.elapsed();
                (Some(keys), applied)
            }
            // Everything, or the same changes on a node whose zone moved.
            _ => {
                self.planned.clear();
                self.frontends = 0;
                self.health.clear();
                self.no_local.clear();
                self.topology.clear();
                self.claims.clear();
                let reported = std::mem::take(&mut self.hints_filled);
                let keys: Vec<ObjKey> = self.tracker.model().services.keys().cloned().collect();
                let planned = self.plan_services(keys.iter(), &node, &reported, &mut newly_filled);
                // Every claim is new (the claims were cleared): every conflict is reported (`tried` is `None`),
                // without a set of the 100,000 frontends saying so.
                for (svc, mine) in &planned {
                    self.claims.set(
                        svc,
                        claims::created(self.tracker.model(), svc),
                        claims::claimed(self.tracker.model(), svc, mine),
                    );
                }
                let desired = self.winners(planned);
                let programming = Instant::now();
                let applied = self.reconciler.apply(&desired, now);
                program = programming.elapsed();
                (None, applied)
            }
        };
        let replanned = tried.as_ref().map_or(self.tracker.model().services.len(), BTreeSet::len);
        self.retries.record(&tried.as_ref().map_or(Tried::All, Tried::Some), &applied.errors, now);
        if applied.removed + applied.updated > 0 {
            self.retries.capacity_freed(now);
        }
        self.node = Some(node.clone());
        let mut health_ports: BTreeMap<u16, ServiceHealth> = BTreeMap::new();
        for (port, h) in self.health.values() {
            let entry = health_ports.entry(*port).or_insert_with(|| h.clone());
            entry.local_endpoints = entry.local_endpoints.max(h.local_endpoints);
        }
        let conflicts = self
            .claims
            .conflicts()
            .filter(|(k, _)| tried.is_none() || conflicted.contains(k))
            .map(|(frontend, who)| VipConflict {
                frontend,
                winner: who[0].service.clone(),
                losers: who[1..].iter().map(|c| c.service.clone()).collect(),
            })
            .collect();
        SyncReport {
            node: Some(node),
            frontends: self.frontends - self.claims.lost(),
            added: applied.added,
            updated: applied.updated,
            removed: applied.removed,
            replanned,
            touched: tried,
            errors: applied.errors,
            conflicts,
            hints_filled: self.hints_filled.len(),
            hints_newly_filled: newly_filled,
            health_ports,
            no_local: self.no_local.total(),
            program,
            ..SyncReport::default()
        }
    }

    /// The frontends of `planned` each Service wins (a frontend several claim goes to `plan::vip_winner`).
    fn winners(&self, planned: BTreeMap<ObjKey, Frontends>) -> Desired {
        let mut out = Desired::new();
        for (svc, mine) in planned {
            out.extend(mine.into_iter().filter(|(k, _)| self.claims.winner(k) == Some(&svc)));
        }
        out
    }

    /// The Services with frontends not programmed as planned, with the reasons: those that failed to apply
    /// (they keep their previous state, none if new), and those whose VIP:port another Service holds.
    pub fn unprogrammed(&self) -> Vec<Unprogrammed> {
        let mut out: BTreeMap<ObjKey, Unprogrammed> = self
            .retries
            .failures()
            .iter()
            .map(|(k, f)| {
                let u = Unprogrammed {
                    service: k.clone(),
                    reasons: f.reasons.clone(),
                    since: Some(f.since),
                    attempts: f.attempts,
                    next_retry: Some(f.next),
                };
                (k.clone(), u)
            })
            .collect();
        for (key, r) in self.refused.iter() {
            let u = out.entry(key.clone()).or_insert_with(|| Unprogrammed {
                service: key.clone(),
                reasons: Vec::new(),
                since: Some(r.since),
                attempts: 0,
                next_retry: None,
            });
            u.reasons.push(format!("over its limit: {}", r.why));
        }
        for (key, who) in self.claims.conflicts() {
            let vip = addr::frontend_addr(&key);
            let proto = proto_name(key.proto);
            for loser in who[1..].iter().map(|c| &c.service) {
                let text = plan::vip_conflict_text(vip, proto, &who, loser);
                let u = out.entry(loser.clone()).or_insert_with(|| Unprogrammed {
                    service: loser.clone(),
                    reasons: Vec::new(),
                    since: None,
                    attempts: 0,
                    next_retry: None,
                });
                u.reasons.push(text);
            }
        }
        out.into_values().collect()
    }

    /// Delete backend marks that expired and, with `departed`, marks of backends no applied frontend holds
    /// (a pod IP reused later must not inherit a mark meant for the pod that had it). The run loop sweeps
    /// departed backends after syncs that changed frontends (only they can make one depart; the walk over
    /// every applied backend is paid then, and only while marks exist), expired ones on its tick.
    pub fn sweep_marks(
        &mut self,
        now_ns: u64,
        departed: bool,
    ) -> Result<SweepReport, crate::datapath::MapError> {
        let marks = self.reconciler.writer().backend_marks()?;
        if marks.is_empty() {
            return Ok(SweepReport::default());
        }
        if !departed {
            return marks::sweep(self.reconciler.writer_mut(), |_| true, now_ns);
        }
        let wanted: BTreeSet<lb_common::Backend> = marks.iter().map(|(b, _)| *b).collect();
        let held = self.applied_among(&wanted);
        marks::sweep(self.reconciler.writer_mut(), |b| held.contains(b), now_ns)
    }

    /// Those of `wanted` that an applied frontend holds (one walk over every applied backend).
    fn applied_among(&self, wanted: &BTreeSet<lb_common::Backend>) -> BTreeSet<lb_common::Backend> {
        self.reconciler
            .applied()
            .flat_map(|(_, _, d)| d.slots)
            .filter(|b| wanted.contains(b))
            .copied()
            .collect()
    }

    /// Sweep the passive health map (`health::sweep`): healthy entries go and, with `departed`, entries of
    /// backends no applied frontend holds (as for marks, only a sync that changed frontends can make one
    /// depart, so the walk over every applied backend is paid only then, and only while entries exist).
    pub fn sweep_health(
        &mut self,
        last: &mut BTreeMap<lb_common::Backend, u64>,
        departed: bool,
    ) -> Result<crate::datapath::health::HealthSweep, crate::datapath::MapError> {
        let entries = self.reconciler.writer().health()?;
        if entries.is_empty() && last.is_empty() {
            crate::datapath::health::gate(self.reconciler.writer_mut())?;
            return Ok(crate::datapath::health::HealthSweep::default());
        }
        let held = departed.then(|| {
            let wanted: BTreeSet<lb_common::Backend> =
                entries.iter().map(|(b, _)| *b).chain(last.keys().copied()).collect();
            self.applied_among(&wanted)
        });
        let in_use = |b: &lb_common::Backend| held.as_ref().is_none_or(|h| h.contains(b));
        let swept = crate::datapath::health::sweep(self.reconciler.writer_mut(), entries, in_use, last)?;
        crate::datapath::health::gate(self.reconciler.writer_mut())?;
        Ok(swept)
    }

    /// Services whose slices carry no hints and got the controller's.
    pub fn hints_filled(&self) -> &BTreeSet<ObjKey> {
        &self.hints_filled
    }

    /// Plan these Services (with the controller's hints where their slices carry none) and return the
    /// frontends each wants; a Service no longer in the model wants none. Services newly planned with the
    /// controller's hints (not so before, nor in `reported`) are added to `newly_filled`.
    ///
    /// Planning a Service reads only the model (`plan_one`); a long batch (a full sync) is planned in chunks
    /// of `PLAN_CHUNK`, each split between this thread and one more, then booked here in key order, so the
    /// result is the same as one by one. A chunk's plans are dropped once booked.
    fn plan_services<'a>(
        &mut self,
        keys: impl Iterator<Item = &'a ObjKey>,
        node: &NodeInfo,
        reported: &BTreeSet<ObjKey>,
        newly_filled: &mut Vec<ObjKey>,
    ) -> BTreeMap<ObjKey, Frontends> {
        let mut desired = BTreeMap::new();
        let keys: Vec<&ObjKey> = keys.collect();
        for chunk in keys.chunks(PLAN_CHUNK) {
            let (model, limits, algorithm) = (self.tracker.model(), &self.limits, self.lb_algorithm);
            let dsr = self.dsr;
            let plan = |k: &&ObjKey| plan_one(model, limits, k, node, algorithm, dsr);
            let results = crate::halves::map_in_halves(chunk, PARALLEL_PLAN_MIN, plan);
            for (key, result) in chunk.iter().zip(results) {
                let mine = self.book(key, result, reported, newly_filled);
                desired.insert((*key).clone(), mine);
            }
        }
        desired
    }

    /// Record what planning `key` gave (`plan_one`) and return the frontends it wants now.
    fn book(
        &mut self,
        key: &ObjKey,
        result: Planning,
        reported: &BTreeSet<ObjKey>,
        newly_filled: &mut Vec<ObjKey>,
    ) -> Frontends {
        let (svc, filled, plans, mine) = match result {
            Planning::Gone => {
                if let Some(old) = self.planned.remove(key) {
                    self.frontends -= old;
                }
                self.hints_filled.remove(key);
                self.health.remove(key);
                self.no_local.remove(key);
                self.refused.clear(key);
                self.topology.remove(key);
                return Frontends::new();
            }
            Planning::Refused(why) => {
                let counts = (&mut self.planned, &mut self.frontends);
                return refuse(&mut self.refused, &self.reconciler, counts, key, why);
            }
            Planning::Done { svc, filled, plans, mine } => (svc, filled, plans, mine),
        };
        self.refused.clear(key);
        if let Some(old) = self.planned.remove(key) {
            self.frontends -= old;
        }
        let was_filled = self.hints_filled.remove(key) || reported.contains(key);
        self.health.remove(key);
        self.no_local.remove(key);
        self.no_local.set(key, &plans);
        self.topology.set(&svc, &plans, filled);
        for (port, h) in plans.iter().filter_map(|p| lower::health_port(&svc, p)) {
            let seen = self.health.entry(key.clone()).or_insert((port, h.clone()));
            seen.1.local_endpoints = seen.1.local_endpoints.max(h.local_endpoints);
        }
        if filled {
            self.hints_filled.insert(key.clone());
            if !was_filled {
                newly_filled.push(key.clone());
            }
        }
        self.frontends += mine.len();
        self.planned.insert(key.clone(), mine.len());
        mine
    }

    /// Every planned Service port's topology (`/metrics`' `tierlb_service_topology`).
    pub fn topology(&mut self) -> Arc<Vec<crate::metrics::ServiceTopology>> {
        self.topology.all()
    }

    /// Whether a Service port's topology changed since `topology` was last called.
    pub fn topology_changed(&self) -> bool {
        self.topology.changed()
    }

    /// Delete slots whose grace period is over (the run loop calls it every tick).
    pub fn collect_garbage(&mut self, now: Instant) {
        self.reconciler.collect_garbage(now);
    }
}

/// Services planned per chunk of a long batch, and from how many Services in one chunk the planning is split
/// between two threads (a full sync: at 100,000 Services planning took about 0.7 s from manifests and 1.4 s
/// from the API server on one thread, its allocations' page faults much of it).
const PLAN_CHUNK: usize = 4096;
const PARALLEL_PLAN_MIN: usize = 1024;

/// What planning one Service gave (`plan_one`), before it is booked (`AgentCore::book`).
enum Planning {
    /// No longer in the model.
    Gone,
    /// Over a limit (`limits`), with why.
    Refused(String),
    /// Planned: the Service (so that booking need not look it up again), whether its slices got the
    /// controller's hints, its port plans and the frontends it wants.
    Done { svc: Arc<Service>, filled: bool, plans: Vec<plan::PortPlan>, mine: Frontends },
}

/// Plan Service `key` for `node` within `limits`, reading only the model. Over a limit before planning
/// (externalIPs, endpoints: planned not at all) or after (frontends, slots), it is refused.
fn plan_one(
    model: &crate::model::Model,
    limits: &ServiceLimits,
    key: &ObjKey,
    node: &NodeInfo,
    algorithm: super::LbAlgorithm,
    dsr: bool,
) -> Planning {
    let Some(svc) = model.services.get(key) else { return Planning::Gone };
    if let Some(why) = limits.before_planning(model, svc) {
        return Planning::Refused(why);
    }
    let filled = hints::fill_for(model, svc);
    let slices: Vec<&EndpointSlice> = match &filled {
        Some(owned) => owned.iter().collect(),
        None => model.slices_of(key).collect(),
    };
    let plans = plan::plan_service(svc, &slices, node);
    let mut mine = lower::frontends(&plans);
    // Traffic from outside only: a connect on the node has no other node to agree with (Maglev) nor to skip
    // (DSR). DSR where the backend may be on another node: not under externalTrafficPolicy Local.
    for (key, want) in &mut mine {
        if key.is_outside() {
            if algorithm == super::LbAlgorithm::Maglev {
                want.flags |= lb_common::FLAG_MAGLEV;
            }
            if dsr && want.flags & lb_common::FLAG_POLICY_LOCAL == 0 {
                want.flags |= lb_common::FLAG_DSR;
            }
        }
    }
    match limits.after_planning(&mine) {
        Some(why) => Planning::Refused(why),
        None => Planning::Done { svc: svc.clone(), filled: filled.is_some(), plans, mine },
    }
}

/// Refuse `key` for `why` (`limits`): it keeps the frontends it has programmed (none if it is new), as the
/// desired state of this sync, counted in `planned` (a Service's frontend count, and their sum). Its health
/// check port and metrics stay as its last plan left them (a replan of every Service drops them until it fits
/// again).
fn refuse<W: MapWriter>(
    refused: &mut Refused,
    reconciler: &Reconciler<W>,
    (planned, frontends): (&mut BTreeMap<ObjKey, usize>, &mut usize),
    key: &ObjKey,
    why: String,
) -> Frontends {
    let shown = why.clone();
    if refused.set(key, why) {
        tracing::warn!(
            service = %key,
            "{shown}: not programmed (it keeps what it had; the other Services are not held up)"
        );
    }
    let kept: Frontends = reconciler
        .applied()
        .filter(|(_, _, d)| d.name.service == *key)
        .map(|(k, _, d)| (*k, d.to_desired()))
        .collect();
    if let Some(old) = planned.remove(key) {
        *frontends -= old;
    }
    *frontends += kept.len();
    planned.insert(key.clone(), kept.len());
    kept
}

#[cfg(test)]
mod tests;
