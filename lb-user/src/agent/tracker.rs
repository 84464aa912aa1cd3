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
            if new == old || new.as_ref().or(old.as_ref()).and_then(|s| family(s)).is_none() {
                continue;
            }
            self.taken.endpoint_slices += 1;
            let trigger = new.as_ref().and_then(|s| Some((family(s)?, s.last_change_trigger_time?)));
            self.taken.triggers.extend(trigger.filter(|(_, t)| *t > self.started));
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
