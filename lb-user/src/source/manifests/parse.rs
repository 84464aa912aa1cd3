//! One manifest file's text -> objects and diagnostics. Never fails: a document that does not parse or
//! convert is reported with its document index, what it is and the field, and skipped; the others are read.
use std::path::Path;

use super::super::{Diagnostic, Object, Origin, Severity, UNKNOWN_FIELD, convert};

/// The objects of one file and what went wrong reading it.
#[derive(Clone, Debug, Default)]
pub(super) struct FileContents {
    pub(super) objects: Vec<Object>,
    pub(super) diagnostics: Vec<Diagnostic>,
}

impl FileContents {
    pub(super) fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.severity == Severity::Error)
    }
}

/// Parse one file's text. Never fails: problems become diagnostics.
pub(super) fn parse_file(path: &Path, text: &str) -> FileContents {
    let mut out = FileContents::default();
    let lines = super::super::yaml::document_lines(text);
    super::super::yaml::each_document(text, |index, doc| match doc {
        Ok(value) => {
            parse_value(path, (index, lines.get(index).copied()), value, &mut out);
            true
        }
        Err(e) => {
            out.diagnostics.push(Diagnostic {
                service: None,
                severity: Severity::Error,
                origin: Origin::File {
                    path: path.to_owned(),
                    document: Some(index),
                    line: lines.get(index).copied(),
                    object: None,
                },
                field: None,
                message: format!("malformed YAML: {e}"),
            });
            // The YAML stream cannot be resumed after a syntax error.
            false
        }
    });
    locate_unknown_fields(text, &lines, &mut out.diagnostics);
    out
}

/// Point each unknown field's diagnostic at the field's own line, not its document's first: the n-th line
/// of its document holding its key (`key:`, after any `- `), n counting the unknown fields of that key
/// before it in the document. Left at the document's line where the key is not found (a key in flow style,
/// `{a: 1}`, on the line of its parent). By the key alone: a known field of the same name earlier in the
/// document (`metadata.name` for a misplaced `spec.name`) is taken for it, a rare misspelling's case.
fn locate_unknown_fields(text: &str, starts: &[usize], diagnostics: &mut [Diagnostic]) {
    if !diagnostics.iter().any(Diagnostic::is_unknown_field) {
        // The agent reads every manifest through here: no line work where nothing is unknown.
        return;
    }
    let all: Vec<&str> = text.lines().collect();
    let mut seen: std::collections::BTreeMap<(usize, String), usize> = std::collections::BTreeMap::new();
    for d in diagnostics.iter_mut().filter(|d| d.is_unknown_field()) {
        let (Some(field), Origin::File { document: Some(doc), line: Some(start), .. }) =
            (&d.field, &mut d.origin)
        else {
            continue;
        };
        let key = field.rsplit(['.', ']']).next().unwrap_or(field).to_owned();
        let nth = seen.entry((*doc, key.clone())).or_default();
        let end = starts.get(*doc + 1).map_or(all.len(), |next| next.saturating_sub(1));
        let holds = |l: &&str| {
            let l = l.trim_start().trim_start_matches(['-', ' ']);
            [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")]
                .iter()
                .any(|k| l.starts_with(k.as_str()))
        };
        let found = all
            .iter()
            .enumerate()
            .take(end)
            .skip(start.saturating_sub(1))
            .filter(|(_, l)| holds(l))
            .nth(*nth)
            .map(|(i, _)| i + 1);
        *nth += 1;
        if let Some(at) = found {
            *start = at;
        }
    }
}

/// One document's value; `(index, line)`: its 0-based index and its first line.
fn parse_value(
    path: &Path,
    (index, line): (usize, Option<usize>),
    value: serde_json::Value,
    out: &mut FileContents,
) {
    if value.is_null() {
        return; // empty document, e.g. a trailing `---`
    }
    let service = owning_service(&value);
    let diag = |severity, object: Option<String>, field: Option<String>, message: String| Diagnostic {
        service: service.clone(),
        severity,
        origin: Origin::File { path: path.to_owned(), document: Some(index), line, object },
        field,
        message,
    };
    let kind = value.get("kind").and_then(|k| k.as_str()).map(str::to_owned);
    let api_version = value.get("apiVersion").and_then(|k| k.as_str()).unwrap_or_default().to_owned();
    let name = value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).map(str::to_owned);
    let label = kind.as_ref().map(|k| format!("{k} {}", name.as_deref().unwrap_or("<no name>")));
    let Some(kind) = kind else {
        out.diagnostics.push(diag(
            Severity::Error,
            None,
            Some("kind".into()),
            "missing; not a Kubernetes object".into(),
        ));
        return;
    };
    match (kind.as_str(), api_version.as_str()) {
        ("List" | "ServiceList" | "EndpointSliceList" | "NodeList", _) => {
            let Some(items) = value.get("items").and_then(|i| i.as_array()) else {
                out.diagnostics.push(diag(Severity::Error, label, Some("items".into()), "missing".into()));
                return;
            };
            for item in items.clone() {
                parse_value(path, (index, line), item, out);
            }
        }
        ("Service", "v1") => {
            push(
                convert_with(value, convert::service),
                |s| Object::Service(std::sync::Arc::new(s)),
                label.as_deref(),
                &diag,
                out,
            );
        }
        ("EndpointSlice", "discovery.k8s.io/v1") => push(
            convert_with(value, convert::endpoint_slice),
            |s| Object::EndpointSlice(s.into()),
            label.as_deref(),
            &diag,
            out,
        ),
        ("Node", "v1") => {
            push(
                convert_with(value, convert::node),
                |n| Object::Node(Box::new(n)),
                label.as_deref(),
                &diag,
                out,
            );
        }
        ("Service" | "EndpointSlice" | "Node", v) => out.diagnostics.push(diag(
            Severity::Error,
            label,
            Some("apiVersion".into()),
            format!(
                "unsupported apiVersion {v:?} (Service and Node: v1; EndpointSlice: discovery.k8s.io/v1)"
            ),
        )),
        (other, _) => out.diagnostics.push(diag(
            Severity::Warning,
            label,
            Some("kind".into()),
            format!("kind {other} is not read by tierlb (only Service, EndpointSlice, Node); ignored"),
        )),
    }
}

