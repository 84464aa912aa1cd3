//! What the EndpointSlice controller would write as hints, for manifests that carry none and for `study`.
//!
//! Mirrors kube-controller-manager (Kubernetes 1.35): `endpointslice/reconciler.go` picks the mode
//! (`hintsEnabled` annotations first, else `trafficdist.ReconcileHints`), `trafficdist` writes the
//! PreferSameZone / PreferSameNode hints, and `topologycache` allocates zone hints by CPU share for
//! `topology-mode: Auto`.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{Endpoint, EndpointSlice, Hints, Model, ObjKey, Service, intern_list};

/// `trafficDistribution` value: the deprecated alias of `PreferSameZone`.
pub const PREFER_CLOSE: &str = "PreferClose";
/// `trafficDistribution` value: zone hints.
pub const PREFER_SAME_ZONE: &str = "PreferSameZone";
/// `trafficDistribution` value: node and zone hints.
pub const PREFER_SAME_NODE: &str = "PreferSameNode";

/// The controller's `OverloadThreshold`: a zone may get at most 20% fewer endpoints than its CPU share.
pub const OVERLOAD_THRESHOLD: f64 = 0.2;

/// How the controller treats a Service's hints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum HintMode {
    /// `topology-mode: Auto` (or the deprecated `topology-aware-hints: Auto`): zone hints by CPU share. The
    /// annotation wins over `trafficDistribution`.
    AutoAnnotation,
    /// `trafficDistribution: PreferClose` or `PreferSameZone`: each ready endpoint gets its own zone.
    PreferSameZone {
        /// Set through `PreferClose`, which the controller still honours.
        deprecated_alias: bool,
    },
    /// `trafficDistribution: PreferSameNode`: each ready endpoint gets its own zone and node.
    PreferSameNode,
    /// Unset, or a value the controller does not know: hints are removed.
    None {
        /// The value the controller did not know (none: the field is unset).
        unknown_value: Option<String>,
    },
}

/// `hintsEnabled` in the controller: the deprecated annotation wins when present, whatever its value.
pub fn annotation_enables_hints(svc: &Service) -> bool {
    let value = svc.topology_aware_hints_annotation.as_deref().or(svc.topology_mode_annotation.as_deref());
    matches!(value, Some("Auto" | "auto"))
}

/// The controller's choice for `svc`: the annotation first, else `trafficDistribution`.
pub fn mode(svc: &Service) -> HintMode {
    if annotation_enables_hints(svc) {
        return HintMode::AutoAnnotation;
    }
    match svc.traffic_distribution.as_deref() {
        Some(PREFER_CLOSE) => HintMode::PreferSameZone { deprecated_alias: true },
        Some(PREFER_SAME_ZONE) => HintMode::PreferSameZone { deprecated_alias: false },
        Some(PREFER_SAME_NODE) => HintMode::PreferSameNode,
        None => HintMode::None { unknown_value: None },
        Some(other) => HintMode::None { unknown_value: Some(other.to_owned()) },
    }
}

/// Why Auto mode wrote no hints (the controller's `TopologyAwareHintsDisabled` event messages).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum AutoDisabled {
    /// A node lacks a zone label or allocatable CPU.
    InsufficientNodeInfo,
    /// Every node is in one zone: zone hints would change nothing.
    NodesReadyInOneZoneOnly,
    /// Some zone would get no endpoint.
    InsufficientNumberOfEndpoints {
        /// Ready endpoints.
        endpoints: usize,
        /// Zones with nodes.
        zones: usize,
    },
    /// The zones' minimum allocations (CPU share less `OVERLOAD_THRESHOLD`) add up to more endpoints than
    /// there are.
    MinAllocationExceedsOverloadThreshold {
        /// Ready endpoints.
        endpoints: usize,
        /// Zones with nodes.
        zones: usize,
    },
    /// A ready endpoint has no zone.
    NoZoneSpecified,
}

impl std::fmt::Display for AutoDisabled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InsufficientNodeInfo => write!(f, "a node has no zone label or no allocatable CPU"),
            Self::NodesReadyInOneZoneOnly => write!(f, "all nodes are in one zone"),
            Self::InsufficientNumberOfEndpoints { endpoints, zones } => {
                write!(f, "fewer ready endpoints ({endpoints}) than zones ({zones})")
            }
            Self::MinAllocationExceedsOverloadThreshold { endpoints, zones } => write!(
                f,
                "{endpoints} endpoints cannot be spread over {zones} zones within the 20% overload threshold"
            ),
            Self::NoZoneSpecified => write!(f, "a ready endpoint has no zone"),
        }
    }
}

