//! The fake API server: HTTP/1.1 on loopback (hyper), serving exactly the requests the agent should make
//! (access reviews; list and watch of Services, EndpointSlices and its own Node with kube-proxy's
//! selectors) and recording everything else as a failure of the test, with what it saw (selectors, watch
//! resourceVersions, list calls, reviews, when each request came).
//!
//! A watch is a chunked response that stays open: the test sends events into it (`send`), ends it as the
//! API server does at `timeoutSeconds` (`end`), or breaks the connection in the middle of it (`reset`). The
//! faults a real API server cannot be made to give on demand are scripted per request (`Refusal`): 429 with
//! `Retry-After` worded as API Priority and Fairness words it, and 5xx.
use std::{
    collections::{BTreeMap, VecDeque},
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Instant,
};

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};

type Body = BoxBody<Bytes, std::io::Error>;

/// The sending end of one open watch.
type Watch = mpsc::UnboundedSender<Result<Frame<Bytes>, std::io::Error>>;

/// An answer given instead of serving the next request of `resource` ("selfsubjectaccessreviews" for the
/// access reviews) with `verb` ("list", "watch", "create").
#[derive(Clone, Debug)]
pub(crate) struct Refusal {
    pub(crate) resource: &'static str,
    pub(crate) verb: &'static str,
    /// 429, or a 5xx.
    pub(crate) code: u16,
    /// The `Retry-After` header, in seconds.
    pub(crate) retry_after: Option<u64>,
}

/// What the fake API server answers, and what it saw.
#[derive(Default)]
pub(crate) struct Script {
    /// Resources (plural) whose access review says no, as (resource, verb).
    pub(crate) denied: Vec<(String, String)>,
    pub(crate) lists: BTreeMap<&'static str, (Value, &'static str)>,
    /// Watches open now, per resource, oldest first.
    pub(crate) open: BTreeMap<&'static str, Vec<Watch>>,
    /// Answers given, in order, to the next requests they match, instead of serving them.
    pub(crate) refuse: VecDeque<Refusal>,
    /// Every request of the agent's, as (resource, verb, when it came, the code answered).
    pub(crate) seen: Vec<(&'static str, &'static str, Instant, u16)>,
    /// resourceVersion query parameter of each watch request, per resource.
    pub(crate) watch_rvs: BTreeMap<&'static str, Vec<String>>,
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
    /// Access reviews are never answered.
    pub(crate) hang_reviews: bool,
    /// (API group, resource, verb) of every access review asked.
    pub(crate) reviews: Vec<(String, String, String)>,
    /// Requests a real API server would not serve as the agent meant them, or that break kube-proxy's
    /// contract (a missing selector, a watch that does not resume where it should): each fails the test in
    /// `finish`.
    pub(crate) unexpected: Vec<String>,
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).map_err(|never: Infallible| match never {}).boxed()
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap()));
    *r.status_mut() = code;
    r.headers_mut().insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
    r
}

/// A failure Status, as the API server words one.
fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let v = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason,
                   "code": code, "message": message});
    json_response(StatusCode::from_u16(code).unwrap(), &v)
}

/// A refusal's answer: 429 as API Priority and Fairness sends it (`Retry-After`, a plain-text body, no
/// Status: apiserver/pkg/server/filters/maxinflight.go `tooManyRequests`), a 5xx as a Status.
fn refused(r: &Refusal) -> Response<Body> {
    let mut answer = if r.code == 429 {
        let mut a = Response::new(full("Too many requests, please try again later.\n"));
        *a.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        a.headers_mut().insert(http::header::CONTENT_TYPE, "text/plain; charset=utf-8".parse().unwrap());
        a
    } else {
        let reason = if r.code == 503 { "ServiceUnavailable" } else { "InternalError" };
        status(r.code, reason, "the fake API server was told to fail this request")
    };
    if let Some(secs) = r.retry_after {
        answer.headers_mut().insert(http::header::RETRY_AFTER, secs.to_string().parse().unwrap());
    }
    answer
}

/// The events' resourceVersions: the last one is where a resumed watch starts.
fn note_rvs(s: &mut Script, resource: &'static str, events: &[Value]) {
    for e in events {
        if let Some(rv) = e["object"]["metadata"]["resourceVersion"].as_str() {
            s.last_rv.insert(resource, rv.to_owned());
        }
    }
}

fn line(event: &Value) -> Frame<Bytes> {
    let mut text = serde_json::to_vec(event).unwrap();
    text.push(b'\n');
    Frame::data(Bytes::from(text))
}

/// Send these events on the newest open watch of `resource` (it stays open); false when none is open.
pub(crate) fn send(script: &Mutex<Script>, resource: &'static str, events: &[Value]) -> bool {
    let mut s = script.lock().unwrap();
    while let Some(watch) = s.open.get_mut(resource).and_then(Vec::pop) {
        if events.iter().all(|e| watch.unbounded_send(Ok(line(e))).is_ok()) {
            s.open.get_mut(resource).unwrap().push(watch);
            note_rvs(&mut s, resource, events);
            return true;
        }
        // The agent closed that one: try the one before.
    }
    false
}

/// How many watches of `resource` are open.
pub(crate) fn open_watches(script: &Mutex<Script>, resource: &'static str) -> usize {
    let mut s = script.lock().unwrap();
    let open = s.open.entry(resource).or_default();
    open.retain(|w| !w.is_closed());
    open.len()
}

/// End the newest open watch of `resource` cleanly, as the API server ends one at `timeoutSeconds` (the
/// response's last chunk); false when none is open.
pub(crate) fn end(script: &Mutex<Script>, resource: &'static str) -> bool {
    script.lock().unwrap().open.get_mut(resource).and_then(Vec::pop).is_some()
}

