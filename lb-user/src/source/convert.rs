//! k8s-openapi objects -> model, refusing what the API server would refuse (`validate`). Shared by the
//! manifests and kube sources. Every error names the field (as a path inside the object) so a user can find
//! it, and says how to fix it.
use std::net::IpAddr;

use k8s_openapi::{
    api::{core::v1 as core, discovery::v1 as discovery},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

pub use super::fields::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, ANNOTATION_TOPOLOGY_AWARE_HINTS, ANNOTATION_TOPOLOGY_MODE,
    ANNOTATIONS_READ, FieldError, Invalid, LABEL_SERVICE_NAME, LABEL_ZONE,
};
use super::{
    fields::{ANNOTATION_LB_SOURCE_RANGES, Lazy, Path, err, policy},
    validate,
};
use crate::model::{
    AddressType, Conditions, Endpoint, EndpointSlice, Hints, Kind, Name, Node, NodeAddress, NodeAddressKind,
    ObjKey, ObjectId, Protocol, ProxyLabel, Service, ServicePort, ServiceType, SlicePort, compact::exact,
    intern, intern_list,
};

/// The conversion, unless validation found problems (a conversion error on a field validation already
/// reported is not repeated).
fn validated<T>(mut errors: Invalid, converted: Result<T, FieldError>) -> Result<T, Invalid> {
    match converted {
        Ok(v) if errors.is_empty() => Ok(v),
        Ok(_) => Err(errors),
        Err(e) => {
            if !errors.iter().any(|x| x.field == e.field) {
                errors.push(e);
            }
            Err(errors)
        }
    }
}

fn key_of(meta: &ObjectMeta) -> Result<ObjKey, FieldError> {
    let name = meta.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| err("metadata.name", "missing"))?;
    Ok(ObjKey::new(namespace_of(meta), name))
}

/// A manifest without `metadata.namespace` is in namespace "default" (as `kubectl apply` would put it).
fn namespace_of(meta: &ObjectMeta) -> String {
    meta.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".to_owned())
}

/// The identity of the object of kind `kind` that `meta` describes, the one its conversion will have (also
/// when its name is missing, so that a problem can be reported against it).
pub(super) fn id_of(kind: Kind, meta: &ObjectMeta) -> ObjectId {
    let name = meta.name.clone().unwrap_or_default();
    match kind {
        Kind::Node => ObjectId::node(name),
        Kind::Service | Kind::EndpointSlice => ObjectId::new(kind, ObjKey::new(namespace_of(meta), name)),
    }
}

fn port(field: impl Path, value: i32) -> Result<u16, FieldError> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| err(field, format!("port {value} is out of range (1-65535)")))
}

fn protocol(field: impl Path, value: Option<&str>) -> Result<Protocol, FieldError> {
    let value = value.unwrap_or("TCP");
    Protocol::parse(value).ok_or_else(|| err(field, format!("unknown protocol {value:?} (TCP, UDP or SCTP)")))
}

fn ip(field: impl Path, value: &str) -> Result<IpAddr, FieldError> {
    value.parse().map_err(|_| err(field, format!("{value:?} is not an IP address")))
}

/// A Service as the semantics read it: type, IPs, ports, traffic policies, health check node port and
/// topology settings.
pub fn service(svc: &core::Service) -> Result<Service, Invalid> {
    validated(validate::service(svc), convert_service(svc))
}

