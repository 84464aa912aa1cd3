//! tierlb: a per-node agent that turns Services and EndpointSlices (with their topology hints) into eBPF
//! maps, and cgroup sock_addr programs that rewrite Service VIPs to node-local, same-zone or cluster-wide
//! endpoints at connect() time, choosing the tier in the kernel.
#![warn(missing_docs)]
pub mod agent;
pub mod cgroup;
pub mod chart;
pub mod cli;
pub mod datapath;
pub mod explain;
mod halves;
pub mod hints;
pub mod lint;
pub mod metrics;
pub mod model;
pub mod output;
pub mod plan;
pub mod preflight;
pub mod server;
pub mod skipped;
pub mod source;
mod spelling;
pub mod status;
pub mod study;
pub mod trace;
