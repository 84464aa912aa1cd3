//! Services and EndpointSlices as the watchers read them off the wire: leaner than k8s-openapi reads them.
//! `metadata.managedFields` (a JSON tree naming every field of the object again: for an EndpointSlice, its
//! endpoints a second time) and the annotations `convert` does not read (kubectl's last-applied copy of the
//! whole object among them) are skipped while parsing, never allocated; the rest is k8s-openapi's own types,
//! so conversion and validation are those every other source uses. What is skipped is nothing the agent reads:
//! the objects convert exactly as the full ones do (the tests below).
use std::{borrow::Cow, collections::BTreeMap, fmt};

use k8s_openapi::{
    Resource as _,
    api::{core::v1 as core, discovery::v1 as discovery},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use serde::{
    Deserialize, Deserializer,
    de::{IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use smallvec::SmallVec;

use super::super::fields::ANNOTATIONS_READ;

/// The parts of `metadata` tierlb (and kube-rs' watcher: the resourceVersion) reads. Fields not named here
/// are skipped by serde without being built.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "annotations_read")]
    annotations: Option<BTreeMap<String, String>>,
}

impl From<LeanMeta> for ObjectMeta {
    fn from(m: LeanMeta) -> Self {
        Self {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            labels: m.labels,
            annotations: m.annotations,
            ..Self::default()
        }
    }
}

/// An annotation key: which of `ANNOTATIONS_READ` it is, if any (compared as parsed, not copied).
struct AnnotationKey(Option<&'static str>);

impl<'de> Deserialize<'de> for AnnotationKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;
        impl Visitor<'_> for Key {
            type Value = AnnotationKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an annotation key")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AnnotationKey, E> {
                Ok(AnnotationKey(ANNOTATIONS_READ.iter().copied().find(|a| *a == v)))
            }
        }
        d.deserialize_str(Key)
    }
}

/// `metadata.annotations`, only those `convert` reads.
fn annotations_read<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Annotations;
    impl<'de> Visitor<'de> for Annotations {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
            let mut out = BTreeMap::new();
            while let Some(AnnotationKey(key)) = m.next_key()? {
                match key {
                    Some(k) => {
                        out.insert(k.to_owned(), m.next_value::<String>()?);
                    }
                    None => {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Annotations)
}

pub(super) fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    Ok(Option::<LeanMeta>::deserialize(d)?.map(ObjectMeta::from).unwrap_or_default())
}

/// A Service read leanly (the module's note); `.0` is the k8s-openapi object `convert` takes.
#[derive(Clone, Debug, Default)]
pub(super) struct LeanService(pub(super) core::Service);

impl<'de> Deserialize<'de> for LeanService {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default, deserialize_with = "lean_meta")]
            metadata: ObjectMeta,
            spec: Option<core::ServiceSpec>,
            status: Option<core::ServiceStatus>,
        }
        let w = Wire::deserialize(d)?;
        Ok(Self(core::Service { metadata: w.metadata, spec: w.spec, status: w.status }))
    }
}

/// An EndpointSlice read leanly (the module's note).
#[derive(Clone, Debug, Default)]
pub(super) struct LeanSlice(pub(super) discovery::EndpointSlice);

impl<'de> Deserialize<'de> for LeanSlice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire {
            #[serde(default, deserialize_with = "lean_meta")]
            metadata: ObjectMeta,
            // Absent reads as "" as k8s-openapi reads it, so that conversion refuses the one object (as for
            // every source) instead of the read failing (found by the kube_wire fuzz target).
            #[serde(default)]
            address_type: String,
            #[serde(default, deserialize_with = "endpoints")]
            endpoints: Vec<discovery::Endpoint>,
            ports: Option<Vec<discovery::EndpointPort>>,
        }
        let w = Wire::deserialize(d)?;
        Ok(Self(discovery::EndpointSlice {
            metadata: w.metadata,
            address_type: w.address_type,
            endpoints: w.endpoints,
            ports: w.ports,
        }))
    }
}

/// A slice's `endpoints`, up to 16 allocated once at their number (more grow by doubling, as serde's `Vec`
/// grows them all: JSON gives no length; three reallocations of ~340-byte endpoints for a slice of ten, a
/// million endpoints in a list of 100,000 slices). `null` (what the API server writes for a slice without endpoints) reads as none, as
/// k8s-openapi reads it.
fn endpoints<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<discovery::Endpoint>, D::Error> {
    struct Endpoints;
    impl<'de> Visitor<'de> for Endpoints {
        type Value = Vec<discovery::Endpoint>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of endpoints")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out: SmallVec<[discovery::Endpoint; 16]> = SmallVec::new();
            while let Some(ep) = seq.next_element()? {
                out.push(ep);
            }
            if out.spilled() {
                return Ok(out.into_vec());
            }
            // Up to 16 collected in place, then moved into a vector of exactly their number.
            let mut exact = Vec::with_capacity(out.len());
            exact.extend(out);
            Ok(exact)
        }
    }
    d.deserialize_option(Endpoints)
}