fn convert_service(svc: &core::Service) -> Result<Service, FieldError> {
    let key = key_of(&svc.metadata)?;
    // Borrowed, not cloned, as the annotations below (kubectl's last-applied copy of the whole object among
    // them).
    let spec = validate::spec_of(svc);
    let type_ = match spec.type_.as_deref() {
        None | Some("ClusterIP") => ServiceType::ClusterIP,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => ServiceType::ExternalName,
        Some(other) => return Err(err("spec.type", format!("unknown Service type {other:?}"))),
    };
    // spec.clusterIPs supersedes spec.clusterIP (the API server keeps clusterIP == clusterIPs[0]).
    let raw_ips: Vec<String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.clone(),
        (_, Some(one)) => vec![one.clone()],
        _ => Vec::new(),
    };
    let mut cluster_ips = Vec::new();
    for (i, raw) in raw_ips.iter().enumerate() {
        if raw == "None" || raw.is_empty() {
            continue; // headless
        }
        cluster_ips.push(ip(Lazy(|| format!("spec.clusterIPs[{i}]")), raw)?);
    }
    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(n) => Some(port(Lazy(|| format!("spec.ports[{i}].nodePort")), n)?),
        };
        ports.push(ServicePort {
            name: p.name.clone().unwrap_or_default(),
            port: port(Lazy(|| format!("spec.ports[{i}].port")), p.port)?,
            protocol: protocol(Lazy(|| format!("spec.ports[{i}].protocol")), p.protocol.as_deref())?,
            node_port,
        });
    }
    let mut external_ips = Vec::new();
    for (i, raw) in spec.external_ips.iter().flatten().enumerate() {
        external_ips.push(ip(Lazy(|| format!("spec.externalIPs[{i}]")), raw)?);
    }
    let (mut load_balancer_ips, mut load_balancer_proxy_ips) = (Vec::new(), Vec::new());
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let Some(raw) = &ing.ip else { continue };
        let addr = ip(Lazy(|| format!("status.loadBalancer.ingress[{i}].ip")), raw)?;
        // kube-proxy's `IsVIPMode` (pkg/proxy/util): unset or `VIP` is captured, `Proxy` is not.
        match ing.ip_mode.as_deref() {
            None | Some("VIP") => load_balancer_ips.push(addr),
            Some("Proxy") => load_balancer_proxy_ips.push(addr),
            Some(other) => {
                return Err(err(
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    format!("unknown ipMode {other:?} (VIP or Proxy)"),
                ));
            }
        }
    }
    let health_check_node_port = match spec.health_check_node_port {
        None | Some(0) => None,
        Some(n) => Some(port("spec.healthCheckNodePort", n)?),
    };
    let no_annotations = std::collections::BTreeMap::new();
    let annotations = svc.metadata.annotations.as_ref().unwrap_or(&no_annotations);
    let session_affinity_timeout = session_affinity(spec)?;
    let load_balancer_source_ranges = source_ranges(spec, annotations.get(ANNOTATION_LB_SOURCE_RANGES))?;
    // Kept for the Service's life: no room for more than it has (`compact`).
    Ok(Service {
        key,
        created: svc.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        type_,
        cluster_ips: cluster_ips.into_boxed_slice(),
        ports: ports.into_boxed_slice(),
        internal_policy: policy("spec.internalTrafficPolicy", spec.internal_traffic_policy.as_deref())?,
        external_policy: policy("spec.externalTrafficPolicy", spec.external_traffic_policy.as_deref())?,
        external_ips: external_ips.into_boxed_slice(),
        load_balancer_ips: load_balancer_ips.into_boxed_slice(),
        load_balancer_proxy_ips: load_balancer_proxy_ips.into_boxed_slice(),
        load_balancer_source_ranges: load_balancer_source_ranges.into_boxed_slice(),
        health_check_node_port,
        traffic_distribution: spec.traffic_distribution.as_deref().map(intern),
        topology_mode_annotation: annotations.get(ANNOTATION_TOPOLOGY_MODE).map(|v| intern(v)),
        topology_aware_hints_annotation: annotations.get(ANNOTATION_TOPOLOGY_AWARE_HINTS).map(|v| intern(v)),
        session_affinity_timeout,
        not_proxied: ProxyLabel::of(svc.metadata.labels.as_ref()),
    })
}

/// `spec.loadBalancerSourceRanges`, else the annotation (comma-separated), as kube-proxy's
/// `newBaseServiceInfo` reads them; each must be a CIDR (the API server's validation refuses others; the
/// annotation's items are trimmed, as `GetLoadBalancerSourceRanges` does).
fn source_ranges(
    spec: &core::ServiceSpec,
    annotation: Option<&String>,
) -> Result<Vec<crate::model::node_addresses::Cidr>, FieldError> {
    let (field, items): (&str, Vec<&str>) = match &spec.load_balancer_source_ranges {
        Some(v) if !v.is_empty() => ("spec.loadBalancerSourceRanges", v.iter().map(String::as_str).collect()),
        _ => match annotation {
            Some(a) => {
                (ANNOTATION_LB_SOURCE_RANGES, a.split(',').map(str::trim).filter(|s| !s.is_empty()).collect())
            }
            None => return Ok(Vec::new()),
        },
    };
    items
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            raw.trim().parse().map_err(|e: crate::model::node_addresses::BadCidr| {
                err(format!("{field}[{i}]"), format!("{e}"))
            })
        })
        .collect()
}

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;
/// The API server's largest `timeoutSeconds` (one day).
pub const MAX_AFFINITY_TIMEOUT_S: u32 = 86_400;

