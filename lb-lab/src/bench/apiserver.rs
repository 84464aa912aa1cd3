//! A stand-in for the Kubernetes API server, for measuring the agent's `--kube` path at scale: plain HTTP on
//! loopback, serving what the agent asks for the way the API server answers it. Lists are chunked (`limit`
//! and `continue`, as kube-rs' watcher pages them), watches are chunked event streams (`watch=true`) that
//! carry `BOOKMARK` events when asked (`allowWatchBookmarks=true`) and end after `timeoutSeconds`, and the
//! agent's access reviews are allowed. Objects carry what real ones do beyond tierlb's fields (managedFields,
//! a last-applied-configuration annotation, a uid, timestamps), so what the agent keeps of them is measured,
//! not assumed. Anything else is answered 404 and counted in `unknown`, which the bench reports.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};

/// The resources served: the path prefix the agent lists and watches, and the list's kind.
const RESOURCES: [(&str, &str); 3] = [
    ("/api/v1/services", "ServiceList"),
    ("/apis/discovery.k8s.io/v1/endpointslices", "EndpointSliceList"),
    ("/api/v1/nodes", "NodeList"),
];

/// How often an idle watch gets a bookmark (the API server sends them about once a minute; faster here so
/// a short run sees them).
const BOOKMARK_EVERY: Duration = Duration::from_secs(2);

/// One resource's objects, serialised once (serving 1,000,000 endpoints must not cost the bench the time it
/// measures), and the watch streams open on it.
#[derive(Default)]
struct Resource {
    items: Vec<String>,
    /// Each item's index by `metadata.name`: a change replaces its object without searching 100,000 of them
    /// (time the edit figures would count).
    by_name: std::collections::HashMap<String, usize>,
    watchers: Vec<mpsc::Sender<String>>,
}

struct State {
    resources: [Resource; 3],
    resource_version: u64,
}

/// The running stand-in; dropping it stops accepting (open streams end with their timeout).
pub(super) struct ApiServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    /// Requests answered 404 (anything the stand-in does not serve).
    pub unknown: Arc<AtomicU64>,
    /// List requests (pages) served.
    pub lists: Arc<AtomicU64>,
}

