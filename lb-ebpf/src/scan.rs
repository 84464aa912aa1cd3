//! The tier choice's slow path (`lb_common::Scan`) under `bpf_loop`: the verifier checks the step once, with
//! the slot index unknown, instead of each of the `TIER_SCAN` turns of a loop with its counter and the
//! sample's count known exactly. On Linux 6.1 the loop took sendmsg6 past the verifier's million
//! instructions; `bpf_loop` exists from 5.17, below the oldest kernel tierlb supports.
use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_get_prandom_u32, generated::bpf_loop};
use lb_common::{Scan, Slot, TierRange};

/// What the step reaches through `bpf_loop`'s context: the scan's state and the caller's lookup (its
/// captures stay in the caller's frame; the callback reads them through this pointer).
struct Ctx<'a, L> {
    scan: Scan,
    lookup: &'a mut L,
}

/// The random source of the steps: the helper itself (the caller's is the same helper).
fn random() -> u32 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_get_prandom_u32() }
}

/// `bpf_loop`'s callback: one step; 1 stops the loop.
extern "C" fn step<B, L: FnMut(u32) -> Slot<B>>(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Ctx` `scan` passed, alive for the whole `bpf_loop` call.
    let c = unsafe { &mut *ctx.cast::<Ctx<'_, L>>() };
    i64::from(!c.scan.step(index as u32, c.lookup, &mut random))
}

/// `lb_common::scan_tier` with `bpf_loop` as its loop: the same steps, the same result.
///
/// Out of line, so its context sits in a frame of its own: Linux 6.1 adds up the frames of a call chain,
/// each rounded up to 32 bytes, against 512, and inlined into connect6 and sendmsg6 the 24-byte context took
/// their frames from 256 to 288 bytes, over the limit with `reverse::remember_connected`'s 224 beside them.
#[inline(never)]
pub(crate) fn scan<B, L: FnMut(u32) -> Slot<B>, R: FnMut() -> u32>(
    range: TierRange,
    lookup: &mut L,
    random: &mut R,
) -> u32 {
    let mut c = Ctx { scan: Scan::new(range, random), lookup };
    let turns = c.scan.turns();
    // SAFETY: the callback has the signature `bpf_loop` calls and takes the context given here.
    unsafe {
        bpf_loop(turns, step::<B, L> as *mut c_void, (&raw mut c).cast(), 0);
    }
    c.scan.result()
}
