//! The `--kube` source against a scripted API server, for what a real one cannot be made to do on demand
//! (`real_kube.rs` runs the agent against kube-apiserver 1.36 itself: lists, watches, restarts, compaction,
//! watches the server times out, RBAC, label selectors, the faces). The server (`server.rs`) is HTTP on
//! loopback: its watches stay open while events flow, and the test breaks one in the middle (a reset),
//! ends it, or sends an ERROR event into it; it answers scripted requests with 429 and `Retry-After` (API
//! Priority and Fairness' words) or with a 5xx. It is strict: any request it would not serve as the agent
//! means it (an unknown path, a missing or other selector, a watch without bookmarks or not resuming at the
//! last resourceVersion, an access review in the wrong API group) fails the test.
//!
//! Here: a reset mid-watch resumes where it was; 429 and 5xx on the access reviews, a list, a watch's start
//! and mid-stream, each retried no sooner than asked and without a relist where the resourceVersion holds;
//! and the source's own contract, which needs events the test orders exactly (an object that stops
//! converting; what each refresh hands over; a relist after a 410 that removes what was deleted unseen; a
//! bookmark moving the resume point). `edges.rs`: a continue token expiring between pages, an object of the
//! wrong shape, a first list or access review that never comes.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use tierlb::{
    agent::ChangeTracker,
    model::{Kind, ObjKey, ObjectId},
    source::{
        Changes, Diagnostic, ModelSource as _, Object, Origin,
        kube::{KubeError, KubeSource},
    },
};
use tokio::sync::mpsc;

mod edges;
mod server;

use server::{Refusal, Script, end, finish, open_watches, reset, send};

fn service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "10"},
           "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}],
                    "trafficDistribution": "PreferSameNode"}})
}

fn slice(rv: &str, endpoints: &[(&str, &str)]) -> Value {
    named_slice("web-1", rv, endpoints)
}

/// An EndpointSlice of Service shop/web.
fn named_slice(name: &str, rv: &str, endpoints: &[(&str, &str)]) -> Value {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "nodeName": node, "hints": {"forNodes": [{"name": node}]}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": name, "namespace": "shop", "resourceVersion": rv,
                        "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps})
}

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "node-1", "resourceVersion": "5", "labels": {"topology.kubernetes.io/zone": "a"}}})
}

fn script() -> Script {
    let mut s = Script::default();
    s.lists.insert("services", (json!([service()]), "10"));
    s.lists.insert("endpointslices", (json!([slice("20", &[("10.244.1.5", "node-1")])]), "20"));
    let mut other = node();
    other["metadata"]["name"] = json!("node-2");
    other["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("b");
    s.lists.insert("nodes", (json!([node(), other]), "5"));
    s
}

async fn wait_for(mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached in 5 s");
}

/// What `start` and `start_within` give: the source (or why it did not start), its change signal, and the
/// server task.
type Started = (Result<KubeSource, KubeError>, mpsc::UnboundedReceiver<()>, tokio::task::JoinHandle<()>);

/// A source starting against the mock API server playing `script`, given 10 s.
async fn start(script: &Arc<Mutex<Script>>) -> Started {
    start_within(script, Duration::from_secs(10)).await
}

/// A source starting against the mock API server playing `script`, giving up after `timeout`.
async fn start_within(script: &Arc<Mutex<Script>>, timeout: Duration) -> Started {
    let (addr, server) = server::start(script.clone()).await;
    let (tx, rx) = mpsc::unbounded_channel();
    // The client the agent builds, for the fake server's URL.
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = tierlb::source::kube::client(config).unwrap();
    (
        KubeSource::start_with_timeout(client, "node-1", tx, timeout, Duration::from_secs(290)).await,
        rx,
        server,
    )
}

/// `start`, which must succeed.
async fn started(
    script: &Arc<Mutex<Script>>,
) -> (KubeSource, mpsc::UnboundedReceiver<()>, tokio::task::JoinHandle<()>) {
    let (source, rx, server) = start(script).await;
    (source.unwrap(), rx, server)
}

/// Refresh the source into `tracker`, as the agent does: the problems the source reports now, and what it
/// keeps at its last good version.
fn follow(source: &mut KubeSource, tracker: &mut ChangeTracker) -> (Vec<Diagnostic>, Vec<Origin>) {
    let r = source.refresh().unwrap();
    tracker.apply(r.changes);
    (r.diagnostics, r.stale)
}

/// Send one event on the open watch of `resource` and wait until the source has signalled it.
async fn deliver_to(
    script: &Arc<Mutex<Script>>,
    rx: &mut mpsc::UnboundedReceiver<()>,
    resource: &'static str,
    event: Value,
) {
    while rx.try_recv().is_ok() {}
    wait_for(|| send(script, resource, std::slice::from_ref(&event))).await;
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap();
}

/// `deliver_to` the EndpointSlice watch.
async fn deliver(script: &Arc<Mutex<Script>>, rx: &mut mpsc::UnboundedReceiver<()>, event: Value) {
    deliver_to(script, rx, "endpointslices", event).await;
}

/// A MODIFIED event of `object`.
fn modified(object: &Value) -> Value {
    json!({"type": "MODIFIED", "object": object})
}

/// The endpoint addresses of shop/web-1 in the tracker's model after a refresh.
fn web1(source: &mut KubeSource, tracker: &mut ChangeTracker) -> Vec<String> {
    follow(source, tracker);
    tracker.model().slices[&ObjKey::new("shop", "web-1")]
        .endpoints
        .iter()
        .map(|e| e.address.unwrap().to_string())
        .collect()
}

/// When the server saw each request of `resource` with `verb`, and what it answered.
fn seen(script: &Mutex<Script>, resource: &str, verb: &str) -> Vec<(std::time::Instant, u16)> {
    let s = script.lock().unwrap();
    s.seen
        .iter()
        .filter(|(r, v, ..)| *r == resource && *v == verb)
        .map(|&(.., at, code)| (at, code))
        .collect()
}

/// The list requests per resource.
fn list_calls(script: &Mutex<Script>) -> BTreeMap<&'static str, usize> {
    script.lock().unwrap().list_calls.clone()
}