/// Give an object what the API server adds: uid, resourceVersion, creationTimestamp, and managedFields
/// naming every field (what kube-rs' watcher hands over unless stripped).
fn as_served(mut obj: Value, rv: u64, manager: &str) -> Value {
    let spec = obj.get("spec").or_else(|| obj.get("endpoints")).cloned().unwrap_or(Value::Null);
    let api_version = obj["apiVersion"].clone();
    let applied = (obj["kind"] == "Service").then(|| {
        let spec = serde_json::to_string(&obj["spec"]).unwrap_or_default();
        format!("{{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"spec\":{spec}}}")
    });
    let meta = obj["metadata"].as_object_mut().expect("objects have metadata");
    meta.insert("uid".into(), json!(format!("{:08x}-0000-4000-8000-{rv:012x}", rv as u32)));
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    meta.insert("creationTimestamp".into(), json!("2026-11-30T12:00:00Z"));
    meta.insert(
        "managedFields".into(),
        json!([{"manager": manager, "operation": "Update", "apiVersion": api_version,
                "time": "2026-11-30T12:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}, "f:spec": spec}}]),
    );
    if let Some(applied) = applied {
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if let Some(a) = annotations.as_object_mut() {
            a.insert("kubectl.kubernetes.io/last-applied-configuration".into(), json!(applied));
        }
    }
    obj
}

/// A request's query, decoded, by key.
type Query = std::collections::BTreeMap<String, String>;

fn query<'a>(q: &'a Query, key: &str) -> Option<&'a str> {
    q.get(key).map(String::as_str)
}

impl ApiServer {
    /// Serve `services`, `slices` and `nodes` (the bench's objects, without server fields) on a loopback
    /// port.
    pub(super) fn start(services: Vec<Value>, slices: Vec<Value>, nodes: Vec<Value>) -> anyhow::Result<Self> {
        let mut rv = 1000;
        let mut serve = |objs: Vec<Value>, manager: &str| -> Resource {
            let mut res = Resource::default();
            for (i, o) in objs.into_iter().enumerate() {
                rv += 1;
                res.by_name.insert(o["metadata"]["name"].as_str().unwrap_or_default().to_owned(), i);
                res.items.push(as_served(o, rv, manager).to_string());
            }
            res
        };
        let resources = [
            serve(services, "kubectl-client-side-apply"),
            serve(slices, "endpointslice-controller.k8s.io"),
            serve(nodes, "kubelet"),
        ];
        let state = Arc::new(Mutex::new(State { resources, resource_version: rv }));
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (unknown, lists) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let server = Self { addr, state, stop, unknown, lists };
        let (state, stop, unknown, lists) =
            (server.state.clone(), server.stop.clone(), server.unknown.clone(), server.lists.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (state, unknown, lists) = (state.clone(), unknown.clone(), lists.clone());
                std::thread::spawn(move || {
                    let _ = connection(conn, &state, &unknown, &lists);
                });
            }
        });
        Ok(server)
    }

    /// A kubeconfig for this server (no credentials: the stand-in checks none).
    pub(super) fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: http://{}\n\
             users:\n- name: bench\n  user: {{}}\ncontexts:\n- name: bench\n  context:\n    cluster: bench\n    \
             user: bench\ncurrent-context: bench\n",
            self.addr
        )
    }

    /// Change an EndpointSlice (by `metadata.name`): the new version replaces the stored one and goes to every
    /// open watch of EndpointSlices as a MODIFIED event.
    pub(super) fn modify_slice(&self, slice: Value) {
        let mut st = self.state.lock().expect("not poisoned");
        st.resource_version += 1;
        let obj = as_served(slice, st.resource_version, "endpointslice-controller.k8s.io");
        let text = obj.to_string();
        let res = &mut st.resources[1];
        if let Some(&i) = obj["metadata"]["name"].as_str().and_then(|n| res.by_name.get(n)) {
            res.items[i].clone_from(&text);
        }
        let event = format!("{{\"type\":\"MODIFIED\",\"object\":{text}}}\n");
        res.watchers.retain(|w| w.send(event.clone()).is_ok());
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// One client connection: HTTP/1.1 requests, kept alive, until the client closes it.
fn connection(
    conn: TcpStream,
    state: &Mutex<State>,
    unknown: &AtomicU64,
    lists: &AtomicU64,
) -> anyhow::Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, target) =
            (parts.next().unwrap_or_default().to_owned(), parts.next().unwrap_or_default());
        let (path, q) = target.split_once('?').unwrap_or((target, ""));
        let (path, q): (String, Query) =
            (path.to_owned(), form_urlencoded::parse(q.as_bytes()).into_owned().collect());
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            if h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let resource = RESOURCES.iter().position(|(p, _)| *p == path);
        match (method.as_str(), resource) {
            ("POST", None) if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" => {
                let mut review: Value = serde_json::from_slice(&body)?;
                review["status"] = json!({"allowed": true});
                respond(&mut out, "200 OK", &review.to_string())?;
            }
            ("GET", Some(r)) if matches!(query(&q, "watch"), Some("true" | "1")) => {
                return watch(out, state, r, &q);
            }
            ("GET", Some(r)) => {
                lists.fetch_add(1, Ordering::Relaxed);
                write_list(&mut out, state, r, &q)?;
            }
            _ => {
                unknown.fetch_add(1, Ordering::Relaxed);
                eprintln!("bench: the API-server stand-in does not serve {method} {target}");
                respond(
                    &mut out,
                    "404 Not Found",
                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404}"#,
                )?;
            }
        }
    }
}

