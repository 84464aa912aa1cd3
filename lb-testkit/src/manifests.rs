//! Service, EndpointSlice and Node manifests for simulated clusters, written atomically (temp file + rename)
//! so an agent watching the directory never reads half a file.
use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

/// One endpoint of a simulated Service.
// must_use: its builder methods take and return it, so a dropped one is a change lost.
#[derive(Clone, Debug)]
#[must_use]
pub struct Ep {
    /// The pod IP; its family picks the slice.
    pub ip: IpAddr,
    /// `nodeName`.
    pub node: String,
    /// `zone` (none: left out).
    pub zone: Option<String>,
    /// `conditions.ready`.
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// `hints.forNodes` (none: left out).
    pub for_nodes: Option<Vec<String>>,
    /// `hints.forZones` (none: left out).
    pub for_zones: Option<Vec<String>>,
}

impl Ep {
    /// A ready endpoint without hints.
    pub fn ready(ip: IpAddr, node: &str) -> Self {
        Self {
            ip,
            node: node.to_owned(),
            zone: None,
            ready: true,
            serving: true,
            terminating: false,
            for_nodes: None,
            for_zones: None,
        }
    }
    /// In `zone`.
    pub fn zone(mut self, zone: &str) -> Self {
        self.zone = Some(zone.to_owned());
        self
    }
    /// The hints the EndpointSlice controller writes for PreferSameNode (node, and zone when known).
    pub fn prefer_same_node(mut self) -> Self {
        self.for_nodes = Some(vec![self.node.clone()]);
        self.for_zones = self.zone.clone().map(|z| vec![z]);
        self
    }
    /// Hints as given, for cases the controller would not write (none: that hint left out).
    pub fn hints(mut self, nodes: Option<&[&str]>, zones: Option<&[&str]>) -> Self {
        self.for_nodes = nodes.map(|v| v.iter().map(|s| (*s).to_owned()).collect());
        self.for_zones = zones.map(|v| v.iter().map(|s| (*s).to_owned()).collect());
        self
    }
    /// Pod deletion started: not ready, still serving, terminating.
    pub fn terminating(mut self) -> Self {
        self.ready = false;
        self.serving = true;
        self.terminating = true;
        self
    }
    /// A pod failing its readiness probe: neither ready nor serving, not terminating.
    pub fn not_ready(mut self) -> Self {
        self.ready = false;
        self.serving = false;
        self
    }
}

/// A simulated single-port Service.
#[derive(Clone, Debug)]
pub struct Svc {
    /// `metadata.namespace` ("default" from `new`).
    pub namespace: String,
    /// `metadata.name`, also the slices' `kubernetes.io/service-name`.
    pub name: String,
    /// `clusterIPs`; the first is also `clusterIP`.
    pub cluster_ips: Vec<IpAddr>,
    /// The port's `port`.
    pub port: u16,
    /// The port's `targetPort`, and the slices' port.
    pub target_port: u16,
    /// The port's `protocol` ("TCP" from `new`).
    pub protocol: &'static str,
    /// `internalTrafficPolicy` (none: left out).
    pub internal_traffic_policy: Option<&'static str>,
    /// `trafficDistribution` (none: left out).
    pub traffic_distribution: Option<String>,
    /// Makes it a LoadBalancer Service with externalTrafficPolicy Local and this healthCheckNodePort.
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` with this `timeoutSeconds` (none: left out).
    pub session_affinity_timeout: Option<u32>,
}

impl Svc {
    /// A TCP ClusterIP Service in "default" with one port.
    pub fn new(name: &str, cluster_ip: IpAddr, port: u16, target_port: u16) -> Self {
        Self {
            namespace: "default".into(),
            name: name.into(),
            cluster_ips: vec![cluster_ip],
            port,
            target_port,
            protocol: "TCP",
            internal_traffic_policy: None,
            traffic_distribution: None,
            health_check_node_port: None,
            session_affinity_timeout: None,
        }
    }

    /// The Service object.
    pub fn service(&self) -> Value {
        let mut spec = json!({
            "clusterIP": self.cluster_ips[0].to_string(),
            "clusterIPs": self.cluster_ips.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "ports": [{"name": "main", "port": self.port, "targetPort": self.target_port, "protocol": self.protocol}],
        });
        if let Some(itp) = self.internal_traffic_policy {
            spec["internalTrafficPolicy"] = json!(itp);
        }
        if let Some(td) = &self.traffic_distribution {
            spec["trafficDistribution"] = json!(td);
        }
        if let Some(t) = self.session_affinity_timeout {
            spec["sessionAffinity"] = json!("ClientIP");
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": t}});
        }
        if let Some(hc) = self.health_check_node_port {
            spec["type"] = json!("LoadBalancer");
            spec["externalTrafficPolicy"] = json!("Local");
            spec["healthCheckNodePort"] = json!(hc);
            spec["ports"][0]["nodePort"] = json!(30000 + (hc % 2000));
        }
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec})
    }

    /// One EndpointSlice per family holding `eps`.
    pub fn slices(&self, eps: &[Ep]) -> Vec<Value> {
        let mut out = Vec::new();
        for (family, is_v4) in [("IPv4", true), ("IPv6", false)] {
            let of_family: Vec<&Ep> = eps.iter().filter(|e| e.ip.is_ipv4() == is_v4).collect();
            if of_family.is_empty() {
                continue;
            }
            let endpoints: Vec<Value> = of_family
                .iter()
                .map(|e| {
                    let mut v = json!({
                        "addresses": [e.ip.to_string()],
                        "nodeName": e.node,
                        "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
                    });
                    if let Some(z) = &e.zone {
                        v["zone"] = json!(z);
                    }
                    let mut hints = serde_json::Map::new();
                    if let Some(n) = &e.for_nodes {
                        hints.insert(
                            "forNodes".into(),
                            json!(n.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()),
                        );
                    }
                    if let Some(z) = &e.for_zones {
                        hints.insert(
                            "forZones".into(),
                            json!(z.iter().map(|z| json!({"name": z})).collect::<Vec<_>>()),
                        );
                    }
                    if !hints.is_empty() {
                        v["hints"] = Value::Object(hints);
                    }
                    v
                })
                .collect();
            out.push(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{}-{}", self.name, family.to_lowercase()), "namespace": self.namespace,
                             "labels": {"kubernetes.io/service-name": self.name}},
                "addressType": family,
                "ports": [{"name": "main", "port": self.target_port, "protocol": self.protocol}],
                "endpoints": endpoints,
            }));
        }
        out
    }
}

/// A Node object, with the `topology.kubernetes.io/zone` label when `zone` is given.
pub fn node(name: &str, zone: Option<&str>) -> Value {
    let mut v = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
    if let Some(z) = zone {
        v["metadata"]["labels"] = json!({"topology.kubernetes.io/zone": z});
    }
    v
}

/// YAML documents separated by `---`.
pub fn to_yaml(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_saphyr::to_string(d).expect("JSON values serialise"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Replace `dir/name` atomically (a hidden temp file, which manifest readers skip, then rename).
pub fn write_atomic(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Write a Service and its slices as `dir/<name>.yaml`.
pub fn write_service(dir: &Path, svc: &Svc, eps: &[Ep]) -> std::io::Result<PathBuf> {
    let mut docs = vec![svc.service()];
    docs.extend(svc.slices(eps));
    write_atomic(dir, &format!("{}.yaml", svc.name), &to_yaml(&docs))
}
