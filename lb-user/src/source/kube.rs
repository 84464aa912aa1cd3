//! The API server as a source: kube-rs watchers and reflector stores for Services and EndpointSlices (all
//! namespaces) and this node's Node object, with backoff; any event wakes the agent, which re-plans from
//! the stores: objects whose resourceVersion changed are converted again, and only the Services they touch
//! are replanned.
use std::{collections::BTreeMap, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec},
    core::v1 as core,
    discovery::v1 as discovery,
};
use kube::{
    Api, Client,
    api::PostParams,
    runtime::{
        WatchStreamExt as _,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::{sync::mpsc, task::JoinHandle};

use super::{Changes, Diagnostic, ModelSource, Object, Origin, Refresh, Severity, convert};
use crate::model::{Kind, Model, ObjKey, ObjectId};

/// Access the agent needs, as (API group, resource, verbs).
pub const NEEDED: [(&str, &str, &[&str]); 3] = [
    ("", "services", &["list", "watch"]),
    ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
    ("", "nodes", &["get", "list", "watch"]),
];

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "the service account may not {verb} {resource}{group}: add to its ClusterRole a rule with apiGroups \
         [\"{api_group}\"], resources [{resource}], verbs [get, list, watch] (see deploy/rbac.yaml)"
    )]
    Forbidden { verb: String, resource: String, group: String, api_group: String },
    #[error("cannot reach the API server ({what}): {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("the API server did not deliver the initial {0} list within {1:?}")]
    NotReady(&'static str, Duration),
}

/// Ask the API server, for each permission the agent needs, whether this identity has it.
pub async fn check_access(client: &Client) -> Result<(), KubeError> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for (group, resource, verbs) in NEEDED {
        for verb in verbs {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(group.to_owned()),
                        resource: Some(resource.to_owned()),
                        verb: Some((*verb).to_owned()),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let answer = api.create(&PostParams::default(), &review).await.map_err(|source| {
                KubeError::Api { what: format!("access review for {verb} {resource}"), source }
            })?;
            if !answer.status.is_some_and(|s| s.allowed) {
                return Err(KubeError::Forbidden {
                    verb: (*verb).to_owned(),
                    resource: resource.to_owned(),
                    group: if group.is_empty() { String::new() } else { format!(".{group}") },
                    api_group: group.to_owned(),
                });
            }
        }
    }
    Ok(())
}

/// Reflector stores kept up to date by background watchers.
pub struct KubeSource {
    services: Store<core::Service>,
    slices: Store<discovery::EndpointSlice>,
    nodes: Store<core::Node>,
    /// Converted objects: an unchanged resourceVersion is not converted again, and an object that stops
    /// converting keeps its last good state.
    converted: BTreeMap<ObjectId, Converted>,
    /// The first refresh hands over the whole model; later ones only what changed.
    delivered: bool,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn spawn_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    changed: mpsc::UnboundedSender<()>,
) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&()).into_owned();
    let task = tokio::spawn(async move {
        // default_backoff: a failed list or a dropped watch is retried with exponential backoff; the watcher
        // resumes from the last resourceVersion it saw (relisting only when that has expired).
        watcher(api, cfg)
            .default_backoff()
            .reflect(writer)
            .for_each(|ev| {
                match ev {
                    Ok(_) => {
                        let _ = changed.send(());
                    }
                    Err(e) => tracing::warn!(kind = %kind, error = %e, "watch failed; retrying with backoff"),
                }
                std::future::ready(())
            })
            .await;
    });
    (store, task)
}

impl KubeSource {
    /// Check access, start the watchers, and wait for their first lists.
    pub async fn start(
        client: Client,
        node: &str,
        changed: mpsc::UnboundedSender<()>,
        ready_timeout: Duration,
    ) -> Result<Self, KubeError> {
        check_access(&client).await?;
        let (services, t1) = spawn_watch(
            Api::<core::Service>::all(client.clone()),
            watcher::Config::default(),
            changed.clone(),
        );
        let (slices, t2) = spawn_watch(
            Api::<discovery::EndpointSlice>::all(client.clone()),
            watcher::Config::default(),
            changed.clone(),
        );
        let node_cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let (nodes, t3) = spawn_watch(Api::<core::Node>::all(client), node_cfg, changed);
        let source = Self {
            services,
            slices,
            nodes,
            converted: BTreeMap::new(),
            delivered: false,
            tasks: vec![t1, t2, t3],
        };
        for (what, ready) in [
            ("Service", source.services.wait_until_ready().await.is_ok()),
            ("EndpointSlice", source.slices.wait_until_ready().await.is_ok()),
            ("Node", source.nodes.wait_until_ready().await.is_ok()),
        ] {
            if !ready {
                return Err(KubeError::NotReady(what, ready_timeout));
            }
        }
        Ok(source)
    }

