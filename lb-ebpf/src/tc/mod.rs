//! The north-south program family: `tc_ingress` and `tc_egress`, attached to the devices that hold the
//! node's NodePort addresses, translate traffic that arrives from outside the node to nodeIP:nodePort,
//! load-balancer ingress IPs and externalIPs (frontends with `SCOPE_OUTSIDE`), and its replies.
//!
//! - `packet`: parse a flow, rewrite addresses and ports with incremental checksums;
//! - `fragment`: IPv4 and IPv6 fragments of translated flows, the first fragment's ports kept for the later ones;
//! - `icmp`: ICMP errors about a translated flow, translated back (path MTU discovery, port unreachable);
//! - `icmp_send`: ICMP errors the node answers itself for what it cannot forward (exhausted TTL, MTU);
//! - `conntrack`: the two entries of a translated flow and their lifetimes;
//! - `route`: forwarding a packet with the node's address as its source (SNAT) past the stack's martian check;
//! - `snat`: the node address and the port an SNAT flow leaves with;
//! - `dsr`: direct server return, the frontend carried to the backend's node in an IPv4 option.
//!
//! Everything that is not theirs is passed on (`TC_ACT_UNSPEC`: with tcx the next program runs, a CNI's
//! among them); so is a translated packet headed for a local pod, which the stack routes. Drops are counted by
//! reason (`NS_*`). The node's own connections are left alone: a new flow must be a TCP SYN (no ACK) or a
//! UDP datagram to a frontend, so a reply to a node socket is never taken for NodePort traffic; and the SNAT
//! ports lie above the kernel's ephemeral range (see `lb_common::nat`).
mod conntrack;
mod dsr;
mod fragment;
mod frame;
mod icmp;
mod icmp_send;
mod packet;
mod route;
mod snat;
mod xdp;

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::bpf_get_prandom_u32,
    macros::{classifier, map},
    maps::PerCpuArray,
    programs::TcContext,
};
use frame::Frame;
use lb_common::{
    ADDR_FOREIGN, ADDR_NODE, AddrKey, Backend, COUNTER_DROPPED, COUNTER_NODE, COUNTER_REJECTED, CT_DIR_IN,
    CT_DIR_OUT, CT_DSR, CT_FORWARD, CT_SNAT, CtAddr, CtKey, CtValue, DSR_OPT_LEN, FAMILY_V4, FLAG_DSR,
    FLAG_EMPTY_IS_DROP, FLAG_MAGLEV, FLAG_POLICY_LOCAL, FLAG_SOURCE_RANGES, FrontendKey, FrontendValue,
    MaglevKey, NS_DROP_CT_FULL, NS_DROP_NO_ENDPOINTS, NS_DROP_NO_LOCAL, NS_DROP_REWRITE,
    NS_DROP_SNAT_EXHAUSTED, NS_DROP_SOURCE_RANGE, NS_DROP_UNMATCHED, NS_DSR_SNAT, NS_FAIL_OPEN,
    NS_MAGLEV_FALLBACK, NS_NEW_DSR, NS_NEW_LOCAL, NS_NEW_SNAT, NS_PASS_NOT_SYN, NS_TRANSLATED, NatConfig,
    OUTCOME_FAIL_OPEN, OUTCOME_REFUSED, OUTCOME_TRANSLATED, OutsideAffinityKey, PROTO_TCP, SCOPE_OUTSIDE,
    SOURCE_RANGE_FRONTEND_BITS, Slot, SourceRangeKey, choose_with,
};
pub(crate) use packet::Flow;
use packet::{Parsed, TCP_ACK, TCP_SYN};

use crate::{
    affinity,
    counters::{count, count_ns},
    health::is_down,
    maps::{FRONTENDS, LOCAL_BACKENDS, MAGLEV, NS_ADDRS, SOURCE_RANGES, backend_at, copy_frontend},
    trace,
};

