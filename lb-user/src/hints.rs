//! What the EndpointSlice controller would write as hints, for manifests that carry none and for `study`.
//!
//! Mirrors kube-controller-manager (Kubernetes 1.35): `endpointslice/reconciler.go` picks the mode
//! (`hintsEnabled` annotations first, else `trafficdist.ReconcileHints`), `trafficdist` writes the
//! PreferSameZone / PreferSameNode hints, and `topologycache` allocates zone hints by CPU share for
//! `topology-mode: Auto`.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{Endpoint, EndpointSlice, Model, ObjKey, Service};

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

fn zone_of(ep: &Endpoint) -> Option<&str> {
    ep.zone.as_deref().filter(|z| !z.is_empty())
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

#[derive(Clone, Copy, Debug)]
struct Allocation {
    minimum: usize,
    maximum: usize,
}

/// The controller's `getAllocations`: per zone, how many endpoints it should get by CPU share.
fn allocations(model: &Model, endpoints: usize) -> Result<BTreeMap<String, Allocation>, AutoDisabled> {
    // Summed in u128: a Node may report up to u64::MAX millicores (the API server accepts
    // `18446744073709551615m`), and no number of such Nodes overflows a u128.
    let mut cpu_by_zone: BTreeMap<String, u128> = BTreeMap::new();
    let mut total = 0u128;
    for node in model.nodes.values() {
        let (Some(zone), Some(cpu)) =
            (node.zone.as_deref().filter(|z| !z.is_empty()), node.allocatable_cpu_millis)
        else {
            return Err(AutoDisabled::InsufficientNodeInfo);
        };
        *cpu_by_zone.entry(zone.to_owned()).or_default() += u128::from(cpu);
        total += u128::from(cpu);
    }
    if cpu_by_zone.is_empty() || total == 0 {
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
    let mut min_total = 0usize;
    let mut out = BTreeMap::new();
    for (zone, cpu) in &cpu_by_zone {
        let desired = (*cpu as f64 / total as f64) * endpoints as f64;
        #[expect(clippy::cast_sign_loss, reason = "a share of the endpoints, never negative")]
        let minimum = (desired * (1.0 / (1.0 + OVERLOAD_THRESHOLD))).ceil() as usize;
        min_total += minimum;
        // The controller checks `remaining < 0`; in usize that is the subtraction failing.
        let Some(left) = remaining.checked_sub(minimum) else {
            return Err(AutoDisabled::MinAllocationExceedsOverloadThreshold { endpoints, zones });
        };
        remaining = left;
        out.insert(zone.clone(), Allocation { minimum, maximum: 0 });
    }
    for a in out.values_mut() {
        a.maximum = a.minimum + endpoints - min_total;
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

/// Rewrite the hints of a Service's slices as the controller would.
pub fn apply(model: &Model, svc: &Service, slices: &mut [EndpointSlice]) -> HintOutcome {
    let mode = mode(svc);
    let mut auto_disabled = None;
    match &mode {
        HintMode::PreferSameZone { .. } | HintMode::PreferSameNode => {
            let with_node = mode == HintMode::PreferSameNode;
            for ep in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()) {
                // Not-ready endpoints keep whatever hints they had (the controller skips them).
                if !ep.is_ready() {
                    continue;
                }
                ep.for_zones = zone_of(ep).map(|z| vec![z.to_owned()]);
                ep.for_nodes = if with_node {
                    ep.node_name.clone().filter(|n| !n.is_empty()).map(|n| vec![n])
                } else {
                    None
                };
            }
        }
        HintMode::None { .. } => remove(slices),
        HintMode::AutoAnnotation => {
            if let Err(why) = auto_hints(model, slices) {
                remove(slices);
                auto_disabled = Some(why);
            }
        }
    }
    HintOutcome { mode, auto_disabled }
}

fn remove(slices: &mut [EndpointSlice]) {
    for ep in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()) {
        ep.for_nodes = None;
        ep.for_zones = None;
    }
}

/// The controller's `AddHints`: own zone first, then move hints from zones over their maximum to zones
/// under their minimum. Go iterates maps in random order; here zones are taken sorted, so results are stable.
fn auto_hints(model: &Model, slices: &mut [EndpointSlice]) -> Result<(), AutoDisabled> {
    let ready = slices.iter().flat_map(|s| &s.endpoints).filter(|e| e.is_ready()).count();
    let alloc = allocations(model, ready)?;
    let mut allocated: BTreeMap<String, usize> = BTreeMap::new();
    for ep in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()) {
        if !ep.is_ready() {
            ep.for_nodes = None;
            ep.for_zones = None;
            continue;
        }
        let Some(zone) = zone_of(ep).map(str::to_owned) else {
            return Err(AutoDisabled::NoZoneSpecified);
        };
        *allocated.entry(zone.clone()).or_default() += 1;
        ep.for_nodes = None;
        ep.for_zones = Some(vec![zone]);
    }
    let mut giving: BTreeMap<String, usize> = BTreeMap::new();
    let mut receiving: BTreeMap<String, usize> = BTreeMap::new();
    for (zone, a) in &alloc {
        let have = allocated.get(zone).copied().unwrap_or(0);
        if have < a.minimum {
            receiving.insert(zone.clone(), a.minimum - have);
        } else if have > a.maximum {
            giving.insert(zone.clone(), have - a.maximum);
        }
    }
    for ep in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()) {
        if giving.is_empty() || receiving.is_empty() {
            break;
        }
        if !ep.is_ready() {
            continue;
        }
        let Some(zone) = zone_of(ep).map(str::to_owned) else {
            continue;
        };
        if giving.get(&zone).copied().unwrap_or(0) == 0 {
            continue;
        }
        let Some(to) = receiving.iter().find(|(_, n)| **n > 0).map(|(z, _)| z.clone()) else {
            break;
        };
        ep.for_zones = Some(vec![to.clone()]);
        decrement(&mut giving, &zone);
        decrement(&mut receiving, &to);
    }
    Ok(())
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
    slices.iter().flat_map(|s| &s.endpoints).all(|e| e.for_nodes.is_none() && e.for_zones.is_none())
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
    let slices: Vec<&EndpointSlice> = model.slices_of(&svc.key).collect();
    if slices.is_empty() || !carries_no_hints(&slices) {
        return None;
    }
    let mut owned: Vec<EndpointSlice> = slices.into_iter().cloned().collect();
    let outcome = apply(model, svc, &mut owned);
    if matches!(outcome.mode, HintMode::None { .. }) || outcome.auto_disabled.is_some() {
        return None;
    }
    if carries_no_hints(&owned.iter().collect::<Vec<_>>()) {
        return None;
    }
    Some(owned)
}