    /// Wait for the first lists, but not forever.
    pub async fn start_with_timeout(
        client: Client,
        node: &str,
        changed: mpsc::UnboundedSender<()>,
        timeout: Duration,
    ) -> Result<Self, KubeError> {
        match tokio::time::timeout(timeout, Self::start(client, node, changed, timeout)).await {
            Ok(r) => r,
            Err(_) => Err(KubeError::NotReady("Service, EndpointSlice or Node", timeout)),
        }
    }

    /// Convert what changed in the stores: (removed, upserted, every current problem).
    fn refresh_objects(&mut self) -> (Vec<Object>, Vec<Object>, Vec<Diagnostic>, Vec<Origin>) {
        let mut step = Step::default();
        let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            ObjKey::new(m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default())
        };
        for s in self.services.state() {
            let id = ObjectId::new(Kind::Service, key(&s.metadata));
            step.consider(&mut self.converted, id, &s.metadata.resource_version, || {
                convert::service(&s).map(Object::Service)
            });
        }
        for s in self.slices.state() {
            let id = ObjectId::new(Kind::EndpointSlice, key(&s.metadata));
            step.consider(&mut self.converted, id, &s.metadata.resource_version, || {
                convert::endpoint_slice(&s).map(|s| Object::EndpointSlice(s.into()))
            });
        }
        for s in self.nodes.state() {
            let id = ObjectId::node(s.metadata.name.clone().unwrap_or_default());
            step.consider(&mut self.converted, id, &s.metadata.resource_version, || {
                convert::node(&s).map(Object::Node)
            });
        }
        let mut removed = Vec::new();
        self.converted.retain(|key, c| {
            let keep = step.seen.contains(key);
            if !keep {
                removed.extend(c.used.take());
            }
            keep
        });
        let stale = self
            .converted
            .iter()
            .filter(|(_, c)| c.error.is_some() && c.used.is_some())
            .map(|(id, _)| Origin::Api(id.clone()))
            .collect();
        (removed, step.upserted, step.diagnostics, stale)
    }
}

/// One object's conversion.
#[derive(Debug, Default)]
struct Converted {
    version: Option<String>,
    /// The converted object the model uses (the last good one while the current version does not convert).
    used: Option<Object>,
    /// Why the current version does not convert.
    error: Option<Diagnostic>,
}

#[derive(Default)]
struct Step {
    seen: std::collections::HashSet<ObjectId>,
    upserted: Vec<Object>,
    diagnostics: Vec<Diagnostic>,
}

impl Step {
    fn consider(
        &mut self,
        cache: &mut BTreeMap<ObjectId, Converted>,
        id: ObjectId,
        version: &Option<String>,
        convert: impl FnOnce() -> Result<Object, convert::FieldError>,
    ) {
        let entry = cache.entry(id.clone()).or_default();
        self.seen.insert(id.clone());
        if version.is_some() && &entry.version == version {
            self.diagnostics.extend(entry.error.clone());
            return;
        }
        entry.version.clone_from(version);
        match convert() {
            Ok(o) => {
                entry.error = None;
                if entry.used.as_ref() != Some(&o) {
                    self.upserted.push(o.clone());
                    entry.used = Some(o);
                }
            }
            Err(e) => {
                let d = Diagnostic {
                    severity: Severity::Error,
                    origin: Origin::Api(id),
                    field: Some(e.field),
                    message: e.message,
                };
                self.diagnostics.push(d.clone());
                entry.error = Some(d);
            }
        }
    }
}

impl ModelSource for KubeSource {
    fn refresh(&mut self) -> std::io::Result<Refresh> {
        let (removed, upserted, diagnostics, stale) = self.refresh_objects();
        let changes = if self.delivered {
            Changes::Objects { removed, upserted }
        } else {
            self.delivered = true;
            let mut model = Model::default();
            for o in self.converted.values().filter_map(|c| c.used.clone()) {
                o.insert_into(&mut model);
            }
            Changes::All(model)
        };
        Ok(Refresh { changes, diagnostics, stale })
    }
    fn describe(&self) -> String {
        "the API server".into()
    }
}