/// Handed on to the stack (translated, or not ours): the next program (tcx) or the default action.
pub(crate) const PASS: i32 = TC_ACT_UNSPEC;
/// The inner steps' answer for a packet they left untouched (not a tracked flow's, starting none): passed on,
/// except on ingress to an address that is not the node's (`ADDR_FOREIGN`), where it is dropped. Not a tc
/// verdict.
pub(crate) const NOT_OURS: i32 = i32::MIN + 2;
/// Dropped (and counted).
pub(crate) const DROP: i32 = TC_ACT_SHOT;

#[classifier]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn tc_ingress(ctx: TcContext) -> i32 {
    let Some(scratch) = PACKET.get_ptr_mut(0) else { return PASS };
    // SAFETY: this CPU's scratch value; a tc program runs with bottom halves disabled, so no other run on this
    // CPU uses it until this one returns.
    let Packet { flow: f, key: k } = unsafe { &mut *scratch };
    let parsed = packet::parse(&ctx, f, packet::ETH_LEN);
    if parsed == Parsed::Other {
        return PASS;
    }
    // An IPv4 header of 28 bytes (one 8-byte option) may carry a DSR flow's frontend to a local backend: the
    // only cost other packets pay for DSR is this comparison.
    if f.l4 == f.l3 + 28 && parsed == Parsed::Flow {
        dsr::learn(&ctx, f);
    }
    // The pre-filter: traffic to an address that is neither the node's nor an outside frontend's costs
    // this one lookup.
    let Some(to) = NS_ADDRS.get_ptr(AddrKey { addr: f.daddr, family: f.family, _pad: [0; 3] }) else {
        return PASS;
    };
    // SAFETY: a plain read of a hash value.
    let foreign = unsafe { *to } & (ADDR_FOREIGN | ADDR_NODE) == ADDR_FOREIGN;
    match ingress(&ctx, f, k, parsed) {
        NOT_OURS if foreign => {
            // Passed on, the stack would route it back to the router that sent it (the address is on no
            // interface of the node), and the router back here, until its TTL ran out.
            count_ns(NS_DROP_UNMATCHED);
            DROP
        }
        NOT_OURS => PASS,
        verdict => verdict,
    }
}

/// `tc_ingress` past the pre-filter: the verdict, or `NOT_OURS`.
#[inline(always)]
fn ingress(ctx: &TcContext, f: &mut Flow, k: &mut CtKey, parsed: Parsed) -> i32 {
    match parsed {
        Parsed::Flow => {}
        Parsed::Fragment => return fragment::passed(),
        Parsed::Icmp => return icmp::error(ctx, f, CT_DIR_IN),
        Parsed::Other => return NOT_OURS,
    }
    let (f, k): (&Flow, &CtKey) = {
        *k = conntrack::key(f, CT_DIR_IN);
        (f, k)
    };
    let Some(cfg) = conntrack::config() else { return PASS };
    let t = conntrack::now();
    if let Some(v) = conntrack::hit(k, f, cfg, t) {
        return apply(ctx, f, v);
    }
    if f.frag == fragment::LATER {
        // Its flow ended since the first fragment: no new flow from a fragment without ports.
        return fragment::passed();
    }
    let verdict = new_flow(f);
    if verdict != CHOSEN {
        return verdict;
    }
    if !with_affinity() {
        return PASS;
    }
    let verdict = admit(ctx, f, cfg, t);
    if verdict != CREATED {
        return verdict;
    }
    // The new flow's first packet, translated by the entry `new_flow` wrote (its copy in the scratch space).
    match SCRATCH.get_ptr(0) {
        // SAFETY: this CPU's scratch value, written by `new_flow` in this run (softirq or not, a tc program
        // is not preempted by another on the same CPU between these two calls: they run with migration and
        // bottom halves as the hook gives them, and the scratch is only used within one run).
        Some(n) => apply(ctx, f, unsafe { &(*n).fwd }),
        None => PASS,
    }
}

/// A packet on ingress whose flow's entry is `v`: a DSR flow's goes to the backend with the option
/// (`dsr::forward`), any other's is translated by its entry (`tracked`). Chosen here, not in `tracked`: the
/// verifier bounds the stack over the call chain at 512 bytes, and `dsr::forward` below `tracked` would add a
/// frame to the deepest chain (the ICMP answers').
#[inline(always)]
fn apply(ctx: &TcContext, f: &Flow, v: &CtValue) -> i32 {
    if v.flags & CT_DSR != 0 { dsr::forward(ctx, f, v) } else { tracked(ctx, f, v) }
}

