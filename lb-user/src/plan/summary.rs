//! A port plan's topology decision in a few closed words: what the Service asks for, what this node applies to
//! internal traffic, and why (the labels of `tierlb_service_topology`, and `explain`'s summary line). Read off
//! the decision `decide_topology` made, never decided again.
use serde::Serialize;

use super::{HintReason, PortPlan, SelectedTier, WhenEmpty};
use crate::{
    hints::{self, HintMode},
    model::{Policy, Service},
};

/// What a Service asks for: its `trafficDistribution` as written, `Auto` for the topology annotation (which
/// wins over the field), `Local` for `internalTrafficPolicy: Local` (which wins over both), else `none` (also
/// for a value the controller does not know: it removes every hint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Requested {
    /// `trafficDistribution: PreferSameNode`.
    PreferSameNode,
    /// `trafficDistribution: PreferSameZone`.
    PreferSameZone,
    /// `trafficDistribution: PreferClose` (PreferSameZone's deprecated alias).
    PreferClose,
    /// `service.kubernetes.io/topology-mode: Auto` (or the deprecated `topology-aware-hints`).
    Auto,
    /// `internalTrafficPolicy: Local`.
    Local,
    /// Nothing the controller acts on.
    #[serde(rename = "none")]
    None,
}

impl Requested {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreferSameNode => "PreferSameNode",
            Self::PreferSameZone => "PreferSameZone",
            Self::PreferClose => "PreferClose",
            Self::Auto => "Auto",
            Self::Local => "Local",
            Self::None => "none",
        }
    }
}

/// Why this node applies what it does, a closed set: the reason of the hint kind that decided (node hints when
/// they are used or asked for, else zone hints), or the Local policy's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TopologyReason {
    /// Node hints used: every ready endpoint has one and one names this node.
    NodeHintNamesThisNode,
    /// Zone hints used: every ready endpoint has one and one names this node's zone.
    ZoneHintNamesThisZone,
    /// No endpoint is ready.
    NoReadyEndpoint,
    /// No ready endpoint carries a node hint.
    NoNodeHints,
    /// No ready endpoint carries a zone hint.
    NoZoneHints,
    /// Some ready endpoint carries no node hint: node hints are off for the whole Service.
    EndpointWithoutNodeHint,
    /// Some ready endpoint carries no zone hint: zone hints are off for the whole Service.
    EndpointWithoutZoneHint,
    /// Every ready endpoint has a node hint, none names this node (no local endpoint).
    NoNodeHintNamesThisNode,
    /// Every ready endpoint has a zone hint, none names this node's zone.
    NoZoneHintNamesThisZone,
    /// This node has no zone.
    NodeHasNoZone,
    /// A Local policy: the local set, hints ignored.
    LocalPolicy,
    /// A Local policy beside a `trafficDistribution` (or the annotation), which it makes a dead line.
    LocalPolicyOverridesDistribution,
    /// A Local policy with endpoints elsewhere but none here: kube-proxy drops.
    NoLocalEndpoint,
    /// The Service asks for hints and its slices carry none (a controller that does not know its
    /// `trafficDistribution`, or one not running): the agent uses the hints the EndpointSlice controller would
    /// write, where kube-proxy uses every endpoint.
    HintsEmulated,
}

