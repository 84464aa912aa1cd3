//! The fake API server: serves exactly the requests the agent should make (access reviews; list and watch
//! of Services, EndpointSlices and its own Node with kube-proxy's selectors) and records everything else as
//! a failure of the test, with what it saw (selectors, watch resourceVersions, list calls, reviews).
use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

pub(crate) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// What the fake API server answers, and what it saw.
#[derive(Default)]
pub(crate) struct Script {
    /// Resources (plural) whose access review says no, as (resource, verb).
    pub(crate) denied: Vec<(String, String)>,
    pub(crate) lists: BTreeMap<&'static str, (Value, &'static str)>,
    /// Per resource, the bodies of successive watch responses (NDJSON events); a response ends, which drops
    /// the watch. With none left, the watch hangs open.
    pub(crate) watches: BTreeMap<&'static str, VecDeque<Vec<Value>>>,
    /// resourceVersion query parameter of each watch request, per resource.
    pub(crate) watch_rvs: BTreeMap<&'static str, Vec<String>>,
    /// Watches left open, waiting for `release`.
    pub(crate) hanging: BTreeMap<&'static str, Vec<tower_test::mock::SendResponse<Response<Body>>>>,
    /// labelSelector query parameter (decoded) of each request, per resource, as ("list" or "watch", selector).
    pub(crate) selectors: BTreeMap<&'static str, Vec<(&'static str, Option<String>)>>,
    /// List requests per resource (a watch resumed without a relist leaves this at 1).
    pub(crate) list_calls: BTreeMap<&'static str, usize>,
    /// The last resourceVersion the server handed out per resource (a list's, or an event's): where the next
    /// watch must start.
    pub(crate) last_rv: BTreeMap<&'static str, String>,
    /// How many `continue` requests to answer with 410 Expired, as an API server answers a token older than
    /// its compaction window ("The provided continue parameter is too old").
    pub(crate) expire_continues: usize,
    /// `continue` parameter of each list request, per resource (`None`: a first page).
    pub(crate) continues: BTreeMap<&'static str, Vec<Option<String>>>,
    /// Resources whose list requests are never answered (an API server that lists forever).
    pub(crate) hang_lists: Vec<&'static str>,
    /// The list requests held open for `hang_lists`.
    pub(crate) hung_lists: Vec<tower_test::mock::SendResponse<Response<Body>>>,
    /// Access reviews are never answered.
    pub(crate) hang_reviews: bool,
    /// The access reviews held open for `hang_reviews`.
    pub(crate) hung_reviews: Vec<tower_test::mock::SendResponse<Response<Body>>>,
    /// (API group, resource, verb) of every access review asked.
    pub(crate) reviews: Vec<(String, String, String)>,
    /// Requests a real API server would not serve as the agent meant them, or that break kube-proxy's
    /// contract (a missing selector, a watch that does not resume where it should): each fails the test in
    /// `finish`.
    pub(crate) unexpected: Vec<String>,
}

pub(crate) fn ndjson(events: Vec<Value>) -> Body {
    let mut body = Vec::new();
    for e in events {
        body.extend(serde_json::to_vec(&e).unwrap());
        body.push(b'\n');
    }
    Body::from(body)
}

/// The events' resourceVersions: the last one is where a resumed watch starts.
fn note_rvs(s: &mut Script, resource: &'static str, events: &[Value]) {
    for e in events {
        if let Some(rv) = e["object"]["metadata"]["resourceVersion"].as_str() {
            s.last_rv.insert(resource, rv.to_owned());
        }
    }
}

/// Answer a watch that is hanging open with these events (then it ends, as a dropped watch does).
pub(crate) fn release(script: &Mutex<Script>, resource: &'static str, events: Vec<Value>) -> bool {
    let mut s = script.lock().unwrap();
    match s.hanging.get_mut(resource).and_then(Vec::pop) {
        Some(send) => {
            note_rvs(&mut s, resource, &events);
            send.send_response(Response::new(ndjson(events)));
            true
        }
        None => false,
    }
}

/// kube-proxy's label selector for Services and EndpointSlices (cmd/kube-proxy/app/server.go).
const KUBE_PROXY_SELECTOR: &str = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name";

/// The collections the API server serves to the agent: (path, resource, API group, the selector the agent
/// must send: ("labelSelector" | "fieldSelector", value)).
const SERVED: [(&str, &str, &str, (&str, &str)); 3] = [
    ("/api/v1/services", "services", "", ("labelSelector", KUBE_PROXY_SELECTOR)),
    (
        "/apis/discovery.k8s.io/v1/endpointslices",
        "endpointslices",
        "discovery.k8s.io",
        ("labelSelector", KUBE_PROXY_SELECTOR),
    ),
    ("/api/v1/nodes", "nodes", "", ("fieldSelector", "metadata.name=node-1")),
];

