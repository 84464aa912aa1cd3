//! The layer tables: each crate's parts, bottom up, with why each sits where it does.

/// One part of a crate: the modules it holds (a module's children belong to it) and the parts directly
/// below it. A file may import its own part and every part below it, transitively; nothing else.
pub(crate) struct Part {
    pub(crate) name: &'static str,
    pub(crate) modules: &'static [&'static str],
    pub(crate) below: &'static [&'static str],
}

const fn part(name: &'static str, modules: &'static [&'static str], below: &'static [&'static str]) -> Part {
    Part { name, modules, below }
}

/// The crate root's own items (what lib.rs, or main.rs when it is the root, defines), as a module a part
/// holds. Its `mod` declarations and its `use`s at the top (re-exports) are not its items: a path to a
/// re-exported name reaches the module that holds it (resolve.rs).
pub(crate) const ROOT: &str = "crate";

/// The crate root's catalogue (`Crate::catalogue`), as a module a part holds.
pub(crate) const CATALOGUE: &str = "(crate root's catalogue)";

/// A crate as the checks read it.
pub(crate) struct Crate {
    /// Its directory in the workspace.
    pub(crate) dir: &'static str,
    /// For a crate with a library and a binary: the library's name as the binary writes it.
    pub(crate) lib_name: Option<&'static str>,
    pub(crate) table: &'static [Part],
    /// Files allowed one import beyond their part's: (module, part).
    pub(crate) exceptions: &'static [(&'static str, &'static str)],
    /// Items of the crate root that gather definitions from the modules above the root's own (lists of
    /// every map, impls for every map type), and macros the root calls at its top for the same (as
    /// `name!`): read as a part of their own (`CATALOGUE`), which the table places above what they name.
    pub(crate) catalogue: &'static [&'static str],
    /// Imports both checks let through for now.
    pub(crate) known: &'static [Known],
}

/// Imports of a misplaced definition, let through until it is moved (each list says where it belongs): the
/// importing module (`ROOT` for the crate root's own items) and the names it imports. An entry no import
/// needs any more is reported, so the list only shrinks.
pub(crate) struct Known {
    pub(crate) module: &'static str,
    pub(crate) names: &'static [&'static str],
}

pub(crate) const CRATES: &[Crate] = &[
    Crate {
        dir: "lb-user",
        lib_name: Some("tierlb"),
        table: LB_USER,
        exceptions: LB_USER_EXCEPTIONS,
        catalogue: &[],
        known: &[],
    },
    Crate {
        dir: "lb-common",
        lib_name: None,
        table: LB_COMMON,
        exceptions: &[],
        catalogue: LB_COMMON_CATALOGUE,
        known: LB_COMMON_KNOWN,
    },
    Crate { dir: "lb-ebpf", lib_name: None, table: LB_EBPF, exceptions: &[], catalogue: &[], known: &[] },
];

/// lb-user, bottom up. `main` is the binary (`main.rs`, which reads the library as `tierlb::`).
const LB_USER: &[Part] = &[
    // lib.rs declares the modules and defines nothing: it imports nothing, and a module that needs an item
    // of it must first place it here (below that module's part) deliberately.
    part("root", &[ROOT], &[]),
    // The model: Services, EndpointSlices, Nodes and the node's external-address settings.
    part("model", &["model"], &[]),
    // Work split over two threads (no tierlb type): the conversion and the planning use it.
    part("halves", &["halves"], &[]),
    // "Did you mean" (no tierlb type): the sources' unknown-field warnings and the faces' unknown node.
    part("spelling", &["spelling"], &[]),
    // Semantics: pure functions of the model. The hint rules and what is not programmed, the plan (which
    // calls both), the lints (which read a plan).
    part("hints", &["hints", "skipped"], &["model"]),
    part("plan", &["plan"], &["hints"]),
    part("lint", &["lint"], &["plan", "spelling"]),
    // Sources, data path and cgroups: siblings of the semantics, none imports another.
    part("source", &["source"], &["model", "halves", "spelling"]),
    part("datapath", &["datapath"], &["model"]),
    part("cgroup", &["cgroup"], &[]),
    part("metrics", &["metrics"], &["datapath", "source"]),
    part("agent", &["agent"], &["metrics", "lint", "cgroup"]),
    // Faces: what a user or a scraper sees. Servers and the reports that read pins first, then the commands
    // built on them, then the command line.
    part("output", &["output"], &[]),
    part("server", &["server"], &["agent"]),
    part("status", &["status"], &["agent"]),
    part("study", &["study"], &["agent"]),
    part("explain", &["explain"], &["status"]),
    part("trace", &["trace"], &["server", "output"]),
    part("chart", &["chart"], &["study"]),
    // The node's checks before the agent trusts it: the data path's programs and pins, the servers' listen
    // addresses, and the output formats.
    part("preflight", &["preflight"], &["server", "output"]),
    part("cli", &["cli"], &["explain", "trace", "chart", "output", "preflight"]),
    part("main", &["main"], &["cli"]),
];

