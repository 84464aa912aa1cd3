//! Passive health, decided in the kernel: the `sock_ops` program follows the TCP active opens that connect4/6
//! translated (their reverse entry, `reverse::tcp_entry`, names the backend) and records each one's outcome
//! for its backend in `HEALTH`: established is a success; the kernel ending the connect on an answer to its SYN (an RST, an ICMP
//! error) or the SYN's first retransmission timeout is a failure, counted once per connect, with the client's
//! network namespace; a local abort is none. `HealthConfig::failures` consecutive failures from
//! `HealthConfig::clients` distinct clients (`Health::fail`) hold the backend down for a time that doubles with each hold without a success in between; when a hold ends, one
//! connect is let through as a trial (half-open) and its outcome clears or renews the hold. The connect
//! programs ask `verdict` for every backend they consider.
//!
//! Writes go through the element's pointer after checking the key stored in the value: an element can be
//! reused for another key while a program still holds it (see `FRONTENDS`), and the check narrows that to the
//! instants between the check and the write. Races between CPUs on one backend's counts lose at most a count.
use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_RTO_CB, BPF_SOCK_OPS_RTO_CB_FLAG,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_TCP_CLOSE,
        BPF_TCP_SYN_SENT,
    },
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_boot_ns},
    macros::sock_ops,
    programs::SockOpsContext,
};
use lb_common::{
    Backend, Choice, FrontendValue, GLOBAL_HEALTH_CLIENT_HOLDS, GLOBAL_HEALTH_HOLDS, GLOBAL_HEALTH_PANICS,
    GLOBAL_HEALTH_RECOVERIES, GLOBAL_SVC_ID, HEALTH_TIMEOUT, HEALTH_TRIAL_NS, Health, HealthConfig,
    HealthVerdict, Held, PROTO_TCP, REVERSE_HEALTH_REPORTED, ReverseValue, below, last_nonempty_tier,
    syn_sent_close_reason,
};

use crate::{
    counters::count,
    maps::{BACKEND_STATE, HEALTH, HEALTH_CONFIG, backend_at},
    reverse::peer_backend,
};

/// Whether `backend` is marked down now (`now` reads the clock, only if it has a mark).
#[inline(always)]
pub(crate) fn is_down(backend: Backend, now: impl FnOnce() -> u64) -> bool {
    // SAFETY: a plain read of a hash value.
    match unsafe { BACKEND_STATE.get(backend) } {
        Some(state) => state.is_down_at(now()),
        None => false,
    }
}

/// The settings, if passive health is on.
#[inline(always)]
pub(crate) fn config() -> Option<HealthConfig> {
    let cfg = HEALTH_CONFIG.get(0).copied()?;
    (cfg.failures != 0).then_some(cfg)
}

/// What the connect programs do with `backend` for a connect from network namespace `client` (`now` reads
/// the clock and `client` the namespace, only if the backend is held).
#[inline(always)]
pub(crate) fn verdict(
    backend: Backend,
    client: impl FnOnce() -> u64,
    now: impl FnOnce() -> u64,
) -> HealthVerdict {
    // SAFETY: a plain read of a hash value; a torn read only misjudges one connect.
    match unsafe { HEALTH.get(backend) } {
        // Most entries are reset ones (a success after a failure) the agent has not yet deleted: no clock.
        Some(h) if h.held_until_ns != 0 => {
            // A hold for every client needs no namespace (`Health::verdict` reads it only for one client's).
            let client = if h.scope == lb_common::HOLD_CLIENT { client() } else { 0 };
            h.verdict(client, now())
        }
        _ => HealthVerdict::Use,
    }
}

/// Count the hold a failure began.
#[inline(always)]
fn count_hold(held: Held) {
    match held {
        Held::All => count(GLOBAL_SVC_ID, GLOBAL_HEALTH_HOLDS),
        Held::Client => count(GLOBAL_SVC_ID, GLOBAL_HEALTH_CLIENT_HOLDS),
        Held::No => {}
    }
}