/// Query parameters a list or watch of the agent's may carry.
const KNOWN_PARAMS: [&str; 8] = [
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "watch",
    "timeoutSeconds",
    "allowWatchBookmarks",
    "resourceVersion",
];

/// The query string, decoded, by key.
fn params(uri: &http::Uri) -> BTreeMap<String, String> {
    form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()).into_owned().collect()
}

/// 404 with a Status, as an API server answers a path it does not serve.
fn not_found(what: &str) -> Response<Body> {
    let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound",
                        "code": 404, "message": what});
    let mut r = Response::new(Body::from(serde_json::to_vec(&status).unwrap()));
    *r.status_mut() = http::StatusCode::NOT_FOUND;
    r
}

/// 410 Gone with reason Expired, as an API server answers a continue token or resourceVersion it no longer
/// has.
pub(crate) fn expired(message: &str) -> Response<Body> {
    let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Expired",
                        "code": 410, "message": message});
    let mut r = Response::new(Body::from(serde_json::to_vec(&status).unwrap()));
    *r.status_mut() = http::StatusCode::GONE;
    r
}

/// What an API server's selectors keep: of label selectors only the `!key` (DoesNotExist) requirements,
/// of field selectors only `metadata.name=`, which is all the agent's have (`serve` refuses any other).
fn selected(params: &BTreeMap<String, String>, item: &Value) -> bool {
    let labels_ok = params.get("labelSelector").is_none_or(|sel| {
        sel.split(',')
            .all(|req| req.strip_prefix('!').is_some_and(|k| item["metadata"]["labels"].get(k).is_none()))
    });
    let fields_ok = params.get("fieldSelector").is_none_or(|sel| {
        sel.strip_prefix("metadata.name=").is_some_and(|name| item["metadata"]["name"] == name)
    });
    labels_ok && fields_ok
}

/// An access review: answered from `denied`; a review of a resource in another API group than the one that
/// serves it is a mistake of the agent's (a real API server would say no: no rule grants it).
async fn review(req: Request<Body>, script: &Mutex<Script>) -> Response<Body> {
    let uri = req.uri().clone();
    let body = req.into_body().collect_bytes().await.unwrap();
    let review: Value = serde_json::from_slice(&body).unwrap();
    let attrs = &review["spec"]["resourceAttributes"];
    let field = |k: &str| attrs[k].as_str().unwrap_or_default().to_owned();
    let (group, res, verb) = (field("group"), field("resource"), field("verb"));
    let mut s = script.lock().unwrap();
    if !params(&uri).is_empty() || review["apiVersion"] != "authorization.k8s.io/v1" {
        s.unexpected.push(format!("access review {uri} {}", review["apiVersion"]));
    }
    let right_group = SERVED.iter().any(|(_, r, g, _)| *r == res && *g == group);
    if !right_group {
        s.unexpected
            .push(format!("access review of {verb} {res} in API group {group:?}: not where it is served"));
    }
    let allowed = right_group && !s.denied.contains(&(res.clone(), verb.clone()));
    s.reviews.push((group, res, verb));
    let mut answer = review.clone();
    answer["status"] = json!({"allowed": allowed});
    Response::new(Body::from(serde_json::to_vec(&answer).unwrap()))
}

/// What is wrong with a list or watch of `resource`'s collection, if anything: unknown parameters, a missing
/// or other selector, a watch without bookmarks or not starting where the last answer left off.
fn misfit(
    s: &Script,
    resource: &'static str,
    selector: (&str, &str),
    p: &BTreeMap<String, String>,
) -> Option<String> {
    let watch = p.get("watch").map(String::as_str) == Some("true");
    let other = if selector.0 == "labelSelector" { "fieldSelector" } else { "labelSelector" };
    if let Some(k) = p.keys().find(|k| !KNOWN_PARAMS.contains(&k.as_str())) {
        Some(format!("unknown parameter {k}"))
    } else if p.get(selector.0).map(String::as_str) != Some(selector.1) || p.contains_key(other) {
        Some(format!(
            "{} {:?}, {other} {:?}: want {}={:?}",
            selector.0,
            p.get(selector.0),
            p.get(other),
            selector.0,
            selector.1
        ))
    } else if watch && p.get("allowWatchBookmarks").map(String::as_str) != Some("true") {
        Some("a watch without allowWatchBookmarks=true".into())
    } else if watch && p.get("resourceVersion") != s.last_rv.get(resource) {
        Some(format!(
            "watch from resourceVersion {:?}, the last handed out was {:?}",
            p.get("resourceVersion"),
            s.last_rv.get(resource)
        ))
    } else if !watch && (p.contains_key("allowWatchBookmarks") || p.contains_key("timeoutSeconds")) {
        Some("watch parameters on a list".into())
    } else {
        None
    }
}

