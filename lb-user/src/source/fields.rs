//! What the conversion and the validation of objects share: the labels and annotations they read, and the
//! error naming a field.
use crate::model::Policy;

/// EndpointSlice label naming the Service it belongs to (same namespace).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Node label with the node's zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Service annotation asking for topology-aware routing (`Auto`).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// The annotation kube-proxy reads for source ranges when `spec.loadBalancerSourceRanges` is empty
/// (`v1.AnnotationLoadBalancerSourceRangesKey`).
pub(super) const ANNOTATION_LB_SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
/// The deprecated form of `ANNOTATION_TOPOLOGY_MODE`, which wins over it.
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// EndpointSlice annotation: when the change it carries was triggered (`v1.EndpointsLastChangeTriggerTime`).
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// Every annotation `convert` reads (the kube source drops the others from objects it receives).
pub const ANNOTATIONS_READ: [&str; 4] = [
    ANNOTATION_TOPOLOGY_MODE,
    ANNOTATION_TOPOLOGY_AWARE_HINTS,
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
    ANNOTATION_LB_SOURCE_RANGES,
];

/// A field that does not hold what tierlb needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field {field}: {message}")]
pub struct FieldError {
    /// The field, as a path inside the object (`spec.ports[0].port`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// Every problem of an object that is not taken (the API server reports them all at once, too).
pub type Invalid = Vec<FieldError>;

pub(super) fn err(field: impl Path, message: impl Into<String>) -> FieldError {
    FieldError { field: field.path(), message: message.into() }
}

/// A field's path as a problem names it, built only when a problem is reported: conversion and validation
/// visit every endpoint of every slice (a million at 100,000 Services), and formatting the paths of fields
/// that were fine took about a tenth of the CPU of converting the EndpointSlice list.
pub(super) trait Path {
    fn path(self) -> String;
}

impl Path for &str {
    fn path(self) -> String {
        self.to_owned()
    }
}

impl Path for String {
    fn path(self) -> String {
        self
    }
}

/// A path formatted on demand: `Lazy(|| format!("endpoints[{i}].zone"))`.
#[derive(Clone, Copy)]
pub(super) struct Lazy<F>(pub(super) F);

impl<F: FnOnce() -> String> Path for Lazy<F> {
    fn path(self) -> String {
        (self.0)()
    }
}

/// A traffic policy field: unset is Cluster (`validateServiceInternalTrafficFieldsValue`,
/// `validateServiceExternalTrafficPolicy` refuse anything but the two names).
pub(super) fn policy(field: &str, value: Option<&str>) -> Result<Policy, FieldError> {
    match value {
        None | Some("Cluster") => Ok(Policy::Cluster),
        Some("Local") => Ok(Policy::Local),
        Some(other) => Err(err(field, format!("unknown traffic policy {other:?}: use Cluster or Local"))),
    }
}