/// A refusal of the next `verb` of `resource`.
fn refuse(
    script: &Mutex<Script>,
    resource: &'static str,
    verb: &'static str,
    code: u16,
    retry_after: Option<u64>,
) {
    script.lock().unwrap().refuse.push_back(Refusal { resource, verb, code, retry_after });
}

/// One watch carries event after event (it stays open), then its connection breaks in the middle of the
/// response: the watcher watches again from the last event's resourceVersion, without a list, and what
/// comes on the new watch arrives.
#[tokio::test]
async fn a_watch_stays_open_while_events_flow_and_a_reset_mid_stream_resumes_where_it_was() {
    let script = Arc::new(Mutex::new(script()));
    let (mut source, mut rx, server) = started(&script).await;
    let mut tracker = ChangeTracker::default();
    let (diagnostics, _) = follow(&mut source, &mut tracker);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    assert!(tracker.model().services.contains_key(&ObjKey::new("shop", "web")));
    assert_eq!(tracker.model().nodes["node-1"].zone.as_deref(), Some("a"));

    let two = [("10.244.1.5", "node-1"), ("10.244.2.5", "node-2")];
    deliver(&script, &mut rx, modified(&slice("21", &two))).await;
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.1.5", "10.244.2.5"]);
    deliver(&script, &mut rx, modified(&slice("22", &[("10.244.2.5", "node-2")]))).await;
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.2.5"]);
    assert_eq!(script.lock().unwrap().watch_rvs["endpointslices"], ["20"], "both events on the one watch");
    assert_eq!(open_watches(&script, "endpointslices"), 1);

    assert!(reset(&script, "endpointslices"), "a watch to break");
    let sc = script.clone();
    wait_for(move || sc.lock().unwrap().watch_rvs["endpointslices"].len() == 2).await;
    assert_eq!(script.lock().unwrap().watch_rvs["endpointslices"][1], "22", "resumed from the last event");
    deliver(&script, &mut rx, modified(&slice("23", &[("10.244.3.5", "node-3")]))).await;
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.3.5"], "the resumed watch delivers");
    assert_eq!(
        list_calls(&script),
        BTreeMap::from([("endpointslices", 1), ("nodes", 1), ("services", 1)]),
        "one list per resource: the broken watch was resumed without a relist"
    );
    drop(source);
    finish(&script, &server);
}

