//! The API server as a source: kube-rs watchers for Services and EndpointSlices (all namespaces, without
//! those kube-proxy's label selector leaves out: `ProxyLabel`) and this node's Node object, with backoff.
//!
//! Each watch converts every object as it arrives, on a thread of its own beside the watcher task (the API
//! server's object is dropped there: during the first list the whole cluster waits in the channel,
//! converted), and hands its events, in order, to the source through a channel and wakes the agent; a refresh takes only the objects those events name, and
//! hands over only what that changed (after the first refresh, which hands over the whole model). An
//! unchanged resourceVersion is not taken again (a relist repeats every object); an object whose new
//! version does not convert keeps its last good one;
//! when a watch expired and the watcher listed again, what the new list lacks is removed.
//!
//! No reflector store (kube-rs' usual companion of `watcher`): nothing would read it, since the converted
//! objects are what the agent needs, and it would keep a second, raw copy of every EndpointSlice.
mod events;
mod lean;
pub use lean::lean_reads_as_full;
pub mod list;
mod unparsed;

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::{IpAddr, SocketAddr},
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt as _;
use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec},
    core::v1 as core,
};
use kube::{
    Api, Client,
    api::PostParams,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use self::{
    events::{Delivery, Raw, Version, last_of_each},
    unparsed::Unparsed,
};
use super::{Changes, Diagnostic, ModelSource, Object, Origin, PendingChanges, Refresh, Severity};
use crate::model::{Kind, Model, ObjectId, ProxyLabel};

/// Access the agent needs, as (API group, resource, verbs).
pub const NEEDED: [(&str, &str, &[&str]); 3] = [
    ("", "services", &["list", "watch"]),
    ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
    ("", "nodes", &["get", "list", "watch"]),
];

/// Why the API server cannot be a source.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The agent's identity lacks a permission it needs (from `NEEDED`).
    #[error(
        "the service account may not {verb} {resource}{group}: add to its ClusterRole a rule with apiGroups \
         [\"{api_group}\"], resources [{resource}], verbs [get, list, watch] (see deploy/rbac.yaml)"
    )]
    Forbidden {
        /// The verb refused.
        verb: String,
        /// The resource (plural).
        resource: String,
        /// `.group` for a resource outside the core group, else empty (for the message).
        group: String,
        /// The API group ("" for the core group).
        api_group: String,
    },
    /// A request failed.
    #[error("cannot reach the API server ({what}): {source}")]
    Api {
        /// What was asked.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The access reviews were not answered in time.
    #[error("the API server did not answer the agent's access reviews within {timeout:?}")]
    NoAnswer {
        /// How long the agent waited.
        timeout: Duration,
    },
    /// A watcher did not deliver its first list in time.
    #[error("the API server did not deliver the initial {kind} list within {timeout:?}")]
    NotReady {
        /// The kind (or kinds) missing.
        kind: &'static str,
        /// How long the agent waited.
        timeout: Duration,
    },
}

