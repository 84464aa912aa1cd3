//! What tierlb does not program, and why: Services whose labels make kube-proxy skip them (`ProxyLabel`) and
//! Service ports of a protocol tierlb does not translate (SCTP, `Protocol::translated`). Decided here once;
//! `plan` (table and JSON) and `explain` render the list.
use serde::Serialize;

use crate::model::{Model, ObjKey, Protocol, ProxyLabel, Service, ServiceType};

/// Why something is not programmed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SkipReason {
    /// The Service carries a label that makes kube-proxy skip it (JSON: `label` and `value` too).
    Label(ProxyLabel),
    /// The port's protocol is SCTP.
    Sctp,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Label(l) => write!(f, "{l}"),
            Self::Sctp => write!(
                f,
                "protocol SCTP is not translated by tierlb (its socket hooks are tested with TCP and UDP only): \
                 connects to this port need kube-proxy or another data plane"
            ),
        }
    }
}

/// The port a skip is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedPort {
    /// The port's name (empty for a single-port Service's unnamed port).
    pub port_name: String,
    /// Its number.
    pub port: u16,
    /// Its protocol.
    pub protocol: Protocol,
}

/// A Service (`port: None`) or one of its ports that is not programmed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The Service, `namespace/name`.
    #[serde(serialize_with = "as_text")]
    pub service: ObjKey,
    /// The port, when only it is skipped.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub port: Option<SkippedPort>,
    /// Why (JSON: `reason`, and the label with its value for a label).
    #[serde(flatten)]
    pub reason: SkipReason,
    /// The reason in words.
    pub message: String,
}

fn as_text<S: serde::Serializer>(key: &ObjKey, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(key)
}

impl Skipped {
    fn new(service: &ObjKey, port: Option<SkippedPort>, reason: SkipReason) -> Self {
        Self { service: service.clone(), port, message: reason.to_string(), reason }
    }
}

/// A Service with a VIP: the only kind whose ports would be programmed (a headless or ExternalName Service
/// has nothing to skip).
fn has_vip(svc: &Service) -> bool {
    svc.type_ != ServiceType::ExternalName && !svc.cluster_ips.is_empty()
}

/// Everything of `model` that is not programmed, in key order: labelled Services whole, then the
/// untranslated ports of the others.
pub fn skipped(model: &Model) -> Vec<Skipped> {
    let labelled = model.skipped.values().filter_map(|svc| {
        let label = svc.not_proxied.clone()?;
        Some(Skipped::new(&svc.key, None, SkipReason::Label(label)))
    });
    let ports = model.services.values().filter(|s| has_vip(s)).flat_map(|svc| {
        svc.ports.iter().filter(|p| !p.protocol.translated()).map(|p| {
            let port = SkippedPort { port_name: p.name.clone(), port: p.port, protocol: p.protocol };
            Skipped::new(&svc.key, Some(port), SkipReason::Sctp)
        })
    });
    labelled.chain(ports).collect()
}

/// How `plan`'s table and `explain` write one entry: `default/x: reason` or `default/x port sig 3868/SCTP:
/// reason`.
impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.service)?;
        if let Some(p) = &self.port {
            let name = if p.port_name.is_empty() { String::new() } else { format!(" {}", p.port_name) };
            write!(f, " port{name} {}/{}", p.port, p.protocol.as_str())?;
        }
        write!(f, ": {}", self.message)
    }
}
