//! The oracle of the hint emulation: what the EndpointSlice controller writes, transcribed a second time from
//! its source (Kubernetes 1.35, `staging/src/k8s.io/endpointslice`: `reconciler.go`'s choice between
//! `topologyCache.AddHints` and `trafficdist.ReconcileHints`, `topologycache.SetNodes`, `getAllocations`,
//! `AddHints`, `getGivingAndReceivingZones`, `redistributeHints`, `trafficdist`'s `preferCloseHeuristic`),
//! written in the Go code's own shape (a `Hints` pointer per endpoint, maps of zones, one pass per address
//! type) and kept apart from `hints.rs`, and checked against `hints::fill_for` and `hints::apply` by proptest
//! over random Services, Nodes and slices.
//!
//! Scope: slices that carry no hints, the only ones the agent fills (`fill_for`) and the ones `study` builds:
//! then every slice with a ready endpoint is one the controller updates, in the slices' order. Go walks its
//! maps in random order, so on a tie (two zones with the same surplus or need) the controller may pick either
//! zone; this oracle, like `hints.rs`, takes the first in sorted order. A `ready` left unset, which the
//! controller never writes (it always sets the condition, and reads an unset one as not ready), is read as
//! kube-proxy reads it, true: such a slice was written by hand for a ready endpoint. Not modelled: a Node without a `Ready`
//! condition, which the controller leaves out of the CPU shares and tierlb counts (`Node::cpu_share_excluded`
//! holds the rest of `isNodeReady` and `hasExcludedLabels`; its conversion has its own test).
use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// `discovery.EndpointHints`: `nil`, or zones and nodes (an empty Go slice is an absent list).
type Hints = Option<(Vec<String>, Vec<String>)>;

/// `EndpointReady`: the condition set and true; unset it is true here (see the scope above).
fn endpoint_ready(e: &Endpoint) -> bool {
    e.conditions.ready != Some(false)
}

/// `hintsEnabled`: the deprecated annotation when present, else `topology-mode`.
fn hints_enabled(s: &Service) -> bool {
    let val = match &s.topology_aware_hints_annotation {
        Some(v) => v,
        None => match &s.topology_mode_annotation {
            Some(v) => v,
            None => return false,
        },
    };
    val == "Auto" || val == "auto"
}

/// `SetNodes`: CPU ratios by zone, or nil (`None`) when any counted node lacks a zone or CPU, or there are
/// fewer than two zones.
fn set_nodes(m: &Model) -> Option<BTreeMap<String, f64>> {
    let mut cpu_by_zone: BTreeMap<String, f64> = BTreeMap::new();
    let mut total_cpu = 0.0;
    for node in m.nodes.values() {
        if node.cpu_share_excluded {
            continue;
        }
        let cpu = node.allocatable_cpu_millis.unwrap_or(0) as f64;
        let zone = node.zone.clone().unwrap_or_default();
        if zone.is_empty() || cpu == 0.0 {
            return None;
        }
        total_cpu += cpu;
        *cpu_by_zone.entry(zone).or_insert(0.0) += cpu;
    }
    if total_cpu == 0.0 || cpu_by_zone.len() < 2 {
        return None;
    }
    Some(cpu_by_zone.into_iter().map(|(z, c)| (z, c / total_cpu)).collect())
}

/// `getAllocations`: per zone its `desired` (the minimum's floor applied), or nil.
fn get_allocations(ratios: &BTreeMap<String, f64>, num_endpoints: usize) -> Option<BTreeMap<String, f64>> {
    if ratios.len() > num_endpoints {
        return None;
    }
    let mut remaining_min_endpoints = num_endpoints as f64;
    let mut allocations = BTreeMap::new();
    for (zone, ratio) in ratios {
        let desired = ratio * num_endpoints as f64;
        let minimum = (desired * (1.0 / (1.0 + 0.2))).ceil();
        allocations.insert(zone.clone(), desired.max(minimum));
        remaining_min_endpoints -= minimum;
        if remaining_min_endpoints < 0.0 {
            return None;
        }
    }
    Some(allocations)
}