/// The agent's API client for `config`: kube-rs' default stack (TLS, auth, the server's URL), with its
/// retry of requests answered 429, 503 or 504 on: up to 15 times, from 5 ms doubling, and never sooner than
/// a `Retry-After` the server sent (kube-client's `RetryPolicy::server_retry`), so an access review, list or
/// watch that API Priority and Fairness sheds waits as the API server asks, beneath the watchers' own
/// backoff. kube_mock's throttling and server-error tests hold this stack to that.
pub fn client(mut config: kube::Config) -> Result<Client, kube::Error> {
    config.default_retry = true;
    Client::try_from(config)
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

/// The API server as a `ModelSource`: background watchers feed it events; `refresh` turns them into changes.
pub struct KubeSource {
    /// Events from the watch tasks, in order per kind.
    events: mpsc::UnboundedReceiver<Delivery>,
    /// Per object: its last resourceVersion and the converted object the model uses.
    converted: BTreeMap<ObjectId, Converted>,
    /// Why the current version of an object does not convert (every problem the input has now).
    errors: BTreeMap<ObjectId, Vec<Diagnostic>>,
    /// Per kind being (re)listed: the objects the list named so far. Hashed, not ordered: only asked whether
    /// it holds an id. `None` when nothing of the kind was known as the list started (the first list): then
    /// nothing can be gone, and the 100,000 ids of a first list are not kept twice.
    listing: BTreeMap<Kind, Option<HashSet<ObjectId>>>,
    /// The first refresh hands over the whole model; later ones only what changed.
    delivered: bool,
    /// Object events in `events` not yet taken by a refresh, by kind (kube-proxy's `*_changes_pending`).
    queued: PendingChanges,
    tasks: Vec<JoinHandle<()>>,
}

/// One object as the source last saw it.
#[derive(Debug, Default)]
struct Converted {
    /// resourceVersion of the last version converted.
    version: Option<Version>,
    /// The converted object the model uses (the last good one while the current version does not convert;
    /// `None` when no version has converted yet).
    used: Option<Object>,
}

// One per object the source keeps (two per Service): with a `String` version it took 40 bytes.
const _: () = assert!(size_of::<Converted>() <= 32);

impl Drop for KubeSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Events a watcher hands to its converter at once, at most (what was ready together: a list page is 500).
const CONVERT_BATCH: usize = 256;

/// Batches this long or longer are converted on two threads.
const PARALLEL_CONVERT_MIN: usize = 64;

/// Batches queued between a watcher and its converter, at most: the watcher parses the next page while the
/// converter converts the last, and waits when it is this far ahead.
const CONVERT_QUEUE: usize = 4;

/// Watch one kind: every event goes to `events` (then `changed` wakes the agent), each object event counted
/// in `queued` first; `listed` fires once the first list is in `events`.
///
/// Two stages, in order: the watcher task reads what the API server sends (for Services and EndpointSlices
/// only where each object's text ends: `Unparsed`), and a thread of its own parses and converts it (`wrap`:
/// validation and conversion to the model). At 100,000 Services the EndpointSlice
/// list was one CPU parsing and converting a million endpoints while the node's other CPU idled.
fn spawn_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    kind: Kind,
    wrap: fn(&K) -> Raw,
    events: mpsc::UnboundedSender<Delivery>,
    changed: mpsc::UnboundedSender<()>,
    queued: Option<Arc<AtomicI64>>,
) -> (JoinHandle<()>, oneshot::Receiver<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (listed_tx, listed) = oneshot::channel();
    let (batches, parsed) = mpsc::channel::<Vec<watcher::Event<K>>>(CONVERT_QUEUE);
    let convert = move || convert_events(parsed, kind, wrap, &events, &changed, queued.as_deref(), listed_tx);
    if let Err(e) = std::thread::Builder::new().name(format!("convert-{}", kind.as_str())).spawn(convert) {
        // Without a thread of its own (the process is at its limit), the kind is never listed: the start
        // fails with `NotReady`, naming it.
        tracing::error!(kind = kind.as_str(), error = %e, "cannot start the thread converting what the API server sends");
    }
    let task = tokio::spawn(async move {
        // default_backoff: a failed list or a dropped watch is retried with exponential backoff; the watcher
        // resumes from the last resourceVersion it saw (relisting only when that has expired).
        let mut stream = pin!(watcher(api, cfg).default_backoff().ready_chunks(CONVERT_BATCH));
        while let Some(ready) = stream.next().await {
            let mut batch = Vec::with_capacity(ready.len());
            for event in ready {
                match event {
                    Ok(e) => batch.push(e),
                    Err(e) => match forbidden(kind, &e) {
                        // A permission taken away while the agent runs: say which, as at start.
                        Some(refused) => tracing::error!(
                            kind = kind.as_str(),
                            error = %refused,
                            "the API server refused the agent; the maps keep the last state it saw, retrying \
                             with backoff"
                        ),
                        None => {
                            tracing::warn!(kind = kind.as_str(), error = %e, "watch failed; retrying with backoff");
                        }
                    },
                }
            }
            if !batch.is_empty() && batches.send(batch).await.is_err() {
                return; // the converter ended: the source is gone (or a conversion panicked)
            }
        }
    });
    (task, listed)
}