/// The Service a document belongs to: a Service's own key, an EndpointSlice's `kubernetes.io/service-name`
/// label in its namespace (namespace `default` when unset, as kubectl applies it).
fn owning_service(value: &serde_json::Value) -> Option<crate::model::ObjKey> {
    let meta = value.get("metadata")?;
    let namespace = meta.get("namespace").and_then(|n| n.as_str()).unwrap_or("default");
    let name = match value.get("kind")?.as_str()? {
        "Service" => meta.get("name")?.as_str()?,
        "EndpointSlice" => meta.get("labels")?.get("kubernetes.io/service-name")?.as_str()?,
        _ => return None,
    };
    Some(crate::model::ObjKey::new(namespace, name))
}

/// (field, message) problems of one document.
type Problems = Vec<(Option<String>, String)>;
/// The object or why it is not taken, and the unknown fields it had either way.
type Located<T> = (Result<T, Problems>, Vec<String>);

/// Deserialize a document as a `K`, noting every field the type does not have (`serde_ignored`:
/// k8s-openapi skips unknown fields silently, so a misspelled `internalTraficPolicy` would plan the Service
/// as Cluster), and convert it.
fn convert_with<K: serde::de::DeserializeOwned, T>(
    value: serde_json::Value,
    convert: fn(&K) -> Result<T, convert::Invalid>,
) -> Located<T> {
    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(render(&path));
    let typed: Result<K, _> =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(value, &mut note));
    let result = match typed {
        Ok(k) => {
            convert(&k).map_err(|errors| errors.into_iter().map(|e| (Some(e.field), e.message)).collect())
        }
        Err(e) => {
            let path = e.path().to_string();
            Err(vec![(Some(path).filter(|p| p != "."), e.into_inner().to_string())])
        }
    };
    (result, unknown)
}

/// `spec.ports[0].nme`, as the other diagnostics write fields.
fn render(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", render(parent)),
        Path::Map { parent, key } => match render(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => {
            render(parent)
        }
    }
}