/// `getMost`: the greatest value above 0 ("" when none), the first in (sorted) order on a tie.
fn get_most(zones: &BTreeMap<String, f64>) -> (String, f64) {
    let (mut zone, mut num) = (String::new(), 0.0);
    for (z, n) in zones {
        if *n > num {
            zone.clone_from(z);
            num = *n;
        }
    }
    (zone, num)
}

fn get_giving_and_receiving_zones(
    allocations: &BTreeMap<String, f64>,
    allocated: &BTreeMap<String, i64>,
) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let mut giving_desired = BTreeMap::new();
    let mut receiving_desired = BTreeMap::new();
    for (zone, target) in allocations {
        let hints = *allocated.get(zone).unwrap_or(&0) as f64;
        if hints > *target {
            giving_desired.insert(zone.clone(), hints - target);
        } else if hints < *target {
            receiving_desired.insert(zone.clone(), target - hints);
        }
    }
    let mut giving = BTreeMap::new();
    let mut receiving = BTreeMap::new();
    loop {
        let (gz, num_to_give) = get_most(&giving_desired);
        let (rz, num_to_receive) = get_most(&receiving_desired);
        if gz.is_empty()
            || rz.is_empty()
            || (num_to_give < 1.0 && num_to_receive < 1.0)
            || num_to_give < 0.5
            || num_to_receive < 0.5
        {
            break;
        }
        *giving.entry(gz.clone()).or_insert(0) += 1;
        *giving_desired.get_mut(&gz).unwrap() -= 1.0;
        *receiving.entry(rz.clone()).or_insert(0) += 1;
        *receiving_desired.get_mut(&rz).unwrap() -= 1.0;
    }
    (giving, receiving)
}

fn remove_hints(hints: &mut [Hints]) {
    for h in hints {
        *h = None;
    }
}

/// `AddHints` for one address type's endpoints (in the slices' order), on their `Hints`.
fn add_hints(m: &Model, eps: &[&Endpoint], hints: &mut [Hints]) {
    let total = eps.iter().filter(|e| endpoint_ready(e)).count();
    let allocations = set_nodes(m).and_then(|r| get_allocations(&r, total));
    let Some(allocations) = allocations else {
        remove_hints(hints); // RemoveHintsFromSlices
        return;
    };
    // Step 1.
    let mut allocated: BTreeMap<String, i64> = BTreeMap::new();
    for (i, e) in eps.iter().enumerate() {
        if !endpoint_ready(e) {
            continue;
        }
        let zone = e.zone.as_deref().unwrap_or_default().to_owned();
        if zone.is_empty() {
            remove_hints(hints);
            return;
        }
        *allocated.entry(zone.clone()).or_insert(0) += 1;
        hints[i] = Some((vec![zone], Vec::new()));
    }
    // Steps 2 and 3.
    let (mut giving, mut receiving) = get_giving_and_receiving_zones(&allocations, &allocated);
    for (i, e) in eps.iter().enumerate() {
        if !endpoint_ready(e) {
            continue;
        }
        if giving.is_empty() || receiving.is_empty() {
            return;
        }
        let giving_zone = e.zone.as_deref().unwrap_or_default().to_owned();
        if giving_zone.is_empty() || giving.get(&giving_zone).copied().unwrap_or(0) <= 0 {
            continue;
        }
        let Some((receiving_zone, n)) = receiving.iter().find(|(_, n)| **n > 0).map(|(z, n)| (z.clone(), *n))
        else {
            continue;
        };
        hints[i] = Some((vec![receiving_zone.clone()], Vec::new()));
        if giving[&giving_zone] == 1 {
            giving.remove(&giving_zone);
        } else {
            *giving.get_mut(&giving_zone).unwrap() -= 1;
        }
        if n == 1 {
            receiving.remove(&receiving_zone);
        } else {
            *receiving.get_mut(&receiving_zone).unwrap() -= 1;
        }
    }
}