/// `spec.sessionAffinity`: the ClientIP timeout in seconds, or `None`. Refuses what the API server refuses
/// (ValidateService: an unknown value, a timeout outside 1..=86400, a config without ClientIP).
fn session_affinity(spec: &core::ServiceSpec) -> Result<Option<u32>, FieldError> {
    let timeout = spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref());
    match spec.session_affinity.as_deref() {
        None | Some("None") => match timeout {
            Some(_) => Err(err(
                "spec.sessionAffinityConfig",
                "must not be set when sessionAffinity is None (set sessionAffinity: ClientIP, or remove it)",
            )),
            None => Ok(None),
        },
        Some("ClientIP") => match timeout.and_then(|c| c.timeout_seconds) {
            None => Ok(Some(DEFAULT_AFFINITY_TIMEOUT_S)),
            Some(t) => u32::try_from(t)
                .ok()
                .filter(|t| (1..=MAX_AFFINITY_TIMEOUT_S).contains(t))
                .map(Some)
                .ok_or_else(|| {
                    err(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("{t} is out of range (1-{MAX_AFFINITY_TIMEOUT_S} seconds)"),
                    )
                }),
        },
        Some(other) => {
            Err(err("spec.sessionAffinity", format!("unknown session affinity {other:?} (None or ClientIP)")))
        }
    }
}

/// An EndpointSlice as the semantics read it: only `addresses[0]` of each endpoint (as kube-proxy), and no
/// port without a number.
pub fn endpoint_slice(slice: &discovery::EndpointSlice) -> Result<EndpointSlice, Invalid> {
    validated(validate::endpoint_slice(slice), convert_endpoint_slice(slice))
}

/// The pods an EndpointSlice's endpoints name (`targetRef` of kind Pod; its namespace, else the slice's) by
/// their `addresses[0]`: what `tierlb study --crash POD` finds a pod's endpoint by. The model does not keep
/// them (the agent never reads them).
pub fn pod_refs(slice: &discovery::EndpointSlice) -> Vec<(IpAddr, ObjKey)> {
    let ns = namespace_of(&slice.metadata);
    slice
        .endpoints
        .iter()
        .filter_map(|ep| {
            let r = ep.target_ref.as_ref().filter(|r| r.kind.as_deref() == Some("Pod"))?;
            let ip = ep.addresses.first()?.parse().ok()?;
            Some((ip, ObjKey::new(r.namespace.as_deref().unwrap_or(&ns), r.name.as_deref()?)))
        })
        .collect()
}

