//! A directory of Kubernetes YAML (Service, EndpointSlice, Node, List) as a source.
//!
//! Bad input never takes the rest down: a document that does not parse or convert is reported with its file,
//! document index and field, and skipped; a file with any problem keeps the objects it had at the last load
//! that was clean ("last good state"), so a half-saved edit cannot drop a Service's endpoints.
use std::{
    collections::{BTreeMap, HashMap, btree_map::Entry},
    fmt,
    path::{Path, PathBuf},
};

use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
use serde::Deserialize as _;

use super::convert;
use crate::model::{EndpointSlice, Model, Node, Service};

/// One object read from a manifest.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Service(Service),
    /// Shared with the model (slices hold most of the memory).
    EndpointSlice(std::sync::Arc<EndpointSlice>),
    Node(Node),
}

impl Object {
    pub fn describe(&self) -> String {
        match self {
            Self::Service(s) => format!("Service {}", s.key),
            Self::EndpointSlice(s) => format!("EndpointSlice {}", s.key),
            Self::Node(n) => format!("Node {}", n.name),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

/// A problem with the input, located precisely enough to fix it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: PathBuf,
    /// 0-based index of the YAML document in the file (`---` separated); `None` for whole-file problems.
    pub document: Option<usize>,
    /// What the document is, as far as it could be read ("Service default/web").
    pub object: Option<String>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(d) = self.document {
            write!(f, " document {d}")?;
        }
        if let Some(o) = &self.object {
            write!(f, " ({o})")?;
        }
        if let Some(field) = &self.field {
            write!(f, " field {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The objects of one file and what went wrong reading it.
#[derive(Clone, Debug, Default)]
pub struct FileContents {
    pub objects: Vec<Object>,
    pub diagnostics: Vec<Diagnostic>,
}

impl FileContents {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.severity == Severity::Error)
    }
}

/// Parse one file's text. Never fails: problems become diagnostics.
pub fn parse_file(path: &Path, text: &str) -> FileContents {
    let mut out = FileContents::default();
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = match serde_yaml::Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                out.diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    file: path.to_owned(),
                    document: Some(index),
                    object: None,
                    field: None,
                    message: format!("malformed YAML: {e}"),
                });
                // The YAML stream cannot be resumed after a syntax error.
                break;
            }
        };
        parse_value(path, index, value, &mut out);
    }
    out
}

fn parse_value(path: &Path, index: usize, value: serde_yaml::Value, out: &mut FileContents) {
    if value.is_null() {
        return; // empty document, e.g. a trailing `---`
    }
    let diag = |severity, object: Option<String>, field: Option<String>, message: String| Diagnostic {
        severity,
        file: path.to_owned(),
        document: Some(index),
        object,
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
        ("List", _) | ("ServiceList" | "EndpointSliceList" | "NodeList", _) => {
            let Some(items) = value.get("items").and_then(|i| i.as_sequence()) else {
                out.diagnostics.push(diag(Severity::Error, label, Some("items".into()), "missing".into()));
                return;
            };
            for item in items.clone() {
                parse_value(path, index, item, out);
            }
        }
        ("Service", "v1") => push(
            typed::<core::Service>(value).and_then(|s| ok(convert::service(&s))),
            Object::Service,
            label,
            &diag,
            out,
        ),
        ("EndpointSlice", "discovery.k8s.io/v1") => push(
            typed::<discovery::EndpointSlice>(value).and_then(|s| ok(convert::endpoint_slice(&s))),
            |s| Object::EndpointSlice(s.into()),
            label,
            &diag,
            out,
        ),
        ("Node", "v1") => push(
            typed::<core::Node>(value).and_then(|n| ok(convert::node(&n))),
            Object::Node,
            label,
            &diag,
            out,
        ),
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

type Located<T> = Result<T, (Option<String>, String)>;

fn typed<T: serde::de::DeserializeOwned>(value: serde_yaml::Value) -> Located<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        (Some(path).filter(|p| p != "."), e.into_inner().to_string())
    })
}

fn ok<T>(r: Result<T, convert::FieldError>) -> Located<T> {
    r.map_err(|e| (Some(e.field), e.message))
}

fn push<T>(
    r: Located<T>,
    wrap: fn(T) -> Object,
    label: Option<String>,
    diag: &dyn Fn(Severity, Option<String>, Option<String>, String) -> Diagnostic,
    out: &mut FileContents,
) {
    match r {
        Ok(obj) => out.objects.push(wrap(obj)),
        Err((field, message)) => out.diagnostics.push(diag(Severity::Error, label, field, message)),
    }
}

/// A manifests directory with per-file memory: what each file contributed (its last clean version while the
/// current one has errors), and the file's stamp, so an unchanged file is neither read nor parsed again.
#[derive(Debug, Default)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// How many files (or documents) define each object, by `Object::describe`.
    defined: HashMap<String, usize>,
    /// Duplicate-object errors from the last full assembly.
    duplicates: Vec<Diagnostic>,
    assembled: bool,
}