/// Fields tierlb reads (at any depth): an unknown field close to one of them is most likely a misspelling
/// that changes what is planned.
const READ_FIELDS: &[&str] = &[
    "metadata",
    "name",
    "namespace",
    "labels",
    "annotations",
    "spec",
    "type",
    "clusterIP",
    "clusterIPs",
    "ports",
    "port",
    "protocol",
    "nodePort",
    "externalIPs",
    "healthCheckNodePort",
    "internalTrafficPolicy",
    "externalTrafficPolicy",
    "trafficDistribution",
    "sessionAffinity",
    "sessionAffinityConfig",
    "clientIP",
    "timeoutSeconds",
    "targetPort",
    "loadBalancerSourceRanges",
    "ipMode",
    "ipFamilies",
    "targetRef",
    "status",
    "loadBalancer",
    "ingress",
    "ip",
    "addressType",
    "endpoints",
    "addresses",
    "conditions",
    "ready",
    "serving",
    "terminating",
    "nodeName",
    "zone",
    "hints",
    "forZones",
    "forNodes",
    "allocatable",
    "cpu",
    "items",
];

/// The warning for an unknown field, with the field tierlb reads it is likely a misspelling of.
fn unknown_field_message(field: &str) -> String {
    let last = field.rsplit(['.', ']']).next().unwrap_or(field);
    match crate::spelling::closest(last, READ_FIELDS.iter().copied()) {
        Some(k) => format!(
            "{UNKNOWN_FIELD}{last:?}, ignored: did you mean {k:?}? (tierlb reads {k}; as written, the object \
             is planned as if it were unset)"
        ),
        None => format!("{UNKNOWN_FIELD}{last:?}, ignored (the API server would refuse or drop it)"),
    }
}

