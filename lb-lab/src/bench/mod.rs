//! `cargo xtask bench`: connect() cost through tierlb against direct connects and kube-proxy-style iptables
//! and nftables rules, at several Service counts, in one run inside a private netns; and control-plane
//! figures (programming 10,000 Services, one change, agent memory, rule-set load times).
//!
//! [`load`] is the load generator (`tierlb-lab load`), `workloads` what is measured, [`run`] the run,
//! [`markdown`] BENCHMARKS.md and [`charts`] the charts beside it.
mod charts;
mod figures;
#[cfg(test)]
mod fixture;
mod load;
mod report;
mod run;
mod workloads;

pub use charts::charts;
pub use figures::{
    AgentFigures, ControlPlane, DataPath, LoadTime, MapMemory, MapWrites, Report, Row, RuleLoad, Spread,
};
pub use load::{LoadMode, LoadResult, RR_BYTES, load};
pub use report::markdown;
pub use run::run;
pub use workloads::{iptables_rules, nft_rules};
