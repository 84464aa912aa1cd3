//! The model as the source delivers it, and which Services each change touches: kube-proxy's service and
//! endpoint change trackers in one, so that one edited EndpointSlice costs one Service's replanning.
use std::collections::BTreeSet;

use crate::{
    model::{Model, ObjKey},
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

/// The model, kept up to date change by change.
#[derive(Debug, Default)]
pub struct ChangeTracker {
    model: Model,
}

impl ChangeTracker {
    /// The model as of the last change.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Take in one refresh's changes and say which Services they touch.
    pub fn apply(&mut self, changes: Changes) -> Touched {
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
                self.model.nodes.insert(n.name.clone(), n);
                return true;
            }
        }
        false
    }
}