fn push<T>(
    r: Located<T>,
    wrap: fn(T) -> Object,
    label: Option<&str>,
    diag: &dyn Fn(Severity, Option<String>, Option<String>, String) -> Diagnostic,
    out: &mut FileContents,
) {
    let (result, unknown) = r;
    for field in unknown {
        let message = unknown_field_message(&field);
        out.diagnostics.push(diag(Severity::Warning, label.map(str::to_owned), Some(field), message));
    }
    match result {
        Ok(obj) => out.objects.push(wrap(obj)),
        Err(problems) => {
            for (field, message) in problems {
                out.diagnostics.push(diag(Severity::Error, label.map(str::to_owned), field, message));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80}]\n";

    fn one(text: &str) -> FileContents {
        parse_file(Path::new("dir/x.yaml"), text)
    }

    struct Case {
        name: &'static str,
        text: String,
        object: Option<&'static str>,
        field: Option<&'static str>,
        message: &'static str,
    }

    /// Each case's document, after a good one, is reported as the case says; the good one is still read.
    fn check_bad(cases: impl IntoIterator<Item = Case>) {
        for c in cases {
            let text = format!("{GOOD}---\n{}", c.text);
            let got = one(&text);
            assert_eq!(got.diagnostics.len(), 1, "{}: {:?}", c.name, got.diagnostics);
            let d = &got.diagnostics[0];
            let Origin::File { path, document, object, line } = &d.origin else { panic!("{}: {d}", c.name) };
            assert_eq!(path, Path::new("dir/x.yaml"), "{}", c.name);
            assert_eq!(*document, Some(1), "{}", c.name);
            assert_eq!(object.as_deref(), c.object, "{}", c.name);
            assert_eq!(d.field.as_deref(), c.field, "{}: {d}", c.name);
            assert!(d.message.contains(c.message), "{}: {d}", c.name);
            // The second document, counted from 1, with the line it starts on (GOOD's lines, then `---`).
            let second = GOOD.lines().count() + 2;
            assert_eq!(*line, Some(second), "{}", c.name);
            assert!(d.to_string().starts_with(&format!("dir/x.yaml:{second} document 2")), "{d}");
            assert!(matches!(got.objects.first(), Some(Object::Service(_))), "{}", c.name);
        }
    }

    #[test]
    fn bad_session_affinity_is_refused_as_the_api_server_refuses_it() {
        check_bad([
            Case {
                name: "unknown session affinity",
                text: GOOD.replace("spec:\n", "spec:\n  sessionAffinity: Cookie\n"),
                object: Some("Service web"),
                field: Some("spec.sessionAffinity"),
                message: "unknown session affinity \"Cookie\" (None or ClientIP)",
            },
            Case {
                name: "affinity timeout over a day",
                text: GOOD.replace(
                    "spec:\n",
                    "spec:\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 86401}}\n",
                ),
                object: Some("Service web"),
                field: Some("spec.sessionAffinityConfig.clientIP.timeoutSeconds"),
                message: "86401 is out of range (1-86400 seconds)",
            },
            Case {
                name: "affinity config without ClientIP",
                text: GOOD.replace("spec:\n", "spec:\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n"),
                object: Some("Service web"),
                field: Some("spec.sessionAffinityConfig"),
                message: "must not be set when sessionAffinity is None",
            },
        ]);
    }

    #[test]
    fn bad_documents_are_reported_with_file_document_and_field() {
        let cases = [
            Case { name: "malformed YAML", text: "kind: Service\n  bad: [".into(), object: None, field: None, message: "malformed YAML" },
            Case {
                name: "missing kind",
                text: "apiVersion: v1\nmetadata: {name: x}\n".into(),
                object: None,
                field: Some("kind"),
                message: "missing",
            },
            Case {
                name: "missing name",
                text: "apiVersion: v1\nkind: Service\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n".into(),
                object: Some("Service <no name>"),
                field: Some("metadata.name"),
                message: "missing",
            },
            Case {
                name: "invalid IP",
                text: GOOD.replace("10.96.0.10", "10.96.0.999"),
                object: Some("Service web"),
                field: Some("spec.clusterIPs[0]"),
                message: "not an IP address",
            },
            Case {
                name: "port out of range",
                text: GOOD.replace("port: 80", "port: 70000"),
                object: Some("Service web"),
                field: Some("spec.ports[0].port"),
                message: "out of range",
            },
            Case {
                name: "wrong type for a field",
                text: GOOD.replace("port: 80", "port: eighty"),
                object: Some("Service web"),
                field: Some("spec.ports[0].port"),
                message: "invalid",
            },
            Case {
                name: "unknown traffic policy",
                text: GOOD.replace("spec:\n", "spec:\n  internalTrafficPolicy: Nearby\n"),
                object: Some("Service web"),
                field: Some("spec.internalTrafficPolicy"),
                message: "unknown traffic policy \"Nearby\"",
            },
            Case {
                name: "unsupported apiVersion",
                text: GOOD.replace("apiVersion: v1", "apiVersion: v2"),
                object: Some("Service web"),
                field: Some("apiVersion"),
                message: "unsupported apiVersion",
            },
            Case {
                name: "address of the wrong family",
                text: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\nendpoints: [{addresses: ['fd00::1']}]\n".into(),
                object: Some("EndpointSlice s"),
                field: Some("endpoints[0].addresses[0]"),
                message: "does not match addressType IPv4",
            },
        ];
        check_bad(cases);
    }

    #[test]
    fn session_affinity_is_read_with_kube_proxys_default_timeout() {
        let cases = [
            ("no affinity", "", None),
            ("None", "  sessionAffinity: None\n", None),
            ("ClientIP without a config: 3 hours", "  sessionAffinity: ClientIP\n", Some(10_800)),
            (
                "ClientIP with a timeout",
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
                Some(60),
            ),
            (
                "ClientIP with an empty clientIP config",
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {}}\n",
                Some(10_800),
            ),
        ];
        for (name, spec, want) in cases {
            let got = one(&GOOD.replace("spec:\n", &format!("spec:\n{spec}")));
            assert!(got.diagnostics.is_empty(), "{name}: {:?}", got.diagnostics);
            let Some(Object::Service(svc)) = got.objects.first() else { panic!("{name}: {:?}", got.objects) };
            assert_eq!(svc.session_affinity_timeout, want, "{name}");
        }
    }

    #[test]
    fn unknown_kinds_are_a_warning_and_ignored() {
        let got = one("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n");
        assert!(got.objects.is_empty());
        assert_eq!(got.diagnostics[0].severity, Severity::Warning);
        assert!(got.diagnostics[0].message.contains("kind Deployment is not read"));
    }

    #[test]
    fn lists_are_read() {
        let got = one(
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: n1}}\n- {apiVersion: v1, kind: Node, metadata: {name: n2}}\n",
        );
        assert_eq!(got.objects.len(), 2);
    }
}
