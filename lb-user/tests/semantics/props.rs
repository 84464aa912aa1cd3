//! Property tests of the plan against `oracle.rs`, kube-proxy's selection written a second time from its
//! source: over random Services (both families and dual-stack, several ports, named and unnamed, TCP, UDP and
//! SCTP, ClusterIP, NodePort and LoadBalancer with external IPs and ingress IPs, both traffic policies) and
//! random slices (several per Service and family, FQDN ones, ports that do not match, duplicates across
//! slices, nil conditions, node and zone hints including empty lists), on random nodes (with or without a
//! zone), the plan's selected tier and endpoints equal kube-proxy's, and its fallback tiers are kube-proxy's
//! sets under the next weaker topology mode.
use proptest::prelude::*;

use super::{
    oracle::{self, Mode},
    *,
};

const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// What an address is, wherever it appears (duplicates across slices differ only in `nodeName`, which is the
/// only field kube-proxy's merge lets differ without depending on the Go map's iteration order).
#[derive(Clone, Debug)]
struct Identity {
    conditions: Conditions,
    zone: Option<&'static str>,
    /// Hints of any kind: absent, empty, or naming nodes (zones).
    for_nodes: Option<Vec<String>>,
    for_zones: Option<Vec<String>>,
    /// Non-empty hints, used when the input's hint style asks every endpoint to carry them (so that the
    /// all-or-nothing rules are met often enough to be tested).
    some_nodes: Vec<String>,
    some_zones: Vec<String>,
}

const NODE_SETS: [&[&str]; 5] = [&[], &["n1"], &["n2"], &["n3"], &["n1", "n3"]];
// "" is a valid zone hint (a label value) and names a node without a zone label in kube-proxy.
const ZONE_SETS: [&[&str]; 5] = [&[], &["a"], &["b"], &["a", "b"], &[""]];

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn arb_identity() -> impl Strategy<Value = Identity> {
    (
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(prop::sample::select(vec!["a", "b", ""])),
        proptest::option::of(0..NODE_SETS.len()),
        proptest::option::of(0..ZONE_SETS.len()),
        (1..NODE_SETS.len(), 1..ZONE_SETS.len()),
    )
        .prop_map(|(ready, serving, terminating, zone, n, z, (sn, sz))| Identity {
            conditions: Conditions { ready, serving, terminating },
            zone,
            for_nodes: n.map(|i| strings(NODE_SETS[i])),
            for_zones: z.map(|i| strings(ZONE_SETS[i])),
            some_nodes: strings(NODE_SETS[sn]),
            some_zones: strings(ZONE_SETS[sz]),
        })
}

const V4: [&str; 6] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"];
const V6: [&str; 6] = ["fd00::1", "fd00::2", "fd00::3", "fd00::4", "fd00::5", "fd00::6"];

/// The Service ports to choose from: names, numbers and protocols; a lone port may be unnamed.
const PORTS: [(&str, u16, Protocol); 4] = [
    ("http", 80, Protocol::Tcp),
    ("dns", 53, Protocol::Udp),
    ("dns-tcp", 53, Protocol::Tcp),
    ("sctp", 9, Protocol::Sctp),
];

#[derive(Clone, Debug)]
struct Input {
    svc: Service,
    slices: Vec<EndpointSlice>,
    node: NodeInfo,
}

/// One slice: its address type (0-1: the family of the first cluster IP, 2-3: of the last, 4: the other
/// family, 5: FQDN); per Service port, its target port and whether it is listed as is (`miss` 0: left out,
/// 1: under another name, 2: with the other protocol, else as is); its endpoints (address index, node index:
/// 3 is no `nodeName`).
type SliceSpec = (u8, [(u16, u8); 3], Vec<(usize, usize)>);

fn arb_slice() -> impl Strategy<Value = SliceSpec> {
    (
        0u8..6,
        [(8080u16..8083, 0u8..10), (8080u16..8083, 0u8..10), (8080u16..8083, 0u8..10)],
        proptest::collection::vec((0usize..6, 0usize..4), 0..7),
    )
}

fn other(p: Protocol) -> Protocol {
    if p == Protocol::Tcp { Protocol::Udp } else { Protocol::Tcp }
}

/// The Service's shape: families (index into the four orders), number of ports, the first of `PORTS`, and
/// whether a lone port is unnamed.
type Shape = (usize, usize, usize, bool);
/// How it is exposed: type, ITP Local, ETP Local, which external IPs and ingress IPs (bit masks over v4, v6).
type Exposure = (usize, bool, bool, u8, u8);

