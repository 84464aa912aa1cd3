//! Where the model comes from, and the types every source speaks: the objects it delivers (`Object`, known by
//! its `ObjectId`), the problems it finds in its input (`Diagnostic`, located at an `Origin`: a file or an
//! API object) and what changed since the last refresh (`Refresh`, `Changes`).
//!
//! - `manifests`: a directory of YAML, reread file by file when it changes;
//! - `kube`: the API server, its watch events turned into changes;
//! - `convert`: k8s-openapi objects -> model, shared by both, refusing what the API server would refuse
//!   (`validate`).
//!
//! The two sources are siblings: each takes the shared types from here, never from the other.
#![warn(missing_docs)]

pub mod convert;
mod fields;
pub mod kube;
pub mod manifests;
mod validate;
pub mod yaml;

use std::{fmt, path::PathBuf, sync::Arc};

use crate::model::{EndpointSlice, Kind, Model, Node, ObjectId, Service};

/// A source the agent refreshes whenever it signals a change. Sources report what changed, so that one
/// edited EndpointSlice costs the agent one Service's replanning, not the whole cluster's.
pub trait ModelSource: Send {
    /// What changed since the last call (everything, on the first one), with the problems found in the input.
    /// Fails only when the source cannot be read at all (the agent then keeps the current maps).
    fn refresh(&mut self) -> std::io::Result<Refresh>;
    /// For messages: "the API server", "directory /etc/tierlb".
    fn describe(&self) -> String;
    /// Counters of the changes received and not yet handed over by `refresh`, for kube-proxy's
    /// `*_changes_pending` metrics; `None` for a source without a queue (a directory is read by the refresh
    /// its change wakes).
    fn pending(&self) -> Option<PendingChanges> {
        None
    }
    /// Rebuild what the source keeps per object with full nodes (`model::compact::repack`), after a change
    /// of many objects; nothing for a source that keeps nothing per object.
    fn repack(&mut self) {}
}

/// Changes a source has received and not yet handed over, by kind: shared counters the source keeps and a
/// scrape reads.
#[derive(Clone, Debug, Default)]
pub struct PendingChanges {
    /// Service events.
    pub services: Arc<std::sync::atomic::AtomicI64>,
    /// EndpointSlice events.
    pub endpoint_slices: Arc<std::sync::atomic::AtomicI64>,
}

/// The result of one refresh.
#[derive(Debug)]
pub struct Refresh {
    /// What the model gains and loses.
    pub changes: Changes,
    /// Every problem the input has now (not only in what changed).
    pub diagnostics: Vec<Diagnostic>,
    /// Inputs whose objects come from their last good version because the current one has errors (a file
    /// that no longer parses, an API object whose new version does not convert). Each also has an error
    /// among `diagnostics`; this list says that the model did not follow it.
    pub stale: Vec<Origin>,
}

/// What a refresh changes in the model.
#[derive(Debug)]
pub enum Changes {
    /// Start over from this model (first refresh, or a change the source cannot express as a difference).
    All(Model),
    /// Apply `removed` first, then `upserted` (an object that moved between files is in both).
    Objects {
        /// Objects that are gone (as they were last delivered).
        removed: Vec<Object>,
        /// Objects that are new or changed.
        upserted: Vec<Object>,
    },
}

impl Changes {
    /// Nothing to apply.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Objects { removed, upserted } if removed.is_empty() && upserted.is_empty())
    }
}

/// One object a source delivers, converted to the model.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A Service, shared with the model.
    Service(Arc<Service>),
    /// An EndpointSlice, shared with the model (slices hold most of the memory).
    EndpointSlice(Arc<EndpointSlice>),
    /// A Node (boxed: the other variants are a pointer, and sources hold many objects).
    Node(Box<Node>),
}

impl Object {
    /// Which object this is: two versions of one object have the same id.
    pub fn id(&self) -> ObjectId {
        match self {
            Self::Service(s) => ObjectId::new(Kind::Service, s.key.clone()),
            Self::EndpointSlice(s) => ObjectId::new(Kind::EndpointSlice, s.key.clone()),
            Self::Node(n) => ObjectId::node(n.name.clone()),
        }
    }

