//! Where the model comes from: a directory of manifests, or (agent `--kube`) the API server.
pub mod convert;
pub mod kube;
pub mod manifests;

use std::path::PathBuf;

use manifests::{Diagnostic, Loaded, Object};

use crate::model::Model;

/// A source the agent refreshes whenever it signals a change. Sources report what changed, so that one
/// edited EndpointSlice costs the agent one Service's replanning, not the whole cluster's.
pub trait ModelSource: Send {
    /// What changed since the last call (everything, on the first one), with the problems found in the input.
    /// Fails only when the source cannot be read at all (the agent then keeps the current maps).
    fn refresh(&mut self) -> std::io::Result<Refresh>;
    /// The whole model as the source has it now (for one-shot readers and tests; the agent uses `refresh`).
    fn load(&mut self) -> std::io::Result<Loaded>;
    /// For messages: "the API server", "directory /etc/tierlb".
    fn describe(&self) -> String;
}

/// The result of one refresh.
#[derive(Debug)]
pub struct Refresh {
    pub changes: Changes,
    /// Every problem the input has now (not only in what changed).
    pub diagnostics: Vec<Diagnostic>,
    /// Files whose objects come from an earlier version because the current content has errors.
    pub stale_files: Vec<PathBuf>,
}

#[derive(Debug)]
pub enum Changes {
    /// Start over from this model (first refresh, or a change the source cannot express as a difference).
    All(Model),
    /// Apply `removed` first, then `upserted` (an object that moved between files is in both).
    Objects { removed: Vec<Object>, upserted: Vec<Object> },
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Objects { removed, upserted } if removed.is_empty() && upserted.is_empty())
    }
}

impl ModelSource for manifests::ManifestDir {
    fn refresh(&mut self) -> std::io::Result<Refresh> {
        manifests::ManifestDir::refresh(self)
    }
    fn load(&mut self) -> std::io::Result<Loaded> {
        manifests::ManifestDir::load(self)
    }
    fn describe(&self) -> String {
        format!("directory {}", self.dir().display())
    }
}
