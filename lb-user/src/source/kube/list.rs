//! One read of the API server for the read-only faces (`plan`, `explain` and `lint` with `--kube`): lists
//! only, paged as kubectl pages them, no watch and no access review (each list answers for itself). The faces
//! see what `kubectl get services,endpointslices,nodes -o yaml` would show, so no label selector: an object
//! another proxy programs is listed and the plan says why it is not programmed, as with a manifests dump.
//!
//! Services and EndpointSlices must be readable (in `--namespace`, or in every namespace); Nodes may be
//! forbidden, as a namespace's read-only role forbids them: the snapshot then holds no Node and says why, and
//! the faces take the zone from `--zone` or from the endpoints.
use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
use kube::{Api, Client, api::ListParams};

use super::super::{Diagnostic, Object, Origin, Severity, convert};
use crate::model::{Kind, Model, ObjKey, ObjectId};

/// Objects per list request, as kubectl asks (`--chunk-size` 500).
pub const PAGE: u32 = 500;

/// What one read of the API server found.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The objects that convert.
    pub model: Model,
    /// Objects that do not convert (each left out), as the agent would report them.
    pub diagnostics: Vec<Diagnostic>,
    /// Why no Node was read (the API server's answer to the list), when Nodes are forbidden.
    pub nodes_forbidden: Option<String>,
    /// The pods the slices' endpoints name, by address (`convert::pod_refs`).
    pub pods: std::collections::BTreeMap<std::net::IpAddr, ObjKey>,
}

/// Why the API server could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// This identity may not list a resource the faces need.
    #[error("may not list {resource} {scope} (the API server says: {message}); {fix}")]
    Forbidden {
        /// The resource (plural, with its group).
        resource: String,
        /// `in namespace NS` or `in any namespace`.
        scope: String,
        /// The API server's message.
        message: String,
        /// What to do about it.
        fix: String,
    },
    /// A request failed otherwise.
    #[error("cannot list {resource} from the API server: {source}")]
    Api {
        /// The resource (plural).
        resource: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// Every object of one kind, page by page.
async fn list_all<K>(api: &Api<K>) -> Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

fn forbidden(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(status) if status.is_forbidden() => Some(status.message.clone()),
        _ => None,
    }
}

/// The Services and EndpointSlices of `namespace` (of every namespace: `None`) and every Node.
pub async fn snapshot(client: Client, namespace: Option<&str>) -> Result<Snapshot, ListError> {
    let scope = namespace.map_or_else(|| "in any namespace".to_owned(), |ns| format!("in namespace {ns}"));
    let fail = |resource: &str, e: kube::Error| match forbidden(&e) {
        Some(message) => ListError::Forbidden {
            resource: resource.to_owned(),
            scope: scope.clone(),
            message,
            fix: match namespace {
                None => "pass --namespace NS to read one namespace, or ask for get and list on it in every \
                         namespace (a ClusterRole)"
                    .to_owned(),
                Some(ns) => format!(
                    "ask for a Role in namespace {ns} with verbs [get, list] on services and \
                     endpointslices.discovery.k8s.io"
                ),
            },
        },
        None => ListError::Api { resource: resource.to_owned(), source: e },
    };
    let (services, slices): (Api<core::Service>, Api<discovery::EndpointSlice>) = match namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let services = list_all(&services).await.map_err(|e| fail("services", e))?;
    let slices = list_all(&slices).await.map_err(|e| fail("endpointslices.discovery.k8s.io", e))?;
    let mut snap = Snapshot::default();
    let nodes = match list_all(&Api::<core::Node>::all(client)).await {
        Ok(nodes) => nodes,
        Err(e) => match forbidden(&e) {
            Some(message) => {
                snap.nodes_forbidden = Some(message);
                Vec::new()
            }
            None => return Err(ListError::Api { resource: "nodes".into(), source: e }),
        },
    };
    let mut take = |id: ObjectId, converted: Result<Object, convert::Invalid>| match converted {
        Ok(o) => o.insert_into(&mut snap.model),
        Err(errors) => snap.diagnostics.extend(errors.into_iter().map(|e| Diagnostic {
            service: None,
            severity: Severity::Error,
            origin: Origin::Api(id.clone()),
            field: Some(e.field),
            message: e.message,
        })),
    };
    for s in &services {
        take(
            convert::id_of(Kind::Service, &s.metadata),
            convert::service(s).map(|s| Object::Service(std::sync::Arc::new(s))),
        );
    }
    for s in &slices {
        snap.pods.extend(convert::pod_refs(s));
        take(
            convert::id_of(Kind::EndpointSlice, &s.metadata),
            convert::endpoint_slice(s).map(|s| Object::EndpointSlice(s.into())),
        );
    }
    for n in &nodes {
        take(convert::id_of(Kind::Node, &n.metadata), convert::node(n).map(|n| Object::Node(Box::new(n))));
    }
    Ok(snap)
}
