//! What is attached to a cgroup, as the kernel says (`BPF_PROG_QUERY`), compared with what the agent
//! attached: its programs detached behind its back (link pins removed, `bpftool cgroup detach`), and
//! programs of another tierlb instance (another `--instance` or `--bpffs`) on the same cgroup, which run
//! before or after the agent's and translate with their own, stale, maps.
use std::{fs::File, os::fd::AsRawFd as _};

use super::{error::DatapathError, error::bpf_err};

/// `BPF_PROG_QUERY`.
const BPF_PROG_QUERY: libc::c_long = 16;

/// Each program's cgroup attach type (`enum bpf_attach_type`).
pub(crate) const ATTACH_TYPES: [(&str, u32); 10] = [
    ("connect4", 10),
    ("connect6", 11),
    ("sendmsg4", 14),
    ("sendmsg6", 15),
    ("recvmsg4", 19),
    ("recvmsg6", 20),
    ("getpeername4", 29),
    ("getpeername6", 30),
    ("sock_release", 34),
    ("sock_ops", 3),
];

/// The `query` part of `union bpf_attr` up to `revision` (kernel 6.6); zeroed fields the kernel does not
/// know are accepted.
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The ids of the programs attached to `cgroup` (itself, not inherited) for `attach_type`, in run order.
pub(crate) fn attached_ids(cgroup: &File, attach_type: u32) -> std::io::Result<Vec<u32>> {
    query(cgroup, attach_type, 0)
}

/// The ids of the programs that run for `cgroup` at `attach_type`: its own and those attached above it
/// (`BPF_F_QUERY_EFFECTIVE`), in run order.
pub(crate) fn effective_ids(cgroup: &File, attach_type: u32) -> std::io::Result<Vec<u32>> {
    query(cgroup, attach_type, 1)
}

fn query(cgroup: &File, attach_type: u32, query_flags: u32) -> std::io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = QueryAttr {
            target_fd: cgroup.as_raw_fd().cast_unsigned(),
            attach_type,
            query_flags,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            ..QueryAttr::default()
        };
        // `prog_ids` points at `prog_cnt` u32s that live until the call returns.
        let r = super::sys::bpf(BPF_PROG_QUERY, &mut attr);
        let count = attr.prog_cnt as usize;
        match r {
            Ok(_) => {
                ids.truncate(count);
                return Ok(ids);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && count > ids.len() => ids.resize(count, 0),
            Err(e) => return Err(e),
        }
    }
}

/// The names of the programs loaded on the system, by id (as the kernel keeps them: 15 bytes at most).
pub(crate) fn loaded_names() -> std::collections::BTreeMap<u32, String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| (p.id(), p.name_as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// What the kernel says about the agent's programs on its cgroup.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Attachment {
    /// The agent's programs that are not attached (by name).
    pub missing: Vec<&'static str>,
    /// Other programs with the names of the agent's on the cgroup: (name, program id).
    pub foreign: Vec<(&'static str, u32)>,
}

impl Attachment {
    /// Everything attached as the agent attached it, and nothing of another instance.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.foreign.is_empty()
    }
}

/// Compare what `cgroup` runs with `ours` (each program's name and id; `None`: not attached by this agent
/// yet, so only foreign programs are looked for), leaving out the ids in `allowed` (the links this instance
/// pinned earlier, which its attach replaces).
pub fn check(
    cgroup: &std::path::Path,
    ours: &[(&'static str, Option<u32>)],
    allowed: &[u32],
) -> Result<Attachment, DatapathError> {
    let file = File::open(cgroup).map_err(|e| bpf_err(format!("opening cgroup {}", cgroup.display()), e))?;
    let mut names: Option<std::collections::BTreeMap<u32, String>> = None;
    let mut out = Attachment::default();
    for &(name, id) in ours {
        let Some(&(_, attach_type)) = ATTACH_TYPES.iter().find(|(n, _)| *n == name) else { continue };
        let attached = attached_ids(&file, attach_type)
            .map_err(|e| bpf_err(format!("querying {name} programs of {}", cgroup.display()), e))?;
        if let Some(id) = id
            && !attached.contains(&id)
        {
            out.missing.push(name);
        }
        for other in attached.iter().filter(|a| Some(**a) != id && !allowed.contains(a)) {
            // Names of the programs loaded on the system, read once and only when something else is attached.
            let names = names.get_or_insert_with(loaded_names);
            if names.get(other).is_some_and(|n| n == name) {
                out.foreign.push((name, *other));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_program_has_its_attach_type() {
        for p in super::super::programs::PROGRAMS {
            assert!(super::ATTACH_TYPES.iter().any(|(n, _)| n == p), "{p} has no attach type");
        }
        assert_eq!(super::ATTACH_TYPES.len(), super::super::programs::PROGRAMS.len());
    }
}
