//! The lab: what the demo, the in-kernel tests and the benchmarks share. Manifests written the way the
//! control plane would, a probe client that reports which backend answered, and the demo scenario.
pub mod bench;
pub mod cluster;
pub mod demo;
pub mod dns;
pub mod manifests;
pub mod probe;