/// After `new_flow` chose: sessionAffinity's backend in its place where the frontend has affinity (in the
/// scratch value). Here, not in `new_flow`: the verifier bounds the stack over the call chain (512 bytes), and
/// `new_flow`'s frame (the tier choice) and `apply_outside`'s do not fit one above the other. `false`: no
/// scratch value (pass the packet on).
#[inline(always)]
fn with_affinity() -> bool {
    let Some(n) = SCRATCH.get_ptr_mut(0) else { return false };
    // SAFETY: this CPU's scratch value, written by `new_flow` in this run (see `ingress`).
    let NewFlow { fe, client, choice, affinity, .. } = unsafe { &mut *n };
    if fe.affinity_timeout_s != 0 {
        *affinity = OutsideAffinityKey { frontend: fe.key, client: client.addr };
        affinity::apply_outside(fe, affinity, choice);
    }
    true
}

/// `new_flow`'s answer when it chose a backend (`NewFlow::choice`), for `admit`: not a tc verdict.
const CHOSEN: i32 = i32::MIN + 1;
/// `admit`'s answer when it wrote a flow's entries (in `SCRATCH` too), which its first packet now takes:
/// not a tc verdict.
const CREATED: i32 = i32::MIN;

/// A new flow's entries while they are built: off the stack, which the verifier bounds at 512 bytes over the
/// call chain (`tc_ingress` -> `new_flow` would exceed it with these on the stack).
struct NewFlow {
    fe: FrontendValue,
    /// The flow's source, for `trace::flow`.
    client: Backend,
    fwd_key: CtKey,
    fwd: CtValue,
    reply_key: CtKey,
    reply: CtValue,
    /// The client's sessionAffinity key, when the frontend has affinity.
    affinity: OutsideAffinityKey,
    /// The backend `new_flow` chose (then sessionAffinity's), for `admit`.
    choice: lb_common::Choice<Backend>,
}

#[map]
static SCRATCH: PerCpuArray<NewFlow> = PerCpuArray::with_max_entries(1, 0);

#[classifier]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn tc_egress(ctx: TcContext) -> i32 {
    egress(&ctx, packet::ETH_LEN)
}

/// `tc_egress` for an L3 device (WireGuard, IPIP and other tunnels: no Ethernet header, the IP header at
/// 0), where a local backend's reply may leave. On its egress only replies of local backends are tracked
/// (an SNAT flow's packets are all seen on ingress), so nothing here is forwarded past the stack.
#[classifier]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn tc_egress_l3(ctx: TcContext) -> i32 {
    egress(&ctx, 0)
}

/// The egress programs: the packet's IP header at `l3`.
#[inline(always)]
fn egress(ctx: &TcContext, l3: usize) -> i32 {
    let Some(scratch) = PACKET.get_ptr_mut(0) else { return PASS };
    // SAFETY: as in `tc_ingress`.
    let Packet { flow: f, key: k } = unsafe { &mut *scratch };
    match packet::parse(ctx, f, l3) {
        Parsed::Flow => {}
        Parsed::Icmp => {
            let verdict = icmp::error(ctx, f, CT_DIR_OUT);
            return if verdict == NOT_OURS { PASS } else { verdict };
        }
        Parsed::Fragment | Parsed::Other => return PASS,
    }
    *k = conntrack::key(f, CT_DIR_OUT);
    let Some(cfg) = conntrack::config() else { return PASS };
    match conntrack::hit(k, f, cfg, conntrack::now()) {
        Some(v) => tracked(ctx, f, v),
        None => PASS,
    }
}

/// The packet being handled: its flow and conntrack key, off the stack (see `NewFlow`).
struct Packet {
    flow: Flow,
    key: CtKey,
}

#[map]
static PACKET: PerCpuArray<Packet> = PerCpuArray::with_max_entries(1, 0);

