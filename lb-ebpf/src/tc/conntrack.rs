//! Connection tracking of translated flows: two entries per flow (see `lb_common::nat`), refreshed by every
//! packet, their lifetime driven by the flow's state (`lb_common::CT_STATE`), which both entries carry.
//!
//! Three tables: UDP flows in `CT_UDP`; a TCP flow in `CT_SYN` from its SYN until a non-SYN packet from
//! each side (the SYN-ACK, then the client's ACK: netfilter's rule, not the SYN-ACK alone), then in
//! `CT_TCP`. A flood of SYNs whose handshakes never complete, or of one-datagram UDP flows, evicts entries of
//! its own kind only. An expired entry is treated as absent; the LRU reclaims it.
//!
//! TCP states: half-open (`tcp_syn_s`), established, half-closed by a FIN from one side (`tcp_close_wait_s`,
//! kube-proxy's raised CLOSE_WAIT), closed by a FIN from each side or a RST inside the window
//! (`tcp_close_s`; a RST outside it is passed on and changes nothing, `NS_RST_OUTSIDE_WINDOW`). A SYN on a
//! closed flow's tuple is a new connection: the old entries go.
use aya_ebpf::{
    bindings::{BPF_EXIST, BPF_NOEXIST},
    helpers::bpf_ktime_get_boot_ns,
    maps::LruHashMap,
};
use lb_common::{
    CT_CLOSED, CT_DIR_IN, CT_DIR_OUT, CT_DSR, CT_ESTABLISHED, CT_FIN_CLIENT, CT_FIN_SERVER, CT_FORWARD,
    CT_SEEN_REPLY, CT_SEQ_SEEN, CT_SNAT, CtKey, CtValue, NS_CT_INSERTED, NS_CT_REMOVED, NS_ESTABLISHED,
    NS_RST_OUTSIDE_WINDOW, NatConfig, PROTO_TCP, rst_in_window,
};

use super::{
    fragment,
    packet::{Flow, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};
use crate::{
    counters::count_ns,
    maps::{CT_SYN, CT_TCP, CT_UDP, NAT_CONFIG},
};

/// Which table an entry is in (`lb_common::CT_TABLES`' order: the index of its counters).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    Tcp = 0,
    Syn = 1,
    Udp = 2,
}

/// Write `v` at `k` in table `t`, counting a new key (`NS_CT_INSERTED`): with the deletes counted by `del`
/// and the table's entries, the agent derives how many the LRU evicted. `BPF_NOEXIST` first, so a key
/// that exists (a dead entry, a retransmitted SYN's) is replaced uncounted.
/// Out of line: its loop kept inline grew its callers' frames past the 512-byte stack bound.
#[inline(never)]
fn put(t: Table, k: &CtKey, v: &CtValue) -> bool {
    // Twice: a key that went between the two writes (evicted, deleted on another CPU) is written new and
    // counted, not written uncounted.
    for _ in 0..2 {
        if map(t).insert(k, v, u64::from(BPF_NOEXIST)).is_ok() {
            count_ns(NS_CT_INSERTED + t as u32);
            return true;
        }
        if map(t).insert(k, v, u64::from(BPF_EXIST)).is_ok() {
            return true;
        }
    }
    false
}

/// Delete the entry at `k` from table `t`, counting it (`NS_CT_REMOVED`) if there was one.
#[inline(always)]
fn del(t: Table, k: &CtKey) {
    if map(t).remove(k).is_ok() {
        count_ns(NS_CT_REMOVED + t as u32);
    }
}

#[inline(always)]
fn map(t: Table) -> &'static LruHashMap<CtKey, CtValue> {
    match t {
        Table::Tcp => &CT_TCP,
        Table::Syn => &CT_SYN,
        Table::Udp => &CT_UDP,
    }
}

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

/// The live entry at `key` (`t`: now) and its table: UDP's, else the established TCP table's, else the
/// half-open one's. The entry in the map, not a copy (the stack is bounded).
#[inline(always)]
pub(crate) fn find(key: &CtKey, t: u64) -> Option<(*mut CtValue, Table)> {
    if key.proto != PROTO_TCP {
        return live(Table::Udp, key, t);
    }
    if let Some(found) = live(Table::Tcp, key, t) {
        return Some(found);
    }
    live(Table::Syn, key, t)
}

