//! What a watch hands the source: each object converted as it arrives (`Raw`), with its
//! resourceVersion, in the watcher's events (`Delivery`); and a refresh's events reduced to the last state of
//! each object.
use std::sync::Arc;

use k8s_openapi::api::core::v1 as core;

use super::{
    super::{convert, fields::err},
    lean,
    unparsed::Unparsed,
};
use crate::{
    model::{Kind, ObjectId},
    source::Object,
};

/// An object of a kind tierlb reads, converted in the watch task as it arrives: its id, its resourceVersion
/// and the model object (or why it does not convert). The API server's object is dropped there, so what
/// waits in the channel (the whole cluster during the first list) is the compact form, not the raw one.
#[derive(Debug)]
pub(super) struct Raw {
    pub(super) id: ObjectId,
    pub(super) version: Option<Version>,
    pub(super) converted: Result<Object, convert::Invalid>,
}

/// A resourceVersion, only ever compared for equality. The API server's are etcd revisions, decimal numbers:
/// kept as one (no allocation, where a `String` took 24 bytes and a heap block per object); any other text is
/// kept as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Version {
    Revision(u64),
    /// A thin pointer (`Name`), so that the version stays 16 bytes.
    Text(crate::model::Name),
}

impl Version {
    fn of(text: &str) -> Self {
        // Only the number's own spelling: "007" and "7" are different versions.
        let canonical = text == "0" || (!text.starts_with('0') && text.bytes().all(|b| b.is_ascii_digit()));
        match text.parse() {
            Ok(n) if canonical => Self::Revision(n),
            _ => Self::Text(text.into()),
        }
    }
}

impl Raw {
    /// The id of a converted object shares its key (the source keeps both as long as the object lives: one
    /// allocation of the name, not two).
    fn of(kind: Kind, meta: &kube::api::ObjectMeta, converted: Result<Object, convert::Invalid>) -> Self {
        let id = converted.as_ref().map_or_else(|_| convert::id_of(kind, meta), Object::id);
        Self { id, version: meta.resource_version.as_deref().map(Version::of), converted }
    }

    pub(super) fn service(o: &lean::LeanService) -> Self {
        let o = &o.0;
        Self::of(Kind::Service, &o.metadata, convert::service(o).map(|s| Object::Service(Arc::new(s))))
    }

    pub(super) fn endpoint_slice(o: &lean::LeanSlice) -> Self {
        let o = &o.0;
        let converted = convert::endpoint_slice(o).map(|s| Object::EndpointSlice(s.into()));
        Self::of(Kind::EndpointSlice, &o.metadata, converted)
    }

    /// `o` parsed, then converted by `wrap`. An object that does not parse is one that does not convert,
    /// named by its metadata.
    pub(super) fn parsed<K: serde::de::DeserializeOwned>(
        kind: Kind,
        o: &Unparsed<K>,
        wrap: fn(&K) -> Self,
    ) -> Self {
        match o.parse() {
            Ok(k) => wrap(&k),
            Err(e) => {
                let invalid = err("(the object)", format!("is not a valid {}: {e}", kind.as_str()));
                Self::of(kind, o.metadata(), Err(vec![invalid]))
            }
        }
    }

    pub(super) fn node(o: &core::Node) -> Self {
        Self::of(Kind::Node, &o.metadata, convert::node(o).map(|n| Object::Node(Box::new(n))))
    }

    pub(super) fn id(&self) -> ObjectId {
        self.id.clone()
    }
}

/// One watcher event, as a watch task hands it to the source (kube-rs `watcher::Event` with its kind).
#[derive(Debug)]
pub(super) enum Delivery {
    /// Added or changed (`Apply`).
    Apply(Raw),
    /// Deleted (`Delete`).
    Delete(Raw),
    /// The watcher (re)lists this kind (`Init`): what the list does not name again is gone.
    ListStart(Kind),
    /// Named by the list (`InitApply`).
    Listed(Raw),
    /// The list is complete (`InitDone`).
    ListDone(Kind),
}

impl Delivery {
    /// The object an object event carries (none for the list markers).
    pub(super) fn object(&self) -> Option<&Raw> {
        match self {
            Self::Apply(raw) | Self::Delete(raw) | Self::Listed(raw) => Some(raw),
            Self::ListStart(_) | Self::ListDone(_) => None,
        }
    }
}

/// An object's events in arrival order, reduced to the last state of each object, in id order.
pub(super) fn last_of_each(mut events: Vec<(ObjectId, Option<Raw>)>) -> Vec<(ObjectId, Option<Raw>)> {
    events.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<(ObjectId, Option<Raw>)> = Vec::with_capacity(events.len());
    for e in events {
        match out.last_mut() {
            Some(last) if last.0 == e.0 => *last = e,
            _ => out.push(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Raw, Version, last_of_each};
    use crate::model::{Kind, ObjKey, ObjectId};

    /// An event of object `name` (a Service) at `version`; a deletion is `None`.
    fn event(name: &str, version: Option<&str>) -> (ObjectId, Option<Raw>) {
        let id = ObjectId::new(Kind::Service, ObjKey::new("ns", name));
        let raw = version.map(|v| Raw {
            id: id.clone(),
            version: Some(Version::of(v)),
            converted: Err(Vec::new()),
        });
        (id, raw)
    }

    /// The events of one refresh come in arrival order: what is taken of each object is its last one (a
    /// deletion after an update is a deletion; an update after it is the object again), in id order.
    #[test]
    fn a_refresh_takes_the_last_event_of_each_object_in_id_order() {
        let events = vec![
            event("b", Some("1")),
            event("a", Some("2")),
            event("b", Some("3")),
            event("c", Some("4")),
            event("c", None),
            event("d", None),
            event("d", Some("5")),
            event("a", Some("6")),
        ];
        let taken: Vec<(String, Option<Version>)> = last_of_each(events)
            .into_iter()
            .map(|(id, raw)| (id.key.name.to_string(), raw.and_then(|r| r.version)))
            .collect();
        let v = |n: u64| Some(Version::Revision(n));
        assert_eq!(taken, [("a".into(), v(6)), ("b".into(), v(3)), ("c".into(), None), ("d".into(), v(5))]);
    }

    #[test]
    fn a_version_is_a_number_only_in_the_numbers_own_spelling() {
        assert_eq!(Version::of("48213"), Version::Revision(48213));
        assert_eq!(Version::of("0"), Version::Revision(0));
        // Equal as numbers, different as versions: neither may be taken for the other.
        assert_ne!(Version::of("007"), Version::of("7"));
        assert_eq!(Version::of("007"), Version::Text("007".into()));
        assert_eq!(Version::of("abc"), Version::Text("abc".into()));
        assert_eq!(Version::of("+7"), Version::Text("+7".into()));
        assert_eq!(Version::of("99999999999999999999999"), Version::Text("99999999999999999999999".into()));
        assert_eq!(Version::of(""), Version::Text("".into()));
    }
}