/// Files allowed one import beyond their part's: the agent's run loop starts the servers it reports to.
const LB_USER_EXCEPTIONS: &[(&str, &str)] = &[("agent/run", "server")];

/// lb-common, bottom up: the root's map keys and values, the modules that build on them (none reads
/// another), and the root's lists over every map on top.
const LB_COMMON: &[Part] = &[
    // lib.rs's own items: the frontend, slot, backend, affinity and member keys and values, tiers, protocols,
    // flags and map names, which every module below reads; they read nothing of the crate.
    part("root", &[ROOT], &[]),
    // Checksum arithmetic over plain numbers: no tierlb type.
    part("csum", &["csum"], &[]),
    // The per-Service counter indices, laid out by tier (the root's `TIER_*`).
    part("counters", &["counters"], &["root"]),
    // Passive health, kept per backend (the root's `Backend`).
    part("health", &["health"], &["root"]),
    // The reverse records of translated sockets: a backend back to its frontend (`Backend`, `FrontendKey`).
    part("reverse", &["reverse"], &["root"]),
    // The trace events: a frontend and the backend chosen (`Backend`, `FrontendKey`).
    part("trace", &["trace"], &["root"]),
    // North-south NAT: conntrack, source ranges and outside affinity, keyed by frontend (`FrontendKey`).
    // The SNAT ports as one numbered set (plain port numbers).
    part("snat", &["snat"], &[]),
    part("nat", &["nat"], &["root", "snat"]),
    // The tier choice the data path makes: reads a frontend's tier ranges and a member's flags.
    part("choice", &["choice"], &["root"]),
    // Maglev's tables and flow hash for traffic from outside (its capacity from the root's frontend count).
    part("maglev", &["maglev"], &["root"]),
    // Direct server return's flags and its IPv4 option (plain numbers).
    part("dsr", &["dsr"], &[]),
    // lib.rs's lists of every map (`MAPS`, `PINNED_ONLY`, `NS_MAPS`, `PINNED_MAPS`) and `aya::Pod` for every
    // map type (`aya_pod!`): they name the modules' map names and types, so they sit above those modules.
    part("catalogue", &[CATALOGUE], &["counters", "health", "reverse", "trace", "nat", "maglev"]),
];

/// lib.rs's items and top-level macro calls that read the modules (the `catalogue` part above). They are
/// written in lib.rs, whose other items those modules read, so lib.rs and `reverse.rs`, `trace.rs`, `nat.rs`
/// (and through `aya_pod!`, `counters.rs` and `health.rs`) name each other as files; moving them into a
/// module of their own on top would leave lib.rs only the bottom part, and this list empty.
const LB_COMMON_CATALOGUE: &[&str] = &["MAPS", "PINNED_ONLY", "NS_MAPS", "PINNED_MAPS", "aya_pod!"];

/// Imports against the table that are known and waiting for a fix: none.
const LB_COMMON_KNOWN: &[Known] = &[];

/// lb-ebpf, bottom up: the program files (one per hook family) call down into helpers, never back.
const LB_EBPF: &[Part] = &[
    // main.rs: the license and the panic handler, which no module reads and which read nothing.
    part("root", &[ROOT], &[]),
    part("maps", &["maps", "counters", "netns_count"], &[]),
    part("helpers", &["affinity", "health", "reverse", "scan", "trace"], &["maps"]),
    part("programs", &["sock_addr", "sock", "tc"], &["helpers"]),
];