/// 429 with `Retry-After`, as API Priority and Fairness sheds load: on an access review and on the first
/// EndpointSlice list while the agent starts (it waits, it does not fail), and on a watch resumed after a
/// reset. Each is asked again no sooner than the server said, though the watcher's own backoff starts at
/// 800 ms; the watch resumes from where it was, without a relist.
#[tokio::test]
async fn throttled_with_retry_after_the_source_waits_as_told_and_lists_nothing_again() {
    let script = Arc::new(Mutex::new(script()));
    refuse(&script, "selfsubjectaccessreviews", "create", 429, Some(2));
    refuse(&script, "endpointslices", "list", 429, Some(2));
    let (mut source, mut rx, server) = started(&script).await;
    let gap = |at: &[(std::time::Instant, u16)]| at[1].0 - at[0].0;
    let reviews = seen(&script, "selfsubjectaccessreviews", "create");
    assert_eq!(reviews[0].1, 429);
    assert!(gap(&reviews) >= Duration::from_secs(2), "review asked again after {:?}", gap(&reviews));
    let lists = seen(&script, "endpointslices", "list");
    assert_eq!(lists.iter().map(|l| l.1).collect::<Vec<_>>(), [429, 200]);
    assert!(gap(&lists) >= Duration::from_secs(2), "list asked again after {:?}", gap(&lists));
    let mut tracker = ChangeTracker::default();
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.1.5"]);

    // A watch broken, and its resumption throttled for 3 s.
    deliver(&script, &mut rx, modified(&slice("21", &[("10.244.2.5", "node-2")]))).await;
    refuse(&script, "endpointslices", "watch", 429, Some(3));
    assert!(reset(&script, "endpointslices"));
    let sc = script.clone();
    wait_for(move || sc.lock().unwrap().watch_rvs["endpointslices"].len() == 3).await;
    let watches = seen(&script, "endpointslices", "watch");
    assert_eq!(watches.iter().map(|w| w.1).collect::<Vec<_>>(), [200, 429, 200]);
    let waited = watches[2].0 - watches[1].0;
    assert!(waited >= Duration::from_secs(3), "watch asked again after {waited:?}");
    assert_eq!(script.lock().unwrap().watch_rvs["endpointslices"], ["20", "21", "21"]);
    // Meanwhile and after, the last state holds, and the resumed watch delivers.
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.2.5"]);
    deliver(&script, &mut rx, modified(&slice("22", &[("10.244.3.5", "node-3")]))).await;
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.3.5"]);
    assert_eq!(list_calls(&script)["endpointslices"], 2, "the refused first list and its retry, no relist");
    finish(&script, &server);
}

/// Server errors: a 500 on the first Service list (listed again), an ERROR event with code 500 in the
/// middle of the EndpointSlice watch (the API server ends the watch after one: watched again from the last
/// resourceVersion), and a 503 with `Retry-After` on that watch's resumption (waited, then resumed from the
/// same resourceVersion). No relist of the slices, and the last state holds throughout.
#[tokio::test]
async fn server_errors_on_a_list_a_watch_start_and_mid_stream_are_retried_and_lose_nothing() {
    let script = Arc::new(Mutex::new(script()));
    refuse(&script, "services", "list", 500, None);
    let (mut source, mut rx, server) = started(&script).await;
    let lists = seen(&script, "services", "list");
    assert_eq!(lists.iter().map(|l| l.1).collect::<Vec<_>>(), [500, 200]);
    let mut tracker = ChangeTracker::default();
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.1.5"]);
    assert!(tracker.model().services.contains_key(&ObjKey::new("shop", "web")));

    deliver(&script, &mut rx, modified(&slice("21", &[("10.244.2.5", "node-2")]))).await;
    refuse(&script, "endpointslices", "watch", 503, Some(1));
    let error = json!({"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                   "reason": "InternalError", "code": 500,
                                                   "message": "Internal error occurred: etcd timed out"}});
    assert!(send(&script, "endpointslices", &[error]));
    assert!(end(&script, "endpointslices"));
    let sc = script.clone();
    wait_for(move || sc.lock().unwrap().watch_rvs["endpointslices"].len() == 3).await;
    let watches = seen(&script, "endpointslices", "watch");
    assert_eq!(watches.iter().map(|w| w.1).collect::<Vec<_>>(), [200, 503, 200]);
    assert!(watches[2].0 - watches[1].0 >= Duration::from_secs(1), "Retry-After: 1 honoured");
    assert_eq!(script.lock().unwrap().watch_rvs["endpointslices"], ["20", "21", "21"]);
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.2.5"], "the last state holds");
    deliver(&script, &mut rx, modified(&slice("22", &[("10.244.3.5", "node-3")]))).await;
    assert_eq!(web1(&mut source, &mut tracker), ["10.244.3.5"]);
    assert_eq!(
        list_calls(&script),
        BTreeMap::from([("endpointslices", 1), ("nodes", 1), ("services", 2)]),
        "only the failed Service list was asked again"
    );
    finish(&script, &server);
}

