//! The Cilium models: one `Rule` per behaviour a Cilium release range has, and the selection they share
//! (the frontend's backends, then the socket LB's active-first choice). Where each rule was read, and which
//! ranges were not read at a tag, is in `catalog.rs`.
use super::{CiliumSettings, Empty, ProxyModel, Route, View, ips};
use crate::{hints, model::Policy, plan::PortEndpoint};

/// Which Services get zone hints applied.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ZoneFor {
    /// 1.11-1.15 `filterEndpoints`: `!svc.TopologyAware` returns all, and `TopologyAware` comes from the
    /// topology annotation only.
    Annotation,
    /// 1.16-1.17 after cilium#32678: every Service (`TopologyAware` only re-sends Services when the node's
    /// zone changes), so any Service whose backends all carry zone hints, PreferSameZone and PreferSameNode
    /// included (the controller writes zone hints for both).
    AnyService,
    /// 1.18-1.19 (`conversions.go` sets PreferClose only when `isTopologyAware`): the annotation or
    /// `trafficDistribution: PreferClose`.
    PreferClose,
    /// 1.20: also PreferSameZone (PreferSameNode takes its own, node-name path).
    PreferCloseOrSameZone,
}

/// Which backends the missing-hints and no-candidate safeguards look at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Safeguards {
    /// 1.18.0 (cilium#41022): none; each backend with zone hints that do not name the zone is skipped, one
    /// without hints is kept, and a zone with no fitting backend is left with none (connects refused).
    None,
    /// Every backend the agent keeps.
    EveryKept,
    /// 1.20 (#45947): every kept backend but the terminating ones; a starting (maintenance) backend without
    /// hints still trips them (cilium#47960).
    NotTerminating,
    /// 1.20 with #47961 (open): also skips a not-ready backend that has no hints.
    NotTerminatingNorHintlessStarting,
}

/// One Cilium behaviour.
#[derive(Clone, Copy)]
pub(super) struct Rule {
    /// Whether the agent keeps not-serving endpoints (starting or not-ready pods; since #40969/#42170, in
    /// 1.18 by the backport #42708). Before, the EndpointSlice parser drops them (`if !isServing { continue }`).
    keeps_not_serving: bool,
    zone_for: ZoneFor,
    safeguards: Safeguards,
    /// 1.20 (cilium#44771): PreferSameNode prefers the ready backends whose `nodeName` is this node.
    same_node_by_node_name: bool,
}

impl Rule {
    /// The rule of a Cilium model; `None` for the others.
    pub(super) fn of(model: ProxyModel) -> Option<Self> {
        let rule = |keeps_not_serving, zone_for, safeguards, same_node_by_node_name| {
            Some(Self { keeps_not_serving, zone_for, safeguards, same_node_by_node_name })
        };
        match model {
            ProxyModel::Cilium111 => rule(false, ZoneFor::Annotation, Safeguards::EveryKept, false),
            ProxyModel::Cilium116 => rule(false, ZoneFor::AnyService, Safeguards::EveryKept, false),
            ProxyModel::Cilium1180 => rule(false, ZoneFor::PreferClose, Safeguards::None, false),
            ProxyModel::Cilium1181 => rule(false, ZoneFor::PreferClose, Safeguards::EveryKept, false),
            ProxyModel::Cilium118x => rule(true, ZoneFor::PreferClose, Safeguards::EveryKept, false),
            ProxyModel::Cilium120 => {
                rule(true, ZoneFor::PreferCloseOrSameZone, Safeguards::NotTerminating, true)
            }
            ProxyModel::Cilium120Fix => rule(
                true,
                ZoneFor::PreferCloseOrSameZone,
                Safeguards::NotTerminatingNorHintlessStarting,
                true,
            ),
            _ => None,
        }
    }
}

/// How a Cilium release routes the node's clients.
pub(super) fn route(rule: Rule, v: &View<'_>, settings: CiliumSettings) -> Route {
    pick(&select(rule, v, settings))
}

/// Cilium's socket LB on the frontend's selected backends: the active (ready) ones, else the terminating
/// serving ones (a terminating backend serves new connections only when no active one is left); none:
/// `svc->count` is 0 and connect() fails with EHOSTUNREACH.
fn pick(selected: &[&PortEndpoint]) -> Route {
    let active: Vec<&PortEndpoint> = selected.iter().copied().filter(|e| e.endpoint.is_ready()).collect();
    let chosen = if active.is_empty() {
        selected.iter().copied().filter(|e| e.endpoint.is_terminating() && e.endpoint.is_serving()).collect()
    } else {
        active
    };
    Route::Set { ips: ips(&chosen), empty: Empty::Refused }
}

/// The backends a Cilium release selects for the node's frontend, before the active/terminating choice.
fn select<'a>(rule: Rule, v: &'a View<'_>, settings: CiliumSettings) -> Vec<&'a PortEndpoint> {
    let kept: Vec<&PortEndpoint> =
        v.eps.iter().filter(|e| rule.keeps_not_serving || e.endpoint.is_serving()).collect();
    if v.svc.internal_policy == Policy::Local {
        // The frontend holds the node's own backends only; topology is never applied on top (1.17
        // `filterEndpoints`, 1.18+ `isTopologyAware` is not set for ITP Local, and 1.20's same-node choice
        // picks the same local backends).
        return kept.into_iter().filter(|e| e.local).collect();
    }
    if !settings.service_topology {
        return kept;
    }
    let annotated = {
        let a =
            v.svc.topology_aware_hints_annotation.as_deref().or(v.svc.topology_mode_annotation.as_deref());
        a.is_some_and(|a| !matches!(a, "" | "disabled" | "Disabled"))
    };
    let td = v.td();
    if rule.same_node_by_node_name && !annotated && td == Some(hints::PREFER_SAME_NODE) {
        // `nodeName`, not `forNodes`; with no ready local backend, cluster-wide (no zone step).
        let local: Vec<&PortEndpoint> =
            kept.iter().copied().filter(|e| e.local && e.endpoint.is_ready()).collect();
        return if local.is_empty() { kept } else { local };
    }
    let zone_mode = match rule.zone_for {
        ZoneFor::Annotation => annotated,
        ZoneFor::AnyService => true,
        ZoneFor::PreferClose => annotated || td == Some(hints::PREFER_CLOSE),
        ZoneFor::PreferCloseOrSameZone => {
            annotated || td == Some(hints::PREFER_CLOSE) || td == Some(hints::PREFER_SAME_ZONE)
        }
    };
    if !zone_mode || v.zone().is_none() {
        return kept;
    }
    let judged: Vec<&PortEndpoint> = match rule.safeguards {
        Safeguards::None => {
            // 1.18.0: skip a backend whose hints do not name the zone, keep one without hints.
            return kept
                .into_iter()
                .filter(|e| e.endpoint.zone_hints().is_empty() || v.has_zone_hint(e))
                .collect();
        }
        Safeguards::EveryKept => kept.clone(),
        Safeguards::NotTerminating => kept.iter().copied().filter(|e| !e.endpoint.is_terminating()).collect(),
        Safeguards::NotTerminatingNorHintlessStarting => kept
            .iter()
            .copied()
            .filter(|e| !e.endpoint.is_terminating())
            .filter(|e| e.endpoint.is_ready() || !e.endpoint.zone_hints().is_empty())
            .collect(),
    };
    let missing = judged.iter().any(|e| e.endpoint.zone_hints().is_empty());
    let found = judged.iter().any(|e| v.has_zone_hint(e));
    if missing || !found {
        return kept;
    }
    kept.into_iter().filter(|e| v.has_zone_hint(e)).collect()
}
