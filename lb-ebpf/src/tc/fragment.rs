//! Fragments of translated flows, tracked as Cilium does (`bpf/lib/ipv4.h`, `ipv6.h`): only a datagram's
//! first fragment carries its ports, so when a first fragment is translated its ports are kept under the
//! datagram's (source, destination, id, protocol), and the later fragments take them from there and get the
//! same conntrack entry's address rewrite (their bytes hold no TCP/UDP header; the first fragment's checksum
//! update covers the whole datagram). IPv4's id is the header's 16 bits; IPv6's the 32 of a Fragment header
//! directly after the fixed header (the form a sender's stack and the kernel's own fragmentation use; a
//! datagram with other extension headers before it is passed on, counted). A later fragment with no kept
//! ports (not a translated flow's, or ahead of its first fragment) is passed on untranslated and counted
//! (`NS_PASS_FRAGMENT`). The key is what every fragment carries; a datagram of the same client to the same
//! node address that is not translated but reuses a kept id within the lifetime (its sender's id counter
//! wrapped) would have its later fragments rewritten like the kept one's.
use aya_ebpf::helpers::bpf_ktime_get_boot_ns;
use lb_common::{FRAGMENT_LIFETIME_NS, NS_PASS_FRAGMENT};

use super::NOT_OURS;
use crate::{
    counters::count_ns,
    maps::{FRAGMENTS, FragKey, FragPorts},
};

/// `Flow::frag`: not a fragment.
pub(crate) const WHOLE: u8 = 0;
/// `Flow::frag`: the first fragment of a datagram (offset 0, more fragments): its ports are in it.
pub(crate) const FIRST: u8 = 1;
/// `Flow::frag`: a later fragment, its ports taken from the first one's (`ports`).
pub(crate) const LATER: u8 = 2;

/// The ports a later fragment's datagram (`key`: its addresses, id, protocol and family) had in its first
/// fragment, if that was translated within the lifetime.
#[inline(always)]
pub(crate) fn ports(key: &FragKey) -> Option<(u16, u16)> {
    // SAFETY: a plain read of an LRU value.
    let p = unsafe { FRAGMENTS.get(key) }?;
    if p.expires_ns <= now() {
        return None;
    }
    Some((p.sport, p.dport))
}

/// Now, on the boot clock (as conntrack's).
#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_boot_ns() }
}

/// Keep the ports (`sport`, `dport`) of a datagram's first fragment, just translated, for its later
/// fragments: the datagram is `key`, its source, destination, id and protocol as they arrived.
#[inline(always)]
pub(crate) fn record(key: &FragKey, sport: u16, dport: u16) {
    let v = FragPorts { sport, dport, _pad: 0, expires_ns: now() + FRAGMENT_LIFETIME_NS };
    let _ = FRAGMENTS.insert(key, v, 0);
}

/// A fragment that is passed on untranslated: counted.
#[inline(always)]
pub(crate) fn passed() -> i32 {
    count_ns(NS_PASS_FRAGMENT);
    NOT_OURS
}