/// The controller's `SetNodes` then `getAllocations`: per zone, how many endpoints it should get by CPU
/// share (`desired`, at least the zone's minimum: its share less the overload threshold, rounded up).
/// Nodes labelled control-plane (or master) and nodes not Ready are left out; any other node without a zone
/// or with no allocatable CPU turns hints off.
fn allocations(model: &Model, endpoints: usize) -> Result<BTreeMap<String, f64>, AutoDisabled> {
    // Summed in u128: a Node may report up to u64::MAX millicores (the API server accepts
    // `18446744073709551615m`), and no number of such Nodes overflows a u128.
    let mut cpu_by_zone: BTreeMap<String, u128> = BTreeMap::new();
    let mut total = 0u128;
    for node in model.nodes.values().filter(|n| !n.cpu_share_excluded) {
        let zone = node.zone.as_deref().filter(|z| !z.is_empty());
        let (Some(zone), Some(cpu)) = (zone, node.allocatable_cpu_millis.filter(|c| *c > 0)) else {
            return Err(AutoDisabled::InsufficientNodeInfo);
        };
        *cpu_by_zone.entry(zone.to_owned()).or_default() += u128::from(cpu);
        total += u128::from(cpu);
    }
    if total == 0 {
        return Err(AutoDisabled::InsufficientNodeInfo);
    }
    let zones = cpu_by_zone.len();
    if zones < 2 {
        return Err(AutoDisabled::NodesReadyInOneZoneOnly);
    }
    if zones > endpoints {
        return Err(AutoDisabled::InsufficientNumberOfEndpoints { endpoints, zones });
    }
    let mut remaining = endpoints;
    let mut out = BTreeMap::new();
    for (zone, cpu) in &cpu_by_zone {
        let desired = (*cpu as f64 / total as f64) * endpoints as f64;
        #[expect(clippy::cast_sign_loss, reason = "a share of the endpoints, never negative")]
        let minimum = (desired * (1.0 / (1.0 + OVERLOAD_THRESHOLD))).ceil() as usize;
        // The controller checks `remaining < 0`; in usize that is the subtraction failing.
        let Some(left) = remaining.checked_sub(minimum) else {
            return Err(AutoDisabled::MinAllocationExceedsOverloadThreshold { endpoints, zones });
        };
        remaining = left;
        out.insert(zone.clone(), desired.max(minimum as f64));
    }
    Ok(out)
}

/// What applying the controller's logic did to one Service's slices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HintOutcome {
    /// The mode the Service is in.
    pub mode: HintMode,
    /// Auto mode fell back to no hints, and why.
    pub auto_disabled: Option<AutoDisabled>,
}

/// `EndpointReady` of the controller, which requires `ready` set and true. The controller always sets it, so
/// a slice that leaves it out was written by hand, and reads as kube-proxy reads it: ready.
fn ready(ep: &Endpoint) -> bool {
    ep.is_ready()
}

/// Rewrite the hints of a Service's slices as the controller would write them to slices that carry none
/// (the reconciler's `topologyCache.AddHints`, else `trafficdist.ReconcileHints`, else hints removed).
pub fn apply(model: &Model, svc: &Service, slices: &mut [EndpointSlice]) -> HintOutcome {
    let mode = mode(svc);
    let mut auto_disabled = None;
    match &mode {
        HintMode::PreferSameZone { .. } | HintMode::PreferSameNode => {
            let with_node = mode == HintMode::PreferSameNode;
            for ep in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()) {
                // Not-ready endpoints keep whatever hints they had (the controller skips them). A zone or
                // node name that is set but empty is copied as it is, as the controller copies the pointer.
                if !ready(ep) {
                    continue;
                }
                let for_zones = ep.zone.clone().map(|z| intern_list(vec![z]));
                let for_nodes =
                    if with_node { ep.node_name.clone().map(|n| intern_list(vec![n])) } else { None };
                ep.hints = Hints::new(for_nodes, for_zones);
            }
        }
        HintMode::None { .. } => remove(slices.iter_mut()),
        HintMode::AutoAnnotation => {
            // Per address type, as the controller reconciles a Service once per address type: one family
            // may get hints while the other gets none.
            let mut types = Vec::new();
            for s in slices.iter() {
                if !types.contains(&s.address_type) {
                    types.push(s.address_type);
                }
            }
            for t in types {
                let mut family: Vec<&mut EndpointSlice> =
                    slices.iter_mut().filter(|s| s.address_type == t).collect();
                if let Err(why) = auto_hints(model, &mut family) {
                    remove(family.into_iter());
                    auto_disabled.get_or_insert(why);
                }
            }
        }
    }
    HintOutcome { mode, auto_disabled }
}

fn remove<'a>(slices: impl Iterator<Item = &'a mut EndpointSlice>) {
    for ep in slices.flat_map(|s| s.endpoints.iter_mut()) {
        ep.hints = Hints::default();
    }
}

