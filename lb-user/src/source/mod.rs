//! Where the model comes from: a directory of manifests, or (agent `--kube`) the API server.
pub mod convert;
pub mod manifests;
