//! The packet as `packet`'s parse and rewrite see it, in a tc program (an skb) or in XDP (a frame before any
//! skb exists): loads and stores at an offset, and the incremental checksum updates.
//!
//! tc has the kernel's helpers (`bpf_skb_load_bytes`, `bpf_l3_csum_replace`, `bpf_l4_csum_replace`), which
//! know the skb's checksum state. XDP has `bpf_xdp_load_bytes` / `bpf_xdp_store_bytes` (Linux 5.18) and no
//! checksum helper: the update is RFC 1624's (`HC' = ~(~HC + ~m + m')`), on the checksum as it lies in the
//! packet. A frame in XDP is as the wire delivered it, its checksums complete (no `CHECKSUM_PARTIAL` before
//! an skb exists), so the same arithmetic is right for the pseudo-header's addresses and the ports.
use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_F_MARK_MANGLED_0,
    helpers::generated::{bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::{TcContext, XdpContext},
};

/// A packet `packet` can parse and rewrite.
pub(crate) trait Frame {
    fn load<T>(&self, off: usize) -> Result<T, i64>;
    fn store<T>(&self, off: usize, v: &T) -> Result<(), i64>;
    /// `bpf_l3_csum_replace`'s contract: the checksum at `off` updated for `size` (2 or 4) bytes changed
    /// from `from` to `to`.
    fn l3_csum_replace(&self, off: usize, from: u64, to: u64, size: u64) -> Result<(), i64>;
    /// `bpf_l4_csum_replace`'s contract: `flags` holds the size (low 4 bits), `BPF_F_PSEUDO_HDR`,
    /// `BPF_F_MARK_MANGLED_0` (a UDP checksum of 0 means none: left 0; a result of 0 written as 0xffff).
    fn l4_csum_replace(&self, off: usize, from: u64, to: u64, flags: u64) -> Result<(), i64>;
    /// The ethertype of a packet without an Ethernet header (an L3 device's), network order.
    fn l3_protocol(&self) -> u16;
    /// The context pointer the FIB helper takes.
    fn raw(&self) -> *mut c_void;
    /// The index of the device the packet arrived on (ingress) or leaves by (egress).
    fn ifindex(&self) -> u32;
    /// Whether the packet, `grow` bytes larger, still fits the MTU of the device it arrived on
    /// (`bpf_check_mtu`, Linux 5.12; a GSO packet: its segments, as the kernel grows them).
    fn fits(&self, grow: i32) -> bool {
        let mut mtu = 0u32;
        // SAFETY: the program's own context and a u32 out-parameter; ifindex 0 is the context's device.
        let rc = unsafe { aya_ebpf::helpers::bpf_check_mtu(self.raw(), 0, &raw mut mtu, grow, 0) };
        rc == i64::from(aya_ebpf::bindings::bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS)
    }
}

impl Frame for TcContext {
    #[inline(always)]
    fn load<T>(&self, off: usize) -> Result<T, i64> {
        TcContext::load(self, off)
    }

    #[inline(always)]
    fn store<T>(&self, off: usize, v: &T) -> Result<(), i64> {
        TcContext::store(self, off, v, 0)
    }

    #[inline(always)]
    fn l3_csum_replace(&self, off: usize, from: u64, to: u64, size: u64) -> Result<(), i64> {
        TcContext::l3_csum_replace(self, off, from, to, size)
    }

    #[inline(always)]
    fn l4_csum_replace(&self, off: usize, from: u64, to: u64, flags: u64) -> Result<(), i64> {
        TcContext::l4_csum_replace(self, off, from, to, flags)
    }

    #[inline(always)]
    fn l3_protocol(&self) -> u16 {
        // SAFETY: the context's skb pointer is valid for the program's run; `protocol` holds the ethertype in
        // network order in its low 16 bits.
        unsafe { (*self.skb.skb).protocol as u16 }
    }

    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.skb.skb.cast()
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: as in `l3_protocol`.
        unsafe { (*self.skb.skb).ifindex }
    }
}

/// An XDP frame.
pub(crate) struct Xdp<'a>(pub(crate) &'a XdpContext);

impl Frame for Xdp<'_> {
    #[inline(always)]
    fn load<T>(&self, off: usize) -> Result<T, i64> {
        let mut v = MaybeUninit::<T>::uninit();
        // SAFETY: the helper writes `size_of::<T>()` bytes into `v` or fails; the context is the program's.
        let rc = unsafe {
            bpf_xdp_load_bytes(
                self.0.as_ptr().cast(),
                off as u32,
                v.as_mut_ptr().cast(),
                size_of::<T>() as u32,
            )
        };
        if rc < 0 {
            return Err(rc);
        }
        // SAFETY: written whole by the helper (the types loaded are plain integers and arrays of them).
        Ok(unsafe { v.assume_init() })
    }

    #[inline(always)]
    fn store<T>(&self, off: usize, v: &T) -> Result<(), i64> {
        // SAFETY: the helper reads `size_of::<T>()` bytes from `v`; the context is the program's.
        let rc = unsafe {
            bpf_xdp_store_bytes(
                self.0.as_ptr().cast(),
                off as u32,
                core::ptr::from_ref(v).cast_mut().cast(),
                size_of::<T>() as u32,
            )
        };
        if rc < 0 { Err(rc) } else { Ok(()) }
    }

    #[inline(always)]
    fn l3_csum_replace(&self, off: usize, from: u64, to: u64, size: u64) -> Result<(), i64> {
        let c: u16 = self.load(off)?;
        self.store(off, &replace(c, from, to, size))
    }

    #[inline(always)]
    fn l4_csum_replace(&self, off: usize, from: u64, to: u64, flags: u64) -> Result<(), i64> {
        let c: u16 = self.load(off)?;
        let mangled = flags & u64::from(BPF_F_MARK_MANGLED_0) != 0;
        if mangled && c == 0 {
            return Ok(());
        }
        let mut n = replace(c, from, to, flags & 0xf);
        if mangled && n == 0 {
            n = 0xffff;
        }
        self.store(off, &n)
    }

    #[inline(always)]
    fn l3_protocol(&self) -> u16 {
        0
    }

    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.0.as_ptr()
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the context's xdp_md pointer is valid for the program's run.
        unsafe { (*self.0.ctx).ingress_ifindex }
    }
}

/// RFC 1624's update of the checksum `c` (as it lies in the packet) for `size` bytes (2 or 4, as they lie in
/// the packet, read as native integers) changed from `from` to `to`. One's-complement sums do not depend on
/// byte order as long as every word is read the same way.
#[inline(always)]
pub(crate) fn replace(c: u16, from: u64, to: u64, size: u64) -> u16 {
    let mut sum = u32::from(!c);
    if size == 4 {
        let (f, t) = (!(from as u32), to as u32);
        sum += (f & 0xffff) + (f >> 16) + (t & 0xffff) + (t >> 16);
    } else {
        sum += u32::from(!(from as u16)) + u32::from(to as u16);
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
