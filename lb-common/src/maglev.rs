//! Maglev for traffic from outside the node (`--lb-algorithm=maglev`): each outside frontend's tiers get a
//! lookup table of `MAGLEV_M` entries (Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
//! Balancer", NSDI 2016), built by the agent from the tier's backends in an order no node's view changes, so
//! that every node holding the same backends picks the same one for a flow: a flow an ECMP router moves to
//! another node (MetalLB in BGP mode) keeps its backend, and a backend change moves few flows beyond its own.
//! The data path hashes the flow (`flow_hash`, the same on every node and release) into the table of the tier
//! the tier choice picked.
use bytemuck::{Pod, Zeroable};

/// The tables of the outside frontends with `FLAG_MAGLEV`: `MaglevKey` -> `MaglevTable`, written with their
/// generation's slots before the swap and buried with them (a hash map without preallocation: memory only
/// for the tables written).
pub const MAP_MAGLEV: &str = "MAGLEV";
/// Tables `MAP_MAGLEV` holds at most by default: twice `--max-services` (one per outside frontend and tier with
/// two or more backends, and an old generation's during its grace period). Not preallocated: a table costs
/// its 32 KiB only once written.
pub const DEFAULT_MAX_MAGLEV: u32 = 2 * crate::DEFAULT_MAX_FRONTENDS;
/// Entries of a table: a prime (Maglev needs one), Cilium's default table size, which keeps a backend's share
/// within about 1% of another's up to about 160 backends (M >= 100 x N in the paper).
pub const MAGLEV_M: usize = 16_381;

/// `FrontendValue::flags` of an outside frontend whose backend is chosen by Maglev within the chosen tier.
pub const FLAG_MAGLEV: u32 = 1 << 4;

/// Key of `MAP_MAGLEV`: a frontend's generation (its slots' `svc_id` and `generation`) and tier.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MaglevKey {
    /// `FrontendValue::svc_id`.
    pub svc_id: u32,
    /// `FrontendValue::generation`.
    pub generation: u32,
    /// `TIER_NODE`, `TIER_ZONE` or `TIER_CLUSTER`.
    pub tier: u32,
}
const _: () = assert!(size_of::<MaglevKey>() == 12);

/// Value of `MAP_MAGLEV`: for each of `MAGLEV_M` hash buckets, the slot (an index within the tier's
/// `TierRange`) that serves it.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct MaglevTable {
    /// Slot index within the tier, per bucket.
    pub slots: [u16; MAGLEV_M],
}
const _: () = assert!(size_of::<MaglevTable>() == 2 * MAGLEV_M);

impl core::fmt::Debug for MaglevTable {
    /// Its first buckets (all `MAGLEV_M` would fill a screen).
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MaglevTable({:?}..)", &self.slots[..8])
    }
}

/// The bucket of a flow: a hash of its addresses, ports and protocol with a fixed seed, so that every node (and
/// every release: `flow_hash_is_stable`) puts a flow in the same bucket. Not the kernel's skb hash, whose seed
/// each boot picks at random. Addresses and ports as they lie in the packet (network byte order, read as
/// native words), as the tc programs' `Flow` holds them; an IPv4 address in the first word.
#[inline(always)]
#[must_use]
pub fn flow_hash(saddr: &[u32; 4], daddr: &[u32; 4], sport: u16, dport: u16, proto: u8) -> u32 {
    // murmur3's 32-bit block mixing and finalizer over the tuple's ten words.
    #[inline(always)]
    fn eat(h: u32, k: u32) -> u32 {
        let k = k.wrapping_mul(0xcc9e_2d51).rotate_left(15).wrapping_mul(0x1b87_3593);
        (h ^ k).rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
    }
    let mut h: u32 = 0x7469_6572; // "tier"
    let mut i = 0;
    while i < 4 {
        h = eat(h, saddr[i]);
        h = eat(h, daddr[i]);
        i += 1;
    }
    h = eat(h, (u32::from(sport) << 16) | u32::from(dport));
    h = eat(h, u32::from(proto));
    h ^= 0x28; // the input's length in bytes (ten words)
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// A flow's bucket in a table.
#[inline(always)]
#[must_use]
pub const fn bucket(hash: u32) -> usize {
    (hash % MAGLEV_M as u32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is part of the contract between nodes (and between releases during a rolling upgrade): a
    /// change of it moves flows between backends. These values were computed when it was written.
    #[test]
    fn flow_hash_is_stable() {
        type Tuple = ([u32; 4], [u32; 4], u16, u16, u8);
        let cases: [(&str, Tuple); 3] = [
            ("zeros", ([0; 4], [0; 4], 0, 0, 0)),
            ("v4 tcp", ([0x6400_02c0, 0, 0, 0], [0x0a64_33c6, 0, 0, 0], 0x409c, 0x5000, 6)),
            ("v6 udp", ([0x0012_0db8, 1, 0, 0x100], [0x0012_0db8, 1, 0, 0x1], 0x1234, 0x3500, 17)),
        ];
        let got: Vec<(&str, u32)> =
            cases.iter().map(|(n, (s, d, sp, dp, p))| (*n, flow_hash(s, d, *sp, *dp, *p))).collect();
        assert_eq!(got, [("zeros", 1_708_746_145), ("v4 tcp", 1_597_930_462), ("v6 udp", 3_294_751_924)]);
    }

    #[test]
    fn the_tuple_moves_the_bucket() {
        let base = flow_hash(&[1, 0, 0, 0], &[2, 0, 0, 0], 1000, 80, 6);
        for (name, other) in [
            ("source", flow_hash(&[3, 0, 0, 0], &[2, 0, 0, 0], 1000, 80, 6)),
            ("destination", flow_hash(&[1, 0, 0, 0], &[4, 0, 0, 0], 1000, 80, 6)),
            ("source port", flow_hash(&[1, 0, 0, 0], &[2, 0, 0, 0], 1001, 80, 6)),
            ("destination port", flow_hash(&[1, 0, 0, 0], &[2, 0, 0, 0], 1000, 81, 6)),
            ("protocol", flow_hash(&[1, 0, 0, 0], &[2, 0, 0, 0], 1000, 80, 17)),
        ] {
            assert_ne!(base, other, "{name}");
        }
    }
}
