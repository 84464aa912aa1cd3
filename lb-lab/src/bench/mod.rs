//! `cargo xtask bench`: connect() cost through tierlb against direct connects and kube-proxy-style iptables
//! and nftables rules, at several Service counts, in one run inside a private netns; and control-plane
//! figures (programming 10,000 Services, one change, agent memory, rule-set load times).
//!
//! One job a module: `load` is the load generator ([`load`], run as `tierlb-lab load`) and the backend it
//! talks to; `workloads` what is measured (the Service maps, the kube-proxy-style rule sets, the agent's
//! manifests); `run` the run ([`run`]); `figures` what it measured, as data ([`Report`]); `report` renders
//! BENCHMARKS.md ([`markdown`]) and `charts` the charts beside it ([`charts`]).
mod agent;
mod apiserver;
mod charts;
mod connect4;
mod conntrack;
mod figures;
#[cfg(test)]
pub(crate) mod fixture;
mod kube_proxy;
mod load;
mod north_south;
mod north_south_kube_proxy;
mod north_south_rate;
mod north_south_snat;
mod real_apiserver;
mod report;
mod run;
mod scale_charts;
mod tracing;
mod workloads;
mod xdp;

pub use agent::agent_only;
pub use charts::charts;
pub use figures::{
    AgentFigures, AgentSource, ControlPlane, CtMemory, DataPath, KubeProxySync, LoadTime, MapMemory,
    MapWrites, Report, Row, RuleLoad, Spread,
};
pub use load::{LoadMode, LoadResult, Placement, RR_BYTES, allowed_cpus, load, paced};
pub use north_south_snat::snat_only;
pub use report::markdown;
pub use run::{kube_proxy_only, on_node_only, run};
pub use workloads::{iptables_rules, nft_rules};
pub use xdp::xdp_only;