/// The second stage of `spawn_watch`: convert each batch's objects, in order, into `events`; then wake the
/// agent once for the batch.
fn convert_events<K: Sync>(
    mut parsed: mpsc::Receiver<Vec<watcher::Event<K>>>,
    kind: Kind,
    wrap: fn(&K) -> Raw,
    events: &mpsc::UnboundedSender<Delivery>,
    changed: &mpsc::UnboundedSender<()>,
    queued: Option<&AtomicI64>,
    listed: oneshot::Sender<()>,
) {
    let mut listed = Some(listed);
    let deliver = |event: &watcher::Event<K>| match event {
        watcher::Event::Apply(o) => Delivery::Apply(wrap(o)),
        watcher::Event::Delete(o) => Delivery::Delete(wrap(o)),
        watcher::Event::Init => {
            // Each list is said once: the first at start, and a relist when a watch's resourceVersion
            // expired (410 Gone) or the watch could not resume.
            tracing::info!(kind = kind.as_str(), "listing from the API server");
            Delivery::ListStart(kind)
        }
        watcher::Event::InitApply(o) => Delivery::Listed(wrap(o)),
        watcher::Event::InitDone => Delivery::ListDone(kind),
    };
    while let Some(batch) = parsed.blocking_recv() {
        // A list's batch is converted in two halves at once (the watcher task meanwhile reads the next).
        let deliveries = crate::halves::map_in_halves(&batch, PARALLEL_CONVERT_MIN, deliver);
        drop(batch);
        for delivery in deliveries {
            let done = matches!(delivery, Delivery::ListDone(_));
            if let (Some(q), Some(_)) = (queued, delivery.object()) {
                q.fetch_add(1, Ordering::Relaxed);
            }
            if events.send(delivery).is_err() {
                return; // the source is gone
            }
            if done && let Some(tx) = listed.take() {
                let _ = tx.send(());
            }
        }
        let _ = changed.send(());
    }
}

impl KubeSource {
    /// Check access, start the watchers, and wait until each has listed its kind, all within `ready_timeout`
    /// (the agent gives up after a minute, and says which list or the access reviews did not come).
    pub async fn start_with_timeout(
        client: Client,
        node: &str,
        changed: mpsc::UnboundedSender<()>,
        ready_timeout: Duration,
        watch_timeout: Duration,
    ) -> Result<Self, KubeError> {
        let deadline = tokio::time::Instant::now() + ready_timeout;
        match tokio::time::timeout_at(deadline, check_access(&client)).await {
            Ok(checked) => checked?,
            Err(_) => return Err(KubeError::NoAnswer { timeout: ready_timeout }),
        }
        let (tx, events) = mpsc::unbounded_channel();
        let queued = PendingChanges::default();
        // kube-proxy's label filter, server-side, on the Services and EndpointSlices (not the Node), as its
        // informer factory applies it: the API server never sends what another proxy is meant to program, and
        // sends a Delete when an object gains one of the labels.
        let watch = |kind: Kind| watcher::Config::default().timeout(spread(watch_timeout, node, kind));
        let not_for_other_proxies = |kind| watch(kind).labels(&ProxyLabel::label_selector());
        // Parsed by the conversion stage (`unparsed`), and read leanly (`lean`): managedFields and the
        // annotations never read are skipped as parsed.
        let (t1, services) = spawn_watch(
            Api::<Unparsed<lean::LeanService>>::all(client.clone()),
            not_for_other_proxies(Kind::Service),
            Kind::Service,
            |o| Raw::parsed(Kind::Service, o, Raw::service),
            tx.clone(),
            changed.clone(),
            Some(queued.services.clone()),
        );
        let (t2, slices) = spawn_watch(
            Api::<Unparsed<lean::LeanSlice>>::all(client.clone()),
            not_for_other_proxies(Kind::EndpointSlice),
            Kind::EndpointSlice,
            |o| Raw::parsed(Kind::EndpointSlice, o, Raw::endpoint_slice),
            tx.clone(),
            changed.clone(),
            Some(queued.endpoint_slices.clone()),
        );
        let node_cfg = watch(Kind::Node).fields(&format!("metadata.name={node}"));
        let (t3, nodes) =
            spawn_watch(Api::<core::Node>::all(client), node_cfg, Kind::Node, Raw::node, tx, changed, None);
        // Built before waiting, so that a failed start stops the watchers (Drop).
        let source = Self {
            events,
            converted: BTreeMap::new(),
            errors: BTreeMap::new(),
            listing: BTreeMap::new(),
            delivered: false,
            queued,
            tasks: vec![t1, t2, t3],
        };
        for (kind, listed) in [(Kind::Service, services), (Kind::EndpointSlice, slices), (Kind::Node, nodes)]
        {
            if !matches!(tokio::time::timeout_at(deadline, listed).await, Ok(Ok(()))) {
                return Err(KubeError::NotReady { kind: kind.as_str(), timeout: ready_timeout });
            }
        }
        Ok(source)
    }

