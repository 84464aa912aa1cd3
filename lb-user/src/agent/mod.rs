//! The node agent: source -> change tracker -> plan -> lowering -> reconciler -> maps, again on every change.
//!
//! - `tracker`: the model, and which Services a change touches (kube-proxy's change trackers);
//! - `sync`: one sync without kernel or runtime (`AgentCore`), tested against in-memory maps;
//! - `claims`: which Service programs a VIP:port several claim (`plan::VIP_RULE`: a cluster IP over an
//!   external address, then the oldest Service, then the first in namespace/name order);
//! - `retry`: Services the data path could not take, tried again on a timer with backoff;
//! - `limits`: what one Service may take of the maps (`--max-*-per-service`), and the Services refused;
//! - `no_local`: kube-proxy's count of Local-policy ports without a local endpoint;
//! - `topology`: each Service port's requested and applied topology and why, for `/metrics`;
//! - `north_south`: the tc programs' devices, settings and local endpoints (traffic from outside the node);
//! - `lower`: plans to map contents and health check ports (the only place that turns semantics into maps);
//! - `report`: what a sync did, and what it logs; what the servers report from it (`ServiceHealth` for a
//!   health check node port, `Unprogrammed` for `/healthz`), defined here so the agent imports no server;
//! - `run`: the process (source, programs, servers, signal handling).
//!
//! Ordering rules of `run`, relied on by operators and tests:
//! 1. Signal handlers are installed first.
//! 2. Pinned maps of a previous agent are adopted before the first sync: traffic keeps flowing, and only what
//!    changed is rewritten.
//! 3. The first sync fills the maps before the programs are attached, so no connect sees a partial plan.
//! 4. `tierlb agent ready` is logged last, when programs, servers and health listeners are all up.
//! 5. Everything a sync changes (maps, health listeners, destroyed sockets) happens before its `synced` line.
//! 6. The health server answers from the start, before the source's first lists, the load and the first
//!    sync: `/livez` 200 (a slow start is not a dead agent), `/healthz` 503 until the first sync is done.
//!    `/metrics` is served once the maps are loaded, from a snapshot the loop takes after the first sync and
//!    then on its tick, at most once a second once the maps changed (never inside a sync).
//! 7. Services that failed to apply are tried again on the loop's tick when their backoff is due (`retry`),
//!    without a source event. A retry logs `retried`, never `synced` (tests and operators count `synced` as
//!    one per source change), and like a sync finishes its changes before its line.
//! 8. Marks of backends no Service holds any more are deleted after every sync or retry that changed
//!    frontends (before the next source change is read); expired marks on the tick, once a second.
mod claims;
mod limits;
mod lower;
pub mod memory;
mod no_local;
mod north_south;
mod options;
mod report;
mod retry;
mod run;
mod sync;
#[cfg(test)]
mod tests;
mod topology;
mod tracker;

pub use limits::{DEFAULT_LIMITS, ServiceLimits};
pub use no_local::{NoLocalCounts, Traffic};
pub use options::{AgentOptions, LbAlgorithm, Source};
pub use report::{ServiceHealth, SyncReport, Unprogrammed, VipConflict};
pub use retry::{RETRY_FIRST, RETRY_MAX, backoff};
pub use run::run;
pub use sync::AgentCore;
pub use tracker::{ChangeTracker, Taken, Touched};
