//! The model as the source delivers it, and which Services each change touches: kube-proxy's service and
//! endpoint change trackers in one, so that one edited EndpointSlice costs one Service's replanning. It also
//! counts what each change took in, as those trackers do for kube-proxy's metrics (`Taken`).
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::SystemTime,
};

use crate::{
    model::{AddressType, EndpointSlice, Family, Model, ObjKey, Service},
    source::{Changes, Object},
};

/// What a change asks the agent to plan again.
#[derive(Debug, PartialEq, Eq)]
pub enum Touched {
    /// Every Service: a new model, or a Node changed (a zone label moves every Service's zone tier).
    Everything,
    /// These Services (changed themselves, or one of their EndpointSlices did; a Service that is gone is
    /// among them, so its frontends are removed).
    Services(BTreeSet<ObjKey>),
}

/// What one `apply` took in, counted as kube-proxy's `ServiceChangeTracker` and `EndpointsChangeTracker`
/// count it: Services (those kube-proxy would see: none its label selector leaves out) and EndpointSlices of
/// an IP family that were added, changed or removed, and the `last-change-trigger-time` of each slice
/// version taken in, when it is later than the tracker's start (kube-proxy's `trackerStartTime`: an old
/// slice listed at start is not a change this agent programmed late).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// Services added, changed or removed.
    pub services: usize,
    /// EndpointSlices (IPv4 or IPv6) added, changed or removed.
    pub endpoint_slices: usize,
    /// The trigger time of each slice version taken in, with its family.
    pub triggers: Vec<(Family, SystemTime)>,
}

/// The model, kept up to date change by change.
#[derive(Debug)]
pub struct ChangeTracker {
    model: Model,
    started: SystemTime,
    taken: Taken,
}

impl Default for ChangeTracker {
    fn default() -> Self {
        Self { model: Model::default(), started: SystemTime::now(), taken: Taken::default() }
    }
}

/// The family of a slice kube-proxy reads (none for FQDN slices, which no proxier tracks).
fn family(s: &EndpointSlice) -> Option<Family> {
    match s.address_type {
        AddressType::IPv4 => Some(Family::V4),
        AddressType::IPv6 => Some(Family::V6),
        AddressType::Fqdn => None,
    }
}

impl ChangeTracker {
    /// Rebuild the model's maps with full nodes (`Model::repack`).
    pub fn repack(&mut self) {
        self.model.repack();
    }

    /// The model as of the last change.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// What the last `apply` took in.
    pub fn taken(&self) -> &Taken {
        &self.taken
    }

    /// Take in one refresh's changes and say which Services they touch.
    pub fn apply(&mut self, changes: Changes) -> Touched {
        if let Changes::All(model) = &changes
            && self.model.services.is_empty()
            && self.model.slices.is_empty()
        {
            // Nothing before (the first sync): everything the model holds is taken in. The same counts as
            // `apply_compared` gives, without its four maps of every key (200,000 at 100,000 Services).
            self.taken = Taken { services: model.services.len(), ..Taken::default() };
            for s in model.slices.values() {
                self.take_slice(s);
            }
            return self.apply_changes(changes);
        }
        self.apply_compared(changes)
    }

    /// Count one slice version taken in (one of an IP family; its trigger time if later than the start).
    fn take_slice(&mut self, s: &EndpointSlice) {
        let Some(f) = family(s) else { return };
        self.taken.endpoint_slices += 1;
        self.taken.triggers.extend(s.last_change_trigger_time.filter(|t| *t > self.started).map(|t| (f, t)));
    }

    /// `apply` by comparing each named object's version before and after.
    fn apply_compared(&mut self, changes: Changes) -> Touched {
        let (services, slices) = match &changes {
            Changes::All(model) => (
                self.model.services.keys().chain(model.services.keys()).cloned().collect(),
                self.model.slices.values().chain(model.slices.values()).map(|s| s.key.clone()).collect(),
            ),
            Changes::Objects { removed, upserted } => {
                let (mut services, mut slices) = (BTreeSet::new(), BTreeSet::new());
                for o in removed.iter().chain(upserted) {
                    match o {
                        Object::Service(s) => services.insert(s.key.clone()),
                        Object::EndpointSlice(s) => slices.insert(s.key.clone()),
                        Object::Node(_) => false,
                    };
                }
                (services, slices)
            }
        };
        let before = self.versions(&services, &slices);
        let touched = self.apply_changes(changes);
        let after = self.versions(&services, &slices);
        self.taken = Taken::default();
        for (key, old) in &before.0 {
            self.taken.services += usize::from(after.0[key] != *old);
        }
        for (key, old) in &before.1 {
            let new = &after.1[key];
            if new == old {
                continue;
            }
            match new {
                Some(s) => self.take_slice(s),
                // A removed slice is counted (with no trigger time) if it was of a family.
                None => {
                    self.taken.endpoint_slices += usize::from(old.as_ref().and_then(|s| family(s)).is_some());
                }
            }
        }
        touched
    }