    /// Take the events delivered since the last call: per object named, its last state (`None`: gone), in
    /// id order. Gathered in a vector, then sorted (stably: an object's last event stays last) and reduced to
    /// the last state of each: a first list of 200,000 objects was as many B-tree inserts.
    fn drain_events(&mut self) -> Vec<(ObjectId, Option<Raw>)> {
        let mut pending: Vec<(ObjectId, Option<Raw>)> = Vec::new();
        while let Ok(delivery) = self.events.try_recv() {
            let counter = match delivery.object().map(|raw| raw.id().kind) {
                Some(Kind::Service) => Some(&self.queued.services),
                Some(Kind::EndpointSlice) => Some(&self.queued.endpoint_slices),
                Some(Kind::Node) | None => None,
            };
            if let Some(c) = counter {
                c.fetch_sub(1, Ordering::Relaxed);
            }
            match delivery {
                Delivery::Apply(raw) => pending.push((raw.id(), Some(raw))),
                Delivery::Delete(raw) => pending.push((raw.id(), None)),
                Delivery::ListStart(kind) => {
                    // Events of one kind come from one watch stream, so none of this kind arrives between
                    // here and its `ListDone` but the list's own.
                    let known = self
                        .converted
                        .keys()
                        .chain(pending.iter().map(|(id, _)| id))
                        .any(|id| id.kind == kind);
                    self.listing.insert(kind, known.then(HashSet::new));
                }
                Delivery::Listed(raw) => {
                    let id = raw.id();
                    if let Some(Some(listed)) = self.listing.get_mut(&id.kind) {
                        listed.insert(id.clone());
                    }
                    pending.push((id, Some(raw)));
                }
                Delivery::ListDone(kind) => {
                    // What the source knew of this kind (converted, or about to be) and the list did not name
                    // again was deleted while the watch was down. (An id whose last event so far is a
                    // deletion may be named again: it is gone all the same.)
                    let Some(Some(listed)) = self.listing.remove(&kind) else { continue };
                    let known = self
                        .converted
                        .keys()
                        .chain(pending.iter().filter(|(_, r)| r.is_some()).map(|(id, _)| id));
                    let gone: BTreeSet<ObjectId> =
                        known.filter(|id| id.kind == kind && !listed.contains(*id)).cloned().collect();
                    pending.extend(gone.into_iter().map(|id| (id, None)));
                }
            }
        }
        last_of_each(pending)
    }

    /// Convert what the events named: (removed, upserted).
    fn apply_events(&mut self) -> (Vec<Object>, Vec<Object>) {
        let mut removed = Vec::new();
        let mut upserted = Vec::new();
        let pending = self.drain_events();
        // The first list: no entry to look up, and the map is built at once from the objects, which come in
        // id order.
        let mut first = self.converted.is_empty().then(|| Vec::with_capacity(pending.len()));
        for (id, raw) in pending {
            let Some(raw) = raw else {
                self.errors.remove(&id);
                removed.extend(self.converted.remove(&id).and_then(|c| c.used));
                continue;
            };
            if let Some(built) = &mut first {
                let mut entry = Converted::default();
                take(&mut entry, &mut self.errors, &id, raw, &mut upserted);
                built.push((id, entry));
            } else {
                let entry = self.converted.entry(id.clone()).or_default();
                take(entry, &mut self.errors, &id, raw, &mut upserted);
            }
        }
        if let Some(built) = first {
            self.converted = built.into_iter().collect();
        }
        (removed, upserted)
    }
}

