//! EndpointSlices by key, indexed by the Service they belong to (`Model::slices`).
use std::{collections::BTreeMap, sync::Arc};

use super::{EndpointSlice, ObjKey, compact};

/// EndpointSlices by key, indexed by the Service they belong to: finding a Service's slices is a lookup, not a
/// walk over every slice (which made planning 10,000 Services quadratic).
#[derive(Clone, Debug, Default)]
pub struct Slices {
    /// Shared with the source that delivered them (one copy of every endpoint in memory, not two).
    by_key: BTreeMap<ObjKey, Arc<EndpointSlice>>,
    /// Service key (namespace, `kubernetes.io/service-name`) -> its slices' keys, sorted (a Service has one
    /// or two slices: a sorted `Few`, one inline, is a tenth of a `BTreeSet`'s node).
    by_service: BTreeMap<ObjKey, compact::Few<ObjKey>>,
}

impl PartialEq for Slices {
    fn eq(&self, other: &Self) -> bool {
        self.by_key == other.by_key
    }
}

impl Eq for Slices {}

impl std::ops::Index<&ObjKey> for Slices {
    type Output = EndpointSlice;
    fn index(&self, key: &ObjKey) -> &EndpointSlice {
        &self.by_key[key]
    }
}

impl Slices {
    /// Rebuild both maps with full nodes (`compact::repack`).
    pub(super) fn repack(&mut self) {
        compact::repack(&mut self.by_key);
        compact::repack(&mut self.by_service);
    }

    /// Add or replace a slice; returns the one it replaced.
    pub fn insert(&mut self, key: ObjKey, slice: EndpointSlice) -> Option<Arc<EndpointSlice>> {
        self.insert_shared(key, Arc::new(slice))
    }

    /// `insert` for a slice shared with its source. A slice labelled to keep kube-proxy away
    /// (`EndpointSlice::not_proxied`) is not kept: it removes the slice stored under `key`, as kube-proxy's
    /// filtered informer sees a slice that gains the label leave.
    pub fn insert_shared(&mut self, key: ObjKey, slice: Arc<EndpointSlice>) -> Option<Arc<EndpointSlice>> {
        if slice.not_proxied.is_some() {
            return self.remove(&key);
        }
        let owner = slice.owner();
        let previous = self.by_key.insert(key.clone(), slice);
        if let Some(old) = &previous {
            self.unindex(&key, old);
        }
        if let Some(owner) = owner {
            compact::insert_sorted(self.by_service.entry(owner).or_default(), key);
        }
        previous
    }

    /// Remove a slice; returns it.
    pub fn remove(&mut self, key: &ObjKey) -> Option<Arc<EndpointSlice>> {
        let old = self.by_key.remove(key)?;
        self.unindex(key, &old);
        Some(old)
    }

    /// Drop `key` from the index entry of `old`'s Service unless the slice now stored under `key` still
    /// belongs to it.
    fn unindex(&mut self, key: &ObjKey, old: &EndpointSlice) {
        let Some(owner) = old.owner() else { return };
        if self.by_key.get(key).and_then(|s| s.owner()).as_ref() == Some(&owner) {
            return;
        }
        if let Some(set) = self.by_service.get_mut(&owner) {
            compact::remove_sorted(set, key);
            if set.is_empty() {
                self.by_service.remove(&owner);
            }
        }
    }

    /// One slice by key.
    pub fn get(&self, key: &ObjKey) -> Option<&EndpointSlice> {
        self.by_key.get(key).map(|s| &**s)
    }

    /// One slice by key, shared.
    pub fn get_shared(&self, key: &ObjKey) -> Option<Arc<EndpointSlice>> {
        self.by_key.get(key).cloned()
    }

    /// Every slice, in key order.
    pub fn values(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.by_key.values().map(|s| &**s)
    }

    /// How many slices.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// No slice at all.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The slices of one Service, in key order.
    pub fn of<'a>(&'a self, svc: &ObjKey) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.by_service.get(svc).into_iter().flatten().filter_map(|k| self.by_key.get(k).map(|s| &**s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AddressType;

    fn slice(name: &str, service: Option<&str>) -> EndpointSlice {
        EndpointSlice {
            key: ObjKey::new("ns", name),
            service_name: service.map(crate::model::Name::from),
            address_type: AddressType::IPv4,
            ports: Vec::new().into(),
            endpoints: Vec::new().into(),
            not_proxied: None,
            last_change_trigger_time: None,
        }
    }

    fn names<'a>(s: &'a Slices, svc: &str) -> Vec<&'a str> {
        s.of(&ObjKey::new("ns", svc)).map(|x| &*x.key.name).collect()
    }

    #[test]
    fn the_slice_index_follows_inserts_replacements_and_removals() {
        let mut s = Slices::default();
        s.insert(ObjKey::new("ns", "b"), slice("b", Some("web")));
        s.insert(ObjKey::new("ns", "a"), slice("a", Some("web")));
        s.insert(ObjKey::new("ns", "c"), slice("c", None));
        assert_eq!(names(&s, "web"), ["a", "b"], "key order");
        // A slice relabelled to another Service moves with it.
        s.insert(ObjKey::new("ns", "b"), slice("b", Some("db")));
        assert_eq!((names(&s, "web"), names(&s, "db")), (vec!["a"], vec!["b"]));
        // Replacing a slice with one for the same Service keeps it indexed.
        s.insert(ObjKey::new("ns", "a"), slice("a", Some("web")));
        assert_eq!(names(&s, "web"), ["a"]);
        s.remove(&ObjKey::new("ns", "a"));
        assert!(names(&s, "web").is_empty());
        assert!(!s.by_service.contains_key(&ObjKey::new("ns", "web")), "empty entries are dropped");
        assert_eq!(s.len(), 2);
        // Another namespace's Service of the same name is a different Service.
        assert_eq!(s.of(&ObjKey::new("other", "db")).count(), 0);
    }
}
