//! The maps, named by the constants in `lb_common` so user space opens them by the same names.
//! Sizes here are defaults; the agent overrides them before load (`EbpfLoader::set_max_entries`).
use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use lb_common::{
    Backend, COUNTERS_PER_SERVICE, DEFAULT_MAX_BACKENDS, DEFAULT_MAX_FRONTENDS, DEFAULT_MAX_REVERSE,
    DEFAULT_MAX_SLOTS, FrontendKey, FrontendValue, ReverseKey, ReverseValue, ServiceName, SlotKey,
};

#[map(name = "FRONTENDS")]
pub static FRONTENDS: HashMap<FrontendKey, FrontendValue> =
    HashMap::with_max_entries(DEFAULT_MAX_FRONTENDS, 0);

#[map(name = "SLOTS")]
pub static SLOTS: HashMap<SlotKey, Backend> = HashMap::with_max_entries(DEFAULT_MAX_SLOTS, 0);

/// Backends marked down (value has `BACKEND_DOWN`); absent means up. One write moves new connects away.
#[map(name = "BACKEND_STATE")]
pub static BACKEND_STATE: HashMap<Backend, u32> = HashMap::with_max_entries(DEFAULT_MAX_BACKENDS, 0);

/// Per-CPU counters at `counter_index(svc_id, kind)`.
#[map(name = "COUNTERS")]
pub static COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries((DEFAULT_MAX_FRONTENDS + 1) * COUNTERS_PER_SERVICE, 0);

/// Service names by svc_id, for user space only (status, adoption after a restart).
#[map(name = "SVC_NAMES")]
pub static SVC_NAMES: HashMap<u32, ServiceName> = HashMap::with_max_entries(DEFAULT_MAX_FRONTENDS + 1, 0);

/// Reverse translation for recvmsg (the reply's source) and getpeername: (socket cookie, backend) -> VIP.
///
/// An LRU hash rather than socket-local storage: socket storage holds one value per socket, but one
/// unconnected UDP socket may talk to many Services (a resolver to several DNS VIPs); LRU bounds the memory
/// of entries whose socket closed without telling us, and the oldest go first.
#[map(name = "REVERSE")]
pub static REVERSE: LruHashMap<ReverseKey, ReverseValue> =
    LruHashMap::with_max_entries(DEFAULT_MAX_REVERSE, 0);
