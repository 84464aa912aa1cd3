//! cgroup sock_addr hooks: translate a Service VIP to a backend at connect()/sendmsg() time.
use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use lb_common::{
    BACKEND_DOWN, Backend, COUNTER_DROPPED, COUNTER_FAIL_OPEN, COUNTER_NODE, COUNTER_REJECTED,
    ERRNO_NO_ENDPOINTS, ERRNO_NO_LOCAL_ENDPOINT, FAMILY_V4, FLAG_EMPTY_IS_DROP, FrontendKey, GLOBAL_SVC_ID,
    Slot, SlotKey, choose, counter_index,
};

use crate::maps::{BACKEND_STATE, COUNTERS, FRONTENDS, SLOTS};

/// Let the call proceed (possibly rewritten).
const ALLOW: i32 = 1;
/// Deny the call; with `bpf_set_retval` the application sees that errno instead of EPERM.
const DENY: i32 = 0;

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    translate4(&ctx)
}

#[inline(always)]
fn count(svc_id: u32, kind: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(counter_index(svc_id, kind)) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs (no preemption in BPF).
        unsafe { *c += 1 };
    }
}

#[inline(always)]
fn translate4(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr for the program's whole run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let key = FrontendKey {
        addr: [sa.user_ip4, 0, 0, 0],
        port: sa.user_port as u16,
        proto: sa.protocol as u8,
        family: FAMILY_V4,
    };
    // SAFETY: hash map values stay valid for the program's run (RCU); we only copy out of it.
    let Some(fe) = (unsafe { FRONTENDS.get(key) }) else {
        return ALLOW; // not a Service VIP: leave it alone
    };
    let fe = *fe;
    let choice = choose(
        &fe,
        |index| {
            let slot = SlotKey { svc_id: fe.svc_id, generation: fe.generation, index };
            // SAFETY: as above.
            match unsafe { SLOTS.get(slot) } {
                None => Slot::Missing,
                Some(backend) => {
                    let backend: Backend = *backend;
                    // SAFETY: as above.
                    match unsafe { BACKEND_STATE.get(backend) } {
                        Some(state) if *state & BACKEND_DOWN != 0 => Slot::Down(backend),
                        _ => Slot::Live(backend),
                    }
                }
            }
        },
        // SAFETY: helper without preconditions.
        || unsafe { bpf_get_prandom_u32() },
    );
    match choice {
        lb_common::Choice::Backend { tier, backend } => {
            sa.user_ip4 = backend.addr[0];
            sa.user_port = u32::from(backend.port);
            // COUNTER_NODE, COUNTER_ZONE, COUNTER_CLUSTER are 0, 1, 2: the tier index is the counter kind.
            count(fe.svc_id, COUNTER_NODE + tier as u32);
            ALLOW
        }
        lb_common::Choice::Empty => {
            let (kind, errno) = if fe.flags & FLAG_EMPTY_IS_DROP != 0 {
                (COUNTER_DROPPED, ERRNO_NO_LOCAL_ENDPOINT)
            } else {
                (COUNTER_REJECTED, ERRNO_NO_ENDPOINTS)
            };
            count(fe.svc_id, kind);
            // SAFETY: allowed in cgroup sock_addr programs (kernel >= 5.18); sets the syscall's return value.
            unsafe { bpf_set_retval(-errno) };
            DENY
        }
        lb_common::Choice::Error => {
            count(fe.svc_id, COUNTER_FAIL_OPEN);
            count(GLOBAL_SVC_ID, COUNTER_FAIL_OPEN);
            ALLOW
        }
    }
}