#[inline(always)]
fn live(table: Table, key: &CtKey, t: u64) -> Option<(*mut CtValue, Table)> {
    let p = map(table).get_ptr_mut(key)?;
    // SAFETY: a plain read of a hash value, which stays mapped for the program's run.
    if unsafe { (*p).expires_ns } <= t { None } else { Some((p, table)) }
}

/// The live entry at `key`, refreshed by this packet (`f`): its state moved on (both entries) and its
/// lifetime from now. Its translation fields are written once, when the flow is created, so a concurrent
/// refresh on another CPU can only lose a refresh, never make a bad translation.
#[inline(always)]
pub(crate) fn hit(key: &CtKey, f: &Flow, cfg: &NatConfig, t: u64) -> Option<&'static CtValue> {
    let (p, table) = find(key, t)?;
    if f.proto == PROTO_TCP {
        return tcp(key, f, p, table, t);
    }
    // SAFETY: as in `live`; this run's only reference to the entry.
    let v = unsafe { &mut *p };
    if v.flags & CT_SEEN_REPLY == 0 && v.flags & CT_FORWARD == 0 {
        add_state(key, v, CT_SEEN_REPLY, cfg, t);
    } else if v.flags & (CT_SEEN_REPLY | CT_ESTABLISHED | CT_FORWARD) == CT_SEEN_REPLY | CT_FORWARD {
        // A datagram from the client after a reply: a stream.
        add_state(key, v, CT_ESTABLISHED, cfg, t);
    }
    v.expires_ns = t + cfg.lifetime_ns(false, v.flags);
    Some(v)
}

/// `hit` for TCP. Out of line: the other entry's key stays off the callers' stack frames.
#[inline(never)]
fn tcp(key: &CtKey, f: &Flow, p: *mut CtValue, table: Table, t: u64) -> Option<&'static CtValue> {
    let cfg = config()?;
    // SAFETY: as in `hit`.
    let v = unsafe { &mut *p };
    let flags = f.tcp_flags;
    if flags & TCP_SYN != 0 && v.flags & CT_CLOSED != 0 {
        // A new connection on a closed flow's tuple (the client reusing its port): forget the old one, so a
        // client's SYN starts a new flow and a connection that is not translated is left alone.
        let other = other_key(key, v);
        remove(&other);
        remove(key);
        return None;
    }
    let forward = v.flags & CT_FORWARD != 0;
    if flags & TCP_RST != 0 {
        if rst_ok(key, v, f, t) {
            add_state(key, v, CT_CLOSED, cfg, t);
        } else {
            count_ns(NS_RST_OUTSIDE_WINDOW);
        }
    } else if flags & TCP_FIN != 0 {
        let fin = if forward { CT_FIN_CLIENT } else { CT_FIN_SERVER };
        let both = (v.flags | fin) & (CT_FIN_CLIENT | CT_FIN_SERVER) == CT_FIN_CLIENT | CT_FIN_SERVER;
        let add = if both { fin | CT_CLOSED } else { fin };
        if v.flags & add != add {
            add_state(key, v, add, cfg, t);
        }
    }
    if !forward && v.flags & CT_SEEN_REPLY == 0 && flags & TCP_RST == 0 {
        add_state(key, v, CT_SEEN_REPLY, cfg, t);
    }
    if f.frag != fragment::LATER && flags & TCP_RST == 0 {
        // A later fragment has no TCP header; a RST (one outside the window above all) must not move the
        // window the next RST is checked against.
        v.seq = u32::from_be(f.seq);
        if flags & TCP_ACK != 0 {
            v.ack = u32::from_be(f.ack);
        }
        v.flags |= CT_SEQ_SEEN;
    }
    // A DSR flow's replies never pass this node: the client's first segment after its SYN (an ACK: it saw
    // the SYN-ACK) completes the handshake as far as this node can tell.
    let handshake_done = forward
        && table == Table::Syn
        && flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_ACK
        && if v.flags & CT_DSR != 0 {
            v.flags & CT_ESTABLISHED == 0
        } else {
            v.flags & (CT_SEEN_REPLY | CT_ESTABLISHED) == CT_SEEN_REPLY && acks_the_syn_ack(key, v, f, t)
        };
    if handshake_done {
        add_state(key, v, CT_ESTABLISHED, cfg, t);
    }
    v.expires_ns = t + cfg.lifetime_ns(true, v.flags);
    if handshake_done {
        return promote(key, v);
    }
    Some(v)
}