/// A watcher's error as the permission it lacks (`KubeError::Forbidden`), when the API server answered 403.
fn forbidden(kind: Kind, e: &watcher::Error) -> Option<KubeError> {
    let (verb, status) = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s)) => ("list", s.as_ref()),
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => ("watch", s.as_ref()),
        _ => return None,
    };
    if status.code != 403 {
        return None;
    }
    let (api_group, resource) = match kind {
        Kind::Service => ("", "services"),
        Kind::EndpointSlice => ("discovery.k8s.io", "endpointslices"),
        Kind::Node => ("", "nodes"),
    };
    Some(KubeError::Forbidden {
        verb: verb.to_owned(),
        resource: resource.to_owned(),
        group: if api_group.is_empty() { String::new() } else { format!(".{api_group}") },
        api_group: api_group.to_owned(),
    })
}

/// The watch timeout one kind's watches ask for on this node, in whole seconds: between `shortest` and twice
/// it, fixed by the node's name and the kind (kube-proxy's informers draw it at random per watch), so that
/// the nodes' watches end at different times.
fn spread(shortest: Duration, node: &str, kind: Kind) -> u32 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::hash::DefaultHasher::new();
    (node, kind.as_str()).hash(&mut h);
    let per_mille = u32::try_from(h.finish() % 1000).unwrap_or(0);
    let secs = u32::try_from(shortest.as_secs()).unwrap_or(u32::MAX / 2).max(1);
    secs.saturating_add(secs.saturating_mul(per_mille) / 1000)
}

/// Take an object's new version into its entry: an unchanged resourceVersion is not taken again; one that
/// converts replaces the object the model uses (handed over in `upserted` if it differs); one that does not
/// keeps the last good object, and its problems are the object's errors.
fn take(
    entry: &mut Converted,
    errors: &mut BTreeMap<ObjectId, Vec<Diagnostic>>,
    id: &ObjectId,
    raw: Raw,
    upserted: &mut Vec<Object>,
) {
    if raw.version.is_some() && entry.version == raw.version {
        return;
    }
    entry.version = raw.version;
    match raw.converted {
        Ok(o) => {
            errors.remove(id);
            if entry.used.as_ref() != Some(&o) {
                upserted.push(o.clone());
                entry.used = Some(o);
            }
        }
        Err(problems) => {
            let ds = problems
                .into_iter()
                .map(|e| Diagnostic {
                    service: None,
                    severity: Severity::Error,
                    origin: Origin::Api(id.clone()),
                    field: Some(e.field),
                    message: e.message,
                })
                .collect();
            errors.insert(id.clone(), ds);
        }
    }
}

impl ModelSource for KubeSource {
    fn refresh(&mut self) -> std::io::Result<Refresh> {
        let (removed, upserted) = self.apply_events();
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
        let stale = self
            .errors
            .keys()
            .filter(|id| self.converted.get(*id).is_some_and(|c| c.used.is_some()))
            .map(|id| Origin::Api(id.clone()))
            .collect();
        Ok(Refresh { changes, diagnostics: self.errors.values().flatten().cloned().collect(), stale })
    }

    fn describe(&self) -> String {
        "the API server".into()
    }

    fn pending(&self) -> Option<PendingChanges> {
        Some(self.queued.clone())
    }

    fn repack(&mut self) {
        crate::model::compact::repack(&mut self.converted);
    }
}

/// The addresses the API server's URL names (its host resolved, as the client resolves it; port 443 by
/// default): no Service frontend may take them, or the agent's own connects would be captured (the agent protects them,
/// and `plan`/`explain` with `--kube` plan as it does). A name that
/// does not resolve now gives none (the client would not reach it either).
pub async fn api_server_addresses(config: &kube::Config) -> Vec<SocketAddr> {
    let url = &config.cluster_url;
    let Some(host) = url.host() else { return Vec::new() };
    let port = url.port_u16().unwrap_or(if url.scheme_str() == Some("http") { 80 } else { 443 });
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let mut out: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port)).await.map(Iterator::collect).unwrap_or_default(),
    };
    out.sort();
    out.dedup();
    out
}