/// A packet of a tracked flow: apply its entry's translation. Out of line (as `new_flow` and
/// `route::forward`): each has a stack frame of its own, which the 512-byte bound allows where one inlined
/// body would not.
#[inline(never)]
fn tracked(ctx: &TcContext, f: &Flow, v: &CtValue) -> i32 {
    let snat = v.flags & CT_SNAT != 0;
    if snat {
        // SNAT: forward (new source: the node) and reply (new source: the frontend, often the node's
        // address) alike carry a source the stack would take for a martian: this program forwards them,
        // and answers what cannot be forwarded while the packet is still as its sender sent it.
        let (src, dst) = if v.flags & CT_FORWARD != 0 { (v.b, v.a) } else { (v.a, v.b) };
        let verdict = route::check(ctx, f, &src, &dst, f.frag != fragment::LATER, 0);
        if verdict != route::GO {
            return verdict;
        }
    }
    let ok = if v.flags & CT_FORWARD != 0 {
        packet::set_dst(ctx, f, &v.a, v.a_port).is_ok()
            && (!snat || packet::set_src(ctx, f, &v.b, v.b_port).is_ok())
    } else {
        packet::set_src(ctx, f, &v.a, v.a_port).is_ok()
            && (!snat || packet::set_dst(ctx, f, &v.b, v.b_port).is_ok())
    };
    if !ok {
        count_ns(NS_DROP_REWRITE);
        return DROP;
    }
    if f.frag == fragment::FIRST {
        fragment::record(&packet::frag_key(f), f.sport, f.dport);
    }
    count_ns(NS_TRANSLATED);
    if !snat {
        return PASS;
    }
    route::send(ctx, f)
}

/// Copy the frontend at `key` into `out`, checked (`maps::copy_frontend`: an element can be reused while it
/// is read); `false`: no frontend, or torn twice (fail open, counted).
#[inline(always)]
fn frontend(key: &FrontendKey, out: &mut FrontendValue) -> bool {
    for _ in 0..2 {
        let Some(p) = FRONTENDS.get_ptr(key) else { return false };
        // SAFETY: a hash value stays mapped for the program's run; `out` is the caller's.
        if unsafe { copy_frontend(p, out, key) } {
            return true;
        }
    }
    count_ns(NS_FAIL_OPEN);
    false
}

/// A packet with no conntrack entry: a new flow if it is addressed to an outside frontend. `CHOSEN` when it
/// chose a backend (`NewFlow::choice`), else the packet's verdict.
#[inline(never)]
fn new_flow(f: &Flow) -> i32 {
    let key = FrontendKey { addr: f.daddr, port: f.dport, proto: f.proto, family: f.family | SCOPE_OUTSIDE };
    let Some(n) = SCRATCH.get_ptr_mut(0) else { return PASS };
    // SAFETY: this CPU's scratch value, used only within this run (see `tc_ingress`).
    let NewFlow { fe, client, choice, .. } = unsafe { &mut *n };
    *client = Backend { addr: f.saddr, port: f.sport, proto: f.proto, family: f.family };
    let client: &Backend = client;
    if !frontend(&key, fe) {
        return NOT_OURS;
    }
    let fe: &FrontendValue = fe;
    if let Some(verdict) = refuse(fe, &key, f) {
        return verdict;
    }
    *choice = pick(fe);
    // With Maglev, the tier's table gives the backend within the tier the choice took (in place, in the
    // scratch value: a `Choice` returned through more paths was copied with bytes the verifier calls unread).
    if let lb_common::Choice::Backend { tier, backend } = choice
        && fe.flags & FLAG_MAGLEV != 0
    {
        match maglev(fe, f, *tier) {
            Some(b) => *backend = b,
            None => count_ns(NS_MAGLEV_FALLBACK),
        }
    }
    let (outcome, svc_kind, ns_kind, verdict) = match *choice {
        lb_common::Choice::Backend { .. } => return CHOSEN,
        lb_common::Choice::Empty if fe.flags & FLAG_EMPTY_IS_DROP != 0 => {
            (OUTCOME_REFUSED, Some(COUNTER_DROPPED), NS_DROP_NO_LOCAL, DROP)
        }
        lb_common::Choice::Empty => (OUTCOME_REFUSED, Some(COUNTER_REJECTED), NS_DROP_NO_ENDPOINTS, DROP),
        lb_common::Choice::Error => (OUTCOME_FAIL_OPEN, None, NS_FAIL_OPEN, NOT_OURS),
    };
    if trace::on() {
        trace::flow(&key, fe, trace::outcome(outcome, 0), &Backend::default(), client);
    }
    if let Some(kind) = svc_kind {
        count(fe.svc_id, kind);
    }
    count_ns(ns_kind);
    verdict
}