fn respond(out: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One page of a list, answered on `out`: `limit` items from the offset `continue` names (the stand-in's
/// tokens are offsets), with the `continue` of the next page while items remain. A node list honours the
/// agent's `fieldSelector=metadata.name=NAME`. The items are written as they are stored, through a small
/// buffer: a page joined into one body (two copies of 1.5 MB per page at 100,000 Services) cost the stand-in
/// about a second of page faults on the bench's two CPUs during the agent's first list, time the agent's
/// start was measured with.
fn write_list(out: &mut TcpStream, state: &Mutex<State>, r: usize, q: &Query) -> std::io::Result<()> {
    let st = state.lock().expect("not poisoned");
    let items = &st.resources[r].items;
    let selected: Vec<&String> = match query(q, "fieldSelector") {
        Some(sel) => match sel.strip_prefix("metadata.name=") {
            Some(name) => {
                let needle = format!("\"name\":\"{name}\"");
                items.iter().filter(|i| i.contains(&needle)).collect()
            }
            None => items.iter().collect(),
        },
        None => items.iter().collect(),
    };
    let start: usize = query(q, "continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let limit: usize =
        query(q, "limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(selected.len());
    let page = &selected[start.min(end)..end];
    let next = if end < selected.len() { format!(",\"continue\":\"{end}\"") } else { String::new() };
    let (prefix, kind) = RESOURCES[r];
    let api_version = if prefix.starts_with("/apis/") { "discovery.k8s.io/v1" } else { "v1" };
    let head = format!(
        "{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{{\"resourceVersion\":\"{}\"{next}}},\"items\":[",
        st.resource_version,
    );
    let commas = page.len().saturating_sub(1);
    let length = head.len() + page.iter().map(|i| i.len()).sum::<usize>() + commas + b"]}".len();
    let mut w = std::io::BufWriter::with_capacity(64 << 10, out);
    write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n{head}")?;
    for (n, item) in page.iter().enumerate() {
        if n > 0 {
            w.write_all(b",")?;
        }
        w.write_all(item.as_bytes())?;
    }
    w.write_all(b"]}")?;
    w.flush()
}

/// A watch: a chunked stream of events (one JSON object per line) until `timeoutSeconds`, with a bookmark
/// every `BOOKMARK_EVERY` when the client allows them.
fn watch(mut out: TcpStream, state: &Mutex<State>, r: usize, q: &Query) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel();
    let kind = RESOURCES[r].1.trim_end_matches("List");
    state.lock().expect("not poisoned").resources[r].watchers.push(tx);
    let bookmarks = query(q, "allowWatchBookmarks") == Some("true");
    let timeout = Duration::from_secs(query(q, "timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(290));
    write!(out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")?;
    let started = Instant::now();
    while started.elapsed() < timeout {
        let event = match rx.recv_timeout(BOOKMARK_EVERY) {
            Ok(event) => event,
            Err(mpsc::RecvTimeoutError::Timeout) if bookmarks => {
                let rv = state.lock().expect("not poisoned").resource_version;
                let api_version = if r == 1 { "discovery.k8s.io/v1" } else { "v1" };
                format!(
                    "{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"}}}}}}\n"
                )
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        write!(out, "{:x}\r\n{event}\r\n", event.len())?;
        out.flush()?;
    }
    write!(out, "0\r\n\r\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use serde_json::json;

    use super::*;

    /// Each page is one well-formed list, its `Content-Length` its body's, the pages together every item
    /// once, each page but the last naming where the next starts.
    #[test]
    fn a_list_is_served_in_pages_whose_length_is_their_bodys() {
        let services: Vec<Value> = (0..5)
            .map(|i| {
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("s{i}")},
                            "spec": {"clusterIP": "10.96.0.1"}})
            })
            .collect();
        let api = ApiServer::start(services, Vec::new(), Vec::new()).unwrap();
        let mut names = Vec::new();
        let mut from = String::new();
        for page in 0.. {
            let mut conn = TcpStream::connect(api.addr).unwrap();
            write!(
                conn,
                "GET /api/v1/services?limit=2{from} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            let mut text = String::new();
            conn.read_to_string(&mut text).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|l| l.parse().ok())
                .unwrap();
            assert_eq!(length, body.len(), "page {page}");
            let list: Value = serde_json::from_str(body).unwrap();
            assert_eq!(list["kind"], "ServiceList");
            let items = list["items"].as_array().unwrap();
            names.extend(items.iter().map(|i| i["metadata"]["name"].as_str().unwrap().to_owned()));
            match list["metadata"]["continue"].as_str() {
                Some(next) => {
                    assert_eq!(items.len(), 2, "page {page}");
                    from = format!("&continue={next}");
                }
                None => break,
            }
        }
        assert_eq!(names, ["s0", "s1", "s2", "s3", "s4"]);
        assert_eq!(api.lists.load(Ordering::Relaxed), 3);
    }
}