impl TopologyReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeHintNamesThisNode => "node_hint_names_this_node",
            Self::ZoneHintNamesThisZone => "zone_hint_names_this_zone",
            Self::NoReadyEndpoint => "no_ready_endpoint",
            Self::NoNodeHints => "no_node_hints",
            Self::NoZoneHints => "no_zone_hints",
            Self::EndpointWithoutNodeHint => "endpoint_without_node_hint",
            Self::EndpointWithoutZoneHint => "endpoint_without_zone_hint",
            Self::NoNodeHintNamesThisNode => "no_node_hint_names_this_node",
            Self::NoZoneHintNamesThisZone => "no_zone_hint_names_this_zone",
            Self::NodeHasNoZone => "node_has_no_zone",
            Self::LocalPolicy => "local_policy",
            Self::LocalPolicyOverridesDistribution => "local_policy_overrides_distribution",
            Self::NoLocalEndpoint => "no_local_endpoint",
            Self::HintsEmulated => "hints_emulated",
        }
    }

    fn of_hint(r: &HintReason, node_kind: bool) -> Self {
        match (r, node_kind) {
            (HintReason::NoReadyEndpoint, _) => Self::NoReadyEndpoint,
            (HintReason::NoEndpointHinted, true) => Self::NoNodeHints,
            (HintReason::NoEndpointHinted, false) => Self::NoZoneHints,
            (HintReason::EndpointWithoutHint { .. }, true) => Self::EndpointWithoutNodeHint,
            (HintReason::EndpointWithoutHint { .. }, false) => Self::EndpointWithoutZoneHint,
            (HintReason::NoneNamesThis { .. }, true) => Self::NoNodeHintNamesThisNode,
            (HintReason::NoneNamesThis { .. }, false) => Self::NoZoneHintNamesThisZone,
            (HintReason::NodeHasNoZone, _) => Self::NodeHasNoZone,
            (HintReason::Named { .. }, true) => Self::NodeHintNamesThisNode,
            (HintReason::Named { .. }, false) => Self::ZoneHintNamesThisZone,
        }
    }
}

/// One port plan's topology in closed words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TopologySummary {
    /// What the Service asks for.
    pub requested: Requested,
    /// What this node uses for internal (ClusterIP) traffic.
    pub applied: SelectedTier,
    /// Why.
    pub reason: TopologyReason,
}

/// What `svc` asks for (`Requested`).
pub fn requested(svc: &Service) -> Requested {
    if svc.internal_policy == Policy::Local {
        return Requested::Local;
    }
    match hints::mode(svc) {
        HintMode::AutoAnnotation => Requested::Auto,
        HintMode::PreferSameNode => Requested::PreferSameNode,
        HintMode::PreferSameZone { deprecated_alias: true } => Requested::PreferClose,
        HintMode::PreferSameZone { deprecated_alias: false } => Requested::PreferSameZone,
        HintMode::None { .. } => Requested::None,
    }
}

impl TopologySummary {
    /// The summary of a plan made on hints no controller wrote (the controller's, emulated) when `emulated`:
    /// what the node applies rests on them, so the reason is `HintsEmulated`, unless a Local policy (which
    /// ignores hints) decided.
    #[must_use]
    pub fn emulated(self, emulated: bool) -> Self {
        let local = matches!(
            self.reason,
            TopologyReason::LocalPolicy
                | TopologyReason::LocalPolicyOverridesDistribution
                | TopologyReason::NoLocalEndpoint
        );
        if emulated && !local { Self { reason: TopologyReason::HintsEmulated, ..self } } else { self }
    }
}

/// The summary of `p`, one of `svc`'s port plans.
pub fn summarize(svc: &Service, p: &PortPlan) -> TopologySummary {
    let requested = requested(svc);
    let t = &p.topology;
    let reason = if p.internal.policy == Policy::Local {
        let asks = svc.traffic_distribution.is_some() || hints::annotation_enables_hints(svc);
        if p.internal.when_empty == Some(WhenEmpty::Drop) {
            TopologyReason::NoLocalEndpoint
        } else if asks {
            TopologyReason::LocalPolicyOverridesDistribution
        } else if p.internal.when_empty.is_some() {
            TopologyReason::NoReadyEndpoint
        } else {
            TopologyReason::LocalPolicy
        }
    } else if t.node.used() || requested == Requested::PreferSameNode {
        TopologyReason::of_hint(&t.node, true)
    } else {
        TopologyReason::of_hint(&t.zone, false)
    };
    TopologySummary { requested, applied: p.internal.selected_tier, reason }
}
