//! kube-proxy's label filters: a Service or EndpointSlice labelled `service.kubernetes.io/service-proxy-name`
//! (any value: it names the proxy meant to program it) or `service.kubernetes.io/headless` (the EndpointSlice
//! controller's mark on a headless Service's slices) is never seen by kube-proxy. cmd/kube-proxy/app/server.go
//! builds the selector from two `DoesNotExist` requirements (`noProxyName`, `noHeadlessEndpoints`) and applies
//! it with `WithTweakListOptions` to the informer factory both its Service and its EndpointSlice informers
//! come from (the Node informer comes from another factory, unfiltered). The rule is written here once: the
//! `--kube` source sends `label_selector()` on its Service and EndpointSlice lists and watches, the manifests
//! source and the model apply `ProxyLabel::of` to the same objects.
use std::{collections::BTreeMap, fmt};

use serde::Serialize;

/// Label naming the proxy that programs a Service (kube-proxy programs only Services without it).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label the EndpointSlice controller puts on the slices of a headless Service.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";

/// The label that makes kube-proxy skip an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "label", rename_all = "snake_case")]
pub enum ProxyLabel {
    /// `service.kubernetes.io/service-proxy-name=VALUE`: meant for another proxy.
    ServiceProxyName {
        /// The proxy it names (`kube-router`, ...; may be empty: the label's presence is what counts).
        value: String,
    },
    /// `service.kubernetes.io/headless`.
    Headless {
        /// Its value (the controller writes an empty one).
        value: String,
    },
}

impl ProxyLabel {
    /// The label of `labels` that keeps kube-proxy away, if any (`service-proxy-name` first: it says more).
    pub fn of(labels: Option<&BTreeMap<String, String>>) -> Option<Self> {
        let labels = labels?;
        if let Some(v) = labels.get(LABEL_SERVICE_PROXY_NAME) {
            return Some(Self::ServiceProxyName { value: v.clone() });
        }
        labels.get(LABEL_HEADLESS).map(|v| Self::Headless { value: v.clone() })
    }

    /// kube-proxy's label selector, as its informers send it (`labels.Selector.String()` sorts the
    /// requirements by key): objects carrying neither label.
    pub fn label_selector() -> String {
        let mut keys = [LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS];
        keys.sort_unstable();
        keys.map(|k| format!("!{k}")).join(",")
    }
}

/// Why the object is not programmed, for `plan`, `explain` and logs.
impl fmt::Display for ProxyLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ServiceProxyName { value } => write!(
                f,
                "labelled {LABEL_SERVICE_PROXY_NAME}={value}: meant for another proxy, as kube-proxy skips it"
            ),
            Self::Headless { .. } => write!(
                f,
                "labelled {LABEL_HEADLESS}: the EndpointSlice controller's mark of a headless Service, which \
                 kube-proxy skips"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Labels<'a> = &'a [(&'a str, &'a str)];

    #[test]
    fn either_label_with_any_value_keeps_kube_proxy_away() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let proxy = |v: &str| Some(ProxyLabel::ServiceProxyName { value: v.into() });
        let cases: [(Labels, Option<ProxyLabel>); 7] = [
            (&[], None),
            (&[("app", "web")], None),
            (&[(LABEL_SERVICE_PROXY_NAME, "kube-router")], proxy("kube-router")),
            (&[(LABEL_SERVICE_PROXY_NAME, "")], proxy("")),
            (&[(LABEL_HEADLESS, "")], Some(ProxyLabel::Headless { value: String::new() })),
            (&[(LABEL_HEADLESS, ""), (LABEL_SERVICE_PROXY_NAME, "x")], proxy("x")),
            // A label of a similar name is not one of them.
            (&[("service.kubernetes.io/service-proxy", "x")], None),
        ];
        for (given, want) in cases {
            assert_eq!(ProxyLabel::of(Some(&labels(given))), want, "{given:?}");
        }
        assert_eq!(ProxyLabel::of(None), None);
    }

    #[test]
    fn the_selector_is_kube_proxys_string() {
        assert_eq!(
            ProxyLabel::label_selector(),
            "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
        );
    }

    #[test]
    fn the_reason_names_the_label_and_its_value() {
        let l = ProxyLabel::ServiceProxyName { value: "kube-router".into() };
        assert_eq!(
            l.to_string(),
            "labelled service.kubernetes.io/service-proxy-name=kube-router: meant for another proxy, as \
             kube-proxy skips it"
        );
    }
}