#[derive(Debug)]
struct FileState {
    /// `None` when the file could not be read: it is read again on the next refresh.
    stamp: Option<Stamp>,
    /// The objects the model takes from this file.
    used: Vec<Object>,
    diagnostics: Vec<Diagnostic>,
    /// `used` is the last clean version; the current content has errors.
    stale: bool,
    /// `used` came from a clean version (so it is the one to keep while the file has errors).
    good: bool,
}

/// What tells that a file changed without reading it: a save rewrites it (new size or mtime/ctime) or
/// replaces it (new inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Result of (re)loading a directory.
#[derive(Debug, Default)]
pub struct Loaded {
    pub model: Model,
    pub diagnostics: Vec<Diagnostic>,
    /// Files whose objects come from an earlier load because the current content has errors.
    pub stale_files: Vec<PathBuf>,
}

impl ManifestDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), ..Self::default() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The YAML files of the directory with their stamps (one stat each), sorted by path (so duplicates
    /// resolve the same way every time).
    fn files(&self) -> std::io::Result<Vec<(PathBuf, Stamp)>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let is_yaml = matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"));
            let hidden = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
            if !is_yaml || hidden {
                continue;
            }
            // Follows a symlink, as reading the file does.
            if let Ok(m) = std::fs::metadata(&path)
                && m.is_file()
            {
                files.push((path, Stamp::of(&m)));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(files)
    }

    /// The whole model as of now (reads whatever changed first).
    pub fn load(&mut self) -> std::io::Result<Loaded> {
        let r = self.refresh()?;
        let model = match r.changes {
            super::Changes::All(model) => model,
            super::Changes::Objects { .. } => assemble(self.objects(), &mut Vec::new()),
        };
        Ok(Loaded { model, diagnostics: r.diagnostics, stale_files: r.stale_files })
    }

    fn objects(&self) -> Vec<(PathBuf, Object)> {
        self.files.iter().flat_map(|(p, f)| f.used.iter().map(move |o| (p.clone(), o.clone()))).collect()
    }

    /// Read the files that changed since the last refresh. Fails only when the directory itself cannot be
    /// read.
    pub fn refresh(&mut self) -> std::io::Result<super::Refresh> {
        let files = self.files()?;
        // (objects the file gave before, objects it gives now) for every file that changed.
        let mut changed: Vec<(Vec<Object>, Vec<Object>)> = Vec::new();
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| files.binary_search_by(|(f, _)| f.cmp(p)).is_err())
            .cloned()
            .collect();
        for path in gone {
            if let Some(state) = self.files.remove(&path) {
                changed.push((state.used, Vec::new()));
            }
        }
        for (path, stamp) in &files {
            let now = Some(*stamp);
            if self.files.get(path).is_some_and(|f| f.stamp == now) {
                continue;
            }
            let (contents, now) = match std::fs::read_to_string(path) {
                Ok(text) => (parse_file(path, &text), now),
                Err(e) => (
                    FileContents {
                        objects: Vec::new(),
                        diagnostics: vec![Diagnostic {
                            severity: Severity::Error,
                            file: path.clone(),
                            document: None,
                            object: None,
                            field: None,
                            message: format!("cannot read: {e}"),
                        }],
                    },
                    None,
                ),
            };
            let previous = self.files.remove(path);
            let before = previous.as_ref().map(|f| f.used.clone()).unwrap_or_default();
            let state = match previous.filter(|f| f.good) {
                Some(last_good) if contents.has_errors() => FileState {
                    stamp: now,
                    used: last_good.used,
                    diagnostics: contents.diagnostics,
                    stale: true,
                    good: true,
                },
                _ => FileState {
                    stamp: now,
                    good: !contents.has_errors(),
                    used: contents.objects,
                    diagnostics: contents.diagnostics,
                    stale: false,
                },
            };
            if before != state.used {
                changed.push((before, state.used.clone()));
            }
            self.files.insert(path.clone(), state);
        }

        // A change that touches an object defined more than once (before or after) may change which copy
        // wins: assemble everything again. Otherwise the difference is exact.
        let mut duplicate_involved = false;
        for (before, after) in &changed {
            for o in before {
                let id = o.describe();
                let n = self.defined.get(&id).copied().unwrap_or(0);
                duplicate_involved |= n > 1;
                if n > 1 {
                    self.defined.insert(id, n - 1);
                } else {
                    self.defined.remove(&id);
                }
            }
            for o in after {
                let n = self.defined.entry(o.describe()).or_default();
                *n += 1;
                duplicate_involved |= *n > 1;
            }
        }
        let changes = if !self.assembled || duplicate_involved {
            self.assembled = true;
            self.duplicates.clear();
            super::Changes::All(assemble(self.objects(), &mut self.duplicates))
        } else {
            let mut removed = Vec::new();
            let mut upserted = Vec::new();
            for (before, after) in changed {
                let mut before: HashMap<String, Object> =
                    before.into_iter().map(|o| (o.describe(), o)).collect();
                for o in after {
                    if before.remove(&o.describe()).as_ref() != Some(&o) {
                        upserted.push(o);
                    }
                }
                removed.extend(before.into_values());
            }
            super::Changes::Objects { removed, upserted }
        };
        let mut diagnostics: Vec<Diagnostic> =
            self.files.values().flat_map(|f| f.diagnostics.iter().cloned()).collect();
        diagnostics.extend(self.duplicates.iter().cloned());
        let stale_files = self.files.iter().filter(|(_, f)| f.stale).map(|(p, _)| p.clone()).collect();
        Ok(super::Refresh { changes, diagnostics, stale_files })
    }
}

