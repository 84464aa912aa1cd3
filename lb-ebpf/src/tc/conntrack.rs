//! Connection tracking of translated flows: two entries per flow (see `lb_common::nat`), refreshed by every
//! packet, their lifetime driven by the TCP state (SYN only, established, closing) or UDP's idle time. An
//! expired entry is treated as absent; the LRU reclaims it.
use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_boot_ns};
use lb_common::{
    CT_CLOSING, CT_DIR_IN, CT_DIR_OUT, CT_FORWARD, CT_SEEN_REPLY, CT_SNAT, CtKey, CtValue, NatConfig,
    PROTO_TCP,
};

use super::packet::{Flow, TCP_FIN, TCP_RST, TCP_SYN};
use crate::maps::{CONNTRACK, NAT_CONFIG};

/// The settings the agent wrote (an array's entry always exists: all zero, the defaults, until written).
#[inline(always)]
pub(crate) fn config() -> Option<&'static NatConfig> {
    NAT_CONFIG.get(0)
}

/// Now, on the clock entries' expiry times use.
#[inline(always)]
pub(crate) fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_boot_ns() }
}

/// The key of `f` as seen in direction `dir`.
#[inline(always)]
pub(crate) fn key(f: &Flow, dir: u8) -> CtKey {
    CtKey {
        saddr: f.saddr,
        daddr: f.daddr,
        sport: f.sport,
        dport: f.dport,
        proto: f.proto,
        family: f.family,
        dir,
        _pad: 0,
    }
}

/// The live entry at `key`, refreshed by this packet (`f`): its lifetime from now, and `CT_CLOSING` once a
/// FIN or RST passes (on both entries of the flow: the other direction may never see a packet again). The
/// entry in the map, not a copy (the stack is bounded): its translation fields are written once, when the
/// flow is created, and an LRU element is not reused before an RCU grace period.
///
/// A SYN (a client's, or a server's SYN-ACK) on a closing flow's entry is a new connection that reuses the
/// tuple (a client port reused after the RST or FIN): the entry is removed, so a client's SYN starts a new
/// flow and a connection that is not translated (a direct one from the same client port) is left alone from
/// its SYN-ACK on.
#[inline(always)]
pub(crate) fn hit(key: &CtKey, f: &Flow, cfg: &NatConfig, t: u64) -> Option<&'static CtValue> {
    let p = CONNTRACK.get_ptr_mut(key)?;
    // SAFETY: an LRU value stays mapped for the program's run; a concurrent update of the same flow's entry
    // on another CPU can only race this refresh of the same fields (a lost refresh, never a bad translation:
    // the translation fields are written once, at creation).
    let v = unsafe { &mut *p };
    if v.expires_ns <= t {
        return None;
    }
    let tcp = f.proto == PROTO_TCP;
    if tcp && v.flags & CT_CLOSING != 0 && f.tcp_flags & TCP_SYN != 0 {
        remove(key);
        return None;
    }
    if tcp && f.tcp_flags & (TCP_FIN | TCP_RST) != 0 && v.flags & CT_CLOSING == 0 {
        v.flags |= CT_CLOSING;
        close_other(key, v, cfg, t);
    }
    let established = v.flags & CT_SEEN_REPLY != 0;
    v.expires_ns = t + cfg.lifetime_ns(tcp, established, v.flags & CT_CLOSING != 0);
    Some(v)
}

/// Mark both entries of a flow as having seen its reply (`reply_key` was just hit, for the first time):
/// from now on TCP lives by the established timeout. The forward entry is found from the reply entry's
/// translation: the client (`client`:`client_port`) and the frontend it used.
#[inline(always)]
pub(crate) fn seen_reply(
    reply_key: &CtKey,
    reply: &CtValue,
    client: [u32; 4],
    client_port: u16,
    cfg: &NatConfig,
    t: u64,
) {
    let tcp = reply_key.proto == PROTO_TCP;
    if let Some(p) = CONNTRACK.get_ptr_mut(reply_key) {
        // SAFETY: as in `hit`.
        let v = unsafe { &mut *p };
        v.flags |= CT_SEEN_REPLY;
        v.expires_ns = t + cfg.lifetime_ns(tcp, true, v.flags & CT_CLOSING != 0);
    }
    let fwd = CtKey {
        saddr: client,
        daddr: reply.a,
        sport: client_port,
        dport: reply.a_port,
        proto: reply_key.proto,
        family: reply_key.family,
        dir: CT_DIR_IN,
        _pad: 0,
    };
    if let Some(p) = CONNTRACK.get_ptr_mut(fwd) {
        // SAFETY: as in `hit`.
        let v = unsafe { &mut *p };
        if v.flags & CT_FORWARD != 0 {
            v.flags |= CT_SEEN_REPLY;
            v.expires_ns = t + cfg.lifetime_ns(tcp, true, v.flags & CT_CLOSING != 0);
        }
    }
}

/// Mark the other entry of the flow whose entry `v` (at `key`) just saw a FIN or RST as closing too, with
/// the closing lifetime from now. A forward entry's other one is the reply entry its translation names (the
/// backend to the client, or with SNAT to the node's port); a reply entry's is the forward entry of its
/// client and frontend. Out of line: its key stays off the callers' stack frames.
#[inline(never)]
fn close_other(key: &CtKey, v: &CtValue, cfg: &NatConfig, t: u64) {
    let snat = v.flags & CT_SNAT != 0;
    let other = if v.flags & CT_FORWARD != 0 {
        let (daddr, dport, dir) =
            if snat { (v.b, v.b_port, CT_DIR_IN) } else { (key.saddr, key.sport, CT_DIR_OUT) };
        CtKey {
            saddr: v.a,
            daddr,
            sport: v.a_port,
            dport,
            proto: key.proto,
            family: key.family,
            dir,
            _pad: 0,
        }
    } else {
        let (saddr, sport) = if snat { (v.b, v.b_port) } else { (key.daddr, key.dport) };
        CtKey {
            saddr,
            daddr: v.a,
            sport,
            dport: v.a_port,
            proto: key.proto,
            family: key.family,
            dir: CT_DIR_IN,
            _pad: 0,
        }
    };
    if let Some(p) = CONNTRACK.get_ptr_mut(other) {
        // SAFETY: as in `hit`.
        let o = unsafe { &mut *p };
        o.flags |= CT_CLOSING;
        o.expires_ns = t + cfg.lifetime_ns(true, o.flags & CT_SEEN_REPLY != 0, true);
    }
}

/// Write a new entry (replacing a dead or live one: a retransmitted SYN whose first copy's entries exist).
#[inline(always)]
pub(crate) fn create(k: &CtKey, v: &CtValue) -> bool {
    CONNTRACK.insert(k, v, 0).is_ok()
}

/// Write an SNAT port's reply entry only if the port is free for this (backend, node address) pair: no
/// entry, or an expired one. `false`: a live flow holds it.
#[inline(always)]
pub(crate) fn claim(k: &CtKey, v: &CtValue, t: u64) -> bool {
    if CONNTRACK.insert(k, v, u64::from(BPF_NOEXIST)).is_ok() {
        return true;
    }
    match CONNTRACK.get_ptr(k) {
        // SAFETY: a plain read of an LRU value.
        Some(p) if unsafe { (*p).expires_ns } <= t => create(k, v),
        Some(_) => false,
        None => create(k, v),
    }
}

/// Remove an entry (the reply entry of a flow whose forward entry could not be written).
#[inline(always)]
pub(crate) fn remove(k: &CtKey) {
    let _ = CONNTRACK.remove(k);
}