/// kube-rs' `Resource` for a lean type: the API path, kind and metadata of the k8s-openapi type it reads.
macro_rules! lean_resource {
    ($lean:ty, $full:ty) => {
        impl kube::Resource for $lean {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;
            fn kind((): &()) -> Cow<'_, str> {
                <$full>::KIND.into()
            }
            fn group((): &()) -> Cow<'_, str> {
                <$full>::GROUP.into()
            }
            fn version((): &()) -> Cow<'_, str> {
                <$full>::VERSION.into()
            }
            fn plural((): &()) -> Cow<'_, str> {
                <$full>::URL_PATH_SEGMENT.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.0.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.0.metadata
            }
        }
    };
}

lean_resource!(LeanService, core::Service);
lean_resource!(LeanSlice, discovery::EndpointSlice);

/// Whether the lean wire types read `json` as k8s-openapi's full types do (`service`: a Service, else an
/// EndpointSlice): a document the full type reads is read by the lean one too, and converts to the same object
/// (or the same refusal) naming the same pods. The `kube_wire` fuzz target runs it over arbitrary input (the
/// second finding, a key written twice, is why the document is compared as its JSON value).
pub fn lean_reads_as_full(service: bool, json: &[u8]) -> Result<(), String> {
    use super::super::convert;
    // The API server's encoder writes each key once: a document is compared as its JSON value (a key written
    // twice, which only a hand-made document has, keeps its last value), so that both readers see one text.
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else { return Ok(()) };
    let canonical = serde_json::to_vec(&value).map_err(|e| e.to_string())?;
    let json = canonical.as_slice();
    let differ = |what: &str, lean: String, full: String| {
        if lean == full { Ok(()) } else { Err(format!("{what}: lean {lean} != full {full}")) }
    };
    if service {
        let Some((lean, full)) = read_both::<LeanService, core::Service>(json)? else { return Ok(()) };
        differ(
            "service",
            format!("{:?}", convert::service(&lean.0)),
            format!("{:?}", convert::service(&full)),
        )
    } else {
        let Some((lean, full)) = read_both::<LeanSlice, discovery::EndpointSlice>(json)? else {
            return Ok(());
        };
        differ(
            "slice",
            format!("{:?}", convert::endpoint_slice(&lean.0)),
            format!("{:?}", convert::endpoint_slice(&full)),
        )?;
        differ("pods", format!("{:?}", convert::pod_refs(&lean.0)), format!("{:?}", convert::pod_refs(&full)))
    }
}