/// `preferCloseHeuristic.update` on every endpoint.
fn prefer_close(eps: &[&Endpoint], hints: &mut [Hints], generate_node_hints: bool) {
    for (i, e) in eps.iter().enumerate() {
        if !endpoint_ready(e) {
            continue;
        }
        let for_zones: Vec<String> = e.zone.iter().map(ToString::to_string).collect();
        let for_nodes: Vec<String> = if generate_node_hints {
            e.node_name.iter().map(ToString::to_string).collect()
        } else {
            Vec::new()
        };
        hints[i] = if e.zone.is_some() || (generate_node_hints && e.node_name.is_some()) {
            Some((for_zones, for_nodes))
        } else {
            None
        };
    }
}

/// The reconciler's hints for a Service's slices that carry none: per slice, per endpoint, `Hints`.
fn controller(m: &Model, svc: &Service, slices: &[EndpointSlice]) -> Vec<Vec<Hints>> {
    let mut out: Vec<Vec<Hints>> = slices.iter().map(|s| vec![None; s.endpoints.len()]).collect();
    let td = svc.traffic_distribution.as_deref();
    let can_use_traffic_distribution =
        matches!(td, Some("PreferClose" | "PreferSameZone" | "PreferSameNode")) && !hints_enabled(svc);
    for address_type in [AddressType::IPv4, AddressType::IPv6, AddressType::Fqdn] {
        let idx: Vec<(usize, usize)> = (0..slices.len())
            .filter(|s| slices[*s].address_type == address_type)
            .flat_map(|s| (0..slices[s].endpoints.len()).map(move |e| (s, e)))
            .collect();
        let eps: Vec<&Endpoint> = idx.iter().map(|(s, e)| &slices[*s].endpoints[*e]).collect();
        let mut hints: Vec<Hints> = vec![None; eps.len()];
        if hints_enabled(svc) {
            add_hints(m, &eps, &mut hints);
        } else if can_use_traffic_distribution {
            prefer_close(&eps, &mut hints, td == Some("PreferSameNode"));
        }
        for ((s, e), h) in idx.into_iter().zip(hints) {
            out[s][e] = h;
        }
    }
    out
}

/// The model's view of a `Hints`: absent lists as `None`.
/// The model's hint names as strings, to compare with the controller's.
fn names(v: Option<&Vec<tierlb::model::Name>>) -> Option<Vec<String>> {
    v.map(|v| v.iter().map(ToString::to_string).collect())
}

fn as_model(h: &Hints) -> (Option<Vec<String>>, Option<Vec<String>>) {
    let list = |v: &Vec<String>| Some(v.clone()).filter(|v| !v.is_empty());
    h.as_ref().map_or((None, None), |(zones, nodes)| (list(nodes), list(zones)))
}

// ---------- the inputs ----------

const ZONES: [Option<&str>; 5] = [None, Some(""), Some("a"), Some("b"), Some("c")];
const NAMES: [Option<&str>; 5] = [None, Some(""), Some("n1"), Some("n2"), Some("n3")];
const CPUS: [Option<u64>; 6] = [None, Some(0), Some(1000), Some(1500), Some(4000), Some(8000)];
const TDS: [Option<&str>; 5] =
    [None, Some("PreferClose"), Some("PreferSameZone"), Some("PreferSameNode"), Some("Nearby")];
const ANNOTATIONS: [Option<&str>; 4] = [None, Some("Auto"), Some("auto"), Some("Disabled")];

fn pick<T: Clone>(from: &[T], i: usize) -> T {
    from[i % from.len()].clone()
}

/// (ready: 0 nil, 1 true, 2 false; zone; node name)
type EpSpec = (usize, usize, usize);
/// (IPv6?, endpoints)
type SliceSpec = (bool, Vec<EpSpec>);
/// (zone, CPU, left out of the shares?)
type NodeSpec = (usize, usize, bool);

