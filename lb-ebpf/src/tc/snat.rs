//! The SNAT path's source for a new flow to a remote backend: the node address it leaves from
//! (`snat_address`) and a free port of the SNAT range for it (`snat`), claimed by writing the flow's reply entry.
use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_get_prandom_u32, generated::bpf_loop};
use lb_common::{
    ADDR_NODE, AddrKey, CT_DIR_IN, CT_SNAT, CtKey, CtValue, FAMILY_V4, FLAG_SNAT_TO_FRONTEND, FrontendValue,
    NS_SNAT_PORT_KEPT, NS_SNAT_PORT_RETRIES, NatConfig, SNAT_TRIES, SnatPorts,
};

use super::{Flow, conntrack, frame::Frame, route};
use crate::{counters::count_ns, maps::NS_ADDRS};

/// Turn a new flow's entries into an SNAT flow's from `node`: claim a free port of the SNAT range for the
/// (backend, node address) pair by writing the reply entry there (`false`: every try found a live flow).
#[inline(always)]
pub(super) fn snat(
    f: &Flow,
    node: [u32; 4],
    fwd: &mut CtValue,
    reply_key: &mut CtKey,
    reply: &mut CtValue,
    cfg: &NatConfig,
    t: u64,
) -> bool {
    fwd.flags |= CT_SNAT;
    fwd.b = node;
    reply.flags = CT_SNAT;
    reply.b = f.saddr;
    reply.b_port = f.sport;
    reply_key.daddr = node;
    reply_key.dir = CT_DIR_IN;
    let ports = cfg.snat_ports();
    if ports.count() == 0 {
        // The node's ephemeral range covers every SNAT port: none to give (the agent logs it).
        return false;
    }
    // The client's own port first (kube-proxy's masquerade keeps it when the tuple is free), if it is one
    // of the SNAT ports: outside the node's ephemeral range, so no socket of the node is given it
    // automatically for the same backend.
    if ports.contains(u16::from_be(f.sport)) {
        reply_key.dport = f.sport;
        if conntrack::claim(reply_key, reply, t) {
            fwd.b_port = reply_key.dport;
            count_ns(NS_SNAT_PORT_KEPT);
            return true;
        }
        count_ns(NS_SNAT_PORT_RETRIES);
    }
    // SAFETY: helper without preconditions.
    let seed = unsafe { bpf_get_prandom_u32() };
    // The tries under `bpf_loop`: the verifier checks one try, not each of `SNAT_TRIES` (as a loop, Linux
    // 6.1's verifier went past its million instructions on tc_ingress).
    let mut tries = PortTries { key: reply_key, value: reply, ports, seed, t, claimed: false };
    // SAFETY: the callback has the signature `bpf_loop` calls and takes the context given here.
    unsafe {
        bpf_loop(SNAT_TRIES, try_port as *mut c_void, (&raw mut tries).cast(), 0);
    }
    if tries.claimed {
        fwd.b_port = tries.key.dport;
    }
    tries.claimed
}

/// `snat`'s tries, for `try_port`.
struct PortTries<'a> {
    key: &'a mut CtKey,
    value: &'a CtValue,
    ports: SnatPorts,
    seed: u32,
    t: u64,
    claimed: bool,
}

/// `bpf_loop`'s callback: try `attempt`'s port; 1 (stop) once one is claimed.
extern "C" fn try_port(attempt: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `PortTries` `snat` passed, alive for the whole `bpf_loop` call.
    let c = unsafe { &mut *ctx.cast::<PortTries<'_>>() };
    c.key.dport = c.ports.pick(c.seed, attempt as u32).to_be();
    if conntrack::claim(c.key, c.value, c.t) {
        c.claimed = true;
        return 1;
    }
    count_ns(NS_SNAT_PORT_RETRIES);
    0
}

/// Whether `addr` is one of the node's addresses on a device with `tc_ingress` (`ADDR_NODE` in the
/// pre-filter), where an SNAT flow's replies to it are translated.
#[inline(always)]
fn node_address(addr: &[u32; 4], family: u8) -> bool {
    // SAFETY: a plain read of a hash value.
    NS_ADDRS
        .get_ptr(AddrKey { addr: *addr, family, _pad: [0; 3] })
        .is_some_and(|p| unsafe { *p } & ADDR_NODE != 0)
}

/// The node address an SNAT flow leaves from: the frontend's own address for a node port (the address the
/// client reached, so the reply path is the request's); for a load-balancer IP or externalIP the source the
/// node's routing gives a packet to the backend (`route::source`: the egress device's address, as the
/// stack's own forwarding and MASQUERADE would pick) when it is an address of a device with `tc_ingress`
/// (so the reply is translated where it arrives; not a tunnel's), else, and on a kernel without
/// `BPF_FIB_LOOKUP_SRC`, the node's address of the family the agent configured (`NatConfig::snat_v4` /
/// `snat_v6`).
#[inline(always)]
pub(super) fn snat_address<C: Frame>(
    ctx: &C,
    fe: &FrontendValue,
    f: &Flow,
    cfg: &NatConfig,
    backend: &[u32; 4],
) -> Option<[u32; 4]> {
    if fe.flags & FLAG_SNAT_TO_FRONTEND != 0 {
        return Some(f.daddr);
    }
    let mut routed = [0u32; 4];
    if route::source(ctx, f.family, backend, &mut routed) && node_address(&routed, f.family) {
        return Some(routed);
    }
    let a = if f.family == FAMILY_V4 { [cfg.snat_v4, 0, 0, 0] } else { cfg.snat_v6 };
    if a == [0; 4] { None } else { Some(a) }
}