#[tokio::test]
async fn an_object_that_stops_converting_keeps_its_last_good_state() {
    let script = Arc::new(Mutex::new(script()));
    let (mut source, mut rx, server) = started(&script).await;
    let mut tracker = ChangeTracker::default();
    assert!(follow(&mut source, &mut tracker).0.is_empty());
    // Now the slice changes into something that does not convert.
    let mut bad = slice("21", &[("10.244.9.9", "node-9")]);
    bad["endpoints"][0]["addresses"][0] = json!("not-an-ip");
    deliver(&script, &mut rx, json!({"type": "MODIFIED", "object": bad})).await;
    let (diagnostics, stale) = follow(&mut source, &mut tracker);
    let id = ObjectId::new(Kind::EndpointSlice, ObjKey::new("shop", "web-1"));
    let d = &diagnostics[0];
    assert_eq!(d.origin, Origin::Api(id.clone()));
    assert_eq!(d.field.as_deref(), Some("endpoints[0].addresses[0]"));
    assert!(d.to_string().starts_with("EndpointSlice shop/web-1 field endpoints[0].addresses[0]: "), "{d}");
    assert_eq!(stale, [Origin::Api(id)]);
    let ep = &tracker.model().slices[&ObjKey::new("shop", "web-1")].endpoints[0];
    assert_eq!(ep.address.unwrap().to_string(), "10.244.1.5", "last good version kept");
    // The next refresh still reports it (every problem the input has now), and hands over nothing.
    let r = source.refresh().unwrap();
    assert!(r.changes.is_empty());
    assert_eq!(r.diagnostics.len(), 1);
    finish(&script, &server);
}

#[tokio::test]
async fn after_the_first_refresh_only_changed_objects_are_handed_over() {
    let script = Arc::new(Mutex::new(script()));
    let (mut source, mut rx, server) = started(&script).await;
    let first = source.refresh().unwrap();
    assert!(matches!(&first.changes, Changes::All(m) if m.services.len() == 1 && m.slices.len() == 1));
    // Nothing changed: nothing handed over (and nothing converted again).
    assert!(source.refresh().unwrap().changes.is_empty());

    let changed = slice("31", &[("10.244.3.3", "node-1")]);
    deliver(&script, &mut rx, json!({"type": "MODIFIED", "object": changed})).await;
    // Received, not taken yet: kube-proxy's `endpoint_changes_pending` reads 1 until the refresh.
    let pending = source.pending().expect("the API server source has a queue");
    let queued = |p: &tierlb::source::PendingChanges| {
        use std::sync::atomic::Ordering::Relaxed;
        (p.services.load(Relaxed), p.endpoint_slices.load(Relaxed))
    };
    assert_eq!(queued(&pending), (0, 1));
    let r = source.refresh().unwrap();
    assert_eq!(queued(&pending), (0, 0));
    let Changes::Objects { removed, upserted } = r.changes else { panic!("a difference, not a new model") };
    assert!(removed.is_empty());
    match upserted.as_slice() {
        [Object::EndpointSlice(s)] => {
            assert_eq!(s.key, ObjKey::new("shop", "web-1"));
            assert_eq!(s.endpoints[0].address.unwrap().to_string(), "10.244.3.3");
        }
        other => panic!("expected the one slice, got {other:?}"),
    }

    let gone = slice("32", &[("10.244.3.3", "node-1")]);
    deliver(&script, &mut rx, json!({"type": "DELETED", "object": gone})).await;
    let r = source.refresh().unwrap();
    let Changes::Objects { removed, upserted } = r.changes else { panic!("a difference, not a new model") };
    assert!(upserted.is_empty());
    assert!(
        matches!(removed.as_slice(), [Object::EndpointSlice(s)] if s.key == ObjKey::new("shop", "web-1"))
    );
    finish(&script, &server);
}