fn make_service(
    (fam, nports, first_port, unnamed): Shape,
    (ty, itp, etp, eips, lbips): Exposure,
    td: Option<&str>,
) -> Service {
    let v4: IpAddr = "10.96.0.10".parse().unwrap();
    let v6: IpAddr = "fd00:96::10".parse().unwrap();
    let type_ = [ServiceType::ClusterIP, ServiceType::NodePort, ServiceType::LoadBalancer][ty];
    let ports = (0..nports)
        .map(|i| {
            let (name, port, protocol) = PORTS[(first_port + i) % PORTS.len()];
            let name = if nports == 1 && unnamed { "" } else { name };
            let node_port = (type_ != ServiceType::ClusterIP).then_some(30000 + port);
            ServicePort { name: name.into(), port, protocol, node_port }
        })
        .collect();
    let pick = |mask: u8, ips: [&str; 2]| -> Vec<IpAddr> {
        (0..2).filter(|b| mask & (1 << b) != 0).map(|b| ips[b].parse().unwrap()).collect()
    };
    Service {
        key: ObjKey::new("default", "web"),
        type_,
        cluster_ips: [vec![v4], vec![v6], vec![v4, v6], vec![v6, v4]][fam].clone().into(),
        ports,
        internal_policy: if itp { Policy::Local } else { Policy::Cluster },
        external_policy: if etp { Policy::Local } else { Policy::Cluster },
        external_ips: pick(eips, ["203.0.113.1", "2001:db8::1"]).into(),
        load_balancer_ips: if type_ == ServiceType::LoadBalancer {
            pick(lbips, ["198.51.100.1", "2001:db8::2"]).into()
        } else {
            Vec::new().into()
        },
        traffic_distribution: td.map(Into::into),
        ..Service::default()
    }
}

/// The identity of address `i` (0-5 v4, 6-11 v6) under hint style 0 (as generated), 1 (every endpoint
/// carries node and zone hints), 2 (zone hints only) or 3 (node hints only).
fn identity(ids: &[Identity], style: u8, i: usize) -> Identity {
    let mut id = ids[i].clone();
    if style == 1 || style == 3 {
        id.for_nodes = Some(id.some_nodes.clone());
    }
    if style == 1 || style == 2 {
        id.for_zones = Some(id.some_zones.clone());
    }
    id
}

fn make_slice(
    i: usize,
    (at, listed, eps): SliceSpec,
    svc: &Service,
    ids: &[Identity],
    style: u8,
) -> EndpointSlice {
    let family_type = |ip: &IpAddr| if ip.is_ipv4() { AddressType::IPv4 } else { AddressType::IPv6 };
    let first = &svc.cluster_ips[0];
    let address_type = match at {
        0 | 1 => family_type(first),
        2 | 3 => family_type(svc.cluster_ips.last().unwrap()),
        4 if first.is_ipv4() => AddressType::IPv6,
        4 => AddressType::IPv4,
        _ => AddressType::Fqdn,
    };
    let mut names = std::collections::BTreeSet::new();
    let ports = svc
        .ports
        .iter()
        .zip(listed)
        .filter_map(|(sp, (target, miss))| {
            let (name, protocol) = match miss {
                0 => return None,
                1 => ("other".to_owned(), sp.protocol),
                2 => (sp.name.clone(), other(sp.protocol)),
                _ => (sp.name.clone(), sp.protocol),
            };
            Some(SlicePort { name, port: target, protocol })
        })
        // Port names are unique in a slice (ValidateEndpointSlice).
        .filter(|p| names.insert(p.name.clone()))
        .collect();
    let endpoints = eps
        .into_iter()
        .map(|(a, node)| {
            let (address, id) = match address_type {
                AddressType::IPv6 => (V6[a].parse().ok(), identity(ids, style, 6 + a)),
                AddressType::IPv4 => (V4[a].parse().ok(), identity(ids, style, a)),
                AddressType::Fqdn => (None, identity(ids, style, a)),
            };
            Endpoint {
                address,
                conditions: id.conditions,
                node_name: NODES.get(node).map(|n| (*n).into()),
                zone: id.zone.map(Into::into),
                hints: tierlb::model::Hints::new(
                    id.for_nodes.map(|v| tierlb::model::intern_list(v.into_iter().map(Into::into).collect())),
                    id.for_zones.map(|v| tierlb::model::intern_list(v.into_iter().map(Into::into).collect())),
                ),
            }
        })
        .collect();
    EndpointSlice {
        key: ObjKey::new("default", format!("web-{i}")),
        service_name: Some("web".into()),
        address_type,
        ports,
        endpoints,
        not_proxied: None,
        last_change_trigger_time: None,
    }
}

