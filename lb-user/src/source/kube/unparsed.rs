//! Objects as the API server sent them, parsed later. The watcher task only finds where each object of a
//! page ends and copies it; the conversion stage (`spawn_watch`) parses and converts on threads of its own, in
//! parallel. At 100,000 Services the watcher task parsing the EndpointSlice list alone was the last second
//! of the agent's start on one CPU while the node's other CPU idled.
//!
//! An object that does not parse is one object that does not convert, named by its metadata; the rest of its
//! list is taken (parsed in the watcher, it failed the whole page and the list was retried forever).
use std::{borrow::Cow, fmt, marker::PhantomData, sync::OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{
    Deserialize, Deserializer,
    de::{DeserializeOwned, MapAccess, Visitor},
};
use serde_json::Value;

use super::lean::lean_meta;

/// An object of type `K` not yet parsed: its JSON text (checked to be JSON, nothing more).
pub(super) struct Unparsed<K> {
    text: String,
    /// The metadata, parsed on first use: kube-rs' watcher reads a watch event's resourceVersion (a list's
    /// objects are never asked).
    meta: OnceLock<ObjectMeta>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Unparsed<K> {
    /// The object the text holds.
    pub(super) fn parse(&self) -> serde_json::Result<K>
    where
        K: DeserializeOwned,
    {
        serde_json::from_str(&self.text)
    }

    /// Its metadata as `lean` reads it (none when even that does not parse).
    pub(super) fn metadata(&self) -> &ObjectMeta {
        self.meta.get_or_init(|| {
            #[derive(Deserialize)]
            struct Head {
                #[serde(default, deserialize_with = "lean_meta")]
                metadata: ObjectMeta,
            }
            serde_json::from_str::<Head>(&self.text).map(|h| h.metadata).unwrap_or_default()
        })
    }
}

/// What serde_json's deserializer is asked for to hand over a value's text unparsed (`RawValue`'s token).
const RAW_TOKEN: &str = "$serde_json::private::RawValue";

/// The text is found and copied, not parsed, when serde_json reads the object in place (a list page, and a
/// watch event naming its `type` first, as the API server writes them). Any other way (a watch event with its
/// `object` first, buffered by serde; another deserializer) the object is parsed into a JSON value and
/// written out again: slower, never wrong.
impl<'de, K> Deserialize<'de> for Unparsed<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = String;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<String, M::Error> {
                let Some(first) = m.next_key::<String>()? else { return Ok("{}".to_owned()) };
                if first == RAW_TOKEN {
                    return m.next_value();
                }
                let mut object = serde_json::Map::new();
                object.insert(first, m.next_value()?);
                while let Some((k, v)) = m.next_entry::<String, Value>()? {
                    object.insert(k, v);
                }
                Ok(Value::Object(object).to_string())
            }
            fn visit_newtype_struct<D2: Deserializer<'de>>(self, d: D2) -> Result<String, D2::Error> {
                Ok(Value::deserialize(d)?.to_string())
            }
        }
        let text = d.deserialize_newtype_struct(RAW_TOKEN, Text)?;
        Ok(Self { text, meta: OnceLock::new(), kind: PhantomData })
    }
}

impl<K> Clone for Unparsed<K> {
    fn clone(&self) -> Self {
        Self { text: self.text.clone(), meta: self.meta.clone(), kind: PhantomData }
    }
}

impl<K> fmt::Debug for Unparsed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Unparsed").field(&self.text).finish()
    }
}

/// Listed and watched where `K` is.
impl<K: kube::Resource<DynamicType = ()>> kube::Resource for Unparsed<K> {
    type DynamicType = ();
    type Scope = K::Scope;
    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.metadata()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.metadata();
        self.meta.get_mut().expect("the metadata was parsed just above")
    }
}

#[cfg(test)]
mod tests {
    use kube::{
        Resource as _, ResourceExt as _,
        core::{ObjectList, WatchEvent},
    };
    use serde_json::json;

    use super::*;
    use crate::source::kube::lean::{LeanService, LeanSlice};