#[tokio::test]
async fn one_watch_event_hands_over_one_object_and_a_relist_removes_what_it_no_longer_lists() {
    let mut s = script();
    let web1 = slice("20", &[("10.244.1.5", "node-1")]);
    let web2 = named_slice("web-2", "20", &[("10.244.2.5", "node-2")]);
    s.lists.insert("endpointslices", (json!([web1, web2]), "20"));
    let script = Arc::new(Mutex::new(s));
    let (mut source, mut rx, server) = started(&script).await;
    let first = source.refresh().unwrap();
    assert!(matches!(&first.changes, Changes::All(m) if m.slices.len() == 2));

    // One event for one of the two slices: exactly that slice, in its new version.
    let changed = slice("31", &[("10.244.3.3", "node-1")]);
    deliver(&script, &mut rx, json!({"type": "MODIFIED", "object": changed.clone()})).await;
    let r = source.refresh().unwrap();
    let Changes::Objects { removed, upserted } = r.changes else { panic!("a difference, not a new model") };
    assert!(removed.is_empty(), "{removed:?}");
    match upserted.as_slice() {
        [Object::EndpointSlice(s)] => {
            assert_eq!(s.key, ObjKey::new("shop", "web-1"));
            assert_eq!(s.endpoints[0].address.unwrap().to_string(), "10.244.3.3");
        }
        other => panic!("expected the one slice, got {other:?}"),
    }

    // The watch expires (410 Gone): the watcher lists again, and web-2 was deleted meanwhile (no DELETED
    // event ever came). The relist names web-1 at the version already converted.
    script.lock().unwrap().lists.insert("endpointslices", (json!([changed]), "40"));
    let expired = json!({"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                     "reason": "Expired", "code": 410,
                                                     "message": "too old resource version"}});
    assert!(send(&script, "endpointslices", &[expired]));
    assert!(end(&script, "endpointslices"), "the API server ends a watch after an ERROR event");
    let (mut removed, mut upserted) = (Vec::new(), Vec::new());
    wait_for(|| {
        match source.refresh().unwrap().changes {
            Changes::Objects { removed: r, upserted: u } => {
                removed.extend(r);
                upserted.extend(u);
            }
            Changes::All(_) => panic!("a relist is a difference, not a new model"),
        }
        !removed.is_empty()
    })
    .await;
    assert!(
        matches!(removed.as_slice(), [Object::EndpointSlice(s)] if s.key == ObjKey::new("shop", "web-2")),
        "{removed:?}"
    );
    assert!(upserted.is_empty(), "web-1 listed again unchanged: {upserted:?}");
    assert_eq!(script.lock().unwrap().list_calls["endpointslices"], 2, "the expired watch made one relist");
    // And the watch starts again from the new list.
    let sc = script.clone();
    wait_for(move || sc.lock().unwrap().watch_rvs["endpointslices"].last().map(String::as_str) == Some("40"))
        .await;
    finish(&script, &server);
}

#[tokio::test]
async fn a_long_list_is_read_page_by_page_and_a_bookmark_moves_the_resume_point() {
    let mut s = script();
    s.lists.insert("services", (edges::many_services(), "10"));
    let script = Arc::new(Mutex::new(s));
    let (mut source, _rx, server) = started(&script).await;
    let first = source.refresh().unwrap();
    let Changes::All(model) = first.changes else { panic!("the first refresh hands over the whole model") };
    assert_eq!(model.services.len(), 1_201);
    {
        let s = script.lock().unwrap();
        assert_eq!(s.list_calls["services"], 3, "three pages");
    }
    // The Service watch sends only a BOOKMARK, then ends (as at timeoutSeconds): the resumed watch must start
    // at the bookmark's resourceVersion (the server checks), and the bookmark changes nothing.
    let bookmark = json!({"type": "BOOKMARK",
                          "object": {"apiVersion": "v1", "kind": "Service", "metadata": {"resourceVersion": "50"}}});
    wait_for(|| send(&script, "services", std::slice::from_ref(&bookmark))).await;
    assert!(end(&script, "services"));
    let sc = script.clone();
    wait_for(move || sc.lock().unwrap().watch_rvs.get("services").is_some_and(|v| v.len() >= 2)).await;
    assert_eq!(script.lock().unwrap().watch_rvs["services"][..2], ["10".to_owned(), "50".to_owned()]);
    assert!(source.refresh().unwrap().changes.is_empty(), "a bookmark is no change");
    finish(&script, &server);
}