/// The connect that took a half-open backend is its trial: the others skip it until the trial reports.
#[inline(always)]
pub(crate) fn start_trial(backend: Backend, now_ns: u64) {
    if let Some(p) = HEALTH.get_ptr_mut(backend) {
        // SAFETY: a hash value, valid for the program's run; checked to be this backend's before the write.
        unsafe {
            if (*p).backend == backend {
                (*p).trial_until_ns = now_ns + HEALTH_TRIAL_NS;
            }
        }
    }
}

/// The panic threshold's choice: a random slot of the last non-empty tier (`last_nonempty_tier`: judged per
/// tier, held later tiers never send traffic back to a first tier held as dead), whatever its health, unless the
/// operator marked it down (then the connect is refused, as with every backend down). Out of line: its
/// locals stay off the connect programs' stack, which the verifier bounds over a call chain.
#[inline(never)]
pub(crate) fn panic_choice(fe: &FrontendValue) -> Choice<Backend> {
    let Some(tier) = last_nonempty_tier(fe) else { return Choice::Empty };
    let range = fe.tiers[tier];
    // SAFETY: helper without preconditions.
    let index = u32::from(range.start) + below(unsafe { bpf_get_prandom_u32() }, u32::from(range.len));
    let Some(backend) = backend_at(fe.svc_id, fe.generation, index) else { return Choice::Error };
    // SAFETY: helper without preconditions.
    if is_down(backend, || unsafe { bpf_ktime_get_boot_ns() }) {
        return Choice::Empty;
    }
    count(GLOBAL_SVC_ID, GLOBAL_HEALTH_PANICS);
    Choice::Backend { tier, backend }
}

/// A translated connect to `backend` from `client` (its network namespace) failed (`reason`:
/// `HEALTH_REFUSED`, `HEALTH_TIMEOUT` or `HEALTH_UNREACHABLE`); the rule is `Health::fail`.
#[inline(always)]
fn failed(backend: Backend, client: u64, reason: u32, cfg: &HealthConfig, now_ns: u64) {
    let Some(p) = HEALTH.get_ptr_mut(backend) else {
        let mut h = Health { backend, ..Health::default() };
        count_hold(h.fail(client, reason, cfg, now_ns));
        // BPF_NOEXIST: another CPU's first failure wins; this one is lost (a count, never a hold's end).
        let _ = HEALTH.insert(backend, h, u64::from(aya_ebpf::bindings::BPF_NOEXIST));
        return;
    };
    // SAFETY: as in `start_trial`.
    let h = unsafe { &mut *p };
    if h.backend == backend {
        count_hold(h.fail(client, reason, cfg, now_ns));
    }
}

/// A translated connect to `backend` was established: it is healthy (the agent deletes the reset entry).
#[inline(always)]
fn succeeded(backend: Backend) {
    let Some(p) = HEALTH.get_ptr_mut(backend) else { return };
    // SAFETY: as in `start_trial`.
    let h = unsafe { &mut *p };
    if h.backend != backend || (h.failures == 0 && h.held_until_ns == 0) {
        return;
    }
    if h.held_until_ns != 0 {
        count(GLOBAL_SVC_ID, GLOBAL_HEALTH_RECOVERIES);
    }
    *h = Health { backend, ..Health::default() };
}

/// The socket's peer as a backend key (a v4-mapped peer of a dual-stack socket is IPv4).
#[inline(always)]
fn peer(ops: &aya_ebpf::bindings::bpf_sock_ops) -> Option<Backend> {
    // The remote port is in network byte order, but in the upper 16 bits on a little-endian CPU: the kernel
    // loads `skc_dport` and shifts it left by 16 (`sock_ops_convert_ctx_access`), unlike `user_port` of
    // sock_addr programs (the low 16 bits). This crate is built for bpfel only.
    let port = (ops.remote_port >> 16) as u16;
    let ip6 = [ops.remote_ip6[0], ops.remote_ip6[1], ops.remote_ip6[2], ops.remote_ip6[3]];
    peer_backend(ops.family, ops.remote_ip4, ip6, port, PROTO_TCP)
}