fn arb_input() -> impl Strategy<Value = Input> {
    let td = vec![None, Some("PreferSameNode"), Some("PreferSameZone"), Some("PreferClose"), Some("Bogus")];
    (
        (0usize..4, 1usize..=3, 0usize..4, any::<bool>()),
        (0usize..3, any::<bool>(), any::<bool>(), 0u8..4, 0u8..4),
        prop::sample::select(td),
        (proptest::collection::vec(arb_identity(), 12), 0u8..4),
        proptest::collection::vec(arb_slice(), 1..5),
        (0usize..3, prop::sample::select(vec![None, Some("a"), Some("b"), Some("")])),
    )
        .prop_map(|(shape, exposure, td, (ids, style), slices, (n, z))| {
            let svc = make_service(shape, exposure, td);
            let slices = slices
                .into_iter()
                .enumerate()
                .map(|(i, spec)| make_slice(i, spec, &svc, &ids, style))
                .collect();
            Input { svc, slices, node: node(NODES[n], z) }
        })
}

fn model_of(input: &Input) -> Model {
    let mut m = Model::default();
    for s in &input.slices {
        m.slices.insert(s.key.clone(), s.clone());
    }
    m.services.insert(input.svc.key.clone(), input.svc.clone().into());
    // What the agent does for slices without hints; the oracle reads the slices as filled.
    hints::fill_missing(&mut m);
    m
}

fn sorted(mut v: Vec<SocketAddr>) -> Vec<SocketAddr> {
    v.sort();
    v
}

/// kube-proxy's set in a plan's terms: the tier tierlb selects for it, and what an empty set does.
fn expected_tier(policy_local: bool, set: &[SocketAddr], mode: Mode) -> SelectedTier {
    match (policy_local, set.is_empty(), mode) {
        (_, true, _) => SelectedTier::None,
        (true, false, _) => SelectedTier::Local,
        (false, false, Mode::SameNode) => SelectedTier::Node,
        (false, false, Mode::SameZone) => SelectedTier::Zone,
        (false, false, Mode::None) => SelectedTier::Cluster,
    }
}

fn check_traffic(
    what: &str,
    t: &plan::TrafficPlan,
    local: bool,
    c: &oracle::Categorized,
) -> Result<(), TestCaseError> {
    let set = if local { c.local.clone() } else { c.cluster.clone() };
    let set =
        sorted(set.ok_or_else(|| TestCaseError::fail(format!("{what}: kube-proxy computed no such set")))?);
    prop_assert_eq!(&t.endpoints, &set, "{}: endpoints", what);
    prop_assert_eq!(t.selected_tier, expected_tier(local, &set, c.mode), "{}: tier", what);
    prop_assert_eq!(t.policy, if local { Policy::Local } else { Policy::Cluster }, "{}: policy", what);
    let when_empty = match (set.is_empty(), local && c.has_any) {
        (false, _) => None,
        (true, true) => Some(WhenEmpty::Drop),
        (true, false) => Some(WhenEmpty::Reject),
    };
    prop_assert_eq!(t.when_empty, when_empty, "{}: when_empty", what);
    Ok(())
}

/// tierlb's own tiers (DESIGN.md): each is kube-proxy's cluster set under a topology mode that kube-proxy's
/// all-or-nothing rule allows on this node; a Local policy has only its local set.
fn check_tiers(
    what: &str,
    t: &plan::TrafficPlan,
    exp: &oracle::Expected,
    node: &str,
    zone: &str,
) -> Result<(), TestCaseError> {
    if t.policy == Policy::Local {
        prop_assert_eq!(&t.tiers.node, &t.endpoints, "{}: a Local policy's tier is its set", what);
        prop_assert!(t.tiers.zone.is_empty() && t.tiers.cluster.is_empty(), "{}: {:?}", what, t.tiers);
        return Ok(());
    }
    let eps = &exp.endpoints;
    let under = |mode: Mode| -> Vec<SocketAddr> {
        sorted(
            eps.iter()
                .filter(|e| e.ready && oracle::available_for_topology(e, mode, node, zone))
                .map(|e| e.addr)
                .collect(),
        )
    };
    // The node tier exists when kube-proxy uses node hints; the zone tier when it would use zone hints were
    // there no node hints (the all-or-nothing rule on zone hints alone).
    let ready: Vec<_> = eps.iter().filter(|e| e.ready).cloned().collect();
    let no_node_hints: Vec<_> = ready
        .iter()
        .map(|e| oracle::KpEndpoint { node_hints: std::collections::BTreeSet::default(), ..e.clone() })
        .collect();
    let zone_allowed = oracle::topology_mode(&no_node_hints, node, zone) == Mode::SameZone;
    let node_tier = if exp.categorized.mode == Mode::SameNode { under(Mode::SameNode) } else { Vec::new() };
    let zone_tier = if zone_allowed { under(Mode::SameZone) } else { Vec::new() };
    let mut cluster = under(Mode::None);
    if cluster.is_empty() {
        cluster = sorted(eps.iter().filter(|e| e.serving && e.terminating).map(|e| e.addr).collect());
    }
    prop_assert_eq!(&t.tiers.node, &node_tier, "{}: node tier", what);
    prop_assert_eq!(&t.tiers.zone, &zone_tier, "{}: zone tier", what);
    prop_assert_eq!(&t.tiers.cluster, &cluster, "{}: cluster tier", what);
    Ok(())
}