    fn slice(name: &str, ip: &str) -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "shop", "resourceVersion": "43",
                         "labels": {"kubernetes.io/service-name": "web"},
                         "managedFields": [{"manager": "x", "fieldsV1": {"f:endpoints": {}}}]},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}, "nodeName": "n1"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        })
    }

    /// A list page is split into its objects' texts; each parses to what the lean type reads, and its
    /// metadata (the watcher's resourceVersion) is read without parsing the rest.
    #[test]
    fn a_list_is_split_into_objects_that_parse_as_the_lean_type_reads_them() {
        let page = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
            "metadata": {"resourceVersion": "44", "continue": "next"},
            "items": [slice("web-a", "10.0.0.1"), slice("web-b", "10.0.0.2")]
        });
        let list: ObjectList<Unparsed<LeanSlice>> = serde_json::from_str(&page.to_string()).unwrap();
        assert_eq!(list.metadata.continue_.as_deref(), Some("next"));
        assert_eq!(list.items.len(), 2);
        for (item, (name, ip)) in list.items.iter().zip([("web-a", "10.0.0.1"), ("web-b", "10.0.0.2")]) {
            let direct: LeanSlice = serde_json::from_value(slice(name, ip)).unwrap();
            let parsed = item.parse().unwrap();
            assert_eq!(parsed.0, direct.0);
            assert_eq!(item.name_any(), name);
            assert_eq!(item.resource_version().as_deref(), Some("43"));
            assert!(item.meta().managed_fields.is_none(), "read leanly");
        }
    }

    /// serde_json hands the text over as it is (its `raw_value` feature, which the workspace turns on): not
    /// parsed and written out again, which would cost more than parsing the object in the watcher did.
    #[test]
    fn the_text_is_handed_over_as_the_api_server_wrote_it() {
        let object = r#"{"metadata": {"name": "web", "resourceVersion": "7"},  "spec": {"ports": []}}"#;
        let page = format!(r#"{{"metadata": {{"resourceVersion": "8"}}, "items": [ {object} ]}}"#);
        let list: ObjectList<Unparsed<LeanService>> = serde_json::from_str(&page).unwrap();
        assert_eq!(list.items[0].text, object);
    }

    /// A watch event as the API server writes it (`type` first) hands over the object's text.
    #[test]
    fn a_watch_event_hands_over_its_objects_text() {
        let line = format!(r#"{{"type":"MODIFIED","object":{}}}"#, slice("web-a", "10.0.0.9"));
        let event: WatchEvent<Unparsed<LeanSlice>> = serde_json::from_str(&line).unwrap();
        let WatchEvent::Modified(o) = event else { panic!("{event:?}") };
        assert_eq!(o.resource_version().as_deref(), Some("43"));
        assert_eq!(o.parse().unwrap().0.endpoints[0].addresses, ["10.0.0.9"]);
    }

    /// A watch event with its `object` before its `type` (serde buffers the object to find the variant), and
    /// an object read from a JSON value rather than text, hand over the same object.
    #[test]
    fn an_object_read_any_other_way_is_the_same_object() {
        let object = slice("web-a", "10.0.0.9");
        let line = format!(r#"{{"object":{object},"type":"ADDED"}}"#);
        let event: WatchEvent<Unparsed<LeanSlice>> = serde_json::from_str(&line).unwrap();
        let WatchEvent::Added(buffered) = event else { panic!("{event:?}") };
        let from_value: Unparsed<LeanSlice> = serde_json::from_value(object.clone()).unwrap();
        let direct: LeanSlice = serde_json::from_value(object).unwrap();
        for o in [buffered, from_value] {
            assert_eq!(o.parse().unwrap().0, direct.0);
            assert_eq!(o.resource_version().as_deref(), Some("43"));
        }
        let empty: Unparsed<LeanService> = serde_json::from_value(json!({})).unwrap();
        assert_eq!(empty.parse().unwrap().0, LeanService::default().0);
    }

    /// An object of the wrong shape fails alone, when parsed; its metadata still names it.
    #[test]
    fn an_object_that_does_not_parse_fails_alone_and_is_still_named() {
        let mut bad = slice("web-bad", "10.0.0.3");
        bad["endpoints"][0]["addresses"] = json!("10.0.0.3");
        let page = json!({"metadata": {"resourceVersion": "45"}, "items": [bad, slice("web-a", "10.0.0.1")]});
        let list: ObjectList<Unparsed<LeanSlice>> = serde_json::from_str(&page.to_string()).unwrap();
        assert!(list.items[0].parse().is_err());
        assert_eq!(list.items[0].name_any(), "web-bad");
        assert!(list.items[1].parse().is_ok());
        // Text that is not an object at all: no metadata, nothing parsed.
        let odd: Unparsed<LeanService> = serde_json::from_str("[1, 2]").unwrap();
        assert!(odd.parse().is_err());
        assert_eq!(odd.metadata(), &ObjectMeta::default());
    }

    /// The API paths are the lean type's own.
    #[test]
    fn an_unparsed_type_lists_where_its_type_does() {
        assert_eq!(Unparsed::<LeanSlice>::url_path(&(), None), LeanSlice::url_path(&(), None));
        assert_eq!(Unparsed::<LeanService>::kind(&()), "Service");
        assert_eq!(Unparsed::<LeanSlice>::api_version(&()), "discovery.k8s.io/v1");
    }
}