/// `json` read by the lean type `L` and the full type `F`: none if the full type refuses it, an error if only
/// the lean one does.
fn read_both<L: serde::de::DeserializeOwned, F: serde::de::DeserializeOwned>(
    json: &[u8],
) -> Result<Option<(L, F)>, String> {
    let Ok(full) = serde_json::from_slice::<F>(json) else { return Ok(None) };
    let lean = serde_json::from_slice::<L>(json)
        .map_err(|e| format!("lean refused what the full type read: {e}"))?;
    Ok(Some((lean, full)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::source::convert;

    fn served_service() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                "creationTimestamp": "2026-11-30T12:00:00Z",
                "labels": {"app": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\":{}}",
                    "service.kubernetes.io/topology-mode": "Auto",
                    "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8",
                    "other": "x"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:spec": {"f:ports": {}}}}]
            },
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
                     "trafficDistribution": "PreferSameNode", "sessionAffinity": "ClientIP"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}
        })
    }

    fn served_slice() -> serde_json::Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": "web-abc", "namespace": "shop", "resourceVersion": "43",
                "labels": {"kubernetes.io/service-name": "web"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-30T12:00:00Z"},
                "managedFields": [{"manager": "endpointslice-controller", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:endpoints": {}}}]
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "n1",
                           "zone": "a", "hints": {"forNodes": [{"name": "n1"}], "forZones": [{"name": "a"}]}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        })
    }

    /// The source keeps an object's id (its `converted` map's key) and the object: one allocation of the name.
    #[test]
    fn a_converted_objects_id_shares_its_name() {
        let svc = super::super::Raw::service(&serde_json::from_value(served_service()).unwrap());
        let slice = super::super::Raw::endpoint_slice(&serde_json::from_value(served_slice()).unwrap());
        for raw in [svc, slice] {
            let key = match raw.converted.as_ref().unwrap() {
                crate::source::Object::Service(s) => &s.key,
                crate::source::Object::EndpointSlice(s) => &s.key,
                crate::source::Object::Node(_) => unreachable!(),
            };
            assert_eq!(raw.id.key, *key);
            assert!(
                crate::model::Name::ptr_eq(&raw.id.key.name, &key.name),
                "{}: the name held twice",
                raw.id
            );
        }
        // Not converted: the id still names the object.
        let mut bad = served_service();
        bad["spec"]["ports"][0]["port"] = json!(0);
        let raw = super::super::Raw::service(&serde_json::from_value(bad).unwrap());
        assert!(raw.converted.is_err());
        assert_eq!(raw.id.to_string(), "Service shop/web");
    }

    /// What the agent reads of a lean object is what it reads of the full one, and what is skipped is gone.
    #[test]
    fn a_lean_object_converts_as_the_full_one_and_drops_what_is_never_read() {
        let full: core::Service = serde_json::from_value(served_service()).unwrap();
        let lean: LeanService = serde_json::from_value(served_service()).unwrap();
        assert_eq!(convert::service(&lean.0).unwrap(), convert::service(&full).unwrap());
        let id = |m: &ObjectMeta| convert::id_of(crate::model::Kind::Service, m);
        assert_eq!(id(&lean.0.metadata), id(&full.metadata));
        assert!(lean.0.metadata.managed_fields.is_none());
        let kept: Vec<&str> = lean.0.metadata.annotations.iter().flatten().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kept,
            ["service.beta.kubernetes.io/load-balancer-source-ranges", "service.kubernetes.io/topology-mode"]
        );
        assert_eq!(
            kube::ResourceExt::resource_version(&lean).as_deref(),
            Some("42"),
            "the watcher's bookmark"
        );

        let full: discovery::EndpointSlice = serde_json::from_value(served_slice()).unwrap();
        let lean: LeanSlice = serde_json::from_value(served_slice()).unwrap();
        assert_eq!(convert::endpoint_slice(&lean.0).unwrap(), convert::endpoint_slice(&full).unwrap());
        assert!(lean.0.metadata.managed_fields.is_none());
        assert_eq!(convert::pod_refs(&lean.0), convert::pod_refs(&full));
    }

    /// The fuzz target's check holds on the served objects and on their mangled copies.
    #[test]
    fn the_lean_check_holds_on_served_objects() {
        let svc = serde_json::to_vec(&served_service()).unwrap();
        let slice = serde_json::to_vec(&served_slice()).unwrap();
        assert_eq!(lean_reads_as_full(true, &svc), Ok(()));
        assert_eq!(lean_reads_as_full(false, &slice), Ok(()));
        assert_eq!(lean_reads_as_full(false, b"not json"), Ok(()), "what neither reads is no finding");
    }

    /// The API paths kube-rs builds from the lean types are the full types' own.
    #[test]
    fn a_lean_type_lists_where_the_full_one_does() {
        use kube::Resource;
        assert_eq!(LeanService::url_path(&(), None), core::Service::url_path(&(), None));
        assert_eq!(LeanSlice::url_path(&(), Some("ns")), discovery::EndpointSlice::url_path(&(), Some("ns")));
        assert_eq!(LeanSlice::api_version(&()), "discovery.k8s.io/v1");
        assert_eq!(LeanService::kind(&()), "Service");
    }

    /// Absent or null metadata and annotations read as absent, not as an error.
    #[test]
    fn absent_and_null_parts_read_as_absent() {
        let s: LeanService =
            serde_json::from_value(json!({"metadata": {"name": "a", "annotations": null}})).unwrap();
        assert_eq!(s.0.metadata.annotations, None);
        let s: LeanService = serde_json::from_value(json!({})).unwrap();
        assert_eq!(s.0.metadata, ObjectMeta::default());
        let e: LeanSlice = serde_json::from_value(json!({"addressType": "IPv4", "metadata": null})).unwrap();
        assert!(e.0.endpoints.is_empty());
        // The API server writes a slice without endpoints with `"endpoints": null`.
        let e: LeanSlice = serde_json::from_str(r#"{"addressType": "IPv4", "endpoints": null}"#).unwrap();
        assert!(e.0.endpoints.is_empty());
    }

    /// Endpoints are read in their order and held in a vector of exactly their number, below and above the
    /// 16 collected in place.
    #[test]
    fn a_slices_endpoints_are_read_in_order_into_a_vector_of_their_number() {
        for n in [0, 1, 10, 16, 17, 100] {
            let eps: Vec<_> = (0..n)
                .map(
                    |k| json!({"addresses": [format!("10.0.{}.{}", k / 250, k % 250 + 1)], "nodeName": "n1"}),
                )
                .collect();
            let served = json!({"addressType": "IPv4", "endpoints": eps});
            let lean: LeanSlice = serde_json::from_str(&served.to_string()).unwrap();
            let full: discovery::EndpointSlice = serde_json::from_value(served).unwrap();
            assert_eq!(lean.0.endpoints, full.endpoints, "{n} endpoints");
            if n <= 16 {
                assert_eq!(lean.0.endpoints.capacity(), n, "{n} endpoints: the vector holds no spare room");
            }
        }
    }
}