/// Whether the client's segment `f` acknowledges the backend's SYN-ACK (its acknowledgement number the
/// SYN-ACK's sequence number plus one, as netfilter requires to leave SYN_RECV): a blind ACK from a spoofed
/// source does not complete the handshake, so it cannot move flows into the established table.
#[inline(always)]
fn acks_the_syn_ack(key: &CtKey, v: &CtValue, f: &Flow, t: u64) -> bool {
    let other = other_key(key, v);
    let Some((o, _)) = find(&other, t) else { return false };
    // SAFETY: as in `live`.
    let o = unsafe { &*o };
    o.flags & CT_SEQ_SEEN != 0 && u32::from_be(f.ack) == o.seq.wrapping_add(1)
}

/// Whether a RST on the entry `v` (at `key`) is inside the window: its sequence number between what the
/// other side last acknowledged and this side's last sequence number (`lb_common::rst_in_window`). Before
/// either side has a recorded segment (a RST answering the SYN) it is accepted.
#[inline(always)]
fn rst_ok(key: &CtKey, v: &CtValue, f: &Flow, t: u64) -> bool {
    let other = other_key(key, v);
    let Some((o, _)) = find(&other, t) else { return true };
    // SAFETY: as in `live`.
    let o = unsafe { &*o };
    if o.flags & CT_SEQ_SEEN == 0 || v.flags & CT_SEQ_SEEN == 0 {
        return true;
    }
    rst_in_window(u32::from_be(f.seq), o.ack, v.seq)
}

/// Move a flow whose handshake just completed (`key` -> `v`, its other entry too) from the half-open table
/// to the established one; the entry now in `CT_TCP`.
#[inline(always)]
fn promote(key: &CtKey, v: &CtValue) -> Option<&'static CtValue> {
    let other = other_key(key, v);
    if let Some(o) = CT_SYN.get_ptr(other) {
        // SAFETY: a hash value is a valid source for an update (the helper copies it).
        let o = unsafe { &*o };
        // By reference: the helper reads the value where it lies, no copy on the bounded stack.
        if put(Table::Tcp, &other, o) {
            del(Table::Syn, &other);
        }
    }
    let moved = put(Table::Tcp, key, v);
    if moved {
        del(Table::Syn, key);
        count_ns(NS_ESTABLISHED);
    }
    let p = if moved { CT_TCP.get_ptr(key) } else { CT_SYN.get_ptr(key) };
    // SAFETY: as in `live`.
    p.map(|p| unsafe { &*p })
}

/// The key of the other entry of the flow whose entry at `key` is `v`. A forward entry's other one is the
/// reply entry its translation names (the backend to the client, or with SNAT to the node's port); a reply
/// entry's is the forward entry of its client and frontend.
#[inline(always)]
fn other_key(key: &CtKey, v: &CtValue) -> CtKey {
    let snat = v.flags & CT_SNAT != 0;
    if v.flags & CT_FORWARD != 0 {
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
    }
}

/// Add the state bits `bits` to the entry `v` at `key` and to its flow's other entry, whose lifetime
/// follows from now (`v`'s is set by the caller). Out of line: its key stays off the callers' frames.
#[inline(never)]
fn add_state(key: &CtKey, v: &mut CtValue, bits: u16, cfg: &NatConfig, t: u64) {
    v.flags |= bits;
    let other = other_key(key, v);
    if let Some((p, _)) = find(&other, t) {
        // SAFETY: as in `live`.
        let o = unsafe { &mut *p };
        o.flags |= bits;
        o.expires_ns = t + cfg.lifetime_ns(key.proto == PROTO_TCP, o.flags);
    }
}

