//! The six maps: `FRONTENDS`, `SLOTS`, `BACKEND_STATE`, `COUNTERS`, `SVC_NAMES` (user space only) and
//! `REVERSE`. User space opens them by the `lb_common::MAP_*` constants, but `#[map(name = ..)]` takes only a
//! literal (it becomes the symbol's `export_name`); `named_map!` checks at compile time that each literal is
//! its constant, so the two spellings cannot drift apart.
//! Sizes here are defaults; the agent overrides them before load (`EbpfLoader::set_max_entries`).
//! `pub(crate)` is enough: the symbol `#[map]` exports is what puts a map in the object.
use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use lb_common::{
    Backend, BackendState, COUNTERS_PER_SERVICE, DEFAULT_MAX_BACKENDS, DEFAULT_MAX_FRONTENDS,
    DEFAULT_MAX_REVERSE, DEFAULT_MAX_SLOTS, FrontendKey, FrontendValue, MAP_BACKEND_STATE, MAP_COUNTERS,
    MAP_FRONTENDS, MAP_NAMES, MAP_REVERSE, MAP_SLOTS, ReverseKey, ReverseValue, ServiceName, SlotKey,
};

/// `a == b` at compile time (`str` equality is not `const`).
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `#[map(name = $name)]` on `$item`, and a build error unless `$name` equals `lb_common`'s `$constant`.
macro_rules! named_map {
    ($constant:ident == $name:tt, $item:item) => {
        const _: () = assert!(same($constant, $name), "map name differs from its lb_common constant");
        #[map(name = $name)]
        $item
    };
}

named_map!(
    MAP_FRONTENDS == "FRONTENDS",
    /// Service frontends: VIP, port, protocol -> svc_id, generation, tier ranges, flags.
    pub(crate) static FRONTENDS: HashMap<FrontendKey, FrontendValue> =
        HashMap::with_max_entries(DEFAULT_MAX_FRONTENDS, 0);
);

named_map!(
    MAP_SLOTS == "SLOTS",
    /// Backend slots of every frontend's tiers, by (svc_id, generation, index).
    pub(crate) static SLOTS: HashMap<SlotKey, Backend> = HashMap::with_max_entries(DEFAULT_MAX_SLOTS, 0);
);

named_map!(
    MAP_BACKEND_STATE == "BACKEND_STATE",
    /// Backends marked down until a time (`BackendState`); absent or expired means up. One write moves new
    /// connects away.
    pub(crate) static BACKEND_STATE: HashMap<Backend, BackendState> =
        HashMap::with_max_entries(DEFAULT_MAX_BACKENDS, 0);
);

named_map!(
    MAP_COUNTERS == "COUNTERS",
    /// Per-CPU counters at `counter_index(svc_id, kind)`.
    pub(crate) static COUNTERS: PerCpuArray<u64> =
        PerCpuArray::with_max_entries((DEFAULT_MAX_FRONTENDS + 1) * COUNTERS_PER_SERVICE, 0);
);

named_map!(
    MAP_NAMES == "SVC_NAMES",
    /// Service names by svc_id, for user space only (status, adoption after a restart).
    pub(crate) static SVC_NAMES: HashMap<u32, ServiceName> =
        HashMap::with_max_entries(DEFAULT_MAX_FRONTENDS + 1, 0);
);

named_map!(
    MAP_REVERSE == "REVERSE",
    /// Reverse translation for recvmsg (the reply's source) and getpeername: (socket cookie, backend) -> VIP.
    ///
    /// An LRU hash rather than socket-local storage: socket storage holds one value per socket, but one
    /// unconnected UDP socket may talk to many Services (a resolver to several DNS VIPs); LRU bounds the memory
    /// of entries whose socket closed without telling us, and the oldest go first.
    pub(crate) static REVERSE: LruHashMap<ReverseKey, ReverseValue> =
        LruHashMap::with_max_entries(DEFAULT_MAX_REVERSE, 0);
);