fn arb_case() -> impl Strategy<Value = (usize, usize, usize, Vec<NodeSpec>, Vec<SliceSpec>)> {
    let ep = (0usize..3, 0usize..ZONES.len(), 0usize..NAMES.len());
    let slice = (any::<bool>(), proptest::collection::vec(ep, 0..9));
    // Most nodes in zones with CPU, so that Auto mode gets past its safeguards often enough.
    let node = (
        prop_oneof![4 => 2usize..5, 1 => 0usize..2],
        prop_oneof![4 => 2usize..6, 1 => 0usize..2],
        prop::bool::weighted(0.15),
    );
    (
        0usize..TDS.len(),
        0usize..ANNOTATIONS.len(),
        0usize..ANNOTATIONS.len(),
        proptest::collection::vec(node, 0..5),
        proptest::collection::vec(slice, 1..4),
    )
}

fn build(
    (td, mode, deprecated, nodes, slices): &(usize, usize, usize, Vec<NodeSpec>, Vec<SliceSpec>),
) -> (Model, Service) {
    let s = Service {
        traffic_distribution: pick(&TDS, *td).map(Into::into),
        topology_mode_annotation: pick(&ANNOTATIONS, *mode).map(Into::into),
        // The deprecated annotation: absent, or (rarely) present with a value.
        topology_aware_hints_annotation: [None, None, None, Some("Auto"), Some("")][deprecated % 5]
            .map(Into::into),
        ..svc()
    };
    let mut m = Model::default();
    for (i, (zone, cpu, excluded)) in nodes.iter().enumerate() {
        let name = format!("node-{i}");
        let n = Node {
            name: name.clone(),
            zone: pick(&ZONES, *zone).map(Into::into),
            allocatable_cpu_millis: pick(&CPUS, *cpu),
            cpu_share_excluded: *excluded,
            ..Node::default()
        };
        m.nodes.insert(name, n);
    }
    for (i, (v6, eps)) in slices.iter().enumerate() {
        let (family, base) = if *v6 { (AddressType::IPv6, "fd00::") } else { (AddressType::IPv4, "10.0.0.") };
        let mut sl = slice(&format!("web-{i}"), family, 8080, &[]);
        sl.endpoints = eps
            .iter()
            .enumerate()
            .map(|(j, (ready, zone, name))| Endpoint {
                address: Some(format!("{base}{}", i * 10 + j + 1).parse().unwrap()),
                conditions: Conditions {
                    ready: [None, Some(true), Some(false)][*ready],
                    ..Conditions::default()
                },
                node_name: pick(&NAMES, *name).map(Into::into),
                zone: pick(&ZONES, *zone).map(Into::into),
                hints: tierlb::model::Hints::default(),
            })
            .collect();
        m.slices.insert(sl.key.clone(), sl);
    }
    m.services.insert(s.key.clone(), s.clone().into());
    (m, s)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// `hints::apply` writes the controller's hints, endpoint by endpoint, and `hints::fill_for` hands the
    /// agent exactly those slices when the controller would write any hint (else leaves the slices alone).
    #[test]
    fn the_hint_emulation_writes_what_the_endpointslice_controller_writes(case in arb_case()) {
        let (m, s) = build(&case);
        let slices: Vec<EndpointSlice> = m.slices_of(&s.key).cloned().collect();
        let want = controller(&m, &s, &slices);
        let mut got = slices.clone();
        hints::apply(&m, &s, &mut got);
        for (sl, hints) in got.iter().zip(&want) {
            for (e, h) in sl.endpoints.iter().zip(hints) {
                prop_assert_eq!((names(e.hints.for_nodes().map(|l| &**l)), names(e.hints.for_zones().map(|l| &**l))), as_model(h), "{} {:?}", sl.key.name, e);
            }
        }
        let any = want.iter().flatten().any(Option::is_some);
        let filled = hints::fill_for(&m, &s);
        prop_assert_eq!(filled.is_some(), any);
        if let Some(filled) = filled {
            prop_assert_eq!(filled, got);
        }
    }
}
