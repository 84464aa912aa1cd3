//! The `--kube` source against a scripted API server (kube-rs style `tower_test::mock`): access review, the
//! initial lists (in pages of the watcher's `limit`), watch events as changes, bookmarks moving the resume
//! point, a watch that drops and is resumed from its resourceVersion without a relist (list calls counted),
//! an expired watch and the relist after it, and a missing RBAC rule reported by name. The server
//! (`server.rs`) is strict: any request it would not serve as the agent means it (an unknown path, a missing
//! or other selector, a watch without bookmarks or not resuming at the last resourceVersion, an access
//! review in the wrong API group) fails the test. `edges.rs`: an expired continue token (410, the list starts
//! over), an object labelled away arriving as a deletion, a first list or access review that never comes.
//!
//! What the mock does not do that an API server does: streaming lists (`sendInitialEvents`), the
//! `resourceVersionMatch` rules, field selectors other than `metadata.name=`, label selectors other than
//! `!key`, throttling (429 with Retry-After), watches the server itself times out after `timeoutSeconds`.
use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{Request, Response};
use kube::{Client, client::Body};
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
mod faces;
mod server;

use server::{Script, finish, release, serve};

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
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve(handle, script.clone()));
    let (tx, rx) = mpsc::unbounded_channel();
    let client = Client::new(svc, "default");
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

/// Send one EndpointSlice watch event and wait until the source has signalled it.
async fn deliver(script: &Arc<Mutex<Script>>, rx: &mut mpsc::UnboundedReceiver<()>, event: Value) {
    while rx.try_recv().is_ok() {}
    let sc = script.clone();
    wait_for(move || release(&sc, "endpointslices", vec![event.clone()])).await;
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap();
}

#[tokio::test]
async fn kube_source_lists_watches_and_resumes_a_dropped_watch() {
    let mut s = script();
    // First watch of the slices: one change, then the connection drops. The second (resumed) watch: another.
    s.watches.insert(
        "endpointslices",
        VecDeque::from([
            vec![json!({"type": "MODIFIED", "object": slice("21", &[("10.244.1.5", "node-1"), ("10.244.2.5", "node-2")])})],
            vec![json!({"type": "MODIFIED", "object": slice("22", &[("10.244.2.5", "node-2")])})],
        ]),
    );
    let script = Arc::new(Mutex::new(s));
    let (mut source, mut rx, server) = started(&script).await;

    let mut tracker = ChangeTracker::default();
    let (diagnostics, _) = follow(&mut source, &mut tracker);
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let m = tracker.model();
    assert!(m.services.contains_key(&ObjKey::new("shop", "web")));
    assert_eq!(m.nodes["node-1"].zone.as_deref(), Some("a"));

    // Events arrive (the change channel fires) and the resumed watch delivers the last state.
    let key = ObjKey::new("shop", "web-1");
    wait_for(|| {
        follow(&mut source, &mut tracker);
        let ips: Vec<String> =
            tracker.model().slices[&key].endpoints.iter().map(|e| e.address.unwrap().to_string()).collect();
        ips == ["10.244.2.5"]
    })
    .await;
    assert!(rx.try_recv().is_ok(), "changes were signalled");
    let rvs = script.lock().unwrap().watch_rvs["endpointslices"].clone();
    assert!(rvs.len() >= 3, "watch, resumed watch, and the one left open: {rvs:?}");
    assert_eq!(rvs[0], "20", "the first watch starts at the list's resourceVersion");
    assert_eq!(rvs[1], "21", "the dropped watch resumes from the last event");
    let lists = script.lock().unwrap().list_calls.clone();
    assert_eq!(
        lists,
        BTreeMap::from([("endpointslices", 1), ("nodes", 1), ("services", 1)]),
        "one list per resource: the dropped watch was resumed without a relist"
    );
    drop(source);
    finish(&script, &server);
}