fn convert_endpoint_slice(slice: &discovery::EndpointSlice) -> Result<EndpointSlice, FieldError> {
    let key = key_of(&slice.metadata)?;
    let address_type = match slice.address_type.as_str() {
        "IPv4" => AddressType::IPv4,
        "IPv6" => AddressType::IPv6,
        "FQDN" => AddressType::Fqdn,
        other => {
            return Err(err("addressType", format!("unknown address type {other:?} (IPv4, IPv6 or FQDN)")));
        }
    };
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        // A port without a number means "all ports"; kube-proxy skips it (no ClusterIP can use it).
        let Some(number) = p.port else { continue };
        ports.push(SlicePort {
            name: p.name.clone().unwrap_or_default(),
            port: port(Lazy(|| format!("ports[{i}].port")), number)?,
            protocol: protocol(Lazy(|| format!("ports[{i}].protocol")), p.protocol.as_deref())?,
        });
    }
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let address = match (address_type, ep.addresses.first()) {
            (AddressType::Fqdn, _) | (_, None) => None,
            (_, Some(raw)) => {
                let a = ip(Lazy(|| format!("endpoints[{i}].addresses[0]")), raw)?;
                let family_ok = matches!((address_type, a), (AddressType::IPv4, IpAddr::V4(_)))
                    || matches!((address_type, a), (AddressType::IPv6, IpAddr::V6(_)));
                if !family_ok {
                    return Err(err(
                        format!("endpoints[{i}].addresses[0]"),
                        format!("{raw} does not match addressType {}", slice.address_type),
                    ));
                }
                Some(a)
            }
        };
        let c = ep.conditions.clone().unwrap_or_default();
        let hints = ep.hints.as_ref();
        endpoints.push(Endpoint {
            address,
            conditions: Conditions { ready: c.ready, serving: c.serving, terminating: c.terminating },
            node_name: ep.node_name.as_deref().map(intern),
            zone: ep.zone.as_deref().map(intern),
            hints: Hints::new(
                hints
                    .and_then(|h| h.for_nodes.as_ref())
                    .map(|v| intern_list(v.iter().map(|n| intern(&n.name)).collect())),
                hints
                    .and_then(|h| h.for_zones.as_ref())
                    .map(|v| intern_list(v.iter().map(|z| intern(&z.name)).collect())),
            ),
        });
    }
    let service_name = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .map(|n| Name::from(n.as_str()));
    let trigger =
        slice.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME));
    // Exactly as many as there are: a slice's endpoints are most of the agent's memory.
    let (endpoints, ports) = (exact(endpoints), exact(ports));
    Ok(EndpointSlice {
        key,
        service_name,
        address_type,
        ports: ports.into_boxed_slice(),
        endpoints: endpoints.into_boxed_slice(),
        not_proxied: ProxyLabel::of(slice.metadata.labels.as_ref()),
        last_change_trigger_time: trigger.and_then(|t| trigger_time(t)),
    })
}

/// The annotation's time (RFC 3339, as the EndpointSlice controller writes it), parsed as the API server
/// parses a `metav1.Time`. A value that does not parse is ignored, as kube-proxy's `getLastChangeTriggerTime`
/// does (it only feeds a latency metric; the slice itself is fine).
fn trigger_time(value: &str) -> Option<std::time::SystemTime> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let t: Time = serde_json::from_value(serde_json::Value::String(value.to_owned())).ok()?;
    let nanos = u64::try_from(t.0.as_nanosecond()).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(nanos))
}

/// A Node: its name, zone label and allocatable CPU.
pub fn node(node: &core::Node) -> Result<Node, Invalid> {
    validated(validate::node(node), convert_node(node))
}

fn convert_node(node: &core::Node) -> Result<Node, FieldError> {
    let name = node
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err("metadata.name", "missing"))?;
    let zone = node.metadata.labels.as_ref().and_then(|l| l.get(LABEL_ZONE)).cloned();
    let cpu = node.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get("cpu"));
    let allocatable_cpu_millis = match cpu {
        None => None,
        Some(q) => Some(validate::quantity::cpu_millis(&q.0).map_err(|m| err("status.allocatable.cpu", m))?),
    };
    // Addresses that do not parse are skipped, as kube-proxy's `GetNodeHostIPs` (pkg/util/node) skips what
    // `ParseIPSloppy` refuses: the API server does not validate them as IPs.
    let addresses = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter_map(|a| {
            let kind = match a.type_.as_str() {
                "InternalIP" => NodeAddressKind::InternalIP,
                "ExternalIP" => NodeAddressKind::ExternalIP,
                _ => return None,
            };
            Some(NodeAddress { kind, ip: a.address.parse().ok()? })
        })
        .collect();
    let labels = node.metadata.labels.as_ref();
    let role = ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"]
        .iter()
        .any(|k| labels.is_some_and(|l| l.contains_key(*k)));
    let ready = node.status.iter().flat_map(|s| s.conditions.iter().flatten()).find(|c| c.type_ == "Ready");
    let cpu_share_excluded = role || ready.is_some_and(|c| c.status != "True");
    let autoscaler_taint = node
        .spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .any(|t| t.key == "ToBeDeletedByClusterAutoscaler");
    let not_eligible = if node.metadata.deletion_timestamp.is_some() {
        Some("the Node is being deleted")
    } else if autoscaler_taint {
        Some("the Node is tainted ToBeDeletedByClusterAutoscaler")
    } else {
        None
    };
    Ok(Node { name, zone, allocatable_cpu_millis, cpu_share_excluded, addresses, not_eligible })
}
