//! The programs of the BPF object, by function name: what the loader attaches and `pins` names links after.
/// The programs in the object, by function name; all are attached to the agent's cgroup. All are
/// `cgroup/sock_addr` programs but `RELEASE_PROGRAM` and `HEALTH_PROGRAM`.
pub const PROGRAMS: &[&str] = &[
    "connect4",
    "connect6",
    "sendmsg4",
    "sendmsg6",
    "recvmsg4",
    "recvmsg6",
    "getpeername4",
    "getpeername6",
    RELEASE_PROGRAM,
    HEALTH_PROGRAM,
];

/// The `sock_ops` program: passive health, from the outcome of the TCP connects the others translated.
pub const HEALTH_PROGRAM: &str = "sock_ops";

/// The `cgroup/sock_release` program: deletes a closed socket's reverse entries outside its own storage.
pub const RELEASE_PROGRAM: &str = "sock_release";