/// The controller's `AddHints` for one address type: every ready endpoint hinted for its own zone, then
/// whole endpoints moved from zones over their desired share to zones under it
/// (`getGivingAndReceivingZones`, `redistributeHints`). Go iterates maps in random order, so where zones
/// tie the controller may pick either; here zones are taken sorted, so results are stable.
fn auto_hints(model: &Model, slices: &mut [&mut EndpointSlice]) -> Result<(), AutoDisabled> {
    let total = slices.iter().flat_map(|s| &s.endpoints).filter(|e| ready(e)).count();
    let desired = allocations(model, total)?;
    let mut allocated: BTreeMap<String, usize> = BTreeMap::new();
    for ep in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()).filter(|e| ready(e)) {
        let Some(zone) = ep.zone.clone().filter(|z| !z.is_empty()) else {
            return Err(AutoDisabled::NoZoneSpecified);
        };
        *allocated.entry(zone.to_string()).or_default() += 1;
        ep.hints = Hints::new(None, Some(intern_list(vec![zone])));
    }
    let (mut giving, mut receiving) = giving_and_receiving(&desired, &allocated);
    for ep in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()).filter(|e| ready(e)) {
        if giving.is_empty() || receiving.is_empty() {
            break;
        }
        let Some(zone) = ep.zone.clone().filter(|z| giving.contains_key(&**z)) else {
            continue;
        };
        let Some(to) = receiving.keys().next().cloned() else {
            break;
        };
        ep.hints =
            Hints::new(ep.hints.for_nodes().cloned(), Some(intern_list(vec![crate::model::intern(&to)])));
        decrement(&mut giving, &zone);
        decrement(&mut receiving, &to);
    }
    Ok(())
}

/// The controller's `getGivingAndReceivingZones`: how many whole endpoints each zone gives and receives.
/// Each round moves one endpoint from the zone with the most surplus to the zone with the most need; it
/// stops when either is under half an endpoint, or both under one.
fn giving_and_receiving(
    desired: &BTreeMap<String, f64>,
    allocated: &BTreeMap<String, usize>,
) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut surplus: BTreeMap<&str, f64> = BTreeMap::new();
    let mut need: BTreeMap<&str, f64> = BTreeMap::new();
    for (zone, want) in desired {
        let have = allocated.get(zone).copied().unwrap_or(0) as f64;
        if have > *want {
            surplus.insert(zone, have - want);
        } else if have < *want {
            need.insert(zone, want - have);
        }
    }
    let (mut giving, mut receiving) = (BTreeMap::new(), BTreeMap::new());
    while let (Some((from, give)), Some((to, take))) = (most(&surplus), most(&need)) {
        if (give < 1.0 && take < 1.0) || give < 0.5 || take < 0.5 {
            break;
        }
        *giving.entry(from.to_owned()).or_default() += 1;
        *receiving.entry(to.to_owned()).or_default() += 1;
        *surplus.get_mut(from).expect("picked from the map") -= 1.0;
        *need.get_mut(to).expect("picked from the map") -= 1.0;
    }
    (giving, receiving)
}

/// `getMost`: the zone with the largest positive value, the first in order on a tie.
fn most<'a>(values: &BTreeMap<&'a str, f64>) -> Option<(&'a str, f64)> {
    let mut best: Option<(&str, f64)> = None;
    for (zone, v) in values {
        if *v > best.map_or(0.0, |b| b.1) {
            best = Some((zone, *v));
        }
    }
    best
}

fn decrement(m: &mut BTreeMap<String, usize>, k: &str) {
    if let Some(n) = m.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            m.remove(k);
        }
    }
}

/// True when no endpoint of these slices carries any hint.
pub fn carries_no_hints(slices: &[&EndpointSlice]) -> bool {
    slices.iter().flat_map(|s| &s.endpoints).all(|e| e.hints.is_empty())
}

/// For `--manifests` mode: fill in hints for every Service whose slices carry none, as the controller would.
/// Returns the Services it wrote hints for.
pub fn fill_missing(model: &mut Model) -> Vec<ObjKey> {
    let mut filled = Vec::new();
    let keys: Vec<_> = model.services.keys().cloned().collect();
    for key in keys {
        let Some(owned) = fill_for(model, &model.services[&key]) else { continue };
        for s in owned {
            model.slices.insert(s.key.clone(), s);
        }
        filled.push(key);
    }
    filled
}

/// One Service's slices with the hints the controller would write, when its slices carry none and the
/// controller would write some; `None` leaves the slices as they are.
pub fn fill_for(model: &Model, svc: &Service) -> Option<Vec<EndpointSlice>> {
    // Without a mode asking for hints the controller only removes them, and these slices carry none: most
    // Services, not worth a copy of their slices each.
    if matches!(mode(svc), HintMode::None { .. }) {
        return None;
    }
    let slices: Vec<&EndpointSlice> = model.slices_of(&svc.key).collect();
    if slices.is_empty() || !carries_no_hints(&slices) {
        return None;
    }
    let mut owned: Vec<EndpointSlice> = slices.into_iter().cloned().collect();
    apply(model, svc, &mut owned);
    if carries_no_hints(&owned.iter().collect::<Vec<_>>()) {
        return None;
    }
    Some(owned)
}