/// Build a model, reporting duplicates (the first one, in file order, is kept).
pub fn assemble(objects: Vec<(PathBuf, Object)>, diagnostics: &mut Vec<Diagnostic>) -> Model {
    let mut model = Model::default();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (path, obj) in objects {
        let what = obj.describe();
        match seen.entry(what.clone()) {
            Entry::Occupied(first) => {
                diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    file: path,
                    document: None,
                    object: Some(what),
                    field: Some("metadata.name".into()),
                    message: format!("duplicate object; the one in {} is used", first.get().display()),
                });
                continue;
            }
            Entry::Vacant(v) => {
                v.insert(path);
            }
        }
        match obj {
            Object::Service(s) => {
                model.services.insert(s.key.clone(), s);
            }
            Object::EndpointSlice(s) => {
                model.slices.insert_shared(s.key.clone(), s);
            }
            Object::Node(n) => {
                model.nodes.insert(n.name.clone(), n);
            }
        }
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ObjKey;

    const GOOD: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80}]\n";

    fn one(text: &str) -> FileContents {
        parse_file(Path::new("dir/x.yaml"), text)
    }

    #[test]
    fn bad_documents_are_reported_with_file_document_and_field() {
        struct Case {
            name: &'static str,
            text: String,
            object: Option<&'static str>,
            field: Option<&'static str>,
            message: &'static str,
        }
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
                text: "apiVersion: v1\nkind: Service\nspec: {clusterIP: 10.96.0.1}\n".into(),
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
        for c in cases {
            let text = format!("{GOOD}---\n{}", c.text);
            let got = one(&text);
            assert_eq!(got.diagnostics.len(), 1, "{}: {:?}", c.name, got.diagnostics);
            let d = &got.diagnostics[0];
            assert_eq!(d.document, Some(1), "{}", c.name);
            assert_eq!(d.object.as_deref(), c.object, "{}", c.name);
            assert_eq!(d.field.as_deref(), c.field, "{}: {d}", c.name);
            assert!(d.message.contains(c.message), "{}: {d}", c.name);
            assert!(d.to_string().starts_with("dir/x.yaml document 1"), "{d}");
            // The good document before it is still read.
            assert!(matches!(got.objects.first(), Some(Object::Service(_))), "{}", c.name);
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

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tierlb-manifests-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn duplicates_are_reported_and_the_first_file_wins() {
        let d = tempdir("dup");
        std::fs::write(d.join("a.yaml"), GOOD).unwrap();
        std::fs::write(d.join("b.yaml"), GOOD.replace("10.96.0.10", "10.96.0.11")).unwrap();
        let loaded = ManifestDir::new(&d).load().unwrap();
        let web = &loaded.model.services[&ObjKey::new("default", "web")];
        assert_eq!(web.cluster_ips[0].to_string(), "10.96.0.10");
        assert!(
            loaded.diagnostics.iter().any(|x| x.message.contains("duplicate") && x.file.ends_with("b.yaml"))
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_objects_and_other_files_still_load() {
        let d = tempdir("lastgood");
        std::fs::write(d.join("a.yaml"), GOOD).unwrap();
        std::fs::write(
            d.join("other.yaml"),
            GOOD.replace("name: web", "name: api").replace("10.96.0.10", "10.96.0.12"),
        )
        .unwrap();
        let mut md = ManifestDir::new(&d);
        assert_eq!(md.load().unwrap().model.services.len(), 2);
        std::fs::write(d.join("a.yaml"), "kind: Service\n  broken: [").unwrap();
        let loaded = md.load().unwrap();
        assert_eq!(loaded.model.services.len(), 2, "web is kept from the last good version");
        assert_eq!(loaded.stale_files, vec![d.join("a.yaml")]);
        assert!(loaded.diagnostics.iter().any(|x| x.severity == Severity::Error));
        // Fixing the file takes the new content.
        std::fs::write(d.join("a.yaml"), GOOD.replace("10.96.0.10", "10.96.0.20")).unwrap();
        let loaded = md.load().unwrap();
        assert_eq!(
            loaded.model.services[&ObjKey::new("default", "web")].cluster_ips[0].to_string(),
            "10.96.0.20"
        );
        // Deleting the file deletes its objects.
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        assert_eq!(md.load().unwrap().model.services.len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
