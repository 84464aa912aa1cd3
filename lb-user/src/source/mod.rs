//! Where the model comes from: a directory of manifests, or (agent `--kube`) the API server.
pub mod convert;
pub mod kube;
pub mod manifests;

/// A source the agent re-reads whenever it signals a change.
pub trait ModelSource: Send {
    /// The current model, with problems found in the input. Fails only when the source cannot be read at
    /// all (the agent then keeps the current maps).
    fn load(&mut self) -> std::io::Result<manifests::Loaded>;
    /// For messages: "the API server", "directory /etc/tierlb".
    fn describe(&self) -> String;
}

impl ModelSource for manifests::ManifestDir {
    fn load(&mut self) -> std::io::Result<manifests::Loaded> {
        manifests::ManifestDir::load(self)
    }
    fn describe(&self) -> String {
        format!("directory {}", self.dir().display())
    }
}