    /// The versions of these Services and slices the model holds now (`None`: not there, or skipped).
    #[expect(
        clippy::type_complexity,
        reason = "two maps of one key set each, used right where they are made"
    )]
    fn versions(
        &self,
        services: &BTreeSet<ObjKey>,
        slices: &BTreeSet<ObjKey>,
    ) -> (BTreeMap<ObjKey, Option<Arc<Service>>>, BTreeMap<ObjKey, Option<Arc<EndpointSlice>>>) {
        let svc = services.iter().map(|k| (k.clone(), self.model.services.get(k).cloned())).collect();
        let sl = slices.iter().map(|k| (k.clone(), self.model.slices.get_shared(k))).collect();
        (svc, sl)
    }

    fn apply_changes(&mut self, changes: Changes) -> Touched {
        match changes {
            Changes::All(model) => {
                self.model = model;
                Touched::Everything
            }
            Changes::Objects { removed, upserted } => {
                let mut touched = BTreeSet::new();
                let mut everything = false;
                for o in &removed {
                    everything |= self.remove(o, &mut touched);
                }
                for o in upserted {
                    everything |= self.upsert(o, &mut touched);
                }
                if everything { Touched::Everything } else { Touched::Services(touched) }
            }
        }
    }

    /// Take a removed object out of the model; true when every Service must be replanned.
    fn remove(&mut self, o: &Object, touched: &mut BTreeSet<ObjKey>) -> bool {
        match o {
            Object::Service(s) => {
                self.model.remove_service(&s.key);
                touched.insert(s.key.clone());
            }
            Object::EndpointSlice(s) => {
                if let Some(old) = self.model.slices.remove(&s.key) {
                    touched.extend(old.owner());
                }
                touched.extend(s.owner());
            }
            Object::Node(n) => {
                self.model.nodes.remove(&n.name);
                return true;
            }
        }
        false
    }

    /// Put a new or changed object into the model; true when every Service must be replanned.
    fn upsert(&mut self, o: Object, touched: &mut BTreeSet<ObjKey>) -> bool {
        match o {
            Object::Service(s) => {
                touched.insert(s.key.clone());
                self.model.put_service(s);
            }
            Object::EndpointSlice(s) => {
                touched.extend(s.owner());
                if let Some(old) = self.model.slices.insert_shared(s.key.clone(), s) {
                    touched.extend(old.owner());
                }
            }
            Object::Node(n) => {
                self.model.nodes.insert(n.name.clone(), *n);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{ChangeTracker, Taken, Touched};
    use crate::{
        model::{Family, Model},
        source::{Changes, manifests::parse_text},
    };

    /// Two Services; slices of IPv4 (its change triggered in 2099, after any tracker's start), IPv6 (in
    /// 2001, before it) and FQDN (which no proxier counts).
    const CLUSTER: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: ns}
spec: {clusterIP: 10.96.0.11, ports: [{port: 5432}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-v4
  namespace: ns
  labels: {kubernetes.io/service-name: web}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2099-01-01T00:00:00Z"}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-v6
  namespace: ns
  labels: {kubernetes.io/service-name: web}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2001-01-01T00:00:00Z"}
addressType: IPv6
ports: [{port: 8080}]
endpoints: [{addresses: ["fd00::1"]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-fqdn
  namespace: ns
  labels: {kubernetes.io/service-name: db}
addressType: FQDN
ports: [{port: 5432}]
endpoints: [{addresses: [db.example.com]}]
"#;

    fn cluster() -> Model {
        let (objects, diagnostics) = parse_text(Path::new("cluster.yaml"), CLUSTER);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        let mut model = Model::default();
        for o in objects {
            o.insert_into(&mut model);
        }
        model
    }

    /// The first sync takes its counts from the new model alone: they must be what comparing every object's
    /// version before and after gives (kube-proxy's change counters and the programming latency read them).
    #[test]
    fn the_first_sync_counts_what_it_takes_in_as_comparing_versions_does() {
        let model = cluster();
        assert_eq!(model.slices.len(), 3);
        let (mut first, mut compared) = (ChangeTracker::default(), ChangeTracker::default());
        assert_eq!(first.apply(Changes::All(model.clone())), Touched::Everything);
        assert_eq!(compared.apply_compared(Changes::All(model.clone())), Touched::Everything);
        assert_eq!(first.taken(), compared.taken());
        let Taken { services, endpoint_slices, triggers } = first.taken();
        assert_eq!((*services, *endpoint_slices), (2, 2), "the FQDN slice is not counted");
        assert_eq!(
            triggers.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
            [Family::V4],
            "only 2099 is after the start"
        );
        assert_eq!(first.model(), compared.model());
        // A second full model over a non-empty one compares: the same model again takes in nothing.
        first.apply(Changes::All(model));
        assert_eq!(first.taken(), &Taken::default());
    }
}
