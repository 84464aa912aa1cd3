//! Identities: what tierlb names objects and Service ports by, each with one `Display` (and `FromStr` where
//! text comes back from a map), never formatted and parsed back as a key.
use std::fmt;

use serde::Serialize;

/// `namespace/name` of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjKey {
    /// The namespace (`default` when a manifest leaves it out; empty for a cluster-scoped object), interned:
    /// a cluster has few.
    pub namespace: super::Name,
    /// The object's name. Shared: the many maps keyed by a Service (model, plans, claims, topology, the
    /// reconciler) hold one allocation of it, not a copy each.
    pub name: super::Name,
}

// Two thin names: the key of a dozen maps per Service (model, plans, claims, topology, the reconciler), so
// a regression that makes it wider costs that many times over.
const _: () = assert!(size_of::<ObjKey>() == 16);

impl ObjKey {
    /// `namespace/name`.
    pub fn new(namespace: impl AsRef<str>, name: impl Into<super::Name>) -> Self {
        Self { namespace: super::intern(namespace.as_ref()), name: name.into() }
    }
}

impl fmt::Display for ObjKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl std::str::FromStr for ObjKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self::new(ns, name))
            }
            _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
        }
    }
}

/// One port of a Service: kube-proxy's `ServicePortName`. The unit the data path programs, counts and names:
/// `namespace/name:port`, or `namespace/name` for an unnamed port (a single-port Service).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    /// The Service.
    pub service: ObjKey,
    /// The port's name; empty for the unnamed port of a single-port Service.
    pub port: String,
}

impl ServicePortName {
    /// The port `port` of Service `service`.
    pub fn new(service: ObjKey, port: impl Into<String>) -> Self {
        Self { service, port: port.into() }
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

/// Serialised as `{"service": "namespace/name", "port_name": "port"}` (flattened into the JSON of `plan` and
/// `status`).
impl Serialize for ServicePortName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("ServicePortName", 2)?;
        st.serialize_field("service", &self.service.to_string())?;
        st.serialize_field("port_name", &self.port)?;
        st.end()
    }
}

/// A text that is not `namespace/name[:port]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not NAMESPACE/NAME[:PORT]")]
pub struct ParseNameError {
    /// What was read.
    pub text: String,
}

impl std::str::FromStr for ServicePortName {
    type Err = ParseNameError;
    /// Reads the label the agent stores per service id (for `status` and a restarted agent's adoption).
    fn from_str(s: &str) -> Result<Self, ParseNameError> {
        let (service, port) = match s.rsplit_once(':') {
            Some((svc, port)) if svc.contains('/') => (svc, port),
            _ => (s, ""),
        };
        let service = service.parse().map_err(|_| ParseNameError { text: s.to_owned() })?;
        Ok(Self::new(service, port))
    }
}

/// The kinds of object tierlb reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    /// `v1` Service.
    Service,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `v1` Node (cluster-scoped: its key's namespace is empty).
    Node,
}

impl Kind {
    /// The Kubernetes kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
        }
    }
}

/// One object's identity: its kind and key. `Service default/web`, `Node node-1`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectId {
    /// What kind of object.
    pub kind: Kind,
    /// Namespace (empty for a Node) and name.
    pub key: ObjKey,
}

impl ObjectId {
    /// A namespaced object.
    pub fn new(kind: Kind, key: ObjKey) -> Self {
        Self { kind, key }
    }
    /// A Node (cluster-scoped).
    pub fn node(name: impl Into<super::Name>) -> Self {
        Self { kind: Kind::Node, key: ObjKey::new("", name) }
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.namespace.is_empty() {
            write!(f, "{} {}", self.kind.as_str(), self.key.name)
        } else {
            write!(f, "{} {}", self.kind.as_str(), self.key)
        }
    }
}

impl Default for ObjKey {
    fn default() -> Self {
        Self::new("default", "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_port_names_print_and_parse_back() {
        for (text, service, port) in
            [("default/web:http", "web", "http"), ("default/web", "web", ""), ("default/web:", "web", "")]
        {
            let n: ServicePortName = text.parse().unwrap();
            assert_eq!(n, ServicePortName::new(ObjKey::new("default", service), port), "{text}");
        }
        let n = ServicePortName::new(ObjKey::new("kube-system", "dns"), "dns-tcp");
        assert_eq!(n.to_string().parse::<ServicePortName>().unwrap(), n);
        assert!("no-slash:http".parse::<ServicePortName>().is_err());
        assert_eq!(ObjectId::node("node-1").to_string(), "Node node-1");
        assert_eq!(ObjectId::new(Kind::Service, ObjKey::new("a", "b")).to_string(), "Service a/b");
    }
}