    /// Put it into `model`, replacing an object with the same id.
    pub fn insert_into(self, model: &mut Model) {
        match self {
            Self::Service(s) => model.put_service(s),
            Self::EndpointSlice(s) => {
                model.slices.insert_shared(s.key.clone(), s);
            }
            Self::Node(n) => {
                model.nodes.insert(n.name.clone(), *n);
            }
        }
    }
}

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Read anyway (an object of a kind tierlb ignores).
    Warning,
    /// The object (or file) is not taken as it is now.
    Error,
}

/// Where a problem is, precisely enough to fix it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Origin {
    /// A manifest file, or one YAML document in it.
    File {
        /// The file.
        path: PathBuf,
        /// 0-based index of the YAML document in the file (`---` separated, empty ones not counted); `None`
        /// for the whole file. Shown 1-based.
        document: Option<usize>,
        /// The 1-based line the document starts on, when known.
        line: Option<usize>,
        /// What the document is, as far as it could be read ("Service web", "Deployment d",
        /// "Service &lt;no name&gt;"): for people only, since a broken document may have no identity.
        object: Option<String>,
    },
    /// An object as the API server holds it.
    Api(ObjectId),
}

impl Origin {
    /// A whole file.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::File { path: path.into(), document: None, line: None, object: None }
    }
}

/// `dir/x.yaml:12 document 2 (Service web)` (the document's first line, documents counted from 1),
/// `dir/x.yaml`, `Service default/web`.
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { path, document, line, object } => {
                write!(f, "{}", path.display())?;
                if let Some(l) = line {
                    write!(f, ":{l}")?;
                }
                if let Some(d) = document {
                    write!(f, " document {}", d + 1)?;
                }
                if let Some(o) = object {
                    write!(f, " ({o})")?;
                }
                Ok(())
            }
            Self::Api(id) => write!(f, "{id}"),
        }
    }
}

/// A problem with the input.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    /// Whether the object was taken anyway.
    pub severity: Severity,
    /// Where the problem is.
    pub origin: Origin,
    /// The field, as a path inside the object (`spec.ports[0].port`), when one is to blame.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The Service the object belongs to (a Service itself, an EndpointSlice's
    /// `kubernetes.io/service-name` in its namespace), when known: `tierlb lint` reports its unknown fields
    /// as findings of that Service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<crate::model::ObjKey>,
}

/// How an unknown field's message starts (`Diagnostic::is_unknown_field`).
pub const UNKNOWN_FIELD: &str = "unknown field ";

impl Diagnostic {
    /// A field neither Kubernetes nor tierlb knows (a misspelling, most likely), taken with the field
    /// ignored.
    pub fn is_unknown_field(&self) -> bool {
        self.severity == Severity::Warning && self.message.starts_with(UNKNOWN_FIELD)
    }
}

/// `dir/x.yaml:12 document 2 (Service web) field spec.ports[0].port: port 0 is out of range (1-65535)`, or
/// `Service default/web field spec.ports[0].port: ...` for an API object.
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.origin)?;
        if let Some(field) = &self.field {
            write!(f, " field {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ObjKey;

    #[test]
    fn diagnostics_name_the_file_and_document_or_the_api_object() {
        let diag = |origin, field: Option<&str>| Diagnostic {
            service: None,
            severity: Severity::Error,
            origin,
            field: field.map(str::to_owned),
            message: "port 70000 is out of range (1-65535)".into(),
        };
        let document = Origin::File {
            path: "dir/x.yaml".into(),
            document: Some(1),
            line: Some(12),
            object: Some("Service web".into()),
        };
        assert_eq!(
            diag(document, Some("spec.ports[0].port")).to_string(),
            "dir/x.yaml:12 document 2 (Service web) field spec.ports[0].port: port 70000 is out of range (1-65535)"
        );
        assert_eq!(
            diag(Origin::file("dir/x.yaml"), None).to_string(),
            "dir/x.yaml: port 70000 is out of range (1-65535)"
        );
        let api = Origin::Api(ObjectId::new(Kind::Service, ObjKey::new("default", "web")));
        assert_eq!(
            diag(api, Some("spec.x")).to_string(),
            "Service default/web field spec.x: port 70000 is out of range (1-65535)"
        );
        assert_eq!(
            diag(Origin::Api(ObjectId::node("node-1")), None).to_string(),
            "Node node-1: port 70000 is out of range (1-65535)"
        );
    }
}