pub(crate) async fn serve(mut handle: Handle, script: Arc<Mutex<Script>>) {
    while let Some((req, send)) = handle.next_request().await {
        let uri = req.uri().clone();
        let (method, path) = (req.method().clone(), uri.path().to_owned());
        if method == http::Method::POST && path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" {
            let send = {
                let mut s = script.lock().unwrap();
                if s.hang_reviews {
                    s.hung_reviews.push(send);
                    None
                } else {
                    Some(send)
                }
            };
            if let Some(send) = send {
                send.send_response(review(req, &script).await);
            }
            continue;
        }
        let served = SERVED.iter().find(|(p, ..)| *p == path).filter(|_| method == http::Method::GET);
        let Some(&(_, resource, _, selector)) = served else {
            script.lock().unwrap().unexpected.push(format!("{method} {uri}"));
            send.send_response(not_found(&format!("{method} {path}")));
            continue;
        };
        let p = params(&uri);
        let watch = p.get("watch").map(String::as_str) == Some("true");
        let verb = if watch { "watch" } else { "list" };
        let mut s = script.lock().unwrap();
        if let Some(why) = misfit(&s, resource, selector, &p) {
            s.unexpected.push(format!("{verb} {resource}: {why} ({uri})"));
        }
        s.selectors.entry(resource).or_default().push((verb, p.get("labelSelector").cloned()));
        if watch {
            s.watch_rvs
                .entry(resource)
                .or_default()
                .push(p.get("resourceVersion").cloned().unwrap_or_default());
            match s.watches.get_mut(resource).and_then(VecDeque::pop_front) {
                Some(events) => {
                    note_rvs(&mut s, resource, &events);
                    send.send_response(Response::new(ndjson(events)));
                }
                None => s.hanging.entry(resource).or_default().push(send),
            }
            continue;
        }
        *s.list_calls.entry(resource).or_default() += 1;
        s.continues.entry(resource).or_default().push(p.get("continue").cloned());
        if s.hang_lists.contains(&resource) {
            s.hung_lists.push(send);
            continue;
        }
        if p.contains_key("continue") && s.expire_continues > 0 {
            s.expire_continues -= 1;
            send.send_response(expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."));
            continue;
        }
        let (list, rv) = s.lists[resource].clone();
        s.last_rv.insert(resource, rv.to_owned());
        let list: Vec<Value> = list.as_array().unwrap().iter().filter(|i| selected(&p, i)).cloned().collect();
        // Pages of `limit` objects, as the API server serves a chunked list: `continue` says where the next
        // page starts (here an offset; the API server's token is opaque), the last page has none.
        let start: usize = p.get("continue").map_or(0, |c| c.parse().unwrap());
        let end =
            p.get("limit").map_or(list.len(), |l| (start + l.parse::<usize>().unwrap()).min(list.len()));
        let mut meta = json!({"resourceVersion": rv});
        if end < list.len() {
            meta["continue"] = json!(end.to_string());
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "metadata": meta, "items": list[start..end]});
        send.send_response(Response::new(Body::from(serde_json::to_vec(&list).unwrap())));
    }
}

/// End of a test: the server saw nothing it would not serve as meant, and every collection the agent listed
/// or watched was covered by an access review of that verb in the resource's own API group first.
pub(crate) fn finish(script: &Mutex<Script>, server: &tokio::task::JoinHandle<()>) {
    server.abort();
    let s = script.lock().unwrap();
    assert!(s.unexpected.is_empty(), "requests the API server would not serve as meant: {:#?}", s.unexpected);
    for (resource, seen) in &s.selectors {
        let group = SERVED.iter().find(|(_, r, ..)| r == resource).unwrap().2;
        for (verb, _) in seen {
            let asked = (group.to_owned(), (*resource).to_owned(), (*verb).to_owned());
            assert!(
                s.reviews.contains(&asked),
                "{verb} {resource} without an access review: {:?}",
                s.reviews
            );
        }
    }
}