#[tokio::test]
async fn a_missing_rbac_rule_is_named() {
    let mut s = script();
    s.denied.push(("endpointslices".into(), "watch".into()));
    let script = Arc::new(Mutex::new(s));
    let (source, _rx, server) = start(&script).await;
    let err = source.err().expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("may not watch endpointslices.discovery.k8s.io")
            && msg.contains("apiGroups [\"discovery.k8s.io\"]"),
        "{msg}"
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
    let sc = script.clone();
    wait_for(move || release(&sc, "endpointslices", vec![expired.clone()])).await;
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
async fn kube_proxys_label_selector_is_sent_on_every_service_and_slice_list_and_watch() {
    let mut s = script();
    // Two more Services and a slice the server holds, each with a label kube-proxy's selector leaves out.
    let mut router = service();
    router["metadata"]["name"] = json!("routed");
    router["metadata"]["labels"] = json!({"service.kubernetes.io/service-proxy-name": "kube-router"});
    let mut marked = service();
    marked["metadata"]["name"] = json!("marked");
    marked["metadata"]["labels"] = json!({"service.kubernetes.io/headless": ""});
    s.lists.insert("services", (json!([service(), router, marked]), "10"));
    let mut headless = named_slice("web-headless", "20", &[("10.244.7.7", "node-1")]);
    headless["metadata"]["labels"]["service.kubernetes.io/headless"] = json!("");
    s.lists.insert("endpointslices", (json!([slice("20", &[("10.244.1.5", "node-1")]), headless]), "20"));
    let script = Arc::new(Mutex::new(s));
    let (mut source, _rx, server) = started(&script).await;
    let mut tracker = ChangeTracker::default();
    assert!(follow(&mut source, &mut tracker).0.is_empty());
    let m = tracker.model();
    assert_eq!(m.services.keys().collect::<Vec<_>>(), [&ObjKey::new("shop", "web")]);
    assert_eq!(m.slices.values().map(|s| &*s.key.name).collect::<Vec<_>>(), ["web-1"]);

    let want = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name";
    let sc = script.clone();
    wait_for(move || {
        let s = sc.lock().unwrap();
        ["services", "endpointslices"]
            .iter()
            .all(|r| s.selectors.get(r).is_some_and(|v| v.iter().any(|(verb, _)| *verb == "watch")))
    })
    .await;
    let s = script.lock().unwrap();
    for resource in ["services", "endpointslices"] {
        let seen = &s.selectors[resource];
        for verb in ["list", "watch"] {
            assert!(seen.iter().any(|(v, _)| *v == verb), "{resource}: no {verb} in {seen:?}");
        }
        for (verb, selector) in seen {
            assert_eq!(selector.as_deref(), Some(want), "{resource} {verb}");
        }
    }
    // The Node watch is kube-proxy's other informer factory: no label selector.
    assert!(s.selectors["nodes"].iter().all(|(_, sel)| sel.is_none()), "{:?}", s.selectors["nodes"]);
    drop(s);
    finish(&script, &server);
}

#[tokio::test]
async fn a_long_list_is_read_page_by_page_and_a_bookmark_moves_the_resume_point() {
    let mut s = script();
    s.lists.insert("services", (edges::many_services(), "10"));
    // The first Service watch sends only a BOOKMARK, then drops: the resumed watch must start at the
    // bookmark's resourceVersion (the server checks), and the bookmark changes nothing.
    let bookmark = json!({"type": "BOOKMARK",
                          "object": {"apiVersion": "v1", "kind": "Service", "metadata": {"resourceVersion": "50"}}});
    s.watches.insert("services", VecDeque::from([vec![bookmark]]));
    let script = Arc::new(Mutex::new(s));
    let (mut source, _rx, server) = started(&script).await;
    let first = source.refresh().unwrap();
    let Changes::All(model) = first.changes else { panic!("the first refresh hands over the whole model") };
    assert_eq!(model.services.len(), 1_201);
    {
        let s = script.lock().unwrap();
        assert_eq!(s.list_calls["services"], 3, "three pages");
    }
    let sc = script.clone();
    wait_for(move || sc.lock().unwrap().watch_rvs.get("services").is_some_and(|v| v.len() >= 2)).await;
    assert_eq!(script.lock().unwrap().watch_rvs["services"][..2], ["10".to_owned(), "50".to_owned()]);
    assert!(source.refresh().unwrap().changes.is_empty(), "a bookmark is no change");
    finish(&script, &server);
}
