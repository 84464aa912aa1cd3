//! The programs of the BPF object, by function name: what the loader attaches and `pins` names links after.
/// The programs in the object, by function name; all are attached to the agent's cgroup, in this order. All
/// are `cgroup/sock_addr` programs but `RELEASE_PROGRAM` and `HEALTH_PROGRAM`. The programs that read or
/// delete reverse entries come before those that write them: an agent replacing another version's programs
/// one by one never has a new writer beside an old reader or release hook that does not know where the new
/// one writes (a TCP socket's entry moved from the LRU to the `REVERSE_TCP` slots: an old `sock_release`
/// would leave a closed socket's slot held for good). The new readers find the old writers' entries. Going
/// back to a version without the slots leaves the slots held at the switch; its programs never read them,
/// and this version's `--cleanup` removes their pin.
pub const PROGRAMS: &[&str] = &[
    "recvmsg4",
    "recvmsg6",
    "getpeername4",
    "getpeername6",
    RELEASE_PROGRAM,
    HEALTH_PROGRAM,
    "connect4",
    "connect6",
    "sendmsg4",
    "sendmsg6",
];

/// The `sock_ops` program: passive health, from the outcome of the TCP connects the others translated.
pub const HEALTH_PROGRAM: &str = "sock_ops";

/// The `cgroup/sock_release` program: deletes a closed socket's reverse entries outside its own storage.
pub const RELEASE_PROGRAM: &str = "sock_release";

#[cfg(test)]
mod tests {
    use super::*;

    /// The order `PROGRAMS` documents, which an upgrade relies on: every program that reads or releases
    /// reverse entries attaches before any that writes them.
    #[test]
    fn the_reverse_readers_and_the_release_hook_attach_before_the_writers() {
        let at = |name: &str| PROGRAMS.iter().position(|p| *p == name).expect(name);
        let readers =
            ["recvmsg4", "recvmsg6", "getpeername4", "getpeername6", RELEASE_PROGRAM, HEALTH_PROGRAM];
        let writers = ["connect4", "connect6", "sendmsg4", "sendmsg6"];
        let last_reader = readers.map(at).into_iter().max();
        let first_writer = writers.map(at).into_iter().min();
        assert!(last_reader < first_writer, "{PROGRAMS:?}");
        assert_eq!(readers.len() + writers.len(), PROGRAMS.len(), "every program is one or the other");
    }
}
