//! The agent's half of Maglev (`lb_common::maglev`): a tier's lookup table, built from its distinct backends
//! in the order of their own bytes (address family, address, port, protocol), never in the order a node's
//! plan lists them, so two nodes holding the same backends build the same table; each entry names the
//! backend's first slot in this node's tier.
use lb_common::{Backend, FLAG_MAGLEV, FrontendValue, MAGLEV_M, MaglevKey, MaglevTable, TIER_COUNT};

/// FNV-1a (64 bits) of `bytes`, from `seed`.
fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// A backend's identity as the table orders and hashes it.
fn identity(b: &Backend) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    out.push(b.family);
    for w in b.addr {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out.extend_from_slice(&b.port.to_be_bytes());
    out.push(b.proto);
    out
}

/// A tier's distinct backends in the order of their identities, each with its identity and first slot (a
/// tier's length fits a `u16`: `TierRange`).
fn distinct(tier: &[Backend]) -> Vec<(Vec<u8>, u16)> {
    let mut first = std::collections::BTreeMap::new();
    for (i, b) in tier.iter().enumerate() {
        first.entry(identity(b)).or_insert(u16::try_from(i).unwrap_or(u16::MAX));
    }
    first.into_iter().collect()
}

/// The Maglev table of a tier: `None` for fewer than two distinct backends (the tier's choice is then the
/// table's). Each backend's preference list is a permutation of the buckets (an offset and a skip from two
/// hashes of its identity); backends take turns claiming their next free preference until every bucket is
/// taken, so each holds `MAGLEV_M / n` buckets, give or take one.
#[must_use]
pub fn table(tier: &[Backend]) -> Option<Box<MaglevTable>> {
    let distinct = distinct(tier);
    if distinct.len() < 2 {
        return None;
    }
    let m = MAGLEV_M as u64;
    let perm: Vec<(u64, u64)> = distinct
        .iter()
        .map(|(id, _)| (fnv(0xcbf2_9ce4_8422_2325, id) % m, fnv(0x8422_2325_cbf2_9ce4, id) % (m - 1) + 1))
        .collect();
    let mut out: Box<MaglevTable> = bytemuck::allocation::zeroed_box();
    out.slots.fill(u16::MAX);
    let mut next = vec![0u64; distinct.len()];
    let mut filled = 0;
    'fill: loop {
        for (i, (offset, skip)) in perm.iter().enumerate() {
            let mut c = ((offset + next[i] * skip) % m) as usize;
            while out.slots[c] != u16::MAX {
                next[i] += 1;
                c = ((offset + next[i] * skip) % m) as usize;
            }
            out.slots[c] = distinct[i].1;
            next[i] += 1;
            filled += 1;
            if filled == MAGLEV_M {
                break 'fill;
            }
        }
    }
    Some(out)
}

/// The tables a frontend's generation needs: one per tier of two or more distinct backends, keyed by its
/// slots' id and generation; none without `FLAG_MAGLEV`.
#[must_use]
pub fn tables(
    value: &FrontendValue,
    tiers: &[Vec<Backend>; TIER_COUNT],
) -> Vec<(MaglevKey, Box<MaglevTable>)> {
    if value.flags & FLAG_MAGLEV == 0 {
        return Vec::new();
    }
    let (svc_id, generation) = (value.svc_id, value.generation);
    (0..TIER_COUNT)
        .filter_map(|t| Some((MaglevKey { svc_id, generation, tier: t as u32 }, table(&tiers[t])?)))
        .collect()
}

/// The bucket the tc programs put a flow from `client` to `frontend` over `proto` in (`lb_common::flow_hash`
/// over the packet's addresses and ports as they lie in it): which entry of a table serves it.
#[must_use]
pub fn flow_bucket(client: std::net::SocketAddr, frontend: std::net::SocketAddr, proto: u8) -> usize {
    let (s, d) = (super::addr::words(client.ip()), super::addr::words(frontend.ip()));
    lb_common::bucket(lb_common::flow_hash(&s, &d, client.port().to_be(), frontend.port().to_be(), proto))
}

/// The keys `tables` gives a frontend's generation, without building the tables (what burial deletes).
#[must_use]
pub fn keys(value: &FrontendValue, tiers: &[&[Backend]; TIER_COUNT]) -> Vec<MaglevKey> {
    if value.flags & FLAG_MAGLEV == 0 {
        return Vec::new();
    }
    (0..TIER_COUNT)
        .filter(|t| distinct(tiers[*t]).len() >= 2)
        .map(|t| MaglevKey { svc_id: value.svc_id, generation: value.generation, tier: t as u32 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends(n: usize) -> Vec<Backend> {
        (0..n)
            .map(|i| Backend {
                addr: [u32::from_be_bytes([10, 244, 1, i as u8 + 1]), 0, 0, 0],
                port: 8080u16.to_be(),
                proto: 6,
                family: 2,
            })
            .collect()
    }

    /// The backend each bucket names.
    fn owners(tier: &[Backend]) -> Vec<Backend> {
        let t = table(tier).unwrap();
        t.slots.iter().map(|&s| tier[usize::from(s)]).collect()
    }

    #[test]
    fn each_backend_holds_an_even_share_of_the_buckets() {
        for n in [2, 3, 10, 100] {
            let tier = backends(n);
            let owned = owners(&tier);
            for b in &tier {
                let share = owned.iter().filter(|o| *o == b).count();
                let even = MAGLEV_M / n;
                assert!(share.abs_diff(even) <= 1, "{n} backends: {share} buckets, {even} even");
            }
        }
    }

    #[test]
    fn nodes_listing_the_same_backends_in_another_order_build_the_same_table() {
        let tier = backends(10);
        let mut other = tier.clone();
        other.reverse();
        other.rotate_left(3);
        other.push(tier[4]); // a backend repeated in a tier (ranges may repeat one)
        assert_eq!(owners(&tier), owners(&other));
    }

    #[test]
    fn a_backend_change_moves_its_own_buckets_and_few_others() {
        // (what changes, the most buckets of other backends allowed to move, as a share of the table)
        let tier = backends(10);
        let cases: [(&str, Vec<Backend>, f64); 3] = [
            ("one of ten removed", tier[..9].to_vec(), 0.01),
            ("one added to ten", backends(11), 0.01),
            ("one of ten replaced", [&tier[..9], &backends(12)[11..]].concat(), 0.02),
        ];
        let before = owners(&tier);
        for (name, after_tier, allowed) in cases {
            let after = owners(&after_tier);
            // Buckets moved from one staying backend to another: what no change of the set asked for.
            let moved_others = before
                .iter()
                .zip(&after)
                .filter(|(b, a)| b != a && after_tier.contains(b) && tier.contains(a))
                .count();
            let share = moved_others as f64 / MAGLEV_M as f64;
            assert!(
                share <= allowed,
                "{name}: {moved_others} buckets of staying backends moved ({share:.4})"
            );
        }
    }

    #[test]
    fn fewer_than_two_backends_need_no_table() {
        let tier = backends(1);
        assert!(table(&[]).is_none() && table(&tier).is_none() && table(&[tier[0], tier[0]]).is_none());
    }
}