/// Properties that hold whatever kube-proxy says: the endpoints are the first non-empty tier; a Cluster
/// policy with a ready endpoint anywhere never selects nothing; a Local policy never holds a remote endpoint.
fn check_invariants(what: &str, t: &plan::TrafficPlan, exp: &oracle::Expected) -> Result<(), TestCaseError> {
    let first = t.tiers.as_array().into_iter().find(|tier| !tier.is_empty()).unwrap_or_default();
    prop_assert_eq!(t.endpoints.as_slice(), first, "{}: endpoints = first non-empty tier", what);
    if t.policy == Policy::Cluster && exp.endpoints.iter().any(|e| e.ready) {
        prop_assert!(!t.endpoints.is_empty(), "{}: a ready endpoint exists but none is selected", what);
    }
    if t.policy == Policy::Local {
        let local: Vec<SocketAddr> = exp.endpoints.iter().filter(|e| e.is_local).map(|e| e.addr).collect();
        for ep in t.tiers.as_array().into_iter().flatten() {
            prop_assert!(local.contains(ep), "{}: Local policy holds remote {}", what, ep);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_plan_selects_what_kube_proxys_categorize_endpoints_selects(input in arb_input()) {
        let m = model_of(&input);
        let p = plan::plan(&m, &input.node);
        let slices: Vec<&EndpointSlice> = m.slices_of(&input.svc.key).collect();
        let zone = input.node.zone.as_deref();
        let node_name = input.node.name.as_str();
        // One plan per translated port and family of the Service's cluster IPs, nothing else.
        let mut want: Vec<(String, Family)> = Vec::new();
        for ip in &input.svc.cluster_ips {
            for port in input.svc.ports.iter().filter(|p| oracle::translated(p.protocol)) {
                want.push((port.name.clone(), Family::of(ip)));
            }
        }
        let got: Vec<(String, Family)> = p.services.iter().map(|s| (s.name.port.clone(), s.family)).collect();
        prop_assert_eq!(&got, &want);
        for sp in &p.services {
            let port = input.svc.ports.iter().find(|p| p.name == sp.name.port).unwrap();
            let exp = oracle::expected(&input.svc, port, sp.family, &slices, node_name, zone);
            let what = format!("{}/{:?}", sp.name.port, sp.family);
            let c = &exp.categorized;
            prop_assert_eq!(sp.has_any_endpoints, c.has_any, "{}: has_any_endpoints", what);
            check_traffic(&format!("{what} internal"), &sp.internal, exp.itp_local, c)?;
            check_tiers(&format!("{what} internal"), &sp.internal, &exp, node_name, zone.unwrap_or(""))?;
            check_invariants(&format!("{what} internal"), &sp.internal, &exp)?;
            prop_assert_eq!(sp.external.is_some(), exp.externally_accessible, "{}: externally accessible", what);
            if let Some(x) = &sp.external {
                // Connects made on the node, from pods and from its own processes: the cluster set (the EXT
                // chain's short-circuits); traffic from outside: the external policy's set.
                check_traffic(&format!("{what} from_pods"), &x.from_pods, false, c)?;
                check_traffic(&format!("{what} from_node"), &x.from_node, false, c)?;
                check_traffic(&format!("{what} from_outside"), &x.from_outside, exp.etp_local, c)?;
                for t in [&x.from_pods, &x.from_outside] {
                    check_tiers(&what, t, &exp, node_name, zone.unwrap_or(""))?;
                    check_invariants(&what, t, &exp)?;
                }
            }
        }
    }
}