/// Write a new flow's entry (replacing a dead or live one: a retransmitted SYN whose first copy's entries
/// exist): TCP in the half-open table (a dead entry of the established table at the same key goes, so a
/// lookup cannot find it first), UDP in its own.
#[inline(always)]
pub(crate) fn create(k: &CtKey, v: &CtValue) -> bool {
    if k.proto != PROTO_TCP {
        return put(Table::Udp, k, v);
    }
    del(Table::Tcp, k);
    put(Table::Syn, k, v)
}

/// Write an SNAT port's reply entry only if the port is free for this (backend, node address) pair: no
/// live entry in any table of its protocol. `false`: a live flow holds it.
#[inline(always)]
pub(crate) fn claim(k: &CtKey, v: &CtValue, t: u64) -> bool {
    if find(k, t).is_some() {
        return false;
    }
    // No live entry: write it unless another CPU claimed the port since (`BPF_NOEXIST`); a dead entry in
    // the way is replaced.
    let which = if k.proto == PROTO_TCP { Table::Syn } else { Table::Udp };
    let table = map(which);
    if table.insert(k, v, u64::from(BPF_NOEXIST)).is_ok() {
        count_ns(NS_CT_INSERTED + which as u32);
        return true;
    }
    match table.get_ptr(k) {
        // SAFETY: a plain read of a hash value.
        Some(p) if unsafe { (*p).expires_ns } > t => false,
        _ => create(k, v),
    }
}

/// On a backend's node, from a DSR option (`dsr::learn`): the reply entry at `key` (backend -> client) of the
/// flow to frontend `addr`:`port`, as the client's packet `f` announces it. A SYN starts it (half-open
/// table, replacing what was there); a later packet of a flow this node has no live entry for (expired,
/// evicted, the agent restarted without the tables) writes it as established; a packet of a flow it has
/// refreshes it, moves it to the established table on the client's first non-SYN segment, and records the
/// client's FIN or RST (this node sees only the client's packets and the backend's replies). Whether a new
/// entry was written.
#[inline(never)]
pub(crate) fn learn(key: &CtKey, addr: u32, port: u16, f: &Flow, t: u64) -> bool {
    let Some(cfg) = config() else { return false };
    let addr = [addr, 0, 0, 0];
    let tcp = f.proto == PROTO_TCP;
    let syn = tcp && f.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    if !syn && let Some((p, table)) = find(key, t) {
        // SAFETY: as in `live`; this run's only reference to the entry.
        let v = unsafe { &mut *p };
        if v.a == addr && v.a_port == port {
            if tcp {
                if f.tcp_flags & TCP_RST != 0 {
                    v.flags |= CT_CLOSED;
                } else if f.tcp_flags & TCP_FIN != 0 {
                    v.flags |= CT_FIN_CLIENT;
                    if v.flags & CT_FIN_SERVER != 0 {
                        v.flags |= CT_CLOSED;
                    }
                }
            }
            let promote = tcp && table == Table::Syn && v.flags & CT_ESTABLISHED == 0;
            if promote {
                v.flags |= CT_SEEN_REPLY | CT_ESTABLISHED;
            }
            v.expires_ns = t + cfg.lifetime_ns(tcp, v.flags);
            if promote && put(Table::Tcp, key, v) {
                del(Table::Syn, key);
                count_ns(NS_ESTABLISHED);
            }
            return false;
        }
    }
    let flags = if tcp && !syn { CT_SEEN_REPLY | CT_ESTABLISHED } else { 0 };
    let v = CtValue {
        a: addr,
        a_port: port,
        flags,
        expires_ns: t + cfg.lifetime_ns(tcp, flags),
        ..CtValue::default()
    };
    if flags == 0 {
        return create(key, &v);
    }
    del(Table::Syn, key);
    put(Table::Tcp, key, &v)
}

/// Remove the entry at `k` from every table of its protocol.
#[inline(always)]
pub(crate) fn remove(k: &CtKey) {
    if k.proto != PROTO_TCP {
        del(Table::Udp, k);
        return;
    }
    del(Table::Syn, k);
    del(Table::Tcp, k);
}