/// Break the connection of the newest open watch of `resource` in the middle of its response (no last
/// chunk: the client reads an incomplete body), as a restarting API server or a load balancer in front of
/// it does; false when none is open.
pub(crate) fn reset(script: &Mutex<Script>, resource: &'static str) -> bool {
    let watch = script.lock().unwrap().open.get_mut(resource).and_then(Vec::pop);
    watch.is_some_and(|w| w.unbounded_send(Err(std::io::Error::other("connection reset mid-watch"))).is_ok())
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

/// 410 Gone with reason Expired, as an API server answers a continue token or resourceVersion it no longer
/// has.
fn expired(message: &str) -> Response<Body> {
    status(410, "Expired", message)
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
fn review(uri: &http::Uri, body: &[u8], script: &Mutex<Script>) -> Response<Body> {
    let review: Value = serde_json::from_slice(body).unwrap();
    let attrs = &review["spec"]["resourceAttributes"];
    let field = |k: &str| attrs[k].as_str().unwrap_or_default().to_owned();
    let (group, res, verb) = (field("group"), field("resource"), field("verb"));
    let mut s = script.lock().unwrap();
    if !params(uri).is_empty() || review["apiVersion"] != "authorization.k8s.io/v1" {
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
    json_response(StatusCode::CREATED, &answer)
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

/// The refusal scripted for this request, if any (taken from the queue), noted in `seen` either way.
fn refusal(s: &mut Script, resource: &'static str, verb: &'static str) -> Option<Refusal> {
    let at = s.refuse.iter().position(|r| r.resource == resource && r.verb == verb);
    let r = at.and_then(|i| s.refuse.remove(i));
    s.seen.push((resource, verb, Instant::now(), r.as_ref().map_or(200, |r| r.code)));
    r
}

/// One list page (`limit` objects from `continue`), as the API server serves a chunked list.
fn list_page(s: &mut Script, resource: &'static str, p: &BTreeMap<String, String>) -> Response<Body> {
    if p.contains_key("continue") && s.expire_continues > 0 {
        s.expire_continues -= 1;
        return expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a \
             new list without the continue parameter.",
        );
    }
    let (list, rv) = s.lists[resource].clone();
    s.last_rv.insert(resource, rv.to_owned());
    let list: Vec<Value> = list.as_array().unwrap().iter().filter(|i| selected(p, i)).cloned().collect();
    // `continue` says where the next page starts (here an offset; the API server's token is opaque), the
    // last page has none.
    let start: usize = p.get("continue").map_or(0, |c| c.parse().unwrap());
    let end = p.get("limit").map_or(list.len(), |l| (start + l.parse::<usize>().unwrap()).min(list.len()));
    let mut meta = json!({"resourceVersion": rv});
    if end < list.len() {
        meta["continue"] = json!(end.to_string());
    }
    json_response(
        StatusCode::OK,
        &json!({"apiVersion": "v1", "kind": "List", "metadata": meta, "items": list[start..end]}),
    )
}

async fn handle(req: Request<Incoming>, script: Arc<Mutex<Script>>) -> Result<Response<Body>, Infallible> {
    let uri = req.uri().clone();
    let (method, path) = (req.method().clone(), uri.path().to_owned());
    if method == http::Method::POST && path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let (hang, refused_with) = {
            let mut s = script.lock().unwrap();
            (s.hang_reviews, refusal(&mut s, "selfsubjectaccessreviews", "create"))
        };
        if hang {
            futures::future::pending::<()>().await;
        }
        return Ok(match refused_with {
            Some(r) => refused(&r),
            None => review(&uri, &body, &script),
        });
    }
    let served = SERVED.iter().find(|(p, ..)| *p == path).filter(|_| method == http::Method::GET);
    let Some(&(_, resource, _, selector)) = served else {
        script.lock().unwrap().unexpected.push(format!("{method} {uri}"));
        return Ok(status(404, "NotFound", &format!("{method} {path}")));
    };
    let p = params(&uri);
    let watch = p.get("watch").map(String::as_str) == Some("true");
    let verb = if watch { "watch" } else { "list" };
    let hang = {
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
        } else {
            *s.list_calls.entry(resource).or_default() += 1;
            s.continues.entry(resource).or_default().push(p.get("continue").cloned());
        }
        if let Some(r) = refusal(&mut s, resource, verb) {
            return Ok(refused(&r));
        }
        !watch && s.hang_lists.contains(&resource)
    };
    if hang {
        futures::future::pending::<()>().await;
    }
    let mut s = script.lock().unwrap();
    if !watch {
        return Ok(list_page(&mut s, resource, &p));
    }
    let (tx, rx) = mpsc::unbounded();
    s.open.entry(resource).or_default().push(tx);
    let mut r = Response::new(StreamBody::new(rx).boxed());
    r.headers_mut().insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
    Ok(r)
}

/// The fake API server on a loopback port, serving `script` until the task is aborted (`finish`).
pub(crate) async fn start(script: Arc<Mutex<Script>>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            while connections.try_join_next().is_some() {}
            let script = script.clone();
            let service = hyper::service::service_fn(move |req| handle(req, script.clone()));
            connections.spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                // An error here is the connection's end (a reset watch, the client gone).
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    (addr, server)
}

/// End of a test: the server saw nothing it would not serve as meant, and every collection the agent listed
/// or watched was covered by an access review of that verb in the resource's own API group first.
pub(crate) fn finish(script: &Mutex<Script>, server: &tokio::task::JoinHandle<()>) {
    server.abort();
    let s = script.lock().unwrap();
    assert!(s.unexpected.is_empty(), "requests the API server would not serve as meant: {:#?}", s.unexpected);
    assert!(s.refuse.is_empty(), "scripted refusals never asked for: {:?}", s.refuse);
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