/// The socket's reverse entry and backend, if connect4/6 translated it to its current peer (the socket's
/// entry, in its `REVERSE_TCP` slot or in `REVERSE`, names that backend).
#[inline(always)]
fn translated(ctx: &SockOpsContext) -> Option<(&'static mut ReverseValue, Backend)> {
    // SAFETY: the kernel passes a valid bpf_sock_ops for the program's whole run.
    let ops = unsafe { &*ctx.ops };
    let backend = peer(ops)?;
    // SAFETY: `bpf_get_socket_cookie_sock_ops` takes the sock_ops context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.ops.cast()) };
    let p = crate::reverse::tcp_entry(cookie)?;
    // SAFETY: a map value, valid for the program's run; if the element is reused for another socket
    // meanwhile (an LRU element, or the slot after this socket's close), the flag written lands on that
    // socket's entry (it would then not count one failure).
    let rev = unsafe { &mut *p };
    (rev.peer == backend).then_some((rev, backend))
}

#[sock_ops]
#[expect(clippy::needless_pass_by_value, reason = "the aya macro hands the program its context by value")]
fn sock_ops(ctx: SockOpsContext) -> u32 {
    // SAFETY: the kernel passes a valid bpf_sock_ops for the program's whole run.
    let ops = unsafe { &*ctx.ops };
    // Most callbacks (RTT, window, ECN, ...) are none of ours: leave before reading the settings.
    if !matches!(
        ops.op,
        BPF_SOCK_OPS_TCP_CONNECT_CB
            | BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB
            | BPF_SOCK_OPS_RTO_CB
            | BPF_SOCK_OPS_STATE_CB
    ) {
        return 1;
    }
    let Some(cfg) = config() else { return 1 };
    match ops.op {
        // The SYN is about to leave: follow this connect's state changes and retransmission timeouts, if
        // tierlb translated it (other sockets never pay for the callbacks).
        BPF_SOCK_OPS_TCP_CONNECT_CB if translated(&ctx).is_some() => {
            let _ = ctx.set_cb_flags((BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_RTO_CB_FLAG).cast_signed());
        }
        // Established (this callback comes for every active open): a translated connect is one whose callbacks
        // were asked for at TCP_CONNECT_CB, so the flags say so without a map lookup.
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB if ops.bpf_sock_ops_cb_flags & BPF_SOCK_OPS_STATE_CB_FLAG != 0 => {
            if let Some(backend) = peer(ops) {
                succeeded(backend);
            }
            // No more callbacks for this socket.
            let _ = ctx.set_cb_flags(0);
        }
        // A retransmission timeout while the SYN is unanswered: a failure (once per connect).
        BPF_SOCK_OPS_RTO_CB if ops.state == BPF_TCP_SYN_SENT => report(&ctx, HEALTH_TIMEOUT, &cfg),
        // SYN_SENT -> CLOSE without having been established: a failure only if the kernel ended the connect
        // on an answer (an RST, an ICMP error) or its last SYN, never the client's own abort (shutdown, close,
        // connect(AF_UNSPEC)): see `syn_sent_close_reason`.
        BPF_SOCK_OPS_STATE_CB if ctx.arg(0) == BPF_TCP_SYN_SENT && ctx.arg(1) == BPF_TCP_CLOSE => {
            if let Some(reason) = syn_sent_close_reason(ops.packets_out, ops.segs_in) {
                report(&ctx, reason, &cfg);
            }
        }
        _ => {}
    }
    1
}

/// Count a failure of this socket's connect, once.
#[inline(always)]
fn report(ctx: &SockOpsContext, reason: u32, cfg: &HealthConfig) {
    let Some((rev, backend)) = translated(ctx) else { return };
    if rev.flags & REVERSE_HEALTH_REPORTED != 0 {
        return;
    }
    rev.flags |= REVERSE_HEALTH_REPORTED;
    // SAFETY: `bpf_get_netns_cookie` takes the sock_ops context (kernel >= 5.15); the clock helper has no
    // preconditions.
    let (client, now_ns) = unsafe { (bpf_get_netns_cookie(ctx.ops.cast()), bpf_ktime_get_boot_ns()) };
    failed(backend, client, reason, cfg, now_ns);
    // After the entry is written (the agent's gate reads the map after clearing the flag).
    if let Some(p) = HEALTH_CONFIG.get_ptr_mut(0) {
        // SAFETY: an array value, valid for the program's run; a plain store of a flag.
        unsafe { (*p).active = 1 };
    }
}
