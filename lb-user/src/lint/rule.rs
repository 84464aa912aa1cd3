//! The lints' rules: a stable name for each (what `tierlb lint` prints and CI greps) and the fix.
use std::{borrow::Borrow, fmt, ops::Deref};

use serde::{Serialize, Serializer};

/// What a warning is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// `internalTrafficPolicy: Local` beside a `trafficDistribution`.
    DeadLocalLine,
    /// The topology annotation overrides `trafficDistribution`.
    AnnotationOverridesField,
    /// A `trafficDistribution` value the controller does not know.
    UnknownDistribution,
    /// `PreferClose`, the deprecated alias.
    DeprecatedPreferClose,
    /// `trafficDistribution` set, no endpoint carries hints (old control plane, feature gate off, downgrade).
    NoHints,
    /// Some ready endpoints carry no `forZones` hint while others do: zone filtering off for the whole Service.
    HintsMissing,
    /// Ready endpoints without a `forNodes` hint where PreferSameNode asks for them, or beside endpoints that
    /// have one: node filtering off for the whole Service.
    NodeHintsMissing,
    /// PreferSameZone or PreferClose where every node is in one zone (or none has a zone): it does nothing.
    OneZone,
    /// PreferSameNode with fewer ready endpoints than nodes.
    PreferSameNodeSkew,
    /// A Local policy on nodes without a local endpoint: connects there fail (kube-proxy drops).
    NoLocalEndpoint,
    /// Several Services claim one VIP:port; one is programmed.
    VipConflict,
    /// A field of the Service or its slices that Kubernetes does not know (a misspelling): ignored.
    UnknownField,
    /// The node asked about is in no Node object and no endpoint of the source (a misspelling).
    UnknownNode,
}

impl Rule {
    /// The name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Self::DeadLocalLine => "dead-local-line",
            Self::AnnotationOverridesField => "annotation-overrides-field",
            Self::UnknownDistribution => "unknown-distribution",
            Self::DeprecatedPreferClose => "deprecated-prefer-close",
            Self::NoHints => "no-hints",
            Self::HintsMissing => "hints-missing",
            Self::NodeHintsMissing => "node-hints-missing",
            Self::OneZone => "one-zone",
            Self::PreferSameNodeSkew => "prefer-same-node-skew",
            Self::NoLocalEndpoint => "no-local-endpoint",
            Self::VipConflict => "vip-conflict",
            Self::UnknownField => "unknown-field",
            Self::UnknownNode => "unknown-node",
        }
    }

    /// What to do about it.
    pub fn fix(self) -> &'static str {
        match self {
            Self::DeadLocalLine => {
                "remove internalTrafficPolicy: Local to get the trafficDistribution fallback, or remove \
                 trafficDistribution"
            }
            Self::AnnotationOverridesField => "remove the topology-mode (or topology-aware-hints) annotation",
            Self::UnknownDistribution => "write PreferSameZone or PreferSameNode, or remove the field",
            Self::DeprecatedPreferClose => "write PreferSameZone",
            Self::NoHints => {
                "upgrade the control plane or turn its feature gate on (kube-controller-manager writes the \
                 hints); watch hints.forNodes on the EndpointSlices, not the field"
            }
            Self::HintsMissing => {
                "find why the controller left those endpoints unhinted (a not-ready endpoint keeps old hints; a \
                 hand-made slice has none) and hint every ready endpoint"
            }
            Self::NodeHintsMissing => {
                "upgrade the control plane to 1.33 or later (PreferSameNode writes forNodes; a not-ready endpoint \
                 keeps old hints; a hand-made slice has none) and check hints.forNodes on every ready endpoint"
            }
            Self::OneZone => {
                "use PreferSameNode, or remove trafficDistribution: one zone has nothing to prefer"
            }
            Self::PreferSameNodeSkew => {
                "run an endpoint on every node that has clients (a DaemonSet), or use PreferSameZone"
            }
            Self::NoLocalEndpoint => {
                "run an endpoint on every node that has clients (a DaemonSet), or replace internalTrafficPolicy: \
                 Local by trafficDistribution: PreferSameNode, which falls back"
            }
            Self::VipConflict => "give each Service its own VIP:port",
            Self::UnknownField => {
                "spell the field as the API defines it (the API server refuses or drops an unknown field: \
                 `kubectl apply --dry-run=server` shows which)"
            }
            Self::UnknownNode => {
                "name a node of the source (`kubectl get nodes`), or give --zone for a node it does not have yet"
            }
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One warning: its rule and its text (which names the Service's own values). Reads as its text, and
/// serialises as it (`tierlb plan -o json`'s `warnings`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Warning {
    /// The rule.
    pub rule: Rule,
    /// What is wrong, in words.
    pub text: String,
}

impl Warning {
    /// A warning of `rule`.
    pub fn new(rule: Rule, text: impl Into<String>) -> Self {
        Self { rule, text: text.into() }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Deref for Warning {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl Borrow<str> for Warning {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl PartialEq<String> for Warning {
    fn eq(&self, other: &String) -> bool {
        self.text == *other
    }
}

impl Serialize for Warning {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}