/// A new flow whose backend is chosen (`NewFlow::choice`): write its entries (SNAT for a remote backend).
/// `CREATED` when it did, else the packet's verdict.
#[inline(never)]
fn admit<C: Frame>(ctx: &C, f: &Flow, cfg: &NatConfig, t: u64) -> i32 {
    let Some(n) = SCRATCH.get_ptr_mut(0) else { return PASS };
    // SAFETY: this CPU's scratch value, written by `new_flow` in this run.
    let NewFlow { fe, client, fwd_key, fwd, reply_key, reply, choice, .. } = unsafe { &mut *n };
    let fe: &FrontendValue = fe;
    // The trace gets the outcome as plain values: a `Choice` whose address is taken for a call made LLVM spill
    // it in a way the verifier refused (a register read after the call that clobbered it).
    let lb_common::Choice::Backend { tier, backend } = *choice else { return NOT_OURS };
    if trace::on() {
        trace::flow(&fe.key, fe, trace::outcome(OUTCOME_TRANSLATED, tier), &backend, client);
    }
    // externalTrafficPolicy Local (only local endpoints in the tiers) and local endpoints under Cluster keep
    // the client's address: the reply comes back through this node anyway. A remote endpoint gets the
    // node's address as the source, or its reply would go straight to the client from another address.
    let local =
        fe.flags & FLAG_POLICY_LOCAL != 0 || LOCAL_BACKENDS.get_ptr(CtAddr { addr: backend.addr }).is_some();
    *fwd_key = conntrack::key(f, CT_DIR_IN);
    *fwd = CtValue {
        a: backend.addr,
        a_port: backend.port,
        flags: CT_FORWARD,
        svc_id: fe.svc_id,
        expires_ns: t + cfg.lifetime_ns(f.proto == PROTO_TCP, 0),
        ..CtValue::default()
    };
    *reply = CtValue {
        a: f.daddr,
        a_port: f.dport,
        svc_id: fe.svc_id,
        expires_ns: fwd.expires_ns,
        ..CtValue::default()
    };
    *reply_key = CtKey {
        saddr: backend.addr,
        daddr: f.saddr,
        sport: backend.port,
        dport: f.sport,
        proto: f.proto,
        family: f.family,
        dir: CT_DIR_OUT,
        _pad: 0,
    };
    // Direct server return: a remote backend of a frontend with DSR, IPv4 (the option's family), and a first
    // packet with room for the option (a TCP SYN has it; a UDP datagram may not). The replies do not come
    // back here: no reply entry.
    let dsr = !local && fe.flags & FLAG_DSR != 0 && f.family == FAMILY_V4 && ctx.fits(i32::from(DSR_OPT_LEN));
    if local {
        if !conntrack::create(reply_key, reply) {
            count_ns(NS_DROP_CT_FULL);
            return DROP;
        }
    } else if dsr {
        fwd.flags |= CT_DSR;
    } else {
        if fe.flags & FLAG_DSR != 0 {
            count_ns(NS_DSR_SNAT);
        }
        let Some(node) = snat::snat_address(ctx, fe, f, cfg, &backend.addr) else {
            count_ns(NS_DROP_NO_ENDPOINTS);
            return DROP;
        };
        if !snat::snat(f, node, fwd, reply_key, reply, cfg, t) {
            count_ns(NS_DROP_SNAT_EXHAUSTED);
            return DROP;
        }
    }
    if !conntrack::create(fwd_key, fwd) {
        if !dsr {
            conntrack::remove(reply_key);
        }
        count_ns(NS_DROP_CT_FULL);
        return DROP;
    }
    // COUNTER_NODE, COUNTER_ZONE, COUNTER_CLUSTER are 0, 1, 2: the tier index is the counter kind.
    count(fe.svc_id, COUNTER_NODE + tier as u32);
    count_ns(if local {
        NS_NEW_LOCAL
    } else if dsr {
        NS_NEW_DSR
    } else {
        NS_NEW_SNAT
    });
    CREATED
}

/// The backend for a new flow to the frontend `fe`: the tier choice over its slots (marked-down backends
/// skipped); Maglev (`new_flow`) and sessionAffinity (`tc_ingress`) come after.
#[inline(always)]
fn pick(fe: &FrontendValue) -> lb_common::Choice<Backend> {
    let lookup = |index| {
        let Some(backend) = backend_at(fe.svc_id, fe.generation, index) else { return Slot::Missing };
        if is_down(backend, conntrack::now) {
            return Slot::Down(backend);
        }
        Slot::Live(backend)
    };
    // SAFETY: helper without preconditions.
    let random = || unsafe { bpf_get_prandom_u32() };
    choose_with(fe, lookup, random, crate::scan::scan)
}

/// The backend the Maglev table of `fe`'s tier `tier` gives the flow `f`, if the table is there and that
/// backend is not marked or held down (else the tier's random choice stands, counted).
#[inline(never)]
fn maglev(fe: &FrontendValue, f: &Flow, tier: usize) -> Option<Backend> {
    let range = *fe.tiers.get(tier)?;
    let key = MaglevKey { svc_id: fe.svc_id, generation: fe.generation, tier: tier as u32 };
    let table = MAGLEV.get_ptr(key)?;
    let bucket = lb_common::bucket(lb_common::flow_hash(&f.saddr, &f.daddr, f.sport, f.dport, f.proto));
    // LLVM knows `bucket < MAGLEV_M` from the modulo and drops the bounds check; the verifier cannot see
    // through the division's multiply-and-shift. Read back through memory (LLVM no longer knows the range),
    // the check below stays, and the verifier bounds the access by it.
    // SAFETY: a read of a local just written.
    let bucket = unsafe { core::ptr::read_volatile(&raw const bucket) };
    if bucket >= lb_common::MAGLEV_M {
        return None;
    }
    // SAFETY: a map value stays mapped for the program's run; `bucket < MAGLEV_M`, the array's length.
    let index = u32::from(*unsafe { &(*table).slots }.get(bucket)?);
    if index >= u32::from(range.len) {
        return None;
    }
    let backend = backend_at(fe.svc_id, fe.generation, u32::from(range.start) + index)?;
    (!is_down(backend, conntrack::now)).then_some(backend)
}

/// Why a packet to frontend `fe` (at `key`) starts no flow, as its verdict: a client outside the source
/// ranges (dropped), or a TCP segment that is no SYN (passed).
#[inline(always)]
fn refuse(fe: &FrontendValue, key: &FrontendKey, f: &Flow) -> Option<i32> {
    if fe.flags & FLAG_SOURCE_RANGES != 0 && !allowed_source(key, f) {
        // kube-proxy's KUBE-FW chain: a load-balancer IP's traffic from outside its source ranges is dropped.
        count_ns(NS_DROP_SOURCE_RANGE);
        return Some(DROP);
    }
    if f.proto == PROTO_TCP && f.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN {
        // Not a connection's first segment: an expired or evicted flow, or a reply to a node socket that
        // happens to use this port. Either way not a new flow to translate.
        count_ns(NS_PASS_NOT_SYN);
        return Some(NOT_OURS);
    }
    None
}

/// Whether the client of `f` is inside one of the source ranges of the frontend at `key`.
#[inline(always)]
fn allowed_source(key: &FrontendKey, f: &Flow) -> bool {
    let k = aya_ebpf::maps::lpm_trie::Key::new(
        SOURCE_RANGE_FRONTEND_BITS + if f.family == FAMILY_V4 { 32 } else { 128 },
        SourceRangeKey { frontend: *key, client: f.saddr },
    );
    SOURCE_RANGES.get(k).is_some()
}
